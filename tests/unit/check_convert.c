/* convert: docs/router-events.md sections 3 to 5. */
#include <check.h>

#include "testutil.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "convert.h"
#include "pipeline/mm.h"

static struct kvb_metrics m;
static struct kvb_converter *conv;
static const struct kvb_convert_cfg cfg16 = {
    .worker_id = 42, .block_size = 16, .lora_salt = true, .forward_tiers = 1u << KVB_TIER_DEVICE};

static void setup(void)
{
    memset(&m, 0, sizeof(m));
    ck_assert_int_eq(kvb_converter_create(&cfg16, &m, &conv), 0);
}
static void teardown(void) { kvb_converter_destroy(&conv); }

/* The real Qwen3-8B block of docs/router-events.md section 1. */
static const uint32_t qwen[16] = {151644, 872, 198,    9064, 374,    279,   6722, 315,
                                  5616,   30,  151645, 198,  151644, 77091, 198,  151667};

static struct kvb_hash uh(uint64_t v)
{
    struct kvb_hash h = {.kind = KVB_HASH_UINT};
    h.v.u = v;
    return h;
}

static struct kvb_str S(const char *s) {
    struct kvb_str r = {s, s ? (uint32_t)strlen(s) : 0};
    return r;
}

/* A BlockStored of n blocks of 16 tokens (0, 1, 2, ...), hashes 100, 101, ... */
static struct kvb_hash hashes[64];
static uint32_t tokens[64 * 16];
static struct kvb_event stored(uint32_t n_hashes, uint32_t n_tokens)
{
    for (uint32_t i = 0; i < 64; i++)
        hashes[i] = uh(100 + i);
    for (uint32_t i = 0; i < 64 * 16; i++)
        tokens[i] = i;
    struct kvb_event e = {.type = KVB_EV_STORED};
    e.hashes = hashes;
    e.n_hashes = n_hashes;
    e.tokens = tokens;
    e.n_tokens = n_tokens;
    e.block_size.has = true;
    e.block_size.v = 16;
    return e;
}

static uint64_t drops(int reason) { return kvb_get(&m.events_dropped_total[reason]); }
static struct kvb_event qwen_event(const uint32_t *t, uint32_t n_tokens);
static uint64_t th0(const struct kvb_event *e);

START_TEST(known_answer_hashes)
{
    const uint32_t t4[4] = {1, 2, 3, 4};
    ck_assert_uint_eq(kvb_tokens_hash(t4, 4, 1337), 14643705804678351452ULL);
    ck_assert_uint_eq(XXH3_64bits_withSeed("test data", 9, 1337), 13226331709069118873ULL);
    ck_assert_uint_eq(kvb_tokens_hash(qwen, 16, KVB_TOKENS_HASH_SEED), 7652252100776996844ULL);
    ck_assert_uint_eq(kvb_tokens_hash(qwen, 16, kvb_lora_seed("adapter-a", 9)),
                      18179192224704087310ULL);
}
END_TEST

START_TEST(literal_example_and_lora_salt)
{
    struct kvb_event e = {.type = KVB_EV_STORED};
    struct kvb_hash h = uh(15760518052499183552ULL);
    e.hashes = &h;
    e.n_hashes = 1;
    e.tokens = qwen;
    e.n_tokens = 16;
    e.block_size.has = true;
    e.block_size.v = 16;
    struct kvb_rev r;
    int why;
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    ck_assert_uint_eq(r.blocks[0].block_hash, 15760518052499183552ULL);
    ck_assert_uint_eq(r.blocks[0].tokens_hash, 7652252100776996844ULL);
    ck_assert(!r.has_parent);
    ck_assert_uint_eq(r.worker_id, 42);

    e.lora_name = S("adapter-a");
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    ck_assert_uint_eq(r.blocks[0].tokens_hash, 18179192224704087310ULL);

    /* an empty lora_name is no LoRA */
    e.lora_name = S("");
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    ck_assert_uint_eq(r.blocks[0].tokens_hash, 7652252100776996844ULL);

    /* lora_salt: false */
    struct kvb_convert_cfg c = cfg16;
    c.lora_salt = false;
    kvb_converter_set_config(conv, &c);
    e.lora_name = S("adapter-a");
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    ck_assert_uint_eq(r.blocks[0].tokens_hash, 7652252100776996844ULL);
}
END_TEST

/* lora_id without lora_name (TensorRT-LLM): the name sources[].lora_names
 * gives the id salts the hash, as if the engine had sent it. */
START_TEST(lora_by_id)
{
    static const struct kvb_lora_name_cfg names[] = {{7, "adapter-a"}, {0, "adapter-zero"}};
    struct kvb_event e = qwen_event(qwen, 16);
    struct kvb_str name = {NULL, 0};
    ck_assert_int_eq(kvb_lora_name_of(names, 2, &e, &name), KVB_LORA_NONE);
    e.lora_id = (struct kvb_opt_int){true, 7};
    ck_assert_int_eq(kvb_lora_name_of(names, 2, &e, &name), KVB_LORA_NAMED);
    ck_assert_int_eq(name.len, 9);
    ck_assert(memcmp(name.ptr, "adapter-a", 9) == 0);
    e.lora_id.v = 0; /* 0 is an id like any other */
    ck_assert_int_eq(kvb_lora_name_of(names, 2, &e, &name), KVB_LORA_NAMED);
    ck_assert(memcmp(name.ptr, "adapter-zero", 12) == 0);
    e.lora_id.v = 8;
    ck_assert_int_eq(kvb_lora_name_of(names, 2, &e, &name), KVB_LORA_UNMAPPED);
    e.lora_id.v = -7;
    ck_assert_int_eq(kvb_lora_name_of(names, 2, &e, &name), KVB_LORA_UNMAPPED);
    ck_assert_int_eq(kvb_lora_name_of(NULL, 0, &e, &name), KVB_LORA_UNMAPPED);
    e.lora_name = S("adapter-b"); /* the engine's own name wins */
    ck_assert_int_eq(kvb_lora_name_of(names, 2, &e, &name), KVB_LORA_NAMED);
    ck_assert(memcmp(name.ptr, "adapter-b", 9) == 0);

    /* the converter: the worker's map */
    struct kvb_worker_cfg w = kvb_convert_cfg_worker(&cfg16);
    w.lora_names = names;
    w.n_lora_names = 2;
    kvb_converter_select(conv, &w);
    e.lora_name = S(NULL);
    e.lora_id.v = 7;
    ck_assert_uint_eq(th0(&e), 18179192224704087310ULL); /* = lora_name adapter-a */
    e.lora_id.v = 8;                                     /* not mapped: unsalted */
    ck_assert_uint_eq(th0(&e), 7652252100776996844ULL);
    w.lora_salt = false;
    kvb_converter_select(conv, &w);
    e.lora_id.v = 7;
    ck_assert_uint_eq(th0(&e), 7652252100776996844ULL);
    /* the configuration's worker has no map */
    kvb_converter_set_config(conv, &cfg16);
    ck_assert_uint_eq(th0(&e), 7652252100776996844ULL);
}
END_TEST

