/* query: requests, the hand-off to the loop, answers.  See include/query.h. */
#include "query.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <json-c/json.h>

#include "clock.h"
#include "config.h"
#include "convert.h"
#include "encode.h"
#include "index.h"

/* ---- requests ------------------------------------------------------------ */

static const char *const op_names[] = {"dump", "events", "match"};

int kvb_query_op_of(const char *name)
{
    for (int i = 0; i < 3; i++)
        if (name && strcmp(name, op_names[i]) == 0)
            return i;
    return -1;
}

static int fail(char *err, size_t cap, const char *fmt, const char *what)
{
    if (err && cap)
        snprintf(err, cap, fmt, what);
    return -EINVAL;
}

/* Digits only, no sign, fits max. */
static bool parse_digits(const char *s, uint64_t max, uint64_t *out)
{
    if (!s || !*s || strlen(s) > 20)
        return false;
    uint64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return false;
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    if (v > max)
        return false;
    *out = v;
    return true;
}

/* An unsigned integer field: a JSON integer >= 0, or a string of digits. */
static bool json_u64(struct json_object *o, uint64_t max, uint64_t *out)
{
    switch (json_object_get_type(o)) {
    case json_type_int:
        if (json_object_get_int64(o) < 0)
            return false;
        errno = 0;
        *out = json_object_get_uint64(o);
        return errno == 0 && *out <= max;
    case json_type_string: return parse_digits(json_object_get_string(o), max, out);
    default: return false;
    }
}

int kvb_query_parse_param(const char *name, const char *value, struct kvb_query_req *r, char *err,
                          size_t cap)
{
    uint64_t v;
    if (strcmp(name, "worker_id") == 0) {
        if (!parse_digits(value, UINT64_MAX, &v))
            return fail(err, cap, "%s: an unsigned 64-bit integer", name);
        r->worker_id = v;
        r->has_worker = true;
    } else if (strcmp(name, "dp_rank") == 0) {
        if (!parse_digits(value, UINT32_MAX, &v))
            return fail(err, cap, "%s: an unsigned 32-bit integer", name);
        r->dp_rank = (uint32_t)v;
    } else if (strcmp(name, "since") == 0) {
        if (!parse_digits(value, UINT64_MAX, &v))
            return fail(err, cap, "%s: an unsigned 64-bit integer", name);
        r->since = v;
        r->has_since = true;
    }
    return 0;
}

static int parse_tokens(struct json_object *a, struct kvb_query_req *r, char *err, size_t cap)
{
    if (!json_object_is_type(a, json_type_array))
        return fail(err, cap, "%s: an array of token ids", "token_ids");
    size_t n = json_object_array_length(a);
    if (n > KVB_QUERY_MAX_TOKENS)
        return fail(err, cap, "%s: too many (at most 1048576)", "token_ids");
    r->tokens = malloc((n ? n : 1) * sizeof(*r->tokens));
    if (!r->tokens)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        uint64_t v;
        struct json_object *e = json_object_array_get_idx(a, i);
        if (!json_object_is_type(e, json_type_int) || !json_u64(e, UINT32_MAX, &v))
            return fail(err, cap, "%s: every id an unsigned 32-bit integer", "token_ids");
        r->tokens[i] = (uint32_t)v;
    }
    r->n_tokens = n;
    return 0;
}

