/* config: the YAML file of docs/configuration.md, every error kind with its exact
 * FILE:LINE:COLUMN message, the example file, reloads.  Run from the project
 * root (reads tests/data/config/ and conf/kvbridge.yaml). */
#include <check.h>

#include "testutil.h"
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "config.h"
#include "log.h"
#include "metrics.h"

#define DATA "tests/data/config/"

/* ---- helpers ------------------------------------------------------------ */

struct result {
    int rc;
    struct kvb_config *cfg;
    char *errs; /* everything written to err, "" when nothing */
};

static struct result load(const char *path)
{
    struct result r = {0};
    size_t len = 0;
    FILE *err = open_memstream(&r.errs, &len);
    ck_assert(err != NULL);
    r.cfg = (struct kvb_config *)&r; /* sentinel: must stay untouched on failure */
    r.rc = kvb_config_load(path, &r.cfg, err);
    fclose(err);
    if (r.rc < 0) {
        ck_assert_ptr_eq(r.cfg, (struct kvb_config *)&r);
        r.cfg = NULL;
    }
    return r;
}

static void result_free(struct result *r)
{
    kvb_config_free(&r->cfg);
    free(r->errs);
    r->errs = NULL;
}

/* Replace every occurrence of FROM in S (malloc'd) by TO, in place. */
static void replace_all(char **s, const char *from, const char *to)
{
    size_t fl = strlen(from), tl = strlen(to);
    ck_assert(tl <= fl);
    char *w = *s;
    for (const char *p = *s; *p;) {
        if (strncmp(p, from, fl) == 0) {
            memcpy(w, to, tl);
            w += tl;
            p += fl;
        } else {
            *w++ = *p++;
        }
    }
    *w = '\0';
}

/* Write TEXT (LEN bytes) to a temporary file and load it; the file's name is
 * shown as "T" in r.errs. */
static struct result load_bytes(const char *text, size_t len)
{
    char path[] = "/tmp/check_config.XXXXXX";
    int fd = mkstemp(path);
    ck_assert(fd >= 0);
    ck_assert_int_eq(write(fd, text, len), (ssize_t)len);
    close(fd);
    struct result r = load(path);
    unlink(path);
    replace_all(&r.errs, path, "T");
    return r;
}

static struct result load_text(const char *text) { return load_bytes(text, strlen(text)); }

static char *example_text(size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    ck_assert(f != NULL);
    ck_assert_int_eq(kvb_config_write_example(f), 0);
    fclose(f);
    return buf;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    char *buf = NULL;
    size_t cap = 0;
    *len = 0;
    for (;;) {
        if (*len + 4096 + 1 > cap) {
            cap = (*len + 4096 + 1) * 2;
            buf = realloc(buf, cap);
            ck_assert(buf != NULL);
        }
        size_t n = fread(buf + *len, 1, 4096, f);
        *len += n;
        if (n == 0)
            break;
    }
    buf[*len] = '\0';
    fclose(f);
    return buf;
}

#define TIER(t) (1u << KVB_TIER_##t)

/* The key pairs of zmq_curve(7)'s example (tests/data/config/secrets/curve-*). */
#define CURVE_SERVER_PUBLIC "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
#define CURVE_SERVER_SECRET "JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6"
#define CURVE_CLIENT_PUBLIC "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID"
#define CURVE_CLIENT_SECRET "D:)Q[IlAW!ahhC2ac:9*A}h:p?([4%wOTJ%JR%cs"

static void assert_curve_key(const uint8_t key[32], const char *z85)
{
    uint8_t want[32];
    ck_assert_ptr_nonnull(zmq_z85_decode(want, z85));
    ck_assert_msg(memcmp(key, want, 32) == 0, "key is not %s", z85);
}

/* Every key at its default, except the required ones. */
static void assert_defaults(const struct kvb_config *c)
{
    ck_assert(c->lora_salt);
    ck_assert_uint_eq(c->forward_tiers, TIER(DEVICE));
    for (size_t i = 0; i < c->n_sources; i++) {
        const struct kvb_source_cfg *s = &c->sources[i];
        ck_assert_str_eq(s->replay_endpoint, "");
        ck_assert_str_eq(s->topic, "");
        ck_assert_int_eq(s->mode, KVB_MODE_CONNECT);
        ck_assert_uint_eq(s->dp_size, 1);
        ck_assert_uint_eq(s->dp_rank, 0);
        ck_assert_uint_eq(s->rcvhwm, 10000);
        ck_assert_str_eq(s->curve.secret_key_file, "");
        ck_assert_str_eq(s->curve.server_public_key, "");
        ck_assert_str_eq(s->curve.allowed_clients_file, "");
        ck_assert(!s->curve.enabled);
        ck_assert_ptr_null(s->curve.allowed);
        ck_assert_uint_eq(s->curve.n_allowed, 0);
    }
    ck_assert_uint_eq(c->nats.n_servers, 1);
    ck_assert_str_eq(c->nats.servers[0], "nats://127.0.0.1:4222");
    ck_assert_str_eq(c->nats.subject, "namespace.{namespace}.component.{component}.kv_events");
    ck_assert_str_eq(c->nats.namespace_, "dynamo");
    ck_assert_str_eq(c->nats.component, "backend");
    ck_assert_int_eq(c->nats.format, KVB_FORMAT_DYNAMO_JSON);
    ck_assert_str_eq(c->nats.credentials, "");
    ck_assert_str_eq(c->nats.user, "");
    ck_assert_str_eq(c->nats.password, "");
    ck_assert_str_eq(c->nats.password_file, "");
    ck_assert_str_eq(c->nats.token, "");
    ck_assert_str_eq(c->nats.token_file, "");
    ck_assert_str_eq(c->nats.nkey_seed, "");
    ck_assert_str_eq(c->nats.nkey_seed_file, "");
    ck_assert_str_eq(c->nats.nkey_public, "");
    ck_assert(!c->nats.tls.enabled);
    ck_assert_str_eq(c->nats.tls.ca, "");
    ck_assert_str_eq(c->nats.tls.cert, "");
    ck_assert_str_eq(c->nats.tls.key, "");
    ck_assert(c->nats.tls.verify);
    ck_assert_str_eq(c->nats.tls.server_name, "");
    ck_assert_uint_eq(c->nats.connect_timeout_ms, 0);
    ck_assert_uint_eq(c->nats.reconnect_buffer_bytes, 16u << 20);
    ck_assert_uint_eq(c->nats.reconnect_wait_ms, 100);
    ck_assert_uint_eq(c->nats.reconnect_wait_max_ms, 5000);
    ck_assert_uint_eq(c->nats.flush_timeout_ms, 5000);
    ck_assert(!c->nats.jetstream.enabled);
    ck_assert_str_eq(c->nats.jetstream.stream, "");
    ck_assert_str_eq(c->nats.jetstream.subject, "");
    ck_assert(c->nats.jetstream.create);
    ck_assert_int_eq(c->nats.jetstream.retention, KVB_JS_LIMITS);
    ck_assert_uint_eq(c->nats.jetstream.max_age_s, 3600);
    ck_assert_uint_eq(c->nats.jetstream.replicas, 1);
    ck_assert_uint_eq(c->nats.jetstream.duplicate_window_s, 120);
    ck_assert_uint_eq(c->nats.jetstream.max_pending, 4096);
    ck_assert_uint_eq(c->nats.jetstream.ack_timeout_ms, 5000);
    ck_assert_str_eq(c->nats.jetstream.stream_name, "namespace-dynamo-component-backend-kv-events");
    ck_assert_str_eq(c->nats.jetstream.subject_name,
                     "namespace-dynamo-component-backend-kv-events.queue");
    ck_assert_uint_eq(c->replay.timeout_ms, 2000);
    ck_assert_str_eq(c->metrics.listen, "127.0.0.1:9464");
    ck_assert_int_eq(c->log.level, KVB_LOG_INFO);
    ck_assert_str_eq(c->state.dir, "");
    ck_assert_uint_eq(c->limits.max_payload_bytes, 16u << 20);
    ck_assert_uint_eq(c->limits.max_events_per_batch, 65536);
    ck_assert_uint_eq(c->limits.max_hashes_per_event, 65536);
    ck_assert_uint_eq(c->limits.max_tokens_per_event, 1048576);
    ck_assert_uint_eq(c->limits.max_depth, 16);
}

/* ---- files that load ---------------------------------------------------- */

START_TEST(test_spec_example)
{
    /* docs/configuration.md's example, verbatim. */
    struct result r = load(DATA "spec-example.yaml");
    ck_assert_str_eq(r.errs, "");
    ck_assert_int_eq(r.rc, 0);
    const struct kvb_config *c = r.cfg;
    ck_assert_str_eq(c->path, DATA "spec-example.yaml");
    ck_assert_uint_eq(c->worker_id, 7587890738027725506ull);
    ck_assert_uint_eq(c->block_size, 16);
    ck_assert(c->lora_salt);
    ck_assert_uint_eq(c->forward_tiers, TIER(DEVICE));
    ck_assert_uint_eq(c->n_sources, 1);
    ck_assert_str_eq(c->sources[0].endpoint, "tcp://127.0.0.1:5557");
    ck_assert_str_eq(c->sources[0].replay_endpoint, "tcp://127.0.0.1:5558");
    ck_assert_str_eq(c->sources[0].topic, "");
    ck_assert_int_eq(c->sources[0].mode, KVB_MODE_CONNECT);
    ck_assert_uint_eq(c->sources[0].dp_size, 1);
    ck_assert_uint_eq(c->sources[0].dp_rank, 0);
    ck_assert_uint_eq(c->nats.n_servers, 1);
    ck_assert_str_eq(c->nats.servers[0], "nats://127.0.0.1:4222");
    ck_assert_str_eq(c->nats.subject, "namespace.{namespace}.component.{component}.kv_events");
    ck_assert_str_eq(c->nats.namespace_, "dynamo");
    ck_assert_str_eq(c->nats.component, "backend");
    ck_assert_int_eq(c->nats.format, KVB_FORMAT_DYNAMO_JSON);
    ck_assert(!c->nats.jetstream.enabled);
    ck_assert_str_eq(c->nats.jetstream.stream, "");
    ck_assert_str_eq(c->metrics.listen, "127.0.0.1:9464");
    ck_assert_int_eq(c->log.level, KVB_LOG_INFO);
    ck_assert_str_eq(c->state.dir, "");
    result_free(&r);
}
END_TEST

START_TEST(test_defaults)
{
    /* Only the required keys: everything else takes its default. */
    struct result r = load(DATA "minimal.yaml");
    ck_assert_str_eq(r.errs, "");
    ck_assert_int_eq(r.rc, 0);
    ck_assert_uint_eq(r.cfg->worker_id, 1);
    ck_assert_uint_eq(r.cfg->block_size, 32);
    ck_assert_uint_eq(r.cfg->n_sources, 1);
    ck_assert_str_eq(r.cfg->sources[0].endpoint, "ipc:///run/vllm/kv.sock");
    assert_defaults(r.cfg);
    result_free(&r);
}
END_TEST

START_TEST(test_every_key)
{
    /* Every key away from its default; block_size auto; worker_id = 2^64-1. */
    struct result r = load(DATA "full.yaml");
    ck_assert_str_eq(r.errs, "");
    ck_assert_int_eq(r.rc, 0);
    const struct kvb_config *c = r.cfg;
    ck_assert_uint_eq(c->worker_id, UINT64_MAX);
    ck_assert_uint_eq(c->block_size, 0);
    ck_assert(!c->lora_salt);
    ck_assert_uint_eq(c->forward_tiers,
                      TIER(DEVICE) | TIER(HOST_PINNED) | TIER(DISK) | TIER(EXTERNAL));
    ck_assert_uint_eq(c->n_sources, 2);
    const struct kvb_source_cfg *s = &c->sources[0];
    ck_assert_str_eq(s->endpoint, "tcp://10.0.0.1:6000");
    ck_assert_str_eq(s->replay_endpoint, "tcp://10.0.0.1:7000");
    ck_assert_str_eq(s->topic, "kv");
    ck_assert_int_eq(s->mode, KVB_MODE_BIND);
    ck_assert_uint_eq(s->dp_size, 4);
    ck_assert_uint_eq(s->dp_rank, 8);
    ck_assert_uint_eq(s->rcvhwm, 0);
    ck_assert(s->curve.enabled);
    ck_assert_str_eq(s->curve.secret_key_file, DATA "secrets/curve-server.secret");
    assert_curve_key(s->curve.secret_key, CURVE_SERVER_SECRET);
    ck_assert_str_eq(s->curve.allowed_clients_file, DATA "secrets/curve-clients");
    ck_assert_uint_eq(s->curve.n_allowed, 2);
    assert_curve_key(s->curve.allowed[0], CURVE_CLIENT_PUBLIC);
    assert_curve_key(s->curve.allowed[1], CURVE_SERVER_PUBLIC);
    ck_assert_str_eq(s->curve.server_public_key, "");
    s = &c->sources[1];
    ck_assert_str_eq(s->endpoint, "ipc:///run/engine.sock");
    ck_assert_str_eq(s->replay_endpoint, "");
    ck_assert_uint_eq(s->dp_size, 1);
    ck_assert_int_eq(s->rank_naming, KVB_RANKS_TRTLLM);
    ck_assert_uint_eq(s->n_lora_names, 1);
    ck_assert_uint_eq(s->lora_names[0].id, 3);
    ck_assert_str_eq(s->lora_names[0].name, "adapter-3");
    ck_assert_uint_eq(s->rcvhwm, 10000);
    ck_assert(s->curve.enabled);
    assert_curve_key(s->curve.secret_key, CURVE_CLIENT_SECRET);
    ck_assert_str_eq(s->curve.server_public_key, CURVE_SERVER_PUBLIC);
    assert_curve_key(s->curve.server_key, CURVE_SERVER_PUBLIC);
    ck_assert_uint_eq(s->curve.n_allowed, 0);
    ck_assert_uint_eq(c->nats.n_servers, 2);
    ck_assert_str_eq(c->nats.servers[0], "nats://a:4222");
    ck_assert_str_eq(c->nats.servers[1], "tls://b:4222");
    ck_assert_str_eq(c->nats.subject, "kv.{worker_id}.{dp_rank}");
    ck_assert_str_eq(c->nats.namespace_, "ns");
    ck_assert_str_eq(c->nats.component, "comp");
    /* relative file names: next to the config file */
    ck_assert_str_eq(c->nats.credentials, DATA "secrets/nats.creds");
    ck_assert_str_eq(c->nats.user, "");
    ck_assert_str_eq(c->nats.nkey_public, "");
    ck_assert(c->nats.tls.enabled);
    ck_assert_str_eq(c->nats.tls.ca, DATA "secrets/ca.pem");
    ck_assert_str_eq(c->nats.tls.cert, DATA "secrets/client.pem");
    ck_assert_str_eq(c->nats.tls.key, DATA "secrets/client-key.pem");
    ck_assert(!c->nats.tls.verify);
    ck_assert_str_eq(c->nats.tls.server_name, "");
    ck_assert_uint_eq(c->nats.connect_timeout_ms, 30000);
    ck_assert_uint_eq(c->nats.reconnect_buffer_bytes, 1048576);
    ck_assert_uint_eq(c->nats.reconnect_wait_ms, 50);
    ck_assert_uint_eq(c->nats.reconnect_wait_max_ms, 50);
    ck_assert_uint_eq(c->nats.flush_timeout_ms, 0);
    ck_assert(c->nats.jetstream.enabled);
    ck_assert_str_eq(c->nats.jetstream.stream, "kv-events");
    ck_assert_str_eq(c->nats.jetstream.stream_name, "kv-events");
    ck_assert_str_eq(c->nats.jetstream.subject_name, "kv-events.queue");
    ck_assert_uint_eq(c->replay.timeout_ms, 500);
    ck_assert_str_eq(c->metrics.listen, "[::1]:9000");
    ck_assert_int_eq(c->log.level, KVB_LOG_DEBUG);
    ck_assert_str_eq(c->state.dir, "/var/lib/kvbridge");
    ck_assert_uint_eq(c->limits.max_payload_bytes, 1073741824);
    ck_assert_uint_eq(c->limits.max_events_per_batch, 1);
    ck_assert_uint_eq(c->limits.max_hashes_per_event, 2);
    ck_assert_uint_eq(c->limits.max_tokens_per_event, 3);
    ck_assert_uint_eq(c->limits.max_depth, 31);
    result_free(&r);
}
END_TEST

