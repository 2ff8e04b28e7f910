/* sink_priv.h: what the parts of the NATS sink share (private to src/sink/).
 *
 * The sink is split along nats.c's own seams.  The files, each with the
 * files of the sink it calls (a DAG, sink.c at the top; `make lint` fails on
 * a cycle between files, mk/file-graph.sh):
 *
 *   sink.c       core: create/destroy, connecting (connect_once and the
 *                worker thread that replaces closed connections), nats.c's
 *                connection callbacks, publish, pending bytes, flush
 *                -> guard jetstream options io conn
 *   guard.c      a thread that abandons connection attempts whose
 *                handshake never completes (nats.c before 3.8 spins on
 *                them)                                    -> io conn
 *   jetstream.c  JetStream: the stream check, async publishes and their
 *                acks, the resend queues (like nats.c's js.c) -> conn
 *   options.c    natsOptions: servers, timeouts, reconnect, TLS and
 *                authentication                           -> guard conn
 *   io.c         nats.c's external event loop: the attach/read/write/detach
 *                adapter and the I/O thread (like nats.c's adapters:
 *                libevent.h, libuv.h)                     -> conn
 *   conn.c       what they all use: nats.c statuses as errno and text, the
 *                loop's wake-up, the metrics rule, the worker's kick, the
 *                reconnect backoff, threads and condition variables -> none
 *
 * Locks (none is held while taking another, except as noted):
 *   conn_mu  (sink.c)  conn, js (the pointers) and every nats.c call
 *            made through them from the loop thread or the worker.
 *   rb_mu + rb_cond (sink.c: the worker thread sleeps on it; conn.c's kick
 *            signals it)
 *            rb_stop, rb_needed; and, because the worker waits on the same
 *            condition for JetStream work, the JetStream queue state marked
 *            "rb_mu" below (taken by jetstream.c).  Never held across a nats.c
 *            call.
 *   ack_mu + ack_cond (jetstream.c)  only to wait for inflight to reach 0
 *            (kvb_sink_flush); inflight itself is atomic.
 *   order_mu (jetstream.c)  the per-pair order table and order_rl; taken
 *            by the loop, the worker and nats.c's ack thread, never held
 *            across a nats.c call (rb_mu may be held when it is taken).
 *   evl_mu + evl_cond (io.c)  evls, io_busy, io_stop.  Taken inside
 *            nats.c's connection lock (its event-loop callbacks), so never
 *            held while calling into nats.c.
 *   guard_mu + guard_cond (guard.c)  the guard thread's stop and kick
 *            flags; the guard takes evl_mu (kvb_sink_io_attached) without it.
 * Everything else is atomic, written once before the threads start, or
 * owned by one thread (said at the field).
 */
#ifndef KVB_SINK_PRIV_H
#define KVB_SINK_PRIV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <nats/nats.h>

#include "log.h"
#include "sink.h"

struct kvb_config;

#define STAGE "sink"

/* Per-attempt TCP connect + handshake timeout (nats.c's default). */
#define CONNECT_ATTEMPT_MS 2000
/* How long destroy waits for nats.c's closed callbacks. */
#define CLOSE_WAIT_MS 10000
/* Refusals logged by the worker thread: at most this many per interval. */
#define REFUSAL_LOG_MS 30000
#define REFUSAL_LOG_BURST 10

enum conn_state {
    ST_INIT = 0, /* never connected yet (nats.c trying, publishes buffered) */
    ST_CONNECTED,
    ST_DISCONNECTED, /* lost the server, nats.c is reconnecting */
    ST_CLOSED,       /* no connection: nats.c gave up (or the server refused us);
                      * the rebuild thread makes a new one */
};

/* A ring of messages (JetStream queues), each with its Nats-Msg-Id as
 * numbers ({worker_id}.{dp_rank}.{epoch}.{event_id}) where order matters. */
struct slot {
    natsMsg *m;
    uint64_t k[4];
};
struct ring {
    struct slot *v;
    size_t cap, head, len;
};

