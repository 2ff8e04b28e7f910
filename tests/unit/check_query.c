/* query: request parsing (json-c), the hand-off to a "loop" thread that owns
 * the mirror, the answers' lines (dump, events, match, errors), close and
 * the wait limit. */
#include "testutil.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <json-c/json.h>

#include "mirror/index.h"
#include "query.h"

#define W 7u

START_TEST(parse_json)
{
    struct kvb_query_req r;
    char err[256];
    const char *ok = "{\"op\":\"events\",\"worker_id\":18446744073709551615,\"dp_rank\":3,"
                     "\"since\":\"12\",\"extra\":{\"x\":1}}";
    ck_assert_int_eq(kvb_query_parse_json(ok, strlen(ok), -1, &r, err, sizeof(err)), 0);
    ck_assert_int_eq(r.op, KVB_QOP_EVENTS);
    ck_assert(r.has_worker);
    ck_assert_uint_eq(r.worker_id, UINT64_MAX);
    ck_assert_uint_eq(r.dp_rank, 3);
    ck_assert(r.has_since);
    ck_assert_uint_eq(r.since, 12);
    kvb_query_req_free(&r);

    const char *m = "{\"worker_id\":7,\"token_ids\":[1,2,3],\"lora_name\":\"adapter-a\"}";
    ck_assert_int_eq(kvb_query_parse_json(m, strlen(m), KVB_QOP_MATCH, &r, err, sizeof(err)), 0);
    ck_assert_int_eq(r.op, KVB_QOP_MATCH);
    ck_assert_uint_eq(r.n_tokens, 3);
    ck_assert_uint_eq(r.tokens[2], 3);
    ck_assert_str_eq(r.lora_name, "adapter-a");
    ck_assert_int_eq(kvb_query_check(&r, err, sizeof(err)), 0);
    kvb_query_req_free(&r);

    static const char *const bad[] = {
        "{\"op\":\"dump\"",
        "[1]",
        "{\"op\":\"nope\"}",
        "{\"worker_id\":1}",
        "{\"op\":\"dump\",\"worker_id\":-1}",
        "{\"op\":\"dump\",\"dp_rank\":4294967296}",
        "{\"op\":\"dump\",\"worker_id\":1.5}",
        "{\"op\":\"dump\",\"worker_id\":\"1x\"}",
        "{\"op\":\"match\",\"token_ids\":[1,-2]}",
        "{\"op\":\"match\",\"token_ids\":[4294967296]}",
        "{\"op\":\"dump\"} x",
        "{\"op\":\"match\",\"lora_name\":3}",
        "{\"op\":\"match\",\"block_size\":0}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        ck_assert_msg(kvb_query_parse_json(bad[i], strlen(bad[i]), -1, &r, err, sizeof(err)) ==
                          -EINVAL,
                      "accepted %s", bad[i]);
        ck_assert_msg(err[0], "no message for %s", bad[i]);
        ck_assert_ptr_null(r.tokens);
    }
    /* events needs since, match needs token_ids */
    const char *ev = "{\"op\":\"events\"}";
    ck_assert_int_eq(kvb_query_parse_json(ev, strlen(ev), -1, &r, err, sizeof(err)), 0);
    ck_assert_int_eq(kvb_query_check(&r, err, sizeof(err)), -EINVAL);
    kvb_query_req_free(&r);
}
END_TEST

