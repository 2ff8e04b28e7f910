/* encode_msgpack: the byte-exact known answers of docs/dynamo-event-plane.md
 * sections 3, 4 and 6, the batcher's cutting rules, and an unpacker
 * round trip.  Answers not in the spec were produced independently with
 * python3-msgpack (to_vec_named equivalents). */
#include <check.h>

#include "testutil.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "encode_msgpack.h"

#define W 7587890738027725506ULL
#define BH 15760518052499183552ULL
#define TH 7652252100776996844ULL

static const char STORED[] =
    "84a9776f726b65725f6964cf694d9a6c829e82c2ac73746f726167655f74696572a6646576696365b0726573"
    "6964656e63795f646f6d61696ea6776f726b6572a56576656e7483a86576656e745f696405a46461746181a6"
    "73746f72656483ab706172656e745f68617368c0ae73746172745f706f736974696f6ec0a6626c6f636b7391"
    "83aa626c6f636b5f68617368cfdab89baa7b5857c0ab746f6b656e735f68617368cf6a3242be068cafecad6d"
    "6d5f65787472615f696e666fc0a764705f72616e6b00";
static const char REMOVED[] =
    "84a9776f726b65725f6964cf694d9a6c829e82c2ac73746f726167655f74696572a6646576696365b0726573"
    "6964656e63795f646f6d61696ea6776f726b6572a56576656e7483a86576656e745f696406a46461746181a7"
    "72656d6f76656481ac626c6f636b5f68617368657391cfdab89baa7b5857c0a764705f72616e6b00";
static const char CLEARED[] =
    "84a9776f726b65725f6964cf694d9a6c829e82c2ac73746f726167655f74696572a6646576696365b0726573"
    "6964656e63795f646f6d61696ea6776f726b6572a56576656e7483a86576656e745f696407a464617461a763"
    "6c6561726564a764705f72616e6b00";
/* CLEARED with storage_tier "host_pinned": a scoped "cleared" of that tier */
static const char SCOPED_CLEARED[] =
    "84a9776f726b65725f6964cf694d9a6c829e82c2ac73746f726167655f74696572ab686f73745f70696e6e6564"
    "b07265736964656e63795f646f6d61696ea6776f726b6572a56576656e7483a86576656e745f696407a46461"
    "7461a7636c6561726564a764705f72616e6b00";
static const char ENVELOPE_HEAD[] =
    "85ac7075626c69736865725f6964cf0000123456789abca873657175656e636500ac7075626c69736865645f"
    "6174cf0000019b76daa800a5746f706963a96b762d6576656e7473a77061796c6f6164c4c7";
static const char LEGACY_STORED[] =
    "83a9776f726b65725f6964cf694d9a6c829e82c2ac73746f726167655f74696572a6646576696365a5657665"
    "6e7483a86576656e745f696405a46461746181a673746f72656483ab706172656e745f68617368c0ae737461"
    "72745f706f736974696f6ec0a6626c6f636b739183aa626c6f636b5f68617368cfdab89baa7b5857c0ab746f"
    "6b656e735f68617368cf6a3242be068cafecad6d6d5f65787472615f696e666fc0a764705f72616e6b00";
static const char LEGACY_REMOVED[] =
    "83a9776f726b65725f6964cf694d9a6c829e82c2ac73746f726167655f74696572a6646576696365a5657665"
    "6e7483a86576656e745f696406a46461746181a772656d6f76656481ac626c6f636b5f68617368657391cfda"
    "b89baa7b5857c0a764705f72616e6b00";
static const char LEGACY_CLEARED[] =
    "83a9776f726b65725f6964cf694d9a6c829e82c2ac73746f726167655f74696572a6646576696365a5657665"
    "6e7483a86576656e745f696407a464617461a7636c6561726564a764705f72616e6b00";
static const char ACTIVE_LOAD[] =
    "86a9776f726b65725f6964cf694d9a6c829e82c2a764705f72616e6b00b46163746976655f6465636f64655f"
    "626c6f636b7378b56163746976655f70726566696c6c5f746f6b656e73c0b47363686564756c65725f6c6f61"
    "645f73636f7065c0ae6b765f757365645f626c6f636b73cd0d48";
/* worker 1, host_pinned, event_id 2^32, dp_rank 3, parent 2^64-1, two blocks
 * (small ints in every width), the second with two multimodal objects */
