/* mirror: residency per (worker_id, dp_rank, tier), prefix match, the ring
 * of recent events, dumps; a random walk against a plain reference model. */
#include "testutil.h"

#include <errno.h>

#include "mirror/index.h"

#define W 7u

static uint64_t mix_for_test(uint64_t x) /* splitmix64: spread-out block hashes */
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static struct kvb_index *mk(uint64_t max_blocks, uint32_t recent)
{
    struct kvb_index_cfg cfg = {max_blocks, recent};
    struct kvb_index *m = NULL;
    ck_assert_int_eq(kvb_index_create(&cfg, &m), 0);
    return m;
}

static uint64_t next_id;

/* A store into m, and into `also` (a consumer) when given. */
static int store_also(struct kvb_index *m, struct kvb_index *also, uint32_t rank, int tier,
                      bool has_parent, uint64_t parent, const uint64_t *hashes,
                      const uint64_t *tokens, uint32_t n)
{
    struct kvb_block b[64];
    for (uint32_t i = 0; i < n; i++)
        b[i] = (struct kvb_block){hashes[i], tokens[i]};
    struct kvb_rev r = {.type = KVB_REVT_STORED,
                        .tier = (uint8_t)tier,
                        .dp_rank = rank,
                        .worker_id = W,
                        .event_id = next_id,
                        .has_parent = has_parent,
                        .parent = parent,
                        .blocks = b,
                        .n = n};
    if (also)
        ck_assert_int_eq(kvb_index_apply(also, &r), 0);
    int rc = kvb_index_apply(m, &r);
    if (rc == 0)
        next_id++;
    return rc;
}

static int store(struct kvb_index *m, uint32_t rank, int tier, bool has_parent, uint64_t parent,
                 const uint64_t *hashes, const uint64_t *tokens, uint32_t n)
{
    return store_also(m, NULL, rank, tier, has_parent, parent, hashes, tokens, n);
}

/* A cycle, 5000 -> 5001 -> 5000, on rank 0 tier 0 (a re-store rewrote
 * 5000's parent), every block's tokens_hash tokens. */
static void store_cycle(struct kvb_index *m, uint64_t tokens)
{
    uint64_t h[1] = {5000}, t[1] = {tokens};
    ck_assert_int_eq(store(m, 0, 0, false, 0, h, t, 1), 0);
    h[0] = 5001;
    ck_assert_int_eq(store(m, 0, 0, true, 5000, h, t, 1), 0);
    h[0] = 5000;
    ck_assert_int_eq(store(m, 0, 0, true, 5001, h, t, 1), 0);
}

static void removed_also(struct kvb_index *m, struct kvb_index *also, uint32_t rank, int tier,
                         const uint64_t *h, uint32_t n)
{
    struct kvb_rev r = {.type = KVB_REVT_REMOVED,
                        .tier = (uint8_t)tier,
                        .dp_rank = rank,
                        .worker_id = W,
                        .event_id = next_id++,
                        .hashes = h,
                        .n = n};
    if (also)
        ck_assert_int_eq(kvb_index_apply(also, &r), 0);
    ck_assert_int_eq(kvb_index_apply(m, &r), 0);
}

static void removed(struct kvb_index *m, uint32_t rank, int tier, const uint64_t *h, uint32_t n)
{
    removed_also(m, NULL, rank, tier, h, n);
}

/* A "cleared" of every tier (tier < 0) or of one tier only (scoped). */
static void cleared_tier_also(struct kvb_index *m, struct kvb_index *also, uint32_t rank, int tier)
{
    struct kvb_rev r = {.type = KVB_REVT_CLEARED,
                        .tier = (uint8_t)(tier < 0 ? 0 : tier),
                        .scoped = tier >= 0,
                        .dp_rank = rank,
                        .worker_id = W,
                        .event_id = next_id++};
    if (also)
        ck_assert_int_eq(kvb_index_apply(also, &r), 0);
    ck_assert_int_eq(kvb_index_apply(m, &r), 0);
}

static void cleared_also(struct kvb_index *m, struct kvb_index *also, uint32_t rank)
{
    cleared_tier_also(m, also, rank, -1);
}

static void cleared(struct kvb_index *m, uint32_t rank) { cleared_also(m, NULL, rank); }

