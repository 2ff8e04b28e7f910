/* mix: the one 64-bit integer mixer (splitmix64's finalizer), for hash
 * tables' slots and deterministic ids.  Header-only, no state. */
#ifndef KVB_MIX_H
#define KVB_MIX_H

#include <stdint.h>

static inline uint64_t kvb_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x *= UINT64_C(0x94d049bb133111eb);
    return x ^ (x >> 31);
}

#endif
