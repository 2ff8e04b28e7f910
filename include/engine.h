/* engine: supervision of the engines' HTTP faces (sources[].engine), for the
 * loop: scraping (scrape.h, on its own thread), the load gauges
 * (kvbridge_engine_*), ActiveLoad messages (load_pub.h) and the liveness
 * barrier.
 *
 * One engine per sources[] entry that has a metrics_url or a health_url; it
 * covers the entry's dp_size expansion (the loop's sources first .. first +
 * dp_size - 1, in the order build_sources() opens them).  Without any URL an
 * entry has no engine: no load, and no liveness judgement is ever made.
 *
 * Load: each /metrics page gives per-rank values (engine/load.h); metrics
 * rank k is dp_rank sources[].dp_rank + k, exported with the source name of
 * the k-th expanded endpoint.  For each rank with kv_used_blocks (usage x
 * total blocks) an ActiveLoad is published when the value changed since the
 * last message of that rank (so at most one scrape interval after the
 * engine's change: the scrape is the debounce) and otherwise every
 * KVB_LOAD_REPUBLISH_MS while the engine answers.  active_decode_blocks and
 * active_prefill_tokens are not on either engine's /metrics page: nil.
 * Each rank has its own publisher_id (53 random bits, new at every start)
 * and sequence.
 *
 * Liveness: scrape.h's kvb_liveness_judge() on every scrape result, with the
 * time of the last message read from any of the engine's sources.  On GONE:
 * a warning, engine_gone_total + 1, the engines_gone gauge, the slots'
 * `gone` flag (/readyz names them), and "cleared" (cause engine_gone) for
 * every dp_rank of every stream of the engine's sources, once.  On BACK: an
 * info line and the flags cleared; the engine's first batches then take the
 * usual restart path.  While the loop is not reading (backpressure) nothing
 * is judged: silence is then ours, not the engine's.
 *
 * Threading: the loop thread calls everything here; only the scrape thread
 * inside scrape.c is another thread.
 *
 * Ownership: kvb_engines_create() copies what it needs from the config (the
 * config may be freed afterwards); kvb_engines_destroy(&e) stops the scrape
 * thread and frees everything (accepts NULL, sets *e to NULL).
 */
#ifndef KVB_ENGINE_H
#define KVB_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "metrics.h"
#include "source.h"

#define KVB_LOAD_REPUBLISH_MS 10000u

/* Publish one message on SUBJECT (core NATS); 0 or a negative errno. */
typedef int (*kvb_engine_publish_fn)(void *ctx, const char *subject, const void *data, size_t len);

struct kvb_engines;

/* 0 or a negative errno (-EINVAL: a target scrape.h rejects, -ENOMEM,
 * -ENAMETOOLONG: the load subject). */
int kvb_engines_create(const struct kvb_config *c, struct kvb_metrics *m,
                       kvb_engine_publish_fn publish, void *ctx, struct kvb_engines **out);
void kvb_engines_destroy(struct kvb_engines **e);

/* Engines configured (0: nothing to do, no fd). */
size_t kvb_engines_count(const struct kvb_engines *e);

/* Poll for POLLIN (a scrape result is ready); -1 when there is no engine. */
int kvb_engines_fd(const struct kvb_engines *e);

/* Times the liveness of the engine behind the loop's source SRC_INDEX was
 * judged to change (gone, back); 0 when that source has no engine. */
uint64_t kvb_engines_liveness_changes(const struct kvb_engines *e, size_t src_index);

/* A message was read from the loop's source SRC_INDEX at NOW_MS. */
void kvb_engines_note_batch(struct kvb_engines *e, size_t src_index, uint64_t now_ms);

/* The fd polled readable: take the results, update gauges, publish load,
 * judge liveness (not while `paused`), barrier through src[]. */
void kvb_engines_on_ready(struct kvb_engines *e, struct kvb_source **src, size_t n_src,
                          uint64_t now_ms, bool paused);

/* True when configurations A and B give the same engines (entries, their
 * dp_size and dp_rank, engine maps, and what the load messages are built
 * from): SIGHUP keeps the running engines (and their liveness state) then. */
bool kvb_engines_cfg_equal(const struct kvb_config *a, const struct kvb_config *b);

#endif
