/* source: ZMQ SUB, frames, streams, replay.  See include/source.h. */
#include "source.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "clock.h"
#include "log.h"

#define MAX_STREAMS 64            /* distinct topics per source */
#define MAX_TOPIC 256
#define MAX_HELD_MSGS 100000      /* live batches held while a replay runs */
#define MAX_HELD_BYTES (256u << 20)
#define REPLAY_END UINT64_MAX
#define REPLAY_STALL_MS 250       /* no reply for this long once replies flow: cut */
#define REPLAY_MAX_ROUNDS 1000    /* re-requests after cut replies, per gap */

struct held {
    uint64_t seq;
    size_t len;
    uint8_t *data;
};

struct stream {
    struct kvb_stream_slot *slot; /* metrics; NULL when all slots are taken */
    char topic[MAX_TOPIC];
    char name[MAX_TOPIC + 320];
    struct kvb_stream st;
};

struct replay {
    bool active;
    struct stream *st;       /* the stream being recovered */
    uint64_t want;           /* next seq we need */
    uint64_t until;          /* seq of the first held live batch */
    uint64_t deadline_ms;
    uint64_t req_want;       /* rp->want when the last request was sent */
    bool got_reply;          /* the current request has had a reply */
    unsigned rounds;         /* requests sent again after a partial reply */
    bool barrier_sent;       /* part of the gap was lost: barrier published */
    struct held *held;
    size_t n_held, cap_held, held_bytes;
};

struct kvb_source {
    struct kvb_source_params p;
    struct kvb_state *resume;  /* this source's saved streams, consumed by find_stream */
    char *endpoint, *replay_endpoint, *topic;
    char name[300];
    void *zctx;
    void *sub;
    void *dealer;
    struct kvb_metrics *m;
    struct stream *streams[MAX_STREAMS];
    size_t n_streams;
    struct replay rp;
    struct kvb_ratelimit rl_frames;
    /* connect mode with CURVE: the client keys, for the replay DEALER too */
    bool curve_client;
    uint8_t curve_secret[32], curve_public[32], curve_server[32];
    struct kvb_zap *zap;      /* with zap_domain registered, or NULL */
    char zap_domain[KVB_ZAP_DOMAIN_MAX];
};

int kvb_endpoint_with_offset(const char *endpoint, uint32_t offset, char **out)
{
    if (offset == 0 || endpoint[0] == '\0') {
        *out = strdup(endpoint);
        return *out ? 0 : -ENOMEM;
    }
    const char *colon = strrchr(endpoint, ':');
    if (!colon || strncmp(endpoint, "tcp://", 6) != 0)
        return -EINVAL;
    char *end;
    errno = 0;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (errno || *end || end == colon + 1 || port + offset > 65535)
        return -EINVAL;
    size_t n = (size_t)(colon - endpoint) + 8;
    char *s = malloc(n);
    if (!s)
        return -ENOMEM;
    snprintf(s, n, "%.*s:%lu", (int)(colon - endpoint), endpoint, port + offset);
    *out = s;
    return 0;
}

static int zerr(void) { return -(zmq_errno() ? zmq_errno() : EIO); }

/* The public key of a CURVE secret key (binary), through Z85. */
static int curve_public(const uint8_t secret[32], uint8_t pub[32])
{
    char zs[41], zp[41];
    int rc = zmq_z85_encode(zs, secret, 32) && zmq_curve_public(zp, zs) == 0 &&
                     zmq_z85_decode(pub, zp)
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
        (s->zap && zmq_setsockopt(s->sub, ZMQ_ZAP_DOMAIN, s->zap_domain,
                                  strlen(s->zap_domain)) < 0))
        return zerr();
    kvb_info("source", "%s: CURVE server, %s", s->name,
             cv->n_allowed ? "clients in curve.allowed_clients_file only"
                           : "any client with its public key");
    return 0;
}

