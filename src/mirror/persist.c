/* mirror_state: the residency mirror saved and loaded.  See
 * src/mirror/persist.h. */
#include "persist.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "clock.h"

#define MAGIC "KVBMIRR1"
#define VERSION 2u /* 1: no rings, no missing marks (still read) */
#define WRITE_BUF (64u << 10)
#define CHAIN_BLOCKS 4096u
#define END_MARK 0xffu   /* in place of a tier: the pair's chains end */
#define CHAIN_MISSING 1u /* a chain's flags: consumers lack its blocks (a repair owes them) */
#define EV_SCOPED 1u     /* a ring event's flags: a "cleared" of its tier only (0 in older files) */

struct pair_save {
    uint64_t worker, last, epoch;
    uint32_t rank;
    bool has_last;
    struct kvb_index_snap *snap;
    struct kvb_index_ring *ring;
};

struct job {
    char *dir;
    struct kvb_state *st;
    struct pair_save *pairs;
    size_t n;
    bool mirror; /* write the mirror file (else only the cursors) */
};

struct kvb_persist {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    pthread_t th;
    bool running;        /* a thread exists (joined by the next start or destroy) */
    bool busy;           /* mu: it has not finished */
    bool has_result;     /* mu */
    int result;          /* mu */
    uint64_t next_ok_ms; /* mu: pacing */
};

static void job_free(struct job *j)
{
    if (!j)
        return;
    for (size_t i = 0; i < j->n; i++) {
        kvb_index_snap_free(&j->pairs[i].snap);
        kvb_index_ring_free(&j->pairs[i].ring);
    }
    free(j->pairs);
    kvb_state_free(&j->st);
    free(j->dir);
    free(j);
}

/* ---- writing ------------------------------------------------------------- */

struct out {
    FILE *f;
    XXH64_state_t *h;
    bool err;
};

static void put(struct out *o, const void *p, size_t n)
{
    if (o->err)
        return;
    XXH64_update(o->h, p, n);
    if (fwrite(p, 1, n, o->f) != n)
        o->err = true;
}

static void put_u64(struct out *o, uint64_t v) { put(o, &v, 8); }
static void put_u32(struct out *o, uint32_t v) { put(o, &v, 4); }

/* The words of a ring event: (block, tokens) pairs, removed hashes, none. */
static size_t event_words(const struct kvb_rev *rev)
{
    return rev->type == KVB_REVT_STORED    ? 2 * (size_t)rev->n
           : rev->type == KVB_REVT_REMOVED ? rev->n
                                           : 0;
}

/* One pair: its header, its chains (dump order), an end mark, its ring. */
static int put_pair(struct out *o, struct pair_save *p)
{
    put_u64(o, p->worker);
    put_u32(o, p->rank);
    put_u32(o, p->has_last);
    put_u64(o, p->last);
    put_u64(o, p->epoch);
    struct kvb_rev rev;
    int rc;
    while ((rc = kvb_index_snap_next(p->snap, CHAIN_BLOCKS, &rev)) == 1) {
        uint8_t hdr[8] = {rev.tier,
                          rev.has_parent,
                          kvb_index_snap_missing(p->snap) ? CHAIN_MISSING : 0,
                          0,
                          0,
                          0,
                          0,
                          0};
        memcpy(hdr + 4, &rev.n, 4);
        put(o, hdr, 8);
        put_u64(o, rev.has_parent ? rev.parent : 0);
        put(o, rev.blocks, (size_t)rev.n * sizeof(*rev.blocks));
    }
    static const uint8_t end_mark[8] = {END_MARK, 0, 0, 0, 0, 0, 0, 0};
    put(o, end_mark, 8);
    kvb_index_snap_free(&p->snap); /* its memory goes as soon as it is written */
    put_u32(o, kvb_index_ring_count(p->ring));
    put_u32(o, 0);
    while (rc == 0 && kvb_index_ring_next(p->ring, &rev) == 1) {
        put_u64(o, rev.event_id);
        put_u64(o, rev.epoch);
        uint8_t hdr[8] = {rev.type, rev.tier, rev.has_parent, rev.scoped ? EV_SCOPED : 0, 0, 0,
                          0,        0};
        memcpy(hdr + 4, &rev.n, 4);
        put(o, hdr, 8);
        put_u64(o, rev.has_parent ? rev.parent : 0);
        put(o, rev.type == KVB_REVT_STORED ? (const void *)rev.blocks : (const void *)rev.hashes,
            event_words(&rev) * 8);
    }
    kvb_index_ring_free(&p->ring);
    return rc;
}

