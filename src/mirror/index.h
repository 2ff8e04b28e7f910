/* mirror: what the engine holds, as the published router events say it
 * (docs/design.md, "Residency mirror").
 *
 * Per (worker_id, dp_rank, tier) a set of resident blocks: block_hash ->
 * (parent, tokens_hash), and for prefix walks the child of a block by
 * tokens_hash.  It is fed the router events the daemon publishes, after the
 * same filters and barriers, and applies them the way an indexer does:
 *   - stored: a store whose parent is not resident in that space is dropped
 *     whole (counted as an orphan); otherwise every block is added (a block
 *     stored again is overwritten);
 *   - removed: each hash leaves the space (an unknown one is ignored);
 *   - cleared: every tier of that (worker_id, dp_rank) is emptied; a scoped
 *     one (rev->scoped, the engine's TierBlocksCleared) only its tier.
 * So the mirror equals, by construction, what a correct consumer holds.
 *
 * It also keeps, per (worker_id, dp_rank), the last `recent_events` router
 * events in a ring, so a consumer with a short gap can ask for the events
 * after an event_id instead of a dump.
 *
 * Memory: at most max_blocks resident blocks over all spaces.  A store that
 * would pass it is refused with -ENOSPC (its blocks are not added; the event
 * still goes to the ring): the caller must then publish a barrier for that
 * pair (and apply it here), never let the two diverge.
 * Per block: a 32-byte entry in a dense array (grown by doubling) and a
 * 4-byte slot in each of two open-addressing tables (grown by doubling at
 * 3/4 full): 48 bytes per block at 1M blocks (check_index measures it),
 * up to about 85 right after both arrays grew.  The ring of recent events
 * adds recent_events x 552 bytes per (worker_id, dp_rank).
 *
 * Pure: no I/O, no clock, no locks; the loop thread is its only user, except
 * for a snapshot, which is a private copy (see kvb_index_snapshot()).
 *
 * Ownership: kvb_index_create() returns a mirror freed by
 * kvb_index_destroy(&m) (accepts NULL).  A snapshot is owned by its caller
 * and freed by kvb_index_snap_free(&s), from any thread.
 */
#ifndef KVB_INDEX_H
#define KVB_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "convert.h"
#include "metrics.h"

#define KVB_INDEX_DEFAULT_MAX_BLOCKS 1048576u
#define KVB_INDEX_DEFAULT_RECENT 4096u

struct kvb_index_cfg {
    uint64_t max_blocks;    /* resident blocks over all spaces */
    uint32_t recent_events; /* ring size per (worker_id, dp_rank); 0 = none */
};

struct kvb_index;

int kvb_index_create(const struct kvb_index_cfg *cfg, struct kvb_index **out);
void kvb_index_destroy(struct kvb_index **m);

/* Apply one published router event.  0, or -ENOSPC (a store past
 * max_blocks: none of its blocks was added, the caller publishes a barrier
 * for the pair and applies it), or -ENOMEM (the same, for lack of memory).
 * Even then the event counts as the pair's last and goes to the ring (it was
 * published: a consumer asking for events after an older id gets it). */
int kvb_index_apply(struct kvb_index *m, const struct kvb_rev *rev);

/* A router event recorded without being applied: it becomes the pair's
 * last and goes to its ring, the blocks stay as they are (a repair's own
 * events, whose blocks the mirror holds already).  0 or -ENOMEM. */
int kvb_index_record(struct kvb_index *m, const struct kvb_rev *rev);

/* Repairs (docs/router-events.md section 6, "Repairs").  Consumers lost
 * router events of a pair and were sent a "cleared" for it (the caller
 * records it with kvb_index_record()): the mirror keeps the pair's blocks
 * and marks every one of them missing, i.e. held by the engine but not by
 * the consumers, until kvb_index_repair_next() hands it out to be published
 * again.  From then on kvb_index_apply() keeps the marks true to what a
 * consumer does with each event: a store whose parent is missing is dropped
 * by the consumers, so its blocks are missing too; a store they take makes
 * its blocks held; a remove or a "cleared" takes missing blocks away with
 * the others.  0 or -ENOMEM. */
int kvb_index_repair_begin(struct kvb_index *m, uint64_t worker_id, uint32_t dp_rank);
/* The next stored event of a repair, over every pair: a missing block and
 * its missing ancestors, from the topmost one down (parents before
 * children), at most max_blocks, with parent_hash the block's parent when
 * consumers hold it (else none: its parent is gone, or a cycle); its blocks
 * count as held from now on.  event_id and epoch are the caller's to set
 * (kvb_convert_stamp).  1 and *out (valid until the next call), 0 when no
 * block is missing, -EAGAIN when `scan` entries were looked at without
 * finding one (call again later), -ENOMEM. */
int kvb_index_repair_next(struct kvb_index *m, uint32_t max_blocks, uint32_t scan,
                          struct kvb_rev *out);
