/* engine_load: the per-kind tables against the engines' pages in
 * tests/data/metrics (see gen.py there for where each name comes from). */
#include <check.h>

#include "testutil.h"
#include <errno.h>
#include <math.h>
#include <string.h>

#include "engine/load.h"

static struct kvb_engine_load *load_file(enum kvb_engine_kind kind, const char *path)
{
    size_t len;
    char *text = (char *)read_all(path, &len);
    struct kvb_engine_load *l = calloc(1, sizeof(*l));
    ck_assert_ptr_nonnull(l);
    ck_assert_int_eq(kvb_engine_load_parse(kind, text, len, l), 0);
    free(text);
    return l;
}

static struct kvb_engine_load *load_str(enum kvb_engine_kind kind, const char *s)
{
    char *text = strdup(s);
    struct kvb_engine_load *l = calloc(1, sizeof(*l));
    ck_assert_ptr_nonnull(l);
    ck_assert_int_eq(kvb_engine_load_parse(kind, text, strlen(text), l), 0);
    free(text);
    return l;
}

static double field(const struct kvb_engine_load *l, uint32_t rank, enum kvb_load_field f)
{
    const struct kvb_rank_load *r = kvb_engine_load_rank(l, rank);
    ck_assert_msg(r != NULL, "no rank %u", rank);
    ck_assert_msg(kvb_load_has(r, f), "rank %u has no field %d", rank, f);
    return r->v[f];
}

static bool has(const struct kvb_engine_load *l, uint32_t rank, enum kvb_load_field f)
{
    const struct kvb_rank_load *r = kvb_engine_load_rank(l, rank);
    return r && kvb_load_has(r, f);
}

