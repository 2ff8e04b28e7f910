/* stats: see include/stats.h. */
#include "stats.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"

struct kvb_stats {
    const struct kvb_metrics *m;
    struct kvb_metrics *prev;
    uint64_t interval_ms, last_ms;
};

int kvb_stats_create(const struct kvb_metrics *m, uint32_t interval_s, struct kvb_stats **out)
{
    struct kvb_stats *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->prev = malloc(sizeof *s->prev);
    if (!s->prev) {
        free(s);
        return -ENOMEM;
    }
    s->m = m;
    memcpy(s->prev, m, sizeof *m); /* the loop thread is the only writer */
    s->interval_ms = (uint64_t)interval_s * 1000;
    s->last_ms = kvb_mono_ms();
    *out = s;
    return 0;
}

void kvb_stats_destroy(struct kvb_stats **ps)
{
    if (!ps || !*ps)
        return;
    free((*ps)->prev);
    free(*ps);
    *ps = NULL;
}

void kvb_stats_set_interval(struct kvb_stats *s, uint32_t interval_s)
{
    if (!s)
        return;
    s->interval_ms = (uint64_t)interval_s * 1000;
    s->last_ms = kvb_mono_ms();
    memcpy(s->prev, s->m, sizeof *s->m);
}

void kvb_stats_tick(struct kvb_stats *s, uint64_t now_ms)
{
    if (!s || !s->interval_ms || now_ms - s->last_ms < s->interval_ms)
        return;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f) {
        kvb_stats_format(s->prev, s->m, now_ms - s->last_ms, f);
        if (fclose(f) == 0)
            kvb_log_lines(KVB_LOG_INFO, "stats", text);
    }
    free(text);
    memcpy(s->prev, s->m, sizeof *s->m);
    s->last_ms = now_ms;
}

/* ---- the lines ------------------------------------------------------------ */

#define D(field) (kvb_get(&cur->field) - kvb_get(&prev->field))

static uint64_t sum_delta(const _Atomic uint64_t *c, const _Atomic uint64_t *p, int n)
{
    uint64_t t = 0;
    for (int i = 0; i < n; i++)
        t += kvb_get(&c[i]) - kvb_get(&p[i]);
    return t;
}

/* " (name n, name n)" for the non-zero deltas of a labelled family. */
static void by_label(FILE *f, const _Atomic uint64_t *c, const _Atomic uint64_t *p,
                     const char *const *names, int n)
{
    bool first = true;
    for (int i = 0; i < n; i++) {
        uint64_t d = kvb_get(&c[i]) - kvb_get(&p[i]);
        if (!d)
            continue;
        fprintf(f, "%s%s %" PRIu64, first ? " (" : ", ", names[i], d);
        first = false;
    }
    if (!first)
        fputc(')', f);
}

#define STR(s, str) str,
#define BOUND(ns) UINT64_C(ns),
static const char *const rev_names[] = {KVB_REV_TYPES(STR)};
static const char *const bar_names[] = {KVB_BARRIER_CAUSES(STR)};
static const char *const drop_names[] = {KVB_DROP_REASONS(STR)};
static const uint64_t proc_bounds[] = {KVB_PROC_BUCKETS(BOUND)};
#define N_PROC (int)(sizeof proc_bounds / sizeof proc_bounds[0])

/* The upper bound (ns) of the bucket holding the p99 of the interval's
 * observations; 0 when there were none, UINT64_MAX past the last bound. */
static uint64_t p99_ns(const struct kvb_histogram *c, const struct kvb_histogram *p)
{
    uint64_t n = kvb_get(&c->count) - kvb_get(&p->count);
    if (!n)
        return 0;
    uint64_t want = n - n / 100, cum = 0; /* ceil(0.99 n) for n < 100 too */
    for (int i = 0; i <= N_PROC; i++) {
        cum += kvb_get(&c->buckets[i]) - kvb_get(&p->buckets[i]);
        if (cum >= want)
            return i < N_PROC ? proc_bounds[i] : UINT64_MAX;
    }
    return UINT64_MAX;
}

static double per_s(uint64_t n, uint64_t ms) { return ms ? (double)n * 1000.0 / (double)ms : 0; }

static bool slot_used(const _Atomic int *u)
{
    return atomic_load_explicit((_Atomic int *)u, memory_order_acquire) != 0;
}

/* The engine's ranks whose slot source is NAME. */
static void engine_part(FILE *f, const struct kvb_metrics *m, const char *name)
{
    for (int i = 0; i < KVB_MAX_ENGINE_SLOTS && slot_used(&m->engines[i].used); i++) {
        const struct kvb_engine_slot *e = &m->engines[i];
        if (strcmp(e->source, name) != 0)
            continue;
        fprintf(f, "; engine dp_rank %" PRIu32 ": ", e->dp_rank);
        if (kvb_get(&e->gone))
            fputs("gone", f);
        else if (!kvb_get(&e->up))
            fputs("not answering", f);
        else
            fprintf(f,
                    "kv %" PRIu64 "/%" PRIu64 " blocks, %" PRIu64 " running, %" PRIu64 " waiting",
                    kvb_get(&e->used_blocks), kvb_get(&e->total_blocks), kvb_get(&e->running),
                    kvb_get(&e->waiting));
    }
}

