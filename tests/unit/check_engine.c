/* engine: the loop's engine supervision against a libmicrohttpd "engine"
 * started here: load gauges and ActiveLoad messages (subject, JSON body,
 * a message on each change), liveness (a closed port with no batch is gone
 * once; batches keep it alive; an answering engine is back). */
#include <check.h>

#include "testutil.h"
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "clock.h"
#include "engine.h"

struct fake {
    struct MHD_Daemon *mhd;
    int port;
    pthread_mutex_t mu;
    char page[1024];
};

static enum MHD_Result answer(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **req_cls)
{
    (void)method;
    (void)version;
    (void)upload;
    (void)upload_size;
    static int first;
    if (!*req_cls) {
        *req_cls = &first;
        return MHD_YES;
    }
    struct fake *f = cls;
    pthread_mutex_lock(&f->mu);
    char *body = strdup(strcmp(url, "/metrics") == 0 ? f->page : "");
    pthread_mutex_unlock(&f->mu);
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    enum MHD_Result rc = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return rc;
}

static void set_usage(struct fake *f, const char *usage)
{
    pthread_mutex_lock(&f->mu);
    snprintf(f->page, sizeof f->page,
             "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\"} 1.0\n"
             "vllm:kv_cache_usage_perc{engine=\"0\"} %s\n"
             "vllm:num_requests_running{engine=\"0\"} 3\n",
             usage);
    pthread_mutex_unlock(&f->mu);
}

static void fake_start(struct fake *f)
{
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    set_usage(f, "0.25");
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    f->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL, 0, NULL, NULL, answer,
                              f, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_END);
    ck_assert_ptr_nonnull(f->mhd);
    f->port = MHD_get_daemon_info(f->mhd, MHD_DAEMON_INFO_BIND_PORT)->port;
}

static void fake_stop(struct fake *f)
{
    MHD_stop_daemon(f->mhd);
    pthread_mutex_destroy(&f->mu);
}

/* A port nothing listens on. */
static int closed_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    close(fd);
    return ntohs(sa.sin_port);
}

static struct kvb_config *config(int port, uint32_t dead_after_ms)
{
    char path[] = "/tmp/check_engine.XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f,
            "worker_id: 7\nblock_size: 16\nsources:\n  - endpoint: tcp://127.0.0.1:5999\n"
            "    engine:\n      metrics_url: http://127.0.0.1:%d/metrics\n"
            "      scrape_interval_ms: 20\n      dead_after_ms: %u\n",
            port, dead_after_ms);
    fclose(f);
    struct kvb_config *c = NULL;
    ck_assert_int_eq(kvb_config_load(path, &c, stderr), 0);
    unlink(path);
    return c;
}

struct sent {
    int n;
    char subject[256];
    char body[512];
};

static int capture(void *ctx, const char *subject, const void *data, size_t len)
{
    struct sent *s = ctx;
    s->n++;
    snprintf(s->subject, sizeof s->subject, "%s", subject);
    snprintf(s->body, sizeof s->body, "%.*s", (int)len, (const char *)data);
    return 0;
}

/* Run the loop's side until pred or timeout. */
typedef bool (*pred_fn)(const struct kvb_metrics *m, const struct sent *s);
static void run_until(struct kvb_engines *e, struct kvb_metrics *m, struct sent *s, pred_fn pred,
                      bool batches, int timeout_ms, const char *what)
{
    uint64_t deadline = kvb_mono_ms() + (uint64_t)timeout_ms;
    while (!pred(m, s)) {
        uint64_t now = kvb_mono_ms();
        ck_assert_msg(now < deadline, "timed out waiting for: %s", what);
        if (batches)
            kvb_engines_note_batch(e, 0, now);
        struct pollfd p = {kvb_engines_fd(e), POLLIN, 0};
        if (poll(&p, 1, 20) > 0)
            kvb_engines_on_ready(e, NULL, 0, kvb_mono_ms(), false);
    }
}

static bool got_one(const struct kvb_metrics *m, const struct sent *s)
{
    (void)m;
    return s->n >= 1;
}
static bool half(const struct kvb_metrics *m, const struct sent *s)
{
    (void)m;
    return strstr(s->body, "\"kv_used_blocks\":500}") != NULL;
}
static bool gone(const struct kvb_metrics *m, const struct sent *s)
{
    (void)s;
    return kvb_get(&m->engine_gone_total[0]) >= 1;
}
static bool scraped_many(const struct kvb_metrics *m, const struct sent *s)
{
    (void)s;
    return kvb_get(&m->engine_scrape_failures_total[0]) >= 15;
}