START_TEST(store_match_remove)
{
    struct kvb_index *m = mk(1000, 16);
    uint64_t h[3] = {100, 101, 102}, t[3] = {900, 901, 902};
    ck_assert_int_eq(store(m, 0, KVB_TIER_DEVICE, false, 0, h, t, 3), 0);
    uint64_t h2[1] = {103}, t2[1] = {903};
    ck_assert_int_eq(store(m, 0, KVB_TIER_DEVICE, true, 102, h2, t2, 1), 0);
    ck_assert_uint_eq(kvb_index_blocks(m, KVB_TIER_DEVICE), 4);

    uint64_t req[5] = {900, 901, 902, 903, 904};
    uint32_t got[KVB_TIER__COUNT];
    kvb_index_match(m, W, 0, req, 5, got);
    ck_assert_uint_eq(got[KVB_TIER_DEVICE], 4);
    ck_assert_uint_eq(got[KVB_TIER_HOST_PINNED], 0);
    kvb_index_match(m, W, 1, req, 5, got); /* another rank holds nothing */
    ck_assert_uint_eq(got[KVB_TIER_DEVICE], 0);
    uint64_t other[2] = {901, 902}; /* not a prefix: 901 is no root */
    kvb_index_match(m, W, 0, other, 2, got);
    ck_assert_uint_eq(got[KVB_TIER_DEVICE], 0);

    removed(m, 0, KVB_TIER_DEVICE, &h[1], 1); /* the walk stops at the hole */
    kvb_index_match(m, W, 0, req, 5, got);
    ck_assert_uint_eq(got[KVB_TIER_DEVICE], 1);
    ck_assert_uint_eq(kvb_index_blocks(m, KVB_TIER_DEVICE), 3);
    uint64_t unknown = 555;
    removed(m, 0, KVB_TIER_DEVICE, &unknown, 1); /* ignored */
    ck_assert_uint_eq(kvb_index_blocks(m, KVB_TIER_DEVICE), 3);

    /* a store whose parent is not resident is dropped whole */
    uint64_t h3[2] = {200, 201}, t3[2] = {1, 2};
    ck_assert_int_eq(store(m, 0, KVB_TIER_DEVICE, true, 101, h3, t3, 2), 0);
    ck_assert_uint_eq(kvb_index_blocks(m, KVB_TIER_DEVICE), 3);
    ck_assert_uint_eq(kvb_index_orphans(m), 1);
    /* ... and the parent check is per tier */
    ck_assert_int_eq(store(m, 0, KVB_TIER_HOST_PINNED, true, 100, h3, t3, 2), 0);
    ck_assert_uint_eq(kvb_index_blocks(m, KVB_TIER_HOST_PINNED), 0);
    ck_assert_int_eq(store(m, 0, KVB_TIER_HOST_PINNED, false, 0, h3, t3, 2), 0);
    ck_assert_uint_eq(kvb_index_blocks(m, KVB_TIER_HOST_PINNED), 2);

    /* cleared empties every tier of that pair only */
    ck_assert_int_eq(store(m, 1, KVB_TIER_DEVICE, false, 0, h, t, 1), 0);
    cleared(m, 0);
    ck_assert_uint_eq(kvb_index_blocks(m, KVB_TIER_DEVICE), 1);
    ck_assert_uint_eq(kvb_index_blocks(m, KVB_TIER_HOST_PINNED), 0);
    uint64_t last = 0;
    ck_assert(kvb_index_last_event_id(m, W, 0, &last));
    ck_assert_uint_eq(last, next_id - 1);
    ck_assert(!kvb_index_last_event_id(m, W, 9, &last));
    kvb_index_destroy(&m);
    kvb_index_destroy(&m); /* NULL is fine */
}
END_TEST

START_TEST(limit_refuses_whole_store)
{
    struct kvb_index *m = mk(4, 0);
    uint64_t h[3] = {1, 2, 3}, t[3] = {1, 2, 3};
    ck_assert_int_eq(store(m, 0, KVB_TIER_DEVICE, false, 0, h, t, 3), 0);
    uint64_t h2[2] = {4, 5}, t2[2] = {4, 5};
    ck_assert_int_eq(store(m, 0, KVB_TIER_DEVICE, true, 3, h2, t2, 2), -ENOSPC);
    ck_assert_uint_eq(kvb_index_blocks(m, -1), 3); /* nothing of it applied */
    cleared(m, 0);                                 /* the barrier the caller then publishes */
    ck_assert_int_eq(store(m, 0, KVB_TIER_DEVICE, true, 3, h2, t2, 2), 0); /* orphan now */
    ck_assert_int_eq(store(m, 0, KVB_TIER_DEVICE, false, 0, h2, t2, 2), 0);
    ck_assert_uint_eq(kvb_index_blocks(m, -1), 2);
    kvb_index_destroy(&m);
}
END_TEST

