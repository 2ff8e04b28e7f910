/* kvbridge-inspect: captured engine payloads -> router events, exactly as the
 * daemon would publish them (the same sequence rules: a kvb_replay without a
 * replay endpoint, fed as source.c feeds it; the same pipeline; the same
 * publish stage, sink-less: its writer prints each message), one per line on
 * stdout.  With --decoded, the decoded engine events instead.
 *
 *   kvbridge-inspect [-c CONFIG] [--worker-id N] [--block-size N|auto]
 *                    [--format F] [--decoded] CAPTURE_DIR|FILE.msgpack ...
 *   kvbridge-inspect [options] --frames FILE ...
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

#include <json-c/json.h>

#include "config.h"
#include "convert.h"
#include "decode.h"
#include "log.h"
#include "metrics.h"
#include "pipeline.h"
#include "publish.h"
#include "replay.h"

#define MAX_FILE_BYTES (256u << 20)

struct opts {
    bool decoded;
    bool frames;            /* the arguments are frame sequences (--frames) */
    uint64_t max_payload;   /* limits.max_payload_bytes (-c); 0: no limit */
    uint32_t cfg_rank;      /* the stream's configured dp_rank: sources[0].dp_rank (-c) */
    const char *source;     /* raw's KV-Source: sources[0].endpoint (-c), else the file */
    struct kvb_config *cfg; /* -c, kept: the stages borrow its strings */
    struct kvb_pipeline_cfg pcfg;
    struct kvb_publish_cfg ucfg;
    /* The daemon's sequence rules, as for a source without a replay
     * endpoint (kvb_replay_live(), as source.c calls it). */
    struct kvb_replay *rules;
    struct kvb_publish *pub;
};

static void put_hex(const void *data, size_t len)
{
    const uint8_t *p = data;
    for (size_t i = 0; i < len; i++)
        printf("%02x", p[i]);
}

static void put_str(const struct kvb_str *s);

/* The publish stage's writer: each message as the daemon would hand it to
 * NATS, one per line.  dynamo-json: the router event; dynamo-msgpack: the
 * envelope in hex; raw: {"HEADER":"value",...,"payload":"hex"}. */
static int write_msg(void *ctx, const struct kvb_publish_msg *msg)
{
    (void)ctx;
    if (msg->rev) {
        fwrite(msg->data, 1, msg->len, stdout);
    } else if (!msg->n_hdrs) {
        put_hex(msg->data, msg->len);
    } else {
        putchar('{');
        for (size_t i = 0; i < msg->n_hdrs; i++) {
            put_str(&(struct kvb_str){msg->hdrs[2 * i], (uint32_t)strlen(msg->hdrs[2 * i])});
            putchar(':');
            const char *v = msg->hdrs[2 * i + 1];
            put_str(&(struct kvb_str){v, (uint32_t)strlen(v)});
            putchar(',');
        }
        fputs("\"payload\":\"", stdout);
        put_hex(msg->data, msg->len);
        fputs("\"}", stdout);
    }
    fputc('\n', stdout);
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

/* One batch of stream s through the daemon's rules and pipeline. */
static int apply(const struct opts *o, struct kvb_stream *s, uint64_t seq, const uint8_t *buf,
                 size_t len)
{
    return kvb_replay_live(o->rules, s, seq, buf, len, 0);
}

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
    } else if ((rc = apply(o, s, seq, buf, len)) < 0) {
        fprintf(stderr, "kvbridge-inspect: %s: %s\n", path, strerror(-rc));
    }
    free(buf);
    return rc < 0 ? rc : 0;
}

/* ---- --frames: tests/fuzz/fuzz_frames.c's records ----------------------- */

#define FRAMES_MAX_RECORDS 512
#define FRAMES_OVERSIZE 65537 /* a rejected record, as kvsim --frames sends it */

/* The record at d[*off..size): 1 with its seq (after *prev), payload and
 * length; 2 for a reconfigure record (skipped: the configuration is -c's);
 * 0 at the end.  A rejected record comes padded with zeros to
 * FRAMES_OVERSIZE bytes in big. */
