/* pipeline: see include/pipeline.h. */
#include "pipeline.h"

#include "coalesce.h"

#include <errno.h>
#include <stdlib.h>

#include "config.h"
#include "log.h"

#define LORA_LOGGED_MAX 64 /* unmapped LoRA ids each logged once; more: rate-limited */

struct lora_seen {
    uint64_t worker_id;
    int64_t lora_id;
};

struct kvb_pipeline {
    struct kvb_pipeline_cfg cfg;
    struct kvb_metrics *m;
    struct kvb_publish *pub;
    struct kvb_decoder *dec;
    struct kvb_converter *conv;
    struct kvb_ratelimit rl_mismatch, rl_malformed;
    struct kvb_batch_info last;
    struct kvb_worker_cfg def; /* cfg.convert's worker: streams without their own */
    struct lora_seen lora_logged[LORA_LOGGED_MAX]; /* unmapped ids already logged */
    size_t n_lora_logged;
    struct kvb_ratelimit rl_lora;
    struct kvb_coalesce co; /* cfg.coalesce: the pending merged event */
};

/* Convert for worker w from now on. */
static void use(struct kvb_pipeline *p, const struct kvb_worker_cfg *w)
{
    kvb_converter_select(p->conv, w);
}

/* The worker of stream s (a source's or a topic's), selected. */
static const struct kvb_worker_cfg *use_stream(struct kvb_pipeline *p, const struct kvb_stream *s)
{
    const struct kvb_worker_cfg *w = s->worker ? s->worker : &p->def;
    use(p, w);
    return w;
}

int kvb_pipeline_create(const struct kvb_pipeline_cfg *cfg, struct kvb_metrics *m,
                        struct kvb_publish *pub, struct kvb_pipeline **out)
{
    int rc = -ENOMEM;
    struct kvb_pipeline *p = calloc(1, sizeof(*p));
    if (!p)
        goto fail;
    p->cfg = *cfg;
    p->m = m;
    p->pub = pub;
    p->rl_mismatch = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(10000, 3);
    p->rl_malformed = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(10000, 5);
    p->rl_lora = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(60000, 1);
    p->dec = kvb_decoder_create(&cfg->limits);
    if (!p->dec)
        goto fail;
    if ((rc = kvb_converter_create(&cfg->convert, m, &p->conv)) < 0)
        goto fail;
    p->def = kvb_convert_cfg_worker(&cfg->convert);
    *out = p;
    return 0;
fail:
    kvb_pipeline_destroy(&p);
    return rc;
}

void kvb_pipeline_destroy(struct kvb_pipeline **pp)
{
    if (!pp || !*pp)
        return;
    struct kvb_pipeline *p = *pp;
    kvb_decoder_destroy(&p->dec);
    kvb_converter_destroy(&p->conv);
    kvb_coalesce_free(&p->co);
    free(p);
    *pp = NULL;
}

int kvb_pipeline_reconfigure(struct kvb_pipeline *p, const struct kvb_pipeline_cfg *cfg)
{
    struct kvb_decoder *dec = kvb_decoder_create(&cfg->limits);
    if (!dec)
        return -ENOMEM;
    kvb_decoder_destroy(&p->dec);
    p->dec = dec;
    p->cfg = *cfg;
    kvb_converter_set_config(p->conv, &cfg->convert);
    p->def = kvb_convert_cfg_worker(&cfg->convert);
    return 0;
}

struct kvb_decoder *kvb_pipeline_decoder(struct kvb_pipeline *p) { return p->dec; }
const struct kvb_batch_info *kvb_pipeline_last_batch(const struct kvb_pipeline *p)
{
    return &p->last;
}
struct kvb_converter *kvb_pipeline_converter(struct kvb_pipeline *p) { return p->conv; }

static int cleared(struct kvb_pipeline *p, uint32_t rank, int cause, bool repair);

/* One router event to the publish stage: 1, or 2 with the "cleared" that
 * the publish stage's observer asked for (the residency mirror could not
 * take the event), published right after it: the consumers and the mirror
 * empty the pair together.  The converter's worker is the event's. */
static int emit(struct kvb_pipeline *p, const struct kvb_rev *r)
{
    if (kvb_publish_event(p->pub, r) <= 0 || r->type == KVB_REVT_CLEARED)
        return 1;
    int rc = cleared(p, r->dp_rank, KVB_BAR_MIRROR_FULL, false);
    return rc < 0 ? rc : 1 + rc;
}

