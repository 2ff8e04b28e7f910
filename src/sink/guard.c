/* sink guard: abandon NATS connection attempts whose handshake never ends.
 *
 * nats.c before its PR #707 (January 2024: 3.7 and older, Debian's 3.4.1
 * included) reads the server's answer to its first PING with _readProto(),
 * which only leaves its loop on a byte '\n' or on the connection's end: once
 * the attempt's deadline has passed, every read fails at once with a timeout
 * and the loop spins, appending a byte per turn to a buffer that grows until
 * memory runs out (nats.c issue #706).  A server that sends INFO and never answers
 * PONG (a wedged server, a proxy, an attacker) thus keeps a thread at 100%
 * CPU forever: at start the thread of natsConnection_Connect (the loop's),
 * at a reconnect nats.c's reconnect thread, which holds the connection's
 * lock meanwhile, so that every publish of the loop waits for it too.
 *
 * The only way out of that loop is the end of the connection: a read of 0
 * bytes.  So this thread watches the sockets nats.c is shaking hands on: a
 * TCP socket of this process whose peer port is one of nats.servers' ports,
 * that is not an accepted connection (its local port is not one we listen
 * on), not attached to the sink's I/O thread (nats.c attaches a socket once
 * its handshake is done), that was not there when the sink was created
 * (another sink's, during a reload) and that appeared during a connection
 * attempt of the sink (ours(): the attempt's start is noted by connect_once,
 * by nats.c's reconnect delay callback and at a disconnect; connected, there
 * is none).  Once such a socket has been seen for
 * longer than the attempt's timeout (CONNECT_ATTEMPT_MS or
 * connect_timeout_ms, the deadline nats.c itself would have given up at)
 * plus a grace, and its traffic (TCP_INFO) shows that the client spoke last,
 * at least that timeout ago, with no answer since (a working connection of
 * someone else in the process, e.g. a test's subscriber, has the server speak
 * last), the guard shuts it down (shutdown(2): nats.c still owns and closes
 * the descriptor).  nats.c's read then ends, the attempt fails as any
 * failed handshake does ("expected PONG"), and nats.c goes on to the next
 * server or attempt.  Each one is counted (nats_connect_stalls_total) and
 * logged (rate-limited).  With a nats.c that does not spin the attempt ends
 * at its deadline by itself and the guard never acts.
 *
 * When destroy or the daemon's stop starts (kvb_sink_guard_hurry), and
 * whenever a signal waits on the loop's signalfd (kvb_sink_watch_signals), it
 * no longer waits for the attempt's timeout: a handshake unanswered for
 * GUARD_TICK_MS is cut at once.  nats.c holds its connection's lock through
 * a reconnection's handshake, so the loop thread, publishing, waits on that
 * lock and cannot read its signalfd: cutting the handshake frees it, and
 * SIGTERM is seen within a tick instead of after the attempt's timeout (a
 * server that answers the PING, however late, would otherwise hold it that
 * long at every attempt).
 *
 * The guard never calls nats.c (it must run while nats.c is stuck), sleeps
 * while the sink is connected (set_state kicks it) and looks every
 * GUARD_TICK_MS otherwise.  It owns guard_mu; its tables are its own.
 */
#include "sink_priv.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

#include "clock.h"
#include "config.h"
#include "metrics.h"
#include "url.h"

#define GUARD_TICK_MS 100
#define GUARD_GRACE_MS 250
#define GUARD_LOG_MS 30000
#define GUARD_LOG_BURST 5

/* A server URL's port, 4222 (nats.c's default) when it names none; 0 when
 * it does not parse. */
static uint16_t url_port(const char *url)
{
    struct kvb_url u;
    if (kvb_url_parse(url, "nats", &u, NULL) < 0)
        return 0;
    uint16_t port = u.port ? u.port : 4222;
    kvb_url_free(&u);
    return port;
}

static uint16_t sock_port(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET)
        return ntohs(((const struct sockaddr_in *)ss)->sin_port);
    if (ss->ss_family == AF_INET6)
        return ntohs(((const struct sockaddr_in6 *)ss)->sin6_port);
    return 0;
}

static bool has_ino(const ino_t *v, size_t n, ino_t ino)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == ino)
            return true;
    return false;
}

