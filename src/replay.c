/* replay: sequence and replay rules.  See include/replay.h. */
#include "replay.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

#define DEFAULT_HELD_MSGS 100000      /* live batches held while a replay runs */
#define DEFAULT_HELD_BYTES (256u << 20)
#define REPLAY_STALL_MS 250       /* no reply for this long once replies flow: cut */
#define REPLAY_MAX_ROUNDS 1000    /* re-requests after cut replies, per gap */

/* ---- streams ------------------------------------------------------------ */

void kvb_stream_init(struct kvb_stream *s, const char *name, uint32_t cfg_rank)
{
    memset(s, 0, sizeof(*s));
    s->name = name;
    s->cfg_rank = cfg_rank;
}

int kvb_seq_classify(const struct kvb_stream *s, uint64_t seq)
{
    if (!s->has_last)
        return KVB_SEQ_FIRST;
    if (seq == s->last + 1) /* unsigned: wraps from 2^64-1 to 0 */
        return KVB_SEQ_NEXT;
    return seq > s->last ? KVB_SEQ_GAP : KVB_SEQ_BACK;
}

uint64_t kvb_seq_missing(const struct kvb_stream *s, uint64_t seq)
{
    return seq - s->last - 1;
}

bool kvb_stream_has_rank(const struct kvb_stream *s, uint32_t rank)
{
    for (uint32_t i = 0; i < s->n_ranks; i++)
        if (s->ranks[i] == rank)
            return true;
    return false;
}

int kvb_stream_add_rank(struct kvb_stream *s, uint32_t rank)
{
    if (kvb_stream_has_rank(s, rank))
        return 0;
    if (s->n_ranks >= KVB_MAX_STREAM_RANKS)
        return -ENOSPC;
    s->ranks[s->n_ranks++] = rank;
    return 0;
}

/* The one write of the cursor. */
static void advance(struct kvb_stream *s, uint64_t seq)
{
    s->has_last = true;
    s->last = seq;
}

/* ---- one stream without a replay ---------------------------------------- */

static int barrier(const struct kvb_seq_ops *ops, struct kvb_stream *s, int cause)
{
    return ops->barrier(ops->ctx, s, cause);
}

/* The live rules: the gap or restart barrier a batch needs first. */
static int live_rules(struct kvb_stream *s, struct kvb_metrics *m, const struct kvb_seq_ops *ops,
                      uint64_t seq)
{
    switch (kvb_seq_classify(s, seq)) {
    case KVB_SEQ_GAP:
        kvb_inc(&m->seq_gaps_total[0]);
        s->gaps++;
        kvb_log(KVB_LOG_WARN, "source", "%s: seq gap: %llu missing before %llu, publishing barrier",
                s->name, (unsigned long long)kvb_seq_missing(s, seq), (unsigned long long)seq);
        return barrier(ops, s, KVB_BAR_GAP);
    case KVB_SEQ_BACK:
        kvb_inc(&m->engine_restarts_total[0]);
        kvb_log(KVB_LOG_WARN, "source", "%s: seq went back from %llu to %llu: engine restart, publishing barrier",
                s->name, (unsigned long long)s->last, (unsigned long long)seq);
        return barrier(ops, s, KVB_BAR_RESTART);
    default:
        return 0;
    }
}

int kvb_seq_apply(struct kvb_stream *s, const struct kvb_seq_ops *ops, uint64_t seq,
                  const uint8_t *data, size_t len)
{
    advance(s, seq);
    return ops->apply(ops->ctx, s, seq, data, len);
}

int kvb_seq_live(struct kvb_stream *s, struct kvb_metrics *m, const struct kvb_seq_ops *ops,
                 uint64_t seq, const uint8_t *data, size_t len)
{
    int n = live_rules(s, m, ops, seq);
    if (n < 0)
        return n;
    int rc = kvb_seq_apply(s, ops, seq, data, len);
    return rc < 0 ? rc : n + rc;
}

int kvb_seq_reject(struct kvb_stream *s, struct kvb_metrics *m, const struct kvb_seq_ops *ops,
                   uint64_t seq, const char *why)
{
    int n = live_rules(s, m, ops, seq);
    if (n < 0)
        return n;
    advance(s, seq);
    int rc = ops->reject(ops->ctx, s, seq, why);
    return rc < 0 ? rc : n + rc;
}

/* ---- a source's streams, with replay ------------------------------------ */

struct held {
    uint64_t seq;
    size_t len;
    uint8_t *data;
    bool reject;   /* above limits.max_payload_bytes: kept without its payload */
};

struct kvb_replay {
    struct kvb_replay_cfg cfg;
    char *name, *endpoint;
    struct kvb_metrics *m;
    struct kvb_seq_ops ops;
    struct kvb_ratelimit rl_oversize;

