/* replay: sequence and replay rules.  See include/replay.h. */
#include "replay.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "log.h"

#define DEFAULT_HELD_MSGS 100000 /* live batches held while a replay runs */
#define DEFAULT_HELD_BYTES (256u << 20)
#define REPLAY_STALL_MS 250       /* no reply for this long once replies flow: cut */
#define REPLAY_MAX_ROUNDS 1000    /* re-requests after cut replies, per gap */
#define DEFAULT_MAX_MS 30000      /* replay.max_ms */
#define DEFAULT_MAX_BATCHES 10000 /* replay.max_batches: vLLM's buffer_steps */
/* An open replay's until: the farthest seq ahead of from in serial
 * arithmetic (the seq it ends at is not known). */
#define OPEN_SPAN ((uint64_t)INT64_MAX)

/* ---- streams ------------------------------------------------------------ */

void kvb_stream_init(struct kvb_stream *s, const char *name, uint32_t cfg_rank)
{
    memset(s, 0, sizeof(*s));
    s->name = name;
    s->cfg_rank = cfg_rank;
    s->rl = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(10000, 5);
}

int kvb_seq_classify(const struct kvb_stream *s, uint64_t seq)
{
    if (!s->has_last)
        return KVB_SEQ_FIRST;
    if (seq == s->last + 1) /* unsigned: wraps from 2^64-1 to 0 */
        return KVB_SEQ_NEXT;
    return seq > s->last ? KVB_SEQ_GAP : KVB_SEQ_BACK;
}

uint64_t kvb_seq_missing(const struct kvb_stream *s, uint64_t seq) { return seq - s->last - 1; }

bool kvb_stream_has_rank(const struct kvb_stream *s, uint32_t rank)
{
    for (uint32_t i = 0; i < s->n_ranks; i++)
        if (s->ranks[i] == rank)
            return true;
    return false;
}

void kvb_stream_set_labels(struct kvb_stream *s, const char *source, const char *topic)
{
    s->source = source;
    s->topic = topic;
}

void kvb_stream_set_worker(struct kvb_stream *s, const struct kvb_worker_cfg *w) { s->worker = w; }

void kvb_stream_resume(struct kvb_stream *s, uint64_t last, const uint32_t *ranks, uint32_t n)
{
    s->has_last = true;
    s->last = last;
    s->n_ranks = n < KVB_MAX_STREAM_RANKS ? n : KVB_MAX_STREAM_RANKS;
    memcpy(s->ranks, ranks, s->n_ranks * sizeof(*ranks));
}

/* Remember rank; a stream that has KVB_MAX_STREAM_RANKS takes no other (the
 * pipeline drops such a batch). */
static void add_rank(struct kvb_stream *s, uint32_t rank)
{
    if (!kvb_stream_has_rank(s, rank) && s->n_ranks < KVB_MAX_STREAM_RANKS)
        s->ranks[s->n_ranks++] = rank;
}

/* A barrier is for every rank of the stream: one that has seen none has
 * its configured rank. */
static void note_ranks(struct kvb_stream *s)
{
    if (s->n_ranks == 0)
        add_rank(s, s->cfg_rank);
}

/* What the pipeline did with a batch. */
static void record(struct kvb_stream *s, const struct kvb_applied *a)
{
    if (!a->decoded) { /* its malformed barrier */
        note_ranks(s);
        return;
    }
    s->batches++;
    s->events += a->n_events;
    add_rank(s, a->dp_rank);
}

/* The one write of the cursor. */
static void advance(struct kvb_stream *s, uint64_t seq)
{
    s->has_last = true;
    s->last = seq;
}

/* ---- carrying the decisions out ----------------------------------------- */

static int barrier(const struct kvb_seq_ops *ops, struct kvb_stream *s, int cause)
{
    note_ranks(s);
    return ops->barrier(ops->ctx, s, cause);
}

/* Move the cursor to seq and apply the batch; *a (may be NULL) says what
 * the pipeline did. */
static int apply_batch(struct kvb_stream *s, const struct kvb_seq_ops *ops, uint64_t seq,
                       const uint8_t *data, size_t len, struct kvb_applied *a)
{
    struct kvb_applied got = {0};
    advance(s, seq);
    s->last_hash = XXH3_64bits(data, len); /* proves continuity after a reconnect */
    s->has_hash = true;
    int rc = ops->apply(ops->ctx, s, seq, data, len, &got);
    record(s, &got);
    if (a)
        *a = got;
    return rc;
}

/* Move the cursor to seq and reject the batch (not decoded). */
static int reject_batch(struct kvb_stream *s, const struct kvb_seq_ops *ops, uint64_t seq,
                        const char *why)
{
    advance(s, seq);
    s->has_hash = false;
    note_ranks(s);
    return ops->reject(ops->ctx, s, seq, why);
}

/* ---- a source's streams, with replay ------------------------------------ */

struct held {
    uint64_t seq;
    size_t len;
    uint8_t *data;
    bool reject; /* above limits.max_payload_bytes: kept without its payload */
};

/* What a replay is for. */
enum rp_mode {
    RP_GAP,   /* seqs last+1 .. until-1 went missing */
    RP_PROVE, /* after a reconnect: is seq `last` still the same batch? */
    RP_START, /* a new stream (kvbridge's start, or a restarted engine) whose first
               * seq seen is until > 0: its batches from 0 (what the engine holds) */
    RP_CHECK, /* after a pause, a quiet stream: everything after last, if any
               * (open: until is not known) */
};

