/* kvbridge-inspect: captured engine payloads -> router events, exactly as the
 * daemon would publish them (same pipeline, same sequence rules), one per
 * line on stdout.  With --decoded, the decoded engine events instead.
 *
 *   kvbridge-inspect [-c CONFIG] [--worker-id N] [--block-size N|auto]
 *                    [--decoded] CAPTURE_DIR|FILE.msgpack ...
 *
 * A capture folder holds index.json ({"topic":..,"batches":[{"seq":..,
 * "file":..}, ...]}) and the payload files; its batches are fed in seq order
 * as one stream.  Consecutive FILE.msgpack arguments form one stream with
 * seqs 0, 1, 2, ...
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config.h"
#include "convert.h"
#include "decode.h"
#include "encode_msgpack.h"
#include "log.h"
#include "metrics.h"
#include "pipeline.h"

#define MAX_FILE_BYTES (256u << 20)

struct opts {
    bool decoded;
    struct kvb_pipeline_cfg pcfg;
    struct kvb_mp_batcher *mp; /* --format dynamo-msgpack */
};

static void put_hex(const void *data, size_t len)
{
    const uint8_t *p = data;
    for (size_t i = 0; i < len; i++)
        printf("%02x", p[i]);
}

/* dynamo-json: the pipeline's bytes; dynamo-msgpack: into the batcher. */
static int emit_line(void *ctx, const struct kvb_rev *rev, const char *data, size_t len)
{
    struct opts *o = ctx;
    if (o->mp)
        return kvb_mp_batcher_add(o->mp, rev, 0);
    if (o->pcfg.format != KVB_FORMAT_DYNAMO_JSON)
        return 0;
    fwrite(data, 1, len, stdout);
    fputc('\n', stdout);
    return 0;
}

/* One event-plane envelope per line, in hex. */
static int emit_envelope(void *ctx, const struct kvb_mp_msg *msg)
{
    (void)ctx;
    put_hex(msg->data, msg->len);
    fputc('\n', stdout);
    return 0;
}

/* raw: the batch as kvbridge republishes it: headers, then the payload in hex. */
static int emit_raw(void *ctx, const struct kvb_stream *s, uint64_t seq, uint32_t dp_rank,
                    const uint8_t *payload, size_t len)
{
    (void)ctx;
    (void)s;
    printf("{\"KV-Seq\":\"%" PRIu64 "\",\"KV-DP-Rank\":\"%" PRIu32 "\",\"payload\":\"", seq,
           dp_rank);
    put_hex(payload, len);
    fputs("\"}\n", stdout);
    return 0;
}

static int read_file(const char *path, uint8_t **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -errno;
    struct stat st;
    int rc = 0;
    uint8_t *buf = NULL;
    if (fstat(fileno(f), &st) < 0) {
        rc = -errno;
        goto out;
    }
    if ((uint64_t)st.st_size > MAX_FILE_BYTES) {
        rc = -EFBIG;
        goto out;
    }
    buf = malloc(st.st_size ? (size_t)st.st_size : 1);
    if (!buf) {
        rc = -ENOMEM;
        goto out;
    }
    if (fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
        rc = -EIO;
        goto out;
    }
    *out = buf;
    *len = (size_t)st.st_size;
    buf = NULL;
out:
    free(buf);
    fclose(f);
    return rc;
}

/* ---- --decoded: engine events as JSON ----------------------------------- */

