/* scrape: one thread, one libcurl multi handle, rounds per target (see
 * scrape.h for the threading choice and the rules). */
#include "scrape.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "clock.h"
#include "fetch.h"
#include "log.h"

#define STAGE "scrape"
#define HEALTH_MAX_BYTES 65536u /* a health body is read and dropped */
#define IDLE_WAIT_MS 1000

struct req {
    struct target *t;
    CURL *easy;
    struct kvb_fetch_body body; /* kept (metrics) or only counted (health) */
    bool active;
};

struct target {
    struct kvb_scrape_target cfg; /* strings owned */
    struct req metrics, health;
    struct curl_slist *headers;
    struct kvb_ratelimit rl;
    /* the round in flight (scrape thread only) */
    int pending;
    bool round_ok;
    int round_err;
    uint64_t round_start, next_due;
    bool was_failing;
    bool parsed; /* the metrics page of this round was parsed into prev */
    struct kvb_engine_load *scratch, *prev; /* prev: last parsed page */
    bool has_prev;
    /* shared with the loop, under kvb_scrape.mu */
    struct kvb_scrape_result res;
    bool fresh;
};

struct kvb_scrape {
    struct target *t;
    size_t n;
    CURLM *multi;
    int efd;
    pthread_t thread;
    bool thread_started, curl_inited;
    atomic_bool stop;
    pthread_mutex_t mu;
};

static bool set_url(const char *u) { return u && u[0]; }

static int setup_req(struct target *t, struct req *r, const char *url, size_t max, bool keep)
{
    r->t = t;
    r->body.max = max;
    r->body.keep = keep;
    return kvb_fetch_easy(url, t->cfg.timeout_ms, t->headers, &r->body, r, &r->easy);
}

static int start_req(struct kvb_scrape *s, struct req *r)
{
    r->body.len = 0;
    r->body.over = false;
    if (curl_multi_add_handle(s->multi, r->easy) != CURLM_OK)
        return -EIO;
    r->active = true;
    r->t->pending++;
    return 0;
}

static void start_round(struct kvb_scrape *s, struct target *t, uint64_t now)
{
    t->round_start = now;
    t->round_ok = false;
    t->round_err = 0;
    t->pending = 0;
    t->parsed = false;
    uint64_t iv = t->cfg.interval_ms;
    t->next_due = t->next_due + iv > now ? t->next_due + iv : now + iv;
    if (t->metrics.easy && start_req(s, &t->metrics) < 0)
        t->round_err = -EIO;
    if (t->health.easy && start_req(s, &t->health) < 0)
        t->round_err = -EIO;
}

static void end_round(struct kvb_scrape *s, struct target *t)
{
    uint64_t now = kvb_mono_ms();
    pthread_mutex_lock(&s->mu);
    struct kvb_scrape_result *r = &t->res;
    r->rounds++;
    r->last_round_ms = now;
    r->last_duration_ms = (uint32_t)(now - t->round_start);
    if (t->round_ok) {
        r->last_ok_ms = now;
        r->consecutive_failures = 0;
    } else {
        r->failed_rounds++;
        r->consecutive_failures++;
    }
    if (t->round_err)
        r->last_error = t->round_err;
    if (t->parsed) {
        r->load = *t->prev;
        r->has_load = true;
        r->load_ms = now;
    }
    t->fresh = true;
    pthread_mutex_unlock(&s->mu);
    uint64_t one = 1;
    ssize_t w = write(s->efd, &one, sizeof(one));
    (void)w; /* EAGAIN: the counter is already non-zero, the loop will look */
    if (!t->round_ok && !t->was_failing)
        kvb_log_rl(&t->rl, KVB_LOG_WARN, STAGE, "%s: engine endpoints not answering (%s)",
                   t->cfg.name, strerror(t->round_err ? -t->round_err : EIO));
    else if (t->round_ok && t->was_failing)
        kvb_info(STAGE, "%s: engine endpoints answer again", t->cfg.name);
    t->was_failing = !t->round_ok;
}

