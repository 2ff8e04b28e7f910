/* config util: what every file of the config module uses: the error
 * messages (FILE:LINE:COL), malloc'd strings, user values quoted safely,
 * decimal integers.  A leaf: it calls no other file of src/config/ (the file
 * graph is at the top of config_priv.h).
 */
#include "config_priv.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ERRORS 100 /* printed; the rest are counted */
#define MAX_SHOWN 60   /* bytes of a user value quoted in a message */

/* ---- messages ---------------------------------------------------------- */

/* line 0: an error about the whole file ("FILE: message"). */
void kvb_cfg_verr(struct ctx *c, size_t line, size_t col, const char *fmt, va_list ap)
{
    c->nerr++;
    if (!c->err || c->nerr > MAX_ERRORS + 1)
        return;
    if (c->nerr == MAX_ERRORS + 1) {
        fprintf(c->err, "%s: too many errors, not showing the rest\n", c->path);
        return;
    }
    if (line)
        fprintf(c->err, "%s:%zu:%zu: ", c->path, line, col);
    else
        fprintf(c->err, "%s: ", c->path);
    vfprintf(c->err, fmt, ap);
    fputc('\n', c->err);
}

void kvb_cfg_oom(struct ctx *c)
{
    if (!c->oom)
        err_at(c, 0, 0, "out of memory");
    c->oom = true;
}

/* ---- strings ----------------------------------------------------------- */

char *kvb_cfg_asprintf(struct ctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = n < 0 ? NULL : malloc((size_t)n + 1);
    if (!s) {
        if (c)
            oom(c);
        return NULL;
    }
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

/* Free a string of the config, zeroed first (it may be a secret). */
void kvb_cfg_str_free(char *s)
{
    if (s) {
        explicit_bzero(s, strlen(s));
        free(s);
    }
}

/* A user value made safe for a one-line message: printable ASCII kept (and
 * UTF-8 bytes), controls as \xNN, cut after MAX bytes.  Returns a malloc'd
 * string, or NULL when out of memory (SHOWN() gives a placeholder). */
char *kvb_cfg_shown_max(const char *s, size_t len, size_t max)
{
    size_t n = len < max ? len : max;
    char *o = malloc(n * 4 + 4);
    if (!o)
        return NULL;
    char *p = o;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 || ch == 0x7f || ch == '\\') {
            if (ch == '\\') {
                *p++ = '\\';
                *p++ = '\\';
            } else {
                snprintf(p, 5, "\\x%02x", ch);
                p += 4;
            }
        } else {
            *p++ = (char)ch;
        }
    }
    // cppcheck-suppress knownConditionTrueFalse ; n is min(len, max): below len when cut
    if (n < len)
        p += sprintf(p, "...");
    *p = '\0';
    return o;
}

char *kvb_cfg_shown(const char *s, size_t len) { return kvb_cfg_shown_max(s, len, MAX_SHOWN); }

/* "a, b or c" into a malloc'd string. */
char *kvb_cfg_join_values(struct ctx *c, const char *const *values, const char *last_sep)
{
    size_t n = 0, total = 1;
    while (values[n])
        total += strlen(values[n++]) + strlen(last_sep) + 2;
    char *s = malloc(total);
    if (!s) {
        if (c)
            oom(c);
        return NULL;
    }
    s[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (i)
            strcat(s, i + 1 == n ? last_sep : ", ");
        strcat(s, values[i]);
    }
    return s;
}

void kvb_cfg_free_strlist(char **list, size_t n)
{
    if (!list)
        return;
    for (size_t i = 0; i < n; i++)
        free(list[i]);
    free(list);
}

/* ---- numbers ----------------------------------------------------------- */

/* 0 ok, -1 not a decimal integer, -2 negative, -3 above UINT64_MAX. */
int kvb_cfg_parse_u64(const char *s, size_t len, uint64_t *out)
{
    size_t i = 0;
    bool neg = false;
    if (len && s[0] == '-') {
        neg = true;
        i = 1;
    }
    if (i == len)
        return -1;
    if (s[i] == '0' && len - i > 1)
        return -1; /* no leading zeros: YAML 1.1 reads them as octal */
    uint64_t v = 0;
    bool big = false;
    for (; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            big = true;
        else
            v = v * 10 + d;
    }
    if (neg)
        return v == 0 && !big ? -1 : -2;
    if (big)
        return -3;
    *out = v;
    return 0;
}

/* PORT of "...:PORT" (last colon), or -1 when not a number in 0..65535. */
long kvb_cfg_port_of(const char *s)
{
    const char *colon = strrchr(s, ':');
    if (!colon || colon[1] == '\0' || strlen(colon + 1) > 5)
        return -1;
    long port = 0;
    for (const char *p = colon + 1; *p; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        port = port * 10 + (*p - '0');
    }
    return port <= 65535 ? port : -1;
}
