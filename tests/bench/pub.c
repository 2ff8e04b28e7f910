/* bench-pub: the benchmark's engine.  Publishes pre-encoded batches (a kvsim
 * capture, or benchgen's self-encoded mixes) on a ZMQ PUB socket exactly as
 * an engine does ([topic ""][seq:8 BE][payload], seqs contiguous), and
 * measures, through the shared memory of count-sub (bench.h), what reached
 * the NATS subscriber.
 *
 *   bench-pub --endpoint EP --shm FILE (--capture FILE | --mix M) --expect kvbridge|raw
 *             [--rate R] [--window N] [--warmup-s S] [--duration-s S]
 *             [--total-events N] [--watch-pid PID] [--own-pids PID,...] [--label L]
 *             [--lat-dump FILE]
 *
 * 1. Knows how many NATS messages each batch must produce: one for the raw
 *    forwarder, the router events kvbridge's pipeline emits for it (counted
 *    once at start with libkvb's pipeline, same settings as run.sh's config:
 *    block_size 16, forward_tiers [device]) for kvbridge.
 * 2. Start barrier: sends empty batches [ts, [], 0] every 5 ms until the
 *    subscriber got a first message (kvbridge's start barrier, or a forwarded
 *    probe), waits 100 ms for probes in flight; what arrived so far is the
 *    base.  From then on message base + k belongs to a known batch (NATS keeps
 *    one publisher's order), which is how latency is matched without parsing.
 * 3. Sends the batches in a loop (cycling over the set): --rate 0 (default)
 *    as fast as the receiver keeps up, with at most --window batches not yet
 *    fully received (closed loop: queues stay bounded, nothing is dropped);
 *    --rate R: R batches/s on an absolute schedule, send time recorded.
 *    First --warmup-s seconds of warm-up, then --duration-s seconds (or until
 *    --total-events engine events were sent), then waits for every message.
 * 4. Measures from the moment every warm-up batch was received to the moment
 *    the last message was: batches/s, engine events/s, messages/s, CPU of
 *    --watch-pid (utime + stime from /proc/PID/stat) per engine event and in
 *    % of one core, VmHWM/VmRSS, and with --rate the latency percentiles
 *    (send -> receive of the batch's last message; batches that publish
 *    nothing are skipped), and foreign_pct: the machine's busy time (all
 *    CPUs, /proc/stat) not spent by this process, the bridge or --own-pids
 *    (the subscriber, nats-server), i.e. other people's load skewing the run;
 *    runq_wait_ms_per_s: how long the bridge's threads waited for a CPU
 *    (/proc/PID/task/TID/schedstat), per second of the run.
 *
 * Prints one line: "result label=L key=value ...".  Exit 0, 1 when messages
 * were lost or extra, or on timeout, 2 on usage/setup errors.
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "bench.h"
#include "config.h"
#include "decode.h"
#include "metrics.h"
#include "pipeline.h"
#include "publish.h"
#include "replay.h"

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

struct opts {
    const char *endpoint, *shm, *capture, *mix, *label, *lat_dump;
    bool raw;
    double rate, warmup_s, duration_s;
    uint64_t total_events, window, max_batches;
    long watch_pid;
    long own[8]; /* --own-pids: our other processes (subscriber, nats-server) */
    int n_own;
};

/* ---- per-batch expectations -------------------------------------------- */

struct counter {
    uint64_t n;
};
/* The publish stage's writer (dynamo-json: one message per router event). */
static int count_msg(void *ctx, const struct kvb_publish_msg *msg)
{
    (void)msg;
    ((struct counter *)ctx)->n++;
    return 0;
}

/* The set is sent in a loop.  Its first pass and every later one can
 * differ (a store of blocks still resident from the last pass publishes
 * nothing): the expectations hold two passes, and the second is taken as
 * the one every later pass repeats.  The k-th batch sent (from 0) is slot
 * expect_slot(k, n) of msgs and events. */
static size_t expect_slot(size_t k, size_t n) { return k < n ? k : n + k % n; }

/* msgs[i]: NATS messages batch i produces; events[i]: its engine events;
 * i < 2 * set->n (expect_slot()). */
