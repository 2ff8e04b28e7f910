/* sink: router events out to NATS through nats.c (core publish).
 * See include/sink.h for the contract.
 *
 * nats.c facts this file relies on (checked against nats.c 3.4):
 * - With natsOptions_SetRetryOnFailedConnect(true, connectedCb, ...) a failed
 *   first connect makes natsConnection_Connect() return NATS_NOT_YET_CONNECTED
 *   with a usable connection: its reconnect thread keeps trying (using the
 *   reconnect delay settings) and publishes go to the reconnect buffer.
 *   connectedCb fires once when it gets through; it does NOT fire when
 *   Connect itself succeeds.
 * - All connection callbacks run, in order, on nats.c's single async-callback
 *   thread, possibly after natsConnection_Close()/Destroy() have returned.
 *   ClosedCB is the last one a connection posts, so destroy waits for it before
 *   freeing the sink that the callbacks point to.
 * - The reconnect delay callback runs on the connection's reconnect thread,
 *   which natsConnection_Close() joins.
 * - The reconnect buffer limit is checked before each append (the buffer may
 *   overshoot by one message); when reached, publish returns
 *   NATS_INSUFFICIENT_BUFFER.  natsConnection_Buffered() only reports the
 *   socket write buffer, not the reconnect buffer.
 * - Its own I/O threads (a reader, and a flusher that sends the write buffer
 *   about 1 ms after the first publish that needs it) are replaced by an
 *   "external event loop" (natsOptions_SetEventLoop): nats.c then makes the
 *   socket non-blocking after the handshake, asks through callbacks for
 *   read and write readiness (attach/read/write/detach, from whatever thread
 *   it is on, holding its connection lock), and reads or writes only when
 *   natsConnection_ProcessReadEvent/ProcessWriteEvent is called.  With
 *   SendAsap, every publish asks for write readiness (the write callback,
 *   once until the buffer is sent); without it nothing would send a small
 *   publish.  During a reconnect nats.c stops polling (read and write
 *   "remove"), uses blocking I/O on the new socket for the handshake, then
 *   attaches it.  Its locks are recursive.
 * - nats_Open() (run implicitly by the first options/connection call) sets
 *   SIGPIPE to SIG_IGN for the whole process.
 * - With one server, the first reconnect attempt after a disconnect already
 *   waits one reconnect delay (attempts = 1).
 *
 * Servers that refuse us (checked against nats.c 3.4.1 and nats-server 2.9):
 * - nats.c never retries a rejection forever.  A first connect with
 *   RetryOnFailedConnect that reaches a server which rejects it (bad
 *   credentials, TLS handshake failure, -ERR) returns NATS_NOT_YET_CONNECTED,
 *   then closes the connection at once (ClosedCB, last error "No server
 *   available for connection": the cause is lost).  In its reconnect loop (a
 *   server that was down at start, or lost later), the same authentication
 *   error twice in a row from a server makes it close the connection too
 *   (ClosedCB with the cause; the reconnect buffer is dropped).
 * - A plain Connect (no RetryOnFailedConnect) returns the cause:
 *   NATS_CONNECTION_AUTH_FAILED ("Authorization Violation"), NATS_SSL_ERROR
 *   ("SSL handshake error: ..."), NATS_PROTOCOL_ERROR when the server hangs up
 *   during the handshake (no client certificate), and NATS_NO_SERVER for
 *   everything that is merely unreachable (refused, timeout, DNS).
 * Hence connect_once(): a plain Connect first, which tells "rejected (why)"
 * from "unreachable"; only for the latter a second Connect with
 *   RetryOnFailedConnect, so that publishes are buffered while nats.c keeps
 *   trying.  A rejection at create fails it with -EACCES when
 *   nats.connect_timeout_ms > 0.  Otherwise, and whenever nats.c closes the
 *   connection later, the sink's own thread (rebuild_main) makes a new
 *   connection with the reconnect backoff, logging each refusal
 *   (rate-limited).  While it has no connection the sink is "closed":
 *   publish returns -EAGAIN and pending_bytes reports the buffer as full, so
 *   that the loop stops reading the engines (as when nats.c's buffer fills)
 *   instead of losing events.
 *
 * Authentication (config.h: at most one method): user + password
 * (natsOptions_SetUserInfo), token (SetToken), NKey (SetNKey with the public
 * key the config derived from the seed, and a callback signing the server's
 * nonce with nats_Sign(seed): the seed stays in this process's memory, never
 * in a file; natsOptions_SetNKeyFromSeed would need it in a file), .creds
 * file (SetUserCredentialsFromFiles).  TLS: SetSecure, the CA file (else
 * OpenSSL's default trust store), the client chain, SkipServerVerification
 * when verify is off, SetExpectedHostname.  nats.c keeps its own copies of
 * the password and token and frees them without zeroing.
 *
 * JetStream (nats.jetstream.enabled; facts checked against nats.c 3.4.1 and
 * nats-server 2.9):
 * - js_PublishMsgAsync registers the message in the context's pending map
 *   (and, with jsPubOptions.MaxWait, a deadline) before writing it; its
 *   AckHandler then gets every message back exactly once, on the reply
 *   subscription's own thread: with a jsPubAck, or a jsPubAckErr (NATS_TIMEOUT
 *   once MaxWait passed, NATS_NO_RESPONDERS when no stream leader took it,
 *   NATS_ERR with a JetStream error code).  The handler owns the message.
 *   js_PublishAsyncGetPendingList takes every registered message back instead
 *   (their acks are then ignored).  With MaxPending, a publish beyond it waits
 *   up to StallWait and fails with NATS_TIMEOUT.  jsCtx_Destroy drops the
 *   reply subscription, the messages still registered and the timer; an
 *   AckHandler already running finishes (nats.c calls it without its lock).
 * - The stream's duplicate window drops a message whose Nats-Msg-Id it stored
 *   within the window, and acks it with "duplicate": a resend is harmless.
 *   A stream that restarts from its store rebuilds that window.
 * - Lookups: js_GetStreamInfo answers NATS_NOT_FOUND (error 10059) for a
 *   missing stream and NATS_NO_RESPONDERS (10076) when JetStream is not
 *   enabled (or not ready); js_AddStream of replicas > 1 on a single server
 *   fails with a JetStream error.
 * How this file uses them:
 * - In flight ("inflight", and its estimated size "inflight_bytes"): every
 *   message from its publish until a positive ack or until it is given up,
 *   wherever it is (nats.c, the handler, the queues below).  From 3/4 of
 *   max_pending (or of reconnect_buffer_bytes) pending_bytes reports "full"
 *   until both are down to 1/2, so the loop pauses; a publish is refused
 *   (-EAGAIN) only when the bytes would pass reconnect_buffer_bytes: the
 *   loop may still hand over all the events of what it had read (a replay
 *   reply of thousands of batches comes in one turn), as nats.c's buffer
 *   takes them in core mode.  nats.c's own MaxPending is off (it would
 *   stall the loop).
 * - Failures are not sent again from the handler (it runs on nats.c's
 *   thread, the window may be full, the connection may be away or about to be
 *   replaced, and a "no responders" would come straight back): the handler
 *   puts the message in the resend queue (rq, kept in Nats-Msg-Id order) and
 *   wakes the worker (the rebuild thread), which sends it again once
 *   connected, after a growing pause when JetStream did not answer.
 * - Order: while rq is not empty, or the connection is away, or a lost
 *   connection's messages are being taken back, the sink is "ordered": new
 *   publishes queue up in fq behind them, and the worker sends rq first, then
 *   fq; the loop publishes directly again once the worker has sent both and
 *   is not probing.
 *   After "no responders" / "unavailable" the worker probes with one message
 *   at a time until one is stored (a leader election would otherwise let later
 *   events in before earlier ones).  On a reconnection the worker takes back
 *   what has no ack (what was in flight when the server went), and when nats.c
 *   closes a connection it takes back all of it before the context goes, so
 *   nothing waits for an ack timeout that a dead connection cannot deliver.
 *   What can still land out of order: a message whose ack timed out while
 *   later ones were stored (the few sent in the instant a connection broke).
 */
#include "sink.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <poll.h>
#include <sys/eventfd.h>

#include <nats/nats.h>

#include "clock.h"
#include "config.h"
#include "log.h"
#include "metrics.h"

#define STAGE "sink"

/* Per-attempt TCP connect + handshake timeout (nats.c's default). */
#define CONNECT_ATTEMPT_MS 2000
/* How long destroy waits for nats.c's closed callbacks. */
#define CLOSE_WAIT_MS 10000
/* Refusals logged by the rebuild thread: at most this many per interval. */
#define REFUSAL_LOG_MS 30000
#define REFUSAL_LOG_BURST 10

enum conn_state {
    ST_INIT = 0,     /* never connected yet (nats.c trying, publishes buffered) */
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

struct kvb_sink {
    /* The connection: replaced by the rebuild thread, used by the loop
     * thread; conn_mu guards the pointer and every call made through it. */
    pthread_mutex_t conn_mu;
    natsConnection *conn;    /* NULL while closed and between connections */
    natsOptions *opts;       /* connect_once() and the rebuild thread only */
    struct kvb_metrics *m;   /* may be NULL */
    int wake_fd;             /* -1: none */
    uint32_t flush_timeout_ms;
    uint32_t wait_ms;        /* first reconnect delay */
    uint32_t wait_max_ms;    /* backoff ceiling */
    uint64_t full_bytes;     /* pending_bytes while closed: the buffer size */
    uint32_t rng;            /* xorshift32 state; nats.c's reconnect thread only */
    char *seed;              /* NKey seed, for sign_nonce(); zeroed at free */

    /* The rebuild thread, its wake-up and its own state. */
    pthread_mutex_t rb_mu;
    pthread_cond_t rb_cond;  /* CLOCK_MONOTONIC */
    pthread_t rb_thread;
    bool rb_started;
    bool rb_stop;            /* rb_mu */
    bool rb_needed;          /* rb_mu: nats.c closed the connection */
    uint32_t rb_rng;         /* rebuild thread only */
    struct kvb_ratelimit rb_rl; /* rebuild thread only */
    struct kvb_ratelimit cb_rl; /* nats.c's callback thread only */

    _Atomic int state;            /* enum conn_state */
    atomic_bool live;             /* create succeeded, destroy not started:
                                   * callbacks count, log and wake only then */
    atomic_bool closing;          /* destroy is closing the connection */
    atomic_bool ever_connected;   /* a later connection is a reconnection */
    _Atomic unsigned conns;       /* connections made: each posts one ClosedCB */
    _Atomic unsigned closed_cbs;  /* ClosedCBs that have run to their end */
    _Atomic uint64_t outage_bytes; /* protocol bytes published while not connected */
    _Atomic uint64_t losses;      /* connections nats.c gave up with data buffered,
                                   * or router events the stream refused */

    /* JetStream (see "JetStream" at the top of this file).  js belongs to
     * conn: conn_mu guards both, the worker (rebuild thread) replaces both. */
    bool js_on;
    jsCtx *js;
    char *js_stream;         /* resolved names (config.h) */
    char *js_subject;
    bool js_create;
    int js_retention;        /* enum kvb_js_retention == jsRetentionPolicy */
    uint32_t js_max_age_s, js_replicas, js_dup_window_s;
    uint32_t js_max_pending;
    uint32_t js_ack_timeout_ms;
    jsPubOptions js_pubopts; /* MaxWait = ack timeout; read-only after create */
    _Atomic uint64_t inflight; /* published, not yet acknowledged nor given up */
    _Atomic uint64_t inflight_bytes; /* their cost (msg_cost()), at most js_byte_cap */
    uint64_t js_byte_cap;    /* reconnect_buffer_bytes (or nats.c's 8 MiB default) */
    bool win_full;           /* loop thread: the window is (still) reported full */
    pthread_mutex_t ack_mu;  /* with ack_cond: kvb_sink_flush waits for inflight 0 */
    pthread_cond_t ack_cond; /* CLOCK_MONOTONIC */
    _Atomic int ack_cbs;     /* on_ack() calls running */
    atomic_bool ack_ok;      /* a positive ack came since the last retry backoff */
    /* rb_mu: the queues (rings of our messages, grown on demand), when
     * they may be sent, and the stream check the worker owes.  See "order"
     * at the top of this file. */
    struct ring rq;          /* sent before, no positive ack: to send again */
    struct ring fq;          /* published while ordered, never sent yet */
    bool ordered;            /* publishes queue up in fq (mirror: ordered_hint) */
    atomic_bool ordered_hint;
    bool recover_due;        /* reconnected: take back what js still waits for */
    bool sending;            /* the worker holds a message it took from a queue */
    bool probing;            /* JetStream answered "no responders"/"unavailable":
                              * send one message at a time until one is stored */
    _Atomic(natsMsg *) probe; /* that one, while it waits for its answer */
    uint64_t rq_not_before;  /* monotonic ms */
    uint32_t retry_ms;       /* next retry backoff (no responders, unavailable) */
    bool js_setup_due;
    uint64_t js_setup_after; /* monotonic ms */
    int js_setup_failures;
    struct kvb_ratelimit ack_rl; /* on_ack() only (one ack thread at a time) */

