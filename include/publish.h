/* publish: the publish stage.  Router events and engine batches -> messages
 * in the format of nats.format (docs/dynamo-event-plane.md); the format is
 * this module's alone:
 *   dynamo-json     one message per router event, encoded here
 *                   (encode_json.c), on nats.subject; JetStream: with
 *                   Nats-Msg-Id
 *   dynamo-msgpack  the event-plane batcher (encode_msgpack.h): envelopes
 *                   of one (worker_id, dp_rank), cut at 128 events / 8192
 *                   blocks, at every engine batch boundary (kvb_publish_cut(),
 *                   which the pipeline calls as each batch starts: one message
 *                   per engine batch, as the engine sent it) and at every
 *                   kvb_publish_flush(); the subject is nats.subject with each
 *                   value percent-encoded
 *   raw             each engine batch unchanged (kvb_publish_raw()), with
 *                   the headers KV-Seq, KV-Topic, KV-Source, KV-DP-Rank
 * With discovery (discovery.h), a pair's messages are published only once
 * its EventSource record exists: until then they are held (at most
 * HELD_MAX_BYTES; beyond that they are dropped and a loss is reported, which
 * the caller answers with barriers) and kvb_publish_blocked() tells the loop
 * to stop reading the engines.
 *
 * The messages go to the sink, or, sink-less, to a writer (kvb_publish_set_writer:
 * kvbridge-inspect, the fuzz targets, the benches), which receives exactly
 * what the sink would have been given: subject, bytes, headers, message id.
 * An observer (the residency mirror) is told of every router event after it
 * went out (or into the pending message); it only observes.
 *
 * Threads: the loop thread owns the stage and is its only caller.
 * Ownership: kvb_publish_create() returns a stage freed with
 * kvb_publish_destroy(&o) (accepts NULL, sets NULL), which drops what was not
 * flushed.  The sink and discovery handles are borrowed (set_sink after a
 * sink is replaced); the strings of the kvb_publish_cfg given to create or
 * reconfigure (the configuration's) must outlive the stage or the next
 * reconfigure.
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

/* What the stage needs of a configuration (strings not copied). */
struct kvb_publish_cfg {
    int format;                                    /* enum kvb_format */
    const char *subject;                           /* nats.subject: the template */
    const char *namespace_, *component, *endpoint; /* its {namespace} {component} {endpoint} */
    uint64_t worker_id;                            /* the configured one (kvb_publish_subject) */
    /* JetStream: its one subject (messages with Nats-Msg-Id); NULL: core NATS */
    const char *js_subject;
    bool batch, residency_domain; /* dynamo-msgpack: nats.batch, nats.residency_domain */
};

/* The stage's settings from a loaded configuration: the one derivation that
 * the daemon and kvbridge-inspect share. */
struct kvb_publish_cfg kvb_publish_cfg_of(const struct kvb_config *c);

/* 0, -ENOMEM, -ENAMETOOLONG / -EINVAL (subject template).  publisher_seed:
 * the seed of the event-plane publisher ids (random at every start). */
int kvb_publish_create(const struct kvb_publish_cfg *cfg, struct kvb_metrics *m,
                       uint64_t publisher_seed, struct kvb_publish **out);
void kvb_publish_destroy(struct kvb_publish **o);

/* A new configuration (SIGHUP): subjects are resolved again (flush first).
 * nats.format, nats.batch and nats.residency_domain need a restart. */
int kvb_publish_reconfigure(struct kvb_publish *o, const struct kvb_publish_cfg *cfg);
void kvb_publish_set_sink(struct kvb_publish *o, struct kvb_sink *s);
/* Discovery on: register the pairs of configuration c now (each source's
 * ranks). */
int kvb_publish_set_discovery(struct kvb_publish *o, struct kvb_discovery *d,
                              const struct kvb_config *c);

/* One message, as the sink would be given it. */
struct kvb_publish_msg {
    const char *subject;
    const void *data;
    size_t len;
    const char *const *hdrs;   /* raw: name, value, name, value ...; else NULL */
    size_t n_hdrs;             /* pairs */
    const char *msg_id;        /* JetStream: Nats-Msg-Id; else NULL */
    const struct kvb_rev *rev; /* dynamo-json: the router event it carries; else NULL */
};

/* Sink-less: every message goes to write (0, or a negative errno: counted
 * as a failed publish) instead of a sink; the bytes are valid during the
 * call only.  now_ms is the clock of dynamo-msgpack's published_at (a fixed
 * time: the same input gives the same bytes). */
struct kvb_publish_writer {
    int (*write)(void *ctx, const struct kvb_publish_msg *msg);
    void *ctx;
    uint64_t now_ms;
};
void kvb_publish_set_writer(struct kvb_publish *o, const struct kvb_publish_writer *w);

/* Told of every router event kvb_publish_event() took, after it went out or
 * into the pending message.  Returns 1 when the observer lost its view of
 * the event's (worker_id, dp_rank) (the residency mirror is full) and the
 * pair needs a "cleared", else 0. */
typedef int (*kvb_publish_observer_fn)(void *ctx, const struct kvb_rev *rev);
void kvb_publish_set_observer(struct kvb_publish *o, kvb_publish_observer_fn fn, void *ctx);

/* One router event.  0, or 1 when the observer asks for a "cleared" of its
 * pair (the caller, the pipeline, publishes it next); a publish that failed
 * is logged, counted by the sink and reported by kvb_publish_take_loss(). */
int kvb_publish_event(struct kvb_publish *o, const struct kvb_rev *r);

/* The format republishes engine batches unchanged (raw): the pipeline hands
 * each batch to kvb_publish_raw() instead of converting it (its barriers
 * still go to kvb_publish_event(), which does not publish them). */
bool kvb_publish_takes_batches(const struct kvb_publish *o);

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

/* An engine batch starts (the pipeline is about to apply it): dynamo-msgpack
 * sends the pending message, so that no message carries the events of two
 * engine batches (a barrier the rules publish before a batch joins the
 * message before it).  Other formats: nothing.  0; a failure as for
 * kvb_publish_event(). */
int kvb_publish_cut(struct kvb_publish *o);

/* Send what is batched (the end of every loop turn, and before a barrier,
 * a flush of the sink, a reload or the shutdown) and release held messages
 * whose pair got registered.  0. */
int kvb_publish_flush(struct kvb_publish *o);

/* Bytes of the messages handed to the sink (or the writer) so far. */
uint64_t kvb_publish_bytes(const struct kvb_publish *o);

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
