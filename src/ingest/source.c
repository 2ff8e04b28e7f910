/* source: ZMQ SUB, frames, streams, replay.  See include/source.h. */
#include "source.h"

#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <zmq.h>

#include "clock.h"
#include "log.h"
#include "replay.h"

#define MAX_STREAMS 64 /* distinct topics per source */
/* A full stream table makes room by expiring its least recently used stream
 * idle at least this long (never the one a replay is for): a topic that
 * comes back is a new stream (start barrier, replay from 0). */
#define STREAM_IDLE_MS 2000
#define MAX_TOPIC 256
#define MAX_HELD_MSGS 100000   /* live batches held while a replay runs */
#define MIN_HELD_MSGS 10000    /* ... even with a smaller rcvhwm */
#define READ_REPLAY_BUDGET 256 /* replay replies per turn: the loop stays responsive */
/* Router events one read (live or replay) may emit before it hands the turn
 * back: the loop then checks the NATS buffer (backpressure), signals and the
 * heartbeat.  Without this bound 256 batches of 2000 events each put 112 MB
 * into nats.c's buffer in one turn, far past its backpressure mark. */
#define READ_EVENT_BUDGET 16384
#define REPLAY_RCVHWM 1000 /* replies queued in the DEALER (then TCP backpressure) */
/* After a hold: quiet this long (no live message) before the streams are
 * checked for batches the engine dropped meanwhile (kvb_source_resume). */
#define CHECK_QUIET_MS 1000

struct stream {
    struct kvb_stream_slot *slot; /* metrics; NULL when all slots are taken */
    char topic[MAX_TOPIC];
    size_t topic_len; /* the topic may hold NUL bytes */
    int peer_fd;      /* bind mode: the connection it came on (ZMQ_SRCFD), or -1 */
    uint64_t used_ms; /* its last live batch (CLOCK_MONOTONIC) */
    bool check_due;   /* kvb_replay_check() once the source is quiet */
    bool prove_due;   /* kvb_replay_connected() once no replay runs */
    char name[MAX_TOPIC + 320];
    struct kvb_worker_cfg w; /* its worker: st.worker points here */
    struct kvb_stream st;
};

struct kvb_source {
    struct kvb_source_params p;
    struct kvb_state *resume; /* this source's saved streams, consumed by find_stream */
    char *endpoint, *replay_endpoint, *topic;
    char name[300];
    void *zctx;
    void *sub;
    void *mon; /* PAIR reading the SUB's socket monitor */
    void *dealer;
    struct kvb_metrics *m;
    struct stream *streams[MAX_STREAMS];
    size_t n_streams;
    struct kvb_replay *rp; /* the sequence and replay rules (replay.h) */
    struct kvb_ratelimit rl_frames, rl_expire, rl_peers, rl_drops;
    long peers; /* bind mode: connections accepted and not yet gone */
    long conns; /* connect mode: connections up (0 or 1) */
    /* connect mode with CURVE: the client keys, for the replay DEALER too */
    bool curve_client;
    uint8_t curve_secret[32], curve_public[32], curve_server[32];
    struct kvb_zap *zap; /* with zap_domain registered, or NULL */
    char zap_domain[KVB_ZAP_DOMAIN_MAX];
    struct kvb_topic_cfg *topics; /* p.topics copied; NULL when none */
    struct kvb_worker_cfg worker; /* *p.worker copied; p.worker points here */
    struct kvb_ratelimit rl_topics;
    /* A connection dropped while batches were still queued in the SUB: they
     * came before the drop, so they are read first (kvb_source_read) and the
     * drop is applied after them; the monitor is not read meanwhile. */
    bool drop_due;
    int drop_fd;
    uint64_t replay_busy_ns; /* time applying replies not yet credited (< 1 ms) */
    /* After a hold (kvb_source_resume): messages read until the SUB's queue
     * first ran empty; and when the last live message came. */
    bool draining;
    uint64_t drained, live_ms;
    char drop_addr[256];
};

static bool has_input(void *sock);

/* The worker_id of a batch on TOPIC (N bytes): its entry of the topics map;
 * false when the source has a map that does not list it. */
static bool topic_worker(const struct kvb_source *s, const void *topic, size_t n, uint64_t *id)
{
    if (!s->p.n_topics || !s->p.worker) {
        *id = s->p.worker ? s->p.worker->worker_id : 0; /* (no worker: not read) */
        return true;
    }
    for (size_t i = 0; i < s->p.n_topics; i++) {
        const struct kvb_topic_cfg *t = &s->topics[i];
        if (strlen(t->topic) == n && memcmp(t->topic, topic, n) == 0) {
            *id = t->worker_id;
            return true;
        }
    }
    return false;
}

static void stream_worker(const struct kvb_source *s, struct stream *st)
{
    if (!s->p.worker) {
        kvb_stream_set_worker(&st->st, NULL); /* the pipeline's */
        return;
    }
    st->w = *s->p.worker;
    topic_worker(s, st->topic, st->topic_len, &st->w.worker_id); /* else: never read */
    kvb_stream_set_worker(&st->st, &st->w);
}

void kvb_source_set_worker(struct kvb_source *s, const struct kvb_worker_cfg *w)
{
    s->worker = *w;
    s->p.worker = &s->worker;
    for (size_t i = 0; i < s->n_streams; i++)
        stream_worker(s, s->streams[i]);
}

