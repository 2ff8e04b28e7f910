/* decode: one engine msgpack batch -> typed views.  See include/decode.h.
 *
 * Two passes over untrusted bytes:
 *   1. prescan(): a bounds walk that needs no memory.  Every declared array,
 *      map, str, bin and ext length is checked against the bytes left (an
 *      element takes at least one byte), and nesting against the limit.  After
 *      it, what msgpack-c allocates is bounded by a constant times the payload
 *      size: no allocation is ever sized by an unchecked length.
 *   2. msgpack_unpack() into the decoder's zone (the per-batch arena, cleared,
 *      not freed, between batches), then a walk of the object tree that fills
 *      struct kvb_batch.  Strings and bins stay views into the payload.
 */
#include "decode.h"

#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

#define ZONE_CHUNK (64 * 1024)
#define MAX_DEPTH_CAP 31 /* msgpack-c's own stack holds 32 levels */

struct kvb_decoder {
    msgpack_zone zone;
    bool zone_ok;
    struct kvb_decode_limits lim;
    uint64_t max_items; /* per array (maps: 2 per entry): the largest limit */
};

struct kvb_decoder *kvb_decoder_create(const struct kvb_decode_limits *limits)
{
    static const struct kvb_decode_limits defaults = KVB_DECODE_LIMITS_DEFAULT;
    struct kvb_decoder *d = calloc(1, sizeof(*d));
    if (!d)
        goto fail;
    d->lim = limits ? *limits : defaults;
    if (d->lim.max_depth == 0 || d->lim.max_depth > MAX_DEPTH_CAP)
        d->lim.max_depth = MAX_DEPTH_CAP;
    d->max_items = d->lim.max_events;
    if (d->lim.max_hashes > d->max_items)
        d->max_items = d->lim.max_hashes;
    if (d->lim.max_tokens > d->max_items)
        d->max_items = d->lim.max_tokens;
    d->max_items = d->max_items * 2 < 64 ? 64 : d->max_items * 2; /* a map of that many keys */
    if (!msgpack_zone_init(&d->zone, ZONE_CHUNK))
        goto fail;
    d->zone_ok = true;
    return d;
fail:
    kvb_decoder_destroy(&d);
    return NULL;
}

void kvb_decoder_destroy(struct kvb_decoder **pd)
{
    if (!pd || !*pd)
        return;
    if ((*pd)->zone_ok)
        msgpack_zone_destroy(&(*pd)->zone);
    free(*pd);
    *pd = NULL;
}

const char *kvb_decode_strerror(int err)
{
    switch (err) {
    case KVB_DEC_OK: return "ok";
    case KVB_DEC_EMPTY: return "empty payload";
    case KVB_DEC_TRUNCATED: return "truncated (a declared length runs past the end)";
    case KVB_DEC_BAD_MSGPACK: return "invalid msgpack";
    case KVB_DEC_TRAILING: return "bytes after the batch";
    case KVB_DEC_TOO_DEEP: return "nesting too deep";
    case KVB_DEC_TOO_LARGE: return "a container longer than the configured limits";
    case KVB_DEC_ENVELOPE: return "not a batch envelope";
    case KVB_DEC_NOMEM: return "out of memory";
    default: return "unknown decode error";
    }
}

/* ---- UTF-8 ------------------------------------------------------------ */

