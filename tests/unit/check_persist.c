/* mirror_state: the mirror saved with its cursors and loaded back; pairs the
 * file cannot vouch for (stale, another epoch, no file, corrupt) are listed
 * for a barrier. */
#include "testutil.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include <xxhash.h>

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

/* The events of a pair's ring, as text: "id:type:n:first:tier:scoped," each. */
struct ring_text {
    char s[8192];
    size_t len;
};

static int ring_fn(void *ctx, const struct kvb_rev *r)
{
    struct ring_text *t = ctx;
    uint64_t first = r->type == KVB_REVT_STORED    ? r->blocks[r->n - 1].tokens_hash
                     : r->type == KVB_REVT_REMOVED ? r->hashes[0]
                                                   : 0;
    t->len += (size_t)snprintf(t->s + t->len, sizeof(t->s) - t->len, "%llu:%d:%u:%llu:%d:%d,",
                               (unsigned long long)r->event_id, r->type, r->n,
                               (unsigned long long)first, r->tier, r->scoped);
    return 0;
}

static void ring_of(struct kvb_index *m, uint64_t since, struct ring_text *t)
{
    t->len = 0;
    t->s[0] = 0;
    ck_assert_int_eq(kvb_index_events_since(m, W, 0, since, ring_fn, t), 0);
}

/* The ring comes back (a consumer cut off across a restart resumes from
 * it), and so do the blocks a repair still owes. */
START_TEST(ring_and_missing_marks_round_trip)
{
    char d[] = "/tmp/kvb-mirror-ring.XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(d));
    struct kvb_index *m = mk();
    uint64_t id = 0;
    struct kvb_block b[8];
    for (uint32_t i = 0; i < 8; i++)
        b[i] = (struct kvb_block){100 + i, 900 + i};
    struct kvb_rev s = {.type = KVB_REVT_STORED, .worker_id = W, .blocks = b, .n = 8};
    s.event_id = id++;
    ck_assert_int_eq(kvb_index_apply(m, &s), 0);
    uint64_t gone = 107;
    struct kvb_rev r = {.type = KVB_REVT_REMOVED, .worker_id = W, .hashes = &gone, .n = 1};
    r.event_id = id++;
    ck_assert_int_eq(kvb_index_apply(m, &r), 0);
    struct kvb_rev h = s; /* a branch in the host tier */
    h.tier = KVB_TIER_HOST_PINNED;
    h.n = 3;
    h.event_id = id++;
    ck_assert_int_eq(kvb_index_apply(m, &h), 0);
    /* a scoped "cleared" of a tier the pair does not use: in the ring only */
    struct kvb_rev sc = {
        .type = KVB_REVT_CLEARED, .tier = KVB_TIER_DISK, .scoped = true, .worker_id = W};
    sc.event_id = id++;
    ck_assert_int_eq(kvb_index_apply(m, &sc), 0);
    /* a repair under way: its barrier, one of its events out */
    struct kvb_rev c = {.type = KVB_REVT_CLEARED, .worker_id = W, .repair = true};
    c.event_id = id++;
    ck_assert_int_eq(kvb_index_repair_begin(m, W, 0), 0);
    ck_assert_int_eq(kvb_index_record(m, &c), 0);
    struct kvb_rev out;
    ck_assert_int_eq(kvb_index_repair_next(m, 4, 1000, &out), 1);
    out.event_id = id++;
    ck_assert_int_eq(kvb_index_record(m, &out), 0);
    uint64_t missing = kvb_index_missing(m, W, 0);
    ck_assert_uint_eq(missing, 10 - 4);

    struct kvb_persist *sv = NULL;
    ck_assert_int_eq(kvb_persist_create(&sv), 0);
    struct kvb_state *st = kvb_state_new();
    struct kvb_id_counter k = {W, 0, id, 5};
    ck_assert_int_eq(kvb_state_add_counter(st, &k), 0);
    ck_assert_int_eq(kvb_persist_save_start(sv, m, d, &st, true), 0);
    kvb_persist_destroy(&sv);
    struct kvb_state *back = NULL;
    ck_assert_int_eq(kvb_state_load(d, &back), 0);
    struct kvb_index *m2 = mk();
    struct kvb_index_pair v[2];
    size_t loaded = 0;
    ck_assert_int_eq(kvb_persist_load(m2, d, back, v, 2, &loaded), 0);
    ck_assert_uint_eq(loaded, 1);

    struct ring_text a, z;
    ring_of(m, 0, &a);
    ring_of(m2, 0, &z);
    ck_assert_str_eq(z.s, a.s); /* every event after 0, as they were */
    ck_assert_uint_gt(a.len, 0);
    char want[64];
    snprintf(want, sizeof(want), ",%llu:%d:0:0:%d:1,", (unsigned long long)sc.event_id,
             KVB_REVT_CLEARED, KVB_TIER_DISK);
    ck_assert_msg(strstr(z.s, want) != NULL, "no scoped cleared %s in %s", want, z.s);
    ring_of(m2, id - 2, &z); /* the last one alone: the tail of the same text */
    ck_assert(z.len > 0 && z.len < a.len && strcmp(a.s + a.len - z.len, z.s) == 0);
    ck_assert_ptr_eq(strchr(z.s, ','), z.s + z.len - 1);
    uint64_t last = 0;
    ck_assert(kvb_index_last_event_id(m2, W, 0, &last));
    ck_assert_uint_eq(last, id - 1);
    ck_assert_uint_eq(kvb_index_blocks(m2, -1), kvb_index_blocks(m, -1));
    ck_assert_uint_eq(kvb_index_missing(m2, W, 0), missing); /* the repair goes on */
    int events = 0;
    while (kvb_index_repair_next(m2, 4, 1000, &out) == 1)
        events++;
    ck_assert_int_ge(events, 2);
    ck_assert_uint_eq(kvb_index_missing(m2, W, 0), 0);
    kvb_index_destroy(&m2);
    kvb_index_destroy(&m);
    kvb_state_free(&back);
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", d, KVB_MIRROR_FILE);
    unlink(path);
    snprintf(path, sizeof(path), "%s/kvbridge.state", d);
    unlink(path);
    rmdir(d);
}
END_TEST

