/* loop: see include/daemon.h. */
#include "daemon.h"

#include <errno.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include <systemd/sd-daemon.h>

#include "clock.h"
#include "discovery.h"
#include "engine.h"
#include "http.h"
#include "log.h"
#include "metrics.h"
#include "mirror.h"
#include "pipeline.h"
#include "publish.h"
#include "sink.h"
#include "source.h"
#include "state.h"
#include "stats.h"
#include "version.h"
#include "zap.h"

#define READ_BUDGET 256     /* live messages per source per turn: fairness */
#define HEARTBEAT_MS 1000   /* the loop turns at least this often (healthz, watchdog) */
#define PAUSED_POLL_MS 20   /* re-check the NATS buffer this often while paused */
#define STATE_SAVE_MS 1000  /* state.dir: save at most this often (and at shutdown) */
#define READY_GRACE_MS 1000 /* held back or paused longer than this: not ready */
#define TRIM_CALM_MS 2000   /* a backlog gone this long: give its memory back */

/* Where a running source comes from: its sources[] entry (in the config
 * that built it) and its offset in that entry's dp_size expansion.  A reload
 * keeps a source whose entry did not change, as nginx keeps a listener. */
struct src_origin {
    const struct kvb_source_cfg *sc;
    uint32_t r;
};

struct kvb_daemon {
    struct kvb_config *cfg;
    struct kvb_metrics m;
    void *zctx;
    struct kvb_zap *zap; /* CURVE clients of bind-mode sources (zap.h) */
    struct kvb_pipeline *pipe;
    struct kvb_sink *sink;
    struct kvb_publish *out;    /* the publish stage: nats.format (publish.h) */
    struct kvb_discovery *disc; /* discovery.etcd: EventSource records; NULL when off */
    bool held_back;             /* discovery: a pair is not registered yet: do not read */
    struct kvb_http *http;
    struct kvb_mirror *res;  /* the residency mirror and its queries */
    struct kvb_engines *eng; /* sources[].engine: load and liveness (engine.h) */
    struct kvb_stats *stats; /* log.stats_interval_s (stats.h) */
    uint64_t heartbeat_ms;   /* loop wake-up period */
    uint64_t watchdog_ms;    /* WATCHDOG=1 period (0: no systemd watchdog) */
    uint64_t last_watchdog;
    bool paused;              /* backpressure: NATS buffer too full to read more */
    uint64_t paused_since;    /* ... since then (CLOCK_MONOTONIC ms), 0: not paused */
    uint64_t held_since;      /* live batches held back behind replays since, 0: none */
    uint64_t hold_since;      /* monotonic ms: holding back (paused or discovery) since */
    bool trim_due;            /* a backlog was queued: trim once it is gone */
    uint64_t calm_since;      /* ... and nothing has been queued up since (0: not yet) */
    bool barrier_due;         /* router events were lost on the NATS side */
    uint64_t losses_seen;     /* kvb_sink_losses() already answered with a barrier */
    struct kvb_state *resume; /* what the sources start from (state.dir, reload) */
    uint64_t last_save_ms, saved_batches;
    bool save_failing; /* state.dir: the last save failed */
    uint64_t save_fail_since, save_fails;
    struct kvb_ratelimit save_rl;
    struct kvb_source **src;
    struct src_origin *src_from; /* parallel to src: the entry each came from */
    size_t n_src;
    int sigfd, wakefd;
    bool stop;
    bool failed; /* stopping because of an error: exit 1 */
};

/* ActiveLoad messages (engine.h): core NATS, whatever the router events use. */
static int publish_load(void *ctx, const char *subject, const void *data, size_t len)
{
    struct kvb_daemon *d = ctx;
    return kvb_sink_publish(d->sink, subject, data, len);
}

/* ---- sources ------------------------------------------------------------ */

/* The worker a sources[] entry's router events are for (issue 17). */
static struct kvb_worker_cfg worker_of(const struct kvb_source_cfg *sc)
{
    return (struct kvb_worker_cfg){sc->worker_id, sc->block_size, sc->lora_salt, sc->forward_tiers};
}

/* WORKER_ID is one that configuration C publishes for. */
static bool configured_worker(const struct kvb_config *c, uint64_t worker_id)
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
static void destroy_sources(struct kvb_source ***v, struct src_origin **from, size_t *n)
{
    for (size_t i = 0; i < *n; i++)
        kvb_source_destroy(&(*v)[i]);
    free(*v);
    free(*from);
    *v = NULL;
    *from = NULL;
    *n = 0;
}

