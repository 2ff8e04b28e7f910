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
 */
#include "sink.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
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
/* How long destroy waits for nats.c's closed callback. */
#define CLOSE_WAIT_MS 10000

enum conn_state {
    ST_INIT = 0,     /* never connected yet */
    ST_CONNECTED,
    ST_DISCONNECTED, /* lost the server, nats.c is reconnecting */
    ST_CLOSED,
};

struct kvb_sink {
    natsConnection *conn;
    natsOptions *opts;
    struct kvb_metrics *m;   /* may be NULL */
    int wake_fd;             /* -1: none */
    uint32_t flush_timeout_ms;
    uint32_t wait_ms;        /* first reconnect delay */
    uint32_t wait_max_ms;    /* backoff ceiling */
    uint32_t rng;            /* xorshift32 state; reconnect thread only */

    _Atomic int state;            /* enum conn_state */
    atomic_bool live;             /* create succeeded, destroy not started:
                                   * callbacks count, log and wake only then */
    atomic_bool closed_seen;      /* nats.c's closed callback has run */
    _Atomic uint64_t outage_bytes; /* protocol bytes published while not connected */
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

static void on_connected(natsConnection *nc, void *closure)
{
    struct kvb_sink *s = closure;
    (void)nc;
    atomic_store(&s->outage_bytes, 0);
    set_state(s, ST_CONNECTED);
    if (atomic_load(&s->live))
        kvb_info(STAGE, "connected to NATS");
    wake(s);
}

static void on_reconnected(natsConnection *nc, void *closure)
{
    struct kvb_sink *s = closure;
    char url[256];
    if (owns_metrics(s))
        kvb_inc(&s->m->nats_reconnects_total[0]);
    atomic_store(&s->outage_bytes, 0);
    set_state(s, ST_CONNECTED);
    if (atomic_load(&s->live)) {
        if (natsConnection_GetConnectedUrl(nc, url, sizeof(url)) != NATS_OK)
            snprintf(url, sizeof(url), "?");
        kvb_info(STAGE, "reconnected to NATS at %s", url);
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

static void on_closed(natsConnection *nc, void *closure)
{
    struct kvb_sink *s = closure;
    (void)nc;
    set_state(s, ST_CLOSED);
    if (atomic_load(&s->live)) {
        kvb_err(STAGE, "NATS connection closed by the client library");
        wake(s);
    }
    /* Last touch of s: destroy may free it as soon as this is seen. */
    atomic_store(&s->closed_seen, true);
}

static uint32_t xorshift32(uint32_t *st)
{
    uint32_t x = *st;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *st = x;
}

/* Called by nats.c after each full pass over the server list that failed
 * (attempts = 1, 2, ...): wait_ms doubling up to wait_max_ms, minus up to 20%
 * jitter so a fleet of bridges does not reconnect in lockstep. */
static int64_t reconnect_delay(natsConnection *nc, int attempts, void *closure)
{
    struct kvb_sink *s = closure;
    uint64_t d = s->wait_ms >= 10 ? s->wait_ms : 10; /* never spin on refusals */
    uint64_t max = s->wait_max_ms > d ? s->wait_max_ms : d;
    (void)nc;
    for (int i = 1; i < attempts && d < max; i++)
        d *= 2;
    if (d > max)
        d = max;
    if (d >= 5)
        d -= xorshift32(&s->rng) % (d / 5 + 1);
    return (int64_t)d;
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

/* ---- lifecycle ---- */

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

static bool wait_closed_cb(struct kvb_sink *s, uint32_t ms)
{
    uint64_t deadline = now_ms() + ms;
    while (!atomic_load(&s->closed_seen)) {
        if (now_ms() >= deadline)
            return false;
        sleep_ms(1);
    }
    return true;
}

/* Free a sink in any state.  Callbacks may still be queued on nats.c's
 * callback thread; ClosedCB is the last, so wait for it.  If it never comes
 * (callback thread stuck), leak the sink rather than let a late callback
 * write into freed memory. */
static void sink_free(struct kvb_sink *s, bool cb_may_be_queued)
{
    if (!s)
        return;
    atomic_store(&s->live, false);
    if (s->conn) {
        natsConnection_Close(s->conn); /* joins nats.c's I/O and reconnect threads */
        cb_may_be_queued = true;
    }
    if (cb_may_be_queued && !wait_closed_cb(s, CLOSE_WAIT_MS)) {
        kvb_err(STAGE, "NATS closed callback did not run in %d ms; leaking the sink",
                CLOSE_WAIT_MS);
        return;
    }
    natsConnection_Destroy(s->conn);
    natsOptions_Destroy(s->opts);
    free(s);
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
    /* Always connect asynchronously on failure; create() itself bounds the
     * wait when connect_timeout_ms > 0. */
    if (st == NATS_OK)
        st = natsOptions_SetRetryOnFailedConnect(o, true, on_connected, s);
    if (st == NATS_OK && cfg->nats.credentials && cfg->nats.credentials[0])
        st = natsOptions_SetUserCredentialsFromFiles(o, cfg->nats.credentials, NULL);
    return st;
}

int kvb_sink_create(const struct kvb_config *cfg, struct kvb_metrics *m, int wake_fd,
                    struct kvb_sink **out)
{
    struct kvb_sink *s = NULL;
    natsStatus st;
    bool cb_queued = false;
    uint64_t t0;
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
    s->m = m;
    s->wake_fd = wake_fd;
    s->flush_timeout_ms = cfg->nats.flush_timeout_ms;
    s->wait_ms = cfg->nats.reconnect_wait_ms;
    s->wait_max_ms = cfg->nats.reconnect_wait_max_ms;
    s->rng = (uint32_t)(now_ms() ^ ((uintptr_t)s >> 4) ^ ((uint32_t)getpid() << 16));
    if (s->rng == 0)
        s->rng = 0x9e3779b9u;
    atomic_init(&s->state, ST_INIT);
    atomic_init(&s->closed_seen, false);
    atomic_init(&s->outage_bytes, 0);
    /* Not the live sink until create succeeds (see owns_metrics()). */
    atomic_init(&s->live, false);

    st = natsOptions_Create(&s->opts);
    if (st == NATS_OK)
        st = set_options(s, cfg);
    if (st != NATS_OK) {
        kvb_err(STAGE, "NATS options: %s", nats_GetLastError(NULL));
        rc = errno_of(st);
        goto fail;
    }

    t0 = now_ms();
    st = natsConnection_Connect(&s->conn, s->opts);
    if (st == NATS_OK) {
        /* Connected in the call: connectedCb will not run.  A disconnect may
         * already have been reported, hence the CAS and the re-check. */
        int expect = ST_INIT;
        atomic_compare_exchange_strong(&s->state, &expect, ST_CONNECTED);
    } else if (st == NATS_NOT_YET_CONNECTED) {
        if (cfg->nats.connect_timeout_ms > 0) {
            uint64_t deadline = t0 + cfg->nats.connect_timeout_ms;
            while (atomic_load(&s->state) != ST_CONNECTED) {
                if (atomic_load(&s->state) == ST_CLOSED) { /* nats.c gave up (auth) */
                    kvb_err(STAGE, "NATS connection closed while connecting");
                    rc = -ECONNREFUSED;
                    goto fail;
                }
                if (now_ms() >= deadline) {
                    kvb_err(STAGE, "no NATS server reachable within %" PRIu32 " ms",
                            cfg->nats.connect_timeout_ms);
                    rc = -ETIMEDOUT;
                    goto fail;
                }
                sleep_ms(5);
            }
        } else {
            kvb_warn(STAGE, "NATS not reachable yet; retrying in the background, "
                            "publishes are buffered");
        }
    } else {
        /* Only a failure to start the retry machinery gets here; nats.c has
         * then closed the connection and queued ClosedCB (no memory / no
         * thread).  Other failures happen before any callback can exist. */
        s->conn = NULL;
        cb_queued = (st == NATS_NO_MEMORY || st == NATS_SYS_ERROR);
        kvb_err(STAGE, "NATS connect: %s", nats_GetLastError(NULL));
        rc = errno_of(st);
        goto fail;
    }

    atomic_store(&s->live, true); /* callbacks may count, log and wake now */
    publish_gauge(s);
    *out = s;
    return 0;

fail:
    sink_free(s, cb_queued);
    return rc;
}

void kvb_sink_destroy(struct kvb_sink **ps)
{
    if (!ps || !*ps)
        return;
    struct kvb_sink *s = *ps;
    *ps = NULL;
    if (s->conn && atomic_load(&s->state) == ST_CONNECTED && s->flush_timeout_ms > 0) {
        natsStatus st = natsConnection_FlushTimeout(s->conn, s->flush_timeout_ms);
        if (st != NATS_OK)
            kvb_warn(STAGE, "flush at shutdown: %s", natsStatus_GetText(st));
    }
    sink_free(s, false);
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
    st = natsConnection_Publish(s->conn, subject, data, (int)len);
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
    struct kvb_sink *w = (struct kvb_sink *)s; /* atomics only */
    uint64_t n = 0;
    int b;

    if (!s || !s->conn)
        return 0;
    b = natsConnection_Buffered(s->conn);
    if (b > 0)
        n = (uint64_t)b;
    if (atomic_load(&w->state) != ST_CONNECTED)
        n += atomic_load(&w->outage_bytes);
    if (s->m)
        atomic_store_explicit(&s->m->nats_pending_bytes[0], n, memory_order_relaxed);
    return n;
}

int kvb_sink_flush(struct kvb_sink *s, uint32_t timeout_ms)
{
    natsStatus st;

    if (!s || !s->conn)
        return -EINVAL;
    if (atomic_load(&s->state) != ST_CONNECTED)
        return -ENOTCONN;
    st = natsConnection_FlushTimeout(s->conn, timeout_ms ? (int64_t)timeout_ms : 1);
    return errno_of(st);
}