START_TEST(hash_normalisation)
{
    struct kvb_hash h = {.kind = KVB_HASH_INT};
    h.v.i = -5448638146872078049LL; /* vLLM 0.9.0 capture, expected 12998105926837473567 */
    ck_assert_uint_eq(kvb_hash_normalize(&h), 12998105926837473567ULL);
    h.v.i = -1;
    ck_assert_uint_eq(kvb_hash_normalize(&h), UINT64_MAX);
    h = uh(UINT64_MAX);
    ck_assert_uint_eq(kvb_hash_normalize(&h), UINT64_MAX);

    uint8_t b32[32];
    for (int i = 0; i < 32; i++)
        b32[i] = (uint8_t)(i + 1);
    struct kvb_hash bh = {.kind = KVB_HASH_BIN, .bin_len = 32};
    bh.v.bin = b32;
    ck_assert_uint_eq(kvb_hash_normalize(&bh), 0x191a1b1c1d1e1f20ULL); /* last 8, BE */
    bh.bin_len = 16;
    bh.v.bin = b32 + 16;
    ck_assert_uint_eq(kvb_hash_normalize(&bh), 0x191a1b1c1d1e1f20ULL);
    bh.bin_len = 3; /* shorter than 8: all of it */
    bh.v.bin = b32;
    ck_assert_uint_eq(kvb_hash_normalize(&bh), 0x010203ULL);
    bh.bin_len = 0;
    ck_assert_uint_eq(kvb_hash_normalize(&bh), 0);

    /* the parent is normalised too, and a removed list */
    struct kvb_event e = stored(1, 16);
    e.parent.kind = KVB_HASH_INT;
    e.parent.v.i = -2;
    struct kvb_rev r;
    int why;
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    ck_assert(r.has_parent);
    ck_assert_uint_eq(r.parent, UINT64_MAX - 1);
}
END_TEST

START_TEST(block_size_rule)
{
    struct kvb_rev r;
    int why;
    /* 3 hashes, 2.5 blocks of tokens: stop at the first block not covered */
    struct kvb_event e = stored(3, 40);
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    ck_assert_int_eq(r.n, 2);
    ck_assert_uint_eq(r.blocks[1].block_hash, 101);
    ck_assert_uint_eq(r.blocks[1].tokens_hash, kvb_tokens_hash(tokens + 16, 16, 1337));
    /* more tokens than hashes: one block per hash */
    e = stored(2, 64);
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    ck_assert_int_eq(r.n, 2);

    /* engine block size 32 with B = 16: mismatch, counted */
    e = stored(2, 64);
    e.block_size.v = 32;
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 0);
    ck_assert_int_eq(why, KVB_DROP_BLOCK_SIZE_MISMATCH);
    ck_assert_uint_eq(drops(KVB_DROP_BLOCK_SIZE_MISMATCH), 1);
    e.block_size.has = false;
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 0);
    ck_assert_int_eq(why, KVB_DROP_BLOCK_SIZE_MISMATCH);

    /* offload placeholder: no tokens, block_size 0 */
    e = stored(1, 0);
    e.block_size.v = 0;
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 0);
    ck_assert_int_eq(why, KVB_DROP_NO_COMPLETE_BLOCK);
    /* SGLang partial last page: 5 tokens, block_size 5 */
    e = stored(1, 5);
    e.block_size.v = 5;
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 0);
    ck_assert_int_eq(why, KVB_DROP_NO_COMPLETE_BLOCK);
    ck_assert_uint_eq(drops(KVB_DROP_NO_COMPLETE_BLOCK), 2);

    /* auto: B is each event's block_size */
    struct kvb_convert_cfg c = cfg16;
    c.block_size = 0;
    kvb_converter_set_config(conv, &c);
    e = stored(2, 64);
    e.block_size.v = 32;
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    ck_assert_int_eq(r.n, 2);
    ck_assert_uint_eq(r.blocks[1].tokens_hash, kvb_tokens_hash(tokens + 32, 32, 1337));
    e = stored(1, 0);
    e.block_size.v = 0;
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 0);
    ck_assert_int_eq(why, KVB_DROP_NO_COMPLETE_BLOCK);
    e = stored(1, 16);
    e.block_size.has = false;
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 0);
    ck_assert_int_eq(why, KVB_DROP_NO_COMPLETE_BLOCK);
}
END_TEST

