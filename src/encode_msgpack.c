/* encode_msgpack: router events -> Dynamo's event plane.  See
 * include/encode_msgpack.h. */
#include "encode_msgpack.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

/* msgpack-c returns the write callback's result (-1 when the sbuffer cannot
 * grow); every packer below folds them into one. */
#define P(call)                                                                                \
    do {                                                                                       \
        if ((call) != 0)                                                                       \
            return -ENOMEM;                                                                    \
    } while (0)

static int key(msgpack_packer *pk, const char *s, size_t n)
{
    if (msgpack_pack_str(pk, n) != 0 || msgpack_pack_str_body(pk, s, n) != 0)
        return -1;
    return 0;
}
#define KEY(pk, lit) P(key((pk), (lit), sizeof(lit) - 1))

static int str(msgpack_packer *pk, const char *s)
{
    return key(pk, s, strlen(s));
}

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
    default:
        KEY(pk, "cleared");
        return 0;
    }
}

int kvb_mp_pack_rev(msgpack_packer *pk, const struct kvb_rev *r, bool residency_domain)
{
    P(msgpack_pack_map(pk, residency_domain ? 4 : 3));
    KEY(pk, "worker_id");
    P(msgpack_pack_uint64(pk, r->worker_id));
    KEY(pk, "storage_tier");
    P(str(pk, kvb_tier_name(r->tier)));
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
    int rc = kvb_mp_pack_envelope_head(pk, publisher_id, sequence, published_at_ms, topic,
                                       payload_len);
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

struct pair_state {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint64_t publisher_id;
    uint64_t next_seq;
};

struct kvb_mp_batcher {
    struct kvb_mp_batcher_cfg cfg;
    kvb_mp_emit_fn emit;
    void *ctx;
    uint64_t rng;

    struct pair_state *pairs; /* few: linear scan with a last-hit cache */
    size_t n_pairs, cap_pairs, last;

    msgpack_sbuffer evbuf; /* the pending events, packed back to back */
    msgpack_packer evpk;
    msgpack_sbuffer envbuf; /* the message being emitted */
    msgpack_packer envpk;

    bool pending;
    size_t pend_pair; /* index into pairs */
    uint32_t pend_events, pend_blocks;
    uint64_t pend_first_id, pend_last_id;
};

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

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
    msgpack_sbuffer_init(&b->evbuf);
    msgpack_packer_init(&b->evpk, &b->evbuf, msgpack_sbuffer_write);
    msgpack_sbuffer_init(&b->envbuf);
    msgpack_packer_init(&b->envpk, &b->envbuf, msgpack_sbuffer_write);
    *out = b;
    return 0;
}

void kvb_mp_batcher_destroy(struct kvb_mp_batcher **pb)
{
    if (!pb || !*pb)
        return;
    struct kvb_mp_batcher *b = *pb;
    msgpack_sbuffer_destroy(&b->evbuf);
    msgpack_sbuffer_destroy(&b->envbuf);
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
    b->pairs[b->n_pairs] = (struct pair_state){worker, rank, id, 0};
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

int kvb_mp_batcher_set_publisher(struct kvb_mp_batcher *b, uint64_t worker_id,
                                 uint32_t dp_rank, uint64_t publisher_id)
{
    ptrdiff_t i = pair(b, worker_id, dp_rank);
    if (i < 0)
        return -ENOSPC;
    struct pair_state *p = &b->pairs[i];
    if (p->next_seq > 0 || (b->pending && b->pend_pair == (size_t)i))
        return -EEXIST;
    p->publisher_id = publisher_id & KVB_MP_PUBLISHER_MASK;
    return 0;
}

static uint32_t array_header_len(uint32_t n) { return n < 16 ? 1 : n < 65536 ? 3 : 5; }

/* Wrap the pending events into an envelope and hand it to emit. */
static int emit_pending(struct kvb_mp_batcher *b, uint64_t now_ms)
{
    if (!b->pending)
        return 0;
    struct pair_state *p = &b->pairs[b->pend_pair];
    size_t hdr = b->cfg.batch ? array_header_len(b->pend_events) : 0;
    size_t plen = hdr + b->evbuf.size;
    msgpack_sbuffer_clear(&b->envbuf);
    int rc = kvb_mp_pack_envelope_head(&b->envpk, p->publisher_id, p->next_seq, now_ms,
                                       KVB_MP_TOPIC_KV, plen);
    if (rc == 0 && b->cfg.batch && msgpack_pack_array(&b->envpk, b->pend_events) != 0)
        rc = -ENOMEM;
    if (rc == 0 && msgpack_sbuffer_write(&b->envbuf, b->evbuf.data, b->evbuf.size) != 0)
        rc = -ENOMEM;
    struct kvb_mp_msg msg = {
        .worker_id = p->worker_id,
        .dp_rank = p->dp_rank,
        .publisher_id = p->publisher_id,
        .sequence = p->next_seq,
        .n_events = b->pend_events,
        .n_blocks = b->pend_blocks,
        .first_event_id = b->pend_first_id,
        .last_event_id = b->pend_last_id,
        .data = b->envbuf.data,
        .len = b->envbuf.size,
    };
    b->pending = false;
    b->pend_events = b->pend_blocks = 0;
    msgpack_sbuffer_clear(&b->evbuf);
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
    size_t mark = b->evbuf.size;
    if ((rc = kvb_mp_pack_rev(&b->evpk, r, b->cfg.residency_domain)) < 0) {
        b->evbuf.size = mark; /* roll back the partial event */
        return rc;
    }
    if (!b->pending) {
        b->pending = true;
        b->pend_pair = (size_t)i;
        b->pend_first_id = r->event_id;
    }
    b->pend_last_id = r->event_id;
    b->pend_events++;
    b->pend_blocks = (uint32_t)((uint64_t)b->pend_blocks + k > UINT32_MAX
                                    ? UINT32_MAX
                                    : b->pend_blocks + k);
    if (!b->cfg.batch || b->pend_events >= b->cfg.max_events ||
        b->pend_blocks >= b->cfg.max_blocks)
        return emit_pending(b, now_ms);
    return 0;
}
