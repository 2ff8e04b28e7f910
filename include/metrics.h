/* metrics: every counter kvbridge keeps, defined once (docs/design.md rule 10).
 *
 * KVB_METRICS is the one list: (kind, name, label, values, help).  Each row is a
 * family; a family with a label has one series per value of its value list,
 * indexed by the matching enum (KVB_DROP_NON_MAIN_GROUP, ...).  The exposition
 * (Prometheus text), the man page and the Grafana board all come from it.
 *
 * Writers: only the loop thread (and the pure stages it calls, through a
 * pointer it hands them).  Readers: any thread (HTTP).  Values are _Atomic and
 * written with relaxed single-writer increments (kvb_inc): plain loads and
 * stores on x86-64, no locked instructions, no locks.
 *
 * Ownership: struct kvb_metrics is a plain struct embedded in (or allocated
 * by) its owner; nothing in it needs freeing.
 */
#ifndef KVB_METRICS_H
#define KVB_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* Label value lists.  X(enum_suffix, "label value") */
/* clang-format off */
#define KVB_EVENT_TYPES(X)                                                     \
    X(STORED, "stored") X(REMOVED, "removed") X(CLEARED, "cleared")            \
    X(TIER_CLEARED, "tier_cleared") X(IGNORED, "ignored")                      \
    X(UNKNOWN, "unknown") X(MALFORMED, "malformed")

#define KVB_REV_TYPES(X) X(STORED, "stored") X(REMOVED, "removed") X(CLEARED, "cleared")

/* docs/router-events.md section 4: reasons an engine event publishes
 * nothing.  The rows from ignored_event to unlearned_group_idx carry the
 * label Dynamo's relay gives the same decision (zmq_wire/mod.rs,
 * ZmqEventFilterReason). */
#define KVB_DROP_REASONS(X)                                                    \
    X(IGNORED_EVENT, "ignored_event")                                          \
    X(UNSUPPORTED_OWNERSHIP, "unsupported_ownership")                          \
    X(UNKNOWN_OWNERSHIP, "unknown_ownership")                                  \
    X(NON_LOCAL_LOCALITY, "non_local_locality")                                \
    X(UNKNOWN_MEDIUM, "unknown_medium")                                        \
    X(AMBIGUOUS_SCOPED_CLEAR, "ambiguous_scoped_clear")                        \
    X(NON_MAIN_ATTENTION_KIND, "non_main_attention_kind")                      \
    X(UNKNOWN_KIND, "unknown_kind")                                            \
    X(NON_MAIN_ATTENTION_GROUP, "non_main_attention_group")                    \
    X(UNLEARNED_GROUP_IDX, "unlearned_group_idx")                              \
    X(AMBIGUOUS_CACHE_NAMESPACE, "ambiguous_cache_namespace")                  \
    X(DUPLICATE_HASH, "duplicate_hash")                                        \
    X(RESIDENT_REPEAT, "resident_repeat")                                      \
    X(COPIES_REMAIN, "copies_remain")                                          \
    X(TIER_FILTERED, "tier_filtered")                                          \
    X(BLOCK_SIZE_MISMATCH, "block_size_mismatch")                              \
    X(UNSUPPORTED_TOKENS, "unsupported_tokens")                                \
    X(NO_COMPLETE_BLOCK, "no_complete_block")                                  \
    X(EMPTY_REMOVE, "empty_remove")                                            \
    X(UNKNOWN_EVENT_TYPE, "unknown_event_type")                                \
    X(MALFORMED_EVENT, "malformed_event")

/* Why a BlockStored went out without the LoRA salt its adapter needs. */
#define KVB_UNSALTED_REASONS(X) X(UNMAPPED_LORA_ID, "unmapped_lora_id")

/* Why an engine's list of its event sources (sources[].discover) was not
 * read: no answer, a status other than 200, a body that is no such list. */
#define KVB_LIST_FAILURES(X)                                                   \
    X(UNREACHABLE, "unreachable") X(STATUS, "status") X(BODY, "body")

