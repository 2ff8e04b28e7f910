/* scrape_cost: what scraping an engine costs kvbridge, in CPU.
 *
 *   build/bench/scrape-cost [PAGE [SECONDS [INTERVAL_MS [TARGETS]]]]
 *       defaults: tests/data/metrics/vllm.txt 20 500 1
 *
 * A child process serves PAGE at /metrics and an empty /health with
 * libmicrohttpd on 127.0.0.1 (its CPU is not ours); this process runs the
 * scraper (kvb_scrape, the code kvbridge runs) on TARGETS targets (each
 * metrics + health) every INTERVAL_MS for SECONDS, taking every result as
 * the loop would, and prints its own CPU time (getrusage: user + system,
 * every thread) as a percentage of one core over the wall time, per round,
 * and the pure parse cost of the page (thread CPU time) for comparison.
 */
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clock.h"
#include "engine/load.h"
#include "engine/scrape.h"

static char *page;
static size_t page_len;

static enum MHD_Result answer(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **req_cls)
{
    static int marker;
    (void)cls, (void)method, (void)version, (void)upload, (void)upload_size;
    if (!*req_cls) {
        *req_cls = &marker;
        return MHD_YES;
    }
    bool metrics = strcmp(url, "/metrics") == 0;
    struct MHD_Response *r = MHD_create_response_from_buffer(
        metrics ? page_len : 0, metrics ? page : (void *)"", MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    enum MHD_Result rc = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return rc;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static int read_page(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -errno;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    page = malloc((size_t)n + 1);
    if (!page || fread(page, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        return -EIO;
    }
    fclose(f);
    page_len = (size_t)n;
    return 0;
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "tests/data/metrics/vllm.txt";
    int seconds = argc > 2 ? atoi(argv[2]) : 20;
    uint32_t interval = argc > 3 ? (uint32_t)atoi(argv[3]) : 500;
    int ntargets = argc > 4 ? atoi(argv[4]) : 1;
    if (read_page(path) < 0 || seconds <= 0 || ntargets <= 0 || ntargets > 64) {
        fprintf(stderr, "usage: scrape-cost [PAGE [SECONDS [INTERVAL_MS [TARGETS]]]]\n");
        return 2;
    }

    /* the engine, in a child */
    int pfd[2];
    if (pipe(pfd) < 0)
        return 1;
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        struct MHD_Daemon *d =
            MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL, 0, NULL, NULL, answer,
                             NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_END);
        const union MHD_DaemonInfo *di =
            d ? MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT) : NULL;
        int port = di ? di->port : -1;
        if (write(pfd[1], &port, sizeof(port)) != sizeof(port))
            _exit(1);
        pause(); /* until the parent kills it */
        _exit(0);
    }
    close(pfd[1]);
    int port = -1;
    if (pid < 0 || read(pfd[0], &port, sizeof(port)) != sizeof(port) || port <= 0) {
        fprintf(stderr, "scrape-cost: engine did not start\n");
        return 1;
    }

    /* the pure parse cost of the page */
    struct kvb_engine_load *l = calloc(1, sizeof(*l));
    char *copy = malloc(page_len);
    int reps = 200;
    uint64_t t0 = kvb_clock_ns(CLOCK_THREAD_CPUTIME_ID);
    for (int i = 0; i < reps; i++) {
        memcpy(copy, page, page_len);
        kvb_engine_load_parse(KVB_ENGINE_VLLM, copy, page_len, l);
        kvb_engine_load_finish(l, NULL, 0);
    }
    double parse_us = (double)(kvb_clock_ns(CLOCK_THREAD_CPUTIME_ID) - t0) / 1e3 / reps;

    char murl[64], hurl[64];
    snprintf(murl, sizeof(murl), "http://127.0.0.1:%d/metrics", port);
    snprintf(hurl, sizeof(hurl), "http://127.0.0.1:%d/health", port);
    struct kvb_scrape_target t[64];
    for (int i = 0; i < ntargets; i++)
        t[i] = (struct kvb_scrape_target){.name = "bench",
                                          .kind = KVB_ENGINE_VLLM,
                                          .metrics_url = murl,
                                          .health_url = hurl,
                                          .interval_ms = interval};
    double c0 = cpu_s();
    uint64_t w0 = kvb_mono_ms();
    struct kvb_scrape *s = NULL;
    int rc = kvb_scrape_create(t, (size_t)ntargets, &s);
    if (rc < 0) {
        fprintf(stderr, "scrape-cost: kvb_scrape_create: %s\n", strerror(-rc));
        kill(pid, SIGKILL);
        return 1;
    }
    struct kvb_scrape_result *r = calloc(1, sizeof(*r));
    uint64_t rounds = 0, loads = 0, failed = 0, end = w0 + (uint64_t)seconds * 1000;
    for (uint64_t now; (now = kvb_mono_ms()) < end;) {
        struct pollfd p = {kvb_scrape_fd(s), POLLIN, 0};
        if (poll(&p, 1, (int)(end - now)) <= 0)
            continue;
        kvb_scrape_ack(s);
        for (int i = 0; i < ntargets; i++)
            if (kvb_scrape_take(s, (size_t)i, r) == 1) {
                rounds++;
                loads += r->has_load && r->load_ms == r->last_round_ms;
                failed += r->consecutive_failures > 0;
            }
    }
    kvb_scrape_destroy(&s);
    double cpu = cpu_s() - c0, wall = (double)(kvb_mono_ms() - w0) / 1e3;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);

    printf("page %s: %zu bytes; %d target(s) (metrics + health) every %u ms for %.1f s\n", path,
           page_len, ntargets, interval, wall);
    printf("rounds %llu (parsed %llu, failed %llu)\n", (unsigned long long)rounds,
           (unsigned long long)loads, (unsigned long long)failed);
    printf("cpu %.3f s = %.3f%% of one core; %.0f us per round; parse alone %.0f us per page\n",
           cpu, 100.0 * cpu / wall, rounds ? cpu * 1e6 / (double)rounds : 0.0, parse_us);
    free(r);
    free(l);
    free(copy);
    free(page);
    return failed ? 1 : 0;
}