/* nats.coalesce: the pending merged event, published. */
static int flush(struct kvb_pipeline *p)
{
    if (!p->co.has) /* the common case, and always with coalesce off */
        return 0;
    const struct kvb_rev *q = kvb_coalesce_take(&p->co);
    return q ? emit(p, q) : 0;
}

/* nats.coalesce: one converted event of a batch merged into the pending one (its event_id given back) or
 * held as the new pending one.  What it published, as emit(). */
static int offer(struct kvb_pipeline *p, const struct kvb_rev *r)
{
    if (kvb_coalesce_can_join(&p->co, r) && kvb_coalesce_join(&p->co, r) == 0) {
        kvb_convert_give_back(p->conv, r);
        return 0;
    }
    int n = flush(p);
    if (n < 0)
        return n;
    if (r->type != KVB_REVT_CLEARED && kvb_coalesce_hold(&p->co, r) == 0)
        return n;
    int rc = emit(p, r); /* a "cleared", or no memory to hold it */
    return rc < 0 ? rc : n + rc;
}

static int cleared(struct kvb_pipeline *p, uint32_t rank, int cause, bool repair)
{
    /* Nothing published for the pair since its last "cleared": the router
     * holds nothing of it, and another one would say nothing new (a run of
     * bad batches would publish one per batch and rank: 3.36M for 56k
     * batches under dp_rank churn).  Not for losses on the NATS side:
     * what NATS lost may be that last "cleared". */
    bool nats = cause == KVB_BAR_NATS_LOST || cause == KVB_BAR_NATS_RECONNECT;
    if (!nats && kvb_convert_pair_state(p->conv, rank) == KVB_PAIR_CLEAN) {
        kvb_converter_forget(p->conv, rank);
        kvb_inc(&p->m->barriers_redundant_total[0]);
        return 0;
    }
    /* a repair publishes the resident blocks again: the copies stay known */
    if (!repair)
        kvb_converter_forget(p->conv, rank);
    struct kvb_rev r;
    int rc = kvb_convert_cleared(p->conv, rank, &r);
    if (rc < 0)
        return rc;
    r.repair = repair;
    kvb_inc(&p->m->barriers_total[cause]);
    return emit(p, &r);
}

/* The worker of (worker_id, *): a "cleared" or a repair's stored event uses
 * nothing else of it. */
static void use_worker(struct kvb_pipeline *p, uint64_t worker_id)
{
    struct kvb_worker_cfg w = p->def;
    w.worker_id = worker_id;
    use(p, &w);
}

int kvb_pipeline_cleared(struct kvb_pipeline *p, uint64_t worker_id, uint32_t dp_rank, int cause)
{
    use_worker(p, worker_id);
    return cleared(p, dp_rank, cause, false);
}

int kvb_pipeline_repair_cleared(struct kvb_pipeline *p, uint64_t worker_id, uint32_t dp_rank,
                                int cause)
{
    use_worker(p, worker_id);
    return cleared(p, dp_rank, cause, true);
}

int kvb_pipeline_repair_stored(struct kvb_pipeline *p, const struct kvb_rev *rev)
{
    struct kvb_rev r = *rev;
    use_worker(p, rev->worker_id);
    int rc = kvb_convert_stamp(p->conv, rev->dp_rank, &r);
    if (rc < 0)
        return rc;
    r.repair = true;
    return emit(p, &r);
}

int kvb_pipeline_barrier(struct kvb_pipeline *p, const struct kvb_stream *s, int cause)
{
    use_stream(p, s);
    if (s->n_ranks == 0) /* nothing seen yet: its configured rank */
        return cleared(p, s->cfg_rank, cause, false);
    int n = 0;
    for (uint32_t i = 0; i < s->n_ranks; i++) {
        int rc = cleared(p, s->ranks[i], cause, false);
        if (rc < 0)
            return rc;
        n += rc;
    }
    return n;
}

/* The block tracker was full: it forgot everything, so every pair the
 * converter published for gets its "cleared" (docs/router-events.md section
 * 8), then the stream's worker is selected again.  The number published, or
 * a negative errno. */
