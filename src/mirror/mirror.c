/* residency: the mirror fed by the loop, and the queries served from it.
 * See include/mirror.h. */
#include "mirror.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "config.h"
#include "index.h"
#include "log.h"
#include "persist.h"
#include "query.h"
#include "query_nats.h"
#include "sink.h"
#include "subject.h"

#define REPAIR_SCAN 65536u /* entries one kvb_mirror_repair_next() looks at */

struct kvb_mirror {
    struct kvb_metrics *m;
    struct kvb_index *mirror; /* NULL: off */
    struct kvb_query *query;
    uint64_t max_blocks;
    struct kvb_ratelimit rl_full;
    char subject[512];         /* query.subject expanded; "" = none */
    struct kvb_persist *saver; /* state.dir */
};

static void add_worker(struct kvb_query_cfg *q, uint64_t w, const struct kvb_source_cfg *sc)
{
    if (q->n_workers < KVB_QUERY_MAX_WORKERS)
        q->workers[q->n_workers++] = (struct kvb_query_worker){w, sc->block_size, sc->lora_salt};
}

static struct kvb_query_cfg query_cfg(const struct kvb_config *c)
{
    struct kvb_query_cfg q = {
        .worker_id = c->worker_id, .block_size = c->block_size, .lora_salt = c->lora_salt};
    for (size_t i = 0; i < c->n_sources; i++) { /* each source's worker(s) */
        const struct kvb_source_cfg *sc = &c->sources[i];
        if (!sc->n_topics)
            add_worker(&q, sc->worker_id, sc);
        for (size_t t = 0; t < sc->n_topics; t++)
            add_worker(&q, sc->topics[t].worker_id, sc);
    }
    return q;
}

int kvb_mirror_create(const struct kvb_config *c, struct kvb_metrics *m, int wake_fd,
                      struct kvb_mirror **out)
{
    struct kvb_mirror *r = calloc(1, sizeof(*r));
    if (!r)
        return -ENOMEM;
    r->m = m;
    r->max_blocks = c->limits.max_resident_blocks;
    r->rl_full = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(10000, 3);
    struct kvb_query_cfg qc = query_cfg(c);
    int rc = 0;
    if (c->query.subject[0] &&
        (rc = kvb_subject_expand(c->query.subject, c->nats.namespace_, c->nats.component,
                                 c->worker_id, 0, r->subject, sizeof(r->subject))) > 0)
        rc = 0;
    if (rc == 0)
        rc = kvb_query_create(&qc, m, wake_fd, &r->query);
    if (rc == 0 && r->max_blocks) {
        struct kvb_index_cfg mc = {.max_blocks = r->max_blocks,
                                   .recent_events = c->query.recent_events};
        rc = kvb_index_create(&mc, &r->mirror);
    }
    /* state.dir is written off the loop, with or without the mirror: the
     * block tracker's lines make the cursor file tens of MB */
    if (rc == 0 && c->state.dir[0])
        rc = kvb_persist_create(&r->saver);
    if (rc < 0) {
        kvb_mirror_destroy(&r);
        return rc;
    }
    *out = r;
    return 0;
}

void kvb_mirror_destroy(struct kvb_mirror **pr)
{
    struct kvb_mirror *r = pr ? *pr : NULL;
    if (!r)
        return;
    kvb_query_close(r->query);
    kvb_query_destroy(&r->query);
    kvb_persist_destroy(&r->saver); /* waits for a write in progress */
    kvb_index_destroy(&r->mirror);
    free(r);
    *pr = NULL;
}

void kvb_mirror_reconfigure(struct kvb_mirror *r, const struct kvb_config *c)
{
    if (!r)
        return;
    struct kvb_query_cfg qc = query_cfg(c);
    kvb_query_set_config(r->query, &qc);
}

int kvb_mirror_apply(struct kvb_mirror *r, const struct kvb_rev *rev)
{
    if (!r || !r->mirror)
        return 0;
    if (rev->repair) { /* the mirror's own blocks: recorded, not applied */
        int rc = rev->type == KVB_REVT_CLEARED
                     ? kvb_index_repair_begin(r->mirror, rev->worker_id, rev->dp_rank)
                     : 0;
        if (rc == 0 && kvb_index_record(r->mirror, rev) == 0)
            return 0;
        /* out of memory: as an ordinary event (a "cleared" empties the pair) */
    }
    int rc = kvb_index_apply(r->mirror, rev);
    if (rc == 0)
        return 0;
    kvb_inc(&r->m->mirror_overflows_total[0]);
    kvb_log_rl(&r->rl_full, KVB_LOG_ERROR, "mirror",
               "worker_id %llu dp_rank %u: %s (event_id %llu, %u blocks; "
               "limits.max_resident_blocks %llu): publishing a barrier for the pair",
               (unsigned long long)rev->worker_id, rev->dp_rank,
               rc == -ENOSPC ? "residency mirror full" : strerror(-rc),
               (unsigned long long)rev->event_id, rev->n, (unsigned long long)r->max_blocks);
    return -ENOSPC;
}

