/* query_nats: the query API over NATS request/reply (query.subject).
 *
 * A request is a JSON object (query.h: {"op":"dump"|"events"|"match", ...},
 * the HTTP parameters as fields) published with a reply subject.  The answer
 * is the HTTP body cut at line boundaries into messages of at most the
 * server's max_payload (less room for the headers), each with the headers
 *   Kvb-Status: 200 | 400 | 404 | 410 | 503 ...   (the HTTP status)
 *   Kvb-Part:   1, 2, ...                          (in order)
 *   Kvb-Last:   true on the last message, else false
 * so a client subscribes to its own inbox, publishes the request with it as
 * the reply subject, and reads parts until Kvb-Last is true; the bodies put
 * together are exactly the HTTP answer.  Between parts the answer waits for
 * the server's PONG every 1 MiB, so a big dump never fills the connection's
 * buffer (which the loop reads as NATS backpressure).
 *
 * Runs on nats.c's delivery thread of the subscription (kvb_sink_serve()).
 */
#include "query_nats.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nats/nats.h>

#include "log.h"
#include "query.h"

#define HEADER_ROOM 256       /* bytes kept for the headers in each part */
#define FLOW_BYTES (1u << 20) /* flush (PING/PONG) after this many bytes */
#define FLUSH_TIMEOUT_MS 10000

struct parts {
    natsConnection *nc;
    const char *reply;
    int status;
    unsigned n;
    uint64_t unflushed;
    struct kvb_query_answer *a;
};

static natsStatus send_part(struct parts *p, const char *data, size_t len, bool last)
{
    natsMsg *m = NULL;
    char num[24], st[16];
    snprintf(num, sizeof(num), "%u", ++p->n);
    snprintf(st, sizeof(st), "%d", p->status);
    natsStatus s = natsMsg_Create(&m, p->reply, NULL, data, (int)len);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Kvb-Status", st);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Kvb-Part", num);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Kvb-Last", last ? "true" : "false");
    if (s == NATS_OK)
        s = natsConnection_PublishMsg(p->nc, m);
    natsMsg_Destroy(m);
    if (s == NATS_OK) {
        kvb_query_answer_sent(p->a, len);
        p->unflushed += len;
        if (p->unflushed >= FLOW_BYTES || last) {
            p->unflushed = 0;
            s = natsConnection_FlushTimeout(p->nc, FLUSH_TIMEOUT_MS);
        }
    }
    return s;
}

/* The answer's lines, packed into parts of at most cap bytes. */
static natsStatus send_answer(struct parts *p, size_t cap)
{
    char *buf = malloc(cap);
    if (!buf)
        return NATS_NO_MEMORY;
    size_t used = 0;
    const char *line;
    size_t len;
    int rc;
    natsStatus s = NATS_OK;
    while (s == NATS_OK && (rc = kvb_query_answer_line(p->a, &line, &len)) == 1) {
        if (used && used + len + 1 > cap) {
            s = send_part(p, buf, used, false);
            used = 0;
        }
        if (len + 1 > cap) { /* one line larger than a part: alone */
            char *big = malloc(len + 1);
            if (!big) {
                s = NATS_NO_MEMORY;
                break;
            }
            memcpy(big, line, len);
            big[len] = '\n';
            if (s == NATS_OK)
                s = send_part(p, big, len + 1, false);
            free(big);
            continue;
        }
        memcpy(buf + used, line, len);
        buf[used + len] = '\n';
        used += len + 1;
    }
    if (s == NATS_OK && rc < 0)
        s = NATS_NO_MEMORY;
    if (s == NATS_OK)
        s = send_part(p, buf, used, true);
    free(buf);
    return s;
}

void kvb_query_nats_handle(void *closure, void *nats_conn, void *nats_msg)
{
    struct kvb_query *q = closure;
    natsConnection *nc = nats_conn;
    natsMsg *msg = nats_msg;
    const char *reply = natsMsg_GetReply(msg);
    if (!reply || !*reply) { /* nobody to answer */
        natsMsg_Destroy(msg);
        return;
    }
    struct kvb_query_req r;
    struct kvb_query_answer *a = NULL;
    char err[256];
    int rc = kvb_query_parse_json(natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg), -1, &r,
                                  err, sizeof(err));
    if (rc == 0) {
        rc = kvb_query_run(q, &r, &a);
        kvb_query_req_free(&r);
    } else if (rc == -EINVAL) {
        rc = kvb_query_error(q, 400, err, &a);
    }
    if (rc == 0) {
        int64_t maxp = natsConnection_GetMaxPayload(nc);
        size_t cap = maxp > 2 * HEADER_ROOM ? (size_t)maxp - HEADER_ROOM : 4096;
        struct parts p = {.nc = nc, .reply = reply, .status = kvb_query_answer_status(a), .a = a};
        natsStatus s = send_answer(&p, cap);
        if (s != NATS_OK)
            kvb_warn("query", "NATS answer to %s cut after %u part(s): %s", reply, p.n,
                     natsStatus_GetText(s));
    }
    kvb_query_answer_free(&a);
    natsMsg_Destroy(msg);
}
