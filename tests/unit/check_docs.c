/* docs: the man page (docs/kvbridge.8) and the Grafana board
 * (conf/grafana-kvbridge.json) cannot drift from the code (docs/design.md rule 10):
 *   - every metric family of the X-macro lists (metrics.h) has its own entry
 *     in the man page (".TP" then ".B kvbridge_NAME") naming its kind, its
 *     label and every label value; and every kvbridge_ entry is a real metric
 *   - every key of conf/kvbridge.yaml has an entry (".B key", dotted path,
 *     "sources[].x" for the keys of each source) stating its default, and
 *     "restart" when the example says changing it needs a restart; and every
 *     entry of CONFIGURATION is a real key; "required" for required keys
 *   - every option of `kvbridge --help`, the exit codes, signals, sections and
 *     the version (version.h) in the .TH line
 *   - the Grafana board queries every metric family and nothing else.
 *   - docs/configuration.md: its key reference has one row per key of
 *     conf/kvbridge.yaml (default, "required", SIGHUP or restart), and only
 *     real keys; it lists the exit codes, the signals and the options.
 *   - docs/engine-events.md, docs/router-events.md and docs/design.md keep the
 *     numbered sections and rules that comments in the code cite
 *     ("docs/router-events.md section 6", "docs/design.md rule 10");
 *     docs/dynamo-event-plane.md keeps sections 1-8 on the same topics; every
 *     "docs/X.md section N" cited anywhere in the tree names a real heading.
 *   - no document in docs/ (the man page aside) is a copy of one of the
 *     contracts it was written from (when they are beside the tree: see
 *     docs_are_not_spec_copies).
 * Run from the project root (reads docs/, conf/ and build/kvbridge). */
#include <check.h>

#include "testutil.h"
#include <ctype.h>
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-c/json.h>

#include "config.h"
#include "metrics.h"
#include "version.h"

#define MAN "docs/kvbridge.8"
#define EXAMPLE "conf/kvbridge.yaml"
#define GRAFANA "conf/grafana-kvbridge.json"
#define CONFIG_MD "docs/configuration.md"

/* ---- the man page as entries -------------------------------------------- */

/* Roff source to plain text: drop \: \% \& \c, \- -> -, \(dq -> ", \e -> \,
 * font escapes \fB \fI \fR \fP removed. */
static char *plain(const char *s, size_t n)
{
    char *o = malloc(n + 1), *w = o;
    ck_assert(o != NULL);
    for (size_t i = 0; i < n;) {
        if (s[i] == '\\' && i + 1 < n) {
            char c = s[i + 1];
            if (c == ':' || c == '%' || c == '&' || c == 'c') {
                i += 2;
            } else if (c == '-') {
                *w++ = '-';
                i += 2;
            } else if (c == 'e') {
                *w++ = '\\';
                i += 2;
            } else if (c == 'f' && i + 2 < n) {
                i += 3;
            } else if (c == '(' && i + 3 < n && strncmp(s + i + 2, "dq", 2) == 0) {
                *w++ = '"';
                i += 4;
            } else {
                *w++ = s[i++];
            }
        } else {
            *w++ = s[i++];
        }
    }
    *w = '\0';
    return o;
}

struct entry {
    char *tag;     /* plain text after ".B " */
    char *section; /* the .SH it is in */
    char *text;    /* plain text of the tag line and the paragraph */
};

struct man {
    char *src; /* whole file */
    char *all; /* plain text of the whole file */
    struct entry *e;
    size_t n;
};

static bool starts(const char *line, const char *p) { return strncmp(line, p, strlen(p)) == 0; }

static struct man man_load(void)
{
    struct man m = {0};
    size_t len;
    m.src = (char *)read_all(MAN, &len);
    m.all = plain(m.src, len);
    /* lines */
    size_t nl = 0, cap = 64;
    char **lines = malloc(cap * sizeof(*lines));
    ck_assert(lines != NULL);
    char *copy = strdup(m.src);
    ck_assert(copy != NULL);
    for (char *save = NULL, *l = strtok_r(copy, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        if (nl == cap) {
            cap *= 2;
            lines = realloc(lines, cap * sizeof(*lines));
            ck_assert(lines != NULL);
        }
        lines[nl++] = l;
    }
    m.e = calloc(nl, sizeof(*m.e));
    ck_assert(m.e != NULL);
    const char *section = "";
    for (size_t i = 0; i < nl; i++) {
        if (starts(lines[i], ".SH "))
            section = lines[i] + 4;
        if (strcmp(lines[i], ".TP") != 0 || i + 1 >= nl || !starts(lines[i + 1], ".B "))
            continue;
        struct entry *e = &m.e[m.n++];
        e->tag = plain(lines[i + 1] + 3, strlen(lines[i + 1] + 3));
        e->section = plain(section, strlen(section));
        size_t tl = 0;
        for (size_t j = i + 1; j < nl; j++) {
            if (j > i + 1 && (starts(lines[j], ".TP") || starts(lines[j], ".SH") ||
                              starts(lines[j], ".SS") || starts(lines[j], ".PP")))
                break;
            tl += strlen(lines[j]) + 1;
        }
        char *raw = malloc(tl + 1), *w = raw;
        ck_assert(raw != NULL);
        for (size_t j = i + 1; j < nl; j++) {
            if (j > i + 1 && (starts(lines[j], ".TP") || starts(lines[j], ".SH") ||
                              starts(lines[j], ".SS") || starts(lines[j], ".PP")))
                break;
            size_t k = strlen(lines[j]);
            memcpy(w, lines[j], k);
            w += k;
            *w++ = '\n';
        }
        *w = '\0';
        e->text = plain(raw, (size_t)(w - raw));
        free(raw);
    }
    free(lines);
    free(copy);
    return m;
}

static void man_free(struct man *m)
{
    for (size_t i = 0; i < m->n; i++) {
        free(m->e[i].tag);
        free(m->e[i].section);
        free(m->e[i].text);
    }
    free(m->e);
    free(m->src);
    free(m->all);
}

static const struct entry *man_entry(const struct man *m, const char *tag)
{
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->e[i].tag, tag) == 0)
            return &m->e[i];
    return NULL;
}

