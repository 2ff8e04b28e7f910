/* replay: the sequence and replay rules (replay.h) against recording ops.
 *
 * Every decision the module makes is written to a trace, one token each:
 *   A<seq>  apply            X<seq>  reject (not decoded)
 *   Bg Br   barrier (gap, restart; Bm malformed, Bs start)
 *   R<seq>  replay request from seq      C  cancel the request in flight
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "metrics.h"
#include "replay.h"
#include "testutil.h"

static struct kvb_metrics m;
static char trace[8192];
static int request_rc; /* what the next request returns */

static void add(const char *fmt, unsigned long long v)
{
    size_t n = strlen(trace);
    snprintf(trace + n, sizeof(trace) - n, fmt, v);
}

/* A payload of one byte 0xc1 (never valid msgpack) does not "decode". */
static const uint8_t junk[1] = {0xc1};

static int t_apply(void *ctx, const struct kvb_stream *s, uint64_t seq, const uint8_t *d,
                   size_t len, struct kvb_applied *out)
{
    (void)ctx;
    ck_assert(s->has_last && s->last == seq); /* the cursor moves first */
    if (len == 1 && d[0] == 0xc1) { /* as the pipeline: the malformed barrier, not decoded */
        *out = (struct kvb_applied){.decoded = false};
        add("M%llu ", seq);
        return 1;
    }
    *out = (struct kvb_applied){.decoded = true, .dp_rank = s->cfg_rank, .n_events = 1};
    add("A%llu ", seq);
    return 1;
}

static int t_reject(void *ctx, const struct kvb_stream *s, uint64_t seq, const char *why)
{
    (void)ctx;
    (void)why;
    ck_assert(s->has_last && s->last == seq);
    add("X%llu ", seq);
    return 1;
}

static int t_barrier(void *ctx, const struct kvb_stream *s, int cause)
{
    (void)ctx;
    (void)s;
    static const char c[] = {[KVB_BAR_START] = 's',
                             [KVB_BAR_GAP] = 'g',
                             [KVB_BAR_RESTART] = 'r',
                             [KVB_BAR_MALFORMED] = 'm',
                             [KVB_BAR_NATS_LOST] = 'n'};
    char tok[4] = {'B', c[cause], ' ', 0};
    strcat(trace, tok);
    return 1;
}

static int t_request(void *ctx, uint64_t from)
{
    (void)ctx;
    if (request_rc < 0)
        return request_rc;
    add("R%llu ", from);
    return 0;
}

static void t_cancel(void *ctx)
{
    (void)ctx;
    strcat(trace, "C ");
}

static const struct kvb_seq_ops ops = {NULL, t_apply, t_reject, t_barrier};
static const struct kvb_replay_io io = {NULL, t_request, t_cancel};
static struct kvb_replay *r;
static struct kvb_stream st, other;
static const uint8_t pl[4] = {1, 2, 3, 4};

static void setup_with(const char *endpoint, size_t max_held, uint64_t max_payload)
{
    memset(&m, 0, sizeof(m));
    trace[0] = 0;
    request_rc = 0;
    struct kvb_replay_cfg c = {.name = "src",
                               .endpoint = endpoint,
                               .timeout_ms = 1000,
                               .max_payload_bytes = max_payload,
                               .max_held_msgs = max_held};
    ck_assert_int_eq(kvb_replay_create(&c, &m, &ops, &io, &r), 0);
    kvb_stream_init(&st, "st", 0);
    kvb_stream_init(&other, "other", 1);
}

static void setup(void) { setup_with("tcp://127.0.0.1:1", 0, 1000); }
static void setup_norp(void) { setup_with("", 0, 1000); }
static void teardown(void) { kvb_replay_destroy(&r); }

static int live(struct kvb_stream *s, uint64_t seq, uint64_t now)
{
    return kvb_replay_live(r, s, seq, pl, sizeof(pl), now);
}
static int reply(uint64_t seq, uint64_t now)
{
    return kvb_replay_reply(r, seq, pl, sizeof(pl), now);
}
static int end(uint64_t now) { return kvb_replay_reply(r, KVB_REPLAY_END, NULL, 0, now); }

#define TRACE(want) ck_assert_str_eq(trace, want)

/* ---- without a replay endpoint ------------------------------------------ */

START_TEST(in_order_applies)
{
    for (uint64_t q = 5; q < 9; q++)
        ck_assert_int_eq(live(&st, q, 0), 1);
    TRACE("A5 A6 A7 A8 ");
    ck_assert_uint_eq(st.last, 8);
}
END_TEST

START_TEST(gap_without_replay_is_a_barrier)
{
    live(&st, 0, 0);
    ck_assert_int_eq(live(&st, 4, 0), 2);
    TRACE("A0 Bg A4 ");
    ck_assert_uint_eq(kvb_get(&m.seq_gaps_total[0]), 1);
    ck_assert_uint_eq(st.gaps, 1);
    ck_assert(!kvb_replay_active(r));
}
END_TEST

START_TEST(back_is_a_restart)
{
    live(&st, 10, 0);
    live(&st, 11, 0);
    ck_assert_int_eq(live(&st, 0, 0), 2);
    TRACE("A10 A11 Br A0 ");
    ck_assert_uint_eq(kvb_get(&m.engine_restarts_total[0]), 1);
}
END_TEST

START_TEST(wrap_is_next)
{
    live(&st, UINT64_MAX, 0);
    live(&st, 0, 0);
    TRACE("A18446744073709551615 A0 ");
}
END_TEST

/* ---- with replay -------------------------------------------------------- */

/* An undecodable batch in a reply is a lost batch: the replay fails (not
 * "filled"); the pipeline published its malformed barrier. */
