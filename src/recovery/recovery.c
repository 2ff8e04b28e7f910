/* recovery: Dynamo's KV recovery query.  See include/recovery.h; the wire
 * forms are src/recovery/wire.c's, the answers the loop's (query.h, op
 * recover). */
#include "recovery.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nats/nats.h>

#include "clock.h"
#include "config.h"
#include "log.h"
#include "metrics.h"
#include "query.h"
#include "sink.h"
#include "wire.h"

#define RECOVERY_QUEUE 64        /* requests waiting for the worker */
#define CONNECT_MS 5000          /* Dynamo's RESPONSE_MUX_CONNECT_TIMEOUT_SECS */
#define IO_MS 10000              /* a write, or a wait for credits, at most */
#define DRAIN_MS 500             /* after the last frame, read what the router still sends */
#define CALLHOME_CLOSE_MS 10000  /* call-home: the router closes after the sentinel */
#define WINDOW (256u << 10)      /* Dynamo's default stream and connection windows */
#define DUMP_CHAIN 256u          /* blocks per stored event of a dump */
#define TCP_CLIENTS 64           /* request-plane connections at once */
#define TCP_HEAD_MAX (64u << 10) /* a request's path or headers */

struct job {
    struct kvb_wire_control ctl;
    struct kvb_wire_request req;
    uint64_t worker;
    uint32_t rank;
};

struct kvb_recovery {
    struct kvb_recovery_target t;
    struct kvb_metrics *m;
    struct kvb_query *hub;
    bool residency_domain;
    char prefix[600];  /* NATS: {ns}_{comp}.kvbridge-{instance:x} */
    char serving[620]; /* ... and its wildcard */
    char path[64];     /* TCP: {instance:x}/kvbridge */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct job q[RECOVERY_QUEUE]; /* mu */
    size_t head, n;               /* mu */
    bool stop;                    /* mu */
    pthread_t worker;
    bool worker_started;

    int lfd, stopfd; /* the TCP request plane; -1: none */
    pthread_t tcp;
    bool tcp_started;
    struct kvb_ratelimit rl_in;  /* refusals: the request plane's thread */
    struct kvb_ratelimit rl_out; /* undelivered answers: the worker thread */
};

static void count(struct kvb_recovery *r, int result)
{
    kvb_add_shared(&r->m->recovery_requests_total[result], 1);
}

/* ---- targets ------------------------------------------------------------------ */

int kvb_recovery_transport(const struct kvb_recovery_target *t, uint64_t worker_id,
                           uint32_t dp_rank, char *out, size_t cap)
{
    int n = t->plane == KVB_RECOVERY_TCP
                ? snprintf(out, cap, "%s/%" PRIx64 "/kvbridge/%" PRIu64 "/%" PRIu32, t->address,
                           t->instance_id, worker_id, dp_rank)
                : snprintf(out, cap, "%s_%s.kvbridge-%" PRIx64 ".%" PRIu64 ".%" PRIu32,
                           t->namespace_, t->component, t->instance_id, worker_id, dp_rank);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : n;
}

int kvb_recovery_endpoint(uint64_t publisher_id, char *out, size_t cap)
{
    int n = snprintf(out, cap, "worker_kv_query_source_%" PRIx64, publisher_id);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : n;
}

const struct kvb_recovery_target *kvb_recovery_target(const struct kvb_recovery *r)
{
    return r ? &r->t : NULL;
}

/* "W.R" or "W/R" (the pair a target names) after the prefix: 0 or -EINVAL. */
static int pair_of(const char *s, char sep, uint64_t *w, uint32_t *rank)
{
    char *end;
    if (*s < '0' || *s > '9')
        return -EINVAL;
    errno = 0;
    unsigned long long a = strtoull(s, &end, 10);
    if (errno || *end != sep || end[1] < '0' || end[1] > '9')
        return -EINVAL;
    unsigned long long b = strtoull(end + 1, &end, 10);
    if (errno || *end || b > UINT32_MAX)
        return -EINVAL;
    *w = a;
    *rank = (uint32_t)b;
    return 0;
}

/* ---- intake (any thread) ---------------------------------------------------------- */