bool kvb_utf8_valid(const char *s, size_t n)
{
    if (n == 0)
        return true; /* msgpack-c gives empty strings a NULL pointer */
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    while (p < end) {
        unsigned c = *p;
        if (c < 0x80) {
            p++;
            continue;
        }
        size_t need;
        unsigned min;
        uint32_t cp;
        if ((c & 0xe0) == 0xc0) {
            need = 1, min = 0x80, cp = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            need = 2, min = 0x800, cp = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            need = 3, min = 0x10000, cp = c & 0x07;
        } else {
            return false;
        }
        if ((size_t)(end - p) <= need)
            return false;
        for (size_t i = 1; i <= need; i++) {
            if ((p[i] & 0xc0) != 0x80)
                return false;
            cp = (cp << 6) | (p[i] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        p += need + 1;
    }
    return true;
}

/* ---- pass 1: bounds walk ---------------------------------------------- */

static uint32_t be16(const uint8_t *p) { return (uint32_t)p[0] << 8 | p[1]; }
static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Bytes that follow a msgpack type byte of fixed size (fixint, nil, bool,
 * int/uint/float 8..64, fixext, fixstr), or VARIABLE (containers, str/bin/
 * ext 8..32, and 0xc1, which the slow path refuses). */
#define VARIABLE 0xff
/* clang-format off */
static const uint8_t fixed_size[256] = {
    [0x00 ... 0x7f] = 0,          /* positive fixint */
    [0x80 ... 0x9f] = VARIABLE,   /* fixmap, fixarray */
    [0xc0] = 0, [0xc1] = VARIABLE, [0xc2] = 0, [0xc3] = 0,
    [0xc4 ... 0xc9] = VARIABLE,   /* bin, ext */
    [0xca] = 4, [0xcb] = 8,
    [0xcc] = 1, [0xcd] = 2, [0xce] = 4, [0xcf] = 8,
    [0xd0] = 1, [0xd1] = 2, [0xd2] = 4, [0xd3] = 8,
    [0xd4] = 2, [0xd5] = 3, [0xd6] = 5, [0xd7] = 9, [0xd8] = 17,
    [0xd9 ... 0xdf] = VARIABLE,   /* str, array, map 8..32 */
    [0xe0 ... 0xff] = 0,          /* negative fixint */
#define FIXSTR(n) [0xa0 + (n)] = (n)
    FIXSTR(0), FIXSTR(1), FIXSTR(2), FIXSTR(3), FIXSTR(4), FIXSTR(5), FIXSTR(6),
    FIXSTR(7), FIXSTR(8), FIXSTR(9), FIXSTR(10), FIXSTR(11), FIXSTR(12), FIXSTR(13),
    FIXSTR(14), FIXSTR(15), FIXSTR(16), FIXSTR(17), FIXSTR(18), FIXSTR(19), FIXSTR(20),
    FIXSTR(21), FIXSTR(22), FIXSTR(23), FIXSTR(24), FIXSTR(25), FIXSTR(26), FIXSTR(27),
    FIXSTR(28), FIXSTR(29), FIXSTR(30), FIXSTR(31),
#undef FIXSTR
};
/* clang-format on */

/* The header of an object of variable size (fixed_size[] says VARIABLE):
 * its extra header bytes, then payload bytes to skip or child elements to
 * walk (a map: 2 per entry). */
struct var_hdr {
    size_t hdr;
    uint64_t skip;
    uint64_t items;
};

/* Read the header of type byte T, whose extra header bytes start at p
 * (avail bytes left).  0, or a KVB_DEC_ error. */
static inline int var_header(uint8_t t, const uint8_t *p, size_t avail, struct var_hdr *h)
{
    enum { BYTES, EXT, ARRAY, MAP } kind;
    *h = (struct var_hdr){0, 0, 0};
    if ((t & 0xf0) == 0x90) { /* fixarray */
        h->items = t & 0x0f;
        return 0;
    }
    if ((t & 0xf0) == 0x80) { /* fixmap */
        h->items = 2u * (t & 0x0f);
        return 0;
    }
    switch (t) {
    case 0xc4: /* bin 8/16/32, str 8/16/32: a length, then the bytes */
    case 0xd9: h->hdr = 1, kind = BYTES; break;
    case 0xc5:
    case 0xda: h->hdr = 2, kind = BYTES; break;
    case 0xc6:
    case 0xdb: h->hdr = 4, kind = BYTES; break;
    case 0xc7: h->hdr = 1, kind = EXT; break; /* ext 8/16/32: len, type, data */
    case 0xc8: h->hdr = 2, kind = EXT; break;
    case 0xc9: h->hdr = 4, kind = EXT; break;
    case 0xdc: h->hdr = 2, kind = ARRAY; break;
    case 0xdd: h->hdr = 4, kind = ARRAY; break;
    case 0xde: h->hdr = 2, kind = MAP; break;
    case 0xdf: h->hdr = 4, kind = MAP; break;
    default: /* 0xc1, never used */ return KVB_DEC_BAD_MSGPACK;
    }
    if (avail < h->hdr)
        return KVB_DEC_TRUNCATED;
    uint64_t n = h->hdr == 1 ? p[0] : h->hdr == 2 ? be16(p) : be32(p);
    switch (kind) {
    case BYTES: h->skip = n; break;
    case EXT: h->skip = n + 1u; break;
    case ARRAY: h->items = n; break;
    case MAP: h->items = 2u * n; break;
    }
    return 0;
}

/* Walk one msgpack object starting at p[0..len).  On success sets *used.
 * No array or map may declare more elements than max_items (the largest of
 * the configured limits): msgpack-c would allocate 24 bytes per element
 * before we could look at them. */
static int prescan(const uint8_t *p, size_t len, uint32_t max_depth, uint64_t max_items,
                   size_t *used)
{
    uint64_t left_items[MAX_DEPTH_CAP + 2];
    uint32_t depth = 0;
    size_t off = 0;
    left_items[0] = 1;

    for (;;) {
        while (left_items[depth] == 0) {
            if (depth == 0) {
                *used = off;
                return 0;
            }
            depth--;
        }
        /* fast path: a run of scalars of a size known from their first byte
         * (most of a batch: token ids, hashes, block sizes, short strings) */
        uint64_t n = left_items[depth];
        while (n && off < len) {
            uint8_t s = fixed_size[p[off]];
            if (s == VARIABLE)
                break;
            if (s >= len - off) /* header byte + s payload bytes */
                return KVB_DEC_TRUNCATED;
            off += 1u + s;
            n--;
        }
        left_items[depth] = n;
        if (n == 0)
            continue;
        if (off >= len)
            return KVB_DEC_TRUNCATED;
        /* an object the fast path left: a container, str/bin/ext 8..32 */
        left_items[depth]--;
        struct var_hdr h;
        uint8_t t = p[off++];
        int rc = var_header(t, p + off, len - off, &h);
        if (rc < 0)
            return rc;
        off += h.hdr;
        if (h.skip > len - off)
            return KVB_DEC_TRUNCATED;
        off += h.skip;
        if (h.items) {
            /* each element needs at least one byte */
            if (h.items > len - off)
                return KVB_DEC_TRUNCATED;
            if (h.items > max_items)
                return KVB_DEC_TOO_LARGE;
            if (depth + 1 > max_depth)
                return KVB_DEC_TOO_DEEP;
            left_items[++depth] = h.items;
        }
    }
}

/* ---- pass 2: object tree -> struct kvb_batch --------------------------- */

struct walk {
    struct kvb_decoder *d;
    const char *err; /* first error of the current event */
};

static bool str_eq(const msgpack_object *o, const char *lit)
{
    size_t n = strlen(lit);
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == n &&
           memcmp(o->via.str.ptr, lit, n) == 0;
}

static void *arena_alloc(struct walk *w, size_t n, size_t size)
{
    if (n == 0)
        return NULL;
    /* n is bounded by prescan (<= payload bytes), size is small: no overflow */
    return msgpack_zone_malloc(&w->d->zone, n * size);
}

static void fail_event(struct walk *w, const char *why)
{
    if (!w->err)
        w->err = why;
}

static void get_hash(struct walk *w, const msgpack_object *o, struct kvb_hash *h)
{
    memset(h, 0, sizeof(*h));
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        h->kind = KVB_HASH_UINT;
        h->v.u = o->via.u64;
        break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        h->kind = KVB_HASH_INT;
        h->v.i = o->via.i64;
        break;
    case MSGPACK_OBJECT_BIN:
        h->kind = KVB_HASH_BIN;
        h->bin_len = o->via.bin.size;
        h->v.bin = (const uint8_t *)o->via.bin.ptr;
        break;
    default: fail_event(w, "block hash is not an integer or bin");
    }
}

static void get_opt_hash(struct walk *w, const msgpack_object *o, struct kvb_hash *h)
{
    if (o->type == MSGPACK_OBJECT_NIL)
        memset(h, 0, sizeof(*h));
    else
        get_hash(w, o, h);
}

static void get_hashes(struct walk *w, const msgpack_object *o, struct kvb_event *ev)
{
    if (o->type != MSGPACK_OBJECT_ARRAY) {
        fail_event(w, "block_hashes is not an array");
        return;
    }
    uint32_t n = o->via.array.size;
    if (n > w->d->lim.max_hashes) {
        fail_event(w, "too many block hashes");
        return;
    }
    struct kvb_hash *hs = arena_alloc(w, n, sizeof(*hs));
    if (n && !hs) {
        fail_event(w, "out of memory");
        return;
    }
    for (uint32_t i = 0; i < n; i++)
        get_hash(w, &o->via.array.ptr[i], &hs[i]);
    ev->hashes = hs;
    ev->n_hashes = n;
}

static bool is_int(const msgpack_object *o)
{
    return o->type == MSGPACK_OBJECT_POSITIVE_INTEGER || o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER;
}

/* One token id: a non-negative integer that fits in 32 bits. */
static bool get_token(struct walk *w, const msgpack_object *o, uint32_t *t)
{
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
        fail_event(w, is_int(o) ? "token id is negative" : "token id is not an integer");
        return false;
    }
    if (o->via.u64 > UINT32_MAX) {
        fail_event(w, "token id exceeds 32 bits");
        return false;
    }
    *t = (uint32_t)o->via.u64;
    return true;
}