START_TEST(filters_count_by_reason)
{
    struct kvb_rev r;
    int why;
    struct kvb_event e = stored(1, 16);
    e.group_idx.has = true;
    e.group_idx.v = 1;
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 0);
    ck_assert_int_eq(why, KVB_DROP_UNLEARNED_GROUP_IDX); /* no kind learned for group 1 */
    e.group_idx.v = 0;                                   /* main group: published */
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);

    static const char *kinds_ok[] = {"full_attention", "mla_attention", "sink_full_attention"};
    for (int i = 0; i < 3; i++) {
        e.spec_kind = S(kinds_ok[i]);
        ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    }
    e.spec_kind = S("sliding_window");
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 0);
    ck_assert_int_eq(why, KVB_DROP_NON_MAIN_ATTENTION_KIND);
    e.spec_kind = S(NULL);
    e.group_idx.has = false; /* group 0 learned sliding_window: not judged here */

    e.medium = S("CPU");
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 0);
    ck_assert_int_eq(why, KVB_DROP_TIER_FILTERED);

    /* EAGLE pairs are hashed (test eagle_windows), not filtered:
     * 16 pairs flatten to 17 ids, one window of B+1 */
    e.token_pairs = true;
    e.n_pairs = 16;
    e.n_tokens = 17;
    e.medium = S("GPU");
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);

    struct kvb_event u = {.type = KVB_EV_UNKNOWN};
    ck_assert_int_eq(kvb_convert_event(conv, &u, 0, &r, &why), 0);
    ck_assert_int_eq(why, KVB_DROP_UNKNOWN_EVENT_TYPE);
    struct kvb_event bad = {.type = KVB_EV_MALFORMED, .error = "x"};
    ck_assert_int_eq(kvb_convert_event(conv, &bad, 0, &r, &why), 0);
    ck_assert_int_eq(why, KVB_DROP_MALFORMED_EVENT);

    ck_assert_uint_eq(drops(KVB_DROP_UNLEARNED_GROUP_IDX), 1);
    ck_assert_uint_eq(drops(KVB_DROP_NON_MAIN_ATTENTION_KIND), 1);
    ck_assert_uint_eq(drops(KVB_DROP_TIER_FILTERED), 1);
    ck_assert_uint_eq(drops(KVB_DROP_UNSUPPORTED_TOKENS), 0);
    ck_assert_uint_eq(drops(KVB_DROP_UNKNOWN_EVENT_TYPE), 1);
    ck_assert_uint_eq(drops(KVB_DROP_MALFORMED_EVENT), 1);
    ck_assert_uint_eq(kvb_get(&m.router_events_published_total[KVB_REVT_STORED]), 5);
    ck_assert_uint_eq(kvb_get(&m.events_received_total[KVB_EVT_STORED]), 8);
}
END_TEST

START_TEST(removed_events)
{
    struct kvb_rev r;
    int why;
    struct kvb_hash hs[2] = {uh(7), {.kind = KVB_HASH_INT, .v.i = -1}};
    struct kvb_event e = {.type = KVB_EV_REMOVED, .hashes = hs, .n_hashes = 2};
    ck_assert_int_eq(kvb_convert_event(conv, &e, 3, &r, &why), 1);
    ck_assert_int_eq(r.type, KVB_REVT_REMOVED);
    ck_assert_int_eq(r.n, 2);
    ck_assert_uint_eq(r.hashes[0], 7);
    ck_assert_uint_eq(r.hashes[1], UINT64_MAX);
    ck_assert_uint_eq(r.dp_rank, 3);
    e.group_idx.has = true;
    e.group_idx.v = 2;
    ck_assert_int_eq(kvb_convert_event(conv, &e, 3, &r, &why), 0);
    ck_assert_int_eq(why, KVB_DROP_UNLEARNED_GROUP_IDX);
    e.group_idx.has = false;
    e.medium = S("DISK");
    ck_assert_int_eq(kvb_convert_event(conv, &e, 3, &r, &why), 0);
    ck_assert_int_eq(why, KVB_DROP_TIER_FILTERED);
    e.medium = S(NULL);
    e.n_hashes = 0;
    ck_assert_int_eq(kvb_convert_event(conv, &e, 3, &r, &why), 0);
    ck_assert_int_eq(why, KVB_DROP_EMPTY_REMOVE);
    struct kvb_event c = {.type = KVB_EV_CLEARED};
    ck_assert_int_eq(kvb_convert_event(conv, &c, 3, &r, &why), 1);
    ck_assert_int_eq(r.type, KVB_REVT_CLEARED);
    ck_assert_uint_eq(r.event_id, 1);
}
END_TEST

START_TEST(storage_tiers)
{
    static const struct {
        const char *medium;
        int tier;
        bool unknown;
    } cases[] = {
        /* Dynamo's StorageTier::from_kv_medium: exact, case-sensitive */
        {NULL, KVB_TIER_DEVICE, false},
        {"", KVB_TIER_DEVICE, false}, /* empty: absent */
        {"GPU", KVB_TIER_DEVICE, false},
        {"DEVICE", KVB_TIER_DEVICE, false},
        {"device", KVB_TIER_DEVICE, true},
        {"CPU", KVB_TIER_HOST_PINNED, false},
        {"CPU_PINNED", KVB_TIER_HOST_PINNED, false},
        {"cpu_pinned", KVB_TIER_DEVICE, true},
        {"CPU_TIER1", KVB_TIER_HOST_PINNED, false},
        {"CPU_TIER2", KVB_TIER_DISK, false},
        {"DISK", KVB_TIER_DISK, false},
        {"Disk", KVB_TIER_DEVICE, true},
        {"NVME", KVB_TIER_DISK, false},
        {"STORAGE", KVB_TIER_DISK, false},
        {"FS", KVB_TIER_DEVICE, true}, /* vLLM 0.26.0's FS and OBJ: unknown to Dynamo */
        {"OBJ", KVB_TIER_DEVICE, true},
        {"EXTERNAL", KVB_TIER_EXTERNAL, false},
        {"NETWORK", KVB_TIER_EXTERNAL, false},
        {"REMOTE", KVB_TIER_EXTERNAL, false},
        {"SHARED", KVB_TIER_EXTERNAL, false},
        {"HBM3", KVB_TIER_DEVICE, true},
        {"CPUX", KVB_TIER_DEVICE, true},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        bool unknown;
        struct kvb_str s = S(cases[i].medium);
        ck_assert_int_eq(kvb_tier_from_medium(&s, &unknown), cases[i].tier);
        ck_assert_int_eq(unknown, cases[i].unknown);
    }
    /* forwarded tiers carry their name; unknown media count */
    struct kvb_convert_cfg c = cfg16;
    c.forward_tiers = (1u << KVB_TIER_DEVICE) | (1u << KVB_TIER_HOST_PINNED);
    kvb_converter_set_config(conv, &c);
    struct kvb_rev r;
    int why;
    struct kvb_event e = stored(1, 16);
    e.medium = S("CPU");
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    ck_assert_int_eq(r.tier, KVB_TIER_HOST_PINNED);
    e.medium = S("HBM3"); /* an unknown medium is dropped, counted twice */
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 0);
    ck_assert_int_eq(why, KVB_DROP_UNKNOWN_MEDIUM);
    ck_assert_uint_eq(kvb_get(&m.unknown_medium_total[0]), 1);
    ck_assert_uint_eq(drops(KVB_DROP_UNKNOWN_MEDIUM), 1);
}
END_TEST

