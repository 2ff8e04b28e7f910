/* encode: the exact JSON of docs/router-events.md section 1. */
#include <check.h>

#include "testutil.h"
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "encode.h"

static struct kvb_encoder *enc;

static void setup(void) { ck_assert_int_eq(kvb_encoder_create(KVB_FORMAT_DYNAMO_JSON, &enc), 0); }
static void teardown(void) { kvb_encoder_destroy(&enc); }

static void expect(const struct kvb_rev *r, const char *want)
{
    const char *data;
    size_t len;
    ck_assert_int_eq(kvb_encode(enc, r, &data, &len), 0);
    ck_assert_int_eq(len, strlen(want));
    ck_assert_msg(memcmp(data, want, len) == 0, "got %.*s", (int)len, data);
}

START_TEST(literal_examples)
{
    const uint64_t W = 7587890738027725506ULL;
    struct kvb_block blk = {15760518052499183552ULL, 7652252100776996844ULL};
    struct kvb_rev r = {
        .type = KVB_REVT_STORED, .worker_id = W, .event_id = 0, .blocks = &blk, .n = 1};
    expect(&r, "{\"worker_id\":7587890738027725506,\"event\":{\"event_id\":0,\"data\":{\"stored\":"
               "{\"parent_hash\":null,\"blocks\":[{\"block_hash\":15760518052499183552,"
               "\"tokens_hash\":7652252100776996844}]}},\"dp_rank\":0}}");
    uint64_t h = 15760518052499183552ULL;
    struct kvb_rev rm = {
        .type = KVB_REVT_REMOVED, .worker_id = W, .event_id = 1, .hashes = &h, .n = 1};
    expect(&rm,
           "{\"worker_id\":7587890738027725506,\"event\":{\"event_id\":1,\"data\":{\"removed\":"
           "{\"block_hashes\":[15760518052499183552]}},\"dp_rank\":0}}");
    struct kvb_rev c = {.type = KVB_REVT_CLEARED, .worker_id = W, .event_id = 2};
    expect(&c, "{\"worker_id\":7587890738027725506,\"event\":{\"event_id\":2,\"data\":\"cleared\","
               "\"dp_rank\":0}}");
}
END_TEST

/* A scoped "cleared" (TierBlocksCleared) names its tier, device included;
 * an unscoped one names none (every tier), whatever its tier field holds. */
START_TEST(scoped_cleared_names_its_tier)
{
    struct kvb_rev c = {.type = KVB_REVT_CLEARED,
                        .tier = KVB_TIER_DEVICE,
                        .scoped = true,
                        .worker_id = 3,
                        .event_id = 9,
                        .dp_rank = 1};
    expect(&c, "{\"worker_id\":3,\"storage_tier\":\"device\",\"event\":{\"event_id\":9,"
               "\"data\":\"cleared\",\"dp_rank\":1}}");
    c.tier = KVB_TIER_HOST_PINNED;
    expect(&c, "{\"worker_id\":3,\"storage_tier\":\"host_pinned\",\"event\":{\"event_id\":9,"
               "\"data\":\"cleared\",\"dp_rank\":1}}");
    c.scoped = false;
    expect(&c, "{\"worker_id\":3,\"event\":{\"event_id\":9,\"data\":\"cleared\",\"dp_rank\":1}}");
}
END_TEST

START_TEST(parent_tier_and_many_blocks)
{
    struct kvb_block blk[3] = {{1, 2}, {3, 4}, {UINT64_MAX, 0}};
    struct kvb_rev r = {.type = KVB_REVT_STORED,
                        .tier = KVB_TIER_HOST_PINNED,
                        .worker_id = UINT64_MAX,
                        .event_id = 18446744073709551615ULL,
                        .dp_rank = 4294967295u,
                        .has_parent = true,
                        .parent = 0,
                        .blocks = blk,
                        .n = 3};
    expect(&r, "{\"worker_id\":18446744073709551615,\"storage_tier\":\"host_pinned\",\"event\":"
               "{\"event_id\":18446744073709551615,\"data\":{\"stored\":{\"parent_hash\":0,"
               "\"blocks\":[{\"block_hash\":1,\"tokens_hash\":2},{\"block_hash\":3,"
               "\"tokens_hash\":4},{\"block_hash\":18446744073709551615,\"tokens_hash\":0}]}},"
               "\"dp_rank\":4294967295}}");
    uint64_t hs[2] = {0, 10};
    struct kvb_rev rm = {.type = KVB_REVT_REMOVED,
                         .tier = KVB_TIER_DISK,
                         .worker_id = 1,
                         .hashes = hs,
                         .n = 2,
                         .dp_rank = 2};
    expect(&rm, "{\"worker_id\":1,\"storage_tier\":\"disk\",\"event\":{\"event_id\":0,\"data\":"
                "{\"removed\":{\"block_hashes\":[0,10]}},\"dp_rank\":2}}");
    rm.tier = KVB_TIER_EXTERNAL;
    rm.n = 0;
    expect(&rm, "{\"worker_id\":1,\"storage_tier\":\"external\",\"event\":{\"event_id\":0,\"data\":"
                "{\"removed\":{\"block_hashes\":[]}},\"dp_rank\":2}}");
}
END_TEST

