/* pipeline + seq: the real captures against expected.jsonl, and the
 * sequence / barrier rules of docs/router-events.md section 6. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define W 7587890738027725506ULL

static struct kvb_metrics m;
static struct sink_lines out;
static struct kvb_pipeline *p;
static struct kvb_publish *pub;
static struct kvb_replay *rules; /* the daemon's, without a replay endpoint */

static void open_with(uint64_t max_tracked)
{
    memset(&m, 0, sizeof(m));
    memset(&out, 0, sizeof(out));
    struct kvb_pipeline_cfg c = test_pcfg(W, 16);
    c.convert.max_tracked = max_tracked;
    test_pipeline_create(&c, &m, &out, &pub, &p);
    rules = test_rules(p, &m, 0);
}
/* the sequence cases store one block again and again: no copies tracked */
static void setup(void) { open_with(0); }
/* the captures with the daemon's default tracking: Dynamo's rules in full
 * (copies, namespaces) leave their expected output as it was */
static void setup_tracked(void) { open_with(1048576); }

static void teardown(void)
{
    kvb_replay_destroy(&rules);
    test_pipeline_destroy(&pub, &p);
    free(out.text);
}

static int feed(struct kvb_stream *s, uint64_t seq, const uint8_t *data, size_t len)
{
    return kvb_replay_live(rules, s, seq, data, len, 0);
}

/* ---- goldens ------------------------------------------------------------ */

static const char *captures[] = {
    "sglang",       "vllm-main",  "vllm-v0.10.2-bytes", "vllm-v0.22.0-lora",
    "vllm-v0.24.0", "vllm-v0.9.0"};

START_TEST(captures_match_expected)
{
    const char *cap = captures[_i];
    char path[256];
    size_t len;
    snprintf(path, sizeof(path), "tests/data/%s/index.json", cap);
    char *index = (char *)read_all(path, &len);
    struct kvb_stream s;
    kvb_stream_init(&s, cap, 0);
    unsigned n = 0;
    /* index.json lists {seq, file}; the captures are seq 0.. in file order */
    for (const char *q = index; (q = strstr(q, "\"seq\":")); q++) {
        unsigned long long seq = strtoull(q + 6, NULL, 10);
        ck_assert_uint_eq(seq, n);
        snprintf(path, sizeof(path), "tests/data/%s/%06u.msgpack", cap, n);
        uint8_t *payload = read_all(path, &len);
        ck_assert_int_ge(feed(&s, seq, payload, len), 0);
        free(payload);
        n++;
    }
    ck_assert_uint_eq(n, 12);
    snprintf(path, sizeof(path), "tests/data/%s/expected.jsonl", cap);
    char *want = (char *)read_all(path, &len);
    ck_assert_uint_eq(out.len, len);
    ck_assert_msg(memcmp(out.text, want, len) == 0, "%s differs from expected.jsonl", cap);
    ck_assert_uint_eq(kvb_get(&m.barriers_total[KVB_BAR_START]), 1);
    free(want);
    free(index);
}
END_TEST

/* ---- sequence rules ----------------------------------------------------- */

/* A batch [ts, [event...], rank] with `n` AllBlocksCleared-free store events
 * (one block each), rank < 0 meaning "no rank element". */
static void batch(struct mp *mb, int n_stores, int rank)
{
    mp_init(mb);
    msgpack_pack_array(&mb->pk, rank < 0 ? 2 : 3);
    msgpack_pack_double(&mb->pk, 1.0);
    msgpack_pack_array(&mb->pk, (uint32_t)n_stores);
    for (int i = 0; i < n_stores; i++) {
        msgpack_pack_array(&mb->pk, 6);
        mp_str(mb, "BlockStored");
        msgpack_pack_array(&mb->pk, 1);
        msgpack_pack_uint64(&mb->pk, 1000 + (uint64_t)i);
        msgpack_pack_nil(&mb->pk);
        msgpack_pack_array(&mb->pk, 16);
        for (int t = 0; t < 16; t++)
            msgpack_pack_int(&mb->pk, t);
        msgpack_pack_int(&mb->pk, 16);
        msgpack_pack_nil(&mb->pk);
    }
    if (rank >= 0)
        msgpack_pack_int(&mb->pk, rank);
}