static int expectations(const struct bench_set *set, bool raw, uint32_t *msgs, uint32_t *events)
{
    static struct kvb_metrics m;
    struct counter cnt = {0};
    struct kvb_pipeline *p = NULL;
    struct kvb_pipeline_cfg cfg = {
        .convert = {.worker_id = 7,
                    .block_size = 16,
                    .lora_salt = true,
                    .forward_tiers = 1u << KVB_TIER_DEVICE,
                    /* limits.max_tracked_blocks' default, as the bench's
                     * kvbridge runs: its relay rules (a store of blocks
                     * already resident publishes nothing) decide the count */
                    .max_tracked = 1048576},
        .limits = KVB_DECODE_LIMITS_DEFAULT,
    };
    struct kvb_publish_cfg uc = {.format = KVB_FORMAT_DYNAMO_JSON,
                                 .subject = "bench",
                                 .namespace_ = "",
                                 .component = "",
                                 .endpoint = ""};
    struct kvb_publish_writer w = {.write = count_msg, .ctx = &cnt};
    struct kvb_stream st;
    uint8_t probe[16];
    size_t plen = benchgen_empty(probe, sizeof(probe));
    struct kvb_publish *pub = NULL;
    struct kvb_replay *r = NULL;
    struct kvb_replay_cfg rcfg = {.name = "bench", .endpoint = ""};
    struct kvb_seq_ops ops;
    int rc = kvb_publish_create(&uc, &m, 1, &pub);
    if (rc == 0) {
        kvb_publish_set_writer(pub, &w);
        rc = kvb_pipeline_create(&cfg, &m, pub, &p);
    }
    if (rc == 0) { /* the daemon's sequence rules, without a replay endpoint */
        ops = kvb_pipeline_seq_ops(p);
        rc = kvb_replay_create(&rcfg, &m, &ops, NULL, &r);
    }
    if (rc < 0)
        goto out;
    kvb_stream_init(&st, "bench", 0);
    kvb_replay_live(r, &st, 0, probe, plen, 0); /* the start barrier */
    for (size_t i = 0; rc == 0 && i < 2 * set->n; i++) {
        size_t k = i % set->n;
        cnt.n = 0;
        if (kvb_replay_live(r, &st, i + 1, bench_set_data(set, k), bench_set_len(set, k), 0) < 0) {
            rc = -EINVAL;
            break;
        }
        msgs[i] = raw ? 1 : (uint32_t)cnt.n;
        struct kvb_batch b;
        events[i] = kvb_decode_batch(kvb_pipeline_decoder(p), bench_set_data(set, k),
                                     bench_set_len(set, k), &b) == 0
                        ? b.n_events
                        : 0;
    }
out:
    kvb_replay_destroy(&r);
    kvb_pipeline_destroy(&p);
    kvb_publish_destroy(&pub);
    return rc;
}

/* ---- /proc -------------------------------------------------------------- */

static long long proc_ticks(long pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p)
        return -1;
    /* after ")": state(3) ppid pgrp session tty tpgid flags minflt cminflt
     * majflt cmajflt utime(14) stime(15) */
    unsigned long long ut, st;
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return -1;
    return (long long)(ut + st);
}

static long proc_status_kb(long pid, const char *key)
{
    char path[64], line[256];
    size_t kl = strlen(key);
    long v = -1;
    snprintf(path, sizeof(path), "/proc/%ld/status", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, key, kl) && line[kl] == ':') {
            v = strtol(line + kl + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

/* Time the threads of pid spent runnable but waiting for a CPU (ns), the sum
 * of the second field of /proc/PID/task/TID/schedstat. */
static long long runq_wait_ns(long pid)
{
    char path[64];
    long long sum = 0;
    snprintf(path, sizeof(path), "/proc/%ld/task", pid);
    DIR *d = opendir(path);
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));) {
        char p2[320];
        unsigned long long run, wait;
        if (e->d_name[0] == '.')
            continue;
        snprintf(p2, sizeof(p2), "/proc/%ld/task/%s/schedstat", pid, e->d_name);
        FILE *f = fopen(p2, "r");
        if (!f)
            continue;
        if (fscanf(f, "%llu %llu", &run, &wait) == 2)
            sum += (long long)wait;
        fclose(f);
    }
    closedir(d);
    return sum;
}