/* Messages that could not be used at all, by kind. */
#define KVB_MALFORMED_KINDS(X)                                                 \
    X(FRAMES, "frames") X(SEQ_FRAME, "seq_frame") X(BATCH, "malformed_batch")  \
    X(REPLAY_REPLY, "replay_reply") X(OVERSIZE, "oversize")                   \
    X(UNKNOWN_TOPIC, "unknown_topic")

/* docs/router-events.md section 6: why a "cleared" barrier was published. */
#define KVB_BARRIER_CAUSES(X)                                                  \
    X(START, "start") X(GAP, "gap") X(RESTART, "restart")                      \
    X(MALFORMED, "malformed_batch") X(NATS_LOST, "nats_lost")                 \
    X(MIRROR_FULL, "mirror_full") X(ENGINE_GONE, "engine_gone")              \
    X(NATS_RECONNECT, "nats_reconnect") X(TRACKER_FULL, "tracker_full")

/* docs/router-events.md section 6, "Repairs": why a pair was repaired. */
#define KVB_REPAIR_CAUSES(X)                                                   \
    X(NATS_LOST, "nats_lost") X(NATS_RECONNECT, "nats_reconnect")

#define KVB_TIERS(X)                                                           \
    X(DEVICE, "device") X(HOST_PINNED, "host_pinned") X(DISK, "disk")          \
    X(EXTERNAL, "external")

/* Why a JetStream publish got no positive acknowledgement. */
#define KVB_JS_ACK_FAILURES(X)                                                 \
    X(TIMEOUT, "timeout") X(NO_RESPONDERS, "no_responders")                    \
    X(UNAVAILABLE, "unavailable") X(REFUSED, "refused")

/* Query operations (query.h); "invalid": requests refused before the loop. */
#define KVB_QUERY_OPS(X)                                                       \
    X(DUMP, "dump") X(EVENTS, "events") X(MATCH, "match")                      \
    X(RECOVER, "recover") X(INVALID, "invalid")
/* nats.format values, as label values. */
#define KVB_FORMATS(X)                                                         \
    X(DYNAMO_JSON, "dynamo-json") X(DYNAMO_MSGPACK, "dynamo-msgpack") X(RAW, "raw")

/* docs/dynamo-event-plane.md section 9: how a recovery query ended. */
#define KVB_RECOVERY_RESULTS(X)                                                \
    X(EVENTS, "events") X(TREE_DUMP, "tree_dump") X(TOO_NEW, "too_new")        \
    X(INVALID_RANGE, "invalid_range") X(ERROR, "error")                        \
    X(TREE_DUMP_FAILED, "tree_dump_failed") X(REFUSED, "refused")              \
    X(OVERLOADED, "overloaded") X(UNDELIVERED, "undelivered")

#define KVB_NO_LABEL(X) X(ALL, "")

