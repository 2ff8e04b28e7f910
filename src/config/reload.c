/* config_reload: what SIGHUP may change.  Equality of the table's values
 * between two configurations (the NATS connection's keys, one source's keys,
 * its engine keys) and the check that a new file may replace the running one,
 * both loops over the table of src/config/table.c.
 */
#include "config.h"
#include "config_priv.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* Values of one table row in two configs (or sources) are equal. */
static bool field_eq(const struct opt *o, const void *a_base, const void *b_base)
{
    const void *a = (const char *)a_base + o->off, *b = (const char *)b_base + o->off;
    switch (o->type) {
    case T_U64: return *(const uint64_t *)a == *(const uint64_t *)b;
    case T_U32:
    case T_TIERS:
    case T_BLOCKSIZE: return *(const uint32_t *)a == *(const uint32_t *)b;
    case T_BOOL: return *(const bool *)a == *(const bool *)b;
    case T_ENUM: return *(const int *)a == *(const int *)b;
    case T_STR: {
        const char *sa = *(char *const *)a, *sb = *(char *const *)b;
        return strcmp(sa ? sa : "", sb ? sb : "") == 0;
    }
    case T_STRLIST: {
        size_t na = *(const size_t *)((const char *)a_base + o->noff);
        size_t nb = *(const size_t *)((const char *)b_base + o->noff);
        char *const *la = *(char **const *)a, *const *lb = *(char **const *)b;
        if (na != nb)
            return false;
        for (size_t i = 0; i < na; i++)
            if (strcmp(la[i], lb[i]) != 0)
                return false;
        return true;
    }
    case T_TOPICS: {
        size_t na = *(const size_t *)((const char *)a_base + o->noff);
        size_t nb = *(const size_t *)((const char *)b_base + o->noff);
        const struct kvb_topic_cfg *ta = *(struct kvb_topic_cfg *const *)a;
        const struct kvb_topic_cfg *tb = *(struct kvb_topic_cfg *const *)b;
        if (na != nb)
            return false;
        for (size_t i = 0; i < na; i++)
            if (ta[i].worker_id != tb[i].worker_id || strcmp(ta[i].topic, tb[i].topic) != 0)
                return false;
        return true;
    }
    case T_LORA_NAMES: {
        size_t na = *(const size_t *)((const char *)a_base + o->noff);
        size_t nb = *(const size_t *)((const char *)b_base + o->noff);
        const struct kvb_lora_name_cfg *la = *(struct kvb_lora_name_cfg *const *)a;
        const struct kvb_lora_name_cfg *lb = *(struct kvb_lora_name_cfg *const *)b;
        if (na != nb)
            return false;
        for (size_t i = 0; i < na; i++)
            if (la[i].id != lb[i].id || strcmp(la[i].name, lb[i].name) != 0)
                return false;
        return true;
    }
    case T_SOURCES: {
        size_t na = *(const size_t *)((const char *)a_base + o->noff);
        size_t nb = *(const size_t *)((const char *)b_base + o->noff);
        const struct kvb_source_cfg *sa = *(struct kvb_source_cfg *const *)a;
        const struct kvb_source_cfg *sb = *(struct kvb_source_cfg *const *)b;
        if (na != nb)
            return false;
        for (size_t k = 0; k < na; k++)
            for (size_t i = 0; i < kvb_cfg_nopts; i++)
                if (in_sources(&kvb_cfg_opts[i]) && !field_eq(&kvb_cfg_opts[i], &sa[k], &sb[k]))
                    return false;
        return true;
    }
    }
    return false;
}

bool kvb_config_engine_equal(const struct kvb_source_cfg *a, const struct kvb_source_cfg *b)
{
    if (!a || !b)
        return a == b;
    for (size_t i = 0; i < kvb_cfg_nopts; i++)
        if (is_engine_key(&kvb_cfg_opts[i]) && !field_eq(&kvb_cfg_opts[i], a, b))
            return false;
    return true;
}

bool kvb_config_worker_equal(const struct kvb_source_cfg *a, const struct kvb_source_cfg *b)
{
    if (!a || !b)
        return a == b;
    for (size_t i = 0; i < kvb_cfg_nopts; i++)
        if ((kvb_cfg_opts[i].flags & F_WORKER) && !field_eq(&kvb_cfg_opts[i], a, b))
            return false;
    return true;
}

