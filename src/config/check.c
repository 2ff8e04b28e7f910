/* config check: the checks across keys, run once the file was walked (see
 * src/config/config.c): the files named by F_PATH keys (resolve_files),
 * authentication, TLS, each source and its CURVE keys, JetStream,
 * worker_id_file and the count of ZMQ sockets.  The checks of one value:
 * src/config/check_value.c.
 */
#include "config.h"
#include "config_priv.h"
#include "secret.h"
#include "subject.h"
#include "url.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

/* sources[].engine: dead_after_ms covers at least one scrape. */
void kvb_cfg_check_engine(struct ctx *c, const struct kvb_source_cfg *s, size_t i,
                          const struct mark *m)
{
    const struct mark *md = &m[kvb_cfg_opt_index("sources[].engine.dead_after_ms")];
    const struct mark *mi = &m[kvb_cfg_opt_index("sources[].engine.scrape_interval_ms")];
    if (md->bad || mi->bad || s->engine.dead_after_ms >= s->engine.scrape_interval_ms)
        return;
    const struct mark *at = md->set ? md : mi->set ? mi : md;
    err_at(c, at->line, at->col,
           "sources[%zu].engine.dead_after_ms: %" PRIu32 " is less than "
           "sources[%zu].engine.scrape_interval_ms (%" PRIu32 ")",
           i, s->engine.dead_after_ms, i, s->engine.scrape_interval_ms);
}

/* ------------------------------------------------------------------------ */
/* Files named by the configuration                                          */

/* A relative NAME is looked up in $CREDENTIALS_DIRECTORY when that is set
 * (systemd's LoadCredential=), otherwise in the directory of the config
 * file.  malloc'd; NULL when out of memory (reported). */
static char *resolve_path(struct ctx *c, const char *name)
{
    char *p = kvb_secret_path(name, c->creds_dir, c->path);
    if (!p)
        oom(c);
    return p;
}

/* Open PATH and check that it is a regular file: the fd, or -1 (reported). */
static int open_named(struct ctx *c, const struct opt *o, const char *path, const char *where,
                      const struct mark *m)
{
    char *sp = kvb_cfg_shown_max(path, strlen(path), MAX_SHOWN_PATH);
    int fd = kvb_secret_open(path);
    if (fd == -EINVAL)
        err_at(c, m->line, m->col, "%s: '%s'%s is not a regular file", o->key, SHOWN(sp), where);
    else if (fd < 0)
        err_at(c, m->line, m->col, "%s: cannot read '%s'%s: %s", o->key, SHOWN(sp), where,
               strerror(-fd));
    free(sp);
    return fd < 0 ? -1 : fd;
}

/* Read a secret from PATH into *out (malloc'd), as kvb_secret_read_fd() with
 * FLAGS does.  0, or -1 (reported; the content is never shown). */
static int read_secret(struct ctx *c, const struct opt *o, const char *path, const char *where,
                       const struct mark *m, unsigned flags, char **out)
{
    const char *why = NULL;
    int fd = open_named(c, o, path, where, m);
    if (fd < 0)
        return -1;
    int rc = kvb_secret_read_fd(fd, flags, out, &why);
    close(fd);
    if (rc == -ENOMEM) {
        oom(c);
    } else if (rc < 0) {
        char *sp = kvb_cfg_shown_max(path, strlen(path), MAX_SHOWN_PATH);
        err_at(c, m->line, m->col, "%s: cannot use '%s'%s: %s", o->key, SHOWN(sp), where,
               why ? why : strerror(-rc));
        free(sp);
    }
    return rc < 0 ? -1 : 0;
}

/* F_PATH row O (index I), its file at PATH (WHERE: how the name was
 * looked up, for messages): read into the key it .fills, which must not be
 * set too.  0, or -1 (reported). */
static int fill_from_file(struct ctx *c, struct kvb_config *cfg, struct mark *m, size_t i,
                          const char *path, const char *where)
{
    const struct opt *o = &kvb_cfg_opts[i];
    size_t t = kvb_cfg_opt_index(o->fills);
    char **target = (char **)((char *)cfg + kvb_cfg_opts[t].off);
    char *secret = NULL;
    if (m[t].set && (m[t].bad || **target)) {
        err_at(c, m[i].line, m[i].col, "%s: %s is set too (at %zu:%zu): use one of them", o->key,
               o->fills, m[t].line, m[t].col);
        return -1;
    }
    /* a seed is checked; a password or token is one line */
    unsigned flags =
        strcmp(o->fills, "nats.nkey_seed") == 0 ? KVB_SECRET_TRIM : KVB_SECRET_ONE_LINE;
    if (read_secret(c, o, path, where, &m[i], flags, &secret) < 0)
        return -1;
    kvb_cfg_str_free(*target);
    *target = secret;
    return 0;
}

/* Every F_PATH key that is set: resolve the name (the field gets the
 * result), then read the secret it .fills, or check that the file is
 * readable. */
