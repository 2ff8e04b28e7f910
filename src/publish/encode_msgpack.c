/* encode_msgpack: router events -> Dynamo's event plane.  See
 * include/encode_msgpack.h. */
#include "encode_msgpack.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "mix.h"

/* msgpack-c returns the write callback's result (-1 when the sbuffer cannot
 * grow); every packer below folds them into one. */
#define P(call)             \
    do {                    \
        if ((call) != 0)    \
            return -ENOMEM; \
    } while (0)

static int key(msgpack_packer *pk, const char *s, size_t n)
{
    if (msgpack_pack_str(pk, n) != 0 || msgpack_pack_str_body(pk, s, n) != 0)
        return -1;
    return 0;
}
#define KEY(pk, lit) P(key((pk), (lit), sizeof(lit) - 1))

static int str(msgpack_packer *pk, const char *s) { return key(pk, s, strlen(s)); }

/* ---- packers ------------------------------------------------------------ */

static int pack_mm_extra_info(msgpack_packer *pk, const struct kvb_rev *r, uint32_t i)
{
    if (!r->n_mm || r->mm_off[i + 1] == r->mm_off[i]) {
        P(msgpack_pack_nil(pk));
        return 0;
    }
    P(msgpack_pack_map(pk, 1));
    KEY(pk, "mm_objects");
    P(msgpack_pack_array(pk, r->mm_off[i + 1] - r->mm_off[i]));
    for (uint32_t k = r->mm_off[i]; k < r->mm_off[i + 1]; k++) {
        P(msgpack_pack_map(pk, 2));
        KEY(pk, "mm_hash");
        P(msgpack_pack_uint64(pk, r->mm_hashes[k]));
        KEY(pk, "offsets");
        P(msgpack_pack_array(pk, 0));
    }
    return 0;
}

static int pack_data(msgpack_packer *pk, const struct kvb_rev *r)
{
    switch (r->type) {
    case KVB_REVT_STORED:
        P(msgpack_pack_map(pk, 1));
        KEY(pk, "stored");
        P(msgpack_pack_map(pk, 3));
        KEY(pk, "parent_hash");
        P(r->has_parent ? msgpack_pack_uint64(pk, r->parent) : msgpack_pack_nil(pk));
        KEY(pk, "start_position");
        P(msgpack_pack_nil(pk));
        KEY(pk, "blocks");
        P(msgpack_pack_array(pk, r->n));
        for (uint32_t i = 0; i < r->n; i++) {
            P(msgpack_pack_map(pk, 3));
            KEY(pk, "block_hash");
            P(msgpack_pack_uint64(pk, r->blocks[i].block_hash));
            KEY(pk, "tokens_hash");
            P(msgpack_pack_uint64(pk, r->blocks[i].tokens_hash));
            KEY(pk, "mm_extra_info");
            if (pack_mm_extra_info(pk, r, i) < 0)
                return -ENOMEM;
        }
        return 0;
    case KVB_REVT_REMOVED:
        P(msgpack_pack_map(pk, 1));
        KEY(pk, "removed");
        P(msgpack_pack_map(pk, 1));
        KEY(pk, "block_hashes");
        P(msgpack_pack_array(pk, r->n));
        for (uint32_t i = 0; i < r->n; i++)
            P(msgpack_pack_uint64(pk, r->hashes[i]));
        return 0;
    default: KEY(pk, "cleared"); return 0;
    }
}

/* The storage_tier a router event is written with: a scoped "cleared" its
 * tier, an unscoped one "device" (Dynamo's AllBlocksCleared: every tier),
 * any other event its tier. */
static unsigned wire_tier(const struct kvb_rev *r)
{
    return r->type == KVB_REVT_CLEARED && !r->scoped ? KVB_TIER_DEVICE : r->tier;
}

int kvb_mp_pack_rev(msgpack_packer *pk, const struct kvb_rev *r, bool residency_domain)
{
    P(msgpack_pack_map(pk, residency_domain ? 4 : 3));
    KEY(pk, "worker_id");
    P(msgpack_pack_uint64(pk, r->worker_id));
    KEY(pk, "storage_tier");
    P(str(pk, kvb_tier_name(wire_tier(r))));
    if (residency_domain) {
        KEY(pk, "residency_domain");
        KEY(pk, "worker");
    }
    KEY(pk, "event");
    P(msgpack_pack_map(pk, 3));
    KEY(pk, "event_id");
    P(msgpack_pack_uint64(pk, r->event_id));
    KEY(pk, "data");
    if (pack_data(pk, r) < 0)
        return -ENOMEM;
    KEY(pk, "dp_rank");
    P(msgpack_pack_uint32(pk, r->dp_rank));
    return 0;
}

