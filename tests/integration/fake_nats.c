/* fake_nats: a hostile NATS server for the integration tests.
 *
 *   fake_nats PORT GOOD [HANGUP_MS [ADVERTISE]]
 *
 * Listens on 127.0.0.1:PORT.  Every connection gets an INFO line.  The first
 * GOOD connections are served like a real server: each PING gets a PONG,
 * PUB/HPUB payloads are skipped (counted: "pubs=N" when the connection ends),
 * and after HANGUP_MS (0: never) the server hangs up.  Every later connection
 * gets INFO and then nothing: its CONNECT and PING are read and ignored, never
 * answered (the handshake of the NATS client never completes).
 * With ADVERTISE (HOST:PORT), the INFO lists it in connect_urls, as a server
 * of a cluster advertises the others (a client that follows it sends its
 * credentials there).
 * With FAKE_NATS_LATE_PONG_MS set (environment), a later connection is not
 * mute but late: its PINGs are answered that many ms after it was accepted,
 * and it is then served like a good one.
 * Prints "conn N good|mute" when a connection is accepted and "close N" when
 * it ends; stops on SIGTERM/SIGINT.  One thread, poll().
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS 64
#define INFO                                                           \
    "INFO {\"server_id\":\"FAKE\",\"version\":\"2.9.10\",\"proto\":1," \
    "\"max_payload\":1048576,\"headers\":true}\r\n"

struct conn {
    int fd, n;
    int good;
    long long t0;
    char line[4096];
    size_t len;
    long long skip; /* payload bytes (and CRLF) still to skip */
    long pubs;
    long long late_until; /* a late connection: PONGs held until then */
    int pongs_due;        /* PINGs held */
};

static volatile sig_atomic_t stop;
static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void end(struct conn *c)
{
    printf("close %d pubs=%ld\n", c->n, c->pubs);
    close(c->fd);
    c->fd = -1;
}

/* A complete protocol line of a good connection. */
static void on_line(struct conn *c, char *l)
{
    if (!strncmp(l, "PING", 4) && c->late_until > now_ms()) {
        c->pongs_due++;
    } else if (!strncmp(l, "PING", 4)) {
        if (write(c->fd, "PONG\r\n", 6) < 0) {
            /* the peer went away: the next read says so */
        }
    } else if (!strncmp(l, "PUB ", 4) || !strncmp(l, "HPUB ", 5)) {
        char *last = strrchr(l, ' '); /* total size is the last field */
        c->skip = (last ? atoll(last + 1) : 0) + 2;
        c->pubs++;
    }
}

static void feed(struct conn *c, const char *p, size_t n)
{
    while (n) {
        if (c->skip) {
            size_t k = (size_t)c->skip < n ? (size_t)c->skip : n;
            c->skip -= (long long)k;
            p += k;
            n -= k;
            continue;
        }
        const char *nl = memchr(p, '\n', n);
        size_t k = nl ? (size_t)(nl - p) + 1 : n;
        if (c->len + k < sizeof(c->line)) {
            memcpy(c->line + c->len, p, k);
            c->len += k;
        } else {
            c->len = 0; /* overlong: drop */
        }
        p += k;
        n -= k;
        if (nl && c->len) {
            c->line[c->len] = '\0';
            c->len = 0;
            on_line(c, c->line);
        }
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: fake_nats PORT GOOD [HANGUP_MS [ADVERTISE]]\n");
        return 2;
    }
    int port = atoi(argv[1]), good = atoi(argv[2]);
    long long hangup = argc > 3 ? atoll(argv[3]) : 0;
    const char *late_env = getenv("FAKE_NATS_LATE_PONG_MS");
    long long late = late_env ? atoll(late_env) : 0;
    char info[512];
    if (argc > 4)
        snprintf(info, sizeof(info), "%.*s,\"connect_urls\":[\"%s\"]}\r\n", (int)(strlen(INFO) - 3),
                 INFO, argv[4]);
    else
        snprintf(info, sizeof(info), "%s", INFO);
    struct conn cs[MAX_CONNS];
    int accepted = 0, one = 1;

    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);
    for (int i = 0; i < MAX_CONNS; i++)
        cs[i].fd = -1;

    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(ls, 16) < 0) {
        perror("fake_nats: listen");
        return 1;
    }
    printf("listening %d\n", port);

    while (!stop) {
        struct pollfd pf[1 + MAX_CONNS];
        int idx[1 + MAX_CONNS], n = 1;
        pf[0] = (struct pollfd){ls, POLLIN, 0};
        for (int i = 0; i < MAX_CONNS; i++)
            if (cs[i].fd >= 0) {
                pf[n] = (struct pollfd){cs[i].fd, POLLIN, 0};
                idx[n++] = i;
            }
        if (poll(pf, (nfds_t)n, 100) < 0 && errno != EINTR)
            break;
        long long now = now_ms();
        for (int j = 1; j < n; j++) {
            struct conn *c = &cs[idx[j]];
            if (pf[j].revents) {
                char buf[65536];
                ssize_t r = read(c->fd, buf, sizeof(buf));
                if (r <= 0) {
                    end(c);
                    continue;
                }
                if (c->good)
                    feed(c, buf, (size_t)r);
            }
            for (; c->fd >= 0 && c->pongs_due && now >= c->late_until; c->pongs_due--)
                if (write(c->fd, "PONG\r\n", 6) < 0)
                    break; /* the peer went away: the next read says so */
            if (c->fd >= 0 && c->good && !c->late_until && hangup > 0 && now - c->t0 >= hangup)
                end(c);
        }
        if (pf[0].revents & POLLIN) {
            int fd = accept(ls, NULL, NULL);
            if (fd < 0)
                continue;
            int i = 0;
            while (i < MAX_CONNS && cs[i].fd >= 0)
                i++;
            if (i == MAX_CONNS) {
                close(fd);
                continue;
            }
            accepted++;
            cs[i] = (struct conn){.fd = fd, .n = accepted, .good = accepted <= good, .t0 = now};
            if (!cs[i].good && late > 0) {
                cs[i].good = 1; /* served, but its PONGs come late */
                cs[i].late_until = now + late;
            }
            printf("conn %d %s\n", accepted,
                   cs[i].late_until ? "late"
                   : cs[i].good     ? "good"
                                    : "mute");
            if (write(fd, info, strlen(info)) < 0)
                end(&cs[i]);
        }
    }
    for (int i = 0; i < MAX_CONNS; i++)
        if (cs[i].fd >= 0)
            end(&cs[i]);
    return 0;
}
