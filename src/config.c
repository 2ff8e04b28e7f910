/* config: the YAML file (docs/configuration.md), parsed with libyaml's event API.
 *
 * Everything hangs off one table, `opts[]` (docs/design.md rule 7): each row is a key
 * path, a type, an offset, a default, limits, a reloadable flag, an optional
 * check and the help text.  Parsing, defaults, validation, freeing, reload
 * checks and the commented example are all loops over that table.
 *
 * The file (at most 1 MiB) is read into memory, turned into a small node tree
 * (bounded: MAX_NODES nodes, MAX_NESTING levels, no aliases) and then walked
 * against the table.  Every error is "FILE:LINE:COLUMN: message", with the
 * 1-based position of the offending key or value.
 *
 * Split: src/config_yaml.c turns the file into the node tree (shared types in
 * src/config_priv.h); src/secret.c reads the files the keys name (secrets,
 * CURVE keys) and derives the NKey public key.  This file keeps the table,
 * the checks, the walk of the tree against the table and the example.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strndup, open_memstream in tests; also set by the Makefile */
#endif
#include "config.h"
#include "config_priv.h"
#include "log.h"
#include "metrics.h"
#include "secret.h"
#include "subject.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#define MAX_FILE_BYTES (1u << 20) /* 1 MiB */
#define MAX_SOURCES 1024
#define MAX_ERRORS 100            /* printed; the rest are counted */
#define MAX_SHOWN 60              /* bytes of a user value quoted in a message */
#define MAX_SHOWN_PATH 240        /* bytes of a file name quoted in a message */

/* ------------------------------------------------------------------------ */
/* The table                                                                 */

enum otype {
    T_U64,       /* uint64_t, decimal */
    T_U32,       /* uint32_t, decimal */
    T_BOOL,      /* bool: true | false */
    T_STR,       /* char *, "" allowed */
    T_ENUM,      /* int: index into values[] */
    T_STRLIST,   /* char ** + size_t count at noff */
    T_TIERS,     /* uint32_t bitmask of 1u << enum kvb_tier */
    T_BLOCKSIZE, /* uint32_t, integer in min..max or "auto" -> 0 */
    T_SOURCES,   /* struct kvb_source_cfg * + size_t count at noff */
};

#define F_REQUIRED 1u /* no default: absent is an error; def is the example's value */
#define F_RELOAD 2u   /* SIGHUP may change it */
#define F_SECRET 4u   /* T_STR never shown, zeroed when freed */
#define F_PATH 8u     /* T_STR file name: resolved (see resolve_path()) and checked
                       * readable at load; with .fills, read into that key */
#define F_CONN 16u    /* the NATS connection is made from it (kvb_config_nats_equal) */
#define F_EMPTY 32u   /* T_STRLIST: an empty list is allowed (and the default "" is one) */

struct opt;

/* Extra validation of a converted value; reports and returns -1 when bad. */
typedef int check_fn(struct ctx *c, const struct opt *o, const char *dpath,
                     const void *field, const struct node *v);

struct opt {
    const char *key;   /* dotted path; "sources[].x" for keys of each source */
    enum otype type;
    size_t off;        /* into struct kvb_config, or struct kvb_source_cfg */
    size_t noff;       /* T_STRLIST, T_SOURCES: the size_t element count */
    const char *def;   /* default as text; lists: comma-separated */
    uint64_t min, max; /* integers, block_size */
    const char *const *values; /* T_ENUM: allowed strings, NULL-terminated */
    unsigned flags;
    check_fn *check;
    const char *fills; /* F_PATH: the F_SECRET key its file's content goes to */
    const char *alt;   /* F_REQUIRED: absent is fine when this key is set (not "") */
    const char *help;
};

/* Offsets with a compile-time type check: a mismatch has no _Generic match. */
#define TOP(f, T) _Generic(((struct kvb_config *)0)->f, T: offsetof(struct kvb_config, f))
#define SRC(f, T)                                                              \
    _Generic(((struct kvb_source_cfg *)0)->f, T: offsetof(struct kvb_source_cfg, f))

static const char *const mode_values[] = {"connect", "bind", NULL};
static const char *const format_values[] = {"dynamo-json", "dynamo-msgpack", "raw", NULL};
static const char *const level_values[] = {"error", "warn", "info", "debug", NULL};
static const char *const retention_values[] = {"limits", "interest", "workqueue", NULL};
#define TIER_NAME(s, str) [KVB_TIER_##s] = str,
static const char *const tier_values[] = {KVB_TIERS(TIER_NAME) NULL};

static check_fn check_endpoint, check_opt_endpoint, check_subject, check_word,
    check_format, check_listen, check_host, check_js_template, check_server_url,
    check_etcd_url;

#define R F_RELOAD
#define C F_CONN
#define I32MAX ((uint64_t)INT32_MAX)