static const char MM_STORED[] =
    "84a9776f726b65725f696401ac73746f726167655f74696572ab686f73745f70696e6e6564b0726573696465"
    "6e63795f646f6d61696ea6776f726b6572a56576656e7483a86576656e745f6964cf0000000100000000a464"
    "61746181a673746f72656483ab706172656e745f68617368cfffffffffffffffffae73746172745f706f7369"
    "74696f6ec0a6626c6f636b739283aa626c6f636b5f6861736801ab746f6b656e735f686173687fad6d6d5f65"
    "787472615f696e666fc083aa626c6f636b5f68617368cc80ab746f6b656e735f68617368ce00010000ad6d6d"
    "5f65787472615f696e666f81aa6d6d5f6f626a656374739282a76d6d5f68617368cf0cf457e24a479f02a76f"
    "6666736574739082a76d6d5f6861736805a76f66667365747390a764705f72616e6b03";

static void expect_bytes(const void *got, size_t len, const char *hex)
{
    static uint8_t want[4096];
    size_t n = unhex(hex, want);
    ck_assert_uint_eq(len, n);
    if (memcmp(got, want, n) != 0) {
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(((const uint8_t *)got)[i] == want[i], "byte %zu: %02x, want %02x", i,
                          ((const uint8_t *)got)[i], want[i]);
    }
}

static const struct kvb_block blk = {BH, TH};
static const uint64_t rm_hash = BH;

static struct kvb_rev ev_stored(uint64_t id)
{
    return (struct kvb_rev){
        .type = KVB_REVT_STORED, .worker_id = W, .event_id = id, .blocks = &blk, .n = 1};
}
static struct kvb_rev ev_removed(uint64_t id)
{
    return (struct kvb_rev){
        .type = KVB_REVT_REMOVED, .worker_id = W, .event_id = id, .hashes = &rm_hash, .n = 1};
}
static struct kvb_rev ev_cleared(uint64_t id)
{
    return (struct kvb_rev){.type = KVB_REVT_CLEARED, .worker_id = W, .event_id = id};
}

static void expect_rev(const struct kvb_rev *r, bool residency, const char *hex, size_t len)
{
    struct mp m;
    mp_init(&m);
    ck_assert_int_eq(kvb_mp_pack_rev(&m.pk, r, residency), 0);
    ck_assert_uint_eq(m.sb.size, len);
    expect_bytes(m.sb.data, m.sb.size, hex);
    mp_free(&m);
}

START_TEST(router_events_known_answers)
{
    struct kvb_rev s = ev_stored(5), r = ev_removed(6), c = ev_cleared(7);
    expect_rev(&s, true, STORED, 198);
    expect_rev(&r, true, REMOVED, 128);
    expect_rev(&c, true, CLEARED, 103);
    /* legacy form: no residency_domain, 3 keys */
    expect_rev(&s, false, LEGACY_STORED, 174);
    expect_rev(&r, false, LEGACY_REMOVED, 104);
    expect_rev(&c, false, LEGACY_CLEARED, 79);
    /* an unscoped "cleared" is every tier: "device" whatever its tier field;
     * a scoped one writes its tier, device included */
    c.tier = KVB_TIER_HOST_PINNED;
    expect_rev(&c, true, CLEARED, 103);
    c.scoped = true;
    expect_rev(&c, true, SCOPED_CLEARED, 108);
    c.tier = KVB_TIER_DEVICE;
    expect_rev(&c, true, CLEARED, 103);

    struct kvb_block b2[2] = {{1, 127}, {128, 65536}};
    uint64_t mm[2] = {933467652192968450ULL, 5};
    uint32_t off[3] = {0, 0, 2};
    struct kvb_rev x = {.type = KVB_REVT_STORED,
                        .tier = KVB_TIER_HOST_PINNED,
                        .worker_id = 1,
                        .event_id = 1ULL << 32,
                        .dp_rank = 3,
                        .has_parent = true,
                        .parent = UINT64_MAX,
                        .blocks = b2,
                        .n = 2,
                        .mm_hashes = mm,
                        .mm_off = off,
                        .n_mm = 2};
    expect_rev(&x, true, MM_STORED, 299);
}
END_TEST

