/* Unit tests for the subject module: template checks, expansion (with
 * {endpoint} and percent-encoding), the Nats-Msg-Id. */
#include <check.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "subject.h"
#include "testutil.h"

#define DEFAULT_SUBJECT "namespace.{namespace}.component.{component}.kv_events"
#define SUBJ "namespace.dynamo.component.backend.kv_events"

/* ---- subject templates ---- */

START_TEST(test_subject_default)
{
    char out[128];
    int n = kvb_subject_expand(DEFAULT_SUBJECT, "dynamo", "backend", 1, 0, out, sizeof(out));
    ck_assert_int_eq(n, (int)strlen(SUBJ));
    ck_assert_str_eq(out, SUBJ);
}
END_TEST

START_TEST(test_subject_all_placeholders)
{
    char out[128];
    int n = kvb_subject_expand("kv.{namespace}.{component}.{worker_id}.{dp_rank}.x", "ns", "comp",
                               7587890738027725506ull, 3, out, sizeof(out));
    ck_assert_str_eq(out, "kv.ns.comp.7587890738027725506.3.x");
    ck_assert_int_eq(n, (int)strlen(out));

    n = kvb_subject_expand("{worker_id}{dp_rank}{worker_id}", "a", "b", UINT64_MAX, UINT32_MAX, out,
                           sizeof(out));
    ck_assert_str_eq(out, "18446744073709551615429496729518446744073709551615");
    ck_assert_int_eq(n, (int)strlen(out));

    n = kvb_subject_expand("plain.subject", "a", "b", 0, 0, out, sizeof(out));
    ck_assert_str_eq(out, "plain.subject");

    n = kvb_subject_expand("", "a", "b", 0, 0, out, sizeof(out));
    ck_assert_int_eq(n, 0);
    ck_assert_str_eq(out, "");

    /* A lone '}' is literal. */
    n = kvb_subject_expand("a}.{dp_rank}", "a", "b", 0, 12, out, sizeof(out));
    ck_assert_str_eq(out, "a}.12");
}
END_TEST

START_TEST(test_subject_errors)
{
    char out[32];
    memset(out, 'Z', sizeof(out));

    ck_assert_int_eq(kvb_subject_expand("a.{nope}.b", "n", "c", 1, 0, out, sizeof(out)), -EINVAL);
    ck_assert_int_eq(kvb_subject_expand("a.{}.b", "n", "c", 1, 0, out, sizeof(out)), -EINVAL);
    ck_assert_int_eq(kvb_subject_expand("a.{namespace", "n", "c", 1, 0, out, sizeof(out)), -EINVAL);
    ck_assert_int_eq(kvb_subject_expand("{Namespace}", "n", "c", 1, 0, out, sizeof(out)), -EINVAL);
    ck_assert_int_eq(kvb_subject_expand(NULL, "n", "c", 1, 0, out, sizeof(out)), -EINVAL);
    ck_assert_int_eq(kvb_subject_expand("x", NULL, "c", 1, 0, out, sizeof(out)), -EINVAL);
    /* out is written only on success */
    ck_assert_int_eq(out[0], 'Z');

    /* "namespace.dynamo.component.backend.kv_events" is 44 chars: fits in 45. */
    char big[45];
    ck_assert_int_eq(kvb_subject_expand(DEFAULT_SUBJECT, "dynamo", "backend", 0, 0, big, 44),
                     -ENAMETOOLONG);
    ck_assert_int_eq(kvb_subject_expand(DEFAULT_SUBJECT, "dynamo", "backend", 0, 0, big, 45), 44);
    ck_assert_str_eq(big, SUBJ);
    ck_assert_int_eq(kvb_subject_expand("x", "n", "c", 0, 0, out, 0), -ENAMETOOLONG);
    ck_assert_int_eq(kvb_subject_expand("", "n", "c", 0, 0, out, 1), 0);
    /* Overflow inside a placeholder value, and an error after an overflow-free prefix. */
    memset(out, 'Z', sizeof(out));
    ck_assert_int_eq(kvb_subject_expand("w.{worker_id}", "n", "c", UINT64_MAX, 0, out, 10),
                     -ENAMETOOLONG);
    ck_assert_int_eq(out[0], 'Z');
    ck_assert_int_eq(kvb_subject_expand("w.{worker_id}.{bad}", "n", "c", 1, 0, out, sizeof(out)),
                     -EINVAL);
    ck_assert_int_eq(out[0], 'Z');
}
END_TEST

/* ---- {endpoint} and percent-encoding ---- */