struct kvb_replay {
    struct kvb_replay_cfg cfg;
    char *name, *endpoint;
    struct kvb_metrics *m;
    struct kvb_seq_ops ops;
    struct kvb_replay_io io; /* zeroed: no replay socket */
    struct kvb_ratelimit rl_oversize;

    bool active;
    enum rp_mode mode;
    struct kvb_stream *st; /* the stream being recovered */
    uint64_t from;         /* first seq asked for */
    uint64_t want;         /* next seq we need */
    uint64_t until;        /* seq of the first held live batch */
    uint64_t deadline_ms;  /* of the current request (stall or timeout) */
    uint64_t end_ms;       /* of the whole replay: replay.timeout_ms */
    uint64_t hard_end_ms;  /* of the whole replay in wall time: replay.max_ms */
    /* Open: the seq it ends at is not known (until = from + OPEN_SPAN): the
     * engine's END, or the next live batch, ends it.  A check, and the
     * proof of a stream whose connection came back (kvb_replay_connected)
     * with what follows. */
    bool open;
    bool applied_any; /* a reply was applied: first_applied .. want - 1 */
    uint64_t first_applied;
    uint64_t req_want; /* want when the last request was sent */
    bool got_reply;    /* the current request has had a reply */
    unsigned rounds;   /* requests sent again after a partial reply */
    bool fresh;        /* a barrier covers everything before want: nothing
                              * applied since it (a loss now needs no other) */
    bool lost;         /* part of it was lost (barrier, or not decoded) */
    struct held *held;
    size_t n_held, cap_held, held_bytes;
    /* What the last check applied to copy_st, seq copy_from .. copy_end - 1
     * (XXH3s of the first n_copy): its live copies still on their way are
     * dropped, not taken for a restart. */
    struct kvb_stream *copy_st;
    uint64_t copy_from, copy_end;
    uint64_t *copy_hash;
    size_t n_copy, cap_copy;
};

int kvb_replay_create(const struct kvb_replay_cfg *cfg, struct kvb_metrics *m,
                      const struct kvb_seq_ops *ops, const struct kvb_replay_io *io,
                      struct kvb_replay **out)
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
    if (!r->cfg.max_ms)
        r->cfg.max_ms = DEFAULT_MAX_MS;
    if (!r->cfg.max_batches)
        r->cfg.max_batches = DEFAULT_MAX_BATCHES;
    r->m = m;
    r->ops = *ops;
    if (io)
        r->io = *io;
    r->rl_oversize = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(10000, 5);
    *out = r;
    return 0;
}

static void free_held(struct held *h, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(h[i].data);
}

void kvb_replay_destroy(struct kvb_replay **pr)
{
    if (!pr || !*pr)
        return;
    struct kvb_replay *r = *pr;
    free_held(r->held, r->n_held);
    free(r->held);
    free(r->copy_hash);
    free(r->name);
    free(r->endpoint);
    free(r);
    *pr = NULL;
}

bool kvb_replay_active(const struct kvb_replay *r) { return r->active; }
size_t kvb_replay_held(const struct kvb_replay *r) { return r->n_held; }
const struct kvb_stream *kvb_replay_stream(const struct kvb_replay *r) { return r->st; }

/* A payload above limits.max_payload_bytes: counted, never decoded. */
static bool oversize(struct kvb_replay *r, size_t len)
{
    if (!r->cfg.max_payload_bytes || len <= r->cfg.max_payload_bytes)
        return false;
    kvb_inc(&r->m->malformed_messages_total[KVB_MAL_OVERSIZE]);
    kvb_log_rl(&r->rl_oversize, KVB_LOG_WARN, "source",
               "%s: payload of %zu bytes above limits.max_payload_bytes (%llu): dropped", r->name,
               len, (unsigned long long)r->cfg.max_payload_bytes);
    return true;
}

static int push_held(struct kvb_replay *r, struct held h)
{
    if (r->n_held == r->cap_held) {
        size_t cap = r->cap_held ? r->cap_held * 2 : 64;
        struct held *v = realloc(r->held, cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        r->held = v;
        r->cap_held = cap;
    }
    r->held[r->n_held++] = h;
    r->held_bytes += h.len;
    return 0;
}

static int hold(struct kvb_replay *r, uint64_t seq, const void *data, size_t len, bool reject)
{
    if (r->n_held >= r->cfg.max_held_msgs || r->held_bytes + len > r->cfg.max_held_bytes)
        return -ENOBUFS;
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy)
        return -ENOMEM;
    if (len)
        memcpy(copy, data, len);
    int rc = push_held(r, (struct held){seq, len, copy, reject});
    if (rc < 0)
        free(copy);
    return rc;
}

/* ---- live copies of what a check applied -------------------------------- */

static void copies_add(struct kvb_replay *r, uint64_t seq, const uint8_t *data, size_t len)
{
    if (seq != r->copy_end) { /* the reply started later than asked */
        r->copy_from = r->copy_end = seq;
        r->n_copy = 0;
    }
    r->copy_end = seq + 1;
    if (r->n_copy != seq - r->copy_from)
        return; /* past what is hashed: taken on trust */
    if (r->n_copy == r->cap_copy) {
        size_t cap = r->cap_copy ? r->cap_copy * 2 : 256;
        uint64_t *v = cap <= r->cfg.max_held_msgs ? realloc(r->copy_hash, cap * sizeof(*v)) : NULL;
        if (!v)
            return;
        r->copy_hash = v;
        r->cap_copy = cap;
    }
    r->copy_hash[r->n_copy++] = XXH3_64bits(data, len);
}

