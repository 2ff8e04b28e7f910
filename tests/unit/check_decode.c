/* decode: every input variant of docs/engine-events.md and every malformed kind. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"
#include "testutil.h"

static struct kvb_decoder *dec;

static void setup(void)
{
    dec = kvb_decoder_create(NULL);
    ck_assert(dec != NULL);
}
static void teardown(void) { kvb_decoder_destroy(&dec); }

static int decode_mp(struct mp *m, struct kvb_batch *b)
{
    return kvb_decode_batch(dec, mp_data(m), m->sb.size, b);
}

/* A positional BlockStored with the first `len` of its 12 fields:
 * hashes [1000, 2000], parent 999, 32 tokens 0..31, block_size 16, lora_id 3,
 * medium "GPU", lora_name "a", extra_keys [nil,nil], group 0,
 * kind "full_attention", sliding window nil. */
static void pack_stored_positional(struct mp *m, unsigned len)
{
    msgpack_packer *pk = &m->pk;
    msgpack_pack_array(pk, len);
    mp_str(m, "BlockStored");
    for (unsigned i = 1; i < len; i++) {
        switch (i) {
        case 1:
            msgpack_pack_array(pk, 2);
            msgpack_pack_uint64(pk, 1000);
            msgpack_pack_uint64(pk, 2000);
            break;
        case 2: msgpack_pack_uint64(pk, 999); break;
        case 3:
            msgpack_pack_array(pk, 32);
            for (int t = 0; t < 32; t++)
                msgpack_pack_int(pk, t);
            break;
        case 4: msgpack_pack_int(pk, 16); break;
        case 5: msgpack_pack_int(pk, 3); break;
        case 6: mp_str(m, "GPU"); break;
        case 7: mp_str(m, "a"); break;
        case 8:
            msgpack_pack_array(pk, 2);
            msgpack_pack_nil(pk);
            msgpack_pack_nil(pk);
            break;
        case 9: msgpack_pack_int(pk, 0); break;
        case 10: mp_str(m, "full_attention"); break;
        case 11: msgpack_pack_nil(pk); break;
        default: msgpack_pack_nil(pk); break; /* extra positions: ignored */
        }
    }
}

static void pack_batch_head(struct mp *m, unsigned n_events)
{
    msgpack_pack_array(&m->pk, 3);
    msgpack_pack_double(&m->pk, 1796034253.5);
    msgpack_pack_array(&m->pk, n_events);
}

/* ---- envelopes ---------------------------------------------------------- */

START_TEST(envelope_two_elements)
{
    size_t len;
    uint8_t *p = read_all("tests/data/vllm-v0.9.0/000001.msgpack", &len);
    struct kvb_batch b;
    ck_assert_int_eq(kvb_decode_batch(dec, p, len, &b), 0);
    ck_assert(!b.dp_rank.has);
    ck_assert_int_eq(b.n_events, 2);
    ck_assert_int_eq(b.events[0].type, KVB_EV_STORED);
    ck_assert_int_eq(b.events[0].n_hashes, 4);
    ck_assert_int_eq(b.events[0].hashes[0].kind, KVB_HASH_INT);
    ck_assert_int_eq(b.events[0].parent.kind, KVB_HASH_INT);
    ck_assert(b.events[0].parent.v.i == -5714628315161895266LL);
    ck_assert_int_eq(b.events[0].n_tokens, 64);
    ck_assert_int_eq(b.events[0].tokens[0], 119050);
    ck_assert_int_eq(b.events[1].type, KVB_EV_REMOVED);
    ck_assert(b.events[1].hashes[0].v.i == -5448638146872078049LL);
    ck_assert(b.ts > 1796034252.0 && b.ts < 1796034253.0);
    free(p);
}
END_TEST

START_TEST(envelope_three_elements)
{
    size_t len;
    uint8_t *p = read_all("tests/data/vllm-v0.22.0-lora/000001.msgpack", &len);
    struct kvb_batch b;
    ck_assert_int_eq(kvb_decode_batch(dec, p, len, &b), 0);
    ck_assert(b.dp_rank.has && b.dp_rank.v == 0);
    ck_assert_int_eq(b.events[0].type, KVB_EV_STORED);
    ck_assert_int_eq(b.events[0].lora_name.len, 9);
    ck_assert(memcmp(b.events[0].lora_name.ptr, "adapter-a", 9) == 0);
    ck_assert(b.events[0].lora_id.has && b.events[0].lora_id.v == 3);
    ck_assert(b.events[0].group_idx.has && b.events[0].group_idx.v == 0);
    ck_assert_int_eq(b.events[0].spec_kind.len, 14);
    ck_assert(!b.events[0].sliding_window.has);
    ck_assert_int_eq(b.events[1].type, KVB_EV_REMOVED);
    ck_assert(b.events[1].group_idx.has);
    free(p);
}
END_TEST

START_TEST(envelope_map_and_extras)
{
    struct mp m;
    struct kvb_batch b;
    /* map envelope, keys in an unusual order, an unknown key */
    mp_init(&m);
    msgpack_pack_map(&m.pk, 4);
    mp_str(&m, "data_parallel_rank");
    msgpack_pack_int(&m.pk, 5);
    mp_str(&m, "events");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_array(&m.pk, 1);
    mp_str(&m, "AllBlocksCleared");
    mp_str(&m, "future");
    msgpack_pack_true(&m.pk);
    mp_str(&m, "ts");
    msgpack_pack_int(&m.pk, 17); /* any number */
    ck_assert_int_eq(decode_mp(&m, &b), 0);
    ck_assert(b.dp_rank.has && b.dp_rank.v == 5);
    ck_assert_int_eq(b.n_events, 1);
    ck_assert_int_eq(b.events[0].type, KVB_EV_CLEARED);
    ck_assert(b.ts == 17.0);
    mp_free(&m);

    /* array envelope with nil dp_rank and extra trailing elements */
    mp_init(&m);
    msgpack_pack_array(&m.pk, 5);
    msgpack_pack_float(&m.pk, 1.5f);
    msgpack_pack_array(&m.pk, 0);
    msgpack_pack_nil(&m.pk);
    mp_str(&m, "extra");
    msgpack_pack_int(&m.pk, 1);
    ck_assert_int_eq(decode_mp(&m, &b), 0);
    ck_assert(!b.dp_rank.has);
    ck_assert_int_eq(b.n_events, 0); /* empty event list: legal heartbeat */
    mp_free(&m);

    /* map envelope without dp_rank */
    mp_init(&m);
    msgpack_pack_map(&m.pk, 2);
    mp_str(&m, "ts");
    msgpack_pack_double(&m.pk, 2.0);
    mp_str(&m, "events");
    msgpack_pack_array(&m.pk, 0);
    ck_assert_int_eq(decode_mp(&m, &b), 0);
    ck_assert(!b.dp_rank.has);
    mp_free(&m);
}
END_TEST