/* kind, name, label name, value list, help */
#define KVB_METRICS(X)                                                         \
    X(counter, batches_received_total, "", KVB_NO_LABEL,                       \
      "Engine batches decoded and applied (live or replayed)")                            \
    X(counter, events_received_total, "type", KVB_EVENT_TYPES,                 \
      "Engine events decoded, by type")                                        \
    X(counter, router_events_published_total, "type", KVB_REV_TYPES,           \
      "Router events handed to the sink, by type")                             \
    X(counter, events_dropped_total, "reason", KVB_DROP_REASONS,               \
      "Engine events that published nothing, by reason")                       \
    X(counter, stores_unsalted_total, "reason", KVB_UNSALTED_REASONS,          \
      "BlockStored events of a LoRA published without its salt, by reason")    \
    X(counter, unknown_medium_total, "", KVB_NO_LABEL,                         \
      "Events whose medium was not recognised (dropped: unknown_medium)")      \
    X(counter, blocks_held_total, "", KVB_NO_LABEL,                            \
      "Removed block hashes held back: another copy (KV cache group) is still resident") \
    X(counter, blocks_repeated_total, "", KVB_NO_LABEL,                        \
      "Stored blocks already resident in their group (report mode full): no new copy, not republished") \
    X(gauge, tracked_blocks, "", KVB_NO_LABEL,                                 \
      "Entries the pipeline's block tracker holds (copies and cache namespaces)") \
    X(counter, tracker_overflows_total, "", KVB_NO_LABEL,                      \
      "Times the block tracker was full (limits.max_tracked_blocks): the pair got a barrier") \
    X(counter, malformed_messages_total, "kind", KVB_MALFORMED_KINDS,          \
      "Messages that could not be used, by kind")                              \
    X(counter, curve_clients_rejected_total, "", KVB_NO_LABEL,                 \
      "CURVE clients refused by a bind-mode source's allowed_clients_file")    \
    X(counter, barriers_total, "cause", KVB_BARRIER_CAUSES,                    \
      "\"cleared\" barriers published, by cause (one per dp_rank)")            \
    X(counter, barriers_redundant_total, "", KVB_NO_LABEL,                     \
      "Barriers not published: nothing was published for the pair since its last one") \
    X(counter, peers_refused_total, "", KVB_NO_LABEL,                          \
      "Bind mode: engine connections closed beyond sources[].max_peers")       \
    X(counter, streams_expired_total, "", KVB_NO_LABEL,                        \
      "Idle streams (topics) forgotten to make room for a new one (64 per source)") \
    X(counter, seq_gaps_total, "", KVB_NO_LABEL,                               \
      "Sequence gaps seen on engine streams")                                  \
    X(counter, source_list_reads_total, "", KVB_NO_LABEL,                      \
      "Engine source lists (sources[].discover) read")                         \
    X(counter, source_list_failures_total, "reason", KVB_LIST_FAILURES,        \
      "Engine source lists that could not be read, by reason")                 \
    X(gauge, source_lists_unread, "", KVB_NO_LABEL,                            \
      "Sources with discover whose engine's list has not been read yet")       \
    X(counter, source_endpoint_changes_total, "", KVB_NO_LABEL,                \
      "Ranks whose listed endpoint changed or went: their source replaced")    \
    X(counter, engine_restarts_total, "", KVB_NO_LABEL,                        \
      "Engine restarts detected (sequence went back)")                         \
    X(counter, replays_requested_total, "", KVB_NO_LABEL,                      \
      "Replay requests sent to engines")                                       \
    X(counter, replays_filled_total, "", KVB_NO_LABEL,                         \
      "Replays that filled their gap completely")                              \
    X(counter, replays_failed_total, "", KVB_NO_LABEL,                         \
      "Replays that could not fill their gap (barrier published)")             \
    X(counter, nats_reconnects_total, "", KVB_NO_LABEL,                        \
      "Reconnections to NATS")                                                 \
    X(counter, nats_disconnects_total, "", KVB_NO_LABEL,                       \
      "Disconnections from NATS")                                              \
    X(counter, nats_connect_stalls_total, "", KVB_NO_LABEL,                    \
      "NATS connection attempts abandoned: no handshake answer in time")       \
    X(counter, nats_publish_errors_total, "", KVB_NO_LABEL,                    \
      "Publishes refused by the NATS client (buffer full, closed)")            \
    X(gauge, nats_connected, "", KVB_NO_LABEL,                                 \
      "1 while connected to a NATS server")                                    \
    X(gauge, nats_pending_bytes, "", KVB_NO_LABEL,                             \
      "Bytes buffered in the NATS client, not yet written")                    \
    X(counter, backpressure_pauses_total, "", KVB_NO_LABEL,                    \
      "Times reading the engines paused because NATS could not keep up")       \
    X(gauge, reading_paused, "", KVB_NO_LABEL,                                 \
      "1 while reading is paused (NATS buffer above 3/4 of its limit)")        \
    X(gauge, ready, "", KVB_NO_LABEL,                                          \
      "1 while NATS is connected and takes router events, every source is set up, no engine is gone, no replay holds the live stream back and state.dir saves (/readyz)") \
    X(gauge, live_held_batches, "", KVB_NO_LABEL,                              \
      "Live batches held back while a replay runs (all sources)")              \
    X(counter, state_saves_total, "", KVB_NO_LABEL,                            \
      "Saves of state.dir (cursors, and the mirror when it persists) that succeeded") \
    X(counter, state_save_failures_total, "", KVB_NO_LABEL,                    \
      "Saves of state.dir that failed (the older file stays; retried every second)") \
    X(gauge, state_save_failing, "", KVB_NO_LABEL,                             \
      "1 while the last save of state.dir failed (/readyz answers 503)")       \
    X(counter, engine_scrapes_total, "", KVB_NO_LABEL,                         \
      "Rounds of engine metrics/health scrapes finished")                      \
    X(counter, engine_scrape_failures_total, "", KVB_NO_LABEL,                 \
      "Scrape rounds in which neither the metrics nor the health URL answered") \
    X(counter, engine_gone_total, "", KVB_NO_LABEL,                            \
      "Engines judged gone: endpoints failing and no batch for dead_after_ms") \
    X(gauge, engines_gone, "", KVB_NO_LABEL,                                   \
      "Engines judged gone now (/readyz answers 503 while it is not 0)")       \
    X(counter, load_messages_published_total, "", KVB_NO_LABEL,                \
      "ActiveLoad messages published on the kv_metrics subject")               \
    X(counter, jetstream_acks_total, "", KVB_NO_LABEL,                         \
      "JetStream publishes acknowledged (stored, or known as duplicates)")     \
    X(counter, jetstream_duplicates_total, "", KVB_NO_LABEL,                   \
      "Acknowledged publishes the stream already held (same Nats-Msg-Id)")     \
    X(counter, jetstream_ack_failures_total, "reason", KVB_JS_ACK_FAILURES,    \
      "JetStream publishes without a positive acknowledgement, by reason")     \
    X(counter, jetstream_resends_total, "", KVB_NO_LABEL,                      \
      "JetStream publishes sent again (same Nats-Msg-Id)")                     \
    X(counter, jetstream_publish_errors_total, "", KVB_NO_LABEL,               \
      "Router events the stream refused, or that would land out of order; "   \
      "not sent again (a barrier follows)")                                    \
    X(gauge, jetstream_pending, "", KVB_NO_LABEL,                              \
      "JetStream publishes not yet acknowledged (in flight or to be resent)")  \
    X(gauge, jetstream_stalled, "", KVB_NO_LABEL,                              \
      "1 while JetStream stores none of our publishes (no stream leader, timeouts): resending") \
    X(counter, jetstream_stalls_total, "", KVB_NO_LABEL,                       \
      "Times JetStream stopped storing our publishes (each ends at the next positive ack)") \
    X(gauge, mirror_resident_blocks, "tier", KVB_TIERS,                        \
      "Blocks the residency mirror holds, by tier")                            \
    X(gauge, mirror_bytes, "", KVB_NO_LABEL,                                   \
      "Memory held by the residency mirror and its recent-events rings")       \
    X(counter, mirror_overflows_total, "", KVB_NO_LABEL,                       \
      "Stores refused past limits.max_resident_blocks (a barrier follows)")    \
    X(counter, mirror_orphans_total, "", KVB_NO_LABEL,                         \
      "Stores the mirror dropped for an unknown parent, as an indexer does")   \
    X(counter, repairs_total, "cause", KVB_REPAIR_CAUSES,                      \
      "Pairs repaired from the residency mirror after a loss on the NATS side (a \"cleared\", then the resident blocks), by cause") \
    X(counter, repaired_blocks_total, "", KVB_NO_LABEL,                        \
      "Resident blocks published again by repairs")                            \
    X(gauge, repair_missing_blocks, "", KVB_NO_LABEL,                          \
      "Resident blocks that repairs have yet to publish (the consumers lack them)") \
    X(counter, queries_total, "op", KVB_QUERY_OPS,                             \
      "Queries answered (HTTP and NATS), by operation")                        \
    X(counter, query_bytes_total, "op", KVB_QUERY_OPS,                         \
      "Bytes of query answers handed to the transport, by operation")          \
    X(counter, messages_published_total, "format", KVB_FORMATS,                \
      "NATS messages handed to the sink, by nats.format")                      \
    X(counter, output_held_dropped_total, "", KVB_NO_LABEL,                    \
      "Messages dropped while held for a pair not yet registered (barrier)")   \
    X(gauge, discovery_registered_pairs, "", KVB_NO_LABEL,                     \
      "(worker_id, dp_rank) pairs whose EventSource record is in etcd")        \
    X(counter, discovery_registrations_total, "", KVB_NO_LABEL,                \
      "EventSource records put in etcd (again after a lost lease)")            \
    X(counter, discovery_etcd_errors_total, "", KVB_NO_LABEL,                  \
      "etcd requests that failed (unreachable, refused, lease lost)")          \
    X(counter, recovery_requests_total, "result", KVB_RECOVERY_RESULTS,        \
      "Dynamo recovery queries, by how they ended (the answer sent, refused, or not delivered)") \
    X(counter, recovery_response_bytes_total, "", KVB_NO_LABEL,                \
      "Bytes of recovery answers delivered to routers")

