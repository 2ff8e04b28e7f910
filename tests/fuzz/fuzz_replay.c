/* libFuzzer target: the sequence and replay rules (replay.h) against a model
 * of honest engines.  Random sequences of live batches (delivered or lost),
 * replay replies (some dropped by the ROUTER's high-water mark), timeouts,
 * failed requests, oversize and undecodable batches and engine restarts
 * drive one kvb_replay (one source) with two streams; the decisions are
 * carried out by the real pipeline.
 *
 * Invariants (checked at every decision and after a final drain in which
 * the engines answer every request and time runs out):
 *   I1 no batch twice: no batch is applied (or rejected) twice without a
 *      barrier for its stream between (after one, the router has forgotten
 *      it: an engine's history replayed after a presumed restart is fine);
 *   I2 engine order: per stream, batches are applied in publish order (but
 *      for what I1 allows after a barrier);
 *   I3 every loss is followed by a barrier: between two batches applied one
 *      after the other on a stream, a "cleared" for that stream is published
 *      when any batch the engine published between them was not applied, or
 *      when they come from different engine incarnations (a restart);
 *   I4 nothing delivered is dropped: every batch delivered live is applied
 *      (or rejected) by the end;
 *   I5 event_ids contiguous: per dp_rank from 0, starting with "cleared",
 *      +1 per router event, and each event's JSON is exactly its kvb_rev
 *      (fuzz_common.h);
 *   I6 the module's answers add up: a call returns the router events it
 *      emitted; the stream's cursor is the seq of the last batch applied;
 *   I7 a check after a pause leaves no loss silent: once the engines are
 *      quiet, a kvb_replay_check answered by the engine ends with the last
 *      batch each one published applied, or a barrier after the last batch
 *      applied (unless its connection dropped: its next batch proves it; or
 *      it restarted inside the process since: nothing can tell; or its
 *      seq wrapped past 2^64 since: the engine's replay compares numerically).
 *
 * Input: byte 0 flags (bit 0: stream 0's engine starts at a clock-like seq,
 * bit 1: it starts 4 below 2^64 and wraps), then one op per byte:
 *   bits 0-2 op, bit 3 stream, bits 4-7 arg
 *   0 publish, delivered live          1 publish, lost live (kept for replay)
 *   2 the ROUTER sends arg+1 replies   3 the ROUTER drops its next reply (HWM)
 *   4 time passes: arg*100 ms, tick;   5 arg&2: a network blip (the connection
 *     arg odd: then kvb_replay_check      drops, kvb_replay_peer_reset); else the
 *                                        engine restarts (seq from its start,
 *                                        buffer empty), as a new process (the
 *                                        connection drops) or, arg&1, inside
 *                                        the process (its first batch is seen)
 *   6 publish an oversize (arg odd) or undecodable batch, delivered live
 *   7 the next replay request fails
 * Seeds: tests/fuzz/mkseeds.sh; regressions: tests/fuzz/regressions/fuzz_replay/.
 */
#include <errno.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "config.h"
#include "fuzz_common.h"
#include "log.h"
#include "pipeline.h"
#include "replay.h"

#define WORKER 5
#define NSTREAMS 2
#define BUF_STEPS 8      /* the engine's replay buffer (small: it runs out) */
#define MAX_BATCHES 4096 /* batches published in one input */
#define MAX_PAYLOAD 96   /* limits.max_payload_bytes */
#define MAX_HELD 16
#define TIMEOUT_MS 300

struct batch {
    int stream;
    uint32_t inc; /* engine incarnation */
    uint64_t seq;
    bool delivered; /* reached kvbridge live */
    int applied;    /* times applied or rejected */
    uint32_t seg;   /* the stream's segment (barriers) it was last applied in */
    uint8_t kind;   /* 0 good, 1 oversize, 2 undecodable */
};

struct engine {
    bool fresh;        /* restarted, nothing delivered yet */
    bool fresh_inproc; /* ... without a disconnect: its first batch is seen */
    uint32_t inc;
    uint64_t start, next;
    uint32_t buf[BUF_STEPS]; /* batch ids, oldest first */
    int n_buf;
};

