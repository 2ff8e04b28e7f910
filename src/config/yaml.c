/* config_yaml: the configuration file read into memory and turned into a
 * bounded node tree, through libyaml's event parser (see src/config/config_priv.h).
 * Every node keeps the 1-based line and column where it starts, for the
 * "FILE:LINE:COL" messages that kvb_cfg_verr() prints.
 */
#include "config_priv.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#define MAX_EXPANDED (1u << 20)   /* bytes of one value after ${VAR} expansion */
#define MAX_FILE_BYTES (1u << 20) /* 1 MiB */

/* Scalars may be secrets (nats.password, ...): every copy the parser made is
 * zeroed before it is freed.  libyaml's scanner also builds each scalar in
 * temporary buffers that it frees without zeroing; *_file keys keep secrets
 * out of the YAML entirely. */
void kvb_cfg_node_free(struct node *n)
{
    if (!n)
        return;
    for (size_t i = 0; i < n->n; i++)
        kvb_cfg_node_free(n->kid[i]);
    free(n->kid);
    if (n->s)
        explicit_bzero(n->s, n->len);
    free(n->s);
    free(n);
}

static void event_free(yaml_event_t *ev)
{
    if (ev->type == YAML_SCALAR_EVENT && ev->data.scalar.value)
        explicit_bzero(ev->data.scalar.value, ev->data.scalar.length);
    yaml_event_delete(ev);
}

static void parser_free(yaml_parser_t *p)
{
    if (p->raw_buffer.start)
        explicit_bzero(p->raw_buffer.start, (size_t)(p->raw_buffer.end - p->raw_buffer.start));
    if (p->buffer.start)
        explicit_bzero(p->buffer.start, (size_t)(p->buffer.end - p->buffer.start));
    yaml_parser_delete(p);
}

const char *kvb_cfg_kind_name(const struct node *n)
{
    switch (n->kind) {
    case N_SEQ: return "a list";
    case N_MAP: return "a mapping";
    default: return "a single value";
    }
}

bool kvb_cfg_is_null(const struct node *n)
{
    if (n->kind != N_SCALAR || !n->plain)
        return false;
    return n->len == 0 || strcmp(n->s, "~") == 0 || strcmp(n->s, "null") == 0 ||
           strcmp(n->s, "Null") == 0 || strcmp(n->s, "NULL") == 0;
}

static void parser_error(struct ctx *c, const yaml_parser_t *p)
{
    const char *problem = p->problem ? p->problem : "invalid YAML";
    if (p->error == YAML_MEMORY_ERROR) {
        oom(c);
    } else if (p->error == YAML_READER_ERROR) {
        /* Only a byte offset: count lines and characters up to it. */
        size_t line = 1, col = 1, end = p->problem_offset;
        if (end > c->len)
            end = c->len;
        for (size_t i = 0; i < end; i++) {
            unsigned char ch = (unsigned char)c->buf[i];
            if (ch == '\n') {
                line++;
                col = 1;
            } else if ((ch & 0xc0) != 0x80) {
                col++;
            }
        }
        if (p->problem_value >= 0)
            err_at(c, line, col, "%s (byte 0x%02x)", problem, p->problem_value);
        else
            err_at(c, line, col, "%s", problem);
    } else if (p->context) {
        err_at(c, p->problem_mark.line + 1, p->problem_mark.column + 1, "%s (%s at %zu:%zu)",
               problem, p->context, p->context_mark.line + 1, p->context_mark.column + 1);
    } else {
        err_at(c, p->problem_mark.line + 1, p->problem_mark.column + 1, "%s", problem);
    }
}

static int next_event(struct ctx *c, yaml_parser_t *p, yaml_event_t *ev)
{
    if (!yaml_parser_parse(p, ev)) {
        parser_error(c, p);
        return -1;
    }
    return 0;
}

static int add_kid(struct ctx *c, struct node *parent, struct node *kid)
{
    if (parent->n == parent->cap) {
        size_t ncap = parent->cap ? parent->cap * 2 : 8;
        struct node **k = realloc(parent->kid, ncap * sizeof *k);
        if (!k) {
            oom(c);
            return -1;
        }
        parent->kid = k;
        parent->cap = ncap;
    }
    parent->kid[parent->n++] = kid;
    return 0;
}

