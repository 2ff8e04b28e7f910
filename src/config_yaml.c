/* config_yaml: the configuration file as a bounded node tree, through
 * libyaml's event parser (see src/config_priv.h).  Every node keeps the
 * 1-based line and column where it starts, for "FILE:LINE:COL" messages.
 */
#include "config_priv.h"

#include <stdlib.h>
#include <string.h>
#include <yaml.h>

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
        err_at(c, p->problem_mark.line + 1, p->problem_mark.column + 1,
               "%s (%s at %zu:%zu)", problem, p->context, p->context_mark.line + 1,
               p->context_mark.column + 1);
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

/* Build the node that EV starts, reading events up to its end.  EV is
 * consumed (deleted).  Returns 0, or -1 after reporting a fatal error. */
static int build(struct ctx *c, yaml_parser_t *p, yaml_event_t *ev, unsigned depth,
                 struct node **out)
{
    int rc = -1;
    yaml_event_t sub;
    struct node *kid = NULL;
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
        n->kind = N_SCALAR;
        n->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
        n->len = ev->data.scalar.length;
        n->s = malloc(n->len + 1);
        if (!n->s) {
            oom(c);
            goto fail;
        }
        memcpy(n->s, ev->data.scalar.value, n->len);
        n->s[n->len] = '\0';
        break;
    case YAML_ALIAS_EVENT:
        n->kind = N_BAD;
        err_at(c, n->line, n->col, "YAML aliases are not supported");
        break;
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT: {
        yaml_event_type_t end = ev->type == YAML_SEQUENCE_START_EVENT
                                    ? YAML_SEQUENCE_END_EVENT
                                    : YAML_MAPPING_END_EVENT;
        n->kind = ev->type == YAML_SEQUENCE_START_EVENT ? N_SEQ : N_MAP;
        if (depth >= MAX_NESTING) {
            err_at(c, n->line, n->col, "nested too deeply (more than %u levels)",
                   MAX_NESTING);
            goto fail;
        }
        for (;;) {
            if (next_event(c, p, &sub) < 0)
                goto fail;
            if (sub.type == end) {
                event_free(&sub);
                break;
            }
            if (build(c, p, &sub, depth + 1, &kid) < 0)
                goto fail;
            if (add_kid(c, n, kid) < 0)
                goto fail;
            kid = NULL;
        }
        break;
    }
    default:
        err_at(c, n->line, n->col, "unexpected YAML event");
        goto fail;
    }
    event_free(ev);
    *out = n;
    return 0;

fail:
    event_free(ev);
    kvb_cfg_node_free(kid);
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
    if (build(c, &p, &ev, 0, &n) < 0)
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
