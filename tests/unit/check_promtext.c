/* promtext: the Prometheus text parser against real engine pages
 * (tests/data/metrics/{vllm,vllm-v0.8,sglang}.txt, rendered by
 * prometheus_client from the engines' metric definitions: see gen.py there)
 * and the format's edge cases (tests/data/metrics/edge.txt). */
#include <check.h>

#include "testutil.h"
#include <errno.h>
#include <math.h>
#include <string.h>

#include "engine/promtext.h"

/* Every sample of a page, as "name{l=v,...} value" lines (values with %.17g,
 * label values as unescaped bytes). */
struct dump {
    char *text;
    size_t len, cap;
    unsigned n;
};

static void put(struct dump *d, const char *p, size_t n)
{
    if (d->len + n + 1 > d->cap) {
        d->cap = (d->len + n + 1) * 2;
        d->text = realloc(d->text, d->cap);
        ck_assert_ptr_nonnull(d->text);
    }
    memcpy(d->text + d->len, p, n);
    d->len += n;
    d->text[d->len] = 0;
}

static int dump_cb(void *ctx, const struct kvb_prom_sample *s)
{
    struct dump *d = ctx;
    put(d, s->name, s->name_len);
    put(d, "{", 1);
    for (size_t i = 0; i < s->n_labels; i++) {
        if (i)
            put(d, ",", 1);
        put(d, s->labels[i].name, s->labels[i].name_len);
        put(d, "=", 1);
        put(d, s->labels[i].value, s->labels[i].value_len);
    }
    char num[64];
    int n = snprintf(num, sizeof(num), "} %.17g", s->value);
    put(d, num, (size_t)n);
    if (s->has_timestamp) {
        n = snprintf(num, sizeof(num), " @%lld", (long long)s->timestamp_ms);
        put(d, num, (size_t)n);
    }
    put(d, "\n", 1);
    d->n++;
    return 0;
}

static struct dump parse_file(const char *path, struct kvb_prom_stats *st)
{
    size_t len;
    char *text = (char *)read_all(path, &len);
    struct dump d = {0};
    ck_assert_int_eq(kvb_prom_parse(text, len, dump_cb, &d, st), 0);
    ck_assert_uint_eq(d.n, st->samples);
    free(text);
    return d;
}

static void has_line(const struct dump *d, const char *line)
{
    size_t n = strlen(line);
    bool found = false;
    for (const char *p = d->text; p && !found; p = strchr(p, '\n'), p = p ? p + 1 : p)
        found = strncmp(p, line, n) == 0 && p[n] == '\n';
    ck_assert_msg(found, "missing sample: %s", line);
}

/* ---- real pages ------------------------------------------------------------ */

START_TEST(test_vllm_page)
{
    struct kvb_prom_stats st;
    struct dump d = parse_file("tests/data/metrics/vllm.txt", &st);
    ck_assert_uint_eq(st.malformed, 0);
    ck_assert_uint_gt(st.samples, 350);
    ck_assert_uint_gt(st.comments, 80);
    ck_assert_uint_eq(st.lines, st.samples + st.comments);
    has_line(&d, "vllm:kv_cache_usage_perc{engine=0,model_name=Qwen/Qwen3-8B} 0.62339999999999995");
    has_line(&d, "vllm:num_requests_waiting{engine=1,model_name=Qwen/Qwen3-8B} 0");
    has_line(&d, "vllm:prefix_cache_hits_total{engine=1,model_name=Qwen/Qwen3-8B} 441870");
    has_line(&d, "vllm:prefix_cache_hits_created{engine=1,model_name=Qwen/Qwen3-8B} 1760000000");
    /* histograms: buckets (le last in prometheus_client's sorted order is
     * not guaranteed: le sorts between engine and model_name), sum, count */
    has_line(&d, "vllm:time_to_first_token_seconds_bucket{engine=0,le=+Inf,model_name=Qwen/"
                 "Qwen3-8B} 4");
    has_line(&d, "vllm:time_to_first_token_seconds_bucket{engine=0,le=0.1,model_name=Qwen/"
                 "Qwen3-8B} 2");
    has_line(&d, "vllm:time_to_first_token_seconds_count{engine=0,model_name=Qwen/Qwen3-8B} 4");
    has_line(&d, "vllm:time_to_first_token_seconds_sum{engine=0,model_name=Qwen/Qwen3-8B} "
                 "2.2999999999999998");
    /* the info gauge: many labels, "None" and "True" values */
    ck_assert_ptr_nonnull(strstr(d.text, "vllm:cache_config_info{block_size=16,"));
    ck_assert_ptr_nonnull(strstr(d.text, ",engine=1,"));
    ck_assert_ptr_nonnull(strstr(d.text, ",num_gpu_blocks=27473,"));
    ck_assert_ptr_nonnull(strstr(d.text, ",num_gpu_blocks_override=None,"));
    /* the API server's own metrics */
    has_line(&d, "python_gc_objects_collected_total{generation=0} 12045");
    has_line(&d, "process_resident_memory_bytes{} 1837203456");
    free(d.text);
}
END_TEST

