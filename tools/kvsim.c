/*
 * kvsim: engine simulator and load generator for kvbridge.
 *
 * Stands in for vLLM / SGLang: publishes KV-cache event batches on a ZeroMQ
 * PUB socket exactly as docs/engine-events.md describes (3 frames: topic, seq as
 * 8 bytes big-endian, msgpack batch), optionally serves the replay ROUTER,
 * injects faults (drops, restarts, garbage) and writes a record of what a
 * correct bridge must publish (--record), for tools/kvtail to check against.
 * With --http it also serves a Prometheus /metrics and a /health shaped like
 * vLLM's (or SGLang's, --engine-kind sglang) whose KV usage follows the
 * simulated device cache; SIGUSR1 makes it stop answering, SIGUSR2 answer
 * again (libmicrohttpd, its own thread).
 *
 * Independent test instrument: uses nothing from src/.
 * Build: make build/kvsim, or
 *   gcc -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror tools/kvsim.c \
 *       -o build/kvsim -lzmq -lmsgpackc -lxxhash
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>

#include <json-c/json.h>
#include <msgpack.h>
#include <xxhash.h>
#include <zmq.h>

#define TOOL_NAME "kvsim"
#include "tools_common.h"

#define TOKENS_SEED 1337ULL
#define MAX_TOKEN 150000u
#define NLORA 2
#define NPREFIX 16
#define MAX_PREFIX 12 /* blocks in a shared prefix */
#define MAX_SUFFIX 6  /* blocks unique to a request */
#define MAX_CHAIN (MAX_PREFIX + MAX_SUFFIX)
#define NACTIVE 8      /* running requests that decode */
#define CPU_CAP 512    /* CPU-tier blocks (realistic) */
#define G1_CAP 256     /* group-1 blocks (realistic) */
#define DECODE_KEEP 64 /* decode: remove the block stored this many batches ago */
#define CHAIN_KEEP 512 /* multimodal, eagle: remove the block stored this many blocks ago */
#define PREFILL_BLOCKS 32
#define FLUSH_MS 2000 /* at exit, time given to queued messages (ZMQ_LINGER) */

static const char *const lora_names[NLORA + 1] = {NULL, "adapter-a", "adapter-b"};

/* ------------------------------------------------------------------ utils */

/* splitmix64: fast, good enough, deterministic per seed */
static uint64_t rnd(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ULL;
    return mix64(*s);
}

static uint32_t rnd_below(uint64_t *s, uint32_t n)
{
    return (uint32_t)(((rnd(s) >> 32) * (uint64_t)n) >> 32);
}

static void put_be64(unsigned char *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--) {
        p[i] = (unsigned char)(v & 0xff);
        v >>= 8;
    }
}

static uint64_t get_be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

/* ------------------------------------------------------- seq lists (a,b-c) */

struct seqrange {
    uint64_t lo, hi;
};

struct seqlist {
    struct seqrange *r;
    size_t n;
};

static int seqlist_parse(struct seqlist *l, const char *arg)
{
    char *copy = strdup(arg), *save = NULL, *tok;
    int rc = 0;

    if (!copy)
        return -ENOMEM;
    for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        struct seqrange r;
        char *dash = strchr(tok, '-');
        if (dash) {
            *dash = '\0';
            if (parse_u64(tok, &r.lo) || parse_u64(dash + 1, &r.hi) || r.lo > r.hi) {
                rc = -EINVAL;
                break;
            }
        } else {
            if (parse_u64(tok, &r.lo)) {
                rc = -EINVAL;
                break;
            }
            r.hi = r.lo;
        }
        l->r = xrealloc(l->r, (l->n + 1) * sizeof *l->r);
        l->r[l->n++] = r;
    }
    free(copy);
    return rc;
}

static bool seqlist_has(const struct seqlist *l, uint64_t v)
{
    for (size_t i = 0; i < l->n; i++)
        if (v >= l->r[i].lo && v <= l->r[i].hi)
            return true;
    return false;
}

/* -------------------------------------------- u64 -> u32 map (linear probe) */

#define MAP_NONE UINT32_MAX

struct u64map {
    uint64_t *keys;
    uint32_t *vals;
    size_t mask, n;
};

static void map_alloc(struct u64map *m, size_t slots)
{
    m->keys = xcalloc(slots, sizeof *m->keys);
    m->vals = xrealloc(NULL, slots * sizeof *m->vals);
    memset(m->vals, 0xff, slots * sizeof *m->vals);
    m->mask = slots - 1;
    m->n = 0;
}

static void map_init(struct u64map *m, size_t cap)
{
    size_t slots = 16;
    while (slots < cap * 2)
        slots <<= 1;
    map_alloc(m, slots);
}

static void map_free(struct u64map *m)
{
    free(m->keys);
    free(m->vals);
    m->keys = NULL;
    m->vals = NULL;
}

static size_t map_find(const struct u64map *m, uint64_t k)
{
    size_t i = mix64(k) & m->mask;
    while (m->vals[i] != MAP_NONE && m->keys[i] != k)
        i = (i + 1) & m->mask;
    return i;
}

static uint32_t map_get(const struct u64map *m, uint64_t k) { return m->vals[map_find(m, k)]; }

static void map_put(struct u64map *m, uint64_t k, uint32_t v);

static void map_grow(struct u64map *m)
{
    struct u64map old = *m;
    map_alloc(m, (old.mask + 1) * 2);
    for (size_t i = 0; i <= old.mask; i++)
        if (old.vals[i] != MAP_NONE)
            map_put(m, old.keys[i], old.vals[i]);
    map_free(&old);
}

static void map_put(struct u64map *m, uint64_t k, uint32_t v)
{
    size_t i;
    if ((m->n + 1) * 10 > (m->mask + 1) * 7)
        map_grow(m);
    i = map_find(m, k);
    if (m->vals[i] == MAP_NONE)
        m->n++;
    m->keys[i] = k;
    m->vals[i] = v;
}

static bool map_del(struct u64map *m, uint64_t k)
{
    size_t i = map_find(m, k), j;
    if (m->vals[i] == MAP_NONE)
        return false;
    /* backward-shift deletion keeps probe chains intact without tombstones */
    j = i;
    for (;;) {
        size_t home;
        bool stays;
        j = (j + 1) & m->mask;
        if (m->vals[j] == MAP_NONE)
            break;
        home = mix64(m->keys[j]) & m->mask;
        stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            i = j;
        }
    }
    m->vals[i] = MAP_NONE;
    m->n--;
    return true;
}

static void map_clear(struct u64map *m)
{
    memset(m->vals, 0xff, (m->mask + 1) * sizeof *m->vals);
    m->n = 0;
}

/* ------------------------------------------------------------ batch model */

enum ev_type { EV_STORED, EV_REMOVED, EV_CLEARED };
enum medium { MED_GPU, MED_NIL, MED_CPU };

struct ev {
    enum ev_type type;
    size_t h_off, nh; /* hashes in batch.h */
    size_t t_off;     /* stored: nh * block_size tokens in batch.tok */
    bool has_parent;
    uint64_t parent;
    int lora; /* 0 = none, else index in lora_names */
    enum medium medium;
    int group;
    /* --workload multimodal: extra_keys regenerated from mm_seed
     * (mm_block_items()); ns: 1 + index into cache_namespaces when the
     * request's block 0 carries a cache salt */
    bool mm;
    uint64_t mm_seed;
    int ns;
    /* a later store of a salted request: no salt of its own, its parent's
     * namespace (Dynamo's relay and kvbridge inherit it), 1 + index or 0 */
    int ns_inherited;
    /* --workload eagle: nh * bs + 1 flat tokens, sent as nh * bs bigrams */
    bool eagle;
    /* parity workloads (gen_parity()): the wire's strings (NULL: absent),
     * the request's placement (attr), the salt block 0 carries (1-based);
     * par_decide()'s truth: published or why not, released hashes, the
     * namespace the router hashes with */
    bool parity, fwd;
    const char *kind_s, *medium_s, *locality_s, *ownership_s, *tier_s, *drop;
    /* tierclear: a "cleared" of medium_s only (TierBlocksCleared); an
     * AllBlocksCleared that names a medium (ambiguous) is one with drop set */
    bool tier_clear;
    int attr, salt_ns, truth_ns;
    size_t rel_off, nrel;
};

struct batch {
    struct ev *ev;
    size_t nev, ev_cap;
    uint64_t *h;
    size_t nh, h_cap;
    uint32_t *tok;
    size_t ntok, tok_cap;
};

static void batch_reset(struct batch *b) { b->nev = b->nh = b->ntok = 0; }

/* Appends a zeroed event; returns its index (pointers move on growth). */
static size_t batch_ev(struct batch *b, enum ev_type type)
{
    if (b->nev == b->ev_cap) {
        b->ev_cap = b->ev_cap ? b->ev_cap * 2 : 16;
        b->ev = xrealloc(b->ev, b->ev_cap * sizeof *b->ev);
    }
    memset(&b->ev[b->nev], 0, sizeof b->ev[0]);
    b->ev[b->nev].type = type;
    b->ev[b->nev].h_off = b->nh;
    b->ev[b->nev].t_off = b->ntok;
    return b->nev++;
}

static uint64_t *batch_hashes(struct batch *b, size_t n)
{
    uint64_t *p;
    if (b->nh + n > b->h_cap) {
        while (b->nh + n > b->h_cap)
            b->h_cap = b->h_cap ? b->h_cap * 2 : 256;
        b->h = xrealloc(b->h, b->h_cap * sizeof *b->h);
    }
    p = b->h + b->nh;
    b->nh += n;
    return p;
}

static uint32_t *batch_tokens(struct batch *b, size_t n)
{
    uint32_t *p;
    if (b->ntok + n > b->tok_cap) {
        while (b->ntok + n > b->tok_cap)
            b->tok_cap = b->tok_cap ? b->tok_cap * 2 : 4096;
        b->tok = xrealloc(b->tok, b->tok_cap * sizeof *b->tok);
    }
    p = b->tok + b->ntok;
    b->ntok += n;
    return p;
}

/* ------------------------------------------------------- options, context */

enum encoding { ENC_POSITIONAL, ENC_MAP };
enum hashkind { HASH_UINT, HASH_INT, HASH_BIN };
enum workload {
    WL_REALISTIC,
    WL_DECODE,
    WL_PREFILL,
    WL_MULTIMODAL,
    WL_EAGLE,
    WL_HYBRID,
    WL_TWOGROUPS,
    WL_SALTED,
    WL_REMOTE,
    WL_TIERCLEAR
};

enum engine_kind { EK_VLLM, EK_SGLANG };
/* The body of GET /kv_event_sources: vLLM's route has been a bare array and
 * {"sources": [...]}; the PR's client reads an object keyed by rank. */
enum sources_shape { SHAPE_ARRAY, SHAPE_ENVELOPE, SHAPE_RANKS };

struct opts {
    const char *endpoint, *replay, *topic, *record;
    const char *http; /* --http HOST:PORT; NULL = no HTTP face */
    enum engine_kind ekind;
    uint64_t total_blocks; /* --total-blocks; 0 = --cache-blocks */
    const char *curve_secret_file, *curve_server_key;
    char curve_secret[41], curve_public[41]; /* Z85, from curve_secret_file */
    bool connect, lossless, layout_new, restart;
    bool trtllm_ranks;      /* --rank-naming trtllm */
    const char *node_ip;    /* --node-ip: what a port-0 wildcard endpoint binds */
    int sources_shape;      /* --sources-shape: enum sources_shape */
    bool lora_id_only;      /* TensorRT-LLM: lora_id without lora_name */
    bool report_full;       /* vLLM kv_cache_report_mode: full (parity workloads) */
    unsigned lora_unmapped; /* with lora_id_only: the id the bridge cannot name */
    unsigned image_token;   /* --image-token-id: multimodal blocks hold runs of it */
    unsigned video_token;   /* --video-token-id: and runs of this, one video per block */
    unsigned dp, bs;
    enum encoding enc;
    enum hashkind hash;
    enum workload wl;
    uint64_t batches, seed, seq_start, restart_at;
    double rate;
    long wait_ms, linger_ms;
    size_t replay_buf, cache_blocks;
    struct seqlist drop_live, drop_forever, malformed, bad_frames;
    /* engine lifecycle (lifecycle_* below) */
    long restart_close_ms;      /* >= 0: --restart-at closes and rebinds like a new process */
    uint64_t restart_drop_live; /* new incarnation's first batches not sent live */
    uint64_t restart_quiet;     /* --restart-quiet N: N batches at once unseen, then silence */
    bool blip;
    uint64_t blip_at;
    long blip_ms;
    uint64_t mark_after;
    const char *mark_file;
    const char *hold_file;
    const char **frames; /* --frames FILE, in order */
    size_t n_frames;
};

struct slot {
    uint64_t hash;
    uint64_t last_use;
    int32_t parent;     /* slot index of the parent block, -1 if none */
    int32_t prev, next; /* leaf list links, when in_leaf */
    uint32_t nchild;
    bool used, in_leaf;
};

/* FIFO-evicted set (CPU tier, group 1) */
struct fifoset {
    struct u64map map;
    uint64_t *ring;
    size_t cap, head, n;
};

struct active {
    uint64_t last;
    int lora;
    bool live;
};

struct gen {
    uint64_t rng;
    uint64_t tick;
    /* realistic: device cache with leaf-LRU eviction */
    struct slot *slots;
    size_t cap;
    int32_t leaf_head, leaf_tail; /* leaves (evictable), least recently used first */
    int32_t *freel;
    size_t nfree;
    struct u64map dev;
    struct active act[NACTIVE];
    struct fifoset cpu, g1;
    /* decode: recent chain */
    uint64_t ring[CHAIN_KEEP]; /* decode uses DECODE_KEEP of them */
    size_t ring_n, ring_head;
    uint64_t last;
    bool has_last;
    int cur_lora;       /* multimodal: the current request's LoRA */
    int cur_ns;         /* multimodal: the current request's cache namespace (ev.ns) */
    struct parity *par; /* the parity workloads' state */
};

struct rbent {
    uint64_t seq;
    char *data;
    size_t len, cap;
};

struct rank {
    unsigned idx;
    void *pub, *router;
    char ep[512], rep[512];
    /* what GET /kv_event_sources lists (the HTTP thread reads them, under
     * sim.adv_mu): the bound endpoint (an ephemeral port read back), or the
     * configured one; "" while the socket is closed */
    char adv[512], adv_rep[512];
    uint64_t seq;
    bool restarted, blipped;
    uint64_t quiet_left; /* --restart-quiet: batches still to publish before silence */
    uint64_t drop_left;  /* lifecycle: batches still not sent live */
    struct rbent *ring;
    size_t ring_head, ring_n;
    struct gen g;
    uint64_t enc_rng;
    struct batch b;
    /* stats */
    uint64_t batches, events, bytes, drop_live, drop_forever, malformed, bad_frames, replay_reqs,
        replay_batches, replay_ignored;
    /* the simulated device cache, for the HTTP face (read by its thread) */
    _Atomic uint64_t dev_used, running;
};

struct sim {
    struct opts o;
    struct MHD_Daemon *mhd; /* --http; NULL while not answering */
    pthread_mutex_t adv_mu;
    void *zctx;
    struct rank *ranks;
    zmq_pollitem_t *items;
    int nitems;
    FILE *rec;
    msgpack_sbuffer sb;
    msgpack_packer pk;
    size_t topic_len;
    uint64_t lora_tokens_seed[NLORA + 1];
    uint32_t *chain_tok;  /* MAX_CHAIN * bs */
    unsigned char *lebuf; /* 4 * bs */
    unsigned char *orbuf; /* the oracle's: 4 * (bs + 1) + 8 * MM_MAX_ITEMS */
};

static void track_usage(const struct sim *s, struct rank *r);
static void http_poll_cmd(struct sim *s);

/* -------------------------------------------------------------- endpoints */

/* rank r of an endpoint "scheme://host:PORT" is "scheme://host:(PORT+r)";
 * with --rank-naming trtllm (TensorRT-LLM's offset_endpoint_port) an
 * ipc:// or inproc:// one is "PATH_dp{r}" */
static int rank_endpoint(const char *base, unsigned r, bool trtllm, char *out, size_t outlen)
{
    const char *colon = strrchr(base, ':');
    uint64_t port;

    if (r == 0) {
        if (strlen(base) >= outlen)
            return -EINVAL;
        strcpy(out, base);
        return 0;
    }
    if (trtllm && (strncmp(base, "ipc://", 6) == 0 || strncmp(base, "inproc://", 9) == 0))
        return snprintf(out, outlen, "%s_dp%u", base, r) >= (int)outlen ? -EINVAL : 0;
    if (!colon || colon - base < 4 || parse_u64(colon + 1, &port) || port + r > 65535)
        return -EINVAL;
    if (port == 0) /* vLLM: every rank binds its own ephemeral port */
        r = 0;
    if (snprintf(out, outlen, "%.*s:%" PRIu64, (int)(colon - base), base, port + r) >= (int)outlen)
        return -EINVAL;
    return 0;
}

/* What a rank binds for its endpoint EP: with port 0 and a wildcard host
 * (tcp://HOST:0 with HOST * or 0.0.0.0) NODE_IP, as vLLM binds its
 * get_ip(); else EP. */
static void bind_endpoint(const char *ep, const char *node_ip, char *out, size_t outlen)
{
    const char *colon = strrchr(ep, ':');
    if (strncmp(ep, "tcp://", 6) == 0 && colon && strcmp(colon, ":0") == 0 &&
        ((colon - ep == 7 && ep[6] == '*') || strncmp(ep + 6, "0.0.0.0:", 8) == 0))
        snprintf(out, outlen, "tcp://%s:0", node_ip);
    else
        snprintf(out, outlen, "%s", ep);
}

/* ------------------------------------------------------- generator: common */

/* the parity workloads (defined with them, below) */
struct parity;
static bool wl_parity(enum workload w);
static void par_init(struct gen *g);
static void par_clear(struct gen *g);
static void par_free(struct gen *g);
static void par_decide(struct rank *r);

static uint64_t block_hash(uint64_t parent, bool has_parent, const uint32_t *tok, unsigned bs,
                           int lora)
{
    uint64_t seed =
        (has_parent ? parent : 0x6b7673696d000001ULL) ^ ((uint64_t)lora * 0x9e3779b97f4a7c15ULL);
    return XXH3_64bits_withSeed(tok, (size_t)bs * sizeof *tok, seed);
}

static void random_tokens(uint64_t *rng, uint32_t *tok, size_t n)
{
    for (size_t i = 0; i < n; i++)
        tok[i] = rnd_below(rng, MAX_TOKEN);
}

static void fifo_init(struct fifoset *f, size_t cap)
{
    map_init(&f->map, cap);
    f->ring = xcalloc(cap, sizeof *f->ring);
    f->cap = cap;
    f->head = f->n = 0;
}

static void fifo_free(struct fifoset *f)
{
    map_free(&f->map);
    free(f->ring);
}

static void fifo_clear(struct fifoset *f)
{
    map_clear(&f->map);
    f->head = f->n = 0;
}

static void gen_init(struct sim *s, struct rank *r)
{
    struct gen *g = &r->g;
    memset(g, 0, sizeof *g);
    g->rng = mix64(s->o.seed ^ mix64(0x72616e6b00ULL + r->idx));
    r->enc_rng = mix64(g->rng ^ 0x656e63ULL);
    if (s->o.wl == WL_REALISTIC) {
        g->cap = s->o.cache_blocks;
        g->slots = xcalloc(g->cap, sizeof *g->slots);
        g->freel = xcalloc(g->cap, sizeof *g->freel);
        map_init(&g->dev, g->cap);
        fifo_init(&g->cpu, CPU_CAP);
        fifo_init(&g->g1, G1_CAP);
    }
    if (wl_parity(s->o.wl))
        par_init(g);
}

/* Engine restart or AllBlocksCleared: the engine's caches are empty. */
static void gen_clear(struct gen *g)
{
    if (g->slots) {
        memset(g->slots, 0, g->cap * sizeof *g->slots);
        for (size_t i = 0; i < g->cap; i++)
            g->freel[i] = (int32_t)(g->cap - 1 - i);
        g->nfree = g->cap;
        g->leaf_head = g->leaf_tail = -1;
        map_clear(&g->dev);
        fifo_clear(&g->cpu);
        fifo_clear(&g->g1);
    }
    for (int i = 0; i < NACTIVE; i++)
        g->act[i].live = false;
    g->ring_n = g->ring_head = 0;
    g->has_last = false;
    par_clear(g);
}

