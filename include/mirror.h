/* residency: what the engine holds, kept by the daemon's loop and handed to
 * any consumer that asks (README "Query API").
 *
 * Owns the residency mirror (mirror.h: per (worker_id, dp_rank, tier) the
 * resident blocks, per pair a ring of the recent router events) and the
 * query hub (query.h) that the HTTP server and the NATS request subject
 * (query.subject) hand their requests to.
 *
 * It observes every router event the publish stage hands on, after the same
 * filters and barriers (kvb_mirror_observe(), the publish stage's observer),
 * so the mirror equals, by construction, what a correct consumer holds.
 * Memory is bounded by limits.max_resident_blocks: a store past it is
 * refused, counted in mirror_overflows_total and logged as an error; the
 * pipeline then publishes a "cleared" barrier for that pair (cause
 * mirror_full) right after it, which empties the pair here too: never a
 * silent divergence.
 *
 * Threads: everything here is the loop thread's, except what query.h says of
 * the hub.  Ownership: kvb_mirror_create() returns an object freed by
 * kvb_mirror_destroy(&r) (accepts NULL), after kvb_mirror_close() and
 * after the HTTP server that serves from it has stopped.  The metrics must
 * outlive it.
 */
#ifndef KVB_MIRROR_H
#define KVB_MIRROR_H

#include <stdbool.h>
#include <stdint.h>

#include "convert.h"
#include "metrics.h"

struct kvb_config;
struct kvb_query;
struct kvb_mirror;

/* limits.max_resident_blocks 0 turns the mirror off: queries answer 503. */
int kvb_mirror_create(const struct kvb_config *c, struct kvb_metrics *m, int wake_fd,
                      struct kvb_mirror **out);
void kvb_mirror_destroy(struct kvb_mirror **r);

/* SIGHUP: worker_id, block_size and lora_salt for match (the mirror's
 * limits need a restart). */
void kvb_mirror_reconfigure(struct kvb_mirror *r, const struct kvb_config *c);

/* One router event, as published.  0, or -ENOSPC when a barrier is due for
 * (rev->worker_id, rev->dp_rank) (the mirror is full or out of memory). */
int kvb_mirror_apply(struct kvb_mirror *r, const struct kvb_rev *rev);
/* kvb_mirror_apply() as the publish stage's observer (publish.h; ctx: the
 * mirror): 1 when the pair needs its "cleared", else 0. */
int kvb_mirror_observe(void *ctx, const struct kvb_rev *rev);

/* Repairs (docs/router-events.md section 6, "Repairs").  A router event
 * marked kvb_rev.repair is recorded (the pair's last event, its ring), not
 * applied: a "cleared" marks every resident block of its pair missing (held
 * by the engine, no longer by the consumers), a stored event is blocks the
 * mirror holds already.  Live events keep the marks true
 * (kvb_index_repair_begin()).  The mirror is on (repairs possible). */
bool kvb_mirror_on(const struct kvb_mirror *r);
/* Blocks the consumers lack, over every pair. */
uint64_t kvb_mirror_missing(const struct kvb_mirror *r);
/* The next stored event a repair publishes (kvb_index_repair_next(): parents
 * before children, at most max_blocks; event_id unset): 1 and *out, valid
 * until the next call; 0 when nothing is missing, or -EAGAIN (looked at
 * many blocks without finding one: call again on a later turn), -ENOMEM. */
int kvb_mirror_repair_next(struct kvb_mirror *r, uint32_t max_blocks, struct kvb_rev *out);

/* Answer the queued queries (after the loop's wake fd fired). */
void kvb_mirror_serve(struct kvb_mirror *r);

/* Gauges: mirror_resident_blocks{tier}, mirror_bytes, mirror_orphans_total,
 * repair_missing_blocks. */
void kvb_mirror_gauges(struct kvb_mirror *r);
/* The result of the last asynchronous save (kvb_mirror_save() without
 * wait) once it is known: *done set, and 0 or a negative errno. */
int kvb_mirror_save_result(struct kvb_mirror *r, bool *done);

/* The hub the HTTP server serves /v1/ from (kvb_http_set_query()). */
struct kvb_query *kvb_mirror_query(struct kvb_mirror *r);

/* Answer the NATS requests on query.subject through the sink's connection
 * (kvb_sink_serve()); detach before destroying that sink (it serves the
 * queued queries while a request callback ends, so none waits on the loop
 * in vain).  0 or a negative errno (the subscription is retried on the
 * sink's next connection). */
struct kvb_sink;
int kvb_mirror_attach(struct kvb_mirror *r, struct kvb_sink *sink);
void kvb_mirror_detach(struct kvb_mirror *r, struct kvb_sink *sink);

/* Persistence (state.dir; src/mirror/persist.h): the cursors are saved by
 * a thread of the saver, together with the mirror when it is on: the loop
 * hands kvb_mirror_save() the cursors it has just taken (after the NATS
 * flush), which takes the mirror's snapshots (memcpy) and returns.
 * persists: state.dir is set, the saver saves the cursors (else nothing
 * is saved).
 * save_busy: a save is in progress or too recent (skip this turn).
 * save: 0 (started, or done with wait: *st is taken), -EBUSY, -ENOTSUP
 * (not persisting), or the write's error with wait. */
struct kvb_state;
bool kvb_mirror_persists(const struct kvb_mirror *r);
bool kvb_mirror_save_busy(struct kvb_mirror *r);
int kvb_mirror_save(struct kvb_mirror *r, const char *dir, struct kvb_state **st, bool wait);

/* At start, after the cursors were loaded and the sink made: load the saved
 * mirror for the pairs it holds consistently with the cursors; call barrier
 * for every other pair of the cursors (the caller publishes a "cleared" for
 * it, which empties the pair here and in every consumer).  Returns how many
 * pairs need a barrier, or a negative errno. */
int kvb_mirror_load(struct kvb_mirror *r, const char *dir, const struct kvb_state *cursors,
                    void (*barrier)(void *ctx, uint64_t worker_id, uint32_t dp_rank), void *ctx);

/* Shutdown: queued and later queries get 503 (nothing waits on the loop). */
void kvb_mirror_close(struct kvb_mirror *r);

#endif
