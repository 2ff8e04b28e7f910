/* mirror_state: the residency mirror on disk (state.dir/kvbridge.mirror),
 * saved with the cursors it corresponds to and loaded at start.
 *
 * The file holds, per (worker_id, dp_rank): the epoch and the last event_id
 * the mirror had applied, its resident blocks as stored chains (the dump's
 * order, kvb_index_snap_next()), each marked when the consumers lack its
 * blocks (a repair under way owes them: it goes on after the load), and the
 * pair's ring of recent events, so that a consumer that asks for the events
 * since an id from before a restart gets them (/v1/events, the recovery
 * query).  It is consistent with a cursor file (state.h) when, for the
 * pair, last + 1 is the event_id counter's next id in the same epoch: the
 * mirror then holds exactly what the published events up to the saved
 * cursors say.  Format (host byte order, checked by magic, version, sizes
 * and a final XXH64 of everything before it):
 *   "KVBMIRR1", u32 version 2, u32 pairs,
 *   per pair: u64 worker_id, u32 dp_rank, u32 has_last, u64 last, u64 epoch,
 *             then per chain: u8 tier, u8 has_parent, u8 flags (1: missing),
 *             u8 0, u32 n, u64 parent, n x (u64 block_hash, u64 tokens_hash);
 *             then the end mark: u8 0xff and 7 zero bytes;
 *             then u32 events, u32 0, and per event of the ring, oldest
 *             first (the last one is `last`): u64 event_id, u64 epoch,
 *             u8 type, u8 tier, u8 has_parent, u8 flags (1: a "cleared" of
 *             its tier only; 0 in files of older builds), u32 n, u64 parent,
 *             then its words: n x (u64 block_hash, u64 tokens_hash) for a
 *             store, n x u64 for a remove, none for a "cleared"
 *   u64 xxh64
 * Version 1 (no flags, no rings) is still read: its pairs load with an
 * empty ring.
 *
 * Saving (kvb_persist_save_start()) takes the snapshots on the caller's (the
 * loop's) thread: one memcpy per pair, no I/O; a thread of its own orders
 * them, writes the file (temp file through a 64 KiB buffer, fsync, rename,
 * fsync of the directory), then writes the cursor file that goes with it
 * (kvb_state_save()), so the cursors on disk are never newer than the
 * mirror.  One save at a time; a new one is refused (-EBUSY) until 3 x the
 * last write's duration after it ended, which bounds the I/O to a quarter
 * of the time (the loop itself saves at most once a second).
 *
 * Ownership: the saver (kvb_persist_create()) is the loop's; destroy
 * waits for a write in progress.  save_start takes ownership of *st (sets
 * it to NULL) on success.
 */
#ifndef KVB_PERSIST_H
#define KVB_PERSIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "index.h"
#include "state.h"

#define KVB_MIRROR_FILE "kvbridge.mirror"

struct kvb_persist;

int kvb_persist_create(struct kvb_persist **out);
void kvb_persist_destroy(struct kvb_persist **s);

/* Start saving m (every pair whose event_id counter is in *st, with that
 * counter's epoch) and then *st, into dir; m NULL (no mirror): *st alone,
 * on the saver's thread all the same (the block tracker makes it large).  0 (started: *st is the saver's
 * now), -EBUSY (a save is in progress or too recent; nothing started), or
 * -ENOMEM.  With wait, first waits for a save in progress and ignores the
 * pacing, then waits for this one: 0 or the write's error. */
int kvb_persist_save_start(struct kvb_persist *s, const struct kvb_index *m, const char *dir,
                           struct kvb_state **st, bool wait);
/* A save in progress, or the last one too recent (-EBUSY from start). */
bool kvb_persist_save_busy(struct kvb_persist *s);
/* The result of the last completed save (0 or a negative errno), once. */
int kvb_persist_save_result(struct kvb_persist *s, bool *done);

/* Load dir's file into m for the pairs it holds consistently with the
 * counters of `cursors` (see above), and list (worker_id, dp_rank) of every
 * counter of `cursors` it cannot vouch for (no file, corrupt, stale, another
 * epoch): those need a barrier.  Returns the number of such pairs (up to cap
 * written to out), or a negative errno (-ENOMEM). */
int kvb_persist_load(struct kvb_index *m, const char *dir, const struct kvb_state *cursors,
                     struct kvb_index_pair *out, size_t cap, size_t *n_loaded);

#endif
