/* sink: router events out to NATS (nats.c): core publish, or JetStream
 * (nats.jetstream.enabled) with acknowledgements.
 *
 * The loop thread owns the sink and is the only caller of its functions.
 * The sink runs one I/O thread (nats.c in "external event loop" mode: it
 * reads the socket, and writes what the loop does not write itself, see
 * kvb_sink_defer_writes()); nats.c runs its reconnect, timer and callback
 * threads; its callbacks only touch atomics in the sink and write one byte
 * to the wake fd so the loop notices state changes.
 *
 * Ownership: kvb_sink_create() returns a sink the caller frees with
 * kvb_sink_destroy(&s) (accepts NULL / half-built, sets NULL).  The config and
 * metrics passed to create must outlive the sink.  Publish copies the data
 * (nats.c buffers it), so the caller's buffer can be reused at once.
 *
 * Threads: nats.c's callback thread writes the metrics nats_reconnects_total,
 * nats_disconnects_total and nats_connected; the loop thread (through
 * kvb_sink_publish / kvb_sink_pending_bytes) writes nats_publish_errors_total
 * and nats_pending_bytes.  A sink writes metrics only from a successful create
 * until destroy starts, so on SIGHUP a new sink may share the metrics with the
 * old one (a failed create, or the old sink's destroy, leaves them alone).
 * wake_fd should be non-blocking (a full pipe is ignored); an eventfd gets an
 * 8-byte 1.
 *
 * Outage behaviour: nats.c reconnects forever (backoff from reconnect_wait_ms
 * doubling to reconnect_wait_max_ms, minus up to 20% jitter); while it is
 * disconnected (or not yet connected) publishes go into its reconnect buffer
 * and are sent, in order, once a server is reached.  Messages still buffered
 * when the sink is destroyed are lost.
 *
 * When a server refuses us (credentials, TLS) nats.c closes the connection
 * instead of retrying, and drops its buffer: the sink then owns one thread
 * that opens new connections with the same backoff, logging each refusal
 * (rate-limited).  Meanwhile publish returns -EAGAIN and pending bytes read
 * as the whole buffer (so the loop pauses the engines), and
 * kvb_sink_losses() counts the buffers lost.  destroy may wait for an
 * attempt in progress (about 2 x servers x min(2 s, connect timeout)).
 *
 * The sink never calls nats_Close(): the process owner calls it (or
 * nats_CloseAndWait()) once at exit, after destroying every sink.
 *
 * JetStream mode (cfg->nats.jetstream.enabled): create also makes a
 * JetStream context and, once connected, looks the stream up
 * (nats.jetstream.stream_name): it must take the subject (subject_name);
 * when it is missing and nats.jetstream.create is set it is created (subject,
 * retention, max age, replicas, duplicate window).  At create, a refusal
 * that trying again cannot mend (the stream exists without the subject, it
 * is missing and create is off, the server refuses the stream's
 * configuration) is -EACCES; JetStream not answering (not enabled, starting,
 * a cluster without a leader) is retried until nats.connect_timeout_ms
 * (then -EACCES, or -ETIMEDOUT when nothing answered at all); with
 * connect_timeout_ms 0, or when not connected yet, the check is left to the
 * sink's thread, which retries it with a backoff while publishes wait.
 * Publishes carry the header Nats-Msg-Id (kvb_sink_publish_id) and ask for
 * an acknowledgement.  A publish that gets none within
 * nats.jetstream.ack_timeout_ms, or is answered "no responders" / "JetStream
 * unavailable", is sent again (the same message, so the same Nats-Msg-Id:
 * the stream's duplicate window drops a copy it already holds), by the
 * sink's thread, once connected, after a growing pause for "no responders";
 * when nats.c gives a connection up, the unacknowledged messages move to the
 * new one, in event_id order per (worker_id, dp_rank).  Resent messages may
 * land after later ones (never twice within the duplicate window, never
 * missing).  A publish the stream refuses (a JetStream error, e.g. limits)
 * is given up: counted in jetstream_publish_errors_total and in
 * kvb_sink_losses(), so the loop publishes a barrier.  Unacknowledged
 * publishes ("in flight", the resend queues included) are the window:
 * kvb_sink_pending_bytes() reports the buffer as full from 3/4 of
 * nats.jetstream.max_pending (or of reconnect_buffer_bytes, by an estimate
 * of their size) until both are down to 1/2, so that the loop pauses the
 * engines; publish refuses with -EAGAIN only when their size would pass
 * reconnect_buffer_bytes (room for the events of what the loop read
 * meanwhile, as nats.c's buffer in core mode).  kvb_sink_flush() waits until every publish is acknowledged;
 * destroy waits for that (flush_timeout_ms), then drops what is left.
 * Metrics: jetstream_* (metrics.h), written by nats.c's ack thread, the
 * sink's thread and the loop thread (atomic adds).
 */
#ifndef KVB_SINK_H
#define KVB_SINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvb_config;
struct kvb_metrics;
struct kvb_sink;

