/* metrics: label names, histograms, stream slots and the Prometheus text
 * exposition.  See include/metrics.h. */
#include "metrics.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVB_STR_ITEM(s, str) str,

const char *kvb_tier_name(int tier)
{
    static const char *names[] = {KVB_TIERS(KVB_STR_ITEM)};
    return tier >= 0 && tier < KVB_TIER__COUNT ? names[tier] : "device";
}

const char *kvb_drop_reason_name(int reason)
{
    static const char *names[] = {KVB_DROP_REASONS(KVB_STR_ITEM)};
    return reason >= 0 && reason < KVB_DROP__COUNT ? names[reason] : "unknown";
}

/* ---- histograms --------------------------------------------------------- */

void kvb_histogram_observe(struct kvb_histogram *h, const uint64_t *bounds, int n_bounds,
                           uint64_t ns)
{
    int i = 0;
    while (i < n_bounds && ns > bounds[i])
        i++;
    kvb_inc(&h->buckets[i]); /* i == n_bounds: the +Inf bucket */
    kvb_inc(&h->count);
    kvb_add(&h->sum_ns, ns);
}

void kvb_histogram_observe_shared(struct kvb_histogram *h, const uint64_t *bounds, int n_bounds,
                                  uint64_t ns)
{
    int i = 0;
    while (i < n_bounds && ns > bounds[i])
        i++;
    kvb_add_shared(&h->buckets[i], 1);
    kvb_add_shared(&h->count, 1);
    kvb_add_shared(&h->sum_ns, ns);
}

