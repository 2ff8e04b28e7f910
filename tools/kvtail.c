/*
 * kvtail: NATS subscriber and checker for kvbridge's router events.
 *
 * Prints router events (docs/router-events.md section 1) as they arrive and, on
 * request, checks them:
 *   --check          event_id contiguity per (worker_id, dp_rank)
 *   --index          applies them to an in-memory index the way Dynamo's
 *                    indexer does (parent check, unknown removes ignored)
 *   --expect-record  compares that index with kvsim's --record file: an entry
 *                    the engine does not hold at the end is WRONG (fails);
 *                    an engine block absent from the index is only "missing"
 *   --recover        with --index and --query: start late and recover from
 *                    kvbridge's query API (a dump, then the live events after
 *                    its last_event_id; on an event_id hole the events since,
 *                    or a dump when they are gone), never needing a "cleared"
 * and publishes test input with --publish FILE; --dump / --match ask
 * kvbridge's query API once and print the answer (a dump as a summary).
 *
 * --format dynamo-msgpack reads Dynamo's event plane instead
 * (docs/dynamo-event-plane.md sections 3 and 4), decoded here with msgpack-c:
 * each envelope's sequence must be contiguous per publisher_id from 0, a
 * publisher must stay with one (worker_id, dp_rank) and a message must not
 * mix pairs; each RouterEvent inside is then checked and printed as its
 * dynamo-json line, exactly as if it had come as dynamo-json, so "messages"
 * counts router events (envelopes= counts NATS messages).  --format raw
 * counts engine batches republished unchanged and checks KV-Seq per
 * (KV-Source, KV-Topic).
 *
 * Independent test instrument: uses nothing from src/.
 * Build: make build/kvtail, or
 *   gcc -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror tools/kvtail.c \
 *       -o build/kvtail -lnats -lmsgpackc
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <msgpack.h>
#include <nats/nats.h>

#define TOOL_NAME "kvtail"
#define TOOL_EXIT_OOM 2
#include "tools_common.h"

#define MAX_HOLES 64   /* remembered per stream, to tell reorders from dups */
#define MAX_REPORTS 50 /* per kind of problem, then only counted */

/* ------------------------------------------------------------------ utils */

struct vec {
    uint64_t *v;
    size_t n, cap;
};

static void vec_push(struct vec *v, uint64_t x)
{
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 64;
        v->v = xrealloc(v->v, v->cap * sizeof *v->v);
    }
    v->v[v->n++] = x;
}

/* ------------------------------------- hash multiset: block hash -> count */

struct hset {
    uint64_t *keys;
    uint64_t *aux; /* tokens_hash */
    uint32_t *cnt; /* 0 = empty slot */
    size_t mask, n;
};

static void hset_alloc(struct hset *h, size_t slots)
{
    h->keys = xrealloc(NULL, slots * sizeof *h->keys);
    h->aux = xrealloc(NULL, slots * sizeof *h->aux);
    h->cnt = xrealloc(NULL, slots * sizeof *h->cnt);
    memset(h->cnt, 0, slots * sizeof *h->cnt);
    h->mask = slots - 1;
    h->n = 0;
}

static void hset_free(struct hset *h)
{
    free(h->keys);
    free(h->aux);
    free(h->cnt);
}

static size_t hset_find(const struct hset *h, uint64_t k)
{
    size_t i = mix64(k) & h->mask;
    while (h->cnt[i] && h->keys[i] != k)
        i = (i + 1) & h->mask;
    return i;
}

static bool hset_has(const struct hset *h, uint64_t k, uint64_t *aux)
{
    size_t i = hset_find(h, k);
    if (!h->cnt[i])
        return false;
    if (aux)
        *aux = h->aux[i];
    return true;
}

static void hset_add(struct hset *h, uint64_t k, uint64_t aux)
{
    size_t i;
    if ((h->n + 1) * 10 > (h->mask + 1) * 7) {
        struct hset old = *h;
        hset_alloc(h, (old.mask + 1) * 2);
        for (size_t j = 0; j <= old.mask; j++) {
            if (old.cnt[j]) {
                size_t t = hset_find(h, old.keys[j]);
                h->keys[t] = old.keys[j];
                h->aux[t] = old.aux[j];
                h->cnt[t] = old.cnt[j];
                h->n++;
            }
        }
        hset_free(&old);
    }
    i = hset_find(h, k);
    if (!h->cnt[i]) {
        h->n++;
        h->keys[i] = k;
    }
    h->aux[i] = aux;
    if (h->cnt[i] < UINT32_MAX)
        h->cnt[i]++;
}

/* Drops one copy; returns false when k is not present. */
static bool hset_del(struct hset *h, uint64_t k)
{
    size_t i = hset_find(h, k), j;
    if (!h->cnt[i])
        return false;
    if (--h->cnt[i])
        return true;
    j = i;
    for (;;) {
        size_t home;
        bool stays;
        j = (j + 1) & h->mask;
        if (!h->cnt[j])
            break;
        home = mix64(h->keys[j]) & h->mask;
        stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            h->keys[i] = h->keys[j];
            h->aux[i] = h->aux[j];
            h->cnt[i] = h->cnt[j];
            h->cnt[j] = 0;
            i = j;
        }
    }
    h->cnt[i] = 0;
    h->n--;
    return true;
}

static void hset_clear(struct hset *h)
{
    memset(h->cnt, 0, (h->mask + 1) * sizeof *h->cnt);
    h->n = 0;
}

/* --------------------------------------------------- index spaces, streams */

enum tier { T_DEVICE, T_HOST, T_DISK, T_EXTERNAL, NTIER };
static const char *const tier_names[NTIER] = {"device", "host_pinned", "disk", "external"};

struct space {
    uint64_t worker, rank;
    int tier;
    struct hset set;
};

struct spaces {
    struct space *s;
    size_t n, cap;
};

static struct space *space_get(struct spaces *ss, uint64_t worker, uint64_t rank, int tier,
                               bool create)
{
    for (size_t i = 0; i < ss->n; i++)
        if (ss->s[i].worker == worker && ss->s[i].rank == rank && ss->s[i].tier == tier)
            return &ss->s[i];
    if (!create)
        return NULL;
    if (ss->n == ss->cap) {
        ss->cap = ss->cap ? ss->cap * 2 : 8;
        ss->s = xrealloc(ss->s, ss->cap * sizeof *ss->s);
    }
    ss->s[ss->n].worker = worker;
    ss->s[ss->n].rank = rank;
    ss->s[ss->n].tier = tier;
    hset_alloc(&ss->s[ss->n].set, 1024);
    return &ss->s[ss->n++];
}

static void spaces_clear(struct spaces *ss, uint64_t worker, uint64_t rank)
{
    for (size_t i = 0; i < ss->n; i++)
        if (ss->s[i].worker == worker && ss->s[i].rank == rank)
            hset_clear(&ss->s[i].set);
}

static void spaces_free(struct spaces *ss)
{
    for (size_t i = 0; i < ss->n; i++)
        hset_free(&ss->s[i].set);
    free(ss->s);
}

struct hole {
    uint64_t lo, hi;
};

struct stream {
    uint64_t worker, rank, next;
    struct hole holes[MAX_HOLES];
    size_t nholes;
    bool synced; /* --recover: the index holds this pair up to next - 1 */
};

/* ------------------------------------------------------------- the state */

enum kind { K_STORED, K_REMOVED, K_CLEARED };

struct rev {
    uint64_t worker, id, rank, parent;
    int tier;
    enum kind kind;
    bool has_parent;
    bool scoped; /* a "cleared" of `tier` only (its storage_tier named it) */
    struct vec h, th;
};

#define MAX_PAIRS 64

struct pair_arg {
    uint64_t worker, rank;
};

enum fmt { F_JSON, F_MSGPACK, F_RAW };

struct pubstate {
    uint64_t publisher, next_seq, worker, rank;
    bool has_pair;
};

struct rawstate {
    char key[512];
    uint64_t next;
};

struct opts {
    const char *server, *subject, *expect, *ready, *publish;
    enum fmt format;
    uint64_t count;
    long timeout_ms;
    bool quiet, check, index, allow_offset;
    bool index_set;    /* --index-set: a block indexed once, as Dynamo's radix tree */
    const char *query; /* kvbridge's query subject */
    bool recover;
    struct pair_arg pairs[MAX_PAIRS]; /* --pair: dumps asked at start */
    size_t npairs;
    bool dump, match; /* one-shot queries (on pairs[0]) */
    const char *tokens, *lora;
    uint64_t block_size;
    uint64_t cut_after; /* --cut-after N:MS: test hook */
    long cut_ms;
    bool has_worker; /* --worker W: only that worker's events count */
    uint64_t worker;
    long reconnect_ms; /* --reconnect-wait: 0 = nats.c's default */
};

struct stats {
    uint64_t messages, stored, removed, cleared, holes, hole_ids, dups, reorders, resets, bad,
        orphans, unknown_removes, wrong, missing, badtok, indexed, blocks, envelopes, seqerr;
    /* --recover */
    uint64_t dumps, dump_blocks, events_asked, events_got, gone, skipped, query_errors;
    uint64_t other_workers; /* --worker: events of other workers, ignored */
};

struct tail {
    struct opts o;
    struct stats st;
    struct rev ev;
    natsConnection *nc; /* --recover: for the queries */
    struct stream *streams;
    size_t nstreams;
    struct spaces index, truth;
    bool tier_seen[NTIER];
    unsigned reports_hole, reports_dup, reports_bad, reports_wrong, reports_seq;
    struct pubstate *pubs;
    size_t npubs;
    struct rawstate *raws;
    size_t nraws;
    char *line; /* an event printed as dynamo-json */
    size_t line_cap;
};

/* ---------------------------------------------- router event JSON parser */

struct cur {
    const char *p, *e;
};

static bool lit(struct cur *c, const char *s)
{
    size_t n = strlen(s);
    if ((size_t)(c->e - c->p) < n || memcmp(c->p, s, n))
        return false;
    c->p += n;
    return true;
}

/* An unsigned 64-bit decimal: digits only, no sign, no leading zeros. */
static bool num(struct cur *c, uint64_t *out)
{
    char buf[24], *end;
    size_t n = 0;
    unsigned long long v;

    while (c->p + n < c->e && c->p[n] >= '0' && c->p[n] <= '9')
        n++;
    if (n == 0 || n > 20 || (n > 1 && c->p[0] == '0'))
        return false;
    memcpy(buf, c->p, n);
    buf[n] = '\0';
    errno = 0;
    v = strtoull(buf, &end, 10);
    if (errno == ERANGE || *end)
        return false;
    c->p += n;
    *out = v;
    return true;
}