/* Expand a subject template: {namespace} {component} {worker_id} {dp_rank}.
 * Returns the length written (NUL-terminated), or -ENAMETOOLONG / -EINVAL
 * (unknown {placeholder}). */
int kvb_subject_expand(const char *tmpl, const char *ns, const char *component,
                       uint64_t worker_id, uint32_t dp_rank, char *out, size_t cap);

/* Create and start connecting.  wake_fd: the write end of the loop's wake pipe
 * (or an eventfd), -1 for none.  Returns 0 or a negative errno; when
 * cfg->nats.connect_timeout_ms is 0 the sink keeps retrying in the background
 * (publishes are buffered by nats.c up to reconnect_buffer_bytes), otherwise
 * -ETIMEDOUT if no server answered in time, or -EACCES at once when a server
 * refused us (credentials, TLS).  -EINVAL: a CA / certificate file that is
 * not valid PEM. */
int kvb_sink_create(const struct kvb_config *cfg, struct kvb_metrics *m, int wake_fd,
                    struct kvb_sink **out);

/* Publish one message.  0, or -EAGAIN when nats.c's buffer is full (or, in
 * JetStream mode, the unacknowledged ones fill reconnect_buffer_bytes)
 * (counted as a publish error), or another negative errno.  Same as
 * kvb_sink_publish_id() without an id. */
int kvb_sink_publish(struct kvb_sink *s, const char *subject, const void *data,
                     size_t len);

/* Publish one message; in JetStream mode with the header Nats-Msg-Id = msg_id
 * (NULL or "": none), in core mode msg_id is ignored.  Returns as
 * kvb_sink_publish(). */
int kvb_sink_publish_id(struct kvb_sink *s, const char *subject, const void *data,
                        size_t len, const char *msg_id);

/* True once connected (and not currently reconnecting). Any thread. */
bool kvb_sink_connected(const struct kvb_sink *s);

/* Bytes waiting in nats.c's buffers (pending): its write buffer, plus while
 * disconnected an estimate of the reconnect buffer (protocol bytes published
 * since the outage began).  JetStream mode: at least the buffer size
 * (reconnect_buffer_bytes) while the ack window is full (see above).  Also
 * stores the value in the nats_pending_bytes gauge (and the window in
 * jetstream_pending).  Loop thread only. */
uint64_t kvb_sink_pending_bytes(const struct kvb_sink *s);

/* Flush everything published so far, waiting at most timeout_ms (0 counts as
 * 1).  0, -ENOTCONN at once when not connected (nothing waits during an
 * outage), -ETIMEDOUT, -EPIPE when closed, -EIO.  JetStream mode: 0 once
 * every publish so far is acknowledged by the stream (or given up, which
 * kvb_sink_losses() counts). */
int kvb_sink_flush(struct kvb_sink *s, uint32_t timeout_ms);

/* Flush (cfg->nats.flush_timeout_ms, if connected), close, wait for nats.c's
 * last callback so none can touch the freed sink, free.  Does not call
 * nats_Close(). */
void kvb_sink_destroy(struct kvb_sink **s);

/* From now on, the writes that publishes by the calling thread (the loop
 * thread, the sink's owner) need are left to kvb_sink_service(), which that
 * thread must then call before it waits for input: every publish of a turn
 * goes out in one send(), without a thread switch.  Without it, each write
 * is handed to the sink's I/O thread at once (no delay either). */
void kvb_sink_defer_writes(struct kvb_sink *s);

/* Send what the owner's publishes left in the buffer (see above); what the
 * socket does not take now is left to the I/O thread.  Cheap when nothing is
 * due.  Owner thread only; flush and destroy call it themselves. */
void kvb_sink_service(struct kvb_sink *s);

/* Serve requests (core NATS request/reply) on subject: fn runs on nats.c's
 * delivery thread of the subscription, with the natsConnection * and the
 * natsMsg * (typed void here so that this header does not need nats.h);
 * fn owns the message (natsMsg_Destroy) and publishes its replies on that
 * connection itself.  The subscription is made again on every new
 * connection the sink opens.  0, or a negative errno when the subscription
 * failed now (it is tried again on the next connection).  Owner thread. */
typedef void (*kvb_sink_request_fn)(void *closure, void *nats_conn, void *nats_msg);
int kvb_sink_serve(struct kvb_sink *s, const char *subject, kvb_sink_request_fn fn,
                   void *closure);
/* Stop serving: no new call of fn starts after it returns; one running may
 * still end (kvb_sink_serving() says when none is left).  destroy does it
 * too, and waits up to a few seconds for the callbacks.  Owner thread. */
void kvb_sink_unserve(struct kvb_sink *s);
bool kvb_sink_serving(const struct kvb_sink *s);

/* How many times nats.c gave up a connection (its buffered publishes are
 * then lost; not counted in JetStream mode, where they are sent again), plus
 * JetStream publishes given up.  The loop publishes a "cleared" barrier
 * after each change. */
uint64_t kvb_sink_losses(const struct kvb_sink *s);

#endif
