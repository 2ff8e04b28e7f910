/* sources: the sources a configuration asks for (daemon_priv.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "daemon_priv.h"
#include "log.h"
#include "mirror.h"
#include "pipeline.h"
#include "sink.h"
#include "source.h"
#include "srclist.h"
#include "state.h"

/* ---- sources ------------------------------------------------------------ */

/* ActiveLoad messages (engine.h): core NATS, whatever the router events use. */
int kvb_daemon_publish_load(void *ctx, const char *subject, const void *data, size_t len)
{
    struct kvb_daemon *d = ctx;
    return kvb_sink_publish(d->sink, subject, data, len);
}

/* The worker a sources[] entry's router events are for (several engines may share one kvbridge). */
struct kvb_worker_cfg kvb_daemon_worker_of(const struct kvb_source_cfg *sc)
{
    return (struct kvb_worker_cfg){.worker_id = sc->worker_id,
                                   .block_size = sc->block_size,
                                   .lora_salt = sc->lora_salt,
                                   .forward_tiers = sc->forward_tiers,
                                   .lora_names = sc->lora_names,
                                   .n_lora_names = sc->n_lora_names,
                                   .image_token_id = (uint32_t)sc->image_token_id,
                                   .video_token_id = (uint32_t)sc->video_token_id};
}

/* WORKER_ID is one that configuration C publishes for. */
bool kvb_daemon_configured_worker(const struct kvb_config *c, uint64_t worker_id)
{
    for (size_t i = 0; i < c->n_sources; i++) {
        const struct kvb_source_cfg *sc = &c->sources[i];
        if (!sc->n_topics && sc->worker_id == worker_id)
            return true;
        for (size_t t = 0; t < sc->n_topics; t++)
            if (sc->topics[t].worker_id == worker_id)
                return true;
    }
    return false;
}

/* Close every non-NULL source of v[0..n) and free the arrays. */
void kvb_daemon_destroy_sources(struct kvb_source ***v, struct src_origin **from, size_t *n)
{
    for (size_t i = 0; i < *n; i++)
        kvb_source_destroy(&(*v)[i]);
    free(*v);
    free(*from);
    *v = NULL;
    *from = NULL;
    *n = 0;
}

/* Open source r of entry sc of configuration c on these endpoints and
 * topic, resuming from RESUME (may be NULL). */
static int open_at(struct kvb_daemon *d, const struct kvb_config *c,
                   const struct kvb_source_cfg *sc, uint32_t r, const char *ep, const char *rep,
                   const char *topic, const struct kvb_state *resume, struct kvb_source **out)
{
    struct kvb_worker_cfg w = kvb_daemon_worker_of(sc);
    struct kvb_source_params p = {.endpoint = ep,
                                  .replay_endpoint = rep,
                                  .topic = topic,
                                  .mode = sc->mode,
                                  .dp_rank = sc->dp_rank + r,
                                  .rcvhwm = sc->rcvhwm,
                                  .reconnect_max_ms = sc->reconnect_max_ms,
                                  .max_peers = sc->max_peers,
                                  .replay_timeout_ms = c->replay.timeout_ms,
                                  .replay_max_ms = c->replay.max_ms,
                                  .replay_max_batches = c->replay.max_batches,
                                  .max_payload_bytes = c->limits.max_payload_bytes,
                                  .resume = resume,
                                  .curve = &sc->curve,
                                  .zap = d->zap,
                                  .worker = &w,
                                  .topics = sc->topics,
                                  .n_topics = sc->n_topics,
                                  .pipeline = d->pipe};
    int rc = kvb_source_create(d->zctx, &p, &d->m, out);
    char who[64];
    if (sc->n_topics)
        snprintf(who, sizeof who, "%zu topics mapped to worker ids", sc->n_topics);
    else
        snprintf(who, sizeof who, "worker_id %llu", (unsigned long long)sc->worker_id);
    if (rc == 0)
        kvb_info("source", "%s %s (dp_rank %u%s%s): %s%s%s",
                 sc->mode == KVB_MODE_BIND ? "bound" : "connecting to", ep, p.dp_rank,
                 rep[0] ? ", replay " : "", rep, who, sc->discover[0] ? ", listed by " : "",
                 sc->discover);
    return rc;
}

