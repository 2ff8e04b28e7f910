/* wire: Dynamo's recovery query on the wire.  See src/recovery/wire.h. */
#include "wire.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "metrics.h"

/* ---- big-endian integers -------------------------------------------------- */

static uint64_t get_be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

static void put_be(uint8_t *p, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

/* ---- TwoPart -------------------------------------------------------------- */

int kvb_wire_twopart_parse(const void *buf, size_t len, struct kvb_wire_twopart *out)
{
    const uint8_t *p = buf;
    if (len < KVB_WIRE_TWOPART_HEAD)
        return -EINVAL;
    uint64_t h = get_be64(p), b = get_be64(p + 8);
    if (h > len || b > len || h + b != len - KVB_WIRE_TWOPART_HEAD)
        return -EINVAL;
    /* the checksum (p + 16) is checked by Dynamo's debug builds only */
    *out = (struct kvb_wire_twopart){.header = p + KVB_WIRE_TWOPART_HEAD,
                                     .header_len = (size_t)h,
                                     .body = p + KVB_WIRE_TWOPART_HEAD + h,
                                     .body_len = (size_t)b};
    return 0;
}

void kvb_wire_twopart_head(uint8_t out[KVB_WIRE_TWOPART_HEAD], uint64_t header_len,
                           uint64_t body_len)
{
    put_be(out, header_len, 8);
    put_be(out + 8, body_len, 8);
    put_be(out + 16, 0, 8);
}

/* ---- UUIDs ---------------------------------------------------------------- */

static int hexval(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

int kvb_wire_uuid_parse(const char *s, uint8_t out[16])
{
    int k = 0;
    for (int i = 0; s && s[i] && k < 32; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (s[i] != '-')
                return -EINVAL;
            continue;
        }
        int v = hexval(s[i]);
        if (v < 0)
            return -EINVAL;
        out[k / 2] = (uint8_t)(k % 2 ? (out[k / 2] | v) : v << 4);
        k++;
    }
    return k == 32 && strlen(s) == 36 ? 0 : -EINVAL;
}

void kvb_wire_uuid_format(const uint8_t u[16], char out[37])
{
    static const char hx[] = "0123456789abcdef";
    int o = 0;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            out[o++] = '-';
        out[o++] = hx[u[i] >> 4];
        out[o++] = hx[u[i] & 15];
    }
    out[o] = '\0';
}

/* ---- JSON in --------------------------------------------------------------- */

static int fail(char *err, size_t cap, const char *msg)
{
    if (err && cap)
        snprintf(err, cap, "%s", msg);
    return -EINVAL;
}

/* The JSON object of (json, len), whole: NULL when it is not one. */
static json_object *parse_object(const void *json, size_t len)
{
    if (len > KVB_WIRE_MAX_REQUEST)
        return NULL;
    struct json_tokener *tok = json_tokener_new();
    if (!tok)
        return NULL;
    json_object *o = json_tokener_parse_ex(tok, json, (int)len);
    bool whole = json_tokener_get_error(tok) == json_tokener_success &&
                 json_tokener_get_parse_end(tok) == len;
    json_tokener_free(tok);
    if (!o || !whole || !json_object_is_type(o, json_type_object)) {
        json_object_put(o);
        return NULL;
    }
    return o;
}

/* A string field into out (cap bytes): false when absent, not a string, or
 * too long. */
static bool get_str(json_object *o, const char *key, char *out, size_t cap)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string))
        return false;
    const char *s = json_object_get_string(v);
    if (strlen(s) >= cap)
        return false;
    strcpy(out, s);
    return true;
}

/* An unsigned integer field of at most max: 1 set, 0 absent or null, -1 bad. */
static int get_u64(json_object *o, const char *key, uint64_t max, uint64_t *out)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null))
        return 0;
    if (!json_object_is_type(v, json_type_int) || json_object_get_int64(v) < 0)
        return -1;
    errno = 0;
    uint64_t u = json_object_get_uint64(v);
    if (errno || u > max)
        return -1;
    *out = u;
    return 1;
}

