/* coalesce: adjacent router events of one engine batch merged into one, as
 * Dynamo's publisher does (lib/llm/src/kv_router/publisher/batching.rs),
 * without re-parenting a root store (docs/router-events.md section 5). */
#include "coalesce.h"
#include "grow.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void kvb_coalesce_init(struct kvb_coalesce *c) { memset(c, 0, sizeof(*c)); }

void kvb_coalesce_free(struct kvb_coalesce *c)
{
    free(c->blocks);
    free(c->hashes);
    free(c->mm);
    free(c->mm_off);
    kvb_coalesce_init(c);
}

bool kvb_coalesce_can_join(const struct kvb_coalesce *c, const struct kvb_rev *r)
{
    const struct kvb_rev *p = &c->pend;
    if (!c->has || r->type != p->type || r->worker_id != p->worker_id || r->dp_rank != p->dp_rank ||
        r->tier != p->tier || r->epoch != p->epoch || r->repair || p->repair ||
        p->n + (uint64_t)r->n > KVB_COALESCE_MAX)
        return false;
    if (r->type == KVB_REVT_REMOVED)
        return true;
    /* A store joins only under the pending store's last block: a root store
     * (or one after an empty store) keeps its own event. */
    return r->type == KVB_REVT_STORED && p->n > 0 && r->has_parent &&
           r->parent == p->blocks[p->n - 1].block_hash;
}

/* Appends R's blocks (or hashes) and mm objects after the pending ones. */
static int append(struct kvb_coalesce *c, const struct kvb_rev *r)
{
    struct kvb_rev *p = &c->pend;
    uint32_t n = p->n + r->n;
    if (r->type == KVB_REVT_STORED) {
        if (kvb_grow((void **)&c->blocks, &c->cap_blocks, n, sizeof(*c->blocks)) < 0)
            return -ENOMEM;
        uint32_t mm = p->n_mm + r->n_mm;
        if ((p->n_mm || r->n_mm) &&
            (kvb_grow((void **)&c->mm, &c->cap_mm, mm, sizeof(*c->mm)) < 0 ||
             kvb_grow((void **)&c->mm_off, &c->cap_mm_off, n + 1, sizeof(*c->mm_off)) < 0))
            return -ENOMEM;
        if (r->n) /* an empty store: c->blocks may still be NULL */
            memcpy(c->blocks + p->n, r->blocks, r->n * sizeof(*c->blocks));
        if (p->n_mm || r->n_mm) {
            /* block i's objects are mm[mm_off[i] .. mm_off[i+1]) */
            if (!p->n_mm) /* the pending blocks have none */
                memset(c->mm_off, 0, (p->n + 1) * sizeof(*c->mm_off));
            for (uint32_t i = 0; i <= r->n; i++)
                c->mm_off[p->n + i] = p->n_mm + (r->n_mm ? r->mm_off[i] : 0);
            if (r->n_mm)
                memcpy(c->mm + p->n_mm, r->mm_hashes, r->n_mm * sizeof(*c->mm));
        }
        p->blocks = c->blocks;
        p->n_mm = mm;
        p->mm_hashes = mm ? c->mm : NULL;
        p->mm_off = mm ? c->mm_off : NULL;
    } else {
        if (kvb_grow((void **)&c->hashes, &c->cap_hashes, n, sizeof(*c->hashes)) < 0)
            return -ENOMEM;
        if (r->n)
            memcpy(c->hashes + p->n, r->hashes, r->n * sizeof(*c->hashes));
        p->hashes = c->hashes;
    }
    p->n = n;
    return 0;
}

int kvb_coalesce_hold(struct kvb_coalesce *c, const struct kvb_rev *r)
{
    c->has = false;
    c->pend = *r;
    c->pend.n = 0;
    c->pend.n_mm = 0;
    c->pend.blocks = NULL;
    c->pend.hashes = NULL;
    c->pend.mm_hashes = NULL;
    c->pend.mm_off = NULL;
    if (append(c, r) < 0)
        return -ENOMEM;
    c->has = true;
    return 0;
}

int kvb_coalesce_join(struct kvb_coalesce *c, const struct kvb_rev *r) { return append(c, r); }

const struct kvb_rev *kvb_coalesce_take(struct kvb_coalesce *c)
{
    if (!c->has)
        return NULL;
    c->has = false;
    return &c->pend;
}