/* event_id: one counter per (worker_id, dp_rank), no holes, filtered events
 * consume nothing. */
START_TEST(event_id_contiguity)
{
    struct kvb_rev r;
    int why;
    uint64_t next[3] = {0, 0, 0};
    for (int i = 0; i < 300; i++) {
        uint32_t rank = (uint32_t)(i % 3);
        struct kvb_event e = stored(1, 16);
        if (i % 5 == 1) { /* filtered */
            e.group_idx.has = true;
            e.group_idx.v = 1;
        } else if (i % 7 == 2) {
            e.medium = S("DISK");
        } else if (i % 11 == 3) {
            e.type = KVB_EV_UNKNOWN;
        }
        int rc = kvb_convert_event(conv, &e, rank, &r, &why);
        if (rc == 1) {
            ck_assert_uint_eq(r.event_id, next[rank]);
            next[rank]++;
        }
        if (i % 13 == 0) { /* barriers take ids from the same counter */
            ck_assert_int_eq(kvb_convert_cleared(conv, rank, &r), 1);
            ck_assert_uint_eq(r.event_id, next[rank]);
            next[rank]++;
        }
    }
    ck_assert(next[0] > 50 && next[1] > 50 && next[2] > 50);

    /* a new worker_id (SIGHUP) starts its own counter; the old one is kept */
    struct kvb_convert_cfg c = cfg16;
    c.worker_id = 43;
    kvb_converter_set_config(conv, &c);
    ck_assert_int_eq(kvb_convert_cleared(conv, 0, &r), 1);
    ck_assert_uint_eq(r.event_id, 0);
    ck_assert_uint_eq(r.worker_id, 43);
    kvb_converter_set_config(conv, &cfg16);
    ck_assert_int_eq(kvb_convert_cleared(conv, 0, &r), 1);
    ck_assert_uint_eq(r.event_id, next[0]);

    /* counters can be saved and restored (state persistence) */
    struct kvb_id_counter ids[8];
    size_t n = kvb_converter_counters(conv, ids, 8);
    ck_assert_uint_eq(n, 4);
    struct kvb_converter *c2 = NULL;
    struct kvb_metrics m2 = {0};
    ck_assert_int_eq(kvb_converter_create(&cfg16, &m2, &c2), 0);
    for (size_t i = 0; i < n; i++)
        ck_assert_int_eq(kvb_converter_restore(c2, &ids[i]), 0);
    ck_assert_int_eq(kvb_convert_cleared(c2, 1, &r), 1);
    ck_assert_uint_eq(r.event_id, next[1]);
    kvb_converter_destroy(&c2);
}
END_TEST

START_TEST(counter_table_is_bounded)
{
    struct kvb_rev r;
    for (uint32_t rank = 0; rank < KVB_MAX_ID_COUNTERS; rank++)
        ck_assert_int_eq(kvb_convert_cleared(conv, rank, &r), 1);
    ck_assert_int_eq(kvb_convert_cleared(conv, KVB_MAX_ID_COUNTERS, &r), -ENOSPC);
    ck_assert_int_eq(kvb_convert_cleared(conv, 5, &r), 1);
    ck_assert_uint_eq(r.event_id, 1);
}
END_TEST

/* ---- the hash contract's newer parts (docs/router-events.md 3.1-3.3) ---- *
 * Known answers computed independently with python3 and libxxhash (the script
 * is in docs/router-events.md section 3.4); the first two equal section 3's. */

static const char img1[] = "0cf457e24a479f02fd4d34540389f720f0807dcff92a7562108165b2637ea82f";
static const char img2[] = "5a0717cb6596468ea1dffa86011f9b0f497348d80421835b51799f9aeb455642";
#define IMG1 933467652192968450ULL /* u64 of img1's first 16 hex digits */
#define IMG2 6487179950600636046ULL
#define OPAQUE 7447875215993299872ULL /* XXH3_64("opaque-image-0", 0) */

static struct kvb_event qwen_event(const uint32_t *t, uint32_t n_tokens)
{
    static struct kvb_hash h;
    h = uh(15760518052499183552ULL);
    struct kvb_event e = {.type = KVB_EV_STORED};
    e.hashes = &h;
    e.n_hashes = 1;
    e.tokens = t;
    e.n_tokens = n_tokens;
    e.block_size.has = true;
    e.block_size.v = 16;
    return e;
}

static uint64_t th0(const struct kvb_event *e)
{
    struct kvb_rev r;
    int why = -1;
    ck_assert_int_eq(kvb_convert_event(conv, e, 0, &r, &why), 1);
    return r.blocks[0].tokens_hash;
}

