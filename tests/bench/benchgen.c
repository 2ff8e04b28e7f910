/* benchgen: pre-encoded engine batches for the benchmarks.  See bench.h.
 *
 * The shapes follow tools/kvsim.c (positional encoding, 12-element
 * BlockStored, uint hashes, block size 16):
 *   decode:    one 1-block BlockStored (parent = the previous block), and from
 *              the 65th batch on one 1-hash BlockRemoved (the block stored 64
 *              batches before);
 *   prefill:   one 32-block BlockStored (512 tokens, no parent);
 *   realistic: a statistical model of kvsim's realistic generator in steady
 *              state (cache full): 5% empty heartbeat batches, 0.05%
 *              AllBlocksCleared, 1-3 actions per batch: 60% a new request
 *              (1-6 new blocks, 70% of them behind a cached shared prefix, a
 *              few also storing that prefix; 15% LoRA), 35% a running
 *              request's next block, 5% an eviction of 1-8 blocks; 62% of
 *              device stores first evict as many blocks (one BlockRemoved);
 *              10% of stores are mirrored to the CPU tier and 10% to group 1
 *              (sliding window), each with its FIFO eviction; 10% of device
 *              events have a nil medium.  Calibrated on kvsim: per batch 626
 *              vs 625 bytes and 3.66 vs 3.65 events, 2.7 vs 2.6 blocks per
 *              store, and the pipeline's instructions per event within 0.5%.
 * A capture of kvsim itself (capture.c) is the reference: `pipeline-bench
 * --stats [--capture FILE]` prints the shapes to compare.
 */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BS 16
#define MAX_TOKEN 150000u
#define DECODE_KEEP 64
#define PREFILL_BLOCKS 32

/* ---- sets --------------------------------------------------------------- */

void bench_set_free(struct bench_set *s)
{
    free(s->blob);
    free(s->off);
    memset(s, 0, sizeof(*s));
}

int bench_set_add(struct bench_set *s, const void *data, size_t len)
{
    if (s->n + 2 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        size_t *o = realloc(s->off, cap * sizeof(*o));
        if (!o)
            return -ENOMEM;
        if (!s->off)
            o[0] = 0;
        s->off = o;
        s->cap = cap;
    }
    if (s->blob_len + len > s->blob_cap) {
        size_t cap = s->blob_cap ? s->blob_cap : 1 << 16;
        while (cap < s->blob_len + len)
            cap *= 2;
        uint8_t *b = realloc(s->blob, cap);
        if (!b)
            return -ENOMEM;
        s->blob = b;
        s->blob_cap = cap;
    }
    memcpy(s->blob + s->blob_len, data, len);
    s->blob_len += len;
    s->off[++s->n] = s->blob_len;
    return 0;
}

int bench_set_load(const char *path, size_t max, struct bench_set *out)
{
    struct bench_set s = {0};
    uint8_t *buf = NULL;
    size_t bufcap = 0;
    int rc = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return -errno;
    for (;;) {
        uint8_t h[4];
        if (max && s.n >= max)
            break;
        size_t got = fread(h, 1, 4, f);
        if (got == 0)
            break;
        if (got != 4) {
            rc = -EINVAL;
            break;
        }
        size_t len = (size_t)h[0] | (size_t)h[1] << 8 | (size_t)h[2] << 16 | (size_t)h[3] << 24;
        if (len > bufcap) {
            uint8_t *nb = realloc(buf, len);
            if (!nb) {
                rc = -ENOMEM;
                break;
            }
            buf = nb;
            bufcap = len;
        }
        if (fread(buf, 1, len, f) != len) {
            rc = -EINVAL;
            break;
        }
        if ((rc = bench_set_add(&s, buf, len)) < 0)
            break;
    }
    fclose(f);
    free(buf);
    if (rc == 0 && s.n == 0)
        rc = -ENODATA;
    if (rc < 0) {
        bench_set_free(&s);
        return rc;
    }
    *out = s;
    return 0;
}

