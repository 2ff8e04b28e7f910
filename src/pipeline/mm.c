/* mm: multimodal pad-value substitution, as Dynamo's kv-router computes it
 * (lib/kv-router/src/protocols.rs pad_value_for_mm_hash(); zmq_wire/convert.rs
 * substitute_pad_values(); docs/router-events.md). */
#include "mm.h"

#include <stdbool.h>
#include <stdlib.h>

uint32_t kvb_mm_pad_value(uint64_t mm_hash)
{
    return (uint32_t)(KVB_MM_PAD_SHIFT + (mm_hash & KVB_MM_PAD_MASK));
}

size_t kvb_mm_pad_substitute(const uint32_t *tokens, size_t n, uint32_t image_token_id,
                             const uint64_t *mm, size_t n_mm, uint32_t *out)
{
    size_t runs = 0, obj = 0;
    uint32_t pad = 0;
    int in_run = 0;
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] == image_token_id) {
            if (!in_run) {
                /* One mm hash per run, in order; extra runs take the last. */
                in_run = 1;
                runs++;
                pad = kvb_mm_pad_value(mm[obj < n_mm ? obj : n_mm - 1]);
            }
            out[i] = pad;
        } else {
            if (in_run) {
                in_run = 0;
                obj++;
            }
            out[i] = tokens[i];
        }
    }
    return runs;
}

static enum kvb_mm_kind kind_of_token(uint32_t t, uint32_t img, uint32_t vid)
{
    if (img && t == img)
        return KVB_MM_IMAGE;
    if (vid && t == vid)
        return KVB_MM_VIDEO;
    return KVB_MM_NONE;
}

enum kvb_mm_kind kvb_mm_block_kind(const uint32_t *tokens, size_t n, uint32_t image_token_id,
                                   uint32_t video_token_id)
{
    if (image_token_id && image_token_id == video_token_id)
        return KVB_MM_NONE;
    enum kvb_mm_kind seen = KVB_MM_NONE;
    for (size_t i = 0; i < n; i++) {
        enum kvb_mm_kind k = kind_of_token(tokens[i], image_token_id, video_token_id);
        if (k == KVB_MM_NONE)
            continue;
        if (seen != KVB_MM_NONE && seen != k)
            return KVB_MM_NONE; /* mixed: says nothing about its object */
        seen = k;
    }
    return seen;
}

static int cmp_kind(const void *a, const void *b)
{
    const struct kvb_mm_kind_of *x = a, *y = b;
    return (x->hash > y->hash) - (x->hash < y->hash);
}

size_t kvb_mm_kinds_finish(struct kvb_mm_kind_of *k, size_t n)
{
    qsort(k, n, sizeof(*k), cmp_kind);
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        bool agree = true;
        for (; j < n && k[j].hash == k[i].hash; j++)
            agree = agree && k[j].kind == k[i].kind;
        if (agree)
            k[w++] = k[i];
        i = j;
    }
    return w;
}

static enum kvb_mm_kind inferred(const struct kvb_mm_kind_of *k, size_t n, uint64_t h)
{
    struct kvb_mm_kind_of key = {.hash = h};
    const struct kvb_mm_kind_of *f = n ? bsearch(&key, k, n, sizeof(*k), cmp_kind) : NULL;
    return f ? (enum kvb_mm_kind)f->kind : KVB_MM_NONE;
}

/* Object kinds KIND[0..g) into MAP[0..g) as indexes of MM: the groups in
 * order when g == n_mm and no inferred kind contradicts, else the one
 * subsequence of MM with matching inferred kinds.  A subsequence match is
 * unique exactly when the leftmost greedy match equals the rightmost one
 * (every match lies between them), which is what Dynamo's search for
 * "exactly one solution" (find_unique_object_mapping()) decides. */
static bool map_objects(const uint32_t *kind, size_t g, const uint64_t *mm, size_t n_mm,
                        const struct kvb_mm_kind_of *ks, size_t nk, uint32_t *map)
{
    if (g == n_mm) {
        for (size_t i = 0; i < g; i++) {
            enum kvb_mm_kind k = inferred(ks, nk, mm[i]);
            if (k != KVB_MM_NONE && k != kind[i])
                return false;
            map[i] = (uint32_t)i;
        }
        return true;
    }
    size_t j = 0;
    for (size_t i = 0; i < g; i++, j++) {
        while (j < n_mm && inferred(ks, nk, mm[j]) != kind[i])
            j++;
        if (j == n_mm)
            return false;
        map[i] = (uint32_t)j;
    }
    j = n_mm;
    for (size_t i = g; i-- > 0;) {
        while (j-- > 0 && inferred(ks, nk, mm[j]) != kind[i])
            ;
        if (map[i] != j)
            return false; /* two matches: Dynamo does not guess */
    }
    return true;
}

int kvb_mm_pad_substitute_aware(const uint32_t *tokens, size_t n, uint32_t image_token_id,
                                uint32_t video_token_id, const uint64_t *mm, size_t n_mm,
                                const struct kvb_mm_kind_of *kinds, size_t n_kinds, uint32_t *map,
                                uint32_t *out)
{
    if (image_token_id && image_token_id == video_token_id)
        return -1;
    /* pass 1: the objects' kinds, into OUT (there are at most n of them) */
    size_t g = 0;
    enum kvb_mm_kind prev_run = KVB_MM_NONE, cur = KVB_MM_NONE;
    for (size_t i = 0; i < n; i++) {
        enum kvb_mm_kind k = kind_of_token(tokens[i], image_token_id, video_token_id);
        if (k != KVB_MM_NONE && k != cur) {
            /* a new run; a video run after a video run is the same object */
            if (k == KVB_MM_IMAGE || prev_run != KVB_MM_VIDEO)
                out[g++] = k;
            prev_run = k;
        }
        cur = k;
    }
    if (g && !map_objects(out, g, mm, n_mm, kinds, n_kinds, map))
        return -1;
    /* pass 2: the tokens, each run's object found the same way */
    size_t obj = 0;
    prev_run = cur = KVB_MM_NONE;
    uint32_t pad = 0;
    for (size_t i = 0; i < n; i++) {
        enum kvb_mm_kind k = kind_of_token(tokens[i], image_token_id, video_token_id);
        if (k != KVB_MM_NONE && k != cur) {
            if (k == KVB_MM_IMAGE || prev_run != KVB_MM_VIDEO)
                obj++;
            prev_run = k;
            pad = kvb_mm_pad_value(mm[map[obj - 1]]);
        }
        cur = k;
        out[i] = k != KVB_MM_NONE ? pad : tokens[i];
    }
    return 0;
}
