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

static int store(struct kvb_index *m, uint32_t rank, int tier, bool has_parent, uint64_t parent,
                 const uint64_t *hashes, const uint64_t *tokens, uint32_t n)
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
    int rc = kvb_index_apply(m, &r);
    if (rc == 0)
        next_id++;
    return rc;
}

static void removed(struct kvb_index *m, uint32_t rank, int tier, const uint64_t *h, uint32_t n)
{
    struct kvb_rev r = {.type = KVB_REVT_REMOVED,
                        .tier = (uint8_t)tier,
                        .dp_rank = rank,
                        .worker_id = W,
                        .event_id = next_id++,
                        .hashes = h,
                        .n = n};
    ck_assert_int_eq(kvb_index_apply(m, &r), 0);
}

static void cleared(struct kvb_index *m, uint32_t rank)
{
    struct kvb_rev r = {
        .type = KVB_REVT_CLEARED, .dp_rank = rank, .worker_id = W, .event_id = next_id++};
    ck_assert_int_eq(kvb_index_apply(m, &r), 0);
}

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
            } else {
                cleared(m, rank);
                for (int i = 0; i < ref->n; i++)
                    if (ref->b[i].rank == rank)
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
    /* a cycle: 5000 -> 5001 -> 5000 (a re-store rewrote 5000's parent) */
    h[0] = 5000;
    ck_assert_int_eq(store(m, 0, 0, false, 0, h, t, 1), 0);
    h[0] = 5001;
    ck_assert_int_eq(store(m, 0, 0, true, 5000, h, t, 1), 0);
    h[0] = 5000;
    ck_assert_int_eq(store(m, 0, 0, true, 5001, h, t, 1), 0);
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
    tcase_add_test(tc, random_walk_against_reference);
    tcase_add_test(tc, dump_order_and_cycles);
    tcase_add_test(tc, bytes_per_block);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(mirror_suite()); }
