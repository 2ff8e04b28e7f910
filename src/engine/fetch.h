/* fetch: one GET of an engine's HTTP face with libcurl, made the same way
 * for the scraper (scrape.c) and the lists of event sources (srclist.c):
 * http:// and https:// only, no proxy (environment proxies are ignored:
 * engines are asked directly), no redirects, a timeout for the whole
 * request (connect included), the body capped, kept or only counted.
 *
 * Ownership: the caller owns the easy handle (curl_easy_cleanup) and the
 * body's data (free). */
#ifndef KVB_FETCH_H
#define KVB_FETCH_H

#include <curl/curl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvb_fetch_body {
    char *data;
    size_t len, cap, max; /* max: the cap */
    bool keep;            /* store the bytes, or only count them */
    bool over;            /* the cap was hit: the transfer was aborted */
};

/* An easy handle for a GET of URL into B (its len and over reset by the
 * caller before each transfer), with TIMEOUT_MS, HEADERS (may be NULL) and
 * CURLOPT_PRIVATE PRIV.  0, -ENOMEM, or -EINVAL (an option libcurl
 * refused). */
int kvb_fetch_easy(const char *url, uint32_t timeout_ms, struct curl_slist *headers,
                   struct kvb_fetch_body *b, void *priv, CURL **out);

/* A failed transfer's errno: -ETIMEDOUT, -ECONNREFUSED, -EHOSTUNREACH (name
 * or route), -EFBIG (over the cap), -ECONNRESET, -ENOMEM, -EIO (other). */
int kvb_fetch_errno(CURLcode c, const struct kvb_fetch_body *b);

#endif