/*
 * Parses exactly the compact dynamo-json shape, fields in order:
 *   {"worker_id":W[,"storage_tier":"T"],"event":{"event_id":E,"data":D,"dp_rank":R}}
 * storage_tier "device" only on a "cleared": a cleared that names a tier
 * (device included) empties that tier alone, one without empties every tier.
 * a stored block {"block_hash":H,"tokens_hash":T[,"mm_extra_info":{"mm_objects":
 * [{"mm_hash":M,"offsets":[]},...]}]} (docs/router-events.md section 3.2).
 * Returns NULL on success, else what was expected (and c->p is where).
 */
static const char *parse_rev(struct cur *c, struct rev *ev)
{
    ev->h.n = ev->th.n = 0;
    ev->has_parent = false;
    ev->tier = T_DEVICE;
    ev->scoped = false;

    bool named = false;
    if (!lit(c, "{\"worker_id\":") || !num(c, &ev->worker))
        return "{\"worker_id\":<u64>";
    if (lit(c, ",\"storage_tier\":\"")) {
        named = true;
        if (lit(c, "device\""))
            ev->tier = T_DEVICE;
        else if (lit(c, "host_pinned\""))
            ev->tier = T_HOST;
        else if (lit(c, "disk\""))
            ev->tier = T_DISK;
        else if (lit(c, "external\""))
            ev->tier = T_EXTERNAL;
        else
            return "storage_tier device|host_pinned|disk|external";
    }
    if (!lit(c, ",\"event\":{\"event_id\":") || !num(c, &ev->id))
        return ",\"event\":{\"event_id\":<u64>";
    if (!lit(c, ",\"data\":"))
        return ",\"data\":";
    if (lit(c, "\"cleared\"")) {
        ev->kind = K_CLEARED;
        ev->scoped = named;
    } else if (named && ev->tier == T_DEVICE) {
        return "storage_tier device only on a \"cleared\" (elsewhere it is implicit)";
    } else if (lit(c, "{\"stored\":{\"parent_hash\":")) {
        ev->kind = K_STORED;
        if (!lit(c, "null")) {
            if (!num(c, &ev->parent))
                return "parent_hash <u64>|null";
            ev->has_parent = true;
        }
        if (!lit(c, ",\"blocks\":["))
            return ",\"blocks\":[";
        for (;;) {
            uint64_t h, t;
            if (!lit(c, "{\"block_hash\":") || !num(c, &h) || !lit(c, ",\"tokens_hash\":") ||
                !num(c, &t))
                return "{\"block_hash\":<u64>,\"tokens_hash\":<u64>";
            /* multimodal objects: written only for blocks that have some */
            if (lit(c, ",\"mm_extra_info\":{\"mm_objects\":[")) {
                for (;;) {
                    uint64_t mh;
                    if (!lit(c, "{\"mm_hash\":") || !num(c, &mh) || !lit(c, ",\"offsets\":[]}"))
                        return "{\"mm_hash\":<u64>,\"offsets\":[]}";
                    if (lit(c, ","))
                        continue;
                    if (lit(c, "]}"))
                        break;
                    return "',' or ']}' in mm_objects";
                }
            }
            if (!lit(c, "}"))
                return "'}' after a block (or ,\"mm_extra_info\":{\"mm_objects\":[..]})";
            vec_push(&ev->h, h);
            vec_push(&ev->th, t);
            if (lit(c, ","))
                continue;
            if (lit(c, "]}}"))
                break;
            return "',' or ']}}' after a block";
        }
    } else if (lit(c, "{\"removed\":{\"block_hashes\":[")) {
        ev->kind = K_REMOVED;
        for (;;) {
            uint64_t h;
            if (!num(c, &h))
                return "<u64> in block_hashes (an empty list is never published)";
            vec_push(&ev->h, h);
            if (lit(c, ","))
                continue;
            if (lit(c, "]}}"))
                break;
            return "',' or ']}}' in block_hashes";
        }
    } else {
        return "data: \"cleared\" | {\"stored\":..} | {\"removed\":..}";
    }
    if (!lit(c, ",\"dp_rank\":") || !num(c, &ev->rank))
        return ",\"dp_rank\":<u64>";
    if (!lit(c, "}}"))
        return "}}";
    if (c->p != c->e)
        return "end of message";
    return NULL;
}

/* -------------------------------------------------------------- checking */

static struct stream *stream_get(struct tail *t, uint64_t worker, uint64_t rank, bool *fresh)
{
    *fresh = false;
    for (size_t i = 0; i < t->nstreams; i++)
        if (t->streams[i].worker == worker && t->streams[i].rank == rank)
            return &t->streams[i];
    t->streams = xrealloc(t->streams, (t->nstreams + 1) * sizeof *t->streams);
    memset(&t->streams[t->nstreams], 0, sizeof t->streams[0]);
    t->streams[t->nstreams].worker = worker;
    t->streams[t->nstreams].rank = rank;
    *fresh = true;
    return &t->streams[t->nstreams++];
}

static void add_hole(struct tail *t, struct stream *s, uint64_t lo, uint64_t hi)
{
    t->st.holes++;
    t->st.hole_ids += hi - lo + 1;
    if (t->reports_hole++ < MAX_REPORTS)
        fprintf(stderr,
                "kvtail: HOLE worker_id=%" PRIu64 " dp_rank=%" PRIu64 " event_id %" PRIu64
                "..%" PRIu64 " missing (%" PRIu64 " ids)\n",
                s->worker, s->rank, lo, hi, hi - lo + 1);
    if (s->nholes == MAX_HOLES) {
        memmove(s->holes, s->holes + 1, (MAX_HOLES - 1) * sizeof s->holes[0]);
        s->nholes--;
    }
    s->holes[s->nholes].lo = lo;
    s->holes[s->nholes].hi = hi;
    s->nholes++;
}

/* An id below the expected one: fills a known hole (reordering) or not (dup). */
static bool fill_hole(struct stream *s, uint64_t id)
{
    for (size_t i = 0; i < s->nholes; i++) {
        struct hole *h = &s->holes[i];
        if (id < h->lo || id > h->hi)
            continue;
        if (h->lo == h->hi) {
            memmove(h, h + 1, (s->nholes - i - 1) * sizeof *h);
            s->nholes--;
        } else if (id == h->lo) {
            h->lo++;
        } else if (id == h->hi) {
            h->hi--;
        } else if (s->nholes < MAX_HOLES) {
            memmove(h + 2, h + 1, (s->nholes - i - 1) * sizeof *h);
            h[1].lo = id + 1;
            h[1].hi = h->hi;
            h->hi = id - 1;
            s->nholes++;
        } else {
            h->hi = id - 1; /* no room: forget the upper part */
        }
        return true;
    }
    return false;
}

static void check_ids(struct tail *t, const struct rev *ev)
{
    bool fresh;
    struct stream *s = stream_get(t, ev->worker, ev->rank, &fresh);

    if (fresh) {
        if (ev->id != 0 && !t->o.allow_offset)
            add_hole(t, s, 0, ev->id - 1);
        s->next = ev->id + 1;
        return;
    }
    if (ev->id == s->next) {
        s->next++;
    } else if (ev->id > s->next) {
        add_hole(t, s, s->next, ev->id - 1);
        s->next = ev->id + 1;
    } else if (ev->id == 0 && ev->kind == K_CLEARED) {
        /* a bridge restarted without its persisted counter: a new epoch */
        t->st.resets++;
        fprintf(stderr,
                "kvtail: RESET worker_id=%" PRIu64 " dp_rank=%" PRIu64
                " event_id back to 0 with \"cleared\" (was at %" PRIu64 ")\n",
                s->worker, s->rank, s->next);
        s->next = 1;
        s->nholes = 0;
    } else if (fill_hole(s, ev->id)) {
        t->st.reorders++;
        if (t->reports_dup++ < MAX_REPORTS)
            fprintf(stderr,
                    "kvtail: REORDERED worker_id=%" PRIu64 " dp_rank=%" PRIu64 " event_id %" PRIu64
                    " arrived after %" PRIu64 "\n",
                    s->worker, s->rank, ev->id, s->next - 1);
    } else {
        t->st.dups++;
        if (t->reports_dup++ < MAX_REPORTS)
            fprintf(stderr,
                    "kvtail: DUPLICATE worker_id=%" PRIu64 " dp_rank=%" PRIu64 " event_id %" PRIu64
                    " (expected %" PRIu64 ")\n",
                    s->worker, s->rank, ev->id, s->next);
    }
}

/* What Dynamo's indexer does with one event. */
static void apply_index(struct tail *t, const struct rev *ev)
{
    struct space *sp;

    t->tier_seen[ev->tier] = true;
    switch (ev->kind) {
    case K_STORED:
        sp = space_get(&t->index, ev->worker, ev->rank, ev->tier, true);
        if (ev->has_parent && !hset_has(&sp->set, ev->parent, NULL)) {
            t->st.orphans++; /* unknown parent: the whole store is dropped */
            return;
        }
        for (size_t i = 0; i < ev->h.n; i++)
            if (!t->o.index_set || !hset_has(&sp->set, ev->h.v[i], NULL))
                hset_add(&sp->set, ev->h.v[i], ev->th.v[i]);
        break;
    case K_REMOVED:
        sp = space_get(&t->index, ev->worker, ev->rank, ev->tier, true);
        for (size_t i = 0; i < ev->h.n; i++)
            if (!hset_del(&sp->set, ev->h.v[i]))
                t->st.unknown_removes++;
        break;
    case K_CLEARED:
        if (ev->scoped) { /* Dynamo's index.clear(worker, Some(tier)) */
            sp = space_get(&t->index, ev->worker, ev->rank, ev->tier, false);
            if (sp)
                hset_clear(&sp->set);
        } else {
            spaces_clear(&t->index, ev->worker, ev->rank); /* every tier */
        }
        break;
    }
}

/* ------------------------------------------- kvbridge's query API (NATS) */

/*
 * A request is a JSON object published to the query subject with our own
 * inbox as the reply subject; the answer comes in parts (headers Kvb-Status,
 * Kvb-Part 1, 2, ..., Kvb-Last true on the last one), each a run of whole
 * lines.  line_fn gets every line; returns the status (200, 404, 410, ...),
 * or -1 when no answer came (timeout, no responders, parts out of order).
 */
typedef void (*line_fn)(void *ctx, const char *line, size_t len);

