/* discovery: see include/discovery.h. */
#include "discovery.h"

#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "config.h"
#include "encode_msgpack.h"
#include "log.h"
#include "metrics.h"
#include "recovery.h"
#include "subject.h"

#define KEY_MAX 1024
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
#define CONNECT_TIMEOUT_MS 1000
#define REQUEST_TIMEOUT_MS 3000
#define REVOKE_TIMEOUT_MS 2000
#define RESPONSE_MAX (1u << 20)

struct pair {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint64_t publisher_id;
    bool registered; /* under mu */
};

struct kvb_discovery {
    char **urls;
    size_t n_urls, cur;
    char *ns, *comp, *ep;
    uint32_t ttl_s;
    struct kvb_metrics *m;
    int wake_fd;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    struct pair *pairs; /* under mu */
    size_t n_pairs, cap_pairs;
    size_t n_registered; /* under mu */

    /* the thread's own */
    pthread_t thread;
    bool started;
    CURL *curl;
    int64_t lease;
    struct kvb_ratelimit rl_err;
    bool recovery; /* the records name rt as each pair's recovery target */
    struct kvb_recovery_target rt;
};

/* ---- pure helpers ------------------------------------------------------- */

static int seg(const char *s, char *out, size_t cap)
{
    return kvb_subject_pct_encode(s, strlen(s), out, cap);
}

int kvb_discovery_key(const char *ns, const char *comp, const char *ep, uint64_t publisher_id,
                      char *out, size_t cap)
{
    char a[256 * 3], b[256 * 3], c[256 * 3];
    if (seg(ns, a, sizeof(a)) < 0 || seg(comp, b, sizeof(b)) < 0 || seg(ep, c, sizeof(c)) < 0)
        return -ENAMETOOLONG;
    int n = snprintf(out, cap,
                     "v1/event_sources/namespace/%s/component/%s/endpoint/%s/topic/%s/%" PRIx64, a,
                     b, c, KVB_MP_TOPIC_KV, publisher_id);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : n;
}

static json_object *endpoint_obj(const char *ns, const char *comp, const char *ep)
{
    json_object *o = json_object_new_object();
    if (o) {
        json_object_object_add(o, "namespace", json_object_new_string(ns));
        json_object_object_add(o, "component", json_object_new_string(comp));
        json_object_object_add(o, "name", json_object_new_string(ep));
    }
    return o;
}

/* The Instance of a pair's recovery endpoint (Dynamo's Instance: component,
 * endpoint, namespace, instance_id, transport {nats_tcp|tcp: ...}); with_type:
 * as the instance record holds it ({"type":"Endpoint", ...}).  NULL when out
 * of memory or a name does not fit. */
static json_object *instance_obj(const struct kvb_recovery_target *rt, uint64_t publisher_id,
                                 uint64_t worker_id, uint32_t dp_rank, bool with_type)
{
    char ep[64], tr[1024];
    if (kvb_recovery_endpoint(publisher_id, ep, sizeof(ep)) < 0 ||
        kvb_recovery_transport(rt, worker_id, dp_rank, tr, sizeof(tr)) < 0)
        return NULL;
    json_object *o = json_object_new_object(), *t = json_object_new_object();
    if (!o || !t) {
        json_object_put(o);
        json_object_put(t);
        return NULL;
    }
    if (with_type)
        json_object_object_add(o, "type", json_object_new_string("Endpoint"));
    json_object_object_add(o, "component", json_object_new_string(rt->component));
    json_object_object_add(o, "endpoint", json_object_new_string(ep));
    json_object_object_add(o, "namespace", json_object_new_string(rt->namespace_));
    json_object_object_add(o, "instance_id", json_object_new_uint64(rt->instance_id));
    json_object_object_add(t, rt->plane == KVB_RECOVERY_TCP ? "tcp" : "nats_tcp",
                           json_object_new_string(tr));
    json_object_object_add(o, "transport", t);
    return o;
}

static char *json_text(json_object *o)
{
    const char *s = o ? json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
                                                              JSON_C_TO_STRING_NOSLASHESCAPE)
                      : NULL;
    return s ? strdup(s) : NULL;
}

