/* zap: the ZAP handler's answers (RFC 27) to requests sent the way libzmq
 * sends them, over a REQ socket on inproc://zeromq.zap.01; and one real
 * CURVE handshake per case through it (allowed, refused). */
#include <check.h>

#include "testutil.h"
#include <stdbool.h>
#include <string.h>
#include <zmq.h>

#include "metrics.h"
#include "zap.h"

struct fx {
    void *ctx, *req;
    struct kvb_zap *zap;
    struct kvb_metrics m;
};

static void fx_init(struct fx *f)
{
    memset(f, 0, sizeof(*f));
    f->ctx = zmq_ctx_new();
    ck_assert_ptr_nonnull(f->ctx);
    ck_assert_int_eq(kvb_zap_create(f->ctx, &f->m, &f->zap), 0);
    ck_assert_ptr_nonnull(kvb_zap_socket(f->zap));
    f->req = zmq_socket(f->ctx, ZMQ_REQ);
    int linger = 0;
    zmq_setsockopt(f->req, ZMQ_LINGER, &linger, sizeof(linger));
    ck_assert_int_eq(zmq_connect(f->req, "inproc://zeromq.zap.01"), 0);
}

static void fx_free(struct fx *f)
{
    zmq_close(f->req);
    kvb_zap_destroy(&f->zap);
    ck_assert_ptr_null(f->zap);
    kvb_zap_destroy(&f->zap); /* NULL is fine */
    zmq_ctx_term(f->ctx);
}

/* Send a request (frames as strings; "key" = 32 bytes of KEY) and return
 * the status code of the answer ("" when the reply is malformed). */
static const char *ask(struct fx *f, const char *const *frames, int n, const uint8_t *key)
{
    static char code[8];
    for (int i = 0; i < n; i++) {
        bool k = strcmp(frames[i], "key") == 0;
        ck_assert_int_ge(zmq_send(f->req, k ? (const void *)key : frames[i],
                                  k ? 32 : strlen(frames[i]), i + 1 < n ? ZMQ_SNDMORE : 0),
                         0);
    }
    ck_assert_int_eq(kvb_zap_handle(f->zap), 1);
    ck_assert_int_eq(kvb_zap_handle(f->zap), 0); /* nothing more pending */
    char buf[64];
    int nf = 0, more = 1;
    code[0] = '\0';
    while (more) {
        int len = zmq_recv(f->req, buf, sizeof(buf) - 1, 0);
        ck_assert_int_ge(len, 0);
        buf[len < (int)sizeof(buf) - 1 ? len : (int)sizeof(buf) - 1] = '\0';
        if (nf == 0)
            ck_assert_str_eq(buf, "1.0");
        if (nf == 1)
            ck_assert_str_eq(buf, "id-7");
        if (nf == 2)
            snprintf(code, sizeof(code), "%.7s", buf);
        nf++;
        size_t sz = sizeof(more);
        zmq_getsockopt(f->req, ZMQ_RCVMORE, &more, &sz);
    }
    ck_assert_int_eq(nf, 6);
    return code;
}

START_TEST(test_answers)
{
    struct fx f;
    fx_init(&f);
    uint8_t a[32], b[32];
    memset(a, 0xaa, 32);
    memset(b, 0xbb, 32);
    uint8_t allowed[1][32];
    memcpy(allowed[0], a, 32);
    char d1[KVB_ZAP_DOMAIN_MAX], d2[KVB_ZAP_DOMAIN_MAX];
    ck_assert_int_eq(kvb_zap_add(f.zap, "src-1", (const uint8_t(*)[32])allowed, 1, d1), 0);
    ck_assert_int_eq(kvb_zap_add(f.zap, "src-2", NULL, 0, d2), 0);
    ck_assert_str_ne(d1, d2);
    ck_assert_int_eq(kvb_zap_handle(f.zap), 0);

    const char *req[] = {"1.0", "id-7", d1, "127.0.0.1", "", "CURVE", "key"};
    ck_assert_str_eq(ask(&f, req, 7, a), "200");
    ck_assert_str_eq(ask(&f, req, 7, b), "400");
    ck_assert_uint_eq(kvb_get(&f.m.curve_clients_rejected_total[0]), 1);
    req[2] = d2; /* any client */
    ck_assert_str_eq(ask(&f, req, 7, b), "200");
    req[2] = "kvbridge-src-99"; /* unknown domain */
    ck_assert_str_eq(ask(&f, req, 7, a), "400");
    req[2] = d1;
    const char *plain[] = {"1.0", "id-7", d1, "127.0.0.1", "", "NULL"};
    ck_assert_str_eq(ask(&f, plain, 6, a), "400");
    const char *v2[] = {"2.0", "id-7", d1, "127.0.0.1", "", "CURVE", "key"};
    ck_assert_str_eq(ask(&f, v2, 7, a), "500");
    const char *shortreq[] = {"1.0", "id-7", d1};
    ck_assert_str_eq(ask(&f, shortreq, 3, a), "500");
    ck_assert_uint_eq(kvb_get(&f.m.curve_clients_rejected_total[0]), 3);
    /* removed: refused */
    kvb_zap_remove(f.zap, d1);
    kvb_zap_remove(f.zap, "no-such-domain");
    kvb_zap_remove(NULL, d1);
    ck_assert_str_eq(ask(&f, req, 7, a), "400");
    fx_free(&f);
}
END_TEST

