/* pipeline-bench: the pure pipeline (decode -> convert -> encode) in process,
 * over pre-encoded batches, behind the daemon's sequence rules and in front
 * of its publish stage without a sink (a writer that only sums lengths).
 *
 *   pipeline-bench --mix decode|prefill|realistic [--capture FILE]
 *                  [--format dynamo-json|dynamo-msgpack]
 *                  [--batches N] [--passes P] [--stats]
 *
 * The batches are self-encoded (benchgen.c, shapes as kvsim), or read from a
 * capture of kvsim's stream (--capture).  One warm-up pass over the first
 * batches (start barrier, buffers grown), then run_measured() feeds every
 * batch P times through the daemon's sequence rules (kvb_replay_live(), no
 * replay endpoint) and the pipeline, with consecutive seqs.  Under
 *   valgrind --tool=callgrind --collect-atstart=no --toggle-collect=run_measured
 * only run_measured() is counted: Ir / engine_events is the instruction cost
 * per event (tests/bench/callgrind.sh prints it).  Natively, ns_per_event is
 * the wall time per engine event.
 *
 * The router events go to the daemon's publish stage (publish.h), sink-less:
 * its writer only sums the messages' lengths.  --format dynamo-msgpack: the
 * event-plane batcher (batch: true, residency_domain as the daemon's
 * default), a message cut at every engine batch, as the daemon does;
 * out_bytes and msgs are then the envelopes'.
 *
 * Prints one line:
 *   mix=M format=F source=S batches=N engine_events=E router_events=R
 *   msgs=K out_bytes=B in_bytes=I ns_per_event=X
 * --stats prints the batch shapes instead (events per batch by type, blocks
 * per store, hashes per remove, bytes per batch), to compare the self-encoded
 * mixes with kvsim's.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "config.h"
#include "decode.h"
#include "metrics.h"
#include "pipeline.h"
#include "publish.h"
#include "replay.h"

struct sink {
    uint64_t msgs, bytes;
};

/* The publish stage's writer: messages and their bytes. */
static int write_msg(void *ctx, const struct kvb_publish_msg *msg)
{
    struct sink *k = ctx;
    k->msgs++;
    k->bytes += msg->len;
    return 0;
}

/* Router events published so far (the converter's counter). */
static uint64_t revs_of(const struct kvb_metrics *m)
{
    uint64_t n = 0;
    for (int t = 0; t < KVB_REVT__COUNT; t++)
        n += kvb_get(&m->router_events_published_total[t]);
    return n;
}

struct run {
    struct kvb_publish *pub;
    struct kvb_pipeline *p;
    struct kvb_replay *rules;
    struct kvb_stream st;
    struct sink *sink;
    uint64_t seq;
    int errors;
};

__attribute__((noinline)) static void feed(struct run *r, const struct bench_set *set,
                                           unsigned passes)
{
    for (unsigned k = 0; k < passes; k++)
        for (size_t i = 0; i < set->n; i++) {
            if (kvb_replay_live(r->rules, &r->st, r->seq++, bench_set_data(set, i),
                                bench_set_len(set, i), 0) < 0)
                r->errors++;
        }
    kvb_publish_flush(r->pub); /* the last batch's message */
}

/* The measured region: keep it a real function (callgrind toggles on it). */
__attribute__((noinline)) static void run_measured(struct run *r, const struct bench_set *set,
                                                   unsigned passes)
{
    feed(r, set, passes);
    __asm__ volatile("" ::: "memory"); /* no tail call: the frame stays */
}

static void stats(const char *mix, const char *source, const struct bench_set *set)
{
    struct kvb_decoder *d = kvb_decoder_create(NULL);
    uint64_t ev[5] = {0}, blocks = 0, rm_hashes = 0, empty = 0, cpu = 0, g1 = 0, nilmed = 0,
             lora = 0;
    for (size_t i = 0; i < set->n; i++) {
        struct kvb_batch b;
        if (kvb_decode_batch(d, bench_set_data(set, i), bench_set_len(set, i), &b) < 0)
            continue;
        if (b.n_events == 0)
            empty++;
        for (uint32_t j = 0; j < b.n_events; j++) {
            const struct kvb_event *e = &b.events[j];
            ev[e->type < 5 ? e->type : 4]++;
            if (e->type == KVB_EV_STORED) {
                blocks += e->n_hashes;
                if (e->lora_name.ptr)
                    lora++;
            }
            if (e->type == KVB_EV_REMOVED)
                rm_hashes += e->n_hashes;
            if (e->type == KVB_EV_STORED || e->type == KVB_EV_REMOVED) {
                if (!e->medium.ptr)
                    nilmed++;
                else if (e->medium.len == 3 && !memcmp(e->medium.ptr, "CPU", 3))
                    cpu++;
                if (e->group_idx.has && e->group_idx.v)
                    g1++;
            }
        }
    }
    double n = (double)set->n;
    printf("shape mix=%s source=%s batches=%zu bytes/batch=%.0f events/batch=%.3f "
           "stored/batch=%.3f removed/batch=%.3f cleared/batch=%.4f empty=%.1f%% "
           "blocks/store=%.2f hashes/remove=%.2f cpu_tier=%.1f%% group1=%.1f%% "
           "nil_medium=%.1f%% lora_stores=%.1f%%\n",
           mix, source, set->n, (double)set->blob_len / n, (double)(ev[0] + ev[1] + ev[2]) / n,
           (double)ev[0] / n, (double)ev[1] / n, (double)ev[2] / n, 100.0 * (double)empty / n,
           ev[0] ? (double)blocks / (double)ev[0] : 0,
           ev[1] ? (double)rm_hashes / (double)ev[1] : 0,
           100.0 * (double)cpu / (double)(ev[0] + ev[1] + !(ev[0] + ev[1])),
           100.0 * (double)g1 / (double)(ev[0] + ev[1] + !(ev[0] + ev[1])),
           100.0 * (double)nilmed / (double)(ev[0] + ev[1] + !(ev[0] + ev[1])),
           100.0 * (double)lora / (double)(ev[0] + !ev[0]));
    kvb_decoder_destroy(&d);
}

