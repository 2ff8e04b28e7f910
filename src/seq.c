/* seq: sequence tracking for one engine stream.  See include/seq.h. */
#include "seq.h"

#include <errno.h>
#include <string.h>

void kvb_stream_init(struct kvb_stream *s, const char *name, uint32_t cfg_rank)
{
    memset(s, 0, sizeof(*s));
    s->name = name;
    s->cfg_rank = cfg_rank;
}

int kvb_seq_classify(const struct kvb_stream *s, uint64_t seq)
{
    if (!s->has_last)
        return KVB_SEQ_FIRST;
    if (seq == s->last + 1) /* unsigned: wraps from 2^64-1 to 0 */
        return KVB_SEQ_NEXT;
    return seq > s->last ? KVB_SEQ_GAP : KVB_SEQ_BACK;
}

uint64_t kvb_seq_missing(const struct kvb_stream *s, uint64_t seq)
{
    return seq - s->last - 1;
}

bool kvb_stream_has_rank(const struct kvb_stream *s, uint32_t rank)
{
    for (uint32_t i = 0; i < s->n_ranks; i++)
        if (s->ranks[i] == rank)
            return true;
    return false;
}

int kvb_stream_add_rank(struct kvb_stream *s, uint32_t rank)
{
    if (kvb_stream_has_rank(s, rank))
        return 0;
    if (s->n_ranks >= KVB_MAX_STREAM_RANKS)
        return -ENOSPC;
    s->ranks[s->n_ranks++] = rank;
    return 0;
}