void kvb_cfg_resolve_files(struct ctx *c, struct kvb_config *cfg, struct mark *m)
{
    for (size_t i = 0; i < kvb_cfg_nopts; i++) {
        const struct opt *o = &kvb_cfg_opts[i];
        char **field = (char **)((char *)cfg + o->off);
        if (!(o->flags & F_PATH) || m[i].bad || !*field || !**field)
            continue;
        const char *where =
            (*field)[0] != '/' && c->creds_dir ? " (in $CREDENTIALS_DIRECTORY)" : "";
        char *path = resolve_path(c, *field);
        if (!path)
            return;
        kvb_cfg_str_free(*field);
        *field = path;
        int fd;
        if (o->fills)
            m[i].bad = fill_from_file(c, cfg, m, i, path, where) < 0;
        else if ((fd = open_named(c, o, path, where, &m[i])) < 0)
            m[i].bad = true;
        else
            close(fd);
    }
}

/* A key written in the file with a value other than "" (or a bad one). */
static bool present(const struct kvb_config *cfg, const struct mark *m, const char *key)
{
    size_t i = kvb_cfg_opt_index(key);
    const char *v = *(char *const *)((const char *)cfg + kvb_cfg_opts[i].off);
    return m[i].set && (m[i].bad || (v && *v));
}

static bool before(const struct mark *a, const struct mark *b)
{
    return a->line < b->line || (a->line == b->line && a->col < b->col);
}

/* At most one authentication method: every key of a method after the
 * first one set (in the order of the file) is reported.  Returns the index
 * of that method in METHODS, or NM when none is set. */
#define NM 4
static size_t check_one_method(struct ctx *c, const struct kvb_config *cfg, const struct mark *m)
{
    static const char *const methods[NM][3] = {
        {"nats.credentials"},
        {"nats.user", "nats.password", "nats.password_file"},
        {"nats.token", "nats.token_file"},
        {"nats.nkey_seed", "nats.nkey_seed_file"},
    };
    const struct mark *first[NM] = {0}; /* earliest key of each method present */
    const char *first_key[NM] = {0};
    const struct mark *winner = NULL;
    size_t wi = NM;

    for (size_t i = 0; i < NM; i++) {
        for (size_t k = 0; k < 3 && methods[i][k]; k++) {
            const struct mark *mk = &m[kvb_cfg_opt_index(methods[i][k])];
            if (present(cfg, m, methods[i][k]) && (!first[i] || before(mk, first[i]))) {
                first[i] = mk;
                first_key[i] = methods[i][k];
            }
        }
        if (first[i] && (!winner || before(first[i], winner))) {
            winner = first[i];
            wi = i;
        }
    }
    /* the others, in the order of the file */
    for (const struct mark *last = winner; last;) {
        size_t next = NM;
        for (size_t i = 0; i < NM; i++)
            if (first[i] && before(last, first[i]) && (next == NM || before(first[i], first[next])))
                next = i;
        if (next == NM)
            break;
        err_at(c, first[next]->line, first[next]->col,
               "%s: only one authentication method may be set, and %s (at %zu:%zu) is "
               "set already",
               first_key[next], first_key[wi], winner->line, winner->col);
        last = first[next];
    }
    return wi;
}

/* nats.user and a password go together. */
static void check_user_password(struct ctx *c, const struct kvb_config *cfg, const struct mark *m)
{
    bool user = present(cfg, m, "nats.user");
    const char *pw = present(cfg, m, "nats.password")        ? "nats.password"
                     : present(cfg, m, "nats.password_file") ? "nats.password_file"
                                                             : NULL;
    if (user && !pw) {
        const struct mark *mu = &m[kvb_cfg_opt_index("nats.user")];
        err_at(c, mu->line, mu->col, "nats.user: needs nats.password or nats.password_file");
    } else if (pw && !user) {
        const struct mark *mp = &m[kvb_cfg_opt_index(pw)];
        err_at(c, mp->line, mp->col, "%s: needs nats.user", pw);
    }
}

/* The NKey seed (from the file or the key) is a user seed: its public key
 * goes to nats.nkey_public. */
static void check_seed(struct ctx *c, struct kvb_config *cfg, const struct mark *m)
{
    const char *seed = cfg->nats.nkey_seed;
    bool from_file = present(cfg, m, "nats.nkey_seed_file");
    const struct mark *ms =
        &m[kvb_cfg_opt_index(from_file ? "nats.nkey_seed_file" : "nats.nkey_seed")];
    char pub[KVB_NKEY_PUB_CHARS + 1];
    if (!seed || !*seed || ms->bad)
        return;
    const char *why = kvb_secret_nkey_public(seed, pub);
    if (why && from_file) {
        char *sp = kvb_cfg_shown_max(cfg->nats.nkey_seed_file, strlen(cfg->nats.nkey_seed_file),
                                     MAX_SHOWN_PATH);
        err_at(c, ms->line, ms->col,
               "nats.nkey_seed_file: '%s' does not hold an NKey "
               "user seed: %s",
               SHOWN(sp), why);
        free(sp);
    } else if (why) {
        err_at(c, ms->line, ms->col, "nats.nkey_seed: not an NKey user seed: %s", why);
    } else if (!(cfg->nats.nkey_public = strdup(pub))) {
        oom(c);
    }
}