START_TEST(test_subject_endpoint)
{
    char out[128];
    struct kvb_subject_vals v = {"dynamo", "backend", "generate", 7, 1};
    const char *t = "namespace.{namespace}.component.{component}.endpoint.{endpoint}.kv-events";
    ck_assert_int_eq(kvb_subject_expand_vals(t, &v, 0, out, sizeof(out)),
                     (int)strlen("namespace.dynamo.component.backend.endpoint.generate.kv-events"));
    /* docs/dynamo-event-plane.md section 2, first example */
    ck_assert_str_eq(out, "namespace.dynamo.component.backend.endpoint.generate.kv-events");
    /* empty (or NULL) endpoint: expands to nothing */
    v.endpoint = NULL;
    ck_assert_int_eq(kvb_subject_expand_vals("a.{endpoint}.b", &v, 0, out, sizeof(out)), 4);
    ck_assert_str_eq(out, "a..b");
    /* the plain expansion knows it too (empty) */
    ck_assert_int_eq(kvb_subject_expand("x{endpoint}y", "n", "c", 0, 0, out, sizeof(out)), 2);
    ck_assert_str_eq(out, "xy");
}
END_TEST

START_TEST(test_subject_pct_expand)
{
    char out[128];
    /* docs/dynamo-event-plane.md section 2: namespace my.ns */
    struct kvb_subject_vals v = {"my.ns", "backend", NULL, 18446744073709551615ull, 3};
    ck_assert_int_eq(kvb_subject_expand_vals("namespace.{namespace}.component.{component}."
                                             "kv-events",
                                             &v, KVB_SUBJECT_PCT, out, sizeof(out)),
                     (int)strlen("namespace.my%2Ens.component.backend.kv-events"));
    ck_assert_str_eq(out, "namespace.my%2Ens.component.backend.kv-events");
    /* without the flag: as given */
    kvb_subject_expand_vals("{namespace}", &v, 0, out, sizeof(out));
    ck_assert_str_eq(out, "my.ns");
    /* numbers are never encoded; the template's own text neither */
    v.ns = "a b/c";
    v.endpoint = "gén";
    ck_assert_int_gt(kvb_subject_expand_vals("t.{namespace}.{endpoint}.{worker_id}.{dp_rank}", &v,
                                             KVB_SUBJECT_PCT, out, sizeof(out)),
                     0);
    ck_assert_str_eq(out, "t.a%20b%2Fc.g%C3%A9n.18446744073709551615.3");
    /* the encoded length counts against cap; out untouched on failure */
    v.ns = "..";
    memset(out, 'Z', sizeof(out));
    ck_assert_int_eq(kvb_subject_expand_vals("{namespace}", &v, KVB_SUBJECT_PCT, out, 6),
                     -ENAMETOOLONG);
    ck_assert_int_eq(out[0], 'Z');
    ck_assert_int_eq(kvb_subject_expand_vals("{namespace}", &v, KVB_SUBJECT_PCT, out, 7), 6);
    ck_assert_str_eq(out, "%2E%2E");
}
END_TEST

START_TEST(test_pct_encode)
{
    char out[64];
    ck_assert_int_eq(kvb_subject_pct_encode("my.ns", 5, out, sizeof(out)), 7);
    ck_assert_str_eq(out, "my%2Ens");
    ck_assert_int_eq(kvb_subject_pct_encode("kv-events", 9, out, sizeof(out)), 9);
    ck_assert_str_eq(out, "kv-events");
    ck_assert_int_eq(kvb_subject_pct_encode("kv_metrics", 10, out, sizeof(out)), 10);
    ck_assert_str_eq(out, "kv_metrics");
    ck_assert_int_eq(kvb_subject_pct_encode("AZaz09-_", 8, out, sizeof(out)), 8);
    ck_assert_str_eq(out, "AZaz09-_");
    /* every other byte, NUL and high bytes included; upper-case hex */
    ck_assert_int_eq(kvb_subject_pct_encode("\0\xff*>~ ", 6, out, sizeof(out)), 18);
    ck_assert_str_eq(out, "%00%FF%2A%3E%7E%20");
    ck_assert_int_eq(kvb_subject_pct_encode("", 0, out, sizeof(out)), 0);
    ck_assert_str_eq(out, "");
    ck_assert_int_eq(kvb_subject_pct_encode(NULL, 0, out, sizeof(out)), 0);
    /* room: result plus NUL */
    ck_assert_int_eq(kvb_subject_pct_encode("a.", 2, out, 4), -ENAMETOOLONG);
    ck_assert_int_eq(kvb_subject_pct_encode("a.", 2, out, 5), 4);
    ck_assert_int_eq(kvb_subject_pct_encode("a", 1, out, 0), -ENAMETOOLONG);
    ck_assert_int_eq(kvb_subject_pct_encode(NULL, 1, out, sizeof(out)), -EINVAL);
    ck_assert_int_eq(kvb_subject_pct_encode("a", 1, NULL, 8), -EINVAL);
}
END_TEST