/* A request envelope for pair (w, rank): queued (0), or the refusal the
 * router is told ("Server unavailable: ..." / "Server overloaded: ...", the
 * prefixes Dynamo reads as a rejection) in why, -1. */
static int intake(struct kvb_recovery *r, uint64_t w, uint32_t rank, const void *data, size_t len,
                  char *why, size_t cap)
{
    struct job j = {.worker = w, .rank = rank};
    struct kvb_wire_twopart tp;
    char err[160];
    if (kvb_wire_twopart_parse(data, len, &tp) < 0) {
        snprintf(why, cap, "Server unavailable: not a TwoPart message");
        goto refused;
    }
    if (kvb_wire_control_parse(tp.header, tp.header_len, &j.ctl, err, sizeof(err)) < 0) {
        snprintf(why, cap, "Server unavailable: %s", err);
        goto refused;
    }
    if (j.ctl.plane == KVB_WIRE_PLANE_OTHER) {
        snprintf(why, cap,
                 "Server unavailable: response plane %s is not served by kvbridge (only "
                 "tcp_response_mux_v1 and tcp_server: no QUIC)",
                 j.ctl.transport);
        goto refused;
    }
    if (j.ctl.msgpack) {
        snprintf(why, cap, "Server unavailable: kvbridge takes JSON bodies only");
        goto refused;
    }
    if (kvb_wire_request_parse(tp.body, tp.body_len, &j.req, err, sizeof(err)) < 0) {
        snprintf(why, cap, "Server unavailable: %s", err);
        goto refused;
    }
    pthread_mutex_lock(&r->mu);
    bool full = r->n == RECOVERY_QUEUE || r->stop;
    if (!full) {
        r->q[(r->head + r->n) % RECOVERY_QUEUE] = j;
        r->n++;
        pthread_cond_signal(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    if (!full)
        return 0;
    count(r, KVB_RES_OVERLOADED);
    snprintf(why, cap, "Server overloaded: %d recovery requests waiting", RECOVERY_QUEUE);
    return -1;
refused:
    count(r, KVB_RES_REFUSED);
    kvb_log_rl(&r->rl_in, KVB_LOG_WARN, "recovery", "worker_id %" PRIu64 " dp_rank %" PRIu32 ": %s",
               w, rank, why);
    return -1;
}

/* The NATS request plane (kvb_sink_serve()): reply with an empty payload
 * (the acknowledgement) or the refusal; the answer goes its own way. */
static void on_nats(void *closure, void *nats_conn, void *nats_msg)
{
    struct kvb_recovery *r = closure;
    natsMsg *msg = nats_msg;
    const char *subj = natsMsg_GetSubject(msg), *reply = natsMsg_GetReply(msg);
    size_t pl = strlen(r->prefix);
    uint64_t w;
    uint32_t rank;
    char why[320] = "";
    int rc = strncmp(subj, r->prefix, pl) == 0 && subj[pl] == '.' &&
                     pair_of(subj + pl + 1, '.', &w, &rank) == 0
                 ? intake(r, w, rank, natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg), why,
                          sizeof(why))
                 : (snprintf(why, sizeof(why), "Server unavailable: no such pair"), -1);
    if (reply && *reply)
        natsConnection_Publish(nats_conn, reply, rc == 0 ? NULL : why,
                               rc == 0 ? 0 : (int)strlen(why));
    natsMsg_Destroy(msg);
}

int kvb_recovery_attach(struct kvb_recovery *r, struct kvb_sink *sink)
{
    if (!r || !sink || r->t.plane != KVB_RECOVERY_NATS)
        return 0;
    int rc = kvb_sink_serve(sink, r->serving, on_nats, r);
    if (rc == 0)
        kvb_info("recovery", "answering Dynamo's recovery query on NATS %s", r->serving);
    return rc;
}

/* ---- sockets ------------------------------------------------------------------------- */

static int wait_fd(int fd, short ev, int ms)
{
    struct pollfd p = {fd, ev, 0};
    int n;
    while ((n = poll(&p, 1, ms)) < 0 && errno == EINTR)
        ;
    return n < 0 ? -errno : n == 0 ? -ETIMEDOUT : 0;
}

static int send_all(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
            int rc = wait_fd(fd, POLLOUT, IO_MS);
            if (rc < 0)
                return rc;
            continue;
        }
        if (k <= 0)
            return k < 0 ? -errno : -EPIPE;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int recv_all(int fd, void *buf, size_t n, int ms)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t k = recv(fd, p, n, MSG_DONTWAIT);
        if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
            int rc = wait_fd(fd, POLLIN, ms);
            if (rc < 0)
                return rc;
            continue;
        }
        if (k <= 0)
            return k < 0 ? -errno : -ECONNRESET;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* HOST:PORT or [V6]:PORT, connected (non-blocking) within CONNECT_MS. */