static int ask(natsConnection *nc, const char *subject, const char *req, line_fn fn, void *ctx)
{
    natsInbox *inbox = NULL;
    natsSubscription *sub = NULL;
    int status = -1;
    unsigned want = 1;
    natsStatus s = natsInbox_Create(&inbox);

    if (s == NATS_OK)
        s = natsConnection_SubscribeSync(&sub, nc, inbox);
    if (s == NATS_OK)
        s = natsSubscription_SetPendingLimits(sub, -1, -1);
    if (s == NATS_OK)
        s = natsConnection_PublishRequestString(nc, subject, inbox, req);
    while (s == NATS_OK) {
        natsMsg *m = NULL;
        const char *v = NULL, *p, *e;
        bool last;
        s = natsSubscription_NextMsg(&m, sub, 30000);
        if (s != NATS_OK)
            break;
        if (natsMsg_IsNoResponders(m)) {
            fprintf(stderr, "kvtail: query: no responders on %s\n", subject);
            natsMsg_Destroy(m);
            break;
        }
        if (natsMsgHeader_Get(m, "Kvb-Part", &v) != NATS_OK || strtoul(v, NULL, 10) != want) {
            fprintf(stderr, "kvtail: query: part %s, expected %u\n", v ? v : "(none)", want);
            natsMsg_Destroy(m);
            status = -1;
            break;
        }
        want++;
        if (natsMsgHeader_Get(m, "Kvb-Status", &v) == NATS_OK)
            status = atoi(v);
        last = natsMsgHeader_Get(m, "Kvb-Last", &v) == NATS_OK && !strcmp(v, "true");
        p = natsMsg_GetData(m);
        e = p + natsMsg_GetDataLength(m);
        while (p < e) {
            const char *nl = memchr(p, '\n', (size_t)(e - p));
            size_t n = nl ? (size_t)(nl - p) : (size_t)(e - p);
            fn(ctx, p, n);
            p += n + 1;
        }
        natsMsg_Destroy(m);
        if (last)
            break;
    }
    if (s != NATS_OK) {
        fprintf(stderr, "kvtail: query %s: %s\n", subject, natsStatus_GetText(s));
        status = -1;
    }
    natsSubscription_Destroy(sub);
    natsInbox_Destroy(inbox);
    return status;
}

/* {"last_event_id":N}: true and *id. */
static bool last_line(const char *line, size_t len, uint64_t *id)
{
    struct cur c = {line, line + len};
    return lit(&c, "{\"last_event_id\":") && num(&c, id) && lit(&c, "}") && c.p == c.e;
}

/* What an answer's lines did: router events applied (from id `from` on),
 * the last_event_id line, errors. */
struct answer {
    struct tail *t;
    struct rev ev; /* its own: t->ev may hold the live event being handled */
    uint64_t from; /* events below it are already in the index */
    bool has_last;
    uint64_t last, events, blocks;
    bool bad;
    char error[256];
};

static void answer_line(void *ctx, const char *line, size_t len)
{
    struct answer *a = ctx;
    struct cur c = {line, line + len};
    struct rev *ev = &a->ev;
    if (len == 0)
        return;
    if (last_line(line, len, &a->last)) {
        a->has_last = true;
        return;
    }
    if (len > 9 && !memcmp(line, "{\"error\":", 9)) {
        snprintf(a->error, sizeof a->error, "%.*s", (int)len, line);
        return;
    }
    if (parse_rev(&c, ev)) {
        if (!a->bad)
            fprintf(stderr, "kvtail: query: BAD line: %.*s\n", (int)(len > 300 ? 300 : len), line);
        a->bad = true;
        a->t->st.bad++;
        return;
    }
    if (ev->id < a->from)
        return;
    a->events++;
    if (ev->kind == K_STORED)
        a->blocks += ev->h.n;
    apply_index(a->t, ev);
}

static void pair_request(char *buf, size_t cap, const char *op, uint64_t worker, uint64_t rank,
                         const char *extra)
{
    snprintf(buf, cap, "{\"op\":\"%s\",\"worker_id\":%" PRIu64 ",\"dp_rank\":%" PRIu64 "%s}", op,
             worker, rank, extra ? extra : "");
}

/* The pair's whole state from a dump: the index of the pair is replaced
 * (every tier emptied first: the dump is all of it). */
static bool recover_dump(struct tail *t, struct stream *s)
{
    char req[256];
    struct answer a = {.t = t};
    int st;
    spaces_clear(&t->index, s->worker, s->rank);
    pair_request(req, sizeof req, "dump", s->worker, s->rank, NULL);
    st = ask(t->nc, t->o.query, req, answer_line, &a);
    free(a.ev.h.v);
    free(a.ev.th.v);
    if (st != 200 || !a.has_last || a.bad) {
        t->st.query_errors++;
        fprintf(stderr, "kvtail: dump worker_id=%" PRIu64 " dp_rank=%" PRIu64 ": status %d %s\n",
                s->worker, s->rank, st, a.error);
        return false;
    }
    t->st.dumps++;
    t->st.dump_blocks += a.blocks;
    s->next = a.last + 1;
    s->synced = true;
    fprintf(stderr,
            "kvtail: dump worker_id=%" PRIu64 " dp_rank=%" PRIu64 ": %" PRIu64 " blocks in %" PRIu64
            " events, last_event_id %" PRIu64 "\n",
            s->worker, s->rank, a.blocks, a.events, a.last);
    return true;
}

/* Events after next - 1 from kvbridge's ring; a dump when they are gone. */
static bool recover_events(struct tail *t, struct stream *s)
{
    char req[256], extra[64];
    struct answer a = {.t = t, .from = s->next};
    int st;
    snprintf(extra, sizeof extra, ",\"since\":%" PRIu64, s->next - 1);
    pair_request(req, sizeof req, "events", s->worker, s->rank, extra);
    t->st.events_asked++;
    st = ask(t->nc, t->o.query, req, answer_line, &a);
    free(a.ev.h.v);
    free(a.ev.th.v);
    if (st == 200 && a.has_last && !a.bad) {
        t->st.events_got += a.events;
        fprintf(stderr,
                "kvtail: events worker_id=%" PRIu64 " dp_rank=%" PRIu64 " since %" PRIu64
                ": %" PRIu64 " events, last_event_id %" PRIu64 "\n",
                s->worker, s->rank, s->next - 1, a.events, a.last);
        if (a.last + 1 > s->next)
            s->next = a.last + 1;
        return true;
    }
    if (st == 410) {
        t->st.gone++;
        fprintf(stderr, "kvtail: events since %" PRIu64 " are gone (410): asking for a dump\n",
                s->next - 1);
    } else {
        t->st.query_errors++;
        fprintf(stderr, "kvtail: events: status %d %s: asking for a dump\n", st, a.error);
    }
    return recover_dump(t, s);
}

/* One live event with --recover: a pair seen for the first time starts from
 * a dump; an event the dump or an events answer already had is skipped; an
 * event_id hole is filled from the events since (or a dump). */
static void recover_live(struct tail *t, const struct rev *ev)
{
    bool fresh;
    struct stream *s = stream_get(t, ev->worker, ev->rank, &fresh);
    if (!s->synced && !recover_dump(t, s)) {
        s->next = ev->id; /* no dump: from here on, as a live consumer */
        s->synced = true;
    }
    if (ev->id < s->next) {
        if (ev->id == 0 && ev->kind == K_CLEARED) { /* a new epoch of the counter */
            t->st.resets++;
            apply_index(t, ev);
            s->next = 1;
            return;
        }
        t->st.skipped++;
        return;
    }
    if (ev->id > s->next)
        recover_events(t, s);
    if (ev->id < s->next) {
        t->st.skipped++;
        return;
    }
    if (ev->id > s->next) /* nothing could fill it */
        add_hole(t, s, s->next, ev->id - 1);
    apply_index(t, ev);
    s->next = ev->id + 1;
}

/* At the end: events published after the last one received (the tail a
 * cut or a slow start left), so the index is as of kvbridge's last event. */
static void recover_tail(struct tail *t)
{
    for (size_t i = 0; i < t->nstreams; i++)
        if (t->streams[i].synced)
            recover_events(t, &t->streams[i]);
}

static void apply_rev(struct tail *t)
{
    if (t->o.has_worker && t->ev.worker != t->o.worker) {
        t->st.other_workers++; /* another engine behind the same bridge */
        return;
    }
    switch (t->ev.kind) {
    case K_STORED:
        t->st.stored++;
        t->st.blocks += t->ev.h.n;
        break;
    case K_REMOVED: t->st.removed++; break;
    case K_CLEARED: t->st.cleared++; break;
    }
    if (t->o.recover) {
        recover_live(t, &t->ev);
        return;
    }
    if (t->o.check)
        check_ids(t, &t->ev);
    if (t->o.index)
        apply_index(t, &t->ev);
}

static void handle_message(struct tail *t, const char *data, size_t len)
{
    struct cur c = {data, data + len};
    const char *why;

    t->st.messages++;
    if (!t->o.quiet) {
        fwrite(data, 1, len, stdout);
        fputc('\n', stdout);
    }
    why = parse_rev(&c, &t->ev);
    if (why) {
        t->st.bad++;
        if (t->reports_bad++ < MAX_REPORTS)
            fprintf(stderr, "kvtail: BAD message at byte %zu: expected %s: %.*s\n",
                    (size_t)(c.p - data), why, (int)(len > 300 ? 300 : len), data);
        return;
    }
    apply_rev(t);
}

/* ------------------------------------------ event plane (dynamo-msgpack) */

static void bad_mp(struct tail *t, const char *why, uint64_t a)
{
    t->st.bad++;
    if (t->reports_bad++ < MAX_REPORTS)
        fprintf(stderr, "kvtail: BAD event-plane message: %s (%" PRIu64 ")\n", why, a);
}

static bool key_is(const msgpack_object_kv *kv, const char *k)
{
    size_t n = strlen(k);
    return kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == n &&
           memcmp(kv->key.via.str.ptr, k, n) == 0;
}

static bool str_is(const msgpack_object *o, const char *k)
{
    size_t n = strlen(k);
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == n &&
           memcmp(o->via.str.ptr, k, n) == 0;
}

static const msgpack_object *map_get(const msgpack_object *m, const char *k)
{
    if (m->type != MSGPACK_OBJECT_MAP)
        return NULL;
    for (uint32_t i = 0; i < m->via.map.size; i++)
        if (key_is(&m->via.map.ptr[i], k))
            return &m->via.map.ptr[i].val;
    return NULL;
}

static bool get_u64(const msgpack_object *o, uint64_t *v)
{
    if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return false;
    *v = o->via.u64;
    return true;
}