/* A refused store was published all the same: it is the pair's last event
 * and a consumer asking for the events after an older id gets it, then the
 * barrier. */
static int count_fn(void *ctx, const struct kvb_rev *r)
{
    uint64_t *ids = ctx;
    ids[++ids[0]] = r->event_id;
    return 0;
}

START_TEST(refused_store_in_ring)
{
    struct kvb_index *m = mk(2, 16);
    uint64_t last = 0;
    struct kvb_block b[3] = {{11, 1}, {12, 2}, {13, 3}};
    struct kvb_rev r = {
        .type = KVB_REVT_STORED, .worker_id = W, .event_id = 40, .blocks = b, .n = 3};
    ck_assert_int_eq(kvb_index_apply(m, &r), -ENOSPC);
    ck_assert(kvb_index_last_event_id(m, W, 0, &last));
    ck_assert_uint_eq(last, 40);
    struct kvb_rev c = {.type = KVB_REVT_CLEARED, .worker_id = W, .event_id = 41};
    ck_assert_int_eq(kvb_index_apply(m, &c), 0);
    uint64_t ids[8] = {0};
    ck_assert_int_eq(kvb_index_events_since(m, W, 0, 39, count_fn, ids), 0);
    ck_assert_uint_eq(ids[0], 2);
    ck_assert_uint_eq(ids[1], 40);
    ck_assert_uint_eq(ids[2], 41);
    ck_assert_uint_eq(kvb_index_blocks(m, -1), 0);
    kvb_index_destroy(&m);
}
END_TEST

struct scoped_seen {
    int n;
    bool scoped[8];
    uint8_t tier[8];
};

static int scoped_fn(void *ctx, const struct kvb_rev *r)
{
    struct scoped_seen *c = ctx;
    ck_assert_int_lt(c->n, 8);
    ck_assert_int_eq(r->type, KVB_REVT_CLEARED);
    c->scoped[c->n] = r->scoped;
    c->tier[c->n++] = r->tier;
    return 0;
}

/* A scoped "cleared" empties one (worker, rank, tier) space: the pair's
 * other tiers and the other ranks keep their blocks; the ring gives the
 * event back with its tier and scoped bit, and so does a ring copy. */
START_TEST(scoped_cleared_one_tier)
{
    next_id = 0;
    struct kvb_index *m = mk(1000, 16);
    uint64_t h[2] = {10, 11}, t[2] = {20, 21};
    ck_assert_int_eq(store(m, 0, KVB_TIER_DEVICE, false, 0, h, t, 2), 0);      /* 0 */
    ck_assert_int_eq(store(m, 0, KVB_TIER_HOST_PINNED, false, 0, h, t, 2), 0); /* 1 */
    ck_assert_int_eq(store(m, 1, KVB_TIER_DEVICE, false, 0, h, t, 2), 0);      /* 2 */
    cleared_tier_also(m, NULL, 0, KVB_TIER_DEVICE);                            /* 3 */
    ck_assert_uint_eq(kvb_index_blocks(m, KVB_TIER_DEVICE), 2);                /* rank 1's */
    ck_assert_uint_eq(kvb_index_blocks(m, KVB_TIER_HOST_PINNED), 2);
    uint32_t k[KVB_TIER__COUNT];
    kvb_index_match(m, W, 0, t, 2, k);
    ck_assert_uint_eq(k[KVB_TIER_DEVICE], 0);
    ck_assert_uint_eq(k[KVB_TIER_HOST_PINNED], 2);
    kvb_index_match(m, W, 1, t, 2, k);
    ck_assert_uint_eq(k[KVB_TIER_DEVICE], 2);
    /* a scoped clear of a tier the pair never had: nothing changes */
    cleared_tier_also(m, NULL, 0, KVB_TIER_DISK); /* 4 */
    ck_assert_uint_eq(kvb_index_blocks(m, KVB_TIER_HOST_PINNED), 2);

    struct kvb_rev got[8];
    int n = 0;
    struct kvb_index_ring *ring = NULL;
    ck_assert_int_eq(kvb_index_ring_copy(m, W, 0, &ring), 0);
    while (n < 8 && kvb_index_ring_next(ring, &got[n]) == 1)
        n++;
    ck_assert_int_eq(n, 4); /* 0, 1, 3, 4 */
    ck_assert_int_eq(got[2].type, KVB_REVT_CLEARED);
    ck_assert(got[2].scoped);
    ck_assert_int_eq(got[2].tier, KVB_TIER_DEVICE);
    ck_assert(got[3].scoped);
    ck_assert_int_eq(got[3].tier, KVB_TIER_DISK);
    ck_assert(!got[0].scoped && !got[1].scoped);
    kvb_index_ring_free(&ring);

    /* then an unscoped one: every tier of the pair */
    cleared(m, 0); /* 5 */
    ck_assert_uint_eq(kvb_index_blocks(m, KVB_TIER_HOST_PINNED), 0);
    ck_assert_uint_eq(kvb_index_blocks(m, KVB_TIER_DEVICE), 2);
    struct scoped_seen seen = {0};
    ck_assert_int_eq(kvb_index_events_from(m, W, 0, 3, scoped_fn, &seen), 0);
    ck_assert_int_eq(seen.n, 3);
    ck_assert(seen.scoped[0] && seen.scoped[1] && !seen.scoped[2]);
    ck_assert_int_eq(seen.tier[1], KVB_TIER_DISK);
    kvb_index_destroy(&m);
    next_id = 0;
}
END_TEST