/* The plain text of section NAME (up to the next .SH), malloc'ed. */
static char *man_section(const struct man *m, const char *name)
{
    char head[64];
    snprintf(head, sizeof(head), "\n.SH %s\n", name);
    const char *a = strstr(m->all, head);
    if (!a)
        return strdup("");
    a += strlen(head);
    const char *b = strstr(a, "\n.SH ");
    size_t n = b ? (size_t)(b - a) : strlen(a);
    char *s = malloc(n + 1);
    ck_assert(s != NULL);
    memcpy(s, a, n);
    s[n] = '\0';
    return s;
}

/* ---- the metric families ------------------------------------------------ */

struct family {
    const char *name;  /* without the kvbridge_ prefix */
    const char *kind;  /* counter, gauge, histogram */
    const char *label; /* "" when none */
    const char *values[32];
    int n_values;
};

#define KVB_VAL(s, str) str,
#define FAM_METRIC(kind, name, label, list, help) \
    {#name, #kind, label, {list(KVB_VAL)}, KVB_COUNT_OF(list)},
#define FAM_HIST(name, buckets, help) {#name, "histogram", "", {""}, 0},
#define FAM_STREAM(kind, name, field, help) {#name, #kind, "source", {""}, 0},
static const struct family families[] = {
    KVB_METRICS(FAM_METRIC) KVB_HISTOGRAMS(FAM_HIST) KVB_STREAM_METRICS(FAM_STREAM)
        KVB_ENGINE_METRICS(FAM_STREAM){"build_info", "gauge", "version", {""}, 0},
};
#define N_FAMILIES (sizeof(families) / sizeof(families[0]))

static const struct family *family_named(const char *name, size_t len)
{
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (strlen(families[i].name) == len && strncmp(families[i].name, name, len) == 0)
            return &families[i];
    return NULL;
}

/* ---- conf/kvbridge.yaml keys -------------------------------------------- */

struct key {
    char path[128];
    char value[256]; /* unquoted; "" when none (sections) */
    bool restart;    /* its comment says changing it needs a restart */
    bool required;   /* its comment says Required: the value is an example */
    bool section;    /* a mapping of keys, not a key */
};

static size_t example_keys(struct key *out, size_t cap)
{
    size_t len, n = 0;
    char *text = (char *)read_all(EXAMPLE, &len);
    struct {
        int indent;
        char name[64];
        bool list;
    } stack[8];
    int depth = 0;
    char comment[2048] = "";
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        int ind = 0;
        while (l[ind] == ' ')
            ind++;
        if (l[ind] == '#') {
            strncat(comment, l + ind + 1, sizeof(comment) - strlen(comment) - 1);
            continue;
        }
        bool item = l[ind] == '-' && l[ind + 1] == ' ';
        if (item) {
            ind += 2;
            /* the list key is the innermost key above this indentation */
            for (int d = depth - 1; d >= 0; d--)
                if (stack[d].indent < ind) {
                    stack[d].list = true;
                    if (n > 0 && strcmp(out[n - 1].path, stack[d].name) == 0)
                        out[n - 1].section = false; /* a list is a key */
                    break;
                }
        }
        const char *k = l + ind, *colon = strchr(k, ':');
        ck_assert_msg(colon != NULL, EXAMPLE ": cannot parse line '%s'", l);
        while (depth > 0 && stack[depth - 1].indent >= ind)
            depth--;
        ck_assert(depth < 8 && n < cap);
        struct key *out_k = &out[n++];
        memset(out_k, 0, sizeof(*out_k));
        for (int d = 0; d < depth; d++) {
            strncat(out_k->path, stack[d].name, sizeof(out_k->path) - strlen(out_k->path) - 1);
            if (stack[d].list)
                strncat(out_k->path, "[]", sizeof(out_k->path) - strlen(out_k->path) - 1);
            strncat(out_k->path, ".", sizeof(out_k->path) - strlen(out_k->path) - 1);
        }
        strncat(out_k->path, k, (size_t)(colon - k));
        const char *v = colon + 1;
        while (*v == ' ')
            v++;
        size_t vl = strlen(v);
        if (vl >= 2 && v[0] == '"' && v[vl - 1] == '"') {
            v++;
            vl -= 2;
        }
        ck_assert(vl < sizeof(out_k->value));
        memcpy(out_k->value, v, vl);
        out_k->section = vl == 0 && colon[1] == '\0';
        /* comment lines are joined with the space that follows each '#' */
        out_k->restart = strstr(comment, "needs a restart") != NULL;
        out_k->required = strstr(comment, "Required.") != NULL;
        comment[0] = '\0';
        stack[depth].indent = ind;
        snprintf(stack[depth].name, sizeof(stack[depth].name), "%.*s", (int)(colon - k), k);
        stack[depth].list = false;
        depth++;
    }
    free(text);
    return n;
}

