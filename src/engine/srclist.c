/* srclist: the engines' /kv_event_sources, read on request by one thread
 * with a libcurl multi handle (include/srclist.h; the body's parser is
 * srclist_parse.c). */
#include "srclist.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "fetch.h"
#include "log.h"
#include "url.h"

#define IDLE_WAIT_MS 1000

struct target {
    char *name, *url, *host; /* host: the URL's, for wildcard endpoints */
    CURL *easy;
    struct kvb_fetch_body body;
    bool active; /* in the multi handle (the thread's) */
    /* shared with the loop, under kvb_srclist.mu */
    bool asked;
    bool fresh;
    struct kvb_srclist_result res;
};

struct kvb_srclist {
    struct target *t;
    size_t n;
    struct kvb_metrics *m;
    CURLM *multi;
    struct curl_slist *headers;
    int efd;
    pthread_t thread;
    bool thread_started, curl_inited;
    atomic_bool stop;
    pthread_mutex_t mu;
};

char *kvb_srclist_url(const char *value)
{
    struct kvb_url u;
    if (kvb_url_parse(value, NULL, &u, NULL) < 0)
        return strdup(value); /* the config checked it: not reached */
    bool bare = strcmp(u.path, "/") == 0 && !u.query;
    kvb_url_free(&u);
    if (!bare)
        return strdup(value);
    size_t n = strlen(value);
    while (n && value[n - 1] == '/')
        n--;
    char *s = malloc(n + sizeof KVB_SRCLIST_PATH);
    if (s) {
        memcpy(s, value, n);
        memcpy(s + n, KVB_SRCLIST_PATH, sizeof KVB_SRCLIST_PATH);
    }
    return s;
}

/* The result of target T's request (the thread): parsed, counted, handed
 * over (a result the loop has not taken yet is replaced). */
static void finish(struct kvb_srclist *l, struct target *t, CURLcode code)
{
    long status = 0;
    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
    struct kvb_srclist_result r = {.status = status};
    if (code != CURLE_OK)
        r.err = kvb_fetch_errno(code, &t->body);
    else if (status != 200)
        r.err = -EPROTO;
    else
        r.err = kvb_srclist_parse(t->body.data ? t->body.data : "", t->body.len, t->host, &r.list,
                                  &r.why);
    int reason = r.err == 0                            ? -1
                 : r.err == -EPROTO                    ? KVB_LF_STATUS
                 : r.err == -EINVAL || r.err == -EFBIG ? KVB_LF_BODY
                                                       : KVB_LF_UNREACHABLE;
    if (reason < 0)
        kvb_inc(&l->m->source_list_reads_total[0]);
    else if (r.err != -ENOMEM)
        kvb_inc(&l->m->source_list_failures_total[reason]);
    pthread_mutex_lock(&l->mu);
    free(t->res.list);
    t->res = r;
    t->fresh = true;
    pthread_mutex_unlock(&l->mu);
    uint64_t one = 1;
    ssize_t w = write(l->efd, &one, sizeof(one));
    (void)w; /* EAGAIN: the counter is already non-zero, the loop will look */
}

/* Requests the loop asked for, started. */
static void start_asked(struct kvb_srclist *l)
{
    pthread_mutex_lock(&l->mu);
    for (size_t i = 0; i < l->n; i++) {
        struct target *t = &l->t[i];
        if (!t->asked || t->active)
            continue;
        t->asked = false;
        t->body.len = 0;
        t->body.over = false;
        if (curl_multi_add_handle(l->multi, t->easy) == CURLM_OK)
            t->active = true;
    }
    pthread_mutex_unlock(&l->mu);
}

static void *run(void *arg)
{
    struct kvb_srclist *l = arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals belong to the loop */
    while (!atomic_load(&l->stop)) {
        start_asked(l);
        int running = 0, left;
        curl_multi_perform(l->multi, &running);
        CURLMsg *msg;
        while ((msg = curl_multi_info_read(l->multi, &left))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            struct target *t = NULL;
            CURL *easy = msg->easy_handle;
            CURLcode code = msg->data.result;
            curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&t);
            curl_multi_remove_handle(l->multi, easy);
            if (t) {
                t->active = false;
                finish(l, t, code);
            }
        }
        if (!atomic_load(&l->stop))
            curl_multi_poll(l->multi, NULL, 0, IDLE_WAIT_MS, NULL);
    }
    return NULL;
}