struct evl; /* io.c */

#define GUARD_MAX_PORTS 16
#define GUARD_MAX_BASE 32
#define GUARD_MAX_CAND 16

struct kvb_sink {
    /* ---- core (sink.c) ----
     * The connection: replaced by the rebuild thread, used by the loop
     * thread; conn_mu guards the pointer and every call made through it. */
    pthread_mutex_t conn_mu;
    natsConnection *conn;  /* NULL while closed and between connections */
    natsOptions *opts;     /* connect_once() and the rebuild thread only */
    struct kvb_metrics *m; /* may be NULL */
    int wake_fd;           /* -1: none */
    uint32_t flush_timeout_ms;
    uint32_t wait_ms;     /* first reconnect delay */
    uint32_t wait_max_ms; /* backoff ceiling */
    uint64_t full_bytes;  /* pending_bytes while closed: the buffer size */
    uint32_t rng;         /* xorshift32 state; nats.c's reconnect thread only */
    char *seed;           /* NKey seed, for sign_nonce() (options.c); zeroed at free */

    /* The rebuild thread ("the worker"), its wake-up and its own state. */
    pthread_mutex_t rb_mu;
    pthread_cond_t rb_cond; /* CLOCK_MONOTONIC */
    pthread_t rb_thread;
    bool rb_started;
    bool rb_stop;               /* rb_mu */
    bool rb_needed;             /* rb_mu: nats.c closed the connection */
    uint32_t rb_rng;            /* rebuild thread only */
    struct kvb_ratelimit rb_rl; /* rebuild thread only */
    struct kvb_ratelimit cb_rl; /* nats.c's callback thread only */

    _Atomic int state;             /* enum conn_state */
    atomic_bool live;              /* create succeeded, destroy not started:
                                   * callbacks count, log and wake only then */
    atomic_bool closing;           /* destroy is closing the connection */
    atomic_bool ever_connected;    /* a later connection is a reconnection */
    _Atomic unsigned conns;        /* connections made: each posts one ClosedCB */
    _Atomic unsigned closed_cbs;   /* ClosedCBs that have run to their end */
    _Atomic uint64_t outage_bytes; /* protocol bytes published while not connected */
    _Atomic uint64_t losses;       /* connections nats.c gave up with data buffered,
                                   * or router events the stream refused */
    /* lost_mu: the pairs of the router events given up since the loop last
     * took them (kvb_sink_take_lost_pairs()), or `lost_all` when a loss
     * names no pair (a core connection's buffer, an id-less message, more
     * pairs than lost holds).  Written before `losses` is counted. */
    pthread_mutex_t lost_mu;
    struct kvb_sink_pair lost[KVB_SINK_LOST_PAIRS];
    size_t n_lost;
    bool lost_all;

