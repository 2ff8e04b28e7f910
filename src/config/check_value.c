/* config check_value: the checks of one value, named by the `.check` of
 * the table's rows (src/config/table.c): ZMQ endpoints, subjects and their
 * placeholders, listen addresses, URLs (src/config/url.c).  Each reports at the value's
 * line:col and returns -1 when the value is bad.  They read no other key
 * (the checks across keys: src/config/check.c).
 */
#include "config_priv.h"
#include "subject.h"
#include "url.h"

#include <errno.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>

int kvb_cfg_check_endpoint(struct ctx *c, const struct opt *o, const char *dpath, const void *field,
                           const struct node *v)
{
    (void)o;
    const char *s = *(char *const *)field;
    static const char *const schemes[] = {"tcp://", "ipc://", "inproc://"};
    for (size_t i = 0; i < 3; i++)
        if (has_prefix(s, schemes[i]) && s[strlen(schemes[i])] != '\0')
            return 0;
    char *sv = kvb_cfg_shown(s, strlen(s));
    err_at(c, v->line, v->col,
           "%s: '%s' is not a ZMQ endpoint (expected tcp://, ipc:// or inproc://...)", dpath,
           SHOWN(sv));
    free(sv);
    return -1;
}

int kvb_cfg_check_opt_endpoint(struct ctx *c, const struct opt *o, const char *dpath,
                               const void *field, const struct node *v)
{
    if (**(char *const *)field == '\0')
        return 0;
    return kvb_cfg_check_endpoint(c, o, dpath, field, v);
}

int kvb_cfg_check_word(struct ctx *c, const struct opt *o, const char *dpath, const void *field,
                       const struct node *v)
{
    (void)o;
    const char *s = *(char *const *)field;
    if (*s == '\0') {
        err_at(c, v->line, v->col, "%s: must not be empty", dpath);
        return -1;
    }
    if (strpbrk(s, " \t\r\n")) {
        err_at(c, v->line, v->col, "%s: must not contain white space", dpath);
        return -1;
    }
    return 0;
}

/* Every '{' of s starts one of the first n placeholders of {namespace}
 * {component} {worker_id} {dp_rank} (subject.h checks); expected lists them
 * for the error. */
static int check_placeholders(struct ctx *c, const char *dpath, const char *s, const struct node *v,
                              size_t n, const char *expected)
{
    static const unsigned bits[] = {KVB_PH_NAMESPACE, KVB_PH_COMPONENT, KVB_PH_WORKER_ID,
                                    KVB_PH_DP_RANK, KVB_PH_ENDPOINT};
    unsigned allowed = 0;
    size_t off = 0, len = 0;
    for (size_t i = 0; i < n && i < sizeof(bits) / sizeof(bits[0]); i++)
        allowed |= bits[i];
    if (kvb_subject_check(s, allowed, &off, &len) == 0)
        return 0;
    char *sv = kvb_cfg_shown(s + off, len);
    err_at(c, v->line, v->col, "%s: unknown placeholder '%s' (expected %s)", dpath, SHOWN(sv),
           expected);
    free(sv);
    return -1;
}

int kvb_cfg_check_subject(struct ctx *c, const struct opt *o, const char *dpath, const void *field,
                          const struct node *v)
{
    if (kvb_cfg_check_word(c, o, dpath, field, v) < 0)
        return -1;
    return check_placeholders(c, dpath, *(char *const *)field, v, 5,
                              "{namespace}, {component}, {endpoint}, {worker_id} or {dp_rank}");
}

/* query.subject: "" (off), or a subject without wildcards nor {dp_rank}. */
int kvb_cfg_check_query_subject(struct ctx *c, const struct opt *o, const char *dpath,
                                const void *field, const struct node *v)
{
    const char *s = *(char *const *)field;
    if (*s == '\0')
        return 0;
    if (kvb_cfg_check_word(c, o, dpath, field, v) < 0)
        return -1;
    if (strpbrk(s, "*>")) {
        err_at(c, v->line, v->col, "%s: must not contain the wildcards '*' or '>'", dpath);
        return -1;
    }
    return check_placeholders(c, dpath, s, v, 3, "{namespace}, {component} or {worker_id}");
}

int kvb_cfg_check_format(struct ctx *c, const struct opt *o, const char *dpath, const void *field,
                         const struct node *v)
{
    (void)c, (void)o, (void)dpath, (void)field, (void)v;
    return 0; /* every value; the combinations: check_publish() */
}

/* S is an http:// or https:// URL with a host: 1; 0 when not; -1 out of
 * memory (reported). */
static int is_http_url(struct ctx *c, const char *s)
{
    struct kvb_url u;
    int rc = kvb_url_parse(s, NULL, &u, NULL);
    if (rc == -ENOMEM) {
        oom(c);
        return -1;
    }
    bool ok = rc == 0 && (strcmp(u.scheme, "http") == 0 || strcmp(u.scheme, "https") == 0);
    kvb_url_free(&u);
    return ok;
}

