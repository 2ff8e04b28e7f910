/* follow: the sources an engine lists (sources[].discover, daemon_priv.h).
 *
 * An engine that binds ephemeral ports (vLLM given port 0) says where on
 * its HTTP face (GET /kv_event_sources, srclist.h), and gets new ports at
 * every restart.  For each such entry the loop keeps the last list read and
 * makes the entry's slots follow it, every turn:
 *   - a rank listed and not open: its source is opened on the listed
 *     endpoints (the first time from d->resume: a kvbridge restart while
 *     the engine ran goes on where it was);
 *   - a rank open on endpoints the list no longer gives (moved: the engine
 *     restarted; or gone): once its source is quiet (nothing of the old
 *     stream left unread, no replay running), "cleared" for its streams
 *     (cause restart, counted as an engine restart) and the source is
 *     closed; the new one starts as a new stream: its first batch's seq S
 *     asks its replay endpoint for 0..S-1, so nothing the new engine still
 *     holds is lost, and the start barrier it would publish is redundant
 *     after the restart one;
 *   - the list is read (again): at start; at once when the engine's liveness
 *     changes (engine.h); and while any rank is not connected (not listed,
 *     not open, its connection lost or never up), with a backoff of
 *     BACKOFF_MIN_MS doubling to BACKOFF_MAX_MS between reads.  A read that
 *     fails is counted (srclist.h) and logged (rate-limited); the last good
 *     list stays.
 * /readyz is 503 while an entry's list has never been read
 * (kvbridge_source_lists_unread).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "daemon_priv.h"
#include "engine.h"
#include "log.h"
#include "metrics.h"
#include "source.h"
#include "srclist.h"

#define BACKOFF_MIN_MS 250
#define BACKOFF_MAX_MS 5000

static void free_follow(struct follow *f)
{
    free(f->list);
    free(f->opened);
    free(f->failed);
    memset(f, 0, sizeof(*f));
}

void kvb_daemon_follow_stop(struct kvb_daemon *d)
{
    kvb_srclist_destroy(&d->lists);
    for (size_t i = 0; i < d->n_fl; i++)
        free_follow(&d->fl[i]);
    free(d->fl);
    d->fl = NULL;
    d->n_fl = 0;
    kvb_set(&d->m.source_lists_unread[0], 0);
}

/* The follow states of d->cfg's entries with discover, and the thread that
 * reads their lists; OLD (N_OLD, may be NULL): the states they replace,
 * whose lists an entry of the same engine takes over. */
static int build(struct kvb_daemon *d, struct follow *old, size_t n_old)
{
    const struct kvb_config *c = d->cfg;
    size_t n = 0, first = 0;
    for (size_t i = 0; i < c->n_sources; i++)
        n += c->sources[i].discover[0] != '\0';
    if (!n)
        return 0;
    struct kvb_srclist_target *t = calloc(n, sizeof(*t));
    char **urls = calloc(n, sizeof(*urls));
    d->fl = calloc(n, sizeof(*d->fl));
    int rc = t && urls && d->fl ? 0 : -ENOMEM;
    for (size_t i = 0, k = 0; rc == 0 && i < c->n_sources; first += c->sources[i++].dp_size) {
        const struct kvb_source_cfg *sc = &c->sources[i];
        if (!sc->discover[0])
            continue;
        struct follow *f = &d->fl[k];
        *f = (struct follow){.sc = sc,
                             .first = first,
                             .backoff_ms = BACKOFF_MIN_MS,
                             .live_seen = kvb_engines_liveness_changes(d->eng, first),
                             .rl = KVB_RATELIMIT_INIT(30000, 2)};
        d->n_fl = ++k;
        f->opened = calloc(sc->dp_size, sizeof(*f->opened));
        f->failed = calloc(sc->dp_size, sizeof(*f->failed));
        if (!f->opened || !f->failed || !(urls[k - 1] = kvb_srclist_url(sc->discover))) {
            rc = -ENOMEM;
            break;
        }
        t[k - 1] = (struct kvb_srclist_target){sc->discover, urls[k - 1]};
        for (size_t j = 0; j < n_old; j++) /* the same engine: its list stays */
            if (old[j].list && strcmp(old[j].sc->discover, sc->discover) == 0) {
                f->list = old[j].list;
                old[j].list = NULL;
                break;
            }
    }
    if (rc == 0)
        rc = kvb_srclist_create(t, n, &d->m, &d->lists);
    for (size_t k = 0; urls && k < n; k++)
        free(urls[k]);
    free(urls);
    free(t);
    return rc;
}

