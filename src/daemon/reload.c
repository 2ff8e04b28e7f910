/* reload: SIGHUP (daemon_priv.h).  The file is loaded and checked again;
 * what can fail (sources, the NATS connection, the pipeline's settings) is
 * built first, then committed whole: a reload that fails leaves the running
 * configuration as it was. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <systemd/sd-daemon.h>

#include "clock.h"
#include "daemon_priv.h"
#include "engine.h"
#include "log.h"
#include "mirror.h"
#include "pipeline.h"
#include "publish.h"
#include "recovery.h"
#include "sink.h"
#include "source.h"
#include "state.h"
#include "stats.h"

static bool sources_equal(const struct kvb_config *a, const struct kvb_config *b)
{
    if (a->n_sources != b->n_sources || a->replay.timeout_ms != b->replay.timeout_ms ||
        a->replay.max_ms != b->replay.max_ms || a->replay.max_batches != b->replay.max_batches ||
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
    int rc = kvb_daemon_build_sources(d, c, true, out, from, n_out, lent);
    if (rc != -EADDRINUSE)
        return rc;
    if (!close_leftovers(d))
        return rc;
    kvb_info("main", "reload: a new source binds an address a changed one holds: "
                     "closed the changed ones first");
    *closed = true;
    for (int i = 0; i < 40 && rc == -EADDRINUSE; i++) {
        pause_ms(50);
        rc = kvb_daemon_build_sources(d, c, true, out, from, n_out, lent);
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
        if (d->src[k] || d->src_from[k].sc->discover[0]) /* listed: follow.c reopens it */
            continue;
        rc = kvb_daemon_open_source(d, d->cfg, d->src_from[k].sc, d->src_from[k].r, &d->src[k]);
        for (int i = 0; i < 40 && rc == -EADDRINUSE; i++) {
            pause_ms(50);
            rc = kvb_daemon_open_source(d, d->cfg, d->src_from[k].sc, d->src_from[k].r, &d->src[k]);
        }
    }
    if (rc < 0) {
        kvb_err("main", "reload: cannot reopen the running sources (%s): stopping", strerror(-rc));
        d->stop = d->failed = true;
    }
}

/* What a reload builds before it commits: the new configuration, the new
 * sources (NULL: the running ones stay, same entries in the same order), a
 * new NATS connection (NULL: the running one stays). */
struct staged {
    struct kvb_config *nc;
    struct kvb_source **src;
    struct src_origin *from;
    size_t n_src, *lent;
    struct kvb_sink *sink;
    bool closed; /* the running sources were closed (rebuild_sources) */
};

/* The file again, and whether every changed key may change now. */
static int load_checked(struct kvb_daemon *d, struct staged *st)
{
    int rc = kvb_config_load_logged(d->cfg->path, &st->nc);
    if (rc < 0) {
        kvb_err("main", "reload: %s is invalid, keeping the running configuration", d->cfg->path);
        return rc;
    }
    char *why = NULL;
    size_t why_len = 0;
    FILE *wf = open_memstream(&why, &why_len);
    rc = kvb_config_check_reload(d->cfg, st->nc, wf ? wf : stderr);
    if (wf)
        fclose(wf);
    kvb_log_lines(KVB_LOG_ERROR, "config", why);
    free(why);
    if (rc < 0)
        kvb_err("main", "reload: a changed key needs a restart, keeping the running configuration");
    return rc;
}

/* Everything that can fail: the sources, the NATS connection, the
 * pipeline's new settings. */
static int prepare(struct kvb_daemon *d, struct staged *st)
{
    const struct kvb_config *nc = st->nc;
    int rc;
    if (!sources_equal(d->cfg, nc)) { /* reopened sources go on from where these are */
        kvb_state_free(&d->resume);
        d->resume = kvb_daemon_snapshot(d, false);
        if ((rc = rebuild_sources(d, nc, &st->src, &st->from, &st->n_src, &st->lent, &st->closed)) <
            0) {
            kvb_err("main",
                    "reload: cannot open the new sources (%s), keeping the running configuration",
                    strerror(-rc));
            return rc;
        }
    }
    if (!nats_conn_equal(d->cfg, nc) &&
        (rc = kvb_sink_create(nc, &d->m, d->wakefd, &st->sink)) < 0) {
        kvb_err("main", "reload: cannot connect to NATS (%s), keeping the running configuration",
                strerror(-rc));
        return rc;
    }
    kvb_sink_watch_signals(st->sink, d->sigfd); /* NULL (the sink kept): nothing */
    struct kvb_pipeline_cfg pc = kvb_pipeline_cfg_of(nc);
    if ((rc = kvb_pipeline_reconfigure(d->pipe, &pc)) < 0)
        kvb_err("main", "reload: %s, keeping the running configuration", strerror(-rc));
    return rc;
}

