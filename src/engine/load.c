/* engine_load: the per-kind tables from /metrics names to load fields. */
#include "load.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct metric_map {
    const char *name; /* as exposed (counters with their _total) */
    enum kvb_load_field field;
    uint8_t prio;      /* 0 = current name; 1 = older name, used when alone */
    const char *label; /* NULL: the sample's value; else this label's value */
};

/* vLLM (V1 engine).  Checked against:
 *   vllm/v1/metrics/loggers.py, PrometheusStatLogger: labelnames
 *     ["model_name", "engine"], one series per engine index (make_per_engine)
 *     = the data-parallel rank; gauges vllm:num_requests_running,
 *     vllm:num_requests_waiting, vllm:kv_cache_usage_perc (0.9+) and the
 *     deprecated vllm:gpu_cache_usage_perc (0.8, hidden later); counters
 *     vllm:prefix_cache_queries / vllm:prefix_cache_hits (0.9+; exposed with
 *     _total) and the deprecated vllm:gpu_prefix_cache_queries / _hits;
 *     log_metrics_info("cache_config"): the info gauge vllm:cache_config_info,
 *     value 1, whose labels are CacheConfig.metrics_info() + "engine".
 *   vllm/config/cache.py, CacheConfig: num_gpu_blocks (set after profiling,
 *     "None" before), block_size, kv_cache_size_tokens (recent versions).
 */
static const struct metric_map vllm_map[] = {
    {"vllm:kv_cache_usage_perc", KVB_LOAD_KV_USAGE, 0, NULL},
    {"vllm:gpu_cache_usage_perc", KVB_LOAD_KV_USAGE, 1, NULL},
    {"vllm:num_requests_running", KVB_LOAD_RUNNING, 0, NULL},
    {"vllm:num_requests_waiting", KVB_LOAD_WAITING, 0, NULL},
    {"vllm:cache_config_info", KVB_LOAD_TOTAL_BLOCKS, 0, "num_gpu_blocks"},
    {"vllm:cache_config_info", KVB_LOAD_BLOCK_TOKENS, 0, "block_size"},
    {"vllm:cache_config_info", KVB_LOAD_TOTAL_TOKENS, 0, "kv_cache_size_tokens"},
    {"vllm:prefix_cache_queries_total", KVB_LOAD_PREFIX_QUERIES, 0, NULL},
    {"vllm:gpu_prefix_cache_queries_total", KVB_LOAD_PREFIX_QUERIES, 1, NULL},
    {"vllm:prefix_cache_hits_total", KVB_LOAD_PREFIX_HITS, 0, NULL},
    {"vllm:gpu_prefix_cache_hits_total", KVB_LOAD_PREFIX_HITS, 1, NULL},
};

/* SGLang.  Checked against:
 *   python/sglang/srt/metrics/collector.py, SchedulerMetricsCollector: gauges
 *     sglang:token_usage, sglang:num_running_reqs, sglang:num_queue_reqs,
 *     sglang:cache_hit_rate, sglang:max_total_num_tokens ("Maximum total
 *     number of tokens in the KV cache pool"; newer releases only).
 *   python/sglang/srt/managers/scheduler_metrics_mixin.py, init_metrics:
 *     labels model_name, engine_type, tp_rank, pp_rank, and dp_rank when the
 *     scheduler has one (--dp-size > 1 with DP attention).  _emit_kv_metrics
 *     there counts SGLang's KV "blocks" as tokens (kv_total_blocks =
 *     max_total_num_tokens); see kvb_engine_load_finish() for ours.
 */
static const struct metric_map sglang_map[] = {
    {"sglang:token_usage", KVB_LOAD_KV_USAGE, 0, NULL},
    {"sglang:num_running_reqs", KVB_LOAD_RUNNING, 0, NULL},
    {"sglang:num_queue_reqs", KVB_LOAD_WAITING, 0, NULL},
    {"sglang:max_total_num_tokens", KVB_LOAD_TOTAL_TOKENS, 0, NULL},
    {"sglang:cache_hit_rate", KVB_LOAD_HIT_RATE, 0, NULL},
};