static void gen_free(struct gen *g)
{
    if (g->slots) {
        free(g->slots);
        free(g->freel);
        map_free(&g->dev);
        fifo_free(&g->cpu);
        fifo_free(&g->g1);
    }
    par_free(g);
}

/* ---------------------------------------------------- generator: decode */

static void gen_decode(struct sim *s, struct rank *r)
{
    struct gen *g = &r->g;
    struct batch *b = &r->b;
    unsigned bs = s->o.bs;
    size_t ei = batch_ev(b, EV_STORED);
    uint32_t *tok = batch_tokens(b, bs);
    uint64_t *h = batch_hashes(b, 1);
    struct ev *e = &b->ev[ei];

    random_tokens(&g->rng, tok, bs);
    e->nh = 1;
    e->has_parent = g->has_last;
    e->parent = g->last;
    *h = block_hash(g->last, g->has_last, tok, bs, 0);
    g->last = *h;
    g->has_last = true;

    if (g->ring_n == DECODE_KEEP) {
        uint64_t old = g->ring[g->ring_head];
        size_t ri = batch_ev(b, EV_REMOVED);
        *batch_hashes(b, 1) = old;
        b->ev[ri].nh = 1;
        g->ring[g->ring_head] = g->last;
        g->ring_head = (g->ring_head + 1) % DECODE_KEEP;
    } else {
        g->ring[(g->ring_head + g->ring_n) % DECODE_KEEP] = g->last;
        g->ring_n++;
    }
}

/* ---------------------------------------------------- generator: prefill */

static void gen_prefill(struct sim *s, struct rank *r)
{
    struct gen *g = &r->g;
    struct batch *b = &r->b;
    unsigned bs = s->o.bs;
    size_t ei = batch_ev(b, EV_STORED);
    uint32_t *tok = batch_tokens(b, (size_t)PREFILL_BLOCKS * bs);
    uint64_t *h = batch_hashes(b, PREFILL_BLOCKS);

    random_tokens(&g->rng, tok, (size_t)PREFILL_BLOCKS * bs);
    for (size_t i = 0; i < PREFILL_BLOCKS; i++)
        h[i] = block_hash(i ? h[i - 1] : 0, i > 0, tok + i * bs, bs, 0);
    b->ev[ei].nh = PREFILL_BLOCKS;
}

/* ------------------------------------ generators: multimodal and eagle */

/* --workload multimodal (vLLM with images) and eagle (SGLang with EAGLE
 * speculative decoding): each batch one BlockStored of 1-3 blocks that
 * continues the current request's chain (or starts a new request, 1 in 4),
 * then one BlockRemoved of the blocks stored CHAIN_KEEP blocks earlier.
 * multimodal: every block has an extra_keys entry (mm_block_items()): the
 * LoRA name, multimodal identifiers in every shape vLLM has sent, a cache
 * salt in a request's block 0, prompt-embedding digests, or nil.
 * eagle: token_ids are bigrams [[t0,t1],[t1,t2],...]: nh * bs pairs for nh
 * blocks (docs/router-events.md section 3.3). */

#define MM_MAX_ITEMS 8
static const char *const cache_namespaces[2] = {"tenant-a", "tenant-b"};
#define SALT_PREFIX "dynamo-cache-salt:"

enum mm_kind { MMI_LORA, MMI_HEX, MMI_HEX_OFF, MMI_OPAQUE_OFF, MMI_SALT, MMI_BIN, MMI_NOTE };

struct mm_item {
    enum mm_kind kind;
    char str[96];
    int64_t off;
};

/* Block i's extra_keys entry of event e, in vLLM's order (LoRA name, mm
 * identifiers, cache salt, prompt-embedding digests): the number of items,
 * or -1 for a nil entry.  Deterministic in (e->mm_seed, i), so that the
 * encoder and the record see the same items. */
static int mm_block_items(const struct ev *e, size_t i, struct mm_item *it)
{
    uint64_t rng = mix64(e->mm_seed + 0x6d6d000000ULL + i);
    bool salt = i == 0 && e->ns;
    int n = 0;

    if (!e->lora && !salt && rnd_below(&rng, 5) == 0)
        return -1;
    if (e->lora) {
        it[n].kind = MMI_LORA;
        snprintf(it[n].str, sizeof it[n].str, "%s", lora_names[e->lora]);
        n++;
    }
    /* an image that runs through the event's blocks: the same identifier,
     * its offset relative to the block's first token (negative when it
     * started in an earlier block) */
    if (mix64(e->mm_seed) & 1) {
        uint64_t id = mix64(e->mm_seed ^ 0x696d67ULL);
        it[n].kind = (mix64(e->mm_seed) >> 1) & 1 ? MMI_HEX_OFF : MMI_OPAQUE_OFF;
        if (it[n].kind == MMI_HEX_OFF)
            snprintf(it[n].str, sizeof it[n].str,
                     "%016" PRIx64 "%016" PRIx64 "%016" PRIx64 "%016" PRIx64, id, mix64(id + 1),
                     mix64(id + 2), mix64(id + 3));
        else
            snprintf(it[n].str, sizeof it[n].str, "opaque-image-%" PRIu64, id % 100000);
        it[n].off = 5 - (int64_t)i * 16;
        n++;
    }
    for (uint32_t k = rnd_below(&rng, 3); k > 0; k--) {
        uint64_t id = rnd(&rng);
        switch (rnd_below(&rng, 3)) {
        case 0: /* vLLM <= 0.18: a bare sha256 hex digest */ it[n].kind = MMI_HEX; break;
        case 1: /* vLLM >= 0.19: [identifier, offset] */ it[n].kind = MMI_HEX_OFF; break;
        default: /* an identifier that is not a hex digest: hashed */
            it[n].kind = MMI_OPAQUE_OFF;
            break;
        }
        if (it[n].kind == MMI_OPAQUE_OFF)
            snprintf(it[n].str, sizeof it[n].str, "opaque-image-%" PRIu64, id % 100000);
        else
            snprintf(it[n].str, sizeof it[n].str,
                     "%016" PRIx64 "%016" PRIx64 "%016" PRIx64 "%016" PRIx64, id, mix64(id + 1),
                     mix64(id + 2), mix64(id + 3));
        it[n].off = (int64_t)rnd_below(&rng, 16);
        n++;
    }
    if (salt) {
        it[n].kind = MMI_SALT;
        snprintf(it[n].str, sizeof it[n].str, SALT_PREFIX "%s", cache_namespaces[e->ns - 1]);
        n++;
    }
    switch (rnd_below(&rng, 6)) {
    case 0: /* a prompt-embedding digest */
        it[n].kind = MMI_BIN;
        snprintf(it[n].str, sizeof it[n].str, "%016" PRIx64 "%016" PRIx64, rnd(&rng), rnd(&rng));
        n++;
        break;
    case 1: /* a bare string that is neither a digest nor tagged: nothing */
        it[n].kind = MMI_NOTE;
        snprintf(it[n].str, sizeof it[n].str, "note-%u", rnd_below(&rng, 100));
        n++;
        break;
    default: break;
    }
    return n;
}

/* --image-token-id: two runs of image placeholders in each of the nb blocks
 * (one token for blocks under 4), a token of text between them, so that a
 * block's k-th run takes its k-th mm hash. */
static void image_runs(uint32_t *tok, size_t nb, unsigned bs, uint32_t img)
{
    for (size_t i = 0; i < nb; i++) {
        uint32_t *t = tok + i * bs;
        if (bs < 4) {
            t[0] = img;
            continue;
        }
        for (unsigned k = bs / 4; k < bs / 2; k++)
            t[k] = img;
        for (unsigned k = bs / 2 + 1; k < bs * 3 / 4 + 1; k++)
            t[k] = img;
    }
}

/* --video-token-id (with --image-token-id, blocks of 8 or more): in each
 * block one video of two runs split by a text token (a timestamp), then
 * text, then one image run: two objects per block, so that a block with two
 * mm hashes is pad-substituted and every other keeps its native hash. */
static void video_runs(uint32_t *tok, size_t nb, unsigned bs, uint32_t img, uint32_t vid)
{
    for (size_t i = 0; i < nb; i++) {
        uint32_t *t = tok + i * bs;
        for (unsigned k = bs / 8; k < bs / 4; k++)
            t[k] = vid;
        for (unsigned k = bs / 4 + 1; k < bs * 3 / 8 + 1; k++)
            t[k] = vid;
        for (unsigned k = bs / 2; k < bs * 3 / 4; k++)
            t[k] = img;
    }
}

static void gen_chain(struct sim *s, struct rank *r)
{
    struct gen *g = &r->g;
    struct batch *b = &r->b;
    unsigned bs = s->o.bs;
    bool eagle = s->o.wl == WL_EAGLE;
    size_t nb = 1 + rnd_below(&g->rng, 3);
    bool fresh = !g->has_last || rnd_below(&g->rng, 4) == 0;
    size_t ei = batch_ev(b, EV_STORED);
    size_t t_off = b->ntok, h_off = b->nh;
    size_t ntok = nb * bs + (eagle ? 1 : 0);
    struct ev *e;

    random_tokens(&g->rng, batch_tokens(b, ntok), ntok);
    if (s->o.video_token)
        video_runs(b->tok + t_off, nb, bs, s->o.image_token, s->o.video_token);
    else if (s->o.image_token)
        image_runs(b->tok + t_off, nb, bs, s->o.image_token);
    batch_hashes(b, nb);
    e = &b->ev[ei];
    e->nh = nb;
    e->has_parent = !fresh;
    e->parent = g->last;
    e->eagle = eagle;
    if (!eagle) {
        if (fresh)
            g->cur_lora = rnd_below(&g->rng, 3) == 0 ? 1 + (int)rnd_below(&g->rng, NLORA) : 0;
        e->mm = true;
        e->mm_seed = rnd(&g->rng);
        e->lora = g->cur_lora;
        e->ns = fresh && rnd_below(&g->rng, 2) == 0 ? 1 + (int)rnd_below(&g->rng, 2) : 0;
        if (fresh)
            g->cur_ns = e->ns;
        else
            e->ns_inherited = g->cur_ns;
    }
    for (size_t i = 0; i < nb; i++) {
        uint64_t parent = i ? b->h[h_off + i - 1] : g->last;
        bool hp = i ? true : e->has_parent;
        b->h[h_off + i] = block_hash(parent, hp, b->tok + t_off + i * bs, bs, e->lora) ^
                          (e->mm ? mix64(e->mm_seed + i) : 0);
    }
    g->last = b->h[h_off + nb - 1];
    g->has_last = true;

    uint64_t rm[3];
    size_t nrm = 0;
    for (size_t i = 0; i < nb; i++) {
        uint64_t h = b->h[h_off + i];
        if (g->ring_n == CHAIN_KEEP) {
            rm[nrm++] = g->ring[g->ring_head];
            g->ring[g->ring_head] = h;
            g->ring_head = (g->ring_head + 1) % CHAIN_KEEP;
        } else {
            g->ring[(g->ring_head + g->ring_n) % CHAIN_KEEP] = h;
            g->ring_n++;
        }
    }
    if (nrm) {
        size_t ri = batch_ev(b, EV_REMOVED);
        memcpy(batch_hashes(b, nrm), rm, nrm * sizeof *rm);
        b->ev[ri].nh = nrm;
    }
}

/* -------------------------------- parity workloads (Dynamo's relay rules) */

/* --workload hybrid, twogroups, salted, remote: engine streams that exercise
 * the decisions of Dynamo's relay (docs/router-events.md), with the truth of
 * what a bridge that follows them publishes (par_decide()), written here
 * from those rules, independently of the daemon.
 *   hybrid:    vLLM 0.22-0.26 with a hybrid model: every block stored in
 *              group 1 (full_attention) and, under the same hash, in group 0
 *              (sliding_window, mamba or full_attention); removes carry no
 *              kind; group 0 evicts sooner (its window); now and then a
 *              remove in group 2, a group no store ever named
 *   twogroups: two full-attention groups (no kinds on removes): one hash
 *              held twice, its remove published with the last copy; now and
 *              then a store that repeats a hash
 *   salted:    SGLang multi-turn conversations: a request's first store
 *              carries a cache salt in block 0's extra_keys, its later turns
 *              none (they inherit it); now and then a block hash under two
 *              salts (par_ambiguous())
 *   remote:    vLLM 0.26+ maps: locality, ownership and medium names, fixed
 *              per request
 *   tierclear: vLLM with CPU offload and tier_scoped_clear_events (maps):
 *              every store on the GPU (group 0) offloaded to CPU_PINNED
 *              (group 1, same hashes), the GPU window shorter; now and then
 *              a batch of its own with TierBlocksCleared(medium "GPU") (the
 *              GPU tier emptied, the CPU copies kept, as vLLM's
 *              isolate_tier_clear_batches), or with an AllBlocksCleared that
 *              names a medium (dropped: ambiguous_scoped_clear; nothing of
 *              the engine's caches changes, since a bridge that follows
 *              Dynamo's rules keeps what it holds)
 * --report-full (kv_cache_report_mode: full): each batch first re-emits the
 * previous batch's stores, blocks the next request reuses. */

#define PAR_GROUPS 3
#define PAR_KEEP 48  /* blocks a group holds before it evicts */
#define PAR_KEEP0 20 /* hybrid's group 0 (a window) */
#define PAR_SAVED 8  /* --report-full: stores of the last batch kept */

struct pattr {
    const char *medium, *tier, *locality, *ownership;
};

/* remote: a request's placement, the first ones the common ones */
static const struct pattr par_attrs[] = {
    {NULL, "device", NULL, NULL},
    {"GPU", "device", "LOCAL", NULL},
    {"DEVICE", "device", NULL, NULL},
    {"", "device", "LOCAL", NULL},
    {"CPU_PINNED", "host_pinned", "LOCAL", NULL},
    {"CPU_TIER1", "host_pinned", NULL, NULL},
    {"NVME", "disk", "LOCAL", NULL},
    {"GPU", "device", "REMOTE", NULL},
    {"GPU", "device", "local", NULL},
    {"GPU", "device", NULL, "kvcr"},
    {"GPU", "device", "LOCAL", "ENGINE"},
    {"cpu", "device", NULL, NULL},
    {"FS", "device", "LOCAL", NULL},
};
#define PAR_NATTRS (sizeof par_attrs / sizeof par_attrs[0])
#define PAR_ATTR_GPU 1 /* par_attrs[]: GPU, LOCAL (tierclear's group 0) */
#define PAR_ATTR_CPU 4 /* CPU_PINNED, LOCAL (tierclear's offload, group 1) */

struct pring {
    uint64_t h[PAR_KEEP];
    uint8_t attr[PAR_KEEP];
    size_t head, n, keep;
};

struct psaved {
    uint64_t h[3], parent;
    uint32_t tok[3 * 4096];
    size_t nh;
    bool has_parent;
    int group, salt_ns, attr;
    const char *kind;
};

struct parity {
    /* the engine */
    struct pring ring[PAR_GROUPS];
    uint64_t last;
    bool has_last;
    int conv_ns;   /* salted: the conversation's salt (1-based), 0 = none */
    int attr;      /* remote: the request's placement */
    bool end_conv; /* salted: the next batch starts a new conversation */
    struct psaved saved[PAR_SAVED], cur[PAR_SAVED];
    size_t nsaved, ncur;
    /* the bridge's state under Dynamo's rules */
    int learned[PAR_GROUPS]; /* 0 unlearned, 1 main kind, 2 other kind */
    struct u64map copies;    /* (tier, group, hash): a counted copy */
    struct u64map count;     /* (tier, hash): copies counted */
    struct u64map ns;        /* hash: its namespace (1-based), PAR_AMBIG */
};
#define PAR_AMBIG 0xffu

static bool wl_parity(enum workload w)
{
    return w == WL_HYBRID || w == WL_TWOGROUPS || w == WL_SALTED || w == WL_REMOTE ||
           w == WL_TIERCLEAR;
}

static void par_init(struct gen *g)
{
    struct parity *p = xcalloc(1, sizeof *p);
    map_init(&p->copies, 4 * PAR_KEEP);
    map_init(&p->count, 4 * PAR_KEEP);
    map_init(&p->ns, 4 * PAR_KEEP);
    g->par = p;
}

/* An engine restart: caches empty; the bridge sees AllBlocksCleared. */
static void par_clear(struct gen *g)
{
    struct parity *p = g->par;
    if (!p)
        return;
    for (int i = 0; i < PAR_GROUPS; i++)
        p->ring[i].head = p->ring[i].n = 0;
    p->has_last = false;
    p->nsaved = p->ncur = 0;
    map_clear(&p->copies);
    map_clear(&p->count);
    map_clear(&p->ns);
}

static void par_free(struct gen *g)
{
    if (!g->par)
        return;
    map_free(&g->par->copies);
    map_free(&g->par->count);
    map_free(&g->par->ns);
    free(g->par);
    g->par = NULL;
}

/* Appends a parity store of nh blocks (tokens random); its index. */
static size_t par_store(struct sim *s, struct rank *r, size_t nh, int group, const char *kind)
{
    struct parity *p = r->g.par;
    struct batch *b = &r->b;
    size_t ei = batch_ev(b, EV_STORED), h_off = b->nh, t_off = b->ntok;
    unsigned bs = s->o.bs;
    struct ev *e;

    random_tokens(&r->g.rng, batch_tokens(b, nh * bs), nh * bs);
    batch_hashes(b, nh);
    e = &b->ev[ei];
    e->parity = true;
    e->nh = nh;
    e->has_parent = p->has_last;
    e->parent = p->last;
    e->group = group;
    e->kind_s = kind;
    for (size_t i = 0; i < nh; i++) {
        uint64_t parent = i ? b->h[h_off + i - 1] : p->last;
        bool hp = i ? true : p->has_last;
        b->h[h_off + i] = block_hash(parent, hp, b->tok + t_off + i * bs, bs, 0);
    }
    return ei;
}

/* The same blocks again in another group (same hashes, parent, tokens). */
static size_t par_store_again(struct rank *r, size_t src, int group, const char *kind)
{
    struct batch *b = &r->b;
    size_t ei = batch_ev(b, EV_STORED);
    struct ev *e = &b->ev[ei];
    uint64_t *h = batch_hashes(b, b->ev[src].nh);

    memcpy(h, b->h + b->ev[src].h_off, b->ev[src].nh * sizeof *h);
    *e = b->ev[src];
    e->h_off = (size_t)(h - b->h);
    e->group = group;
    e->kind_s = kind;
    return ei;
}

static void par_attr_apply(struct ev *e, int attr)
{
    const struct pattr *a = &par_attrs[attr];
    e->medium_s = a->medium;
    e->tier_s = a->tier;
    e->locality_s = a->locality;
    e->ownership_s = a->ownership;
}

/* The engine holds e's blocks in its group; what falls out of the group's
 * window is removed (one BlockRemoved per group, no kind). */
static void par_hold(struct rank *r, size_t ei)
{
    struct parity *p = r->g.par;
    struct batch *b = &r->b;
    struct pring *q = &p->ring[b->ev[ei].group];

    for (size_t i = 0; i < b->ev[ei].nh; i++) {
        size_t at = (q->head + q->n) % q->keep;
        if (q->n == q->keep) {
            at = q->head;
            q->head = (q->head + 1) % q->keep;
            q->n--;
            size_t ri = b->nev && b->ev[b->nev - 1].type == EV_REMOVED &&
                                b->ev[b->nev - 1].group == b->ev[ei].group &&
                                b->ev[b->nev - 1].attr == q->attr[at] &&
                                b->ev[b->nev - 1].h_off + b->ev[b->nev - 1].nh == b->nh
                            ? b->nev - 1
                            : SIZE_MAX;
            if (ri == SIZE_MAX) {
                ri = batch_ev(b, EV_REMOVED);
                b->ev[ri].parity = true;
                b->ev[ri].group = b->ev[ei].group;
                b->ev[ri].attr = q->attr[at];
                par_attr_apply(&b->ev[ri], q->attr[at]);
            }
            *batch_hashes(b, 1) = q->h[at];
            b->ev[ri].nh++;
        }
        q->h[at] = b->h[b->ev[ei].h_off + i];
        q->attr[at] = (uint8_t)b->ev[ei].attr;
        q->n++;
    }
}

