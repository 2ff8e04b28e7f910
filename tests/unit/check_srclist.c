/* srclist: GET /kv_event_sources bodies (the three shapes vLLM's route and
 * its clients use, wildcard hosts, disabled sources, every way a list is
 * unusable), the URL of a sources[].discover value, and the fetching
 * thread against a libmicrohttpd server started here (a list, a 503, a
 * bad body, a closed port). */
#include <check.h>

#include "testutil.h"
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>

#include "clock.h"
#include "srclist.h"

static struct kvb_srclist_list *parse_ok(const char *body, const char *host)
{
    struct kvb_srclist_list *l = NULL;
    const char *why = NULL;
    int rc = kvb_srclist_parse(body, strlen(body), host, &l, &why);
    ck_assert_msg(rc == 0, "%s: %d (%s)", body, rc, why ? why : "");
    ck_assert_ptr_nonnull(l);
    return l;
}

static void entry_is(const struct kvb_srclist_list *l, size_t i, uint32_t rank, const char *ep,
                     const char *rep, const char *topic)
{
    ck_assert_uint_lt(i, l->n);
    ck_assert_uint_eq(l->e[i].rank, rank);
    ck_assert_str_eq(l->e[i].endpoint, ep);
    ck_assert_str_eq(l->e[i].replay_endpoint, rep);
    ck_assert_str_eq(l->e[i].topic, topic);
}

/* A: vLLM's route as a bare array (its test: "not wrapped in an envelope") */
START_TEST(shape_array)
{
    struct kvb_srclist_list *l = parse_ok(
        "[{\"data_parallel_rank\": 1, \"endpoint\": \"tcp://10.0.0.1:41002\", "
        "\"replay_endpoint\": null, \"topic\": \"kv-events\"},\n"
        " {\"data_parallel_rank\": 0, \"endpoint\": \"tcp://10.0.0.1:41001\", "
        "\"replay_endpoint\": \"tcp://10.0.0.1:41003\", \"topic\": \"\", \"hwm\": 100000}]\n",
        "10.0.0.9");
    ck_assert_uint_eq(l->n, 2);
    entry_is(l, 0, 0, "tcp://10.0.0.1:41001", "tcp://10.0.0.1:41003", ""); /* sorted */
    entry_is(l, 1, 1, "tcp://10.0.0.1:41002", "", "kv-events");
    ck_assert_ptr_eq(kvb_srclist_find(l, 1), &l->e[1]);
    ck_assert_ptr_null(kvb_srclist_find(l, 2));
    free(l);
    l = parse_ok("[]", "h");
    ck_assert_uint_eq(l->n, 0);
    free(l);
}
END_TEST

/* B: {"sources": [...]}, with the wildcard hosts of its test data */
START_TEST(shape_envelope)
{
    struct kvb_srclist_list *l =
        parse_ok("{\"sources\": [{\"data_parallel_rank\": 0, \"endpoint\": \"tcp://0.0.0.0:41001\","
                 " \"replay_endpoint\": \"tcp://*:41003\"},"
                 " {\"data_parallel_rank\": 3, \"endpoint\": \"tcp://[::]:41004\"},"
                 " {\"data_parallel_rank\": 4, \"endpoint\": \"ipc:///run/vllm/kv4\","
                 " \"topic\": \"t\"}]}",
                 "engine-7.local");
    ck_assert_uint_eq(l->n, 3);
    entry_is(l, 0, 0, "tcp://engine-7.local:41001", "tcp://engine-7.local:41003", "");
    entry_is(l, 1, 3, "tcp://engine-7.local:41004", "", "");
    entry_is(l, 2, 4, "ipc:///run/vllm/kv4", "", "t");
    free(l);
    /* an IPv6 URL host (in brackets) */
    l = parse_ok("{\"sources\": [{\"data_parallel_rank\": 0, \"endpoint\": \"tcp://*:5557\"}]}",
                 "[fd00::7]");
    entry_is(l, 0, 0, "tcp://[fd00::7]:5557", "", "");
    free(l);
    l = parse_ok("{\"sources\": []}", "h");
    ck_assert_uint_eq(l->n, 0);
    free(l);
}
END_TEST