/* One RouterEvent map (section 4) into t->ev; NULL or what is wrong. */
static const char *mp_rev(struct tail *t, const msgpack_object *m)
{
    struct rev *ev = &t->ev;
    const msgpack_object *tier, *res, *e, *data, *v;

    ev->h.n = ev->th.n = 0;
    ev->has_parent = false;
    if (m->type != MSGPACK_OBJECT_MAP)
        return "a RouterEvent is not a map";
    if (!get_u64(map_get(m, "worker_id"), &ev->worker))
        return "worker_id: not a uint";
    tier = map_get(m, "storage_tier");
    if (!tier || tier->type != MSGPACK_OBJECT_STR)
        return "storage_tier: missing (it is always written)";
    ev->tier = -1;
    for (int i = 0; i < NTIER; i++)
        if (str_is(tier, tier_names[i]))
            ev->tier = i;
    if (ev->tier < 0)
        return "storage_tier: unknown tier";
    res = map_get(m, "residency_domain");
    if (res && !str_is(res, "worker"))
        return "residency_domain: not \"worker\" (a nil makes the router drop the event)";
    e = map_get(m, "event");
    if (!e || e->type != MSGPACK_OBJECT_MAP)
        return "event: not a map";
    if (!get_u64(map_get(e, "event_id"), &ev->id))
        return "event.event_id: not a uint";
    if (!get_u64(map_get(e, "dp_rank"), &ev->rank))
        return "event.dp_rank: not a uint";
    data = map_get(e, "data");
    if (!data)
        return "event.data: missing";
    ev->scoped = false;
    if (str_is(data, "cleared")) {
        /* storage_tier is always written: "device" is Dynamo's
         * AllBlocksCleared (every tier, so a device-scoped clear reads as
         * all tiers here), any other tier that tier only */
        ev->kind = K_CLEARED;
        ev->scoped = ev->tier != T_DEVICE;
    } else if ((v = map_get(data, "stored"))) {
        const msgpack_object *ph = map_get(v, "parent_hash"), *sp = map_get(v, "start_position"),
                             *bl = map_get(v, "blocks");
        ev->kind = K_STORED;
        if (!ph || !sp)
            return "stored: parent_hash and start_position are always written";
        if (ph->type != MSGPACK_OBJECT_NIL) {
            if (!get_u64(ph, &ev->parent))
                return "stored.parent_hash: not a uint or nil";
            ev->has_parent = true;
        }
        if (!bl || bl->type != MSGPACK_OBJECT_ARRAY || bl->via.array.size == 0)
            return "stored.blocks: not a non-empty array";
        for (uint32_t i = 0; i < bl->via.array.size; i++) {
            const msgpack_object *b = &bl->via.array.ptr[i];
            uint64_t h, th;
            if (!get_u64(map_get(b, "block_hash"), &h) || !get_u64(map_get(b, "tokens_hash"), &th))
                return "stored.blocks[]: block_hash and tokens_hash must be uints";
            if (!map_get(b, "mm_extra_info"))
                return "stored.blocks[]: mm_extra_info is always written (nil)";
            vec_push(&ev->h, h);
            vec_push(&ev->th, th);
        }
    } else if ((v = map_get(data, "removed"))) {
        const msgpack_object *bh = map_get(v, "block_hashes");
        ev->kind = K_REMOVED;
        if (!bh || bh->type != MSGPACK_OBJECT_ARRAY || bh->via.array.size == 0)
            return "removed.block_hashes: not a non-empty array";
        for (uint32_t i = 0; i < bh->via.array.size; i++) {
            uint64_t h;
            if (!get_u64(&bh->via.array.ptr[i], &h))
                return "removed.block_hashes[]: not a uint";
            vec_push(&ev->h, h);
        }
    } else {
        return "event.data: not \"cleared\", {stored} or {removed}";
    }
    return NULL;
}

static void line_put(struct tail *t, size_t *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void line_put(struct tail *t, size_t *n, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(t->line + *n, t->line_cap - *n, fmt, ap);
        va_end(ap);
        if (k >= 0 && *n + (size_t)k < t->line_cap) {
            *n += (size_t)k;
            return;
        }
        t->line_cap = t->line_cap ? t->line_cap * 2 : 4096;
        t->line = xrealloc(t->line, t->line_cap);
    }
}

/* t->ev as its dynamo-json line (docs/router-events.md section 1). */
static void print_json(struct tail *t)
{
    const struct rev *ev = &t->ev;
    size_t n = 0;
    if (!t->line_cap) {
        t->line_cap = 4096;
        t->line = xrealloc(NULL, t->line_cap);
    }
    line_put(t, &n, "{\"worker_id\":%" PRIu64, ev->worker);
    if (ev->kind == K_CLEARED ? ev->scoped : ev->tier != T_DEVICE)
        line_put(t, &n, ",\"storage_tier\":\"%s\"", tier_names[ev->tier]);
    line_put(t, &n, ",\"event\":{\"event_id\":%" PRIu64 ",\"data\":", ev->id);
    if (ev->kind == K_CLEARED) {
        line_put(t, &n, "\"cleared\"");
    } else if (ev->kind == K_STORED) {
        if (ev->has_parent)
            line_put(t, &n, "{\"stored\":{\"parent_hash\":%" PRIu64 ",\"blocks\":[", ev->parent);
        else
            line_put(t, &n, "{\"stored\":{\"parent_hash\":null,\"blocks\":[");
        for (size_t i = 0; i < ev->h.n; i++)
            line_put(t, &n, "%s{\"block_hash\":%" PRIu64 ",\"tokens_hash\":%" PRIu64 "}",
                     i ? "," : "", ev->h.v[i], ev->th.v[i]);
        line_put(t, &n, "]}}");
    } else {
        line_put(t, &n, "{\"removed\":{\"block_hashes\":[");
        for (size_t i = 0; i < ev->h.n; i++)
            line_put(t, &n, "%s%" PRIu64, i ? "," : "", ev->h.v[i]);
        line_put(t, &n, "]}}");
    }
    line_put(t, &n, ",\"dp_rank\":%" PRIu64 "}}\n", ev->rank);
    fwrite(t->line, 1, n, stdout);
}

static struct pubstate *pub_get(struct tail *t, uint64_t publisher, bool *fresh)
{
    *fresh = false;
    for (size_t i = 0; i < t->npubs; i++)
        if (t->pubs[i].publisher == publisher)
            return &t->pubs[i];
    t->pubs = xrealloc(t->pubs, (t->npubs + 1) * sizeof *t->pubs);
    memset(&t->pubs[t->npubs], 0, sizeof t->pubs[0]);
    t->pubs[t->npubs].publisher = publisher;
    *fresh = true;
    return &t->pubs[t->npubs++];
}

static void seq_problem(struct tail *t, const char *what, uint64_t pub, uint64_t got, uint64_t want)
{
    t->st.seqerr++;
    if (t->reports_seq++ < MAX_REPORTS)
        fprintf(stderr,
                "kvtail: SEQUENCE publisher_id=%" PRIx64 " %s: got %" PRIu64 ", expected %" PRIu64
                "\n",
                pub, what, got, want);
}

