/* seq: sequence tracking for one engine stream (router-events.md section 6).
 *
 * A stream is one (source endpoint, topic) pair.  Pure: the caller owns the
 * struct (plain data, nothing to free) and decides what to do with a verdict.
 */
#ifndef KVB_SEQ_H
#define KVB_SEQ_H

#include <stdbool.h>
#include <stdint.h>

#define KVB_MAX_STREAM_RANKS 64

struct kvb_stream {
    const char *name;   /* for logs; not owned */
    const char *source, *topic; /* raw format headers (KV-Source, KV-Topic); not
                                 * owned, NULL when the owner set none */
    uint32_t cfg_rank;  /* the source's configured dp_rank */
    bool has_last;
    uint64_t last;      /* last seq applied */
    uint32_t n_ranks;   /* dp_ranks seen (and started) on this stream */
    uint32_t ranks[KVB_MAX_STREAM_RANKS];
    uint64_t batches;   /* batches applied (live or replayed) */
    uint64_t events;    /* engine events in them */
    uint64_t gaps;      /* sequence gaps seen */
};

enum kvb_seq_verdict {
    KVB_SEQ_FIRST, /* nothing applied yet */
    KVB_SEQ_NEXT,  /* last + 1 */
    KVB_SEQ_GAP,   /* > last + 1 */
    KVB_SEQ_BACK,  /* <= last: the engine restarted (outside a replay) */
};

void kvb_stream_init(struct kvb_stream *s, const char *name, uint32_t cfg_rank);
int kvb_seq_classify(const struct kvb_stream *s, uint64_t seq);
/* Number of seqs missing before seq (valid for KVB_SEQ_GAP). */
uint64_t kvb_seq_missing(const struct kvb_stream *s, uint64_t seq);
bool kvb_stream_has_rank(const struct kvb_stream *s, uint32_t rank);
/* Remember rank; -ENOSPC when the stream already has KVB_MAX_STREAM_RANKS. */
int kvb_stream_add_rank(struct kvb_stream *s, uint32_t rank);

#endif