int kvb_query_parse_json(const char *body, size_t len, int default_op, struct kvb_query_req *r,
                         char *err, size_t cap)
{
    memset(r, 0, sizeof(*r));
    r->op = default_op;
    if (len > KVB_QUERY_MAX_REQUEST || len > INT32_MAX)
        return fail(err, cap, "%s", "request too large");
    struct json_tokener *tok = json_tokener_new();
    if (!tok)
        return -ENOMEM;
    struct json_object *o = json_tokener_parse_ex(tok, body, (int)len);
    enum json_tokener_error je = json_tokener_get_error(tok);
    size_t used = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    int rc = 0;
    if (!o || je != json_tokener_success) {
        rc = fail(err, cap, "not JSON: %s", json_tokener_error_desc(je));
        goto out;
    }
    for (; used < len; used++) /* only white space after the object */
        if (body[used] != ' ' && body[used] != '\n' && body[used] != '\r' && body[used] != '\t') {
            rc = fail(err, cap, "%s", "not JSON: text after the object");
            goto out;
        }
    if (!json_object_is_type(o, json_type_object)) {
        rc = fail(err, cap, "%s", "the request is a JSON object");
        goto out;
    }
    json_object_object_foreach(o, key, v)
    {
        uint64_t u;
        if (strcmp(key, "op") == 0) {
            int op = json_object_is_type(v, json_type_string)
                         ? kvb_query_op_of(json_object_get_string(v))
                         : -1;
            if (op < 0 || (default_op >= 0 && op != default_op)) {
                rc = fail(err, cap, "%s: \"dump\", \"events\" or \"match\"", "op");
                goto out;
            }
            r->op = op;
        } else if (strcmp(key, "worker_id") == 0) {
            if (!json_u64(v, UINT64_MAX, &r->worker_id)) {
                rc = fail(err, cap, "%s: an unsigned 64-bit integer", key);
                goto out;
            }
            r->has_worker = true;
        } else if (strcmp(key, "dp_rank") == 0) {
            if (!json_u64(v, UINT32_MAX, &u)) {
                rc = fail(err, cap, "%s: an unsigned 32-bit integer", key);
                goto out;
            }
            r->dp_rank = (uint32_t)u;
        } else if (strcmp(key, "since") == 0) {
            if (!json_u64(v, UINT64_MAX, &r->since)) {
                rc = fail(err, cap, "%s: an unsigned 64-bit integer", key);
                goto out;
            }
            r->has_since = true;
        } else if (strcmp(key, "token_ids") == 0) {
            if ((rc = parse_tokens(v, r, err, cap)) < 0)
                goto out;
        } else if (strcmp(key, "lora_name") == 0) {
            if (json_object_is_type(v, json_type_null))
                continue;
            if (!json_object_is_type(v, json_type_string)) {
                rc = fail(err, cap, "%s: a string or null", key);
                goto out;
            }
            if (!(r->lora_name = strdup(json_object_get_string(v)))) {
                rc = -ENOMEM;
                goto out;
            }
        } else if (strcmp(key, "block_size") == 0) {
            if (!json_u64(v, 1048576, &u) || u == 0) {
                rc = fail(err, cap, "%s: an integer from 1 to 1048576", key);
                goto out;
            }
            r->block_size = (uint32_t)u;
        } /* other keys: ignored (room for later fields) */
    }
    if (r->op < 0)
        rc = fail(err, cap, "%s: \"dump\", \"events\" or \"match\" is required", "op");
out:
    json_object_put(o);
    if (rc < 0)
        kvb_query_req_free(r);
    return rc;
}

int kvb_query_check(const struct kvb_query_req *r, char *err, size_t cap)
{
    if (r->op == KVB_QOP_EVENTS && !r->has_since)
        return fail(err, cap, "%s is required", "since");
    if (r->op == KVB_QOP_MATCH && !r->tokens)
        return fail(err, cap, "%s is required", "token_ids");
    if (r->op < 0 || r->op > KVB_QOP_RECOVER)
        return fail(err, cap, "%s: unknown operation", "op");
    return 0;
}

void kvb_query_req_free(struct kvb_query_req *r)
{
    if (!r)
        return;
    free(r->tokens);
    free(r->lora_name);
    r->tokens = NULL;
    r->lora_name = NULL;
    r->n_tokens = 0;
}

/* ---- answers --------------------------------------------------------------- */

