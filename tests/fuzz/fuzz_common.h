/* Shared by the libFuzzer targets: a strict checker of the dynamo-json shape
 * (docs/router-events.md section 1) that also compares every value with the
 * kvb_rev it was encoded from, and an event_id tracker per dp_rank.
 *
 * A violated invariant calls fuzz_fail(), which prints what went wrong and
 * aborts: libFuzzer (or the standalone replayer) then keeps the input.
 */
#ifndef KVB_FUZZ_COMMON_H
#define KVB_FUZZ_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "convert.h"
#include "metrics.h"
#include "pipeline.h"
#include "publish.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

__attribute__((noreturn, format(printf, 1, 2))) static inline void fuzz_fail(const char *fmt, ...);
#include <stdarg.h>
static inline void fuzz_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("fuzz invariant violated: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

#define FUZZ_CHECK(cond, ...)       \
    do {                            \
        if (!(cond))                \
            fuzz_fail(__VA_ARGS__); \
    } while (0)

/* ---- dynamo-json shape ---------------------------------------------------- */

struct jcur {
    const char *p, *end;
};

static inline bool j_lit(struct jcur *c, const char *lit)
{
    size_t n = strlen(lit);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, lit, n) != 0)
        return false;
    c->p += n;
    return true;
}

/* An unsigned 64-bit decimal: no sign, no leading zero, no overflow. */
static inline bool j_u64(struct jcur *c, uint64_t *v)
{
    const char *s = c->p;
    uint64_t x = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        unsigned d = (unsigned)(*c->p - '0');
        if (x > (UINT64_MAX - d) / 10)
            return false;
        x = x * 10 + d;
        c->p++;
    }
    size_t n = (size_t)(c->p - s);
    if (n == 0 || (n > 1 && s[0] == '0'))
        return false;
    *v = x;
    return true;
}

static inline bool j_u64_eq(struct jcur *c, uint64_t want)
{
    uint64_t v;
    return j_u64(c, &v) && v == want;
}

/* Check that data[0..len) is exactly the dynamo-json encoding of r.  Returns
 * NULL when it is, or what is wrong. */
static inline const char *fuzz_json_matches(const struct kvb_rev *r, const char *data, size_t len)
{
    struct jcur c = {data, data + len};
    if (!j_lit(&c, "{\"worker_id\":") || !j_u64_eq(&c, r->worker_id))
        return "worker_id";
    /* a scoped "cleared" names its tier, device included; an unscoped one none */
    if (r->type == KVB_REVT_CLEARED ? r->scoped : r->tier != KVB_TIER_DEVICE) {
        const char *t = kvb_tier_name(r->tier);
        if (!t || !j_lit(&c, ",\"storage_tier\":\"") || !j_lit(&c, t) || !j_lit(&c, "\""))
            return "storage_tier";
    }
    if (!j_lit(&c, ",\"event\":{\"event_id\":") || !j_u64_eq(&c, r->event_id))
        return "event_id";
    if (!j_lit(&c, ",\"data\":"))
        return "data";
    switch (r->type) {
    case KVB_REVT_STORED:
        if (r->n == 0 || !r->blocks)
            return "stored event without blocks";
        if (!j_lit(&c, "{\"stored\":{\"parent_hash\":"))
            return "stored";
        if (r->has_parent ? !j_u64_eq(&c, r->parent) : !j_lit(&c, "null"))
            return "parent_hash";
        if (!j_lit(&c, ",\"blocks\":["))
            return "blocks";
        for (uint32_t i = 0; i < r->n; i++) {
            if ((i && !j_lit(&c, ",")) || !j_lit(&c, "{\"block_hash\":") ||
                !j_u64_eq(&c, r->blocks[i].block_hash) || !j_lit(&c, ",\"tokens_hash\":") ||
                !j_u64_eq(&c, r->blocks[i].tokens_hash) || !j_lit(&c, "}"))
                return "block";
        }
        if (!j_lit(&c, "]}}"))
            return "end of stored";
        break;
    case KVB_REVT_REMOVED:
        if (r->n == 0 || !r->hashes)
            return "removed event without hashes";
        if (!j_lit(&c, "{\"removed\":{\"block_hashes\":["))
            return "removed";
        for (uint32_t i = 0; i < r->n; i++)
            if ((i && !j_lit(&c, ",")) || !j_u64_eq(&c, r->hashes[i]))
                return "block_hashes";
        if (!j_lit(&c, "]}}"))
            return "end of removed";
        break;
    case KVB_REVT_CLEARED:
        if (r->n != 0 || (!r->scoped && r->tier != KVB_TIER_DEVICE))
            return "cleared with blocks, or unscoped with a tier";
        if (!j_lit(&c, "\"cleared\""))
            return "cleared";
        break;
    default: return "unknown router event type";
    }
    if (!j_lit(&c, ",\"dp_rank\":") || !j_u64_eq(&c, r->dp_rank))
        return "dp_rank";
    if (!j_lit(&c, "}}"))
        return "closing braces";
    if (c.p != c.end)
        return "bytes after the object";
    return NULL;
}