    bool active;
    struct kvb_stream *st;   /* the stream being recovered */
    uint64_t want;           /* next seq we need */
    uint64_t until;          /* seq of the first held live batch */
    uint64_t deadline_ms;
    uint64_t req_want;       /* want when the last request was sent */
    bool got_reply;          /* the current request has had a reply */
    unsigned rounds;         /* requests sent again after a partial reply */
    bool barrier_sent;       /* part of the gap was lost: barrier published (not filled) */
    struct held *held;
    size_t n_held, cap_held, held_bytes;
};

int kvb_replay_create(const struct kvb_replay_cfg *cfg, struct kvb_metrics *m,
                      const struct kvb_seq_ops *ops, struct kvb_replay **out)
{
    struct kvb_replay *r = calloc(1, sizeof(*r));
    if (!r)
        return -ENOMEM;
    r->cfg = *cfg;
    r->name = strdup(cfg->name ? cfg->name : "");
    r->endpoint = strdup(cfg->endpoint ? cfg->endpoint : "");
    if (!r->name || !r->endpoint) {
        kvb_replay_destroy(&r);
        return -ENOMEM;
    }
    r->cfg.name = r->name;
    r->cfg.endpoint = r->endpoint;
    if (!r->cfg.max_held_msgs)
        r->cfg.max_held_msgs = DEFAULT_HELD_MSGS;
    if (!r->cfg.max_held_bytes)
        r->cfg.max_held_bytes = DEFAULT_HELD_BYTES;
    r->m = m;
    r->ops = *ops;
    r->rl_oversize = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(10000, 5);
    *out = r;
    return 0;
}

static void drop_held(struct kvb_replay *r)
{
    for (size_t i = 0; i < r->n_held; i++)
        free(r->held[i].data);
    r->n_held = 0;
    r->held_bytes = 0;
}

void kvb_replay_destroy(struct kvb_replay **pr)
{
    if (!pr || !*pr)
        return;
    struct kvb_replay *r = *pr;
    drop_held(r);
    free(r->held);
    free(r->name);
    free(r->endpoint);
    free(r);
    *pr = NULL;
}

bool kvb_replay_active(const struct kvb_replay *r) { return r->active; }
size_t kvb_replay_held(const struct kvb_replay *r) { return r->n_held; }
const struct kvb_stream *kvb_replay_stream(const struct kvb_replay *r)
{
    return r->st;
}

/* A payload above limits.max_payload_bytes: counted, never decoded. */
static bool oversize(struct kvb_replay *r, size_t len)
{
    if (!r->cfg.max_payload_bytes || len <= r->cfg.max_payload_bytes)
        return false;
    kvb_inc(&r->m->malformed_messages_total[KVB_MAL_OVERSIZE]);
    kvb_log_rl(&r->rl_oversize, KVB_LOG_WARN, "source",
               "%s: payload of %zu bytes above limits.max_payload_bytes (%llu): dropped",
               r->name, len, (unsigned long long)r->cfg.max_payload_bytes);
    return true;
}

static int hold(struct kvb_replay *r, uint64_t seq, const void *data, size_t len, bool reject)
{
    if (r->n_held >= r->cfg.max_held_msgs || r->held_bytes + len > r->cfg.max_held_bytes)
        return -ENOBUFS;
    if (r->n_held == r->cap_held) {
        size_t cap = r->cap_held ? r->cap_held * 2 : 64;
        struct held *h = realloc(r->held, cap * sizeof(*h));
        if (!h)
            return -ENOMEM;
        r->held = h;
        r->cap_held = cap;
    }
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy)
        return -ENOMEM;
    if (len)
        memcpy(copy, data, len);
    r->held[r->n_held++] = (struct held){seq, len, copy, reject};
    r->held_bytes += len;
    /* copy is owned by r->held (cppcheck does not follow the compound literal) */
    // cppcheck-suppress memleak
    return 0;
}

static void cancel(struct kvb_replay *r)
{
    if (r->ops.cancel)
        r->ops.cancel(r->ops.ctx);
}

/* Ask the engine for every batch from r->want on.  The ROUTER's send
 * high-water mark may drop the tail of a long reply: the deadline then asks
 * again from where it got to (kvb_replay_tick). */
static int send_request(struct kvb_replay *r, uint64_t now_ms)
{
    int rc = r->ops.request ? r->ops.request(r->ops.ctx, r->want) : -ENOTSUP;
    if (rc < 0)
        return rc;
    r->req_want = r->want;
    r->got_reply = false;
    r->deadline_ms = now_ms + r->cfg.timeout_ms;
    return 0;
}