struct engine_table {
    const char *kind;
    const char *prefix;   /* every name in the map starts with it */
    const char *dp_label; /* the label naming the data-parallel rank */
    const struct metric_map *map;
    size_t n;
};

static const struct engine_table tables[] = {
    [KVB_ENGINE_VLLM] = {"vllm", "vllm:", "engine", vllm_map,
                         sizeof(vllm_map) / sizeof(vllm_map[0])},
    [KVB_ENGINE_SGLANG] = {"sglang", "sglang:", "dp_rank", sglang_map,
                           sizeof(sglang_map) / sizeof(sglang_map[0])},
};

static const struct engine_table *table(enum kvb_engine_kind kind)
{
    if ((unsigned)kind >= sizeof(tables) / sizeof(tables[0]))
        return NULL;
    return &tables[kind];
}

int kvb_engine_kind_parse(const char *name, enum kvb_engine_kind *out)
{
    for (size_t i = 0; name && i < sizeof(tables) / sizeof(tables[0]); i++)
        if (strcmp(name, tables[i].kind) == 0) {
            *out = (enum kvb_engine_kind)i;
            return 0;
        }
    return -EINVAL;
}

const char *kvb_engine_kind_name(enum kvb_engine_kind kind)
{
    const struct engine_table *t = table(kind);
    return t ? t->kind : "?";
}

const char *kvb_engine_dp_label(enum kvb_engine_kind kind)
{
    const struct engine_table *t = table(kind);
    return t ? t->dp_label : NULL;
}

/* A label value as a number (finite, or the parse fails). */
static bool label_number(const struct kvb_prom_label *l, double *v)
{
    char buf[KVB_PROM_MAX_NUMBER + 1], *e;
    if (!l || l->value_len == 0 || l->value_len > KVB_PROM_MAX_NUMBER)
        return false;
    memcpy(buf, l->value, l->value_len);
    buf[l->value_len] = '\0';
    if (buf[0] == ' ' || buf[0] == '\t')
        return false;
    double x = strtod(buf, &e);
    if (*e != '\0' || !isfinite(x))
        return false;
    *v = x;
    return true;
}

/* dp_rank from the label: absent -> 0; not a plain decimal -> false. */
static bool rank_of(const struct kvb_prom_label *l, uint32_t *rank)
{
    if (!l) {
        *rank = 0;
        return true;
    }
    if (l->value_len == 0 || l->value_len > 10)
        return false;
    uint64_t x = 0;
    for (size_t i = 0; i < l->value_len; i++) {
        char c = l->value[i];
        if (c < '0' || c > '9')
            return false;
        x = x * 10 + (uint64_t)(c - '0');
    }
    if (x > UINT32_MAX)
        return false;
    *rank = (uint32_t)x;
    return true;
}

struct parse_ctx {
    const struct engine_table *t;
    size_t prefix_len;
    struct kvb_engine_load *out;
};

static struct kvb_rank_load *rank_slot(struct kvb_engine_load *l, uint32_t rank)
{
    for (uint32_t i = 0; i < l->n_ranks; i++)
        if (l->rank[i].dp_rank == rank)
            return &l->rank[i];
    if (l->n_ranks >= KVB_LOAD_MAX_RANKS)
        return NULL;
    struct kvb_rank_load *r = &l->rank[l->n_ranks++];
    memset(r, 0, sizeof(*r));
    r->dp_rank = rank;
    memset(r->prio, 0xff, sizeof(r->prio));
    return r;
}

static int on_sample(void *vctx, const struct kvb_prom_sample *s)
{
    struct parse_ctx *c = vctx;
    if (s->name_len <= c->prefix_len || memcmp(s->name, c->t->prefix, c->prefix_len) != 0)
        return 0;
    for (size_t i = 0; i < c->t->n; i++) {
        const struct metric_map *m = &c->t->map[i];
        if (!kvb_prom_name_is(s, m->name))
            continue;
        double v = s->value;
        uint32_t rank;
        struct kvb_rank_load *r;
        const struct kvb_prom_label *l = m->label ? kvb_prom_label(s, m->label) : NULL;
        if (m->label && !l)
            continue; /* an info label this version does not have */
        if ((l && !label_number(l, &v)) || isnan(v) ||
            !rank_of(kvb_prom_label(s, c->t->dp_label), &rank) || !(r = rank_slot(c->out, rank))) {
            c->out->ignored++;
            continue;
        }
        c->out->matched++;
        if (m->prio < r->prio[m->field] || !kvb_load_has(r, m->field)) {
            r->prio[m->field] = m->prio;
            r->v[m->field] = v;
            r->have |= 1u << m->field;
        } else if (m->prio == r->prio[m->field] && v > r->v[m->field]) {
            r->v[m->field] = v;
        }
    }
    return 0;
}

