/* encode: router event -> wire bytes (docs/router-events.md section 1).
 *
 * dynamo-json: compact JSON, fixed field order, every integer an unsigned
 * 64-bit decimal, no floating point, no snprintf.
 *
 * Ownership: the encoder owns one output buffer, reused for every event.  The
 * bytes returned by kvb_encode() stay valid until the next kvb_encode() or
 * kvb_encoder_destroy().
 */
#ifndef KVB_ENCODE_H
#define KVB_ENCODE_H

#include <stddef.h>
#include <stdint.h>

#include "convert.h"

struct kvb_encoder;

/* format: enum kvb_format (config.h).  -ENOTSUP for formats not built yet. */
int kvb_encoder_create(int format, struct kvb_encoder **out);
void kvb_encoder_destroy(struct kvb_encoder **e);

/* Encode one router event.  0 and (*data, *len), or -ENOMEM. */
int kvb_encode(struct kvb_encoder *e, const struct kvb_rev *r, const char **data, size_t *len);

/* Write v in decimal at p (room for 20 bytes); returns the byte count. */
size_t kvb_u64_to_dec(char *p, uint64_t v);

#endif