START_TEST(parse_params)
{
    struct kvb_query_req r = {.op = KVB_QOP_EVENTS};
    char err[256];
    ck_assert_int_eq(kvb_query_parse_param("worker_id", "42", &r, err, sizeof(err)), 0);
    ck_assert_int_eq(kvb_query_parse_param("dp_rank", "1", &r, err, sizeof(err)), 0);
    ck_assert_int_eq(kvb_query_parse_param("since", "18446744073709551615", &r, err, sizeof(err)),
                     0);
    ck_assert_int_eq(kvb_query_parse_param("other", "x", &r, err, sizeof(err)), 0);
    ck_assert_uint_eq(r.worker_id, 42);
    ck_assert_uint_eq(r.since, UINT64_MAX);
    ck_assert_int_eq(kvb_query_parse_param("since", "18446744073709551616", &r, err, sizeof(err)),
                     -EINVAL);
    ck_assert_int_eq(kvb_query_parse_param("dp_rank", "4294967296", &r, err, sizeof(err)), -EINVAL);
    ck_assert_int_eq(kvb_query_parse_param("worker_id", "", &r, err, sizeof(err)), -EINVAL);
    ck_assert_int_eq(kvb_query_parse_param("worker_id", "+1", &r, err, sizeof(err)), -EINVAL);
}
END_TEST

/* ---- a loop thread that owns a mirror -------------------------------------- */

struct loop {
    struct kvb_query *q;
    struct kvb_index *m;
    int wake;
    atomic_bool stop, paused;
    pthread_mutex_t mu; /* held while serving: the mirror is the loop's */
    pthread_t th;
};

static void *loop_main(void *arg)
{
    struct loop *l = arg;
    while (!atomic_load(&l->stop)) {
        struct pollfd p = {l->wake, POLLIN, 0};
        if (poll(&p, 1, 20) > 0 && !atomic_load(&l->paused)) {
            uint64_t v;
            ck_assert_int_eq(read(l->wake, &v, sizeof(v)), (int)sizeof(v));
            pthread_mutex_lock(&l->mu);
            kvb_query_serve(l->q, l->m);
            pthread_mutex_unlock(&l->mu);
        }
    }
    return NULL;
}

static struct kvb_metrics metrics;

static void loop_start(struct loop *l, uint32_t wait_ms)
{
    memset(l, 0, sizeof(*l));
    pthread_mutex_init(&l->mu, NULL);
    struct kvb_index_cfg mc = {1000, 8};
    ck_assert_int_eq(kvb_index_create(&mc, &l->m), 0);
    l->wake = eventfd(0, EFD_NONBLOCK);
    ck_assert_int_ge(l->wake, 0);
    struct kvb_query_cfg qc = {
        .worker_id = W, .block_size = 4, .lora_salt = true, .wait_ms = wait_ms};
    ck_assert_int_eq(kvb_query_create(&qc, &metrics, l->wake, &l->q), 0);
    ck_assert_int_eq(pthread_create(&l->th, NULL, loop_main, l), 0);
}

static void loop_stop(struct loop *l)
{
    atomic_store(&l->stop, true);
    pthread_join(l->th, NULL);
    kvb_query_close(l->q);
    kvb_query_destroy(&l->q);
    kvb_index_destroy(&l->m);
    close(l->wake);
    pthread_mutex_destroy(&l->mu);
}

static uint64_t next_id;

/* Applied as the loop would: not while it serves. */
static void apply(struct loop *l, const struct kvb_rev *r)
{
    pthread_mutex_lock(&l->mu);
    ck_assert_int_eq(kvb_index_apply(l->m, r), 0);
    pthread_mutex_unlock(&l->mu);
}

static void store_chain(struct loop *l, const uint64_t *hashes, const uint64_t *th, uint32_t n,
                        bool has_parent, uint64_t parent)
{
    struct kvb_block b[16];
    for (uint32_t i = 0; i < n; i++)
        b[i] = (struct kvb_block){hashes[i], th[i]};
    struct kvb_rev r = {.type = KVB_REVT_STORED,
                        .worker_id = W,
                        .event_id = next_id++,
                        .has_parent = has_parent,
                        .parent = parent,
                        .blocks = b,
                        .n = n};
    apply(l, &r);
}

