/* check_sink: subject templates, and the NATS sink against a real nats-server
 * (started here on a free loopback port, killed by PID in teardown).
 *
 * Run from the project root: build/tests/check_sink.  Under valgrind:
 *   CK_FORK=no valgrind --leak-check=full ./build/tests/check_sink
 */
#include <check.h>
#include <dirent.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nats/nats.h>

#include "config.h"
#include "log.h"
#include "metrics.h"
#include "sink.h"

#define DEFAULT_SUBJECT "namespace.{namespace}.component.{component}.kv_events"
#define SUBJ "namespace.dynamo.component.backend.kv_events"

/* ---- time ---- */

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000u, (long)(ms % 1000u) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

/* ---- fixture: the one test-only static (Check's fixtures need it).  Teardown
 * frees whatever a failed test left behind, so that with CK_FORK=no a live
 * sink never outlives the memory its callbacks write to. ---- */

struct tsub {
    natsConnection *nc;
    natsSubscription *sub;
};

static struct {
    pid_t pid;        /* nats-server, -1 when none */
    char conf[64];    /* its config file, "" when none */
    int saved_stderr; /* capture_start(): the real fd 2, -1 when none */
    char capture[64]; /* where fd 2 goes meanwhile */
    struct kvb_config *cfg;
    struct kvb_metrics m;
    struct kvb_sink *sink;
    struct tsub t;
    int fds[2];     /* wake pipe */
    char jsdir[64]; /* JetStream store of the server, "" when none */
} fx = {.pid = -1, .fds = {-1, -1}};

