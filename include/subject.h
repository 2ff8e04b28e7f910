/* subject: NATS subject templates and message ids (pure: no I/O, no state).
 *
 * One module owns the placeholders of nats.subject and of the JetStream
 * stream / subject templates: which ones exist, the check the config module
 * runs on a template, their expansion, the percent-encoding of a segment
 * (docs/dynamo-event-plane.md section 2) and the JetStream Nats-Msg-Id
 * (docs/router-events.md section 2).
 *
 * Placeholders: {namespace} {component} {endpoint} (text, the caller's
 * values) and {worker_id} {dp_rank} (decimal numbers).  A '{' always starts a
 * placeholder; a lone '}' is literal.
 *
 * Every function is thread-safe (no globals) and never allocates: the caller
 * passes the output buffer, which is written only on success.
 */
#ifndef KVB_SUBJECT_H
#define KVB_SUBJECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The placeholders, as bits for kvb_subject_check()'s ALLOWED. */
enum kvb_subject_ph {
    KVB_PH_NAMESPACE = 1u << 0,
    KVB_PH_COMPONENT = 1u << 1,
    KVB_PH_WORKER_ID = 1u << 2,
    KVB_PH_DP_RANK = 1u << 3,
    KVB_PH_ENDPOINT = 1u << 4,
};
#define KVB_PH_ALL \
    (KVB_PH_NAMESPACE | KVB_PH_COMPONENT | KVB_PH_WORKER_ID | KVB_PH_DP_RANK | KVB_PH_ENDPOINT)

/* nats.subject for dynamo-msgpack when the file does not set it: the newest
 * routers' endpoint-scoped subject (docs/dynamo-event-plane.md section 2). */
#define KVB_SUBJECT_DEFAULT_MSGPACK \
    "namespace.{namespace}.component.{component}.endpoint.{endpoint}.kv-events"

/* The values a template expands from.  ns, component: required; endpoint:
 * NULL counts as "". */
struct kvb_subject_vals {
    const char *ns;
    const char *component;
    const char *endpoint;
    uint64_t worker_id;
    uint32_t dp_rank;
};

/* Flags of kvb_subject_expand_vals(). */
#define KVB_SUBJECT_PCT 1u /* percent-encode each text value (kvb_subject_pct_encode) */

/* Check TMPL: every '{' starts a placeholder of ALLOWED (bits above).  0, or
 * -EINVAL with *bad_off / *bad_len (either may be NULL) set to the offending
 * text: from its '{' through its '}' (to the end of TMPL when unclosed).
 * -EINVAL as well for TMPL NULL (*bad_* untouched). */
int kvb_subject_check(const char *tmpl, unsigned allowed, size_t *bad_off, size_t *bad_len);

/* Expand TMPL (every placeholder allowed) into OUT (CAP bytes, NUL
 * included).  FLAGS: KVB_SUBJECT_PCT or 0.  Returns the length written, or
 * -ENAMETOOLONG (does not fit; also for CAP 0), -EINVAL (NULL tmpl, ns,
 * component or vals, out NULL with cap > 0, an unknown placeholder). */
int kvb_subject_expand_vals(const char *tmpl, const struct kvb_subject_vals *v, unsigned flags,
                            char *out, size_t cap);

/* kvb_subject_expand_vals() without endpoint (empty) nor encoding: the
 * subject nats.subject gives today. */
int kvb_subject_expand(const char *tmpl, const char *ns, const char *component, uint64_t worker_id,
                       uint32_t dp_rank, char *out, size_t cap);

/* Percent-encode one segment (LEN bytes of SEG, any bytes): A-Z a-z 0-9 '-'
 * '_' pass, every other byte becomes %XX (upper-case hex).  Writes the result
 * and a NUL into OUT (CAP bytes); returns its length, or -ENAMETOOLONG /
 * -EINVAL (SEG NULL with LEN > 0, OUT NULL).  The result is at most 3 * LEN
 * bytes. */
int kvb_subject_pct_encode(const char *seg, size_t len, char *out, size_t cap);

/* Room kvb_subject_msg_id() needs: 4 numbers of up to 20 digits, 3 dots, NUL. */
#define KVB_MSG_ID_MAX (4 * 20 + 3 + 1)

/* The JetStream Nats-Msg-Id {worker_id}.{dp_rank}.{epoch}.{event_id} into BUF
 * (at least KVB_MSG_ID_MAX bytes).  Returns BUF. */
const char *kvb_subject_msg_id(char *buf, uint64_t worker_id, uint64_t dp_rank, uint64_t epoch,
                               uint64_t event_id);

#endif
