/* config: the YAML file (docs/configuration.md), parsed through libyaml.
 *
 * One table in config.c (key, type, offset, default, limits, reloadable, help)
 * drives parsing, defaults, validation, --check and the commented example
 * (conf/kvbridge.yaml is kvb_config_write_example()'s output; a unit test keeps
 * them equal).  Unknown keys and bad values are errors reported as
 * "FILE:LINE:COLUMN: message".
 *
 * Ownership: kvb_config_load() allocates the config and everything in it; the
 * caller frees it with kvb_config_free(), which accepts NULL and sets the
 * pointer to NULL.  A config is immutable once loaded: SIGHUP loads a new one
 * and swaps pointers.
 */
#ifndef KVB_CONFIG_H
#define KVB_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KVB_EX_CONFIG 78      /* sysexits EX_CONFIG */
#define KVB_EX_UNAVAILABLE 69 /* sysexits EX_UNAVAILABLE */
#define KVB_EX_CANTCREAT 73   /* sysexits EX_CANTCREAT: state.dir unusable */
#define KVB_EX_TEMPFAIL \
    75 /* sysexits EX_TEMPFAIL: stopped with router events
                               * NATS did not confirm (flush timed out) */

enum kvb_source_mode { KVB_MODE_CONNECT = 0, KVB_MODE_BIND = 1 };
/* How a dp_size expansion names rank r's endpoints (sources[].rank_naming). */
enum kvb_rank_naming {
    KVB_RANKS_PORT = 0, /* tcp://HOST:(PORT + r) */
    KVB_RANKS_TRTLLM,   /* TensorRT-LLM: ipc:// and inproc:// PATH for rank 0, then
                         * PATH_dp1, PATH_dp2, ...; tcp:// as KVB_RANKS_PORT */
};
enum kvb_format { KVB_FORMAT_DYNAMO_JSON = 0, KVB_FORMAT_DYNAMO_MSGPACK, KVB_FORMAT_RAW };
/* The values match nats.c's jsRetentionPolicy. */
enum kvb_js_retention { KVB_JS_LIMITS = 0, KVB_JS_INTEREST, KVB_JS_WORKQUEUE };

/* ZMQ CURVE of one source (sources[].curve; off when secret_key_file is "").
 * The file names are resolved at load like the nats files; the keys are read,
 * checked and decoded then (not keys of the file).  secret_key is a secret:
 * never printed, zeroed by kvb_config_free(). */
struct kvb_curve_cfg {
    char *secret_key_file;      /* "" = CURVE off */
    char *server_public_key;    /* connect mode: the engine's key, Z85; "" = none */
    char *allowed_clients_file; /* bind mode: "" = any client with our public key */
    bool enabled;               /* secret_key_file is set */
    uint8_t secret_key[32];     /* from secret_key_file */
    uint8_t server_key[32];     /* server_public_key decoded (connect mode) */
    uint8_t (*allowed)[32];     /* allowed_clients_file's keys; NULL when none */
    size_t n_allowed;           /* >= 1 when allowed_clients_file is set */
};

/* The engine's HTTP face (sources[].engine), for load and liveness (scrape.h,
 * engine.h).  Off when both URLs are "". */
struct kvb_engine_cfg {
    int kind;                    /* enum kvb_engine_kind (engine/load.h): vllm, sglang */
    char *metrics_url;           /* http(s) URL of its Prometheus /metrics; "" = none */
    char *health_url;            /* e.g. vLLM's /health; "" = none */
    uint32_t scrape_interval_ms; /* a round every ...; also the request timeout */
    uint32_t dead_after_ms;      /* failing this long AND no batch: gone */
};

/* sources[].topics: batches on this exact topic carry this worker_id. */
struct kvb_topic_cfg {
    char *topic; /* not empty, no NUL */
    uint64_t worker_id;
};

/* sources[].lora_names: the name of the LoRA adapter an engine's lora_id
 * stands for. */
struct kvb_lora_name_cfg {
    uint64_t id; /* 0..INT64_MAX, each once */
    char *name;  /* not empty, no NUL, at most 255 bytes */
};

