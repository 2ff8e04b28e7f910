/* repair: router events lost on the NATS side, repaired from the residency
 * mirror (docs/router-events.md section 6, "Repairs"), as a rule across
 * modules: the pipeline and its publish stage (dynamo-json, a writer) with
 * the real mirror (src/mirror/mirror.c) as the publish stage's observer.
 *
 * A consumer that lost events, then got the repair's "cleared" and every
 * message after it (the repair's stored events interleaved with live
 * batches), ends with exactly the blocks of a consumer that never lost
 * anything; event_ids stay contiguous; the mirror's own view does not move
 * with the repair's events. */
#include "testutil.h"

#include <errno.h>
#include <json-c/json.h>
#include <unistd.h>

#include "mirror.h"
#include "mirror/index.h"

#define W 7u
#define BS 4

static struct kvb_metrics m;
static struct sink_lines out;
static struct kvb_pipeline *p;
static struct kvb_publish *pub;
static struct kvb_replay *rules;
static struct kvb_config *cfg;
static struct kvb_mirror *mir;
static char cfg_path[64];

static void setup(void)
{
    memset(&m, 0, sizeof(m));
    memset(&out, 0, sizeof(out));
    struct kvb_pipeline_cfg c = test_pcfg(W, BS);
    test_pipeline_create(&c, &m, &out, &pub, &p);
    rules = test_rules(p, &m, 0);
    strcpy(cfg_path, "/tmp/check_repair.XXXXXX");
    int fd = mkstemp(cfg_path);
    ck_assert_int_ge(fd, 0);
    static const char yaml[] = "worker_id: 7\nblock_size: 4\nsources:\n"
                               "  - endpoint: tcp://127.0.0.1:1\nquery:\n  recent_events: 64\n";
    ck_assert_int_eq(write(fd, yaml, sizeof(yaml) - 1), (ssize_t)sizeof(yaml) - 1);
    close(fd);
    ck_assert_int_eq(kvb_config_load(cfg_path, &cfg, stderr), 0);
    ck_assert_int_eq(kvb_mirror_create(cfg, &m, -1, &mir), 0);
    kvb_publish_set_observer(pub, kvb_mirror_observe, mir);
}

static void teardown(void)
{
    kvb_replay_destroy(&rules);
    test_pipeline_destroy(&pub, &p);
    kvb_mirror_close(mir);
    kvb_mirror_destroy(&mir);
    kvb_config_free(&cfg);
    unlink(cfg_path);
    free(out.text);
}

static uint32_t rng = 99;
static uint32_t rnd(uint32_t n)
{
    rng = rng * 1103515245u + 12345u;
    return (rng >> 8) % n;
}

/* ---- engine batches ------------------------------------------------------- */

static void pack_store(struct mp *mb, const uint64_t *h, uint32_t n, bool has_parent,
                       uint64_t parent)
{
    msgpack_pack_array(&mb->pk, 6);
    mp_str(mb, "BlockStored");
    msgpack_pack_array(&mb->pk, n);
    for (uint32_t i = 0; i < n; i++)
        msgpack_pack_uint64(&mb->pk, h[i]);
    if (has_parent)
        msgpack_pack_uint64(&mb->pk, parent);
    else
        msgpack_pack_nil(&mb->pk);
    msgpack_pack_array(&mb->pk, n * BS); /* a block's tokens follow from its hash */
    for (uint32_t i = 0; i < n; i++)
        for (int t = 0; t < BS; t++)
            msgpack_pack_uint32(&mb->pk, (uint32_t)(h[i] * 10 + (uint64_t)t));
    msgpack_pack_int(&mb->pk, BS);
    msgpack_pack_nil(&mb->pk);
}

static void pack_remove(struct mp *mb, uint64_t h)
{
    msgpack_pack_array(&mb->pk, 2);
    mp_str(mb, "BlockRemoved");
    msgpack_pack_array(&mb->pk, 1);
    msgpack_pack_uint64(&mb->pk, h);
}

/* One engine batch of 1..3 random events (rank 0) through the rules. */
static void random_batch(struct kvb_stream *s, uint64_t seq)
{
    struct mp mb;
    mp_init(&mb);
    uint32_t n = 1 + rnd(3);
    msgpack_pack_array(&mb.pk, 3);
    msgpack_pack_double(&mb.pk, 1.0);
    msgpack_pack_array(&mb.pk, n);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t k = rnd(100);
        if (k < 70) {
            uint64_t h[3];
            uint32_t nb = 1 + rnd(3);
            for (uint32_t j = 0; j < nb; j++)
                h[j] = 1 + rnd(150);
            pack_store(&mb, h, nb, rnd(5) != 0, 1 + rnd(150));
        } else if (k < 98) {
            pack_remove(&mb, 1 + rnd(150));
        } else {
            msgpack_pack_array(&mb.pk, 1);
            mp_str(&mb, "AllBlocksCleared");
        }
    }
    msgpack_pack_int(&mb.pk, 0);
    ck_assert_int_ge(kvb_replay_live(rules, s, seq, mp_data(&mb), mb.sb.size, 0), 0);
    mp_free(&mb);
}