START_TEST(active_load_known_answer)
{
    struct mp m;
    mp_init(&m);
    struct kvb_active_load l = {.worker_id = W,
                                .dp_rank = 0,
                                .has_decode_blocks = true,
                                .active_decode_blocks = 120,
                                .has_kv_used_blocks = true,
                                .kv_used_blocks = 3400};
    ck_assert_int_eq(kvb_mp_pack_active_load(&m.pk, &l), 0);
    expect_bytes(m.sb.data, m.sb.size, ACTIVE_LOAD);
    /* at least one of active_decode_blocks / kv_used_blocks */
    l.has_decode_blocks = l.has_kv_used_blocks = false;
    l.has_prefill_tokens = true;
    ck_assert_int_eq(kvb_mp_pack_active_load(&m.pk, &l), -EINVAL);
    mp_free(&m);
}
END_TEST

/* ---- batcher ------------------------------------------------------------ */

#define MAXMSG 64
static struct got {
    struct kvb_mp_msg msg[MAXMSG];
    uint8_t *data[MAXMSG];
    int n;
    int fail; /* error to return from emit */
} got;

static int collect(void *ctx, const struct kvb_mp_msg *msg)
{
    struct got *g = ctx;
    ck_assert_int_lt(g->n, MAXMSG);
    g->msg[g->n] = *msg;
    g->data[g->n] = malloc(msg->len);
    memcpy(g->data[g->n], msg->data, msg->len);
    g->msg[g->n].data = (const char *)g->data[g->n];
    g->n++;
    return g->fail;
}

static void got_reset(void)
{
    for (int i = 0; i < got.n; i++)
        free(got.data[i]);
    memset(&got, 0, sizeof(got));
}

static struct kvb_mp_batcher *bat;
static void setup(void) { memset(&got, 0, sizeof(got)); }
static void teardown(void)
{
    kvb_mp_batcher_destroy(&bat);
    got_reset();
}

static void open_batcher(bool batch, uint32_t max_events, uint32_t max_blocks)
{
    struct kvb_mp_batcher_cfg c = {.batch = batch,
                                   .residency_domain = true,
                                   .max_events = max_events,
                                   .max_blocks = max_blocks,
                                   .seed = 42};
    ck_assert_int_eq(kvb_mp_batcher_create(&c, collect, &got, &bat), 0);
}

/* The envelope's fields through msgpack-c's unpacker; the payload bin is
 * returned as a view into msg. */
struct env {
    uint64_t publisher_id, sequence, published_at;
    char topic[32];
    const char *payload;
    size_t payload_len;
};

static void unpack_envelope(const struct kvb_mp_msg *msg, struct env *e, msgpack_unpacked *u)
{
    size_t off = 0;
    ck_assert_int_eq(msgpack_unpack_next(u, msg->data, msg->len, &off), MSGPACK_UNPACK_SUCCESS);
    ck_assert_uint_eq(off, msg->len);
    const msgpack_object *o = &u->data;
    ck_assert_int_eq(o->type, MSGPACK_OBJECT_MAP);
    ck_assert_int_eq(o->via.map.size, 5);
    static const char *keys[5] = {"publisher_id", "sequence", "published_at", "topic", "payload"};
    for (int i = 0; i < 5; i++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[i];
        ck_assert_int_eq(kv->key.type, MSGPACK_OBJECT_STR);
        ck_assert(kv->key.via.str.size == strlen(keys[i]) &&
                  memcmp(kv->key.via.str.ptr, keys[i], strlen(keys[i])) == 0);
    }
    const msgpack_object *v = &o->via.map.ptr[0].val;
    ck_assert_int_eq(v->type, MSGPACK_OBJECT_POSITIVE_INTEGER);
    e->publisher_id = v->via.u64;
    e->sequence = o->via.map.ptr[1].val.via.u64;
    e->published_at = o->via.map.ptr[2].val.via.u64;
    v = &o->via.map.ptr[3].val;
    ck_assert_int_eq(v->type, MSGPACK_OBJECT_STR);
    ck_assert_uint_lt(v->via.str.size, sizeof(e->topic));
    memcpy(e->topic, v->via.str.ptr, v->via.str.size);
    e->topic[v->via.str.size] = 0;
    v = &o->via.map.ptr[4].val;
    ck_assert_int_eq(v->type, MSGPACK_OBJECT_BIN);
    e->payload = v->via.bin.ptr;
    e->payload_len = v->via.bin.size;
}

