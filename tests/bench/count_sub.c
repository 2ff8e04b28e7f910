/* count-sub: the benchmark's NATS subscriber.  Counts messages and bytes and
 * records each message's receive time (CLOCK_MONOTONIC), parsing nothing.
 *
 *   count-sub --server URL --shm FILE --cap N [--subject SUBJ] [--ready-file F] [--events]
 *
 * --events: messages are dynamo-msgpack envelopes (docs/dynamo-event-plane.md
 * section 3); each counts as the number of RouterEvents in its payload
 * (decoded with msgpack-c), each with the message's receive time, so that
 * bench-pub's accounting by router events holds for batched output.
 *
 * Creates FILE (struct bench_shm with room for N receive times, every page
 * touched before subscribing; put it on tmpfs), subscribes,
 * flushes (the server has the subscription), sets shm->ready and writes
 * --ready-file.  bench-pub maps the same file: it reads the counters for flow
 * control and the receive times for latency.  Runs until SIGTERM/SIGINT, then
 * prints "count-sub: msgs=N bytes=N errors=N" on stdout.  Pending limits are
 * off (no client-side drops); async errors (slow consumer) are counted.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>
#include <nats/nats.h>
#include <stdbool.h>

#include "bench.h"

static struct bench_shm *shm;
static bool events_mode;

/* RouterEvents in an envelope's payload (1 when it is not an array); 0 when
 * the message is not an envelope. */
static uint64_t envelope_events(const char *data, size_t len)
{
    msgpack_unpacked u, p;
    size_t off = 0, poff = 0;
    uint64_t n = 0;
    msgpack_unpacked_init(&u);
    msgpack_unpacked_init(&p);
    if (msgpack_unpack_next(&u, data, len, &off) == MSGPACK_UNPACK_SUCCESS &&
        u.data.type == MSGPACK_OBJECT_MAP) {
        for (uint32_t i = 0; i < u.data.via.map.size; i++) {
            const msgpack_object_kv *kv = &u.data.via.map.ptr[i];
            if (kv->key.type != MSGPACK_OBJECT_STR || kv->key.via.str.size != 7 ||
                memcmp(kv->key.via.str.ptr, "payload", 7) || kv->val.type != MSGPACK_OBJECT_BIN)
                continue;
            if (msgpack_unpack_next(&p, kv->val.via.bin.ptr, kv->val.via.bin.size, &poff) ==
                MSGPACK_UNPACK_SUCCESS)
                n = p.data.type == MSGPACK_OBJECT_ARRAY ? p.data.via.array.size : 1;
        }
    }
    msgpack_unpacked_destroy(&p);
    msgpack_unpacked_destroy(&u);
    return n;
}

static void on_msg(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    int64_t now = bench_now_ns();
    uint64_t i = atomic_load_explicit(&shm->msgs, memory_order_relaxed);
    uint64_t k =
        events_mode ? envelope_events(natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg)) : 1;
    (void)nc;
    (void)sub;
    (void)closure;
    for (uint64_t j = 0; j < k; j++)
        if (i + j < shm->cap)
            atomic_store_explicit(&shm->recv_ns[i + j], now, memory_order_relaxed);
    atomic_store_explicit(&shm->wire_msgs,
                          atomic_load_explicit(&shm->wire_msgs, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    atomic_store_explicit(&shm->bytes,
                          atomic_load_explicit(&shm->bytes, memory_order_relaxed) +
                              (uint64_t)natsMsg_GetDataLength(msg),
                          memory_order_relaxed);
    /* release: a reader that sees msgs = i + 1 sees recv_ns[i] */
    atomic_store_explicit(&shm->msgs, i + k, memory_order_release);
    natsMsg_Destroy(msg);
}

static void on_error(natsConnection *nc, natsSubscription *sub, natsStatus err, void *closure)
{
    (void)nc;
    (void)sub;
    (void)closure;
    atomic_fetch_add(&shm->errors, 1);
    fprintf(stderr, "count-sub: async error: %s\n", natsStatus_GetText(err));
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"server", required_argument, NULL, 's'},
        {"subject", required_argument, NULL, 'j'},
        {"shm", required_argument, NULL, 'm'},
        {"cap", required_argument, NULL, 'c'},
        {"ready-file", required_argument, NULL, 'r'},
        {"events", no_argument, NULL, 'e'},
        {NULL, 0, NULL, 0},
    };
    const char *server = "nats://127.0.0.1:4222", *path = NULL, *ready = NULL;
    const char *subject = "namespace.dynamo.component.backend.kv_events";
    uint64_t cap = 1 << 20;
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 's': server = optarg; break;
        case 'j': subject = optarg; break;
        case 'm': path = optarg; break;
        case 'c': cap = strtoull(optarg, NULL, 10); break;
        case 'r': ready = optarg; break;
        case 'e': events_mode = true; break;
        default: return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "usage: count-sub --server URL --shm FILE --cap N [--subject S] "
                        "[--ready-file F]\n");
        return 2;
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* nats.c's threads inherit it */

    size_t maplen;
    shm = bench_shm_open(path, cap, 1, &maplen);
    if (!shm) {
        fprintf(stderr, "count-sub: %s: %s\n", path, strerror(errno));
        return 2;
    }
    /* touch every page now, not on the receive path */
    for (uint64_t i = 0; i < shm->cap; i++)
        atomic_store_explicit(&shm->recv_ns[i], 0, memory_order_relaxed);
    natsOptions *o = NULL;
    natsConnection *nc = NULL;
    natsSubscription *sub = NULL;
    natsStatus s = natsOptions_Create(&o);
    if (s == NATS_OK)
        s = natsOptions_SetURL(o, server);
    if (s == NATS_OK)
        s = natsOptions_SetErrorHandler(o, on_error, NULL);
    if (s == NATS_OK)
        s = natsConnection_Connect(&nc, o);
    if (s == NATS_OK)
        s = natsConnection_Subscribe(&sub, nc, subject, on_msg, NULL);
    if (s == NATS_OK)
        s = natsSubscription_SetPendingLimits(sub, -1, -1);
    if (s == NATS_OK)
        s = natsConnection_Flush(nc);
    if (s != NATS_OK) {
        fprintf(stderr, "count-sub: %s: %s\n", server, natsStatus_GetText(s));
        return 2;
    }
    atomic_store(&shm->ready, 1);
    if (ready) {
        FILE *f = fopen(ready, "w");
        if (f)
            fclose(f);
    }
    int sig;
    sigwait(&set, &sig);
    natsSubscription_Unsubscribe(sub);
    printf("count-sub: msgs=%" PRIu64 " bytes=%" PRIu64 " errors=%" PRIu64 "\n",
           atomic_load(&shm->msgs), atomic_load(&shm->bytes), atomic_load(&shm->errors));
    natsSubscription_Destroy(sub);
    natsConnection_Destroy(nc);
    natsOptions_Destroy(o);
    nats_Close();
    bench_shm_close(shm, maplen);
    return 0;
}
