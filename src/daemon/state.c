/* state: see include/state.h.
 *
 * Format (text, one record per line, fields separated by one space; topic
 * hex-encoded so that any bytes survive):
 *   kvbridge-state 2
 *   counter WORKER_ID DP_RANK NEXT_ID EPOCH
 *   stream SOURCE TOPIC_HEX|- LAST_SEQ RANK[,RANK...]|-
 *   kind WORKER_ID DP_RANK GROUP KIND
 *   copy WORKER_ID DP_RANK TIER HASH_HEX GROUPS_HEX
 *   ns WORKER_ID DP_RANK HASH_HEX STATE TERM_HEX [TIERS_HEX]
 *   end
 * (kind, copy, ns: the block tracker, struct kvb_track_rec; an ns line
 * without TIERS_HEX, as written before the tiers were noted, has none.)  Version 1,
 * the same without tracker lines, is still read (an empty tracker).  A file
 * without the final "end" line is corrupt (and ignored).
 */
#include "state.h"
#include "grow.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STATE_FILE "kvbridge.state"
#define MAX_LINE 2048

struct kvb_state *kvb_state_new(void) { return calloc(1, sizeof(struct kvb_state)); }

void kvb_state_free(struct kvb_state **ps)
{
    if (!ps || !*ps)
        return;
    free((*ps)->counters);
    free((*ps)->streams);
    free((*ps)->track);
    free(*ps);
    *ps = NULL;
}

int kvb_state_add_counter(struct kvb_state *s, const struct kvb_id_counter *c)
{
    if (kvb_grow((void **)&s->counters, &s->cap_counters, s->n_counters + 1, sizeof(*c)) < 0)
        return -ENOMEM;
    s->counters[s->n_counters++] = *c;
    return 0;
}

int kvb_state_add_track(struct kvb_state *s, const struct kvb_track_rec *r)
{
    if (kvb_grow((void **)&s->track, &s->cap_track, s->n_track + 1, sizeof(*r)) < 0)
        return -ENOMEM;
    s->track[s->n_track++] = *r;
    return 0;
}

int kvb_state_add_entry(struct kvb_state *s, const struct kvb_state_stream *e)
{
    if (kvb_grow((void **)&s->streams, &s->cap_streams, s->n_streams + 1, sizeof(*s->streams)) < 0)
        return -ENOMEM;
    s->streams[s->n_streams++] = *e;
    return 0;
}

int kvb_state_add_stream(struct kvb_state *s, const char *source, const char *topic,
                         const struct kvb_stream *st)
{
    struct kvb_state_stream e;
    if (strlen(source) >= sizeof(e.source) || strlen(topic) >= sizeof(e.topic))
        return -ENAMETOOLONG;
    memset(&e, 0, sizeof(e));
    strcpy(e.source, source);
    strcpy(e.topic, topic);
    e.last = st->last;
    e.n_ranks = st->n_ranks;
    memcpy(e.ranks, st->ranks, st->n_ranks * sizeof(uint32_t));
    return kvb_state_add_entry(s, &e);
}

const struct kvb_state_stream *kvb_state_find_stream(const struct kvb_state *s, const char *source,
                                                     const char *topic)
{
    for (size_t i = 0; s && i < s->n_streams; i++)
        if (strcmp(s->streams[i].source, source) == 0 && strcmp(s->streams[i].topic, topic) == 0)
            return &s->streams[i];
    return NULL;
}

int kvb_state_prepare_dir(const char *dir, const char **what)
{
    char path[PATH_MAX], tmp[PATH_MAX];
    struct stat st;
    size_t n = strlen(dir);
    *what = "cannot create";
    if (n == 0 || n >= sizeof(path) || n + sizeof("/.kvbridge-check.XXXXXX") > sizeof(tmp))
        return -ENAMETOOLONG;
    memcpy(path, dir, n + 1);
    /* every prefix ending before a '/', then the whole path */
    for (size_t i = 1; i <= n; i++) {
        if (i < n && path[i] != '/')
            continue;
        char save = path[i];
        path[i] = '\0';
        if (mkdir(path, 0700) < 0 && errno != EEXIST) {
            return -errno;
        }
        path[i] = save;
    }
    if (stat(dir, &st) < 0)
        return -errno;
    if (!S_ISDIR(st.st_mode)) {
        *what = "cannot use";
        return -ENOTDIR;
    }
    *what = "cannot write to";
    snprintf(tmp, sizeof(tmp), "%s/.kvbridge-check.XXXXXX", dir);
    int fd = mkstemp(tmp);
    if (fd < 0)
        return -errno;
    close(fd);
    if (unlink(tmp) < 0)
        return -errno;
    return 0;
}

