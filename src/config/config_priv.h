/* config_priv: what the config module's files share.  Not for other modules.
 *
 * The files, each with the files of the module it calls (a DAG, config.c
 * at the top; `make lint` fails on a cycle between files, mk/file-graph.sh):
 *
 *   config.c       the entry: load (the walk of the tree against the
 *                  table), free             -> check value yaml table util
 *   check.c        checks across keys, the files they name (CURVE keys,
 *                  secrets, worker_id_file) -> secret table url util
 *   value.c        one value to its typed field, the defaults -> table util
 *   write.c        the commented example, the effective values
 *                                           -> table url util
 *   reload.c       what SIGHUP may change   -> table
 *   yaml.c         the file read and turned into a node tree -> util
 *   table.c        the table, one row per key -> check_value (the rows' .check)
 *   check_value.c  the checks of one value  -> url util
 *   url.c          URLs through libcurl's CURLU (url.h, for the sink too)
 *                                           -> none
 *   secret.c       secret files, Z85 and NKey keys (secret.h) -> none
 *   util.c         messages, strings, numbers -> none
 *
 * Ownership: kvb_cfg_parse() allocates the tree; kvb_cfg_node_free() frees it
 * (zeroing every scalar: they may be secrets) and accepts NULL.  Functions
 * returning char * return a malloc'd string the caller frees.
 */
#ifndef KVB_CONFIG_PRIV_H
#define KVB_CONFIG_PRIV_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define MAX_NODES 65536 /* YAML nodes in one file */
#define MAX_NESTING 32  /* YAML nesting levels */

/* One load: where errors go and what was read. */
struct ctx {
    const char *path;
    FILE *err;
    unsigned nerr;
    bool oom;
    size_t nnodes;
    const char *buf; /* the file, for reader-error positions */
    size_t len;
    const char *creds_dir; /* $CREDENTIALS_DIRECTORY, NULL when unset or "" */
};

/* ---- messages (util.c) -------------------------------------------- */

/* Report an error: "FILE:LINE:COL: message", or "FILE: message" for line 0
 * (the whole file).  At most MAX_ERRORS (util.c) are printed; every one is
 * counted in c->nerr. */
