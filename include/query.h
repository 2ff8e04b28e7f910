/* query: what the engine holds, answered from the residency mirror
 * (mirror.h) to any consumer that asks, over HTTP (http.c, /v1/...) and NATS
 * request/reply (mirror/mirror.c).  README "Query API" documents the shapes.
 *
 *   dump    every resident block of (worker_id, dp_rank) as stored router
 *           events (dynamo-json, parents before children), then
 *           {"last_event_id":N}: applying the dump, then every live event
 *           with event_id > N, gives the engine's truth
 *   events  the router events with event_id > since, from the recent-events
 *           ring, then {"last_event_id":N}; 410 when since is older than the
 *           ring holds
 *   match   {"matched_blocks":{"device":k,...}}: the leading blocks of
 *           token_ids resident per tier (the tokens_hash and parent walk a
 *           router does)
 *
 * Threads: the loop thread owns the mirror.  A transport thread (HTTP, NATS)
 * parses a request, computes what needs no mirror (tokens_hash of match),
 * and calls kvb_query_run(), which queues it, wakes the loop (wake_fd) and
 * waits; the loop's kvb_query_serve() does only the cheap part (a snapshot's
 * memcpy, the copy of the ring's events, a match walk).  The answer is then
 * encoded, line by line, on the transport's thread (kvb_query_answer_line()).
 *
 * Answers are newline-delimited: each kvb_query_answer_line() is one line
 * without its '\n'.  A dump groups at most KVB_QUERY_DUMP_LINE_BLOCKS blocks
 * per line.
 *
 * Ownership: kvb_query_create() returns a hub freed by kvb_query_destroy(&q)
 * (after kvb_query_close() and once no transport can call it).  A request is
 * the caller's (kvb_query_req_free()).  kvb_query_run() gives an answer owned
 * by the caller, freed by kvb_query_answer_free(&a) from any thread (which
 * also records the query metrics: queries_total, query_bytes_total,
 * query_duration_seconds, with atomic adds: several threads write them).
 */
#ifndef KVB_QUERY_H
#define KVB_QUERY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrics.h"

struct kvb_index;
struct kvb_rev;

#define KVB_QUERY_DUMP_LINE_BLOCKS 256u  /* blocks per line of a dump */
#define KVB_QUERY_MAX_TOKENS 1048576u    /* token_ids of one match */
#define KVB_QUERY_MAX_REQUEST (8u << 20) /* bytes of one request body */

struct kvb_query_req {
    int op;          /* enum kvb_qop_label: DUMP, EVENTS, MATCH */
    bool has_worker; /* else the daemon's worker_id */
    uint64_t worker_id;
    uint32_t dp_rank; /* default 0 */
    bool has_since;   /* events: required */
    uint64_t since;
    bool has_start, has_end; /* recover: Dynamo's start_event_id, end_event_id */
    uint64_t start, end;
    uint32_t *tokens; /* match: token_ids (malloc'ed) */
    size_t n_tokens;
    char *lora_name;     /* match: NULL or "" = none */
    uint32_t block_size; /* match: 0 = the configured one */
};

/* A JSON request: {"op":"dump"|"events"|"match","worker_id":W,"dp_rank":R,
 * "since":N,"token_ids":[...],"lora_name":null,"block_size":B}.  op may be
 * absent when default_op >= 0 (POST /v1/match).  worker_id, dp_rank and
 * since are integers or strings of digits (a u64 does not fit a JS number).
 * 0, or -EINVAL with a message in err; -ENOMEM.  Parsed with json-c. */
int kvb_query_parse_json(const char *body, size_t len, int default_op, struct kvb_query_req *out,
                         char *err, size_t err_cap);
/* One HTTP query parameter (worker_id, dp_rank, since; others are ignored):
 * 0 or -EINVAL with a message. */
int kvb_query_parse_param(const char *name, const char *value, struct kvb_query_req *r, char *err,
                          size_t err_cap);
/* Required fields present (since for events, token_ids for match)? */
int kvb_query_check(const struct kvb_query_req *r, char *err, size_t err_cap);
void kvb_query_req_free(struct kvb_query_req *r);
/* "dump", "events", "match", or NULL. */
int kvb_query_op_of(const char *name);