static int free_port(void)
{
    struct sockaddr_in a = {0};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static bool port_open(int port)
{
    struct sockaddr_in a = {0};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool ok;
    if (fd < 0)
        return false;
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

/* nats-server on 127.0.0.1:PORT, with the configuration text CONF (or none). */
static void server_start_conf(int port, const char *conf)
{
    char ports[16];
    pid_t parent = getpid();
    snprintf(ports, sizeof(ports), "%d", port);
    ck_assert_int_lt(fx.pid, 0);
    if (conf) {
        if (!fx.conf[0]) {
            strcpy(fx.conf, "/tmp/check_sink.conf.XXXXXX");
            int cfd = mkstemp(fx.conf);
            ck_assert_int_ge(cfd, 0);
            close(cfd);
        }
        FILE *f = fopen(fx.conf, "w");
        ck_assert_ptr_nonnull(f);
        fputs(conf, f);
        fclose(f);
    }
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int dn = open("/dev/null", O_RDWR);
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
        if (getppid() != parent)
            _exit(126);
        if (dn >= 0) {
            dup2(dn, 0);
            dup2(dn, 1);
            dup2(dn, 2);
        }
        if (conf)
            execlp("nats-server", "nats-server", "-a", "127.0.0.1", "-p", ports, "-c", fx.conf,
                   (char *)NULL);
        else
            execlp("nats-server", "nats-server", "-a", "127.0.0.1", "-p", ports, (char *)NULL);
        _exit(127);
    }
    fx.pid = pid;
    uint64_t deadline = now_ms() + 5000;
    while (!port_open(port)) {
        int st;
        ck_assert_msg(waitpid(pid, &st, WNOHANG) == 0, "nats-server exited at start");
        ck_assert_msg(now_ms() < deadline, "nats-server not listening on %d after 5 s", port);
        sleep_ms(10);
    }
}

static void server_start(int port) { server_start_conf(port, NULL); }

/* Every thread of PID is stopped (SIGSTOP took effect: /proc/PID/task/ * /stat
 * state T).  A stopped nats-server answers nothing from then on. */
static bool all_stopped(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return false;
    bool all = true;
    int n = 0;
    for (struct dirent *e; all && (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char sp[384], buf[512];
        snprintf(sp, sizeof(sp), "%s/%s/stat", path, e->d_name);
        FILE *f = fopen(sp, "r");
        size_t len = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
        if (f)
            fclose(f);
        buf[len] = '\0';
        const char *rp = strrchr(buf, ')'); /* "pid (comm) S ..." */
        all = rp && rp[1] == ' ' && (rp[2] == 'T' || rp[2] == 't');
        n++;
    }
    closedir(d);
    return all && n > 0;
}

/* SIGSTOP the server and wait (bounded) until it took effect. */
static void server_stop(void)
{
    kill(fx.pid, SIGSTOP);
    uint64_t deadline = now_ms() + 5000;
    while (!all_stopped(fx.pid)) {
        ck_assert_msg(now_ms() < deadline, "nats-server %d not stopped 5 s after SIGSTOP",
                      (int)fx.pid);
        sleep_ms(1);
    }
}

static void server_kill(void)
{
    if (fx.pid <= 0)
        return;
    kill(fx.pid, SIGKILL);
    uint64_t deadline = now_ms() + 5000;
    while (waitpid(fx.pid, NULL, WNOHANG) == 0 && now_ms() < deadline)
        sleep_ms(5);
    fx.pid = -1;
}

static void tsub_close(struct tsub *t);
static void cfg_free(struct kvb_config *c);

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void capture_stop(void);

static void fx_setup(void)
{
    memset(&fx, 0, sizeof(fx));
    fx.pid = -1;
    fx.saved_stderr = -1;
    fx.fds[0] = fx.fds[1] = -1;
}

static void fx_teardown(void)
{
    kvb_sink_destroy(&fx.sink);
    tsub_close(&fx.t);
    server_kill();
    for (int i = 0; i < 2; i++)
        if (fx.fds[i] >= 0)
            close(fx.fds[i]);
    fx.fds[0] = fx.fds[1] = -1;
    cfg_free(fx.cfg);
    fx.cfg = NULL;
    capture_stop();
    if (fx.conf[0])
        unlink(fx.conf);
    fx.conf[0] = '\0';
    if (fx.jsdir[0])
        nftw(fx.jsdir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    fx.jsdir[0] = '\0';
}

/* ---- config built by hand (the config module is someone else's) ---- */

static struct kvb_config *cfg_new(int port, uint32_t connect_timeout_ms, uint32_t wait_ms,
                                  uint32_t wait_max_ms, uint64_t rbuf)
{
    char url[64];
    struct kvb_config *c = calloc(1, sizeof(*c));
    ck_assert_ptr_nonnull(c);
    snprintf(url, sizeof(url), "nats://127.0.0.1:%d", port);
    c->worker_id = 7587890738027725506ull;
    c->nats.servers = calloc(1, sizeof(char *));
    ck_assert_ptr_nonnull(c->nats.servers);
    c->nats.servers[0] = strdup(url);
    c->nats.n_servers = 1;
    c->nats.subject = strdup(DEFAULT_SUBJECT);
    c->nats.namespace_ = strdup("dynamo");
    c->nats.component = strdup("backend");
    c->nats.credentials = strdup("");
    c->nats.connect_timeout_ms = connect_timeout_ms;
    c->nats.reconnect_buffer_bytes = rbuf;
    c->nats.reconnect_wait_ms = wait_ms;
    c->nats.reconnect_wait_max_ms = wait_max_ms;
    c->nats.flush_timeout_ms = 2000;
    return c;
}

static void cfg_free(struct kvb_config *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->nats.n_servers; i++)
        free(c->nats.servers[i]);
    free(c->nats.servers);
    free(c->nats.subject);
    free(c->nats.namespace_);
    free(c->nats.component);
    free(c->nats.credentials);
    free(c->nats.user);
    free(c->nats.password);
    free(c->nats.token);
    free(c->nats.nkey_seed);
    free(c->nats.nkey_public);
    free(c->nats.tls.ca);
    free(c->nats.tls.cert);
    free(c->nats.tls.key);
    free(c->nats.tls.server_name);
    free(c->nats.jetstream.stream);
    free(c->nats.jetstream.subject);
    free(c->nats.jetstream.stream_name);
    free(c->nats.jetstream.subject_name);
    free(c);
}

/* Set one string of a hand-made config. */
static void cfg_set(char **field, const char *v)
{
    free(*field);
    *field = strdup(v);
    ck_assert_ptr_nonnull(*field);
}

/* ---- what the sink logs (fd 2 into a file) ---- */

static void capture_start(void)
{
    ck_assert_int_lt(fx.saved_stderr, 0);
    strcpy(fx.capture, "/tmp/check_sink.log.XXXXXX");
    int fd = mkstemp(fx.capture);
    ck_assert_int_ge(fd, 0);
    fflush(stderr);
    fx.saved_stderr = dup(2);
    ck_assert_int_ge(fx.saved_stderr, 0);
    dup2(fd, 2);
    close(fd);
}

/* What was logged since capture_start() (malloc'd); the capture goes on. */
static char *captured(void)
{
    FILE *f = fopen(fx.capture, "r");
    ck_assert_ptr_nonnull(f);
    char *buf = calloc(1, 1 << 16);
    ck_assert_ptr_nonnull(buf);
    size_t n = fread(buf, 1, (1 << 16) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void capture_stop(void)
{
    if (fx.saved_stderr < 0)
        return;
    fflush(stderr);
    dup2(fx.saved_stderr, 2);
    close(fx.saved_stderr);
    fx.saved_stderr = -1;
    unlink(fx.capture);
}

static int count_str(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* ---- test subscriber (its own connection) ---- */

/* The test subscriber; USERINFO ("user:password@", "token@" or "") for
 * servers that want credentials. */
static void tsub_open_as(struct tsub *t, int port, const char *userinfo)
{
    char url[128];
    snprintf(url, sizeof(url), "nats://%s127.0.0.1:%d", userinfo, port);
    ck_assert_int_eq(natsConnection_ConnectTo(&t->nc, url), NATS_OK);
    ck_assert_int_eq(natsConnection_SubscribeSync(&t->sub, t->nc, SUBJ), NATS_OK);
    /* The server has the SUB once the PONG is back. */
    ck_assert_int_eq(natsConnection_FlushTimeout(t->nc, 3000), NATS_OK);
}

static void tsub_open(struct tsub *t, int port) { tsub_open_as(t, port, ""); }

static void tsub_close(struct tsub *t)
{
    if (!t->nc)
        return;
    natsSubscription_Destroy(t->sub);
    natsConnection_Destroy(t->nc);
    t->sub = NULL;
    t->nc = NULL;
}

static void tsub_expect(struct tsub *t, const char *prefix, int n)
{
    for (int i = 0; i < n; i++) {
        natsMsg *msg = NULL;
        char want[64];
        int wl = snprintf(want, sizeof(want), "%s-%05d", prefix, i);
        natsStatus st = natsSubscription_NextMsg(&msg, t->sub, 3000);
        ck_assert_msg(st == NATS_OK, "message %s: %s", want, natsStatus_GetText(st));
        ck_assert_str_eq(natsMsg_GetSubject(msg), SUBJ);
        ck_assert_int_eq(natsMsg_GetDataLength(msg), wl);
        ck_assert_msg(memcmp(natsMsg_GetData(msg), want, (size_t)wl) == 0,
                      "message %d: got %.*s want %s", i, natsMsg_GetDataLength(msg),
                      natsMsg_GetData(msg), want);
        natsMsg_Destroy(msg);
    }
}

static void publish_n(struct kvb_sink *s, const char *prefix, int n)
{
    for (int i = 0; i < n; i++) {
        char buf[64];
        int l = snprintf(buf, sizeof(buf), "%s-%05d", prefix, i);
        ck_assert_int_eq(kvb_sink_publish(s, SUBJ, buf, (size_t)l), 0);
    }
}

static int wake_pipe(int fds[2]) { return pipe2(fds, O_NONBLOCK | O_CLOEXEC); }

/* Bytes written to the wake pipe, waiting up to ms for the first. */
static int wait_wake(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char b[64];
    int total = 0;
    ssize_t n;
    if (poll(&p, 1, ms) <= 0)
        return 0;
    while ((n = read(fd, b, sizeof(b))) > 0)
        total += (int)n;
    return total;
}

static int drain(int fd)
{
    char b[64];
    int total = 0;
    ssize_t n;
    while ((n = read(fd, b, sizeof(b))) > 0)
        total += (int)n;
    return total;
}

static bool wait_connected(struct kvb_sink *s, bool want, unsigned ms)
{
    uint64_t deadline = now_ms() + ms;
    while (kvb_sink_connected(s) != want) {
        if (now_ms() >= deadline)
            return false;
        sleep_ms(5);
    }
    return true;
}

/* ---- sink without a server ---- */

START_TEST(test_destroy_null)
{
    struct kvb_sink *s = NULL;
    kvb_sink_destroy(NULL);
    kvb_sink_destroy(&s);
    ck_assert_ptr_null(s);
    ck_assert(!kvb_sink_connected(NULL));
    ck_assert_uint_eq(kvb_sink_pending_bytes(NULL), 0);
}
END_TEST

START_TEST(test_create_bad_args)
{
    fx.cfg = cfg_new(4222, 0, 100, 1000, 1 << 20);
    size_t n = fx.cfg->nats.n_servers;
    fx.cfg->nats.n_servers = 0;
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), -EINVAL);
    ck_assert_ptr_null(fx.sink);
    fx.cfg->nats.n_servers = n;
    ck_assert_int_eq(kvb_sink_create(NULL, &fx.m, -1, &fx.sink), -EINVAL);
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, NULL), -EINVAL);
    ck_assert_ptr_null(fx.sink);
}
END_TEST

START_TEST(test_connect_timeout)
{
    int port = free_port();
    fx.cfg = cfg_new(port, 500, 100, 200, 1 << 20);
    /* As on SIGHUP: another sink is live on these metrics. */
    atomic_store(&fx.m.nats_connected[0], 1);
    uint64_t t0 = now_ms();
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), -ETIMEDOUT);
    uint64_t dt = now_ms() - t0;
    ck_assert_ptr_null(fx.sink);
    ck_assert_msg(dt >= 450 && dt < 3000, "took %" PRIu64 " ms", dt);
    /* A failed create leaves the metrics alone. */
    ck_assert_uint_eq(kvb_get(&fx.m.nats_connected[0]), 1);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_disconnects_total[0]), 0);
}
END_TEST

START_TEST(test_buffer_full)
{
    char payload[200];
    int i, rc = 0;
    int port = free_port();

    fx.cfg = cfg_new(port, 0, 5000, 5000, 4096);
    memset(payload, 'p', sizeof(payload));
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), 0);
    struct kvb_sink *s = fx.sink;
    ck_assert(!kvb_sink_connected(s));
    for (i = 0; i < 100; i++) {
        rc = kvb_sink_publish(s, SUBJ, payload, sizeof(payload));
        if (rc != 0)
            break;
    }
    ck_assert_int_eq(rc, -EAGAIN);
    /* 4096 bytes of buffer, ~250 bytes per message; may overshoot by one. */
    ck_assert_int_ge(i, 4096 / 260);
    ck_assert_int_le(i, 4096 / 240 + 2);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_publish_errors_total[0]), 1);
    ck_assert_uint_ge(kvb_sink_pending_bytes(s), 4096);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_pending_bytes[0]), kvb_sink_pending_bytes(s));
    ck_assert_int_eq(kvb_sink_flush(s, 100), -ENOTCONN);

    ck_assert_int_eq(kvb_sink_publish(s, NULL, payload, 1), -EINVAL);
    ck_assert_int_eq(kvb_sink_publish(s, "", payload, 1), -EINVAL);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_publish_errors_total[0]), 3);

    /* Destroy does not wait out the reconnect delay. */
    uint64_t t0 = now_ms();
    kvb_sink_destroy(&fx.sink);
    ck_assert_ptr_null(fx.sink);
    ck_assert_uint_lt(now_ms() - t0, 1000);
}
END_TEST

