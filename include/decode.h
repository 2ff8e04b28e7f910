/* decode: one engine msgpack batch -> typed views (docs/engine-events.md 2-4).
 *
 * Pure: bytes in, structs out; no I/O, no clock, no globals.
 *
 * Ownership: a kvb_decoder owns one arena (a msgpack zone) that is reset at the
 * start of every kvb_decode_batch() call.  The kvb_batch it fills, and every
 * pointer inside it, stays valid until the next kvb_decode_batch() on the same
 * decoder or kvb_decoder_destroy().  Strings and bin hashes are views into the
 * caller's payload: the payload must outlive the batch as well.
 */
#ifndef KVB_DECODE_H
#define KVB_DECODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Error codes for a whole batch (negative, errno-style values are not used
 * here because they name input faults, not system faults). */
enum kvb_decode_err {
    KVB_DEC_OK = 0,
    KVB_DEC_EMPTY = -1,       /* zero-length payload */
    KVB_DEC_TRUNCATED = -2,   /* the payload ends before the object does: cut
                                 short, or a declared length (array, map, str,
                                 bin, ext) larger than the bytes left */
    KVB_DEC_BAD_MSGPACK = -3, /* reserved byte (0xc1) or otherwise unparsable */
    KVB_DEC_TRAILING = -4,    /* bytes after the batch object */
    KVB_DEC_TOO_DEEP = -5,    /* nesting beyond the limit */
    KVB_DEC_TOO_LARGE = -6,   /* more events than limits.max_events, or an array
                                 or map longer than the largest limit (refused
                                 before anything is allocated for it) */
    KVB_DEC_ENVELOPE = -7,    /* not [ts, events(, dp_rank)] nor the map form */
    KVB_DEC_NOMEM = -8,       /* the arena could not grow */
};

/* Per-event decode outcome, for events inside a good batch. */
enum kvb_event_type {
    KVB_EV_STORED = 0,
    KVB_EV_REMOVED,
    KVB_EV_CLEARED,
    KVB_EV_TIER_CLEARED, /* vLLM's TierBlocksCleared: one tier (its medium) emptied */
    KVB_EV_IGNORED,      /* vLLM's "Ignored" tag: decoded, then dropped (ignored_event) */
    KVB_EV_UNKNOWN,      /* valid tag we do not know: skipped, counted */
    KVB_EV_MALFORMED,    /* wrong shape or field type: skipped, counted */
};

enum kvb_hash_kind { KVB_HASH_NIL = 0, KVB_HASH_UINT, KVB_HASH_INT, KVB_HASH_BIN };

/* One engine block hash exactly as sent. */
struct kvb_hash {
    uint8_t kind;     /* enum kvb_hash_kind */
    uint32_t bin_len; /* KVB_HASH_BIN: number of bytes */
    union {
        uint64_t u;         /* KVB_HASH_UINT */
        int64_t i;          /* KVB_HASH_INT (msgpack negative int) */
        const uint8_t *bin; /* KVB_HASH_BIN: view into the payload */
    } v;
};

/* A string view (UTF-8 checked, not NUL-terminated). ptr == NULL: absent/nil. */
struct kvb_str {
    const char *ptr;
    uint32_t len;
};

/* One string-bearing item of a block's vLLM extra_keys entry: a bare string
 * (LoRA name, cache salt, or a legacy 64-hex-digit multimodal identifier) or,
 * vLLM >= 0.19, a multimodal identifier with its block-relative offset
 * ([identifier, offset]).  Other item kinds (bin prompt-embedding digests,
 * numbers, ...) are not kept. */
struct kvb_extra_key {
    struct kvb_str s;
    bool with_offset;
};

/* Optional integer: has == false when absent or nil. */
struct kvb_opt_int {
    bool has;
    int64_t v;
};

struct kvb_event {
    uint8_t type;       /* enum kvb_event_type */
    const char *error;  /* KVB_EV_MALFORMED: static description */
    struct kvb_str tag; /* type tag as sent (UNKNOWN/MALFORMED may have it) */

    /* BlockStored and BlockRemoved */
    const struct kvb_hash *hashes;
    uint32_t n_hashes;
    /* Also TierBlocksCleared's (required), and AllBlocksCleared's map key
     * "medium" (an AllBlocksCleared that names one is dropped as
     * ambiguous_scoped_clear). */
    struct kvb_str medium;
    struct kvb_opt_int group_idx;
    struct kvb_str spec_kind; /* kv_cache_spec_kind (removes: map key, or the string
                                 after group_idx in the array) */
    /* vLLM 0.26+: "LOCAL", "REMOTE", ... (absent: local), and who owns the
     * block (absent: the framework; "kvcr", ...).  Also AllBlocksCleared's
     * ownership (array index 1, or the map key) and TierBlocksCleared's
     * (array index 2, or the map key). */
    struct kvb_str locality;
    struct kvb_str ownership;

    /* BlockStored only */
    struct kvb_hash parent; /* kind KVB_HASH_NIL when nil/absent */
    const uint32_t *tokens; /* token ids */
    uint32_t n_tokens;      /* number of entries in tokens */
    bool token_pairs;       /* speculative-decoding (EAGLE) [a,b] pairs, flattened
                                    as Dynamo does: each pair's first id, then the last
                                    pair's second (n_tokens = n_pairs + 1) */
    uint32_t n_pairs;       /* token_pairs: number of pairs */
    struct kvb_opt_int block_size;
    struct kvb_opt_int lora_id;
    struct kvb_str lora_name;
    struct kvb_str cache_salt; /* map key "cache_salt", or SGLang's metadata map at
                                    index 7 */
    /* extra_keys (vLLM): per block, its string-bearing items.  Block i's are
     * xkeys[xkey_off[i] .. xkey_off[i+1]); n_xkey_blocks is 0 when extra_keys
     * is nil, absent, or holds no string item at all. */
    const struct kvb_extra_key *xkeys;
    const uint32_t *xkey_off; /* n_xkey_blocks + 1 entries */
    uint32_t n_xkey_blocks;
    struct kvb_opt_int sliding_window;
};

struct kvb_batch {
    double ts; /* engine timestamp, seconds */
    struct kvb_opt_int dp_rank;
    struct kvb_event *events;
    uint32_t n_events;
};

/* Limits on untrusted input (hardening: config-driven; defaults below). */
struct kvb_decode_limits {
    uint32_t max_events; /* per batch */
    uint32_t max_hashes; /* per event */
    uint32_t max_tokens; /* per event */
    uint32_t max_depth;  /* msgpack nesting */
};
#define KVB_DECODE_LIMITS_DEFAULT \
    {                             \
        65536, 65536, 1048576, 16 \
    }

struct kvb_decoder;

/* Returns NULL on allocation failure. limits may be NULL (defaults). */
struct kvb_decoder *kvb_decoder_create(const struct kvb_decode_limits *limits);
/* Accepts NULL; sets *d to NULL. */
void kvb_decoder_destroy(struct kvb_decoder **d);

/* Decode one payload frame.  Returns 0 and fills *out, or a negative
 * enum kvb_decode_err (then *out is untouched).  Events that are malformed
 * inside a good batch are reported as KVB_EV_MALFORMED, not as an error. */
int kvb_decode_batch(struct kvb_decoder *d, const uint8_t *payload, size_t len,
                     struct kvb_batch *out);

/* Short stable name of a decode error ("truncated", ...), for logs and metrics. */
const char *kvb_decode_strerror(int err);

/* Check that [p, p+n) is valid UTF-8 (no overlongs, no surrogates). */
bool kvb_utf8_valid(const char *p, size_t n);

#endif