/* Missing blocks of a pair, and over every pair. */
uint64_t kvb_index_missing(const struct kvb_index *m, uint64_t worker_id, uint32_t dp_rank);
uint64_t kvb_index_missing_total(const struct kvb_index *m);

/* After a load (the blocks applied as stored events): the pair's last
 * event_id is `last`, its ring empty (events_since() before it: -ESTALE). */
int kvb_index_set_last(struct kvb_index *m, uint64_t worker_id, uint32_t dp_rank, uint64_t last);

/* Gauges: resident blocks in one tier (over every pair), the bytes the
 * mirror holds, stores dropped for an unknown parent. */
uint64_t kvb_index_blocks(const struct kvb_index *m, int tier);
uint64_t kvb_index_bytes(const struct kvb_index *m);
uint64_t kvb_index_orphans(const struct kvb_index *m);

/* The last event_id applied for a pair: false when the pair is unknown. */
bool kvb_index_last_event_id(const struct kvb_index *m, uint64_t worker_id, uint32_t dp_rank,
                             uint64_t *out);

/* The pairs the mirror knows, for listing: up to cap into out; returns how
 * many there are. */
struct kvb_index_pair {
    uint64_t worker_id;
    uint32_t dp_rank;
};
size_t kvb_index_pairs(const struct kvb_index *m, struct kvb_index_pair *out, size_t cap);

/* Prefix match: the number of leading blocks of a request, given as its
 * blocks' tokens_hash values, that are resident in each tier (the walk a
 * router does: block i must be the child of block i-1 by tokens_hash). */
void kvb_index_match(const struct kvb_index *m, uint64_t worker_id, uint32_t dp_rank,
                     const uint64_t *tokens_hashes, size_t n, uint32_t matched[KVB_TIER__COUNT]);

/* Events after an event_id, from the ring, oldest first: fn is called for
 * each (the kvb_rev is valid during the call).  0, -ENOENT (unknown pair),
 * or -ESTALE when `since` + 1 is older than the ring holds. */
int kvb_index_events_since(struct kvb_index *m, uint64_t worker_id, uint32_t dp_rank,
                           uint64_t since, int (*fn)(void *ctx, const struct kvb_rev *rev),
                           void *ctx);

/* The same, from event_id `from` on (inclusive; from 0 is the whole ring):
 * -ESTALE when the ring no longer holds `from`. */
int kvb_index_events_from(struct kvb_index *m, uint64_t worker_id, uint32_t dp_rank, uint64_t from,
                          int (*fn)(void *ctx, const struct kvb_rev *rev), void *ctx);

/* A dump's consistent copy of one pair: every resident block of every tier
 * as of last_event_id.  Taking it copies the pair's entries (one memcpy of
 * 32 bytes per block) on the loop thread; ordering them for the dump happens
 * in kvb_index_snap_next(), on the caller's thread. */
struct kvb_index_snap;
int kvb_index_snapshot(const struct kvb_index *m, uint64_t worker_id, uint32_t dp_rank,
                       struct kvb_index_snap **out);
void kvb_index_snap_free(struct kvb_index_snap **s);
uint64_t kvb_index_snap_event_id(const struct kvb_index_snap *s);
bool kvb_index_snap_has_events(const struct kvb_index_snap *s); /* any event applied */
uint64_t kvb_index_snap_blocks(const struct kvb_index_snap *s);
/* The next stored router event of the dump (a chain of up to max_blocks
 * blocks, parents before children; a block whose parent is not resident
 * comes as a root, parent_hash null), with event_id = the snapshot's
 * last_event_id.  1 and *out (valid until the next call), or 0 at the end. */
int kvb_index_snap_next(struct kvb_index_snap *s, uint32_t max_blocks, struct kvb_rev *out);

/* The blocks of the last chain kvb_index_snap_next() returned are missing
 * (consumers lack them: a repair is to publish them); a chain never mixes
 * missing blocks with held ones. */
bool kvb_index_snap_missing(const struct kvb_index_snap *s);
/* After a load: rev's blocks are missing (or held), as saved. */
int kvb_index_mark(struct kvb_index *m, const struct kvb_rev *rev, bool missing);

/* A copy of a pair's ring of recent events (persistence): taking it copies
 * the records and their words on the loop thread; reading it, on any
 * thread.  kvb_index_ring_next(): 1 and *out (the pointers valid until the
 * copy is freed), oldest first, or 0 at the end.  Restoring is
 * kvb_index_record() of each event, oldest first, after kvb_index_set_last().
 * Freed by kvb_index_ring_free(&r) (accepts NULL). */
struct kvb_index_ring;
int kvb_index_ring_copy(const struct kvb_index *m, uint64_t worker_id, uint32_t dp_rank,
                        struct kvb_index_ring **out);
uint32_t kvb_index_ring_count(const struct kvb_index_ring *r);
int kvb_index_ring_next(struct kvb_index_ring *r, struct kvb_rev *out);
void kvb_index_ring_free(struct kvb_index_ring **r);

#endif
