/* sink I/O: nats.c in "external event loop" mode, and the sink's I/O thread
 * (what nats.c's adapters/libevent.h does for libevent).  See sink_priv.h for
 * the parts of the sink and their locks; this file owns evl_mu.
 *
 * nats.c facts (checked against nats.c 3.4): its own I/O threads (a reader,
 * and a flusher that sends the write buffer about 1 ms after the first
 * publish that needs it) are replaced by an "external event loop"
 * (natsOptions_SetEventLoop): nats.c then makes the
 * socket non-blocking after the handshake, asks through callbacks for
 * read and write readiness (attach/read/write/detach, from whatever thread
 * it is on, holding its connection lock), and reads or writes only when
 * natsConnection_ProcessReadEvent/ProcessWriteEvent is called.  With
 * SendAsap, every publish asks for write readiness (the write callback,
 * once until the buffer is sent); without it nothing would send a small
 * publish.  During a reconnect nats.c stops polling (read and write
 * "remove"), uses blocking I/O on the new socket for the handshake, then
 * attaches it.  Its locks are recursive.
 *
 * nats.c's own design sends a publish up to 1 ms later (its flusher thread
 * waits that long to gather more), and every publish wakes that thread: two
 * thread wake-ups and a millisecond per quiet batch.  Instead:
 * - Publishes by the owner thread (the loop) after kvb_sink_defer_writes():
 *   the write callback only notes that a write is due; the loop calls
 *   kvb_sink_service() before it waits for input, which writes what every
 *   publish of that turn left in the buffer with one send(): no thread
 *   switch, no delay, one syscall per turn at any rate.
 * - Everything else (nats.c's own PINGs, the JetStream worker's resends, the
 *   reconnect thread's buffered publishes, the owner while it waits in a
 *   flush, or a send the socket could not take whole) goes to the I/O
 *   thread, which polls the sockets for the writes handed to it and always
 *   for reads (PONGs, INFO, JetStream acks, errors).
 * One struct evl per connection, made at its first attach.  The I/O thread
 * calls into a connection only while it is neither forgotten
 * (kvb_sink_io_forget(), which waits for a call in progress and runs before
 * natsConnection_Destroy) nor detached; evls are freed by the I/O thread (or
 * kvb_sink_io_stop()) once both forgotten and detached, so a pointer it holds
 * stays valid for its iteration.
 */
#include "sink_priv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>

struct evl {
    struct kvb_sink *s;
    natsConnection *nc;
    int fd;          /* -1: not polled (detached, or gone away under us) */
    bool want_read;  /* nats.c's read add/remove */
    bool want_write; /* nats.c's write add, until its remove */
    bool io_write;   /* the I/O thread polls POLLOUT for it */
    bool detached, forgotten;
    unsigned touched; /* counts callbacks, to tell progress from a stuck socket */
    unsigned gen;     /* counts attaches and detaches: which socket fd is (a
                       * closed fd's number comes back for the next socket) */
    ino_t ino;        /* the attached socket's inode (for the guard), 0: none */
    struct evl *next;
};

static void io_kick(struct kvb_sink *s)
{
    uint64_t one = 1;
    if (write(s->io_wake, &one, sizeof(one)) < 0) {
        /* full counter: the thread is awake anyway */
    }
}

static natsStatus evl_attach(void **ud, void *loop, natsConnection *nc, natsSock fd)
{
    struct kvb_sink *s = loop;
    struct evl *e = *ud;
    struct stat st;
    pthread_mutex_lock(&s->evl_mu);
    if (!e) {
        if (!(e = calloc(1, sizeof(*e)))) {
            pthread_mutex_unlock(&s->evl_mu);
            return NATS_NO_MEMORY;
        }
        e->s = s;
        e->nc = nc;
        e->next = s->evls;
        s->evls = e;
    }
    e->fd = (int)fd;
    e->ino = fstat((int)fd, &st) == 0 ? st.st_ino : 0;
    e->want_read = true;
    e->want_write = e->io_write = false;
    e->detached = false;
    e->touched++;
    e->gen++;
    pthread_mutex_unlock(&s->evl_mu);
    *ud = e;
    io_kick(s);
    return NATS_OK;
}

static natsStatus evl_read(void *ud, bool add)
{
    struct evl *e = ud;
    pthread_mutex_lock(&e->s->evl_mu);
    bool changed = e->want_read != add;
    e->want_read = add;
    e->touched++;
    pthread_mutex_unlock(&e->s->evl_mu);
    if (changed)
        io_kick(e->s);
    return NATS_OK;
}

