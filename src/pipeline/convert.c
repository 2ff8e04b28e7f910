/* convert: decoded engine events -> router events.  See include/convert.h. */
#include "convert.h"
#include "mm.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "grow.h"
#include "track.h"

struct kvb_converter {
    struct kvb_convert_cfg cfg;
    struct kvb_metrics *m;
    uint64_t epoch;

    struct kvb_id_counter *ctr; /* few entries: linear scan with a last-hit cache */
    bool *clean;                /* per counter: its last router event was a "cleared" */
    size_t n_ctr, cap_ctr;
    size_t last_hit;

    bool has_ns;      /* cfg.cache_namespace given: its term of the seed */
    uint64_t ns_term; /* XXH3_64(cache_namespace, seed 1) */

    struct kvb_track *track; /* kinds, namespaces and copies (track.h) */
    bool overflow;           /* the tracker was full since the last take */

    struct kvb_block *blocks; /* scratch for one event, grows to the largest seen */
    uint64_t *hashes;
    size_t cap_blocks, cap_hashes;
    uint64_t *mm, *mm_sorted; /* multimodal hashes of one event / of one block */
    uint32_t *mm_off;         /* per block of one event, + 1 */
    size_t cap_mm, cap_mm_sorted, cap_mm_off;
    uint32_t *pad; /* one block's tokens, pad-substituted (mm.h) */
    size_t cap_pad;
    uint32_t *map; /* one block's objects -> its mm hashes (video_token_id) */
    size_t cap_map;
    struct kvb_mm_kind_of *kinds; /* one event's inferred mm kinds */
    size_t cap_kinds, n_kinds;
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    uint32_t *le_tokens;
    size_t cap_le;
#endif
};

static void set_cfg(struct kvb_converter *c, const struct kvb_convert_cfg *cfg)
{
    c->cfg = *cfg;
    c->cfg.cache_namespace = NULL; /* borrowed: keep only its hash */
    size_t n = cfg->cache_namespace ? strlen(cfg->cache_namespace) : 0;
    c->has_ns = n > 0;
    c->ns_term = n ? XXH3_64bits_withSeed(cfg->cache_namespace, n, 1) : 0;
}

int kvb_converter_create(const struct kvb_convert_cfg *cfg, struct kvb_metrics *m,
                         struct kvb_converter **out)
{
    struct kvb_converter *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    set_cfg(c, cfg);
    c->m = m;
    if (kvb_track_create(cfg->max_tracked, &c->track) < 0) {
        free(c);
        return -ENOMEM;
    }
    *out = c;
    return 0;
}

void kvb_converter_destroy(struct kvb_converter **pc)
{
    if (!pc || !*pc)
        return;
    struct kvb_converter *c = *pc;
    kvb_track_destroy(&c->track);
    free(c->ctr);
    free(c->clean);
    free(c->blocks);
    free(c->hashes);
    free(c->mm);
    free(c->mm_sorted);
    free(c->mm_off);
    free(c->pad);
    free(c->map);
    free(c->kinds);
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    free(c->le_tokens);
#endif
    free(c);
    *pc = NULL;
}

void kvb_converter_set_config(struct kvb_converter *c, const struct kvb_convert_cfg *cfg)
{
    set_cfg(c, cfg);
    kvb_track_set_max(c->track, cfg->max_tracked);
}

static struct kvb_pair pair_of(const struct kvb_converter *c, uint32_t rank)
{
    return (struct kvb_pair){c->cfg.worker_id, rank};
}

void kvb_converter_forget(struct kvb_converter *c, uint32_t dp_rank)
{
    kvb_track_reset_pair(c->track, pair_of(c, dp_rank));
    kvb_set(&c->m->tracked_blocks[0], kvb_track_entries(c->track));
}

void kvb_converter_track_foreach(const struct kvb_converter *c,
                                 void (*cb)(void *ctx, const struct kvb_track_rec *r), void *ctx)
{
    kvb_track_foreach(c->track, cb, ctx);
}

int kvb_converter_track_restore(struct kvb_converter *c, const struct kvb_track_rec *r)
{
    int rc = kvb_track_put(c->track, r);
    if (rc == -ENOSPC)
        c->overflow = true;
    kvb_set(&c->m->tracked_blocks[0], kvb_track_entries(c->track));
    return rc;
}

bool kvb_converter_take_overflow(struct kvb_converter *c)
{
    if (!c->overflow)
        return false;
    c->overflow = false;
    kvb_track_reset(c->track);
    kvb_set(&c->m->tracked_blocks[0], 0);
    kvb_inc(&c->m->tracker_overflows_total[0]);
    return true;
}

struct kvb_worker_cfg kvb_convert_cfg_worker(const struct kvb_convert_cfg *cfg)
{
    return (struct kvb_worker_cfg){cfg->worker_id,      cfg->block_size,    cfg->lora_salt,
                                   cfg->forward_tiers,  cfg->lora_names,    cfg->n_lora_names,
                                   cfg->image_token_id, cfg->video_token_id};
}

void kvb_converter_select(struct kvb_converter *c, const struct kvb_worker_cfg *w)
{
    c->cfg.worker_id = w->worker_id;
    c->cfg.block_size = w->block_size;
    c->cfg.lora_salt = w->lora_salt;
    c->cfg.forward_tiers = w->forward_tiers;
    c->cfg.lora_names = w->lora_names;
    c->cfg.n_lora_names = w->n_lora_names;
    c->cfg.image_token_id = w->image_token_id;
    c->cfg.video_token_id = w->video_token_id;
}

