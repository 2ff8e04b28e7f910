/* Unit tests for the output module without a NATS server: subjects per
 * format ({endpoint}, percent-encoding for dynamo-msgpack only, the
 * endpoint-scoped default), and that a publish that fails is reported as a
 * loss (the loop then publishes barriers).  Publishing through a live sink is
 * covered by the integration tests (make integration-msgpack,
 * test_daemon_raw.sh, test_discovery_etcd.sh). */
#include <check.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "metrics.h"
#include "publish.h"
#include "testutil.h"

/* A configuration from YAML text (the nats: mapping's extra lines). */
static struct kvb_config *load(const char *nats_extra, const char *top_extra)
{
    char path[] = "/tmp/kvb-check-output.XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f,
            "worker_id: 7\nblock_size: 16\nsources: [{endpoint: \"tcp://127.0.0.1:5557\"}]\n"
            "%s\nnats:\n  servers: [nats://127.0.0.1:4222]\n%s\nmetrics: {listen: \"\"}\n",
            top_extra, nats_extra);
    fclose(f);
    struct kvb_config *c = NULL;
    int rc = kvb_config_load(path, &c, stderr);
    unlink(path);
    ck_assert_int_eq(rc, 0);
    return c;
}

static void subject_is(const char *nats_extra, const char *want)
{
    struct kvb_config *c = load(nats_extra, "");
    struct kvb_metrics *m = calloc(1, sizeof(*m));
    struct kvb_publish *o = NULL;
    ck_assert_int_eq(kvb_publish_create(c, m, 1, &o), 0);
    ck_assert_str_eq(kvb_publish_subject(o), want);
    kvb_publish_destroy(&o);
    ck_assert_ptr_null(o);
    free(m);
    kvb_config_free(&c);
}

START_TEST(subjects)
{
    subject_is("", "namespace.dynamo.component.backend.kv_events");
    subject_is("  format: dynamo-msgpack",
               "namespace.dynamo.component.backend.endpoint.generate.kv-events");
    subject_is("  format: dynamo-msgpack\n  namespace: my.ns\n  endpoint: kv/state",
               "namespace.my%2Ens.component.backend.endpoint.kv%2Fstate.kv-events");
    subject_is("  format: dynamo-msgpack\n  batch: false\n  subject: "
               "namespace.{namespace}.component.{component}.kv-events",
               "namespace.dynamo.component.backend.kv-events");
    /* dynamo-json: {endpoint} expands, nothing is encoded */
    subject_is("  namespace: my.ns\n  subject: a.{namespace}.{endpoint}", "a.my.ns.generate");
    subject_is("  format: raw\n  subject: raw.{worker_id}", "raw.7");
}
END_TEST

START_TEST(failed_publish_is_a_loss)
{
    static const char *const formats[] = {"", "  format: dynamo-msgpack"};
    for (int k = 0; k < 2; k++) {
        struct kvb_config *c = load(formats[k], "cache_namespace: ns1");
        ck_assert_str_eq(c->cache_namespace, "ns1");
        struct kvb_metrics *m = calloc(1, sizeof(*m));
        struct kvb_publish *o = NULL;
        ck_assert_int_eq(kvb_publish_create(c, m, 1, &o), 0);
        /* no sink: every publish fails */
        struct kvb_rev r = {.type = KVB_REVT_CLEARED, .worker_id = 7, .event_id = 0};
        ck_assert(!kvb_publish_take_loss(o));
        ck_assert_int_eq(kvb_publish_event(o, &r, "{}", 2), 0);
        ck_assert_int_eq(kvb_publish_flush(o), 0);
        ck_assert(kvb_publish_take_loss(o));
        ck_assert(!kvb_publish_take_loss(o)); /* once per loss */
        ck_assert(!kvb_publish_blocked(o));   /* no discovery */
        ck_assert(kvb_publish_registered(o));
        ck_assert_uint_eq(kvb_get(&m->messages_published_total[KVB_FMT_DYNAMO_JSON]) +
                              kvb_get(&m->messages_published_total[KVB_FMT_DYNAMO_MSGPACK]),
                          0);
        kvb_publish_destroy(&o);
        free(m);
        kvb_config_free(&c);
    }
}
END_TEST

/* kvb_publish_cut() (the loop: the end of an engine batch) sends the
 * pending dynamo-msgpack message at once, without a flush; for dynamo-json
 * (a message per event, sent by kvb_publish_event) it has nothing to do.
 * Without a sink the publish fails: the loss shows that it was attempted. */
START_TEST(cut_sends_the_pending_message)
{
    static const char *const formats[] = {"  format: dynamo-msgpack", ""};
    for (int k = 0; k < 2; k++) {
        struct kvb_config *c = load(formats[k], "");
        struct kvb_metrics *m = calloc(1, sizeof(*m));
        struct kvb_publish *o = NULL;
        ck_assert_int_eq(kvb_publish_create(c, m, 1, &o), 0);
        struct kvb_rev r = {.type = KVB_REVT_CLEARED, .worker_id = 7, .event_id = 0};
        ck_assert_int_eq(kvb_publish_event(o, &r, "{}", 2), 0);
        /* dynamo-msgpack holds the event; dynamo-json tried to publish it */
        ck_assert(kvb_publish_take_loss(o) == (k == 1));
        ck_assert_int_eq(kvb_publish_cut(o), 0);
        ck_assert(kvb_publish_take_loss(o) == (k == 0));
        ck_assert_int_eq(kvb_publish_cut(o), 0); /* nothing pending any more */
        ck_assert_int_eq(kvb_publish_flush(o), 0);
        ck_assert(!kvb_publish_take_loss(o));
        kvb_publish_destroy(&o);
        free(m);
        kvb_config_free(&c);
    }
}
END_TEST

START_TEST(format_combinations_refused)
{
    char path[] = "/tmp/kvb-check-output.XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    FILE *f = fdopen(fd, "w");
    fputs("worker_id: 7\nblock_size: 16\nsources: [{endpoint: \"tcp://127.0.0.1:5557\"}]\n"
          "nats: {format: dynamo-json}\n"
          "discovery: {etcd: {endpoints: [\"ftp://x\"]}}\n",
          f);
    fclose(f);
    struct kvb_config *c = NULL;
    char *err = NULL;
    size_t len = 0;
    FILE *e = open_memstream(&err, &len);
    ck_assert_int_eq(kvb_config_load(path, &c, e), -EINVAL);
    fclose(e);
    unlink(path);
    ck_assert_ptr_nonnull(strstr(err, "'ftp://x' is not an etcd URL"));
    free(err);
}
END_TEST

static Suite *output_suite(void)
{
    Suite *su = suite_create("output");
    TCase *tc = tcase_create("output");
    tcase_add_test(tc, subjects);
    tcase_add_test(tc, failed_publish_is_a_loss);
    tcase_add_test(tc, format_combinations_refused);
    tcase_add_test(tc, cut_sends_the_pending_message);
    suite_add_tcase(su, tc);
    return su;
}

int main(void) { return kvb_run_suite(output_suite()); }
