/* daemon_priv.h: the daemon's state and the steps of its life, shared by
 * the files of src/daemon/ (not outside it):
 *   loop.c    kvb_daemon_run(): start, turns until stopped, stop
 *   start.c   everything built in order, each failure with its exit code
 *   turn.c    one turn of the loop: poll, read, tick, flush, gauges
 *   reload.c  SIGHUP: a new configuration, committed whole or not at all
 *   stop.c    the drain at shutdown, and freeing everything
 *   follow.c  the sources an engine lists (sources[].discover): the list read,
 *             its ranks opened, replaced when their endpoints change
 *   sources.c the sources a configuration asks for (the steps above share it)
 *   save.c    the cursors (and the mirror) saved to state.dir, loaded at start
 *   repair.c  losses on the NATS side repaired from the residency mirror
 * The calls between these files run one way: loop.c -> start/turn/reload/
 * stop -> follow -> sources/save/repair (make lint-graph).
 * The loop thread owns all of it.  The data path is not the daemon's: a
 * turn reads the sources, whose batches go through the rules, the pipeline
 * and the publish stage to the sink.
 */
#ifndef KVB_DAEMON_PRIV_H
#define KVB_DAEMON_PRIV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <zmq.h>

#include "config.h"
#include "log.h"
#include "metrics.h"

#define READ_BUDGET 256     /* live messages per source per turn: fairness */
#define HEARTBEAT_MS 1000   /* the loop turns at least this often (healthz, watchdog) */
#define PAUSED_POLL_MS 20   /* re-check the NATS buffer this often while paused */
#define STATE_SAVE_MS 1000  /* state.dir: save at most this often (and at shutdown) */
#define READY_GRACE_MS 1000 /* held back or paused longer than this: not ready */
#define TRIM_CALM_MS 2000   /* a backlog gone this long: give its memory back */

struct kvb_zap;
struct kvb_pipeline;
struct kvb_sink;
struct kvb_publish;
struct kvb_discovery;
struct kvb_http;
struct kvb_mirror;
struct kvb_recovery;
struct kvb_engines;
struct kvb_stats;
struct kvb_state;
struct kvb_source;
struct kvb_worker_cfg;
struct kvb_srclist;
struct kvb_srclist_list;
struct kvb_srclist_entry;

/* Where a running source comes from: its sources[] entry (in the config
 * that built it) and its offset in that entry's dp_size expansion.  A reload
 * keeps a source whose entry did not change, as nginx keeps a listener. */
struct src_origin {
    const struct kvb_source_cfg *sc;
    uint32_t r;
};

/* The poll items of a turn, by name: the fixed ones, then per source i the
 * three at kvb_daemon_src_item(items, i, kind). */
enum kvb_daemon_poll {
    KVB_POLL_SIGNAL,  /* the signalfd */
    KVB_POLL_WAKE,    /* the eventfd nats.c's callbacks and the query hub write */
    KVB_POLL_ZAP,     /* the ZAP handler's socket */
    KVB_POLL_ENGINES, /* the engines' scrape results */
    KVB_POLL_LISTS,   /* the engines' lists of their sources (sources[].discover) */
    KVB_POLL__FIXED
};
enum kvb_daemon_src_poll {
    KVB_POLL_SUB,     /* live batches */
    KVB_POLL_REPLAY,  /* replay replies (while a replay runs) */
    KVB_POLL_MONITOR, /* the SUB's connection events */
    KVB_POLL__PER_SOURCE
};

/* A sources[] entry with discover: its engine's list and what became of
 * it (follow.c).  Its ranks are the slots first .. first + dp_size - 1 of
 * d->src, NULL while not open. */
struct follow {
    const struct kvb_source_cfg *sc; /* in d->cfg */
    size_t first;
    struct kvb_srclist_list *list; /* the last list read; NULL: none yet (not ready) */
    bool asked;                    /* a read is under way */
    bool *opened;                  /* per rank: opened since this state was made (once:
                                    * from d->resume; later: a new stream) */
    bool *failed;                  /* per rank: its listed endpoint did not open (until
                                    * the next list) */
    uint64_t next_ms;              /* while a rank is down: no read asked before */
    uint32_t backoff_ms;
    uint64_t live_seen; /* kvb_engines_liveness_changes() already acted on */
    uint64_t fails;     /* reads failed in a row */
    struct kvb_ratelimit rl;
};