/* Speculative-decoding (EAGLE) bigrams: every element an [a, b] pair.  Flattened
 * as Dynamo's normalize_token_ids() does: the first id of each pair, then the
 * second id of the last pair (n pairs -> n + 1 ids). */
static void get_token_pairs(struct walk *w, const msgpack_object_array *a, struct kvb_event *ev)
{
    uint32_t n = a->size;
    if ((uint64_t)n + 1 > w->d->lim.max_tokens) {
        fail_event(w, "too many token ids");
        return;
    }
    uint32_t *t = arena_alloc(w, (size_t)n + 1, sizeof(*t));
    if (!t) {
        fail_event(w, "out of memory");
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *e = &a->ptr[i];
        if (e->type != MSGPACK_OBJECT_ARRAY || e->via.array.size != 2) {
            fail_event(w, "token_ids mixes ids and pairs, or a pair is not [a, b]");
            return;
        }
        uint32_t second;
        if (!get_token(w, &e->via.array.ptr[0], &t[i]) ||
            !get_token(w, &e->via.array.ptr[1], &second))
            return;
        if (i == n - 1)
            t[n] = second;
    }
    ev->token_pairs = true;
    ev->n_pairs = n;
    ev->tokens = t;
    ev->n_tokens = n + 1;
}

static void get_tokens(struct walk *w, const msgpack_object *o, struct kvb_event *ev)
{
    if (o->type == MSGPACK_OBJECT_NIL)
        return;
    if (o->type != MSGPACK_OBJECT_ARRAY) {
        fail_event(w, "token_ids is not an array");
        return;
    }
    uint32_t n = o->via.array.size;
    if (n > w->d->lim.max_tokens) {
        fail_event(w, "too many token ids");
        return;
    }
    const msgpack_object *a = o->via.array.ptr;
    if (n > 0 && a[0].type == MSGPACK_OBJECT_ARRAY) {
        get_token_pairs(w, &o->via.array, ev);
        return;
    }
    uint32_t *t = arena_alloc(w, n, sizeof(*t));
    if (n && !t) {
        fail_event(w, "out of memory");
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (a[i].type == MSGPACK_OBJECT_ARRAY) {
            fail_event(w, "token_ids mixes ids and pairs, or a pair is not [a, b]");
            return;
        }
        if (!get_token(w, &a[i], &t[i]))
            return;
    }
    ev->tokens = t;
    ev->n_tokens = n;
}