static int live(struct kvb_stream *s, uint64_t seq, int n_stores, int rank)
{
    struct mp mb;
    batch(&mb, n_stores, rank);
    int rc = feed(s, seq, mp_data(&mb), mb.sb.size);
    mp_free(&mb);
    return rc;
}

/* Lines emitted so far, the i-th (0-based). */
static const char *line(unsigned i)
{
    const char *q = out.text;
    while (i-- && q)
        q = strchr(q, '\n') + 1;
    return q;
}

static bool line_is(unsigned i, const char *prefix_after_worker)
{
    char want[256];
    snprintf(want, sizeof(want), "{\"worker_id\":%llu,\"event\":%s", (unsigned long long)W,
             prefix_after_worker);
    return strncmp(line(i), want, strlen(want)) == 0;
}

START_TEST(start_barrier_once_per_rank)
{
    struct kvb_stream s;
    kvb_stream_init(&s, "t", 2);
    /* first seq is a nanosecond clock, not 0 */
    ck_assert_int_eq(live(&s, 1764500000000000000ULL, 1, -1), 2);
    ck_assert(line_is(0, "{\"event_id\":0,\"data\":\"cleared\",\"dp_rank\":2}"));
    ck_assert(line_is(1, "{\"event_id\":1,\"data\":{\"stored\""));
    ck_assert_int_eq(live(&s, 1764500000000000001ULL, 1, -1), 1);
    /* a batch carrying rank 5: start barrier for rank 5, own counter */
    ck_assert_int_eq(live(&s, 1764500000000000002ULL, 1, 5), 2);
    ck_assert(line_is(3, "{\"event_id\":0,\"data\":\"cleared\",\"dp_rank\":5}"));
    ck_assert(line_is(4, "{\"event_id\":1,\"data\":{\"stored\""));
    ck_assert_uint_eq(kvb_get(&m.barriers_total[KVB_BAR_START]), 2);
    ck_assert_uint_eq(s.n_ranks, 2);
}
END_TEST

START_TEST(gap_publishes_barrier_for_every_rank)
{
    struct kvb_stream s;
    kvb_stream_init(&s, "t", 0);
    ck_assert_int_eq(live(&s, 10, 1, 0), 2);
    ck_assert_int_eq(live(&s, 11, 1, 1), 2);
    ck_assert_int_eq(kvb_seq_classify(&s, 14), KVB_SEQ_GAP);
    ck_assert_uint_eq(kvb_seq_missing(&s, 14), 2);
    /* 12, 13 lost: cleared for ranks 0 and 1, then the batch */
    ck_assert_int_eq(live(&s, 14, 1, 0), 3);
    ck_assert(line_is(4, "{\"event_id\":2,\"data\":\"cleared\",\"dp_rank\":0}"));
    ck_assert(line_is(5, "{\"event_id\":2,\"data\":\"cleared\",\"dp_rank\":1}"));
    ck_assert(line_is(6, "{\"event_id\":3,\"data\":{\"stored\""));
    ck_assert_uint_eq(kvb_get(&m.seq_gaps_total[0]), 1);
    ck_assert_uint_eq(kvb_get(&m.barriers_total[KVB_BAR_GAP]), 2);
    ck_assert_uint_eq(s.last, 14);
}
END_TEST

