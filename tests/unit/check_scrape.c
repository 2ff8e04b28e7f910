/* scrape: the scraper against a libmicrohttpd server started here (serving
 * tests/data/metrics/vllm.txt, a 500, a health page), a socket that accepts
 * and never answers (timeout), a closed port, a server that stops; and the
 * liveness rule (pure). */
#include <check.h>

#include "testutil.h"
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "clock.h"
#include "engine/scrape.h"

/* ---- a tiny engine ---------------------------------------------------------- */

struct engine {
    struct MHD_Daemon *mhd;
    int port;
    char *page;
    size_t page_len;
    atomic_uint metrics_hits, health_hits, connections;
};

static void on_conn(void *cls, struct MHD_Connection *c, void **socket_context,
                    enum MHD_ConnectionNotificationCode code)
{
    (void)c;
    (void)socket_context;
    struct engine *e = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED)
        atomic_fetch_add(&e->connections, 1);
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **req_cls)
{
    (void)method;
    (void)version;
    (void)upload;
    (void)upload_size;
    static int first_call;
    if (*req_cls == NULL) { /* headers only: answer on the next call, or
                               MHD closes the connection after the answer */
        *req_cls = &first_call;
        return MHD_YES;
    }
    struct engine *e = cls;
    unsigned status = MHD_HTTP_OK;
    const char *body = "";
    size_t len = 0;
    if (strcmp(url, "/metrics") == 0) {
        atomic_fetch_add(&e->metrics_hits, 1);
        body = e->page;
        len = e->page_len;
    } else if (strcmp(url, "/health") == 0) {
        atomic_fetch_add(&e->health_hits, 1);
    } else if (strcmp(url, "/500") == 0) {
        status = MHD_HTTP_INTERNAL_SERVER_ERROR;
        body = "boom";
        len = 4;
    } else {
        status = MHD_HTTP_NOT_FOUND;
    }
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static void engine_start(struct engine *e)
{
    memset(e, 0, sizeof(*e));
    e->page = (char *)read_all("tests/data/metrics/vllm.txt", &e->page_len);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    e->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL, 0, NULL, NULL, answer,
                              e, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                              MHD_OPTION_NOTIFY_CONNECTION, on_conn, e, MHD_OPTION_END);
    ck_assert_ptr_nonnull(e->mhd);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(e->mhd, MHD_DAEMON_INFO_BIND_PORT);
    ck_assert_ptr_nonnull(di);
    e->port = di->port;
}

static void engine_stop(struct engine *e)
{
    if (e->mhd)
        MHD_stop_daemon(e->mhd);
    e->mhd = NULL;
}

static void engine_free(struct engine *e)
{
    engine_stop(e);
    free(e->page);
}

static char *url(int port, const char *path)
{
    static char buf[4][64];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, 64, "http://127.0.0.1:%d%s", port, path);
    return b;
}

/* A listening socket nobody accepts on: connects succeed (the kernel's
 * backlog), requests get no answer. */
static int black_hole(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_int_eq(listen(fd, 16), 0);
    socklen_t sl = sizeof(sa);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    *port = ntohs(sa.sin_port);
    return fd;
}

/* ---- waiting for results ------------------------------------------------------ */

typedef bool (*pred_fn)(const struct kvb_scrape_result *r);

/* Poll the scraper's fd until target i's result satisfies pred (copied to
 * *out), or fail after timeout_ms. */
static void wait_for(struct kvb_scrape *s, size_t i, pred_fn pred, struct kvb_scrape_result *out,
                     int timeout_ms, const char *what)
{
    uint64_t deadline = kvb_mono_ms() + (uint64_t)timeout_ms;
    for (;;) {
        int rc = kvb_scrape_take(s, i, out);
        ck_assert_int_ge(rc, 0);
        if (rc == 1 && pred(out))
            return;
        uint64_t now = kvb_mono_ms();
        ck_assert_msg(now < deadline, "timed out waiting for: %s", what);
        struct pollfd p = {kvb_scrape_fd(s), POLLIN, 0};
        if (poll(&p, 1, (int)(deadline - now)) > 0)
            kvb_scrape_ack(s);
    }
}

