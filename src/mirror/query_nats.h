/* query_nats: the query API over NATS request/reply (src/mirror/query_nats.c has
 * the framing: parts within max_payload, headers Kvb-Status, Kvb-Part,
 * Kvb-Last).  kvb_query_nats_handle() is a kvb_sink_request_fn whose closure
 * is the struct kvb_query hub; it owns and frees the message. */
#ifndef KVB_QUERY_NATS_H
#define KVB_QUERY_NATS_H

void kvb_query_nats_handle(void *closure, void *nats_conn, void *nats_msg);

#endif