/* One envelope (section 3): header checks, then its RouterEvents. */
static void handle_envelope(struct tail *t, const char *data, size_t len)
{
    msgpack_unpacked u;
    size_t off = 0;
    uint64_t pub, seq, at;
    const msgpack_object *topic, *payload;

    t->st.envelopes++;
    msgpack_unpacked_init(&u);
    if (msgpack_unpack_next(&u, data, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len) {
        bad_mp(t, "not one msgpack object", len);
        goto out;
    }
    if (!get_u64(map_get(&u.data, "publisher_id"), &pub) ||
        !get_u64(map_get(&u.data, "sequence"), &seq) ||
        !get_u64(map_get(&u.data, "published_at"), &at)) {
        bad_mp(t, "envelope: publisher_id, sequence, published_at must be uints", len);
        goto out;
    }
    if (pub >> 53)
        bad_mp(t, "publisher_id above 53 bits", pub);
    topic = map_get(&u.data, "topic");
    if (!topic || !str_is(topic, "kv-events")) {
        bad_mp(t, "envelope: topic is not \"kv-events\"", pub);
        goto out;
    }
    payload = map_get(&u.data, "payload");
    if (!payload || payload->type != MSGPACK_OBJECT_BIN) {
        bad_mp(t, "envelope: payload is not bin", pub);
        goto out;
    }
    bool fresh;
    struct pubstate *ps = pub_get(t, pub, &fresh);
    if (fresh && seq != 0 && !t->o.allow_offset)
        seq_problem(t, "first message", pub, seq, 0);
    else if (!fresh && seq != ps->next_seq)
        seq_problem(t, seq > ps->next_seq ? "hole" : "went back", pub, seq, ps->next_seq);
    ps->next_seq = seq + 1;

    msgpack_unpacked pu;
    size_t poff = 0;
    msgpack_unpacked_init(&pu);
    if (msgpack_unpack_next(&pu, payload->via.bin.ptr, payload->via.bin.size, &poff) !=
            MSGPACK_UNPACK_SUCCESS ||
        poff != payload->via.bin.size) {
        bad_mp(t, "payload: not one msgpack object", pub);
    } else {
        const msgpack_object *evs = &pu.data;
        uint32_t n = evs->type == MSGPACK_OBJECT_ARRAY ? evs->via.array.size : 1;
        if (evs->type == MSGPACK_OBJECT_ARRAY && n == 0)
            bad_mp(t, "payload: an empty array", pub);
        for (uint32_t i = 0; i < n; i++) {
            const msgpack_object *one =
                evs->type == MSGPACK_OBJECT_ARRAY ? &evs->via.array.ptr[i] : evs;
            const char *why = mp_rev(t, one);
            if (why) {
                bad_mp(t, why, pub);
                continue;
            }
            if (!ps->has_pair) {
                ps->has_pair = true;
                ps->worker = t->ev.worker;
                ps->rank = t->ev.rank;
            } else if (ps->worker != t->ev.worker || ps->rank != t->ev.rank) {
                bad_mp(t, "a publisher_id with two (worker_id, dp_rank) pairs", pub);
            }
            t->st.messages++;
            if (!t->o.quiet)
                print_json(t);
            apply_rev(t);
        }
    }
    msgpack_unpacked_destroy(&pu);
out:
    msgpack_unpacked_destroy(&u);
}

/* --------------------------------------------------------- raw batches */

static void handle_raw(struct tail *t, natsMsg *msg)
{
    const char *seqs = NULL, *src = NULL, *topic = NULL, *rank = NULL;
    char key[512];
    t->st.messages++;
    natsMsgHeader_Get(msg, "KV-Seq", &seqs);
    natsMsgHeader_Get(msg, "KV-Source", &src);
    natsMsgHeader_Get(msg, "KV-Topic", &topic);
    natsMsgHeader_Get(msg, "KV-DP-Rank", &rank);
    if (!seqs || !src || !rank) {
        bad_mp(t, "raw: a KV-Seq, KV-Source or KV-DP-Rank header is missing",
               (uint64_t)natsMsg_GetDataLength(msg));
        return;
    }
    if (!topic)
        topic = ""; /* absent when the engine's topic frame is empty */
    uint64_t seq = strtoull(seqs, NULL, 10);
    snprintf(key, sizeof key, "%s\n%s", src, topic);
    if (!t->o.quiet)
        printf("{\"seq\":%" PRIu64 ",\"source\":\"%s\",\"topic\":\"%s\",\"dp_rank\":%s,"
               "\"bytes\":%d}\n",
               seq, src, topic, rank, natsMsg_GetDataLength(msg));
    for (size_t i = 0; i < t->nraws; i++) {
        if (strcmp(t->raws[i].key, key))
            continue;
        if (seq != t->raws[i].next)
            seq_problem(t, "raw KV-Seq", i, seq, t->raws[i].next);
        t->raws[i].next = seq + 1;
        return;
    }
    t->raws = xrealloc(t->raws, (t->nraws + 1) * sizeof *t->raws);
    snprintf(t->raws[t->nraws].key, sizeof t->raws[0].key, "%s", key);
    t->raws[t->nraws++].next = seq + 1;
}

/* ------------------------------------------------- kvsim record (truth) */

/* The record format: tools/README.md. */

static void skip_ws(struct cur *c)
{
    while (c->p < c->e && (*c->p == ' ' || *c->p == '\t' || *c->p == '\r' || *c->p == '\n'))
        c->p++;
}

static bool jlit(struct cur *c, const char *s)
{
    skip_ws(c);
    return lit(c, s);
}

/* A JSON string into buf (truncated, escapes simplified). */
static bool jstr(struct cur *c, char *buf, size_t cap)
{
    size_t n = 0;
    skip_ws(c);
    if (c->p >= c->e || *c->p != '"')
        return false;
    c->p++;
    while (c->p < c->e && *c->p != '"') {
        char ch = *c->p++;
        if (ch == '\\') {
            if (c->p >= c->e)
                return false;
            ch = *c->p++;
            if (ch == 'u') {
                if (c->e - c->p < 4)
                    return false;
                c->p += 4;
                ch = '?';
            }
        }
        if (n + 1 < cap)
            buf[n++] = ch;
    }
    if (c->p >= c->e)
        return false;
    c->p++;
    if (cap)
        buf[n] = '\0';
    return true;
}

static bool jskip(struct cur *c, int depth)
{
    char tmp[2];
    skip_ws(c);
    if (c->p >= c->e || depth > 64)
        return false;
    if (*c->p == '"')
        return jstr(c, tmp, sizeof tmp);
    if (*c->p == '{' || *c->p == '[') {
        char close = *c->p == '{' ? '}' : ']';
        bool obj = *c->p == '{';
        c->p++;
        if (jlit(c, close == '}' ? "}" : "]"))
            return true;
        for (;;) {
            if (obj && (!jstr(c, tmp, sizeof tmp) || !jlit(c, ":")))
                return false;
            if (!jskip(c, depth + 1))
                return false;
            if (jlit(c, ","))
                continue;
            return jlit(c, close == '}' ? "}" : "]");
        }
    }
    /* number, true, false, null */
    {
        const char *start = c->p;
        while (c->p < c->e && *c->p != ',' && *c->p != '}' && *c->p != ']' && *c->p != ' ')
            c->p++;
        return c->p > start;
    }
}

static bool jnum_array(struct cur *c, struct vec *v)
{
    if (!jlit(c, "["))
        return false;
    if (jlit(c, "]"))
        return true;
    for (;;) {
        uint64_t x;
        skip_ws(c);
        if (!num(c, &x))
            return false;
        vec_push(v, x);
        if (jlit(c, ","))
            continue;
        return jlit(c, "]");
    }
}

struct recev {
    enum kind kind;
    int tier;
    /* "cleared": of `tier` only ("scoped":true), or one a bridge drops
     * ("drop": an AllBlocksCleared that names a medium) */
    bool scoped, dropped;
    uint64_t group;
    size_t h_off, nh, th_off, nth;
    /* a parity record's truth: fwd (-1 absent), the hashes a remove releases */
    int fwd;
    bool has_rel;
    size_t rel_off, nrel;
};

struct recline {
    struct recev *ev;
    size_t nev, cap;
    struct vec h, th, rel;
};

static int tier_from_name(const char *s)
{
    for (int i = 0; i < NTIER; i++)
        if (!strcmp(s, tier_names[i]))
            return i;
    return -1;
}

static bool rec_event(struct cur *c, struct recline *rl)
{
    struct recev e;

    memset(&e, 0, sizeof e);
    e.kind = (enum kind) - 1;
    e.h_off = rl->h.n;
    e.th_off = rl->th.n;
    e.rel_off = rl->rel.n;
    e.fwd = -1;
    if (!jlit(c, "{"))
        return false;
    if (!jlit(c, "}")) {
        char key[64], val[64];
        for (;;) {
            if (!jstr(c, key, sizeof key) || !jlit(c, ":"))
                return false;
            if (!strcmp(key, "type")) {
                if (!jstr(c, val, sizeof val))
                    return false;
                e.kind = !strcmp(val, "stored")    ? K_STORED
                         : !strcmp(val, "removed") ? K_REMOVED
                         : !strcmp(val, "cleared") ? K_CLEARED
                                                   : (enum kind) - 1;
            } else if (!strcmp(key, "hashes")) {
                if (!jnum_array(c, &rl->h))
                    return false;
            } else if (!strcmp(key, "tokens_hashes")) {
                if (!jnum_array(c, &rl->th))
                    return false;
            } else if (!strcmp(key, "tier")) {
                if (!jstr(c, val, sizeof val) || (e.tier = tier_from_name(val)) < 0)
                    return false;
            } else if (!strcmp(key, "group")) {
                skip_ws(c);
                if (!num(c, &e.group))
                    return false;
            } else if (!strcmp(key, "fwd")) {
                e.fwd = jlit(c, "true") ? 1 : 0;
                if (!e.fwd && !jlit(c, "false"))
                    return false;
            } else if (!strcmp(key, "released")) {
                if (!jnum_array(c, &rl->rel))
                    return false;
                e.has_rel = true;
            } else if (!strcmp(key, "scoped")) {
                e.scoped = jlit(c, "true");
                if (!e.scoped && !jlit(c, "false"))
                    return false;
            } else if (!strcmp(key, "drop")) {
                if (!jstr(c, val, sizeof val))
                    return false;
                e.dropped = true;
            } else if (!jskip(c, 0)) {
                return false;
            }
            if (jlit(c, ","))
                continue;
            if (!jlit(c, "}"))
                return false;
            break;
        }
    }
    if ((int)e.kind < 0)
        return false;
    e.nh = rl->h.n - e.h_off;
    e.nth = rl->th.n - e.th_off;
    e.nrel = rl->rel.n - e.rel_off;
    if (e.kind == K_STORED && e.nth != e.nh)
        return false;
    if (rl->nev == rl->cap) {
        rl->cap = rl->cap ? rl->cap * 2 : 16;
        rl->ev = xrealloc(rl->ev, rl->cap * sizeof *rl->ev);
    }
    rl->ev[rl->nev++] = e;
    return true;
}

/* A parity workload's event (kvsim --workload hybrid, ...): the record
 * says what a bridge following Dynamo's rules publishes, whatever the
 * group: a store with fwd true, a remove's released hashes.  A block is
 * held once (a router's block has a set of workers, not a count). */
static void truth_parity(struct tail *t, const struct recline *rl, const struct recev *e,
                         uint64_t rank)
{
    struct space *sp = space_get(&t->truth, 0, rank, e->tier, true);

    if (e->kind == K_STORED) {
        for (size_t k = 0; e->fwd == 1 && k < e->nh; k++)
            if (!hset_has(&sp->set, rl->h.v[e->h_off + k], NULL))
                hset_add(&sp->set, rl->h.v[e->h_off + k], rl->th.v[e->th_off + k]);
        return;
    }
    for (size_t k = 0; k < e->nrel; k++)
        hset_del(&sp->set, rl->rel.v[e->rel_off + k]);
}

/* One record line: the engine's own view, so every event applies (live or not). */
static bool rec_line(struct tail *t, struct recline *rl, const char *line, size_t len)
{
    struct cur c = {line, line + len};
    char key[64];
    uint64_t rank = 0;
    bool have_rank = false;

    rl->nev = rl->h.n = rl->th.n = rl->rel.n = 0;
    if (!jlit(&c, "{"))
        return false;
    for (;;) {
        if (!jstr(&c, key, sizeof key) || !jlit(&c, ":"))
            return false;
        if (!strcmp(key, "rank")) {
            skip_ws(&c);
            if (!num(&c, &rank))
                return false;
            have_rank = true;
        } else if (!strcmp(key, "events")) {
            if (!jlit(&c, "["))
                return false;
            if (!jlit(&c, "]")) {
                for (;;) {
                    if (!rec_event(&c, rl))
                        return false;
                    if (jlit(&c, ","))
                        continue;
                    if (!jlit(&c, "]"))
                        return false;
                    break;
                }
            }
        } else if (!jskip(&c, 0)) {
            return false;
        }
        if (jlit(&c, ","))
            continue;
        if (!jlit(&c, "}"))
            return false;
        break;
    }
    if (!have_rank)
        return false;
    for (size_t i = 0; i < rl->nev; i++) {
        const struct recev *e = &rl->ev[i];
        struct space *sp;
        if (e->kind == K_CLEARED) {
            if (e->dropped)
                continue; /* the bridge publishes nothing: the router keeps it all */
            if (!e->scoped) {
                spaces_clear(&t->truth, 0, rank);
            } else if ((sp = space_get(&t->truth, 0, rank, e->tier, false))) {
                hset_clear(&sp->set);
            }
            continue;
        }
        if (e->fwd >= 0 || e->has_rel) {
            truth_parity(t, rl, e, rank);
            continue;
        }
        if (e->group != 0)
            continue; /* the router never sees secondary groups */
        sp = space_get(&t->truth, 0, rank, e->tier, true);
        for (size_t k = 0; k < e->nh; k++) {
            if (e->kind == K_STORED)
                hset_add(&sp->set, rl->h.v[e->h_off + k], rl->th.v[e->th_off + k]);
            else
                hset_del(&sp->set, rl->h.v[e->h_off + k]);
        }
    }
    return true;
}

static int load_record(struct tail *t)
{
    FILE *f = fopen(t->o.expect, "r");
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t n;
    struct recline rl;
    int rc = 0;

    if (!f) {
        fprintf(stderr, "kvtail: %s: %s\n", t->o.expect, strerror(errno));
        return -errno;
    }
    memset(&rl, 0, sizeof rl);
    while ((n = read_line(f, &line, &cap)) >= 0) {
        lineno++;
        if (n == 0)
            continue;
        if (!rec_line(t, &rl, line, (size_t)n)) {
            fprintf(stderr, "kvtail: %s:%zu: not a kvsim record line\n", t->o.expect, lineno);
            rc = -EINVAL;
            break;
        }
    }
    free(line);
    free(rl.ev);
    free(rl.h.v);
    free(rl.th.v);
    free(rl.rel.v);
    fclose(f);
    return rc;
}

/* WRONG: the index holds a block the engine does not hold at the end. */
static void compare_with_record(struct tail *t)
{
    for (size_t i = 0; i < t->index.n; i++) {
        const struct space *sp = &t->index.s[i];
        const struct space *tr = space_get(&t->truth, 0, sp->rank, sp->tier, false);
        for (size_t k = 0; k <= sp->set.mask; k++) {
            uint64_t h = sp->set.keys[k], th;
            if (!sp->set.cnt[k])
                continue;
            t->st.indexed++;
            if (!tr || !hset_has(&tr->set, h, &th)) {
                t->st.wrong++;
                if (t->reports_wrong++ < MAX_REPORTS)
                    fprintf(stderr,
                            "kvtail: WRONG worker_id=%" PRIu64 " dp_rank=%" PRIu64
                            " tier=%s block_hash %" PRIu64
                            " is indexed but not stored on the engine\n",
                            sp->worker, sp->rank, tier_names[sp->tier], h);
            } else if (th != sp->set.aux[k]) {
                t->st.badtok++;
                if (t->reports_wrong++ < MAX_REPORTS)
                    fprintf(stderr,
                            "kvtail: WRONG tokens_hash worker_id=%" PRIu64 " dp_rank=%" PRIu64
                            " block_hash %" PRIu64 ": got %" PRIu64 ", engine %" PRIu64 "\n",
                            sp->worker, sp->rank, h, sp->set.aux[k], th);
            }
        }
    }
    for (size_t i = 0; i < t->truth.n; i++) {
        const struct space *tr = &t->truth.s[i];
        if (tr->tier != T_DEVICE && !t->tier_seen[tr->tier])
            continue; /* a tier the bridge does not forward */
        for (size_t k = 0; k <= tr->set.mask; k++) {
            bool found = false;
            if (!tr->set.cnt[k])
                continue;
            for (size_t j = 0; j < t->index.n && !found; j++) {
                const struct space *sp = &t->index.s[j];
                found = sp->rank == tr->rank && sp->tier == tr->tier &&
                        hset_has(&sp->set, tr->set.keys[k], NULL);
            }
            if (!found)
                t->st.missing++;
        }
    }
}

/* ----------------------------------------------------------------- NATS */

/* The server of o (--server), reconnecting as --reconnect-wait says. */
static natsConnection *connect_nats(const struct opts *o)
{
    const char *url = o->server;
    natsOptions *opts = NULL;
    natsConnection *nc = NULL;
    natsStatus s = natsOptions_Create(&opts);

    if (s == NATS_OK)
        s = natsOptions_SetURL(opts, url);
    if (s == NATS_OK)
        s = natsOptions_SetName(opts, "kvtail");
    if (s == NATS_OK)
        s = natsOptions_SetTimeout(opts, 3000);
    if (s == NATS_OK && o->reconnect_ms) { /* try again this often, forever */
        s = natsOptions_SetReconnectWait(opts, o->reconnect_ms);
        if (s == NATS_OK)
            s = natsOptions_SetMaxReconnect(opts, -1);
    }
    if (s == NATS_OK)
        s = natsConnection_Connect(&nc, opts);
    if (s != NATS_OK) {
        fprintf(stderr, "kvtail: connect %s: %s\n", url, natsStatus_GetText(s));
        nc = NULL;
    }
    natsOptions_Destroy(opts);
    return nc;
}

static int do_publish(const struct opts *o)
{
    FILE *f = strcmp(o->publish, "-") ? fopen(o->publish, "r") : stdin;
    natsConnection *nc = NULL;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    uint64_t count = 0;
    natsStatus s = NATS_OK;
    int rc = 2;

    if (!f) {
        fprintf(stderr, "kvtail: %s: %s\n", o->publish, strerror(errno));
        return 2;
    }
    if (strpbrk(o->subject, "*>")) {
        fprintf(stderr, "kvtail: --publish needs a subject without wildcards\n");
        goto out;
    }
    if (o->format == F_RAW) {
        fprintf(stderr, "kvtail: --publish takes dynamo-json or dynamo-msgpack (hex) lines\n");
        goto out;
    }
    nc = connect_nats(o);
    if (!nc)
        goto out;
    while (!stop_flag && (n = read_line(f, &line, &cap)) >= 0) {
        if (n == 0)
            continue;
        if (o->format == F_MSGPACK) { /* a hex line (kvbridge-inspect --format dynamo-msgpack) */
            ssize_t k = 0;
            for (ssize_t i = 0; i + 1 < n; i += 2) {
                unsigned v;
                if (sscanf(line + i, "%2x", &v) != 1)
                    break;
                line[k++] = (char)v;
            }
            if (k * 2 != n) {
                fprintf(stderr, "kvtail: --publish: line %" PRIu64 " is not hex\n", count + 1);
                goto out;
            }
            n = k;
        }
        s = natsConnection_Publish(nc, o->subject, line, (int)n);
        if (s != NATS_OK)
            break;
        count++;
    }
    if (s == NATS_OK)
        s = natsConnection_FlushTimeout(nc, 5000);
    if (s != NATS_OK) {
        fprintf(stderr, "kvtail: publish: %s\n", natsStatus_GetText(s));
        goto out;
    }
    fprintf(stderr, "kvtail: published %" PRIu64 " messages to %s\n", count, o->subject);
    rc = 0;
out:
    free(line);
    if (f != stdin)
        fclose(f);
    natsConnection_Destroy(nc);
    return rc;
}

/* --dump W:R: a summary of the dump; --match W:R: the answer as it is. */
struct summary {
    uint64_t lines, events, blocks, tier_blocks[NTIER], last;
    bool has_last, bad;
    char error[256], match[512];
};

static void summary_line(void *ctx, const char *line, size_t len)
{
    struct summary *m = ctx;
    struct cur c = {line, line + len};
    struct rev ev;
    if (len == 0)
        return;
    m->lines++;
    if (last_line(line, len, &m->last)) {
        m->has_last = true;
        return;
    }
    if (len > 9 && !memcmp(line, "{\"error\":", 9)) {
        snprintf(m->error, sizeof m->error, "%.*s", (int)len, line);
        return;
    }
    if (len > 18 && !memcmp(line, "{\"matched_blocks\":", 18)) {
        snprintf(m->match, sizeof m->match, "%.*s", (int)len, line);
        return;
    }
    memset(&ev, 0, sizeof ev);
    if (parse_rev(&c, &ev)) {
        m->bad = true;
    } else {
        m->events++;
        if (ev.kind == K_STORED) {
            m->blocks += ev.h.n;
            m->tier_blocks[ev.tier] += ev.h.n;
        }
    }
    free(ev.h.v);
    free(ev.th.v);
}

static int do_query_once(const struct opts *o)
{
    natsConnection *nc = connect_nats(o);
    struct summary m;
    char *req = NULL;
    size_t cap = 0;
    FILE *f;
    int st, rc = 1;

    if (!nc)
        return 2;
    memset(&m, 0, sizeof m);
    f = open_memstream(&req, &cap);
    if (!f) {
        natsConnection_Destroy(nc);
        return 2;
    }
    fprintf(f, "{\"op\":\"%s\",\"worker_id\":%" PRIu64 ",\"dp_rank\":%" PRIu64,
            o->dump ? "dump" : "match", o->pairs[0].worker, o->pairs[0].rank);
    if (o->match) {
        fprintf(f, ",\"token_ids\":[%s]", o->tokens ? o->tokens : "");
        if (o->lora)
            fprintf(f, ",\"lora_name\":\"%s\"", o->lora);
        if (o->block_size)
            fprintf(f, ",\"block_size\":%" PRIu64, o->block_size);
    }
    fputc('}', f);
    fclose(f);
    st = ask(nc, o->query, req, summary_line, &m);
    if (st != 200) {
        fprintf(stderr, "kvtail: query: status %d %s\n", st, m.error);
    } else if (o->match) {
        printf("%s\n", m.match);
        rc = 0;
    } else if (m.has_last && !m.bad) {
        printf("kvtail: dump worker_id=%" PRIu64 " dp_rank=%" PRIu64 " last_event_id=%" PRIu64
               " lines=%" PRIu64 " events=%" PRIu64 " blocks=%" PRIu64,
               o->pairs[0].worker, o->pairs[0].rank, m.last, m.lines, m.events, m.blocks);
        for (int i = 0; i < NTIER; i++)
            printf(" %s=%" PRIu64, tier_names[i], m.tier_blocks[i]);
        printf("\n");
        rc = 0;
    } else {
        fprintf(stderr, "kvtail: dump: %s\n",
                m.bad ? "a line is not a router event" : "no last_event_id line");
    }
    free(req);
    natsConnection_Destroy(nc);
    return rc;
}

static int write_ready(const char *path)
{
    char tmp[4096];
    FILE *f;

    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return -ENAMETOOLONG;
    f = fopen(tmp, "w");
    if (!f)
        return -errno;
    fprintf(f, "%ld\n", (long)getpid());
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        return -errno;
    }
    return 0;
}