/* At most one authentication method, each one complete; the NKey seed is
 * valid and gives nkey_public. */
static void check_auth(struct ctx *c, struct kvb_config *cfg, const struct mark *m)
{
    size_t method = check_one_method(c, cfg, m);
    if (method == NM || method == 1) /* none, or user and password */
        check_user_password(c, cfg, m);
    check_seed(c, cfg, m);
}
#undef NM

/* TLS: on with tls:// URLs; its files only when it is on; cert with key. */
static void check_tls(struct ctx *c, struct kvb_config *cfg, const struct mark *m)
{
    const struct mark *ms = &m[kvb_cfg_opt_index("nats.servers")];
    const struct mark *me = &m[kvb_cfg_opt_index("nats.tls.enabled")];
    const struct mark *mv = &m[kvb_cfg_opt_index("nats.tls.verify")];
    size_t tls_url = SIZE_MAX;
    if (ms->bad)
        return;
    for (size_t i = 0; i < cfg->nats.n_servers && tls_url == SIZE_MAX; i++) {
        struct kvb_url u;
        int rc = kvb_url_parse(cfg->nats.servers[i], "nats", &u, NULL);
        if (rc == -ENOMEM)
            oom(c);
        if (rc == 0 && strcmp(u.scheme, "tls") == 0)
            tls_url = i;
        kvb_url_free(&u);
    }
    if (tls_url != SIZE_MAX) {
        if (me->set && !me->bad && !cfg->nats.tls.enabled)
            err_at(c, me->line, me->col,
                   "nats.tls.enabled: false, but nats.servers[%zu] "
                   "is a tls:// URL",
                   tls_url);
        cfg->nats.tls.enabled = true;
    }
    static const char *const needs_tls[] = {"nats.tls.ca", "nats.tls.cert", "nats.tls.key",
                                            "nats.tls.server_name"};
    for (size_t i = 0; i < 4 && !cfg->nats.tls.enabled; i++) {
        const struct mark *mk = &m[kvb_cfg_opt_index(needs_tls[i])];
        if (present(cfg, m, needs_tls[i]))
            err_at(c, mk->line, mk->col,
                   "%s: TLS is not enabled (set nats.tls.enabled: "
                   "true, or use tls:// server URLs)",
                   needs_tls[i]);
    }
    if (!cfg->nats.tls.enabled)
        return;
    bool cert = present(cfg, m, "nats.tls.cert"), key = present(cfg, m, "nats.tls.key");
    if (cert != key) {
        const char *k = cert ? "nats.tls.cert" : "nats.tls.key";
        const struct mark *mk = &m[kvb_cfg_opt_index(k)];
        err_at(c, mk->line, mk->col, "%s: needs %s too", k,
               cert ? "nats.tls.key" : "nats.tls.cert");
    }
    if (present(cfg, m, "nats.tls.server_name") && !cfg->nats.tls.verify && !mv->bad) {
        const struct mark *mk = &m[kvb_cfg_opt_index("nats.tls.server_name")];
        err_at(c, mk->line, mk->col,
               "nats.tls.server_name: has no effect with "
               "nats.tls.verify: false");
    }
}

/* Every tcp:// endpoint has a port ZMQ can use: 1..65535, or * (any) for the
 * endpoint of a bind-mode source without dp_size expansion.  dp_size > 1:
 * every endpoint is tcp://HOST:PORT with room for the expansion, or (with
 * rank_naming: trtllm) ipc:// or inproc://, which take a _dp{r} suffix. */
/* sources[].discover: the engine's list gives the endpoints and topics
 * (keys that would say otherwise are errors), in connect mode. */
static void check_discover(struct ctx *c, const struct kvb_source_cfg *s, size_t i,
                           const struct mark *m)
{
    static const char *const listed[] = {"sources[].endpoint", "sources[].replay_endpoint",
                                         "sources[].topic", "sources[].topics"};
    for (size_t k = 0; k < sizeof(listed) / sizeof(listed[0]); k++) {
        const struct mark *mk = &m[kvb_cfg_opt_index(listed[k])];
        if (mk->set)
            err_at(c, mk->line, mk->col,
                   "sources[%zu].%s: the engine's list (sources[%zu].discover) gives it: leave "
                   "it out",
                   i, listed[k] + sizeof SRC_PREFIX, i);
    }
    const struct mark *mm = &m[kvb_cfg_opt_index("sources[].mode")];
    if (s->mode == KVB_MODE_BIND && !mm->bad)
        err_at(c, mm->line, mm->col,
               "sources[%zu].mode: bind: with sources[%zu].discover kvbridge connects to the "
               "listed endpoints (mode: connect)",
               i, i);
}

