/* output: router events and engine batches -> NATS messages, in the format
 * of nats.format (docs/dynamo-event-plane.md):
 *   dynamo-json     one message per router event (the pipeline's bytes), on
 *                   nats.subject; JetStream: with Nats-Msg-Id
 *   dynamo-msgpack  the event-plane batcher (encode_msgpack.h): envelopes
 *                   of one (worker_id, dp_rank), cut at 128 events / 8192
 *                   blocks, at the end of every engine batch
 *                   (kvb_publish_cut(): one message per engine batch, as
 *                   the engine sent it) and at every kvb_publish_flush(); the subject is
 *                   nats.subject with each value percent-encoded
 *   raw             each engine batch unchanged (kvb_publish_raw()), with
 *                   the headers KV-Seq, KV-Topic, KV-Source, KV-DP-Rank
 * With discovery (discovery.h), a pair's messages are published only once
 * its EventSource record exists: until then they are held (at most
 * HELD_MAX_BYTES; beyond that they are dropped and a loss is reported, which
 * the caller answers with barriers) and kvb_publish_blocked() tells the loop
 * to stop reading the engines.
 *
 * Threads: the loop thread owns the output and is its only caller.
 * Ownership: kvb_publish_create() returns an output freed with
 * kvb_publish_destroy(&o) (accepts NULL, sets NULL), which drops what was not
 * flushed.  The sink and discovery handles are borrowed (set_sink after a
 * sink is replaced); the config passed to create/reconfigure must outlive
 * the output or the next reconfigure.
 */
#ifndef KVB_PUBLISH_H
#define KVB_PUBLISH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "convert.h"

struct kvb_config;
struct kvb_metrics;
struct kvb_sink;
struct kvb_discovery;
struct kvb_publish;

/* 0, -ENOMEM, -ENAMETOOLONG / -EINVAL (subject template).  publisher_seed:
 * the seed of the event-plane publisher ids (random at every start). */
int kvb_publish_create(const struct kvb_config *cfg, struct kvb_metrics *m, uint64_t publisher_seed,
                       struct kvb_publish **out);
void kvb_publish_destroy(struct kvb_publish **o);

/* A new configuration (SIGHUP): subjects are resolved again (flush first).
 * nats.format, nats.batch and nats.residency_domain need a restart. */
int kvb_publish_reconfigure(struct kvb_publish *o, const struct kvb_config *cfg);
void kvb_publish_set_sink(struct kvb_publish *o, struct kvb_sink *s);
/* Discovery on: register the configured pairs now (each source's ranks). */
int kvb_publish_set_discovery(struct kvb_publish *o, struct kvb_discovery *d);

/* One router event; json/len: its dynamo-json bytes (dynamo-json only).
 * 0; a publish that failed is logged, counted by the sink and reported by
 * kvb_publish_take_loss(). */
int kvb_publish_event(struct kvb_publish *o, const struct kvb_rev *r, const char *json, size_t len);

/* One engine batch, raw format. */
struct kvb_raw_batch {
    const char *source; /* the stream's name (its endpoint) */
    const char *topic;  /* the engine's ZMQ topic frame, "" when none */
    uint64_t seq;
    uint32_t dp_rank;
    const void *payload;
    size_t len;
    uint64_t worker_id; /* the stream's worker ({worker_id} of the subject) */
};
int kvb_publish_raw(struct kvb_publish *o, const struct kvb_raw_batch *b);

/* An engine batch ended (the caller saw its router events): dynamo-msgpack
 * sends the pending message, so that no message carries the events of two
 * engine batches.  Other formats: nothing.  0; a failure as for
 * kvb_publish_event(). */
int kvb_publish_cut(struct kvb_publish *o);

/* Send what is batched (the end of every loop turn, and before a barrier,
 * a flush of the sink, a reload or the shutdown) and release held messages
 * whose pair got registered.  0. */
int kvb_publish_flush(struct kvb_publish *o);

/* True once per loss since the last call: a publish failed or held
 * messages were dropped (the caller publishes barriers). */
bool kvb_publish_take_loss(struct kvb_publish *o);

/* Discovery: a pair is not registered yet, or messages are held. */
bool kvb_publish_blocked(const struct kvb_publish *o);
/* Discovery off, or every pair registered. */
bool kvb_publish_registered(const struct kvb_publish *o);

/* The subject of (cfg worker_id, rank 0), for the start-up log line. */
const char *kvb_publish_subject(struct kvb_publish *o);

#endif