/* --------------------------------------------------------------- options */

/* The TOOL_CALL options (the others only store their value). */
enum { OPT_HELP = 1, OPT_PAIR, OPT_DUMP, OPT_MATCH, OPT_CUT, OPT_WORKER };

#define BAD_NUMBER "bad number '%s'"
#define BAD_PAIR "bad pair '%s' (WORKER_ID:DP_RANK)"
/* The values of --format, in the order of enum fmt. */
static const char *const format_names[] = {"dynamo-json", "dynamo-msgpack", "raw", NULL};

#define F(f) TOOL_FIELD(struct opts, f)
/* clang-format off */
/* The command line: every option, what it does and its help (tools_common.h). */
static const struct tool_opt options[] = {
    {.help = "usage: kvtail [options]"},
    {.help = "Subscribes to kvbridge's router events on NATS, prints and checks them."},
    {.help = ""},
    {.name = "server", .arg = "URL", .kind = TOOL_STR, F(server),
     .help = "NATS server (default nats://127.0.0.1:4222)"},
    {.name = "subject", .arg = "SUBJ", .kind = TOOL_STR, F(subject),
     .help = "subject, wildcards allowed\n"
              "(default namespace.dynamo.component.backend.kv_events)"},
    {.name = "count", .arg = "N", .kind = TOOL_U64, F(count), .min = 0, .max = UINT64_MAX,
     .bad = BAD_NUMBER,
     .help = "exit after N messages"},
    {.name = "timeout", .arg = "MS", .kind = TOOL_U64, F(timeout_ms), .min = 0,
     .max = 86400000ULL * 365, .bad = BAD_NUMBER,
     .help = "exit when idle MS after the last message, or after MS\n"
              "if none arrives (default 0 = never)"},
    {.name = "reconnect-wait", .arg = "MS", .kind = TOOL_U64, F(reconnect_ms), .min = 1,
     .max = 3600000, .bad = BAD_NUMBER,
     .help = "after losing the server, try to reconnect every MS,\n"
              "forever (default: nats.c's 2 s, 60 times)"},
    {.name = "quiet", .short_name = 'q', .kind = TOOL_FLAG, F(quiet),
     .help = "do not print messages"},
    {.name = "check", .kind = TOOL_FLAG, F(check),
     .help = "event_id must be contiguous per (worker_id, dp_rank) from 0;\n"
              "reports holes, duplicates, reorderings; malformed messages\n"
              "fail too (the parser takes exactly the dynamo-json shape)"},
    {.name = "allow-start-offset", .kind = TOOL_FLAG, F(allow_offset),
     .help = "with --check: the first event_id of a pair may be anything"},
    {.name = "index", .kind = TOOL_FLAG, F(index),
     .help = "apply events to an index per (worker_id, dp_rank, tier) like\n"
              "Dynamo's indexer: a store with an unknown parent is dropped\n"
              "whole (orphans=), unknown removes are ignored (counted),\n"
              "\"cleared\" empties every tier of the pair, one with a\n"
              "storage_tier (dynamo-json) only that tier; dynamo-msgpack\n"
              "always names one: \"device\" is every tier (Dynamo's\n"
              "AllBlocksCleared, so a device-scoped clear reads as all\n"
              "tiers), any other that tier only"},
    {.name = "index-set", .kind = TOOL_FLAG, F(index_set),
     .help = "with --index: a store of an indexed block adds nothing (one\n"
              "copy per block, as Dynamo's radix tree; the bridge counts\n"
              "copies), so one remove deletes it"},
    {.name = "expect-record", .arg = "FILE", .kind = TOOL_STR, F(expect),
     .help = "kvsim --record file (implies --index): at exit, an indexed\n"
              "block that the engine no longer holds, or a wrong tokens_hash,\n"
              "is WRONG (fails); engine blocks absent from the index are\n"
              "counted as missing (fine after barriers)"},
    {.name = "ready-file", .arg = "PATH", .kind = TOOL_STR, F(ready),
     .help = "written once subscribed (start publishers after it exists)"},
    {.name = "publish", .arg = "FILE", .kind = TOOL_STR, F(publish),
     .help = "publish each non-empty line of FILE ('-' = stdin) to\n"
              "--subject, then exit (--format dynamo-msgpack: each line\n"
              "is a message in hex, as kvbridge-inspect writes them)"},
    {.name = "format", .arg = "F", .kind = TOOL_CHOICE, F(format), .choices = format_names,
     .bad = "--format: dynamo-json, dynamo-msgpack or raw",
     .help = "dynamo-json (default), dynamo-msgpack (event-plane\n"
              "envelopes: sequence contiguous per publisher_id from 0,\n"
              "one (worker_id, dp_rank) per publisher and message; each\n"
              "RouterEvent printed and checked as its dynamo-json line,\n"
              "messages= counts router events, envelopes= NATS messages;\n"
              "default subject namespace.dynamo.component.backend.\n"
              "endpoint.generate.kv-events) or raw (engine batches with\n"
              "KV-* headers: KV-Seq contiguous per source and topic)"},
    {.name = "query", .arg = "SUBJ", .kind = TOOL_STR, F(query),
     .help = "kvbridge's query subject (query.subject, e.g.\n"
              "kvbridge.query.7), for the options below"},
    {.name = "recover", .kind = TOOL_FLAG, F(recover),
     .help = "with --index: start late and recover from the query API:\n"
              "a pair's first event brings a dump (the index of the pair\n"
              "is replaced by it, live events up to its last_event_id are\n"
              "skipped); an event_id hole asks for the events since (a\n"
              "dump when they are gone: 410); at exit the events after\n"
              "the last one received are asked once more"},
    {.name = "pair", .arg = "W:R", .kind = TOOL_CALL, .id = OPT_PAIR, .bad = BAD_PAIR,
     .help = "with --recover: ask this pair's dump at start (repeatable)"},
    {.name = "cut-after", .arg = "N:MS", .kind = TOOL_CALL, .id = OPT_CUT,
     .bad = "bad --cut-after '%s' (N:MS)",
     .help = "test hook: after N messages, unsubscribe for MS ms"},
    {.name = "dump", .arg = "W:R", .kind = TOOL_CALL, .id = OPT_DUMP, .bad = BAD_PAIR,
     .help = "print a summary of the pair's dump, then exit:\n"
              "kvtail: dump ... last_event_id=N blocks=N device=N ..."},
    {.name = "match", .arg = "W:R", .kind = TOOL_CALL, .id = OPT_MATCH, .bad = BAD_PAIR,
     .help = "print {\"matched_blocks\":{...}} for --tokens, then exit"},
    {.name = "tokens", .arg = "LIST", .kind = TOOL_STR, F(tokens),
     .help = "comma-separated token ids (--match)"},
    {.name = "lora", .arg = "NAME", .kind = TOOL_STR, F(lora),
     .help = "LoRA adapter name (--match)"},
    {.name = "block-size", .arg = "N", .kind = TOOL_U64, F(block_size), .min = 1, .max = UINT64_MAX,
     .bad = "bad --block-size '%s'",
     .help = "when kvbridge's block_size is auto (--match)"},
    {.name = "worker", .arg = "W", .kind = TOOL_CALL, .id = OPT_WORKER, .min = 0, .max = UINT64_MAX,
     .bad = "bad --worker '%s'",
     .help = "only router events of worker_id W are counted, checked and\n"
              "indexed (one engine's, when a bridge serves several: the\n"
              "record of --expect-record is that engine's); the others\n"
              "are ignored (other_workers= in the summary)"},
    {.name = "help", .short_name = 'h', .kind = TOOL_CALL, .id = OPT_HELP, .usage = "-h, --help",
     .help = "this text"},
    {.help = ""},
    {.help = "Prints each message on its own line on stdout (unless --quiet); at exit a summary"},
    {.help = "on stderr and a last stdout line:"},
    {.help = "  kvtail: messages=N stored=N removed=N cleared=N holes=N dups=N wrong=N "
             "missing=N ..."},
    {.help = "Exit: 0 checks pass, 1 a check failed (or --count not reached), 2 usage/connection."},
};
/* clang-format on */
#undef F
#define N_OPTIONS (sizeof options / sizeof options[0])