static natsStatus evl_write(void *ud, bool add)
{
    struct evl *e = ud;
    struct kvb_sink *s = e->s;
    bool owner = add && atomic_load(&s->defer) && pthread_equal(pthread_self(), s->owner) &&
                 s->in_publish; /* in_publish: read by the owner only */
    bool kick = false;
    pthread_mutex_lock(&s->evl_mu);
    e->want_write = add;
    e->touched++;
    if (!add) {
        e->io_write = false;
    } else if (!owner && !e->io_write) {
        e->io_write = kick = true;
    }
    pthread_mutex_unlock(&s->evl_mu);
    if (owner)
        atomic_store(&s->owner_write, true);
    if (kick)
        io_kick(s);
    return NATS_OK;
}

static natsStatus evl_detach(void *ud)
{
    struct evl *e = ud;
    pthread_mutex_lock(&e->s->evl_mu);
    e->detached = true;
    e->fd = -1;
    e->ino = 0;
    e->want_read = e->want_write = e->io_write = false;
    e->touched++;
    e->gen++;
    pthread_mutex_unlock(&e->s->evl_mu);
    io_kick(e->s);
    return NATS_OK;
}

/* sink_priv.h */
void kvb_sink_io_forget(struct kvb_sink *s, const natsConnection *nc)
{
    if (!nc)
        return;
    pthread_mutex_lock(&s->evl_mu);
    for (struct evl *e = s->evls; e; e = e->next) {
        if (e->nc != nc || e->forgotten)
            continue;
        e->forgotten = true;
        while (s->io_busy == e)
            pthread_cond_wait(&s->evl_cond, &s->evl_mu);
    }
    pthread_mutex_unlock(&s->evl_mu);
    io_kick(s); /* drops it from the poll set (and frees it once detached) */
}

/* evl_mu held: free what neither nats.c nor the sink will touch again. */
static void evl_reap(struct kvb_sink *s, bool all)
{
    for (struct evl **pe = &s->evls; *pe;) {
        struct evl *e = *pe;
        if (all || (e->forgotten && e->detached)) {
            *pe = e->next;
            free(e);
        } else {
            pe = &e->next;
        }
    }
}

#define IO_MAX_CONNS 8 /* connections polled at once (1, 2 while replacing) */

/* One pass of the I/O thread: the wake eventfd (fds[0]) and the sockets it
 * polls, with what their evl said when they were picked. */
struct io_set {
    struct pollfd fds[1 + IO_MAX_CONNS];
    struct evl *es[IO_MAX_CONNS];
    unsigned touched[IO_MAX_CONNS], gen[IO_MAX_CONNS];
    size_t n;
};

/* The sockets to poll now (reaping the evls done with).  False: stop. */
static bool io_collect(struct kvb_sink *s, struct io_set *set)
{
    set->n = 0;
    pthread_mutex_lock(&s->evl_mu);
    if (s->io_stop) {
        pthread_mutex_unlock(&s->evl_mu);
        return false;
    }
    evl_reap(s, false);
    for (struct evl *e = s->evls; e && set->n < IO_MAX_CONNS; e = e->next) {
        if (e->forgotten || e->fd < 0 || !(e->want_read || e->io_write))
            continue;
        size_t n = set->n++;
        set->fds[1 + n] = (struct pollfd){
            e->fd, (short)((e->want_read ? POLLIN : 0) | (e->io_write ? POLLOUT : 0)), 0};
        set->touched[n] = e->touched;
        set->gen[n] = e->gen;
        set->es[n] = e;
    }
    pthread_mutex_unlock(&s->evl_mu);
    set->fds[0] = (struct pollfd){s->io_wake, POLLIN, 0};
    return true;
}

/* Socket I of SET reported REV: when its evl still polls that socket, the
 * connection to call into (marked io_busy) and whether to read (*rd) and
 * write (*wr); NULL when there is nothing to do. */
static natsConnection *io_claim(struct kvb_sink *s, const struct io_set *set, size_t i, short rev,
                                bool *rd, bool *wr)
{
    struct evl *e = set->es[i];
    natsConnection *nc = NULL;
    *rd = *wr = false;
    pthread_mutex_lock(&s->evl_mu);
    bool same_socket = !e->forgotten && e->gen == set->gen[i]; /* still the one polled */
    if (same_socket && (rev & POLLNVAL)) {
        e->fd = -1; /* closed under us: wait for the next attach */
    } else if (same_socket) {
        *rd = e->want_read && (rev & (POLLIN | POLLHUP | POLLERR));
        *wr = e->io_write && (rev & (POLLOUT | POLLHUP | POLLERR));
        if (*rd || *wr) {
            s->io_busy = e;
            nc = e->nc;
        }
    }
    pthread_mutex_unlock(&s->evl_mu);
    return nc;
}

