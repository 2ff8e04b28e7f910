/* config: the YAML file (docs/configuration.md) loaded into a struct
 * kvb_config, and freed.
 *
 * Everything hangs off one table (src/config/table.c, docs/design.md rule
 * 7): each row is a key path, a type, an offset, a default, limits, a
 * reloadable flag, an optional check and the help text.  Parsing, defaults,
 * validation, freeing, reload checks and the commented example are all
 * loops over that table.
 *
 * The file (at most 1 MiB) is read into memory, turned into a small node tree
 * (bounded: MAX_NODES nodes, MAX_NESTING levels, no aliases) and then walked
 * against the table.  Every error is "FILE:LINE:COLUMN: message", with the
 * 1-based position of the offending key or value.
 *
 * This file is the module's entry: the walk of the tree against the table,
 * loading and freeing.  The others (the file graph is at the top of
 * config_priv.h): yaml.c reads the file into the node tree; value.c converts
 * one value and applies the defaults; check_value.c checks one value,
 * check.c checks across keys and reads the files they name (with
 * secret.c); write.c writes the commented example and the effective values;
 * reload.c compares two configurations; util.c holds the messages and
 * string helpers every file uses.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strndup, open_memstream in tests; also set by the Makefile */
#endif
#include "config.h"
#include "config_priv.h"
#include "log.h"
#include "metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SOURCES 1024

/* A section is a path that some key lies under ("nats", "nats.jetstream"). */
static bool is_section(const char *path)
{
    size_t n = strlen(path);
    for (size_t i = 0; i < kvb_cfg_nopts; i++)
        if (strncmp(kvb_cfg_opts[i].key, path, n) == 0 && kvb_cfg_opts[i].key[n] == '.')
            return true;
    return false;
}

/* ------------------------------------------------------------------------ */
/* Helpers                                                                   */

/* ------------------------------------------------------------------------ */
/* Walking the tree against the table                                        */

static void walk_map(struct ctx *c, const struct node *map, const char *tprefix,
                     const char *dprefix, void *base, struct mark *marks);

/* The row of sources[] that inherits top-level row O, or NULL. */
static const struct opt *inheriting_row(const struct opt *o)
{
    for (size_t i = 0; i < kvb_cfg_nopts; i++)
        if ((kvb_cfg_opts[i].flags & F_INHERIT) &&
            strcmp(kvb_cfg_opts[i].key + sizeof SRC_PREFIX, o->key) == 0)
            return &kvb_cfg_opts[i];
    return NULL;
}

/* Bit of F_INHERIT row O in kvb_source_cfg.inherited. */
static uint32_t inherit_bit(const struct opt *o)
{
    uint32_t bit = 1;
    for (size_t i = 0; i < kvb_cfg_nopts && &kvb_cfg_opts[i] != o; i++)
        if (kvb_cfg_opts[i].flags & F_INHERIT)
            bit <<= 1;
    return bit;
}

/* Every source of CFG sets its own value of top-level row O. */
static bool sources_set_own(const struct kvb_config *cfg, const struct opt *o)
{
    const struct opt *r = inheriting_row(o);
    if (!r || cfg->n_sources == 0)
        return false;
    for (size_t k = 0; k < cfg->n_sources; k++)
        if (cfg->sources[k].inherited & inherit_bit(r))
            return false;
    return true;
}

static void required_missing(struct ctx *c, const struct node *map, const char *dprefix,
                             bool sources_scope, const void *base, const struct mark *marks)
{
    for (size_t i = 0; i < kvb_cfg_nopts; i++) {
        const struct opt *o = &kvb_cfg_opts[i];
        if (!(o->flags & F_REQUIRED) || in_sources(o) != sources_scope || marks[i].set)
            continue;
        if (!sources_scope && sources_set_own(base, o))
            continue; /* the first source's value, after the walk (inherit()) */
        if (o->alt) {
            size_t a = kvb_cfg_opt_index(o->alt);
            const char *v = *(char *const *)((const char *)base + kvb_cfg_opts[a].off);
            if (marks[a].set && (marks[a].bad || (v && *v)))
                continue;
        }
        const char *leaf = sources_scope ? o->key + sizeof SRC_PREFIX : o->key;
        err_at(c, map->line, map->col, "missing required key '%s%s%s'", dprefix,
               *dprefix ? "." : "", leaf);
    }
}

