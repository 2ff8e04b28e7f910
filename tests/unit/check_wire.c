/* wire: Dynamo's recovery query on the wire, against known answers
 * (docs/dynamo-event-plane.md section 9): the bytes a Dynamo router sends
 * (control message, request, TwoPart envelope) parse; the bytes kvbridge
 * answers (stream items, mux frames, handshakes) are exactly serde_json's
 * output for the same values.  The expected texts were generated with
 * python3's json (compact separators, field order of the Rust structs) and
 * checked against the shared spec's RouterEvent known answer. */
#include "testutil.h"

#include <errno.h>

#include "recovery/wire.h"

#define W 7587890738027725506ULL
#define BLOCK 15760518052499183552ULL
#define TOKENS 7652252100776996844ULL

static struct kvb_wire_buf b;

static void setup(void) { memset(&b, 0, sizeof(b)); }
static void teardown(void) { kvb_wire_buf_free(&b); }

static void is(const char *want)
{
    ck_assert(!b.over && !b.oom);
    ck_assert_msg(b.len == strlen(want) && memcmp(b.p, want, b.len) == 0, "got  %.*s\nwant %s",
                  (int)b.len, (const char *)b.p, want);
    kvb_wire_buf_reset(&b);
}

START_TEST(requests)
{
    struct kvb_wire_request r;
    char err[128];
    static const char full[] =
        "{\"worker_id\":7587890738027725506,\"dp_rank\":0,\"start_event_id\":null,\"end_event_id\":"
        "null,\"supports_tree_dump_failed\":true,\"kind\":\"recovery\"}";
    ck_assert_uint_eq(strlen(full), 138);
    ck_assert_int_eq(kvb_wire_request_parse(full, strlen(full), &r, err, sizeof(err)), 0);
    ck_assert_uint_eq(r.worker_id, W);
    ck_assert(!r.has_start && !r.has_end && r.supports_tree_dump_failed);
    ck_assert_int_eq(r.kind, KVB_WIRE_KIND_RECOVERY);
    static const char gap[] =
        "{\"worker_id\":7587890738027725506,\"dp_rank\":0,\"start_event_id\":6,\"end_event_id\":"
        "null,\"supports_tree_dump_failed\":true,\"kind\":\"recovery\"}";
    ck_assert_int_eq(kvb_wire_request_parse(gap, strlen(gap), &r, err, sizeof(err)), 0);
    ck_assert(r.has_start && r.start == 6 && !r.has_end);
    static const char old[] = "{\"worker_id\":7587890738027725506,\"dp_rank\":0,\"start_event_id\":"
                              "null,\"end_event_id\":null}";
    ck_assert_uint_eq(strlen(old), 87);
    ck_assert_int_eq(kvb_wire_request_parse(old, strlen(old), &r, err, sizeof(err)), 0);
    ck_assert(!r.supports_tree_dump_failed);
    ck_assert_int_eq(r.kind, KVB_WIRE_KIND_RECOVERY);
    static const char status[] = "{\"worker_id\":1,\"dp_rank\":2,\"kind\":{\"status\":{}}}";
    ck_assert_int_eq(kvb_wire_request_parse(status, strlen(status), &r, err, sizeof(err)), 0);
    ck_assert_int_eq(r.kind, KVB_WIRE_KIND_STATUS);
    ck_assert_uint_eq(r.dp_rank, 2);
    static const char *bad[] = {"{\"dp_rank\":0}",
                                "{\"worker_id\":-1}",
                                "[1]",
                                "{\"worker_id\":1,\"dp_rank\":4294967296}",
                                "{\"worker_id\":1,\"start_event_id\":\"6\"}",
                                "{\"worker_id\":1} x"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_int_eq(kvb_wire_request_parse(bad[i], strlen(bad[i]), &r, err, sizeof(err)),
                         -EINVAL);
}
END_TEST

static const char mux_control[] =
    "{\"id\":\"9f1c2d3e-4b5a-4697-8a1b-2c3d4e5f6a7b\",\"request_type\":\"single_in\","
    "\"response_type\":\"many_out\",\"payload_codec\":\"json\",\"connection_info\":{\"transport\":"
    "\"tcp_response_mux_v1\",\"info\":\"{\\\"address\\\":\\\"10.0.0.5:41234\\\",\\\"frontend_"
    "server_id\\\":\\\"0b6e2a44-1f3c-4d5e-9a7b-8c9d0e1f2a3b\\\",\\\"stream_id\\\":\\\"5d4c3b2a-"
    "1908-4776-8554-433221100fed\\\",\\\"context\\\":\\\"9f1c2d3e-4b5a-4697-8a1b-2c3d4e5f6a7b\\\"}"
    "\"}}";

START_TEST(control_messages)
{
    struct kvb_wire_control c;
    char err[128];
    ck_assert_uint_eq(strlen(mux_control), 390);
    ck_assert_int_eq(kvb_wire_control_parse(mux_control, strlen(mux_control), &c, err, sizeof(err)),
                     0);
    ck_assert_int_eq(c.plane, KVB_WIRE_PLANE_MUX);
    ck_assert_str_eq(c.address, "10.0.0.5:41234");
    ck_assert_str_eq(c.id, "9f1c2d3e-4b5a-4697-8a1b-2c3d4e5f6a7b");
    ck_assert(!c.msgpack);
    char u[37];
    kvb_wire_uuid_format(c.stream, u);
    ck_assert_str_eq(u, "5d4c3b2a-1908-4776-8554-433221100fed");
    ck_assert_int_eq(c.stream[0], 0x5d);
    ck_assert_int_eq(c.stream[15], 0xed);
    kvb_wire_uuid_format(c.frontend, u);
    ck_assert_str_eq(u, "0b6e2a44-1f3c-4d5e-9a7b-8c9d0e1f2a3b");

    static const char legacy[] =
        "{\"id\":\"9f1c2d3e-4b5a-4697-8a1b-2c3d4e5f6a7b\",\"request_type\":\"single_in\","
        "\"response_type\":\"many_out\",\"connection_info\":{\"transport\":\"tcp_server\",\"info\":"
        "\"{\\\"address\\\":\\\"10.0.0.5:41234\\\",\\\"subject\\\":\\\"3e7f1a9b-2c4d-4e6f-8a0b-"
        "1c2d3e4f5a6b\\\",\\\"context\\\":\\\"9f1c2d3e-4b5a-4697-8a1b-2c3d4e5f6a7b\\\",\\\"stream_"
        "type\\\":\\\"response\\\"}\"}}";
    ck_assert_uint_eq(strlen(legacy), 321);
    ck_assert_int_eq(kvb_wire_control_parse(legacy, strlen(legacy), &c, err, sizeof(err)), 0);
    ck_assert_int_eq(c.plane, KVB_WIRE_PLANE_CALLHOME);
    ck_assert_str_eq(c.subject, "3e7f1a9b-2c4d-4e6f-8a0b-1c2d3e4f5a6b");

    static const char quic[] = "{\"id\":\"x\",\"connection_info\":{\"transport\":\"quic\",\"info\":"
                               "\"{}\"}}";
    ck_assert_int_eq(kvb_wire_control_parse(quic, strlen(quic), &c, err, sizeof(err)), 0);
    ck_assert_int_eq(c.plane, KVB_WIRE_PLANE_OTHER);
    ck_assert_str_eq(c.transport, "quic");
    static const char other_context[] =
        "{\"id\":\"a\",\"connection_info\":{\"transport\":\"tcp_server\",\"info\":\"{\\\"address"
        "\\\":\\\"h:1\\\",\\\"subject\\\":\\\"s\\\",\\\"context\\\":\\\"b\\\",\\\"stream_type\\\":"
        "\\\"response\\\"}\"}}";
    ck_assert_int_eq(
        kvb_wire_control_parse(other_context, strlen(other_context), &c, err, sizeof(err)),
        -EINVAL);
}
END_TEST

/* The envelope of (newest control, full-restore request): 552 bytes, prefix
 * 0000000000000186 000000000000008a 0000000000000000. */
START_TEST(twopart)
{
    static const char req[] =
        "{\"worker_id\":7587890738027725506,\"dp_rank\":0,\"start_event_id\":null,\"end_event_id\":"
        "null,\"supports_tree_dump_failed\":true,\"kind\":\"recovery\"}";
    uint8_t env[600];
    kvb_wire_twopart_head(env, strlen(mux_control), strlen(req));
    uint8_t want[24];
    unhex("0000000000000186000000000000008a0000000000000000", want);
    ck_assert_mem_eq(env, want, 24);
    memcpy(env + 24, mux_control, strlen(mux_control));
    memcpy(env + 24 + strlen(mux_control), req, strlen(req));
    size_t n = 24 + strlen(mux_control) + strlen(req);
    ck_assert_uint_eq(n, 552);
    struct kvb_wire_twopart t;
    ck_assert_int_eq(kvb_wire_twopart_parse(env, n, &t), 0);
    ck_assert_uint_eq(t.header_len, 390);
    ck_assert_uint_eq(t.body_len, 138);
    ck_assert_int_eq(kvb_wire_twopart_parse(env, n - 1, &t), -EINVAL);
    ck_assert_int_eq(kvb_wire_twopart_parse(env, 23, &t), -EINVAL);
    env[0] = 0xff; /* a header length past the message */
    ck_assert_int_eq(kvb_wire_twopart_parse(env, n, &t), -EINVAL);
}
END_TEST

static const char stored_json[] =
    "{\"worker_id\":7587890738027725506,\"storage_tier\":\"device\",\"residency_domain\":"
    "\"worker\","
    "\"event\":{\"event_id\":5,\"data\":{\"stored\":{\"parent_hash\":null,\"start_position\":null,"
    "\"blocks\":[{\"block_hash\":15760518052499183552,\"tokens_hash\":7652252100776996844,"
    "\"mm_extra_info\":null}]}},\"dp_rank\":0}}";

START_TEST(responses)
{
    struct kvb_block blk = {BLOCK, TOKENS};
    uint64_t h = BLOCK;
    struct kvb_rev st = {
        .type = KVB_REVT_STORED, .worker_id = W, .event_id = 5, .blocks = &blk, .n = 1};
    struct kvb_rev rm = {
        .type = KVB_REVT_REMOVED, .worker_id = W, .event_id = 6, .hashes = &h, .n = 1};
    struct kvb_rev cl = {.type = KVB_REVT_CLEARED, .worker_id = W, .event_id = 7};
    ck_assert_int_eq(kvb_wire_router_event(&b, &st, 5, true), 0);
    is(stored_json);

    /* Events [5, 6, 7], last 7: the bare response is 643 bytes */
    kvb_wire_item_begin(&b, false);
    kvb_wire_item_event(&b, &st, 5, true);
    kvb_wire_item_event(&b, &rm, 6, true);
    kvb_wire_item_event(&b, &cl, 7, true);
    kvb_wire_item_end(&b, false, 7);
    char want[2048];
    snprintf(want, sizeof(want),
             "{\"data\":{\"Events\":{\"events\":[%s,%s,%s],\"last_event_id\":7}},"
             "\"complete_final\":false}",
             stored_json,
             "{\"worker_id\":7587890738027725506,\"storage_tier\":\"device\",\"residency_domain\":"
             "\"worker\",\"event\":{\"event_id\":6,\"data\":{\"removed\":{\"block_hashes\":["
             "15760518052499183552]}},\"dp_rank\":0}}",
             "{\"worker_id\":7587890738027725506,\"storage_tier\":\"device\",\"residency_domain\":"
             "\"worker\",\"event\":{\"event_id\":7,\"data\":\"cleared\",\"dp_rank\":0}}");
    ck_assert_uint_eq(strlen(want) - strlen("{\"data\":,\"complete_final\":false}"), 643);
    is(want);

    /* a scoped "cleared" carries its tier; an unscoped one is "device"
     * (every tier) whatever its tier field */
    cl.tier = KVB_TIER_HOST_PINNED;
    ck_assert_int_eq(kvb_wire_router_event(&b, &cl, 7, false), 0);
    is("{\"worker_id\":7587890738027725506,\"storage_tier\":\"device\",\"event\":{\"event_id\":7,"
       "\"data\":\"cleared\",\"dp_rank\":0}}");
    cl.scoped = true;
    ck_assert_int_eq(kvb_wire_router_event(&b, &cl, 7, false), 0);
    is("{\"worker_id\":7587890738027725506,\"storage_tier\":\"host_pinned\",\"event\":{"
       "\"event_id\":7,\"data\":\"cleared\",\"dp_rank\":0}}");

    kvb_wire_item_begin(&b, false); /* empty, 74 bytes as a stream item */
    kvb_wire_item_end(&b, false, 7);
    is("{\"data\":{\"Events\":{\"events\":[],\"last_event_id\":7}},\"complete_final\":false}");

    /* TreeDump: one block, synthetic id 0, last 7, reset_scope all (347 bare) */
    kvb_wire_item_begin(&b, true);
    kvb_wire_item_event(&b, &st, 0, true);
    kvb_wire_item_end(&b, true, 7);
    is("{\"data\":{\"TreeDump\":{\"events\":[{\"worker_id\":7587890738027725506,\"storage_tier\":"
       "\"device\",\"residency_domain\":\"worker\",\"event\":{\"event_id\":0,\"data\":{\"stored\":{"
       "\"parent_hash\":null,\"start_position\":null,\"blocks\":[{\"block_hash\":"
       "15760518052499183552,\"tokens_hash\":7652252100776996844,\"mm_extra_info\":null}]}},"
       "\"dp_rank\":0}}],\"last_event_id\":7,\"reset_scope\":\"all\"}},\"complete_final\":false}");

    kvb_wire_item_too_new(&b, 9, 7, 7);
    is("{\"data\":{\"TooNew\":{\"requested_start\":9,\"requested_end\":7,\"newest_available\":7}},"
       "\"complete_final\":false}");
    kvb_wire_item_invalid_range(&b, 6, 5);
    is("{\"data\":{\"InvalidRange\":{\"start_id\":6,\"end_id\":5}},\"complete_final\":false}");
    kvb_wire_item_error(&b, "WorkerKvQueryEngine::generate dp_rank mismatch: request.dp_rank=1 "
                            "this.dp_rank=0");
    is("{\"data\":{\"Error\":\"WorkerKvQueryEngine::generate dp_rank mismatch: request.dp_rank=1 "
       "this.dp_rank=0\"},\"complete_final\":false}");
    kvb_wire_item_dump_failed(&b, 7, "Indexer is offline");
    is("{\"data\":{\"TreeDumpFailed\":{\"last_event_id\":7,\"message\":\"Indexer is offline\"}},"
       "\"complete_final\":false}");
    kvb_wire_item_final(&b);
    is("{\"complete_final\":true}");
    kvb_wire_prologue(&b);
    is("{\"error\":null}");

    /* a host tier store with a parent, without residency_domain */
    st.tier = KVB_TIER_HOST_PINNED;
    st.has_parent = true;
    st.parent = 3;
    kvb_wire_router_event(&b, &st, 1, false);
    is("{\"worker_id\":7587890738027725506,\"storage_tier\":\"host_pinned\",\"event\":{\"event_"
       "id\":1,"
       "\"data\":{\"stored\":{\"parent_hash\":3,\"start_position\":null,\"blocks\":[{\"block_"
       "hash\":"
       "15760518052499183552,\"tokens_hash\":7652252100776996844,\"mm_extra_info\":null}]}},"
       "\"dp_rank\":0}}");

    /* an answer past its limit is refused, not cut */
    b.max = 100;
    kvb_wire_item_begin(&b, true);
    kvb_wire_item_event(&b, &st, 0, true);
    ck_assert(b.over);
}
END_TEST

START_TEST(response_planes)
{
    uint8_t f[16], s[16], c[16];
    ck_assert_int_eq(kvb_wire_uuid_parse("0b6e2a44-1f3c-4d5e-9a7b-8c9d0e1f2a3b", f), 0);
    ck_assert_int_eq(kvb_wire_uuid_parse("5d4c3b2a-1908-4776-8554-433221100fed", s), 0);
    ck_assert_int_eq(kvb_wire_uuid_parse("a1b2c3d4-e5f6-4789-8abc-def012345678", c), 0);
    ck_assert_int_eq(kvb_wire_uuid_parse("a1b2c3d4-e5f6-4789-8abc-def01234567", c), -EINVAL);
    ck_assert_int_eq(kvb_wire_uuid_parse("a1b2c3d4xe5f6-4789-8abc-def012345678", c), -EINVAL);
    ck_assert_int_eq(kvb_wire_uuid_parse("a1b2c3d4-e5f6-4789-8abc-def012345678", c), 0);
    /* mux handshake: a header-only TwoPart message of 174 bytes */
    kvb_wire_mux_handshake(&b, f, c);
    ck_assert_uint_eq(b.len + 24, 174);
    is("{\"kind\":\"response_mux\",\"version\":1,\"frontend_server_id\":"
       "\"0b6e2a44-1f3c-4d5e-9a7b-8c9d0e1f2a3b\",\"connection_id\":"
       "\"a1b2c3d4-e5f6-4789-8abc-def012345678\"}");
    /* the frontend's ConnectionAck(0) as TwoPart, 52 bytes */
    uint8_t ack[52];
    size_t n = unhex("00000000000000140000000000000008000000000000000008000000000000000000000000"
                     "000000000000000000000000000000",
                     ack);
    ck_assert_uint_eq(n, 52);
    struct kvb_wire_twopart t;
    ck_assert_int_eq(kvb_wire_twopart_parse(ack, n, &t), 0);
    ck_assert_int_eq(kvb_wire_mux_ack_check(&t), 0);
    ack[51] = 1; /* an offset other than 0 */
    ck_assert_int_eq(kvb_wire_mux_ack_check(&t), -EINVAL);
    /* compact frame headers */
    uint8_t h[24], w[24];
    kvb_wire_mux_head(h, KVB_MUX_PROLOGUE, s, 14);
    unhex("0000000e010000005d4c3b2a190847768554433221100fed", w);
    ck_assert_mem_eq(h, w, 24);
    kvb_wire_mux_head(h, KVB_MUX_DATA, s, 0x4a);
    unhex("0000004a020000005d4c3b2a190847768554433221100fed", w);
    ck_assert_mem_eq(h, w, 24);
    kvb_wire_mux_head(h, KVB_MUX_END, s, 0);
    unhex("00000000030000005d4c3b2a190847768554433221100fed", w);
    ck_assert_mem_eq(h, w, 24);
    /* call-home handshake: 75 bytes of header */
    kvb_wire_callhome_handshake(&b, "3e7f1a9b-2c4d-4e6f-8a0b-1c2d3e4f5a6b");
    ck_assert_uint_eq(b.len, 0x4b);
    is("{\"subject\":\"3e7f1a9b-2c4d-4e6f-8a0b-1c2d3e4f5a6b\",\"stream_type\":\"response\"}");
}
END_TEST

static Suite *wire_suite(void)
{
    Suite *s = suite_create("wire");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, requests);
    tcase_add_test(tc, control_messages);
    tcase_add_test(tc, twopart);
    tcase_add_test(tc, responses);
    tcase_add_test(tc, response_planes);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(wire_suite()); }
