/* discovery: EventSource records in Dynamo's etcd discovery
 * (docs/dynamo-event-plane.md section 5), so that the newest routers apply
 * kvbridge's event-plane messages.
 *
 * For each (worker_id, dp_rank) the caller adds, one record
 *   v1/event_sources/namespace/{ns}/component/{comp}/endpoint/{ep}/topic/kv-events/{publisher_id hex}
 * (segments percent-encoded as in subjects) holding the EventSource JSON, put
 * create-if-absent under one lease of discovery.etcd.lease_ttl_s seconds.
 * etcd is reached through its v3 JSON gateway (/v3/lease/grant, /v3/kv/txn,
 * /v3/lease/keepalive, /v3/lease/revoke) with libcurl; JSON is built and read
 * with json-c, keys and values base64-encoded with OpenSSL.
 *
 * Threads: the module runs one thread of its own that does every etcd
 * request (never the loop thread): it grants the lease, puts the records,
 * keeps the lease alive every third of its TTL, and when the lease is lost
 * (etcd away longer than the TTL, or it forgot the lease) grants a new one
 * and puts every record again, retrying with backoff (100 ms doubling to
 * 5 s) while etcd does not answer.  It signals a change of the registered
 * set by writing to wake_fd.  kvb_discovery_add() and
 * kvb_discovery_destroy() are for the owner (the loop thread);
 * kvb_discovery_registered() and kvb_discovery_all_registered() for any
 * thread.
 *
 * Metrics: the thread writes discovery_registered_pairs,
 * discovery_etcd_errors_total and discovery_registrations_total.
 *
 * Ownership: kvb_discovery_create() returns a handle freed with
 * kvb_discovery_destroy(&d) (accepts NULL, sets NULL), which revokes the
 * lease (a clean stop removes the records at once) and joins the thread.
 * The config and metrics must outlive the handle; it copies what it needs.
 */
#ifndef KVB_DISCOVERY_H
#define KVB_DISCOVERY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvb_config;
struct kvb_metrics;
struct kvb_discovery;

#define KVB_DISCOVERY_MAX_PAIRS 4096

/* Start the thread (it connects in the background: etcd may be away).
 * rt (copied; NULL: none): the recovery endpoint every pair gets (recovery.h,
 * docs/dynamo-event-plane.md section 9): its Instance record
 *   v1/instances/{ns}/{comp}/worker_kv_query_source_{publisher_id:x}/{instance_id:x}
 * is put before the pair's EventSource record, which names the same
 * Instance as metadata.recovery_target.
 * 0, -EINVAL (no etcd endpoint configured), -ENOMEM, or a pthread error. */
struct kvb_recovery_target;
int kvb_discovery_create(const struct kvb_config *cfg, struct kvb_metrics *m, int wake_fd,
                         const struct kvb_recovery_target *rt, struct kvb_discovery **out);

/* Stop and free: waits for a request in flight (at most 3 s), then revokes
 * the lease (at most 2 s more). */
void kvb_discovery_destroy(struct kvb_discovery **d);

/* Register (worker_id, dp_rank) with publisher_id, in the background.
 * 0 (also when the pair is known: its first publisher_id stays), -ENOSPC. */
int kvb_discovery_add(struct kvb_discovery *d, uint64_t worker_id, uint32_t dp_rank,
                      uint64_t publisher_id);

/* The pair's record exists (put under the current lease, which is alive). */
bool kvb_discovery_registered(struct kvb_discovery *d, uint64_t worker_id, uint32_t dp_rank);
/* Every pair added so far is registered (false while none is). */
bool kvb_discovery_all_registered(struct kvb_discovery *d);

/* Pure helpers, exposed for tests. */
/* The record's key into OUT (CAP bytes).  Length, or -ENAMETOOLONG. */
int kvb_discovery_key(const char *ns, const char *comp, const char *ep, uint64_t publisher_id,
                      char *out, size_t cap);
/* The record's JSON (malloc'd; the caller frees), or NULL when out of memory;
 * _rt: with metadata.recovery_target (rt NULL: without). */
char *kvb_discovery_value(const char *ns, const char *comp, const char *ep, uint64_t publisher_id,
                          uint64_t worker_id, uint32_t dp_rank);
char *kvb_discovery_value_rt(const char *ns, const char *comp, const char *ep,
                             uint64_t publisher_id, uint64_t worker_id, uint32_t dp_rank,
                             const struct kvb_recovery_target *rt);
/* The recovery endpoint's Instance record: its key (length, or
 * -ENAMETOOLONG) and its JSON (malloc'd, or NULL). */
int kvb_discovery_instance_key(const struct kvb_recovery_target *rt, uint64_t publisher_id,
                               char *out, size_t cap);
char *kvb_discovery_instance_value(const struct kvb_recovery_target *rt, uint64_t publisher_id,
                                   uint64_t worker_id, uint32_t dp_rank);

#endif
