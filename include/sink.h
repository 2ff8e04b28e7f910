/* sink: router events out to NATS (nats.c): core publish, or JetStream
 * (nats.jetstream.enabled) with acknowledgements.  What the sink does during
 * NATS outages, refusals and in JetStream mode is described for operators in
 * docs/kvbridge.8 (DESCRIPTION: "NATS outages", "JetStream"); this header is
 * the contract.  The implementation: src/sink/sink.c (core), io.c,
 * jetstream.c, options.c (src/sink/sink_priv.h).
 *
 * Threads: the loop thread owns the sink and is the only caller of its
 * functions (kvb_sink_connected() excepted: any thread).  The sink runs
 * threads of its own (an I/O thread, a worker that replaces connections and
 * sends JetStream messages again) besides nats.c's; none of them calls back
 * into the caller: a state change is signalled by writing to wake_fd.
 *
 * Ownership: kvb_sink_create() returns a sink the caller frees with
 * kvb_sink_destroy(&s) (accepts NULL, sets NULL).  The config and metrics
 * passed to create must outlive the sink; the sink copies what it keeps of
 * the config.  Publish copies the data, so the caller's buffer can be reused
 * at once.  The sink never calls nats_Close(): the process owner calls it
 * (or nats_CloseAndWait()) once at exit, after destroying every sink.
 *
 * Metrics: a sink writes metrics only from a successful create until destroy
 * starts, so on SIGHUP a new sink may share the metrics with the old one (a
 * failed create, or the old sink's destroy, leaves them alone).  nats.c's
 * threads and the sink's own write nats_reconnects_total,
 * nats_disconnects_total, nats_connected and the jetstream_* counters (atomic
 * adds); the loop thread (through kvb_sink_publish / kvb_sink_pending_bytes)
 * writes nats_publish_errors_total, nats_pending_bytes and jetstream_pending.
 *
 * wake_fd should be non-blocking (a full pipe is ignored); an eventfd gets an
 * 8-byte 1.
 */
#ifndef KVB_SINK_H
#define KVB_SINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvb_config;
struct kvb_metrics;
struct kvb_sink;

/* Create and start connecting.  wake_fd: the write end of the loop's wake pipe
 * (or an eventfd), -1 for none.  Returns 0 or a negative errno.  With
 * cfg->nats.connect_timeout_ms 0, create does not wait for a server: 0 even
 * when none answers or one refuses us (the sink keeps trying in the
 * background).  Otherwise: -ETIMEDOUT when no server answered within it,
 * -EACCES at once when a server refused us (credentials, TLS) or, in
 * JetStream mode, the stream cannot be used (see the man page; JetStream not
 * answering within the timeout: -EACCES, or -ETIMEDOUT when nothing answered
 * at all).  -EINVAL: bad arguments, or a CA / certificate file that is not
 * valid PEM.  -ENOMEM, or another errno when a thread cannot start.  May
 * block up to connect_timeout_ms (and, with 0, for two connection attempts
 * per server). */
int kvb_sink_create(const struct kvb_config *cfg, struct kvb_metrics *m, int wake_fd,
                    struct kvb_sink **out);

/* Publish one message.  0 (sent, or buffered to be sent: during an outage
 * too), or -EAGAIN when it cannot be buffered: the buffer
 * (reconnect_buffer_bytes) is full, in JetStream mode the unacknowledged
 * messages fill it, or the sink has no connection at all (a server refused
 * us); or another negative errno (-EMSGSIZE, -EINVAL, -ENOMEM, -EIO, ...).
 * Every error is counted in nats_publish_errors_total and the message is not
 * sent.  Same as kvb_sink_publish_id() without an id. */
int kvb_sink_publish(struct kvb_sink *s, const char *subject, const void *data, size_t len);

/* Publish one message; in JetStream mode with the header Nats-Msg-Id = msg_id
 * (NULL or "": none), in core mode msg_id is ignored.  Returns as
 * kvb_sink_publish(). */
int kvb_sink_publish_id(struct kvb_sink *s, const char *subject, const void *data, size_t len,
                        const char *msg_id);

/* Publish one message with NATS headers (core mode only: -ENOTSUP in
 * JetStream mode): hdrs holds n_hdrs (name, value) pairs, hdrs[2i] the name
 * and hdrs[2i+1] the value.  Returns as kvb_sink_publish(). */
int kvb_sink_publish_hdrs(struct kvb_sink *s, const char *subject, const void *data, size_t len,
                          const char *const *hdrs, size_t n_hdrs);

/* True once connected (and not currently reconnecting). Any thread. */
bool kvb_sink_connected(const struct kvb_sink *s);

/* Bytes waiting to be sent: nats.c's write buffer, plus while disconnected an
 * estimate of its reconnect buffer (protocol bytes published since the outage
 * began).  At least reconnect_buffer_bytes (the buffer size: "full") while
 * the sink has no connection, and in JetStream mode while the ack window is
 * full; the caller pauses its input on "full".  Also stores the value in the
 * nats_pending_bytes gauge (and the window in jetstream_pending).  Loop
 * thread only. */