int kvb_wire_control_parse(const void *json, size_t len, struct kvb_wire_control *out, char *err,
                           size_t cap)
{
    memset(out, 0, sizeof(*out));
    json_object *o = parse_object(json, len), *ci, *info = NULL;
    int rc = 0;
    if (!o)
        return fail(err, cap, "the control message is not a JSON object");
    char codec[16] = "json", text[2048];
    if (!get_str(o, "id", out->id, sizeof(out->id))) {
        rc = fail(err, cap, "control message: no id");
        goto out;
    }
    if (json_object_object_get_ex(o, "payload_codec", &ci) &&
        !get_str(o, "payload_codec", codec, sizeof(codec))) {
        rc = fail(err, cap, "control message: payload_codec is not a string");
        goto out;
    }
    out->msgpack = strcmp(codec, "msgpack") == 0;
    if (!json_object_object_get_ex(o, "connection_info", &ci) ||
        !get_str(ci, "transport", out->transport, sizeof(out->transport)) ||
        !get_str(ci, "info", text, sizeof(text))) {
        rc = fail(err, cap, "control message: no connection_info {transport, info}");
        goto out;
    }
    out->plane = strcmp(out->transport, "tcp_response_mux_v1") == 0 ? KVB_WIRE_PLANE_MUX
                 : strcmp(out->transport, "tcp_server") == 0        ? KVB_WIRE_PLANE_CALLHOME
                                                                    : KVB_WIRE_PLANE_OTHER;
    if (out->plane == KVB_WIRE_PLANE_OTHER)
        goto out; /* the caller refuses it, saying which */
    info = parse_object(text, strlen(text));
    char context[128], uuid[64];
    if (!info || !get_str(info, "address", out->address, sizeof(out->address)) ||
        !get_str(info, "context", context, sizeof(context))) {
        rc = fail(err, cap, "connection_info.info: no address or context");
        goto out;
    }
    if (strcmp(context, out->id) != 0) {
        rc = fail(err, cap, "connection_info.info: the context is not the request's id");
        goto out;
    }
    if (out->plane == KVB_WIRE_PLANE_MUX) {
        uint64_t version = 1; /* the newest frontends leave it out */
        if (get_u64(info, "version", 255, &version) < 0 || version != 1 ||
            !get_str(info, "frontend_server_id", uuid, sizeof(uuid)) ||
            kvb_wire_uuid_parse(uuid, out->frontend) < 0 ||
            !get_str(info, "stream_id", uuid, sizeof(uuid)) ||
            kvb_wire_uuid_parse(uuid, out->stream) < 0) {
            rc =
                fail(err, cap, "tcp_response_mux_v1: bad version, frontend_server_id or stream_id");
            goto out;
        }
    } else {
        char st[32];
        if (!get_str(info, "subject", out->subject, sizeof(out->subject)) ||
            !get_str(info, "stream_type", st, sizeof(st)) || strcmp(st, "response") != 0) {
            rc = fail(err, cap, "tcp_server: no subject, or not a response stream");
            goto out;
        }
    }
out:
    json_object_put(info);
    json_object_put(o);
    return rc;
}

int kvb_wire_request_parse(const void *json, size_t len, struct kvb_wire_request *out, char *err,
                           size_t cap)
{
    memset(out, 0, sizeof(*out));
    json_object *o = parse_object(json, len), *v;
    int rc = 0;
    if (!o)
        return fail(err, cap, "the request is not a JSON object");
    uint64_t rank = 0;
    int s;
    if (get_u64(o, "worker_id", UINT64_MAX, &out->worker_id) != 1 ||
        get_u64(o, "dp_rank", UINT32_MAX, &rank) < 0) {
        rc = fail(err, cap, "request: worker_id (u64) and dp_rank (u32) required");
        goto out;
    }
    out->dp_rank = (uint32_t)rank;
    if ((s = get_u64(o, "start_event_id", UINT64_MAX, &out->start)) < 0 ||
        (out->has_start = s == 1, (s = get_u64(o, "end_event_id", UINT64_MAX, &out->end)) < 0)) {
        rc = fail(err, cap, "request: start_event_id and end_event_id are u64 or null");
        goto out;
    }
    out->has_end = s == 1;
    if (json_object_object_get_ex(o, "supports_tree_dump_failed", &v)) {
        if (!json_object_is_type(v, json_type_boolean)) {
            rc = fail(err, cap, "request: supports_tree_dump_failed is a boolean");
            goto out;
        }
        out->supports_tree_dump_failed = json_object_get_boolean(v);
    }
    out->kind = KVB_WIRE_KIND_RECOVERY;
    if (json_object_object_get_ex(o, "kind", &v)) {
        /* externally tagged: "recovery", or {"status":..} / {"state_agent_recovery":..} */
        if (json_object_is_type(v, json_type_string) &&
            strcmp(json_object_get_string(v), "recovery") == 0)
            out->kind = KVB_WIRE_KIND_RECOVERY;
        else if (json_object_is_type(v, json_type_object) &&
                 json_object_object_get_ex(v, "status", NULL))
            out->kind = KVB_WIRE_KIND_STATUS;
        else if (json_object_is_type(v, json_type_object) &&
                 json_object_object_get_ex(v, "state_agent_recovery", NULL))
            out->kind = KVB_WIRE_KIND_STATE_AGENT;
        else
            rc = fail(err, cap, "request: unknown kind");
    }
out:
    json_object_put(o);
    return rc;
}

