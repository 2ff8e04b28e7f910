/* coalesce: which adjacent router events merge (Dynamo's publisher rule,
 * lib/llm/src/kv_router/publisher/batching.rs) and which do not, the 128
 * block cut, and Dynamo's flaw left out: a root store after an empty store
 * is never published under that store's parent. */
#include <check.h>

#include "testutil.h"
#include <string.h>

#include "coalesce.h"

static struct kvb_block blk[300];
static uint64_t hs[300];

static struct kvb_rev store(bool has_parent, uint64_t parent, uint32_t first, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        blk[first + i] = (struct kvb_block){1000 + first + i, 5000 + first + i};
    return (struct kvb_rev){.type = KVB_REVT_STORED,
                            .worker_id = 7,
                            .has_parent = has_parent,
                            .parent = parent,
                            .blocks = blk + first,
                            .n = n};
}

static struct kvb_rev removed(uint32_t first, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        hs[first + i] = 9000 + first + i;
    return (struct kvb_rev){.type = KVB_REVT_REMOVED, .worker_id = 7, .hashes = hs + first, .n = n};
}

START_TEST(chained_stores_merge)
{
    struct kvb_coalesce c;
    kvb_coalesce_init(&c);
    struct kvb_rev a = store(false, 0, 0, 2), b = store(true, 1001, 2, 3);
    ck_assert_int_eq(kvb_coalesce_hold(&c, &a), 0);
    ck_assert(kvb_coalesce_can_join(&c, &b));
    ck_assert_int_eq(kvb_coalesce_join(&c, &b), 0);
    const struct kvb_rev *p = kvb_coalesce_take(&c);
    ck_assert_ptr_nonnull(p);
    ck_assert(!p->has_parent);
    ck_assert_uint_eq(p->n, 5);
    for (uint32_t i = 0; i < 5; i++)
        ck_assert_uint_eq(p->blocks[i].block_hash, 1000 + i);
    ck_assert_ptr_null(kvb_coalesce_take(&c));
    kvb_coalesce_free(&c);
}
END_TEST

START_TEST(not_adjacent_not_merged)
{
    struct kvb_coalesce c;
    kvb_coalesce_init(&c);
    struct kvb_rev a = store(true, 1, 0, 2);
    ck_assert_int_eq(kvb_coalesce_hold(&c, &a), 0);
    struct kvb_rev b = store(true, 1000, 2, 1); /* parent is a's first block, not its last */
    ck_assert(!kvb_coalesce_can_join(&c, &b));
    b = store(false, 0, 2, 1); /* a root store: its own event */
    ck_assert(!kvb_coalesce_can_join(&c, &b));
    struct kvb_rev r = removed(0, 1); /* another type */
    ck_assert(!kvb_coalesce_can_join(&c, &r));
    kvb_coalesce_free(&c);
}
END_TEST

START_TEST(mixed_attributes_not_merged)
{
    struct kvb_coalesce c;
    kvb_coalesce_init(&c);
    struct kvb_rev a = store(false, 0, 0, 1);
    ck_assert_int_eq(kvb_coalesce_hold(&c, &a), 0);
    struct kvb_rev b = store(true, 1000, 1, 1);
    ck_assert(kvb_coalesce_can_join(&c, &b));
    b.tier = KVB_TIER_HOST_PINNED;
    ck_assert(!kvb_coalesce_can_join(&c, &b));
    b = store(true, 1000, 1, 1);
    b.dp_rank = 1;
    ck_assert(!kvb_coalesce_can_join(&c, &b));
    b = store(true, 1000, 1, 1);
    b.worker_id = 8;
    ck_assert(!kvb_coalesce_can_join(&c, &b));
    b = store(true, 1000, 1, 1);
    b.epoch = 3;
    ck_assert(!kvb_coalesce_can_join(&c, &b));
    b = store(true, 1000, 1, 1);
    b.repair = true;
    ck_assert(!kvb_coalesce_can_join(&c, &b));
    struct kvb_rev x = {.type = KVB_REVT_CLEARED, .worker_id = 7};
    ck_assert(!kvb_coalesce_can_join(&c, &x));
    kvb_coalesce_free(&c);
}
END_TEST

