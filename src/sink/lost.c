/* lost: which (worker_id, dp_rank) pairs lost router events on the NATS
 * side (sink_priv.h kvb_sink_lost(), sink.h kvb_sink_take_lost_pairs()):
 * the sink's threads record them, the loop takes them and repairs those
 * pairs only. */
#include "sink_priv.h"

#include <string.h>

void kvb_sink_lost(struct kvb_sink *s, const struct kvb_sink_pair *p)
{
    pthread_mutex_lock(&s->lost_mu);
    size_t i = 0;
    while (p && i < s->n_lost &&
           (s->lost[i].worker_id != p->worker_id || s->lost[i].dp_rank != p->dp_rank))
        i++;
    if (!p || (i == s->n_lost && s->n_lost == KVB_SINK_LOST_PAIRS))
        s->lost_all = true;
    else if (i == s->n_lost)
        s->lost[s->n_lost++] = *p;
    pthread_mutex_unlock(&s->lost_mu);
}

size_t kvb_sink_take_lost_pairs(struct kvb_sink *s, struct kvb_sink_pair *out, size_t cap,
                                bool *all)
{
    pthread_mutex_lock(&s->lost_mu);
    size_t n = s->n_lost < cap ? s->n_lost : cap;
    memcpy(out, s->lost, n * sizeof(*out));
    *all = s->lost_all || n < s->n_lost;
    s->n_lost = 0;
    s->lost_all = false;
    pthread_mutex_unlock(&s->lost_mu);
    return n;
}