START_TEST(undecodable_reply_not_filled)
{
    live(&st, 0, 0);
    live(&st, 4, 10);
    TRACE("A0 R1 ");
    reply(1, 20);
    ck_assert_int_ge(kvb_replay_reply(r, 2, junk, sizeof(junk), 20), 0);
    reply(3, 21);
    TRACE("A0 R1 A1 M2 A3 C A4 ");
    ck_assert(!kvb_replay_active(r));
    ck_assert_uint_eq(kvb_get(&m.replays_filled_total[0]), 0);
    ck_assert_uint_eq(kvb_get(&m.replays_failed_total[0]), 1);
}
END_TEST

/* Gap and restart warnings go through the stream's rate limit: a storm of
 * them logs a few lines per stream, not one per batch. */
START_TEST(gap_and_restart_warnings_rate_limited)
{
    int level = kvb_log_get_level();
    kvb_log_set_level(KVB_LOG_WARN); /* the limiter counts only lines it would print */
    for (uint64_t q = 0; q < 200; q += 2)
        live(&st, q, q); /* a gap every batch: barriers, no replay */
    ck_assert_uint_eq(kvb_get(&m.seq_gaps_total[0]), 99);
    ck_assert_uint_le(st.rl.printed, st.rl.burst);
    ck_assert_uint_ge(st.rl.suppressed, 99 - st.rl.burst);
    for (int k = 0; k < 50; k++)
        live(&st, (uint64_t)(150 - k), 300); /* seq goes back every batch: restarts */
    ck_assert_uint_ge(kvb_get(&m.engine_restarts_total[0]), 49);
    ck_assert_uint_ge(st.rl.suppressed, 99 - st.rl.burst + 49);
    /* per stream: another stream has its own budget */
    live(&other, 0, 400);
    live(&other, 5, 400);
    ck_assert_uint_eq(other.rl.printed, 1);
    kvb_log_set_level(level);
}
END_TEST

START_TEST(gap_filled_by_replay)
{
    live(&st, 0, 0);
    live(&st, 1, 0);
    ck_assert_int_eq(live(&st, 5, 10), 0); /* held */
    ck_assert_int_eq(live(&st, 6, 11), 0);
    TRACE("A0 A1 R2 ");
    ck_assert(kvb_replay_active(r));
    ck_assert_uint_eq(kvb_replay_held(r), 2);
    ck_assert_int_eq(kvb_replay_next_deadline(r, 10), 1000);
    ck_assert_int_eq(reply(1, 20), 0); /* before want: ignored */
    reply(2, 20);
    reply(3, 20);
    reply(4, 21); /* caught up: finish, then the held ones */
    TRACE("A0 A1 R2 A2 A3 A4 C A5 A6 ");
    ck_assert(!kvb_replay_active(r));
    ck_assert_uint_eq(kvb_get(&m.replays_requested_total[0]), 1);
    ck_assert_uint_eq(kvb_get(&m.replays_filled_total[0]), 1);
    ck_assert_uint_eq(kvb_get(&m.replays_failed_total[0]), 0);
    ck_assert_int_eq(reply(5, 22), 0); /* late reply: nothing */
    ck_assert_int_eq(end(22), 0);
    TRACE("A0 A1 R2 A2 A3 A4 C A5 A6 ");
    live(&st, 7, 30);
    TRACE("A0 A1 R2 A2 A3 A4 C A5 A6 A7 ");
}
END_TEST

START_TEST(replay_starts_late_barrier_once)
{
    live(&st, 0, 0);
    live(&st, 5, 0);
    reply(3, 1); /* 1, 2 no longer held */
    reply(4, 1);
    TRACE("A0 R1 Bg A3 A4 C A5 ");
    ck_assert_uint_eq(kvb_get(&m.replays_failed_total[0]), 1);
    ck_assert_uint_eq(kvb_get(&m.replays_filled_total[0]), 0);
}
END_TEST

/* The END after part of the range: the ROUTER dropped the rest at its HWM
 * (a buffer holding seq 1 and the live seq 5 holds 2..4): asked again; a
 * round whose reply is only the END is a loss. */
START_TEST(end_before_caught_up)
{
    live(&st, 0, 0);
    live(&st, 5, 0);
    live(&st, 6, 0);
    reply(1, 1);
    end(2);
    TRACE("A0 R1 A1 C R2 ");
    ck_assert(kvb_replay_active(r));
    end(3);
    TRACE("A0 R1 A1 C R2 C Bg A5 A6 ");
    ck_assert_uint_eq(kvb_get(&m.replays_failed_total[0]), 1);
}
END_TEST

/* test_rel_jetstream case b stopping short: a 4000-batch reply whose middle
 * and tail the ROUTER dropped; the END came through.  Asked again until
 * filled, no barrier. */
START_TEST(end_after_cut_tail_asked_again)
{
    live(&st, 0, 0);
    live(&st, 9, 0);
    reply(1, 1);
    reply(2, 1);
    end(1); /* 3..8 and what followed dropped */
    TRACE("A0 R1 A1 A2 C R3 ");
    for (uint64_t q = 3; q < 9; q++)
        reply(q, 2);
    TRACE("A0 R1 A1 A2 C R3 A3 A4 A5 A6 A7 A8 C A9 ");
    ck_assert_uint_eq(kvb_get(&m.replays_filled_total[0]), 1);
    ck_assert_uint_eq(kvb_get(&m.replays_failed_total[0]), 0);
}
END_TEST

