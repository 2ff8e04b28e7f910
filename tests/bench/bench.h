/* bench: shared pieces of the benchmark tools in tests/bench (not part of
 * kvbridge).
 *
 * - a set of pre-encoded engine batches (struct bench_set): self-encoded by
 *   benchgen.c, or loaded from a capture file (capture.c writes them from
 *   kvsim's live stream: u32 little-endian length, then the payload frame);
 * - the shared-memory block through which count-sub reports what it received
 *   to bench-pub (flow control and latency): a file in the run's temp dir,
 *   mmap'd by both processes.
 *
 * Ownership: bench_set_free() frees what benchgen_make()/bench_set_load() put
 * in the set.  bench_shm_open() maps; bench_shm_close() unmaps.
 */
#ifndef KVB_BENCH_H
#define KVB_BENCH_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct bench_set {
    uint8_t *blob; /* every payload, back to back */
    size_t *off;   /* payload i is blob[off[i] .. off[i+1]) */
    size_t n, cap, blob_len, blob_cap;
};

void bench_set_free(struct bench_set *s);
/* Appends a copy of one payload; 0 or -ENOMEM. */
int bench_set_add(struct bench_set *s, const void *data, size_t len);
static inline const uint8_t *bench_set_data(const struct bench_set *s, size_t i)
{
    return s->blob + s->off[i];
}
static inline size_t bench_set_len(const struct bench_set *s, size_t i)
{
    return s->off[i + 1] - s->off[i];
}
/* Load a capture file (at most max payloads, 0 = all); 0 or a negative errno. */
int bench_set_load(const char *path, size_t max, struct bench_set *out);
int bench_set_save(const char *path, const struct bench_set *s);

/* Self-encoded batches, shapes as kvsim's --workload decode | prefill |
 * realistic (positional encoding, uint hashes, block size 16).  0, or
 * -EINVAL for an unknown mix. */
int benchgen_make(const char *mix, size_t n, uint64_t seed, struct bench_set *out);
/* An empty batch [ts, [], 0] (heartbeat), for probes; returns its length. */
size_t benchgen_empty(uint8_t *buf, size_t cap);
/* Append the batch [ts, [["AllBlocksCleared"]], 0] to s (an engine's cache
 * reset).  0 or -ENOMEM. */
int benchgen_add_cleared(struct bench_set *s);

/* ---- shared memory between count-sub and bench-pub ---------------------- */

#define BENCH_SHM_MAGIC 0x6b766273686d3031ULL /* "kvbshm01" */

struct bench_shm {
    uint64_t magic;
    uint64_t cap;               /* entries in recv_ns */
    _Atomic uint64_t ready;     /* 1 once the subscription is registered */
    _Atomic uint64_t msgs;      /* messages received */
    _Atomic uint64_t bytes;     /* payload bytes received */
    _Atomic uint64_t errors;    /* async errors (slow consumer, ...) */
    _Atomic uint64_t wire_msgs; /* NATS messages (msgs counts router events
                                     with count-sub --events) */
    _Atomic int64_t recv_ns[];  /* CLOCK_MONOTONIC receive time of message i */
};

/* create != 0: create (truncate) with room for cap receive times. */
struct bench_shm *bench_shm_open(const char *path, uint64_t cap, int create, size_t *maplen);
void bench_shm_close(struct bench_shm *m, size_t maplen);

int64_t bench_now_ns(void); /* CLOCK_MONOTONIC */

#endif