int bench_set_save(const char *path, const struct bench_set *s)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -errno;
    for (size_t i = 0; i < s->n; i++) {
        size_t len = bench_set_len(s, i);
        uint8_t h[4] = {(uint8_t)len, (uint8_t)(len >> 8), (uint8_t)(len >> 16),
                        (uint8_t)(len >> 24)};
        fwrite(h, 1, 4, f);
        fwrite(bench_set_data(s, i), 1, len, f);
    }
    return fclose(f) == 0 ? 0 : -EIO;
}

/* ---- shared memory ------------------------------------------------------ */

struct bench_shm *bench_shm_open(const char *path, uint64_t cap, int create, size_t *maplen)
{
    int fd = open(path, create ? O_RDWR | O_CREAT | O_TRUNC : O_RDWR, 0600);
    if (fd < 0)
        return NULL;
    size_t len;
    if (create) {
        len = sizeof(struct bench_shm) + cap * sizeof(int64_t);
        if (ftruncate(fd, (off_t)len) < 0) {
            close(fd);
            return NULL;
        }
    } else {
        struct stat st;
        if (fstat(fd, &st) < 0 || (size_t)st.st_size < sizeof(struct bench_shm)) {
            close(fd);
            return NULL;
        }
        len = (size_t)st.st_size;
    }
    struct bench_shm *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return NULL;
    if (create) {
        m->cap = cap;
        m->magic = BENCH_SHM_MAGIC;
    } else if (m->magic != BENCH_SHM_MAGIC ||
               sizeof(struct bench_shm) + m->cap * sizeof(int64_t) > len) {
        munmap(m, len);
        return NULL;
    }
    *maplen = len;
    return m;
}

void bench_shm_close(struct bench_shm *m, size_t maplen)
{
    if (m)
        munmap(m, maplen);
}

int64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- generator ---------------------------------------------------------- */

