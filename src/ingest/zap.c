/* zap: the ZAP handler for CURVE bind-mode sources.  See include/zap.h. */
#include "zap.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "log.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define ZAP_FRAMES 8  /* a CURVE request has 7 */
#define LABEL_MAX 300 /* a source's name in the log */
#define ADDR_MAX 64   /* a client's address in the log */

struct domain {
    char name[KVB_ZAP_DOMAIN_MAX];
    char label[LABEL_MAX];
    uint8_t (*keys)[32]; /* NULL: any client */
    size_t n;
};

struct kvb_zap {
    void *rep;
    struct kvb_metrics *m;
    struct domain *d;
    size_t n, cap;
    unsigned next_id;
    struct kvb_ratelimit rl;
};

int kvb_zap_create(void *zctx, struct kvb_metrics *m, struct kvb_zap **out)
{
    int linger = 0;
    struct kvb_zap *z = calloc(1, sizeof(*z));
    if (!z)
        return -ENOMEM;
    z->m = m;
    z->rl = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(10000, 5);
    z->rep = zmq_socket(zctx, ZMQ_REP);
    if (!z->rep || zmq_setsockopt(z->rep, ZMQ_LINGER, &linger, sizeof(linger)) < 0 ||
        zmq_bind(z->rep, ZAP_ENDPOINT) < 0) {
        int rc = -(zmq_errno() ? zmq_errno() : EIO);
        kvb_err("zap", "cannot bind %s: %s", ZAP_ENDPOINT, zmq_strerror(-rc));
        kvb_zap_destroy(&z);
        return rc;
    }
    *out = z;
    return 0;
}

void kvb_zap_destroy(struct kvb_zap **pz)
{
    if (!pz || !*pz)
        return;
    struct kvb_zap *z = *pz;
    if (z->rep)
        zmq_close(z->rep);
    for (size_t i = 0; i < z->n; i++)
        free(z->d[i].keys);
    free(z->d);
    free(z);
    *pz = NULL;
}

void *kvb_zap_socket(struct kvb_zap *z) { return z->rep; }

int kvb_zap_add(struct kvb_zap *z, const char *label, const uint8_t (*keys)[32], size_t n,
                char domain[KVB_ZAP_DOMAIN_MAX])
{
    if (z->n == z->cap) {
        size_t cap = z->cap ? z->cap * 2 : 8;
        struct domain *d = realloc(z->d, cap * sizeof(*d));
        if (!d)
            return -ENOMEM;
        z->d = d;
        z->cap = cap;
    }
    struct domain *d = &z->d[z->n];
    memset(d, 0, sizeof(*d));
    if (n) {
        if (!(d->keys = malloc(n * sizeof(*d->keys))))
            return -ENOMEM;
        memcpy(d->keys, keys, n * sizeof(*d->keys));
        d->n = n;
    }
    /* a new name each time: a reloaded source never takes over the old
     * one's domain while both exist */
    snprintf(d->name, sizeof(d->name), "kvbridge-src-%u", z->next_id++);
    snprintf(d->label, sizeof(d->label), "%s", label ? label : "?");
    snprintf(domain, KVB_ZAP_DOMAIN_MAX, "%s", d->name);
    z->n++;
    return 0;
}

void kvb_zap_remove(struct kvb_zap *z, const char *domain)
{
    for (size_t i = 0; z && i < z->n; i++) {
        if (strcmp(z->d[i].name, domain) != 0)
            continue;
        free(z->d[i].keys);
        z->d[i] = z->d[--z->n];
        return;
    }
}

/* Receive one request into up to ZAP_FRAMES frames: the number of frames
 * (all of them; extra ones are dropped), 0 when none is waiting, or a
 * negative errno. */
static int recv_request(void *sock, zmq_msg_t *f)
{
    int n = 0;
    for (;;) {
        zmq_msg_t tmp, *m = n < ZAP_FRAMES ? &f[n] : &tmp;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, sock, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            int e = zmq_errno();
            zmq_msg_close(m);
            for (int i = 0; i < n && i < ZAP_FRAMES; i++)
                zmq_msg_close(&f[i]);
            return n == 0 && e == EAGAIN ? 0 : -e;
        }
        bool more = zmq_msg_more(m);
        if (m == &tmp)
            zmq_msg_close(&tmp);
        n++;
        if (!more)
            return n;
    }
}