START_TEST(large_event_grows_buffer)
{
    static struct kvb_block blk[5000];
    for (int i = 0; i < 5000; i++)
        blk[i] = (struct kvb_block){UINT64_MAX - (uint64_t)i, UINT64_MAX};
    struct kvb_rev r = {.type = KVB_REVT_STORED, .worker_id = UINT64_MAX, .blocks = blk, .n = 5000};
    const char *data;
    size_t len;
    ck_assert_int_eq(kvb_encode(enc, &r, &data, &len), 0);
    ck_assert(len > 5000 * 60);
    ck_assert(memcmp(data + len - 2, "}}", 2) == 0);
    /* count the blocks */
    size_t n = 0;
    for (const char *p = data; (p = memmem(p, (size_t)(data + len - p), "block_hash", 10)); p++)
        n++;
    ck_assert_uint_eq(n, 5000);
}
END_TEST

START_TEST(decimal_matches_printf)
{
    uint64_t v = 1;
    char a[32], b[32];
    for (int i = 0; i < 2000; i++) {
        uint64_t cases[3] = {v, v - 1, v + 7};
        for (int k = 0; k < 3; k++) {
            size_t n = kvb_u64_to_dec(a, cases[k]);
            a[n] = 0;
            snprintf(b, sizeof(b), "%" PRIu64, cases[k]);
            ck_assert_str_eq(a, b);
        }
        v = v * 3 + (uint64_t)i; /* wraps: covers every length */
    }
    /* every length boundary, and around the 8-digit groups */
    uint64_t p10 = 1;
    for (int k = 0; k <= 19; k++, p10 *= 10) {
        uint64_t cases[4] = {p10 - 1, p10, p10 + 1, p10 * 2 - 1};
        for (int c = 0; c < 4; c++) {
            size_t m = kvb_u64_to_dec(a, cases[c]);
            a[m] = 0;
            snprintf(b, sizeof(b), "%" PRIu64, cases[c]);
            ck_assert_str_eq(a, b);
        }
    }
    size_t m = kvb_u64_to_dec(a, UINT64_MAX);
    a[m] = 0;
    ck_assert_str_eq(a, "18446744073709551615");
    size_t n = kvb_u64_to_dec(a, 0);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(a[0], '0');
}
END_TEST

START_TEST(formats_not_built)
{
    struct kvb_encoder *e = NULL;
    ck_assert_int_eq(kvb_encoder_create(KVB_FORMAT_RAW, &e), -ENOTSUP);
    ck_assert(e == NULL);
    kvb_encoder_destroy(&e);
}
END_TEST

/* Multimodal blocks carry Dynamo's mm_extra_info (BlockExtraInfo): objects in
 * extra_keys order, offsets empty; blocks without any stay as they were. */
START_TEST(mm_extra_info)
{
    struct kvb_block blk[2] = {{1, 2}, {3, 4}};
    uint64_t mm[2] = {933467652192968450ULL, UINT64_MAX};
    uint32_t off[3] = {0, 0, 2};
    struct kvb_rev r = {.type = KVB_REVT_STORED,
                        .worker_id = 7,
                        .blocks = blk,
                        .n = 2,
                        .mm_hashes = mm,
                        .mm_off = off,
                        .n_mm = 2};
    expect(&r, "{\"worker_id\":7,\"event\":{\"event_id\":0,\"data\":{\"stored\":{\"parent_hash\":"
               "null,\"blocks\":[{\"block_hash\":1,\"tokens_hash\":2},{\"block_hash\":3,"
               "\"tokens_hash\":4,\"mm_extra_info\":{\"mm_objects\":[{\"mm_hash\":"
               "933467652192968450,\"offsets\":[]},{\"mm_hash\":18446744073709551615,"
               "\"offsets\":[]}]}}]}},\"dp_rank\":0}}");
}
END_TEST

static Suite *encode_suite(void)
{
    Suite *s = suite_create("encode");
    TCase *tc = tcase_create("encode");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, literal_examples);
    tcase_add_test(tc, scoped_cleared_names_its_tier);
    tcase_add_test(tc, parent_tier_and_many_blocks);
    tcase_add_test(tc, large_event_grows_buffer);
    tcase_add_test(tc, decimal_matches_printf);
    tcase_add_test(tc, formats_not_built);
    tcase_add_test(tc, mm_extra_info);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(encode_suite()); }
