/* dyn_router: plays a Dynamo router asking a worker for its KV state (the
 * recovery query, docs/dynamo-event-plane.md section 9), for the
 * integration tests.  Written from Dynamo's wire forms, with nothing of
 * kvbridge's src/:
 *
 *   dyn_router --plane tcp|nats --target T [--nats URL] --response mux|callhome
 *              --worker W --rank R [--start N] [--end N] [--old-request]
 *              [--blocks FILE] [--ids FILE] [--transport NAME]
 *
 * T is the recovery_target's transport value: HOST:PORT/PATH for the TCP
 * request plane, the subject for NATS.  It listens on 127.0.0.1 (the
 * response server), sends a TwoPart envelope [RequestControlMessage JSON]
 * [WorkerKvQueryRequest JSON] (--old-request: without
 * supports_tree_dump_failed and kind), expects the acknowledgement (an
 * empty reply), accepts the worker's connection and reads the response
 * stream: response mux v1 (handshake, ConnectionAck(0), Prologue, Data,
 * Data {"complete_final":true}, End, giving credits back after each Data)
 * or call-home (handshake, prologue, data, final, sentinel).  Prints
 *   dyn_router: variant=V events=N blocks=B last_event_id=L first_id=F last_id=I ...
 * and writes each block "block_hash tokens_hash" (--blocks) and each event
 * id (--ids).  Exit 0 answered, 3 refused (the reply's text printed), 1 on
 * any protocol error, 2 usage.
 *
 * Build: gcc -O1 dyn_router.c -o dyn_router $(pkg-config --cflags --libs libnats json-c)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <json-c/json.h>
#include <nats/nats.h>

#define ID "9f1c2d3e-4b5a-4697-8a1b-2c3d4e5f6a7b"
#define FRONTEND "0b6e2a44-1f3c-4d5e-9a7b-8c9d0e1f2a3b"
#define STREAM "5d4c3b2a-1908-4776-8554-433221100fed"
#define SUBJECT "3e7f1a9b-2c4d-4e6f-8a0b-1c2d3e4f5a6b"
#define TIMEOUT_MS 15000

static void die(const char *what)
{
    fprintf(stderr, "dyn_router: %s\n", what);
    exit(1);
}

static void put_be(uint8_t *p, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

static uint64_t get_be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

static void read_n(int fd, void *buf, size_t n)
{
    uint8_t *p = buf;
    while (n) {
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, TIMEOUT_MS) <= 0)
            die("timed out reading the response stream");
        ssize_t k = read(fd, p, n);
        if (k <= 0)
            die("the worker closed the response stream early");
        p += k;
        n -= (size_t)k;
    }
}

static void write_n(int fd, const void *buf, size_t n)
{
    if (write(fd, buf, n) != (ssize_t)n)
        die("write");
}

/* One TwoPart message: header and body malloc'ed (NUL-terminated). */
static void twopart_read(int fd, char **h, size_t *hl, char **b, size_t *bl)
{
    uint8_t pre[24];
    read_n(fd, pre, 24);
    *hl = get_be(pre, 8);
    *bl = get_be(pre + 8, 8);
    if (*hl > (64u << 20) || *bl > (64u << 20))
        die("TwoPart lengths too large");
    *h = calloc(1, *hl + 1);
    *b = calloc(1, *bl + 1);
    read_n(fd, *h, *hl);
    read_n(fd, *b, *bl);
}

static void uuid_bytes(const char *s, uint8_t out[16])
{
    int k = 0;
    for (; *s && k < 32; s++) {
        if (*s == '-')
            continue;
        unsigned v;
        sscanf(s, "%1x", &v);
        out[k / 2] = (uint8_t)(k % 2 ? out[k / 2] | v : v << 4);
        k++;
    }
}

/* ---- the answer --------------------------------------------------------------- */

struct opts {
    const char *plane, *target, *nats, *response, *blocks, *ids, *transport;
    uint64_t worker, rank, start, end;
    bool has_start, has_end, old_request;
};