/* --report-full: the last batch's stores again, exactly. */
static void par_report_full(struct sim *s, struct rank *r)
{
    struct parity *p = r->g.par;
    struct batch *b = &r->b;
    unsigned bs = s->o.bs;

    for (size_t k = 0; k < p->nsaved; k++) {
        const struct psaved *sv = &p->saved[k];
        size_t ei = batch_ev(b, EV_STORED);
        struct ev *e = &b->ev[ei];
        e->parity = true;
        e->nh = sv->nh;
        e->has_parent = sv->has_parent;
        e->parent = sv->parent;
        e->group = sv->group;
        e->kind_s = sv->kind;
        e->salt_ns = sv->salt_ns;
        e->attr = sv->attr;
        par_attr_apply(e, sv->attr);
        memcpy(batch_hashes(b, sv->nh), sv->h, sv->nh * sizeof *sv->h);
        memcpy(batch_tokens(b, sv->nh * bs), sv->tok, sv->nh * bs * sizeof *sv->tok);
    }
}

static void par_save(struct sim *s, struct rank *r, size_t ei)
{
    struct parity *p = r->g.par;
    const struct ev *e = &r->b.ev[ei];
    struct psaved *sv;

    if (!s->o.report_full || p->ncur == PAR_SAVED || s->o.bs > 4096)
        return;
    sv = &p->cur[p->ncur++];
    sv->nh = e->nh;
    sv->has_parent = e->has_parent;
    sv->parent = e->parent;
    sv->group = e->group;
    sv->kind = e->kind_s;
    sv->salt_ns = e->salt_ns;
    sv->attr = e->attr;
    memcpy(sv->h, r->b.h + e->h_off, e->nh * sizeof *sv->h);
    memcpy(sv->tok, r->b.tok + e->t_off, e->nh * s->o.bs * sizeof *sv->tok);
}

static const char *par_kind0(struct rank *r)
{
    uint32_t k = rnd_below(&r->g.rng, 10);
    return k < 4 ? "sliding_window" : k < 7 ? "mamba" : "full_attention";
}

/* hybrid, twogroups: each request's blocks in group 1 and group 0 */
static void gen_parity_groups(struct sim *s, struct rank *r, size_t nb)
{
    struct parity *p = r->g.par;
    struct gen *g = &r->g;
    enum workload wl = s->o.wl;
    size_t ei = par_store(s, r, nb, 1, "full_attention"), e0;

    r->b.ev[ei].tier_s = "device";
    p->last = r->b.h[r->b.ev[ei].h_off + nb - 1];
    p->has_last = true;
    e0 = par_store_again(r, ei, 0, wl == WL_HYBRID ? par_kind0(r) : "full_attention");
    par_save(s, r, ei);
    par_save(s, r, e0);
    par_hold(r, ei);
    par_hold(r, e0);
    if (wl == WL_TWOGROUPS && rnd_below(&g->rng, 12) == 0) {
        /* an engine that repeats a block hash in one store */
        bool had = p->has_last;
        p->has_last = false;
        size_t d = par_store(s, r, 2, 0, "full_attention");
        p->has_last = had;
        r->b.ev[d].tier_s = "device";
        r->b.h[r->b.ev[d].h_off + 1] = r->b.h[r->b.ev[d].h_off];
    }
    if (wl == WL_HYBRID && rnd_below(&g->rng, 10) == 0) {
        size_t ri = batch_ev(&r->b, EV_REMOVED);
        r->b.ev[ri].parity = true;
        r->b.ev[ri].group = 2;
        r->b.ev[ri].tier_s = "device";
        *batch_hashes(&r->b, 1) = rnd(&g->rng);
        r->b.ev[ri].nh = 1;
    }
}

/* salted, now and then: an engine whose block hashes ignore the salt
 * stores the conversation's last block again as another tenant's root, so
 * the hash has two namespaces; the next turn (no salt of its own, that
 * parent) is dropped, and the conversation ends there. */
static void par_ambiguous(struct sim *s, struct rank *r)
{
    struct parity *p = r->g.par;
    bool had = p->has_last;
    size_t ei;

    p->has_last = false;
    ei = par_store(s, r, 1, 0, "full_attention");
    p->has_last = had;
    r->b.h[r->b.ev[ei].h_off] = p->last;
    r->b.ev[ei].salt_ns = p->conv_ns == 1 ? 2 : 1;
    r->b.ev[ei].tier_s = "device";
    p->end_conv = true;
}

/* salted, remote: one chain per request in group 0 */
static void gen_parity_chain(struct sim *s, struct rank *r, size_t nb, bool fresh)
{
    struct parity *p = r->g.par;
    size_t ei;

    if (s->o.wl == WL_SALTED && !fresh && rnd_below(&r->g.rng, 20) == 0)
        par_ambiguous(s, r);
    ei = par_store(s, r, nb, 0, "full_attention");
    p->last = r->b.h[r->b.ev[ei].h_off + nb - 1];
    p->has_last = true;
    if (s->o.wl == WL_SALTED) {
        r->b.ev[ei].salt_ns = fresh ? p->conv_ns : 0;
        r->b.ev[ei].tier_s = "device";
    } else {
        r->b.ev[ei].attr = p->attr;
        par_attr_apply(&r->b.ev[ei], p->attr);
    }
    par_save(s, r, ei);
    par_hold(r, ei);
}

/* tierclear: a GPU store and its offload to the CPU, or a clear in a batch
 * of its own (1 in 20 each: TierBlocksCleared of the GPU, or an
 * AllBlocksCleared that names the GPU, which a bridge drops). */
static void gen_parity_tierclear(struct sim *s, struct rank *r, size_t nb)
{
    struct parity *p = r->g.par;
    uint32_t k = rnd_below(&r->g.rng, 40);
    size_t ei, ci;

    if (p->ring[0].n && k < 2) {
        struct ev *e = &r->b.ev[batch_ev(&r->b, EV_CLEARED)];
        e->parity = true;
        e->medium_s = "GPU";
        e->tier_s = "device";
        e->tier_clear = k == 0;
        if (e->tier_clear)
            p->has_last = false; /* the next request's blocks: a new root */
        return;
    }
    ei = par_store(s, r, nb, 0, "full_attention");
    r->b.ev[ei].attr = PAR_ATTR_GPU;
    par_attr_apply(&r->b.ev[ei], PAR_ATTR_GPU);
    p->last = r->b.h[r->b.ev[ei].h_off + nb - 1];
    p->has_last = true;
    ci = par_store_again(r, ei, 1, "full_attention");
    r->b.ev[ci].attr = PAR_ATTR_CPU;
    par_attr_apply(&r->b.ev[ci], PAR_ATTR_CPU);
    par_save(s, r, ei);
    par_save(s, r, ci);
    par_hold(r, ei);
    par_hold(r, ci);
}

/* One batch of a parity workload. */
static void gen_parity(struct sim *s, struct rank *r)
{
    struct parity *p = r->g.par;
    struct gen *g = &r->g;
    enum workload wl = s->o.wl;
    size_t nb = 1 + rnd_below(&g->rng, 3);
    bool fresh = !p->has_last || p->end_conv || rnd_below(&g->rng, 4) == 0;

    for (int i = 0; i < PAR_GROUPS; i++)
        p->ring[i].keep = (wl == WL_HYBRID || wl == WL_TIERCLEAR) && i == 0 ? PAR_KEEP0 : PAR_KEEP;
    if (s->o.report_full)
        par_report_full(s, r);
    p->ncur = 0;
    if (fresh) {
        p->has_last = p->end_conv = false;
        p->conv_ns = rnd_below(&g->rng, 3) ? 1 + (int)rnd_below(&g->rng, 2) : 0;
        p->attr = rnd_below(&g->rng, 2) ? 0 : (int)rnd_below(&g->rng, PAR_NATTRS);
    }
    if (wl == WL_HYBRID || wl == WL_TWOGROUPS)
        gen_parity_groups(s, r, nb);
    else if (wl == WL_TIERCLEAR)
        gen_parity_tierclear(s, r, nb);
    else
        gen_parity_chain(s, r, nb, fresh);
    memcpy(p->saved, p->cur, p->ncur * sizeof *p->cur);
    p->nsaved = p->ncur;
    par_decide(r);
}

/* ------------------------- parity truth: what a bridge publishes for them */

/* Dynamo's relay, rule by rule (docs/router-events.md; Dynamo's
 * lib/kv-router/src/zmq_wire/mod.rs and lib/llm/src/kv_router/publisher/
 * dedup.rs), applied to each event of the batch in order: e->fwd, e->drop
 * (the reason a store or remove publishes nothing), the hashes a remove
 * releases (e->rel_off, e->nrel in batch.h) and the namespace the router
 * hashes a store with (e->truth_ns).  One rule differs from dedup.rs, as
 * kvbridge's: copies are counted per (tier, group, hash), so a store that
 * repeats a resident copy (kv_cache_report_mode: full) adds none and is
 * not republished, and a remove releases only a copy that was counted. */

static int par_tier(const char *medium)
{
    static const struct {
        const char *name;
        int tier;
    } map[] = {{"GPU", 0},       {"DEVICE", 0}, {"CPU", 1},   {"CPU_PINNED", 1}, {"CPU_TIER1", 1},
               {"CPU_TIER2", 2}, {"DISK", 2},   {"NVME", 2},  {"STORAGE", 2},    {"EXTERNAL", 3},
               {"NETWORK", 3},   {"REMOTE", 3}, {"SHARED", 3}};
    if (!medium || !*medium)
        return 0;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(medium, map[i].name))
            return map[i].tier;
    return -1;
}

static bool par_main_kind(const char *k)
{
    return !strcmp(k, "full_attention") || !strcmp(k, "mla_attention") ||
           !strcmp(k, "sink_full_attention");
}

static uint64_t par_copy_key(int tier, int group, uint64_t h)
{
    return h ^ mix64(0x636f7079ULL + (uint64_t)tier * 16 + (uint64_t)group);
}

static uint64_t par_count_key(int tier, uint64_t h)
{
    return h ^ mix64(0x636e74ULL + (uint64_t)tier);
}

/* Steps 1-5 (placement, kind): NULL when the event goes on, else the reason. */
static const char *par_filter(struct parity *p, const struct ev *e, int *tier)
{
    if (e->ownership_s)
        return !strcmp(e->ownership_s, "kvcr") ? "unsupported_ownership" : "unknown_ownership";
    if (e->locality_s && strcmp(e->locality_s, "LOCAL"))
        return "non_local_locality";
    if ((*tier = par_tier(e->medium_s)) < 0)
        return "unknown_medium";
    if (*tier >= 2)
        return NULL; /* disk and external: no group rules */
    if (e->type == EV_STORED && e->kind_s)
        p->learned[e->group] = par_main_kind(e->kind_s) ? 1 : 2;
    if (e->kind_s)
        return par_main_kind(e->kind_s) ? NULL : "non_main_attention_kind";
    if (p->learned[e->group])
        return p->learned[e->group] == 1 ? NULL : "non_main_attention_group";
    return e->group == 0 ? NULL : "unlearned_group_idx";
}

/* Step 6 for a store: its namespace (own, else its parent's); false when
 * the parent's is ambiguous. */
static bool par_namespace(struct parity *p, const struct batch *b, struct ev *e)
{
    uint32_t ns = (uint32_t)e->salt_ns;

    if (!ns && e->has_parent) {
        uint32_t pn = map_get(&p->ns, e->parent);
        if (pn == PAR_AMBIG)
            return false;
        ns = pn == MAP_NONE ? 0 : pn;
    }
    e->truth_ns = (int)ns;
    for (size_t i = 0; i < e->nh; i++) {
        uint64_t h = b->h[e->h_off + i];
        uint32_t old = map_get(&p->ns, h);
        if (old == MAP_NONE && ns)
            map_put(&p->ns, h, ns);
        else if (old != MAP_NONE && old != ns)
            map_put(&p->ns, h, PAR_AMBIG);
    }
    return true;
}

static bool par_dup_hash(const struct batch *b, const struct ev *e)
{
    for (size_t i = 0; i < e->nh; i++) {
        if (e->has_parent && b->h[e->h_off + i] == e->parent)
            return true;
        for (size_t j = 0; j < i; j++)
            if (b->h[e->h_off + i] == b->h[e->h_off + j])
                return true;
    }
    return false;
}

static const char *par_decide_store(struct parity *p, const struct batch *b, struct ev *e, int tier)
{
    size_t added = 0;

    if (tier < 2 && !par_namespace(p, b, e))
        return "ambiguous_cache_namespace";
    if (par_dup_hash(b, e))
        return "duplicate_hash";
    for (size_t i = 0; i < e->nh; i++) {
        uint64_t h = b->h[e->h_off + i], ck = par_copy_key(tier, e->group, h);
        uint32_t n;
        if (map_get(&p->copies, ck) != MAP_NONE)
            continue;
        map_put(&p->copies, ck, 1);
        n = map_get(&p->count, par_count_key(tier, h));
        map_put(&p->count, par_count_key(tier, h), n == MAP_NONE ? 1 : n + 1);
        added++;
    }
    return added ? NULL : "resident_repeat";
}

/* A remove: the hashes whose last copy goes, appended to batch.h. */
static const char *par_decide_remove(struct parity *p, struct batch *b, size_t ei, int tier)
{
    size_t nh = b->ev[ei].nh, off = b->ev[ei].h_off;
    int group = b->ev[ei].group;

    b->ev[ei].rel_off = b->nh;
    for (size_t i = 0; i < nh; i++) {
        uint64_t h = b->h[off + i], ck = par_copy_key(tier, group, h), nk = par_count_key(tier, h);
        uint32_t n = map_get(&p->count, nk);
        if (tier < 2 && map_get(&p->ns, h) != PAR_AMBIG)
            map_del(&p->ns, h);
        if (n != MAP_NONE && !map_del(&p->copies, ck))
            continue; /* another group's copy: that one is still there */
        if (n != MAP_NONE && n > 1) {
            map_put(&p->count, nk, n - 1);
            continue;
        }
        map_del(&p->count, nk);
        *batch_hashes(b, 1) = h;
        b->ev[ei].nrel++;
    }
    return b->ev[ei].nrel ? NULL : "copies_remain";
}

/* TierBlocksCleared of one tier: the engine's blocks of that tier leave its
 * rings, and the bridge's copies of that tier go (Dynamo's indexer clears
 * that tier only; tierclear carries no salts, so no namespace records). */
static void par_tier_clear(struct parity *p, int tier)
{
    for (int g = 0; g < PAR_GROUPS; g++) {
        struct pring *q = &p->ring[g];
        size_t kept = 0;
        for (size_t i = 0; q->keep && i < q->n; i++) {
            size_t at = (q->head + i) % q->keep;
            uint64_t h = q->h[at];
            if (par_tier(par_attrs[q->attr[at]].medium) != tier) {
                size_t to = (q->head + kept++) % q->keep;
                q->h[to] = h;
                q->attr[to] = q->attr[at];
                continue;
            }
            map_del(&p->copies, par_copy_key(tier, g, h));
            map_del(&p->count, par_count_key(tier, h));
        }
        q->n = kept;
    }
}

static void par_decide(struct rank *r)
{
    struct parity *p = r->g.par;
    struct batch *b = &r->b;

    for (size_t i = 0; i < b->nev; i++) {
        struct ev *e = &b->ev[i];
        const char *why;
        int tier = 0;
        if (e->type == EV_CLEARED && e->tier_clear) {
            if ((tier = par_tier(e->medium_s)) < 0)
                e->drop = "unknown_medium";
            else
                par_tier_clear(p, tier);
            continue;
        }
        if (e->type == EV_CLEARED && e->medium_s) { /* AllBlocksCleared naming a tier */
            e->drop = "ambiguous_scoped_clear";
            continue;
        }
        if (e->type == EV_CLEARED) {
            map_clear(&p->copies);
            map_clear(&p->count);
            map_clear(&p->ns);
            continue;
        }
        why = par_filter(p, e, &tier);
        if (!why)
            why = e->type == EV_STORED ? par_decide_store(p, b, e, tier)
                                       : par_decide_remove(p, b, i, tier);
        e = &b->ev[i];
        e->fwd = !why;
        e->drop = why;
    }
}

/* -------------------------------------------------- generator: realistic */

static enum medium device_medium(struct gen *g)
{
    return rnd_below(&g->rng, 10) == 0 ? MED_NIL : MED_GPU;
}

static void leaf_unlink(struct gen *g, int32_t si)
{
    struct slot *sl = &g->slots[si];
    if (sl->prev >= 0)
        g->slots[sl->prev].next = sl->next;
    else
        g->leaf_head = sl->next;
    if (sl->next >= 0)
        g->slots[sl->next].prev = sl->prev;
    else
        g->leaf_tail = sl->prev;
    sl->in_leaf = false;
}

/* Links si in before `at` (-1 = at the tail). */
static void leaf_link_before(struct gen *g, int32_t si, int32_t at)
{
    struct slot *sl = &g->slots[si];
    sl->next = at;
    sl->prev = at >= 0 ? g->slots[at].prev : g->leaf_tail;
    if (sl->prev >= 0)
        g->slots[sl->prev].next = si;
    else
        g->leaf_head = si;
    if (at >= 0)
        g->slots[at].prev = si;
    else
        g->leaf_tail = si;
    sl->in_leaf = true;
}

/* A block that just became a leaf goes where its age puts it (usually the head). */
static void leaf_insert_by_age(struct gen *g, int32_t si)
{
    int32_t at = g->leaf_head;
    while (at >= 0 && g->slots[at].last_use <= g->slots[si].last_use)
        at = g->slots[at].next;
    leaf_link_before(g, si, at);
}

static void touch(struct gen *g, int32_t si)
{
    g->slots[si].last_use = g->tick;
    if (g->slots[si].in_leaf) {
        leaf_unlink(g, si);
        leaf_link_before(g, si, -1);
    }
}

static void slot_remove(struct gen *g, int32_t si)
{
    struct slot *sl = &g->slots[si];
    map_del(&g->dev, sl->hash);
    if (sl->in_leaf)
        leaf_unlink(g, si);
    if (sl->parent >= 0 && --g->slots[sl->parent].nchild == 0)
        leaf_insert_by_age(g, sl->parent);
    sl->used = false;
    g->freel[g->nfree++] = si;
}

/*
 * Evict `need` device blocks: leaves only (a child is never left without its
 * parent, as vLLM frees tails first), least recently used first, never one
 * touched in the current action (g->tick).  One BlockRemoved event lists them.
 * Returns how many were evicted.
 */
static size_t dev_evict(struct rank *r, size_t need)
{
    struct gen *g = &r->g;
    struct batch *b = &r->b;
    size_t done = 0, ei = SIZE_MAX;

    while (done < need) {
        int32_t si = g->leaf_head;
        if (si < 0 || g->slots[si].last_use >= g->tick)
            break;
        if (ei == SIZE_MAX) {
            ei = batch_ev(b, EV_REMOVED);
            b->ev[ei].medium = device_medium(g);
        }
        *batch_hashes(b, 1) = g->slots[si].hash;
        b->ev[ei].nh++;
        slot_remove(g, si);
        done++;
    }
    return done;
}

/* Mirror a device store into a FIFO tier (CPU offload, or group 1). */
static void mirror_store(struct rank *r, struct fifoset *f, size_t src_ev, enum medium med,
                         int group)
{
    struct batch *b = &r->b;
    struct ev src = b->ev[src_ev];
    size_t ei;

    for (size_t i = 0; i < src.nh; i++)
        if (map_get(&f->map, b->h[src.h_off + i]) != MAP_NONE)
            return; /* partly there already: skip, keep it simple */
    if (src.nh > f->cap)
        return;
    if (f->n + src.nh > f->cap) {
        size_t ri = batch_ev(b, EV_REMOVED);
        b->ev[ri].medium = med;
        b->ev[ri].group = group;
        while (f->n + src.nh > f->cap) {
            uint64_t old = f->ring[f->head];
            map_del(&f->map, old);
            f->head = (f->head + 1) % f->cap;
            f->n--;
            *batch_hashes(b, 1) = old;
            b->ev[ri].nh++;
        }
    }
    ei = batch_ev(b, EV_STORED);
    b->ev[ei] = src; /* shares hashes and tokens with the device store */
    b->ev[ei].medium = med;
    b->ev[ei].group = group;
    for (size_t i = 0; i < src.nh; i++) {
        uint64_t h = b->h[src.h_off + i];
        map_put(&f->map, h, 1);
        f->ring[(f->head + f->n) % f->cap] = h;
        f->n++;
    }
}

static void prefix_tokens(const struct sim *s, unsigned p, unsigned blk, uint32_t *tok)
{
    uint64_t st = mix64(s->o.seed ^ mix64(((uint64_t)p << 16) + blk + 0x707265ULL));
    random_tokens(&st, tok, s->o.bs);
}