START_TEST(seq_back_is_a_restart)
{
    struct kvb_stream s;
    kvb_stream_init(&s, "t", 0);
    ck_assert_int_eq(live(&s, 0, 1, 0), 2);
    ck_assert_int_eq(live(&s, 1, 1, 0), 1);
    ck_assert_int_eq(kvb_seq_classify(&s, 1), KVB_SEQ_BACK); /* duplicate */
    ck_assert_int_eq(kvb_seq_classify(&s, 0), KVB_SEQ_BACK);
    ck_assert_int_eq(live(&s, 0, 1, 0), 2); /* restarted engine */
    ck_assert(line_is(3, "{\"event_id\":3,\"data\":\"cleared\",\"dp_rank\":0}"));
    ck_assert_uint_eq(kvb_get(&m.engine_restarts_total[0]), 1);
    ck_assert_uint_eq(kvb_get(&m.barriers_total[KVB_BAR_RESTART]), 1);
    ck_assert_int_eq(live(&s, 1, 1, 0), 1);
}
END_TEST

START_TEST(malformed_batch_is_a_lost_batch)
{
    struct kvb_stream s;
    kvb_stream_init(&s, "t", 3);
    /* first batch malformed: barrier for the configured rank */
    static const uint8_t junk[] = {0xc1, 0x00};
    ck_assert_int_eq(feed(&s, 7, junk, sizeof(junk)), 1);
    ck_assert(line_is(0, "{\"event_id\":0,\"data\":\"cleared\",\"dp_rank\":3}"));
    ck_assert_uint_eq(s.last, 7);
    /* next one good: no second start barrier, no gap */
    ck_assert_int_eq(live(&s, 8, 1, -1), 1);
    ck_assert(line_is(1, "{\"event_id\":1,\"data\":{\"stored\""));
    /* another malformed one mid-stream */
    static const uint8_t wrong_envelope[] = {0x92, 0x00, 0x80};
    ck_assert_int_eq(feed(&s, 9, wrong_envelope, sizeof(wrong_envelope)), 1);
    ck_assert(line_is(2, "{\"event_id\":2,\"data\":\"cleared\",\"dp_rank\":3}"));
    ck_assert_int_eq(live(&s, 10, 1, -1), 1);
    ck_assert_uint_eq(kvb_get(&m.malformed_messages_total[KVB_MAL_BATCH]), 2);
    ck_assert_uint_eq(kvb_get(&m.barriers_total[KVB_BAR_MALFORMED]), 2);
    ck_assert_uint_eq(kvb_get(&m.seq_gaps_total[0]), 0);
}
END_TEST

START_TEST(heartbeats_move_last_only)
{
    struct kvb_stream s;
    kvb_stream_init(&s, "t", 0);
    ck_assert_int_eq(live(&s, 0, 1, 0), 2);
    for (uint64_t q = 1; q < 100; q++)
        ck_assert_int_eq(live(&s, q, 0, 0), 0);
    ck_assert_uint_eq(s.last, 99);
    ck_assert_int_eq(live(&s, 100, 1, 0), 1);
    ck_assert_uint_eq(out.n, 3);
}
END_TEST

START_TEST(seq_wraps_at_u64_max)
{
    struct kvb_stream s;
    kvb_stream_init(&s, "t", 0);
    ck_assert_int_eq(live(&s, UINT64_MAX, 1, 0), 2);
    ck_assert_int_eq(kvb_seq_classify(&s, 0), KVB_SEQ_NEXT);
    ck_assert_int_eq(live(&s, 0, 1, 0), 1);
}
END_TEST

START_TEST(too_many_ranks_on_a_stream)
{
    struct kvb_stream s;
    kvb_stream_init(&s, "t", 0);
    for (int r = 0; r < KVB_MAX_STREAM_RANKS; r++)
        ck_assert_int_eq(live(&s, (uint64_t)r, 1, r), 2);
    /* one rank more: dropped and counted as malformed; never a barrier on
     * all 64 (under dp_rank churn that would be 3.36M barriers of 56k batches),
     * and none at all for a pair that never published */
    uint64_t bars = kvb_get(&m.barriers_total[KVB_BAR_MALFORMED]);
    for (int k = 0; k < 1000; k++)
        ck_assert_int_eq(live(&s, KVB_MAX_STREAM_RANKS + (uint64_t)k, 1, 1000 + k), 0);
    ck_assert_uint_eq(kvb_get(&m.malformed_messages_total[KVB_MAL_BATCH]), 1000);
    ck_assert_uint_eq(kvb_get(&m.barriers_total[KVB_BAR_MALFORMED]), bars);
    /* a 65th rank that another stream publishes for: a barrier for it alone */
    struct kvb_stream s2;
    kvb_stream_init(&s2, "t2", 0);
    ck_assert_int_eq(live(&s2, 0, 1, 5000), 2);
    ck_assert_int_eq(live(&s, KVB_MAX_STREAM_RANKS + 1000, 1, 5000), 1);
    ck_assert_uint_eq(kvb_get(&m.barriers_total[KVB_BAR_MALFORMED]), bars + 1);
    ck_assert(strstr(line(out.n - 1), "\"cleared\",\"dp_rank\":5000}") != NULL);
}
END_TEST

