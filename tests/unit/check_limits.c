/* limits: hardening against a hostile or broken engine (docs/design.md rule 8).
 *
 *   encode   the JSON encoder's buffer holds the largest router event
 *            (20-digit numbers everywhere), directly and from an engine batch
 *   memory   a 64 MiB payload of every malformed kind (one huge str, one huge
 *            bin, an array of nils as events / tokens / hashes, a huge map,
 *            deep nesting, wide nesting, a lying length) costs the pipeline at
 *            most a bounded multiple of the payload in peak RSS, and is
 *            answered as the rules say (malformed batch -> barrier, malformed
 *            event -> dropped, good batch -> published)
 *   enforce  limits.max_events_per_batch / max_hashes_per_event /
 *            max_tokens_per_event / max_depth are exact (N passes, N+1 fails)
 *            and the decoder's defaults are the configuration's
 *   config   a FIFO named as the configuration file or as a *_file secret is
 *            refused, not waited on (a SIGHUP reload would hang the loop)
 *   payload  limits.max_payload_bytes, end to end through kvb_source and real
 *            ZMQ sockets on loopback: an oversize live message never reaches
 *            the decoder and the loss is answered by a barrier; an oversize
 *            replay reply must be refused the same way
 *
 * Peak RSS: /proc/self/status VmHWM, reset through /proc/self/clear_refs
 * ("5"); without it, getrusage's ru_maxrss in the test's own forked process.
 * Under valgrind or a sanitizer the payloads are smaller and the RSS bound is
 * not asserted (their allocators and shadow memory distort it); the outcomes
 * still are.  KVB_LIMITS_PAYLOAD_MIB=N sets the payload size (default 64;
 * until decode.c refuses oversize containers early, a case peaks at 24x it).
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "clock.h"
#include "config.h"
#include "encode.h"
#include "source.h"
#include "testutil.h"

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

#if defined(__SANITIZE_ADDRESS__)
#define KVB_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVB_ASAN 1
#endif
#endif
#ifndef KVB_ASAN
#define KVB_ASAN 0
#endif

#define W 7587890738027725506ULL
#define MiB (1024u * 1024u)

/* ---- msgpack writer (exact formats, any size) ----------------------------- */

struct wb {
    uint8_t *p;
    size_t len, cap;
};

static void wb_reserve(struct wb *w, size_t n)
{
    if (w->len + n <= w->cap)
        return;
    size_t cap = w->cap ? w->cap : 256;
    while (cap < w->len + n)
        cap *= 2;
    w->p = realloc(w->p, cap);
    ck_assert(w->p != NULL);
    w->cap = cap;
}
static void wb_u8(struct wb *w, uint8_t v)
{
    wb_reserve(w, 1);
    w->p[w->len++] = v;
}
static void wb_be(struct wb *w, uint64_t v, int n)
{
    wb_reserve(w, (size_t)n);
    for (int i = n - 1; i >= 0; i--)
        w->p[w->len++] = (uint8_t)(v >> (8 * i));
}
static void wb_fill(struct wb *w, uint8_t b, size_t n)
{
    wb_reserve(w, n);
    memset(w->p + w->len, b, n);
    w->len += n;
}
static void wb_mem(struct wb *w, const void *p, size_t n)
{
    wb_reserve(w, n);
    memcpy(w->p + w->len, p, n);
    w->len += n;
}
static void wb_arr(struct wb *w, uint32_t n)
{
    if (n < 16)
        wb_u8(w, (uint8_t)(0x90 | n));
    else if (n <= 0xffff)
        wb_u8(w, 0xdc), wb_be(w, n, 2);
    else
        wb_u8(w, 0xdd), wb_be(w, n, 4);
}
static void wb_map(struct wb *w, uint32_t n)
{
    if (n < 16)
        wb_u8(w, (uint8_t)(0x80 | n));
    else if (n <= 0xffff)
        wb_u8(w, 0xde), wb_be(w, n, 2);
    else
        wb_u8(w, 0xdf), wb_be(w, n, 4);
}
static void wb_str_hdr(struct wb *w, uint32_t n)
{
    if (n < 32)
        wb_u8(w, (uint8_t)(0xa0 | n));
    else if (n <= 0xff)
        wb_u8(w, 0xd9), wb_be(w, n, 1);
    else if (n <= 0xffff)
        wb_u8(w, 0xda), wb_be(w, n, 2);
    else
        wb_u8(w, 0xdb), wb_be(w, n, 4);
}
static void wb_str(struct wb *w, const char *s)
{
    size_t n = strlen(s);
    wb_str_hdr(w, (uint32_t)n);
    wb_mem(w, s, n);
}
static void wb_bin_hdr(struct wb *w, uint32_t n)
{
    if (n <= 0xff)
        wb_u8(w, 0xc4), wb_be(w, n, 1);
    else if (n <= 0xffff)
        wb_u8(w, 0xc5), wb_be(w, n, 2);
    else
        wb_u8(w, 0xc6), wb_be(w, n, 4);
}
static void wb_uint(struct wb *w, uint64_t v)
{
    if (v < 128)
        wb_u8(w, (uint8_t)v);
    else if (v <= 0xff)
        wb_u8(w, 0xcc), wb_be(w, v, 1);
    else if (v <= 0xffff)
        wb_u8(w, 0xcd), wb_be(w, v, 2);
    else if (v <= 0xffffffffu)
        wb_u8(w, 0xce), wb_be(w, v, 4);
    else
        wb_u8(w, 0xcf), wb_be(w, v, 8);
}
static void wb_nil(struct wb *w) { wb_u8(w, 0xc0); }
static void wb_f64(struct wb *w, double d)
{
    uint64_t v;
    memcpy(&v, &d, 8);
    wb_u8(w, 0xcb);
    wb_be(w, v, 8);
}
/* [ts, [ ...n events ]] */
static void wb_batch(struct wb *w, uint32_t n_events)
{
    wb_arr(w, 2);
    wb_f64(w, 1796034253.5);
    wb_arr(w, n_events);
}

/* ---- a pipeline collecting router events as lines ------------------------ */

static struct kvb_metrics m;
static struct sink_lines out;
static struct kvb_pipeline *p;
static struct kvb_publish *pub;
static struct kvb_replay *rules; /* the daemon's, without a replay endpoint */

static void open_pipeline(const struct kvb_pipeline_cfg *c)
{
    memset(&m, 0, sizeof(m));
    free(out.text);
    memset(&out, 0, sizeof(out));
    kvb_replay_destroy(&rules);
    test_pipeline_destroy(&pub, &p);
    test_pipeline_create(c, &m, &out, &pub, &p);
    rules = test_rules(p, &m, 0);
}

/* One live batch through the daemon's rules. */
static int feed(struct kvb_stream *s, uint64_t seq, const uint8_t *data, size_t len)
{
    return kvb_replay_live(rules, s, seq, data, len, 0);
}

static void teardown(void)
{
    kvb_replay_destroy(&rules);
    test_pipeline_destroy(&pub, &p);
    free(out.text);
    memset(&out, 0, sizeof(out));
}

static unsigned count_str(const char *hay, const char *needle)
{
    unsigned n = 0;
    for (const char *q = hay; q && (q = strstr(q, needle)); q += strlen(needle))
        n++;
    return n;
}

/* ---- encode: the largest router events fit ------------------------------- */