static void path_of(char *buf, size_t n, const char *dir, const char *name)
{
    snprintf(buf, n, "%s/%s", dir, name);
}

static void put_track(FILE *f, const struct kvb_track_rec *r)
{
    if (r->what == KVB_TREC_KIND)
        fprintf(f, "kind %" PRIu64 " %" PRIu32 " %" PRId64 " %" PRIu64 "\n", r->worker_id,
                r->dp_rank, r->group, r->val);
    else if (r->what == KVB_TREC_COPY)
        fprintf(f, "copy %" PRIu64 " %" PRIu32 " %u %" PRIx64 " %" PRIx64 "\n", r->worker_id,
                r->dp_rank, (unsigned)r->tier, r->hash, r->val);
    else
        fprintf(f, "ns %" PRIu64 " %" PRIu32 " %" PRIx64 " %u %" PRIx64 " %x\n", r->worker_id,
                r->dp_rank, r->hash, (unsigned)r->state, r->val, (unsigned)r->tier);
}

int kvb_state_save(const char *dir, const struct kvb_state *s)
{
    char tmp[PATH_MAX], final[PATH_MAX];
    path_of(tmp, sizeof(tmp), dir, STATE_FILE ".tmp");
    path_of(final, sizeof(final), dir, STATE_FILE);
    int rc = 0;
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -errno;
    fprintf(f, "kvbridge-state 2\n");
    for (size_t i = 0; i < s->n_counters; i++) {
        const struct kvb_id_counter *c = &s->counters[i];
        fprintf(f, "counter %" PRIu64 " %" PRIu32 " %" PRIu64 " %" PRIu64 "\n", c->worker_id,
                c->dp_rank, c->next_id, c->epoch);
    }
    for (size_t i = 0; i < s->n_streams; i++) {
        const struct kvb_state_stream *e = &s->streams[i];
        fprintf(f, "stream %s ", e->source);
        if (!e->topic[0])
            fputc('-', f);
        for (const unsigned char *t = (const unsigned char *)e->topic; *t; t++)
            fprintf(f, "%02x", *t);
        fprintf(f, " %" PRIu64 " ", e->last);
        if (!e->n_ranks)
            fputc('-', f);
        for (uint32_t r = 0; r < e->n_ranks; r++)
            fprintf(f, "%s%" PRIu32, r ? "," : "", e->ranks[r]);
        fputc('\n', f);
    }
    for (size_t i = 0; i < s->n_track; i++)
        put_track(f, &s->track[i]);
    fprintf(f, "end\n");
    if (fflush(f) != 0 || fsync(fileno(f)) != 0)
        rc = -errno;
    if (fclose(f) != 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, final) != 0)
        rc = -errno;
    if (rc == 0) {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
    } else {
        unlink(tmp);
    }
    return rc;
}