/* ---- positional events -------------------------------------------------- */

START_TEST(stored_positional_every_length)
{
    static const unsigned lens[] = {6, 7, 8, 9, 10, 12, 14};
    for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
        unsigned len = lens[k];
        struct mp m;
        struct kvb_batch b;
        mp_init(&m);
        pack_batch_head(&m, 1);
        pack_stored_positional(&m, len);
        msgpack_pack_int(&m.pk, 0);
        ck_assert_int_eq(decode_mp(&m, &b), 0);
        const struct kvb_event *e = &b.events[0];
        ck_assert_msg(e->type == KVB_EV_STORED, "len %u: %s", len, e->error);
        ck_assert_int_eq(e->n_hashes, 2);
        ck_assert(e->hashes[1].kind == KVB_HASH_UINT && e->hashes[1].v.u == 2000);
        ck_assert(e->parent.kind == KVB_HASH_UINT && e->parent.v.u == 999);
        ck_assert_int_eq(e->n_tokens, 32);
        ck_assert_int_eq(e->tokens[31], 31);
        ck_assert(e->block_size.has && e->block_size.v == 16);
        ck_assert(e->lora_id.has && e->lora_id.v == 3);
        ck_assert_int_eq(e->medium.ptr != NULL, len >= 7);
        ck_assert_int_eq(e->lora_name.ptr != NULL, len >= 8);
        ck_assert_int_eq(e->group_idx.has, len >= 10);
        ck_assert_int_eq(e->spec_kind.ptr != NULL, len >= 11);
        ck_assert(!e->sliding_window.has);
        mp_free(&m);
    }
}
END_TEST

START_TEST(removed_and_cleared_positional)
{
    for (unsigned len = 2; len <= 5; len++) {
        struct mp m;
        struct kvb_batch b;
        mp_init(&m);
        pack_batch_head(&m, 2);
        msgpack_pack_array(&m.pk, len);
        mp_str(&m, "BlockRemoved");
        msgpack_pack_array(&m.pk, 1);
        msgpack_pack_int64(&m.pk, -7);
        if (len > 2)
            mp_str(&m, "cpu");
        if (len > 3)
            msgpack_pack_int(&m.pk, 1);
        if (len > 4)
            mp_str(&m, "ignored");
        msgpack_pack_array(&m.pk, 1);
        mp_str(&m, "AllBlocksCleared");
        msgpack_pack_int(&m.pk, 0);
        ck_assert_int_eq(decode_mp(&m, &b), 0);
        ck_assert_int_eq(b.events[0].type, KVB_EV_REMOVED);
        ck_assert(b.events[0].hashes[0].kind == KVB_HASH_INT && b.events[0].hashes[0].v.i == -7);
        ck_assert_int_eq(b.events[0].medium.ptr != NULL, len > 2);
        ck_assert_int_eq(b.events[0].group_idx.has, len > 3);
        ck_assert_int_eq(b.events[1].type, KVB_EV_CLEARED);
        mp_free(&m);
    }
}
END_TEST

/* vLLM 0.26+: locality and ownership after the group metadata (stored
 * index 12 and 13; removed 6 and 7), AllBlocksCleared's ownership at index
 * 1, and the "Ignored" tag, which decodes and leaves the batch alone. */
START_TEST(locality_ownership_ignored)
{
    struct mp m;
    struct kvb_batch b;
    mp_init(&m);
    pack_batch_head(&m, 5);
    msgpack_pack_array(&m.pk, 14);
    mp_str(&m, "BlockStored");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_uint64(&m.pk, 5);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_array(&m.pk, 0);
    msgpack_pack_int(&m.pk, 16);
    for (int i = 5; i <= 8; i++)
        msgpack_pack_nil(&m.pk);
    msgpack_pack_int(&m.pk, 1);
    mp_str(&m, "full_attention");
    msgpack_pack_nil(&m.pk);
    mp_str(&m, "REMOTE");
    mp_str(&m, "kvcr");
    msgpack_pack_array(&m.pk, 8);
    mp_str(&m, "BlockRemoved");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_uint64(&m.pk, 5);
    mp_str(&m, "GPU");
    msgpack_pack_int(&m.pk, 0);
    mp_str(&m, "mamba");
    msgpack_pack_nil(&m.pk);
    mp_str(&m, "LOCAL");
    msgpack_pack_nil(&m.pk);
    msgpack_pack_array(&m.pk, 5); /* legacy short tail: group, then the window */
    mp_str(&m, "BlockRemoved");
    msgpack_pack_array(&m.pk, 0);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_int(&m.pk, 2);
    msgpack_pack_int(&m.pk, 4096);
    msgpack_pack_array(&m.pk, 2);
    mp_str(&m, "AllBlocksCleared");
    mp_str(&m, "kvcr");
    msgpack_pack_array(&m.pk, 3);
    mp_str(&m, "Ignored");
    msgpack_pack_int(&m.pk, 1);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_nil(&m.pk); /* dp_rank */
    ck_assert_int_eq(decode_mp(&m, &b), 0);
    const struct kvb_event *e = b.events;
    ck_assert_int_eq(e[0].type, KVB_EV_STORED);
    ck_assert(e[0].locality.len == 6 && memcmp(e[0].locality.ptr, "REMOTE", 6) == 0);
    ck_assert(e[0].ownership.len == 4 && memcmp(e[0].ownership.ptr, "kvcr", 4) == 0);
    ck_assert(e[0].group_idx.has && e[0].group_idx.v == 1);
    ck_assert_int_eq(e[1].type, KVB_EV_REMOVED);
    ck_assert(e[1].spec_kind.len == 5 && memcmp(e[1].spec_kind.ptr, "mamba", 5) == 0);
    ck_assert(e[1].locality.len == 5 && e[1].ownership.ptr == NULL);
    ck_assert_int_eq(e[2].type, KVB_EV_REMOVED);
    ck_assert(e[2].spec_kind.ptr == NULL && e[2].group_idx.v == 2);
    ck_assert_int_eq(e[3].type, KVB_EV_CLEARED);
    ck_assert(e[3].ownership.len == 4);
    ck_assert_int_eq(e[4].type, KVB_EV_IGNORED);
    mp_free(&m);
}
END_TEST

/* ---- map events --------------------------------------------------------- */