struct kvb_query_answer {
    struct kvb_metrics *m;
    int op; /* enum kvb_qop_label (INVALID for refusals) */
    int status;
    uint64_t start_ns;
    uint64_t sent;
    bool has_last; /* a last line {"last_event_id":N} ends the answer */
    uint64_t last;
    bool last_done;
    char *text; /* a one-line answer (match, error) */
    bool text_done;
    /* dump */
    struct kvb_index_snap *snap;
    /* events: copies of the ring's events; their blocks/hashes in words */
    struct kvb_rev *revs;
    size_t *offs;
    size_t n_revs, cap_revs, next_rev;
    uint64_t *words;
    size_t n_words, cap_words;
    struct kvb_encoder *enc;
    char line[64];
    int recovery;   /* recover: enum kvb_query_recovery */
    uint64_t rv[3]; /* ... and its numbers */
};

static struct kvb_query_answer *answer_new(struct kvb_metrics *m, int op, uint64_t start)
{
    struct kvb_query_answer *a = calloc(1, sizeof(*a));
    if (!a)
        return NULL;
    a->m = m;
    a->op = op;
    a->status = 200;
    a->start_ns = start;
    return a;
}

static int answer_text(struct kvb_query_answer *a, int status, const char *text)
{
    free(a->text);
    a->text = strdup(text);
    a->status = status;
    return a->text ? 0 : -ENOMEM;
}

/* KEY: VAL into the JSON object O; false (VAL freed) when out of memory. */
static bool json_put(struct json_object *o, const char *key, struct json_object *val)
{
    if (!o || !val || json_object_object_add(o, key, val) != 0) {
        json_object_put(val);
        return false;
    }
    return true;
}

/* O (consumed) as one line of JSON, the way the README's "Query API" shows
 * answers: no white space, '/' as it is.  NULL when out of memory. */
static const char *json_line(struct json_object *o)
{
    return o ? json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
                                                     JSON_C_TO_STRING_NOSLASHESCAPE)
             : NULL;
}

/* The one-line answer O (consumed; NULL: out of memory). */
static int answer_json(struct kvb_query_answer *a, int status, struct json_object *o)
{
    const char *s = json_line(o);
    int rc = s ? answer_text(a, status, s) : -ENOMEM;
    json_object_put(o);
    return rc;
}

/* {"error":MSG,"status":STATUS} */
static int answer_error(struct kvb_query_answer *a, int status, const char *msg)
{
    a->has_last = false;
    kvb_index_snap_free(&a->snap);
    a->n_revs = 0;
    struct json_object *o = json_object_new_object();
    if (!json_put(o, "error", json_object_new_string(msg)) ||
        !json_put(o, "status", json_object_new_int(status))) {
        json_object_put(o);
        o = NULL;
    }
    return answer_json(a, status, o);
}

int kvb_query_answer_status(const struct kvb_query_answer *a) { return a->status; }

void kvb_query_answer_sent(struct kvb_query_answer *a, uint64_t bytes) { a->sent += bytes; }

static int need_encoder(struct kvb_query_answer *a)
{
    return a->enc ? 0 : kvb_encoder_create(KVB_FORMAT_DYNAMO_JSON, &a->enc);
}

int kvb_query_answer_line(struct kvb_query_answer *a, const char **data, size_t *len)
{
    if (a->text) {
        if (a->text_done)
            return 0;
        a->text_done = true;
        *data = a->text;
        *len = strlen(a->text);
        return 1;
    }
    struct kvb_rev rev;
    int rc;
    if (a->snap) {
        rc = kvb_index_snap_next(a->snap, KVB_QUERY_DUMP_LINE_BLOCKS, &rev);
        if (rc < 0)
            return rc;
        if (rc == 1) {
            if ((rc = need_encoder(a)) < 0)
                return rc;
            return kvb_encode(a->enc, &rev, data, len) < 0 ? -ENOMEM : 1;
        }
        kvb_index_snap_free(&a->snap); /* its memory goes before the last line */
    }
    if (a->next_rev < a->n_revs) {
        if ((rc = need_encoder(a)) < 0)
            return rc;
        return kvb_encode(a->enc, &a->revs[a->next_rev++], data, len) < 0 ? -ENOMEM : 1;
    }
    if (a->has_last && !a->last_done) {
        a->last_done = true;
        struct json_object *o = json_object_new_object();
        const char *s =
            json_put(o, "last_event_id", json_object_new_uint64(a->last)) ? json_line(o) : NULL;
        *len = s ? strlen(s) : 0;
        if (s && *len < sizeof(a->line))
            memcpy(a->line, s, *len + 1);
        json_object_put(o);
        if (!s || *len >= sizeof(a->line))
            return -ENOMEM;
        *data = a->line;
        return 1;
    }
    return 0;
}

