/* engine: see include/engine.h. */
#include "engine.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "clock.h"
#include "encode_msgpack.h"
#include "load.h"
#include "load_pub.h"
#include "log.h"
#include "scrape.h"

#define STAGE "engine"
#define SUBJECT_MAX 512

struct eng_rank {
    uint32_t k;                   /* the metrics page's rank */
    uint32_t dp_rank;             /* published: base_rank + k */
    struct kvb_engine_slot *slot; /* NULL when the slots ran out */
    bool published;
    uint64_t last_pub_ms, last_used;
    uint64_t publisher_id, sequence;
};

struct eng {
    char *name;     /* the entry's endpoint (or discover URL), for log lines */
    char *endpoint; /* the endpoint, unexpanded (names of ranks >= dp_size); "" with discover */
    size_t first;   /* the loop's index of the entry's first source */
    uint32_t dp_size, base_rank, dead_after_ms;
    int rank_naming;    /* the entry's (enum kvb_rank_naming) */
    uint64_t worker_id; /* the entry's (sources[].worker_id): its load messages' */
    uint64_t last_batch_ms;
    uint64_t rounds, failed; /* counted into the metrics so far */
    uint64_t load_ms;        /* load_ms of the last page used */
    struct kvb_liveness live;
    uint64_t changes; /* liveness judgements: gone, back */
    struct eng_rank *ranks;
    uint32_t n_ranks, cap_ranks;
};

struct kvb_engines {
    struct kvb_metrics *m;
    kvb_engine_publish_fn publish;
    void *ctx;
    struct kvb_scrape *scrape;
    struct eng *e;
    size_t n;
    size_t *entry_of; /* loop source index -> engine index, or SIZE_MAX */
    size_t n_src;
    int format;
    char subject[SUBJECT_MAX];
    msgpack_sbuffer tmp, out;
    struct kvb_scrape_result *res; /* scratch (large: a whole engine_load) */
    struct kvb_ratelimit rl;
};

static bool has_engine(const struct kvb_source_cfg *sc)
{
    return (sc->engine.metrics_url && sc->engine.metrics_url[0]) ||
           (sc->engine.health_url && sc->engine.health_url[0]);
}

static uint64_t new_publisher_id(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
        v = kvb_wall_ms() * UINT64_C(0x9E3779B97F4A7C15) ^ kvb_mono_ns();
    return v & KVB_MP_PUBLISHER_MASK;
}

/* The slot name of metrics rank k: the k-th expanded endpoint. */
static struct kvb_engine_slot *slot_of(struct kvb_engines *x, const struct eng *e, uint32_t k,
                                       uint32_t dp_rank)
{
    char *ep = NULL;
    struct kvb_engine_slot *s = NULL;
    if (!e->endpoint[0]) /* discover: the ranks' endpoints come and go */
        s = kvb_metrics_engine_slot(x->m, e->name, dp_rank);
    else if (k < e->dp_size && kvb_endpoint_of_rank(e->endpoint, e->rank_naming, k, &ep) == 0)
        s = kvb_metrics_engine_slot(x->m, ep, dp_rank);
    else
        s = kvb_metrics_engine_slot(x->m, e->endpoint, dp_rank);
    free(ep);
    if (s)
        kvb_set(&s->dead_after_ms, e->dead_after_ms);
    return s;
}

static struct eng_rank *rank_of(struct kvb_engines *x, struct eng *e, uint32_t k)
{
    for (uint32_t i = 0; i < e->n_ranks; i++)
        if (e->ranks[i].k == k)
            return &e->ranks[i];
    if (e->n_ranks == e->cap_ranks) {
        uint32_t cap = e->cap_ranks ? e->cap_ranks * 2 : 4;
        struct eng_rank *r = realloc(e->ranks, cap * sizeof *r);
        if (!r)
            return NULL;
        e->ranks = r;
        e->cap_ranks = cap;
    }
    struct eng_rank *r = &e->ranks[e->n_ranks++];
    *r = (struct eng_rank){.k = k, .dp_rank = e->base_rank + k, .publisher_id = new_publisher_id()};
    r->slot = slot_of(x, e, k, r->dp_rank);
    return r;
}

