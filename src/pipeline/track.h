/* track: what the pipeline remembers per stream to decide like Dynamo's
 * relay (docs/router-events.md section 8).
 *
 * Three tables, all keyed by (worker_id, dp_rank):
 *   - kinds: the KV cache spec kind last stored per KV cache group, which
 *     judges the events of that group that carry none;
 *   - namespaces: per block hash, the cache namespace (salt) its store used,
 *     or "ambiguous" (seen under two), which later stores without a
 *     namespace of their own inherit from their parent, and the tiers that
 *     stored it (the record goes when the last of them removes it);
 *   - copies: per (tier, block hash), the set of KV cache groups that hold
 *     it: a remove is published only when the last of them goes, and a store
 *     of a (hash, group) already held is a repeat, not a new copy.
 * Copies and namespaces together are bounded by max_entries; kinds by
 * KVB_TRACK_MAX_KINDS.
 *
 * Pure: no I/O, no clock, no globals.  Ownership: kvb_track_create() returns
 * a tracker the caller frees with kvb_track_destroy(&t) (accepts NULL).
 */
#ifndef KVB_TRACK_H
#define KVB_TRACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "convert.h"

#define KVB_TRACK_MAX_KINDS 1024 /* learned (worker, dp_rank, group) kinds */
#define KVB_TRACK_NO_GROUP 63    /* copies of events without group_idx (or >= 63) */

/* What a group's kind is, for the group filter. */
enum kvb_kind { KVB_KIND_NONE = 0, KVB_KIND_MAIN, KVB_KIND_OTHER, KVB_KIND_UNKNOWN };

/* A block's recorded namespace. */
enum kvb_ns_state { KVB_NS_NONE = 0, KVB_NS_SET, KVB_NS_AMBIGUOUS };

/* One (worker_id, dp_rank): every lookup names its pair. */
struct kvb_pair {
    uint64_t worker_id;
    uint32_t dp_rank;
};

struct kvb_track;

/* max_entries: copies and namespaces together (limits.max_tracked_blocks);
 * 0 = no tracking at all (every lookup finds nothing, nothing is kept,
 * every store is a new copy, never -ENOSPC). */
int kvb_track_create(uint64_t max_entries, struct kvb_track **out);
void kvb_track_destroy(struct kvb_track **t);
/* A new bound (reload): entries beyond it stay until the next reset. */
void kvb_track_set_max(struct kvb_track *t, uint64_t max_entries);

/* Kind of a spec kind string (Dynamo's KvCacheSpecKind): full_attention,
 * mla_attention, sink_full_attention are MAIN; the other known kinds
 * (sliding_window, mamba, chunked_local_attention, ...) OTHER; the rest
 * UNKNOWN. */
int kvb_kind_of(const char *s, size_t n);

/* Record the kind of (pair, group), replacing the last one.  false: the
 * kinds table is full (not recorded). */
bool kvb_track_learn(struct kvb_track *t, struct kvb_pair p, int64_t group, int kind);
/* The learned kind of (pair, group), or KVB_KIND_NONE. */
int kvb_track_kind(const struct kvb_track *t, struct kvb_pair p, int64_t group);

/* Namespaces.  ns is the namespace's term of the seed (never 0 for a set
 * one).  _get: the state of hash, *ns set for KVB_NS_SET. */
int kvb_track_ns_get(const struct kvb_track *t, struct kvb_pair p, uint64_t hash, uint64_t *ns);
/* A block stored on tier (enum kvb_tier) under namespace ns (has_ns) or
 * none.  Under one: recorded, or ambiguous when recorded under another.
 * Under none: an existing record becomes ambiguous.  A record notes every
 * tier that stored it.  -ENOSPC when full (nothing recorded). */
int kvb_track_ns_store(struct kvb_track *t, struct kvb_pair p, uint64_t hash, bool has_ns,
                       uint64_t ns, uint8_t tier);
/* A block removed from tier: the tier leaves its record; when no tier is
 * left (or none was noted) the record is forgotten unless ambiguous
 * (Dynamo's propagate_cache_namespace, cache_namespace_tiers). */
void kvb_track_ns_remove(struct kvb_track *t, struct kvb_pair p, uint64_t hash, uint8_t tier);
/* TierBlocksCleared of tier: the tier leaves every record of the pair; a
 * record left with no tier is forgotten, ambiguous or not
 * (clear_namespace_tier).  Records that noted no tier stay. */
void kvb_track_ns_clear_tier(struct kvb_track *t, struct kvb_pair p, uint8_t tier);

/* Copies.  _hold: (tier, hash) held by group: 1 a new copy, 0 a repeat
 * (already held by that group), -ENOSPC full (not recorded). */
int kvb_track_hold(struct kvb_track *t, struct kvb_pair p, uint8_t tier, uint64_t hash,
                   int64_t group);
/* Is (tier, hash) held by group (any group when group < 0)? */
bool kvb_track_holds(const struct kvb_track *t, struct kvb_pair p, uint8_t tier, uint64_t hash,
                     int64_t group);
/* A remove of (tier, hash) by group: 1 release (no copy left, or the hash
 * was never tracked), 0 held (other groups still hold it).  A group that
 * holds no copy releases nothing (Dynamo's dedup.rs takes another group's
 * copy, and the router loses a block the engine still holds); a remove
 * without a group takes the lowest group's copy. */
int kvb_track_release(struct kvb_track *t, struct kvb_pair p, uint8_t tier, uint64_t hash,
                      int64_t group);

/* TierBlocksCleared: the pair's copies of tier forgotten. */
void kvb_track_reset_tier(struct kvb_track *t, struct kvb_pair p, uint8_t tier);
/* "cleared" for the pair: its copies (every tier) and namespaces forgotten;
 * learned kinds stay (Dynamo keeps them too). */
void kvb_track_reset_pair(struct kvb_track *t, struct kvb_pair p);
/* Everything forgotten but the kinds. */
void kvb_track_reset(struct kvb_track *t);

/* Persistence (struct kvb_track_rec, convert.h): every entry to cb, kinds
 * first; _put writes one back as it was (a kind replaces the learned one,
 * a copy or namespace its entry): 0, -EINVAL (malformed) or -ENOSPC. */
void kvb_track_foreach(const struct kvb_track *t,
                       void (*cb)(void *ctx, const struct kvb_track_rec *r), void *ctx);
int kvb_track_put(struct kvb_track *t, const struct kvb_track_rec *r);

/* Entries held (copies and namespaces). */
uint64_t kvb_track_entries(const struct kvb_track *t);

#endif