START_TEST(envelope_and_batch_known_answers)
{
    open_batcher(true, 0, 0);
    ck_assert_int_eq(kvb_mp_batcher_set_publisher(bat, W, 0, 0x123456789abcULL), 0);
    struct kvb_rev s = ev_stored(5), r = ev_removed(6), c = ev_cleared(7);

    /* [stored] in an envelope: 280 bytes, payload bin8 of 199 */
    ck_assert_int_eq(kvb_mp_batcher_add(bat, &s, 1767225600000ULL), 0);
    ck_assert(kvb_mp_batcher_pending(bat));
    ck_assert_int_eq(got.n, 0);
    ck_assert_int_eq(kvb_mp_batcher_flush(bat, 1767225600000ULL), 0);
    ck_assert(!kvb_mp_batcher_pending(bat));
    ck_assert_int_eq(got.n, 1);
    static char want[1024];
    snprintf(want, sizeof(want), "%s91%s", ENVELOPE_HEAD, STORED);
    ck_assert_uint_eq(got.msg[0].len, 280);
    expect_bytes(got.msg[0].data, got.msg[0].len, want);
    ck_assert_uint_eq(got.msg[0].sequence, 0);
    ck_assert_uint_eq(got.msg[0].n_events, 1);
    ck_assert_uint_eq(got.msg[0].first_event_id, 5);

    /* [stored, removed, cleared]: payload 430 bytes = 93 || ... */
    ck_assert_int_eq(kvb_mp_batcher_add(bat, &s, 1), 0);
    ck_assert_int_eq(kvb_mp_batcher_add(bat, &r, 1), 0);
    ck_assert_int_eq(kvb_mp_batcher_add(bat, &c, 1), 0);
    ck_assert_int_eq(kvb_mp_batcher_flush(bat, 1767225600001ULL), 0);
    ck_assert_int_eq(kvb_mp_batcher_flush(bat, 1767225600001ULL), 0); /* nothing pending */
    ck_assert_int_eq(got.n, 2);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    struct env e;
    unpack_envelope(&got.msg[1], &e, &u);
    ck_assert_uint_eq(e.publisher_id, 0x123456789abcULL);
    ck_assert_uint_eq(e.sequence, 1);
    ck_assert_uint_eq(e.published_at, 1767225600001ULL);
    ck_assert_str_eq(e.topic, "kv-events");
    ck_assert_uint_eq(e.payload_len, 430);
    snprintf(want, sizeof(want), "93%s%s%s", STORED, REMOVED, CLEARED);
    expect_bytes(e.payload, e.payload_len, want);
    /* bin16 header for a payload of 256..65535 bytes */
    ck_assert_uint_eq((uint8_t)got.msg[1].data[got.msg[1].len - 430 - 3], 0xc5);
    ck_assert_uint_eq(got.msg[1].first_event_id, 5);
    ck_assert_uint_eq(got.msg[1].last_event_id, 7);
    ck_assert_uint_eq(got.msg[1].n_blocks, 2);
    msgpack_unpacked_destroy(&u);
}
END_TEST

/* batch: false, the event plane's first form: one RouterEvent (not an array)
 * per envelope, emitted at once. */
START_TEST(unbatched_one_event_per_message)
{
    open_batcher(false, 0, 0);
    ck_assert_int_eq(kvb_mp_batcher_set_publisher(bat, W, 0, 0x123456789abcULL), 0);
    struct kvb_rev s = ev_stored(5), r = ev_removed(6);
    ck_assert_int_eq(kvb_mp_batcher_add(bat, &s, 1767225600000ULL), 0);
    ck_assert(!kvb_mp_batcher_pending(bat));
    ck_assert_int_eq(kvb_mp_batcher_add(bat, &r, 1767225600000ULL), 0);
    ck_assert_int_eq(got.n, 2);
    static char want[1024];
    /* the spec's envelope head with a bin8 of 198: c4c6 */
    snprintf(want, sizeof(want), "%.*sc6%s", (int)strlen(ENVELOPE_HEAD) - 2, ENVELOPE_HEAD, STORED);
    expect_bytes(got.msg[0].data, got.msg[0].len, want);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    struct env e;
    unpack_envelope(&got.msg[1], &e, &u);
    ck_assert_uint_eq(e.sequence, 1);
    expect_bytes(e.payload, e.payload_len, REMOVED);
    msgpack_unpacked_destroy(&u);
}
END_TEST

/* The batcher's "cleared": an unscoped one "device" whatever its tier field,
 * a scoped one its tier, as kvb_mp_pack_rev's known answers. */