/* ---- tests --------------------------------------------------------------- */

START_TEST(every_metric_documented)
{
    struct man m = man_load();
    for (size_t i = 0; i < N_FAMILIES; i++) {
        const struct family *f = &families[i];
        char tag[128];
        snprintf(tag, sizeof(tag), "kvbridge_%s", f->name);
        const struct entry *e = man_entry(&m, tag);
        ck_assert_msg(e != NULL, MAN ": no entry (.TP, .B %s) for metric %s", tag, tag);
        ck_assert_msg(strcmp(e->section, "METRICS") == 0, MAN ": %s is not under METRICS", tag);
        char kind[32];
        snprintf(kind, sizeof(kind), "%c%s", toupper((unsigned char)f->kind[0]), f->kind + 1);
        ck_assert_msg(strstr(e->text, kind), MAN ": %s: entry does not say '%s'", tag, kind);
        if (f->label[0] && strcmp(f->label, "source") != 0) /* stream labels: section text */
            ck_assert_msg(strstr(e->text, f->label), MAN ": %s: label '%s' not named", tag,
                          f->label);
        for (int v = 0; v < f->n_values; v++) {
            if (!f->values[v][0])
                continue;
            ck_assert_msg(strstr(e->text, f->values[v]),
                          MAN ": %s: label value '%s' not documented", tag, f->values[v]);
        }
    }
    /* stream metrics: the section names both labels */
    char *metrics = man_section(&m, "METRICS");
    ck_assert_msg(strstr(metrics, ".B source\n") && strstr(metrics, ".B topic\n"),
                  MAN ": the per-stream labels source and topic are not named");
    /* histograms: _bucket with le, _sum, _count */
    ck_assert_msg(strstr(metrics, "_bucket") && strstr(metrics, "_sum") &&
                      strstr(metrics, "_count") && strstr(metrics, ".BR le "),
                  MAN ": the histogram series are not described");
    free(metrics);
    man_free(&m);
}
END_TEST

START_TEST(only_real_metrics_documented)
{
    struct man m = man_load();
    for (size_t i = 0; i < m.n; i++) {
        const char *t = m.e[i].tag;
        if (!starts(t, "kvbridge_"))
            continue;
        ck_assert_msg(family_named(t + 9, strlen(t + 9)) != NULL,
                      MAN ": entry %s is not a metric of metrics.h", t);
    }
    man_free(&m);
}
END_TEST

START_TEST(probes_documented)
{
    struct man m = man_load();
    static const char *const probes[] = {"/metrics", "/healthz", "/readyz"};
    for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
        const struct entry *e = man_entry(&m, probes[i]);
        ck_assert_msg(e != NULL && strcmp(e->section, "METRICS") == 0,
                      MAN ": no entry for %s under METRICS", probes[i]);
    }
    ck_assert_msg(strstr(man_entry(&m, "/healthz")->text, "503") &&
                      strstr(man_entry(&m, "/readyz")->text, "503"),
                  MAN ": /healthz and /readyz must say when they answer 503");
    man_free(&m);
}
END_TEST