    /* The I/O thread (see "I/O" below): nats.c's socket reads, and the
     * writes that the loop thread does not do itself. */
    pthread_mutex_t evl_mu;
    pthread_cond_t evl_cond;   /* io_busy went back to NULL */
    struct evl *evls;          /* evl_mu: one per connection ever attached */
    struct evl *io_busy;       /* evl_mu: the one the I/O thread is calling into */
    bool io_stop;              /* evl_mu */
    int io_wake;               /* eventfd */
    pthread_t io_thread;
    bool io_started;
    pthread_t owner;           /* the thread that created the sink (the loop) */
    atomic_bool defer;         /* kvb_sink_defer_writes() was called (owner set) */
    bool in_publish;           /* owner only: inside a publish call */
    atomic_bool owner_write;   /* a write is left to kvb_sink_service() */

    /* Requests served on one subject (kvb_sink_serve()): subscribed again on
     * each new connection.  conn_mu guards all but srv_live. */
    char *srv_subject;         /* NULL: not serving */
    kvb_sink_request_fn srv_fn;
    void *srv_closure;
    natsSubscription *srv_sub;
    _Atomic int srv_live;      /* subscriptions whose callbacks may still run */
};

/* ---- subject templates ---- */

static int put(char *out, size_t cap, size_t *len, const char *s, size_t n)
{
    if (*len + n >= cap) /* keep room for the NUL */
        return -ENAMETOOLONG;
    if (out)
        memcpy(out + *len, s, n);
    *len += n;
    return 0;
}

/* One pass over the template; out == NULL only measures and validates. */
static int expand(const char *tmpl, const char *ns, const char *component,
                  uint64_t worker_id, uint32_t dp_rank, char *out, size_t cap)
{
    char num[24];
    size_t len = 0;
    const char *p = tmpl;
    int rc;

    while (*p) {
        const char *open = strchr(p, '{');
        if (!open) {
            rc = put(out, cap, &len, p, strlen(p));
            if (rc < 0)
                return rc;
            break;
        }
        rc = put(out, cap, &len, p, (size_t)(open - p));
        if (rc < 0)
            return rc;
        const char *close = strchr(open, '}');
        if (!close)
            return -EINVAL;
        size_t nlen = (size_t)(close - open - 1);
        const char *name = open + 1;
        const char *val;
        if (nlen == 9 && memcmp(name, "namespace", 9) == 0) {
            val = ns;
        } else if (nlen == 9 && memcmp(name, "component", 9) == 0) {
            val = component;
        } else if (nlen == 9 && memcmp(name, "worker_id", 9) == 0) {
            snprintf(num, sizeof(num), "%" PRIu64, worker_id);
            val = num;
        } else if (nlen == 7 && memcmp(name, "dp_rank", 7) == 0) {
            snprintf(num, sizeof(num), "%" PRIu32, dp_rank);
            val = num;
        } else {
            return -EINVAL;
        }
        rc = put(out, cap, &len, val, strlen(val));
        if (rc < 0)
            return rc;
        p = close + 1;
    }
    if (len > INT_MAX)
        return -ENAMETOOLONG;
    if (out)
        out[len] = '\0';
    return (int)len;
}

int kvb_subject_expand(const char *tmpl, const char *ns, const char *component,
                       uint64_t worker_id, uint32_t dp_rank, char *out, size_t cap)
{
    if (!tmpl || !ns || !component || (!out && cap))
        return -EINVAL;
    /* Measure first so that out is written only on success. */
    int rc = expand(tmpl, ns, component, worker_id, dp_rank, NULL, cap);
    if (rc < 0)
        return rc;
    return expand(tmpl, ns, component, worker_id, dp_rank, out, cap);
}

/* ---- small helpers ---- */

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000u, (long)(ms % 1000u) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

/* nats.c's last error for this thread without its "(file.c:123): " prefix,
 * or the status text. */
static void last_error(natsStatus st, char *out, size_t cap)
{
    const char *t = nats_GetLastError(NULL);
    if (t && t[0] == '(') {
        const char *e = strstr(t, "): ");
        if (e)
            t = e + 3;
    }
    snprintf(out, cap, "%s", t && *t ? t : natsStatus_GetText(st));
}

/* A server URL fit for a log line: user:password@ (or token@) hidden. */
static void redact_url(const char *url, char *out, size_t cap)
{
    const char *scheme = strstr(url, "://");
    const char *host = scheme ? scheme + 3 : url;
    const char *at = strrchr(host, '@');
    if (at)
        snprintf(out, cap, "%.*s***%s", (int)(host - url), url, at);
    else
        snprintf(out, cap, "%s", url);
}

/* ---- callbacks (nats.c threads) ---- */

static void kick_worker(struct kvb_sink *s);
static void set_ordered(struct kvb_sink *s, bool on);

static void wake(struct kvb_sink *s)
{
    if (s->wake_fd < 0 || !atomic_load(&s->live))
        return;
    int saved = errno;
    uint8_t b = 1;
    ssize_t n;
    do
        n = write(s->wake_fd, &b, 1);
    while (n < 0 && errno == EINTR);
    if (n < 0 && errno == EINVAL) { /* an eventfd wants 8 bytes */
        uint64_t one = 1;
        do
            n = write(s->wake_fd, &one, sizeof(one));
        while (n < 0 && errno == EINTR);
    }
    /* EAGAIN: the loop has wake-ups pending already. */
    errno = saved;
}

/* Metrics rule: a sink writes metrics only while it is the live one, i.e.
 * from a successful create until destroy starts (live).  On SIGHUP the loop
 * creates a new sink on the same metrics before destroying the old one, and a
 * create that fails must not disturb what the running sink reports. */
static bool owns_metrics(const struct kvb_sink *s)
{
    return s->m && atomic_load(&((struct kvb_sink *)s)->live);
}

static void set_connected_gauge(struct kvb_sink *s, uint64_t v)
{
    if (owns_metrics(s))
        atomic_store_explicit(&s->m->nats_connected[0], v, memory_order_relaxed);
}

/* Store state, with the gauge written before (so a reader that sees the
 * state sees the gauge) and after (so that create()'s publish_gauge() racing
 * with a callback cannot leave a stale value). */
static void set_state(struct kvb_sink *s, int st)
{
    uint64_t v = st == ST_CONNECTED;
    set_connected_gauge(s, v);
    atomic_store(&s->state, st);
    set_connected_gauge(s, v);
}

/* create(): make the gauge match the state, whatever callbacks do meanwhile. */
static void publish_gauge(struct kvb_sink *s)
{
    int st;
    do {
        st = atomic_load(&s->state);
        set_connected_gauge(s, st == ST_CONNECTED);
    } while (atomic_load(&s->state) != st);
}

/* A connection after the first one: written by nats.c's callback thread and
 * by the rebuild thread, hence an atomic add rather than kvb_inc(). */
static void count_reconnect(struct kvb_sink *s)
{
    if (owns_metrics(s))
        atomic_fetch_add_explicit(&s->m->nats_reconnects_total[0], 1, memory_order_relaxed);
}

static void on_connected(natsConnection *nc, void *closure)
{
    struct kvb_sink *s = closure;
    (void)nc;
    bool again = atomic_exchange(&s->ever_connected, true);
    atomic_store(&s->outage_bytes, 0);
    if (again)
        count_reconnect(s);
    set_state(s, ST_CONNECTED);
    if (atomic_load(&s->live))
        kvb_info(STAGE, "connected to NATS");
    if (s->js_on)
        kick_worker(s); /* stream check, resends */
    wake(s);
}

static void on_reconnected(natsConnection *nc, void *closure)
{
    struct kvb_sink *s = closure;
    char url[256], shown[256];
    count_reconnect(s);
    atomic_store(&s->outage_bytes, 0);
    set_state(s, ST_CONNECTED);
    if (atomic_load(&s->live)) {
        if (natsConnection_GetConnectedUrl(nc, url, sizeof(url)) != NATS_OK)
            snprintf(url, sizeof(url), "?");
        redact_url(url, shown, sizeof(shown));
        kvb_info(STAGE, "reconnected to NATS at %s", shown);
    }
    if (s->js_on) { /* what was in flight when the server went: send it again */
        pthread_mutex_lock(&s->rb_mu);
        s->recover_due = true;
        pthread_cond_signal(&s->rb_cond);
        pthread_mutex_unlock(&s->rb_mu);
    }
    wake(s);
}

static void on_disconnected(natsConnection *nc, void *closure)
{
    struct kvb_sink *s = closure;
    (void)nc;
    if (owns_metrics(s)) /* not for our own close */
        kvb_inc(&s->m->nats_disconnects_total[0]);
    if (s->js_on) { /* from now on publishes queue up (and keep their order) */
        pthread_mutex_lock(&s->rb_mu);
        set_ordered(s, true);
        pthread_mutex_unlock(&s->rb_mu);
    }
    set_state(s, ST_DISCONNECTED);
    if (atomic_load(&s->live))
        kvb_warn(STAGE, "disconnected from NATS, reconnecting (publishes are buffered)");
    wake(s);
}

/* Asynchronous errors: a refusal while reconnecting, a permissions violation
 * on publish (the server drops the message), a slow consumer. */
static void on_error(natsConnection *nc, natsSubscription *sub, natsStatus err, void *closure)
{
    struct kvb_sink *s = closure;
    const char *txt = NULL;
    (void)sub;
    if (!atomic_load(&s->live))
        return;
    if (natsConnection_GetLastError(nc, &txt) == NATS_OK || !txt || !*txt)
        txt = natsStatus_GetText(err);
    kvb_log_rl(&s->cb_rl, KVB_LOG_ERROR, STAGE, "NATS: %s", txt);
}

static void on_closed(natsConnection *nc, void *closure)
{
    struct kvb_sink *s = closure;
    set_state(s, ST_CLOSED);
    if (!atomic_load(&s->closing)) {
        /* nats.c gave up on this connection: make a new one (create may not
         * have returned yet: the rebuild thread starts with this flag set). */
        if (atomic_load(&s->live)) {
            const char *txt = NULL;
            natsStatus st = natsConnection_GetLastError(nc, &txt);
            kvb_err(STAGE, "NATS connection closed by the client library (%s); opening "
                           "a new one, publishes are refused meanwhile",
                    txt && *txt ? txt : natsStatus_GetText(st));
        }
        if (!s->js_on) /* its reconnect buffer is gone (JetStream: the worker */
            atomic_fetch_add(&s->losses, 1); /* takes the unacknowledged back) */
        pthread_mutex_lock(&s->rb_mu);
        s->rb_needed = true;
        pthread_cond_signal(&s->rb_cond);
        pthread_mutex_unlock(&s->rb_mu);
        wake(s);
    }
    /* Last touch of s: destroy may free it once every ClosedCB has run. */
    atomic_fetch_add(&s->closed_cbs, 1);
}

static uint32_t xorshift32(uint32_t *st)
{
    uint32_t x = *st;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *st = x;
}

/* Backoff after the ATTEMPTS-th failed pass (1, 2, ...): wait_ms doubling up
 * to wait_max_ms, minus up to 20% jitter so that a fleet of bridges does not
 * reconnect in lockstep. */
static uint64_t backoff_ms(const struct kvb_sink *s, int attempts, uint32_t *rng)
{
    uint64_t d = s->wait_ms >= 10 ? s->wait_ms : 10; /* never spin on refusals */
    uint64_t max = s->wait_max_ms > d ? s->wait_max_ms : d;
    for (int i = 1; i < attempts && d < max; i++)
        d *= 2;
    if (d > max)
        d = max;
    if (d >= 5)
        d -= xorshift32(rng) % (d / 5 + 1);
    return d;
}

/* Called by nats.c after each full pass over the server list that failed. */
static int64_t reconnect_delay(natsConnection *nc, int attempts, void *closure)
{
    struct kvb_sink *s = closure;
    (void)nc;
    return (int64_t)backoff_ms(s, attempts, &s->rng);
}

/* NKey authentication: sign the server's nonce with the seed (nats.c frees
 * the signature). */
static natsStatus sign_nonce(char **custom_err, unsigned char **sig, int *sig_len,
                             const char *nonce, void *closure)
{
    struct kvb_sink *s = closure;
    (void)custom_err;
    return nats_Sign(s->seed, nonce, sig, sig_len);
}

/* ---- status translation ---- */

static int errno_of(natsStatus st)
{
    switch (st) {
    case NATS_OK: return 0;
    case NATS_INSUFFICIENT_BUFFER: return -EAGAIN;
    case NATS_CONNECTION_CLOSED: return -EPIPE;
    case NATS_CONNECTION_DISCONNECTED: return -ENOTCONN;
    case NATS_TIMEOUT: return -ETIMEDOUT;
    case NATS_MAX_PAYLOAD: return -EMSGSIZE;
    case NATS_NO_MEMORY: return -ENOMEM;
    case NATS_INVALID_ARG:
    case NATS_INVALID_SUBJECT:
    case NATS_ADDRESS_MISSING:
    case NATS_INVALID_TIMEOUT: return -EINVAL;
    case NATS_NOT_FOUND: return -ENOENT;
    case NATS_CONNECTION_AUTH_FAILED:
    case NATS_NOT_PERMITTED: return -EACCES;
    default: return -EIO;
    }
}

/* ---- JetStream ---- */

#define JS_MSG_ID_HDR "Nats-Msg-Id"
#define JS_MSG_OVERHEAD 256   /* bytes a message costs beyond its payload (subject,
                               * Nats-Msg-Id, nats.c's bookkeeping): an estimate */
#define JS_STALL_WAIT_MS 1    /* nats.c blocks a publish at most this long */
#define JS_RETRY_MIN_MS 50    /* resend backoff after no responders / unavailable */
#define JS_RETRY_MAX_MS 2000
#define JS_SETUP_RETRY_MS 1000
#define JS_SETUP_RETRY_MAX_MS 30000
#define JS_START_RETRY_MS 200 /* create(): between stream checks, until the deadline */
#define JS_ACK_GRACE_MS 20    /* destroy: after the last on_ack() returned */

/* Wake the worker (rebuild thread): a resend is queued, a connection is back. */
static void kick_worker(struct kvb_sink *s)
{
    pthread_mutex_lock(&s->rb_mu);
    pthread_cond_signal(&s->rb_cond);
    pthread_mutex_unlock(&s->rb_mu);
}

static struct slot *ring_at(struct ring *r, size_t i)
{
    return &r->v[(r->head + i) % r->cap];
}

/* rb_mu held: room for one more (doubling); false when out of memory. */
static bool ring_room(struct ring *r)
{
    if (r->len < r->cap)
        return true;
    size_t cap = r->cap ? r->cap * 2 : 256;
    struct slot *v = malloc(cap * sizeof(*v));
    if (!v)
        return false;
    for (size_t i = 0; i < r->len; i++)
        v[i] = r->v[(r->head + i) % r->cap];
    free(r->v);
    r->v = v;
    r->cap = cap;
    r->head = 0;
    return true;
}

/* rb_mu held.  False when out of memory (the caller gives the message up). */
static bool ring_push(struct ring *r, struct slot sl, bool front)
{
    if (!ring_room(r))
        return false;
    if (front) {
        r->head = (r->head + r->cap - 1) % r->cap;
        r->v[r->head] = sl;
    } else {
        *ring_at(r, r->len) = sl;
    }
    r->len++;
    return true;
}

static bool ring_pop(struct ring *r, struct slot *out)
{
    if (!r || !r->len)
        return false;
    *out = r->v[r->head];
    r->head = (r->head + 1) % r->cap;
    r->len--;
    return true;
}

static int slot_cmp(const void *a, const void *b)
{
    const struct slot *x = a, *y = b;
    for (int i = 0; i < 4; i++)
        if (x->k[i] != y->k[i])
            return x->k[i] < y->k[i] ? -1 : 1;
    return 0;
}

/* rb_mu held: into the resend queue at its place in Nats-Msg-Id order (a
 * failure usually comes in order: searched from the back). */
static bool ring_insert(struct ring *r, struct slot sl)
{
    if (!ring_room(r))
        return false;
    size_t i = r->len;
    for (; i > 0 && slot_cmp(ring_at(r, i - 1), &sl) > 0; i--)
        *ring_at(r, i) = *ring_at(r, i - 1);
    *ring_at(r, i) = sl;
    r->len++;
    return true;
}

static void parse_id(natsMsg *m, uint64_t v[4])
{
    const char *id = NULL;
    memset(v, 0, 4 * sizeof(v[0]));
    if (natsMsgHeader_Get(m, JS_MSG_ID_HDR, &id) != NATS_OK || !id)
        return;
    for (int i = 0; i < 4 && *id; i++) {
        while (*id >= '0' && *id <= '9')
            v[i] = v[i] * 10 + (uint64_t)(*id++ - '0');
        if (*id == '.')
            id++;
    }
}

static struct slot slot_of(natsMsg *m, bool keyed)
{
    struct slot sl = {m, {0, 0, 0, 0}};
    if (keyed)
        parse_id(m, sl.k);
    return sl;
}

/* rb_mu held: publishes go through the queues from now on. */
static void set_ordered(struct kvb_sink *s, bool on)
{
    s->ordered = on;
    atomic_store(&s->ordered_hint, on);
}

/* What a message counts against the window's byte bound. */
static uint64_t msg_cost(natsMsg *m)
{
    int n = natsMsg_GetDataLength(m);
    return (uint64_t)(n > 0 ? n : 0) + JS_MSG_OVERHEAD;
}

/* One message (of that cost) is done with: acknowledged, or given up. */
static void settle(struct kvb_sink *s, uint64_t cost)
{
    atomic_fetch_sub(&s->inflight_bytes, cost);
    if (atomic_fetch_sub(&s->inflight, 1) == 1) {
        pthread_mutex_lock(&s->ack_mu);
        pthread_cond_broadcast(&s->ack_cond);
        pthread_mutex_unlock(&s->ack_mu);
    }
}

static void js_count(struct kvb_sink *s, _Atomic uint64_t *c)
{
    if (owns_metrics(s)) /* several nats.c threads and the worker: atomic add */
        atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

/* A message the sink gives up on: lost, so the loop publishes a barrier. */
static void give_up(struct kvb_sink *s, natsMsg *m)
{
    uint64_t cost = msg_cost(m);
    natsMsg_Destroy(m);
    if (s->m)
        js_count(s, &s->m->jetstream_publish_errors_total[0]);
    atomic_fetch_add(&s->losses, 1);
    settle(s, cost);
    wake(s);
}

/* JetStream errors that say "not now" rather than "never". */
static bool js_transient(natsStatus st, jsErrCode ec)
{
    if (st != NATS_ERR)
        return st != NATS_NO_MEMORY && st != NATS_INVALID_ARG;
    switch ((int)ec) {
    case 0:                          /* no code: assume the server will recover */
    case JSClusterIncompleteErr:
    case JSClusterNoPeersErr:        /* a cluster whose peers are still coming up */
    case JSClusterNotAvailErr:       /* "JetStream system temporarily unavailable" */
    case JSClusterNotLeaderErr:
    case JSInsufficientResourcesErr:
    case JSRaftGeneralErr:
    case JSStreamNameExistErr:       /* another bridge created it meanwhile */
        return true;
    default:
        return false;
    }
}

/* nats.c's callback for every asynchronous publish (its own thread, one per
 * jsCtx).  Positive ack: done.  Otherwise the message goes to the resend
 * queue (the worker sends it again once connected; after no responders or
 * an unavailable JetStream with a backoff), unless the stream refused it. */
static void on_ack(jsCtx *js, natsMsg *msg, jsPubAck *pa, jsPubAckErr *pae, void *closure)
{
    struct kvb_sink *s = closure;
    struct kvb_metrics *m = s->m;
    (void)js;
    atomic_fetch_add(&s->ack_cbs, 1);
    bool was_probe = msg && atomic_load(&s->probe) == msg;
    if (pa) {
        if (m) {
            js_count(s, &m->jetstream_acks_total[0]);
            if (pa->Duplicate)
                js_count(s, &m->jetstream_duplicates_total[0]);
        }
        atomic_store(&s->ack_ok, true);
        if (was_probe) { /* stored: JetStream takes publishes again */
            pthread_mutex_lock(&s->rb_mu);
            if (atomic_load(&s->probe) == msg) {
                atomic_store(&s->probe, NULL);
                s->probing = false;
                pthread_cond_signal(&s->rb_cond);
            }
            pthread_mutex_unlock(&s->rb_mu);
        }
        uint64_t cost = msg_cost(msg);
        natsMsg_Destroy(msg);
        settle(s, cost);
        goto out;
    }
    natsStatus st = pae ? pae->Err : NATS_ERR;
    jsErrCode ec = pae ? pae->ErrCode : 0;
    int why = st == NATS_TIMEOUT                ? KVB_JSF_TIMEOUT
              : st == NATS_NO_RESPONDERS        ? KVB_JSF_NO_RESPONDERS
              : js_transient(st, ec)            ? KVB_JSF_UNAVAILABLE
                                                : KVB_JSF_REFUSED;
    if (m)
        js_count(s, &m->jetstream_ack_failures_total[why]);
    if (why == KVB_JSF_REFUSED) {
        if (atomic_load(&s->live)) {
            const char *id = NULL;
            if (natsMsgHeader_Get(msg, JS_MSG_ID_HDR, &id) != NATS_OK)
                id = NULL;
            kvb_log_rl(&s->ack_rl, KVB_LOG_ERROR, STAGE,
                       "JetStream refused a router event (%s%s): %s (error %d); it is "
                       "not sent again, a barrier follows",
                       id ? "Nats-Msg-Id " : "no id", id ? id : "",
                       pae && pae->ErrText ? pae->ErrText : natsStatus_GetText(st), (int)ec);
        }
        if (was_probe) { /* answered: the next one may go */
            pthread_mutex_lock(&s->rb_mu);
            if (atomic_load(&s->probe) == msg)
                atomic_store(&s->probe, NULL);
            pthread_cond_signal(&s->rb_cond);
            pthread_mutex_unlock(&s->rb_mu);
        }
        give_up(s, msg);
        goto out;
    }
    pthread_mutex_lock(&s->rb_mu);
    if (was_probe && atomic_load(&s->probe) == msg)
        atomic_store(&s->probe, NULL);
    if (why != KVB_JSF_TIMEOUT) {
        /* Nobody took it (JetStream starting, the stream gone, a leader
         * election): retry in rounds, with a growing pause between them,
         * and have the worker look at the stream again. */
        uint64_t now = kvb_mono_ms();
        if (atomic_exchange(&s->ack_ok, false) || s->retry_ms == 0)
            s->retry_ms = JS_RETRY_MIN_MS;
        if (now >= s->rq_not_before) {
            s->rq_not_before = now + s->retry_ms;
            s->retry_ms = s->retry_ms * 2 > JS_RETRY_MAX_MS ? JS_RETRY_MAX_MS : s->retry_ms * 2;
        }
        if (why == KVB_JSF_NO_RESPONDERS && !s->js_setup_due) {
            s->js_setup_due = true;
            s->js_setup_after = s->rq_not_before;
        }
        s->probing = true;
    }
    bool queued = ring_insert(&s->rq, slot_of(msg, true));
    set_ordered(s, true); /* later publishes wait behind it */
    pthread_cond_signal(&s->rb_cond);
    pthread_mutex_unlock(&s->rb_mu);
    if (!queued)
        give_up(s, msg);
out:
    atomic_fetch_sub(&s->ack_cbs, 1);
}

/* A new JetStream context for NC (any state). */
static natsStatus js_new(struct kvb_sink *s, natsConnection *nc, jsCtx **out)
{
    jsOptions o;
    jsOptions_Init(&o);
    o.Wait = s->js_ack_timeout_ms;
    o.PublishAsync.MaxPending = 0; /* the sink bounds the window (js_publish) */
    o.PublishAsync.AckHandler = on_ack;
    o.PublishAsync.AckHandlerClosure = s;
    o.PublishAsync.StallWait = JS_STALL_WAIT_MS;
    return natsConnection_JetStream(out, nc, &o);
}

/* Take every message JS still waits an ack for (its connection was lost or
 * is about to be replaced) into the resend queue, which stays in Nats-Msg-Id
 * order.  Worker only. */
static void js_recover(struct kvb_sink *s, jsCtx *js, const char *why)
{
    natsMsgList list = {0};
    bool got = js && js_PublishAsyncGetPendingList(&list, js) == NATS_OK;
    int n_rec = got ? list.Count : 0;
    pthread_mutex_lock(&s->rb_mu);
    size_t total = s->rq.len + (size_t)(n_rec > 0 ? n_rec : 0), n = 0;
    struct slot *k = calloc(total + 1, sizeof(*k));
    if (k)
        while (ring_pop(&s->rq, &k[n]))
            n++;
    for (int i = 0; i < n_rec; i++) {
        natsMsg *m = list.Msgs[i];
        list.Msgs[i] = NULL;
        if (!m)
            continue;
        if (k) {
            k[n++] = slot_of(m, true);
        } else if (!ring_insert(&s->rq, slot_of(m, true))) { /* no memory: as they come */
            pthread_mutex_unlock(&s->rb_mu);
            give_up(s, m);
            pthread_mutex_lock(&s->rb_mu);
        }
    }
    if (k) {
        qsort(k, n, sizeof(*k), slot_cmp);
        for (size_t i = 0; i < n; i++)
            if (!ring_push(&s->rq, k[i], false)) {
                pthread_mutex_unlock(&s->rb_mu);
                give_up(s, k[i].m);
                pthread_mutex_lock(&s->rb_mu);
            }
    }
    atomic_store(&s->probe, NULL); /* if it was out, it is back in the queue */
    if (s->rq.len)
        set_ordered(s, true);
    pthread_mutex_unlock(&s->rb_mu);
    if (got)
        natsMsgList_Destroy(&list);
    if (n_rec > 0)
        kvb_info(STAGE, "JetStream: %d router event(s) without an ack %s will be sent again",
                 n_rec, why);
    free(k);
}

/* NATS subject PATTERN (with * and > wildcards) matches SUBJ. */
static bool subject_covers(const char *pattern, const char *subj)
{
    const char *p = pattern, *t = subj;
    for (;;) {
        size_t pl = strcspn(p, "."), tl = strcspn(t, ".");
        if (pl == 1 && p[0] == '>' && p[1] == '\0')
            return tl > 0;
        if (!(pl == 1 && p[0] == '*') && (pl != tl || memcmp(p, t, pl) != 0))
            return false;
        p += pl;
        t += tl;
        if (!*p || !*t)
            return !*p && !*t;
        p++;
        t++;
    }
}

/* Check that an existing stream takes our subject; log what it is. */
static int js_check_stream(struct kvb_sink *s, const jsStreamInfo *si, char *why, size_t cap)
{
    const jsStreamConfig *c = si->Config;
    bool covered = false;
    size_t len = 0;
    why[0] = '\0';
    if (!c)
        return 0;
    if (c->SubjectsLen == 0)
        covered = c->Name && strcmp(c->Name, s->js_subject) == 0;
    for (int i = 0; i < c->SubjectsLen && !covered; i++)
        covered = c->Subjects[i] && subject_covers(c->Subjects[i], s->js_subject);
    if (!covered) {
        len = (size_t)snprintf(why, cap, "stream %s exists but does not take the subject %s "
                                        "(its subjects:", s->js_stream, s->js_subject);
        for (int i = 0; i < c->SubjectsLen && len < cap; i++)
            len += (size_t)snprintf(why + len, cap - len, " %s", c->Subjects[i]);
        if (len < cap)
            snprintf(why + len, cap - len, "%s)", c->SubjectsLen ? "" : " none");
        return -EACCES;
    }
    if (c->Duplicates < (int64_t)s->js_dup_window_s * 1000000000LL)
        kvb_warn(STAGE, "JetStream: stream %s has a duplicate window of %" PRId64 " s, less "
                        "than nats.jetstream.duplicate_window_s (%" PRIu32 " s): an event "
                        "sent again after that long is stored twice",
                 s->js_stream, (int64_t)(c->Duplicates / 1000000000LL), s->js_dup_window_s);
    return 0;
}

static const char *retention_name(int r)
{
    return r == KVB_JS_INTEREST ? "interest" : r == KVB_JS_WORKQUEUE ? "workqueue" : "limits";
}

/* Look the stream up on JS, create it when missing (and allowed).  0, or
 * -EACCES / -ETIMEDOUT with why set and *transient telling whether trying
 * again may help (JetStream starting, a cluster electing a leader). */
static int js_setup_once(struct kvb_sink *s, jsCtx *js, int64_t wait_ms, char *why,
                         size_t cap, bool *transient)
{
    jsOptions o;
    jsStreamInfo *si = NULL;
    jsErrCode ec = 0;
    natsStatus st;
    int rc;

    *transient = false;
    jsOptions_Init(&o);
    o.Wait = wait_ms > 0 ? wait_ms : 1;
    st = js_GetStreamInfo(&si, js, s->js_stream, &o, &ec);
    if (st == NATS_OK) {
        rc = js_check_stream(s, si, why, cap);
        if (rc == 0)
            kvb_info(STAGE, "JetStream: publishing to %s, stored in stream %s (%" PRIu64
                            " messages)",
                     s->js_subject, s->js_stream, si->State.Msgs);
        jsStreamInfo_Destroy(si);
        return rc;
    }
    if (st == NATS_NOT_FOUND || (st == NATS_ERR && ec == JSStreamNotFoundErr)) {
        if (!s->js_create) {
            snprintf(why, cap, "stream %s does not exist (and nats.jetstream.create is false)",
                     s->js_stream);
            return -EACCES;
        }
        jsStreamConfig c;
        const char *subjects[1] = {s->js_subject};
        jsStreamConfig_Init(&c);
        c.Name = s->js_stream;
        c.Subjects = subjects;
        c.SubjectsLen = 1;
        c.Retention = (jsRetentionPolicy)s->js_retention;
        c.MaxAge = (int64_t)s->js_max_age_s * 1000000000LL;
        c.Replicas = s->js_replicas;
        c.Duplicates = (int64_t)s->js_dup_window_s * 1000000000LL;
        c.Storage = js_FileStorage;
        ec = 0;
        st = js_AddStream(&si, js, &c, &o, &ec);
        if (st == NATS_OK) {
            kvb_info(STAGE, "JetStream: created stream %s (subject %s, retention %s, max age "
                            "%" PRIu32 " s, %" PRIu32 " replica(s), duplicate window %" PRIu32
                            " s)",
                     s->js_stream, s->js_subject, retention_name(s->js_retention),
                     s->js_max_age_s, s->js_replicas, s->js_dup_window_s);
            jsStreamInfo_Destroy(si);
            return 0;
        }
    }
    char txt[256];
    last_error(st, txt, sizeof(txt));
    if (st == NATS_NO_RESPONDERS)
        snprintf(why, cap, "JetStream is not available on the server (not enabled, or "
                           "starting): %s", txt);
    else if (ec)
        snprintf(why, cap, "stream %s: %s (JetStream error %d)", s->js_stream, txt, (int)ec);
    else
        snprintf(why, cap, "stream %s: %s", s->js_stream, txt);
    *transient = js_transient(st, ec);
    return st == NATS_TIMEOUT ? -ETIMEDOUT : -EACCES;
}

/* ---- connecting ---- */

enum attempt { ATT_CONNECTED, ATT_PENDING, ATT_REJECTED, ATT_FAILED };

/* A server that is merely not there (nats.c keeps trying those). */
/* ---- I/O: nats.c in event-loop mode ----
 *
 * nats.c's own design sends a publish up to 1 ms later (its flusher thread
 * waits that long to gather more), and every publish wakes that thread: two
 * thread wake-ups and a millisecond per quiet batch.  Instead:
 * - Publishes by the owner thread (the loop) after kvb_sink_defer_writes():
 *   the write callback only notes that a write is due; the loop calls
 *   kvb_sink_service() before it waits for input, which writes what every
 *   publish of that turn left in the buffer with one send(): no thread
 *   switch, no delay, one syscall per turn at any rate.
 * - Everything else (nats.c's own PINGs, the JetStream worker's resends, the
 *   reconnect thread's buffered publishes, the owner while it waits in a
 *   flush, or a send the socket could not take whole) goes to the I/O
 *   thread, which polls the sockets for the writes handed to it and always
 *   for reads (PONGs, INFO, JetStream acks, errors).
 * One struct evl per connection, made at its first attach.  The I/O thread
 * calls into a connection only while it is neither forgotten (evl_forget(),
 * which waits for a call in progress and runs before natsConnection_Destroy)
 * nor detached; evls are freed by the I/O thread (or sink_free) once both
 * forgotten and detached, so a pointer it holds stays valid for its
 * iteration. */
struct evl {
    struct kvb_sink *s;
    natsConnection *nc;
    int fd;           /* -1: not polled (detached, or gone away under us) */
    bool want_read;   /* nats.c's read add/remove */
    bool want_write;  /* nats.c's write add, until its remove */
    bool io_write;    /* the I/O thread polls POLLOUT for it */
    bool detached, forgotten;
    unsigned touched; /* counts callbacks, to tell progress from a stuck socket */
    unsigned gen;     /* counts attaches and detaches: which socket fd is (a
                       * closed fd's number comes back for the next socket) */
    struct evl *next;
};

static void io_kick(struct kvb_sink *s)
{
    uint64_t one = 1;
    if (write(s->io_wake, &one, sizeof(one)) < 0) {
        /* full counter: the thread is awake anyway */
    }
}

static natsStatus evl_attach(void **ud, void *loop, natsConnection *nc, natsSock fd)
{
    struct kvb_sink *s = loop;
    struct evl *e = *ud;
    pthread_mutex_lock(&s->evl_mu);
    if (!e) {
        if (!(e = calloc(1, sizeof(*e)))) {
            pthread_mutex_unlock(&s->evl_mu);
            return NATS_NO_MEMORY;
        }
        e->s = s;
        e->nc = nc;
        e->next = s->evls;
        s->evls = e;
    }
    e->fd = (int)fd;
    e->want_read = true;
    e->want_write = e->io_write = false;
    e->detached = false;
    e->touched++;
    e->gen++;
    pthread_mutex_unlock(&s->evl_mu);
    *ud = e;
    io_kick(s);
    return NATS_OK;
}

static natsStatus evl_read(void *ud, bool add)
{
    struct evl *e = ud;
    pthread_mutex_lock(&e->s->evl_mu);
    bool changed = e->want_read != add;
    e->want_read = add;
    e->touched++;
    pthread_mutex_unlock(&e->s->evl_mu);
    if (changed)
        io_kick(e->s);
    return NATS_OK;
}

static natsStatus evl_write(void *ud, bool add)
{
    struct evl *e = ud;
    struct kvb_sink *s = e->s;
    bool owner = add && atomic_load(&s->defer) && pthread_equal(pthread_self(), s->owner) &&
                 s->in_publish; /* in_publish: read by the owner only */
    bool kick = false;
    pthread_mutex_lock(&s->evl_mu);
    e->want_write = add;
    e->touched++;
    if (!add) {
        e->io_write = false;
    } else if (!owner && !e->io_write) {
        e->io_write = kick = true;
    }
    pthread_mutex_unlock(&s->evl_mu);
    if (owner)
        atomic_store(&s->owner_write, true);
    if (kick)
        io_kick(s);
    return NATS_OK;
}

static natsStatus evl_detach(void *ud)
{
    struct evl *e = ud;
    pthread_mutex_lock(&e->s->evl_mu);
    e->detached = true;
    e->fd = -1;
    e->want_read = e->want_write = e->io_write = false;
    e->touched++;
    e->gen++;
    pthread_mutex_unlock(&e->s->evl_mu);
    io_kick(e->s);
    return NATS_OK;
}

/* Before natsConnection_Destroy(nc): the I/O thread leaves it alone from now
 * on (waits for a call into it in progress).  Not with nats.c's lock held. */
static void evl_forget(struct kvb_sink *s, natsConnection *nc)
{
    if (!nc)
        return;
    pthread_mutex_lock(&s->evl_mu);
    for (struct evl *e = s->evls; e; e = e->next) {
        if (e->nc != nc || e->forgotten)
            continue;
        e->forgotten = true;
        while (s->io_busy == e)
            pthread_cond_wait(&s->evl_cond, &s->evl_mu);
    }
    pthread_mutex_unlock(&s->evl_mu);
    io_kick(s); /* drops it from the poll set (and frees it once detached) */
}

/* evl_mu held: free what neither nats.c nor the sink will touch again. */
static void evl_reap(struct kvb_sink *s, bool all)
{
    for (struct evl **pe = &s->evls; *pe;) {
        struct evl *e = *pe;
        if (all || (e->forgotten && e->detached)) {
            *pe = e->next;
            free(e);
        } else {
            pe = &e->next;
        }
    }
}

#define IO_MAX_CONNS 8 /* connections polled at once (1, 2 while replacing) */

static void *io_main(void *arg)
{
    struct kvb_sink *s = arg;
    struct pollfd fds[1 + IO_MAX_CONNS];
    struct evl *es[IO_MAX_CONNS];
    unsigned touched[IO_MAX_CONNS], gen[IO_MAX_CONNS];

    for (;;) {
        size_t n = 0;
        pthread_mutex_lock(&s->evl_mu);
        if (s->io_stop) {
            pthread_mutex_unlock(&s->evl_mu);
            break;
        }
        evl_reap(s, false);
        for (struct evl *e = s->evls; e && n < IO_MAX_CONNS; e = e->next) {
            if (e->forgotten || e->fd < 0 || !(e->want_read || e->io_write))
                continue;
            fds[1 + n] = (struct pollfd){e->fd, (short)((e->want_read ? POLLIN : 0) |
                                                        (e->io_write ? POLLOUT : 0)), 0};
            touched[n] = e->touched;
            gen[n] = e->gen;
            es[n++] = e;
        }
        pthread_mutex_unlock(&s->evl_mu);
        fds[0] = (struct pollfd){s->io_wake, POLLIN, 0};
        if (poll(fds, 1 + n, -1) < 0)
            continue; /* EINTR */
        if (fds[0].revents & POLLIN) {
            uint64_t v;
            if (read(s->io_wake, &v, sizeof(v)) < 0) {
                /* nothing to drain */
            }
        }
        for (size_t i = 0; i < n; i++) {
            short rev = fds[1 + i].revents;
            if (!rev)
                continue;
            struct evl *e = es[i];
            natsConnection *nc = NULL;
            bool rd = false, wr = false;
            pthread_mutex_lock(&s->evl_mu);
            if (!e->forgotten && e->gen == gen[i]) { /* still the socket polled */
                if (rev & POLLNVAL) {
                    e->fd = -1; /* closed under us: wait for the next attach */
                } else {
                    rd = e->want_read && (rev & (POLLIN | POLLHUP | POLLERR));
                    wr = e->io_write && (rev & (POLLOUT | POLLHUP | POLLERR));
                    if (rd || wr) {
                        s->io_busy = e;
                        nc = e->nc;
                    }
                }
            }
            pthread_mutex_unlock(&s->evl_mu);
            if (!nc)
                continue;
            if (wr)
                natsConnection_ProcessWriteEvent(nc);
            /* After a hang-up, read (what is left, then the end) until nats.c
             * reacts; a hang-up that changes nothing (nats.c is reconnecting
             * and ignores the old socket) stops the polling of that socket
             * until the next attach, instead of spinning. */
            bool hup = rev & (POLLHUP | POLLERR), same = rd;
            for (int k = 0; same && k < (hup ? 64 : 1); k++) {
                natsConnection_ProcessReadEvent(nc);
                pthread_mutex_lock(&s->evl_mu);
                same = e->touched == touched[i];
                pthread_mutex_unlock(&s->evl_mu);
            }
            pthread_mutex_lock(&s->evl_mu);
            if (hup && e->touched == touched[i])
                e->fd = -1;
            s->io_busy = NULL;
            pthread_cond_broadcast(&s->evl_cond);
            pthread_mutex_unlock(&s->evl_mu);
        }
    }
    nats_ReleaseThreadMemory();
    return NULL;
}

static int start_io_thread(struct kvb_sink *s)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* signals: the loop's signalfd */
    int rc = pthread_create(&s->io_thread, NULL, io_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == 0)
        s->io_started = true;
    return -rc;
}

static void stop_io_thread(struct kvb_sink *s)
{
    if (!s->io_started)
        return;
    pthread_mutex_lock(&s->evl_mu);
    s->io_stop = true;
    pthread_mutex_unlock(&s->evl_mu);
    io_kick(s);
    pthread_join(s->io_thread, NULL);
    s->io_started = false;
}

/* The owner's deferred write: send what the turn's publishes left in the
 * buffer; what the socket does not take now goes to the I/O thread. */
void kvb_sink_service(struct kvb_sink *s)
{
    if (!s || !atomic_exchange(&s->owner_write, false))
        return;
    pthread_mutex_lock(&s->conn_mu);
    natsConnection *nc = s->conn;
    if (nc)
        natsConnection_ProcessWriteEvent(nc);
    pthread_mutex_unlock(&s->conn_mu);
    bool kick = false;
    pthread_mutex_lock(&s->evl_mu);
    for (struct evl *e = s->evls; e; e = e->next)
        if (e->want_write && !e->io_write && !e->forgotten && !e->detached)
            e->io_write = kick = true; /* partly sent, or not ours: the I/O thread */
    pthread_mutex_unlock(&s->evl_mu);
    if (kick)
        io_kick(s);
}

void kvb_sink_defer_writes(struct kvb_sink *s)
{
    if (s) {
        s->owner = pthread_self();
        atomic_store(&s->defer, true); /* publishes owner */
    }
}

/* Destroy a connection (closed or not) that nothing else uses any more. */
static void conn_destroy(struct kvb_sink *s, natsConnection *nc)
{
    evl_forget(s, nc);
    natsConnection_Destroy(nc);
}

static bool unreachable(natsStatus st)
{
    return st == NATS_NO_SERVER || st == NATS_IO_ERROR || st == NATS_TIMEOUT;
}

/* One pass over the servers (see the top of this file).  CONNECTED: *out is
 * connected; PENDING: *out is usable, nats.c keeps trying in the background;
 * REJECTED: a server was reached and refused us, why says how; FAILED: no
 * memory, no thread.  The state is set before the connection can post a
 * callback, so that on_connected cannot be overwritten. */
static enum attempt connect_once(struct kvb_sink *s, natsConnection **out, char *why,
                                 size_t cap)
{
    natsConnection *nc = NULL;
    int connecting = atomic_load(&s->ever_connected) ? ST_DISCONNECTED : ST_INIT;
    natsStatus st;

    *out = NULL;
    set_state(s, connecting);
    st = natsOptions_SetRetryOnFailedConnect(s->opts, false, NULL, NULL);
    if (st == NATS_OK)
        st = natsConnection_Connect(&nc, s->opts);
    if (st == NATS_OK) {
        atomic_fetch_add(&s->conns, 1);
        atomic_compare_exchange_strong(&s->state, &connecting, ST_CONNECTED);
        publish_gauge(s);
        *out = nc;
        return ATT_CONNECTED;
    }
    if (!unreachable(st)) {
        last_error(st, why, cap);
        if (st == NATS_PROTOCOL_ERROR && strstr(why, "got ''"))
            snprintf(why + strlen(why), cap - strlen(why),
                     " (the server hung up: it may want a client certificate, "
                     "nats.tls.cert)");
        set_state(s, ST_CLOSED);
        return st == NATS_NO_MEMORY || st == NATS_SYS_ERROR ? ATT_FAILED : ATT_REJECTED;
    }
    /* Nobody answered: let nats.c keep trying, buffering publishes. */
    st = natsOptions_SetRetryOnFailedConnect(s->opts, true, on_connected, s);
    if (st == NATS_OK)
        st = natsConnection_Connect(&nc, s->opts);
    if (st == NATS_OK || st == NATS_NOT_YET_CONNECTED) {
        atomic_fetch_add(&s->conns, 1);
        if (st == NATS_OK) {
            atomic_compare_exchange_strong(&s->state, &connecting, ST_CONNECTED);
            publish_gauge(s);
        }
        *out = nc;
        return st == NATS_OK ? ATT_CONNECTED : ATT_PENDING;
    }
    /* Only a failure to start the retry machinery gets here; nats.c has then
     * closed the connection and queued ClosedCB (no memory / no thread). */
    if (st == NATS_NO_MEMORY || st == NATS_SYS_ERROR)
        atomic_fetch_add(&s->conns, 1);
    last_error(st, why, cap);
    set_state(s, ST_CLOSED);
    return ATT_FAILED;
}

/* ---- request serving (kvb_sink_serve) ---- */

static void srv_on_msg(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    (void)sub;
    struct kvb_sink *s = closure;
    s->srv_fn(s->srv_closure, nc, msg); /* srv_fn is set before any subscription */
}

static void srv_on_complete(void *closure)
{
    struct kvb_sink *s = closure;
    atomic_fetch_sub(&s->srv_live, 1);
}

/* conn_mu held: drop the current subscription (its callbacks end on their own). */
static void srv_drop(struct kvb_sink *s)
{
    if (!s->srv_sub)
        return;
    natsSubscription_Unsubscribe(s->srv_sub); /* a closed connection: already gone */
    natsSubscription_Destroy(s->srv_sub);
    s->srv_sub = NULL;
}

/* conn_mu held: subscribe on the current connection, if any. */
static int srv_subscribe(struct kvb_sink *s)
{
    if (!s->srv_subject || !s->conn || s->srv_sub)
        return 0;
    natsSubscription *sub = NULL;
    natsStatus st = natsConnection_Subscribe(&sub, s->conn, s->srv_subject, srv_on_msg, s);
    if (st == NATS_OK) {
        atomic_fetch_add(&s->srv_live, 1);
        if (natsSubscription_SetOnCompleteCB(sub, srv_on_complete, s) != NATS_OK)
            atomic_fetch_sub(&s->srv_live, 1); /* cannot happen on a fresh subscription */
        s->srv_sub = sub;
        return 0;
    }
    kvb_warn(STAGE, "cannot subscribe to %s: %s", s->srv_subject, natsStatus_GetText(st));
    return errno_of(st);
}

int kvb_sink_serve(struct kvb_sink *s, const char *subject, kvb_sink_request_fn fn,
                   void *closure)
{
    char *subj = strdup(subject);
    if (!subj)
        return -ENOMEM;
    pthread_mutex_lock(&s->conn_mu);
    srv_drop(s);
    free(s->srv_subject);
    s->srv_subject = subj;
    s->srv_fn = fn;
    s->srv_closure = closure;
    int rc = srv_subscribe(s);
    pthread_mutex_unlock(&s->conn_mu);
    return rc;
}

void kvb_sink_unserve(struct kvb_sink *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->conn_mu);
    srv_drop(s);
    free(s->srv_subject);
    s->srv_subject = NULL;
    pthread_mutex_unlock(&s->conn_mu);
}

