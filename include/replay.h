/* replay: the sequence and replay rules of engine streams, in one place
 * (docs/router-events.md section 6, docs/engine-events.md section 1 "Replay").
 *
 * "Count the gap, log it, replay it or publish a barrier", "seq went back:
 * restart barrier", "hold the live batches while a replay runs, then apply
 * them and skip what the replay already gave", "replay timed out: barrier":
 * every one of these rules lives here and nowhere else, and so does the one
 * write of a stream's cursor (kvb_stream.last).
 *
 * Pure: no sockets, no clock reads (the time is passed in as now_ms,
 * CLOCK_MONOTONIC milliseconds).  The module decides, and calls
 * synchronously and in order the pipeline (kvb_seq_ops: apply a batch,
 * reject one, publish a barrier) and the replay socket's owner
 * (kvb_replay_io: request a replay from seq N, cancel the request in
 * flight).  Holding a live batch is the module's own business (it keeps a
 * copy).  The source (source.c) owns the sockets and the frames; the
 * pipeline (pipeline.c) owns decode -> convert -> publish.  The daemon,
 * kvbridge-inspect, the fuzz targets and the benches all feed batches
 * through kvb_replay_live(): one set of rules (a replay state without an
 * endpoint where no replay socket exists).
 *
 * struct kvb_stream is written here only: the cursor, suspect and gaps by
 * the rules; the dp_ranks, batches and events from what the pipeline
 * reports of each batch (struct kvb_applied); name, labels, worker and a
 * resumed cursor through the kvb_stream_* setters.
 *
 * Restarts and reconnects: a seq that goes back is a restart
 * (barrier) unless it repeats the last batch byte for byte (a duplicate,
 * dropped).  After the engine's connection dropped (kvb_replay_peer_reset),
 * the next batch is a new incarnation unless proven otherwise: the replay
 * socket is asked for the last applied seq, and the same bytes (XXH3) prove
 * continuity (the gap, if any, is filled by the same request); anything else
 * is a restart (barrier).  Without a replay endpoint a reconnect is a
 * restart.  The proof does not wait for a batch: as soon as the connection
 * is up again (kvb_replay_connected) the replay socket is asked for the last
 * applied seq and everything after it, so that an engine that restarted and
 * went quiet before kvbridge reconnected gets its restart barrier and its
 * new incarnation from seq 0 (what its buffer holds) at once.  The first batch of a new stream (kvbridge's start, or after a
 * restart) with seq S > 0 asks the replay socket for 0..S-1 and applies
 * what the engine still holds before S; what it no longer holds is covered
 * by the start or restart barrier already published.
 *
 * Bounds: a gap of more than replay.max_batches seqs is a barrier at once
 * (no engine buffer holds it); a replay that reads more than that many, or
 * lasts replay.max_ms of wall time (whatever it waited for), ends: what it
 * did not get is a barrier, and the live batches held behind it go on.
 *
 * Ownership: kvb_replay_create() returns a replay state that owns the live
 * batches it holds; kvb_replay_destroy(&r) frees them (accepts NULL).  The
 * metrics, the streams handed to it and the ctx of ops and io must outlive
 * it.  One
 * caller thread (the loop).
 */
#ifndef KVB_REPLAY_H
#define KVB_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "log.h"
#include "metrics.h"

#define KVB_MAX_STREAM_RANKS 64
/* The replay reply's end marker (docs/engine-events.md section 1). */
#define KVB_REPLAY_END UINT64_MAX

struct kvb_worker_cfg; /* convert.h */

/* One engine stream: one (source endpoint, topic) pair.  Plain data, the
 * caller owns it (nothing to free).  Written by this module only (the
 * kvb_stream_* functions below and the rules); everyone else reads it. */
struct kvb_stream {
    const char *name; /* for logs; not owned */
    /* The worker its router events are for (kvb_stream_set_worker; not
     * owned): NULL = the pipeline's configured worker. */
    const struct kvb_worker_cfg *worker;
    const char *source, *topic; /* raw format headers (KV-Source, KV-Topic); not
                                 * owned, NULL when none (kvb_stream_set_labels) */
    uint32_t cfg_rank;          /* the source's configured dp_rank */
    bool has_last;
    uint64_t last;    /* last seq applied */
    uint32_t n_ranks; /* dp_ranks seen (and started) on this stream */
    uint32_t ranks[KVB_MAX_STREAM_RANKS];
    uint64_t batches; /* batches applied (live or replayed) that decoded */
    uint64_t events;  /* engine events in them */
    uint64_t gaps;    /* sequence gaps seen */
    bool has_hash;
    uint64_t last_hash; /* XXH3 of the last applied batch's payload */
    bool suspect;       /* the engine's connection dropped since the last batch */
    /* A check (kvb_replay_check) found the engine's buffer starting after
     * last + 1 while the cursor was at ahead_at: those batches may still be
     * on their way (a TCP window that reopens slowly), so the caller checks
     * again once the stream is quiet; the same answer with the cursor still
     * at ahead_at is the loss. */
    bool check_again;
    uint64_t ahead_at;
    struct kvb_ratelimit rl; /* gap / restart / duplicate warnings */
};

