/* loop: the daemon's run (include/daemon.h): start, turns until a stop,
 * stop.  The steps are in start.c, turn.c, reload.c and stop.c; what they
 * share in sources.c (the sources a configuration asks for) and save.c (the
 * cursors saved to state.dir), all declared in daemon_priv.h. */
#include "daemon.h"

#include <stdlib.h>
#include <string.h>

#include "daemon_priv.h"
#include "log.h"

int kvb_daemon_run(struct kvb_config **pcfg)
{
    struct kvb_daemon *d = calloc(1, sizeof(*d));
    if (!d) {
        kvb_config_free(pcfg);
        return 1;
    }
    d->cfg = *pcfg;
    *pcfg = NULL;
    d->sigfd = d->wakefd = -1;
    int exit_code = kvb_daemon_start(d), rc = 0;
    while (exit_code == 0 && !d->stop && (rc = kvb_daemon_turn(d)) >= 0)
        ;
    if (exit_code == 0 && rc < 0) {
        kvb_err("main", "poll: %s", strerror(-rc));
        exit_code = 1;
    }
    if (exit_code == 0)
        exit_code = kvb_daemon_stop(d);
    kvb_daemon_free(d);
    return exit_code;
}