static const struct opt opts[] = {
    {.key = "worker_id", .type = T_U64, .off = TOP(worker_id, uint64_t), .def = "0",
     .min = 0, .max = UINT64_MAX, .flags = F_REQUIRED | R, .alt = "worker_id_file",
     .help = "The indexer's id for this engine: an unsigned 64-bit decimal integer."},
    {.key = "worker_id_file", .type = T_STR, .off = TOP(worker_id_file, char *), .def = "",
     .flags = R | F_PATH,
     .help = "File holding worker_id instead (a decimal integer; white space around "
             "it is ignored), for an id that a deployment assigns; read at start and "
             "on SIGHUP. A relative name is looked up like the nats files. Use either "
             "this or worker_id; \"\" = none."},
    {.key = "block_size", .type = T_BLOCKSIZE, .off = TOP(block_size, uint32_t),
     .def = "16", .min = 1, .max = 1048576, .flags = F_REQUIRED | R,
     .help = "Tokens per KV block, or \"auto\" to trust the block size each event "
             "carries. Events whose block size differs are dropped."},
    {.key = "lora_salt", .type = T_BOOL, .off = TOP(lora_salt, bool), .def = "true",
     .flags = R,
     .help = "Salt tokens_hash with the event's lora_name (turn off for indexers "
             "that predate it)."},
    {.key = "forward_tiers", .type = T_TIERS, .off = TOP(forward_tiers, uint32_t),
     .def = "device", .values = tier_values, .flags = R,
     .help = "Storage tiers whose events are forwarded, a list of: device, "
             "host_pinned, disk, external."},
    {.key = "cache_namespace", .type = T_STR, .off = TOP(cache_namespace, char *), .def = "",
     .flags = R,
     .help = "Cache namespace salted into tokens_hash for events that carry none of "
             "their own (Dynamo's cache_namespace, docs/hash-rules.md); \"\" = none."},

    {.key = "sources", .type = T_SOURCES,
     .off = TOP(sources, struct kvb_source_cfg *), .noff = TOP(n_sources, size_t),
     .flags = F_REQUIRED | R,
     .help = "The engine event streams (ZMQ PUB sockets): a list of one or more."},
    {.key = "sources[].endpoint", .type = T_STR, .off = SRC(endpoint, char *),
     .def = "tcp://127.0.0.1:5557", .flags = F_REQUIRED | R, .check = check_endpoint,
     .help = "The engine's event endpoint: tcp://, ipc:// or inproc://."},
    {.key = "sources[].replay_endpoint", .type = T_STR,
     .off = SRC(replay_endpoint, char *), .def = "", .flags = R,
     .check = check_opt_endpoint,
     .help = "The engine's replay ROUTER endpoint; \"\" when it has none."},
    {.key = "sources[].topic", .type = T_STR, .off = SRC(topic, char *), .def = "",
     .flags = R, .help = "Subscription prefix; \"\" receives every topic."},
    {.key = "sources[].mode", .type = T_ENUM, .off = SRC(mode, int), .def = "connect",
     .values = mode_values, .flags = R,
     .help = "connect: the engine binds and kvbridge connects; bind: kvbridge binds "
             "and engines connect."},
    {.key = "sources[].dp_size", .type = T_U32, .off = SRC(dp_size, uint32_t),
     .def = "1", .min = 1, .max = 65535, .flags = R,
     .help = "Data-parallel ranks behind this source. N > 1 expands endpoint and "
             "replay_endpoint (both then tcp:// with a numeric port) to ports "
             "base+0 .. base+N-1."},
    {.key = "sources[].dp_rank", .type = T_U32, .off = SRC(dp_rank, uint32_t),
     .def = "0", .min = 0, .max = UINT32_MAX, .flags = R,
     .help = "dp_rank used when a batch carries none (with dp_size > 1: the rank "
             "of the first port of the expansion)."},
    {.key = "sources[].rcvhwm", .type = T_U32, .off = SRC(rcvhwm, uint32_t),
     .def = "1000000", .min = 0, .max = I32MAX, .flags = R,
     .help = "ZMQ_RCVHWM of the SUB socket, in messages (0 = no limit). Batches "
             "queue there while kvbridge is slower than the engine or paused (NATS "
             "away): memory up to rcvhwm x batch size; beyond it the engine drops "
             "and replay (or a barrier) covers the gap."},
    {.key = "sources[].curve.secret_key_file", .type = T_STR,
     .off = SRC(curve.secret_key_file, char *), .def = "", .flags = R,
     .help = "ZMQ CURVE (encryption and authentication of the engine link): file "
             "holding this source's CURVE secret key, 40 Z85 characters on one line "
             "(# comment lines allowed), as the second line of kvsim --curve-keygen "
             "prints it; \"\" = CURVE off (plain ZMTP). A relative name is looked up "
             "like the nats files. In bind mode the SUB is then a CURVE server (engines "
             "connect with its public key); in connect mode a CURVE client of the "
             "engine, for the replay socket too. Not for inproc:// endpoints."},
    {.key = "sources[].curve.server_public_key", .type = T_STR,
     .off = SRC(curve.server_public_key, char *), .def = "", .flags = R,
     .help = "Connect mode with CURVE: the engine's CURVE public key, 40 Z85 "
             "characters in single quotes (Z85 has characters YAML would read); "
             "required then, and an error in bind mode."},
    {.key = "sources[].curve.allowed_clients_file", .type = T_STR,
     .off = SRC(curve.allowed_clients_file, char *), .def = "", .flags = R,
     .help = "Bind mode with CURVE: file listing the CURVE public keys (40 Z85 "
             "characters, one per line; # comments and blank lines allowed) of the "
             "engines allowed to connect; others are refused during the handshake. "
             "\"\" = any engine that knows this source's public key. An error in "
             "connect mode."},

    {.key = "nats.servers", .type = T_STRLIST, .off = TOP(nats.servers, char **),
     .noff = TOP(nats.n_servers, size_t), .def = "nats://127.0.0.1:4222", .flags = R | C,
     .check = check_server_url,
     .help = "NATS server URLs; list several for a cluster. tls:// URLs turn on "
             "nats.tls.enabled. A port, when given, is 1..65535 (4222 when none)."},
    {.key = "nats.subject", .type = T_STR, .off = TOP(nats.subject, char *),
     .def = "namespace.{namespace}.component.{component}.kv_events", .flags = R,
     .check = check_subject,
     .help = "Subject the router events are published on. {namespace}, "
             "{component}, {endpoint}, {worker_id} and {dp_rank} are replaced "
             "(with nats.format dynamo-msgpack, each value percent-encoded). The "
             "default shown is dynamo-json's; for dynamo-msgpack, when this key is "
             "not set, it is namespace.{namespace}.component.{component}.endpoint."
             "{endpoint}.kv-events (the newest routers' endpoint-scoped subject)."},
    {.key = "nats.namespace", .type = T_STR, .off = TOP(nats.namespace_, char *),
     .def = "dynamo", .flags = R, .check = check_word,
     .help = "Value of {namespace}."},
    {.key = "nats.component", .type = T_STR, .off = TOP(nats.component, char *),
     .def = "backend", .flags = R, .check = check_word,
     .help = "Value of {component}."},
    {.key = "nats.endpoint", .type = T_STR, .off = TOP(nats.endpoint, char *),
     .def = "generate", .flags = R, .check = check_word,
     .help = "Value of {endpoint}: the worker's KV-state endpoint (its serving "
             "endpoint), also the endpoint of its discovery record."},
    {.key = "nats.format", .type = T_ENUM, .off = TOP(nats.format, int),
     .def = "dynamo-json", .values = format_values, .check = check_format,
     .help = "Wire format of the published messages: dynamo-json (one JSON "
             "RouterEvent per message: routers of 2025, and JetStream), "
             "dynamo-msgpack (Dynamo's event plane: msgpack envelopes, for the "
             "routers of 2026; they need DYN_EVENT_PLANE=nats), raw (each engine "
             "batch republished unchanged, with the headers KV-Seq, KV-Topic, "
             "KV-Source and KV-DP-Rank, for consumers that decode it themselves). "
             "dynamo-msgpack and raw are refused with nats.jetstream.enabled."},
    {.key = "nats.batch", .type = T_BOOL, .off = TOP(nats.batch, bool), .def = "true",
     .help = "dynamo-msgpack: each message carries an array of RouterEvents of one "
             "(worker_id, dp_rank), at most 128 events or 8192 blocks (routers from "
             "mid 2026); false: one RouterEvent per message (the event plane's first "
             "routers)."},
    {.key = "nats.residency_domain", .type = T_BOOL,
     .off = TOP(nats.residency_domain, bool), .def = "true",
     .help = "dynamo-msgpack: write residency_domain \"worker\" in every RouterEvent, "
             "as Dynamo's own publisher does; turn off only for routers that predate "
             "the key."},

    /* Authentication: at most one of user + password, token, nkey_seed,
     * credentials (check_auth()). */
    {.key = "nats.credentials", .type = T_STR, .off = TOP(nats.credentials, char *),
     .def = "", .flags = R | C | F_PATH,
     .help = "Authentication with a NATS credentials file (.creds: user JWT and "
             "NKey seed); \"\" = none. Like every file name below, a relative one is "
             "looked up in $CREDENTIALS_DIRECTORY when that is set (systemd "
             "LoadCredential=), otherwise next to this file. At most one "
             "authentication method (credentials, user and password, token, "
             "nkey_seed) may be set."},
    {.key = "nats.user", .type = T_STR, .off = TOP(nats.user, char *), .def = "",
     .flags = R | C,
     .help = "User name for user/password authentication (with nats.password or "
             "nats.password_file); \"\" = none."},
    {.key = "nats.password", .type = T_STR, .off = TOP(nats.password, char *),
     .def = "", .flags = R | C | F_SECRET,
     .help = "Password of nats.user. Better kept out of this file: see "
             "nats.password_file."},
    {.key = "nats.password_file", .type = T_STR, .off = TOP(nats.password_file, char *),
     .def = "", .flags = R | C | F_PATH, .fills = "nats.password",
     .help = "File holding the password on one line (a trailing newline is "
             "ignored, a second line is an error), read at start and on SIGHUP; \"\" = "
             "none."},
    {.key = "nats.token", .type = T_STR, .off = TOP(nats.token, char *), .def = "",
     .flags = R | C | F_SECRET,
     .help = "Token for token authentication; \"\" = none. Better kept out of "
             "this file: see nats.token_file."},
    {.key = "nats.token_file", .type = T_STR, .off = TOP(nats.token_file, char *),
     .def = "", .flags = R | C | F_PATH, .fills = "nats.token",
     .help = "File holding the token on one line (a trailing newline is ignored, a "
             "second line is an error); \"\" = none."},
    {.key = "nats.nkey_seed", .type = T_STR, .off = TOP(nats.nkey_seed, char *),
     .def = "", .flags = R | C | F_SECRET,
     .help = "User NKey seed (SU...) for NKey authentication: kvbridge derives the "
             "public key and signs the server's challenge with it; \"\" = none. "
             "Better kept out of this file: see nats.nkey_seed_file."},
    {.key = "nats.nkey_seed_file", .type = T_STR,
     .off = TOP(nats.nkey_seed_file, char *), .def = "",
     .flags = R | C | F_PATH, .fills = "nats.nkey_seed",
     .help = "File holding the user NKey seed (as written by nk -gen user); \"\" "
             "= none."},
    {.key = "nats.connect_timeout_ms", .type = T_U32,
     .off = TOP(nats.connect_timeout_ms, uint32_t), .def = "0", .min = 0, .max = I32MAX,
     .flags = R,
     .help = "How long to wait for NATS at start before exiting with 69 "
             "(EX_UNAVAILABLE), in milliseconds; 0 = wait forever. A server that "
             "rejects the credentials or the TLS handshake ends the wait at once "
             "(with 0: retried, and logged, at every attempt)."},
    {.key = "nats.reconnect_buffer_bytes", .type = T_U64,
     .off = TOP(nats.reconnect_buffer_bytes, uint64_t), .def = "67108864", .min = 0,
     .max = I32MAX, .flags = R | C,
     .help = "Bytes buffered while NATS is disconnected (64 MiB by default)."},
    {.key = "nats.reconnect_wait_ms", .type = T_U32,
     .off = TOP(nats.reconnect_wait_ms, uint32_t), .def = "100", .min = 1, .max = I32MAX,
     .flags = R | C, .help = "First reconnect backoff step, in milliseconds."},
    {.key = "nats.reconnect_wait_max_ms", .type = T_U32,
     .off = TOP(nats.reconnect_wait_max_ms, uint32_t), .def = "5000", .min = 1,
     .max = I32MAX, .flags = R | C,
     .help = "Reconnect backoff ceiling, in milliseconds (at least "
             "nats.reconnect_wait_ms)."},
    {.key = "nats.flush_timeout_ms", .type = T_U32,
     .off = TOP(nats.flush_timeout_ms, uint32_t), .def = "5000", .min = 0, .max = I32MAX,
     .flags = R,
     .help = "How long to drain pending messages to NATS at shutdown, in "
             "milliseconds."},

    {.key = "nats.tls.enabled", .type = T_BOOL, .off = TOP(nats.tls.enabled, bool),
     .def = "false", .flags = R | C,
     .help = "Connect with TLS (also on when a server URL is tls://)."},
    {.key = "nats.tls.ca", .type = T_STR, .off = TOP(nats.tls.ca, char *), .def = "",
     .flags = R | C | F_PATH,
     .help = "CA certificates (PEM) that verify the server; \"\" = the system's "
             "trust store."},
    {.key = "nats.tls.cert", .type = T_STR, .off = TOP(nats.tls.cert, char *), .def = "",
     .flags = R | C | F_PATH,
     .help = "Client certificate chain (PEM), for servers that verify clients "
             "(with nats.tls.key); \"\" = none."},
    {.key = "nats.tls.key", .type = T_STR, .off = TOP(nats.tls.key, char *), .def = "",
     .flags = R | C | F_PATH,
     .help = "Private key (PEM) of nats.tls.cert; \"\" = none."},
    {.key = "nats.tls.verify", .type = T_BOOL, .off = TOP(nats.tls.verify, bool),
     .def = "true", .flags = R | C,
     .help = "Verify the server's certificate. Turn it off only for tests."},
    {.key = "nats.tls.server_name", .type = T_STR,
     .off = TOP(nats.tls.server_name, char *), .def = "", .flags = R | C,
     .check = check_host,
     .help = "Host name the server's certificate must match, when it differs from "
             "the server URLs' host; \"\" = none."},

    {.key = "nats.jetstream.enabled", .type = T_BOOL,
     .off = TOP(nats.jetstream.enabled, bool), .def = "false",
     .help = "Publish through JetStream instead of core NATS: every router event "
             "is stored in a stream and acknowledged, with the header Nats-Msg-Id "
             "= {worker_id}.{dp_rank}.{epoch}.{event_id}, so that a message sent "
             "again (after an ack timeout, a reconnection or a restart) is dropped "
             "by the stream's duplicate window. nats.subject is then not used."},
    {.key = "nats.jetstream.stream", .type = T_STR,
     .off = TOP(nats.jetstream.stream, char *), .def = "", .check = check_js_template,
     .help = "JetStream stream name; \"\" = "
             "namespace-{namespace}-component-{component}-kv-events. {namespace}, "
             "{component} and {worker_id} are replaced."},
    {.key = "nats.jetstream.subject", .type = T_STR,
     .off = TOP(nats.jetstream.subject, char *), .def = "", .check = check_js_template,
     .help = "Subject the router events are published on; \"\" = the stream name "
             "followed by .queue (Dynamo's durable mode). {namespace}, {component} "
             "and {worker_id} are replaced; no wildcards."},
    {.key = "nats.jetstream.create", .type = T_BOOL,
     .off = TOP(nats.jetstream.create, bool), .def = "true",
     .help = "Create the stream at start when it is missing, with the subject, "
             "retention, max_age_s, replicas and duplicate_window_s below. An "
             "existing stream is used as it is, but it must take the subject."},
    {.key = "nats.jetstream.retention", .type = T_ENUM,
     .off = TOP(nats.jetstream.retention, int), .def = "limits", .values = retention_values,
     .help = "Retention policy of a stream kvbridge creates."},
    {.key = "nats.jetstream.max_age_s", .type = T_U32,
     .off = TOP(nats.jetstream.max_age_s, uint32_t), .def = "3600", .min = 0,
     .max = UINT32_MAX,
     .help = "Age after which a stream kvbridge creates discards messages, in "
             "seconds; 0 = unlimited."},
    {.key = "nats.jetstream.replicas", .type = T_U32,
     .off = TOP(nats.jetstream.replicas, uint32_t), .def = "1", .min = 1, .max = 5,
     .help = "Replicas of a stream kvbridge creates (more than 1 needs a JetStream "
             "cluster)."},
    {.key = "nats.jetstream.duplicate_window_s", .type = T_U32,
     .off = TOP(nats.jetstream.duplicate_window_s, uint32_t), .def = "120", .min = 1,
     .max = UINT32_MAX,
     .help = "Duplicate window of a stream kvbridge creates, in seconds: a message "
             "whose Nats-Msg-Id the stream stored this recently is dropped. It must "
             "cover a bridge restart (the events published after the last state.dir "
             "save are published again), and be at most max_age_s (unless that is 0)."},
    {.key = "nats.jetstream.max_pending", .type = T_U32,
     .off = TOP(nats.jetstream.max_pending, uint32_t), .def = "4096", .min = 16,
     .max = 1048576,
     .help = "Publishes in flight (sent, not yet acknowledged) before kvbridge "
             "stops reading the engines: from 3/4 of it until it is down to 1/2. The "
             "events of what was read by then are still taken, up to "
             "nats.reconnect_buffer_bytes of unacknowledged messages; beyond that a "
             "publish is refused (a \"cleared\" barrier follows)."},
    {.key = "nats.jetstream.ack_timeout_ms", .type = T_U32,
     .off = TOP(nats.jetstream.ack_timeout_ms, uint32_t), .def = "5000", .min = 100,
     .max = I32MAX,
     .help = "How long to wait for a publish's acknowledgement, in milliseconds; "
             "then it is sent again (with the same Nats-Msg-Id)."},

    {.key = "replay.timeout_ms", .type = T_U32, .off = TOP(replay.timeout_ms, uint32_t),
     .def = "2000", .min = 1, .max = I32MAX, .flags = R,
     .help = "Time allowed for a whole replay request, in milliseconds; then a "
             "\"cleared\" barrier is published instead."},

    {.key = "discovery.etcd.endpoints", .type = T_STRLIST,
     .off = TOP(discovery.etcd.endpoints, char **),
     .noff = TOP(discovery.etcd.n_endpoints, size_t), .def = "", .flags = F_EMPTY,
     .check = check_etcd_url,
     .help = "etcd v3 JSON gateway URLs (http:// or https://) where kvbridge "
             "registers, for each (worker_id, dp_rank), the EventSource record the "
             "newest Dynamo routers require (docs/dynamo-event-plane.md); tried in "
             "turn. Needs nats.format dynamo-msgpack. [] = discovery off."},
    {.key = "discovery.etcd.lease_ttl_s", .type = T_U32,
     .off = TOP(discovery.etcd.lease_ttl_s, uint32_t), .def = "10", .min = 2, .max = 3600,
     .help = "TTL of the etcd lease the records are put under, in seconds; kvbridge "
             "keeps it alive (every third of it) and revokes it at a clean stop."},

    {.key = "metrics.listen", .type = T_STR, .off = TOP(metrics.listen, char *),
     .def = "127.0.0.1:9464", .check = check_listen,
     .help = "HOST:PORT serving Prometheus /metrics, /healthz and /readyz: a numeric "
             "IPv4 or [IPv6] address and a port 1..65535; \"\" disables it."},

    {.key = "log.level", .type = T_ENUM, .off = TOP(log.level, int), .def = "info",
     .values = level_values, .flags = R, .help = "Least severe message logged."},

    {.key = "state.dir", .type = T_STR, .off = TOP(state.dir, char *), .def = "",
     .help = "Directory where cursors persist across restarts; \"\" = none. "
             "Created (with its parents, mode 0700) at start and by --check when "
             "missing; it must be writable, else kvbridge exits with 73 "
             "(EX_CANTCREAT)."},

    {.key = "limits.max_payload_bytes", .type = T_U64,
     .off = TOP(limits.max_payload_bytes, uint64_t), .def = "16777216", .min = 1,
     .max = 1073741824, .flags = R,
     .help = "Largest engine message accepted, in bytes (16 MiB by default); "
             "larger ones are counted as malformed. Decoding a message takes up to "
             "about 28 times its size in memory (msgpack-c makes a 24-byte object "
             "per value): 450 MB for a 16 MiB batch of one-byte values. Lower it to "
             "bound the daemon's peak memory."},
    {.key = "limits.max_events_per_batch", .type = T_U32,
     .off = TOP(limits.max_events_per_batch, uint32_t), .def = "65536", .min = 1,
     .max = UINT32_MAX, .flags = R, .help = "Most events accepted in one engine batch."},
    {.key = "limits.max_hashes_per_event", .type = T_U32,
     .off = TOP(limits.max_hashes_per_event, uint32_t), .def = "65536", .min = 1,
     .max = UINT32_MAX, .flags = R, .help = "Most block hashes accepted in one event."},
    {.key = "limits.max_tokens_per_event", .type = T_U32,
     .off = TOP(limits.max_tokens_per_event, uint32_t), .def = "1048576", .min = 1,
     .max = UINT32_MAX, .flags = R, .help = "Most token ids accepted in one event."},
    {.key = "limits.max_depth", .type = T_U32, .off = TOP(limits.max_depth, uint32_t),
     .def = "16", .min = 1, .max = 31, .flags = R,
     .help = "Deepest msgpack nesting accepted in an engine message."},
};
#undef R
#undef C
#undef I32MAX

