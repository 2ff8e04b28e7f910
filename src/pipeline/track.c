/* track: see track.h.
 *
 * Copies and namespaces share one open-addressing table (linear probing,
 * backward-shift deletion): a namespace entry has tier NS_TIER.  A copy
 * entry's value is the set of KV cache groups that hold the block (bit g for
 * group g, bit KVB_TRACK_NO_GROUP for events without one); a namespace
 * entry's is the namespace term, its state SET or AMBIGUOUS, and `tiers` the
 * set of tiers (bit 1 << enum kvb_tier) whose stores recorded it.
 */
#include "track.h"
#include "mix.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define NS_TIER 0xff
#define NS_GONE 0xff /* state of a namespace entry a tier clear is about to erase */
#define MIN_CAP 64

struct entry {
    uint64_t worker, hash, val;
    uint32_t rank;
    uint8_t tier, used, state, tiers;
};

struct kind_rec {
    uint64_t worker;
    int64_t group;
    uint32_t rank;
    uint8_t kind;
};

struct kvb_track {
    struct entry *tab;
    size_t cap, n; /* cap: a power of two, or 0 */
    uint64_t max;
    struct kind_rec kinds[KVB_TRACK_MAX_KINDS];
    size_t n_kinds;
};

int kvb_track_create(uint64_t max_entries, struct kvb_track **out)
{
    struct kvb_track *t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    t->max = max_entries;
    *out = t;
    return 0;
}

void kvb_track_destroy(struct kvb_track **pt)
{
    if (!pt || !*pt)
        return;
    free((*pt)->tab);
    free(*pt);
    *pt = NULL;
}

void kvb_track_set_max(struct kvb_track *t, uint64_t max_entries) { t->max = max_entries; }

uint64_t kvb_track_entries(const struct kvb_track *t) { return t->n; }

/* ---- kinds --------------------------------------------------------------- */

int kvb_kind_of(const char *s, size_t n)
{
    static const char *const main_kinds[] = {"full_attention", "mla_attention",
                                             "sink_full_attention"};
    static const char *const other_kinds[] = {"sliding_window", "chunked_local_attention", "mamba",
                                              "cross_attention", "encoder_only_attention"};
    for (size_t i = 0; i < sizeof(main_kinds) / sizeof(main_kinds[0]); i++)
        if (n == strlen(main_kinds[i]) && memcmp(s, main_kinds[i], n) == 0)
            return KVB_KIND_MAIN;
    for (size_t i = 0; i < sizeof(other_kinds) / sizeof(other_kinds[0]); i++)
        if (n == strlen(other_kinds[i]) && memcmp(s, other_kinds[i], n) == 0)
            return KVB_KIND_OTHER;
    return KVB_KIND_UNKNOWN;
}

static struct kind_rec *kind_find(const struct kvb_track *t, struct kvb_pair p, int64_t group)
{
    for (size_t i = 0; i < t->n_kinds; i++) {
        const struct kind_rec *k = &t->kinds[i];
        if (k->worker == p.worker_id && k->rank == p.dp_rank && k->group == group)
            return (struct kind_rec *)k;
    }
    return NULL;
}

bool kvb_track_learn(struct kvb_track *t, struct kvb_pair p, int64_t group, int kind)
{
    struct kind_rec *k = kind_find(t, p, group);
    if (!k) {
        if (t->n_kinds >= KVB_TRACK_MAX_KINDS)
            return false;
        k = &t->kinds[t->n_kinds++];
        *k = (struct kind_rec){p.worker_id, group, p.dp_rank, 0};
    }
    k->kind = (uint8_t)kind;
    return true;
}

int kvb_track_kind(const struct kvb_track *t, struct kvb_pair p, int64_t group)
{
    const struct kind_rec *k = kind_find(t, p, group);
    return k ? k->kind : KVB_KIND_NONE;
}

/* ---- the table ----------------------------------------------------------- */

static size_t slot_of(const struct kvb_track *t, uint64_t worker, uint32_t rank, uint8_t tier,
                      uint64_t hash)
{
    uint64_t h = kvb_mix64(hash ^ kvb_mix64(worker ^ ((uint64_t)rank << 8 | tier)));
    return (size_t)h & (t->cap - 1);
}

static bool same(const struct entry *e, uint64_t worker, uint32_t rank, uint8_t tier, uint64_t hash)
{
    return e->used && e->hash == hash && e->worker == worker && e->rank == rank && e->tier == tier;
}

static struct entry *find(const struct kvb_track *t, struct kvb_pair p, uint8_t tier, uint64_t hash)
{
    if (t->cap == 0)
        return NULL;
    for (size_t i = slot_of(t, p.worker_id, p.dp_rank, tier, hash);; i = (i + 1) & (t->cap - 1)) {
        struct entry *e = &t->tab[i];
        if (!e->used)
            return NULL;
        if (same(e, p.worker_id, p.dp_rank, tier, hash))
            return e;
    }
}