static int start_replay(struct kvb_replay *r, struct kvb_stream *st, uint64_t seq,
                        uint64_t now_ms)
{
    r->st = st;
    r->want = st->last + 1;
    r->until = seq;
    r->barrier_sent = false;
    r->rounds = 0;
    int rc = send_request(r, now_ms);
    if (rc < 0)
        return rc;
    r->active = true;
    kvb_inc(&r->m->replays_requested_total[0]);
    kvb_info("replay", "%s: requesting seq %llu..%llu from %s", st->name,
             (unsigned long long)r->want, (unsigned long long)(seq - 1), r->endpoint);
    return 0;
}

/* Keep held[from..] and recover the gap before held[from] with a new replay. */
static int replay_again(struct kvb_replay *r, size_t from, uint64_t now_ms)
{
    for (size_t i = 0; i < from; i++) {
        r->held_bytes -= r->held[i].len;
        free(r->held[i].data);
    }
    memmove(r->held, r->held + from, (r->n_held - from) * sizeof(*r->held));
    r->n_held -= from;
    return start_replay(r, r->st, r->held[0].seq, now_ms);
}

/* The replay is over (filled or not): publish the barrier if part of the gap
 * stayed missing, then the held live batches, oldest first.  A new gap among
 * the held batches is recovered by another replay (unless !again: then it
 * is a barrier too, and nothing stays held). */
static int finish_replay_(struct kvb_replay *r, const char *why, uint64_t now_ms, bool again)
{
    struct kvb_stream *st = r->st;
    int rc = 0, n = 0;
    /* the tail of the gap is missing: a barrier, even when one was
     * published for an earlier part of it (this is a loss after it) */
    bool missing = r->want < r->until;
    cancel(r); /* late replies of this request must not reach the next one */
    r->active = false;
    if (!missing && !r->barrier_sent) {
        kvb_inc(&r->m->replays_filled_total[0]);
        kvb_info("replay", "%s: gap filled up to seq %llu", st->name,
                 (unsigned long long)(r->until - 1));
    } else {
        kvb_inc(&r->m->replays_failed_total[0]);
        kvb_warn("replay", "%s: gap before seq %llu not recovered (%s)%s", st->name,
                 (unsigned long long)r->until, why, missing ? ": publishing barrier" : "");
        if (missing && (rc = barrier(&r->ops, st, KVB_BAR_GAP)) < 0)
            goto out;
        n += rc;
    }
    for (size_t i = 0; i < r->n_held; i++) {
        struct held *h = &r->held[i];
        if (st->has_last && h->seq <= st->last)
            continue; /* already applied from the replay */
        if (i > 0 && kvb_seq_classify(st, h->seq) == KVB_SEQ_GAP) {
            kvb_inc(&r->m->seq_gaps_total[0]);
            st->gaps++;
            kvb_warn("source", "%s: seq gap: %llu missing before %llu, asking for replay",
                     st->name, (unsigned long long)kvb_seq_missing(st, h->seq),
                     (unsigned long long)h->seq);
            if (again && replay_again(r, i, now_ms) == 0)
                return n; /* the rest stays held */
            kvb_inc(&r->m->replays_failed_total[0]);
            if ((rc = barrier(&r->ops, st, KVB_BAR_GAP)) < 0)
                goto out;
            n += rc;
            if (again) { /* replay_again() dropped held[..i) */
                i = 0;
                h = &r->held[0];
            }
        }
        if (h->reject) {
            advance(st, h->seq);
            rc = r->ops.reject(r->ops.ctx, st, h->seq, "payload above limits.max_payload_bytes");
        } else {
            rc = kvb_seq_apply(st, &r->ops, h->seq, h->data, h->len);
        }
        if (rc < 0)
            goto out;
        n += rc;
    }
out:
    drop_held(r);
    r->active = false;
    r->st = NULL;
    return rc < 0 ? rc : n;
}

static int finish_replay(struct kvb_replay *r, const char *why, uint64_t now_ms)
{
    return finish_replay_(r, why, now_ms, true);
}

static int on_reply_batch(struct kvb_replay *r, uint64_t seq, const uint8_t *data, size_t len,
                          uint64_t now_ms)
{
    struct kvb_stream *st = r->st;
    int n = 0;
    if (seq < r->want || seq >= r->until)
        return 0; /* already applied, or live batches we hold */
    if (oversize(r, len)) { /* in the engine's buffer, but not usable */
        r->want = seq + 1;
        r->got_reply = true;
        return kvb_seq_reject(st, r->m, &r->ops, seq, "payload above limits.max_payload_bytes");
    }
    if (seq > r->want) {
        if (r->got_reply && r->rounds < REPLAY_MAX_ROUNDS) {
            /* a hole in the middle of a reply: the ROUTER's HWM dropped
             * some; the engine still has them, ask again from want */
            r->rounds++;
            cancel(r);
            if (send_request(r, now_ms) == 0)
                return 0;
            return finish_replay(r, "request failed", now_ms);
        }
        /* the first reply starts later than asked: the engine's buffer no
         * longer holds the beginning of the (rest of the) gap */
        kvb_warn("replay", "%s: engine's replay starts at %llu, not %llu: publishing barrier",
                 st->name, (unsigned long long)seq, (unsigned long long)r->want);
        if ((n = barrier(&r->ops, st, KVB_BAR_GAP)) < 0)
            return n;
        r->barrier_sent = true;
    }
    r->got_reply = true;
    r->want = seq + 1;
    /* replies are flowing: a stall of this long means the reply was cut */
    uint64_t stall = r->cfg.timeout_ms < REPLAY_STALL_MS ? r->cfg.timeout_ms : REPLAY_STALL_MS;
    r->deadline_ms = now_ms + stall;
    int rc = kvb_seq_apply(st, &r->ops, seq, data, len);
    return rc < 0 ? rc : n + rc;
}