static void put_str(const struct kvb_str *s)
{
    if (!s->ptr) {
        fputs("null", stdout);
        return;
    }
    putchar('"');
    for (uint32_t i = 0; i < s->len; i++) {
        unsigned char c = (unsigned char)s->ptr[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void put_hash(const struct kvb_hash *h)
{
    switch (h->kind) {
    case KVB_HASH_UINT: printf("%" PRIu64, h->v.u); break;
    case KVB_HASH_INT: printf("%" PRId64, h->v.i); break;
    case KVB_HASH_BIN:
        fputs("\"0x", stdout);
        for (uint32_t i = 0; i < h->bin_len; i++)
            printf("%02x", h->v.bin[i]);
        putchar('"');
        break;
    default: fputs("null", stdout);
    }
}

static void put_opt_int(const char *key, const struct kvb_opt_int *v)
{
    printf(",\"%s\":", key);
    if (v->has)
        printf("%" PRId64, v->v);
    else
        fputs("null", stdout);
}

static void print_decoded(uint64_t seq, const struct kvb_batch *b)
{
    static const char *types[] = {"BlockStored", "BlockRemoved", "AllBlocksCleared", "unknown",
                                  "malformed"};
    printf("{\"seq\":%" PRIu64 ",\"ts\":%.17g", seq, b->ts);
    put_opt_int("dp_rank", &b->dp_rank);
    fputs(",\"events\":[", stdout);
    for (uint32_t i = 0; i < b->n_events; i++) {
        const struct kvb_event *e = &b->events[i];
        printf("%s{\"type\":\"%s\",\"tag\":", i ? "," : "", types[e->type]);
        put_str(&e->tag);
        if (e->type == KVB_EV_MALFORMED)
            printf(",\"error\":\"%s\"", e->error);
        if (e->type == KVB_EV_STORED || e->type == KVB_EV_REMOVED) {
            fputs(",\"block_hashes\":[", stdout);
            for (uint32_t j = 0; j < e->n_hashes; j++) {
                if (j)
                    putchar(',');
                put_hash(&e->hashes[j]);
            }
            fputs("],\"medium\":", stdout);
            put_str(&e->medium);
            put_opt_int("group_idx", &e->group_idx);
        }
        if (e->type == KVB_EV_STORED) {
            fputs(",\"parent_block_hash\":", stdout);
            put_hash(&e->parent);
            if (e->token_pairs) {
                printf(",\"token_id_pairs\":%u", e->n_pairs);
            } else {
                fputs(",\"token_ids\":[", stdout);
                for (uint32_t j = 0; j < e->n_tokens; j++)
                    printf("%s%u", j ? "," : "", e->tokens[j]);
                putchar(']');
            }
            put_opt_int("block_size", &e->block_size);
            put_opt_int("lora_id", &e->lora_id);
            fputs(",\"lora_name\":", stdout);
            put_str(&e->lora_name);
            fputs(",\"cache_salt\":", stdout);
            put_str(&e->cache_salt);
            fputs(",\"kv_cache_spec_kind\":", stdout);
            put_str(&e->spec_kind);
            put_opt_int("kv_cache_spec_sliding_window", &e->sliding_window);
        }
        putchar('}');
    }
    fputs("]}\n", stdout);
}

/* ---- one batch through the chosen path ---------------------------------- */

static int feed(struct kvb_pipeline *p, const struct opts *o, struct kvb_stream *s, uint64_t seq,
                const char *path)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = read_file(path, &buf, &len);
    if (rc < 0) {
        fprintf(stderr, "kvbridge-inspect: %s: %s\n", path, strerror(-rc));
        return rc;
    }
    if (o->decoded) {
        struct kvb_batch b;
        rc = kvb_decode_batch(kvb_pipeline_decoder(p), buf, len, &b);
        if (rc < 0)
            printf("{\"seq\":%" PRIu64 ",\"error\":\"%s\"}\n", seq, kvb_decode_strerror(rc));
        else
            print_decoded(seq, &b);
        rc = 0;
    } else {
        rc = kvb_pipeline_live(p, s, seq, buf, len);
        if (rc >= 0 && o->mp) /* the daemon cuts a message at the end of each engine batch */
            rc = kvb_mp_batcher_flush(o->mp, 0);
        if (rc < 0)
            fprintf(stderr, "kvbridge-inspect: %s: %s\n", path, strerror(-rc));
    }
    free(buf);
    return rc < 0 ? rc : 0;
}

/* ---- index.json: the few fields we need, scanned, not fully parsed ------- */

struct entry {
    uint64_t seq;
    char file[256];
};

static int cmp_entry(const void *a, const void *b)
{
    const struct entry *x = a, *y = b;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int parse_index(const char *text, struct entry **out, size_t *n_out)
{
    const char *p = strstr(text, "\"batches\"");
    if (!p)
        return -EINVAL;
    struct entry *v = NULL;
    size_t n = 0, cap = 0;
    while ((p = strchr(p, '{'))) {
        const char *end = strchr(p, '}');
        const char *s = strstr(p, "\"seq\"");
        const char *f = strstr(p, "\"file\"");
        if (!end || !s || !f || s > end || f > end)
            break;
        struct entry e;
        s = strchr(s, ':');
        f = strchr(f + 6, '"');
        const char *fe = f ? strchr(f + 1, '"') : NULL;
        if (!s || !f || !fe || (size_t)(fe - f - 1) >= sizeof(e.file))
            goto bad;
        errno = 0;
        char *ep;
        e.seq = strtoull(s + 1, &ep, 10);
        if (errno || ep == s + 1)
            goto bad;
        memcpy(e.file, f + 1, (size_t)(fe - f - 1));
        e.file[fe - f - 1] = '\0';
        if (strchr(e.file, '/'))
            goto bad;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            struct entry *nv = realloc(v, cap * sizeof(*nv));
            if (!nv)
                goto bad;
            v = nv;
        }
        v[n++] = e;
        p = end + 1;
    }
    qsort(v, n, sizeof(*v), cmp_entry);
    *out = v;
    *n_out = n;
    return 0;
bad:
    free(v);
    return -EINVAL;
}

static int run_dir(struct kvb_pipeline *p, const struct opts *o, const char *dir)
{
    char path[PATH_MAX];
    uint8_t *text = NULL;
    size_t len = 0;
    struct entry *ents = NULL;
    size_t n = 0;
    int rc;
    snprintf(path, sizeof(path), "%s/index.json", dir);
    if ((rc = read_file(path, &text, &len)) < 0) {
        fprintf(stderr, "kvbridge-inspect: %s: %s\n", path, strerror(-rc));
        return rc;
    }
    char *t = realloc(text, len + 1);
    if (!t) {
        free(text);
        return -ENOMEM;
    }
    t[len] = '\0';
    if ((rc = parse_index(t, &ents, &n)) < 0)
        fprintf(stderr, "kvbridge-inspect: %s: not a capture index\n", path);
    free(t);
    struct kvb_stream s;
    kvb_stream_init(&s, dir, 0);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, ents[i].file);
        rc = feed(p, o, &s, ents[i].seq, path);
    }
    free(ents);
    return rc;
}