START_TEST(stored_map_any_order_unknown_keys_map16)
{
    struct mp m;
    struct kvb_batch b;
    mp_init(&m);
    pack_batch_head(&m, 2);
    /* 18 entries: a map16 header (0xde) */
    msgpack_pack_map(&m.pk, 18);
    mp_str(&m, "locality");
    mp_str(&m, "rack-1");
    mp_str(&m, "token_ids");
    msgpack_pack_array(&m.pk, 16);
    for (int t = 0; t < 16; t++)
        msgpack_pack_int(&m.pk, 100 + t);
    mp_str(&m, "kv_cache_spec_sliding_window");
    msgpack_pack_int(&m.pk, 4096);
    mp_str(&m, "block_size");
    msgpack_pack_int(&m.pk, 16);
    mp_str(&m, "session_id");
    msgpack_pack_nil(&m.pk);
    mp_str(&m, "parent_block_hash");
    msgpack_pack_nil(&m.pk);
    mp_str(&m, "block_hashes");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_uint64(&m.pk, UINT64_MAX);
    mp_str(&m, "ownership");
    msgpack_pack_map(&m.pk, 1);
    mp_str(&m, "x");
    msgpack_pack_array(&m.pk, 0);
    msgpack_pack_int(&m.pk, 7); /* a non-string key: ignored */
    msgpack_pack_int(&m.pk, 7);
    mp_str(&m, "lora_name");
    mp_str(&m, "adapter-a");
    mp_str(&m, "medium");
    mp_str(&m, "GPU");
    mp_str(&m, "extra_keys");
    msgpack_pack_nil(&m.pk);
    mp_str(&m, "group_idx");
    msgpack_pack_int(&m.pk, 0);
    mp_str(&m, "kv_cache_spec_kind");
    mp_str(&m, "mla_attention");
    mp_str(&m, "lora_id");
    msgpack_pack_nil(&m.pk);
    mp_str(&m, "u1");
    msgpack_pack_double(&m.pk, 1.5);
    mp_str(&m, "u2");
    msgpack_pack_bin(&m.pk, 2);
    msgpack_pack_bin_body(&m.pk, "ab", 2);
    mp_str(&m, "type");
    mp_str(&m, "BlockStored");
    /* a minimal map event: absent optional keys */
    msgpack_pack_map(&m.pk, 2);
    mp_str(&m, "block_hashes");
    msgpack_pack_array(&m.pk, 0);
    mp_str(&m, "type");
    mp_str(&m, "BlockRemoved");
    msgpack_pack_nil(&m.pk);
    ck_assert(m.sb.data[14] != 0); /* sanity: something was packed */
    ck_assert_int_eq(decode_mp(&m, &b), 0);
    const struct kvb_event *e = &b.events[0];
    ck_assert_msg(e->type == KVB_EV_STORED, "%s", e->error ? e->error : "");
    ck_assert(e->hashes[0].v.u == UINT64_MAX);
    ck_assert_int_eq(e->parent.kind, KVB_HASH_NIL);
    ck_assert_int_eq(e->n_tokens, 16);
    ck_assert_int_eq(e->tokens[15], 115);
    ck_assert(e->sliding_window.has && e->sliding_window.v == 4096);
    ck_assert(!e->lora_id.has);
    ck_assert_int_eq(e->spec_kind.len, 13);
    /* an ownership that is no string: present, naming nothing (unknown_ownership) */
    ck_assert(e->ownership.ptr != NULL && e->ownership.len == 0);
    ck_assert(e->locality.len == 6 && memcmp(e->locality.ptr, "rack-1", 6) == 0);
    ck_assert_int_eq(b.events[1].type, KVB_EV_REMOVED);
    ck_assert_int_eq(b.events[1].n_hashes, 0);
    ck_assert(b.events[1].medium.ptr == NULL);
    ck_assert(!b.events[1].group_idx.has);
    mp_free(&m);
}
END_TEST

START_TEST(map_capture_and_sglang_capture)
{
    size_t len;
    uint8_t *p = read_all("tests/data/vllm-main/000001.msgpack", &len);
    struct kvb_batch b;
    ck_assert_int_eq(kvb_decode_batch(dec, p, len, &b), 0);
    ck_assert_int_eq(b.n_events, 2);
    ck_assert_int_eq(b.events[0].type, KVB_EV_STORED);
    ck_assert(b.events[0].parent.kind == KVB_HASH_UINT &&
              b.events[0].parent.v.u == 10434020536992354886ULL);
    ck_assert_int_eq(b.events[1].type, KVB_EV_REMOVED);
    free(p);

    p = read_all("tests/data/sglang/000010.msgpack", &len);
    ck_assert_int_eq(kvb_decode_batch(dec, p, len, &b), 0);
    ck_assert_int_eq(b.events[0].type, KVB_EV_CLEARED);
    ck_assert_int_eq(b.events[1].type, KVB_EV_STORED);
    ck_assert_int_eq(b.events[1].hashes[0].kind, KVB_HASH_INT);
    free(p);
}
END_TEST

START_TEST(sglang_metadata_map_at_index_7)
{
    struct mp m;
    struct kvb_batch b;
    mp_init(&m);
    pack_batch_head(&m, 1);
    msgpack_pack_array(&m.pk, 8);
    mp_str(&m, "BlockStored");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_int64(&m.pk, -3);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_int(&m.pk, 5);
    msgpack_pack_int(&m.pk, 1); /* a partial page */
    msgpack_pack_nil(&m.pk);
    mp_str(&m, "GPU");
    msgpack_pack_map(&m.pk, 2);
    mp_str(&m, "cache_salt");
    mp_str(&m, "salt-1");
    mp_str(&m, "other");
    msgpack_pack_int(&m.pk, 1);
    msgpack_pack_int(&m.pk, 0);
    ck_assert_int_eq(decode_mp(&m, &b), 0);
    const struct kvb_event *e = &b.events[0];
    ck_assert_int_eq(e->type, KVB_EV_STORED);
    ck_assert(e->lora_name.ptr == NULL);
    ck_assert_int_eq(e->cache_salt.len, 6);
    ck_assert(memcmp(e->cache_salt.ptr, "salt-1", 6) == 0);
    mp_free(&m);
}
END_TEST

/* ---- value encodings ---------------------------------------------------- */

/* Every msgpack integer width, as a block hash, a token id, block_size,
 * group_idx and dp_rank. */