START_TEST(every_key_documented)
{
    static struct key keys[256];
    size_t n = example_keys(keys, 256);
    ck_assert_uint_ge(n, 30);
    struct man m = man_load();
    size_t checked = 0;
    for (size_t i = 0; i < n; i++) {
        const struct key *k = &keys[i];
        if (k->section)
            continue;
        const struct entry *e = man_entry(&m, k->path);
        ck_assert_msg(e != NULL, MAN ": no entry (.TP, .B %s) for the key %s of " EXAMPLE, k->path,
                      k->path);
        ck_assert_msg(strcmp(e->section, "CONFIGURATION") == 0,
                      MAN ": %s is not under CONFIGURATION", k->path);
        if (k->required)
            ck_assert_msg(strstr(e->text, "required"),
                          MAN ": %s is required (" EXAMPLE ") but its entry does not say so",
                          k->path);
        else if (k->value[0])
            ck_assert_msg(strstr(e->text, k->value),
                          MAN ": %s: the default '%s' of " EXAMPLE " is not in its entry", k->path,
                          k->value);
        if (k->restart)
            ck_assert_msg(strstr(e->text, "restart"),
                          MAN ": %s needs a restart (" EXAMPLE ") but its entry does not say so",
                          k->path);
        checked++;
    }
    ck_assert_uint_ge(checked, 30);
    /* the other way: every entry under CONFIGURATION is a key */
    for (size_t i = 0; i < m.n; i++) {
        if (strcmp(m.e[i].section, "CONFIGURATION") != 0)
            continue;
        bool found = false;
        for (size_t j = 0; j < n && !found; j++)
            found = !keys[j].section && strcmp(keys[j].path, m.e[i].tag) == 0;
        ck_assert_msg(found, MAN ": CONFIGURATION documents '%s', which is not a key of " EXAMPLE,
                      m.e[i].tag);
    }
    man_free(&m);
}
END_TEST

START_TEST(sections_signals_exit_codes)
{
    struct man m = man_load();
    static const char *const sections[] = {"NAME",          "SYNOPSIS", "DESCRIPTION", "OPTIONS",
                                           "CONFIGURATION", "SIGNALS",  "EXIT STATUS", "METRICS",
                                           "FILES",         "SEE ALSO"};
    for (size_t i = 0; i < sizeof(sections) / sizeof(sections[0]); i++) {
        char h[64];
        snprintf(h, sizeof(h), "\n.SH %s\n", sections[i]);
        ck_assert_msg(strstr(m.src, h), MAN ": no section %s", sections[i]);
    }
    char th[64];
    snprintf(th, sizeof(th), "\"kvbridge %s\"", KVB_VERSION);
    ck_assert_msg(strstr(m.src, th), MAN ": the .TH line must name %s (version.h)", th);
    char *sig = man_section(&m, "SIGNALS");
    ck_assert_msg(strstr(sig, "SIGHUP") && strstr(sig, "SIGTERM") && strstr(sig, "SIGINT"),
                  MAN ": SIGNALS must cover SIGHUP, SIGTERM and SIGINT");
    free(sig);
    char *ex = man_section(&m, "EXIT STATUS");
    char codes[4][8];
    snprintf(codes[0], 8, ".B 0\n");
    snprintf(codes[1], 8, ".B %d\n", KVB_EX_CONFIG);
    snprintf(codes[2], 8, ".B %d\n", KVB_EX_UNAVAILABLE);
    snprintf(codes[3], 8, ".B 1\n");
    for (int i = 0; i < 4; i++)
        ck_assert_msg(strstr(ex, codes[i]), MAN ": EXIT STATUS lacks %.3s", codes[i]);
    free(ex);
    man_free(&m);
}
END_TEST

/* Every option `kvbridge --help` prints is in OPTIONS (skipped, with a
 * message, when build/kvbridge was not built). */
START_TEST(every_option_documented)
{
    const char *bin = getenv("KVB_BIN") ? getenv("KVB_BIN") : "build/kvbridge";
    if (access(bin, X_OK) != 0) {
        fprintf(stderr, "check_docs: %s not built: options not checked\n", bin);
        return;
    }
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s --help 2>&1", bin);
    FILE *p = popen(cmd, "r");
    ck_assert(p != NULL);
    char help[8192];
    size_t hl = fread(help, 1, sizeof(help) - 1, p);
    help[hl] = '\0';
    ck_assert_int_eq(pclose(p), 0);
    struct man m = man_load();
    char *opts = man_section(&m, "OPTIONS");
    char *syn = man_section(&m, "SYNOPSIS");
    int found = 0;
    for (const char *s = help; (s = strchr(s, '-')) != NULL;) {
        bool boundary = s == help || s[-1] == ' ' || s[-1] == '\n' || s[-1] == '[' || s[-1] == '|';
        size_t n = 1;
        if (s[1] == '-')
            n = 2;
        if (!boundary || !isalpha((unsigned char)s[n])) {
            s += n;
            continue;
        }
        while (isalnum((unsigned char)s[n]) || s[n] == '-')
            n++;
        char opt[64];
        snprintf(opt, sizeof(opt), "%.*s", (int)n, s);
        s += n;
        if (opt[1] != '-' && strlen(opt) != 2)
            continue; /* not an option: a word with a dash */
        ck_assert_msg(strstr(opts, opt), MAN ": option %s (kvbridge --help) not in OPTIONS", opt);
        found++;
    }
    ck_assert_int_ge(found, 4); /* -c --config --check --version -h --help */
    ck_assert_msg(strstr(syn, "--check") && strstr(syn, "--version") && strstr(syn, "--help"),
                  MAN ": SYNOPSIS must show -c FILE [--check], --version and --help");
    free(opts);
    free(syn);
    man_free(&m);
}
END_TEST