bool kvb_sink_serving(const struct kvb_sink *s)
{
    return s && atomic_load(&((struct kvb_sink *)s)->srv_live) > 0;
}

/* Swap in a new connection and its JetStream context (NULL: none); the old
 * connection is closed already. */
static void set_conn(struct kvb_sink *s, natsConnection *nc, jsCtx *js)
{
    natsConnection *old;
    jsCtx *old_js;
    pthread_mutex_lock(&s->conn_mu);
    old = s->conn;
    old_js = s->js;
    if (old != nc)
        srv_drop(s);
    s->conn = nc;
    s->js = js;
    srv_subscribe(s); /* requests go on on the new connection */
    pthread_mutex_unlock(&s->conn_mu);
    jsCtx_Destroy(old_js);
    conn_destroy(s, old);
}

/* Every ClosedCB posted so far has run (bounded wait). */
static bool wait_closed_cbs(struct kvb_sink *s, uint32_t ms)
{
    uint64_t deadline = kvb_mono_ms() + ms;
    while (atomic_load(&s->closed_cbs) != atomic_load(&s->conns)) {
        if (kvb_mono_ms() >= deadline)
            return false;
        sleep_ms(1);
    }
    return true;
}

/* rb_mu held: wait on rb_cond until AT_MS (monotonic), a signal, or a spurious
 * wake-up. */