int kvb_endpoint_of_rank(const char *endpoint, int naming, uint32_t r, char **out)
{
    if (r == 0 || endpoint[0] == '\0') {
        *out = strdup(endpoint);
        return *out ? 0 : -ENOMEM;
    }
    if (naming == KVB_RANKS_TRTLLM &&
        (strncmp(endpoint, "ipc://", 6) == 0 || strncmp(endpoint, "inproc://", 9) == 0))
        return asprintf(out, "%s_dp%" PRIu32, endpoint, r) < 0 ? -ENOMEM : 0;
    const char *colon = strrchr(endpoint, ':');
    if (!colon || strncmp(endpoint, "tcp://", 6) != 0)
        return -EINVAL;
    char *end;
    errno = 0;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (errno || *end || end == colon + 1 || port + r > 65535)
        return -EINVAL;
    return asprintf(out, "%.*s:%lu", (int)(colon - endpoint), endpoint, port + r) < 0 ? -ENOMEM : 0;
}

static int zerr(void) { return -(zmq_errno() ? zmq_errno() : EIO); }

/* The public key of a CURVE secret key (binary), through Z85. */
static int curve_public(const uint8_t secret[32], uint8_t pub[32])
{
    char zs[41], zp[41];
    int rc =
        zmq_z85_encode(zs, secret, 32) && zmq_curve_public(zp, zs) == 0 && zmq_z85_decode(pub, zp)
            ? 0
            : zerr();
    explicit_bzero(zs, sizeof(zs));
    return rc;
}

/* A CURVE client of the engine (connect mode): the SUB, and the DEALER. */
static int set_curve_client(const struct kvb_source *s, void *sock)
{
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, s->curve_server, 32) < 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, s->curve_public, 32) < 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, s->curve_secret, 32) < 0)
        return zerr();
    return 0;
}

/* CURVE on the SUB, before its bind or connect.  Bind mode: a CURVE server
 * whose clients the ZAP handler checks (its allowed keys, or any key); the
 * secret key is not kept.  Connect mode: a client; the keys are kept for the
 * replay DEALER. */
static int setup_curve(struct kvb_source *s, const struct kvb_source_params *p)
{
    const struct kvb_curve_cfg *cv = p->curve;
    int rc;
    if (p->mode != KVB_MODE_BIND) {
        memcpy(s->curve_secret, cv->secret_key, 32);
        memcpy(s->curve_server, cv->server_key, 32);
        s->curve_client = true;
        if ((rc = curve_public(s->curve_secret, s->curve_public)) < 0 ||
            (rc = set_curve_client(s, s->sub)) < 0)
            return rc;
        kvb_info("source", "%s: CURVE client of the engine%s", s->name,
                 s->replay_endpoint[0] ? " (replay too)" : "");
        return 0;
    }
    if (cv->n_allowed && !p->zap) {
        kvb_err("source", "%s: curve.allowed_clients_file needs the ZAP handler", s->name);
        return -EINVAL;
    }
    if (p->zap) {
        if ((rc = kvb_zap_add(p->zap, s->name, cv->allowed, cv->n_allowed, s->zap_domain)) < 0)
            return rc;
        s->zap = p->zap;
    }
    int one = 1;
    uint8_t pub[32];
    if ((rc = curve_public(cv->secret_key, pub)) < 0)
        return rc;
    if (zmq_setsockopt(s->sub, ZMQ_CURVE_SERVER, &one, sizeof(one)) < 0 ||
        zmq_setsockopt(s->sub, ZMQ_CURVE_PUBLICKEY, pub, 32) < 0 ||
        zmq_setsockopt(s->sub, ZMQ_CURVE_SECRETKEY, cv->secret_key, 32) < 0 ||
        (s->zap &&
         zmq_setsockopt(s->sub, ZMQ_ZAP_DOMAIN, s->zap_domain, strlen(s->zap_domain)) < 0))
        return zerr();
    kvb_info("source", "%s: CURVE server, %s", s->name,
             cv->n_allowed ? "clients in curve.allowed_clients_file only"
                           : "any client with its public key");
    return 0;
}

/* The SUB's connection events (zmq_socket_monitor), read by a PAIR: a
 * dropped connection means the next batch of its streams must prove that it
 * continues them (replay.h). */
static int open_monitor(struct kvb_source *s)
{
    /* unique over time too: a source opened where a closed one was (the
     * same address) must not meet the old monitor's endpoint, which libzmq
     * releases in its own time */
    char addr[96];
    snprintf(addr, sizeof(addr), "inproc://kvb-monitor-%p-%llu", (void *)s,
             (unsigned long long)kvb_mono_ns());
    int linger = 0;
    if (zmq_socket_monitor(s->sub, addr,
                           ZMQ_EVENT_CONNECTED | ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) < 0 ||
        !(s->mon = zmq_socket(s->zctx, ZMQ_PAIR)) ||
        zmq_setsockopt(s->mon, ZMQ_LINGER, &linger, sizeof(linger)) < 0 ||
        zmq_connect(s->mon, addr) < 0) {
        int rc = zerr();
        kvb_err("source", "%s: cannot monitor the connection: %s", s->name, zmq_strerror(-rc));
        return rc;
    }
    return 0;
}

static int op_request(void *ctx, uint64_t from);
static void op_cancel(void *ctx);

/* The parameters, with copies of what they point to (p's pointers are the
 * caller's); the rate limits. */