static void usage(FILE *f)
{
    fputs("usage: kvbridge-inspect [-c CONFIG] [--worker-id N] [--block-size N|auto]\n"
          "                        [--format F] [--decoded] CAPTURE_DIR|FILE.msgpack ...\n"
          "Prints one router event per line, exactly as kvbridge publishes it.\n"
          "  --format F          dynamo-json (default; or the config's nats.format):\n"
          "                      one JSON router event per line; dynamo-msgpack: one\n"
          "                      event-plane envelope per line, in hex, cut per batch\n"
          "                      (publisher_id from a fixed seed, published_at 0: the\n"
          "                      daemon's are random per start and the wall clock);\n"
          "                      raw: each batch's KV-Seq, KV-DP-Rank and payload (hex)\n"
          "  -c, --config FILE   take worker_id, block_size, lora_salt, forward_tiers\n"
          "                      and limits from a kvbridge configuration file\n"
          "  --worker-id N       worker_id (default 0)\n"
          "  --block-size N|auto tokens per block (default auto)\n"
          "  --no-lora-salt      do not salt tokens_hash with lora_name\n"
          "  --decoded           print the decoded engine events instead\n"
          "Without a config: worker_id 0, block_size auto, lora_salt on,\n"
          "forward_tiers [device].\n",
          f);
}