/* Histograms: name, help, bucket list.  Buckets are upper bounds in
 * nanoseconds, exposed in seconds; +Inf is implicit. */
#define KVB_DELAY_BUCKETS(X)                                                   \
    X(50000) X(100000) X(250000) X(500000) X(1000000) X(2500000) X(5000000)    \
    X(10000000) X(25000000) X(50000000) X(100000000) X(250000000)              \
    X(500000000) X(1000000000) X(2500000000) X(5000000000)
#define KVB_PROC_BUCKETS(X)                                                    \
    X(1000) X(2500) X(5000) X(10000) X(25000) X(50000) X(100000) X(250000)     \
    X(500000) X(1000000) X(2500000) X(10000000) X(100000000)

#define KVB_HISTOGRAMS(X)                                                      \
    X(publish_delay_seconds, KVB_DELAY_BUCKETS,                                \
      "Engine batch timestamp to publish (wall clock; needs synced clocks)")   \
    X(batch_processing_seconds, KVB_PROC_BUCKETS,                              \
      "Time to decode, convert, encode and publish one live batch")            \
    X(query_duration_seconds, KVB_DELAY_BUCKETS,                               \
      "Time to answer a query, from its request to its last byte")

/* Per stream (source endpoint, topic), labels source and topic. */
#define KVB_STREAM_METRICS(X)                                                  \
    X(counter, source_batches_received_total, batches,                         \
      "Engine batches applied (live or replayed), by stream")                                    \
    X(counter, source_events_received_total, events,                           \
      "Engine events decoded, by stream")                                      \
    X(counter, source_seq_gaps_total, gaps, "Sequence gaps, by stream")        \
    X(gauge, source_last_seq, last_seq, "Last engine seq applied, by stream")

