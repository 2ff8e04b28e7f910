/* log: one logging module for every stage (docs/design.md rule 9).
 *
 * Lines go to stderr as "kvbridge[stage] level: message".  When stderr is the
 * systemd journal (JOURNAL_STREAM matches stderr's device:inode), each line
 * starts with a "<N>" syslog priority instead.  The level is the only global
 * besides signal flags.  Repeated errors go through a kvb_ratelimit owned by
 * the caller: at most `burst` lines per interval, then one line saying how
 * many were suppressed.
 */
#ifndef KVB_LOG_H
#define KVB_LOG_H

#include <stdint.h>

enum kvb_log_level { KVB_LOG_ERROR = 0, KVB_LOG_WARN, KVB_LOG_INFO, KVB_LOG_DEBUG };

void kvb_log_set_level(int level);
int kvb_log_get_level(void);
/* Re-check whether stderr is the journal (call once at start). */
void kvb_log_init(void);

void kvb_log(int level, const char *stage, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

struct kvb_ratelimit {
    uint32_t interval_ms; /* e.g. 10000 */
    uint32_t burst;       /* e.g. 5 */
    uint64_t window_start_ms;
    uint32_t printed;
    uint64_t suppressed;
};
#define KVB_RATELIMIT_INIT(ms, n) \
    {                             \
        (ms), (n), 0, 0, 0        \
    }

void kvb_log_rl(struct kvb_ratelimit *rl, int level, const char *stage, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Log each line of text (e.g. collected FILE:LINE:COL errors) at level. */
void kvb_log_lines(int level, const char *stage, const char *text);

#define kvb_err(stage, ...) kvb_log(KVB_LOG_ERROR, stage, __VA_ARGS__)
#define kvb_warn(stage, ...) kvb_log(KVB_LOG_WARN, stage, __VA_ARGS__)
#define kvb_info(stage, ...) kvb_log(KVB_LOG_INFO, stage, __VA_ARGS__)
#define kvb_debug(stage, ...)                           \
    do {                                                \
        if (kvb_log_get_level() >= KVB_LOG_DEBUG)       \
            kvb_log(KVB_LOG_DEBUG, stage, __VA_ARGS__); \
    } while (0)

#endif