uint64_t kvb_sink_pending_bytes(const struct kvb_sink *s);

/* Flush everything published so far, waiting at most timeout_ms (0 counts as
 * 1).  0, -ENOTCONN at once when not connected (nothing waits during an
 * outage), -ETIMEDOUT, -EPIPE when closed, -EIO.  JetStream mode: 0 once
 * every publish so far is acknowledged by the stream (or given up, which
 * kvb_sink_losses() counts). */
int kvb_sink_flush(struct kvb_sink *s, uint32_t timeout_ms);

/* Flush (cfg->nats.flush_timeout_ms, if connected; JetStream: wait that long
 * for the acknowledgements), close, wait for nats.c's last callback so none
 * can touch the freed sink, free.  What is still buffered or unacknowledged
 * then is lost.  May also wait for a connection attempt in progress (about 2
 * x servers x min(2 s, connect timeout)).  Does not call nats_Close(). */
void kvb_sink_destroy(struct kvb_sink **s);

/* The loop's signalfd (-1: none): while a signal waits on it (poll only,
 * never read), the sink cuts a handshake in progress that went unanswered
 * for a tick.  nats.c holds its connection's lock through a reconnection's
 * handshake; the loop, publishing, waits on that lock and cannot read its
 * signal until the attempt ends (kvbridge(8) HOSTILE PEERS).  Call after
 * create. */
void kvb_sink_watch_signals(struct kvb_sink *s, int sigfd);

/* The daemon stops: from now on a handshake unanswered for a tick is cut
 * (the drain does not wait for a server that does not answer). */
void kvb_sink_stopping(struct kvb_sink *s);

/* Router event bytes not delivered yet: what nats.c's buffer holds (and,
 * during an outage, the estimate of its reconnect buffer); in JetStream mode
 * the publishes not acknowledged.  0 while no connection exists (unlike
 * kvb_sink_pending_bytes, which reports a closed connection as a full
 * buffer; what a connection given up held is counted in kvb_sink_losses).
 * Loop thread only. */
uint64_t kvb_sink_unsent_bytes(const struct kvb_sink *s);

/* The daemon's drain already spent nats.flush_timeout_ms and gave up:
 * kvb_sink_destroy() then does not wait that long again (SIGTERM ends
 * kvbridge within one flush timeout, kvbridge(8) HOSTILE PEERS). */
void kvb_sink_skip_final_flush(struct kvb_sink *s);

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

/* Serve requests (core NATS request/reply) on subject (wildcards allowed):
 * fn runs on nats.c's delivery thread of the subscription, with the
 * natsConnection * and the natsMsg * (typed void here so that this header
 * does not need nats.h); fn owns the message (natsMsg_Destroy) and
 * publishes its replies on that connection itself.  Up to
 * KVB_SINK_SERVE_MAX subjects at once (the query API, the recovery query);
 * serving a subject already served replaces its fn.  The subscriptions are
 * made again on every new connection the sink opens.  0, -ENOSPC (every
 * slot taken), or a negative errno when the subscription failed now (it is
 * tried again on the next connection).  Owner thread. */
#define KVB_SINK_SERVE_MAX 4
typedef void (*kvb_sink_request_fn)(void *closure, void *nats_conn, void *nats_msg);
int kvb_sink_serve(struct kvb_sink *s, const char *subject, kvb_sink_request_fn fn, void *closure);
/* Stop serving every subject: no new call of a fn starts after it returns;
 * one running may still end (kvb_sink_serving() says when none is left).
 * destroy does it too, and waits up to a few seconds for the callbacks.
 * Owner thread. */
void kvb_sink_unserve(struct kvb_sink *s);
bool kvb_sink_serving(const struct kvb_sink *s);

/* Publishes lost so far, as a count of losses (not of messages): each time
 * a connection was given up with router events in its reconnect buffer (core
 * mode; JetStream sends those again), plus each JetStream publish the stream
 * refused.  Monotonic; the
 * caller publishes a "cleared" barrier after each change. */
uint64_t kvb_sink_losses(const struct kvb_sink *s);

/* The (worker_id, dp_rank) pairs whose router events were lost since the
 * last call (a JetStream publish given up: its Nats-Msg-Id names the pair),
 * so that only they are repaired.  Returns how many were written to out
 * (cap >= KVB_SINK_LOST_PAIRS takes them all); *all is set when a loss names
 * no pair (core mode's reconnect buffer, more than KVB_SINK_LOST_PAIRS
 * pairs): then every pair needs its repair.  Owner thread. */
#define KVB_SINK_LOST_PAIRS 64
struct kvb_sink_pair {
    uint64_t worker_id;
    uint32_t dp_rank;
};
size_t kvb_sink_take_lost_pairs(struct kvb_sink *s, struct kvb_sink_pair *out, size_t cap,
                                bool *all);

#endif
