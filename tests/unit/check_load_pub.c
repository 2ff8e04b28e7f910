/* load_pub: ActiveLoad known answers.  The msgpack payload is the example of
 * docs/dynamo-event-plane.md section 6, byte for byte, inside an envelope built
 * like section 3's (topic kv_metrics); the JSON form carries the same fields
 * in the same order; the subject is endpoint-scoped and percent-encoded. */
#include <check.h>

#include "testutil.h"
#include <errno.h>
#include <string.h>

#include "config.h"
#include "load_pub.h"

#define W 7587890738027725506ULL

/* docs/dynamo-event-plane.md section 6 */
static const char ACTIVE_LOAD[] =
    "86a9776f726b65725f6964cf694d9a6c829e82c2a764705f72616e6b00b46163746976655f6465636f64655f"
    "626c6f636b7378b56163746976655f70726566696c6c5f746f6b656e73c0b47363686564756c65725f6c6f61"
    "645f73636f7065c0ae6b765f757365645f626c6f636b73cd0d48";
/* The envelope head of section 3 with topic "kv_metrics" (aa + 10 bytes) and
 * a bin8 of the payload's length (0x72 = 114 bytes). */
static const char HEAD[] =
    "85ac7075626c69736865725f6964cf0000123456789abca873657175656e636500ac7075626c69736865645f"
    "6174cf0000019b76daa800a5746f706963aa6b765f6d657472696373a77061796c6f6164c472";

static const struct kvb_active_load example = {.worker_id = W,
                                               .dp_rank = 0,
                                               .has_decode_blocks = true,
                                               .active_decode_blocks = 120,
                                               .has_kv_used_blocks = true,
                                               .kv_used_blocks = 3400};
static const struct kvb_load_env env = {0x123456789abcULL, 0, 1767225600000ULL};

START_TEST(test_msgpack_known_answer)
{
    msgpack_sbuffer tmp, out;
    msgpack_sbuffer_init(&tmp);
    msgpack_sbuffer_init(&out);
    ck_assert_int_eq(kvb_load_encode(KVB_FORMAT_DYNAMO_MSGPACK, &example, &env, &tmp, &out), 0);
    static uint8_t want[1024];
    size_t h = unhex(HEAD, want);
    size_t p = unhex(ACTIVE_LOAD, want + h);
    ck_assert_uint_eq(p, 0x72);
    ck_assert_uint_eq(out.size, h + p);
    for (size_t i = 0; i < h + p; i++)
        ck_assert_msg((uint8_t)out.data[i] == want[i], "byte %zu: %02x, want %02x", i,
                      (uint8_t)out.data[i], want[i]);
    /* reused buffers: a second message is not appended to the first */
    ck_assert_int_eq(kvb_load_encode(KVB_FORMAT_DYNAMO_MSGPACK, &example, &env, &tmp, &out), 0);
    ck_assert_uint_eq(out.size, h + p);
    msgpack_sbuffer_destroy(&tmp);
    msgpack_sbuffer_destroy(&out);
}
END_TEST

static char *json_of(const struct kvb_active_load *l, int format)
{
    msgpack_sbuffer out;
    msgpack_sbuffer_init(&out);
    ck_assert_int_eq(kvb_load_encode(format, l, NULL, NULL, &out), 0);
    char *s = strndup(out.data, out.size);
    msgpack_sbuffer_destroy(&out);
    return s;
}

START_TEST(test_json_known_answer)
{
    char *s = json_of(&example, KVB_FORMAT_DYNAMO_JSON);
    ck_assert_str_eq(s, "{\"worker_id\":7587890738027725506,\"dp_rank\":0,"
                        "\"active_decode_blocks\":120,\"active_prefill_tokens\":null,"
                        "\"scheduler_load_scope\":null,\"kv_used_blocks\":3400}");
    free(s);
    struct kvb_active_load l = {.worker_id = UINT64_MAX,
                                .dp_rank = UINT32_MAX,
                                .has_kv_used_blocks = true,
                                .kv_used_blocks = 0};
    s = json_of(&l, KVB_FORMAT_RAW); /* raw has no load form: JSON */
    ck_assert_str_eq(s, "{\"worker_id\":18446744073709551615,\"dp_rank\":4294967295,"
                        "\"active_decode_blocks\":null,\"active_prefill_tokens\":null,"
                        "\"scheduler_load_scope\":null,\"kv_used_blocks\":0}");
    free(s);
}
END_TEST

START_TEST(test_needs_a_field)
{
    msgpack_sbuffer tmp, out;
    msgpack_sbuffer_init(&tmp);
    msgpack_sbuffer_init(&out);
    struct kvb_active_load none = {.worker_id = 1};
    ck_assert_int_eq(kvb_load_encode(KVB_FORMAT_DYNAMO_MSGPACK, &none, &env, &tmp, &out), -EINVAL);
    ck_assert_int_eq(kvb_load_encode(KVB_FORMAT_DYNAMO_JSON, &none, &env, &tmp, &out), -EINVAL);
    ck_assert_int_eq(kvb_load_encode(KVB_FORMAT_DYNAMO_MSGPACK, &example, NULL, &tmp, &out),
                     -EINVAL);
    ck_assert_int_eq(kvb_load_encode(KVB_FORMAT_DYNAMO_JSON, NULL, &env, &tmp, &out), -EINVAL);
    msgpack_sbuffer_destroy(&tmp);
    msgpack_sbuffer_destroy(&out);
}
END_TEST

START_TEST(test_subject)
{
    char buf[256];
    ck_assert_int_gt(kvb_load_subject("dynamo", "backend", "generate", buf, sizeof buf), 0);
    ck_assert_str_eq(buf, "namespace.dynamo.component.backend.endpoint.generate.kv_metrics");
    ck_assert_int_gt(kvb_load_subject("my.ns", "back end", "gen/1", buf, sizeof buf), 0);
    ck_assert_str_eq(buf, "namespace.my%2Ens.component.back%20end.endpoint.gen%2F1.kv_metrics");
    ck_assert_int_eq(kvb_load_subject("dynamo", "backend", "generate", buf, 20), -ENAMETOOLONG);
}
END_TEST

static Suite *load_pub_suite(void)
{
    Suite *s = suite_create("load_pub");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_msgpack_known_answer);
    tcase_add_test(tc, test_json_known_answer);
    tcase_add_test(tc, test_needs_a_field);
    tcase_add_test(tc, test_subject);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(load_pub_suite()); }