/* ---- the check the config module runs ---- */

START_TEST(test_check)
{
    size_t off = 99, len = 99;
    ck_assert_int_eq(kvb_subject_check(DEFAULT_SUBJECT, KVB_PH_ALL, &off, &len), 0);
    ck_assert_int_eq(kvb_subject_check("plain.}", 0, NULL, NULL), 0);
    ck_assert_int_eq(kvb_subject_check("", 0, NULL, NULL), 0);
    ck_assert_int_eq(kvb_subject_check("{namespace}{component}{worker_id}{dp_rank}{endpoint}",
                                       KVB_PH_ALL, NULL, NULL),
                     0);
    /* a known placeholder that is not allowed */
    unsigned js = KVB_PH_NAMESPACE | KVB_PH_COMPONENT | KVB_PH_WORKER_ID;
    ck_assert_int_eq(kvb_subject_check("s-{namespace}.{dp_rank}", js, &off, &len), -EINVAL);
    ck_assert_uint_eq(off, 14);
    ck_assert_uint_eq(len, 9);
    ck_assert_int_eq(kvb_subject_check("a.{endpoint}", js | KVB_PH_DP_RANK, &off, &len), -EINVAL);
    ck_assert_uint_eq(off, 2);
    ck_assert_uint_eq(len, 10);
    /* unknown, empty, unclosed, nested, wrong case */
    ck_assert_int_eq(kvb_subject_check("x.{namspace}.y", KVB_PH_ALL, &off, &len), -EINVAL);
    ck_assert_uint_eq(off, 2);
    ck_assert_uint_eq(len, 10);
    ck_assert_int_eq(kvb_subject_check("{}", KVB_PH_ALL, &off, &len), -EINVAL);
    ck_assert_uint_eq(len, 2);
    ck_assert_int_eq(kvb_subject_check("a.{namespace", KVB_PH_ALL, &off, &len), -EINVAL);
    ck_assert_uint_eq(off, 2);
    ck_assert_uint_eq(len, 10);
    ck_assert_int_eq(kvb_subject_check("{{namespace}", KVB_PH_ALL, &off, &len), -EINVAL);
    ck_assert_uint_eq(off, 0);
    ck_assert_uint_eq(len, 12);
    ck_assert_int_eq(kvb_subject_check("{Namespace}", KVB_PH_ALL, NULL, NULL), -EINVAL);
    ck_assert_int_eq(kvb_subject_check(NULL, KVB_PH_ALL, NULL, NULL), -EINVAL);
}
END_TEST

/* ---- Nats-Msg-Id ---- */

START_TEST(test_msg_id)
{
    char buf[KVB_MSG_ID_MAX];
    ck_assert_str_eq(kvb_subject_msg_id(buf, 7, 0, 3, 42), "7.0.3.42");
    ck_assert_ptr_eq(kvb_subject_msg_id(buf, 0, 0, 0, 0), buf);
    ck_assert_str_eq(buf, "0.0.0.0");
    kvb_subject_msg_id(buf, UINT64_MAX, UINT64_MAX, UINT64_MAX, UINT64_MAX);
    ck_assert_str_eq(buf, "18446744073709551615.18446744073709551615."
                          "18446744073709551615.18446744073709551615");
    ck_assert_uint_eq(strlen(buf) + 1, KVB_MSG_ID_MAX);
}
END_TEST

static Suite *subject_suite(void)
{
    Suite *su = suite_create("subject");
    TCase *tc = tcase_create("subject");
    tcase_add_test(tc, test_subject_default);
    tcase_add_test(tc, test_subject_all_placeholders);
    tcase_add_test(tc, test_subject_errors);
    tcase_add_test(tc, test_subject_endpoint);
    tcase_add_test(tc, test_subject_pct_expand);
    tcase_add_test(tc, test_pct_encode);
    tcase_add_test(tc, test_check);
    tcase_add_test(tc, test_msg_id);
    suite_add_tcase(su, tc);
    return su;
}

int main(void) { return kvb_run_suite(subject_suite()); }
