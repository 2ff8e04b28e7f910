/* loop: the daemon's run (include/daemon.h), the sources a configuration
 * asks for, and the cursors saved to state.dir.  The steps of its life are
 * in start.c, turn.c, reload.c and stop.c (daemon_priv.h). */
#include "daemon.h"

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
#include "state.h"

int kvb_daemon_run(struct kvb_config **pcfg)
{
    struct kvb_daemon *d = calloc(1, sizeof(*d));
    if (!d) {
        kvb_config_free(pcfg);
        return 1;
    }
    d->cfg = *pcfg;
    *pcfg = NULL;
    d->sigfd = d->wakefd = -1;
    int exit_code = kvb_daemon_start(d), rc = 0;
    while (exit_code == 0 && !d->stop && (rc = kvb_daemon_turn(d)) >= 0)
        ;
    if (exit_code == 0 && rc < 0) {
        kvb_err("main", "poll: %s", strerror(-rc));
        exit_code = 1;
    }
    if (exit_code == 0)
        exit_code = kvb_daemon_stop(d);
    kvb_daemon_free(d);
    return exit_code;
}

/* ---- sources ------------------------------------------------------------ */

/* ActiveLoad messages (engine.h): core NATS, whatever the router events use. */
int kvb_daemon_publish_load(void *ctx, const char *subject, const void *data, size_t len)
{
    struct kvb_daemon *d = ctx;
    return kvb_sink_publish(d->sink, subject, data, len);
}