/* A barrier for a pair that published nothing since its last "cleared" says
 * nothing new: not published, counted as redundant; nats_lost always is. */
START_TEST(redundant_barriers_not_published)
{
    struct kvb_stream s;
    kvb_stream_init(&s, "t", 0);
    for (int r = 0; r < 4; r++)
        ck_assert_int_eq(live(&s, (uint64_t)r, 1, r), 2);
    static const uint8_t junk[] = {0xc1, 0x00};
    /* the first bad batch: one barrier per rank; the next 99: none */
    ck_assert_int_eq(feed(&s, 4, junk, sizeof(junk)), 4);
    for (uint64_t q = 5; q < 104; q++)
        ck_assert_int_eq(feed(&s, q, junk, sizeof(junk)), 0);
    ck_assert_uint_eq(kvb_get(&m.barriers_total[KVB_BAR_MALFORMED]), 4);
    ck_assert_uint_eq(kvb_get(&m.barriers_redundant_total[0]), 99 * 4);
    ck_assert_uint_eq(kvb_get(&m.malformed_messages_total[KVB_MAL_BATCH]), 100);
    /* rank 2 publishes again: the next bad batch clears rank 2 only */
    ck_assert_int_eq(live(&s, 104, 1, 2), 1);
    ck_assert_int_eq(feed(&s, 105, junk, sizeof(junk)), 1);
    ck_assert(strstr(line(out.n - 1), "\"cleared\",\"dp_rank\":2}") != NULL);
    /* a gap right after: redundant too */
    ck_assert_int_eq(live(&s, 200, 0, 2), 0);
    ck_assert_uint_eq(kvb_get(&m.barriers_total[KVB_BAR_GAP]), 0);
    /* NATS lost something: every rank, whatever came before */
    ck_assert_int_eq(kvb_pipeline_barrier(p, &s, KVB_BAR_NATS_LOST), 4);
    ck_assert_int_eq(kvb_pipeline_barrier(p, &s, KVB_BAR_NATS_LOST), 4);
}
END_TEST