static int open_source(struct kvb_daemon *d, const struct kvb_config *c,
                       const struct kvb_source_cfg *sc, uint32_t r, struct kvb_source **out)
{
    char *ep = NULL, *rep = NULL;
    int rc = kvb_endpoint_with_offset(sc->endpoint, r, &ep);
    if (rc == 0)
        rc = kvb_endpoint_with_offset(sc->replay_endpoint, r, &rep);
    if (rc == 0) {
        struct kvb_worker_cfg w = worker_of(sc);
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
 * becomes NULL, lent[i] = k + 1, so that lend_back() can undo it); the
 * others are opened.  On failure everything this call opened is closed and
 * every moved source is given back. */
static void lend_back(struct kvb_daemon *d, struct kvb_source **v, const size_t *lent, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (lent && lent[i]) {
            d->src[lent[i] - 1] = v[i];
            v[i] = NULL;
        }
}

static int build_sources(struct kvb_daemon *d, const struct kvb_config *c, bool reuse,
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
                rc = open_source(d, c, sc, r, &v[n]);
            }
        }
    }
    if (rc < 0) {
        if (v)
            lend_back(d, v, lent, n);
        destroy_sources(&v, &from, &n);
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
static struct kvb_state *snapshot(struct kvb_daemon *d)
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
static void save_state(struct kvb_daemon *d, bool force)
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
    struct kvb_state *st = snapshot(d);
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
    if (rc < 0 || !async) /* else the saver's thread tells (save_done) */
        save_result(d, rc);
    kvb_state_free(&st);
}

/* The saver thread's outcome, once it is known. */
static void save_done(struct kvb_daemon *d)
{
    bool done = false;
    int rc = kvb_mirror_save_result(d->res, &done);
    if (done) {
        if (rc < 0)
            d->saved_batches = 0; /* save again at the next chance */
        save_result(d, rc);
    }
}

static int load_state(struct kvb_daemon *d)
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
static void mirror_barrier(void *ctx, uint64_t worker_id, uint32_t dp_rank)
{
    struct kvb_daemon *d = ctx;
    if (configured_worker(d->cfg, worker_id)) /* not an old worker_id's pairs */
        kvb_pipeline_cleared(d->pipe, worker_id, dp_rank, KVB_BAR_START);
}

/* ---- reload (SIGHUP) ---------------------------------------------------- */

static bool sources_equal(const struct kvb_config *a, const struct kvb_config *b)
{
    if (a->n_sources != b->n_sources || a->replay.timeout_ms != b->replay.timeout_ms ||
        a->limits.max_payload_bytes != b->limits.max_payload_bytes)
        return false;
    for (size_t i = 0; i < a->n_sources; i++) {
        if (!kvb_config_source_equal(&a->sources[i], &b->sources[i]))
            return false;
    }
    return true;
}

static bool nats_conn_equal(const struct kvb_config *a, const struct kvb_config *b)
{
    return kvb_config_nats_equal(a, b);
}

static void pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Close the running sources that the new configuration did not take over
 * (those still in d->src): changed or removed entries. */
static size_t close_leftovers(struct kvb_daemon *d)
{
    size_t closed = 0;
    for (size_t k = 0; k < d->n_src; k++)
        if (d->src[k]) {
            kvb_source_destroy(&d->src[k]);
            closed++;
        }
    return closed;
}

/* Build the sources of a new configuration, taking over the unchanged ones.
 * When a new source would bind an address that a changed running source
 * holds, close the changed running sources first and try again (libzmq
 * releases a closed listener asynchronously, so with retries for up to 2 s).
 * *closed then tells the caller that they are gone: reopen_closed() if the
 * reload fails after all. */
static int rebuild_sources(struct kvb_daemon *d, const struct kvb_config *c,
                           struct kvb_source ***out, struct src_origin **from, size_t *n_out,
                           size_t **lent, bool *closed)
{
    int rc = build_sources(d, c, true, out, from, n_out, lent);
    if (rc != -EADDRINUSE)
        return rc;
    if (!close_leftovers(d))
        return rc;
    kvb_info("main", "reload: a new source binds an address a changed one holds: "
                     "closed the changed ones first");
    *closed = true;
    for (int i = 0; i < 40 && rc == -EADDRINUSE; i++) {
        pause_ms(50);
        rc = build_sources(d, c, true, out, from, n_out, lent);
    }
    return rc;
}

/* A reload that closed changed sources failed: open them again from the
 * running configuration (they resume from d->resume).  If even that fails,
 * stop with an error rather than run without them. */