/* ---- consumers: the published lines applied to an index ------------------ */

static uint64_t u64_of(json_object *o) { return json_object_get_uint64(o); }

/* Line text -> router event applied to c (a consumer, as a router applies). */
static void apply_line(struct kvb_index *c, const char *l, size_t len, uint64_t *id)
{
    json_object *o = json_tokener_parse(l);
    ck_assert_msg(o != NULL, "not JSON: %.*s", (int)len, l);
    json_object *ev = json_object_object_get(o, "event"), *data;
    data = json_object_object_get(ev, "data");
    struct kvb_rev r = {.worker_id = u64_of(json_object_object_get(o, "worker_id")),
                        .event_id = u64_of(json_object_object_get(ev, "event_id")),
                        .dp_rank = (uint32_t)u64_of(json_object_object_get(ev, "dp_rank"))};
    struct kvb_block b[512];
    uint64_t hs[512];
    json_object *st, *rm;
    if (json_object_is_type(data, json_type_string)) {
        r.type = KVB_REVT_CLEARED;
    } else if (json_object_object_get_ex(data, "stored", &st)) {
        r.type = KVB_REVT_STORED;
        json_object *ph = json_object_object_get(st, "parent_hash");
        r.has_parent = ph && !json_object_is_type(ph, json_type_null);
        r.parent = r.has_parent ? u64_of(ph) : 0;
        json_object *bl = json_object_object_get(st, "blocks");
        r.n = (uint32_t)json_object_array_length(bl);
        ck_assert_uint_le(r.n, 512);
        for (uint32_t i = 0; i < r.n; i++) {
            json_object *e = json_object_array_get_idx(bl, i);
            b[i] = (struct kvb_block){u64_of(json_object_object_get(e, "block_hash")),
                                      u64_of(json_object_object_get(e, "tokens_hash"))};
        }
        r.blocks = b;
    } else {
        ck_assert(json_object_object_get_ex(data, "removed", &rm));
        r.type = KVB_REVT_REMOVED;
        json_object *hl = json_object_object_get(rm, "block_hashes");
        r.n = (uint32_t)json_object_array_length(hl);
        for (uint32_t i = 0; i < r.n; i++)
            hs[i] = u64_of(json_object_array_get_idx(hl, i));
        r.hashes = hs;
    }
    if (id)
        *id = r.event_id;
    ck_assert_int_eq(kvb_index_apply(c, &r), 0);
    json_object_put(o);
}

/* The lines published since the last call, each to c (NULL: lost) and,
 * unless they are the repair's, to truth (a consumer that never lost
 * anything, without the repair); event_ids checked contiguous. */
struct feed_state {
    unsigned done; /* lines handed on so far */
    uint64_t next; /* the event_id the next line must carry */
    bool have_next;
};

static void hand_on(struct feed_state *fs, struct kvb_index *c, struct kvb_index *truth,
                    bool repair)
{
    const char *q = out.text;
    for (unsigned i = 0; q && i < fs->done; i++)
        q = strchr(q, '\n') + 1;
    for (; fs->done < out.n; fs->done++) {
        const char *e = strchr(q, '\n');
        uint64_t id;
        char *l = strndup(q, (size_t)(e - q));
        if (c)
            apply_line(c, l, strlen(l), &id);
        if (!repair)
            apply_line(truth, l, strlen(l), &id);
        if (fs->have_next)
            ck_assert_uint_eq(id, fs->next);
        fs->next = id + 1;
        fs->have_next = true;
        free(l);
        q = e + 1;
    }
}

struct blk {
    uint64_t hash, tokens;
};

static int blk_cmp(const void *a, const void *b)
{
    const struct blk *x = a, *y = b;
    if (x->hash != y->hash)
        return x->hash < y->hash ? -1 : 1;
    return x->tokens < y->tokens ? -1 : x->tokens > y->tokens;
}

static struct blk *blocks_of(struct kvb_index *ix, size_t *n)
{
    struct kvb_index_snap *s = NULL;
    ck_assert_int_eq(kvb_index_snapshot(ix, W, 0, &s), 0);
    struct blk *v = calloc(kvb_index_snap_blocks(s) + 1, sizeof(*v));
    size_t k = 0;
    struct kvb_rev r;
    while (kvb_index_snap_next(s, 1, &r) == 1)
        v[k++] = (struct blk){r.blocks[0].block_hash, r.blocks[0].tokens_hash};
    kvb_index_snap_free(&s);
    qsort(v, k, sizeof(*v), blk_cmp);
    *n = k;
    return v;
}

static void same_blocks(struct kvb_index *a, struct kvb_index *b)
{
    size_t na, nb;
    struct blk *va = blocks_of(a, &na), *vb = blocks_of(b, &nb);
    ck_assert_uint_eq(na, nb);
    for (size_t i = 0; i < na; i++) {
        ck_assert_uint_eq(va[i].hash, vb[i].hash);
        ck_assert_uint_eq(va[i].tokens, vb[i].tokens);
    }
    free(va);
    free(vb);
}