#define N_OPTS (sizeof opts / sizeof opts[0])
#define SRC_PREFIX "sources[]"

static bool in_sources(const struct opt *o)
{
    return strncmp(o->key, SRC_PREFIX ".", sizeof SRC_PREFIX) == 0;
}

static const struct opt *find_opt(const char *key)
{
    for (size_t i = 0; i < N_OPTS; i++)
        if (strcmp(opts[i].key, key) == 0)
            return &opts[i];
    return NULL;
}

/* A section is a path that some key lies under ("nats", "nats.jetstream"). */
static bool is_section(const char *path)
{
    size_t n = strlen(path);
    for (size_t i = 0; i < N_OPTS; i++)
        if (strncmp(opts[i].key, path, n) == 0 && opts[i].key[n] == '.')
            return true;
    return false;
}

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */

/* One mark per table row: where the key's value was, if it was present. */
struct mark {
    size_t line, col;
    bool set;
    bool bad; /* present but rejected: skip cross-checks that use it */
};

/* line 0: an error about the whole file ("FILE: message"). */
void kvb_cfg_verr(struct ctx *c, size_t line, size_t col, const char *fmt, va_list ap)
{
    c->nerr++;
    if (!c->err || c->nerr > MAX_ERRORS + 1)
        return;
    if (c->nerr == MAX_ERRORS + 1) {
        fprintf(c->err, "%s: too many errors, not showing the rest\n", c->path);
        return;
    }
    if (line)
        fprintf(c->err, "%s:%zu:%zu: ", c->path, line, col);
    else
        fprintf(c->err, "%s: ", c->path);
    vfprintf(c->err, fmt, ap);
    fputc('\n', c->err);
}

void kvb_cfg_oom(struct ctx *c)
{
    if (!c->oom)
        err_at(c, 0, 0, "out of memory");
    c->oom = true;
}

/* malloc'd printf; NULL when out of memory (reported). */
static char *xasprintf(struct ctx *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static char *xasprintf(struct ctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = n < 0 ? NULL : malloc((size_t)n + 1);
    if (!s) {
        if (c)
            oom(c);
        return NULL;
    }
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

/* A user value made safe for a one-line message: printable ASCII kept (and
 * UTF-8 bytes), controls as \xNN, cut after MAX bytes.  Returns a malloc'd
 * string, or NULL when out of memory (SHOWN() gives a placeholder). */
static char *shown_max(const char *s, size_t len, size_t max)
{
    size_t n = len < max ? len : max;
    char *o = malloc(n * 4 + 4);
    if (!o)
        return NULL;
    char *p = o;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 || ch == 0x7f || ch == '\\') {
            if (ch == '\\') {
                *p++ = '\\';
                *p++ = '\\';
            } else {
                snprintf(p, 5, "\\x%02x", ch);
                p += 4;
            }
        } else {
            *p++ = (char)ch;
        }
    }
    if (n < len)
        p += sprintf(p, "...");
    *p = '\0';
    return o;
}

static char *shown(const char *s, size_t len)
{
    return shown_max(s, len, MAX_SHOWN);
}
#define SHOWN(s) ((s) ? (s) : "?")

/* Free a string of the config, zeroed first (it may be a secret). */
static void str_free(char *s)
{
    if (s) {
        explicit_bzero(s, strlen(s));
        free(s);
    }
}

/* ------------------------------------------------------------------------ */
/* Reading the file                                                          */