struct kvb_daemon {
    struct kvb_config *cfg;
    struct kvb_metrics m;
    void *zctx;
    struct kvb_zap *zap; /* CURVE clients of bind-mode sources (zap.h) */
    struct kvb_pipeline *pipe;
    struct kvb_sink *sink;
    struct kvb_publish *out;    /* the publish stage: nats.format (publish.h) */
    struct kvb_discovery *disc; /* discovery.etcd: EventSource records; NULL when off */
    bool held_back;             /* discovery: a pair is not registered yet: do not read */
    struct kvb_http *http;
    struct kvb_mirror *res;    /* the residency mirror and its queries */
    struct kvb_recovery *rec;  /* discovery.recovery: Dynamo's recovery query; NULL when off */
    struct kvb_engines *eng;   /* sources[].engine: load and liveness (engine.h) */
    struct kvb_srclist *lists; /* sources[].discover: the engines' lists (srclist.h) */
    struct follow *fl;         /* one per entry with discover */
    size_t n_fl;
    struct kvb_stats *stats; /* log.stats_interval_s (stats.h) */
    uint64_t heartbeat_ms;   /* loop wake-up period */
    uint64_t watchdog_ms;    /* WATCHDOG=1 period (0: no systemd watchdog) */
    uint64_t last_watchdog;
    bool paused;              /* backpressure: NATS buffer too full to read more */
    uint64_t paused_since;    /* ... since then (CLOCK_MONOTONIC ms), 0: not paused */
    uint64_t held_since;      /* live batches held back behind replays since, 0: none */
    uint64_t hold_since;      /* monotonic ms: holding back (paused or discovery) since */
    bool trim_due;            /* a backlog was queued: trim once it is gone */
    uint64_t calm_since;      /* ... and nothing has been queued up since (0: not yet) */
    bool barrier_due;         /* router events were lost on the NATS side */
    uint64_t losses_seen;     /* kvb_sink_losses() already answered with a barrier */
    bool lost_all;            /* barrier_due: a loss that names no pair (publish stage) */
    bool resync_due;          /* nats.resync_on_reconnect: a reconnection to answer */
    uint64_t reconnects_seen; /* nats_reconnects_total already answered */
    int64_t repair_tokens;    /* repair.c: bytes repairs may publish now */
    uint64_t repair_at;       /* ... as of this time (monotonic ms; 0: never) */
    struct kvb_ratelimit repair_rl;
    struct kvb_state *resume; /* what the sources start from (state.dir, reload) */
    uint64_t last_save_ms, saved_batches;
    bool save_failing; /* state.dir: the last save failed */
    uint64_t save_fail_since, save_fails;
    struct kvb_ratelimit save_rl;
    struct kvb_source **src;
    struct src_origin *src_from; /* parallel to src: the entry each came from */
    size_t n_src;
    zmq_pollitem_t *items; /* the poll set (turn.c), room for cap_items */
    size_t cap_items;
    int sigfd, wakefd;
    bool stop;
    bool failed; /* stopping because of an error: exit 1 */
};

/* ---- start.c ------------------------------------------------------------ */

/* Build everything d->cfg asks for and tell systemd READY=1.  0, or the
 * process exit code to stop with (docs/configuration.md section 4). */
int kvb_daemon_start(struct kvb_daemon *d);

/* ---- turn.c ------------------------------------------------------------- */

/* One turn: poll (blocking until something happens or a deadline), then
 * the signals, the wake fd, the sources, the engines, the flush, the NATS
 * loss barriers, the gauges and the state save.  0, or a negative errno
 * when the poll itself fails. */
int kvb_daemon_turn(struct kvb_daemon *d);
/* Read the wake eventfd empty. */
void kvb_daemon_drain_wake(struct kvb_daemon *d);

/* ---- reload.c ----------------------------------------------------------- */

/* SIGHUP: load the file again; everything changes or nothing does. */
void kvb_daemon_reload(struct kvb_daemon *d);

/* ---- stop.c ------------------------------------------------------------- */

/* Stop reading, flush what was read (waiting for NATS at most
 * nats.flush_timeout_ms), save the cursors.  Returns the exit code. */
int kvb_daemon_stop(struct kvb_daemon *d);
/* Free everything (a half-built daemon too) and d itself. */
void kvb_daemon_free(struct kvb_daemon *d);

/* ---- follow.c ----------------------------------------------------------- */

/* The entries of d->cfg with discover, their lists asked for (d->src
 * built).  0 or a negative errno. */
int kvb_daemon_follow_start(struct kvb_daemon *d);
/* After a reload's commit (d->cfg and d->src are the new ones): the same,
 * an entry whose engine is unchanged keeping its list.  Cannot fail the
 * reload: on an error the lists are not read (logged). */
void kvb_daemon_follow_reload(struct kvb_daemon *d);
/* A turn's part, once nothing else uses the poll set: the lists read
 * (LISTS: its fd polled readable), every rank opened on, or moved to, its
 * listed endpoint, the lists asked for again where a rank is down. */