static void get_opt_int(struct walk *w, const msgpack_object *o, struct kvb_opt_int *v,
                        const char *what)
{
    v->has = false;
    if (o->type == MSGPACK_OBJECT_NIL)
        return;
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        v->has = true;
        v->v = o->via.i64;
    } else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT64_MAX) {
        v->has = true;
        v->v = (int64_t)o->via.u64;
    } else {
        fail_event(w, what);
    }
}

static void get_opt_str(struct walk *w, const msgpack_object *o, struct kvb_str *s,
                        const char *what)
{
    s->ptr = NULL;
    s->len = 0;
    if (o->type == MSGPACK_OBJECT_NIL)
        return;
    if (o->type != MSGPACK_OBJECT_STR) {
        fail_event(w, what);
        return;
    }
    if (!kvb_utf8_valid(o->via.str.ptr, o->via.str.size)) {
        fail_event(w, "string is not valid UTF-8");
        return;
    }
    s->ptr = o->via.str.size ? o->via.str.ptr : "";
    s->len = o->via.str.size;
}

/* locality, ownership: nil is absent; a value that is not a string is
 * present but names nothing known (""), so the event is dropped by the rule
 * (non_local_locality, unknown_ownership), not refused as malformed. */
static void get_tag_str(struct walk *w, const msgpack_object *o, struct kvb_str *s)
{
    if (o->type != MSGPACK_OBJECT_NIL && o->type != MSGPACK_OBJECT_STR) {
        s->ptr = "";
        s->len = 0;
        return;
    }
    get_opt_str(w, o, s, "not a string");
}

