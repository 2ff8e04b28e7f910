/* turn: one turn of the loop (daemon_priv.h).  zmq_poll over the sources'
 * sockets, the signalfd, the wake eventfd, the ZAP socket and the engines'
 * scrape results; no busy polling (the poll blocks until something happens
 * or a deadline passes). */
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>
#include <zmq.h>

#include <systemd/sd-daemon.h>

#include "clock.h"
#include "daemon_priv.h"
#include "engine.h"
#include "log.h"
#include "mirror.h"
#include "publish.h"
#include "sink.h"
#include "source.h"
#include "srclist.h"
#include "stats.h"
#include "zap.h"

/* Every signal queued: SIGHUP reloads, SIGTERM / SIGINT stop the loop. */
static void handle_signals(struct kvb_daemon *d)
{
    struct signalfd_siginfo si;
    while (read(d->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        if (si.ssi_signo == SIGHUP) {
            kvb_daemon_reload(d);
            sd_notify(0, "READY=1\nSTATUS=running");
        } else {
            kvb_info("main", "signal %u: stopping", si.ssi_signo);
            d->stop = true;
        }
    }
}

void kvb_daemon_drain_wake(struct kvb_daemon *d)
{
    uint64_t v;
    while (read(d->wakefd, &v, sizeof(v)) == (ssize_t)sizeof(v))
        ;
}

/* Router events lost on the NATS side (a refused publish, a buffer that
 * nats.c dropped with its connection, a JetStream publish given up; and with
 * nats.resync_on_reconnect every reconnection, which may have lost what the
 * server had in flight): once NATS takes publishes again, the pairs that
 * lost events are repaired (repair.c): "cleared", so that the router forgets
 * what it may have half-seen, then their resident blocks from the mirror.
 * A JetStream loss names its pair; any other repairs every pair.  The
 * engine streams go on. */
/* Only the pairs that lost events (JetStream's give-ups, all named). */
static void repair_lost(struct kvb_daemon *d, const struct kvb_sink_pair *v, size_t n)
{
    kvb_warn("main",
             "router events of %zu (worker_id, dp_rank) pair(s) were lost on the NATS side: "
             "publishing their barriers",
             n);
    for (size_t i = 0; i < n; i++) {
        const struct kvb_sink_pair *p = &v[i];
        if (!kvb_daemon_configured_worker(d->cfg, p->worker_id))
            continue; /* an old worker_id's: nothing is published for it any more */
        int rc = kvb_daemon_repair_pair(d, p->worker_id, p->dp_rank, KVB_BAR_NATS_LOST);
        if (rc < 0)
            kvb_err("main", "worker_id %llu dp_rank %u: barrier: %s",
                    (unsigned long long)p->worker_id, p->dp_rank, strerror(-rc));
    }
    if (kvb_mirror_missing(d->res))
        kvb_info("main", "repairing from the residency mirror: %llu blocks to publish again",
                 (unsigned long long)kvb_mirror_missing(d->res));
}

static void nats_losses(struct kvb_daemon *d)
{
    uint64_t losses = kvb_sink_losses(d->sink);
    if (losses != d->losses_seen) {
        d->losses_seen = losses;
        d->barrier_due = true;
    }
    if (kvb_publish_take_loss(d->out))
        d->barrier_due = d->lost_all = true;
    uint64_t reconnects = kvb_get(&d->m.nats_reconnects_total[0]);
    if (reconnects != d->reconnects_seen) {
        d->reconnects_seen = reconnects;
        d->resync_due = d->cfg->nats.resync_on_reconnect && !d->cfg->nats.jetstream.enabled;
    }
    if (!(d->barrier_due || d->resync_due) || !kvb_sink_connected(d->sink))
        return;
    /* The sink keeps the lost pairs until now (every loss is listed before
     * it is counted): an empty list without `all` means this count's pairs
     * were taken, and repaired, with an earlier one. */
    struct kvb_sink_pair v[KVB_SINK_LOST_PAIRS];
    bool all = false;
    size_t n = d->barrier_due ? kvb_sink_take_lost_pairs(d->sink, v, KVB_SINK_LOST_PAIRS, &all) : 0;
    if (d->barrier_due && !all && !d->lost_all && !d->resync_due) {
        if (n)
            repair_lost(d, v, n);
    } else if (d->barrier_due) {
        kvb_warn("main", "router events were lost on the NATS side: publishing barriers");
        kvb_daemon_repair_all(d, KVB_BAR_NATS_LOST);
    } else {
        kvb_info("main", "reconnected to NATS: resynchronising the router (barriers, then "
                         "the resident blocks)");
        kvb_daemon_repair_all(d, KVB_BAR_NATS_RECONNECT);
    }
    d->barrier_due = d->resync_due = d->lost_all = false;
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

/* Gauges, and backpressure: while nats.c holds more than 3/4 of
 * nats.reconnect_buffer_bytes (NATS away or slow), stop reading the engines.
 * Their batches wait in the SUB's queue (up to rcvhwm) or are dropped by the
 * engine's PUB; the resulting gap is recovered by replay once NATS is back,
 * and only what replay cannot fill becomes a barrier.  Nothing is published
 * into a full buffer, so no event_id is ever lost silently. */
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
        if (!d->src[i])
            continue;
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
    kvb_set(&d->m.ready[0],
            d->n_src > 0 && kvb_sink_connected(d->sink) && kvb_get(&d->m.engines_gone[0]) == 0 &&
                kvb_get(&d->m.source_lists_unread[0]) == 0 && kvb_publish_registered(d->out) &&
                held_ms <= READY_GRACE_MS && paused_ms <= READY_GRACE_MS && !d->save_failing);
    kvb_mirror_gauges(d->res);
    kvb_daemon_save_done(d);
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

/* Poll items: a socket (none: not polled), a file descriptor. */
static zmq_pollitem_t sock_item(void *s)
{
    return (zmq_pollitem_t){s, s ? 0 : -1, s ? ZMQ_POLLIN : 0, 0};
}
static zmq_pollitem_t fd_item(int fd)
{
    return (zmq_pollitem_t){NULL, fd, fd >= 0 ? ZMQ_POLLIN : 0, 0};
}

static zmq_pollitem_t *src_item(struct kvb_daemon *d, size_t i, enum kvb_daemon_src_poll k)
{
    return &d->items[KVB_POLL__FIXED + KVB_POLL__PER_SOURCE * i + k];
}

/* Whether the engines are not read this turn (NATS backpressure, or
 * discovery waiting for a record); when that ends, the time held back is
 * not the engines' (kvb_source_resume). */
static bool holding_back(struct kvb_daemon *d, uint64_t now)
{
    bool hold = d->paused || d->held_back;
    if (hold && !d->hold_since) {
        d->hold_since = now;
    } else if (!hold && d->hold_since) {
        /* replies were not read meanwhile: not the engine's time */
        for (size_t i = 0; i < d->n_src; i++)
            if (d->src[i])
                kvb_source_resume(d->src[i], now - d->hold_since, now);
        d->hold_since = 0;
    }
    return hold;
}

/* Fill the poll set; the poll timeout (ms), or -ENOMEM.  While holding back
 * the engines' sockets are left out (the monitors stay: a drop is still
 * news) and replay deadlines do not run. */
static long arm(struct kvb_daemon *d, uint64_t now, bool hold)
{
    size_t need = KVB_POLL__FIXED + KVB_POLL__PER_SOURCE * d->n_src;
    if (need > d->cap_items) {
        zmq_pollitem_t *v = realloc(d->items, need * sizeof(*v));
        if (!v)
            return -ENOMEM;
        d->items = v;
        d->cap_items = need;
    }
    d->items[KVB_POLL_SIGNAL] = fd_item(d->sigfd);
    d->items[KVB_POLL_WAKE] = fd_item(d->wakefd);
    d->items[KVB_POLL_ZAP] = sock_item(kvb_zap_socket(d->zap));
    d->items[KVB_POLL_ENGINES] = fd_item(kvb_engines_fd(d->eng));
    d->items[KVB_POLL_LISTS] = fd_item(kvb_srclist_fd(d->lists));
    long timeout = hold ? PAUSED_POLL_MS : (long)d->heartbeat_ms;
    if (d->watchdog_ms) { /* wake in time for the next WATCHDOG=1 */
        uint64_t due = d->last_watchdog + d->watchdog_ms;
        long left = due > now ? (long)(due - now) : 0;
        if (left < timeout)
            timeout = left;
    }
    long rw = kvb_daemon_repair_wait(d, now); /* a repair under way goes on */
    if (rw >= 0 && rw < timeout)
        timeout = rw;
    long t = kvb_daemon_follow_deadline(d, now);
    if (t >= 0 && t < timeout)
        timeout = t;
    for (size_t i = 0; i < d->n_src; i++) {
        struct kvb_source *s = d->src[i];
        if (!s) { /* a listed rank not open: nothing to poll */
            for (int k = 0; k < KVB_POLL__PER_SOURCE; k++)
                *src_item(d, i, k) = sock_item(NULL);
            continue;
        }
        *src_item(d, i, KVB_POLL_SUB) = sock_item(hold ? NULL : kvb_source_sub(s));
        *src_item(d, i, KVB_POLL_REPLAY) = sock_item(hold ? NULL : kvb_source_replay(s));
        *src_item(d, i, KVB_POLL_MONITOR) = sock_item(kvb_source_monitor(s));
        t = hold ? -1 : kvb_source_next_deadline(s, now);
        if (t >= 0 && t < timeout)
            timeout = t;
    }
    return timeout;
}

static bool ready(const zmq_pollitem_t *it) { return it->revents & ZMQ_POLLIN; }

/* Each source: its connection events first (a drop must be known before the
 * batches that came after it), replay replies, live batches, deadlines. */
static void read_sources(struct kvb_daemon *d, bool hold)
{
    int rc;
    for (size_t i = 0; i < d->n_src; i++) {
        struct kvb_source *s = d->src[i];
        if (!s)
            continue;
        if (ready(src_item(d, i, KVB_POLL_MONITOR)))
            kvb_source_read_monitor(s);
        if (ready(src_item(d, i, KVB_POLL_REPLAY)) && (rc = kvb_source_read_replay(s)) < 0)
            kvb_err("replay", "%s: %s", kvb_source_name(s), strerror(-rc));
        if (ready(src_item(d, i, KVB_POLL_SUB))) {
            if ((rc = kvb_source_read(s, READ_BUDGET)) < 0)
                kvb_err("source", "%s: %s", kvb_source_name(s), strerror(-rc));
            else if (rc > 0)
                kvb_engines_note_batch(d->eng, i, kvb_mono_ms());
        }
        if (!hold) /* a replay's deadline does not run out while we hold back */
            kvb_source_tick(s, kvb_mono_ms());
    }
}

int kvb_daemon_turn(struct kvb_daemon *d)
{
    uint64_t now = kvb_mono_ms();
    heartbeat(d, now);
    update_gauges(d);
    bool hold = holding_back(d, now);
    long timeout = arm(d, now, hold);
    if (timeout < 0)
        return (int)timeout;
    size_t n = KVB_POLL__FIXED + KVB_POLL__PER_SOURCE * d->n_src;
    kvb_sink_service(d->sink); /* what the last turn published: one send() */
    int rc = zmq_poll(d->items, (int)n, timeout);
    if (rc < 0)
        return zmq_errno() == EINTR ? 0 : -zmq_errno();
    if (ready(&d->items[KVB_POLL_SIGNAL])) {
        handle_signals(d);
        return 0; /* the sources may have been replaced */
    }
    if (ready(&d->items[KVB_POLL_WAKE])) {
        kvb_daemon_drain_wake(d);
        kvb_mirror_serve(d->res); /* queries handed over by HTTP / NATS */
    }
    if (ready(&d->items[KVB_POLL_ZAP]) && (rc = kvb_zap_handle(d->zap)) < 0)
        kvb_err("zap", "%s", strerror(-rc));
    read_sources(d, hold);
    kvb_publish_flush(d->out); /* one message per pair and turn when events are few */
    if (ready(&d->items[KVB_POLL_ENGINES]))
        kvb_engines_on_ready(d->eng, d->src, d->n_src, kvb_mono_ms(), d->paused);
    nats_losses(d);
    kvb_daemon_repair_step(d, kvb_mono_ms());
    /* last: it may replace sources (the poll set is not used again) */
    kvb_daemon_follow_turn(d, ready(&d->items[KVB_POLL_LISTS]), kvb_mono_ms());
    update_gauges(d);
    kvb_stats_tick(d->stats, kvb_mono_ms());
    kvb_daemon_save_state(d, false);
    return 0;
}