/* Filtered and malformed events inside batches never open a hole. */
START_TEST(event_ids_contiguous_through_filters)
{
    struct kvb_stream s;
    kvb_stream_init(&s, "t", 0);
    struct mp mb;
    mp_init(&mb);
    msgpack_pack_array(&mb.pk, 3);
    msgpack_pack_double(&mb.pk, 1.0);
    msgpack_pack_array(&mb.pk, 5);
    msgpack_pack_array(&mb.pk, 4); /* group 1: filtered */
    mp_str(&mb, "BlockRemoved");
    msgpack_pack_array(&mb.pk, 1);
    msgpack_pack_int(&mb.pk, 1);
    msgpack_pack_nil(&mb.pk);
    msgpack_pack_int(&mb.pk, 1);
    msgpack_pack_array(&mb.pk, 2); /* published */
    mp_str(&mb, "BlockRemoved");
    msgpack_pack_array(&mb.pk, 1);
    msgpack_pack_int(&mb.pk, 2);
    msgpack_pack_int(&mb.pk, 9);   /* malformed event */
    msgpack_pack_array(&mb.pk, 1); /* unknown type */
    mp_str(&mb, "Whatever");
    msgpack_pack_array(&mb.pk, 1); /* published */
    mp_str(&mb, "AllBlocksCleared");
    msgpack_pack_int(&mb.pk, 0);
    for (uint64_t q = 0; q < 3; q++)
        ck_assert_int_ge(feed(&s, q, mp_data(&mb), mb.sb.size), 2);
    mp_free(&mb);
    /* 1 start barrier + 3 x 2 events = ids 0..6 */
    ck_assert_uint_eq(out.n, 7);
    for (unsigned i = 0; i < out.n; i++) {
        char want[64];
        snprintf(want, sizeof(want), "\"event_id\":%u,", i);
        const char *l = line(i);
        const char *nl = strchr(l, '\n');
        ck_assert(memmem(l, (size_t)(nl - l), want, strlen(want)) != NULL);
    }
    ck_assert_uint_eq(kvb_get(&m.events_dropped_total[KVB_DROP_UNLEARNED_GROUP_IDX]), 3);
    ck_assert_uint_eq(kvb_get(&m.events_dropped_total[KVB_DROP_MALFORMED_EVENT]), 3);
    ck_assert_uint_eq(kvb_get(&m.events_dropped_total[KVB_DROP_UNKNOWN_EVENT_TYPE]), 3);
}
END_TEST

/* nats.coalesce: one positional BlockStored (vLLM) of hashes h[0..n). */
static void mp_store(struct mp *mb, const uint64_t *h, int n, long long parent)
{
    msgpack_pack_array(&mb->pk, 6);
    mp_str(mb, "BlockStored");
    msgpack_pack_array(&mb->pk, (uint32_t)n);
    for (int i = 0; i < n; i++)
        msgpack_pack_uint64(&mb->pk, h[i]);
    if (parent < 0)
        msgpack_pack_nil(&mb->pk);
    else
        msgpack_pack_uint64(&mb->pk, (uint64_t)parent);
    msgpack_pack_array(&mb->pk, (uint32_t)(16 * n));
    for (int t = 0; t < 16 * n; t++)
        msgpack_pack_int(&mb->pk, t);
    msgpack_pack_int(&mb->pk, 16);
    msgpack_pack_nil(&mb->pk);
}

static void mp_remove(struct mp *mb, uint64_t h)
{
    msgpack_pack_array(&mb->pk, 2);
    mp_str(mb, "BlockRemoved");
    msgpack_pack_array(&mb->pk, 1);
    msgpack_pack_uint64(&mb->pk, h);
}

/* nats.coalesce: a chained store joins the store before, removes join,
 * a store under another parent and a root store keep their own events;
 * ids have no holes and only what went out is counted as published. */