/* lora_name: a string, or (SGLang, index 7) a metadata map {"cache_salt":..}. */
static void get_lora_or_meta(struct walk *w, const msgpack_object *o, struct kvb_event *ev)
{
    if (o->type != MSGPACK_OBJECT_MAP) {
        get_opt_str(w, o, &ev->lora_name, "lora_name is not a string");
        return;
    }
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[i];
        if (str_eq(&kv->key, "cache_salt"))
            get_opt_str(w, &kv->val, &ev->cache_salt, "cache_salt is not a string");
        else if (str_eq(&kv->key, "lora_name"))
            get_opt_str(w, &kv->val, &ev->lora_name, "lora_name is not a string");
    }
}

/* A string-bearing extra_keys item: a str, or [str, int] (vLLM >= 0.19's
 * multimodal identifier with its block-relative offset).  Anything else is not
 * ours to judge (bin prompt-embedding digests, numbers): skipped. */
static bool extra_key_item(const msgpack_object *o, struct kvb_extra_key *k)
{
    const msgpack_object *s = o;
    bool off = false;
    if (o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size == 2 && is_int(&o->via.array.ptr[1])) {
        s = &o->via.array.ptr[0];
        off = true;
    }
    if (s->type != MSGPACK_OBJECT_STR || !kvb_utf8_valid(s->via.str.ptr, s->via.str.size))
        return false;
    if (k) {
        k->s.ptr = s->via.str.size ? s->via.str.ptr : "";
        k->s.len = s->via.str.size;
        k->with_offset = off;
    }
    return true;
}

/* extra_keys: nil, or one entry per block, each nil or an array of items. */
static void get_extra_keys(struct walk *w, const msgpack_object *o, struct kvb_event *ev)
{
    if (o->type == MSGPACK_OBJECT_NIL)
        return;
    if (o->type != MSGPACK_OBJECT_ARRAY) {
        fail_event(w, "extra_keys is not an array");
        return;
    }
    const msgpack_object_array *blocks = &o->via.array;
    size_t count = 0;
    for (uint32_t i = 0; i < blocks->size; i++) {
        const msgpack_object *b = &blocks->ptr[i];
        if (b->type != MSGPACK_OBJECT_ARRAY)
            continue;
        for (uint32_t j = 0; j < b->via.array.size; j++)
            count += extra_key_item(&b->via.array.ptr[j], NULL);
    }
    if (count == 0)
        return;
    struct kvb_extra_key *keys = arena_alloc(w, count, sizeof(*keys));
    uint32_t *off = arena_alloc(w, (size_t)blocks->size + 1, sizeof(*off));
    if (!keys || !off) {
        fail_event(w, "out of memory");
        return;
    }
    uint32_t k = 0;
    for (uint32_t i = 0; i < blocks->size; i++) {
        off[i] = k;
        const msgpack_object *b = &blocks->ptr[i];
        if (b->type != MSGPACK_OBJECT_ARRAY)
            continue;
        for (uint32_t j = 0; j < b->via.array.size; j++)
            k += extra_key_item(&b->via.array.ptr[j], &keys[k]);
    }
    off[blocks->size] = k;
    ev->xkeys = keys;
    ev->xkey_off = off;
    ev->n_xkey_blocks = blocks->size;
}

/* Field table: name (map key), position in the BlockStored array, position in
 * the BlockRemoved array (0 = not a field of that type), and the setter. */
enum field_id {
    F_HASHES,
    F_PARENT,
    F_TOKENS,
    F_BLOCK_SIZE,
    F_LORA_ID,
    F_MEDIUM,
    F_LORA_NAME,
    F_EXTRA_KEYS,
    F_GROUP_IDX,
    F_SPEC_KIND,
    F_SLIDING_WINDOW,
    F_LOCALITY,
    F_OWNERSHIP,
};