int kvb_source_create(void *zctx, const struct kvb_source_params *p, struct kvb_metrics *m,
                      struct kvb_source **out)
{
    int rc = -ENOMEM;
    struct kvb_source *s = calloc(1, sizeof(*s));
    if (!s)
        goto fail;
    s->p = *p;
    s->zctx = zctx;
    s->m = m;
    s->rl_frames = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(10000, 5);
    s->endpoint = strdup(p->endpoint);
    s->replay_endpoint = strdup(p->replay_endpoint ? p->replay_endpoint : "");
    s->topic = strdup(p->topic ? p->topic : "");
    if (!s->endpoint || !s->replay_endpoint || !s->topic)
        goto fail;
    s->p.endpoint = s->endpoint;
    s->p.replay_endpoint = s->replay_endpoint;
    s->p.topic = s->topic;
    s->p.resume = NULL;
    s->p.curve = NULL;
    s->p.zap = NULL;
    snprintf(s->name, sizeof(s->name), "%s", s->endpoint);
    for (size_t i = 0; p->resume && i < p->resume->n_streams; i++) {
        const struct kvb_state_stream *e = &p->resume->streams[i];
        if (strcmp(e->source, s->name) != 0)
            continue;
        if (!s->resume && !(s->resume = kvb_state_new()))
            goto fail;
        struct kvb_stream st = {.has_last = true, .last = e->last, .n_ranks = e->n_ranks};
        memcpy(st.ranks, e->ranks, sizeof(st.ranks));
        if ((rc = kvb_state_add_stream(s->resume, e->source, e->topic, &st)) < 0)
            goto fail;
        rc = -ENOMEM;
    }

    s->sub = zmq_socket(zctx, ZMQ_SUB);
    if (!s->sub) {
        rc = zerr();
        goto fail;
    }
    /* reconnect to an absent engine with backoff 100 ms .. 2 s, not every 100 ms */
    int hwm = (int)(p->rcvhwm > INT32_MAX ? INT32_MAX : p->rcvhwm), linger = 0, ivl_max = 2000;
    /* Connect mode: no ZMQ_MAXMSGSIZE: libzmq treats an oversize frame as a
     * protocol error and a connecting SUB never reconnects after one (the
     * engine would be lost for good), and nothing would be counted.  The
     * size is checked after the receive instead (oversize()); kvbridge never
     * decodes such a frame.  Bind mode: the peers connect, so they come back
     * after libzmq drops one for an oversize frame.  ZMQ_MAXMSGSIZE there is
     * a guard rail far above the limit (16 x, at least 64 MiB): a frame just
     * above the limit is still received and counted (with its barrier), but
     * no peer that can reach the address makes libzmq buffer a frame of any
     * size (that connection is dropped; the lost batches show as a gap). */
    int64_t maxmsg = (int64_t)p->max_payload_bytes * 16;
    if (maxmsg < (int64_t)64 << 20)
        maxmsg = (int64_t)64 << 20;
    if (zmq_setsockopt(s->sub, ZMQ_RCVHWM, &hwm, sizeof(hwm)) < 0 ||
        (p->mode == KVB_MODE_BIND && maxmsg > 0 &&
         zmq_setsockopt(s->sub, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg)) < 0) ||
        zmq_setsockopt(s->sub, ZMQ_LINGER, &linger, sizeof(linger)) < 0 ||
        zmq_setsockopt(s->sub, ZMQ_RECONNECT_IVL_MAX, &ivl_max, sizeof(ivl_max)) < 0 ||
        zmq_setsockopt(s->sub, ZMQ_SUBSCRIBE, s->topic, strlen(s->topic)) < 0) {
        rc = zerr();
        goto fail;
    }
    if (p->curve && p->curve->enabled && (rc = setup_curve(s, p)) < 0) {
        kvb_err("source", "%s: cannot set up CURVE: %s", s->endpoint, strerror(-rc));
        goto fail;
    }
    rc = p->mode == KVB_MODE_BIND ? zmq_bind(s->sub, s->endpoint)
                                  : zmq_connect(s->sub, s->endpoint);
    if (rc < 0) {
        rc = zerr();
        kvb_err("source", "%s: cannot %s: %s", s->endpoint,
                p->mode == KVB_MODE_BIND ? "bind" : "connect", zmq_strerror(-rc));
        goto fail;
    }
    *out = s;
    return 0;
fail:
    kvb_source_destroy(&s);
    return rc;
}

static void drop_held(struct replay *rp)
{
    for (size_t i = 0; i < rp->n_held; i++)
        free(rp->held[i].data);
    rp->n_held = 0;
    rp->held_bytes = 0;
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
    if (s->sub)
        zmq_close(s->sub);
    close_dealer(s);
    kvb_zap_remove(s->zap, s->zap_domain);
    explicit_bzero(s->curve_secret, sizeof(s->curve_secret));
    drop_held(&s->rp);
    free(s->rp.held);
    for (size_t i = 0; i < s->n_streams; i++)
        free(s->streams[i]);
    kvb_state_free(&s->resume);
    free(s->endpoint);
    free(s->replay_endpoint);
    free(s->topic);
    free(s);
    *ps = NULL;
}