static void wait_until(struct kvb_sink *s, uint64_t at_ms)
{
    struct timespec until = {(time_t)(at_ms / 1000), (long)(at_ms % 1000) * 1000000L};
    pthread_cond_timedwait(&s->rb_cond, &s->rb_mu, &until);
}

/* rb_mu held: JetStream work the worker can do now (*at: when some will be
 * due, 0 = only when signalled). */
static bool js_due(struct kvb_sink *s, uint64_t now, uint64_t *at)
{
    *at = 0;
    if (!s->js_on || atomic_load(&s->state) != ST_CONNECTED)
        return false; /* on_connected / on_reconnected signal */
    if (s->js_setup_due) {
        if (now >= s->js_setup_after)
            return true;
        *at = s->js_setup_after;
    }
    if (s->recover_due)
        return true;
    if ((s->rq.len || s->fq.len) && !(s->probing && atomic_load(&s->probe))) {
        if (now >= s->rq_not_before)
            return true;
        if (!*at || s->rq_not_before < *at)
            *at = s->rq_not_before;
    }
    return false;
}

/* rb_mu held (released around nats.c calls): look at the stream when due;
 * after a reconnection take back what has no ack yet; then send the queues,
 * in order, while connected. */
static void js_work(struct kvb_sink *s)
{
    char why[512];
    bool transient;
    uint64_t now = kvb_mono_ms();

    if (s->js_setup_due && now >= s->js_setup_after) {
        s->js_setup_due = false;
        pthread_mutex_unlock(&s->rb_mu);
        int rc = js_setup_once(s, s->js, s->js_ack_timeout_ms, why, sizeof(why), &transient);
        pthread_mutex_lock(&s->rb_mu);
        if (rc < 0) {
            s->js_setup_failures++;
            uint64_t d = JS_SETUP_RETRY_MS;
            for (int i = 1; i < s->js_setup_failures && d < JS_SETUP_RETRY_MAX_MS; i++)
                d *= 2;
            if (d > JS_SETUP_RETRY_MAX_MS)
                d = JS_SETUP_RETRY_MAX_MS;
            s->js_setup_due = true;
            s->js_setup_after = kvb_mono_ms() + d;
            kvb_log_rl(&s->rb_rl, transient ? KVB_LOG_WARN : KVB_LOG_ERROR, STAGE,
                       "JetStream: %s (publishes wait; checking again in %" PRIu64 " ms)",
                       why, d);
        } else {
            s->js_setup_failures = 0;
        }
        return;
    }
    if (s->recover_due) {
        s->recover_due = false;
        pthread_mutex_unlock(&s->rb_mu);
        js_recover(s, s->js, "when the connection was lost");
        pthread_mutex_lock(&s->rb_mu);
    }
    /* the resend queue first, then what was published behind it; while
     * probing, one message until JetStream answers it */
    while (!s->rb_stop && !s->rb_needed && atomic_load(&s->state) == ST_CONNECTED &&
           kvb_mono_ms() >= s->rq_not_before && !(s->probing && atomic_load(&s->probe))) {
        struct ring *r = s->rq.len ? &s->rq : s->fq.len ? &s->fq : NULL;
        struct slot sl;
        if (!r || !ring_pop(r, &sl))
            break;
        bool probe = s->probing;
        if (probe)
            atomic_store(&s->probe, sl.m); /* before: its answer may come first */
        s->sending = true;
        pthread_mutex_unlock(&s->rb_mu);
        natsMsg *m = sl.m;
        natsStatus st = js_PublishMsgAsync(s->js, &m, &s->js_pubopts);
        if (st == NATS_OK && r == &s->rq && s->m)
            js_count(s, &s->m->jetstream_resends_total[0]);
        pthread_mutex_lock(&s->rb_mu);
        s->sending = false;
        if (st != NATS_OK) {
            if (probe && atomic_load(&s->probe) == sl.m)
                atomic_store(&s->probe, NULL);
            if (m && !ring_push(r, sl, true)) { /* ours again: first in line */
                pthread_mutex_unlock(&s->rb_mu);
                give_up(s, m);
                pthread_mutex_lock(&s->rb_mu);
            }
            s->rq_not_before = kvb_mono_ms() + JS_RETRY_MIN_MS;
            kvb_debug(STAGE, "JetStream publish from the queue: %s", natsStatus_GetText(st));
            break;
        }
    }
}

