/* mirror: resident blocks per (worker_id, dp_rank, tier) and the recent
 * router events per pair.  See src/mirror/index.h.
 *
 * A space keeps its blocks in a dense entry array (a removal moves the last
 * entry into the hole, so a snapshot is one memcpy) and two open-addressing
 * tables of entry indexes (linear probing, backward-shift deletion, at most
 * 3/4 full): by block_hash, and by (parent, tokens_hash) for prefix walks.
 */
#include "index.h"
#include "grow.h"
#include "mix.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct entry {
    uint64_t block, parent, tokens;
    uint32_t has_parent;
    uint32_t missing; /* MISSING: consumers lack the block (a repair is to publish it) */
};

#define MISSING 1u
#define VISITING 2u /* a repair's walk to the block's ancestors passed it */

struct space {
    uint64_t worker;
    uint32_t rank;
    uint8_t tier;
    struct entry *e;
    uint32_t n, cap;
    uint32_t *by_hash, *by_child; /* entry index + 1; 0 = empty */
    uint32_t mask;                /* table size - 1 (0: no tables yet) */
    uint32_t n_missing;           /* entries consumers lack */
    uint32_t rep_at;              /* the repair's scan goes on below this entry */
};

/* One router event kept in a pair's ring: its payload (block and tokens
 * hashes, or removed hashes) lives in the pair's word ring. */
struct rec {
    uint64_t event_id, epoch, parent;
    uint32_t off, n_words, n;
    uint8_t type, tier;
    bool has_parent;
    bool scoped; /* a "cleared" of `tier` only */
};

struct pair {
    uint64_t worker;
    uint32_t rank;
    bool has_last;
    uint64_t last;      /* last event_id applied */
    uint64_t ring_from; /* every event from this id to last is in the ring */
    struct rec *recs;   /* ring of cfg.recent_events records */
    uint32_t head, count;
    uint64_t *words; /* ring of n_words words */
    uint32_t n_words, w_head, w_used;
};

struct kvb_index {
    struct kvb_index_cfg cfg;
    struct space **sp;
    size_t n_sp, cap_sp;
    struct pair **pairs;
    size_t n_pairs, cap_pairs;
    uint64_t blocks, tier_blocks[KVB_TIER__COUNT], orphans;
    uint64_t bytes;
    uint64_t missing;          /* blocks consumers lack, over every space */
    size_t rep_sp;             /* the space the repair is at */
    struct kvb_block *scratch; /* for events_since and repair_next */
    uint32_t scratch_cap;
    uint32_t *path; /* repair_next: a block and its missing ancestors */
    uint32_t path_cap;
};

#define WORDS_PER_EVENT 64u /* word ring size: recent_events x this */

/* ---- hashing and tables ---------------------------------------------------- */

static uint64_t child_key(uint32_t has_parent, uint64_t parent, uint64_t tokens)
{
    return kvb_mix64((has_parent ? parent : 0x9e3779b97f4a7c15ull) ^
                     kvb_mix64(tokens + has_parent));
}

static uint64_t home_hash(const struct space *s, uint32_t idx)
{
    return kvb_mix64(s->e[idx].block);
}

static uint64_t home_child(const struct space *s, uint32_t idx)
{
    const struct entry *e = &s->e[idx];
    return child_key(e->has_parent, e->parent, e->tokens);
}

typedef uint64_t (*home_fn)(const struct space *s, uint32_t idx);

static void table_put(const struct space *s, uint32_t *t, uint64_t h, uint32_t idx)
{
    uint32_t i = (uint32_t)h & s->mask;
    while (t[i])
        i = (i + 1) & s->mask;
    t[i] = idx + 1;
}

/* The slot of t that holds idx (which must be there). */
static uint32_t table_slot(const struct space *s, const uint32_t *t, home_fn home, uint32_t idx)
{
    uint32_t i = (uint32_t)home(s, idx) & s->mask;
    while (t[i] != idx + 1)
        i = (i + 1) & s->mask;
    return i;
}

static void table_del(const struct space *s, uint32_t *t, home_fn home, uint32_t i)
{
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & s->mask;
        if (!t[j])
            break;
        uint32_t k = (uint32_t)home(s, t[j] - 1) & s->mask;
        /* move t[j] back to i unless its home lies cyclically in (i, j] */
        bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            t[i] = t[j];
            i = j;
        }
    }
    t[i] = 0;
}

static int64_t find_block(const struct space *s, uint64_t block)
{
    if (!s || !s->mask)
        return -1;
    uint32_t i = (uint32_t)kvb_mix64(block) & s->mask;
    for (; s->by_hash[i]; i = (i + 1) & s->mask)
        if (s->e[s->by_hash[i] - 1].block == block)
            return s->by_hash[i] - 1;
    return -1;
}

static int64_t find_child(const struct space *s, uint32_t has_parent, uint64_t parent,
                          uint64_t tokens)
{
    if (!s || !s->mask)
        return -1;
    uint32_t i = (uint32_t)child_key(has_parent, parent, tokens) & s->mask;
    for (; s->by_child[i]; i = (i + 1) & s->mask) {
        const struct entry *e = &s->e[s->by_child[i] - 1];
        if (e->tokens == tokens && e->has_parent == has_parent &&
            (!has_parent || e->parent == parent))
            return s->by_child[i] - 1;
    }
    return -1;
}

