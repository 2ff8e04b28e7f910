/* coalesce: adjacent router events of one engine batch merged into one
 * (nats.coalesce; docs/router-events.md section 5, "Coalescing").
 *
 * Two events join when they are of the same (worker_id, dp_rank, tier,
 * epoch) and type, neither is a repair, the result has at most
 * KVB_COALESCE_MAX blocks, and, for stores, the newer one's parent is the
 * pending store's last block.  A root store (no parent) never joins: it is
 * never published under another store's parent.  "cleared" never joins.
 *
 * Pure: no I/O, no globals.  Used by the pipeline (src/pipeline/pipeline.c),
 * which gives the merged event's event_id back to the converter so that ids
 * have no holes.
 *
 * Ownership: kvb_coalesce_init() on a caller's struct; kvb_coalesce_free()
 * frees its buffers.  The pending event points into them: valid until the
 * next kvb_coalesce_hold() / kvb_coalesce_join() / kvb_coalesce_free().
 */
#ifndef KVB_COALESCE_H
#define KVB_COALESCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "convert.h"

#define KVB_COALESCE_MAX 128 /* blocks (or removed hashes) of one merged event */

struct kvb_coalesce {
    bool has;            /* an event is pending */
    struct kvb_rev pend; /* its blocks, hashes and mm point into the buffers */
    struct kvb_block *blocks;
    uint64_t *hashes, *mm;
    uint32_t *mm_off;
    size_t cap_blocks, cap_hashes, cap_mm, cap_mm_off;
};

void kvb_coalesce_init(struct kvb_coalesce *c);
void kvb_coalesce_free(struct kvb_coalesce *c);

/* True when R may be merged into the pending event. */
bool kvb_coalesce_can_join(const struct kvb_coalesce *c, const struct kvb_rev *r);

/* R (a stored or removed event) becomes the pending event, copied.  0, or
 * -ENOMEM (nothing pending then). */
int kvb_coalesce_hold(struct kvb_coalesce *c, const struct kvb_rev *r);

/* Appends R (kvb_coalesce_can_join() true) to the pending event.  0, or
 * -ENOMEM (the pending event unchanged). */
int kvb_coalesce_join(struct kvb_coalesce *c, const struct kvb_rev *r);

/* The pending event, or NULL; kvb_coalesce_take() also forgets it. */
const struct kvb_rev *kvb_coalesce_take(struct kvb_coalesce *c);

#endif
