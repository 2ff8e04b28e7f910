/* source: one engine endpoint (after dp_size expansion): a ZMQ SUB, frame
 * validation, sequence tracking per stream (endpoint, topic), and recovery of
 * gaps through the engine's replay ROUTER (docs/engine-events.md section 1,
 * docs/router-events.md section 6).
 *
 * The loop thread owns every source and is the only caller.  A source hands
 * each batch, in order, to the sequence rules (replay.h), which hand it to
 * the pipeline it was created with; it never publishes by itself.  It owns
 * the streams and only reads them (the rules write them).
 *
 * Ownership: kvb_source_create() returns a source that owns its sockets, its
 * streams and any held batches; kvb_source_destroy(&s) closes and frees them
 * (accepts NULL and half-built sources).  The ZMQ context, the pipeline,
 * the metrics and the ZAP handler (when given) must outlive it.
 *
 * CURVE (p->curve enabled): in bind mode the SUB is a CURVE server (with a
 * ZAP domain when a handler is given) and the replay DEALER stays plain; in
 * connect mode the SUB and the replay DEALER are CURVE clients of the
 * engine's server key.
 */
#ifndef KVB_SOURCE_H
#define KVB_SOURCE_H

#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "pipeline.h"
#include "state.h"
#include "zap.h"

struct kvb_source;

struct kvb_source_params {
    const char *endpoint;        /* expanded (port + r) */
    const char *replay_endpoint; /* expanded, or "" */
    const char *topic;
    int mode;         /* enum kvb_source_mode */
    uint32_t dp_rank; /* configured rank of this endpoint */
    uint32_t rcvhwm;
    uint32_t reconnect_max_ms; /* connect mode: reconnect interval cap (0: 250) */
    uint32_t max_peers;        /* bind mode: connections taken at once (0: 16) */
    uint32_t replay_timeout_ms;
    uint32_t replay_max_ms;      /* 0: replay.h's default */
    uint64_t replay_max_batches; /* 0: replay.h's default */
    uint64_t max_payload_bytes;
    /* Streams persisted by a previous run (state.dir): a stream found here
     * starts from its saved seq and dp_ranks, so a complete resume publishes
     * no start barrier and a gap is asked from the engine's replay.  Only
     * read during kvb_source_create(); may be NULL. */
    const struct kvb_state *resume;
    /* ZMQ CURVE (sources[].curve); NULL or !enabled: plain ZMTP.  Only read
     * during kvb_source_create(): the source keeps the copies it needs (a
     * connect-mode source its client keys, for the replay DEALER it opens
     * later; zeroed by kvb_source_destroy()). */
    const struct kvb_curve_cfg *curve;
    /* The ZAP handler (zap.h), for bind-mode CURVE sources: required with
     * an allowed_clients_file (kvb_source_create() fails with -EINVAL
     * without it); without one, a source given a handler registers "any
     * client".  May be NULL; must outlive the source. */
    struct kvb_zap *zap;
    /* The worker behind this source (sources[].worker_id, block_size,
     * lora_salt, forward_tiers), and its topics map: a stream whose
     * topic is listed gets the listed worker_id; with a map, a batch on any
     * other topic is counted (malformed_messages_total{kind="unknown_topic"})
     * and dropped.  Both copied.  worker NULL: the pipeline's configured
     * worker, and the map is not used. */
    const struct kvb_worker_cfg *worker;
    const struct kvb_topic_cfg *topics;
    size_t n_topics;
    /* Where the batches go (kvb_pipeline_seq_ops()); borrowed, must
     * outlive the source. */
    struct kvb_pipeline *pipeline;
};

/* Rank r of a dp_size source entry's ENDPOINT, named as NAMING (enum
 * kvb_rank_naming) says: tcp://HOST:(PORT + r), or with KVB_RANKS_TRTLLM
 * ipc://PATH_dp{r} (inproc:// likewise).  Rank 0 is ENDPOINT itself.
 * Writes a malloc'ed string to *out (caller frees).  "" stays "".  0,
 * -EINVAL (an endpoint the naming cannot expand), -ENOMEM. */