static void usage(FILE *f) { tool_usage(f, options, N_OPTIONS, 24); }

/* "W:R" -> a pair; false when malformed. */
static bool parse_pair(const char *s, struct pair_arg *p)
{
    char *end;
    if (*s < '0' || *s > '9')
        return false;
    errno = 0;
    p->worker = strtoull(s, &end, 10);
    if (errno || *end != ':' || end[1] < '0' || end[1] > '9')
        return false;
    p->rank = strtoull(end + 1, &end, 10);
    return !errno && !*end && p->rank <= UINT32_MAX;
}

/* A bad value for row R: -EINVAL, reported. */
static int bad_value(const struct tool_opt *r, const char *arg)
{
    fputs("kvtail: ", stderr);
    fprintf(stderr, r->bad ? r->bad : "bad value '%s'", arg);
    fputc('\n', stderr);
    return -EINVAL;
}

/* What a TOOL_CALL option does with ARG: 0 or -EINVAL (reported); --help
 * exits. */
static int call_option(const struct tool_opt *r, const char *arg, void *base)
{
    struct opts *o = base;
    unsigned long long n;
    long ms;
    char tail;
    switch (r->id) {
    case OPT_HELP: usage(stdout); exit(0);
    case OPT_PAIR:
    case OPT_DUMP:
    case OPT_MATCH:
        if (o->npairs == MAX_PAIRS || !parse_pair(arg, &o->pairs[o->npairs]))
            return bad_value(r, arg);
        o->npairs++;
        o->dump |= r->id == OPT_DUMP;
        o->match |= r->id == OPT_MATCH;
        return 0;
    case OPT_CUT:
        if (sscanf(arg, "%llu:%ld%c", &n, &ms, &tail) != 2 || ms < 0)
            return bad_value(r, arg);
        o->cut_after = n;
        o->cut_ms = ms;
        return 0;
    case OPT_WORKER:
        if (tool_u64(r, arg, &o->worker))
            return bad_value(r, arg);
        o->has_worker = true;
        return 0;
    default: return bad_value(r, arg);
    }
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    static const struct tool_handlers h = {call_option, bad_value, usage};
    if (tool_parse(argc, argv, options, N_OPTIONS, o, &h) < 0)
        return -EINVAL;
    if (o->expect)
        o->index = true;
    if (!o->subject) /* the default subject of the format */
        o->subject = o->format == F_MSGPACK
                         ? "namespace.dynamo.component.backend.endpoint.generate.kv-events"
                         : "namespace.dynamo.component.backend.kv_events";
    if (optind < argc) {
        fprintf(stderr, "kvtail: unexpected argument '%s'\n", argv[optind]);
        return -EINVAL;
    }
    if (!*o->subject) {
        fprintf(stderr, "kvtail: empty --subject\n");
        return -EINVAL;
    }
    if ((o->recover || o->dump || o->match) && !o->query) {
        fprintf(stderr, "kvtail: --recover, --dump and --match need --query SUBJ\n");
        return -EINVAL;
    }
    if (o->dump + o->match + o->recover > 1 || ((o->dump || o->match) && o->npairs != 1)) {
        fprintf(stderr, "kvtail: one of --recover, --dump W:R, --match W:R\n");
        return -EINVAL;
    }
    if (o->recover)
        o->index = true;
    return 0;
}