/* The dynamo-json text of r, built independently with stdio. */
static char *json_of(const struct kvb_rev *r, size_t *len)
{
    char *s = NULL;
    FILE *f = open_memstream(&s, len);
    ck_assert(f != NULL);
    fprintf(f, "{\"worker_id\":%" PRIu64, r->worker_id);
    if (r->tier != KVB_TIER_DEVICE)
        fprintf(f, ",\"storage_tier\":\"%s\"", kvb_tier_name(r->tier));
    fprintf(f, ",\"event\":{\"event_id\":%" PRIu64 ",\"data\":", r->event_id);
    if (r->type == KVB_REVT_STORED) {
        fputs("{\"stored\":{\"parent_hash\":", f);
        if (r->has_parent)
            fprintf(f, "%" PRIu64, r->parent);
        else
            fputs("null", f);
        fputs(",\"blocks\":[", f);
        for (uint32_t i = 0; i < r->n; i++)
            fprintf(f, "%s{\"block_hash\":%" PRIu64 ",\"tokens_hash\":%" PRIu64 "}", i ? "," : "",
                    r->blocks[i].block_hash, r->blocks[i].tokens_hash);
        fputs("]}}", f);
    } else if (r->type == KVB_REVT_REMOVED) {
        fputs("{\"removed\":{\"block_hashes\":[", f);
        for (uint32_t i = 0; i < r->n; i++)
            fprintf(f, "%s%" PRIu64, i ? "," : "", r->hashes[i]);
        fputs("]}}", f);
    } else {
        fputs("\"cleared\"", f);
    }
    fprintf(f, ",\"dp_rank\":%" PRIu32 "}}", r->dp_rank);
    fclose(f);
    return s;
}

/* Every count of blocks up to 300, every number at its widest (20 digits),
 * a non-device tier: the text must be right and fit the encoder's buffer.
 * A fresh encoder each time, so that its buffer is exactly what it sizes for
 * this event.  (A block takes up to 71 bytes: reserving 64 per block would
 * overflow the 1024-byte buffer at 12 blocks.) */
START_TEST(encode_widest_events_fit)
{
    enum { MAXN = 300 };
    struct kvb_block *blocks = malloc(MAXN * sizeof(*blocks));
    uint64_t *hashes = malloc(MAXN * sizeof(*hashes));
    ck_assert(blocks && hashes);
    for (int i = 0; i < MAXN; i++) {
        blocks[i] = (struct kvb_block){UINT64_MAX, UINT64_MAX - (uint64_t)i};
        hashes[i] = UINT64_MAX - (uint64_t)i;
    }
    for (int type = KVB_REVT_STORED; type <= KVB_REVT_REMOVED; type++) {
        for (uint32_t n = 1; n <= MAXN; n++) {
            struct kvb_rev r = {.type = (uint8_t)type,
                                .tier = KVB_TIER_HOST_PINNED,
                                .dp_rank = UINT32_MAX,
                                .worker_id = UINT64_MAX,
                                .event_id = UINT64_MAX - 1,
                                .has_parent = type == KVB_REVT_STORED,
                                .parent = UINT64_MAX,
                                .n = n};
            if (type == KVB_REVT_STORED)
                r.blocks = blocks;
            else
                r.hashes = hashes;
            size_t want_len;
            char *want = json_of(&r, &want_len);
            struct kvb_encoder *e = NULL;
            ck_assert_int_eq(kvb_encoder_create(KVB_FORMAT_DYNAMO_JSON, &e), 0);
            const char *data;
            size_t len;
            ck_assert_int_eq(kvb_encode(e, &r, &data, &len), 0);
            /* data is the start of the encoder's heap buffer */
            size_t room = malloc_usable_size((void *)data);
            ck_assert_msg(len <= room,
                          "%s with %u blocks: kvb_encode wrote %zu bytes into a buffer "
                          "of %zu usable bytes (heap overflow in encode_json.c kvb_encode: "
                          "it reserves 64 bytes per block, a block takes up to 71; 0 "
                          "means the overflow already broke the next chunk's header)",
                          type == KVB_REVT_STORED ? "stored" : "removed", n, len, room);
            ck_assert_uint_eq(len, want_len);
            ck_assert_msg(memcmp(data, want, len) == 0, "%u blocks: text differs", n);
            kvb_encoder_destroy(&e);
            free(want);
        }
    }
    free(blocks);
    free(hashes);
}
END_TEST

/* The same from an engine batch: a BlockStored with n blocks of one token
 * (block_size 1), block hashes 2^64-1 and tokens whose tokens_hash has 20
 * digits: what a long prompt with random 64-bit hashes looks like.  With
 * n = 124 the unfixed encoder writes ~770 bytes past its 8 KiB buffer and
 * glibc aborts ("corrupted size vs. prev_size"); the same payload (n = 28)
 * is tests/fuzz/regressions/fuzz_decode/encode-overflow-28-blocks.msgpack. */
static uint8_t *wide_stored(uint32_t n, size_t *len)
{
    struct wb w = {0};
    wb_batch(&w, 1);
    wb_arr(&w, 7);
    wb_str(&w, "BlockStored");
    wb_arr(&w, n);
    for (uint32_t i = 0; i < n; i++) /* 20 digits each, all distinct (a repeat is dropped) */
        wb_uint(&w, UINT64_MAX - i);
    wb_nil(&w);
    wb_arr(&w, n);
    uint32_t t = 0;
    for (uint32_t i = 0; i < n; i++) {
        do
            t++;
        while (kvb_tokens_hash(&t, 1, KVB_TOKENS_HASH_SEED) < 10000000000000000000ull);
        wb_uint(&w, t);
    }
    wb_uint(&w, 1);
    wb_nil(&w);
    wb_str(&w, "GPU");
    *len = w.len;
    return w.p;
}

static const uint32_t wide_n[] = {12, 27, 28, 56, 60, 114, 124, 300};

START_TEST(encode_widest_from_engine_batch)
{
    uint32_t n = wide_n[_i];
    struct kvb_pipeline_cfg c = test_pcfg(W, 1);
    open_pipeline(&c);
    size_t len;
    uint8_t *pl = wide_stored(n, &len);
    struct kvb_stream s;
    kvb_stream_init(&s, "wide", 0);
    ck_assert_int_eq(feed(&s, 0, pl, len), 2); /* start barrier + stored */
    free(pl);
    const char *line2 = strchr(out.text, '\n') + 1;
    size_t l2 = strlen(line2) - 1;
    /* 20-digit hashes: {"block_hash":...,"tokens_hash":...} is 70 bytes + ',' */
    size_t want = strlen("{\"worker_id\":7587890738027725506,\"event\":{\"event_id\":1,"
                         "\"data\":{\"stored\":{\"parent_hash\":null,\"blocks\":[]}},"
                         "\"dp_rank\":0}}") +
                  70 * n + (n - 1);
    ck_assert_uint_eq(l2, want);
    ck_assert_uint_eq(count_str(line2, "\"block_hash\":1844674407370955"), n);
}
END_TEST

/* ---- memory: a 64 MiB payload of every malformed kind -------------------- */