static int tracker_overflow(struct kvb_pipeline *p, const struct kvb_worker_cfg *w)
{
    if (!kvb_converter_take_overflow(p->conv))
        return 0;
    /* the pending merged event was converted before the barriers: it goes
     * first, so event_ids stay in order */
    int sum = flush(p), rc = 0;
    if (sum < 0)
        return sum;
    kvb_warn("convert", "the block tracker is full (limits.max_tracked_blocks): it starts "
                        "again empty, and every pair gets a barrier");
    size_t n = kvb_converter_counters(p->conv, NULL, 0);
    struct kvb_id_counter *all = calloc(n ? n : 1, sizeof(*all));
    if (!all)
        return -ENOMEM;
    kvb_converter_counters(p->conv, all, n);
    for (size_t i = 0; i < n && rc >= 0; i++) {
        use_worker(p, all[i].worker_id);
        rc = cleared(p, all[i].dp_rank, KVB_BAR_TRACKER_FULL, false);
        sum += rc > 0 ? rc : 0;
    }
    free(all);
    use(p, w);
    return rc < 0 ? rc : sum;
}

static int malformed(struct kvb_pipeline *p, const struct kvb_stream *s, uint64_t seq,
                     const char *why)
{
    kvb_inc(&p->m->malformed_messages_total[KVB_MAL_BATCH]);
    kvb_log_rl(&p->rl_malformed, KVB_LOG_WARN, "decode",
               "%s: seq %llu: malformed batch (%s): publishing barrier", s->name,
               (unsigned long long)seq, why);
    return kvb_pipeline_barrier(p, s, KVB_BAR_MALFORMED);
}

/* A published BlockStored of a LoRA whose name is not known (a lora_id that
 * sources[].lora_names does not list): counted; each id logged once (the
 * first LORA_LOGGED_MAX of them, then one line a minute). */
static void unmapped_lora(struct kvb_pipeline *p, const struct kvb_stream *s,
                          const struct kvb_worker_cfg *w, const struct kvb_event *ev)
{
    struct kvb_str name;
    if (!w->lora_salt ||
        kvb_lora_name_of(w->lora_names, w->n_lora_names, ev, &name) != KVB_LORA_UNMAPPED)
        return;
    kvb_inc(&p->m->stores_unsalted_total[KVB_UNS_UNMAPPED_LORA_ID]);
    for (size_t i = 0; i < p->n_lora_logged; i++)
        if (p->lora_logged[i].worker_id == w->worker_id &&
            p->lora_logged[i].lora_id == ev->lora_id.v)
            return;
    if (p->n_lora_logged < LORA_LOGGED_MAX) {
        p->lora_logged[p->n_lora_logged++] = (struct lora_seen){w->worker_id, ev->lora_id.v};
        kvb_warn("convert",
                 "%s: lora_id %lld without lora_name, and sources[].lora_names has no name "
                 "for it: its blocks are published without the LoRA salt (a router matches "
                 "them as base-model blocks); add it to lora_names",
                 s->name, (long long)ev->lora_id.v);
        return;
    }
    kvb_log_rl(&p->rl_lora, KVB_LOG_WARN, "convert",
               "%s: lora_id %lld without lora_name and not in sources[].lora_names (more than "
               "%d such ids: not each logged)",
               s->name, (long long)ev->lora_id.v, LORA_LOGGED_MAX);
}