START_TEST(batcher_cleared_tiers)
{
    open_batcher(false, 0, 0);
    struct kvb_rev c = ev_cleared(7);
    c.tier = KVB_TIER_HOST_PINNED;
    ck_assert_int_eq(kvb_mp_batcher_add(bat, &c, 1), 0);
    c.scoped = true;
    ck_assert_int_eq(kvb_mp_batcher_add(bat, &c, 1), 0);
    ck_assert_int_eq(got.n, 2);
    static const char *const want[2] = {CLEARED, SCOPED_CLEARED};
    for (int i = 0; i < 2; i++) {
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        struct env e;
        unpack_envelope(&got.msg[i], &e, &u);
        expect_bytes(e.payload, e.payload_len, want[i]);
        msgpack_unpacked_destroy(&u);
    }
}
END_TEST

/* A stored event of nb blocks (block_hash i, tokens_hash i). */
static struct kvb_block big[9000];
static struct kvb_rev ev_blocks(uint64_t worker, uint32_t rank, uint64_t id, uint32_t nb)
{
    for (uint32_t i = 0; i < nb; i++)
        big[i] = (struct kvb_block){i, i};
    return (struct kvb_rev){.type = KVB_REVT_STORED,
                            .worker_id = worker,
                            .dp_rank = rank,
                            .event_id = id,
                            .blocks = big,
                            .n = nb};
}

START_TEST(cut_at_128_events)
{
    open_batcher(true, 0, 0);
    for (uint64_t i = 0; i < 300; i++) {
        struct kvb_rev c = ev_cleared(i);
        ck_assert_int_eq(kvb_mp_batcher_add(bat, &c, 1), 0);
    }
    /* 128 and 128 went out as soon as full, 44 wait for the flush */
    ck_assert_int_eq(got.n, 2);
    ck_assert(kvb_mp_batcher_pending(bat));
    ck_assert_int_eq(kvb_mp_batcher_flush(bat, 1), 0);
    ck_assert_int_eq(got.n, 3);
    ck_assert_uint_eq(got.msg[0].n_events, 128);
    ck_assert_uint_eq(got.msg[1].n_events, 128);
    ck_assert_uint_eq(got.msg[2].n_events, 44);
    ck_assert_uint_eq(got.msg[1].first_event_id, 128);
    ck_assert_uint_eq(got.msg[2].last_event_id, 299);
    for (int i = 0; i < 3; i++)
        ck_assert_uint_eq(got.msg[i].sequence, (uint64_t)i);
    /* a 128-element array has a 3-byte header (array16): decoded right */
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    struct env e;
    unpack_envelope(&got.msg[0], &e, &u);
    msgpack_unpacked p;
    msgpack_unpacked_init(&p);
    size_t off = 0;
    ck_assert_int_eq(msgpack_unpack_next(&p, e.payload, e.payload_len, &off),
                     MSGPACK_UNPACK_SUCCESS);
    ck_assert_uint_eq(off, e.payload_len);
    ck_assert_int_eq(p.data.type, MSGPACK_OBJECT_ARRAY);
    ck_assert_int_eq(p.data.via.array.size, 128);
    msgpack_unpacked_destroy(&p);
    msgpack_unpacked_destroy(&u);
}
END_TEST