struct kvb_source_cfg {
    char *endpoint;            /* required, e.g. tcp://127.0.0.1:5557; "" with discover */
    char *discover;            /* the engine's HTTP address listing its endpoints; "" = none */
    char *replay_endpoint;     /* "" when none */
    char *topic;               /* subscription prefix, "" = everything */
    int mode;                  /* enum kvb_source_mode */
    uint32_t dp_size;          /* >= 1; N > 1 expands to ports base+0..base+N-1 */
    uint32_t dp_rank;          /* rank when a batch carries none (first of the expansion) */
    int rank_naming;           /* enum kvb_rank_naming */
    uint32_t rcvhwm;           /* ZMQ_RCVHWM of the SUB (messages) */
    uint32_t reconnect_max_ms; /* connect mode: reconnect interval cap */
    uint32_t max_peers;        /* bind mode: connections taken at once */
    struct kvb_curve_cfg curve;
    struct kvb_engine_cfg engine;
    /* The worker this source's engine is (the identity its router events
     * carry).  A key the source leaves out (or sets to ~) takes the top-level
     * key's value at load, so these always hold the effective values.  They
     * are not how the source is opened: kvb_config_source_equal() leaves
     * them out, and a reload hands them to the running source. */
    uint64_t worker_id;
    uint32_t block_size; /* 0 = "auto" */
    bool lora_salt;
    uint32_t forward_tiers; /* bitmask of (1u << enum kvb_tier) */
    /* lora_id -> adapter name, for events that carry a lora_id without a
     * lora_name (a worker key: a reload hands it to the running source). */
    struct kvb_lora_name_cfg *lora_names;
    size_t n_lora_names;
    /* The model's image token id, 0 = none (a worker key): pad substitution,
     * docs/router-events.md. */
    uint64_t image_token_id;
    uint64_t video_token_id;
    /* Exact topic -> worker_id (several engines on one bind-mode SUB); a
     * batch on a topic not listed is dropped.  n_topics == 0: no map, every
     * topic is this source's worker_id.  A source key: a change reopens it. */
    struct kvb_topic_cfg *topics;
    size_t n_topics;
    uint32_t inherited; /* at load: bit k set when the k-th row of the table
                             * that inherits a top-level key was absent */
};

struct kvb_config {
    char *path; /* the file it came from */

    uint64_t worker_id;   /* required: from the file, or read from worker_id_file */
    char *worker_id_file; /* "" = none; else resolved like the nats files and
                               * read at load (worker_id then holds its number) */
    uint32_t block_size;  /* 0 = "auto" */
    bool lora_salt;
    uint32_t forward_tiers; /* bitmask of (1u << enum kvb_tier) */
    char *cache_namespace;  /* tokens_hash salt (docs/router-events.md section 3.1); "" = none */

    struct kvb_source_cfg *sources;
    size_t n_sources; /* >= 1 */

    struct {
        char **servers; /* >= 1 */
        size_t n_servers;
        bool discovered_servers; /* also use the servers a server advertises */
        char *subject;           /* template: {namespace} {component} {endpoint} {worker_id}
                               * {dp_rank}; for dynamo-msgpack, when the file does not
                               * set it, the endpoint-scoped subject */
        char *namespace_;
        char *component;
        char *endpoint;        /* {endpoint}: the worker's KV-state endpoint */
        int format;            /* enum kvb_format */
        bool batch;            /* dynamo-msgpack: arrays of RouterEvents per message */
        bool coalesce;         /* merge adjacent events of one engine batch */
        bool residency_domain; /* dynamo-msgpack: write residency_domain "worker" */
        /* Authentication: at most one method (user+password, token, nkey,
         * credentials).  Paths are resolved at load (a relative name is looked
         * up in $CREDENTIALS_DIRECTORY when set, else next to the config
         * file) and were readable then.  Secrets (password, token, nkey_seed)
         * hold the value itself, from the file or from its *_file; they are
         * never printed, and kvb_config_free() zeroes them. */
        char *credentials;               /* .creds file (user JWT + seed); "" = none */
        char *user;                      /* "" = none; with password */
        char *password;                  /* secret; "" = none */
        char *password_file;             /* the file password was read from; "" = none */
        char *token;                     /* secret; "" = none */
        char *token_file;                /* "" = none */
        char *nkey_seed;                 /* secret: a user NKey seed "SU..."; "" = none */
        char *nkey_seed_file;            /* "" = none */
        char *nkey_public;               /* derived from nkey_seed ("U..."); "" = none.
                               * Not a key of the file. */
        uint32_t connect_timeout_ms;     /* 0 = wait for NATS forever at start */
        uint64_t reconnect_buffer_bytes; /* nats.c reconnect buffer */
        uint32_t reconnect_wait_ms;      /* first backoff step */
        uint32_t reconnect_wait_max_ms;  /* backoff ceiling */
        uint32_t flush_timeout_ms;       /* drain at shutdown */
        /* Repairs (docs/router-events.md section 6): every reconnection of
         * core NATS repaired like a loss; and the pace of every repair. */
        bool resync_on_reconnect;
        uint64_t repair_bytes_per_s;
        struct {
            bool enabled;      /* also true when a server URL is tls:// */
            char *ca;          /* CA file (PEM); "" = the system trust store */
            char *cert;        /* client certificate chain (PEM); "" = none */
            char *key;         /* its private key (PEM); set iff cert is */
            bool verify;       /* verify the server's certificate */
            char *server_name; /* host name the certificate must match; "" = none */
        } tls;
        struct {
            bool enabled;
            char *stream;       /* "" = namespace-{namespace}-component-{component}-kv-events */
            char *subject;      /* "" = "<stream>.queue" (Dynamo's durable mode) */
            bool create;        /* create the stream when it is missing */
            int retention;      /* enum kvb_js_retention */
            uint32_t max_age_s; /* 0 = unlimited */
            uint32_t replicas;  /* 1..5 */
            uint32_t duplicate_window_s; /* the stream's duplicate window */
            uint32_t max_pending;        /* unacknowledged publishes in flight */
            uint32_t ack_timeout_ms;     /* per publish; then it is sent again */
            /* Resolved at load from the two above (placeholders {namespace},
             * {component} and {worker_id} expanded, defaults applied); not
             * keys of the file.  Never NULL after a successful load; checked
             * (a valid stream name, a subject without wildcards) only when
             * enabled. */
            char *stream_name;
            char *subject_name;
        } jetstream;
    } nats;