    /* ---- JetStream (jetstream.c; see the top of that file) ----
     * js belongs to conn: conn_mu guards both, the worker replaces both. */
    bool js_on;
    jsCtx *js;
    char *js_stream; /* resolved names (config.h) */
    char *js_subject;
    bool js_create;
    int js_retention; /* enum kvb_js_retention == jsRetentionPolicy */
    uint32_t js_max_age_s, js_replicas, js_dup_window_s;
    uint32_t js_max_pending;
    uint32_t js_ack_timeout_ms;
    jsPubOptions js_pubopts;         /* MaxWait = ack timeout; read-only after create */
    _Atomic uint64_t inflight;       /* published, not yet acknowledged nor given up */
    _Atomic uint64_t inflight_bytes; /* their cost (msg_cost()), at most js_byte_cap */
    uint64_t js_byte_cap;            /* reconnect_buffer_bytes (or nats.c's 8 MiB default) */
    bool win_full;                   /* loop thread: the window is (still) reported full */
    pthread_mutex_t ack_mu;          /* with ack_cond: kvb_sink_flush waits for inflight 0 */
    pthread_cond_t ack_cond;         /* CLOCK_MONOTONIC */
    _Atomic int ack_cbs;             /* on_ack() calls running */
    atomic_bool ack_ok;              /* a positive ack came since the last retry backoff */
    /* rb_mu: the queues (rings of our messages, grown on demand), when
     * they may be sent, and the stream check the worker owes. */
    struct ring rq; /* sent before, no positive ack: to send again */
    struct ring fq; /* published while ordered, never sent yet */
    /* order_mu: per (worker_id, dp_rank), the greatest (epoch, event_id)
     * handed to nats.c so far (jetstream.c, "Order"): a message is sent
     * again only while nothing later of its pair was. */
    pthread_mutex_t order_mu;
    struct order_slot {
        uint64_t k[4];     /* worker_id, dp_rank, epoch, event_id */
        uint64_t acked[4]; /* the greatest positively acknowledged (0: none) */
        bool used;
    } * order;
    _Atomic uint64_t js_ack_seq; /* the greatest stream sequence acknowledged */
    size_t order_cap, order_len;
    struct kvb_ratelimit order_rl; /* under order_mu */
    bool ordered;                  /* publishes queue up in fq (mirror: ordered_hint) */
    atomic_bool ordered_hint;
    bool recover_due;         /* reconnected: take back what js still waits for */
    bool reconcile_due;       /* the stream must be read back before resending
                               * (jetstream.c, "Order"); nothing is sent meanwhile */
    bool order_retry;         /* a resend out of order was found since the last
                               * read back: the next one is given up */
    bool sending;             /* the worker holds a message it took from a queue */
    bool probing;             /* JetStream answered "no responders"/"unavailable":
                              * send one message at a time until one is stored */
    _Atomic(natsMsg *) probe; /* that one, while it waits for its answer */
    uint64_t rq_not_before;   /* monotonic ms */
    uint32_t retry_ms;        /* next retry backoff (no responders, unavailable) */
    bool js_setup_due;
    uint64_t js_setup_after; /* monotonic ms */
    int js_setup_failures;
    struct kvb_ratelimit ack_rl; /* on_ack() only (one ack thread at a time) */
    /* Stalled: JetStream answered our publishes only with failures (no
     * responders, unavailable, timeouts) since the last positive ack.  Set
     * and cleared by on_ack() (atomic_exchange: one log line per change). */
    atomic_bool js_stalled;
    _Atomic uint64_t js_stall_since; /* monotonic ms */
    _Atomic uint64_t js_last_ack_ms; /* monotonic ms of the last positive ack */
    struct kvb_ratelimit stall_rl;   /* on_ack() only: "still stalled" */

    /* ---- I/O (io.c) ----
     * nats.c's socket reads, and the writes that the loop thread does not
     * do itself. */
    pthread_mutex_t evl_mu;
    pthread_cond_t evl_cond; /* io_busy went back to NULL */
    struct evl *evls;        /* evl_mu: one per connection ever attached */
    struct evl *io_busy;     /* evl_mu: the one the I/O thread is calling into */
    bool io_stop;            /* evl_mu */
    int io_wake;             /* eventfd */
    pthread_t io_thread;
    bool io_started;
    pthread_t owner;         /* the thread that created the sink (the loop) */
    atomic_bool defer;       /* kvb_sink_defer_writes() was called (owner set) */
    bool in_publish;         /* owner only: inside a publish call */
    atomic_bool owner_write; /* a write is left to kvb_sink_service() */

    /* Requests served on up to KVB_SINK_SERVE_MAX subjects (kvb_sink_serve()):
     * subscribed again on each new connection.  conn_mu guards all but
     * srv_live. */
    struct kvb_sink_served {
        char *subject; /* NULL: a free slot */
        kvb_sink_request_fn fn;
        void *closure;
        natsSubscription *sub;
    } srv[KVB_SINK_SERVE_MAX];
    _Atomic int srv_live; /* subscriptions whose callbacks may still run */