START_TEST(every_int_width)
{
    static const struct {
        uint8_t bytes[9];
        size_t n;
        int neg;
        uint64_t u;
        int64_t i;
    } ints[] = {
        {{0x05}, 1, 0, 5, 0},
        {{0xcc, 0xfe}, 2, 0, 254, 0},
        {{0xcd, 0x12, 0x34}, 3, 0, 0x1234, 0},
        {{0xce, 0x89, 0xab, 0xcd, 0xef}, 5, 0, 0x89abcdefu, 0},
        {{0xcf, 0xda, 0xb7, 0x1b, 0x0f, 0x76, 0x65, 0x1a, 0xc0}, 9, 0, 0xdab71b0f76651ac0ULL, 0},
        {{0xd0, 0x10}, 2, 0, 16, 0}, /* int8 holding a positive value */
        {{0xd3, 0, 0, 0, 0, 0, 0, 0, 0x10}, 9, 0, 16, 0},
        {{0xff}, 1, 1, 0, -1},
        {{0xd0, 0x80}, 2, 1, 0, -128},
        {{0xd1, 0x80, 0x00}, 3, 1, 0, -32768},
        {{0xd2, 0x80, 0, 0, 0}, 5, 1, 0, INT32_MIN},
        {{0xd3, 0xb4, 0x60, 0x5c, 0x21, 0x11, 0xa6, 0x3e, 0x1f},
         9,
         1,
         0,
         (int64_t)0xb4605c2111a63e1fULL},
    };
    for (size_t k = 0; k < sizeof(ints) / sizeof(ints[0]); k++) {
        struct mp m;
        struct kvb_batch b;
        mp_init(&m);
        pack_batch_head(&m, 1);
        msgpack_pack_array(&m.pk, 10);
        mp_str(&m, "BlockStored");
        msgpack_pack_array(&m.pk, 1);
        mp_raw(&m, ints[k].bytes, ints[k].n); /* hash */
        mp_raw(&m, ints[k].bytes, ints[k].n); /* parent */
        msgpack_pack_array(&m.pk, 1);
        if (ints[k].u <= UINT32_MAX) /* token ids are 32-bit */
            mp_raw(&m, ints[k].bytes, ints[k].n);
        else
            msgpack_pack_int(&m.pk, 1);
        if (ints[k].u <= UINT32_MAX) /* block_size */
            mp_raw(&m, ints[k].bytes, ints[k].n);
        else
            msgpack_pack_int(&m.pk, 1);
        if (ints[k].u <= UINT32_MAX) /* lora_id */
            mp_raw(&m, ints[k].bytes, ints[k].n);
        else
            msgpack_pack_int(&m.pk, 1);
        msgpack_pack_nil(&m.pk);
        msgpack_pack_nil(&m.pk);
        msgpack_pack_nil(&m.pk);
        if (ints[k].u <= UINT32_MAX) /* group_idx */
            mp_raw(&m, ints[k].bytes, ints[k].n);
        else
            msgpack_pack_int(&m.pk, 1);
        if (ints[k].u <= UINT32_MAX)
            mp_raw(&m, ints[k].bytes, ints[k].n); /* dp_rank */
        else
            msgpack_pack_int(&m.pk, 0);
        int rc = decode_mp(&m, &b);
        const struct kvb_event *e = rc == 0 ? &b.events[0] : NULL;
        if (ints[k].neg) {
            /* negative dp_rank: not a batch */
            ck_assert_int_eq(rc, KVB_DEC_ENVELOPE);
            mp_free(&m);
            /* same event, dp_rank 0: the event is malformed (negative token
             * id), and the hash decodes as a signed int */
            mp_init(&m);
            pack_batch_head(&m, 1);
            msgpack_pack_array(&m.pk, 3);
            mp_str(&m, "BlockRemoved");
            msgpack_pack_array(&m.pk, 1);
            mp_raw(&m, ints[k].bytes, ints[k].n);
            msgpack_pack_nil(&m.pk);
            msgpack_pack_int(&m.pk, 0);
            ck_assert_int_eq(decode_mp(&m, &b), 0);
            ck_assert_int_eq(b.events[0].hashes[0].kind, KVB_HASH_INT);
            ck_assert(b.events[0].hashes[0].v.i == ints[k].i);
        } else {
            ck_assert_int_eq(rc, 0);
            ck_assert_msg(e->type == KVB_EV_STORED, "case %zu: %s", k, e->error);
            ck_assert(e->hashes[0].v.u == ints[k].u);
            ck_assert(e->parent.v.u == ints[k].u);
            ck_assert(b.dp_rank.v == (ints[k].u <= UINT32_MAX ? (int64_t)ints[k].u : 0));
            ck_assert(e->group_idx.v == (ints[k].u <= UINT32_MAX ? (int64_t)ints[k].u : 1));
            if (ints[k].u <= UINT32_MAX)
                ck_assert(e->tokens[0] == ints[k].u);
        }
        mp_free(&m);
    }
}
END_TEST

START_TEST(bin_hashes_32_and_16)
{
    struct mp m;
    struct kvb_batch b;
    uint8_t h32[32], h16[16];
    for (int i = 0; i < 32; i++)
        h32[i] = (uint8_t)i;
    for (int i = 0; i < 16; i++)
        h16[i] = (uint8_t)(0xf0 + i);
    mp_init(&m);
    pack_batch_head(&m, 1);
    msgpack_pack_array(&m.pk, 6);
    mp_str(&m, "BlockStored");
    msgpack_pack_array(&m.pk, 2);
    msgpack_pack_bin(&m.pk, 32);
    msgpack_pack_bin_body(&m.pk, h32, 32);
    msgpack_pack_bin(&m.pk, 16);
    msgpack_pack_bin_body(&m.pk, h16, 16);
    msgpack_pack_bin(&m.pk, 32);
    msgpack_pack_bin_body(&m.pk, h32, 32);
    msgpack_pack_array(&m.pk, 0);
    msgpack_pack_int(&m.pk, 16);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_int(&m.pk, 0);
    ck_assert_int_eq(decode_mp(&m, &b), 0);
    const struct kvb_event *e = &b.events[0];
    ck_assert_int_eq(e->type, KVB_EV_STORED);
    ck_assert_int_eq(e->hashes[0].kind, KVB_HASH_BIN);
    ck_assert_int_eq(e->hashes[0].bin_len, 32);
    ck_assert_int_eq(e->hashes[1].bin_len, 16);
    ck_assert_int_eq(e->hashes[1].v.bin[15], 0xff);
    ck_assert_int_eq(e->parent.kind, KVB_HASH_BIN);
    /* zero-copy: the view points into the payload */
    ck_assert(e->hashes[0].v.bin > mp_data(&m) && e->hashes[0].v.bin < mp_data(&m) + m.sb.size);
    mp_free(&m);
}
END_TEST

