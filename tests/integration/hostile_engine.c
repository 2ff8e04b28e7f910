/* hostile_engine: a hostile engine for the integration tests.
 *
 *   hostile_engine MODE [options]
 *
 * Replay modes (a PUB bound at --pub, a replay ROUTER bound at --router): the
 * live stream sends seq 0..9 at --rate batches/s, then jumps to --gap-to (a
 * gap kvbridge asks the ROUTER for) and carries on until --seconds ran out.
 * Live batches store block hash 1000000 + seq.  The ROUTER answers each
 * request by MODE:
 *   flood    in-range batches flat out for --flood-ms, each --fat events (slow
 *            to convert, big to publish), never END
 *   trickle  one in-range batch every 200 ms, never END
 *
 * Live modes (a PUB that connects to --pub: kvbridge binds):
 *   topics   --topics N streams, topic "t<i>", each one batch per round
 *            (--rounds), then after --pause-ms, --tail more batches on topic
 *            --tail-topic (default "t0"; seq from 0 on another topic)
 *   ranks    one stream, every batch with a new dp_rank (0, 1, 2, ...): --count
 *            batches
 *   partial  --peers N raw TCP connections speaking ZMTP 3.0 (NULL, a PUB):
 *            each announces a frame of --decl-mb MiB, sends --send-mb MiB of it
 *            and stalls until --seconds ran out
 *   many     --peers N ZMQ PUB sockets connect to --pub at once and hold on
 *            for --seconds; libzmq connects each again 10 ms after kvbridge
 *            closes it (sources[].max_peers), the way attack_live.py's
 *            bind_many peers do
 *
 * Prints "sent live=N last=S" when done (and "peers=N" in partial mode).
 * Stops on SIGTERM/SIGINT.  Payloads are built with msgpack-c.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <msgpack.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

static volatile sig_atomic_t stop;
static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A vLLM batch: [ts, [["BlockStored", [h0..], nil, tokens, 16, nil, "GPU"] x n_events],
 * dp_rank?] with n_events events of one block each (hashes h, h+1, ...). */
static void batch(msgpack_sbuffer *sb, uint64_t h, int n_events, long rank)
{
    msgpack_sbuffer_clear(sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, rank >= 0 ? 3 : 2);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    msgpack_pack_double(&pk, (double)ts.tv_sec + ts.tv_nsec / 1e9);
    msgpack_pack_array(&pk, (size_t)n_events);
    for (int e = 0; e < n_events; e++) {
        msgpack_pack_array(&pk, 7);
        msgpack_pack_str_with_body(&pk, "BlockStored", 11);
        msgpack_pack_array(&pk, 1);
        msgpack_pack_uint64(&pk, h + (uint64_t)e);
        msgpack_pack_nil(&pk);
        msgpack_pack_array(&pk, 16);
        for (int t = 0; t < 16; t++)
            msgpack_pack_int(&pk, t);
        msgpack_pack_int(&pk, 16);
        msgpack_pack_nil(&pk);
        msgpack_pack_str_with_body(&pk, "GPU", 3);
    }
    if (rank >= 0)
        msgpack_pack_long(&pk, rank);
}

static void be64(uint8_t out[8], uint64_t v)
{
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)(v >> (56 - 8 * i));
}

static int send3(void *sock, const void *topic, size_t tl, uint64_t seq, const void *p, size_t n)
{
    uint8_t s[8];
    be64(s, seq);
    if (zmq_send(sock, topic, tl, ZMQ_SNDMORE) < 0 || zmq_send(sock, s, 8, ZMQ_SNDMORE) < 0 ||
        zmq_send(sock, p, n, 0) < 0)
        return -1;
    return 0;
}

struct opts {
    const char *mode, *pub, *router, *tail_topic;
    double rate;
    uint64_t gap_to;
    long seconds, flood_ms, fat, topics, rounds, tail, count, peers, decl_mb, send_mb, pause_ms;
};

/* ---- replay modes ------------------------------------------------------- */

struct answer {
    uint8_t ident[256];
    size_t ident_len;
    uint64_t next;    /* next seq to send */
    long long end_ms; /* flood: stop then */
    long long due_ms; /* trickle: next send */
    int active;
};

