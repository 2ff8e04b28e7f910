/* forwarder: the benchmark's baseline.  The least a bridge can do: ZMQ SUB ->
 * publish the raw payload frame to NATS with nats.c, no decoding, no
 * conversion, no sequence checks.  Same transport settings as kvbridge (SUB
 * connects, RCVHWM 1000000, nats.c default buffered publishing), so the
 * difference in the table is kvbridge's own work.
 *
 *   forwarder --endpoint EP --server URL [--subject SUBJ] [--send-asap]
 *
 * --send-asap: natsOptions_SetSendAsap(true), every publish is written to the
 * socket at once instead of by nats.c's flusher thread (which waits about
 * 1 ms to coalesce): what-if data point for latency and idle CPU.
 *
 * Runs until SIGTERM/SIGINT, flushes, prints "forwarder: msgs=N bytes=N".
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include <nats/nats.h>

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"endpoint", required_argument, NULL, 'e'},
        {"server", required_argument, NULL, 's'},
        {"subject", required_argument, NULL, 'j'},
        {"send-asap", no_argument, NULL, 'a'},
        {NULL, 0, NULL, 0},
    };
    const char *ep = NULL, *server = "nats://127.0.0.1:4222";
    const char *subject = "namespace.dynamo.component.backend.kv_events";
    int c, asap = 0;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'e': ep = optarg; break;
        case 's': server = optarg; break;
        case 'j': subject = optarg; break;
        case 'a': asap = 1; break;
        default: return 2;
        }
    }
    if (!ep) {
        fprintf(stderr, "usage: forwarder --endpoint EP --server URL [--subject S]\n");
        return 2;
    }

    /* Signals go to the main thread only (blocked while nats.c and ZMQ start
     * their threads), so that a blocked recv returns EINTR. */
    struct sigaction sa;
    sigset_t set;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal; /* no SA_RESTART */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    natsConnection *nc = NULL;
    natsOptions *o = NULL;
    natsStatus s = natsOptions_Create(&o);
    if (s == NATS_OK)
        s = natsOptions_SetURL(o, server);
    if (s == NATS_OK && asap)
        s = natsOptions_SetSendAsap(o, true);
    if (s == NATS_OK)
        s = natsConnection_Connect(&nc, o);
    if (s != NATS_OK) {
        fprintf(stderr, "forwarder: %s: %s\n", server, natsStatus_GetText(s));
        return 2;
    }

    void *ctx = zmq_ctx_new();
    void *sub = zmq_socket(ctx, ZMQ_SUB);
    int hwm = 1000000, zero = 0;
    zmq_setsockopt(sub, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(sub, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
    if (zmq_connect(sub, ep) < 0) {
        fprintf(stderr, "forwarder: connect %s: %s\n", ep, zmq_strerror(errno));
        return 2;
    }
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    printf("forwarder: running\n");
    fflush(stdout);

    uint64_t msgs = 0, bytes = 0, errors = 0;
    zmq_msg_t m;
    zmq_msg_init(&m);
    while (!stop) {
        /* the payload is the last frame of the message */
        if (zmq_msg_recv(&m, sub, 0) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (zmq_msg_more(&m))
            continue;
        if (natsConnection_Publish(nc, subject, zmq_msg_data(&m), (int)zmq_msg_size(&m)) != NATS_OK)
            errors++;
        msgs++;
        bytes += zmq_msg_size(&m);
    }
    zmq_msg_close(&m);
    natsConnection_FlushTimeout(nc, 5000);
    printf("forwarder: msgs=%" PRIu64 " bytes=%" PRIu64 " errors=%" PRIu64 "\n", msgs, bytes,
           errors);
    zmq_close(sub);
    zmq_ctx_term(ctx);
    natsConnection_Destroy(nc);
    natsOptions_Destroy(o);
    nats_Close();
    return 0;
}
