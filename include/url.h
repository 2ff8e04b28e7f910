/* url: the URLs of the configuration, parsed by libcurl's URL API (CURLU):
 * NATS servers (nats://, tls://, or no scheme at all, to which nats.c adds
 * nats://), the engines' metrics and health URLs, etcd endpoints.  One
 * parser for the config checks, --check -v, the sink's log lines and its
 * guard, so that they all read a URL the same way.
 *
 * libcurl decides what a URL is: a scheme of its own or not (any scheme is
 * taken: CURLU_NON_SUPPORT_SCHEME), user information up to the first '@'
 * of the authority, a host name (characters it allows), an IPv4 address or
 * an IPv6 address in brackets, a decimal port up to 65535; no white space
 * or control characters.  On top of it: port 0 is refused (no URL of ours
 * can connect to it).
 *
 * Ownership: kvb_url_parse() fills a struct kvb_url with malloc'd strings;
 * kvb_url_free() frees them (user and password zeroed first) and may be
 * called again, or on a zeroed struct.  kvb_url_redacted() returns a
 * malloc'd string the caller frees.  Thread-safe (no state).
 */
#ifndef KVB_URL_H
#define KVB_URL_H

#include <stdint.h>

struct kvb_url {
    char *scheme;   /* lower case; the default scheme when the text has none */
    char *user;     /* NULL when absent ("" for "nats://@h"); as written, not
                     * percent-decoded (nats.c sends it as written) */
    char *password; /* NULL when absent; as written */
    char *host;     /* an IPv6 address in brackets; "" never (refused) */
    uint16_t port;  /* 0: none given */
    char *path;     /* "/" when none */
    char *query;    /* NULL when absent */
    char *fragment; /* NULL when absent */
};

/* Parse TEXT.  Without a scheme of its own ("localhost:4222", "u:p@h") it is
 * read as DEFAULT_SCHEME://TEXT, or refused when DEFAULT_SCHEME is NULL.
 * 0; -EINVAL with *why (when WHY is not NULL) a static phrase to follow
 * "KEY: " in a message ("the port is not a number in 1..65535"), never
 * quoting TEXT (it may hold a password); -ENOMEM.  *out is zeroed first and
 * holds nothing to free after a failure. */
int kvb_url_parse(const char *text, const char *default_scheme, struct kvb_url *out,
                  const char **why);
void kvb_url_free(struct kvb_url *u);

/* TEXT fit for a log line or --check -v: a copy of TEXT when it has no user
 * information, else the URL with its user information (user and password,
 * or a token) replaced by MASK ("nats://MASK@h:4222"); MASK alone when TEXT
 * does not parse.  NULL when out of memory. */
char *kvb_url_redacted(const char *text, const char *default_scheme, const char *mask);

#endif