static void set_sources(struct ctx *c, const struct opt *o, const char *dpath, const struct node *v,
                        void *base)
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
        err_at(c, v->line, v->col, "%s: too many sources (more than %u)", dpath, MAX_SOURCES);
        return;
    }
    struct kvb_source_cfg *srcs = calloc(v->n, sizeof *srcs);
    smarks = calloc(kvb_cfg_nopts, sizeof *smarks);
    if (!srcs || !smarks) {
        free(srcs);
        oom(c);
        goto out;
    }
    *field = srcs;
    *np = v->n;
    for (size_t i = 0; i < v->n; i++) {
        const struct node *item = v->kid[i];
        char *ipath = kvb_cfg_asprintf(c, "%s[%zu]", dpath, i);
        if (!ipath)
            goto out;
        memset(smarks, 0, kvb_cfg_nopts * sizeof *smarks);
        kvb_cfg_apply_defaults(c, &srcs[i], true);
        if (item->kind == N_MAP) {
            walk_map(c, item, SRC_PREFIX, ipath, &srcs[i], smarks);
            for (size_t k = 0; k < kvb_cfg_nopts; k++)
                if ((kvb_cfg_opts[k].flags & F_INHERIT) && !smarks[k].set)
                    srcs[i].inherited |= inherit_bit(&kvb_cfg_opts[k]);
            required_missing(c, item, ipath, true, &srcs[i], smarks);
            if (!srcs[i].endpoint && !(srcs[i].endpoint = strdup(""))) /* discover */
                oom(c);
            kvb_cfg_check_source(c, &srcs[i], i, smarks);
            kvb_cfg_check_curve(c, &srcs[i], i, smarks);
            kvb_cfg_check_engine(c, &srcs[i], i, smarks);
        } else if (item->kind != N_BAD) {
            err_at(c, item->line, item->col, "%s: expected a mapping (endpoint: ...), found %s",
                   ipath, kvb_cfg_is_null(item) ? "nothing" : kvb_cfg_kind_name(item));
        }
        free(ipath);
    }
out:
    free(smarks);
}

static void set_list(struct ctx *c, const struct opt *o, const char *dpath, const struct node *v,
                     void *field, size_t *np, struct mark *m)
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
            err_at(c, it->line, it->col, "%s[%zu]: expected a single value, found %s", dpath, i,
                   kvb_cfg_is_null(it) ? "nothing" : kvb_cfg_kind_name(it));
            bad = true;
        } else if (kvb_cfg_conv_item(c, o, dpath, i, it->s, it->len, it->line, it->col,
                                     list ? &list[i] : NULL, &mask) < 0) {
            bad = true;
        } else if (o->check && list) {
            char *ipath = kvb_cfg_asprintf(c, "%s[%zu]", dpath, i);
            if (!ipath || o->check(c, o, ipath, &list[i], it) < 0)
                bad = true;
            free(ipath);
        }
    }
    if (bad)
        goto fail;
    if (o->type == T_STRLIST) {
        kvb_cfg_free_strlist(*(char ***)field, *np);
        *(char ***)field = list;
        *np = v->n;
    } else {
        *(uint32_t *)field = mask;
    }
    return;
fail:
    m->bad = true;
    kvb_cfg_free_strlist(list, v->kind == N_SEQ ? v->n : 0);
}

static void free_topics(struct kvb_topic_cfg *t, size_t n)
{
    for (size_t i = 0; t && i < n; i++)
        free(t[i].topic);
    free(t);
}

/* The value of a mapping key (topics, lora_names): ~ is no map (1), a
 * mapping of at most MAX pairs is 0 with *ENTRIES allocated for them (SIZE
 * bytes each, zeroed); anything else is reported (-1). */
static int map_pairs(struct ctx *c, const char *dpath, const struct node *v, size_t max,
                     const char *keys, const char *values, const char *example, size_t size,
                     void **entries)
{
    *entries = NULL;
    if (v->kind == N_SCALAR && kvb_cfg_is_null(v))
        return 1;
    if (v->kind != N_MAP) {
        err_at(c, v->line, v->col, "%s: expected a mapping of %s to %s (%s), found %s", dpath, keys,
               values, example, kvb_cfg_kind_name(v));
        return -1;
    }
    if (v->n / 2 > max) {
        err_at(c, v->line, v->col, "%s: too many %s (more than %zu)", dpath, keys, max);
        return -1;
    }
    if (!(*entries = calloc(v->n / 2 ? v->n / 2 : 1, size))) {
        oom(c);
        return -1;
    }
    return 0;
}

