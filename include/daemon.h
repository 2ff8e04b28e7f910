/* daemon: the loop.  One thread owns every piece of state: zmq_poll over the
 * sources' sockets, a signalfd (SIGTERM, SIGINT, SIGHUP) and an eventfd that
 * nats.c's callbacks write to; no busy polling (the poll blocks until
 * something happens or a replay deadline passes).  It schedules and takes no
 * part in the data path (source -> rules -> pipeline -> publish -> sink).
 * src/daemon/: loop.c, start.c, turn.c, reload.c, stop.c, sources.c, save.c
 * (daemon_priv.h).
 *
 * Ownership: kvb_daemon_run() takes ownership of *cfg (sets it to NULL) and
 * frees everything it built before returning.
 */
#ifndef KVB_DAEMON_H
#define KVB_DAEMON_H

#include "config.h"

/* Run until SIGTERM/SIGINT.  Returns the process exit code (docs/configuration.md
 * section 4): 0 clean stop, 69 NATS unreachable within nats.connect_timeout_ms,
 * 78 a TLS file that is not valid PEM, 1 other. */
int kvb_daemon_run(struct kvb_config **cfg);

#endif