static void fsync_dir(const char *dir)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
}

static int write_file(struct job *j)
{
    char tmp[PATH_MAX], final[PATH_MAX];
    snprintf(tmp, sizeof(tmp), "%s/%s.tmp", j->dir, KVB_MIRROR_FILE);
    snprintf(final, sizeof(final), "%s/%s", j->dir, KVB_MIRROR_FILE);
    struct out o = {.f = fopen(tmp, "w"), .h = XXH64_createState()};
    int rc = 0;
    if (!o.f || !o.h) {
        rc = o.f ? -ENOMEM : -errno;
        goto out;
    }
    setvbuf(o.f, NULL, _IOFBF, WRITE_BUF);
    XXH64_reset(o.h, 0);
    put(&o, MAGIC, 8);
    put_u32(&o, VERSION);
    put_u32(&o, (uint32_t)j->n);
    for (size_t i = 0; i < j->n && rc == 0; i++)
        rc = put_pair(&o, &j->pairs[i]);
    uint64_t h = XXH64_digest(o.h);
    if (rc == 0 && !o.err && fwrite(&h, 8, 1, o.f) != 1)
        o.err = true;
    if (rc == 0 && (o.err || fflush(o.f) != 0 || fsync(fileno(o.f)) != 0))
        rc = errno ? -errno : -EIO;
out:
    if (o.f && fclose(o.f) != 0 && rc == 0)
        rc = -errno;
    if (o.h)
        XXH64_freeState(o.h);
    if (rc == 0 && rename(tmp, final) != 0)
        rc = -errno;
    if (rc == 0)
        fsync_dir(j->dir);
    else
        unlink(tmp);
    return rc;
}

static void *saver_main(void *arg)
{
    void **a = arg;
    struct kvb_persist *s = a[0];
    struct job *j = a[1];
    free(a);
    uint64_t t0 = kvb_mono_ms();
    int rc = j->mirror ? write_file(j) : 0;
    if (rc == 0)
        rc = kvb_state_save(j->dir, j->st); /* the cursors that go with it, after it */
    uint64_t took = kvb_mono_ms() - t0;
    job_free(j);
    pthread_mutex_lock(&s->mu);
    s->busy = false;
    s->has_result = true;
    s->result = rc;
    s->next_ok_ms = kvb_mono_ms() + 3 * took; /* writing at most 1/4 of the time */
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int kvb_persist_create(struct kvb_persist **out)
{
    struct kvb_persist *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cond, NULL);
    *out = s;
    return 0;
}

static void wait_idle(struct kvb_persist *s)
{
    pthread_mutex_lock(&s->mu);
    while (s->busy)
        pthread_cond_wait(&s->cond, &s->mu);
    pthread_mutex_unlock(&s->mu);
    if (s->running) {
        pthread_join(s->th, NULL);
        s->running = false;
    }
}

void kvb_persist_destroy(struct kvb_persist **ps)
{
    struct kvb_persist *s = ps ? *ps : NULL;
    if (!s)
        return;
    wait_idle(s);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->mu);
    free(s);
    *ps = NULL;
}

static const struct kvb_id_counter *counter_of(const struct kvb_state *st, uint64_t worker,
                                               uint32_t rank)
{
    for (size_t i = 0; i < st->n_counters; i++)
        if (st->counters[i].worker_id == worker && st->counters[i].dp_rank == rank)
            return &st->counters[i];
    return NULL;
}