struct collect {
    uint64_t ids[64];
    int types[64];
    uint32_t n[64];
    uint64_t first_hash[64];
    int count;
};

static int collect_fn(void *ctx, const struct kvb_rev *r)
{
    struct collect *c = ctx;
    ck_assert_int_lt(c->count, 64);
    c->ids[c->count] = r->event_id;
    c->types[c->count] = r->type;
    c->n[c->count] = r->n;
    c->first_hash[c->count] = r->type == KVB_REVT_STORED    ? r->blocks[0].block_hash
                              : r->type == KVB_REVT_REMOVED ? r->hashes[0]
                                                            : 0;
    c->count++;
    return 0;
}

START_TEST(recent_events)
{
    next_id = 50; /* a pair's ids need not start at 0 (resumed counters) */
    struct kvb_index *m = mk(1000, 4);
    struct collect c = {0};
    ck_assert_int_eq(kvb_index_events_since(m, W, 0, 0, collect_fn, &c), -ENOENT);
    uint64_t h[2] = {10, 11}, t[2] = {20, 21};
    ck_assert_int_eq(store(m, 0, KVB_TIER_DEVICE, false, 0, h, t, 2), 0); /* 50 */
    removed(m, 0, KVB_TIER_DEVICE, &h[1], 1);                             /* 51 */
    cleared(m, 0);                                                        /* 52 */
    ck_assert_int_eq(kvb_index_events_since(m, W, 0, 49, collect_fn, &c), 0);
    ck_assert_int_eq(c.count, 3);
    ck_assert_uint_eq(c.ids[0], 50);
    ck_assert_int_eq(c.types[0], KVB_REVT_STORED);
    ck_assert_uint_eq(c.n[0], 2);
    ck_assert_uint_eq(c.first_hash[0], 10);
    ck_assert_int_eq(c.types[1], KVB_REVT_REMOVED);
    ck_assert_uint_eq(c.first_hash[1], 11);
    ck_assert_int_eq(c.types[2], KVB_REVT_CLEARED);
    c.count = 0;
    ck_assert_int_eq(kvb_index_events_since(m, W, 0, 51, collect_fn, &c), 0);
    ck_assert_int_eq(c.count, 1);
    c.count = 0;
    ck_assert_int_eq(kvb_index_events_since(m, W, 0, 52, collect_fn, &c), 0); /* up to date */
    ck_assert_int_eq(c.count, 0);
    ck_assert_int_eq(kvb_index_events_since(m, W, 0, 48, collect_fn, &c), -ESTALE);
    for (int i = 0; i < 3; i++) /* 53..55: 50 and 51 leave the ring of 4 */
        cleared(m, 0);
    ck_assert_int_eq(kvb_index_events_since(m, W, 0, 50, collect_fn, &c), -ESTALE);
    ck_assert_int_eq(kvb_index_events_since(m, W, 0, 51, collect_fn, &c), 0);
    ck_assert_int_eq(c.count, 4);
    ck_assert_uint_eq(c.ids[0], 52);
    ck_assert_uint_eq(c.ids[3], 55);
    kvb_index_destroy(&m);
    next_id = 0;
}
END_TEST

