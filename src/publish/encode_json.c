/* encode_json: router event -> dynamo-json.  See include/encode.h. */
#include "encode.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

struct kvb_encoder {
    char *buf;
    size_t cap;
};

int kvb_encoder_create(int format, struct kvb_encoder **out)
{
    if (format != KVB_FORMAT_DYNAMO_JSON)
        return -ENOTSUP;
    struct kvb_encoder *e = calloc(1, sizeof(*e));
    if (!e)
        return -ENOMEM;
    *out = e;
    return 0;
}

void kvb_encoder_destroy(struct kvb_encoder **pe)
{
    if (!pe || !*pe)
        return;
    free((*pe)->buf);
    free(*pe);
    *pe = NULL;
}

static const char digits2[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

static const uint32_t pow10_tab[9] = {1u,      10u,      100u,      1000u,     10000u,
                                      100000u, 1000000u, 10000000u, 100000000u};

/* Digits of v (< 10^8): log10 estimated from the bit length, corrected by
 * one compare. */
static inline unsigned dec_len32(uint32_t v)
{
    unsigned t = (unsigned)(32 - __builtin_clz(v | 1)) * 1233 >> 12;
    return t + 1 - (v < pow10_tab[t] && t > 0);
}

/* v < 10^8, written backwards two digits per step, in 32-bit arithmetic. */
static inline size_t put_small(char *p, uint32_t v)
{
    unsigned n = dec_len32(v);
    char *e = p + n;
    while (v >= 100) {
        unsigned r = v % 100;
        v /= 100;
        e -= 2;
        memcpy(e, digits2 + 2 * r, 2);
    }
    if (v >= 10) {
        e -= 2;
        memcpy(e, digits2 + 2 * v, 2);
    } else {
        *--e = (char)('0' + v);
    }
    return n;
}

/* Exactly 8 digits, leading zeros included (v < 10^8). */
static inline void put8(char *p, uint32_t v)
{
    uint32_t hi = v / 10000, lo = v % 10000;
    memcpy(p, digits2 + 2 * (hi / 100), 2);
    memcpy(p + 2, digits2 + 2 * (hi % 100), 2);
    memcpy(p + 4, digits2 + 2 * (lo / 100), 2);
    memcpy(p + 6, digits2 + 2 * (lo % 100), 2);
}

/* Split into 8-digit groups (one 64-bit division by a constant each, at
 * most two), the groups in 32-bit arithmetic: hashes have 19-20 digits. */
size_t kvb_u64_to_dec(char *p, uint64_t v)
{
    if (v < 100000000u)
        return put_small(p, (uint32_t)v);
    uint64_t hi = v / 100000000u;
    uint32_t lo = (uint32_t)(v % 100000000u);
    size_t n;
    if (hi < 100000000u) {
        n = put_small(p, (uint32_t)hi);
    } else {
        n = put_small(p, (uint32_t)(hi / 100000000u));
        put8(p + n, (uint32_t)(hi % 100000000u));
        n += 8;
    }
    put8(p + n, lo);
    return n + 8;
}

#define LIT(p, s) (memcpy((p), (s), sizeof(s) - 1), (p) += sizeof(s) - 1)
#define U64(p, v) ((p) += kvb_u64_to_dec((p), (v)))

int kvb_encode(struct kvb_encoder *e, const struct kvb_rev *r, const char **data, size_t *len)
{
    /* Worst case: the fixed text (< 200 bytes with five 20-digit numbers and
     * the longest tier) + per block {"block_hash":U64,"tokens_hash":U64},
     * (71 bytes) or per removed hash U64, (21 bytes). */
    size_t need = 256 + (size_t)r->n * 72;
    if (r->n_mm) /* ,"mm_extra_info":{"mm_objects":[..]} per block, 46 bytes per object */
        need += (size_t)r->n * 40 + (size_t)r->n_mm * 48;
    if (need > e->cap) {
        size_t cap = e->cap ? e->cap : 1024;
        while (cap < need)
            cap *= 2;
        char *b = realloc(e->buf, cap);
        if (!b)
            return -ENOMEM;
        e->buf = b;
        e->cap = cap;
    }
    char *p = e->buf;
    LIT(p, "{\"worker_id\":");
    U64(p, r->worker_id);
    /* A scoped "cleared" names its tier, device included; an unscoped one
     * none (every tier); any other event its tier unless device. */
    bool cleared = r->type == KVB_REVT_CLEARED;
    if (cleared ? r->scoped : r->tier != KVB_TIER_DEVICE) {
        const char *t = kvb_tier_name(r->tier);
        size_t n = strlen(t);
        LIT(p, ",\"storage_tier\":\"");
        memcpy(p, t, n);
        p += n;
        *p++ = '"';
    }
    LIT(p, ",\"event\":{\"event_id\":");
    U64(p, r->event_id);
    LIT(p, ",\"data\":");
    switch (r->type) {
    case KVB_REVT_STORED:
        LIT(p, "{\"stored\":{\"parent_hash\":");
        if (r->has_parent)
            U64(p, r->parent);
        else
            LIT(p, "null");
        LIT(p, ",\"blocks\":[");
        for (uint32_t i = 0; i < r->n; i++) {
            if (i)
                *p++ = ',';
            LIT(p, "{\"block_hash\":");
            U64(p, r->blocks[i].block_hash);
            LIT(p, ",\"tokens_hash\":");
            U64(p, r->blocks[i].tokens_hash);
            /* Dynamo's KvCacheStoredBlockData; written only when the block
             * has multimodal objects (Dynamo itself writes null otherwise) */
            if (r->n_mm && r->mm_off[i + 1] > r->mm_off[i]) {
                LIT(p, ",\"mm_extra_info\":{\"mm_objects\":[");
                for (uint32_t k = r->mm_off[i]; k < r->mm_off[i + 1]; k++) {
                    if (k > r->mm_off[i])
                        *p++ = ',';
                    LIT(p, "{\"mm_hash\":");
                    U64(p, r->mm_hashes[k]);
                    LIT(p, ",\"offsets\":[]}");
                }
                LIT(p, "]}");
            }
            *p++ = '}';
        }
        LIT(p, "]}}");
        break;
    case KVB_REVT_REMOVED:
        LIT(p, "{\"removed\":{\"block_hashes\":[");
        for (uint32_t i = 0; i < r->n; i++) {
            if (i)
                *p++ = ',';
            U64(p, r->hashes[i]);
        }
        LIT(p, "]}}");
        break;
    default: LIT(p, "\"cleared\""); break;
    }
    LIT(p, ",\"dp_rank\":");
    U64(p, r->dp_rank);
    LIT(p, "}}");
    *data = e->buf;
    *len = (size_t)(p - e->buf);
    return 0;
}