int kvb_persist_save_start(struct kvb_persist *s, const struct kvb_index *m, const char *dir,
                           struct kvb_state **st, bool wait)
{
    if (wait) {
        wait_idle(s);
    } else {
        pthread_mutex_lock(&s->mu);
        bool refuse = s->busy || kvb_mono_ms() < s->next_ok_ms;
        pthread_mutex_unlock(&s->mu);
        if (refuse)
            return -EBUSY;
        if (s->running) {
            pthread_join(s->th, NULL); /* finished: busy is false */
            s->running = false;
        }
    }
    size_t np = m ? kvb_index_pairs(m, NULL, 0) : 0;
    struct kvb_index_pair *pairs = calloc(np ? np : 1, sizeof(*pairs));
    struct job *j = calloc(1, sizeof(*j));
    void **arg = malloc(2 * sizeof(void *));
    int rc = -ENOMEM;
    if (!pairs || !j || !arg || !(j->dir = strdup(dir)) ||
        !(j->pairs = calloc(np ? np : 1, sizeof(*j->pairs))))
        goto fail;
    j->mirror = m != NULL;
    if (m)
        kvb_index_pairs(m, pairs, np);
    for (size_t i = 0; i < np; i++) {
        const struct kvb_id_counter *c = counter_of(*st, pairs[i].worker_id, pairs[i].dp_rank);
        if (!c)
            continue; /* not a pair this daemon's counters know (an old worker_id) */
        struct pair_save *p = &j->pairs[j->n];
        p->worker = pairs[i].worker_id;
        p->rank = pairs[i].dp_rank;
        p->epoch = c->epoch;
        p->has_last = kvb_index_last_event_id(m, p->worker, p->rank, &p->last);
        if (kvb_index_snapshot(m, p->worker, p->rank, &p->snap) < 0 ||
            kvb_index_ring_copy(m, p->worker, p->rank, &p->ring) < 0)
            goto fail;
        j->n++;
    }
    j->st = *st;
    *st = NULL;
    arg[0] = s;
    arg[1] = j;
    pthread_mutex_lock(&s->mu);
    s->busy = true;
    pthread_mutex_unlock(&s->mu);
    if ((rc = pthread_create(&s->th, NULL, saver_main, arg)) != 0) {
        *st = j->st; /* given back */
        j->st = NULL;
        pthread_mutex_lock(&s->mu);
        s->busy = false;
        pthread_mutex_unlock(&s->mu);
        rc = -rc;
        goto fail;
    }
    s->running = true;
    free(pairs);
    if (!wait)
        return 0;
    wait_idle(s);
    pthread_mutex_lock(&s->mu);
    s->has_result = false;
    rc = s->result;
    pthread_mutex_unlock(&s->mu);
    return rc;
fail:
    free(pairs);
    free(arg);
    job_free(j);
    return rc;
}

bool kvb_persist_save_busy(struct kvb_persist *s)
{
    pthread_mutex_lock(&s->mu);
    bool busy = s->busy || kvb_mono_ms() < s->next_ok_ms;
    pthread_mutex_unlock(&s->mu);
    return busy;
}

int kvb_persist_save_result(struct kvb_persist *s, bool *done)
{
    pthread_mutex_lock(&s->mu);
    *done = s->has_result;
    int rc = s->result;
    s->has_result = false;
    pthread_mutex_unlock(&s->mu);
    return *done ? rc : 0;
}

/* ---- loading ----------------------------------------------------------- */

struct in {
    const uint8_t *p, *e;
    bool bad;
};

static const void *take(struct in *in, size_t n)
{
    if ((size_t)(in->e - in->p) < n) {
        in->bad = true;
        return NULL;
    }
    const void *r = in->p;
    in->p += n;
    return r;
}