struct fz {
    struct batch b[MAX_BATCHES];
    int nb;
    struct engine eng[NSTREAMS];
    struct kvb_stream st[NSTREAMS];
    /* per stream: the last batch applied, and barriers since */
    int last_applied[NSTREAMS];
    bool barrier_since[NSTREAMS];
    uint32_t seg[NSTREAMS];
    int big[NSTREAMS][MAX_BATCHES]; /* oversize batches delivered live, not rejected yet */
    int n_big[NSTREAMS];
    int cur_reply; /* the batch a reply carries, or -1 */
    /* the reply to the request in flight (batch ids; -1 = END) */
    int reply[BUF_STEPS + 1];
    int n_reply, reply_pos, reply_stream;
    bool pending, drop_next, fail_next;
    struct kvb_publish *pub;
    struct kvb_pipeline *p;
    struct kvb_replay *r;
    struct id_track ids;
    uint64_t emitted; /* router events since the last call */
    msgpack_sbuffer sb;
};

static struct fz *F;

static int stream_of(const struct kvb_stream *s) { return (int)(s - F->st); }

/* The batch a payload stands for: its last 4 bytes. */
static int batch_id(const uint8_t *data, size_t len)
{
    FUZZ_CHECK(len >= 4, "payload of %zu bytes", len);
    uint32_t id = 0;
    for (int i = 0; i < 4; i++)
        id = id << 8 | data[len - 4 + i];
    FUZZ_CHECK(id < (uint32_t)F->nb, "unknown batch %u", id);
    return (int)id;
}

static void applied(const struct kvb_stream *s, uint64_t seq, int id)
{
    int k = stream_of(s);
    struct batch *b = &F->b[id];
    FUZZ_CHECK(b->stream == k, "batch %d of stream %d applied on stream %d", id, b->stream, k);
    FUZZ_CHECK(b->seq == seq, "batch %d (seq %llu) applied as seq %llu", id,
               (unsigned long long)b->seq, (unsigned long long)seq);
    /* a barrier starts a new segment: the router forgot what came before,
     * so a batch may be applied again after one (the engine's history
     * replayed after a restart that was only presumed) */
    FUZZ_CHECK(b->applied == 0 || b->seg != F->seg[k],
               "I1: batch %d (seq %llu) applied twice without a barrier between", id,
               (unsigned long long)seq);
    b->applied++;
    b->seg = F->seg[k];
    FUZZ_CHECK(s->has_last && s->last == seq, "I6: cursor %llu, applying %llu",
               (unsigned long long)s->last, (unsigned long long)seq);
    int prev = F->last_applied[k];
    if (prev >= 0) {
        FUZZ_CHECK(id > prev || F->barrier_since[k], "I2: stream %d: batch %d applied after %d", k,
                   id, prev);
        bool lost = F->b[prev].inc != b->inc;
        for (int i = prev + 1; i < id && !lost; i++)
            lost = F->b[i].stream == k && !F->b[i].applied;
        FUZZ_CHECK(!lost || F->barrier_since[k],
                   "I3: stream %d: seq %llu (inc %u) after seq %llu (inc %u) without a barrier "
                   "for what was lost between them",
                   k, (unsigned long long)seq, b->inc, (unsigned long long)F->b[prev].seq,
                   F->b[prev].inc);
    }
    F->last_applied[k] = id;
    F->barrier_since[k] = false;
    if (getenv("KVB_FUZZ_LOG"))
        fprintf(stderr, "applied: stream %d id %d seq %llu\n", k, id, (unsigned long long)seq);
}

static int op_apply(void *ctx, const struct kvb_stream *s, uint64_t seq, const uint8_t *d,
                    size_t len, struct kvb_applied *out)
{
    (void)ctx;
    int id = batch_id(d, len);
    applied(s, seq, id);
    if (F->b[id].kind == 2) { /* does not decode: the malformed barrier */
        F->barrier_since[stream_of(s)] = true;
        F->seg[stream_of(s)]++;
    }
    return kvb_pipeline_batch(F->p, s, seq, d, len, out);
}

static int op_reject(void *ctx, const struct kvb_stream *s, uint64_t seq, const char *why)
{
    (void)ctx;
    /* only oversize batches are rejected: find it by seq on this stream */
    int k = stream_of(s), id = -1;
    /* without a payload the seq names it: the reply being delivered, else
     * the oldest oversize batch delivered live and not rejected yet (the
     * module rejects held ones in order) */
    if (F->cur_reply >= 0 && F->b[F->cur_reply].stream == k && F->b[F->cur_reply].seq == seq)
        id = F->cur_reply;
    for (int i = 0; i < F->n_big[k]; i++)
        if (id < 0 ? F->b[F->big[k][i]].seq == seq : F->big[k][i] == id) {
            id = F->big[k][i];
            memmove(&F->big[k][i], &F->big[k][i + 1], (size_t)(F->n_big[k] - i - 1) * sizeof(int));
            F->n_big[k]--;
            break;
        }
    FUZZ_CHECK(id >= 0, "reject of seq %llu: no such oversize batch", (unsigned long long)seq);
    applied(s, seq, id);
    F->barrier_since[k] = true; /* the malformed barrier */
    F->seg[k]++;
    return kvb_pipeline_malformed(F->p, s, seq, why);
}