static const struct field {
    const char *key;
    uint8_t stored_pos;
    uint8_t removed_pos;
} fields[] = {
    [F_HASHES] = {"block_hashes", 1, 1},
    [F_PARENT] = {"parent_block_hash", 2, 0},
    [F_TOKENS] = {"token_ids", 3, 0},
    [F_BLOCK_SIZE] = {"block_size", 4, 0},
    [F_LORA_ID] = {"lora_id", 5, 0},
    [F_MEDIUM] = {"medium", 6, 2},
    [F_LORA_NAME] = {"lora_name", 7, 0},
    [F_EXTRA_KEYS] = {"extra_keys", 8, 0},
    [F_GROUP_IDX] = {"group_idx", 9, 3},
    [F_SPEC_KIND] = {"kv_cache_spec_kind", 10, 4},
    [F_SLIDING_WINDOW] = {"kv_cache_spec_sliding_window", 11, 5},
    /* vLLM 0.26+ appends them after the group metadata (Dynamo's
     * zmq_wire/deserialize.rs reads them only when the whole tail is there) */
    [F_LOCALITY] = {"locality", 12, 6},
    [F_OWNERSHIP] = {"ownership", 13, 7},
};
#define N_FIELDS (sizeof(fields) / sizeof(fields[0]))

static void set_field(struct walk *w, enum field_id f, const msgpack_object *o,
                      struct kvb_event *ev)
{
    switch (f) {
    case F_HASHES: get_hashes(w, o, ev); break;
    case F_PARENT: get_opt_hash(w, o, &ev->parent); break;
    case F_TOKENS: get_tokens(w, o, ev); break;
    case F_BLOCK_SIZE:
        get_opt_int(w, o, &ev->block_size, "block_size is not an integer");
        if (ev->block_size.has && ev->block_size.v < 0)
            fail_event(w, "block_size is negative");
        break;
    case F_LORA_ID: get_opt_int(w, o, &ev->lora_id, "lora_id is not an integer"); break;
    case F_MEDIUM: get_opt_str(w, o, &ev->medium, "medium is not a string"); break;
    case F_LORA_NAME: get_lora_or_meta(w, o, ev); break;
    case F_EXTRA_KEYS: get_extra_keys(w, o, ev); break;
    case F_GROUP_IDX: get_opt_int(w, o, &ev->group_idx, "group_idx is not an integer"); break;
    case F_SPEC_KIND:
        /* a short BlockRemoved array may carry the window where the kind goes */
        if (ev->type == KVB_EV_REMOVED && o->type != MSGPACK_OBJECT_STR)
            break;
        get_opt_str(w, o, &ev->spec_kind, "kv_cache_spec_kind is not a string");
        break;
    case F_LOCALITY: get_tag_str(w, o, &ev->locality); break;
    case F_OWNERSHIP: get_tag_str(w, o, &ev->ownership); break;
    case F_SLIDING_WINDOW:
        if (ev->type == KVB_EV_REMOVED && o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
            break;
        get_opt_int(w, o, &ev->sliding_window, "sliding window is not an integer");
        break;
    }
}

static void set_type(struct walk *w, const msgpack_object *tag, struct kvb_event *ev)
{
    if (tag->type != MSGPACK_OBJECT_STR) {
        fail_event(w, "type tag is not a string");
        return;
    }
    if (!kvb_utf8_valid(tag->via.str.ptr, tag->via.str.size)) {
        fail_event(w, "type tag is not valid UTF-8");
        return;
    }
    ev->tag.ptr = tag->via.str.size ? tag->via.str.ptr : "";
    ev->tag.len = tag->via.str.size;
    if (str_eq(tag, "BlockStored"))
        ev->type = KVB_EV_STORED;
    else if (str_eq(tag, "BlockRemoved"))
        ev->type = KVB_EV_REMOVED;
    else if (str_eq(tag, "AllBlocksCleared"))
        ev->type = KVB_EV_CLEARED;
    else if (str_eq(tag, "TierBlocksCleared"))
        ev->type = KVB_EV_TIER_CLEARED;
    else if (str_eq(tag, "Ignored"))
        ev->type = KVB_EV_IGNORED;
    else
        ev->type = KVB_EV_UNKNOWN;
}

static int field_pos(enum field_id f, uint8_t type)
{
    return type == KVB_EV_STORED    ? fields[f].stored_pos
           : type == KVB_EV_REMOVED ? fields[f].removed_pos
                                    : 0;
}

/* Events that carry no blocks: nothing past their tag, ownership and medium. */
static bool is_clear_or_tag_only(uint8_t type)
{
    return type == KVB_EV_UNKNOWN || type == KVB_EV_CLEARED || type == KVB_EV_TIER_CLEARED ||
           type == KVB_EV_IGNORED;
}

/* TierBlocksCleared names the tier it empties: without a medium it cannot
 * be applied (Dynamo's RawKvEvent::TierBlocksCleared requires one). */
static void tier_clear_medium(struct walk *w, const struct kvb_event *ev)
{
    if (!w->err && !ev->medium.ptr)
        fail_event(w, "TierBlocksCleared has no medium");
}

static void decode_positional(struct walk *w, const msgpack_object_array *a, struct kvb_event *ev)
{
    if (a->size == 0) {
        fail_event(w, "empty event array");
        return;
    }
    set_type(w, &a->ptr[0], ev);
    if (!w->err && ev->type == KVB_EV_CLEARED && a->size >= 2)
        get_tag_str(w, &a->ptr[1], &ev->ownership);
    if (!w->err && ev->type == KVB_EV_TIER_CLEARED) {
        if (a->size >= 2)
            get_opt_str(w, &a->ptr[1], &ev->medium, "medium is not a string");
        if (!w->err && a->size >= 3)
            get_tag_str(w, &a->ptr[2], &ev->ownership);
        tier_clear_medium(w, ev);
    }
    if (w->err || is_clear_or_tag_only(ev->type))
        return;
    if (a->size < 2) {
        fail_event(w, "event has no block_hashes");
        return;
    }
    /* Missing trailing positions are nil; extra positions are ignored. */
    for (size_t f = 0; f < N_FIELDS; f++) {
        int pos = field_pos((enum field_id)f, ev->type);
        if (pos > 0 && (uint32_t)pos < a->size)
            set_field(w, (enum field_id)f, &a->ptr[pos], ev);
    }
}

static void decode_map(struct walk *w, const msgpack_object_map *m, struct kvb_event *ev)
{
    const msgpack_object *tag = NULL;
    for (uint32_t i = 0; i < m->size; i++)
        if (str_eq(&m->ptr[i].key, "type"))
            tag = &m->ptr[i].val;
    if (!tag) {
        fail_event(w, "event map has no type");
        return;
    }
    set_type(w, tag, ev);
    if (!w->err && (ev->type == KVB_EV_CLEARED || ev->type == KVB_EV_TIER_CLEARED)) {
        for (uint32_t i = 0; i < m->size && !w->err; i++)
            if (str_eq(&m->ptr[i].key, "ownership"))
                get_tag_str(w, &m->ptr[i].val, &ev->ownership);
            else if (str_eq(&m->ptr[i].key, "medium"))
                get_opt_str(w, &m->ptr[i].val, &ev->medium, "medium is not a string");
        if (ev->type == KVB_EV_TIER_CLEARED)
            tier_clear_medium(w, ev);
    }
    if (w->err || is_clear_or_tag_only(ev->type))
        return;
    bool have_hashes = false;
    for (uint32_t i = 0; i < m->size; i++) {
        const msgpack_object *k = &m->ptr[i].key;
        if (k->type != MSGPACK_OBJECT_STR)
            continue; /* unknown keys of any kind are ignored */
        if (ev->type == KVB_EV_STORED && str_eq(k, "cache_salt")) {
            /* map form only (Dynamo reads it as the cache namespace) */
            get_opt_str(w, &m->ptr[i].val, &ev->cache_salt, "cache_salt is not a string");
            continue;
        }
        for (size_t f = 0; f < N_FIELDS; f++) {
            if (field_pos((enum field_id)f, ev->type) > 0 && str_eq(k, fields[f].key)) {
                set_field(w, (enum field_id)f, &m->ptr[i].val, ev);
                have_hashes |= f == F_HASHES;
                break;
            }
        }
    }
    if (!have_hashes)
        fail_event(w, "event has no block_hashes");
}

static void decode_event(struct walk *w, const msgpack_object *o, struct kvb_event *ev)
{
    memset(ev, 0, sizeof(*ev));
    w->err = NULL;
    if (o->type == MSGPACK_OBJECT_ARRAY)
        decode_positional(w, &o->via.array, ev);
    else if (o->type == MSGPACK_OBJECT_MAP)
        decode_map(w, &o->via.map, ev);
    else
        fail_event(w, "event is neither an array nor a map");
    if (w->err) {
        struct kvb_str tag = ev->tag;
        memset(ev, 0, sizeof(*ev));
        ev->type = KVB_EV_MALFORMED;
        ev->error = w->err;
        ev->tag = tag;
    }
}

static bool is_number(const msgpack_object *o)
{
    return is_int(o) || o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64;
}

static double number_value(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER: return (double)o->via.u64;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return (double)o->via.i64;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return o->via.f64;
    default: return 0;
    }
}