START_TEST(token_pairs_and_strings)
{
    struct mp m;
    struct kvb_batch b;
    mp_init(&m);
    pack_batch_head(&m, 1);
    msgpack_pack_array(&m.pk, 7);
    mp_str(&m, "BlockStored");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_int(&m.pk, 1);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_array(&m.pk, 2);
    for (int i = 0; i < 2; i++) {
        msgpack_pack_array(&m.pk, 2);
        msgpack_pack_int(&m.pk, 10 + i);
        msgpack_pack_int(&m.pk, 20 + i);
    }
    msgpack_pack_int(&m.pk, 2);
    msgpack_pack_nil(&m.pk);
    /* medium as str8 (0xd9) */
    msgpack_pack_str(&m.pk, 40);
    msgpack_pack_str_body(&m.pk, "CPU_TIER1_AND_A_VERY_LONG_MEDIUM_NAME_XX", 40);
    msgpack_pack_int(&m.pk, 0);
    ck_assert(memchr(m.sb.data, 0xd9, m.sb.size) != NULL);
    ck_assert_int_eq(decode_mp(&m, &b), 0);
    ck_assert_int_eq(b.events[0].type, KVB_EV_STORED);
    /* flattened as Dynamo does: [10,20],[11,21] -> 10, 11, 21 */
    ck_assert(b.events[0].token_pairs);
    ck_assert_int_eq(b.events[0].n_pairs, 2);
    ck_assert_int_eq(b.events[0].n_tokens, 3);
    ck_assert_uint_eq(b.events[0].tokens[0], 10);
    ck_assert_uint_eq(b.events[0].tokens[1], 11);
    ck_assert_uint_eq(b.events[0].tokens[2], 21);
    ck_assert_int_eq(b.events[0].medium.len, 40);
    mp_free(&m);

    /* str16 and str32 headers for the type tag */
    static const uint8_t str16[] = {0x93, 0xcb, 0,   0,   0,   0,   0,   0,   0,   0,   0x91,
                                    0x91, 0xda, 0,   16,  'A', 'l', 'l', 'B', 'l', 'o', 'c',
                                    'k',  's',  'C', 'l', 'e', 'a', 'r', 'e', 'd', 0x00};
    ck_assert_int_eq(kvb_decode_batch(dec, str16, sizeof(str16), &b), 0);
    ck_assert_int_eq(b.events[0].type, KVB_EV_CLEARED);
    static const uint8_t str32[] = {0x92, 0x00, 0x91, 0x91, 0xdb, 0,   0,   0,   16,
                                    'A',  'l',  'l',  'B',  'l',  'o', 'c', 'k', 's',
                                    'C',  'l',  'e',  'a',  'r',  'e', 'd'};
    ck_assert_int_eq(kvb_decode_batch(dec, str32, sizeof(str32), &b), 0);
    ck_assert_int_eq(b.events[0].type, KVB_EV_CLEARED);
}
END_TEST

START_TEST(unknown_type_keeps_rest)
{
    struct mp m;
    struct kvb_batch b;
    mp_init(&m);
    pack_batch_head(&m, 3);
    msgpack_pack_array(&m.pk, 2);
    mp_str(&m, "BlockMoved");
    msgpack_pack_array(&m.pk, 0);
    msgpack_pack_map(&m.pk, 1);
    mp_str(&m, "type");
    mp_str(&m, "SomethingNew");
    msgpack_pack_array(&m.pk, 1);
    mp_str(&m, "AllBlocksCleared");
    msgpack_pack_int(&m.pk, 0);
    ck_assert_int_eq(decode_mp(&m, &b), 0);
    ck_assert_int_eq(b.events[0].type, KVB_EV_UNKNOWN);
    ck_assert_int_eq(b.events[0].tag.len, 10);
    ck_assert_int_eq(b.events[1].type, KVB_EV_UNKNOWN);
    ck_assert_int_eq(b.events[2].type, KVB_EV_CLEARED);
    mp_free(&m);
}
END_TEST

/* vLLM's TierBlocksCleared (map, and the array in field order medium,
 * ownership) and an AllBlocksCleared map naming a medium; a tier clear
 * without a medium is malformed, the rest of the batch goes on. */
START_TEST(tier_cleared_forms)
{
    struct mp m;
    struct kvb_batch b;
    mp_init(&m);
    pack_batch_head(&m, 6);
    msgpack_pack_map(&m.pk, 2);
    mp_str(&m, "type");
    mp_str(&m, "TierBlocksCleared");
    mp_str(&m, "medium");
    mp_str(&m, "GPU");
    msgpack_pack_map(&m.pk, 3);
    mp_str(&m, "medium");
    mp_str(&m, "CPU");
    mp_str(&m, "ownership");
    mp_str(&m, "kvcr");
    mp_str(&m, "type");
    mp_str(&m, "TierBlocksCleared");
    msgpack_pack_array(&m.pk, 2);
    mp_str(&m, "TierBlocksCleared");
    mp_str(&m, "CPU");
    msgpack_pack_map(&m.pk, 1); /* no medium */
    mp_str(&m, "type");
    mp_str(&m, "TierBlocksCleared");
    msgpack_pack_map(&m.pk, 2);
    mp_str(&m, "type");
    mp_str(&m, "AllBlocksCleared");
    mp_str(&m, "medium");
    mp_str(&m, "GPU");
    msgpack_pack_array(&m.pk, 3);
    mp_str(&m, "TierBlocksCleared");
    msgpack_pack_int(&m.pk, 7); /* not a string */
    msgpack_pack_nil(&m.pk);
    msgpack_pack_int(&m.pk, 0); /* dp_rank */
    ck_assert_int_eq(decode_mp(&m, &b), 0);
    ck_assert_int_eq(b.n_events, 6);
    ck_assert_int_eq(b.events[0].type, KVB_EV_TIER_CLEARED);
    ck_assert_int_eq(b.events[0].medium.len, 3);
    ck_assert(memcmp(b.events[0].medium.ptr, "GPU", 3) == 0);
    ck_assert_ptr_null(b.events[0].ownership.ptr);
    ck_assert_int_eq(b.events[1].type, KVB_EV_TIER_CLEARED);
    ck_assert(memcmp(b.events[1].medium.ptr, "CPU", 3) == 0);
    ck_assert_int_eq(b.events[1].ownership.len, 4);
    ck_assert_int_eq(b.events[2].type, KVB_EV_TIER_CLEARED);
    ck_assert(memcmp(b.events[2].medium.ptr, "CPU", 3) == 0);
    ck_assert_int_eq(b.events[3].type, KVB_EV_MALFORMED);
    ck_assert_str_eq(b.events[3].error, "TierBlocksCleared has no medium");
    ck_assert_int_eq(b.events[4].type, KVB_EV_CLEARED);
    ck_assert(memcmp(b.events[4].medium.ptr, "GPU", 3) == 0);
    ck_assert_int_eq(b.events[5].type, KVB_EV_MALFORMED);
    mp_free(&m);
}
END_TEST