static int next_record(const uint8_t *d, size_t size, size_t *off, uint64_t *prev, uint8_t *big,
                       const uint8_t **payload, size_t *len)
{
    if (*off >= size)
        return 0;
    int8_t code = (int8_t)d[(*off)++];
    bool reject = false;
    if (code == 126) {
        if (*off >= size)
            return 0;
        reject = true;
        code = (int8_t)d[(*off)++];
    }
    if (code == 127) {
        if (*off >= size)
            return 0;
        (*off)++;
        return 2;
    }
    uint64_t seq = *prev + 1 + (uint64_t)(int64_t)code;
    if (code == -128) {
        if (size - *off < 8)
            return 0;
        seq = 0;
        for (int i = 0; i < 8; i++)
            seq = seq << 8 | d[(*off)++];
    }
    size_t n = 0;
    if (size - *off >= 2) {
        n = (size_t)d[*off] | (size_t)d[*off + 1] << 8;
        *off += 2;
    } else {
        *off = size;
    }
    if (n > size - *off)
        n = size - *off;
    *payload = d + *off;
    *len = n;
    if (reject) {
        memset(big, 0, FRAMES_OVERSIZE);
        memcpy(big, d + *off, n);
        *payload = big;
        *len = FRAMES_OVERSIZE;
    }
    *off += n;
    *prev = seq;
    return 1;
}

/* A frame sequence as one stream (records 1..512, its first two bytes are
 * the fuzz target's configuration: skipped). */
static int run_frames(const struct opts *o, const char *path)
{
    uint8_t *d = NULL, *big = malloc(FRAMES_OVERSIZE);
    size_t size = 0, off = 2, len;
    int rc = big ? read_file(path, &d, &size) : -ENOMEM;
    const char *base = strrchr(path, '/');
    struct kvb_stream s;
    kvb_stream_init(&s, path, o->cfg_rank);
    /* the topic kvsim --frames sends it on */
    kvb_stream_set_labels(&s, o->source ? o->source : path, base ? base + 1 : path);
    uint64_t prev = 0;
    const uint8_t *payload;
    for (int rec = 0, k; rc >= 0 && rec < FRAMES_MAX_RECORDS &&
                         (k = next_record(d, size, &off, &prev, big, &payload, &len)) > 0;
         rec++)
        if (k == 1)
            rc = apply(o, &s, prev, payload, len);
    if (rc < 0)
        fprintf(stderr, "kvbridge-inspect: %s: %s\n", path, strerror(-rc));
    free(d);
    free(big);
    return rc < 0 ? rc : 0;
}

/* ---- index.json (json-c) ------------------------------------------------ */

struct entry {
    uint64_t seq;
    char file[256];
};