void kvb_daemon_follow_turn(struct kvb_daemon *d, bool lists, uint64_t now_ms);
/* Milliseconds until kvb_daemon_follow_turn() wants to ask again, or -1. */
long kvb_daemon_follow_deadline(const struct kvb_daemon *d, uint64_t now_ms);
void kvb_daemon_follow_stop(struct kvb_daemon *d);

/* ---- sources.c ---------------------------------------------------------- */

/* The worker a sources[] entry's router events are for (several engines may share one kvbridge). */
struct kvb_worker_cfg kvb_daemon_worker_of(const struct kvb_source_cfg *sc);
/* WORKER_ID is one that configuration C publishes for. */
bool kvb_daemon_configured_worker(const struct kvb_config *c, uint64_t worker_id);
/* Open source r of entry sc of configuration c (not for an entry with
 * discover: see kvb_daemon_open_listed()). */
int kvb_daemon_open_source(struct kvb_daemon *d, const struct kvb_config *c,
                           const struct kvb_source_cfg *sc, uint32_t r, struct kvb_source **out);
/* Open rank r of entry sc (discover, in d->cfg) on the endpoints its
 * engine lists in E; from d->resume when RESUME. */
int kvb_daemon_open_listed(struct kvb_daemon *d, const struct kvb_source_cfg *sc, uint32_t r,
                           const struct kvb_srclist_entry *e, bool resume, struct kvb_source **out);
/* Close every non-NULL source of v[0..n) and free the arrays. */
void kvb_daemon_destroy_sources(struct kvb_source ***v, struct src_origin **from, size_t *n);
/* The sources of configuration c, into fresh arrays.  With `reuse`, a source
 * whose entry is unchanged is moved over from the running ones (d->src[k]
 * becomes NULL, lent[i] = k + 1, so that kvb_daemon_lend_back() can undo
 * it); the others are opened, but for entries with discover (NULL: follow.c
 * opens them from the engine's list).  On failure everything this call opened is
 * closed and every moved source is given back. */
int kvb_daemon_build_sources(struct kvb_daemon *d, const struct kvb_config *c, bool reuse,
                             struct kvb_source ***out, struct src_origin **from_out, size_t *n_out,
                             size_t **lent_out);
void kvb_daemon_lend_back(struct kvb_daemon *d, struct kvb_source **v, const size_t *lent,
                          size_t n);
/* ActiveLoad messages (engine.h): core NATS, whatever the router events use. */
int kvb_daemon_publish_load(void *ctx, const char *subject, const void *data, size_t len);

/* ---- repair.c: losses on the NATS side ----------------------------------- */

/* Router events of (worker_id, dp_rank) were lost on the NATS side (cause:
 * KVB_BAR_NATS_LOST, or KVB_BAR_NATS_RECONNECT for a reconnection with
 * nats.resync_on_reconnect): the pair's "cleared" now and, with the mirror
 * on, its resident blocks after it over the next turns
 * (kvb_daemon_repair_step()), so that a consumer ends with the engine's
 * view.  Any part of the daemon may call it for a pair whose events it knows
 * were lost.  1 (published), 0, or a negative errno. */
int kvb_daemon_repair_pair(struct kvb_daemon *d, uint64_t worker_id, uint32_t dp_rank, int cause);
/* The same for every pair of every stream that applied a batch. */
void kvb_daemon_repair_all(struct kvb_daemon *d, int cause);
/* Publish what the repairs still owe, within their pace (each turn). */
void kvb_daemon_repair_step(struct kvb_daemon *d, uint64_t now);
/* Milliseconds until the next step can publish something, or -1 (nothing
 * owed, or waiting for NATS, which wakes the loop). */
long kvb_daemon_repair_wait(struct kvb_daemon *d, uint64_t now);

/* ---- save.c: state (state.dir) ------------------------------------------ */

/* Everything the pipeline has applied so far: counters and stream cursors,
 * and with `tracker` the block tracker (for a save; a reload that reopens
 * sources keeps the running tracker and needs only the cursors). */
struct kvb_state *kvb_daemon_snapshot(struct kvb_daemon *d, bool tracker);
/* Save the cursors (at most every STATE_SAVE_MS unless force), once NATS
 * confirmed everything published so far. */
void kvb_daemon_save_state(struct kvb_daemon *d, bool force);
/* The saver thread's outcome, once it is known. */
void kvb_daemon_save_done(struct kvb_daemon *d);
/* state.dir: the saved cursors and event_id counters, into d->resume and
 * the converter. */
int kvb_daemon_load_state(struct kvb_daemon *d);
/* A pair the saved mirror cannot vouch for: "cleared" (kvb_mirror_load). */
void kvb_daemon_mirror_barrier(void *ctx, uint64_t worker_id, uint32_t dp_rank);

#endif