START_TEST(salt_seed_known_answers)
{
    ck_assert_uint_eq(kvb_salt_seed(NULL, 0, NULL, 0), 1337);
    ck_assert_uint_eq(kvb_salt_seed("adapter-a", 9, NULL, 0), kvb_lora_seed("adapter-a", 9));
    ck_assert_uint_eq(kvb_salt_seed(NULL, 0, "tenant-a", 8), 1948188790972764086ULL);
    ck_assert_uint_eq(kvb_tokens_hash(qwen, 16, kvb_salt_seed(NULL, 0, "tenant-a", 8)),
                      6220064897286669353ULL);
    ck_assert_uint_eq(kvb_tokens_hash(qwen, 16, kvb_salt_seed("adapter-a", 9, "tenant-a", 8)),
                      17508456296452210659ULL);
    /* an empty string is absent */
    ck_assert_uint_eq(kvb_salt_seed("", 0, "", 0), 1337);
}
END_TEST

START_TEST(cache_namespace_sources)
{
    struct kvb_event e = qwen_event(qwen, 16);
    ck_assert_uint_eq(th0(&e), 7652252100776996844ULL);

    /* configured: the converter keeps the hash, not the borrowed pointer */
    char ns[16] = "tenant-a";
    struct kvb_convert_cfg c = cfg16;
    c.cache_namespace = ns;
    kvb_converter_set_config(conv, &c);
    memset(ns, 'x', sizeof(ns) - 1);
    ck_assert_uint_eq(th0(&e), 6220064897286669353ULL);
    e.lora_name = S("adapter-a");
    ck_assert_uint_eq(th0(&e), 17508456296452210659ULL);
    e.lora_name = S(NULL);

    /* the event's own cache_salt wins over the configured one */
    c.cache_namespace = "other";
    kvb_converter_set_config(conv, &c);
    e.cache_salt = S("tenant-a");
    ck_assert_uint_eq(th0(&e), 6220064897286669353ULL);
    e.cache_salt = S(NULL);

    /* vLLM extra_keys: Dynamo's tag in the first block; a LoRA name equal to
     * the tagged text is skipped once; untagged strings are no namespace */
    c.cache_namespace = NULL;
    kvb_converter_set_config(conv, &c);
    struct kvb_extra_key xk[3] = {
        {S("adapter-a"), false}, {S("tenant-b"), false}, {S("dynamo-cache-salt:tenant-a"), false}};
    uint32_t off[2] = {0, 3};
    e.xkeys = xk;
    e.xkey_off = off;
    e.n_xkey_blocks = 1;
    e.lora_name = S("adapter-a");
    ck_assert_uint_eq(th0(&e), 17508456296452210659ULL);
    xk[2].s = S("dynamo-cache-salt:"); /* empty after the tag: none */
    ck_assert_uint_eq(th0(&e), 18179192224704087310ULL);
    xk[2].s = S("tenant-a"); /* untagged */
    ck_assert_uint_eq(th0(&e), 18179192224704087310ULL);

    /* set_config without a namespace drops it */
    e = qwen_event(qwen, 16);
    ck_assert_uint_eq(th0(&e), 7652252100776996844ULL);
}
END_TEST

START_TEST(multimodal_blocks)
{
    ck_assert(!kvb_mm_identifier_hash(&(struct kvb_str){NULL, 0}, true, &(uint64_t){0}));
    uint64_t h;
    struct kvb_str id = S(img1);
    ck_assert(kvb_mm_identifier_hash(&id, false, &h));
    ck_assert_uint_eq(h, IMG1);
    id = S("opaque-image-0");
    ck_assert(!kvb_mm_identifier_hash(&id, false, &h));
    ck_assert(kvb_mm_identifier_hash(&id, true, &h));
    ck_assert_uint_eq(h, OPAQUE);
    id = S("");
    ck_assert(!kvb_mm_identifier_hash(&id, true, &h));
    id = S("0CF457E24A479F02fd4d34540389f720f0807dcff92a7562108165b2637ea82f"); /* either case */
    ck_assert(kvb_mm_identifier_hash(&id, false, &h));
    ck_assert_uint_eq(h, IMG1);
    id = S("0cf457e24a479f02fd4d34540389f720f0807dcff92a7562108165b2637ea82g");
    ck_assert(!kvb_mm_identifier_hash(&id, false, &h));

    /* two blocks: block 0 carries img2 and img1 (hashed sorted, reported in
     * extra_keys order), block 1 a LoRA name and an opaque offset-tagged id */
    static uint32_t t32[32];
    memcpy(t32, qwen, sizeof(qwen));
    memcpy(t32 + 16, qwen, sizeof(qwen));
    struct kvb_hash hs[2] = {uh(1), uh(2)};
    struct kvb_event e = qwen_event(t32, 32);
    e.hashes = hs;
    e.n_hashes = 2;
    struct kvb_extra_key xk[5] = {{S(img2), false},
                                  {S(img1), true},
                                  {S("adapter-a"), false},
                                  {S(img1), false},
                                  {S("opaque-image-0"), true}};
    uint32_t off[3] = {0, 2, 5};
    e.xkeys = xk;
    e.xkey_off = off;
    e.n_xkey_blocks = 2;
    struct kvb_rev r;
    int why;
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    ck_assert_int_eq(r.n, 2);
    ck_assert_uint_eq(r.blocks[0].tokens_hash, 11552180366119068694ULL);
    ck_assert_uint_eq(r.blocks[1].tokens_hash, 18076277279652650428ULL);
    ck_assert_int_eq(r.n_mm, 4);
    ck_assert_uint_eq(r.mm_off[0], 0);
    ck_assert_uint_eq(r.mm_off[1], 2);
    ck_assert_uint_eq(r.mm_off[2], 4);
    ck_assert_uint_eq(r.mm_hashes[0], IMG2);
    ck_assert_uint_eq(r.mm_hashes[1], IMG1);
    ck_assert_uint_eq(r.mm_hashes[2], IMG1);
    ck_assert_uint_eq(r.mm_hashes[3], OPAQUE);

    /* a bare string equal to the LoRA name is never an mm identifier, even
     * when it is 64 hex digits */
    xk[3].s = S(img2);
    e.lora_name = S(img2);
    struct kvb_convert_cfg c = cfg16;
    c.lora_salt = false;
    kvb_converter_set_config(conv, &c);
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    ck_assert_int_eq(r.mm_off[2] - r.mm_off[1], 1);
    ck_assert_uint_eq(r.mm_hashes[r.mm_off[1]], OPAQUE);

    /* no mm identifier anywhere: plain hashes, no mm_extra_info */
    e.n_xkey_blocks = 0;
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    ck_assert_int_eq(r.n_mm, 0);
    ck_assert(r.mm_hashes == NULL && r.mm_off == NULL);
    ck_assert_uint_eq(r.blocks[1].tokens_hash, 7652252100776996844ULL);
}
END_TEST

