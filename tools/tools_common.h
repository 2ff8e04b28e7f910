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
#include <signal.h>
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