    /* ---- guard (guard.c) ----
     * guard_mu + guard_cond: guard_stop, guard_kicked.  The tables are the
     * guard thread's (written by create before it starts). */
    pthread_mutex_t guard_mu;
    pthread_cond_t guard_cond; /* CLOCK_MONOTONIC */
    pthread_t guard_thread;
    bool guard_init, guard_started;
    bool guard_stop, guard_kicked;
    uint32_t guard_limit_ms;               /* a handshake older than this is abandoned */
    uint16_t guard_ports[GUARD_MAX_PORTS]; /* the servers' ports */
    size_t n_guard_ports;
    ino_t guard_base[GUARD_MAX_BASE]; /* sockets there before the sink: not ours */
    size_t n_guard_base;
    struct guard_cand {
        ino_t ino;
        uint64_t since; /* monotonic ms: first seen */
        bool seen;
    } guard_cand[GUARD_MAX_CAND]; /* handshakes in progress (seen, not attached) */
    size_t n_guard_cand;
    atomic_bool guard_hurry; /* stopping: cut unanswered handshakes now */
    /* Monotonic ms from which this sink's connection attempt runs (or is due):
     * only a socket first seen since then can be its handshake.  GUARD_NONE
     * while connected.  Written by nats.c's threads and the worker through
     * kvb_sink_guard_attempt/_lost/_connected, read by the guard. */
    _Atomic uint64_t guard_from;
    _Atomic int guard_sigfd;         /* the loop's signalfd (-1: none), polled, never read */
    _Atomic uint64_t stalls;         /* attempts abandoned */
    _Atomic uint64_t stalls_counted; /* of them, added to nats_connect_stalls_total */
    struct kvb_ratelimit guard_rl;
};

/* ---- conn.c: what every part uses ---- */

void kvb_sink_sleep_ms(unsigned ms);
/* nats.c's last error for this thread without its "(file.c:123): " prefix,
 * or the status text. */
void kvb_sink_last_error(natsStatus st, char *out, size_t cap);
/* A negative errno for a nats.c status. */
int kvb_sink_errno(natsStatus st);
/* Write a byte to the loop's wake fd (only while live). */
void kvb_sink_wake(struct kvb_sink *s);
/* A loss of pair p's router events (NULL: of no one pair), for
 * kvb_sink_take_lost_pairs(); before `losses` is counted.  Any thread. */
void kvb_sink_lost(struct kvb_sink *s, const struct kvb_sink_pair *p);
/* The sink may write metrics (see "Metrics rule" in conn.c). */
bool kvb_sink_owns_metrics(const struct kvb_sink *s);
/* Signal the worker (rb_cond). */
void kvb_sink_kick_worker(struct kvb_sink *s);
/* Reconnect backoff after the ATTEMPTS-th failed pass (RNG: the caller's
 * xorshift32 state). */
uint64_t kvb_sink_backoff_ms(const struct kvb_sink *s, int attempts, uint32_t *rng);
/* A condition variable on CLOCK_MONOTONIC: 0 or a negative errno. */
int kvb_sink_cond_init(pthread_cond_t *c);
/* A thread of the sink, every signal blocked in it: 0 or a negative errno. */
int kvb_sink_thread_start(pthread_t *t, void *(*fn)(void *), void *arg);

/* ---- options.c ---- */

/* Everything create sets on s->opts except the callbacks and the event loop:
 * servers, name, timeouts, reconnect, buffer, authentication and TLS.  Logs
 * what it refuses. */
natsStatus kvb_sink_set_options(struct kvb_sink *s, const struct kvb_config *cfg);

/* ---- io.c ---- */

/* Make the wake eventfd, start the I/O thread (logs a failure). */
int kvb_sink_io_start(struct kvb_sink *s);
/* Stop the I/O thread, free every evl, close the eventfd (any state). */
void kvb_sink_io_stop(struct kvb_sink *s);
/* natsOptions_SetEventLoop (and SendAsap) with this file's adapter. */
natsStatus kvb_sink_io_options(struct kvb_sink *s, natsOptions *o);
/* Before natsConnection_Destroy(nc): the I/O thread leaves it alone from now
 * on (waits for a call into it in progress).  Not with nats.c's lock held. */