/* Every line of an answer, '\n'-joined, into a malloc'ed string. */
static char *all_lines(struct kvb_query_answer *a, int *n_lines)
{
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    const char *d;
    size_t n;
    int rc;
    *n_lines = 0;
    while ((rc = kvb_query_answer_line(a, &d, &n)) == 1) {
        fwrite(d, 1, n, f);
        fputc('\n', f);
        (*n_lines)++;
    }
    ck_assert_int_eq(rc, 0);
    fclose(f);
    return out;
}

static struct kvb_query_answer *ask(struct loop *l, const char *json)
{
    struct kvb_query_req r;
    char err[256];
    ck_assert_int_eq(kvb_query_parse_json(json, strlen(json), -1, &r, err, sizeof(err)), 0);
    struct kvb_query_answer *a = NULL;
    ck_assert_int_eq(kvb_query_run(l->q, &r, &a), 0);
    kvb_query_req_free(&r);
    return a;
}

START_TEST(dump_events_match)
{
    struct loop l;
    loop_start(&l, 5000);
    next_id = 0;
    struct kvb_query_answer *a = ask(&l, "{\"op\":\"dump\"}");
    ck_assert_int_eq(kvb_query_answer_status(a), 404);
    kvb_query_answer_free(&a);

    /* tokens 0..11 in blocks of 4: three blocks, as a router hashes them */
    uint32_t tok[12];
    for (uint32_t i = 0; i < 12; i++)
        tok[i] = i;
    uint64_t th[3], h[3] = {101, 102, 103};
    for (int i = 0; i < 3; i++)
        th[i] = kvb_tokens_hash(tok + 4 * i, 4, KVB_TOKENS_HASH_SEED);
    store_chain(&l, h, th, 2, false, 0);          /* event 0: blocks 0, 1 */
    store_chain(&l, h + 2, th + 2, 1, true, 102); /* event 1: block 2 */

    a = ask(&l, "{\"op\":\"dump\",\"worker_id\":7,\"dp_rank\":0}");
    ck_assert_int_eq(kvb_query_answer_status(a), 200);
    int n;
    char *text = all_lines(a, &n);
    ck_assert_int_eq(n, 2); /* one chain, then the cursor */
    char want[1024];
    snprintf(
        want, sizeof(want),
        "{\"worker_id\":7,\"event\":{\"event_id\":1,\"data\":{\"stored\":{\"parent_hash\":null,"
        "\"blocks\":[{\"block_hash\":101,\"tokens_hash\":%llu},{\"block_hash\":102,"
        "\"tokens_hash\":%llu},{\"block_hash\":103,\"tokens_hash\":%llu}]}},\"dp_rank\":0}}\n"
        "{\"last_event_id\":1}\n",
        (unsigned long long)th[0], (unsigned long long)th[1], (unsigned long long)th[2]);
    ck_assert_str_eq(text, want);
    free(text);
    kvb_query_answer_free(&a);

    a = ask(&l, "{\"op\":\"events\",\"since\":0}");
    text = all_lines(a, &n);
    ck_assert_int_eq(n, 2);
    ck_assert_ptr_nonnull(
        strstr(text, "\"event_id\":1,\"data\":{\"stored\":{\"parent_hash\":102,"));
    ck_assert_ptr_nonnull(strstr(text, "\n{\"last_event_id\":1}\n"));
    free(text);
    kvb_query_answer_free(&a);

    a = ask(&l, "{\"op\":\"events\",\"since\":1}"); /* nothing newer */
    text = all_lines(a, &n);
    ck_assert_str_eq(text, "{\"last_event_id\":1}\n");
    free(text);
    kvb_query_answer_free(&a);

    /* tokens 0..13: three full blocks, all resident on device */
    char req[512] = "{\"op\":\"match\",\"token_ids\":[0";
    for (int i = 1; i < 14; i++)
        snprintf(req + strlen(req), sizeof(req) - strlen(req), ",%d", i);
    strcat(req, "]}");
    a = ask(&l, req);
    text = all_lines(a, &n);
    ck_assert_str_eq(text, "{\"matched_blocks\":{\"device\":3,\"host_pinned\":0,\"disk\":0,"
                           "\"external\":0}}\n");
    free(text);
    kvb_query_answer_free(&a);
    /* a LoRA changes every tokens_hash: nothing matches */
    a = ask(&l, "{\"op\":\"match\",\"token_ids\":[0,1,2,3],\"lora_name\":\"adapter-a\"}");
    text = all_lines(a, &n);
    ck_assert_ptr_nonnull(strstr(text, "\"device\":0"));
    free(text);
    kvb_query_answer_free(&a);
    /* block_size from the request */
    a = ask(&l, "{\"op\":\"match\",\"token_ids\":[0,1,2,3,4,5,6,7],\"block_size\":8}");
    text = all_lines(a, &n);
    ck_assert_ptr_nonnull(strstr(text, "\"device\":0"));
    free(text);
    kvb_query_answer_free(&a);

    /* the ring keeps 8 events: since 0 is gone after 10 more */
    for (int i = 0; i < 10; i++) {
        uint64_t x = 1000 + (uint64_t)i, t = (uint64_t)i;
        store_chain(&l, &x, &t, 1, false, 0);
    }
    a = ask(&l, "{\"op\":\"events\",\"since\":0}");
    ck_assert_int_eq(kvb_query_answer_status(a), 410);
    text = all_lines(a, &n);
    ck_assert_ptr_nonnull(strstr(text, "\"status\":410"));
    free(text);
    kvb_query_answer_free(&a);
    a = ask(&l, "{\"op\":\"events\",\"since\":9}");
    ck_assert_int_eq(kvb_query_answer_status(a), 200);
    text = all_lines(a, &n);
    ck_assert_int_eq(n, 3); /* events 10, 11, then {"last_event_id":11} */
    free(text);
    kvb_query_answer_free(&a);
    loop_stop(&l);
    ck_assert_uint_eq(kvb_get(&metrics.queries_total[KVB_QOP_DUMP]), 2);
    ck_assert_uint_eq(kvb_get(&metrics.query_duration_seconds.count), 9);
}
END_TEST

