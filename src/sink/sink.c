/* sink: router events out to NATS through nats.c, the core: create and
 * destroy, connecting, nats.c's connection callbacks, publish, pending
 * bytes, flush.  See include/sink.h for the contract, sink_priv.h for the
 * other parts (io.c, jetstream.c, options.c) and the locks; this file
 * owns conn_mu and the worker's rb_mu.
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
 */
#include "sink_priv.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "config.h"
#include "metrics.h"
#include "url.h"

/* ---- callbacks (nats.c threads) ---- */

static void set_connected_gauge(struct kvb_sink *s, uint64_t v)
{
    if (kvb_sink_owns_metrics(s))
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
    if (!v) /* nats.c may be shaking hands from now on */
        kvb_sink_guard_kick(s);
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
    if (kvb_sink_owns_metrics(s))
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
    kvb_sink_guard_connected(s);
    set_state(s, ST_CONNECTED);
    if (atomic_load(&s->live))
        kvb_info(STAGE, "connected to NATS");
    if (s->js_on)
        kvb_sink_kick_worker(s); /* stream check, resends */
    kvb_sink_wake(s);
}

static void on_reconnected(natsConnection *nc, void *closure)
{
    struct kvb_sink *s = closure;
    count_reconnect(s);
    atomic_store(&s->outage_bytes, 0);
    kvb_sink_guard_connected(s);
    set_state(s, ST_CONNECTED);
    if (atomic_load(&s->live)) {
        char url[256];
        char *shown = natsConnection_GetConnectedUrl(nc, url, sizeof(url)) == NATS_OK
                          ? kvb_url_redacted(url, "nats", "***")
                          : NULL;
        kvb_info(STAGE, "reconnected to NATS at %s", shown ? shown : "?");
        free(shown);
    }
    if (s->js_on) /* what was in flight when the server went: send it again */
        kvb_sink_js_reconnected(s);
    kvb_sink_wake(s);
}

static void on_disconnected(natsConnection *nc, void *closure)
{
    struct kvb_sink *s = closure;
    (void)nc;
    if (kvb_sink_owns_metrics(s)) /* not for our own close */
        kvb_inc(&s->m->nats_disconnects_total[0]);
    if (s->js_on) /* from now on publishes queue up (and keep their order) */
        kvb_sink_js_disconnected(s);
    kvb_sink_guard_lost(s); /* nats.c attempts to reconnect from now on */
    set_state(s, ST_DISCONNECTED);
    if (atomic_load(&s->live))
        kvb_warn(STAGE, "disconnected from NATS, reconnecting (publishes are buffered)");
    kvb_sink_wake(s);
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
            kvb_err(STAGE,
                    "NATS connection closed by the client library (%s); opening "
                    "a new one, publishes are refused meanwhile",
                    txt && *txt ? txt : natsStatus_GetText(st));
        }
        /* its reconnect buffer is gone, a loss when anything was published
         * into it (JetStream: the worker takes the unacknowledged back) */
        if (!s->js_on && atomic_load(&s->outage_bytes) > 0) {
            kvb_sink_lost(s, NULL);
            atomic_fetch_add(&s->losses, 1);
        }
        pthread_mutex_lock(&s->rb_mu);
        s->rb_needed = true;
        pthread_cond_signal(&s->rb_cond);
        pthread_mutex_unlock(&s->rb_mu);
        kvb_sink_wake(s);
    }
    /* Last touch of s: destroy may free it once every ClosedCB has run. */
    atomic_fetch_add(&s->closed_cbs, 1);
}

/* ---- connecting ---- */

enum attempt { ATT_CONNECTED, ATT_PENDING, ATT_REJECTED, ATT_FAILED, ATT_STALLED };