/* A hand-written mirror file of VERSION, up to its one pair's epoch:
 * (W, dp_rank 0), last event_id 41, epoch 5.  Returns its length. */
static size_t file_head(uint8_t *buf, uint32_t version)
{
    size_t n = 0;
    uint32_t u32[4] = {version, 1, 0, 1}; /* version, pairs; dp_rank, has_last */
    uint64_t w = W, last = 41, epoch = 5;
    memcpy(buf + n, "KVBMIRR1", 8), n += 8;
    memcpy(buf + n, u32, 8), n += 8;
    memcpy(buf + n, &w, 8), n += 8;
    memcpy(buf + n, u32 + 2, 8), n += 8;
    memcpy(buf + n, &last, 8), n += 8;
    memcpy(buf + n, &epoch, 8), n += 8;
    return n;
}

/* A file of version 1 (no ring, no marks) still loads: an empty ring. */
START_TEST(version_1_still_loads)
{
    char d[] = "/tmp/kvb-mirror-v1.XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(d));
    uint8_t buf[256];
    size_t n = file_head(buf, 1);
#define PUT(p, len) (memcpy(buf + n, (p), (len)), n += (len))
    uint64_t u64;
    uint8_t hdr[8] = {KVB_TIER_DEVICE, 0, 0, 0, 2, 0, 0, 0};
    PUT(hdr, 8);
    u64 = 0;
    PUT(&u64, 8); /* parent */
    uint64_t blocks[4] = {1, 11, 2, 12};
    PUT(blocks, sizeof(blocks));
    uint8_t end[8] = {0xff, 0, 0, 0, 0, 0, 0, 0};
    PUT(end, 8);
    u64 = XXH64(buf, n, 0);
    PUT(&u64, 8);
#undef PUT
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", d, KVB_MIRROR_FILE);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(buf, 1, n, f), n);
    fclose(f);
    struct kvb_state *st = kvb_state_new();
    struct kvb_id_counter k = {W, 0, 42, 5};
    ck_assert_int_eq(kvb_state_add_counter(st, &k), 0);
    struct kvb_index *m = mk();
    struct kvb_index_pair v[2];
    size_t loaded = 0;
    ck_assert_int_eq(kvb_persist_load(m, d, st, v, 2, &loaded), 0);
    ck_assert_uint_eq(loaded, 1);
    ck_assert_uint_eq(kvb_index_blocks(m, -1), 2);
    ck_assert_uint_eq(kvb_index_missing(m, W, 0), 0);
    struct ring_text t;
    ck_assert_int_eq(kvb_index_events_since(m, W, 0, 40, ring_fn, &t), -ESTALE);
    kvb_index_destroy(&m);
    kvb_state_free(&st);
    unlink(path);
    rmdir(d);
}
END_TEST

/* A version 2 file whose pair's ring holds two "cleared" of host_pinned,
 * the flags byte of the second `flags` (the first's 0, as files of builds
 * before scoped clears wrote); loaded against cursors at 42. */