/* The worker ("rebuild thread"): sleeps until nats.c closes the connection
 * (rb_needed), then makes new ones with the reconnect backoff until one is
 * accepted.  In JetStream mode it also checks (creates) the stream and sends
 * the resend queue again.  Only this thread touches opts once create has
 * returned, and only it replaces conn and js. */
static void *rebuild_main(void *arg)
{
    struct kvb_sink *s = arg;
    int failures = 0;
    uint64_t delay = 0; /* the next backoff, once chosen */
    char why[512];

    pthread_mutex_lock(&s->rb_mu);
    for (;;) {
        uint64_t at = 0;
        while (!s->rb_stop && !s->rb_needed && !js_due(s, kvb_mono_ms(), &at)) {
            if (at)
                wait_until(s, at);
            else
                pthread_cond_wait(&s->rb_cond, &s->rb_mu);
        }
        if (s->rb_stop)
            break;
        if (!s->rb_needed) {
            js_work(s);
            continue;
        }
        /* wait out the backoff (destroy interrupts it) */
        if (!delay)
            delay = backoff_ms(s, failures + 1, &s->rb_rng);
        struct timespec until = kvb_mono_deadline(delay);
        int rc = 0;
        while (!s->rb_stop && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&s->rb_cond, &s->rb_mu, &until);
        if (s->rb_stop)
            break;
        s->rb_needed = false;
        delay = 0;
        pthread_mutex_unlock(&s->rb_mu);

        natsConnection *nc = NULL;
        wait_closed_cbs(s, CLOSE_WAIT_MS); /* the old connection's ClosedCB is done */
        if (s->js_on)
            js_recover(s, s->js, "on the closed connection"); /* before js goes */
        set_conn(s, NULL, NULL);
        enum attempt r = connect_once(s, &nc, why, sizeof(why));
        jsCtx *js = NULL;
        if ((r == ATT_CONNECTED || r == ATT_PENDING) && s->js_on &&
            js_new(s, nc, &js) != NATS_OK) {
            kvb_err(STAGE, "JetStream context: %s", natsStatus_GetText(NATS_NO_MEMORY));
            natsConnection_Close(nc); /* posts its ClosedCB: handled as a refusal */
            conn_destroy(s, nc);
            r = ATT_FAILED;
        }
        if (r == ATT_CONNECTED || r == ATT_PENDING) {
            set_conn(s, nc, js);
            if (s->js_on) {
                pthread_mutex_lock(&s->rb_mu);
                s->js_setup_due = true; /* the stream may be new to this server */
                s->js_setup_after = 0;
                pthread_mutex_unlock(&s->rb_mu);
            }
            if (r == ATT_CONNECTED) {
                bool again = atomic_exchange(&s->ever_connected, true);
                atomic_store(&s->outage_bytes, 0);
                if (again)
                    count_reconnect(s);
                kvb_info(STAGE, "connected to NATS (new connection)");
            } else {
                kvb_warn(STAGE, "NATS not reachable; retrying in the background, "
                                "publishes are buffered");
            }
            failures = 0;
            wake(s);
        } else {
            failures++;
            delay = backoff_ms(s, failures + 1, &s->rb_rng);
            kvb_log_rl(&s->rb_rl, KVB_LOG_ERROR, STAGE,
                       "%s: %s (attempt %d; retrying in %" PRIu64 " ms)",
                       r == ATT_REJECTED ? "NATS server rejected the connection"
                                         : "NATS connect",
                       why, failures, delay);
        }
        pthread_mutex_lock(&s->rb_mu);
        if (r == ATT_REJECTED || r == ATT_FAILED)
            s->rb_needed = true;
    }
    pthread_mutex_unlock(&s->rb_mu);
    nats_ReleaseThreadMemory();
    return NULL;
}

