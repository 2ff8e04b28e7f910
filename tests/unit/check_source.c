/* source: the SUB, its connection monitor and the order between them,
 * through real ZMQ sockets on loopback (src/ingest/source.c).
 *
 *   drop_after_queued  the engine sends batches and goes away before
 *                      kvbridge read them: the drop (monitor) must apply
 *                      after the batches the SUB still holds, which came
 *                      before it; else they must "prove" a continuity that
 *                      is not in question and, without a replay endpoint,
 *                      become a spurious restart barrier (seen as an extra
 *                      "cleared" in test_daemon_gaps and test_rel_jetstream c)
 *   drop_then_new      after a drop with nothing queued, the next batch is
 *                      judged as before: a restart without replay endpoint
 *   replaced_at_once   a source closed and another opened in its place at once
 *                      (sources[].discover's moved ranks): it opens, and
 *                      reports its connection
 *   endpoint_of_rank   the endpoints of a dp_size expansion (rank_naming)
 */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "clock.h"
#include "log.h"
#include "metrics.h"
#include "source.h"
#include "testutil.h"

static struct kvb_metrics m;
static struct sink_lines out;
static struct kvb_pipeline *p;
static struct kvb_publish *pub;

struct net {
    void *zctx, *xpub;
    char ep[128];
    struct kvb_source *src;
};

/* A batch of one BlockRemoved of HASH. */
static void batch(struct mp *b, uint64_t hash)
{
    mp_init(b);
    msgpack_pack_array(&b->pk, 3);
    msgpack_pack_double(&b->pk, 1796034253.5);
    msgpack_pack_array(&b->pk, 1);
    msgpack_pack_array(&b->pk, 3);
    mp_str(b, "BlockRemoved");
    msgpack_pack_array(&b->pk, 1);
    msgpack_pack_uint64(&b->pk, hash);
    mp_str(b, "GPU");
    msgpack_pack_nil(&b->pk);
}

static void net_open(struct net *n)
{
    memset(&m, 0, sizeof(m));
    free(out.text);
    memset(&out, 0, sizeof(out));
    struct kvb_pipeline_cfg c = test_pcfg(7, 16);
    test_pipeline_create(&c, &m, &out, &pub, &p);
    memset(n, 0, sizeof(*n));
    n->zctx = zmq_ctx_new();
    ck_assert_ptr_nonnull(n->zctx);
    int linger = 0;
    n->xpub = zmq_socket(n->zctx, ZMQ_XPUB);
    ck_assert_ptr_nonnull(n->xpub);
    zmq_setsockopt(n->xpub, ZMQ_LINGER, &linger, sizeof(linger));
    ck_assert_int_eq(zmq_bind(n->xpub, "tcp://127.0.0.1:*"), 0);
    size_t sz = sizeof(n->ep);
    zmq_getsockopt(n->xpub, ZMQ_LAST_ENDPOINT, n->ep, &sz);
    struct kvb_source_params sp = {
        .endpoint = n->ep,
        .replay_endpoint = "",
        .topic = "",
        .mode = KVB_MODE_CONNECT,
        .dp_rank = 0,
        .rcvhwm = 1000,
        .replay_timeout_ms = 3000,
        .max_payload_bytes = 1 << 20,
        .pipeline = p,
    };
    ck_assert_int_eq(kvb_source_create(n->zctx, &sp, &m, &n->src), 0);
    /* the subscription reached the engine */
    uint64_t end = kvb_mono_ms() + 5000;
    for (;;) {
        ck_assert_msg(kvb_mono_ms() < end, "the SUB did not subscribe");
        zmq_pollitem_t it = {n->xpub, 0, ZMQ_POLLIN, 0};
        uint8_t msg[64];
        if (zmq_poll(&it, 1, 50) > 0 && zmq_recv(n->xpub, msg, sizeof(msg), 0) >= 1 && msg[0] == 1)
            break;
    }
}

static void net_close(struct net *n)
{
    kvb_source_destroy(&n->src);
    if (n->xpub)
        zmq_close(n->xpub);
    zmq_ctx_term(n->zctx);
    test_pipeline_destroy(&pub, &p);
    free(out.text);
    memset(&out, 0, sizeof(out));
}