static int connect_to(const char *address)
{
    char host[256];
    const char *port = strrchr(address, ':');
    if (!port || port == address || (size_t)(port - address) >= sizeof(host))
        return -EINVAL;
    size_t hl = (size_t)(port - address);
    memcpy(host, address, hl);
    host[hl] = '\0';
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, port + 1, &hints, &res) != 0 || !res)
        return -EHOSTUNREACH;
    int fd = -1, rc = -ECONNREFUSED;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) < 0 && errno != EINPROGRESS) {
            rc = -errno;
        } else if ((rc = wait_fd(fd, POLLOUT, CONNECT_MS)) == 0) {
            int e = 0;
            socklen_t el = sizeof(e);
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el);
            rc = -e;
        }
        if (rc < 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        return rc;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

/* Read what the router still sends until it is quiet (or closes) for a
 * while, so that closing sends no reset over frames it has not read. */
static void drain(int fd, int quiet_ms, int max_ms)
{
    uint8_t buf[4096];
    uint64_t until = kvb_mono_ms() + (uint64_t)max_ms;
    while (kvb_mono_ms() < until && wait_fd(fd, POLLIN, quiet_ms) == 0)
        if (recv(fd, buf, sizeof(buf), MSG_DONTWAIT) <= 0)
            break;
}

/* ---- the response planes ---------------------------------------------------------- */

struct mux {
    int fd;
    const uint8_t *stream;
    uint64_t stream_credits, conn_credits, sent, acked;
};

/* One frame from the router while we wait for credits. */
static int mux_read(struct mux *x)
{
    uint8_t h[KVB_WIRE_MUX_HEAD], pl[16];
    int rc = recv_all(x->fd, h, sizeof(h), IO_MS);
    if (rc < 0)
        return rc;
    uint32_t n = (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 | (uint32_t)h[2] << 8 | h[3];
    if (n > sizeof(pl))
        return -EPROTO; /* the router sends control frames only */
    if ((rc = recv_all(x->fd, pl, n, IO_MS)) < 0)
        return rc;
    uint64_t v = 0;
    for (uint32_t i = 0; i < n && i < 8; i++)
        v = v << 8 | pl[i];
    bool ours = memcmp(h + 8, x->stream, 16) == 0;
    switch (h[4]) {
    case KVB_MUX_CONNECTION_ACK:
        if (n == 8 && v > x->acked && v <= x->sent) {
            x->conn_credits += v - x->acked;
            if (x->conn_credits > WINDOW)
                x->conn_credits = WINDOW;
            x->acked = v;
        }
        return 0;
    case KVB_MUX_WINDOW_UPDATE:
        if (ours && n == 4) {
            x->stream_credits += v;
            if (x->stream_credits > WINDOW)
                x->stream_credits = WINDOW;
        }
        return 0;
    case KVB_MUX_STOP:
    case KVB_MUX_KILL:
    case KVB_MUX_RESET: return ours ? -ECANCELED : 0;
    default: return 0;
    }
}

/* A frame of stream x: Data frames take credits, min(24 + len, window), of
 * the stream and of the connection (the router gives them back with
 * WindowUpdate and ConnectionAck). */
static int mux_send(struct mux *x, int kind, const void *p, size_t len)
{
    uint8_t h[KVB_WIRE_MUX_HEAD];
    uint64_t need = 24 + (uint64_t)len < WINDOW ? 24 + (uint64_t)len : WINDOW;
    int rc;
    // cppcheck-suppress knownConditionTrueFalse ; mux_read(x) adds the credits
    while (kind == KVB_MUX_DATA && (x->stream_credits < need || x->conn_credits < need))
        if ((rc = mux_read(x)) < 0)
            return rc;
    kvb_wire_mux_head(h, kind, x->stream, (uint32_t)len);
    if ((rc = send_all(x->fd, h, sizeof(h))) < 0 || (len && (rc = send_all(x->fd, p, len)) < 0))
        return rc;
    if (kind == KVB_MUX_DATA) {
        x->stream_credits -= need;
        x->conn_credits -= need;
        x->sent += 24 + len;
    }
    return 0;
}

/* A header-only or data-only TwoPart message. */
static int twopart_send(int fd, const void *header, size_t hl, const void *body, size_t bl)
{
    uint8_t pre[KVB_WIRE_TWOPART_HEAD];
    kvb_wire_twopart_head(pre, hl, bl);
    int rc = send_all(fd, pre, sizeof(pre));
    if (rc == 0 && hl)
        rc = send_all(fd, header, hl);
    if (rc == 0 && bl)
        rc = send_all(fd, body, bl);
    return rc;
}

static int deliver_mux(int fd, const struct kvb_wire_control *c, const struct kvb_wire_buf *item,
                       const struct kvb_wire_buf *final)
{
    uint8_t conn_id[16];
    if (getrandom(conn_id, sizeof(conn_id), 0) != (ssize_t)sizeof(conn_id))
        return -EIO;
    conn_id[6] = (uint8_t)((conn_id[6] & 0x0f) | 0x40); /* a version 4 UUID */
    conn_id[8] = (uint8_t)((conn_id[8] & 0x3f) | 0x80);
    struct kvb_wire_buf b = {0};
    kvb_wire_mux_handshake(&b, c->frontend, conn_id);
    int rc = b.oom ? -ENOMEM : twopart_send(fd, b.p, b.len, NULL, 0);
    uint8_t pre[KVB_WIRE_TWOPART_HEAD];
    if (rc == 0)
        rc = recv_all(fd, pre, sizeof(pre), CONNECT_MS);
    if (rc == 0) {
        uint64_t hl = 0, bl = 0;
        for (int i = 0; i < 8; i++) {
            hl = hl << 8 | pre[i];
            bl = bl << 8 | pre[8 + i];
        }
        struct kvb_wire_twopart t;
        uint8_t ack[64], msg[KVB_WIRE_TWOPART_HEAD + sizeof(ack)];
        if (hl + bl > sizeof(ack))
            rc = -EPROTO;
        else if ((rc = recv_all(fd, ack, (size_t)(hl + bl), CONNECT_MS)) == 0) {
            memcpy(msg, pre, sizeof(pre));
            memcpy(msg + sizeof(pre), ack, (size_t)(hl + bl));
            if (kvb_wire_twopart_parse(msg, sizeof(pre) + (size_t)(hl + bl), &t) < 0 ||
                kvb_wire_mux_ack_check(&t) < 0)
                rc = -EPROTO; /* not the ConnectionAck(0) of response mux v1 */
        }
    }
    struct mux x = {fd, c->stream, WINDOW, WINDOW, 0, 0};
    kvb_wire_buf_reset(&b);
    kvb_wire_prologue(&b);
    if (rc == 0)
        rc = mux_send(&x, KVB_MUX_PROLOGUE, b.p, b.len);
    if (rc == 0)
        rc = mux_send(&x, KVB_MUX_DATA, item->p, item->len);
    if (rc == 0)
        rc = mux_send(&x, KVB_MUX_DATA, final->p, final->len);
    if (rc == 0)
        rc = mux_send(&x, KVB_MUX_END, NULL, 0);
    kvb_wire_buf_free(&b);
    if (rc == 0)
        drain(fd, 100, DRAIN_MS);
    return rc;
}

static int deliver_callhome(int fd, const struct kvb_wire_control *c,
                            const struct kvb_wire_buf *item, const struct kvb_wire_buf *final)
{
    struct kvb_wire_buf hs = {0}, pro = {0};
    static const char sentinel[] = "\"sentinel\"";
    kvb_wire_callhome_handshake(&hs, c->subject);
    kvb_wire_prologue(&pro);
    int rc = hs.oom || pro.oom ? -ENOMEM : twopart_send(fd, hs.p, hs.len, NULL, 0);
    if (rc == 0)
        rc = twopart_send(fd, pro.p, pro.len, NULL, 0);
    if (rc == 0)
        rc = twopart_send(fd, NULL, 0, item->p, item->len);
    if (rc == 0)
        rc = twopart_send(fd, NULL, 0, final->p, final->len);
    if (rc == 0)
        rc = twopart_send(fd, sentinel, sizeof(sentinel) - 1, NULL, 0);
    kvb_wire_buf_free(&hs);
    kvb_wire_buf_free(&pro);
    if (rc == 0) {
        shutdown(fd, SHUT_WR);
        drain(fd, CALLHOME_CLOSE_MS, CALLHOME_CLOSE_MS); /* until the router closes */
    }
    return rc;
}

/* ---- answers (the worker thread) ---------------------------------------------------- */

static void error_item(struct kvb_wire_buf *b, int *result, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void error_item(struct kvb_wire_buf *b, int *result, const char *fmt, ...)
{
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    kvb_wire_buf_reset(b);
    kvb_wire_item_error(b, msg);
    *result = KVB_RES_ERROR;
}

/* The events of a recover answer into b; false when they did not fit. */
static bool events_item(struct kvb_recovery *r, struct kvb_query_answer *a, bool dump,
                        uint64_t last, struct kvb_wire_buf *b)
{
    struct kvb_rev rev;
    uint64_t id = 0; /* a dump's ids are its own, from 0 */
    int rc;
    kvb_wire_item_begin(b, dump);
    while (!b->over && !b->oom && (rc = kvb_query_answer_event(a, DUMP_CHAIN, &rev)) == 1)
        kvb_wire_item_event(b, &rev, dump ? id++ : rev.event_id, r->residency_domain);
    kvb_wire_item_end(b, dump, last);
    return !b->over && !b->oom;
}

/* The stream item answering j (a WorkerKvQueryResponse); *result for the
 * metrics. */
static void answer(struct kvb_recovery *r, const struct job *j, struct kvb_wire_buf *b, int *result)
{
    const struct kvb_wire_request *q = &j->req;
    if (q->kind == KVB_WIRE_KIND_STATUS)
        return error_item(b, result, "KV state-agent status is not supported by this endpoint");
    if (q->kind == KVB_WIRE_KIND_STATE_AGENT)
        return error_item(b, result, "state-agent recovery is not supported by this endpoint");
    if (q->worker_id != j->worker)
        return error_item(
            b, result,
            "WorkerKvQueryEngine::generate worker_id mismatch: request.worker_id=%" PRIu64
            " this.worker_id=%" PRIu64,
            q->worker_id, j->worker);
    if (q->dp_rank != j->rank)
        return error_item(b, result,
                          "WorkerKvQueryEngine::generate dp_rank mismatch: request.dp_rank=%" PRIu32
                          " this.dp_rank=%" PRIu32,
                          q->dp_rank, j->rank);
    struct kvb_query_req qr = {.op = KVB_QOP_RECOVER,
                               .has_worker = true,
                               .worker_id = j->worker,
                               .dp_rank = j->rank,
                               .has_start = q->has_start,
                               .start = q->start,
                               .has_end = q->has_end,
                               .end = q->end};
    struct kvb_query_answer *a = NULL;
    if (kvb_query_run(r->hub, &qr, &a) < 0)
        return error_item(b, result, "out of memory");
    uint64_t v[3];
    int kind = kvb_query_answer_recovery(a, v);
    const char *line = NULL;
    size_t len = 0;
    if (kind < 0) { /* the hub's error answer: its text says why */
        if (kvb_query_answer_line(a, &line, &len) != 1)
            len = 0;
        error_item(b, result, "kvbridge: %.*s", (int)len, line ? line : "");
    } else if (kind == KVB_QR_TOO_NEW) {
        kvb_wire_item_too_new(b, v[0], v[1], v[2]);
        *result = KVB_RES_TOO_NEW;
    } else if (kind == KVB_QR_INVALID_RANGE) {
        kvb_wire_item_invalid_range(b, v[0], v[1]);
        *result = KVB_RES_INVALID_RANGE;
    } else if (events_item(r, a, kind == KVB_QR_TREE_DUMP, v[0], b)) {
        *result = kind == KVB_QR_TREE_DUMP ? KVB_RES_TREE_DUMP : KVB_RES_EVENTS;
    } else if (kind == KVB_QR_TREE_DUMP && q->supports_tree_dump_failed) {
        kvb_wire_buf_reset(b);
        kvb_wire_item_dump_failed(b, v[0],
                                  "the dump is larger than 32 MiB, the most a Dynamo "
                                  "response frame may carry");
        *result = KVB_RES_TREE_DUMP_FAILED;
    } else {
        error_item(b, result, "%s: larger than 32 MiB, the most a Dynamo response frame may carry",
                   kind == KVB_QR_TREE_DUMP ? "worker tree dump failed" : "the events");
    }
    kvb_query_answer_sent(a, b->len);
    kvb_query_answer_free(&a);
}

static void serve(struct kvb_recovery *r, const struct job *j)
{
    struct kvb_wire_buf item = {0}, final = {0};
    int result = KVB_RES_ERROR;
    answer(r, j, &item, &result);
    kvb_wire_item_final(&final);
    int rc = item.oom || final.oom ? -ENOMEM : connect_to(j->ctl.address), fd = rc;
    if (fd >= 0) {
        rc = j->ctl.plane == KVB_WIRE_PLANE_MUX ? deliver_mux(fd, &j->ctl, &item, &final)
                                                : deliver_callhome(fd, &j->ctl, &item, &final);
        close(fd);
    }
    if (rc < 0) {
        count(r, KVB_RES_UNDELIVERED);
        kvb_log_rl(&r->rl_out, KVB_LOG_WARN, "recovery",
                   "worker_id %" PRIu64 " dp_rank %" PRIu32 ": answer to %s (%s) not delivered: %s",
                   j->worker, j->rank, j->ctl.address, j->ctl.transport, strerror(-rc));
    } else {
        count(r, result);
        kvb_add_shared(&r->m->recovery_response_bytes_total[0], item.len);
        kvb_debug("recovery", "worker_id %" PRIu64 " dp_rank %" PRIu32 ": %zu bytes to %s",
                  j->worker, j->rank, item.len, j->ctl.address);
    }
    kvb_wire_buf_free(&item);
    kvb_wire_buf_free(&final);
}

static void *worker_main(void *arg)
{
    struct kvb_recovery *r = arg;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        while (!r->n && !r->stop)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->stop) {
            pthread_mutex_unlock(&r->mu);
            return NULL;
        }
        struct job j = r->q[r->head];
        r->head = (r->head + 1) % RECOVERY_QUEUE;
        r->n--;
        pthread_mutex_unlock(&r->mu);
        serve(r, &j);
    }
}

/* ---- the TCP request plane ------------------------------------------------------------- */

struct client {
    int fd;
    uint8_t *in;
    size_t len, cap;
};

/* The requests complete in c->in, each answered (u32 BE length, then the
 * text: empty is the acknowledgement).  -1 when the client must go. */
static int tcp_requests(struct kvb_recovery *r, struct client *c)
{
    size_t off = 0;
    for (;;) {
        const uint8_t *p = c->in + off;
        size_t left = c->len - off;
        if (left < 2)
            break;
        size_t pl = (size_t)p[0] << 8 | p[1];
        if (left < 2 + pl + 2)
            break;
        size_t hl = (size_t)p[2 + pl] << 8 | p[3 + pl];
        if (left < 4 + pl + hl + 4)
            break;
        const uint8_t *q = p + 4 + pl + hl;
        size_t bl = (size_t)q[0] << 24 | (size_t)q[1] << 16 | (size_t)q[2] << 8 | q[3];
        if (bl > KVB_WIRE_MAX_REQUEST)
            return -1;
        if (left < 8 + pl + hl + bl)
            break;
        char path[160] = "", why[320] = "";
        size_t ppl = strlen(r->path);
        int rc = -1;
        uint64_t w;
        uint32_t rank;
        if (pl < sizeof(path)) {
            memcpy(path, p + 2, pl);
            path[pl] = '\0';
        }
        if (strncmp(path, r->path, ppl) == 0 && path[ppl] == '/' &&
            pair_of(path + ppl + 1, '/', &w, &rank) == 0)
            rc = intake(r, w, rank, q + 4, bl, why, sizeof(why));
        else
            snprintf(why, sizeof(why), "Server unavailable: no such path");
        uint32_t n = rc == 0 ? 0 : (uint32_t)strlen(why);
        uint8_t h[4] = {(uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n};
        if (send_all(c->fd, h, 4) < 0 || (n && send_all(c->fd, why, n) < 0))
            return -1;
        off += 8 + pl + hl + bl;
    }
    memmove(c->in, c->in + off, c->len - off);
    c->len -= off;
    return 0;
}

static void client_close(struct client *c)
{
    close(c->fd);
    free(c->in);
    *c = (struct client){.fd = -1};
}

static void *tcp_main(void *arg)
{
    struct kvb_recovery *r = arg;
    struct client cl[TCP_CLIENTS];
    struct pollfd p[2 + TCP_CLIENTS];
    for (int i = 0; i < TCP_CLIENTS; i++)
        cl[i] = (struct client){.fd = -1};
    for (;;) {
        p[0] = (struct pollfd){r->lfd, POLLIN, 0};
        p[1] = (struct pollfd){r->stopfd, POLLIN, 0};
        for (int i = 0; i < TCP_CLIENTS; i++)
            p[2 + i] = (struct pollfd){cl[i].fd, POLLIN, 0};
        if (poll(p, 2 + TCP_CLIENTS, -1) < 0 && errno != EINTR)
            break;
        if (p[1].revents)
            break;
        if (p[0].revents & POLLIN) {
            int fd = accept4(r->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            int k = 0;
            while (k < TCP_CLIENTS && cl[k].fd >= 0)
                k++;
            if (fd >= 0 && k == TCP_CLIENTS)
                close(fd); /* as many routers as anyone needs: refuse the rest */
            else if (fd >= 0)
                cl[k].fd = fd;
        }
        for (int i = 0; i < TCP_CLIENTS; i++) {
            struct client *c = &cl[i];
            if (c->fd < 0 || !(p[2 + i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            size_t room = 8 + 2 * TCP_HEAD_MAX + KVB_WIRE_MAX_REQUEST;
            if (c->cap < room && !(c->in = realloc(c->in, c->cap = room))) {
                client_close(c);
                continue;
            }
            ssize_t k = recv(c->fd, c->in + c->len, c->cap - c->len, MSG_DONTWAIT);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) {
                client_close(c);
                continue;
            }
            if (k > 0)
                c->len += (size_t)k;
            if (tcp_requests(r, c) < 0 || c->len == c->cap)
                client_close(c);
        }
    }
    for (int i = 0; i < TCP_CLIENTS; i++)
        if (cl[i].fd >= 0)
            client_close(&cl[i]);
    return NULL;
}

/* Listen on HOST:PORT (numeric, [v6] allowed); the port taken in *port. */
static int listen_on(const char *listen_addr, uint16_t *port)
{
    char host[256];
    const char *colon = strrchr(listen_addr, ':');
    if (!colon || (size_t)(colon - listen_addr) >= sizeof(host))
        return -EINVAL;
    size_t hl = (size_t)(colon - listen_addr);
    memcpy(host, listen_addr, hl);
    host[hl] = '\0';
    if (host[0] == '[' && hl > 2) {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV},
                    *res = NULL;
    if (getaddrinfo(host, colon + 1, &hints, &res) != 0 || !res)
        return -EINVAL;
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    int rc = fd < 0 ? -errno : 0;
    if (rc == 0) {
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, res->ai_addr, res->ai_addrlen) < 0 || listen(fd, 64) < 0)
            rc = -errno;
    }
    freeaddrinfo(res);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (rc == 0 && getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
        *port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    if (rc < 0 && fd >= 0)
        close(fd);
    return rc < 0 ? rc : fd;
}

/* ---- life cycle ---------------------------------------------------------------------------- */

static int setup_tcp(struct kvb_recovery *r, const struct kvb_config *c)
{
    uint16_t port = 0;
    int fd = listen_on(c->discovery.recovery.listen, &port);
    if (fd < 0)
        return fd;
    r->lfd = fd;
    const char *adv = c->discovery.recovery.advertise;
    int n;
    if (adv[0] && strrchr(adv, ':') && strrchr(adv, ':') > strrchr(adv, ']'))
        n = snprintf(r->t.address, sizeof(r->t.address), "%s", adv); /* HOST:PORT */
    else if (adv[0])
        n = snprintf(r->t.address, sizeof(r->t.address), "%s:%u", adv, port);
    else {
        const char *colon = strrchr(c->discovery.recovery.listen, ':');
        n = snprintf(r->t.address, sizeof(r->t.address), "%.*s:%u",
                     (int)(colon - c->discovery.recovery.listen), c->discovery.recovery.listen,
                     port);
    }
    if (n < 0 || (size_t)n >= sizeof(r->t.address))
        return -ENAMETOOLONG;
    if ((r->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0)
        return -errno;
    int rc = pthread_create(&r->tcp, NULL, tcp_main, r);
    if (rc != 0)
        return -rc;
    r->tcp_started = true;
    kvb_info("recovery",
             "answering Dynamo's recovery query on the TCP request plane at %s (routers "
             "connect to %s/%s/WORKER_ID/DP_RANK)",
             c->discovery.recovery.listen, r->t.address, r->path);
    return 0;
}

int kvb_recovery_create(const struct kvb_config *c, struct kvb_metrics *m, struct kvb_query *hub,
                        struct kvb_recovery **out)
{
    struct kvb_recovery *r = calloc(1, sizeof(*r));
    int rc = -ENOMEM;
    if (!r)
        return rc;
    r->lfd = r->stopfd = -1;
    r->m = m;
    r->hub = hub;
    r->residency_domain = c->nats.residency_domain;
    r->rl_in = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(10000, 5);
    r->rl_out = r->rl_in;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->t.plane = c->discovery.recovery.request_plane;
    if (getrandom(&r->t.instance_id, sizeof(r->t.instance_id), 0) != sizeof(r->t.instance_id))
        r->t.instance_id = kvb_wall_ns() ^ ((uint64_t)getpid() << 32);
    r->t.instance_id &= INT64_MAX; /* etcd's instance ids are lease ids: positive i64 */
    if (snprintf(r->t.namespace_, sizeof(r->t.namespace_), "%s", c->nats.namespace_) >=
            (int)sizeof(r->t.namespace_) ||
        snprintf(r->t.component, sizeof(r->t.component), "%s", c->nats.component) >=
            (int)sizeof(r->t.component)) {
        rc = -ENAMETOOLONG;
        goto fail;
    }
    snprintf(r->prefix, sizeof(r->prefix), "%s_%s.kvbridge-%" PRIx64, r->t.namespace_,
             r->t.component, r->t.instance_id);
    snprintf(r->serving, sizeof(r->serving), "%s.*.*", r->prefix);
    snprintf(r->path, sizeof(r->path), "%" PRIx64 "/kvbridge", r->t.instance_id);
    if ((rc = pthread_create(&r->worker, NULL, worker_main, r)) != 0) {
        rc = -rc;
        goto fail;
    }
    r->worker_started = true;
    if (r->t.plane == KVB_RECOVERY_TCP && (rc = setup_tcp(r, c)) < 0)
        goto fail;
    *out = r;
    return 0;
fail:
    kvb_recovery_destroy(&r);
    return rc;
}

void kvb_recovery_destroy(struct kvb_recovery **pr)
{
    struct kvb_recovery *r = pr ? *pr : NULL;
    if (!r)
        return;
    if (r->tcp_started) {
        uint64_t one = 1;
        if (write(r->stopfd, &one, sizeof(one)) < 0) {
            /* cannot fail on a fresh eventfd */
        }
        pthread_join(r->tcp, NULL);
    }
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (r->worker_started) /* an answer in progress ends within its timeouts */
        pthread_join(r->worker, NULL);
    if (r->lfd >= 0)
        close(r->lfd);
    if (r->stopfd >= 0)
        close(r->stopfd);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
    *pr = NULL;
}