static int parse_u64(const char *s, uint64_t *v)
{
    char *end;
    errno = 0;
    if (!*s || *s == '-')
        return -EINVAL;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno || *end)
        return -EINVAL;
    *v = x;
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"worker-id", required_argument, NULL, 'w'},
        {"block-size", required_argument, NULL, 'b'},
        {"no-lora-salt", no_argument, NULL, 'L'},
        {"decoded", no_argument, NULL, 'd'},
        {"format", required_argument, NULL, 'f'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct opts o = {
        .decoded = false,
        .pcfg = {.convert = {.worker_id = 0,
                             .block_size = 0,
                             .lora_salt = true,
                             .forward_tiers = 1u << KVB_TIER_DEVICE},
                 .limits = KVB_DECODE_LIMITS_DEFAULT,
                 .format = KVB_FORMAT_DYNAMO_JSON},
    };
    const char *cfg_path = NULL, *worker = NULL, *bsize = NULL, *format = NULL;
    bool batch = true, residency = true;
    char *ns_copy = NULL;
    bool no_salt = false;
    int c;
    while ((c = getopt_long(argc, argv, "c:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'c': cfg_path = optarg; break;
        case 'w': worker = optarg; break;
        case 'b': bsize = optarg; break;
        case 'L': no_salt = true; break;
        case 'd': o.decoded = true; break;
        case 'f': format = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind >= argc) {
        usage(stderr);
        return 2;
    }
    if (cfg_path) {
        struct kvb_config *cfg = NULL;
        if (kvb_config_load(cfg_path, &cfg, stderr) < 0)
            return KVB_EX_CONFIG;
        o.pcfg = kvb_pipeline_cfg_of(cfg);
        /* borrowed from cfg, which goes next: keep a copy */
        ns_copy = cfg->cache_namespace ? strdup(cfg->cache_namespace) : NULL;
        o.pcfg.convert.cache_namespace = ns_copy;
        batch = cfg->nats.batch;
        residency = cfg->nats.residency_domain;
        kvb_config_free(&cfg);
    }
    uint64_t v;
    if (worker) {
        if (parse_u64(worker, &v) < 0) {
            fprintf(stderr, "kvbridge-inspect: bad --worker-id '%s'\n", worker);
            return 2;
        }
        o.pcfg.convert.worker_id = v;
    }
    if (bsize) {
        if (strcmp(bsize, "auto") == 0) {
            o.pcfg.convert.block_size = 0;
        } else if (parse_u64(bsize, &v) < 0 || v == 0 || v > UINT32_MAX) {
            fprintf(stderr, "kvbridge-inspect: bad --block-size '%s'\n", bsize);
            return 2;
        } else {
            o.pcfg.convert.block_size = (uint32_t)v;
        }
    }
    if (no_salt)
        o.pcfg.convert.lora_salt = false;
    if (format) {
        static const char *const names[] = {"dynamo-json", "dynamo-msgpack", "raw"};
        int f = -1;
        for (int k = 0; k < 3; k++)
            if (strcmp(format, names[k]) == 0)
                f = k;
        if (f < 0) {
            fprintf(stderr, "kvbridge-inspect: --format: dynamo-json, dynamo-msgpack or raw\n");
            return 2;
        }
        o.pcfg.format = f;
    }
    if (o.pcfg.format == KVB_FORMAT_DYNAMO_MSGPACK) {
        struct kvb_mp_batcher_cfg bc = {.batch = batch, .residency_domain = residency, .seed = 1};
        if (kvb_mp_batcher_create(&bc, emit_envelope, NULL, &o.mp) < 0)
            return 1;
    }

    struct kvb_metrics m = {0};
    struct kvb_pipeline *p = NULL;
    int rc = kvb_pipeline_create(&o.pcfg, &m, emit_line, &o, &p);
    if (rc < 0) {
        fprintf(stderr, "kvbridge-inspect: %s\n", strerror(-rc));
        return 1;
    }
    if (o.pcfg.format == KVB_FORMAT_RAW)
        kvb_pipeline_set_raw(p, emit_raw, NULL);
    struct kvb_stream files;
    kvb_stream_init(&files, "files", 0);
    uint64_t file_seq = 0;
    for (int i = optind; rc == 0 && i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode))
            rc = run_dir(p, &o, argv[i]);
        else
            rc = feed(p, &o, &files, file_seq++, argv[i]);
    }
    kvb_pipeline_destroy(&p);
    kvb_mp_batcher_destroy(&o.mp);
    free(ns_copy);
    if (fflush(stdout) != 0)
        rc = -EIO;
    return rc < 0 ? 1 : 0;
}