/* ---- random walk against a reference model -------------------------------- */

struct ref_block {
    uint64_t hash, tokens;
    int tier;
    uint32_t rank;
    bool live;
};

struct ref {
    struct ref_block b[4096];
    int n;
};

static struct ref_block *ref_find(struct ref *r, uint32_t rank, int tier, uint64_t h)
{
    for (int i = 0; i < r->n; i++)
        if (r->b[i].live && r->b[i].rank == rank && r->b[i].tier == tier && r->b[i].hash == h)
            return &r->b[i];
    return NULL;
}

static uint32_t rng_state = 12345;
static uint32_t rnd(uint32_t n)
{
    rng_state = rng_state * 1103515245u + 12345u;
    return (rng_state >> 8) % n;
}

/* Apply every line of a dump of m's pair (rank) to a fresh mirror d. */
static void dump_into(struct kvb_index *m, uint32_t rank, struct kvb_index *d, uint32_t chain)
{
    struct kvb_index_snap *s = NULL;
    ck_assert_int_eq(kvb_index_snapshot(m, W, rank, &s), 0);
    struct kvb_rev r;
    uint64_t blocks = 0;
    int rc;
    while ((rc = kvb_index_snap_next(s, chain, &r)) == 1) {
        ck_assert_uint_le(r.n, chain);
        blocks += r.n;
        uint64_t orphans = kvb_index_orphans(d);
        ck_assert_int_eq(kvb_index_apply(d, &r), 0);
        ck_assert_uint_eq(kvb_index_orphans(d), orphans); /* parents before children */
    }
    ck_assert_int_eq(rc, 0);
    ck_assert_uint_eq(blocks, kvb_index_snap_blocks(s));
    kvb_index_snap_free(&s);
}

START_TEST(random_walk_against_reference)
{
    for (int round = 0; round < 20; round++) {
        struct kvb_index *m = mk(100000, 64);
        struct ref *ref = calloc(1, sizeof(*ref));
        for (int op = 0; op < 3000 && ref->n < 4000; op++) {
            uint32_t rank = rnd(2);
            int tier = (int)rnd(2);
            uint32_t k = rnd(100);
            if (k < 55) { /* store a chain of 1..4 under a random resident block or root */
                uint32_t n = 1 + rnd(4);
                uint64_t h[4], t[4];
                for (uint32_t i = 0; i < n; i++) {
                    h[i] = 1 + rnd(300);    /* small domain: overwrites and re-stores */
                    t[i] = 1000 + h[i] * 7; /* a block's tokens follow from its hash */
                }
                bool hp = rnd(3) != 0;
                uint64_t parent = 1 + rnd(300);
                bool ok = !hp || ref_find(ref, rank, tier, parent);
                ck_assert_int_eq(store(m, rank, tier, hp, parent, h, t, n), 0);
                for (uint32_t i = 0; ok && i < n; i++) {
                    struct ref_block *b = ref_find(ref, rank, tier, h[i]);
                    if (!b)
                        ref->b[ref->n++] = (struct ref_block){h[i], t[i], tier, rank, true};
                }
            } else if (k < 95) {
                uint64_t h[3] = {1 + rnd(300), 1 + rnd(300), 1 + rnd(300)};
                removed(m, rank, tier, h, 3);
                for (int i = 0; i < 3; i++) {
                    struct ref_block *b = ref_find(ref, rank, tier, h[i]);
                    if (b)
                        b->live = false;
                }
            } else { /* every tier, or (scoped) only this one */
                bool scoped = rnd(2);
                cleared_tier_also(m, NULL, rank, scoped ? tier : -1);
                for (int i = 0; i < ref->n; i++)
                    if (ref->b[i].rank == rank && (!scoped || ref->b[i].tier == tier))
                        ref->b[i].live = false;
            }
        }
        /* the same set as the reference, in every space */
        uint64_t want[2] = {0, 0};
        for (int i = 0; i < ref->n; i++)
            if (ref->b[i].live)
                want[ref->b[i].tier]++;
        ck_assert_uint_eq(kvb_index_blocks(m, 0), want[0]);
        ck_assert_uint_eq(kvb_index_blocks(m, 1), want[1]);
        /* a dump applied to a fresh mirror gives the same set */
        for (uint32_t rank = 0; rank < 2; rank++) {
            struct kvb_index *d = mk(100000, 0);
            dump_into(m, rank, d, 1 + rnd(5));
            struct kvb_index_snap *s = NULL;
            ck_assert_int_eq(kvb_index_snapshot(d, W, rank, &s), 0);
            struct kvb_rev r;
            uint64_t n = 0;
            while (kvb_index_snap_next(s, 1, &r) == 1) {
                n++;
                struct ref_block *b = ref_find(ref, rank, r.tier, r.blocks[0].block_hash);
                ck_assert_msg(b != NULL, "dumped block %llu is not resident",
                              (unsigned long long)r.blocks[0].block_hash);
                ck_assert_uint_eq(r.blocks[0].tokens_hash, b->tokens);
            }
            uint64_t live = 0;
            for (int i = 0; i < ref->n; i++)
                live += ref->b[i].live && ref->b[i].rank == rank;
            ck_assert_uint_eq(n, live);
            kvb_index_snap_free(&s);
            kvb_index_destroy(&d);
        }
        free(ref);
        kvb_index_destroy(&m);
    }
}
END_TEST