/* ---- malformed input ---------------------------------------------------- */

START_TEST(truncated_at_every_offset)
{
    static const char *files[] = {
        "tests/data/vllm-v0.9.0/000001.msgpack", "tests/data/vllm-main/000001.msgpack",
        "tests/data/vllm-v0.10.2-bytes/000001.msgpack", "tests/data/sglang/000010.msgpack",
        "tests/data/vllm-v0.22.0-lora/000003.msgpack"};
    for (size_t f = 0; f < sizeof(files) / sizeof(files[0]); f++) {
        size_t len;
        uint8_t *p = read_all(files[f], &len);
        struct kvb_batch b;
        ck_assert_int_eq(kvb_decode_batch(dec, p, len, &b), 0);
        for (size_t cut = 0; cut < len; cut++) {
            /* a fresh, exactly-sized copy so that reading past the end is
             * caught by valgrind / ASan */
            uint8_t *q = malloc(cut ? cut : 1);
            memcpy(q, p, cut);
            int rc = kvb_decode_batch(dec, q, cut, &b);
            ck_assert_msg(rc < 0, "%s cut at %zu decoded", files[f], cut);
            ck_assert_msg(rc == (cut ? KVB_DEC_TRUNCATED : KVB_DEC_EMPTY), "%s cut at %zu: %s",
                          files[f], cut, kvb_decode_strerror(rc));
            free(q);
        }
        free(p);
    }
}
END_TEST

START_TEST(huge_declared_lengths)
{
    struct kvb_batch b;
    /* a 4e9-element array header, as the batch and inside a batch */
    static const uint8_t arr32[] = {0xdd, 0xee, 0x6b, 0x28, 0x00};
    ck_assert_int_eq(kvb_decode_batch(dec, arr32, sizeof(arr32), &b), KVB_DEC_TRUNCATED);
    static const uint8_t inner[] = {0x92, 0x00, 0xdd, 0xee, 0x6b, 0x28, 0x00, 0x90};
    ck_assert_int_eq(kvb_decode_batch(dec, inner, sizeof(inner), &b), KVB_DEC_TRUNCATED);
    static const uint8_t map32[] = {0x92, 0x00, 0xdf, 0xff, 0xff, 0xff, 0xff};
    ck_assert_int_eq(kvb_decode_batch(dec, map32, sizeof(map32), &b), KVB_DEC_TRUNCATED);
    static const uint8_t str32[] = {0x92, 0x00, 0xdb, 0xff, 0xff, 0xff, 0xf0, 'x'};
    ck_assert_int_eq(kvb_decode_batch(dec, str32, sizeof(str32), &b), KVB_DEC_TRUNCATED);
    static const uint8_t bin32[] = {0x92, 0x00, 0xc6, 0x7f, 0xff, 0xff, 0xff};
    ck_assert_int_eq(kvb_decode_batch(dec, bin32, sizeof(bin32), &b), KVB_DEC_TRUNCATED);
    static const uint8_t ext32[] = {0x92, 0x00, 0xc9, 0x7f, 0xff, 0xff, 0xff, 0x01};
    ck_assert_int_eq(kvb_decode_batch(dec, ext32, sizeof(ext32), &b), KVB_DEC_TRUNCATED);
    /* a length that fits the payload but not what is left after it */
    static const uint8_t arr16[] = {0x92, 0x00, 0xdc, 0x00, 0x05, 0x01, 0x02};
    ck_assert_int_eq(kvb_decode_batch(dec, arr16, sizeof(arr16), &b), KVB_DEC_TRUNCATED);
}
END_TEST

START_TEST(deep_nesting)
{
    size_t n = 100000;
    uint8_t *p = malloc(n + 1);
    memset(p, 0x91, n); /* [[[[...]]]] */
    p[n] = 0xc0;
    struct kvb_batch b;
    ck_assert_int_eq(kvb_decode_batch(dec, p, n + 1, &b), KVB_DEC_TOO_DEEP);
    memset(p, 0x81, n); /* {x: {x: ...}} with fixmap headers */
    ck_assert_int_eq(kvb_decode_batch(dec, p, n + 1, &b), KVB_DEC_TOO_DEEP);
    free(p);
    /* the same nesting inside an otherwise good batch */
    uint8_t q[64] = {0x92, 0x00, 0x91};
    memset(q + 3, 0x91, 40);
    q[43] = 0xc0;
    ck_assert_int_eq(kvb_decode_batch(dec, q, 44, &b), KVB_DEC_TOO_DEEP);
}
END_TEST

START_TEST(bad_bytes_and_envelopes)
{
    struct kvb_batch b;
    ck_assert_int_eq(kvb_decode_batch(dec, (const uint8_t *)"", 0, &b), KVB_DEC_EMPTY);
    static const uint8_t c1[] = {0x92, 0xc1, 0x90};
    ck_assert_int_eq(kvb_decode_batch(dec, c1, sizeof(c1), &b), KVB_DEC_BAD_MSGPACK);
    static const uint8_t trailing[] = {0x92, 0x00, 0x90, 0x00};
    ck_assert_int_eq(kvb_decode_batch(dec, trailing, sizeof(trailing), &b), KVB_DEC_TRAILING);
    static const uint8_t scalar[] = {0x05};
    ck_assert_int_eq(kvb_decode_batch(dec, scalar, sizeof(scalar), &b), KVB_DEC_ENVELOPE);
    static const uint8_t one[] = {0x91, 0x00};
    ck_assert_int_eq(kvb_decode_batch(dec, one, sizeof(one), &b), KVB_DEC_ENVELOPE);
    static const uint8_t events_map[] = {0x92, 0x00, 0x80};
    ck_assert_int_eq(kvb_decode_batch(dec, events_map, sizeof(events_map), &b), KVB_DEC_ENVELOPE);
    static const uint8_t ts_str[] = {0x92, 0xa1, 'x', 0x90};
    ck_assert_int_eq(kvb_decode_batch(dec, ts_str, sizeof(ts_str), &b), KVB_DEC_ENVELOPE);
    static const uint8_t dp_str[] = {0x93, 0x00, 0x90, 0xa1, 'x'};
    ck_assert_int_eq(kvb_decode_batch(dec, dp_str, sizeof(dp_str), &b), KVB_DEC_ENVELOPE);
    static const uint8_t dp_neg[] = {0x93, 0x00, 0x90, 0xff};
    ck_assert_int_eq(kvb_decode_batch(dec, dp_neg, sizeof(dp_neg), &b), KVB_DEC_ENVELOPE);
    static const uint8_t map_no_events[] = {0x81, 0xa2, 't', 's', 0x00};
    ck_assert_int_eq(kvb_decode_batch(dec, map_no_events, sizeof(map_no_events), &b),
                     KVB_DEC_ENVELOPE);
    /* nothing written to *out on failure */
    struct kvb_batch untouched = {.n_events = 77};
    ck_assert_int_lt(kvb_decode_batch(dec, c1, sizeof(c1), &untouched), 0);
    ck_assert_int_eq(untouched.n_events, 77);
}
END_TEST