/* ---- lifecycle ---- */

/* Free a sink in any state.  Stop the rebuild thread, close the connection,
 * wait until every ClosedCB posted has run (callbacks may still be queued on
 * nats.c's callback thread, and they point to s).  If they never come
 * (callback thread stuck), leak the sink rather than let a late callback
 * write into freed memory. */
static void sink_free(struct kvb_sink *s)
{
    if (!s)
        return;
    atomic_store(&s->live, false);
    if (s->rb_started) {
        pthread_mutex_lock(&s->rb_mu);
        s->rb_stop = true;
        pthread_cond_signal(&s->rb_cond);
        pthread_mutex_unlock(&s->rb_mu);
        pthread_join(s->rb_thread, NULL);
    }
    atomic_store(&s->closing, true);
    kvb_sink_unserve(s);
    if (s->js) {
        /* No on_ack() after this: the reply subscription goes, and with it
         * the messages still unacknowledged (lost, as a core buffer would
         * be).  One already running gets to its end (grace period: nats.c
         * calls it after releasing its own lock). */
        jsCtx_Destroy(s->js);
        s->js = NULL;
        uint64_t deadline = kvb_mono_ms() + CLOSE_WAIT_MS;
        while (atomic_load(&s->ack_cbs) && kvb_mono_ms() < deadline)
            sleep_ms(1);
        sleep_ms(JS_ACK_GRACE_MS);
        if (atomic_load(&s->ack_cbs)) {
            kvb_err(STAGE, "JetStream ack callback still running after %d ms; leaking "
                           "the sink", CLOSE_WAIT_MS);
            return;
        }
    }
    if (s->conn)
        natsConnection_Close(s->conn); /* joins nats.c's reconnect thread */
    if (!wait_closed_cbs(s, CLOSE_WAIT_MS)) {
        kvb_err(STAGE, "NATS closed callback did not run in %d ms; leaking the sink",
                CLOSE_WAIT_MS);
        return;
    }
    /* a request callback still running (bounded: the query's own wait) */
    for (uint64_t until = kvb_mono_ms() + CLOSE_WAIT_MS;
         atomic_load(&s->srv_live) > 0 && kvb_mono_ms() < until;)
        sleep_ms(1);
    conn_destroy(s, s->conn);
    stop_io_thread(s);
    evl_reap(s, true);
    if (s->io_wake >= 0)
        close(s->io_wake);
    natsOptions_Destroy(s->opts);
    for (struct slot sl; s->rq.v && ring_pop(&s->rq, &sl);)
        natsMsg_Destroy(sl.m);
    for (struct slot sl; s->fq.v && ring_pop(&s->fq, &sl);)
        natsMsg_Destroy(sl.m);
    free(s->rq.v);
    free(s->fq.v);
    free(s->js_stream);
    free(s->js_subject);
    if (s->seed) {
        explicit_bzero(s->seed, strlen(s->seed));
        free(s->seed);
    }
    pthread_cond_destroy(&s->ack_cond);
    pthread_mutex_destroy(&s->ack_mu);
    pthread_cond_destroy(&s->rb_cond);
    pthread_mutex_destroy(&s->rb_mu);
    pthread_mutex_destroy(&s->conn_mu);
    pthread_cond_destroy(&s->evl_cond);
    pthread_mutex_destroy(&s->evl_mu);
    free(s);
}

static bool set(const char *v) { return v && *v; }