/* The reply jumps to our held batch after part of the range: a cut too. */
START_TEST(jump_to_until_asked_again)
{
    live(&st, 0, 0);
    live(&st, 9, 0);
    reply(1, 1);
    reply(9, 1); /* 2..8 dropped */
    TRACE("A0 R1 A1 C R2 ");
    for (uint64_t q = 2; q < 9; q++)
        reply(q, 2);
    ck_assert_uint_eq(kvb_get(&m.replays_filled_total[0]), 1);
    ck_assert_uint_eq(st.last, 9);
    /* a round that starts at our held batch: the engine no longer holds the rest */
    live(&st, 10, 3);
    live(&st, 15, 3);
    reply(15, 4);
    ck_assert_uint_eq(kvb_get(&m.replays_failed_total[0]), 1);
    ck_assert(!kvb_replay_active(r));
}
END_TEST

START_TEST(timeout_gives_up)
{
    live(&st, 0, 0);
    live(&st, 5, 100);
    ck_assert_int_eq(kvb_replay_tick(r, 1099), 0);
    TRACE("A0 R1 ");
    ck_assert_int_eq(kvb_replay_next_deadline(r, 1099), 1);
    kvb_replay_tick(r, 1100);
    TRACE("A0 R1 C Bg A5 ");
    ck_assert_int_eq(kvb_replay_next_deadline(r, 1100), -1);
}
END_TEST

/* test_rel_jetstream b under load: a 6000-batch replay while the daemon
 * held back (the JetStream window full) for longer than replay.timeout_ms:
 * the time it did not read is not the engine's, so no "timed out" barrier. */
START_TEST(postponed_while_held_back)
{
    live(&st, 0, 0);
    live(&st, 5, 0);
    TRACE("A0 R1 ");
    kvb_replay_postpone(r, 3000); /* held back from 0 to 3000 */
    ck_assert_int_eq(kvb_replay_next_deadline(r, 3000), 1000);
    ck_assert_int_eq(kvb_replay_tick(r, 3500), 0);
    TRACE("A0 R1 ");
    reply(1, 3600);
    reply(2, 3600);
    reply(3, 3600);
    reply(4, 3600);
    TRACE("A0 R1 A1 A2 A3 A4 C A5 ");
    ck_assert_uint_eq(kvb_get(&m.replays_filled_total[0]), 1);
    ck_assert_uint_eq(kvb_get(&m.replays_failed_total[0]), 0);
    kvb_replay_postpone(r, 100); /* nothing in flight: no effect */
}
END_TEST

START_TEST(cut_reply_asked_again)
{
    live(&st, 0, 0);
    live(&st, 9, 0);
    reply(1, 10);
    reply(2, 10); /* then silence: the ROUTER dropped the rest */
    ck_assert_int_eq(kvb_replay_next_deadline(r, 10), 250);
    kvb_replay_tick(r, 260);
    TRACE("A0 R1 A1 A2 C R3 ");
    for (uint64_t q = 3; q < 9; q++)
        reply(q, 270);
    TRACE("A0 R1 A1 A2 C R3 A3 A4 A5 A6 A7 A8 C A9 ");
    ck_assert_uint_eq(kvb_get(&m.replays_filled_total[0]), 1);
}
END_TEST

START_TEST(hole_in_reply_asked_again)
{
    live(&st, 0, 0);
    live(&st, 9, 0);
    reply(1, 1);
    reply(3, 1); /* 2 dropped by the ROUTER's HWM */
    TRACE("A0 R1 A1 C R2 ");
    for (uint64_t q = 2; q < 9; q++)
        reply(q, 2);
    ck_assert_uint_eq(kvb_get(&m.replays_filled_total[0]), 1);
    ck_assert_uint_eq(st.last, 9);
}
END_TEST

START_TEST(second_gap_among_held_replayed)
{
    live(&st, 0, 0);
    live(&st, 3, 0);
    live(&st, 4, 0);
    live(&st, 7, 0); /* 5, 6 missing too */
    live(&st, 8, 0);
    reply(1, 1);
    reply(2, 1);
    TRACE("A0 R1 A1 A2 C A3 A4 R5 ");
    ck_assert(kvb_replay_active(r));
    ck_assert_uint_eq(kvb_replay_held(r), 2);
    ck_assert_uint_eq(st.gaps, 2);
    reply(5, 2);
    reply(6, 2);
    TRACE("A0 R1 A1 A2 C A3 A4 R5 A5 A6 C A7 A8 ");
    ck_assert_uint_eq(kvb_get(&m.replays_requested_total[0]), 2);
    ck_assert_uint_eq(kvb_get(&m.replays_filled_total[0]), 2);
}
END_TEST

START_TEST(request_fails_barrier)
{
    live(&st, 0, 0);
    request_rc = -EHOSTUNREACH;
    ck_assert_int_eq(live(&st, 5, 0), 2);
    TRACE("A0 Bg A5 ");
    ck_assert(!kvb_replay_active(r));
    ck_assert_uint_eq(kvb_get(&m.replays_failed_total[0]), 1);
}
END_TEST

START_TEST(other_stream_goes_through)
{
    live(&st, 0, 0);
    live(&st, 5, 0);
    live(&other, 100, 0);
    live(&other, 101, 0);
    live(&other, 200, 0); /* its gap cannot be replayed now: barrier */
    TRACE("A0 R1 A100 A101 Bg A200 ");
}
END_TEST