enum kvb_seq_verdict {
    KVB_SEQ_FIRST, /* nothing applied yet */
    KVB_SEQ_NEXT,  /* last + 1 */
    KVB_SEQ_GAP,   /* > last + 1 */
    KVB_SEQ_BACK,  /* <= last: the engine restarted (outside a replay) */
};

void kvb_stream_init(struct kvb_stream *s, const char *name, uint32_t cfg_rank);
/* The raw format's KV-Source and KV-Topic of its batches (not copied). */
void kvb_stream_set_labels(struct kvb_stream *s, const char *source, const char *topic);
/* The worker its router events are for from the next batch on (not
 * copied; NULL: the pipeline's). */
void kvb_stream_set_worker(struct kvb_stream *s, const struct kvb_worker_cfg *w);
/* A stream persisted by a previous run (state.dir): it goes on after seq
 * last with these dp_ranks (at most KVB_MAX_STREAM_RANKS are taken). */
void kvb_stream_resume(struct kvb_stream *s, uint64_t last, const uint32_t *ranks, uint32_t n);
int kvb_seq_classify(const struct kvb_stream *s, uint64_t seq);
/* Number of seqs missing before seq (valid for KVB_SEQ_GAP). */
uint64_t kvb_seq_missing(const struct kvb_stream *s, uint64_t seq);
bool kvb_stream_has_rank(const struct kvb_stream *s, uint32_t rank);

/* What applying one batch did, as the pipeline reports it (the module then
 * records it in the stream). */
struct kvb_applied {
    bool decoded;      /* else the pipeline published the malformed barrier */
    uint32_t dp_rank;  /* decoded: the batch's dp_rank (its own or cfg_rank) */
    uint32_t n_events; /* decoded: its engine events */
};

/* How the module's decisions about the data are carried out (the pipeline:
 * kvb_pipeline_seq_ops()).  The stream is read-only to them: the module
 * has already moved the cursor, and records what they report.  Each
 * returns the number of router events it emitted (>= 0) or a negative
 * errno. */
struct kvb_seq_ops {
    void *ctx;
    /* Decode, convert and emit one batch whose seq is judged (a batch that
     * does not decode publishes the malformed barrier); *out says what it
     * did (a replayed batch that did not decode is a loss: the replay is
     * then not "filled"). */
    int (*apply)(void *ctx, const struct kvb_stream *s, uint64_t seq, const uint8_t *data,
                 size_t len, struct kvb_applied *out);
    /* A batch that must not be decoded (above limits.max_payload_bytes):
     * the malformed barrier. */
    int (*reject)(void *ctx, const struct kvb_stream *s, uint64_t seq, const char *why);
    /* "cleared" for every dp_rank of the stream (it has at least its
     * configured one), counted under cause (enum kvb_barrier_cause). */
    int (*barrier)(void *ctx, const struct kvb_stream *s, int cause);
};

/* The engine's replay socket, for the module's requests (the source owns
 * it).  Without a replay endpoint there is none. */
struct kvb_replay_io {
    void *ctx;
    /* Ask for every batch from seq `from` on: 0 once sent, or a negative
     * errno. */
    int (*request)(void *ctx, uint64_t from);
    /* Forget the request in flight: late replies to it must not reach the
     * next one. */
    void (*cancel)(void *ctx);
};

/* ---- a source's streams, with replay ------------------------------------ */

struct kvb_replay_cfg {
    const char *name;           /* the source, for logs (copied) */
    const char *endpoint;       /* replay endpoint, or "" / NULL: no replay (copied) */
    uint32_t timeout_ms;        /* replay.timeout_ms */
    uint32_t max_ms;            /* replay.max_ms: a whole replay, wall time; 0: 30000 */
    uint64_t max_batches;       /* replay.max_batches: a larger gap is a barrier; 0: 10000 */
    uint64_t max_payload_bytes; /* limits.max_payload_bytes; 0: no limit */
    size_t max_held_msgs;       /* 0: 100000 */
    size_t max_held_bytes;      /* 0: 256 MiB */
};