static void reopen_closed(struct kvb_daemon *d)
{
    int rc = 0;
    for (size_t k = 0; rc >= 0 && k < d->n_src; k++) {
        if (d->src[k])
            continue;
        rc = open_source(d, d->cfg, d->src_from[k].sc, d->src_from[k].r, &d->src[k]);
        for (int i = 0; i < 40 && rc == -EADDRINUSE; i++) {
            pause_ms(50);
            rc = open_source(d, d->cfg, d->src_from[k].sc, d->src_from[k].r, &d->src[k]);
        }
    }
    if (rc < 0) {
        kvb_err("main", "reload: cannot reopen the running sources (%s): stopping", strerror(-rc));
        d->stop = d->failed = true;
    }
}

static void reload(struct kvb_daemon *d)
{
    bool closed = false; /* the running sources were closed (rebuild_sources) */
    struct kvb_config *nc = NULL;
    struct kvb_source **nsrc = NULL;
    struct src_origin *nfrom = NULL;
    size_t n_nsrc = 0, *lent = NULL;
    struct kvb_sink *nsink = NULL;
    int rc;
    kvb_info("main", "SIGHUP: reloading %s", d->cfg->path);
    kvb_publish_flush(d->out);
    sd_notifyf(0, "RELOADING=1\nMONOTONIC_USEC=%llu", (unsigned long long)kvb_mono_us());
    if ((rc = kvb_config_load_logged(d->cfg->path, &nc)) < 0) {
        kvb_err("main", "reload: %s is invalid, keeping the running configuration", d->cfg->path);
        return;
    }
    char *why = NULL;
    size_t why_len = 0;
    FILE *wf = open_memstream(&why, &why_len);
    rc = kvb_config_check_reload(d->cfg, nc, wf ? wf : stderr);
    if (wf)
        fclose(wf);
    kvb_log_lines(KVB_LOG_ERROR, "config", why);
    free(why);
    if (rc < 0) {
        kvb_err("main", "reload: a changed key needs a restart, keeping the running configuration");
        goto fail;
    }
    struct kvb_pipeline_cfg pc = kvb_pipeline_cfg_of(nc);
    if (!sources_equal(d->cfg, nc)) { /* reopened sources go on from where these are */
        kvb_state_free(&d->resume);
        d->resume = snapshot(d);
    }
    if (!sources_equal(d->cfg, nc) &&
        (rc = rebuild_sources(d, nc, &nsrc, &nfrom, &n_nsrc, &lent, &closed)) < 0) {
        kvb_err("main",
                "reload: cannot open the new sources (%s), keeping the running configuration",
                strerror(-rc));
        goto fail;
    }
    if (!nats_conn_equal(d->cfg, nc) && (rc = kvb_sink_create(nc, &d->m, d->wakefd, &nsink)) < 0) {
        kvb_err("main", "reload: cannot connect to NATS (%s), keeping the running configuration",
                strerror(-rc));
        goto fail;
    }
    if ((rc = kvb_pipeline_reconfigure(d->pipe, &pc)) < 0) {
        kvb_err("main", "reload: %s, keeping the running configuration", strerror(-rc));
        goto fail;
    }
    /* commit: nothing below can fail */
    size_t kept = 0;
    if (nsrc) {
        for (size_t i = 0; i < n_nsrc; i++)
            kept += lent[i] != 0;
        destroy_sources(&d->src, &d->src_from, &d->n_src); /* what was not taken over */
        d->src = nsrc;
        d->src_from = nfrom;
        d->n_src = n_nsrc;
        free(lent);
    } else { /* the same entries, in the same order: point at the new ones */
        for (size_t k = 0, n = 0; k < nc->n_sources; k++)
            for (uint32_t r = 0; r < nc->sources[k].dp_size && n < d->n_src; r++, n++)
                d->src_from[n].sc = &nc->sources[k];
    }
    for (size_t k = 0; k < d->n_src; k++) { /* the worker keys do not reopen a source */
        struct kvb_worker_cfg w = worker_of(d->src_from[k].sc);
        kvb_source_set_worker(d->src[k], &w);
    }
    if (nsink) {
        kvb_mirror_detach(d->res, d->sink);
        kvb_sink_destroy(&d->sink); /* flushes what it still holds */
        d->sink = nsink;
        kvb_sink_defer_writes(d->sink);
        kvb_publish_set_sink(d->out, d->sink);
        kvb_mirror_attach(d->res, d->sink);
    }
    struct kvb_publish_cfg uc = kvb_publish_cfg_of(nc);
    if (kvb_publish_reconfigure(d->out, &uc) < 0) /* validated by the config module */
        kvb_err("main", "reload: subject template too long");
    if (!kvb_engines_cfg_equal(d->cfg, nc)) { /* else the running ones keep their state */
        struct kvb_engines *ne = NULL;
        if ((rc = kvb_engines_create(nc, &d->m, publish_load, d, &ne)) < 0)
            kvb_err("main", "reload: engines: %s (not watching them)", strerror(-rc));
        kvb_engines_destroy(&d->eng);
        d->eng = ne;
    }
    kvb_stats_set_interval(d->stats, nc->log.stats_interval_s);
    kvb_config_free(&d->cfg);
    d->cfg = nc;
    kvb_mirror_reconfigure(d->res, nc);
    kvb_log_set_level(nc->log.level);
    if (nsrc)
        kvb_info("main", "reload: %zu source(s) kept, %zu opened", kept, d->n_src - kept);
    kvb_info("main", "reloaded %s%s%s", nc->path, nsrc ? " (sources reopened)" : "",
             nsink ? " (NATS reconnected)" : "");
    return;
fail:
    if (nsrc)
        lend_back(d, nsrc, lent, n_nsrc);
    free(lent);
    destroy_sources(&nsrc, &nfrom, &n_nsrc);
    kvb_sink_destroy(&nsink);
    kvb_config_free(&nc);
    if (closed)
        reopen_closed(d);
}