    struct {
        uint32_t timeout_ms;  /* whole replay request, then barrier */
        uint32_t max_ms;      /* whole replay, wall time, then barrier */
        uint64_t max_batches; /* a larger gap (or reply) is a barrier */
    } replay;

    struct {
        struct {
            char **endpoints; /* etcd v3 JSON gateway URLs; none = discovery off */
            size_t n_endpoints;
            uint32_t lease_ttl_s;
        } etcd;
        /* Dynamo's recovery query (include/recovery.h) */
        struct {
            bool enabled;
            int request_plane; /* enum kvb_recovery_plane: nats, tcp */
            char *listen;      /* the TCP request plane: HOST:PORT */
            char *advertise;   /* what routers connect to: HOST[:PORT]; "" = listen's */
        } recovery;
    } discovery;

    struct {
        char *listen; /* "" disables; default 127.0.0.1:9464 */
    } metrics;

    struct {
        int level;                 /* enum kvb_log_level */
        uint32_t stats_interval_s; /* a stats line per source every ...; 0 = off */
    } log;

    struct {
        char *dir; /* "" = no persistence */
    } state;

    struct {
        uint64_t max_payload_bytes;
        uint32_t max_events_per_batch;
        uint32_t max_hashes_per_event;
        uint32_t max_tokens_per_event;
        uint32_t max_depth;
        uint64_t max_resident_blocks; /* residency mirror; 0 = off */
        uint64_t max_tracked_blocks;  /* pipeline's block tracker; 0 = off */
    } limits;

    struct {
        uint32_t recent_events; /* ring per (worker_id, dp_rank) */
        char *subject;          /* NATS request/reply template; "" = none */
    } query;
};

/* Parse and validate PATH.  On success returns 0 and sets *out.  On failure
 * returns -EINVAL (bad content) or -errno (unreadable; -ENOMEM when out of
 * memory), leaves *out untouched, and writes every error found, one
 * "FILE:LINE:COLUMN: message" per line, to err (may be NULL); errors about
 * the whole file are "FILE: message" ("cannot read: ...", larger than 1 MiB).
 * At most 100 errors are printed, then one "too many errors" line. */
int kvb_config_load(const char *path, struct kvb_config **out, FILE *err);
/* The same, logging the errors through the log module (so that they carry
 * the journal priority). */
int kvb_config_load_logged(const char *path, struct kvb_config **out);

/* Frees everything; secrets (and the file's text and parse tree at load) are
 * zeroed with explicit_bzero() first.  Accepts NULL and *cfg == NULL. */
void kvb_config_free(struct kvb_config **cfg);

/* Write the commented example (every key, its default and help) to f. */
int kvb_config_write_example(FILE *f);

/* Write the effective values of CFG (after ${VAR} expansion, defaults and
 * the files read), one "key: value" line per key of the table, the keys of
 * each source as sources[I].key, to f (`kvbridge --check -v`).  Secrets are
 * shown as (redacted) when set, and so is the user information of a server
 * URL.  0, or -EIO when writing failed. */
int kvb_config_write_effective(const struct kvb_config *cfg, FILE *f);

/* True when every key the NATS connection is made from (servers, auth, TLS,
 * reconnect settings: the rows flagged as such in the table) is equal in A
 * and B, secrets included.  SIGHUP replaces the sink only when this is false. */
bool kvb_config_nats_equal(const struct kvb_config *a, const struct kvb_config *b);

/* True when two sources are opened the same way: every sources[] key equal,
 * and the CURVE keys read from the files too.  SIGHUP reopens the sources
 * when a source differs (or their number does). */
bool kvb_config_source_equal(const struct kvb_source_cfg *a, const struct kvb_source_cfg *b);

/* True when the two sources' engine maps (sources[].engine.*) are equal.
 * kvb_config_source_equal() leaves them out: the engine's HTTP face is not
 * how the source is opened, and changing it does not reopen the source. */
bool kvb_config_engine_equal(const struct kvb_source_cfg *a, const struct kvb_source_cfg *b);

/* True when the two sources' worker keys (worker_id, block_size, lora_salt,
 * forward_tiers) are equal.  kvb_config_source_equal() leaves them
 * out: a reload hands them to the running source (kvb_source_set_worker()). */
bool kvb_config_worker_equal(const struct kvb_source_cfg *a, const struct kvb_source_cfg *b);

/* SIGHUP: 0 when NEW may replace OLD in a running process; -EINVAL with a
 * message on err when a key that needs a restart changed (with JetStream on,
 * also when the resolved stream or subject changed through nats.namespace,
 * nats.component or worker_id). */
int kvb_config_check_reload(const struct kvb_config *old_cfg, const struct kvb_config *new_cfg,
                            FILE *err);

#endif