int kvb_mp_pack_envelope_head(msgpack_packer *pk, uint64_t publisher_id, uint64_t sequence,
                              uint64_t published_at_ms, const char *topic, size_t payload_len)
{
    if (payload_len > UINT32_MAX)
        return -EMSGSIZE;
    P(msgpack_pack_map(pk, 5));
    KEY(pk, "publisher_id");
    P(msgpack_pack_uint64(pk, publisher_id));
    KEY(pk, "sequence");
    P(msgpack_pack_uint64(pk, sequence));
    KEY(pk, "published_at");
    P(msgpack_pack_uint64(pk, published_at_ms));
    KEY(pk, "topic");
    P(str(pk, topic));
    KEY(pk, "payload");
    P(msgpack_pack_bin(pk, payload_len)); /* bin8/16/32, the smallest */
    return 0;
}

int kvb_mp_pack_envelope(msgpack_packer *pk, uint64_t publisher_id, uint64_t sequence,
                         uint64_t published_at_ms, const char *topic, const void *payload,
                         size_t payload_len)
{
    int rc =
        kvb_mp_pack_envelope_head(pk, publisher_id, sequence, published_at_ms, topic, payload_len);
    if (rc < 0)
        return rc;
    P(msgpack_pack_bin_body(pk, payload, payload_len));
    return 0;
}

static int opt_u64(msgpack_packer *pk, bool has, uint64_t v)
{
    return has ? msgpack_pack_uint64(pk, v) : msgpack_pack_nil(pk);
}

int kvb_mp_pack_active_load(msgpack_packer *pk, const struct kvb_active_load *l)
{
    if (!l->has_decode_blocks && !l->has_kv_used_blocks)
        return -EINVAL;
    P(msgpack_pack_map(pk, 6));
    KEY(pk, "worker_id");
    P(msgpack_pack_uint64(pk, l->worker_id));
    KEY(pk, "dp_rank");
    P(msgpack_pack_uint32(pk, l->dp_rank));
    KEY(pk, "active_decode_blocks");
    P(opt_u64(pk, l->has_decode_blocks, l->active_decode_blocks));
    KEY(pk, "active_prefill_tokens");
    P(opt_u64(pk, l->has_prefill_tokens, l->active_prefill_tokens));
    KEY(pk, "scheduler_load_scope");
    P(msgpack_pack_nil(pk));
    KEY(pk, "kv_used_blocks");
    P(opt_u64(pk, l->has_kv_used_blocks, l->kv_used_blocks));
    return 0;
}

/* ---- batcher ------------------------------------------------------------ */

/* The batcher's output side.  Every byte is still msgpack-c's packer output:
 *   - the constant runs of keys (and the fixed values between them) are
 *     packed once, with msgpack-c, when the batcher is created (struct runs)
 *     and appended as they are;
 *   - the variable values (ids, hashes, array and bin headers, multimodal
 *     objects) are packed per event by msgpack-c's packer, whose write
 *     callback (buf_write) appends to one reusable buffer;
 *   - the pending events are packed after HEAD_ROOM bytes left free at the
 *     front of that buffer: the envelope head (and the payload's array
 *     header) is packed into that room when the message is cut, so the
 *     message is emitted from where its events already are, never copied.
 * check_encode_msgpack.c holds this byte for byte to kvb_mp_pack_rev() and
 * kvb_mp_pack_envelope_head(), the straightforward packers above. */

struct mp_buf {
    char *data;
    size_t size, cap;
};

/* the envelope head: map5 + 5 keys (55 B) + 3 uint64 (27) + "kv-events"
 * (10) + bin32 header (5), then the payload's array32 header (5): 102 */
#define HEAD_ROOM 128u

static int buf_grow(struct mp_buf *b, size_t need)
{
    size_t cap = b->cap ? b->cap : 4096;
    while (cap - b->size < need) {
        if (cap > SIZE_MAX / 2)
            return -1;
        cap *= 2;
    }
    char *n = realloc(b->data, cap);
    if (!n)
        return -1;
    b->data = n;
    b->cap = cap;
    return 0;
}