int kvb_daemon_follow_start(struct kvb_daemon *d)
{
    int rc = build(d, NULL, 0);
    if (rc < 0) {
        kvb_daemon_follow_stop(d);
        return rc;
    }
    for (size_t i = 0; i < d->n_fl; i++)
        kvb_info("source", "%s: reading the engine's list of its event sources (dp_rank %u..%u)",
                 d->fl[i].sc->discover, d->fl[i].sc->dp_rank,
                 d->fl[i].sc->dp_rank + d->fl[i].sc->dp_size - 1);
    kvb_daemon_follow_turn(d, false, kvb_mono_ms()); /* the first reads, at once */
    return 0;
}

void kvb_daemon_follow_reload(struct kvb_daemon *d)
{
    struct follow *old = d->fl;
    size_t n_old = d->n_fl;
    d->fl = NULL;
    d->n_fl = 0;
    kvb_srclist_destroy(&d->lists);
    int rc = build(d, old, n_old);
    for (size_t i = 0; i < n_old; i++)
        free_follow(&old[i]);
    free(old);
    if (rc < 0) {
        kvb_err("source", "reload: cannot read the engines' lists of their sources: %s",
                strerror(-rc));
        kvb_daemon_follow_stop(d);
        return;
    }
    kvb_daemon_follow_turn(d, false, kvb_mono_ms());
}

/* Source S is open on the endpoints and topic of E. */
static bool opened_on(const struct kvb_source *s, const struct kvb_srclist_entry *e)
{
    const char *ep, *rep, *topic;
    kvb_source_endpoints(s, &ep, &rep, &topic);
    return strcmp(ep, e->endpoint) == 0 && strcmp(rep, e->replay_endpoint) == 0 &&
           strcmp(topic, e->topic) == 0;
}

/* Rank r of F's slots onto its listed endpoints (or closed when it is not
 * listed); a source that still has something of its stream to read is left
 * for a later turn. */
static void follow_rank(struct kvb_daemon *d, struct follow *f, uint32_t r)
{
    struct kvb_source **slot = &d->src[f->first + r];
    uint32_t rank = f->sc->dp_rank + r;
    const struct kvb_srclist_entry *e = kvb_srclist_find(f->list, rank);
    if (*slot) {
        if ((e && opened_on(*slot, e)) || !kvb_source_quiet(*slot))
            return;
        const char *ep, *rep, *topic;
        kvb_source_endpoints(*slot, &ep, &rep, &topic);
        kvb_warn("source",
                 "%s: dp_rank %u %s %s%s%s: the engine restarted: publishing its restart "
                 "barrier",
                 f->sc->discover, rank, e ? "moved from" : "no longer listed at", ep,
                 e ? " to " : "", e ? e->endpoint : "");
        kvb_inc(&d->m.source_endpoint_changes_total[0]);
        kvb_inc(&d->m.engine_restarts_total[0]);
        int rc = kvb_source_barrier_all(*slot, KVB_BAR_RESTART);
        if (rc < 0)
            kvb_err("source", "%s: dp_rank %u: barrier: %s", f->sc->discover, rank, strerror(-rc));
        kvb_source_destroy(slot);
    }
    if (!e || f->failed[r])
        return;
    int rc = kvb_daemon_open_listed(d, f->sc, r, e, !f->opened[r], slot);
    f->opened[r] = true;
    if (rc < 0) {
        f->failed[r] = true;
        kvb_log_rl(&f->rl, KVB_LOG_ERROR, "source", "%s: dp_rank %u: cannot open %s: %s",
                   f->sc->discover, rank, e->endpoint, strerror(-rc));
    }
}

static bool same_list(const struct kvb_srclist_list *a, const struct kvb_srclist_list *b)
{
    return a && b && a->n == b->n && memcmp(a->e, b->e, a->n * sizeof(a->e[0])) == 0;
}

