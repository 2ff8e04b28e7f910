/* start: everything the configuration asks for, built in order (daemon_priv.h). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <unistd.h>
#include <zmq.h>

#include <systemd/sd-daemon.h>

#include "clock.h"
#include "daemon_priv.h"
#include "discovery.h"
#include "engine.h"
#include "http.h"
#include "log.h"
#include "mirror.h"
#include "pipeline.h"
#include "publish.h"
#include "recovery.h"
#include "sink.h"
#include "source.h"
#include "stats.h"
#include "version.h"
#include "zap.h"

/* SIGTERM, SIGINT and SIGHUP through a signalfd; the eventfd that nats.c's
 * callbacks and the query hub wake the loop with. */
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

/* The data path's stages: publish, pipeline (its epoch), the residency
 * mirror as the publish stage's observer, then the saved state. */
static int start_stages(struct kvb_daemon *d)
{
    int rc;
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof(seed), 0) != (ssize_t)sizeof(seed))
        seed = kvb_wall_ns() ^ ((uint64_t)getpid() << 32); /* publisher ids: new per start */
    struct kvb_publish_cfg uc = kvb_publish_cfg_of(d->cfg);
    if ((rc = kvb_publish_create(&uc, &d->m, seed, &d->out)) < 0) {
        kvb_err("main", "subject template: %s", strerror(-rc));
        return rc;
    }
    struct kvb_pipeline_cfg pc = kvb_pipeline_cfg_of(d->cfg);
    if ((rc = kvb_pipeline_create(&pc, &d->m, d->out, &d->pipe)) < 0) {
        kvb_err("main", "pipeline: %s", strerror(-rc));
        return rc;
    }
    kvb_converter_set_epoch(kvb_pipeline_converter(d->pipe), kvb_wall_ms());
    if ((rc = kvb_mirror_create(d->cfg, &d->m, d->wakefd, &d->res)) < 0) {
        kvb_err("main", "residency mirror: %s", strerror(-rc));
        return rc;
    }
    kvb_publish_set_observer(d->out, kvb_mirror_observe, d->res);
    if ((rc = kvb_daemon_load_state(d)) < 0)
        kvb_err("state", "%s", strerror(-rc));
    return rc;
}

/* NATS (the sink), the mirror's NATS queries and saved content, discovery.
 * 0 or the exit code. */
static int start_nats(struct kvb_daemon *d)
{
    int rc = kvb_sink_create(d->cfg, &d->m, d->wakefd, &d->sink);
    if (rc < 0) {
        kvb_err("sink", "cannot reach NATS%s: %s",
                d->cfg->nats.jetstream.enabled && rc == -EACCES ? " (or its JetStream stream)" : "",
                strerror(-rc));
        return rc == -ETIMEDOUT || rc == -EACCES ? KVB_EX_UNAVAILABLE
               : rc == -EINVAL                   ? KVB_EX_CONFIG
                                                 : 1;
    }
    kvb_sink_defer_writes(d->sink);
    kvb_sink_watch_signals(d->sink, d->sigfd);
    kvb_publish_set_sink(d->out, d->sink);
    kvb_mirror_attach(d->res, d->sink); /* NATS queries (query.subject) */
    if (d->resume &&
        kvb_mirror_load(d->res, d->cfg->state.dir, d->resume, kvb_daemon_mirror_barrier, d) < 0)
        kvb_warn("state", "residency mirror: cannot load (out of memory)");
    /* the recovery endpoints serve before the records that name them exist */
    if (d->cfg->discovery.recovery.enabled &&
        (rc = kvb_recovery_create(d->cfg, &d->m, kvb_mirror_query(d->res), &d->rec)) < 0) {
        kvb_err("recovery", "cannot start: %s", strerror(-rc));
        return rc == -EADDRINUSE || rc == -EADDRNOTAVAIL || rc == -EACCES ? KVB_EX_UNAVAILABLE : 1;
    }
    kvb_recovery_attach(d->rec, d->sink);
    if (d->cfg->discovery.etcd.n_endpoints &&
        ((rc = kvb_discovery_create(d->cfg, &d->m, d->wakefd, kvb_recovery_target(d->rec),
                                    &d->disc)) < 0 ||
         (rc = kvb_publish_set_discovery(d->out, d->disc, d->cfg)) < 0)) {
        kvb_err("discovery", "cannot start: %s", strerror(-rc));
        return 1;
    }
    return 0;
}

