/* libFuzzer target: kvb_prom_parse() and kvb_engine_load_parse() on the
 * input as a /metrics page.  Seeds: every tests/data/metrics/ page (real vLLM and
 * SGLang pages, and the format's edge cases); dictionary
 * tests/fuzz/promtext.dict.
 *
 * Checked:
 *  - the parse returns 0 (malformed lines never fail it) and its counts add
 *    up: lines = samples + comments + malformed + blank lines, samples =
 *    callbacks, lines <= newlines + 1;
 *  - every sample points inside the (copied) input: its name is a valid
 *    metric name, at most KVB_PROM_MAX_LABELS labels with valid label names,
 *    each unescaped value no longer than the bytes it came from and at most
 *    KVB_PROM_MAX_LABEL_VALUE;
 *  - parsing is deterministic (a second copy gives the same counts and the
 *    same sample hash);
 *  - for both engine kinds, the load parse returns 0, has at most
 *    KVB_LOAD_MAX_RANKS distinct ranks, matched <= samples of known names,
 *    and after kvb_engine_load_finish() used blocks are within [0, total
 *    blocks] and the hit rate within [0, 1] whenever they are set.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/load.h"
#include "engine/promtext.h"
#include "fuzz_common.h"

struct walk {
    const char *lo, *hi; /* the copy being parsed */
    uint64_t n;
    uint64_t hash;
};

static bool name_ok(const char *p, size_t n, bool colon)
{
    if (n == 0 || n > KVB_PROM_MAX_NAME)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        bool a =
            (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
        if (!a && !(i > 0 && c >= '0' && c <= '9'))
            return false;
    }
    return true;
}

static bool inside(const struct walk *w, const char *p, size_t n)
{
    return p >= w->lo && p <= w->hi && n <= (size_t)(w->hi - p);
}

static void mix(uint64_t *h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        *h = (*h ^ b[i]) * 1099511628211ull;
}

static int on_sample(void *ctx, const struct kvb_prom_sample *s)
{
    struct walk *w = ctx;
    w->n++;
    FUZZ_CHECK(inside(w, s->name, s->name_len), "name outside the input");
    FUZZ_CHECK(name_ok(s->name, s->name_len, true), "bad metric name %.*s", (int)s->name_len,
               s->name);
    FUZZ_CHECK(s->n_labels <= KVB_PROM_MAX_LABELS, "%zu labels", s->n_labels);
    mix(&w->hash, s->name, s->name_len);
    for (size_t i = 0; i < s->n_labels; i++) {
        const struct kvb_prom_label *l = &s->labels[i];
        FUZZ_CHECK(inside(w, l->name, l->name_len), "label name outside the input");
        FUZZ_CHECK(name_ok(l->name, l->name_len, false), "bad label name");
        FUZZ_CHECK(inside(w, l->value, l->value_len), "label value outside the input");
        FUZZ_CHECK(l->value_len <= KVB_PROM_MAX_LABEL_VALUE, "label value %zu bytes", l->value_len);
        FUZZ_CHECK(l->value > l->name, "label value before its name");
        mix(&w->hash, l->name, l->name_len);
        mix(&w->hash, l->value, l->value_len);
    }
    uint64_t bits;
    double v = isnan(s->value) ? NAN : s->value; /* one NaN pattern */
    memcpy(&bits, &v, sizeof(bits));
    mix(&w->hash, &bits, sizeof(bits));
    if (s->has_timestamp)
        mix(&w->hash, &s->timestamp_ms, sizeof(s->timestamp_ms));
    return 0;
}

static void check_load(const uint8_t *data, size_t size, enum kvb_engine_kind kind, char *copy,
                       uint64_t samples)
{
    static struct kvb_engine_load l, prev;
    memcpy(copy, data, size);
    FUZZ_CHECK(kvb_engine_load_parse(kind, copy, size, &l) == 0, "load parse failed");
    FUZZ_CHECK(l.n_ranks <= KVB_LOAD_MAX_RANKS, "%u ranks", l.n_ranks);
    FUZZ_CHECK(l.prom.samples == samples, "load parse saw %llu samples, not %llu",
               (unsigned long long)l.prom.samples, (unsigned long long)samples);
    FUZZ_CHECK(l.matched <= samples * 3, "matched %llu of %llu", (unsigned long long)l.matched,
               (unsigned long long)samples);
    for (uint32_t i = 0; i < l.n_ranks; i++)
        for (uint32_t j = i + 1; j < l.n_ranks; j++)
            FUZZ_CHECK(l.rank[i].dp_rank != l.rank[j].dp_rank, "rank %u twice", l.rank[i].dp_rank);
    kvb_engine_load_finish(&l, size & 1 ? &prev : NULL, (uint32_t)(size % 33));
    for (uint32_t i = 0; i < l.n_ranks; i++) {
        const struct kvb_rank_load *r = &l.rank[i];
        if (kvb_load_has(r, KVB_LOAD_USED_BLOCKS)) {
            double u = r->v[KVB_LOAD_USED_BLOCKS];
            FUZZ_CHECK(kvb_load_has(r, KVB_LOAD_TOTAL_BLOCKS), "used blocks without a total");
            FUZZ_CHECK(u >= 0 && u <= r->v[KVB_LOAD_TOTAL_BLOCKS], "used %g of %g blocks", u,
                       r->v[KVB_LOAD_TOTAL_BLOCKS]);
        }
        if (kvb_load_has(r, KVB_LOAD_HIT_RATE) && kind == KVB_ENGINE_VLLM) {
            double h = r->v[KVB_LOAD_HIT_RATE];
            FUZZ_CHECK(h >= 0 && h <= 1, "hit rate %g", h);
        }
    }
    prev = l;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *copy = malloc(size ? size : 1);
    FUZZ_CHECK(copy != NULL, "malloc");
    struct kvb_prom_stats st[2];
    struct walk w[2];
    for (int k = 0; k < 2; k++) {
        memcpy(copy, data, size);
        w[k] = (struct walk){copy, copy + size, 0, 1469598103934665603ull};
        FUZZ_CHECK(kvb_prom_parse(copy, size, on_sample, &w[k], &st[k]) == 0, "parse failed");
        FUZZ_CHECK(w[k].n == st[k].samples, "%llu callbacks, %llu samples",
                   (unsigned long long)w[k].n, (unsigned long long)st[k].samples);
    }
    FUZZ_CHECK(memcmp(&st[0], &st[1], sizeof(st[0])) == 0 && w[0].hash == w[1].hash,
               "two parses differ");
    uint64_t newlines = 0, blank = 0;
    const char *p = (const char *)data, *end = p + size;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        newlines += nl != NULL;
        const char *b = p;
        while (b < le && (*b == ' ' || *b == '\t'))
            b++;
        if (b == le || (b + 1 == le && *b == '\r'))
            blank++;
        p = nl ? nl + 1 : end;
    }
    FUZZ_CHECK(st[0].lines <= newlines + 1, "%llu lines, %llu newlines",
               (unsigned long long)st[0].lines, (unsigned long long)newlines);
    FUZZ_CHECK(st[0].lines == st[0].samples + st[0].comments + st[0].malformed + blank,
               "lines %llu != samples %llu + comments %llu + malformed %llu + blank %llu",
               (unsigned long long)st[0].lines, (unsigned long long)st[0].samples,
               (unsigned long long)st[0].comments, (unsigned long long)st[0].malformed,
               (unsigned long long)blank);
    check_load(data, size, KVB_ENGINE_VLLM, copy, st[0].samples);
    check_load(data, size, KVB_ENGINE_SGLANG, copy, st[0].samples);
    free(copy);
    return 0;
}