struct sockinfo {
    int fd;
    ino_t ino;
    bool listening;
    uint16_t local, peer; /* ports; peer 0: not connected */
    struct sockaddr_storage peer_addr;
};

/* Every TCP socket of the process (at most MAX); returns the count. */
static size_t list_sockets(struct sockinfo *out, size_t max)
{
    size_t n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return 0;
    int dfd = dirfd(d);
    for (struct dirent *de; n < max && (de = readdir(d));) {
        char *end;
        long fd = strtol(de->d_name, &end, 10);
        struct stat st;
        int type = 0, acc = 0;
        socklen_t l = sizeof(type);
        if (*end || end == de->d_name || fd == dfd || fstat((int)fd, &st) < 0 ||
            !S_ISSOCK(st.st_mode) || getsockopt((int)fd, SOL_SOCKET, SO_TYPE, &type, &l) < 0 ||
            type != SOCK_STREAM)
            continue;
        struct sockinfo *si = &out[n];
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        memset(si, 0, sizeof(*si));
        si->fd = (int)fd;
        si->ino = st.st_ino;
        l = sizeof(acc);
        si->listening = getsockopt((int)fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &l) == 0 && acc;
        if (getsockname((int)fd, (struct sockaddr *)&ss, &sl) == 0)
            si->local = sock_port(&ss);
        sl = sizeof(si->peer_addr);
        if (!si->listening && getpeername((int)fd, (struct sockaddr *)&si->peer_addr, &sl) == 0)
            si->peer = sock_port(&si->peer_addr);
        if (si->local || si->peer)
            n++;
    }
    closedir(d);
    return n;
}

#define GUARD_MAX_SOCKS 256

/* The sockets that may be a NATS handshake of ours: connected to a server
 * port, not accepted by one of our listeners.  Fills OUT (GUARD_MAX_SOCKS). */
static size_t nats_sockets(struct kvb_sink *s, struct sockinfo *out)
{
    static const size_t max = GUARD_MAX_SOCKS;
    size_t n = list_sockets(out, max), k = 0;
    for (size_t i = 0; i < n; i++) {
        bool server = false, accepted = false;
        for (size_t j = 0; j < s->n_guard_ports && out[i].peer; j++)
            server = server || out[i].peer == s->guard_ports[j];
        for (size_t j = 0; j < n && server; j++)
            accepted = accepted || (out[j].listening && out[j].local == out[i].local);
        if (server && !accepted)
            out[k++] = out[i];
    }
    return k;
}

/* The socket's traffic says "handshake without an answer": we spoke last
 * (CONNECT and PING), at least ATTEMPT_MS ago, and the server has been silent
 * since.  A working connection (a subscriber, a client waiting for replies)
 * has the server speak last; a publisher that sends all the time spoke last
 * a moment ago.  TCP_INFO counts in jiffies: a reply that came within the
 * tick of the request reads as "at the same time", as does a CONNECT sent
 * within the tick of the INFO it answers, hence ">=" (a handshake must not
 * escape), and hence ours(): an idle client whose last PING got its PONG
 * at once looks unanswered too, so only sockets of the sink's own attempt
 * are judged. */
static bool unanswered(int fd, uint32_t attempt_ms)
{
    struct tcp_info ti;
    socklen_t l = sizeof(ti);
    memset(&ti, 0, sizeof(ti));
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &l) < 0)
        return false;
    return ti.tcpi_last_data_sent >= attempt_ms && ti.tcpi_last_data_recv >= ti.tcpi_last_data_sent;
}

/* The guard's thread only: shut down SI's socket (still that socket). */
static void abandon(struct kvb_sink *s, const struct sockinfo *si, uint64_t age)
{
    struct stat st;
    if (fstat(si->fd, &st) < 0 || st.st_ino != si->ino)
        return; /* closed meanwhile */
    shutdown(si->fd, SHUT_RDWR);
    atomic_fetch_add(&s->stalls, 1);
    kvb_sink_guard_count(s);
    char addr[INET6_ADDRSTRLEN] = "?";
    const struct sockaddr_storage *a = &si->peer_addr;
    if (a->ss_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)a)->sin_addr, addr, sizeof(addr));
    else if (a->ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)a)->sin6_addr, addr, sizeof(addr));
    kvb_log_rl(&s->guard_rl, KVB_LOG_WARN, STAGE,
               "NATS server %s port %u took the connection but did not complete the "
               "handshake (no PONG) in %" PRIu64 " ms: connection attempt abandoned "
               "(nats.c %s spins on this, issue #706)",
               addr, (unsigned)si->peer, age, nats_GetVersion());
}