static int copy_params(struct kvb_source *s, const struct kvb_source_params *p)
{
    s->p = *p;
    s->rl_frames = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(10000, 5);
    s->rl_topics = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(10000, 5);
    s->rl_expire = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(10000, 5);
    s->rl_peers = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(10000, 5);
    s->rl_drops = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(10000, 5);
    s->p.topics = NULL;
    s->p.n_topics = 0;
    if (p->n_topics && !(s->topics = calloc(p->n_topics, sizeof *s->topics)))
        return -ENOMEM;
    for (; s->p.n_topics < p->n_topics; s->p.n_topics++) {
        struct kvb_topic_cfg *t = &s->topics[s->p.n_topics];
        t->worker_id = p->topics[s->p.n_topics].worker_id;
        if (!(t->topic = strdup(p->topics[s->p.n_topics].topic)))
            return -ENOMEM;
    }
    s->p.topics = s->topics;
    if (p->worker) {
        s->worker = *p->worker;
        s->p.worker = &s->worker;
    }
    if (!s->p.max_peers)
        s->p.max_peers = 16;
    s->endpoint = strdup(p->endpoint);
    s->replay_endpoint = strdup(p->replay_endpoint ? p->replay_endpoint : "");
    s->topic = strdup(p->topic ? p->topic : "");
    if (!s->endpoint || !s->replay_endpoint || !s->topic)
        return -ENOMEM;
    s->p.endpoint = s->endpoint;
    s->p.replay_endpoint = s->replay_endpoint;
    s->p.topic = s->topic;
    s->p.resume = NULL; /* only read here: */
    s->p.curve = NULL;
    s->p.zap = NULL;
    snprintf(s->name, sizeof(s->name), "%s", s->endpoint);
    return 0;
}

