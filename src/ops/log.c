/* log: see include/log.h. */
#include "log.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "clock.h"

static int log_level = KVB_LOG_INFO; /* the one allowed global (with signal flags) */
static bool log_journal = false;     /* derived from the environment at start */

void kvb_log_set_level(int level) { log_level = level; }
int kvb_log_get_level(void) { return log_level; }

void kvb_log_init(void)
{
    const char *js = getenv("JOURNAL_STREAM");
    struct stat st;
    unsigned long long dev, ino;
    log_journal = js && sscanf(js, "%llu:%llu", &dev, &ino) == 2 && fstat(2, &st) == 0 &&
                  (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

static void vlog(int level, const char *stage, const char *fmt, va_list ap)
{
    static const int prio[] = {3, 4, 6, 7}; /* LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG */
    char msg[1024];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    if (level < KVB_LOG_ERROR || level > KVB_LOG_DEBUG)
        level = KVB_LOG_ERROR;
    if (log_journal)
        fprintf(stderr, "<%d>%s: %s\n", prio[level], stage, msg);
    else {
        static const char *names[] = {"error", "warn", "info", "debug"};
        fprintf(stderr, "kvbridge[%s] %s: %s\n", stage, names[level], msg);
    }
}

void kvb_log(int level, const char *stage, const char *fmt, ...)
{
    if (level > log_level)
        return;
    va_list ap;
    va_start(ap, fmt);
    vlog(level, stage, fmt, ap);
    va_end(ap);
}

void kvb_log_rl(struct kvb_ratelimit *rl, int level, const char *stage, const char *fmt, ...)
{
    if (level > log_level)
        return;
    uint64_t now = kvb_mono_ms();
    if (rl->window_start_ms == 0 || now - rl->window_start_ms >= rl->interval_ms) {
        if (rl->suppressed)
            kvb_log(level, stage, "(%llu similar messages suppressed)",
                    (unsigned long long)rl->suppressed);
        rl->window_start_ms = now;
        rl->printed = 0;
        rl->suppressed = 0;
    }
    if (rl->printed >= rl->burst) {
        rl->suppressed++;
        return;
    }
    rl->printed++;
    va_list ap;
    va_start(ap, fmt);
    vlog(level, stage, fmt, ap);
    va_end(ap);
}

void kvb_log_lines(int level, const char *stage, const char *text)
{
    while (text && *text) {
        const char *nl = strchr(text, '\n');
        int n = nl ? (int)(nl - text) : (int)strlen(text);
        if (n > 0)
            kvb_log(level, stage, "%.*s", n, text);
        text += n + (nl ? 1 : 0);
    }
}
