/* libFuzzer target: the frame and sequence layer.  A sequence of (seq,
 * payload) pairs goes through the daemon's sequence rules (kvb_replay_live()
 * of a kvb_replay without a replay endpoint, as source.c feeds it) and the
 * pipeline on one small stream.
 *
 * Input:
 *   byte 0      configuration: bits 0-1 block size (auto, 1, 16, 4), bit 2
 *               lora_salt, bit 3 every tier forwarded (else device only),
 *               bit 4 small limits (else the defaults)
 *   byte 1      the stream's configured dp_rank (mod 4)
 *   records     code (1 byte, int8), then:
 *                 -128: 8 bytes big-endian absolute seq, then as below
 *                  127: reconfigure: 1 byte configuration as byte 0, no payload
 *                  126: the next record is rejected: its payload, padded
 *                       with zeros to 65537 bytes, is above the rules'
 *                       max_payload_bytes (65536, which no other record
 *                       reaches)
 *                 else: seq = previous seq + 1 + code (wrapping)
 *               then length (2 bytes little-endian, cut to what is left) and
 *               that many payload bytes
 *   (tests/fuzz/mkseeds.sh builds seeds from the captures in tests/data/;
 *   kvsim --frames and kvbridge-inspect --frames read the same format.)
 *
 * Invariants, checked in the emit callback and after every call:
 *   - each router event's JSON is exactly its kvb_rev (fuzz_common.h);
 *   - event_id per dp_rank starts at 0 with "cleared" and goes up by 1;
 *   - the last seq again with the same bytes as the last batch applied (not
 *     rejected) is a duplicate: dropped, nothing published;
 *   - else a seq that is not last+1 (gap, or back: a restart) is answered
 *     first by one "cleared" per dp_rank the stream had seen (or its
 *     configured rank);
 *   - a payload that does not decode, or is rejected, publishes exactly one
 *     "cleared" per dp_rank of the stream and nothing else;
 *   - a payload that decodes publishes only for its dp_rank, starting with a
 *     "cleared" when that rank is new to the stream; a 65th rank publishes
 *     nothing (its pair never published);
 *   - but no "cleared" where the pair's last router event already was one
 *     (the router holds nothing of it: kvbridge_barriers_redundant_total);
 *   - the return value is the number of router events emitted, and the
 *     stream's last seq is the seq just applied.
 */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "config.h"
#include "decode.h"
#include "fuzz_common.h"
#include "log.h"
#include "pipeline.h"
#include "replay.h"

#define WORKER 11
#define MAX_RECORDS 512
#define MAX_PAYLOAD 65536
#define OVERSIZE (MAX_PAYLOAD + 1)
#define MAX_CALL_EVENTS (KVB_MAX_STREAM_RANKS * 2 + 65536 + 8)

struct emitted {
    uint8_t type;
    bool scoped; /* a "cleared" of one tier: the pair's other tiers stay */
    uint32_t rank;
};

#define MAX_PAIRS (MAX_RECORDS + 8)

struct ctx {
    struct id_track ids;
    /* the model of each pair's state (convert.h): KVB_PAIR_NONE, _CLEAN, _DIRTY */
    uint32_t pair_rank[MAX_PAIRS];
    uint8_t pair_state[MAX_PAIRS];
    size_t n_pairs;
    struct emitted *ev; /* this call's events */
    size_t n_ev;
};

static int on_emit(void *vctx, const struct kvb_publish_msg *msg)
{
    struct ctx *c = vctx;
    const struct kvb_rev *rev = msg->rev;
    check_emitted(&c->ids, rev, msg->data, msg->len, WORKER);
    FUZZ_CHECK(c->n_ev < MAX_CALL_EVENTS, "too many router events for one batch");
    c->ev[c->n_ev++] = (struct emitted){rev->type, rev->scoped, rev->dp_rank};
    return 0;
}

static struct kvb_pipeline_cfg make_cfg(uint8_t b)
{
    static const uint32_t bs[4] = {0, 1, 16, 4};
    struct kvb_pipeline_cfg cfg = {
        .convert = {.worker_id = WORKER,
                    .block_size = bs[b & 3],
                    .lora_salt = (b & 4) != 0,
                    .forward_tiers = (b & 8) ? (1u << KVB_TIER__COUNT) - 1 : 1u << KVB_TIER_DEVICE},
        .limits = KVB_DECODE_LIMITS_DEFAULT,
    };
    if (b & 16)
        cfg.limits = (struct kvb_decode_limits){
            .max_events = 4, .max_hashes = 6, .max_tokens = 64, .max_depth = 6};
    return cfg;
}