/* A live batch of st that the last check already applied. */
static bool is_copy(const struct kvb_replay *r, uint64_t seq, const uint8_t *data, size_t len)
{
    uint64_t i = seq - r->copy_from;
    if (i >= r->copy_end - r->copy_from)
        return false;
    return i >= r->n_copy || (data && XXH3_64bits(data, len) == r->copy_hash[i]);
}

static void cancel(struct kvb_replay *r)
{
    if (r->io.cancel)
        r->io.cancel(r->io.ctx);
}

/* Ask the engine for every batch from r->want on.  The ROUTER's send
 * high-water mark may drop the tail of a long reply: the deadline then asks
 * again from where it got to (kvb_replay_tick).  No request outlives the
 * whole replay's end_ms. */
static int send_request(struct kvb_replay *r, uint64_t now_ms)
{
    int rc = r->io.request ? r->io.request(r->io.ctx, r->want) : -ENOTSUP;
    if (rc < 0)
        return rc;
    r->req_want = r->want;
    r->got_reply = false;
    r->deadline_ms = now_ms + r->cfg.timeout_ms;
    if (r->deadline_ms > r->end_ms)
        r->deadline_ms = r->end_ms;
    if (r->deadline_ms > r->hard_end_ms)
        r->deadline_ms = r->hard_end_ms;
    return 0;
}

/* Live batches of an open replay's stream, as the replay applies them, are
 * dropped when they come (the copies); from seq `from` on. */
static void copies_from(struct kvb_replay *r, struct kvb_stream *st, uint64_t from)
{
    r->copy_st = st;
    r->copy_from = r->copy_end = from;
    r->n_copy = 0;
}

static const char *const mode_what[] = {
    [RP_GAP] = "requesting seq",
    [RP_PROVE] = "engine reconnected: asking for seq",
    [RP_START] = "stream starts at a later seq: asking the engine for seq",
    [RP_CHECK] = ("reading was paused and the stream is quiet: asking for what the "
                  "engine may have dropped, seq")};

/* A replay of stream st in mode, from seq `from` until the live batch at
 * `until` (which the caller then holds), or open (until not known:
 * OPEN_SPAN ahead). */
static int start_replay(struct kvb_replay *r, struct kvb_stream *st, enum rp_mode mode,
                        uint64_t from, uint64_t until, bool open, uint64_t now_ms)
{
    r->st = st;
    r->mode = mode;
    r->from = from;
    r->open = open || mode == RP_CHECK;
    if (r->open)
        copies_from(r, st, mode == RP_PROVE ? from + 1 : from);
    else if (r->copy_st == st)
        r->copy_st = NULL;
    r->want = from;
    r->until = r->open ? from + OPEN_SPAN : until;
    r->fresh = mode == RP_START; /* a restart or the start barrier covers it */
    r->lost = false;
    r->applied_any = false;
    r->rounds = 0;
    r->end_ms = now_ms + r->cfg.timeout_ms;
    r->hard_end_ms = now_ms + r->cfg.max_ms;
    int rc = send_request(r, now_ms);
    if (rc < 0)
        return rc;
    r->active = true;
    kvb_inc(&r->m->replays_requested_total[0]);
    if (mode == RP_PROVE)
        kvb_info("replay", "%s: %s %llu%s from %s", st->name, mode_what[mode],
                 (unsigned long long)from, r->open ? " and what follows" : "", r->endpoint);
    else if (r->open)
        kvb_info("replay", "%s: %s %llu on from %s", st->name, mode_what[mode],
                 (unsigned long long)from, r->endpoint);
    else
        kvb_info("replay", "%s: %s %llu..%llu from %s", st->name, mode_what[mode],
                 (unsigned long long)from, (unsigned long long)(until - 1), r->endpoint);
    return 0;
}

/* The barrier of a new incarnation, and the stream starts afresh (nothing
 * of it applied yet). */
static int new_incarnation(struct kvb_replay *r, struct kvb_stream *st)
{
    kvb_inc(&r->m->engine_restarts_total[0]);
    st->suspect = false;
    int rc = barrier(&r->ops, st, KVB_BAR_RESTART);
    st->has_last = false;
    st->has_hash = false;
    return rc;
}

/* The engine restarted (seq went back, or its batch at seq does not prove
 * continuity: why). */
static int restart(struct kvb_replay *r, struct kvb_stream *st, uint64_t seq, const char *why)
{
    if (why)
        kvb_log_rl(&st->rl, KVB_LOG_WARN, "source",
                   "%s: engine reconnected and seq %llu %s: engine restart, publishing barrier",
                   st->name, (unsigned long long)seq, why);
    else
        kvb_log_rl(&st->rl, KVB_LOG_WARN, "source",
                   "%s: seq went back from %llu to %llu: engine restart, publishing barrier",
                   st->name, (unsigned long long)st->last, (unsigned long long)seq);
    return new_incarnation(r, st);
}

/* Apply (or reject) one batch whose seq is judged; *a (may be NULL): what
 * the pipeline did with an applied one. */
static int apply_one(struct kvb_replay *r, struct kvb_stream *st, uint64_t seq, const uint8_t *data,
                     size_t len, bool reject, struct kvb_applied *a)
{
    if (!reject)
        return apply_batch(st, &r->ops, seq, data, len, a);
    return reject_batch(st, &r->ops, seq, "payload above limits.max_payload_bytes");
}

/* Hold the batch behind the replay just started; when it cannot be held,
 * the replay is given up (not active, its request cancelled). */