/* Each event below is malformed; the good event after it must survive. */
START_TEST(malformed_events_are_skipped)
{
    struct mp m;
    struct kvb_batch b;
    mp_init(&m);
    pack_batch_head(&m, 15);
    msgpack_pack_int(&m.pk, 5);   /* 0: not an array or map */
    msgpack_pack_array(&m.pk, 0); /* 1: empty array */
    msgpack_pack_array(&m.pk, 2); /* 2: tag not a string */
    msgpack_pack_int(&m.pk, 1);
    msgpack_pack_array(&m.pk, 0);
    msgpack_pack_array(&m.pk, 2); /* 3: invalid UTF-8 tag */
    msgpack_pack_str(&m.pk, 3);
    msgpack_pack_str_body(&m.pk, "\xc3\x28x", 3);
    msgpack_pack_array(&m.pk, 0);
    msgpack_pack_array(&m.pk, 2); /* 4: hashes not an array */
    mp_str(&m, "BlockRemoved");
    mp_str(&m, "nope");
    msgpack_pack_array(&m.pk, 2); /* 5: hash is a string */
    mp_str(&m, "BlockRemoved");
    msgpack_pack_array(&m.pk, 1);
    mp_str(&m, "h");
    msgpack_pack_array(&m.pk, 4); /* 6: token id is a string */
    mp_str(&m, "BlockStored");
    msgpack_pack_array(&m.pk, 0);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_array(&m.pk, 1);
    mp_str(&m, "t");
    msgpack_pack_array(&m.pk, 6); /* 7: block_size is a float */
    mp_str(&m, "BlockStored");
    msgpack_pack_array(&m.pk, 0);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_array(&m.pk, 0);
    msgpack_pack_double(&m.pk, 16.0);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_array(&m.pk, 3); /* 8: medium is an int */
    mp_str(&m, "BlockRemoved");
    msgpack_pack_array(&m.pk, 0);
    msgpack_pack_int(&m.pk, 3);
    msgpack_pack_map(&m.pk, 1); /* 9: map without type */
    mp_str(&m, "block_hashes");
    msgpack_pack_array(&m.pk, 0);
    msgpack_pack_map(&m.pk, 1); /* 10: map without block_hashes */
    mp_str(&m, "type");
    mp_str(&m, "BlockStored");
    msgpack_pack_array(&m.pk, 4); /* 11: token id beyond 32 bits */
    mp_str(&m, "BlockStored");
    msgpack_pack_array(&m.pk, 0);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_uint64(&m.pk, 1ULL << 32);
    msgpack_pack_array(&m.pk, 3); /* 12: invalid UTF-8 medium */
    mp_str(&m, "BlockRemoved");
    msgpack_pack_array(&m.pk, 0);
    msgpack_pack_str(&m.pk, 2);
    msgpack_pack_str_body(&m.pk, "\xed\xa0", 2);
    msgpack_pack_array(&m.pk, 1); /* 13: BlockStored without hashes */
    mp_str(&m, "BlockStored");
    msgpack_pack_array(&m.pk, 1); /* 14: the good one */
    mp_str(&m, "AllBlocksCleared");
    msgpack_pack_int(&m.pk, 0);
    ck_assert_int_eq(decode_mp(&m, &b), 0);
    ck_assert_int_eq(b.n_events, 15);
    for (int i = 0; i < 14; i++) {
        ck_assert_msg(b.events[i].type == KVB_EV_MALFORMED, "event %d type %d", i,
                      b.events[i].type);
        ck_assert(b.events[i].error != NULL);
    }
    ck_assert_str_eq(b.events[3].error, "type tag is not valid UTF-8");
    ck_assert_str_eq(b.events[11].error, "token id exceeds 32 bits");
    ck_assert_int_eq(b.events[14].type, KVB_EV_CLEARED);
    mp_free(&m);
}
END_TEST

START_TEST(limits_enforced)
{
    struct kvb_decode_limits lim = {
        .max_events = 2, .max_hashes = 2, .max_tokens = 4, .max_depth = 8};
    struct kvb_decoder *small = kvb_decoder_create(&lim);
    struct mp m;
    struct kvb_batch b;
    mp_init(&m);
    pack_batch_head(&m, 3);
    for (int i = 0; i < 3; i++) {
        msgpack_pack_array(&m.pk, 1);
        mp_str(&m, "AllBlocksCleared");
    }
    msgpack_pack_int(&m.pk, 0);
    ck_assert_int_eq(kvb_decode_batch(small, mp_data(&m), m.sb.size, &b), KVB_DEC_TOO_LARGE);
    mp_free(&m);

    mp_init(&m);
    pack_batch_head(&m, 2);
    msgpack_pack_array(&m.pk, 2);
    mp_str(&m, "BlockRemoved");
    msgpack_pack_array(&m.pk, 3);
    for (int i = 0; i < 3; i++)
        msgpack_pack_int(&m.pk, i);
    pack_stored_positional(&m, 6); /* 32 tokens > 4 */
    msgpack_pack_int(&m.pk, 0);
    ck_assert_int_eq(kvb_decode_batch(small, mp_data(&m), m.sb.size, &b), 0);
    ck_assert_str_eq(b.events[0].error, "too many block hashes");
    ck_assert_str_eq(b.events[1].error, "too many token ids");
    mp_free(&m);
    kvb_decoder_destroy(&small);
    kvb_decoder_destroy(&small); /* NULL-safe */
}
END_TEST

START_TEST(arena_reused_across_batches)
{
    size_t len;
    uint8_t *p = read_all("tests/data/vllm-main/000003.msgpack", &len);
    struct kvb_batch b;
    for (int i = 0; i < 1000; i++)
        ck_assert_int_eq(kvb_decode_batch(dec, p, len, &b), 0);
    ck_assert_int_eq(b.n_events, 2);
    free(p);
}
END_TEST