/* ---- sink against nats-server ---- */

START_TEST(test_publish_order)
{
    enum { N = 2000 };
    int port = free_port();

    fx.cfg = cfg_new(port, 2000, 100, 1000, 8 << 20);
    server_start(port);
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), 0);
    struct kvb_sink *s = fx.sink;
    ck_assert(kvb_sink_connected(s));
    ck_assert_uint_eq(kvb_get(&fx.m.nats_connected[0]), 1);
    tsub_open(&fx.t, port);

    publish_n(s, "m", N);
    ck_assert_int_eq(kvb_sink_publish(s, SUBJ, NULL, 0), 0); /* empty payload */
    ck_assert_int_eq(kvb_sink_flush(s, 3000), 0);
    ck_assert_uint_eq(kvb_sink_pending_bytes(s), 0);
    tsub_expect(&fx.t, "m", N);
    natsMsg *msg = NULL;
    ck_assert_int_eq(natsSubscription_NextMsg(&msg, fx.t.sub, 3000), NATS_OK);
    ck_assert_int_eq(natsMsg_GetDataLength(msg), 0);
    natsMsg_Destroy(msg);

    /* Nothing more, no errors. */
    ck_assert_int_eq(natsSubscription_NextMsg(&msg, fx.t.sub, 100), NATS_TIMEOUT);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_publish_errors_total[0]), 0);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_disconnects_total[0]), 0);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_reconnects_total[0]), 0);

    /* Destroy writes no metrics (a replacement sink may own them). */
    kvb_sink_destroy(&fx.sink);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_connected[0]), 1);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_disconnects_total[0]), 0); /* own close not counted */
}
END_TEST

/* A request fn for test_serve_subjects: replies with its tag. */
static void reply_tag(void *closure, void *nats_conn, void *nats_msg)
{
    natsMsg *msg = nats_msg;
    const char *tag = closure;
    natsConnection_PublishString(nats_conn, natsMsg_GetReply(msg), tag);
    natsMsg_Destroy(msg);
}

/* The reply to a request on SUBJECT, or "(no responders)" (the server knows
 * no subscriber), "(timeout)" (one took it, none answered), "(error)". */
static const char *ask(natsConnection *nc, const char *subject)
{
    static char got[32];
    natsMsg *reply = NULL;
    natsStatus st = natsConnection_RequestString(&reply, nc, subject, "?", 2000);
    if (st == NATS_NO_RESPONDERS)
        return "(no responders)";
    if (st == NATS_TIMEOUT)
        return "(timeout)";
    if (st != NATS_OK)
        return "(error)";
    snprintf(got, sizeof(got), "%.*s", natsMsg_GetDataLength(reply), natsMsg_GetData(reply));
    natsMsg_Destroy(reply);
    return got;
}

/* Several subjects served at once (the query API and the recovery query),
 * each with its own fn; a full set refused; unserve drops them all. */
START_TEST(test_serve_subjects)
{
    int port = free_port();
    fx.cfg = cfg_new(port, 2000, 100, 1000, 8 << 20);
    server_start(port);
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), 0);
    static char a[] = "A", b[] = "B", c[] = "C";
    ck_assert_int_eq(kvb_sink_serve(fx.sink, "q.one", reply_tag, a), 0);
    ck_assert_int_eq(kvb_sink_serve(fx.sink, "q.two.*", reply_tag, b), 0);
    /* serve() sends the SUB and returns: the server has it once the flush's
     * PONG is back (a request before that finds no responder) */
    ck_assert_int_eq(kvb_sink_flush(fx.sink, 3000), 0);
    tsub_open(&fx.t, port);
    ck_assert_str_eq(ask(fx.t.nc, "q.one"), "A");
    ck_assert_str_eq(ask(fx.t.nc, "q.two.x"), "B");
    ck_assert_int_eq(kvb_sink_serve(fx.sink, "q.one", reply_tag, c), 0); /* replaced */
    ck_assert_int_eq(kvb_sink_flush(fx.sink, 3000), 0);
    ck_assert_str_eq(ask(fx.t.nc, "q.one"), "C");
    ck_assert_int_eq(kvb_sink_serve(fx.sink, "q.three", reply_tag, a), 0);
    ck_assert_int_eq(kvb_sink_serve(fx.sink, "q.four", reply_tag, a), 0);
    ck_assert_int_eq(kvb_sink_serve(fx.sink, "q.five", reply_tag, a), -ENOSPC);
    kvb_sink_unserve(fx.sink);
    /* the UNSUBs too: then the server knows nobody serving the subject */
    ck_assert_int_eq(kvb_sink_flush(fx.sink, 3000), 0);
    ck_assert_str_eq(ask(fx.t.nc, "q.two.x"), "(no responders)");
    uint64_t until = now_ms() + 3000;
    while (kvb_sink_serving(fx.sink) && now_ms() < until)
        sleep_ms(1);
    ck_assert(!kvb_sink_serving(fx.sink));
}
END_TEST

/* Every configured server is used: the first one is dead. */
START_TEST(test_multi_server)
{
    char url[64];
    int dead = free_port(), port = free_port();
    while (port == dead)
        port = free_port();
    fx.cfg = cfg_new(dead, 0, 3000, 3000, 8 << 20);
    char **v = realloc(fx.cfg->nats.servers, 2 * sizeof(char *));
    ck_assert_ptr_nonnull(v);
    fx.cfg->nats.servers = v;
    snprintf(url, sizeof(url), "nats://127.0.0.1:%d", port);
    v[1] = strdup(url);
    fx.cfg->nats.n_servers = 2;

    server_start(port);
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), 0);
    ck_assert(kvb_sink_connected(fx.sink)); /* the first pass tries every server */
    tsub_open(&fx.t, port);
    publish_n(fx.sink, "s", 20);
    ck_assert_int_eq(kvb_sink_flush(fx.sink, 3000), 0);
    tsub_expect(&fx.t, "s", 20);
}
END_TEST

/* Publishes are flushed by nats.c's flusher thread, not only by Flush(). */
START_TEST(test_latency_without_flush)
{
    int port = free_port();
    fx.cfg = cfg_new(port, 2000, 100, 1000, 8 << 20);
    server_start(port);
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), 0);
    tsub_open(&fx.t, port);
    uint64_t t0 = now_ms();
    publish_n(fx.sink, "l", 1);
    tsub_expect(&fx.t, "l", 1);
    uint64_t dt = now_ms() - t0;
    ck_assert_msg(dt < 500, "first message took %" PRIu64 " ms without a flush", dt);
}
END_TEST

/* NATS down at start, connect_timeout_ms 0: create succeeds, publishes are
 * buffered, and are delivered once the server appears.  NATS core drops
 * messages nobody is subscribed to, so the test subscriber must be in place
 * before the sink gets through: the sink's first retry comes reconnect_wait_ms
 * (minus <= 20% jitter) after create, and the server plus subscriber are up
 * well before that. */