static uint64_t space_bytes(const struct space *s)
{
    return (uint64_t)s->cap * sizeof(struct entry) + (s->mask ? 2ull * (s->mask + 1) * 4 : 0);
}

static int space_rehash(struct kvb_index *m, struct space *s, uint32_t size)
{
    uint32_t *h = calloc(size, 4), *c = calloc(size, 4);
    if (!h || !c) {
        free(h);
        free(c);
        return -ENOMEM;
    }
    m->bytes -= space_bytes(s);
    free(s->by_hash);
    free(s->by_child);
    s->by_hash = h;
    s->by_child = c;
    s->mask = size - 1;
    for (uint32_t i = 0; i < s->n; i++) {
        table_put(s, s->by_hash, home_hash(s, i), i);
        if (find_child(s, s->e[i].has_parent, s->e[i].parent, s->e[i].tokens) < 0)
            table_put(s, s->by_child, home_child(s, i), i);
    }
    m->bytes += space_bytes(s);
    return 0;
}

/* Room for `more` entries. */
static int space_reserve(struct kvb_index *m, struct space *s, uint32_t more)
{
    uint64_t need = (uint64_t)s->n + more;
    if (need > UINT32_MAX / 2)
        return -ENOSPC;
    if (need > s->cap) {
        uint64_t cap = s->cap ? s->cap : 64;
        while (cap < need)
            cap *= 2;
        struct entry *e = realloc(s->e, cap * sizeof(*e));
        if (!e)
            return -ENOMEM;
        m->bytes += (cap - s->cap) * sizeof(*e);
        s->e = e;
        s->cap = (uint32_t)cap;
    }
    uint64_t size = s->mask ? (uint64_t)s->mask + 1 : 128;
    while (need * 4 > size * 3)
        size *= 2;
    return size != (uint64_t)s->mask + 1 ? space_rehash(m, s, (uint32_t)size) : 0;
}

static void space_empty(struct kvb_index *m, struct space *s)
{
    m->blocks -= s->n;
    m->tier_blocks[s->tier] -= s->n;
    m->missing -= s->n_missing;
    s->n_missing = s->rep_at = 0;
    m->bytes -= space_bytes(s);
    free(s->e);
    free(s->by_hash);
    free(s->by_child);
    s->e = NULL;
    s->by_hash = s->by_child = NULL;
    s->n = s->cap = s->mask = 0;
}

/* Entry idx is one consumers lack (or no longer). */
static void set_missing(struct kvb_index *m, struct space *s, uint32_t idx, bool missing)
{
    struct entry *e = &s->e[idx];
    if (!e->missing == !missing)
        return;
    e->missing = missing ? MISSING : 0;
    if (missing) {
        s->n_missing++;
        m->missing++;
    } else {
        s->n_missing--;
        m->missing--;
    }
}

static void del_entry(struct kvb_index *m, struct space *s, uint32_t idx)
{
    set_missing(m, s, idx, false);
    table_del(s, s->by_hash, home_hash, table_slot(s, s->by_hash, home_hash, idx));
    int64_t c = find_child(s, s->e[idx].has_parent, s->e[idx].parent, s->e[idx].tokens);
    if (c == idx)
        table_del(s, s->by_child, home_child, table_slot(s, s->by_child, home_child, idx));
    uint32_t last = s->n - 1;
    if (idx != last) { /* the last entry moves into the hole */
        s->by_hash[table_slot(s, s->by_hash, home_hash, last)] = idx + 1;
        int64_t lc = find_child(s, s->e[last].has_parent, s->e[last].parent, s->e[last].tokens);
        uint32_t lslot = lc == last ? table_slot(s, s->by_child, home_child, last) : 0;
        s->e[idx] = s->e[last];
        if (lc == last)
            s->by_child[lslot] = idx + 1;
    }
    s->n--;
    m->blocks--;
    m->tier_blocks[s->tier]--;
}

/* Add or overwrite one block (room reserved by the caller).  missing: the
 * consumers dropped the store that brings it (its parent is one they lack),
 * so they lack this version of the block too; an unchanged block they hold
 * stays held. */