/* msgpack_packer's write callback: msgpack-c hands over each piece (1, 2,
 * 3, 5 or 9 bytes for headers and integers); the fixed sizes are inline
 * copies, not calls to memcpy. */
static int buf_write(void *data, const char *s, size_t len)
{
    struct mp_buf *b = data;
    if (b->cap - b->size < len && buf_grow(b, len) < 0)
        return -1;
    char *d = b->data + b->size;
    switch (len) {
    case 1: d[0] = s[0]; break;
    case 2: memcpy(d, s, 2); break;
    case 3: memcpy(d, s, 3); break;
    case 5: memcpy(d, s, 5); break;
    case 9: memcpy(d, s, 9); break;
    default: memcpy(d, s, len); break;
    }
    b->size += len;
    return 0;
}

/* The envelope head's packer target: a fixed array (HEAD_ROOM bytes). */
struct head_buf {
    char b[HEAD_ROOM];
    size_t n;
};

static int head_write(void *data, const char *s, size_t len)
{
    struct head_buf *h = data;
    if (len > sizeof(h->b) - h->n)
        return -1;
    memcpy(h->b + h->n, s, len);
    h->n += len;
    return 0;
}

/* The pre-packed constant runs (offsets into struct runs .bytes). */
enum run_id {
    R_HEAD,                                 /* map4|map3, "worker_id" */
    R_MID,                                  /* + tier: "storage_tier" <tier> ["residency_domain"
                                      "worker"] "event" map3 "event_id"; one per tier,
                                      the last one for a tier out of range ("device") */
    R_STORED = R_MID + KVB_TIER__COUNT + 1, /* "data" map1 "stored" map3 "parent_hash" */
    R_STORED_B,                             /* "start_position" nil "blocks" */
    R_BLK_A,                                /* map3 "block_hash" */
    R_BLK_B,                                /* "tokens_hash" */
    R_BLK_C,                                /* "mm_extra_info" */
    R_BLK_C_NIL,                            /* "mm_extra_info" nil */
    R_REMOVED,                              /* "data" map1 "removed" map1 "block_hashes" */
    R_CLEARED,                              /* "data" "cleared" */
    R_TAIL,                                 /* "dp_rank" */
    R_ENV_A,                                /* map5 "publisher_id" */
    R_ENV_B,                                /* "sequence" */
    R_ENV_C,                                /* "published_at" */
    R_ENV_D,                                /* "topic" "kv-events" "payload" */
    R__COUNT
};

#define RUN_MAX 32u /* the longest run (R_REMOVED) is 28 bytes */

struct runs {
    char bytes[1024];
    uint16_t off[R__COUNT], len[R__COUNT];
};