START_TEST(test_vllm_08_and_sglang_pages)
{
    struct kvb_prom_stats st;
    struct dump d = parse_file("tests/data/metrics/vllm-v0.8.txt", &st);
    ck_assert_uint_eq(st.malformed, 0);
    has_line(&d, "vllm:gpu_cache_usage_perc{engine=0,model_name=meta-llama/Llama-3.1-8B-Instruct} "
                 "0.125");
    free(d.text);

    d = parse_file("tests/data/metrics/sglang.txt", &st);
    ck_assert_uint_eq(st.malformed, 0);
    ck_assert_uint_gt(st.samples, 60);
    has_line(&d, "sglang:token_usage{dp_rank=1,engine_type=unified,model_name=Qwen/Qwen3-30B-A3B,"
                 "moe_ep_rank=2,pp_rank=0,tp_rank=2} 0.32000000000000001");
    has_line(&d, "sglang:max_total_num_tokens{dp_rank=0,engine_type=unified,model_name=Qwen/"
                 "Qwen3-30B-A3B,moe_ep_rank=0,pp_rank=0,tp_rank=0} 180984");
    has_line(&d, "sglang:queue_time_seconds_bucket{dp_rank=0,engine_type=unified,le=0.0,"
                 "model_name=Qwen/Qwen3-30B-A3B,moe_ep_rank=0,pp_rank=0,tp_rank=0} 1");
    free(d.text);
}
END_TEST

/* ---- edge cases -------------------------------------------------------------- */

START_TEST(test_edge_file)
{
    struct kvb_prom_stats st;
    struct dump d = parse_file("tests/data/metrics/edge.txt", &st);
    ck_assert_uint_eq(st.lines, 41);
    ck_assert_uint_eq(st.samples, 20);
    ck_assert_uint_eq(st.malformed, 13);
    ck_assert_uint_eq(st.comments, 6);
    /* escapes: \\ -> \, \" -> ", \n -> newline, \t kept as it is */
    has_line(&d, "esc_total{path=C:\\dir\\file,quote=say \"hi\",nl=line1\nline2,other=a\\tb} 3");
    has_line(&d, "special{v=nan} nan");
    has_line(&d, "special{v=pinf} inf");
    has_line(&d, "special{v=ninf} -inf");
    has_line(&d, "special{v=exp} 0.0015");
    has_line(&d, "special{v=int} -42");
    has_line(&d, "with_ts{a=1} 7 @1700000000123");
    has_line(&d, "with_ts{a=neg} 8 @-5");
    has_line(&d, "spaced{a=x,b=y} 9");
    has_line(&d, "no_labels{} 10");
    has_line(&d, "empty_set{} 11");
    has_line(&d, "colon:name:x{} 12");
    has_line(&d, "lat_seconds_bucket{le=+Inf} 4");
    has_line(&d, "lat_seconds_sum{} 2.75");
    has_line(&d, "lat_seconds_count{} 4");
    has_line(&d, "crlf_line{a=b} 13");
    has_line(&d, "last_line_no_newline{} 14");
    /* the 10 KiB line, label value whole */
    const char *l = strstr(d.text, "long_line{model=");
    ck_assert_ptr_nonnull(l);
    l += strlen("long_line{model=");
    size_t n = strspn(l, "x");
    ck_assert_uint_eq(n, 10240);
    ck_assert(strncmp(l + n, ",engine=0} 0.25\n", 16) == 0);
    free(d.text);
}
END_TEST

static unsigned parse_str(const char *s, struct kvb_prom_stats *st, struct dump *d)
{
    char *t = strdup(s);
    ck_assert_ptr_nonnull(t);
    memset(d, 0, sizeof(*d));
    ck_assert_int_eq(kvb_prom_parse(t, strlen(t), dump_cb, d, st), 0);
    free(t);
    return d->n;
}

