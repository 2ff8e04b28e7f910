/* mm: multimodal pad-value substitution (docs/router-events.md, "Image-token
 * pad substitution").
 *
 * A router configured with the model's image_token_id (Qwen-VL style) hashes
 * a block that holds images not as its tokens plus its mm hashes but as its
 * tokens with each run of image_token_id replaced by the pad value of one mm
 * hash, in order.  Used by the converter (src/pipeline/convert.c); kvsim's
 * truth (tools/kvsim.c) computes the same independently.
 *
 * Pure: no I/O, no allocation, no globals (qsort/bsearch only).
 */
#ifndef KVB_MM_H
#define KVB_MM_H

#include <stddef.h>
#include <stdint.h>

#define KVB_MM_PAD_SHIFT 1000000u                 /* SGLang's pad shift */
#define KVB_MM_PAD_MASK ((UINT64_C(1) << 30) - 1) /* low 30 bits of the mm hash */

/* The pad value of one mm hash: 1000000 + (mm_hash & (2^30 - 1)). */
uint32_t kvb_mm_pad_value(uint64_t mm_hash);

/* Writes TOKENS[0..n) to OUT[0..n) with the k-th run of IMAGE_TOKEN_ID
 * replaced by kvb_mm_pad_value(MM[k]); runs beyond n_mm take the last mm
 * hash.  n_mm must be >= 1.  Returns the number of runs seen.  OUT may not
 * overlap TOKENS. */
size_t kvb_mm_pad_substitute(const uint32_t *tokens, size_t n, uint32_t image_token_id,
                             const uint64_t *mm, size_t n_mm, uint32_t *out);

/* Modality-aware substitution, used when the model has a video token
 * (sources[].video_token_id; Dynamo's substitute_pad_values()). */
enum kvb_mm_kind { KVB_MM_NONE = 0, KVB_MM_IMAGE = 1, KVB_MM_VIDEO = 2 };

/* An mm hash's kind as inferred from the event's unambiguous blocks. */
struct kvb_mm_kind_of {
    uint64_t hash;
    uint32_t kind; /* enum kvb_mm_kind */
};

/* The one kind of placeholder in TOKENS[0..n): KVB_MM_NONE when it has none,
 * or both, or IMAGE == VIDEO.  An id of 0 is not set. */
enum kvb_mm_kind kvb_mm_block_kind(const uint32_t *tokens, size_t n, uint32_t image_token_id,
                                   uint32_t video_token_id);

/* Sorts K[0..n) by hash and keeps one entry per hash, dropping every hash
 * given two kinds.  Returns the new count. */
size_t kvb_mm_kinds_finish(struct kvb_mm_kind_of *k, size_t n);

/* Writes TOKENS[0..n) to OUT[0..n) with each placeholder run replaced by
 * the pad value of its object: each image run is its own object, a video
 * run continues the object of a video run just before it.  Objects map to
 * MM[0..n_mm) in order when they are as many and agree with KINDS (from
 * kvb_mm_kinds_finish()), else to the one ordered subsequence of MM whose
 * inferred kinds match.  MAP is scratch for n entries.  Returns 0, or -1
 * when there is no single mapping (or IMAGE == VIDEO): the caller hashes
 * the block natively.  OUT may not overlap TOKENS. */
int kvb_mm_pad_substitute_aware(const uint32_t *tokens, size_t n, uint32_t image_token_id,
                                uint32_t video_token_id, const uint64_t *mm, size_t n_mm,
                                const struct kvb_mm_kind_of *kinds, size_t n_kinds, uint32_t *map,
                                uint32_t *out);

#endif