/* A request finished: account for it; the last one of the round ends it. */
static void done(struct kvb_scrape *s, CURL *easy, CURLcode code)
{
    struct req *r = NULL;
    curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&r);
    curl_multi_remove_handle(s->multi, easy);
    if (!r || !r->active)
        return;
    r->active = false;
    struct target *t = r->t;
    long status = 0;
    curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
    bool ok = code == CURLE_OK && status >= 200 && status < 300;
    if (ok) {
        t->round_ok = true;
    } else {
        t->round_err = code != CURLE_OK ? kvb_fetch_errno(code, &r->body) : -EPROTO;
        kvb_debug(STAGE, "%s: %s: %s (HTTP %ld)", t->cfg.name,
                  r == &t->metrics ? t->cfg.metrics_url : t->cfg.health_url,
                  code != CURLE_OK ? curl_easy_strerror(code) : "status", status);
    }
    if (r == &t->metrics) {
        pthread_mutex_lock(&s->mu);
        t->res.last_status = status;
        pthread_mutex_unlock(&s->mu);
        if (ok && kvb_engine_load_parse(t->cfg.kind, r->body.data, r->body.len, t->scratch) == 0) {
            kvb_engine_load_finish(t->scratch, t->has_prev ? t->prev : NULL, t->cfg.block_tokens);
            struct kvb_engine_load *x = t->prev;
            t->prev = t->scratch;
            t->scratch = x;
            t->has_prev = true;
            t->parsed = true;
            if (t->prev->prom.malformed)
                kvb_log_rl(&t->rl, KVB_LOG_WARN, STAGE, "%s: %llu malformed /metrics lines",
                           t->cfg.name, (unsigned long long)t->prev->prom.malformed);
        }
    }
    if (--t->pending == 0)
        end_round(s, t);
}

static bool idle(const struct target *t)
{
    return t->pending == 0 && (t->metrics.easy || t->health.easy);
}

static void *run(void *arg)
{
    struct kvb_scrape *s = arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals belong to the loop */
    while (!atomic_load(&s->stop)) {
        uint64_t now = kvb_mono_ms();
        for (size_t i = 0; i < s->n; i++) {
            struct target *t = &s->t[i];
            if (idle(t) && now >= t->next_due) {
                start_round(s, t, now);
                if (t->pending == 0) /* nothing could start: a failed round */
                    end_round(s, t);
            }
        }
        int running = 0, left;
        curl_multi_perform(s->multi, &running);
        CURLMsg *m;
        while ((m = curl_multi_info_read(s->multi, &left)))
            if (m->msg == CURLMSG_DONE)
                done(s, m->easy_handle, m->data.result);
        /* sleep until the next round is due or libcurl has work (sockets,
         * its own timeouts: curl_multi_poll waits no longer than those) */
        now = kvb_mono_ms();
        long wait = IDLE_WAIT_MS;
        for (size_t i = 0; i < s->n; i++) {
            const struct target *t = &s->t[i];
            if (idle(t)) {
                uint64_t d = t->next_due > now ? t->next_due - now : 0;
                if ((long)d < wait)
                    wait = (long)d;
            }
        }
        if (wait > 0 && !atomic_load(&s->stop))
            curl_multi_poll(s->multi, NULL, 0, (int)wait, NULL);
    }
    return NULL;
}

static void free_target(struct target *t)
{
    struct req *rs[2] = {&t->metrics, &t->health};
    for (int k = 0; k < 2; k++) {
        if (rs[k]->easy)
            curl_easy_cleanup(rs[k]->easy);
        free(rs[k]->body.data);
    }
    curl_slist_free_all(t->headers);
    free((char *)t->cfg.name);
    free((char *)t->cfg.metrics_url);
    free((char *)t->cfg.health_url);
    free(t->scratch);
    free(t->prev);
}

void kvb_scrape_destroy(struct kvb_scrape **ps)
{
    if (!ps || !*ps)
        return;
    struct kvb_scrape *s = *ps;
    if (s->thread_started) {
        atomic_store(&s->stop, true);
        curl_multi_wakeup(s->multi);
        pthread_join(s->thread, NULL);
    }
    for (size_t i = 0; s->t && i < s->n; i++) {
        struct target *t = &s->t[i];
        if (s->multi) {
            if (t->metrics.active)
                curl_multi_remove_handle(s->multi, t->metrics.easy);
            if (t->health.active)
                curl_multi_remove_handle(s->multi, t->health.easy);
        }
        free_target(t);
    }
    free(s->t);
    if (s->multi)
        curl_multi_cleanup(s->multi);
    if (s->efd >= 0)
        close(s->efd);
    pthread_mutex_destroy(&s->mu);
    if (s->curl_inited)
        curl_global_cleanup();
    free(s);
    *ps = NULL;
}

static char *dup_or_null(const char *x) { return set_url(x) ? strdup(x) : NULL; }