static bool frame_is(zmq_msg_t *f, const char *s)
{
    size_t n = strlen(s);
    return zmq_msg_size(f) == n && memcmp(zmq_msg_data(f), s, n) == 0;
}

/* A frame as printable text for the log (at most max - 1 bytes). */
static void frame_text(zmq_msg_t *f, char *out, size_t max)
{
    const unsigned char *p = zmq_msg_data(f);
    size_t n = zmq_msg_size(f), k = 0;
    for (size_t i = 0; i < n && k + 1 < max; i++)
        out[k++] = p[i] >= 0x20 && p[i] < 0x7f ? (char)p[i] : '?';
    out[k] = '\0';
}

static struct domain *find_domain(struct kvb_zap *z, zmq_msg_t *f)
{
    for (size_t i = 0; i < z->n; i++)
        if (frame_is(f, z->d[i].name))
            return &z->d[i];
    return NULL;
}

static bool key_allowed(const struct domain *d, zmq_msg_t *cred)
{
    if (zmq_msg_size(cred) != 32)
        return false;
    if (!d->keys)
        return true;
    for (size_t i = 0; i < d->n; i++)
        if (memcmp(d->keys[i], zmq_msg_data(cred), 32) == 0)
            return true;
    return false;
}

/* The reply: version, request id, status code and text, user id, metadata. */
static int reply(void *sock, zmq_msg_t *request_id, const char *code, const char *text)
{
    const void *id = request_id ? zmq_msg_data(request_id) : "";
    size_t id_len = request_id ? zmq_msg_size(request_id) : 0;
    if (zmq_send(sock, "1.0", 3, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(sock, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(sock, code, strlen(code), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(sock, text, strlen(text), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(sock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(sock, "", 0, ZMQ_DONTWAIT) < 0)
        return -(zmq_errno() ? zmq_errno() : EIO);
    return 0;
}

/* Request frames (RFC 27): version, request id, domain, address, identity,
 * mechanism, credentials (CURVE: the client's 32-byte public key). */
static int answer(struct kvb_zap *z, zmq_msg_t *f, int n)
{
    if (n < 6 || !frame_is(&f[0], "1.0"))
        return reply(z->rep, n >= 2 ? &f[1] : NULL, "500", "malformed ZAP request");
    char addr[ADDR_MAX];
    frame_text(&f[3], addr, sizeof(addr));
    struct domain *d = find_domain(z, &f[2]);
    if (d && frame_is(&f[5], "CURVE") && n == 7 && key_allowed(d, &f[6]))
        return reply(z->rep, &f[1], "200", "OK");
    kvb_inc(&z->m->curve_clients_rejected_total[0]);
    if (d) {
        kvb_log_rl(&z->rl, KVB_LOG_WARN, "source",
                   "%s: CURVE client from %s refused: its public key is not in "
                   "curve.allowed_clients_file",
                   d->label, addr[0] ? addr : "?");
    } else {
        char dom[KVB_ZAP_DOMAIN_MAX];
        frame_text(&f[2], dom, sizeof(dom));
        kvb_log_rl(&z->rl, KVB_LOG_WARN, "source",
                   "ZAP request for domain '%s' from %s refused: no such source", dom,
                   addr[0] ? addr : "?");
    }
    return reply(z->rep, &f[1], "400", "not allowed");
}

int kvb_zap_handle(struct kvb_zap *z)
{
    zmq_msg_t f[ZAP_FRAMES];
    int answered = 0;
    for (;;) {
        int n = recv_request(z->rep, f);
        if (n <= 0)
            return n < 0 ? n : answered;
        int rc = answer(z, f, n);
        for (int i = 0; i < n && i < ZAP_FRAMES; i++)
            zmq_msg_close(&f[i]);
        if (rc < 0) {
            kvb_err("zap", "cannot answer a ZAP request: %s", zmq_strerror(-rc));
            return rc;
        }
        answered++;
    }
}