int kvb_query_answer_recovery(const struct kvb_query_answer *a, uint64_t v[3])
{
    if (a->op != KVB_QOP_RECOVER || a->status != 200)
        return -EINVAL;
    memcpy(v, a->rv, sizeof(a->rv));
    return a->recovery;
}

int kvb_query_answer_event(struct kvb_query_answer *a, uint32_t max_blocks, struct kvb_rev *out)
{
    if (a->snap) {
        int rc = kvb_index_snap_next(a->snap, max_blocks, out);
        if (rc != 0)
            return rc;
        kvb_index_snap_free(&a->snap);
    }
    if (a->next_rev < a->n_revs) {
        *out = a->revs[a->next_rev++];
        return 1;
    }
    return 0;
}

void kvb_query_answer_free(struct kvb_query_answer **pa)
{
    struct kvb_query_answer *a = pa ? *pa : NULL;
    if (!a)
        return;
    if (a->m) {
        kvb_add_shared(&a->m->queries_total[a->op], 1);
        kvb_add_shared(&a->m->query_bytes_total[a->op], a->sent);
        uint64_t now = kvb_mono_ns();
        kvb_metrics_observe_shared_query_duration_seconds(
            a->m, now > a->start_ns ? now - a->start_ns : 0);
    }
    kvb_index_snap_free(&a->snap);
    kvb_encoder_destroy(&a->enc);
    free(a->revs);
    free(a->offs);
    free(a->words);
    free(a->text);
    free(a);
    *pa = NULL;
}

/* ---- the hub ------------------------------------------------------------- */

struct job {
    int op;
    uint64_t worker;
    uint32_t rank;
    uint64_t since;
    bool has_start, has_end; /* recover */
    uint64_t start, end;
    uint64_t *th; /* match: tokens_hash per full block */
    size_t n_th;
    struct kvb_query_answer *a;
    bool taken, done;
    struct job *next;
};

struct kvb_query {
    pthread_mutex_t mu;
    pthread_cond_t cond;      /* a job is done (CLOCK_MONOTONIC) */
    struct kvb_query_cfg cfg; /* mu */
    struct kvb_metrics *m;
    int wake_fd;
    bool closed;              /* mu */
    struct job *head, **tail; /* mu: queued, not yet taken by the loop */
};

int kvb_query_create(const struct kvb_query_cfg *cfg, struct kvb_metrics *m, int wake_fd,
                     struct kvb_query **out)
{
    struct kvb_query *q = calloc(1, sizeof(*q));
    if (!q)
        return -ENOMEM;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&q->cond, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0) {
        free(q);
        return -rc;
    }
    pthread_mutex_init(&q->mu, NULL);
    q->cfg = *cfg;
    if (!q->cfg.wait_ms)
        q->cfg.wait_ms = 5000;
    q->m = m;
    q->wake_fd = wake_fd;
    q->tail = &q->head;
    *out = q;
    return 0;
}

void kvb_query_set_config(struct kvb_query *q, const struct kvb_query_cfg *cfg)
{
    pthread_mutex_lock(&q->mu);
    uint32_t wait = q->cfg.wait_ms;
    q->cfg = *cfg;
    if (!q->cfg.wait_ms)
        q->cfg.wait_ms = wait;
    pthread_mutex_unlock(&q->mu);
}

/* Events from the ring, copied: their blocks or hashes go to a->words (at
 * a->offs[i] for event i), pointers are set once words stops moving. */