static int cmp_entry(const void *a, const void *b)
{
    const struct entry *x = a, *y = b;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* One element of "batches": {"seq": N, "file": "NAME"} (a name in the
 * folder: no '/'). */
static int parse_entry(json_object *b, struct entry *e)
{
    json_object *seq, *file;
    if (!json_object_is_type(b, json_type_object) || !json_object_object_get_ex(b, "seq", &seq) ||
        !json_object_object_get_ex(b, "file", &file) || !json_object_is_type(seq, json_type_int) ||
        !json_object_is_type(file, json_type_string))
        return -EINVAL;
    const char *name = json_object_get_string(file);
    size_t n = (size_t)json_object_get_string_len(file);
    errno = 0;
    uint64_t v = json_object_get_uint64(seq);
    if (errno || json_object_get_int64(seq) < 0 || n == 0 || n >= sizeof(e->file) ||
        memchr(name, '/', n) || memchr(name, '\0', n))
        return -EINVAL;
    e->seq = v;
    memcpy(e->file, name, n + 1);
    return 0;
}

/* The batches of a capture index, sorted by seq, and its "topic" (the
 * engine's topic frame; "" when none). */
static int parse_index(const char *text, size_t len, struct entry **out, size_t *n_out, char *topic,
                       size_t topic_cap)
{
    json_tokener *tok = json_tokener_new();
    json_object *root = tok ? json_tokener_parse_ex(tok, text, (int)len) : NULL, *batches, *t;
    bool ok = root && json_tokener_get_error(tok) == json_tokener_success &&
              json_object_object_get_ex(root, "batches", &batches) &&
              json_object_is_type(batches, json_type_array);
    size_t n = ok ? json_object_array_length(batches) : 0;
    struct entry *v = ok ? calloc(n ? n : 1, sizeof(*v)) : NULL;
    int rc = v ? 0 : ok ? -ENOMEM : -EINVAL;
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = parse_entry(json_object_array_get_idx(batches, i), &v[i]);
    bool has_topic = ok && json_object_object_get_ex(root, "topic", &t) &&
                     json_object_is_type(t, json_type_string);
    snprintf(topic, topic_cap, "%s", has_topic ? json_object_get_string(t) : "");
    json_object_put(root);
    if (tok)
        json_tokener_free(tok);
    if (rc < 0) {
        free(v);
        return rc;
    }
    qsort(v, n, sizeof(*v), cmp_entry);
    *out = v;
    *n_out = n;
    return 0;
}

static int run_dir(struct kvb_pipeline *p, const struct opts *o, const char *dir)
{
    char path[PATH_MAX], topic[256];
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
    if (len > INT_MAX)
        rc = -EFBIG;
    else if ((rc = parse_index((const char *)text, len, &ents, &n, topic, sizeof(topic))) < 0)
        fprintf(stderr, "kvbridge-inspect: %s: not a capture index\n", path);
    free(text);
    struct kvb_stream s;
    kvb_stream_init(&s, dir, o->cfg_rank);
    kvb_stream_set_labels(&s, o->source ? o->source : dir, topic);
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
          "       kvbridge-inspect [options] --frames FILE ...\n"
          "Prints one router event per line, exactly as kvbridge publishes it.\n"
          "  --format F          dynamo-json (default; or the config's nats.format):\n"
          "                      one JSON router event per line; dynamo-msgpack: one\n"
          "                      event-plane envelope per line, in hex, cut per batch\n"
          "                      (publisher_id from a fixed seed, published_at 0: the\n"
          "                      daemon's are random per start and the wall clock);\n"
          "                      raw: each batch's headers (KV-Seq, KV-DP-Rank, KV-Topic,\n"
          "                      KV-Source: -c's first source, else the file) and its\n"
          "                      payload (hex)\n"
          "  -c, --config FILE   take worker_id, block_size, lora_salt, forward_tiers,\n"
          "                      limits and sources[0].dp_rank from a kvbridge\n"
          "                      configuration file\n"
          "  --worker-id N       worker_id (default 0)\n"
          "  --block-size N|auto tokens per block (default auto)\n"
          "  --no-lora-salt      do not salt tokens_hash with lora_name\n"
          "  --decoded           print the decoded engine events instead\n"
          "  --frames            each FILE is a frame sequence, one stream: the record\n"
          "                      format of tests/fuzz/fuzz_frames.c (its first two\n"
          "                      bytes skipped, a reconfigure record skipped, a rejected\n"
          "                      record padded to 65537 bytes), as kvsim --frames sends it\n"
          "Without a config: worker_id 0, block_size auto, lora_salt on,\n"
          "forward_tiers [device], no payload limit.\n",
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

/* The command line, as given. */
struct args {
    const char *cfg_path, *worker, *bsize, *format;
    bool no_salt;
};

/* 0, 1 (--help given: exit 0) or 2 (usage error). */
static int parse_args(int argc, char **argv, struct args *a, struct opts *o)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"worker-id", required_argument, NULL, 'w'},
        {"block-size", required_argument, NULL, 'b'},
        {"no-lora-salt", no_argument, NULL, 'L'},
        {"decoded", no_argument, NULL, 'd'},
        {"format", required_argument, NULL, 'f'},
        {"frames", no_argument, NULL, 'F'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "c:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'c': a->cfg_path = optarg; break;
        case 'w': a->worker = optarg; break;
        case 'b': a->bsize = optarg; break;
        case 'L': a->no_salt = true; break;
        case 'd': o->decoded = true; break;
        case 'f': a->format = optarg; break;
        case 'F': o->frames = true; break;
        case 'h': usage(stdout); return 1;
        default: usage(stderr); return 2;
        }
    }
    if (optind >= argc) {
        usage(stderr);
        return 2;
    }
    return 0;
}

/* -c: what the daemon would take from the file (kept: the settings borrow
 * its strings). */
static int load_config(const char *path, struct opts *o)
{
    if (kvb_config_load(path, &o->cfg, stderr) < 0)
        return -EINVAL;
    o->pcfg = kvb_pipeline_cfg_of(o->cfg);
    o->ucfg = kvb_publish_cfg_of(o->cfg);
    o->max_payload = o->cfg->limits.max_payload_bytes;
    o->cfg_rank = o->cfg->sources[0].dp_rank;
    o->source = o->cfg->sources[0].endpoint;
    return 0;
}

