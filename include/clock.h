/* clock: the one place that reads the clocks.
 *
 * Monotonic time (CLOCK_MONOTONIC) for every interval, timeout and deadline;
 * wall time (CLOCK_REALTIME) only for what leaves the process (timestamps in
 * router events, engine-lag metrics).  Header-only, no state.
 */
#ifndef KVB_CLOCK_H
#define KVB_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t kvb_clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t kvb_mono_ns(void) { return kvb_clock_ns(CLOCK_MONOTONIC); }
static inline uint64_t kvb_mono_us(void) { return kvb_mono_ns() / 1000u; }
static inline uint64_t kvb_mono_ms(void) { return kvb_mono_ns() / 1000000u; }
static inline uint64_t kvb_wall_ns(void) { return kvb_clock_ns(CLOCK_REALTIME); }
static inline uint64_t kvb_wall_ms(void) { return kvb_wall_ns() / 1000000u; }

/* An absolute CLOCK_MONOTONIC deadline `ms` from now, for
 * pthread_cond_timedwait() on a condition created with that clock. */
static inline struct timespec kvb_mono_deadline(uint64_t ms)
{
    uint64_t at = kvb_mono_ns() + ms * 1000000u;
    struct timespec ts = {(time_t)(at / 1000000000u), (long)(at % 1000000000u)};
    return ts;
}

#endif