/* Destroy a connection (closed or not) that nothing else uses any more. */
static void conn_destroy(struct kvb_sink *s, natsConnection *nc)
{
    kvb_sink_io_forget(s, nc);
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
static enum attempt connect_once(struct kvb_sink *s, natsConnection **out, char *why, size_t cap,
                                 bool stall_fails)
{
    natsConnection *nc = NULL;
    int connecting = atomic_load(&s->ever_connected) ? ST_DISCONNECTED : ST_INIT;
    natsStatus st;

    *out = NULL;
    set_state(s, connecting);
    uint64_t stalls = atomic_load(&s->stalls);
    st = natsOptions_SetRetryOnFailedConnect(s->opts, false, NULL, NULL);
    kvb_sink_guard_attempt(s, kvb_mono_ms()); /* its sockets appear from now on */
    if (st == NATS_OK)
        st = natsConnection_Connect(&nc, s->opts);
    /* the guard cut a handshake that did not end (guard.c): the server
     * is there but does not answer, as good as unreachable */
    bool stalled = st != NATS_OK && atomic_load(&s->stalls) != stalls;
    if (stalled && stall_fails) {
        snprintf(why, cap,
                 "a server took the connection but never completed the NATS "
                 "handshake (no PONG)");
        set_state(s, ST_CLOSED);
        return ATT_STALLED;
    }
    if (st == NATS_OK) {
        atomic_fetch_add(&s->conns, 1);
        kvb_sink_guard_connected(s);
        atomic_compare_exchange_strong(&s->state, &connecting, ST_CONNECTED);
        publish_gauge(s);
        *out = nc;
        return ATT_CONNECTED;
    }
    if (!unreachable(st) && !stalled) {
        kvb_sink_last_error(st, why, cap);
        if (st == NATS_PROTOCOL_ERROR && strstr(why, "got ''"))
            snprintf(why + strlen(why), cap - strlen(why),
                     " (the server hung up: it may want a client certificate, "
                     "nats.tls.cert)");
        set_state(s, ST_CLOSED);
        return st == NATS_NO_MEMORY || st == NATS_SYS_ERROR ? ATT_FAILED : ATT_REJECTED;
    }
    /* Nobody answered: let nats.c keep trying, buffering publishes. */
    st = natsOptions_SetRetryOnFailedConnect(s->opts, true, on_connected, s);
    kvb_sink_guard_attempt(s, kvb_mono_ms());
    if (st == NATS_OK)
        st = natsConnection_Connect(&nc, s->opts);
    if (st == NATS_OK || st == NATS_NOT_YET_CONNECTED) {
        atomic_fetch_add(&s->conns, 1);
        if (st == NATS_OK) {
            kvb_sink_guard_connected(s);
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
    kvb_sink_last_error(st, why, cap);
    set_state(s, ST_CLOSED);
    return ATT_FAILED;
}

/* ---- request serving (kvb_sink_serve) ---- */

static void srv_on_msg(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    (void)sub;
    const struct kvb_sink_served *e = closure; /* fn is set before its subscription */
    e->fn(e->closure, nc, msg);
}

static void srv_on_complete(void *closure)
{
    struct kvb_sink *s = closure;
    atomic_fetch_sub(&s->srv_live, 1);
}

/* conn_mu held: drop one subscription (its callbacks end on their own). */
static void srv_drop_one(struct kvb_sink_served *e)
{
    if (!e->sub)
        return;
    natsSubscription_Unsubscribe(e->sub); /* a closed connection: already gone */
    natsSubscription_Destroy(e->sub);
    e->sub = NULL;
}

static void srv_drop(struct kvb_sink *s)
{
    for (int i = 0; i < KVB_SINK_SERVE_MAX; i++)
        srv_drop_one(&s->srv[i]);
}

/* conn_mu held: subscribe one served subject on the current connection. */
static int srv_subscribe_one(struct kvb_sink *s, struct kvb_sink_served *e)
{
    if (!e->subject || !s->conn || e->sub)
        return 0;
    natsSubscription *sub = NULL;
    natsStatus st = natsConnection_Subscribe(&sub, s->conn, e->subject, srv_on_msg, e);
    if (st == NATS_OK) {
        atomic_fetch_add(&s->srv_live, 1);
        if (natsSubscription_SetOnCompleteCB(sub, srv_on_complete, s) != NATS_OK)
            atomic_fetch_sub(&s->srv_live, 1); /* cannot happen on a fresh subscription */
        e->sub = sub;
        return 0;
    }
    kvb_warn(STAGE, "cannot subscribe to %s: %s", e->subject, natsStatus_GetText(st));
    return kvb_sink_errno(st);
}

static void srv_subscribe(struct kvb_sink *s)
{
    for (int i = 0; i < KVB_SINK_SERVE_MAX; i++)
        srv_subscribe_one(s, &s->srv[i]);
}

int kvb_sink_serve(struct kvb_sink *s, const char *subject, kvb_sink_request_fn fn, void *closure)
{
    char *subj = strdup(subject);
    if (!subj)
        return -ENOMEM;
    pthread_mutex_lock(&s->conn_mu);
    struct kvb_sink_served *e = NULL;
    for (int i = 0; i < KVB_SINK_SERVE_MAX && !e; i++)
        if (s->srv[i].subject && strcmp(s->srv[i].subject, subject) == 0)
            e = &s->srv[i];
    for (int i = 0; i < KVB_SINK_SERVE_MAX && !e; i++)
        if (!s->srv[i].subject)
            e = &s->srv[i];
    int rc = -ENOSPC;
    if (e) {
        srv_drop_one(e);
        free(e->subject);
        e->subject = subj;
        e->fn = fn;
        e->closure = closure;
        subj = NULL;
        rc = srv_subscribe_one(s, e);
    }
    pthread_mutex_unlock(&s->conn_mu);
    free(subj);
    return rc;
}

void kvb_sink_unserve(struct kvb_sink *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->conn_mu);
    srv_drop(s);
    for (int i = 0; i < KVB_SINK_SERVE_MAX; i++) {
        free(s->srv[i].subject);
        s->srv[i].subject = NULL;
    }
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
        kvb_sink_sleep_ms(1);
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

/* The worker, rb_mu held: sleep until nats.c closed the connection
 * (rb_needed), doing the JetStream work that falls due meanwhile, then wait
 * out the backoff (*DELAY, chosen now unless it was after the last
 * failure).  True: make a new connection; false: destroy stops the thread. */
static bool wait_for_rebuild(struct kvb_sink *s, int failures, uint64_t *delay)
{
    for (;;) {
        uint64_t at = 0;
        while (!s->rb_stop && !s->rb_needed && !kvb_sink_js_due(s, kvb_mono_ms(), &at)) {
            if (at)
                wait_until(s, at);
            else
                pthread_cond_wait(&s->rb_cond, &s->rb_mu);
        }
        if (s->rb_stop)
            return false;
        if (s->rb_needed)
            break;
        kvb_sink_js_work(s);
    }
    /* wait out the backoff (destroy interrupts it) */
    if (!*delay)
        *delay = kvb_sink_backoff_ms(s, failures + 1, &s->rb_rng);
    struct timespec until = kvb_mono_deadline(*delay);
    int rc = 0;
    while (!s->rb_stop && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&s->rb_cond, &s->rb_mu, &until);
    if (s->rb_stop)
        return false;
    s->rb_needed = false;
    *delay = 0;
    return true;
}

/* The worker, rb_mu not held: the closed connection (and its JetStream
 * context) replaced by a new one, when one can be made.  What connect_once()
 * said (a failed context: ATT_FAILED), why in WHY. */
static enum attempt replace_conn(struct kvb_sink *s, char *why, size_t cap)
{
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    wait_closed_cbs(s, CLOSE_WAIT_MS); /* the old connection's ClosedCB is done */
    if (s->js_on)
        kvb_sink_js_recover(s, s->js, "on the closed connection"); /* before js goes */
    set_conn(s, NULL, NULL);
    enum attempt r = connect_once(s, &nc, why, cap, false);
    if (r != ATT_CONNECTED && r != ATT_PENDING)
        return r;
    if (s->js_on && kvb_sink_js_new(s, nc, &js) != NATS_OK) {
        kvb_err(STAGE, "JetStream context: %s", natsStatus_GetText(NATS_NO_MEMORY));
        natsConnection_Close(nc); /* posts its ClosedCB: handled as a refusal */
        conn_destroy(s, nc);
        return ATT_FAILED;
    }
    set_conn(s, nc, js);
    if (s->js_on) /* the stream may be new to this server */
        kvb_sink_js_new_conn(s);
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
    kvb_sink_wake(s);
    return r;
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
    while (wait_for_rebuild(s, failures, &delay)) {
        pthread_mutex_unlock(&s->rb_mu);
        enum attempt r = replace_conn(s, why, sizeof(why));
        if (r == ATT_CONNECTED || r == ATT_PENDING) {
            failures = 0;
        } else {
            failures++;
            delay = kvb_sink_backoff_ms(s, failures + 1, &s->rb_rng);
            kvb_log_rl(&s->rb_rl, KVB_LOG_ERROR, STAGE,
                       "%s: %s (attempt %d; retrying in %" PRIu64 " ms)",
                       r == ATT_REJECTED ? "NATS server rejected the connection" : "NATS connect",
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
    kvb_sink_guard_hurry(s); /* the worker or nats.c may be in a handshake */
    if (s->rb_started) {
        pthread_mutex_lock(&s->rb_mu);
        s->rb_stop = true;
        pthread_cond_signal(&s->rb_cond);
        pthread_mutex_unlock(&s->rb_mu);
        pthread_join(s->rb_thread, NULL);
    }
    atomic_store(&s->closing, true);
    kvb_sink_unserve(s);
    if (!kvb_sink_js_close(s))
        return;
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
        kvb_sink_sleep_ms(1);
    conn_destroy(s, s->conn);
    kvb_sink_guard_stop(s); /* no connection left to shake hands */
    kvb_sink_io_stop(s);
    natsOptions_Destroy(s->opts);
    kvb_sink_js_free(s);
    if (s->seed) {
        explicit_bzero(s->seed, strlen(s->seed));
        free(s->seed);
    }
    pthread_cond_destroy(&s->ack_cond);
    pthread_mutex_destroy(&s->ack_mu);
    pthread_mutex_destroy(&s->order_mu);
    pthread_mutex_destroy(&s->lost_mu);
    pthread_cond_destroy(&s->rb_cond);
    pthread_mutex_destroy(&s->rb_mu);
    pthread_mutex_destroy(&s->conn_mu);
    pthread_cond_destroy(&s->evl_cond);
    pthread_mutex_destroy(&s->evl_mu);
    free(s);
}

static int start_rebuild_thread(struct kvb_sink *s)
{
    int rc = kvb_sink_thread_start(&s->rb_thread, rebuild_main, s);
    if (rc == 0)
        s->rb_started = true;
    return rc;
}

/* nats.c's connection callbacks (above). */
static natsStatus set_callbacks(struct kvb_sink *s, natsOptions *o)
{
    natsStatus st = natsOptions_SetDisconnectedCB(o, on_disconnected, s);
    if (st == NATS_OK)
        st = natsOptions_SetReconnectedCB(o, on_reconnected, s);
    if (st == NATS_OK)
        st = natsOptions_SetClosedCB(o, on_closed, s);
    if (st == NATS_OK)
        st = natsOptions_SetErrorHandler(o, on_error, s);
    return st;
}

/* A zeroed sink with its locks and condition variables, owned by this
 * thread (sink_free() takes it from here on): 0 or a negative errno. */
static int sink_alloc(struct kvb_sink **out)
{
    struct kvb_sink *s = calloc(1, sizeof(*s));
    int rc = s ? kvb_sink_cond_init(&s->rb_cond) : -ENOMEM;
    if (rc == 0 && (rc = kvb_sink_cond_init(&s->ack_cond)) < 0)
        pthread_cond_destroy(&s->rb_cond);
    if (rc < 0) {
        free(s);
        return rc;
    }
    pthread_mutex_init(&s->ack_mu, NULL);
    pthread_mutex_init(&s->order_mu, NULL);
    pthread_mutex_init(&s->lost_mu, NULL);
    pthread_mutex_init(&s->rb_mu, NULL);
    pthread_mutex_init(&s->conn_mu, NULL);
    pthread_mutex_init(&s->evl_mu, NULL);
    pthread_cond_init(&s->evl_cond, NULL);
    atomic_init(&s->owner_write, false);
    atomic_init(&s->defer, false);
    atomic_init(&s->guard_sigfd, -1);
    s->owner = pthread_self();
    *out = s;
    return 0;
}

/* The core's settings and state, before any connection. */
static void sink_init(struct kvb_sink *s, const struct kvb_config *cfg, struct kvb_metrics *m,
                      int wake_fd)
{
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
    /* Not the live sink until create succeeds (see kvb_sink_owns_metrics()). */
    atomic_init(&s->live, false);
    atomic_init(&s->inflight, 0);
    atomic_init(&s->inflight_bytes, 0);
    atomic_init(&s->ack_cbs, 0);
    atomic_init(&s->ordered_hint, false);
    atomic_init(&s->probe, NULL);
    atomic_init(&s->ack_ok, false);
}

/* s->opts: nats.c's callbacks, the event loop and what the config says.
 * 0, -ENOMEM, or -EINVAL (logged). */
static int make_options(struct kvb_sink *s, const struct kvb_config *cfg)
{
    char why[512];
    natsStatus st = natsOptions_Create(&s->opts);
    if (st == NATS_OK)
        st = set_callbacks(s, s->opts);
    if (st == NATS_OK)
        st = kvb_sink_io_options(s, s->opts);
    if (st == NATS_OK)
        st = kvb_sink_set_options(s, cfg);
    if (st == NATS_OK)
        return 0;
    if (st == NATS_NO_MEMORY)
        return -ENOMEM;
    kvb_sink_last_error(st, why, sizeof(why));
    kvb_err(STAGE, "NATS options: %s", why);
    return -EINVAL; /* files the config module could read, but not use */
}

/* create, nats.c trying in the background: wait until the connection is
 * up (1), nats.c closed it (0: a server came up and refused us), or the
 * DEADLINE passed (-ETIMEDOUT, logged). */
static int wait_pending(struct kvb_sink *s, const struct kvb_config *cfg, uint64_t deadline)
{
    while (atomic_load(&s->state) != ST_CONNECTED &&
           atomic_load(&s->closed_cbs) != atomic_load(&s->conns)) {
        if (kvb_mono_ms() >= deadline) {
            kvb_err(STAGE, "no NATS server reachable within %" PRIu32 " ms",
                    cfg->nats.connect_timeout_ms);
            return -ETIMEDOUT;
        }
        kvb_sink_sleep_ms(5);
    }
    return atomic_load(&s->closed_cbs) != atomic_load(&s->conns) ? 1 : 0;
}

/* create's first connection: connected, nats.c retrying in the background,
 * or refused and left to the worker (started later).  DEADLINE (monotonic
 * ms; 0: nats.connect_timeout_ms is 0) turns "not reachable in time" and
 * "refused" into failures.  0 or a negative errno (logged). */
static int first_connect(struct kvb_sink *s, const struct kvb_config *cfg, uint64_t deadline)
{
    char why[512];
    for (;;) {
        natsConnection *nc = NULL;
        enum attempt r = connect_once(s, &nc, why, sizeof(why), deadline != 0);
        s->conn = nc; /* no other thread uses it yet */
        switch (r) {
        case ATT_STALLED: /* only with a deadline */
            if (kvb_mono_ms() + s->guard_limit_ms >= deadline) {
                kvb_err(STAGE, "no NATS server answered within %" PRIu32 " ms: %s",
                        cfg->nats.connect_timeout_ms, why);
                return -ETIMEDOUT;
            }
            kvb_sink_sleep_ms(s->wait_ms);
            continue;
        case ATT_FAILED: kvb_err(STAGE, "NATS connect: %s", why); return -ENOMEM;
        case ATT_REJECTED:
            kvb_err(STAGE, "NATS server rejected the connection: %s", why);
            if (deadline)
                return -EACCES;
            kvb_warn(STAGE, "retrying in the background (nats.connect_timeout_ms is 0); "
                            "publishes are refused meanwhile");
            pthread_mutex_lock(&s->rb_mu);
            s->rb_needed = true; /* for the thread, started later */
            pthread_mutex_unlock(&s->rb_mu);
            return 0;
        case ATT_CONNECTED: atomic_store(&s->ever_connected, true); return 0;
        case ATT_PENDING: break; /* nats.c keeps trying */
        }
        if (!deadline) {
            kvb_warn(STAGE, "NATS not reachable yet; retrying in the background, "
                            "publishes are buffered");
            return 0;
        }
        int rc = wait_pending(s, cfg, deadline);
        if (rc != 0)
            return rc < 0 ? rc : 0;
        /* nats.c closed it: a server came up and refused us; ask again to
         * learn why (or to get through, if it changed its mind) */
        pthread_mutex_lock(&s->rb_mu);
        s->rb_needed = false; /* handled here */
        pthread_mutex_unlock(&s->rb_mu);
        set_conn(s, NULL, NULL);
    }
}

int kvb_sink_create(const struct kvb_config *cfg, struct kvb_metrics *m, int wake_fd,
                    struct kvb_sink **out)
{
    struct kvb_sink *s = NULL;
    uint64_t deadline = 0;
    int rc;

    if (!cfg || !out || !cfg->nats.servers || cfg->nats.n_servers == 0 ||
        cfg->nats.n_servers > INT_MAX)
        return -EINVAL;
    for (size_t i = 0; i < cfg->nats.n_servers; i++)
        if (!cfg->nats.servers[i] || !cfg->nats.servers[i][0])
            return -EINVAL;
    if ((rc = sink_alloc(&s)) < 0)
        return rc;
    if ((rc = kvb_sink_io_start(s)) < 0)
        goto fail;
    sink_init(s, cfg, m, wake_fd);
    if ((s->js_on = cfg->nats.jetstream.enabled) && (rc = kvb_sink_js_init(s, cfg)) < 0)
        goto fail;
    if ((rc = kvb_sink_guard_start(s, cfg)) < 0)
        goto fail;
    if ((rc = make_options(s, cfg)) < 0)
        goto fail;
    if (cfg->nats.tls.enabled && !cfg->nats.tls.verify)
        kvb_warn(STAGE, "NATS TLS: the server's certificate is not verified "
                        "(nats.tls.verify: false)");
    if (cfg->nats.connect_timeout_ms > 0)
        deadline = kvb_mono_ms() + cfg->nats.connect_timeout_ms;
    if ((rc = first_connect(s, cfg, deadline)) < 0)
        goto fail;
    if (s->js_on && (rc = kvb_sink_js_start(s, deadline, cfg->nats.connect_timeout_ms)) < 0)
        goto fail;

    atomic_store(&s->live, true); /* callbacks may count, log and wake now */
    publish_gauge(s);
    kvb_sink_guard_count(s); /* handshakes abandoned during create */
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

void kvb_sink_watch_signals(struct kvb_sink *s, int sigfd)
{
    if (s)
        atomic_store(&s->guard_sigfd, sigfd);
}

void kvb_sink_stopping(struct kvb_sink *s)
{
    if (s)
        kvb_sink_guard_hurry(s);
}

void kvb_sink_skip_final_flush(struct kvb_sink *s)
{
    if (s)
        s->flush_timeout_ms = 0; /* read by kvb_sink_destroy, on this thread */
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
                kvb_warn(STAGE,
                         "flush at shutdown: %s (%" PRIu64 " router event(s) not "
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

int kvb_sink_publish(struct kvb_sink *s, const char *subject, const void *data, size_t len)
{
    return kvb_sink_publish_id(s, subject, data, len, NULL);
}

int kvb_sink_publish_id(struct kvb_sink *s, const char *subject, const void *data, size_t len,
                        const char *msg_id)
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
        if ((rc = kvb_sink_js_publish(s, subject, data, len, msg_id)) < 0)
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
        rc = kvb_sink_errno(st);
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

int kvb_sink_publish_hdrs(struct kvb_sink *s, const char *subject, const void *data, size_t len,
                          const char *const *hdrs, size_t n_hdrs)
{
    natsMsg *msg = NULL;
    natsStatus st;
    int rc;
    size_t hlen = 12; /* "NATS/1.0\r\n" ... "\r\n" */

    if (!s || !subject || (!data && len) || (!hdrs && n_hdrs)) {
        rc = -EINVAL;
        goto fail;
    }
    if (s->js_on) {
        rc = -ENOTSUP; /* refused at config load */
        goto fail;
    }
    if (len > INT_MAX) {
        rc = -EMSGSIZE;
        goto fail;
    }
    st = natsMsg_Create(&msg, subject, NULL, data, (int)len);
    for (size_t i = 0; st == NATS_OK && i < n_hdrs; i++) {
        st = natsMsgHeader_Set(msg, hdrs[2 * i], hdrs[2 * i + 1]);
        hlen += strlen(hdrs[2 * i]) + 2 + strlen(hdrs[2 * i + 1]) + 2;
    }
    if (st != NATS_OK) {
        rc = kvb_sink_errno(st);
        goto fail;
    }
    pthread_mutex_lock(&s->conn_mu);
    if (!s->conn || atomic_load_explicit(&s->state, memory_order_relaxed) == ST_CLOSED) {
        pthread_mutex_unlock(&s->conn_mu);
        rc = -EAGAIN;
        goto fail;
    }
    s->in_publish = true;
    st = natsConnection_PublishMsg(s->conn, msg);
    s->in_publish = false;
    pthread_mutex_unlock(&s->conn_mu);
    natsMsg_Destroy(msg);
    msg = NULL;
    if (st != NATS_OK) {
        rc = kvb_sink_errno(st);
        if (rc == -ENOTCONN || rc == -ETIMEDOUT)
            rc = -EIO;
        goto fail;
    }
    if (atomic_load_explicit(&s->state, memory_order_relaxed) != ST_CONNECTED) {
        /* "HPUB <subject> <hlen> <total>\r\n<headers><data>\r\n" */
        uint64_t n =
            5 + strlen(subject) + 1 + digits(hlen) + 1 + digits(hlen + len) + 2 + hlen + len + 2;
        atomic_fetch_add_explicit(&s->outage_bytes, n, memory_order_relaxed);
    }
    return 0;

fail:
    natsMsg_Destroy(msg);
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
    if (s->js_on)
        n = kvb_sink_js_window(w, n);
    if (s->m)
        atomic_store_explicit(&s->m->nats_pending_bytes[0], n, memory_order_relaxed);
    return n;
}

uint64_t kvb_sink_unsent_bytes(const struct kvb_sink *s)
{
    struct kvb_sink *w = (struct kvb_sink *)s; /* atomics and the lock */
    int b = 0;

    if (!s)
        return 0;
    if (s->js_on) /* published, not acknowledged: sent or not, not stored yet */
        return atomic_load(&w->inflight_bytes);
    pthread_mutex_lock(&w->conn_mu);
    bool closed = !w->conn || atomic_load(&w->state) == ST_CLOSED;
    if (!closed)
        b = natsConnection_Buffered(w->conn);
    pthread_mutex_unlock(&w->conn_mu);
    if (closed)
        return 0; /* nothing buffered: what a closed connection held is a loss */
    uint64_t n = b > 0 ? (uint64_t)b : 0;
    if (atomic_load(&w->state) != ST_CONNECTED)
        n += atomic_load(&w->outage_bytes);
    return n;
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
        return kvb_sink_js_flush(s, timeout_ms ? timeout_ms : 1);
    }
    st = natsConnection_FlushTimeout(s->conn, timeout_ms ? (int64_t)timeout_ms : 1);
    pthread_mutex_unlock(&s->conn_mu);
    return kvb_sink_errno(st);
}

uint64_t kvb_sink_losses(const struct kvb_sink *s)
{
    return s ? atomic_load(&((struct kvb_sink *)s)->losses) : 0;
}