/* Serve socket I of SET, ready with REV. */
static void io_serve(struct kvb_sink *s, const struct io_set *set, size_t i, short rev)
{
    bool rd, wr;
    struct evl *e = set->es[i];
    natsConnection *nc = io_claim(s, set, i, rev, &rd, &wr);
    if (!nc)
        return;
    if (wr)
        natsConnection_ProcessWriteEvent(nc);
    /* After a hang-up, read (what is left, then the end) until nats.c
     * reacts; a hang-up that changes nothing (nats.c is reconnecting and
     * ignores the old socket) stops the polling of that socket until the
     * next attach, instead of spinning. */
    bool hup = rev & (POLLHUP | POLLERR), same = rd;
    for (int k = 0; same && k < (hup ? 64 : 1); k++) {
        natsConnection_ProcessReadEvent(nc);
        pthread_mutex_lock(&s->evl_mu);
        same = e->touched == set->touched[i];
        pthread_mutex_unlock(&s->evl_mu);
    }
    pthread_mutex_lock(&s->evl_mu);
    if (hup && e->touched == set->touched[i])
        e->fd = -1;
    s->io_busy = NULL;
    pthread_cond_broadcast(&s->evl_cond);
    pthread_mutex_unlock(&s->evl_mu);
}

static void *io_main(void *arg)
{
    struct kvb_sink *s = arg;
    struct io_set set;

    while (io_collect(s, &set)) {
        if (poll(set.fds, 1 + set.n, -1) < 0)
            continue; /* EINTR */
        if (set.fds[0].revents & POLLIN) {
            uint64_t v;
            if (read(s->io_wake, &v, sizeof(v)) < 0) {
                /* nothing to drain */
            }
        }
        for (size_t i = 0; i < set.n; i++)
            if (set.fds[1 + i].revents)
                io_serve(s, &set, i, set.fds[1 + i].revents);
    }
    nats_ReleaseThreadMemory();
    return NULL;
}

static int start_io_thread(struct kvb_sink *s)
{
    int rc = kvb_sink_thread_start(&s->io_thread, io_main, s);
    if (rc == 0)
        s->io_started = true;
    return rc;
}

static void stop_io_thread(struct kvb_sink *s)
{
    if (!s->io_started)
        return;
    pthread_mutex_lock(&s->evl_mu);
    s->io_stop = true;
    pthread_mutex_unlock(&s->evl_mu);
    io_kick(s);
    pthread_join(s->io_thread, NULL);
    s->io_started = false;
}

int kvb_sink_io_start(struct kvb_sink *s)
{
    int rc = 0;
    s->io_wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->io_wake < 0 || (rc = start_io_thread(s)) < 0) {
        rc = s->io_wake < 0 ? -errno : rc;
        kvb_err(STAGE, "cannot start the NATS I/O thread: %s", strerror(-rc));
    }
    return rc;
}

void kvb_sink_io_stop(struct kvb_sink *s)
{
    stop_io_thread(s);
    evl_reap(s, true);
    if (s->io_wake >= 0)
        close(s->io_wake);
    s->io_wake = -1;
}

size_t kvb_sink_io_attached(struct kvb_sink *s, ino_t *out, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&s->evl_mu);
    for (struct evl *e = s->evls; e && n < max; e = e->next)
        if (!e->detached && e->ino)
            out[n++] = e->ino;
    pthread_mutex_unlock(&s->evl_mu);
    return n;
}

natsStatus kvb_sink_io_options(struct kvb_sink *s, natsOptions *o)
{
    natsStatus st = natsOptions_SetSendAsap(o, true); /* every publish asks for a write */
    if (st == NATS_OK)
        st = natsOptions_SetEventLoop(o, s, evl_attach, evl_read, evl_write, evl_detach);
    return st;
}

/* The owner's deferred write: send what the turn's publishes left in the
 * buffer; what the socket does not take now goes to the I/O thread. */
void kvb_sink_service(struct kvb_sink *s)
{
    if (!s || !atomic_exchange(&s->owner_write, false))
        return;
    pthread_mutex_lock(&s->conn_mu);
    natsConnection *nc = s->conn;
    if (nc)
        natsConnection_ProcessWriteEvent(nc);
    pthread_mutex_unlock(&s->conn_mu);
    bool kick = false;
    pthread_mutex_lock(&s->evl_mu);
    for (struct evl *e = s->evls; e; e = e->next)
        if (e->want_write && !e->io_write && !e->forgotten && !e->detached)
            e->io_write = kick = true; /* partly sent, or not ours: the I/O thread */
    pthread_mutex_unlock(&s->evl_mu);
    if (kick)
        io_kick(s);
}

void kvb_sink_defer_writes(struct kvb_sink *s)
{
    if (s) {
        s->owner = pthread_self();
        atomic_store(&s->defer, true); /* publishes owner */
    }
}