/* Per engine rank (sources[].engine), labels source and dp_rank: the
 * engine's load as its /metrics page says (engine/load.h). */
#define KVB_ENGINE_METRICS(X)                                                  \
    X(gauge, engine_up, up,                                                    \
      "1 while the engine's metrics or health URL answers, by source and dp_rank") \
    X(gauge, engine_kv_used_blocks, used_blocks,                               \
      "KV blocks in use (usage x total blocks), by source and dp_rank")        \
    X(gauge, engine_kv_total_blocks, total_blocks,                             \
      "KV blocks of the engine's cache, by source and dp_rank")                \
    X(gauge, engine_requests_running, running,                                 \
      "Requests the engine is running, by source and dp_rank")                 \
    X(gauge, engine_requests_waiting, waiting,                                 \
      "Requests queued in the engine, by source and dp_rank")

#define KVB_ENUM_ITEM(prefix, suffix, str) prefix##suffix,
#define KVB_DROP_ITEM(s, str) KVB_DROP_##s,
#define KVB_EVT_ITEM(s, str) KVB_EVT_##s,
#define KVB_REVT_ITEM(s, str) KVB_REVT_##s,
#define KVB_MAL_ITEM(s, str) KVB_MAL_##s,
#define KVB_UNS_ITEM(s, str) KVB_UNS_##s,
#define KVB_LF_ITEM(s, str) KVB_LF_##s,
#define KVB_BAR_ITEM(s, str) KVB_BAR_##s,
#define KVB_TIER_ITEM(s, str) KVB_TIER_##s,
#define KVB_ALL_ITEM(s, str) KVB_LBL_##s,
#define KVB_JSF_ITEM(s, str) KVB_JSF_##s,
#define KVB_QOP_ITEM(s, str) KVB_QOP_##s,
#define KVB_FMT_ITEM(s, str) KVB_FMT_##s,
#define KVB_REP_ITEM(s, str) KVB_REP_##s,
#define KVB_RES_ITEM(s, str) KVB_RES_##s,
enum kvb_drop_reason { KVB_DROP_REASONS(KVB_DROP_ITEM) KVB_DROP__COUNT };
enum kvb_evt_label { KVB_EVENT_TYPES(KVB_EVT_ITEM) KVB_EVT__COUNT };
enum kvb_revt_label { KVB_REV_TYPES(KVB_REVT_ITEM) KVB_REVT__COUNT };
enum kvb_malformed_kind { KVB_MALFORMED_KINDS(KVB_MAL_ITEM) KVB_MAL__COUNT };
enum kvb_unsalted_reason { KVB_UNSALTED_REASONS(KVB_UNS_ITEM) KVB_UNS__COUNT };
enum kvb_list_failure { KVB_LIST_FAILURES(KVB_LF_ITEM) KVB_LF__COUNT };
enum kvb_barrier_cause { KVB_BARRIER_CAUSES(KVB_BAR_ITEM) KVB_BAR__COUNT };
enum kvb_tier { KVB_TIERS(KVB_TIER_ITEM) KVB_TIER__COUNT };
enum kvb_nolabel { KVB_NO_LABEL(KVB_ALL_ITEM) KVB_LBL__COUNT };
enum kvb_js_ack_failure { KVB_JS_ACK_FAILURES(KVB_JSF_ITEM) KVB_JSF__COUNT };
enum kvb_qop_label { KVB_QUERY_OPS(KVB_QOP_ITEM) KVB_QOP__COUNT };
enum kvb_fmt_label { KVB_FORMATS(KVB_FMT_ITEM) KVB_FMT__COUNT };
enum kvb_repair_cause { KVB_REPAIR_CAUSES(KVB_REP_ITEM) KVB_REP__COUNT };
enum kvb_recovery_result { KVB_RECOVERY_RESULTS(KVB_RES_ITEM) KVB_RES__COUNT };