void kvb_sink_io_forget(struct kvb_sink *s, const natsConnection *nc);

/* The inodes of the sockets attached now (at most MAX); returns the count. */
size_t kvb_sink_io_attached(struct kvb_sink *s, ino_t *out, size_t max);

/* ---- guard.c ---- */

/* create, before the first connect: note the sockets already there, start
 * the guard thread (logs a failure).  0 or a negative errno. */
int kvb_sink_guard_start(struct kvb_sink *s, const struct kvb_config *cfg);
/* The state left ST_CONNECTED: look for stuck handshakes. */
void kvb_sink_guard_kick(struct kvb_sink *s);
/* destroy, or the daemon's stop: stop waiting for handshakes that do not
 * answer (any state). */
void kvb_sink_guard_hurry(struct kvb_sink *s);
/* Add the attempts abandoned so far to the metric (once the sink is live). */
void kvb_sink_guard_count(struct kvb_sink *s);
/* Stop the thread (after the last connection is destroyed); any state. */
void kvb_sink_guard_stop(struct kvb_sink *s);
/* A connection attempt of the sink starts at AT_MS (monotonic; now, or when
 * nats.c's reconnect delay ends): the sockets that appear from then on may be
 * its handshakes (any thread). */
#define GUARD_NONE UINT64_MAX
void kvb_sink_guard_attempt(struct kvb_sink *s, uint64_t at_ms);
/* The connection is lost: nats.c attempts from now on, unless an attempt
 * is scheduled already (nats.c's callback thread). */
void kvb_sink_guard_lost(struct kvb_sink *s);
/* Connected: no attempt in progress, no socket that appears is a handshake. */
void kvb_sink_guard_connected(struct kvb_sink *s);

/* ---- jetstream.c ---- */

/* create: copy the nats.jetstream settings.  0, -EINVAL, -ENOMEM. */
int kvb_sink_js_init(struct kvb_sink *s, const struct kvb_config *cfg);
/* create: a context for s->conn, then the stream check (see the file). */
int kvb_sink_js_start(struct kvb_sink *s, uint64_t deadline, uint32_t timeout_ms);
/* A new JetStream context for NC (any state). */
natsStatus kvb_sink_js_new(struct kvb_sink *s, natsConnection *nc, jsCtx **out);
/* Worker: take back what JS still waits an ack for, and (connected) read
 * back what the stream stored of them.  False when connected but the stream
 * could not be read back (everything waits in the resend queue). */
bool kvb_sink_js_recover(struct kvb_sink *s, jsCtx *js, const char *why);
/* rb_mu held: JetStream work due now (*at: when some will be). */
bool kvb_sink_js_due(struct kvb_sink *s, uint64_t now, uint64_t *at);
/* rb_mu held (released around nats.c calls): do that work. */
void kvb_sink_js_work(struct kvb_sink *s);
/* nats.c's callbacks and the worker tell the JetStream part: the connection
 * went away (publishes queue up), came back (take back what had no ack), or
 * was replaced (check the stream again). */
void kvb_sink_js_disconnected(struct kvb_sink *s);
void kvb_sink_js_reconnected(struct kvb_sink *s);
void kvb_sink_js_new_conn(struct kvb_sink *s);
/* The loop's publish, flush and pending bytes in JetStream mode. */
int kvb_sink_js_publish(struct kvb_sink *s, const char *subject, const void *data, size_t len,
                        const char *msg_id);
int kvb_sink_js_flush(struct kvb_sink *s, uint32_t timeout_ms);
uint64_t kvb_sink_js_window(struct kvb_sink *s, uint64_t n);
/* destroy: drop the context and wait for a running ack callback; false when
 * one never ends (the sink must then be leaked). */
bool kvb_sink_js_close(struct kvb_sink *s);
/* Free the queues and names (after every thread is gone). */
void kvb_sink_js_free(struct kvb_sink *s);

#endif
