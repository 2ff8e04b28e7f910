/* config table: every key of the configuration file, one row each
 * (docs/design.md rule 7): its path, type, offset, default, limits, flags,
 * check and help text.  Parsing, defaults, validation, freeing, reload
 * checks, the commented example and --check -v are loops over it (the other
 * files of src/config/; the file graph is at the top of config_priv.h).
 */
#include "config.h"
#include "config_priv.h"
#include "metrics.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Offsets with a compile-time type check: a mismatch has no _Generic match. */
#define TOP(f, T) _Generic(((struct kvb_config *)0)->f, T : offsetof(struct kvb_config, f))
#define SRC(f, T) _Generic(((struct kvb_source_cfg *)0)->f, T : offsetof(struct kvb_source_cfg, f))

static const char *const mode_values[] = {"connect", "bind", NULL};
static const char *const rank_naming_values[] = {"port", "trtllm", NULL}; /* enum kvb_rank_naming */
static const char *const format_values[] = {"dynamo-json", "dynamo-msgpack", "raw", NULL};
static const char *const level_values[] = {"error", "warn", "info", "debug", NULL};
static const char *const retention_values[] = {"limits", "interest", "workqueue", NULL};
static const char *const engine_kind_values[] = {"vllm", "sglang", NULL}; /* engine/load.h */
static const char *const plane_values[] = {"nats", "tcp", NULL};          /* recovery.h */
#define TIER_NAME(s, str) [KVB_TIER_##s] = str,
static const char *const tier_values[] = {KVB_TIERS(TIER_NAME) NULL};

/* The checks of src/config/check_value.c, under the names the table uses. */
#define check_endpoint kvb_cfg_check_endpoint
#define check_opt_endpoint kvb_cfg_check_opt_endpoint
#define check_subject kvb_cfg_check_subject
#define check_word kvb_cfg_check_word
#define check_format kvb_cfg_check_format
#define check_listen kvb_cfg_check_listen
#define check_host kvb_cfg_check_host
#define check_js_template kvb_cfg_check_js_template
#define check_server_url kvb_cfg_check_server_url
#define check_query_subject kvb_cfg_check_query_subject
#define check_http_url kvb_cfg_check_http_url
#define check_etcd_url kvb_cfg_check_etcd_url

#define R F_RELOAD
#define C F_CONN
#define I32MAX ((uint64_t)INT32_MAX)

