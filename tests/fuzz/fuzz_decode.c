/* libFuzzer target: one engine payload through decode, convert and the JSON
 * encoder.  The whole input is the payload (seeds: every .msgpack capture
 * under tests/data/).
 *
 * Checked on every input:
 *   - the decoder alone: every string and bin view lies inside the payload,
 *     counts respect the limits, strings are valid UTF-8, and decoding the
 *     same payload again (arena reset) gives the same batch;
 *   - the pipeline behind the daemon's sequence rules (kvb_replay_live() on
 *     a fresh stream, no replay endpoint) under two configurations (auto
 *     block size with every tier forwarded, default limits; block size 16,
 *     device tier only, small limits): every router event's JSON is exactly
 *     its kvb_rev, the
 *     event_ids of each dp_rank start at 0 with "cleared" and go up by 1, the
 *     return value is the number of events emitted, and a payload that does
 *     not decode publishes only the malformed barrier.
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

struct ctx {
    struct id_track ids;
    uint64_t worker_id;
    unsigned emitted;
};

static int on_emit(void *vctx, const struct kvb_publish_msg *msg)
{
    struct ctx *c = vctx;
    check_emitted(&c->ids, msg->rev, msg->data, msg->len, c->worker_id);
    c->emitted++;
    return 0;
}

static bool inside(const uint8_t *data, size_t size, const void *p, size_t n)
{
    const uint8_t *q = p;
    return q >= data && q <= data + size && n <= (size_t)(data + size - q);
}

static void check_str(const uint8_t *data, size_t size, const struct kvb_str *s, const char *what)
{
    if (!s->ptr) {
        FUZZ_CHECK(s->len == 0, "%s: NULL with length %u", what, s->len);
        return;
    }
    if (s->len == 0)
        return; /* may point at a static "" */
    FUZZ_CHECK(inside(data, size, s->ptr, s->len), "%s: view outside the payload", what);
    FUZZ_CHECK(kvb_utf8_valid(s->ptr, s->len), "%s: not valid UTF-8", what);
}

static void check_hash(const uint8_t *data, size_t size, const struct kvb_hash *h)
{
    FUZZ_CHECK(h->kind <= KVB_HASH_BIN, "hash kind %u", h->kind);
    if (h->kind == KVB_HASH_BIN && h->bin_len)
        FUZZ_CHECK(inside(data, size, h->v.bin, h->bin_len), "bin hash outside the payload");
}

static void check_batch(const uint8_t *data, size_t size, const struct kvb_batch *b,
                        const struct kvb_decode_limits *lim)
{
    FUZZ_CHECK(b->n_events <= lim->max_events, "%u events > limit %u", b->n_events,
               lim->max_events);
    FUZZ_CHECK(b->n_events == 0 || b->events, "events NULL");
    /* every event takes at least one byte of the payload */
    FUZZ_CHECK(b->n_events <= size, "more events than bytes");
    for (uint32_t i = 0; i < b->n_events; i++) {
        const struct kvb_event *e = &b->events[i];
        FUZZ_CHECK(e->type <= KVB_EV_MALFORMED, "event type %u", e->type);
        check_str(data, size, &e->tag, "tag");
        if (e->type == KVB_EV_MALFORMED) {
            FUZZ_CHECK(e->error != NULL, "malformed event without an error");
            continue;
        }
        FUZZ_CHECK(e->n_hashes <= lim->max_hashes, "%u hashes > limit", e->n_hashes);
        FUZZ_CHECK(e->n_tokens <= lim->max_tokens, "%u tokens > limit", e->n_tokens);
        FUZZ_CHECK(e->n_hashes == 0 || e->hashes, "hashes NULL");
        FUZZ_CHECK(e->n_tokens == 0 || e->token_pairs || e->tokens, "tokens NULL");
        for (uint32_t k = 0; k < e->n_hashes; k++)
            check_hash(data, size, &e->hashes[k]);
        check_hash(data, size, &e->parent);
        check_str(data, size, &e->medium, "medium");
        check_str(data, size, &e->lora_name, "lora_name");
        check_str(data, size, &e->cache_salt, "cache_salt");
        check_str(data, size, &e->spec_kind, "spec_kind");
        FUZZ_CHECK(!e->token_pairs || e->n_tokens == e->n_pairs + 1, "pairs not flattened");
        if (e->n_xkey_blocks) {
            FUZZ_CHECK(e->xkey_off && e->xkey_off[0] == 0, "extra_keys offsets");
            for (uint32_t k = 0; k < e->n_xkey_blocks; k++)
                FUZZ_CHECK(e->xkey_off[k] <= e->xkey_off[k + 1], "extra_keys offsets");
            for (uint32_t k = 0; k < e->xkey_off[e->n_xkey_blocks]; k++)
                check_str(data, size, &e->xkeys[k].s, "extra_keys item");
        }
        if (e->block_size.has)
            FUZZ_CHECK(e->block_size.v >= 0, "negative block_size accepted");
    }
}

