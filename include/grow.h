/* grow: the one array-growth helper (header-only, no state).
 *
 * kvb_grow(&p, &cap, need, elem) makes *p hold at least NEED elements of
 * ELEM bytes, doubling from 16 (realloc; *p and *cap change only on
 * success).  0, or -ENOMEM (also when the size would overflow).  The
 * caller owns *p and frees it.
 */
#ifndef KVB_GROW_H
#define KVB_GROW_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

static inline int kvb_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 16;
    while (n < need) {
        if (n > SIZE_MAX / 2)
            return -ENOMEM;
        n *= 2;
    }
    if (elem && n > SIZE_MAX / elem)
        return -ENOMEM;
    void *q = realloc(*p, n * elem);
    if (!q)
        return -ENOMEM;
    *p = q;
    *cap = n;
    return 0;
}

#endif