/* This source's streams of the saved state (find_stream resumes them). */
static int copy_resume(struct kvb_source *s, const struct kvb_state *resume)
{
    for (size_t i = 0; resume && i < resume->n_streams; i++) {
        const struct kvb_state_stream *e = &resume->streams[i];
        if (strcmp(e->source, s->name) != 0)
            continue;
        if (!s->resume && !(s->resume = kvb_state_new()))
            return -ENOMEM;
        int rc = kvb_state_add_entry(s->resume, e);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* The sequence rules, handing batches to the pipeline and requests to this
 * source's replay DEALER. */
static int make_rules(struct kvb_source *s, const struct kvb_source_params *p)
{
    /* Live batches held while a replay runs: at most rcvhwm (what the SUB
     * would have queued had kvbridge not read them), but room for
     * MIN_HELD_MSGS whatever rcvhwm is (a replay of a few seconds under a
     * fast engine), and MAX_HELD_MSGS at most: the memory bound of
     * kvbridge(8), MEMORY. */
    size_t held = p->rcvhwm < MIN_HELD_MSGS   ? MIN_HELD_MSGS
                  : p->rcvhwm > MAX_HELD_MSGS ? MAX_HELD_MSGS
                                              : p->rcvhwm;
    struct kvb_replay_cfg rcfg = {.name = s->name,
                                  .endpoint = s->replay_endpoint,
                                  .timeout_ms = p->replay_timeout_ms,
                                  .max_ms = p->replay_max_ms,
                                  .max_batches = p->replay_max_batches,
                                  .max_payload_bytes = p->max_payload_bytes,
                                  .max_held_msgs = held};
    struct kvb_seq_ops ops = kvb_pipeline_seq_ops(p->pipeline);
    struct kvb_replay_io io = {.ctx = s, .request = op_request, .cancel = op_cancel};
    return kvb_replay_create(&rcfg, s->m, &ops, &io, &s->rp);
}

/* The SUB's options, before its bind or connect. */
static int set_sub_options(struct kvb_source *s, const struct kvb_source_params *p)
{
    /* reconnect to an absent engine at once, then every reconnect_max_ms at
     * most (libzmq's timer, no busy loop): an engine that binds after
     * kvbridge, or restarts, is reached almost at once, and what it
     * published before that is recovered from its replay socket */
    int hwm = (int)(p->rcvhwm > INT32_MAX ? INT32_MAX : p->rcvhwm), linger = 0;
    int ivl_max = (int)(p->reconnect_max_ms ? p->reconnect_max_ms : 250);
    int ivl = ivl_max < 100 ? ivl_max : 100;
    /* Connect mode: no ZMQ_MAXMSGSIZE: libzmq treats an oversize frame as a
     * protocol error and a connecting SUB never reconnects after one (the
     * engine would be lost for good), and nothing would be counted.  The
     * size is checked after the receive instead (replay.c); kvbridge never
     * decodes such a frame.  Bind mode: the peers connect, so they come back
     * after libzmq drops one for an oversize frame.  ZMQ_MAXMSGSIZE there is
     * the limit itself: a peer that announces a larger frame is dropped
     * before libzmq buffers it (the lost batches show as a gap), and with at
     * most max_peers connections (on_conn_event) the unfinished frames of
     * every peer together stay under max_peers x max_payload_bytes (20 peers
     * that each left 240 MiB of a 250 MiB frame once held 4.8 GB). */
    int64_t maxmsg = p->max_payload_bytes > INT64_MAX ? INT64_MAX : (int64_t)p->max_payload_bytes;
    if (zmq_setsockopt(s->sub, ZMQ_RCVHWM, &hwm, sizeof(hwm)) < 0 ||
        (p->mode == KVB_MODE_BIND && maxmsg > 0 &&
         zmq_setsockopt(s->sub, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg)) < 0) ||
        zmq_setsockopt(s->sub, ZMQ_LINGER, &linger, sizeof(linger)) < 0 ||
        zmq_setsockopt(s->sub, ZMQ_RECONNECT_IVL, &ivl, sizeof(ivl)) < 0 ||
        zmq_setsockopt(s->sub, ZMQ_RECONNECT_IVL_MAX, &ivl_max, sizeof(ivl_max)) < 0 ||
        zmq_setsockopt(s->sub, ZMQ_SUBSCRIBE, s->topic, strlen(s->topic)) < 0)
        return zerr();
    return 0;
}

/* The SUB: options, CURVE, its connection monitor, then bind or connect. */
static int open_sub(struct kvb_source *s, const struct kvb_source_params *p)
{
    int rc;
    if (!(s->sub = zmq_socket(s->zctx, ZMQ_SUB)))
        return zerr();
    if ((rc = set_sub_options(s, p)) < 0)
        return rc;
    if (p->curve && p->curve->enabled && (rc = setup_curve(s, p)) < 0) {
        kvb_err("source", "%s: cannot set up CURVE: %s", s->endpoint, strerror(-rc));
        return rc;
    }
    if ((rc = open_monitor(s)) < 0)
        return rc;
    rc =
        p->mode == KVB_MODE_BIND ? zmq_bind(s->sub, s->endpoint) : zmq_connect(s->sub, s->endpoint);
    if (rc < 0) {
        rc = zerr();
        kvb_err("source", "%s: cannot %s: %s", s->endpoint,
                p->mode == KVB_MODE_BIND ? "bind" : "connect", zmq_strerror(-rc));
    }
    return rc;
}

int kvb_source_create(void *zctx, const struct kvb_source_params *p, struct kvb_metrics *m,
                      struct kvb_source **out)
{
    int rc = -ENOMEM;
    struct kvb_source *s = calloc(1, sizeof(*s));
    if (!s)
        goto fail;
    s->zctx = zctx;
    s->m = m;
    if ((rc = copy_params(s, p)) < 0 || (rc = copy_resume(s, p->resume)) < 0 ||
        (rc = make_rules(s, p)) < 0 || (rc = open_sub(s, p)) < 0)
        goto fail;
    *out = s;
    return 0;
fail:
    kvb_source_destroy(&s);
    return rc;
}

static void close_dealer(struct kvb_source *s)
{
    if (s->dealer)
        zmq_close(s->dealer);
    s->dealer = NULL;
}

void kvb_source_destroy(struct kvb_source **ps)
{
    if (!ps || !*ps)
        return;
    struct kvb_source *s = *ps;
    if (s->mon) {
        /* the monitor stops first: libzmq's I/O thread sends each event to
         * the monitor's PAIR with a blocking send, holding the monitor's
         * lock, and a PAIR without its peer blocks: an event after our end
         * closed would hang that thread and this call */
        zmq_socket_monitor(s->sub, NULL, 0);
        zmq_close(s->mon);
    }
    if (s->sub)
        zmq_close(s->sub);
    close_dealer(s);
    kvb_zap_remove(s->zap, s->zap_domain);
    explicit_bzero(s->curve_secret, sizeof(s->curve_secret));
    kvb_replay_destroy(&s->rp);
    for (size_t i = 0; i < s->n_streams; i++)
        free(s->streams[i]);
    kvb_state_free(&s->resume);
    for (size_t i = 0; s->topics && i < s->p.n_topics; i++)
        free(s->topics[i].topic);
    free(s->topics);
    free(s->endpoint);
    free(s->replay_endpoint);
    free(s->topic);
    free(s);
    *ps = NULL;
}

void *kvb_source_sub(struct kvb_source *s) { return s->sub; }
/* Not while a drop waits for the batches queued before it (its events stay
 * queued: polling them would not block). */
void *kvb_source_monitor(struct kvb_source *s) { return s->drop_due ? NULL : s->mon; }
void *kvb_source_replay(struct kvb_source *s)
{
    return kvb_replay_active(s->rp) ? s->dealer : NULL;
}
const char *kvb_source_name(const struct kvb_source *s) { return s->name; }

void kvb_source_foreach_stream(const struct kvb_source *s,
                               void (*fn)(void *, const char *, const char *,
                                          const struct kvb_stream *),
                               void *ctx)
{
    for (size_t i = 0; i < s->n_streams; i++)
        fn(ctx, s->name, s->streams[i]->topic, &s->streams[i]->st);
}

/* The table is full: forget the least recently used stream idle for at
 * least STREAM_IDLE_MS, unless a replay is for it (it may hold batches).
 * Returns whether one was expired. */
static bool expire_idle(struct kvb_source *s, uint64_t now)
{
    const struct kvb_stream *busy = kvb_replay_stream(s->rp);
    size_t victim = s->n_streams;
    for (size_t i = 0; i < s->n_streams; i++) {
        const struct stream *st = s->streams[i];
        if (&st->st == busy || now - st->used_ms < STREAM_IDLE_MS)
            continue;
        if (victim == s->n_streams || st->used_ms < s->streams[victim]->used_ms)
            victim = i;
    }
    if (victim == s->n_streams)
        return false;
    struct stream *st = s->streams[victim];
    kvb_inc(&s->m->streams_expired_total[0]);
    kvb_log_rl(&s->rl_expire, KVB_LOG_WARN, "source",
               "%s: %d streams (topics): expired %s, idle for %llu ms (if it comes back: a "
               "new stream, with its start barrier)",
               s->name, MAX_STREAMS, st->name, (unsigned long long)(now - st->used_ms));
    free(st);
    s->streams[victim] = s->streams[--s->n_streams];
    return true;
}

static struct stream *find_stream(struct kvb_source *s, const void *topic, size_t n, uint64_t now)
{
    for (size_t i = 0; i < s->n_streams; i++) {
        struct stream *st = s->streams[i];
        if (st->topic_len == n && memcmp(st->topic, topic, n) == 0) {
            st->used_ms = now;
            return st;
        }
    }
    if (n >= MAX_TOPIC || (s->n_streams >= MAX_STREAMS && !expire_idle(s, now)))
        return NULL;
    struct stream *st = calloc(1, sizeof(*st));
    if (!st)
        return NULL;
    memcpy(st->topic, topic, n);
    st->topic[n] = '\0';
    st->topic_len = n;
    st->peer_fd = -1;
    st->used_ms = now;
    if (n)
        snprintf(st->name, sizeof(st->name), "%s topic '%s'", s->name, st->topic);
    else
        snprintf(st->name, sizeof(st->name), "%s", s->name);
    kvb_stream_init(&st->st, st->name, s->p.dp_rank);
    stream_worker(s, st);
    kvb_stream_set_labels(&st->st, s->name, st->topic);
    const struct kvb_state_stream *saved = kvb_state_find_stream(s->resume, s->name, st->topic);
    if (saved) { /* resume: no start barrier, a gap goes to replay */
        kvb_stream_resume(&st->st, saved->last, saved->ranks, saved->n_ranks);
        kvb_info("source", "%s: resuming after seq %llu", st->name,
                 (unsigned long long)saved->last);
        /* once: the same topic after its stream expired is a new stream */
        ((struct kvb_state_stream *)saved)->source[0] = '\0';
    }
    st->slot = kvb_metrics_stream_slot(s->m, s->name, st->topic);
    s->streams[s->n_streams++] = st;
    return st;
}

static uint64_t be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

/* Receive one multipart message into up to `max` frames; returns the number
 * of frames (all of them, even beyond max: extra ones are dropped), 0 when
 * nothing is waiting, or a negative errno. */
static int recv_multipart(void *sock, zmq_msg_t *frames, int max)
{
    int n = 0;
    for (;;) {
        // cppcheck-suppress uninitvar ; &tmp is an address: zmq_msg_init() fills it
        zmq_msg_t tmp, *f = n < max ? &frames[n] : &tmp;
        zmq_msg_init(f);
        if (zmq_msg_recv(f, sock, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            int e = zmq_errno();
            zmq_msg_close(f);
            if (n == 0 && e == EAGAIN)
                return 0;
            for (int i = 0; i < n && i < max; i++)
                zmq_msg_close(&frames[i]);
            return -e;
        }
        bool more = zmq_msg_more(f);
        if (f == &tmp)
            zmq_msg_close(&tmp);
        n++;
        if (!more)
            return n;
    }
}

static void close_frames(zmq_msg_t *frames, int n, int max)
{
    for (int i = 0; i < n && i < max; i++)
        zmq_msg_close(&frames[i]);
}

/* ---- the replay socket, for the rules in replay.c ----------------------- */

/* io.request: ask the engine for every batch from `from` on (a DEALER,
 * opened on first use). */
static int op_request(void *ctx, uint64_t from)
{
    struct kvb_source *s = ctx;
    if (!s->dealer) {
        s->dealer = zmq_socket(s->zctx, ZMQ_DEALER);
        /* bounded: a flood of replies waits in the engine (or TCP), and a
         * frame far above the payload limit drops the connection (the
         * replay then times out) instead of being buffered */
        int linger = 0, hwm = REPLAY_RCVHWM;
        int64_t maxmsg = (int64_t)s->p.max_payload_bytes * 16;
        if (maxmsg < (int64_t)64 << 20)
            maxmsg = (int64_t)64 << 20;
        if (!s->dealer || zmq_setsockopt(s->dealer, ZMQ_LINGER, &linger, sizeof(linger)) < 0 ||
            zmq_setsockopt(s->dealer, ZMQ_RCVHWM, &hwm, sizeof(hwm)) < 0 ||
            zmq_setsockopt(s->dealer, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg)) < 0 ||
            (s->curve_client && set_curve_client(s, s->dealer) < 0) ||
            zmq_connect(s->dealer, s->replay_endpoint) < 0) {
            int rc = zerr();
            close_dealer(s);
            return rc;
        }
    }
    uint8_t start[8];
    for (int i = 0; i < 8; i++)
        start[i] = (uint8_t)(from >> (56 - 8 * i));
    if (zmq_send(s->dealer, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(s->dealer, start, 8, ZMQ_DONTWAIT) < 0) {
        int rc = zerr();
        close_dealer(s);
        return rc;
    }
    return 0;
}

/* io.cancel: late replies of a request must not reach the next one. */
static void op_cancel(void *ctx) { close_dealer(ctx); }

/* The topic frame of a new-layout reply is the stream's being recovered. */
static bool replay_topic_ok(struct kvb_source *s, zmq_msg_t *topic)
{
    const struct kvb_stream *want = kvb_replay_stream(s->rp);
    for (size_t i = 0; i < s->n_streams; i++) {
        const struct stream *st = s->streams[i];
        if (&st->st == want)
            return zmq_msg_size(topic) == st->topic_len &&
                   memcmp(zmq_msg_data(topic), st->topic, st->topic_len) == 0;
    }
    return false;
}

static int read_replay(struct kvb_source *s, int budget)
{
    zmq_msg_t f[4];
    int total = 0;
    long events = 0;
    while (kvb_replay_active(s->rp) && s->dealer && total < budget && events < READ_EVENT_BUDGET) {
        int n = recv_multipart(s->dealer, f, 4);
        if (n <= 0)
            return n < 0 ? n : total;
        total++;
        /* old: ["", seq, payload]   new: ["", topic, seq, payload] */
        int si = n == 3 ? 1 : n == 4 ? 2 : -1;
        if (si < 0 || zmq_msg_size(&f[0]) != 0 || zmq_msg_size(&f[si]) != 8) {
            kvb_inc(&s->m->malformed_messages_total[KVB_MAL_REPLAY_REPLY]);
            close_frames(f, n, 4);
            continue;
        }
        uint64_t seq = be64(zmq_msg_data(&f[si]));
        if (n == 4 && seq != KVB_REPLAY_END && !replay_topic_ok(s, &f[1])) {
            /* new layout: a batch of another stream cannot fill this gap */
            kvb_inc(&s->m->malformed_messages_total[KVB_MAL_REPLAY_REPLY]);
            kvb_log_rl(&s->rl_frames, KVB_LOG_WARN, "replay",
                       "%s: replay reply for another topic: dropped", s->name);
            close_frames(f, n, 4);
            continue;
        }
        int rc = kvb_replay_reply(s->rp, seq, zmq_msg_data(&f[si + 1]), zmq_msg_size(&f[si + 1]),
                                  kvb_mono_ms());
        close_frames(f, n, 4);
        if (rc < 0)
            return rc;
        events += rc;
    }
    return total;
}

size_t kvb_source_held(const struct kvb_source *s) { return kvb_replay_held(s->rp); }

bool kvb_source_busy(const struct kvb_source *s) { return s->draining || kvb_replay_active(s->rp); }

bool kvb_source_connected(const struct kvb_source *s)
{
    return s->p.mode == KVB_MODE_BIND ? s->peers > 0 : s->conns > 0;
}

bool kvb_source_quiet(const struct kvb_source *s)
{
    return !s->drop_due && !kvb_source_busy(s) && !has_input(s->sub) && !has_input(s->mon);
}

void kvb_source_endpoints(const struct kvb_source *s, const char **endpoint,
                          const char **replay_endpoint, const char **topic)
{
    *endpoint = s->endpoint;
    *replay_endpoint = s->replay_endpoint;
    *topic = s->topic;
}

long kvb_source_next_deadline(const struct kvb_source *s, uint64_t now_ms)
{
    long t = kvb_replay_next_deadline(s->rp, now_ms);
    if (s->draining)
        return 0; /* kvb_source_tick() sees whether the queue ran empty */
    if (t >= 0)
        return t; /* the checks wait for the replay */
    for (size_t i = 0; i < s->n_streams; i++)
        if (s->streams[i]->prove_due)
            return 0;
    for (size_t i = 0; i < s->n_streams; i++)
        if (s->streams[i]->check_due || s->streams[i]->st.check_again)
            return s->live_ms + CHECK_QUIET_MS > now_ms
                       ? (long)(s->live_ms + CHECK_QUIET_MS - now_ms)
                       : 0;
    return -1;
}

/* The SUB's queue ran empty after a hold: if it held enough to have been
 * full (libzmq counts a queue full up to half its high-water mark early, at
 * most 1024 messages early), the engine may have dropped batches. */
static void drained(struct kvb_source *s)
{
    uint64_t hwm = s->p.rcvhwm, full = hwm / 2 < 1024 ? hwm / 2 : 1024;
    s->draining = false;
    // cppcheck-suppress knownConditionTrueFalse ; rcvhwm 1 gives full 0
    if (!hwm || s->drained < (full ? full : 1))
        return;
    bool armed = false;
    for (size_t i = 0; i < s->n_streams; i++) {
        struct stream *st = s->streams[i];
        armed |= st->check_due;
        st->check_due |= st->st.has_last;
    }
    if (!armed) /* (once per check, not per pause of a flapping outage) */
        kvb_info("source",
                 "%s: %llu batches were queued when reading resumed: the engine "
                 "may have dropped some, checking once the streams are quiet",
                 s->name, (unsigned long long)s->drained);
}

/* ---- live messages ------------------------------------------------------ */

/* Per-stream series: copied from the streams (which the rules keep) after
 * each entry point, live or replay. */
static void sync_slots(struct kvb_source *s)
{
    for (size_t i = 0; i < s->n_streams; i++) {
        struct stream *st = s->streams[i];
        if (!st->slot)
            continue;
        kvb_set(&st->slot->batches, st->st.batches);
        kvb_set(&st->slot->events, st->st.events);
        kvb_set(&st->slot->gaps, st->st.gaps);
        kvb_set(&st->slot->last_seq, st->st.last);
    }
}

/* Latency metrics for one live message applied now (not held for a
 * replay): its processing time and its delay from the engine's timestamp. */
static void observe(struct kvb_source *s, uint64_t serial_before, uint64_t t0)
{
    const struct kvb_batch_info *b = kvb_pipeline_last_batch(s->p.pipeline);
    if (b->serial == serial_before)
        return;
    KVB_OBSERVE(s->m, batch_processing_seconds, kvb_mono_ns() - t0);
    if (b->decoded && b->ts > 0) {
        double now = (double)kvb_wall_ns() / 1e9;
        if (now >= b->ts)
            KVB_OBSERVE(s->m, publish_delay_seconds, (uint64_t)((now - b->ts) * 1e9));
    }
}

static int read_live(struct kvb_source *s, int budget)
{
    zmq_msg_t f[3];
    int got = 0;
    long events = 0;
    while (got < budget && events < READ_EVENT_BUDGET) {
        int n = recv_multipart(s->sub, f, 3);
        if (n < 0)
            return n == -EINTR ? got : n;
        if (n == 0) {
            if (s->draining)
                drained(s);
            break;
        }
        got++;
        uint64_t now = kvb_mono_ms();
        s->drained += s->draining;
        s->live_ms = now;
        if (n != 3) {
            kvb_inc(&s->m->malformed_messages_total[KVB_MAL_FRAMES]);
            kvb_log_rl(&s->rl_frames, KVB_LOG_WARN, "source",
                       "%s: message with %d frames (want 3): dropped", s->name, n);
            close_frames(f, n, 3);
            continue;
        }
        if (zmq_msg_size(&f[1]) != 8) {
            kvb_inc(&s->m->malformed_messages_total[KVB_MAL_SEQ_FRAME]);
            kvb_log_rl(&s->rl_frames, KVB_LOG_WARN, "source",
                       "%s: seq frame of %zu bytes (want 8): dropped", s->name,
                       zmq_msg_size(&f[1]));
            close_frames(f, n, 3);
            continue;
        }
        uint64_t wid;
        if (!topic_worker(s, zmq_msg_data(&f[0]), zmq_msg_size(&f[0]), &wid)) {
            /* several engines on one SUB, told apart by their topic: a
             * topic the map does not list has no worker, and none is guessed */
            char t[65];
            size_t tn = zmq_msg_size(&f[0]) < 64 ? zmq_msg_size(&f[0]) : 64;
            // cppcheck-suppress knownConditionTrueFalse ; tn is the topic frame's size
            for (size_t k = 0; k < tn; k++) { /* a peer's bytes: printable only */
                char ch = ((const char *)zmq_msg_data(&f[0]))[k];
                t[k] = ch >= 0x20 && ch < 0x7f ? ch : '?';
            }
            t[tn] = '\0';
            kvb_inc(&s->m->malformed_messages_total[KVB_MAL_UNKNOWN_TOPIC]);
            kvb_log_rl(&s->rl_topics, KVB_LOG_WARN, "source",
                       "%s: batch on topic '%s', which sources[].topics does not list: "
                       "dropped",
                       s->name, t);
            close_frames(f, n, 3);
            continue;
        }
        struct stream *st = find_stream(s, zmq_msg_data(&f[0]), zmq_msg_size(&f[0]), now);
        int rc = 0;
        if (!st) {
            kvb_inc(&s->m->malformed_messages_total[KVB_MAL_FRAMES]);
            kvb_log_rl(&s->rl_frames, KVB_LOG_WARN, "source",
                       "%s: topic of %zu bytes, or %d streams busy in the last %d ms: dropped",
                       s->name, zmq_msg_size(&f[0]), MAX_STREAMS, STREAM_IDLE_MS);
        } else {
            int fd = s->p.mode == KVB_MODE_BIND ? zmq_msg_get(&f[0], ZMQ_SRCFD) : -1;
            uint64_t seq = be64(zmq_msg_data(&f[1]));
            if (s->p.mode == KVB_MODE_BIND)
                st->peer_fd = fd;
            uint64_t serial = kvb_pipeline_last_batch(s->p.pipeline)->serial, t0 = kvb_mono_ns();
            rc =
                kvb_replay_live(s->rp, &st->st, seq, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]), now);
            observe(s, serial, t0);
        }
        close_frames(f, n, 3);
        if (rc < 0)
            return rc;
        events += rc;
    }
    return got;
}