void kvb_cfg_verr(struct ctx *c, size_t line, size_t col, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));
/* Report "out of memory" once and set c->oom. */
void kvb_cfg_oom(struct ctx *c);
static inline void err_at(struct ctx *c, size_t line, size_t col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline void err_at(struct ctx *c, size_t line, size_t col, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvb_cfg_verr(c, line, col, fmt, ap);
    va_end(ap);
}

static inline void oom(struct ctx *c) { kvb_cfg_oom(c); }

static inline bool has_prefix(const char *s, const char *p)
{
    return strncmp(s, p, strlen(p)) == 0;
}

/* ---- strings and numbers (util.c) --------------------------------- */

/* malloc'd printf; NULL when out of memory (reported when C is not NULL). */
char *kvb_cfg_asprintf(struct ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Free a string of the config, zeroed first (it may be a secret). */
void kvb_cfg_str_free(char *s);
/* "a, b or c" into a malloc'd string; NULL when out of memory (reported when
 * C is not NULL). */
char *kvb_cfg_join_values(struct ctx *c, const char *const *values, const char *last_sep);
void kvb_cfg_free_strlist(char **list, size_t n);
/* 0 ok, -1 not a decimal integer, -2 negative, -3 above UINT64_MAX. */
int kvb_cfg_parse_u64(const char *s, size_t len, uint64_t *out);
/* PORT of "...:PORT" (the last colon), or -1 when not a number in 0..65535. */
long kvb_cfg_port_of(const char *s);

#define MAX_SHOWN_PATH 240 /* bytes of a file name quoted in a message */

/* A user value made safe for a one-line message: printable ASCII kept (and
 * UTF-8 bytes), controls as \xNN, cut after MAX bytes, or MAX_SHOWN (util.c)
 * for kvb_cfg_shown(); NULL when out of memory (SHOWN() gives a
 * placeholder). */
char *kvb_cfg_shown_max(const char *s, size_t len, size_t max);
char *kvb_cfg_shown(const char *s, size_t len);
#define SHOWN(s) ((s) ? (s) : "?")

/* ---- the YAML file as a node tree (yaml.c) ------------------------ */

enum nkind { N_SCALAR, N_SEQ, N_MAP, N_BAD /* an alias: already reported */ };

struct node {
    enum nkind kind;
    bool plain;       /* scalar written without quotes */
    size_t line, col; /* 1-based */
    char *s;          /* scalar, NUL-terminated (may hold NULs: see len) */
    size_t len;
    struct node **kid; /* seq: items; map: key, value, key, value, ... */
    size_t n, cap;
};

/* Read the file c->path (at most 1 MiB, a regular file) into *out (malloc'd;
 * zero it before freeing) and *outlen.  0, or negative errno (reported). */
int kvb_cfg_read_file(struct ctx *c, char **out, size_t *outlen);
/* Parse c->buf (c->len bytes) into *root, bounded by MAX_NODES nodes and
 * MAX_NESTING levels, aliases refused (reported; N_BAD nodes).  0 (*root is
 * NULL for a stream without a document; check c->nerr for non-fatal
 * errors), or -1 after a fatal error was reported. */
int kvb_cfg_parse(struct ctx *c, struct node **root);
void kvb_cfg_node_free(struct node *n);
/* "a list", "a mapping" or "a single value", for messages. */
const char *kvb_cfg_kind_name(const struct node *n);
/* A plain scalar YAML reads as null: "", ~, null, Null, NULL. */
bool kvb_cfg_is_null(const struct node *n);

/* ---- the table (table.c) ----------------------------------------- */

enum otype {
    T_U64,        /* uint64_t, decimal */
    T_U32,        /* uint32_t, decimal */
    T_BOOL,       /* bool: true | false */
    T_STR,        /* char *, "" allowed */
    T_ENUM,       /* int: index into values[] */
    T_STRLIST,    /* char ** + size_t count at noff */
    T_TIERS,      /* uint32_t bitmask of 1u << enum kvb_tier */
    T_BLOCKSIZE,  /* uint32_t, integer in min..max or "auto" -> 0 */
    T_SOURCES,    /* struct kvb_source_cfg * + size_t count at noff */
    T_TOPICS,     /* struct kvb_topic_cfg * + size_t count at noff: a mapping of
                  * exact topics (keys) to worker ids (u64 values) */
    T_LORA_NAMES, /* struct kvb_lora_name_cfg * + size_t count at noff: a mapping
                   * of LoRA ids (decimal keys) to adapter names */
};

#define F_REQUIRED 1u /* no default: absent is an error; def is the example's value */
#define F_RELOAD 2u   /* SIGHUP may change it */
#define F_SECRET 4u   /* T_STR never shown, zeroed when freed */
#define F_PATH \
    8u              /* T_STR file name: resolved (see resolve_path()) and checked
                       * readable at load; with .fills, read into that key */
#define F_CONN 16u  /* the NATS connection is made from it (kvb_config_nats_equal) */
#define F_EMPTY 32u /* T_STRLIST: an empty list is allowed (and the default "" is one) */
#define F_WORKER \
    64u /* sources[]: the worker's identity, not how the source is opened
                       * (kvb_config_worker_equal(), not kvb_config_source_equal()) */
#define F_INHERIT \
    128u /* sources[]: absent (or ~) takes the value of the top-level key
                        * of the same name, after the whole file was read */

struct opt;

/* Extra validation of a converted value; reports and returns -1 when bad. */
typedef int check_fn(struct ctx *c, const struct opt *o, const char *dpath, const void *field,
                     const struct node *v);

struct opt {
    const char *key; /* dotted path; "sources[].x" for keys of each source */
    enum otype type;
    size_t off;                /* into struct kvb_config, or struct kvb_source_cfg */
    size_t noff;               /* T_STRLIST, T_SOURCES: the size_t element count */
    const char *def;           /* default as text; lists: comma-separated */
    uint64_t min, max;         /* integers, block_size */
    const char *const *values; /* T_ENUM: allowed strings, NULL-terminated */
    unsigned flags;
    check_fn *check;
    const char *fills; /* F_PATH: the F_SECRET key its file's content goes to */
    const char *alt;   /* F_REQUIRED: absent is fine when this key is set (not "") */
    const char *help;
};

/* One mark per table row: where the key's value was, if it was present. */
struct mark {
    size_t line, col;
    bool set;
    bool bad; /* present but rejected: skip cross-checks that use it */
};

#define SRC_PREFIX "sources[]"

static inline bool in_sources(const struct opt *o)
{
    return strncmp(o->key, SRC_PREFIX ".", sizeof SRC_PREFIX) == 0;
}

#define ENGINE_PREFIX SRC_PREFIX ".engine."
static inline bool is_engine_key(const struct opt *o)
{
    return strncmp(o->key, ENGINE_PREFIX, sizeof ENGINE_PREFIX - 1) == 0;
}

#define MAX_TOPICS 64       /* sources[].topics entries (source.c: 64 streams a source) */
#define MAX_LORA_NAMES 1024 /* sources[].lora_names entries */
#define MAX_LORA_NAME 255   /* bytes of one adapter name */
#define MAX_TOPIC_LEN 255   /* bytes of one topic (source.c: MAX_TOPIC - 1) */

/* opts[] of table.c and its row count. */
extern const struct opt *const kvb_cfg_opts;
extern const size_t kvb_cfg_nopts;
/* The row for KEY, or NULL. */
const struct opt *kvb_cfg_find_opt(const char *key);
/* The index of the row for KEY, which must exist. */
size_t kvb_cfg_opt_index(const char *key);

/* ---- values (value.c) --------------------------------------------- */

/* One scalar into its field (0, or -1 after reporting at line:col); one item
 * of a list; the table's defaults for the top level or one source (0, or -1
 * out of memory). */
int kvb_cfg_conv(struct ctx *c, const struct opt *o, const char *dpath, const char *s, size_t len,
                 size_t line, size_t col, void *field);
int kvb_cfg_conv_item(struct ctx *c, const struct opt *o, const char *dpath, size_t i,
                      const char *s, size_t len, size_t line, size_t col, char **str,
                      uint32_t *mask);
int kvb_cfg_apply_defaults(struct ctx *c, void *base, bool sources_scope);

/* ---- checks of one value (check_value.c), named by the table's .check */

check_fn kvb_cfg_check_endpoint, kvb_cfg_check_opt_endpoint, kvb_cfg_check_subject,
    kvb_cfg_check_word, kvb_cfg_check_format, kvb_cfg_check_listen, kvb_cfg_check_host,
    kvb_cfg_check_js_template, kvb_cfg_check_server_url, kvb_cfg_check_query_subject,
    kvb_cfg_check_http_url, kvb_cfg_check_etcd_url;

/* ---- checks across keys (check.c) --------------------------------- */

/* Checks across keys, once the tree was walked; they report and set the
 * marks (M, one per table row) of keys found bad.  kvb_cfg_resolve_files():
 * every F_PATH key set made absolute, its file read into the key it .fills or
 * checked readable.  kvb_cfg_check_config(): the whole config.
 * kvb_cfg_check_source() and kvb_cfg_check_curve(): source I (its CURVE key
 * files read into s->curve). */
struct kvb_config;
struct kvb_source_cfg;
void kvb_cfg_resolve_files(struct ctx *c, struct kvb_config *cfg, struct mark *m);
void kvb_cfg_check_config(struct ctx *c, struct kvb_config *cfg, struct mark *m);
void kvb_cfg_check_source(struct ctx *c, const struct kvb_source_cfg *s, size_t i,
                          const struct mark *m);
void kvb_cfg_check_curve(struct ctx *c, struct kvb_source_cfg *s, size_t i, struct mark *m);
/* sources[I].engine: dead_after_ms at least scrape_interval_ms. */
void kvb_cfg_check_engine(struct ctx *c, const struct kvb_source_cfg *s, size_t i,
                          const struct mark *m);

#endif