START_TEST(cut_at_8192_blocks_never_split)
{
    open_batcher(true, 0, 0);
    /* 100-block events: 81 fit (8100), the 82nd would make 8200 */
    for (uint64_t i = 0; i < 82; i++) {
        struct kvb_rev r = ev_blocks(W, 0, i, 100);
        ck_assert_int_eq(kvb_mp_batcher_add(bat, &r, 1), 0);
    }
    ck_assert_int_eq(got.n, 1);
    ck_assert_uint_eq(got.msg[0].n_events, 81);
    ck_assert_uint_eq(got.msg[0].n_blocks, 8100);
    /* pending: one event of 100; 8092 more fill it to exactly 8192: out at once */
    struct kvb_rev r = ev_blocks(W, 0, 82, 8092);
    ck_assert_int_eq(kvb_mp_batcher_add(bat, &r, 1), 0);
    ck_assert_int_eq(got.n, 2);
    ck_assert_uint_eq(got.msg[1].n_blocks, 8192);
    ck_assert(!kvb_mp_batcher_pending(bat));

    /* a 9000-block event goes alone, after what was pending */
    r = ev_blocks(W, 0, 83, 5);
    ck_assert_int_eq(kvb_mp_batcher_add(bat, &r, 1), 0);
    r = ev_blocks(W, 0, 84, 9000);
    ck_assert_int_eq(kvb_mp_batcher_add(bat, &r, 1), 0);
    ck_assert_int_eq(got.n, 4);
    ck_assert_uint_eq(got.msg[2].n_blocks, 5);
    ck_assert_uint_eq(got.msg[3].n_events, 1);
    ck_assert_uint_eq(got.msg[3].n_blocks, 9000);
    ck_assert(got.msg[3].len > 9000 * 3);

    /* removed hashes count as blocks; cleared as none */
    static uint64_t hs[8192];
    struct kvb_rev rm = {
        .type = KVB_REVT_REMOVED, .worker_id = W, .event_id = 85, .hashes = hs, .n = 8000};
    ck_assert_int_eq(kvb_mp_batcher_add(bat, &rm, 1), 0);
    struct kvb_rev c = ev_cleared(86);
    ck_assert_int_eq(kvb_mp_batcher_add(bat, &c, 1), 0);
    rm.event_id = 87;
    rm.n = 193;
    ck_assert_int_eq(kvb_mp_batcher_add(bat, &rm, 1), 0);
    ck_assert_int_eq(got.n, 5);
    ck_assert_uint_eq(got.msg[4].n_events, 2);
    ck_assert_uint_eq(got.msg[4].n_blocks, 8000);
    ck_assert_int_eq(kvb_mp_batcher_flush(bat, 1), 0);
    ck_assert_uint_eq(got.msg[5].n_blocks, 193);
    for (int i = 0; i < 6; i++)
        ck_assert_uint_eq(got.msg[i].sequence, (uint64_t)i);
}
END_TEST

START_TEST(pairs_never_mix)
{
    open_batcher(true, 0, 0);
    uint64_t pa, pb, pc;
    ck_assert_int_eq(kvb_mp_batcher_publisher(bat, W, 0, &pa), 0);
    ck_assert_int_eq(kvb_mp_batcher_publisher(bat, W, 1, &pb), 0);
    ck_assert_int_eq(kvb_mp_batcher_publisher(bat, W + 1, 0, &pc), 0);
    ck_assert(pa && pb && pc && pa != pb && pb != pc && pa != pc);
    ck_assert(pa <= KVB_MP_PUBLISHER_MASK && pb <= KVB_MP_PUBLISHER_MASK);
    uint64_t again;
    ck_assert_int_eq(kvb_mp_batcher_publisher(bat, W, 0, &again), 0);
    ck_assert_uint_eq(again, pa);

    /* A A B A (W+1) A: four cuts, each message one pair */
    struct kvb_rev seq[6] = {ev_blocks(W, 0, 0, 1),     ev_blocks(W, 0, 1, 1),
                             ev_blocks(W, 1, 0, 1),     ev_blocks(W, 0, 2, 1),
                             ev_blocks(W + 1, 0, 0, 1), ev_blocks(W, 0, 3, 1)};
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(kvb_mp_batcher_add(bat, &seq[i], 1), 0);
    ck_assert_int_eq(kvb_mp_batcher_flush(bat, 1), 0);
    ck_assert_int_eq(got.n, 5);
    static const struct {
        uint64_t w;
        uint32_t r;
        uint32_t n;
        uint64_t seq;
    } want[5] = {{W, 0, 2, 0}, {W, 1, 1, 0}, {W, 0, 1, 1}, {W + 1, 0, 1, 0}, {W, 0, 1, 2}};
    for (int i = 0; i < 5; i++) {
        ck_assert_uint_eq(got.msg[i].worker_id, want[i].w);
        ck_assert_uint_eq(got.msg[i].dp_rank, want[i].r);
        ck_assert_uint_eq(got.msg[i].n_events, want[i].n);
        ck_assert_uint_eq(got.msg[i].sequence, want[i].seq);
        uint64_t pid = want[i].w == W + 1 ? pc : want[i].r ? pb : pa;
        ck_assert_uint_eq(got.msg[i].publisher_id, pid);
        /* and every event in it names that pair (decoded) */
        msgpack_unpacked u, p;
        msgpack_unpacked_init(&u);
        msgpack_unpacked_init(&p);
        struct env e;
        unpack_envelope(&got.msg[i], &e, &u);
        ck_assert_uint_eq(e.publisher_id, pid);
        size_t off = 0;
        ck_assert_int_eq(msgpack_unpack_next(&p, e.payload, e.payload_len, &off),
                         MSGPACK_UNPACK_SUCCESS);
        for (uint32_t k = 0; k < p.data.via.array.size; k++) {
            const msgpack_object_map *ev = &p.data.via.array.ptr[k].via.map;
            ck_assert_uint_eq(ev->ptr[0].val.via.u64, want[i].w);
            const msgpack_object_map *in = &ev->ptr[3].val.via.map;
            ck_assert_uint_eq(in->ptr[2].val.via.u64, want[i].r);
        }
        msgpack_unpacked_destroy(&p);
        msgpack_unpacked_destroy(&u);
    }
    /* a publisher id cannot change once the pair has sent */
    ck_assert_int_eq(kvb_mp_batcher_set_publisher(bat, W, 0, 1), -EEXIST);

    /* the same seed draws the same ids (a new start draws a new seed) */
    struct kvb_mp_batcher *b2;
    struct kvb_mp_batcher_cfg c = {.batch = true, .seed = 42};
    ck_assert_int_eq(kvb_mp_batcher_create(&c, collect, &got, &b2), 0);
    ck_assert_int_eq(kvb_mp_batcher_publisher(b2, W, 0, &again), 0);
    ck_assert_uint_eq(again, pa);
    kvb_mp_batcher_destroy(&b2);
    ck_assert(b2 == NULL);
}
END_TEST