static int op_barrier(void *ctx, const struct kvb_stream *s, int cause)
{
    (void)ctx;
    if (getenv("KVB_FUZZ_LOG"))
        fprintf(stderr, "barrier: stream %d cause %d\n", stream_of(s), cause);
    F->barrier_since[stream_of(s)] = true;
    F->seg[stream_of(s)]++;
    return kvb_pipeline_barrier(F->p, s, cause);
}

static int op_request(void *ctx, uint64_t from)
{
    (void)ctx;
    if (F->fail_next) {
        F->fail_next = false;
        return -EIO;
    }
    const struct kvb_stream *s = kvb_replay_stream(F->r);
    /* called before the module marks the replay active: the stream is the
     * one whose live batch (or held batches) asked */
    int k = s ? stream_of(s) : F->reply_stream;
    struct engine *e = &F->eng[k];
    F->n_reply = 0;
    for (int i = 0; i < e->n_buf; i++)
        if (F->b[e->buf[i]].seq >= from)
            F->reply[F->n_reply++] = (int)e->buf[i];
    F->reply[F->n_reply++] = -1;
    if (getenv("KVB_FUZZ_LOG"))
        fprintf(stderr, "request: stream %d from %llu: %d replies of %d buffered\n", k,
                (unsigned long long)from, F->n_reply - 1, e->n_buf);
    F->reply_pos = 0;
    F->reply_stream = k;
    F->pending = true;
    return 0;
}

static void op_cancel(void *ctx)
{
    (void)ctx;
    F->pending = false;
}

static int on_emit(void *ctx, const struct kvb_publish_msg *msg)
{
    (void)ctx;
    check_emitted(&F->ids, msg->rev, msg->data, msg->len, WORKER);
    F->emitted++;
    return 0;
}

