/* state: cursors persisted across restarts (state.dir).
 *
 * One file, STATE_DIR/kvbridge.state, written whole: temp file, fsync,
 * rename, fsync of the directory, so a crash leaves the old or the new file,
 * never half of one.  It holds, consistently as of one moment between two
 * batches (after a NATS flush confirmed everything before it):
 *   - every event_id counter: worker_id, dp_rank, next id, epoch;
 *   - every stream: source endpoint, topic, last applied seq, dp_ranks seen;
 *   - the pipeline's block tracker (kinds, copies, cache namespaces:
 *     docs/router-events.md section 8), so that a resumed restart decides
 *     on later events as the uncut stream would.
 *
 * Ownership: kvb_state_load() allocates a kvb_state the caller frees with
 * kvb_state_free(&s) (accepts NULL).
 */
#ifndef KVB_STATE_H
#define KVB_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "convert.h"
#include "replay.h"

struct kvb_state_stream {
    char source[256];
    char topic[256];
    uint64_t last;
    uint32_t n_ranks;
    uint32_t ranks[KVB_MAX_STREAM_RANKS];
};

struct kvb_state {
    struct kvb_id_counter *counters;
    size_t n_counters, cap_counters;
    struct kvb_state_stream *streams;
    size_t n_streams, cap_streams;
    struct kvb_track_rec *track;
    size_t n_track, cap_track;
};

/* Make DIR usable before anything is saved there (--check and start): create
 * it and its missing parents with mode 0700, then create and remove a
 * temporary file in it.  0, or -errno with *what set to the step that failed
 * ("cannot create", "cannot use", "cannot write to"). */
int kvb_state_prepare_dir(const char *dir, const char **what);

/* 0 and *out; -ENOENT when there is no state yet; -EINVAL for a corrupt
 * file (it is then ignored: start as if there were none, with barriers). */
int kvb_state_load(const char *dir, struct kvb_state **out);
int kvb_state_save(const char *dir, const struct kvb_state *s);
void kvb_state_free(struct kvb_state **s);

/* Building a state to save (the caller owns it). */
struct kvb_state *kvb_state_new(void);
int kvb_state_add_counter(struct kvb_state *s, const struct kvb_id_counter *c);
int kvb_state_add_stream(struct kvb_state *s, const char *source, const char *topic,
                         const struct kvb_stream *st);
int kvb_state_add_track(struct kvb_state *s, const struct kvb_track_rec *r);
/* A copy of an entry of another state. */
int kvb_state_add_entry(struct kvb_state *s, const struct kvb_state_stream *e);
const struct kvb_state_stream *kvb_state_find_stream(const struct kvb_state *s, const char *source,
                                                     const char *topic);

#endif