/* Pack the runs with msgpack-c into r->bytes. */
static int build_runs(struct runs *r, bool residency_domain)
{
    struct head_buf tmp; /* reused per run */
    msgpack_packer pk;
    msgpack_packer_init(&pk, &tmp, head_write);
    size_t used = 0;
    for (int id = 0; id < R__COUNT; id++) {
        tmp.n = 0;
        switch (id) {
        case R_HEAD:
            P(msgpack_pack_map(&pk, residency_domain ? 4 : 3));
            KEY(&pk, "worker_id");
            break;
        case R_STORED:
            KEY(&pk, "data");
            P(msgpack_pack_map(&pk, 1));
            KEY(&pk, "stored");
            P(msgpack_pack_map(&pk, 3));
            KEY(&pk, "parent_hash");
            break;
        case R_STORED_B:
            KEY(&pk, "start_position");
            P(msgpack_pack_nil(&pk));
            KEY(&pk, "blocks");
            break;
        case R_BLK_A:
            P(msgpack_pack_map(&pk, 3));
            KEY(&pk, "block_hash");
            break;
        case R_BLK_B: KEY(&pk, "tokens_hash"); break;
        case R_BLK_C: KEY(&pk, "mm_extra_info"); break;
        case R_BLK_C_NIL:
            KEY(&pk, "mm_extra_info");
            P(msgpack_pack_nil(&pk));
            break;
        case R_REMOVED:
            KEY(&pk, "data");
            P(msgpack_pack_map(&pk, 1));
            KEY(&pk, "removed");
            P(msgpack_pack_map(&pk, 1));
            KEY(&pk, "block_hashes");
            break;
        case R_CLEARED:
            KEY(&pk, "data");
            KEY(&pk, "cleared");
            break;
        case R_TAIL: KEY(&pk, "dp_rank"); break;
        case R_ENV_A:
            P(msgpack_pack_map(&pk, 5));
            KEY(&pk, "publisher_id");
            break;
        case R_ENV_B: KEY(&pk, "sequence"); break;
        case R_ENV_C: KEY(&pk, "published_at"); break;
        case R_ENV_D:
            KEY(&pk, "topic");
            P(str(&pk, KVB_MP_TOPIC_KV));
            KEY(&pk, "payload");
            break;
        default: /* R_MID + tier */
            KEY(&pk, "storage_tier");
            P(str(&pk, kvb_tier_name(id - R_MID)));
            if (residency_domain) {
                KEY(&pk, "residency_domain");
                KEY(&pk, "worker");
            }
            KEY(&pk, "event");
            P(msgpack_pack_map(&pk, 3));
            KEY(&pk, "event_id");
            break;
        }
        /* append_run() copies RUN_MAX bytes of the runs it appends */
        if ((id >= R_STORED && id <= R_TAIL && tmp.n > RUN_MAX) ||
            tmp.n + RUN_MAX > sizeof(r->bytes) - used)
            return -ENOMEM;
        memcpy(r->bytes + used, tmp.b, tmp.n);
        r->off[id] = (uint16_t)used;
        r->len[id] = (uint16_t)tmp.n;
        used += tmp.n;
    }
    return 0;
}

/* Per pair, what every event and message of the pair starts or ends with,
 * packed by msgpack-c when first needed: pre = R_HEAD <worker_id>
 * R_MID[pre_tier] (<= 11 + 9 + 65 bytes), tail = "dp_rank" <dp_rank>
 * (<= 13), env = R_ENV_A <publisher_id> R_ENV_B (<= 32). */
#define PRE_MAX 96u
#define TAIL_MAX 16u
#define ENV_MAX 40u
#define PRE_NONE 0xffu

struct pair_state {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint64_t publisher_id;
    uint64_t next_seq;
    uint8_t pre_tier, pre_len, tail_len, env_len; /* 0 / PRE_NONE: not packed yet */
    char pre[PRE_MAX], tail[TAIL_MAX], env[ENV_MAX];
};

struct kvb_mp_batcher {
    struct kvb_mp_batcher_cfg cfg;
    kvb_mp_emit_fn emit;
    void *ctx;
    uint64_t rng;

    struct pair_state *pairs; /* few: linear scan with a last-hit cache */
    size_t n_pairs, cap_pairs, last;

    struct mp_buf ev;  /* HEAD_ROOM free bytes, then the pending events */
    msgpack_packer pk; /* writes to ev */
    struct runs runs;

    bool pending;
    size_t pend_pair; /* index into pairs */
    uint32_t pend_events, pend_blocks;
    uint64_t pend_first_id, pend_last_id;
};

static uint64_t splitmix64(uint64_t *s) { return kvb_mix64(*s += UINT64_C(0x9e3779b97f4a7c15)); }

int kvb_mp_batcher_create(const struct kvb_mp_batcher_cfg *cfg, kvb_mp_emit_fn emit, void *ctx,
                          struct kvb_mp_batcher **out)
{
    if (!emit)
        return -EINVAL;
    struct kvb_mp_batcher *b = calloc(1, sizeof(*b));
    if (!b)
        return -ENOMEM;
    b->cfg = *cfg;
    if (!b->cfg.max_events)
        b->cfg.max_events = KVB_MP_BATCH_EVENTS;
    if (!b->cfg.max_blocks)
        b->cfg.max_blocks = KVB_MP_BATCH_BLOCKS;
    b->emit = emit;
    b->ctx = ctx;
    b->rng = cfg->seed;
    if (build_runs(&b->runs, b->cfg.residency_domain) < 0 || buf_grow(&b->ev, HEAD_ROOM) < 0) {
        kvb_mp_batcher_destroy(&b);
        return -ENOMEM;
    }
    b->ev.size = HEAD_ROOM;
    msgpack_packer_init(&b->pk, &b->ev, buf_write);
    *out = b;
    return 0;
}