static uint64_t rnd(uint64_t *s)
{
    uint64_t x = (*s += 0x9e3779b97f4a7c15ULL);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static uint32_t below(uint64_t *s, uint32_t n)
{
    return (uint32_t)(((rnd(s) >> 32) * (uint64_t)n) >> 32);
}

enum medium { M_GPU, M_NIL, M_CPU };
static const char *const lora_names[] = {NULL, "adapter-a", "adapter-b"};

struct gen {
    msgpack_sbuffer sb;
    msgpack_packer pk;
    uint64_t rng;
    double ts;
    /* decode */
    uint64_t ring[DECODE_KEEP];
    size_t ring_n, ring_head;
    uint64_t last;
    bool has_last;
};

static void pack_cstr(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pack_medium(msgpack_packer *pk, enum medium m)
{
    if (m == M_NIL)
        msgpack_pack_nil(pk);
    else
        pack_cstr(pk, m == M_CPU ? "CPU" : "GPU");
}

/* hashes: random u64s (kvsim's are XXH3 values: the same msgpack sizes) */
static void stored(struct gen *g, size_t nh, bool has_parent, uint64_t parent, int lora,
                   enum medium med, int group, uint64_t *last_hash)
{
    msgpack_packer *pk = &g->pk;
    uint64_t h = 0;
    msgpack_pack_array(pk, 12);
    pack_cstr(pk, "BlockStored");
    msgpack_pack_array(pk, nh);
    for (size_t i = 0; i < nh; i++)
        msgpack_pack_uint64(pk, h = rnd(&g->rng));
    if (has_parent)
        msgpack_pack_uint64(pk, parent);
    else
        msgpack_pack_nil(pk);
    msgpack_pack_array(pk, nh * BS);
    for (size_t i = 0; i < nh * BS; i++)
        msgpack_pack_uint32(pk, below(&g->rng, MAX_TOKEN));
    msgpack_pack_unsigned_int(pk, BS);
    if (lora)
        msgpack_pack_int(pk, lora);
    else
        msgpack_pack_nil(pk);
    pack_medium(pk, med);
    if (lora)
        pack_cstr(pk, lora_names[lora]);
    else
        msgpack_pack_nil(pk);
    if (lora) {
        msgpack_pack_array(pk, nh);
        for (size_t i = 0; i < nh; i++) {
            msgpack_pack_array(pk, 1);
            pack_cstr(pk, lora_names[lora]);
        }
    } else {
        msgpack_pack_nil(pk);
    }
    msgpack_pack_int(pk, group);
    pack_cstr(pk, group ? "sliding_window" : "full_attention");
    if (group)
        msgpack_pack_int(pk, 4096);
    else
        msgpack_pack_nil(pk);
    if (last_hash)
        *last_hash = h;
}

static void removed(struct gen *g, size_t nh, const uint64_t *hashes, enum medium med, int group)
{
    msgpack_packer *pk = &g->pk;
    msgpack_pack_array(pk, 4);
    pack_cstr(pk, "BlockRemoved");
    msgpack_pack_array(pk, nh);
    for (size_t i = 0; i < nh; i++)
        msgpack_pack_uint64(pk, hashes ? hashes[i] : rnd(&g->rng));
    pack_medium(pk, med);
    msgpack_pack_int(pk, group);
}

static void begin(struct gen *g, size_t nev)
{
    msgpack_sbuffer_clear(&g->sb);
    msgpack_pack_array(&g->pk, 3);
    msgpack_pack_double(&g->pk, g->ts);
    g->ts += 0.0005;
    msgpack_pack_array(&g->pk, nev);
}

static void end(struct gen *g) { msgpack_pack_unsigned_int(&g->pk, 0); }

static void gen_decode(struct gen *g)
{
    uint64_t h, old = 0;
    bool rm = g->ring_n == DECODE_KEEP;
    begin(g, rm ? 2 : 1);
    stored(g, 1, g->has_last, g->last, 0, M_GPU, 0, &h);
    g->last = h;
    g->has_last = true;
    if (rm) {
        old = g->ring[g->ring_head];
        g->ring[g->ring_head] = h;
        g->ring_head = (g->ring_head + 1) % DECODE_KEEP;
        removed(g, 1, &old, M_GPU, 0);
    } else {
        g->ring[(g->ring_head + g->ring_n++) % DECODE_KEEP] = h;
    }
    end(g);
}

static void gen_prefill(struct gen *g)
{
    begin(g, 1);
    stored(g, PREFILL_BLOCKS, false, 0, 0, M_GPU, 0, NULL);
    end(g);
}

/* One planned event of a realistic batch. */
struct rev_plan {
    int type; /* 0 stored, 1 removed, 2 cleared */
    size_t nh;
    bool has_parent;
    int lora, group;
    enum medium med;
};

static enum medium dev_medium(struct gen *g) { return below(&g->rng, 10) == 0 ? M_NIL : M_GPU; }

static size_t plan_store(struct gen *g, struct rev_plan *p, size_t n, size_t nh, bool parent,
                         int lora)
{
    /* steady state: the device cache is full, free room first (mostly) */
    if (below(&g->rng, 100) < 62)
        p[n++] = (struct rev_plan){1, nh, false, 0, 0, dev_medium(g)};
    p[n++] = (struct rev_plan){0, nh, parent, lora, 0, dev_medium(g)};
    if (below(&g->rng, 10) == 0) { /* CPU offload, FIFO full: evict, store */
        p[n++] = (struct rev_plan){1, nh, false, 0, 0, M_CPU};
        p[n++] = (struct rev_plan){0, nh, parent, lora, 0, M_CPU};
    }
    if (below(&g->rng, 10) == 0) { /* group 1 (sliding window) */
        p[n++] = (struct rev_plan){1, nh, false, 0, 1, M_GPU};
        p[n++] = (struct rev_plan){0, nh, parent, lora, 1, M_GPU};
    }
    return n;
}

static void gen_realistic(struct gen *g)
{
    struct rev_plan p[64];
    size_t n = 0;
    uint32_t x = below(&g->rng, 10000);

    if (x >= 500) {
        if (x < 505)
            p[n++] = (struct rev_plan){2, 0, false, 0, 0, M_GPU};
        unsigned nact = 1 + below(&g->rng, 3);
        for (unsigned i = 0; i < nact; i++) {
            uint32_t y = below(&g->rng, 100);
            if (y < 60) {
                int lora = below(&g->rng, 100) < 15 ? 1 + (int)below(&g->rng, 2) : 0;
                bool prefix = below(&g->rng, 10) < 7;
                size_t nh = 1 + below(&g->rng, 6);
                /* a shared prefix not cached (yet, or any more): stored too */
                if (prefix && below(&g->rng, 100) < 4) {
                    nh += 1 + below(&g->rng, 12);
                    prefix = false;
                }
                n = plan_store(g, p, n, nh, prefix, lora);
            } else if (y < 95) {
                if (below(&g->rng, 100) < 97) /* the request is still running */
                    n = plan_store(g, p, n, 1, true, below(&g->rng, 100) < 15 ? 1 : 0);
            } else {
                p[n++] = (struct rev_plan){1, 1 + below(&g->rng, 8), false, 0, 0, dev_medium(g)};
            }
        }
    }
    begin(g, n);
    for (size_t i = 0; i < n; i++) {
        if (p[i].type == 0)
            stored(g, p[i].nh, p[i].has_parent, rnd(&g->rng), p[i].lora, p[i].med, p[i].group,
                   NULL);
        else if (p[i].type == 1)
            removed(g, p[i].nh, NULL, p[i].med, p[i].group);
        else {
            msgpack_pack_array(&g->pk, 1);
            pack_cstr(&g->pk, "AllBlocksCleared");
        }
    }
    end(g);
}

int benchgen_make(const char *mix, size_t n, uint64_t seed, struct bench_set *out)
{
    void (*fn)(struct gen *);
    if (!strcmp(mix, "decode"))
        fn = gen_decode;
    else if (!strcmp(mix, "prefill"))
        fn = gen_prefill;
    else if (!strcmp(mix, "realistic"))
        fn = gen_realistic;
    else
        return -EINVAL;
    struct gen *g = calloc(1, sizeof(*g));
    struct bench_set s = {0};
    int rc = g ? 0 : -ENOMEM;
    if (g) {
        msgpack_sbuffer_init(&g->sb);
        msgpack_packer_init(&g->pk, &g->sb, msgpack_sbuffer_write);
        g->rng = seed * 0x2545f4914f6cdd1dULL + 1;
        g->ts = 1767225600.0; /* fixed: instruction counts must not vary */
        for (size_t i = 0; i < n && rc == 0; i++) {
            fn(g);
            rc = bench_set_add(&s, g->sb.data, g->sb.size);
        }
        msgpack_sbuffer_destroy(&g->sb);
        free(g);
    }
    if (rc < 0) {
        bench_set_free(&s);
        return rc;
    }
    *out = s;
    return 0;
}

int benchgen_add_cleared(struct bench_set *s)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, 1767225600.0);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_str_with_body(&pk, "AllBlocksCleared", 16);
    msgpack_pack_uint32(&pk, 0);
    int rc = sb.data ? bench_set_add(s, sb.data, sb.size) : -ENOMEM;
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

size_t benchgen_empty(uint8_t *buf, size_t cap)
{
    /* [ts, [], 0]: fixarray(3), float64, fixarray(0), 0 */
    if (cap < 12)
        return 0;
    double ts = 1767225600.0;
    uint64_t bits;
    memcpy(&bits, &ts, sizeof(bits));
    buf[0] = 0x93;
    buf[1] = 0xcb;
    for (int i = 0; i < 8; i++)
        buf[2 + i] = (uint8_t)(bits >> (56 - 8 * i));
    buf[10] = 0x90;
    buf[11] = 0x00;
    return 12;
}