/* ---- the loop ----------------------------------------------------------- */

static void handle_signals(struct kvb_daemon *d)
{
    struct signalfd_siginfo si;
    while (read(d->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        if (si.ssi_signo == SIGHUP) {
            reload(d);
            sd_notify(0, "READY=1\nSTATUS=running");
        } else {
            kvb_info("main", "signal %u: stopping", si.ssi_signo);
            d->stop = true;
        }
    }
}

static void drain_wake(struct kvb_daemon *d)
{
    uint64_t v;
    while (read(d->wakefd, &v, sizeof(v)) == (ssize_t)sizeof(v))
        ;
}

/* Gauges, and backpressure: while nats.c holds more than 3/4 of
 * nats.reconnect_buffer_bytes (NATS away or slow), stop reading the engines.
 * Their batches wait in the SUB's queue (up to rcvhwm) or are dropped by the
 * engine's PUB; the resulting gap is recovered by replay once NATS is back,
 * and only what replay cannot fill becomes a barrier.  Nothing is published
 * into a full buffer, so no event_id is ever lost silently. */
/* Router events lost on the NATS side (a refused publish, or a buffer that
 * nats.c dropped with its connection): once NATS takes publishes again,
 * "cleared" for every stream, so that the router forgets what it may have
 * half-seen.  The engine streams go on; nothing is replayed for it. */
static void nats_loss_barrier(struct kvb_daemon *d)
{
    uint64_t losses = kvb_sink_losses(d->sink);
    if (losses != d->losses_seen) {
        d->losses_seen = losses;
        d->barrier_due = true;
    }
    if (kvb_publish_take_loss(d->out))
        d->barrier_due = true;
    if (!d->barrier_due || !kvb_sink_connected(d->sink))
        return;
    d->barrier_due = false;
    kvb_warn("main", "router events were lost on the NATS side: publishing barriers");
    for (size_t i = 0; i < d->n_src; i++)
        kvb_source_barrier_all(d->src[i], KVB_BAR_NATS_LOST);
    kvb_publish_flush(d->out);
}

static long rss_kib(void)
{
    long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%*s %ld", &pages) != 1)
            pages = 0;
        fclose(f);
    }
    return pages * (sysconf(_SC_PAGESIZE) / 1024);
}

/* The memory a backlog took (the SUB's queue read back after a pause, nats.c's
 * buffer, live batches held behind a replay) is freed once it is gone, but
 * glibc keeps the freed pages for later: RSS would stay at the backlog's
 * high-water mark.  Once nothing has been queued up for TRIM_CALM_MS, give
 * them back (malloc_trim), so that RSS after an outage returns to where it
 * was before. */