START_TEST(test_small_forms)
{
    /* Quoted auto, boolean spellings, flow style, a section left empty
     * ("state:" = all defaults), the smallest and largest accepted values. */
    struct result r = load_text("{worker_id: 0, block_size: 'auto', lora_salt: FALSE,\n"
                                " sources: [{endpoint: 'tcp://h:65535', dp_rank: 4294967295,\n"
                                "            rcvhwm: 2147483647}],\n"
                                " state: , limits: {max_depth: 1}}\n");
    ck_assert_str_eq(r.errs, "");
    ck_assert_int_eq(r.rc, 0);
    ck_assert_uint_eq(r.cfg->worker_id, 0);
    ck_assert_uint_eq(r.cfg->block_size, 0);
    ck_assert(!r.cfg->lora_salt);
    ck_assert_uint_eq(r.cfg->sources[0].dp_rank, UINT32_MAX);
    ck_assert_uint_eq(r.cfg->sources[0].rcvhwm, 2147483647);
    ck_assert_uint_eq(r.cfg->limits.max_depth, 1);
    ck_assert_str_eq(r.cfg->state.dir, "");
    result_free(&r);

    r = load_text("worker_id: 1\nblock_size: 1048576\nlora_salt: True\n"
                  "sources:\n- endpoint: tcp://h:5557\n  dp_size: 4\n"
                  "  replay_endpoint: tcp://h:65532\n");
    ck_assert_str_eq(r.errs, "");
    ck_assert_int_eq(r.rc, 0);
    ck_assert_uint_eq(r.cfg->block_size, 1048576);
    ck_assert(r.cfg->lora_salt);
    result_free(&r);
}
END_TEST

/* ---- every error, exactly ----------------------------------------------- */

struct bad_file {
    const char *file;
    const char *errs;
};

static const struct bad_file bad_files[] = {
    {"bad-unknown.yaml",
     DATA "bad-unknown.yaml:4:5: unknown key 'sources[0].edpoint'\n" DATA
          "bad-unknown.yaml:4:5: missing required key 'sources[0].endpoint'\n" DATA
          "bad-unknown.yaml:6:3: unknown key 'nats.servrs'\n" DATA
          "bad-unknown.yaml:8:5: unknown key 'nats.jetstream.enable'\n" DATA
          "bad-unknown.yaml:9:1: unknown key 'logging'\n"},
    {"bad-duplicate.yaml",
     DATA "bad-duplicate.yaml:6:5: duplicate key 'sources[0].topic' (first at 5:5)\n" DATA
          "bad-duplicate.yaml:9:1: duplicate key 'nats' (first at 7:1)\n" DATA
          "bad-duplicate.yaml:11:1: duplicate key 'worker_id' (first at 1:1)\n"},
    {"bad-missing.yaml", DATA "bad-missing.yaml:2:1: missing required key 'worker_id'\n" DATA
                              "bad-missing.yaml:2:1: missing required key 'block_size'\n" DATA
                              "bad-missing.yaml:2:1: missing required key 'sources'\n"},
    {"bad-no-endpoint.yaml",
     DATA "bad-no-endpoint.yaml:4:5: missing required key 'sources[0].endpoint'\n" DATA
          "bad-no-endpoint.yaml:6:5: missing required key 'sources[2].endpoint'\n"},
    {"bad-enum.yaml",
     DATA "bad-enum.yaml:10:1: only one YAML document is allowed\n" DATA
          "bad-enum.yaml:5:11: sources[0].mode: 'listen' is not one of connect or bind\n" DATA
          "bad-enum.yaml:9:10: log.level: 'verbose' is not one of error, warn, info "
          "or debug\n"},
    {"bad-format.yaml",
     DATA "bad-format.yaml:4:16: nats.format: raw cannot be published through JetStream "
          "(nats.jetstream.enabled): Dynamo's JetStream consumers read dynamo-json; use "
          "dynamo-json, or core NATS\n" DATA
          "bad-format.yaml:5:31: discovery.etcd.endpoints: discovery registers event-plane "
          "publishers: it needs nats.format dynamo-msgpack\n"},
    {"bad-resync.yaml",
     DATA "bad-resync.yaml:4:83: nats.repair_bytes_per_s: 100 is out of range (expected "
          "4096..4294967295)\n" DATA
          "bad-resync.yaml:4:29: nats.resync_on_reconnect: for core NATS only: JetStream "
          "sends again what the stream did not acknowledge\n" DATA
          "bad-resync.yaml:4:29: nats.resync_on_reconnect: needs the residency mirror "
          "(limits.max_resident_blocks is 0)\n"},
    {"bad-recovery.yaml",
     DATA "bad-recovery.yaml:4:33: discovery.recovery.enabled: needs discovery.etcd.endpoints "
          "(the EventSource records carry the recovery target)\n" DATA
          "bad-recovery.yaml:4:33: discovery.recovery.enabled: needs the residency mirror "
          "(limits.max_resident_blocks is 0)\n" DATA
          "bad-recovery.yaml:4:67: discovery.recovery.advertise: required when "
          "discovery.recovery.listen is a wildcard address (the records must name one routers "
          "can reach)\n"},
    {"bad-ints.yaml",
     DATA "bad-ints.yaml:1:12: worker_id: '-1' is negative (expected "
          "0..18446744073709551615)\n" DATA
          "bad-ints.yaml:2:13: block_size: '1.5' is not a decimal integer (expected "
          "1..1048576 or \"auto\")\n" DATA
          "bad-ints.yaml:5:14: sources[0].dp_size: 0 is out of range (expected 1..65535)\n" DATA
          "bad-ints.yaml:6:14: sources[0].dp_rank: 4294967296 is out of range (expected "
          "0..4294967295)\n" DATA
          "bad-ints.yaml:7:13: sources[0].rcvhwm: '10k' is not a decimal integer "
          "(expected 0..2147483647)\n" DATA
          "bad-ints.yaml:9:23: nats.connect_timeout_ms: '18446744073709551616' is too "
          "large (expected 0..2147483647)\n" DATA
          "bad-ints.yaml:10:22: nats.reconnect_wait_ms: '12 ' is not a decimal integer "
          "(expected 1..2147483647)\n" DATA
          "bad-ints.yaml:11:21: nats.flush_timeout_ms: '0x10' is not a decimal integer "
          "(expected 0..2147483647)\n" DATA
          "bad-ints.yaml:12:27: nats.reconnect_buffer_bytes: '010' is not a decimal "
          "integer (expected 0..2147483647)\n" DATA
          "bad-ints.yaml:14:14: limits.max_depth: 32 is out of range (expected 1..31)\n" DATA
          "bad-ints.yaml:15:22: limits.max_payload_bytes: '1e6' is not a decimal integer "
          "(expected 1..1073741824)\n" DATA
          "bad-ints.yaml:16:25: limits.max_events_per_batch: '+5' is not a decimal "
          "integer (expected 1..4294967295)\n"},
    {"bad-ports.yaml",
     DATA "bad-ports.yaml:5:14: sources[0].dp_size: 8 ports from 65530 "
          "(sources[0].endpoint) go past 65535\n" DATA
          "bad-ports.yaml:7:14: sources[1].dp_size: 2 needs sources[1].endpoint to be "
          "tcp://HOST:PORT with a numeric port (or rank_naming: trtllm for ipc:// and "
          "inproc://)\n" DATA "bad-ports.yaml:10:14: sources[2].dp_size: 2 ports from 65535 "
          "(sources[2].replay_endpoint) go past 65535\n"},
    {"bad-syntax.yaml",
     DATA "bad-syntax.yaml:5:2: did not find expected key (while parsing a block mapping "
          "at 1:1)\n"},
    {"bad-kinds.yaml", DATA
     "bad-kinds.yaml:1:12: worker_id: expected a single value, found a mapping\n" DATA
     "bad-kinds.yaml:2:13: block_size: expected a single value, found a list\n" DATA
     "bad-kinds.yaml:3:12: lora_salt: 'maybe' is not a boolean (expected true or "
     "false)\n" DATA "bad-kinds.yaml:4:16: forward_tiers: expected a list ([a, b]), found a single "
     "value\n" DATA
     "bad-kinds.yaml:6:3: sources: expected a list of sources, found a mapping\n" DATA
     "bad-kinds.yaml:8:12: nats.servers: the list must not be empty\n" DATA
     "bad-kinds.yaml:9:11: nats.subject: missing value (write \"\" for an empty "
     "string)\n" DATA "bad-kinds.yaml:10:14: nats.namespace: must not be empty\n" DATA
     "bad-kinds.yaml:11:6: log: expected a mapping, found a single value\n"},
    {"bad-values.yaml",
     DATA "bad-values.yaml:2:13: block_size: 0 is out of range (expected 1..1048576 or "
          "\"auto\")\n" DATA
          "bad-values.yaml:3:25: forward_tiers[1]: 'gpu' is not a storage tier (expected "
          "device, host_pinned, disk or external)\n" DATA
          "bad-values.yaml:3:30: forward_tiers[2]: tier 'device' is listed twice\n" DATA
          "bad-values.yaml:5:15: sources[0].endpoint: 'http://127.0.0.1:5557' is not a "
          "ZMQ endpoint (expected tcp://, ipc:// or inproc://...)\n" DATA
          "bad-values.yaml:6:22: sources[0].replay_endpoint: 'tcp://' is not a ZMQ "
          "endpoint (expected tcp://, ipc:// or inproc://...)\n" DATA
          "bad-values.yaml:7:5: sources[1]: expected a mapping (endpoint: ...), found a "
          "single value\n" DATA "bad-values.yaml:9:28: nats.servers[1]: must not be empty\n" DATA
          "bad-values.yaml:10:12: nats.subject: unknown placeholder '{namspace}' "
          "(expected {namespace}, {component}, {endpoint}, {worker_id} or {dp_rank})\n" DATA
          "bad-values.yaml:13:11: metrics.listen: '9464' is not HOST:PORT (or \"\" to "
          "disable)\n" DATA "bad-values.yaml:11:22: nats.reconnect_wait_max_ms: 5000 is less than "
          "nats.reconnect_wait_ms (6000)\n"},
    {"bad-alias.yaml", DATA "bad-alias.yaml:2:13: YAML aliases are not supported\n"},
    {"bad-auth.yaml",
     DATA "bad-auth.yaml:7:9: nats.user: only one authentication method may be set, and "
          "nats.token (at 6:10) is set already\n" DATA
          "bad-auth.yaml:8:19: nats.nkey_seed_file: only one authentication method may be "
          "set, and nats.token (at 6:10) is set already\n" DATA
          "bad-auth.yaml:9:16: nats.credentials: only one authentication method may be "
          "set, and nats.token (at 6:10) is set already\n"},
    {"bad-auth-pairs.yaml", DATA
     "bad-auth-pairs.yaml:7:18: nats.password_file: nats.password is set too (at "
     "6:13): use one of them\n" DATA "bad-auth-pairs.yaml:6:13: nats.password: needs nats.user\n"},
    {"bad-secret-files.yaml", DATA
     "bad-secret-files.yaml:10:16: nats.credentials: '" DATA "secrets' is not a "
     "regular file\n" DATA "bad-secret-files.yaml:7:18: nats.password_file: cannot read '" DATA
     "secrets/no-such-file': No such file or directory\n" DATA
     "bad-secret-files.yaml:8:15: nats.token_file: cannot use '" DATA
     "secrets/empty': it is empty\n" DATA
     "bad-secret-files.yaml:9:19: nats.nkey_seed_file: cannot use '" DATA
     "secrets/nul': it contains a NUL byte\n" DATA
     "bad-secret-files.yaml:13:9: nats.tls.ca: cannot read '/nonexistent/ca.pem': No "
     "such file or directory\n" DATA "bad-secret-files.yaml:15:10: nats.tls.key: cannot read '" DATA
     "secrets/missing-key.pem': No such file or directory\n" DATA
     "bad-secret-files.yaml:8:15: nats.token_file: only one authentication method may "
     "be set, and nats.user (at 6:9) is set already\n" DATA
     "bad-secret-files.yaml:9:19: nats.nkey_seed_file: only one authentication method "
     "may be set, and nats.user (at 6:9) is set already\n" DATA
     "bad-secret-files.yaml:10:16: nats.credentials: only one authentication method "
     "may be set, and nats.user (at 6:9) is set already\n"},
    {"bad-tls.yaml",
     DATA "bad-tls.yaml:10:18: nats.tls.server_name: must be a host name (no white space "
          "or '/')\n" DATA
          "bad-tls.yaml:8:9: nats.tls.ca: TLS is not enabled (set nats.tls.enabled: true, "
          "or use tls:// server URLs)\n" DATA
          "bad-tls.yaml:9:11: nats.tls.cert: TLS is not enabled (set nats.tls.enabled: "
          "true, or use tls:// server URLs)\n" DATA
          "bad-tls.yaml:10:18: nats.tls.server_name: TLS is not enabled (set "
          "nats.tls.enabled: true, or use tls:// server URLs)\n"},
    {"bad-tls2.yaml",
     DATA "bad-tls2.yaml:8:14: nats.tls.enabled: false, but nats.servers[1] is a tls:// "
          "URL\n" DATA "bad-tls2.yaml:9:10: nats.tls.key: needs nats.tls.cert too\n" DATA
          "bad-tls2.yaml:11:18: nats.tls.server_name: has no effect with nats.tls.verify: "
          "false\n"},
    {"bad-nkey.yaml",
     DATA "bad-nkey.yaml:6:14: nats.nkey_seed: not an NKey user seed: seeds start with "
          "\"SU\" (one starting with \"U\" is a public key, which cannot sign)\n"},
    {"bad-toplevel.yaml",
     DATA "bad-toplevel.yaml:1:1: expected a mapping of keys at the top level, found a "
          "list\n"},
    {"empty.yaml",
     DATA "empty.yaml:1:1: empty configuration (worker_id, block_size and sources are "
          "required)\n"},
    {"comments.yaml",
     DATA "comments.yaml:1:1: empty configuration (worker_id, block_size and sources are "
          "required)\n"},
};

START_TEST(test_bad_file)
{
    const struct bad_file *b = &bad_files[_i];
    char path[256];
    snprintf(path, sizeof path, DATA "%s", b->file);
    struct result r = load(path);
    ck_assert_msg(r.rc == -EINVAL, "%s: rc %d", b->file, r.rc);
    ck_assert_str_eq(r.errs, b->errs);
    ck_assert(r.cfg == NULL);
    result_free(&r);
}
END_TEST