void kvb_cfg_check_source(struct ctx *c, const struct kvb_source_cfg *s, size_t i,
                          const struct mark *m)
{
    const struct mark *mrank = &m[kvb_cfg_opt_index("sources[].dp_rank")];
    const struct mark *msize = &m[kvb_cfg_opt_index("sources[].dp_size")];
    if ((uint64_t)s->dp_rank + s->dp_size - 1 > UINT32_MAX && !mrank->bad)
        err_at(c, mrank->line, mrank->col,
               "sources[%zu].dp_rank: %" PRIu32 " + dp_size %" PRIu32 " goes past %" PRIu32, i,
               s->dp_rank, s->dp_size, UINT32_MAX);
    if (s->discover && s->discover[0] && !m[kvb_cfg_opt_index("sources[].discover")].bad) {
        check_discover(c, s, i, m);
        return;
    }
    const struct mark *mend = &m[kvb_cfg_opt_index("sources[].endpoint")];
    const struct mark *mrep = &m[kvb_cfg_opt_index("sources[].replay_endpoint")];
    const char *eps[2] = {s->endpoint, s->replay_endpoint};
    const struct mark *ms[2] = {mend, mrep};
    const char *names[2] = {"endpoint", "replay_endpoint"};
    bool expand = s->dp_size > 1 && !msize->bad;
    bool suffix =
        s->rank_naming == KVB_RANKS_TRTLLM && !m[kvb_cfg_opt_index("sources[].rank_naming")].bad;

    for (size_t k = 0; k < 2; k++) {
        if (!eps[k] || !has_prefix(eps[k], "tcp://") || ms[k]->bad)
            continue;
        const char *colon = strrchr(eps[k] + 6, ':');
        long port = kvb_cfg_port_of(eps[k]);
        bool any = colon && strcmp(colon, ":*") == 0 && k == 0 && !expand &&
                   s->mode == KVB_MODE_BIND && !m[kvb_cfg_opt_index("sources[].mode")].bad;
        if (port == 0 || (port < 0 && !expand && !any)) {
            char *sv = kvb_cfg_shown(eps[k], strlen(eps[k]));
            err_at(c, ms[k]->line, ms[k]->col,
                   "sources[%zu].%s: '%s' needs a port in "
                   "1..65535 (tcp://HOST:PORT)",
                   i, names[k], SHOWN(sv));
            free(sv);
        }
    }
    if (expand) {
        for (size_t k = 0; k < 2; k++) {
            if (!eps[k] || !*eps[k] || ms[k]->bad)
                continue;
            bool tcp = has_prefix(eps[k], "tcp://");
            long port = tcp ? kvb_cfg_port_of(eps[k]) : -1;
            if (port == 0 || (!tcp && suffix))
                continue; /* reported above; ipc://PATH_dp{r} */
            if (port < 0)
                err_at(c, msize->line, msize->col,
                       "sources[%zu].dp_size: %" PRIu32 " needs sources[%zu].%s to be "
                       "tcp://HOST:PORT with a numeric port%s",
                       i, s->dp_size, i, names[k],
                       tcp ? "" : " (or rank_naming: trtllm for ipc:// and inproc://)");
            else if ((uint64_t)port + s->dp_size - 1 > 65535)
                err_at(c, msize->line, msize->col,
                       "sources[%zu].dp_size: %" PRIu32
                       " ports from %ld (sources[%zu].%s) go past 65535",
                       i, s->dp_size, port, i, names[k]);
        }
    }
}

/* ---- ZMQ CURVE keys (sources[].curve) ---------------------------------- */

/* Source key K written in the file with a value other than "" (or a bad one). */
static bool src_present(const struct kvb_source_cfg *s, const struct mark *m, size_t k)
{
    const char *v = *(char *const *)((const char *)s + kvb_cfg_opts[k].off);
    return m[k].set && (m[k].bad || (v && *v));
}

/* Resolve the file name in the source key K of source I (the field gets the
 * result) and read the file: 0 and *text (malloc'd; zero it when done), or
 * -1 (reported). */
static int read_source_file(struct ctx *c, struct kvb_source_cfg *s, size_t i, size_t k,
                            const struct mark *m, char **text)
{
    char **field = (char **)((char *)s + kvb_cfg_opts[k].off);
    const char *where = (*field)[0] != '/' && c->creds_dir ? " (in $CREDENTIALS_DIRECTORY)" : "";
    char *path = resolve_path(c, *field);
    char *key = kvb_cfg_asprintf(c, "sources[%zu].%s", i, kvb_cfg_opts[k].key + sizeof SRC_PREFIX);
    int rc = -1;
    if (path && key) {
        kvb_cfg_str_free(*field);
        *field = path;
        path = NULL;
        struct opt so = kvb_cfg_opts[k];
        so.key = key;
        rc = read_secret(c, &so, *field, where, &m[k], 0, text);
    }
    free(path);
    free(key);
    return rc;
}