static uint8_t *pair_state(struct ctx *c, uint32_t rank)
{
    for (size_t i = 0; i < c->n_pairs; i++)
        if (c->pair_rank[i] == rank)
            return &c->pair_state[i];
    FUZZ_CHECK(c->n_pairs < MAX_PAIRS, "too many pairs");
    c->pair_rank[c->n_pairs] = rank;
    c->pair_state[c->n_pairs] = KVB_PAIR_NONE;
    return &c->pair_state[c->n_pairs++];
}

/* Check events ev[*k..] start with one "cleared" per rank of ranks[0..n)
 * whose pair does not already end with one. */
static void expect_barrier(struct ctx *c, size_t *k, const uint32_t *ranks, uint32_t n,
                           const char *why)
{
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *ps = pair_state(c, ranks[i]);
        if (*ps == KVB_PAIR_CLEAN)
            continue; /* redundant: not published */
        *ps = KVB_PAIR_CLEAN;
        FUZZ_CHECK(*k < c->n_ev, "%s: barrier missing for rank %u", why, ranks[i]);
        FUZZ_CHECK(c->ev[*k].type == KVB_REVT_CLEARED && c->ev[*k].rank == ranks[i],
                   "%s: event %zu is type %u rank %u, want cleared for rank %u", why, *k,
                   c->ev[*k].type, c->ev[*k].rank, ranks[i]);
        (*k)++;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool quiet;
    if (!quiet) {
        kvb_log_set_level(KVB_LOG_ERROR - 1);
        quiet = true;
    }
    if (size < 2)
        return 0;
    struct kvb_pipeline_cfg cfg = make_cfg(data[0]);
    uint32_t cfg_rank = data[1] % 4;
    size_t off = 2;

    struct kvb_metrics m;
    memset(&m, 0, sizeof(m));
    static struct emitted evbuf[MAX_CALL_EVENTS];
    static struct ctx c;
    memset(&c, 0, sizeof(c));
    c.ev = evbuf;
    struct kvb_pipeline *p = NULL;
    struct kvb_publish *pub = NULL;
    fuzz_pipeline(&cfg, &m, on_emit, &c, &pub, &p);
    struct kvb_replay_cfg rcfg = {.name = "fuzz", .endpoint = "", .max_payload_bytes = MAX_PAYLOAD};
    struct kvb_seq_ops ops = kvb_pipeline_seq_ops(p);
    struct kvb_replay *rules = NULL;
    FUZZ_CHECK(kvb_replay_create(&rcfg, &m, &ops, NULL, &rules) == 0, "replay_create");
    /* an independent decoder, to know what the pipeline's will say */
    struct kvb_decoder *ref = kvb_decoder_create(&cfg.limits);
    FUZZ_CHECK(ref != NULL, "decoder_create");

    struct kvb_stream s;
    kvb_stream_init(&s, "fuzz", cfg_rank);
    uint64_t prev = 0;
    /* the last batch applied, unless it was rejected: what a duplicate repeats */
    static uint8_t last[MAX_PAYLOAD];
    size_t last_len = 0;
    bool has_last = false;

    for (int rec = 0; rec < MAX_RECORDS && off < size; rec++) {
        int8_t code = (int8_t)data[off++];
        bool reject = false;
        if (code == 126) {
            if (off >= size)
                break;
            reject = true;
            code = (int8_t)data[off++];
        }
        uint64_t seq;
        if (code == 127) {
            if (off >= size)
                break;
            cfg = make_cfg(data[off++]);
            FUZZ_CHECK(kvb_pipeline_reconfigure(p, &cfg) == 0, "reconfigure");
            kvb_decoder_destroy(&ref);
            ref = kvb_decoder_create(&cfg.limits);
            FUZZ_CHECK(ref != NULL, "decoder_create");
            continue;
        }
        if (code == -128) {
            if (size - off < 8)
                break;
            seq = 0;
            for (int i = 0; i < 8; i++)
                seq = seq << 8 | data[off++];
        } else {
            seq = prev + 1 + (uint64_t)(int64_t)code;
        }
        size_t len = 0;
        if (size - off >= 2) {
            len = (size_t)data[off] | (size_t)data[off + 1] << 8;
            off += 2;
        } else {
            off = size;
        }
        if (len > size - off)
            len = size - off;
        /* the payload in its own exact-size buffer, so that ASan sees any
         * read past its end; a rejected one padded above the limit */
        size_t plen = reject ? OVERSIZE : len;
        uint8_t *payload = calloc(1, plen ? plen : 1);
        FUZZ_CHECK(payload != NULL, "malloc");
        memcpy(payload, data + off, len);
        off += len;

        /* what the pipeline must do */
        int verdict = kvb_seq_classify(&s, seq);
        uint32_t old_ranks[KVB_MAX_STREAM_RANKS], old_n = s.n_ranks;
        memcpy(old_ranks, s.ranks, sizeof(old_ranks));
        struct kvb_batch b;
        bool decodes = !reject && kvb_decode_batch(ref, payload, len, &b) == 0;
        uint32_t rank = decodes && b.dp_rank.has ? (uint32_t)b.dp_rank.v : cfg_rank;
        bool known = false;
        for (uint32_t i = 0; i < old_n; i++)
            known |= old_ranks[i] == rank;

        bool dup = verdict == KVB_SEQ_BACK && seq == s.last && !reject && has_last &&
                   len == last_len && memcmp(payload, last, len) == 0;

        c.n_ev = 0;
        int rc = kvb_replay_live(rules, &s, seq, payload, plen, 0);
        FUZZ_CHECK(rc >= 0, "kvb_replay_live rc %d", rc);
        FUZZ_CHECK((size_t)rc == c.n_ev, "returned %d, emitted %zu", rc, c.n_ev);
        FUZZ_CHECK(s.has_last && s.last == seq, "stream last %llu, want %llu",
                   (unsigned long long)s.last, (unsigned long long)seq);
        FUZZ_CHECK(s.n_ranks >= 1 && s.n_ranks <= KVB_MAX_STREAM_RANKS, "n_ranks %u", s.n_ranks);
        if (dup) {
            FUZZ_CHECK(c.n_ev == 0, "duplicate of seq %llu: %zu events", (unsigned long long)seq,
                       c.n_ev);
            free(payload);
            prev = seq;
            continue;
        }
        has_last = !reject;
        last_len = len;
        memcpy(last, payload, reject ? 0 : len);

        size_t k = 0;
        if (verdict == KVB_SEQ_GAP || verdict == KVB_SEQ_BACK) {
            /* a stream with a last seq has applied a batch: it has a rank */
            FUZZ_CHECK(old_n >= 1, "stream with a last seq but no rank");
            expect_barrier(&c, &k, old_ranks, old_n, verdict == KVB_SEQ_GAP ? "gap" : "restart");
        } else {
            FUZZ_CHECK(verdict == KVB_SEQ_FIRST || verdict == KVB_SEQ_NEXT, "verdict %d", verdict);
        }
        if (!decodes) {
            /* the malformed barrier, for every rank of the stream */
            expect_barrier(&c, &k, s.ranks, s.n_ranks, "malformed batch");
            FUZZ_CHECK(k == c.n_ev, "malformed batch: %zu events after the barrier", c.n_ev - k);
        } else if (!known && old_n == KVB_MAX_STREAM_RANKS) {
            /* dropped; a barrier for that rank alone, were its pair dirty */
            FUZZ_CHECK(!kvb_stream_has_rank(&s, rank), "65th rank %u accepted", rank);
            if (*pair_state(&c, rank) != KVB_PAIR_NONE)
                expect_barrier(&c, &k, &rank, 1, "65th rank");
            FUZZ_CHECK(k == c.n_ev, "65th rank: %zu events", c.n_ev - k);
        } else {
            FUZZ_CHECK(kvb_stream_has_rank(&s, rank), "rank %u not remembered", rank);
            if (!known)
                expect_barrier(&c, &k, &rank, 1, "start");
            for (; k < c.n_ev; k++) {
                FUZZ_CHECK(c.ev[k].rank == rank, "event for rank %u in a batch of rank %u",
                           c.ev[k].rank, rank);
                *pair_state(&c, rank) = c.ev[k].type == KVB_REVT_CLEARED && !c.ev[k].scoped
                                            ? KVB_PAIR_CLEAN
                                            : KVB_PAIR_DIRTY;
            }
        }
        free(payload);
        prev = seq;
    }
    kvb_decoder_destroy(&ref);
    kvb_replay_destroy(&rules);
    kvb_pipeline_destroy(&p);
    kvb_publish_destroy(&pub);
    return 0;
}