static int copy_event(void *ctx, const struct kvb_rev *rev)
{
    struct kvb_query_answer *a = ctx;
    size_t w = rev->type == KVB_REVT_STORED    ? 2 * (size_t)rev->n
               : rev->type == KVB_REVT_REMOVED ? rev->n
                                               : 0;
    if (a->n_revs == a->cap_revs) {
        size_t nc = a->cap_revs ? a->cap_revs * 2 : 64;
        struct kvb_rev *v = realloc(a->revs, nc * sizeof(*v));
        if (!v)
            return -ENOMEM;
        a->revs = v;
        size_t *o = realloc(a->offs, nc * sizeof(*o));
        if (!o)
            return -ENOMEM;
        a->offs = o;
        a->cap_revs = nc;
    }
    if (a->n_words + w > a->cap_words) {
        size_t nc = a->cap_words ? a->cap_words : 1024;
        while (nc < a->n_words + w)
            nc *= 2;
        uint64_t *v = realloc(a->words, nc * sizeof(*v));
        if (!v)
            return -ENOMEM;
        a->words = v;
        a->cap_words = nc;
    }
    if (rev->type == KVB_REVT_STORED)
        memcpy(a->words + a->n_words, rev->blocks, w * sizeof(uint64_t));
    else if (rev->type == KVB_REVT_REMOVED)
        memcpy(a->words + a->n_words, rev->hashes, w * sizeof(uint64_t));
    a->revs[a->n_revs] = *rev;
    a->offs[a->n_revs++] = a->n_words;
    a->n_words += w;
    return 0;
}

static void fix_events(struct kvb_query_answer *a)
{
    for (size_t i = 0; i < a->n_revs; i++) {
        struct kvb_rev *r = &a->revs[i];
        r->blocks =
            r->type == KVB_REVT_STORED ? (const struct kvb_block *)(a->words + a->offs[i]) : NULL;
        r->hashes = r->type == KVB_REVT_REMOVED ? a->words + a->offs[i] : NULL;
    }
}

/* {"matched_blocks":{"device":K0,"host_pinned":K1,...}}, every tier in
 * order; NULL when out of memory. */
static struct json_object *matched_blocks(const uint32_t k[KVB_TIER__COUNT])
{
    struct json_object *o = json_object_new_object(), *tiers = json_object_new_object();
    bool ok = tiers != NULL;
    for (int t = 0; ok && t < KVB_TIER__COUNT; t++)
        ok = json_put(tiers, kvb_tier_name(t), json_object_new_int64(k[t]));
    if (!ok)
        json_object_put(tiers);
    if (!ok || !json_put(o, "matched_blocks", tiers)) {
        json_object_put(o);
        return NULL;
    }
    return o;
}

/* recover: the answer a Dynamo worker's local indexer gives (query.h). */
static void serve_recover(struct job *j, struct kvb_index *m, bool known, uint64_t last)
{
    struct kvb_query_answer *a = j->a;
    uint64_t *v = a->rv;
    if (j->has_start && j->has_end && j->end < j->start) {
        a->recovery = KVB_QR_INVALID_RANGE;
        v[0] = j->start;
        v[1] = j->end;
        return;
    }
    if (j->has_start && known && j->start > last) {
        a->recovery = KVB_QR_TOO_NEW;
        v[0] = j->start;
        v[1] = j->has_end ? j->end : last;
        v[2] = last;
        return;
    }
    if (j->has_start && known) {
        int rc = kvb_index_events_from(m, j->worker, j->rank, j->start, copy_event, a);
        if (rc == 0) {
            fix_events(a);
            a->recovery = KVB_QR_EVENTS;
            v[0] = last;
            return;
        }
        a->n_revs = 0;
        if (rc != -ESTALE) {
            answer_error(a, 500, "out of memory");
            return;
        }
    }
    a->recovery = KVB_QR_TREE_DUMP; /* no start, older than the ring, or nothing yet */
    v[0] = known ? last : 0;
    if (kvb_index_snapshot(m, j->worker, j->rank, &a->snap) < 0)
        answer_error(a, 500, "out of memory");
}