/* Error about the content of the file named in source key K (never quoted). */
static void file_content_err(struct ctx *c, const struct kvb_source_cfg *s, size_t i, size_t k,
                             const struct mark *m, const char *what)
{
    const char *path = *(char *const *)((const char *)s + kvb_cfg_opts[k].off);
    char *sp = kvb_cfg_shown_max(path, strlen(path), MAX_SHOWN_PATH);
    err_at(c, m[k].line, m[k].col, "sources[%zu].%s: '%s' %s", i,
           kvb_cfg_opts[k].key + sizeof SRC_PREFIX, SHOWN(sp), what);
    free(sp);
}

/* The secret key file: one line of 40 Z85 characters. */
static void read_curve_secret(struct ctx *c, struct kvb_source_cfg *s, size_t i, size_t k,
                              struct mark *m)
{
    char *text = NULL;
    if (read_source_file(c, s, i, k, m, &text) < 0) {
        m[k].bad = true;
        return;
    }
    char why[128];
    if (kvb_secret_curve_secret(text, s->curve.secret_key, why, sizeof why) < 0) {
        char what[192];
        snprintf(what, sizeof what, "does not hold a CURVE secret key: %s", why);
        file_content_err(c, s, i, k, m, what);
        m[k].bad = true;
    }
    explicit_bzero(text, strlen(text));
    free(text);
}

/* The allowed clients file: public keys, one per line. */
static void read_curve_allowed(struct ctx *c, struct kvb_source_cfg *s, size_t i, size_t k,
                               struct mark *m)
{
    char *text = NULL;
    if (read_source_file(c, s, i, k, m, &text) < 0) {
        m[k].bad = true;
        return;
    }
    const char *p = text, *line;
    size_t lineno = 0, len, n = 0, cap = 0;
    uint8_t(*keys)[32] = NULL;
    while (kvb_secret_next_line(&p, &lineno, &line, &len)) {
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            uint8_t(*nk)[32] = realloc(keys, cap * sizeof *keys);
            if (!nk) {
                oom(c);
                break;
            }
            keys = nk;
        }
        if (!kvb_secret_z85_key(line, len, keys[n])) {
            char what[96];
            snprintf(what, sizeof what, "line %zu: not a CURVE public key (40 Z85 characters)",
                     lineno);
            file_content_err(c, s, i, k, m, what);
            m[k].bad = true;
        } else {
            n++;
        }
    }
    if (n == 0 && !m[k].bad) {
        file_content_err(c, s, i, k, m, "lists no key (\"\" allows any client)");
        m[k].bad = true;
    }
    if (m[k].bad) {
        free(keys);
    } else {
        s->curve.allowed = keys;
        s->curve.n_allowed = n;
    }
    explicit_bzero(text, strlen(text));
    free(text);
}

/* sources[].curve: keys for the source's mode, the files read and checked. */
void kvb_cfg_check_curve(struct ctx *c, struct kvb_source_cfg *s, size_t i, struct mark *m)
{
    size_t ik = kvb_cfg_opt_index("sources[].curve.secret_key_file");
    size_t is = kvb_cfg_opt_index("sources[].curve.server_public_key");
    size_t ia = kvb_cfg_opt_index("sources[].curve.allowed_clients_file");
    bool mode_ok = !m[kvb_cfg_opt_index("sources[].mode")].bad;
    bool bind = s->mode == KVB_MODE_BIND;
    bool key = src_present(s, m, ik), srv = src_present(s, m, is), allow = src_present(s, m, ia);

    if (srv && bind && mode_ok) {
        err_at(c, m[is].line, m[is].col,
               "sources[%zu].curve.server_public_key: only for "
               "mode: connect (engines connect to a bind-mode source with its public key)",
               i);
        m[is].bad = true;
    }
    if (allow && !bind && mode_ok) {
        err_at(c, m[ia].line, m[ia].col,
               "sources[%zu].curve.allowed_clients_file: only for "
               "mode: bind",
               i);
        m[ia].bad = true;
    }
    for (size_t k = 0; k < 2 && !key; k++) {
        size_t at = k ? ia : is;
        if ((k ? allow : srv) && !m[at].bad) {
            err_at(c, m[at].line, m[at].col,
                   "sources[%zu].%s: needs "
                   "sources[%zu].curve.secret_key_file (CURVE is off without it)",
                   i, kvb_cfg_opts[at].key + sizeof SRC_PREFIX, i);
            m[at].bad = true;
        }
    }
    if (key && !m[ik].bad && s->endpoint && has_prefix(s->endpoint, "inproc://")) {
        err_at(c, m[ik].line, m[ik].col,
               "sources[%zu].curve.secret_key_file: ZMQ has no "
               "CURVE on inproc:// endpoints (use ipc:// or tcp://)",
               i);
        m[ik].bad = true;
    }
    if (key && !bind && !srv && mode_ok && !m[ik].bad)
        err_at(c, m[ik].line, m[ik].col,
               "sources[%zu].curve.secret_key_file: mode connect "
               "needs sources[%zu].curve.server_public_key (the engine's public key) too",
               i, i);
    if (srv && !m[is].bad &&
        !kvb_secret_z85_key(s->curve.server_public_key, strlen(s->curve.server_public_key),
                            s->curve.server_key)) {
        err_at(c, m[is].line, m[is].col,
               "sources[%zu].curve.server_public_key: not a CURVE "
               "public key (40 Z85 characters)",
               i);
        m[is].bad = true;
    }
    if (key && !m[ik].bad)
        read_curve_secret(c, s, i, ik, m);
    if (allow && !m[ia].bad)
        read_curve_allowed(c, s, i, ia, m);
    s->curve.enabled = key;
}