static int hexval(int c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static int parse_stream(char *line, struct kvb_state_stream *e)
{
    char *save = NULL;
    char *src = strtok_r(line, " ", &save), *topic = strtok_r(NULL, " ", &save);
    char *last = strtok_r(NULL, " ", &save), *ranks = strtok_r(NULL, " \n", &save);
    if (!src || !topic || !last || !ranks || strlen(src) >= sizeof(e->source))
        return -EINVAL;
    memset(e, 0, sizeof(*e));
    strcpy(e->source, src);
    if (strcmp(topic, "-") != 0) {
        size_t n = strlen(topic);
        if (n % 2 || n / 2 >= sizeof(e->topic))
            return -EINVAL;
        for (size_t i = 0; i < n / 2; i++) {
            int hi = hexval(topic[2 * i]), lo = hexval(topic[2 * i + 1]);
            if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
                return -EINVAL;
            e->topic[i] = (char)(hi << 4 | lo);
        }
    }
    char *end;
    errno = 0;
    e->last = strtoull(last, &end, 10);
    if (errno || *end)
        return -EINVAL;
    if (strcmp(ranks, "-") != 0) {
        for (char *r = ranks; *r;) {
            unsigned long v = strtoul(r, &end, 10);
            if (end == r || v > UINT32_MAX || e->n_ranks >= KVB_MAX_STREAM_RANKS)
                return -EINVAL;
            e->ranks[e->n_ranks++] = (uint32_t)v;
            r = *end == ',' ? end + 1 : end;
            if (*end && *end != ',')
                return -EINVAL;
        }
    }
    return 0;
}

/* A tracker line (after its first word, `what`): 0 or -EINVAL. */
static int parse_track(const char *line, uint8_t what, struct kvb_track_rec *r)
{
    unsigned a, tiers = 0;
    char extra;
    int n;
    memset(r, 0, sizeof(*r));
    r->what = what;
    if (what == KVB_TREC_KIND)
        n = sscanf(line, "%" SCNu64 " %" SCNu32 " %" SCNd64 " %" SCNu64 " %c", &r->worker_id,
                   &r->dp_rank, &r->group, &r->val, &extra);
    else if (what == KVB_TREC_COPY)
        n = sscanf(line, "%" SCNu64 " %" SCNu32 " %u %" SCNx64 " %" SCNx64 " %c", &r->worker_id,
                   &r->dp_rank, &a, &r->hash, &r->val, &extra);
    else
        n = sscanf(line, "%" SCNu64 " %" SCNu32 " %" SCNx64 " %u %" SCNx64 " %x %c", &r->worker_id,
                   &r->dp_rank, &r->hash, &a, &r->val, &tiers, &extra);
    if (what == KVB_TREC_NS && n == 6)
        n = 5; /* the optional TIERS_HEX */
    if (n != (what == KVB_TREC_KIND ? 4 : 5) || (what != KVB_TREC_KIND && a > 0xff) || tiers > 0xff)
        return -EINVAL;
    if (what == KVB_TREC_COPY)
        r->tier = (uint8_t)a;
    else if (what == KVB_TREC_NS) {
        r->state = (uint8_t)a;
        r->tier = (uint8_t)tiers;
    }
    return 0;
}

/* The tracker's line kinds: their first word, and what they hold. */
static uint8_t track_line(const char *line, const char **rest)
{
    static const struct {
        const char *word;
        uint8_t what;
    } words[] = {{"kind ", KVB_TREC_KIND}, {"copy ", KVB_TREC_COPY}, {"ns ", KVB_TREC_NS}};
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
        if (strncmp(line, words[i].word, strlen(words[i].word)) == 0) {
            *rest = line + strlen(words[i].word);
            return words[i].what;
        }
    return 0;
}

int kvb_state_load(const char *dir, struct kvb_state **out)
{
    char path[PATH_MAX], line[MAX_LINE];
    path_of(path, sizeof(path), dir, STATE_FILE);
    FILE *f = fopen(path, "r");
    if (!f)
        return -errno;
    struct kvb_state *s = kvb_state_new();
    int rc = s ? -EINVAL : -ENOMEM;
    bool header = false, end = false;
    int version = 0;
    const char *rest;
    uint8_t what;
    while (s && fgets(line, sizeof(line), f)) {
        if (!strchr(line, '\n') || end)
            goto out; /* overlong line, or data after "end" */
        if (!header) {
            if (strcmp(line, "kvbridge-state 1\n") == 0)
                version = 1;
            else if (strcmp(line, "kvbridge-state 2\n") == 0)
                version = 2;
            else
                goto out;
            header = true;
        } else if (strncmp(line, "counter ", 8) == 0) {
            struct kvb_id_counter c;
            char extra;
            if (sscanf(line + 8, "%" SCNu64 " %" SCNu32 " %" SCNu64 " %" SCNu64 " %c", &c.worker_id,
                       &c.dp_rank, &c.next_id, &c.epoch, &extra) != 4)
                goto out;
            if (kvb_state_add_counter(s, &c) < 0)
                goto out;
        } else if (strncmp(line, "stream ", 7) == 0) {
            struct kvb_state_stream e;
            if (parse_stream(line + 7, &e) < 0)
                goto out;
            if (kvb_grow((void **)&s->streams, &s->cap_streams, s->n_streams + 1, sizeof(e)) < 0)
                goto out;
            s->streams[s->n_streams++] = e;
        } else if (version >= 2 && (what = track_line(line, &rest)) != 0) {
            struct kvb_track_rec r;
            if (parse_track(rest, what, &r) < 0 || kvb_state_add_track(s, &r) < 0)
                goto out;
        } else if (strcmp(line, "end\n") == 0) {
            end = true;
        } else {
            goto out;
        }
    }
    if (end) {
        *out = s;
        s = NULL;
        rc = 0;
    }
out:
    fclose(f);
    kvb_state_free(&s);
    return rc;
}