void kvb_srclist_destroy(struct kvb_srclist **pl)
{
    if (!pl || !*pl)
        return;
    struct kvb_srclist *l = *pl;
    if (l->thread_started) {
        atomic_store(&l->stop, true);
        curl_multi_wakeup(l->multi);
        pthread_join(l->thread, NULL);
    }
    for (size_t i = 0; l->t && i < l->n; i++) {
        struct target *t = &l->t[i];
        if (t->easy) {
            if (t->active)
                curl_multi_remove_handle(l->multi, t->easy);
            curl_easy_cleanup(t->easy);
        }
        free(t->res.list);
        free(t->body.data);
        free(t->name);
        free(t->url);
        free(t->host);
    }
    free(l->t);
    if (l->multi)
        curl_multi_cleanup(l->multi);
    curl_slist_free_all(l->headers);
    if (l->efd >= 0)
        close(l->efd);
    pthread_mutex_destroy(&l->mu);
    if (l->curl_inited)
        curl_global_cleanup();
    free(l);
    *pl = NULL;
}

static int init_target(struct target *t, const struct kvb_srclist_target *c,
                       struct curl_slist *headers)
{
    struct kvb_url u;
    int rc = kvb_url_parse(c->url, NULL, &u, NULL);
    if (rc < 0)
        return rc;
    bool http = strcmp(u.scheme, "http") == 0 || strcmp(u.scheme, "https") == 0;
    t->host = strdup(u.host);
    kvb_url_free(&u);
    t->name = strdup(c->name ? c->name : c->url);
    t->url = strdup(c->url);
    if (!t->host || !t->name || !t->url)
        return -ENOMEM;
    t->body = (struct kvb_fetch_body){.max = KVB_SRCLIST_MAX_BYTES, .keep = true};
    return http ? kvb_fetch_easy(t->url, KVB_SRCLIST_TIMEOUT_MS, headers, &t->body, t, &t->easy)
                : -EINVAL;
}

int kvb_srclist_create(const struct kvb_srclist_target *targets, size_t n, struct kvb_metrics *m,
                       struct kvb_srclist **out)
{
    if (!out || !m || (n && !targets))
        return -EINVAL;
    struct kvb_srclist *l = calloc(1, sizeof(*l));
    if (!l)
        return -ENOMEM;
    l->efd = -1;
    l->m = m;
    pthread_mutex_init(&l->mu, NULL);
    int rc = -ENOMEM;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        goto fail;
    l->curl_inited = true;
    if ((l->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
        rc = -errno;
        goto fail;
    }
    if (!(l->multi = curl_multi_init()) || !(l->t = calloc(n ? n : 1, sizeof(*l->t))) ||
        !(l->headers = curl_slist_append(NULL, "Accept: application/json")))
        goto fail;
    l->n = n;
    for (size_t i = 0; i < n; i++)
        if ((rc = init_target(&l->t[i], &targets[i], l->headers)) < 0)
            goto fail;
    if ((rc = -pthread_create(&l->thread, NULL, run, l)) != 0)
        goto fail;
    l->thread_started = true;
    *out = l;
    return 0;
fail:
    kvb_srclist_destroy(&l);
    return rc;
}

void kvb_srclist_ask(struct kvb_srclist *l, size_t i)
{
    if (!l || i >= l->n)
        return;
    pthread_mutex_lock(&l->mu);
    l->t[i].asked = true;
    pthread_mutex_unlock(&l->mu);
    curl_multi_wakeup(l->multi);
}

int kvb_srclist_fd(const struct kvb_srclist *l) { return l ? l->efd : -1; }

void kvb_srclist_ack(struct kvb_srclist *l)
{
    uint64_t v;
    ssize_t r = l ? read(l->efd, &v, sizeof(v)) : 0;
    (void)r; /* EAGAIN: nothing pending */
}

int kvb_srclist_take(struct kvb_srclist *l, size_t i, struct kvb_srclist_result *out)
{
    if (!l || i >= l->n || !out)
        return -EINVAL;
    struct target *t = &l->t[i];
    int got = 0;
    pthread_mutex_lock(&l->mu);
    if (t->fresh) {
        *out = t->res;
        t->res.list = NULL;
        t->fresh = false;
        got = 1;
    }
    pthread_mutex_unlock(&l->mu);
    return got;
}