static uint64_t engine_events(const struct bench_set *set)
{
    struct kvb_decoder *d = kvb_decoder_create(NULL);
    uint64_t n = 0;
    for (size_t i = 0; i < set->n; i++) {
        struct kvb_batch b;
        if (kvb_decode_batch(d, bench_set_data(set, i), bench_set_len(set, i), &b) == 0)
            n += b.n_events;
    }
    kvb_decoder_destroy(&d);
    return n;
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"mix", required_argument, NULL, 'm'},
        {"capture", required_argument, NULL, 'c'},
        {"batches", required_argument, NULL, 'n'},
        {"passes", required_argument, NULL, 'p'},
        {"stats", no_argument, NULL, 's'},
        {"format", required_argument, NULL, 'f'},
        {NULL, 0, NULL, 0},
    };
    const char *mix = "decode", *capture = NULL, *format = "dynamo-json";
    size_t nb = 0;
    unsigned passes = 1;
    int c, do_stats = 0, rc = 1;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'm': mix = optarg; break;
        case 'c': capture = optarg; break;
        case 'n': nb = strtoull(optarg, NULL, 10); break;
        case 'p': passes = (unsigned)strtoul(optarg, NULL, 10); break;
        case 's': do_stats = 1; break;
        case 'f': format = optarg; break;
        default: return 2;
        }
    }
    int fmt = !strcmp(format, "dynamo-json")      ? KVB_FORMAT_DYNAMO_JSON
              : !strcmp(format, "dynamo-msgpack") ? KVB_FORMAT_DYNAMO_MSGPACK
                                                  : -1;
    if (fmt < 0) {
        fprintf(stderr, "pipeline-bench: --format dynamo-json or dynamo-msgpack\n");
        return 2;
    }
    if (!nb)
        nb = !strcmp(mix, "prefill") ? 4000 : 20000;
    if (!passes)
        passes = 1;

    struct bench_set set = {0};
    int r = capture ? bench_set_load(capture, nb, &set) : benchgen_make(mix, nb, 1, &set);
    if (r < 0) {
        fprintf(stderr, "pipeline-bench: %s: %s\n", capture ? capture : mix, strerror(-r));
        return 2;
    }
    if (do_stats) {
        stats(mix, capture ? "kvsim-capture" : "self-encoded", &set);
        bench_set_free(&set);
        return 0;
    }

    static struct kvb_metrics m;
    struct sink sink = {0};
    struct run run = {.sink = &sink};
    struct kvb_pipeline_cfg cfg = {
        .convert = {.worker_id = 7,
                    .block_size = 16,
                    .lora_salt = true,
                    .forward_tiers = 1u << KVB_TIER_DEVICE},
        .limits = KVB_DECODE_LIMITS_DEFAULT,
    };
    struct kvb_publish_cfg uc = {.format = fmt,
                                 .subject = "bench",
                                 .namespace_ = "",
                                 .component = "",
                                 .endpoint = "",
                                 .batch = true,
                                 .residency_domain = true};
    struct kvb_publish_writer w = {.write = write_msg, .ctx = &sink, .now_ms = 1767225600000ULL};
    if (kvb_publish_create(&uc, &m, 1, &run.pub) < 0) {
        fprintf(stderr, "pipeline-bench: cannot create the publish stage\n");
        goto out;
    }
    kvb_publish_set_writer(run.pub, &w);
    if (kvb_pipeline_create(&cfg, &m, run.pub, &run.p) < 0) {
        fprintf(stderr, "pipeline-bench: cannot create the pipeline\n");
        goto out;
    }
    struct kvb_replay_cfg rcfg = {.name = "bench", .endpoint = ""};
    struct kvb_seq_ops ops = kvb_pipeline_seq_ops(run.p);
    if (kvb_replay_create(&rcfg, &m, &ops, NULL, &run.rules) < 0) {
        fprintf(stderr, "pipeline-bench: cannot create the sequence rules\n");
        goto out;
    }
    kvb_stream_init(&run.st, "bench", 0);

    /* warm-up: the start barrier, the arena and the scratch buffers */
    struct bench_set warm = set;
    warm.n = set.n < 2000 ? set.n : 2000;
    feed(&run, &warm, 1);
    sink.msgs = sink.bytes = 0;
    uint64_t revs0 = revs_of(&m);

    uint64_t ev = engine_events(&set) * passes;
    int64_t t0 = bench_now_ns();
    run_measured(&run, &set, passes);
    int64_t t1 = bench_now_ns();
    if (run.errors) {
        fprintf(stderr, "pipeline-bench: %d batches failed\n", run.errors);
        goto out;
    }
    printf("mix=%s format=%s source=%s batches=%zu engine_events=%" PRIu64 " router_events=%" PRIu64
           " msgs=%" PRIu64 " out_bytes=%" PRIu64 " in_bytes=%zu ns_per_event=%.1f\n",
           mix, format, capture ? "kvsim-capture" : "self-encoded", set.n * passes, ev,
           revs_of(&m) - revs0, sink.msgs, sink.bytes, set.blob_len * passes,
           ev ? (double)(t1 - t0) / (double)ev : 0.0);
    rc = 0;
out:
    kvb_replay_destroy(&run.rules);
    kvb_pipeline_destroy(&run.p);
    kvb_publish_destroy(&run.pub);
    bench_set_free(&set);
    return rc;
}
