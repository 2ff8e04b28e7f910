/* convert: decoded engine events -> router events (docs/router-events.md 3-5).
 *
 * Pure: no I/O, no clock, no globals.  The converter holds the configuration
 * and the event_id counters, one per (worker_id, dp_rank); it writes its
 * counters to the kvb_metrics the caller hands it (single writer).
 *
 * Ownership: kvb_converter_create() returns a converter the caller frees with
 * kvb_converter_destroy(&c).  A kvb_rev filled by kvb_convert_event() or
 * kvb_convert_cleared() points into the converter's scratch buffer and into
 * the decoded batch: valid until the next convert call.
 */
#ifndef KVB_CONVERT_H
#define KVB_CONVERT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "decode.h"
#include "metrics.h"

#define KVB_TOKENS_HASH_SEED 1337u
#define KVB_MAX_ID_COUNTERS 4096 /* distinct (worker_id, dp_rank) pairs */

#define KVB_CACHE_SALT_PREFIX "dynamo-cache-salt:" /* Dynamo's tag in vLLM extra_keys */

struct kvb_convert_cfg {
    uint64_t worker_id;
    uint32_t block_size; /* 0 = auto: trust each event's block_size */
    bool lora_salt;
    uint32_t forward_tiers; /* bitmask of (1u << enum kvb_tier) */
    /* Cache namespace salt for events that carry none of their own (NULL or ""
     * = none).  Borrowed only during kvb_converter_create/set_config: the
     * converter keeps its hash, not the pointer. */
    const char *cache_namespace;
    /* lora_id -> adapter name (kvb_lora_name_of()); borrowed: it must
     * outlive the converter's use of this configuration. */
    const struct kvb_lora_name_cfg *lora_names;
    size_t n_lora_names;
    /* limits.max_tracked_blocks: copies and cache namespaces the converter
     * remembers (docs/router-events.md section 8); 0 = none */
    uint64_t max_tracked;
    /* The model's image token (sources[].image_token_id): a block with mm
     * hashes is hashed with its runs of it pad-substituted (mm.h); 0 = off. */
    uint32_t image_token_id;
    /* The model's video token (sources[].video_token_id): with it set, runs
     * are mapped to mm hashes by modality (mm.h); 0 = off. */
    uint32_t video_token_id;
};

/* The worker a stream's events belong to (a source's or a topic's, issue
 * 17): what kvb_converter_select() switches between.  The converter's
 * configuration gives the defaults. */
struct kvb_worker_cfg {
    uint64_t worker_id;
    uint32_t block_size; /* 0 = auto */
    bool lora_salt;
    uint32_t forward_tiers; /* bitmask of (1u << enum kvb_tier) */
    /* sources[].lora_names (kvb_lora_name_of()); borrowed from the
     * configuration, like the worker itself: NULL when none. */
    const struct kvb_lora_name_cfg *lora_names;
    size_t n_lora_names;
    uint32_t image_token_id; /* 0 = off (kvb_convert_cfg) */
    uint32_t video_token_id; /* 0 = off (kvb_convert_cfg) */
};

/* Where a stored event's LoRA adapter name comes from (its salt). */
enum kvb_lora_of {
    KVB_LORA_NONE = 0, /* no LoRA: neither lora_name nor lora_id */
    KVB_LORA_NAMED,    /* its lora_name, or the name lora_names gives its lora_id */
    KVB_LORA_UNMAPPED, /* a lora_id without lora_name that lora_names does not list:
                        * published without the LoRA salt */
};

struct kvb_block {
    uint64_t block_hash;
    uint64_t tokens_hash;
};