/* TMPL with {namespace}, {component} and {worker_id} replaced (malloc'd; NULL
 * when out of memory, reported).  The templates were checked already. */
static char *js_expand(struct ctx *c, const char *tmpl, const struct kvb_config *cfg)
{
    char num[24];
    snprintf(num, sizeof num, "%" PRIu64, cfg->worker_id);
    const char *vals[3] = {cfg->nats.namespace_ ? cfg->nats.namespace_ : "",
                           cfg->nats.component ? cfg->nats.component : "", num};
    static const char *const names[3] = {"{namespace}", "{component}", "{worker_id}"};
    char *out = NULL;
    for (int pass = 0; pass < 2; pass++) {
        size_t n = 0;
        for (const char *p = tmpl; *p;) {
            size_t k = 0;
            while (k < 3 && !has_prefix(p, names[k]))
                k++;
            const char *v = k < 3 ? vals[k] : p;
            size_t vl = k < 3 ? strlen(v) : 1;
            if (out)
                memcpy(out + n, v, vl);
            n += vl;
            p += k < 3 ? strlen(names[k]) : 1;
        }
        if (out) {
            out[n] = '\0';
            break;
        }
        if (!(out = malloc(n + 1))) {
            oom(c);
            return NULL;
        }
    }
    return out;
}

#define JS_NAME_MAX 255

/* Why NAME is not a usable stream name (NULL: it is). */
static const char *bad_stream_name(const char *name)
{
    if (!*name)
        return "is empty";
    if (strlen(name) > JS_NAME_MAX)
        return "is longer than 255 bytes";
    for (const char *p = name; *p; p++)
        if ((unsigned char)*p <= ' ' || *p == 0x7f || strchr(".*>/\\", *p))
            return "contains one of . * > / \\, white space or a control character";
    return NULL;
}

/* Why SUBJ cannot be published to (NULL: it can). */
static const char *bad_pub_subject(const char *subj)
{
    if (!*subj)
        return "is empty";
    if (strlen(subj) > JS_NAME_MAX)
        return "is longer than 255 bytes";
    if (subj[0] == '.' || subj[strlen(subj) - 1] == '.' || strstr(subj, ".."))
        return "has an empty token";
    for (const char *p = subj; *p; p++)
        if ((unsigned char)*p <= ' ' || *p == 0x7f || *p == '*' || *p == '>')
            return "contains a wildcard (* or >), white space or a control character";
    return NULL;
}

/* nats.jetstream: resolve the stream name and the subject; when enabled, they
 * must be usable, and the duplicate window must fit in max_age_s. */
