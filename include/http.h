/* http: the metrics endpoint (libmicrohttpd, its own thread).
 *
 *   GET /metrics  Prometheus text format (metrics.h)
 *   GET /healthz  200 while the loop turns (heartbeat younger than 3 intervals), else 503
 *   GET /readyz   200 while NATS is connected and every source is set up, else 503
 *   /v1/dump, /v1/events, /v1/match: the query API (query.h, query_http.c)
 *
 * The HTTP thread reads atomics in struct kvb_metrics; for /v1/ it hands the
 * request to the loop through kvb_query_run() (query.h) and never touches the
 * loop's state itself.  Ownership: kvb_http_start() returns a server the
 * caller stops with kvb_http_stop(&h) (accepts NULL) before freeing metrics.
 */
#ifndef KVB_HTTP_H
#define KVB_HTTP_H

#include "metrics.h"

struct kvb_http;

/* Limits against slow clients (kvbridge(8), METRICS): connections at once,
 * at once from one address, seconds a connection may stay silent, and the
 * memory pool of one connection (bytes). */
#define KVB_HTTP_CONN_LIMIT 128
#define KVB_HTTP_PER_IP_LIMIT 32
#define KVB_HTTP_IDLE_TIMEOUT_S 5
#define KVB_HTTP_CONN_MEMORY (16 * 1024)

/* listen: "HOST:PORT" or "[V6]:PORT" (numeric host).  0 or a negative errno
 * (-EINVAL bad address, -EADDRINUSE, ...). */
int kvb_http_start(const char *listen, const struct kvb_metrics *m, const char *version,
                   struct kvb_http **out);
void kvb_http_stop(struct kvb_http **h);

/* Serve /v1/ from q (NULL: 503).  q must outlive the server or be unset
 * first; kvb_query_close() it before kvb_http_stop() so nothing waits. */
struct kvb_query;
void kvb_http_set_query(struct kvb_http *h, struct kvb_query *q);

/* The port actually bound (useful with port 0). */
int kvb_http_port(const struct kvb_http *h);

#endif