/* recover (Dynamo's recovery query): which answer for which start. */
static int recover(struct loop *l, uint64_t worker, bool has_start, uint64_t start, bool has_end,
                   uint64_t end, uint64_t v[3], int *n_events, uint64_t *first)
{
    struct kvb_query_req r = {.op = KVB_QOP_RECOVER,
                              .has_worker = true,
                              .worker_id = worker,
                              .has_start = has_start,
                              .start = start,
                              .has_end = has_end,
                              .end = end};
    struct kvb_query_answer *a = NULL;
    ck_assert_int_eq(kvb_query_run(l->q, &r, &a), 0);
    int kind = kvb_query_answer_recovery(a, v);
    struct kvb_rev rev;
    *n_events = 0;
    while (kind >= 0 && kvb_query_answer_event(a, 256, &rev) == 1) {
        if (!(*n_events)++)
            *first = rev.event_id;
    }
    kvb_query_answer_free(&a);
    return kind;
}

START_TEST(recover_answers)
{
    struct loop l;
    loop_start(&l, 8);
    next_id = 0;
    uint64_t v[3], first = 0;
    int n;
    /* nothing for the pair yet: an empty dump */
    ck_assert_int_eq(recover(&l, W, false, 0, false, 0, v, &n, &first), KVB_QR_TREE_DUMP);
    ck_assert_int_eq(n, 0);
    ck_assert_uint_eq(v[0], 0);
    for (uint64_t i = 0; i < 12; i++) { /* events 0..11: a chain, the ring keeps 4..11 */
        uint64_t h = 500 + i, t = i;
        store_chain(&l, &h, &t, 1, i > 0, 499 + i);
    }
    ck_assert_int_eq(recover(&l, W, false, 0, false, 0, v, &n, &first), KVB_QR_TREE_DUMP);
    ck_assert_uint_eq(v[0], 11);
    ck_assert_int_eq(n, 1); /* one chain of 12 */
    ck_assert_int_eq(recover(&l, W, true, 9, false, 0, v, &n, &first), KVB_QR_EVENTS);
    ck_assert_int_eq(n, 3); /* 9, 10, 11 */
    ck_assert_uint_eq(first, 9);
    ck_assert_uint_eq(v[0], 11);
    ck_assert_int_eq(recover(&l, W, true, 11, true, 11, v, &n, &first), KVB_QR_EVENTS);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(recover(&l, W, true, 2, false, 0, v, &n, &first), KVB_QR_TREE_DUMP);
    ck_assert_int_eq(recover(&l, W, true, 12, false, 0, v, &n, &first), KVB_QR_TOO_NEW);
    ck_assert_uint_eq(v[0], 12);
    ck_assert_uint_eq(v[1], 11);
    ck_assert_uint_eq(v[2], 11);
    ck_assert_int_eq(recover(&l, W, true, 12, true, 20, v, &n, &first), KVB_QR_TOO_NEW);
    ck_assert_uint_eq(v[1], 20);
    ck_assert_int_eq(recover(&l, W, true, 6, true, 5, v, &n, &first), KVB_QR_INVALID_RANGE);
    ck_assert_uint_eq(v[0], 6);
    ck_assert_uint_eq(v[1], 5);
    /* another pair: nothing yet, an empty dump */
    ck_assert_int_eq(recover(&l, W + 1, true, 3, false, 0, v, &n, &first), KVB_QR_TREE_DUMP);
    ck_assert_int_eq(n, 0);
    loop_stop(&l);
    ck_assert_uint_eq(kvb_get(&metrics.queries_total[KVB_QOP_RECOVER]), 9);
    /* recover is not an operation of the query API's JSON */
    struct kvb_query_req r;
    char err[128];
    const char *j = "{\"op\":\"recover\"}";
    ck_assert_int_eq(kvb_query_parse_json(j, strlen(j), -1, &r, err, sizeof(err)), -EINVAL);
}
END_TEST