START_TEST(coalesce_merges_adjacent_events)
{
    test_pipeline_destroy(&pub, &p);
    kvb_replay_destroy(&rules);
    memset(&m, 0, sizeof(m));
    struct kvb_pipeline_cfg c = test_pcfg(W, 16);
    c.coalesce = true;
    test_pipeline_create(&c, &m, &out, &pub, &p);
    rules = test_rules(p, &m, 0);

    struct kvb_stream s;
    kvb_stream_init(&s, "t", 0);
    struct mp mb;
    mp_init(&mb);
    msgpack_pack_array(&mb.pk, 3);
    msgpack_pack_double(&mb.pk, 1.0);
    msgpack_pack_array(&mb.pk, 6);
    mp_store(&mb, (const uint64_t[]){1, 2}, 2, -1);
    mp_store(&mb, (const uint64_t[]){3}, 1, 2); /* under 2: joins */
    mp_remove(&mb, 10);
    mp_remove(&mb, 11);                          /* joins */
    mp_store(&mb, (const uint64_t[]){5}, 1, 99); /* another parent */
    mp_store(&mb, (const uint64_t[]){6}, 1, -1); /* a root store */
    msgpack_pack_nil(&mb.pk);
    ck_assert_int_ge(feed(&s, 0, mp_data(&mb), mb.sb.size), 1);
    ck_assert_int_ge(feed(&s, 1, mp_data(&mb), mb.sb.size), 1);
    mp_free(&mb);
    /* 1 start barrier + 2 x 4 events (not 2 x 6) = ids 0..8 */
    ck_assert_uint_eq(out.n, 9);
    for (unsigned i = 0; i < out.n; i++) {
        char want[64];
        snprintf(want, sizeof(want), "\"event_id\":%u,", i);
        const char *l = line(i);
        const char *nl = strchr(l, '\n');
        ck_assert_msg(memmem(l, (size_t)(nl - l), want, strlen(want)) != NULL, "%.*s",
                      (int)(nl - l), l);
    }
    ck_assert_ptr_nonnull(strstr(line(1), "\"block_hash\":3,"));
    ck_assert_ptr_nonnull(strstr(line(2), "[10,11]"));
    ck_assert_ptr_nonnull(strstr(line(4), "\"parent_hash\":null"));
    ck_assert_uint_eq(kvb_get(&m.router_events_published_total[KVB_REVT_STORED]), 6);
    ck_assert_uint_eq(kvb_get(&m.router_events_published_total[KVB_REVT_REMOVED]), 2);
}
END_TEST

/* TensorRT-LLM's lora_id without lora_name: the stream's worker names it
 * (sources[].lora_names) or the store goes out unsalted, counted, and its
 * id logged once. */
START_TEST(lora_ids_named_or_counted)
{
    static const struct kvb_lora_name_cfg names[] = {{7, "adapter-a"}};
    struct kvb_worker_cfg w = {.worker_id = W,
                               .block_size = 16,
                               .lora_salt = true,
                               .forward_tiers = 1u << KVB_TIER_DEVICE,
                               .lora_names = names,
                               .n_lora_names = 1};
    struct kvb_stream s;
    kvb_stream_init(&s, "t", 0);
    kvb_stream_set_worker(&s, &w);
    const int64_t ids[] = {7, 8, 8, -1};
    struct mp mb;
    mp_init(&mb);
    msgpack_pack_array(&mb.pk, 3);
    msgpack_pack_double(&mb.pk, 1.0);
    msgpack_pack_array(&mb.pk, 4);
    for (int i = 0; i < 4; i++) {
        msgpack_pack_array(&mb.pk, 8);
        mp_str(&mb, "BlockStored");
        msgpack_pack_array(&mb.pk, 1);
        msgpack_pack_uint64(&mb.pk, 1000 + (uint64_t)i);
        msgpack_pack_nil(&mb.pk);
        msgpack_pack_array(&mb.pk, 16);
        for (int t = 0; t < 16; t++)
            msgpack_pack_int(&mb.pk, t);
        msgpack_pack_int(&mb.pk, 16);
        if (ids[i] < 0)
            msgpack_pack_nil(&mb.pk); /* no LoRA */
        else
            msgpack_pack_int64(&mb.pk, ids[i]);
        mp_str(&mb, "GPU");
        msgpack_pack_nil(&mb.pk); /* lora_name */
    }
    msgpack_pack_int(&mb.pk, 0);
    ck_assert_int_eq(feed(&s, 0, mp_data(&mb), mb.sb.size), 5);
    ck_assert_int_eq(feed(&s, 1, mp_data(&mb), mb.sb.size), 4);
    uint32_t t16[16];
    for (int t = 0; t < 16; t++)
        t16[t] = (uint32_t)t;
    char salted[64], plain[64];
    snprintf(salted, sizeof(salted), "\"tokens_hash\":%llu",
             (unsigned long long)kvb_tokens_hash(t16, 16, kvb_lora_seed("adapter-a", 9)));
    snprintf(plain, sizeof(plain), "\"tokens_hash\":%llu",
             (unsigned long long)kvb_tokens_hash(t16, 16, KVB_TOKENS_HASH_SEED));
    ck_assert_uint_eq(out.n, 9); /* the start barrier, 2 x 4 stores */
    for (unsigned i = 1; i < out.n; i++) {
        const char *l = line(i), *nl = strchr(l, '\n');
        const char *want = (i - 1) % 4 == 0 ? salted : plain;
        ck_assert_msg(memmem(l, (size_t)(nl - l), want, strlen(want)) != NULL, "line %u: %.*s", i,
                      (int)(nl - l), l);
    }
    /* the unmapped id 8, twice a batch; the base-model store is no LoRA */
    ck_assert_uint_eq(kvb_get(&m.stores_unsalted_total[KVB_UNS_UNMAPPED_LORA_ID]), 4);
    /* lora_salt off: no store lacks a salt it should have */
    w.lora_salt = false;
    ck_assert_int_eq(feed(&s, 2, mp_data(&mb), mb.sb.size), 4);
    mp_free(&mb);
    ck_assert_uint_eq(kvb_get(&m.stores_unsalted_total[KVB_UNS_UNMAPPED_LORA_ID]), 4);
}
END_TEST

