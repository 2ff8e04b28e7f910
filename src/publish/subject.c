/* subject: NATS subject templates and message ids.  See include/subject.h. */
#include "subject.h"

#include <errno.h>
#include <limits.h>
#include <string.h>

#include "encode.h"

static const struct {
    const char *name; /* without the braces */
    size_t len;
    unsigned bit;
} placeholders[] = {
    {"namespace", 9, KVB_PH_NAMESPACE}, {"component", 9, KVB_PH_COMPONENT},
    {"worker_id", 9, KVB_PH_WORKER_ID}, {"dp_rank", 7, KVB_PH_DP_RANK},
    {"endpoint", 8, KVB_PH_ENDPOINT},
};

/* The bit of the placeholder NAME (NLEN bytes), 0 when unknown. */
static unsigned lookup(const char *name, size_t nlen)
{
    for (size_t i = 0; i < sizeof(placeholders) / sizeof(placeholders[0]); i++)
        if (placeholders[i].len == nlen && memcmp(placeholders[i].name, name, nlen) == 0)
            return placeholders[i].bit;
    return 0;
}

int kvb_subject_check(const char *tmpl, unsigned allowed, size_t *bad_off, size_t *bad_len)
{
    if (!tmpl)
        return -EINVAL;
    for (const char *p = strchr(tmpl, '{'); p; p = strchr(p + 1, '{')) {
        const char *close = strchr(p, '}');
        /* the name runs to the first '}'; a second '{' before it is no name */
        size_t nlen = close ? (size_t)(close - p - 1) : 0;
        unsigned bit = close && !memchr(p + 1, '{', nlen) ? lookup(p + 1, nlen) : 0;
        if (!(bit & allowed)) {
            if (bad_off)
                *bad_off = (size_t)(p - tmpl);
            if (bad_len)
                *bad_len = close ? (size_t)(close - p) + 1 : strlen(p);
            return -EINVAL;
        }
    }
    return 0;
}

static bool pct_pass(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

/* Append N bytes of S (percent-encoded when PCT) at *len; out NULL only
 * measures.  Keeps room for the NUL. */
static int put(char *out, size_t cap, size_t *len, const char *s, size_t n, bool pct)
{
    static const char hex[] = "0123456789ABCDEF";
    if (!pct) {
        if (n >= cap - *len)
            return -ENAMETOOLONG;
        if (out)
            memcpy(out + *len, s, n);
        *len += n;
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        size_t w = pct_pass(c) ? 1 : 3;
        if (w >= cap - *len)
            return -ENAMETOOLONG;
        if (out) {
            if (w == 1) {
                out[*len] = (char)c;
            } else {
                out[*len] = '%';
                out[*len + 1] = hex[c >> 4];
                out[*len + 2] = hex[c & 15];
            }
        }
        *len += w;
    }
    return 0;
}

/* One pass over the template; out == NULL only measures and validates. */
static int expand(const char *tmpl, const struct kvb_subject_vals *v, bool pct, char *out,
                  size_t cap)
{
    char num[24];
    size_t len = 0;
    const char *p = tmpl;
    int rc;

    if (cap == 0)
        return -ENAMETOOLONG;
    while (*p) {
        const char *open = strchr(p, '{');
        if (!open) {
            rc = put(out, cap, &len, p, strlen(p), false);
            if (rc < 0)
                return rc;
            break;
        }
        rc = put(out, cap, &len, p, (size_t)(open - p), false);
        if (rc < 0)
            return rc;
        const char *close = strchr(open, '}');
        if (!close)
            return -EINVAL;
        const char *val;
        bool text = true;
        switch (lookup(open + 1, (size_t)(close - open - 1))) {
        case KVB_PH_NAMESPACE: val = v->ns; break;
        case KVB_PH_COMPONENT: val = v->component; break;
        case KVB_PH_ENDPOINT: val = v->endpoint ? v->endpoint : ""; break;
        case KVB_PH_WORKER_ID:
            num[kvb_u64_to_dec(num, v->worker_id)] = '\0';
            val = num;
            text = false;
            break;
        case KVB_PH_DP_RANK:
            num[kvb_u64_to_dec(num, v->dp_rank)] = '\0';
            val = num;
            text = false;
            break;
        default: return -EINVAL;
        }
        rc = put(out, cap, &len, val, strlen(val), pct && text);
        if (rc < 0)
            return rc;
        p = close + 1;
    }
    if (len > INT_MAX)
        return -ENAMETOOLONG;
    if (out)
        out[len] = '\0';
    return (int)len;
}

int kvb_subject_expand_vals(const char *tmpl, const struct kvb_subject_vals *v, unsigned flags,
                            char *out, size_t cap)
{
    if (!tmpl || !v || !v->ns || !v->component || (!out && cap))
        return -EINVAL;
    bool pct = flags & KVB_SUBJECT_PCT;
    /* Measure first so that out is written only on success. */
    int rc = expand(tmpl, v, pct, NULL, cap);
    if (rc < 0)
        return rc;
    return expand(tmpl, v, pct, out, cap);
}

int kvb_subject_expand(const char *tmpl, const char *ns, const char *component, uint64_t worker_id,
                       uint32_t dp_rank, char *out, size_t cap)
{
    struct kvb_subject_vals v = {ns, component, "", worker_id, dp_rank};
    return kvb_subject_expand_vals(tmpl, &v, 0, out, cap);
}

int kvb_subject_pct_encode(const char *seg, size_t len, char *out, size_t cap)
{
    size_t n = 0;
    int rc;
    if ((!seg && len) || !out)
        return -EINVAL;
    if (cap == 0)
        return -ENAMETOOLONG;
    if ((rc = put(NULL, cap, &n, seg, len, true)) < 0)
        return rc;
    if (n > INT_MAX)
        return -ENAMETOOLONG;
    n = 0;
    put(out, cap, &n, seg, len, true);
    out[n] = '\0';
    return (int)n;
}

const char *kvb_subject_msg_id(char *buf, uint64_t worker_id, uint64_t dp_rank, uint64_t epoch,
                               uint64_t event_id)
{
    char *p = buf;
    p += kvb_u64_to_dec(p, worker_id);
    *p++ = '.';
    p += kvb_u64_to_dec(p, dp_rank);
    *p++ = '.';
    p += kvb_u64_to_dec(p, epoch);
    *p++ = '.';
    p += kvb_u64_to_dec(p, event_id);
    *p = '\0';
    return buf;
}
