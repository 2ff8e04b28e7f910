/* http_query: the /v1/ paths of the metrics listener (src/mirror/query_http.c),
 * called by http.c's handler on libmicrohttpd's thread.  q may be NULL
 * (queries off: 503).  *con_cls holds a POST body between calls;
 * kvb_http_query_completed() frees it (libmicrohttpd's completion callback). */
#ifndef KVB_QUERY_HTTP_H
#define KVB_QUERY_HTTP_H

#include <stddef.h>

#include <microhttpd.h>

struct kvb_query;

enum MHD_Result kvb_http_query(struct MHD_Connection *c, struct kvb_query *q, const char *url,
                               const char *method, const char *upload, size_t *upload_size,
                               void **con_cls);
void kvb_http_query_completed(void **con_cls);

#endif