static size_t ring_file(uint8_t *buf, uint8_t flags)
{
    size_t n = file_head(buf, 2);
#define PUT(p, len) (memcpy(buf + n, (p), (len)), n += (len))
    uint32_t u32;
    uint64_t u64;
    uint8_t end[8] = {0xff, 0, 0, 0, 0, 0, 0, 0};
    PUT(end, 8);
    u32 = 2;
    PUT(&u32, 4); /* events */
    u32 = 0;
    PUT(&u32, 4);
    for (uint64_t id = 40; id <= 41; id++) {
        PUT(&id, 8);
        u64 = 5;
        PUT(&u64, 8); /* epoch */
        uint8_t hdr[8] = {
            KVB_REVT_CLEARED, KVB_TIER_HOST_PINNED, 0, id == 41 ? flags : 0, 0, 0, 0, 0};
        PUT(hdr, 8);
        u64 = 0;
        PUT(&u64, 8); /* parent */
    }
    u64 = XXH64(buf, n, 0);
    PUT(&u64, 8);
#undef PUT
    return n;
}

/* A ring event's flags byte: 1 is a scoped "cleared" (0, older files:
 * unscoped); any other value makes the file corrupt (a barrier). */
START_TEST(ring_scoped_flag)
{
    char d[] = "/tmp/kvb-mirror-flags.XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(d));
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", d, KVB_MIRROR_FILE);
    for (uint8_t flags = 0; flags <= 2; flags++) {
        uint8_t buf[256];
        size_t n = ring_file(buf, flags);
        FILE *f = fopen(path, "wb");
        ck_assert_ptr_nonnull(f);
        ck_assert_uint_eq(fwrite(buf, 1, n, f), n);
        fclose(f);
        struct kvb_state *st = kvb_state_new();
        struct kvb_id_counter k = {W, 0, 42, 5};
        ck_assert_int_eq(kvb_state_add_counter(st, &k), 0);
        struct kvb_index *m = mk();
        struct kvb_index_pair v[2];
        size_t loaded = 0;
        int barriers = kvb_persist_load(m, d, st, v, 2, &loaded);
        if (flags == 2) {
            ck_assert_int_eq(barriers, 1);
            ck_assert_uint_eq(loaded, 0);
        } else {
            ck_assert_int_eq(barriers, 0);
            ck_assert_uint_eq(loaded, 1);
            struct ring_text t;
            ring_of(m, 39, &t);
            char want[128];
            snprintf(want, sizeof(want), "40:%d:0:0:%d:0,41:%d:0:0:%d:%d,", KVB_REVT_CLEARED,
                     KVB_TIER_HOST_PINNED, KVB_REVT_CLEARED, KVB_TIER_HOST_PINNED, flags);
            ck_assert_str_eq(t.s, want);
        }
        kvb_index_destroy(&m);
        kvb_state_free(&st);
    }
    unlink(path);
    rmdir(d);
}
END_TEST

/* No mirror (limits.max_resident_blocks: 0): the cursors alone, written by
 * the saver's thread all the same; no mirror file. */
START_TEST(cursors_alone_off_the_loop)
{
    char d[] = "/tmp/kvb-state-only.XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(d));
    struct kvb_persist *s;
    ck_assert_int_eq(kvb_persist_create(&s), 0);
    struct kvb_state *st = cursors(7, 5, 3);
    struct kvb_track_rec r = {.what = KVB_TREC_COPY, .worker_id = W, .hash = 9, .val = 1};
    ck_assert_int_eq(kvb_state_add_track(st, &r), 0);
    ck_assert_int_eq(kvb_persist_save_start(s, NULL, d, &st, false), 0);
    ck_assert_ptr_null(st); /* the saver's now */
    bool done = false;
    int rc = 0;
    for (int i = 0; i < 5000 && !done; i++) {
        rc = kvb_persist_save_result(s, &done);
        if (!done)
            usleep(1000);
    }
    ck_assert_msg(done, "the saver did not finish in 5 s");
    ck_assert_int_eq(rc, 0);
    struct kvb_state *l = NULL;
    ck_assert_int_eq(kvb_state_load(d, &l), 0);
    ck_assert_uint_eq(l->n_counters, 2);
    ck_assert_uint_eq(l->n_track, 1);
    kvb_state_free(&l);
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", d, KVB_MIRROR_FILE);
    ck_assert_int_ne(access(path, F_OK), 0);
    kvb_persist_destroy(&s);
    snprintf(path, sizeof(path), "rm -rf '%s'", d);
    ck_assert_int_eq(system(path), 0);
}
END_TEST

static Suite *mirror_state_suite(void)
{
    Suite *s = suite_create("mirror_state");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, round_trip);
    tcase_add_test(tc, ring_and_missing_marks_round_trip);
    tcase_add_test(tc, ring_scoped_flag);
    tcase_add_test(tc, version_1_still_loads);
    tcase_add_test(tc, cursors_alone_off_the_loop);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(mirror_state_suite()); }