static unsigned prefix_len(const struct sim *s, unsigned p)
{
    return 1 + (unsigned)(mix64(s->o.seed ^ (0x6c656eULL + p)) % MAX_PREFIX);
}

/* Stores blocks [k, n) of a chain; blocks [0, k) are cached (and touched). */
static void store_chain(struct sim *s, struct rank *r, const uint64_t *hash, size_t k, size_t n,
                        int lora, int act_slot)
{
    struct gen *g = &r->g;
    struct batch *b = &r->b;
    unsigned bs = s->o.bs;
    size_t nnew = n - k, ei;
    int32_t parent_slot = -1;
    uint64_t *h;
    uint32_t *tok;

    if (nnew > g->nfree)
        dev_evict(r, nnew - g->nfree);
    // cppcheck-suppress duplicateCondition ; dev_evict() raised g->nfree
    if (nnew > g->nfree)
        return; /* cache too small for this request: skip it */
    if (k > 0)
        parent_slot = (int32_t)map_get(&g->dev, hash[k - 1]);

    ei = batch_ev(b, EV_STORED);
    h = batch_hashes(b, nnew);
    tok = batch_tokens(b, nnew * bs);
    memcpy(h, hash + k, nnew * sizeof *h);
    memcpy(tok, s->chain_tok + k * bs, nnew * bs * sizeof *tok);
    b->ev[ei].nh = nnew;
    b->ev[ei].has_parent = k > 0;
    b->ev[ei].parent = k > 0 ? hash[k - 1] : 0;
    b->ev[ei].lora = lora;
    b->ev[ei].medium = device_medium(g);

    for (size_t i = k; i < n; i++) {
        int32_t si = g->freel[--g->nfree];
        struct slot *sl = &g->slots[si];
        sl->hash = hash[i];
        sl->last_use = g->tick;
        sl->parent = parent_slot;
        sl->nchild = 0;
        sl->used = true;
        if (parent_slot >= 0 && g->slots[parent_slot].nchild++ == 0 &&
            g->slots[parent_slot].in_leaf)
            leaf_unlink(g, parent_slot);
        leaf_link_before(g, si, -1);
        map_put(&g->dev, hash[i], (uint32_t)si);
        parent_slot = si;
    }
    if (act_slot >= 0) {
        g->act[act_slot].last = hash[n - 1];
        g->act[act_slot].lora = lora;
        g->act[act_slot].live = true;
    }
    if (rnd_below(&g->rng, 10) == 0)
        mirror_store(r, &g->cpu, ei, MED_CPU, 0);
    if (rnd_below(&g->rng, 10) == 0)
        mirror_store(r, &g->g1, ei, MED_GPU, 1);
}

/* A new request: shared prefix (often), unique suffix, maybe a LoRA adapter. */
static void act_request(struct sim *s, struct rank *r)
{
    struct gen *g = &r->g;
    unsigned bs = s->o.bs;
    uint64_t hash[MAX_CHAIN];
    size_t n = 0, k = 0;
    int lora = rnd_below(&g->rng, 100) < 15 ? 1 + (int)rnd_below(&g->rng, NLORA) : 0;

    if (rnd_below(&g->rng, 10) < 7) {
        unsigned p = rnd_below(&g->rng, NPREFIX), len = prefix_len(s, p);
        for (unsigned i = 0; i < len; i++)
            prefix_tokens(s, p, i, s->chain_tok + (size_t)i * bs);
        n = len;
    }
    {
        unsigned suffix = 1 + rnd_below(&g->rng, MAX_SUFFIX);
        random_tokens(&g->rng, s->chain_tok + n * bs, (size_t)suffix * bs);
        n += suffix;
    }
    for (size_t i = 0; i < n; i++)
        hash[i] = block_hash(i ? hash[i - 1] : 0, i > 0, s->chain_tok + i * bs, bs, lora);
    /* prefix-cache hit: the longest cached prefix is reused, not stored again */
    while (k < n) {
        uint32_t si = map_get(&g->dev, hash[k]);
        if (si == MAP_NONE)
            break;
        touch(g, (int32_t)si);
        k++;
    }
    if (k == n)
        return; /* fully cached */
    store_chain(s, r, hash, k, n, lora, (int)rnd_below(&g->rng, NACTIVE));
}

/* A running request completes one more block. */
static void act_decode(struct sim *s, struct rank *r)
{
    struct gen *g = &r->g;
    unsigned bs = s->o.bs;
    struct active *a = &g->act[rnd_below(&g->rng, NACTIVE)];
    uint64_t hash[2];
    uint32_t si;

    if (!a->live)
        return;
    si = map_get(&g->dev, a->last);
    if (si == MAP_NONE) {
        a->live = false; /* its blocks were evicted: the request is gone */
        return;
    }
    touch(g, (int32_t)si);
    hash[0] = a->last;
    random_tokens(&g->rng, s->chain_tok + bs, bs);
    hash[1] = block_hash(a->last, true, s->chain_tok + bs, bs, a->lora);
    if (map_get(&g->dev, hash[1]) != MAP_NONE)
        return;
    store_chain(s, r, hash, 1, 2, a->lora, (int)(a - g->act));
}

static void gen_realistic(struct sim *s, struct rank *r)
{
    struct gen *g = &r->g;
    uint32_t x = rnd_below(&g->rng, 10000);
    unsigned nact;

    if (x < 500)
        return;    /* empty heartbeat batch */
    if (x < 505) { /* reset_prefix_cache() */
        batch_ev(&r->b, EV_CLEARED);
        gen_clear(g);
    }
    nact = 1 + rnd_below(&g->rng, 3);
    for (unsigned i = 0; i < nact; i++) {
        uint32_t y = rnd_below(&g->rng, 100);
        g->tick++;
        if (y < 60)
            act_request(s, r);
        else if (y < 95)
            act_decode(s, r);
        else
            dev_evict(r, 1 + rnd_below(&g->rng, 8));
    }
}

/* --------------------------------------------------------------- encoding */

static void pack_cstr(msgpack_packer *pk, const char *str)
{
    size_t n = strlen(str);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, str, n);
}

static void pack_hash(const struct sim *s, msgpack_packer *pk, uint64_t h)
{
    unsigned char raw[32];

    switch (s->o.hash) {
    case HASH_UINT: msgpack_pack_uint64(pk, h); break;
    case HASH_INT: {
        int64_t v;
        memcpy(&v, &h, sizeof v);
        msgpack_pack_int64(pk, v);
        break;
    }
    case HASH_BIN:
        /* a SHA-256-sized digest whose last 8 bytes (big-endian) are the hash */
        for (int i = 0; i < 3; i++)
            put_be64(raw + 8 * i, mix64(h + (uint64_t)i + 1));
        put_be64(raw + 24, h);
        msgpack_pack_bin(pk, sizeof raw);
        msgpack_pack_bin_body(pk, raw, sizeof raw);
        break;
    }
}

static void pack_hashes(const struct sim *s, msgpack_packer *pk, const struct batch *b,
                        const struct ev *e)
{
    msgpack_pack_array(pk, e->nh);
    for (size_t i = 0; i < e->nh; i++)
        pack_hash(s, pk, b->h[e->h_off + i]);
}

static void pack_medium(msgpack_packer *pk, enum medium m)
{
    if (m == MED_NIL)
        msgpack_pack_nil(pk);
    else
        pack_cstr(pk, m == MED_CPU ? "CPU" : "GPU");
}

static void pack_parent(const struct sim *s, msgpack_packer *pk, const struct ev *e)
{
    if (e->has_parent)
        pack_hash(s, pk, e->parent);
    else
        msgpack_pack_nil(pk);
}

static void pack_tokens(const struct sim *s, msgpack_packer *pk, const struct batch *b,
                        const struct ev *e)
{
    size_t n = e->nh * s->o.bs;
    msgpack_pack_array(pk, n);
    if (e->eagle) { /* bigrams: pair k = (t_k, t_k+1) */
        for (size_t i = 0; i < n; i++) {
            msgpack_pack_array(pk, 2);
            msgpack_pack_uint32(pk, b->tok[e->t_off + i]);
            msgpack_pack_uint32(pk, b->tok[e->t_off + i + 1]);
        }
        return;
    }
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint32(pk, b->tok[e->t_off + i]);
}

static void pack_mm_item(msgpack_packer *pk, const struct mm_item *it)
{
    switch (it->kind) {
    case MMI_HEX_OFF:
    case MMI_OPAQUE_OFF:
        msgpack_pack_array(pk, 2);
        pack_cstr(pk, it->str);
        msgpack_pack_int64(pk, it->off);
        break;
    case MMI_BIN:
        msgpack_pack_bin(pk, strlen(it->str));
        msgpack_pack_bin_body(pk, it->str, strlen(it->str));
        break;
    default: pack_cstr(pk, it->str); break;
    }
}

/* NAMED: the LoRA name goes in (vLLM); not with --lora-id-only. */
static void pack_extra_keys(msgpack_packer *pk, const struct ev *e, bool named)
{
    if (e->mm) {
        struct mm_item it[MM_MAX_ITEMS];
        msgpack_pack_array(pk, e->nh);
        for (size_t i = 0; i < e->nh; i++) {
            int n = mm_block_items(e, i, it);
            if (n < 0) {
                msgpack_pack_nil(pk);
                continue;
            }
            msgpack_pack_array(pk, (size_t)n);
            for (int k = 0; k < n; k++)
                pack_mm_item(pk, &it[k]);
        }
        return;
    }
    if (!e->lora || !named) {
        msgpack_pack_nil(pk);
        return;
    }
    msgpack_pack_array(pk, e->nh);
    for (size_t i = 0; i < e->nh; i++) {
        msgpack_pack_array(pk, 1);
        pack_cstr(pk, lora_names[e->lora]);
    }
}

static void pack_lora_id(msgpack_packer *pk, const struct ev *e)
{
    if (e->lora)
        msgpack_pack_int(pk, e->lora);
    else
        msgpack_pack_nil(pk);
}

/* TensorRT-LLM (--lora-id-only) sends lora_id with lora_name nil. */
static void pack_lora_name(msgpack_packer *pk, const struct ev *e, bool named)
{
    if (e->lora && named)
        pack_cstr(pk, lora_names[e->lora]);
    else
        msgpack_pack_nil(pk);
}

static void pack_kind(msgpack_packer *pk, const struct ev *e)
{
    pack_cstr(pk, e->group ? "sliding_window" : "full_attention");
}

static void pack_window(msgpack_packer *pk, const struct ev *e)
{
    if (e->group)
        msgpack_pack_int(pk, 4096);
    else
        msgpack_pack_nil(pk);
}

/* vLLM <= 0.23 / SGLang: tagged arrays, 12-element BlockStored */
static void pack_event_positional(struct sim *s, const struct batch *b, const struct ev *e)
{
    msgpack_packer *pk = &s->pk;

    switch (e->type) {
    case EV_STORED:
        msgpack_pack_array(pk, 12);
        pack_cstr(pk, "BlockStored");
        pack_hashes(s, pk, b, e);
        pack_parent(s, pk, e);
        pack_tokens(s, pk, b, e);
        msgpack_pack_unsigned_int(pk, s->o.bs);
        pack_lora_id(pk, e);
        pack_medium(pk, e->medium);
        pack_lora_name(pk, e, !s->o.lora_id_only);
        pack_extra_keys(pk, e, !s->o.lora_id_only);
        msgpack_pack_int(pk, e->group);
        pack_kind(pk, e);
        pack_window(pk, e);
        break;
    case EV_REMOVED:
        msgpack_pack_array(pk, 4);
        pack_cstr(pk, "BlockRemoved");
        pack_hashes(s, pk, b, e);
        pack_medium(pk, e->medium);
        msgpack_pack_int(pk, e->group);
        break;
    case EV_CLEARED:
        msgpack_pack_array(pk, 1);
        pack_cstr(pk, "AllBlocksCleared");
        break;
    }
}

/* vLLM >= 0.24: maps with a "type" key; unknown keys; order varies; map16 */
static void pack_event_map(struct sim *s, struct rank *r, const struct batch *b, const struct ev *e)
{
    msgpack_packer *pk = &s->pk;
    uint64_t bits = rnd(&r->enc_rng);
    bool type_last = bits & 1, big = (bits >> 1) & 1;
    const char *tname = e->type == EV_STORED    ? "BlockStored"
                        : e->type == EV_REMOVED ? "BlockRemoved"
                                                : "AllBlocksCleared";

    if (e->type == EV_CLEARED) {
        msgpack_pack_map(pk, 1);
        pack_cstr(pk, "type");
        pack_cstr(pk, tname);
        return;
    }
    if (e->type == EV_REMOVED) {
        msgpack_pack_map(pk, big ? 5 : 4);
        if (!type_last) {
            pack_cstr(pk, "type");
            pack_cstr(pk, tname);
        }
        pack_cstr(pk, "block_hashes");
        pack_hashes(s, pk, b, e);
        pack_cstr(pk, "medium");
        pack_medium(pk, e->medium);
        pack_cstr(pk, "group_idx");
        msgpack_pack_int(pk, e->group);
        if (big) {
            pack_cstr(pk, "locality");
            pack_cstr(pk, "LOCAL"); /* vLLM 0.26+ and Dynamo: exact, upper case */
        }
        if (type_last) {
            pack_cstr(pk, "type");
            pack_cstr(pk, tname);
        }
        return;
    }
    {
        bool with_extra = big || e->lora || e->mm, with_window = big || e->group;
        size_t n = 1 + 7 + (with_extra ? 1 : 0) + 2 + (with_window ? 1 : 0) + (big ? 4 : 1);
        msgpack_pack_map(pk, n); /* 16 entries when big: map16 header */
        if (!type_last) {
            pack_cstr(pk, "type");
            pack_cstr(pk, tname);
        }
        pack_cstr(pk, "block_hashes");
        pack_hashes(s, pk, b, e);
        pack_cstr(pk, "parent_block_hash");
        pack_parent(s, pk, e);
        pack_cstr(pk, "token_ids");
        pack_tokens(s, pk, b, e);
        pack_cstr(pk, "block_size");
        msgpack_pack_unsigned_int(pk, s->o.bs);
        pack_cstr(pk, "lora_id");
        pack_lora_id(pk, e);
        pack_cstr(pk, "medium");
        pack_medium(pk, e->medium);
        pack_cstr(pk, "lora_name");
        pack_lora_name(pk, e, !s->o.lora_id_only);
        if (with_extra) {
            pack_cstr(pk, "extra_keys");
            pack_extra_keys(pk, e, !s->o.lora_id_only);
        }
        pack_cstr(pk, "group_idx");
        msgpack_pack_int(pk, e->group);
        pack_cstr(pk, "kv_cache_spec_kind");
        pack_kind(pk, e);
        if (with_window) {
            pack_cstr(pk, "kv_cache_spec_sliding_window");
            pack_window(pk, e);
        }
        pack_cstr(pk, "locality");
        pack_cstr(pk, "LOCAL"); /* vLLM 0.26+ and Dynamo: exact, upper case */
        if (big) {
            pack_cstr(pk, "session_id");
            msgpack_pack_nil(pk);
            /* the framework's own blocks: ownership nil (any value is
             * another owner's, dropped by Dynamo's relay and kvbridge) */
            pack_cstr(pk, "ownership");
            msgpack_pack_nil(pk);
            pack_cstr(pk, "x_kvsim_pad");
            msgpack_pack_uint64(pk, bits >> 40);
        }
        if (type_last) {
            pack_cstr(pk, "type");
            pack_cstr(pk, tname);
        }
    }
}

/* ---------------------------------------------- parity workloads: encoding */

static void pack_opt_cstr(msgpack_packer *pk, const char *str)
{
    if (str)
        pack_cstr(pk, str);
    else
        msgpack_pack_nil(pk);
}

/* salted: block 0's extra_keys carry the salt (SGLang's and vLLM's tag) */
static void pack_parity_extra(msgpack_packer *pk, const struct ev *e)
{
    char salt[64];

    if (!e->salt_ns) {
        msgpack_pack_nil(pk);
        return;
    }
    snprintf(salt, sizeof salt, SALT_PREFIX "%s", cache_namespaces[e->salt_ns - 1]);
    msgpack_pack_array(pk, e->nh);
    msgpack_pack_array(pk, 1);
    pack_cstr(pk, salt);
    for (size_t i = 1; i < e->nh; i++)
        msgpack_pack_nil(pk);
}

static void pack_parity_window(msgpack_packer *pk, const struct ev *e)
{
    if (e->kind_s && !strcmp(e->kind_s, "sliding_window"))
        msgpack_pack_int(pk, 4096);
    else
        msgpack_pack_nil(pk);
}

/* Tagged arrays (vLLM <= 0.23, SGLang): BlockStored of 12 elements (group,
 * kind, window), BlockRemoved of 4 (group; no kind). */
static void pack_parity_positional(struct sim *s, const struct batch *b, const struct ev *e)
{
    msgpack_packer *pk = &s->pk;

    if (e->type == EV_REMOVED) {
        msgpack_pack_array(pk, 4);
        pack_cstr(pk, "BlockRemoved");
        pack_hashes(s, pk, b, e);
        pack_opt_cstr(pk, e->medium_s);
        msgpack_pack_int(pk, e->group);
        return;
    }
    msgpack_pack_array(pk, 12);
    pack_cstr(pk, "BlockStored");
    pack_hashes(s, pk, b, e);
    pack_parent(s, pk, e);
    pack_tokens(s, pk, b, e);
    msgpack_pack_unsigned_int(pk, s->o.bs);
    msgpack_pack_nil(pk); /* lora_id */
    pack_opt_cstr(pk, e->medium_s);
    msgpack_pack_nil(pk); /* lora_name */
    pack_parity_extra(pk, e);
    msgpack_pack_int(pk, e->group);
    pack_opt_cstr(pk, e->kind_s);
    pack_parity_window(pk, e);
}

/* Maps (vLLM >= 0.24; 0.26+ with locality and ownership): absent keys for
 * what the event does not carry. */
static void pack_parity_map(struct sim *s, const struct batch *b, const struct ev *e)
{
    msgpack_packer *pk = &s->pk;
    bool st = e->type == EV_STORED;
    size_t n =
        4 + (e->locality_s ? 1 : 0) + (e->ownership_s ? 1 : 0) + (st ? 6 + (e->kind_s ? 2 : 0) : 0);

    msgpack_pack_map(pk, n);
    pack_cstr(pk, "type");
    pack_cstr(pk, st ? "BlockStored" : "BlockRemoved");
    pack_cstr(pk, "block_hashes");
    pack_hashes(s, pk, b, e);
    pack_cstr(pk, "medium");
    pack_opt_cstr(pk, e->medium_s);
    pack_cstr(pk, "group_idx");
    msgpack_pack_int(pk, e->group);
    if (st) {
        pack_cstr(pk, "parent_block_hash");
        pack_parent(s, pk, e);
        pack_cstr(pk, "token_ids");
        pack_tokens(s, pk, b, e);
        pack_cstr(pk, "block_size");
        msgpack_pack_unsigned_int(pk, s->o.bs);
        pack_cstr(pk, "lora_id");
        msgpack_pack_nil(pk);
        pack_cstr(pk, "lora_name");
        msgpack_pack_nil(pk);
        pack_cstr(pk, "extra_keys");
        pack_parity_extra(pk, e);
        if (e->kind_s) {
            pack_cstr(pk, "kv_cache_spec_kind");
            pack_cstr(pk, e->kind_s);
            pack_cstr(pk, "kv_cache_spec_sliding_window");
            pack_parity_window(pk, e);
        }
    }
    if (e->locality_s) {
        pack_cstr(pk, "locality");
        pack_cstr(pk, e->locality_s);
    }
    if (e->ownership_s) {
        pack_cstr(pk, "ownership");
        pack_cstr(pk, e->ownership_s);
    }
}

/* tierclear's clears, maps: {"type":"TierBlocksCleared","medium":M} or an
 * AllBlocksCleared that names a medium (ambiguous: dropped). */
static void pack_parity_cleared(struct sim *s, const struct ev *e)
{
    msgpack_packer *pk = &s->pk;

    msgpack_pack_map(pk, 2);
    pack_cstr(pk, "type");
    pack_cstr(pk, e->tier_clear ? "TierBlocksCleared" : "AllBlocksCleared");
    pack_cstr(pk, "medium");
    pack_opt_cstr(pk, e->medium_s);
}