static long status_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    long v = -1;
    size_t n = strlen(key);
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, key, n) == 0 && line[n] == ':') {
            v = strtol(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

static bool reset_peak_rss(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f)
        return false;
    bool ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

static long maxrss_kb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

struct peak {
    bool hwm; /* VmHWM reset worked */
    long base_kb;
};

static void peak_start(struct peak *pk)
{
    pk->hwm = reset_peak_rss() && status_kb("VmHWM") >= 0;
    pk->base_kb = pk->hwm ? status_kb("VmRSS") : maxrss_kb();
}

/* Peak RSS growth since peak_start(), in bytes. */
static size_t peak_growth(const struct peak *pk)
{
    long now = pk->hwm ? status_kb("VmHWM") : maxrss_kb();
    return now > pk->base_kb ? (size_t)(now - pk->base_kb) * 1024 : 0;
}

enum outcome {
    O_PUBLISHED,       /* decodes; one router event after the start barrier */
    O_EVENT_DROPPED,   /* decodes; its one event is malformed: start barrier only */
    O_BATCH_MALFORMED, /* does not decode: the malformed barrier */
};

/* strict: one container declares more elements than any configured limit
 * allows (max_events, max_hashes, max_tokens), so docs/design.md rule 8 says it
 * is refused before anything is allocated for it: peak RSS growth at most
 * STRICT_FACTOR x the payload.  The refusal may then be of the whole batch
 * (KVB_DEC_TOO_LARGE) instead of the one event: `alt` allows it. */
struct bigcase {
    const char *name;
    enum outcome want;
    int dec_err; /* for O_BATCH_MALFORMED: the decoder's error */
    bool strict;
    bool alt_batch; /* O_BATCH_MALFORMED (KVB_DEC_TOO_LARGE) also right */
};

static const struct bigcase bigcases[] = {
    {"one huge str (lora_name)", O_PUBLISHED, 0, true, false},
    {"one huge bin (block hash)", O_PUBLISHED, 0, true, false},
    {"array of nils as the events", O_BATCH_MALFORMED, KVB_DEC_TOO_LARGE, true, false},
    {"array of nils as token_ids", O_EVENT_DROPPED, 0, true, true},
    {"array of nils as block_hashes", O_EVENT_DROPPED, 0, true, true},
    {"map of nil:nil as an event", O_EVENT_DROPPED, 0, true, true},
    {"nesting 64 Mi deep", O_BATCH_MALFORMED, KVB_DEC_TOO_DEEP, true, false},
    {"wide and deep (events 14 levels deep)", O_BATCH_MALFORMED, KVB_DEC_TOO_LARGE, true, false},
    {"array32 declaring 2^32-1 elements", O_BATCH_MALFORMED, KVB_DEC_TRUNCATED, true, false},
    {"str32 declaring 4 GiB", O_BATCH_MALFORMED, KVB_DEC_TRUNCATED, true, false},
    {"biggest valid event (65536 blocks)", O_PUBLISHED, 0, false, false},
    {"events of 1 Mi nils as token_ids (each at the limit)", O_EVENT_DROPPED, 0, false, false},
};
#define N_BIGCASES (sizeof(bigcases) / sizeof(bigcases[0]))

/* Build case i with about `size` bytes. */
static uint8_t *big_payload(unsigned i, size_t size, size_t *len)
{
    struct wb w = {0};
    wb_reserve(&w, size + 64);
    size_t body = size - 64; /* room for the envelope */
    switch (i) {
    case 0:
        wb_batch(&w, 1);
        wb_arr(&w, 8);
        wb_str(&w, "BlockStored");
        wb_arr(&w, 1), wb_uint(&w, 1);
        wb_nil(&w);
        wb_arr(&w, 16);
        for (int t = 0; t < 16; t++)
            wb_uint(&w, (uint64_t)t);
        wb_uint(&w, 16), wb_nil(&w), wb_str(&w, "GPU");
        wb_str_hdr(&w, (uint32_t)body);
        wb_fill(&w, 'a', body);
        break;
    case 1:
        wb_batch(&w, 1);
        wb_arr(&w, 3);
        wb_str(&w, "BlockRemoved");
        wb_arr(&w, 1);
        wb_bin_hdr(&w, (uint32_t)body);
        wb_fill(&w, 0x5a, body);
        wb_str(&w, "GPU");
        break;
    case 2:
        wb_batch(&w, (uint32_t)body);
        wb_fill(&w, 0xc0, body);
        break;
    case 3:
        wb_batch(&w, 1);
        wb_arr(&w, 5);
        wb_str(&w, "BlockStored");
        wb_arr(&w, 1), wb_uint(&w, 1);
        wb_nil(&w);
        wb_arr(&w, (uint32_t)body);
        wb_fill(&w, 0xc0, body);
        wb_uint(&w, 16);
        break;
    case 4:
        wb_batch(&w, 1);
        wb_arr(&w, 3);
        wb_str(&w, "BlockRemoved");
        wb_arr(&w, (uint32_t)body);
        wb_fill(&w, 0xc0, body);
        wb_str(&w, "GPU");
        break;
    case 5:
        wb_batch(&w, 1);
        wb_map(&w, (uint32_t)(body / 2));
        wb_fill(&w, 0xc0, body / 2 * 2);
        break;
    case 6:
        wb_fill(&w, 0x91, body);
        wb_nil(&w);
        break;
    case 7: {
        /* events that are 14 nested one-element arrays around a nil */
        size_t k = body / 15;
        wb_batch(&w, (uint32_t)k);
        for (size_t j = 0; j < k; j++) {
            wb_fill(&w, 0x91, 14);
            wb_nil(&w);
        }
        break;
    }
    case 8:
        wb_u8(&w, 0xdd), wb_be(&w, 0xffffffffu, 4);
        wb_fill(&w, 0xc0, body);
        break;
    case 9:
        wb_u8(&w, 0xdb), wb_be(&w, 0xffffffffu, 4);
        wb_fill(&w, 'a', body);
        break;
    case 10: {
        /* the largest event the default limits accept, 65536 blocks of 16
         * tokens (1 Mi token ids, 5 bytes each): about 5.6 MiB whatever
         * `size` is */
        const uint32_t nb = 65536, bs = 16;
        wb_batch(&w, 1);
        wb_arr(&w, 7);
        wb_str(&w, "BlockStored");
        wb_arr(&w, nb);
        for (uint32_t j = 0; j < nb; j++)
            wb_uint(&w, 0x8000000000000000ull + j);
        wb_nil(&w);
        wb_arr(&w, nb * bs);
        for (uint32_t j = 0; j < nb * bs; j++)
            wb_uint(&w, 0x10000u + j);
        wb_uint(&w, bs), wb_nil(&w), wb_str(&w, "GPU");
        break;
    }
    case 11: {
        /* no container above a limit: per-container caps cannot refuse it,
         * only the total can bound it */
        const uint32_t nt = 1u << 20;
        size_t k = body / (nt + 32);
        wb_batch(&w, (uint32_t)k);
        for (size_t j = 0; j < k; j++) {
            wb_arr(&w, 5);
            wb_str(&w, "BlockStored");
            wb_arr(&w, 1), wb_uint(&w, 1);
            wb_nil(&w);
            wb_arr(&w, nt);
            wb_fill(&w, 0xc0, nt);
            wb_uint(&w, 16);
        }
        break;
    }
    }
    *len = w.len;
    return w.p;
}

/* The bound for every payload: the decoder's object tree costs at most 24
 * bytes (sizeof(msgpack_object)) per payload byte, because the bounds walk
 * lets through at most one object per byte; plus the arena's chunk slack,
 * the converter's scratch and the encoder's buffer.  For the strict cases
 * (refused before allocating) far less. */
#define RSS_FACTOR 26
#define STRICT_FACTOR 2
#define RSS_SLACK (16 * MiB)

START_TEST(big_payload_bounded)
{
    const struct bigcase *bc = &bigcases[_i];
    bool distorted = RUNNING_ON_VALGRIND || KVB_ASAN;
    size_t size = RUNNING_ON_VALGRIND ? 4 * MiB : KVB_ASAN ? 16 * MiB : 64 * MiB;
    const char *env = getenv("KVB_LIMITS_PAYLOAD_MIB"); /* smaller machines */
    if (env && atoi(env) >= 1)
        size = (size_t)atoi(env) * MiB;
    size_t len;
    uint8_t *pl = big_payload((unsigned)_i, size, &len);
    struct kvb_pipeline_cfg c = test_pcfg(W, 16);
    c.convert.forward_tiers = 1u << KVB_TIER_DEVICE;
    open_pipeline(&c);
    struct kvb_stream s;
    kvb_stream_init(&s, "big", 0);

    /* what the decoder says (its own decoder: nothing kept in the pipeline's) */
    struct kvb_decoder *d = kvb_decoder_create(NULL);
    ck_assert(d != NULL);
    struct kvb_batch b;
    int dec_rc = kvb_decode_batch(d, pl, len, &b);
    kvb_decoder_destroy(&d);

    struct peak pk;
    peak_start(&pk);
    int rc = feed(&s, 0, pl, len);
    size_t growth = peak_growth(&pk);

    fprintf(stderr, "limits: %-40s %9zu bytes: peak RSS +%zu KiB (%.1f x payload)%s\n", bc->name,
            len, growth / 1024, (double)growth / (double)len,
            distorted ? " [valgrind/ASan: not asserted]"
            : pk.hwm  ? ""
                      : " [ru_maxrss]");
    enum outcome got = dec_rc < 0 ? O_BATCH_MALFORMED : rc == 1 ? O_EVENT_DROPPED : O_PUBLISHED;
    enum outcome want = bc->want;
    if (bc->alt_batch && got == O_BATCH_MALFORMED && dec_rc == KVB_DEC_TOO_LARGE)
        want = O_BATCH_MALFORMED;
    if (!distorted) {
        ck_assert_msg(growth <= RSS_FACTOR * len + RSS_SLACK,
                      "%s: peak RSS grew by %zu bytes for a %zu-byte payload", bc->name, growth,
                      len);
        ck_assert_msg(!bc->strict || growth <= STRICT_FACTOR * len + RSS_SLACK,
                      "%s: peak RSS grew by %zu MiB (%.1f x the %zu MiB payload): a container "
                      "longer than any limit allows was allocated before being refused "
                      "(docs/design.md rule 8; decode.c: msgpack_unpack() builds the whole tree "
                      "before the limits are checked)",
                      bc->name, growth / MiB, (double)growth / (double)len, len / MiB);
    }
    switch (want) {
    case O_PUBLISHED:
        ck_assert_int_eq(dec_rc, 0);
        ck_assert_int_eq(rc, 2);
        ck_assert_uint_eq(count_str(out.text, "\"cleared\""), 1);
        break;
    case O_EVENT_DROPPED:
        ck_assert_int_eq(dec_rc, 0);
        ck_assert_int_eq(rc, 1);
        ck_assert_uint_ge(kvb_get(&m.events_dropped_total[KVB_DROP_MALFORMED_EVENT]), 1);
        break;
    case O_BATCH_MALFORMED:
        ck_assert_int_eq(dec_rc, bc->alt_batch ? KVB_DEC_TOO_LARGE : bc->dec_err);
        ck_assert_int_eq(rc, 1);
        ck_assert_uint_eq(kvb_get(&m.barriers_total[KVB_BAR_MALFORMED]), 1);
        break;
    }
    free(pl);
}
END_TEST

/* ---- enforce: each limit is exact ------------------------------------------ */

static struct kvb_pipeline_cfg small_limits(void)
{
    struct kvb_pipeline_cfg c = test_pcfg(W, 4);
    c.limits = (struct kvb_decode_limits){
        .max_events = 5, .max_hashes = 3, .max_tokens = 12, .max_depth = 6};
    return c;
}

/* BlockStored with nh hashes and nt tokens (block size 4), extra_keys nested
 * `nest` arrays deep (0: nil). */
static void wb_stored(struct wb *w, uint32_t nh, uint32_t nt, unsigned nest)
{
    wb_arr(w, 9);
    wb_str(w, "BlockStored");
    wb_arr(w, nh);
    for (uint32_t i = 0; i < nh; i++)
        wb_uint(w, 1000 + i);
    wb_nil(w);
    wb_arr(w, nt);
    for (uint32_t i = 0; i < nt; i++)
        wb_uint(w, i);
    wb_uint(w, 4);
    wb_nil(w);
    wb_str(w, "GPU");
    wb_nil(w);
    for (unsigned i = 0; i < nest; i++)
        wb_arr(w, 1);
    wb_nil(w);
}

static int apply_wb(struct wb *w, struct kvb_stream *s, uint64_t seq)
{
    int rc = feed(s, seq, w->p, w->len);
    free(w->p);
    memset(w, 0, sizeof(*w));
    return rc;
}

START_TEST(limit_events_exact)
{
    struct kvb_pipeline_cfg c = small_limits();
    open_pipeline(&c);
    struct kvb_stream s;
    kvb_stream_init(&s, "lim", 0);
    struct wb w = {0};
    wb_batch(&w, 5);
    for (int i = 0; i < 5; i++)
        wb_stored(&w, 1, 4, 0);
    ck_assert_int_eq(apply_wb(&w, &s, 0), 1 + 5);
    wb_batch(&w, 6);
    for (int i = 0; i < 6; i++)
        wb_stored(&w, 1, 4, 0);
    ck_assert_int_eq(apply_wb(&w, &s, 1), 1); /* the malformed barrier only */
    ck_assert_uint_eq(kvb_get(&m.barriers_total[KVB_BAR_MALFORMED]), 1);
    ck_assert_uint_eq(kvb_get(&m.malformed_messages_total[KVB_MAL_BATCH]), 1);
}
END_TEST

START_TEST(limit_hashes_and_tokens_exact)
{
    struct kvb_pipeline_cfg c = small_limits();
    open_pipeline(&c);
    struct kvb_stream s;
    kvb_stream_init(&s, "lim", 0);
    struct wb w = {0};
    wb_batch(&w, 4);
    wb_stored(&w, 3, 12, 0); /* at both limits: published (3 blocks) */
    wb_stored(&w, 4, 12, 0); /* one hash too many: dropped as malformed */
    wb_stored(&w, 3, 13, 0); /* one token too many: dropped as malformed */
    wb_stored(&w, 1, 4, 0);  /* the rest of the batch still counts */
    ck_assert_int_eq(apply_wb(&w, &s, 0), 1 + 2);
    ck_assert_uint_eq(kvb_get(&m.events_dropped_total[KVB_DROP_MALFORMED_EVENT]), 2);
    ck_assert_uint_eq(count_str(out.text, "\"block_hash\":1002"), 1);

    /* BlockRemoved: same hash limit */
    wb_batch(&w, 2);
    wb_arr(&w, 3), wb_str(&w, "BlockRemoved"), wb_arr(&w, 3);
    wb_uint(&w, 1), wb_uint(&w, 2), wb_uint(&w, 3), wb_str(&w, "GPU");
    wb_arr(&w, 3), wb_str(&w, "BlockRemoved"), wb_arr(&w, 4);
    wb_uint(&w, 1), wb_uint(&w, 2), wb_uint(&w, 3), wb_uint(&w, 4), wb_str(&w, "GPU");
    ck_assert_int_eq(apply_wb(&w, &s, 1), 1);
    ck_assert_uint_eq(kvb_get(&m.events_dropped_total[KVB_DROP_MALFORMED_EVENT]), 3);
}
END_TEST

START_TEST(limit_depth_exact)
{
    struct kvb_pipeline_cfg c = small_limits(); /* max_depth 6 */
    open_pipeline(&c);
    struct kvb_stream s;
    kvb_stream_init(&s, "lim", 0);
    struct wb w = {0};
    /* batch (1), events (2), event (3), extra_keys nested 3 deep (4..6) */
    wb_batch(&w, 1);
    wb_stored(&w, 1, 4, 3);
    ck_assert_int_eq(apply_wb(&w, &s, 0), 2);
    wb_batch(&w, 1);
    wb_stored(&w, 1, 4, 4);
    ck_assert_int_eq(apply_wb(&w, &s, 1), 1);
    ck_assert_uint_eq(kvb_get(&m.barriers_total[KVB_BAR_MALFORMED]), 1);

    /* a max_depth above what msgpack-c can hold is capped, not trusted */
    struct kvb_decode_limits lim = KVB_DECODE_LIMITS_DEFAULT;
    lim.max_depth = 1000;
    struct kvb_decoder *d = kvb_decoder_create(&lim);
    ck_assert(d != NULL);
    wb_fill(&w, 0x91, 40);
    wb_nil(&w);
    struct kvb_batch b;
    ck_assert_int_eq(kvb_decode_batch(d, w.p, w.len, &b), KVB_DEC_TOO_DEEP);
    kvb_decoder_destroy(&d);
    free(w.p);
}
END_TEST

/* The decoder's built-in defaults are the configuration's defaults. */
START_TEST(limit_defaults_match_config)
{
    struct kvb_config *cfg = NULL;
    ck_assert_int_eq(kvb_config_load("tests/data/config/minimal.yaml", &cfg, stderr), 0);
    struct kvb_decode_limits d = KVB_DECODE_LIMITS_DEFAULT;
    ck_assert_uint_eq(d.max_events, cfg->limits.max_events_per_batch);
    ck_assert_uint_eq(d.max_hashes, cfg->limits.max_hashes_per_event);
    ck_assert_uint_eq(d.max_tokens, cfg->limits.max_tokens_per_event);
    ck_assert_uint_eq(d.max_depth, cfg->limits.max_depth);
    ck_assert_uint_eq(cfg->limits.max_payload_bytes, 16 * MiB);
    kvb_config_free(&cfg);
}
END_TEST

/* ---- payload: limits.max_payload_bytes through real ZMQ sockets ---------- */

#define MAXPAY (64 * 1024)
#define BIG_HASH 0xb16b16b16ULL /* only the oversize batch has it */

static bool has_big_hash(void)
{
    char h[32];
    snprintf(h, sizeof(h), "%" PRIu64, (uint64_t)BIG_HASH);
    return out.text && strstr(out.text, h) != NULL;
}

/* A good batch of one BlockRemoved of `hash`, padded with an ignored 4th
 * envelope element to `size` bytes. */
static uint8_t *padded_batch(uint64_t hash, size_t size, size_t *len)
{
    struct wb w = {0};
    wb_arr(&w, 4);
    wb_f64(&w, 1796034253.5);
    wb_arr(&w, 1);
    wb_arr(&w, 3), wb_str(&w, "BlockRemoved"), wb_arr(&w, 1), wb_uint(&w, hash);
    wb_str(&w, "GPU");
    wb_nil(&w); /* dp_rank */
    size_t pad = size > w.len + 8 ? size - w.len - 5 : 0;
    wb_str_hdr(&w, (uint32_t)pad);
    wb_fill(&w, 'p', pad);
    *len = w.len;
    return w.p;
}

/* An engine (XPUB, so that we see the subscription; optionally a replay
 * ROUTER) and a kvb_source reading it with max_payload_bytes = MAXPAY. */
struct net {
    void *zctx, *xpub, *router;
    char pub_ep[128], rep_ep[128];
    struct kvb_source *src;
};

static void net_open(struct net *n, int mode, bool with_replay)
{
    memset(n, 0, sizeof(*n));
    n->zctx = zmq_ctx_new();
    ck_assert(n->zctx != NULL);
    int linger = 0, zero = 0, ivl = 50;
    n->xpub = zmq_socket(n->zctx, ZMQ_XPUB);
    ck_assert(n->xpub != NULL);
    zmq_setsockopt(n->xpub, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(n->xpub, ZMQ_SNDHWM, &zero, sizeof(zero));
    zmq_setsockopt(n->xpub, ZMQ_RECONNECT_IVL, &ivl, sizeof(ivl));
    if (mode == KVB_MODE_CONNECT) {
        ck_assert_int_eq(zmq_bind(n->xpub, "tcp://127.0.0.1:*"), 0);
        size_t sz = sizeof(n->pub_ep);
        zmq_getsockopt(n->xpub, ZMQ_LAST_ENDPOINT, n->pub_ep, &sz);
    } else {
        snprintf(n->pub_ep, sizeof(n->pub_ep), "tcp://127.0.0.1:*");
    }
    if (with_replay) {
        n->router = zmq_socket(n->zctx, ZMQ_ROUTER);
        ck_assert(n->router != NULL);
        zmq_setsockopt(n->router, ZMQ_LINGER, &linger, sizeof(linger));
        ck_assert_int_eq(zmq_bind(n->router, "tcp://127.0.0.1:*"), 0);
        size_t sz = sizeof(n->rep_ep);
        zmq_getsockopt(n->router, ZMQ_LAST_ENDPOINT, n->rep_ep, &sz);
    }
    struct kvb_source_params sp = {
        .endpoint = n->pub_ep,
        .replay_endpoint = with_replay ? n->rep_ep : "",
        .topic = "",
        .mode = mode,
        .dp_rank = 0,
        .rcvhwm = 10000,
        .replay_timeout_ms = 3000,
        .max_payload_bytes = MAXPAY,
        .pipeline = p,
    };
    ck_assert_int_eq(kvb_source_create(n->zctx, &sp, &m, &n->src), 0);
    if (mode == KVB_MODE_BIND) {
        char ep[128];
        size_t sz = sizeof(ep);
        ck_assert_int_eq(zmq_getsockopt(kvb_source_sub(n->src), ZMQ_LAST_ENDPOINT, ep, &sz), 0);
        ck_assert_int_eq(zmq_connect(n->xpub, ep), 0);
    }
}

static void net_close(struct net *n)
{
    kvb_source_destroy(&n->src);
    if (n->router)
        zmq_close(n->router);
    if (n->xpub)
        zmq_close(n->xpub);
    zmq_ctx_term(n->zctx);
}

/* Wait (bounded) for the SUB's subscription to reach the XPUB.  The SUB is
 * polled too: a bound socket attaches a new peer (and sends it the
 * subscription) only when its own thread handles its commands. */
static void wait_subscribed(struct net *n)
{
    uint64_t end = kvb_mono_ms() + 5000;
    for (;;) {
        ck_assert_msg(kvb_mono_ms() < end, "the SUB did not subscribe");
        zmq_pollitem_t it[2] = {{n->xpub, 0, ZMQ_POLLIN, 0},
                                {kvb_source_sub(n->src), 0, ZMQ_POLLIN, 0}};
        if (zmq_poll(it, 2, 50) > 0 && (it[0].revents & ZMQ_POLLIN)) {
            uint8_t msg[64];
            int r = zmq_recv(n->xpub, msg, sizeof(msg), 0);
            if (r >= 1 && msg[0] == 1)
                return;
        }
    }
}

static void publish(struct net *n, uint64_t seq, const uint8_t *pl, size_t len)
{
    uint8_t s8[8];
    for (int i = 0; i < 8; i++)
        s8[i] = (uint8_t)(seq >> (56 - 8 * i));
    ck_assert_int_ge(zmq_send(n->xpub, "", 0, ZMQ_SNDMORE), 0);
    ck_assert_int_ge(zmq_send(n->xpub, s8, 8, ZMQ_SNDMORE), 0);
    ck_assert_int_ge(zmq_send(n->xpub, pl, len, 0), 0);
}

/* Drive the source for up to ms milliseconds, or until `until` lines were
 * published. */
static void pump(struct net *n, int ms, unsigned until)
{
    uint64_t end = kvb_mono_ms() + (uint64_t)ms;
    while (kvb_mono_ms() < end && out.n < until) {
        zmq_pollitem_t it[2] = {{kvb_source_sub(n->src), 0, ZMQ_POLLIN, 0},
                                {kvb_source_replay(n->src), 0, ZMQ_POLLIN, 0}};
        int nit = it[1].socket ? 2 : 1;
        zmq_poll(it, nit, 20);
        ck_assert_int_ge(kvb_source_read(n->src, 100), 0);
        if (kvb_source_replay(n->src))
            ck_assert_int_ge(kvb_source_read_replay(n->src), 0);
        kvb_source_tick(n->src, kvb_mono_ms());
    }
}

static uint64_t malformed_total(void)
{
    uint64_t t = 0;
    for (int k = 0; k < KVB_MAL__COUNT; k++)
        t += kvb_get(&m.malformed_messages_total[k]);
    return t;
}

/* seq 0 (small) arrives: the start barrier and its event. */
static void first_batch(struct net *n, const uint8_t *small, size_t len)
{
    wait_subscribed(n);
    publish(n, 0, small, len);
    pump(n, 5000, 2);
    ck_assert_uint_eq(out.n, 2);
}

/* Live: seq 0 small, seq 1 above max_payload_bytes, then small batches
 * until one arrives.  The big batch must never reach the decoder, the stream
 * must go on, and the loss is a gap answered by a barrier before the next
 * batch. */
static void live_oversize(int mode)
{
    struct kvb_pipeline_cfg c = test_pcfg(W, 16);
    open_pipeline(&c);
    struct net n;
    net_open(&n, mode, false);
    size_t len, blen;
    uint8_t *small = padded_batch(1, 100, &len);
    uint8_t *big = padded_batch(BIG_HASH, 4 * MAXPAY, &blen);
    first_batch(&n, small, len);
    publish(&n, 1, big, blen);
    free(big);
    uint64_t seq = 2;
    uint64_t end = kvb_mono_ms() + 5000;
    while (out.n < 4 && kvb_mono_ms() < end) {
        publish(&n, seq++, small, len);
        pump(&n, 100, 4);
    }
    free(small);
    ck_assert_msg(!has_big_hash(), "the oversize batch was published:\n%s", out.text);
    ck_assert_msg(out.n >= 4,
                  "%s mode: nothing arrived in 5 s after one message above "
                  "max_payload_bytes (%" PRIu64 " batches sent since): ZMQ_MAXMSGSIZE on the "
                  "SUB makes libzmq drop the connection as a protocol error, and a "
                  "connecting socket does not reconnect after a protocol error, so the "
                  "engine is lost for good (source.c, kvb_source_create)",
                  mode == KVB_MODE_CONNECT ? "connect" : "bind", seq - 2);
    /* line 3 is the gap barrier */
    const char *l3 = strchr(strchr(out.text, '\n') + 1, '\n') + 1;
    const char *barrier = "{\"worker_id\":7587890738027725506,\"event\":{\"event_id\":2,"
                          "\"data\":\"cleared\"";
    ck_assert_msg(strncmp(l3, barrier, strlen(barrier)) == 0,
                  "no barrier after the lost batch:\n%s", out.text);
    /* a gap barrier, or one for the refused batch itself */
    ck_assert_uint_ge(
        kvb_get(&m.barriers_total[KVB_BAR_GAP]) + kvb_get(&m.barriers_total[KVB_BAR_MALFORMED]), 1);
    net_close(&n);
}

START_TEST(payload_live_oversize_bind_mode) { live_oversize(KVB_MODE_BIND); }
END_TEST

START_TEST(payload_live_oversize_connect_mode) { live_oversize(KVB_MODE_CONNECT); }
END_TEST

/* config.c's help for limits.max_payload_bytes: "larger ones are counted as
 * malformed".  ZMQ_MAXMSGSIZE would make libzmq drop the connection instead,
 * and nothing would be counted: connect mode never sets it.  (Bind mode sets
 * it to the limit, so that peers cannot make libzmq buffer more than
 * max_peers frames of that size: there the loss shows as a gap,
 * payload_live_oversize_bind_mode.) */
START_TEST(payload_live_oversize_counted)
{
    struct kvb_pipeline_cfg c = test_pcfg(W, 16);
    open_pipeline(&c);
    struct net n;
    net_open(&n, KVB_MODE_CONNECT, false);
    size_t len, blen;
    uint8_t *small = padded_batch(1, 100, &len);
    uint8_t *big = padded_batch(BIG_HASH, 4 * MAXPAY, &blen);
    first_batch(&n, small, len);
    publish(&n, 1, big, blen);
    pump(&n, 1000, 100);
    free(big);
    free(small);
    ck_assert_msg(!has_big_hash(), "the oversize batch was published");
    ck_assert_msg(malformed_total() >= 1,
                  "a message above max_payload_bytes was not counted in "
                  "malformed_messages_total (config.c's help for the key says it is)");
    net_close(&n);
}
END_TEST

/* Replay: a reply carrying a batch above max_payload_bytes must be refused
 * like a live one (the gap stays unfilled: barrier), not decoded. */
START_TEST(payload_replay_oversize_refused)
{
    struct kvb_pipeline_cfg c = test_pcfg(W, 16);
    open_pipeline(&c);
    struct net n;
    net_open(&n, KVB_MODE_CONNECT, true);
    size_t len, blen;
    uint8_t *small = padded_batch(1, 100, &len);
    first_batch(&n, small, len);
    publish(&n, 2, small, len); /* seq 1 missing: the source asks for a replay */

    /* serve the replay request: [id, "", start seq] -> batch 1 (oversize), end */
    zmq_pollitem_t it = {n.router, 0, ZMQ_POLLIN, 0};
    uint64_t end = kvb_mono_ms() + 5000;
    while (zmq_poll(&it, 1, 0) == 0) {
        ck_assert_msg(kvb_mono_ms() < end, "no replay request");
        pump(&n, 20, 100);
    }
    uint8_t id[256], empty[8], start[8];
    int idn = zmq_recv(n.router, id, sizeof(id), 0);
    ck_assert_int_gt(idn, 0);
    ck_assert_int_eq(zmq_recv(n.router, empty, sizeof(empty), 0), 0);
    ck_assert_int_eq(zmq_recv(n.router, start, sizeof(start), 0), 8);
    ck_assert_uint_eq(start[7], 1);
    uint8_t *big = padded_batch(BIG_HASH, 4 * MAXPAY, &blen);
    uint8_t s1[8] = {0, 0, 0, 0, 0, 0, 0, 1}, fin[8];
    memset(fin, 0xff, 8);
    zmq_send(n.router, id, (size_t)idn, ZMQ_SNDMORE);
    zmq_send(n.router, "", 0, ZMQ_SNDMORE);
    zmq_send(n.router, s1, 8, ZMQ_SNDMORE);
    zmq_send(n.router, big, blen, 0);
    zmq_send(n.router, id, (size_t)idn, ZMQ_SNDMORE);
    zmq_send(n.router, "", 0, ZMQ_SNDMORE);
    zmq_send(n.router, fin, 8, ZMQ_SNDMORE);
    zmq_send(n.router, "", 0, 0);
    free(big);
    pump(&n, 5000, 4); /* barrier (or the big batch) + seq 2 */
    free(small);
    ck_assert_uint_ge(out.n, 4);
    ck_assert_msg(!has_big_hash(),
                  "a replayed batch of %zu bytes (max_payload_bytes %d) was decoded and "
                  "published: the replay DEALER has no ZMQ_MAXMSGSIZE and nothing checks "
                  "the size after it (source.c start_replay / on_replay_batch):\n%s",
                  blen, MAXPAY, out.text);
    /* a gap barrier, or one for the refused batch itself */
    ck_assert_uint_ge(
        kvb_get(&m.barriers_total[KVB_BAR_GAP]) + kvb_get(&m.barriers_total[KVB_BAR_MALFORMED]), 1);
    net_close(&n);
}
END_TEST

/* ---- topics with NUL bytes, replies for other topics ---------------------- */

static void publish_t(struct net *n, const char *topic, size_t tl, uint64_t seq, const uint8_t *pl,
                      size_t len)
{
    uint8_t s8[8];
    for (int i = 0; i < 8; i++)
        s8[i] = (uint8_t)(seq >> (56 - 8 * i));
    ck_assert_int_ge(zmq_send(n->xpub, topic, tl, ZMQ_SNDMORE), 0);
    ck_assert_int_ge(zmq_send(n->xpub, s8, 8, ZMQ_SNDMORE), 0);
    ck_assert_int_ge(zmq_send(n->xpub, pl, len, 0), 0);
}

/* Wait (pumping the source) for its replay request; returns the start seq
 * and the requester's identity. */
static uint64_t take_request(struct net *n, uint8_t *id, int *idn)
{
    zmq_pollitem_t it = {n->router, 0, ZMQ_POLLIN, 0};
    uint64_t end = kvb_mono_ms() + 5000;
    while (zmq_poll(&it, 1, 0) == 0) {
        ck_assert_msg(kvb_mono_ms() < end, "no replay request");
        pump(n, 20, 1000);
    }
    uint8_t empty[8], start[8];
    *idn = zmq_recv(n->router, id, 256, 0);
    ck_assert_int_gt(*idn, 0);
    ck_assert_int_eq(zmq_recv(n->router, empty, sizeof(empty), 0), 0);
    ck_assert_int_eq(zmq_recv(n->router, start, sizeof(start), 0), 8);
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | start[i];
    return v;
}

/* A new-layout reply: [id, "", topic, seq, payload]. */
static void reply4(struct net *n, const uint8_t *id, int idn, const char *topic, size_t tl,
                   uint64_t seq, const uint8_t *pl, size_t len)
{
    uint8_t s8[8];
    for (int i = 0; i < 8; i++)
        s8[i] = (uint8_t)(seq >> (56 - 8 * i));
    zmq_send(n->router, id, (size_t)idn, ZMQ_SNDMORE);
    zmq_send(n->router, "", 0, ZMQ_SNDMORE);
    zmq_send(n->router, topic, tl, ZMQ_SNDMORE);
    zmq_send(n->router, s8, 8, ZMQ_SNDMORE);
    zmq_send(n->router, pl, len, 0);
}

/* Topics "a\0b" and "a\0c" are two streams (compared with their length,
 * not as C strings): seq 0 on each is two starts, not a restart. */
START_TEST(nul_topics_are_their_own_streams)
{
    struct kvb_pipeline_cfg c = test_pcfg(W, 16);
    open_pipeline(&c);
    struct net n;
    net_open(&n, KVB_MODE_CONNECT, false);
    wait_subscribed(&n);
    size_t l1, l2, l3;
    uint8_t *b1 = padded_batch(11, 100, &l1), *b2 = padded_batch(12, 100, &l2),
            *b3 = padded_batch(13, 100, &l3);
    publish_t(&n, "a\0b", 3, 0, b1, l1);
    publish_t(&n, "a\0c", 3, 0, b2, l2);
    publish_t(&n, "a\0b", 3, 1, b3, l3);
    pump(&n, 5000, 5);
    /* start barrier + event, the second stream's start barrier + event, event */
    ck_assert_uint_eq(out.n, 5);
    ck_assert_uint_eq(kvb_get(&m.engine_restarts_total[0]), 0);
    ck_assert_uint_eq(kvb_get(&m.seq_gaps_total[0]), 0);
    free(b1);
    free(b2);
    free(b3);
    net_close(&n);
}
END_TEST

/* A new-layout replay reply for another topic cannot fill this stream's gap:
 * dropped and counted (replay_reply), never published; the gap stays a gap.
 * The stream's own topic, NUL byte and all, does fill it. */
START_TEST(replay_reply_topic_checked)
{
    struct kvb_pipeline_cfg c = test_pcfg(W, 16);
    open_pipeline(&c);
    struct net n;
    net_open(&n, KVB_MODE_CONNECT, true);
    wait_subscribed(&n);
    size_t len, flen;
    uint8_t *small = padded_batch(1, 100, &len);
    uint8_t *foreign = padded_batch(BIG_HASH, 100, &flen);
    uint8_t id[256], fin[8];
    memset(fin, 0xff, 8);
    int idn;
    /* a. a reply for "other", then END: dropped, counted, gap barrier */
    publish_t(&n, "e\0x", 3, 0, small, len);
    pump(&n, 5000, 2);
    publish_t(&n, "e\0x", 3, 2, small, len); /* seq 1 missing */
    ck_assert_uint_eq(take_request(&n, id, &idn), 1);
    reply4(&n, id, idn, "other", 5, 1, foreign, flen);
    reply4(&n, id, idn, "e", 1, 1, foreign, flen); /* the topic up to its NUL byte: foreign */
    reply4(&n, id, idn, "e\0x", 3, UINT64_MAX, (const uint8_t *)"", 0);
    pump(&n, 5000, 4); /* the gap barrier, then seq 2 */
    ck_assert_msg(!has_big_hash(), "a reply for another topic was published:\n%s", out.text);
    ck_assert_uint_eq(kvb_get(&m.malformed_messages_total[KVB_MAL_REPLAY_REPLY]), 2);
    ck_assert_uint_eq(kvb_get(&m.replays_failed_total[0]), 1);
    ck_assert_uint_eq(kvb_get(&m.barriers_total[KVB_BAR_GAP]), 1);
    /* b. the stream's own topic fills the next gap */
    publish_t(&n, "e\0x", 3, 4, small, len); /* seq 3 missing */
    ck_assert_uint_eq(take_request(&n, id, &idn), 3);
    reply4(&n, id, idn, "e\0x", 3, 3, small, len);
    pump(&n, 5000, 6); /* seq 3, then seq 4 */
    ck_assert_uint_eq(out.n, 6);
    ck_assert_uint_eq(kvb_get(&m.replays_filled_total[0]), 1);
    free(small);
    free(foreign);
    net_close(&n);
}
END_TEST

/* ---- regressions: inputs the fuzzers found, replayed ---------------------- */

/* Empty strings (a zero-length str has a NULL pointer in msgpack-c's object)
 * as the type tag, medium, lora_name: fine, and no pointer arithmetic on
 * NULL (kvb_utf8_valid(NULL, 0): UBSan "applying zero offset to null
 * pointer", found by fuzz_decode; this fails under make check-asan). */
START_TEST(empty_strings)
{
    struct kvb_pipeline_cfg c = test_pcfg(W, 4);
    open_pipeline(&c);
    struct wb w = {0};
    /* an integer ts: no str/bin/float before the first "", so msgpack-c
     * leaves that str's pointer NULL (after one, it points at stale bytes) */
    wb_arr(&w, 2), wb_uint(&w, 1), wb_arr(&w, 3);
    wb_arr(&w, 1), wb_str(&w, "");
    wb_arr(&w, 8), wb_str(&w, "BlockStored"), wb_arr(&w, 1), wb_uint(&w, 5), wb_nil(&w);
    wb_arr(&w, 4);
    for (int i = 0; i < 4; i++)
        wb_uint(&w, (uint64_t)i);
    wb_uint(&w, 4), wb_nil(&w), wb_str(&w, ""), wb_str(&w, "");
    wb_map(&w, 3), wb_str(&w, "type"), wb_str(&w, "BlockRemoved"), wb_str(&w, "block_hashes");
    wb_arr(&w, 1), wb_uint(&w, 5), wb_str(&w, "medium"), wb_str(&w, "");
    struct kvb_batch b;
    ck_assert_int_eq(kvb_decode_batch(kvb_pipeline_decoder(p), w.p, w.len, &b), 0);
    ck_assert_int_eq(b.events[0].type, KVB_EV_UNKNOWN);
    ck_assert_uint_eq(b.events[0].tag.len, 0);
    ck_assert_int_eq(b.events[1].type, KVB_EV_STORED);
    ck_assert_uint_eq(b.events[1].lora_name.len, 0);
    ck_assert_int_eq(b.events[2].type, KVB_EV_REMOVED);
    struct kvb_stream s;
    kvb_stream_init(&s, "empty", 0);
    /* "" is an absent medium (Dynamo's reading): device, not unknown */
    ck_assert_int_eq(apply_wb(&w, &s, 0), 3);
    ck_assert_uint_eq(kvb_get(&m.unknown_medium_total[0]), 0);
}
END_TEST

/* Every file in tests/fuzz/regressions/fuzz_decode/ through the pipeline (as
 * fuzz_decode does, auto block size) and every file in .../fuzz_config/
 * through kvb_config_load: nothing crashes (make check-asan and
 * check-valgrind also see what a plain build cannot). */
static unsigned replay_dir(const char *dir, void (*fn)(const char *path))
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    unsigned n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        fprintf(stderr, "limits: replaying %s\n", path);
        fn(path);
        n++;
    }
    closedir(d);
    return n;
}

static void replay_decode(const char *path)
{
    struct kvb_pipeline_cfg c = test_pcfg(W, 0);
    c.convert.forward_tiers = (1u << KVB_TIER__COUNT) - 1;
    open_pipeline(&c);
    size_t len;
    uint8_t *pl = read_all(path, &len);
    uint8_t *exact = malloc(len ? len : 1);
    ck_assert(exact != NULL);
    memcpy(exact, pl, len);
    free(pl);
    struct kvb_stream s;
    kvb_stream_init(&s, "regression", 0);
    ck_assert_int_ge(feed(&s, 0, exact, len), 1);
    free(exact);
}

static void replay_config(const char *path)
{
    FILE *null = fopen("/dev/null", "w");
    ck_assert(null != NULL);
    struct kvb_config *cfg = NULL;
    int rc = kvb_config_load(path, &cfg, null);
    ck_assert(rc == 0 ? cfg != NULL : cfg == NULL);
    kvb_config_free(&cfg);
    fclose(null);
}

START_TEST(fuzz_regressions_replay)
{
    unsigned n = replay_dir("tests/fuzz/regressions/fuzz_decode", replay_decode);
    n += replay_dir("tests/fuzz/regressions/fuzz_config", replay_config);
    ck_assert_uint_ge(n, 1);
}
END_TEST

/* ---- config: files that never end ------------------------------------------ */

/* kvb_config_load(path) in a child that SIGALRM kills after 3 s: 1 when it
 * returned an error, 0 when it loaded, -1 when it blocked. */
static int load_bounded(const char *path)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        signal(SIGALRM, SIG_DFL); /* not Check's timeout handler (it kills the group) */
        alarm(3);
        FILE *null = fopen("/dev/null", "w");
        struct kvb_config *cfg = NULL;
        int rc = kvb_config_load(path, &cfg, null);
        kvb_config_free(&cfg);
        _exit(rc == 0 ? 0 : 1);
    }
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
        return -1;
    ck_assert(WIFEXITED(st));
    return WEXITSTATUS(st);
}