START_TEST(oversize_rejected)
{
    static uint8_t big[1001];
    live(&st, 0, 0);
    ck_assert_int_eq(kvb_replay_live(r, &st, 1, big, sizeof(big), 0), 1);
    TRACE("A0 X1 ");
    ck_assert_uint_eq(kvb_get(&m.malformed_messages_total[KVB_MAL_OVERSIZE]), 1);
    /* during a replay: held in its place (without its payload) */
    live(&st, 5, 0);
    ck_assert_int_eq(kvb_replay_live(r, &st, 6, big, sizeof(big), 0), 0);
    live(&st, 7, 0);
    TRACE("A0 X1 R2 ");
    reply(2, 1);
    reply(3, 1);
    reply(4, 1);
    TRACE("A0 X1 R2 A2 A3 A4 C A5 X6 A7 ");
    ck_assert_uint_eq(kvb_get(&m.replays_filled_total[0]), 1);
}
END_TEST

/* fuzz_replay found: an oversize live batch during a replay ended it, the
 * held batches had a second gap (a new replay), and the oversize batch was
 * then rejected at once: before the batches of the new replay. */
START_TEST(oversize_during_replay_keeps_order)
{
    static uint8_t big[1001];
    live(&st, 0, 0);
    live(&st, 2, 0); /* gap: 1 */
    live(&st, 4, 0); /* 3 missing among the held */
    kvb_replay_live(r, &st, 5, big, sizeof(big), 0);
    reply(1, 1);
    TRACE("A0 R1 A1 C A2 R3 ");
    reply(3, 2);
    TRACE("A0 R1 A1 C A2 R3 A3 C A4 X5 ");
    ck_assert_uint_eq(st.last, 5);
}
END_TEST

/* fuzz_replay found: a reply that started late published a barrier; the
 * rest of the gap then timed out, and no barrier covered that second loss. */
START_TEST(second_loss_in_one_gap_second_barrier)
{
    live(&st, 0, 0);
    live(&st, 4, 0);         /* 1..3 missing */
    reply(2, 10);            /* 1 no longer held: barrier, then 2 */
    kvb_replay_tick(r, 300); /* cut: ask again from 3 */
    TRACE("A0 R1 Bg A2 C R3 ");
    kvb_replay_tick(r, 1300); /* 3 never comes */
    TRACE("A0 R1 Bg A2 C R3 C Bg A4 ");
    ck_assert_uint_eq(kvb_get(&m.replays_failed_total[0]), 1);
}
END_TEST

/* A full hold queue with a second gap among the held batches: no new replay
 * (no room to hold), a barrier for each gap, everything in order. */
START_TEST(hold_full_second_gap)
{
    kvb_replay_destroy(&r);
    setup_with("tcp://127.0.0.1:1", 2, 0);
    live(&st, 0, 0);
    live(&st, 5, 0);
    live(&st, 7, 0); /* 6 missing */
    live(&st, 8, 0); /* no room */
    TRACE("A0 R1 C Bg A5 Bg A7 A8 ");
    ck_assert(!kvb_replay_active(r));
}
END_TEST

START_TEST(hold_full_gives_up)
{
    kvb_replay_destroy(&r);
    setup_with("tcp://127.0.0.1:1", 2, 0);
    live(&st, 0, 0);
    live(&st, 5, 0);
    live(&st, 6, 0);
    live(&st, 7, 0); /* third held: no room */
    TRACE("A0 R1 C Bg A5 A6 A7 ");
}
END_TEST

/* ---- starts, restarts, reconnects ----------------------------------------- */

static const uint8_t pl2[4] = {9, 9, 9, 9};

/* kvbridge starts against a running engine: the first seq seen is 5: the
 * engine's buffer from 0 is applied first (the start barrier, published by
 * the pipeline before the first batch, covers what it no longer holds). */
START_TEST(start_recovers_history)
{
    ck_assert_int_eq(live(&st, 5, 0), 0);
    live(&st, 6, 0);
    for (uint64_t q = 0; q < 7; q++)
        reply(q, 1);
    TRACE("R0 A0 A1 A2 A3 A4 C A5 A6 ");
    ck_assert_uint_eq(kvb_get(&m.replays_failed_total[0]), 0);
}
END_TEST

START_TEST(start_engine_holds_part)
{
    live(&st, 5, 0);
    reply(3, 1); /* 0..2 no longer held: no barrier of our own */
    reply(4, 1);
    TRACE("R0 A3 A4 C A5 ");
    live(&st, 1000, 2); /* a later gap is a gap */
    TRACE("R0 A3 A4 C A5 R6 ");
}
END_TEST

START_TEST(start_nothing_held)
{
    live(&st, 1764500000000000000ull, 0); /* a clock-seeded stream */
    end(1);
    /* replay.max_batches (10000) before it at most */
    TRACE("R1764499999999990000 C A1764500000000000000 ");
    ck_assert_uint_eq(kvb_get(&m.barriers_total[KVB_BAR_GAP]), 0);
}
END_TEST

/* A gap larger than replay.max_batches: no engine buffer holds it, the
 * barrier at once, nothing held. */
START_TEST(gap_above_max_batches_is_a_barrier)
{
    live(&st, 0, 0);
    live(&st, 10002, 1); /* 10001 missing */
    TRACE("A0 Bg A10002 ");
    ck_assert(!kvb_replay_active(r));
}
END_TEST

/* A replay socket that answers in-range batches without end: the whole
 * replay is bounded by replay.max_ms of wall time (postponing for our own
 * work does not move it), then the barrier and the held live batches. */
START_TEST(replay_bounded_by_max_ms)
{
    live(&st, 0, 0);
    live(&st, 5000, 0);
    for (uint64_t q = 1; q < 100; q++) {
        reply(q, q * 100);
        kvb_replay_postpone(r, 100);
    }
    ck_assert(kvb_replay_active(r));
    reply(100, 30000); /* replay.max_ms (30000) after the start */
    ck_assert(!kvb_replay_active(r));
    ck_assert_msg(strstr(trace, "A99 C Bg A5000 ") != NULL, "%s", trace);
}
END_TEST