static void trim_after_backlog(struct kvb_daemon *d, bool backlog, uint64_t now)
{
    if (backlog) {
        d->trim_due = true;
        d->calm_since = 0;
        return;
    }
    if (!d->trim_due)
        return;
    if (!d->calm_since)
        d->calm_since = now;
    if (now - d->calm_since < TRIM_CALM_MS)
        return;
    d->trim_due = false;
    d->calm_since = 0;
#ifdef __GLIBC__
    long before = rss_kib();
    malloc_trim(0);
    long after = rss_kib();
    if (before - after >= 8192)
        kvb_info("main", "backlog gone: %ld KiB of memory returned to the system (RSS %ld KiB)",
                 before - after, after);
    else
        kvb_debug("main", "backlog gone: RSS %ld -> %ld KiB", before, after);
#endif
}

static void update_gauges(struct kvb_daemon *d)
{
    uint64_t pending = kvb_sink_pending_bytes(d->sink);
    uint64_t limit = d->cfg->nats.reconnect_buffer_bytes / 4 * 3;
    bool paused = limit > 0 && pending >= limit;
    if (paused != d->paused) {
        if (paused) {
            kvb_inc(&d->m.backpressure_pauses_total[0]);
            kvb_warn("main", "NATS buffer holds %llu bytes: pausing the engine streams",
                     (unsigned long long)pending);
        } else {
            kvb_info("main", "NATS buffer down to %llu bytes: reading again",
                     (unsigned long long)pending);
        }
        d->paused = paused;
    }
    bool held = kvb_publish_blocked(d->out);
    if (held != d->held_back)
        kvb_info("discovery", held ? "waiting for the EventSource records: not reading the engines"
                                   : "EventSource records registered: reading the engines");
    d->held_back = held;
    kvb_set(&d->m.reading_paused[0], paused || held);
    kvb_set(&d->m.nats_pending_bytes[0], pending);
    /* Not ready either while NATS has not taken router events for over
     * READY_GRACE_MS (a server that stopped reading), or while live batches
     * have been held back behind a replay that long (a replay that trickles
     * holds the live stream up to replay.timeout_ms): /readyz says which. */
    uint64_t now = kvb_mono_ms();
    size_t n_held = 0;
    bool busy = paused || held || (limit > 0 && pending >= limit / 4);
    for (size_t i = 0; i < d->n_src; i++) {
        n_held += kvb_source_held(d->src[i]);
        busy |= kvb_source_busy(d->src[i]);
    }
    trim_after_backlog(d, busy, now);
    d->held_since = !n_held ? 0 : d->held_since ? d->held_since : now;
    d->paused_since = !paused ? 0 : d->paused_since ? d->paused_since : now;
    uint64_t held_ms = d->held_since ? now - d->held_since + 1 : 0;
    uint64_t paused_ms = d->paused_since ? now - d->paused_since + 1 : 0;
    kvb_set(&d->m.live_held_batches[0], n_held);
    kvb_set(&d->m.live_held_ms, held_ms);
    kvb_set(&d->m.paused_ms, paused_ms);
    kvb_set(&d->m.ready[0], d->n_src > 0 && kvb_sink_connected(d->sink) &&
                                kvb_get(&d->m.engines_gone[0]) == 0 &&
                                kvb_publish_registered(d->out) && held_ms <= READY_GRACE_MS &&
                                paused_ms <= READY_GRACE_MS && !d->save_failing);
    kvb_mirror_gauges(d->res);
    save_done(d);
}

/* Liveness: /healthz reads the heartbeat; systemd's watchdog gets WATCHDOG=1. */
static void heartbeat(struct kvb_daemon *d, uint64_t now)
{
    kvb_set(&d->m.loop_heartbeat_ms, now);
    if (d->watchdog_ms && now - d->last_watchdog >= d->watchdog_ms) {
        sd_notify(0, "WATCHDOG=1");
        d->last_watchdog = now;
    }
}

