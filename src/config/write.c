/* config_write: the commented example (conf/kvbridge.yaml) and the effective
 * values (--check -v), both loops over the table of src/config/table.c.
 */
#include "config.h"
#include "config_priv.h"
#include "url.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* The commented example                                                     */

#define EXAMPLE_WIDTH 79

static const char example_header[] =
    "# kvbridge configuration: every key, set to its default value, with what it\n"
    "# does.  worker_id, block_size and sources[].endpoint have no default: the\n"
    "# values below are examples, so that this file loads as it is.\n"
    "#\n"
    "# Generated from the table in src/config/table.c by\n"
    "# kvb_config_write_example(); a unit test keeps conf/kvbridge.yaml equal to\n"
    "# it.  Unknown keys and bad values are errors,\n"
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
        /* p[len] stops at the NUL before len can pass the width limit */
        // cppcheck-suppress arrayIndexThenCheck
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
    if (o->flags & F_INHERIT) {
        fputs("~", f); /* the top-level key's value */
        return;
    }
    switch (o->type) {
    case T_TOPICS:
    case T_LORA_NAMES: fputs("{}", f); break;
    case T_STR: put_quoted(f, o->def, strlen(o->def)); break;
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
    case T_SOURCES: break;
    default: fputs(o->def, f); break;
    }
}

/* The help text plus what the table says about the key. */
static char *full_help(const struct opt *o)
{
    char *list = NULL, *range = NULL, *s = NULL;
    if (o->type == T_ENUM && !(list = kvb_cfg_join_values(NULL, o->values, ", ")))
        goto out;
    if ((o->type == T_U32 || o->type == T_U64 || o->type == T_BLOCKSIZE) &&
        !(range = kvb_cfg_asprintf(NULL, " Range: %" PRIu64 "..%" PRIu64 ".", o->min, o->max)))
        goto out;
    s = kvb_cfg_asprintf(
        NULL, "%s%s%s%s%s%s%s%s%s", o->help, list ? " One of: " : "", list ? list : "",
        list ? "." : "", range ? range : "", o->type == T_BOOL ? " true or false." : "",
        !(o->flags & F_REQUIRED) ? ((o->flags & F_RELOAD) ? "" : " Changing it needs a restart.")
        : o->alt                 ? " Required unless "
                                 : " Required.",
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
    for (size_t i = 0; i < kvb_cfg_nopts; i++) {
        const struct opt *o = &kvb_cfg_opts[i];
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
        while (common > 0 && !((common == plen || o->key[common] == '.') &&
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
                fprintf(f, "%*s%.*s:\n", indent_of(o->key, k ? k - 1 : 0), "", (int)n, o->key + k);
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

/* A URL (nats.servers, discovery.etcd.endpoints), its user information
 * (user and password, or a token) replaced by REDACTED. */
static void put_url(FILE *f, const char *url)
{
    char *r = kvb_url_redacted(url, "nats", REDACTED);
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
    case T_TOPICS: {
        const struct kvb_topic_cfg *t = *(struct kvb_topic_cfg *const *)field;
        size_t n = *(const size_t *)((const char *)base + o->noff);
        fputc('{', f);
        for (size_t i = 0; i < n; i++) {
            fputs(i ? ", " : "", f);
            put_quoted(f, t[i].topic, strlen(t[i].topic));
            fprintf(f, ": %" PRIu64, t[i].worker_id);
        }
        fputc('}', f);
        break;
    }
    case T_LORA_NAMES: {
        const struct kvb_lora_name_cfg *t = *(struct kvb_lora_name_cfg *const *)field;
        size_t n = *(const size_t *)((const char *)base + o->noff);
        fputc('{', f);
        for (size_t i = 0; i < n; i++) {
            fprintf(f, "%s%" PRIu64 ": ", i ? ", " : "", t[i].id);
            put_quoted(f, t[i].name, strlen(t[i].name));
        }
        fputc('}', f);
        break;
    }
    case T_SOURCES: break;
    }
}

int kvb_config_write_effective(const struct kvb_config *cfg, FILE *f)
{
    if (!cfg || !f)
        return -EINVAL;
    fprintf(f, "# effective configuration of %s (secrets redacted)\n", cfg->path ? cfg->path : "?");
    for (size_t i = 0; i < kvb_cfg_nopts; i++) {
        const struct opt *o = &kvb_cfg_opts[i];
        if (in_sources(o))
            continue;
        if (o->type != T_SOURCES) {
            fprintf(f, "%s: ", o->key);
            put_effective(f, o, cfg);
            fputc('\n', f);
            continue;
        }
        for (size_t k = 0; k < cfg->n_sources; k++) {
            for (size_t j = 0; j < kvb_cfg_nopts; j++) {
                if (!in_sources(&kvb_cfg_opts[j]))
                    continue;
                fprintf(f, "sources[%zu].%s: ", k, kvb_cfg_opts[j].key + sizeof SRC_PREFIX);
                put_effective(f, &kvb_cfg_opts[j], &cfg->sources[k]);
                fputc('\n', f);
            }
        }
    }
    return ferror(f) ? -EIO : 0;
}