static uint64_t get_u64(struct in *in)
{
    uint64_t v = 0;
    const void *p = take(in, 8);
    if (p)
        memcpy(&v, p, 8);
    return v;
}

static uint32_t get_u32(struct in *in)
{
    uint32_t v = 0;
    const void *p = take(in, 4);
    if (p)
        memcpy(&v, p, 4);
    return v;
}

static int read_all(const char *path, uint8_t **out, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat sb;
    if (fstat(fd, &sb) < 0 || sb.st_size < 24) {
        close(fd);
        return -EINVAL;
    }
    uint8_t *buf = malloc((size_t)sb.st_size);
    size_t got = 0;
    while (buf && got < (size_t)sb.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)sb.st_size - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    if (!buf || got != (size_t)sb.st_size) {
        free(buf);
        return buf ? -EIO : -ENOMEM;
    }
    *out = buf;
    *len = got;
    return 0;
}

static bool consistent(const struct kvb_state *cur, uint64_t worker, uint32_t rank, bool has_last,
                       uint64_t last, uint64_t epoch)
{
    const struct kvb_id_counter *c = counter_of(cur, worker, rank);
    return c && has_last && c->epoch == epoch && c->next_id == last + 1;
}

/* Room for n u64 words in *buf (its size *cap, in words). */
static int words_reserve(uint64_t **buf, size_t *cap, size_t n)
{
    if (n <= *cap)
        return 0;
    uint64_t *nb = realloc(*buf, n * sizeof(*nb));
    if (!nb)
        return -ENOMEM;
    *buf = nb;
    *cap = n;
    return 0;
}

/* A pair's saved ring (version 2), back into its ring when ok: the events
 * must end at the pair's last (else the ring stays empty).  Sizes were
 * checked against the bytes left before anything is copied. */
static int load_ring(struct kvb_index *m, struct in *in, uint64_t worker, uint32_t rank,
                     uint64_t last, bool ok, uint64_t **words, size_t *cap)
{
    uint32_t n = get_u32(in);
    get_u32(in);
    bool restored = false;
    uint64_t id = 0;
    int rc = 0;
    for (uint32_t i = 0; i < n && !in->bad && rc == 0; i++) {
        struct kvb_rev rev = {.worker_id = worker, .dp_rank = rank};
        rev.event_id = get_u64(in);
        rev.epoch = get_u64(in);
        const uint8_t *h = take(in, 8);
        rev.parent = get_u64(in);
        if (!h || h[0] >= KVB_REVT__COUNT || h[1] >= KVB_TIER__COUNT || h[2] > 1 ||
            (h[3] & ~EV_SCOPED) || (h[3] && h[0] != KVB_REVT_CLEARED)) {
            in->bad = true;
            break;
        }
        rev.type = h[0];
        rev.tier = h[1];
        rev.has_parent = h[2];
        rev.scoped = h[3] & EV_SCOPED;
        memcpy(&rev.n, h + 4, 4);
        size_t nw = event_words(&rev);
        const void *w = take(in, nw * 8);
        if (!w || !ok)
            continue;
        if ((rc = words_reserve(words, cap, nw ? nw : 1)) < 0)
            break;
        memcpy(*words, w, nw * 8);
        rev.blocks = rev.type == KVB_REVT_STORED ? (const struct kvb_block *)*words : NULL;
        rev.hashes = rev.type == KVB_REVT_REMOVED ? *words : NULL;
        rc = kvb_index_record(m, &rev);
        restored = true;
        id = rev.event_id;
    }
    if (rc == 0 && restored && id != last) /* not the ring of this state */
        rc = kvb_index_set_last(m, worker, rank, last);
    return rc;
}

/* Parse and apply the pairs consistent with cur; the others are skipped.
 * -EINVAL for a malformed file (m may then hold part of it: the caller
 * starts from an empty mirror). */