/* A restart seen as a seq going back to S > 0: barrier, then 0..S-1. */
START_TEST(restart_back_recovers_start)
{
    live(&st, 0, 0);
    for (uint64_t q = 1; q <= 10; q++)
        live(&st, q, 0);
    trace[0] = 0;
    live(&st, 4, 1);
    TRACE("Br R0 ");
    for (uint64_t q = 0; q < 6; q++)
        reply(q, 2);
    TRACE("Br R0 A0 A1 A2 A3 C A4 ");
    ck_assert_uint_eq(kvb_get(&m.engine_restarts_total[0]), 1);
}
END_TEST

START_TEST(duplicate_is_not_a_restart)
{
    live(&st, 0, 0);
    live(&st, 1, 0);
    ck_assert_int_eq(live(&st, 1, 0), 0); /* the same bytes again */
    live(&st, 2, 0);
    TRACE("A0 A1 A2 ");
    ck_assert_uint_eq(kvb_get(&m.engine_restarts_total[0]), 0);
    /* the same seq with other bytes: a restart */
    ck_assert_int_eq(kvb_replay_live(r, &st, 2, pl2, sizeof(pl2), 0), 1);
    TRACE("A0 A1 A2 Br R0 ");
}
END_TEST

/* A network blip: the connection dropped and came back, batches were lost
 * meanwhile; the engine still holds our last batch (same bytes): continuity
 * proven, the gap filled by the same request, no barrier. */
START_TEST(reconnect_continuity_proven)
{
    for (uint64_t q = 0; q < 6; q++)
        live(&st, q, 0);
    kvb_replay_peer_reset(r, &st, 1);
    trace[0] = 0;
    live(&st, 8, 2);
    TRACE("R5 ");
    for (uint64_t q = 4; q < 9; q++)
        reply(q, 3);
    TRACE("R5 A6 A7 C A8 ");
    ck_assert_uint_eq(kvb_get(&m.engine_restarts_total[0]), 0);
    ck_assert_uint_eq(kvb_get(&m.barriers_total[KVB_BAR_GAP]), 0);
}
END_TEST

/* Reconnected, next seq just after ours, but the engine's batch at our last
 * seq differs: a new incarnation (its seqs happen to be above ours). */
START_TEST(reconnect_other_bytes_is_a_restart)
{
    for (uint64_t q = 0; q < 6; q++)
        live(&st, q, 0);
    kvb_replay_peer_reset(r, &st, 1);
    trace[0] = 0;
    live(&st, 6, 2);
    ck_assert_int_eq(kvb_replay_reply(r, 5, pl2, sizeof(pl2), 3), 1);
    TRACE("R5 Br C R0 ");
    for (uint64_t q = 0; q < 7; q++)
        kvb_replay_reply(r, q, pl2, sizeof(pl2), 4);
    TRACE("R5 Br C R0 A0 A1 A2 A3 A4 A5 C A6 ");
}
END_TEST

START_TEST(reconnect_not_held_is_a_restart)
{
    for (uint64_t q = 0; q < 3; q++)
        live(&st, q, 0);
    kvb_replay_peer_reset(r, &st, 1);
    trace[0] = 0;
    live(&st, 7, 2);
    end(3); /* the (new) engine holds nothing from 2 */
    TRACE("R2 Br C R0 ");
    end(4);
    TRACE("R2 Br C R0 C A7 ");
}
END_TEST

/* The connection came back and the engine stays quiet: the proof does not
 * wait for a batch.  Same bytes at our last seq: what follows is applied
 * up to the engine's END, no barrier; live copies of it are dropped. */
START_TEST(connected_proves_at_once)
{
    for (uint64_t q = 0; q < 6; q++)
        live(&st, q, 0);
    kvb_replay_peer_reset(r, &st, 1);
    trace[0] = 0;
    ck_assert_int_eq(kvb_replay_connected(r, &st, 2), 0);
    TRACE("R5 ");
    for (uint64_t q = 5; q < 9; q++)
        reply(q, 3);
    end(3);
    end(3); /* (the first END after replies could be a cut reply's: asked again) */
    TRACE("R5 A6 A7 A8 C R9 C ");
    ck_assert(!kvb_replay_active(r));
    live(&st, 8, 4); /* a copy of what the replay gave */
    live(&st, 9, 4);
    TRACE("R5 A6 A7 A8 C R9 C A9 ");
    ck_assert_uint_eq(kvb_get(&m.engine_restarts_total[0]), 0);
    ck_assert_uint_eq(kvb_get(&m.barriers_total[KVB_BAR_GAP]), 0);
}
END_TEST

/* The engine restarted while disconnected and went quiet: other bytes at
 * our last seq: the restart barrier, then its new incarnation from 0, all
 * the engine holds. */
START_TEST(connected_restart_then_new_incarnation)
{
    for (uint64_t q = 0; q < 6; q++)
        live(&st, q, 0);
    kvb_replay_peer_reset(r, &st, 1);
    trace[0] = 0;
    kvb_replay_connected(r, &st, 2);
    kvb_replay_reply(r, 5, pl2, sizeof(pl2), 3);
    TRACE("R5 Br C R0 ");
    for (uint64_t q = 0; q < 3; q++)
        kvb_replay_reply(r, q, pl2, sizeof(pl2), 4);
    end(4);
    end(4);
    TRACE("R5 Br C R0 A0 A1 A2 C R3 C ");
    ck_assert(!kvb_replay_active(r));
    ck_assert_uint_eq(st.last, 2);
    ck_assert_uint_eq(kvb_get(&m.engine_restarts_total[0]), 1);
}
END_TEST