#define KVB_BOUND(ns) (uint64_t)(ns),
#define KVB_HIST_DEF(name, buckets, help)                                                  \
    static const uint64_t bounds_##name[] = {buckets(KVB_BOUND)};                          \
    _Static_assert(sizeof(bounds_##name) / sizeof(uint64_t) < 32, "too many buckets");     \
    void kvb_metrics_observe_##name(struct kvb_metrics *m, uint64_t ns)                    \
    {                                                                                      \
        kvb_histogram_observe(&m->name, bounds_##name,                                     \
                              (int)(sizeof(bounds_##name) / sizeof(uint64_t)), ns);        \
    }                                                                                      \
    void kvb_metrics_observe_shared_##name(struct kvb_metrics *m, uint64_t ns)             \
    {                                                                                      \
        kvb_histogram_observe_shared(&m->name, bounds_##name,                              \
                                     (int)(sizeof(bounds_##name) / sizeof(uint64_t)), ns); \
    }
KVB_HISTOGRAMS(KVB_HIST_DEF)

/* ---- stream slots ------------------------------------------------------- */

struct kvb_stream_slot *kvb_metrics_stream_slot(struct kvb_metrics *m, const char *source,
                                                const char *topic)
{
    for (int i = 0; i < KVB_MAX_STREAM_SLOTS; i++) {
        struct kvb_stream_slot *s = &m->streams[i];
        if (!atomic_load_explicit(&s->used, memory_order_acquire)) {
            snprintf(s->source, sizeof(s->source), "%s", source);
            snprintf(s->topic, sizeof(s->topic), "%s", topic);
            atomic_store_explicit(&s->used, 1, memory_order_release);
            return s;
        }
        if (strcmp(s->source, source) == 0 && strcmp(s->topic, topic) == 0)
            return s; /* the same stream after a reload keeps its series */
    }
    return NULL;
}

struct kvb_engine_slot *kvb_metrics_engine_slot(struct kvb_metrics *m, const char *source,
                                                uint32_t dp_rank)
{
    for (int i = 0; i < KVB_MAX_ENGINE_SLOTS; i++) {
        struct kvb_engine_slot *s = &m->engines[i];
        if (!atomic_load_explicit(&s->used, memory_order_acquire)) {
            snprintf(s->source, sizeof(s->source), "%s", source);
            s->dp_rank = dp_rank;
            atomic_store_explicit(&s->used, 1, memory_order_release);
            return s;
        }
        if (s->dp_rank == dp_rank && strcmp(s->source, source) == 0)
            return s;
    }
    return NULL;
}

/* ---- exposition --------------------------------------------------------- */

struct out {
    char *buf;
    size_t len, cap;
    bool oom;
};

static void put(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct out *o, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            o->oom = true;
            return;
        }
        if ((size_t)n < o->cap - o->len) {
            o->len += (size_t)n;
            return;
        }
        size_t cap = o->cap * 2 + (size_t)n;
        char *b = realloc(o->buf, cap);
        if (!b) {
            o->oom = true;
            return;
        }
        o->buf = b;
        o->cap = cap;
    }
}

/* A label value with \, " and newline escaped. */
static void put_label(struct out *o, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\')
            put(o, "\\\\");
        else if (*v == '"')
            put(o, "\\\"");
        else if (*v == '\n')
            put(o, "\\n");
        else
            put(o, "%c", *v);
    }
}

static void head(struct out *o, const char *name, const char *kind, const char *help)
{
    put(o, "# HELP kvbridge_%s %s\n# TYPE kvbridge_%s %s\n", name, help, name, kind);
}

static void put_seconds(struct out *o, uint64_t ns)
{
    put(o, "%llu.%09llu", (unsigned long long)(ns / 1000000000u),
        (unsigned long long)(ns % 1000000000u));
}

static void histogram(struct out *o, const char *name, const char *help,
                      const struct kvb_histogram *h, const uint64_t *bounds, int n)
{
    head(o, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i <= n; i++) {
        cum += kvb_get(&h->buckets[i]);
        put(o, "kvbridge_%s_bucket{le=\"", name);
        if (i < n)
            put_seconds(o, bounds[i]);
        else
            put(o, "+Inf");
        put(o, "\"} %llu\n", (unsigned long long)cum);
    }
    put(o, "kvbridge_%s_sum ", name);
    put_seconds(o, kvb_get(&h->sum_ns));
    put(o, "\nkvbridge_%s_count %llu\n", name, (unsigned long long)kvb_get(&h->count));
}

static void family(struct out *o, const char *kind, const char *name, const char *label,
                   const char *const *values, int n, const _Atomic uint64_t *v, const char *help)
{
    head(o, name, kind, help);
    for (int i = 0; i < n; i++) {
        if (label[0])
            put(o, "kvbridge_%s{%s=\"%s\"} %llu\n", name, label, values[i],
                (unsigned long long)kvb_get(&v[i]));
        else
            put(o, "kvbridge_%s %llu\n", name, (unsigned long long)kvb_get(&v[i]));
    }
}

int kvb_metrics_render(const struct kvb_metrics *m, const char *version, char **out_buf,
                       size_t *out_len)
{
    struct out o = {malloc(16384), 0, 16384, false};
    if (!o.buf)
        return -ENOMEM;
    head(&o, "build_info", "gauge", "Always 1; the version is a label");
    put(&o, "kvbridge_build_info{version=\"");
    put_label(&o, version);
    put(&o, "\"} 1\n");

#define KVB_RENDER(kind, name, label, list, help)                                        \
    {                                                                                    \
        static const char *const vals_##name[] = {list(KVB_STR_ITEM)};                   \
        family(&o, #kind, #name, label, vals_##name, KVB_COUNT_OF(list), m->name, help); \
    }
    KVB_METRICS(KVB_RENDER)
#define KVB_RENDER_HIST(name, buckets, help)            \
    histogram(&o, #name, help, &m->name, bounds_##name, \
              (int)(sizeof(bounds_##name) / sizeof(uint64_t)));
    KVB_HISTOGRAMS(KVB_RENDER_HIST)

#define KVB_RENDER_STREAM(kind, name, field, help)                                \
    head(&o, #name, #kind, help);                                                 \
    for (int i = 0; i < KVB_MAX_STREAM_SLOTS; i++) {                              \
        const struct kvb_stream_slot *s = &m->streams[i];                         \
        if (!atomic_load_explicit((_Atomic int *)&s->used, memory_order_acquire)) \
            break;                                                                \
        put(&o, "kvbridge_%s{source=\"", #name);                                  \
        put_label(&o, s->source);                                                 \
        put(&o, "\",topic=\"");                                                   \
        put_label(&o, s->topic);                                                  \
        put(&o, "\"} %llu\n", (unsigned long long)kvb_get(&s->field));            \
    }
    KVB_STREAM_METRICS(KVB_RENDER_STREAM)

#define KVB_RENDER_ENGINE(kind, name, field, help)                                                \
    head(&o, #name, #kind, help);                                                                 \
    for (int i = 0; i < KVB_MAX_ENGINE_SLOTS; i++) {                                              \
        const struct kvb_engine_slot *s = &m->engines[i];                                         \
        if (!atomic_load_explicit((_Atomic int *)&s->used, memory_order_acquire))                 \
            break;                                                                                \
        put(&o, "kvbridge_%s{source=\"", #name);                                                  \
        put_label(&o, s->source);                                                                 \
        put(&o, "\",dp_rank=\"%u\"} %llu\n", s->dp_rank, (unsigned long long)kvb_get(&s->field)); \
    }
    KVB_ENGINE_METRICS(KVB_RENDER_ENGINE)

    if (o.oom) {
        free(o.buf);
        return -ENOMEM;
    }
    *out_buf = o.buf;
    *out_len = o.len;
    return 0;
}