static void publish(struct net *n, uint64_t seq)
{
    struct mp b;
    batch(&b, 100 + seq);
    uint8_t s8[8];
    for (int i = 0; i < 8; i++)
        s8[i] = (uint8_t)(seq >> (56 - 8 * i));
    ck_assert_int_ge(zmq_send(n->xpub, "", 0, ZMQ_SNDMORE), 0);
    ck_assert_int_ge(zmq_send(n->xpub, s8, 8, ZMQ_SNDMORE), 0);
    ck_assert_int_ge(zmq_send(n->xpub, b.sb.data, b.sb.size, 0), 0);
    mp_free(&b);
}

/* One turn of the daemon's loop for this source: poll, then the monitor
 * before the SUB (src/daemon/turn.c, read_sources()). */
static void turn(struct net *n, int ms)
{
    zmq_pollitem_t it[2] = {{kvb_source_sub(n->src), 0, ZMQ_POLLIN, 0},
                            {kvb_source_monitor(n->src), 0, ZMQ_POLLIN, 0}};
    zmq_poll(it, it[1].socket ? 2 : 1, ms);
    if (it[1].socket && (it[1].revents & ZMQ_POLLIN))
        kvb_source_read_monitor(n->src);
    if (it[0].revents & ZMQ_POLLIN)
        ck_assert_int_ge(kvb_source_read(n->src, 256), 0);
}

/* Until COND or 5 s. */
#define TURN_UNTIL(n, cond)                     \
    do {                                        \
        uint64_t end_ = kvb_mono_ms() + 5000;   \
        while (!(cond) && kvb_mono_ms() < end_) \
            turn(n, 20);                        \
    } while (0)

/* Wait (without reading anything) until SOCK has a message. */
static bool wait_input(void *sock, int ms)
{
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    return zmq_poll(&it, 1, ms) == 1;
}

static uint64_t barriers(int cause) { return kvb_get(&m.barriers_total[cause]); }

