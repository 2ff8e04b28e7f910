/* publish: the publish stage.  See include/publish.h. */
#include "publish.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "config.h"
#include "discovery.h"
#include "encode.h"
#include "encode_msgpack.h"
#include "log.h"
#include "metrics.h"
#include "sink.h"
#include "subject.h"

#define SUBJECT_MAX 512
#define SUBJECT_CACHE 64          /* (worker_id, dp_rank) subjects kept */
#define HELD_MAX_BYTES (8u << 20) /* messages held for unregistered pairs */

struct subj {
    uint64_t worker_id;
    uint32_t dp_rank;
    char s[SUBJECT_MAX];
};

struct held {
    uint64_t worker_id;
    uint32_t dp_rank;
    char *subject;
    char *data;
    size_t len;
};

struct kvb_publish {
    struct kvb_publish_cfg cfg;
    struct kvb_metrics *m;
    struct kvb_sink *sink;
    struct kvb_publish_writer writer; /* .write set: sink-less */
    kvb_publish_observer_fn observe;
    void *observe_ctx;
    struct kvb_discovery *disc;
    struct kvb_mp_batcher *mp; /* dynamo-msgpack */
    struct kvb_encoder *enc;   /* dynamo-json */
    int format;
    bool jetstream;
    bool per_pair; /* the template has {worker_id} or {dp_rank} */
    char subject[SUBJECT_MAX];
    struct subj cache[SUBJECT_CACHE];
    size_t n_cache, next_evict;
    char scratch[SUBJECT_MAX];
    bool lost;
    uint64_t bytes;  /* handed to the sink or the writer */
    uint64_t now_ms; /* wall clock when the pending message began */
    struct held *held;
    size_t n_held, cap_held, held_bytes;
    struct kvb_ratelimit rl_publish, rl_held;
};

/* ---- subjects ----------------------------------------------------------- */

static int expand(struct kvb_publish *o, uint64_t worker, uint32_t rank, char *out)
{
    const struct kvb_publish_cfg *c = &o->cfg;
    struct kvb_subject_vals v = {c->namespace_, c->component, c->endpoint, worker, rank};
    unsigned flags = o->format == KVB_FORMAT_DYNAMO_JSON ? 0 : KVB_SUBJECT_PCT;
    int rc = kvb_subject_expand_vals(c->subject, &v, flags, out, SUBJECT_MAX);
    return rc < 0 ? rc : 0;
}

static int prepare(struct kvb_publish *o)
{
    const struct kvb_publish_cfg *c = &o->cfg;
    o->n_cache = o->next_evict = 0;
    o->jetstream = c->js_subject != NULL;
    if (o->jetstream) { /* one subject, resolved by the config module */
        o->per_pair = false;
        if (strlen(c->js_subject) >= sizeof(o->subject))
            return -ENAMETOOLONG;
        strcpy(o->subject, c->js_subject);
        return 0;
    }
    o->per_pair = strstr(c->subject, "{dp_rank}") || strstr(c->subject, "{worker_id}");
    return expand(o, c->worker_id, 0, o->subject);
}

struct kvb_publish_cfg kvb_publish_cfg_of(const struct kvb_config *c)
{
    return (struct kvb_publish_cfg){
        .format = c->nats.format,
        .subject = c->nats.subject,
        .namespace_ = c->nats.namespace_,
        .component = c->nats.component,
        .endpoint = c->nats.endpoint,
        .worker_id = c->worker_id,
        .js_subject = c->nats.jetstream.enabled ? c->nats.jetstream.subject_name : NULL,
        .batch = c->nats.batch,
        .residency_domain = c->nats.residency_domain,
    };
}

static const char *subject_for(struct kvb_publish *o, uint64_t worker, uint32_t rank)
{
    if (!o->per_pair)
        return o->subject;
    for (size_t i = 0; i < o->n_cache; i++)
        if (o->cache[i].worker_id == worker && o->cache[i].dp_rank == rank)
            return o->cache[i].s;
    struct subj *e = o->n_cache < SUBJECT_CACHE ? &o->cache[o->n_cache] : &o->cache[o->next_evict];
    if (expand(o, worker, rank, o->scratch) < 0)
        return NULL;
    e->worker_id = worker;
    e->dp_rank = rank;
    memcpy(e->s, o->scratch, sizeof(e->s));
    if (o->n_cache < SUBJECT_CACHE)
        o->n_cache++;
    else
        o->next_evict = (o->next_evict + 1) % SUBJECT_CACHE;
    return e->s;
}