START_TEST(test_down_at_start)
{
    enum { N = 300, WAIT = 3000 };
    int port = free_port();

    fx.cfg = cfg_new(port, 0, WAIT, WAIT, 8 << 20);
    ck_assert_int_eq(wake_pipe(fx.fds), 0);
    uint64_t t0 = now_ms();
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, fx.fds[1], &fx.sink), 0);
    struct kvb_sink *s = fx.sink;
    ck_assert_msg(now_ms() - t0 < 1000, "create blocked");
    ck_assert(!kvb_sink_connected(s));
    ck_assert_uint_eq(kvb_get(&fx.m.nats_connected[0]), 0);

    publish_n(s, "d", N);
    ck_assert_uint_gt(kvb_sink_pending_bytes(s), (uint64_t)N * 10);
    ck_assert_int_eq(kvb_sink_flush(s, 100), -ENOTCONN);

    server_start(port);
    tsub_open(&fx.t, port);
    ck_assert_msg(!kvb_sink_connected(s) && now_ms() - t0 < WAIT * 7 / 10,
                  "subscriber not ready before the sink's first retry (%" PRIu64 " ms)",
                  now_ms() - t0);

    ck_assert_msg(wait_connected(s, true, 8000), "sink never connected");
    ck_assert_int_ge(wait_wake(fx.fds[0], 2000), 1);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_connected[0]), 1);
    ck_assert_int_eq(kvb_sink_flush(s, 3000), 0);
    tsub_expect(&fx.t, "d", N);
    ck_assert_uint_eq(kvb_sink_pending_bytes(s), 0);
    /* The first connection is not a reconnection. */
    ck_assert_uint_eq(kvb_get(&fx.m.nats_reconnects_total[0]), 0);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_disconnects_total[0]), 0);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_publish_errors_total[0]), 0);

    /* And it keeps working. */
    publish_n(s, "e", 10);
    ck_assert_int_eq(kvb_sink_flush(s, 3000), 0);
    tsub_expect(&fx.t, "e", 10);

    kvb_sink_destroy(&fx.sink);
    ck_assert_int_eq(drain(fx.fds[0]), 0); /* own close does not wake the loop */
}
END_TEST

/* Server killed and restarted on the same port: the sink notices, buffers,
 * reconnects, and delivers what was published during the outage. */
START_TEST(test_server_restart)
{
    enum { WAIT = 2500 };
    int port = free_port();

    fx.cfg = cfg_new(port, 2000, WAIT, WAIT, 8 << 20);
    /* An eventfd, as the daemon's loop uses (the sink writes 8 bytes to it). */
    fx.fds[1] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ck_assert_int_ge(fx.fds[1], 0);
    fx.fds[0] = dup(fx.fds[1]);
    ck_assert_int_ge(fx.fds[0], 0);
    server_start(port);
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, fx.fds[1], &fx.sink), 0);
    struct kvb_sink *s = fx.sink;
    ck_assert(kvb_sink_connected(s));
    tsub_open(&fx.t, port);
    publish_n(s, "a", 50);
    ck_assert_int_eq(kvb_sink_flush(s, 3000), 0);
    tsub_expect(&fx.t, "a", 50);
    tsub_close(&fx.t);
    drain(fx.fds[0]);

    server_kill();
    ck_assert_msg(wait_connected(s, false, 5000), "disconnect not noticed");
    uint64_t t_down = now_ms();
    ck_assert_uint_eq(kvb_get(&fx.m.nats_disconnects_total[0]), 1);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_connected[0]), 0);
    ck_assert_int_ge(wait_wake(fx.fds[0], 2000), 1);

    publish_n(s, "b", 50); /* buffered */
    ck_assert_uint_gt(kvb_sink_pending_bytes(s), 50 * 10);
    ck_assert_int_eq(kvb_sink_flush(s, 100), -ENOTCONN);

    server_start(port);
    tsub_open(&fx.t, port);
    ck_assert_msg(!kvb_sink_connected(s) && now_ms() - t_down < WAIT * 7 / 10,
                  "subscriber not ready before the sink's retry (%" PRIu64 " ms)",
                  now_ms() - t_down);

    ck_assert_msg(wait_connected(s, true, 8000), "sink never reconnected");
    ck_assert_uint_eq(kvb_get(&fx.m.nats_reconnects_total[0]), 1);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_disconnects_total[0]), 1);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_connected[0]), 1);
    ck_assert_int_ge(wait_wake(fx.fds[0], 2000), 1);
    ck_assert_int_eq(kvb_sink_flush(s, 3000), 0);
    tsub_expect(&fx.t, "b", 50);

    publish_n(s, "c", 50);
    ck_assert_int_eq(kvb_sink_flush(s, 3000), 0);
    tsub_expect(&fx.t, "c", 50);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_publish_errors_total[0]), 0);

    kvb_sink_destroy(&fx.sink);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_disconnects_total[0]), 1);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_reconnects_total[0]), 1);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_connected[0]), 1);
    ck_assert_int_eq(drain(fx.fds[0]), 0); /* own close does not wake the loop */
}
END_TEST

/* ---- authentication and TLS against nats-server ---- */

#define CONF_USER "authorization { user: kvb, password: \"pw-good\" }\n"
#define SEED_RFC "SUAJ2YNRTXX72WTAXKCEV5ES5QWMIRCJYVUXWMTJDFYDXLADDSXH6YALCA"
#define PUB_RFC "UDLVVGABQKYQVN6VJP7NHSLEA45A5YLS6PNKMIZFV4BBU2HXA5IRUVAL"
#define SEED_ZERO "SUAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAEQ"
#define PUB_ZERO "UA5WUJ54Z23KILLCUOUNAKTPBVZWKMQVO4O6EQ5GHLAERIMLLHNCTYM5"

static void cfg_user(struct kvb_config *c, const char *user, const char *password)
{
    cfg_set(&c->nats.user, user);
    cfg_set(&c->nats.password, password);
}

START_TEST(test_userpass)
{
    int port = free_port();
    fx.cfg = cfg_new(port, 2000, 100, 200, 1 << 20);
    cfg_user(fx.cfg, "kvb", "pw-good");
    server_start_conf(port, CONF_USER);
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), 0);
    ck_assert(kvb_sink_connected(fx.sink));
    tsub_open_as(&fx.t, port, "kvb:pw-good@");
    publish_n(fx.sink, "u", 20);
    ck_assert_int_eq(kvb_sink_flush(fx.sink, 3000), 0);
    tsub_expect(&fx.t, "u", 20);
}
END_TEST

/* A bad password with connect_timeout_ms > 0: -EACCES at once (not after the
 * timeout), with the server's reason in the log and no secret in it. */
START_TEST(test_userpass_rejected)
{
    int port = free_port();
    fx.cfg = cfg_new(port, 5000, 100, 200, 1 << 20);
    cfg_user(fx.cfg, "kvb", "pw-bad");
    server_start_conf(port, CONF_USER);
    atomic_store(&fx.m.nats_connected[0], 1); /* as on SIGHUP: another sink is live */
    kvb_log_set_level(KVB_LOG_WARN);
    capture_start();
    uint64_t t0 = now_ms();
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), -EACCES);
    uint64_t dt = now_ms() - t0;
    char *log = captured();
    capture_stop();
    kvb_log_set_level(KVB_LOG_ERROR);
    ck_assert_ptr_null(fx.sink);
    ck_assert_msg(dt < 2000, "took %" PRIu64 " ms", dt);
    ck_assert_msg(strstr(log, "NATS server rejected the connection: Authorization Violation"),
                  "log: %s", log);
    ck_assert(!strstr(log, "pw-bad"));
    ck_assert_uint_eq(kvb_get(&fx.m.nats_connected[0]), 1); /* metrics untouched */
    free(log);
}
END_TEST

/* connect_timeout_ms 0: a refusal is retried forever, each attempt logged;
 * meanwhile publishes are refused and the buffer reads as full (the loop
 * stops reading).  Once the server accepts the password, the sink gets
 * through on its own. */