bool kvb_config_source_equal(const struct kvb_source_cfg *a, const struct kvb_source_cfg *b)
{
    if (!a || !b)
        return a == b;
    for (size_t i = 0; i < kvb_cfg_nopts; i++) {
        const struct opt *o = &kvb_cfg_opts[i];
        if (in_sources(o) && !is_engine_key(o) && !(o->flags & F_WORKER) && !field_eq(o, a, b))
            return false;
    }
    const struct kvb_curve_cfg *x = &a->curve, *y = &b->curve;
    return x->enabled == y->enabled && x->n_allowed == y->n_allowed &&
           memcmp(x->secret_key, y->secret_key, sizeof x->secret_key) == 0 &&
           memcmp(x->server_key, y->server_key, sizeof x->server_key) == 0 &&
           (!x->n_allowed ||
            memcmp(x->allowed, y->allowed, x->n_allowed * sizeof *x->allowed) == 0);
}

bool kvb_config_nats_equal(const struct kvb_config *a, const struct kvb_config *b)
{
    if (!a || !b)
        return a == b;
    for (size_t i = 0; i < kvb_cfg_nopts; i++)
        if ((kvb_cfg_opts[i].flags & F_CONN) && !field_eq(&kvb_cfg_opts[i], a, b))
            return false;
    return true;
}

int kvb_config_check_reload(const struct kvb_config *old_cfg, const struct kvb_config *new_cfg,
                            FILE *err)
{
    int rc = 0;
    if (!old_cfg || !new_cfg)
        return -EINVAL;
    for (size_t i = 0; i < kvb_cfg_nopts; i++) {
        const struct opt *o = &kvb_cfg_opts[i];
        if (o->flags & F_RELOAD)
            continue;
        bool same;
        if (in_sources(o)) {
            same = old_cfg->n_sources == new_cfg->n_sources;
            for (size_t k = 0; same && k < new_cfg->n_sources; k++)
                same = field_eq(o, &old_cfg->sources[k], &new_cfg->sources[k]);
        } else {
            same = field_eq(o, old_cfg, new_cfg);
        }
        if (!same) {
            if (err)
                fprintf(err, "%s: '%s' changed: it needs a restart to take effect\n",
                        new_cfg->path ? new_cfg->path : "config", o->key);
            rc = -EINVAL;
        }
    }
    /* Discovery records name nats.namespace, nats.component, nats.endpoint
     * (reloadable keys otherwise): the registered records stay. */
    if (old_cfg->discovery.etcd.n_endpoints &&
        (strcmp(old_cfg->nats.namespace_, new_cfg->nats.namespace_) ||
         strcmp(old_cfg->nats.component, new_cfg->nats.component) ||
         strcmp(old_cfg->nats.endpoint, new_cfg->nats.endpoint))) {
        if (err)
            fprintf(err,
                    "%s: nats.namespace, nats.component or nats.endpoint changed "
                    "while discovery is on (the registered records name them): it needs "
                    "a restart to take effect\n",
                    new_cfg->path ? new_cfg->path : "config");
        rc = -EINVAL;
    }
    /* The stream and subject also follow nats.namespace, nats.component and
     * worker_id (reloadable keys): the running sink keeps its stream. */
    const char *names[2][5] = {
        {"stream", old_cfg->nats.jetstream.stream_name, new_cfg->nats.jetstream.stream_name,
         old_cfg->nats.jetstream.stream, new_cfg->nats.jetstream.stream},
        {"subject", old_cfg->nats.jetstream.subject_name, new_cfg->nats.jetstream.subject_name,
         old_cfg->nats.jetstream.subject, new_cfg->nats.jetstream.subject},
    };
    bool raw_same = true; /* else the key itself was reported above */
    for (int i = 0; i < 2; i++)
        raw_same =
            raw_same && strcmp(names[i][3] ? names[i][3] : "", names[i][4] ? names[i][4] : "") == 0;
    for (int i = 0;
         i < 2 && raw_same && old_cfg->nats.jetstream.enabled && new_cfg->nats.jetstream.enabled;
         i++) {
        const char *a = names[i][1] ? names[i][1] : "", *b = names[i][2] ? names[i][2] : "";
        if (strcmp(a, b) == 0)
            continue;
        if (err)
            fprintf(err,
                    "%s: the JetStream %s would change from '%s' to '%s' "
                    "(nats.namespace, nats.component or worker_id changed): it needs a "
                    "restart to take effect\n",
                    new_cfg->path ? new_cfg->path : "config", names[i][0], a, b);
        rc = -EINVAL;
    }
    return rc;
}
