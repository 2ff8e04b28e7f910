/* libFuzzer target: kvb_config_load() on the input as a YAML file.
 *
 * The input is written to a memfd (no disk I/O) and loaded through its
 * /proc/self/fd path.  Seeds: tests/data/config/ (every .yaml) and conf/kvbridge.yaml.
 *
 * Checked: the return value is 0 (with a config) or a negative errno
 * (without one); a loaded config satisfies what config.h promises (at least
 * one source and one server, every string present, limits inside their
 * ranges), reload-checks against itself cleanly and frees to NULL; error
 * output is "FILE:LINE:COLUMN: message" or "FILE: message" lines, at most
 * 101 of them.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config.h"
#include "fuzz_common.h"
#include "log.h"

static void check_loaded(const struct kvb_config *c)
{
    FUZZ_CHECK(c->path != NULL, "path");
    FUZZ_CHECK(c->n_sources >= 1 && c->sources, "no source");
    for (size_t i = 0; i < c->n_sources; i++) {
        const struct kvb_source_cfg *s = &c->sources[i];
        FUZZ_CHECK(s->endpoint && s->endpoint[0], "source %zu: no endpoint", i);
        FUZZ_CHECK(s->replay_endpoint && s->topic, "source %zu: NULL string", i);
        FUZZ_CHECK(s->dp_size >= 1, "source %zu: dp_size 0", i);
        FUZZ_CHECK(s->mode == KVB_MODE_CONNECT || s->mode == KVB_MODE_BIND, "mode %d", s->mode);
    }
    FUZZ_CHECK(c->nats.n_servers >= 1 && c->nats.servers, "no NATS server");
    for (size_t i = 0; i < c->nats.n_servers; i++)
        FUZZ_CHECK(c->nats.servers[i] != NULL, "server %zu NULL", i);
    FUZZ_CHECK(c->nats.subject && c->nats.namespace_ && c->nats.component && c->nats.credentials &&
                   c->nats.jetstream.stream && c->metrics.listen && c->state.dir,
               "NULL string in a loaded config");
    FUZZ_CHECK(c->limits.max_payload_bytes >= 1 && c->limits.max_payload_bytes <= (1u << 30),
               "max_payload_bytes %llu", (unsigned long long)c->limits.max_payload_bytes);
    FUZZ_CHECK(c->limits.max_depth >= 1 && c->limits.max_depth <= 31, "max_depth %u",
               c->limits.max_depth);
    FUZZ_CHECK(c->limits.max_events_per_batch >= 1 && c->limits.max_hashes_per_event >= 1 &&
                   c->limits.max_tokens_per_event >= 1,
               "a limit is 0");
    FUZZ_CHECK(c->nats.reconnect_wait_max_ms >= c->nats.reconnect_wait_ms,
               "reconnect_wait_max_ms < reconnect_wait_ms");
    FUZZ_CHECK(c->log.level >= KVB_LOG_ERROR && c->log.level <= KVB_LOG_DEBUG, "log.level %d",
               c->log.level);
}

/* Every line of the error output names the file. */
static void check_errors(const char *path, const char *text, size_t len)
{
    size_t plen = strlen(path), lines = 0;
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        FUZZ_CHECK(nl != NULL, "error output does not end with a newline");
        lines++;
        bool too_many = (size_t)(nl - p) >= 4 && memmem(p, (size_t)(nl - p), "too many", 8);
        FUZZ_CHECK(too_many || ((size_t)(nl - p) > plen + 1 && memcmp(p, path, plen) == 0 &&
                                p[plen] == ':'),
                   "error line without FILE: prefix: %.*s", (int)(nl - p), p);
        p = nl + 1;
    }
    FUZZ_CHECK(lines <= 101, "%zu error lines", lines);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("kvb-fuzz-config", MFD_CLOEXEC);
        FUZZ_CHECK(fd >= 0, "memfd_create: %s", strerror(errno));
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    }
    FUZZ_CHECK(ftruncate(fd, 0) == 0, "ftruncate");
    FUZZ_CHECK(pwrite(fd, data, size, 0) == (ssize_t)size, "pwrite");

    char *errtext = NULL;
    size_t errlen = 0;
    FILE *err = open_memstream(&errtext, &errlen);
    FUZZ_CHECK(err != NULL, "open_memstream");

    struct kvb_config *cfg = NULL;
    int rc = kvb_config_load(path, &cfg, err);
    fclose(err);
    if (rc == 0) {
        FUZZ_CHECK(cfg != NULL, "load returned 0 without a config");
        check_loaded(cfg);
        FILE *null = fopen("/dev/null", "w");
        FUZZ_CHECK(null != NULL, "/dev/null");
        FUZZ_CHECK(kvb_config_check_reload(cfg, cfg, null) == 0, "config cannot reload itself");
        fclose(null);
        kvb_config_free(&cfg);
        FUZZ_CHECK(cfg == NULL, "kvb_config_free did not clear the pointer");
    } else {
        FUZZ_CHECK(rc < 0, "load returned %d", rc);
        FUZZ_CHECK(cfg == NULL, "config written on failure");
        FUZZ_CHECK(rc == -EINVAL || errlen > 0 || rc == -ENOMEM,
                   "load failed (%d) without saying why", rc);
        if (rc == -EINVAL)
            FUZZ_CHECK(errlen > 0, "-EINVAL without an error message");
    }
    check_errors(path, errtext, errlen);
    free(errtext);
    return 0;
}