START_TEST(test_rejected_retry_forever)
{
    int port = free_port();
    fx.cfg = cfg_new(port, 0, 100, 200, 1 << 20);
    cfg_user(fx.cfg, "kvb", "pw-new");
    server_start_conf(port, CONF_USER);
    ck_assert_int_eq(wake_pipe(fx.fds), 0);
    kvb_log_set_level(KVB_LOG_INFO);
    capture_start();
    uint64_t t0 = now_ms();
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, fx.fds[1], &fx.sink), 0);
    ck_assert_msg(now_ms() - t0 < 1000, "create blocked");
    struct kvb_sink *s = fx.sink;
    ck_assert(!kvb_sink_connected(s));
    ck_assert_int_eq(kvb_sink_publish(s, SUBJ, "x", 1), -EAGAIN);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_publish_errors_total[0]), 1);
    ck_assert_uint_eq(kvb_sink_pending_bytes(s), 1 << 20);
    ck_assert_int_eq(kvb_sink_flush(s, 100), -ENOTCONN);

    /* attempts every 100-200 ms, each one logged */
    uint64_t deadline = now_ms() + 5000;
    char *log = NULL;
    for (;;) {
        free(log);
        log = captured();
        if (count_str(log, "Authorization Violation (attempt") >= 3 || now_ms() > deadline)
            break;
        sleep_ms(20);
    }
    ck_assert_msg(count_str(log, "NATS server rejected the connection: Authorization "
                                 "Violation") >= 4,
                  "log: %s", log);
    ck_assert(!strstr(log, "pw-new"));
    free(log);
    ck_assert(!kvb_sink_connected(s));

    /* the server learns the password */
    server_kill();
    server_start_conf(port, "authorization { user: kvb, password: \"pw-new\" }\n");
    tsub_open_as(&fx.t, port, "kvb:pw-new@");
    ck_assert_msg(wait_connected(s, true, 5000), "never got through");
    ck_assert_int_ge(wait_wake(fx.fds[0], 2000), 1);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_connected[0]), 1);
    ck_assert_uint_lt(kvb_sink_pending_bytes(s), 1 << 20);
    publish_n(s, "r", 10);
    ck_assert_int_eq(kvb_sink_flush(s, 3000), 0);
    tsub_expect(&fx.t, "r", 10);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_reconnects_total[0]), 0); /* the first connection */
    log = captured();
    kvb_log_set_level(KVB_LOG_ERROR);
    ck_assert_msg(strstr(log, "connected to NATS"), "log: %s", log);
    free(log);
}
END_TEST

/* Connected, then the server changes the password: nats.c gives up after
 * two refusals and closes the connection; the sink logs why, keeps trying,
 * and gets through once the server takes the password again. */
START_TEST(test_rejected_later)
{
    int port = free_port();
    fx.cfg = cfg_new(port, 2000, 100, 200, 1 << 20);
    cfg_user(fx.cfg, "kvb", "pw-good");
    server_start_conf(port, CONF_USER);
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), 0);
    struct kvb_sink *s = fx.sink;
    ck_assert(kvb_sink_connected(s));
    capture_start();

    server_kill();
    server_start_conf(port, "authorization { user: kvb, password: \"other\" }\n");
    uint64_t deadline = now_ms() + 8000;
    char *log = NULL;
    for (;;) {
        free(log);
        log = captured();
        if (count_str(log, "(attempt") >= 2 || now_ms() > deadline)
            break;
        sleep_ms(20);
    }
    ck_assert_msg(strstr(log, "NATS connection closed by the client library "
                              "(Authorization Violation)"),
                  "log: %s", log);
    ck_assert_msg(count_str(log, "rejected the connection: Authorization Violation "
                                 "(attempt") >= 2,
                  "log: %s", log);
    free(log);
    ck_assert(!kvb_sink_connected(s));
    ck_assert_int_eq(kvb_sink_publish(s, SUBJ, "x", 1), -EAGAIN);

    server_kill();
    server_start_conf(port, CONF_USER);
    tsub_open_as(&fx.t, port, "kvb:pw-good@");
    ck_assert_msg(wait_connected(s, true, 5000), "never got through again");
    publish_n(s, "l", 10);
    ck_assert_int_eq(kvb_sink_flush(s, 3000), 0);
    tsub_expect(&fx.t, "l", 10);
    ck_assert_uint_ge(kvb_get(&fx.m.nats_reconnects_total[0]), 1);
    ck_assert_uint_ge(kvb_get(&fx.m.nats_disconnects_total[0]), 1);
}
END_TEST

START_TEST(test_token)
{
    int port = free_port();
    fx.cfg = cfg_new(port, 2000, 100, 200, 1 << 20);
    cfg_set(&fx.cfg->nats.token, "tok-123");
    server_start_conf(port, "authorization { token: \"tok-123\" }\n");
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), 0);
    tsub_open_as(&fx.t, port, "tok-123@");
    publish_n(fx.sink, "t", 5);
    ck_assert_int_eq(kvb_sink_flush(fx.sink, 3000), 0);
    tsub_expect(&fx.t, "t", 5);
    kvb_sink_destroy(&fx.sink);

    cfg_set(&fx.cfg->nats.token, "tok-456");
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), -EACCES);
}
END_TEST

START_TEST(test_nkey)
{
    int port = free_port();
    fx.cfg = cfg_new(port, 2000, 100, 200, 1 << 20);
    cfg_set(&fx.cfg->nats.nkey_seed, SEED_RFC);
    cfg_set(&fx.cfg->nats.nkey_public, PUB_RFC);
    server_start_conf(port, "authorization { users = [ { nkey: " PUB_RFC " },\n"
                            "  { user: sub, password: subpw } ] }\n");
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), 0);
    tsub_open_as(&fx.t, port, "sub:subpw@");
    publish_n(fx.sink, "n", 5);
    ck_assert_int_eq(kvb_sink_flush(fx.sink, 3000), 0);
    tsub_expect(&fx.t, "n", 5);
    kvb_sink_destroy(&fx.sink);

    /* another key pair: refused */
    cfg_set(&fx.cfg->nats.nkey_seed, SEED_ZERO);
    cfg_set(&fx.cfg->nats.nkey_public, PUB_ZERO);
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), -EACCES);
}
END_TEST

/* TLS wanted, the server has none: refused, with the reason. */
START_TEST(test_tls_not_offered)
{
    int port = free_port();
    fx.cfg = cfg_new(port, 2000, 100, 200, 1 << 20);
    fx.cfg->nats.tls.enabled = true;
    fx.cfg->nats.tls.verify = true;
    server_start(port);
    kvb_log_set_level(KVB_LOG_WARN);
    capture_start();
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), -EACCES);
    char *log = captured();
    capture_stop();
    kvb_log_set_level(KVB_LOG_ERROR);
    ck_assert_msg(strstr(log, "NATS server rejected the connection: "), "log: %s", log);
    ck_assert_msg(strcasestr(log, "secure connection"), "log: %s", log);
    free(log);
}
END_TEST

/* A CA file that is not PEM: the options cannot be built (no server needed). */
START_TEST(test_tls_bad_ca)
{
    char path[] = "/tmp/check_sink.ca.XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "not a certificate\n", 18), 18);
    close(fd);
    fx.cfg = cfg_new(free_port(), 2000, 100, 200, 1 << 20);
    fx.cfg->nats.tls.enabled = true;
    fx.cfg->nats.tls.verify = true;
    cfg_set(&fx.cfg->nats.tls.ca, path);
    capture_start();
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), -EINVAL);
    char *log = captured();
    capture_stop();
    unlink(path);
    ck_assert_msg(strstr(log, "NATS TLS options: Error loading trusted certificates"), "log: %s",
                  log);
    free(log);
}
END_TEST