int kvb_pipeline_batch(struct kvb_pipeline *p, const struct kvb_stream *s, uint64_t seq,
                       const uint8_t *payload, size_t len, struct kvb_applied *out)
{
    kvb_publish_cut(p->pub); /* one message per engine batch (dynamo-msgpack) */
    struct kvb_batch b;
    int rc = kvb_decode_batch(p->dec, payload, len, &b);
    p->last.serial++;
    p->last.decoded = rc == 0;
    p->last.ts = rc == 0 ? b.ts : 0;
    p->last.n_events = rc == 0 ? b.n_events : 0;
    *out = (struct kvb_applied){.decoded = rc == 0};
    if (rc < 0)
        return malformed(p, s, seq, kvb_decode_strerror(rc));
    uint32_t rank = b.dp_rank.has ? (uint32_t)b.dp_rank.v : s->cfg_rank;
    out->dp_rank = rank;
    out->n_events = b.n_events;
    const struct kvb_worker_cfg *w = use_stream(p, s);
    int n = 0;
    /* A pair's first router event is a start barrier: a rank new to the
     * stream, or a worker new to the converter (a worker_id changed by a
     * reload starts its counters at 0, as a fresh start would). */
    bool known = kvb_stream_has_rank(s, rank);
    if (!known || !kvb_converter_has_counter(p->conv, w->worker_id, rank)) {
        if (!known && s->n_ranks >= KVB_MAX_STREAM_RANKS) {
            /* a batch of a rank this stream cannot take: only that pair
             * lost something, and only if it published anything (through
             * another stream): never a barrier on every rank of the stream */
            kvb_inc(&p->m->malformed_messages_total[KVB_MAL_BATCH]);
            kvb_log_rl(&p->rl_malformed, KVB_LOG_WARN, "decode",
                       "%s: seq %llu: dp_rank %u is one more than the %d one stream may "
                       "carry: dropped",
                       s->name, (unsigned long long)seq, rank, KVB_MAX_STREAM_RANKS);
            return kvb_convert_pair_state(p->conv, rank) == KVB_PAIR_NONE
                       ? 0
                       : cleared(p, rank, KVB_BAR_MALFORMED, false);
        }
        if ((rc = cleared(p, rank, KVB_BAR_START, false)) < 0)
            return rc;
        n += rc;
    }
    kvb_inc(&p->m->batches_received_total[0]);
    if (kvb_publish_takes_batches(p->pub)) {
        struct kvb_raw_batch rb = {
            s->source ? s->source : s->name, s->topic, seq, rank, payload, len, w->worker_id};
        rc = kvb_publish_raw(p->pub, &rb);
        return rc < 0 ? rc : n;
    }
    for (uint32_t i = 0; i < b.n_events; i++) {
        struct kvb_rev r;
        int why = -1;
        rc = kvb_convert_event(p->conv, &b.events[i], rank, &r, &why);
        if (rc < 0) {
            flush(p); /* what is pending has its event_id: out it goes */
            return rc;
        }
        if (rc == 0) {
            if (why == KVB_DROP_BLOCK_SIZE_MISMATCH)
                kvb_log_rl(&p->rl_mismatch, KVB_LOG_ERROR, "convert",
                           "%s: BlockStored with block_size %lld but block_size is %u: "
                           "dropped (fix the configuration: a wrong block size ruins routing)",
                           s->name,
                           (long long)(b.events[i].block_size.has ? b.events[i].block_size.v : -1),
                           w->block_size);
            else if (why == KVB_DROP_MALFORMED_EVENT)
                kvb_log_rl(&p->rl_malformed, KVB_LOG_WARN, "decode",
                           "%s: seq %llu event %u skipped: %s", s->name, (unsigned long long)seq, i,
                           b.events[i].error);
            if ((rc = tracker_overflow(p, w)) < 0)
                return rc;
            n += rc;
            continue;
        }
        if (r.type == KVB_REVT_STORED)
            unmapped_lora(p, s, w, &b.events[i]);
        if ((rc = p->cfg.coalesce ? offer(p, &r) : emit(p, &r)) < 0 ||
            (n += rc, rc = tracker_overflow(p, w)) < 0)
            return rc;
        n += rc;
    }
    if ((rc = flush(p)) < 0)
        return rc;
    return n + rc;
}

int kvb_pipeline_malformed(struct kvb_pipeline *p, const struct kvb_stream *s, uint64_t seq,
                           const char *why)
{
    return malformed(p, s, seq, why);
}

/* ---- the pipeline as the sequence rules' kvb_seq_ops (replay.h) --------- */

static int op_apply(void *ctx, const struct kvb_stream *s, uint64_t seq, const uint8_t *data,
                    size_t len, struct kvb_applied *out)
{
    return kvb_pipeline_batch(ctx, s, seq, data, len, out);
}

static int op_reject(void *ctx, const struct kvb_stream *s, uint64_t seq, const char *why)
{
    return malformed(ctx, s, seq, why);
}

static int op_barrier(void *ctx, const struct kvb_stream *s, int cause)
{
    return kvb_pipeline_barrier(ctx, s, cause);
}

struct kvb_seq_ops kvb_pipeline_seq_ops(struct kvb_pipeline *p)
{
    return (struct kvb_seq_ops){
        .ctx = p, .apply = op_apply, .reject = op_reject, .barrier = op_barrier};
}

struct kvb_pipeline_cfg kvb_pipeline_cfg_of(const struct kvb_config *c)
{
    struct kvb_pipeline_cfg p = {
        .convert = {.worker_id = c->worker_id,
                    .block_size = c->block_size,
                    .lora_salt = c->lora_salt,
                    .forward_tiers = c->forward_tiers,
                    .cache_namespace = c->cache_namespace,
                    .max_tracked = c->limits.max_tracked_blocks},
        .limits = {c->limits.max_events_per_batch, c->limits.max_hashes_per_event,
                   c->limits.max_tokens_per_event, c->limits.max_depth},
        .coalesce = c->nats.coalesce,
    };
    return p;
}