/* An emit error is passed back; the message counts as sent. */
START_TEST(emit_errors_pass_back)
{
    open_batcher(false, 0, 0);
    got.fail = -EAGAIN;
    struct kvb_rev c = ev_cleared(0);
    ck_assert_int_eq(kvb_mp_batcher_add(bat, &c, 1), -EAGAIN);
    got.fail = 0;
    c.event_id = 1;
    ck_assert_int_eq(kvb_mp_batcher_add(bat, &c, 1), 0);
    ck_assert_int_eq(got.n, 2);
    ck_assert_uint_eq(got.msg[1].sequence, 1);
    struct kvb_mp_batcher *b2;
    struct kvb_mp_batcher_cfg cfg = {.batch = true};
    ck_assert_int_eq(kvb_mp_batcher_create(&cfg, NULL, NULL, &b2), -EINVAL);
}
END_TEST

/* The batcher packs from pre-packed runs and per-pair cached pieces: its
 * messages are, byte for byte, what the straightforward packers make of
 * the same events (kvb_mp_pack_envelope around kvb_mp_pack_rev), for both
 * forms, every tier (and one out of range), ints of every width, parents
 * or not, multimodal blocks, arrays and bins of every header size, and the
 * buffer grown while messages are cut. */
static void expect_reference(const struct kvb_mp_msg *m, const struct kvb_rev *evs, size_t n,
                             bool batch, bool residency, uint64_t now)
{
    struct mp pay, env;
    mp_init(&pay);
    mp_init(&env);
    if (batch)
        ck_assert_int_eq(msgpack_pack_array(&pay.pk, (uint32_t)n), 0);
    for (size_t i = 0; i < n; i++)
        ck_assert_int_eq(kvb_mp_pack_rev(&pay.pk, &evs[i], residency), 0);
    ck_assert_int_eq(kvb_mp_pack_envelope(&env.pk, m->publisher_id, m->sequence, now,
                                          KVB_MP_TOPIC_KV, pay.sb.data, pay.sb.size),
                     0);
    ck_assert_uint_eq(m->len, env.sb.size);
    for (size_t i = 0; i < m->len; i++)
        ck_assert_msg(m->data[i] == env.sb.data[i], "byte %zu of %zu: %02x, want %02x", i, m->len,
                      (uint8_t)m->data[i], (uint8_t)env.sb.data[i]);
    mp_free(&pay);
    mp_free(&env);
}

