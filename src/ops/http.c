/* http: /metrics, /healthz, /readyz, and /v1/ (query_http.c).  See include/http.h. */
#include "http.h"

#include <errno.h>
#include <netdb.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

#include "clock.h"
#include "query_http.h"

struct kvb_http {
    struct MHD_Daemon *mhd;
    const struct kvb_metrics *m;
    const char *version;
    int port;
    _Atomic(struct kvb_query *) query; /* /v1/: NULL = off */
};

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *type,
                             void *body, size_t len, enum MHD_ResponseMemoryMode mode)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

/* Why /readyz says no, one line per reason: "not ready: engine gone: SOURCE
 * dp_rank N ...", engines' lists not read, live batches held back, NATS not
 * taking router events,
 * state.dir saves failing (malloc'ed; NULL when out of memory or none of these holds). */
static char *not_ready_why(const struct kvb_metrics *m)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return NULL;
    int n = 0;
    for (int i = 0; i < KVB_MAX_ENGINE_SLOTS; i++) {
        const struct kvb_engine_slot *s = &m->engines[i];
        if (!atomic_load_explicit((_Atomic int *)&s->used, memory_order_acquire))
            break;
        if (!kvb_get(&s->gone))
            continue;
        fprintf(f,
                "not ready: engine gone: %s dp_rank %u (its metrics/health URL has not "
                "answered for %llu ms and no batch came)\n",
                s->source, s->dp_rank, (unsigned long long)kvb_get(&s->dead_after_ms));
        n++;
    }
    uint64_t unread = kvb_get(&m->source_lists_unread[0]);
    if (unread) {
        fprintf(f,
                "not ready: the list of event sources of %llu engine(s) (sources[].discover) "
                "has not been read yet\n",
                (unsigned long long)unread);
        n++;
    }
    uint64_t held = kvb_get(&m->live_held_ms), paused = kvb_get(&m->paused_ms);
    if (held > 1000) {
        fprintf(f, "not ready: %llu live batch(es) held back behind a replay for %llu ms\n",
                (unsigned long long)kvb_get(&m->live_held_batches[0]), (unsigned long long)held);
        n++;
    }
    if (paused > 1000) {
        fprintf(f,
                "not ready: NATS has not taken router events for %llu ms (%llu bytes "
                "pending): reading the engines is paused\n",
                (unsigned long long)paused, (unsigned long long)kvb_get(&m->nats_pending_bytes[0]));
        n++;
    }
    if (kvb_get(&m->state_save_failing[0])) {
        char buf[128];
        const char *e = strerror_r((int)kvb_get(&m->state_save_errno), buf, sizeof(buf));
        fprintf(f,
                "not ready: cannot save state.dir (%s): a restart would resume from an "
                "older state (kvbridge_state_save_failing)\n",
                e);
        n++;
    }
    if (fclose(f) != 0 || n == 0) {
        free(text);
        return NULL;
    }
    return text;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls)
{
    (void)version;
    struct kvb_http *h = cls;
    static char not_found[] = "not found\n", ok[] = "ok\n";
    if (strncmp(url, "/v1/", 4) == 0)
        return kvb_http_query(c, atomic_load(&h->query), url, method, upload, upload_size, con_cls);
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        static char bad_method[] = "method not allowed\n";
        return reply(c, 405, "text/plain", bad_method, sizeof(bad_method) - 1,
                     MHD_RESPMEM_PERSISTENT);
    }
    if (strcmp(url, "/metrics") == 0) {
        char *body;
        size_t len;
        if (kvb_metrics_render(h->m, h->version, &body, &len) < 0)
            return MHD_NO;
        return reply(c, 200, "text/plain; version=0.0.4", body, len, MHD_RESPMEM_MUST_FREE);
    }
    if (strcmp(url, "/healthz") == 0) {
        static char stalled[] = "loop stalled\n";
        uint64_t beat = kvb_get(&h->m->loop_heartbeat_ms);
        uint64_t ivl = kvb_get(&h->m->heartbeat_interval_ms);
        bool alive = beat && kvb_mono_ms() - beat <= 3 * ivl + 1000;
        return alive ? reply(c, 200, "text/plain", ok, 3, MHD_RESPMEM_PERSISTENT)
                     : reply(c, 503, "text/plain", stalled, sizeof(stalled) - 1,
                             MHD_RESPMEM_PERSISTENT);
    }
    if (strcmp(url, "/readyz") == 0) {
        bool ready = kvb_get(&h->m->ready[0]) != 0;
        if (ready)
            return reply(c, 200, "text/plain", ok, 3, MHD_RESPMEM_PERSISTENT);
        static char not_ready[] = "not ready\n";
        char *why = not_ready_why(h->m);
        return why ? reply(c, 503, "text/plain", why, strlen(why), MHD_RESPMEM_MUST_FREE)
                   : reply(c, 503, "text/plain", not_ready, sizeof(not_ready) - 1,
                           MHD_RESPMEM_PERSISTENT);
    }
    return reply(c, 404, "text/plain", not_found, sizeof(not_found) - 1, MHD_RESPMEM_PERSISTENT);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)c;
    (void)toe;
    kvb_http_query_completed(con_cls);
}