bool kvb_converter_has_counter(const struct kvb_converter *c, uint64_t worker, uint32_t rank)
{
    if (c->last_hit < c->n_ctr && c->ctr[c->last_hit].worker_id == worker &&
        c->ctr[c->last_hit].dp_rank == rank)
        return true; /* the common case: the pair of the last event */
    for (size_t i = 0; i < c->n_ctr; i++)
        if (c->ctr[i].worker_id == worker && c->ctr[i].dp_rank == rank)
            return true;
    return false;
}

void kvb_converter_set_epoch(struct kvb_converter *c, uint64_t epoch_ms) { c->epoch = epoch_ms; }

/* ---- event_id counters -------------------------------------------------- */

static struct kvb_id_counter *counter(struct kvb_converter *c, uint64_t worker, uint32_t rank)
{
    if (c->last_hit < c->n_ctr) {
        struct kvb_id_counter *k = &c->ctr[c->last_hit];
        if (k->worker_id == worker && k->dp_rank == rank)
            return k;
    }
    for (size_t i = 0; i < c->n_ctr; i++) {
        struct kvb_id_counter *k = &c->ctr[i];
        if (k->worker_id == worker && k->dp_rank == rank) {
            c->last_hit = i;
            return k;
        }
    }
    if (c->n_ctr >= KVB_MAX_ID_COUNTERS)
        return NULL;
    if (c->n_ctr == c->cap_ctr) {
        size_t cap = c->cap_ctr ? c->cap_ctr * 2 : 8;
        struct kvb_id_counter *n = realloc(c->ctr, cap * sizeof(*n));
        if (!n)
            return NULL;
        c->ctr = n;
        bool *cl = realloc(c->clean, cap * sizeof(*cl));
        if (!cl)
            return NULL;
        c->clean = cl;
        c->cap_ctr = cap;
    }
    struct kvb_id_counter *k = &c->ctr[c->n_ctr];
    *k = (struct kvb_id_counter){worker, rank, 0, c->epoch};
    c->clean[c->n_ctr] = false;
    c->last_hit = c->n_ctr++;
    return k;
}

int kvb_convert_pair_state(const struct kvb_converter *c, uint32_t dp_rank)
{
    for (size_t i = 0; i < c->n_ctr; i++)
        if (c->ctr[i].worker_id == c->cfg.worker_id && c->ctr[i].dp_rank == dp_rank)
            return c->clean[i] ? KVB_PAIR_CLEAN : KVB_PAIR_DIRTY;
    return KVB_PAIR_NONE;
}

size_t kvb_converter_counters(const struct kvb_converter *c, struct kvb_id_counter *out, size_t cap)
{
    size_t n = c->n_ctr < cap ? c->n_ctr : cap;
    for (size_t i = 0; i < n; i++)
        out[i] = c->ctr[i];
    return c->n_ctr;
}

int kvb_converter_restore(struct kvb_converter *c, const struct kvb_id_counter *in)
{
    struct kvb_id_counter *k = counter(c, in->worker_id, in->dp_rank);
    if (!k)
        return -ENOSPC;
    k->next_id = in->next_id;
    k->epoch = in->epoch;
    return 0;
}

static int take_id(struct kvb_converter *c, uint32_t rank, struct kvb_rev *out)
{
    struct kvb_id_counter *k = counter(c, c->cfg.worker_id, rank);
    if (!k)
        return -ENOSPC;
    out->worker_id = c->cfg.worker_id;
    out->dp_rank = rank;
    out->event_id = k->next_id++;
    c->clean[k - c->ctr] = out->type == KVB_REVT_CLEARED && !out->scoped;
    out->epoch = k->epoch;
    out->repair = false;
    kvb_inc(&c->m->router_events_published_total[out->type]);
    return 1;
}

void kvb_convert_give_back(struct kvb_converter *c, const struct kvb_rev *r)
{
    struct kvb_id_counter *k = counter(c, r->worker_id, r->dp_rank);
    if (!k || k->epoch != r->epoch || k->next_id != r->event_id + 1)
        return; /* not the pair's last id: keep the counter as it is */
    k->next_id--;
    /* single writer: adding 2^64 - 1 is taking one away */
    kvb_add(&c->m->router_events_published_total[r->type], UINT64_MAX);
}

/* ---- building blocks ---------------------------------------------------- */

uint64_t kvb_hash_normalize(const struct kvb_hash *h)
{
    switch (h->kind) {
    case KVB_HASH_UINT: return h->v.u;
    case KVB_HASH_INT: return (uint64_t)h->v.i; /* two's-complement bit pattern */
    case KVB_HASH_BIN: {
        uint32_t n = h->bin_len < 8 ? h->bin_len : 8;
        const uint8_t *p = h->v.bin + (h->bin_len - n);
        uint64_t v = 0;
        // cppcheck-suppress knownConditionTrueFalse ; n is min(bin_len, 8), bin_len from the batch
        for (uint32_t i = 0; i < n; i++)
            v = v << 8 | p[i];
        return v;
    }
    default: return 0;
    }
}