static int turn(struct kvb_daemon *d, zmq_pollitem_t *items, size_t cap)
{
    size_t n = 0;
    items[n++] = (zmq_pollitem_t){NULL, d->sigfd, ZMQ_POLLIN, 0};
    items[n++] = (zmq_pollitem_t){NULL, d->wakefd, ZMQ_POLLIN, 0};
    items[n++] = (zmq_pollitem_t){kvb_zap_socket(d->zap), 0, ZMQ_POLLIN, 0};
    uint64_t now = kvb_mono_ms();
    heartbeat(d, now);
    update_gauges(d);
    bool hold = d->paused || d->held_back;
    if (hold && !d->hold_since) {
        d->hold_since = now;
    } else if (!hold && d->hold_since) {
        /* replies were not read meanwhile: not the engine's time */
        for (size_t i = 0; i < d->n_src; i++)
            kvb_source_resume(d->src[i], now - d->hold_since, now);
        d->hold_since = 0;
    }
    long timeout = hold ? PAUSED_POLL_MS : (long)d->heartbeat_ms;
    if (d->watchdog_ms) { /* wake in time for the next WATCHDOG=1 */
        uint64_t due = d->last_watchdog + d->watchdog_ms;
        long left = due > now ? (long)(due - now) : 0;
        if (left < timeout)
            timeout = left;
    }
    for (size_t i = 0; i < d->n_src && n + 3 <= cap; i++) {
        void *sub = hold ? NULL : kvb_source_sub(d->src[i]);
        void *rs = hold ? NULL : kvb_source_replay(d->src[i]);
        void *mon = kvb_source_monitor(d->src[i]);
        items[n++] = (zmq_pollitem_t){sub, sub ? 0 : -1, sub ? ZMQ_POLLIN : 0, 0};
        items[n++] = (zmq_pollitem_t){rs, rs ? 0 : -1, rs ? ZMQ_POLLIN : 0, 0};
        items[n++] = (zmq_pollitem_t){mon, mon ? 0 : -1, mon ? ZMQ_POLLIN : 0, 0};
        long t = hold ? -1 : kvb_source_next_deadline(d->src[i], now);
        if (t >= 0 && t < timeout)
            timeout = t;
    }
    size_t ie = n; /* the engines' scrape results */
    int efd = kvb_engines_fd(d->eng);
    items[n++] = (zmq_pollitem_t){NULL, efd, efd >= 0 ? ZMQ_POLLIN : 0, 0};
    kvb_sink_service(d->sink); /* what the last turn published: one send() */
    int rc = zmq_poll(items, (int)n, timeout);
    if (rc < 0)
        return zmq_errno() == EINTR ? 0 : -zmq_errno();
    if (items[0].revents & ZMQ_POLLIN) {
        handle_signals(d);
        return 0; /* the sources may have been replaced */
    }
    if (items[1].revents & ZMQ_POLLIN) {
        drain_wake(d);
        kvb_mirror_serve(d->res); /* queries handed over by HTTP / NATS */
    }
    if (items[2].revents & ZMQ_POLLIN && (rc = kvb_zap_handle(d->zap)) < 0)
        kvb_err("zap", "%s", strerror(-rc));
    for (size_t i = 0; i < d->n_src; i++) {
        struct kvb_source *s = d->src[i];
        /* connection events first: a drop must be known before the
         * batches that came after it */
        if (items[5 + 3 * i].revents & ZMQ_POLLIN)
            kvb_source_read_monitor(s);
        if (items[4 + 3 * i].revents & ZMQ_POLLIN && (rc = kvb_source_read_replay(s)) < 0)
            kvb_err("replay", "%s: %s", kvb_source_name(s), strerror(-rc));
        if (items[3 + 3 * i].revents & ZMQ_POLLIN && (rc = kvb_source_read(s, READ_BUDGET)) < 0)
            kvb_err("source", "%s: %s", kvb_source_name(s), strerror(-rc));
        else if (items[3 + 3 * i].revents & ZMQ_POLLIN && rc > 0)
            kvb_engines_note_batch(d->eng, i, kvb_mono_ms());
        if (!hold) /* a replay's deadline does not run out while we hold back */
            kvb_source_tick(s, kvb_mono_ms());
    }
    kvb_publish_flush(d->out); /* one message per pair and turn when events are few */
    if (items[ie].revents & ZMQ_POLLIN)
        kvb_engines_on_ready(d->eng, d->src, d->n_src, kvb_mono_ms(), d->paused);
    nats_loss_barrier(d);
    update_gauges(d);
    kvb_stats_tick(d->stats, kvb_mono_ms());
    save_state(d, false);
    return 0;
}

/* Shutdown: wait (at most nats.flush_timeout_ms in all) for NATS to be
 * connected, then flush what nats.c holds.  A second SIGTERM/SIGINT gives up. */
static int drain(struct kvb_daemon *d)
{
    kvb_publish_flush(d->out);
    uint64_t deadline = kvb_mono_ms() + d->cfg->nats.flush_timeout_ms;
    while (!kvb_sink_connected(d->sink)) {
        uint64_t now = kvb_mono_ms();
        if (now >= deadline)
            return -ETIMEDOUT;
        struct pollfd fds[2] = {{d->wakefd, POLLIN, 0}, {d->sigfd, POLLIN, 0}};
        long wait = (long)(deadline - now);
        if (poll(fds, 2, wait > 100 ? 100 : (int)wait) > 0) {
            drain_wake(d);
            struct signalfd_siginfo si;
            if (fds[1].revents & POLLIN && read(d->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si) &&
                si.ssi_signo != SIGHUP)
                return -ECANCELED;
        }
    }
    uint64_t now = kvb_mono_ms();
    return kvb_sink_flush(d->sink, now < deadline ? (uint32_t)(deadline - now) : 1);
}