/* C: keyed by rank, each value a KV-events configuration; disabled ones out */
START_TEST(shape_rank_keyed)
{
    struct kvb_srclist_list *l =
        parse_ok("{\"1\": {\"publisher\": \"zmq\", \"enable_kv_cache_events\": true,"
                 " \"endpoint\": \"tcp://10.0.0.1:41233\", \"replay_endpoint\": "
                 "\"tcp://10.0.0.1:41234\", \"topic\": \"kv-events\", \"buffer_steps\": 10000},"
                 " \"0\": {\"publisher\": \"zmq\", \"endpoint\": \"tcp://10.0.0.1:41231\"},"
                 " \"2\": {\"publisher\": \"null\", \"endpoint\": \"tcp://*:5557\"},"
                 " \"3\": {\"enable_kv_cache_events\": false, \"endpoint\": \"tcp://*:5557\"}}",
                 "h");
    ck_assert_uint_eq(l->n, 2);
    entry_is(l, 0, 0, "tcp://10.0.0.1:41231", "", "");
    entry_is(l, 1, 1, "tcp://10.0.0.1:41233", "tcp://10.0.0.1:41234", "kv-events");
    free(l);
    l = parse_ok("{}", "h");
    ck_assert_uint_eq(l->n, 0);
    free(l);
}
END_TEST

