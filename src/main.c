/* kvbridge: engine KV events (ZeroMQ) -> router events (NATS).
 *
 *   kvbridge -c FILE            run in the foreground
 *   kvbridge -c FILE --check    validate the file: 0, or 78 with FILE:LINE:COL errors
 *                               (73 when state.dir cannot be created or written)
 *   kvbridge -c FILE --check -v ... and print the effective values
 *   kvbridge --version | --help
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include <nats/nats.h>

#include "config.h"
#include "daemon.h"
#include "log.h"
#include "state.h"
#include "version.h"

static void usage(FILE *f)
{
    fputs("usage: kvbridge -c FILE [--check [-v]]\n"
          "       kvbridge --version | --help\n"
          "Bridges an inference engine's KV-cache events (ZeroMQ, msgpack) to a\n"
          "prefix-cache router (NATS, router events).\n"
          "  -c, --config FILE  the YAML configuration (see kvbridge(8))\n"
          "  --check            validate FILE and exit: 0 ok, 78 errors (FILE:LINE:COL)\n"
          "  -v, --verbose      with --check: also print the effective values (after\n"
          "                     ${VAR} expansion and defaults; secrets redacted)\n"
          "  --version          print the version and exit\n"
          "  -h, --help         this text\n"
          "Signals: SIGHUP reloads FILE (an invalid file keeps the running one);\n"
          "SIGTERM/SIGINT stop reading, flush to NATS and exit 0.\n"
          "Exit codes: 0 clean stop, 78 bad configuration, 69 NATS unreachable\n"
          "within nats.connect_timeout_ms, 73 state.dir cannot be created or\n"
          "written, 1 other errors.\n",
          f);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'}, {"check", no_argument, NULL, 'k'},
        {"verbose", no_argument, NULL, 'v'},      {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
    };
    const char *path = NULL;
    int check = 0, verbose = 0, c;
    while ((c = getopt_long(argc, argv, "c:hv", longopts, NULL)) != -1) {
        switch (c) {
        case 'c': path = optarg; break;
        case 'k': check = 1; break;
        case 'v': verbose = 1; break;
        case 'V': printf("kvbridge %s\n", KVB_VERSION); return 0;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 1;
        }
    }
    if (!path || optind != argc || (verbose && !check)) {
        usage(stderr);
        return 1;
    }
    kvb_log_init();
    struct kvb_config *cfg = NULL;
    /* --check talks to a person: plain lines; a daemon logs them */
    if ((check ? kvb_config_load(path, &cfg, stderr) : kvb_config_load_logged(path, &cfg)) < 0)
        return KVB_EX_CONFIG;
    /* state.dir: created (0700) and found writable now rather than at the
     * first save, seconds into the run */
    const char *what = NULL;
    int src = cfg->state.dir[0] ? kvb_state_prepare_dir(cfg->state.dir, &what) : 0;
    if (src < 0) {
        if (check)
            fprintf(stderr, "%s: state.dir: %s '%s': %s\n", path, what, cfg->state.dir,
                    strerror(-src));
        else
            kvb_err("state", "state.dir: %s '%s': %s", what, cfg->state.dir, strerror(-src));
        kvb_config_free(&cfg);
        return KVB_EX_CANTCREAT;
    }
    if (check) {
        if (verbose && kvb_config_write_effective(cfg, stdout) < 0) {
            kvb_config_free(&cfg);
            return 1;
        }
        printf("%s: ok\n", path);
        kvb_config_free(&cfg);
        return 0;
    }
    int rc = kvb_daemon_run(&cfg);
    nats_Close();
    return rc;
}