/* The new sources in place (or the running ones pointed at the new
 * entries), each with its worker keys; how many were kept. */
static size_t commit_sources(struct kvb_daemon *d, struct staged *st)
{
    const struct kvb_config *nc = st->nc;
    size_t kept = 0;
    if (st->src) {
        for (size_t i = 0; i < st->n_src; i++)
            kept += st->lent[i] != 0;
        kvb_daemon_destroy_sources(&d->src, &d->src_from, &d->n_src); /* not taken over */
        d->src = st->src;
        d->src_from = st->from;
        d->n_src = st->n_src;
        free(st->lent);
        st->lent = NULL;
    } else { /* the same entries, in the same order: point at the new ones */
        for (size_t k = 0, n = 0; k < nc->n_sources; k++)
            for (uint32_t r = 0; r < nc->sources[k].dp_size && n < d->n_src; r++, n++)
                d->src_from[n].sc = &nc->sources[k];
    }
    for (size_t k = 0; k < d->n_src; k++) { /* the worker keys do not reopen a source */
        struct kvb_worker_cfg w = kvb_daemon_worker_of(d->src_from[k].sc);
        if (d->src[k])
            kvb_source_set_worker(d->src[k], &w);
    }
    return kept;
}

/* Nothing here can fail: the new configuration takes over. */
static void commit(struct kvb_daemon *d, struct staged *st)
{
    struct kvb_config *nc = st->nc;
    size_t kept = commit_sources(d, st);
    if (st->sink) {
        kvb_mirror_detach(d->res, d->sink);
        kvb_sink_destroy(&d->sink); /* flushes what it still holds */
        d->sink = st->sink;
        kvb_sink_defer_writes(d->sink);
        kvb_publish_set_sink(d->out, d->sink);
        kvb_mirror_attach(d->res, d->sink);
        kvb_recovery_attach(d->rec, d->sink);
    }
    struct kvb_publish_cfg uc = kvb_publish_cfg_of(nc);
    if (kvb_publish_reconfigure(d->out, &uc) < 0) /* validated by the config module */
        kvb_err("main", "reload: subject template too long");
    if (!kvb_engines_cfg_equal(d->cfg, nc)) { /* else the running ones keep their state */
        struct kvb_engines *ne = NULL;
        int rc = kvb_engines_create(nc, &d->m, kvb_daemon_publish_load, d, &ne);
        if (rc < 0)
            kvb_err("main", "reload: engines: %s (not watching them)", strerror(-rc));
        kvb_engines_destroy(&d->eng);
        d->eng = ne;
    }
    kvb_stats_set_interval(d->stats, nc->log.stats_interval_s);
    struct kvb_config *oc = d->cfg;
    d->cfg = nc;
    kvb_daemon_follow_reload(d); /* from the old entries, into the new */
    kvb_config_free(&oc);
    kvb_mirror_reconfigure(d->res, nc);
    kvb_log_set_level(nc->log.level);
    if (st->src)
        kvb_info("main", "reload: %zu source(s) kept, %zu opened", kept, d->n_src - kept);
    kvb_info("main", "reloaded %s%s%s", nc->path, st->src ? " (sources reopened)" : "",
             st->sink ? " (NATS reconnected)" : "");
}

/* The reload failed: the running configuration stays, whole. */
static void abandon(struct kvb_daemon *d, struct staged *st)
{
    if (st->src)
        kvb_daemon_lend_back(d, st->src, st->lent, st->n_src);
    free(st->lent);
    kvb_daemon_destroy_sources(&st->src, &st->from, &st->n_src);
    kvb_sink_destroy(&st->sink);
    kvb_config_free(&st->nc);
    if (st->closed)
        reopen_closed(d);
}

void kvb_daemon_reload(struct kvb_daemon *d)
{
    struct staged st = {0};
    kvb_info("main", "SIGHUP: reloading %s", d->cfg->path);
    kvb_publish_flush(d->out);
    sd_notifyf(0, "RELOADING=1\nMONOTONIC_USEC=%llu", (unsigned long long)kvb_mono_us());
    if (load_checked(d, &st) < 0 || prepare(d, &st) < 0) {
        abandon(d, &st);
        return;
    }
    commit(d, &st);
}
