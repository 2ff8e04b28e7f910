/*
 * tools_common.h: the helpers that kvsim and kvtail share.
 *
 * kvsim and kvtail are the integration tests' oracle: they use nothing from
 * src/ or include/ (the Makefile builds them without -Iinclude and without
 * libkvb.a), so that a bug in the daemon cannot hide in the instruments that
 * check it.  What both need lives here, header-only (static inline: a tool
 * still builds from its one .c file, see the Build line at its top).
 *
 * Define TOOL_NAME (the prefix of the tool's error messages) before the
 * #include; TOOL_EXIT_OOM (default 1) is the exit code on out of memory.
 *
 * The --record file that kvsim writes and kvtail --expect-record reads is
 * described in tools/README.md ("The record format").
 */
#ifndef KVB_TOOLS_COMMON_H
#define KVB_TOOLS_COMMON_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#ifndef TOOL_NAME
#error "define TOOL_NAME before including tools_common.h"
#endif
#ifndef TOOL_EXIT_OOM
#define TOOL_EXIT_OOM 1
#endif

/* ------------------------------------------------------------------ signals */

/* Set by SIGINT/SIGTERM (catch_stop_signals); the tools' loops poll it. */
static volatile sig_atomic_t stop_flag;

static inline void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

/* SIGINT and SIGTERM set stop_flag. */
static inline void catch_stop_signals(void)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* ------------------------------------------------------------------- memory */

/* realloc/calloc that exit(TOOL_EXIT_OOM) on failure; never return NULL. */
static inline void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, TOOL_NAME ": out of memory\n");
        exit(TOOL_EXIT_OOM);
    }
    return q;
}

static inline void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) {
        fprintf(stderr, TOOL_NAME ": out of memory\n");
        exit(TOOL_EXIT_OOM);
    }
    return p;
}

/* -------------------------------------------------------------------- clock */

/* CLOCK_MONOTONIC in nanoseconds / milliseconds. */
static inline int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline int64_t now_ms(void) { return now_ns() / 1000000; }

/* CLOCK_REALTIME in seconds. */
static inline double wall_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ------------------------------------------------------------------ hashing */

/* splitmix64's finaliser: the tools' hash tables and random numbers. */
static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/* ------------------------------------------------------------ option values */

/* A decimal u64: digits only (no sign, no blanks), no overflow; -EINVAL
 * otherwise, *out untouched. */
static inline int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v;

    if (!s || *s < '0' || *s > '9')
        return -EINVAL;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || *end)
        return -EINVAL;
    *out = v;
    return 0;
}

/* ---------------------------------------------------------- option tables */

/* A tool's command line is one table of rows.  A row is an option: its long
 * name, the name of its argument (NULL: it takes none), a short name (0:
 * none), what giving it does, and its help; or, with name NULL, a line of
 * the help text itself (a heading; "" for a blank line).  The same table
 * gives getopt_long its options and usage its text.  What an option does:
 *   TOOL_STR     the field (const char *) is the argument
 *   TOOL_FLAG    the field (bool) is true
 *   TOOL_U64     the argument is a decimal integer in min..max, stored in
 *                the field as its size says (4 bytes: unsigned, 8: uint64_t,
 *                long, size_t)
 *   TOOL_CHOICE  the field (an enum, or a bool) is the argument's index in
 *                choices[]
 *   TOOL_CALL    the tool's own code, on the row's id
 */
enum tool_opt_kind { TOOL_STR, TOOL_FLAG, TOOL_U64, TOOL_CHOICE, TOOL_CALL };

struct tool_opt {
    const char *name;
    const char *arg;
    char short_name;
    enum tool_opt_kind kind;
    size_t off, size; /* the field in the tool's options (TOOL_FIELD) */
    uint64_t min, max;
    const char *const *choices; /* NULL-terminated */
    int id;
    const char *usage; /* the help's left column when not "--name ARG" */
    const char *help;  /* lines separated by '\n'; NULL: not in the help */
    const char *bad;   /* the message for a bad value, after "TOOL: " (a printf
                        * format, %s the value); NULL: the tool's own */
};

#define TOOL_FIELD(type, f) .off = offsetof(type, f), .size = sizeof(((type *)0)->f)
#define TOOL_MAX_OPTS 64

/* The help text of rows T[0..N), the help column at COL. */
static inline void tool_usage(FILE *f, const struct tool_opt *t, size_t n, int col)
{
    for (size_t i = 0; i < n; i++) {
        char left[128];
        if (!t[i].name) {
            fprintf(f, "%s\n", t[i].help);
            continue;
        }
        if (!t[i].help)
            continue;
        if (t[i].usage)
            snprintf(left, sizeof left, "  %s", t[i].usage);
        else
            snprintf(left, sizeof left, "  --%s%s%s", t[i].name, t[i].arg ? " " : "",
                     t[i].arg ? t[i].arg : "");
        int len = (int)strlen(left);
        const char *h = t[i].help;
        fprintf(f, "%-*s%s", len + 2 <= col ? col : len + 2, left, "");
        for (;;) {
            size_t l = strcspn(h, "\n");
            fprintf(f, "%.*s\n", (int)l, h);
            if (!h[l])
                break;
            h += l + 1;
            fprintf(f, "%*s", col, "");
        }
    }
}