START_TEST(removes_merge_and_cut_at_128)
{
    struct kvb_coalesce c;
    kvb_coalesce_init(&c);
    struct kvb_rev a = removed(0, 100), b = removed(100, 28), d = removed(128, 1);
    ck_assert_int_eq(kvb_coalesce_hold(&c, &a), 0);
    ck_assert(kvb_coalesce_can_join(&c, &b));
    ck_assert_int_eq(kvb_coalesce_join(&c, &b), 0);
    ck_assert(!kvb_coalesce_can_join(&c, &d)); /* 129 > 128 */
    const struct kvb_rev *p = kvb_coalesce_take(&c);
    ck_assert_uint_eq(p->n, KVB_COALESCE_MAX);
    ck_assert_uint_eq(p->hashes[0], 9000);
    ck_assert_uint_eq(p->hashes[127], 9127);

    /* stores cut the same way */
    struct kvb_rev s1 = store(false, 0, 0, 120), s2 = store(true, 1119, 120, 9);
    ck_assert_int_eq(kvb_coalesce_hold(&c, &s1), 0);
    ck_assert(!kvb_coalesce_can_join(&c, &s2));
    s2 = store(true, 1119, 120, 8);
    ck_assert(kvb_coalesce_can_join(&c, &s2));
    kvb_coalesce_free(&c);
}
END_TEST

START_TEST(root_after_empty_store_keeps_its_own_event)
{
    /* Dynamo's merge: a pending store with no block has no last block, and a
     * root store then joins it, published under the empty store's parent.
     * Here an empty pending store takes nothing. */
    struct kvb_coalesce c;
    kvb_coalesce_init(&c);
    struct kvb_rev e = store(true, 42, 0, 0), root = store(false, 0, 0, 2);
    ck_assert_int_eq(kvb_coalesce_hold(&c, &e), 0);
    ck_assert(!kvb_coalesce_can_join(&c, &root));
    struct kvb_rev child = store(true, 42, 0, 2); /* even one under the same parent */
    ck_assert(!kvb_coalesce_can_join(&c, &child));
    kvb_coalesce_free(&c);
}
END_TEST

START_TEST(mm_objects_follow_their_blocks)
{
    struct kvb_coalesce c;
    kvb_coalesce_init(&c);
    static const uint64_t mm_b[3] = {11, 12, 13};
    static const uint32_t off_b[3] = {0, 2, 3};
    struct kvb_rev a = store(false, 0, 0, 2), b = store(true, 1001, 2, 2);
    b.mm_hashes = mm_b;
    b.mm_off = off_b;
    b.n_mm = 3;
    ck_assert_int_eq(kvb_coalesce_hold(&c, &a), 0);
    ck_assert_int_eq(kvb_coalesce_join(&c, &b), 0);
    const struct kvb_rev *p = kvb_coalesce_take(&c);
    ck_assert_uint_eq(p->n, 4);
    ck_assert_uint_eq(p->n_mm, 3);
    static const uint32_t want[5] = {0, 0, 0, 2, 3};
    for (int i = 0; i < 5; i++)
        ck_assert_uint_eq(p->mm_off[i], want[i]);
    ck_assert_uint_eq(p->mm_hashes[2], 13);

    /* and objects first, then a block without */
    struct kvb_rev d = store(true, 1003, 4, 1);
    ck_assert_int_eq(kvb_coalesce_hold(&c, &b), 0);
    ck_assert(kvb_coalesce_can_join(&c, &d));
    ck_assert_int_eq(kvb_coalesce_join(&c, &d), 0);
    p = kvb_coalesce_take(&c);
    ck_assert_uint_eq(p->n, 3);
    ck_assert_uint_eq(p->mm_off[2], 3);
    ck_assert_uint_eq(p->mm_off[3], 3);
    kvb_coalesce_free(&c);
}
END_TEST

static Suite *coalesce_suite(void)
{
    Suite *s = suite_create("coalesce");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, chained_stores_merge);
    tcase_add_test(tc, not_adjacent_not_merged);
    tcase_add_test(tc, mixed_attributes_not_merged);
    tcase_add_test(tc, removes_merge_and_cut_at_128);
    tcase_add_test(tc, root_after_empty_store_keeps_its_own_event);
    tcase_add_test(tc, mm_objects_follow_their_blocks);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(coalesce_suite()); }
