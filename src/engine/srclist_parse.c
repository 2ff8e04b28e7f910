/* srclist_parse: the body of GET /kv_event_sources into a sorted list of
 * sources, through json-c (include/srclist.h for the shapes and rules).
 * Pure: no I/O. */
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srclist.h"

#define MAX_DEPTH 8 /* JSON nesting: rank -> config -> values */

/* Fail with WHY (static). */
static int bad(const char **why, const char *what)
{
    *why = what;
    return -EINVAL;
}

static bool wildcard(const char *h, size_t n)
{
    static const char *const any[] = {"*", "0.0.0.0", "::", "[::]"};
    for (size_t i = 0; i < sizeof(any) / sizeof(any[0]); i++)
        if (strlen(any[i]) == n && memcmp(h, any[i], n) == 0)
            return true;
    return false;
}

/* Endpoint TEXT (LEN bytes) into OUT: tcp://HOST:PORT with a port
 * 1..65535 (a wildcard host becomes HOST), or ipc://PATH. */
static int endpoint(const char *text, size_t len, const char *host, char *out, const char **why)
{
    if (len != strlen(text))
        return bad(why, "an endpoint holds a NUL character");
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)text[i] <= ' ' || text[i] == 0x7f)
            return bad(why, "an endpoint holds white space or a control character");
    if (strncmp(text, "ipc://", 6) == 0 && len > 6) {
        if (len >= KVB_SRCLIST_ENDPOINT_MAX)
            return bad(why, "an endpoint is too long");
        memcpy(out, text, len + 1);
        return 0;
    }
    if (strncmp(text, "tcp://", 6) != 0)
        return bad(why, "an endpoint is neither tcp:// nor ipc://");
    const char *h = text + 6, *colon = strrchr(h, ':');
    if (!colon || colon == h)
        return bad(why, "a tcp:// endpoint has no HOST:PORT");
    char *end;
    errno = 0;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (errno || *end || end == colon + 1 || colon[1] == '+' || colon[1] == '-' || port < 1 ||
        port > 65535)
        return bad(why, "a tcp:// endpoint's port is not a number in 1..65535");
    size_t hl = (size_t)(colon - h);
    if (wildcard(h, hl)) {
        h = host;
        hl = strlen(host);
    }
    int n = snprintf(out, KVB_SRCLIST_ENDPOINT_MAX, "tcp://%.*s:%lu", (int)hl, h, port);
    if (n < 0 || n >= KVB_SRCLIST_ENDPOINT_MAX)
        return bad(why, "an endpoint is too long");
    return 0;
}

/* Member KEY of O as a string into OUT (CAP bytes, NUL included); absent or
 * null: "" when NULL_OK, else an error. */
static int string_of(const json_object *o, const char *key, bool null_ok, char *out, size_t cap,
                     const char **why, const char *what)
{
    json_object *v = NULL;
    out[0] = '\0';
    if (!json_object_object_get_ex(o, key, &v) || !v)
        return null_ok ? 0 : bad(why, what);
    if (!json_object_is_type(v, json_type_string))
        return bad(why, what);
    size_t len = (size_t)json_object_get_string_len(v);
    const char *s = json_object_get_string(v);
    if (len >= cap || strlen(s) != len)
        return bad(why, what);
    memcpy(out, s, len + 1);
    return 0;
}

/* A source that publishes nothing (vLLM's publisher "null", or KV events
 * turned off). */
static bool disabled(const json_object *o)
{
    json_object *v;
    if (json_object_object_get_ex(o, "publisher", &v) && json_object_is_type(v, json_type_string) &&
        strcmp(json_object_get_string(v), "null") == 0)
        return true;
    return json_object_object_get_ex(o, "enable_kv_cache_events", &v) &&
           json_object_is_type(v, json_type_boolean) && !json_object_get_boolean(v);
}

/* Source O of rank RANK into *E (RANK < 0: its data_parallel_rank).
 * 1 when it is disabled (left out), 0, or -EINVAL. */
static int source(const json_object *o, int64_t rank, const char *host, struct kvb_srclist_entry *e,
                  const char **why)
{
    if (!json_object_is_type(o, json_type_object))
        return bad(why, "a source is not a JSON object");
    if (disabled(o))
        return 1;
    if (rank < 0) {
        json_object *r;
        if (!json_object_object_get_ex(o, "data_parallel_rank", &r) ||
            !json_object_is_type(r, json_type_int))
            return bad(why, "a source has no integer data_parallel_rank");
        errno = 0;
        rank = json_object_get_int64(r);
        if (errno || rank < 0 || rank > UINT32_MAX)
            return bad(why, "a data_parallel_rank is not in 0..4294967295");
    }
    e->rank = (uint32_t)rank;
    char text[KVB_SRCLIST_ENDPOINT_MAX];
    int rc = string_of(o, "endpoint", false, text, sizeof(text), why,
                       "a source has no endpoint string (or one too long)");
    if (rc == 0)
        rc = endpoint(text, strlen(text), host, e->endpoint, why);
    if (rc == 0)
        rc = string_of(o, "replay_endpoint", true, text, sizeof(text), why,
                       "a replay_endpoint is neither a string nor null (or is too long)");
    if (rc == 0 && text[0])
        rc = endpoint(text, strlen(text), host, e->replay_endpoint, why);
    if (rc == 0)
        rc = string_of(o, "topic", true, e->topic, sizeof(e->topic), why,
                       "a topic is not a string (or is too long, or holds a NUL)");
    return rc;
}