static int load_file(struct kvb_index *m, const uint8_t *buf, size_t len,
                     const struct kvb_state *cur, bool *loaded, size_t n_counters)
{
    if (len < 24 || memcmp(buf, MAGIC, 8) != 0)
        return -EINVAL;
    uint64_t want;
    memcpy(&want, buf + len - 8, 8);
    if (XXH64(buf, len - 8, 0) != want)
        return -EINVAL;
    struct in in = {buf + 8, buf + len - 8, false};
    uint32_t version = get_u32(&in);
    if (version != 1 && version != VERSION)
        return -EINVAL;
    uint32_t np = get_u32(&in);
    uint64_t *words = NULL;
    size_t cap = 0;
    int rc = 0;
    for (uint32_t i = 0; i < np && !in.bad && rc == 0; i++) {
        uint64_t worker = get_u64(&in);
        uint32_t rank = get_u32(&in);
        bool has_last = get_u32(&in) != 0;
        uint64_t last = get_u64(&in), epoch = get_u64(&in);
        bool ok = consistent(cur, worker, rank, has_last, last, epoch);
        while (!in.bad && rc == 0) {
            const uint8_t *h = take(&in, 8);
            if (!h || h[0] == END_MARK)
                break;
            uint64_t parent = get_u64(&in);
            uint32_t n;
            memcpy(&n, h + 4, 4);
            const void *b = take(&in, (size_t)n * sizeof(struct kvb_block));
            if (!b || h[0] >= KVB_TIER__COUNT || h[1] > 1 || h[2] > CHAIN_MISSING)
                in.bad = true;
            if (in.bad || !ok)
                continue;
            if ((rc = words_reserve(&words, &cap, 2 * (size_t)n)) < 0)
                break;
            memcpy(words, b, (size_t)n * sizeof(struct kvb_block));
            struct kvb_rev rev = {.type = KVB_REVT_STORED,
                                  .tier = h[0],
                                  .dp_rank = rank,
                                  .worker_id = worker,
                                  .event_id = last,
                                  .has_parent = h[1],
                                  .parent = parent,
                                  .blocks = (const struct kvb_block *)words,
                                  .n = n};
            rc = kvb_index_apply(m, &rev);
            if (rc == 0)
                rc = kvb_index_mark(m, &rev, h[2] & CHAIN_MISSING);
        }
        if (ok && rc == 0 && !in.bad)
            rc = kvb_index_set_last(m, worker, rank, last);
        if (version >= 2 && rc == 0 && !in.bad)
            rc = load_ring(m, &in, worker, rank, last, ok, &words, &cap);
        if (ok && rc == 0 && !in.bad)
            for (size_t c = 0; c < n_counters; c++)
                if (cur->counters[c].worker_id == worker && cur->counters[c].dp_rank == rank)
                    loaded[c] = true;
    }
    free(words);
    if (rc == 0 && (in.bad || in.p != in.e))
        rc = -EINVAL;
    return rc;
}

int kvb_persist_load(struct kvb_index *m, const char *dir, const struct kvb_state *cur,
                     struct kvb_index_pair *out, size_t cap, size_t *n_loaded)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", dir, KVB_MIRROR_FILE);
    bool *loaded = calloc(cur->n_counters ? cur->n_counters : 1, sizeof(*loaded));
    if (!loaded)
        return -ENOMEM;
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = read_all(path, &buf, &len);
    if (rc == 0)
        rc = load_file(m, buf, len, cur, loaded, cur->n_counters);
    free(buf);
    if (rc == -ENOMEM) {
        free(loaded);
        return rc;
    }
    *n_loaded = 0;
    size_t n = 0;
    for (size_t i = 0; i < cur->n_counters; i++) {
        if (rc == 0 && loaded[i]) {
            (*n_loaded)++;
            continue;
        }
        if (n < cap)
            out[n] = (struct kvb_index_pair){cur->counters[i].worker_id, cur->counters[i].dp_rank};
        n++;
    }
    free(loaded);
    return (int)n;
}