/* ---- JSON out ---------------------------------------------------------------- */

void kvb_wire_buf_free(struct kvb_wire_buf *b)
{
    free(b->p);
    *b = (struct kvb_wire_buf){.max = b->max};
}

void kvb_wire_buf_reset(struct kvb_wire_buf *b)
{
    b->len = 0;
    b->over = b->oom = false;
}

static void put(struct kvb_wire_buf *b, const void *p, size_t n)
{
    size_t max = b->max ? b->max : KVB_WIRE_MAX_MESSAGE;
    if (b->over || b->oom)
        return;
    if (b->len + n > max) {
        b->over = true;
        return;
    }
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *np = realloc(b->p, cap);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

static void puts_(struct kvb_wire_buf *b, const char *s) { put(b, s, strlen(s)); }

/* o (consumed) as compact JSON text. */
static void put_json(struct kvb_wire_buf *b, json_object *o)
{
    const char *s = o ? json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
                                                              JSON_C_TO_STRING_NOSLASHESCAPE)
                      : NULL;
    if (s)
        puts_(b, s);
    else
        b->oom = true;
    json_object_put(o);
}

static json_object *u64(uint64_t v) { return json_object_new_uint64(v); }

static json_object *event_data(const struct kvb_rev *r)
{
    json_object *d = json_object_new_object(), *x = json_object_new_object(), *a;
    if (r->type == KVB_REVT_CLEARED) {
        json_object_put(d);
        json_object_put(x);
        return json_object_new_string("cleared");
    }
    a = json_object_new_array_ext((int)r->n);
    if (r->type == KVB_REVT_STORED) {
        json_object_object_add(x, "parent_hash", r->has_parent ? u64(r->parent) : NULL);
        json_object_object_add(x, "start_position", NULL);
        for (uint32_t i = 0; i < r->n; i++) {
            json_object *bl = json_object_new_object();
            json_object_object_add(bl, "block_hash", u64(r->blocks[i].block_hash));
            json_object_object_add(bl, "tokens_hash", u64(r->blocks[i].tokens_hash));
            json_object_object_add(bl, "mm_extra_info", NULL);
            json_object_array_add(a, bl);
        }
        json_object_object_add(x, "blocks", a);
        json_object_object_add(d, "stored", x);
    } else {
        for (uint32_t i = 0; i < r->n; i++)
            json_object_array_add(a, u64(r->hashes[i]));
        json_object_object_add(x, "block_hashes", a);
        json_object_object_add(d, "removed", x);
    }
    return d;
}

int kvb_wire_router_event(struct kvb_wire_buf *b, const struct kvb_rev *r, uint64_t event_id,
                          bool residency_domain)
{
    json_object *o = json_object_new_object(), *ev = json_object_new_object();
    json_object_object_add(o, "worker_id", u64(r->worker_id));
    json_object_object_add(
        o, "storage_tier",
        json_object_new_string(
            kvb_tier_name(r->type == KVB_REVT_CLEARED && !r->scoped ? KVB_TIER_DEVICE : r->tier)));
    if (residency_domain)
        json_object_object_add(o, "residency_domain", json_object_new_string("worker"));
    json_object_object_add(ev, "event_id", u64(event_id));
    json_object_object_add(ev, "data", event_data(r));
    json_object_object_add(ev, "dp_rank", u64(r->dp_rank));
    json_object_object_add(o, "event", ev);
    put_json(b, o);
    return b->over ? -EMSGSIZE : b->oom ? -ENOMEM : 0;
}

void kvb_wire_item_begin(struct kvb_wire_buf *b, bool tree_dump)
{
    puts_(b, tree_dump ? "{\"data\":{\"TreeDump\":{\"events\":["
                       : "{\"data\":{\"Events\":{\"events\":[");
    b->first = true;
}