static int read_file(struct ctx *c, char **out, size_t *outlen)
{
    int rc;
    size_t cap = 4096, len = 0;
    char *buf = NULL;
    struct stat st;
    /* O_NONBLOCK: a FIFO would otherwise block open() until a writer comes
     * (--check, and the loop thread on SIGHUP); it is refused below. */
    int fd = open(c->path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        rc = -errno;
        goto fail_errno;
    }
    if (fstat(fd, &st) < 0) {
        rc = -errno;
        goto fail_errno;
    }
    if (S_ISDIR(st.st_mode)) {
        rc = -EISDIR; /* what read() says */
        goto fail_errno;
    }
    if (!S_ISREG(st.st_mode)) {
        err_at(c, 0, 0, "not a regular file");
        rc = -EINVAL;
        goto fail;
    }
    buf = malloc(cap);
    if (!buf) {
        rc = -ENOMEM;
        goto fail_errno;
    }
    for (;;) {
        if (len == cap) {
            if (cap > MAX_FILE_BYTES) {
                err_at(c, 0, 0, "file too large (more than %u bytes)", MAX_FILE_BYTES);
                rc = -EINVAL;
                goto fail;
            }
            size_t ncap = cap * 2 > MAX_FILE_BYTES + 1 ? MAX_FILE_BYTES + 1 : cap * 2;
            char *nb = malloc(ncap); /* not realloc: the old copy is zeroed */
            if (!nb) {
                rc = -ENOMEM;
                goto fail_errno;
            }
            memcpy(nb, buf, len);
            explicit_bzero(buf, len);
            free(buf);
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            rc = -errno;
            goto fail_errno;
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    *out = buf;
    *outlen = len;
    return 0;

fail_errno:
    err_at(c, 0, 0, "cannot read: %s", strerror(-rc));
fail:
    if (fd >= 0)
        close(fd);
    if (buf)
        explicit_bzero(buf, len);
    free(buf);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Converting values                                                         */

/* 0 ok, -1 not a decimal integer, -2 negative, -3 above UINT64_MAX. */
static int parse_u64(const char *s, size_t len, uint64_t *out)
{
    size_t i = 0;
    bool neg = false;
    if (len && s[0] == '-') {
        neg = true;
        i = 1;
    }
    if (i == len)
        return -1;
    if (s[i] == '0' && len - i > 1)
        return -1; /* no leading zeros: YAML 1.1 reads them as octal */
    uint64_t v = 0;
    bool big = false;
    for (; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            big = true;
        else
            v = v * 10 + d;
    }
    if (neg)
        return v == 0 && !big ? -1 : -2;
    if (big)
        return -3;
    *out = v;
    return 0;
}

static bool str_eq(const char *a, size_t alen, const char *b)
{
    return alen == strlen(b) && memcmp(a, b, alen) == 0;
}

static int enum_index(const char *const *values, const char *s, size_t len)
{
    for (int i = 0; values[i]; i++)
        if (str_eq(s, len, values[i]))
            return i;
    return -1;
}

/* "a, b or c" into a malloc'd string. */
static char *join_values(struct ctx *c, const char *const *values, const char *last_sep)
{
    size_t n = 0, total = 1;
    while (values[n])
        total += strlen(values[n++]) + strlen(last_sep) + 2;
    char *s = malloc(total);
    if (!s) {
        if (c)
            oom(c);
        return NULL;
    }
    s[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (i)
            strcat(s, i + 1 == n ? last_sep : ", ");
        strcat(s, values[i]);
    }
    return s;
}

/* Convert one scalar for a scalar-typed option into *field.  The field is
 * written only on success.  line 0 = a default (errors name no position). */
static int conv(struct ctx *c, const struct opt *o, const char *dpath, const char *s,
                size_t len, size_t line, size_t col, void *field)
{
    int rc = -1;
    char *v = shown(s, len);
    char *list = NULL;
    uint64_t u = 0;

    switch (o->type) {
    case T_BLOCKSIZE:
        if (str_eq(s, len, "auto")) {
            *(uint32_t *)field = 0;
            rc = 0;
            break;
        }
        /* fall through */
    case T_U64:
    case T_U32: {
        int pr = parse_u64(s, len, &u);
        const char *what = pr == -2 ? "is negative"
                           : pr == -3 ? "is too large"
                           : pr < 0   ? "is not a decimal integer"
                           : (u < o->min || u > o->max) ? "is out of range"
                                                        : NULL;
        if (what) {
            const char *q = pr == 0 ? "" : "'"; /* a number, or the text as written */
            err_at(c, line, col, "%s: %s%s%s %s (expected %" PRIu64 "..%" PRIu64 "%s)",
                   dpath, q, SHOWN(v), q, what, o->min, o->max,
                   o->type == T_BLOCKSIZE ? " or \"auto\"" : "");
            break;
        }
        if (o->type == T_U64)
            *(uint64_t *)field = u;
        else
            *(uint32_t *)field = (uint32_t)u;
        rc = 0;
        break;
    }
    case T_BOOL:
        if (str_eq(s, len, "true") || str_eq(s, len, "True") || str_eq(s, len, "TRUE")) {
            *(bool *)field = true;
            rc = 0;
        } else if (str_eq(s, len, "false") || str_eq(s, len, "False") ||
                   str_eq(s, len, "FALSE")) {
            *(bool *)field = false;
            rc = 0;
        } else {
            err_at(c, line, col, "%s: '%s' is not a boolean (expected true or false)",
                   dpath, SHOWN(v));
        }
        break;
    case T_ENUM: {
        int i = enum_index(o->values, s, len);
        if (i < 0) {
            list = join_values(c, o->values, " or ");
            err_at(c, line, col, "%s: '%s' is not one of %s", dpath, SHOWN(v),
                   list ? list : "the allowed values");
            break;
        }
        *(int *)field = i;
        rc = 0;
        break;
    }
    case T_STR: {
        if (memchr(s, '\0', len)) {
            err_at(c, line, col, "%s: the string contains a NUL character", dpath);
            break;
        }
        char *d = strndup(s, len);
        if (!d) {
            oom(c);
            break;
        }
        str_free(*(char **)field);
        *(char **)field = d;
        rc = 0;
        break;
    }
    default:
        break;
    }
    free(list);
    free(v);
    return rc;
}

/* One element of a list option (nats.servers[i], forward_tiers[i]). */
static int conv_item(struct ctx *c, const struct opt *o, const char *dpath, size_t i,
                     const char *s, size_t len, size_t line, size_t col, char **str,
                     uint32_t *mask)
{
    int rc = -1;
    char *ipath = xasprintf(c, "%s[%zu]", dpath, i);
    char *v = shown(s, len);
    char *list = NULL;
    if (!ipath)
        goto out;
    if (o->type == T_TIERS) {
        int t = enum_index(o->values, s, len);
        if (t < 0) {
            list = join_values(c, o->values, " or ");
            err_at(c, line, col, "%s: '%s' is not a storage tier (expected %s)", ipath,
                   SHOWN(v), list ? list : "a tier");
        } else if (*mask & (1u << t)) {
            err_at(c, line, col, "%s: tier '%s' is listed twice", ipath, SHOWN(v));
        } else {
            *mask |= 1u << t;
            rc = 0;
        }
    } else {
        if (len == 0) {
            err_at(c, line, col, "%s: must not be empty", ipath);
        } else {
            struct opt so = *o;
            so.type = T_STR;
            rc = conv(c, &so, ipath, s, len, line, col, str);
        }
    }
out:
    free(list);
    free(v);
    free(ipath);
    return rc;
}

static void free_strlist(char **list, size_t n)
{
    if (!list)
        return;
    for (size_t i = 0; i < n; i++)
        free(list[i]);
    free(list);
}

/* Defaults for every key in one scope (the config, or one source). */
static int apply_defaults(struct ctx *c, void *base, bool sources_scope)
{
    int rc = 0;
    for (size_t i = 0; i < N_OPTS; i++) {
        const struct opt *o = &opts[i];
        void *field = (char *)base + o->off;
        if (in_sources(o) != sources_scope || (o->flags & F_REQUIRED))
            continue;
        if (o->type == T_STRLIST || o->type == T_TIERS) {
            /* comma-separated */
            size_t n = *o->def ? 1 : 0; /* "" is the empty list */
            for (const char *p = o->def; *p; p++)
                n += *p == ',';
            char **list = o->type == T_STRLIST ? calloc(n, sizeof *list) : NULL;
            uint32_t mask = 0;
            if (o->type == T_STRLIST && !list) {
                oom(c);
                rc = -1;
                continue;
            }
            const char *p = o->def;
            for (size_t k = 0; k < n; k++) {
                size_t len = strcspn(p, ",");
                if (conv_item(c, o, o->key, k, p, len, 0, 0, list ? &list[k] : NULL,
                              &mask) < 0)
                    rc = -1;
                p += len + (p[len] == ',');
            }
            if (o->type == T_STRLIST) {
                size_t *np = (size_t *)((char *)base + o->noff);
                free_strlist(*(char ***)field, *np);
                *(char ***)field = list;
                *np = n;
            } else {
                *(uint32_t *)field = mask;
            }
        } else if (o->type != T_SOURCES) {
            if (conv(c, o, o->key, o->def, strlen(o->def), 0, 0, field) < 0)
                rc = -1;
        }
    }
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Checks (one value) and cross-checks                                       */

static bool has_prefix(const char *s, const char *p)
{
    return strncmp(s, p, strlen(p)) == 0;
}

static int check_endpoint(struct ctx *c, const struct opt *o, const char *dpath,
                          const void *field, const struct node *v)
{
    (void)o;
    const char *s = *(char *const *)field;
    static const char *const schemes[] = {"tcp://", "ipc://", "inproc://"};
    for (size_t i = 0; i < 3; i++)
        if (has_prefix(s, schemes[i]) && s[strlen(schemes[i])] != '\0')
            return 0;
    char *sv = shown(s, strlen(s));
    err_at(c, v->line, v->col,
           "%s: '%s' is not a ZMQ endpoint (expected tcp://, ipc:// or inproc://...)",
           dpath, SHOWN(sv));
    free(sv);
    return -1;
}

static int check_opt_endpoint(struct ctx *c, const struct opt *o, const char *dpath,
                              const void *field, const struct node *v)
{
    if (**(char *const *)field == '\0')
        return 0;
    return check_endpoint(c, o, dpath, field, v);
}

static int check_word(struct ctx *c, const struct opt *o, const char *dpath,
                      const void *field, const struct node *v)
{
    (void)o;
    const char *s = *(char *const *)field;
    if (*s == '\0') {
        err_at(c, v->line, v->col, "%s: must not be empty", dpath);
        return -1;
    }
    if (strpbrk(s, " \t\r\n")) {
        err_at(c, v->line, v->col, "%s: must not contain white space", dpath);
        return -1;
    }
    return 0;
}

/* Every '{' of s starts one of the first n placeholders of {namespace}
 * {component} {worker_id} {dp_rank} (subject.h checks); expected lists them
 * for the error. */
static int check_placeholders(struct ctx *c, const char *dpath, const char *s,
                              const struct node *v, size_t n, const char *expected)
{
    static const unsigned bits[] = {KVB_PH_NAMESPACE, KVB_PH_COMPONENT, KVB_PH_WORKER_ID,
                                    KVB_PH_DP_RANK, KVB_PH_ENDPOINT};
    unsigned allowed = 0;
    size_t off = 0, len = 0;
    for (size_t i = 0; i < n && i < sizeof(bits) / sizeof(bits[0]); i++)
        allowed |= bits[i];
    if (kvb_subject_check(s, allowed, &off, &len) == 0)
        return 0;
    char *sv = shown(s + off, len);
    err_at(c, v->line, v->col, "%s: unknown placeholder '%s' (expected %s)", dpath, SHOWN(sv),
           expected);
    free(sv);
    return -1;
}

static int check_subject(struct ctx *c, const struct opt *o, const char *dpath,
                         const void *field, const struct node *v)
{
    if (check_word(c, o, dpath, field, v) < 0)
        return -1;
    return check_placeholders(c, dpath, *(char *const *)field, v, 5,
                              "{namespace}, {component}, {endpoint}, {worker_id} or {dp_rank}");
}

static int check_format(struct ctx *c, const struct opt *o, const char *dpath,
                        const void *field, const struct node *v)
{
    (void)c, (void)o, (void)dpath, (void)field, (void)v;
    return 0; /* every value; the combinations: check_output() */
}

/* An etcd gateway URL: http:// or https:// and a host. */
static int check_etcd_url(struct ctx *c, const struct opt *o, const char *dpath,
                          const void *field, const struct node *v)
{
    const char *s = *(char *const *)field;
    if (check_word(c, o, dpath, field, v) < 0)
        return -1;
    const char *rest = has_prefix(s, "http://") ? s + 7 : has_prefix(s, "https://") ? s + 8 : NULL;
    if (rest && *rest && *rest != '/')
        return 0;
    char *sv = shown(s, strlen(s));
    err_at(c, v->line, v->col, "%s: '%s' is not an etcd URL (expected http://HOST:PORT or "
           "https://HOST:PORT)", dpath, SHOWN(sv));
    free(sv);
    return -1;
}

/* PORT of "...:PORT" (last colon), or -1 when not a number in 0..65535. */
static long port_of(const char *s)
{
    const char *colon = strrchr(s, ':');
    if (!colon || colon[1] == '\0' || strlen(colon + 1) > 5)
        return -1;
    long port = 0;
    for (const char *p = colon + 1; *p; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        port = port * 10 + (*p - '0');
    }
    return port <= 65535 ? port : -1;
}

/* HOST:PORT as src/http.c binds it: HOST a numeric IPv4 or IPv6 address
 * (in brackets, or bare), PORT 1..65535.  NULL when good, else why not. */
static const char *bad_listen(const char *s)
{
    char host[128];
    const char *hs = s, *he = strrchr(s, ':');
    if (s[0] == '[') {
        const char *e = strchr(s, ']');
        if (!e || e[1] != ':')
            return "a bracketed IPv6 address needs ]:PORT after it";
        hs = s + 1;
        he = e;
    }
    long port = port_of(s);
    if (port == 0)
        return "port 0 is not a port to scrape (expected 1..65535)";
    if ((size_t)(he - hs) >= sizeof host)
        return "the host is too long";
    memcpy(host, hs, (size_t)(he - hs));
    host[he - hs] = '\0';
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV,
                             .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    int r = getaddrinfo(host, "1", &hints, &ai);
    if (ai)
        freeaddrinfo(ai);
    return r == 0 ? NULL : "the host must be a numeric IPv4 or IPv6 address";
}

static int check_listen(struct ctx *c, const struct opt *o, const char *dpath,
                        const void *field, const struct node *v)
{
    (void)o;
    const char *s = *(char *const *)field, *why = NULL;
    if (*s == '\0')
        return 0;
    const char *colon = strrchr(s, ':');
    if (colon && colon != s && port_of(s) >= 0 && !strpbrk(s, " \t\r\n") &&
        !(why = bad_listen(s)))
        return 0;
    char *sv = shown(s, strlen(s));
    if (why)
        err_at(c, v->line, v->col, "%s: '%s': %s", dpath, SHOWN(sv), why);
    else
        err_at(c, v->line, v->col, "%s: '%s' is not HOST:PORT (or \"\" to disable)", dpath,
               SHOWN(sv));
    free(sv);
    return -1;
}

/* nats.servers[i]: [SCHEME://][USER[:PASSWORD]@]HOST[:PORT][/...], PORT
 * 1..65535 when given.  The URL may hold a password or token: only the
 * port is quoted. */
static int check_server_url(struct ctx *c, const struct opt *o, const char *dpath,
                            const void *field, const struct node *v)
{
    (void)o;
    const char *s = *(char *const *)field;
    const char *p = strstr(s, "://");
    p = p ? p + 3 : s;
    size_t n = strcspn(p, "/?#");
    const char *at = memrchr(p, '@', n);
    if (at) {
        n -= (size_t)(at + 1 - p);
        p = at + 1;
    }
    const char *end = p + n, *port = NULL;
    if (*p == '[') {
        const char *e = memchr(p, ']', n);
        if (e && e + 1 < end && e[1] == ':')
            port = e + 2;
        else if (!e || e + 1 != end) {
            err_at(c, v->line, v->col, "%s: a bracketed IPv6 host needs ']' and then "
                   "nothing or :PORT", dpath);
            return -1;
        }
    } else {
        const char *colon = memrchr(p, ':', n);
        port = colon ? colon + 1 : NULL;
    }
    if (!port)
        return 0;
    size_t plen = (size_t)(end - port), i = 0;
    unsigned long num = 0;
    while (i < plen && i < 6 && port[i] >= '0' && port[i] <= '9')
        num = num * 10 + (unsigned long)(port[i++] - '0');
    if (plen > 0 && i == plen && num >= 1 && num <= 65535)
        return 0;
    char *sv = shown(port, plen);
    err_at(c, v->line, v->col, "%s: port '%s' is not a number in 1..65535", dpath,
           SHOWN(sv));
    free(sv);
    return -1;
}

static size_t opt_index(const char *key)
{
    const struct opt *o = find_opt(key);
    return (size_t)(o - opts);
}

static int check_host(struct ctx *c, const struct opt *o, const char *dpath,
                      const void *field, const struct node *v)
{
    (void)o;
    const char *s = *(char *const *)field;
    if (!strpbrk(s, " \t\r\n/"))
        return 0;
    err_at(c, v->line, v->col, "%s: must be a host name (no white space or '/')", dpath);
    return -1;
}

/* nats.jetstream.stream and .subject: "" or text without white space whose
 * placeholders are {namespace}, {component} or {worker_id}. */
static int check_js_template(struct ctx *c, const struct opt *o, const char *dpath,
                             const void *field, const struct node *v)
{
    const char *s = *(char *const *)field;
    (void)o;
    if (strpbrk(s, " \t\r\n")) {
        err_at(c, v->line, v->col, "%s: must not contain white space", dpath);
        return -1;
    }
    return check_placeholders(c, dpath, s, v, 3, "{namespace}, {component} or {worker_id}");
}

/* ------------------------------------------------------------------------ */
/* Files named by the configuration                                          */

/* A relative NAME is looked up in $CREDENTIALS_DIRECTORY when that is set
 * (systemd's LoadCredential=), otherwise in the directory of the config
 * file.  malloc'd; NULL when out of memory (reported). */
static char *resolve_path(struct ctx *c, const char *name)
{
    char *p = kvb_secret_path(name, c->creds_dir, c->path);
    if (!p)
        oom(c);
    return p;
}

/* Open PATH and check that it is a regular file: the fd, or -1 (reported). */
static int open_named(struct ctx *c, const struct opt *o, const char *path,
                      const char *where, const struct mark *m)
{
    char *sp = shown_max(path, strlen(path), MAX_SHOWN_PATH);
    int fd = kvb_secret_open(path);
    if (fd == -EINVAL)
        err_at(c, m->line, m->col, "%s: '%s'%s is not a regular file", o->key, SHOWN(sp),
               where);
    else if (fd < 0)
        err_at(c, m->line, m->col, "%s: cannot read '%s'%s: %s", o->key, SHOWN(sp), where,
               strerror(-fd));
    free(sp);
    return fd < 0 ? -1 : fd;
}

/* Read a secret from PATH into *out (malloc'd), as kvb_secret_read_fd() with
 * FLAGS does.  0, or -1 (reported; the content is never shown). */
static int read_secret(struct ctx *c, const struct opt *o, const char *path,
                       const char *where, const struct mark *m, unsigned flags, char **out)
{
    const char *why = NULL;
    int fd = open_named(c, o, path, where, m);
    if (fd < 0)
        return -1;
    int rc = kvb_secret_read_fd(fd, flags, out, &why);
    close(fd);
    if (rc == -ENOMEM) {
        oom(c);
    } else if (rc < 0) {
        char *sp = shown_max(path, strlen(path), MAX_SHOWN_PATH);
        err_at(c, m->line, m->col, "%s: cannot use '%s'%s: %s", o->key, SHOWN(sp), where,
               why ? why : strerror(-rc));
        free(sp);
    }
    return rc < 0 ? -1 : 0;
}

/* Every F_PATH key that is set: resolve the name (the field gets the
 * result), then read the secret it .fills, or check that the file is
 * readable. */
static void resolve_files(struct ctx *c, struct kvb_config *cfg, struct mark *m)
{
    for (size_t i = 0; i < N_OPTS; i++) {
        const struct opt *o = &opts[i];
        char **field = (char **)((char *)cfg + o->off);
        if (!(o->flags & F_PATH) || m[i].bad || !*field || !**field)
            continue;
        const char *where = (*field)[0] != '/' && c->creds_dir
                                ? " (in $CREDENTIALS_DIRECTORY)" : "";
        char *path = resolve_path(c, *field);
        if (!path)
            return;
        str_free(*field);
        *field = path;
        if (o->fills) {
            size_t t = opt_index(o->fills);
            char **target = (char **)((char *)cfg + opts[t].off);
            char *secret = NULL;
            if (m[t].set && (m[t].bad || **target)) {
                err_at(c, m[i].line, m[i].col, "%s: %s is set too (at %zu:%zu): use one "
                       "of them", o->key, o->fills, m[t].line, m[t].col);
                m[i].bad = true;
            } else if (read_secret(c, o, path, where, &m[i],
                                   /* a seed is checked; a password or token is one line */
                                   strcmp(o->fills, "nats.nkey_seed") == 0
                                       ? KVB_SECRET_TRIM : KVB_SECRET_ONE_LINE,
                                   &secret) < 0) {
                m[i].bad = true;
            } else {
                str_free(*target);
                *target = secret;
            }
        } else {
            int fd = open_named(c, o, path, where, &m[i]);
            if (fd < 0)
                m[i].bad = true;
            else
                close(fd);
        }
    }
}

/* A key written in the file with a value other than "" (or a bad one). */
static bool present(const struct kvb_config *cfg, const struct mark *m, const char *key)
{
    size_t i = opt_index(key);
    const char *v = *(char *const *)((const char *)cfg + opts[i].off);
    return m[i].set && (m[i].bad || (v && *v));
}

static bool before(const struct mark *a, const struct mark *b)
{
    return a->line < b->line || (a->line == b->line && a->col < b->col);
}

/* At most one authentication method, each one complete; the NKey seed is
 * valid and gives nkey_public. */
static void check_auth(struct ctx *c, struct kvb_config *cfg, const struct mark *m)
{
    static const char *const methods[][3] = {
        {"nats.credentials"},
        {"nats.user", "nats.password", "nats.password_file"},
        {"nats.token", "nats.token_file"},
        {"nats.nkey_seed", "nats.nkey_seed_file"},
    };
    enum { NM = sizeof methods / sizeof methods[0] };
    const struct mark *first[NM] = {0}; /* earliest key of each method present */
    const char *first_key[NM] = {0};
    const struct mark *winner = NULL;
    size_t wi = 0;

    for (size_t i = 0; i < NM; i++) {
        for (size_t k = 0; k < 3 && methods[i][k]; k++) {
            const struct mark *mk = &m[opt_index(methods[i][k])];
            if (present(cfg, m, methods[i][k]) && (!first[i] || before(mk, first[i]))) {
                first[i] = mk;
                first_key[i] = methods[i][k];
            }
        }
        if (first[i] && (!winner || before(first[i], winner))) {
            winner = first[i];
            wi = i;
        }
    }
    /* the others, in the order of the file */
    for (const struct mark *last = winner;;) {
        size_t next = NM;
        for (size_t i = 0; i < NM; i++)
            if (first[i] && before(last, first[i]) &&
                (next == NM || before(first[i], first[next])))
                next = i;
        if (next == NM)
            break;
        err_at(c, first[next]->line, first[next]->col,
               "%s: only one authentication method may be set, and %s (at %zu:%zu) is "
               "set already",
               first_key[next], first_key[wi], winner->line, winner->col);
        last = first[next];
    }

    /* user and password go together (when that is the method) */
    bool user = present(cfg, m, "nats.user");
    const char *pw = present(cfg, m, "nats.password")        ? "nats.password"
                     : present(cfg, m, "nats.password_file") ? "nats.password_file"
                                                             : NULL;
    if (!winner || wi == 1) {
        if (user && !pw) {
            const struct mark *mu = &m[opt_index("nats.user")];
            err_at(c, mu->line, mu->col,
                   "nats.user: needs nats.password or nats.password_file");
        } else if (pw && !user) {
            const struct mark *mp = &m[opt_index(pw)];
            err_at(c, mp->line, mp->col, "%s: needs nats.user", pw);
        }
    }

    /* the seed */
    const char *seed = cfg->nats.nkey_seed;
    bool from_file = present(cfg, m, "nats.nkey_seed_file");
    const struct mark *ms = &m[opt_index(from_file ? "nats.nkey_seed_file" : "nats.nkey_seed")];
    char pub[KVB_NKEY_PUB_CHARS + 1];
    if (seed && *seed && !ms->bad) {
        const char *why = kvb_secret_nkey_public(seed, pub);
        if (why && from_file) {
            char *sp = shown_max(cfg->nats.nkey_seed_file, strlen(cfg->nats.nkey_seed_file),
                                 MAX_SHOWN_PATH);
            err_at(c, ms->line, ms->col, "nats.nkey_seed_file: '%s' does not hold an NKey "
                   "user seed: %s", SHOWN(sp), why);
            free(sp);
        } else if (why) {
            err_at(c, ms->line, ms->col, "nats.nkey_seed: not an NKey user seed: %s", why);
        } else if (!(cfg->nats.nkey_public = strdup(pub))) {
            oom(c);
        }
    }
}

/* TLS: on with tls:// URLs; its files only when it is on; cert with key. */
static void check_tls(struct ctx *c, struct kvb_config *cfg, const struct mark *m)
{
    const struct mark *ms = &m[opt_index("nats.servers")];
    const struct mark *me = &m[opt_index("nats.tls.enabled")];
    const struct mark *mv = &m[opt_index("nats.tls.verify")];
    size_t tls_url = SIZE_MAX;
    if (ms->bad)
        return;
    for (size_t i = 0; i < cfg->nats.n_servers && tls_url == SIZE_MAX; i++)
        if (strncasecmp(cfg->nats.servers[i], "tls://", 6) == 0)
            tls_url = i;
    if (tls_url != SIZE_MAX) {
        if (me->set && !me->bad && !cfg->nats.tls.enabled)
            err_at(c, me->line, me->col, "nats.tls.enabled: false, but nats.servers[%zu] "
                   "is a tls:// URL", tls_url);
        cfg->nats.tls.enabled = true;
    }
    static const char *const needs_tls[] = {"nats.tls.ca", "nats.tls.cert", "nats.tls.key",
                                            "nats.tls.server_name"};
    for (size_t i = 0; i < 4 && !cfg->nats.tls.enabled; i++) {
        const struct mark *mk = &m[opt_index(needs_tls[i])];
        if (present(cfg, m, needs_tls[i]))
            err_at(c, mk->line, mk->col, "%s: TLS is not enabled (set nats.tls.enabled: "
                   "true, or use tls:// server URLs)", needs_tls[i]);
    }
    if (!cfg->nats.tls.enabled)
        return;
    bool cert = present(cfg, m, "nats.tls.cert"), key = present(cfg, m, "nats.tls.key");
    if (cert != key) {
        const char *k = cert ? "nats.tls.cert" : "nats.tls.key";
        const struct mark *mk = &m[opt_index(k)];
        err_at(c, mk->line, mk->col, "%s: needs %s too", k,
               cert ? "nats.tls.key" : "nats.tls.cert");
    }
    if (present(cfg, m, "nats.tls.server_name") && !cfg->nats.tls.verify && !mv->bad) {
        const struct mark *mk = &m[opt_index("nats.tls.server_name")];
        err_at(c, mk->line, mk->col, "nats.tls.server_name: has no effect with "
               "nats.tls.verify: false");
    }
}

/* Every tcp:// endpoint has a port ZMQ can use: 1..65535, or * (any) for the
 * endpoint of a bind-mode source without dp_size expansion.  dp_size > 1:
 * every endpoint is tcp://HOST:PORT with room for the expansion. */
static void check_source(struct ctx *c, const struct kvb_source_cfg *s, size_t i,
                         const struct mark *m)
{
    const struct mark *msize = &m[opt_index("sources[].dp_size")];
    const struct mark *mrank = &m[opt_index("sources[].dp_rank")];
    const struct mark *mend = &m[opt_index("sources[].endpoint")];
    const struct mark *mrep = &m[opt_index("sources[].replay_endpoint")];
    const char *eps[2] = {s->endpoint, s->replay_endpoint};
    const struct mark *ms[2] = {mend, mrep};
    const char *names[2] = {"endpoint", "replay_endpoint"};
    bool expand = s->dp_size > 1 && !msize->bad;

    for (size_t k = 0; k < 2; k++) {
        if (!eps[k] || !has_prefix(eps[k], "tcp://") || ms[k]->bad)
            continue;
        const char *colon = strrchr(eps[k] + 6, ':');
        long port = port_of(eps[k]);
        bool any = colon && strcmp(colon, ":*") == 0 && k == 0 && !expand &&
                   s->mode == KVB_MODE_BIND && !m[opt_index("sources[].mode")].bad;
        if (port == 0 || (port < 0 && !expand && !any)) {
            char *sv = shown(eps[k], strlen(eps[k]));
            err_at(c, ms[k]->line, ms[k]->col, "sources[%zu].%s: '%s' needs a port in "
                   "1..65535 (tcp://HOST:PORT)", i, names[k], SHOWN(sv));
            free(sv);
        }
    }
    if (expand) {
        for (size_t k = 0; k < 2; k++) {
            if (!eps[k] || !*eps[k] || ms[k]->bad)
                continue;
            long port = has_prefix(eps[k], "tcp://") ? port_of(eps[k]) : -1;
            if (port == 0)
                continue; /* reported above */
            if (port < 0)
                err_at(c, msize->line, msize->col,
                       "sources[%zu].dp_size: %" PRIu32 " needs sources[%zu].%s to be "
                       "tcp://HOST:PORT with a numeric port",
                       i, s->dp_size, i, names[k]);
            else if ((uint64_t)port + s->dp_size - 1 > 65535)
                err_at(c, msize->line, msize->col,
                       "sources[%zu].dp_size: %" PRIu32
                       " ports from %ld (sources[%zu].%s) go past 65535",
                       i, s->dp_size, port, i, names[k]);
        }
    }
    if ((uint64_t)s->dp_rank + s->dp_size - 1 > UINT32_MAX && !mrank->bad)
        err_at(c, mrank->line, mrank->col,
               "sources[%zu].dp_rank: %" PRIu32 " + dp_size %" PRIu32
               " goes past %" PRIu32,
               i, s->dp_rank, s->dp_size, UINT32_MAX);
}

/* ---- ZMQ CURVE keys (sources[].curve) ---------------------------------- */

/* Source key K written in the file with a value other than "" (or a bad one). */
static bool src_present(const struct kvb_source_cfg *s, const struct mark *m, size_t k)
{
    const char *v = *(char *const *)((const char *)s + opts[k].off);
    return m[k].set && (m[k].bad || (v && *v));
}

/* Resolve the file name in the source key K of source I (the field gets the
 * result) and read the file: 0 and *text (malloc'd; zero it when done), or
 * -1 (reported). */
static int read_source_file(struct ctx *c, struct kvb_source_cfg *s, size_t i, size_t k,
                            const struct mark *m, char **text)
{
    char **field = (char **)((char *)s + opts[k].off);
    const char *where = (*field)[0] != '/' && c->creds_dir ? " (in $CREDENTIALS_DIRECTORY)"
                                                            : "";
    char *path = resolve_path(c, *field);
    char *key = xasprintf(c, "sources[%zu].%s", i, opts[k].key + sizeof SRC_PREFIX);
    int rc = -1;
    if (path && key) {
        str_free(*field);
        *field = path;
        path = NULL;
        struct opt so = opts[k];
        so.key = key;
        rc = read_secret(c, &so, *field, where, &m[k], 0, text);
    }
    free(path);
    free(key);
    return rc;
}

/* Error about the content of the file named in source key K (never quoted). */
static void file_content_err(struct ctx *c, const struct kvb_source_cfg *s, size_t i, size_t k,
                             const struct mark *m, const char *what)
{
    const char *path = *(char *const *)((const char *)s + opts[k].off);
    char *sp = shown_max(path, strlen(path), MAX_SHOWN_PATH);
    err_at(c, m[k].line, m[k].col, "sources[%zu].%s: '%s' %s", i,
           opts[k].key + sizeof SRC_PREFIX, SHOWN(sp), what);
    free(sp);
}

/* The secret key file: one line of 40 Z85 characters. */
static void read_curve_secret(struct ctx *c, struct kvb_source_cfg *s, size_t i, size_t k,
                              struct mark *m)
{
    char *text = NULL;
    if (read_source_file(c, s, i, k, m, &text) < 0) {
        m[k].bad = true;
        return;
    }
    char why[128];
    if (kvb_secret_curve_secret(text, s->curve.secret_key, why, sizeof why) < 0) {
        char what[192];
        snprintf(what, sizeof what, "does not hold a CURVE secret key: %s", why);
        file_content_err(c, s, i, k, m, what);
        m[k].bad = true;
    }
    explicit_bzero(text, strlen(text));
    free(text);
}

/* The allowed clients file: public keys, one per line. */
static void read_curve_allowed(struct ctx *c, struct kvb_source_cfg *s, size_t i, size_t k,
                               struct mark *m)
{
    char *text = NULL;
    if (read_source_file(c, s, i, k, m, &text) < 0) {
        m[k].bad = true;
        return;
    }
    const char *p = text, *line;
    size_t lineno = 0, len, n = 0, cap = 0;
    uint8_t(*keys)[32] = NULL;
    while (kvb_secret_next_line(&p, &lineno, &line, &len)) {
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            uint8_t(*nk)[32] = realloc(keys, cap * sizeof *keys);
            if (!nk) {
                oom(c);
                break;
            }
            keys = nk;
        }
        if (!kvb_secret_z85_key(line, len, keys[n])) {
            char what[96];
            snprintf(what, sizeof what, "line %zu: not a CURVE public key (40 Z85 characters)",
                     lineno);
            file_content_err(c, s, i, k, m, what);
            m[k].bad = true;
        } else {
            n++;
        }
    }
    if (n == 0 && !m[k].bad) {
        file_content_err(c, s, i, k, m, "lists no key (\"\" allows any client)");
        m[k].bad = true;
    }
    if (m[k].bad) {
        free(keys);
    } else {
        s->curve.allowed = keys;
        s->curve.n_allowed = n;
    }
    explicit_bzero(text, strlen(text));
    free(text);
}

/* sources[].curve: keys for the source's mode, the files read and checked. */
static void check_curve(struct ctx *c, struct kvb_source_cfg *s, size_t i, struct mark *m)
{
    size_t ik = opt_index("sources[].curve.secret_key_file");
    size_t is = opt_index("sources[].curve.server_public_key");
    size_t ia = opt_index("sources[].curve.allowed_clients_file");
    bool mode_ok = !m[opt_index("sources[].mode")].bad;
    bool bind = s->mode == KVB_MODE_BIND;
    bool key = src_present(s, m, ik), srv = src_present(s, m, is),
         allow = src_present(s, m, ia);

    if (srv && bind && mode_ok) {
        err_at(c, m[is].line, m[is].col, "sources[%zu].curve.server_public_key: only for "
               "mode: connect (engines connect to a bind-mode source with its public key)", i);
        m[is].bad = true;
    }
    if (allow && !bind && mode_ok) {
        err_at(c, m[ia].line, m[ia].col, "sources[%zu].curve.allowed_clients_file: only for "
               "mode: bind", i);
        m[ia].bad = true;
    }
    for (size_t k = 0; k < 2 && !key; k++) {
        size_t at = k ? ia : is;
        if ((k ? allow : srv) && !m[at].bad) {
            err_at(c, m[at].line, m[at].col, "sources[%zu].%s: needs "
                   "sources[%zu].curve.secret_key_file (CURVE is off without it)",
                   i, opts[at].key + sizeof SRC_PREFIX, i);
            m[at].bad = true;
        }
    }
    if (key && !m[ik].bad && s->endpoint && has_prefix(s->endpoint, "inproc://")) {
        err_at(c, m[ik].line, m[ik].col, "sources[%zu].curve.secret_key_file: ZMQ has no "
               "CURVE on inproc:// endpoints (use ipc:// or tcp://)", i);
        m[ik].bad = true;
    }
    if (key && !bind && !srv && mode_ok && !m[ik].bad)
        err_at(c, m[ik].line, m[ik].col, "sources[%zu].curve.secret_key_file: mode connect "
               "needs sources[%zu].curve.server_public_key (the engine's public key) too",
               i, i);
    if (srv && !m[is].bad &&
        !kvb_secret_z85_key(s->curve.server_public_key, strlen(s->curve.server_public_key),
                 s->curve.server_key)) {
        err_at(c, m[is].line, m[is].col, "sources[%zu].curve.server_public_key: not a CURVE "
               "public key (40 Z85 characters)", i);
        m[is].bad = true;
    }
    if (key && !m[ik].bad)
        read_curve_secret(c, s, i, ik, m);
    if (allow && !m[ia].bad)
        read_curve_allowed(c, s, i, ia, m);
    s->curve.enabled = key;
}

static void curve_wipe(struct kvb_curve_cfg *cv)
{
    explicit_bzero(cv->secret_key, sizeof cv->secret_key);
    free(cv->allowed);
    cv->allowed = NULL;
    cv->n_allowed = 0;
}

/* TMPL with {namespace}, {component} and {worker_id} replaced (malloc'd; NULL
 * when out of memory, reported).  The templates were checked already. */
static char *js_expand(struct ctx *c, const char *tmpl, const struct kvb_config *cfg)
{
    char num[24];
    snprintf(num, sizeof num, "%" PRIu64, cfg->worker_id);
    const char *vals[3] = {cfg->nats.namespace_ ? cfg->nats.namespace_ : "",
                           cfg->nats.component ? cfg->nats.component : "", num};
    static const char *const names[3] = {"{namespace}", "{component}", "{worker_id}"};
    char *out = NULL;
    size_t len = 0;
    for (int pass = 0; pass < 2; pass++) {
        size_t n = 0;
        for (const char *p = tmpl; *p;) {
            size_t k = 0;
            while (k < 3 && !has_prefix(p, names[k]))
                k++;
            const char *v = k < 3 ? vals[k] : p;
            size_t vl = k < 3 ? strlen(v) : 1;
            if (out)
                memcpy(out + n, v, vl);
            n += vl;
            p += k < 3 ? strlen(names[k]) : 1;
        }
        if (out) {
            out[n] = '\0';
            break;
        }
        len = n;
        if (!(out = malloc(len + 1))) {
            oom(c);
            return NULL;
        }
    }
    return out;
}

#define JS_NAME_MAX 255

/* Why NAME is not a usable stream name (NULL: it is). */
static const char *bad_stream_name(const char *name)
{
    if (!*name)
        return "is empty";
    if (strlen(name) > JS_NAME_MAX)
        return "is longer than 255 bytes";
    for (const char *p = name; *p; p++)
        if ((unsigned char)*p <= ' ' || *p == 0x7f || strchr(".*>/\\", *p))
            return "contains one of . * > / \\, white space or a control character";
    return NULL;
}

/* Why SUBJ cannot be published to (NULL: it can). */
static const char *bad_pub_subject(const char *subj)
{
    if (!*subj)
        return "is empty";
    if (strlen(subj) > JS_NAME_MAX)
        return "is longer than 255 bytes";
    if (subj[0] == '.' || subj[strlen(subj) - 1] == '.' || strstr(subj, ".."))
        return "has an empty token";
    for (const char *p = subj; *p; p++)
        if ((unsigned char)*p <= ' ' || *p == 0x7f || *p == '*' || *p == '>')
            return "contains a wildcard (* or >), white space or a control character";
    return NULL;
}

/* nats.jetstream: resolve the stream name and the subject; when enabled, they
 * must be usable, and the duplicate window must fit in max_age_s. */
static void check_jetstream(struct ctx *c, struct kvb_config *cfg, const struct mark *m)
{
    const struct mark *ms = &m[opt_index("nats.jetstream.stream")];
    const struct mark *mj = &m[opt_index("nats.jetstream.subject")];
    const struct mark *me = &m[opt_index("nats.jetstream.enabled")];
    const struct mark *md = &m[opt_index("nats.jetstream.duplicate_window_s")];
    const struct mark *ma = &m[opt_index("nats.jetstream.max_age_s")];
    const char *stream = cfg->nats.jetstream.stream, *subject = cfg->nats.jetstream.subject;
    char *name = NULL, *subj = NULL, *tmpl = NULL;

    if (ms->bad || mj->bad || !stream || !subject)
        return;
    name = js_expand(c, *stream ? stream
                                : "namespace-{namespace}-component-{component}-kv-events",
                     cfg);
    if (name && !*subject)
        tmpl = xasprintf(c, "%s.queue", name);
    subj = name && (tmpl || *subject) ? js_expand(c, tmpl ? tmpl : subject, cfg) : NULL;
    free(tmpl);
    if (!name || !subj)
        goto out;
    if (cfg->nats.jetstream.enabled) {
        const char *why;
        const struct mark *at;
        char *sv;
        if ((why = bad_stream_name(name))) {
            at = ms->set ? ms : me;
            sv = shown(name, strlen(name));
            err_at(c, at->line, at->col, "nats.jetstream.stream: '%s' %s", SHOWN(sv), why);
            free(sv);
        }
        if ((why = bad_pub_subject(subj))) {
            at = mj->set ? mj : ms->set ? ms : me;
            sv = shown(subj, strlen(subj));
            err_at(c, at->line, at->col, "nats.jetstream.subject: '%s' %s", SHOWN(sv), why);
            free(sv);
        }
        uint32_t age = cfg->nats.jetstream.max_age_s, win = cfg->nats.jetstream.duplicate_window_s;
        if (age > 0 && win > age && !md->bad && !ma->bad) {
            at = md->set ? md : ma;
            err_at(c, at->line, at->col,
                   "nats.jetstream.duplicate_window_s: %" PRIu32 " is more than "
                   "nats.jetstream.max_age_s (%" PRIu32 ")",
                   win, age);
        }
    }
    cfg->nats.jetstream.stream_name = name;
    cfg->nats.jetstream.subject_name = subj;
    name = subj = NULL;
out:
    free(name);
    free(subj);
}

/* worker_id_file: not with worker_id; its content is the id. */
static void check_worker_id_file(struct ctx *c, struct kvb_config *cfg, struct mark *m)
{
    size_t f = opt_index("worker_id_file"), w = opt_index("worker_id");
    const char *path = cfg->worker_id_file;
    char *text = NULL;
    if (!present(cfg, m, "worker_id_file") || m[f].bad)
        return;
    if (m[w].set) {
        err_at(c, m[f].line, m[f].col, "worker_id_file: worker_id is set too (at %zu:%zu): "
               "use one of them", m[w].line, m[w].col);
        return;
    }
    /* (resolve_files() made the name absolute and found the file readable) */
    if (read_secret(c, &opts[f], path, "", &m[f], KVB_SECRET_TRIM, &text) < 0)
        return;
    uint64_t id = 0;
    int pr = parse_u64(text, strlen(text), &id);
    if (pr < 0) {
        char *sp = shown_max(path, strlen(path), MAX_SHOWN_PATH);
        err_at(c, m[f].line, m[f].col, "worker_id_file: '%s' does not hold a worker id: "
               "its content %s (expected an unsigned 64-bit decimal integer)", SHOWN(sp),
               pr == -2 ? "is negative" : pr == -3 ? "is too large"
                                                   : "is not a decimal integer");
        free(sp);
    } else {
        cfg->worker_id = id;
    }
    free(text);
}

/* Every dp rank of every source is a SUB socket, plus a DEALER when the
 * source has a replay_endpoint; a CURVE ZAP handler takes one more.  They
 * all live in one ZMQ context, which refuses sockets beyond
 * ZMQ_MAX_SOCKETS_DFLT. */
static void check_socket_count(struct ctx *c, const struct kvb_config *cfg,
                               const struct mark *m)
{
    const struct mark *ms = &m[opt_index("sources")];
    uint64_t total = 1; /* the ZAP handler */
    for (size_t i = 0; i < cfg->n_sources; i++) {
        const struct kvb_source_cfg *s = &cfg->sources[i];
        total += (uint64_t)s->dp_size * (s->replay_endpoint && *s->replay_endpoint ? 2 : 1);
    }
    if (total > ZMQ_MAX_SOCKETS_DFLT && ms->set && !ms->bad)
        err_at(c, ms->line, ms->col,
               "sources: %" PRIu64 " ZMQ sockets needed (one SUB per dp rank, one replay "
               "DEALER per dp rank with a replay_endpoint, one for the CURVE ZAP handler), more "
               "than ZMQ's "
               "limit of %d: lower dp_size or split the sources over several kvbridge "
               "instances",
               total, ZMQ_MAX_SOCKETS_DFLT);
}

/* nats.format: the combinations; the endpoint-scoped subject by default for
 * dynamo-msgpack. */
static void check_output(struct ctx *c, struct kvb_config *cfg, struct mark *m)
{
    const struct mark *mf = &m[opt_index("nats.format")];
    const struct mark *mj = &m[opt_index("nats.jetstream.enabled")];
    const struct mark *md = &m[opt_index("discovery.etcd.endpoints")];
    struct mark *ms = &m[opt_index("nats.subject")];
    int f = cfg->nats.format;
    if (mf->bad)
        return;
    if (f != KVB_FORMAT_DYNAMO_JSON && cfg->nats.jetstream.enabled && !mj->bad) {
        const struct mark *at = mf->set ? mf : mj;
        err_at(c, at->line, at->col, "nats.format: %s cannot be published through "
               "JetStream (nats.jetstream.enabled): Dynamo's JetStream consumers read "
               "dynamo-json; use dynamo-json, or core NATS", format_values[f]);
    }
    if (cfg->discovery.etcd.n_endpoints && f != KVB_FORMAT_DYNAMO_MSGPACK && !md->bad)
        err_at(c, md->line, md->col, "discovery.etcd.endpoints: discovery registers "
               "event-plane publishers: it needs nats.format dynamo-msgpack");
    if (f == KVB_FORMAT_DYNAMO_MSGPACK && !ms->set && !ms->bad) {
        char *d = strdup(KVB_SUBJECT_DEFAULT_MSGPACK);
        if (!d) {
            oom(c);
            return;
        }
        free(cfg->nats.subject);
        cfg->nats.subject = d;
    }
}

static void check_config(struct ctx *c, struct kvb_config *cfg, struct mark *m)
{
    check_output(c, cfg, m);
    check_worker_id_file(c, cfg, m);
    check_socket_count(c, cfg, m);
    check_auth(c, cfg, m);
    check_tls(c, cfg, m);
    check_jetstream(c, cfg, m);

    const struct mark *mw = &m[opt_index("nats.reconnect_wait_ms")];
    const struct mark *mx = &m[opt_index("nats.reconnect_wait_max_ms")];
    if (cfg->nats.reconnect_wait_max_ms < cfg->nats.reconnect_wait_ms && !mw->bad &&
        !mx->bad) {
        const struct mark *at = mx->set ? mx : mw;
        err_at(c, at->line, at->col,
               "nats.reconnect_wait_max_ms: %" PRIu32 " is less than "
               "nats.reconnect_wait_ms (%" PRIu32 ")",
               cfg->nats.reconnect_wait_max_ms, cfg->nats.reconnect_wait_ms);
    }
}

/* ------------------------------------------------------------------------ */
/* Walking the tree against the table                                        */

static void walk_map(struct ctx *c, const struct node *map, const char *tprefix,
                     const char *dprefix, void *base, struct mark *marks);

static void required_missing(struct ctx *c, const struct node *map, const char *dprefix,
                             bool sources_scope, const void *base, const struct mark *marks)
{
    for (size_t i = 0; i < N_OPTS; i++) {
        const struct opt *o = &opts[i];
        if (!(o->flags & F_REQUIRED) || in_sources(o) != sources_scope || marks[i].set)
            continue;
        if (o->alt) {
            size_t a = opt_index(o->alt);
            const char *v = *(char *const *)((const char *)base + opts[a].off);
            if (marks[a].set && (marks[a].bad || (v && *v)))
                continue;
        }
        const char *leaf = sources_scope ? o->key + sizeof SRC_PREFIX : o->key;
        err_at(c, map->line, map->col, "missing required key '%s%s%s'", dprefix,
               *dprefix ? "." : "", leaf);
    }
}

static void set_sources(struct ctx *c, const struct opt *o, const char *dpath,
                        const struct node *v, void *base)
{
    struct mark *smarks = NULL;
    struct kvb_source_cfg **field = (struct kvb_source_cfg **)((char *)base + o->off);
    size_t *np = (size_t *)((char *)base + o->noff);

    if (v->kind != N_SEQ) {
        err_at(c, v->line, v->col, "%s: expected a list of sources, found %s", dpath,
               kvb_cfg_is_null(v) ? "nothing" : kvb_cfg_kind_name(v));
        return;
    }
    if (v->n == 0) {
        err_at(c, v->line, v->col, "%s: at least one source is required", dpath);
        return;
    }
    if (v->n > MAX_SOURCES) {
        err_at(c, v->line, v->col, "%s: too many sources (more than %u)", dpath,
               MAX_SOURCES);
        return;
    }
    struct kvb_source_cfg *srcs = calloc(v->n, sizeof *srcs);
    smarks = calloc(N_OPTS, sizeof *smarks);
    if (!srcs || !smarks) {
        free(srcs);
        oom(c);
        goto out;
    }
    *field = srcs;
    *np = v->n;
    for (size_t i = 0; i < v->n; i++) {
        const struct node *item = v->kid[i];
        char *ipath = xasprintf(c, "%s[%zu]", dpath, i);
        if (!ipath)
            goto out;
        memset(smarks, 0, N_OPTS * sizeof *smarks);
        apply_defaults(c, &srcs[i], true);
        if (item->kind == N_MAP) {
            walk_map(c, item, SRC_PREFIX, ipath, &srcs[i], smarks);
            required_missing(c, item, ipath, true, &srcs[i], smarks);
            check_source(c, &srcs[i], i, smarks);
            check_curve(c, &srcs[i], i, smarks);
        } else if (item->kind != N_BAD) {
            err_at(c, item->line, item->col,
                   "%s: expected a mapping (endpoint: ...), found %s", ipath,
                   kvb_cfg_is_null(item) ? "nothing" : kvb_cfg_kind_name(item));
        }
        free(ipath);
    }
out:
    free(smarks);
}

static void set_list(struct ctx *c, const struct opt *o, const char *dpath,
                     const struct node *v, void *field, size_t *np, struct mark *m)
{
    char **list = NULL;
    uint32_t mask = 0;
    bool bad = false;

    if (v->kind != N_SEQ) {
        err_at(c, v->line, v->col, "%s: expected a list ([a, b]), found %s", dpath,
               kvb_cfg_is_null(v) ? "nothing" : kvb_cfg_kind_name(v));
        goto fail;
    }
    if (v->n == 0 && !(o->flags & F_EMPTY)) {
        err_at(c, v->line, v->col, "%s: the list must not be empty", dpath);
        goto fail;
    }
    if (o->type == T_STRLIST && !(list = calloc(v->n ? v->n : 1, sizeof *list))) {
        oom(c);
        goto fail;
    }
    for (size_t i = 0; i < v->n; i++) {
        const struct node *it = v->kid[i];
        if (it->kind == N_BAD) {
            bad = true;
        } else if (it->kind != N_SCALAR || kvb_cfg_is_null(it)) {
            err_at(c, it->line, it->col, "%s[%zu]: expected a single value, found %s",
                   dpath, i, kvb_cfg_is_null(it) ? "nothing" : kvb_cfg_kind_name(it));
            bad = true;
        } else if (conv_item(c, o, dpath, i, it->s, it->len, it->line, it->col,
                             list ? &list[i] : NULL, &mask) < 0) {
            bad = true;
        } else if (o->check && list) {
            char *ipath = xasprintf(c, "%s[%zu]", dpath, i);
            if (!ipath || o->check(c, o, ipath, &list[i], it) < 0)
                bad = true;
            free(ipath);
        }
    }
    if (bad)
        goto fail;
    if (o->type == T_STRLIST) {
        free_strlist(*(char ***)field, *np);
        *(char ***)field = list;
        *np = v->n;
    } else {
        *(uint32_t *)field = mask;
    }
    return;
fail:
    m->bad = true;
    free_strlist(list, v->kind == N_SEQ ? v->n : 0);
}

static void set_opt(struct ctx *c, const struct opt *o, const char *dpath,
                    const struct node *v, void *base, struct mark *marks)
{
    struct mark *m = &marks[o - opts];
    void *field = (char *)base + o->off;
    m->line = v->line;
    m->col = v->col;
    m->set = true;
    if (v->kind == N_BAD) {
        m->bad = true;
        return;
    }
    switch (o->type) {
    case T_SOURCES:
        set_sources(c, o, dpath, v, base);
        return;
    case T_STRLIST:
    case T_TIERS:
        set_list(c, o, dpath, v, field, (size_t *)((char *)base + o->noff), m);
        return;
    default:
        break;
    }
    if (v->kind != N_SCALAR) {
        err_at(c, v->line, v->col, "%s: expected a single value, found %s", dpath,
               kvb_cfg_kind_name(v));
    } else if (kvb_cfg_is_null(v)) {
        err_at(c, v->line, v->col, "%s: missing value%s", dpath,
               o->type == T_STR ? " (write \"\" for an empty string)" : "");
    } else if (conv(c, o, dpath, v->s, v->len, v->line, v->col, field) == 0 &&
               (!o->check || o->check(c, o, dpath, field, v) == 0)) {
        return;
    }
    m->bad = true;
}

static void walk_map(struct ctx *c, const struct node *map, const char *tprefix,
                     const char *dprefix, void *base, struct mark *marks)
{
    size_t npairs = map->n / 2, nseen = 0;
    const struct node **seen = calloc(npairs ? npairs : 1, sizeof *seen);
    if (!seen) {
        oom(c);
        return;
    }
    for (size_t i = 0; i + 1 < map->n; i += 2) {
        const struct node *k = map->kid[i], *v = map->kid[i + 1];
        char *tpath = NULL, *dpath = NULL, *shown_key = NULL;
        if (k->kind == N_BAD)
            continue;
        if (k->kind != N_SCALAR) {
            err_at(c, k->line, k->col, "keys must be single values, not %s",
                   kvb_cfg_kind_name(k));
            continue;
        }
        shown_key = shown(k->s, k->len);
        tpath = xasprintf(c, "%s%s%s", tprefix, *tprefix ? "." : "", k->s);
        dpath = xasprintf(c, "%s%s%s", dprefix, *dprefix ? "." : "", SHOWN(shown_key));
        if (!tpath || !dpath)
            goto next;
        const struct opt *o = NULL;
        bool section = false;
        if (k->len && !memchr(k->s, '\0', k->len) && !strpbrk(k->s, ".[]")) {
            o = find_opt(tpath);
            section = !o && is_section(tpath);
        }
        if (!o && !section) {
            err_at(c, k->line, k->col, "unknown key '%s'", dpath);
            goto next;
        }
        const struct node *dup = NULL;
        for (size_t j = 0; j < nseen && !dup; j++)
            if (strcmp(seen[j]->s, k->s) == 0)
                dup = seen[j];
        if (dup) {
            err_at(c, k->line, k->col, "duplicate key '%s' (first at %zu:%zu)", dpath,
                   dup->line, dup->col);
            goto next;
        }
        seen[nseen++] = k;
        if (!section)
            set_opt(c, o, dpath, v, base, marks);
        else if (v->kind == N_MAP)
            walk_map(c, v, tpath, dpath, base, marks);
        else if (v->kind != N_BAD && !kvb_cfg_is_null(v)) /* "nats:" alone = all defaults */
            err_at(c, v->line, v->col, "%s: expected a mapping, found %s", dpath,
                   kvb_cfg_kind_name(v));
    next:
        free(shown_key);
        free(tpath);
        free(dpath);
    }
    free(seen);
}

/* ------------------------------------------------------------------------ */
/* Public API                                                                */

static void free_fields(void *base, bool sources_scope)
{
    for (size_t i = 0; i < N_OPTS; i++) {
        const struct opt *o = &opts[i];
        void *field = (char *)base + o->off;
        if (in_sources(o) != sources_scope)
            continue;
        if (o->type == T_STR) {
            str_free(*(char **)field);
            *(char **)field = NULL;
        } else if (o->type == T_STRLIST) {
            size_t *np = (size_t *)((char *)base + o->noff);
            free_strlist(*(char ***)field, *np);
            *(char ***)field = NULL;
            *np = 0;
        } else if (o->type == T_SOURCES) {
            size_t *np = (size_t *)((char *)base + o->noff);
            struct kvb_source_cfg *s = *(struct kvb_source_cfg **)field;
            for (size_t k = 0; s && k < *np; k++) {
                free_fields(&s[k], true);
                curve_wipe(&s[k].curve);
            }
            free(s);
            *(struct kvb_source_cfg **)field = NULL;
            *np = 0;
        }
    }
}

void kvb_config_free(struct kvb_config **cfg)
{
    if (!cfg || !*cfg)
        return;
    free_fields(*cfg, false);
    free((*cfg)->nats.nkey_public);
    free((*cfg)->nats.jetstream.stream_name);
    free((*cfg)->nats.jetstream.subject_name);
    free((*cfg)->path);
    free(*cfg);
    *cfg = NULL;
}

int kvb_config_load(const char *path, struct kvb_config **out, FILE *err)
{
    int rc;
    struct ctx c = {.path = path ? path : "(null)", .err = err};
    const char *creds_dir = getenv("CREDENTIALS_DIRECTORY");
    char *buf = NULL;
    struct node *root = NULL;
    struct mark *marks = NULL;
    struct kvb_config *cfg = NULL;

    if (!path || !out) {
        rc = -EINVAL;
        goto fail;
    }
    rc = read_file(&c, &buf, &c.len);
    if (rc < 0)
        goto fail;
    c.buf = buf;
    c.creds_dir = creds_dir && *creds_dir ? creds_dir : NULL;
    rc = -EINVAL;
    cfg = calloc(1, sizeof *cfg);
    marks = calloc(N_OPTS, sizeof *marks);
    if (!cfg || !marks || !(cfg->path = strdup(path))) {
        oom(&c);
        goto fail;
    }
    if (apply_defaults(&c, cfg, false) < 0)
        goto fail;
    if (kvb_cfg_parse(&c, &root) < 0)
        goto fail;
    if (!root || kvb_cfg_is_null(root)) {
        err_at(&c, 1, 1,
               "empty configuration (worker_id, block_size and sources are required)");
        goto fail;
    }
    if (root->kind != N_MAP) {
        if (root->kind != N_BAD)
            err_at(&c, root->line, root->col,
                   "expected a mapping of keys at the top level, found %s",
                   kvb_cfg_kind_name(root));
        goto fail;
    }
    walk_map(&c, root, "", "", cfg, marks);
    required_missing(&c, root, "", false, cfg, marks);
    resolve_files(&c, cfg, marks);
    check_config(&c, cfg, marks);
    if (!cfg->nats.nkey_public && !(cfg->nats.nkey_public = strdup("")))
        oom(&c);
    if (!c.nerr && (!cfg->nats.jetstream.stream_name || !cfg->nats.jetstream.subject_name))
        oom(&c); /* resolved by check_jetstream() unless it reported something */
    if (c.nerr)
        goto fail;
    *out = cfg;
    cfg = NULL;
    rc = 0;
fail:
    if (c.oom)
        rc = -ENOMEM;
    kvb_config_free(&cfg);
    free(marks);
    kvb_cfg_node_free(root);
    if (buf)
        explicit_bzero(buf, c.len);
    free(buf);
    return rc;
}

int kvb_config_load_logged(const char *path, struct kvb_config **out)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *err = open_memstream(&buf, &len);
    int rc = kvb_config_load(path, out, err ? err : stderr);
    if (err) {
        fclose(err);
        kvb_log_lines(KVB_LOG_ERROR, "config", buf);
        free(buf);
    }
    return rc;
}

/* Values of one table row in two configs (or sources) are equal. */
static bool field_eq(const struct opt *o, const void *a_base, const void *b_base)
{
    const void *a = (const char *)a_base + o->off, *b = (const char *)b_base + o->off;
    switch (o->type) {
    case T_U64: return *(const uint64_t *)a == *(const uint64_t *)b;
    case T_U32:
    case T_TIERS:
    case T_BLOCKSIZE: return *(const uint32_t *)a == *(const uint32_t *)b;
    case T_BOOL: return *(const bool *)a == *(const bool *)b;
    case T_ENUM: return *(const int *)a == *(const int *)b;
    case T_STR: {
        const char *sa = *(char *const *)a, *sb = *(char *const *)b;
        return strcmp(sa ? sa : "", sb ? sb : "") == 0;
    }
    case T_STRLIST: {
        size_t na = *(const size_t *)((const char *)a_base + o->noff);
        size_t nb = *(const size_t *)((const char *)b_base + o->noff);
        char *const *la = *(char **const *)a, *const *lb = *(char **const *)b;
        if (na != nb)
            return false;
        for (size_t i = 0; i < na; i++)
            if (strcmp(la[i], lb[i]) != 0)
                return false;
        return true;
    }
    case T_SOURCES: {
        size_t na = *(const size_t *)((const char *)a_base + o->noff);
        size_t nb = *(const size_t *)((const char *)b_base + o->noff);
        const struct kvb_source_cfg *sa = *(struct kvb_source_cfg *const *)a;
        const struct kvb_source_cfg *sb = *(struct kvb_source_cfg *const *)b;
        if (na != nb)
            return false;
        for (size_t k = 0; k < na; k++)
            for (size_t i = 0; i < N_OPTS; i++)
                if (in_sources(&opts[i]) && !field_eq(&opts[i], &sa[k], &sb[k]))
                    return false;
        return true;
    }
    }
    return false;
}

bool kvb_config_source_equal(const struct kvb_source_cfg *a, const struct kvb_source_cfg *b)
{
    if (!a || !b)
        return a == b;
    for (size_t i = 0; i < N_OPTS; i++)
        if (in_sources(&opts[i]) && !field_eq(&opts[i], a, b))
            return false;
    const struct kvb_curve_cfg *x = &a->curve, *y = &b->curve;
    return x->enabled == y->enabled && x->n_allowed == y->n_allowed &&
           memcmp(x->secret_key, y->secret_key, sizeof x->secret_key) == 0 &&
           memcmp(x->server_key, y->server_key, sizeof x->server_key) == 0 &&
           (!x->n_allowed || memcmp(x->allowed, y->allowed, x->n_allowed * sizeof *x->allowed) == 0);
}

bool kvb_config_nats_equal(const struct kvb_config *a, const struct kvb_config *b)
{
    if (!a || !b)
        return a == b;
    for (size_t i = 0; i < N_OPTS; i++)
        if ((opts[i].flags & F_CONN) && !field_eq(&opts[i], a, b))
            return false;
    return true;
}

int kvb_config_check_reload(const struct kvb_config *old_cfg,
                            const struct kvb_config *new_cfg, FILE *err)
{
    int rc = 0;
    if (!old_cfg || !new_cfg)
        return -EINVAL;
    for (size_t i = 0; i < N_OPTS; i++) {
        const struct opt *o = &opts[i];
        if (o->flags & F_RELOAD)
            continue;
        bool same;
        if (in_sources(o)) {
            same = old_cfg->n_sources == new_cfg->n_sources;
            for (size_t k = 0; same && k < new_cfg->n_sources; k++)
                same = field_eq(o, &old_cfg->sources[k], &new_cfg->sources[k]);
        } else {
            same = field_eq(o, old_cfg, new_cfg);
        }
        if (!same) {
            if (err)
                fprintf(err, "%s: '%s' changed: it needs a restart to take effect\n",
                        new_cfg->path ? new_cfg->path : "config", o->key);
            rc = -EINVAL;
        }
    }
    /* Discovery records name nats.namespace, nats.component, nats.endpoint
     * (reloadable keys otherwise): the registered records stay. */
    if (old_cfg->discovery.etcd.n_endpoints &&
        (strcmp(old_cfg->nats.namespace_, new_cfg->nats.namespace_) ||
         strcmp(old_cfg->nats.component, new_cfg->nats.component) ||
         strcmp(old_cfg->nats.endpoint, new_cfg->nats.endpoint))) {
        if (err)
            fprintf(err, "%s: nats.namespace, nats.component or nats.endpoint changed "
                    "while discovery is on (the registered records name them): it needs "
                    "a restart to take effect\n", new_cfg->path ? new_cfg->path : "config");
        rc = -EINVAL;
    }
    /* The stream and subject also follow nats.namespace, nats.component and
     * worker_id (reloadable keys): the running sink keeps its stream. */
    const char *names[2][5] = {
        {"stream", old_cfg->nats.jetstream.stream_name, new_cfg->nats.jetstream.stream_name,
         old_cfg->nats.jetstream.stream, new_cfg->nats.jetstream.stream},
        {"subject", old_cfg->nats.jetstream.subject_name, new_cfg->nats.jetstream.subject_name,
         old_cfg->nats.jetstream.subject, new_cfg->nats.jetstream.subject},
    };
    bool raw_same = true; /* else the key itself was reported above */
    for (int i = 0; i < 2; i++)
        raw_same = raw_same && strcmp(names[i][3] ? names[i][3] : "",
                                      names[i][4] ? names[i][4] : "") == 0;
    for (int i = 0; i < 2 && raw_same && old_cfg->nats.jetstream.enabled &&
                    new_cfg->nats.jetstream.enabled;
         i++) {
        const char *a = names[i][1] ? names[i][1] : "", *b = names[i][2] ? names[i][2] : "";
        if (strcmp(a, b) == 0)
            continue;
        if (err)
            fprintf(err, "%s: the JetStream %s would change from '%s' to '%s' "
                    "(nats.namespace, nats.component or worker_id changed): it needs a "
                    "restart to take effect\n",
                    new_cfg->path ? new_cfg->path : "config", names[i][0], a, b);
        rc = -EINVAL;
    }
    return rc;
}

/* ------------------------------------------------------------------------ */
/* The commented example                                                     */

#define EXAMPLE_WIDTH 79

static const char example_header[] =
    "# kvbridge configuration: every key, set to its default value, with what it\n"
    "# does.  worker_id, block_size and sources[].endpoint have no default: the\n"
    "# values below are examples, so that this file loads as it is.\n"
    "#\n"
    "# Generated by kvb_config_write_example() (src/config.c); a unit test keeps\n"
    "# conf/kvbridge.yaml equal to it.  Unknown keys and bad values are errors,\n"
    "# reported as FILE:LINE:COLUMN.  `kvbridge -c FILE --check` validates a file;\n"
    "# SIGHUP reloads it, except keys marked as needing a restart.  Any value may\n"
    "# be taken from the environment: ${NAME}, ${NAME:-default}; $$ is a literal $.\n";

/* Word-wrapped "# " lines at INDENT. */
static void put_comment(FILE *f, int indent, const char *text)
{
    const char *p = text;
    int width = EXAMPLE_WIDTH - indent - 2;
    while (*p) {
        int len = 0, last_space = -1;
        while (p[len] && (len < width || last_space < 0)) {
            if (p[len] == ' ')
                last_space = len;
            len++;
        }
        if (p[len] && p[len] != ' ' && last_space >= 0)
            len = last_space;
        fprintf(f, "%*s# %.*s\n", indent, "", len, p);
        p += len;
        while (*p == ' ')
            p++;
    }
}

static void put_quoted(FILE *f, const char *s, size_t len)
{
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '"' || s[i] == '\\')
            fputc('\\', f);
        fputc(s[i], f);
    }
    fputc('"', f);
}