static bool loaded(const struct kvb_scrape_result *r) { return r->has_load && r->rounds >= 1; }
static bool three_ok(const struct kvb_scrape_result *r)
{
    return r->rounds >= 3 && r->consecutive_failures == 0;
}
static bool four_ok(const struct kvb_scrape_result *r)
{
    return r->rounds >= 4 && r->consecutive_failures == 0;
}
static bool failed(const struct kvb_scrape_result *r) { return r->consecutive_failures >= 1; }
static bool failed2(const struct kvb_scrape_result *r) { return r->consecutive_failures >= 2; }
static bool any_round(const struct kvb_scrape_result *r) { return r->rounds >= 1; }

static struct kvb_scrape_result *res_new(void)
{
    struct kvb_scrape_result *r = calloc(1, sizeof(*r));
    ck_assert_ptr_nonnull(r);
    return r;
}

/* ---- tests -------------------------------------------------------------------- */

START_TEST(test_scrapes_vllm)
{
    struct engine e;
    engine_start(&e);
    struct kvb_scrape_target t = {.name = "vllm0",
                                  .kind = KVB_ENGINE_VLLM,
                                  .metrics_url = url(e.port, "/metrics"),
                                  .health_url = url(e.port, "/health"),
                                  .interval_ms = 300};
    struct kvb_scrape *s = NULL;
    ck_assert_int_eq(kvb_scrape_create(&t, 1, &s), 0);
    ck_assert_uint_eq(kvb_scrape_count(s), 1);
    struct kvb_scrape_result *r = res_new();
    wait_for(s, 0, loaded, r, 5000, "a parsed page");
    ck_assert(r->has_url);
    ck_assert_int_eq(r->last_status, 200);
    ck_assert_uint_eq(r->consecutive_failures, 0);
    ck_assert_uint_ge(r->last_ok_ms, r->started_ms);
    ck_assert_uint_eq(r->load.n_ranks, 2);
    ck_assert_uint_eq(r->load.prom.malformed, 0);
    const struct kvb_rank_load *r0 = kvb_engine_load_rank(&r->load, 0);
    ck_assert_ptr_nonnull(r0);
    ck_assert(fabs(r0->v[KVB_LOAD_KV_USAGE] - 0.6234) < 1e-9);
    ck_assert(fabs(r0->v[KVB_LOAD_USED_BLOCKS] - round(0.6234 * 27473)) < 1e-9);
    wait_for(s, 0, four_ok, r, 5000, "four rounds");
    ck_assert_uint_ge(atomic_load(&e.metrics_hits), 4);
    ck_assert_uint_ge(atomic_load(&e.health_hits), 4);
    /* nothing new until the next round: take() says so */
    struct kvb_scrape_result *r2 = res_new();
    while (kvb_scrape_take(s, 0, r2) == 1)
        ;
    ck_assert_int_eq(kvb_scrape_take(s, 0, r2), 0);
    ck_assert_int_eq(kvb_scrape_take(s, 1, r2), -EINVAL);
    kvb_scrape_destroy(&s);
    ck_assert_ptr_null(s);
    kvb_scrape_destroy(&s);
    /* connections are kept alive: the two requests of a round may need two,
     * later rounds reuse them (unless a request failed, e.g. timed out on a
     * slow machine or under valgrind: then its connection was closed) */
    unsigned reqs = atomic_load(&e.metrics_hits) + atomic_load(&e.health_hits);
    if (r->last_error == 0)
        ck_assert_msg(atomic_load(&e.connections) <= reqs / 2, "%u connections for %u requests",
                      atomic_load(&e.connections), reqs);
    engine_free(&e);
    free(r);
    free(r2);
}
END_TEST