const char *kvb_publish_subject(struct kvb_publish *o) { return o->subject; }

/* ---- publishing --------------------------------------------------------- */

/* The clock of published_at: a writer's fixed time, else the wall clock. */
static uint64_t now_ms(const struct kvb_publish *o)
{
    return o->writer.write ? o->writer.now_ms : kvb_wall_ms();
}

/* One message to the writer or the sink. */
static int send_msg(struct kvb_publish *o, const struct kvb_publish_msg *msg)
{
    o->bytes += msg->len;
    if (o->writer.write)
        return o->writer.write(o->writer.ctx, msg);
    if (msg->msg_id)
        return kvb_sink_publish_id(o->sink, msg->subject, msg->data, msg->len, msg->msg_id);
    if (msg->n_hdrs)
        return kvb_sink_publish_hdrs(o->sink, msg->subject, msg->data, msg->len, msg->hdrs,
                                     msg->n_hdrs);
    return kvb_sink_publish(o->sink, msg->subject, msg->data, msg->len);
}

/* A plain message (no headers, no id). */
static int send_plain(struct kvb_publish *o, const char *subject, const void *data, size_t len)
{
    struct kvb_publish_msg msg = {.subject = subject, .data = data, .len = len};
    return send_msg(o, &msg);
}

static void failed(struct kvb_publish *o, int rc, const char *what, uint64_t a, uint64_t b)
{
    kvb_log_rl(&o->rl_publish, KVB_LOG_ERROR, "sink",
               "publish failed: %s (%s %" PRIu64 "..%" PRIu64 " lost)", strerror(-rc), what, a, b);
    o->lost = true; /* the router must not keep a view with a hole */
}

static int hold(struct kvb_publish *o, const struct kvb_mp_msg *msg, const char *subj)
{
    if (o->held_bytes + msg->len > HELD_MAX_BYTES) {
        kvb_log_rl(&o->rl_held, KVB_LOG_WARN, "discovery",
                   "worker_id %" PRIu64 " dp_rank %u not registered yet and %zu bytes held: "
                   "dropping them (barriers follow)",
                   msg->worker_id, msg->dp_rank, o->held_bytes);
        for (size_t i = 0; i < o->n_held; i++) {
            free(o->held[i].subject);
            free(o->held[i].data);
        }
        kvb_add(&o->m->output_held_dropped_total[0], o->n_held + 1);
        o->n_held = o->held_bytes = 0;
        o->lost = true;
        return 0;
    }
    if (o->n_held == o->cap_held) {
        size_t cap = o->cap_held ? o->cap_held * 2 : 16;
        struct held *n = realloc(o->held, cap * sizeof(*n));
        if (!n)
            return -ENOMEM;
        o->held = n;
        o->cap_held = cap;
    }
    struct held *h = &o->held[o->n_held];
    h->worker_id = msg->worker_id;
    h->dp_rank = msg->dp_rank;
    h->subject = strdup(subj);
    h->data = malloc(msg->len ? msg->len : 1);
    if (!h->subject || !h->data) {
        free(h->subject);
        free(h->data);
        return -ENOMEM;
    }
    memcpy(h->data, msg->data, msg->len);
    h->len = msg->len;
    o->held_bytes += msg->len;
    o->n_held++;
    return 0;
}

/* Publish the held messages whose pair is registered now, in order; the
 * others stay (in order). */
static void release_held(struct kvb_publish *o)
{
    size_t k = 0;
    for (size_t i = 0; i < o->n_held; i++) {
        struct held *h = &o->held[i];
        if (!kvb_discovery_registered(o->disc, h->worker_id, h->dp_rank)) {
            o->held[k++] = *h;
            continue;
        }
        int rc = send_plain(o, h->subject, h->data, h->len);
        if (rc < 0)
            failed(o, rc, "held message of dp_rank", h->dp_rank, h->dp_rank);
        else
            kvb_inc(&o->m->messages_published_total[KVB_FMT_DYNAMO_MSGPACK]);
        o->held_bytes -= h->len;
        free(h->subject);
        free(h->data);
    }
    o->n_held = k;
}