static bool hold_behind(struct kvb_replay *r, uint64_t seq, const uint8_t *data, size_t len,
                        bool reject)
{
    if ((reject ? hold(r, seq, NULL, 0, true) : hold(r, seq, data, len, false)) == 0)
        return true;
    r->active = false;
    cancel(r);
    return false;
}

/* The stream's connection dropped since its last batch: a new incarnation
 * unless the engine still holds our last batch, the same bytes (a proof
 * under way when `can`: the batch is held, *held set).  Else the restart
 * barrier, unless the seq went back (the rules that follow say restart
 * then).  Returns the router events emitted. */
static int prove_or_restart(struct kvb_replay *r, struct kvb_stream *st, uint64_t seq,
                            const uint8_t *data, size_t len, bool reject, bool can, bool *held,
                            uint64_t now_ms)
{
    if (can && st->has_hash && kvb_seq_classify(st, seq) != KVB_SEQ_BACK &&
        start_replay(r, st, RP_PROVE, st->last, seq, false, now_ms) == 0) {
        st->suspect = false; /* the proof is under way */
        if ((*held = hold_behind(r, seq, data, len, reject)))
            return 0;
        /* cannot hold: no proof */
    }
    if (kvb_seq_classify(st, seq) == KVB_SEQ_BACK) /* (serial: 0 follows 2^64-1) */
        return 0;
    return restart(r, st, seq,
                   r->endpoint[0] ? "cannot be proven to continue the stream"
                                  : "continuity cannot be proven without a replay endpoint");
}

/* The last batch again, byte for byte: a duplicate, dropped. */
static bool duplicate(struct kvb_stream *st, uint64_t seq, const uint8_t *data, size_t len,
                      bool reject)
{
    if (seq != st->last || reject || !st->has_hash || XXH3_64bits(data, len) != st->last_hash)
        return false;
    kvb_log_rl(&st->rl, KVB_LOG_WARN, "source",
               "%s: seq %llu again, the same batch: duplicate dropped", st->name,
               (unsigned long long)seq);
    return true;
}

/* The first seq a new stream whose first batch is at seq asks for: 0, or
 * replay.max_batches before it (no engine buffer holds more). */
static uint64_t start_from(const struct kvb_replay *r, uint64_t seq)
{
    return seq > r->cfg.max_batches ? seq - r->cfg.max_batches : 0;
}

/* A new stream (or a new incarnation) whose first seq is above 0: ask the
 * engine for what it still holds before it (when `can`); true when the batch
 * is held behind that replay. */
static bool start_held(struct kvb_replay *r, struct kvb_stream *st, uint64_t seq,
                       const uint8_t *data, size_t len, bool reject, bool can, uint64_t now_ms)
{
    return can && seq > 0 && seq != UINT64_MAX &&
           start_replay(r, st, RP_START, start_from(r, seq), seq, false, now_ms) == 0 &&
           hold_behind(r, seq, data, len, reject);
}

/* A gap before seq: counted; replayed when `can` (the batch then held, *held
 * set), else its barrier.  Returns the router events emitted. */
static int gap(struct kvb_replay *r, struct kvb_stream *st, uint64_t seq, const uint8_t *data,
               size_t len, bool reject, bool can, bool *held, uint64_t now_ms)
{
    kvb_inc(&r->m->seq_gaps_total[0]);
    st->gaps++;
    uint64_t missing = kvb_seq_missing(st, seq);
    if (!can || missing > r->cfg.max_batches) {
        kvb_log_rl(&st->rl, KVB_LOG_WARN, "source",
                   "%s: seq gap: %llu missing before %llu%s, publishing barrier", st->name,
                   (unsigned long long)missing, (unsigned long long)seq,
                   can ? " (more than replay.max_batches)" : "");
        return barrier(&r->ops, st, KVB_BAR_GAP);
    }
    kvb_log_rl(&st->rl, KVB_LOG_WARN, "source",
               "%s: seq gap: %llu missing before %llu, asking for replay", st->name,
               (unsigned long long)kvb_seq_missing(st, seq), (unsigned long long)seq);
    int rc = start_replay(r, st, RP_GAP, st->last + 1, seq, false, now_ms);
    if (rc == 0 &&
        (rc = reject ? hold(r, seq, NULL, 0, true) : hold(r, seq, data, len, false)) == 0) {
        *held = true;
        return 0;
    }
    kvb_warn("replay", "%s: cannot request replay: %s", st->name, strerror(-rc));
    if (r->active) {
        r->active = false;
        cancel(r);
    }
    kvb_inc(&r->m->replays_failed_total[0]);
    return barrier(&r->ops, st, KVB_BAR_GAP);
}

/* One batch of stream st by the rules: a suspect stream proven or restarted,
 * a duplicate dropped, a restart, a new stream's start or a gap recovered by
 * a replay (may_replay: then the batch is held and *held set), else the
 * barrier it needs; then the batch.  Returns the router events emitted. */