static void serve_one(struct job *j, struct kvb_index *m)
{
    struct kvb_query_answer *a = j->a;
    uint64_t last = 0;
    bool known = m && kvb_index_last_event_id(m, j->worker, j->rank, &last);
    if (!m) {
        answer_error(a, 503, "the residency mirror is off (limits.max_resident_blocks: 0)");
        return;
    }
    switch (j->op) {
    case KVB_QOP_RECOVER: serve_recover(j, m, known, last); return;
    case KVB_QOP_DUMP:
        if (!known) {
            answer_error(a, 404, "no router event for this worker_id and dp_rank yet");
            return;
        }
        if (kvb_index_snapshot(m, j->worker, j->rank, &a->snap) < 0) {
            answer_error(a, 500, "out of memory");
            return;
        }
        a->has_last = true;
        a->last = kvb_index_snap_event_id(a->snap);
        return;
    case KVB_QOP_EVENTS: {
        if (!known) {
            answer_error(a, 404, "no router event for this worker_id and dp_rank yet");
            return;
        }
        int rc = kvb_index_events_since(m, j->worker, j->rank, j->since, copy_event, a);
        if (rc == -ESTALE) {
            answer_error(a, 410, "since is older than the recent events kept: ask for a dump");
            return;
        }
        if (rc < 0) {
            answer_error(a, 500, "out of memory");
            return;
        }
        fix_events(a);
        a->has_last = true;
        a->last = last;
        return;
    }
    default: {
        uint32_t k[KVB_TIER__COUNT];
        kvb_index_match(m, j->worker, j->rank, j->th, j->n_th, k);
        if (answer_json(a, 200, matched_blocks(k)) < 0)
            answer_error(a, 500, "out of memory");
        return;
    }
    }
}

void kvb_query_serve(struct kvb_query *q, struct kvb_index *m)
{
    pthread_mutex_lock(&q->mu);
    struct job *list = q->head;
    q->head = NULL;
    q->tail = &q->head;
    for (struct job *j = list; j; j = j->next)
        j->taken = true;
    pthread_mutex_unlock(&q->mu);
    if (!list)
        return;
    for (struct job *j = list; j; j = j->next)
        serve_one(j, m);
    pthread_mutex_lock(&q->mu);
    for (struct job *j = list, *next; j; j = next) {
        next = j->next; /* j belongs to its waiter again once done */
        j->done = true;
    }
    pthread_cond_broadcast(&q->cond);
    pthread_mutex_unlock(&q->mu);
}

void kvb_query_close(struct kvb_query *q)
{
    if (!q)
        return;
    pthread_mutex_lock(&q->mu);
    q->closed = true;
    struct job *list = q->head;
    q->head = NULL;
    q->tail = &q->head;
    for (struct job *j = list; j; j = j->next) {
        answer_error(j->a, 503, "kvbridge is stopping");
        j->done = true;
    }
    pthread_cond_broadcast(&q->cond);
    pthread_mutex_unlock(&q->mu);
}

void kvb_query_destroy(struct kvb_query **pq)
{
    struct kvb_query *q = pq ? *pq : NULL;
    if (!q)
        return;
    pthread_cond_destroy(&q->cond);
    pthread_mutex_destroy(&q->mu);
    free(q);
    *pq = NULL;
}

int kvb_query_error(struct kvb_query *q, int status, const char *msg, struct kvb_query_answer **out)
{
    struct kvb_query_answer *a = answer_new(q ? q->m : NULL, KVB_QOP_INVALID, kvb_mono_ns());
    if (!a)
        return -ENOMEM;
    if (answer_error(a, status, msg) < 0) {
        kvb_query_answer_free(&a);
        return -ENOMEM;
    }
    *out = a;
    return 0;
}