/* Dynamo's pad-value substitution (zmq_wire/convert.rs
 * substitute_pad_values(), protocols.rs pad_value_for_mm_hash()).  The
 * expected tokens_hash values were computed outside kvbridge: the pad values
 * by hand from the formula 1000000 + (mm_hash & (2^30 - 1)), the substituted
 * tokens written out as u32 little-endian bytes and hashed with libxxhash's
 * XXH3_64bits_withSeed(seed 1337) in a ten-line standalone program. */
START_TEST(mm_pad_substitution)
{
    /* the formula, with the values Dynamo's own Python test pins */
    ck_assert_uint_eq(kvb_mm_pad_value(0), 1000000);
    ck_assert_uint_eq(kvb_mm_pad_value((1u << 30) - 1), 1000000 + (1u << 30) - 1);
    ck_assert_uint_eq(kvb_mm_pad_value((UINT64_C(1) << 30) | 0xCAFE), 1000000 + 0xCAFE);

    enum { IMG = 151655 };
    const uint32_t p1 = 1000000u + 0x3fffffffu, p2 = 1000005u;
    static const char *id1 = "00000000ffffffff000000000000000000000000000000000000000000000000";
    static const char *id2 = "0000000000000005000000000000000000000000000000000000000000000000";
    static uint32_t t[16] = {10, 20,  IMG, IMG, IMG, IMG, IMG, IMG,
                             30, IMG, IMG, IMG, IMG, 40,  50,  60};
    uint32_t out[16];
    uint64_t mm[2] = {0xffffffffu, 5};
    ck_assert_uint_eq(kvb_mm_pad_substitute(t, 16, IMG, mm, 2, out), 2);
    ck_assert_uint_eq(out[2], p1);
    ck_assert_uint_eq(out[7], p1);
    ck_assert_uint_eq(out[8], 30);
    ck_assert_uint_eq(out[9], p2);
    ck_assert_uint_eq(out[12], p2);
    ck_assert_uint_eq(out[13], 40);

    /* through the converter: mm hashes in extra_keys order (the larger
     * first, so sorting would swap the pads), hashed without them */
    struct kvb_event e = qwen_event(t, 16);
    struct kvb_extra_key xk[2] = {{S(id1), false}, {S(id2), false}};
    uint32_t off[2] = {0, 2};
    e.xkeys = xk;
    e.xkey_off = off;
    e.n_xkey_blocks = 1;
    struct kvb_convert_cfg c = cfg16;
    c.image_token_id = IMG;
    kvb_converter_set_config(conv, &c);
    struct kvb_rev r;
    int why;
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    ck_assert_uint_eq(r.blocks[0].tokens_hash, 6199498804420141183ULL);
    ck_assert_int_eq(r.n_mm, 2); /* still reported as mm_extra_info */

    /* a third run takes the last mm hash */
    static uint32_t u[16] = {IMG, IMG, 7, IMG, IMG, 8, IMG, IMG, IMG, 9, 9, 9, 9, 9, 9, 9};
    e = qwen_event(u, 16);
    e.xkeys = xk;
    e.xkey_off = off;
    e.n_xkey_blocks = 1;
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    ck_assert_uint_eq(r.blocks[0].tokens_hash, 17871767788887772674ULL);

    /* a block without mm hashes is hashed as plain tokens, image token or not */
    e.n_xkey_blocks = 0;
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    ck_assert_uint_eq(r.blocks[0].tokens_hash, kvb_tokens_hash(u, 16, KVB_TOKENS_HASH_SEED));

    /* image_token_id off: tokens plus sorted mm hashes, as before */
    kvb_converter_set_config(conv, &cfg16);
    e.n_xkey_blocks = 1;
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    uint64_t sorted[2] = {5, 0xffffffffu};
    ck_assert_uint_eq(r.blocks[0].tokens_hash,
                      kvb_tokens_mm_hash(u, 16, sorted, 2, KVB_TOKENS_HASH_SEED));
}
END_TEST

/* sources[].video_token_id (Dynamo's substitute_pad_values(), docs/router-events.md
 * 3.2).  The literal hashes were computed by a standalone program using libxxhash
 * that writes out the tokens Dynamo's algorithm yields, pads 1000000 + (h & (2^30
 * - 1)), and hashes them with XXH3-64, seed 1337, as little-endian u32s. */