/* ---- entry points: the work, then the per-stream metrics ---------------- */

static int read_before_drop(struct kvb_source *s, int budget);

int kvb_source_read(struct kvb_source *s, int budget)
{
    int rc = read_before_drop(s, budget);
    if (rc >= 0 && rc < budget) {
        int more = read_live(s, budget - rc);
        rc = more < 0 ? more : rc + more;
    }
    sync_slots(s);
    return rc;
}

int kvb_source_read_replay(struct kvb_source *s)
{
    uint64_t t0 = kvb_mono_ns();
    int rc = read_replay(s, READ_REPLAY_BUDGET);
    /* Applying and publishing the replies is our time, not the engine's:
     * a big reply paced by NATS (the JetStream ack window) must not run out
     * of replay.timeout_ms while the engine has long sent it. */
    s->replay_busy_ns += kvb_mono_ns() - t0;
    if (s->replay_busy_ns >= 1000000) {
        kvb_replay_postpone(s->rp, s->replay_busy_ns / 1000000);
        s->replay_busy_ns %= 1000000;
    }
    sync_slots(s);
    return rc;
}

void kvb_source_resume(struct kvb_source *s, uint64_t ms, uint64_t now_ms)
{
    kvb_replay_postpone(s->rp, ms);
    if (!s->draining) { /* (still draining after an earlier hold: it goes on) */
        s->draining = true;
        s->drained = 0;
    }
    s->live_ms = now_ms; /* quiet counts from here */
}