static bool seen_before(const struct kvb_metrics *m, int upto, const char *name, bool engines)
{
    for (int i = 0; i < upto; i++)
        if (strcmp(engines ? m->engines[i].source : m->streams[i].source, name) == 0)
            return true;
    return false;
}

int kvb_stats_format(const struct kvb_metrics *prev, const struct kvb_metrics *cur,
                     uint64_t elapsed_ms, FILE *f)
{
    uint64_t secs = (elapsed_ms + 500) / 1000;
    uint64_t batches = D(batches_received_total[0]);
    uint64_t published = sum_delta(cur->router_events_published_total,
                                   prev->router_events_published_total, KVB_REVT__COUNT);
    uint64_t barriers = sum_delta(cur->barriers_total, prev->barriers_total, KVB_BAR__COUNT);
    uint64_t dropped =
        sum_delta(cur->events_dropped_total, prev->events_dropped_total, KVB_DROP__COUNT);
    uint64_t malformed =
        sum_delta(cur->malformed_messages_total, prev->malformed_messages_total, KVB_MAL__COUNT);
    uint64_t loads = D(load_messages_published_total[0]);
    uint64_t pending = kvb_get(&cur->nats_pending_bytes[0]);
    if (!batches && !published && !barriers && !dropped && !malformed) {
        fprintf(f,
                "idle for %" PRIu64 " s: no batches, nothing published; nats pending %" PRIu64
                " B, %" PRIu64 " load messages, %" PRIu64 " engine(s) gone\n",
                secs, pending, loads, kvb_get(&cur->engines_gone[0]));
        return 1;
    }
    int lines = 0;
    /* one line per source: its streams, then its engine ranks */
    for (int i = 0; i < KVB_MAX_STREAM_SLOTS && slot_used(&cur->streams[i].used); i++) {
        const char *name = cur->streams[i].source;
        if (seen_before(cur, i, name, false))
            continue;
        uint64_t b = 0, ev = 0, g = 0;
        for (int j = i; j < KVB_MAX_STREAM_SLOTS && slot_used(&cur->streams[j].used); j++) {
            const struct kvb_stream_slot *c = &cur->streams[j], *p = &prev->streams[j];
            if (strcmp(c->source, name) != 0)
                continue;
            bool was = slot_used(&p->used);
            b += kvb_get(&c->batches) - (was ? kvb_get(&p->batches) : 0);
            ev += kvb_get(&c->events) - (was ? kvb_get(&p->events) : 0);
            g += kvb_get(&c->gaps) - (was ? kvb_get(&p->gaps) : 0);
        }
        fprintf(f, "%s: %.1f batches/s, %.1f events/s, %" PRIu64 " gaps", name,
                per_s(b, elapsed_ms), per_s(ev, elapsed_ms), g);
        engine_part(f, cur, name);
        fputc('\n', f);
        lines++;
    }
    /* engines of sources that sent nothing yet */
    for (int i = 0; i < KVB_MAX_ENGINE_SLOTS && slot_used(&cur->engines[i].used); i++) {
        const char *name = cur->engines[i].source;
        bool has_stream = false;
        for (int j = 0; j < KVB_MAX_STREAM_SLOTS && slot_used(&cur->streams[j].used) && !has_stream;
             j++)
            has_stream = strcmp(cur->streams[j].source, name) == 0;
        if (has_stream || seen_before(cur, i, name, true))
            continue;
        fprintf(f, "%s: no batches yet", name);
        engine_part(f, cur, name);
        fputc('\n', f);
        lines++;
    }
    fprintf(
        f, "all: %" PRIu64 " s, %.1f batches/s, %.1f events/s, published %" PRIu64, secs,
        per_s(batches, elapsed_ms),
        per_s(sum_delta(cur->events_received_total, prev->events_received_total, KVB_EVT__COUNT),
              elapsed_ms),
        published);
    by_label(f, cur->router_events_published_total, prev->router_events_published_total, rev_names,
             KVB_REVT__COUNT);
    /* barriers: "cleared" by cause (the word "barrier" stays out of this
     * line: log readers and tests grep for it to find the events) */
    fprintf(f, ", cleared by cause %" PRIu64, barriers);
    by_label(f, cur->barriers_total, prev->barriers_total, bar_names, KVB_BAR__COUNT);
    fprintf(f, ", gaps %" PRIu64 ", replays %" PRIu64 " (filled %" PRIu64 ", failed %" PRIu64 ")",
            D(seq_gaps_total[0]), D(replays_requested_total[0]), D(replays_filled_total[0]),
            D(replays_failed_total[0]));
    fprintf(f, ", dropped %" PRIu64, dropped);
    by_label(f, cur->events_dropped_total, prev->events_dropped_total, drop_names, KVB_DROP__COUNT);
    fprintf(f, ", malformed %" PRIu64 ", nats pending %" PRIu64 " B, load messages %" PRIu64,
            malformed, pending, loads);
    uint64_t p99 = p99_ns(&cur->batch_processing_seconds, &prev->batch_processing_seconds);
    if (p99 == UINT64_MAX)
        fprintf(f, ", p99 batch > %.3f ms", (double)proc_bounds[N_PROC - 1] / 1e6);
    else if (p99)
        fprintf(f, ", p99 batch <= %.3f ms", (double)p99 / 1e6);
    fputc('\n', f);
    return lines + 1;
}