START_TEST(test_err_null)
{
    /* err may be NULL: same result, nothing written. */
    struct kvb_config *c = NULL;
    ck_assert_int_eq(kvb_config_load(DATA "bad-ints.yaml", &c, NULL), -EINVAL);
    ck_assert(c == NULL);
    ck_assert_int_eq(kvb_config_load(DATA "minimal.yaml", &c, NULL), 0);
    ck_assert(c != NULL);
    kvb_config_free(&c);
    ck_assert_int_eq(kvb_config_load(NULL, &c, NULL), -EINVAL);
    ck_assert_int_eq(kvb_config_load(DATA "minimal.yaml", NULL, NULL), -EINVAL);
}
END_TEST

START_TEST(test_unreadable)
{
    struct result r = load(DATA "no-such-file.yaml");
    ck_assert_int_eq(r.rc, -ENOENT);
    ck_assert_str_eq(r.errs, DATA "no-such-file.yaml: cannot read: No such file or "
                                  "directory\n");
    result_free(&r);

    r = load(DATA);
    ck_assert_int_eq(r.rc, -EISDIR);
    ck_assert_str_eq(r.errs, DATA ": cannot read: Is a directory\n");
    result_free(&r);
}
END_TEST

START_TEST(test_file_size_cap)
{
    /* Exactly 1 MiB loads; one byte more is refused before parsing. */
    const char *head = "worker_id: 1\nblock_size: 16\nsources: [{endpoint: 'inproc://x'}]\n";
    size_t cap = 1u << 20;
    char *buf = malloc(cap + 1);
    ck_assert(buf != NULL);
    memset(buf, ' ', cap + 1);
    memcpy(buf, head, strlen(head));
    buf[strlen(head)] = '#';
    buf[cap - 1] = '\n';
    struct result r = load_bytes(buf, cap);
    ck_assert_str_eq(r.errs, "");
    ck_assert_int_eq(r.rc, 0);
    result_free(&r);

    buf[cap] = '\n';
    r = load_bytes(buf, cap + 1);
    ck_assert_int_eq(r.rc, -EINVAL);
    ck_assert_str_eq(r.errs, "T: file too large (more than 1048576 bytes)\n");
    result_free(&r);
    free(buf);
}
END_TEST

/* Inline cases: text, expected errors ("T" is the file). */
static const struct bad_file bad_texts[] = {
    /* a key that spells a path is still an unknown key */
    {"worker_id: 1\nblock_size: 16\nsources: [{endpoint: 'inproc://x'}]\n"
     "nats.servers: [a]\n",
     "T:4:1: unknown key 'nats.servers'\n"},
    /* a key that is not a scalar */
    {"worker_id: 1\nblock_size: 16\nsources: [{endpoint: 'inproc://x'}]\n? [a]\n: 1\n",
     "T:4:3: keys must be single values, not a list\n"},
    /* control characters in keys and values are escaped in messages */
    {"worker_id: \"1\\n2\"\nblock_size: 16\nsources: [{endpoint: 'inproc://x'}]\n"
     "\"a\\tb\": 1\n",
     "T:1:12: worker_id: '1\\x0a2' is not a decimal integer (expected "
     "0..18446744073709551615)\n"
     "T:4:1: unknown key 'a\\x09b'\n"},
    /* a NUL inside a string */
    {"worker_id: 1\nblock_size: 16\nsources: [{endpoint: \"inproc://x\\0y\"}]\n",
     "T:3:22: sources[0].endpoint: the string contains a NUL character\n"},
    /* null where a value is needed */
    {"worker_id: ~\nblock_size: null\nsources:\n", "T:1:12: worker_id: missing value\n"
                                                   "T:2:13: block_size: missing value\n"
                                                   "T:3:9: sources: expected a list of "
                                                   "sources, found nothing\n"},
    {"worker_id: 1\nblock_size: 16\nsources: []\nforward_tiers: []\n",
     "T:3:10: sources: at least one source is required\n"
     "T:4:16: forward_tiers: the list must not be empty\n"},
    {"worker_id: 1\nblock_size: 16\nsources: [~, [a]]\nnats: {servers: [{a: 1}, ~]}\n",
     "T:3:11: sources[0]: expected a mapping (endpoint: ...), found nothing\n"
     "T:3:14: sources[1]: expected a mapping (endpoint: ...), found a list\n"
     "T:4:18: nats.servers[0]: expected a single value, found a mapping\n"
     "T:4:26: nats.servers[1]: expected a single value, found nothing\n"},
    /* only the waits given: the ceiling default is below the first step */
    {"worker_id: 1\nblock_size: 16\nsources: [{endpoint: 'inproc://x'}]\n"
     "nats: {reconnect_wait_ms: 5001}\n",
     "T:4:27: nats.reconnect_wait_max_ms: 5000 is less than nats.reconnect_wait_ms "
     "(5001)\n"},
    /* dp_rank + dp_size past u32 */
    {"worker_id: 1\nblock_size: 16\nsources: [{endpoint: 'tcp://h:1', dp_size: 2,\n"
     "  dp_rank: 4294967295}]\n",
     "T:4:12: sources[0].dp_rank: 4294967295 + dp_size 2 goes past 4294967295\n"},
    /* rank_naming trtllm expands ipc://, but a tcp:// port must still be a number */
    {"worker_id: 1\nblock_size: 16\nsources: [{endpoint: 'ipc:///tmp/kv', dp_size: 4,\n"
     "  rank_naming: trtllm, replay_endpoint: 'tcp://*:x'}, {endpoint: 'ipc:///x',\n"
     "  rank_naming: tensorrt}]\n",
     "T:3:48: sources[0].dp_size: 4 needs sources[0].replay_endpoint to be "
     "tcp://HOST:PORT with a numeric port\n"
     "T:5:16: sources[1].rank_naming: 'tensorrt' is not one of port or trtllm\n"},
    /* a non-numeric port with dp_size > 1 */
    {"worker_id: 1\nblock_size: 16\nsources: [{endpoint: 'tcp://*:x', dp_size: 2}]\n",
     "T:3:44: sources[0].dp_size: 2 needs sources[0].endpoint to be tcp://HOST:PORT "
     "with a numeric port\n"},
    /* subject and names with white space, listen without a host */
    {"worker_id: 1\nblock_size: 16\nsources: [{endpoint: 'inproc://x'}]\n"
     "nats: {subject: 'a b', component: 'x y'}\nmetrics: {listen: ':80'}\n",
     "T:4:17: nats.subject: must not contain white space\n"
     "T:4:35: nats.component: must not contain white space\n"
     "T:5:19: metrics.listen: ':80' is not HOST:PORT (or \"\" to disable)\n"},
    /* an over-long value is cut in the message */
    {"worker_id: 1\nblock_size: 16\nsources: [{endpoint: 'inproc://x'}]\n"
     "log: {level: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa}\n",
     "T:4:14: log.level: 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...' "
     "is not one of error, warn, info or debug\n"},
    /* JetStream: names that cannot be used, once resolved; placeholders; the
     * duplicate window longer than max_age_s; the new keys' ranges */
    {"worker_id: 1\nblock_size: 16\nsources: [{endpoint: 'inproc://x'}]\n"
     "nats: {namespace: a.b, jetstream: {enabled: true}}\n",
     "T:4:45: nats.jetstream.stream: 'namespace-a.b-component-backend-kv-events' contains "
     "one of . * > / \\, white space or a control character\n"},
    {"worker_id: 1\nblock_size: 16\nsources: [{endpoint: 'inproc://x'}]\n"
     "nats: {jetstream: {enabled: true, subject: 'kv.*', stream: 's{dp_rank}'}}\n",
     "T:4:60: nats.jetstream.stream: unknown placeholder '{dp_rank}' (expected {namespace}, "
     "{component} or {worker_id})\n"},
    {"worker_id: 1\nblock_size: 16\nsources: [{endpoint: 'inproc://x'}]\n"
     "nats: {jetstream: {enabled: true, subject: 'kv.>', stream: 'a b'}}\n",
     "T:4:60: nats.jetstream.stream: must not contain white space\n"},
    {"worker_id: 1\nblock_size: 16\nsources: [{endpoint: 'inproc://x'}]\n"
     "nats: {jetstream: {enabled: true, subject: 'kv.*.{worker_id}'}}\n",
     "T:4:44: nats.jetstream.subject: 'kv.*.1' contains a wildcard (* or >), white space or "
     "a control character\n"},
    {"worker_id: 1\nblock_size: 16\nsources: [{endpoint: 'inproc://x'}]\n"
     "nats: {jetstream: {enabled: true, subject: 'kv..x'}}\n",
     "T:4:44: nats.jetstream.subject: 'kv..x' has an empty token\n"},
    {"worker_id: 1\nblock_size: 16\nsources: [{endpoint: 'inproc://x'}]\n"
     "nats: {jetstream: {enabled: true, max_age_s: 60}}\n",
     "T:4:46: nats.jetstream.duplicate_window_s: 120 is more than nats.jetstream.max_age_s "
     "(60)\n"},
    {"worker_id: 1\nblock_size: 16\nsources: [{endpoint: 'inproc://x'}]\n"
     "nats: {jetstream: {retention: fifo, replicas: 6, max_pending: 8, ack_timeout_ms: 99,\n"
     "  duplicate_window_s: 0, create: maybe}}\n",
     "T:4:31: nats.jetstream.retention: 'fifo' is not one of limits, interest or workqueue\n"
     "T:4:47: nats.jetstream.replicas: 6 is out of range (expected 1..5)\n"
     "T:4:63: nats.jetstream.max_pending: 8 is out of range (expected 16..1048576)\n"
     "T:4:82: nats.jetstream.ack_timeout_ms: 99 is out of range (expected 100..2147483647)\n"
     "T:5:23: nats.jetstream.duplicate_window_s: 0 is out of range (expected 1..4294967295)\n"
     "T:5:34: nats.jetstream.create: 'maybe' is not a boolean (expected true or false)\n"},
    /* syntax errors: scanner, with and without a context */
    {"worker_id: 1\nblock_size: [16\n", "T:3:1: did not find expected ',' or ']' (while "
                                        "parsing a flow sequence at 2:13)\n"},
    {"a: b: c\n", "T:1:5: mapping values are not allowed in this context\n"},
    {"worker_id: \"1\n", "T:2:1: found unexpected end of stream (while scanning a quoted "
                         "scalar at 1:12)\n"},
    {"\tworker_id: 1\n", "T:1:1: found character that cannot start any token (while "
                         "scanning for the next token at 1:1)\n"},
    /* invalid UTF-8 (a reader error, located from its byte offset) */
    {"worker_id: 1\nblock_size: \xff\n", "T:2:13: invalid leading UTF-8 octet (byte "
                                         "0xff)\n"},
    {"!!map\n", "T:1:1: empty configuration (worker_id, block_size and sources are "
                "required)\n"},
};

START_TEST(test_bad_text)
{
    const struct bad_file *b = &bad_texts[_i];
    struct result r = load_text(b->file);
    ck_assert_msg(r.rc == -EINVAL, "case %d: rc %d", _i, r.rc);
    ck_assert_str_eq(r.errs, b->errs);
    result_free(&r);
}
END_TEST

START_TEST(test_nesting_and_node_caps)
{
    /* 100 levels of nesting: stopped at 32, no recursion beyond it. */
    char deep[512];
    size_t n = 0;
    n += (size_t)snprintf(deep, sizeof deep, "worker_id: ");
    for (int i = 0; i < 100; i++)
        deep[n++] = '[';
    deep[n++] = '\n';
    struct result r = load_bytes(deep, n);
    ck_assert_int_eq(r.rc, -EINVAL);
    ck_assert_str_eq(r.errs, "T:1:43: nested too deeply (more than 32 levels)\n");
    result_free(&r);

    /* 70000 list items: stopped at 65536 nodes. */
    size_t cap = 200000;
    char *big = malloc(cap);
    ck_assert(big != NULL);
    n = (size_t)snprintf(big, cap, "worker_id: [");
    for (int i = 0; i < 70000; i++) {
        big[n++] = '1';
        big[n++] = ',';
    }
    big[n++] = ']';
    big[n++] = '\n';
    r = load_bytes(big, n);
    ck_assert_int_eq(r.rc, -EINVAL);
    ck_assert_str_eq(r.errs, "T:1:131079: too many YAML nodes (more than 65536)\n");
    result_free(&r);
    free(big);
}
END_TEST

START_TEST(test_error_cap)
{
    /* 150 unknown keys: 100 shown, then one line saying the rest are not. */
    size_t cap = 150 * 16 + 64, n = 0;
    char *buf = malloc(cap);
    ck_assert(buf != NULL);
    for (int i = 0; i < 150; i++)
        n += (size_t)snprintf(buf + n, cap - n, "k%d: 1\n", i);
    struct result r = load_bytes(buf, n);
    ck_assert_int_eq(r.rc, -EINVAL);
    size_t lines = 0;
    for (const char *p = r.errs; *p; p++)
        lines += *p == '\n';
    ck_assert_uint_eq(lines, 101);
    ck_assert(strstr(r.errs, "T:100:1: unknown key 'k99'\n") != NULL);
    ck_assert(strstr(r.errs, "T:101:1:") == NULL);
    const char *tail = "T: too many errors, not showing the rest\n";
    ck_assert_str_eq(r.errs + strlen(r.errs) - strlen(tail), tail);
    result_free(&r);
    free(buf);
}
END_TEST

/* ---- robustness: truncations and byte flips of good files --------------- */

START_TEST(test_mutations)
{
    static const char *const files[] = {DATA "full.yaml", DATA "spec-example.yaml"};
    /* The copies are in /tmp: full.yaml's relative file names are found
     * through $CREDENTIALS_DIRECTORY instead. */
    setenv("CREDENTIALS_DIRECTORY", DATA, 1);
    size_t full_len;
    char *full = read_file(DATA "full.yaml", &full_len);
    struct result ok = load_bytes(full, full_len);
    ck_assert_str_eq(ok.errs, "");
    ck_assert_int_eq(ok.rc, 0);
    result_free(&ok);
    free(full);
    static const char flips[] = {'\0', ':',  '-', '[', '{',  '"', '\'', '&',
                                 '*',  '\n', ' ', '9', '\t', '#', '!',  '\xc3'};
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        size_t len;
        char *text = read_file(files[f], &len);
        for (size_t cut = 0; cut <= len; cut += 3) {
            struct result r = load_bytes(text, cut);
            ck_assert(r.rc == 0 || r.rc == -EINVAL);
            ck_assert(r.rc == 0 || r.errs[0] != '\0');
            result_free(&r);
        }
        for (size_t at = 0; at < len; at += 7) {
            char saved = text[at];
            text[at] = flips[at % sizeof flips];
            struct result r = load_bytes(text, len);
            ck_assert(r.rc == 0 || r.rc == -EINVAL);
            result_free(&r);
            text[at] = saved;
        }
        free(text);
    }
    unsetenv("CREDENTIALS_DIRECTORY");
}
END_TEST

/* ---- the example file --------------------------------------------------- */