START_TEST(drop_after_queued)
{
    struct net n;
    net_open(&n);
    publish(&n, 0);
    TURN_UNTIL(&n, out.n >= 2); /* the start barrier and seq 0's event */
    ck_assert_uint_eq(out.n, 2);
    /* three more batches reach the SUB's queue, then the engine goes away */
    for (uint64_t s = 1; s <= 3; s++)
        publish(&n, s);
    int linger = 5000; /* close sends them first, then the connection ends */
    zmq_setsockopt(n.xpub, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_close(n.xpub);
    n.xpub = NULL;
    ck_assert_msg(wait_input(kvb_source_monitor(n.src), 5000), "no drop seen");
    /* the loop's order: the monitor (the drop) first, then the SUB */
    TURN_UNTIL(&n, out.n >= 5);
    ck_assert_msg(out.n == 5 && barriers(KVB_BAR_RESTART) == 0,
                  "the batches queued before the drop were judged after it: %u router "
                  "events, %" PRIu64 " restart barrier(s):\n%s",
                  out.n, barriers(KVB_BAR_RESTART), out.text);
    ck_assert_uint_eq(kvb_get(&m.batches_received_total[0]), 4);
    /* and the drop itself was applied once they were read */
    for (int i = 0; i < 10 && kvb_source_monitor(n.src) == NULL; i++)
        turn(&n, 20);
    ck_assert_ptr_nonnull(kvb_source_monitor(n.src));
    net_close(&n);
}
END_TEST

START_TEST(drop_then_new)
{
    struct net n;
    net_open(&n);
    publish(&n, 0);
    TURN_UNTIL(&n, out.n >= 2);
    ck_assert_uint_eq(out.n, 2);
    /* the engine goes away with nothing queued, and comes back on the same
     * port continuing the seq: without a replay endpoint it cannot prove it,
     * so it is a restart */
    zmq_close(n.xpub);
    ck_assert(wait_input(kvb_source_monitor(n.src), 5000));
    turn(&n, 20);
    int linger = 0;
    n.xpub = zmq_socket(n.zctx, ZMQ_XPUB);
    zmq_setsockopt(n.xpub, ZMQ_LINGER, &linger, sizeof(linger));
    uint64_t end = kvb_mono_ms() + 5000;
    while (zmq_bind(n.xpub, n.ep) != 0 && kvb_mono_ms() < end)
        zmq_poll(NULL, 0, 20);
    /* the SUB reconnects and subscribes again */
    end = kvb_mono_ms() + 5000;
    for (;;) {
        ck_assert_msg(kvb_mono_ms() < end, "the SUB did not subscribe again");
        turn(&n, 0);
        zmq_pollitem_t it = {n.xpub, 0, ZMQ_POLLIN, 0};
        uint8_t msg[64];
        if (zmq_poll(&it, 1, 20) > 0 && zmq_recv(n.xpub, msg, sizeof(msg), 0) >= 1 && msg[0] == 1)
            break;
    }
    publish(&n, 1);
    TURN_UNTIL(&n, out.n >= 4);
    ck_assert_uint_eq(barriers(KVB_BAR_RESTART), 1);
    net_close(&n);
}
END_TEST

/* A source replaced by another on the spot (a listed rank that moved,
 * src/daemon/follow.c): the new one opens, though malloc may hand it the
 * old one's address and libzmq releases the old monitor's inproc endpoint
 * in its own time; and it reports its connection. */
START_TEST(replaced_at_once)
{
    struct net n;
    net_open(&n);
    turn(&n, 50);
    ck_assert(kvb_source_connected(n.src));
    ck_assert(kvb_source_quiet(n.src));
    const char *ep, *rep, *topic;
    kvb_source_endpoints(n.src, &ep, &rep, &topic);
    ck_assert_str_eq(ep, n.ep);
    ck_assert_str_eq(rep, "");
    ck_assert_str_eq(topic, "");
    struct kvb_source_params sp = {.endpoint = n.ep,
                                   .replay_endpoint = "",
                                   .topic = "",
                                   .mode = KVB_MODE_CONNECT,
                                   .rcvhwm = 1000,
                                   .replay_timeout_ms = 3000,
                                   .max_payload_bytes = 1 << 20,
                                   .pipeline = p};
    for (int i = 0; i < 20; i++) {
        kvb_source_destroy(&n.src);
        ck_assert_int_eq(kvb_source_create(n.zctx, &sp, &m, &n.src), 0);
    }
    ck_assert(!kvb_source_connected(n.src)); /* its connection is not up yet */
    TURN_UNTIL(&n, kvb_source_connected(n.src));
    ck_assert(kvb_source_connected(n.src));
    net_close(&n);
}
END_TEST

/* Rank r's endpoint of a dp_size expansion, by rank_naming. */
START_TEST(endpoint_of_rank)
{
    static const struct {
        const char *base;
        int naming;
        uint32_t r;
        int rc;
        const char *want;
    } cases[] = {
        {"tcp://10.0.0.1:5557", KVB_RANKS_PORT, 0, 0, "tcp://10.0.0.1:5557"},
        {"tcp://10.0.0.1:5557", KVB_RANKS_PORT, 3, 0, "tcp://10.0.0.1:5560"},
        {"tcp://[::1]:5557", KVB_RANKS_TRTLLM, 1, 0, "tcp://[::1]:5558"},
        {"tcp://h:65535", KVB_RANKS_PORT, 1, -EINVAL, NULL},
        {"tcp://h:x", KVB_RANKS_PORT, 1, -EINVAL, NULL},
        {"ipc:///tmp/kv", KVB_RANKS_PORT, 1, -EINVAL, NULL},
        /* TensorRT-LLM: rank 0 plain, then _dp{r} (offset_endpoint_port) */
        {"ipc:///tmp/kv", KVB_RANKS_TRTLLM, 0, 0, "ipc:///tmp/kv"},
        {"ipc:///tmp/kv", KVB_RANKS_TRTLLM, 1, 0, "ipc:///tmp/kv_dp1"},
        {"ipc:///tmp/kv", KVB_RANKS_TRTLLM, 12, 0, "ipc:///tmp/kv_dp12"},
        {"inproc://kv", KVB_RANKS_TRTLLM, 2, 0, "inproc://kv_dp2"},
        {"", KVB_RANKS_TRTLLM, 2, 0, ""},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *ep = NULL;
        int rc = kvb_endpoint_of_rank(cases[i].base, cases[i].naming, cases[i].r, &ep);
        ck_assert_msg(rc == cases[i].rc, "%s rank %u: rc %d", cases[i].base, cases[i].r, rc);
        if (cases[i].want)
            ck_assert_str_eq(ep, cases[i].want);
        free(ep);
    }
}
END_TEST

static Suite *source_suite(void)
{
    Suite *s = suite_create("source");
    TCase *tc = tcase_create("monitor");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, drop_after_queued);
    tcase_add_test(tc, drop_then_new);
    tcase_add_test(tc, replaced_at_once);
    suite_add_tcase(s, tc);
    TCase *tn = tcase_create("naming");
    tcase_add_test(tn, endpoint_of_rank);
    suite_add_tcase(s, tn);
    return s;
}

int main(void)
{
    kvb_log_set_level(KVB_LOG_ERROR);
    return kvb_run_suite(source_suite());
}
