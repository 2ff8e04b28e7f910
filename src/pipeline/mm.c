/* mm: multimodal pad-value substitution, as Dynamo's kv-router computes it
 * (lib/kv-router/src/protocols.rs pad_value_for_mm_hash(); zmq_wire/convert.rs
 * substitute_pad_values(); docs/router-events.md). */
#include "mm.h"

uint32_t kvb_mm_pad_value(uint64_t mm_hash)
{
    return (uint32_t)(KVB_MM_PAD_SHIFT + (mm_hash & KVB_MM_PAD_MASK));
}

size_t kvb_mm_pad_substitute(const uint32_t *tokens, size_t n, uint32_t image_token_id,
                             const uint64_t *mm, size_t n_mm, uint32_t *out)
{
    size_t runs = 0, obj = 0;
    uint32_t pad = 0;
    int in_run = 0;
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] == image_token_id) {
            if (!in_run) {
                /* One mm hash per run, in order; extra runs take the last. */
                in_run = 1;
                runs++;
                pad = kvb_mm_pad_value(mm[obj < n_mm ? obj : n_mm - 1]);
            }
            out[i] = pad;
        } else {
            if (in_run) {
                in_run = 0;
                obj++;
            }
            out[i] = tokens[i];
        }
    }
    return runs;
}