static void put_value(FILE *f, const struct opt *o)
{
    switch (o->type) {
    case T_STR:
        put_quoted(f, o->def, strlen(o->def));
        break;
    case T_STRLIST:
    case T_TIERS: {
        fputc('[', f);
        for (const char *p = o->def; *p;) {
            size_t len = strcspn(p, ",");
            if (p != o->def)
                fputs(", ", f);
            if (o->type == T_STRLIST)
                put_quoted(f, p, len);
            else
                fprintf(f, "%.*s", (int)len, p);
            p += len + (p[len] == ',');
        }
        fputc(']', f);
        break;
    }
    case T_SOURCES:
        break;
    default:
        fputs(o->def, f);
        break;
    }
}

/* The help text plus what the table says about the key. */
static char *full_help(const struct opt *o)
{
    char *list = NULL, *range = NULL, *s = NULL;
    if (o->type == T_ENUM && !(list = join_values(NULL, o->values, ", ")))
        goto out;
    if ((o->type == T_U32 || o->type == T_U64 || o->type == T_BLOCKSIZE) &&
        !(range = xasprintf(NULL, " Range: %" PRIu64 "..%" PRIu64 ".", o->min, o->max)))
        goto out;
    s = xasprintf(NULL, "%s%s%s%s%s%s%s%s%s", o->help, list ? " One of: " : "",
                  list ? list : "", list ? "." : "", range ? range : "",
                  o->type == T_BOOL ? " true or false." : "",
                  !(o->flags & F_REQUIRED) ? ((o->flags & F_RELOAD) ? ""
                                              : " Changing it needs a restart.")
                  : o->alt ? " Required unless " : " Required.",
                  (o->flags & F_REQUIRED) && o->alt ? o->alt : "",
                  (o->flags & F_REQUIRED) && o->alt ? " is set." : "");
out:
    free(list);
    free(range);
    return s;
}