static int step(struct kvb_replay *r, struct kvb_stream *st, uint64_t seq, const uint8_t *data,
                size_t len, bool reject, bool may_replay, bool *held, uint64_t now_ms)
{
    int n = 0, rc;
    bool can = may_replay && r->endpoint[0] && !r->active;
    *held = false;
    if (st->suspect && st->has_last &&
        ((n = prove_or_restart(r, st, seq, data, len, reject, can, held, now_ms)) < 0 || *held))
        return n;
    st->suspect = false;
    switch (kvb_seq_classify(st, seq)) {
    case KVB_SEQ_BACK:
        if (duplicate(st, seq, data, len, reject))
            return n;
        if ((rc = restart(r, st, seq, NULL)) < 0)
            return rc;
        n += rc;
        /* the first batch of a new incarnation */
        __attribute__((fallthrough));
    case KVB_SEQ_FIRST:
        if ((*held = start_held(r, st, seq, data, len, reject, can, now_ms)))
            return n;
        break;
    case KVB_SEQ_GAP:
        if ((rc = gap(r, st, seq, data, len, reject, can, held, now_ms)) < 0)
            return rc;
        n += rc;
        if (*held)
            return n;
        break;
    default: break;
    }
    if ((rc = apply_one(r, st, seq, data, len, reject, NULL)) < 0)
        return rc;
    return n + rc;
}

/* What the replay that ends did, in the log and the counters. */
static void finish_log(struct kvb_replay *r, const char *why, bool missing)
{
    struct kvb_stream *st = r->st;
    unsigned long long a = r->first_applied, b = r->want - 1;
    if (r->mode == RP_CHECK) {
        st->check_again = false;
        if (missing) {
            kvb_inc(&r->m->replays_failed_total[0]);
            kvb_warn("replay", "%s: seq %llu on could not be checked (%s): publishing barrier",
                     st->name, (unsigned long long)r->want, why);
        } else if (r->lost) {
            kvb_inc(&r->m->replays_failed_total[0]); /* its barrier is out */
        } else if (r->want != r->from) {
            kvb_inc(&r->m->replays_filled_total[0]);
            kvb_info("replay",
                     "%s: seq %llu..%llu, dropped while reading was paused, "
                     "recovered",
                     st->name, (unsigned long long)r->from, b);
        } else {
            kvb_info("replay", "%s: the engine dropped nothing while reading was paused", st->name);
        }
    } else if (r->mode == RP_GAP && r->open && !missing && !r->lost) {
        /* after a proven reconnect: what the engine published meanwhile */
        if (r->want != r->from) {
            kvb_inc(&r->m->replays_filled_total[0]);
            kvb_info("replay", "%s: seq %llu..%llu, published while disconnected, recovered",
                     st->name, (unsigned long long)r->from, b);
        } else {
            kvb_info("replay", "%s: the engine published nothing while disconnected", st->name);
        }
    } else if (r->mode == RP_GAP && !missing && !r->lost) {
        kvb_inc(&r->m->replays_filled_total[0]);
        kvb_info("replay", "%s: gap filled up to seq %llu", st->name,
                 (unsigned long long)(r->until - 1));
    } else if (r->mode == RP_GAP || (missing && !r->fresh)) {
        kvb_inc(&r->m->replays_failed_total[0]);
        if (r->open)
            kvb_warn("replay", "%s: seq %llu on not recovered (%s)%s", st->name,
                     (unsigned long long)r->want, why,
                     missing && !r->fresh ? ": publishing barrier" : "");
        else
            kvb_warn("replay", "%s: gap before seq %llu not recovered (%s)%s", st->name,
                     (unsigned long long)r->until, why,
                     missing && !r->fresh ? ": publishing barrier" : "");
    } else if (r->mode == RP_START && r->applied_any) {
        kvb_info("replay", "%s: stream start: seq %llu..%llu applied from the engine's buffer",
                 st->name, a, b);
    } else if (r->mode == RP_START) {
        kvb_info("replay", "%s: stream start: the engine's buffer held nothing before %s (%s)",
                 st->name, r->open ? "now" : "its first live batch", why);
    }
}

/* The replay is over (complete or not): publish the barrier if part of it
 * stayed missing, then the held live batches, oldest first, through the
 * rules again (a new gap among them, or a restart, is recovered the same
 * way; not when !again: a full hold queue, then barriers). */
static int finish_replay_(struct kvb_replay *r, const char *why, uint64_t now_ms, bool again)
{
    struct kvb_stream *st = r->st;
    int rc = 0, n = 0;
    bool missing = r->want != r->until;
    cancel(r); /* late replies of this request must not reach the next one */
    r->active = false;
    finish_log(r, why, missing);
    if (missing && !r->fresh) {
        if ((rc = barrier(&r->ops, st, KVB_BAR_GAP)) < 0)
            goto out;
        n += rc;
    }
    /* the held batches, taken out: a new replay holds into a new queue */
    struct held *h = r->held;
    size_t nh = r->n_held;
    r->held = NULL;
    r->n_held = r->cap_held = r->held_bytes = 0;
    size_t i = 0;
    for (; i < nh; i++) {
        bool held = false;
        if (i == 0 && kvb_seq_classify(st, h[0].seq) != KVB_SEQ_BACK) {
            /* the batch the replay was for: its gap (or start) is dealt with */
            rc = apply_one(r, st, h[0].seq, h[0].data, h[0].len, h[0].reject, NULL);
        } else {
            rc = step(r, st, h[i].seq, h[i].data, h[i].len, h[i].reject, again, &held, now_ms);
        }
        if (rc < 0)
            break;
        n += rc;
        if (held) { /* a new replay: the rest stays held behind it */
            for (size_t j = i + 1; j < nh; j++) {
                if (push_held(r, h[j]) < 0)
                    break;
                h[j].data = NULL;
            }
            break;
        }
    }
    free_held(h, nh);
    free(h);
out:
    if (!r->active)
        r->st = NULL;
    return rc < 0 ? rc : n;
}

static int finish_replay(struct kvb_replay *r, const char *why, uint64_t now_ms)
{
    return finish_replay_(r, why, now_ms, true);
}