int kvb_engine_load_parse(enum kvb_engine_kind kind, char *text, size_t len,
                          struct kvb_engine_load *out)
{
    const struct engine_table *t = table(kind);
    if (!t || !out)
        return -EINVAL;
    out->kind = kind;
    out->n_ranks = 0;
    out->matched = out->ignored = 0;
    struct parse_ctx c = {t, strlen(t->prefix), out};
    int rc = kvb_prom_parse(text, len, on_sample, &c, &out->prom);
    return rc < 0 ? rc : 0;
}

const struct kvb_rank_load *kvb_engine_load_rank(const struct kvb_engine_load *l, uint32_t dp_rank)
{
    for (uint32_t i = 0; l && i < l->n_ranks; i++)
        if (l->rank[i].dp_rank == dp_rank)
            return &l->rank[i];
    return NULL;
}

static void set(struct kvb_rank_load *r, enum kvb_load_field f, double v)
{
    r->v[f] = v;
    r->have |= 1u << f;
}

void kvb_engine_load_finish(struct kvb_engine_load *cur, const struct kvb_engine_load *prev,
                            uint32_t block_tokens)
{
    for (uint32_t i = 0; i < cur->n_ranks; i++) {
        struct kvb_rank_load *r = &cur->rank[i];
        if (cur->kind == KVB_ENGINE_SGLANG && kvb_load_has(r, KVB_LOAD_TOTAL_TOKENS) &&
            r->v[KVB_LOAD_TOTAL_TOKENS] >= 0) {
            double bt = block_tokens ? (double)block_tokens : 1.0;
            set(r, KVB_LOAD_TOTAL_BLOCKS, floor(r->v[KVB_LOAD_TOTAL_TOKENS] / bt));
            set(r, KVB_LOAD_BLOCK_TOKENS, bt);
        }
        if (kvb_load_has(r, KVB_LOAD_KV_USAGE) && kvb_load_has(r, KVB_LOAD_TOTAL_BLOCKS)) {
            double total = r->v[KVB_LOAD_TOTAL_BLOCKS], u = r->v[KVB_LOAD_KV_USAGE];
            u = u < 0 ? 0 : u > 1 ? 1 : u;
            if (total >= 0 && isfinite(total))
                set(r, KVB_LOAD_USED_BLOCKS, fmin(round(u * total), total));
        }
        if (!kvb_load_has(r, KVB_LOAD_HIT_RATE) && kvb_load_has(r, KVB_LOAD_PREFIX_QUERIES) &&
            kvb_load_has(r, KVB_LOAD_PREFIX_HITS)) {
            double q = r->v[KVB_LOAD_PREFIX_QUERIES], h = r->v[KVB_LOAD_PREFIX_HITS];
            const struct kvb_rank_load *p = kvb_engine_load_rank(prev, r->dp_rank);
            if (p && kvb_load_has(p, KVB_LOAD_PREFIX_QUERIES) &&
                kvb_load_has(p, KVB_LOAD_PREFIX_HITS)) {
                double dq = q - p->v[KVB_LOAD_PREFIX_QUERIES];
                double dh = h - p->v[KVB_LOAD_PREFIX_HITS];
                if (dq > 0 && dh >= 0 && dh <= dq) {
                    set(r, KVB_LOAD_HIT_RATE, dh / dq);
                    continue;
                }
            }
            if (q > 0 && h >= 0 && h <= q)
                set(r, KVB_LOAD_HIT_RATE, h / q);
        }
    }
}