/* open() of a FIFO without O_NONBLOCK waits for a writer: `kvbridge -c FIFO
 * --check` hangs, and so does the loop thread on SIGHUP when the file or a
 * nats.*_file names one (config.c read_file() and open_named() check
 * S_ISREG only after the open). */
START_TEST(config_fifo_refused_not_waited_on)
{
    char dir[] = "/tmp/kvb-limits.XXXXXX";
    ck_assert(mkdtemp(dir) != NULL);
    char fifo[128], yaml[128];
    snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
    snprintf(yaml, sizeof(yaml), "%s/kvbridge.yaml", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    FILE *f = fopen(yaml, "w");
    ck_assert(f != NULL);
    fprintf(f,
            "worker_id: 1\nblock_size: 16\nsources:\n  - endpoint: tcp://127.0.0.1:5557\n"
            "nats:\n  servers: [nats://127.0.0.1:4222]\n  user: kvb\n"
            "  password_file: %s\n",
            fifo);
    fclose(f);
    int as_config = load_bounded(fifo);
    int as_secret = load_bounded(yaml);
    unlink(yaml);
    unlink(fifo);
    rmdir(dir);
    ck_assert_msg(as_config != -1, "kvb_config_load blocked on a FIFO as the configuration file");
    ck_assert_msg(as_secret != -1, "kvb_config_load blocked on a FIFO as nats.password_file");
    ck_assert_int_eq(as_config, 1);
    ck_assert_int_eq(as_secret, 1);
}
END_TEST

/* The engine sends batches, then its connection drops, and the loop reads
 * the monitor's "disconnected" before the batches still queued in the SUB
 * (a loop that lags behind).  Those batches came before the drop: they are
 * applied as they are, with no restart barrier (there is no replay endpoint
 * to prove continuity with), so no such drop publishes a spurious
 * "cleared". */
START_TEST(drop_after_queued_batches_no_barrier)
{
    struct kvb_pipeline_cfg c = test_pcfg(W, 16);
    open_pipeline(&c);
    struct net n;
    net_open(&n, KVB_MODE_CONNECT, false);
    size_t len;
    uint8_t *small = padded_batch(1, 100, &len);
    first_batch(&n, small, len); /* start barrier + seq 0 */
    for (uint64_t seq = 1; seq <= 5; seq++)
        publish(&n, seq, small, len);
    int linger = 2000; /* the engine exits: what it sent still goes out */
    zmq_setsockopt(n.xpub, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_close(n.xpub);
    n.xpub = NULL;
    uint64_t end = kvb_mono_ms() + 5000;
    for (;;) { /* the monitor has the drop (nothing of the SUB read yet) */
        ck_assert_msg(kvb_mono_ms() < end, "no disconnect event");
        zmq_pollitem_t it = {kvb_source_monitor(n.src), 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 50) > 0)
            break;
    }
    usleep(100 * 1000);             /* let the monitor report everything it has */
    kvb_source_read_monitor(n.src); /* the loop's order: events first */
    ck_assert_int_ge(kvb_source_read(n.src, 100), 0);
    ck_assert_uint_eq(out.n, 7); /* barrier + seq 0 + seqs 1..5 */
    ck_assert_uint_eq(count_str(out.text, "\"cleared\""), 1);
    free(small);
    net_close(&n);
}
END_TEST

static Suite *limits_suite(void)
{
    Suite *s = suite_create("limits");
    TCase *tc = tcase_create("encode");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, encode_widest_events_fit);
    tcase_add_loop_test(tc, encode_widest_from_engine_batch, 0,
                        (int)(sizeof(wide_n) / sizeof(wide_n[0])));
    suite_add_tcase(s, tc);

    tc = tcase_create("memory");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, big_payload_bounded, 0, (int)N_BIGCASES);
    suite_add_tcase(s, tc);

    tc = tcase_create("enforce");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, limit_events_exact);
    tcase_add_test(tc, limit_hashes_and_tokens_exact);
    tcase_add_test(tc, limit_depth_exact);
    tcase_add_test(tc, limit_defaults_match_config);
    suite_add_tcase(s, tc);

    tc = tcase_create("regressions");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, empty_strings);
    tcase_add_test(tc, fuzz_regressions_replay);
    suite_add_tcase(s, tc);

    tc = tcase_create("config");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, config_fifo_refused_not_waited_on);
    suite_add_tcase(s, tc);

    tc = tcase_create("payload");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, payload_live_oversize_bind_mode);
    tcase_add_test(tc, payload_live_oversize_connect_mode);
    tcase_add_test(tc, drop_after_queued_batches_no_barrier);
    tcase_add_test(tc, payload_live_oversize_counted);
    tcase_add_test(tc, payload_replay_oversize_refused);
    tcase_add_test(tc, nul_topics_are_their_own_streams);
    tcase_add_test(tc, replay_reply_topic_checked);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(limits_suite()); }