/* A dump of a deep chain with branches: every block once, parents first. */
START_TEST(dump_order_and_cycles)
{
    struct kvb_index *m = mk(100000, 0);
    uint64_t h[1], t[1];
    for (uint64_t i = 1; i <= 1000; i++) { /* a chain 1..1000, and a branch at every 10th */
        h[0] = i;
        t[0] = i;
        ck_assert_int_eq(store(m, 0, 0, i > 1, i - 1, h, t, 1), 0);
        if (i % 10 == 0) {
            h[0] = 100000 + i;
            ck_assert_int_eq(store(m, 0, 0, true, i, h, t, 1), 0);
        }
    }
    store_cycle(m, 1000);
    ck_assert_uint_eq(kvb_index_blocks(m, 0), 1102);
    struct kvb_index *d = mk(100000, 0);
    dump_into(m, 0, d, 64);
    ck_assert_uint_eq(kvb_index_blocks(d, 0), 1102);
    uint64_t req[3] = {1, 2, 3};
    uint32_t got[KVB_TIER__COUNT];
    kvb_index_match(d, W, 0, req, 3, got);
    ck_assert_uint_eq(got[0], 3);
    kvb_index_destroy(&d);
    kvb_index_destroy(&m);
}
END_TEST

/* ---- repairs ---------------------------------------------------------------- */

struct blk {
    int tier;
    uint64_t hash, tokens;
};

static int blk_cmp(const void *a, const void *b)
{
    const struct blk *x = a, *y = b;
    if (x->tier != y->tier)
        return x->tier < y->tier ? -1 : 1;
    if (x->hash != y->hash)
        return x->hash < y->hash ? -1 : 1;
    return x->tokens < y->tokens ? -1 : x->tokens > y->tokens;
}

/* Every resident block of (W, rank), sorted; *n of them (malloc'ed). */
static struct blk *blocks_of(struct kvb_index *m, uint32_t rank, size_t *n)
{
    struct kvb_index_snap *s = NULL;
    ck_assert_int_eq(kvb_index_snapshot(m, W, rank, &s), 0);
    size_t cap = kvb_index_snap_blocks(s) + 1, k = 0;
    struct blk *v = calloc(cap, sizeof(*v));
    struct kvb_rev r;
    while (kvb_index_snap_next(s, 1, &r) == 1)
        v[k++] = (struct blk){r.tier, r.blocks[0].block_hash, r.blocks[0].tokens_hash};
    kvb_index_snap_free(&s);
    qsort(v, k, sizeof(*v), blk_cmp);
    *n = k;
    return v;
}

static void same_blocks(struct kvb_index *a, struct kvb_index *b, uint32_t rank)
{
    size_t na, nb;
    struct blk *va = blocks_of(a, rank, &na), *vb = blocks_of(b, rank, &nb);
    ck_assert_uint_eq(na, nb);
    for (size_t i = 0; i < na; i++) {
        ck_assert_int_eq(va[i].tier, vb[i].tier);
        ck_assert_uint_eq(va[i].hash, vb[i].hash);
        ck_assert_uint_eq(va[i].tokens, vb[i].tokens);
    }
    free(va);
    free(vb);
}

/* The next repair event of m into the consumer c (an index applying it as a
 * router does): its parent, when it names one, is held there.  1 or 0. */
