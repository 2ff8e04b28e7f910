/* mirror_state: the mirror saved with its cursors and loaded back; pairs the
 * file cannot vouch for (stale, another epoch, no file, corrupt) are listed
 * for a barrier. */
#include "testutil.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "mirror/persist.h"

#define W 7u

static struct kvb_index *mk(void)
{
    struct kvb_index_cfg cfg = {100000, 16};
    struct kvb_index *m = NULL;
    ck_assert_int_eq(kvb_index_create(&cfg, &m), 0);
    return m;
}

/* rank r: a chain of n blocks (hash base+i, tokens_hash i) in one event,
 * then a second tier, event ids from 0; returns the next id. */
static uint64_t fill(struct kvb_index *m, uint32_t r, uint64_t base, uint32_t n)
{
    struct kvb_block b[64];
    for (uint32_t i = 0; i < n; i++)
        b[i] = (struct kvb_block){base + i, i};
    struct kvb_rev s = {
        .type = KVB_REVT_STORED, .dp_rank = r, .worker_id = W, .event_id = 0, .blocks = b, .n = n};
    ck_assert_int_eq(kvb_index_apply(m, &s), 0);
    struct kvb_rev h = s;
    h.tier = KVB_TIER_HOST_PINNED;
    h.event_id = 1;
    h.n = 2;
    ck_assert_int_eq(kvb_index_apply(m, &h), 0);
    return 2;
}

static char dir[] = "/tmp/kvb-mirror-state.XXXXXX";

static struct kvb_state *cursors(uint64_t next0, uint64_t epoch0, uint64_t next1)
{
    struct kvb_state *st = kvb_state_new();
    struct kvb_id_counter c0 = {W, 0, next0, epoch0}, c1 = {W, 1, next1, 5};
    ck_assert_int_eq(kvb_state_add_counter(st, &c0), 0);
    ck_assert_int_eq(kvb_state_add_counter(st, &c1), 0);
    return st;
}

START_TEST(round_trip)
{
    ck_assert_ptr_nonnull(mkdtemp(dir));
    struct kvb_index *m = mk();
    uint64_t n0 = fill(m, 0, 1000, 40), n1 = fill(m, 1, 5000, 3);
    struct kvb_persist *sv = NULL;
    ck_assert_int_eq(kvb_persist_create(&sv), 0);
    struct kvb_state *st = cursors(n0, 5, n1);
    ck_assert_int_eq(kvb_persist_save_start(sv, m, dir, &st, true), 0);
    ck_assert_ptr_null(st); /* taken */
    /* in the background: started (st taken), or refused while paced */
    st = cursors(n0, 5, n1);
    int rc = kvb_persist_save_start(sv, m, dir, &st, false);
    ck_assert_msg(rc == 0 || rc == -EBUSY, "rc %d", rc);
    ck_assert(rc == 0 ? st == NULL : st != NULL);
    kvb_state_free(&st);
    kvb_persist_destroy(&sv); /* waits for it */

    /* the cursor file went with it */
    struct kvb_state *back = NULL;
    ck_assert_int_eq(kvb_state_load(dir, &back), 0);
    ck_assert_uint_eq(back->n_counters, 2);

    /* consistent: both pairs load, nothing to clear */
    struct kvb_index *m2 = mk();
    struct kvb_index_pair v[4];
    size_t loaded = 0;
    ck_assert_int_eq(kvb_persist_load(m2, dir, back, v, 4, &loaded), 0);
    ck_assert_uint_eq(loaded, 2);
    ck_assert_uint_eq(kvb_index_blocks(m2, -1), kvb_index_blocks(m, -1));
    ck_assert_uint_eq(kvb_index_blocks(m2, KVB_TIER_HOST_PINNED), 4);
    uint64_t last = 0;
    ck_assert(kvb_index_last_event_id(m2, W, 0, &last));
    ck_assert_uint_eq(last, n0 - 1);
    uint64_t th[40];
    for (int i = 0; i < 40; i++)
        th[i] = (uint64_t)i;
    uint32_t k[KVB_TIER__COUNT];
    kvb_index_match(m2, W, 0, th, 40, k); /* the parent links came back too */
    ck_assert_uint_eq(k[KVB_TIER_DEVICE], 40);
    ck_assert_uint_eq(k[KVB_TIER_HOST_PINNED], 2);
    kvb_index_destroy(&m2);
    kvb_state_free(&back);

    /* rank 0 stale (its counter moved on), rank 1 fine */
    struct kvb_state *cur = cursors(n0 + 3, 5, n1);
    m2 = mk();
    ck_assert_int_eq(kvb_persist_load(m2, dir, cur, v, 4, &loaded), 1);
    ck_assert_uint_eq(loaded, 1);
    ck_assert_uint_eq(v[0].dp_rank, 0);
    ck_assert_uint_eq(kvb_index_blocks(m2, -1), 5);
    kvb_index_destroy(&m2);
    kvb_state_free(&cur);

    /* another epoch */
    cur = cursors(n0, 6, n1);
    m2 = mk();
    ck_assert_int_eq(kvb_persist_load(m2, dir, cur, v, 4, &loaded), 1);
    kvb_index_destroy(&m2);

    /* corrupt: one byte changed, every pair is cleared */
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, KVB_MIRROR_FILE);
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    fseek(f, 40, SEEK_SET);
    fputc(0x55, f);
    fclose(f);
    kvb_state_free(&cur);
    cur = cursors(n0, 5, n1);
    m2 = mk();
    ck_assert_int_eq(kvb_persist_load(m2, dir, cur, v, 4, &loaded), 2);
    ck_assert_uint_eq(loaded, 0);
    kvb_index_destroy(&m2);

    /* no file */
    unlink(path);
    m2 = mk();
    ck_assert_int_eq(kvb_persist_load(m2, dir, cur, v, 4, &loaded), 2);
    kvb_index_destroy(&m2);
    kvb_state_free(&cur);

    snprintf(path, sizeof(path), "%s/kvbridge.state", dir);
    unlink(path);
    rmdir(dir);
    kvb_index_destroy(&m);
}
END_TEST

static Suite *mirror_state_suite(void)
{
    Suite *s = suite_create("mirror_state");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, round_trip);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(mirror_state_suite()); }