/* The options that override the configuration; 0 or 2 (a bad value). */
static int apply_args(const struct args *a, struct opts *o)
{
    uint64_t v;
    if (a->worker && parse_u64(a->worker, &v) < 0) {
        fprintf(stderr, "kvbridge-inspect: bad --worker-id '%s'\n", a->worker);
        return 2;
    }
    if (a->worker)
        o->pcfg.convert.worker_id = v;
    if (a->bsize && strcmp(a->bsize, "auto") == 0) {
        o->pcfg.convert.block_size = 0;
    } else if (a->bsize) {
        if (parse_u64(a->bsize, &v) < 0 || v == 0 || v > UINT32_MAX) {
            fprintf(stderr, "kvbridge-inspect: bad --block-size '%s'\n", a->bsize);
            return 2;
        }
        o->pcfg.convert.block_size = (uint32_t)v;
    }
    if (a->no_salt)
        o->pcfg.convert.lora_salt = false;
    if (!a->format)
        return 0;
    static const char *const names[] = {"dynamo-json", "dynamo-msgpack", "raw"};
    for (int k = 0; k < 3; k++)
        if (strcmp(a->format, names[k]) == 0) {
            o->ucfg.format = k;
            return 0;
        }
    fprintf(stderr, "kvbridge-inspect: --format: dynamo-json, dynamo-msgpack or raw\n");
    return 2;
}

/* Every argument, in order: capture folders, frame sequences, or payload
 * files (consecutive ones are one stream, seqs 0, 1, 2, ...). */
static int run(struct kvb_pipeline *p, const struct opts *o, int argc, char **argv)
{
    struct kvb_stream files;
    kvb_stream_init(&files, "files", o->cfg_rank);
    kvb_stream_set_labels(&files, o->source ? o->source : "files", "");
    uint64_t file_seq = 0;
    int rc = 0;
    for (int i = optind; rc == 0 && i < argc; i++) {
        struct stat st;
        if (o->frames)
            rc = run_frames(o, argv[i]);
        else if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode))
            rc = run_dir(p, o, argv[i]);
        else
            rc = feed(p, o, &files, file_seq++, argv[i]);
    }
    kvb_publish_flush(o->pub);
    return rc;
}

/* The daemon's stages on the parsed options: publish (sink-less: to
 * write_msg; publisher ids from seed 1, published_at 0), pipeline, rules. */
static int build(struct opts *o, struct kvb_metrics *m, struct kvb_pipeline **p)
{
    struct kvb_publish_writer w = {.write = write_msg};
    int rc = kvb_publish_create(&o->ucfg, m, 1, &o->pub);
    if (rc == 0) {
        kvb_publish_set_writer(o->pub, &w);
        rc = kvb_pipeline_create(&o->pcfg, m, o->pub, p);
    }
    struct kvb_replay_cfg rcfg = {
        .name = "kvbridge-inspect", .endpoint = "", .max_payload_bytes = o->max_payload};
    struct kvb_seq_ops ops = rc == 0 ? kvb_pipeline_seq_ops(*p) : (struct kvb_seq_ops){0};
    if (rc == 0)
        rc = kvb_replay_create(&rcfg, m, &ops, NULL, &o->rules);
    if (rc < 0)
        fprintf(stderr, "kvbridge-inspect: %s\n", strerror(-rc));
    return rc;
}

int main(int argc, char **argv)
{
    struct args a = {0};
    struct opts o = {
        .pcfg = {.convert = {.worker_id = 0,
                             .block_size = 0,
                             .lora_salt = true,
                             .forward_tiers = 1u << KVB_TIER_DEVICE},
                 .limits = KVB_DECODE_LIMITS_DEFAULT},
        .ucfg = {.format = KVB_FORMAT_DYNAMO_JSON,
                 .subject = "namespace.{namespace}.component.{component}.kv_events",
                 .namespace_ = "dynamo",
                 .component = "backend",
                 .endpoint = "generate",
                 .batch = true,
                 .residency_domain = true},
    };
    int rc = parse_args(argc, argv, &a, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    if (a.cfg_path && load_config(a.cfg_path, &o) < 0)
        return KVB_EX_CONFIG;
    struct kvb_metrics m = {0};
    struct kvb_pipeline *p = NULL;
    if ((rc = apply_args(&a, &o)) == 0) {
        o.ucfg.worker_id = o.pcfg.convert.worker_id;
        rc = build(&o, &m, &p) < 0 || run(p, &o, argc, argv) < 0 || fflush(stdout) != 0;
    }
    kvb_replay_destroy(&o.rules);
    kvb_pipeline_destroy(&p);
    kvb_publish_destroy(&o.pub);
    kvb_config_free(&o.cfg);
    return rc;
}