static int repair_into(struct kvb_index *m, struct kvb_index *c, uint32_t max_blocks)
{
    struct kvb_rev r;
    int rc;
    while ((rc = kvb_index_repair_next(m, max_blocks, 7, &r)) == -EAGAIN)
        ;
    ck_assert_int_ge(rc, 0);
    if (rc == 0)
        return 0;
    ck_assert_int_eq(r.type, KVB_REVT_STORED);
    ck_assert_uint_ge(r.n, 1);
    ck_assert_uint_le(r.n, max_blocks);
    r.event_id = next_id++;
    uint64_t orphans = kvb_index_orphans(c);
    ck_assert_int_eq(kvb_index_apply(c, &r), 0);
    ck_assert_uint_eq(kvb_index_orphans(c), orphans); /* parents first */
    r.repair = true;
    ck_assert_int_eq(kvb_index_record(m, &r), 0);
    return 1;
}

/* The repair of a tree: every block once, parents before children, the
 * mirror itself unchanged, the events in its ring. */
START_TEST(repair_publishes_the_tree)
{
    next_id = 0;
    struct kvb_index *m = mk(100000, 64), *c = mk(100000, 0);
    uint64_t h[1], t[1];
    for (uint64_t i = 1; i <= 300; i++) { /* a chain 1..300, a branch at every 10th */
        h[0] = i;
        t[0] = 7 * i;
        ck_assert_int_eq(store(m, 0, 0, i > 1, i - 1, h, t, 1), 0);
        if (i % 10 == 0) {
            h[0] = 100000 + i;
            ck_assert_int_eq(store(m, 0, 0, true, i, h, t, 1), 0);
        }
    }
    h[0] = 9; /* a host tier block and a block whose parent went */
    ck_assert_int_eq(store(m, 0, KVB_TIER_HOST_PINNED, false, 0, h, t, 1), 0);
    uint64_t gone = 100000 + 50;
    h[0] = 100000 + 51;
    ck_assert_int_eq(store(m, 0, 0, true, gone, h, t, 1), 0);
    removed(m, 0, 0, &gone, 1);
    ck_assert_uint_eq(kvb_index_blocks(m, -1), 331);

    ck_assert_int_eq(kvb_index_repair_begin(m, W, 0), 0);
    ck_assert_uint_eq(kvb_index_missing(m, W, 0), 331);
    ck_assert_uint_eq(kvb_index_missing_total(m), 331);
    ck_assert_uint_eq(kvb_index_missing(m, W, 1), 0);
    uint64_t last = 0, before = next_id;
    int events = 0;
    while (repair_into(m, c, 64))
        events++;
    ck_assert_uint_eq(kvb_index_missing_total(m), 0);
    ck_assert_uint_eq(kvb_index_blocks(m, -1), 331); /* its own view: unchanged */
    ck_assert_uint_eq(kvb_index_blocks(c, -1), 331); /* under a gone parent: as a root */
    same_blocks(m, c, 0);
    ck_assert(kvb_index_last_event_id(m, W, 0, &last));
    ck_assert_uint_eq(last, next_id - 1); /* its events are the pair's last */
    ck_assert_int_le(events, 60);         /* chains, not single blocks */
    struct collect col = {0};
    ck_assert_int_eq(kvb_index_events_since(m, W, 0, before - 1, collect_fn, &col), 0);
    ck_assert_int_eq(col.count, events);
    kvb_index_destroy(&c);
    kvb_index_destroy(&m);
}
END_TEST

/* The consumers lost (W, rank): the repair's "cleared" to c, its start in m. */
static void lose(struct kvb_index *m, struct kvb_index *c, uint32_t rank)
{
    struct kvb_rev r = {.type = KVB_REVT_CLEARED,
                        .dp_rank = rank,
                        .worker_id = W,
                        .event_id = next_id++,
                        .repair = true};
    ck_assert_int_eq(kvb_index_apply(c, &r), 0);
    ck_assert_int_eq(kvb_index_repair_begin(m, W, rank), 0);
    ck_assert_int_eq(kvb_index_record(m, &r), 0);
}

/* Live events during a repair, in any order with its own: the consumer
 * (which got the "cleared" and then everything published after it) ends
 * with exactly the mirror's blocks.  A random walk. */