#define KVB_QUERY_MAX_WORKERS 64
struct kvb_query_cfg {
    uint64_t worker_id;  /* the default pair's worker */
    uint32_t block_size; /* 0 = auto: match needs "block_size" */
    bool lora_salt;
    uint32_t wait_ms; /* how long a transport waits for the loop; then 503 */
    /* Workers whose block_size / lora_salt differ from the above (several
     * engines, one kvbridge: sources[]): a match for one of them hashes
     * with its own.  The first KVB_QUERY_MAX_WORKERS only. */
    struct kvb_query_worker {
        uint64_t worker_id;
        uint32_t block_size;
        bool lora_salt;
    } workers[KVB_QUERY_MAX_WORKERS];
    size_t n_workers;
};

struct kvb_query;
struct kvb_query_answer;

int kvb_query_create(const struct kvb_query_cfg *cfg, struct kvb_metrics *m, int wake_fd,
                     struct kvb_query **out);
/* SIGHUP (loop thread): the new worker_id, block_size, lora_salt. */
void kvb_query_set_config(struct kvb_query *q, const struct kvb_query_cfg *cfg);
/* Loop thread: answer every queued request from m (NULL: 503).  Cheap when
 * nothing is queued (one lock). */
void kvb_query_serve(struct kvb_query *q, struct kvb_index *m);
/* Loop thread, at shutdown: queued and later requests get 503. */
void kvb_query_close(struct kvb_query *q);
void kvb_query_destroy(struct kvb_query **q);

/* Any thread but the loop's: run one request; always sets *out (an error
 * answer when the request is bad, the loop does not answer within wait_ms,
 * or the hub is closed); -ENOMEM only when not even that could be made. */
int kvb_query_run(struct kvb_query *q, const struct kvb_query_req *r,
                  struct kvb_query_answer **out);
/* An error answer without asking the loop (a transport's own refusals:
 * bad JSON, unknown path); counted as op "invalid". */
int kvb_query_error(struct kvb_query *q, int status, const char *msg,
                    struct kvb_query_answer **out);

/* recover (Dynamo's recovery query, src/recovery/): which answer the loop
 * chose, as a Dynamo worker's local indexer does (docs/dynamo-event-plane.md
 * section 9): no start, a start older than the ring, or a pair without any
 * event yet: a dump (TREE_DUMP; last_event_id in v[0]; the pair's blocks
 * from kvb_query_answer_event(), parents first); a start in the ring: its
 * events from start on (EVENTS, v[0] the pair's last event_id); a start
 * past the last event: TOO_NEW (v: start, end or the last, the last); end
 * before start: INVALID_RANGE (v: start, end).  Only for a recover answer
 * with status 200; -EINVAL otherwise. */
enum kvb_query_recovery { KVB_QR_EVENTS, KVB_QR_TREE_DUMP, KVB_QR_TOO_NEW, KVB_QR_INVALID_RANGE };
int kvb_query_answer_recovery(const struct kvb_query_answer *a, uint64_t v[3]);
/* The answer's router events, one by one: a dump's chains (at most
 * max_blocks each), or the ring's events.  1 and *out (valid until the next
 * call), 0 at the end, -ENOMEM. */
int kvb_query_answer_event(struct kvb_query_answer *a, uint32_t max_blocks, struct kvb_rev *out);

/* HTTP status: 200, 400 bad request, 404 unknown pair, 410 gone from the
 * ring, 500, 503 not available (stopping, loop busy, mirror off). */
int kvb_query_answer_status(const struct kvb_query_answer *a);
/* The next line (without '\n'): 1 and (*data, *len), valid until the next
 * call; 0 at the end; -ENOMEM. */
int kvb_query_answer_line(struct kvb_query_answer *a, const char **data, size_t *len);
/* Bytes the transport sent (for query_bytes_total). */
void kvb_query_answer_sent(struct kvb_query_answer *a, uint64_t bytes);
void kvb_query_answer_free(struct kvb_query_answer **a);

#endif