void kvb_mp_batcher_destroy(struct kvb_mp_batcher **pb)
{
    if (!pb || !*pb)
        return;
    struct kvb_mp_batcher *b = *pb;
    free(b->ev.data);
    free(b->pairs);
    free(b);
    *pb = NULL;
}

bool kvb_mp_batcher_pending(const struct kvb_mp_batcher *b) { return b->pending; }

static bool publisher_taken(const struct kvb_mp_batcher *b, uint64_t id)
{
    for (size_t i = 0; i < b->n_pairs; i++)
        if (b->pairs[i].publisher_id == id)
            return true;
    return false;
}

/* The pair's state, created (with a fresh publisher_id) when new; -1 when
 * the table is full or cannot grow. */
static ptrdiff_t pair(struct kvb_mp_batcher *b, uint64_t worker, uint32_t rank)
{
    if (b->last < b->n_pairs && b->pairs[b->last].worker_id == worker &&
        b->pairs[b->last].dp_rank == rank)
        return (ptrdiff_t)b->last;
    for (size_t i = 0; i < b->n_pairs; i++) {
        if (b->pairs[i].worker_id == worker && b->pairs[i].dp_rank == rank) {
            b->last = i;
            return (ptrdiff_t)i;
        }
    }
    if (b->n_pairs >= KVB_MAX_ID_COUNTERS)
        return -1;
    if (b->n_pairs == b->cap_pairs) {
        size_t cap = b->cap_pairs ? b->cap_pairs * 2 : 8;
        struct pair_state *n = realloc(b->pairs, cap * sizeof(*n));
        if (!n)
            return -1;
        b->pairs = n;
        b->cap_pairs = cap;
    }
    uint64_t id;
    do
        id = splitmix64(&b->rng) & KVB_MP_PUBLISHER_MASK;
    while (id == 0 || publisher_taken(b, id));
    b->pairs[b->n_pairs] = (struct pair_state){worker, rank, id, 0, .pre_tier = PRE_NONE};
    b->last = b->n_pairs++;
    return (ptrdiff_t)b->last;
}

int kvb_mp_batcher_publisher(struct kvb_mp_batcher *b, uint64_t worker_id, uint32_t dp_rank,
                             uint64_t *publisher_id)
{
    ptrdiff_t i = pair(b, worker_id, dp_rank);
    if (i < 0)
        return -ENOSPC;
    *publisher_id = b->pairs[i].publisher_id;
    return 0;
}

int kvb_mp_batcher_set_publisher(struct kvb_mp_batcher *b, uint64_t worker_id, uint32_t dp_rank,
                                 uint64_t publisher_id)
{
    ptrdiff_t i = pair(b, worker_id, dp_rank);
    if (i < 0)
        return -ENOSPC;
    struct pair_state *p = &b->pairs[i];
    if (p->next_seq > 0 || (b->pending && b->pend_pair == (size_t)i))
        return -EEXIST;
    p->publisher_id = publisher_id & KVB_MP_PUBLISHER_MASK;
    p->env_len = 0; /* packed again with the new id */
    return 0;
}

/* Append a run or a pair's cached bytes.  pack_event() reserved room for
 * the event plus SLACK: the copies are fixed-size (inline moves, no call to
 * memcpy), they may write past the bytes that count, which the next
 * pieces overwrite. */
#define SLACK 512u
#define COPY_FIXED(b, src, fixed, n)                         \
    do {                                                     \
        memcpy((b)->ev.data + (b)->ev.size, (src), (fixed)); \
        (b)->ev.size += (n);                                 \
    } while (0)

static inline void append_run(struct kvb_mp_batcher *b, int id)
{
    COPY_FIXED(b, b->runs.bytes + b->runs.off[id], RUN_MAX, b->runs.len[id]);
}

/* Bytes one event can take at most, besides SLACK (which covers the runs,
 * the cached prefix and tail and the scalar values): per stored block map3
 * + 3 keys + 2 uint64 (57) or per removed hash a uint64 (9), and the
 * multimodal objects (27 each) with their headers. */
