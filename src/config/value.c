/* config_value: one scalar of the file to its typed field (integers with
 * their ranges, booleans, enums, tier lists, "auto" block sizes, lists of
 * strings) and the defaults of the table (src/config/table.c), for
 * src/config/config.c's walk.
 */
#include "config.h"
#include "config_priv.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Converting values                                                         */

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

/* One scalar being converted: where it is and how a message shows it. */
struct scalar {
    const char *dpath; /* the key as the file spells it, for messages */
    const char *s;
    size_t len;
    size_t line, col;  /* line 0: a default (errors name no position) */
    const char *shown; /* s quoted safely (SHOWN()) */
};

/* T_U64, T_U32 and T_BLOCKSIZE: a decimal integer in o->min..o->max (or
 * "auto" for a block size). */
static int conv_int(struct ctx *c, const struct opt *o, const struct scalar *v, void *field)
{
    uint64_t u = 0;
    if (o->type == T_BLOCKSIZE && str_eq(v->s, v->len, "auto")) {
        *(uint32_t *)field = 0;
        return 0;
    }
    int pr = kvb_cfg_parse_u64(v->s, v->len, &u);
    const char *what = pr == -2                     ? "is negative"
                       : pr == -3                   ? "is too large"
                       : pr < 0                     ? "is not a decimal integer"
                       : (u < o->min || u > o->max) ? "is out of range"
                                                    : NULL;
    if (what) {
        const char *q = pr == 0 ? "" : "'"; /* a number, or the text as written */
        err_at(c, v->line, v->col, "%s: %s%s%s %s (expected %" PRIu64 "..%" PRIu64 "%s)", v->dpath,
               q, SHOWN(v->shown), q, what, o->min, o->max,
               o->type == T_BLOCKSIZE ? " or \"auto\"" : "");
        return -1;
    }
    if (o->type == T_U64)
        *(uint64_t *)field = u;
    else
        *(uint32_t *)field = (uint32_t)u;
    return 0;
}

static int conv_bool(struct ctx *c, const struct scalar *v, bool *field)
{
    const char *s = v->s;
    size_t len = v->len;
    if (str_eq(s, len, "true") || str_eq(s, len, "True") || str_eq(s, len, "TRUE")) {
        *field = true;
        return 0;
    }
    if (str_eq(s, len, "false") || str_eq(s, len, "False") || str_eq(s, len, "FALSE")) {
        *field = false;
        return 0;
    }
    err_at(c, v->line, v->col, "%s: '%s' is not a boolean (expected true or false)", v->dpath,
           SHOWN(v->shown));
    return -1;
}

static int conv_enum(struct ctx *c, const struct opt *o, const struct scalar *v, int *field)
{
    int i = enum_index(o->values, v->s, v->len);
    if (i >= 0) {
        *field = i;
        return 0;
    }
    char *list = kvb_cfg_join_values(c, o->values, " or ");
    err_at(c, v->line, v->col, "%s: '%s' is not one of %s", v->dpath, SHOWN(v->shown),
           list ? list : "the allowed values");
    free(list);
    return -1;
}

static int conv_str(struct ctx *c, const struct scalar *v, char **field)
{
    if (memchr(v->s, '\0', v->len)) {
        err_at(c, v->line, v->col, "%s: the string contains a NUL character", v->dpath);
        return -1;
    }
    char *d = strndup(v->s, v->len);
    if (!d) {
        oom(c);
        return -1;
    }
    kvb_cfg_str_free(*field);
    *field = d;
    return 0;
}

/* Convert one scalar for a scalar-typed option into *field.  The field is
 * written only on success.  line 0 = a default (errors name no position). */
int kvb_cfg_conv(struct ctx *c, const struct opt *o, const char *dpath, const char *s, size_t len,
                 size_t line, size_t col, void *field)
{
    char *shown = kvb_cfg_shown(s, len);
    const struct scalar v = {dpath, s, len, line, col, shown};
    int rc = -1;
    switch (o->type) {
    case T_BLOCKSIZE:
    case T_U64:
    case T_U32: rc = conv_int(c, o, &v, field); break;
    case T_BOOL: rc = conv_bool(c, &v, field); break;
    case T_ENUM: rc = conv_enum(c, o, &v, field); break;
    case T_STR: rc = conv_str(c, &v, field); break;
    default: break;
    }
    free(shown);
    return rc;
}

/* One element of a list option (nats.servers[i], forward_tiers[i]). */
int kvb_cfg_conv_item(struct ctx *c, const struct opt *o, const char *dpath, size_t i,
                      const char *s, size_t len, size_t line, size_t col, char **str,
                      uint32_t *mask)
{
    int rc = -1;
    char *ipath = kvb_cfg_asprintf(c, "%s[%zu]", dpath, i);
    char *v = kvb_cfg_shown(s, len);
    char *list = NULL;
    if (!ipath)
        goto out;
    if (o->type == T_TIERS) {
        int t = enum_index(o->values, s, len);
        if (t < 0) {
            list = kvb_cfg_join_values(c, o->values, " or ");
            err_at(c, line, col, "%s: '%s' is not a storage tier (expected %s)", ipath, SHOWN(v),
                   list ? list : "a tier");
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
            rc = kvb_cfg_conv(c, &so, ipath, s, len, line, col, str);
        }
    }
out:
    free(list);
    free(v);
    free(ipath);
    return rc;
}

/* Defaults for every key in one scope (the config, or one source). */
int kvb_cfg_apply_defaults(struct ctx *c, void *base, bool sources_scope)
{
    int rc = 0;
    for (size_t i = 0; i < kvb_cfg_nopts; i++) {
        const struct opt *o = &kvb_cfg_opts[i];
        void *field = (char *)base + o->off;
        if (in_sources(o) != sources_scope || (o->flags & (F_REQUIRED | F_INHERIT)) ||
            o->type == T_TOPICS || o->type == T_LORA_NAMES) /* inherited after the walk; an
                                                              * empty map (calloc) */
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
                if (kvb_cfg_conv_item(c, o, o->key, k, p, len, 0, 0, list ? &list[k] : NULL,
                                      &mask) < 0)
                    rc = -1;
                p += len + (p[len] == ',');
            }
            if (o->type == T_STRLIST) {
                size_t *np = (size_t *)((char *)base + o->noff);
                kvb_cfg_free_strlist(*(char ***)field, *np);
                *(char ***)field = list;
                *np = n;
            } else {
                *(uint32_t *)field = mask;
            }
        } else if (o->type != T_SOURCES) {
            if (kvb_cfg_conv(c, o, o->key, o->def, strlen(o->def), 0, 0, field) < 0)
                rc = -1;
        }
    }
    return rc;
}