static void put_block(struct kvb_index *m, struct space *s, uint64_t block, uint32_t has_parent,
                      uint64_t parent, uint64_t tokens, bool missing)
{
    int64_t at = find_block(s, block);
    if (at >= 0) {
        struct entry *e = &s->e[at];
        if (e->has_parent == has_parent && e->parent == parent && e->tokens == tokens) {
            if (!missing)
                set_missing(m, s, (uint32_t)at, false);
            return;
        }
        if (find_child(s, e->has_parent, e->parent, e->tokens) == at)
            table_del(s, s->by_child, home_child,
                      table_slot(s, s->by_child, home_child, (uint32_t)at));
        e->has_parent = has_parent;
        e->parent = has_parent ? parent : 0;
        e->tokens = tokens;
    } else {
        at = s->n++;
        s->e[at] = (struct entry){block, has_parent ? parent : 0, tokens, has_parent, 0};
        table_put(s, s->by_hash, home_hash(s, (uint32_t)at), (uint32_t)at);
        m->blocks++;
        m->tier_blocks[s->tier]++;
    }
    set_missing(m, s, (uint32_t)at, missing);
    /* the newest block of a (parent, tokens_hash) is the one a walk finds */
    int64_t old = find_child(s, has_parent, parent, tokens);
    if (old >= 0 && old != at)
        table_del(s, s->by_child, home_child,
                  table_slot(s, s->by_child, home_child, (uint32_t)old));
    if (old != at)
        table_put(s, s->by_child, home_child(s, (uint32_t)at), (uint32_t)at);
}

/* ---- spaces and pairs ------------------------------------------------------- */

static struct space *space_get(const struct kvb_index *m, uint64_t worker, uint32_t rank, int tier)
{
    for (size_t i = 0; i < m->n_sp; i++) {
        struct space *s = m->sp[i];
        if (s->worker == worker && s->rank == rank && s->tier == tier)
            return s;
    }
    return NULL;
}

static struct space *space_make(struct kvb_index *m, uint64_t worker, uint32_t rank, int tier)
{
    struct space *s = space_get(m, worker, rank, tier);
    if (s)
        return s;
    if (kvb_grow((void **)&m->sp, &m->cap_sp, m->n_sp + 1, sizeof(*m->sp)) < 0 ||
        !(s = calloc(1, sizeof(*s))))
        return NULL;
    s->worker = worker;
    s->rank = rank;
    s->tier = (uint8_t)tier;
    m->sp[m->n_sp++] = s;
    return s;
}

static struct pair *pair_get(const struct kvb_index *m, uint64_t worker, uint32_t rank)
{
    for (size_t i = 0; i < m->n_pairs; i++)
        if (m->pairs[i]->worker == worker && m->pairs[i]->rank == rank)
            return m->pairs[i];
    return NULL;
}

static struct pair *pair_make(struct kvb_index *m, uint64_t worker, uint32_t rank)
{
    struct pair *p = pair_get(m, worker, rank);
    if (p)
        return p;
    uint32_t nr = m->cfg.recent_events;
    if (kvb_grow((void **)&m->pairs, &m->cap_pairs, m->n_pairs + 1, sizeof(*m->pairs)) < 0 ||
        !(p = calloc(1, sizeof(*p))))
        return NULL;
    p->worker = worker;
    p->rank = rank;
    if (nr) {
        p->n_words = nr * WORDS_PER_EVENT;
        p->recs = calloc(nr, sizeof(*p->recs));
        p->words = malloc((size_t)p->n_words * sizeof(*p->words));
        if (!p->recs || !p->words) {
            free(p->recs);
            free(p->words);
            free(p);
            return NULL;
        }
        m->bytes += (uint64_t)nr * sizeof(*p->recs) + (uint64_t)p->n_words * 8;
    }
    m->pairs[m->n_pairs++] = p;
    return p;
}

/* ---- the ring of recent events ---------------------------------------------- */

static void ring_drop_oldest(struct pair *p)
{
    struct rec *r = &p->recs[p->head];
    p->w_used -= r->n_words;
    p->head = (p->head + 1) % (uint32_t)(p->n_words / WORDS_PER_EVENT);
    p->count--;
    p->ring_from = p->count ? p->recs[p->head].event_id : p->last + 1;
}

static void ring_push(struct pair *p, const struct kvb_rev *rev)
{
    uint32_t nrec = p->n_words / WORDS_PER_EVENT;
    uint32_t nw = rev->type == KVB_REVT_STORED    ? 2 * rev->n
                  : rev->type == KVB_REVT_REMOVED ? rev->n
                                                  : 0;
    if (nw > p->n_words) { /* larger than the whole ring: nothing before it stays */
        p->head = p->count = p->w_used = 0;
        p->ring_from = rev->event_id + 1;
        return;
    }
    while (p->count && (p->count == nrec || p->w_used + nw > p->n_words))
        ring_drop_oldest(p);
    if (!p->count) {
        p->w_head = 0;
        p->ring_from = rev->event_id;
    }
    uint32_t w = (p->w_head + p->w_used) % p->n_words;
    for (uint32_t i = 0; i < rev->n; i++) {
        if (rev->type == KVB_REVT_STORED) {
            p->words[w] = rev->blocks[i].block_hash;
            p->words[(w + 1) % p->n_words] = rev->blocks[i].tokens_hash;
            w = (w + 2) % p->n_words;
        } else if (rev->type == KVB_REVT_REMOVED) {
            p->words[w] = rev->hashes[i];
            w = (w + 1) % p->n_words;
        }
    }
    struct rec *r = &p->recs[(p->head + p->count) % nrec];
    *r = (struct rec){rev->event_id,
                      rev->epoch,
                      rev->parent,
                      (p->w_head + p->w_used) % p->n_words,
                      nw,
                      rev->n,
                      rev->type,
                      rev->tier,
                      rev->has_parent,
                      rev->type == KVB_REVT_CLEARED && rev->scoped};
    p->w_used += nw;
    p->count++;
}

