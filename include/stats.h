/* stats: a summary in the log every log.stats_interval_s (0 = off).
 *
 * One line per source (the streams' source name: the expanded endpoint):
 * batches/s, events/s and gaps over the interval, and its engine's load per
 * dp_rank when sources[].engine is set (kv used/total blocks, requests
 * running and waiting, or "gone"); then one "all:" line: router events
 * published by type, barriers ("cleared by cause"), gaps, replays
 * (filled/failed), dropped events by reason, malformed messages, NATS pending bytes, load
 * messages published and the p99 of batch processing time (the upper bound
 * of the histogram bucket that holds it).  When nothing happened in the
 * interval (no batch, nothing published, dropped or barriered) a single
 * "idle" line instead.  Counts are differences between two snapshots of
 * struct kvb_metrics, so this module keeps no counters of its own.
 *
 * Threading: the loop thread only.  Ownership: kvb_stats_create() keeps a
 * pointer to the metrics (which must outlive it) and a snapshot it owns;
 * kvb_stats_destroy(&s) frees it (accepts NULL).
 */
#ifndef KVB_STATS_H
#define KVB_STATS_H

#include <stdint.h>
#include <stdio.h>

#include "metrics.h"

struct kvb_stats;

int kvb_stats_create(const struct kvb_metrics *m, uint32_t interval_s, struct kvb_stats **out);
void kvb_stats_destroy(struct kvb_stats **s);
/* SIGHUP: a new interval (0 = off), counted from now. */
void kvb_stats_set_interval(struct kvb_stats *s, uint32_t interval_s);

/* Log the lines when the interval has passed since the last ones. */
void kvb_stats_tick(struct kvb_stats *s, uint64_t now_ms);

/* The lines for PREV -> CUR over ELAPSED_MS (pure; for tests), each ending
 * with '\n'.  Returns the number of lines written. */
int kvb_stats_format(const struct kvb_metrics *prev, const struct kvb_metrics *cur,
                     uint64_t elapsed_ms, FILE *f);

#endif