/* A signal waits on the loop's signalfd (poll only: the loop reads it). */
static bool signal_waits(const struct kvb_sink *s)
{
    struct pollfd p = {atomic_load(&s->guard_sigfd), POLLIN, 0};
    return p.fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
}

/* A socket first seen at SINCE can be a handshake of this sink: an attempt of
 * its own is in progress and began before it (a tick earlier at most: nats.c
 * may end its reconnect delay a little before the sink's clock says).  Not a
 * socket someone else in the process opened to the server before the attempt
 * (a client that is simply idle: its traffic can look unanswered, see
 * unanswered()), nor one opened while the sink is connected. */
static bool ours(struct kvb_sink *s, uint64_t since)
{
    uint64_t from = atomic_load(&s->guard_from);
    return from != GUARD_NONE && since + GUARD_TICK_MS >= from;
}

static void guard_scan(struct kvb_sink *s, struct sockinfo *socks)
{
    ino_t attached[16];
    size_t n_att = kvb_sink_io_attached(s, attached, 16);
    size_t n = nats_sockets(s, socks);
    uint64_t now = kvb_mono_ms();
    /* destroy (or the loop, for its signal) is waiting for the attempt in
     * progress: no need to give it its full time, only to see that it went
     * unanswered for a tick */
    bool hurry = atomic_load(&s->guard_hurry) || signal_waits(s);
    uint64_t limit = hurry ? 0 : s->guard_limit_ms;
    uint32_t quiet = hurry ? GUARD_TICK_MS : s->guard_limit_ms - GUARD_GRACE_MS;

    for (size_t c = 0; c < s->n_guard_cand; c++)
        s->guard_cand[c].seen = false;
    for (size_t i = 0; i < n; i++) {
        if (has_ino(s->guard_base, s->n_guard_base, socks[i].ino) ||
            has_ino(attached, n_att, socks[i].ino))
            continue;
        size_t c = 0;
        while (c < s->n_guard_cand && s->guard_cand[c].ino != socks[i].ino)
            c++;
        if (c == s->n_guard_cand) {
            if (c == GUARD_MAX_CAND)
                continue;
            s->guard_cand[c] = (struct guard_cand){socks[i].ino, now, true};
            s->n_guard_cand++;
            continue;
        }
        s->guard_cand[c].seen = true;
        if (ours(s, s->guard_cand[c].since) && now - s->guard_cand[c].since >= limit &&
            unanswered(socks[i].fd, quiet)) {
            abandon(s, &socks[i], now - s->guard_cand[c].since);
            s->guard_cand[c].seen = false; /* forgotten: it is gone */
        }
    }
    size_t k = 0;
    for (size_t c = 0; c < s->n_guard_cand; c++)
        if (s->guard_cand[c].seen)
            s->guard_cand[k++] = s->guard_cand[c];
    s->n_guard_cand = k;
}

static void *guard_main(void *arg)
{
    struct kvb_sink *s = arg;
    struct sockinfo *socks = malloc(GUARD_MAX_SOCKS * sizeof(*socks));

    pthread_mutex_lock(&s->guard_mu);
    while (!s->guard_stop) {
        bool idle = atomic_load(&s->state) == ST_CONNECTED && !s->guard_kicked;
        s->guard_kicked = false;
        if (idle) {
            s->n_guard_cand = 0; /* nothing is shaking hands */
            pthread_cond_wait(&s->guard_cond, &s->guard_mu);
            continue;
        }
        pthread_mutex_unlock(&s->guard_mu);
        if (socks)
            guard_scan(s, socks);
        pthread_mutex_lock(&s->guard_mu);
        struct timespec until = kvb_mono_deadline(GUARD_TICK_MS);
        if (!s->guard_stop && !s->guard_kicked)
            pthread_cond_timedwait(&s->guard_cond, &s->guard_mu, &until);
    }
    pthread_mutex_unlock(&s->guard_mu);
    free(socks);
    return NULL;
}