#define MMID(h16) h16 "000000000000000000000000000000000000000000000000"
START_TEST(mm_video_substitution)
{
    enum { I = 151655, V = 151656 };
    static const char *hv = MMID("0000000000000029"), *hi = MMID("000000000000002a"),
                      *hx = MMID("0000000000000007"), *hy = MMID("0000000000000008");
    static uint32_t t[6 * 16] = {
        /* b0: two timestamp-split video runs are one object, then an image */
        10, V, V, 7, V, V, 8, I, I, 20, 21, 22, 23, 24, 25, 26,
        /* b1: one object, video only: infers hv = video */
        V, V, V, V, 30, V, V, V, V, 31, V, V, V, V, 32, 33,
        /* b2: one image run, objects [hv, hi]: the one match by kind is hi */
        40, I, I, I, I, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51,
        /* b3: one object, image only: infers hi = image */
        I, I, I, I, I, I, I, I, 50, 51, 52, 53, 54, 55, 56, 57,
        /* b4: image then video against [hv, hi]: contradicts the kinds */
        I, I, 60, V, V, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71,
        /* b5: one video object, two unknown hashes: no single mapping */
        V, 7, V, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92};
    struct kvb_extra_key xk[10] = {{S(hv), false}, {S(hi), false}, {S(hv), false}, {S(hv), false},
                                   {S(hi), false}, {S(hi), false}, {S(hv), false}, {S(hi), false},
                                   {S(hx), false}, {S(hy), false}};
    uint32_t off[7] = {0, 2, 3, 5, 6, 8, 10};
    struct kvb_hash h[6];
    for (int i = 0; i < 6; i++)
        h[i] = uh(100 + (uint64_t)i);
    struct kvb_event e = qwen_event(t, 6 * 16);
    e.hashes = h;
    e.n_hashes = 6;
    e.xkeys = xk;
    e.xkey_off = off;
    e.n_xkey_blocks = 6;
    struct kvb_convert_cfg c = cfg16;
    c.image_token_id = I;
    c.video_token_id = V;
    kvb_converter_set_config(conv, &c);
    struct kvb_rev r;
    int why;
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    ck_assert_uint_eq(r.n, 6);
    ck_assert_uint_eq(r.blocks[0].tokens_hash, 6579184199688108642ULL);
    ck_assert_uint_eq(r.blocks[1].tokens_hash, 1212202366291642913ULL);
    ck_assert_uint_eq(r.blocks[2].tokens_hash, 3699055332954236586ULL);
    ck_assert_uint_eq(r.blocks[3].tokens_hash, 14787588265469423199ULL);
    /* native: tokens plus the sorted mm hashes */
    uint64_t s41[2] = {41, 42}, s78[2] = {7, 8};
    ck_assert_uint_eq(r.blocks[4].tokens_hash,
                      kvb_tokens_mm_hash(t + 64, 16, s41, 2, KVB_TOKENS_HASH_SEED));
    ck_assert_uint_eq(r.blocks[5].tokens_hash,
                      kvb_tokens_mm_hash(t + 80, 16, s78, 2, KVB_TOKENS_HASH_SEED));
    ck_assert_uint_eq(r.n_mm, 10); /* all still reported as mm_extra_info */

    /* image_token_id alone keeps its run-order rule: b2's run takes hv */
    c.video_token_id = 0;
    kvb_converter_set_config(conv, &c);
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    ck_assert_uint_ne(r.blocks[2].tokens_hash, 3699055332954236586ULL);
    uint32_t pad[16];
    uint64_t mm2[2] = {41, 42};
    kvb_mm_pad_substitute(t + 32, 16, I, mm2, 2, pad);
    ck_assert_uint_eq(r.blocks[2].tokens_hash, kvb_tokens_hash(pad, 16, KVB_TOKENS_HASH_SEED));

    /* a video id equal to the image id: every block native */
    c.video_token_id = I;
    kvb_converter_set_config(conv, &c);
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    uint64_t one[1] = {41};
    ck_assert_uint_eq(r.blocks[1].tokens_hash,
                      kvb_tokens_mm_hash(t + 16, 16, one, 1, KVB_TOKENS_HASH_SEED));

    /* EAGLE: kinds are inferred from a block's B tokens, not its window.
     * Block 0 is all video with one hash, its window's last token block 1's
     * image: hv is video, so block 1's [image, video] against [hv, hi]
     * contradicts it and stays native (from the window, nothing would be
     * inferred and block 1 would be pad-substituted). */
    static uint32_t w[33];
    for (int i = 0; i < 16; i++)
        w[i] = V;
    w[16] = I;
    w[17] = V;
    w[18] = V;
    for (int i = 19; i < 33; i++)
        w[i] = (uint32_t)(100 + i);
    struct kvb_extra_key xw[3] = {{S(hv), false}, {S(hv), false}, {S(hi), false}};
    uint32_t offw[3] = {0, 1, 3};
    e = qwen_event(w, 33);
    e.token_pairs = true;
    e.hashes = h;
    e.n_hashes = 2;
    e.xkeys = xw;
    e.xkey_off = offw;
    e.n_xkey_blocks = 2;
    c.video_token_id = V;
    kvb_converter_set_config(conv, &c);
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    ck_assert_uint_eq(r.n, 2);
    ck_assert_uint_eq(r.blocks[0].tokens_hash,
                      kvb_tokens_mm_hash(w, 17, one, 1, KVB_TOKENS_HASH_SEED));
    ck_assert_uint_eq(r.blocks[1].tokens_hash,
                      kvb_tokens_mm_hash(w + 16, 17, s41, 2, KVB_TOKENS_HASH_SEED));

    /* video_token_id alone (Dynamo's vllm_video_event test, block of 16) */
    static uint32_t u[16] = {10, 20, V, V, V, V, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39};
    static const char *id1 = MMID("00000000ffffffff");
    struct kvb_extra_key x1 = {S(id1), false};
    uint32_t off1[2] = {0, 1};
    e = qwen_event(u, 16);
    e.xkeys = &x1;
    e.xkey_off = off1;
    e.n_xkey_blocks = 1;
    c.image_token_id = 0;
    c.video_token_id = V;
    kvb_converter_set_config(conv, &c);
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    ck_assert_uint_eq(r.blocks[0].tokens_hash, 11157750116678778271ULL);
}
END_TEST