static size_t event_bound(const struct kvb_rev *r)
{
    size_t n = SLACK + (size_t)r->n * 64;
    if (r->type == KVB_REVT_STORED && r->n_mm)
        n += (size_t)r->n * 24 + (size_t)r->n_mm * 32;
    return n;
}

/* Pack a pair's cached pieces (struct pair_state) with msgpack-c. */
static int pack_cached(struct kvb_mp_batcher *b, char *dst, size_t max, uint8_t *len, int run_a,
                       uint64_t v, int run_b)
{
    struct head_buf h = {.n = 0};
    msgpack_packer pk;
    msgpack_packer_init(&pk, &h, head_write);
    P(head_write(&h, b->runs.bytes + b->runs.off[run_a], b->runs.len[run_a]));
    P(msgpack_pack_uint64(&pk, v));
    if (run_b >= 0)
        P(head_write(&h, b->runs.bytes + b->runs.off[run_b], b->runs.len[run_b]));
    if (h.n > max)
        return -ENOMEM;
    memcpy(dst, h.b, h.n);
    *len = (uint8_t)h.n;
    return 0;
}

static int pack_pair_pieces(struct kvb_mp_batcher *b, struct pair_state *p, unsigned tier)
{
    if (p->pre_tier != tier) {
        P(pack_cached(b, p->pre, sizeof(p->pre), &p->pre_len, R_HEAD, p->worker_id,
                      R_MID + (int)tier));
        p->pre_tier = (uint8_t)tier;
    }
    if (!p->tail_len)
        P(pack_cached(b, p->tail, sizeof(p->tail), &p->tail_len, R_TAIL, p->dp_rank, -1));
    return 0;
}

/* One RouterEvent of pair p appended to b->ev: kvb_mp_pack_rev()'s bytes,
 * from the pre-packed runs, the pair's cached pieces and msgpack-c's
 * packer.  0 or -ENOMEM. */
static int pack_event(struct kvb_mp_batcher *b, struct pair_state *p, const struct kvb_rev *r)
{
    msgpack_packer *pk = &b->pk;
    unsigned tier = wire_tier(r) < KVB_TIER__COUNT ? wire_tier(r) : KVB_TIER__COUNT;
    if (p->pre_tier != tier || !p->tail_len)
        P(pack_pair_pieces(b, p, tier));
    if (b->ev.cap - b->ev.size < event_bound(r) && buf_grow(&b->ev, event_bound(r)) < 0)
        return -ENOMEM;
    COPY_FIXED(b, p->pre, PRE_MAX, p->pre_len);
    P(msgpack_pack_uint64(pk, r->event_id));
    switch (r->type) {
    case KVB_REVT_STORED:
        append_run(b, R_STORED);
        P(r->has_parent ? msgpack_pack_uint64(pk, r->parent) : msgpack_pack_nil(pk));
        append_run(b, R_STORED_B);
        P(msgpack_pack_array(pk, r->n));
        for (uint32_t i = 0; i < r->n; i++) {
            if (b->ev.cap - b->ev.size < SLACK && buf_grow(&b->ev, SLACK) < 0)
                return -ENOMEM; /* a multimodal block took more than its share */
            append_run(b, R_BLK_A);
            P(msgpack_pack_uint64(pk, r->blocks[i].block_hash));
            append_run(b, R_BLK_B);
            P(msgpack_pack_uint64(pk, r->blocks[i].tokens_hash));
            if (!r->n_mm || r->mm_off[i + 1] == r->mm_off[i]) {
                append_run(b, R_BLK_C_NIL);
                continue;
            }
            append_run(b, R_BLK_C);
            if (pack_mm_extra_info(pk, r, i) < 0)
                return -ENOMEM;
        }
        break;
    case KVB_REVT_REMOVED:
        append_run(b, R_REMOVED);
        P(msgpack_pack_array(pk, r->n));
        for (uint32_t i = 0; i < r->n; i++)
            P(msgpack_pack_uint64(pk, r->hashes[i]));
        break;
    default: append_run(b, R_CLEARED); break;
    }
    if (b->ev.cap - b->ev.size < TAIL_MAX && buf_grow(&b->ev, TAIL_MAX) < 0)
        return -ENOMEM;
    COPY_FIXED(b, p->tail, TAIL_MAX, p->tail_len);
    return 0;
}

/* The envelope head (and the payload's array header when batching) as
 * kvb_mp_pack_envelope_head() packs it, into h. */