START_TEST(test_status_500)
{
    struct engine e;
    engine_start(&e);
    struct kvb_scrape_target t = {.name = "e",
                                  .kind = KVB_ENGINE_VLLM,
                                  .metrics_url = url(e.port, "/500"),
                                  .interval_ms = 50};
    struct kvb_scrape *s = NULL;
    ck_assert_int_eq(kvb_scrape_create(&t, 1, &s), 0);
    struct kvb_scrape_result *r = res_new();
    wait_for(s, 0, failed2, r, 5000, "two failed rounds");
    ck_assert_int_eq(r->last_error, -EPROTO);
    ck_assert_int_eq(r->last_status, 500);
    ck_assert(!r->has_load);
    ck_assert_uint_eq(r->last_ok_ms, 0);
    ck_assert_uint_ge(r->failed_rounds, 2);
    kvb_scrape_destroy(&s);
    engine_free(&e);
    free(r);
}
END_TEST

/* The health URL answers, the metrics URL does not: the engine is there
 * (the round is answered), but there is no load. */
START_TEST(test_health_answers)
{
    struct engine e;
    engine_start(&e);
    struct kvb_scrape_target t = {.name = "e",
                                  .kind = KVB_ENGINE_VLLM,
                                  .metrics_url = url(e.port, "/500"),
                                  .health_url = url(e.port, "/health"),
                                  .interval_ms = 50};
    struct kvb_scrape *s = NULL;
    ck_assert_int_eq(kvb_scrape_create(&t, 1, &s), 0);
    struct kvb_scrape_result *r = res_new();
    wait_for(s, 0, three_ok, r, 5000, "three answered rounds");
    ck_assert(!r->has_load);
    ck_assert_uint_gt(r->last_ok_ms, 0);
    ck_assert_int_eq(r->last_status, 500);
    kvb_scrape_destroy(&s);
    engine_free(&e);
    free(r);
}
END_TEST

START_TEST(test_timeout)
{
    int port, fd = black_hole(&port);
    struct kvb_scrape_target t = {.name = "e",
                                  .kind = KVB_ENGINE_SGLANG,
                                  .metrics_url = url(port, "/metrics"),
                                  .interval_ms = 200,
                                  .timeout_ms = 100};
    struct kvb_scrape *s = NULL;
    uint64_t t0 = kvb_mono_ms();
    ck_assert_int_eq(kvb_scrape_create(&t, 1, &s), 0);
    struct kvb_scrape_result *r = res_new();
    wait_for(s, 0, failed, r, 5000, "a timed-out round");
    ck_assert_int_eq(r->last_error, -ETIMEDOUT);
    ck_assert_uint_ge(r->last_duration_ms, 90);
    ck_assert_uint_lt(r->last_duration_ms, 1000);
    ck_assert_uint_ge(kvb_mono_ms() - t0, 90);
    ck_assert(!r->has_load);
    kvb_scrape_destroy(&s); /* with a request in flight, maybe */
    close(fd);
    free(r);
}
END_TEST

START_TEST(test_too_big)
{
    struct engine e;
    engine_start(&e);
    struct kvb_scrape_target t = {.name = "e",
                                  .kind = KVB_ENGINE_VLLM,
                                  .metrics_url = url(e.port, "/metrics"),
                                  .interval_ms = 50,
                                  .max_bytes = 1000};
    struct kvb_scrape *s = NULL;
    ck_assert_int_eq(kvb_scrape_create(&t, 1, &s), 0);
    struct kvb_scrape_result *r = res_new();
    wait_for(s, 0, failed, r, 5000, "a refused page");
    ck_assert_int_eq(r->last_error, -EFBIG);
    ck_assert(!r->has_load);
    kvb_scrape_destroy(&s);
    engine_free(&e);
    free(r);
}
END_TEST

/* Answers, then the server goes away: rounds fail (connection refused),
 * the last load stays with its time. */
