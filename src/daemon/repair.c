/* repair: router events lost on the NATS side, repaired from the residency
 * mirror (docs/router-events.md section 6, "Repairs"; daemon_priv.h).
 *
 * The engine's state was not lost, only what the consumers heard of it: so
 * each pair concerned gets its "cleared" (marked kvb_rev.repair: the mirror
 * keeps its blocks and marks them missing), and then, over the next turns,
 * its resident blocks as stored events with the pair's next event_ids,
 * through the publish stage like any other router event.  The engines are
 * read meanwhile: the mirror keeps the marks true to what the consumers do
 * with each live event, so the repair never publishes a block the engine
 * removed, and a store the consumers dropped (its parent was still missing)
 * is published again after its parent.
 *
 * Pace: a token bucket of nats.repair_bytes_per_s (one second's worth at
 * most), at most REPAIR_TURN_BLOCKS blocks per turn, nothing while NATS is
 * away or its buffer a quarter full (a repair never causes backpressure).
 * With the mirror off a repair is the bare "cleared" it always was.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon_priv.h"
#include "log.h"
#include "mirror.h"
#include "pipeline.h"
#include "publish.h"
#include "sink.h"
#include "source.h"

#define REPAIR_TURN_BLOCKS 16384u /* blocks per turn: the loop stays responsive */
#define REPAIR_EVENT_BLOCKS 256u  /* blocks per stored event */
#define REPAIR_BLOCK_BYTES 48u    /* the least a block costs on the wire, for pacing */

int kvb_daemon_repair_pair(struct kvb_daemon *d, uint64_t worker_id, uint32_t dp_rank, int cause)
{
    if (!kvb_mirror_on(d->res))
        return kvb_pipeline_cleared(d->pipe, worker_id, dp_rank, cause);
    int rc = kvb_pipeline_repair_cleared(d->pipe, worker_id, dp_rank, cause);
    if (rc > 0)
        kvb_inc(&d->m.repairs_total[cause == KVB_BAR_NATS_RECONNECT ? KVB_REP_NATS_RECONNECT
                                                                    : KVB_REP_NATS_LOST]);
    return rc;
}

struct pair {
    uint64_t worker_id;
    uint32_t dp_rank;
};

struct pairs {
    struct kvb_daemon *d;
    struct pair *v;
    size_t n, cap;
    int err;
};

static void add_pair(struct pairs *ps, uint64_t worker, uint32_t rank)
{
    for (size_t i = 0; i < ps->n; i++)
        if (ps->v[i].worker_id == worker && ps->v[i].dp_rank == rank)
            return;
    if (ps->n == ps->cap) {
        size_t cap = ps->cap ? ps->cap * 2 : 16;
        struct pair *v = realloc(ps->v, cap * sizeof(*v));
        if (!v) {
            ps->err = -ENOMEM;
            return;
        }
        ps->v = v;
        ps->cap = cap;
    }
    ps->v[ps->n++] = (struct pair){worker, rank};
}

/* The pairs of a stream that applied a batch: its worker's, for the ranks
 * it has seen (or its configured one). */
static void stream_pairs(void *ctx, const char *source, const char *topic,
                         const struct kvb_stream *st)
{
    struct pairs *ps = ctx;
    (void)source;
    (void)topic;
    if (!st->has_last)
        return;
    uint64_t w = st->worker ? st->worker->worker_id : ps->d->cfg->worker_id;
    if (!st->n_ranks)
        add_pair(ps, w, st->cfg_rank);
    for (uint32_t i = 0; i < st->n_ranks; i++)
        add_pair(ps, w, st->ranks[i]);
}

