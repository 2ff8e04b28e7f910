/* recovery: Dynamo's KV recovery query, answered for each (worker_id,
 * dp_rank) kvbridge publishes for, as a Dynamo worker answers it from its
 * local indexer (docs/dynamo-event-plane.md section 9).
 *
 * A Dynamo router that starts late, restarts, or sees a hole in a pair's
 * event ids asks the pair's recovery_target (the EventSource record's
 * metadata, registered by discovery.h) for its KV state: a
 * WorkerKvQueryRequest in a TwoPart envelope over its request plane
 * (discovery.recovery.request_plane: NATS request/reply on the sink's
 * connection, or Dynamo's TCP request plane on discovery.recovery.listen),
 * acknowledged at once; the answer (the ring's events since the start the
 * router asks for, or a tree dump of the mirror: query.h, op recover) goes
 * back over a TCP connection kvbridge opens to the router (the response
 * plane named in the request: tcp_response_mux_v1, or the call-home
 * tcp_server).  QUIC (DYN_RESPONSE_PLANE=quic) is refused: there is no QUIC
 * library among kvbridge's.
 *
 * The target of a pair is a function of (worker_id, dp_rank), so that a
 * request names its pair without a lookup: NATS subject
 * {namespace}_{component}.kvbridge-{instance:x}.{worker_id}.{dp_rank}, or
 * TCP path {instance:x}/kvbridge/{worker_id}/{dp_rank}; the endpoint of the
 * Instance is worker_kv_query_source_{publisher_id:x}, as Dynamo names it.
 *
 * Threads: the NATS request callback (nats.c's delivery thread) and the TCP
 * request plane's own thread parse requests and queue them (at most
 * RECOVERY_QUEUE; beyond that the router is told "Server overloaded");
 * one worker thread of this module answers them in turn: it asks the loop
 * through the query hub (kvb_query_run(), which waits for the loop's turn)
 * and writes the answer to the router, with timeouts on every wait.
 * Nothing here touches the loop's state.
 *
 * Metrics: recovery_requests_total{result}, recovery_response_bytes_total
 * (atomic adds: several threads); the hub counts queries_total{op="recover"}.
 *
 * Ownership: kvb_recovery_create() returns a server freed with
 * kvb_recovery_destroy(&r) (accepts NULL, sets NULL), which stops its
 * threads; detach it from a sink before destroying that sink.  The config,
 * metrics and hub must outlive it; it copies what it keeps of the config.
 */
#ifndef KVB_RECOVERY_H
#define KVB_RECOVERY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvb_config;
struct kvb_metrics;
struct kvb_query;
struct kvb_sink;
struct kvb_recovery;

enum kvb_recovery_plane { KVB_RECOVERY_NATS, KVB_RECOVERY_TCP };

/* What the discovery records say of the server (copied by discovery). */
struct kvb_recovery_target {
    int plane;            /* enum kvb_recovery_plane */
    uint64_t instance_id; /* the Instance's instance_id (random per start) */
    char namespace_[256]; /* nats.namespace */
    char component[256];  /* nats.component */
    char address[300];    /* TCP: HOST:PORT the routers connect to */
};

/* The transport value of (worker_id, dp_rank): the NATS subject, or
 * HOST:PORT/PATH.  Length, or -ENAMETOOLONG. */
int kvb_recovery_transport(const struct kvb_recovery_target *t, uint64_t worker_id,
                           uint32_t dp_rank, char *out, size_t cap);
/* worker_kv_query_source_{publisher_id:x}.  Length, or -ENAMETOOLONG. */
int kvb_recovery_endpoint(uint64_t publisher_id, char *out, size_t cap);

/* With discovery.recovery.enabled: start the worker (and, for the TCP
 * plane, listen; -EADDRINUSE and the like when it cannot).  0, or a
 * negative errno. */
int kvb_recovery_create(const struct kvb_config *c, struct kvb_metrics *m, struct kvb_query *hub,
                        struct kvb_recovery **out);
void kvb_recovery_destroy(struct kvb_recovery **r);

const struct kvb_recovery_target *kvb_recovery_target(const struct kvb_recovery *r);

/* The NATS plane: serve the subjects on the sink's connection
 * (kvb_sink_serve(); detaching is kvb_sink_unserve(), which the mirror's
 * detach does).  0 (also for the TCP plane: nothing to do) or a negative
 * errno (tried again on the sink's next connection). */
int kvb_recovery_attach(struct kvb_recovery *r, struct kvb_sink *sink);

#endif
