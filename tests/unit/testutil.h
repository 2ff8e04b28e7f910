/* Shared helpers for the unit tests: msgpack building, file reading, and a
 * pipeline whose router events are collected as text lines (a publish stage
 * without a sink, dynamo-json, writing to collect_msg). */
#ifndef KVB_TESTUTIL_H
#define KVB_TESTUTIL_H

#include <check.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "pipeline.h"
#include "publish.h"
#include "replay.h"

/* ---- msgpack building --------------------------------------------------- */

struct mp {
    msgpack_sbuffer sb;
    msgpack_packer pk;
};

static inline void mp_init(struct mp *m)
{
    msgpack_sbuffer_init(&m->sb);
    msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
}
static inline void mp_free(struct mp *m) { msgpack_sbuffer_destroy(&m->sb); }
static inline void mp_str(struct mp *m, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(&m->pk, n);
    msgpack_pack_str_body(&m->pk, s, n);
}
static inline void mp_raw(struct mp *m, const void *p, size_t n)
{
    msgpack_sbuffer_write(&m->sb, p, n);
}
static inline const uint8_t *mp_data(const struct mp *m) { return (const uint8_t *)m->sb.data; }

/* Hex text (known answers) to bytes; returns the byte count. */
static inline size_t unhex(const char *h, uint8_t *out)
{
    size_t n = strlen(h) / 2;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        ck_assert_int_eq(sscanf(h + 2 * i, "%2x", &v), 1);
        out[i] = (uint8_t)v;
    }
    return n;
}

/* ---- files -------------------------------------------------------------- */

static inline uint8_t *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n + 1);
    ck_assert(buf != NULL);
    ck_assert_int_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* ---- collecting pipeline output ----------------------------------------- */

struct sink_lines {
    char *text; /* all lines, '\n'-terminated */
    size_t len, cap;
    unsigned n;
    uint64_t last_id[16];
};

/* The publish stage's writer: each message's bytes, a line. */
static inline int collect_msg(void *ctx, const struct kvb_publish_msg *msg)
{
    struct sink_lines *s = ctx;
    size_t len = msg->len;
    const char *data = msg->data;
    if (s->len + len + 2 > s->cap) {
        s->cap = (s->len + len + 2) * 2;
        s->text = realloc(s->text, s->cap);
        ck_assert(s->text != NULL);
    }
    memcpy(s->text + s->len, data, len);
    s->len += len;
    s->text[s->len++] = '\n';
    s->text[s->len] = 0;
    s->n++;
    return 0;
}

static inline struct kvb_pipeline_cfg test_pcfg(uint64_t worker, uint32_t bs)
{
    struct kvb_pipeline_cfg c = {
        .convert = {.worker_id = worker,
                    .block_size = bs,
                    .lora_salt = true,
                    .forward_tiers = 1u << KVB_TIER_DEVICE},
        .limits = KVB_DECODE_LIMITS_DEFAULT,
    };
    return c;
}

/* A pipeline on a publish stage (dynamo-json) that writes every message as a
 * line to out; free with test_pipeline_destroy(). */
static inline void test_pipeline_create(const struct kvb_pipeline_cfg *c, struct kvb_metrics *m,
                                        struct sink_lines *out, struct kvb_publish **pub,
                                        struct kvb_pipeline **p)
{
    struct kvb_publish_cfg uc = {.format = KVB_FORMAT_DYNAMO_JSON,
                                 .subject = "kv_events",
                                 .namespace_ = "",
                                 .component = "",
                                 .endpoint = "",
                                 .worker_id = c->convert.worker_id};
    ck_assert_int_eq(kvb_publish_create(&uc, m, 1, pub), 0);
    struct kvb_publish_writer w = {.write = collect_msg, .ctx = out};
    kvb_publish_set_writer(*pub, &w);
    ck_assert_int_eq(kvb_pipeline_create(c, m, *pub, p), 0);
}

static inline void test_pipeline_destroy(struct kvb_publish **pub, struct kvb_pipeline **p)
{
    kvb_pipeline_destroy(p);
    kvb_publish_destroy(pub);
}

/* The daemon's sequence rules for a source without a replay endpoint, in
 * front of pipeline p: feed batches with kvb_replay_live(r, st, seq, data,
 * len, 0), as the source does.  max_payload: limits.max_payload_bytes (0:
 * none). */
static inline struct kvb_replay *test_rules(struct kvb_pipeline *p, struct kvb_metrics *m,
                                            uint64_t max_payload)
{
    struct kvb_replay_cfg c = {.name = "test", .endpoint = "", .max_payload_bytes = max_payload};
    struct kvb_seq_ops ops = kvb_pipeline_seq_ops(p);
    struct kvb_replay *r = NULL;
    ck_assert_int_eq(kvb_replay_create(&c, m, &ops, NULL, &r), 0);
    return r;
}

/* The main() of every suite: run it, exit non-zero on any failure. */
static inline int kvb_run_suite(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#endif