void kvb_daemon_repair_all(struct kvb_daemon *d, int cause)
{
    struct pairs ps = {.d = d};
    for (size_t i = 0; i < d->n_src; i++)
        if (d->src[i]) /* NULL: a listed rank not open */
            kvb_source_foreach_stream(d->src[i], stream_pairs, &ps);
    if (ps.err < 0) /* never a pair without its barrier: one per stream */
        kvb_err("main", "repair: %s: a \"cleared\" for every stream instead", strerror(-ps.err));
    for (size_t i = 0; ps.err < 0 && i < d->n_src; i++)
        if (d->src[i])
            kvb_source_barrier_all(d->src[i], cause);
    for (size_t i = 0; ps.err == 0 && i < ps.n; i++) {
        int rc = kvb_daemon_repair_pair(d, ps.v[i].worker_id, ps.v[i].dp_rank, cause);
        if (rc < 0)
            kvb_err("main", "worker_id %llu dp_rank %u: barrier: %s",
                    (unsigned long long)ps.v[i].worker_id, ps.v[i].dp_rank, strerror(-rc));
    }
    free(ps.v);
    if (kvb_mirror_missing(d->res))
        kvb_info("main", "repairing from the residency mirror: %llu blocks to publish again",
                 (unsigned long long)kvb_mirror_missing(d->res));
}

/* The bucket, refilled to now: nats.repair_bytes_per_s, one second deep. */
static void refill(struct kvb_daemon *d, uint64_t now)
{
    int64_t rate = (int64_t)d->cfg->nats.repair_bytes_per_s;
    if (!d->repair_at) {
        d->repair_tokens = rate;
    } else if (now > d->repair_at) {
        int64_t add = (int64_t)((now - d->repair_at) * (uint64_t)rate / 1000);
        d->repair_tokens = d->repair_tokens + add > rate ? rate : d->repair_tokens + add;
    }
    d->repair_at = now;
}

/* NATS takes more now: connected, its buffer under a quarter full. */
static bool nats_takes(const struct kvb_daemon *d)
{
    uint64_t quarter = d->cfg->nats.reconnect_buffer_bytes / 4;
    return kvb_sink_connected(d->sink) && kvb_sink_pending_bytes(d->sink) < quarter;
}

long kvb_daemon_repair_wait(struct kvb_daemon *d, uint64_t now)
{
    if (!kvb_mirror_missing(d->res) || !kvb_sink_connected(d->sink))
        return -1; /* nothing owed, or the reconnection wakes the loop */
    if (!nats_takes(d))
        return PAUSED_POLL_MS;
    refill(d, now);
    if (d->repair_tokens > 0)
        return 0;
    uint64_t rate = d->cfg->nats.repair_bytes_per_s;
    return (long)((uint64_t)-d->repair_tokens * 1000 / rate) + 1;
}

void kvb_daemon_repair_step(struct kvb_daemon *d, uint64_t now)
{
    if (!kvb_mirror_missing(d->res) || !nats_takes(d))
        return;
    refill(d, now);
    uint64_t start = kvb_publish_bytes(d->out), blocks = 0;
    while (blocks < REPAIR_TURN_BLOCKS) {
        uint64_t spent = kvb_publish_bytes(d->out) - start;
        if (spent < blocks * REPAIR_BLOCK_BYTES) /* batched, not handed on yet */
            spent = blocks * REPAIR_BLOCK_BYTES;
        if ((int64_t)spent >= d->repair_tokens)
            break;
        struct kvb_rev rev;
        int rc = kvb_mirror_repair_next(d->res, REPAIR_EVENT_BLOCKS, &rev);
        if (rc == 1)
            rc = kvb_pipeline_repair_stored(d->pipe, &rev);
        if (rc == -EAGAIN || rc == 0)
            break;
        if (rc < 0) {
            kvb_log_rl(&d->repair_rl, KVB_LOG_ERROR, "main", "repair: %s", strerror(-rc));
            break;
        }
        blocks += rev.n;
    }
    kvb_publish_flush(d->out);
    d->repair_tokens -= (int64_t)(kvb_publish_bytes(d->out) - start);
    kvb_add(&d->m.repaired_blocks_total[0], blocks);
    if (blocks && !kvb_mirror_missing(d->res))
        kvb_info("main", "repair done: the consumers hold every resident block again");
}