/* Authentication and TLS (the config allows one method at most). */
static natsStatus set_security(struct kvb_sink *s, const struct kvb_config *cfg)
{
    natsOptions *o = s->opts;
    natsStatus st = NATS_OK;
    const char *what = "authentication";

    if (set(cfg->nats.user)) {
        st = natsOptions_SetUserInfo(o, cfg->nats.user, cfg->nats.password);
    } else if (set(cfg->nats.token)) {
        st = natsOptions_SetToken(o, cfg->nats.token);
    } else if (set(cfg->nats.nkey_seed) && set(cfg->nats.nkey_public)) {
        if (!(s->seed = strdup(cfg->nats.nkey_seed)))
            return NATS_NO_MEMORY;
        st = natsOptions_SetNKey(o, cfg->nats.nkey_public, sign_nonce, s);
    } else if (set(cfg->nats.credentials)) {
        st = natsOptions_SetUserCredentialsFromFiles(o, cfg->nats.credentials, NULL);
    }
    if (st == NATS_OK && cfg->nats.tls.enabled) {
        what = "TLS";
        st = natsOptions_SetSecure(o, true);
        if (st == NATS_OK && set(cfg->nats.tls.ca))
            st = natsOptions_LoadCATrustedCertificates(o, cfg->nats.tls.ca);
        if (st == NATS_OK && set(cfg->nats.tls.cert))
            st = natsOptions_LoadCertificatesChain(o, cfg->nats.tls.cert, cfg->nats.tls.key);
        if (st == NATS_OK && !cfg->nats.tls.verify)
            st = natsOptions_SkipServerVerification(o, true);
        if (st == NATS_OK && set(cfg->nats.tls.server_name))
            st = natsOptions_SetExpectedHostname(o, cfg->nats.tls.server_name);
    }
    if (st != NATS_OK) {
        char why[512];
        last_error(st, why, sizeof(why));
        kvb_err(STAGE, "NATS %s options: %s", what, why);
    }
    return st;
}

static natsStatus set_options(struct kvb_sink *s, const struct kvb_config *cfg)
{
    natsOptions *o = s->opts;
    natsStatus st;
    uint64_t rbuf = cfg->nats.reconnect_buffer_bytes;
    int64_t attempt_ms = CONNECT_ATTEMPT_MS;

    if (cfg->nats.connect_timeout_ms > 0 && cfg->nats.connect_timeout_ms < attempt_ms)
        attempt_ms = cfg->nats.connect_timeout_ms;
    if (rbuf > INT_MAX)
        rbuf = INT_MAX;

    st = natsOptions_SetServers(o, (const char **)cfg->nats.servers, (int)cfg->nats.n_servers);
    if (st == NATS_OK)
        st = natsOptions_SetName(o, "kvbridge");
    if (st == NATS_OK)
        st = natsOptions_SetTimeout(o, attempt_ms);
    if (st == NATS_OK)
        st = natsOptions_SetAllowReconnect(o, true);
    if (st == NATS_OK)
        st = natsOptions_SetMaxReconnect(o, -1); /* forever */
    if (st == NATS_OK)
        st = natsOptions_SetCustomReconnectDelay(o, reconnect_delay, s);
    if (st == NATS_OK) /* 0 = nats.c's default (8 MiB) */
        st = natsOptions_SetReconnectBufSize(o, (int)rbuf);
    if (st == NATS_OK)
        st = natsOptions_SetDisconnectedCB(o, on_disconnected, s);
    if (st == NATS_OK)
        st = natsOptions_SetReconnectedCB(o, on_reconnected, s);
    if (st == NATS_OK)
        st = natsOptions_SetClosedCB(o, on_closed, s);
    if (st == NATS_OK)
        st = natsOptions_SetErrorHandler(o, on_error, s);
    if (st == NATS_OK) /* every publish asks for a write (see "I/O") */
        st = natsOptions_SetSendAsap(o, true);
    if (st == NATS_OK)
        st = natsOptions_SetEventLoop(o, s, evl_attach, evl_read, evl_write, evl_detach);
    if (st == NATS_OK)
        st = set_security(s, cfg);
    return st;
}

static int start_rebuild_thread(struct kvb_sink *s)
{
    sigset_t all, old;
    sigfillset(&all);
    /* the loop takes its signals through a signalfd: keep them off this thread */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&s->rb_thread, NULL, rebuild_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == 0)
        s->rb_started = true;
    return -rc;
}

/* create(), JetStream: a context for the connection, then the stream check
 * (creation) when connected.  Errors that trying again cannot mend fail at
 * once (-EACCES); the others are retried until DEADLINE (then -EACCES, or
 * -ETIMEDOUT when JetStream never answered), or, without a deadline, left to
 * the worker. */
static int js_start(struct kvb_sink *s, uint64_t deadline, uint32_t timeout_ms)
{
    char why[512];
    bool transient;
    if (s->conn && js_new(s, s->conn, &s->js) != NATS_OK)
        return -ENOMEM;
    if (!s->conn || atomic_load(&s->state) != ST_CONNECTED) {
        s->js_setup_due = true; /* the worker, once connected */
        return 0;
    }
    for (;;) {
        uint64_t now = kvb_mono_ms();
        int64_t wait = s->js_ack_timeout_ms;
        if (deadline && (int64_t)(deadline > now ? deadline - now : 1) < wait)
            wait = (int64_t)(deadline > now ? deadline - now : 1);
        int rc = js_setup_once(s, s->js, wait, why, sizeof(why), &transient);
        if (rc == 0)
            return 0;
        if (!transient) {
            kvb_err(STAGE, "JetStream: %s", why);
            return -EACCES;
        }
        if (!deadline) {
            kvb_warn(STAGE, "JetStream: %s; retrying in the background (nats."
                            "connect_timeout_ms is 0), publishes wait",
                     why);
            s->js_setup_due = true;
            s->js_setup_after = kvb_mono_ms() + JS_SETUP_RETRY_MS;
            return 0;
        }
        if (kvb_mono_ms() + JS_START_RETRY_MS >= deadline) {
            kvb_err(STAGE, "JetStream: %s (still after nats.connect_timeout_ms, %" PRIu32
                           " ms)",
                    why, timeout_ms);
            return rc;
        }
        sleep_ms(JS_START_RETRY_MS);
    }
}

int kvb_sink_create(const struct kvb_config *cfg, struct kvb_metrics *m, int wake_fd,
                    struct kvb_sink **out)
{
    struct kvb_sink *s = NULL;
    natsConnection *nc = NULL;
    natsStatus st;
    pthread_condattr_t ca;
    char why[512];
    uint64_t deadline = 0;
    int rc;

    if (!cfg || !out || !cfg->nats.servers || cfg->nats.n_servers == 0 ||
        cfg->nats.n_servers > INT_MAX)
        return -EINVAL;
    for (size_t i = 0; i < cfg->nats.n_servers; i++)
        if (!cfg->nats.servers[i] || !cfg->nats.servers[i][0])
            return -EINVAL;

    s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    if (pthread_condattr_init(&ca) != 0) {
        free(s);
        return -ENOMEM;
    }
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    rc = pthread_cond_init(&s->rb_cond, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0) {
        free(s);
        return -rc;
    }
    if (pthread_condattr_init(&ca) != 0) {
        pthread_cond_destroy(&s->rb_cond);
        free(s);
        return -ENOMEM;
    }
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    rc = pthread_cond_init(&s->ack_cond, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0) {
        pthread_cond_destroy(&s->rb_cond);
        free(s);
        return -rc;
    }
    pthread_mutex_init(&s->ack_mu, NULL);
    pthread_mutex_init(&s->rb_mu, NULL);
    pthread_mutex_init(&s->conn_mu, NULL);
    pthread_mutex_init(&s->evl_mu, NULL);
    pthread_cond_init(&s->evl_cond, NULL);
    atomic_init(&s->owner_write, false);
    atomic_init(&s->defer, false);
    s->owner = pthread_self();
    s->io_wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->io_wake < 0 || (rc = start_io_thread(s)) < 0) {
        rc = s->io_wake < 0 ? -errno : rc;
        kvb_err(STAGE, "cannot start the NATS I/O thread: %s", strerror(-rc));
        goto fail;
    }
    s->m = m;
    s->wake_fd = wake_fd;
    s->flush_timeout_ms = cfg->nats.flush_timeout_ms;
    s->wait_ms = cfg->nats.reconnect_wait_ms;
    s->wait_max_ms = cfg->nats.reconnect_wait_max_ms;
    s->full_bytes = cfg->nats.reconnect_buffer_bytes ? cfg->nats.reconnect_buffer_bytes
                                                     : 8u << 20; /* nats.c's default */
    s->rng = (uint32_t)(kvb_mono_ms() ^ ((uintptr_t)s >> 4) ^ ((uint32_t)getpid() << 16));
    if (s->rng == 0)
        s->rng = 0x9e3779b9u;
    s->rb_rng = s->rng ^ 0x5bd1e995u;
    if (s->rb_rng == 0)
        s->rb_rng = 0x9e3779b9u;
    s->rb_rl = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(REFUSAL_LOG_MS, REFUSAL_LOG_BURST);
    s->cb_rl = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(REFUSAL_LOG_MS, REFUSAL_LOG_BURST);
    atomic_init(&s->state, ST_INIT);
    atomic_init(&s->closing, false);
    atomic_init(&s->ever_connected, false);
    atomic_init(&s->conns, 0);
    atomic_init(&s->closed_cbs, 0);
    atomic_init(&s->outage_bytes, 0);
    /* Not the live sink until create succeeds (see owns_metrics()). */
    atomic_init(&s->live, false);
    atomic_init(&s->inflight, 0);
    atomic_init(&s->inflight_bytes, 0);
    atomic_init(&s->ack_cbs, 0);
    atomic_init(&s->ordered_hint, false);
    atomic_init(&s->probe, NULL);
    atomic_init(&s->ack_ok, false);
    if ((s->js_on = cfg->nats.jetstream.enabled)) {
        const char *st_name = cfg->nats.jetstream.stream_name;
        const char *sj_name = cfg->nats.jetstream.subject_name;
        if (!st_name || !*st_name || !sj_name || !*sj_name) {
            rc = -EINVAL; /* the config module resolves both */
            goto fail;
        }
        s->js_create = cfg->nats.jetstream.create;
        s->js_retention = cfg->nats.jetstream.retention;
        s->js_max_age_s = cfg->nats.jetstream.max_age_s;
        s->js_replicas = cfg->nats.jetstream.replicas ? cfg->nats.jetstream.replicas : 1;
        s->js_dup_window_s = cfg->nats.jetstream.duplicate_window_s;
        s->js_max_pending = cfg->nats.jetstream.max_pending ? cfg->nats.jetstream.max_pending
                                                            : 4096;
        s->js_ack_timeout_ms = cfg->nats.jetstream.ack_timeout_ms
                                   ? cfg->nats.jetstream.ack_timeout_ms : 5000;
        jsPubOptions_Init(&s->js_pubopts);
        s->js_pubopts.MaxWait = s->js_ack_timeout_ms;
        s->ack_rl = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(REFUSAL_LOG_MS, REFUSAL_LOG_BURST);
        s->js_byte_cap = s->full_bytes;
        s->js_stream = strdup(st_name);
        s->js_subject = strdup(sj_name);
        if (!s->js_stream || !s->js_subject) {
            rc = -ENOMEM;
            goto fail;
        }
    }

    st = natsOptions_Create(&s->opts);
    if (st == NATS_OK)
        st = set_options(s, cfg);
    if (st != NATS_OK) {
        if (st == NATS_NO_MEMORY) {
            rc = -ENOMEM;
        } else {
            last_error(st, why, sizeof(why));
            kvb_err(STAGE, "NATS options: %s", why);
            rc = -EINVAL; /* files the config module could read, but not use */
        }
        goto fail;
    }
    if (cfg->nats.tls.enabled && !cfg->nats.tls.verify)
        kvb_warn(STAGE, "NATS TLS: the server's certificate is not verified "
                        "(nats.tls.verify: false)");

    if (cfg->nats.connect_timeout_ms > 0)
        deadline = kvb_mono_ms() + cfg->nats.connect_timeout_ms;
    for (;;) {
        enum attempt r = connect_once(s, &nc, why, sizeof(why));
        s->conn = nc; /* no other thread uses it yet */
        if (r == ATT_FAILED) {
            kvb_err(STAGE, "NATS connect: %s", why);
            rc = -ENOMEM;
            goto fail;
        }
        if (r == ATT_REJECTED) {
            kvb_err(STAGE, "NATS server rejected the connection: %s", why);
            if (deadline) {
                rc = -EACCES;
                goto fail;
            }
            kvb_warn(STAGE, "retrying in the background (nats.connect_timeout_ms is 0); "
                            "publishes are refused meanwhile");
            pthread_mutex_lock(&s->rb_mu);
            s->rb_needed = true; /* for the thread, started below */
            pthread_mutex_unlock(&s->rb_mu);
            break;
        }
        if (r == ATT_CONNECTED) {
            atomic_store(&s->ever_connected, true);
            break;
        }
        /* pending: nats.c keeps trying */
        if (!deadline) {
            kvb_warn(STAGE, "NATS not reachable yet; retrying in the background, "
                            "publishes are buffered");
            break;
        }
        while (atomic_load(&s->state) != ST_CONNECTED &&
               atomic_load(&s->closed_cbs) != atomic_load(&s->conns)) {
            if (kvb_mono_ms() >= deadline) {
                kvb_err(STAGE, "no NATS server reachable within %" PRIu32 " ms",
                        cfg->nats.connect_timeout_ms);
                rc = -ETIMEDOUT;
                goto fail;
            }
            sleep_ms(5);
        }
        if (atomic_load(&s->closed_cbs) != atomic_load(&s->conns))
            break; /* connected */
        /* nats.c closed it: a server came up and refused us; ask again to
         * learn why (or to get through, if it changed its mind) */
        pthread_mutex_lock(&s->rb_mu);
        s->rb_needed = false; /* handled here */
        pthread_mutex_unlock(&s->rb_mu);
        set_conn(s, NULL, NULL);
    }

    if (s->js_on && (rc = js_start(s, deadline, cfg->nats.connect_timeout_ms)) < 0)
        goto fail;

    atomic_store(&s->live, true); /* callbacks may count, log and wake now */
    publish_gauge(s);
    if ((rc = start_rebuild_thread(s)) < 0) {
        kvb_err(STAGE, "cannot start a thread: %s", strerror(-rc));
        goto fail;
    }
    *out = s;
    return 0;