/* Machine-wide busy and total ticks (all CPUs) from /proc/stat. */
static int machine_ticks(long long *busy, long long *total)
{
    unsigned long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return -1;
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (n < 8)
        return -1;
    *busy = (long long)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]);
    *total = *busy + (long long)(v[3] + v[4]);
    return 0;
}

/* CPU ticks of every process of the benchmark: ours, the bridge, --own-pids. */
static long long own_ticks(const struct opts *o)
{
    long long t = proc_ticks((long)getpid());
    if (o->watch_pid)
        t += proc_ticks(o->watch_pid);
    for (int i = 0; i < o->n_own; i++)
        t += proc_ticks(o->own[i]);
    return t;
}

/* ---- sending ------------------------------------------------------------ */

static int send_batch(void *pub, uint64_t seq, const uint8_t *data, size_t len)
{
    uint8_t s8[8];
    for (int i = 7; i >= 0; i--, seq >>= 8)
        s8[i] = (uint8_t)seq;
    if (zmq_send(pub, "", 0, ZMQ_SNDMORE) < 0 || zmq_send(pub, s8, 8, ZMQ_SNDMORE) < 0 ||
        zmq_send_const(pub, data, len, 0) < 0)
        return -errno;
    return 0;
}

static void sleep_ns(long ns)
{
    struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
    nanosleep(&ts, NULL);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static double pct(const int64_t *v, size_t n, double q)
{
    if (!n)
        return NAN;
    size_t i = (size_t)ceil(q * (double)n) - 1;
    if (i >= n)
        i = n - 1;
    return (double)v[i] / 1000.0;
}

struct sent {
    int64_t send_ns;
    uint64_t cum; /* messages expected up to and including this batch */
};

static int parse_args(int argc, char **argv, struct opts *o)
{
    static const struct option lo[] = {
        {"endpoint", required_argument, NULL, 'e'},
        {"shm", required_argument, NULL, 'm'},
        {"capture", required_argument, NULL, 'c'},
        {"mix", required_argument, NULL, 'x'},
        {"expect", required_argument, NULL, 'E'},
        {"rate", required_argument, NULL, 'r'},
        {"window", required_argument, NULL, 'w'},
        {"warmup-s", required_argument, NULL, 'W'},
        {"duration-s", required_argument, NULL, 'd'},
        {"total-events", required_argument, NULL, 't'},
        {"watch-pid", required_argument, NULL, 'p'},
        {"label", required_argument, NULL, 'l'},
        {"max-batches", required_argument, NULL, 'n'},
        {"own-pids", required_argument, NULL, 'o'},
        {"lat-dump", required_argument, NULL, 'D'},
        {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'e': o->endpoint = optarg; break;
        case 'm': o->shm = optarg; break;
        case 'c': o->capture = optarg; break;
        case 'x': o->mix = optarg; break;
        case 'E':
            if (!strcmp(optarg, "raw"))
                o->raw = true;
            else if (strcmp(optarg, "kvbridge"))
                return -1;
            break;
        case 'r': o->rate = strtod(optarg, NULL); break;
        case 'w': o->window = strtoull(optarg, NULL, 10); break;
        case 'W': o->warmup_s = strtod(optarg, NULL); break;
        case 'd': o->duration_s = strtod(optarg, NULL); break;
        case 't': o->total_events = strtoull(optarg, NULL, 10); break;
        case 'p': o->watch_pid = strtol(optarg, NULL, 10); break;
        case 'l': o->label = optarg; break;
        case 'n': o->max_batches = strtoull(optarg, NULL, 10); break;
        case 'D': o->lat_dump = optarg; break;
        case 'o':
            for (char *p = optarg; *p && o->n_own < 8;) {
                o->own[o->n_own++] = strtol(p, &p, 10);
                while (*p == ',')
                    p++;
            }
            break;
        default: return -1;
        }
    }
    if (!o->endpoint || !o->shm || (!o->capture && !o->mix) || o->window == 0)
        return -1;
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o = {
        .label = "-", .window = 4096, .warmup_s = 1, .duration_s = 5, .max_batches = 20000};
    if (parse_args(argc, argv, &o) < 0) {
        fprintf(stderr,
                "usage: bench-pub --endpoint EP --shm FILE (--capture FILE | --mix M) "
                "--expect kvbridge|raw [--rate R] [--window N] [--warmup-s S] "
                "[--duration-s S] [--total-events N] [--watch-pid PID] [--own-pids PID,...] "
                "[--label L] [--max-batches N] [--lat-dump FILE]\n");
        return 2;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); /* precise sleeps for --rate */

    struct bench_set set = {0};
    int r = o.capture ? bench_set_load(o.capture, o.max_batches, &set)
                      : benchgen_make(o.mix, o.max_batches, 1, &set);
    /* Each pass of the looped set ends with a cache reset: a second pass of
     * the same stores would otherwise be stores of resident blocks, which
     * kvbridge's relay rules publish nothing for (resident_repeat). */
    if (r == 0)
        r = benchgen_add_cleared(&set);
    if (r < 0) {
        fprintf(stderr, "bench-pub: %s: %s\n", o.capture ? o.capture : o.mix, strerror(-r));
        return 2;
    }
    uint32_t *msgs_of = calloc(2 * set.n, sizeof(*msgs_of)),
             *ev_of = calloc(2 * set.n, sizeof(*ev_of));
    if (!msgs_of || !ev_of || expectations(&set, o.raw, msgs_of, ev_of) < 0) {
        fprintf(stderr, "bench-pub: cannot count the expected messages\n");
        return 2;
    }

    /* the subscriber's shared memory */
    size_t maplen = 0;
    struct bench_shm *shm = NULL;
    for (int i = 0; i < 300 && !shm; i++) {
        shm = bench_shm_open(o.shm, 0, 0, &maplen);
        if (!shm || !atomic_load(&shm->ready)) {
            bench_shm_close(shm, maplen);
            shm = NULL;
            sleep_ns(50000000);
        }
    }
    if (!shm) {
        fprintf(stderr, "bench-pub: no subscriber at %s\n", o.shm);
        return 2;
    }

    void *ctx = zmq_ctx_new();
    void *pub = zmq_socket(ctx, ZMQ_PUB);
    int zero = 0, linger = 2000;
    zmq_setsockopt(pub, ZMQ_SNDHWM, &zero, sizeof(zero)); /* lossless */
    zmq_setsockopt(pub, ZMQ_LINGER, &linger, sizeof(linger));
    if (zmq_bind(pub, o.endpoint) < 0) {
        fprintf(stderr, "bench-pub: bind %s: %s\n", o.endpoint, zmq_strerror(errno));
        return 2;
    }

    /* 2. start barrier */
    uint8_t probe[16];
    size_t plen = benchgen_empty(probe, sizeof(probe));
    uint64_t seq = 0;
    int64_t deadline = bench_now_ns() + 30000000000LL;
    while (atomic_load_explicit(&shm->msgs, memory_order_acquire) == 0) {
        if (stop_flag || bench_now_ns() > deadline) {
            fprintf(stderr, "bench-pub: nothing reached the subscriber\n");
            return 1;
        }
        send_batch(pub, seq++, probe, plen);
        sleep_ns(5000000);
    }
    sleep_ns(100000000);
    const uint64_t base = atomic_load_explicit(&shm->msgs, memory_order_acquire);

    /* 3. send */
    size_t cap_sent = 1 << 16, nsent = 0, acked = 0, warm = SIZE_MAX, acked_a = 0;
    struct sent *sent = malloc(cap_sent * sizeof(*sent));
    uint64_t cum = 0, ev_sent = 0;
    int64_t t_start = bench_now_ns(), t_a = 0, t_b = 0, last_progress = t_start;
    int64_t interval = o.rate > 0 ? (int64_t)(1e9 / o.rate) : 0, next = t_start;
    long long ticks_a = -1, ticks_b = -1, mb_a = 0, mt_a = 0, mb_b = 0, mt_b = 0, own_a = 0,
              own_b = 0, rq_a = 0, rq_b = 0;
    int64_t warm_end = t_start + (int64_t)(o.warmup_s * 1e9);
    int64_t send_end = warm_end + (int64_t)(o.duration_s * 1e9);
    bool sending = true;
    int rc = 0;
    if (!sent)
        return 2;

    for (;;) {
        int64_t now = bench_now_ns();
        /* progress of the receiver */
        uint64_t got = atomic_load_explicit(&shm->msgs, memory_order_acquire) - base;
        size_t before = acked;
        while (acked < nsent && sent[acked].cum <= got)
            acked++;
        if (acked != before)
            last_progress = now;
        if (warm == SIZE_MAX && now >= warm_end)
            warm = nsent; /* batches sent during warm-up */
        if (warm != SIZE_MAX && !t_a && acked >= warm) {
            t_a = bench_now_ns();
            acked_a = acked;
            ticks_a = o.watch_pid ? proc_ticks(o.watch_pid) : -1;
            machine_ticks(&mb_a, &mt_a);
            own_a = own_ticks(&o);
            rq_a = o.watch_pid ? runq_wait_ns(o.watch_pid) : 0;
        }
        if (sending &&
            (stop_flag || (o.total_events ? ev_sent >= o.total_events : now >= send_end))) {
            sending = false;
            if (warm == SIZE_MAX)
                warm = 0;
        }
        if (!sending) {
            if (acked == nsent && t_a) {
                t_b = bench_now_ns();
                ticks_b = o.watch_pid ? proc_ticks(o.watch_pid) : -1;
                machine_ticks(&mb_b, &mt_b);
                own_b = own_ticks(&o);
                rq_b = o.watch_pid ? runq_wait_ns(o.watch_pid) : 0;
                break;
            }
            if (now - last_progress > 10000000000LL) {
                fprintf(stderr,
                        "bench-pub: %s: receiver stalled (%" PRIu64 " of %" PRIu64 " messages)\n",
                        o.label, got, cum);
                rc = 1;
                break;
            }
            sleep_ns(200000);
            continue;
        }
        if (interval) {
            if (now < next) {
                long wait = (long)(next - now);
                sleep_ns(wait > 2000000 ? 1000000 : wait);
                continue;
            }
            next += interval;
            if (now - next > 1000000000LL) /* far behind: do not burst */
                next = now;
        } else if (nsent - acked >= o.window) {
            if (now - last_progress > 10000000000LL) {
                fprintf(stderr, "bench-pub: %s: receiver stalled\n", o.label);
                rc = 1;
                break;
            }
            sleep_ns(50000);
            continue;
        }
        if (nsent == cap_sent) {
            cap_sent *= 2;
            struct sent *ns = realloc(sent, cap_sent * sizeof(*ns));
            if (!ns)
                return 2;
            sent = ns;
        }
        size_t k = nsent % set.n, x = expect_slot(nsent, set.n);
        cum += msgs_of[x];
        ev_sent += ev_of[x];
        sent[nsent].cum = cum;
        sent[nsent].send_ns = bench_now_ns();
        if (send_batch(pub, seq++, bench_set_data(&set, k), bench_set_len(&set, k)) < 0) {
            fprintf(stderr, "bench-pub: send: %s\n", zmq_strerror(errno));
            return 2;
        }
        nsent++;
    }

    /* 4. results */
    uint64_t got = atomic_load_explicit(&shm->msgs, memory_order_acquire) - base;
    sleep_ns(100000000); /* anything extra? */
    uint64_t extra = atomic_load_explicit(&shm->msgs, memory_order_acquire) - base - got;
    uint64_t m_batches = nsent - acked_a, m_events = 0, m_msgs = 0;
    for (size_t i = acked_a; i < nsent; i++) {
        m_events += ev_of[expect_slot(i, set.n)];
        m_msgs += msgs_of[expect_slot(i, set.n)];
    }
    double secs = t_b > t_a ? (double)(t_b - t_a) / 1e9 : NAN;
    double tck = (double)sysconf(_SC_CLK_TCK);
    double cpu_s = ticks_a >= 0 && ticks_b >= 0 ? (double)(ticks_b - ticks_a) / tck : NAN;

    /* latency: only with --rate (the receive of a batch's last message) */
    double p50 = NAN, p99 = NAN, p999 = NAN, pmax = NAN;
    size_t nlat = 0;
    if (interval && rc == 0) {
        int64_t *lat = malloc((nsent - warm + 1) * sizeof(*lat));
        /* --lat-dump: "send time (ms since the start) latency (us)" per batch */
        FILE *df = o.lat_dump ? fopen(o.lat_dump, "w") : NULL;
        for (size_t i = warm; lat && i < nsent; i++) {
            if (!msgs_of[expect_slot(i, set.n)])
                continue;
            uint64_t idx = base + sent[i].cum - 1;
            if (idx >= shm->cap)
                break;
            lat[nlat++] = atomic_load(&shm->recv_ns[idx]) - sent[i].send_ns;
            if (df)
                fprintf(df, "%.3f %.1f\n", (double)(sent[i].send_ns - t_start) / 1e6,
                        (double)lat[nlat - 1] / 1000.0);
        }
        if (df)
            fclose(df);
        qsort(lat, nlat, sizeof(*lat), cmp_i64);
        p50 = pct(lat, nlat, 0.50);
        p99 = pct(lat, nlat, 0.99);
        p999 = pct(lat, nlat, 0.999);
        pmax = nlat ? (double)lat[nlat - 1] / 1000.0 : NAN;
        free(lat);
    }
    /* other people's work on the machine during the measurement, in % of all
     * CPUs: busy ticks not spent by the processes of the benchmark */
    double foreign = mt_b > mt_a
                         ? 100.0 * (double)((mb_b - mb_a) - (own_b - own_a)) / (double)(mt_b - mt_a)
                         : NAN;
    if (foreign < 0)
        foreign = 0;
    long hwm = o.watch_pid ? proc_status_kb(o.watch_pid, "VmHWM") : -1;
    long rss = o.watch_pid ? proc_status_kb(o.watch_pid, "VmRSS") : -1;
    uint64_t lost = cum > got ? cum - got : 0;
    if (lost || extra || atomic_load(&shm->errors))
        rc = 1;
    printf("result label=%s mode=%s rate=%.0f batches=%" PRIu64 " events=%" PRIu64 " msgs=%" PRIu64
           " secs=%.3f batches_per_s=%.0f events_per_s=%.0f msgs_per_s=%.0f"
           " cpu_s=%.3f cpu_us_per_event=%.3f cpu_pct=%.2f lat_n=%zu p50_us=%.1f p99_us=%.1f"
           " p999_us=%.1f max_us=%.1f hwm_kb=%ld rss_kb=%ld sent=%zu lost=%" PRIu64
           " extra=%" PRIu64 " sub_errors=%" PRIu64 " foreign_pct=%.0f runq_wait_ms_per_s=%.1f"
           " wire_msgs=%" PRIu64 " sub_msgs=%" PRIu64 "\n",
           o.label, o.raw ? "raw" : "kvbridge", o.rate, m_batches, m_events, m_msgs, secs,
           (double)m_batches / secs, (double)m_events / secs, (double)m_msgs / secs, cpu_s,
           cpu_s * 1e6 / (double)m_events, 100.0 * cpu_s / secs, nlat, p50, p99, p999, pmax, hwm,
           rss, nsent, lost, extra, atomic_load(&shm->errors), foreign,
           (double)(rq_b - rq_a) / 1e6 / secs, atomic_load(&shm->wire_msgs),
           atomic_load(&shm->msgs));
    fflush(stdout);

    free(sent);
    free(msgs_of);
    free(ev_of);
    zmq_close(pub);
    zmq_ctx_term(ctx);
    bench_shm_close(shm, maplen);
    bench_set_free(&set);
    return rc;
}