START_TEST(test_limits)
{
    struct kvb_prom_stats st;
    struct dump d;
    /* KVB_PROM_MAX_LABELS labels pass, one more is malformed */
    char *line = malloc(8192);
    ck_assert_ptr_nonnull(line);
    for (int extra = 0; extra <= 1; extra++) {
        size_t o = (size_t)sprintf(line, "m{");
        for (int i = 0; i < KVB_PROM_MAX_LABELS + extra; i++)
            o += (size_t)sprintf(line + o, "%sl%d=\"%d\"", i ? "," : "", i, i);
        sprintf(line + o, "} 1\n");
        ck_assert_uint_eq(parse_str(line, &st, &d), extra ? 0 : 1);
        ck_assert_uint_eq(st.malformed, extra ? 1 : 0);
        free(d.text);
    }
    free(line);
    /* a label value at the cap passes, one byte more does not */
    line = malloc(KVB_PROM_MAX_LABEL_VALUE + 64);
    ck_assert_ptr_nonnull(line);
    for (int extra = 0; extra <= 1; extra++) {
        size_t o = (size_t)sprintf(line, "m{a=\"");
        memset(line + o, 'v', KVB_PROM_MAX_LABEL_VALUE + (size_t)extra);
        o += KVB_PROM_MAX_LABEL_VALUE + (size_t)extra;
        sprintf(line + o, "\"} 1\nok 2\n");
        ck_assert_uint_eq(parse_str(line, &st, &d), extra ? 1 : 2);
        ck_assert_uint_eq(st.malformed, (uint64_t)extra);
        free(d.text);
    }
    free(line);
    /* a value token longer than KVB_PROM_MAX_NUMBER */
    char big[200];
    memset(big, 0, sizeof(big));
    strcpy(big, "m 1");
    memset(big + 3, '0', KVB_PROM_MAX_NUMBER);
    ck_assert_uint_eq(parse_str(big, &st, &d), 0);
    ck_assert_uint_eq(st.malformed, 1);
    free(d.text);
    /* timestamp out of int64 range */
    ck_assert_uint_eq(parse_str("m 1 99999999999999999999\n", &st, &d), 0);
    free(d.text);
    /* NUL bytes and control characters inside a line */
    char nul[] = "m\0x 1\nok 1\n";
    memset(&d, 0, sizeof(d));
    ck_assert_int_eq(kvb_prom_parse(nul, sizeof(nul) - 1, dump_cb, &d, &st), 0);
    ck_assert_uint_eq(d.n, 1);
    ck_assert_uint_eq(st.malformed, 1);
    free(d.text);
    /* a dangling backslash at the end of the text */
    ck_assert_uint_eq(parse_str("m{a=\"x\\", &st, &d), 0);
    ck_assert_uint_eq(st.malformed, 1);
    free(d.text);
}
END_TEST

static int stop_at_two(void *ctx, const struct kvb_prom_sample *s)
{
    (void)s;
    return ++*(int *)ctx == 2 ? 7 : 0;
}

START_TEST(test_api)
{
    struct kvb_prom_stats st;
    int n = 0;
    char t[] = "a 1\nb 2\nc 3\n";
    ck_assert_int_eq(kvb_prom_parse(t, strlen(t), stop_at_two, &n, &st), 7);
    ck_assert_int_eq(n, 2);
    ck_assert_uint_eq(st.samples, 2);
    ck_assert_int_eq(kvb_prom_parse(NULL, 3, stop_at_two, &n, NULL), -EINVAL);
    ck_assert_int_eq(kvb_prom_parse(t, 3, NULL, &n, NULL), -EINVAL);
    ck_assert_int_eq(kvb_prom_parse(NULL, 0, stop_at_two, &n, &st), 0);
    ck_assert_uint_eq(st.lines, 0);
}
END_TEST

static int check_labels(void *ctx, const struct kvb_prom_sample *s)
{
    (void)ctx;
    ck_assert(kvb_prom_name_is(s, "x"));
    ck_assert(!kvb_prom_name_is(s, "xx"));
    const struct kvb_prom_label *l = kvb_prom_label(s, "bb");
    ck_assert_ptr_nonnull(l);
    ck_assert_uint_eq(l->value_len, 1);
    ck_assert(l->value[0] == '2');
    ck_assert_ptr_null(kvb_prom_label(s, "b"));
    ck_assert_ptr_null(kvb_prom_label(s, "c"));
    return 0;
}

START_TEST(test_label_lookup)
{
    char u[] = "x{a=\"1\",bb=\"2\"} 5\n";
    struct kvb_prom_stats st;
    ck_assert_int_eq(kvb_prom_parse(u, strlen(u), check_labels, NULL, &st), 0);
    ck_assert_uint_eq(st.samples, 1);
}
END_TEST

static Suite *promtext_suite(void)
{
    Suite *s = suite_create("promtext");
    TCase *tc = tcase_create("promtext");
    tcase_add_test(tc, test_vllm_page);
    tcase_add_test(tc, test_vllm_08_and_sglang_pages);
    tcase_add_test(tc, test_edge_file);
    tcase_add_test(tc, test_limits);
    tcase_add_test(tc, test_api);
    tcase_add_test(tc, test_label_lookup);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(promtext_suite()); }