static uint64_t mirror_blocks(void)
{
    kvb_mirror_gauges(mir);
    return kvb_get(&m.mirror_resident_blocks[KVB_TIER_DEVICE]);
}

/* One repair event, if any is owed: 1 or 0. */
static int repair_one(uint32_t max_blocks)
{
    struct kvb_rev r;
    int rc = kvb_mirror_repair_next(mir, max_blocks, &r);
    ck_assert_int_ge(rc, 0);
    if (rc == 0)
        return 0;
    uint64_t before = mirror_blocks();
    ck_assert_int_eq(kvb_pipeline_repair_stored(p, &r), 1);
    ck_assert_uint_eq(mirror_blocks(), before); /* recorded, not applied */
    return 1;
}

START_TEST(consumer_repaired_under_live_load)
{
    for (int round = 0; round < 30; round++) {
        struct kvb_index_cfg ic = {100000, 0};
        struct kvb_index *c = NULL, *truth = NULL;
        ck_assert_int_eq(kvb_index_create(&ic, &c), 0);
        ck_assert_int_eq(kvb_index_create(&ic, &truth), 0);
        struct kvb_stream s;
        kvb_stream_init(&s, "t", 0);
        struct feed_state fs = {0};
        uint64_t seq = 0;
        for (int i = 0; i < 60; i++)
            random_batch(&s, seq++);
        hand_on(&fs, c, truth, false);
        for (int i = 0; i < 20; i++) /* lost on the NATS side: the consumer never sees them */
            random_batch(&s, seq++);
        hand_on(&fs, NULL, truth, false);
        uint64_t held = mirror_blocks();
        ck_assert_int_eq(kvb_pipeline_repair_cleared(p, W, 0, KVB_BAR_NATS_LOST), 1);
        hand_on(&fs, c, truth, true);
        ck_assert_uint_eq(mirror_blocks(), held); /* the mirror keeps the pair */
        ck_assert_uint_eq(kvb_mirror_missing(mir), held);
        for (int i = 0; i < 200; i++) {
            if (rnd(2)) {
                random_batch(&s, seq++);
                hand_on(&fs, c, truth, false);
            } else {
                repair_one(1 + rnd(4));
                hand_on(&fs, c, truth, true);
            }
        }
        while (repair_one(3))
            hand_on(&fs, c, truth, true);
        ck_assert_uint_eq(kvb_mirror_missing(mir), 0);
        same_blocks(c, truth);
        ck_assert_uint_eq(kvb_index_blocks(truth, -1), mirror_blocks());
        ck_assert_uint_eq(kvb_get(&m.barriers_total[KVB_BAR_NATS_LOST]), 1);
        kvb_index_destroy(&c);
        kvb_index_destroy(&truth);
        teardown();
        setup();
    }
}
END_TEST

/* The repair's "cleared" is never redundant (a consumer may have lost the
 * last one), and its stores take the pair's next ids. */
START_TEST(repair_barrier_always_published)
{
    struct kvb_stream s;
    kvb_stream_init(&s, "t", 0);
    struct mp mb;
    mp_init(&mb);
    msgpack_pack_array(&mb.pk, 3);
    msgpack_pack_double(&mb.pk, 1.0);
    msgpack_pack_array(&mb.pk, 1);
    uint64_t h[2] = {11, 12};
    pack_store(&mb, h, 2, false, 0);
    msgpack_pack_int(&mb.pk, 0);
    ck_assert_int_eq(kvb_replay_live(rules, &s, 0, mp_data(&mb), mb.sb.size, 0), 2);
    mp_free(&mb);
    ck_assert_int_eq(kvb_pipeline_repair_cleared(p, W, 0, KVB_BAR_NATS_LOST), 1);
    ck_assert_int_eq(kvb_pipeline_repair_cleared(p, W, 0, KVB_BAR_NATS_RECONNECT), 1);
    ck_assert_uint_eq(kvb_get(&m.barriers_total[KVB_BAR_NATS_RECONNECT]), 1);
    ck_assert_uint_eq(kvb_mirror_missing(mir), 2);
    ck_assert_int_eq(repair_one(256), 1);
    ck_assert_int_eq(repair_one(256), 0);
    ck_assert_uint_eq(out.n, 5);
    ck_assert(strstr(out.text, "{\"event_id\":4,\"data\":{\"stored\":{\"parent_hash\":null,"
                               "\"blocks\":[{\"block_hash\":11,") != NULL);
    ck_assert_uint_eq(kvb_get(&m.router_events_published_total[KVB_REVT_STORED]), 2);
}
END_TEST

static Suite *repair_suite(void)
{
    Suite *s = suite_create("repair");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, consumer_repaired_under_live_load);
    tcase_add_test(tc, repair_barrier_always_published);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(repair_suite()); }