/* Destroy does not wait out the rebuild backoff. */
START_TEST(test_destroy_while_rejected)
{
    int port = free_port();
    fx.cfg = cfg_new(port, 0, 5000, 5000, 1 << 20);
    cfg_user(fx.cfg, "kvb", "pw-bad");
    server_start_conf(port, CONF_USER);
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), 0);
    ck_assert(!kvb_sink_connected(fx.sink));
    uint64_t t0 = now_ms();
    kvb_sink_destroy(&fx.sink);
    ck_assert_uint_lt(now_ms() - t0, 1000);
}
END_TEST

/* ---- JetStream against nats-server -js ---- */

#define JS_STREAM "kvtest"
#define JS_SUBJ "kvtest.queue"

/* A nats-server with JetStream (its store in fx.jsdir, kept across restarts). */
static void js_server_start(int port)
{
    char conf[256];
    if (!fx.jsdir[0]) {
        strcpy(fx.jsdir, "/tmp/check_sink.js.XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(fx.jsdir));
    }
    snprintf(conf, sizeof(conf), "jetstream { store_dir: \"%s\" }\n", fx.jsdir);
    server_start_conf(port, conf);
}

/* The JetStream keys of a hand-made config (the config module resolves the
 * names; here they are given). */
static void cfg_js(struct kvb_config *c, uint32_t max_pending, uint32_t ack_timeout_ms)
{
    c->nats.jetstream.enabled = true;
    cfg_set(&c->nats.jetstream.stream, JS_STREAM);
    cfg_set(&c->nats.jetstream.subject, JS_SUBJ);
    cfg_set(&c->nats.jetstream.stream_name, JS_STREAM);
    cfg_set(&c->nats.jetstream.subject_name, JS_SUBJ);
    c->nats.jetstream.create = true;
    c->nats.jetstream.retention = KVB_JS_LIMITS;
    c->nats.jetstream.max_age_s = 600;
    c->nats.jetstream.replicas = 1;
    c->nats.jetstream.duplicate_window_s = 120;
    c->nats.jetstream.max_pending = max_pending;
    c->nats.jetstream.ack_timeout_ms = ack_timeout_ms;
}

/* The stream's info through a connection of the test's own; NULL when
 * missing.  The caller destroys it. */
static jsStreamInfo *js_info(int port, const char *stream)
{
    char url[64];
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    jsStreamInfo *si = NULL;
    snprintf(url, sizeof(url), "nats://127.0.0.1:%d", port);
    ck_assert_int_eq(natsConnection_ConnectTo(&nc, url), NATS_OK);
    ck_assert_int_eq(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    if (js_GetStreamInfo(&si, js, stream, NULL, NULL) != NATS_OK)
        si = NULL;
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    return si;
}

static int64_t js_msgs(int port, const char *stream)
{
    jsStreamInfo *si = js_info(port, stream);
    int64_t n = si ? (int64_t)si->State.Msgs : -1;
    jsStreamInfo_Destroy(si);
    return n;
}

/* Create a stream by hand (for the refusal cases); max_msgs > 0: it keeps
 * that many and refuses the rest (discard new). */
static void js_make_stream(int port, const char *name, const char *subject, int64_t max_msgs)
{
    char url[64];
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    jsStreamConfig c;
    const char *subjects[1] = {subject};
    snprintf(url, sizeof(url), "nats://127.0.0.1:%d", port);
    ck_assert_int_eq(natsConnection_ConnectTo(&nc, url), NATS_OK);
    ck_assert_int_eq(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    jsStreamConfig_Init(&c);
    c.Name = name;
    c.Subjects = subjects;
    c.SubjectsLen = 1;
    if (max_msgs > 0) {
        c.MaxMsgs = max_msgs;
        c.Discard = js_DiscardNew;
    }
    ck_assert_int_eq(js_AddStream(NULL, js, &c, NULL, NULL), NATS_OK);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
}

/* Publish N messages "PREFIX-i" with Nats-Msg-Id "7.0.EPOCH.(FIRST + i)". */
static int js_publish_n(struct kvb_sink *s, const char *prefix, uint64_t epoch, int first, int n)
{
    for (int i = 0; i < n; i++) {
        char buf[64], id[64];
        int l = snprintf(buf, sizeof(buf), "%s-%05d", prefix, first + i);
        snprintf(id, sizeof(id), "7.0.%" PRIu64 ".%d", epoch, first + i);
        int rc = kvb_sink_publish_id(s, JS_SUBJ, buf, (size_t)l, id);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static bool wait_until_ms(bool (*cond)(void), unsigned ms)
{
    uint64_t deadline = now_ms() + ms;
    while (!cond()) {
        if (now_ms() >= deadline)
            return false;
        sleep_ms(10);
    }
    return true;
}

/* The stream is created with the configured settings; publishes are
 * acknowledged, flush waits for the acks; a Nats-Msg-Id sent again is dropped
 * by the duplicate window (and counted). */
START_TEST(test_js_create_publish)
{
    int port = free_port();
    fx.cfg = cfg_new(port, 3000, 100, 1000, 8 << 20);
    cfg_js(fx.cfg, 4096, 2000);
    fx.cfg->nats.jetstream.retention = KVB_JS_WORKQUEUE;
    fx.cfg->nats.jetstream.duplicate_window_s = 60;
    js_server_start(port);
    ck_assert_int_eq(js_msgs(port, JS_STREAM), -1);
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), 0);
    struct kvb_sink *s = fx.sink;

    jsStreamInfo *si = js_info(port, JS_STREAM);
    ck_assert_ptr_nonnull(si);
    ck_assert_int_eq(si->Config->SubjectsLen, 1);
    ck_assert_str_eq(si->Config->Subjects[0], JS_SUBJ);
    ck_assert_int_eq(si->Config->Retention, js_WorkQueuePolicy);
    ck_assert_int_eq(si->Config->MaxAge, 600LL * 1000000000LL);
    ck_assert_int_eq(si->Config->Replicas, 1);
    ck_assert_int_eq(si->Config->Duplicates, 60LL * 1000000000LL);
    jsStreamInfo_Destroy(si);

    ck_assert_int_eq(js_publish_n(s, "a", 1, 0, 100), 0);
    ck_assert_int_eq(kvb_sink_flush(s, 3000), 0);
    ck_assert_uint_eq(kvb_get(&fx.m.jetstream_acks_total[0]), 100);
    ck_assert_uint_eq(kvb_get(&fx.m.jetstream_duplicates_total[0]), 0);
    ck_assert_int_eq(js_msgs(port, JS_STREAM), 100);
    kvb_sink_pending_bytes(s);
    ck_assert_uint_eq(kvb_get(&fx.m.jetstream_pending[0]), 0);

    /* the same ids again (a restart re-publishing): stored once */
    ck_assert_int_eq(js_publish_n(s, "a", 1, 90, 20), 0);
    ck_assert_int_eq(kvb_sink_flush(s, 3000), 0);
    ck_assert_int_eq(js_msgs(port, JS_STREAM), 110);
    ck_assert_uint_eq(kvb_get(&fx.m.jetstream_duplicates_total[0]), 10);
    ck_assert_uint_eq(kvb_get(&fx.m.jetstream_acks_total[0]), 120);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_publish_errors_total[0]), 0);
    ck_assert_uint_eq(kvb_sink_losses(s), 0);
    kvb_sink_destroy(&fx.sink);

    /* a second sink uses the stream as it is */
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), 0);
    ck_assert_int_eq(js_publish_n(fx.sink, "a", 2, 0, 5), 0);
    ck_assert_int_eq(kvb_sink_flush(fx.sink, 3000), 0);
    ck_assert_int_eq(js_msgs(port, JS_STREAM), 115);
}
END_TEST