/* An etcd gateway URL: http:// or https:// and a host. */
int kvb_cfg_check_etcd_url(struct ctx *c, const struct opt *o, const char *dpath, const void *field,
                           const struct node *v)
{
    const char *s = *(char *const *)field;
    if (kvb_cfg_check_word(c, o, dpath, field, v) < 0)
        return -1;
    int ok = is_http_url(c, s);
    if (ok)
        return ok > 0 ? 0 : -1;
    char *sv = kvb_cfg_shown(s, strlen(s));
    err_at(c, v->line, v->col,
           "%s: '%s' is not an etcd URL (expected http://HOST:PORT or "
           "https://HOST:PORT)",
           dpath, SHOWN(sv));
    free(sv);
    return -1;
}

/* HOST:PORT as src/ops/http.c binds it: HOST a numeric IPv4 or IPv6 address
 * (in brackets, or bare), PORT 1..65535.  NULL when good, else why not. */
static const char *bad_listen(const char *s)
{
    char host[128];
    const char *hs = s, *he = strrchr(s, ':');
    if (s[0] == '[') {
        const char *e = strchr(s, ']');
        if (!e || e[1] != ':')
            return "a bracketed IPv6 address needs ]:PORT after it";
        hs = s + 1;
        he = e;
    }
    long port = kvb_cfg_port_of(s);
    if (port == 0)
        return "port 0 is not a port to scrape (expected 1..65535)";
    if ((size_t)(he - hs) >= sizeof host)
        return "the host is too long";
    memcpy(host, hs, (size_t)(he - hs));
    host[he - hs] = '\0';
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV,
                             .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    int r = getaddrinfo(host, "1", &hints, &ai);
    if (ai)
        freeaddrinfo(ai);
    return r == 0 ? NULL : "the host must be a numeric IPv4 or IPv6 address";
}

int kvb_cfg_check_listen(struct ctx *c, const struct opt *o, const char *dpath, const void *field,
                         const struct node *v)
{
    (void)o;
    const char *s = *(char *const *)field, *why = NULL;
    if (*s == '\0')
        return 0;
    const char *colon = strrchr(s, ':');
    if (colon && colon != s && kvb_cfg_port_of(s) >= 0 && !strpbrk(s, " \t\r\n") &&
        !(why = bad_listen(s)))
        return 0;
    char *sv = kvb_cfg_shown(s, strlen(s));
    if (why)
        err_at(c, v->line, v->col, "%s: '%s': %s", dpath, SHOWN(sv), why);
    else
        err_at(c, v->line, v->col, "%s: '%s' is not HOST:PORT (or \"\" to disable)", dpath,
               SHOWN(sv));
    free(sv);
    return -1;
}

/* nats.servers[i]: [SCHEME://][USER[:PASSWORD]@]HOST[:PORT][/...] (no
 * scheme: nats://, as nats.c reads it), PORT 1..65535 when given.  The URL
 * may hold a password or token: it is never quoted. */
int kvb_cfg_check_server_url(struct ctx *c, const struct opt *o, const char *dpath,
                             const void *field, const struct node *v)
{
    (void)o;
    struct kvb_url u;
    const char *why = NULL;
    int rc = kvb_url_parse(*(char *const *)field, "nats", &u, &why);
    kvb_url_free(&u);
    if (rc == -ENOMEM)
        oom(c);
    else if (rc < 0)
        err_at(c, v->line, v->col, "%s: %s", dpath, why);
    return rc < 0 ? -1 : 0;
}

/* sources[].engine URLs: "" or an http:// / https:// URL with a host (the
 * scraper uses libcurl). */
int kvb_cfg_check_http_url(struct ctx *c, const struct opt *o, const char *dpath, const void *field,
                           const struct node *v)
{
    (void)o;
    const char *s = *(char *const *)field;
    if (*s == '\0')
        return 0;
    int ok = is_http_url(c, s);
    if (ok)
        return ok > 0 ? 0 : -1;
    char *sv = kvb_cfg_shown(s, strlen(s));
    err_at(c, v->line, v->col, "%s: '%s' is not an http:// or https:// URL (or \"\" for none)",
           dpath, SHOWN(sv));
    free(sv);
    return -1;
}

int kvb_cfg_check_host(struct ctx *c, const struct opt *o, const char *dpath, const void *field,
                       const struct node *v)
{
    (void)o;
    const char *s = *(char *const *)field;
    if (!strpbrk(s, " \t\r\n/"))
        return 0;
    err_at(c, v->line, v->col, "%s: must be a host name (no white space or '/')", dpath);
    return -1;
}

/* nats.jetstream.stream and .subject: "" or text without white space whose
 * placeholders are {namespace}, {component} or {worker_id}. */
int kvb_cfg_check_js_template(struct ctx *c, const struct opt *o, const char *dpath,
                              const void *field, const struct node *v)
{
    const char *s = *(char *const *)field;
    (void)o;
    if (strpbrk(s, " \t\r\n")) {
        err_at(c, v->line, v->col, "%s: must not contain white space", dpath);
        return -1;
    }
    return check_placeholders(c, dpath, s, v, 3, "{namespace}, {component} or {worker_id}");
}
