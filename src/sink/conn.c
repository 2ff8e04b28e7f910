/* sink conn: what every part of the sink uses (sink_priv.h): nats.c's
 * statuses as errno values and texts, the loop's wake-up, the metrics rule,
 * the worker's kick, the reconnect backoff, starting a thread and making a
 * condition variable.  A leaf: it calls no other
 * file of src/sink/ (the file graph is at the top of sink_priv.h).
 */
#include "sink_priv.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void kvb_sink_sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000u, (long)(ms % 1000u) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

/* nats.c's last error for this thread without its "(file.c:123): " prefix,
 * or the status text. */
void kvb_sink_last_error(natsStatus st, char *out, size_t cap)
{
    const char *t = nats_GetLastError(NULL);
    if (t && t[0] == '(') {
        const char *e = strstr(t, "): ");
        if (e)
            t = e + 3;
    }
    snprintf(out, cap, "%s", t && *t ? t : natsStatus_GetText(st));
}

int kvb_sink_errno(natsStatus st)
{
    switch (st) {
    case NATS_OK: return 0;
    case NATS_INSUFFICIENT_BUFFER: return -EAGAIN;
    case NATS_CONNECTION_CLOSED: return -EPIPE;
    case NATS_CONNECTION_DISCONNECTED: return -ENOTCONN;
    case NATS_TIMEOUT: return -ETIMEDOUT;
    case NATS_MAX_PAYLOAD: return -EMSGSIZE;
    case NATS_NO_MEMORY: return -ENOMEM;
    case NATS_INVALID_ARG:
    case NATS_INVALID_SUBJECT:
    case NATS_ADDRESS_MISSING:
    case NATS_INVALID_TIMEOUT: return -EINVAL;
    case NATS_NOT_FOUND: return -ENOENT;
    case NATS_CONNECTION_AUTH_FAILED:
    case NATS_NOT_PERMITTED: return -EACCES;
    default: return -EIO;
    }
}

void kvb_sink_wake(struct kvb_sink *s)
{
    if (s->wake_fd < 0 || !atomic_load(&s->live))
        return;
    int saved = errno;
    uint8_t b = 1;
    ssize_t n;
    do
        n = write(s->wake_fd, &b, 1);
    while (n < 0 && errno == EINTR);
    if (n < 0 && errno == EINVAL) { /* an eventfd wants 8 bytes */
        uint64_t one = 1;
        do
            n = write(s->wake_fd, &one, sizeof(one));
        while (n < 0 && errno == EINTR);
    }
    /* EAGAIN: the loop has wake-ups pending already. */
    errno = saved;
}

/* Metrics rule: a sink writes metrics only while it is the live one, i.e.
 * from a successful create until destroy starts (live).  On SIGHUP the loop
 * creates a new sink on the same metrics before destroying the old one, and a
 * create that fails must not disturb what the running sink reports. */
bool kvb_sink_owns_metrics(const struct kvb_sink *s)
{
    return s->m && atomic_load(&((struct kvb_sink *)s)->live);
}

/* Wake the worker (rebuild thread): a resend is queued, a connection is back. */
void kvb_sink_kick_worker(struct kvb_sink *s)
{
    pthread_mutex_lock(&s->rb_mu);
    pthread_cond_signal(&s->rb_cond);
    pthread_mutex_unlock(&s->rb_mu);
}

static uint32_t xorshift32(uint32_t *st)
{
    uint32_t x = *st;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *st = x;
}

/* Backoff after the ATTEMPTS-th failed pass (1, 2, ...): wait_ms doubling up
 * to wait_max_ms, minus up to 20% jitter so that a fleet of bridges does not
 * reconnect in lockstep. */
uint64_t kvb_sink_backoff_ms(const struct kvb_sink *s, int attempts, uint32_t *rng)
{
    uint64_t d = s->wait_ms >= 10 ? s->wait_ms : 10; /* never spin on refusals */
    uint64_t max = s->wait_max_ms > d ? s->wait_max_ms : d;
    for (int i = 1; i < attempts && d < max; i++)
        d *= 2;
    if (d > max)
        d = max;
    if (d >= 5)
        d -= xorshift32(rng) % (d / 5 + 1);
    return d;
}

int kvb_sink_cond_init(pthread_cond_t *c)
{
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0)
        return -ENOMEM;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(c, &ca);
    pthread_condattr_destroy(&ca);
    return -rc;
}

int kvb_sink_thread_start(pthread_t *t, void *(*fn)(void *), void *arg)
{
    sigset_t all, old;
    sigfillset(&all);
    /* the loop takes its signals through a signalfd: keep them off this thread */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(t, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return -rc;
}