int kvb_mirror_observe(void *ctx, const struct kvb_rev *rev)
{
    return kvb_mirror_apply(ctx, rev) == -ENOSPC && rev->type != KVB_REVT_CLEARED;
}

bool kvb_mirror_on(const struct kvb_mirror *r) { return r && r->mirror; }

uint64_t kvb_mirror_missing(const struct kvb_mirror *r)
{
    return kvb_mirror_on(r) ? kvb_index_missing_total(r->mirror) : 0;
}

int kvb_mirror_repair_next(struct kvb_mirror *r, uint32_t max_blocks, struct kvb_rev *out)
{
    if (!kvb_mirror_on(r))
        return 0;
    return kvb_index_repair_next(r->mirror, max_blocks, REPAIR_SCAN, out);
}

void kvb_mirror_serve(struct kvb_mirror *r)
{
    if (!r)
        return;
    kvb_query_serve(r->query, r->mirror);
}

void kvb_mirror_gauges(struct kvb_mirror *r)
{
    if (!r || !r->mirror)
        return;
    for (int t = 0; t < KVB_TIER__COUNT; t++)
        kvb_set(&r->m->mirror_resident_blocks[t], kvb_index_blocks(r->mirror, t));
    kvb_set(&r->m->mirror_bytes[0], kvb_index_bytes(r->mirror));
    kvb_set(&r->m->mirror_orphans_total[0], kvb_index_orphans(r->mirror));
    kvb_set(&r->m->repair_missing_blocks[0], kvb_index_missing_total(r->mirror));
}

int kvb_mirror_save_result(struct kvb_mirror *r, bool *done)
{
    *done = false;
    return r && r->saver ? kvb_persist_save_result(r->saver, done) : 0;
}

bool kvb_mirror_persists(const struct kvb_mirror *r) { return r && r->saver; }

bool kvb_mirror_save_busy(struct kvb_mirror *r)
{
    return r && r->saver && kvb_persist_save_busy(r->saver);
}

int kvb_mirror_save(struct kvb_mirror *r, const char *dir, struct kvb_state **st, bool wait)
{
    if (!kvb_mirror_persists(r))
        return -ENOTSUP;
    return kvb_persist_save_start(r->saver, r->mirror, dir, st, wait);
}

int kvb_mirror_load(struct kvb_mirror *r, const char *dir, const struct kvb_state *cursors,
                    void (*barrier)(void *ctx, uint64_t worker_id, uint32_t dp_rank), void *ctx)
{
    if (!r || !r->mirror || !cursors)
        return 0;
    size_t cap = cursors->n_counters, loaded = 0;
    struct kvb_index_pair *v = calloc(cap ? cap : 1, sizeof(*v));
    if (!v)
        return -ENOMEM;
    int n = kvb_persist_load(r->mirror, dir, cursors, v, cap, &loaded);
    if (n < 0) {
        free(v);
        return n;
    }
    kvb_info("state", "%s: residency mirror: %zu pair(s) loaded (%llu blocks), %d to clear", dir,
             loaded, (unsigned long long)kvb_index_blocks(r->mirror, -1), n);
    for (int i = 0; i < n; i++)
        barrier(ctx, v[i].worker_id, v[i].dp_rank);
    free(v);
    return n;
}

struct kvb_query *kvb_mirror_query(struct kvb_mirror *r) { return r ? r->query : NULL; }

void kvb_mirror_close(struct kvb_mirror *r)
{
    if (r)
        kvb_query_close(r->query);
}

int kvb_mirror_attach(struct kvb_mirror *r, struct kvb_sink *sink)
{
    if (!r || !r->subject[0] || !sink)
        return 0;
    int rc = kvb_sink_serve(sink, r->subject, kvb_query_nats_handle, r->query);
    if (rc == 0)
        kvb_info("query", "answering queries on NATS subject %s", r->subject);
    return rc;
}

void kvb_mirror_detach(struct kvb_mirror *r, struct kvb_sink *sink)
{
    if (!r || !sink)
        return;
    kvb_sink_unserve(sink);
    /* a request callback may be waiting for this (the loop) thread: serve
     * until none is left (bounded by the hub's own wait) */
    uint64_t until = kvb_mono_ms() + 10000;
    while (kvb_sink_serving(sink) && kvb_mono_ms() < until) {
        kvb_query_serve(r->query, r->mirror);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}