uint64_t kvb_lora_seed(const char *name, size_t len)
{
    return KVB_TOKENS_HASH_SEED + XXH3_64bits_withSeed(name, len, 0);
}

uint64_t kvb_salt_seed(const char *lora, size_t lora_len, const char *ns, size_t ns_len)
{
    uint64_t seed = KVB_TOKENS_HASH_SEED;
    if (lora_len)
        seed += XXH3_64bits_withSeed(lora, lora_len, 0);
    if (ns_len)
        seed += XXH3_64bits_withSeed(ns, ns_len, 1);
    return seed;
}

static void le_u32s(XXH3_state_t *st, const uint32_t *v, size_t n)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    XXH3_64bits_update(st, v, n * sizeof(*v));
#else
    uint8_t buf[4 * 64];
    while (n) {
        size_t k = n < 64 ? n : 64;
        for (size_t i = 0; i < k; i++)
            for (int b = 0; b < 4; b++)
                buf[4 * i + b] = (uint8_t)(v[i] >> (8 * b));
        XXH3_64bits_update(st, buf, 4 * k);
        v += k;
        n -= k;
    }
#endif
}

uint64_t kvb_tokens_mm_hash(const uint32_t *tokens, size_t n, const uint64_t *mm, size_t n_mm,
                            uint64_t seed)
{
    if (n_mm == 0)
        return kvb_tokens_hash(tokens, n, seed);
    XXH3_state_t st;
    memset(&st, 0, sizeof(st)); /* XXH3_INITSTATE, and quiets -Wmaybe-uninitialized */
    XXH3_64bits_reset_withSeed(&st, seed);
    le_u32s(&st, tokens, n);
    for (size_t i = 0; i < n_mm; i++) {
        uint8_t b[8];
        for (int k = 0; k < 8; k++)
            b[k] = (uint8_t)(mm[i] >> (8 * k));
        XXH3_64bits_update(&st, b, 8);
    }
    return XXH3_64bits_digest(&st);
}

static int hex_digit(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

bool kvb_mm_identifier_hash(const struct kvb_str *id, bool with_offset, uint64_t *out)
{
    if (!id->ptr || id->len == 0)
        return false;
    if (id->len == 64) {
        uint64_t v = 0;
        uint32_t i = 0;
        for (; i < 64; i++) {
            int d = hex_digit(id->ptr[i]);
            if (d < 0)
                break;
            if (i < 16)
                v = v << 4 | (uint64_t)d;
        }
        if (i == 64) {
            *out = v;
            return true;
        }
    }
    if (!with_offset)
        return false;
    *out = XXH3_64bits(id->ptr, id->len);
    return true;
}

uint64_t kvb_tokens_hash(const uint32_t *tokens, size_t n, uint64_t seed)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    /* The token array already is the little-endian uint32 byte string. */
    return XXH3_64bits_withSeed(tokens, n * sizeof(uint32_t), seed);
#else
    uint8_t buf[4 * 256];
    XXH3_state_t st;
    XXH3_64bits_reset_withSeed(&st, seed);
    while (n) {
        size_t k = n < 256 ? n : 256;
        for (size_t i = 0; i < k; i++) {
            buf[4 * i] = tokens[i] & 0xff;
            buf[4 * i + 1] = tokens[i] >> 8 & 0xff;
            buf[4 * i + 2] = tokens[i] >> 16 & 0xff;
            buf[4 * i + 3] = tokens[i] >> 24;
        }
        XXH3_64bits_update(&st, buf, 4 * k);
        tokens += k;
        n -= k;
    }
    return XXH3_64bits_digest(&st);
#endif
}

/* Dynamo's StorageTier::from_kv_medium (protocols.rs): exact,
 * case-sensitive names; an empty medium is an absent one. */
int kvb_tier_from_medium(const struct kvb_str *medium, bool *unknown)
{
    static const struct {
        const char *name;
        int tier;
    } map[] = {
        {"GPU", KVB_TIER_DEVICE},
        {"DEVICE", KVB_TIER_DEVICE},
        {"CPU", KVB_TIER_HOST_PINNED},
        {"CPU_PINNED", KVB_TIER_HOST_PINNED},
        {"CPU_TIER1", KVB_TIER_HOST_PINNED},
        {"CPU_TIER2", KVB_TIER_DISK},
        {"DISK", KVB_TIER_DISK},
        {"NVME", KVB_TIER_DISK},
        {"STORAGE", KVB_TIER_DISK},
        {"EXTERNAL", KVB_TIER_EXTERNAL},
        {"NETWORK", KVB_TIER_EXTERNAL},
        {"REMOTE", KVB_TIER_EXTERNAL},
        {"SHARED", KVB_TIER_EXTERNAL},
    };
    *unknown = false;
    if (!medium->ptr || medium->len == 0)
        return KVB_TIER_DEVICE;
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (medium->len == strlen(map[i].name) &&
            memcmp(medium->ptr, map[i].name, medium->len) == 0)
            return map[i].tier;
    *unknown = true;
    return KVB_TIER_DEVICE;
}

/* ---- conversion --------------------------------------------------------- */

static int drop(struct kvb_converter *c, int reason, int *why)
{
    kvb_inc(&c->m->events_dropped_total[reason]);
    *why = reason;
    return 0;
}