static void pack_parity_event(struct sim *s, const struct batch *b, const struct ev *e)
{
    if (e->type == EV_CLEARED)
        pack_parity_cleared(s, e);
    else if (s->o.enc == ENC_MAP || s->o.wl == WL_REMOTE || s->o.wl == WL_TIERCLEAR)
        pack_parity_map(s, b, e);
    else
        pack_parity_positional(s, b, e);
}

static void encode_batch(struct sim *s, struct rank *r)
{
    const struct batch *b = &r->b;

    msgpack_sbuffer_clear(&s->sb);
    msgpack_pack_array(&s->pk, 3);
    msgpack_pack_double(&s->pk, wall_seconds());
    msgpack_pack_array(&s->pk, b->nev);
    for (size_t i = 0; i < b->nev; i++) {
        if (b->ev[i].parity)
            pack_parity_event(s, b, &b->ev[i]);
        else if (s->o.enc == ENC_MAP)
            pack_event_map(s, r, b, &b->ev[i]);
        else
            pack_event_positional(s, b, &b->ev[i]);
    }
    msgpack_pack_unsigned_int(&s->pk, r->idx);
}

/* ----------------------------------------------------------------- record */

/* The record format: tools/README.md. */

static const char *tier_name(enum medium m) { return m == MED_CPU ? "host_pinned" : "device"; }

static uint64_t tokens_hash(struct sim *s, const uint32_t *tok, int lora)
{
    unsigned bs = s->o.bs;
    for (unsigned i = 0; i < bs; i++) {
        s->lebuf[4 * i] = (unsigned char)(tok[i] & 0xff);
        s->lebuf[4 * i + 1] = (unsigned char)((tok[i] >> 8) & 0xff);
        s->lebuf[4 * i + 2] = (unsigned char)((tok[i] >> 16) & 0xff);
        s->lebuf[4 * i + 3] = (unsigned char)((tok[i] >> 24) & 0xff);
    }
    return XXH3_64bits_withSeed(s->lebuf, 4 * (size_t)bs, s->lora_tokens_seed[lora]);
}

/* The router's tokens_hash of block i of a multimodal or EAGLE event,
 * computed here from the rules of docs/router-events.md section 3 (the test oracle:
 * nothing from src/): seed 1337 + XXH3(lora_name, 0) + XXH3(namespace, 1);
 * the block's tokens (bs, or bs + 1 for EAGLE) as u32-LE, then its
 * multimodal hashes sorted ascending as u64-LE. */
static uint64_t mm_item_hash(const struct mm_item *it, const char *lora, bool *has)
{
    size_t n = strlen(it->str);
    bool hex64 = n == 64 && strspn(it->str, "0123456789abcdefABCDEF") == 64;
    bool pair = it->kind == MMI_HEX_OFF || it->kind == MMI_OPAQUE_OFF;
    *has = false;
    if (it->kind == MMI_BIN)
        return 0; /* bin: nothing */
    if (!pair && (!hex64 || (lora && !strcmp(it->str, lora))))
        return 0; /* bare: the LoRA name, a salt, anything but a digest */
    if (hex64) {  /* bare or [identifier, int]: the first 16 hex digits */
        char first[17];
        memcpy(first, it->str, 16);
        first[16] = '\0';
        *has = true;
        return strtoull(first, NULL, 16);
    }
    if (n == 0)
        return 0;
    *has = true; /* [identifier, int], another identifier: hashed */
    return XXH3_64bits_withSeed(it->str, n, 0);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* A router given video_token_id VID too: an object is an image run or
 * video runs one after another (text between them); objects take the mm
 * hashes in order when they are as many.  kvsim's blocks each hold both
 * kinds, so no block tells a hash's kind (that takes one kind and one
 * hash): any other count is false, the native hash.  A block without runs
 * is plain tokens.  Writes the tokens' bytes to BUF at *LEN. */
static bool oracle_video(unsigned char *buf, size_t *len, const uint32_t *tok, size_t ntok,
                         uint32_t img, uint32_t vid, const uint64_t *mm, size_t nmm)
{
    size_t objs = 0;
    int last = 0, prev = 0;
    for (size_t k = 0; k < ntok; k++) {
        int kind = tok[k] == img ? 1 : tok[k] == vid ? 2 : 0;
        if (kind && kind != prev) {
            objs += kind == 1 || last != 2;
            last = kind;
        }
        prev = kind;
    }
    if (objs != 0 && objs != nmm)
        return false;
    size_t obj = 0;
    last = prev = 0;
    for (size_t k = 0; k < ntok; k++) {
        uint32_t v = tok[k];
        int kind = v == img ? 1 : v == vid ? 2 : 0;
        if (kind && kind != prev) {
            obj += kind == 1 || last != 2;
            last = kind;
        }
        prev = kind;
        if (kind)
            v = 1000000u + (uint32_t)(mm[obj - 1] & 0x3fffffffu);
        for (int j = 0; j < 4; j++)
            buf[(*len)++] = (unsigned char)(v >> (8 * j));
    }
    return true;
}

/* The rule on explicit inputs: ntok tokens, the LoRA name (or NULL), block
 * 0's extra_keys items (n0 < 0: nil; the namespace), the block's own items. */
static uint64_t oracle_hash_ns(unsigned char *buf, const uint32_t *tok, size_t ntok,
                               const char *lora, const char *inherited, const struct mm_item *first,
                               int n0, const struct mm_item *it, int n, uint32_t img, uint32_t vid)
{
    uint64_t seed = TOKENS_SEED, mm[MM_MAX_ITEMS];
    size_t nmm = 0, len = 0;

    if (lora && *lora)
        seed += XXH3_64bits_withSeed(lora, strlen(lora), 0);
    /* the namespace: block 0's first bare string tagged dynamo-cache-salt:
     * (one item equal to the LoRA name skipped first: never the salt here) */
    for (int k = 0; k < n0; k++) {
        if (first[k].kind == MMI_HEX_OFF || first[k].kind == MMI_OPAQUE_OFF ||
            first[k].kind == MMI_BIN)
            continue;
        if (!strncmp(first[k].str, SALT_PREFIX, strlen(SALT_PREFIX))) {
            const char *ns = first[k].str + strlen(SALT_PREFIX);
            if (*ns) {
                seed += XXH3_64bits_withSeed(ns, strlen(ns), 1);
                inherited = NULL;
            }
            break;
        }
    }
    if (inherited && *inherited) /* no salt of its own: the parent's namespace */
        seed += XXH3_64bits_withSeed(inherited, strlen(inherited), 1);
    for (int k = 0; k < n; k++) {
        bool has;
        uint64_t h = mm_item_hash(&it[k], lora, &has);
        if (has)
            mm[nmm++] = h;
    }
    if (vid && nmm) {
        if (oracle_video(buf, &len, tok, ntok, img, vid, mm, nmm))
            return XXH3_64bits_withSeed(buf, len, seed);
    } else if (img && nmm) {
        /* a router given image_token_id IMG: the k-th run of IMG becomes
         * 1000000 + (low 30 bits of the k-th mm hash, extra_keys order;
         * the last for further runs), and no mm hash is appended */
        size_t obj = 0;
        bool in_run = false;
        for (size_t k = 0; k < ntok; k++) {
            uint32_t v = tok[k];
            if (v == img) {
                in_run = true;
                v = 1000000u + (uint32_t)(mm[obj < nmm ? obj : nmm - 1] & 0x3fffffffu);
            } else if (in_run) {
                in_run = false;
                obj++;
            }
            for (int j = 0; j < 4; j++)
                buf[len++] = (unsigned char)(v >> (8 * j));
        }
        return XXH3_64bits_withSeed(buf, len, seed);
    }
    qsort(mm, nmm, sizeof *mm, cmp_u64);
    for (size_t k = 0; k < ntok; k++)
        for (int j = 0; j < 4; j++)
            buf[len++] = (unsigned char)(tok[k] >> (8 * j));
    for (size_t k = 0; k < nmm; k++)
        for (int j = 0; j < 8; j++)
            buf[len++] = (unsigned char)(mm[k] >> (8 * j));
    return XXH3_64bits_withSeed(buf, len, seed);
}

static uint64_t oracle_hash(unsigned char *buf, const uint32_t *tok, size_t ntok, const char *lora,
                            const struct mm_item *first, int n0, const struct mm_item *it, int n,
                            uint32_t img)
{
    return oracle_hash_ns(buf, tok, ntok, lora, NULL, first, n0, it, n, img, 0);
}

static uint64_t oracle_tokens_hash(struct sim *s, const struct batch *b, const struct ev *e,
                                   size_t i)
{
    struct mm_item it[MM_MAX_ITEMS], first[MM_MAX_ITEMS];
    int n = 0, n0 = 0;

    if (e->mm) {
        n = mm_block_items(e, i, it);
        n0 = mm_block_items(e, 0, first);
    }
    return oracle_hash_ns(s->orbuf, b->tok + e->t_off + i * s->o.bs, s->o.bs + (e->eagle ? 1 : 0),
                          e->lora ? lora_names[e->lora] : NULL,
                          e->ns_inherited ? cache_namespaces[e->ns_inherited - 1] : NULL, first, n0,
                          it, n, s->o.image_token, s->o.video_token);
}

/* --oracle-selftest: the known answers of docs/router-events.md section 3.4 (computed there
 * with python3-xxhash), through oracle_hash(). */
static int oracle_selftest(void)
{
    static const uint32_t qwen[17] = {151644, 872,    198, 9064,   374,   279, 6722,   315, 5616,
                                      30,     151645, 198, 151644, 77091, 198, 151667, 1000};
    /* sha256("image-1"), sha256("image-2") */
    static const char img1[] = "0cf457e24a479f02fd4d34540389f720f0807dcff92a7562108165b2637ea82f";
    static const char img2[] = "5a0717cb6596468ea1dffa86011f9b0f497348d80421835b51799f9aeb455642";
    struct mm_item a[3] = {0}, salt = {.kind = MMI_SALT};
    unsigned char buf[4 * 17 + 8 * MM_MAX_ITEMS];
    uint32_t eag[33];
    int bad = 0;

    snprintf(salt.str, sizeof salt.str, SALT_PREFIX "tenant-a");
#define EXPECT(what, got, want)                                                            \
    do {                                                                                   \
        uint64_t g_ = (got);                                                               \
        if (g_ != (want)) {                                                                \
            fprintf(stderr, "kvsim: oracle %s: %" PRIu64 ", want %" PRIu64 "\n", what, g_, \
                    (uint64_t)(want));                                                     \
            bad++;                                                                         \
        }                                                                                  \
    } while (0)
    EXPECT("no salt", oracle_hash(buf, qwen, 16, NULL, NULL, 0, NULL, 0, 0),
           7652252100776996844ULL);
    EXPECT("lora", oracle_hash(buf, qwen, 16, "adapter-a", NULL, 0, NULL, 0, 0),
           18179192224704087310ULL);
    EXPECT("namespace", oracle_hash(buf, qwen, 16, NULL, &salt, 1, NULL, 0, 0),
           6220064897286669353ULL);
    EXPECT("lora + namespace", oracle_hash(buf, qwen, 16, "adapter-a", &salt, 1, NULL, 0, 0),
           17508456296452210659ULL);
    /* sha256 hex digests: img1 -> 933467652192968450, img2 -> 6487179950600636046 */
    a[0].kind = MMI_HEX;
    snprintf(a[0].str, sizeof a[0].str, "%s", img1);
    a[1].kind = MMI_OPAQUE_OFF;
    snprintf(a[1].str, sizeof a[1].str, "opaque-image-0");
    a[1].off = 3;
    EXPECT("img1 + opaque", oracle_hash(buf, qwen, 16, NULL, NULL, 0, a, 2, 0),
           18076277279652650428ULL);
    /* img2 as [identifier, offset] (vLLM >= 0.19) */
    a[2].kind = MMI_HEX_OFF;
    snprintf(a[2].str, sizeof a[2].str, "%s", img2);
    a[2].off = -4;
    struct mm_item two[2] = {a[2], a[0]};
    EXPECT("img2 + img1", oracle_hash(buf, qwen, 16, NULL, NULL, 0, two, 2, 0),
           11552180366119068694ULL);
    /* video (two runs split by 7) then image against [0x29.., 0x2a..]: the
     * known answer of check_convert mm_video_substitution, block 0 */
    static const uint32_t av[16] = {10,     151656, 151656, 7,  151656, 151656, 8,  151655,
                                    151655, 20,     21,     22, 23,     24,     25, 26};
    struct mm_item vi[2] = {{.kind = MMI_HEX}, {.kind = MMI_HEX}};
    snprintf(vi[0].str, sizeof vi[0].str, "%016x%048d", 0x29, 0);
    snprintf(vi[1].str, sizeof vi[1].str, "%016x%048d", 0x2a, 0);
    EXPECT("video + image", oracle_hash_ns(buf, av, 16, NULL, NULL, NULL, 0, vi, 2, 151655, 151656),
           6579184199688108642ULL);
    EXPECT("eagle 16 pairs", oracle_hash(buf, qwen, 17, NULL, NULL, 0, NULL, 0, 0),
           8531672197035749033ULL);
    for (uint32_t i = 0; i < 33; i++)
        eag[i] = i * 7 + 1;
    EXPECT("eagle block 0", oracle_hash(buf, eag, 17, NULL, NULL, 0, NULL, 0, 0),
           7581774737841154026ULL);
    EXPECT("eagle block 1", oracle_hash(buf, eag + 16, 17, NULL, NULL, 0, NULL, 0, 0),
           18042718775135788396ULL);
    /* --image-token-id: the known answer of check_convert's
     * mm_pad_substitution (pads by hand, libxxhash in a standalone program) */
    enum { IMG = 151655 };
    static const uint32_t pt[16] = {10, 20,  IMG, IMG, IMG, IMG, IMG, IMG,
                                    30, IMG, IMG, IMG, IMG, 40,  50,  60};
    struct mm_item pm[2] = {{.kind = MMI_HEX}, {.kind = MMI_HEX}};
    snprintf(pm[0].str, sizeof pm[0].str, "00000000ffffffff%048d", 0);
    snprintf(pm[1].str, sizeof pm[1].str, "0000000000000005%048d", 0);
    EXPECT("image pads", oracle_hash(buf, pt, 16, NULL, NULL, 0, pm, 2, IMG),
           6199498804420141183ULL);
    EXPECT("eagle + lora + namespace + img1",
           oracle_hash(buf, qwen, 17, "adapter-a", &salt, 1, a, 1, 0), 7299114549342135128ULL);
#undef EXPECT
    fprintf(stderr, "kvsim: oracle self-test: %s\n", bad ? "FAILED" : "ok");
    return bad ? 1 : 0;
}

static void rec_hash_list(FILE *f, const struct batch *b, const struct ev *e)
{
    fputc('[', f);
    for (size_t i = 0; i < e->nh; i++)
        fprintf(f, "%s%" PRIu64, i ? "," : "", b->h[e->h_off + i]);
    fputc(']', f);
}

static void rec_event(struct sim *s, const struct batch *b, const struct ev *e)
{
    FILE *f = s->rec;

    switch (e->type) {
    case EV_STORED:
        fputs("{\"type\":\"stored\",\"parent\":", f);
        if (e->has_parent)
            fprintf(f, "%" PRIu64, e->parent);
        else
            fputs("null", f);
        fputs(",\"hashes\":", f);
        rec_hash_list(f, b, e);
        fputs(",\"tokens_hashes\":[", f);
        /* an id the bridge has no name for (--lora-unmapped) is published
         * without the LoRA salt */
        int lora = e->lora && (unsigned)e->lora == s->o.lora_unmapped ? 0 : e->lora;
        for (size_t i = 0; i < e->nh; i++)
            fprintf(f, "%s%" PRIu64, i ? "," : "",
                    e->mm || e->eagle ? oracle_tokens_hash(s, b, e, i)
                                      : tokens_hash(s, b->tok + e->t_off + i * s->o.bs, lora));
        fprintf(f, "],\"tier\":\"%s\",\"group\":%d,\"lora\":", tier_name(e->medium), e->group);
        if (lora)
            fprintf(f, "\"%s\"}", lora_names[lora]);
        else
            fputs("null}", f);
        break;
    case EV_REMOVED:
        fputs("{\"type\":\"removed\",\"hashes\":", f);
        rec_hash_list(f, b, e);
        fprintf(f, ",\"tier\":\"%s\",\"group\":%d}", tier_name(e->medium), e->group);
        break;
    case EV_CLEARED: fputs("{\"type\":\"cleared\"}", f); break;
    }
}

/* A parity workload's event: the common keys, then what a bridge that
 * follows Dynamo's rules publishes (tools/README.md): "fwd" on a store,
 * "released" on a remove, "drop" with the reason when nothing goes out. */
static void rec_event_parity(struct sim *s, const struct batch *b, const struct ev *e)
{
    FILE *f = s->rec;
    struct mm_item salt = {.kind = MMI_SALT};

    if (e->type == EV_CLEARED) {
        if (e->tier_clear)
            fprintf(f, "{\"type\":\"cleared\",\"tier\":\"%s\",\"scoped\":true", e->tier_s);
        else
            fprintf(f, "{\"type\":\"cleared\",\"medium\":\"%s\"", e->medium_s);
    } else if (e->type == EV_STORED) {
        if (e->truth_ns)
            snprintf(salt.str, sizeof salt.str, SALT_PREFIX "%s",
                     cache_namespaces[e->truth_ns - 1]);
        fputs("{\"type\":\"stored\",\"parent\":", f);
        if (e->has_parent)
            fprintf(f, "%" PRIu64, e->parent);
        else
            fputs("null", f);
        fputs(",\"hashes\":", f);
        rec_hash_list(f, b, e);
        fputs(",\"tokens_hashes\":[", f);
        for (size_t i = 0; i < e->nh; i++)
            fprintf(f, "%s%" PRIu64, i ? "," : "",
                    oracle_hash(s->orbuf, b->tok + e->t_off + i * s->o.bs, s->o.bs, NULL, &salt,
                                e->truth_ns ? 1 : 0, NULL, 0, 0));
        fprintf(f, "],\"tier\":\"%s\",\"group\":%d,\"lora\":null,\"fwd\":%s", e->tier_s, e->group,
                e->fwd ? "true" : "false");
    } else {
        fputs("{\"type\":\"removed\",\"hashes\":", f);
        rec_hash_list(f, b, e);
        fprintf(f, ",\"tier\":\"%s\",\"group\":%d,\"released\":[", e->tier_s, e->group);
        for (size_t i = 0; e->fwd && i < e->nrel; i++)
            fprintf(f, "%s%" PRIu64, i ? "," : "", b->h[e->rel_off + i]);
        fputc(']', f);
    }
    if (e->drop)
        fprintf(f, ",\"drop\":\"%s\"", e->drop);
    fputc('}', f);
}

static void rec_batch(struct sim *s, struct rank *r, uint64_t seq, bool live, bool replay,
                      const char *fault)
{
    FILE *f = s->rec;
    const struct batch *b = &r->b;

    fprintf(f, "{\"seq\":%" PRIu64 ",\"rank\":%u,\"live\":%s,\"replay\":%s", seq, r->idx,
            live ? "true" : "false", replay ? "true" : "false");
    if (fault)
        fprintf(f, ",\"fault\":\"%s\"", fault);
    fputs(",\"events\":[", f);
    for (size_t i = 0; i < b->nev; i++) {
        if (i)
            fputc(',', f);
        if (b->ev[i].parity)
            rec_event_parity(s, b, &b->ev[i]);
        else
            rec_event(s, b, &b->ev[i]);
    }
    fputs("]}\n", f);
}

/* ----------------------------------------------------------------- replay */

static void ring_push(struct sim *s, struct rank *r, uint64_t seq, const void *data, size_t len)
{
    struct rbent *e;
    size_t cap = s->o.replay_buf;

    if (r->ring_n < cap) {
        e = &r->ring[(r->ring_head + r->ring_n) % cap];
        r->ring_n++;
    } else {
        e = &r->ring[r->ring_head];
        r->ring_head = (r->ring_head + 1) % cap;
    }
    if (len > e->cap) {
        e->data = xrealloc(e->data, len);
        e->cap = len;
    }
    memcpy(e->data, data, len);
    e->len = len;
    e->seq = seq;
}