#define KVB_COUNT_OF(list) (0 list(KVB_COUNT_ONE))
#define KVB_COUNT_ONE(s, str) +1

#define KVB_BUCKET_ONE(ns) +1
struct kvb_histogram {
    _Atomic uint64_t count;
    _Atomic uint64_t sum_ns;
    _Atomic uint64_t buckets[32]; /* cumulative at exposition, per bucket here */
};

#define KVB_MAX_STREAM_SLOTS 256
struct kvb_stream_slot {
    _Atomic int used;          /* set (release) once name/topic are written */
    char source[256];
    char topic[256];
#define KVB_STREAM_FIELD(kind, name, field, help) _Atomic uint64_t field;
    KVB_STREAM_METRICS(KVB_STREAM_FIELD)
};

#define KVB_MAX_ENGINE_SLOTS 256
struct kvb_engine_slot {
    _Atomic int used;          /* set (release) once source/dp_rank are written */
    char source[256];
    uint32_t dp_rank;
    _Atomic uint64_t gone;     /* 1 while judged gone (/readyz names it) */
    _Atomic uint64_t dead_after_ms;
#define KVB_ENGINE_FIELD(kind, name, field, help) _Atomic uint64_t field;
    KVB_ENGINE_METRICS(KVB_ENGINE_FIELD)
};