static void summarize(const struct opts *o, const char *item, const char *final)
{
    json_object *it = json_tokener_parse(item), *fi = json_tokener_parse(final), *data, *v;
    if (!it || !fi || !json_object_object_get_ex(fi, "complete_final", &v) ||
        !json_object_get_boolean(v))
        die("the final item is not {\"complete_final\":true}");
    if (!json_object_object_get_ex(it, "complete_final", &v) || json_object_get_boolean(v) ||
        !json_object_object_get_ex(it, "data", &data))
        die("the item is not {\"data\":...,\"complete_final\":false}");
    json_object_object_foreach(data, variant, body)
    {
        printf("dyn_router: variant=%s", variant);
        if (json_object_is_type(body, json_type_string)) {
            printf(" message=%s\n", json_object_get_string(body));
            return;
        }
        json_object *events;
        size_t blocks = 0;
        long long first = -1, last = -1;
        bool pair_ok = true;
        FILE *fb = o->blocks ? fopen(o->blocks, "w") : NULL,
             *fi2 = o->ids ? fopen(o->ids, "w") : NULL;
        if (json_object_object_get_ex(body, "events", &events)) {
            size_t n = json_object_array_length(events);
            for (size_t i = 0; i < n; i++) {
                json_object *e = json_object_array_get_idx(events, i), *ev, *d, *st, *bl, *x;
                uint64_t w =
                    json_object_object_get_ex(e, "worker_id", &x) ? json_object_get_uint64(x) : 0;
                json_object_object_get_ex(e, "event", &ev);
                uint64_t id =
                    json_object_object_get_ex(ev, "event_id", &x) ? json_object_get_uint64(x) : 0;
                uint64_t r =
                    json_object_object_get_ex(ev, "dp_rank", &x) ? json_object_get_uint64(x) : 0;
                pair_ok &= w == o->worker && r == o->rank;
                if (first < 0)
                    first = (long long)id;
                last = (long long)id;
                if (fi2)
                    fprintf(fi2, "%" PRIu64 "\n", id);
                if (json_object_object_get_ex(ev, "data", &d) &&
                    json_object_object_get_ex(d, "stored", &st) &&
                    json_object_object_get_ex(st, "blocks", &bl))
                    for (size_t k = 0; k < json_object_array_length(bl); k++) {
                        json_object *b = json_object_array_get_idx(bl, k), *h, *t;
                        json_object_object_get_ex(b, "block_hash", &h);
                        json_object_object_get_ex(b, "tokens_hash", &t);
                        if (fb)
                            fprintf(fb, "%" PRIu64 " %" PRIu64 "\n", json_object_get_uint64(h),
                                    json_object_get_uint64(t));
                        blocks++;
                    }
            }
            printf(" events=%zu blocks=%zu first_id=%lld last_id=%lld pair_ok=%d", n, blocks, first,
                   last, pair_ok);
        }
        json_object_object_foreach(body, k, val) if (strcmp(k, "events") != 0)
            printf(" %s=%s", k, json_object_to_json_string_ext(val, JSON_C_TO_STRING_PLAIN));
        printf("\n");
        if (fb)
            fclose(fb);
        if (fi2)
            fclose(fi2);
        return;
    }
}

/* ---- the response planes (the router's side) ------------------------------------- */

static void serve_mux(const struct opts *o, int fd, char **item, char **final)
{
    char *h, *b;
    size_t hl, bl;
    twopart_read(fd, &h, &hl, &b, &bl);
    json_object *hs = json_tokener_parse(h), *v;
    if (!hs || !json_object_object_get_ex(hs, "kind", &v) ||
        strcmp(json_object_get_string(v), "response_mux") ||
        !json_object_object_get_ex(hs, "version", &v) || json_object_get_int(v) != 1 ||
        !json_object_object_get_ex(hs, "frontend_server_id", &v) ||
        strcmp(json_object_get_string(v), FRONTEND) ||
        !json_object_object_get_ex(hs, "connection_id", &v))
        die("not a response mux v1 handshake for this frontend");
    uint8_t ack[24 + 20 + 8] = {0};
    put_be(ack, 20, 8);
    put_be(ack + 8, 8, 8);
    ack[24] = 8; /* ConnectionAck(0): the nil stream, offset 0 */
    write_n(fd, ack, sizeof(ack));
    uint8_t stream[16];
    uuid_bytes(STREAM, stream);
    uint64_t decoded = 0;
    int datas = 0;
    for (;;) {
        uint8_t fh[24];
        read_n(fd, fh, 24);
        uint32_t n = (uint32_t)get_be(fh, 4);
        if (memcmp(fh + 8, stream, 16) != 0 || fh[5] || fh[6] || fh[7])
            die("a frame of another stream, or with flags");
        char *p = calloc(1, (size_t)n + 1);
        read_n(fd, p, n);
        if (fh[4] == 1) { /* Prologue */
            if (strcmp(p, "{\"error\":null}") != 0)
                die("the prologue is not {\"error\":null}");
        } else if (fh[4] == 2) { /* Data: give the credits back */
            *(datas++ ? final : item) = p;
            p = NULL;
            decoded += 24 + (uint64_t)n;
            uint8_t wu[28], ca[32] = {0};
            put_be(wu, 4, 4);
            wu[4] = 6;
            memset(wu + 5, 0, 3);
            memcpy(wu + 8, stream, 16);
            put_be(wu + 24, 24 + (uint64_t)n < (256u << 10) ? 24 + (uint64_t)n : (256u << 10), 4);
            put_be(ca, 8, 4);
            ca[4] = 8;
            put_be(ca + 24, decoded, 8);
            write_n(fd, wu, sizeof(wu));
            write_n(fd, ca, sizeof(ca));
        } else if (fh[4] == 3) { /* End */
            free(p);
            break;
        } else {
            die("an unexpected frame kind");
        }
        free(p);
    }
    if (datas != 2)
        die("not two Data frames (the item and the final)");
    (void)o;
}