/* Lists that are not used at all: each says why. */
START_TEST(unusable_lists)
{
    static const struct {
        const char *body, *why;
    } cases[] = {
        {"", "not JSON"},
        {"[{\"data_parallel_rank\": 0, \"endpoint\": \"tcp://h:1\"}", "not JSON"},
        {"[] x", "text after the JSON value"},
        {"\"tcp://h:1\"", "neither a JSON array nor an object"},
        {"[[[[[[[[[[]]]]]]]]]]", "the JSON nests too deep"},
        {"{\"sources\": {}}", "\"sources\" is not an array"},
        {"[7]", "a source is not a JSON object"},
        {"[{\"endpoint\": \"tcp://h:1\"}]", "a source has no integer data_parallel_rank"},
        {"[{\"data_parallel_rank\": -1, \"endpoint\": \"tcp://h:1\"}]",
         "a data_parallel_rank is not in 0..4294967295"},
        {"[{\"data_parallel_rank\": 4294967296, \"endpoint\": \"tcp://h:1\"}]",
         "a data_parallel_rank is not in 0..4294967295"},
        {"[{\"data_parallel_rank\": \"0\", \"endpoint\": \"tcp://h:1\"}]",
         "a source has no integer data_parallel_rank"},
        {"[{\"data_parallel_rank\": 0}]", "a source has no endpoint string (or one too long)"},
        {"[{\"data_parallel_rank\": 0, \"endpoint\": null}]",
         "a source has no endpoint string (or one too long)"},
        {"[{\"data_parallel_rank\": 0, \"endpoint\": \"tcp://h:0\"}]",
         "a tcp:// endpoint's port is not a number in 1..65535"},
        {"[{\"data_parallel_rank\": 0, \"endpoint\": \"tcp://h:65536\"}]",
         "a tcp:// endpoint's port is not a number in 1..65535"},
        {"[{\"data_parallel_rank\": 0, \"endpoint\": \"tcp://h:*\"}]",
         "a tcp:// endpoint's port is not a number in 1..65535"},
        {"[{\"data_parallel_rank\": 0, \"endpoint\": \"tcp://:5557\"}]",
         "a tcp:// endpoint has no HOST:PORT"},
        {"[{\"data_parallel_rank\": 0, \"endpoint\": \"inproc://kv\"}]",
         "an endpoint is neither tcp:// nor ipc://"},
        {"[{\"data_parallel_rank\": 0, \"endpoint\": \"tcp://h:1 \"}]",
         "an endpoint holds white space or a control character"},
        {"[{\"data_parallel_rank\": 0, \"endpoint\": \"tcp://h\\u0000:1\"}]",
         "a source has no endpoint string (or one too long)"},
        {"[{\"data_parallel_rank\": 0, \"endpoint\": \"tcp://h:1\", \"replay_endpoint\": 5}]",
         "a replay_endpoint is neither a string nor null (or is too long)"},
        {"[{\"data_parallel_rank\": 0, \"endpoint\": \"tcp://h:1\", \"topic\": null}]", NULL},
        {"[{\"data_parallel_rank\": 0, \"endpoint\": \"tcp://h:1\", \"topic\": 1}]",
         "a topic is not a string (or is too long, or holds a NUL)"},
        {"[{\"data_parallel_rank\": 1, \"endpoint\": \"tcp://h:1\"},"
         " {\"data_parallel_rank\": 1, \"endpoint\": \"tcp://h:2\"}]",
         "a rank is listed twice"},
        {"{\"x\": {\"endpoint\": \"tcp://h:1\"}}",
         "a key of the rank-keyed object is not a rank (0..4294967295)"},
        {"{\"01\": {\"endpoint\": \"tcp://h:1\"}}",
         "a key of the rank-keyed object is not a rank (0..4294967295)"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct kvb_srclist_list *l = NULL;
        const char *why = NULL;
        int rc = kvb_srclist_parse(cases[i].body, strlen(cases[i].body), "h", &l, &why);
        if (!cases[i].why) { /* a null topic is none */
            ck_assert_int_eq(rc, 0);
            free(l);
            continue;
        }
        ck_assert_msg(rc == -EINVAL, "%s: rc %d", cases[i].body, rc);
        ck_assert_ptr_null(l);
        ck_assert_msg(why && strcmp(why, cases[i].why) == 0, "%s: why '%s', want '%s'",
                      cases[i].body, why ? why : "(none)", cases[i].why);
    }
    /* more sources than taken */
    size_t cap = (KVB_SRCLIST_MAX_RANKS + 1) * 64 + 8, n = 0;
    char *big = malloc(cap);
    ck_assert_ptr_nonnull(big);
    n += (size_t)snprintf(big + n, cap - n, "[");
    for (int r = 0; r <= KVB_SRCLIST_MAX_RANKS; r++)
        n += (size_t)snprintf(big + n, cap - n,
                              "%s{\"data_parallel_rank\":%d,\"endpoint\":\"tcp://h:%d\"}",
                              r ? "," : "", r, 1000 + r);
    n += (size_t)snprintf(big + n, cap - n, "]");
    struct kvb_srclist_list *l = NULL;
    const char *why = NULL;
    ck_assert_int_eq(kvb_srclist_parse(big, n, "h", &l, &why), -EINVAL);
    ck_assert_str_eq(why, "more sources than kvbridge takes");
    free(big);
}
END_TEST

START_TEST(discover_url)
{
    static const struct {
        const char *value, *url;
    } cases[] = {
        {"http://127.0.0.1:8000", "http://127.0.0.1:8000/kv_event_sources"},
        {"http://127.0.0.1:8000/", "http://127.0.0.1:8000/kv_event_sources"},
        {"https://[fd00::1]:8443", "https://[fd00::1]:8443/kv_event_sources"},
        {"http://h:8000/v1/kv_event_sources", "http://h:8000/v1/kv_event_sources"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *u = kvb_srclist_url(cases[i].value);
        ck_assert_str_eq(u, cases[i].url);
        free(u);
    }
}
END_TEST

/* ---- fetching ------------------------------------------------------------ */

static const char *body_of = "[{\"data_parallel_rank\": 0, \"endpoint\": \"tcp://*:41001\"}]";
static atomic_int hits;

static enum MHD_Result answer(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **req_cls)
{
    (void)cls;
    (void)method;
    (void)version;
    (void)upload;
    (void)upload_size;
    static int first_call;
    if (*req_cls == NULL) {
        *req_cls = &first_call;
        return MHD_YES;
    }
    atomic_fetch_add(&hits, 1);
    unsigned status = MHD_HTTP_OK;
    const char *body = "";
    if (strcmp(url, "/kv_event_sources") == 0)
        body = body_of;
    else if (strcmp(url, "/bad") == 0)
        body = "{\"sources\": 7}";
    else
        status = MHD_HTTP_SERVICE_UNAVAILABLE;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

/* Target I's next result (within 5 s). */
static struct kvb_srclist_result next(struct kvb_srclist *l, size_t i)
{
    struct kvb_srclist_result r;
    uint64_t deadline = kvb_mono_ms() + 5000;
    for (;;) {
        int rc = kvb_srclist_take(l, i, &r);
        ck_assert_int_ge(rc, 0);
        if (rc == 1)
            return r;
        uint64_t now = kvb_mono_ms();
        ck_assert_msg(now < deadline, "no result for target %zu", i);
        struct pollfd p = {kvb_srclist_fd(l), POLLIN, 0};
        if (poll(&p, 1, (int)(deadline - now)) > 0)
            kvb_srclist_ack(l);
    }
}

START_TEST(fetch)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct MHD_Daemon *mhd =
        MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL, 0, NULL, NULL, answer,
                         NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_END);
    ck_assert_ptr_nonnull(mhd);
    int port = MHD_get_daemon_info(mhd, MHD_DAEMON_INFO_BIND_PORT)->port;
    char u[4][96];
    snprintf(u[0], sizeof(u[0]), "http://127.0.0.1:%d/kv_event_sources", port);
    snprintf(u[1], sizeof(u[1]), "http://127.0.0.1:%d/starting", port);
    snprintf(u[2], sizeof(u[2]), "http://127.0.0.1:%d/bad", port);
    int closed = 0, fd = -1;
    { /* a port nobody listens on: bound, then closed */
        fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in c = sa;
        socklen_t sl = sizeof(c);
        ck_assert_int_eq(bind(fd, (struct sockaddr *)&c, sizeof(c)), 0);
        ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&c, &sl), 0);
        closed = ntohs(c.sin_port);
        close(fd);
    }
    snprintf(u[3], sizeof(u[3]), "http://127.0.0.1:%d/kv_event_sources", closed);
    struct kvb_srclist_target t[4] = {{"ok", u[0]}, {"503", u[1]}, {"bad", u[2]}, {"down", u[3]}};
    static struct kvb_metrics m;
    memset(&m, 0, sizeof(m));
    struct kvb_srclist *l = NULL;
    ck_assert_int_eq(kvb_srclist_create(t, 4, &m, &l), 0);
    struct kvb_srclist_result r;
    ck_assert_int_eq(kvb_srclist_take(l, 0, &r), 0); /* nothing before it is asked */
    for (size_t i = 0; i < 4; i++)
        kvb_srclist_ask(l, i);
    r = next(l, 0);
    ck_assert_int_eq(r.err, 0);
    ck_assert_int_eq(r.status, 200);
    ck_assert_uint_eq(r.list->n, 1);
    ck_assert_str_eq(r.list->e[0].endpoint, "tcp://127.0.0.1:41001"); /* the URL's host */
    free(r.list);
    r = next(l, 1);
    ck_assert_int_eq(r.err, -EPROTO);
    ck_assert_int_eq(r.status, 503);
    ck_assert_ptr_null(r.list);
    r = next(l, 2);
    ck_assert_int_eq(r.err, -EINVAL);
    ck_assert_str_eq(r.why, "\"sources\" is not an array");
    r = next(l, 3);
    ck_assert_int_eq(r.err, -ECONNREFUSED);
    ck_assert_uint_eq(kvb_get(&m.source_list_reads_total[0]), 1);
    ck_assert_uint_eq(kvb_get(&m.source_list_failures_total[KVB_LF_STATUS]), 1);
    ck_assert_uint_eq(kvb_get(&m.source_list_failures_total[KVB_LF_BODY]), 1);
    ck_assert_uint_eq(kvb_get(&m.source_list_failures_total[KVB_LF_UNREACHABLE]), 1);
    /* asked again: read again */
    int before = atomic_load(&hits);
    kvb_srclist_ask(l, 0);
    r = next(l, 0);
    ck_assert_int_eq(r.err, 0);
    free(r.list);
    ck_assert_int_eq(atomic_load(&hits), before + 1);
    kvb_srclist_ask(l, 0); /* in flight at destroy: abandoned */
    uint64_t t0 = kvb_mono_ms();
    kvb_srclist_destroy(&l);
    ck_assert_ptr_null(l);
    ck_assert_uint_lt(kvb_mono_ms() - t0, 1000);
    MHD_stop_daemon(mhd);
    /* a URL that is not http(s) */
    struct kvb_srclist_target bad = {"x", "ftp://h/x"};
    ck_assert_int_eq(kvb_srclist_create(&bad, 1, &m, &l), -EINVAL);
    ck_assert_ptr_null(l);
}
END_TEST

static Suite *srclist_suite(void)
{
    Suite *s = suite_create("srclist");
    TCase *tc = tcase_create("parse");
    tcase_add_test(tc, shape_array);
    tcase_add_test(tc, shape_envelope);
    tcase_add_test(tc, shape_rank_keyed);
    tcase_add_test(tc, unusable_lists);
    tcase_add_test(tc, discover_url);
    suite_add_tcase(s, tc);
    tc = tcase_create("fetch");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, fetch);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(srclist_suite()); }