/* sources[].topics: a mapping of exact topics to worker ids. */
static void set_topics(struct ctx *c, const char *dpath, const struct node *v, void *field,
                       size_t *np, struct mark *m)
{
    static const struct opt id_opt = {.key = "worker_id", .type = T_U64, .max = UINT64_MAX};
    struct kvb_topic_cfg *t = NULL;
    size_t n = 0;
    bool bad = false;

    int rc = map_pairs(c, dpath, v, MAX_TOPICS, "topics", "worker ids", "{\"kv@pod-a@llama\": 101}",
                       sizeof *t, (void **)&t);
    if (rc > 0)
        goto done; /* no map */
    if (rc < 0)
        goto fail;
    for (size_t i = 0; i + 1 < v->n; i += 2) {
        const struct node *k = v->kid[i], *val = v->kid[i + 1];
        if (k->kind == N_BAD || val->kind == N_BAD) {
            bad = true;
            continue;
        }
        if (k->kind != N_SCALAR || kvb_cfg_is_null(k) || k->len == 0) {
            err_at(c, k->line, k->col, "%s: a topic must be a non-empty single value", dpath);
            bad = true;
            continue;
        }
        char *shown = kvb_cfg_shown(k->s, k->len);
        char *tpath = kvb_cfg_asprintf(c, "%s['%s']", dpath, SHOWN(shown));
        const struct node *dup = NULL;
        for (size_t j = 0; j < i && !dup; j += 2)
            if (v->kid[j]->kind == N_SCALAR && v->kid[j]->len == k->len &&
                memcmp(v->kid[j]->s, k->s, k->len) == 0)
                dup = v->kid[j];
        uint64_t id = 0;
        if (!tpath) {
            bad = true;
        } else if (memchr(k->s, '\0', k->len)) {
            err_at(c, k->line, k->col, "%s: the topic contains a NUL character", dpath);
            bad = true;
        } else if (k->len > MAX_TOPIC_LEN) {
            err_at(c, k->line, k->col, "%s: the topic is longer than %d bytes", tpath,
                   MAX_TOPIC_LEN);
            bad = true;
        } else if (dup) {
            err_at(c, k->line, k->col, "%s: the topic is listed twice (first at %zu:%zu)", tpath,
                   dup->line, dup->col);
            bad = true;
        } else if (val->kind != N_SCALAR || kvb_cfg_is_null(val)) {
            err_at(c, val->line, val->col, "%s: expected a worker id, found %s", tpath,
                   kvb_cfg_is_null(val) ? "nothing" : kvb_cfg_kind_name(val));
            bad = true;
        } else if (kvb_cfg_conv(c, &id_opt, tpath, val->s, val->len, val->line, val->col, &id) <
                   0) {
            bad = true;
        } else if (!(t[n].topic = strndup(k->s, k->len))) {
            oom(c);
            bad = true;
        } else {
            t[n++].worker_id = id;
        }
        free(tpath);
        free(shown);
    }
    if (bad)
        goto fail;
done:
    free_topics(*(struct kvb_topic_cfg **)field, *np);
    *(struct kvb_topic_cfg **)field = t;
    *np = n;
    return;
fail:
    m->bad = true;
    free_topics(t, n);
}

static void free_lora_names(struct kvb_lora_name_cfg *t, size_t n)
{
    for (size_t i = 0; t && i < n; i++)
        free(t[i].name);
    free(t);
}

/* Pair I of mapping V (a LoRA id and its adapter name) into *E: 0, or -1
 * after reporting.  Its id is checked against the pairs before it. */
static int lora_name(struct ctx *c, const char *dpath, const struct node *v, size_t i,
                     struct kvb_lora_name_cfg *e)
{
    static const struct opt id_opt = {.key = "lora_id", .type = T_U64, .max = INT64_MAX};
    const struct node *k = v->kid[i], *val = v->kid[i + 1];
    if (k->kind == N_BAD || val->kind == N_BAD)
        return -1;
    if (k->kind != N_SCALAR || kvb_cfg_is_null(k)) {
        err_at(c, k->line, k->col, "%s: a LoRA id must be a single value", dpath);
        return -1;
    }
    if (kvb_cfg_conv(c, &id_opt, dpath, k->s, k->len, k->line, k->col, &e->id) < 0)
        return -1;
    char *ipath = kvb_cfg_asprintf(c, "%s[%" PRIu64 "]", dpath, e->id);
    if (!ipath)
        return -1;
    int rc = -1;
    uint64_t prev;
    for (size_t j = 0; j < i; j += 2) {
        const struct node *pk = v->kid[j];
        if (pk->kind == N_SCALAR && kvb_cfg_parse_u64(pk->s, pk->len, &prev) == 0 &&
            prev == e->id) {
            err_at(c, k->line, k->col, "%s: the LoRA id is listed twice (first at %zu:%zu)", ipath,
                   pk->line, pk->col);
            goto out;
        }
    }
    if (val->kind != N_SCALAR || kvb_cfg_is_null(val)) {
        err_at(c, val->line, val->col, "%s: expected an adapter name, found %s", ipath,
               val->kind == N_SCALAR ? "nothing" : kvb_cfg_kind_name(val));
    } else if (val->len == 0) {
        err_at(c, val->line, val->col, "%s: the name must not be empty", ipath);
    } else if (memchr(val->s, '\0', val->len)) {
        err_at(c, val->line, val->col, "%s: the name contains a NUL character", ipath);
    } else if (val->len > MAX_LORA_NAME) {
        err_at(c, val->line, val->col, "%s: the name is longer than %d bytes", ipath,
               MAX_LORA_NAME);
    } else if (!(e->name = strndup(val->s, val->len))) {
        oom(c);
    } else {
        rc = 0;
    }
out:
    free(ipath);
    return rc;
}