static void serve_callhome(int fd, char **item, char **final)
{
    char *h, *b;
    size_t hl, bl;
    twopart_read(fd, &h, &hl, &b, &bl);
    if (!strstr(h, "\"subject\":\"" SUBJECT "\"") || !strstr(h, "\"stream_type\":\"response\"") ||
        bl)
        die("not the call-home handshake");
    twopart_read(fd, &h, &hl, &b, &bl);
    if (strcmp(h, "{\"error\":null}") != 0 || bl)
        die("no prologue");
    twopart_read(fd, &h, &hl, item, &bl);
    if (hl)
        die("the item has a header");
    twopart_read(fd, &h, &hl, final, &bl);
    twopart_read(fd, &h, &hl, &b, &bl);
    if (strcmp(h, "\"sentinel\"") != 0)
        die("no sentinel");
    close(fd); /* the router closes: the worker waits for it */
}

/* ---- the request ------------------------------------------------------------------ */

static char *request_json(const struct opts *o)
{
    json_object *r = json_object_new_object();
    json_object_object_add(r, "worker_id", json_object_new_uint64(o->worker));
    json_object_object_add(r, "dp_rank", json_object_new_uint64(o->rank));
    json_object_object_add(r, "start_event_id",
                           o->has_start ? json_object_new_uint64(o->start) : NULL);
    json_object_object_add(r, "end_event_id", o->has_end ? json_object_new_uint64(o->end) : NULL);
    if (!o->old_request) {
        json_object_object_add(r, "supports_tree_dump_failed", json_object_new_boolean(1));
        json_object_object_add(r, "kind", json_object_new_string("recovery"));
    }
    char *s = strdup(json_object_to_json_string_ext(r, JSON_C_TO_STRING_PLAIN));
    json_object_put(r);
    return s;
}

static char *control_json(const struct opts *o, int port)
{
    char addr[64], info[512];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    json_object *i = json_object_new_object();
    json_object_object_add(i, "address", json_object_new_string(addr));
    if (!strcmp(o->response, "mux")) {
        json_object_object_add(i, "frontend_server_id", json_object_new_string(FRONTEND));
        json_object_object_add(i, "stream_id", json_object_new_string(STREAM));
        json_object_object_add(i, "context", json_object_new_string(ID));
    } else {
        json_object_object_add(i, "subject", json_object_new_string(SUBJECT));
        json_object_object_add(i, "context", json_object_new_string(ID));
        json_object_object_add(i, "stream_type", json_object_new_string("response"));
    }
    snprintf(info, sizeof(info), "%s", json_object_to_json_string_ext(i, JSON_C_TO_STRING_PLAIN));
    json_object_put(i);
    json_object *c = json_object_new_object(), *ci = json_object_new_object();
    json_object_object_add(c, "id", json_object_new_string(ID));
    json_object_object_add(c, "request_type", json_object_new_string("single_in"));
    json_object_object_add(c, "response_type", json_object_new_string("many_out"));
    json_object_object_add(c, "payload_codec", json_object_new_string("json"));
    json_object_object_add(ci, "transport",
                           json_object_new_string(o->transport ? o->transport
                                                  : !strcmp(o->response, "mux")
                                                      ? "tcp_response_mux_v1"
                                                      : "tcp_server"));
    json_object_object_add(ci, "info", json_object_new_string(info));
    json_object_object_add(c, "connection_info", ci);
    char *s = strdup(json_object_to_json_string_ext(c, JSON_C_TO_STRING_PLAIN));
    json_object_put(c);
    return s;
}