/* One reply message; the end marker (len 0, seq FF*8) has an empty topic too. */
static void replay_send_one(struct sim *s, struct rank *r, const void *id, size_t idlen,
                            const unsigned char *seq8, const void *data, size_t len, bool end)
{
    void *sock = r->router;
    zmq_send(sock, id, idlen, ZMQ_SNDMORE);
    zmq_send(sock, "", 0, ZMQ_SNDMORE);
    if (s->o.layout_new)
        zmq_send(sock, s->o.topic, end ? 0 : s->topic_len, ZMQ_SNDMORE);
    zmq_send(sock, seq8, 8, ZMQ_SNDMORE);
    zmq_send(sock, data, len, 0);
}

/* Serves every pending replay request on this rank's ROUTER (non-blocking). */
static void serve_replay(struct sim *s, struct rank *r)
{
    for (;;) {
        unsigned char id[256], seqb[8];
        size_t idlen = 0, f1len = 1, f2len = 0;
        int nframes = 0, more = 0;
        size_t moresz = sizeof more;
        zmq_msg_t m;

        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, r->router, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return;
        }
        do {
            size_t sz = zmq_msg_size(&m);
            if (nframes == 0) {
                idlen = sz < sizeof id ? sz : sizeof id;
                memcpy(id, zmq_msg_data(&m), idlen);
            } else if (nframes == 1) {
                f1len = sz;
            } else if (nframes == 2) {
                f2len = sz;
                if (sz == 8)
                    memcpy(seqb, zmq_msg_data(&m), 8);
            }
            nframes++;
            zmq_getsockopt(r->router, ZMQ_RCVMORE, &more, &moresz);
            if (more && zmq_msg_recv(&m, r->router, 0) < 0)
                more = 0;
        } while (more);
        zmq_msg_close(&m);

        if (nframes != 3 || f1len != 0 || f2len != 8) {
            r->replay_ignored++; /* the engine ignores malformed requests */
            continue;
        }
        r->replay_reqs++;
        {
            uint64_t start = get_be64(seqb);
            unsigned char s8[8];
            for (size_t i = 0; i < r->ring_n; i++) {
                const struct rbent *e = &r->ring[(r->ring_head + i) % s->o.replay_buf];
                if (e->seq < start)
                    continue;
                put_be64(s8, e->seq);
                replay_send_one(s, r, id, idlen, s8, e->data, e->len, false);
                r->replay_batches++;
            }
            memset(s8, 0xff, sizeof s8);
            replay_send_one(s, r, id, idlen, s8, "", 0, true);
        }
    }
}

static void serve_all(struct sim *s, long timeout_ms)
{
    if (!s->nitems)
        return;
    if (zmq_poll(s->items, s->nitems, timeout_ms) <= 0)
        return;
    for (unsigned i = 0; i < s->o.dp; i++)
        if (s->items[i].revents & ZMQ_POLLIN)
            serve_replay(s, &s->ranks[i]);
}

/* Waits until `deadline` (monotonic ns), serving replay requests meanwhile. */
static void wait_until(struct sim *s, int64_t deadline)
{
    for (;;) {
        http_poll_cmd(s);
        int64_t left = deadline - now_ns();
        if (left <= 0 || stop_flag)
            return;
        if (left >= 2000000) {
            long ms = (long)(left / 1000000) - 1;
            if (s->nitems) {
                serve_all(s, ms);
            } else {
                if (ms > 100)
                    ms = 100; /* look at http_cmd now and then */
                struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
                nanosleep(&ts, NULL);
            }
        } else {
            struct timespec ts = {0, (long)left};
            serve_all(s, 0);
            nanosleep(&ts, NULL);
        }
    }
}

/* engine lifecycle (defined below) */
static void lifecycle_process_restart(struct sim *s, struct rank *r);
static void lifecycle_blip(struct sim *s, struct rank *r);
static bool lifecycle_drop_live(struct rank *r);
static void lifecycle_restart_quiet(struct sim *s, struct rank *r);
static bool lifecycle_quiet_now(const struct rank *r);
static bool lifecycle_quiet_done(const struct sim *s);

/* ------------------------------------------------------------ publishing */

static void send_live(struct sim *s, struct rank *r, uint64_t seq, const void *data, size_t len,
                      bool bad_frames)
{
    unsigned char s8[8];

    put_be64(s8, seq);
    zmq_send(r->pub, s->o.topic, s->topic_len, ZMQ_SNDMORE);
    if (!bad_frames)
        zmq_send(r->pub, s8, 8, ZMQ_SNDMORE);
    zmq_send(r->pub, data, len, 0);
    r->bytes += s->topic_len + (bad_frames ? 0 : 8) + len;
}

static void publish_one(struct sim *s, struct rank *r)
{
    const struct opts *o = &s->o;
    uint64_t seq = r->seq;
    bool forever = seqlist_has(&o->drop_forever, seq);
    bool drop = !forever && (seqlist_has(&o->drop_live, seq) || lifecycle_drop_live(r));
    bool garbage = !forever && !drop && seqlist_has(&o->malformed, seq);
    bool badf = !forever && !drop && !garbage && seqlist_has(&o->bad_frames, seq);
    const char *fault = forever   ? "drop-forever"
                        : drop    ? "drop-live"
                        : garbage ? "malformed"
                        : badf    ? "bad-frames"
                                  : NULL;
    const void *data;
    size_t len;
    unsigned char junk[16];

    batch_reset(&r->b);
    switch (o->wl) {
    case WL_REALISTIC: gen_realistic(s, r); break;
    case WL_DECODE: gen_decode(s, r); break;
    case WL_PREFILL: gen_prefill(s, r); break;
    case WL_MULTIMODAL:
    case WL_EAGLE: gen_chain(s, r); break;
    case WL_HYBRID:
    case WL_TWOGROUPS:
    case WL_SALTED:
    case WL_REMOTE:
    case WL_TIERCLEAR: gen_parity(s, r); break;
    }

    track_usage(s, r);
    if (!forever)
        encode_batch(s, r);
    data = s->sb.data;
    len = s->sb.size;
    if (garbage) {
        /* 0xc1 is never used in msgpack: no decoder accepts this */
        uint64_t j = rnd(&r->enc_rng), k = rnd(&r->enc_rng);
        junk[0] = 0xc1;
        memcpy(junk + 1, &j, 8);
        memcpy(junk + 9, &k, 7);
        data = junk;
        len = sizeof junk;
    }

    if (forever) {
        r->drop_forever++;
    } else if (drop) {
        r->drop_live++;
    } else {
        send_live(s, r, seq, data, len, badf);
        if (garbage)
            r->malformed++;
        else if (badf)
            r->bad_frames++;
        else {
            r->batches++;
            r->events += r->b.nev;
        }
    }
    if (r->router && !forever)
        ring_push(s, r, seq, data, len); /* the engine buffers what it sent */
    if (s->rec)
        rec_batch(s, r, seq, !forever && !drop && !garbage && !badf,
                  r->router && !forever && !garbage, fault);

    r->seq++;
    if (r->quiet_left)
        r->quiet_left--;
    if (o->restart && !r->restarted && seq == o->restart_at) {
        /* the engine process restarts: new seq stream, empty caches and buffer */
        r->restarted = true;
        r->seq = o->seq_start;
        r->ring_n = r->ring_head = 0;
        gen_clear(&r->g);
        atomic_store(&r->dev_used, 0);
        if (o->restart_close_ms >= 0)
            lifecycle_process_restart(s, r);
        if (s->rec)
            fprintf(s->rec,
                    "{\"restart\":true,\"rank\":%u,\"after_seq\":%" PRIu64 ",\"next_seq\":%" PRIu64
                    ",\"events\":[{\"type\":\"cleared\"}]}\n",
                    r->idx, seq, o->seq_start);
    }
    if (o->blip && !r->blipped && seq == o->blip_at)
        lifecycle_blip(s, r);
}

/* ------------------------------------------- engine lifecycle (restarts) */

static int open_rank_sockets(struct sim *s, struct rank *r, bool pub, bool router);
static void unlist_rank(struct sim *s, struct rank *r);

/* Closes a socket now (nothing queued is kept: the process is gone). */
static void close_now(void **sock)
{
    int zero = 0;
    if (*sock) {
        zmq_setsockopt(*sock, ZMQ_LINGER, &zero, sizeof zero);
        zmq_close(*sock);
        *sock = NULL;
    }
}

/* Sleeps ms (nothing is served: the engine is down). */
static void pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (ms > 0 && nanosleep(&ts, &ts) != 0 && !stop_flag)
        ;
}

/* --restart-close: the engine process goes away (its sockets closed, its
 * subscribers' connections drop) and a new one binds after a pause; seq from
 * --seq-start, empty replay buffer (the caller resets those). */
static void lifecycle_process_restart(struct sim *s, struct rank *r)
{
    close_now(&r->pub);
    close_now(&r->router);
    unlist_rank(s, r);
    pause_ms(s->o.restart_close_ms);
    if (open_rank_sockets(s, r, true, s->o.replay != NULL) != 0) {
        fprintf(stderr, "kvsim: rank %u: cannot bind again after the restart\n", r->idx);
        exit(1);
    }
    r->drop_left = s->o.restart_drop_live;
    lifecycle_restart_quiet(s, r);
}

/* --restart-quiet N: the new incarnation publishes its first N batches at
 * once, before any subscriber is back (not sent live: a PUB drops what it
 * publishes before a subscription arrives; kept for replay, as real engines
 * keep them), then nothing more: an engine gone idle after its restart. */
static void lifecycle_restart_quiet(struct sim *s, struct rank *r)
{
    if (!s->o.restart_quiet)
        return;
    r->quiet_left = s->o.restart_quiet;
    if (r->drop_left < r->quiet_left)
        r->drop_left = r->quiet_left;
}

/* --restart-quiet: true while rank r publishes its quiet batches (no
 * pacing: at once). */
static bool lifecycle_quiet_now(const struct rank *r) { return r->quiet_left > 0; }

/* --restart-quiet: every rank published its quiet batches: silence. */
static bool lifecycle_quiet_done(const struct sim *s)
{
    if (!s->o.restart_quiet)
        return false;
    for (unsigned i = 0; i < s->o.dp; i++)
        if (!s->ranks[i].restarted || s->ranks[i].quiet_left)
            return false;
    return true;
}

/* --blip-at: the connection drops (the PUB closed and bound again after
 * --blip-ms), the engine goes on: same seq, same replay buffer. */
static void lifecycle_blip(struct sim *s, struct rank *r)
{
    close_now(&r->pub);
    unlist_rank(s, r);
    pause_ms(s->o.blip_ms);
    if (open_rank_sockets(s, r, true, false) != 0) {
        fprintf(stderr, "kvsim: rank %u: cannot bind again after the blip\n", r->idx);
        exit(1);
    }
    r->blipped = true;
}

/* A batch the engine publishes while nobody is subscribed (after a process
 * restart): not sent live, kept for replay. */
static bool lifecycle_drop_live(struct rank *r)
{
    if (!r->drop_left)
        return false;
    r->drop_left--;
    return true;
}

/* --mark-file: written once every rank has published --mark-after batches. */
static void lifecycle_mark(struct sim *s, uint64_t tick)
{
    if (!s->o.mark_file || tick != s->o.mark_after)
        return;
    FILE *f = fopen(s->o.mark_file, "w");
    if (f)
        fclose(f);
}

/* --hold-file: after the mark, publish nothing (an idle engine; replay is
 * served) until the file exists.  True when it held. */
static bool lifecycle_hold(struct sim *s, uint64_t tick)
{
    if (!s->o.hold_file || tick != s->o.mark_after)
        return false;
    if (s->rec)
        fflush(s->rec);
    while (!stop_flag && access(s->o.hold_file, F_OK) != 0)
        wait_until(s, now_ns() + 50 * 1000000LL);
    return true;
}

/* ------------------------------------------------------------- HTTP face */

/* SIGUSR1: stop answering (the listener closes: connections are refused);
 * SIGUSR2: answer again.  Acted on by the main thread (http_poll_cmd). */
static volatile sig_atomic_t http_cmd;

static void on_usr(int sig) { http_cmd = sig == SIGUSR1 ? 1 : 2; }

/* Device blocks held after this batch: stores add, removes take away,
 * "cleared" empties; group-1 and CPU-tier events are not the device cache
 * a bridge forwards. */
static void track_usage(const struct sim *s, struct rank *r)
{
    uint64_t used = atomic_load(&r->dev_used);
    uint64_t cap = s->o.total_blocks ? s->o.total_blocks : s->o.cache_blocks;
    for (size_t i = 0; i < r->b.nev; i++) {
        const struct ev *e = &r->b.ev[i];
        if (e->type == EV_CLEARED) {
            if (!e->drop) /* an ambiguous clear changes nothing; a tier clear is the GPU's */
                used = 0;
            continue;
        }
        if (e->medium == MED_CPU || e->group != 0)
            continue;
        if (e->type == EV_STORED)
            used += e->nh;
        else
            used = used > e->nh ? used - e->nh : 0;
    }
    atomic_store(&r->dev_used, used < cap ? used : cap);
}

static char *render_metrics(const struct sim *s, size_t *len)
{
    char *text = NULL;
    FILE *f = open_memstream(&text, len);
    if (!f)
        return NULL;
    uint64_t total = s->o.total_blocks ? s->o.total_blocks : s->o.cache_blocks;
    bool v = s->o.ekind == EK_VLLM;
    const char *lbl = v ? "engine" : "dp_rank";
    fprintf(f, "# HELP %s Number of requests running.\n# TYPE %s gauge\n",
            v ? "vllm:num_requests_running" : "sglang:num_running_reqs",
            v ? "vllm:num_requests_running" : "sglang:num_running_reqs");
    for (unsigned i = 0; i < s->o.dp; i++)
        fprintf(f, "%s{%s=\"%u\",model_name=\"kvsim\"} %" PRIu64 ".0\n",
                v ? "vllm:num_requests_running" : "sglang:num_running_reqs", lbl, i,
                atomic_load(&s->ranks[i].running));
    for (unsigned i = 0; i < s->o.dp; i++)
        fprintf(f, "%s{%s=\"%u\",model_name=\"kvsim\"} 0.0\n",
                v ? "vllm:num_requests_waiting" : "sglang:num_queue_reqs", lbl, i);
    fprintf(f, "# TYPE %s gauge\n", v ? "vllm:kv_cache_usage_perc" : "sglang:token_usage");
    for (unsigned i = 0; i < s->o.dp; i++)
        fprintf(f, "%s{%s=\"%u\",model_name=\"kvsim\"} %.17g\n",
                v ? "vllm:kv_cache_usage_perc" : "sglang:token_usage", lbl, i,
                (double)atomic_load(&s->ranks[i].dev_used) / (double)total);
    for (unsigned i = 0; i < s->o.dp; i++) {
        if (v)
            fprintf(f,
                    "vllm:cache_config_info{block_size=\"%u\",engine=\"%u\","
                    "num_gpu_blocks=\"%" PRIu64 "\"} 1.0\n",
                    s->o.bs, i, total);
        else
            fprintf(f,
                    "sglang:max_total_num_tokens{dp_rank=\"%u\",model_name=\"kvsim\"} "
                    "%" PRIu64 ".0\n",
                    i, total * s->o.bs);
    }
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}

/* GET /kv_event_sources: each rank's endpoints in --sources-shape's shape
 * (a vLLM source entry, or its KV-events configuration keyed by rank); NULL
 * with *status 503 while a rank's sockets are closed (a restarting engine:
 * its API server is not up either). */
static char *render_sources(struct sim *s, size_t *len, unsigned *status)
{
    int shape = s->o.sources_shape;
    json_object *root = shape == SHAPE_ARRAY ? json_object_new_array() : json_object_new_object();
    json_object *arr = root;
    if (shape == SHAPE_ENVELOPE) {
        arr = json_object_new_array();
        json_object_object_add(root, "sources", arr);
    }
    bool down = false;
    pthread_mutex_lock(&s->adv_mu);
    for (unsigned i = 0; i < s->o.dp && !down; i++) {
        const struct rank *r = &s->ranks[i];
        if (!r->adv[0] || (s->o.replay && !r->adv_rep[0])) {
            down = true;
            break;
        }
        json_object *e = json_object_new_object();
        if (shape == SHAPE_RANKS) {
            json_object_object_add(e, "enable_kv_cache_events", json_object_new_boolean(1));
            json_object_object_add(e, "publisher", json_object_new_string("zmq"));
            json_object_object_add(e, "buffer_steps",
                                   json_object_new_int64((int64_t)s->o.replay_buf));
        } else {
            json_object_object_add(e, "data_parallel_rank", json_object_new_int64(i));
        }
        json_object_object_add(e, "endpoint", json_object_new_string(r->adv));
        json_object_object_add(e, "replay_endpoint",
                               s->o.replay ? json_object_new_string(r->adv_rep) : NULL);
        json_object_object_add(e, "topic", json_object_new_string(s->o.topic));
        if (shape == SHAPE_RANKS) {
            char key[16];
            snprintf(key, sizeof key, "%u", i);
            json_object_object_add(root, key, e);
        } else {
            json_object_array_add(arr, e);
        }
    }
    pthread_mutex_unlock(&s->adv_mu);
    char *body = NULL;
    if (down)
        *status = MHD_HTTP_SERVICE_UNAVAILABLE;
    else if ((body = strdup(json_object_to_json_string_ext(
                  root, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE))))
        *len = strlen(body);
    json_object_put(root);
    return body;
}

static enum MHD_Result http_answer(void *cls, struct MHD_Connection *c, const char *url,
                                   const char *method, const char *version, const char *upload,
                                   size_t *upload_size, void **req_cls)
{
    (void)version;
    (void)upload;
    (void)upload_size;
    static int first;
    if (!*req_cls) { /* headers only: answer on the next call */
        *req_cls = &first;
        return MHD_YES;
    }
    struct sim *s = cls;
    unsigned status = MHD_HTTP_OK;
    char *body = NULL;
    size_t len = 0;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        status = MHD_HTTP_METHOD_NOT_ALLOWED;
    else if (strcmp(url, "/metrics") == 0)
        body = render_metrics(s, &len);
    else if (strcmp(url, "/kv_event_sources") == 0)
        body = render_sources(s, &len, &status);
    else if (strcmp(url, "/health") != 0)
        status = MHD_HTTP_NOT_FOUND;
    struct MHD_Response *r =
        body ? MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE)
             : MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    if (body)
        MHD_add_response_header(r, "Content-Type",
                                strcmp(url, "/kv_event_sources") == 0
                                    ? "application/json"
                                    : "text/plain; version=0.0.4; charset=utf-8");
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

/* Start answering on --http HOST:PORT (numeric IPv4 host). */
static int http_start(struct sim *s)
{
    char host[64];
    const char *colon = strrchr(s->o.http, ':');
    struct sockaddr_in sa = {.sin_family = AF_INET};
    uint64_t port;
    if (!colon || (size_t)(colon - s->o.http) >= sizeof host || parse_u64(colon + 1, &port) ||
        port == 0 || port > 65535) {
        fprintf(stderr, "kvsim: --http: want HOST:PORT, got '%s'\n", s->o.http);
        return -EINVAL;
    }
    memcpy(host, s->o.http, (size_t)(colon - s->o.http));
    host[colon - s->o.http] = '\0';
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        fprintf(stderr, "kvsim: --http: '%s' is not a numeric IPv4 address\n", host);
        return -EINVAL;
    }
    sa.sin_port = htons((uint16_t)port);
    s->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL, 0, NULL, NULL,
                              http_answer, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                              MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_CONNECTION_TIMEOUT,
                              10u, MHD_OPTION_END);
    if (!s->mhd) {
        fprintf(stderr, "kvsim: --http %s: cannot listen\n", s->o.http);
        return -EADDRINUSE;
    }
    return 0;
}

static void http_stop(struct sim *s)
{
    if (s->mhd)
        MHD_stop_daemon(s->mhd);
    s->mhd = NULL;
}

/* Act on SIGUSR1 / SIGUSR2 (main thread). */
static void http_poll_cmd(struct sim *s)
{
    int cmd = http_cmd;
    if (!cmd || !s->o.http)
        return;
    http_cmd = 0;
    if (cmd == 1 && s->mhd) {
        http_stop(s);
        fprintf(stderr, "kvsim: HTTP face stopped answering\n");
    } else if (cmd == 2 && !s->mhd && http_start(s) == 0) {
        fprintf(stderr, "kvsim: HTTP face answers again\n");
    }
}

/* -------------------------------------------------------------- lifecycle */

/* ------------------------------------------------------ --frames: exact input */