/* One router event. */
struct kvb_rev {
    uint8_t type; /* enum kvb_revt_label: STORED, REMOVED, CLEARED */
    uint8_t tier; /* enum kvb_tier */
    uint32_t dp_rank;
    uint64_t worker_id;
    uint64_t event_id;
    uint64_t epoch; /* of the event_id counter (struct kvb_id_counter) */
    bool has_parent;
    uint64_t parent;
    const struct kvb_block *blocks; /* STORED */
    const uint64_t *hashes;         /* REMOVED */
    uint32_t n;                     /* blocks or hashes */
    /* STORED, multimodal objects (mm_extra_info): block i's are
     * mm_hashes[mm_off[i] .. mm_off[i+1]), in extra_keys order.  n_mm == 0
     * (no block has any): both NULL. */
    const uint64_t *mm_hashes;
    const uint32_t *mm_off; /* n + 1 entries */
    uint32_t n_mm;
    /* Published from the residency mirror to repair what consumers lost
     * (docs/router-events.md section 6): a "cleared" that starts a repair,
     * or a stored event of the pair's resident blocks.  The mirror records
     * it without applying it: its own view is already the engine's. */
    bool repair;
    /* CLEARED: only `tier` of the pair is emptied (the engine's
     * TierBlocksCleared); false: every tier (AllBlocksCleared, barriers). */
    bool scoped;
};

struct kvb_converter;

int kvb_converter_create(const struct kvb_convert_cfg *cfg, struct kvb_metrics *m,
                         struct kvb_converter **out);
void kvb_converter_destroy(struct kvb_converter **c);

/* Replace the configuration (SIGHUP).  Counters are kept: they are keyed by
 * (worker_id, dp_rank), so a new worker_id starts its own from 0. */
void kvb_converter_set_config(struct kvb_converter *c, const struct kvb_convert_cfg *cfg);

/* The worker the next events and barriers are converted for, until the
 * next select or set_config (which selects the configuration's own). */
void kvb_converter_select(struct kvb_converter *c, const struct kvb_worker_cfg *w);
/* The configuration's worker (the defaults). */
struct kvb_worker_cfg kvb_convert_cfg_worker(const struct kvb_convert_cfg *cfg);
/* An event_id counter exists for (worker, rank): something was published
 * for the pair (or its counter was restored). */
bool kvb_converter_has_counter(const struct kvb_converter *c, uint64_t worker, uint32_t rank);

/* The router forgets (worker, dp_rank) (a "cleared" that is not a repair):
 * the converter forgets the pair's copies and cache namespaces too. */
void kvb_converter_forget(struct kvb_converter *c, uint32_t dp_rank);
/* The block tracker was full since the last call (limits.max_tracked_blocks):
 * it is emptied now, counted, and true is returned; the caller then publishes
 * "cleared" for every pair (kvb_converter_counters()) so that the router
 * forgets what the tracker no longer knows. */
bool kvb_converter_take_overflow(struct kvb_converter *c);

/* Convert one decoded event.  Returns 1 and fills *out when a router event is
 * to be published (its event_id is taken), 0 when the event publishes nothing
 * (*reason says why: enum kvb_drop_reason; it was counted), or -ENOMEM /
 * -ENOSPC (too many counters). */
int kvb_convert_event(struct kvb_converter *c, const struct kvb_event *ev, uint32_t dp_rank,
                      struct kvb_rev *out, int *reason);

/* A "cleared" router event for dp_rank (barriers).  Returns 1, or -ENOSPC. */
int kvb_convert_cleared(struct kvb_converter *c, uint32_t dp_rank, struct kvb_rev *out);

/* A router event made elsewhere (a repair's stored event, from the residency
 * mirror) takes the next event_id of (the selected worker, dp_rank): sets
 * its worker_id, dp_rank, event_id and epoch, counts it as published, and
 * clears its repair flag.  Returns 1, or -ENOSPC (too many counters). */
int kvb_convert_stamp(struct kvb_converter *c, uint32_t dp_rank, struct kvb_rev *r);

/* What this run published for (worker_id, dp_rank): nothing yet
 * (KVB_PAIR_NONE), a "cleared" last (KVB_PAIR_CLEAN: the router holds nothing
 * of the pair, a barrier now would say nothing new), or events since its last
 * "cleared" (KVB_PAIR_DIRTY). */
enum { KVB_PAIR_NONE, KVB_PAIR_CLEAN, KVB_PAIR_DIRTY };
int kvb_convert_pair_state(const struct kvb_converter *c, uint32_t dp_rank);

