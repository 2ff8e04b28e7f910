/* Unit tests for the publish stage without a NATS server: subjects per
 * format ({endpoint}, percent-encoding for dynamo-msgpack only, the
 * endpoint-scoped default), that a publish that fails is reported as a
 * loss (the loop then publishes barriers), and that a writer (sink-less)
 * receives exactly what the sink would, the observer each event.  Publishing through a live sink is
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

static struct kvb_publish *create(const struct kvb_config *c, struct kvb_metrics *m)
{
    struct kvb_publish_cfg uc = kvb_publish_cfg_of(c);
    struct kvb_publish *o = NULL;
    ck_assert_int_eq(kvb_publish_create(&uc, m, 1, &o), 0);
    return o;
}

static void subject_is(const char *nats_extra, const char *want)
{
    struct kvb_config *c = load(nats_extra, "");
    struct kvb_metrics *m = calloc(1, sizeof(*m));
    struct kvb_publish *o = create(c, m);
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
        struct kvb_publish *o = create(c, m);
        /* no sink: every publish fails */
        struct kvb_rev r = {.type = KVB_REVT_CLEARED, .worker_id = 7, .event_id = 0};
        ck_assert(!kvb_publish_take_loss(o));
        ck_assert_int_eq(kvb_publish_event(o, &r), 0);
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

/* kvb_publish_cut() (the pipeline: an engine batch starts) sends the
 * pending dynamo-msgpack message at once, without a flush; for dynamo-json
 * (a message per event, sent by kvb_publish_event) it has nothing to do.
 * Without a sink the publish fails: the loss shows that it was attempted. */
START_TEST(cut_sends_the_pending_message)
{
    static const char *const formats[] = {"  format: dynamo-msgpack", ""};
    for (int k = 0; k < 2; k++) {
        struct kvb_config *c = load(formats[k], "");
        struct kvb_metrics *m = calloc(1, sizeof(*m));
        struct kvb_publish *o = create(c, m);
        struct kvb_rev r = {.type = KVB_REVT_CLEARED, .worker_id = 7, .event_id = 0};
        ck_assert_int_eq(kvb_publish_event(o, &r), 0);
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

/* What a writer receives, per format. */
struct got {
    char subject[128], msg_id[64], hdrs[256];
    size_t len;
    unsigned n;
    bool rev;
};

static int write_msg(void *ctx, const struct kvb_publish_msg *msg)
{
    struct got *g = ctx;
    g->n++;
    snprintf(g->subject, sizeof(g->subject), "%s", msg->subject);
    snprintf(g->msg_id, sizeof(g->msg_id), "%s", msg->msg_id ? msg->msg_id : "");
    g->hdrs[0] = 0;
    for (size_t i = 0; i < 2 * msg->n_hdrs; i++) {
        strcat(g->hdrs, msg->hdrs[i]);
        strcat(g->hdrs, i % 2 ? ";" : "=");
    }
    g->len = msg->len;
    g->rev = msg->rev != NULL;
    return 0;
}

static unsigned observed;
static int observe(void *ctx, const struct kvb_rev *rev)
{
    (void)ctx;
    observed++;
    return rev->type == KVB_REVT_STORED; /* "the pair needs a cleared" */
}

START_TEST(writer_gets_what_the_sink_would)
{
    static const char *const formats[] = {"  jetstream: {enabled: true}",
                                          "  format: dynamo-msgpack", "  format: raw"};
    for (int k = 0; k < 3; k++) {
        struct kvb_config *c = load(formats[k], "");
        struct kvb_metrics *m = calloc(1, sizeof(*m));
        struct kvb_publish *o = create(c, m);
        struct got g = {0};
        struct kvb_publish_writer w = {.write = write_msg, .ctx = &g, .now_ms = 0};
        kvb_publish_set_writer(o, &w);
        observed = 0;
        kvb_publish_set_observer(o, observe, NULL);
        struct kvb_rev r = {.type = KVB_REVT_CLEARED, .worker_id = 7, .dp_rank = 2, .epoch = 5};
        ck_assert_int_eq(kvb_publish_event(o, &r), 0);
        ck_assert_uint_eq(observed, 1);
        ck_assert_int_eq(kvb_publish_flush(o), 0);
        ck_assert(!kvb_publish_take_loss(o));
        ck_assert(kvb_publish_takes_batches(o) == (k == 2));
        if (k == 0) { /* one message per event, its JetStream id */
            ck_assert_uint_eq(g.n, 1);
            ck_assert(g.rev);
            ck_assert_str_eq(g.subject, c->nats.jetstream.subject_name);
            ck_assert_str_eq(g.msg_id, "7.2.5.0");
            ck_assert_uint_eq(kvb_get(&m->messages_published_total[KVB_FMT_DYNAMO_JSON]), 1);
        } else if (k == 1) { /* the envelope, at the flush */
            ck_assert_uint_eq(g.n, 1);
            ck_assert(!g.rev);
            ck_assert_str_eq(g.msg_id, "");
            ck_assert_uint_eq(kvb_get(&m->messages_published_total[KVB_FMT_DYNAMO_MSGPACK]), 1);
        } else { /* raw: router events are not published, batches are */
            ck_assert_uint_eq(g.n, 0);
            struct kvb_raw_batch b = {"tcp://e:1", "kv", 9, 2, "xyz", 3, 7};
            ck_assert_int_eq(kvb_publish_raw(o, &b), 0);
            ck_assert_uint_eq(g.n, 1);
            ck_assert_uint_eq(g.len, 3);
            ck_assert_str_eq(g.hdrs, "KV-Seq=9;KV-DP-Rank=2;KV-Topic=kv;KV-Source=tcp://e:1;");
        }
        /* the observer's answer is the caller's: the pipeline publishes the cleared */
        r.type = KVB_REVT_STORED;
        ck_assert_int_eq(kvb_publish_event(o, &r), 1);
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
    tcase_add_test(tc, writer_gets_what_the_sink_would);
    suite_add_tcase(su, tc);
    return su;
}

int main(void) { return kvb_run_suite(output_suite()); }