/* tests/fuzz/fuzz_frames.c's record format (bytes 0 and 1 configure the fuzz
 * target: the daemon's configuration says the same here); a rejected record
 * goes out padded with zeros to FRAMES_OVERSIZE bytes, above a
 * limits.max_payload_bytes of 65536, which no other record (at most 65535
 * bytes) reaches. */
#define FRAMES_MAX_RECORDS 512
#define FRAMES_OVERSIZE 65537
#define FRAMES_MAX_FILE (64u << 20)
#define FRAMES_SUB_WAIT_MS 30000

static int frames_load(const char *path, unsigned char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -errno;
    unsigned char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 65536;
            buf = xrealloc(buf, cap);
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0 || n > FRAMES_MAX_FILE)
            break;
    }
    int rc = ferror(f) ? -EIO : n > FRAMES_MAX_FILE ? -EFBIG : 0;
    fclose(f);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    *out = buf;
    *len = n;
    return 0;
}

static int frames_send_one(void *pub, const char *topic, uint64_t seq, const void *data, size_t len)
{
    unsigned char sb[8];
    put_be64(sb, seq);
    if (zmq_send(pub, topic, strlen(topic), ZMQ_SNDMORE) < 0 ||
        zmq_send(pub, sb, 8, ZMQ_SNDMORE) < 0 || zmq_send(pub, data, len, 0) < 0)
        return -zmq_errno();
    return 0;
}

/* Every record of d[0..size) on TOPIC, in order; the records published. */
static long frames_publish(void *pub, const char *topic, const unsigned char *d, size_t size)
{
    static unsigned char big[FRAMES_OVERSIZE];
    size_t off = 2;
    uint64_t prev = 0;
    long n = 0;
    for (int rec = 0; rec < FRAMES_MAX_RECORDS && off < size; rec++) {
        int8_t code = (int8_t)d[off++];
        bool reject = false;
        if (code == 126) {
            if (off >= size)
                break;
            reject = true;
            code = (int8_t)d[off++];
        }
        if (code == 127) { /* reconfigure: the daemon's configuration is fixed */
            if (off >= size)
                break;
            off++;
            continue;
        }
        uint64_t seq;
        if (code == -128) {
            if (size - off < 8)
                break;
            seq = get_be64(d + off);
            off += 8;
        } else {
            seq = prev + 1 + (uint64_t)(int64_t)code;
        }
        size_t len = 0;
        if (size - off >= 2) {
            len = (size_t)d[off] | (size_t)d[off + 1] << 8;
            off += 2;
        } else {
            off = size;
        }
        if (len > size - off)
            len = size - off;
        const void *payload = d + off;
        if (reject) {
            memset(big, 0, sizeof big);
            memcpy(big, d + off, len);
            payload = big;
        }
        off += len;
        int rc = frames_send_one(pub, topic, seq, payload, reject ? sizeof big : len);
        if (rc < 0)
            return rc;
        prev = seq;
        n++;
    }
    return n;
}

/* --frames: an XPUB (no high-water mark: nothing dropped) that waits for the
 * first subscription, so that no record is lost to a slow joiner. */
static int run_frames(const struct opts *o)
{
    int rc = 1, zero = 0, linger = FLUSH_MS;
    void *ctx = zmq_ctx_new(), *pub = ctx ? zmq_socket(ctx, ZMQ_XPUB) : NULL;
    if (!pub || zmq_setsockopt(pub, ZMQ_SNDHWM, &zero, sizeof zero) < 0 ||
        (o->connect ? zmq_connect(pub, o->endpoint) : zmq_bind(pub, o->endpoint)) < 0) {
        fprintf(stderr, "kvsim: %s: %s\n", o->endpoint, zmq_strerror(zmq_errno()));
        goto out;
    }
    catch_stop_signals();
    zmq_pollitem_t it = {pub, 0, ZMQ_POLLIN, 0};
    int64_t end = now_ms() + FRAMES_SUB_WAIT_MS;
    while (!stop_flag && now_ms() < end && zmq_poll(&it, 1, 100) <= 0)
        ;
    char sub[256];
    if (!(it.revents & ZMQ_POLLIN) || zmq_recv(pub, sub, sizeof sub, 0) < 1 || sub[0] != 1) {
        fprintf(stderr, "kvsim: --frames: no subscriber within %d ms\n", FRAMES_SUB_WAIT_MS);
        goto out;
    }
    long total = 0;
    for (size_t i = 0; i < o->n_frames; i++) {
        unsigned char *d = NULL;
        size_t len = 0;
        const char *base = strrchr(o->frames[i], '/');
        char topic[512];
        snprintf(topic, sizeof topic, "%s%s", o->topic, base ? base + 1 : o->frames[i]);
        int e = frames_load(o->frames[i], &d, &len);
        long n = e < 0 ? e : frames_publish(pub, topic, d, len);
        free(d);
        if (n < 0) {
            fprintf(stderr, "kvsim: %s: %s\n", o->frames[i], strerror((int)-n));
            goto out;
        }
        total += n;
    }
    fprintf(stderr, "kvsim: --frames: %ld records from %zu file(s) published\n", total,
            o->n_frames);
    int64_t until = now_ms() + o->linger_ms;
    while (!stop_flag && now_ms() < until)
        pause_ms(20);
    rc = 0;
out:
    if (pub) {
        if (stop_flag || rc)
            linger = 0;
        zmq_setsockopt(pub, ZMQ_LINGER, &linger, sizeof linger);
        zmq_close(pub);
    }
    if (ctx)
        zmq_ctx_term(ctx);
    return rc;
}

/* The TOOL_CALL options (the others only store their value). */
enum {
    OPT_HELP = 1,
    OPT_CURVE_SERVER,
    OPT_CURVE_KEYGEN,
    OPT_ORACLE_SELFTEST,
    OPT_RATE,
    OPT_SEQLIST, /* the field: a struct seqlist */
    OPT_RESTART,
    OPT_BLIP_AT,
    OPT_FRAMES,
};

/* The values of the TOOL_CHOICE options, in the order of their enums. */
static const char *const layout_names[] = {"old", "new", NULL};
static const char *const encoding_names[] = {"positional", "map", NULL};
static const char *const hash_names[] = {"uint", "int", "bin", NULL};
static const char *const workload_names[] = {"realistic", "decode",    "prefill",   "multimodal",
                                             "eagle",     "hybrid",    "twogroups", "salted",
                                             "remote",    "tierclear", NULL};
static const char *const engine_kind_names[] = {"vllm", "sglang", NULL};
static const char *const rank_naming_names[] = {"port", "trtllm", NULL};
static const char *const sources_shape_names[] = {"array", "envelope", "ranks", NULL};

#define F(f) TOOL_FIELD(struct opts, f)
/* clang-format off */
/* The command line: every option, what it does and its help (tools_common.h). */
static const struct tool_opt options[] = {
    {.help = "usage: kvsim [options]"},
    {.help = "Engine simulator: publishes KV-cache event batches like vLLM/SGLang on ZeroMQ."},
    {.help = ""},
    {.help = "Transport:"},
    {.name = "endpoint", .arg = "EP", .kind = TOOL_STR, F(endpoint),
     .help = "live PUB endpoint (default tcp://127.0.0.1:5557); binds"},
    {.name = "connect", .kind = TOOL_FLAG, F(connect),
     .help = "connect the PUB to EP instead of binding (kvbridge bind mode)"},
    {.name = "replay", .arg = "EP", .kind = TOOL_STR, F(replay),
     .help = "also bind a replay ROUTER at EP (default: none)"},
    {.name = "replay-buffer", .arg = "N", .kind = TOOL_U64, F(replay_buf), .min = 1,
     .max = 100000000,
     .help = "batches kept for replay per rank (default 10000)"},
    {.name = "replay-layout", .arg = "L", .kind = TOOL_CHOICE, F(layout_new),
     .choices = layout_names,
     .help = "old: [\"\",seq,payload] / end [\"\",FF*8,\"\"] (default)\n"
              "new: [\"\",topic,seq,payload] / end [\"\",\"\",FF*8,\"\"]"},
    {.name = "topic", .arg = "STR", .kind = TOOL_STR, F(topic),
     .help = "topic frame (default \"\")"},
    {.name = "dp-size", .arg = "N", .kind = TOOL_U64, F(dp), .min = 1, .max = 1024,
     .help = "data-parallel ranks; rank r uses port+r for live and replay\n"
              "endpoints, its own seq counter and data_parallel_rank r"},
    {.name = "rank-naming", .arg = "N", .kind = TOOL_CHOICE, F(trtllm_ranks),
     .choices = rank_naming_names,
     .help = "port: rank r on port+r (default) | trtllm: TensorRT-LLM's\n"
              "names: ipc://PATH for rank 0, ipc://PATH_dp{r} after\n"
              "(tcp:// as port)"},
    {.name = "node-ip", .arg = "IP", .kind = TOOL_STR, F(node_ip),
     .help = "what an endpoint with port 0 and host * or 0.0.0.0 binds, as\n"
              "vLLM binds its node's IP (default 127.0.0.1): every rank gets\n"
              "an ephemeral port, new at every --restart-close"},
    {.name = "lossless", .kind = TOOL_FLAG, F(lossless),
     .help = "ZMQ_SNDHWM 0 (unlimited) instead of the default HWM"},
    {.name = "wait-subscribers", .arg = "MS", .kind = TOOL_U64, F(wait_ms), .min = 0,
     .max = 86400000,
     .help = "sleep before the first batch (default 500)"},
    {.name = "linger", .arg = "MS", .kind = TOOL_U64, F(linger_ms), .min = 0, .max = 86400000,
     .help = "keep serving replay this long after the last batch\n"
              "(default 1000); then queued messages get up to 2 s to\n"
              "flush (none after SIGINT/SIGTERM)"},
    {.name = "curve-secret-file", .arg = "F", .kind = TOOL_STR, F(curve_secret_file),
     .help = "ZMQ CURVE with the secret key (40 Z85 characters, first\n"
              "line that is not a # comment) in F: the PUB and the replay\n"
              "ROUTER are CURVE servers, or with --curve-server-key the\n"
              "PUB is a CURVE client (the ROUTER stays plain)"},
    {.name = "curve-server-key", .arg = "K", .kind = TOOL_CALL, .id = OPT_CURVE_SERVER,
     .help = "the CURVE server's public key (Z85), for a CURVE client"},
    {.name = "oracle-selftest", .kind = TOOL_CALL, .id = OPT_ORACLE_SELFTEST,
     .help = "check the multimodal/EAGLE tokens_hash oracle against the\n"
              "known answers of docs/router-events.md section 3.4, then exit"},
    {.name = "curve-keygen", .kind = TOOL_CALL, .id = OPT_CURVE_KEYGEN,
     .help = "print a new CURVE key pair (public, then secret, Z85, one\n"
              "per line) and exit"},
    {.help = ""},
    {.help = "Content:"},
    {.name = "encoding", .arg = "E", .kind = TOOL_CHOICE, F(enc), .choices = encoding_names,
     .help = "positional (vLLM<=0.23/SGLang arrays, 12-element BlockStored;\n"
              "default) | map (vLLM>=0.24 maps, extra keys, map16)"},
    {.name = "hash", .arg = "H", .kind = TOOL_CHOICE, F(hash), .choices = hash_names,
     .help = "uint (u64, default) | int (signed, often negative) |\n"
              "bin (32-byte digest, last 8 bytes big-endian = hash)"},
    {.name = "report-full", .kind = TOOL_FLAG, F(report_full),
     .help = "parity workloads: vLLM kv_cache_report_mode: full: every\n"
              "batch first stores the previous batch's blocks again"},
    {.name = "lora-id-only", .kind = TOOL_FLAG, F(lora_id_only),
     .help = "LoRA adapters by id alone, as TensorRT-LLM sends them:\n"
              "lora_id 1 or 2 with lora_name nil (and no name in\n"
              "extra_keys); the record salts with the adapter's name\n"
              "(adapter-a, adapter-b), which the bridge maps from the id"},
    {.name = "lora-unmapped", .arg = "ID", .kind = TOOL_U64, F(lora_unmapped), .min = 1,
     .max = NLORA,
     .help = "with --lora-id-only: the bridge has no name for lora_id ID:\n"
              "the record has its stores unsalted (as published)"},
    {.name = "image-token-id", .arg = "ID", .kind = TOOL_U64, F(image_token), .min = 1,
     .max = UINT32_MAX,
     .help = "multimodal workload: every block holds two runs of token ID\n"
              "(image placeholders), and the record hashes a block with mm\n"
              "hashes as a router given image_token_id ID does: each run\n"
              "replaced by 1000000 + (mm_hash & (2^30-1)), in order, no mm\n"
              "hashes (the bridge needs sources[].image_token_id: ID)"},
    {.name = "video-token-id", .arg = "ID", .kind = TOOL_U64, F(video_token), .min = 1,
     .max = UINT32_MAX,
     .help = "with --image-token-id (blocks of 8 or more): every block\n"
              "holds a video of two runs of token ID split by a text token,\n"
              "then one image run; the record hashes a block as a router\n"
              "given both ids does: a block with two mm hashes pad-\n"
              "substituted (video first), any other natively (the bridge\n"
              "needs sources[].video_token_id: ID too)"},
    {.name = "block-size", .arg = "N", .kind = TOOL_U64, F(bs), .min = 1, .max = 4096,
     .help = "tokens per block (default 16)"},
    {.name = "workload", .arg = "W", .kind = TOOL_CHOICE, F(wl), .choices = workload_names,
     .help = "realistic (default): shared prefixes, parent chains, LRU\n"
              "evictions, rare AllBlocksCleared, LoRA, CPU tier, group 1,\n"
              "heartbeats | decode: 1-block store + 1-hash remove per batch\n"
              "| prefill: one 32-block store per batch\n"
              "| multimodal: vLLM with images: 1-3 block stores whose\n"
              "extra_keys carry mm identifiers (every shape), LoRA\n"
              "names, cache salts, digests; a remove 512 blocks later\n"
              "| eagle: SGLang with EAGLE: token_ids as bigram pairs\n"
              "| Dynamo's relay rules, the record saying what a bridge that\n"
              "follows them publishes: hybrid: group 1 full attention,\n"
              "group 0 sliding window / mamba, shared hashes | twogroups:\n"
              "one hash in two full-attention groups | salted: multi-turn\n"
              "conversations, only the first store salted | remote: vLLM\n"
              "0.26+ locality, ownership, medium names | tierclear: GPU\n"
              "stores offloaded to CPU_PINNED, batches of their own with\n"
              "TierBlocksCleared(medium GPU) or an AllBlocksCleared that\n"
              "names a medium (dropped: ambiguous_scoped_clear)"},
    {.name = "cache-blocks", .arg = "N", .kind = TOOL_U64, F(cache_blocks), .min = 2 * MAX_CHAIN,
     .max = 100000000,
     .help = "realistic: device cache capacity in blocks (default 4096)"},
    {.name = "batches", .arg = "N", .kind = TOOL_U64, F(batches), .min = 0, .max = UINT64_MAX,
     .help = "batches per rank (default 0 = until SIGINT/SIGTERM)"},
    {.name = "rate", .arg = "R", .kind = TOOL_CALL, .id = OPT_RATE,
     .help = "batches/s per rank (default 0 = as fast as possible)"},
    {.name = "seed", .arg = "S", .kind = TOOL_U64, F(seed), .min = 0, .max = UINT64_MAX,
     .help = "random seed (default 1)"},
    {.name = "seq-start", .arg = "N", .kind = TOOL_U64, F(seq_start), .min = 0,
     .max = UINT64_MAX - 1,
     .help = "first seq (default 0)"},
    {.help = ""},
    {.help = "Faults (LIST = comma-separated seqs or ranges a-b; apply in every incarnation):"},
    {.name = "drop-live", .arg = "LIST", .kind = TOOL_CALL, .id = OPT_SEQLIST, F(drop_live),
     .help = "not published live, kept for replay (fillable gap)"},
    {.name = "drop-forever", .arg = "LIST", .kind = TOOL_CALL, .id = OPT_SEQLIST, F(drop_forever),
     .help = "neither published nor kept (unfillable gap)"},
    {.name = "malformed-at", .arg = "LIST", .kind = TOOL_CALL, .id = OPT_SEQLIST, F(malformed),
     .help = "payload replaced by garbage (0xc1...), buffered as sent"},
    {.name = "bad-frames-at", .arg = "LIST", .kind = TOOL_CALL, .id = OPT_SEQLIST, F(bad_frames),
     .help = "sent as 2 frames [topic][payload]; replay has the real batch"},
    {.name = "restart-at", .arg = "SEQ", .kind = TOOL_CALL, .id = OPT_RESTART, .min = 0,
     .max = UINT64_MAX,
     .help = "after publishing SEQ, restart once from --seq-start\n"
              "(empty caches, empty replay buffer)"},
    {.name = "restart-close", .arg = "MS", .kind = TOOL_U64, F(restart_close_ms), .min = 0,
     .max = 600000,
     .help = "with --restart-at: restart like a new engine process:\n"
              "close the sockets, bind again after MS (default: the\n"
              "same sockets go on)"},
    {.name = "restart-drop-live", .arg = "N", .kind = TOOL_U64, F(restart_drop_live), .min = 0,
     .max = UINT64_MAX,
     .help = "after such a restart, the first N batches are not sent\n"
              "live (kept for replay), as with no subscriber yet"},
    {.name = "restart-quiet", .arg = "N", .kind = TOOL_U64, F(restart_quiet), .min = 0,
     .max = UINT64_MAX,
     .help = "with --restart-at and --restart-close: the new incarnation\n"
              "publishes its first N batches at once, before a subscriber\n"
              "is back (kept for replay), then nothing more (replay is\n"
              "served until --linger ends)"},
    {.name = "blip-at", .arg = "SEQ", .kind = TOOL_CALL, .id = OPT_BLIP_AT, .min = 0,
     .max = UINT64_MAX,
     .help = "after publishing SEQ, close the PUB and bind it again\n"
              "after --blip-ms (default 300): a dropped connection,\n"
              "no restart (same seq, same replay buffer)"},
    {.name = "blip-ms", .arg = "MS", .kind = TOOL_U64, F(blip_ms), .min = 0, .max = 600000},
    {.name = "mark-after", .arg = "N", .kind = TOOL_U64, F(mark_after), .min = 1, .max = UINT64_MAX,
     .usage = "--mark-after N --mark-file F",
     .help = "create F once N batches per rank are published"},
    {.name = "mark-file", .arg = "F", .kind = TOOL_STR, F(mark_file)},
    {.name = "hold-file", .arg = "F", .kind = TOOL_STR, F(hold_file),
     .help = "with --mark-after: then publish nothing (replay is served)\n"
              "until F exists, like an engine gone idle"},
    {.help = ""},
    {.help = "HTTP face (like the engine's /metrics and /health):"},
    {.name = "http", .arg = "HOST:PORT", .kind = TOOL_STR, F(http),
     .help = "serve GET /metrics (Prometheus text, vLLM's names) and\n"
              "/health (200) on a numeric IPv4 HOST; KV usage per rank =\n"
              "device blocks held / total blocks; SIGUSR1 stops\n"
              "answering (connections refused), SIGUSR2 answers again"},
    {.name = "sources-shape", .arg = "S", .kind = TOOL_CHOICE, F(sources_shape),
     .choices = sources_shape_names,
     .help = "GET /kv_event_sources (vLLM's list of each rank's endpoint,\n"
              "replay_endpoint, topic; 503 while a rank is closed) as: array\n"
              "(default) | envelope ({\"sources\": [...]}) | ranks ({\"0\": ...})"},
    {.name = "engine-kind", .arg = "K", .kind = TOOL_CHOICE, F(ekind), .choices = engine_kind_names,
     .help = "vllm (default) | sglang: SGLang's names and dp_rank label"},
    {.name = "total-blocks", .arg = "N", .kind = TOOL_U64, F(total_blocks), .min = 1,
     .max = 1000000000,
     .help = "KV blocks of the simulated cache (default --cache-blocks)"},
    {.help = ""},
    {.help = "Exact input:"},
    {.name = "frames", .arg = "FILE", .kind = TOOL_CALL, .id = OPT_FRAMES,
     .help = "(repeatable) publish exactly the (seq, payload) records of\n"
              "FILE (tests/fuzz/fuzz_frames.c's format: seqs that gap, go\n"
              "back, repeat; a rejected record padded to 65537 bytes; a\n"
              "reconfigure record skipped) on topic --topic + FILE's base\n"
              "name, file after file, once a subscriber has subscribed;\n"
              "then --linger and exit.  No generator, no replay, no faults"},
    {.help = ""},
    {.help = "Output:"},
    {.name = "record", .arg = "FILE", .kind = TOOL_STR, F(record),
     .help = "JSON line per batch: {\"seq\",\"rank\",\"live\",\"replay\",\n"
              "[\"fault\"],\"events\":[normalized router-side events]}\n"
              "and {\"restart\":true,\"rank\",...,\"events\":[cleared]}"},
    {.name = "help", .short_name = 'h', .kind = TOOL_CALL, .id = OPT_HELP, .usage = "-h, --help",
     .help = "this text"},
    {.help = "At exit a per-rank summary goes to stderr."},
};
/* clang-format on */
#undef F
#define N_OPTIONS (sizeof options / sizeof options[0])

