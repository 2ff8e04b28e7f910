/* sink JetStream (nats.jetstream.enabled): acknowledged publishes, the
 * resend queues, the stream check (what nats.c's js.c is to nats.c).  See
 * sink_priv.h for the parts of the sink and their locks: this file owns
 * ack_mu, and takes rb_mu for the queue state.
 *
 * nats.c facts (checked against nats.c 3.4.1 and nats-server 2.9):
 * - js_PublishMsgAsync registers the message in the context's pending map
 *   (and, with jsPubOptions.MaxWait, a deadline) before writing it; its
 *   AckHandler then gets every message back exactly once, on the reply
 *   subscription's own thread: with a jsPubAck, or a jsPubAckErr (NATS_TIMEOUT
 *   once MaxWait passed, NATS_NO_RESPONDERS when no stream leader took it,
 *   NATS_ERR with a JetStream error code).  The handler owns the message.
 *   js_PublishAsyncGetPendingList takes every registered message back instead
 *   (their acks are then ignored).  With MaxPending, a publish beyond it waits
 *   up to StallWait and fails with NATS_TIMEOUT.  jsCtx_Destroy drops the
 *   reply subscription, the messages still registered and the timer; an
 *   AckHandler already running finishes (nats.c calls it without its lock).
 * - The stream's duplicate window drops a message whose Nats-Msg-Id it stored
 *   within the window, and acks it with "duplicate": a resend is harmless.
 *   A stream that restarts from its store rebuilds that window.
 * - Lookups: js_GetStreamInfo answers NATS_NOT_FOUND (error 10059) for a
 *   missing stream and NATS_NO_RESPONDERS (10076) when JetStream is not
 *   enabled (or not ready); js_AddStream of replicas > 1 on a single server
 *   fails with a JetStream error.
 * How this file uses them:
 * - In flight ("inflight", and its estimated size "inflight_bytes"): every
 *   message from its publish until a positive ack or until it is given up,
 *   wherever it is (nats.c, the handler, the queues below).  From 3/4 of
 *   max_pending (or of reconnect_buffer_bytes) pending_bytes reports "full"
 *   until both are down to 1/2, so the loop pauses; a publish is refused
 *   (-EAGAIN) only when the bytes would pass reconnect_buffer_bytes: the
 *   loop may still hand over all the events of what it had read (a replay
 *   reply of thousands of batches comes in one turn), as nats.c's buffer
 *   takes them in core mode.  nats.c's own MaxPending is off (it would
 *   stall the loop).
 * - Failures are not sent again from the handler (it runs on nats.c's
 *   thread, the window may be full, the connection may be away or about to be
 *   replaced, and a "no responders" would come straight back): the handler
 *   puts the message in the resend queue (rq, kept in Nats-Msg-Id order) and
 *   wakes the worker (the rebuild thread), which sends it again once
 *   connected, after a growing pause when JetStream did not answer.
 * - Order: while rq is not empty, or the connection is away, or a lost
 *   connection's messages are being taken back, the sink is "ordered": new
 *   publishes queue up in fq behind them, and the worker sends rq first, then
 *   fq; the loop publishes directly again once the worker has sent both and
 *   is not probing.
 *   After "no responders" / "unavailable" the worker probes with one message
 *   at a time until one is stored (a leader election would otherwise let later
 *   events in before earlier ones).  On a reconnection the worker takes back
 *   what has no ack (what was in flight when the server went), and when nats.c
 *   closes a connection it takes back all of it before the context goes, so
 *   nothing waits for an ack timeout that a dead connection cannot deliver.
 * - Order per pair: a message without a positive ack is sent again only
 *   while nothing later of its (worker_id, dp_rank) has been handed to
 *   nats.c (order_mu's table: the greatest Nats-Msg-Id handed over, per
 *   pair).  Otherwise a later event of its pair may already be stored (its
 *   ack lost with the connection or timed out, or nats.c's reconnect buffer
 *   delivered it first) and the resend would be stored after it: the
 *   message is given up instead, as a loss (kvb_sink_losses), and the
 *   daemon repairs its pairs ("cleared", then their resident blocks from
 *   the mirror).  So the stream holds each pair's events in event_id order,
 *   perhaps with a hole before the barrier (docs/design.md, "JetStream
 *   order").
 */
#include "sink_priv.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "config.h"
#include "metrics.h"

#define JS_MSG_ID_HDR "Nats-Msg-Id"
#define JS_MSG_OVERHEAD \
    256                    /* bytes a message costs beyond its payload (subject,
                               * Nats-Msg-Id, nats.c's bookkeeping): an estimate */
#define JS_STALL_WAIT_MS 1 /* nats.c blocks a publish at most this long */
#define JS_RETRY_MIN_MS 50 /* resend backoff after no responders / unavailable */
#define JS_RETRY_MAX_MS 2000
#define JS_SETUP_RETRY_MS 1000
#define JS_SETUP_RETRY_MAX_MS 30000
#define JS_START_RETRY_MS 200 /* create(): between stream checks, until the deadline */
#define JS_ACK_GRACE_MS 20    /* destroy: after the last on_ack() returned */
#define JS_STALL_MS 1000      /* a failure with no positive ack for this long: a stall */

static struct slot *ring_at(struct ring *r, size_t i) { return &r->v[(r->head + i) % r->cap]; }

/* rb_mu held: room for one more (doubling); false when out of memory. */
static bool ring_room(struct ring *r)
{
    if (r->len < r->cap)
        return true;
    size_t cap = r->cap ? r->cap * 2 : 256;
    struct slot *v = malloc(cap * sizeof(*v));
    if (!v)
        return false;
    for (size_t i = 0; i < r->len; i++)
        v[i] = r->v[(r->head + i) % r->cap];
    free(r->v);
    r->v = v;
    r->cap = cap;
    r->head = 0;
    return true;
}

/* rb_mu held.  False when out of memory (the caller gives the message up). */
static bool ring_push(struct ring *r, struct slot sl, bool front)
{
    if (!ring_room(r))
        return false;
    if (front) {
        r->head = (r->head + r->cap - 1) % r->cap;
        r->v[r->head] = sl;
    } else {
        *ring_at(r, r->len) = sl;
    }
    r->len++;
    return true;
}

static bool ring_pop(struct ring *r, struct slot *out)
{
    if (!r || !r->len)
        return false;
    *out = r->v[r->head];
    r->head = (r->head + 1) % r->cap;
    r->len--;
    return true;
}

static int slot_cmp(const void *a, const void *b)
{
    const struct slot *x = a, *y = b;
    for (int i = 0; i < 4; i++)
        if (x->k[i] != y->k[i])
            return x->k[i] < y->k[i] ? -1 : 1;
    return 0;
}

/* rb_mu held: into the resend queue at its place in Nats-Msg-Id order (a
 * failure usually comes in order: searched from the back). */