/* A CURVE server SUB with the domain, a client PUB with KEY: whether a
 * message gets through (the handler answers in the loop).  TCP: libzmq has
 * no security mechanism on inproc://. */
static bool handshake(struct fx *f, const char *domain, const char *client_pub,
                      const char *client_sec, const char *server_pub, const char *server_sec)
{
    void *sub = zmq_socket(f->ctx, ZMQ_SUB), *pub = zmq_socket(f->ctx, ZMQ_PUB);
    int one = 1, linger = 0;
    char ep[64];
    size_t eplen = sizeof(ep);
    zmq_setsockopt(sub, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(pub, ZMQ_LINGER, &linger, sizeof(linger));
    ck_assert_int_eq(zmq_setsockopt(sub, ZMQ_CURVE_SERVER, &one, sizeof(one)), 0);
    ck_assert_int_eq(zmq_setsockopt(sub, ZMQ_CURVE_SECRETKEY, server_sec, 40), 0);
    ck_assert_int_eq(zmq_setsockopt(sub, ZMQ_ZAP_DOMAIN, domain, strlen(domain)), 0);
    ck_assert_int_eq(zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0), 0);
    ck_assert_int_eq(zmq_bind(sub, "tcp://127.0.0.1:*"), 0);
    ck_assert_int_eq(zmq_getsockopt(sub, ZMQ_LAST_ENDPOINT, ep, &eplen), 0);
    ck_assert_int_eq(zmq_setsockopt(pub, ZMQ_CURVE_SERVERKEY, server_pub, 40), 0);
    ck_assert_int_eq(zmq_setsockopt(pub, ZMQ_CURVE_PUBLICKEY, client_pub, 40), 0);
    ck_assert_int_eq(zmq_setsockopt(pub, ZMQ_CURVE_SECRETKEY, client_sec, 40), 0);
    ck_assert_int_eq(zmq_connect(pub, ep), 0);
    bool got = false;
    for (int i = 0; i < 200 && !got; i++) { /* up to 2 s */
        zmq_pollitem_t it[2] = {{kvb_zap_socket(f->zap), 0, ZMQ_POLLIN, 0},
                                {sub, 0, ZMQ_POLLIN, 0}};
        zmq_send(pub, "x", 1, ZMQ_DONTWAIT);
        zmq_poll(it, 2, 10);
        if (it[0].revents & ZMQ_POLLIN)
            ck_assert_int_ge(kvb_zap_handle(f->zap), 0);
        got = it[1].revents & ZMQ_POLLIN;
    }
    zmq_close(pub);
    zmq_close(sub);
    return got;
}

START_TEST(test_handshakes)
{
    struct fx f;
    fx_init(&f);
    char spub[41], ssec[41], cpub[41], csec[41], opub[41], osec[41];
    ck_assert_int_eq(zmq_curve_keypair(spub, ssec), 0);
    ck_assert_int_eq(zmq_curve_keypair(cpub, csec), 0);
    ck_assert_int_eq(zmq_curve_keypair(opub, osec), 0);
    uint8_t allowed[1][32];
    ck_assert_ptr_nonnull(zmq_z85_decode(allowed[0], cpub));
    char d[KVB_ZAP_DOMAIN_MAX];
    ck_assert_int_eq(kvb_zap_add(f.zap, "src", (const uint8_t(*)[32])allowed, 1, d), 0);
    ck_assert(handshake(&f, d, cpub, csec, spub, ssec));
    ck_assert_uint_eq(kvb_get(&f.m.curve_clients_rejected_total[0]), 0);
    ck_assert(!handshake(&f, d, opub, osec, spub, ssec));
    ck_assert_uint_ge(kvb_get(&f.m.curve_clients_rejected_total[0]), 1);
    fx_free(&f);
}
END_TEST

START_TEST(test_one_handler_per_context)
{
    struct fx f;
    fx_init(&f);
    struct kvb_zap *z2 = NULL;
    ck_assert_int_eq(kvb_zap_create(f.ctx, &f.m, &z2), -EADDRINUSE);
    ck_assert_ptr_null(z2);
    fx_free(&f);
}
END_TEST

static Suite *zap_suite(void)
{
    Suite *s = suite_create("zap");
    TCase *tc = tcase_create("zap");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_answers);
    tcase_add_test(tc, test_handshakes);
    tcase_add_test(tc, test_one_handler_per_context);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(zap_suite()); }
