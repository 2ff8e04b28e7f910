/* capture: record an engine's (kvsim's) live stream to a capture file, so
 * that bench-pub can replay exactly those batches without paying for their
 * generation during a measurement.
 *
 *   capture --endpoint EP --out FILE --count N [--skip N] [--timeout-ms MS]
 *
 * Connects a SUB to EP, expects 3-frame messages [topic][seq:8][payload] with
 * contiguous seqs, skips the first --skip payloads (the generator's warm-up:
 * kvsim's cache starts empty), writes the next --count.  Exit 0 on success,
 * 1 on a gap, bad frames or timeout, 2 on usage errors.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "bench.h"

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"endpoint", required_argument, NULL, 'e'},   {"out", required_argument, NULL, 'o'},
        {"count", required_argument, NULL, 'n'},      {"skip", required_argument, NULL, 's'},
        {"timeout-ms", required_argument, NULL, 't'}, {NULL, 0, NULL, 0},
    };
    const char *ep = NULL, *out = NULL;
    unsigned long long count = 0, skip = 0, timeout_ms = 20000;
    int c, rc = 1;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'e': ep = optarg; break;
        case 'o': out = optarg; break;
        case 'n': count = strtoull(optarg, NULL, 10); break;
        case 's': skip = strtoull(optarg, NULL, 10); break;
        case 't': timeout_ms = strtoull(optarg, NULL, 10); break;
        default: return 2;
        }
    }
    if (!ep || !out || !count) {
        fprintf(stderr, "usage: capture --endpoint EP --out FILE --count N [--skip N] "
                        "[--timeout-ms MS]\n");
        return 2;
    }

    void *ctx = zmq_ctx_new();
    void *sub = zmq_socket(ctx, ZMQ_SUB);
    int zero = 0, tmo = 200;
    zmq_setsockopt(sub, ZMQ_RCVHWM, &zero, sizeof(zero));
    zmq_setsockopt(sub, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(sub, ZMQ_RCVTIMEO, &tmo, sizeof(tmo));
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
    if (zmq_connect(sub, ep) < 0) {
        fprintf(stderr, "capture: connect %s: %s\n", ep, zmq_strerror(errno));
        return 2;
    }

    struct bench_set set = {0};
    uint64_t got = 0, next_seq = 0;
    int64_t deadline = bench_now_ns() + (int64_t)timeout_ms * 1000000;
    bool first = true;
    while (set.n < count) {
        zmq_msg_t f[3];
        int nf = 0, more = 1;
        while (more) {
            zmq_msg_t tmp, *m = nf < 3 ? &f[nf] : &tmp;
            zmq_msg_init(m);
            if (zmq_msg_recv(m, sub, 0) < 0) {
                zmq_msg_close(m);
                if (nf == 0 && errno == EAGAIN) {
                    if (bench_now_ns() > deadline) {
                        fprintf(stderr, "capture: timeout after %" PRIu64 " messages\n", got);
                        goto out;
                    }
                    more = -1;
                    break;
                }
                fprintf(stderr, "capture: recv: %s\n", zmq_strerror(errno));
                goto out;
            }
            more = zmq_msg_more(m);
            if (m == &tmp)
                zmq_msg_close(&tmp);
            nf++;
        }
        if (more < 0)
            continue;
        if (nf != 3 || zmq_msg_size(&f[1]) != 8) {
            fprintf(stderr, "capture: unexpected message (%d frames)\n", nf);
            goto out;
        }
        const uint8_t *s8 = zmq_msg_data(&f[1]);
        uint64_t seq = 0;
        for (int i = 0; i < 8; i++)
            seq = seq << 8 | s8[i];
        if (first) {
            if (seq != 0) {
                fprintf(stderr, "capture: joined late (first seq %" PRIu64 ")\n", seq);
                goto out;
            }
            first = false;
        } else if (seq != next_seq) {
            fprintf(stderr, "capture: gap: seq %" PRIu64 " after %" PRIu64 "\n", seq, next_seq - 1);
            goto out;
        }
        next_seq = seq + 1;
        if (got++ >= skip && bench_set_add(&set, zmq_msg_data(&f[2]), zmq_msg_size(&f[2])) < 0) {
            fprintf(stderr, "capture: out of memory\n");
            goto out;
        }
        for (int i = 0; i < 3; i++)
            zmq_msg_close(&f[i]);
    }
    if (bench_set_save(out, &set) < 0) {
        fprintf(stderr, "capture: cannot write %s\n", out);
        goto out;
    }
    fprintf(stderr, "capture: %zu batches, %zu bytes -> %s\n", set.n, set.blob_len, out);
    rc = 0;
out:
    bench_set_free(&set);
    zmq_close(sub);
    zmq_ctx_term(ctx);
    return rc;
}