START_TEST(test_example_loads)
{
    size_t len;
    char *text = example_text(&len);
    ck_assert_uint_gt(len, 0);
    /* every key of the table is in it */
    static const char *const keys[] = {
        "\nworker_id: 0\n",
        "\nblock_size: 16\n",
        "\nlora_salt: true\n",
        "\nforward_tiers: [device]\n",
        "\nsources:\n",
        "  - endpoint: \"tcp://127.0.0.1:5557\"\n",
        "    replay_endpoint: \"\"\n",
        "    topic: \"\"\n",
        "    mode: connect\n",
        "    dp_size: 1\n",
        "    dp_rank: 0\n",
        "    rcvhwm: 10000\n",
        "\nnats:\n",
        "  servers: [\"nats://127.0.0.1:4222\"]\n",
        "  credentials: \"\"\n",
        "  connect_timeout_ms: 0\n",
        "  reconnect_buffer_bytes: 16777216\n",
        "  jetstream:\n",
        "    enabled: false\n",
        "    stream: \"\"\n",
        "\nreplay:\n  # ",
        "  timeout_ms: 2000\n",
        "  listen: \"127.0.0.1:9464\"\n",
        "  level: info\n",
        "  dir: \"\"\n",
        "  max_depth: 16\n",
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        ck_assert_msg(strstr(text, keys[i]) != NULL, "missing %s", keys[i]);
    /* no line wider than 79 columns, no trailing blanks */
    for (const char *p = text; *p;) {
        const char *e = strchr(p, '\n');
        ck_assert(e != NULL);
        ck_assert_msg(e - p <= 79, "long line: %.*s", (int)(e - p), p);
        ck_assert_msg(e == p || e[-1] != ' ', "trailing blank: %.*s", (int)(e - p), p);
        p = e + 1;
    }

    struct result r = load_bytes(text, len);
    ck_assert_str_eq(r.errs, "");
    ck_assert_int_eq(r.rc, 0);
    ck_assert_uint_eq(r.cfg->worker_id, 0);
    ck_assert_uint_eq(r.cfg->block_size, 16);
    ck_assert_uint_eq(r.cfg->n_sources, 1);
    ck_assert_str_eq(r.cfg->sources[0].endpoint, "tcp://127.0.0.1:5557");
    assert_defaults(r.cfg);
    result_free(&r);
    free(text);
}
END_TEST

START_TEST(test_conf_file_is_example)
{
    size_t len, flen;
    char *text = example_text(&len);
    char *file = read_file("conf/kvbridge.yaml", &flen);
    if (flen != len || memcmp(file, text, len) != 0) {
        FILE *f = fopen("build/tests/kvbridge.yaml.example", "wb");
        if (f) {
            fwrite(text, 1, len, f);
            fclose(f);
        }
        ck_abort_msg("conf/kvbridge.yaml differs from kvb_config_write_example(); "
                     "its output is in build/tests/kvbridge.yaml.example");
    }
    free(file);
    free(text);
}
END_TEST

START_TEST(test_example_write_error)
{
    /* A stream that fails is reported. */
    FILE *f = fopen("/dev/full", "w");
    if (!f)
        return; /* no /dev/full here */
    setvbuf(f, NULL, _IONBF, 0);
    ck_assert_int_eq(kvb_config_write_example(f), -EIO);
    fclose(f);
    ck_assert_int_eq(kvb_config_write_example(NULL), -EINVAL);
}
END_TEST

/* ---- NATS authentication and TLS ----------------------------------------- */

static const char nats_base[] = "worker_id: 1\nblock_size: 16\n"
                                "sources: [{endpoint: 'inproc://x'}]\n";

/* The base (3 lines) plus EXTRA, from a file in /tmp. */
static struct result load_extra(const char *extra)
{
    size_t n = strlen(nats_base) + strlen(extra) + 1;
    char *text = malloc(n);
    ck_assert(text != NULL);
    snprintf(text, n, "%s%s", nats_base, extra);
    struct result r = load_text(text);
    free(text);
    return r;
}

/* A temporary file holding LEN bytes of TEXT; its name goes to path. */
static void temp_file(char path[32], const char *text, size_t len)
{
    strcpy(path, "/tmp/check_config.s.XXXXXX");
    int fd = mkstemp(path);
    ck_assert(fd >= 0);
    ck_assert_int_eq(write(fd, text, len), (ssize_t)len);
    close(fd);
}

START_TEST(test_auth_files)
{
    /* user + password_file (newline dropped), TLS on through a tls:// URL */
    struct result r = load(DATA "auth-user.yaml");
    ck_assert_str_eq(r.errs, "");
    ck_assert_int_eq(r.rc, 0);
    const struct kvb_config *c = r.cfg;
    ck_assert_str_eq(c->nats.user, "kvbridge");
    ck_assert_str_eq(c->nats.password, "s3cret-pw");
    ck_assert_str_eq(c->nats.password_file, DATA "secrets/password");
    ck_assert_str_eq(c->nats.token, "");
    ck_assert_str_eq(c->nats.nkey_seed, "");
    ck_assert_str_eq(c->nats.nkey_public, "");
    ck_assert_str_eq(c->nats.credentials, "");
    ck_assert(c->nats.tls.enabled);
    ck_assert_str_eq(c->nats.tls.ca, DATA "secrets/ca.pem");
    ck_assert_str_eq(c->nats.tls.cert, "");
    ck_assert(c->nats.tls.verify);
    ck_assert_str_eq(c->nats.tls.server_name, "nats.example");
    result_free(&r);

    /* token_file: CR LF dropped */
    r = load(DATA "auth-token.yaml");
    ck_assert_str_eq(r.errs, "");
    ck_assert_int_eq(r.rc, 0);
    ck_assert_str_eq(r.cfg->nats.token, "t0ken-value");
    ck_assert_str_eq(r.cfg->nats.token_file, DATA "secrets/token");
    ck_assert_str_eq(r.cfg->nats.user, "");
    ck_assert_str_eq(r.cfg->nats.password, "");
    ck_assert(!r.cfg->nats.tls.enabled);
    result_free(&r);

    /* nkey_seed_file: white space around the seed dropped, public key derived */
    r = load(DATA "auth-nkey.yaml");
    ck_assert_str_eq(r.errs, "");
    ck_assert_int_eq(r.rc, 0);
    ck_assert_str_eq(r.cfg->nats.nkey_seed,
                     "SUAJ2YNRTXX72WTAXKCEV5ES5QWMIRCJYVUXWMTJDFYDXLADDSXH6YALCA");
    ck_assert_str_eq(r.cfg->nats.nkey_public,
                     "UDLVVGABQKYQVN6VJP7NHSLEA45A5YLS6PNKMIZFV4BBU2HXA5IRUVAL");
    ck_assert_str_eq(r.cfg->nats.nkey_seed_file, DATA "secrets/nkey.seed");
    result_free(&r);
}
END_TEST

START_TEST(test_auth_inline)
{
    struct result r = load_extra("nats: {user: u, password: 'p w'}\n");
    ck_assert_str_eq(r.errs, "");
    ck_assert_int_eq(r.rc, 0);
    ck_assert_str_eq(r.cfg->nats.user, "u");
    ck_assert_str_eq(r.cfg->nats.password, "p w");
    ck_assert_str_eq(r.cfg->nats.password_file, "");
    result_free(&r);

    /* "" is no method: a token alone */
    r = load_extra("nats: {user: '', password: '', credentials: '', token: tok}\n");
    ck_assert_str_eq(r.errs, "");
    ck_assert_int_eq(r.rc, 0);
    ck_assert_str_eq(r.cfg->nats.token, "tok");
    result_free(&r);

    /* absolute file names are used as they are */
    char path[32];
    temp_file(path, " pw \r\n\n", 7);
    char text[160];
    snprintf(text, sizeof text, "nats: {user: u, password_file: '%s'}\n", path);
    r = load_extra(text);
    ck_assert_str_eq(r.errs, "");
    ck_assert_int_eq(r.rc, 0);
    ck_assert_str_eq(r.cfg->nats.password, " pw "); /* only line ends are dropped */
    ck_assert_str_eq(r.cfg->nats.password_file, path);
    result_free(&r);
    unlink(path);

    /* a user alone, a password alone */
    r = load_extra("nats: {user: u}\n");
    ck_assert_str_eq(r.errs, "T:4:14: nats.user: needs nats.password or "
                             "nats.password_file\n");
    result_free(&r);
    r = load_extra("nats: {password: x}\n");
    ck_assert_str_eq(r.errs, "T:4:18: nats.password: needs nats.user\n");
    result_free(&r);
}
END_TEST

/* Seeds and public keys made with Python's cryptography package (Ed25519)
 * and the NKey encoding; the first is RFC 8032 section 7.1 TEST 1. */
static const char *const nkey_vectors[][2] = {
    {"SUAJ2YNRTXX72WTAXKCEV5ES5QWMIRCJYVUXWMTJDFYDXLADDSXH6YALCA",
     "UDLVVGABQKYQVN6VJP7NHSLEA45A5YLS6PNKMIZFV4BBU2HXA5IRUVAL"},
    {"SUAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAEQ",
     "UA5WUJ54Z23KILLCUOUNAKTPBVZWKMQVO4O6EQ5GHLAERIMLLHNCTYM5"},
    {"SUAP777777777777777777777777777777777777777777777777775UUA",
     "UB3KCWJAISTOJ5IREZN4U45GATMQWBJJ2HPWAK7DBIM2SJLWMDI7LRYD"},
    {"SUAAOUYPDSKQ3UBNEZCPBE3N2FHDWDHW3J7SIH4JF74FTT6ES2VMZGUWQQ",
     "UCNPYG3OGJOVF3MZ6JYB4E2MOPV766WILGZP7VYTDA76NX7VJQCGQZ5U"},
    {"SUACY2BCRKR3ETAAB6RXNUSC7R633QXHMAGPTSNCMZVRGZIWXQM23ULET4",
     "UAY3VEKEPS7HO3BUJSRJQETLVB2YLLJSYDCURD76LBGKSIPOZWA5V2ZV"},
};

START_TEST(test_nkey_public)
{
    const char *seed = nkey_vectors[_i][0], *pub = nkey_vectors[_i][1];
    char text[160];
    snprintf(text, sizeof text, "nats: {nkey_seed: %s}\n", seed);
    struct result r = load_extra(text);
    ck_assert_str_eq(r.errs, "");
    ck_assert_int_eq(r.rc, 0);
    ck_assert_str_eq(r.cfg->nats.nkey_seed, seed);
    ck_assert_str_eq(r.cfg->nats.nkey_public, pub);
    result_free(&r);
}
END_TEST

static const struct bad_file bad_seeds[] = {
    {"SUAJ2YNRTXX72WTAXKCEV5ES5QWMIRCJYVUXWMTJDFYDXLADDSXH6YALC", "a seed has 58 characters"},
    {"SUAJ2YNRTXX72WTAXKCEV5ES5QWMIRCJYVUXWMTJDFYDXLADDSXH6YALCa",
     "a seed has only the characters A-Z and 2-7"},
    {"SUAJ2YNRTXX72WTAXKCEV5ES5QWMIRCJYVUXWMTJDFYDXLADDSXH6YAL1A",
     "a seed has only the characters A-Z and 2-7"},
    {"SUAJ2YNRTXY72WTAXKCEV5ES5QWMIRCJYVUXWMTJDFYDXLADDSXH6YALCA",
     "its checksum does not match (a character is wrong or missing)"},
    {"SAAJ2YNRTXX72WTAXKCEV5ES5QWMIRCJYVUXWMTJDFYDXLADDSXH6YHY3Q", /* an account seed */
     "it is not a user seed (those start with \"SU\")"},
    {"UDLVVGABQKYQVN6VJP7NHSLEA45A5YLS6PNKMIZFV4BBU2HXA5IRUVAL",
     "seeds start with \"SU\" (one starting with \"U\" is a public key, which cannot "
     "sign)"},
};

START_TEST(test_nkey_bad_seed)
{
    char text[160], want[256];
    snprintf(text, sizeof text, "nats: {nkey_seed: %s}\n", bad_seeds[_i].file);
    snprintf(want, sizeof want, "T:4:19: nats.nkey_seed: not an NKey user seed: %s\n",
             bad_seeds[_i].errs);
    struct result r = load_extra(text);
    ck_assert_int_eq(r.rc, -EINVAL);
    ck_assert_str_eq(r.errs, want);
    ck_assert(strstr(r.errs, bad_seeds[_i].file + 10) == NULL); /* never the seed */
    result_free(&r);
}
END_TEST

START_TEST(test_credentials_directory)
{
    char dir[PATH_MAX], text[PATH_MAX + 64], want[PATH_MAX + 64];
    ck_assert_ptr_nonnull(realpath(DATA "secrets", dir));
    setenv("CREDENTIALS_DIRECTORY", dir, 1);

    /* relative names are looked up there, not next to the config file */
    struct result r = load_extra("nats:\n  user: u\n  password_file: password\n"
                                 "  tls: {enabled: true, ca: ca.pem, cert: client.pem,\n"
                                 "        key: client-key.pem}\n");
    ck_assert_str_eq(r.errs, "");
    ck_assert_int_eq(r.rc, 0);
    ck_assert_str_eq(r.cfg->nats.password, "s3cret-pw");
    snprintf(want, sizeof want, "%s/password", dir);
    ck_assert_str_eq(r.cfg->nats.password_file, want);
    snprintf(want, sizeof want, "%s/client-key.pem", dir);
    ck_assert_str_eq(r.cfg->nats.tls.key, want);
    result_free(&r);

    /* a missing one says where it was looked for */
    r = load_extra("nats: {nkey_seed_file: missing.seed}\n");
    ck_assert_int_eq(r.rc, -EINVAL);
    replace_all(&r.errs, dir, "S");
    ck_assert_str_eq(r.errs, "T:4:24: nats.nkey_seed_file: cannot read 'S/missing.seed' "
                             "(in $CREDENTIALS_DIRECTORY): No such file or directory\n");
    result_free(&r);

    /* absolute names are not affected */
    r = load_extra("nats: {credentials: /nonexistent/x.creds}\n");
    ck_assert_str_eq(r.errs, "T:4:21: nats.credentials: cannot read '/nonexistent/x.creds': "
                             "No such file or directory\n");
    result_free(&r);

    /* a trailing '/' is not doubled */
    snprintf(text, sizeof text, "%s/", dir);
    setenv("CREDENTIALS_DIRECTORY", text, 1);
    r = load_extra("nats: {token_file: token}\n");
    ck_assert_str_eq(r.errs, "");
    snprintf(want, sizeof want, "%s/token", dir);
    ck_assert_str_eq(r.cfg->nats.token_file, want);
    ck_assert_str_eq(r.cfg->nats.token, "t0ken-value");
    result_free(&r);

    /* empty = unset: next to the config file (/tmp here) */
    setenv("CREDENTIALS_DIRECTORY", "", 1);
    r = load_extra("nats: {user: u, password_file: kvb-no-such-password}\n");
    ck_assert_str_eq(r.errs, "T:4:32: nats.password_file: cannot read "
                             "'/tmp/kvb-no-such-password': No such file or directory\n");
    result_free(&r);
    unsetenv("CREDENTIALS_DIRECTORY");
}
END_TEST

START_TEST(test_secret_file_limits)
{
    char path[32], text[160];
    size_t cap = 65537;
    char *big = malloc(cap);
    ck_assert(big != NULL);
    memset(big, 'x', cap);

    /* 65536 bytes: read whole */
    temp_file(path, big, 65536);
    snprintf(text, sizeof text, "nats: {token_file: '%s'}\n", path);
    struct result r = load_extra(text);
    ck_assert_str_eq(r.errs, "");
    ck_assert_uint_eq(strlen(r.cfg->nats.token), 65536);
    result_free(&r);
    unlink(path);

    /* one byte more, even a line end: refused, not cut */
    big[65536] = '\n';
    temp_file(path, big, 65537);
    snprintf(text, sizeof text, "nats: {token_file: '%s'}\n", path);
    r = load_extra(text);
    ck_assert_int_eq(r.rc, -EINVAL);
    char want[160];
    snprintf(want, sizeof want,
             "T:4:20: nats.token_file: cannot use '%s': it is larger "
             "than 65536 bytes\n",
             path);
    ck_assert_str_eq(r.errs, want);
    result_free(&r);
    unlink(path);
    free(big);

    /* a directory */
    r = load_extra("nats: {token_file: /tmp}\n");
    ck_assert_str_eq(r.errs, "T:4:20: nats.token_file: '/tmp' is not a regular file\n");
    result_free(&r);
}
END_TEST

START_TEST(test_secrets_not_shown)
{
    /* errors about keys holding secrets never quote them */
    struct result r = load_extra("nats: {password: hunter2-secret, token: tok-secret-2}\n");
    ck_assert_int_eq(r.rc, -EINVAL);
    ck_assert_str_eq(r.errs, "T:4:41: nats.token: only one authentication method may be "
                             "set, and nats.password (at 4:18) is set already\n"
                             "T:4:18: nats.password: needs nats.user\n");
    result_free(&r);
    r = load_extra("nats: {user: u, password: \"hunter2\\0x\"}\n");
    ck_assert_str_eq(r.errs, "T:4:27: nats.password: the string contains a NUL "
                             "character\n");
    result_free(&r);

    /* a seed file that holds something else: its content is not shown */
    setenv("CREDENTIALS_DIRECTORY", DATA "secrets", 1);
    r = load_extra("nats: {nkey_seed_file: password}\n");
    unsetenv("CREDENTIALS_DIRECTORY");
    ck_assert_str_eq(r.errs, "T:4:24: nats.nkey_seed_file: '" DATA "secrets/password' does "
                             "not hold an NKey user seed: seeds start with \"SU\" (one "
                             "starting with \"U\" is a public key, which cannot sign)\n");
    ck_assert(strstr(r.errs, "s3cret") == NULL);
    result_free(&r);

    /* the example has no values for them */
    size_t len;
    char *text = example_text(&len);
    ck_assert(strstr(text, "\n  password: \"\"\n") != NULL);
    ck_assert(strstr(text, "\n  token: \"\"\n") != NULL);
    ck_assert(strstr(text, "\n  nkey_seed: \"\"\n") != NULL);
    free(text);
}
END_TEST

START_TEST(test_nats_equal)
{
    struct result a = load_extra("nats: {user: u, password: p1}\n");
    struct result same = load_extra("nats: {user: u, password: p1}\nlog: {level: debug}\n");
    struct result pw = load_extra("nats: {user: u, password: p2}\n");
    struct result tls = load_extra("nats: {user: u, password: p1, tls: {enabled: true}}\n");
    struct result tok = load_extra("nats: {token: p1}\n");
    ck_assert_int_eq(a.rc, 0);
    ck_assert_int_eq(same.rc, 0);
    ck_assert_int_eq(pw.rc, 0);
    ck_assert_int_eq(tls.rc, 0);
    ck_assert_int_eq(tok.rc, 0);
    ck_assert(kvb_config_nats_equal(a.cfg, same.cfg));
    ck_assert(!kvb_config_nats_equal(a.cfg, pw.cfg));
    ck_assert(!kvb_config_nats_equal(a.cfg, tls.cfg));
    ck_assert(!kvb_config_nats_equal(a.cfg, tok.cfg));
    ck_assert(kvb_config_nats_equal(NULL, NULL));
    ck_assert(!kvb_config_nats_equal(a.cfg, NULL));
    /* all of them reload without a restart */
    ck_assert_int_eq(kvb_config_check_reload(a.cfg, pw.cfg, NULL), 0);
    ck_assert_int_eq(kvb_config_check_reload(a.cfg, tls.cfg, NULL), 0);
    ck_assert_int_eq(kvb_config_check_reload(a.cfg, tok.cfg, NULL), 0);
    result_free(&a);
    result_free(&same);
    result_free(&pw);
    result_free(&tls);
    result_free(&tok);
}
END_TEST

/* ---- ZMQ CURVE (sources[].curve) ----------------------------------------- */

/* One source (SRC: its YAML lines, from line 4) after worker_id and
 * block_size; files named "%K" (the secret key file) and "%A" (the allowed
 * clients file) in SRC are replaced by temporary files holding KEY and ALLOW
 * (NULL: no such file), named "K" and "A" in r.errs. */
static struct result curve_load(const char *src, const char *key, const char *allow)
{
    char kp[32] = "", ap[32] = "";
    if (key)
        temp_file(kp, key, strlen(key));
    if (allow)
        temp_file(ap, allow, strlen(allow));
    size_t n = strlen(src) + 128;
    char *text = malloc(n), *w = text;
    ck_assert(text != NULL);
    w += sprintf(w, "worker_id: 1\nblock_size: 16\nsources:\n");
    for (const char *p = src; *p; p++) {
        if (p[0] == '%' && (p[1] == 'K' || p[1] == 'A')) {
            w += sprintf(w, "%s", p[1] == 'K' ? kp : ap);
            p++;
        } else {
            *w++ = *p;
        }
    }
    *w = '\0';
    struct result r = load_text(text);
    free(text);
    if (kp[0]) {
        replace_all(&r.errs, kp, "K");
        unlink(kp);
    }
    if (ap[0]) {
        replace_all(&r.errs, ap, "A");
        unlink(ap);
    }
    return r;
}

START_TEST(test_curve_keys)
{
    /* bind mode: the secret key (comments, white space), the allowed keys */
    struct result r = curve_load("- endpoint: 'tcp://127.0.0.1:1'\n  mode: bind\n"
                                 "  curve: {secret_key_file: '%K', allowed_clients_file: '%A'}\n",
                                 "\n# key\n  " CURVE_SERVER_SECRET " \r\n\n",
                                 CURVE_CLIENT_PUBLIC "\n#" CURVE_SERVER_PUBLIC "\n");
    ck_assert_str_eq(r.errs, "");
    ck_assert_int_eq(r.rc, 0);
    const struct kvb_curve_cfg *cv = &r.cfg->sources[0].curve;
    ck_assert(cv->enabled);
    assert_curve_key(cv->secret_key, CURVE_SERVER_SECRET);
    ck_assert_uint_eq(cv->n_allowed, 1); /* the second line is a comment */
    assert_curve_key(cv->allowed[0], CURVE_CLIENT_PUBLIC);
    result_free(&r);

    /* bind mode without an allowed_clients_file: any client */
    r = curve_load("- {endpoint: 'ipc:///tmp/x', mode: bind, curve: {secret_key_file: '%K'}}\n",
                   CURVE_SERVER_SECRET, NULL);
    ck_assert_str_eq(r.errs, "");
    ck_assert(r.cfg->sources[0].curve.enabled);
    ck_assert_uint_eq(r.cfg->sources[0].curve.n_allowed, 0);
    ck_assert_ptr_null(r.cfg->sources[0].curve.allowed);
    result_free(&r);

    /* connect mode */
    r = curve_load("- endpoint: 'tcp://127.0.0.1:1'\n  curve:\n    secret_key_file: '%K'\n"
                   "    server_public_key: '" CURVE_SERVER_PUBLIC "'\n",
                   CURVE_CLIENT_SECRET, NULL);
    ck_assert_str_eq(r.errs, "");
    cv = &r.cfg->sources[0].curve;
    assert_curve_key(cv->secret_key, CURVE_CLIENT_SECRET);
    assert_curve_key(cv->server_key, CURVE_SERVER_PUBLIC);
    result_free(&r);
}
END_TEST

/* Inline cases for curve_load(): source lines, secret key file, allowed
 * clients file, expected errors. */
static const struct {
    const char *src, *key, *allow, *errs;
} bad_curve[] = {
    /* not Z85, or not 32 bytes */
    {"- {endpoint: 'tcp://h:1', mode: bind, curve: {secret_key_file: '%K'}}\n",
     "# k\n" CURVE_SERVER_SECRET "x\n", NULL,
     "T:4:64: sources[0].curve.secret_key_file: 'K' does not hold a CURVE secret key: "
     "line 2 is not 40 Z85 characters\n"},
    {"- {endpoint: 'tcp://h:1', mode: bind, curve: {secret_key_file: '%K'}}\n",
     "JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh\"", NULL,
     "T:4:64: sources[0].curve.secret_key_file: 'K' does not hold a CURVE secret key: "
     "line 1 is not 40 Z85 characters\n"},
    {"- {endpoint: 'tcp://h:1', mode: bind, curve: {secret_key_file: '%K'}}\n",
     CURVE_SERVER_SECRET "\n" CURVE_CLIENT_SECRET "\n", NULL,
     "T:4:64: sources[0].curve.secret_key_file: 'K' does not hold a CURVE secret key: "
     "holds more than one line besides # comments\n"},
    {"- {endpoint: 'tcp://h:1', mode: bind, curve: {secret_key_file: '%K'}}\n", "# nothing\n\n",
     NULL,
     "T:4:64: sources[0].curve.secret_key_file: 'K' does not hold a CURVE secret key: "
     "holds no key (only blank lines or # comments)\n"},
    {"- {endpoint: 'tcp://h:1', mode: bind, curve: {secret_key_file: '%K'}}\n", "\n\n", NULL,
     "T:4:64: sources[0].curve.secret_key_file: cannot use 'K': it is empty\n"},
    {"- {endpoint: 'tcp://h:1', mode: bind, curve: {secret_key_file: /nonexistent/k}}\n", NULL,
     NULL,
     "T:4:64: sources[0].curve.secret_key_file: cannot read '/nonexistent/k': No such file "
     "or directory\n"},
    {"- endpoint: 'tcp://h:1'\n  curve:\n    secret_key_file: '%K'\n"
     "    server_public_key: 'rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf'\n",
     CURVE_CLIENT_SECRET, NULL,
     "T:7:24: sources[0].curve.server_public_key: not a CURVE public key (40 Z85 "
     "characters)\n"},
    {"- endpoint: 'tcp://h:1'\n  curve:\n    secret_key_file: '%K'\n"
     "    server_public_key: '#q:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7'\n",
     CURVE_CLIENT_SECRET, NULL,
     "T:7:24: sources[0].curve.server_public_key: not a CURVE public key (40 Z85 "
     "characters)\n"},
    {"- {endpoint: 'tcp://h:1', mode: bind, curve: {secret_key_file: '%K',\n"
     "   allowed_clients_file: '%A'}}\n",
     CURVE_SERVER_SECRET,
     "# engines\n" CURVE_CLIENT_PUBLIC "\n\n" CURVE_CLIENT_PUBLIC "=\n"
     "abc\n",
     "T:5:26: sources[0].curve.allowed_clients_file: 'A' line 4: not a CURVE public key (40 "
     "Z85 characters)\n"
     "T:5:26: sources[0].curve.allowed_clients_file: 'A' line 5: not a CURVE public key (40 "
     "Z85 characters)\n"},
    {"- {endpoint: 'tcp://h:1', mode: bind, curve: {secret_key_file: '%K',\n"
     "   allowed_clients_file: '%A'}}\n",
     CURVE_SERVER_SECRET, "# nobody yet\n",
     "T:5:26: sources[0].curve.allowed_clients_file: 'A' lists no key (\"\" allows any "
     "client)\n"},
    /* keys of the other mode, keys without a secret key, no server key */
    {"- endpoint: 'tcp://h:1'\n  mode: bind\n  curve:\n    secret_key_file: '%K'\n"
     "    server_public_key: '" CURVE_SERVER_PUBLIC "'\n",
     CURVE_SERVER_SECRET, NULL,
     "T:8:24: sources[0].curve.server_public_key: only for mode: connect (engines connect "
     "to a bind-mode source with its public key)\n"},
    {"- endpoint: 'tcp://h:1'\n  curve:\n    secret_key_file: '%K'\n"
     "    server_public_key: '" CURVE_SERVER_PUBLIC "'\n    allowed_clients_file: '%A'\n",
     CURVE_CLIENT_SECRET, CURVE_CLIENT_PUBLIC,
     "T:8:27: sources[0].curve.allowed_clients_file: only for mode: bind\n"},
    {"- endpoint: 'tcp://h:1'\n  curve:\n    secret_key_file: '%K'\n", CURVE_CLIENT_SECRET, NULL,
     "T:6:22: sources[0].curve.secret_key_file: mode connect needs "
     "sources[0].curve.server_public_key (the engine's public key) too\n"},
    {"- endpoint: 'tcp://h:1'\n- endpoint: 'tcp://h:2'\n  curve:\n"
     "    server_public_key: '" CURVE_SERVER_PUBLIC "'\n",
     NULL, NULL,
     "T:7:24: sources[1].curve.server_public_key: needs sources[1].curve.secret_key_file "
     "(CURVE is off without it)\n"},
    {"- {endpoint: 'tcp://h:1', mode: bind, curve: {secret_key_file: '',\n"
     "   allowed_clients_file: '%A'}}\n",
     NULL, CURVE_CLIENT_PUBLIC,
     "T:5:26: sources[0].curve.allowed_clients_file: needs "
     "sources[0].curve.secret_key_file (CURVE is off without it)\n"},
    /* no CURVE on inproc:// (libzmq has no security mechanism there) */
    {"- {endpoint: 'inproc://e', mode: bind, curve: {secret_key_file: '%K'}}\n",
     CURVE_SERVER_SECRET, NULL,
     "T:4:65: sources[0].curve.secret_key_file: ZMQ has no CURVE on inproc:// endpoints "
     "(use ipc:// or tcp://)\n"},
    /* the rest of the source is still checked */
    {"- {endpoint: 'tcp://h:1', mode: bond, curve: {x: 1, secret_key_file: '%K'}}\n",
     CURVE_SERVER_SECRET, NULL,
     "T:4:33: sources[0].mode: 'bond' is not one of connect or bind\n"
     "T:4:47: unknown key 'sources[0].curve.x'\n"},
};

START_TEST(test_curve_bad)
{
    struct result r = curve_load(bad_curve[_i].src, bad_curve[_i].key, bad_curve[_i].allow);
    ck_assert_msg(r.rc == -EINVAL, "case %d: rc %d", _i, r.rc);
    ck_assert_str_eq(r.errs, bad_curve[_i].errs);
    /* never a secret key */
    ck_assert(strstr(r.errs, CURVE_SERVER_SECRET) == NULL);
    ck_assert(strstr(r.errs, CURVE_CLIENT_SECRET) == NULL);
    result_free(&r);
}
END_TEST

static void rewrite(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert(f != NULL);
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
}

/* A bind-mode CURVE source with these files ("" = not set). */
static struct kvb_config *curve_cfg(const char *key, const char *allow)
{
    char text[256];
    snprintf(text, sizeof text,
             "worker_id: 1\nblock_size: 16\nsources: [{endpoint: "
             "'tcp://h:1', mode: bind,\n curve: {secret_key_file: '%s', "
             "allowed_clients_file: '%s'}}]\n",
             key, allow);
    struct result r = load_text(text);
    ck_assert_str_eq(r.errs, "");
    free(r.errs);
    return r.cfg;
}

START_TEST(test_curve_source_equal)
{
    /* SIGHUP reopens a source when its keys changed, even in files of the
     * same name */
    char kp[32], ap[32];
    temp_file(kp, CURVE_SERVER_SECRET, 40);
    temp_file(ap, CURVE_CLIENT_PUBLIC, 40);
    struct kvb_config *a = curve_cfg(kp, ap), *b = curve_cfg(kp, ap);
    ck_assert(kvb_config_source_equal(&a->sources[0], &b->sources[0]));
    ck_assert(kvb_config_source_equal(NULL, NULL));
    ck_assert(!kvb_config_source_equal(&a->sources[0], NULL));
    kvb_config_free(&b);

    rewrite(ap, CURVE_CLIENT_PUBLIC "\n" CURVE_SERVER_PUBLIC "\n"); /* one key more */
    b = curve_cfg(kp, ap);
    ck_assert(!kvb_config_source_equal(&a->sources[0], &b->sources[0]));
    kvb_config_free(&b);
    rewrite(ap, CURVE_SERVER_PUBLIC "\n"); /* another key */
    b = curve_cfg(kp, ap);
    ck_assert(!kvb_config_source_equal(&a->sources[0], &b->sources[0]));
    kvb_config_free(&b);
    rewrite(ap, CURVE_CLIENT_PUBLIC "\n");
    rewrite(kp, CURVE_CLIENT_SECRET "\n"); /* another secret key */
    b = curve_cfg(kp, ap);
    ck_assert(!kvb_config_source_equal(&a->sources[0], &b->sources[0]));
    kvb_config_free(&b);
    rewrite(kp, CURVE_SERVER_SECRET "\n"); /* back: equal again */
    b = curve_cfg(kp, ap);
    ck_assert(kvb_config_source_equal(&a->sources[0], &b->sources[0]));
    kvb_config_free(&b);
    b = curve_cfg("", ""); /* CURVE off */
    ck_assert(!kvb_config_source_equal(&a->sources[0], &b->sources[0]));
    /* every reload of them is allowed */
    ck_assert_int_eq(kvb_config_check_reload(a, b, NULL), 0);
    kvb_config_free(&b);
    kvb_config_free(&a);
    unlink(kp);
    unlink(ap);
}
END_TEST

/* ---- reload ------------------------------------------------------------- */

static const char reload_base[] = "worker_id: 1\nblock_size: 16\n"
                                  "sources: [{endpoint: 'tcp://h:1'}]\n";

static struct kvb_config *load_ok(const char *extra)
{
    size_t n = strlen(reload_base) + strlen(extra) + 1;
    char *text = malloc(n);
    ck_assert(text != NULL);
    snprintf(text, n, "%s%s", reload_base, extra);
    struct result r = load_text(text);
    free(text);
    ck_assert_str_eq(r.errs, "");
    ck_assert_int_eq(r.rc, 0);
    free(r.errs);
    return r.cfg;
}

static int reload(const struct kvb_config *a, const struct kvb_config *b, char **errs)
{
    size_t len;
    FILE *f = open_memstream(errs, &len);
    ck_assert(f != NULL);
    int rc = kvb_config_check_reload(a, b, f);
    fclose(f);
    return rc;
}

START_TEST(test_check_reload)
{
    char *errs = NULL;
    struct kvb_config *a = load_ok("state: {dir: /a}\n");
    struct kvb_config *same = load_ok("state: {dir: /a}\n");

    /* reloadable: block_size, sources, servers, log level, limits */
    struct kvb_config *b = load_ok("state: {dir: /a}\nlog: {level: debug}\n"
                                   "nats: {servers: [x, y]}\nlimits: {max_depth: 3}\n");
    ck_assert_int_eq(reload(a, same, &errs), 0);
    ck_assert_str_eq(errs, "");
    free(errs);
    ck_assert_int_eq(reload(a, b, &errs), 0);
    ck_assert_str_eq(errs, "");
    free(errs);
    kvb_config_free(&b);

    /* not reloadable: state.dir, metrics.listen, nats.jetstream.* */
    b = load_ok("state: {dir: /b}\n");
    ck_assert_int_eq(reload(a, b, &errs), -EINVAL);
    char want[256];
    snprintf(want, sizeof want, "%s: 'state.dir' changed: it needs a restart to take effect\n",
             b->path);
    ck_assert_str_eq(errs, want);
    free(errs);
    kvb_config_free(&b);

    b = load_ok("state: {dir: /a}\nmetrics: {listen: ''}\n"
                "nats: {jetstream: {enabled: true, stream: s}}\n");
    ck_assert_int_eq(reload(a, b, &errs), -EINVAL);
    ck_assert(strstr(errs, "'nats.jetstream.enabled' changed"));
    ck_assert(strstr(errs, "'nats.jetstream.stream' changed"));
    ck_assert(strstr(errs, "'metrics.listen' changed"));
    free(errs);
    ck_assert_int_eq(kvb_config_check_reload(a, b, NULL), -EINVAL);
    ck_assert_int_eq(kvb_config_check_reload(NULL, b, NULL), -EINVAL);
    kvb_config_free(&b);

    kvb_config_free(&same);
    kvb_config_free(&a);
}
END_TEST

START_TEST(test_jetstream_names)
{
    /* placeholders in the stream and the subject, every key set (worker_id 1) */
    struct kvb_config *c =
        load_ok("nats:\n  namespace: prod\n  component: vllm\n  jetstream:\n"
                "    enabled: true\n    stream: 'kv-{namespace}-{component}-{worker_id}'\n"
                "    subject: 'kv.{namespace}.{worker_id}'\n    create: false\n"
                "    retention: workqueue\n    max_age_s: 0\n    replicas: 3\n"
                "    duplicate_window_s: 600\n    max_pending: 16\n    ack_timeout_ms: 100\n");
    ck_assert(c->nats.jetstream.enabled);
    ck_assert_str_eq(c->nats.jetstream.stream_name, "kv-prod-vllm-1");
    ck_assert_str_eq(c->nats.jetstream.subject_name, "kv.prod.1");
    ck_assert(!c->nats.jetstream.create);
    ck_assert_int_eq(c->nats.jetstream.retention, KVB_JS_WORKQUEUE);
    ck_assert_uint_eq(c->nats.jetstream.max_age_s, 0); /* unlimited: any window */
    ck_assert_uint_eq(c->nats.jetstream.replicas, 3);
    ck_assert_uint_eq(c->nats.jetstream.duplicate_window_s, 600);
    ck_assert_uint_eq(c->nats.jetstream.max_pending, 16);
    ck_assert_uint_eq(c->nats.jetstream.ack_timeout_ms, 100);
    kvb_config_free(&c);
    /* the default stream follows namespace and component; the subject follows it */
    c = load_ok("nats: {namespace: ns, component: comp, jetstream: {enabled: true}}\n");
    ck_assert_str_eq(c->nats.jetstream.stream_name, "namespace-ns-component-comp-kv-events");
    ck_assert_str_eq(c->nats.jetstream.subject_name, "namespace-ns-component-comp-kv-events.queue");
    kvb_config_free(&c);
    /* disabled: nothing checked (a namespace with a dot is fine for core NATS) */
    c = load_ok("nats: {namespace: a.b, jetstream: {max_age_s: 1}}\n");
    ck_assert(!c->nats.jetstream.enabled);
    ck_assert_str_eq(c->nats.jetstream.stream_name, "namespace-a.b-component-backend-kv-events");
    kvb_config_free(&c);
}
END_TEST

START_TEST(test_jetstream_reload)
{
    /* With JetStream on, a reload that would move the stream or the subject
     * (through nats.namespace, nats.component or worker_id) needs a restart;
     * without, namespace reloads as before. */
    char *errs = NULL;
    struct kvb_config *a = load_ok("nats: {jetstream: {enabled: true}}\n");
    struct kvb_config *b = load_ok("nats: {namespace: other, jetstream: {enabled: true}}\n");
    ck_assert_int_eq(reload(a, b, &errs), -EINVAL);
    ck_assert_msg(strstr(errs, "the JetStream stream would change from "
                               "'namespace-dynamo-component-backend-kv-events' to "
                               "'namespace-other-component-backend-kv-events'"),
                  "%s", errs);
    ck_assert(strstr(errs, "the JetStream subject would change"));
    free(errs);
    kvb_config_free(&b);
    /* a fixed stream and subject: namespace may change */
    kvb_config_free(&a);
    a = load_ok("nats: {jetstream: {enabled: true, stream: s, subject: x.y}}\n");
    b = load_ok("nats: {namespace: other, jetstream: {enabled: true, stream: s, subject: x.y}}\n");
    ck_assert_int_eq(reload(a, b, &errs), 0);
    ck_assert_str_eq(errs, "");
    free(errs);
    kvb_config_free(&b);
    /* the new keys need a restart */
    b = load_ok("nats: {jetstream: {enabled: true, stream: s, subject: x.y, max_pending: 100}}\n");
    ck_assert_int_eq(reload(a, b, &errs), -EINVAL);
    ck_assert(strstr(errs, "'nats.jetstream.max_pending' changed"));
    free(errs);
    kvb_config_free(&b);
    /* the stream key itself: reported once, as the key */
    b = load_ok("nats: {jetstream: {enabled: true, stream: t, subject: x.y}}\n");
    ck_assert_int_eq(reload(a, b, &errs), -EINVAL);
    char want[256];
    snprintf(want, sizeof want,
             "%s: 'nats.jetstream.stream' changed: it needs a restart to take effect\n", b->path);
    ck_assert_str_eq(errs, want);
    free(errs);
    kvb_config_free(&b);
    kvb_config_free(&a);
    /* core NATS: namespace reloads */
    a = load_ok("");
    b = load_ok("nats: {namespace: other}\n");
    ck_assert_int_eq(reload(a, b, &errs), 0);
    free(errs);
    kvb_config_free(&b);
    kvb_config_free(&a);
}
END_TEST

START_TEST(test_block_size_reload_from_files)
{
    /* The same check with two real files differing only in block_size. */
    char *errs = NULL;
    struct result a = load_text("worker_id: 1\nblock_size: 16\n"
                                "sources: [{endpoint: 'inproc://x'}]\n");
    struct result b = load_text("worker_id: 1\nblock_size: auto\n"
                                "sources: [{endpoint: 'inproc://x'}]\n");
    ck_assert_int_eq(a.rc, 0);
    ck_assert_int_eq(b.rc, 0);
    ck_assert_int_eq(reload(a.cfg, b.cfg, &errs), 0);
    free(errs);
    result_free(&a);
    result_free(&b);
}
END_TEST

START_TEST(test_free_null)
{
    kvb_config_free(NULL);
    struct kvb_config *c = NULL;
    kvb_config_free(&c);
    ck_assert(c == NULL);
    ck_assert_int_eq(kvb_config_load(DATA "minimal.yaml", &c, NULL), 0);
    kvb_config_free(&c);
    ck_assert(c == NULL);
}
END_TEST

/* ---- ${VAR} in values ---------------------------------------------------- */

START_TEST(test_env_expand)
{
    setenv("KVB_T_ID", "12345", 1);
    setenv("KVB_T_PORT", "5557", 1);
    setenv("KVB_T_EMPTY", "", 1);
    setenv("KVB_T_TIER", "disk", 1);
    unsetenv("KVB_T_UNSET");
    /* set, default (unset and empty), $$, inside lists and maps, in quotes */
    struct result r =
        load_text("worker_id: ${KVB_T_ID}\nblock_size: ${KVB_T_UNSET:-32}\n"
                  "forward_tiers: [device, '${KVB_T_TIER}']\n"
                  "sources:\n  - endpoint: \"tcp://127.0.0.1:${KVB_T_PORT}\"\n"
                  "    topic: ${KVB_T_EMPTY:-kv}\n"
                  "    replay_endpoint: ${KVB_T_EMPTY}\n"
                  "nats:\n  servers: [\"nats://h:${KVB_T_UNSET:-4223}\", nats://u:p$$w@b:1]\n"
                  "  namespace: ns$${KVB_T_ID}$x\n");
    ck_assert_str_eq(r.errs, "");
    ck_assert_int_eq(r.rc, 0);
    ck_assert_uint_eq(r.cfg->worker_id, 12345);
    ck_assert_uint_eq(r.cfg->block_size, 32);
    ck_assert_uint_eq(r.cfg->forward_tiers, (1u << KVB_TIER_DEVICE) | (1u << KVB_TIER_DISK));
    ck_assert_str_eq(r.cfg->sources[0].endpoint, "tcp://127.0.0.1:5557");
    ck_assert_str_eq(r.cfg->sources[0].topic, "kv");
    ck_assert_str_eq(r.cfg->sources[0].replay_endpoint, ""); /* "", not a missing value */
    ck_assert_str_eq(r.cfg->nats.servers[0], "nats://h:4223");
    ck_assert_str_eq(r.cfg->nats.servers[1], "nats://u:p$w@b:1");
    ck_assert_str_eq(r.cfg->nats.namespace_, "ns${KVB_T_ID}$x");
    result_free(&r);

    /* unset without a default: FILE:LINE:COL and the name; the other values
     * are still checked */
    r = load_text("worker_id: 1\nblock_size: 16\n"
                  "sources: [{endpoint: 'tcp://h:${KVB_T_UNSET}'}]\n"
                  "nats: {servers: [a, '${KVB_T_UNSET2}'], subject: '${KVB_T_EMPTY'}\n");
    ck_assert_int_eq(r.rc, -EINVAL);
    ck_assert_str_eq(r.errs, "T:3:22: environment variable KVB_T_UNSET is not set "
                             "(${KVB_T_UNSET:-default} gives a default)\n"
                             "T:4:21: environment variable KVB_T_UNSET2 is not set "
                             "(${KVB_T_UNSET2:-default} gives a default)\n"
                             "T:4:50: '${' without a valid ${NAME} or ${NAME:-default} (write $$ "
                             "for a literal $)\n");
    result_free(&r);

    /* keys are taken as written */
    r = load_text("worker_id: 1\nblock_size: 16\nsources: [{endpoint: 'inproc://x'}]\n"
                  "${KVB_T_ID}: 1\n");
    ck_assert_str_eq(r.errs, "T:4:1: unknown key '${KVB_T_ID}'\n");
    result_free(&r);
    unsetenv("KVB_T_ID");
    unsetenv("KVB_T_PORT");
    unsetenv("KVB_T_EMPTY");
    unsetenv("KVB_T_TIER");
}
END_TEST

/* ---- worker_id_file ------------------------------------------------------ */

START_TEST(test_worker_id_file)
{
    char path[32], text[200], want[300];
    temp_file(path, " 18446744073709551615\n\n", 23);
    snprintf(text, sizeof text,
             "worker_id_file: '%s'\nblock_size: 16\nsources: [{endpoint: 'inproc://x'}]\n", path);
    struct result r = load_text(text);
    ck_assert_str_eq(r.errs, "");
    ck_assert_uint_eq(r.cfg->worker_id, UINT64_MAX);
    ck_assert_str_eq(r.cfg->worker_id_file, path);
    result_free(&r);

    /* both */
    snprintf(text, sizeof text,
             "worker_id: 3\nblock_size: 16\nsources: [{endpoint: 'inproc://x'}]\n"
             "worker_id_file: '%s'\n",
             path);
    r = load_text(text);
    ck_assert_int_eq(r.rc, -EINVAL);
    ck_assert_str_eq(r.errs, "T:4:17: worker_id_file: worker_id is set too (at 1:12): use one "
                             "of them\n");
    result_free(&r);
    unlink(path);

    /* bad content names the file */
    temp_file(path, "12x\n", 4);
    snprintf(text, sizeof text,
             "worker_id_file: '%s'\nblock_size: 16\nsources: [{endpoint: 'inproc://x'}]\n", path);
    r = load_text(text);
    ck_assert_int_eq(r.rc, -EINVAL);
    snprintf(want, sizeof want,
             "T:1:17: worker_id_file: '%s' does not hold a worker id: its "
             "content is not a decimal integer (expected an unsigned 64-bit decimal "
             "integer)\n",
             path);
    ck_assert_str_eq(r.errs, want);
    result_free(&r);
    unlink(path);

    /* missing file */
    r = load_text("worker_id_file: /nonexistent/id\nblock_size: 16\n"
                  "sources: [{endpoint: 'inproc://x'}]\n");
    ck_assert_str_eq(r.errs, "T:1:17: worker_id_file: cannot read '/nonexistent/id': No such "
                             "file or directory\n");
    result_free(&r);

    /* neither (worker_id_file: "" is none) */
    r = load_text("worker_id_file: ''\nblock_size: 16\nsources: [{endpoint: 'inproc://x'}]\n");
    ck_assert_str_eq(r.errs, "T:1:1: missing required key 'worker_id'\n");
    result_free(&r);
}
END_TEST

/* ---- what --check refuses because it would fail at run time ------------ */

static const struct bad_file runtime_bad[] = {
    /* tcp:// ports: not a number, too large, 0, none; replay too */
    {"worker_id: 1\nblock_size: 16\nsources:\n"
     "  - {endpoint: 'tcp://h:x'}\n  - {endpoint: 'tcp://h:65536'}\n"
     "  - {endpoint: 'tcp://h:0'}\n  - {endpoint: 'tcp://h', replay_endpoint: 'tcp://h:*'}\n"
     "  - {endpoint: 'tcp://h:*'}\n",
     "T:4:16: sources[0].endpoint: 'tcp://h:x' needs a port in 1..65535 (tcp://HOST:PORT)\n"
     "T:5:16: sources[1].endpoint: 'tcp://h:65536' needs a port in 1..65535 "
     "(tcp://HOST:PORT)\n"
     "T:6:16: sources[2].endpoint: 'tcp://h:0' needs a port in 1..65535 (tcp://HOST:PORT)\n"
     "T:7:16: sources[3].endpoint: 'tcp://h' needs a port in 1..65535 (tcp://HOST:PORT)\n"
     "T:7:44: sources[3].replay_endpoint: 'tcp://h:*' needs a port in 1..65535 "
     "(tcp://HOST:PORT)\n"
     "T:8:16: sources[4].endpoint: 'tcp://h:*' needs a port in 1..65535 (tcp://HOST:PORT)\n"},
    /* NATS URLs (never quoted: they may hold a password) and metrics.listen */
    {"worker_id: 1\nblock_size: 16\nsources: [{endpoint: 'inproc://x'}]\n"
     "nats: {servers: ['nats://u:pw@h:99999', 'tls://[::1', 'nats://[::1]:0', h:4x]}\n"
     "metrics: {listen: '127.0.0.1:0'}\n",
     "T:4:18: nats.servers[0]: the port is not a number in 1..65535\n"
     "T:4:41: nats.servers[1]: the IPv6 address in brackets is not valid\n"
     "T:4:55: nats.servers[2]: the port is not a number in 1..65535\n"
     "T:4:73: nats.servers[3]: the port is not a number in 1..65535\n"
     "T:5:19: metrics.listen: '127.0.0.1:0': port 0 is not a port to scrape (expected "
     "1..65535)\n"},
    /* what libcurl's URL parser refuses in a NATS URL: no host, a host that is
     * not one, white space, user information that is not valid */
    {"worker_id: 1\nblock_size: 16\nsources: [{endpoint: 'inproc://x'}]\n"
     "nats:\n  servers: ['nats://:4222', 'nats://a$$b:1', 'nats://h /x', 'nats://u:p w@h']\n",
     "T:5:13: nats.servers[0]: there is no host\n"
     "T:5:29: nats.servers[1]: the host is not a host name or an IP address\n"
     "T:5:46: nats.servers[2]: the host is not a host name or an IP address\n"
     "T:5:61: nats.servers[3]: the user information (before '@') is not valid\n"},
    {"worker_id: 1\nblock_size: 16\nsources: [{endpoint: 'inproc://x'}]\n"
     "metrics: {listen: 'localhost:9464'}\n",
     "T:4:19: metrics.listen: 'localhost:9464': the host must be a numeric IPv4 or IPv6 "
     "address\n"},
    /* more sockets than ZMQ's default limit: 2 x (511 SUB + 511 DEALER) + ZAP */
    {"worker_id: 1\nblock_size: 16\nsources:\n"
     "  - {endpoint: 'tcp://h:1000', replay_endpoint: 'tcp://h:2000', dp_size: 511}\n"
     "  - {endpoint: 'tcp://h:3000', dp_size: 2}\n",
     "T:4:3: sources: 1025 ZMQ sockets needed (one SUB per dp rank, one replay DEALER per "
     "dp rank with a replay_endpoint, one for the CURVE ZAP handler), more than ZMQ's "
     "limit of 1023: lower dp_size or split the sources over several kvbridge "
     "instances\n"},
};

START_TEST(test_runtime_bad)
{
    struct result r = load_text(runtime_bad[_i].file);
    ck_assert_msg(r.rc == -EINVAL, "case %d: rc %d", _i, r.rc);
    ck_assert_str_eq(r.errs, runtime_bad[_i].errs);
    result_free(&r);
}
END_TEST

START_TEST(test_runtime_good)
{
    /* the limits themselves (1023 sockets), a bind-mode wildcard port, URLs
     * without a port */
    struct result r =
        load_text("worker_id: 1\nblock_size: 16\nsources:\n"
                  "  - {endpoint: 'tcp://h:1000', replay_endpoint: 'tcp://h:2000', dp_size: 510}\n"
                  "  - {endpoint: 'tcp://[::1]:65535'}\n  - {endpoint: 'tcp://*:*', mode: bind}\n"
                  "nats: {servers: ['nats://u:p@h', 'tls://[::1]:1/x', 'h:65535',\n"
                  "                 'tls://h:', 'u:p@h:1']}\n"
                  "metrics: {listen: '[::1]:1'}\n");
    ck_assert_str_eq(r.errs, "");
    ck_assert_int_eq(r.rc, 0);
    result_free(&r);
}
END_TEST

START_TEST(test_multiline_secret_file)
{
    char path[32], text[160], want[300];
    /* one line and a trailing newline (or two) is fine */
    temp_file(path, "pw\r\n\n", 5);
    snprintf(text, sizeof text, "nats: {user: u, password_file: '%s'}\n", path);
    struct result r = load_extra(text);
    ck_assert_str_eq(r.errs, "");
    ck_assert_str_eq(r.cfg->nats.password, "pw");
    result_free(&r);
    unlink(path);

    /* a second line is an error naming the file (and not quoting it) */
    temp_file(path, "pw-line-1\npw-line-2\n", 20);
    snprintf(text, sizeof text, "nats: {token_file: '%s'}\n", path);
    r = load_extra(text);
    ck_assert_int_eq(r.rc, -EINVAL);
    snprintf(want, sizeof want,
             "T:4:20: nats.token_file: cannot use '%s': it has more than "
             "one line (only a trailing line end is dropped)\n",
             path);
    ck_assert_str_eq(r.errs, want);
    result_free(&r);
    unlink(path);
}
END_TEST

START_TEST(test_write_effective)
{
    setenv("KVB_T_PW", "hunter2-env", 1);
    struct result r = load_extra("nats:\n  user: u\n  password: ${KVB_T_PW}\n"
                                 "  servers: ['nats://u:tok3n@h:4222', 'nats://h2']\n");
    ck_assert_str_eq(r.errs, "");
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    ck_assert_int_eq(kvb_config_write_effective(r.cfg, f), 0);
    fclose(f);
    ck_assert_ptr_nonnull(strstr(out, "\nworker_id: 1\n"));
    ck_assert_ptr_nonnull(strstr(out, "\nblock_size: 16\n"));
    ck_assert_ptr_nonnull(strstr(out, "\nsources[0].endpoint: \"inproc://x\"\n"));
    ck_assert_ptr_nonnull(strstr(out, "\nsources[0].mode: connect\n"));
    ck_assert_ptr_nonnull(strstr(out, "\nnats.user: \"u\"\n"));
    ck_assert_ptr_nonnull(strstr(out, "\nnats.password: (redacted)\n"));
    ck_assert_ptr_nonnull(strstr(out, "\nnats.token: \"\"\n"));
    ck_assert_ptr_nonnull(
        strstr(out, "\nnats.servers: [\"nats://(redacted)@h:4222\", \"nats://h2\"]\n"));
    ck_assert_ptr_nonnull(strstr(out, "\nforward_tiers: [device]\n"));
    ck_assert_ptr_null(strstr(out, "hunter2"));
    ck_assert_ptr_null(strstr(out, "tok3n"));
    free(out);
    result_free(&r);
    unsetenv("KVB_T_PW");
}
END_TEST

/* sources[].engine: defaults, values, URL and interval checks; engine keys
 * are not part of kvb_config_source_equal() (no reopen on SIGHUP). */
START_TEST(test_engine_keys)
{
    struct result r =
        load_text("worker_id: 1\nblock_size: 16\nsources:\n  - endpoint: tcp://127.0.0.1:5557\n"
                  "  - endpoint: tcp://127.0.0.1:5560\n    engine:\n"
                  "      kind: sglang\n"
                  "      metrics_url: http://127.0.0.1:30000/metrics\n"
                  "      health_url: https://engine.local/health\n"
                  "      scrape_interval_ms: 250\n      dead_after_ms: 3000\n"
                  "nats:\n  endpoint: gen2\nlog:\n  stats_interval_s: 0\n");
    ck_assert_msg(r.rc == 0, "%s", r.errs);
    const struct kvb_engine_cfg *a = &r.cfg->sources[0].engine, *b = &r.cfg->sources[1].engine;
    ck_assert_int_eq(a->kind, 0);
    ck_assert_str_eq(a->metrics_url, "");
    ck_assert_str_eq(a->health_url, "");
    ck_assert_uint_eq(a->scrape_interval_ms, 500);
    ck_assert_uint_eq(a->dead_after_ms, 10000);
    ck_assert_int_eq(b->kind, 1);
    ck_assert_str_eq(b->metrics_url, "http://127.0.0.1:30000/metrics");
    ck_assert_str_eq(b->health_url, "https://engine.local/health");
    ck_assert_uint_eq(b->scrape_interval_ms, 250);
    ck_assert_uint_eq(b->dead_after_ms, 3000);
    ck_assert_str_eq(r.cfg->nats.endpoint, "gen2");
    ck_assert_uint_eq(r.cfg->log.stats_interval_s, 0);
    ck_assert(!kvb_config_engine_equal(&r.cfg->sources[0], &r.cfg->sources[1]));
    struct kvb_source_cfg x = r.cfg->sources[1];
    x.engine = r.cfg->sources[0].engine;
    ck_assert(kvb_config_source_equal(&x, &r.cfg->sources[1])); /* engine not compared */
    ck_assert(!kvb_config_engine_equal(&x, &r.cfg->sources[1]));
    result_free(&r);

    r = load_text("worker_id: 1\nblock_size: 16\nsources:\n  - endpoint: tcp://127.0.0.1:5557\n");
    ck_assert_msg(r.rc == 0, "%s", r.errs);
    ck_assert_str_eq(r.cfg->nats.endpoint, "generate");
    ck_assert_uint_eq(r.cfg->log.stats_interval_s, 10);
    result_free(&r);

    r = load_text(
        "worker_id: 1\nblock_size: 16\nsources:\n  - endpoint: tcp://127.0.0.1:5557\n    engine:\n"
        "      metrics_url: ftp://x/metrics\n      health_url: not a url\n"
        "      kind: trt\n");
    ck_assert_int_eq(r.rc, -EINVAL);
    ck_assert_msg(strstr(r.errs, "sources[0].engine.metrics_url: 'ftp://x/metrics' is not an "
                                 "http:// or https:// URL"),
                  "%s", r.errs);
    ck_assert_msg(strstr(r.errs, "sources[0].engine.health_url: 'not a url'"), "%s", r.errs);
    ck_assert_msg(strstr(r.errs, "sources[0].engine.kind"), "%s", r.errs);
    result_free(&r);

    r = load_text(
        "worker_id: 1\nblock_size: 16\nsources:\n  - endpoint: tcp://127.0.0.1:5557\n    engine:\n"
        "      scrape_interval_ms: 1000\n      dead_after_ms: 999\n");
    ck_assert_int_eq(r.rc, -EINVAL);
    ck_assert_msg(strstr(r.errs, "T:7:22: sources[0].engine.dead_after_ms: 999 is less than "
                                 "sources[0].engine.scrape_interval_ms (1000)"),
                  "%s", r.errs);
    result_free(&r);
}
END_TEST

/* ---- sources[].discover ---------------------------------------------------- */

START_TEST(test_discover)
{
    struct result r = load_text("worker_id: 1\nblock_size: 16\nsources:\n"
                                "  - discover: http://10.0.0.7:8000\n    dp_size: 4\n"
                                "  - endpoint: tcp://127.0.0.1:5557\n");
    ck_assert_msg(r.rc == 0, "%s", r.errs);
    const struct kvb_source_cfg *s = r.cfg->sources;
    ck_assert_str_eq(s[0].discover, "http://10.0.0.7:8000");
    ck_assert_str_eq(s[0].endpoint, "");
    ck_assert_str_eq(s[0].replay_endpoint, "");
    ck_assert_uint_eq(s[0].dp_size, 4);
    ck_assert_str_eq(s[1].discover, "");
    struct kvb_source_cfg x = s[0];
    x.discover = (char *)"http://10.0.0.8:8000";
    ck_assert(!kvb_config_source_equal(&x, &s[0])); /* another engine: reopened */
    result_free(&r);

    r = load_text("worker_id: 1\nblock_size: 16\nsources:\n"
                  "  - {discover: 'http://h:8000', endpoint: 'tcp://h:1', replay_endpoint: "
                  "'tcp://h:2',\n     topic: t, mode: bind, topics: {a: 1}}\n"
                  "  - {discover: 'ftp://h'}\n"
                  "  - {dp_size: 2}\n"
                  "  - {discover: 'http://h:8000', dp_rank: 4294967295, dp_size: 2}\n");
    ck_assert_int_eq(r.rc, -EINVAL);
    ck_assert_str_eq(r.errs,
                     "T:4:43: sources[0].endpoint: the engine's list (sources[0].discover) gives "
                     "it: leave it out\n"
                     "T:4:73: sources[0].replay_endpoint: the engine's list (sources[0].discover) "
                     "gives it: leave it out\n"
                     "T:5:13: sources[0].topic: the engine's list (sources[0].discover) gives "
                     "it: leave it out\n"
                     "T:5:36: sources[0].topics: the engine's list (sources[0].discover) gives "
                     "it: leave it out\n"
                     "T:5:22: sources[0].mode: bind: with sources[0].discover kvbridge connects "
                     "to the listed endpoints (mode: connect)\n"
                     "T:6:16: sources[1].discover: 'ftp://h' is not an http:// or https:// URL "
                     "(or \"\" for none)\n"
                     "T:7:5: missing required key 'sources[2].endpoint'\n"
                     "T:8:42: sources[3].dp_rank: 4294967295 + dp_size 2 goes past 4294967295\n");
    result_free(&r);
}
END_TEST

/* ---- sources[].lora_names ------------------------------------------------ */

START_TEST(test_lora_names)
{
    struct result r = load_text("worker_id: 1\nblock_size: 16\nsources:\n"
                                "  - endpoint: tcp://127.0.0.1:5557\n"
                                "    lora_names: {7: sql-lora, 0: \"base adapter\",\n"
                                "                 9223372036854775807: last}\n"
                                "  - endpoint: tcp://127.0.0.1:5558\n    lora_names: ~\n");
    ck_assert_msg(r.rc == 0, "%s", r.errs);
    const struct kvb_source_cfg *s = r.cfg->sources;
    ck_assert_uint_eq(s[0].n_lora_names, 3);
    ck_assert_uint_eq(s[0].lora_names[0].id, 7);
    ck_assert_str_eq(s[0].lora_names[0].name, "sql-lora");
    ck_assert_uint_eq(s[0].lora_names[1].id, 0);
    ck_assert_str_eq(s[0].lora_names[1].name, "base adapter");
    ck_assert_uint_eq(s[0].lora_names[2].id, INT64_MAX);
    ck_assert_uint_eq(s[1].n_lora_names, 0);
    /* a worker key: a reload hands it to the running source */
    struct kvb_source_cfg x = s[0];
    x.n_lora_names = 2;
    ck_assert(kvb_config_source_equal(&x, &s[0]));
    ck_assert(!kvb_config_worker_equal(&x, &s[0]));
    ck_assert(kvb_config_worker_equal(&s[0], &s[0]));
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    ck_assert_int_eq(kvb_config_write_effective(r.cfg, f), 0);
    fclose(f);
    ck_assert_msg(strstr(out, "sources[0].lora_names: {7: \"sql-lora\", 0: \"base adapter\", "
                              "9223372036854775807: \"last\"}\n"),
                  "%s", out);
    ck_assert_msg(strstr(out, "sources[1].lora_names: {}\n"), "%s", out);
    free(out);
    result_free(&r);

    r = load_text("worker_id: 1\nblock_size: 16\nsources:\n"
                  "  - endpoint: tcp://127.0.0.1:5557\n"
                  "    lora_names: {7: a, '07': b, -1: c, 9223372036854775808: d, x: e,\n"
                  "                 8: '', 9: [a], 10: ~}\n"
                  "  - endpoint: tcp://127.0.0.1:5558\n    lora_names: [7, a]\n");
    ck_assert_int_eq(r.rc, -EINVAL);
    ck_assert_str_eq(r.errs,
                     "T:5:24: sources[0].lora_names: '07' is not a decimal integer (expected "
                     "0..9223372036854775807)\n"
                     "T:5:33: sources[0].lora_names: '-1' is negative (expected "
                     "0..9223372036854775807)\n"
                     "T:5:40: sources[0].lora_names: 9223372036854775808 is out of range "
                     "(expected 0..9223372036854775807)\n"
                     "T:5:64: sources[0].lora_names: 'x' is not a decimal integer (expected "
                     "0..9223372036854775807)\n"
                     "T:6:21: sources[0].lora_names[8]: the name must not be empty\n"
                     "T:6:28: sources[0].lora_names[9]: expected an adapter name, found a "
                     "list\n"
                     "T:6:37: sources[0].lora_names[10]: expected an adapter name, found "
                     "nothing\n"
                     "T:8:17: sources[1].lora_names: expected a mapping of LoRA ids to adapter "
                     "names ({7: \"sql-lora\"}), found a list\n");
    result_free(&r);

    r = load_text("worker_id: 1\nblock_size: 16\nsources:\n"
                  "  - endpoint: tcp://127.0.0.1:5557\n"
                  "    lora_names: {7: a, 8: b, 7: c}\n");
    ck_assert_int_eq(r.rc, -EINVAL);
    ck_assert_str_eq(r.errs, "T:5:30: sources[0].lora_names[7]: the LoRA id is listed twice "
                             "(first at 5:18)\n");
    result_free(&r);
}
END_TEST

/* ---- several engines, one kvbridge --------------------------------------- */

START_TEST(test_worker_keys)
{
    /* a source's own keys; the others (absent or ~) take the top level's */
    struct result r = load_text(
        "worker_id: 5\nblock_size: 16\nlora_salt: false\nforward_tiers: [device, disk]\n"
        "sources:\n"
        "  - endpoint: tcp://127.0.0.1:5557\n"
        "  - endpoint: tcp://127.0.0.1:5558\n    worker_id: 12\n    block_size: auto\n"
        "    lora_salt: true\n    forward_tiers: [host_pinned]\n"
        "  - endpoint: tcp://0.0.0.0:5559\n    mode: bind\n    worker_id: ~\n"
        "    block_size: 32\n    topics: {\"kv@pod-a@llama\": 101, kv@pod-b@llama: 102}\n");
    ck_assert_msg(r.rc == 0, "%s", r.errs);
    const struct kvb_source_cfg *s = r.cfg->sources;
    ck_assert_uint_eq(s[0].worker_id, 5);
    ck_assert_uint_eq(s[0].block_size, 16);
    ck_assert(!s[0].lora_salt);
    ck_assert_uint_eq(s[0].forward_tiers, (1u << KVB_TIER_DEVICE) | (1u << KVB_TIER_DISK));
    ck_assert_uint_eq(s[0].n_topics, 0);
    ck_assert_uint_eq(s[1].worker_id, 12);
    ck_assert_uint_eq(s[1].block_size, 0);
    ck_assert(s[1].lora_salt);
    ck_assert_uint_eq(s[1].forward_tiers, 1u << KVB_TIER_HOST_PINNED);
    ck_assert_uint_eq(s[2].worker_id, 5);
    ck_assert_uint_eq(s[2].block_size, 32);
    ck_assert_uint_eq(s[2].n_topics, 2);
    ck_assert_str_eq(s[2].topics[0].topic, "kv@pod-a@llama");
    ck_assert_uint_eq(s[2].topics[0].worker_id, 101);
    ck_assert_str_eq(s[2].topics[1].topic, "kv@pod-b@llama");
    ck_assert_uint_eq(s[2].topics[1].worker_id, 102);
    /* the worker keys are not how a source is opened */
    struct kvb_source_cfg x = s[1];
    x.worker_id = 99;
    ck_assert(kvb_config_source_equal(&x, &s[1]));
    ck_assert(!kvb_config_worker_equal(&x, &s[1]));
    x = s[2];
    x.n_topics = 1; /* the map is how streams are taken: a source key */
    ck_assert(!kvb_config_source_equal(&x, &s[2]));
    ck_assert(kvb_config_worker_equal(&x, &s[2]));
    ck_assert(kvb_config_worker_equal(&s[2], &s[2]));
    x = s[1];
    x.image_token_id = 151655; /* a worker key: handed to the running source */
    ck_assert(kvb_config_source_equal(&x, &s[1]));
    ck_assert(!kvb_config_worker_equal(&x, &s[1]));
    x = s[1];
    x.video_token_id = 151656; /* a worker key too */
    ck_assert(kvb_config_source_equal(&x, &s[1]));
    ck_assert(!kvb_config_worker_equal(&x, &s[1]));
    /* --check -v shows the effective values */
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    ck_assert_int_eq(kvb_config_write_effective(r.cfg, f), 0);
    fclose(f);
    ck_assert_msg(strstr(out, "sources[0].worker_id: 5\nsources[0].block_size: 16\n"
                              "sources[0].lora_salt: false\n"
                              "sources[0].forward_tiers: [device, disk]\n"
                              "sources[0].image_token_id: 0\n"
                              "sources[0].video_token_id: 0\n"
                              "sources[0].lora_names: {}\n"
                              "sources[0].topics: {}\n"),
                  "%s", out);
    ck_assert_msg(strstr(out, "sources[1].block_size: auto\n"), "%s", out);
    ck_assert_msg(strstr(out, "sources[2].topics: {\"kv@pod-a@llama\": 101, "
                              "\"kv@pod-b@llama\": 102}\n"),
                  "%s", out);
    free(out);
    result_free(&r);

    /* every source sets its own: the top level is not required, and takes
     * the first source's values */
    r = load_text("sources:\n  - {endpoint: 'inproc://a', worker_id: 7, block_size: 32}\n"
                  "  - {endpoint: 'inproc://b', worker_id: 8, block_size: 16}\n");
    ck_assert_msg(r.rc == 0, "%s", r.errs);
    ck_assert_uint_eq(r.cfg->worker_id, 7);
    ck_assert_uint_eq(r.cfg->block_size, 32);
    ck_assert_uint_eq(r.cfg->sources[1].worker_id, 8);
    result_free(&r);

    /* ... but one that does not makes them required again */
    r = load_text("sources:\n  - {endpoint: 'inproc://a', worker_id: 7, block_size: 32}\n"
                  "  - {endpoint: 'inproc://b', block_size: 16}\n");
    ck_assert_int_eq(r.rc, -EINVAL);
    ck_assert_str_eq(r.errs, "T:1:1: missing required key 'worker_id'\n");
    result_free(&r);

    /* worker_id_file is the default of the sources that set none */
    char path[32], text[300];
    temp_file(path, "41\n", 3);
    snprintf(text, sizeof text,
             "worker_id_file: '%s'\nblock_size: 16\n"
             "sources: [{endpoint: 'inproc://x'}, {endpoint: 'inproc://y', worker_id: 3}]\n",
             path);
    r = load_text(text);
    ck_assert_msg(r.rc == 0, "%s", r.errs);
    ck_assert_uint_eq(r.cfg->worker_id, 41);
    ck_assert_uint_eq(r.cfg->sources[0].worker_id, 41);
    ck_assert_uint_eq(r.cfg->sources[1].worker_id, 3);
    result_free(&r);
    unlink(path);
}
END_TEST

START_TEST(test_topics_bad)
{
    struct result r =
        load_text("worker_id: 1\nblock_size: 16\nsources:\n"
                  "  - endpoint: 'inproc://a'\n"
                  "    topics: {\"\": 3, a: x, b: [1], a: 2, c: , d: -1}\n"
                  "  - {endpoint: 'inproc://b', topics: [a]}\n"
                  "  - {endpoint: 'inproc://c', topics: 5}\n"
                  "  - {endpoint: 'inproc://d', worker_id: -2, block_size: 0, lora_salt: yes,"
                  " forward_tiers: [gpu]}\n");
    ck_assert_int_eq(r.rc, -EINVAL);
    ck_assert_str_eq(
        r.errs,
        "T:5:14: sources[0].topics: a topic must be a non-empty single value\n"
        "T:5:24: sources[0].topics['a']: 'x' is not a decimal integer (expected "
        "0..18446744073709551615)\n"
        "T:5:30: sources[0].topics['b']: expected a worker id, found a list\n"
        "T:5:35: sources[0].topics['a']: the topic is listed twice (first at 5:21)\n"
        "T:5:44: sources[0].topics['c']: expected a worker id, found nothing\n"
        "T:5:49: sources[0].topics['d']: '-1' is negative (expected "
        "0..18446744073709551615)\n"
        "T:6:38: sources[1].topics: expected a mapping of topics to worker ids "
        "({\"kv@pod-a@llama\": 101}), found a list\n"
        "T:7:38: sources[2].topics: expected a mapping of topics to worker ids "
        "({\"kv@pod-a@llama\": 101}), found a single value\n"
        "T:8:41: sources[3].worker_id: '-2' is negative (expected 0..18446744073709551615)\n"
        "T:8:57: sources[3].block_size: 0 is out of range (expected 1..1048576 or \"auto\")\n"
        "T:8:71: sources[3].lora_salt: 'yes' is not a boolean (expected true or false)\n"
        "T:8:92: sources[3].forward_tiers[0]: 'gpu' is not a storage tier (expected device, "
        "host_pinned, disk or external)\n");
    result_free(&r);

    /* at most 64 topics, of at most 255 bytes */
    char *text = malloc(8192);
    ck_assert(text != NULL);
    int n = snprintf(text, 8192,
                     "worker_id: 1\nblock_size: 16\nsources:\n"
                     "  - endpoint: 'inproc://a'\n    topics:\n");
    for (int i = 0; i < 65; i++)
        n += snprintf(text + n, 8192 - (size_t)n, "      t%d: %d\n", i, i);
    r = load_text(text);
    ck_assert_str_eq(r.errs, "T:6:7: sources[0].topics: too many topics (more than 64)\n");
    result_free(&r);
    n = snprintf(text, 8192,
                 "worker_id: 1\nblock_size: 16\nsources:\n"
                 "  - endpoint: 'inproc://a'\n    topics: {");
    for (int i = 0; i < 256; i++)
        text[n++] = 'x';
    snprintf(text + n, 8192 - (size_t)n, ": 1}\n");
    r = load_text(text);
    ck_assert_msg(strstr(r.errs, "T:5:14: sources[0].topics['xxxx") &&
                      strstr(r.errs, "...']: the topic is longer than 255 bytes\n"),
                  "%s", r.errs);
    result_free(&r);
    free(text);
}
END_TEST

static Suite *config_suite(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("config");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_spec_example);
    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_every_key);
    tcase_add_test(tc, test_small_forms);
    tcase_add_loop_test(tc, test_bad_file, 0, (int)(sizeof bad_files / sizeof *bad_files));
    tcase_add_test(tc, test_err_null);
    tcase_add_test(tc, test_unreadable);
    tcase_add_test(tc, test_file_size_cap);
    tcase_add_loop_test(tc, test_bad_text, 0, (int)(sizeof bad_texts / sizeof *bad_texts));
    tcase_add_test(tc, test_nesting_and_node_caps);
    tcase_add_test(tc, test_error_cap);
    tcase_add_test(tc, test_mutations);
    tcase_add_test(tc, test_example_loads);
    tcase_add_test(tc, test_conf_file_is_example);
    tcase_add_test(tc, test_example_write_error);
    tcase_add_test(tc, test_check_reload);
    tcase_add_test(tc, test_jetstream_names);
    tcase_add_test(tc, test_jetstream_reload);
    tcase_add_test(tc, test_block_size_reload_from_files);
    tcase_add_test(tc, test_free_null);
    tcase_add_test(tc, test_auth_files);
    tcase_add_test(tc, test_auth_inline);
    tcase_add_loop_test(tc, test_nkey_public, 0,
                        (int)(sizeof nkey_vectors / sizeof nkey_vectors[0]));
    tcase_add_loop_test(tc, test_nkey_bad_seed, 0, (int)(sizeof bad_seeds / sizeof *bad_seeds));
    tcase_add_test(tc, test_credentials_directory);
    tcase_add_test(tc, test_secret_file_limits);
    tcase_add_test(tc, test_secrets_not_shown);
    tcase_add_test(tc, test_nats_equal);
    tcase_add_test(tc, test_curve_keys);
    tcase_add_loop_test(tc, test_curve_bad, 0, (int)(sizeof bad_curve / sizeof *bad_curve));
    tcase_add_test(tc, test_curve_source_equal);
    tcase_add_test(tc, test_env_expand);
    tcase_add_test(tc, test_worker_id_file);
    tcase_add_loop_test(tc, test_runtime_bad, 0, (int)(sizeof runtime_bad / sizeof *runtime_bad));
    tcase_add_test(tc, test_runtime_good);
    tcase_add_test(tc, test_multiline_secret_file);
    tcase_add_test(tc, test_write_effective);
    tcase_add_test(tc, test_engine_keys);
    tcase_add_test(tc, test_worker_keys);
    tcase_add_test(tc, test_lora_names);
    tcase_add_test(tc, test_discover);
    tcase_add_test(tc, test_topics_bad);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(config_suite()); }