/* A live batch after our last seq while the proof runs: held behind it,
 * as when the batch started the proof. */
START_TEST(connected_live_during_proof_is_held)
{
    for (uint64_t q = 0; q < 6; q++)
        live(&st, q, 0);
    kvb_replay_peer_reset(r, &st, 1);
    kvb_replay_connected(r, &st, 2);
    trace[0] = 0;
    live(&st, 8, 2);
    TRACE("");
    for (uint64_t q = 5; q < 9; q++)
        reply(q, 3);
    TRACE("A6 A7 C A8 ");
}
END_TEST

/* Without a replay endpoint a reconnect cannot be proven: the restart
 * barrier at once, not at the next batch. */
START_TEST(connected_without_replay_is_a_restart)
{
    kvb_replay_destroy(&r);
    setup_norp();
    for (uint64_t q = 0; q < 3; q++)
        live(&st, q, 0);
    kvb_replay_peer_reset(r, &st, 1);
    trace[0] = 0;
    kvb_replay_connected(r, &st, 2);
    TRACE("Br ");
    live(&st, 0, 3);
    TRACE("Br A0 ");
}
END_TEST

START_TEST(reconnect_seq_back_is_a_restart)
{
    for (uint64_t q = 0; q < 50; q++)
        live(&st, q, 0);
    kvb_replay_peer_reset(r, &st, 1);
    trace[0] = 0;
    live(&st, 0, 2);
    live(&st, 1, 2);
    TRACE("Br A0 A1 ");
}
END_TEST

/* The engine restarts while a replay is pending: the new incarnation's
 * held batches are applied, not skipped as "seq <= last". */
START_TEST(restart_during_replay)
{
    for (uint64_t q = 0; q < 10; q++)
        live(&st, q, 0);
    for (uint64_t q = 20; q < 26; q++)
        live(&st, q, 0); /* 10..19 missing: replay asked, never answered */
    trace[0] = 0;
    /* the new engine: its first batch ends the replay (the replay socket
     * answers for the new incarnation now), what was held goes first */
    for (uint64_t q = 0; q < 4; q++)
        kvb_replay_live(r, &st, q, pl2, sizeof(pl2), 0);
    TRACE("C Bg A20 A21 A22 A23 A24 A25 Br A0 A1 A2 A3 ");
    kvb_replay_tick(r, 1000);
    TRACE("C Bg A20 A21 A22 A23 A24 A25 Br A0 A1 A2 A3 ");
    ck_assert_uint_eq(kvb_get(&m.engine_restarts_total[0]), 1);
}
END_TEST

/* Held batches past the 2^64-1 wrap are applied, not skipped. */
START_TEST(wrap_during_replay)
{
    live(&st, UINT64_MAX - 3, 0);
    end(0); /* its start: nothing held */
    trace[0] = 0;
    live(&st, UINT64_MAX - 1, 0); /* MAX-2 missing */
    live(&st, UINT64_MAX, 0);
    live(&st, 0, 0);
    live(&st, 1, 0);
    reply(UINT64_MAX - 2, 1);
    TRACE("R18446744073709551613 A18446744073709551613 C A18446744073709551614 "
          "A18446744073709551615 A0 A1 ");
}
END_TEST

/* A reply that trickles in (each batch within the stall time) does not
 * extend the replay beyond replay.timeout_ms. */
START_TEST(trickle_bounded_by_timeout)
{
    live(&st, 0, 0);
    live(&st, 1000, 0);
    uint64_t t = 0;
    for (uint64_t q = 1; q < 30; q++) {
        t += 200;
        kvb_replay_tick(r, t);
        reply(q, t);
    }
    ck_assert(!kvb_replay_active(r));
    ck_assert_uint_eq(st.last, 1000);
    ck_assert_uint_eq(kvb_get(&m.replays_failed_total[0]), 1);
}
END_TEST

/* ---- the check after a pause (kvb_replay_check) ------------------------- */

START_TEST(check_nothing_missed)
{
    live(&st, 0, 0);
    live(&st, 1, 0);
    ck_assert_int_eq(kvb_replay_check(r, &st, 10), 0);
    TRACE("A0 A1 R2 ");
    ck_assert(kvb_replay_active(r));
    ck_assert_int_eq(end(11), 0); /* the END alone: the engine has nothing after 1 */
    TRACE("A0 A1 R2 C ");
    ck_assert(!kvb_replay_active(r));
    ck_assert_uint_eq(kvb_get(&m.replays_requested_total[0]), 1);
    ck_assert_uint_eq(kvb_get(&m.replays_filled_total[0]), 0);
    ck_assert_uint_eq(kvb_get(&m.replays_failed_total[0]), 0);
    live(&st, 2, 20);
    TRACE("A0 A1 R2 C A2 ");
}
END_TEST

/* What the engine dropped while reading was paused comes back; an END after
 * batches is asked again (the ROUTER may have cut the tail) until it comes
 * alone. */
START_TEST(check_recovers_dropped)
{
    live(&st, 0, 0);
    live(&st, 1, 0);
    kvb_replay_check(r, &st, 10);
    reply(1, 11); /* before what was asked: ignored */
    reply(2, 11);
    reply(3, 11);
    end(11);
    TRACE("A0 A1 R2 A2 A3 C R4 ");
    ck_assert(kvb_replay_active(r));
    end(12);
    TRACE("A0 A1 R2 A2 A3 C R4 C ");
    ck_assert(!kvb_replay_active(r));
    ck_assert_uint_eq(st.last, 3);
    ck_assert_uint_eq(kvb_get(&m.replays_filled_total[0]), 1);
    ck_assert_uint_eq(kvb_get(&m.replays_failed_total[0]), 0);
}
END_TEST