/* Indentation of the keys under PARENT ("", "nats", "sources[]"). */
static int indent_of(const char *parent, size_t len)
{
    int indent = 0;
    for (size_t i = 0; i < len;) {
        size_t n = strcspn(parent + i, ".");
        if (n > len - i)
            n = len - i;
        indent += n >= 2 && parent[i + n - 2] == '[' ? 4 : 2;
        i += n + 1;
    }
    return indent;
}

int kvb_config_write_example(FILE *f)
{
    int rc = 0;
    const char *prev = "";
    size_t prev_plen = 0;
    bool after_header = false;

    if (!f)
        return -EINVAL;
    fputs(example_header, f);
    for (size_t i = 0; i < N_OPTS; i++) {
        const struct opt *o = &opts[i];
        const char *dot = strrchr(o->key, '.');
        size_t plen = dot ? (size_t)(dot - o->key) : 0;
        const char *leaf = dot ? dot + 1 : o->key;
        bool first_in_item = false;

        /* Open the sections of this key that the previous key was not in:
         * COMMON is the longest equal prefix of both parents that ends on a
         * component boundary in each. */
        size_t common = 0;
        while (common < plen && common < prev_plen && o->key[common] == prev[common])
            common++;
        while (common > 0 &&
               !((common == plen || o->key[common] == '.') &&
                 (common == prev_plen || prev[common] == '.')))
            common--;
        for (size_t k = common; k < plen;) {
            if (o->key[k] == '.')
                k++;
            size_t n = strcspn(o->key + k, ".");
            if (n > plen - k)
                n = plen - k;
            if (n >= 2 && o->key[k + n - 2] == '[') {
                first_in_item = true; /* a list item: "- " before its first key */
            } else {
                if (!after_header)
                    fputc('\n', f);
                fprintf(f, "%*s%.*s:\n", indent_of(o->key, k ? k - 1 : 0), "", (int)n,
                        o->key + k);
                after_header = true;
            }
            k += n;
        }

        int indent = indent_of(o->key, plen);
        char *help = full_help(o);
        if (!help) {
            rc = -ENOMEM;
            break;
        }
        if (!after_header)
            fputc('\n', f);
        if (first_in_item) {
            put_comment(f, indent - 2, help);
            fprintf(f, "%*s- %s:", indent - 2, "", leaf);
        } else {
            put_comment(f, indent, help);
            fprintf(f, "%*s%s:", indent, "", leaf);
        }
        free(help);
        if (o->type == T_SOURCES) {
            fputc('\n', f);
            after_header = true;
        } else {
            fputc(' ', f);
            put_value(f, o);
            fputc('\n', f);
            after_header = false;
        }
        prev = o->key;
        prev_plen = plen;
    }
    if (rc == 0 && ferror(f))
        rc = -EIO;
    return rc;
}