void kvb_engines_destroy(struct kvb_engines **px)
{
    if (!px || !*px)
        return;
    struct kvb_engines *x = *px;
    kvb_scrape_destroy(&x->scrape);
    for (size_t i = 0; i < x->n; i++) {
        struct eng *e = &x->e[i];
        for (uint32_t r = 0; r < e->n_ranks; r++)
            if (e->ranks[r].slot) { /* an engine that goes away is not up, nor gone */
                kvb_set(&e->ranks[r].slot->up, 0);
                if (kvb_get(&e->ranks[r].slot->gone)) {
                    kvb_set(&e->ranks[r].slot->gone, 0);
                }
            }
        if (e->live.gone && x->m)
            kvb_set(&x->m->engines_gone[0], kvb_get(&x->m->engines_gone[0]) - 1);
        free(e->name);
        free(e->endpoint);
        free(e->ranks);
    }
    free(x->e);
    free(x->entry_of);
    free(x->res);
    msgpack_sbuffer_destroy(&x->tmp);
    msgpack_sbuffer_destroy(&x->out);
    free(x);
    *px = NULL;
}

int kvb_engines_create(const struct kvb_config *c, struct kvb_metrics *m,
                       kvb_engine_publish_fn publish, void *ctx, struct kvb_engines **out)
{
    if (!c || !m || !publish || !out)
        return -EINVAL;
    struct kvb_engines *x = calloc(1, sizeof *x);
    struct kvb_scrape_target *t = NULL;
    if (!x)
        return -ENOMEM;
    msgpack_sbuffer_init(&x->tmp);
    msgpack_sbuffer_init(&x->out);
    x->m = m;
    x->publish = publish;
    x->ctx = ctx;
    x->format = c->nats.format;
    x->rl = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(10000, 5);
    int rc =
        kvb_load_subject(c->nats.namespace_, c->nats.component,
                         c->nats.endpoint ? c->nats.endpoint : "", x->subject, sizeof x->subject);
    if (rc < 0)
        goto fail;
    rc = -ENOMEM;
    for (size_t i = 0; i < c->n_sources; i++) {
        x->n_src += c->sources[i].dp_size;
        x->n += has_engine(&c->sources[i]);
    }
    x->e = calloc(x->n ? x->n : 1, sizeof *x->e);
    x->entry_of = calloc(x->n_src ? x->n_src : 1, sizeof *x->entry_of);
    x->res = calloc(1, sizeof *x->res);
    t = calloc(x->n ? x->n : 1, sizeof *t);
    if (!x->e || !x->entry_of || !x->res || !t)
        goto fail;
    size_t first = 0, k = 0;
    for (size_t i = 0; i < c->n_sources; i++) {
        const struct kvb_source_cfg *sc = &c->sources[i];
        for (uint32_t r = 0; r < sc->dp_size; r++)
            x->entry_of[first + r] = has_engine(sc) ? k : SIZE_MAX;
        if (has_engine(sc)) {
            struct eng *e = &x->e[k];
            e->name = strdup(sc->endpoint[0] ? sc->endpoint : sc->discover);
            e->endpoint = strdup(sc->endpoint);
            if (!e->name || !e->endpoint)
                goto fail;
            e->first = first;
            e->dp_size = sc->dp_size;
            e->rank_naming = sc->rank_naming;
            e->base_rank = sc->dp_rank;
            e->dead_after_ms = sc->engine.dead_after_ms;
            e->worker_id = sc->worker_id;
            t[k] = (struct kvb_scrape_target){.name = e->name,
                                              .kind = (enum kvb_engine_kind)sc->engine.kind,
                                              .metrics_url = sc->engine.metrics_url,
                                              .health_url = sc->engine.health_url,
                                              .interval_ms = sc->engine.scrape_interval_ms,
                                              .timeout_ms = sc->engine.scrape_interval_ms,
                                              .block_tokens = sc->block_size};
            for (uint32_t r = 0; r < sc->dp_size; r++) /* up gauges from the start */
                if (!rank_of(x, e, r))
                    goto fail;
            k++;
        }
        first += sc->dp_size;
    }
    if (x->n) {
        if ((rc = kvb_scrape_create(t, x->n, &x->scrape)) < 0)
            goto fail;
        for (size_t i = 0; i < x->n; i++) {
            const struct kvb_scrape_target *tt = &t[i];
            kvb_info(STAGE,
                     "%s: watching the engine (%s%s%s%s%s, every %" PRIu32
                     " ms, gone after %" PRIu32 " ms)",
                     tt->name, kvb_engine_kind_name(tt->kind),
                     tt->metrics_url && tt->metrics_url[0] ? " " : "",
                     tt->metrics_url ? tt->metrics_url : "",
                     tt->health_url && tt->health_url[0] ? " " : "",
                     tt->health_url ? tt->health_url : "", tt->interval_ms, x->e[i].dead_after_ms);
        }
    }
    free(t);
    *out = x;
    return 0;
fail:
    free(t);
    kvb_engines_destroy(&x);
    return rc;
}