/* A reply that starts later than asked: the batches before it may still be
 * on their way; believed when a second check, with no live batch between,
 * says the same. */
START_TEST(check_buffer_moved_on_is_a_barrier)
{
    live(&st, 0, 0);
    live(&st, 1, 0);
    kvb_replay_check(r, &st, 10);
    reply(5, 11); /* 2..4 no longer held, or on their way */
    TRACE("A0 A1 R2 C ");
    ck_assert(!kvb_replay_active(r));
    ck_assert(st.check_again);
    kvb_replay_check(r, &st, 20);
    reply(5, 21);
    end(21);
    end(22);
    TRACE("A0 A1 R2 C R2 Bg A5 C R6 C ");
    ck_assert(!st.check_again);
    ck_assert_uint_eq(kvb_get(&m.replays_failed_total[0]), 1);
    ck_assert_uint_eq(kvb_get(&m.replays_filled_total[0]), 0);
}
END_TEST

/* ... and when they were on their way, they come live: no barrier. */
START_TEST(check_ahead_then_live_no_barrier)
{
    live(&st, 0, 0);
    kvb_replay_check(r, &st, 10);
    reply(4, 11);
    TRACE("A0 R1 C ");
    live(&st, 1, 12);
    live(&st, 2, 12); /* progress: a later check starts afresh */
    kvb_replay_check(r, &st, 20);
    reply(4, 21); /* 3 still on its way */
    TRACE("A0 R1 C A1 A2 R3 C ");
    ck_assert(st.check_again);
    live(&st, 3, 22);
    live(&st, 4, 22);
    kvb_replay_check(r, &st, 30);
    end(31);
    TRACE("A0 R1 C A1 A2 R3 C A3 A4 R5 C ");
    ck_assert(!st.check_again);
    ck_assert_uint_eq(kvb_get(&m.replays_failed_total[0]), 0);
}
END_TEST

/* Live copies of what the check applied, still on their way, are dropped;
 * a batch at such a seq with other bytes is a restart. */
START_TEST(check_live_copies_dropped)
{
    live(&st, 0, 0);
    kvb_replay_check(r, &st, 10);
    reply(1, 11);
    reply(2, 11);
    end(11);
    end(12);
    TRACE("A0 R1 A1 A2 C R3 C ");
    ck_assert_int_eq(live(&st, 1, 13), 0);
    ck_assert_int_eq(live(&st, 2, 13), 0);
    live(&st, 3, 13);
    TRACE("A0 R1 A1 A2 C R3 C A3 ");
    ck_assert_uint_eq(kvb_get(&m.engine_restarts_total[0]), 0);

    kvb_replay_check(r, &st, 20);
    reply(4, 21);
    end(21);
    end(22);
    static const uint8_t other_bytes[4] = {9, 9, 9, 9};
    kvb_replay_live(r, &st, 4, other_bytes, sizeof(other_bytes), 23);
    TRACE("A0 R1 A1 A2 C R3 C A3 R4 A4 C R5 C Br R0 "); /* a new stream from 0 */
    ck_assert_uint_eq(kvb_get(&m.engine_restarts_total[0]), 1);
}
END_TEST

/* An engine that does not answer (dead, or its replay socket gone): what it
 * may have dropped is unknown, so the barrier. */
START_TEST(check_unanswered_is_a_barrier)
{
    live(&st, 0, 0);
    kvb_replay_check(r, &st, 10);
    ck_assert_int_eq(kvb_replay_next_deadline(r, 10), 1000);
    kvb_replay_tick(r, 1009);
    TRACE("A0 R1 ");
    kvb_replay_tick(r, 1010);
    TRACE("A0 R1 C Bg ");
    ck_assert(!kvb_replay_active(r));
    ck_assert_uint_eq(kvb_get(&m.replays_failed_total[0]), 1);
}
END_TEST

/* A live batch during the check: the next one says nothing was missed; a
 * later one turns the check into a gap replay up to it; live copies of what
 * the check applied are dropped. */
START_TEST(check_live_meanwhile)
{
    live(&st, 0, 0);
    kvb_replay_check(r, &st, 10);
    live(&st, 1, 11);
    TRACE("A0 R1 C A1 ");
    ck_assert(!kvb_replay_active(r));

    kvb_replay_check(r, &st, 20);
    reply(2, 21);
    ck_assert_int_eq(live(&st, 2, 21), 0); /* the check gave it already */
    ck_assert_int_eq(live(&st, 5, 21), 0); /* held: 3, 4 asked for */
    ck_assert_uint_eq(kvb_replay_held(r), 1);
    reply(3, 22);
    reply(4, 22);
    TRACE("A0 R1 C A1 R2 A2 A3 A4 C A5 ");
    ck_assert(!kvb_replay_active(r));
    ck_assert_uint_eq(kvb_get(&m.replays_filled_total[0]), 1);

    kvb_replay_check(r, &st, 30);
    reply(6, 31);
    live(&st, 7, 31); /* next after what the check gave: complete */
    TRACE("A0 R1 C A1 R2 A2 A3 A4 C A5 R6 A6 C A7 ");
    ck_assert_uint_eq(kvb_get(&m.replays_filled_total[0]), 2);
    ck_assert_uint_eq(kvb_get(&m.replays_failed_total[0]), 0);
}
END_TEST