/* Payload of batch id: [ts, [["BlockRemoved", [hash]]], nil, bin(pad + id)]. */
static void payload(int id, uint8_t kind, const uint8_t **data, size_t *len)
{
    msgpack_sbuffer *sb = &F->sb;
    msgpack_sbuffer_clear(sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    if (kind == 2) {
        msgpack_sbuffer_write(sb, "\xc1", 1); /* never valid msgpack */
    } else {
        msgpack_pack_array(&pk, 4);
        msgpack_pack_double(&pk, 1.0);
        msgpack_pack_array(&pk, 1);
        msgpack_pack_array(&pk, 2);
        msgpack_pack_str(&pk, 12);
        msgpack_pack_str_body(&pk, "BlockRemoved", 12);
        msgpack_pack_array(&pk, 1);
        msgpack_pack_uint64(&pk, 1000 + (uint64_t)id);
        msgpack_pack_nil(&pk);
        size_t pad = kind == 1 ? MAX_PAYLOAD : 0;
        msgpack_pack_bin(&pk, pad + 4);
        static const uint8_t zeros[MAX_PAYLOAD];
        if (pad)
            msgpack_pack_bin_body(&pk, zeros, pad);
    }
    uint8_t idb[4] = {(uint8_t)(id >> 24), (uint8_t)(id >> 16), (uint8_t)(id >> 8), (uint8_t)id};
    msgpack_sbuffer_write(sb, (const char *)idb, 4);
    *data = (const uint8_t *)sb->data;
    *len = sb->size;
}

static void call_done(int rc, const char *what)
{
    FUZZ_CHECK(rc >= 0, "%s: rc %d", what, rc);
    FUZZ_CHECK((uint64_t)rc == F->emitted, "I6: %s returned %d, emitted %llu", what, rc,
               (unsigned long long)F->emitted);
    F->emitted = 0;
}

static void publish(int k, bool delivered, uint8_t kind, uint64_t now)
{
    if (F->nb >= MAX_BATCHES)
        return;
    struct engine *e = &F->eng[k];
    if (e->fresh_inproc)
        delivered = true;
    e->fresh &= !delivered;
    e->fresh_inproc &= !delivered;
    int id = F->nb++;
    F->b[id] = (struct batch){k, e->inc, e->next++, delivered, 0, 0, kind};
    if (e->n_buf == BUF_STEPS)
        memmove(e->buf, e->buf + 1, (BUF_STEPS - 1) * sizeof(e->buf[0]));
    else
        e->n_buf++;
    e->buf[e->n_buf - 1] = (uint32_t)id;
    if (getenv("KVB_FUZZ_LOG"))
        fprintf(stderr, "publish: stream %d inc %u seq %llu id %d %s kind %u\n", k, e->inc,
                (unsigned long long)F->b[id].seq, id, delivered ? "live" : "lost", kind);
    if (!delivered)
        return;
    const uint8_t *d;
    size_t len;
    payload(id, kind, &d, &len);
    F->reply_stream = k;
    if (kind == 1)
        F->big[k][F->n_big[k]++] = id;
    call_done(kvb_replay_live(F->r, &F->st[k], F->b[id].seq, d, len, now), "live");
}

static void serve(int n, uint64_t now)
{
    while (n-- > 0 && F->pending && F->reply_pos < F->n_reply) {
        int id = F->reply[F->reply_pos++];
        if (F->drop_next) {
            F->drop_next = false;
            continue;
        }
        if (id < 0) { /* (the END may make the module ask again at once) */
            F->pending = false;
            call_done(kvb_replay_reply(F->r, KVB_REPLAY_END, NULL, 0, now), "reply end");
            break;
        }
        const uint8_t *d;
        size_t len;
        payload(id, F->b[id].kind, &d, &len);
        F->cur_reply = id;
        call_done(kvb_replay_reply(F->r, F->b[id].seq, d, len, now), "reply");
        F->cur_reply = -1;
    }
    if (F->reply_pos >= F->n_reply)
        F->pending = false; /* the ROUTER has sent (or dropped) all of it */
}

/* The engines answer every request, then time runs out. */
static void drain(uint64_t *now)
{
    for (int round = 0; round < 10000 && kvb_replay_active(F->r); round++) {
        if (getenv("KVB_FUZZ_LOG") && round < 5)
            fprintf(stderr, "drain: pending %d pos %d/%d\n", F->pending, F->reply_pos, F->n_reply);
        if (F->pending)
            serve(BUF_STEPS + 1, *now);
        else {
            *now += 60000;
            call_done(kvb_replay_tick(F->r, *now), "final tick");
        }
    }
    FUZZ_CHECK(!kvb_replay_active(F->r), "replay still active after the drain");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool quiet;
    if (!quiet) { /* KVB_FUZZ_LOG=1: the module's log lines, to read a finding */
        kvb_log_set_level(getenv("KVB_FUZZ_LOG") ? KVB_LOG_DEBUG : KVB_LOG_ERROR - 1);
        quiet = true;
    }
    if (size < 1)
        return 0;
    static struct fz fz;
    memset(&fz, 0, sizeof(fz));
    F = &fz;
    F->cur_reply = -1;
    msgpack_sbuffer_init(&F->sb);
    struct kvb_metrics m;
    memset(&m, 0, sizeof(m));
    struct kvb_pipeline_cfg cfg = {
        .convert = {.worker_id = WORKER, .block_size = 16, .forward_tiers = 1u << KVB_TIER_DEVICE},
        .limits = KVB_DECODE_LIMITS_DEFAULT,
    };
    fuzz_pipeline(&cfg, &m, on_emit, NULL, &F->pub, &F->p);
    struct kvb_seq_ops ops = {NULL, op_apply, op_reject, op_barrier};
    struct kvb_replay_io io = {NULL, op_request, op_cancel};
    struct kvb_replay_cfg rc = {.name = "fuzz",
                                .endpoint = "tcp://engine:1",
                                .timeout_ms = TIMEOUT_MS,
                                .max_payload_bytes = MAX_PAYLOAD,
                                .max_held_msgs = MAX_HELD};
    FUZZ_CHECK(kvb_replay_create(&rc, &m, &ops, &io, &F->r) == 0, "replay_create");
    static const char *names[NSTREAMS] = {"s0", "s1"};
    for (int k = 0; k < NSTREAMS; k++) {
        kvb_stream_init(&F->st[k], names[k], (uint32_t)k);
        F->last_applied[k] = -1;
    }
    if (data[0] & 1)
        F->eng[0].start = 1764500000000000000ull;
    if (data[0] & 2)
        F->eng[0].start = UINT64_MAX - 3;
    for (int k = 0; k < NSTREAMS; k++)
        F->eng[k].next = F->eng[k].start;

    uint64_t now = 1000;
    for (size_t i = 1; i < size; i++) {
        uint8_t op = data[i] & 7, arg = data[i] >> 4;
        int k = (data[i] >> 3) & 1;
        switch (op) {
        case 0: publish(k, true, 0, now); break;
        case 1: publish(k, false, 0, now); break;
        case 2: serve(arg + 1, now); break;
        case 3: F->drop_next = true; break;
        case 4: {
            now += (uint64_t)arg * 100;
            call_done(kvb_replay_tick(F->r, now), "tick");
            /* arg odd: the daemon read nothing for a while and the stream
             * is quiet since: it asks what the engine may have dropped */
            int n = arg & 1 ? kvb_replay_check(F->r, &F->st[k], now) : 0;
            if (n != -EBUSY)
                call_done(n, "check");
            break;
        }
        case 5: {
            /* arg bit 1: a network blip (the connection drops, the engine
             * goes on); else a restart, with the connection dropping (a new
             * process), or (arg bit 0) inside the process: no disconnect,
             * so its first batch must be seen (nothing else could tell) */
            struct engine *e = &F->eng[k];
            bool blip = arg & 2, inproc = !blip && (arg & 1);
            if (inproc && e->start > UINT64_MAX / 2)
                break; /* its seq would not go back: undetectable */
            if (!inproc)
                kvb_replay_peer_reset(F->r, &F->st[k], now);
            F->emitted = 0; /* counted by the checks of the next call */
            if (blip)
                break;
            e->fresh = true;
            e->fresh_inproc = inproc;
            e->inc++;
            e->next = e->start;
            e->n_buf = 0;
            break;
        }
        case 6: publish(k, true, (arg & 1) ? 1 : 2, now); break;
        case 7: F->fail_next = true; break;
        }
    }
    /* drain: the engines answer everything, then time runs out */
    F->drop_next = F->fail_next = false;
    drain(&now);
    for (int i = 0; i < F->nb; i++)
        FUZZ_CHECK(!F->b[i].delivered || F->b[i].applied >= 1,
                   "I4: batch %d (stream %d inc %u seq %llu) delivered live but never applied", i,
                   F->b[i].stream, F->b[i].inc, (unsigned long long)F->b[i].seq);
    for (int k = 0; k < NSTREAMS; k++)
        if (F->last_applied[k] >= 0)
            FUZZ_CHECK(F->st[k].last == F->b[F->last_applied[k]].seq, "I6: stream %d cursor", k);
    /* I7: the engines have gone quiet; a check leaves no loss silent */
    for (int k = 0; k < NSTREAMS; k++) {
        if (F->last_applied[k] < 0 || F->st[k].suspect)
            continue; /* nothing to check, or its next batch proves itself */
        /* a reply that starts later is believed the second time in a row */
        for (int round = 0; round < 2; round++) {
            call_done(kvb_replay_check(F->r, &F->st[k], now), "final check");
            drain(&now);
            if (!F->st[k].check_again)
                break;
        }
        FUZZ_CHECK(!F->st[k].check_again, "I7: stream %d: a third check wanted", k);
        int last = -1;
        for (int i = 0; i < F->nb; i++)
            if (F->b[i].stream == k)
                last = i;
        if (F->eng[k].inc != F->b[F->last_applied[k]].inc)
            continue; /* restarted inside the process since, and quiet: unseen */
        if (last >= 0 && F->b[last].seq < F->b[F->last_applied[k]].seq)
            continue; /* wrapped past 2^64 since: the engine replays seq >= asked,
                       * numerically, and has nothing to say */
        FUZZ_CHECK(last < 0 || F->b[last].applied >= 1 || F->seg[k] != F->b[F->last_applied[k]].seg,
                   "I7: stream %d: seq %llu published, not applied, and no barrier after seq %llu",
                   k, (unsigned long long)F->b[last].seq,
                   (unsigned long long)F->b[F->last_applied[k]].seq);
    }

    kvb_replay_destroy(&F->r);
    kvb_pipeline_destroy(&F->p);
    kvb_publish_destroy(&F->pub);
    msgpack_sbuffer_destroy(&F->sb);
    return 0;
}