static void check_jetstream(struct ctx *c, struct kvb_config *cfg, const struct mark *m)
{
    const struct mark *ms = &m[kvb_cfg_opt_index("nats.jetstream.stream")];
    const struct mark *mj = &m[kvb_cfg_opt_index("nats.jetstream.subject")];
    const struct mark *me = &m[kvb_cfg_opt_index("nats.jetstream.enabled")];
    const struct mark *md = &m[kvb_cfg_opt_index("nats.jetstream.duplicate_window_s")];
    const struct mark *ma = &m[kvb_cfg_opt_index("nats.jetstream.max_age_s")];
    const char *stream = cfg->nats.jetstream.stream, *subject = cfg->nats.jetstream.subject;
    char *name = NULL, *subj = NULL, *tmpl = NULL;

    if (ms->bad || mj->bad || !stream || !subject)
        return;
    name = js_expand(c, *stream ? stream : "namespace-{namespace}-component-{component}-kv-events",
                     cfg);
    if (name && !*subject)
        tmpl = kvb_cfg_asprintf(c, "%s.queue", name);
    subj = name && (tmpl || *subject) ? js_expand(c, tmpl ? tmpl : subject, cfg) : NULL;
    free(tmpl);
    if (!name || !subj)
        goto out;
    if (cfg->nats.jetstream.enabled) {
        const char *why;
        const struct mark *at;
        char *sv;
        if ((why = bad_stream_name(name))) {
            at = ms->set ? ms : me;
            sv = kvb_cfg_shown(name, strlen(name));
            err_at(c, at->line, at->col, "nats.jetstream.stream: '%s' %s", SHOWN(sv), why);
            free(sv);
        }
        if ((why = bad_pub_subject(subj))) {
            at = mj->set ? mj : ms->set ? ms : me;
            sv = kvb_cfg_shown(subj, strlen(subj));
            err_at(c, at->line, at->col, "nats.jetstream.subject: '%s' %s", SHOWN(sv), why);
            free(sv);
        }
        uint32_t age = cfg->nats.jetstream.max_age_s, win = cfg->nats.jetstream.duplicate_window_s;
        if (age > 0 && win > age && !md->bad && !ma->bad) {
            at = md->set ? md : ma;
            err_at(c, at->line, at->col,
                   "nats.jetstream.duplicate_window_s: %" PRIu32 " is more than "
                   "nats.jetstream.max_age_s (%" PRIu32 ")",
                   win, age);
        }
    }
    cfg->nats.jetstream.stream_name = name;
    cfg->nats.jetstream.subject_name = subj;
    name = subj = NULL;
out:
    free(name);
    free(subj);
}

/* worker_id_file: not with worker_id; its content is the id. */
static void check_worker_id_file(struct ctx *c, struct kvb_config *cfg, struct mark *m)
{
    size_t f = kvb_cfg_opt_index("worker_id_file"), w = kvb_cfg_opt_index("worker_id");
    const char *path = cfg->worker_id_file;
    char *text = NULL;
    if (!present(cfg, m, "worker_id_file") || m[f].bad)
        return;
    if (m[w].set) {
        err_at(c, m[f].line, m[f].col,
               "worker_id_file: worker_id is set too (at %zu:%zu): "
               "use one of them",
               m[w].line, m[w].col);
        return;
    }
    /* (resolve_files() made the name absolute and found the file readable) */
    if (read_secret(c, &kvb_cfg_opts[f], path, "", &m[f], KVB_SECRET_TRIM, &text) < 0)
        return;
    uint64_t id = 0;
    int pr = kvb_cfg_parse_u64(text, strlen(text), &id);
    if (pr < 0) {
        char *sp = kvb_cfg_shown_max(path, strlen(path), MAX_SHOWN_PATH);
        err_at(c, m[f].line, m[f].col,
               "worker_id_file: '%s' does not hold a worker id: "
               "its content %s (expected an unsigned 64-bit decimal integer)",
               SHOWN(sp),
               pr == -2   ? "is negative"
               : pr == -3 ? "is too large"
                          : "is not a decimal integer");
        free(sp);
    } else {
        cfg->worker_id = id;
    }
    free(text);
}

/* Every dp rank of every source is a SUB socket, plus a DEALER when the
 * source has a replay_endpoint (or a discover list, which may give one); a CURVE ZAP handler takes one more.  They
 * all live in one ZMQ context, which refuses sockets beyond
 * ZMQ_MAX_SOCKETS_DFLT. */
static void check_socket_count(struct ctx *c, const struct kvb_config *cfg, const struct mark *m)
{
    const struct mark *ms = &m[kvb_cfg_opt_index("sources")];
    uint64_t total = 1; /* the ZAP handler */
    for (size_t i = 0; i < cfg->n_sources; i++) {
        const struct kvb_source_cfg *s = &cfg->sources[i];
        bool replay = (s->replay_endpoint && *s->replay_endpoint) || (s->discover && *s->discover);
        total += (uint64_t)s->dp_size * (replay ? 2 : 1); /* a list may name replay endpoints */
    }
    if (total > ZMQ_MAX_SOCKETS_DFLT && ms->set && !ms->bad)
        err_at(c, ms->line, ms->col,
               "sources: %" PRIu64 " ZMQ sockets needed (one SUB per dp rank, one replay "
               "DEALER per dp rank with a replay_endpoint, one for the CURVE ZAP handler), more "
               "than ZMQ's "
               "limit of %d: lower dp_size or split the sources over several kvbridge "
               "instances",
               total, ZMQ_MAX_SOCKETS_DFLT);
}

/* nats.format: the combinations; the endpoint-scoped subject by default for
 * dynamo-msgpack. */
