/* http_query: the query API on the metrics listener (query.h).
 *
 *   GET  /v1/dump?worker_id=W&dp_rank=R
 *   GET  /v1/events?worker_id=W&dp_rank=R&since=N
 *   POST /v1/match   {"worker_id":W,"dp_rank":R,"token_ids":[...],"lora_name":null}
 *
 * Runs on libmicrohttpd's thread.  kvb_query_run() waits for the loop's cheap
 * part; the answer is then streamed from a callback response, encoded one
 * line at a time as libmicrohttpd asks for more (a big dump never sits whole
 * in memory as text, and never on the loop).
 */
#include "query_http.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "query.h"

#define MATCH_PATH "/v1/match"

/* A request in progress (POST bodies come in several calls). */
struct hq_conn {
    char *body;
    size_t len, cap;
    bool too_large;
};

/* The answer being streamed: the current line and how much of it is out. */
struct hq_stream {
    struct kvb_query_answer *a;
    const char *line;
    size_t len, off;
    bool newline_due, end;
};

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct hq_stream *s = cls;
    size_t n = 0;
    while (n < max) {
        if (s->off < s->len) {
            size_t k = s->len - s->off < max - n ? s->len - s->off : max - n;
            memcpy(buf + n, s->line + s->off, k);
            s->off += k;
            n += k;
            continue;
        }
        if (s->newline_due) {
            buf[n++] = '\n';
            s->newline_due = false;
            continue;
        }
        if (s->end)
            break;
        int rc = kvb_query_answer_line(s->a, &s->line, &s->len);
        if (rc <= 0) {
            s->end = true;
            if (rc < 0 && n == 0)
                return MHD_CONTENT_READER_END_WITH_ERROR;
            break;
        }
        s->off = 0;
        s->newline_due = true;
    }
    kvb_query_answer_sent(s->a, n);
    if (n == 0 && s->end)
        return MHD_CONTENT_READER_END_OF_STREAM;
    return (ssize_t)n;
}

static void stream_free(void *cls)
{
    struct hq_stream *s = cls;
    kvb_query_answer_free(&s->a);
    free(s);
}

static enum MHD_Result send_answer(struct MHD_Connection *c, struct kvb_query_answer *a)
{
    struct hq_stream *s = calloc(1, sizeof(*s));
    if (!s) {
        kvb_query_answer_free(&a);
        return MHD_NO;
    }
    s->a = a;
    int status = kvb_query_answer_status(a);
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, stream_read, s, stream_free);
    if (!r) {
        stream_free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type",
                            status == 200 ? "application/x-ndjson" : "application/json");
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result send_error(struct MHD_Connection *c, struct kvb_query *q, int status,
                                  const char *msg)
{
    struct kvb_query_answer *a = NULL;
    if (kvb_query_error(q, status, msg, &a) < 0)
        return MHD_NO;
    return send_answer(c, a);
}

struct params {
    struct kvb_query_req *r;
    char err[256];
    int rc;
};

static enum MHD_Result each_param(void *cls, enum MHD_ValueKind kind, const char *key,
                                  const char *value)
{
    (void)kind;
    struct params *p = cls;
    if (p->rc == 0)
        p->rc = kvb_query_parse_param(key, value ? value : "", p->r, p->err, sizeof(p->err));
    return MHD_YES;
}

static enum MHD_Result run(struct MHD_Connection *c, struct kvb_query *q,
                           const struct kvb_query_req *r)
{
    struct kvb_query_answer *a = NULL;
    if (kvb_query_run(q, r, &a) < 0)
        return MHD_NO;
    return send_answer(c, a);
}

enum MHD_Result kvb_http_query(struct MHD_Connection *c, struct kvb_query *q, const char *url,
                               const char *method, const char *upload, size_t *upload_size,
                               void **con_cls)
{
    bool post = strcmp(method, "POST") == 0, get = strcmp(method, "GET") == 0;
    if (strcmp(url, MATCH_PATH) == 0 && post) {
        struct hq_conn *hc = *con_cls;
        if (!hc) { /* first call: headers only */
            if (!(hc = calloc(1, sizeof(*hc))))
                return MHD_NO;
            *con_cls = hc;
            return MHD_YES;
        }
        if (*upload_size) {
            size_t n = *upload_size;
            *upload_size = 0;
            if (hc->too_large || hc->len + n > KVB_QUERY_MAX_REQUEST) {
                hc->too_large = true;
                return MHD_YES;
            }
            if (hc->len + n + 1 > hc->cap) {
                size_t cap = hc->cap ? hc->cap : 4096;
                while (cap < hc->len + n + 1)
                    cap *= 2;
                char *b = realloc(hc->body, cap);
                if (!b)
                    return MHD_NO;
                hc->body = b;
                hc->cap = cap;
            }
            memcpy(hc->body + hc->len, upload, n);
            hc->len += n;
            return MHD_YES;
        }
        if (!q)
            return send_error(c, q, 503, "queries are off (limits.max_resident_blocks: 0)");
        if (hc->too_large)
            return send_error(c, q, 413, "request body too large");
        struct kvb_query_req r;
        char err[256];
        int rc = kvb_query_parse_json(hc->body ? hc->body : "", hc->len, KVB_QOP_MATCH, &r, err,
                                      sizeof(err));
        if (rc == -ENOMEM)
            return MHD_NO;
        if (rc < 0)
            return send_error(c, q, 400, err);
        enum MHD_Result res = run(c, q, &r);
        kvb_query_req_free(&r);
        return res;
    }
    int op = strcmp(url, "/v1/dump") == 0     ? KVB_QOP_DUMP
             : strcmp(url, "/v1/events") == 0 ? KVB_QOP_EVENTS
                                              : -1;
    if (op < 0 && strcmp(url, MATCH_PATH) != 0)
        return send_error(c, q, 404, "unknown path: /v1/dump, /v1/events or /v1/match");
    if (op < 0 || !get)
        return send_error(c, q, 405, op < 0 ? "POST /v1/match" : "GET only");
    if (!q)
        return send_error(c, q, 503, "queries are off (limits.max_resident_blocks: 0)");
    struct kvb_query_req r = {.op = op};
    struct params p = {.r = &r};
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, each_param, &p);
    if (p.rc < 0)
        return send_error(c, q, 400, p.err);
    return run(c, q, &r);
}

void kvb_http_query_completed(void **con_cls)
{
    struct hq_conn *hc = con_cls ? *con_cls : NULL;
    if (!hc)
        return;
    free(hc->body);
    free(hc);
    *con_cls = NULL;
}