/* ---- ${VAR} in values ------------------------------------------------------
 *
 * In every scalar that is not a mapping key: ${NAME} is the environment
 * variable NAME (an error when it is unset), ${NAME:-default} the variable,
 * or default when it is unset or empty (default runs to the first '}'), and
 * $$ is one '$'.  Any other '$' stays as it is.  NAME is
 * [A-Za-z_][A-Za-z0-9_]*.  The result is never a YAML null (a plain value
 * that expands to "" is the empty string). */

static bool name_start(char ch)
{
    return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || ch == '_';
}

static bool name_char(char ch) { return name_start(ch) || (ch >= '0' && ch <= '9'); }

/* The construct at s[i] (a '$'): what replaces it in *val and *vlen, and its
 * length in the scalar in *used.  0, or -1 after reporting. */
static int env_ref(struct ctx *c, const struct node *n, size_t i, const char **val, size_t *vlen,
                   size_t *used)
{
    const char *s = n->s;
    size_t len = n->len, k = i + 2;
    if (i + 1 < len && s[i + 1] == '$') {
        *val = "$";
        *vlen = 1;
        *used = 2;
        return 0;
    }
    if (i + 1 >= len || s[i + 1] != '{') {
        *val = "$";
        *vlen = 1;
        *used = 1;
        return 0;
    }
    while (k < len && name_char(s[k]))
        k++;
    size_t name_len = k - (i + 2);
    const char *def = NULL, *end = NULL;
    if (name_len > 0 && name_start(s[i + 2]) && k < len) {
        if (s[k] == '}')
            end = s + k;
        else if (s[k] == ':' && k + 1 < len && s[k + 1] == '-' &&
                 (end = memchr(s + k + 2, '}', len - k - 2)))
            def = s + k + 2;
    }
    if (!end) {
        err_at(c, n->line, n->col,
               "'${' without a valid ${NAME} or ${NAME:-default} "
               "(write $$ for a literal $)");
        return -1;
    }
    char name[256];
    if (name_len >= sizeof name) {
        err_at(c, n->line, n->col, "environment variable name longer than %zu characters",
               sizeof name - 1);
        return -1;
    }
    memcpy(name, s + i + 2, name_len);
    name[name_len] = '\0';
    const char *v = getenv(name);
    if (def && (!v || !*v)) {
        *val = def;
        *vlen = (size_t)(end - def);
    } else if (v) {
        *val = v;
        *vlen = strlen(v);
    } else {
        err_at(c, n->line, n->col,
               "environment variable %s is not set (${%s:-default} "
               "gives a default)",
               name, name);
        return -1;
    }
    *used = (size_t)(end - s) + 1 - i;
    return 0;
}

/* Expand the scalar N in place (see above).  0, or -1 after reporting (the
 * node is then N_BAD: already reported). */
static int expand_env(struct ctx *c, struct node *n)
{
    if (!memchr(n->s, '$', n->len))
        return 0;
    char *out = NULL;
    size_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        size_t o = 0;
        for (size_t i = 0; i < n->len;) {
            const char *val;
            size_t vlen, used;
            if (n->s[i] != '$') {
                val = n->s + i;
                vlen = used = 1;
            } else if (env_ref(c, n, i, &val, &vlen, &used) < 0) {
                goto bad;
            }
            if (out)
                memcpy(out + o, val, vlen);
            o += vlen;
            i += used;
            if (o > MAX_EXPANDED) {
                err_at(c, n->line, n->col,
                       "the value is longer than %u bytes once the "
                       "environment variables are in",
                       MAX_EXPANDED);
                goto bad;
            }
        }
        if (out) {
            out[o] = '\0';
            break;
        }
        total = o;
        if (!(out = malloc(total + 1))) {
            oom(c);
            return -1;
        }
    }
    explicit_bzero(n->s, n->len);
    free(n->s);
    n->s = out;
    n->len = total;
    n->plain = false;
    return 0;
bad:
    if (out) {
        explicit_bzero(out, total + 1);
        free(out);
    }
    n->kind = N_BAD;
    return 0;
}

static int build(struct ctx *c, yaml_parser_t *p, yaml_event_t *ev, unsigned depth, bool is_key,
                 struct node **out);

/* N: the scalar of EV (IS_KEY: a mapping key, taken as it is; a value has
 * its ${VAR} expanded).  0, or -1 after reporting. */
static int build_scalar(struct ctx *c, const yaml_event_t *ev, bool is_key, struct node *n)
{
    n->kind = N_SCALAR;
    n->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
    n->len = ev->data.scalar.length;
    n->s = malloc(n->len + 1);
    if (!n->s) {
        oom(c);
        return -1;
    }
    memcpy(n->s, ev->data.scalar.value, n->len);
    n->s[n->len] = '\0';
    return is_key ? 0 : expand_env(c, n);
}

