/* engine_load: what an engine's /metrics page says about its load, per
 * data-parallel rank.
 *
 * Pure: text in (through promtext), a struct out; no I/O, no clock, no
 * allocation.  Which metric feeds which field is one table per engine kind
 * in src/engine/load.c, with the label that carries the dp_rank (vLLM:
 * "engine", SGLang: "dp_rank"; a series without it is rank 0).  Names are
 * checked against the engines' sources (cited by the table).
 *
 * Several series for one field and one rank (other labels differ: tp_rank,
 * pp_rank, model_name ...) give the largest value.  Where an engine has an
 * old and a new name for one quantity (vLLM 0.8: vllm:gpu_cache_usage_perc,
 * since 0.9: vllm:kv_cache_usage_perc), the new one wins when both are there.
 * NaN values are ignored; so are ranks past KVB_LOAD_MAX_RANKS (counted).
 */
#ifndef KVB_ENGINE_LOAD_H
#define KVB_ENGINE_LOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "promtext.h"

enum kvb_engine_kind { KVB_ENGINE_VLLM = 0, KVB_ENGINE_SGLANG = 1 };

#define KVB_LOAD_MAX_RANKS 128

/* Fields of one rank; `have` is a bit mask of (1u << field). */
enum kvb_load_field {
    KVB_LOAD_KV_USAGE = 0,   /* fraction of the KV cache in use, 0..1 */
    KVB_LOAD_TOTAL_BLOCKS,   /* vLLM: cache_config_info's num_gpu_blocks */
    KVB_LOAD_BLOCK_TOKENS,   /* vLLM: cache_config_info's block_size */
    KVB_LOAD_TOTAL_TOKENS,   /* SGLang: max_total_num_tokens; vLLM: kv_cache_size_tokens */
    KVB_LOAD_RUNNING,        /* requests running */
    KVB_LOAD_WAITING,        /* requests queued */
    KVB_LOAD_PREFIX_QUERIES, /* vLLM counter: prefix-cache queries (tokens) */
    KVB_LOAD_PREFIX_HITS,    /* vLLM counter: prefix-cache hits (tokens) */
    KVB_LOAD_HIT_RATE,       /* prefix-cache hit rate 0..1 (SGLang gauge; derived for vLLM) */
    KVB_LOAD_USED_BLOCKS,    /* derived: round(kv_usage x total_blocks) */
    KVB_LOAD_NFIELDS
};

struct kvb_rank_load {
    uint32_t dp_rank;
    uint32_t have;                  /* (1u << KVB_LOAD_*) for each field found */
    double v[KVB_LOAD_NFIELDS];     /* indexed by enum kvb_load_field */
    uint8_t prio[KVB_LOAD_NFIELDS]; /* internal: which name set v (lower wins) */
};

struct kvb_engine_load {
    enum kvb_engine_kind kind;
    uint32_t n_ranks; /* in order of first appearance */
    struct kvb_rank_load rank[KVB_LOAD_MAX_RANKS];
    uint64_t matched;           /* samples that fed a field */
    uint64_t ignored;           /* mapped samples dropped (bad rank, NaN, rank overflow) */
    struct kvb_prom_stats prom; /* of the page */
};

/* "vllm" / "sglang" -> kind; returns 0 or -EINVAL. */
int kvb_engine_kind_parse(const char *name, enum kvb_engine_kind *out);
const char *kvb_engine_kind_name(enum kvb_engine_kind kind);
/* The label carrying the dp_rank for this kind ("engine", "dp_rank"). */
const char *kvb_engine_dp_label(enum kvb_engine_kind kind);

/* Parse a /metrics page (text is modified in place: see promtext.h) into
 * *out (fully overwritten).  Returns 0, or -EINVAL for a bad kind or
 * arguments.  A page without any known metric is not an error: n_ranks 0. */
int kvb_engine_load_parse(enum kvb_engine_kind kind, char *text, size_t len,
                          struct kvb_engine_load *out);

/* Derived fields, after parse:
 *  - SGLang total blocks = max_total_num_tokens / block_tokens, where
 *    block_tokens is the page size the engine's KV events count in (the
 *    source's block size); 0 = unknown, then 1 (blocks are tokens, as SGLang's
 *    own KvMetrics for Dynamo count them).  vLLM: num_gpu_blocks as read.
 *  - used blocks = round(kv_usage x total blocks), when both are known.
 *  - vLLM hit rate = delta hits / delta queries since `prev` (the previous
 *    parse of the same engine, may be NULL) when both counters went up, else
 *    hits / queries over the engine's life; none when queries is 0.
 */
void kvb_engine_load_finish(struct kvb_engine_load *cur, const struct kvb_engine_load *prev,
                            uint32_t block_tokens);

/* The rank entry for dp_rank, or NULL. */
const struct kvb_rank_load *kvb_engine_load_rank(const struct kvb_engine_load *l, uint32_t dp_rank);

static inline bool kvb_load_has(const struct kvb_rank_load *r, enum kvb_load_field f)
{
    return (r->have >> f) & 1u;
}

#endif
