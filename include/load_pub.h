/* load_pub: one ActiveLoad message (docs/dynamo-event-plane.md section 6) in the
 * configured nats.format, and the subject it goes on.
 *
 *   dynamo-msgpack: the event-plane envelope {publisher_id, sequence,
 *     published_at, topic "kv_metrics", payload} around the ActiveLoad named
 *     map (encode_msgpack.h's packers, byte-exact against the spec).
 *   dynamo-json (and raw, which has no load form of its own): the same
 *     fields as one JSON object, keys in the same order, absent values null:
 *     {"worker_id":N,"dp_rank":N,"active_decode_blocks":N|null,
 *      "active_prefill_tokens":N|null,"scheduler_load_scope":null,
 *      "kv_used_blocks":N|null}
 *
 * Subject, both formats: namespace.{ns}.component.{comp}.endpoint.{ep}.kv_metrics,
 * every segment percent-encoded (subject.h).
 *
 * Pure: no I/O, no clock (the caller passes published_at), no globals.
 * Ownership: the caller owns both sbuffers (initialised, reused between
 * messages); OUT is cleared and then holds the message.
 */
#ifndef KVB_LOAD_PUB_H
#define KVB_LOAD_PUB_H

#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>

#include "encode_msgpack.h"

#define KVB_LOAD_SUBJECT \
    "namespace.{namespace}.component.{component}.endpoint.{endpoint}.kv_metrics"

/* The subject into OUT (CAP bytes).  Its length, or kvb_subject_expand_vals()'s
 * errors. */
int kvb_load_subject(const char *ns, const char *component, const char *endpoint, char *out,
                     size_t cap);

/* The envelope fields (dynamo-msgpack only; ignored for JSON). */
struct kvb_load_env {
    uint64_t publisher_id;
    uint64_t sequence;
    uint64_t published_at_ms;
};

/* Encode L in FORMAT (enum kvb_format) into OUT, using TMP as scratch (the
 * msgpack payload).  0, -EINVAL (neither active_decode_blocks nor
 * kv_used_blocks set, NULL arguments), -ENOMEM. */
int kvb_load_encode(int format, const struct kvb_active_load *l, const struct kvb_load_env *env,
                    msgpack_sbuffer *tmp, msgpack_sbuffer *out);

#endif