START_TEST(utf8_validation)
{
    ck_assert(kvb_utf8_valid("", 0));
    ck_assert(kvb_utf8_valid("plain", 5));
    ck_assert(kvb_utf8_valid("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9));
    ck_assert(!kvb_utf8_valid("\xc3", 1));             /* cut */
    ck_assert(!kvb_utf8_valid("\xc0\xaf", 2));         /* overlong */
    ck_assert(!kvb_utf8_valid("\xed\xa0\x80", 3));     /* surrogate */
    ck_assert(!kvb_utf8_valid("\xf4\x90\x80\x80", 4)); /* > U+10FFFF */
    ck_assert(!kvb_utf8_valid("\xff", 1));
    ck_assert(!kvb_utf8_valid("\x80", 1));
}
END_TEST

/* vLLM extra_keys: per-block string items (bare, or [id, offset]) are kept,
 * everything else skipped; "cache_salt" as a map key; EAGLE pairs that mix
 * with plain ids or are not [a, b] make the event malformed (Dynamo's
 * KvTokenIds accepts only all-ids or all-pairs). */
START_TEST(extra_keys_cache_salt_and_pair_shapes)
{
    struct mp m;
    struct kvb_batch b;
    mp_init(&m);
    pack_batch_head(&m, 4);
    /* 1: map event, extra_keys [["adapter-a", ["img", 3], b"emb", 7, ["x", "y"]], nil, []] */
    msgpack_pack_map(&m.pk, 6);
    mp_str(&m, "type");
    mp_str(&m, "BlockStored");
    mp_str(&m, "block_hashes");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_int(&m.pk, 5);
    mp_str(&m, "token_ids");
    msgpack_pack_array(&m.pk, 0);
    mp_str(&m, "block_size");
    msgpack_pack_int(&m.pk, 16);
    mp_str(&m, "cache_salt");
    mp_str(&m, "tenant-a");
    mp_str(&m, "extra_keys");
    msgpack_pack_array(&m.pk, 3);
    msgpack_pack_array(&m.pk, 5);
    mp_str(&m, "adapter-a");
    msgpack_pack_array(&m.pk, 2);
    mp_str(&m, "img");
    msgpack_pack_int(&m.pk, -3);
    msgpack_pack_bin(&m.pk, 3);
    msgpack_pack_bin_body(&m.pk, "emb", 3);
    msgpack_pack_int(&m.pk, 7);
    msgpack_pack_array(&m.pk, 2);
    mp_str(&m, "x");
    mp_str(&m, "y");
    msgpack_pack_nil(&m.pk);
    msgpack_pack_array(&m.pk, 0);
    /* 2: positional, extra_keys with no string item at all */
    msgpack_pack_array(&m.pk, 9);
    mp_str(&m, "BlockStored");
    msgpack_pack_array(&m.pk, 0);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_array(&m.pk, 0);
    msgpack_pack_int(&m.pk, 16);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_int(&m.pk, 1);
    /* 3: pairs mixed with a plain id */
    msgpack_pack_array(&m.pk, 5);
    mp_str(&m, "BlockStored");
    msgpack_pack_array(&m.pk, 0);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_array(&m.pk, 2);
    msgpack_pack_array(&m.pk, 2);
    msgpack_pack_int(&m.pk, 1);
    msgpack_pack_int(&m.pk, 2);
    msgpack_pack_int(&m.pk, 3);
    msgpack_pack_int(&m.pk, 16);
    /* 4: a triple instead of a pair */
    msgpack_pack_array(&m.pk, 5);
    mp_str(&m, "BlockStored");
    msgpack_pack_array(&m.pk, 0);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_array(&m.pk, 3);
    msgpack_pack_int(&m.pk, 1);
    msgpack_pack_int(&m.pk, 2);
    msgpack_pack_int(&m.pk, 3);
    msgpack_pack_int(&m.pk, 16);
    msgpack_pack_nil(&m.pk); /* the batch's dp_rank */
    ck_assert_int_eq(decode_mp(&m, &b), 0);

    const struct kvb_event *e = &b.events[0];
    ck_assert_int_eq(e->type, KVB_EV_STORED);
    ck_assert_int_eq(e->cache_salt.len, 8);
    ck_assert(memcmp(e->cache_salt.ptr, "tenant-a", 8) == 0);
    ck_assert_int_eq(e->n_xkey_blocks, 3);
    ck_assert_uint_eq(e->xkey_off[0], 0);
    ck_assert_uint_eq(e->xkey_off[1], 2);
    ck_assert_uint_eq(e->xkey_off[2], 2);
    ck_assert_uint_eq(e->xkey_off[3], 2);
    ck_assert(!e->xkeys[0].with_offset);
    ck_assert(e->xkeys[0].s.len == 9 && memcmp(e->xkeys[0].s.ptr, "adapter-a", 9) == 0);
    ck_assert(e->xkeys[1].with_offset);
    ck_assert(e->xkeys[1].s.len == 3 && memcmp(e->xkeys[1].s.ptr, "img", 3) == 0);

    ck_assert_int_eq(b.events[1].type, KVB_EV_STORED);
    ck_assert_int_eq(b.events[1].n_xkey_blocks, 0);
    ck_assert(b.events[1].xkeys == NULL);
    ck_assert_int_eq(b.events[2].type, KVB_EV_MALFORMED);
    ck_assert_int_eq(b.events[3].type, KVB_EV_MALFORMED);
    mp_free(&m);
}
END_TEST

static Suite *decode_suite(void)
{
    Suite *s = suite_create("decode");
    TCase *tc = tcase_create("decode");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, envelope_two_elements);
    tcase_add_test(tc, envelope_three_elements);
    tcase_add_test(tc, envelope_map_and_extras);
    tcase_add_test(tc, stored_positional_every_length);
    tcase_add_test(tc, removed_and_cleared_positional);
    tcase_add_test(tc, stored_map_any_order_unknown_keys_map16);
    tcase_add_test(tc, map_capture_and_sglang_capture);
    tcase_add_test(tc, sglang_metadata_map_at_index_7);
    tcase_add_test(tc, every_int_width);
    tcase_add_test(tc, bin_hashes_32_and_16);
    tcase_add_test(tc, token_pairs_and_strings);
    tcase_add_test(tc, extra_keys_cache_salt_and_pair_shapes);
    tcase_add_test(tc, unknown_type_keeps_rest);
    tcase_add_test(tc, tier_cleared_forms);
    tcase_add_test(tc, truncated_at_every_offset);
    tcase_add_test(tc, huge_declared_lengths);
    tcase_add_test(tc, deep_nesting);
    tcase_add_test(tc, bad_bytes_and_envelopes);
    tcase_add_test(tc, malformed_events_are_skipped);
    tcase_add_test(tc, limits_enforced);
    tcase_add_test(tc, arena_reused_across_batches);
    tcase_add_test(tc, utf8_validation);
    tcase_add_test(tc, locality_ownership_ignored);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(decode_suite()); }