START_TEST(test_stops_answering)
{
    struct engine e;
    engine_start(&e);
    struct kvb_scrape_target t[2] = {
        {.name = "a",
         .kind = KVB_ENGINE_VLLM,
         .metrics_url = url(e.port, "/metrics"),
         .interval_ms = 50},
        {.name = "closed",
         .kind = KVB_ENGINE_VLLM,
         .metrics_url = NULL,
         .health_url = NULL,
         .interval_ms = 50},
    };
    struct kvb_scrape *s = NULL;
    ck_assert_int_eq(kvb_scrape_create(t, 2, &s), 0);
    struct kvb_scrape_result *r = res_new();
    wait_for(s, 0, loaded, r, 5000, "a parsed page");
    uint64_t load_ms = r->load_ms, ok_ms = r->last_ok_ms;
    engine_stop(&e);
    wait_for(s, 0, failed2, r, 5000, "failed rounds after the stop");
    ck_assert_msg(r->last_error == -ECONNREFUSED || r->last_error == -ECONNRESET, "last_error %d",
                  r->last_error);
    ck_assert(r->has_load);
    ck_assert_uint_ge(r->load_ms, load_ms);
    ck_assert_uint_ge(r->last_ok_ms, ok_ms);
    ck_assert_uint_lt(r->last_ok_ms, r->last_round_ms);
    /* the target without URLs is never scraped */
    struct kvb_scrape_result *r1 = res_new();
    ck_assert_int_eq(kvb_scrape_take(s, 1, r1), 0);
    kvb_scrape_destroy(&s);
    engine_free(&e);
    free(r);
    free(r1);
}
END_TEST

START_TEST(test_closed_port)
{
    int port, fd = black_hole(&port);
    close(fd); /* nothing listens there now */
    struct kvb_scrape_target t = {.name = "e",
                                  .kind = KVB_ENGINE_VLLM,
                                  .health_url = url(port, "/health"),
                                  .interval_ms = 50};
    struct kvb_scrape *s = NULL;
    ck_assert_int_eq(kvb_scrape_create(&t, 1, &s), 0);
    struct kvb_scrape_result *r = res_new();
    wait_for(s, 0, any_round, r, 5000, "a round");
    ck_assert_int_eq(r->last_error, -ECONNREFUSED);
    ck_assert_uint_lt(r->last_duration_ms, 1000);
    kvb_scrape_destroy(&s);
    free(r);
}
END_TEST

START_TEST(test_invalid)
{
    struct kvb_scrape *s = NULL;
    struct kvb_scrape_target t = {.name = "e",
                                  .kind = KVB_ENGINE_VLLM,
                                  .metrics_url = "http://127.0.0.1:1/metrics",
                                  .interval_ms = 5};
    ck_assert_int_eq(kvb_scrape_create(&t, 1, &s), -EINVAL);
    t.interval_ms = 500;
    t.timeout_ms = 501;
    ck_assert_int_eq(kvb_scrape_create(&t, 1, &s), -EINVAL);
    t.timeout_ms = 0;
    t.kind = (enum kvb_engine_kind)9;
    ck_assert_int_eq(kvb_scrape_create(&t, 1, &s), -EINVAL);
    ck_assert_ptr_null(s);
    ck_assert_int_eq(kvb_scrape_create(NULL, 0, &s), 0); /* no targets: an idle thread */
    ck_assert_uint_eq(kvb_scrape_count(s), 0);
    kvb_scrape_destroy(&s);
}
END_TEST

/* ---- liveness ----------------------------------------------------------------- */

static enum kvb_live_event judge(struct kvb_liveness *st, bool failing, uint64_t last_ok,
                                 uint64_t last_batch, uint64_t now)
{
    struct kvb_live_input in = {true, failing, last_ok, 1000, last_batch, now, 10000};
    return kvb_liveness_judge(st, &in);
}

