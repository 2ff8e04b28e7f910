/* fetch: see fetch.h. */
#include "fetch.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static size_t on_write(char *ptr, size_t size, size_t nmemb, void *ud)
{
    struct kvb_fetch_body *b = ud;
    size_t n = size * nmemb;
    if (n > b->max - b->len) {
        b->over = true;
        return 0; /* CURLE_WRITE_ERROR: the transfer stops */
    }
    if (b->keep && b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 65536;
        while (cap < b->len + n)
            cap *= 2;
        if (cap > b->max)
            cap = b->max;
        char *d = realloc(b->data, cap);
        if (!d)
            return 0;
        b->data = d;
        b->cap = cap;
    }
    if (b->keep)
        memcpy(b->data + b->len, ptr, n);
    b->len += n;
    return n;
}

int kvb_fetch_errno(CURLcode c, const struct kvb_fetch_body *b)
{
    switch (c) {
    case CURLE_OPERATION_TIMEDOUT: return -ETIMEDOUT;
    case CURLE_COULDNT_CONNECT: return -ECONNREFUSED;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY: return -EHOSTUNREACH;
    case CURLE_FILESIZE_EXCEEDED: return -EFBIG;
    case CURLE_WRITE_ERROR: return b->over ? -EFBIG : -ENOMEM;
    case CURLE_GOT_NOTHING:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE: return -ECONNRESET;
    default: return -EIO;
    }
}

int kvb_fetch_easy(const char *url, uint32_t timeout_ms, struct curl_slist *headers,
                   struct kvb_fetch_body *b, void *priv, CURL **out)
{
    CURL *e = curl_easy_init();
    if (!e)
        return -ENOMEM;
    long to = (long)timeout_ms;
    CURLcode c = CURLE_OK;
#define OPT(o, v)                          \
    do {                                   \
        if (c == CURLE_OK)                 \
            c = curl_easy_setopt(e, o, v); \
    } while (0)
    OPT(CURLOPT_URL, url);
    OPT(CURLOPT_PROTOCOLS_STR, "http,https");
    OPT(CURLOPT_PROXY, ""); /* engines are asked directly, whatever http_proxy says */
    OPT(CURLOPT_NOSIGNAL, 1L);
    OPT(CURLOPT_FOLLOWLOCATION, 0L);
    OPT(CURLOPT_TIMEOUT_MS, to);
    OPT(CURLOPT_CONNECTTIMEOUT_MS, to);
    OPT(CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)b->max);
    OPT(CURLOPT_WRITEFUNCTION, on_write);
    OPT(CURLOPT_WRITEDATA, b);
    OPT(CURLOPT_PRIVATE, priv);
    if (headers)
        OPT(CURLOPT_HTTPHEADER, headers);
    OPT(CURLOPT_USERAGENT, "kvbridge");
#undef OPT
    if (c != CURLE_OK) {
        curl_easy_cleanup(e);
        return -EINVAL;
    }
    *out = e;
    return 0;
}