/* R (the last event kvb_convert_event() returned for its pair) is not
 * published on its own (nats.coalesce merged it into the event before): its
 * event_id goes back to the pair's counter, and it is not counted as
 * published.  Nothing when R's id is not the pair's last. */
void kvb_convert_give_back(struct kvb_converter *c, const struct kvb_rev *r);

/* event_id counters, for persistence (reliability): next id and epoch. */
struct kvb_id_counter {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint64_t next_id;
    uint64_t epoch;
};
/* Epoch given to counters created from now on (the caller's wall clock, ms). */
void kvb_converter_set_epoch(struct kvb_converter *c, uint64_t epoch_ms);
size_t kvb_converter_counters(const struct kvb_converter *c, struct kvb_id_counter *out,
                              size_t cap);
int kvb_converter_restore(struct kvb_converter *c, const struct kvb_id_counter *in);

/* One entry of the block tracker (docs/router-events.md section 8), for
 * persistence: saved with the counters, so that a resumed restart decides
 * as if there had been none.  KIND: group's learned kind (val, enum
 * kvb_kind); COPY: (tier, hash) held by the groups of bitmask val; NS: the
 * cache namespace term val of hash, state 1 set or 2 ambiguous, tier the
 * set of tiers that stored it (bit 1 << enum kvb_tier; 0: none noted). */
enum { KVB_TREC_KIND = 1, KVB_TREC_COPY, KVB_TREC_NS };
struct kvb_track_rec {
    uint64_t worker_id, hash, val;
    int64_t group;
    uint32_t dp_rank;
    uint8_t what, tier, state;
};
/* Every tracker entry to cb (kinds first), in no particular order. */
void kvb_converter_track_foreach(const struct kvb_converter *c,
                                 void (*cb)(void *ctx, const struct kvb_track_rec *r), void *ctx);
/* Put a saved entry back.  -EINVAL for a malformed one; -ENOSPC when the
 * tracker is full (limits.max_tracked_blocks lowered since): the tracker
 * is then marked full, and the next kvb_converter_take_overflow() empties it
 * and asks for barriers, as when it fills up at run time. */
int kvb_converter_track_restore(struct kvb_converter *c, const struct kvb_track_rec *r);

/* The adapter name the salt of stored event EV takes: its lora_name, else
 * the name NAMES[0..N) give its lora_id (TensorRT-LLM sends only the id);
 * *name is set for KVB_LORA_NAMED.  Returns enum kvb_lora_of. */
int kvb_lora_name_of(const struct kvb_lora_name_cfg *names, size_t n, const struct kvb_event *ev,
                     struct kvb_str *name);

/* Building blocks, exposed for tests and tools. */
uint64_t kvb_hash_normalize(const struct kvb_hash *h);
uint64_t kvb_lora_seed(const char *name, size_t len);
/* Dynamo's salt (kv-hashing compute_salt_hash): 1337 + XXH3_64(lora, seed 0)
 * + XXH3_64(cache_namespace, seed 1), wrapping; an empty string is absent. */
uint64_t kvb_salt_seed(const char *lora, size_t lora_len, const char *ns, size_t ns_len);
uint64_t kvb_tokens_hash(const uint32_t *tokens, size_t n, uint64_t seed);
/* The tokens as u32-LE followed by the (already sorted) multimodal hashes as
 * u64-LE, hashed with XXH3_64 and seed.  n_mm == 0: kvb_tokens_hash(). */
uint64_t kvb_tokens_mm_hash(const uint32_t *tokens, size_t n, const uint64_t *mm, size_t n_mm,
                            uint64_t seed);
/* A multimodal identifier's routing hash: a 64-hex-digit identifier gives the
 * u64 of its first 16 digits.  When with_offset (vLLM's [identifier, offset]
 * items) any other non-empty identifier gives XXH3_64(bytes, seed 0); a bare
 * string that is not 64 hex digits is no multimodal identifier.  Returns false
 * when id is none. */
bool kvb_mm_identifier_hash(const struct kvb_str *id, bool with_offset, uint64_t *out);
/* Tier from a medium string (case-insensitive); *unknown set when not known. */
int kvb_tier_from_medium(const struct kvb_str *medium, bool *unknown);

#endif
