/* mm: multimodal pad-value substitution (docs/router-events.md, "Image-token
 * pad substitution").
 *
 * A router configured with the model's image_token_id (Qwen-VL style) hashes
 * a block that holds images not as its tokens plus its mm hashes but as its
 * tokens with each run of image_token_id replaced by the pad value of one mm
 * hash, in order.  Used by the converter (src/pipeline/convert.c); kvsim's
 * truth (tools/kvsim.c) computes the same independently.
 *
 * Pure: no I/O, no allocation, no globals.
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

#endif
