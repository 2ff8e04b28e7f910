/* zap: the ZAP handler (ZeroMQ RFC 27) that decides which CURVE clients a
 * bind-mode source accepts (sources[].curve.allowed_clients_file).
 *
 * During a CURVE handshake, a CURVE server socket asks whoever is bound to
 * inproc://zeromq.zap.01 in its ZMQ context whether the client's public key
 * may connect.  kvb_zap_create() binds a REP socket there; the loop thread
 * polls kvb_zap_socket() for ZMQ_POLLIN and calls kvb_zap_handle(), which
 * answers every pending request without blocking (a handshake waits for its
 * answer; libzmq gives up after ZMQ_HANDSHAKE_IVL, 30 s).
 *
 * Each CURVE source in bind mode registers a domain (kvb_zap_add(): its
 * allowed keys, or any key) and sets ZMQ_ZAP_DOMAIN on its SUB to the name it
 * got.  A request for an unknown domain, or for another mechanism than
 * CURVE, is refused.  Refusals are counted in
 * kvbridge_curve_clients_rejected_total and logged (rate-limited) with the
 * client's address, never a key.  Plain sockets without a ZAP domain (every
 * socket of a source without CURVE) are never asked.
 *
 * Order: create it before the sources it answers for.  libzmq lets a CURVE
 * client in without asking when nothing is bound to the ZAP endpoint, so
 * kvb_source_create() refuses an allowed_clients_file without a handler.
 *
 * Ownership: kvb_zap_create() returns a handler that owns its REP socket and
 * copies of the registered keys; kvb_zap_destroy(&z) closes and frees them
 * (accepts NULL and *z == NULL, sets NULL).  Destroy it after every source
 * registered with it and before zmq_ctx_term().  The ZMQ context and the
 * metrics must outlive it.  Only the loop thread calls these functions.
 */
#ifndef KVB_ZAP_H
#define KVB_ZAP_H

#include <stddef.h>
#include <stdint.h>

#include "metrics.h"

#define KVB_ZAP_DOMAIN_MAX 32 /* a domain name, NUL included */

struct kvb_zap;

int kvb_zap_create(void *zctx, struct kvb_metrics *m, struct kvb_zap **out);
void kvb_zap_destroy(struct kvb_zap **z);

/* The REP socket, for zmq_poll (ZMQ_POLLIN). */
void *kvb_zap_socket(struct kvb_zap *z);

/* Answer every pending request without blocking.  Returns the number
 * answered, or a negative errno (the socket is unusable). */
int kvb_zap_handle(struct kvb_zap *z);

/* Register a domain whose CURVE clients may connect when their public key is
 * one of the n keys (copied), or any client when n == 0.  label names the
 * source in the log.  The domain's name (for ZMQ_ZAP_DOMAIN) is written to
 * domain.  0, or -ENOMEM. */
int kvb_zap_add(struct kvb_zap *z, const char *label, const uint8_t (*keys)[32], size_t n,
                char domain[KVB_ZAP_DOMAIN_MAX]);

/* Forget a domain (its clients are refused from now on).  Accepts NULL z
 * and unknown names. */
void kvb_zap_remove(struct kvb_zap *z, const char *domain);

#endif