static void usage(FILE *f) { tool_usage(f, options, N_OPTIONS, 25); }

/* --curve-keygen */
static int curve_keygen(void)
{
    char pub[41], sec[41];
    if (zmq_curve_keypair(pub, sec) != 0) {
        fprintf(stderr, "kvsim: --curve-keygen: %s\n", zmq_strerror(errno));
        return 1;
    }
    printf("%s\n%s\n", pub, sec);
    return fflush(stdout) == 0 ? 0 : 1;
}

static bool z85_key_ok(const char *k)
{
    uint8_t raw[32];
    return strlen(k) == 40 && zmq_z85_decode(raw, k) != NULL;
}

/* --curve-secret-file: the first line that is neither blank nor a # comment,
 * white space around it dropped; its public key derived. */
static int read_curve_secret(struct opts *o)
{
    FILE *f = fopen(o->curve_secret_file, "r");
    char line[256];
    int rc = -EINVAL;
    if (!f) {
        fprintf(stderr, "kvsim: %s: %s\n", o->curve_secret_file, strerror(errno));
        return -EINVAL;
    }
    while (fgets(line, sizeof line, f)) {
        char *p = line, *e = line + strlen(line);
        while (*p == ' ' || *p == '\t')
            p++;
        while (e > p && strchr(" \t\r\n", e[-1]))
            e--;
        *e = '\0';
        if (!*p || *p == '#') /* no Z85 key starts with '#' */
            continue;
        if (z85_key_ok(p) && zmq_curve_public(o->curve_public, p) == 0) {
            memcpy(o->curve_secret, p, 41);
            rc = 0;
        }
        break;
    }
    fclose(f);
    if (rc)
        fprintf(stderr, "kvsim: %s: no CURVE secret key (40 Z85 characters)\n",
                o->curve_secret_file);
    return rc;
}

/* CURVE on one socket, before its bind or connect. */
static int apply_curve(const struct opts *o, void *sock, bool server)
{
    int one = 1;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, o->curve_secret, 40) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, o->curve_public, 40) != 0 ||
        (server ? zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one)
                : zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, o->curve_server_key, 40)) != 0) {
        fprintf(stderr, "kvsim: CURVE: %s\n", zmq_strerror(errno));
        return -EINVAL;
    }
    return 0;
}

/* A bad value for row R: -EINVAL, reported (a number: with its range). */
static int bad_value(const struct tool_opt *r, const char *arg)
{
    if (r->kind == TOOL_U64 || r->max)
        fprintf(stderr, "kvsim: --%s: bad value '%s' (%" PRIu64 "..%" PRIu64 ")\n", r->name, arg,
                r->min, r->max);
    else
        fprintf(stderr, "kvsim: bad value for option: '%s'\n", arg);
    return -EINVAL;
}

/* What a TOOL_CALL option does with ARG: 0 or -EINVAL (reported); --help,
 * --curve-keygen and --oracle-selftest exit. */
static int call_option(const struct tool_opt *r, const char *arg, void *base)
{
    struct opts *o = base;
    uint64_t v = 0;
    char *end;
    switch (r->id) {
    case OPT_HELP: usage(stdout); exit(0);
    case OPT_CURVE_KEYGEN: exit(curve_keygen());
    case OPT_ORACLE_SELFTEST: exit(oracle_selftest());
    case OPT_CURVE_SERVER:
        if (!z85_key_ok(arg))
            return bad_value(r, arg);
        o->curve_server_key = arg;
        return 0;
    case OPT_RATE:
        errno = 0;
        o->rate = strtod(arg, &end);
        if (errno || *end || end == arg || !(o->rate >= 0) || o->rate > 1e9)
            return bad_value(r, arg);
        return 0;
    case OPT_SEQLIST:
        return seqlist_parse((struct seqlist *)((char *)o + r->off), arg) ? bad_value(r, arg) : 0;
    case OPT_RESTART:
    case OPT_BLIP_AT:
        if (tool_u64(r, arg, &v))
            return bad_value(r, arg);
        *(r->id == OPT_RESTART ? &o->restart : &o->blip) = true;
        *(r->id == OPT_RESTART ? &o->restart_at : &o->blip_at) = v;
        return 0;
    case OPT_FRAMES:
        o->frames = xrealloc(o->frames, (o->n_frames + 1) * sizeof *o->frames);
        o->frames[o->n_frames++] = arg;
        return 0;
    default: return bad_value(r, arg);
    }
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    static const struct tool_handlers h = {call_option, bad_value, usage};
    if (tool_parse(argc, argv, options, N_OPTIONS, o, &h) < 0)
        return -EINVAL;
    if (optind < argc) {
        fprintf(stderr, "kvsim: unexpected argument '%s'\n", argv[optind]);
        return -EINVAL;
    }
    if (o->curve_server_key && !o->curve_secret_file) {
        fprintf(stderr, "kvsim: --curve-server-key needs --curve-secret-file\n");
        return -EINVAL;
    }
    if (o->lora_unmapped && !o->lora_id_only) {
        fprintf(stderr, "kvsim: --lora-unmapped needs --lora-id-only\n");
        return -EINVAL;
    }
    if (o->lora_id_only && (o->wl == WL_MULTIMODAL || o->wl == WL_EAGLE)) {
        fprintf(stderr, "kvsim: --lora-id-only is not for the multimodal and eagle workloads\n");
        return -EINVAL;
    }
    if (o->report_full && !wl_parity(o->wl)) {
        fprintf(stderr, "kvsim: --report-full is for the hybrid, twogroups, salted, remote and "
                        "tierclear workloads\n");
        return -1;
    }
    if (o->video_token && (!o->image_token || o->bs < 8 || o->video_token == o->image_token)) {
        fprintf(stderr, "kvsim: --video-token-id needs --image-token-id (another id) and "
                        "--block-size of 8 or more\n");
        return -EINVAL;
    }
    if (o->image_token && o->wl != WL_MULTIMODAL) {
        fprintf(stderr, "kvsim: --image-token-id is for the multimodal workload\n");
        return -EINVAL;
    }
    if (o->hold_file && !o->mark_after) {
        fprintf(stderr, "kvsim: --hold-file needs --mark-after\n");
        return -EINVAL;
    }
    if (o->restart_quiet && (!o->restart || o->restart_close_ms < 0)) {
        fprintf(stderr, "kvsim: --restart-quiet needs --restart-at and --restart-close\n");
        return -EINVAL;
    }
    if (o->curve_secret_file)
        return read_curve_secret(o);
    return 0;
}

/* Bind SOCK, rank R's PUB (REPLAY false) or replay ROUTER, and note what
 * GET /kv_event_sources lists for it: the ephemeral port bound, read back,
 * or the endpoint as configured (vLLM reports tcp://\x2a:P as it is).  0, or
 * -1 with errno set by ZMQ. */
static int bind_rank(struct sim *s, struct rank *r, void *sock, bool replay)
{
    char ep[512], last[512];
    size_t len = sizeof last;
    const char *conf = replay ? r->rep : r->ep;
    bind_endpoint(conf, s->o.node_ip, ep, sizeof ep);
    bool ephemeral = strlen(ep) > 2 && strcmp(ep + strlen(ep) - 2, ":0") == 0;
    if (zmq_bind(sock, ep) != 0 ||
        (ephemeral && zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, last, &len) != 0))
        return -1;
    pthread_mutex_lock(&s->adv_mu);
    snprintf(replay ? r->adv_rep : r->adv, sizeof r->adv, "%s", ephemeral ? last : conf);
    pthread_mutex_unlock(&s->adv_mu);
    return 0;
}

/* Rank R's sockets are closed: it lists nothing until they are bound again. */
static void unlist_rank(struct sim *s, struct rank *r)
{
    pthread_mutex_lock(&s->adv_mu);
    r->adv[0] = r->adv_rep[0] = '\0';
    pthread_mutex_unlock(&s->adv_mu);
}

static int open_sockets(struct sim *s)
{
    const struct opts *o = &s->o;
    int linger = FLUSH_MS, zero = 0;

    s->zctx = zmq_ctx_new();
    if (!s->zctx)
        return -ENOMEM;
    s->items = xcalloc(o->dp, sizeof *s->items);
    for (unsigned i = 0; i < o->dp; i++) {
        struct rank *r = &s->ranks[i];
        if (rank_endpoint(o->endpoint, i, o->trtllm_ranks, r->ep, sizeof r->ep) ||
            (o->replay && rank_endpoint(o->replay, i, o->trtllm_ranks, r->rep, sizeof r->rep))) {
            fprintf(stderr, "kvsim: --dp-size > 1 needs endpoints ending in :PORT (or "
                            "ipc:// with --rank-naming trtllm)\n");
            return -EINVAL;
        }
        r->pub = zmq_socket(s->zctx, ZMQ_PUB);
        if (!r->pub)
            return -errno;
        zmq_setsockopt(r->pub, ZMQ_LINGER, &linger, sizeof linger);
        if (o->lossless)
            zmq_setsockopt(r->pub, ZMQ_SNDHWM, &zero, sizeof zero);
        if (o->curve_secret_file && apply_curve(o, r->pub, !o->curve_server_key))
            return -EINVAL;
        if ((o->connect ? zmq_connect(r->pub, r->ep) : bind_rank(s, r, r->pub, false)) != 0) {
            fprintf(stderr, "kvsim: %s %s: %s\n", o->connect ? "connect" : "bind", r->ep,
                    zmq_strerror(errno));
            return -EINVAL;
        }
        if (o->replay) {
            r->router = zmq_socket(s->zctx, ZMQ_ROUTER);
            if (!r->router)
                return -errno;
            zmq_setsockopt(r->router, ZMQ_LINGER, &linger, sizeof linger);
            if (o->lossless)
                zmq_setsockopt(r->router, ZMQ_SNDHWM, &zero, sizeof zero);
            if (o->curve_secret_file && !o->curve_server_key && apply_curve(o, r->router, true))
                return -EINVAL;
            if (bind_rank(s, r, r->router, true) != 0) {
                fprintf(stderr, "kvsim: bind %s: %s\n", r->rep, zmq_strerror(errno));
                return -EINVAL;
            }
            r->ring = xcalloc(o->replay_buf, sizeof *r->ring);
            s->items[s->nitems].socket = r->router;
            s->items[s->nitems].events = ZMQ_POLLIN;
            s->nitems++;
        }
    }
    return 0;
}

/* Lifecycle: a rank's PUB and/or ROUTER bound again (a new engine process,
 * or after a blip), retrying while the old listener is being released. */
static int open_rank_sockets(struct sim *s, struct rank *r, bool pub, bool router)
{
    const struct opts *o = &s->o;
    int linger = FLUSH_MS, zero = 0;
    void **socks[2] = {pub ? &r->pub : NULL, router ? &r->router : NULL};
    const int types[2] = {ZMQ_PUB, ZMQ_ROUTER};
    for (int k = 0; k < 2; k++) {
        if (!socks[k])
            continue;
        void *sk = zmq_socket(s->zctx, types[k]);
        if (!sk)
            return -errno;
        zmq_setsockopt(sk, ZMQ_LINGER, &linger, sizeof linger);
        if (o->lossless)
            zmq_setsockopt(sk, ZMQ_SNDHWM, &zero, sizeof zero);
        if (o->curve_secret_file && (k == 0 || !o->curve_server_key) &&
            apply_curve(o, sk, k == 1 || !o->curve_server_key)) {
            zmq_close(sk);
            return -EINVAL;
        }
        const char *ep = k == 0 ? r->ep : r->rep;
        int rc = -1;
        for (int i = 0; i < 100 && rc != 0; i++) {
            rc = k == 0 && o->connect ? zmq_connect(sk, ep) : bind_rank(s, r, sk, k == 1);
            if (rc != 0)
                pause_ms(20);
        }
        if (rc != 0) {
            zmq_close(sk);
            return -EADDRINUSE;
        }
        *socks[k] = sk;
        if (k == 1)
            s->items[r->idx].socket = sk; /* every rank has a ROUTER with --replay */
    }
    return 0;
}

static void close_all(struct sim *s, bool fast)
{
    int zero = 0;

    if (s->ranks) {
        for (unsigned i = 0; i < s->o.dp; i++) {
            struct rank *r = &s->ranks[i];
            if (r->pub) {
                if (fast)
                    zmq_setsockopt(r->pub, ZMQ_LINGER, &zero, sizeof zero);
                zmq_close(r->pub);
            }
            if (r->router) {
                if (fast)
                    zmq_setsockopt(r->router, ZMQ_LINGER, &zero, sizeof zero);
                zmq_close(r->router);
            }
            if (r->ring) {
                for (size_t k = 0; k < s->o.replay_buf; k++)
                    free(r->ring[k].data);
                free(r->ring);
            }
            gen_free(&r->g);
            free(r->b.ev);
            free(r->b.h);
            free(r->b.tok);
        }
        free(s->ranks);
    }
    if (s->zctx)
        zmq_ctx_term(s->zctx);
    free(s->items);
    free(s->chain_tok);
    free(s->lebuf);
    free(s->orbuf);
    msgpack_sbuffer_destroy(&s->sb);
    free(s->o.drop_live.r);
    free(s->o.drop_forever.r);
    free(s->o.malformed.r);
    free(s->o.bad_frames.r);
}

static void summary(const struct sim *s, double elapsed)
{
    uint64_t tb = 0, te = 0, tbytes = 0;

    for (unsigned i = 0; i < s->o.dp; i++) {
        const struct rank *r = &s->ranks[i];
        fprintf(stderr,
                "kvsim: rank %u %s: batches=%" PRIu64 " events=%" PRIu64 " bytes=%" PRIu64
                " drop_live=%" PRIu64 " drop_forever=%" PRIu64 " malformed=%" PRIu64
                " bad_frames=%" PRIu64 " replay_requests=%" PRIu64 " replayed=%" PRIu64
                " replay_ignored=%" PRIu64 " next_seq=%" PRIu64 "\n",
                r->idx, r->ep, r->batches, r->events, r->bytes, r->drop_live, r->drop_forever,
                r->malformed, r->bad_frames, r->replay_reqs, r->replay_batches, r->replay_ignored,
                r->seq);
        tb += r->batches;
        te += r->events;
        tbytes += r->bytes;
    }
    fprintf(stderr,
            "kvsim: total batches=%" PRIu64 " events=%" PRIu64 " bytes=%" PRIu64
            " elapsed=%.3fs rate=%.0f batches/s\n",
            tb, te, tbytes, elapsed, elapsed > 0 ? (double)tb / elapsed : 0.0);
}

/* The defaults of the options (usage()). */
static void opts_defaults(struct opts *o)
{
    o->endpoint = "tcp://127.0.0.1:5557";
    o->node_ip = "127.0.0.1";
    o->topic = "";
    o->dp = 1;
    o->bs = 16;
    o->seed = 1;
    o->wait_ms = 500;
    o->linger_ms = 1000;
    o->replay_buf = 10000;
    o->cache_blocks = 4096;
    o->restart_close_ms = -1;
    o->blip_ms = 300;
}

/* After the options: buffers, the LoRA seeds, signals, each rank's state. */
static void sim_init(struct sim *s)
{
    s->topic_len = strlen(s->o.topic);
    s->lora_tokens_seed[0] = TOKENS_SEED;
    for (int i = 1; i <= NLORA; i++)
        s->lora_tokens_seed[i] =
            TOKENS_SEED + XXH3_64bits_withSeed(lora_names[i], strlen(lora_names[i]), 0);
    s->chain_tok = xcalloc((size_t)MAX_CHAIN * s->o.bs, sizeof *s->chain_tok);
    s->lebuf = xcalloc(4, s->o.bs);
    s->orbuf = xcalloc(4 * ((size_t)s->o.bs + 1) + 8 * MM_MAX_ITEMS, 1);

    catch_stop_signals();
    struct sigaction usr;
    memset(&usr, 0, sizeof usr);
    sigemptyset(&usr.sa_mask);
    usr.sa_handler = on_usr;
    sigaction(SIGUSR1, &usr, NULL);
    sigaction(SIGUSR2, &usr, NULL);

    s->ranks = xcalloc(s->o.dp, sizeof *s->ranks);
    for (unsigned i = 0; i < s->o.dp; i++) {
        s->ranks[i].idx = i;
        s->ranks[i].seq = s->o.seq_start;
        gen_init(s, &s->ranks[i]);
        gen_clear(&s->ranks[i].g);
    }
}

/* Sockets, the HTTP face, the record file.  0, or -1 (reported). */
static int sim_open(struct sim *s)
{
    if (open_sockets(s))
        return -1;
    if (s->o.http && http_start(s))
        return -1;
    if (s->o.record) {
        s->rec = fopen(s->o.record, "w");
        if (!s->rec) {
            fprintf(stderr, "kvsim: %s: %s\n", s->o.record, strerror(errno));
            return -1;
        }
        setvbuf(s->rec, NULL, _IOFBF, 1 << 20);
    }
    return 0;
}

/* Publish --batches batches on every rank at --rate (or until
 * SIGINT/SIGTERM); the seconds it took. */
static double publish_all(struct sim *s)
{
    uint64_t tick = 0;
    wait_until(s, now_ns() + (int64_t)s->o.wait_ms * 1000000);
    int64_t t0 = now_ns(), next = t0;
    for (unsigned i = 0; i < s->o.dp; i++)
        atomic_store(&s->ranks[i].running, 1);
    while (!stop_flag && (s->o.batches == 0 || tick < s->o.batches) && !lifecycle_quiet_done(s)) {
        if (s->o.rate > 0 && !lifecycle_quiet_now(&s->ranks[0])) {
            int64_t interval = (int64_t)(1e9 / s->o.rate);
            int64_t now = now_ns();
            if (now - next > 1000000000LL)
                next = now; /* far behind (stall): do not burst to catch up */
            wait_until(s, next);
            next += interval > 0 ? interval : 1;
            if (stop_flag)
                break;
        } else if ((tick & 63) == 0) {
            serve_all(s, 0);
            http_poll_cmd(s);
        }
        for (unsigned i = 0; i < s->o.dp; i++)
            publish_one(s, &s->ranks[i]);
        tick++;
        lifecycle_mark(s, tick);
        if (lifecycle_hold(s, tick))
            next = now_ns(); /* the rate starts afresh */
    }
    int64_t t1 = now_ns();
    for (unsigned i = 0; i < s->o.dp; i++)
        atomic_store(&s->ranks[i].running, 0);
    return (double)(t1 - t0) / 1e9;
}

int main(int argc, char **argv)
{
    struct sim sim;
    int rc = 2;
    bool interrupted = false;

    memset(&sim, 0, sizeof sim);
    pthread_mutex_init(&sim.adv_mu, NULL);
    msgpack_sbuffer_init(&sim.sb);
    msgpack_packer_init(&sim.pk, &sim.sb, msgpack_sbuffer_write);
    opts_defaults(&sim.o);
    if (parse_args(argc, argv, &sim.o))
        goto out;
    if (sim.o.n_frames) {
        rc = run_frames(&sim.o);
        free(sim.o.frames);
        goto out;
    }
    sim_init(&sim);
    if (sim_open(&sim))
        goto out;

    double elapsed = publish_all(&sim);
    interrupted = stop_flag != 0;
    if (sim.rec)
        fflush(sim.rec);
    if (!interrupted && (sim.nitems || sim.o.http))
        wait_until(&sim, now_ns() + (int64_t)sim.o.linger_ms * 1000000);
    summary(&sim, elapsed);
    rc = 0;
    if (sim.rec && fclose(sim.rec) != 0) {
        fprintf(stderr, "kvsim: %s: %s\n", sim.o.record, strerror(errno));
        rc = 1;
    }
    sim.rec = NULL;
out:
    http_stop(&sim);
    if (sim.rec)
        fclose(sim.rec);
    close_all(&sim, interrupted || rc == 2);
    return rc;
}