/* ------------------------------------------------------------------ main */

static void report(struct tail *t, int64_t dropped)
{
    const struct stats *s = &t->st;

    fprintf(stderr,
            "kvtail: summary: messages=%" PRIu64 " (stored=%" PRIu64 " with %" PRIu64
            " blocks, removed=%" PRIu64 ", cleared=%" PRIu64 ", bad=%" PRIu64 ")\n",
            s->messages, s->stored, s->blocks, s->removed, s->cleared, s->bad);
    if (t->o.has_worker)
        fprintf(stderr, "kvtail: worker %" PRIu64 " only: other_workers=%" PRIu64 "\n", t->o.worker,
                s->other_workers);
    if (t->o.check)
        fprintf(stderr,
                "kvtail: check: pairs=%zu holes=%" PRIu64 " (%" PRIu64 " ids) dups=%" PRIu64
                " reorders=%" PRIu64 " resets=%" PRIu64 "\n",
                t->nstreams, s->holes, s->hole_ids, s->dups, s->reorders, s->resets);
    if (t->o.format == F_MSGPACK)
        fprintf(stderr,
                "kvtail: event plane: envelopes=%" PRIu64 " publishers=%zu "
                "sequence errors=%" PRIu64 "\n",
                s->envelopes, t->npubs, s->seqerr);
    if (t->o.index)
        fprintf(stderr,
                "kvtail: index: orphan stores dropped=%" PRIu64 " unknown removes=%" PRIu64 "\n",
                s->orphans, s->unknown_removes);
    if (t->o.expect)
        fprintf(stderr,
                "kvtail: record: indexed=%" PRIu64 " wrong=%" PRIu64 " wrong_tokens_hash=%" PRIu64
                " missing=%" PRIu64 "\n",
                s->indexed, s->wrong, s->badtok, s->missing);
    if (t->o.recover)
        fprintf(stderr,
                "kvtail: recover: dumps=%" PRIu64 " (%" PRIu64 " blocks) events_asked=%" PRIu64
                " (%" PRIu64 " events) gone=%" PRIu64 " skipped=%" PRIu64 " query_errors=%" PRIu64
                "\n",
                s->dumps, s->dump_blocks, s->events_asked, s->events_got, s->gone, s->skipped,
                s->query_errors);
    if (dropped > 0)
        fprintf(stderr, "kvtail: WARNING: %" PRId64 " messages dropped by the client (slow)\n",
                dropped);
    printf("kvtail: messages=%" PRIu64 " stored=%" PRIu64 " removed=%" PRIu64 " cleared=%" PRIu64
           " holes=%" PRIu64 " dups=%" PRIu64 " wrong=%" PRIu64 " missing=%" PRIu64 " bad=%" PRIu64
           " reorders=%" PRIu64 " resets=%" PRIu64 " orphans=%" PRIu64 " unknown_removes=%" PRIu64
           " badtok=%" PRIu64 " indexed=%" PRIu64 " envelopes=%" PRIu64 " seqerr=%" PRIu64
           " publishers=%zu%s",
           s->messages, s->stored, s->removed, s->cleared, s->holes, s->dups, s->wrong, s->missing,
           s->bad, s->reorders, s->resets, s->orphans, s->unknown_removes, s->badtok, s->indexed,
           s->envelopes, s->seqerr, t->npubs, t->o.recover ? "" : "\n");
    if (t->o.recover)
        printf(" dumps=%" PRIu64 " events_asked=%" PRIu64 " gone=%" PRIu64 " skipped=%" PRIu64
               " query_errors=%" PRIu64 "\n",
               s->dumps, s->events_asked, s->gone, s->skipped, s->query_errors);
    fflush(stdout);
}

/* A subscription to SUBJECT with no pending limits (the checks must see
 * every message).  NATS_OK, or what failed. */
static natsStatus subscribe(natsConnection *nc, const char *subject, natsSubscription **sub)
{
    natsStatus s = natsConnection_SubscribeSync(sub, nc, subject);
    if (s == NATS_OK)
        s = natsSubscription_SetPendingLimits(*sub, -1, -1);
    return s;
}

/* How the receive loop ended. */
struct run_end {
    int64_t dropped; /* messages the client dropped (slow) */
    bool timed_out, conn_lost;
};

/* --cut-after test hook: unsubscribe for cut_ms, then subscribe again.
 * False when that fails (the connection is lost). */
static bool cut_subscription(struct tail *t, natsSubscription **sub, struct run_end *end)
{
    int64_t until = now_ms() + t->o.cut_ms;
    fprintf(stderr, "kvtail: cutting the subscription for %ld ms\n", t->o.cut_ms);
    natsSubscription_GetDropped(*sub, &end->dropped);
    natsSubscription_Unsubscribe(*sub);
    natsSubscription_Destroy(*sub);
    *sub = NULL;
    t->o.cut_after = 0;
    while (!stop_flag && now_ms() < until)
        usleep(10000);
    natsStatus s = subscribe(t->nc, t->o.subject, sub);
    if (s != NATS_OK) {
        fprintf(stderr, "kvtail: subscribe again: %s\n", natsStatus_GetText(s));
        return false;
    }
    return true;
}

/* One message, by the format. */
static void handle(struct tail *t, natsMsg *msg)
{
    if (t->o.format == F_MSGPACK)
        handle_envelope(t, natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg));
    else if (t->o.format == F_RAW)
        handle_raw(t, msg);
    else
        handle_message(t, natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg));
}

/* Receive until --count, the --timeout, SIGINT/SIGTERM or a lost
 * connection. */
static void receive(struct tail *t, natsSubscription **sub, struct run_end *end)
{
    int64_t start = now_ms(), last = 0;
    bool got_any = false;
    while (!stop_flag && !(t->o.count && t->st.messages >= t->o.count)) {
        natsMsg *msg = NULL;
        int64_t wait = 200;
        if (t->o.timeout_ms) {
            int64_t left = (got_any ? last : start) + t->o.timeout_ms - now_ms();
            if (left <= 0) {
                end->timed_out = true;
                break;
            }
            if (left < wait)
                wait = left;
        }
        if (t->o.cut_after && t->st.messages >= t->o.cut_after) {
            if (!cut_subscription(t, sub, end)) {
                end->conn_lost = true;
                break;
            }
            last = now_ms();
            continue;
        }
        natsStatus s = natsSubscription_NextMsg(&msg, *sub, wait);
        if (s == NATS_TIMEOUT || s == NATS_SLOW_CONSUMER)
            continue;
        if (s != NATS_OK) {
            fprintf(stderr, "kvtail: receive: %s\n", natsStatus_GetText(s));
            end->conn_lost = true;
            break;
        }
        handle(t, msg);
        natsMsg_Destroy(msg);
        got_any = true;
        last = now_ms();
    }
    int64_t d = 0;
    if (*sub)
        natsSubscription_GetDropped(*sub, &d);
    end->dropped += d;
}

/* The exit code of a run that got to its end (report() printed). */
static int verdict(const struct tail *t, const struct run_end *end)
{
    const struct stats *st = &t->st;
    int rc = 0;
    if (t->o.check && (st->holes || st->dups || st->reorders || st->seqerr))
        rc = 1;
    if ((t->o.check || t->o.index) && st->bad)
        rc = 1;
    if (t->o.expect && (st->wrong || st->badtok))
        rc = 1;
    if (t->o.recover && (st->query_errors || st->holes))
        rc = 1;
    if ((t->o.check || t->o.index) && end->dropped > 0)
        rc = 1;
    if (t->o.count && st->messages < t->o.count && end->timed_out) {
        fprintf(stderr, "kvtail: timeout: %" PRIu64 " of %" PRIu64 " messages\n", st->messages,
                t->o.count);
        rc = 1;
    }
    return end->conn_lost ? 2 : rc;
}

static void tail_free(struct tail *t)
{
    spaces_free(&t->index);
    spaces_free(&t->truth);
    free(t->streams);
    free(t->pubs);
    free(t->raws);
    free(t->line);
    free(t->ev.h.v);
    free(t->ev.th.v);
}

/* Subscribed (and, with --recover, the --pair dumps asked): tell the
 * --ready-file.  0, or -1 (reported). */
static int get_ready(struct tail *t, natsSubscription **sub)
{
    natsStatus s = subscribe(t->nc, t->o.subject, sub);
    if (s == NATS_OK)
        s = natsConnection_FlushTimeout(t->nc, 5000); /* the server has the SUB now */
    if (s != NATS_OK) {
        fprintf(stderr, "kvtail: subscribe %s: %s\n", t->o.subject, natsStatus_GetText(s));
        return -1;
    }
    for (size_t i = 0; t->o.recover && i < t->o.npairs; i++) {
        bool fresh;
        struct stream *st = stream_get(t, t->o.pairs[i].worker, t->o.pairs[i].rank, &fresh);
        if (!st->synced)
            recover_dump(t, st); /* 404 (nothing yet): the first event brings one */
    }
    if (t->o.ready && write_ready(t->o.ready)) {
        fprintf(stderr, "kvtail: %s: %s\n", t->o.ready, strerror(errno));
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct tail t;
    natsConnection *nc = NULL;
    natsSubscription *sub = NULL;
    struct run_end end = {0, false, false};
    int rc = 2;

    memset(&t, 0, sizeof t);
    t.o.server = "nats://127.0.0.1:4222";
    if (parse_args(argc, argv, &t.o))
        return 2;

    catch_stop_signals();
    signal(SIGPIPE, SIG_IGN);

    if (t.o.publish || t.o.dump || t.o.match) {
        rc = t.o.publish ? do_publish(&t.o) : do_query_once(&t.o);
        nats_Close();
        return rc;
    }
    if (!t.o.quiet && isatty(STDOUT_FILENO))
        setvbuf(stdout, NULL, _IOLBF, 0);

    nc = connect_nats(&t.o);
    t.nc = nc;
    if (!nc || get_ready(&t, &sub) < 0)
        goto out;
    receive(&t, &sub, &end);
    if (t.o.recover && !end.conn_lost)
        recover_tail(&t);
    if (t.o.expect && load_record(&t) != 0) {
        report(&t, end.dropped);
        goto out; /* rc 2 */
    }
    if (t.o.expect)
        compare_with_record(&t);
    report(&t, end.dropped);
    rc = verdict(&t, &end);
out:
    fflush(stdout);
    natsSubscription_Destroy(sub);
    natsConnection_Destroy(nc);
    nats_Close();
    tail_free(&t);
    return rc;
}