/* limits.max_tracked_blocks reached: the store goes out, then a "cleared"
 * (cause tracker_full) for every pair, and the tracker starts again. */
START_TEST(tracker_full_barrier)
{
    teardown();
    open_with(2);
    struct kvb_stream s;
    kvb_stream_init(&s, "t", 0);
    struct mp mb;
    mp_init(&mb);
    msgpack_pack_array(&mb.pk, 3);
    msgpack_pack_double(&mb.pk, 1.0);
    msgpack_pack_array(&mb.pk, 1);
    msgpack_pack_array(&mb.pk, 5);
    mp_str(&mb, "BlockStored");
    msgpack_pack_array(&mb.pk, 3);
    for (int i = 1; i <= 3; i++)
        msgpack_pack_int(&mb.pk, i);
    msgpack_pack_nil(&mb.pk);
    msgpack_pack_array(&mb.pk, 48);
    for (int i = 0; i < 48; i++)
        msgpack_pack_int(&mb.pk, i);
    msgpack_pack_int(&mb.pk, 16);
    msgpack_pack_int(&mb.pk, 0);
    /* start barrier, the store, the tracker_full barrier */
    ck_assert_int_eq(feed(&s, 0, mp_data(&mb), mb.sb.size), 3);
    mp_free(&mb);
    ck_assert(strstr(line(1), "\"stored\"") != NULL);
    ck_assert(strstr(line(2), "\"cleared\"") != NULL);
    ck_assert_uint_eq(kvb_get(&m.barriers_total[KVB_BAR_TRACKER_FULL]), 1);
    ck_assert_uint_eq(kvb_get(&m.tracker_overflows_total[0]), 1);
}
END_TEST

static Suite *pipeline_suite(void)
{
    Suite *s = suite_create("pipeline");
    TCase *tc = tcase_create("goldens");
    tcase_add_checked_fixture(tc, setup_tracked, teardown);
    tcase_add_loop_test(tc, captures_match_expected, 0,
                        (int)(sizeof(captures) / sizeof(captures[0])));
    suite_add_tcase(s, tc);
    tc = tcase_create("sequence");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, start_barrier_once_per_rank);
    tcase_add_test(tc, tracker_full_barrier);
    tcase_add_test(tc, gap_publishes_barrier_for_every_rank);
    tcase_add_test(tc, seq_back_is_a_restart);
    tcase_add_test(tc, malformed_batch_is_a_lost_batch);
    tcase_add_test(tc, heartbeats_move_last_only);
    tcase_add_test(tc, seq_wraps_at_u64_max);
    tcase_add_test(tc, too_many_ranks_on_a_stream);
    tcase_add_test(tc, redundant_barriers_not_published);
    tcase_add_test(tc, event_ids_contiguous_through_filters);
    tcase_add_test(tc, coalesce_merges_adjacent_events);
    tcase_add_test(tc, lora_ids_named_or_counted);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(pipeline_suite()); }