START_TEST(test_liveness_rule)
{
    struct kvb_liveness st = {0};
    /* never answered since watching began at 1000, no batch: gone after
     * dead_after_ms, once */
    ck_assert_int_eq(judge(&st, true, 0, 0, 10999), KVB_LIVE_SAME);
    ck_assert_int_eq(judge(&st, true, 0, 0, 11000), KVB_LIVE_GONE);
    ck_assert_int_eq(judge(&st, true, 0, 0, 11500), KVB_LIVE_SAME);
    ck_assert_int_eq(judge(&st, true, 0, 0, 99000), KVB_LIVE_SAME);
    /* answers again: back, once, nothing else */
    ck_assert_int_eq(judge(&st, false, 99500, 0, 99500), KVB_LIVE_BACK);
    ck_assert_int_eq(judge(&st, false, 100000, 0, 100000), KVB_LIVE_SAME);
    /* idle engine that answers: never gone, however long without batches */
    ck_assert_int_eq(judge(&st, false, 900000, 0, 900000), KVB_LIVE_SAME);
    /* endpoint failing for 10 s but batches still arrive: not gone */
    ck_assert_int_eq(judge(&st, true, 900000, 905000, 910000), KVB_LIVE_SAME);
    ck_assert_int_eq(judge(&st, true, 900000, 909999, 919000), KVB_LIVE_SAME);
    /* ... until the batches stop too for dead_after_ms: a second outage */
    ck_assert_int_eq(judge(&st, true, 900000, 909999, 919999), KVB_LIVE_GONE);
    ck_assert_int_eq(judge(&st, true, 900000, 909999, 925000), KVB_LIVE_SAME);
    /* a batch while gone (endpoint still failing): back */
    ck_assert_int_eq(judge(&st, true, 900000, 926000, 926000), KVB_LIVE_BACK);
    ck_assert_int_eq(judge(&st, true, 900000, 926000, 930000), KVB_LIVE_SAME);
    /* failing, but the last answer is recent: not yet */
    ck_assert_int_eq(judge(&st, true, 935000, 0, 944999), KVB_LIVE_SAME);
    ck_assert_int_eq(judge(&st, true, 935000, 0, 945000), KVB_LIVE_GONE);
}
END_TEST

START_TEST(test_liveness_edges)
{
    /* without a URL no judgement, ever */
    struct kvb_liveness st = {0};
    struct kvb_live_input in = {false, true, 0, 0, 0, 10000000, 10000};
    ck_assert_int_eq(kvb_liveness_judge(&st, &in), KVB_LIVE_SAME);
    ck_assert(!st.gone);
    /* the last round answered (not failing): never gone, even if the
     * recorded times are old (a late result) */
    struct kvb_live_input ok = {true, false, 1, 1, 0, 10000000, 10000};
    ck_assert_int_eq(kvb_liveness_judge(&st, &ok), KVB_LIVE_SAME);
    /* times in the future (clock read before the result was written) */
    struct kvb_live_input fut = {true, true, 5000, 0, 0, 4000, 10000};
    ck_assert_int_eq(kvb_liveness_judge(&st, &fut), KVB_LIVE_SAME);
    /* from a scrape result */
    struct kvb_scrape_result *r = res_new();
    r->has_url = true;
    r->started_ms = 100;
    r->rounds = 3;
    r->consecutive_failures = 3;
    struct kvb_live_input x = kvb_live_input_of(r, 0, 10100, 10000);
    ck_assert(x.has_url && x.failing && x.since_ms == 100 && x.dead_after_ms == 10000);
    ck_assert_int_eq(kvb_liveness_judge(&st, &x), KVB_LIVE_GONE);
    r->rounds = 0; /* no round finished yet: not failing */
    x = kvb_live_input_of(r, 0, 10100, 10000);
    ck_assert(!x.failing);
    free(r);
}
END_TEST

static Suite *scrape_suite(void)
{
    Suite *s = suite_create("scrape");
    TCase *tc = tcase_create("scrape");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_scrapes_vllm);
    tcase_add_test(tc, test_status_500);
    tcase_add_test(tc, test_health_answers);
    tcase_add_test(tc, test_timeout);
    tcase_add_test(tc, test_too_big);
    tcase_add_test(tc, test_stops_answering);
    tcase_add_test(tc, test_closed_port);
    tcase_add_test(tc, test_invalid);
    tcase_add_test(tc, test_liveness_rule);
    tcase_add_test(tc, test_liveness_edges);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(scrape_suite()); }