static void place(struct kvb_track *t, const struct entry *src)
{
    size_t i = slot_of(t, src->worker, src->rank, src->tier, src->hash);
    while (t->tab[i].used)
        i = (i + 1) & (t->cap - 1);
    t->tab[i] = *src;
    t->n++;
}

/* Rebuild into a table of cap slots, keeping the entries KEEP says yes to. */
static int rebuild(struct kvb_track *t, size_t cap, bool (*keep)(const struct entry *, void *),
                   void *arg)
{
    struct entry *old = t->tab;
    size_t old_cap = t->cap;
    struct entry *tab = cap ? calloc(cap, sizeof(*tab)) : NULL;
    if (cap && !tab)
        return -ENOMEM;
    t->tab = tab;
    t->cap = cap;
    t->n = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].used && (!keep || keep(&old[i], arg)))
            place(t, &old[i]);
    free(old);
    return 0;
}

/* A new entry for (p, tier, hash): NULL when the bound is reached or memory
 * is short. */
static struct entry *insert(struct kvb_track *t, struct kvb_pair p, uint8_t tier, uint64_t hash)
{
    if (t->n >= t->max)
        return NULL;
    if ((t->n + 1) * 4 > t->cap * 3) {
        size_t cap = t->cap ? t->cap * 2 : MIN_CAP;
        if (rebuild(t, cap, NULL, NULL) < 0)
            return NULL;
    }
    struct entry e = {p.worker_id, hash, 0, p.dp_rank, tier, 1, 0, 0};
    place(t, &e);
    return find(t, p, tier, hash);
}

/* Backward-shift deletion: the entries after e in its run move up where
 * their home slot allows. */
static void erase(struct kvb_track *t, const struct entry *e)
{
    size_t i = (size_t)(e - t->tab), mask = t->cap - 1;
    t->tab[i].used = 0;
    t->n--;
    for (size_t j = (i + 1) & mask; t->tab[j].used; j = (j + 1) & mask) {
        struct entry *x = &t->tab[j];
        size_t home = slot_of(t, x->worker, x->rank, x->tier, x->hash);
        /* x may fill hole i when its home is not in (i, j] (cyclically) */
        bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (stays)
            continue;
        t->tab[i] = *x;
        x->used = 0;
        i = j;
    }
}

/* ---- namespaces ---------------------------------------------------------- */

int kvb_track_ns_get(const struct kvb_track *t, struct kvb_pair p, uint64_t hash, uint64_t *ns)
{
    const struct entry *e = find(t, p, NS_TIER, hash);
    if (!e)
        return KVB_NS_NONE;
    if (e->state == KVB_NS_SET)
        *ns = e->val;
    return e->state;
}

int kvb_track_ns_store(struct kvb_track *t, struct kvb_pair p, uint64_t hash, bool has_ns,
                       uint64_t ns, uint8_t tier)
{
    struct entry *e = find(t, p, NS_TIER, hash);
    if (e) {
        if (!has_ns || e->state != KVB_NS_SET || e->val != ns)
            e->state = KVB_NS_AMBIGUOUS;
    } else {
        if (!has_ns || t->max == 0)
            return 0; /* unsalted blocks are not kept (Dynamo keeps none either) */
        if (!(e = insert(t, p, NS_TIER, hash)))
            return -ENOSPC;
        e->state = KVB_NS_SET;
        e->val = ns;
    }
    e->tiers |= (uint8_t)(1u << tier);
    return 0;
}

void kvb_track_ns_remove(struct kvb_track *t, struct kvb_pair p, uint64_t hash, uint8_t tier)
{
    struct entry *e = find(t, p, NS_TIER, hash);
    if (!e)
        return;
    if (e->tiers) {
        e->tiers &= (uint8_t) ~(1u << tier);
        if (e->tiers)
            return; /* another tier still holds it under its namespace */
    }
    if (e->state != KVB_NS_AMBIGUOUS)
        erase(t, e);
}

static bool not_gone(const struct entry *e, void *arg)
{
    (void)arg;
    return e->tier != NS_TIER || e->state != NS_GONE;
}

void kvb_track_ns_clear_tier(struct kvb_track *t, struct kvb_pair p, uint8_t tier)
{
    uint8_t b = (uint8_t)(1u << tier);
    bool gone = false;
    for (size_t i = 0; i < t->cap; i++) {
        struct entry *e = &t->tab[i];
        if (!e->used || e->tier != NS_TIER || !(e->tiers & b) || e->worker != p.worker_id ||
            e->rank != p.dp_rank)
            continue;
        e->tiers &= (uint8_t)~b;
        if (e->tiers == 0) {
            e->state = NS_GONE;
            gone = true;
        }
    }
    if (gone && rebuild(t, t->cap, not_gone, NULL) < 0)
        kvb_track_reset(t);
}

/* ---- copies -------------------------------------------------------------- */

static uint64_t group_bit(int64_t group)
{
    return 1ULL << (group >= 0 && group < KVB_TRACK_NO_GROUP ? group : KVB_TRACK_NO_GROUP);
}

