/* url: URLs through libcurl's CURLU (include/url.h). */
#include "url.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

/* What libcurl refused, as the end of a config message. */
static const char *why_of(CURLUcode rc)
{
    switch (rc) {
    case CURLUE_BAD_PORT_NUMBER: return "the port is not a number in 1..65535";
    case CURLUE_BAD_IPV6: return "the IPv6 address in brackets is not valid";
    case CURLUE_NO_HOST: return "there is no host";
    case CURLUE_BAD_HOSTNAME: return "the host is not a host name or an IP address";
    case CURLUE_BAD_LOGIN:
    case CURLUE_BAD_USER:
    case CURLUE_BAD_PASSWORD: return "the user information (before '@') is not valid";
    case CURLUE_MALFORMED_INPUT: return "it holds white space or control characters";
    case CURLUE_BAD_PATH:
    case CURLUE_BAD_QUERY:
    case CURLUE_BAD_FRAGMENT:
        return "the part after the host holds white space or control characters";
    case CURLUE_BAD_SCHEME:
    case CURLUE_BAD_SLASHES: return "it is not SCHEME://HOST...";
    default: return curl_url_strerror(rc);
    }
}

/* A CURLU of TEXT (see kvb_url_parse()): 0 and *out, or -EINVAL (*why) or
 * -ENOMEM. */
static int parse_handle(const char *text, const char *default_scheme, CURLU **out, const char **why)
{
    *why = "it is not a URL";
    if (!text)
        return -EINVAL;
    CURLU *u = curl_url();
    if (!u)
        return -ENOMEM;
    CURLUcode rc = curl_url_set(u, CURLUPART_URL, text, CURLU_NON_SUPPORT_SCHEME);
    /* no scheme ("host"), or "host:port" and "user:pass@host" read as one */
    if ((rc == CURLUE_BAD_SCHEME || rc == CURLUE_BAD_SLASHES) && default_scheme) {
        rc = curl_url_set(u, CURLUPART_URL, text, CURLU_NON_SUPPORT_SCHEME | CURLU_DEFAULT_SCHEME);
        if (rc == CURLUE_OK)
            rc = curl_url_set(u, CURLUPART_SCHEME, default_scheme, CURLU_NON_SUPPORT_SCHEME);
    }
    char *port = NULL;
    if (rc == CURLUE_OK && curl_url_get(u, CURLUPART_PORT, &port, 0) == CURLUE_OK &&
        strtoul(port, NULL, 10) == 0)
        rc = CURLUE_BAD_PORT_NUMBER;
    curl_free(port);
    if (rc != CURLUE_OK) {
        curl_url_cleanup(u);
        if (rc == CURLUE_OUT_OF_MEMORY)
            return -ENOMEM;
        *why = why_of(rc);
        return -EINVAL;
    }
    *out = u;
    return 0;
}

/* Part P of U into *out (malloc'd), or NULL when U has none.  0 or -ENOMEM. */
static int get_part(CURLU *u, CURLUPart p, char **out)
{
    char *v = NULL;
    CURLUcode rc = curl_url_get(u, p, &v, 0);
    *out = NULL;
    if (rc == CURLUE_OUT_OF_MEMORY)
        return -ENOMEM;
    if (rc != CURLUE_OK || !v)
        return 0;
    *out = strdup(v);
    if (p == CURLUPART_USER || p == CURLUPART_PASSWORD)
        memset(v, 0, strlen(v));
    curl_free(v);
    return *out ? 0 : -ENOMEM;
}

static void str_free(char **s, bool secret)
{
    if (*s && secret)
        memset(*s, 0, strlen(*s));
    free(*s);
    *s = NULL;
}

void kvb_url_free(struct kvb_url *u)
{
    if (!u)
        return;
    str_free(&u->scheme, false);
    str_free(&u->user, true);
    str_free(&u->password, true);
    str_free(&u->host, false);
    str_free(&u->path, false);
    str_free(&u->query, false);
    str_free(&u->fragment, false);
    u->port = 0;
}

int kvb_url_parse(const char *text, const char *default_scheme, struct kvb_url *out,
                  const char **why)
{
    const char *w = NULL;
    CURLU *u = NULL;
    memset(out, 0, sizeof(*out));
    int rc = parse_handle(text, default_scheme, &u, &w);
    if (why)
        *why = w;
    if (rc < 0)
        return rc;
    char *port = NULL;
    if (get_part(u, CURLUPART_SCHEME, &out->scheme) < 0 ||
        get_part(u, CURLUPART_USER, &out->user) < 0 ||
        get_part(u, CURLUPART_PASSWORD, &out->password) < 0 ||
        get_part(u, CURLUPART_HOST, &out->host) < 0 || get_part(u, CURLUPART_PORT, &port) < 0 ||
        get_part(u, CURLUPART_PATH, &out->path) < 0 ||
        get_part(u, CURLUPART_QUERY, &out->query) < 0 ||
        get_part(u, CURLUPART_FRAGMENT, &out->fragment) < 0 || !out->scheme || !out->host ||
        !out->path) {
        rc = -ENOMEM; /* curl gives every one of those three for a URL it took */
        kvb_url_free(out);
    } else {
        out->port = port ? (uint16_t)strtoul(port, NULL, 10) : 0;
    }
    free(port);
    curl_url_cleanup(u);
    return rc;
}

char *kvb_url_redacted(const char *text, const char *default_scheme, const char *mask)
{
    CURLU *u = NULL;
    const char *why;
    int rc = parse_handle(text, default_scheme, &u, &why);
    if (rc < 0)
        return rc == -ENOMEM ? NULL : strdup(mask);
    char *user = NULL, *pw = NULL, *url = NULL, *path = NULL, *query = NULL, *frag = NULL, *out;
    bool secret = curl_url_get(u, CURLUPART_USER, &user, 0) == CURLUE_OK ||
                  curl_url_get(u, CURLUPART_PASSWORD, &pw, 0) == CURLUE_OK;
    if (user)
        memset(user, 0, strlen(user));
    if (pw)
        memset(pw, 0, strlen(pw));
    curl_free(user);
    curl_free(pw);
    if (!secret) {
        curl_url_cleanup(u);
        return strdup(text);
    }
    if (curl_url_set(u, CURLUPART_PASSWORD, NULL, 0) != CURLUE_OK ||
        curl_url_set(u, CURLUPART_USER, mask, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_URL, &url, 0) != CURLUE_OK) {
        curl_url_cleanup(u);
        curl_free(url);
        return strdup(mask);
    }
    /* curl writes the root path as "/": a server URL written without one
     * keeps looking like it */
    size_t n = strlen(url);
    bool root = curl_url_get(u, CURLUPART_PATH, &path, 0) == CURLUE_OK && strcmp(path, "/") == 0 &&
                curl_url_get(u, CURLUPART_QUERY, &query, 0) != CURLUE_OK &&
                curl_url_get(u, CURLUPART_FRAGMENT, &frag, 0) != CURLUE_OK;
    if (root && n && url[n - 1] == '/')
        url[--n] = '\0';
    out = strdup(url);
    curl_free(path);
    curl_free(query);
    curl_free(frag);
    curl_free(url);
    curl_url_cleanup(u);
    return out;
}