/* Streams that cannot be used stop create at once with -EACCES; JetStream not
 * answering is waited for up to connect_timeout_ms. */
START_TEST(test_js_refused)
{
    int port = free_port();
    fx.cfg = cfg_new(port, 3000, 100, 1000, 8 << 20);
    cfg_js(fx.cfg, 4096, 2000);
    js_server_start(port);
    capture_start();

    /* exists, but not for our subject */
    js_make_stream(port, JS_STREAM, "other.subject", 0);
    uint64_t t0 = now_ms();
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), -EACCES);
    ck_assert_uint_lt(now_ms() - t0, 2000);
    ck_assert_ptr_null(fx.sink);
    char *log = captured();
    ck_assert_msg(strstr(log, "stream kvtest exists but does not take the subject kvtest.queue "
                              "(its subjects: other.subject)"),
                  "%s", log);
    free(log);

    /* a wildcard stream that covers it is fine */
    js_make_stream(port, "wild", "kvwild.*", 0);
    cfg_set(&fx.cfg->nats.jetstream.stream_name, "wild");
    cfg_set(&fx.cfg->nats.jetstream.subject_name, "kvwild.queue");
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), 0);
    kvb_sink_destroy(&fx.sink);

    /* missing, and create is off */
    cfg_set(&fx.cfg->nats.jetstream.stream_name, "missing");
    fx.cfg->nats.jetstream.create = false;
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), -EACCES);
    log = captured();
    ck_assert(strstr(log, "stream missing does not exist (and nats.jetstream.create is false)"));
    free(log);
    ck_assert_int_eq(js_msgs(port, "missing"), -1);

    /* replicas on a single server: the server refuses the stream */
    fx.cfg->nats.jetstream.create = true;
    fx.cfg->nats.jetstream.replicas = 3;
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), -EACCES);
    ck_assert_int_eq(js_msgs(port, "missing"), -1);
    fx.cfg->nats.jetstream.replicas = 1;

    /* no JetStream on the server: waited for, then refused */
    server_kill();
    server_start(port);
    fx.cfg->nats.connect_timeout_ms = 1200;
    atomic_store(&fx.m.nats_connected[0], 7); /* as if another sink were live */
    t0 = now_ms();
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), -EACCES);
    uint64_t dt = now_ms() - t0;
    ck_assert_msg(dt >= 900 && dt < 4000, "took %" PRIu64 " ms", dt);
    log = captured();
    ck_assert(strstr(log, "JetStream is not available on the server"));
    free(log);
    ck_assert_uint_eq(kvb_get(&fx.m.nats_connected[0]), 7); /* a failed create: untouched */
}
END_TEST

static bool pending_zero(void)
{
    kvb_sink_pending_bytes(fx.sink);
    return kvb_get(&fx.m.jetstream_pending[0]) == 0;
}

/* The ack window: from 3/4 of max_pending unacknowledged publishes the
 * buffer reads as full (the loop pauses) until 1/2; publishes are refused
 * only when the unacknowledged ones would pass reconnect_buffer_bytes (by
 * their estimated size, payload + 256).  A server that stops answering makes
 * the acks time out and the publishes go again, and the stream keeps one
 * copy of each. */
START_TEST(test_js_window_resend)
{
    enum { MAXP = 16, RBUF = 8192, COST = 7 + 256 };
    char payload[64];
    int port = free_port();
    fx.cfg = cfg_new(port, 3000, 100, 500, RBUF);
    cfg_js(fx.cfg, MAXP, 300);
    js_server_start(port);
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), 0);
    struct kvb_sink *s = fx.sink;
    ck_assert_uint_lt(kvb_sink_pending_bytes(s), RBUF);

    server_stop(); /* no acks from now on */
    int i, rc = 0;
    uint64_t pending_at_12 = 0;
    for (i = 0; i < 100 && rc == 0; i++) {
        char id[32];
        int l = snprintf(payload, sizeof(payload), "w-%05d", i);
        ck_assert_int_eq(l, 7);
        snprintf(id, sizeof(id), "7.0.1.%d", i);
        if (i == MAXP / 4 * 3 - 1)
            ck_assert_uint_lt(kvb_sink_pending_bytes(s), RBUF); /* 11: not yet */
        rc = kvb_sink_publish_id(s, JS_SUBJ, payload, (size_t)l, id);
        if (i == MAXP / 4 * 3 - 1)
            pending_at_12 = kvb_sink_pending_bytes(s); /* 12: full */
    }
    ck_assert_uint_ge(pending_at_12, RBUF);
    ck_assert_int_eq(rc, -EAGAIN);
    int accepted = i - 1;
    ck_assert_int_eq(accepted, RBUF / COST); /* then the byte bound */
    ck_assert_uint_eq(kvb_get(&fx.m.nats_publish_errors_total[0]), 1);
    ck_assert_uint_ge(kvb_sink_pending_bytes(s), RBUF);
    ck_assert_uint_eq(kvb_get(&fx.m.jetstream_pending[0]), (uint64_t)accepted);
    int frc = kvb_sink_flush(s, 200);
    ck_assert_msg(frc == -ETIMEDOUT,
                  "flush with the server stopped: %d; acks %" PRIu64 ", timeouts %" PRIu64
                  ", no responders %" PRIu64 ", unavailable %" PRIu64 ", refused %" PRIu64
                  ", losses %" PRIu64 ", disconnects %" PRIu64 ", connected %d, pending %" PRIu64,
                  frc, kvb_get(&fx.m.jetstream_acks_total[0]),
                  kvb_get(&fx.m.jetstream_ack_failures_total[KVB_JSF_TIMEOUT]),
                  kvb_get(&fx.m.jetstream_ack_failures_total[KVB_JSF_NO_RESPONDERS]),
                  kvb_get(&fx.m.jetstream_ack_failures_total[KVB_JSF_UNAVAILABLE]),
                  kvb_get(&fx.m.jetstream_ack_failures_total[KVB_JSF_REFUSED]), kvb_sink_losses(s),
                  kvb_get(&fx.m.nats_disconnects_total[0]), kvb_sink_connected(s),
                  kvb_get(&fx.m.jetstream_pending[0]));
    /* past the ack timeout: the first one's times out; before anything is
     * sent again after later ones, the worker takes everything back and
     * reads the stream back, which does not answer either: nothing is sent
     * meanwhile (a resend could land after a later event) */
    sleep_ms(800);
    ck_assert_uint_ge(kvb_get(&fx.m.jetstream_ack_failures_total[KVB_JSF_TIMEOUT]), 1);
    /* nothing stored yet, only ack timeouts: a stall, counted once */
    ck_assert_uint_eq(kvb_get(&fx.m.jetstream_stalled[0]), 1);
    ck_assert_uint_eq(kvb_get(&fx.m.jetstream_stalls_total[0]), 1);
    kill(fx.pid, SIGCONT);

    ck_assert_int_eq(kvb_sink_flush(s, 5000), 0);
    ck_assert_uint_eq(kvb_get(&fx.m.jetstream_stalled[0]), 0); /* stored again: over */
    ck_assert_uint_eq(kvb_get(&fx.m.jetstream_stalls_total[0]), 1);
    ck_assert_msg(wait_until_ms(pending_zero, 2000), "pending did not drop to 0");
    ck_assert_uint_lt(kvb_sink_pending_bytes(s), RBUF);
    /* the stopped server had them all: read back, found stored, none sent
     * again, each stored once */
    ck_assert_int_eq(js_msgs(port, JS_STREAM), accepted);
    ck_assert_uint_eq(kvb_sink_losses(s), 0);
    ck_assert_uint_eq(kvb_get(&fx.m.jetstream_publish_errors_total[0]), 0);
    /* and it goes on */
    ck_assert_int_eq(js_publish_n(s, "x", 1, 1000, 10), 0);
    ck_assert_int_eq(kvb_sink_flush(s, 3000), 0);
    ck_assert_int_eq(js_msgs(port, JS_STREAM), accepted + 10);
}
END_TEST