size_t kvb_engines_count(const struct kvb_engines *x) { return x ? x->n : 0; }

int kvb_engines_fd(const struct kvb_engines *x)
{
    return x && x->scrape ? kvb_scrape_fd(x->scrape) : -1;
}

uint64_t kvb_engines_liveness_changes(const struct kvb_engines *x, size_t i)
{
    return x && i < x->n_src && x->entry_of[i] != SIZE_MAX ? x->e[x->entry_of[i]].changes : 0;
}

void kvb_engines_note_batch(struct kvb_engines *x, size_t i, uint64_t now_ms)
{
    if (x && i < x->n_src && x->entry_of[i] != SIZE_MAX)
        x->e[x->entry_of[i]].last_batch_ms = now_ms;
}

static void publish_load(struct kvb_engines *x, struct eng *e, struct eng_rank *r, uint64_t used,
                         uint64_t now_ms)
{
    struct kvb_active_load l = {.worker_id = e->worker_id,
                                .dp_rank = r->dp_rank,
                                .has_kv_used_blocks = true,
                                .kv_used_blocks = used};
    struct kvb_load_env env = {r->publisher_id, r->sequence, kvb_wall_ms()};
    int rc = kvb_load_encode(x->format, &l, &env, &x->tmp, &x->out);
    if (rc == 0)
        rc = x->publish(x->ctx, x->subject, x->out.data, x->out.size);
    if (rc < 0) {
        kvb_log_rl(&x->rl, KVB_LOG_WARN, STAGE, "%s: load of dp_rank %" PRIu32 " not published: %s",
                   e->name, r->dp_rank, strerror(-rc));
        return;
    }
    r->sequence++;
    r->published = true;
    r->last_pub_ms = now_ms;
    r->last_used = used;
    kvb_inc(&x->m->load_messages_published_total[0]);
}

static void take_load(struct kvb_engines *x, struct eng *e, const struct kvb_scrape_result *res,
                      uint64_t now_ms)
{
    if (!res->has_load || res->load_ms == e->load_ms)
        return;
    e->load_ms = res->load_ms;
    const struct kvb_engine_load *l = &res->load;
    for (uint32_t i = 0; i < l->n_ranks; i++) {
        const struct kvb_rank_load *rl = &l->rank[i];
        struct eng_rank *r = rank_of(x, e, rl->dp_rank);
        if (!r)
            continue;
        bool has_used = kvb_load_has(rl, KVB_LOAD_USED_BLOCKS);
        uint64_t used = has_used ? (uint64_t)rl->v[KVB_LOAD_USED_BLOCKS] : 0;
        if (r->slot) {
            struct kvb_engine_slot *s = r->slot;
            kvb_set(&s->used_blocks, used);
            kvb_set(&s->total_blocks, kvb_load_has(rl, KVB_LOAD_TOTAL_BLOCKS)
                                          ? (uint64_t)rl->v[KVB_LOAD_TOTAL_BLOCKS]
                                          : 0);
            kvb_set(&s->running,
                    kvb_load_has(rl, KVB_LOAD_RUNNING) ? (uint64_t)rl->v[KVB_LOAD_RUNNING] : 0);
            kvb_set(&s->waiting,
                    kvb_load_has(rl, KVB_LOAD_WAITING) ? (uint64_t)rl->v[KVB_LOAD_WAITING] : 0);
        }
        if (has_used && (!r->published || used != r->last_used ||
                         now_ms - r->last_pub_ms >= KVB_LOAD_REPUBLISH_MS))
            publish_load(x, e, r, used, now_ms);
    }
}