/* getopt_long over a table of rows. */
struct tool_parser {
    const struct tool_opt *t;
    size_t n;
    struct option lo[TOOL_MAX_OPTS + 1];
    char shorts[2 * TOOL_MAX_OPTS + 1];
};

static inline void tool_parser_init(struct tool_parser *p, const struct tool_opt *t, size_t n)
{
    size_t k = 0, s = 0;
    memset(p, 0, sizeof *p);
    p->t = t;
    p->n = n;
    for (size_t i = 0; i < n && k < TOOL_MAX_OPTS; i++) {
        if (!t[i].name)
            continue;
        p->lo[k++] = (struct option){t[i].name, t[i].arg ? required_argument : no_argument, NULL,
                                     t[i].short_name ? t[i].short_name : 256 + (int)i};
        if (t[i].short_name) {
            p->shorts[s++] = t[i].short_name;
            if (t[i].arg)
                p->shorts[s++] = ':';
        }
    }
}

/* The next option of the command line: 1 and *row (its argument in optarg),
 * 0 at the end of the options, -1 for an unknown one or a missing argument
 * (getopt_long said which). */
static inline int tool_next(struct tool_parser *p, int argc, char **argv,
                            const struct tool_opt **row)
{
    int c = getopt_long(argc, argv, p->shorts, p->lo, NULL);
    if (c == -1)
        return 0;
    for (size_t i = 0; i < p->n; i++) {
        if (p->t[i].name && (c == 256 + (int)i || (c < 256 && c == p->t[i].short_name))) {
            *row = &p->t[i];
            return 1;
        }
    }
    return -1;
}

/* The argument of TOOL_U64 row R: 0 and *v, or -EINVAL when it is not a
 * number in min..max. */
static inline int tool_u64(const struct tool_opt *r, const char *arg, uint64_t *v)
{
    uint64_t x;
    if (parse_u64(arg, &x) || x < r->min || x > r->max)
        return -EINVAL;
    *v = x;
    return 0;
}

/* What row R does with ARG to the options at BASE, unless it is TOOL_CALL
 * (then 1: the tool's).  0, or -EINVAL for a bad value. */
static inline int tool_store(const struct tool_opt *r, void *base, const char *arg)
{
    char *field = (char *)base + r->off;
    uint64_t v = 1;
    switch (r->kind) {
    case TOOL_STR: memcpy(field, &arg, sizeof arg); return 0;
    case TOOL_CALL: return 1;
    case TOOL_FLAG: break;
    case TOOL_U64:
        if (tool_u64(r, arg, &v))
            return -EINVAL;
        break;
    case TOOL_CHOICE:
        for (v = 0; r->choices[v] && strcmp(r->choices[v], arg) != 0; v++) {
        }
        if (!r->choices[v])
            return -EINVAL;
        break;
    }
    if (r->size == sizeof(bool)) {
        bool b = v != 0;
        memcpy(field, &b, sizeof b);
    } else if (r->size == sizeof(uint32_t)) {
        uint32_t w = (uint32_t)v;
        memcpy(field, &w, sizeof w);
    } else {
        memcpy(field, &v, sizeof v);
    }
    return 0;
}

/* The handlers a tool gives tool_parse(): what its TOOL_CALL rows do (0
 * or -EINVAL, reported), the message for a bad value (returns -EINVAL), its
 * help text (on stderr after an unknown option). */
struct tool_handlers {
    int (*call)(const struct tool_opt *r, const char *arg, void *base);
    int (*bad)(const struct tool_opt *r, const char *arg);
    void (*usage)(FILE *f);
};

/* Read the options of the command line into BASE (the tool's options
 * struct) with rows T[0..N): 0, or -EINVAL (reported).  The arguments left
 * start at optind. */
static inline int tool_parse(int argc, char **argv, const struct tool_opt *t, size_t n, void *base,
                             const struct tool_handlers *h)
{
    struct tool_parser p;
    const struct tool_opt *r;
    int rc;

    tool_parser_init(&p, t, n);
    while ((rc = tool_next(&p, argc, argv, &r)) != 0) {
        if (rc < 0) {
            h->usage(stderr);
            return -EINVAL;
        }
        rc = tool_store(r, base, optarg);
        if (rc > 0)
            rc = h->call(r, optarg, base);
        else if (rc < 0)
            rc = h->bad(r, optarg);
        if (rc < 0)
            return -EINVAL;
    }
    return 0;
}

/* ------------------------------------------------------------- line files */

/* The next line of f (record files, --publish input) with its trailing CR/LF
 * dropped; returns its length (0 for an empty line), -1 at the end or on a
 * read error.  line and cap as for getline(3): free(*line) when done. */
static inline ssize_t read_line(FILE *f, char **line, size_t *cap)
{
    ssize_t n = getline(line, cap, f);

    if (n <= 0)
        return -1;
    while (n > 0 && ((*line)[n - 1] == '\n' || (*line)[n - 1] == '\r'))
        n--;
    return n;
}

#endif /* KVB_TOOLS_COMMON_H */
