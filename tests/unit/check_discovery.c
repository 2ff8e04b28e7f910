/* Unit tests for the discovery module's pure parts: the EventSource record's
 * etcd key and JSON value (docs/dynamo-event-plane.md section 5).  The etcd side
 * (lease, keepalive, revoke, re-registration) is covered by
 * tests/integration/test_discovery_etcd.sh against a real etcd. */
#include <check.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "discovery.h"
#include "recovery.h"
#include "testutil.h"

START_TEST(key_known_answer)
{
    char key[512];
    int n = kvb_discovery_key("dynamo", "backend", "generate", UINT64_C(20015998343868), key,
                              sizeof(key));
    ck_assert_int_eq(n, (int)strlen(key));
    ck_assert_str_eq(key, "v1/event_sources/namespace/dynamo/component/backend/endpoint/generate/"
                          "topic/kv-events/123456789abc");
}
END_TEST

START_TEST(key_percent_encodes_segments)
{
    char key[512];
    ck_assert_int_gt(kvb_discovery_key("my.ns", "back/end", "gen erate", 0xabc, key, sizeof(key)),
                     0);
    ck_assert_str_eq(key, "v1/event_sources/namespace/my%2Ens/component/back%2Fend/endpoint/"
                          "gen%20erate/topic/kv-events/abc");
    ck_assert_int_eq(kvb_discovery_key("dynamo", "backend", "generate", 1, key, 20), -ENAMETOOLONG);
}
END_TEST

START_TEST(value_known_answer)
{
    char *v = kvb_discovery_value("dynamo", "backend", "generate", UINT64_C(20015998343868),
                                  UINT64_C(7587890738027725506), 0);
    ck_assert_ptr_nonnull(v);
    ck_assert_str_eq(v,
                     "{\"type\":\"EventSource\",\"scope\":{\"kind\":\"endpoint\",\"endpoint\":"
                     "{\"namespace\":\"dynamo\",\"component\":\"backend\",\"name\":\"generate\"}},"
                     "\"topic\":\"kv-events\",\"publisher_id\":20015998343868,\"metadata\":"
                     "{\"kv_state_endpoint\":{\"namespace\":\"dynamo\",\"component\":\"backend\","
                     "\"name\":\"generate\"},\"publisher_id\":20015998343868,\"worker\":"
                     "{\"worker_id\":7587890738027725506,\"dp_rank\":0}}}");
    free(v);
}
END_TEST

START_TEST(value_u64_and_escapes)
{
    /* worker ids above 2^63 stay unsigned; names are JSON-escaped, not encoded */
    char *v = kvb_discovery_value("a\"b", "c/d", "e", 1, UINT64_MAX, 3);
    ck_assert_ptr_nonnull(v);
    ck_assert_ptr_nonnull(strstr(v, "\"worker_id\":18446744073709551615,\"dp_rank\":3"));
    ck_assert_ptr_nonnull(strstr(v, "\"namespace\":\"a\\\"b\",\"component\":\"c/d\""));
    free(v);
}
END_TEST

/* With the recovery query on: the Instance record of a pair's recovery
 * endpoint, and the EventSource record naming it (docs/dynamo-event-plane.md
 * section 9.2), for both request planes. */
START_TEST(recovery_records)
{
    struct kvb_recovery_target t = {.plane = KVB_RECOVERY_NATS,
                                    .instance_id = UINT64_C(1958007344816222594)};
    strcpy(t.namespace_, "dynamo");
    strcpy(t.component, "backend");
    char key[256];
    ck_assert_int_gt(kvb_discovery_instance_key(&t, UINT64_C(20015998343868), key, sizeof(key)), 0);
    ck_assert_str_eq(key, "v1/instances/dynamo/backend/worker_kv_query_source_123456789abc/"
                          "1b2c3d4e5f607182");
    char *v = kvb_discovery_instance_value(&t, UINT64_C(20015998343868),
                                           UINT64_C(7587890738027725506), 0);
    ck_assert_str_eq(v, "{\"type\":\"Endpoint\",\"component\":\"backend\",\"endpoint\":"
                        "\"worker_kv_query_source_123456789abc\",\"namespace\":\"dynamo\","
                        "\"instance_id\":1958007344816222594,\"transport\":{\"nats_tcp\":"
                        "\"dynamo_backend.kvbridge-1b2c3d4e5f607182.7587890738027725506.0\"}}");
    free(v);
    v = kvb_discovery_value_rt("dynamo", "backend", "generate", UINT64_C(20015998343868),
                               UINT64_C(7587890738027725506), 0, &t);
    ck_assert_str_eq(
        v, "{\"type\":\"EventSource\",\"scope\":{\"kind\":\"endpoint\",\"endpoint\":"
           "{\"namespace\":\"dynamo\",\"component\":\"backend\",\"name\":\"generate\"}},"
           "\"topic\":\"kv-events\",\"publisher_id\":20015998343868,\"metadata\":"
           "{\"kv_state_endpoint\":{\"namespace\":\"dynamo\",\"component\":\"backend\","
           "\"name\":\"generate\"},\"publisher_id\":20015998343868,\"recovery_target\":"
           "{\"component\":\"backend\",\"endpoint\":\"worker_kv_query_source_123456789abc\","
           "\"namespace\":\"dynamo\",\"instance_id\":1958007344816222594,\"transport\":"
           "{\"nats_tcp\":\"dynamo_backend.kvbridge-1b2c3d4e5f607182.7587890738027725506."
           "0\"}},\"worker\":{\"worker_id\":7587890738027725506,\"dp_rank\":0}}}");
    free(v);
    t.plane = KVB_RECOVERY_TCP;
    strcpy(t.address, "10.0.0.7:9999");
    char tr[256];
    ck_assert_int_gt(kvb_recovery_transport(&t, 7, 3, tr, sizeof(tr)), 0);
    ck_assert_str_eq(tr, "10.0.0.7:9999/1b2c3d4e5f607182/kvbridge/7/3");
    v = kvb_discovery_instance_value(&t, 1, 7, 3);
    ck_assert_ptr_nonnull(strstr(v, "\"transport\":{\"tcp\":\"10.0.0.7:9999/1b2c3d4e5f607182/"
                                    "kvbridge/7/3\"}"));
    free(v);
    ck_assert_int_eq(kvb_recovery_transport(&t, 7, 3, tr, 10), -ENAMETOOLONG);
}
END_TEST

static Suite *discovery_suite(void)
{
    Suite *su = suite_create("discovery");
    TCase *tc = tcase_create("record");
    tcase_add_test(tc, key_known_answer);
    tcase_add_test(tc, key_percent_encodes_segments);
    tcase_add_test(tc, value_known_answer);
    tcase_add_test(tc, recovery_records);
    tcase_add_test(tc, value_u64_and_escapes);
    suite_add_tcase(su, tc);
    return su;
}

int main(void) { return kvb_run_suite(discovery_suite()); }
