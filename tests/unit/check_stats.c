/* stats: the lines kvb_stats_format() writes for two metric snapshots:
 * one idle line when nothing happened; otherwise one line per source (its
 * streams summed, its engine ranks) and an "all:" line with the deltas. */
#include <check.h>

#include "testutil.h"
#include <string.h>

#include "metrics.h"
#include "stats.h"

static char *format(const struct kvb_metrics *a, const struct kvb_metrics *b, uint64_t ms,
                    int *lines)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ck_assert_ptr_nonnull(f);
    *lines = kvb_stats_format(a, b, ms, f);
    fclose(f);
    int nl = 0;
    for (const char *p = text; *p; p++)
        nl += *p == '\n';
    ck_assert_int_eq(nl, *lines);
    return text;
}

START_TEST(test_idle_is_one_line)
{
    struct kvb_metrics *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    kvb_metrics_stream_slot(a, "tcp://e:1", "");
    kvb_metrics_stream_slot(b, "tcp://e:1", "");
    kvb_metrics_stream_slot(b, "tcp://e:2", "");
    kvb_set(&b->nats_pending_bytes[0], 42);
    kvb_add(&b->load_messages_published_total[0], 3);
    int n;
    char *t = format(a, b, 10000, &n);
    ck_assert_int_eq(n, 1);
    ck_assert_msg(strstr(t, "idle for 10 s: no batches, nothing published; nats pending 42 B, "
                            "3 load messages, 0 engine(s) gone\n"),
                  "%s", t);
    free(t);
    free(a);
    free(b);
}
END_TEST

START_TEST(test_counts)
{
    struct kvb_metrics *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    /* before: one stream with 5 batches */
    struct kvb_stream_slot *s = kvb_metrics_stream_slot(a, "tcp://e:1", "t1");
    kvb_set(&s->batches, 5);
    kvb_add(&a->batches_received_total[0], 5);
    /* after: two streams of e:1 and one of e:2 */
    s = kvb_metrics_stream_slot(b, "tcp://e:1", "t1");
    kvb_set(&s->batches, 25);
    kvb_set(&s->events, 100);
    s = kvb_metrics_stream_slot(b, "tcp://e:2", "");
    kvb_set(&s->batches, 10);
    kvb_set(&s->events, 10);
    kvb_set(&s->gaps, 1);
    s = kvb_metrics_stream_slot(b, "tcp://e:1", "t2");
    kvb_set(&s->batches, 5);
    kvb_add(&b->batches_received_total[0], 5 + 20 + 10 + 5);
    kvb_add(&b->events_received_total[KVB_EVT_STORED], 110);
    kvb_add(&b->router_events_published_total[KVB_REVT_STORED], 100);
    kvb_add(&b->router_events_published_total[KVB_REVT_CLEARED], 2);
    kvb_add(&b->barriers_total[KVB_BAR_ENGINE_GONE], 2);
    kvb_add(&b->events_dropped_total[KVB_DROP_TIER_FILTERED], 7);
    kvb_add(&b->seq_gaps_total[0], 1);
    kvb_add(&b->replays_requested_total[0], 1);
    kvb_add(&b->replays_filled_total[0], 1);
    /* 99 fast batches, 1 slow: p99 is in the 1 us bucket */
    kvb_add(&b->batch_processing_seconds.count, 100);
    kvb_add(&b->batch_processing_seconds.buckets[0], 99);
    kvb_add(&b->batch_processing_seconds.buckets[5], 1);
    struct kvb_engine_slot *e = kvb_metrics_engine_slot(b, "tcp://e:1", 0);
    kvb_set(&e->up, 1);
    kvb_set(&e->used_blocks, 3400);
    kvb_set(&e->total_blocks, 10000);
    kvb_set(&e->running, 7);
    kvb_set(&e->waiting, 2);
    e = kvb_metrics_engine_slot(b, "tcp://e:2", 1);
    kvb_set(&e->gone, 1);
    e = kvb_metrics_engine_slot(b, "tcp://e:3", 2);
    int n;
    char *t = format(a, b, 10000, &n);
    ck_assert_int_eq(n, 4);
    ck_assert_msg(!strstr(t, "barrier"), "log greps look for 'barrier': %s", t);
    ck_assert_msg(strstr(t, "tcp://e:1: 2.5 batches/s, 10.0 events/s, 0 gaps; engine dp_rank 0: "
                            "kv 3400/10000 blocks, 7 running, 2 waiting\n"),
                  "%s", t);
    ck_assert_msg(strstr(t, "tcp://e:2: 1.0 batches/s, 1.0 events/s, 1 gaps; engine dp_rank 1: "
                            "gone\n"),
                  "%s", t);
    ck_assert_msg(strstr(t, "tcp://e:3: no batches yet; engine dp_rank 2: not answering\n"), "%s",
                  t);
    ck_assert_msg(strstr(t, "all: 10 s, 3.5 batches/s, 11.0 events/s, published 102 (stored 100, "
                            "cleared 2), cleared by cause 2 (engine_gone 2), gaps 1, replays 1 "
                            "(filled 1, failed 0), dropped 7 (tier_filtered 7), malformed 0, nats "
                            "pending 0 B, load messages 0, p99 batch <= 0.001 ms\n"),
                  "%s", t);
    free(t);
    free(a);
    free(b);
}
END_TEST

static Suite *stats_suite(void)
{
    Suite *s = suite_create("stats");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_idle_is_one_line);
    tcase_add_test(tc, test_counts);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(stats_suite()); }