int kvb_decode_batch(struct kvb_decoder *d, const uint8_t *payload, size_t len,
                     struct kvb_batch *out)
{
    if (len == 0)
        return KVB_DEC_EMPTY;
    size_t used = 0;
    int rc = prescan(payload, len, d->lim.max_depth, d->max_items, &used);
    if (rc < 0)
        return rc;
    if (used != len)
        return KVB_DEC_TRAILING;

    msgpack_zone_clear(&d->zone);
    msgpack_object root;
    size_t off = 0;
    switch (msgpack_unpack((const char *)payload, len, &off, &d->zone, &root)) {
    case MSGPACK_UNPACK_SUCCESS: break;
    case MSGPACK_UNPACK_NOMEM_ERROR: return KVB_DEC_NOMEM;
    case MSGPACK_UNPACK_CONTINUE: return KVB_DEC_TRUNCATED;
    default: return KVB_DEC_BAD_MSGPACK; /* prescan should have caught it */
    }

    const msgpack_object *ts = NULL, *events = NULL, *dp = NULL;
    if (root.type == MSGPACK_OBJECT_ARRAY) {
        const msgpack_object_array *a = &root.via.array;
        if (a->size < 2)
            return KVB_DEC_ENVELOPE;
        ts = &a->ptr[0];
        events = &a->ptr[1];
        dp = a->size >= 3 ? &a->ptr[2] : NULL; /* extra trailing elements: ignored */
    } else if (root.type == MSGPACK_OBJECT_MAP) {
        const msgpack_object_map *m = &root.via.map;
        for (uint32_t i = 0; i < m->size; i++) {
            const msgpack_object_kv *kv = &m->ptr[i];
            if (str_eq(&kv->key, "ts"))
                ts = &kv->val;
            else if (str_eq(&kv->key, "events"))
                events = &kv->val;
            else if (str_eq(&kv->key, "data_parallel_rank"))
                dp = &kv->val;
        }
        if (!events)
            return KVB_DEC_ENVELOPE;
    } else {
        return KVB_DEC_ENVELOPE;
    }
    if (ts && !is_number(ts) && ts->type != MSGPACK_OBJECT_NIL)
        return KVB_DEC_ENVELOPE;
    if (events->type != MSGPACK_OBJECT_ARRAY)
        return KVB_DEC_ENVELOPE;
    struct kvb_opt_int rank = {false, 0};
    if (dp && dp->type != MSGPACK_OBJECT_NIL) {
        if (dp->type != MSGPACK_OBJECT_POSITIVE_INTEGER || dp->via.u64 > UINT32_MAX)
            return KVB_DEC_ENVELOPE;
        rank.has = true;
        rank.v = (int64_t)dp->via.u64;
    }
    uint32_t n = events->via.array.size;
    if (n > d->lim.max_events)
        return KVB_DEC_TOO_LARGE;

    struct walk w = {.d = d, .err = NULL};
    struct kvb_event *evs = arena_alloc(&w, n, sizeof(*evs));
    if (n && !evs)
        return KVB_DEC_NOMEM;
    for (uint32_t i = 0; i < n; i++)
        decode_event(&w, &events->via.array.ptr[i], &evs[i]);

    out->ts = ts ? number_value(ts) : 0.0;
    out->dp_rank = rank;
    out->events = evs;
    out->n_events = n;
    return 0;
}