/* Send the envelope; the reply's text (empty: the acknowledgement). */
static char *send_request(const struct opts *o, const uint8_t *env, size_t len)
{
    static char reply[1024];
    if (!strcmp(o->plane, "nats")) {
        natsConnection *nc = NULL;
        natsMsg *m = NULL;
        if (natsConnection_ConnectTo(&nc, o->nats) != NATS_OK)
            die("cannot connect to NATS");
        natsStatus s = natsConnection_Request(&m, nc, o->target, env, (int)len, 5000);
        if (s != NATS_OK)
            die(natsStatus_GetText(s));
        snprintf(reply, sizeof(reply), "%.*s", natsMsg_GetDataLength(m), natsMsg_GetData(m));
        natsMsg_Destroy(m);
        natsConnection_Destroy(nc);
        return reply;
    }
    char host[128];
    const char *slash = strchr(o->target, '/'), *colon;
    if (!slash || (size_t)(slash - o->target) >= sizeof(host))
        die("--target: HOST:PORT/PATH");
    memcpy(host, o->target, (size_t)(slash - o->target));
    host[slash - o->target] = '\0';
    if (!(colon = strrchr(host, ':')))
        die("--target: HOST:PORT/PATH");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    *(char *)colon = '\0';
    inet_pton(AF_INET, host, &a.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
        die("cannot connect to the TCP request plane");
    const char *path = slash + 1, *hdrs = "{\"request-id\":\"" ID "\"}";
    size_t pl = strlen(path), hl = strlen(hdrs);
    uint8_t *f = malloc(8 + pl + hl + len);
    put_be(f, pl, 2);
    memcpy(f + 2, path, pl);
    put_be(f + 2 + pl, hl, 2);
    memcpy(f + 4 + pl, hdrs, hl);
    put_be(f + 4 + pl + hl, len, 4);
    memcpy(f + 8 + pl + hl, env, len);
    write_n(fd, f, 8 + pl + hl + len);
    uint8_t rl[4];
    read_n(fd, rl, 4);
    uint32_t n = (uint32_t)get_be(rl, 4);
    if (n >= sizeof(reply))
        die("a long reply");
    read_n(fd, reply, n);
    reply[n] = '\0';
    close(fd);
    return reply;
}

int main(int argc, char **argv)
{
    struct opts o = {.plane = "tcp", .response = "mux", .nats = "nats://127.0.0.1:4222"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--old-request")) {
            o.old_request = true;
            continue;
        }
        if (!v) {
            fprintf(stderr, "dyn_router: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--plane"))
            o.plane = v;
        else if (!strcmp(a, "--target"))
            o.target = v;
        else if (!strcmp(a, "--nats"))
            o.nats = v;
        else if (!strcmp(a, "--response"))
            o.response = v;
        else if (!strcmp(a, "--blocks"))
            o.blocks = v;
        else if (!strcmp(a, "--ids"))
            o.ids = v;
        else if (!strcmp(a, "--transport"))
            o.transport = v;
        else if (!strcmp(a, "--worker"))
            o.worker = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--rank"))
            o.rank = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--start"))
            o.start = strtoull(v, NULL, 10), o.has_start = true;
        else if (!strcmp(a, "--end"))
            o.end = strtoull(v, NULL, 10), o.has_end = true;
        else {
            fprintf(stderr, "dyn_router: unknown option %s\n", a);
            return 2;
        }
    }
    if (!o.target)
        return 2;
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in la = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t ll = sizeof(la);
    if (bind(lfd, (struct sockaddr *)&la, sizeof(la)) < 0 || listen(lfd, 4) < 0 ||
        getsockname(lfd, (struct sockaddr *)&la, &ll) < 0)
        die("cannot listen");
    char *ctl = control_json(&o, ntohs(la.sin_port)), *req = request_json(&o);
    size_t cl = strlen(ctl), rql = strlen(req);
    uint8_t *env = malloc(24 + cl + rql);
    put_be(env, cl, 8);
    put_be(env + 8, rql, 8);
    put_be(env + 16, 0, 8);
    memcpy(env + 24, ctl, cl);
    memcpy(env + 24 + cl, req, rql);
    const char *reply = send_request(&o, env, 24 + cl + rql);
    if (*reply) {
        printf("dyn_router: refused: %s\n", reply);
        return 3;
    }
    struct pollfd pf = {lfd, POLLIN, 0};
    if (poll(&pf, 1, TIMEOUT_MS) <= 0)
        die("the worker never connected back");
    int fd = accept(lfd, NULL, NULL);
    char *item = NULL, *final = NULL;
    if (!strcmp(o.response, "mux"))
        serve_mux(&o, fd, &item, &final);
    else
        serve_callhome(fd, &item, &final);
    summarize(&o, item, final);
    return 0;
}