START_TEST(repair_with_live_events)
{
    for (int round = 0; round < 40; round++) {
        next_id = 0;
        struct kvb_index *m = mk(100000, 16), *c = mk(100000, 0);
        for (int phase = 0; phase < 2; phase++) {
            int ops = phase ? 1500 : 400;
            for (int op = 0; op < ops; op++) {
                uint32_t rank = rnd(2);
                int tier = (int)rnd(2);
                uint32_t k = rnd(100);
                if (phase && k < 35) { /* the repair's turn */
                    repair_into(m, c, 1 + rnd(4));
                } else if (k < 70) {
                    uint32_t n = 1 + rnd(4);
                    uint64_t h[4], t[4];
                    for (uint32_t i = 0; i < n; i++) {
                        h[i] = 1 + rnd(200);
                        t[i] = rnd(3) ? 1000 + h[i] * 7 : 5000 + h[i]; /* changed tokens */
                    }
                    bool hp = rnd(4) != 0;
                    ck_assert_int_eq(store_also(m, c, rank, tier, hp, 1 + rnd(200), h, t, n), 0);
                } else if (k < 97) {
                    uint64_t h[2] = {1 + rnd(200), 1 + rnd(200)};
                    removed_also(m, c, rank, tier, h, 2);
                } else if (k < 99 || !phase) {
                    cleared_tier_also(m, c, rank, rnd(2) ? tier : -1);
                } else { /* the consumers lost the pair: a repair (again) */
                    lose(m, c, rank);
                }
            }
            if (!phase) /* the loss: both pairs */
                for (uint32_t rank = 0; rank < 2; rank++)
                    lose(m, c, rank);
        }
        while (repair_into(m, c, 3))
            ;
        ck_assert_uint_eq(kvb_index_missing_total(m), 0);
        same_blocks(m, c, 0);
        same_blocks(m, c, 1);
        kvb_index_destroy(&c);
        kvb_index_destroy(&m);
    }
    next_id = 0;
}
END_TEST

/* A cycle (a re-store rewrote a parent) and a chain longer than an event. */
START_TEST(repair_cycles_and_long_chains)
{
    next_id = 0;
    struct kvb_index *m = mk(100000, 0), *c = mk(100000, 0);
    uint64_t h[1], t[1] = {1};
    store_cycle(m, 1);
    for (uint64_t i = 1; i <= 1000; i++) {
        h[0] = i;
        ck_assert_int_eq(store(m, 0, 0, i > 1, i - 1, h, t, 1), 0);
    }
    ck_assert_int_eq(kvb_index_repair_begin(m, W, 0), 0);
    int events = 0;
    while (repair_into(m, c, 100))
        events++;
    ck_assert_int_eq(events, 11); /* the cycle as one chain from a root, 1000 in 10 */
    same_blocks(m, c, 0);
    kvb_index_destroy(&c);
    kvb_index_destroy(&m);
}
END_TEST

/* Memory per block at the default limit (the figure the docs state). */
START_TEST(bytes_per_block)
{
    struct kvb_index *m = mk(KVB_INDEX_DEFAULT_MAX_BLOCKS, 0);
    uint64_t h[64], t[64];
    uint64_t n = 0;
    while (n + 64 <= KVB_INDEX_DEFAULT_MAX_BLOCKS) {
        for (int i = 0; i < 64; i++) {
            h[i] = mix_for_test(n + (uint64_t)i);
            t[i] = n + (uint64_t)i;
        }
        ck_assert_int_eq(store(m, 0, 0, false, 0, h, t, 64), 0);
        n += 64;
    }
    ck_assert_uint_eq(kvb_index_blocks(m, 0), n);
    double per = (double)kvb_index_bytes(m) / (double)n;
    printf("mirror: %llu blocks, %llu bytes, %.1f bytes/block\n", (unsigned long long)n,
           (unsigned long long)kvb_index_bytes(m), per);
    ck_assert_double_le(per, 50.0);
    kvb_index_destroy(&m);
}
END_TEST

static Suite *mirror_suite(void)
{
    Suite *s = suite_create("mirror");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, store_match_remove);
    tcase_add_test(tc, limit_refuses_whole_store);
    tcase_add_test(tc, refused_store_in_ring);
    tcase_add_test(tc, recent_events);
    tcase_add_test(tc, scoped_cleared_one_tier);
    tcase_add_test(tc, random_walk_against_reference);
    tcase_add_test(tc, dump_order_and_cycles);
    tcase_add_test(tc, repair_publishes_the_tree);
    tcase_add_test(tc, repair_with_live_events);
    tcase_add_test(tc, repair_cycles_and_long_chains);
    tcase_add_test(tc, bytes_per_block);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(mirror_suite()); }