/* The board queries every metric family, and only metrics that exist. */
START_TEST(grafana_matches_metrics)
{
    size_t len;
    char *g = (char *)read_all(GRAFANA, &len);
    /* the board is JSON that Grafana can import: one object, nothing after it */
    struct json_tokener *tok = json_tokener_new();
    json_object *board = json_tokener_parse_ex(tok, g, (int)len);
    ck_assert_msg(board && json_object_is_type(board, json_type_object) &&
                      json_tokener_get_parse_end(tok) == len,
                  GRAFANA ": not one JSON object: %s",
                  json_tokener_error_desc(json_tokener_get_error(tok)));
    json_object_put(board);
    json_tokener_free(tok);
    bool used[N_FAMILIES] = {false};
    for (const char *s = g; (s = strstr(s, "kvbridge_")) != NULL;) {
        const char *name = s + 9;
        size_t n = 0;
        while (islower((unsigned char)name[n]) || isdigit((unsigned char)name[n]) || name[n] == '_')
            n++;
        s = name + n;
        if (n == 0)
            continue;
        const struct family *f = family_named(name, n);
        if (!f) {
            static const char *const sfx[] = {"_bucket", "_sum", "_count"};
            for (size_t i = 0; i < 3 && !f; i++) {
                size_t sl = strlen(sfx[i]);
                if (n > sl && strncmp(name + n - sl, sfx[i], sl) == 0) {
                    f = family_named(name, n - sl);
                    if (f && strcmp(f->kind, "histogram") != 0)
                        f = NULL;
                }
            }
        }
        ck_assert_msg(f != NULL, GRAFANA ": kvbridge_%.*s is not a metric", (int)n, name);
        used[f - families] = true;
    }
    for (size_t i = 0; i < N_FAMILIES; i++)
        ck_assert_msg(used[i], GRAFANA ": no panel shows kvbridge_%s", families[i].name);
    free(g);
}
END_TEST

/* ---- docs/ Markdown ------------------------------------------------------------ */

/* The text of the Markdown section whose heading line starts with HEAD (e.g.
 * "## 7."), up to the next heading of the same or a higher level;
 * malloc'ed, NULL when there is no such heading. */
static char *md_section(const char *text, const char *head)
{
    size_t hl = strlen(head);
    const char *a = NULL;
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, head, hl) == 0) {
            a = l;
            break;
        }
    }
    if (!a)
        return NULL;
    size_t level = strspn(a, "#");
    bool code = false; /* inside a ``` block: '#' lines are not headings */
    const char *b = strchr(a, '\n');
    while (b) {
        const char *l = b + 1;
        size_t lv = strspn(l, "#");
        if (strncmp(l, "```", 3) == 0)
            code = !code;
        else if (!code && lv > 0 && lv <= level && l[lv] == ' ')
            break;
        b = strchr(l, '\n');
    }
    size_t n = b ? (size_t)(b - a) : strlen(a);
    char *out = malloc(n + 1);
    ck_assert(out != NULL);
    memcpy(out, a, n);
    out[n] = '\0';
    return out;
}

/* A row "| `KEY` | DEFAULT | CHANGE | MEANING |" of the key reference. */
struct row {
    char key[128];
    char def[512];
    char change[32];
};

static size_t reference_rows(const char *section, struct row *out, size_t cap)
{
    size_t n = 0;
    for (const char *l = section; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, "| `", 3) != 0)
            continue;
        const char *end = strchr(l, '\n');
        size_t ll = end ? (size_t)(end - l) : strlen(l);
        char line[4096];
        ck_assert_msg(ll < sizeof(line), CONFIG_MD ": row too long");
        memcpy(line, l, ll);
        line[ll] = '\0';
        char *cells[4] = {0};
        int nc = 0;
        for (char *save = NULL, *c = strtok_r(line + 1, "|", &save); c && nc < 4;
             c = strtok_r(NULL, "|", &save)) {
            while (*c == ' ')
                c++;
            size_t cl = strlen(c);
            while (cl && c[cl - 1] == ' ')
                c[--cl] = '\0';
            cells[nc++] = c;
        }
        ck_assert_msg(nc == 4, CONFIG_MD ": a key row needs 4 cells: '%.*s'", (int)ll, l);
        ck_assert(n < cap);
        struct row *r = &out[n++];
        const char *k = cells[0] + 1, *ke = strchr(k, '`');
        ck_assert_msg(ke != NULL, CONFIG_MD ": bad key cell '%s'", cells[0]);
        snprintf(r->key, sizeof(r->key), "%.*s", (int)(ke - k), k);
        snprintf(r->def, sizeof(r->def), "%s", cells[1]);
        snprintf(r->change, sizeof(r->change), "%s", cells[2]);
    }
    return n;
}

