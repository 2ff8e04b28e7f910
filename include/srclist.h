/* srclist: the engine's list of its event sources (sources[].discover),
 * GET /kv_event_sources of vLLM's API server: for each data-parallel rank
 * the endpoint its PUB socket bound (an ephemeral port when the engine was given port 0), its
 * replay endpoint and its topic (docs/engine-events.md section 1,
 * "Endpoints an engine lists").
 *
 * The body comes in three shapes, all read: a JSON array of sources; an
 * object {"sources": [...]}; an object keyed by rank ({"0": {...}}, each
 * value the rank's KV-events configuration).  A source is an object with
 * "endpoint" (a string), "replay_endpoint" (a string, or null / absent:
 * none), "topic" (absent: ""), and its rank: "data_parallel_rank" in the
 * first two shapes, the key (decimal) in the third.  A source whose
 * "publisher" is "null" or whose "enable_kv_cache_events" is false
 * publishes nothing and is left out; other keys are ignored.  A wildcard
 * host (*, 0.0.0.0, ::, [::]) is the host the list was read from.  The
 * list is sorted by rank.  Anything else (not JSON, another shape, a rank
 * listed twice, an endpoint kvbridge cannot connect to: not tcp://HOST:PORT
 * with a port 1..65535 nor ipc://) makes the whole list unusable: it is
 * not used at all, never half of it.
 *
 * Fetching: one thread of this module owns a libcurl multi handle and does
 * every request (never the loop thread, which only polls kvb_srclist_fd()
 * and takes the results, as with scrape.h): a GET of the target's URL when
 * the loop asks for one (kvb_srclist_ask()), with KVB_SRCLIST_TIMEOUT_MS
 * (connect included), no proxy, no redirects, the body capped at
 * KVB_SRCLIST_MAX_BYTES, parsed on that thread.  Retrying is the loop's
 * business: a failed read is reported, and the loop asks again when it
 * wants.  The thread counts source_list_reads_total and
 * source_list_failures_total{reason} (it is their only writer).
 *
 * Ownership: kvb_srclist_create() copies the targets; kvb_srclist_destroy()
 * stops the thread (a request in flight is abandoned at once), frees
 * everything and sets the pointer to NULL (NULL is fine).  A list a result
 * hands over (struct kvb_srclist_result.list) is the caller's: free() it.
 */
#ifndef KVB_SRCLIST_H
#define KVB_SRCLIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrics.h"

#define KVB_SRCLIST_MAX_RANKS 1024       /* sources in one list */
#define KVB_SRCLIST_MAX_BYTES (1u << 20) /* body cap */
#define KVB_SRCLIST_TIMEOUT_MS 2000u     /* one request, connect included */
#define KVB_SRCLIST_ENDPOINT_MAX 256     /* bytes of an endpoint (NUL included) */
#define KVB_SRCLIST_TOPIC_MAX 256        /* bytes of a topic (NUL included) */
#define KVB_SRCLIST_PATH "/kv_event_sources"

struct kvb_srclist_entry {
    uint32_t rank;
    char endpoint[KVB_SRCLIST_ENDPOINT_MAX];
    char replay_endpoint[KVB_SRCLIST_ENDPOINT_MAX]; /* "" when none */
    char topic[KVB_SRCLIST_TOPIC_MAX];
};

/* A list: n sources, sorted by rank (one allocation). */
struct kvb_srclist_list {
    size_t n;
    struct kvb_srclist_entry e[];
};

/* Parse BODY (LEN bytes) read from a URL whose host is HOST (an IPv6
 * address in brackets): 0 and *out (the caller frees it), -EINVAL with *why
 * a static phrase saying what is wrong, -ENOMEM. */
int kvb_srclist_parse(const char *body, size_t len, const char *host, struct kvb_srclist_list **out,
                      const char **why);

/* The list's entry for RANK, or NULL. */
const struct kvb_srclist_entry *kvb_srclist_find(const struct kvb_srclist_list *l, uint32_t rank);

/* The URL to read for sources[].discover VALUE: VALUE itself when it has a
 * path, else VALUE + KVB_SRCLIST_PATH.  Malloc'ed (the caller frees), NULL
 * when out of memory. */
char *kvb_srclist_url(const char *value);

/* ---- fetching ------------------------------------------------------------ */

struct kvb_srclist_target {
    const char *name; /* for log lines */
    const char *url;  /* http:// or https://, with its path */
};

struct kvb_srclist_result {
    int err;         /* 0: read; -ECONNREFUSED, -ETIMEDOUT, -EHOSTUNREACH, -ECONNRESET,
                       * -EIO (unreachable), -EPROTO (a status other than 200), -EFBIG,
                       * -EINVAL (the body: see why), -ENOMEM */
    long status;     /* the HTTP status (0: none) */
    const char *why; /* -EINVAL: what is wrong with the body (static) */
    struct kvb_srclist_list *list; /* err == 0: the list, now the caller's */
};

struct kvb_srclist;

/* Validate the targets (-EINVAL: a URL libcurl or url.h rejects), start the
 * thread.  0 or a negative errno; *out written only on success. */
int kvb_srclist_create(const struct kvb_srclist_target *targets, size_t n, struct kvb_metrics *m,
                       struct kvb_srclist **out);
void kvb_srclist_destroy(struct kvb_srclist **l);

/* Read target I's list (again) as soon as the thread can (asked while a
 * request for it is in flight: once more after that one). */
void kvb_srclist_ask(struct kvb_srclist *l, size_t i);

/* Readable when a result is ready: call kvb_srclist_ack() then
 * kvb_srclist_take() for each target.  -1 when L is NULL. */
int kvb_srclist_fd(const struct kvb_srclist *l);
void kvb_srclist_ack(struct kvb_srclist *l);

/* Target I's result, when one came since the last take (1; *out filled and
 * its list handed over), else 0; -EINVAL for a bad index. */
int kvb_srclist_take(struct kvb_srclist *l, size_t i, struct kvb_srclist_result *out);

#endif