int kvb_endpoint_of_rank(const char *endpoint, int naming, uint32_t r, char **out);

int kvb_source_create(void *zctx, const struct kvb_source_params *p, struct kvb_metrics *m,
                      struct kvb_source **out);
void kvb_source_destroy(struct kvb_source **s);

/* Sockets to poll for ZMQ_POLLIN: the SUB, the replay DEALER (NULL while
 * no replay is in flight), and the SUB's connection monitor. */
void *kvb_source_sub(struct kvb_source *s);
void *kvb_source_replay(struct kvb_source *s);
void *kvb_source_monitor(struct kvb_source *s);

/* Connection events of the SUB (read before its messages): a dropped
 * connection makes its streams' next batches prove they continue them
 * (replay.h); in bind mode only the streams that came on that connection.
 * The batches the SUB still held when the drop was read came before it:
 * kvb_source_read() reads those first and applies the drop after them
 * (kvb_source_monitor() is NULL meanwhile). */
int kvb_source_read_monitor(struct kvb_source *s);
const char *kvb_source_name(const struct kvb_source *s);

/* Read up to `budget` live messages without blocking and push them through
 * the pipeline.  Returns messages read, or a negative errno on a fatal error. */
int kvb_source_read(struct kvb_source *s, int budget);

/* Read replay replies without blocking (at most a few hundred per call). */
int kvb_source_read_replay(struct kvb_source *s);

/* Milliseconds until this source needs kvb_source_tick() (replay deadline),
 * or -1.  now_ms: CLOCK_MONOTONIC. */
long kvb_source_next_deadline(const struct kvb_source *s, uint64_t now_ms);
void kvb_source_tick(struct kvb_source *s, uint64_t now_ms);
/* The loop held back (read nothing) for MS milliseconds and reads again from
 * now_ms: a replay in flight gets that much more time (kvb_replay_postpone),
 * and the SUB's queue is watched as it drains.  When it held at least
 * min(rcvhwm / 2, 1024) batches, it may have been full, and the engine's PUB
 * drops what a full queue cannot take: once the source has been quiet for
 * a second, every stream is checked (kvb_replay_check), since an idle or dead
 * engine sends no later seq that would reveal the gap. */
void kvb_source_resume(struct kvb_source *s, uint64_t ms, uint64_t now_ms);

/* A reload changed the worker keys (not the topics map, which reopens the
 * source): every stream's router events are for W from the next batch on
 * (a topic's listed worker_id stays).  Cannot fail. */
void kvb_source_set_worker(struct kvb_source *s, const struct kvb_worker_cfg *w);

/* Live batches held back behind this source's replay (0 when none runs). */
size_t kvb_source_held(const struct kvb_source *s);
/* True while the source reads back its SUB's queue after a hold or runs a
 * replay: the batches it queued are not all freed yet. */
bool kvb_source_busy(const struct kvb_source *s);

/* The engine's connection is up (connect mode; bind mode: a peer is). */
bool kvb_source_connected(const struct kvb_source *s);
/* Nothing left to read or finish: no batch or connection event waiting in
 * the SUB or its monitor, no drop waiting for them, no replay running, no
 * queue being read back.  A source replaced now loses nothing it got. */
bool kvb_source_quiet(const struct kvb_source *s);
/* What it was opened with (its own copies, valid while it lives). */
void kvb_source_endpoints(const struct kvb_source *s, const char **endpoint,
                          const char **replay_endpoint, const char **topic);

/* "cleared" for every dp_rank of every stream of this source. */
int kvb_source_barrier_all(struct kvb_source *s, int cause);

/* Last seq per stream, for metrics: calls fn for each stream. */
void kvb_source_foreach_stream(const struct kvb_source *s,
                               void (*fn)(void *ctx, const char *source, const char *topic,
                                          const struct kvb_stream *st),
                               void *ctx);

#endif