static int init_target(struct target *t, const struct kvb_scrape_target *c, uint64_t now)
{
    t->cfg = *c;
    t->cfg.name = strdup(c->name ? c->name : "engine");
    t->cfg.metrics_url = dup_or_null(c->metrics_url);
    t->cfg.health_url = dup_or_null(c->health_url);
    if (!t->cfg.name || (set_url(c->metrics_url) && !t->cfg.metrics_url) ||
        (set_url(c->health_url) && !t->cfg.health_url))
        return -ENOMEM;
    if (!t->cfg.timeout_ms)
        t->cfg.timeout_ms = t->cfg.interval_ms;
    if (!t->cfg.max_bytes)
        t->cfg.max_bytes = KVB_SCRAPE_MAX_BYTES;
    t->rl = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(60000, 3);
    t->scratch = calloc(1, sizeof(*t->scratch));
    t->prev = calloc(1, sizeof(*t->prev));
    t->headers = curl_slist_append(NULL, "Accept: text/plain;version=0.0.4");
    if (!t->scratch || !t->prev || !t->headers)
        return -ENOMEM;
    int rc = 0;
    if (t->cfg.metrics_url)
        rc = setup_req(t, &t->metrics, t->cfg.metrics_url, t->cfg.max_bytes, true);
    if (rc == 0 && t->cfg.health_url)
        rc = setup_req(t, &t->health, t->cfg.health_url, HEALTH_MAX_BYTES, false);
    if (rc < 0)
        return rc;
    t->res.has_url = t->cfg.metrics_url || t->cfg.health_url;
    t->res.started_ms = now;
    t->res.load.kind = c->kind;
    t->next_due = now; /* first round at once */
    return 0;
}

int kvb_scrape_create(const struct kvb_scrape_target *targets, size_t n, struct kvb_scrape **out)
{
    if (!out || (n && !targets))
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        const struct kvb_scrape_target *c = &targets[i];
        uint32_t to = c->timeout_ms ? c->timeout_ms : c->interval_ms;
        if (c->interval_ms < KVB_SCRAPE_MIN_INTERVAL_MS || to > c->interval_ms ||
            (c->kind != KVB_ENGINE_VLLM && c->kind != KVB_ENGINE_SGLANG))
            return -EINVAL;
    }
    struct kvb_scrape *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->efd = -1;
    pthread_mutex_init(&s->mu, NULL);
    int rc = -ENOMEM;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        goto fail;
    s->curl_inited = true;
    s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->efd < 0) {
        rc = -errno;
        goto fail;
    }
    s->multi = curl_multi_init();
    if (!s->multi)
        goto fail;
    s->t = calloc(n ? n : 1, sizeof(*s->t));
    if (!s->t)
        goto fail;
    s->n = n;
    uint64_t now = kvb_mono_ms();
    for (size_t i = 0; i < n; i++)
        if ((rc = init_target(&s->t[i], &targets[i], now)) < 0)
            goto fail;
    if ((rc = -pthread_create(&s->thread, NULL, run, s)) != 0)
        goto fail;
    s->thread_started = true;
    *out = s;
    return 0;
fail:
    kvb_scrape_destroy(&s);
    return rc;
}

size_t kvb_scrape_count(const struct kvb_scrape *s) { return s ? s->n : 0; }

int kvb_scrape_fd(const struct kvb_scrape *s) { return s ? s->efd : -1; }

void kvb_scrape_ack(struct kvb_scrape *s)
{
    uint64_t v;
    ssize_t r = read(s->efd, &v, sizeof(v));
    (void)r; /* EAGAIN: nothing pending */
}

int kvb_scrape_take(struct kvb_scrape *s, size_t i, struct kvb_scrape_result *out)
{
    if (!s || i >= s->n || !out)
        return -EINVAL;
    struct target *t = &s->t[i];
    int got = 0;
    pthread_mutex_lock(&s->mu);
    if (t->fresh) {
        *out = t->res;
        t->fresh = false;
        got = 1;
    }
    pthread_mutex_unlock(&s->mu);
    return got;
}

/* ---- liveness ------------------------------------------------------------- */

static uint64_t age(uint64_t now, uint64_t then) { return now > then ? now - then : 0; }

enum kvb_live_event kvb_liveness_judge(struct kvb_liveness *st, const struct kvb_live_input *in)
{
    if (!in->has_url)
        return KVB_LIVE_SAME;
    uint64_t answered = in->last_ok_ms ? in->last_ok_ms : in->since_ms;
    bool silent_endpoint = in->failing && age(in->now_ms, answered) >= in->dead_after_ms;
    bool no_batch =
        in->last_batch_ms == 0 || age(in->now_ms, in->last_batch_ms) >= in->dead_after_ms;
    if (!st->gone) {
        if (silent_endpoint && no_batch) {
            st->gone = true;
            return KVB_LIVE_GONE;
        }
        return KVB_LIVE_SAME;
    }
    /* gone: back when it answers, or a batch came after it was judged gone */
    bool batch_since =
        in->last_batch_ms != 0 && age(in->now_ms, in->last_batch_ms) < in->dead_after_ms;
    if (!in->failing || batch_since) {
        st->gone = false;
        return KVB_LIVE_BACK;
    }
    return KVB_LIVE_SAME;
}