/* A proof after a reconnect failed (not held, other bytes, no answer): the
 * engine restarted.  Barrier, then the new stream's start from 0: up to the
 * held live batch, or (open) all the engine holds. */
static int proof_failed(struct kvb_replay *r, const char *why, uint64_t now_ms)
{
    struct kvb_stream *st = r->st;
    int n = restart(r, st, r->open ? st->last : r->until, why);
    if (n < 0)
        return n;
    cancel(r);
    r->mode = RP_START;
    r->want = r->from = r->open ? 0 : start_from(r, r->until);
    if (r->open) {
        r->until = OPEN_SPAN;
        copies_from(r, st, 0);
    }
    r->fresh = true;
    r->applied_any = false;
    r->rounds = 0;
    r->end_ms = now_ms + r->cfg.timeout_ms;
    if (r->until == 0 || r->until == UINT64_MAX || send_request(r, now_ms) < 0) {
        r->until = r->want = r->open ? 0 : r->until; /* nothing to ask: the held batches */
        int rc = finish_replay(r, why, now_ms);
        return rc < 0 ? rc : n + rc;
    }
    if (r->open)
        kvb_info("replay", "%s: the new incarnation: asking the engine for seq 0 on from %s",
                 st->name, r->endpoint);
    else
        kvb_info("replay", "%s: %s %llu..%llu from %s", st->name, mode_what[RP_START],
                 (unsigned long long)r->want, (unsigned long long)(r->until - 1), r->endpoint);
    return n;
}

/* This round's reply stopped short of until (its END, or our held batch,
 * came while want < until) after it had made progress: the engine's ROUTER
 * dropped the rest at its HWM (a buffer that held the start of the range
 * holds all of it, since it ends with the live batches we hold), so that is
 * a cut, not a loss.  Ask again from want within the replay's time; false
 * when that is not the case or not possible (then it is a loss). */
static bool cut_ask_again(struct kvb_replay *r, uint64_t now_ms)
{
    if (!r->got_reply || r->want == r->req_want || r->want == r->until ||
        r->rounds >= REPLAY_MAX_ROUNDS || now_ms >= r->end_ms)
        return false;
    r->rounds++;
    cancel(r);
    if (send_request(r, now_ms) < 0)
        return false;
    kvb_debug("replay", "%s: reply cut at seq %llu, asking again", r->name,
              (unsigned long long)r->want);
    return true;
}

/* Replies are flowing: a stall of REPLAY_STALL_MS (at most the timeout)
 * means the reply was cut. */
static void flowing(struct kvb_replay *r, uint64_t now_ms)
{
    uint64_t stall = r->cfg.timeout_ms < REPLAY_STALL_MS ? r->cfg.timeout_ms : REPLAY_STALL_MS;
    r->deadline_ms = now_ms + stall < r->end_ms ? now_ms + stall : r->end_ms;
    if (r->deadline_ms > r->hard_end_ms)
        r->deadline_ms = r->hard_end_ms;
}

/* RP_PROVE: the engine's batch at our last seq, the same bytes or not. */
static int proof_reply(struct kvb_replay *r, uint64_t seq, const uint8_t *data, size_t len,
                       bool big, uint64_t now_ms)
{
    struct kvb_stream *st = r->st;
    if (seq - r->want >= r->until - r->want)
        return 0; /* not what was asked */
    if (seq != r->want || big || XXH3_64bits(data, len) != st->last_hash)
        return proof_failed(r,
                            seq != r->want ? "the engine no longer holds our last seq"
                                           : "the engine's batch at our last seq differs",
                            now_ms);
    kvb_info("replay", "%s: engine reconnected: seq %llu is the same batch, the stream continues",
             st->name, (unsigned long long)seq);
    r->mode = RP_GAP;
    r->want = seq + 1;
    r->from = seq + 1; /* (open: what follows, from here) */
    r->got_reply = true;
    flowing(r, now_ms);
    return 0;
}

/* A reply at seq after the one wanted.  Mid-reply: the ROUTER's HWM dropped
 * some, asked again.  The first reply of a check: maybe still on its way,
 * asked again once the stream is quiet (believed the second time).  Else
 * the engine's buffer no longer holds them: lost, a barrier (unless one
 * already covers them).  *done: the reply is dealt with (the value
 * returned is the call's); else the router events emitted so far. */
static int later_than_asked(struct kvb_replay *r, uint64_t seq, uint64_t now_ms, bool *done)
{
    struct kvb_stream *st = r->st;
    *done = true;
    if (r->got_reply && r->rounds < REPLAY_MAX_ROUNDS) {
        r->rounds++;
        cancel(r);
        if (send_request(r, now_ms) == 0)
            return 0;
        return finish_replay(r, "request failed", now_ms);
    }
    if (r->mode == RP_CHECK && !(st->check_again && st->ahead_at == st->last)) {
        st->check_again = true;
        st->ahead_at = st->last;
        kvb_info("replay",
                 "%s: the engine's buffer starts at %llu, not %llu: the rest may "
                 "still be on its way; asking again once the stream is quiet",
                 st->name, (unsigned long long)seq, (unsigned long long)r->want);
        cancel(r);
        r->active = false;
        r->st = NULL;
        r->copy_st = NULL;
        return 0;
    }
    *done = false;
    st->check_again = false;
    r->lost = true;
    if (r->fresh)
        return 0;
    kvb_warn("replay", "%s: engine's replay starts at %llu, not %llu: publishing barrier", st->name,
             (unsigned long long)seq, (unsigned long long)r->want);
    return barrier(&r->ops, st, KVB_BAR_GAP);
}