START_TEST(configuration_md_keys)
{
    static struct key keys[256];
    static struct row rows[256];
    size_t n = example_keys(keys, 256), len;
    char *md = (char *)read_all(CONFIG_MD, &len);
    char *ref = md_section(md, "## 7. Key reference");
    ck_assert_msg(ref != NULL, CONFIG_MD ": no section '## 7. Key reference'");
    size_t nr = reference_rows(ref, rows, 256), checked = 0;
    for (size_t i = 0; i < n; i++) {
        const struct key *k = &keys[i];
        if (k->section)
            continue;
        const struct row *r = NULL;
        for (size_t j = 0; j < nr; j++) {
            if (strcmp(rows[j].key, k->path) != 0)
                continue;
            ck_assert_msg(r == NULL, CONFIG_MD ": key %s has two rows", k->path);
            r = &rows[j];
        }
        ck_assert_msg(r != NULL, CONFIG_MD ": no row (| `%s` | ...) for the key %s of " EXAMPLE,
                      k->path, k->path);
        if (k->required)
            ck_assert_msg(strstr(r->def, "required"),
                          CONFIG_MD ": %s is required (" EXAMPLE ") but its row does not say so",
                          k->path);
        else if (k->value[0])
            ck_assert_msg(strstr(r->def, k->value),
                          CONFIG_MD ": %s: the default '%s' of " EXAMPLE " is not in its row",
                          k->path, k->value);
        ck_assert_msg(strcmp(r->change, k->restart ? "restart" : "SIGHUP") == 0,
                      CONFIG_MD ": %s: change column '%s', want '%s' (" EXAMPLE ")", k->path,
                      r->change, k->restart ? "restart" : "SIGHUP");
        checked++;
    }
    ck_assert_uint_ge(checked, 30);
    for (size_t j = 0; j < nr; j++) {
        bool found = false;
        for (size_t i = 0; i < n && !found; i++)
            found = !keys[i].section && strcmp(keys[i].path, rows[j].key) == 0;
        ck_assert_msg(found, CONFIG_MD ": documents '%s', which is not a key of " EXAMPLE,
                      rows[j].key);
    }
    free(ref);

    /* exit codes, signals, options */
    char *ex = md_section(md, "## 4. Exit codes");
    ck_assert_msg(ex != NULL, CONFIG_MD ": no section '## 4. Exit codes'");
    char code[16];
    const int codes[] = {0, KVB_EX_CONFIG, KVB_EX_UNAVAILABLE, 1};
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
        snprintf(code, sizeof(code), "\n| %d", codes[i]);
        ck_assert_msg(strstr(ex, code), CONFIG_MD ": exit code %d not in its table", codes[i]);
    }
    free(ex);
    char *sig = md_section(md, "## 5. Signals");
    ck_assert_msg(sig && strstr(sig, "SIGHUP") && strstr(sig, "SIGTERM") && strstr(sig, "SIGINT"),
                  CONFIG_MD ": section 5 must cover SIGHUP, SIGTERM and SIGINT");
    free(sig);
    char *cli = md_section(md, "## 3. Command line");
    static const char *const options[] = {"-c FILE",   "--config", "--check",
                                          "--version", "-h",       "--help"};
    ck_assert_msg(cli != NULL, CONFIG_MD ": no section '## 3. Command line'");
    for (size_t i = 0; i < sizeof(options) / sizeof(options[0]); i++)
        ck_assert_msg(strstr(cli, options[i]), CONFIG_MD ": option %s not in section 3",
                      options[i]);
    free(cli);
    free(md);
}
END_TEST

/* Comments cite "docs/engine-events.md section N", "docs/router-events.md section N"
 * and "docs/design.md rule N": those headings and rules must stay. */
START_TEST(docs_sections_stable)
{
    static const struct {
        const char *file;
        int n;
    } docs[] = {{"docs/engine-events.md", 6}, {"docs/router-events.md", 7}};
    for (size_t d = 0; d < sizeof(docs) / sizeof(docs[0]); d++) {
        size_t len;
        char *t = (char *)read_all(docs[d].file, &len);
        for (int i = 1; i <= docs[d].n; i++) {
            char h[16];
            snprintf(h, sizeof(h), "## %d. ", i);
            char *sec = md_section(t, h);
            ck_assert_msg(sec != NULL, "%s: no section '%s...'", docs[d].file, h);
            free(sec);
        }
        free(t);
    }
    size_t len;
    char *t = (char *)read_all("docs/design.md", &len);
    char *rules = md_section(t, "## House rules");
    ck_assert_msg(rules != NULL, "docs/design.md: no section '## House rules'");
    for (int i = 1; i <= 12; i++) {
        char r[16];
        snprintf(r, sizeof(r), "\n%d. ", i);
        ck_assert_msg(strstr(rules, r), "docs/design.md: house rule %d is missing", i);
    }
    free(rules);
    free(t);
}
END_TEST

/* docs/dynamo-event-plane.md: comments cite its sections by number ("section 5"
 * for the EventSource records): each number must still exist and still be about
 * the same thing, told by a word of its heading. */