/* The batcher's callback: one envelope. */
static int emit_mp(void *ctx, const struct kvb_mp_msg *msg)
{
    struct kvb_publish *o = ctx;
    const char *subj = subject_for(o, msg->worker_id, msg->dp_rank);
    if (!subj) {
        failed(o, -EINVAL, "event_id", msg->first_event_id, msg->last_event_id);
        return 0;
    }
    if (o->disc) {
        uint64_t pid;
        if (o->n_held)
            release_held(o); /* keep the order */
        if (o->n_held || !kvb_discovery_registered(o->disc, msg->worker_id, msg->dp_rank)) {
            if (kvb_mp_batcher_publisher(o->mp, msg->worker_id, msg->dp_rank, &pid) == 0)
                kvb_discovery_add(o->disc, msg->worker_id, msg->dp_rank, pid);
            if (hold(o, msg, subj) < 0)
                failed(o, -ENOMEM, "event_id", msg->first_event_id, msg->last_event_id);
            return 0;
        }
    }
    int rc = send_plain(o, subj, msg->data, msg->len);
    if (rc < 0)
        failed(o, rc, "event_id", msg->first_event_id, msg->last_event_id);
    else
        kvb_inc(&o->m->messages_published_total[KVB_FMT_DYNAMO_MSGPACK]);
    return 0; /* counted by the sink; the stream goes on */
}

/* dynamo-json: the event's own message. */
static void publish_json(struct kvb_publish *o, const struct kvb_rev *r)
{
    // cppcheck-suppress variableScope ; msg.msg_id points into id until send_msg()
    char id[KVB_MSG_ID_MAX];
    struct kvb_publish_msg msg = {.subject = subject_for(o, r->worker_id, r->dp_rank), .rev = r};
    const char *data = NULL;
    int rc = msg.subject ? kvb_encode(o->enc, r, &data, &msg.len) : -EINVAL;
    msg.data = data;
    if (rc == 0 && o->jetstream)
        msg.msg_id = kvb_subject_msg_id(id, r->worker_id, r->dp_rank, r->epoch, r->event_id);
    if (rc == 0)
        rc = send_msg(o, &msg);
    if (rc < 0)
        failed(o, rc, "event_id", r->event_id, r->event_id);
    else
        kvb_inc(&o->m->messages_published_total[KVB_FMT_DYNAMO_JSON]);
}

int kvb_publish_event(struct kvb_publish *o, const struct kvb_rev *r)
{
    if (o->format == KVB_FORMAT_DYNAMO_JSON) {
        publish_json(o, r);
    } else if (o->format == KVB_FORMAT_DYNAMO_MSGPACK) {
        if (!kvb_mp_batcher_pending(o->mp)) /* one clock read per message, not per event */
            o->now_ms = now_ms(o);
        int rc = kvb_mp_batcher_add(o->mp, r, o->now_ms);
        if (rc < 0)
            failed(o, rc, "event_id", r->event_id, r->event_id);
    } /* raw: the engine's batches go out as they are */
    return o->observe ? o->observe(o->observe_ctx, r) : 0;
}

bool kvb_publish_takes_batches(const struct kvb_publish *o) { return o->format == KVB_FORMAT_RAW; }

int kvb_publish_raw(struct kvb_publish *o, const struct kvb_raw_batch *b)
{
    if (o->format != KVB_FORMAT_RAW)
        return 0;
    char seq[24], rank[12];
    snprintf(seq, sizeof(seq), "%" PRIu64, b->seq);
    snprintf(rank, sizeof(rank), "%" PRIu32, b->dp_rank);
    /* No empty values: nats.c 3.4.1 then misreads the header block, so an
     * empty topic frame (or source) leaves its header out. */
    const char *hdrs[8] = {"KV-Seq", seq, "KV-DP-Rank", rank};
    size_t n = 2;
    if (b->topic && *b->topic) {
        hdrs[2 * n] = "KV-Topic";
        hdrs[2 * n++ + 1] = b->topic;
    }
    if (b->source && *b->source) {
        hdrs[2 * n] = "KV-Source";
        hdrs[2 * n++ + 1] = b->source;
    }
    struct kvb_publish_msg msg = {.subject = subject_for(o, b->worker_id, b->dp_rank),
                                  .data = b->payload,
                                  .len = b->len,
                                  .hdrs = hdrs,
                                  .n_hdrs = n};
    int rc = msg.subject ? send_msg(o, &msg) : -EINVAL;
    if (rc < 0)
        failed(o, rc, "engine seq", b->seq, b->seq);
    else
        kvb_inc(&o->m->messages_published_total[KVB_FMT_RAW]);
    return 0;
}

int kvb_publish_cut(struct kvb_publish *o)
{
    if (o->mp && kvb_mp_batcher_pending(o->mp)) {
        /* published_at: the clock read when the message's first event came */
        int rc = kvb_mp_batcher_flush(o->mp, o->now_ms);
        if (rc < 0)
            failed(o, rc, "batch", 0, 0);
    }
    return 0;
}