void kvb_wire_item_event(struct kvb_wire_buf *b, const struct kvb_rev *r, uint64_t event_id,
                         bool residency_domain)
{
    if (!b->first)
        puts_(b, ",");
    b->first = false;
    kvb_wire_router_event(b, r, event_id, residency_domain);
}

void kvb_wire_item_end(struct kvb_wire_buf *b, bool tree_dump, uint64_t last_event_id)
{
    char tail[96];
    snprintf(tail, sizeof(tail), "],\"last_event_id\":%" PRIu64 "%s}},\"complete_final\":false}",
             last_event_id, tree_dump ? ",\"reset_scope\":\"all\"" : "");
    puts_(b, tail);
}

/* {"data":{variant: value},"complete_final":false}, value consumed. */
static void item(struct kvb_wire_buf *b, const char *variant, json_object *value)
{
    json_object *o = json_object_new_object(), *d = json_object_new_object();
    json_object_object_add(d, variant, value);
    json_object_object_add(o, "data", d);
    json_object_object_add(o, "complete_final", json_object_new_boolean(0));
    put_json(b, o);
}

void kvb_wire_item_too_new(struct kvb_wire_buf *b, uint64_t start, uint64_t end, uint64_t newest)
{
    json_object *v = json_object_new_object();
    json_object_object_add(v, "requested_start", u64(start));
    json_object_object_add(v, "requested_end", u64(end));
    json_object_object_add(v, "newest_available", u64(newest));
    item(b, "TooNew", v);
}

void kvb_wire_item_invalid_range(struct kvb_wire_buf *b, uint64_t start, uint64_t end)
{
    json_object *v = json_object_new_object();
    json_object_object_add(v, "start_id", u64(start));
    json_object_object_add(v, "end_id", u64(end));
    item(b, "InvalidRange", v);
}

void kvb_wire_item_error(struct kvb_wire_buf *b, const char *message)
{
    item(b, "Error", json_object_new_string(message));
}

void kvb_wire_item_dump_failed(struct kvb_wire_buf *b, uint64_t last_event_id, const char *message)
{
    json_object *v = json_object_new_object();
    json_object_object_add(v, "last_event_id", u64(last_event_id));
    json_object_object_add(v, "message", json_object_new_string(message));
    item(b, "TreeDumpFailed", v);
}

void kvb_wire_item_final(struct kvb_wire_buf *b)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "complete_final", json_object_new_boolean(1));
    put_json(b, o);
}

void kvb_wire_prologue(struct kvb_wire_buf *b)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "error", NULL);
    put_json(b, o);
}

/* ---- response planes ---------------------------------------------------------- */

void kvb_wire_mux_handshake(struct kvb_wire_buf *b, const uint8_t frontend[16],
                            const uint8_t connection[16])
{
    char f[37], c[37];
    kvb_wire_uuid_format(frontend, f);
    kvb_wire_uuid_format(connection, c);
    json_object *o = json_object_new_object();
    json_object_object_add(o, "kind", json_object_new_string("response_mux"));
    json_object_object_add(o, "version", json_object_new_int(1));
    json_object_object_add(o, "frontend_server_id", json_object_new_string(f));
    json_object_object_add(o, "connection_id", json_object_new_string(c));
    put_json(b, o);
}

int kvb_wire_mux_ack_check(const struct kvb_wire_twopart *t)
{
    static const uint8_t nil[16];
    if (t->header_len != 20 || t->header[0] != KVB_MUX_CONNECTION_ACK || t->header[1] ||
        t->header[2] || t->header[3] || memcmp(t->header + 4, nil, 16) != 0 || t->body_len != 8)
        return -EINVAL;
    return get_be64(t->body) == 0 ? 0 : -EINVAL;
}

void kvb_wire_mux_head(uint8_t out[KVB_WIRE_MUX_HEAD], int kind, const uint8_t stream[16],
                       uint32_t payload_len)
{
    put_be(out, payload_len, 4);
    out[4] = (uint8_t)kind;
    out[5] = out[6] = out[7] = 0;
    memcpy(out + 8, stream, 16);
}

void kvb_wire_callhome_handshake(struct kvb_wire_buf *b, const char *subject)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "subject", json_object_new_string(subject));
    json_object_object_add(o, "stream_type", json_object_new_string("response"));
    put_json(b, o);
}