/* clang-format off */
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
             "their own (Dynamo's cache_namespace, docs/router-events.md section 3.1); \"\" = "
             "none."},

    {.key = "sources", .type = T_SOURCES,
     .off = TOP(sources, struct kvb_source_cfg *), .noff = TOP(n_sources, size_t),
     .flags = F_REQUIRED | R,
     .help = "The engine event streams (ZMQ PUB sockets): a list of one or more."},
    {.key = "sources[].endpoint", .type = T_STR, .off = SRC(endpoint, char *),
     .def = "tcp://127.0.0.1:5557", .flags = F_REQUIRED | R, .check = check_endpoint,
     .alt = "sources[].discover",
     .help = "The engine's event endpoint: tcp://, ipc:// or inproc://."},
    {.key = "sources[].discover", .type = T_STR, .off = SRC(discover, char *), .def = "",
     .flags = R, .check = check_http_url,
     .help = "Instead of endpoint: the engine's HTTP address (http://HOST:PORT; a URL "
             "with a path is used as it is, else /kv_event_sources is asked), whose list "
             "of event sources (vLLM's GET /kv_event_sources) gives each data-parallel "
             "rank's endpoint, replay endpoint and topic: for an engine that binds "
             "ephemeral ports (tcp://*:0), which change at every restart. kvbridge reads "
             "the list at start, again whenever a rank's connection is lost or down or "
             "the engine's liveness changes (with a backoff up to 5 s while it cannot "
             "be read or a rank stays down), connects to ranks dp_rank .. dp_rank + "
             "dp_size - 1, and replaces the source of a rank whose endpoint changed "
             "(a restart barrier, then the new stream from its replay), without a "
             "reload; /readyz is 503 until the list was read. Connect mode only; "
             "endpoint, replay_endpoint, topic and topics are then left out. \"\" = none."},
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
             "replay_endpoint to N endpoints, named as rank_naming says (by default "
             "tcp:// with a numeric port: ports base+0 .. base+N-1)."},
    {.key = "sources[].dp_rank", .type = T_U32, .off = SRC(dp_rank, uint32_t),
     .def = "0", .min = 0, .max = UINT32_MAX, .flags = R,
     .help = "dp_rank used when a batch carries none (with dp_size > 1: the rank "
             "of the first port of the expansion)."},
    {.key = "sources[].rank_naming", .type = T_ENUM, .off = SRC(rank_naming, int),
     .def = "port", .values = rank_naming_values, .flags = R,
     .help = "How dp_size > 1 names rank r's endpoint and replay_endpoint: port = "
             "tcp://HOST:PORT+r (vLLM, SGLang); trtllm = TensorRT-LLM's naming: ipc://PATH "
             "for rank 0, ipc://PATH_dp1, ipc://PATH_dp2, ... for the others (inproc:// "
             "likewise), tcp:// as port."},
    {.key = "sources[].rcvhwm", .type = T_U32, .off = SRC(rcvhwm, uint32_t),
     .def = "10000", .min = 0, .max = I32MAX, .flags = R,
     .help = "ZMQ_RCVHWM of the SUB socket, in batches (0 = no limit). Batches "
             "queue there while kvbridge is slower than the engine or paused (NATS "
             "slow or away), and as many again (10000 at least) are held while a "
             "replay runs: memory up to 2 x rcvhwm x (batch size + 2 KiB of libzmq "
             "overhead), "
             "60 MiB for 1 KiB batches (kvbridge(8), MEMORY); beyond it the engine "
             "drops and replay (or a barrier) covers the gap."},
    {.key = "sources[].max_peers", .type = T_U32, .off = SRC(max_peers, uint32_t),
     .def = "16", .min = 1, .max = 1000, .flags = R,
     .help = "Bind mode: engine connections taken at once; one more is closed as "
             "soon as it is accepted (counted in kvbridge_peers_refused_total). "
             "Each may hold one unfinished frame of up to limits.max_payload_bytes "
             "in libzmq: memory up to max_peers x max_payload_bytes (kvbridge(8), "
             "MEMORY)."},
    {.key = "sources[].reconnect_max_ms", .type = T_U32,
     .off = SRC(reconnect_max_ms, uint32_t), .def = "250", .min = 10, .max = 60000,
     .flags = R,
     .help = "Connect mode: the longest wait between two attempts to reach an absent "
             "engine, in milliseconds (libzmq's reconnect timer: no busy loop). A "
             "restarted engine is reached within it; what it published meanwhile "
             "comes from its replay socket."},
    /* The worker behind the source (fan-in: several engines, one kvbridge). */
    {.key = "sources[].worker_id", .type = T_U64, .off = SRC(worker_id, uint64_t),
     .def = "~", .min = 0, .max = UINT64_MAX, .flags = R | F_WORKER | F_INHERIT,
     .help = "This engine's worker_id, when one kvbridge serves several engines (one "
             "source each); ~ (or absent) = the top-level worker_id. When every source "
             "sets its own, the top-level worker_id (and block_size likewise) may be "
             "left out: it then takes the first source's value."},
    {.key = "sources[].block_size", .type = T_BLOCKSIZE, .off = SRC(block_size, uint32_t),
     .def = "~", .min = 1, .max = 1048576, .flags = R | F_WORKER | F_INHERIT,
     .help = "This engine's KV block size, or \"auto\"; ~ (or absent) = the top-level "
             "block_size."},
    {.key = "sources[].lora_salt", .type = T_BOOL, .off = SRC(lora_salt, bool), .def = "~",
     .flags = R | F_WORKER | F_INHERIT,
     .help = "lora_salt for this engine's events; ~ (or absent) = the top-level "
             "lora_salt."},
    {.key = "sources[].forward_tiers", .type = T_TIERS, .off = SRC(forward_tiers, uint32_t),
     .def = "~", .values = tier_values, .flags = R | F_WORKER | F_INHERIT,
     .help = "forward_tiers for this engine's events; ~ (or absent) = the top-level "
             "forward_tiers."},
    {.key = "sources[].image_token_id", .type = T_U64, .off = SRC(image_token_id, uint64_t),
     .def = "0", .min = 0, .max = UINT32_MAX, .flags = R | F_WORKER,
     .help = "The model's image placeholder token id (Qwen-VL style, e.g. 151655), for a "
             "router given the same image_token_id: a block with multimodal hashes is "
             "hashed with each run of this token replaced by 1000000 + (mm_hash & "
             "(2^30 - 1)), one mm hash per run in order, and without the mm hashes "
             "themselves (Dynamo's pad-value substitution, docs/router-events.md). "
             "0 = off: tokens plus sorted mm hashes."},
    {.key = "sources[].video_token_id", .type = T_U64, .off = SRC(video_token_id, uint64_t),
     .def = "0", .min = 0, .max = UINT32_MAX, .flags = R | F_WORKER,
     .help = "The model's video placeholder token id (Qwen-VL style, e.g. 151656), for a "
             "router given the same video_token_id: runs are then mapped to mm hashes by "
             "modality (each image run one object, consecutive video runs one object, "
             "objects in order or by the kinds the event's unambiguous blocks show) and "
             "pad-substituted; a block that maps no single way, or an id equal to "
             "image_token_id, is hashed natively (Dynamo's substitute_pad_values(), "
             "docs/router-events.md). 0 = off."},
    {.key = "sources[].lora_names", .type = T_LORA_NAMES,
     .off = SRC(lora_names, struct kvb_lora_name_cfg *), .noff = SRC(n_lora_names, size_t),
     .def = "", .flags = R | F_WORKER,
     .help = "The LoRA adapter names of the ids this engine sends: a mapping of lora_id "
             "(0..9223372036854775807) to the name the router knows the adapter by, such "
             "as {7: \"sql-lora\"}. A BlockStored with a lora_id and no lora_name "
             "(TensorRT-LLM sends only the id) is salted with the mapped name, as if the "
             "engine had sent it; an id not listed is counted "
             "(kvbridge_stores_unsalted_total{reason=\"unmapped_lora_id\"}), logged once, "
             "and published without the LoRA salt. At most 1024 ids, each name at most 255 "
             "bytes. {} = none."},
    {.key = "sources[].topics", .type = T_TOPICS,
     .off = SRC(topics, struct kvb_topic_cfg *), .noff = SRC(n_topics, size_t), .def = "",
     .flags = R, /* a change reopens the source */
     .help = "Several engines on one source (bind mode, each publishing on its own "
             "topic): a mapping of exact topics to worker ids, such as "
             "{\"kv@pod-a@llama\": 101, \"kv@pod-b@llama\": 102} (the kv@POD@MODEL form "
             "other indexers use); each topic's router events carry its worker_id, with "
             "this source's other keys. A batch on a topic not listed is counted "
             "(kvbridge_malformed_messages_total{kind=\"unknown_topic\"}) and dropped, "
             "never guessed. At most 64 topics. {} = no map: every topic is this "
             "source's worker_id."},
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
    {.key = "sources[].engine.kind", .type = T_ENUM, .off = SRC(engine.kind, int),
     .def = "vllm", .values = engine_kind_values, .flags = R,
     .help = "The engine's HTTP face, for its load and its liveness: which engine "
             "serves metrics_url, vllm or sglang (the metric names differ)."},
    {.key = "sources[].engine.metrics_url", .type = T_STR,
     .off = SRC(engine.metrics_url, char *), .def = "", .flags = R, .check = check_http_url,
     .help = "The engine's Prometheus /metrics (http:// or https://), scraped off the "
             "loop thread every scrape_interval_ms: the KV-cache load per dp_rank, "
             "published as ActiveLoad and exported as kvbridge_engine_*. \"\" = none. "
             "Without metrics_url and health_url no load is read and no liveness "
             "judgement is made."},
    {.key = "sources[].engine.health_url", .type = T_STR,
     .off = SRC(engine.health_url, char *), .def = "", .flags = R, .check = check_http_url,
     .help = "The engine's health URL (vLLM: /health), asked with metrics_url; the "
             "engine answers when either gives a 2xx status. \"\" = none."},
    {.key = "sources[].engine.scrape_interval_ms", .type = T_U32,
     .off = SRC(engine.scrape_interval_ms, uint32_t), .def = "500", .min = 10,
     .max = 3600000, .flags = R,
     .help = "A scrape every this many milliseconds; it is also each request's "
             "timeout."},
    {.key = "sources[].engine.dead_after_ms", .type = T_U32,
     .off = SRC(engine.dead_after_ms, uint32_t), .def = "10000", .min = 10,
     .max = I32MAX, .flags = R,
     .help = "The engine is gone when its metrics and health URLs have failed this "
             "long AND no batch came from it in that time (an idle engine publishes "
             "nothing, so silence alone proves nothing): a \"cleared\" barrier for each "
             "of its dp_ranks, once, and /readyz answers 503. At least "
             "scrape_interval_ms."},

    {.key = "nats.servers", .type = T_STRLIST, .off = TOP(nats.servers, char **),
     .noff = TOP(nats.n_servers, size_t), .def = "nats://127.0.0.1:4222", .flags = R | C,
     .check = check_server_url,
     .help = "NATS server URLs; list several for a cluster. tls:// URLs turn on "
             "nats.tls.enabled. A port, when given, is 1..65535 (4222 when none)."},
    {.key = "nats.discovered_servers", .type = T_BOOL,
     .off = TOP(nats.discovered_servers, bool), .def = "false", .flags = R | C,
     .help = "Also connect to the servers a NATS server advertises (its cluster's "
             "connect_urls). Off: only nats.servers are used, so the credentials "
             "go to no server the configuration does not name; list every server "
             "of a cluster there."},
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
             "(worker_id, dp_rank) from one engine batch, at most 128 events or 8192 "
             "blocks (routers from mid 2026); false: one RouterEvent per message (the event plane's first "
             "routers)."},
    {.key = "nats.coalesce", .type = T_BOOL, .off = TOP(nats.coalesce, bool), .def = "false",
     .help = "Merge adjacent router events of one engine batch into one, as Dynamo's "
             "publisher does: a store whose parent is the previous store's last block "
             "(same worker, dp_rank and tier), removes after removes, at most 128 blocks "
             "each; event_ids stay without holes. A store without a parent is never "
             "merged under another (Dynamo's publisher does that after an empty store). "
             "Fewer, larger messages; the router's index is the same."},
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
     .off = TOP(nats.reconnect_buffer_bytes, uint64_t), .def = "16777216", .min = 0,
     .max = I32MAX, .flags = R | C,
     .help = "Bytes of router events buffered for NATS while it is disconnected or "
             "slow (16 MiB by default); from 3/4 of it kvbridge stops reading the "
             "engines. Costs up to twice this in memory (kvbridge(8), MEMORY)."},
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

    {.key = "nats.resync_on_reconnect", .type = T_BOOL,
     .off = TOP(nats.resync_on_reconnect, bool), .def = "false", .flags = R,
     .help = "Core NATS: after every reconnection, a \"cleared\" for each (worker_id, "
             "dp_rank) followed by its resident blocks from the residency mirror (cause "
             "nats_reconnect), as after a counted loss: what a dying server had in "
             "flight is lost without a trace, and the router then still ends with the "
             "engine's view. Paced by nats.repair_bytes_per_s. Needs the mirror "
             "(limits.max_resident_blocks > 0); refused with nats.jetstream.enabled "
             "(JetStream sends again what it did not acknowledge)."},
    {.key = "nats.repair_bytes_per_s", .type = T_U64,
     .off = TOP(nats.repair_bytes_per_s, uint64_t), .def = "8388608", .min = 4096,
     .max = UINT32_MAX, .flags = R,
     .help = "Pace of repairs: after router events were lost on the NATS side (and "
             "with nats.resync_on_reconnect after a reconnection), the resident blocks "
             "of each pair are published again, at most this many bytes per second "
             "(bursts of one second's worth), while the engines are read as usual, so "
             "that a flapping server cannot flood the router. 8 MiB by default."},

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
     .help = "Time allowed for a whole replay (every request of it), in "
             "milliseconds, counting only the time spent waiting for the engine (not "
             "kvbridge's own holding back or applying the replies); then a "
             "\"cleared\" barrier is published for what is still missing."},
    {.key = "replay.max_ms", .type = T_U32, .off = TOP(replay.max_ms, uint32_t),
     .def = "30000", .min = 1, .max = I32MAX, .flags = R,
     .help = "Wall time allowed for a whole replay, in milliseconds, whatever it "
             "spent the time on (an engine that answers flat out never makes "
             "replay.timeout_ms run out); then a \"cleared\" barrier is published for "
             "what is still missing and the live batches held behind it go on."},
    {.key = "replay.max_batches", .type = T_U64, .off = TOP(replay.max_batches, uint64_t),
     .def = "10000", .min = 1, .max = I32MAX, .flags = R,
     .help = "The largest gap asked from the engine's replay socket, in batches "
             "(default: vLLM's buffer_steps); a larger gap is a \"cleared\" barrier at "
             "once, a new stream asks for this many batches before its first at most, "
             "and a replay that reads more ends with a barrier."},

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

    {.key = "discovery.recovery.enabled", .type = T_BOOL,
     .off = TOP(discovery.recovery.enabled, bool), .def = "false",
     .help = "Answer Dynamo's KV recovery query for each (worker_id, dp_rank), as a Dynamo "
             "worker's local indexer does: the EventSource records then carry a "
             "recovery_target, and a router that starts late, restarts or sees a hole asks "
             "kvbridge for the pair's state (the recent events from the mirror's ring, or a "
             "dump of its blocks) instead of starting from nothing "
             "(docs/dynamo-event-plane.md section 9). Needs discovery.etcd.endpoints and "
             "the residency mirror."},
    {.key = "discovery.recovery.request_plane", .type = T_ENUM,
     .off = TOP(discovery.recovery.request_plane, int), .def = "tcp", .values = plane_values,
     .help = "How routers send their recovery queries, as they were started: tcp (Dynamo's "
             "default, DYN_REQUEST_PLANE=tcp: kvbridge listens on "
             "discovery.recovery.listen) or nats (DYN_REQUEST_PLANE=nats: request/reply on "
             "kvbridge's NATS connection). Answers always go back over TCP to the router "
             "(DYN_RESPONSE_PLANE=tcp; QUIC is not served)."},
    {.key = "discovery.recovery.listen", .type = T_STR,
     .off = TOP(discovery.recovery.listen, char *), .def = "", .check = check_listen,
     .help = "The TCP request plane: HOST:PORT kvbridge listens on for recovery queries "
             "(a numeric IPv4 or [IPv6] address; 0.0.0.0 for every interface). Required with "
             "request_plane tcp."},
    {.key = "discovery.recovery.advertise", .type = T_STR,
     .off = TOP(discovery.recovery.advertise, char *), .def = "", .check = check_host,
     .help = "The TCP request plane: the HOST[:PORT] routers connect to, as the records "
             "advertise it (the port: listen's when left out); \"\" = the listen address, "
             "which must then not be a wildcard."},

    {.key = "metrics.listen", .type = T_STR, .off = TOP(metrics.listen, char *),
     .def = "127.0.0.1:9464", .check = check_listen,
     .help = "HOST:PORT serving Prometheus /metrics, /healthz and /readyz: a numeric "
             "IPv4 or [IPv6] address and a port 1..65535; \"\" disables it."},

    {.key = "log.level", .type = T_ENUM, .off = TOP(log.level, int), .def = "info",
     .values = level_values, .flags = R, .help = "Least severe message logged."},
    {.key = "log.stats_interval_s", .type = T_U32, .off = TOP(log.stats_interval_s, uint32_t),
     .def = "10", .min = 0, .max = 86400, .flags = R,
     .help = "A stats line per source in the log every this many seconds (batches/s, "
             "events/s, router events, gaps, replays, barriers, drops, NATS pending "
             "bytes, engine load, p99 batch time); one line when nothing happened; 0 = "
             "off."},

    {.key = "state.dir", .type = T_STR, .off = TOP(state.dir, char *), .def = "",
     .help = "Directory where cursors persist across restarts; \"\" = none. "
             "Created (with its parents, mode 0700) at start and by --check when "
             "missing; it must be writable, else kvbridge exits with 73 "
             "(EX_CANTCREAT)."},

    {.key = "limits.max_payload_bytes", .type = T_U64,
     .off = TOP(limits.max_payload_bytes, uint64_t), .def = "16777216", .min = 1,
     .max = 1073741824, .flags = R,
     .help = "Largest engine message accepted, in bytes (16 MiB by default); "
             "larger ones are counted as malformed (in bind mode a peer that sends "
             "one is disconnected before it is buffered; the loss shows as a gap). "
             "Decoding a message takes up to "
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
    {.key = "limits.max_resident_blocks", .type = T_U64,
     .off = TOP(limits.max_resident_blocks, uint64_t), .def = "1048576", .min = 0,
     .max = 1073741824,
     .help = "Most blocks the residency mirror holds over every (worker_id, dp_rank, "
             "tier), about 48 bytes each (up to 85 right after its tables grew): 1M "
             "blocks in 48-85 MB. A store past it is refused with a loud error and a "
             "\"cleared\" barrier for that pair. 0 turns the mirror and the query API "
             "off."},
    {.key = "limits.max_tracked_blocks", .type = T_U64,
     .off = TOP(limits.max_tracked_blocks, uint64_t), .def = "1048576", .min = 0,
     .max = 1073741824, .flags = R,
     .help = "Most entries the pipeline's block tracker holds over every (worker_id, "
             "dp_rank): one per (tier, block hash) resident copy set and one per "
             "salted block's cache namespace, 53-107 bytes each. When it is full, the "
             "tracker starts again empty and every pair gets a \"cleared\" barrier "
             "(cause tracker_full). 0 tracks nothing: removes are published at the "
             "first copy and no store inherits its parent's namespace."},

    {.key = "query.recent_events", .type = T_U32,
     .off = TOP(query.recent_events, uint32_t), .def = "4096", .min = 0, .max = 1048576,
     .help = "Router events kept per (worker_id, dp_rank) for /v1/events (a consumer "
             "with a short gap asks for the events after an event_id instead of a dump); "
             "about 552 bytes each. 0 keeps none."},
    {.key = "query.subject", .type = T_STR, .off = TOP(query.subject, char *),
     .def = "kvbridge.query.{worker_id}", .check = check_query_subject,
     .help = "NATS subject of the query API's request/reply ({namespace}, {component} "
             "and {worker_id} are replaced); \"\" = HTTP only."},
};
/* clang-format on */
#undef R
#undef C
#undef I32MAX

#define N_OPTS (sizeof opts / sizeof opts[0])

/* The table for the other files of the module (config_priv.h). */
const struct opt *const kvb_cfg_opts = opts;
const size_t kvb_cfg_nopts = N_OPTS;

const struct opt *kvb_cfg_find_opt(const char *key)
{
    for (size_t i = 0; i < N_OPTS; i++)
        if (strcmp(opts[i].key, key) == 0)
            return &opts[i];
    return NULL;
}

size_t kvb_cfg_opt_index(const char *key)
{
    const struct opt *o = kvb_cfg_find_opt(key);
    return (size_t)(o - opts);
}