int kvb_discovery_instance_key(const struct kvb_recovery_target *rt, uint64_t publisher_id,
                               char *out, size_t cap)
{
    char ep[64];
    if (kvb_recovery_endpoint(publisher_id, ep, sizeof(ep)) < 0)
        return -ENAMETOOLONG;
    int n = snprintf(out, cap, "v1/instances/%s/%s/%s/%" PRIx64, rt->namespace_, rt->component, ep,
                     rt->instance_id);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : n;
}

char *kvb_discovery_instance_value(const struct kvb_recovery_target *rt, uint64_t publisher_id,
                                   uint64_t worker_id, uint32_t dp_rank)
{
    json_object *o = instance_obj(rt, publisher_id, worker_id, dp_rank, true);
    char *s = json_text(o);
    json_object_put(o);
    return s;
}

char *kvb_discovery_value(const char *ns, const char *comp, const char *ep, uint64_t publisher_id,
                          uint64_t worker_id, uint32_t dp_rank)
{
    return kvb_discovery_value_rt(ns, comp, ep, publisher_id, worker_id, dp_rank, NULL);
}

char *kvb_discovery_value_rt(const char *ns, const char *comp, const char *ep,
                             uint64_t publisher_id, uint64_t worker_id, uint32_t dp_rank,
                             const struct kvb_recovery_target *rt)
{
    json_object *root = json_object_new_object(), *scope = json_object_new_object(),
                *meta = json_object_new_object(), *worker = json_object_new_object();
    char *out = NULL;
    if (!root || !scope || !meta || !worker) {
        json_object_put(scope);
        json_object_put(meta);
        json_object_put(worker);
        goto out;
    }
    json_object_object_add(scope, "kind", json_object_new_string("endpoint"));
    json_object_object_add(scope, "endpoint", endpoint_obj(ns, comp, ep));
    json_object_object_add(worker, "worker_id", json_object_new_uint64(worker_id));
    json_object_object_add(worker, "dp_rank", json_object_new_uint64(dp_rank));
    json_object_object_add(meta, "kv_state_endpoint", endpoint_obj(ns, comp, ep));
    json_object_object_add(meta, "publisher_id", json_object_new_uint64(publisher_id));
    if (rt) {
        json_object *inst = instance_obj(rt, publisher_id, worker_id, dp_rank, false);
        if (!inst) { /* none of them is attached to root yet */
            json_object_put(worker);
            json_object_put(meta);
            json_object_put(scope);
            goto out;
        }
        json_object_object_add(meta, "recovery_target", inst);
    }
    json_object_object_add(meta, "worker", worker);
    json_object_object_add(root, "type", json_object_new_string("EventSource"));
    json_object_object_add(root, "scope", scope);
    json_object_object_add(root, "topic", json_object_new_string(KVB_MP_TOPIC_KV));
    json_object_object_add(root, "publisher_id", json_object_new_uint64(publisher_id));
    json_object_object_add(root, "metadata", meta);
    const char *s = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN |
                                                             JSON_C_TO_STRING_NOSLASHESCAPE);
    out = s ? strdup(s) : NULL;
out:
    json_object_put(root);
    return out;
}

/* base64 (OpenSSL) of len bytes into a malloc'd string. */
static char *b64(const char *s, size_t len)
{
    char *out = malloc(4 * ((len + 2) / 3) + 1);
    if (out)
        EVP_EncodeBlock((unsigned char *)out, (const unsigned char *)s, (int)len);
    return out;
}

/* ---- HTTP (libcurl), on the thread -------------------------------------- */

struct resp {
    char *buf;
    size_t len;
};

static size_t on_data(char *p, size_t size, size_t n, void *ctx)
{
    struct resp *r = ctx;
    size_t k = size * n;
    if (r->len + k > RESPONSE_MAX)
        return 0;
    char *nb = realloc(r->buf, r->len + k + 1);
    if (!nb)
        return 0;
    memcpy(nb + r->len, p, k);
    r->len += k;
    nb[r->len] = '\0';
    r->buf = nb;
    return k;
}

/* POST body to path on the current etcd URL; the parsed reply in *out.
 * 0, -EIO (no answer: the next URL is tried next time), -EPROTO. */