/* The ZMQ context, the ZAP handler, the sources. */
static int start_sources(struct kvb_daemon *d)
{
    d->zctx = zmq_ctx_new();
    if (!d->zctx || kvb_zap_create(d->zctx, &d->m, &d->zap) < 0 ||
        kvb_daemon_build_sources(d, d->cfg, false, &d->src, &d->src_from, &d->n_src, NULL) < 0) {
        kvb_err("main", "cannot open the sources");
        return -EIO;
    }
    return 0;
}

/* The metrics listener (and the query API on it), the engines, the stats,
 * the engines' lists of their sources (sources[].discover). */
static int start_ops(struct kvb_daemon *d)
{
    int rc;
    if (d->cfg->metrics.listen[0]) {
        if ((rc = kvb_http_start(d->cfg->metrics.listen, &d->m, KVB_VERSION, &d->http)) < 0) {
            kvb_err("http", "cannot listen on %s: %s", d->cfg->metrics.listen, strerror(-rc));
            return rc;
        }
        kvb_info("http", "metrics on http://%s/metrics", d->cfg->metrics.listen);
        kvb_http_set_query(d->http, kvb_mirror_query(d->res));
    }
    if ((rc = kvb_engines_create(d->cfg, &d->m, kvb_daemon_publish_load, d, &d->eng)) < 0) {
        kvb_err("engine", "cannot watch the engines: %s", strerror(-rc));
        return rc;
    }
    if ((rc = kvb_stats_create(&d->m, d->cfg->log.stats_interval_s, &d->stats)) < 0) {
        kvb_err("main", "stats: %s", strerror(-rc));
        return rc;
    }
    if ((rc = kvb_daemon_follow_start(d)) < 0) /* after the engines: their liveness */
        kvb_err("source", "cannot read the engines' lists of their sources: %s", strerror(-rc));
    return rc;
}

/* The heartbeat, faster under a systemd watchdog: WATCHDOG=1 twice per
 * WatchdogSec. */
static void start_heartbeat(struct kvb_daemon *d)
{
    uint64_t wd_usec = 0;
    d->heartbeat_ms = HEARTBEAT_MS;
    if (sd_watchdog_enabled(0, &wd_usec) > 0 && wd_usec > 0) {
        d->watchdog_ms = wd_usec / 2000;
        if (d->watchdog_ms == 0)
            d->watchdog_ms = 1;
        if (d->watchdog_ms < d->heartbeat_ms)
            d->heartbeat_ms = d->watchdog_ms;
    }
    kvb_set(&d->m.heartbeat_interval_ms, d->heartbeat_ms);
}

int kvb_daemon_start(struct kvb_daemon *d)
{
    int rc;
    kvb_log_set_level(d->cfg->log.level);
    d->save_rl = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(60000, 1);
    d->repair_rl = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(10000, 3);
    if ((rc = setup_fds(d)) < 0) {
        kvb_err("main", "signals: %s", strerror(-rc));
        return 1;
    }
    if (start_stages(d) < 0)
        return 1;
    if ((rc = start_nats(d)) != 0)
        return rc;
    if (start_sources(d) < 0 || start_ops(d) < 0)
        return 1;
    start_heartbeat(d);
    kvb_info("main", "running: worker_id %llu%s, %zu endpoint(s), subject %s",
             (unsigned long long)d->cfg->worker_id,
             d->cfg->n_sources > 1 || d->cfg->sources[0].n_topics ? " (and per source)" : "",
             d->n_src, kvb_publish_subject(d->out));
    sd_notify(0, "READY=1\nSTATUS=running");
    return 0;
}