int kvb_daemon_open_source(struct kvb_daemon *d, const struct kvb_config *c,
                           const struct kvb_source_cfg *sc, uint32_t r, struct kvb_source **out)
{
    char *ep = NULL, *rep = NULL;
    int rc = kvb_endpoint_of_rank(sc->endpoint, sc->rank_naming, r, &ep);
    if (rc == 0)
        rc = kvb_endpoint_of_rank(sc->replay_endpoint, sc->rank_naming, r, &rep);
    if (rc == 0)
        rc = open_at(d, c, sc, r, ep, rep, sc->topic, d->resume, out);
    free(ep);
    free(rep);
    return rc;
}

int kvb_daemon_open_listed(struct kvb_daemon *d, const struct kvb_source_cfg *sc, uint32_t r,
                           const struct kvb_srclist_entry *e, bool resume, struct kvb_source **out)
{
    return open_at(d, d->cfg, sc, r, e->endpoint, e->replay_endpoint, e->topic,
                   resume ? d->resume : NULL, out);
}

/* The running source that a new entry (sc, r) of configuration c can take
 * over unchanged, or -1. */
static ssize_t reusable(const struct kvb_daemon *d, const struct kvb_config *c,
                        const struct kvb_source_cfg *sc, uint32_t r)
{
    if (c->replay.timeout_ms != d->cfg->replay.timeout_ms ||
        c->replay.max_ms != d->cfg->replay.max_ms ||
        c->replay.max_batches != d->cfg->replay.max_batches ||
        c->limits.max_payload_bytes != d->cfg->limits.max_payload_bytes)
        return -1;
    for (size_t k = 0; k < d->n_src; k++)
        if (d->src[k] && d->src_from[k].r == r && kvb_config_source_equal(d->src_from[k].sc, sc))
            return (ssize_t)k;
    return -1;
}

/* The sources of configuration c, into fresh arrays.  With `reuse`, a source
 * whose entry is unchanged is moved over from the running ones (d->src[k]
 * becomes NULL, lent[i] = k + 1, so that kvb_daemon_lend_back() can undo it); the
 * others are opened.  On failure everything this call opened is closed and
 * every moved source is given back. */
void kvb_daemon_lend_back(struct kvb_daemon *d, struct kvb_source **v, const size_t *lent, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (lent && lent[i]) {
            d->src[lent[i] - 1] = v[i];
            v[i] = NULL;
        }
}

int kvb_daemon_build_sources(struct kvb_daemon *d, const struct kvb_config *c, bool reuse,
                             struct kvb_source ***out, struct src_origin **from_out, size_t *n_out,
                             size_t **lent_out)
{
    size_t total = 0;
    for (size_t i = 0; i < c->n_sources; i++)
        total += c->sources[i].dp_size;
    struct kvb_source **v = calloc(total ? total : 1, sizeof(*v));
    struct src_origin *from = calloc(total ? total : 1, sizeof(*from));
    size_t *lent = calloc(total ? total : 1, sizeof(*lent));
    size_t n = 0;
    int rc = v && from && lent ? 0 : -ENOMEM;
    for (size_t i = 0; rc == 0 && i < c->n_sources; i++) {
        const struct kvb_source_cfg *sc = &c->sources[i];
        for (uint32_t r = 0; rc == 0 && r < sc->dp_size; r++, n++) {
            from[n] = (struct src_origin){sc, r};
            ssize_t k = reuse ? reusable(d, c, sc, r) : -1;
            if (k >= 0) {
                v[n] = d->src[k];
                d->src[k] = NULL;
                lent[n] = (size_t)k + 1;
            } else if (!sc->discover[0]) { /* else: opened from the engine's list */
                rc = kvb_daemon_open_source(d, c, sc, r, &v[n]);
            }
        }
    }
    if (rc < 0) {
        if (v)
            kvb_daemon_lend_back(d, v, lent, n);
        kvb_daemon_destroy_sources(&v, &from, &n);
        free(lent);
        return rc;
    }
    *out = v;
    *from_out = from;
    *n_out = n;
    if (lent_out)
        *lent_out = lent;
    else
        free(lent);
    return 0;
}