/* Several engines, one kvbridge: a match for a worker hashes with that
 * worker's block_size and lora_salt (kvb_query_cfg.workers). */
START_TEST(match_per_worker)
{
    struct loop l;
    loop_start(&l, 5000);
    struct kvb_query_cfg qc = {
        .worker_id = W, .block_size = 4, .lora_salt = true, .wait_ms = 5000, .n_workers = 1};
    qc.workers[0] = (struct kvb_query_worker){8, 8, false};
    kvb_query_set_config(l.q, &qc);
    uint32_t tok[8];
    for (uint32_t i = 0; i < 8; i++)
        tok[i] = i;
    struct kvb_block b = {201, kvb_tokens_hash(tok, 8, KVB_TOKENS_HASH_SEED)};
    struct kvb_rev r = {
        .type = KVB_REVT_STORED, .worker_id = 8, .event_id = 0, .blocks = &b, .n = 1};
    apply(&l, &r);
    const char *ask8 = "{\"op\":\"match\",\"worker_id\":8,\"token_ids\":[0,1,2,3,4,5,6,7],"
                       "\"lora_name\":\"adapter-a\"}"; /* worker 8: no LoRA salt */
    struct kvb_query_answer *a = ask(&l, ask8);
    int n;
    char *text = all_lines(a, &n);
    ck_assert_str_eq(text, "{\"matched_blocks\":{\"device\":1,\"host_pinned\":0,\"disk\":0,"
                           "\"external\":0}}\n");
    free(text);
    kvb_query_answer_free(&a);
    /* the same tokens in worker 7's 4-token blocks: other hashes */
    a = ask(&l, "{\"op\":\"match\",\"worker_id\":7,\"token_ids\":[0,1,2,3,4,5,6,7]}");
    text = all_lines(a, &n);
    ck_assert_ptr_nonnull(strstr(text, "\"device\":0"));
    free(text);
    kvb_query_answer_free(&a);
    loop_stop(&l);
}
END_TEST