fail:
    sink_free(s);
    return rc;
}

void kvb_sink_destroy(struct kvb_sink **ps)
{
    if (!ps || !*ps)
        return;
    struct kvb_sink *s = *ps;
    *ps = NULL;
    kvb_sink_service(s);
    if (s->js_on) {
        if (s->flush_timeout_ms > 0 && atomic_load(&s->inflight) > 0) {
            int rc = kvb_sink_flush(s, s->flush_timeout_ms);
            if (rc < 0)
                kvb_warn(STAGE, "flush at shutdown: %s (%" PRIu64 " router event(s) not "
                                "acknowledged by JetStream)",
                         strerror(-rc), atomic_load(&s->inflight));
        }
        sink_free(s);
        return;
    }
    pthread_mutex_lock(&s->conn_mu);
    if (s->conn && atomic_load(&s->state) == ST_CONNECTED && s->flush_timeout_ms > 0) {
        natsStatus st = natsConnection_FlushTimeout(s->conn, s->flush_timeout_ms);
        if (st != NATS_OK)
            kvb_warn(STAGE, "flush at shutdown: %s", natsStatus_GetText(st));
    }
    pthread_mutex_unlock(&s->conn_mu);
    sink_free(s);
}

/* ---- hot path ---- */

static size_t digits(size_t v)
{
    size_t n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

/* JetStream: a message with its Nats-Msg-Id, published with an ack request;
 * nats.c owns it from then on (on_ack() gets it back). */
static int js_publish(struct kvb_sink *s, const char *subject, const void *data, size_t len,
                      const char *msg_id)
{
    natsMsg *msg = NULL;
    natsStatus st;
    uint64_t cost = (uint64_t)len + JS_MSG_OVERHEAD; /* == msg_cost(msg) */

    /* The hard bound: what is unacknowledged (at most max_pending before the
     * loop pauses, plus the events of what it had read by then) stays within
     * reconnect_buffer_bytes, as nats.c's buffer does in core mode. */
    if (atomic_load_explicit(&s->inflight_bytes, memory_order_relaxed) + cost > s->js_byte_cap)
        return -EAGAIN; /* like a full buffer */
    st = natsMsg_Create(&msg, subject, NULL, data, (int)len);
    if (st == NATS_OK && msg_id && *msg_id)
        st = natsMsgHeader_Set(msg, JS_MSG_ID_HDR, msg_id);
    if (st != NATS_OK) {
        natsMsg_Destroy(msg);
        return errno_of(st);
    }
    if (atomic_load(&s->ordered_hint) ||
        atomic_load_explicit(&s->state, memory_order_relaxed) != ST_CONNECTED) {
        /* Ordered: messages wait to be sent (again), or no server: queue up
         * behind them; the worker sends them in order.  Back to direct
         * publishes once the worker has sent them all and JetStream takes
         * publishes again (no probe out). */
        bool direct = false, queued = false;
        pthread_mutex_lock(&s->rb_mu);
        if (atomic_load(&s->state) == ST_CONNECTED) {
            if (s->ordered && !s->rq.len && !s->fq.len && !s->recover_due && !s->probing &&
                !s->sending)
                set_ordered(s, false);
            direct = !s->ordered;
        }
        if (!direct) {
            if ((queued = ring_push(&s->fq, slot_of(msg, false), false))) {
                atomic_fetch_add(&s->inflight_bytes, cost);
                atomic_fetch_add(&s->inflight, 1);
                set_ordered(s, true);
                pthread_cond_signal(&s->rb_cond);
            }
        }
        pthread_mutex_unlock(&s->rb_mu);
        if (!direct) {
            if (queued)
                return 0;
            natsMsg_Destroy(msg);
            return -ENOMEM;
        }
    }
    pthread_mutex_lock(&s->conn_mu);
    if (!s->conn || !s->js) {
        pthread_mutex_unlock(&s->conn_mu);
        natsMsg_Destroy(msg);
        return -EAGAIN;
    }
    atomic_fetch_add(&s->inflight_bytes, cost); /* before: its ack may come first */
    atomic_fetch_add(&s->inflight, 1);
    s->in_publish = true; /* js_publish runs on the loop thread only */
    st = js_PublishMsgAsync(s->js, &msg, &s->js_pubopts);
    s->in_publish = false;
    pthread_mutex_unlock(&s->conn_mu);
    if (st != NATS_OK) {
        if (msg) { /* not taken: ours to free, and not in flight */
            natsMsg_Destroy(msg);
            settle(s, cost);
        }
        int rc = errno_of(st);
        /* stalled, or no room in nats.c's reconnect buffer */
        return rc == -ETIMEDOUT ? -EAGAIN : rc == -ENOTCONN ? -EIO : rc;
    }
    return 0;
}

int kvb_sink_publish(struct kvb_sink *s, const char *subject, const void *data, size_t len)
{
    return kvb_sink_publish_id(s, subject, data, len, NULL);
}

int kvb_sink_publish_id(struct kvb_sink *s, const char *subject, const void *data,
                        size_t len, const char *msg_id)
{
    natsStatus st;
    int rc;

    if (!s || !subject || (!data && len)) {
        rc = -EINVAL;
        goto fail;
    }
    if (len > INT_MAX) {
        rc = -EMSGSIZE;
        goto fail;
    }
    if (s->js_on) {
        if ((rc = js_publish(s, subject, data, len, msg_id)) < 0)
            goto fail;
        return 0;
    }
    pthread_mutex_lock(&s->conn_mu);
    if (!s->conn || atomic_load_explicit(&s->state, memory_order_relaxed) == ST_CLOSED) {
        pthread_mutex_unlock(&s->conn_mu);
        rc = -EAGAIN; /* no connection to buffer into: like a full buffer */
        goto fail;
    }
    s->in_publish = true;
    st = natsConnection_Publish(s->conn, subject, data, (int)len);
    s->in_publish = false;
    pthread_mutex_unlock(&s->conn_mu);
    if (st != NATS_OK) {
        rc = errno_of(st);
        if (rc == -ENOTCONN || rc == -ETIMEDOUT)
            rc = -EIO;
        goto fail;
    }
    if (atomic_load_explicit(&s->state, memory_order_relaxed) != ST_CONNECTED) {
        /* "PUB <subject> <len>\r\n<data>\r\n" went to the reconnect buffer. */
        uint64_t n = 4 + strlen(subject) + 1 + digits(len) + 2 + len + 2;
        atomic_fetch_add_explicit(&s->outage_bytes, n, memory_order_relaxed);
    }
    return 0;

fail:
    if (s && s->m)
        kvb_inc(&s->m->nats_publish_errors_total[0]);
    return rc;
}

bool kvb_sink_connected(const struct kvb_sink *s)
{
    return s && atomic_load(&((struct kvb_sink *)s)->state) == ST_CONNECTED;
}

uint64_t kvb_sink_pending_bytes(const struct kvb_sink *s)
{
    struct kvb_sink *w = (struct kvb_sink *)s; /* atomics, the lock, win_full */
    uint64_t n = 0;
    int b = 0;

    if (!s)
        return 0;
    pthread_mutex_lock(&w->conn_mu);
    bool closed = !w->conn || atomic_load(&w->state) == ST_CLOSED;
    if (!closed)
        b = natsConnection_Buffered(w->conn);
    pthread_mutex_unlock(&w->conn_mu);
    if (closed) {
        n = s->full_bytes; /* nothing can be buffered: report the buffer as full */
    } else {
        if (b > 0)
            n = (uint64_t)b;
        if (atomic_load(&w->state) != ST_CONNECTED)
            n += atomic_load(&w->outage_bytes);
    }
    if (s->js_on) {
        /* The ack window, with hysteresis: full from 3/4 of max_pending until
         * it is down to 1/2 (the loop pauses on "full"; the last quarter is
         * room for the events of the batches it already read). */
        uint64_t inflight = atomic_load(&w->inflight);
        uint64_t bytes = atomic_load(&w->inflight_bytes);
        if (w->win_full && inflight <= s->js_max_pending / 2 && bytes <= s->js_byte_cap / 2) {
            w->win_full = false;
            kvb_info(STAGE, "JetStream: %" PRIu64 " publish(es) unacknowledged, the ack "
                            "window has room again",
                     inflight);
        } else if (!w->win_full && (inflight >= (uint64_t)s->js_max_pending / 4 * 3 ||
                                    bytes >= s->js_byte_cap / 4 * 3)) {
            w->win_full = true;
            kvb_warn(STAGE, "JetStream: %" PRIu64 " publishes (about %" PRIu64 " bytes) "
                            "unacknowledged, 3/4 of nats.jetstream.max_pending or of "
                            "nats.reconnect_buffer_bytes: reported as a full buffer",
                     inflight, bytes);
        }
        if (w->win_full && n < s->full_bytes)
            n = s->full_bytes;
        if (s->m)
            atomic_store_explicit(&s->m->jetstream_pending[0], inflight, memory_order_relaxed);
    }
    if (s->m)
        atomic_store_explicit(&s->m->nats_pending_bytes[0], n, memory_order_relaxed);
    return n;
}

/* JetStream: every publish so far acknowledged (or given up). */
static int js_flush(struct kvb_sink *s, uint32_t timeout_ms)
{
    struct timespec until = kvb_mono_deadline(timeout_ms);
    int rc = 0;
    pthread_mutex_lock(&s->ack_mu);
    while (atomic_load(&s->inflight) > 0 && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&s->ack_cond, &s->ack_mu, &until);
    pthread_mutex_unlock(&s->ack_mu);
    return atomic_load(&s->inflight) > 0 ? -ETIMEDOUT : 0;
}

int kvb_sink_flush(struct kvb_sink *s, uint32_t timeout_ms)
{
    natsStatus st;

    if (!s)
        return -EINVAL;
    kvb_sink_service(s); /* what this turn published, before waiting */
    pthread_mutex_lock(&s->conn_mu);
    if (!s->conn || atomic_load(&s->state) != ST_CONNECTED) {
        pthread_mutex_unlock(&s->conn_mu);
        return -ENOTCONN;
    }
    if (s->js_on) {
        pthread_mutex_unlock(&s->conn_mu);
        return js_flush(s, timeout_ms ? timeout_ms : 1);
    }
    st = natsConnection_FlushTimeout(s->conn, timeout_ms ? (int64_t)timeout_ms : 1);
    pthread_mutex_unlock(&s->conn_mu);
    return errno_of(st);
}

uint64_t kvb_sink_losses(const struct kvb_sink *s)
{
    return s ? atomic_load(&((struct kvb_sink *)s)->losses) : 0;
}