static int pack_head(struct kvb_mp_batcher *b, struct head_buf *h, struct pair_state *p,
                     uint64_t now_ms, size_t events_len)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, h, head_write);
    h->n = 0;
    if (!p->env_len)
        P(pack_cached(b, p->env, sizeof(p->env), &p->env_len, R_ENV_A, p->publisher_id, R_ENV_B));
    size_t arr = 0;
    if (b->cfg.batch) /* the array header, packed apart to learn its length */
        arr = b->pend_events < 16 ? 1 : b->pend_events < 65536 ? 3 : 5;
    if (events_len + arr > UINT32_MAX)
        return -EMSGSIZE;
#define RUN(id) P(head_write(h, b->runs.bytes + b->runs.off[id], b->runs.len[id]))
    P(head_write(h, p->env, p->env_len));
    P(msgpack_pack_uint64(&pk, p->next_seq));
    RUN(R_ENV_C);
    P(msgpack_pack_uint64(&pk, now_ms));
    RUN(R_ENV_D);
#undef RUN
    P(msgpack_pack_bin(&pk, events_len + arr));
    if (b->cfg.batch)
        P(msgpack_pack_array(&pk, b->pend_events));
    return 0;
}

/* Wrap the pending events into an envelope and hand it to emit. */
static int emit_pending(struct kvb_mp_batcher *b, uint64_t now_ms)
{
    if (!b->pending)
        return 0;
    struct pair_state *p = &b->pairs[b->pend_pair];
    struct head_buf h;
    int rc = pack_head(b, &h, p, now_ms, b->ev.size - HEAD_ROOM);
    char *start = b->ev.data + HEAD_ROOM - h.n;
    if (rc == 0)
        memcpy(start, h.b, h.n); /* right in front of the events */
    struct kvb_mp_msg msg = {
        .worker_id = p->worker_id,
        .dp_rank = p->dp_rank,
        .publisher_id = p->publisher_id,
        .sequence = p->next_seq,
        .n_events = b->pend_events,
        .n_blocks = b->pend_blocks,
        .first_event_id = b->pend_first_id,
        .last_event_id = b->pend_last_id,
        .data = start,
        .len = b->ev.size - (HEAD_ROOM - h.n),
    };
    b->pending = false;
    b->pend_events = b->pend_blocks = 0;
    b->ev.size = HEAD_ROOM; /* the bytes stay valid during the callback */
    if (rc < 0)
        return rc; /* nothing went out: the sequence number stays free */
    p->next_seq++;
    return b->emit(b->ctx, &msg);
}

int kvb_mp_batcher_flush(struct kvb_mp_batcher *b, uint64_t now_ms)
{
    return emit_pending(b, now_ms);
}

int kvb_mp_batcher_add(struct kvb_mp_batcher *b, const struct kvb_rev *r, uint64_t now_ms)
{
    uint32_t k = r->type == KVB_REVT_CLEARED ? 0 : r->n;
    int rc;
    if (b->pending) {
        const struct pair_state *p = &b->pairs[b->pend_pair];
        if (p->worker_id != r->worker_id || p->dp_rank != r->dp_rank ||
            b->pend_events + 1 > b->cfg.max_events ||
            (uint64_t)b->pend_blocks + k > b->cfg.max_blocks) {
            if ((rc = emit_pending(b, now_ms)) < 0)
                return rc;
        }
    }
    ptrdiff_t i = pair(b, r->worker_id, r->dp_rank);
    if (i < 0)
        return -ENOSPC;
    size_t mark = b->ev.size;
    if ((rc = pack_event(b, &b->pairs[i], r)) < 0) {
        b->ev.size = mark; /* roll back the partial event */
        return rc;
    }
    if (!b->pending) {
        b->pending = true;
        b->pend_pair = (size_t)i;
        b->pend_first_id = r->event_id;
    }
    b->pend_last_id = r->event_id;
    b->pend_events++;
    b->pend_blocks =
        (uint32_t)((uint64_t)b->pend_blocks + k > UINT32_MAX ? UINT32_MAX : b->pend_blocks + k);
    if (!b->cfg.batch || b->pend_events >= b->cfg.max_events || b->pend_blocks >= b->cfg.max_blocks)
        return emit_pending(b, now_ms);
    return 0;
}