START_TEST(event_plane_sections_stable)
{
    static const struct {
        const char *head;
        const char *word;
    } secs[] = {{"## 1. ", "router"},      {"## 2. ", "Subject"},   {"## 3. ", "envelope"},
                {"## 4. ", "RouterEvent"}, {"## 5. ", "Discovery"}, {"## 6. ", "ActiveLoad"},
                {"## 7. ", "tokens_hash"}, {"## 8. ", "checked"}};
    size_t len;
    char *t = (char *)read_all("docs/dynamo-event-plane.md", &len);
    for (size_t i = 0; i < sizeof(secs) / sizeof(secs[0]); i++) {
        char *sec = md_section(t, secs[i].head);
        ck_assert_msg(sec != NULL, "docs/dynamo-event-plane.md: no section '%s...'", secs[i].head);
        char *eol = strchr(sec, '\n');
        if (eol)
            *eol = '\0';
        ck_assert_msg(strstr(sec, secs[i].word),
                      "docs/dynamo-event-plane.md: '%s' is not "
                      "about %s any more",
                      sec, secs[i].word);
        free(sec);
    }
    free(t);
    /* router-events.md section 3's subsections, cited as 3.1 .. 3.4 */
    t = (char *)read_all("docs/router-events.md", &len);
    static const struct {
        const char *head;
        const char *word;
    } sub[] = {{"### 3.1 ", "namespace"},
               {"### 3.2 ", "Multimodal"},
               {"### 3.3 ", "EAGLE"},
               {"### 3.4 ", "Known answers"}};
    for (size_t i = 0; i < sizeof(sub) / sizeof(sub[0]); i++) {
        char *sec = md_section(t, sub[i].head);
        ck_assert_msg(sec != NULL, "docs/router-events.md: no section '%s...'", sub[i].head);
        char *eol = strchr(sec, '\n');
        if (eol)
            *eol = '\0';
        ck_assert_msg(strstr(sec, sub[i].word), "docs/router-events.md: '%s' is not about %s", sec,
                      sub[i].word);
        free(sec);
    }
    free(t);
}
END_TEST

/* One "docs/NAME.md section N" (or "sections N, M and K", "sections N to M",
 * N possibly "3.1") cited at P in FILE: the document exists and has those
 * headings ("## N. " or "### N.M "). Returns the end of the citation. */
static const char *check_citation(const char *file, const char *text, const char *p)
{
    const char *name = p + 5; /* after "docs/" */
    size_t nlen = strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789-");
    if (strncmp(name + nlen, ".md", 3) != 0)
        return p + 5;
    const char *q = name + nlen + 3;
    q += strspn(q, " \t\n*#/");
    if (strncmp(q, "sections ", 9) == 0)
        q += 9;
    else if (strncmp(q, "section ", 8) == 0)
        q += 8;
    else
        return q;
    char path[128];
    snprintf(path, sizeof(path), "docs/%.*s.md", (int)nlen, name);
    int line = 1;
    for (const char *c = text; c < p; c++)
        line += *c == '\n';
    ck_assert_msg(access(path, R_OK) == 0, "%s:%d cites %s, which does not exist", file, line,
                  path);
    size_t len;
    char *doc = (char *)read_all(path, &len);
    long prev = -1;
    bool range = false;
    for (;;) {
        if (!isdigit((unsigned char)*q))
            break;
        char *end;
        long major = strtol(q, &end, 10), minor = -1;
        if (*end == '.' && isdigit((unsigned char)end[1]))
            minor = strtol(end + 1, &end, 10);
        long from = range && minor < 0 && prev >= 0 ? prev + 1 : major;
        for (long n = from; n <= major; n++) {
            char h[48];
            if (minor < 0)
                snprintf(h, sizeof(h), "## %ld. ", n);
            else
                snprintf(h, sizeof(h), "### %ld.%ld ", n, minor);
            char *sec = md_section(doc, h);
            ck_assert_msg(sec != NULL, "%s:%d cites %s, which has no heading '%s'", file, line,
                          path, h);
            free(sec);
        }
        prev = minor < 0 ? major : -1;
        q = end;
        range = false;
        const char *r = q + strspn(q, " \t\n*#/");
        if (strncmp(q, ", and ", 6) == 0)
            q += 6;
        else if (strncmp(q, ", ", 2) == 0)
            q += 2;
        else if (strncmp(r, "and ", 4) == 0 && r > q)
            q = r + 4;
        else if (strncmp(r, "to ", 3) == 0 && r > q) {
            q = r + 3;
            range = true;
        } else
            break;
        q += strspn(q, " \t\n*#/");
    }
    free(doc);
    return q;
}

/* Every "docs/X.md section N" cited in the code, the tests, the tools and the
 * documents names a document and a heading that exist. */