/* ------------------------------------------------------------------------ */
/* The effective values (--check -v)                                         */

#define REDACTED "(redacted)"

/* A server URL, its user information (user and password, or a token)
 * replaced by REDACTED. */
static void put_url(FILE *f, const char *url)
{
    const char *p = strstr(url, "://");
    p = p ? p + 3 : url;
    const char *at = memrchr(p, '@', strcspn(p, "/?#"));
    if (!at) {
        put_quoted(f, url, strlen(url));
        return;
    }
    char *r = xasprintf(NULL, "%.*s" REDACTED "%s", (int)(p - url), url, at);
    if (r)
        put_quoted(f, r, strlen(r));
    else
        fputs("\"" REDACTED "\"", f);
    free(r);
}

/* The value of table row O in BASE (the config, or one source). */
static void put_effective(FILE *f, const struct opt *o, const void *base)
{
    const void *field = (const char *)base + o->off;
    switch (o->type) {
    case T_U64: fprintf(f, "%" PRIu64, *(const uint64_t *)field); break;
    case T_U32: fprintf(f, "%" PRIu32, *(const uint32_t *)field); break;
    case T_BLOCKSIZE: {
        uint32_t v = *(const uint32_t *)field;
        if (v)
            fprintf(f, "%" PRIu32, v);
        else
            fputs("auto", f);
        break;
    }
    case T_BOOL: fputs(*(const bool *)field ? "true" : "false", f); break;
    case T_ENUM: fputs(o->values[*(const int *)field], f); break;
    case T_STR: {
        const char *v = *(char *const *)field;
        if (!v)
            v = "";
        if ((o->flags & F_SECRET) && *v)
            fputs(REDACTED, f);
        else
            put_quoted(f, v, strlen(v));
        break;
    }
    case T_STRLIST: {
        char *const *list = *(char **const *)field;
        size_t n = *(const size_t *)((const char *)base + o->noff);
        fputc('[', f);
        for (size_t i = 0; i < n; i++) {
            fputs(i ? ", " : "", f);
            put_url(f, list[i]);
        }
        fputc(']', f);
        break;
    }
    case T_TIERS: {
        uint32_t mask = *(const uint32_t *)field;
        bool first = true;
        fputc('[', f);
        for (int t = 0; o->values[t]; t++) {
            if (mask & (1u << t)) {
                fprintf(f, "%s%s", first ? "" : ", ", o->values[t]);
                first = false;
            }
        }
        fputc(']', f);
        break;
    }
    case T_SOURCES:
        break;
    }
}

int kvb_config_write_effective(const struct kvb_config *cfg, FILE *f)
{
    if (!cfg || !f)
        return -EINVAL;
    fprintf(f, "# effective configuration of %s (secrets redacted)\n",
            cfg->path ? cfg->path : "?");
    for (size_t i = 0; i < N_OPTS; i++) {
        const struct opt *o = &opts[i];
        if (in_sources(o))
            continue;
        if (o->type != T_SOURCES) {
            fprintf(f, "%s: ", o->key);
            put_effective(f, o, cfg);
            fputc('\n', f);
            continue;
        }
        for (size_t k = 0; k < cfg->n_sources; k++) {
            for (size_t j = 0; j < N_OPTS; j++) {
                if (!in_sources(&opts[j]))
                    continue;
                fprintf(f, "sources[%zu].%s: ", k, opts[j].key + sizeof SRC_PREFIX);
                put_effective(f, &opts[j], &cfg->sources[k]);
                fputc('\n', f);
            }
        }
    }
    return ferror(f) ? -EIO : 0;
}
