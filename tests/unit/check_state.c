/* state: save / load round trip, atomic replacement, corrupt files. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "state.h"
#include "testutil.h"

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/kvb-state.XXXXXX");
    ck_assert(mkdtemp(dir) != NULL);
}

static void teardown(void)
{
    char p[128];
    snprintf(p, sizeof(p), "%s/kvbridge.state", dir);
    unlink(p);
    snprintf(p, sizeof(p), "%s/kvbridge.state.tmp", dir);
    unlink(p);
    rmdir(dir);
}

static void write_file(const char *text)
{
    char p[128];
    snprintf(p, sizeof(p), "%s/kvbridge.state", dir);
    FILE *f = fopen(p, "w");
    ck_assert(f != NULL);
    fputs(text, f);
    fclose(f);
}

START_TEST(round_trip)
{
    struct kvb_state *s = kvb_state_new();
    struct kvb_id_counter c1 = {UINT64_MAX, 0, 12345, 1796040478869ULL};
    struct kvb_id_counter c2 = {7, 3, 0, 1};
    ck_assert_int_eq(kvb_state_add_counter(s, &c1), 0);
    ck_assert_int_eq(kvb_state_add_counter(s, &c2), 0);
    struct kvb_stream st;
    kvb_stream_init(&st, "x", 0);
    kvb_stream_resume(&st, UINT64_MAX - 1, (const uint32_t[]){0, 5}, 2);
    ck_assert_int_eq(kvb_state_add_stream(s, "tcp://127.0.0.1:5557", "", &st), 0);
    st.last = 9;
    st.n_ranks = 0;
    ck_assert_int_eq(kvb_state_add_stream(s, "tcp://127.0.0.1:5558", "kv events\x01", &st), 0);
    ck_assert_int_eq(kvb_state_save(dir, s), 0);
    kvb_state_free(&s);
    ck_assert(s == NULL);

    struct kvb_state *l = NULL;
    ck_assert_int_eq(kvb_state_load(dir, &l), 0);
    ck_assert_uint_eq(l->n_counters, 2);
    ck_assert_uint_eq(l->counters[0].worker_id, UINT64_MAX);
    ck_assert_uint_eq(l->counters[0].next_id, 12345);
    ck_assert_uint_eq(l->counters[0].epoch, 1796040478869ULL);
    ck_assert_uint_eq(l->counters[1].dp_rank, 3);
    ck_assert_uint_eq(l->n_streams, 2);
    const struct kvb_state_stream *e = kvb_state_find_stream(l, "tcp://127.0.0.1:5557", "");
    ck_assert(e != NULL);
    ck_assert_uint_eq(e->last, UINT64_MAX - 1);
    ck_assert_uint_eq(e->n_ranks, 2);
    ck_assert_uint_eq(e->ranks[1], 5);
    e = kvb_state_find_stream(l, "tcp://127.0.0.1:5558", "kv events\x01");
    ck_assert(e != NULL);
    ck_assert_uint_eq(e->last, 9);
    ck_assert_uint_eq(e->n_ranks, 0);
    ck_assert(kvb_state_find_stream(l, "tcp://127.0.0.1:5558", "") == NULL);
    kvb_state_free(&l);
    kvb_state_free(&l); /* NULL-safe */

    /* no temp file left behind */
    char p[128];
    snprintf(p, sizeof(p), "%s/kvbridge.state.tmp", dir);
    ck_assert_int_ne(access(p, F_OK), 0);
}
END_TEST

/* The block tracker's entries, every kind of record, through the file. */
START_TEST(track_round_trip)
{
    struct kvb_state *s = kvb_state_new(), *l = NULL;
    static const struct kvb_track_rec in[] = {
        /* static: zero padding, for memcmp */
        {.what = KVB_TREC_KIND, .worker_id = UINT64_MAX, .dp_rank = 3, .group = -1, .val = 2},
        {.what = KVB_TREC_KIND, .worker_id = 9, .dp_rank = 0, .group = INT64_MAX, .val = 1},
        {.what = KVB_TREC_COPY, .worker_id = 9, .tier = 2, .hash = UINT64_MAX, .val = 1ULL << 63},
        {.what = KVB_TREC_NS, .worker_id = 9, .dp_rank = 1, .hash = 7, .state = 2, .val = 0xabc},
        {.what = KVB_TREC_NS, .worker_id = 9, .hash = 8, .state = 1, .val = 5, .tier = 3},
    };
    for (size_t i = 0; i < 5; i++)
        ck_assert_int_eq(kvb_state_add_track(s, &in[i]), 0);
    ck_assert_int_eq(kvb_state_save(dir, s), 0);
    ck_assert_int_eq(kvb_state_load(dir, &l), 0);
    ck_assert_uint_eq(l->n_track, 5);
    for (size_t i = 0; i < 5; i++)
        ck_assert_msg(memcmp(&l->track[i], &in[i], sizeof(in[i])) == 0, "record %zu", i);
    kvb_state_free(&s);
    kvb_state_free(&l);
}
END_TEST