START_TEST(closed_and_slow_loop)
{
    struct loop l;
    loop_start(&l, 100);
    atomic_store(&l.paused, true); /* the loop does not serve: 503 after wait_ms */
    struct kvb_query_answer *a = ask(&l, "{\"op\":\"dump\"}");
    ck_assert_int_eq(kvb_query_answer_status(a), 503);
    kvb_query_answer_free(&a);
    atomic_store(&l.paused, false);
    kvb_query_close(l.q);
    a = ask(&l, "{\"op\":\"dump\"}");
    ck_assert_int_eq(kvb_query_answer_status(a), 503);
    kvb_query_answer_free(&a);
    /* a mirror that is off */
    struct kvb_query_req r = {.op = KVB_QOP_DUMP};
    loop_stop(&l);
    loop_start(&l, 5000);
    pthread_mutex_lock(&l.mu);
    kvb_index_destroy(&l.m);
    pthread_mutex_unlock(&l.mu);
    ck_assert_int_eq(kvb_query_run(l.q, &r, &a), 0);
    ck_assert_int_eq(kvb_query_answer_status(a), 503);
    kvb_query_answer_free(&a);
    loop_stop(&l);
}
END_TEST

/* An error answer is one JSON object whose "error" is the message as it
 * is: quotes (the parser's own "op: \"dump\", ..."), backslashes, control
 * characters and slashes included. */
START_TEST(error_answers)
{
    char err[256];
    struct kvb_query_req r;
    ck_assert_int_eq(kvb_query_parse_json("{\"op\":\"x\"}", 10, -1, &r, err, sizeof(err)), -EINVAL);
    const char *msgs[] = {err, "a \\ backslash, a\ttab and a\nnewline",
                          "unknown path: /v1/dump, /v1/events or /v1/match"};
    for (size_t i = 0; i < sizeof(msgs) / sizeof(msgs[0]); i++) {
        struct kvb_query_answer *a = NULL;
        ck_assert_int_eq(kvb_query_error(NULL, 400, msgs[i], &a), 0);
        ck_assert_int_eq(kvb_query_answer_status(a), 400);
        int n;
        char *text = all_lines(a, &n);
        ck_assert_int_eq(n, 1);
        struct json_object *o = json_tokener_parse(text), *e = NULL, *st = NULL;
        ck_assert_msg(o != NULL, "not JSON: %s", text);
        ck_assert(json_object_object_get_ex(o, "error", &e));
        ck_assert(json_object_object_get_ex(o, "status", &st));
        ck_assert_str_eq(json_object_get_string(e), msgs[i]);
        ck_assert_int_eq(json_object_get_int(st), 400);
        json_object_put(o);
        free(text);
        kvb_query_answer_free(&a);
    }
    /* the bytes of a plain message (README "Query API"): no slash escaped */
    struct kvb_query_answer *a = NULL;
    ck_assert_int_eq(kvb_query_error(NULL, 404, msgs[2], &a), 0);
    int n;
    char *text = all_lines(a, &n);
    ck_assert_str_eq(text, "{\"error\":\"unknown path: /v1/dump, /v1/events or /v1/match\","
                           "\"status\":404}\n");
    free(text);
    kvb_query_answer_free(&a);
}
END_TEST

static Suite *query_suite(void)
{
    Suite *s = suite_create("query");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, parse_json);
    tcase_add_test(tc, parse_params);
    tcase_add_test(tc, dump_events_match);
    tcase_add_test(tc, recover_answers);
    tcase_add_test(tc, match_per_worker);
    tcase_add_test(tc, closed_and_slow_loop);
    tcase_add_test(tc, error_answers);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(query_suite()); }