int kvb_track_hold(struct kvb_track *t, struct kvb_pair p, uint8_t tier, uint64_t hash,
                   int64_t group)
{
    if (t->max == 0)
        return 1; /* tracking off: every store a new copy */
    struct entry *e = find(t, p, tier, hash);
    if (!e && !(e = insert(t, p, tier, hash)))
        return -ENOSPC;
    uint64_t b = group_bit(group);
    if (e->val & b)
        return 0;
    e->val |= b;
    return 1;
}

bool kvb_track_holds(const struct kvb_track *t, struct kvb_pair p, uint8_t tier, uint64_t hash,
                     int64_t group)
{
    const struct entry *e = find(t, p, tier, hash);
    if (!e)
        return false;
    return group < 0 ? e->val != 0 : (e->val & group_bit(group)) != 0;
}

int kvb_track_release(struct kvb_track *t, struct kvb_pair p, uint8_t tier, uint64_t hash,
                      int64_t group)
{
    struct entry *e = find(t, p, tier, hash);
    if (!e)
        return 1;
    uint64_t b = group_bit(group);
    if (!(e->val & b)) {
        /* A group that holds no copy (its store was filtered, or never
         * seen) takes none of the others': they still hold the block.  A
         * remove that names no group is one copy gone: the lowest group's. */
        if (b != group_bit(-1))
            return 0;
        b = e->val & (~e->val + 1);
    }
    e->val &= ~b;
    if (e->val)
        return 0;
    erase(t, e);
    return 1;
}

static bool not_of_pair(const struct entry *e, void *arg)
{
    const struct kvb_pair *p = arg;
    return e->worker != p->worker_id || e->rank != p->dp_rank;
}

struct pair_tier {
    struct kvb_pair p;
    uint8_t tier;
};

static bool not_of_tier(const struct entry *e, void *arg)
{
    const struct pair_tier *pt = arg;
    return e->tier != pt->tier || e->worker != pt->p.worker_id || e->rank != pt->p.dp_rank;
}

void kvb_track_reset_tier(struct kvb_track *t, struct kvb_pair p, uint8_t tier)
{
    struct pair_tier pt = {p, tier};
    if (t->n && rebuild(t, t->cap, not_of_tier, &pt) < 0)
        kvb_track_reset(t);
}

void kvb_track_reset_pair(struct kvb_track *t, struct kvb_pair p)
{
    if (t->n == 0)
        return;
    /* same capacity: the rebuild allocates no more than the table had; on
     * failure, everything goes (still consistent: nothing is remembered) */
    if (rebuild(t, t->cap, not_of_pair, &p) < 0)
        kvb_track_reset(t);
}

void kvb_track_reset(struct kvb_track *t)
{
    free(t->tab);
    t->tab = NULL;
    t->cap = t->n = 0;
}

/* ---- persistence --------------------------------------------------------- */

void kvb_track_foreach(const struct kvb_track *t,
                       void (*cb)(void *ctx, const struct kvb_track_rec *r), void *ctx)
{
    for (size_t i = 0; i < t->n_kinds; i++) {
        const struct kind_rec *k = &t->kinds[i];
        struct kvb_track_rec r = {.worker_id = k->worker,
                                  .dp_rank = k->rank,
                                  .group = k->group,
                                  .val = k->kind,
                                  .what = KVB_TREC_KIND};
        cb(ctx, &r);
    }
    for (size_t i = 0; i < t->cap; i++) {
        const struct entry *e = &t->tab[i];
        if (!e->used)
            continue;
        struct kvb_track_rec r = {.worker_id = e->worker,
                                  .dp_rank = e->rank,
                                  .hash = e->hash,
                                  .val = e->val,
                                  .tier = e->tier == NS_TIER ? e->tiers : e->tier,
                                  .state = e->state,
                                  .what = e->tier == NS_TIER ? KVB_TREC_NS : KVB_TREC_COPY};
        cb(ctx, &r);
    }
}

int kvb_track_put(struct kvb_track *t, const struct kvb_track_rec *r)
{
    struct kvb_pair p = {r->worker_id, r->dp_rank};
    bool ns = r->what == KVB_TREC_NS;
    if (r->what == KVB_TREC_KIND) {
        if (r->val > KVB_KIND_UNKNOWN)
            return -EINVAL;
        return kvb_track_learn(t, p, r->group, (int)r->val) ? 0 : -ENOSPC;
    }
    if ((!ns && r->what != KVB_TREC_COPY) || (!ns && (r->tier == NS_TIER || r->val == 0)) ||
        (ns && r->state != KVB_NS_SET && r->state != KVB_NS_AMBIGUOUS))
        return -EINVAL;
    if (t->max == 0)
        return 0; /* tracking off: nothing is kept */
    uint8_t tier = ns ? NS_TIER : r->tier;
    struct entry *e = find(t, p, tier, r->hash);
    if (!e && !(e = insert(t, p, tier, r->hash)))
        return -ENOSPC;
    e->val = r->val;
    e->state = ns ? r->state : 0;
    e->tiers = ns ? r->tier : 0;
    return 0;
}