/* ---- public ---------------------------------------------------------------- */

int kvb_index_create(const struct kvb_index_cfg *cfg, struct kvb_index **out)
{
    struct kvb_index *m = calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    m->cfg = *cfg;
    m->bytes = sizeof(*m);
    *out = m;
    return 0;
}

void kvb_index_destroy(struct kvb_index **pm)
{
    struct kvb_index *m = pm ? *pm : NULL;
    if (!m)
        return;
    for (size_t i = 0; i < m->n_sp; i++) {
        space_empty(m, m->sp[i]);
        free(m->sp[i]);
    }
    for (size_t i = 0; i < m->n_pairs; i++) {
        free(m->pairs[i]->recs);
        free(m->pairs[i]->words);
        free(m->pairs[i]);
    }
    free(m->sp);
    free(m->pairs);
    free(m->scratch);
    free(m->path);
    free(m);
    *pm = NULL;
}

static void clear_pair(struct kvb_index *m, uint64_t worker, uint32_t rank)
{
    for (size_t i = 0; i < m->n_sp; i++)
        if (m->sp[i]->worker == worker && m->sp[i]->rank == rank)
            space_empty(m, m->sp[i]);
}

/* The event is the pair's last, and goes to its ring. */
static void note_event(struct pair *p, const struct kvb_rev *rev)
{
    if (!p->has_last)
        p->ring_from = rev->event_id;
    p->has_last = true;
    p->last = rev->event_id;
    if (p->recs)
        ring_push(p, rev);
    else
        p->ring_from = rev->event_id + 1;
}

int kvb_index_apply(struct kvb_index *m, const struct kvb_rev *rev)
{
    int res = 0;
    struct pair *p = pair_make(m, rev->worker_id, rev->dp_rank);
    if (!p)
        return -ENOMEM;
    if (rev->type == KVB_REVT_STORED) {
        struct space *s = space_make(m, rev->worker_id, rev->dp_rank, rev->tier);
        if (!s)
            return -ENOMEM;
        int64_t up = rev->has_parent ? find_block(s, rev->parent) : -1;
        /* consumers drop a store whose parent they lack: so do they lack its blocks */
        bool missing = up >= 0 && s->e[up].missing;
        if (rev->has_parent && up < 0) {
            m->orphans++; /* an indexer drops the whole store */
        } else if (m->blocks + rev->n > m->cfg.max_blocks) {
            res = -ENOSPC; /* published all the same: it goes to the ring */
        } else if ((res = space_reserve(m, s, rev->n)) == 0) {
            for (uint32_t i = 0; i < rev->n; i++) {
                bool first = i == 0;
                put_block(m, s, rev->blocks[i].block_hash, first ? rev->has_parent : 1,
                          first ? rev->parent : rev->blocks[i - 1].block_hash,
                          rev->blocks[i].tokens_hash, missing);
            }
        }
    } else if (rev->type == KVB_REVT_REMOVED) {
        struct space *s = space_get(m, rev->worker_id, rev->dp_rank, rev->tier);
        for (uint32_t i = 0; s && i < rev->n; i++) {
            int64_t at = find_block(s, rev->hashes[i]);
            if (at >= 0)
                del_entry(m, s, (uint32_t)at);
        }
    } else if (rev->scoped) { /* one tier emptied (TierBlocksCleared) */
        struct space *s = space_get(m, rev->worker_id, rev->dp_rank, rev->tier);
        if (s)
            space_empty(m, s);
    } else {
        clear_pair(m, rev->worker_id, rev->dp_rank);
    }
    note_event(p, rev);
    return res;
}

int kvb_index_record(struct kvb_index *m, const struct kvb_rev *rev)
{
    struct pair *p = pair_make(m, rev->worker_id, rev->dp_rank);
    if (!p)
        return -ENOMEM;
    note_event(p, rev);
    return 0;
}

/* ---- repairs ------------------------------------------------------------- */

int kvb_index_repair_begin(struct kvb_index *m, uint64_t worker_id, uint32_t dp_rank)
{
    if (!pair_make(m, worker_id, dp_rank))
        return -ENOMEM;
    for (size_t i = 0; i < m->n_sp; i++) {
        struct space *s = m->sp[i];
        if (s->worker != worker_id || s->rank != dp_rank)
            continue;
        for (uint32_t k = 0; k < s->n; k++)
            set_missing(m, s, k, true);
        s->rep_at = 0;
    }
    return 0;
}

uint64_t kvb_index_missing(const struct kvb_index *m, uint64_t worker_id, uint32_t dp_rank)
{
    uint64_t n = 0;
    for (size_t i = 0; i < m->n_sp; i++)
        if (m->sp[i]->worker == worker_id && m->sp[i]->rank == dp_rank)
            n += m->sp[i]->n_missing;
    return n;
}

uint64_t kvb_index_missing_total(const struct kvb_index *m) { return m->missing; }