/* A new list for F: what it says, logged when it changed. */
static void take_list(struct follow *f, struct kvb_srclist_list *l)
{
    const struct kvb_source_cfg *sc = f->sc;
    bool changed = !same_list(f->list, l);
    if (f->fails || !f->list)
        kvb_info("source", "%s: read the engine's list: %zu source(s)", sc->discover, l->n);
    f->fails = 0;
    free(f->list);
    f->list = l;
    memset(f->failed, 0, sc->dp_size * sizeof(*f->failed));
    if (!changed)
        return;
    for (size_t i = 0; i < l->n; i++)
        if (l->e[i].rank < sc->dp_rank || l->e[i].rank - sc->dp_rank >= sc->dp_size)
            kvb_warn("source",
                     "%s: lists dp_rank %u (%s), which is not followed: dp_rank and dp_size "
                     "give %u..%u",
                     sc->discover, l->e[i].rank, l->e[i].endpoint, sc->dp_rank,
                     sc->dp_rank + sc->dp_size - 1);
    for (uint32_t r = 0; r < sc->dp_size; r++)
        if (!kvb_srclist_find(l, sc->dp_rank + r))
            kvb_warn("source", "%s: does not list dp_rank %u", sc->discover, sc->dp_rank + r);
}

/* Target I's result, if one came. */
static void take_result(struct kvb_daemon *d, size_t i)
{
    struct follow *f = &d->fl[i];
    struct kvb_srclist_result res;
    if (kvb_srclist_take(d->lists, i, &res) != 1)
        return;
    f->asked = false;
    if (res.err == 0) {
        take_list(f, res.list);
        return;
    }
    f->fails++;
    char what[96];
    if (res.err == -EPROTO)
        snprintf(what, sizeof(what), "HTTP status %ld", res.status);
    else if (res.err == -EINVAL)
        snprintf(what, sizeof(what), "%s", res.why ? res.why : "not a list of sources");
    else
        snprintf(what, sizeof(what), "%s", strerror(-res.err));
    kvb_log_rl(&f->rl, KVB_LOG_WARN, "source",
               "%s: cannot read the engine's list of its event sources (%s; %llu time(s) in a "
               "row)%s",
               f->sc->discover, what, (unsigned long long)f->fails,
               f->list ? ": keeping the last one" : ": not ready until it is read");
}

/* Whether F needs its list read now; schedules the next read. */
static bool due(struct kvb_daemon *d, struct follow *f, uint64_t now_ms)
{
    uint64_t live = kvb_engines_liveness_changes(d->eng, f->first);
    bool down = !f->list, force = live != f->live_seen;
    f->live_seen = live;
    for (uint32_t r = 0; !down && r < f->sc->dp_size; r++) {
        const struct kvb_source *s = d->src[f->first + r];
        down = !s || !kvb_source_connected(s);
    }
    if (!down && !force) {
        f->backoff_ms = BACKOFF_MIN_MS;
        f->next_ms = 0;
        return false;
    }
    if (f->asked || (!force && now_ms < f->next_ms))
        return false;
    f->next_ms = now_ms + f->backoff_ms;
    f->backoff_ms = f->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : f->backoff_ms * 2;
    return true;
}

void kvb_daemon_follow_turn(struct kvb_daemon *d, bool lists, uint64_t now_ms)
{
    if (!d->n_fl)
        return;
    if (lists)
        kvb_srclist_ack(d->lists);
    uint64_t unread = 0;
    for (size_t i = 0; i < d->n_fl; i++) {
        struct follow *f = &d->fl[i];
        if (lists)
            take_result(d, i);
        for (uint32_t r = 0; f->list && r < f->sc->dp_size; r++)
            follow_rank(d, f, r);
        if (due(d, f, now_ms)) {
            f->asked = true;
            kvb_srclist_ask(d->lists, i);
        }
        unread += !f->list;
    }
    kvb_set(&d->m.source_lists_unread[0], unread);
}

long kvb_daemon_follow_deadline(const struct kvb_daemon *d, uint64_t now_ms)
{
    long t = -1;
    for (size_t i = 0; i < d->n_fl; i++) {
        const struct follow *f = &d->fl[i];
        if (f->asked || !f->next_ms)
            continue;
        long left = f->next_ms > now_ms ? (long)(f->next_ms - now_ms) : 0;
        if (t < 0 || left < t)
            t = left;
    }
    return t;
}
