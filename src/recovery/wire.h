/* wire: Dynamo's KV recovery query on the wire (docs/dynamo-event-plane.md
 * section 9), the pure part: frames, the control message, the request, the
 * response items.  JSON through json-c; the response item is composed of
 * json-c's text of each RouterEvent and the fixed punctuation around the
 * array, so that a dump is written once, into one buffer, without a tree of
 * every event.
 *
 * Pure: no I/O, no clock, no globals.  Ownership: a kvb_wire_buf is the
 * caller's (kvb_wire_buf_free()); parsed structs hold copies (fixed-size
 * fields), no pointers into the input.
 */
#ifndef KVB_WIRE_H
#define KVB_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "convert.h"

#define KVB_WIRE_TWOPART_HEAD 24 /* header_len, body_len, checksum: u64 BE each */
#define KVB_WIRE_MUX_HEAD 24     /* payload_len u32, kind, flags, reserved u16, stream UUID */
#define KVB_WIRE_MAX_MESSAGE (32u << 20) /* Dynamo's DYN_TCP_MAX_MESSAGE_SIZE default */
#define KVB_WIRE_MAX_REQUEST (1u << 20)  /* what kvbridge takes of one request */

/* ---- TwoPart ------------------------------------------------------------- */

struct kvb_wire_twopart {
    const uint8_t *header, *body; /* into the input */
    size_t header_len, body_len;
};
/* One whole TwoPart message (len bytes exactly): 0 or -EINVAL. */
int kvb_wire_twopart_parse(const void *buf, size_t len, struct kvb_wire_twopart *out);
/* The 24-byte prefix of a TwoPart message (checksum 0, as Dynamo's release
 * builds write). */
void kvb_wire_twopart_head(uint8_t out[KVB_WIRE_TWOPART_HEAD], uint64_t header_len,
                           uint64_t body_len);

/* ---- the control message (RequestControlMessage) ------------------------- */

enum kvb_wire_plane {
    KVB_WIRE_PLANE_MUX,      /* tcp_response_mux_v1 */
    KVB_WIRE_PLANE_CALLHOME, /* tcp_server: one connection per response */
    KVB_WIRE_PLANE_OTHER,    /* QUIC, or anything else: not reachable from kvbridge */
};

struct kvb_wire_control {
    char id[128];         /* the request context id */
    int plane;            /* enum kvb_wire_plane */
    char transport[64];   /* connection_info.transport, as sent */
    char address[256];    /* where the response goes: HOST:PORT */
    uint8_t frontend[16]; /* mux: frontend_server_id */
    uint8_t stream[16];   /* mux: stream_id */
    char subject[128];    /* call-home: the response stream's subject */
    bool msgpack;         /* payload_codec "msgpack" */
};
/* 0, or -EINVAL with a message in err. */
int kvb_wire_control_parse(const void *json, size_t len, struct kvb_wire_control *out, char *err,
                           size_t err_cap);

/* ---- the request (WorkerKvQueryRequest) ---------------------------------- */

enum kvb_wire_kind { KVB_WIRE_KIND_RECOVERY, KVB_WIRE_KIND_STATUS, KVB_WIRE_KIND_STATE_AGENT };

struct kvb_wire_request {
    uint64_t worker_id;
    uint32_t dp_rank;
    bool has_start, has_end;
    uint64_t start, end;
    bool supports_tree_dump_failed; /* absent: false */
    int kind;                       /* enum kvb_wire_kind; absent: recovery */
};
/* JSON (the codec kvbridge advertises): 0, or -EINVAL with a message. */
int kvb_wire_request_parse(const void *json, size_t len, struct kvb_wire_request *out, char *err,
                           size_t err_cap);

/* ---- responses ----------------------------------------------------------- */

/* A growable buffer of at most max bytes (0: KVB_WIRE_MAX_MESSAGE); over
 * sets once the answer did not fit (the caller answers a failure instead). */
struct kvb_wire_buf {
    uint8_t *p;
    size_t len, cap, max;
    bool over, oom;
    bool first; /* the items' events array has none yet */
};
void kvb_wire_buf_free(struct kvb_wire_buf *b);
void kvb_wire_buf_reset(struct kvb_wire_buf *b);

/* One RouterEvent as Dynamo's JSON (event plane, docs/dynamo-event-plane.md
 * section 4): worker_id, storage_tier, residency_domain ("worker" when
 * residency_domain), event {event_id, data, dp_rank}; stored data with
 * parent_hash, start_position null, blocks with mm_extra_info null.
 * event_id: the one to write (a dump's synthetic ids). */
int kvb_wire_router_event(struct kvb_wire_buf *b, const struct kvb_rev *r, uint64_t event_id,
                          bool residency_domain);

/* A stream item NetworkStreamWrapper{data: WorkerKvQueryResponse} for the
 * events variants: begin, then kvb_wire_item_event() per event, then end.
 * tree_dump: "TreeDump" with reset_scope "all", else "Events". */
void kvb_wire_item_begin(struct kvb_wire_buf *b, bool tree_dump);
void kvb_wire_item_event(struct kvb_wire_buf *b, const struct kvb_rev *r, uint64_t event_id,
                         bool residency_domain);
void kvb_wire_item_end(struct kvb_wire_buf *b, bool tree_dump, uint64_t last_event_id);
/* The other variants, whole items. */
void kvb_wire_item_too_new(struct kvb_wire_buf *b, uint64_t start, uint64_t end, uint64_t newest);
void kvb_wire_item_invalid_range(struct kvb_wire_buf *b, uint64_t start, uint64_t end);
void kvb_wire_item_error(struct kvb_wire_buf *b, const char *message);
void kvb_wire_item_dump_failed(struct kvb_wire_buf *b, uint64_t last_event_id, const char *message);
/* {"complete_final":true}, the prologue {"error":null}. */
void kvb_wire_item_final(struct kvb_wire_buf *b);
void kvb_wire_prologue(struct kvb_wire_buf *b);

/* ---- the response planes ------------------------------------------------- */

/* Mux: the handshake (a header-only TwoPart message: {"kind":"response_mux",
 * "version":1,"frontend_server_id":..,"connection_id":..}). */
void kvb_wire_mux_handshake(struct kvb_wire_buf *b, const uint8_t frontend[16],
                            const uint8_t connection[16]);
/* The frontend's answer to it: a TwoPart message whose header is the
 * 20-byte frame header of a ConnectionAck and whose body is u64 BE 0.
 * 0, or -EINVAL. */
int kvb_wire_mux_ack_check(const struct kvb_wire_twopart *t);
enum kvb_wire_mux_kind {
    KVB_MUX_PROLOGUE = 1,
    KVB_MUX_DATA = 2,
    KVB_MUX_END = 3,
    KVB_MUX_STOP = 4,
    KVB_MUX_KILL = 5,
    KVB_MUX_WINDOW_UPDATE = 6,
    KVB_MUX_RESET = 7,
    KVB_MUX_CONNECTION_ACK = 8,
};
void kvb_wire_mux_head(uint8_t out[KVB_WIRE_MUX_HEAD], int kind, const uint8_t stream[16],
                       uint32_t payload_len);
/* Call-home: the handshake {"subject":..,"stream_type":"response"} and the
 * sentinel "sentinel" (header-only TwoPart messages). */
void kvb_wire_callhome_handshake(struct kvb_wire_buf *b, const char *subject);

/* UUID text (8-4-4-4-12 hex) <-> 16 bytes: 0 or -EINVAL. */
int kvb_wire_uuid_parse(const char *s, uint8_t out[16]);
void kvb_wire_uuid_format(const uint8_t u[16], char out[37]);

#endif