/* A replied batch the replay wants, applied (an oversize one rejected). */
static int apply_reply(struct kvb_replay *r, uint64_t seq, const uint8_t *data, size_t len,
                       bool big)
{
    struct kvb_stream *st = r->st;
    int rc;
    if (big) { /* in the engine's buffer, but not usable: a lost batch */
        r->lost = true;
        if ((rc = apply_one(r, st, seq, NULL, 0, true, NULL)) < 0)
            return rc;
        r->fresh = true; /* its malformed barrier */
        return rc;
    }
    if (r->open && r->copy_st == st)
        copies_add(r, seq, data, len);
    struct kvb_applied a;
    if ((rc = apply_one(r, st, seq, data, len, false, &a)) < 0)
        return rc;
    if (!r->applied_any)
        r->first_applied = seq;
    r->applied_any = true;
    /* a batch the pipeline could not decode is a lost batch (it published
     * the malformed barrier): the replay did not fill the gap */
    if (!a.decoded)
        r->lost = true;
    r->fresh = false;
    return rc;
}

static int on_reply_batch(struct kvb_replay *r, uint64_t seq, const uint8_t *data, size_t len,
                          uint64_t now_ms)
{
    int n = 0, rc;
    bool big = oversize(r, len), done;
    if (r->mode == RP_PROVE)
        return proof_reply(r, seq, data, len, big, now_ms);
    if (seq == r->until) { /* the engine is at our held batch: the rest is later */
        if (cut_ask_again(r, now_ms))
            return 0;
        return finish_replay(r, "the engine no longer held all of it", now_ms);
    }
    if (seq - r->want >= r->until - r->want)
        return 0; /* already applied, or live batches we hold */
    if (r->mode == RP_START && r->until - seq > (uint64_t)INT64_MAX)
        return 0; /* after until in serial arithmetic: the stream wrapped */
    if (seq != r->want && ((n = later_than_asked(r, seq, now_ms, &done)) < 0 || done))
        return n;
    if (r->open && seq - r->from >= r->cfg.max_batches) {
        /* more than any engine's buffer holds: not a replay that ends */
        r->until = seq;
        return finish_replay(r, "more than replay.max_batches", now_ms);
    }
    r->got_reply = true;
    r->want = seq + 1;
    flowing(r, now_ms);
    if ((rc = apply_reply(r, seq, data, len, big)) < 0)
        return rc;
    return n + rc;
}

int kvb_replay_reply(struct kvb_replay *r, uint64_t seq, const uint8_t *data, size_t len,
                     uint64_t now_ms)
{
    if (!r->active)
        return 0; /* a late reply to a request given up */
    if (now_ms >= r->hard_end_ms)
        return finish_replay(r, "replay.max_ms reached", now_ms);
    if (seq == KVB_REPLAY_END && len == 0) { /* (a batch is never empty) */
        if (r->mode == RP_PROVE)
            return proof_failed(r, "the engine no longer holds our last seq", now_ms);
        if (r->open) {
            /* the engine has nothing after want, unless its ROUTER cut the
             * tail of this reply: asked again until an END comes alone */
            if (r->got_reply && r->rounds < REPLAY_MAX_ROUNDS && now_ms < r->end_ms) {
                r->rounds++;
                cancel(r);
                if (send_request(r, now_ms) == 0)
                    return 0;
                return finish_replay(r, "request failed", now_ms);
            }
            r->until = r->want;
            return finish_replay(r, "complete", now_ms);
        }
        if (cut_ask_again(r, now_ms))
            return 0;
        return finish_replay(r, "engine's replay buffer no longer holds it", now_ms);
    }
    int n = on_reply_batch(r, seq, data, len, now_ms);
    if (n < 0)
        return n;
    /* caught up: the rest of the reply is what we hold already (the request
     * is cancelled, so the remaining replies are dropped) */
    if (r->active && r->mode != RP_PROVE && r->want == r->until) {
        int rc = finish_replay(r, "the engine no longer held all of it", now_ms);
        if (rc < 0)
            return rc;
        n += rc;
    }
    return n;
}

