/* stop: the drain at shutdown, and freeing everything (daemon_priv.h). */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
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
#include "state.h"
#include "stats.h"
#include "zap.h"

/* Of nats.flush_timeout_ms, what the drain leaves for closing the sink (a
 * handshake in progress is cut within a tick, nats.c's threads joined): the
 * stop as a whole ends within the flush timeout. */
#define CLOSE_RESERVE_MS 300u

/* Wait (at most nats.flush_timeout_ms in all, less the close's reserve) for
 * NATS to be connected, then flush what nats.c holds.  A second
 * SIGTERM/SIGINT gives up. */
static int drain(struct kvb_daemon *d)
{
    uint32_t ft = d->cfg->nats.flush_timeout_ms;
    uint64_t deadline =
        kvb_mono_ms() + (ft > 2 * CLOSE_RESERVE_MS ? ft - CLOSE_RESERVE_MS : ft / 2);
    kvb_sink_stopping(d->sink); /* no waiting for a handshake that does not answer */
    kvb_publish_flush(d->out);
    while (!kvb_sink_connected(d->sink)) {
        uint64_t now = kvb_mono_ms();
        if (now >= deadline)
            return -ETIMEDOUT;
        struct pollfd fds[2] = {{d->wakefd, POLLIN, 0}, {d->sigfd, POLLIN, 0}};
        long wait = (long)(deadline - now);
        if (poll(fds, 2, wait > 100 ? 100 : (int)wait) > 0) {
            kvb_daemon_drain_wake(d);
            struct signalfd_siginfo si;
            if (fds[1].revents & POLLIN && read(d->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si) &&
                si.ssi_signo != SIGHUP)
                return -ECANCELED;
        }
    }
    uint64_t now = kvb_mono_ms();
    return kvb_sink_flush(d->sink, now < deadline ? (uint32_t)(deadline - now) : 1);
}

int kvb_daemon_stop(struct kvb_daemon *d)
{
    /* Stop reading; everything read is already decoded and handed to nats.c:
     * flush it out before leaving (waiting for NATS if it is away). */
    sd_notify(0, "STOPPING=1\nSTATUS=draining");
    kvb_mirror_close(d->res); /* queries get 503 from now on */
    int rc = drain(d);
    bool undelivered = false;
    if (rc < 0) {
        /* what NATS has not confirmed is lost with the process: say so in
         * the exit status (kvbridge(8), EXIT STATUS), unless nothing waits */
        uint64_t left = kvb_sink_unsent_bytes(d->sink);
        /* router events lost earlier (a connection nats.c gave up with its
         * buffer, a refused publish) whose barrier is still owed */
        bool owed = d->barrier_due || kvb_sink_losses(d->sink) != d->losses_seen;
        undelivered = left > 0 || owed;
        kvb_sink_skip_final_flush(d->sink); /* one flush timeout, not two */
        kvb_warn("sink", "flush at shutdown: %s (%llu bytes of router events not delivered%s%s)",
                 strerror(-rc), (unsigned long long)left,
                 owed ? ", and events lost earlier without their barrier" : "",
                 undelivered ? ": exit status 75" : "");
    } else {
        kvb_daemon_save_state(d, true);
    }
    return d->failed ? 1 : undelivered ? KVB_EX_TEMPFAIL : 0;
}

void kvb_daemon_free(struct kvb_daemon *d)
{
    kvb_mirror_close(d->res);
    kvb_http_stop(&d->http);
    kvb_daemon_follow_stop(d);
    kvb_engines_destroy(&d->eng); /* before the metrics and sources it writes */
    kvb_stats_destroy(&d->stats);
    free(d->items);
    kvb_daemon_destroy_sources(&d->src, &d->src_from, &d->n_src);
    kvb_zap_destroy(&d->zap); /* after the sources registered with it */
    if (d->zctx)
        zmq_ctx_term(d->zctx);
    kvb_mirror_detach(d->res, d->sink); /* every NATS request served stops */
    kvb_recovery_destroy(&d->rec);      /* the mirror is closed: its queries end */
    kvb_discovery_destroy(&d->disc);    /* revokes the lease: the records go */
    kvb_sink_destroy(&d->sink);
    kvb_pipeline_destroy(&d->pipe); /* before the publish stage it hands events to */
    kvb_publish_destroy(&d->out);
    kvb_mirror_destroy(&d->res); /* after the HTTP server and the sink */
    kvb_state_free(&d->resume);
    if (d->sigfd >= 0)
        close(d->sigfd);
    if (d->wakefd >= 0)
        close(d->wakefd);
    kvb_config_free(&d->cfg);
    free(d);
}