static bool str_is(const struct kvb_str *s, const char *lit)
{
    size_t n = strlen(lit);
    return s->ptr && s->len == n && memcmp(s->ptr, lit, n) == 0;
}

/* Steps 1-3 of Dynamo's preprocess (zmq_wire/mod.rs,
 * preprocess_with_reason and preprocess_residency_with_reason): ownership,
 * locality, medium.  A drop reason, or -1 with *tier set and *lower true for
 * disk and external (which skip the group and namespace rules). */
static int relay_filters(struct kvb_converter *c, const struct kvb_event *ev, int *tier,
                         bool *lower)
{
    if (ev->ownership.ptr)
        return str_is(&ev->ownership, "kvcr") ? KVB_DROP_UNSUPPORTED_OWNERSHIP
                                              : KVB_DROP_UNKNOWN_OWNERSHIP;
    if (ev->locality.ptr && !str_is(&ev->locality, "LOCAL"))
        return KVB_DROP_NON_LOCAL_LOCALITY;
    bool unknown;
    *tier = kvb_tier_from_medium(&ev->medium, &unknown);
    if (unknown) {
        kvb_inc(&c->m->unknown_medium_total[0]);
        return KVB_DROP_UNKNOWN_MEDIUM;
    }
    *lower = *tier == KVB_TIER_DISK || *tier == KVB_TIER_EXTERNAL;
    return -1;
}

/* Steps 4-5 (learn_metadata, filter_reason): a store with group and kind
 * teaches the kind of (pair, group); an event's own kind, else its group's
 * learned kind, judges it; an unlearned group other than 0 is dropped. */
static int group_filter(struct kvb_converter *c, const struct kvb_event *ev, uint32_t rank)
{
    struct kvb_pair p = pair_of(c, rank);
    int own = ev->spec_kind.ptr ? kvb_kind_of(ev->spec_kind.ptr, ev->spec_kind.len) : 0;
    if (ev->type == KVB_EV_STORED && own && ev->group_idx.has)
        kvb_track_learn(c->track, p, ev->group_idx.v, own);
    if (own)
        return own == KVB_KIND_MAIN      ? -1
               : own == KVB_KIND_UNKNOWN ? KVB_DROP_UNKNOWN_KIND
                                         : KVB_DROP_NON_MAIN_ATTENTION_KIND;
    if (!ev->group_idx.has)
        return -1;
    int learned = kvb_track_kind(c->track, p, ev->group_idx.v);
    if (learned == KVB_KIND_NONE)
        return ev->group_idx.v == 0 ? -1 : KVB_DROP_UNLEARNED_GROUP_IDX;
    return learned == KVB_KIND_MAIN      ? -1
           : learned == KVB_KIND_UNKNOWN ? KVB_DROP_UNKNOWN_KIND
                                         : KVB_DROP_NON_MAIN_ATTENTION_GROUP;
}

static void tracker_full(struct kvb_converter *c, int rc)
{
    if (rc == -ENOSPC)
        c->overflow = true;
}

static bool str_eq_str(const struct kvb_str *a, const struct kvb_str *b)
{
    return a->ptr && b->ptr && a->len == b->len && memcmp(a->ptr, b->ptr, a->len) == 0;
}

/* Dynamo's extra_keys_to_cache_namespace(): in the first block's entry, the
 * first bare string tagged "dynamo-cache-salt:" (after skipping one item equal
 * to the LoRA name), the tag stripped; empty = none. */
static bool xkeys_namespace(const struct kvb_event *ev, struct kvb_str *ns)
{
    if (ev->n_xkey_blocks == 0)
        return false;
    static const size_t plen = sizeof(KVB_CACHE_SALT_PREFIX) - 1;
    bool lora_pending = ev->lora_name.len > 0;
    for (uint32_t k = ev->xkey_off[0]; k < ev->xkey_off[1]; k++) {
        const struct kvb_extra_key *x = &ev->xkeys[k];
        if (x->with_offset)
            continue;
        if (lora_pending && str_eq_str(&x->s, &ev->lora_name)) {
            lora_pending = false;
            continue;
        }
        if (x->s.len > plen && memcmp(x->s.ptr, KVB_CACHE_SALT_PREFIX, plen) == 0) {
            ns->ptr = x->s.ptr + plen;
            ns->len = x->s.len - (uint32_t)plen;
            return true;
        }
    }
    return false;
}

int kvb_lora_name_of(const struct kvb_lora_name_cfg *names, size_t n, const struct kvb_event *ev,
                     struct kvb_str *name)
{
    if (ev->lora_name.len > 0) {
        *name = ev->lora_name;
        return KVB_LORA_NAMED;
    }
    if (!ev->lora_id.has)
        return KVB_LORA_NONE;
    for (size_t i = 0; ev->lora_id.v >= 0 && i < n; i++)
        if (names[i].id == (uint64_t)ev->lora_id.v) {
            *name = (struct kvb_str){names[i].name, (uint32_t)strlen(names[i].name)};
            return KVB_LORA_NAMED;
        }
    return KVB_LORA_UNMAPPED;
}

/* A stored event's own cache namespace: its cache_salt, else its tagged
 * extra_keys salt.  *term: the namespace's term of the seed (never 0). */