/* N (a list or a mapping, at DEPTH): its children, read up to the event
 * END.  0, or -1 after reporting a fatal error. */
static int build_children(struct ctx *c, yaml_parser_t *p, yaml_event_type_t end, unsigned depth,
                          struct node *n)
{
    if (depth >= MAX_NESTING) {
        err_at(c, n->line, n->col, "nested too deeply (more than %u levels)", MAX_NESTING);
        return -1;
    }
    for (;;) {
        yaml_event_t sub;
        struct node *kid = NULL;
        if (next_event(c, p, &sub) < 0)
            return -1;
        if (sub.type == end) {
            event_free(&sub);
            return 0;
        }
        if (build(c, p, &sub, depth + 1, n->kind == N_MAP && n->n % 2 == 0, &kid) < 0)
            return -1;
        if (add_kid(c, n, kid) < 0) {
            kvb_cfg_node_free(kid);
            return -1;
        }
    }
}

/* Build the node that EV starts, reading events up to its end (IS_KEY: it is
 * a mapping key, whose text is taken as it is).  EV is consumed (deleted).
 * Returns 0, or -1 after reporting a fatal error. */
static int build(struct ctx *c, yaml_parser_t *p, yaml_event_t *ev, unsigned depth, bool is_key,
                 struct node **out)
{
    int rc = -1;
    struct node *n = calloc(1, sizeof *n);
    if (!n) {
        oom(c);
        goto fail;
    }
    n->line = ev->start_mark.line + 1;
    n->col = ev->start_mark.column + 1;
    if (++c->nnodes > MAX_NODES) {
        err_at(c, n->line, n->col, "too many YAML nodes (more than %u)", MAX_NODES);
        goto fail;
    }
    switch (ev->type) {
    case YAML_SCALAR_EVENT:
        if (build_scalar(c, ev, is_key, n) < 0)
            goto fail;
        break;
    case YAML_ALIAS_EVENT:
        n->kind = N_BAD;
        err_at(c, n->line, n->col, "YAML aliases are not supported");
        break;
    case YAML_SEQUENCE_START_EVENT:
        n->kind = N_SEQ;
        if (build_children(c, p, YAML_SEQUENCE_END_EVENT, depth, n) < 0)
            goto fail;
        break;
    case YAML_MAPPING_START_EVENT:
        n->kind = N_MAP;
        if (build_children(c, p, YAML_MAPPING_END_EVENT, depth, n) < 0)
            goto fail;
        break;
    default: err_at(c, n->line, n->col, "unexpected YAML event"); goto fail;
    }
    event_free(ev);
    *out = n;
    return 0;

fail:
    event_free(ev);
    kvb_cfg_node_free(n);
    return rc;
}

/* The whole stream: *root is NULL for a stream without a document. */
int kvb_cfg_parse(struct ctx *c, struct node **root)
{
    int rc = -1;
    yaml_parser_t p;
    yaml_event_t ev;
    struct node *n = NULL;

    if (!yaml_parser_initialize(&p)) {
        oom(c);
        return -1;
    }
    yaml_parser_set_input_string(&p, (const unsigned char *)c->buf, c->len);
    if (next_event(c, &p, &ev) < 0) /* STREAM-START */
        goto fail;
    event_free(&ev);
    if (next_event(c, &p, &ev) < 0)
        goto fail;
    if (ev.type == YAML_STREAM_END_EVENT) {
        event_free(&ev);
        goto done;
    }
    event_free(&ev); /* DOCUMENT-START */
    if (next_event(c, &p, &ev) < 0)
        goto fail;
    if (build(c, &p, &ev, 0, false, &n) < 0)
        goto fail;
    if (next_event(c, &p, &ev) < 0) /* DOCUMENT-END */
        goto fail;
    event_free(&ev);
    if (next_event(c, &p, &ev) < 0)
        goto fail;
    if (ev.type == YAML_DOCUMENT_START_EVENT)
        err_at(c, ev.start_mark.line + 1, ev.start_mark.column + 1,
               "only one YAML document is allowed");
    event_free(&ev);
done:
    rc = 0;
    *root = n;
    n = NULL;
fail:
    kvb_cfg_node_free(n);
    parser_free(&p);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Reading the file                                                          */

int kvb_cfg_read_file(struct ctx *c, char **out, size_t *outlen)
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