/* tokens_hash of every full block, as the converter computes them. */
static int hash_tokens(const struct kvb_query_req *r, const struct kvb_query_cfg *cfg,
                       struct job *j, char *err, size_t cap)
{
    uint32_t cbs = cfg->block_size;
    bool salt = cfg->lora_salt;
    for (size_t i = 0; i < cfg->n_workers; i++) /* the pair's worker's own settings */
        if (cfg->workers[i].worker_id == j->worker) {
            cbs = cfg->workers[i].block_size;
            salt = cfg->workers[i].lora_salt;
            break;
        }
    uint32_t bs = r->block_size ? r->block_size : cbs;
    if (!bs)
        return fail(err, cap, "%s",
                    "block_size is auto in the configuration: give "
                    "\"block_size\" in the request");
    uint64_t seed = KVB_TOKENS_HASH_SEED;
    if (salt && r->lora_name && r->lora_name[0])
        seed = kvb_lora_seed(r->lora_name, strlen(r->lora_name));
    j->n_th = r->n_tokens / bs;
    j->th = malloc((j->n_th ? j->n_th : 1) * sizeof(*j->th));
    if (!j->th)
        return -ENOMEM;
    for (size_t i = 0; i < j->n_th; i++)
        j->th[i] = kvb_tokens_hash(r->tokens + i * bs, bs, seed);
    return 0;
}

int kvb_query_run(struct kvb_query *q, const struct kvb_query_req *r, struct kvb_query_answer **out)
{
    uint64_t start = kvb_mono_ns();
    char err[256];
    int rc = kvb_query_check(r, err, sizeof(err));
    if (rc < 0)
        return kvb_query_error(q, 400, err, out);
    struct job *j = calloc(1, sizeof(*j));
    struct kvb_query_answer *a = answer_new(q->m, r->op, start);
    if (!j || !a) {
        free(j);
        kvb_query_answer_free(&a);
        return -ENOMEM;
    }
    pthread_mutex_lock(&q->mu);
    struct kvb_query_cfg cfg = q->cfg;
    pthread_mutex_unlock(&q->mu);
    j->op = r->op;
    j->worker = r->has_worker ? r->worker_id : cfg.worker_id;
    j->rank = r->dp_rank;
    j->since = r->since;
    j->has_start = r->has_start;
    j->start = r->start;
    j->has_end = r->has_end;
    j->end = r->end;
    j->a = a;
    if (r->op == KVB_QOP_MATCH && (rc = hash_tokens(r, &cfg, j, err, sizeof(err))) < 0) {
        free(j->th);
        free(j);
        kvb_query_answer_free(&a); /* not counted: the error answer is */
        return rc == -ENOMEM ? -ENOMEM : kvb_query_error(q, 400, err, out);
    }

    struct timespec until = kvb_mono_deadline(cfg.wait_ms);
    pthread_mutex_lock(&q->mu);
    if (q->closed) {
        answer_error(a, 503, "kvbridge is stopping");
        j->done = true;
    } else {
        *q->tail = j;
        q->tail = &j->next;
        uint64_t one = 1;
        if (q->wake_fd >= 0 && write(q->wake_fd, &one, sizeof(one)) < 0) {
            /* a full eventfd counter: the loop is awake anyway */
        }
    }
    while (!j->done) {
        if (j->taken) { /* the loop is on it (bounded work): wait for it */
            pthread_cond_wait(&q->cond, &q->mu);
            continue;
        }
        int w = pthread_cond_timedwait(&q->cond, &q->mu, &until);
        // cppcheck-suppress knownConditionTrueFalse ; the loop sets done while we wait
        if (w == ETIMEDOUT && !j->done && !j->taken) {
            /* the loop did not get to it: withdraw it */
            struct job **pp = &q->head;
            while (*pp && *pp != j)
                pp = &(*pp)->next;
            if (*pp) {
                *pp = j->next;
                if (!*pp)
                    q->tail = pp;
            }
            answer_error(a, 503, "the loop did not answer in time");
            j->done = true;
        }
    }
    pthread_mutex_unlock(&q->mu);
    free(j->th);
    free(j);
    *out = a;
    return 0;
}