static bool own_namespace(const struct kvb_event *ev, uint64_t *term)
{
    struct kvb_str ns = {NULL, 0};
    if (ev->cache_salt.len > 0)
        ns = ev->cache_salt;
    else
        xkeys_namespace(ev, &ns);
    if (ns.len == 0)
        return false;
    *term = XXH3_64bits_withSeed(ns.ptr, ns.len, 1);
    *term += *term == 0; /* 0 means none in the tracker */
    return true;
}

/* Step 6 for a store (propagate_cache_namespace): its own namespace, else
 * its parent's recorded one (ambiguous: dropped); every block hash recorded
 * under it.  A drop reason or -1; *has and *term: the namespace the blocks are
 * hashed under (none: the configured one). */
static int store_namespace(struct kvb_converter *c, const struct kvb_event *ev, uint32_t rank,
                           int tier, bool *has, uint64_t *term)
{
    struct kvb_pair p = pair_of(c, rank);
    *has = own_namespace(ev, term);
    if (!*has && ev->parent.kind != KVB_HASH_NIL) {
        int st = kvb_track_ns_get(c->track, p, kvb_hash_normalize(&ev->parent), term);
        if (st == KVB_NS_AMBIGUOUS)
            return KVB_DROP_AMBIGUOUS_CACHE_NAMESPACE;
        *has = st == KVB_NS_SET;
    }
    for (uint32_t i = 0; i < ev->n_hashes; i++)
        tracker_full(c, kvb_track_ns_store(c->track, p, kvb_hash_normalize(&ev->hashes[i]), *has,
                                           *has ? *term : 0, (uint8_t)tier));
    return -1;
}

/* The seed of one stored event: LoRA name (its own, or the one lora_names
 * gives its lora_id; unless lora_salt is off) and cache namespace (its own
 * or inherited one, else the configured one). */
static uint64_t event_seed(const struct kvb_converter *c, const struct kvb_event *ev, bool has_ns,
                           uint64_t ns_term)
{
    uint64_t seed = KVB_TOKENS_HASH_SEED;
    struct kvb_str lora;
    if (c->cfg.lora_salt &&
        kvb_lora_name_of(c->cfg.lora_names, c->cfg.n_lora_names, ev, &lora) == KVB_LORA_NAMED)
        seed = kvb_lora_seed(lora.ptr, lora.len);
    if (has_ns)
        seed += ns_term;
    else if (c->has_ns)
        seed += c->ns_term;
    return seed;
}

/* Block i's multimodal hashes (Dynamo's extra_keys_to_block_mm_infos), in
 * extra_keys order, appended at c->mm[*n]. */