/* A key of the rank-keyed shape: a decimal rank. */
static int64_t rank_key(const char *k)
{
    char *end;
    if (!k[0] || k[0] < '0' || k[0] > '9' || (k[0] == '0' && k[1]))
        return -1;
    errno = 0;
    unsigned long long v = strtoull(k, &end, 10);
    return errno || *end || v > UINT32_MAX ? -1 : (int64_t)v;
}

static int by_rank(const void *a, const void *b)
{
    uint32_t x = ((const struct kvb_srclist_entry *)a)->rank;
    uint32_t y = ((const struct kvb_srclist_entry *)b)->rank;
    return (x > y) - (x < y);
}

/* The sources of ROOT (one of the three shapes) into L (room for CAP). */
static int sources(const json_object *root, const char *host, struct kvb_srclist_list *l,
                   size_t cap, const char **why)
{
    const json_object *arr = NULL;
    json_object *s;
    if (json_object_is_type(root, json_type_array))
        arr = root;
    else if (json_object_object_get_ex(root, "sources", &s))
        arr = s;
    if (arr && !json_object_is_type(arr, json_type_array))
        return bad(why, "\"sources\" is not an array");
    int rc = 0;
    if (arr) {
        for (size_t i = 0; rc >= 0 && i < json_object_array_length(arr); i++)
            if ((rc = source(json_object_array_get_idx(arr, i), -1, host, &l->e[l->n], why)) == 0)
                l->n++;
        return rc < 0 ? rc : 0;
    }
    json_object_object_foreach((json_object *)root, key, val)
    {
        int64_t rank = rank_key(key);
        if (rank < 0)
            return bad(why, "a key of the rank-keyed object is not a rank (0..4294967295)");
        if (l->n >= cap)
            return bad(why, "more sources than kvbridge takes");
        if ((rc = source(val, rank, host, &l->e[l->n], why)) < 0)
            return rc;
        l->n += rc == 0;
    }
    return 0;
}

int kvb_srclist_parse(const char *body, size_t len, const char *host, struct kvb_srclist_list **out,
                      const char **why)
{
    *out = NULL;
    *why = NULL;
    if (len > KVB_SRCLIST_MAX_BYTES)
        return bad(why, "the body is too large");
    struct json_tokener *tok = json_tokener_new_ex(MAX_DEPTH);
    if (!tok)
        return -ENOMEM;
    json_object *root = json_tokener_parse_ex(tok, body, (int)len);
    enum json_tokener_error je = json_tokener_get_error(tok);
    size_t used = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    int rc = 0;
    struct kvb_srclist_list *l = NULL;
    if (!root || je != json_tokener_success) {
        rc = bad(why, je == json_tokener_error_depth ? "the JSON nests too deep" : "not JSON");
        goto out;
    }
    for (; used < len; used++)
        if (!strchr(" \t\r\n", body[used])) {
            rc = bad(why, "text after the JSON value");
            goto out;
        }
    size_t cap = json_object_is_type(root, json_type_array) ? json_object_array_length(root)
                 : json_object_is_type(root, json_type_object)
                     ? (size_t)json_object_object_length(root)
                     : 0;
    json_object *s;
    if (json_object_is_type(root, json_type_object) &&
        json_object_object_get_ex(root, "sources", &s))
        cap = json_object_is_type(s, json_type_array) ? json_object_array_length(s) : 0;
    else if (!json_object_is_type(root, json_type_array) &&
             !json_object_is_type(root, json_type_object)) {
        rc = bad(why, "neither a JSON array nor an object");
        goto out;
    }
    if (cap > KVB_SRCLIST_MAX_RANKS) {
        rc = bad(why, "more sources than kvbridge takes");
        goto out;
    }
    l = calloc(1, sizeof(*l) + (cap ? cap : 1) * sizeof(l->e[0]));
    if (!l) {
        rc = -ENOMEM;
        goto out;
    }
    if ((rc = sources(root, host, l, cap, why)) < 0)
        goto out;
    qsort(l->e, l->n, sizeof(l->e[0]), by_rank);
    for (size_t i = 1; i < l->n; i++)
        if (l->e[i].rank == l->e[i - 1].rank) {
            rc = bad(why, "a rank is listed twice");
            goto out;
        }
    *out = l;
    l = NULL;
out:
    free(l);
    json_object_put(root);
    return rc;
}

const struct kvb_srclist_entry *kvb_srclist_find(const struct kvb_srclist_list *l, uint32_t rank)
{
    for (size_t i = 0; l && i < l->n; i++)
        if (l->e[i].rank == rank)
            return &l->e[i];
    return NULL;
}
