/* save: the cursors (and the mirror) saved to state.dir, and loaded at
 * start (daemon_priv.h; the file format is state.c's). */
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

/* ---- state (state.dir) -------------------------------------------------- */

static void add_stream(void *ctx, const char *source, const char *topic,
                       const struct kvb_stream *st)
{
    if (st->has_last)
        kvb_state_add_stream(ctx, source, topic, st);
}

static void add_track(void *ctx, const struct kvb_track_rec *r)
{
    struct kvb_state *st = ctx;
    if (kvb_state_add_track(st, r) < 0)
        st->n_track = SIZE_MAX; /* short of memory: no state (see below) */
}

/* Everything the pipeline has applied so far: counters, stream cursors and
 * (tracker) the block tracker. */
struct kvb_state *kvb_daemon_snapshot(struct kvb_daemon *d, bool tracker)
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
        if (d->src[i]) /* NULL: a listed rank not open */
            kvb_source_foreach_stream(d->src[i], add_stream, st);
    if (tracker)
        kvb_converter_track_foreach(conv, add_track, st);
    if (st->n_track == SIZE_MAX) /* a state without its tracker would mislead a restart */
        kvb_state_free(&st);
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
    struct kvb_state *st = kvb_daemon_snapshot(d, true);
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
    size_t full = 0;
    for (size_t i = 0; i < d->resume->n_track; i++) {
        int trc = kvb_converter_track_restore(conv, &d->resume->track[i]);
        if (trc == -ENOSPC)
            full++;
        else if (trc < 0)
            kvb_warn("state", "%s: a tracker entry is malformed (skipped)", dir);
    }
    if (full)
        kvb_warn("state",
                 "%s: %zu tracker entries beyond limits.max_tracked_blocks: the tracker "
                 "starts empty, with barriers",
                 dir, full);
    kvb_info("state", "%s: resuming %zu stream(s), %zu event_id counter(s), %zu tracker entries",
             dir, d->resume->n_streams, d->resume->n_counters, d->resume->n_track);
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
