/* encode_msgpack: router events -> Dynamo's event plane (docs/dynamo-event-plane.md
 * sections 3, 4 and 6): msgpack named maps, keys in Dynamo's order, every
 * integer in its smallest form, packed with msgpack-c.
 *
 * Two layers:
 *   - packers (kvb_mp_pack_*) that append one object to a msgpack_packer;
 *   - a batcher that turns a stream of router events into event-plane
 *     messages: one (worker_id, dp_rank) per message, at most
 *     KVB_MP_BATCH_EVENTS events or KVB_MP_BATCH_BLOCKS blocks (stored blocks
 *     or removed hashes) per message, a single larger event alone, never
 *     split; each pair with its own publisher_id and message sequence.
 *
 * Pure: no I/O, no clock (the caller passes published_at, wall-clock ms), no
 * globals.  One thread (the loop) owns a batcher.
 *
 * Ownership: kvb_mp_batcher_create() returns a batcher the caller frees with
 * kvb_mp_batcher_destroy(&b).  It owns one buffer, grown to the largest
 * message seen and then only reset, never freed, between messages: the
 * events are packed into it behind room left for the envelope head, so a
 * message is emitted where it was packed (no copy).  The batcher packs from
 * runs of keys pre-packed with msgpack-c at create, and per pair from the
 * pieces that never change (worker_id, dp_rank, publisher_id), packed once;
 * the result is byte for byte kvb_mp_pack_envelope() around kvb_mp_pack_rev().
 * The bytes handed to the emit callback (struct kvb_mp_msg .data) are valid
 * only during the callback: copy them to keep them.
 */
#ifndef KVB_ENCODE_MSGPACK_H
#define KVB_ENCODE_MSGPACK_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "convert.h"

#define KVB_MP_TOPIC_KV "kv-events"
#define KVB_MP_TOPIC_LOAD "kv_metrics"
#define KVB_MP_BATCH_EVENTS 128u
#define KVB_MP_BATCH_BLOCKS 8192u
#define KVB_MP_PUBLISHER_MASK ((UINT64_C(1) << 53) - 1)

/* ---- packers: each appends one object; 0, or -ENOMEM ---------------------- */

/* One RouterEvent map: worker_id, storage_tier, residency_domain "worker"
 * (when residency_domain; Dynamo's own publisher always writes it, routers
 * that predate it need it off), event {event_id, data, dp_rank}.  Stored
 * blocks carry mm_extra_info (nil, or {"mm_objects":[{"mm_hash","offsets":[]}]}). */
int kvb_mp_pack_rev(msgpack_packer *pk, const struct kvb_rev *r, bool residency_domain);

/* The envelope {publisher_id, sequence, published_at, topic, payload} up to
 * and including the bin header of a payload of payload_len bytes: the caller
 * appends exactly payload_len bytes next. */
int kvb_mp_pack_envelope_head(msgpack_packer *pk, uint64_t publisher_id, uint64_t sequence,
                              uint64_t published_at_ms, const char *topic, size_t payload_len);
/* The whole envelope around payload. */
int kvb_mp_pack_envelope(msgpack_packer *pk, uint64_t publisher_id, uint64_t sequence,
                         uint64_t published_at_ms, const char *topic, const void *payload,
                         size_t payload_len);

/* Load metrics (section 6), one per envelope, topic KVB_MP_TOPIC_LOAD.
 * scheduler_load_scope is always nil (workers leave it unset). */
struct kvb_active_load {
    uint64_t worker_id;
    uint32_t dp_rank;
    bool has_decode_blocks, has_prefill_tokens, has_kv_used_blocks;
    uint64_t active_decode_blocks;
    uint64_t active_prefill_tokens;
    uint64_t kv_used_blocks;
};
/* -EINVAL when neither active_decode_blocks nor kv_used_blocks is set. */
int kvb_mp_pack_active_load(msgpack_packer *pk, const struct kvb_active_load *l);

/* ---- batcher -------------------------------------------------------------- */

struct kvb_mp_batcher_cfg {
    bool batch;            /* true: payload = array of RouterEvents (cut by the
                              limits); false: one RouterEvent per message (the
                              event plane's first form) */
    bool residency_domain; /* see kvb_mp_pack_rev */
    uint32_t max_events;   /* 0: KVB_MP_BATCH_EVENTS */
    uint32_t max_blocks;   /* 0: KVB_MP_BATCH_BLOCKS */
    uint64_t seed;         /* publisher ids not set with kvb_mp_batcher_set_publisher
                              are drawn from a splitmix64 sequence seeded with
                              this (the caller seeds from getrandom() at start) */
};

/* One message, ready to publish on the pair's subject. */
struct kvb_mp_msg {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint64_t publisher_id;
    uint64_t sequence; /* 0 for the pair's first message, +1 per message */
    uint32_t n_events;
    uint32_t n_blocks;
    uint64_t first_event_id, last_event_id;
    const char *data; /* the envelope; valid during the callback only */
    size_t len;
};

/* Returns 0, or a negative errno that kvb_mp_batcher_add/flush pass back (the
 * message counts as sent: its sequence number is used).  msg->data lies in
 * the batcher's buffer: the callback must not call kvb_mp_batcher_add or
 * _flush of the same batcher (copy the bytes first). */
typedef int (*kvb_mp_emit_fn)(void *ctx, const struct kvb_mp_msg *msg);

struct kvb_mp_batcher;

/* 0, or -ENOMEM / -EINVAL (emit NULL). */
int kvb_mp_batcher_create(const struct kvb_mp_batcher_cfg *cfg, kvb_mp_emit_fn emit, void *ctx,
                          struct kvb_mp_batcher **out);
/* Drops a pending batch unsent (flush first).  Accepts NULL; sets *b to NULL. */
void kvb_mp_batcher_destroy(struct kvb_mp_batcher **b);

/* Queue one router event (copied into the pending batch: r may go away).
 * Emits the pending batch first when r belongs to another pair or would break
 * a limit, and emits right away when the batch is full, or always when !batch.
 * now_ms: the wall clock, for published_at of a message cut here.
 * 0, -ENOMEM (r not queued), -ENOSPC (too many pairs), or the emit callback's
 * error. */
int kvb_mp_batcher_add(struct kvb_mp_batcher *b, const struct kvb_rev *r, uint64_t now_ms);

/* Emit the pending batch, if any (the daemon: at the end of each engine
 * batch, so one message per engine batch and pair when events are few).  0 or as above. */
int kvb_mp_batcher_flush(struct kvb_mp_batcher *b, uint64_t now_ms);
bool kvb_mp_batcher_pending(const struct kvb_mp_batcher *b);

/* The pair's publisher_id, drawn now if the pair is new (discovery registers
 * it before the first message).  0 or -ENOSPC. */
int kvb_mp_batcher_publisher(struct kvb_mp_batcher *b, uint64_t worker_id, uint32_t dp_rank,
                             uint64_t *publisher_id);
/* Fix a pair's publisher_id (masked to 53 bits) before its first message.
 * 0, -EEXIST (the pair already has messages), -ENOSPC. */
int kvb_mp_batcher_set_publisher(struct kvb_mp_batcher *b, uint64_t worker_id, uint32_t dp_rank,
                                 uint64_t publisher_id);

#endif