int kvb_publish_flush(struct kvb_publish *o)
{
    if (o->mp) {
        int rc = kvb_mp_batcher_flush(o->mp, now_ms(o));
        if (rc < 0)
            failed(o, rc, "batch", 0, 0);
    }
    if (o->disc && o->n_held)
        release_held(o);
    return 0;
}

uint64_t kvb_publish_bytes(const struct kvb_publish *o) { return o->bytes; }

bool kvb_publish_take_loss(struct kvb_publish *o)
{
    bool l = o->lost;
    o->lost = false;
    return l;
}

bool kvb_publish_blocked(const struct kvb_publish *o)
{
    return o->disc && (o->n_held > 0 || !kvb_discovery_all_registered(o->disc));
}

bool kvb_publish_registered(const struct kvb_publish *o)
{
    return !o->disc || kvb_discovery_all_registered(o->disc);
}

/* ---- life cycle --------------------------------------------------------- */

int kvb_publish_create(const struct kvb_publish_cfg *cfg, struct kvb_metrics *m,
                       uint64_t publisher_seed, struct kvb_publish **out)
{
    struct kvb_publish *o = calloc(1, sizeof(*o));
    int rc = -ENOMEM;
    if (!o)
        return rc;
    o->cfg = *cfg;
    o->m = m;
    o->format = cfg->format;
    o->rl_publish = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(10000, 5);
    o->rl_held = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(10000, 3);
    if ((rc = prepare(o)) < 0)
        goto fail;
    if (o->format == KVB_FORMAT_DYNAMO_MSGPACK) {
        struct kvb_mp_batcher_cfg bc = {
            .batch = cfg->batch, .residency_domain = cfg->residency_domain, .seed = publisher_seed};
        if ((rc = kvb_mp_batcher_create(&bc, emit_mp, o, &o->mp)) < 0)
            goto fail;
    }
    if (o->format == KVB_FORMAT_DYNAMO_JSON && (rc = kvb_encoder_create(o->format, &o->enc)) < 0)
        goto fail;
    *out = o;
    return 0;
fail:
    kvb_publish_destroy(&o);
    return rc;
}

void kvb_publish_destroy(struct kvb_publish **po)
{
    if (!po || !*po)
        return;
    struct kvb_publish *o = *po;
    kvb_mp_batcher_destroy(&o->mp);
    kvb_encoder_destroy(&o->enc);
    for (size_t i = 0; i < o->n_held; i++) {
        free(o->held[i].subject);
        free(o->held[i].data);
    }
    free(o->held);
    free(o);
    *po = NULL;
}

int kvb_publish_reconfigure(struct kvb_publish *o, const struct kvb_publish_cfg *cfg)
{
    struct kvb_publish_cfg was = o->cfg;
    o->cfg = *cfg; /* the caller frees the old strings next */
    o->cfg.format = was.format;
    o->cfg.batch = was.batch;
    o->cfg.residency_domain = was.residency_domain;
    return prepare(o);
}

void kvb_publish_set_sink(struct kvb_publish *o, struct kvb_sink *s) { o->sink = s; }

void kvb_publish_set_writer(struct kvb_publish *o, const struct kvb_publish_writer *w)
{
    o->writer = *w;
}

void kvb_publish_set_observer(struct kvb_publish *o, kvb_publish_observer_fn fn, void *ctx)
{
    o->observe = fn;
    o->observe_ctx = ctx;
}

int kvb_publish_set_discovery(struct kvb_publish *o, struct kvb_discovery *d,
                              const struct kvb_config *c)
{
    o->disc = d;
    if (!d || !o->mp)
        return 0;
    for (size_t i = 0; i < c->n_sources; i++) {
        const struct kvb_source_cfg *sc = &c->sources[i];
        /* the source's worker, or each worker of its topics map */
        for (size_t t = 0; t < (sc->n_topics ? sc->n_topics : 1); t++)
            for (uint32_t r = 0; r < sc->dp_size; r++) {
                uint64_t pid, w = sc->n_topics ? sc->topics[t].worker_id : sc->worker_id;
                uint32_t rank = sc->dp_rank + r;
                int rc = kvb_mp_batcher_publisher(o->mp, w, rank, &pid);
                if (rc == 0)
                    rc = kvb_discovery_add(d, w, rank, pid);
                if (rc < 0)
                    return rc;
            }
    }
    return 0;
}