#define EQ(a, b) \
    ck_assert_msg(fabs((a) - (b)) < 1e-9, "%s = %.17g, want %.17g", #a, (double)(a), (double)(b))

START_TEST(test_vllm)
{
    struct kvb_engine_load *l = load_file(KVB_ENGINE_VLLM, "tests/data/metrics/vllm.txt");
    ck_assert_uint_eq(l->n_ranks, 2);
    ck_assert_uint_eq(l->prom.malformed, 0);
    ck_assert_uint_eq(l->ignored, 0);
    kvb_engine_load_finish(l, NULL, 0);
    /* engine="0" */
    EQ(field(l, 0, KVB_LOAD_KV_USAGE), 0.6234);
    EQ(field(l, 0, KVB_LOAD_TOTAL_BLOCKS), 27473);
    EQ(field(l, 0, KVB_LOAD_BLOCK_TOKENS), 16);
    EQ(field(l, 0, KVB_LOAD_USED_BLOCKS), round(0.6234 * 27473)); /* 17127 */
    EQ(field(l, 0, KVB_LOAD_RUNNING), 7);
    EQ(field(l, 0, KVB_LOAD_WAITING), 2);
    EQ(field(l, 0, KVB_LOAD_PREFIX_QUERIES), 981344);
    EQ(field(l, 0, KVB_LOAD_PREFIX_HITS), 603219);
    EQ(field(l, 0, KVB_LOAD_HIT_RATE), 603219.0 / 981344.0);
    /* engine="1" */
    EQ(field(l, 1, KVB_LOAD_KV_USAGE), 0.4117);
    EQ(field(l, 1, KVB_LOAD_USED_BLOCKS), round(0.4117 * 27473));
    EQ(field(l, 1, KVB_LOAD_RUNNING), 5);
    EQ(field(l, 1, KVB_LOAD_WAITING), 0);
    /* this version has no kv_cache_size_tokens label */
    ck_assert(!has(l, 0, KVB_LOAD_TOTAL_TOKENS));
    ck_assert_ptr_null(kvb_engine_load_rank(l, 2));

    /* hit rate over the interval since the previous page */
    struct kvb_engine_load *prev = l;
    struct kvb_engine_load *cur = load_str(
        KVB_ENGINE_VLLM, "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 982344.0\n"
                         "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 603969.0\n"
                         "vllm:prefix_cache_queries_total{engine=\"1\",model_name=\"m\"} 902210.0\n"
                         "vllm:prefix_cache_hits_total{engine=\"1\",model_name=\"m\"} 441870.0\n");
    kvb_engine_load_finish(cur, prev, 0);
    EQ(field(cur, 0, KVB_LOAD_HIT_RATE), 750.0 / 1000.0);
    /* no queries in the interval: the lifetime ratio */
    EQ(field(cur, 1, KVB_LOAD_HIT_RATE), 441870.0 / 902210.0);
    free(cur);
    /* a counter reset (engine restarted): the lifetime ratio of the new one */
    cur = load_str(KVB_ENGINE_VLLM, "vllm:prefix_cache_queries_total{engine=\"0\"} 10\n"
                                    "vllm:prefix_cache_hits_total{engine=\"0\"} 4\n");
    kvb_engine_load_finish(cur, prev, 0);
    EQ(field(cur, 0, KVB_LOAD_HIT_RATE), 0.4);
    free(cur);
    free(l);
}
END_TEST

START_TEST(test_vllm_08_names)
{
    struct kvb_engine_load *l = load_file(KVB_ENGINE_VLLM, "tests/data/metrics/vllm-v0.8.txt");
    kvb_engine_load_finish(l, NULL, 0);
    ck_assert_uint_eq(l->n_ranks, 1);
    EQ(field(l, 0, KVB_LOAD_KV_USAGE), 0.125);
    EQ(field(l, 0, KVB_LOAD_TOTAL_BLOCKS), 8192);
    EQ(field(l, 0, KVB_LOAD_USED_BLOCKS), 1024);
    EQ(field(l, 0, KVB_LOAD_RUNNING), 3);
    EQ(field(l, 0, KVB_LOAD_WAITING), 1);
    EQ(field(l, 0, KVB_LOAD_HIT_RATE), 0.25);
    free(l);
}
END_TEST

/* Both names present: the current one wins, in either order. */
START_TEST(test_new_name_wins)
{
    const char *pages[] = {
        "vllm:gpu_cache_usage_perc{engine=\"0\"} 0.9\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.5\n",
        "vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\nvllm:gpu_cache_usage_perc{engine=\"0\"} 0.9\n",
    };
    for (int i = 0; i < 2; i++) {
        struct kvb_engine_load *l = load_str(KVB_ENGINE_VLLM, pages[i]);
        EQ(field(l, 0, KVB_LOAD_KV_USAGE), 0.5);
        free(l);
    }
}
END_TEST

START_TEST(test_sglang)
{
    struct kvb_engine_load *l = load_file(KVB_ENGINE_SGLANG, "tests/data/metrics/sglang.txt");
    ck_assert_uint_eq(l->n_ranks, 2);
    ck_assert_uint_eq(l->ignored, 0);
    kvb_engine_load_finish(l, NULL, 16); /* page size 16 */
    EQ(field(l, 0, KVB_LOAD_KV_USAGE), 0.56);
    EQ(field(l, 0, KVB_LOAD_TOTAL_TOKENS), 180984);
    EQ(field(l, 0, KVB_LOAD_TOTAL_BLOCKS), 11311); /* floor(180984 / 16) */
    EQ(field(l, 0, KVB_LOAD_BLOCK_TOKENS), 16);
    EQ(field(l, 0, KVB_LOAD_USED_BLOCKS), round(0.56 * 11311));
    EQ(field(l, 0, KVB_LOAD_RUNNING), 14);
    EQ(field(l, 0, KVB_LOAD_WAITING), 3);
    EQ(field(l, 0, KVB_LOAD_HIT_RATE), 0.4375);
    EQ(field(l, 1, KVB_LOAD_KV_USAGE), 0.32);
    EQ(field(l, 1, KVB_LOAD_RUNNING), 9);
    EQ(field(l, 1, KVB_LOAD_WAITING), 0);
    EQ(field(l, 1, KVB_LOAD_HIT_RATE), 0.125);
    ck_assert(!has(l, 0, KVB_LOAD_PREFIX_QUERIES));
    free(l);
    /* unknown page size: blocks are tokens */
    l = load_file(KVB_ENGINE_SGLANG, "tests/data/metrics/sglang.txt");
    kvb_engine_load_finish(l, NULL, 0);
    EQ(field(l, 1, KVB_LOAD_TOTAL_BLOCKS), 180984);
    EQ(field(l, 1, KVB_LOAD_USED_BLOCKS), round(0.32 * 180984));
    free(l);
}
END_TEST

/* Without a dp_rank label (SGLang without DP attention): rank 0.  Several
 * series for one rank (tp_rank differs): the largest. */
START_TEST(test_rank_rules)
{
    struct kvb_engine_load *l = load_str(
        KVB_ENGINE_SGLANG, "sglang:token_usage{engine_type=\"unified\",tp_rank=\"0\"} 0.25\n"
                           "sglang:token_usage{engine_type=\"unified\",tp_rank=\"1\"} 0.5\n"
                           "sglang:token_usage{engine_type=\"unified\",tp_rank=\"2\"} 0.125\n"
                           "sglang:num_queue_reqs{dp_rank=\"x\"} 4\n" /* bad rank: ignored */
                           "sglang:num_queue_reqs{dp_rank=\"99999999999\"} 4\n" /* > u32 */
                           "sglang:num_running_reqs NaN\n"                      /* NaN: ignored */
                           "sglang:num_running_reqs_offline_batch 3\n" /* not in the table */
                           "vllm:num_requests_running 5\n");           /* other kind */
    ck_assert_uint_eq(l->n_ranks, 1);
    EQ(field(l, 0, KVB_LOAD_KV_USAGE), 0.5);
    ck_assert(!has(l, 0, KVB_LOAD_RUNNING));
    ck_assert(!has(l, 0, KVB_LOAD_WAITING));
    ck_assert_uint_eq(l->matched, 3);
    ck_assert_uint_eq(l->ignored, 3);
    free(l);
    /* the info gauge before profiling: num_gpu_blocks="None" */
    l = load_str(
        KVB_ENGINE_VLLM,
        "vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"None\"} 1.0\n");
    ck_assert(!has(l, 0, KVB_LOAD_TOTAL_BLOCKS));
    EQ(field(l, 0, KVB_LOAD_BLOCK_TOKENS), 16);
    ck_assert_uint_eq(l->ignored, 1);
    free(l);
    /* used blocks never exceed the total, even for a total that is not an
     * integer (round(1 x 2.5) = 3 would exceed it) */
    l = load_str(KVB_ENGINE_VLLM, "vllm:cache_config_info{num_gpu_blocks=\"2.5\"} 1\n"
                                  "vllm:kv_cache_usage_perc 1\n");
    kvb_engine_load_finish(l, NULL, 0);
    ck_assert(field(l, 0, KVB_LOAD_USED_BLOCKS) <= 2.5);
    free(l);
    /* more ranks than KVB_LOAD_MAX_RANKS: the extra ones are counted */
    size_t cap = (KVB_LOAD_MAX_RANKS + 2) * 64;
    char *page = malloc(cap);
    size_t o = 0;
    for (int i = 0; i < KVB_LOAD_MAX_RANKS + 2; i++)
        o += (size_t)snprintf(page + o, cap - o, "vllm:num_requests_running{engine=\"%d\"} %d\n", i,
                              i);
    l = load_str(KVB_ENGINE_VLLM, page);
    ck_assert_uint_eq(l->n_ranks, KVB_LOAD_MAX_RANKS);
    ck_assert_uint_eq(l->ignored, 2);
    EQ(field(l, KVB_LOAD_MAX_RANKS - 1, KVB_LOAD_RUNNING), KVB_LOAD_MAX_RANKS - 1);
    free(l);
    free(page);
}
END_TEST

START_TEST(test_kinds)
{
    enum kvb_engine_kind k;
    ck_assert_int_eq(kvb_engine_kind_parse("vllm", &k), 0);
    ck_assert_int_eq(k, KVB_ENGINE_VLLM);
    ck_assert_int_eq(kvb_engine_kind_parse("sglang", &k), 0);
    ck_assert_int_eq(k, KVB_ENGINE_SGLANG);
    ck_assert_int_eq(kvb_engine_kind_parse("trtllm", &k), -EINVAL);
    ck_assert_int_eq(kvb_engine_kind_parse(NULL, &k), -EINVAL);
    ck_assert_str_eq(kvb_engine_kind_name(KVB_ENGINE_SGLANG), "sglang");
    ck_assert_str_eq(kvb_engine_dp_label(KVB_ENGINE_VLLM), "engine");
    ck_assert_str_eq(kvb_engine_dp_label(KVB_ENGINE_SGLANG), "dp_rank");
    struct kvb_engine_load l;
    char t[] = "x 1\n";
    ck_assert_int_eq(kvb_engine_load_parse((enum kvb_engine_kind)7, t, 4, &l), -EINVAL);
    ck_assert_int_eq(kvb_engine_load_parse(KVB_ENGINE_VLLM, t, 4, NULL), -EINVAL);
    ck_assert_int_eq(kvb_engine_load_parse(KVB_ENGINE_VLLM, t, 4, &l), 0);
    ck_assert_uint_eq(l.n_ranks, 0);
}
END_TEST

static Suite *engine_load_suite(void)
{
    Suite *s = suite_create("engine_load");
    TCase *tc = tcase_create("engine_load");
    tcase_add_test(tc, test_vllm);
    tcase_add_test(tc, test_vllm_08_names);
    tcase_add_test(tc, test_new_name_wins);
    tcase_add_test(tc, test_sglang);
    tcase_add_test(tc, test_rank_rules);
    tcase_add_test(tc, test_kinds);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(engine_load_suite()); }