/* A publish the stream refuses for good is a loss of its own pair: the
 * daemon repairs only the pairs kvb_sink_take_lost_pairs() names (the
 * Nats-Msg-Id's worker_id.dp_rank), not every pair. */
START_TEST(test_js_lost_pairs)
{
    int port = free_port();
    fx.cfg = cfg_new(port, 3000, 100, 1000, 8 << 20);
    cfg_js(fx.cfg, 4096, 2000);
    js_server_start(port);
    js_make_stream(port, JS_STREAM, JS_SUBJ, 3); /* takes 3, refuses the rest */
    capture_start();
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), 0);
    struct kvb_sink *s = fx.sink;
    static const char *const ids[] = {"7.0.1.0", "7.0.1.1", "7.0.1.2", /* stored */
                                      "7.3.1.0", "9.1.2.5", "7.3.1.1"};
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++)
        ck_assert_int_eq(kvb_sink_publish_id(s, JS_SUBJ, "x", 1, ids[i]), 0);
    uint64_t until = now_ms() + 5000;
    while (kvb_sink_losses(s) < 3 && now_ms() < until)
        sleep_ms(10);
    ck_assert_msg(kvb_sink_losses(s) == 3, "losses %" PRIu64 ", acks %" PRIu64, kvb_sink_losses(s),
                  kvb_get(&fx.m.jetstream_acks_total[0]));
    struct kvb_sink_pair v[KVB_SINK_LOST_PAIRS];
    bool all = true;
    size_t n = kvb_sink_take_lost_pairs(s, v, KVB_SINK_LOST_PAIRS, &all);
    ck_assert(!all);
    ck_assert_uint_eq(n, 2); /* 7.3 once, 9.1 */
    bool p73 = false, p91 = false;
    for (size_t i = 0; i < n; i++) {
        p73 |= v[i].worker_id == 7 && v[i].dp_rank == 3;
        p91 |= v[i].worker_id == 9 && v[i].dp_rank == 1;
    }
    ck_assert(p73 && p91);
    /* taken: the next call names none */
    ck_assert_uint_eq(kvb_sink_take_lost_pairs(s, v, KVB_SINK_LOST_PAIRS, &all), 0);
    ck_assert(!all);
    /* an id-less refusal names no pair: every pair */
    ck_assert_int_eq(kvb_sink_publish_id(s, JS_SUBJ, "x", 1, "bogus"), 0);
    until = now_ms() + 5000;
    while (kvb_sink_losses(s) < 4 && now_ms() < until)
        sleep_ms(10);
    ck_assert_uint_eq(kvb_sink_losses(s), 4);
    kvb_sink_take_lost_pairs(s, v, KVB_SINK_LOST_PAIRS, &all);
    ck_assert(all);
    capture_stop();
}
END_TEST

static bool sink_up(void) { return kvb_sink_connected(fx.sink); }

/* The server killed and restarted on the same store: what was in flight and
 * what was published meanwhile is stored once, in order. */
START_TEST(test_js_server_restart)
{
    int port = free_port();
    fx.cfg = cfg_new(port, 3000, 100, 300, 8 << 20);
    cfg_js(fx.cfg, 4096, 1000);
    js_server_start(port);
    ck_assert_int_eq(kvb_sink_create(fx.cfg, &fx.m, -1, &fx.sink), 0);
    struct kvb_sink *s = fx.sink;
    ck_assert_int_eq(js_publish_n(s, "a", 1, 0, 50), 0);
    ck_assert_int_eq(kvb_sink_flush(s, 3000), 0);

    ck_assert_int_eq(js_publish_n(s, "b", 1, 50, 50), 0); /* some in flight */
    server_kill();
    ck_assert_msg(wait_connected(s, false, 5000), "disconnect not noticed");
    ck_assert_int_eq(js_publish_n(s, "c", 1, 100, 50), 0); /* queued */
    ck_assert_int_eq(kvb_sink_flush(s, 100), -ENOTCONN);
    js_server_start(port);
    ck_assert_msg(wait_until_ms(sink_up, 8000), "sink never reconnected");
    ck_assert_int_eq(kvb_sink_flush(s, 8000), 0);
    ck_assert_int_eq(js_msgs(port, JS_STREAM), 150);

    /* in order: message i of the stream is event i */
    char url[64];
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    snprintf(url, sizeof(url), "nats://127.0.0.1:%d", port);
    ck_assert_int_eq(natsConnection_ConnectTo(&nc, url), NATS_OK);
    ck_assert_int_eq(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    for (int i = 0; i < 150; i++) {
        natsMsg *m = NULL;
        const char *id = NULL;
        char want[32];
        ck_assert_int_eq(js_GetMsg(&m, js, JS_STREAM, (uint64_t)i + 1, NULL, NULL), NATS_OK);
        ck_assert_int_eq(natsMsgHeader_Get(m, "Nats-Msg-Id", &id), NATS_OK);
        snprintf(want, sizeof(want), "7.0.1.%d", i);
        ck_assert_str_eq(id, want);
        natsMsg_Destroy(m);
    }
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    ck_assert_uint_eq(kvb_sink_losses(s), 0);
}
END_TEST

static Suite *sink_suite(void)
{
    Suite *su = suite_create("sink");
    TCase *tc = tcase_create("no_server");
    tcase_set_timeout(tc, 15);
    tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
    tcase_add_test(tc, test_destroy_null);
    tcase_add_test(tc, test_create_bad_args);
    tcase_add_test(tc, test_connect_timeout);
    tcase_add_test(tc, test_buffer_full);
    suite_add_tcase(su, tc);

    tc = tcase_create("nats_server");
    tcase_set_timeout(tc, 15);
    tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
    tcase_add_test(tc, test_publish_order);
    tcase_add_test(tc, test_serve_subjects);
    tcase_add_test(tc, test_latency_without_flush);
    tcase_add_test(tc, test_multi_server);
    tcase_add_test(tc, test_down_at_start);
    tcase_add_test(tc, test_server_restart);
    suite_add_tcase(su, tc);

    tc = tcase_create("security");
    tcase_set_timeout(tc, 30);
    tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
    tcase_add_test(tc, test_userpass);
    tcase_add_test(tc, test_userpass_rejected);
    tcase_add_test(tc, test_rejected_retry_forever);
    tcase_add_test(tc, test_rejected_later);
    tcase_add_test(tc, test_token);
    tcase_add_test(tc, test_nkey);
    tcase_add_test(tc, test_tls_not_offered);
    tcase_add_test(tc, test_tls_bad_ca);
    tcase_add_test(tc, test_destroy_while_rejected);
    suite_add_tcase(su, tc);

    tc = tcase_create("jetstream");
    tcase_set_timeout(tc, 30);
    tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
    tcase_add_test(tc, test_js_create_publish);
    tcase_add_test(tc, test_js_refused);
    tcase_add_test(tc, test_js_lost_pairs);
    tcase_add_test(tc, test_js_window_resend);
    tcase_add_test(tc, test_js_server_restart);
    suite_add_tcase(su, tc);
    return su;
}

int main(void)
{
    kvb_log_set_level(KVB_LOG_ERROR);
    SRunner *sr = srunner_create(sink_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    fx_teardown();
    /* nats.c keeps library threads and state until closed. */
    nats_CloseAndWait(5000);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