/* ---- event_id per dp_rank ------------------------------------------------ */

#define FUZZ_MAX_RANKS 128

struct id_track {
    uint32_t n;
    uint32_t rank[FUZZ_MAX_RANKS];
    uint64_t next[FUZZ_MAX_RANKS];
    uint64_t total; /* router events seen */
};

/* Every dp_rank starts at event_id 0 with a "cleared" (the start barrier),
 * then goes up by exactly 1. */
static inline void id_track_check(struct id_track *t, const struct kvb_rev *r)
{
    uint32_t i;
    for (i = 0; i < t->n; i++)
        if (t->rank[i] == r->dp_rank)
            break;
    if (i == t->n) {
        FUZZ_CHECK(t->n < FUZZ_MAX_RANKS, "more than %d dp_ranks", FUZZ_MAX_RANKS);
        FUZZ_CHECK(r->type == KVB_REVT_CLEARED,
                   "first router event of dp_rank %u is not \"cleared\" (type %u)", r->dp_rank,
                   r->type);
        t->rank[i] = r->dp_rank;
        t->next[i] = 0;
        t->n++;
    }
    FUZZ_CHECK(r->event_id == t->next[i], "dp_rank %u: event_id %llu, want %llu", r->dp_rank,
               (unsigned long long)r->event_id, (unsigned long long)t->next[i]);
    t->next[i]++;
    t->total++;
}

static inline void check_emitted(struct id_track *t, const struct kvb_rev *r, const char *data,
                                 size_t len, uint64_t worker_id)
{
    FUZZ_CHECK(r->worker_id == worker_id, "worker_id %llu, want %llu",
               (unsigned long long)r->worker_id, (unsigned long long)worker_id);
    const char *why = fuzz_json_matches(r, data, len);
    FUZZ_CHECK(why == NULL, "router event JSON does not match its event (%s): %.*s", why,
               (int)(len > 400 ? 400 : len), data);
    id_track_check(t, r);
}

/* The pipeline on the daemon's publish stage, sink-less (dynamo-json):
 * every message goes to write(ctx, msg), msg->rev its router event. */
static inline void fuzz_pipeline(const struct kvb_pipeline_cfg *cfg, struct kvb_metrics *m,
                                 int (*write)(void *, const struct kvb_publish_msg *), void *ctx,
                                 struct kvb_publish **pub, struct kvb_pipeline **p)
{
    struct kvb_publish_cfg uc = {.format = KVB_FORMAT_DYNAMO_JSON,
                                 .subject = "fuzz",
                                 .namespace_ = "",
                                 .component = "",
                                 .endpoint = ""};
    FUZZ_CHECK(kvb_publish_create(&uc, m, 1, pub) == 0, "publish_create");
    struct kvb_publish_writer w = {.write = write, .ctx = ctx};
    kvb_publish_set_writer(*pub, &w);
    FUZZ_CHECK(kvb_pipeline_create(cfg, m, *pub, p) == 0, "pipeline_create");
}

#endif