static void check_publish(struct ctx *c, struct kvb_config *cfg, struct mark *m)
{
    const struct mark *mf = &m[kvb_cfg_opt_index("nats.format")];
    const struct mark *mj = &m[kvb_cfg_opt_index("nats.jetstream.enabled")];
    const struct mark *md = &m[kvb_cfg_opt_index("discovery.etcd.endpoints")];
    struct mark *ms = &m[kvb_cfg_opt_index("nats.subject")];
    int f = cfg->nats.format;
    if (mf->bad)
        return;
    if (f != KVB_FORMAT_DYNAMO_JSON && cfg->nats.jetstream.enabled && !mj->bad) {
        const struct mark *at = mf->set ? mf : mj;
        err_at(c, at->line, at->col,
               "nats.format: %s cannot be published through "
               "JetStream (nats.jetstream.enabled): Dynamo's JetStream consumers read "
               "dynamo-json; use dynamo-json, or core NATS",
               kvb_cfg_opts[kvb_cfg_opt_index("nats.format")].values[f]);
    }
    const struct mark *mr = &m[kvb_cfg_opt_index("nats.resync_on_reconnect")];
    if (cfg->nats.resync_on_reconnect && cfg->nats.jetstream.enabled && !mr->bad && !mj->bad)
        err_at(c, mr->line, mr->col,
               "nats.resync_on_reconnect: for core NATS only: JetStream sends again "
               "what the stream did not acknowledge");
    if (cfg->nats.resync_on_reconnect && cfg->limits.max_resident_blocks == 0 && !mr->bad)
        err_at(c, mr->line, mr->col,
               "nats.resync_on_reconnect: needs the residency mirror "
               "(limits.max_resident_blocks is 0)");
    if (cfg->discovery.etcd.n_endpoints && f != KVB_FORMAT_DYNAMO_MSGPACK && !md->bad)
        err_at(c, md->line, md->col,
               "discovery.etcd.endpoints: discovery registers "
               "event-plane publishers: it needs nats.format dynamo-msgpack");
    if (f == KVB_FORMAT_DYNAMO_MSGPACK && !ms->set && !ms->bad) {
        char *d = strdup(KVB_SUBJECT_DEFAULT_MSGPACK);
        if (!d) {
            oom(c);
            return;
        }
        free(cfg->nats.subject);
        cfg->nats.subject = d;
    }
}

/* discovery.recovery: what answering Dynamo's recovery query needs. */
static void check_recovery(struct ctx *c, const struct kvb_config *cfg, const struct mark *m)
{
    const struct mark *me = &m[kvb_cfg_opt_index("discovery.recovery.enabled")];
    const struct mark *ml = &m[kvb_cfg_opt_index("discovery.recovery.listen")];
    const struct mark *ma = &m[kvb_cfg_opt_index("discovery.recovery.advertise")];
    bool enabled = cfg->discovery.recovery.enabled;
    const char *listen = cfg->discovery.recovery.listen;
    const char *advertise = cfg->discovery.recovery.advertise;
    if (!enabled || me->bad)
        return;
    if (!cfg->discovery.etcd.n_endpoints)
        err_at(c, me->line, me->col,
               "discovery.recovery.enabled: needs discovery.etcd.endpoints (the EventSource "
               "records carry the recovery target)");
    if (!cfg->limits.max_resident_blocks)
        err_at(c, me->line, me->col,
               "discovery.recovery.enabled: needs the residency mirror "
               "(limits.max_resident_blocks is 0)");
    if (cfg->discovery.recovery.request_plane != 1 || ml->bad) /* 1: tcp (recovery.h) */
        return;
    if (!listen[0]) {
        err_at(c, me->line, me->col,
               "discovery.recovery.listen: required with request_plane tcp (HOST:PORT)");
        return;
    }
    bool wildcard = strncmp(listen, "0.0.0.0:", 8) == 0 || strncmp(listen, "[::]:", 5) == 0;
    if (wildcard && !advertise[0] && !ma->bad)
        err_at(c, ml->line, ml->col,
               "discovery.recovery.advertise: required when discovery.recovery.listen is a "
               "wildcard address (the records must name one routers can reach)");
}

void kvb_cfg_check_config(struct ctx *c, struct kvb_config *cfg, struct mark *m)
{
    check_recovery(c, cfg, m);
    check_publish(c, cfg, m);
    check_worker_id_file(c, cfg, m);
    check_socket_count(c, cfg, m);
    check_auth(c, cfg, m);
    check_tls(c, cfg, m);
    check_jetstream(c, cfg, m);

    const struct mark *mw = &m[kvb_cfg_opt_index("nats.reconnect_wait_ms")];
    const struct mark *mx = &m[kvb_cfg_opt_index("nats.reconnect_wait_max_ms")];
    if (cfg->nats.reconnect_wait_max_ms < cfg->nats.reconnect_wait_ms && !mw->bad && !mx->bad) {
        const struct mark *at = mx->set ? mx : mw;
        err_at(c, at->line, at->col,
               "nats.reconnect_wait_max_ms: %" PRIu32 " is less than "
               "nats.reconnect_wait_ms (%" PRIu32 ")",
               cfg->nats.reconnect_wait_max_ms, cfg->nats.reconnect_wait_ms);
    }
}