void kvb_replay_postpone(struct kvb_replay *r, uint64_t ms)
{
    if (!r->active)
        return;
    r->deadline_ms += ms;
    r->end_ms += ms;
    if (r->deadline_ms > r->hard_end_ms) /* wall time: not postponed */
        r->deadline_ms = r->hard_end_ms;
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
    if (now_ms >= r->hard_end_ms && r->mode != RP_PROVE)
        return finish_replay(r, "replay.max_ms reached", now_ms);
    if (r->mode == RP_PROVE)
        return proof_failed(r, "was not answered", now_ms);
    /* progress since the last request, but no END: the ROUTER dropped the
     * rest of its reply (its HWM); ask again from where we are, within the
     * whole replay's time */
    if (now_ms < r->end_ms && r->want != r->req_want && r->rounds < REPLAY_MAX_ROUNDS) {
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

/* A live batch of the stream an open replay is for (not a copy of what it
 * applied).  An unproven reconnect: a later seq becomes the live batch the
 * proof holds (until); an earlier one ends the proof (the rules then say
 * restart or duplicate).  Else the next seq after what the replay applied
 * ends it (complete), a later one turns it into a replay up to it, and an
 * earlier one means the engine restarted meanwhile.  Returns the router
 * events emitted; the batch is then held or judged by the caller. */
static int live_ends_open(struct kvb_replay *r, struct kvb_stream *st, uint64_t seq,
                          uint64_t now_ms)
{
    uint64_t ahead = seq - r->want;
    if (r->mode == RP_PROVE) {
        if (ahead - 1 < OPEN_SPAN) { /* after our last seq */
            r->open = false;
            r->until = seq;
            r->copy_st = NULL;
            return 0; /* held by the caller */
        }
        cancel(r);
        r->active = false;
        r->st = NULL;
        r->copy_st = NULL;
        st->suspect = true;
        return 0;
    }
    if (ahead == 0 || ahead > OPEN_SPAN) {
        r->until = r->want;
        return finish_replay_(r, ahead == 0 ? "complete" : "the engine restarted meanwhile", now_ms,
                              false);
    }
    /* a later live batch: an ordinary gap replay up to it */
    if (r->mode == RP_CHECK)
        r->mode = RP_GAP;
    r->open = false;
    r->until = seq;
    return 0;
}

int kvb_replay_live(struct kvb_replay *r, struct kvb_stream *st, uint64_t seq, const uint8_t *data,
                    size_t len, uint64_t now_ms)
{
    int rc, n = 0;
    bool big = oversize(r, len), held;
    if (r->copy_st == st) {
        if (is_copy(r, seq, big ? NULL : data, len)) {
            kvb_debug("replay", "%s: seq %llu live, as the replay gave it: dropped", st->name,
                      (unsigned long long)seq);
            return 0;
        }
        r->copy_st = NULL; /* the live stream is past what the replay gave */
    }
    if (r->active && r->st == st && r->open && (n = live_ends_open(r, st, seq, now_ms)) < 0)
        return n;
    if (r->active && r->st == st) {
        uint64_t prev = r->n_held ? r->held[r->n_held - 1].seq : r->until - 1;
        if (seq != prev + 1 && seq <= prev) {
            /* the engine restarted meanwhile (its seq went back): its replay
             * socket answers for the new incarnation now.  What came before
             * is applied (barriers for what is missing), then this batch */
            if ((n = finish_replay_(r, "the engine restarted meanwhile", now_ms, false)) < 0)
                return n;
        } else if ((rc = big ? hold(r, seq, NULL, 0, true) : hold(r, seq, data, len, false)) == 0) {
            /* held in order; an oversize batch without its payload (it is
             * rejected when its turn comes) */
            return 0;
        } else {
            kvb_warn("replay", "%s: too many live batches held during replay", st->name);
            /* give up: barrier, then everything held (no new replay: there
             * is no room to hold), then this batch as a live one */
            if ((n = finish_replay_(r, "hold queue full", now_ms, false)) < 0)
                return n;
        }
    }
    rc = step(r, st, seq, big ? NULL : data, big ? 0 : len, big, true, &held, now_ms);
    return rc < 0 ? rc : n + rc;
}

int kvb_replay_check(struct kvb_replay *r, struct kvb_stream *st, uint64_t now_ms)
{
    if (!st->has_last || st->suspect) {
        st->check_again = false;
        return 0;
    }
    if (r->active)
        return -EBUSY;
    uint64_t from = st->last + 1;
    if (r->endpoint[0] && start_replay(r, st, RP_CHECK, from, 0, true, now_ms) == 0)
        return 0;
    if (r->endpoint[0])
        kvb_inc(&r->m->replays_failed_total[0]);
    kvb_warn("replay",
             "%s: the engine may have dropped batches after seq %llu while reading "
             "was paused, and %s: publishing barrier",
             st->name, (unsigned long long)st->last,
             r->endpoint[0] ? "the replay request failed" : "there is no replay endpoint to ask");
    return barrier(&r->ops, st, KVB_BAR_GAP);
}

int kvb_replay_barrier(struct kvb_replay *r, struct kvb_stream *st, int cause)
{
    return barrier(&r->ops, st, cause);
}

void kvb_replay_peer_reset(struct kvb_replay *r, struct kvb_stream *st, uint64_t now_ms)
{
    if (r->active && r->st == st && r->open && r->mode != RP_CHECK) {
        /* a reconnect's proof, or what it read after it: the next
         * connection proves the stream again from what is applied */
        cancel(r);
        r->active = false;
        r->st = NULL;
    }
    if (r->active && r->st == st) {
        /* what came before the drop is applied first, all of it (no new
         * replay: the batches after the drop must prove themselves) */
        int rc = finish_replay_(r, "the engine's connection dropped", now_ms, false);
        if (rc < 0)
            kvb_err("replay", "%s: %s", st->name, strerror(-rc));
    }
    if (r->copy_st == st)
        r->copy_st = NULL;
    if (st->has_last)
        st->suspect = true;
}

int kvb_replay_connected(struct kvb_replay *r, struct kvb_stream *st, uint64_t now_ms)
{
    if (!st->suspect || !st->has_last)
        return 0;
    if (r->active)
        return -EBUSY;
    if (r->endpoint[0] && st->has_hash &&
        start_replay(r, st, RP_PROVE, st->last, 0, true, now_ms) == 0) {
        st->suspect = false; /* the proof is under way */
        return 0;
    }
    if (r->endpoint[0] && st->has_hash)
        kvb_inc(&r->m->replays_failed_total[0]);
    kvb_log_rl(&st->rl, KVB_LOG_WARN, "source",
               "%s: engine reconnected and its stream after seq %llu %s: engine restart, "
               "publishing barrier",
               st->name, (unsigned long long)st->last,
               !r->endpoint[0] ? "cannot be proven without a replay endpoint"
                               : "cannot be proven to continue");
    return new_incarnation(r, st);
}