START_TEST(cited_sections_exist)
{
    static const char *dirs[] = {
        "src",        "include",     "tools", "tests/unit", "tests/integration",
        "tests/fuzz", "tests/bench", "docs",  "conf",       "."};
    size_t files = 0, cites = 0;
    for (size_t d = 0; d < sizeof(dirs) / sizeof(dirs[0]); d++) {
        DIR *dir = opendir(dirs[d]);
        if (!dir)
            continue;
        struct dirent *e;
        while ((e = readdir(dir))) {
            const char *ext = strrchr(e->d_name, '.');
            if (!ext || e->d_name[0] == '.' ||
                (strcmp(ext, ".c") && strcmp(ext, ".h") && strcmp(ext, ".sh") &&
                 strcmp(ext, ".md") && strcmp(ext, ".yaml")))
                continue;
            char path[512];
            snprintf(path, sizeof(path), "%s/%s", dirs[d], e->d_name);
            struct stat st;
            if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
                continue;
            size_t len;
            char *t = (char *)read_all(path, &len);
            files++;
            for (const char *p = strstr(t, "docs/"); p; p = strstr(p, "docs/")) {
                const char *q = check_citation(path, t, p);
                cites += q != p + 5;
                p = q > p ? q : p + 5;
            }
            free(t);
        }
        closedir(dir);
    }
    ck_assert_msg(files > 50 && cites > 20,
                  "only %zu files and %zu citations found: run from "
                  "the project root",
                  files, cites);
}
END_TEST

/* The documents in docs/ are the project's own, not copies of the contracts
 * they were written from.  The contracts are not part of the tree: they are
 * looked for in $KVB_SPEC_DIR, else ../shared/spec (beside a CI checkout); when
 * neither exists the check is skipped.  A document fails when a fifth or more
 * of its lines of 40 characters or more appear word for word in one contract. */
static char **lines_of(char *text, size_t *n)
{
    size_t cap = 64;
    char **v = malloc(cap * sizeof(*v));
    ck_assert(v != NULL);
    *n = 0;
    for (char *l = strtok(text, "\n"); l; l = strtok(NULL, "\n")) {
        while (isspace((unsigned char)*l))
            l++;
        size_t k = strlen(l);
        while (k && isspace((unsigned char)l[k - 1]))
            l[--k] = '\0';
        if (k < 40)
            continue;
        if (*n == cap) {
            cap *= 2;
            v = realloc(v, cap * sizeof(*v));
            ck_assert(v != NULL);
        }
        v[(*n)++] = l;
    }
    return v;
}

START_TEST(docs_are_not_spec_copies)
{
    const char *spec = getenv("KVB_SPEC_DIR");
    if (!spec || !*spec)
        spec = "../shared/spec";
    DIR *sd = opendir(spec);
    if (!sd)
        return; /* no contracts beside this tree: nothing to compare with */
    struct dirent *s;
    size_t compared = 0;
    while ((s = readdir(sd))) {
        const char *ext = strrchr(s->d_name, '.');
        if (!ext || strcmp(ext, ".md") != 0)
            continue;
        char sp[512];
        snprintf(sp, sizeof(sp), "%s/%s", spec, s->d_name);
        size_t slen, ns;
        char *stext = (char *)read_all(sp, &slen);
        char **sl = lines_of(stext, &ns);
        DIR *dd = opendir("docs");
        ck_assert(dd != NULL);
        struct dirent *e;
        while ((e = readdir(dd))) {
            if (e->d_name[0] == '.' || strcmp(e->d_name, "kvbridge.8") == 0)
                continue;
            char dp[512];
            snprintf(dp, sizeof(dp), "docs/%s", e->d_name);
            size_t dlen, nd, same = 0;
            char *dtext = (char *)read_all(dp, &dlen);
            char **dl = lines_of(dtext, &nd);
            for (size_t i = 0; i < nd; i++)
                for (size_t j = 0; j < ns; j++)
                    if (strcmp(dl[i], sl[j]) == 0) {
                        same++;
                        break;
                    }
            ck_assert_msg(nd == 0 || same * 5 < nd,
                          "%s: %zu of its %zu long lines are copied "
                          "word for word from %s: write the project's own document",
                          dp, same, nd, sp);
            compared++;
            free(dl);
            free(dtext);
        }
        closedir(dd);
        free(sl);
        free(stext);
    }
    closedir(sd);
    ck_assert_msg(compared > 0, "%s: no contract (*.md) found", spec);
}
END_TEST

static Suite *docs_suite(void)
{
    Suite *s = suite_create("docs");
    TCase *tc = tcase_create("docs");
    tcase_add_test(tc, every_metric_documented);
    tcase_add_test(tc, only_real_metrics_documented);
    tcase_add_test(tc, probes_documented);
    tcase_add_test(tc, every_key_documented);
    tcase_add_test(tc, sections_signals_exit_codes);
    tcase_add_test(tc, every_option_documented);
    tcase_add_test(tc, grafana_matches_metrics);
    tcase_add_test(tc, configuration_md_keys);
    tcase_add_test(tc, docs_sections_stable);
    tcase_add_test(tc, event_plane_sections_stable);
    tcase_add_test(tc, cited_sections_exist);
    tcase_add_test(tc, docs_are_not_spec_copies);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(docs_suite()); }