START_TEST(mm_video_pure)
{
    enum { I = 900, V = 800 };
    uint32_t out[8], map[8];
    /* Dynamo's timestamped_video_runs_share_one_hash_before_an_image */
    const uint32_t a[8] = {V, V, 7, V, V, 8, I, I};
    const uint64_t mm[2] = {41, 42};
    ck_assert_int_eq(kvb_mm_pad_substitute_aware(a, 8, I, V, mm, 2, NULL, 0, map, out), 0);
    const uint32_t want[8] = {1000041, 1000041, 7, 1000041, 1000041, 8, 1000042, 1000042};
    ck_assert_mem_eq(out, want, sizeof(want));
    /* consecutive_video_objects_fail_closed_without_offsets */
    const uint32_t b[3] = {V, 7, V};
    ck_assert_int_eq(kvb_mm_pad_substitute_aware(b, 3, 0, V, mm, 2, NULL, 0, map, out), -1);
    /* modality_aware_image_object_mismatch_fails_closed */
    const uint32_t c1[3] = {I, 7, I}, c2[2] = {I, I};
    ck_assert_int_eq(kvb_mm_pad_substitute_aware(c1, 3, I, V, mm, 1, NULL, 0, map, out), -1);
    ck_assert_int_eq(kvb_mm_pad_substitute_aware(c2, 2, I, V, mm, 2, NULL, 0, map, out), -1);
    /* two matches by kind: not guessed; one: taken */
    struct kvb_mm_kind_of k[3] = {{42, KVB_MM_IMAGE}, {41, KVB_MM_IMAGE}, {43, KVB_MM_VIDEO}};
    ck_assert_uint_eq(kvb_mm_kinds_finish(k, 3), 3);
    const uint64_t m3[3] = {41, 42, 43};
    ck_assert_int_eq(kvb_mm_pad_substitute_aware(c2, 2, I, V, m3, 3, k, 3, map, out), -1);
    const uint32_t d[2] = {V, V};
    ck_assert_int_eq(kvb_mm_pad_substitute_aware(d, 2, I, V, m3, 3, k, 3, map, out), 0);
    ck_assert_uint_eq(out[0], 1000043);
    /* a hash given two kinds is dropped; one given one kind twice is kept */
    struct kvb_mm_kind_of k2[4] = {
        {5, KVB_MM_IMAGE}, {6, KVB_MM_VIDEO}, {5, KVB_MM_VIDEO}, {6, KVB_MM_VIDEO}};
    ck_assert_uint_eq(kvb_mm_kinds_finish(k2, 4), 1);
    ck_assert_uint_eq(k2[0].hash, 6);
    /* no placeholder: the tokens unchanged */
    const uint32_t e1[2] = {1, 2};
    ck_assert_int_eq(kvb_mm_pad_substitute_aware(e1, 2, I, V, mm, 2, NULL, 0, map, out), 0);
    ck_assert_mem_eq(out, e1, sizeof(e1));
    ck_assert_int_eq(kvb_mm_block_kind(a, 8, I, V), KVB_MM_NONE);
    ck_assert_int_eq(kvb_mm_block_kind(a, 5, I, V), KVB_MM_VIDEO);
    ck_assert_int_eq(kvb_mm_block_kind(c2, 2, I, I), KVB_MM_NONE);
}
END_TEST

START_TEST(eagle_windows)
{
    /* 16 pairs flatten to 17 ids: one window of B+1 = 17 tokens */
    static uint32_t t17[17];
    memcpy(t17, qwen, sizeof(qwen));
    t17[16] = 1000;
    struct kvb_event e = qwen_event(t17, 17);
    e.token_pairs = true;
    e.n_pairs = 16;
    ck_assert_uint_eq(th0(&e), 8531672197035749033ULL);

    /* 32 pairs (33 ids): windows [0,17) and [16,33), stride B */
    static uint32_t t33[33];
    for (uint32_t i = 0; i < 33; i++)
        t33[i] = i * 7 + 1;
    struct kvb_hash hs[2] = {uh(1), uh(2)};
    e = qwen_event(t33, 33);
    e.hashes = hs;
    e.n_hashes = 2;
    e.token_pairs = true;
    e.n_pairs = 32;
    struct kvb_rev r;
    int why;
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    ck_assert_int_eq(r.n, 2);
    ck_assert_uint_eq(r.blocks[0].tokens_hash, 7581774737841154026ULL);
    ck_assert_uint_eq(r.blocks[1].tokens_hash, 18042718775135788396ULL);

    /* 31 pairs (32 ids) cover one window only; 15 pairs none */
    e.n_pairs = 31;
    e.n_tokens = 32;
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 1);
    ck_assert_int_eq(r.n, 1);
    e.n_pairs = 15;
    e.n_tokens = 16;
    ck_assert_int_eq(kvb_convert_event(conv, &e, 0, &r, &why), 0);
    ck_assert_int_eq(why, KVB_DROP_NO_COMPLETE_BLOCK);

    /* EAGLE with LoRA, namespace and an mm identifier together */
    struct kvb_convert_cfg c = cfg16;
    c.cache_namespace = "tenant-a";
    kvb_converter_set_config(conv, &c);
    struct kvb_extra_key xk = {S(img1), false};
    uint32_t off[2] = {0, 1};
    e = qwen_event(t17, 17);
    e.token_pairs = true;
    e.n_pairs = 16;
    e.lora_name = S("adapter-a");
    e.xkeys = &xk;
    e.xkey_off = off;
    e.n_xkey_blocks = 1;
    ck_assert_uint_eq(th0(&e), 7299114549342135128ULL);
}
END_TEST

static Suite *convert_suite(void)
{
    Suite *s = suite_create("convert");
    TCase *tc = tcase_create("convert");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, known_answer_hashes);
    tcase_add_test(tc, literal_example_and_lora_salt);
    tcase_add_test(tc, lora_by_id);
    tcase_add_test(tc, hash_normalisation);
    tcase_add_test(tc, block_size_rule);
    tcase_add_test(tc, filters_count_by_reason);
    tcase_add_test(tc, removed_events);
    tcase_add_test(tc, storage_tiers);
    tcase_add_test(tc, event_id_contiguity);
    tcase_add_test(tc, counter_table_is_bounded);
    tcase_add_test(tc, salt_seed_known_answers);
    tcase_add_test(tc, cache_namespace_sources);
    tcase_add_test(tc, multimodal_blocks);
    tcase_add_test(tc, mm_pad_substitution);
    tcase_add_test(tc, mm_video_substitution);
    tcase_add_test(tc, mm_video_pure);
    tcase_add_test(tc, eagle_windows);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(convert_suite()); }
