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
 * - While connected, publish appends to a 32 KiB write buffer that the flusher
 *   thread sends about 1 ms later; when that buffer is full, publish writes to
 *   the socket itself (blocking: no write deadline is set).
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

#include <nats/nats.h>

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
    _Atomic uint64_t losses;      /* connections nats.c gave up with data buffered */
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

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

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
    wake(s);
}

static void on_disconnected(natsConnection *nc, void *closure)
{
    struct kvb_sink *s = closure;
    (void)nc;
    if (owns_metrics(s)) /* not for our own close */
        kvb_inc(&s->m->nats_disconnects_total[0]);
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
        atomic_fetch_add(&s->losses, 1); /* its reconnect buffer is gone */
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

/* ---- connecting ---- */

enum attempt { ATT_CONNECTED, ATT_PENDING, ATT_REJECTED, ATT_FAILED };

/* A server that is merely not there (nats.c keeps trying those). */
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

/* Swap in a new connection (NULL: none); the old one is closed already. */
static void set_conn(struct kvb_sink *s, natsConnection *nc)
{
    natsConnection *old;
    pthread_mutex_lock(&s->conn_mu);
    old = s->conn;
    s->conn = nc;
    pthread_mutex_unlock(&s->conn_mu);
    natsConnection_Destroy(old);
}

/* Every ClosedCB posted so far has run (bounded wait). */
static bool wait_closed_cbs(struct kvb_sink *s, uint32_t ms)
{
    uint64_t deadline = now_ms() + ms;
    while (atomic_load(&s->closed_cbs) != atomic_load(&s->conns)) {
        if (now_ms() >= deadline)
            return false;
        sleep_ms(1);
    }
    return true;
}

/* The rebuild thread: sleeps until nats.c closes the connection (rb_needed),
 * then makes new ones with the reconnect backoff until one is accepted.
 * Only this thread touches opts once create has returned. */
static void *rebuild_main(void *arg)
{
    struct kvb_sink *s = arg;
    int failures = 0;
    uint64_t delay = 0; /* the next backoff, once chosen */
    char why[512];

    pthread_mutex_lock(&s->rb_mu);
    for (;;) {
        while (!s->rb_stop && !s->rb_needed)
            pthread_cond_wait(&s->rb_cond, &s->rb_mu);
        if (s->rb_stop)
            break;
        /* wait out the backoff (destroy interrupts it) */
        if (!delay)
            delay = backoff_ms(s, failures + 1, &s->rb_rng);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += (time_t)(delay / 1000);
        until.tv_nsec += (long)(delay % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
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
        set_conn(s, NULL);
        enum attempt r = connect_once(s, &nc, why, sizeof(why));
        if (r == ATT_CONNECTED || r == ATT_PENDING) {
            set_conn(s, nc);
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
    if (s->conn)
        natsConnection_Close(s->conn); /* joins nats.c's I/O and reconnect threads */
    if (!wait_closed_cbs(s, CLOSE_WAIT_MS)) {
        kvb_err(STAGE, "NATS closed callback did not run in %d ms; leaking the sink",
                CLOSE_WAIT_MS);
        return;
    }
    natsConnection_Destroy(s->conn);
    natsOptions_Destroy(s->opts);
    if (s->seed) {
        explicit_bzero(s->seed, strlen(s->seed));
        free(s->seed);
    }
    pthread_cond_destroy(&s->rb_cond);
    pthread_mutex_destroy(&s->rb_mu);
    pthread_mutex_destroy(&s->conn_mu);
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
    pthread_mutex_init(&s->rb_mu, NULL);
    pthread_mutex_init(&s->conn_mu, NULL);
    s->m = m;
    s->wake_fd = wake_fd;
    s->flush_timeout_ms = cfg->nats.flush_timeout_ms;
    s->wait_ms = cfg->nats.reconnect_wait_ms;
    s->wait_max_ms = cfg->nats.reconnect_wait_max_ms;
    s->full_bytes = cfg->nats.reconnect_buffer_bytes ? cfg->nats.reconnect_buffer_bytes
                                                     : 8u << 20; /* nats.c's default */
    s->rng = (uint32_t)(now_ms() ^ ((uintptr_t)s >> 4) ^ ((uint32_t)getpid() << 16));
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
        deadline = now_ms() + cfg->nats.connect_timeout_ms;
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
            if (now_ms() >= deadline) {
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
        set_conn(s, NULL);
    }

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
    pthread_mutex_lock(&s->conn_mu);
    if (!s->conn || atomic_load_explicit(&s->state, memory_order_relaxed) == ST_CLOSED) {
        pthread_mutex_unlock(&s->conn_mu);
        rc = -EAGAIN; /* no connection to buffer into: like a full buffer */
        goto fail;
    }
    st = natsConnection_Publish(s->conn, subject, data, (int)len);
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
    struct kvb_sink *w = (struct kvb_sink *)s; /* atomics and the lock only */
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
    if (s->m)
        atomic_store_explicit(&s->m->nats_pending_bytes[0], n, memory_order_relaxed);
    return n;
}

int kvb_sink_flush(struct kvb_sink *s, uint32_t timeout_ms)
{
    natsStatus st;

    if (!s)
        return -EINVAL;
    pthread_mutex_lock(&s->conn_mu);
    if (!s->conn || atomic_load(&s->state) != ST_CONNECTED) {
        pthread_mutex_unlock(&s->conn_mu);
        return -ENOTCONN;
    }
    st = natsConnection_FlushTimeout(s->conn, timeout_ms ? (int64_t)timeout_ms : 1);
    pthread_mutex_unlock(&s->conn_mu);
    return errno_of(st);
}

uint64_t kvb_sink_losses(const struct kvb_sink *s)
{
    return s ? atomic_load(&((struct kvb_sink *)s)->losses) : 0;
}