int kvb_replay_reply(struct kvb_replay *r, uint64_t seq, const uint8_t *data, size_t len,
                     uint64_t now_ms)
{
    if (!r->active)
        return 0; /* a late reply to a request given up */
    if (seq == KVB_REPLAY_END)
        return finish_replay(r, "engine's replay buffer no longer holds it", now_ms);
    int n = on_reply_batch(r, seq, data, len, now_ms);
    if (n < 0)
        return n;
    /* caught up: the rest of the reply is what we hold already (the request
     * is cancelled, so the remaining replies are dropped) */
    if (r->active && r->want >= r->until) {
        int rc = finish_replay(r, "the engine no longer held all of it", now_ms);
        if (rc < 0)
            return rc;
        n += rc;
    }
    return n;
}

long kvb_replay_next_deadline(const struct kvb_replay *r, uint64_t now_ms)
{
    if (!r->active)
        return -1;
    return r->deadline_ms > now_ms ? (long)(r->deadline_ms - now_ms) : 0;
}

int kvb_replay_tick(struct kvb_replay *r, uint64_t now_ms)
{
    if (!r->active || now_ms < r->deadline_ms)
        return 0;
    /* progress since the last request, but no END: the ROUTER dropped the
     * rest of its reply (its HWM); ask again from where we are */
    if (r->want > r->req_want && r->rounds < REPLAY_MAX_ROUNDS) {
        r->rounds++;
        cancel(r);
        if (send_request(r, now_ms) == 0) {
            kvb_debug("replay", "%s: reply cut at seq %llu, asking again", r->name,
                      (unsigned long long)r->want);
            return 0;
        }
    }
    return finish_replay(r, "replay timed out", now_ms);
}

int kvb_replay_live(struct kvb_replay *r, struct kvb_stream *st, uint64_t seq,
                    const uint8_t *data, size_t len, uint64_t now_ms)
{
    int rc, n = 0;
    bool big = oversize(r, len);
    if (r->active && r->st == st) {
        /* held in order; an oversize batch without its payload (it is
         * rejected when its turn comes) */
        if ((rc = big ? hold(r, seq, NULL, 0, true) : hold(r, seq, data, len, false)) == 0)
            return 0;
        kvb_warn("replay", "%s: too many live batches held during replay", st->name);
        /* give up: barrier, then everything held (no new replay: there is
         * no room to hold), then this batch as a live one */
        if ((n = finish_replay_(r, "hold queue full", now_ms, false)) < 0)
            return n;
    }
    if (big) {
        rc = kvb_seq_reject(st, r->m, &r->ops, seq, "payload above limits.max_payload_bytes");
        return rc < 0 ? rc : n + rc;
    }
    if (kvb_seq_classify(st, seq) == KVB_SEQ_GAP && r->endpoint[0] && !r->active) {
        kvb_inc(&r->m->seq_gaps_total[0]);
        st->gaps++;
        kvb_warn("source", "%s: seq gap: %llu missing before %llu, asking for replay", st->name,
                 (unsigned long long)kvb_seq_missing(st, seq), (unsigned long long)seq);
        rc = start_replay(r, st, seq, now_ms);
        if (rc == 0 && (rc = hold(r, seq, data, len, false)) == 0)
            return n;
        kvb_warn("replay", "%s: cannot request replay: %s", st->name, strerror(-rc));
        if (r->active) {
            rc = finish_replay(r, "request failed", now_ms); /* publishes the barrier */
        } else {
            kvb_inc(&r->m->replays_failed_total[0]);
            rc = barrier(&r->ops, st, KVB_BAR_GAP);
        }
        if (rc < 0)
            return rc;
        n += rc;
        rc = kvb_seq_apply(st, &r->ops, seq, data, len);
        return rc < 0 ? rc : n + rc;
    }
    rc = kvb_seq_live(st, r->m, &r->ops, seq, data, len);
    return rc < 0 ? rc : n + rc;
}