START_TEST(missing_and_corrupt)
{
    struct kvb_state *l = NULL;
    ck_assert_int_eq(kvb_state_load(dir, &l), -ENOENT);
    static const char *bad[] = {
        "",
        "kvbridge-state 3\nend\n",                          /* a future version */
        "kvbridge-state 1\ncopy 9 0 0 a 2\nend\n",          /* tracker lines: version 2 */
        "kvbridge-state 2\ncopy 9 0 0 a\nend\n",            /* missing field */
        "kvbridge-state 2\nkind 9 0 1 1 7\nend\n",          /* extra field */
        "kvbridge-state 2\nns 9 0 a 256 5\nend\n",          /* state out of range */
        "kvbridge-state 2\nns 9 0 a 1 5 100\nend\n",        /* tiers out of range */
        "kvbridge-state 2\nns 9 0 a 1 5 1 1\nend\n",        /* extra field */
        "kvbridge-state 2\ncopy 9 0 0 zz 2\nend\n",         /* bad hex */
        "kvbridge-state 1\n",                               /* no end: cut short */
        "kvbridge-state 1\ncounter 1 2 3\nend\n",           /* missing field */
        "kvbridge-state 1\ncounter 1 2 3 4 5\nend\n",       /* extra field */
        "kvbridge-state 1\nstream tcp://a - x 0\nend\n",    /* bad seq */
        "kvbridge-state 1\nstream tcp://a 6 1 0\nend\n",    /* odd hex */
        "kvbridge-state 1\nstream tcp://a 00 1 0\nend\n",   /* NUL in topic */
        "kvbridge-state 1\nstream tcp://a - 1 1,,2\nend\n", /* bad ranks */
        "kvbridge-state 1\nbogus\nend\n",
        "kvbridge-state 1\nend\ncounter 1 2 3 4\n", /* data after end */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        write_file(bad[i]);
        ck_assert_msg(kvb_state_load(dir, &l) == -EINVAL, "case %zu", i);
        ck_assert(l == NULL);
    }
    /* version 1 (before the tracker) is still read: an empty tracker */
    write_file("kvbridge-state 1\ncounter 1 2 3 4\nstream tcp://a 6b76 10 0,1\nend\n");
    ck_assert_int_eq(kvb_state_load(dir, &l), 0);
    ck_assert_str_eq(l->streams[0].topic, "kv");
    ck_assert_uint_eq(l->n_track, 0);
    kvb_state_free(&l);
    /* an ns line without its tiers: none noted */
    write_file("kvbridge-state 2\nns 9 0 a 1 5\nend\n");
    ck_assert_int_eq(kvb_state_load(dir, &l), 0);
    ck_assert_uint_eq(l->n_track, 1);
    ck_assert_uint_eq(l->track[0].tier, 0);
    ck_assert_uint_eq(l->track[0].val, 5);
    kvb_state_free(&l);
}
END_TEST

START_TEST(save_replaces_whole_file)
{
    struct kvb_state *s = kvb_state_new();
    struct kvb_id_counter c = {1, 0, 1, 1};
    for (int i = 0; i < 100; i++) {
        c.next_id = (uint64_t)i;
        kvb_state_add_counter(s, &c);
    }
    ck_assert_int_eq(kvb_state_save(dir, s), 0);
    kvb_state_free(&s);
    s = kvb_state_new();
    c.next_id = 77;
    kvb_state_add_counter(s, &c);
    ck_assert_int_eq(kvb_state_save(dir, s), 0);
    kvb_state_free(&s);
    struct kvb_state *l = NULL;
    ck_assert_int_eq(kvb_state_load(dir, &l), 0);
    ck_assert_uint_eq(l->n_counters, 1);
    ck_assert_uint_eq(l->counters[0].next_id, 77);
    kvb_state_free(&l);
    /* an unwritable directory is an error, not a crash */
    s = kvb_state_new();
    ck_assert_int_lt(kvb_state_save("/nonexistent/dir", s), 0);
    kvb_state_free(&s);
}
END_TEST

/* state.dir at --check and start: created with its parents (0700), found
 * writable; a path under a regular file fails (as root too). */
START_TEST(prepare_dir)
{
    char p[160], q[160], f[160];
    const char *what = NULL;
    struct stat st;
    snprintf(p, sizeof(p), "%s/x/y/", dir);
    ck_assert_int_eq(kvb_state_prepare_dir(p, &what), 0);
    snprintf(p, sizeof(p), "%s/x/y", dir);
    ck_assert_int_eq(stat(p, &st), 0);
    ck_assert(S_ISDIR(st.st_mode));
    ck_assert_uint_eq(st.st_mode & 07777, 0700);
    snprintf(q, sizeof(q), "%s/x", dir);
    ck_assert_int_eq(stat(q, &st), 0);
    ck_assert_uint_eq(st.st_mode & 07777, 0700);
    /* existing: fine, and the test file is gone */
    ck_assert_int_eq(kvb_state_prepare_dir(p, &what), 0);
    ck_assert_int_eq(rmdir(p), 0); /* empty */
    ck_assert_int_eq(rmdir(q), 0);

    snprintf(f, sizeof(f), "%s/file", dir);
    FILE *fp = fopen(f, "w");
    ck_assert(fp != NULL);
    fclose(fp);
    snprintf(p, sizeof(p), "%s/file/sub", dir);
    ck_assert_int_eq(kvb_state_prepare_dir(p, &what), -ENOTDIR);
    ck_assert_str_eq(what, "cannot create");
    ck_assert_int_eq(kvb_state_prepare_dir(f, &what), -ENOTDIR); /* not a directory */
    ck_assert_str_eq(what, "cannot use");
    ck_assert_int_eq(unlink(f), 0);
}
END_TEST

static Suite *state_suite(void)
{
    Suite *s = suite_create("state");
    TCase *tc = tcase_create("state");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, round_trip);
    tcase_add_test(tc, track_round_trip);
    tcase_add_test(tc, missing_and_corrupt);
    tcase_add_test(tc, save_replaces_whole_file);
    tcase_add_test(tc, prepare_dir);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(state_suite()); }