/* The first check of a quiet source that is due, unless a replay runs. */
static void check_quiet(struct kvb_source *s, uint64_t now_ms)
{
    if (s->draining && !has_input(s->sub))
        drained(s);
    if (now_ms < s->live_ms + CHECK_QUIET_MS || kvb_replay_active(s->rp))
        return;
    for (size_t i = 0; i < s->n_streams; i++) {
        struct stream *st = s->streams[i];
        if (!st->check_due && !st->st.check_again)
            continue;
        st->check_due = false;
        int rc = kvb_replay_check(s->rp, &st->st, now_ms);
        if (rc < 0)
            kvb_err("replay", "%s: %s", st->name, strerror(-rc));
        if (kvb_replay_active(s->rp))
            return; /* one at a time: the next one once it is over */
    }
}

/* The streams whose connection came back, proven one at a time (a replay
 * is for one stream). */
static void prove_pending(struct kvb_source *s, uint64_t now_ms)
{
    for (size_t i = 0; i < s->n_streams && !kvb_replay_active(s->rp); i++) {
        struct stream *st = s->streams[i];
        if (!st->prove_due)
            continue;
        st->prove_due = false;
        int rc = kvb_replay_connected(s->rp, &st->st, now_ms);
        if (rc == -EBUSY)
            st->prove_due = true;
        else if (rc < 0)
            kvb_err("replay", "%s: %s", st->name, strerror(-rc));
    }
}