struct kvb_replay;

/* ops: where the batches go; io: the replay socket (NULL: none, as without
 * an endpoint).  Both copied. */
int kvb_replay_create(const struct kvb_replay_cfg *cfg, struct kvb_metrics *m,
                      const struct kvb_seq_ops *ops, const struct kvb_replay_io *io,
                      struct kvb_replay **out);
void kvb_replay_destroy(struct kvb_replay **r);

/* A live batch of stream st (frames already checked).  Returns the router
 * events emitted (0 when the batch is held), or a negative errno. */
int kvb_replay_live(struct kvb_replay *r, struct kvb_stream *st, uint64_t seq, const uint8_t *data,
                    size_t len, uint64_t now_ms);
/* One replay reply (frames checked): a batch, or the end marker (seq
 * KVB_REPLAY_END with an empty payload; a batch at that seq, after 2^64 - 1
 * others, is a batch). */
int kvb_replay_reply(struct kvb_replay *r, uint64_t seq, const uint8_t *data, size_t len,
                     uint64_t now_ms);
/* Time passes: a replay whose deadline ran out is asked again (a cut reply)
 * or given up (barrier, then the held batches). */
int kvb_replay_tick(struct kvb_replay *r, uint64_t now_ms);
/* Milliseconds until kvb_replay_tick() has work, or -1. */
long kvb_replay_next_deadline(const struct kvb_replay *r, uint64_t now_ms);
/* MS milliseconds were not the engine's: the caller did not read replies
 * (the daemon held back: NATS backpressure) or was applying and publishing
 * them.  The replay's deadlines move by as much: replay.timeout_ms bounds
 * the time spent waiting for the engine. */
void kvb_replay_postpone(struct kvb_replay *r, uint64_t ms);
/* Reading was held back (NATS backpressure) long enough for the engine's PUB
 * to drop batches of stream st (the source saw its SUB queue full), and the
 * stream has been quiet since: no later seq will reveal such a gap while the
 * engine is idle (or dead).  Ask the replay socket for everything after the
 * last applied seq: what comes is applied; a reply that starts later than
 * asked, or no answer within replay.timeout_ms, is a barrier; the engine's
 * END alone means nothing was missed.  A live batch meanwhile ends the check
 * (the next seq) or turns it into an ordinary gap replay up to it (a later
 * one), and live copies of the batches it applied (still on their way) are
 * dropped (same seq, same bytes).  A reply that starts later is believed the
 * second time in a row only (see kvb_stream.check_again).  Without a replay
 * endpoint: the barrier at once.  Nothing when the stream has nothing applied
 * yet or its connection dropped since (its next batch proves itself).
 * Returns the router events emitted, -EBUSY while a replay runs (ask again
 * later), or a negative errno. */
int kvb_replay_check(struct kvb_replay *r, struct kvb_stream *st, uint64_t now_ms);
/* "cleared" for every dp_rank of stream st, counted under cause (NATS lost
 * router events, the engine is gone): the router forgets the stream; its
 * cursor stays.  Returns the router events emitted. */
int kvb_replay_barrier(struct kvb_replay *r, struct kvb_stream *st, int cause);
/* A replay is in flight (its replies are wanted). */
bool kvb_replay_active(const struct kvb_replay *r);
/* Live batches held back while the replay runs. */
size_t kvb_replay_held(const struct kvb_replay *r);
/* The stream being recovered (or whose replay is being requested), or NULL. */
const struct kvb_stream *kvb_replay_stream(const struct kvb_replay *r);
/* The connection that carried stream st dropped: a replay of it ends (what
 * it got is applied), and its next batch must prove it continues the stream
 * (else: restart barrier). */
void kvb_replay_peer_reset(struct kvb_replay *r, struct kvb_stream *st, uint64_t now_ms);
/* The connection that carries stream st is up again: a stream whose
 * connection dropped since its last batch is proven now (the batch at its
 * last seq, and what follows, from the replay socket; a different batch, or
 * none, is the restart barrier and the new incarnation from seq 0), or
 * without a replay endpoint it gets the restart barrier now.  Returns the
 * router events emitted, -EBUSY while a replay of another stream runs (ask
 * again later), 0 when there is nothing to prove. */
int kvb_replay_connected(struct kvb_replay *r, struct kvb_stream *st, uint64_t now_ms);

#endif
