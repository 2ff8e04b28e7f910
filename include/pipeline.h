/* pipeline: decode -> convert for one batch of one stream, and the router
 * events handed on to the publish stage (publish.h), in order.  The
 * sequence rules (gap, restart, replay; docs/router-events.md section 6) are
 * replay.h's, and they call the pipeline (kvb_pipeline_seq_ops()) for each
 * batch they apply or reject and each barrier: the daemon, kvbridge-inspect,
 * the fuzz targets and the benches all go through them.
 *
 * The data path runs one way: rules -> pipeline -> publish stage (which owns
 * the format: encode, batch, raw) -> sink or writer.  When the publish
 * stage's observer (the residency mirror) lost its view of a pair, the
 * pipeline publishes the pair's "cleared" (cause mirror_full) right after
 * the event: nothing calls back into the pipeline.
 *
 * Ownership: the pipeline owns its decoder and converter;
 * kvb_pipeline_destroy(&p) frees them (accepts NULL).  The metrics struct
 * and the publish stage are the caller's and must outlive the pipeline.
 */
#ifndef KVB_PIPELINE_H
#define KVB_PIPELINE_H

#include <stddef.h>
#include <stdint.h>

#include "convert.h"
#include "decode.h"
#include "metrics.h"
#include "publish.h"
#include "replay.h"

struct kvb_pipeline_cfg {
    struct kvb_convert_cfg convert;
    struct kvb_decode_limits limits;
    bool coalesce; /* nats.coalesce: merge adjacent events of a batch (coalesce.h) */
};

struct kvb_pipeline;
struct kvb_config;

/* The pipeline's settings from a loaded configuration: the one derivation
 * that the daemon and kvbridge-inspect share. */
struct kvb_pipeline_cfg kvb_pipeline_cfg_of(const struct kvb_config *c);

/* pub: where the router events go (borrowed).  When it takes engine
 * batches (kvb_publish_takes_batches(): nats.format raw), a batch that
 * decodes goes to kvb_publish_raw() instead of being converted. */
int kvb_pipeline_create(const struct kvb_pipeline_cfg *cfg, struct kvb_metrics *m,
                        struct kvb_publish *pub, struct kvb_pipeline **out);
void kvb_pipeline_destroy(struct kvb_pipeline **p);

/* Swap in a new configuration (SIGHUP); event_id counters are kept. */
int kvb_pipeline_reconfigure(struct kvb_pipeline *p, const struct kvb_pipeline_cfg *cfg);

/* The pipeline's part alone, the stream read only (kvb_seq_ops.apply): the
 * publish stage's batch boundary (kvb_publish_cut), decode, start barrier
 * for a dp_rank new to the stream, convert, publish; a batch that does not
 * decode publishes the malformed barrier; a 65th dp_rank on one stream is
 * dropped.  *out: what it did, for the rules to record. */
int kvb_pipeline_batch(struct kvb_pipeline *p, const struct kvb_stream *s, uint64_t seq,
                       const uint8_t *payload, size_t len, struct kvb_applied *out);
/* The malformed barrier for a batch that is not decoded (kvb_seq_ops.reject). */
int kvb_pipeline_malformed(struct kvb_pipeline *p, const struct kvb_stream *s, uint64_t seq,
                           const char *why);
/* The rules' kvb_seq_ops: kvb_pipeline_batch, kvb_pipeline_malformed and
 * kvb_pipeline_barrier, with this pipeline as ctx. */
struct kvb_seq_ops kvb_pipeline_seq_ops(struct kvb_pipeline *p);

/* "cleared" for every dp_rank of the stream (the ranks seen so far, or its
 * configured rank if none), counted under cause (enum kvb_barrier_cause).
 * Every router event of a stream is for its worker (kvb_stream.worker, or
 * the configuration's when NULL). */
int kvb_pipeline_barrier(struct kvb_pipeline *p, const struct kvb_stream *s, int cause);

/* "cleared" for one (worker_id, dp_rank), counted under cause (at start,
 * the pairs the saved residency mirror cannot vouch for).  1, 0 when
 * redundant, or a negative errno. */
int kvb_pipeline_cleared(struct kvb_pipeline *p, uint64_t worker_id, uint32_t dp_rank, int cause);

/* Repairs (docs/router-events.md section 6, "Repairs"): router events of
 * (worker_id, dp_rank) were lost on the NATS side, and the residency mirror
 * still holds the pair.  repair_cleared publishes the pair's "cleared"
 * marked as a repair (kvb_rev.repair: consumers forget the pair, the mirror
 * keeps it and marks its blocks missing); repair_stored publishes one
 * stored event of those blocks (from kvb_mirror_repair_next(): tier,
 * blocks, parent), which takes the pair's next event_id.  Neither is ever
 * redundant.  1 (or 2 with a mirror_full barrier after it), or a negative
 * errno. */
int kvb_pipeline_repair_cleared(struct kvb_pipeline *p, uint64_t worker_id, uint32_t dp_rank,
                                int cause);
int kvb_pipeline_repair_stored(struct kvb_pipeline *p, const struct kvb_rev *rev);

/* What the last kvb_pipeline_batch() saw, for metrics. */
struct kvb_batch_info {
    uint64_t serial; /* +1 per apply */
    bool decoded;
    double ts; /* engine timestamp, seconds */
    uint32_t n_events;
};
const struct kvb_batch_info *kvb_pipeline_last_batch(const struct kvb_pipeline *p);

/* The decoder alone (kvbridge-inspect --decoded). */
struct kvb_decoder *kvb_pipeline_decoder(struct kvb_pipeline *p);
struct kvb_converter *kvb_pipeline_converter(struct kvb_pipeline *p);

#endif