static void decoder_checks(const uint8_t *data, size_t size)
{
    static const struct kvb_decode_limits lim = KVB_DECODE_LIMITS_DEFAULT;
    struct kvb_decoder *d = kvb_decoder_create(&lim);
    FUZZ_CHECK(d != NULL, "decoder_create");
    struct kvb_batch b1, b2;
    int rc1 = kvb_decode_batch(d, data, size, &b1);
    FUZZ_CHECK(rc1 <= 0 && rc1 >= KVB_DEC_NOMEM, "decode rc %d", rc1);
    FUZZ_CHECK(kvb_decode_strerror(rc1) != NULL, "strerror");
    if (rc1 == 0) {
        check_batch(data, size, &b1, &lim);
        uint32_t n1 = b1.n_events;
        uint8_t types[64];
        for (uint32_t i = 0; i < n1 && i < 64; i++)
            types[i] = b1.events[i].type;
        int rc2 = kvb_decode_batch(d, data, size, &b2);
        FUZZ_CHECK(rc2 == 0 && b2.n_events == n1, "second decode differs");
        for (uint32_t i = 0; i < n1 && i < 64; i++)
            FUZZ_CHECK(b2.events[i].type == types[i], "second decode: event %u differs", i);
    } else {
        FUZZ_CHECK(kvb_decode_batch(d, data, size, &b2) == rc1, "second decode differs");
    }
    kvb_decoder_destroy(&d);
    FUZZ_CHECK(d == NULL, "decoder_destroy did not clear the pointer");
}

static void pipeline_checks(const uint8_t *data, size_t size, const struct kvb_pipeline_cfg *cfg)
{
    struct kvb_metrics m;
    memset(&m, 0, sizeof(m));
    struct ctx c = {.worker_id = cfg->convert.worker_id};
    struct kvb_pipeline *p = NULL;
    struct kvb_publish *pub = NULL;
    fuzz_pipeline(cfg, &m, on_emit, &c, &pub, &p);

    struct kvb_batch b;
    bool decodes = kvb_decode_batch(kvb_pipeline_decoder(p), data, size, &b) == 0;

    struct kvb_replay_cfg rcfg = {.name = "fuzz", .endpoint = ""};
    struct kvb_seq_ops ops = kvb_pipeline_seq_ops(p);
    struct kvb_replay *rules = NULL;
    FUZZ_CHECK(kvb_replay_create(&rcfg, &m, &ops, NULL, &rules) == 0, "replay_create");
    struct kvb_stream s;
    kvb_stream_init(&s, "fuzz", 3);
    int rc = kvb_replay_live(rules, &s, 42, data, size, 0);
    FUZZ_CHECK(rc >= 0, "replay_live rc %d", rc);
    FUZZ_CHECK((unsigned)rc == c.emitted, "apply returned %d, emitted %u", rc, c.emitted);
    FUZZ_CHECK(s.has_last && s.last == 42, "stream seq not updated");
    if (!decodes) {
        /* the malformed barrier: one "cleared" for the configured rank */
        FUZZ_CHECK(c.emitted == 1 && s.n_ranks == 1 && s.ranks[0] == 3,
                   "undecodable payload: %u events, %u ranks", c.emitted, s.n_ranks);
        FUZZ_CHECK(kvb_get(&m.barriers_total[KVB_BAR_MALFORMED]) == 1, "barrier not counted");
    } else {
        FUZZ_CHECK(c.emitted >= 1 && s.n_ranks == 1, "decoded: no start barrier");
        FUZZ_CHECK(kvb_get(&m.batches_received_total[0]) == 1, "batch not counted");
        uint64_t seen = 0;
        for (int t = 0; t < KVB_EVT__COUNT; t++)
            seen += kvb_get(&m.events_received_total[t]);
        /* every event was either published or dropped with a reason */
        uint64_t dropped = 0;
        for (int r = 0; r < KVB_DROP__COUNT; r++)
            dropped += kvb_get(&m.events_dropped_total[r]);
        FUZZ_CHECK(seen == b.n_events, "events counted %llu, decoded %u", (unsigned long long)seen,
                   b.n_events);
        FUZZ_CHECK(dropped + (c.emitted - 1) == seen, "published + dropped != received");
    }
    kvb_replay_destroy(&rules);
    kvb_pipeline_destroy(&p);
    kvb_publish_destroy(&pub);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool quiet;
    if (!quiet) {
        kvb_log_set_level(KVB_LOG_ERROR - 1); /* the rate-limited warnings are noise */
        quiet = true;
    }
    decoder_checks(data, size);

    struct kvb_pipeline_cfg a = {
        .convert = {.worker_id = 7587890738027725506ull,
                    .block_size = 0,
                    .lora_salt = true,
                    .forward_tiers = (1u << KVB_TIER__COUNT) - 1},
        .limits = KVB_DECODE_LIMITS_DEFAULT,
    };
    pipeline_checks(data, size, &a);

    struct kvb_pipeline_cfg b = {
        .convert = {.worker_id = UINT64_MAX,
                    .block_size = 16,
                    .lora_salt = false,
                    .forward_tiers = 1u << KVB_TIER_DEVICE},
        .limits = {.max_events = 8, .max_hashes = 8, .max_tokens = 128, .max_depth = 5},
    };
    pipeline_checks(data, size, &b);
    return 0;
}