static int run_replay(const struct opts *o)
{
    void *ctx = zmq_ctx_new();
    void *pub = zmq_socket(ctx, ZMQ_PUB), *router = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(pub, ZMQ_SNDHWM, &zero, sizeof(zero));
    zmq_setsockopt(router, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(pub, ZMQ_LINGER, &zero, sizeof(zero));
    if (zmq_bind(pub, o->pub) < 0 || zmq_bind(router, o->router) < 0) {
        fprintf(stderr, "hostile_engine: bind: %s\n", zmq_strerror(zmq_errno()));
        return 2;
    }
    msgpack_sbuffer live, rep;
    msgpack_sbuffer_init(&live);
    msgpack_sbuffer_init(&rep);
    batch(&rep, 5000000, (int)o->fat, -1); /* the same fat batch every time */
    struct answer a = {0};
    uint64_t seq = 0, sent = 0, requests = 0;
    long long t0 = now_ms(), end = t0 + o->seconds * 1000, next_live = t0;
    long period = o->rate > 0 ? (long)(1000.0 / o->rate) : 1000;
    printf("listening\n");
    fflush(stdout);
    while (!stop && now_ms() < end) {
        long long now = now_ms();
        if (now >= next_live) {
            if (seq == 10)
                seq = o->gap_to;
            batch(&live, 1000000 + seq, 1, -1);
            if (send3(pub, "", 0, seq, live.data, live.size) == 0)
                sent++;
            seq++;
            next_live += period;
        }
        /* a request: ["ident", "", start(8)] */
        zmq_msg_t m;
        zmq_msg_init(&m);
        while (zmq_msg_recv(&m, router, ZMQ_DONTWAIT) >= 0) {
            size_t part = 0;
            uint8_t ident[256];
            size_t il = 0;
            uint64_t start = 0;
            for (;;) {
                if (part == 0) {
                    il = zmq_msg_size(&m) < sizeof(ident) ? zmq_msg_size(&m) : sizeof(ident);
                    memcpy(ident, zmq_msg_data(&m), il);
                } else if (zmq_msg_size(&m) == 8) {
                    const uint8_t *d = zmq_msg_data(&m);
                    for (int i = 0; i < 8; i++)
                        start = start << 8 | d[i];
                }
                part++;
                if (!zmq_msg_more(&m))
                    break;
                if (zmq_msg_recv(&m, router, 0) < 0)
                    break;
            }
            requests++;
            memcpy(a.ident, ident, il);
            a.ident_len = il;
            a.next = start;
            a.active = 1;
            a.end_ms = now_ms() + o->flood_ms;
            a.due_ms = now_ms();
            printf("request from %llu\n", (unsigned long long)start);
            fflush(stdout);
        }
        zmq_msg_close(&m);
        if (a.active && !strcmp(o->mode, "flood")) {
            /* flat out until the next live batch is due */
            while (!stop && now_ms() < a.end_ms && now_ms() < next_live) {
                uint8_t s[8];
                be64(s, a.next++);
                if (zmq_send(router, a.ident, a.ident_len, ZMQ_SNDMORE) < 0 ||
                    zmq_send(router, "", 0, ZMQ_SNDMORE) < 0 ||
                    zmq_send(router, s, 8, ZMQ_SNDMORE) < 0 ||
                    zmq_send(router, rep.data, rep.size, 0) < 0)
                    break;
            }
            if (now_ms() >= a.end_ms)
                a.active = 0;
        } else if (a.active && !strcmp(o->mode, "trickle") && now >= a.due_ms) {
            uint8_t s[8];
            be64(s, a.next++);
            batch(&live, 2000000 + a.next, 1, -1);
            zmq_send(router, a.ident, a.ident_len, ZMQ_SNDMORE);
            zmq_send(router, "", 0, ZMQ_SNDMORE);
            zmq_send(router, s, 8, ZMQ_SNDMORE);
            zmq_send(router, live.data, live.size, 0);
            a.due_ms = now + 200;
        }
        long long wait = next_live - now_ms();
        if (wait > 5)
            wait = 5;
        if (wait > 0)
            sleep_ms((long)wait);
    }
    printf("sent live=%llu last=%llu requests=%llu\n", (unsigned long long)sent,
           (unsigned long long)(seq - 1), (unsigned long long)requests);
    fflush(stdout);
    msgpack_sbuffer_destroy(&live);
    msgpack_sbuffer_destroy(&rep);
    zmq_close(pub);
    zmq_close(router);
    zmq_ctx_term(ctx);
    return 0;
}

/* ---- live modes (kvbridge binds) ---------------------------------------- */

static int run_live(const struct opts *o)
{
    void *ctx = zmq_ctx_new();
    void *pub = zmq_socket(ctx, ZMQ_PUB);
    int zero = 0;
    zmq_setsockopt(pub, ZMQ_SNDHWM, &zero, sizeof(zero));
    zmq_setsockopt(pub, ZMQ_LINGER, &zero, sizeof(zero));
    if (zmq_connect(pub, o->pub) < 0) {
        fprintf(stderr, "hostile_engine: connect: %s\n", zmq_strerror(zmq_errno()));
        return 2;
    }
    sleep_ms(500); /* the subscription reaches the PUB */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    uint64_t sent = 0, last = 0;
    long period = o->rate > 0 ? (long)(1000.0 / o->rate) : 0;
    if (!strcmp(o->mode, "topics")) {
        uint64_t seq0 = 0;
        for (long r = 0; r < o->rounds && !stop; r++) {
            for (long t = 0; t < o->topics && !stop; t++) {
                char topic[32];
                int tl = snprintf(topic, sizeof(topic), "t%ld", t);
                batch(&sb, 1000000 + (uint64_t)t * 1000 + (uint64_t)r, 1, -1);
                send3(pub, topic, (size_t)tl, (uint64_t)r, sb.data, sb.size);
                sent++;
            }
            seq0 = (uint64_t)r + 1;
            if (period)
                sleep_ms(period);
        }
        if (strcmp(o->tail_topic, "t0") != 0)
            seq0 = 0;
        sleep_ms(o->pause_ms);
        for (long k = 0; k < o->tail && !stop; k++) {
            batch(&sb, 3000000 + (uint64_t)k, 1, -1);
            send3(pub, o->tail_topic, strlen(o->tail_topic), seq0 + (uint64_t)k, sb.data, sb.size);
            sent++;
            last = seq0 + (uint64_t)k;
            if (period)
                sleep_ms(period);
        }
    } else { /* ranks */
        for (long k = 0; k < o->count && !stop; k++) {
            batch(&sb, 4000000 + (uint64_t)k, 1, k);
            send3(pub, "", 0, (uint64_t)k, sb.data, sb.size);
            sent++;
            last = (uint64_t)k;
            if (period)
                sleep_ms(period);
        }
    }
    sleep_ms(200);
    printf("sent live=%llu last=%llu\n", (unsigned long long)sent, (unsigned long long)last);
    fflush(stdout);
    msgpack_sbuffer_destroy(&sb);
    zmq_close(pub);
    zmq_ctx_term(ctx);
    return 0;
}

/* ---- raw ZMTP peers that leave a frame unfinished ------------------------ */

static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static int run_partial(const struct opts *o)
{
    const char *hp = strstr(o->pub, "://");
    const char *colon = strrchr(o->pub, ':');
    if (!hp || !colon)
        return 2;
    int port = atoi(colon + 1);
    /* ZMTP 3.0 greeting: signature, version 3.0, mechanism NULL, as-server 0 */
    uint8_t greet[64] = {0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0, 'N', 'U', 'L', 'L'};
    static const uint8_t ready[] = {0x04, 25,  5,   'R', 'E', 'A', 'D', 'Y', 11,
                                    'S',  'o', 'c', 'k', 'e', 't', '-', 'T', 'y',
                                    'p',  'e', 0,   0,   0,   3,   'P', 'U', 'B'};
    static char chunk[1 << 20];
    memset(chunk, 'x', sizeof(chunk));
    int *fds = calloc((size_t)o->peers, sizeof(int));
    long up = 0;
    for (long i = 0; i < o->peers && !stop; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
        fds[i] = fd;
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || write_all(fd, greet, 64) < 0)
            continue;
        uint8_t their[64];
        size_t got = 0;
        struct timeval tv = {2, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        while (got < 64) {
            ssize_t r = read(fd, their + got, 64 - got);
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        uint8_t hdr[9] = {0x02}; /* a long, last frame */
        uint64_t decl = (uint64_t)o->decl_mb << 20;
        for (int k = 0; k < 8; k++)
            hdr[1 + k] = (uint8_t)(decl >> (56 - 8 * k));
        /* a message of one frame (kvbridge wants 3: this one is never
         * finished anyway) */
        if (write_all(fd, ready, sizeof(ready)) < 0 || write_all(fd, hdr, 9) < 0)
            continue;
        long mb = 0;
        for (; mb < o->send_mb && !stop; mb++)
            if (write_all(fd, chunk, sizeof(chunk)) < 0)
                break;
        if (mb == o->send_mb)
            up++;
        else
            printf("peer %ld cut after %ld MiB\n", i, mb);
    }
    printf("peers=%ld\n", up);
    fflush(stdout);
    long long end = now_ms() + o->seconds * 1000;
    while (!stop && now_ms() < end)
        sleep_ms(50);
    for (long i = 0; i < o->peers; i++)
        if (fds[i] > 0)
            close(fds[i]);
    free(fds);
    return 0;
}

static int run_many(const struct opts *o)
{
    void *ctx = zmq_ctx_new();
    void **socks = calloc((size_t)o->peers, sizeof(void *));
    int ivl = 10, zero = 0;
    long up = 0;
    for (long i = 0; socks && i < o->peers; i++) {
        socks[i] = zmq_socket(ctx, ZMQ_PUB);
        zmq_setsockopt(socks[i], ZMQ_RECONNECT_IVL, &ivl, sizeof(ivl));
        zmq_setsockopt(socks[i], ZMQ_LINGER, &zero, sizeof(zero));
        up += zmq_connect(socks[i], o->pub) == 0;
    }
    printf("peers=%ld\n", up);
    fflush(stdout);
    long long end = now_ms() + o->seconds * 1000;
    while (!stop && now_ms() < end)
        sleep_ms(50);
    for (long i = 0; socks && i < o->peers; i++)
        zmq_close(socks[i]);
    free(socks);
    zmq_ctx_term(ctx);
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o = {.rate = 50,
                     .gap_to = 20,
                     .seconds = 10,
                     .flood_ms = 5000,
                     .fat = 2000,
                     .topics = 100,
                     .rounds = 3,
                     .tail = 50,
                     .count = 1000,
                     .peers = 10,
                     .decl_mb = 250,
                     .send_mb = 200,
                     .tail_topic = "t0"};
    if (argc < 2) {
        fprintf(stderr,
                "usage: hostile_engine flood|trickle|topics|ranks|partial|many [options]\n");
        return 2;
    }
    o.mode = argv[1];
    for (int i = 2; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--pub"))
            o.pub = v;
        else if (!strcmp(k, "--router"))
            o.router = v;
        else if (!strcmp(k, "--rate"))
            o.rate = atof(v);
        else if (!strcmp(k, "--gap-to"))
            o.gap_to = strtoull(v, NULL, 10);
        else if (!strcmp(k, "--seconds"))
            o.seconds = atol(v);
        else if (!strcmp(k, "--flood-ms"))
            o.flood_ms = atol(v);
        else if (!strcmp(k, "--fat"))
            o.fat = atol(v);
        else if (!strcmp(k, "--topics"))
            o.topics = atol(v);
        else if (!strcmp(k, "--rounds"))
            o.rounds = atol(v);
        else if (!strcmp(k, "--tail"))
            o.tail = atol(v);
        else if (!strcmp(k, "--count"))
            o.count = atol(v);
        else if (!strcmp(k, "--peers"))
            o.peers = atol(v);
        else if (!strcmp(k, "--decl-mb"))
            o.decl_mb = atol(v);
        else if (!strcmp(k, "--send-mb"))
            o.send_mb = atol(v);
        else if (!strcmp(k, "--pause-ms"))
            o.pause_ms = atol(v);
        else if (!strcmp(k, "--tail-topic"))
            o.tail_topic = v;
        else {
            fprintf(stderr, "hostile_engine: unknown option %s\n", k);
            return 2;
        }
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!o.pub)
        return 2;
    if (!strcmp(o.mode, "flood") || !strcmp(o.mode, "trickle"))
        return o.router ? run_replay(&o) : 2;
    if (!strcmp(o.mode, "topics") || !strcmp(o.mode, "ranks"))
        return run_live(&o);
    if (!strcmp(o.mode, "partial"))
        return run_partial(&o);
    if (!strcmp(o.mode, "many"))
        return run_many(&o);
    fprintf(stderr, "hostile_engine: unknown mode %s\n", o.mode);
    return 2;
}