static bool ring_insert(struct ring *r, struct slot sl)
{
    if (!ring_room(r))
        return false;
    size_t i = r->len;
    for (; i > 0 && slot_cmp(ring_at(r, i - 1), &sl) > 0; i--)
        *ring_at(r, i) = *ring_at(r, i - 1);
    *ring_at(r, i) = sl;
    r->len++;
    return true;
}

static void parse_id(natsMsg *m, uint64_t v[4])
{
    const char *id = NULL;
    memset(v, 0, 4 * sizeof(v[0]));
    if (natsMsgHeader_Get(m, JS_MSG_ID_HDR, &id) != NATS_OK || !id)
        return;
    for (int i = 0; i < 4 && *id; i++) {
        while (*id >= '0' && *id <= '9')
            v[i] = v[i] * 10 + (uint64_t)(*id++ - '0');
        if (*id == '.')
            id++;
    }
}

static struct slot slot_of(natsMsg *m, bool keyed)
{
    struct slot sl = {m, {0, 0, 0, 0}};
    if (keyed)
        parse_id(m, sl.k);
    return sl;
}

/* order_mu held: the table's slot for K's pair (NULL when full and out of
 * memory). */
static struct order_slot *order_find(struct kvb_sink *s, const uint64_t k[4])
{
    if (s->order_len * 2 >= s->order_cap) {
        size_t cap = s->order_cap ? s->order_cap * 2 : 64;
        struct order_slot *v = calloc(cap, sizeof(*v));
        if (v) {
            for (size_t i = 0; i < s->order_cap; i++) {
                if (!s->order[i].used)
                    continue;
                size_t j = (s->order[i].k[0] * 31 + s->order[i].k[1]) % cap;
                while (v[j].used)
                    j = (j + 1) % cap;
                v[j] = s->order[i];
            }
            free(s->order);
            s->order = v;
            s->order_cap = cap;
        } else if (s->order_len + 1 >= s->order_cap) {
            return NULL;
        }
    }
    size_t j = (k[0] * 31 + k[1]) % s->order_cap;
    while (s->order[j].used && (s->order[j].k[0] != k[0] || s->order[j].k[1] != k[1]))
        j = (j + 1) % s->order_cap;
    return &s->order[j];
}

/* (epoch, event_id) of A after B's. */
static bool key_after(const uint64_t a[4], const uint64_t b[4])
{
    return a[2] != b[2] ? a[2] > b[2] : a[3] > b[3];
}

/* SL is handed to nats.c now: the greatest of its pair so far?  False when
 * a later message of its pair was handed over before (a resend would land
 * after it).  Messages without an id are not ordered. */
static bool order_hand_over(struct kvb_sink *s, const struct slot *sl)
{
    if (!sl->k[0] && !sl->k[1] && !sl->k[2] && !sl->k[3])
        return true;
    pthread_mutex_lock(&s->order_mu);
    struct order_slot *o = order_find(s, sl->k);
    bool in_order = true;
    if (o && !o->used) {
        memcpy(o->k, sl->k, sizeof(o->k));
        o->used = true;
        s->order_len++;
    } else if (o) {
        in_order = !key_after(o->k, sl->k);
        if (in_order)
            memcpy(o->k, sl->k, sizeof(o->k));
    }
    pthread_mutex_unlock(&s->order_mu);
    return in_order;
}

/* MSG is stored at stream sequence SEQ: the greatest acknowledged of its
 * pair, and of the stream, so far? */
static void order_acked(struct kvb_sink *s, natsMsg *msg, uint64_t seq)
{
    struct slot sl = slot_of(msg, true);
    uint64_t was = atomic_load(&s->js_ack_seq);
    while (seq > was && !atomic_compare_exchange_weak(&s->js_ack_seq, &was, seq)) {
    }
    if (!sl.k[0] && !sl.k[1] && !sl.k[2] && !sl.k[3])
        return;
    pthread_mutex_lock(&s->order_mu);
    struct order_slot *o = order_find(s, sl.k);
    if (o && o->used && key_after(sl.k, o->acked))
        memcpy(o->acked, sl.k, sizeof(o->acked));
    pthread_mutex_unlock(&s->order_mu);
}

/* rb_mu held: publishes go through the queues from now on. */
static void set_ordered(struct kvb_sink *s, bool on)
{
    s->ordered = on;
    atomic_store(&s->ordered_hint, on);
}

/* What a message counts against the window's byte bound. */
static uint64_t msg_cost(natsMsg *m)
{
    int n = natsMsg_GetDataLength(m);
    return (uint64_t)(n > 0 ? n : 0) + JS_MSG_OVERHEAD;
}

/* One message (of that cost) is done with: acknowledged, or given up. */
static void settle(struct kvb_sink *s, uint64_t cost)
{
    atomic_fetch_sub(&s->inflight_bytes, cost);
    if (atomic_fetch_sub(&s->inflight, 1) == 1) {
        pthread_mutex_lock(&s->ack_mu);
        pthread_cond_broadcast(&s->ack_cond);
        pthread_mutex_unlock(&s->ack_mu);
    }
}