static void set_gone(struct kvb_engines *x, struct eng *e, bool gone)
{
    for (uint32_t i = 0; i < e->n_ranks; i++)
        if (e->ranks[i].slot)
            kvb_set(&e->ranks[i].slot->gone, gone);
    uint64_t g = kvb_get(&x->m->engines_gone[0]);
    kvb_set(&x->m->engines_gone[0], gone ? g + 1 : (g ? g - 1 : 0));
}

static void judge(struct kvb_engines *x, struct eng *e, const struct kvb_scrape_result *res,
                  struct kvb_source **src, size_t n_src, uint64_t now_ms)
{
    struct kvb_live_input in = kvb_live_input_of(res, e->last_batch_ms, now_ms, e->dead_after_ms);
    switch (kvb_liveness_judge(&e->live, &in)) {
    case KVB_LIVE_GONE: {
        kvb_warn(STAGE,
                 "%s: engine gone: its metrics/health URL has not answered for %" PRIu32
                 " ms (%s) and no batch came in that time: publishing \"cleared\" for "
                 "its dp_ranks",
                 e->name, e->dead_after_ms, strerror(res->last_error ? -res->last_error : EIO));
        kvb_inc(&x->m->engine_gone_total[0]);
        e->changes++;
        set_gone(x, e, true);
        for (size_t k = e->first; k < e->first + e->dp_size && k < n_src; k++) {
            int rc = src[k] ? kvb_source_barrier_all(src[k], KVB_BAR_ENGINE_GONE) : 0;
            if (rc < 0)
                kvb_err(STAGE, "%s: barrier: %s", e->name, strerror(-rc));
        }
        break;
    }
    case KVB_LIVE_BACK:
        kvb_info(STAGE, "%s: engine back (%s)", e->name,
                 in.failing ? "a batch arrived" : "its endpoint answers");
        e->changes++;
        set_gone(x, e, false);
        break;
    default: break;
    }
}

void kvb_engines_on_ready(struct kvb_engines *x, struct kvb_source **src, size_t n_src,
                          uint64_t now_ms, bool paused)
{
    if (!x || !x->scrape)
        return;
    kvb_scrape_ack(x->scrape);
    for (size_t i = 0; i < x->n; i++) {
        struct eng *e = &x->e[i];
        struct kvb_scrape_result *res = x->res;
        if (kvb_scrape_take(x->scrape, i, res) != 1)
            continue;
        kvb_add(&x->m->engine_scrapes_total[0], res->rounds - e->rounds);
        kvb_add(&x->m->engine_scrape_failures_total[0], res->failed_rounds - e->failed);
        e->rounds = res->rounds;
        e->failed = res->failed_rounds;
        bool up = res->rounds > 0 && res->consecutive_failures == 0;
        for (uint32_t r = 0; r < e->n_ranks; r++)
            if (e->ranks[r].slot)
                kvb_set(&e->ranks[r].slot->up, up);
        take_load(x, e, res, now_ms);
        if (paused) /* our silence, not the engine's: a batch may be waiting */
            e->last_batch_ms = now_ms;
        judge(x, e, res, src, n_src, now_ms);
    }
}

bool kvb_engines_cfg_equal(const struct kvb_config *a, const struct kvb_config *b)
{
    if (a->n_sources != b->n_sources || a->nats.format != b->nats.format ||
        strcmp(a->nats.namespace_, b->nats.namespace_) != 0 ||
        strcmp(a->nats.component, b->nats.component) != 0 ||
        strcmp(a->nats.endpoint ? a->nats.endpoint : "",
               b->nats.endpoint ? b->nats.endpoint : "") != 0)
        return false;
    for (size_t i = 0; i < a->n_sources; i++) {
        const struct kvb_source_cfg *x = &a->sources[i], *y = &b->sources[i];
        if (x->dp_size != y->dp_size || x->dp_rank != y->dp_rank ||
            x->rank_naming != y->rank_naming || x->worker_id != y->worker_id ||
            x->block_size != y->block_size || strcmp(x->endpoint, y->endpoint) != 0 ||
            strcmp(x->discover, y->discover) != 0 || !kvb_config_engine_equal(x, y))
            return false;
    }
    return true;
}
