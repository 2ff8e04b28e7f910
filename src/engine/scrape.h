/* scrape: the engines' /metrics (and health) endpoints, read on a schedule
 * with libcurl, and the liveness rule built on them.
 *
 * Threading (why a thread, not the loop's poll): one scrape thread owns a
 * libcurl multi handle and every easy handle.  It waits in curl_multi_poll()
 * (woken by curl_multi_wakeup() to stop), starts each target's round when it
 * is due, and when a round ends parses the page (promtext + engine_load) on
 * that thread, then hands the result over through a mutex-protected slot per
 * target and an eventfd.  The loop thread adds that one fd to its zmq_poll
 * set and copies results out; it never touches libcurl.  This is simpler and
 * sturdier than driving curl_multi_socket_action() from the loop: libcurl's
 * set of sockets changes under the loop's feet (connects, reconnects,
 * keep-alive closes) and would need a socket callback plus a timer callback
 * mirrored into the zmq_poll item array; name resolution (getaddrinfo, which
 * can block when libcurl has no threaded resolver) and parsing a page of up
 * to max_bytes would run on the loop thread.  With the thread, none of that
 * can delay a batch.  The cost is one thread that sleeps between rounds.
 *
 * A round: a GET of metrics_url and one of health_url (each if set), at the
 * same time, each with the target's timeout (connect included), no proxy
 * (environment proxies are ignored: engines are scraped directly), no
 * redirects, "Accept: text/plain;version=0.0.4", the body capped at
 * max_bytes.  Connections are kept alive between rounds.  The round is
 * answered when at least one of the two got a 2xx status: the engine process
 * is there.  Rounds start every interval_ms (no catch-up burst after a slow
 * round); timeout_ms <= interval_ms, so a round never overlaps the next.
 *
 * Ownership: kvb_scrape_create() copies the targets (strings included);
 * kvb_scrape_destroy() stops the thread, frees everything and sets the
 * pointer to NULL (NULL is fine).  Results are copied out to the caller.
 */
#ifndef KVB_SCRAPE_H
#define KVB_SCRAPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "load.h"

#define KVB_SCRAPE_MAX_BYTES (4u << 20) /* default cap of a /metrics body */
#define KVB_SCRAPE_MIN_INTERVAL_MS 10u

struct kvb_scrape_target {
    const char *name; /* for log lines, e.g. the source's name */
    enum kvb_engine_kind kind;
    const char *metrics_url; /* the engine's /metrics; NULL or "" = none */
    const char *health_url;  /* e.g. vLLM's /health; NULL or "" = none */
    uint32_t interval_ms;    /* a round every ...; >= KVB_SCRAPE_MIN_INTERVAL_MS */
    uint32_t timeout_ms;     /* per request; 0 = interval_ms; must be <= interval_ms */
    uint32_t block_tokens;   /* kvb_engine_load_finish()'s block_tokens (SGLang) */
    size_t max_bytes;        /* body cap; 0 = KVB_SCRAPE_MAX_BYTES */
};

struct kvb_scrape_result {
    bool has_url;           /* the target has a metrics or health URL */
    uint64_t started_ms;    /* kvb_mono_ms() when scraping began */
    uint64_t rounds;        /* rounds finished */
    uint64_t failed_rounds; /* rounds nothing answered */
    uint32_t consecutive_failures;
    uint64_t last_round_ms;      /* when the last round ended (0 = none yet) */
    uint64_t last_ok_ms;         /* when the engine last answered (0 = never) */
    uint32_t last_duration_ms;   /* of the last round */
    int last_error;              /* of the last failed request: -ETIMEDOUT,
                                   -ECONNREFUSED, -EHOSTUNREACH (name or route),
                                   -EPROTO (non-2xx status), -EFBIG (over
                                   max_bytes), -ECONNRESET, -EIO (other) */
    long last_status;            /* HTTP status of the last metrics answer (0 = none) */
    bool has_load;               /* `load` is from a metrics answer */
    uint64_t load_ms;            /* when that answer came */
    struct kvb_engine_load load; /* parsed and finished (kvb_engine_load_finish) */
};

struct kvb_scrape;

/* Validate the targets (-EINVAL: interval too small, timeout > interval, a
 * URL libcurl rejects, bad kind), start the scrape thread and the first
 * round of each target at once.  Returns 0 or a negative errno; *out is
 * written only on success. */
int kvb_scrape_create(const struct kvb_scrape_target *targets, size_t n, struct kvb_scrape **out);
void kvb_scrape_destroy(struct kvb_scrape **s);

size_t kvb_scrape_count(const struct kvb_scrape *s);

/* An eventfd, readable when some target has a fresh result; poll it for
 * POLLIN in the loop.  When it polls readable call kvb_scrape_ack() (reads
 * it), then kvb_scrape_take() for each target. */
int kvb_scrape_fd(const struct kvb_scrape *s);
void kvb_scrape_ack(struct kvb_scrape *s);

/* Copy target i's result to *out when it changed since the last take of i
 * (returns 1); returns 0 (and leaves *out alone) when it did not, -EINVAL
 * for a bad index.  Callable from any one thread (the loop). */
int kvb_scrape_take(struct kvb_scrape *s, size_t i, struct kvb_scrape_result *out);

/* ---- liveness (pure) -------------------------------------------------------
 *
 * The engine is gone when its endpoints have failed for dead_after_ms AND
 * no batch came from it in that time: an idle engine publishes nothing, so
 * silence alone proves nothing, and a dead endpoint with batches still
 * arriving is only a broken endpoint.  The judgement is made once per
 * outage: GONE is returned on the transition only (then publish one
 * "cleared" per dp_rank of the engine); while gone, SAME; when the engine
 * answers again or a batch arrives, BACK once (nothing special to do: log
 * it).  Without a URL no judgement is ever made (always SAME).
 */
enum kvb_live_event { KVB_LIVE_SAME = 0, KVB_LIVE_GONE = 1, KVB_LIVE_BACK = 2 };

struct kvb_liveness {
    bool gone;
};

struct kvb_live_input {
    bool has_url;           /* a metrics or health URL is configured */
    bool failing;           /* the last round got no answer */
    uint64_t last_ok_ms;    /* last answer; 0 = never (then since_ms counts) */
    uint64_t since_ms;      /* when watching began (scraping started) */
    uint64_t last_batch_ms; /* last batch from this engine; 0 = none */
    uint64_t now_ms;
    uint32_t dead_after_ms;
};

enum kvb_live_event kvb_liveness_judge(struct kvb_liveness *st, const struct kvb_live_input *in);

/* The judge's input from a scrape result. */
static inline struct kvb_live_input kvb_live_input_of(const struct kvb_scrape_result *r,
                                                      uint64_t last_batch_ms, uint64_t now_ms,
                                                      uint32_t dead_after_ms)
{
    struct kvb_live_input in = {r->has_url,    r->rounds > 0 && r->consecutive_failures > 0,
                                r->last_ok_ms, r->started_ms,
                                last_batch_ms, now_ms,
                                dead_after_ms};
    return in;
}

#endif