void kvb_http_set_query(struct kvb_http *h, struct kvb_query *q)
{
    if (h)
        atomic_store(&h->query, q);
}

/* "host:port" or "[v6]:port" -> sockaddr (numeric hosts only). */
static int parse_listen(const char *listen, struct sockaddr_storage *ss, socklen_t *len)
{
    char host[128];
    const char *port;
    if (listen[0] == '[') {
        const char *e = strchr(listen, ']');
        if (!e || e[1] != ':' || (size_t)(e - listen - 1) >= sizeof(host))
            return -EINVAL;
        memcpy(host, listen + 1, (size_t)(e - listen - 1));
        host[e - listen - 1] = '\0';
        port = e + 2;
    } else {
        const char *c = strrchr(listen, ':');
        if (!c || (size_t)(c - listen) >= sizeof(host))
            return -EINVAL;
        memcpy(host, listen, (size_t)(c - listen));
        host[c - listen] = '\0';
        port = c + 1;
    }
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV,
                             .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    if (getaddrinfo(host, port, &hints, &ai) != 0 || !ai)
        return -EINVAL;
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    *len = ai->ai_addrlen;
    freeaddrinfo(ai);
    return 0;
}

int kvb_http_start(const char *listen, const struct kvb_metrics *m, const char *version,
                   struct kvb_http **out)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    int rc = parse_listen(listen, &ss, &sl);
    if (rc < 0)
        return rc;
    struct kvb_http *h = calloc(1, sizeof(*h));
    if (!h)
        return -ENOMEM;
    h->m = m;
    h->version = version;
    /* One internal thread polls every connection (non-blocking), so a slow
     * client only holds a slot, never the thread: /healthz and /metrics are
     * served as long as a slot is free.  Slowloris clients hold slots, hence
     * room for many (HTTP_CONN_LIMIT), at most HTTP_PER_IP_LIMIT of them from
     * one address (probes and scrapes from another address still get in), an
     * idle timeout that frees what stopped sending, and a small per-connection
     * pool (requests are a line and a few headers; the /metrics body is
     * allocated apart) so that the slots stay cheap. */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
    if (ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    errno = 0;
    h->mhd = MHD_start_daemon(flags, 0, NULL, NULL, handle, h, MHD_OPTION_SOCK_ADDR,
                              (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT,
                              (unsigned)KVB_HTTP_CONN_LIMIT, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                              (unsigned)KVB_HTTP_PER_IP_LIMIT, MHD_OPTION_CONNECTION_TIMEOUT,
                              (unsigned)KVB_HTTP_IDLE_TIMEOUT_S, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                              (size_t)KVB_HTTP_CONN_MEMORY, MHD_OPTION_NOTIFY_COMPLETED, completed,
                              NULL, MHD_OPTION_END);
    if (!h->mhd) {
        rc = errno ? -errno : -EADDRINUSE;
        free(h);
        return rc;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : 0;
    *out = h;
    return 0;
}

int kvb_http_port(const struct kvb_http *h) { return h->port; }

void kvb_http_stop(struct kvb_http **ph)
{
    if (!ph || !*ph)
        return;
    if ((*ph)->mhd)
        MHD_stop_daemon((*ph)->mhd);
    free(*ph);
    *ph = NULL;
}