void *kvb_source_sub(struct kvb_source *s) { return s->sub; }
void *kvb_source_replay(struct kvb_source *s) { return s->rp.active ? s->dealer : NULL; }
const char *kvb_source_name(const struct kvb_source *s) { return s->name; }

void kvb_source_foreach_stream(const struct kvb_source *s,
                               void (*fn)(void *, const char *, const char *,
                                          const struct kvb_stream *),
                               void *ctx)
{
    for (size_t i = 0; i < s->n_streams; i++)
        fn(ctx, s->name, s->streams[i]->topic, &s->streams[i]->st);
}

static struct stream *find_stream(struct kvb_source *s, const void *topic, size_t n)
{
    for (size_t i = 0; i < s->n_streams; i++) {
        struct stream *st = s->streams[i];
        if (strlen(st->topic) == n && memcmp(st->topic, topic, n) == 0)
            return st;
    }
    if (s->n_streams >= MAX_STREAMS || n >= MAX_TOPIC)
        return NULL;
    struct stream *st = calloc(1, sizeof(*st));
    if (!st)
        return NULL;
    memcpy(st->topic, topic, n);
    st->topic[n] = '\0';
    if (n)
        snprintf(st->name, sizeof(st->name), "%s topic '%s'", s->name, st->topic);
    else
        snprintf(st->name, sizeof(st->name), "%s", s->name);
    kvb_stream_init(&st->st, st->name, s->p.dp_rank);
    st->st.source = s->name;
    st->st.topic = st->topic;
    const struct kvb_state_stream *saved = kvb_state_find_stream(s->resume, s->name, st->topic);
    if (saved) { /* resume: no start barrier, a gap goes to replay */
        st->st.has_last = true;
        st->st.last = saved->last;
        st->st.n_ranks = saved->n_ranks;
        memcpy(st->st.ranks, saved->ranks, sizeof(st->st.ranks));
        kvb_info("source", "%s: resuming after seq %llu", st->name,
                 (unsigned long long)saved->last);
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

/* ---- replay ------------------------------------------------------------- */

/* A payload above limits.max_payload_bytes: counted, never decoded. */
static bool oversize(struct kvb_source *s, size_t len)
{
    if (!s->p.max_payload_bytes || len <= s->p.max_payload_bytes)
        return false;
    kvb_inc(&s->m->malformed_messages_total[KVB_MAL_OVERSIZE]);
    kvb_log_rl(&s->rl_frames, KVB_LOG_WARN, "source",
               "%s: payload of %zu bytes above limits.max_payload_bytes (%llu): dropped",
               s->name, len, (unsigned long long)s->p.max_payload_bytes);
    return true;
}

static int hold(struct replay *rp, uint64_t seq, const void *data, size_t len)
{
    if (rp->n_held >= MAX_HELD_MSGS || rp->held_bytes + len > MAX_HELD_BYTES)
        return -ENOBUFS;
    if (rp->n_held == rp->cap_held) {
        size_t cap = rp->cap_held ? rp->cap_held * 2 : 64;
        struct held *h = realloc(rp->held, cap * sizeof(*h));
        if (!h)
            return -ENOMEM;
        rp->held = h;
        rp->cap_held = cap;
    }
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy)
        return -ENOMEM;
    memcpy(copy, data, len);
    rp->held[rp->n_held++] = (struct held){seq, len, copy};
    rp->held_bytes += len;
    return 0;
}

/* Ask the engine for every batch from rp->want on.  The ROUTER's send
 * high-water mark may drop the tail of a long reply: the caller asks again
 * from where it got to (kvb_source_tick). */
static int send_request(struct kvb_source *s)
{
    struct replay *rp = &s->rp;
    if (!s->dealer) {
        s->dealer = zmq_socket(s->zctx, ZMQ_DEALER);
        int linger = 0, hwm = 0;
        if (!s->dealer || zmq_setsockopt(s->dealer, ZMQ_LINGER, &linger, sizeof(linger)) < 0 ||
            zmq_setsockopt(s->dealer, ZMQ_RCVHWM, &hwm, sizeof(hwm)) < 0 ||
            (s->curve_client && set_curve_client(s, s->dealer) < 0) ||
            zmq_connect(s->dealer, s->replay_endpoint) < 0) {
            int rc = zerr();
            close_dealer(s);
            return rc;
        }
    }
    uint8_t start[8];
    for (int i = 0; i < 8; i++)
        start[i] = (uint8_t)(rp->want >> (56 - 8 * i));
    if (zmq_send(s->dealer, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(s->dealer, start, 8, ZMQ_DONTWAIT) < 0) {
        int rc = zerr();
        close_dealer(s);
        return rc;
    }
    rp->req_want = rp->want;
    rp->got_reply = false;
    rp->deadline_ms = kvb_mono_ms() + s->p.replay_timeout_ms;
    return 0;
}

static int start_replay(struct kvb_source *s, struct stream *st, uint64_t seq)
{
    struct replay *rp = &s->rp;
    rp->st = st;
    rp->want = st->st.last + 1;
    rp->until = seq;
    rp->barrier_sent = false;
    rp->rounds = 0;
    int rc = send_request(s);
    if (rc < 0)
        return rc;
    rp->active = true;
    kvb_inc(&s->m->replays_requested_total[0]);
    kvb_info("replay", "%s: requesting seq %llu..%llu from %s", st->name,
             (unsigned long long)rp->want, (unsigned long long)(seq - 1), s->replay_endpoint);
    return 0;
}

/* Keep held[from..] and recover the gap before held[from] with a new replay. */
static int replay_again(struct kvb_source *s, struct stream *stm, size_t from)
{
    struct replay *rp = &s->rp;
    for (size_t i = 0; i < from; i++) {
        rp->held_bytes -= rp->held[i].len;
        free(rp->held[i].data);
    }
    memmove(rp->held, rp->held + from, (rp->n_held - from) * sizeof(*rp->held));
    rp->n_held -= from;
    return start_replay(s, stm, rp->held[0].seq);
}

/* The replay is over (filled or not): publish the barrier if part of the gap
 * stayed missing, then the held live batches, oldest first.  A new gap among
 * the held batches is recovered by another replay. */
static int finish_replay(struct kvb_source *s, struct kvb_pipeline *p, const char *why)
{
    struct replay *rp = &s->rp;
    struct stream *stm = rp->st;
    struct kvb_stream *st = &stm->st;
    int rc = 0;
    bool filled = rp->want >= rp->until && !rp->barrier_sent;
    close_dealer(s); /* late replies of this request must not reach the next one */
    rp->active = false;
    if (filled) {
        kvb_inc(&s->m->replays_filled_total[0]);
        kvb_info("replay", "%s: gap filled up to seq %llu", stm->name,
                 (unsigned long long)(rp->until - 1));
    } else {
        kvb_inc(&s->m->replays_failed_total[0]);
        kvb_warn("replay", "%s: gap before seq %llu not recovered (%s): publishing barrier",
                 stm->name, (unsigned long long)rp->until, why);
        if (!rp->barrier_sent && (rc = kvb_pipeline_barrier(p, st, KVB_BAR_GAP)) < 0)
            goto out;
    }
    for (size_t i = 0; i < rp->n_held; i++) {
        struct held *h = &rp->held[i];
        if (st->has_last && h->seq <= st->last)
            continue; /* already applied from the replay */
        if (i > 0 && kvb_seq_classify(st, h->seq) == KVB_SEQ_GAP) {
            kvb_inc(&s->m->seq_gaps_total[0]);
            st->gaps++;
            kvb_warn("source", "%s: seq gap: %llu missing before %llu, asking for replay",
                     stm->name, (unsigned long long)kvb_seq_missing(st, h->seq),
                     (unsigned long long)h->seq);
            if (replay_again(s, stm, i) == 0)
                return 0; /* the rest stays held */
            kvb_inc(&s->m->replays_failed_total[0]);
            if ((rc = kvb_pipeline_barrier(p, st, KVB_BAR_GAP)) < 0)
                goto out;
            i = 0; /* held[] now starts at the batch after the gap */
            h = &rp->held[0];
        }
        if ((rc = kvb_pipeline_apply(p, st, h->seq, h->data, h->len)) < 0)
            goto out;
    }
out:
    drop_held(rp);
    rp->active = false;
    rp->st = NULL;
    return rc < 0 ? rc : 0;
}

static int on_replay_batch(struct kvb_source *s, struct kvb_pipeline *p, uint64_t seq,
                           const void *data, size_t len)
{
    struct replay *rp = &s->rp;
    struct kvb_stream *st = &rp->st->st;
    if (seq < rp->want || seq >= rp->until)
        return 0; /* already applied, or live batches we hold */
    if (oversize(s, len)) { /* in the engine's buffer, but not usable */
        rp->want = seq + 1;
        rp->got_reply = true;
        return kvb_pipeline_reject(p, st, seq, "payload above limits.max_payload_bytes");
    }
    if (seq > rp->want) {
        if (rp->got_reply && rp->rounds < REPLAY_MAX_ROUNDS) {
            /* a hole in the middle of a reply: the ROUTER's HWM dropped
             * some; the engine still has them, ask again from want */
            rp->rounds++;
            close_dealer(s);
            return send_request(s);
        }
        /* the first reply starts later than asked: the engine's buffer no
         * longer holds the beginning of the gap */
        if (!rp->barrier_sent) {
            kvb_warn("replay", "%s: engine's replay starts at %llu, not %llu: publishing barrier",
                     rp->st->name, (unsigned long long)seq, (unsigned long long)rp->want);
            int rc = kvb_pipeline_barrier(p, st, KVB_BAR_GAP);
            if (rc < 0)
                return rc;
            rp->barrier_sent = true;
        }
    }
    rp->got_reply = true;
    rp->want = seq + 1;
    /* replies are flowing: a stall of this long means the reply was cut */
    uint64_t stall = s->p.replay_timeout_ms < REPLAY_STALL_MS ? s->p.replay_timeout_ms
                                                             : REPLAY_STALL_MS;
    rp->deadline_ms = kvb_mono_ms() + stall;
    return kvb_pipeline_apply(p, st, seq, data, len);
}

static int read_replay(struct kvb_source *s, struct kvb_pipeline *p)
{
    zmq_msg_t f[4];
    int total = 0;
    while (s->rp.active && s->dealer) {
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
        int rc = 0;
        if (seq == REPLAY_END)
            rc = finish_replay(s, p, "engine's replay buffer no longer holds it");
        else
            rc = on_replay_batch(s, p, seq, zmq_msg_data(&f[si + 1]), zmq_msg_size(&f[si + 1]));
        close_frames(f, n, 4);
        if (rc < 0)
            return rc;
        /* caught up: the rest of the reply is what we hold already (the
         * dealer is closed, so the remaining replies are dropped) */
        if (s->rp.active && s->rp.want >= s->rp.until && (rc = finish_replay(s, p, "the engine no longer held all of it")) < 0)
            return rc;
    }
    return total;
}

long kvb_source_next_deadline(const struct kvb_source *s, uint64_t now_ms)
{
    if (!s->rp.active)
        return -1;
    return s->rp.deadline_ms > now_ms ? (long)(s->rp.deadline_ms - now_ms) : 0;
}

static void tick(struct kvb_source *s, struct kvb_pipeline *p, uint64_t now_ms)
{
    struct replay *rp = &s->rp;
    if (rp->active && now_ms >= rp->deadline_ms) {
        /* progress since the last request, but no END: the ROUTER dropped
         * the rest of its reply (its HWM); ask again from where we are */
        if (rp->want > rp->req_want && rp->rounds < REPLAY_MAX_ROUNDS) {
            rp->rounds++;
            close_dealer(s);
            if (send_request(s) == 0) {
                kvb_debug("replay", "%s: reply cut at seq %llu, asking again", s->name,
                          (unsigned long long)rp->want);
                return;
            }
        }
        int rc = finish_replay(s, p, "replay timed out");
        if (rc < 0)
            kvb_err("replay", "%s: %s", s->name, strerror(-rc));
    }
}

/* ---- live messages ------------------------------------------------------ */


/* Per-stream series: copied from the streams (which the pipeline and the
 * replay code keep) after each entry point, live or replay. */
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
static void observe(struct kvb_source *s, struct kvb_pipeline *p, uint64_t serial_before,
                    uint64_t t0)
{
    const struct kvb_batch_info *b = kvb_pipeline_last_batch(p);
    if (b->serial == serial_before)
        return;
    KVB_OBSERVE(s->m, batch_processing_seconds, kvb_mono_ns() - t0);
    if (b->decoded && b->ts > 0) {
        double now = (double)kvb_wall_ns() / 1e9;
        if (now >= b->ts)
            KVB_OBSERVE(s->m, publish_delay_seconds, (uint64_t)((now - b->ts) * 1e9));
    }
}

static int on_live(struct kvb_source *s, struct kvb_pipeline *p, struct stream *st,
                   uint64_t seq, const void *data, size_t len)
{
    struct replay *rp = &s->rp;
    if (oversize(s, len)) {
        if (rp->active && rp->st == st) {
            int rc = finish_replay(s, p, "an oversize batch arrived meanwhile");
            if (rc < 0)
                return rc;
        }
        return kvb_pipeline_reject(p, &st->st, seq, "payload above limits.max_payload_bytes");
    }
    if (rp->active && rp->st == st) {
        int rc = hold(rp, seq, data, len);
        if (rc == 0)
            return 0;
        kvb_warn("replay", "%s: too many live batches held during replay", st->name);
        if ((rc = finish_replay(s, p, "hold queue full")) < 0)
            return rc;
        return kvb_pipeline_live(p, &st->st, seq, data, len);
    }
    int v = kvb_seq_classify(&st->st, seq);
    if (v == KVB_SEQ_GAP && s->replay_endpoint[0] && !rp->active) {
        kvb_inc(&s->m->seq_gaps_total[0]);
        st->st.gaps++;
        kvb_warn("source", "%s: seq gap: %llu missing before %llu, asking for replay", st->name,
                 (unsigned long long)kvb_seq_missing(&st->st, seq), (unsigned long long)seq);
        int rc = start_replay(s, st, seq);
        if (rc == 0 && (rc = hold(rp, seq, data, len)) == 0)
            return 0;
        kvb_warn("replay", "%s: cannot request replay: %s", st->name, strerror(-rc));
        if (rp->active) {
            rc = finish_replay(s, p, "request failed"); /* publishes the barrier */
        } else {
            kvb_inc(&s->m->replays_failed_total[0]);
            rc = kvb_pipeline_barrier(p, &st->st, KVB_BAR_GAP);
        }
        if (rc < 0)
            return rc;
        return kvb_pipeline_apply(p, &st->st, seq, data, len);
    }
    return kvb_pipeline_live(p, &st->st, seq, data, len);
}

static int read_live(struct kvb_source *s, struct kvb_pipeline *p, int budget)
{
    zmq_msg_t f[3];
    int got = 0;
    while (got < budget) {
        int n = recv_multipart(s->sub, f, 3);
        if (n < 0)
            return n == -EINTR ? got : n;
        if (n == 0)
            break;
        got++;
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
        struct stream *st = find_stream(s, zmq_msg_data(&f[0]), zmq_msg_size(&f[0]));
        int rc = 0;
        if (!st) {
            kvb_inc(&s->m->malformed_messages_total[KVB_MAL_FRAMES]);
            kvb_log_rl(&s->rl_frames, KVB_LOG_WARN, "source",
                       "%s: too many topics (or one too long): dropped", s->name);
        } else {
            uint64_t serial = kvb_pipeline_last_batch(p)->serial, t0 = kvb_mono_ns();
            rc = on_live(s, p, st, be64(zmq_msg_data(&f[1])), zmq_msg_data(&f[2]),
                         zmq_msg_size(&f[2]));
            observe(s, p, serial, t0);
        }
        close_frames(f, n, 3);
        if (rc < 0)
            return rc;
    }
    return got;
}

/* ---- entry points: the work, then the per-stream metrics ---------------- */

int kvb_source_read(struct kvb_source *s, struct kvb_pipeline *p, int budget)
{
    int rc = read_live(s, p, budget);
    sync_slots(s);
    return rc;
}

int kvb_source_read_replay(struct kvb_source *s, struct kvb_pipeline *p)
{
    int rc = read_replay(s, p);
    sync_slots(s);
    return rc;
}

void kvb_source_tick(struct kvb_source *s, struct kvb_pipeline *p, uint64_t now_ms)
{
    tick(s, p, now_ms);
    sync_slots(s);
}

int kvb_source_barrier_all(struct kvb_source *s, struct kvb_pipeline *p, int cause)
{
    int n = 0;
    for (size_t i = 0; i < s->n_streams; i++) {
        if (!s->streams[i]->st.has_last)
            continue;
        int rc = kvb_pipeline_barrier(p, &s->streams[i]->st, cause);
        if (rc < 0)
            return rc;
        n += rc;
    }
    return n;
}