static int post(struct kvb_discovery *d, const char *path, json_object *body, long timeout_ms,
                json_object **out)
{
    char url[1024];
    struct resp r = {NULL, 0};
    const char *url0 = d->urls[d->cur % d->n_urls];
    size_t ul = strlen(url0);
    while (ul && url0[ul - 1] == '/')
        ul--;
    if (snprintf(url, sizeof(url), "%.*s%s", (int)ul, url0, path) >= (int)sizeof(url))
        return -ENAMETOOLONG;
    const char *text = json_object_to_json_string_ext(body, JSON_C_TO_STRING_PLAIN);
    struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_reset(d->curl);
    curl_easy_setopt(d->curl, CURLOPT_URL, url);
    curl_easy_setopt(d->curl, CURLOPT_POSTFIELDS, text);
    curl_easy_setopt(d->curl, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(d->curl, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(d->curl, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(d->curl, CURLOPT_CONNECTTIMEOUT_MS, (long)CONNECT_TIMEOUT_MS);
    curl_easy_setopt(d->curl, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(d->curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(d->curl, CURLOPT_PROTOCOLS_STR, "http,https");
    CURLcode cc = curl_easy_perform(d->curl);
    long status = 0;
    curl_easy_getinfo(d->curl, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(hdr);
    int rc = 0;
    if (cc != CURLE_OK) {
        kvb_log_rl(&d->rl_err, KVB_LOG_WARN, "discovery", "etcd %s%s: %s", url0, path,
                   curl_easy_strerror(cc));
        d->cur++; /* the next endpoint next time */
        rc = -EIO;
    } else if (!r.buf || !(*out = json_tokener_parse(r.buf))) {
        kvb_log_rl(&d->rl_err, KVB_LOG_WARN, "discovery", "etcd %s%s: HTTP %ld, no JSON reply",
                   url0, path, status);
        rc = -EPROTO;
    } else if (status != 200) {
        json_object *e = NULL;
        const char *msg =
            json_object_object_get_ex(*out, "message", &e) ? json_object_get_string(e) : r.buf;
        kvb_log_rl(&d->rl_err, KVB_LOG_WARN, "discovery", "etcd %s%s: HTTP %ld: %s", url0, path,
                   status, msg);
        json_object_put(*out);
        *out = NULL;
        rc = status == 404 ? -ENOENT : -EPROTO;
    }
    free(r.buf);
    if (rc < 0)
        kvb_inc(&d->m->discovery_etcd_errors_total[0]);
    return rc;
}

static int64_t get_i64(json_object *o, const char *k)
{
    json_object *v = NULL;
    return o && json_object_object_get_ex(o, k, &v) ? json_object_get_int64(v) : 0;
}

static json_object *id_body(int64_t lease)
{
    char id[24];
    snprintf(id, sizeof(id), "%" PRId64, lease);
    json_object *b = json_object_new_object();
    if (b)
        json_object_object_add(b, "ID", json_object_new_string(id));
    return b;
}

static int grant(struct kvb_discovery *d)
{
    json_object *b = json_object_new_object(), *r = NULL;
    if (!b)
        return -ENOMEM;
    json_object_object_add(b, "TTL", json_object_new_int64(d->ttl_s));
    int rc = post(d, "/v3/lease/grant", b, REQUEST_TIMEOUT_MS, &r);
    json_object_put(b);
    if (rc < 0)
        return rc;
    d->lease = get_i64(r, "ID");
    json_object_put(r);
    if (d->lease <= 0) {
        kvb_inc(&d->m->discovery_etcd_errors_total[0]);
        d->lease = 0;
        return -EPROTO;
    }
    kvb_info("discovery", "etcd lease %" PRIx64 " granted (TTL %u s)", (uint64_t)d->lease,
             d->ttl_s);
    return 0;
}

/* 0, -ENOENT when etcd no longer knows the lease, or an error. */
static int keepalive(struct kvb_discovery *d)
{
    json_object *b = id_body(d->lease), *r = NULL, *res = NULL;
    if (!b)
        return -ENOMEM;
    int rc = post(d, "/v3/lease/keepalive", b, REQUEST_TIMEOUT_MS, &r);
    json_object_put(b);
    if (rc < 0)
        return rc;
    if (!json_object_object_get_ex(r, "result", &res) || get_i64(res, "TTL") <= 0) {
        kvb_inc(&d->m->discovery_etcd_errors_total[0]);
        rc = -ENOENT;
    }
    json_object_put(r);
    return rc;
}

static void lease_revoke(struct kvb_discovery *d)
{
    json_object *b = id_body(d->lease), *r = NULL;
    if (b && post(d, "/v3/lease/revoke", b, REVOKE_TIMEOUT_MS, &r) == 0)
        kvb_info("discovery", "etcd lease %" PRIx64 " revoked: records removed",
                 (uint64_t)d->lease);
    json_object_put(b);
    json_object_put(r);
    d->lease = 0;
}

static json_object *put_req(const char *k64, const char *v64, int64_t lease)
{
    char id[24];
    snprintf(id, sizeof(id), "%" PRId64, lease);
    json_object *p = json_object_new_object();
    if (p) {
        json_object_object_add(p, "key", json_object_new_string(k64));
        json_object_object_add(p, "value", json_object_new_string(v64));
        json_object_object_add(p, "lease", json_object_new_string(id));
    }
    return p;
}

/* Put key = val under the lease: create-if-absent (as Dynamo does); a
 * record already there is ours (its key holds our publisher_id, or our
 * instance id): put it again so that it hangs off the current lease. */
static int put_kv(struct kvb_discovery *d, const char *key, const char *val)
{
    char *k64 = NULL, *v64 = NULL;
    json_object *txn = NULL, *r = NULL, *cmp, *succ, *op;
    int rc = -ENOMEM;
    if (!val || !(k64 = b64(key, strlen(key))) || !(v64 = b64(val, strlen(val))))
        goto out;
    if (!(txn = json_object_new_object()) || !(cmp = json_object_new_object()) ||
        json_object_object_add(txn, "compare", json_object_new_array()) ||
        json_object_array_add(json_object_object_get(txn, "compare"), cmp))
        goto out;
    json_object_object_add(cmp, "key", json_object_new_string(k64));
    json_object_object_add(cmp, "result", json_object_new_string("EQUAL"));
    json_object_object_add(cmp, "target", json_object_new_string("CREATE"));
    json_object_object_add(cmp, "create_revision", json_object_new_string("0"));
    succ = json_object_new_array();
    op = json_object_new_object();
    if (!succ || !op) {
        json_object_put(succ);
        json_object_put(op);
        goto out;
    }
    json_object_object_add(op, "request_put", put_req(k64, v64, d->lease));
    json_object_array_add(succ, op);
    json_object_object_add(txn, "success", succ);
    if ((rc = post(d, "/v3/kv/txn", txn, REQUEST_TIMEOUT_MS, &r)) < 0)
        goto out;
    json_object *ok = NULL;
    bool created = json_object_object_get_ex(r, "succeeded", &ok) && json_object_get_boolean(ok);
    json_object_put(r);
    r = NULL;
    if (!created) {
        json_object *put = put_req(k64, v64, d->lease);
        rc = put ? post(d, "/v3/kv/put", put, REQUEST_TIMEOUT_MS, &r) : -ENOMEM;
        json_object_put(put);
        if (rc < 0)
            goto out;
    }
    rc = 0;
out:
    json_object_put(txn);
    json_object_put(r);
    free(k64);
    free(v64);
    return rc;
}

/* One pair's records: with recovery, its endpoint's instance first (the
 * endpoint serves before a router can find it), then its EventSource. */
static int put_record(struct kvb_discovery *d, const struct pair *p)
{
    char key[KEY_MAX];
    char *val = NULL;
    int rc = 0;
    if (d->recovery) {
        rc = kvb_discovery_instance_key(&d->rt, p->publisher_id, key, sizeof(key));
        if (rc >= 0)
            rc = (val = kvb_discovery_instance_value(&d->rt, p->publisher_id, p->worker_id,
                                                     p->dp_rank))
                     ? put_kv(d, key, val)
                     : -ENOMEM;
        free(val);
        val = NULL;
        if (rc < 0)
            return rc;
    }
    rc = kvb_discovery_key(d->ns, d->comp, d->ep, p->publisher_id, key, sizeof(key));
    if (rc >= 0)
        rc = (val = kvb_discovery_value_rt(d->ns, d->comp, d->ep, p->publisher_id, p->worker_id,
                                           p->dp_rank, d->recovery ? &d->rt : NULL))
                 ? put_kv(d, key, val)
                 : -ENOMEM;
    free(val);
    if (rc == 0)
        kvb_info("discovery",
                 "registered worker_id %" PRIu64 " dp_rank %u as publisher %" PRIx64 " (%s)%s",
                 p->worker_id, p->dp_rank, p->publisher_id, key,
                 d->recovery ? ", with its recovery target" : "");
    return rc;
}

/* ---- the thread --------------------------------------------------------- */

static void wake(struct kvb_discovery *d)
{
    uint64_t one = 1;
    if (d->wake_fd >= 0 && write(d->wake_fd, &one, sizeof(one)) < 0) {
        /* a full eventfd: the loop wakes anyway */
    }
}

static void unregister_all(struct kvb_discovery *d)
{
    pthread_mutex_lock(&d->mu);
    for (size_t i = 0; i < d->n_pairs; i++)
        d->pairs[i].registered = false;
    d->n_registered = 0;
    pthread_mutex_unlock(&d->mu);
    kvb_set(&d->m->discovery_registered_pairs[0], 0);
    wake(d);
}

/* Register the pairs that are not; 0 when all are. */
static int register_pending(struct kvb_discovery *d)
{
    for (;;) {
        struct pair p;
        bool found = false;
        pthread_mutex_lock(&d->mu);
        for (size_t i = 0; i < d->n_pairs && !found; i++)
            if (!d->pairs[i].registered) {
                p = d->pairs[i];
                found = true;
            }
        bool stop = d->stop;
        pthread_mutex_unlock(&d->mu);
        if (!found || stop)
            return 0;
        int rc = put_record(d, &p);
        if (rc < 0)
            return rc;
        pthread_mutex_lock(&d->mu);
        for (size_t i = 0; i < d->n_pairs; i++)
            if (d->pairs[i].worker_id == p.worker_id && d->pairs[i].dp_rank == p.dp_rank &&
                !d->pairs[i].registered) {
                d->pairs[i].registered = true;
                d->n_registered++;
            }
        size_t n = d->n_registered;
        pthread_mutex_unlock(&d->mu);
        kvb_inc(&d->m->discovery_registrations_total[0]);
        kvb_set(&d->m->discovery_registered_pairs[0], n);
        wake(d);
    }
}

static void *run(void *arg)
{
    struct kvb_discovery *d = arg;
    uint64_t backoff = BACKOFF_MIN_MS, last_ok = 0, next_keepalive = 0;
    uint64_t period = d->ttl_s * 1000u / 3;
    for (;;) {
        uint64_t now = kvb_mono_ms(), wait_ms;
        int rc = 0;
        if (d->lease && now >= next_keepalive) {
            rc = keepalive(d);
            if (rc == 0) {
                last_ok = now;
                next_keepalive = now + period;
            } else if (rc == -ENOENT || now - last_ok >= d->ttl_s * 1000u) {
                kvb_warn("discovery", "etcd lease %" PRIx64 " %s: registering again",
                         (uint64_t)d->lease, rc == -ENOENT ? "expired" : "not kept alive");
                d->lease = 0;
                unregister_all(d);
            }
        }
        if (rc == 0 && !d->lease && (rc = grant(d)) == 0) {
            last_ok = now;
            next_keepalive = now + period;
        }
        if (rc == 0 && d->lease)
            rc = register_pending(d);
        if (rc < 0) {
            wait_ms = backoff;
            backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
        } else {
            backoff = BACKOFF_MIN_MS;
            now = kvb_mono_ms();
            wait_ms = next_keepalive > now ? next_keepalive - now : 0;
        }
        pthread_mutex_lock(&d->mu);
        if (!d->stop && wait_ms > 0 && d->n_registered == d->n_pairs) {
            struct timespec ts = kvb_mono_deadline(wait_ms);
            pthread_cond_timedwait(&d->cv, &d->mu, &ts);
        } else if (!d->stop && wait_ms > 0 && rc < 0) {
            struct timespec ts = kvb_mono_deadline(wait_ms);
            pthread_cond_timedwait(&d->cv, &d->mu, &ts);
        }
        bool stop = d->stop;
        pthread_mutex_unlock(&d->mu);
        if (stop)
            break;
    }
    if (d->lease)
        lease_revoke(d);
    return NULL;
}

/* ---- the owner's API ---------------------------------------------------- */

int kvb_discovery_add(struct kvb_discovery *d, uint64_t worker_id, uint32_t dp_rank,
                      uint64_t publisher_id)
{
    int rc = 0;
    pthread_mutex_lock(&d->mu);
    for (size_t i = 0; i < d->n_pairs; i++)
        if (d->pairs[i].worker_id == worker_id && d->pairs[i].dp_rank == dp_rank)
            goto out;
    if (d->n_pairs >= KVB_DISCOVERY_MAX_PAIRS) {
        rc = -ENOSPC;
        goto out;
    }
    if (d->n_pairs == d->cap_pairs) {
        size_t cap = d->cap_pairs ? d->cap_pairs * 2 : 8;
        struct pair *n = realloc(d->pairs, cap * sizeof(*n));
        if (!n) {
            rc = -ENOMEM;
            goto out;
        }
        d->pairs = n;
        d->cap_pairs = cap;
    }
    d->pairs[d->n_pairs++] = (struct pair){worker_id, dp_rank, publisher_id, false};
    pthread_cond_signal(&d->cv);
out:
    pthread_mutex_unlock(&d->mu);
    return rc;
}

bool kvb_discovery_registered(struct kvb_discovery *d, uint64_t worker_id, uint32_t dp_rank)
{
    bool r = false;
    pthread_mutex_lock(&d->mu);
    for (size_t i = 0; i < d->n_pairs; i++)
        if (d->pairs[i].worker_id == worker_id && d->pairs[i].dp_rank == dp_rank) {
            r = d->pairs[i].registered;
            break;
        }
    pthread_mutex_unlock(&d->mu);
    return r;
}

bool kvb_discovery_all_registered(struct kvb_discovery *d)
{
    pthread_mutex_lock(&d->mu);
    bool r = d->n_pairs > 0 && d->n_registered == d->n_pairs;
    pthread_mutex_unlock(&d->mu);
    return r;
}

static char *xstrdup(const char *s) { return strdup(s ? s : ""); }

void kvb_discovery_destroy(struct kvb_discovery **pd)
{
    if (!pd || !*pd)
        return;
    struct kvb_discovery *d = *pd;
    if (d->started) {
        pthread_mutex_lock(&d->mu);
        d->stop = true;
        pthread_cond_signal(&d->cv);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->thread, NULL);
    }
    if (d->curl)
        curl_easy_cleanup(d->curl);
    for (size_t i = 0; i < d->n_urls; i++)
        free(d->urls[i]);
    free(d->urls);
    free(d->ns);
    free(d->comp);
    free(d->ep);
    free(d->pairs);
    pthread_cond_destroy(&d->cv);
    pthread_mutex_destroy(&d->mu);
    free(d);
    *pd = NULL;
}

int kvb_discovery_create(const struct kvb_config *cfg, struct kvb_metrics *m, int wake_fd,
                         const struct kvb_recovery_target *rt, struct kvb_discovery **out)
{
    if (!cfg->discovery.etcd.n_endpoints)
        return -EINVAL;
    struct kvb_discovery *d = calloc(1, sizeof(*d));
    if (!d)
        return -ENOMEM;
    pthread_mutex_init(&d->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&d->cv, &ca);
    pthread_condattr_destroy(&ca);
    d->m = m;
    d->wake_fd = wake_fd;
    d->ttl_s = cfg->discovery.etcd.lease_ttl_s;
    d->rl_err = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(10000, 3);
    if (rt) {
        d->recovery = true;
        d->rt = *rt;
    }
    int rc = -ENOMEM;
    d->urls = calloc(cfg->discovery.etcd.n_endpoints, sizeof(*d->urls));
    if (!d->urls)
        goto fail;
    for (; d->n_urls < cfg->discovery.etcd.n_endpoints; d->n_urls++)
        if (!(d->urls[d->n_urls] = xstrdup(cfg->discovery.etcd.endpoints[d->n_urls])))
            goto fail;
    if (!(d->ns = xstrdup(cfg->nats.namespace_)) || !(d->comp = xstrdup(cfg->nats.component)) ||
        !(d->ep = xstrdup(cfg->nats.endpoint)) || !(d->curl = curl_easy_init()))
        goto fail;
    if ((rc = -pthread_create(&d->thread, NULL, run, d)) < 0)
        goto fail;
    d->started = true;
    *out = d;
    return 0;
fail:
    kvb_discovery_destroy(&d);
    return rc;
}
