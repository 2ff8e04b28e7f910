/* config_priv: what the config module's files share (src/config.c: the table,
 * the checks, the example; src/config_yaml.c: the YAML file as a node tree).
 * Not for other modules.
 *
 * Ownership: kvb_cfg_parse() allocates the tree; kvb_cfg_node_free() frees it
 * (zeroing every scalar: they may be secrets) and accepts NULL.
 */
#ifndef KVB_CONFIG_PRIV_H
#define KVB_CONFIG_PRIV_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

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

/* Report an error: "FILE:LINE:COL: message", or "FILE: message" for line 0
 * (the whole file).  At most MAX_ERRORS are printed; every one is counted
 * in c->nerr. */
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

/* ---- the YAML file as a node tree (config_yaml.c) ------------------------ */

enum nkind { N_SCALAR, N_SEQ, N_MAP, N_BAD /* an alias: already reported */ };

struct node {
    enum nkind kind;
    bool plain;          /* scalar written without quotes */
    size_t line, col;    /* 1-based */
    char *s;             /* scalar, NUL-terminated (may hold NULs: see len) */
    size_t len;
    struct node **kid;   /* seq: items; map: key, value, key, value, ... */
    size_t n, cap;
};

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

#endif