static void js_count(struct kvb_sink *s, _Atomic uint64_t *c)
{
    if (kvb_sink_owns_metrics(s)) /* several nats.c threads and the worker: atomic add */
        atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

/* A message the sink gives up on: lost, so the loop publishes a barrier. */
static void give_up(struct kvb_sink *s, natsMsg *m)
{
    uint64_t cost = msg_cost(m), epoch, event_id;
    const char *id = NULL;
    struct kvb_sink_pair p;
    char extra;
    /* worker_id.dp_rank.epoch.event_id (kvb_subject_msg_id()) names the pair */
    bool named = natsMsgHeader_Get(m, JS_MSG_ID_HDR, &id) == NATS_OK && id &&
                 sscanf(id, "%" SCNu64 ".%" SCNu32 ".%" SCNu64 ".%" SCNu64 "%c", &p.worker_id,
                        &p.dp_rank, &epoch, &event_id, &extra) == 4;
    kvb_sink_lost(s, named ? &p : NULL);
    natsMsg_Destroy(m);
    if (s->m)
        js_count(s, &s->m->jetstream_publish_errors_total[0]);
    atomic_fetch_add(&s->losses, 1);
    settle(s, cost);
    kvb_sink_wake(s);
}

/* A message without an ack that cannot be sent again in order (a later
 * event of its pair was handed to nats.c, and may be stored): given up, so
 * the daemon repairs its pair. */
static void give_up_order(struct kvb_sink *s, natsMsg *m)
{
    const char *id = NULL;
    if (natsMsgHeader_Get(m, JS_MSG_ID_HDR, &id) != NATS_OK || !id)
        id = "?";
    if (atomic_load(&s->live)) {
        pthread_mutex_lock(&s->order_mu);
        kvb_log_rl(&s->order_rl, KVB_LOG_WARN, STAGE,
                   "JetStream: router event %s had no ack and a later event of its pair went "
                   "out before it (and is, or may be, stored): not sent again, so that the "
                   "stream keeps the pair's order; the pair is repaired (a barrier, then its "
                   "blocks)",
                   id);
        pthread_mutex_unlock(&s->order_mu);
    }
    give_up(s, m);
}

/* JetStream errors that say "not now" rather than "never". */
static bool js_transient(natsStatus st, jsErrCode ec)
{
    if (st != NATS_ERR)
        return st != NATS_NO_MEMORY && st != NATS_INVALID_ARG;
    switch ((int)ec) {
    case 0: /* no code: assume the server will recover */
    case JSClusterIncompleteErr:
    case JSClusterNoPeersErr:  /* a cluster whose peers are still coming up */
    case JSClusterNotAvailErr: /* "JetStream system temporarily unavailable" */
    case JSClusterNotLeaderErr:
    case JSInsufficientResourcesErr:
    case JSRaftGeneralErr:
    case JSStreamNameExistErr: /* another bridge created it meanwhile */ return true;
    default: return false;
    }
}

/* JetStream stores our publishes again (a positive ack): end of a stall. */
static void stall_end(struct kvb_sink *s)
{
    if (!atomic_load_explicit(&s->js_stalled, memory_order_relaxed) ||
        !atomic_exchange(&s->js_stalled, false))
        return;
    if (s->m && kvb_sink_owns_metrics(s))
        atomic_store_explicit(&s->m->jetstream_stalled[0], 0, memory_order_relaxed);
    if (atomic_load(&s->live))
        kvb_info(STAGE,
                 "JetStream stores our publishes again after %.1f s (%" PRIu64
                 " unacknowledged, sent again in order)",
                 (double)(kvb_mono_ms() - atomic_load(&s->js_stall_since)) / 1000.0,
                 atomic_load(&s->inflight));
}

/* A publish failed for a reason that passes (WHY: timeout, no responders,
 * unavailable) and nothing was stored for JS_STALL_MS (or ever): the start
 * of a stall, or a reminder that it goes on.  The
 * worker keeps sending again (one probe at a time, backoff up to
 * JS_RETRY_MAX_MS, or every ack timeout) until JetStream answers. */
static void stall_note(struct kvb_sink *s, const char *why)
{
    uint64_t now = kvb_mono_ms();
    uint64_t last = atomic_load_explicit(&s->js_last_ack_ms, memory_order_relaxed);
    if (!atomic_load(&s->js_stalled) && last && now - last < JS_STALL_MS)
        return; /* one lost ack among stored ones: not a stall */
    if (!atomic_exchange(&s->js_stalled, true)) {
        atomic_store(&s->js_stall_since, now);
        s->stall_rl.window_start_ms = now; /* the reminders: from 30 s on */
        s->stall_rl.printed = s->stall_rl.burst;
        s->stall_rl.suppressed = 0;
        if (s->m && kvb_sink_owns_metrics(s)) {
            atomic_store_explicit(&s->m->jetstream_stalled[0], 1, memory_order_relaxed);
            js_count(s, &s->m->jetstream_stalls_total[0]);
        }
        if (atomic_load(&s->live))
            kvb_warn(STAGE,
                     "JetStream stores none of our publishes (%s: no stream leader, "
                     "or JetStream unavailable): %" PRIu64 " unacknowledged, sent "
                     "again until it answers",
                     why, atomic_load(&s->inflight));
        return;
    }
    if (atomic_load(&s->live))
        kvb_log_rl(&s->stall_rl, KVB_LOG_WARN, STAGE,
                   "JetStream still stores none of our publishes after %.0f s (%s; %" PRIu64
                   " unacknowledged): sending again",
                   (double)(now - atomic_load(&s->js_stall_since)) / 1000.0, why,
                   atomic_load(&s->inflight));
}

/* on_ack(), a positive ack: the message is stored (PROBE: it was the probe). */
static void ack_stored(struct kvb_sink *s, natsMsg *msg, const jsPubAck *pa, bool probe)
{
    if (s->m) {
        js_count(s, &s->m->jetstream_acks_total[0]);
        if (pa->Duplicate)
            js_count(s, &s->m->jetstream_duplicates_total[0]);
    }
    atomic_store(&s->ack_ok, true);
    atomic_store_explicit(&s->js_last_ack_ms, kvb_mono_ms(), memory_order_relaxed);
    stall_end(s);
    if (probe) { /* stored: JetStream takes publishes again */
        pthread_mutex_lock(&s->rb_mu);
        if (atomic_load(&s->probe) == msg) {
            atomic_store(&s->probe, NULL);
            s->probing = false;
            pthread_cond_signal(&s->rb_cond);
        }
        pthread_mutex_unlock(&s->rb_mu);
    }
    order_acked(s, msg, pa->Sequence);
    uint64_t cost = msg_cost(msg);
    natsMsg_Destroy(msg);
    settle(s, cost);
}

/* on_ack(): the stream refused the message for good (ST, EC): given up,
 * logged (a barrier follows). */
static void ack_refused(struct kvb_sink *s, natsMsg *msg, const jsPubAckErr *pae, natsStatus st,
                        jsErrCode ec, bool probe)
{
    if (atomic_load(&s->live)) {
        const char *id = NULL;
        if (natsMsgHeader_Get(msg, JS_MSG_ID_HDR, &id) != NATS_OK)
            id = NULL;
        kvb_log_rl(&s->ack_rl, KVB_LOG_ERROR, STAGE,
                   "JetStream refused a router event (%s%s): %s (error %d); it is "
                   "not sent again, a barrier follows",
                   id ? "Nats-Msg-Id " : "no id", id ? id : "",
                   pae && pae->ErrText ? pae->ErrText : natsStatus_GetText(st), (int)ec);
    }
    if (probe) { /* answered: the next one may go */
        pthread_mutex_lock(&s->rb_mu);
        if (atomic_load(&s->probe) == msg)
            atomic_store(&s->probe, NULL);
        pthread_cond_signal(&s->rb_cond);
        pthread_mutex_unlock(&s->rb_mu);
    }
    give_up(s, msg);
}

/* on_ack(): a failure that passes (WHY: KVB_JSF_TIMEOUT, _NO_RESPONDERS,
 * _UNAVAILABLE): the message goes to the resend queue. */
static void ack_retry(struct kvb_sink *s, natsMsg *msg, int why, bool probe)
{
    stall_note(s, why == KVB_JSF_TIMEOUT         ? "ack timeout"
                  : why == KVB_JSF_NO_RESPONDERS ? "no responders"
                                                 : "unavailable");
    pthread_mutex_lock(&s->rb_mu);
    if (probe && atomic_load(&s->probe) == msg)
        atomic_store(&s->probe, NULL);
    if (why != KVB_JSF_TIMEOUT) {
        /* Nobody took it (JetStream starting, the stream gone, a leader
         * election): retry in rounds, with a growing pause between them,
         * and have the worker look at the stream again. */
        uint64_t now = kvb_mono_ms();
        if (atomic_exchange(&s->ack_ok, false) || s->retry_ms == 0)
            s->retry_ms = JS_RETRY_MIN_MS;
        if (now >= s->rq_not_before) {
            s->rq_not_before = now + s->retry_ms;
            s->retry_ms = s->retry_ms * 2 > JS_RETRY_MAX_MS ? JS_RETRY_MAX_MS : s->retry_ms * 2;
        }
        if (why == KVB_JSF_NO_RESPONDERS && !s->js_setup_due) {
            s->js_setup_due = true;
            s->js_setup_after = s->rq_not_before;
        }
        s->probing = true;
    }
    bool queued = ring_insert(&s->rq, slot_of(msg, true));
    set_ordered(s, true); /* later publishes wait behind it */
    pthread_cond_signal(&s->rb_cond);
    pthread_mutex_unlock(&s->rb_mu);
    if (!queued)
        give_up(s, msg);
}

/* nats.c's callback for every asynchronous publish (its own thread, one per
 * jsCtx).  Positive ack: done.  Otherwise the message goes to the resend
 * queue (the worker sends it again once connected; after no responders or
 * an unavailable JetStream with a backoff), unless the stream refused it. */
static void on_ack(jsCtx *js, natsMsg *msg, jsPubAck *pa, jsPubAckErr *pae, void *closure)
{
    struct kvb_sink *s = closure;
    (void)js;
    atomic_fetch_add(&s->ack_cbs, 1);
    bool probe = msg && atomic_load(&s->probe) == msg;
    if (pa) {
        ack_stored(s, msg, pa, probe);
    } else {
        natsStatus st = pae ? pae->Err : NATS_ERR;
        jsErrCode ec = pae ? pae->ErrCode : 0;
        int why = st == NATS_TIMEOUT         ? KVB_JSF_TIMEOUT
                  : st == NATS_NO_RESPONDERS ? KVB_JSF_NO_RESPONDERS
                  : js_transient(st, ec)     ? KVB_JSF_UNAVAILABLE
                                             : KVB_JSF_REFUSED;
        if (s->m)
            js_count(s, &s->m->jetstream_ack_failures_total[why]);
        if (why == KVB_JSF_REFUSED)
            ack_refused(s, msg, pae, st, ec, probe);
        else
            ack_retry(s, msg, why, probe);
    }
    atomic_fetch_sub(&s->ack_cbs, 1);
}

/* A new JetStream context for NC (any state). */
natsStatus kvb_sink_js_new(struct kvb_sink *s, natsConnection *nc, jsCtx **out)
{
    jsOptions o;
    jsOptions_Init(&o);
    o.Wait = s->js_ack_timeout_ms;
    o.PublishAsync.MaxPending = 0; /* the sink bounds the window (kvb_sink_js_publish) */
    o.PublishAsync.AckHandler = on_ack;
    o.PublishAsync.AckHandlerClosure = s;
    o.PublishAsync.StallWait = JS_STALL_WAIT_MS;
    return natsConnection_JetStream(out, nc, &o);
}

enum verdict { V_RESEND, V_STORED, V_LOST };

/* The greatest key of K's pair known stored: its greatest acknowledged,
 * or the greatest of K[from..to) that STORED marks. */
static void stored_max(struct kvb_sink *s, const struct slot *k, const bool *stored, size_t from,
                       size_t to, uint64_t h[4])
{
    memset(h, 0, 4 * sizeof(h[0]));
    pthread_mutex_lock(&s->order_mu);
    struct order_slot *o = order_find(s, k[from].k);
    if (o && o->used)
        memcpy(h, o->acked, 4 * sizeof(h[0]));
    pthread_mutex_unlock(&s->order_mu);
    for (size_t i = from; i < to; i++)
        if (stored[i] && key_after(k[i].k, h))
            memcpy(h, k[i].k, 4 * sizeof(h[0]));
}

/* Read the stream's messages FROM..LAST, marking which of K[0..n) it holds.
 * False when it does not answer. */
static bool read_range(struct kvb_sink *s, jsCtx *js, jsOptions *o, uint64_t from, uint64_t last,
                       const struct slot *k, size_t n, bool *stored)
{
    jsErrCode ec = 0;
    for (uint64_t seq = from; seq <= last && last >= from; seq++) {
        natsMsg *m = NULL;
        natsStatus st = js_GetMsg(&m, js, s->js_stream, seq, o, &ec);
        if (st == NATS_NOT_FOUND || (st == NATS_ERR && ec == JSNoMessageFoundErr))
            continue; /* deleted */
        if (st != NATS_OK)
            return false;
        struct slot probe = slot_of(m, true);
        natsMsg_Destroy(m);
        const struct slot *hit = bsearch(&probe, k, n, sizeof(*k), slot_cmp);
        if (hit)
            stored[hit - k] = true;
    }
    return true;
}

#define READ_BACK_ROUNDS 5    /* until two looks at the stream agree */
#define READ_BACK_PAUSE_MS 20 /* between them: what the server took may still be queued */

/* Which of K[0..n) (sorted by slot_cmp, nothing of them in flight any more)
 * the stream holds: read back what it stored after the greatest sequence
 * acknowledged, until its last sequence stays the same.  1: read; 0: too
 * much to read (another publisher's traffic: the per-pair rule alone
 * decides); -1: no answer (try again later). */
static int read_back(struct kvb_sink *s, jsCtx *js, const struct slot *k, size_t n, bool *stored)
{
    jsOptions o;
    jsOptions_Init(&o);
    o.Wait = s->js_ack_timeout_ms;
    uint64_t from = atomic_load(&s->js_ack_seq) + 1, cap = (uint64_t)s->js_max_pending * 4 + 1024;
    for (int round = 0; round < READ_BACK_ROUNDS; round++) {
        jsStreamInfo *si = NULL;
        jsErrCode ec = 0;
        if (round)
            kvb_sink_sleep_ms(READ_BACK_PAUSE_MS);
        if (js_GetStreamInfo(&si, js, s->js_stream, &o, &ec) != NATS_OK)
            return -1;
        uint64_t first = si->State.FirstSeq, last = si->State.LastSeq;
        jsStreamInfo_Destroy(si);
        if (from < first)
            from = first;
        if (last + 1 == from && round)
            return 1; /* nothing new since the last look */
        if (last >= from && last - from >= cap)
            return 0;
        if (!read_range(s, js, &o, from, last, k, n, stored))
            return -1;
        from = last + 1 > from ? last + 1 : from;
    }
    return 1;
}

/* After read_back: per pair, the stored messages are done with; the others
 * are sent again when nothing later of their pair is stored (they then land
 * in order), else lost (a resend would land after a later event).  The
 * pair's greatest handed-over key becomes its greatest stored one. */
static void judge(struct kvb_sink *s, const struct slot *k, size_t n, const bool *stored,
                  enum verdict *v)
{
    for (size_t a = 0, b; a < n; a = b) {
        for (b = a + 1; b < n && k[b].k[0] == k[a].k[0] && k[b].k[1] == k[a].k[1];)
            b++;
        uint64_t h[4];
        stored_max(s, k, stored, a, b, h);
        for (size_t i = a; i < b; i++)
            v[i] = stored[i] ? V_STORED : key_after(h, k[i].k) ? V_LOST : V_RESEND;
        pthread_mutex_lock(&s->order_mu);
        struct order_slot *o = order_find(s, k[a].k);
        if (o && o->used) {
            o->k[2] = h[2];
            o->k[3] = h[3];
        }
        pthread_mutex_unlock(&s->order_mu);
    }
}

/* Take every message JS still waits an ack for (its connection was lost or
 * is about to be replaced) into the resend queue, which stays in Nats-Msg-Id
 * order.  While connected, first read back what the stream stored of them
 * ("Order" above): those are done, and the others are sent again only where
 * that keeps their pair's order.  Worker only. */
bool kvb_sink_js_recover(struct kvb_sink *s, jsCtx *js, const char *why)
{
    bool judged = atomic_load(&s->state) != ST_CONNECTED; /* closed: nothing to read */
    natsMsgList list = {0};
    bool got = js && js_PublishAsyncGetPendingList(&list, js) == NATS_OK;
    int n_rec = got ? list.Count : 0;
    pthread_mutex_lock(&s->rb_mu);
    size_t total = s->rq.len + (size_t)(n_rec > 0 ? n_rec : 0), n = 0;
    struct slot *k = calloc(total + 1, sizeof(*k));
    bool *stored = calloc(total + 1, sizeof(*stored));
    enum verdict *v = calloc(total + 1, sizeof(*v));
    if (!stored || !v) {
        free(k);
        k = NULL;
    }
    if (k)
        while (ring_pop(&s->rq, &k[n]))
            n++;
    for (int i = 0; i < n_rec; i++) {
        natsMsg *m = list.Msgs[i];
        list.Msgs[i] = NULL;
        if (!m)
            continue;
        if (k) {
            k[n++] = slot_of(m, true);
        } else if (!ring_insert(&s->rq, slot_of(m, true))) { /* no memory: as they come */
            pthread_mutex_unlock(&s->rb_mu);
            give_up(s, m);
            pthread_mutex_lock(&s->rb_mu);
        }
    }
    pthread_mutex_unlock(&s->rb_mu);
    size_t n_stored = 0, n_lost = 0;
    if (k) {
        qsort(k, n, sizeof(*k), slot_cmp);
        if (!n) {
            judged = true;
        } else if (!judged) {
            int rb = read_back(s, js, k, n, stored);
            if (rb > 0)
                judge(s, k, n, stored, v);
            judged = rb >= 0; /* too much to read: each waits for the rule */
        }
        for (size_t i = 0; i < n; i++)
            n_stored += v[i] == V_STORED;
        if (n_stored) { /* the stream stores again, as a positive ack says:
                         * before they settle (a flush may return then) */
            atomic_store(&s->ack_ok, true);
            atomic_store_explicit(&s->js_last_ack_ms, kvb_mono_ms(), memory_order_relaxed);
            stall_end(s);
        }
        pthread_mutex_lock(&s->rb_mu);
        for (size_t i = 0; i < n; i++) {
            if (v[i] == V_RESEND && ring_push(&s->rq, k[i], false))
                continue;
            pthread_mutex_unlock(&s->rb_mu);
            if (v[i] == V_STORED) { /* as if acknowledged */
                uint64_t cost = msg_cost(k[i].m);
                natsMsg_Destroy(k[i].m);
                settle(s, cost);
            } else if (v[i] == V_LOST) {
                give_up_order(s, k[i].m);
                n_lost++;
            } else {
                give_up(s, k[i].m);
            }
            pthread_mutex_lock(&s->rb_mu);
        }
    } else {
        pthread_mutex_lock(&s->rb_mu);
    }
    atomic_store(&s->probe, NULL); /* if it was out, it is back in the queue */
    if (s->rq.len)
        set_ordered(s, true);
    pthread_mutex_unlock(&s->rb_mu);
    if (got)
        natsMsgList_Destroy(&list);
    if (!judged) {
        kvb_log_rl(&s->order_rl, KVB_LOG_WARN, STAGE,
                   "JetStream: cannot read back what the stream stored of %zu router event(s) "
                   "without an ack: they wait, and it is read again",
                   n);
    } else if (n_rec > 0)
        kvb_info(STAGE,
                 "JetStream: %d router event(s) without an ack %s: %zu found stored, %zu lost "
                 "out of order (their pair repaired), the others sent again",
                 n_rec, why, n_stored, n_lost);
    free(k);
    free(stored);
    free(v);
    return judged;
}

/* NATS subject PATTERN (with * and > wildcards) matches SUBJ. */
static bool subject_covers(const char *pattern, const char *subj)
{
    const char *p = pattern, *t = subj;
    for (;;) {
        size_t pl = strcspn(p, "."), tl = strcspn(t, ".");
        if (pl == 1 && p[0] == '>' && p[1] == '\0')
            return tl > 0;
        if (!(pl == 1 && p[0] == '*') && (pl != tl || memcmp(p, t, pl) != 0))
            return false;
        p += pl;
        t += tl;
        if (!*p || !*t)
            return !*p && !*t;
        p++;
        t++;
    }
}

/* Check that an existing stream takes our subject; log what it is. */
static int js_check_stream(struct kvb_sink *s, const jsStreamInfo *si, char *why, size_t cap)
{
    const jsStreamConfig *c = si->Config;
    bool covered = false;
    why[0] = '\0';
    if (!c)
        return 0;
    if (c->SubjectsLen == 0)
        covered = c->Name && strcmp(c->Name, s->js_subject) == 0;
    for (int i = 0; i < c->SubjectsLen && !covered; i++)
        covered = c->Subjects[i] && subject_covers(c->Subjects[i], s->js_subject);
    if (!covered) {
        size_t len = (size_t)snprintf(why, cap,
                                      "stream %s exists but does not take the subject %s "
                                      "(its subjects:",
                                      s->js_stream, s->js_subject);
        for (int i = 0; i < c->SubjectsLen && len < cap; i++)
            len += (size_t)snprintf(why + len, cap - len, " %s", c->Subjects[i]);
        if (len < cap)
            snprintf(why + len, cap - len, "%s)", c->SubjectsLen ? "" : " none");
        return -EACCES;
    }
    if (c->Duplicates < (int64_t)s->js_dup_window_s * 1000000000LL)
        kvb_warn(STAGE,
                 "JetStream: stream %s has a duplicate window of %" PRId64 " s, less "
                 "than nats.jetstream.duplicate_window_s (%" PRIu32 " s): an event "
                 "sent again after that long is stored twice",
                 s->js_stream, (int64_t)(c->Duplicates / 1000000000LL), s->js_dup_window_s);
    return 0;
}

static const char *retention_name(int r)
{
    return r == KVB_JS_INTEREST ? "interest" : r == KVB_JS_WORKQUEUE ? "workqueue" : "limits";
}

/* Look the stream up on JS, create it when missing (and allowed).  0, or
 * -EACCES / -ETIMEDOUT with why set and *transient telling whether trying
 * again may help (JetStream starting, a cluster electing a leader). */
static int js_setup_once(struct kvb_sink *s, jsCtx *js, int64_t wait_ms, char *why, size_t cap,
                         bool *transient)
{
    jsOptions o;
    jsStreamInfo *si = NULL;
    jsErrCode ec = 0;
    natsStatus st;

    *transient = false;
    jsOptions_Init(&o);
    o.Wait = wait_ms > 0 ? wait_ms : 1;
    st = js_GetStreamInfo(&si, js, s->js_stream, &o, &ec);
    if (st == NATS_OK) {
        int rc = js_check_stream(s, si, why, cap);
        if (rc == 0)
            kvb_info(STAGE,
                     "JetStream: publishing to %s, stored in stream %s (%" PRIu64 " messages)",
                     s->js_subject, s->js_stream, si->State.Msgs);
        jsStreamInfo_Destroy(si);
        return rc;
    }
    if (st == NATS_NOT_FOUND || (st == NATS_ERR && ec == JSStreamNotFoundErr)) {
        if (!s->js_create) {
            snprintf(why, cap, "stream %s does not exist (and nats.jetstream.create is false)",
                     s->js_stream);
            return -EACCES;
        }
        jsStreamConfig c;
        const char *subjects[1] = {s->js_subject};
        jsStreamConfig_Init(&c);
        c.Name = s->js_stream;
        c.Subjects = subjects;
        c.SubjectsLen = 1;
        c.Retention = (jsRetentionPolicy)s->js_retention;
        c.MaxAge = (int64_t)s->js_max_age_s * 1000000000LL;
        c.Replicas = s->js_replicas;
        c.Duplicates = (int64_t)s->js_dup_window_s * 1000000000LL;
        c.Storage = js_FileStorage;
        ec = 0;
        st = js_AddStream(&si, js, &c, &o, &ec);
        if (st == NATS_OK) {
            kvb_info(STAGE,
                     "JetStream: created stream %s (subject %s, retention %s, max age "
                     "%" PRIu32 " s, %" PRIu32 " replica(s), duplicate window %" PRIu32 " s)",
                     s->js_stream, s->js_subject, retention_name(s->js_retention), s->js_max_age_s,
                     s->js_replicas, s->js_dup_window_s);
            jsStreamInfo_Destroy(si);
            return 0;
        }
    }
    char txt[256];
    kvb_sink_last_error(st, txt, sizeof(txt));
    if (st == NATS_NO_RESPONDERS)
        snprintf(why, cap,
                 "JetStream is not available on the server (not enabled, or "
                 "starting): %s",
                 txt);
    else if (ec)
        snprintf(why, cap, "stream %s: %s (JetStream error %d)", s->js_stream, txt, (int)ec);
    else
        snprintf(why, cap, "stream %s: %s", s->js_stream, txt);
    *transient = js_transient(st, ec);
    return st == NATS_TIMEOUT ? -ETIMEDOUT : -EACCES;
}

/* rb_mu held: JetStream work the worker can do now (*at: when some will be
 * due, 0 = only when signalled). */
bool kvb_sink_js_due(struct kvb_sink *s, uint64_t now, uint64_t *at)
{
    *at = 0;
    if (!s->js_on || atomic_load(&s->state) != ST_CONNECTED)
        return false; /* on_connected / on_reconnected signal */
    if (s->js_setup_due) {
        if (now >= s->js_setup_after)
            return true;
        *at = s->js_setup_after;
    }
    if (s->recover_due)
        return true;
    if ((s->rq.len || s->fq.len || s->reconcile_due) && !(s->probing && atomic_load(&s->probe))) {
        if (now >= s->rq_not_before)
            return true;
        if (!*at || s->rq_not_before < *at)
            *at = s->rq_not_before;
    }
    return false;
}

/* rb_mu held (released around nats.c calls): look at the stream when due;
 * after a reconnection take back what has no ack yet; then send the queues,
 * in order, while connected. */
void kvb_sink_js_work(struct kvb_sink *s)
{
    uint64_t now = kvb_mono_ms();

    if (s->js_setup_due && now >= s->js_setup_after) {
        char why[512];
        bool transient;
        s->js_setup_due = false;
        pthread_mutex_unlock(&s->rb_mu);
        int rc = js_setup_once(s, s->js, s->js_ack_timeout_ms, why, sizeof(why), &transient);
        pthread_mutex_lock(&s->rb_mu);
        if (rc < 0) {
            s->js_setup_failures++;
            uint64_t d = JS_SETUP_RETRY_MS;
            for (int i = 1; i < s->js_setup_failures && d < JS_SETUP_RETRY_MAX_MS; i++)
                d *= 2;
            if (d > JS_SETUP_RETRY_MAX_MS)
                d = JS_SETUP_RETRY_MAX_MS;
            s->js_setup_due = true;
            s->js_setup_after = kvb_mono_ms() + d;
            kvb_log_rl(&s->rb_rl, transient ? KVB_LOG_WARN : KVB_LOG_ERROR, STAGE,
                       "JetStream: %s (publishes wait; checking again in %" PRIu64 " ms)", why, d);
        } else {
            s->js_setup_failures = 0;
        }
        return;
    }
    if (s->recover_due || (s->reconcile_due && now >= s->rq_not_before)) {
        const char *what = s->recover_due ? "when the connection was lost"
                                          : "before one is sent again after later ones";
        s->recover_due = false;
        pthread_mutex_unlock(&s->rb_mu);
        bool judged = kvb_sink_js_recover(s, s->js, what);
        pthread_mutex_lock(&s->rb_mu);
        s->reconcile_due = !judged;
        if (!judged) { /* JetStream not answering: again after a pause */
            s->rq_not_before = kvb_mono_ms() + (s->retry_ms ? s->retry_ms : JS_RETRY_MIN_MS);
            s->retry_ms = s->retry_ms * 2 > JS_RETRY_MAX_MS ? JS_RETRY_MAX_MS
                          : s->retry_ms                     ? s->retry_ms * 2
                                                            : JS_RETRY_MIN_MS * 2;
            return;
        }
    }
    if (s->reconcile_due)
        return;
    /* the resend queue first, then what was published behind it; while
     * probing, one message until JetStream answers it */
    while (!s->rb_stop && !s->rb_needed && atomic_load(&s->state) == ST_CONNECTED &&
           kvb_mono_ms() >= s->rq_not_before && !(s->probing && atomic_load(&s->probe))) {
        struct ring *r = s->rq.len ? &s->rq : s->fq.len ? &s->fq : NULL;
        struct slot sl;
        if (!r || !ring_pop(r, &sl))
            break;
        if (!order_hand_over(s, &sl)) { /* a later one of its pair went out before */
            if (!s->order_retry && ring_push(r, sl, true)) {
                /* read the stream back first: that later one may not be
                 * stored (no responders), and then this one goes in order */
                s->order_retry = true;
                s->reconcile_due = true;
                pthread_cond_signal(&s->rb_cond);
                break;
            }
            pthread_mutex_unlock(&s->rb_mu);
            give_up_order(s, sl.m);
            pthread_mutex_lock(&s->rb_mu);
            continue;
        }
        s->order_retry = false;
        bool probe = s->probing;
        if (probe)
            atomic_store(&s->probe, sl.m); /* before: its answer may come first */
        s->sending = true;
        pthread_mutex_unlock(&s->rb_mu);
        natsMsg *m = sl.m;
        natsStatus st = js_PublishMsgAsync(s->js, &m, &s->js_pubopts);
        if (st == NATS_OK && r == &s->rq && s->m)
            js_count(s, &s->m->jetstream_resends_total[0]);
        pthread_mutex_lock(&s->rb_mu);
        s->sending = false;
        if (st != NATS_OK) {
            if (probe && atomic_load(&s->probe) == sl.m)
                atomic_store(&s->probe, NULL);
            if (m && !ring_push(r, sl, true)) { /* ours again: first in line */
                pthread_mutex_unlock(&s->rb_mu);
                give_up(s, m);
                pthread_mutex_lock(&s->rb_mu);
            }
            s->rq_not_before = kvb_mono_ms() + JS_RETRY_MIN_MS;
            kvb_debug(STAGE, "JetStream publish from the queue: %s", natsStatus_GetText(st));
            break;
        }
    }
}

/* create(), JetStream: a context for the connection, then the stream check
 * (creation) when connected.  Errors that trying again cannot mend fail at
 * once (-EACCES); the others are retried until DEADLINE (then -EACCES, or
 * -ETIMEDOUT when JetStream never answered), or, without a deadline, left to
 * the worker. */
int kvb_sink_js_start(struct kvb_sink *s, uint64_t deadline, uint32_t timeout_ms)
{
    char why[512];
    bool transient;
    if (s->conn && kvb_sink_js_new(s, s->conn, &s->js) != NATS_OK)
        return -ENOMEM;
    if (!s->conn || atomic_load(&s->state) != ST_CONNECTED) {
        s->js_setup_due = true; /* the worker, once connected */
        return 0;
    }
    for (;;) {
        uint64_t now = kvb_mono_ms();
        int64_t wait = s->js_ack_timeout_ms;
        if (deadline && (int64_t)(deadline > now ? deadline - now : 1) < wait)
            wait = (int64_t)(deadline > now ? deadline - now : 1);
        int rc = js_setup_once(s, s->js, wait, why, sizeof(why), &transient);
        if (rc == 0)
            return 0;
        if (!transient) {
            kvb_err(STAGE, "JetStream: %s", why);
            return -EACCES;
        }
        if (!deadline) {
            kvb_warn(STAGE,
                     "JetStream: %s; retrying in the background (nats."
                     "connect_timeout_ms is 0), publishes wait",
                     why);
            s->js_setup_due = true;
            s->js_setup_after = kvb_mono_ms() + JS_SETUP_RETRY_MS;
            return 0;
        }
        if (kvb_mono_ms() + JS_START_RETRY_MS >= deadline) {
            kvb_err(STAGE, "JetStream: %s (still after nats.connect_timeout_ms, %" PRIu32 " ms)",
                    why, timeout_ms);
            return rc;
        }
        kvb_sink_sleep_ms(JS_START_RETRY_MS);
    }
}

/* JetStream: a message with its Nats-Msg-Id, published with an ack request;
 * nats.c owns it from then on (on_ack() gets it back). */
int kvb_sink_js_publish(struct kvb_sink *s, const char *subject, const void *data, size_t len,
                        const char *msg_id)
{
    natsMsg *msg = NULL;
    natsStatus st;
    uint64_t cost = (uint64_t)len + JS_MSG_OVERHEAD; /* == msg_cost(msg) */

    /* The hard bound: what is unacknowledged (at most max_pending before the
     * loop pauses, plus the events of what it had read by then) stays within
     * reconnect_buffer_bytes, as nats.c's buffer does in core mode. */
    if (atomic_load_explicit(&s->inflight_bytes, memory_order_relaxed) + cost > s->js_byte_cap)
        return -EAGAIN; /* like a full buffer */
    st = natsMsg_Create(&msg, subject, NULL, data, (int)len);
    if (st == NATS_OK && msg_id && *msg_id)
        st = natsMsgHeader_Set(msg, JS_MSG_ID_HDR, msg_id);
    if (st != NATS_OK) {
        natsMsg_Destroy(msg);
        return kvb_sink_errno(st);
    }
    if (atomic_load(&s->ordered_hint) ||
        atomic_load_explicit(&s->state, memory_order_relaxed) != ST_CONNECTED) {
        /* Ordered: messages wait to be sent (again), or no server: queue up
         * behind them; the worker sends them in order.  Back to direct
         * publishes once the worker has sent them all and JetStream takes
         * publishes again (no probe out). */
        bool direct = false, queued = false;
        pthread_mutex_lock(&s->rb_mu);
        if (atomic_load(&s->state) == ST_CONNECTED) {
            if (s->ordered && !s->rq.len && !s->fq.len && !s->recover_due && !s->probing &&
                !s->sending)
                set_ordered(s, false);
            direct = !s->ordered;
        }
        if (!direct) {
            if ((queued = ring_push(&s->fq, slot_of(msg, true), false))) {
                atomic_fetch_add(&s->inflight_bytes, cost);
                atomic_fetch_add(&s->inflight, 1);
                set_ordered(s, true);
                pthread_cond_signal(&s->rb_cond);
            }
        }
        pthread_mutex_unlock(&s->rb_mu);
        if (!direct) {
            if (queued)
                return 0;
            natsMsg_Destroy(msg);
            return -ENOMEM;
        }
    }
    pthread_mutex_lock(&s->conn_mu);
    if (!s->conn || !s->js) {
        pthread_mutex_unlock(&s->conn_mu);
        natsMsg_Destroy(msg);
        return -EAGAIN;
    }
    atomic_fetch_add(&s->inflight_bytes, cost); /* before: its ack may come first */
    atomic_fetch_add(&s->inflight, 1);
    struct slot sl = slot_of(msg, true);
    (void)order_hand_over(s, &sl); /* new: the greatest of its pair */
    s->in_publish = true;          /* js_publish runs on the loop thread only */
    st = js_PublishMsgAsync(s->js, &msg, &s->js_pubopts);
    s->in_publish = false;
    pthread_mutex_unlock(&s->conn_mu);
    if (st != NATS_OK) {
        if (msg) { /* not taken: ours to free, and not in flight */
            natsMsg_Destroy(msg);
            settle(s, cost);
        }
        int rc = kvb_sink_errno(st);
        /* stalled, or no room in nats.c's reconnect buffer */
        return rc == -ETIMEDOUT ? -EAGAIN : rc == -ENOTCONN ? -EIO : rc;
    }
    return 0;
}

/* JetStream: every publish so far acknowledged (or given up). */
int kvb_sink_js_flush(struct kvb_sink *s, uint32_t timeout_ms)
{
    struct timespec until = kvb_mono_deadline(timeout_ms);
    int rc = 0;
    pthread_mutex_lock(&s->ack_mu);
    while (atomic_load(&s->inflight) > 0 && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&s->ack_cond, &s->ack_mu, &until);
    pthread_mutex_unlock(&s->ack_mu);
    return atomic_load(&s->inflight) > 0 ? -ETIMEDOUT : 0;
}

void kvb_sink_js_disconnected(struct kvb_sink *s)
{
    pthread_mutex_lock(&s->rb_mu); /* from now on publishes queue up (and keep their order) */
    set_ordered(s, true);
    pthread_mutex_unlock(&s->rb_mu);
}

void kvb_sink_js_reconnected(struct kvb_sink *s)
{
    pthread_mutex_lock(&s->rb_mu); /* what was in flight when the server went: send it again */
    s->recover_due = true;
    pthread_cond_signal(&s->rb_cond);
    pthread_mutex_unlock(&s->rb_mu);
}

void kvb_sink_js_new_conn(struct kvb_sink *s)
{
    pthread_mutex_lock(&s->rb_mu);
    s->js_setup_due = true; /* the stream may be new to this server */
    s->js_setup_after = 0;
    pthread_mutex_unlock(&s->rb_mu);
}

int kvb_sink_js_init(struct kvb_sink *s, const struct kvb_config *cfg)
{
    const char *st_name = cfg->nats.jetstream.stream_name;
    const char *sj_name = cfg->nats.jetstream.subject_name;
    if (!st_name || !*st_name || !sj_name || !*sj_name)
        return -EINVAL; /* the config module resolves both */
    s->js_create = cfg->nats.jetstream.create;
    s->js_retention = cfg->nats.jetstream.retention;
    s->js_max_age_s = cfg->nats.jetstream.max_age_s;
    s->js_replicas = cfg->nats.jetstream.replicas ? cfg->nats.jetstream.replicas : 1;
    s->js_dup_window_s = cfg->nats.jetstream.duplicate_window_s;
    s->js_max_pending = cfg->nats.jetstream.max_pending ? cfg->nats.jetstream.max_pending : 4096;
    s->js_ack_timeout_ms =
        cfg->nats.jetstream.ack_timeout_ms ? cfg->nats.jetstream.ack_timeout_ms : 5000;
    jsPubOptions_Init(&s->js_pubopts);
    s->js_pubopts.MaxWait = s->js_ack_timeout_ms;
    s->ack_rl = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(REFUSAL_LOG_MS, REFUSAL_LOG_BURST);
    s->stall_rl = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(REFUSAL_LOG_MS, 1);
    s->order_rl = (struct kvb_ratelimit)KVB_RATELIMIT_INIT(REFUSAL_LOG_MS, REFUSAL_LOG_BURST);
    s->js_byte_cap = s->full_bytes;
    s->js_stream = strdup(st_name);
    s->js_subject = strdup(sj_name);
    if (!s->js_stream || !s->js_subject)
        return -ENOMEM;
    return 0;
}

/* The ack window, with hysteresis: full from 3/4 of max_pending until it is
 * down to 1/2 (the loop pauses on "full"; the last quarter is room for the
 * events of the batches it already read).  N: the pending bytes so far;
 * returns them, at least the buffer size while full.  Loop thread. */
uint64_t kvb_sink_js_window(struct kvb_sink *s, uint64_t n)
{
    uint64_t inflight = atomic_load(&s->inflight);
    uint64_t bytes = atomic_load(&s->inflight_bytes);
    if (s->win_full && inflight <= s->js_max_pending / 2 && bytes <= s->js_byte_cap / 2) {
        s->win_full = false;
        kvb_info(STAGE,
                 "JetStream: %" PRIu64 " publish(es) unacknowledged, the ack "
                 "window has room again",
                 inflight);
    } else if (!s->win_full && (inflight >= (uint64_t)s->js_max_pending / 4 * 3 ||
                                bytes >= s->js_byte_cap / 4 * 3)) {
        s->win_full = true;
        kvb_warn(STAGE,
                 "JetStream: %" PRIu64 " publishes (about %" PRIu64 " bytes) "
                 "unacknowledged, 3/4 of nats.jetstream.max_pending or of "
                 "nats.reconnect_buffer_bytes: reported as a full buffer",
                 inflight, bytes);
    }
    if (s->win_full && n < s->full_bytes)
        n = s->full_bytes;
    if (s->m)
        atomic_store_explicit(&s->m->jetstream_pending[0], inflight, memory_order_relaxed);
    return n;
}

bool kvb_sink_js_close(struct kvb_sink *s)
{
    if (!s->js)
        return true;
    /* No on_ack() after this: the reply subscription goes, and with it the
     * messages still unacknowledged (lost, as a core buffer would be).  One
     * already running gets to its end (grace period: nats.c calls it after
     * releasing its own lock). */
    jsCtx_Destroy(s->js);
    s->js = NULL;
    uint64_t deadline = kvb_mono_ms() + CLOSE_WAIT_MS;
    while (atomic_load(&s->ack_cbs) && kvb_mono_ms() < deadline)
        kvb_sink_sleep_ms(1);
    kvb_sink_sleep_ms(JS_ACK_GRACE_MS);
    if (atomic_load(&s->ack_cbs)) {
        kvb_err(STAGE,
                "JetStream ack callback still running after %d ms; leaking "
                "the sink",
                CLOSE_WAIT_MS);
        return false;
    }
    return true;
}

void kvb_sink_js_free(struct kvb_sink *s)
{
    for (struct slot sl; s->rq.v && ring_pop(&s->rq, &sl);)
        natsMsg_Destroy(sl.m);
    for (struct slot sl; s->fq.v && ring_pop(&s->fq, &sl);)
        natsMsg_Destroy(sl.m);
    free(s->rq.v);
    free(s->fq.v);
    free(s->order);
    free(s->js_stream);
    free(s->js_subject);
}