START_TEST(batcher_bytes_as_the_reference_packers)
{
    enum { NB = 9000 };
    struct kvb_block *blocks = calloc(NB, sizeof(*blocks));
    uint64_t *hashes = calloc(NB, sizeof(*hashes));
    ck_assert_ptr_nonnull(blocks);
    ck_assert_ptr_nonnull(hashes);
    for (uint32_t i = 0; i < NB; i++) {
        uint64_t v = i % 5 == 0   ? i
                     : i % 5 == 1 ? 200 + i
                     : i % 5 == 2 ? 70000 + i
                     : i % 5 == 3 ? (1ULL << 33) + i
                                  : UINT64_MAX - i;
        blocks[i] = (struct kvb_block){v, ~v};
        hashes[i] = v * 3;
    }
    uint64_t mm[3] = {933467652192968450ULL, 5, 1ULL << 40};
    uint32_t mm_off[4] = {0, 0, 2, 3};
    const uint64_t workers[3] = {W, 1, 300};
    const uint32_t ranks[3] = {0, 3, 70000};
    for (int form = 0; form < 4; form++) {
        bool batch = form & 1, residency = form & 2;
        struct kvb_mp_batcher_cfg c = {.batch = batch, .residency_domain = residency, .seed = 42};
        ck_assert_int_eq(kvb_mp_batcher_create(&c, collect, &got, &bat), 0);
        ck_assert_int_eq(kvb_mp_batcher_set_publisher(bat, W, 0, 0x123456789abcULL), 0);
        uint64_t now = 1767225600000ULL;
        for (int round = 0; round < 12; round++) {
            /* one message: up to 5 events of one pair */
            struct kvb_rev ev[5];
            /* rounds 9 and 10: one event alone, above 65535 bytes (bin32) */
            size_t n = batch && round != 9 && round != 10 ? 1 + (size_t)round % 5 : 1;
            uint64_t w = workers[round % 3];
            uint32_t rank = ranks[round % 3];
            for (size_t k = 0; k < n; k++) {
                uint64_t id = round < 6 ? (uint64_t)(round * 5 + k) : (1ULL << 35) + k;
                struct kvb_rev r = {.worker_id = w,
                                    .dp_rank = rank,
                                    .event_id = id,
                                    .tier = (uint8_t)((round + k) % (KVB_TIER__COUNT + 1))};
                if (round == 7 && k == 0)
                    r.tier = 200; /* out of range: "device", as kvb_tier_name() */
                switch ((round + k) % 4) {
                case 0:
                    r.type = KVB_REVT_STORED;
                    r.has_parent = k % 2;
                    r.parent = k * 1000003;
                    r.blocks = blocks;
                    r.n = round == 9 && k == 0 ? NB : round == 4 ? 3 : 1 + (uint32_t)k * 7;
                    break;
                case 1:
                    r.type = KVB_REVT_STORED;
                    r.blocks = blocks + 1;
                    r.n = 3;
                    r.mm_hashes = mm;
                    r.mm_off = mm_off;
                    r.n_mm = 3;
                    break;
                case 2:
                    r.type = KVB_REVT_REMOVED;
                    r.hashes = hashes;
                    r.n = round == 10 && k == 0 ? 8000 : 1 + (uint32_t)k * 9;
                    break;
                default:
                    r.type = KVB_REVT_CLEARED;
                    r.scoped = round % 2; /* scoped: its tier; else "device" */
                    break;
                }
                ev[k] = r;
                ck_assert_int_eq(kvb_mp_batcher_add(bat, &ev[k], now), 0);
            }
            ck_assert_int_eq(kvb_mp_batcher_flush(bat, now), 0);
            ck_assert_int_eq(got.n, batch ? 1 : (int)n);
            expect_reference(&got.msg[0], ev, n, batch, residency, now);
            got_reset();
            now += 977;
        }
        kvb_mp_batcher_destroy(&bat);
    }
    free(blocks);
    free(hashes);
}
END_TEST

static Suite *encode_msgpack_suite(void)
{
    Suite *s = suite_create("encode_msgpack");
    TCase *tc = tcase_create("encode_msgpack");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, router_events_known_answers);
    tcase_add_test(tc, active_load_known_answer);
    tcase_add_test(tc, envelope_and_batch_known_answers);
    tcase_add_test(tc, unbatched_one_event_per_message);
    tcase_add_test(tc, batcher_cleared_tiers);
    tcase_add_test(tc, cut_at_128_events);
    tcase_add_test(tc, cut_at_8192_blocks_never_split);
    tcase_add_test(tc, pairs_never_mix);
    tcase_add_test(tc, emit_errors_pass_back);
    tcase_add_test(tc, batcher_bytes_as_the_reference_packers);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(encode_msgpack_suite()); }