/* The worker a sources[] entry's router events are for (issue 17). */
struct kvb_worker_cfg kvb_daemon_worker_of(const struct kvb_source_cfg *sc)
{
    return (struct kvb_worker_cfg){sc->worker_id, sc->block_size, sc->lora_salt, sc->forward_tiers};
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

int kvb_daemon_open_source(struct kvb_daemon *d, const struct kvb_config *c,
                           const struct kvb_source_cfg *sc, uint32_t r, struct kvb_source **out)
{
    char *ep = NULL, *rep = NULL;
    int rc = kvb_endpoint_with_offset(sc->endpoint, r, &ep);
    if (rc == 0)
        rc = kvb_endpoint_with_offset(sc->replay_endpoint, r, &rep);
    if (rc == 0) {
        struct kvb_worker_cfg w = kvb_daemon_worker_of(sc);
        struct kvb_source_params p = {.endpoint = ep,
                                      .replay_endpoint = rep,
                                      .topic = sc->topic,
                                      .mode = sc->mode,
                                      .dp_rank = sc->dp_rank + r,
                                      .rcvhwm = sc->rcvhwm,
                                      .reconnect_max_ms = sc->reconnect_max_ms,
                                      .max_peers = sc->max_peers,
                                      .replay_timeout_ms = c->replay.timeout_ms,
                                      .max_payload_bytes = c->limits.max_payload_bytes,
                                      .resume = d->resume,
                                      .curve = &sc->curve,
                                      .zap = d->zap,
                                      .worker = &w,
                                      .topics = sc->topics,
                                      .n_topics = sc->n_topics,
                                      .pipeline = d->pipe};
        rc = kvb_source_create(d->zctx, &p, &d->m, out);
        char who[64];
        if (sc->n_topics)
            snprintf(who, sizeof who, "%zu topics mapped to worker ids", sc->n_topics);
        else
            snprintf(who, sizeof who, "worker_id %llu", (unsigned long long)sc->worker_id);
        if (rc == 0)
            kvb_info("source", "%s %s (dp_rank %u%s%s): %s",
                     sc->mode == KVB_MODE_BIND ? "bound" : "connecting to", ep, p.dp_rank,
                     rep[0] ? ", replay " : "", rep, who);
    }
    free(ep);
    free(rep);
    return rc;
}

/* The running source that a new entry (sc, r) of configuration c can take
 * over unchanged, or -1. */
static ssize_t reusable(const struct kvb_daemon *d, const struct kvb_config *c,
                        const struct kvb_source_cfg *sc, uint32_t r)
{
    if (c->replay.timeout_ms != d->cfg->replay.timeout_ms ||
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
            } else {
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

/* ---- state (state.dir) -------------------------------------------------- */

static void add_stream(void *ctx, const char *source, const char *topic,
                       const struct kvb_stream *st)
{
    if (st->has_last)
        kvb_state_add_stream(ctx, source, topic, st);
}

/* Everything the pipeline has applied so far: counters and stream cursors. */
struct kvb_state *kvb_daemon_snapshot(struct kvb_daemon *d)
{
    struct kvb_state *st = kvb_state_new();
    struct kvb_converter *conv = kvb_pipeline_converter(d->pipe);
    size_t n = kvb_converter_counters(conv, NULL, 0);
    struct kvb_id_counter *ids = calloc(n ? n : 1, sizeof(*ids));
    if (!st || !ids) {
        free(ids);
        kvb_state_free(&st);
        return NULL;
    }
    kvb_converter_counters(conv, ids, n);
    for (size_t i = 0; i < n; i++)
        kvb_state_add_counter(st, &ids[i]);
    free(ids);
    for (size_t i = 0; i < d->n_src; i++)
        kvb_source_foreach_stream(d->src[i], add_stream, st);
    return st;
}

/* The outcome of a save of state.dir (0, or a negative errno): counted;
 * logged once when saves start failing (then at most once a minute) and
 * once when they work again; /readyz answers 503 while they fail (a restart
 * would resume from the older file and replay, or re-send, more). */
static void save_result(struct kvb_daemon *d, int rc)
{
    const char *dir = d->cfg->state.dir;
    if (rc >= 0) {
        kvb_inc(&d->m.state_saves_total[0]);
        if (d->save_failing) {
            kvb_info("state", "saving to %s works again (after %llu failed save(s) in %.0f s)", dir,
                     (unsigned long long)d->save_fails,
                     (double)(kvb_mono_ms() - d->save_fail_since) / 1000.0);
            d->save_failing = false;
            kvb_set(&d->m.state_save_failing[0], 0);
        }
        return;
    }
    kvb_inc(&d->m.state_save_failures_total[0]);
    kvb_set(&d->m.state_save_errno, (uint64_t)-rc);
    d->save_fails++;
    if (!d->save_failing) {
        d->save_failing = true;
        d->save_fail_since = kvb_mono_ms();
        d->save_fails = 1;
        kvb_set(&d->m.state_save_failing[0], 1);
        /* this line counts as the reminders' first: the next in a minute */
        d->save_rl.window_start_ms = d->save_fail_since;
        d->save_rl.printed = d->save_rl.burst;
        d->save_rl.suppressed = 0;
        kvb_err("state",
                "cannot save to %s: %s; the older saved state stays (a restart "
                "would resume from it), retrying every second, /readyz answers 503 "
                "until a save works",
                dir, strerror(-rc));
        return;
    }
    kvb_log_rl(&d->save_rl, KVB_LOG_ERROR, "state",
               "still cannot save to %s: %s (%llu failed "
               "saves in %.0f s)",
               dir, strerror(-rc), (unsigned long long)d->save_fails,
               (double)(kvb_mono_ms() - d->save_fail_since) / 1000.0);
}

/* Save the cursors, but only once NATS confirmed (flush: PING/PONG) that it
 * has every router event published so far: the file never claims more than
 * was delivered.  After a crash the engine replays from last + 1 and the
 * events get the same ids (JetStream drops the duplicates by Nats-Msg-Id). */
void kvb_daemon_save_state(struct kvb_daemon *d, bool force)
{
    const char *dir = d->cfg->state.dir;
    uint64_t now = kvb_mono_ms(), batches = kvb_get(&d->m.batches_received_total[0]);
    if (!dir[0] ||
        (!force && (now - d->last_save_ms < STATE_SAVE_MS || batches == d->saved_batches)))
        return;
    if (!force && kvb_mirror_save_busy(d->res))
        return; /* the mirror (saved with the cursors) is being written: next turn */
    d->last_save_ms = now;
    int frc = kvb_sink_flush(d->sink, 1000);
    if (frc < 0) {
        kvb_debug("state", "not saved: NATS flush: %s", strerror(-frc));
        return; /* NATS away: keep the older, safe file */
    }
    struct kvb_state *st = kvb_daemon_snapshot(d);
    bool async = kvb_mirror_persists(d->res) && !force;
    int rc = !st                           ? -ENOMEM
             : kvb_mirror_persists(d->res) ? kvb_mirror_save(d->res, dir, &st, force)
                                           : kvb_state_save(dir, st);
    if (rc == -EBUSY) {
        kvb_state_free(&st);
        return;
    }
    if (rc >= 0)
        d->saved_batches = batches;
    if (rc < 0 || !async) /* else the saver's thread tells (kvb_daemon_save_done) */
        save_result(d, rc);
    kvb_state_free(&st);
}

/* The saver thread's outcome, once it is known. */
void kvb_daemon_save_done(struct kvb_daemon *d)
{
    bool done = false;
    int rc = kvb_mirror_save_result(d->res, &done);
    if (done) {
        if (rc < 0)
            d->saved_batches = 0; /* save again at the next chance */
        save_result(d, rc);
    }
}

int kvb_daemon_load_state(struct kvb_daemon *d)
{
    const char *dir = d->cfg->state.dir;
    if (!dir[0])
        return 0;
    int rc = kvb_state_load(dir, &d->resume);
    if (rc == -ENOENT) {
        kvb_info("state", "%s: no saved state, starting fresh", dir);
        return 0;
    }
    if (rc < 0) {
        kvb_warn("state", "%s: saved state unreadable (%s): starting fresh, with barriers", dir,
                 strerror(-rc));
        return 0;
    }
    struct kvb_converter *conv = kvb_pipeline_converter(d->pipe);
    for (size_t i = 0; i < d->resume->n_counters; i++)
        if ((rc = kvb_converter_restore(conv, &d->resume->counters[i])) < 0)
            return rc;
    kvb_info("state", "%s: resuming %zu stream(s), %zu event_id counter(s)", dir,
             d->resume->n_streams, d->resume->n_counters);
    return 0;
}

/* A pair the saved mirror cannot vouch for: "cleared", so that consumers and
 * the mirror start it over together. */
void kvb_daemon_mirror_barrier(void *ctx, uint64_t worker_id, uint32_t dp_rank)
{
    struct kvb_daemon *d = ctx;
    if (kvb_daemon_configured_worker(d->cfg, worker_id)) /* not an old worker_id's pairs */
        kvb_pipeline_cleared(d->pipe, worker_id, dp_rank, KVB_BAR_START);
}