#define KVB_METRIC_FIELD(kind, name, label, list, help)                        \
    _Atomic uint64_t name[KVB_COUNT_OF(list)];
/* clang-format on */
#define KVB_HIST_FIELD(name, buckets, help) struct kvb_histogram name;
struct kvb_metrics {
    KVB_METRICS(KVB_METRIC_FIELD)
    KVB_HISTOGRAMS(KVB_HIST_FIELD)
    struct kvb_stream_slot streams[KVB_MAX_STREAM_SLOTS];
    struct kvb_engine_slot engines[KVB_MAX_ENGINE_SLOTS];
    _Atomic uint64_t loop_heartbeat_ms; /* CLOCK_MONOTONIC of the last loop turn */
    _Atomic uint64_t heartbeat_interval_ms;
    /* for /readyz's reasons (the loop writes them with ready): how long live
     * batches have been held back behind a replay, and reading paused for
     * NATS, without a break (ms, 0: not now) */
    _Atomic uint64_t live_held_ms;
    _Atomic uint64_t paused_ms;
    _Atomic uint64_t state_save_errno; /* the last failed save's errno (/readyz) */
};

/* Single-writer increment: relaxed load + store, no lock prefix.
 * -DKVB_NO_METRICS compiles collection out: only for measuring its cost
 * (tests/bench/metrics_cost.sh). */
static inline void kvb_add(_Atomic uint64_t *c, uint64_t n)
{
#ifdef KVB_NO_METRICS
    (void)c;
    (void)n;
#else
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n,
                          memory_order_relaxed);
#endif
}
static inline void kvb_inc(_Atomic uint64_t *c) { kvb_add(c, 1); }
/* For the few metrics several threads write (query_*): an atomic add. */
static inline void kvb_add_shared(_Atomic uint64_t *c, uint64_t n)
{
    atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}
static inline uint64_t kvb_get(const _Atomic uint64_t *c)
{
    return atomic_load_explicit((_Atomic uint64_t *)c, memory_order_relaxed);
}

static inline void kvb_set(_Atomic uint64_t *c, uint64_t v)
{
    atomic_store_explicit(c, v, memory_order_relaxed);
}

/* Record one observation (single writer; _shared: atomic adds, any thread). */
void kvb_histogram_observe(struct kvb_histogram *h, const uint64_t *bounds, int n_bounds,
                           uint64_t ns);
void kvb_histogram_observe_shared(struct kvb_histogram *h, const uint64_t *bounds, int n_bounds,
                                  uint64_t ns);
#define KVB_OBSERVE(m, name, ns) kvb_metrics_observe_##name((m), (ns))
#define KVB_HIST_DECL(name, buckets, help)                               \
    void kvb_metrics_observe_##name(struct kvb_metrics *m, uint64_t ns); \
    void kvb_metrics_observe_shared_##name(struct kvb_metrics *m, uint64_t ns);
KVB_HISTOGRAMS(KVB_HIST_DECL)

/* The slot of stream (source, topic), claimed on first use by the loop
 * thread; NULL when all slots are taken (the stream is then not exported). */
struct kvb_stream_slot *kvb_metrics_stream_slot(struct kvb_metrics *m, const char *source,
                                                const char *topic);

/* The slot of engine rank (source, dp_rank), claimed on first use by the
 * loop thread; NULL when all slots are taken. */
struct kvb_engine_slot *kvb_metrics_engine_slot(struct kvb_metrics *m, const char *source,
                                                uint32_t dp_rank);

/* Prometheus text exposition (format 0.0.4) of everything into a malloc'ed
 * buffer (*out, *len; the caller frees).  Safe from any thread. */
int kvb_metrics_render(const struct kvb_metrics *m, const char *version, char **out, size_t *len);

/* Label value strings, for exposition and names in logs. */
const char *kvb_tier_name(int tier);
const char *kvb_drop_reason_name(int reason);

#endif