void kvb_source_tick(struct kvb_source *s, uint64_t now_ms)
{
    int rc = kvb_replay_tick(s->rp, now_ms);
    if (rc < 0)
        kvb_err("replay", "%s: %s", s->name, strerror(-rc));
    prove_pending(s, now_ms);
    check_quiet(s, now_ms);
    sync_slots(s);
}

/* Bind mode: a connection beyond max_peers is shut down as soon as it is
 * accepted (libzmq then closes it: the fd stays libzmq's).  The event comes
 * after the fact, so the fd is checked to still be a connection accepted on
 * this source's port before anything is done to it. */
static void refuse_peer(struct kvb_source *s, int fd)
{
    struct sockaddr_storage a;
    socklen_t al = sizeof(a);
    int type = 0;
    socklen_t tl = sizeof(type);
    const char *colon = strrchr(s->endpoint, ':');
    long port = colon && strncmp(s->endpoint, "tcp://", 6) == 0 ? strtol(colon + 1, NULL, 10) : -1;
    if (fd < 0 || getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) < 0 || type != SOCK_STREAM ||
        getsockname(fd, (struct sockaddr *)&a, &al) < 0)
        return;
    long local = a.ss_family == AF_INET    ? ntohs(((struct sockaddr_in *)&a)->sin_port)
                 : a.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&a)->sin6_port)
                                           : -2; /* ipc://: the fd is libzmq's, trust it */
    if (local != port && local != -2)
        return;
    shutdown(fd, SHUT_RDWR);
    kvb_inc(&s->m->peers_refused_total[0]);
    kvb_log_rl(&s->rl_peers, KVB_LOG_WARN, "source",
               "%s: %ld engine connections, sources[].max_peers is %u: closing the new one",
               s->name, s->peers, s->p.max_peers);
}