/* Room for n blocks (or 2n hashes) in the scratch buffer. */
static int scratch_reserve(struct kvb_index *m, uint32_t n)
{
    if (n <= m->scratch_cap)
        return 0;
    struct kvb_block *b = realloc(m->scratch, (size_t)n * sizeof(*b));
    if (!b)
        return -ENOMEM;
    m->scratch = b;
    m->scratch_cap = n;
    return 0;
}

static int path_push(struct kvb_index *m, uint32_t *len, uint32_t idx)
{
    if (*len == m->path_cap) {
        uint32_t cap = m->path_cap ? m->path_cap * 2 : 64;
        uint32_t *v = realloc(m->path, (size_t)cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        m->path = v;
        m->path_cap = cap;
    }
    m->path[(*len)++] = idx;
    return 0;
}

/* Entry i (missing) and its missing ancestors into m->path, child first:
 * the walk ends at a parent consumers hold (*parent_at), or at a block
 * without one they could know (no parent, a parent not resident, a cycle):
 * *parent_at -1.  The path's entries are VISITING until the caller is done. */
static int walk_up(struct kvb_index *m, struct space *s, uint32_t i, uint32_t *len,
                   int64_t *parent_at)
{
    *len = 0;
    *parent_at = -1;
    for (uint32_t cur = i;;) {
        int rc = path_push(m, len, cur);
        if (rc < 0)
            return rc;
        s->e[cur].missing = VISITING;
        if (!s->e[cur].has_parent)
            return 0;
        int64_t up = find_block(s, s->e[cur].parent);
        if (up < 0 || s->e[up].missing == VISITING)
            return 0;
        if (!s->e[up].missing) {
            *parent_at = up;
            return 0;
        }
        cur = (uint32_t)up;
    }
}

/* The next chain of space s that consumers lack, into *out: from the
 * topmost missing ancestor down, at most max_blocks.  1, 0 when the space
 * has none left, -EAGAIN when *scan entries were looked at without one. */
static int space_repair_next(struct kvb_index *m, struct space *s, uint32_t max_blocks,
                             uint32_t *scan, struct kvb_rev *out)
{
    while (s->n_missing) {
        if (!*scan)
            return -EAGAIN;
        (*scan)--;
        /* From the newest entry down: children come after their parents, so
         * a walk up from there gives long chains.  Entries move into the
         * holes of removed ones: at the bottom, go round. */
        if (s->rep_at == 0 || s->rep_at > s->n)
            s->rep_at = s->n;
        uint32_t i = s->rep_at - 1;
        if (!s->e[i].missing) {
            s->rep_at--;
            continue;
        }
        uint32_t len;
        int64_t up;
        int rc = walk_up(m, s, i, &len, &up);
        uint32_t n = len < max_blocks ? len : max_blocks;
        if (rc == 0)
            rc = scratch_reserve(m, n);
        if (rc < 0) {
            for (uint32_t k = 0; k < len; k++)
                s->e[m->path[k]].missing = MISSING;
            return rc;
        }
        const struct entry *top = &s->e[m->path[len - 1]];
        *out = (struct kvb_rev){.type = KVB_REVT_STORED,
                                .tier = s->tier,
                                .dp_rank = s->rank,
                                .worker_id = s->worker,
                                .has_parent = up >= 0,
                                .parent = up >= 0 ? top->parent : 0,
                                .blocks = m->scratch,
                                .n = n};
        for (uint32_t k = 0; k < len; k++) { /* top down: parents before children */
            uint32_t at = m->path[len - 1 - k];
            s->e[at].missing = MISSING;
            if (k < n) {
                m->scratch[k] = (struct kvb_block){s->e[at].block, s->e[at].tokens};
                set_missing(m, s, at, false);
            }
        }
        if (n == len)
            s->rep_at = i; /* else the rest of the path comes next */
        return 1;
    }
    return 0;
}

int kvb_index_repair_next(struct kvb_index *m, uint32_t max_blocks, uint32_t scan,
                          struct kvb_rev *out)
{
    if (!max_blocks)
        max_blocks = 1;
    for (size_t k = 0; m->missing && k < m->n_sp; k++) {
        if (m->rep_sp >= m->n_sp)
            m->rep_sp = 0;
        struct space *s = m->sp[m->rep_sp];
        int rc = space_repair_next(m, s, max_blocks, &scan, out);
        if (rc != 0)
            return rc;
        m->rep_sp++;
    }
    return 0;
}

int kvb_index_set_last(struct kvb_index *m, uint64_t worker_id, uint32_t dp_rank, uint64_t last)
{
    struct pair *p = pair_make(m, worker_id, dp_rank);
    if (!p)
        return -ENOMEM;
    p->has_last = true;
    p->last = last;
    p->head = p->count = p->w_used = p->w_head = 0;
    p->ring_from = last + 1; /* what came before is not in the ring */
    return 0;
}

uint64_t kvb_index_blocks(const struct kvb_index *m, int tier)
{
    return tier >= 0 && tier < KVB_TIER__COUNT ? m->tier_blocks[tier] : m->blocks;
}

uint64_t kvb_index_bytes(const struct kvb_index *m) { return m->bytes; }
uint64_t kvb_index_orphans(const struct kvb_index *m) { return m->orphans; }

bool kvb_index_last_event_id(const struct kvb_index *m, uint64_t worker_id, uint32_t dp_rank,
                             uint64_t *out)
{
    const struct pair *p = pair_get(m, worker_id, dp_rank);
    if (!p || !p->has_last)
        return false;
    *out = p->last;
    return true;
}

size_t kvb_index_pairs(const struct kvb_index *m, struct kvb_index_pair *out, size_t cap)
{
    for (size_t i = 0; i < m->n_pairs && i < cap; i++)
        out[i] = (struct kvb_index_pair){m->pairs[i]->worker, m->pairs[i]->rank};
    return m->n_pairs;
}

void kvb_index_match(const struct kvb_index *m, uint64_t worker_id, uint32_t dp_rank,
                     const uint64_t *th, size_t n, uint32_t matched[KVB_TIER__COUNT])
{
    for (int t = 0; t < KVB_TIER__COUNT; t++) {
        const struct space *s = space_get(m, worker_id, dp_rank, t);
        uint32_t k = 0;
        uint64_t parent = 0;
        for (; k < n; k++) {
            int64_t at = find_child(s, k > 0, parent, th[k]);
            if (at < 0)
                break;
            parent = s->e[at].block;
        }
        matched[t] = k;
    }
}

int kvb_index_events_since(struct kvb_index *m, uint64_t worker_id, uint32_t dp_rank,
                           uint64_t since, int (*fn)(void *ctx, const struct kvb_rev *rev),
                           void *ctx)
{
    const struct pair *p = pair_get(m, worker_id, dp_rank);
    if (!p || !p->has_last)
        return -ENOENT;
    if (since >= p->last)
        return 0;
    return kvb_index_events_from(m, worker_id, dp_rank, since + 1, fn, ctx);
}

int kvb_index_events_from(struct kvb_index *m, uint64_t worker_id, uint32_t dp_rank, uint64_t from,
                          int (*fn)(void *ctx, const struct kvb_rev *rev), void *ctx)
{
    const struct pair *p = pair_get(m, worker_id, dp_rank);
    if (!p || !p->has_last)
        return -ENOENT;
    if (from > p->last)
        return 0;
    if (from < p->ring_from)
        return -ESTALE;
    uint32_t nrec = p->n_words / WORDS_PER_EVENT;
    for (uint32_t i = 0; i < p->count; i++) {
        const struct rec *r = &p->recs[(p->head + i) % nrec];
        if (r->event_id < from)
            continue;
        struct kvb_rev rev = {.type = r->type,
                              .tier = r->tier,
                              .dp_rank = dp_rank,
                              .worker_id = worker_id,
                              .event_id = r->event_id,
                              .epoch = r->epoch,
                              .has_parent = r->has_parent,
                              .parent = r->parent,
                              .n = r->n,
                              .scoped = r->scoped};
        if (r->type != KVB_REVT_CLEARED && scratch_reserve(m, r->n) < 0)
            return -ENOMEM;
        if (r->type == KVB_REVT_STORED) {
            for (uint32_t j = 0; j < r->n; j++)
                m->scratch[j] = (struct kvb_block){p->words[(r->off + 2 * j) % p->n_words],
                                                   p->words[(r->off + 2 * j + 1) % p->n_words]};
            rev.blocks = m->scratch;
        } else if (r->type == KVB_REVT_REMOVED) {
            uint64_t *h = (uint64_t *)m->scratch;
            for (uint32_t j = 0; j < r->n; j++)
                h[j] = p->words[(r->off + j) % p->n_words];
            rev.hashes = h;
        }
        int rc = fn(ctx, &rev);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ---- the ring, copied (persistence) ---------------------------------------- */

struct kvb_index_ring {
    uint64_t worker;
    uint32_t rank;
    struct rec *recs; /* oldest first; off into words */
    uint32_t n, next;
    uint64_t *words;
};

int kvb_index_ring_copy(const struct kvb_index *m, uint64_t worker_id, uint32_t dp_rank,
                        struct kvb_index_ring **out)
{
    const struct pair *p = pair_get(m, worker_id, dp_rank);
    struct kvb_index_ring *r = calloc(1, sizeof(*r));
    if (!r)
        return -ENOMEM;
    r->worker = worker_id;
    r->rank = dp_rank;
    if (p && p->count) {
        uint32_t nrec = p->n_words / WORDS_PER_EVENT;
        r->recs = malloc((size_t)p->count * sizeof(*r->recs));
        r->words = malloc((size_t)(p->w_used ? p->w_used : 1) * sizeof(*r->words));
        if (!r->recs || !r->words) {
            kvb_index_ring_free(&r);
            return -ENOMEM;
        }
        uint32_t w = 0;
        for (uint32_t i = 0; i < p->count; i++) {
            struct rec rc = p->recs[(p->head + i) % nrec];
            for (uint32_t k = 0; k < rc.n_words; k++)
                r->words[w + k] = p->words[(rc.off + k) % p->n_words];
            rc.off = w;
            w += rc.n_words;
            r->recs[r->n++] = rc;
        }
    }
    *out = r;
    return 0;
}

void kvb_index_ring_free(struct kvb_index_ring **pr)
{
    struct kvb_index_ring *r = pr ? *pr : NULL;
    if (!r)
        return;
    free(r->recs);
    free(r->words);
    free(r);
    *pr = NULL;
}

uint32_t kvb_index_ring_count(const struct kvb_index_ring *r) { return r->n; }

int kvb_index_ring_next(struct kvb_index_ring *r, struct kvb_rev *out)
{
    if (r->next >= r->n)
        return 0;
    const struct rec *rc = &r->recs[r->next++];
    *out = (struct kvb_rev){.type = rc->type,
                            .tier = rc->tier,
                            .dp_rank = r->rank,
                            .worker_id = r->worker,
                            .event_id = rc->event_id,
                            .epoch = rc->epoch,
                            .has_parent = rc->has_parent,
                            .parent = rc->parent,
                            .n = rc->n,
                            .scoped = rc->scoped};
    if (rc->type == KVB_REVT_STORED) /* (block, tokens) pairs: a kvb_block each */
        out->blocks = (const struct kvb_block *)(r->words + rc->off);
    else if (rc->type == KVB_REVT_REMOVED)
        out->hashes = r->words + rc->off;
    return 1;
}

int kvb_index_mark(struct kvb_index *m, const struct kvb_rev *rev, bool missing)
{
    struct space *s = space_get(m, rev->worker_id, rev->dp_rank, rev->tier);
    for (uint32_t i = 0; s && rev->type == KVB_REVT_STORED && i < rev->n; i++) {
        int64_t at = find_block(s, rev->blocks[i].block_hash);
        if (at >= 0)
            set_missing(m, s, (uint32_t)at, missing);
    }
    return 0;
}

/* ---- snapshots (dumps) ------------------------------------------------------- */

struct snap_tier {
    struct entry *e; /* a copy of the space's entries */
    uint32_t n;
    uint32_t *by_parent; /* entry indexes of blocks with a parent, sorted by parent */
    uint32_t n_by_parent;
    uint32_t *by_block; /* every entry index, sorted by block hash */
    uint8_t *done;
    uint32_t next_root; /* scan position for roots, then for leftovers */
    bool roots_done;
};

struct kvb_index_snap {
    uint64_t worker;
    uint32_t rank;
    bool has_last;
    uint64_t last;
    struct snap_tier t[KVB_TIER__COUNT];
    int tier;        /* the tier being dumped */
    uint32_t *stack; /* entries whose children are still to come */
    uint32_t n_stack;
    struct kvb_block *out;
    uint32_t out_cap;
    bool out_missing; /* the last chain's blocks are missing */
};

int kvb_index_snapshot(const struct kvb_index *m, uint64_t worker_id, uint32_t dp_rank,
                       struct kvb_index_snap **out)
{
    struct kvb_index_snap *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->worker = worker_id;
    s->rank = dp_rank;
    const struct pair *p = pair_get(m, worker_id, dp_rank);
    if (p) {
        s->has_last = p->has_last;
        s->last = p->last;
    }
    for (int t = 0; t < KVB_TIER__COUNT; t++) {
        const struct space *sp = space_get(m, worker_id, dp_rank, t);
        if (!sp || !sp->n)
            continue;
        s->t[t].e = malloc((size_t)sp->n * sizeof(*sp->e));
        if (!s->t[t].e) {
            kvb_index_snap_free(&s);
            return -ENOMEM;
        }
        memcpy(s->t[t].e, sp->e, (size_t)sp->n * sizeof(*sp->e));
        s->t[t].n = sp->n;
    }
    *out = s;
    return 0;
}

void kvb_index_snap_free(struct kvb_index_snap **ps)
{
    struct kvb_index_snap *s = ps ? *ps : NULL;
    if (!s)
        return;
    for (int t = 0; t < KVB_TIER__COUNT; t++) {
        free(s->t[t].e);
        free(s->t[t].by_parent);
        free(s->t[t].by_block);
        free(s->t[t].done);
    }
    free(s->stack);
    free(s->out);
    free(s);
    *ps = NULL;
}

uint64_t kvb_index_snap_event_id(const struct kvb_index_snap *s) { return s->last; }
bool kvb_index_snap_missing(const struct kvb_index_snap *s) { return s->out_missing; }
bool kvb_index_snap_has_events(const struct kvb_index_snap *s) { return s->has_last; }

uint64_t kvb_index_snap_blocks(const struct kvb_index_snap *s)
{
    uint64_t n = 0;
    for (int t = 0; t < KVB_TIER__COUNT; t++)
        n += s->t[t].n;
    return n;
}

static int cmp_block(const void *a, const void *b, void *ctx)
{
    const struct entry *e = ctx;
    uint64_t x = e[*(const uint32_t *)a].block, y = e[*(const uint32_t *)b].block;
    return x < y ? -1 : x > y;
}

static int cmp_parent(const void *a, const void *b, void *ctx)
{
    const struct entry *e = ctx;
    uint64_t x = e[*(const uint32_t *)a].parent, y = e[*(const uint32_t *)b].parent;
    return x < y ? -1 : x > y;
}

static int prepare_tier(struct snap_tier *st)
{
    st->by_block = malloc((size_t)(st->n ? st->n : 1) * 4);
    st->by_parent = malloc((size_t)(st->n ? st->n : 1) * 4);
    st->done = calloc(st->n ? st->n : 1, 1);
    if (!st->by_block || !st->by_parent || !st->done)
        return -ENOMEM;
    for (uint32_t i = 0; i < st->n; i++) {
        st->by_block[i] = i;
        if (st->e[i].has_parent)
            st->by_parent[st->n_by_parent++] = i;
    }
    qsort_r(st->by_block, st->n, 4, cmp_block, st->e);
    qsort_r(st->by_parent, st->n_by_parent, 4, cmp_parent, st->e);
    return 0;
}

/* The entry of a block hash, or -1. */
static int64_t lookup(const struct snap_tier *st, uint64_t block)
{
    uint32_t lo = 0, hi = st->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        uint64_t b = st->e[st->by_block[mid]].block;
        if (b == block)
            return st->by_block[mid];
        if (b < block)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

/* Its parent is in the dump already: the block can name it. */
static bool parent_dumped(const struct snap_tier *st, const struct entry *e)
{
    int64_t p = e->has_parent ? lookup(st, e->parent) : -1;
    return p >= 0 && st->done[p];
}

/* First index in by_parent whose entry's parent is `block`, or n_by_parent. */
static uint32_t children_of(const struct snap_tier *st, uint64_t block)
{
    uint32_t lo = 0, hi = st->n_by_parent;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (st->e[st->by_parent[mid]].parent < block)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The first child of `block` not dumped yet, or -1. */
static int64_t next_child(const struct snap_tier *st, uint64_t block)
{
    for (uint32_t i = children_of(st, block);
         i < st->n_by_parent && st->e[st->by_parent[i]].parent == block; i++)
        if (!st->done[st->by_parent[i]])
            return st->by_parent[i];
    return -1;
}

/* Where the next chain starts: a block whose parent was dumped (from the
 * stack), else a root, else any block left (a cycle that stores built). */
static int64_t chain_start(struct kvb_index_snap *s, struct snap_tier *st)
{
    while (s->n_stack) {
        int64_t c = next_child(st, st->e[s->stack[s->n_stack - 1]].block);
        if (c >= 0)
            return c;
        s->n_stack--;
    }
    for (; st->next_root < st->n; st->next_root++) {
        uint32_t i = st->next_root;
        if (!st->done[i] &&
            (st->roots_done || !st->e[i].has_parent || lookup(st, st->e[i].parent) < 0))
            return i;
    }
    if (!st->roots_done) {
        st->roots_done = true;
        st->next_root = 0;
        return chain_start(s, st);
    }
    return -1;
}

int kvb_index_snap_next(struct kvb_index_snap *s, uint32_t max_blocks, struct kvb_rev *out)
{
    if (!max_blocks)
        max_blocks = 1;
    if (s->out_cap < max_blocks) {
        struct kvb_block *b = realloc(s->out, max_blocks * sizeof(*b));
        if (!b)
            return -ENOMEM;
        s->out = b;
        s->out_cap = max_blocks;
    }
    for (; s->tier < KVB_TIER__COUNT; s->tier++) {
        struct snap_tier *st = &s->t[s->tier];
        if (!st->n)
            continue;
        if (!st->done && prepare_tier(st) < 0)
            return -ENOMEM;
        if (!s->stack && !(s->stack = malloc((size_t)st->n * 4 + 4)))
            return -ENOMEM;
        int64_t at = chain_start(s, st);
        if (at < 0) {
            free(s->stack); /* sized for this tier */
            s->stack = NULL;
            s->n_stack = 0;
            continue;
        }
        const struct entry *first = &st->e[at];
        *out = (struct kvb_rev){.type = KVB_REVT_STORED,
                                .tier = (uint8_t)s->tier,
                                .dp_rank = s->rank,
                                .worker_id = s->worker,
                                .event_id = s->last,
                                .has_parent = parent_dumped(st, first),
                                .parent = first->parent,
                                .blocks = s->out};
        uint32_t n = 0;
        s->out_missing = first->missing != 0;
        /* one chain, one mark: consumers lack all of its blocks or none */
        while (at >= 0 && n < max_blocks && (st->e[at].missing != 0) == s->out_missing) {
            st->done[at] = 1;
            s->out[n++] = (struct kvb_block){st->e[at].block, st->e[at].tokens};
            int64_t c = next_child(st, st->e[at].block);
            if (c >= 0) /* once: its other children (or c, past max_blocks) come later */
                s->stack[s->n_stack++] = (uint32_t)at;
            at = c;
        }
        if (!out->has_parent)
            out->parent = 0;
        out->n = n;
        return 1;
    }
    return 0;
}