/* sources[].lora_names: a mapping of LoRA ids to adapter names. */
static void set_lora_names(struct ctx *c, const char *dpath, const struct node *v, void *field,
                           size_t *np, struct mark *m)
{
    struct kvb_lora_name_cfg *t = NULL;
    size_t n = 0;
    bool bad = false;
    int rc = map_pairs(c, dpath, v, MAX_LORA_NAMES, "LoRA ids", "adapter names",
                       "{7: \"sql-lora\"}", sizeof *t, (void **)&t);
    if (rc < 0) {
        m->bad = true;
        return;
    }
    for (size_t i = 0; rc == 0 && i + 1 < v->n; i += 2) {
        if (lora_name(c, dpath, v, i, &t[n]) < 0)
            bad = true;
        else
            n++;
    }
    if (bad) {
        m->bad = true;
        free_lora_names(t, n);
        return;
    }
    free_lora_names(*(struct kvb_lora_name_cfg **)field, *np);
    *(struct kvb_lora_name_cfg **)field = t;
    *np = n;
}

static void set_opt(struct ctx *c, const struct opt *o, const char *dpath, const struct node *v,
                    void *base, struct mark *marks)
{
    struct mark *m = &marks[o - kvb_cfg_opts];
    void *field = (char *)base + o->off;
    m->line = v->line;
    m->col = v->col;
    m->set = true;
    if (v->kind == N_BAD) {
        m->bad = true;
        return;
    }
    if ((o->flags & F_INHERIT) && v->kind == N_SCALAR && kvb_cfg_is_null(v)) {
        m->set = false; /* ~: the top-level value, as when absent */
        return;
    }
    switch (o->type) {
    case T_SOURCES: set_sources(c, o, dpath, v, base); return;
    case T_TOPICS: set_topics(c, dpath, v, field, (size_t *)((char *)base + o->noff), m); return;
    case T_LORA_NAMES:
        set_lora_names(c, dpath, v, field, (size_t *)((char *)base + o->noff), m);
        return;
    case T_STRLIST:
    case T_TIERS: set_list(c, o, dpath, v, field, (size_t *)((char *)base + o->noff), m); return;
    default: break;
    }
    if (v->kind != N_SCALAR) {
        err_at(c, v->line, v->col, "%s: expected a single value, found %s", dpath,
               kvb_cfg_kind_name(v));
    } else if (kvb_cfg_is_null(v)) {
        err_at(c, v->line, v->col, "%s: missing value%s", dpath,
               o->type == T_STR ? " (write \"\" for an empty string)" : "");
    } else if (kvb_cfg_conv(c, o, dpath, v->s, v->len, v->line, v->col, field) == 0 &&
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
            err_at(c, k->line, k->col, "keys must be single values, not %s", kvb_cfg_kind_name(k));
            continue;
        }
        shown_key = kvb_cfg_shown(k->s, k->len);
        tpath = kvb_cfg_asprintf(c, "%s%s%s", tprefix, *tprefix ? "." : "", k->s);
        dpath = kvb_cfg_asprintf(c, "%s%s%s", dprefix, *dprefix ? "." : "", SHOWN(shown_key));
        if (!tpath || !dpath)
            goto next;
        const struct opt *o = NULL;
        bool section = false;
        if (k->len && !memchr(k->s, '\0', k->len) && !strpbrk(k->s, ".[]")) {
            o = kvb_cfg_find_opt(tpath);
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
            err_at(c, k->line, k->col, "duplicate key '%s' (first at %zu:%zu)", dpath, dup->line,
                   dup->col);
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

static void curve_wipe(struct kvb_curve_cfg *cv)
{
    explicit_bzero(cv->secret_key, sizeof cv->secret_key);
    free(cv->allowed);
    cv->allowed = NULL;
    cv->n_allowed = 0;
}

static void free_fields(void *base, bool sources_scope)
{
    for (size_t i = 0; i < kvb_cfg_nopts; i++) {
        const struct opt *o = &kvb_cfg_opts[i];
        void *field = (char *)base + o->off;
        if (in_sources(o) != sources_scope)
            continue;
        if (o->type == T_STR) {
            kvb_cfg_str_free(*(char **)field);
            *(char **)field = NULL;
        } else if (o->type == T_STRLIST) {
            size_t *np = (size_t *)((char *)base + o->noff);
            kvb_cfg_free_strlist(*(char ***)field, *np);
            *(char ***)field = NULL;
            *np = 0;
        } else if (o->type == T_TOPICS) {
            size_t *np = (size_t *)((char *)base + o->noff);
            free_topics(*(struct kvb_topic_cfg **)field, *np);
            *(struct kvb_topic_cfg **)field = NULL;
            *np = 0;
        } else if (o->type == T_LORA_NAMES) {
            size_t *np = (size_t *)((char *)base + o->noff);
            free_lora_names(*(struct kvb_lora_name_cfg **)field, *np);
            *(struct kvb_lora_name_cfg **)field = NULL;
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

/* Copy the value of top-level row T (in CFG) into row S of source SRC. */
static void copy_value(const struct opt *t, const struct kvb_config *cfg, const struct opt *s,
                       struct kvb_source_cfg *src)
{
    const void *from = (const char *)cfg + t->off;
    void *to = (char *)src + s->off;
    switch (s->type) {
    case T_U64: *(uint64_t *)to = *(const uint64_t *)from; break;
    case T_U32:
    case T_TIERS:
    case T_BLOCKSIZE: *(uint32_t *)to = *(const uint32_t *)from; break;
    case T_BOOL: *(bool *)to = *(const bool *)from; break;
    default: break; /* no F_INHERIT row of another type */
    }
}

/* The sources' F_INHERIT keys they left out take the top-level values; a
 * required top-level key that every source sets (so was not required) takes
 * the first source's value. */
static void inherit(struct kvb_config *cfg, const struct mark *marks)
{
    for (size_t i = 0; i < kvb_cfg_nopts; i++) {
        const struct opt *s = &kvb_cfg_opts[i];
        if (!(s->flags & F_INHERIT))
            continue;
        const struct opt *t = kvb_cfg_find_opt(s->key + sizeof SRC_PREFIX);
        uint32_t bit = inherit_bit(s);
        size_t ti = (size_t)(t - kvb_cfg_opts);
        const char *alt =
            t->alt
                ? *(char *const *)((const char *)cfg + kvb_cfg_opts[kvb_cfg_opt_index(t->alt)].off)
                : NULL;
        bool alt_set = alt && *alt;
        if ((t->flags & F_REQUIRED) && !marks[ti].set && !alt_set && cfg->n_sources &&
            !(cfg->sources[0].inherited & bit)) {
            const void *from = (const char *)&cfg->sources[0] + s->off;
            void *to = (char *)cfg + t->off;
            if (t->type == T_U64)
                *(uint64_t *)to = *(const uint64_t *)from;
            else
                *(uint32_t *)to = *(const uint32_t *)from; /* block_size */
        }
        for (size_t k = 0; k < cfg->n_sources; k++)
            if (cfg->sources[k].inherited & bit)
                copy_value(t, cfg, s, &cfg->sources[k]);
    }
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
    rc = kvb_cfg_read_file(&c, &buf, &c.len);
    if (rc < 0)
        goto fail;
    c.buf = buf;
    c.creds_dir = creds_dir && *creds_dir ? creds_dir : NULL;
    rc = -EINVAL;
    cfg = calloc(1, sizeof *cfg);
    marks = calloc(kvb_cfg_nopts, sizeof *marks);
    if (!cfg || !marks || !(cfg->path = strdup(path))) {
        oom(&c);
        goto fail;
    }
    if (kvb_cfg_apply_defaults(&c, cfg, false) < 0)
        goto fail;
    if (kvb_cfg_parse(&c, &root) < 0)
        goto fail;
    if (!root || kvb_cfg_is_null(root)) {
        err_at(&c, 1, 1, "empty configuration (worker_id, block_size and sources are required)");
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
    kvb_cfg_resolve_files(&c, cfg, marks);
    kvb_cfg_check_config(&c, cfg, marks); /* reads worker_id_file */
    inherit(cfg, marks);
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