/* The engine restarted during the check: its restart barrier, once. */
START_TEST(check_restart_meanwhile)
{
    live(&st, 0, 0);
    live(&st, 1, 0);
    live(&st, 2, 0);
    kvb_replay_check(r, &st, 10);
    live(&st, 0, 11);
    TRACE("A0 A1 A2 R3 C Br A0 ");
    ck_assert(!kvb_replay_active(r));
    ck_assert_uint_eq(kvb_get(&m.replays_failed_total[0]), 0);
}
END_TEST

/* Nothing to check on a stream with nothing applied, or whose connection
 * dropped (its next batch proves itself); another replay: later. */
START_TEST(check_not_now)
{
    ck_assert_int_eq(kvb_replay_check(r, &st, 0), 0);
    live(&st, 0, 0);
    kvb_replay_peer_reset(r, &st, 1);
    ck_assert_int_eq(kvb_replay_check(r, &st, 2), 0);
    live(&other, 0, 3);
    live(&other, 5, 3);
    ck_assert(kvb_replay_active(r));
    ck_assert_int_eq(kvb_replay_check(r, &other, 4), -EBUSY);
    TRACE("A0 A0 R1 ");
}
END_TEST

START_TEST(check_request_fails_barrier)
{
    live(&st, 0, 0);
    request_rc = -EIO;
    ck_assert_int_eq(kvb_replay_check(r, &st, 10), 1);
    TRACE("A0 Bg ");
    ck_assert(!kvb_replay_active(r));
    ck_assert_uint_eq(kvb_get(&m.replays_failed_total[0]), 1);
}
END_TEST

/* Without a replay endpoint nothing can be asked: the barrier at once. */
START_TEST(check_without_replay_is_a_barrier)
{
    live(&st, 0, 0);
    ck_assert_int_eq(kvb_replay_check(r, &st, 10), 1);
    TRACE("A0 Bg ");
    ck_assert_uint_eq(kvb_get(&m.replays_failed_total[0]), 0);
}
END_TEST

Suite *replay_suite(void);
Suite *replay_suite(void)
{
    Suite *s = suite_create("replay");
    TCase *tc = tcase_create("no_replay");
    tcase_add_checked_fixture(tc, setup_norp, teardown);
    tcase_add_test(tc, gap_and_restart_warnings_rate_limited);
    tcase_add_test(tc, in_order_applies);
    tcase_add_test(tc, gap_without_replay_is_a_barrier);
    tcase_add_test(tc, back_is_a_restart);
    tcase_add_test(tc, wrap_is_next);
    tcase_add_test(tc, check_without_replay_is_a_barrier);
    suite_add_tcase(s, tc);
    tc = tcase_create("replay");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, gap_filled_by_replay);
    tcase_add_test(tc, undecodable_reply_not_filled);
    tcase_add_test(tc, replay_starts_late_barrier_once);
    tcase_add_test(tc, end_before_caught_up);
    tcase_add_test(tc, timeout_gives_up);
    tcase_add_test(tc, cut_reply_asked_again);
    tcase_add_test(tc, postponed_while_held_back);
    tcase_add_test(tc, end_after_cut_tail_asked_again);
    tcase_add_test(tc, jump_to_until_asked_again);
    tcase_add_test(tc, hole_in_reply_asked_again);
    tcase_add_test(tc, second_gap_among_held_replayed);
    tcase_add_test(tc, request_fails_barrier);
    tcase_add_test(tc, other_stream_goes_through);
    tcase_add_test(tc, oversize_rejected);
    tcase_add_test(tc, hold_full_gives_up);
    tcase_add_test(tc, oversize_during_replay_keeps_order);
    tcase_add_test(tc, hold_full_second_gap);
    tcase_add_test(tc, second_loss_in_one_gap_second_barrier);
    suite_add_tcase(s, tc);
    tc = tcase_create("restarts");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, start_recovers_history);
    tcase_add_test(tc, start_engine_holds_part);
    tcase_add_test(tc, start_nothing_held);
    tcase_add_test(tc, restart_back_recovers_start);
    tcase_add_test(tc, duplicate_is_not_a_restart);
    tcase_add_test(tc, reconnect_continuity_proven);
    tcase_add_test(tc, reconnect_other_bytes_is_a_restart);
    tcase_add_test(tc, reconnect_not_held_is_a_restart);
    tcase_add_test(tc, reconnect_seq_back_is_a_restart);
    tcase_add_test(tc, connected_proves_at_once);
    tcase_add_test(tc, connected_restart_then_new_incarnation);
    tcase_add_test(tc, connected_live_during_proof_is_held);
    tcase_add_test(tc, connected_without_replay_is_a_restart);
    tcase_add_test(tc, gap_above_max_batches_is_a_barrier);
    tcase_add_test(tc, replay_bounded_by_max_ms);
    tcase_add_test(tc, restart_during_replay);
    tcase_add_test(tc, wrap_during_replay);
    tcase_add_test(tc, trickle_bounded_by_timeout);
    suite_add_tcase(s, tc);
    tc = tcase_create("check_after_pause");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, check_nothing_missed);
    tcase_add_test(tc, check_recovers_dropped);
    tcase_add_test(tc, check_buffer_moved_on_is_a_barrier);
    tcase_add_test(tc, check_ahead_then_live_no_barrier);
    tcase_add_test(tc, check_live_copies_dropped);
    tcase_add_test(tc, check_unanswered_is_a_barrier);
    tcase_add_test(tc, check_live_meanwhile);
    tcase_add_test(tc, check_restart_meanwhile);
    tcase_add_test(tc, check_not_now);
    tcase_add_test(tc, check_request_fails_barrier);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    kvb_log_set_level(KVB_LOG_ERROR);
    return kvb_run_suite(replay_suite());
}