int kvb_sink_guard_start(struct kvb_sink *s, const struct kvb_config *cfg)
{
    int rc;

    s->guard_rl = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(GUARD_LOG_MS, GUARD_LOG_BURST);
    s->guard_limit_ms = CONNECT_ATTEMPT_MS;
    if (cfg->nats.connect_timeout_ms > 0 && cfg->nats.connect_timeout_ms < s->guard_limit_ms)
        s->guard_limit_ms = cfg->nats.connect_timeout_ms;
    s->guard_limit_ms += GUARD_GRACE_MS;
    for (size_t i = 0; i < cfg->nats.n_servers && s->n_guard_ports < GUARD_MAX_PORTS; i++) {
        uint16_t p = url_port(cfg->nats.servers[i]);
        if (p)
            s->guard_ports[s->n_guard_ports++] = p;
    }
    /* what is there already is not ours (another sink's, during a reload) */
    struct sockinfo *socks = malloc(GUARD_MAX_SOCKS * sizeof(*socks));
    if (!socks)
        return -ENOMEM;
    size_t n = nats_sockets(s, socks);
    for (size_t i = 0; i < n && s->n_guard_base < GUARD_MAX_BASE; i++)
        s->guard_base[s->n_guard_base++] = socks[i].ino;
    free(socks);

    if ((rc = kvb_sink_cond_init(&s->guard_cond)) < 0)
        return rc;
    pthread_mutex_init(&s->guard_mu, NULL);
    s->guard_init = true;

    if ((rc = kvb_sink_thread_start(&s->guard_thread, guard_main, s)) < 0) {
        kvb_err(STAGE, "cannot start the NATS guard thread: %s", strerror(-rc));
        return rc;
    }
    s->guard_started = true;
    return 0;
}

void kvb_sink_guard_kick(struct kvb_sink *s)
{
    if (!s->guard_init)
        return;
    pthread_mutex_lock(&s->guard_mu);
    s->guard_kicked = true;
    pthread_cond_signal(&s->guard_cond);
    pthread_mutex_unlock(&s->guard_mu);
}

void kvb_sink_guard_hurry(struct kvb_sink *s)
{
    atomic_store(&s->guard_hurry, true);
    kvb_sink_guard_kick(s);
}

void kvb_sink_guard_attempt(struct kvb_sink *s, uint64_t at_ms)
{
    atomic_store(&s->guard_from, at_ms);
}

void kvb_sink_guard_lost(struct kvb_sink *s)
{
    /* nats.c's reconnect thread may have asked for its delay already (it
     * runs before this callback): that attempt is the later one */
    uint64_t none = GUARD_NONE;
    atomic_compare_exchange_strong(&s->guard_from, &none, kvb_mono_ms());
}

void kvb_sink_guard_connected(struct kvb_sink *s) { atomic_store(&s->guard_from, GUARD_NONE); }

void kvb_sink_guard_count(struct kvb_sink *s)
{
    if (!kvb_sink_owns_metrics(s))
        return; /* counted once the sink is live */
    uint64_t now = atomic_load(&s->stalls);
    uint64_t was = atomic_load(&s->stalls_counted);
    while (was < now && !atomic_compare_exchange_weak(&s->stalls_counted, &was, now)) {
    }
    if (was < now) /* this call moved stalls_counted from was to now */
        atomic_fetch_add_explicit(&s->m->nats_connect_stalls_total[0], now - was,
                                  memory_order_relaxed);
}

void kvb_sink_guard_stop(struct kvb_sink *s)
{
    if (!s->guard_init)
        return;
    if (s->guard_started) {
        pthread_mutex_lock(&s->guard_mu);
        s->guard_stop = true;
        pthread_cond_signal(&s->guard_cond);
        pthread_mutex_unlock(&s->guard_mu);
        pthread_join(s->guard_thread, NULL);
        s->guard_started = false;
    }
    pthread_cond_destroy(&s->guard_cond);
    pthread_mutex_destroy(&s->guard_mu);
    s->guard_init = false;
}