static int setup_fds(struct kvb_daemon *d)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
        return -errno;
    signal(SIGPIPE, SIG_IGN);
    d->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (d->sigfd < 0)
        return -errno;
    d->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    return d->wakefd < 0 ? -errno : 0;
}

int kvb_daemon_run(struct kvb_config **pcfg)
{
    int exit_code = 1, rc;
    zmq_pollitem_t *items = NULL;
    struct kvb_daemon *d = calloc(1, sizeof(*d));
    if (!d) {
        kvb_config_free(pcfg);
        return 1;
    }
    d->cfg = *pcfg;
    *pcfg = NULL;
    d->sigfd = d->wakefd = -1;
    kvb_log_set_level(d->cfg->log.level);

    if ((rc = setup_fds(d)) < 0) {
        kvb_err("main", "signals: %s", strerror(-rc));
        goto out;
    }
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof(seed), 0) != (ssize_t)sizeof(seed))
        seed = kvb_wall_ns() ^ ((uint64_t)getpid() << 32); /* publisher ids: new per start */
    struct kvb_publish_cfg uc = kvb_publish_cfg_of(d->cfg);
    if ((rc = kvb_publish_create(&uc, &d->m, seed, &d->out)) < 0) {
        kvb_err("main", "subject template: %s", strerror(-rc));
        goto out;
    }
    struct kvb_pipeline_cfg pc = kvb_pipeline_cfg_of(d->cfg);
    if ((rc = kvb_pipeline_create(&pc, &d->m, d->out, &d->pipe)) < 0) {
        kvb_err("main", "pipeline: %s", strerror(-rc));
        goto out;
    }
    kvb_converter_set_epoch(kvb_pipeline_converter(d->pipe), kvb_wall_ms());
    if ((rc = kvb_mirror_create(d->cfg, &d->m, d->wakefd, &d->res)) < 0) {
        kvb_err("main", "residency mirror: %s", strerror(-rc));
        goto out;
    }
    kvb_publish_set_observer(d->out, kvb_mirror_observe, d->res);
    if ((rc = load_state(d)) < 0) {
        kvb_err("state", "%s", strerror(-rc));
        goto out;
    }
    rc = kvb_sink_create(d->cfg, &d->m, d->wakefd, &d->sink);
    if (rc < 0) {
        kvb_err("sink", "cannot reach NATS%s: %s",
                d->cfg->nats.jetstream.enabled && rc == -EACCES ? " (or its JetStream stream)" : "",
                strerror(-rc));
        exit_code = rc == -ETIMEDOUT || rc == -EACCES ? KVB_EX_UNAVAILABLE
                    : rc == -EINVAL                   ? KVB_EX_CONFIG
                                                      : 1;
        goto out;
    }
    kvb_sink_defer_writes(d->sink);
    kvb_publish_set_sink(d->out, d->sink);
    kvb_mirror_attach(d->res, d->sink); /* NATS queries (query.subject) */
    if (d->resume && kvb_mirror_load(d->res, d->cfg->state.dir, d->resume, mirror_barrier, d) < 0)
        kvb_warn("state", "residency mirror: cannot load (out of memory)");
    if (d->cfg->discovery.etcd.n_endpoints &&
        ((rc = kvb_discovery_create(d->cfg, &d->m, d->wakefd, &d->disc)) < 0 ||
         (rc = kvb_publish_set_discovery(d->out, d->disc, d->cfg)) < 0)) {
        kvb_err("discovery", "cannot start: %s", strerror(-rc));
        goto out;
    }
    d->zctx = zmq_ctx_new();
    if (!d->zctx || kvb_zap_create(d->zctx, &d->m, &d->zap) < 0 ||
        (rc = build_sources(d, d->cfg, false, &d->src, &d->src_from, &d->n_src, NULL)) < 0) {
        kvb_err("main", "cannot open the sources");
        goto out;
    }
    if (d->cfg->metrics.listen[0]) {
        if ((rc = kvb_http_start(d->cfg->metrics.listen, &d->m, KVB_VERSION, &d->http)) < 0) {
            kvb_err("http", "cannot listen on %s: %s", d->cfg->metrics.listen, strerror(-rc));
            goto out;
        }
        kvb_info("http", "metrics on http://%s/metrics", d->cfg->metrics.listen);
        kvb_http_set_query(d->http, kvb_mirror_query(d->res));
    }
    if ((rc = kvb_engines_create(d->cfg, &d->m, publish_load, d, &d->eng)) < 0) {
        kvb_err("engine", "cannot watch the engines: %s", strerror(-rc));
        goto out;
    }
    if ((rc = kvb_stats_create(&d->m, d->cfg->log.stats_interval_s, &d->stats)) < 0) {
        kvb_err("main", "stats: %s", strerror(-rc));
        goto out;
    }
    uint64_t wd_usec = 0;
    d->heartbeat_ms = HEARTBEAT_MS;
    d->save_rl = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(60000, 1);
    if (sd_watchdog_enabled(0, &wd_usec) > 0 && wd_usec > 0) {
        d->watchdog_ms = wd_usec / 2000; /* twice per WatchdogSec */
        if (d->watchdog_ms == 0)
            d->watchdog_ms = 1;
        if (d->watchdog_ms < d->heartbeat_ms)
            d->heartbeat_ms = d->watchdog_ms;
    }
    kvb_set(&d->m.heartbeat_interval_ms, d->heartbeat_ms);
    kvb_info("main", "running: worker_id %llu%s, %zu endpoint(s), subject %s",
             (unsigned long long)d->cfg->worker_id,
             d->cfg->n_sources > 1 || d->cfg->sources[0].n_topics ? " (and per source)" : "",
             d->n_src, kvb_publish_subject(d->out));
    sd_notify(0, "READY=1\nSTATUS=running");

    size_t cap = 0;
    while (!d->stop) {
        size_t need = 4 + 3 * d->n_src;
        if (need > cap) {
            zmq_pollitem_t *ni = realloc(items, need * sizeof(*ni));
            if (!ni)
                goto out;
            items = ni;
            cap = need;
        }
        if ((rc = turn(d, items, cap)) < 0) {
            kvb_err("main", "poll: %s", strerror(-rc));
            goto out;
        }
    }
    /* Stop reading; everything read is already decoded and handed to nats.c:
     * flush it out before leaving (waiting for NATS if it is away). */
    sd_notify(0, "STOPPING=1\nSTATUS=draining");
    kvb_mirror_close(d->res); /* queries get 503 from now on */
    rc = drain(d);
    bool undelivered = false;
    if (rc < 0) {
        /* what NATS has not confirmed is lost with the process: say so in
         * the exit status (kvbridge(8), EXIT STATUS), unless nothing waits */
        uint64_t left = kvb_sink_pending_bytes(d->sink), sent = 0;
        for (int f = 0; f < KVB_FMT__COUNT; f++)
            sent += kvb_get(&d->m.messages_published_total[f]);
        sent += kvb_get(&d->m.load_messages_published_total[0]);
        /* a connection nats.c gave up reports its buffer as full: only a
         * loss if anything was ever published */
        undelivered = left > 0 && sent > 0;
        kvb_sink_skip_final_flush(d->sink); /* one flush timeout, not two */
        kvb_warn("sink", "flush at shutdown: %s (%llu bytes of router events not delivered%s)",
                 strerror(-rc), (unsigned long long)left, undelivered ? ": exit status 75" : "");
    } else {
        save_state(d, true);
    }
    exit_code = d->failed ? 1 : undelivered ? KVB_EX_TEMPFAIL : 0;
out:
    kvb_mirror_close(d->res);
    kvb_http_stop(&d->http);
    kvb_engines_destroy(&d->eng); /* before the metrics and sources it writes */
    kvb_stats_destroy(&d->stats);
    free(items);
    destroy_sources(&d->src, &d->src_from, &d->n_src);
    kvb_zap_destroy(&d->zap); /* after the sources registered with it */
    if (d->zctx)
        zmq_ctx_term(d->zctx);
    kvb_mirror_detach(d->res, d->sink);
    kvb_discovery_destroy(&d->disc); /* revokes the lease: the records go */
    kvb_sink_destroy(&d->sink);
    kvb_publish_destroy(&d->out);
    kvb_pipeline_destroy(&d->pipe);
    kvb_mirror_destroy(&d->res); /* after the HTTP server and the sink */
    kvb_state_free(&d->resume);
    if (d->sigfd >= 0)
        close(d->sigfd);
    if (d->wakefd >= 0)
        close(d->wakefd);
    kvb_config_free(&d->cfg);
    free(d);
    return exit_code;
}
