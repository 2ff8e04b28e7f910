/* promtext: the Prometheus text format 0.0.4, one line at a time (see
 * promtext.h for what is accepted). */
#include "promtext.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static bool blank(char c) { return c == ' ' || c == '\t'; }
static bool alpha_(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool digit(char c) { return c >= '0' && c <= '9'; }

static char *skip_blanks(char *p, const char *end)
{
    while (p < end && blank(*p))
        p++;
    return p;
}

/* A metric name ([a-zA-Z_:][a-zA-Z0-9_:]*) or, without colons, a label
 * name.  Returns the end of the name, or NULL when there is none or it is
 * too long. */
static char *scan_name(char *p, const char *end, bool colon)
{
    char *s = p;
    if (p >= end || !(alpha_(*p) || (colon && *p == ':')))
        return NULL;
    p++;
    while (p < end && (alpha_(*p) || digit(*p) || (colon && *p == ':')))
        p++;
    return (size_t)(p - s) <= KVB_PROM_MAX_NAME ? p : NULL;
}

/* The label value after the opening quote at p, unescaped in place.  Sets
 * *vlen and returns the position after the closing quote, or NULL. */
static char *scan_value(char *p, const char *end, size_t *vlen)
{
    char *start = p, *w = p;
    while (p < end && *p != '"') {
        if ((size_t)(p - start) >= KVB_PROM_MAX_LABEL_VALUE)
            return NULL;
        if (*p != '\\') {
            *w++ = *p++;
            continue;
        }
        if (p + 1 >= end)
            return NULL;
        char n = p[1];
        if (n == '\\' || n == '"') {
            *w++ = n;
        } else if (n == 'n') {
            *w++ = '\n';
        } else { /* unknown escape: kept as it is */
            *w++ = '\\';
            *w++ = n;
        }
        p += 2;
    }
    if (p >= end)
        return NULL; /* unterminated */
    *vlen = (size_t)(w - start);
    return p + 1;
}

/* The token [p, t) as a NUL-terminated copy in buf, or false when it is
 * empty or too long. */
static bool token(const char *p, const char *t, char buf[KVB_PROM_MAX_NUMBER + 1])
{
    size_t n = (size_t)(t - p);
    if (n == 0 || n > KVB_PROM_MAX_NUMBER)
        return false;
    memcpy(buf, p, n);
    buf[n] = '\0';
    return true;
}

static bool parse_double(const char *p, const char *t, double *v)
{
    char buf[KVB_PROM_MAX_NUMBER + 1], *e;
    if (!token(p, t, buf))
        return false;
    for (const char *c = buf; *c; c++) /* no blanks or junk strtod would skip */
        if ((unsigned char)*c <= ' ' || (unsigned char)*c >= 0x7f)
            return false;
    errno = 0;
    double x = strtod(buf, &e);
    if (*e != '\0')
        return false;
    /* ERANGE on underflow still gives a usable value (0 or a denormal);
     * on overflow strtod gives +-HUGE_VAL = +-Inf, as Go's ParseFloat does. */
    *v = x;
    return true;
}

static bool parse_i64(const char *p, const char *t, int64_t *v)
{
    char buf[KVB_PROM_MAX_NUMBER + 1], *e;
    if (!token(p, t, buf))
        return false;
    const char *d = buf + (buf[0] == '-' || buf[0] == '+');
    if (!digit(*d))
        return false;
    for (const char *c = d; *c; c++)
        if (!digit(*c))
            return false;
    errno = 0;
    long long x = strtoll(buf, &e, 10);
    if (errno == ERANGE || *e != '\0')
        return false;
    *v = (int64_t)x;
    return true;
}

/* One sample line [p, end) (no '\n', no trailing '\r').  Returns true and
 * fills s when it is well-formed. */
static bool parse_sample(char *p, char *end, struct kvb_prom_label *labels,
                         struct kvb_prom_sample *s)
{
    char *q = scan_name(p, end, true);
    if (!q)
        return false;
    s->name = p;
    s->name_len = (size_t)(q - p);
    s->n_labels = 0;
    s->labels = labels;
    s->has_timestamp = false;
    s->timestamp_ms = 0;
    p = q;
    bool sep = p < end && blank(*p);
    p = skip_blanks(p, end);
    if (p < end && *p == '{') {
        p++;
        for (;;) {
            p = skip_blanks(p, end);
            if (p < end && *p == '}') {
                p++;
                break;
            }
            if (s->n_labels >= KVB_PROM_MAX_LABELS)
                return false;
            struct kvb_prom_label *l = &labels[s->n_labels];
            q = scan_name(p, end, false);
            if (!q)
                return false;
            l->name = p;
            l->name_len = (size_t)(q - p);
            p = skip_blanks(q, end);
            if (p >= end || *p != '=')
                return false;
            p = skip_blanks(p + 1, end);
            if (p >= end || *p != '"')
                return false;
            l->value = p + 1;
            p = scan_value(p + 1, end, &l->value_len);
            if (!p)
                return false;
            s->n_labels++;
            p = skip_blanks(p, end);
            if (p < end && *p == ',') {
                p++;
                continue;
            }
            if (p < end && *p == '}') {
                p++;
                break;
            }
            return false;
        }
        p = skip_blanks(p, end);
    } else if (!sep) {
        return false; /* "name" glued to something that is not a label set */
    }
    char *t = p;
    while (t < end && !blank(*t))
        t++;
    if (!parse_double(p, t, &s->value))
        return false;
    p = skip_blanks(t, end);
    if (p < end) {
        t = p;
        while (t < end && !blank(*t))
            t++;
        if (!parse_i64(p, t, &s->timestamp_ms))
            return false;
        s->has_timestamp = true;
        p = skip_blanks(t, end);
    }
    return p == end;
}

int kvb_prom_parse(char *text, size_t len, kvb_prom_cb cb, void *ctx, struct kvb_prom_stats *stats)
{
    struct kvb_prom_stats st = {0};
    if ((!text && len > 0) || !cb)
        return -EINVAL;
    struct kvb_prom_label labels[KVB_PROM_MAX_LABELS];
    struct kvb_prom_sample s;
    char *p = text, *end = text ? text + len : NULL;
    int rc = 0;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *le = nl ? nl : end;
        char *next = nl ? nl + 1 : end;
        if (le > p && le[-1] == '\r')
            le--;
        st.lines++;
        char *b = skip_blanks(p, le);
        if (b == le) {
            /* blank line */
        } else if (*b == '#') {
            st.comments++;
        } else if (parse_sample(b, le, labels, &s)) {
            st.samples++;
            rc = cb(ctx, &s);
            if (rc != 0)
                break;
        } else {
            st.malformed++;
        }
        p = next;
    }
    if (stats)
        *stats = st;
    return rc;
}

const struct kvb_prom_label *kvb_prom_label(const struct kvb_prom_sample *s, const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; i < s->n_labels; i++)
        if (s->labels[i].name_len == n && memcmp(s->labels[i].name, name, n) == 0)
            return &s->labels[i];
    return NULL;
}

bool kvb_prom_name_is(const struct kvb_prom_sample *s, const char *name)
{
    size_t n = strlen(name);
    return s->name_len == n && memcmp(s->name, name, n) == 0;
}