static void block_mm(struct kvb_converter *c, const struct kvb_event *ev, uint32_t i, uint32_t *n)
{
    if (i >= ev->n_xkey_blocks)
        return;
    for (uint32_t k = ev->xkey_off[i]; k < ev->xkey_off[i + 1]; k++) {
        const struct kvb_extra_key *x = &ev->xkeys[k];
        if (!x->with_offset && str_eq_str(&x->s, &ev->lora_name))
            continue; /* a LoRA name that happens to be 64 hex digits */
        uint64_t h;
        if (kvb_mm_identifier_hash(&x->s, x->with_offset, &h))
            c->mm[(*n)++] = h;
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* A store that names one hash twice, or its parent as one of its blocks
 * (Dynamo's zmq_wire/convert.rs turns it into an empty remove).  Up to
 * DUP_SET_MAX hashes go into a set on the stack (open addressing, twice as
 * many slots); a longer store is sorted. */
#define DUP_SET_MAX 64u
static bool repeats_a_hash(struct kvb_converter *c, const struct kvb_event *ev)
{
    uint32_t n = ev->n_hashes + (ev->parent.kind != KVB_HASH_NIL);
    if (n < 2)
        return false;
    if (n <= DUP_SET_MAX) {
        uint64_t slot[2 * DUP_SET_MAX];
        uint8_t used[2 * DUP_SET_MAX] = {0};
        for (uint32_t i = 0; i < n; i++) {
            uint64_t h = kvb_hash_normalize(i < ev->n_hashes ? &ev->hashes[i] : &ev->parent);
            size_t j = (size_t)((h * 0x9e3779b97f4a7c15ULL) >> 57); /* 7 bits: 128 slots */
            for (; used[j]; j = (j + 1) & (2 * DUP_SET_MAX - 1))
                // cppcheck-suppress uninitvar ; slot[j] is read only where used[j] is set
                if (slot[j] == h)
                    return true;
            used[j] = 1;
            slot[j] = h;
        }
        return false;
    }
    if (kvb_grow((void **)&c->hashes, &c->cap_hashes, n, sizeof(*c->hashes)) < 0)
        return false; /* no room to look: not judged */
    for (uint32_t i = 0; i < ev->n_hashes; i++)
        c->hashes[i] = kvb_hash_normalize(&ev->hashes[i]);
    if (ev->parent.kind != KVB_HASH_NIL)
        c->hashes[n - 1] = kvb_hash_normalize(&ev->parent);
    qsort(c->hashes, n, sizeof(*c->hashes), cmp_u64);
    for (uint32_t i = 1; i < n; i++)
        if (c->hashes[i] == c->hashes[i - 1])
            return true;
    return false;
}

/* Every rule that may drop a store before its blocks are cut, in Dynamo's
 * order; then kvbridge's forward_tiers.  A drop reason or -1. */
static int stored_rules(struct kvb_converter *c, const struct kvb_event *ev, uint32_t rank,
                        int *tier, bool *has_ns, uint64_t *ns_term)
{
    bool lower = false;
    int r = relay_filters(c, ev, tier, &lower);
    *has_ns = false;
    if (r < 0 && !lower && (r = group_filter(c, ev, rank)) < 0)
        r = store_namespace(c, ev, rank, *tier, has_ns, ns_term);
    if (r >= 0)
        return r;
    if (repeats_a_hash(c, ev))
        return KVB_DROP_DUPLICATE_HASH;
    if (!(c->cfg.forward_tiers & (1u << *tier)))
        return KVB_DROP_TIER_FILTERED;
    return -1;
}

/* The copies a store adds (distinct (hash, group) holdings): its leading
 * blocks that the group already holds are repeats (vLLM's
 * kv_cache_report_mode: full), cut from the store.  Returns how many. */
static uint64_t hold_blocks(struct kvb_converter *c, const struct kvb_event *ev, uint32_t rank,
                            int tier, uint64_t nb)
{
    struct kvb_pair p = pair_of(c, rank);
    int64_t g = ev->group_idx.has ? ev->group_idx.v : -1;
    uint64_t lead = 0;
    bool leading = true;
    for (uint64_t i = 0; i < nb; i++) {
        int rc = kvb_track_hold(c->track, p, (uint8_t)tier, c->blocks[i].block_hash, g);
        tracker_full(c, rc);
        if (rc == 0 && leading)
            lead++;
        else
            leading = false;
    }
    kvb_set(&c->m->tracked_blocks[0], kvb_track_entries(c->track));
    return lead;
}

/* The tokens_hash of a block with K mm hashes at c->mm[off]: tokens plus
 * the sorted hashes, or, with image_token_id set (Dynamo's
 * create_stored_block_from_parts()), the tokens with image runs
 * pad-substituted (mm.h, hashes in extra_keys order) and no mm hashes;
 * c->pad then holds WINDOW tokens.  With video_token_id set, runs map to
 * hashes by modality (Dynamo's substitute_pad_values()), and a block that
 * maps no single way is hashed natively.  Out of line: the common block has
 * none. */
static __attribute__((noinline)) uint64_t mm_block_hash(struct kvb_converter *c, const uint32_t *t,
                                                        uint64_t window, uint32_t off, uint32_t k,
                                                        uint64_t seed)
{
    if (c->cfg.video_token_id) {
        if (kvb_mm_pad_substitute_aware(t, window, c->cfg.image_token_id, c->cfg.video_token_id,
                                        c->mm + off, k, c->kinds, c->n_kinds, c->map, c->pad) == 0)
            return kvb_tokens_hash(c->pad, window, seed);
    } else if (c->cfg.image_token_id) {
        kvb_mm_pad_substitute(t, window, c->cfg.image_token_id, c->mm + off, k, c->pad);
        return kvb_tokens_hash(c->pad, window, seed);
    }
    memcpy(c->mm_sorted, c->mm + off, k * sizeof(*c->mm));
    qsort(c->mm_sorted, k, sizeof(*c->mm_sorted), cmp_u64);
    return kvb_tokens_mm_hash(t, window, c->mm_sorted, k, seed);
}

/* With video_token_id: the kind of each mm hash that is a block's only one
 * and whose block holds placeholders of one kind, over every block of B
 * tokens the event has (Dynamo's infer_mm_object_kinds(): B tokens each,
 * not the EAGLE window), hashes given two kinds dropped.  c->mm[0..] is
 * scratch here: the blocks' hashes are gathered after. */
static int infer_kinds(struct kvb_converter *c, const struct kvb_event *ev, uint64_t bs,
                       uint64_t window)
{
    uint64_t nb = ev->n_tokens / bs;
    if (nb > ev->n_hashes)
        nb = ev->n_hashes;
    if (nb > ev->n_xkey_blocks)
        nb = ev->n_xkey_blocks;
    c->n_kinds = 0;
    if (kvb_grow((void **)&c->map, &c->cap_map, window, sizeof(*c->map)) < 0 ||
        kvb_grow((void **)&c->kinds, &c->cap_kinds, nb ? nb : 1, sizeof(*c->kinds)) < 0 ||
        kvb_grow((void **)&c->mm, &c->cap_mm, ev->xkey_off[nb] ? ev->xkey_off[nb] : 1,
                 sizeof(*c->mm)) < 0)
        return -ENOMEM;
    for (uint64_t i = 0; i < nb; i++) {
        uint32_t n = 0;
        block_mm(c, ev, (uint32_t)i, &n);
        if (n != 1)
            continue;
        enum kvb_mm_kind k = kvb_mm_block_kind(ev->tokens + i * bs, bs, c->cfg.image_token_id,
                                               c->cfg.video_token_id);
        if (k != KVB_MM_NONE)
            c->kinds[c->n_kinds++] = (struct kvb_mm_kind_of){c->mm[0], k};
    }
    c->n_kinds = kvb_mm_kinds_finish(c->kinds, c->n_kinds);
    return 0;
}

static int convert_stored(struct kvb_converter *c, const struct kvb_event *ev, uint32_t rank,
                          struct kvb_rev *out, int *why)
{
    int tier;
    bool has_ns;
    uint64_t ns_term = 0;
    int r = stored_rules(c, ev, rank, &tier, &has_ns, &ns_term);
    if (r >= 0)
        return drop(c, r, why);
    /* B: the configured block size, or (auto) the event's own. */
    uint64_t bs = c->cfg.block_size;
    if (bs == 0)
        bs = ev->block_size.has ? (uint64_t)ev->block_size.v : 0;
    /* Block i needs tokens [i*B, (i+1)*B): stop at the first one not covered.
     * EAGLE (flattened bigram pairs): windows of B+1 tokens, stride B. */
    uint64_t window = bs + (ev->token_pairs ? 1 : 0);
    uint64_t nb = 0;
    if (bs && ev->n_tokens >= window)
        nb = (ev->n_tokens - window) / bs + 1;
    if (nb > ev->n_hashes)
        nb = ev->n_hashes;
    /* An event that could fill a block of B but says another block size is a
     * configuration error.  One too short to fill any block (offload
     * placeholders with block_size 0, SGLang's partial last pages) simply has
     * no complete block: it is not a mismatch. */
    if (nb > 0 && (!ev->block_size.has || (uint64_t)ev->block_size.v != bs))
        return drop(c, KVB_DROP_BLOCK_SIZE_MISMATCH, why);
    if (nb == 0)
        return drop(c, KVB_DROP_NO_COMPLETE_BLOCK, why);
    if (kvb_grow((void **)&c->blocks, &c->cap_blocks, nb, sizeof(*c->blocks)) < 0)
        return -ENOMEM;
    uint32_t n_x = 0;
    if (ev->n_xkey_blocks) {
        uint64_t lim = nb < ev->n_xkey_blocks ? nb : ev->n_xkey_blocks;
        n_x = ev->xkey_off[lim];
        if (kvb_grow((void **)&c->mm, &c->cap_mm, n_x, sizeof(*c->mm)) < 0 ||
            kvb_grow((void **)&c->mm_sorted, &c->cap_mm_sorted, n_x, sizeof(*c->mm_sorted)) < 0 ||
            kvb_grow((void **)&c->mm_off, &c->cap_mm_off, nb + 1, sizeof(*c->mm_off)) < 0)
            return -ENOMEM;
        if ((c->cfg.image_token_id || c->cfg.video_token_id) &&
            kvb_grow((void **)&c->pad, &c->cap_pad, window, sizeof(*c->pad)) < 0)
            return -ENOMEM;
        if (c->cfg.video_token_id && infer_kinds(c, ev, bs, window) < 0)
            return -ENOMEM;
    }

    uint64_t seed = event_seed(c, ev, has_ns, ns_term);
    uint32_t n_mm = 0;
    for (uint64_t i = 0; i < nb; i++) {
        struct kvb_block *b = &c->blocks[i];
        const uint32_t *t = ev->tokens + i * bs;
        b->block_hash = kvb_hash_normalize(&ev->hashes[i]);
        uint32_t off = n_mm;
        if (n_x) {
            c->mm_off[i] = off;
            block_mm(c, ev, (uint32_t)i, &n_mm);
        }
        uint32_t k = n_mm - off;
        b->tokens_hash =
            k == 0 ? kvb_tokens_hash(t, window, seed) : mm_block_hash(c, t, window, off, k, seed);
    }
    if (n_x)
        c->mm_off[nb] = n_mm;
    uint64_t lead = hold_blocks(c, ev, rank, tier, nb);
    if (lead == nb) {
        kvb_add(&c->m->blocks_repeated_total[0], nb);
        return drop(c, KVB_DROP_RESIDENT_REPEAT, why);
    }
    kvb_add(&c->m->blocks_repeated_total[0], lead);
    out->type = KVB_REVT_STORED;
    out->scoped = false;
    out->tier = (uint8_t)tier;
    out->has_parent = lead > 0 || ev->parent.kind != KVB_HASH_NIL;
    out->parent = lead > 0          ? c->blocks[lead - 1].block_hash
                  : out->has_parent ? kvb_hash_normalize(&ev->parent)
                                    : 0;
    out->blocks = c->blocks + lead;
    out->hashes = NULL;
    out->n = (uint32_t)(nb - lead);
    out->mm_hashes = n_mm ? c->mm : NULL;
    out->mm_off = n_mm ? c->mm_off + lead : NULL;
    out->n_mm = n_mm;
    return take_id(c, rank, out);
}

static int convert_removed(struct kvb_converter *c, const struct kvb_event *ev, uint32_t rank,
                           struct kvb_rev *out, int *why)
{
    int tier;
    bool lower = false;
    int r = relay_filters(c, ev, &tier, &lower);
    if (r < 0 && !lower)
        r = group_filter(c, ev, rank);
    if (r >= 0)
        return drop(c, r, why);
    struct kvb_pair p = pair_of(c, rank);
    if (!lower)
        for (uint32_t i = 0; i < ev->n_hashes; i++)
            kvb_track_ns_remove(c->track, p, kvb_hash_normalize(&ev->hashes[i]), (uint8_t)tier);
    if (!(c->cfg.forward_tiers & (1u << tier)))
        return drop(c, KVB_DROP_TIER_FILTERED, why);
    if (ev->n_hashes == 0)
        return drop(c, KVB_DROP_EMPTY_REMOVE, why);
    if (kvb_grow((void **)&c->hashes, &c->cap_hashes, ev->n_hashes, sizeof(*c->hashes)) < 0)
        return -ENOMEM;
    /* a hash is published when its last copy goes (or it was never tracked) */
    int64_t g = ev->group_idx.has ? ev->group_idx.v : -1;
    uint32_t n = 0;
    for (uint32_t i = 0; i < ev->n_hashes; i++) {
        uint64_t h = kvb_hash_normalize(&ev->hashes[i]);
        if (kvb_track_release(c->track, p, (uint8_t)tier, h, g))
            c->hashes[n++] = h;
    }
    kvb_add(&c->m->blocks_held_total[0], ev->n_hashes - n);
    kvb_set(&c->m->tracked_blocks[0], kvb_track_entries(c->track));
    if (n == 0)
        return drop(c, KVB_DROP_COPIES_REMAIN, why);
    out->type = KVB_REVT_REMOVED;
    out->scoped = false;
    out->tier = (uint8_t)tier;
    out->has_parent = false;
    out->parent = 0;
    out->blocks = NULL;
    out->hashes = c->hashes;
    out->n = n;
    out->mm_hashes = NULL;
    out->mm_off = NULL;
    out->n_mm = 0;
    return take_id(c, rank, out);
}

int kvb_convert_cleared(struct kvb_converter *c, uint32_t dp_rank, struct kvb_rev *out)
{
    memset(out, 0, sizeof(*out));
    out->type = KVB_REVT_CLEARED;
    out->tier = KVB_TIER_DEVICE;
    return take_id(c, dp_rank, out);
}

/* TierBlocksCleared (zmq_wire/mod.rs preprocess_residency_with_reason and
 * clear_namespace_tier): ownership and medium as for any event; the
 * tier's copies forgotten, and on device and host_pinned its namespace
 * records; then a "cleared" of that tier alone, if the tier is forwarded. */
static int convert_tier_cleared(struct kvb_converter *c, const struct kvb_event *ev, uint32_t rank,
                                struct kvb_rev *out, int *why)
{
    int tier;
    bool lower = false;
    int r = relay_filters(c, ev, &tier, &lower);
    if (r >= 0)
        return drop(c, r, why);
    struct kvb_pair p = pair_of(c, rank);
    if (!lower)
        kvb_track_ns_clear_tier(c->track, p, (uint8_t)tier);
    kvb_track_reset_tier(c->track, p, (uint8_t)tier);
    kvb_set(&c->m->tracked_blocks[0], kvb_track_entries(c->track));
    if (!(c->cfg.forward_tiers & (1u << tier)))
        return drop(c, KVB_DROP_TIER_FILTERED, why);
    memset(out, 0, sizeof(*out));
    out->type = KVB_REVT_CLEARED;
    out->tier = (uint8_t)tier;
    out->scoped = true;
    return take_id(c, rank, out);
}

int kvb_convert_stamp(struct kvb_converter *c, uint32_t dp_rank, struct kvb_rev *r)
{
    return take_id(c, dp_rank, r);
}

int kvb_convert_event(struct kvb_converter *c, const struct kvb_event *ev, uint32_t dp_rank,
                      struct kvb_rev *out, int *why)
{
    switch (ev->type) {
    case KVB_EV_STORED:
        kvb_inc(&c->m->events_received_total[KVB_EVT_STORED]);
        return convert_stored(c, ev, dp_rank, out, why);
    case KVB_EV_REMOVED:
        kvb_inc(&c->m->events_received_total[KVB_EVT_REMOVED]);
        return convert_removed(c, ev, dp_rank, out, why);
    case KVB_EV_CLEARED:
        kvb_inc(&c->m->events_received_total[KVB_EVT_CLEARED]);
        if (ev->ownership.ptr)
            return drop(c,
                        str_is(&ev->ownership, "kvcr") ? KVB_DROP_UNSUPPORTED_OWNERSHIP
                                                       : KVB_DROP_UNKNOWN_OWNERSHIP,
                        why);
        if (ev->medium.len) /* an AllBlocksCleared scoped to one medium */
            return drop(c, KVB_DROP_AMBIGUOUS_SCOPED_CLEAR, why);
        kvb_converter_forget(c, dp_rank);
        return kvb_convert_cleared(c, dp_rank, out);
    case KVB_EV_TIER_CLEARED:
        kvb_inc(&c->m->events_received_total[KVB_EVT_TIER_CLEARED]);
        return convert_tier_cleared(c, ev, dp_rank, out, why);
    case KVB_EV_IGNORED:
        kvb_inc(&c->m->events_received_total[KVB_EVT_IGNORED]);
        return drop(c, KVB_DROP_IGNORED_EVENT, why);
    case KVB_EV_UNKNOWN:
        kvb_inc(&c->m->events_received_total[KVB_EVT_UNKNOWN]);
        return drop(c, KVB_DROP_UNKNOWN_EVENT_TYPE, why);
    default:
        kvb_inc(&c->m->events_received_total[KVB_EVT_MALFORMED]);
        return drop(c, KVB_DROP_MALFORMED_EVENT, why);
    }
}