/* A message is waiting on SOCK (ZMQ_EVENTS: nothing is read). */
static bool has_input(void *sock)
{
    int ev = 0;
    size_t len = sizeof(ev);
    return sock && zmq_getsockopt(sock, ZMQ_EVENTS, &ev, &len) == 0 && (ev & ZMQ_POLLIN);
}

/* The engine's connection FD (bind mode; -1: unknown) dropped: its streams'
 * next batches must prove they continue them. */
static void apply_drop(struct kvb_source *s, int fd, const char *addr)
{
    bool any = false;
    for (size_t i = 0; i < s->n_streams; i++) {
        struct stream *st = s->streams[i];
        /* bind mode: the streams that came on that connection (all of them
         * when libzmq cannot tell) */
        if (s->p.mode == KVB_MODE_BIND && st->peer_fd >= 0 && fd >= 0 && st->peer_fd != fd)
            continue;
        st->peer_fd = -1;
        any |= st->st.has_last;
        kvb_replay_peer_reset(s->rp, &st->st, kvb_mono_ms());
    }
    /* rate-limited as the refusal is: a peer closed over max_peers that
     * reconnects at once drops a connection every few milliseconds */
    kvb_log_rl(&s->rl_drops, KVB_LOG_INFO, "source", "%s: engine connection dropped (%s)%s",
               s->name, addr, any ? ": the next batches must prove they continue the stream" : "");
}

/* One event of the SUB's monitor.  A drop is applied at once only when no
 * batch is queued: the monitor and the SUB are two queues, and the batches
 * the SUB still holds were received before the drop (libzmq keeps them), so
 * they are read first (kvb_source_read); otherwise they would have to prove
 * a continuity that is not in question (a spurious restart barrier). */
static void on_conn_event(struct kvb_source *s, unsigned ev, int fd, const char *addr)
{
    if (ev == ZMQ_EVENT_ACCEPTED && s->p.mode == KVB_MODE_BIND &&
        ++s->peers > (long)s->p.max_peers) {
        refuse_peer(s, fd);
        return;
    }
    if (ev == ZMQ_EVENT_CONNECTED || ev == ZMQ_EVENT_ACCEPTED) {
        s->conns += ev == ZMQ_EVENT_CONNECTED;
        kvb_info("source", "%s: engine connection up (%s)", s->name, addr);
        /* connect mode: the one engine is back; its streams are proven now,
         * not at their next batch (an engine that restarted and went quiet
         * sends none).  Bind mode: which engine connected is known from its
         * batches only. */
        for (size_t i = 0; ev == ZMQ_EVENT_CONNECTED && i < s->n_streams; i++)
            s->streams[i]->prove_due |= s->streams[i]->st.suspect;
        prove_pending(s, kvb_mono_ms());
        return;
    }
    if (ev != ZMQ_EVENT_DISCONNECTED)
        return;
    if (s->p.mode == KVB_MODE_BIND && s->peers > 0)
        s->peers--;
    if (s->p.mode != KVB_MODE_BIND && s->conns > 0)
        s->conns--;
    if (has_input(s->sub)) {
        s->drop_due = true;
        s->drop_fd = fd;
        snprintf(s->drop_addr, sizeof(s->drop_addr), "%s", addr);
        return;
    }
    apply_drop(s, fd, addr);
}

/* The batches queued before a drop: read one at a time until the SUB is
 * empty or the monitor has news (a new connection's batches may follow
 * it), then the drop.  Returns messages read, or a negative errno. */
static int read_before_drop(struct kvb_source *s, int budget)
{
    int got = 0;
    while (s->drop_due && got < budget) {
        int n = has_input(s->mon) || !has_input(s->sub) ? 0 : read_live(s, 1);
        if (n < 0)
            return n;
        if (n == 0) {
            s->drop_due = false;
            apply_drop(s, s->drop_fd, s->drop_addr);
            break;
        }
        got += n;
    }
    return got;
}

int kvb_source_read_monitor(struct kvb_source *s)
{
    int got = 0;
    zmq_msg_t f[2];
    for (int n; !s->drop_due && (n = recv_multipart(s->mon, f, 2)) > 0; got++) {
        if (n == 2 && zmq_msg_size(&f[0]) >= 6) {
            const uint8_t *d = zmq_msg_data(&f[0]);
            uint16_t ev;
            int32_t val;
            memcpy(&ev, d, 2);
            memcpy(&val, d + 2, 4);
            char addr[256];
            size_t al =
                zmq_msg_size(&f[1]) < sizeof(addr) - 1 ? zmq_msg_size(&f[1]) : sizeof(addr) - 1;
            memcpy(addr, zmq_msg_data(&f[1]), al);
            addr[al] = '\0';
            on_conn_event(s, ev, val, addr);
        }
        close_frames(f, n, 2);
    }
    sync_slots(s);
    return got;
}

int kvb_source_barrier_all(struct kvb_source *s, int cause)
{
    int n = 0;
    for (size_t i = 0; i < s->n_streams; i++) {
        if (!s->streams[i]->st.has_last)
            continue;
        int rc = kvb_replay_barrier(s->rp, &s->streams[i]->st, cause);
        if (rc < 0)
            return rc;
        n += rc;
    }
    return n;
}
