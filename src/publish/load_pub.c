/* load_pub: ActiveLoad bytes and subject.  See include/load_pub.h. */
#include "load_pub.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "config.h"
#include "subject.h"

int kvb_load_subject(const char *ns, const char *component, const char *endpoint, char *out,
                     size_t cap)
{
    struct kvb_subject_vals v = {.ns = ns, .component = component, .endpoint = endpoint};
    return kvb_subject_expand_vals(KVB_LOAD_SUBJECT, &v, KVB_SUBJECT_PCT, out, cap);
}

/* "N" or "null" for an optional unsigned field. */
static const char *opt_u64(char *buf, size_t cap, bool has, uint64_t v)
{
    if (!has)
        return "null";
    snprintf(buf, cap, "%" PRIu64, v);
    return buf;
}

static int encode_json(const struct kvb_active_load *l, msgpack_sbuffer *out)
{
    char a[24], b[24], c[24], text[256];
    int n = snprintf(text, sizeof text,
                     "{\"worker_id\":%" PRIu64 ",\"dp_rank\":%" PRIu32
                     ",\"active_decode_blocks\":%s,\"active_prefill_tokens\":%s"
                     ",\"scheduler_load_scope\":null,\"kv_used_blocks\":%s}",
                     l->worker_id, l->dp_rank,
                     opt_u64(a, sizeof a, l->has_decode_blocks, l->active_decode_blocks),
                     opt_u64(b, sizeof b, l->has_prefill_tokens, l->active_prefill_tokens),
                     opt_u64(c, sizeof c, l->has_kv_used_blocks, l->kv_used_blocks));
    if (n < 0 || (size_t)n >= sizeof text)
        return -EINVAL; /* cannot happen: at most 4 numbers of 20 digits */
    return msgpack_sbuffer_write(out, text, (size_t)n) == 0 ? 0 : -ENOMEM;
}

int kvb_load_encode(int format, const struct kvb_active_load *l, const struct kvb_load_env *env,
                    msgpack_sbuffer *tmp, msgpack_sbuffer *out)
{
    if (!l || !out || (format == KVB_FORMAT_DYNAMO_MSGPACK && (!env || !tmp)))
        return -EINVAL;
    if (!l->has_decode_blocks && !l->has_kv_used_blocks)
        return -EINVAL;
    msgpack_sbuffer_clear(out);
    if (format != KVB_FORMAT_DYNAMO_MSGPACK)
        return encode_json(l, out);
    msgpack_sbuffer_clear(tmp);
    msgpack_packer pk;
    msgpack_packer_init(&pk, tmp, msgpack_sbuffer_write);
    int rc = kvb_mp_pack_active_load(&pk, l);
    if (rc < 0)
        return rc;
    msgpack_packer_init(&pk, out, msgpack_sbuffer_write);
    return kvb_mp_pack_envelope(&pk, env->publisher_id, env->sequence, env->published_at_ms,
                                KVB_MP_TOPIC_LOAD, tmp->data, tmp->size);
}