START_TEST(test_load_messages)
{
    struct fake f;
    fake_start(&f);
    struct kvb_config *c = config(f.port, 1000);
    struct kvb_metrics *m = calloc(1, sizeof *m);
    struct sent s = {0};
    struct kvb_engines *e = NULL;
    ck_assert_int_eq(kvb_engines_create(c, m, capture, &s, &e), 0);
    ck_assert_uint_eq(kvb_engines_count(e), 1);
    run_until(e, m, &s, got_one, false, 5000, "a load message");
    ck_assert_str_eq(s.subject, "namespace.dynamo.component.backend.endpoint.generate.kv_metrics");
    ck_assert_str_eq(s.body, "{\"worker_id\":7,\"dp_rank\":0,\"active_decode_blocks\":null,"
                             "\"active_prefill_tokens\":null,\"scheduler_load_scope\":null,"
                             "\"kv_used_blocks\":250}");
    struct kvb_engine_slot *sl = kvb_metrics_engine_slot(m, "tcp://127.0.0.1:5999", 0);
    ck_assert_uint_eq(kvb_get(&sl->used_blocks), 250);
    ck_assert_uint_eq(kvb_get(&sl->total_blocks), 1000);
    ck_assert_uint_eq(kvb_get(&sl->running), 3);
    ck_assert_uint_eq(kvb_get(&sl->up), 1);
    /* no change: no new message within a few scrapes (the next is 10 s away) */
    int n = s.n;
    uint64_t until = kvb_mono_ms() + 150;
    while (kvb_mono_ms() < until) {
        struct pollfd p = {kvb_engines_fd(e), POLLIN, 0};
        if (poll(&p, 1, 20) > 0)
            kvb_engines_on_ready(e, NULL, 0, kvb_mono_ms(), false);
    }
    ck_assert_int_eq(s.n, n);
    ck_assert_uint_eq(kvb_get(&m->load_messages_published_total[0]), (uint64_t)n);
    set_usage(&f, "0.5");
    run_until(e, m, &s, half, false, 5000, "the changed load");
    ck_assert_int_eq(s.n, n + 1);
    kvb_engines_destroy(&e);
    ck_assert_ptr_null(e);
    fake_stop(&f);
    kvb_config_free(&c);
    free(m);
}
END_TEST

START_TEST(test_gone_once_and_back)
{
    int port = closed_port();
    struct kvb_config *c = config(port, 100);
    struct kvb_metrics *m = calloc(1, sizeof *m);
    struct sent s = {0};
    struct kvb_engines *e = NULL;
    ck_assert_int_eq(kvb_engines_create(c, m, capture, &s, &e), 0);
    /* batches keep arriving: a broken endpoint only, never gone */
    run_until(e, m, &s, scraped_many, true, 5000, "15 failed scrapes");
    ck_assert_uint_eq(kvb_get(&m->engine_gone_total[0]), 0);
    /* silence: gone, once */
    run_until(e, m, &s, gone, false, 5000, "gone");
    uint64_t t = kvb_get(&m->engine_scrape_failures_total[0]);
    while (kvb_get(&m->engine_scrape_failures_total[0]) < t + 10) {
        struct pollfd p = {kvb_engines_fd(e), POLLIN, 0};
        if (poll(&p, 1, 50) > 0)
            kvb_engines_on_ready(e, NULL, 0, kvb_mono_ms(), false);
    }
    ck_assert_uint_eq(kvb_get(&m->engine_gone_total[0]), 1);
    ck_assert_uint_eq(kvb_get(&m->engines_gone[0]), 1);
    struct kvb_engine_slot *sl = kvb_metrics_engine_slot(m, "tcp://127.0.0.1:5999", 0);
    ck_assert_uint_eq(kvb_get(&sl->gone), 1);
    ck_assert_uint_eq(kvb_get(&sl->up), 0);
    ck_assert_int_eq(s.n, 0);
    /* a batch: back */
    kvb_engines_note_batch(e, 0, kvb_mono_ms());
    while (kvb_get(&m->engines_gone[0]) != 0) {
        struct pollfd p = {kvb_engines_fd(e), POLLIN, 0};
        if (poll(&p, 1, 50) > 0)
            kvb_engines_on_ready(e, NULL, 0, kvb_mono_ms(), false);
    }
    ck_assert_uint_eq(kvb_get(&sl->gone), 0);
    kvb_engines_destroy(&e);
    kvb_config_free(&c);
    free(m);
}
END_TEST

START_TEST(test_no_url_no_engine)
{
    struct kvb_config *c = config(1, 100);
    free(c->sources[0].engine.metrics_url);
    c->sources[0].engine.metrics_url = strdup("");
    struct kvb_metrics *m = calloc(1, sizeof *m);
    struct kvb_engines *e = NULL;
    ck_assert_int_eq(kvb_engines_create(c, m, capture, NULL, &e), 0);
    ck_assert_uint_eq(kvb_engines_count(e), 0);
    ck_assert_int_eq(kvb_engines_fd(e), -1);
    kvb_engines_note_batch(e, 5, 1); /* out of range: ignored */
    kvb_engines_on_ready(e, NULL, 0, 1, false);
    ck_assert(kvb_engines_cfg_equal(c, c));
    kvb_engines_destroy(&e);
    kvb_config_free(&c);
    free(m);
}
END_TEST

static Suite *engine_suite(void)
{
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_load_messages);
    tcase_add_test(tc, test_gone_once_and_back);
    tcase_add_test(tc, test_no_url_no_engine);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(engine_suite()); }
