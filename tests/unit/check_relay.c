/* Dynamo's relay decisions (docs/router-events.md section 8), rule by rule:
 * known answers written from Dynamo's zmq_wire/mod.rs (preprocess, group
 * filter, cache namespace) and publisher/dedup.rs (copies), with kvbridge's
 * distinct (hash, group) copies; and the block tracker (track.c) alone. */
#include <check.h>

#include "testutil.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "convert.h"
#include "decode.h"
#include "pipeline/track.h"
#include "state.h"

static struct kvb_metrics m;
static struct kvb_converter *conv;
static const struct kvb_convert_cfg cfg = {.worker_id = 9,
                                           .block_size = 4,
                                           .lora_salt = true,
                                           .forward_tiers =
                                               (1u << KVB_TIER_DEVICE) | (1u << KVB_TIER_DISK),
                                           .max_tracked = 1u << 16};

static void setup(void)
{
    memset(&m, 0, sizeof(m));
    ck_assert_int_eq(kvb_converter_create(&cfg, &m, &conv), 0);
}
static void teardown(void) { kvb_converter_destroy(&conv); }

static struct kvb_str S(const char *s) {
    struct kvb_str r = {s, s ? (uint32_t)strlen(s) : 0};
    return r;
}

static uint64_t
drops(int reason)
{
    return kvb_get(&m.events_dropped_total[reason]);
}

/* Events of block size 4: block hash h holds tokens h*4 .. h*4+3. */
#define MAXB 80
struct ev {
    struct kvb_event e;
    struct kvb_hash h[MAXB];
    uint32_t t[MAXB * 4];
};

static struct kvb_hash uh(uint64_t v)
{
    struct kvb_hash h = {.kind = KVB_HASH_UINT};
    h.v.u = v;
    return h;
}

/* A store of blocks hs[0..n) under parent (0: none), group g (< 0: none),
 * kind (NULL: none). */
static struct kvb_event *store(struct ev *x, const uint64_t *hs, uint32_t n, uint64_t parent, int g,
                               const char *kind)
{
    memset(x, 0, sizeof(*x));
    for (uint32_t i = 0; i < n; i++) {
        x->h[i] = uh(hs[i]);
        for (uint32_t k = 0; k < 4; k++)
            x->t[i * 4 + k] = (uint32_t)(hs[i] * 4 + k);
    }
    x->e.type = KVB_EV_STORED;
    x->e.hashes = x->h;
    x->e.n_hashes = n;
    x->e.tokens = x->t;
    x->e.n_tokens = n * 4;
    x->e.block_size = (struct kvb_opt_int){true, 4};
    if (parent)
        x->e.parent = uh(parent);
    if (g >= 0)
        x->e.group_idx = (struct kvb_opt_int){true, g};
    x->e.spec_kind = S(kind);
    return &x->e;
}

static struct kvb_event *removal(struct ev *x, const uint64_t *hs, uint32_t n, int g)
{
    memset(x, 0, sizeof(*x));
    for (uint32_t i = 0; i < n; i++)
        x->h[i] = uh(hs[i]);
    x->e.type = KVB_EV_REMOVED;
    x->e.hashes = x->h;
    x->e.n_hashes = n;
    if (g >= 0)
        x->e.group_idx = (struct kvb_opt_int){true, g};
    return &x->e;
}

static struct kvb_rev r;
static int why;

/* 1 (published) or the drop reason, negated minus one: one int to compare */
static int run(const struct kvb_event *e)
{
    why = -1;
    int rc = kvb_convert_event(conv, e, 0, &r, &why);
    ck_assert_int_ge(rc, 0);
    return rc == 1 ? 1 : -1 - why;
}
#define PUB 1
#define DROP(reason) (-1 - (reason))

START_TEST(ownership_locality)
{
    struct ev x;
    const uint64_t h[] = {1};
    struct kvb_event *e = store(&x, h, 1, 0, -1, NULL);
    e->ownership = S("kvcr"); /* zmq_wire: KvEventOwnership::Kvcr, unsupported */
    ck_assert_int_eq(run(e), DROP(KVB_DROP_UNSUPPORTED_OWNERSHIP));
    e->ownership = S("ENGINE");
    ck_assert_int_eq(run(e), DROP(KVB_DROP_UNKNOWN_OWNERSHIP));
    e->ownership = S(NULL);
    e->locality = S("REMOTE");
    ck_assert_int_eq(run(e), DROP(KVB_DROP_NON_LOCAL_LOCALITY));
    e->locality = S("local"); /* case-sensitive */
    ck_assert_int_eq(run(e), DROP(KVB_DROP_NON_LOCAL_LOCALITY));
    e->medium = S("STORAGE"); /* the gate runs before the lower-tier bypass */
    ck_assert_int_eq(run(e), DROP(KVB_DROP_NON_LOCAL_LOCALITY));
    e->medium = S(NULL);
    e->locality = S("LOCAL");
    ck_assert_int_eq(run(e), PUB);
    /* a remove and AllBlocksCleared carry ownership too */
    struct ev y;
    struct kvb_event *d = removal(&y, h, 1, -1);
    d->ownership = S("kvcr");
    ck_assert_int_eq(run(d), DROP(KVB_DROP_UNSUPPORTED_OWNERSHIP));
    struct kvb_event c = {.type = KVB_EV_CLEARED, .ownership = S("kvcr")};
    ck_assert_int_eq(run(&c), DROP(KVB_DROP_UNSUPPORTED_OWNERSHIP));
    struct kvb_event ig = {.type = KVB_EV_IGNORED};
    ck_assert_int_eq(run(&ig), DROP(KVB_DROP_IGNORED_EVENT));
    ck_assert_uint_eq(drops(KVB_DROP_UNSUPPORTED_OWNERSHIP), 3);
    ck_assert_uint_eq(drops(KVB_DROP_NON_LOCAL_LOCALITY), 3);
    ck_assert_uint_eq(kvb_get(&m.events_received_total[KVB_EVT_IGNORED]), 1);
}
END_TEST

/* Disk and external skip the kind and group rules (zmq_wire/mod.rs: the
 * lower-tier bypass); unknown media are dropped. */
START_TEST(lower_tiers_skip_group_rules)
{
    struct ev x;
    const uint64_t h[] = {5};
    struct kvb_event *e = store(&x, h, 1, 0, 3, "mamba");
    e->medium = S("DISK");
    ck_assert_int_eq(run(e), PUB);
    ck_assert_int_eq(r.tier, KVB_TIER_DISK);
    /* and it taught nothing: group 3 is still unlearned on the device */
    e->medium = S(NULL);
    e->spec_kind = S(NULL);
    ck_assert_int_eq(run(e), DROP(KVB_DROP_UNLEARNED_GROUP_IDX));
    e->medium = S("OBJ");
    ck_assert_int_eq(run(e), DROP(KVB_DROP_UNKNOWN_MEDIUM));
}
END_TEST

/* A hybrid model: full attention in group 1, sliding window and mamba in
 * group 0.  Main kinds pass in any group; a kind is learned per group and
 * judges the removes that carry none. */
START_TEST(hybrid_stream)
{
    struct ev x;
    const uint64_t a[] = {10, 11}, b[] = {20};
    ck_assert_int_eq(run(store(&x, a, 2, 0, 1, "full_attention")), PUB);
    ck_assert_int_eq(r.n, 2);
    ck_assert_int_eq(run(store(&x, a, 2, 0, 0, "sliding_window")),
                     DROP(KVB_DROP_NON_MAIN_ATTENTION_KIND));
    ck_assert_int_eq(run(store(&x, b, 1, 0, 0, "mamba")), DROP(KVB_DROP_NON_MAIN_ATTENTION_KIND));
    /* group 0's removes follow its last kind (mamba): dropped */
    ck_assert_int_eq(run(removal(&x, a, 2, 0)), DROP(KVB_DROP_NON_MAIN_ATTENTION_GROUP));
    /* group 1's follow full_attention: published, the copies released */
    ck_assert_int_eq(run(removal(&x, a, 1, 1)), PUB);
    ck_assert_int_eq(r.n, 1);
    ck_assert_uint_eq(r.hashes[0], 10);
    /* an unknown kind drops, and is learned as unknown */
    ck_assert_int_eq(run(store(&x, b, 1, 0, 2, "future_kind")), DROP(KVB_DROP_UNKNOWN_KIND));
    ck_assert_int_eq(run(removal(&x, b, 1, 2)), DROP(KVB_DROP_UNKNOWN_KIND));
    /* a group never seen, other than 0: dropped; an unlearned group 0 passes */
    ck_assert_int_eq(run(removal(&x, b, 1, 5)), DROP(KVB_DROP_UNLEARNED_GROUP_IDX));
    /* a group-0 full-attention store teaches the kind back */
    ck_assert_int_eq(run(store(&x, b, 1, 0, 0, "full_attention")), PUB);
    ck_assert_int_eq(run(removal(&x, b, 1, 0)), PUB);
    /* a remove with its own kind is judged by it */
    struct kvb_event *d = removal(&x, a, 1, 0);
    d->spec_kind = S("sliding_window");
    ck_assert_int_eq(run(d), DROP(KVB_DROP_NON_MAIN_ATTENTION_KIND));
}
END_TEST

/* One hash stored in two groups: two copies; the remove is published when
 * the second goes (vLLM issue 55092; publisher/dedup.rs). */
START_TEST(one_hash_two_groups)
{
    struct ev x;
    const uint64_t h[] = {7}, hh[] = {7, 8};
    ck_assert_int_eq(run(store(&x, h, 1, 0, 0, "full_attention")), PUB);
    ck_assert_int_eq(run(store(&x, h, 1, 0, 1, "full_attention")), PUB);
    ck_assert_int_eq(run(removal(&x, h, 1, 1)), DROP(KVB_DROP_COPIES_REMAIN));
    ck_assert_uint_eq(kvb_get(&m.blocks_held_total[0]), 1);
    /* untracked 8 passes, 7's last copy goes */
    ck_assert_int_eq(run(removal(&x, hh, 2, 0)), PUB);
    ck_assert_int_eq(r.n, 2);
    ck_assert_uint_eq(r.hashes[0], 7);
    ck_assert_uint_eq(r.hashes[1], 8);
    /* a group-0 remove of a hash only group 1 holds takes no copy of group
     * 1's (Dynamo's dedup.rs would, and the router would lose a block the
     * engine holds): held; group 1's own remove releases it */
    ck_assert_int_eq(run(store(&x, h, 1, 0, 1, NULL)), PUB);
    ck_assert_int_eq(run(removal(&x, h, 1, 0)), DROP(KVB_DROP_COPIES_REMAIN));
    ck_assert_int_eq(run(removal(&x, h, 1, 1)), PUB);
}
END_TEST

/* vLLM's kv_cache_report_mode: full re-emits stores of resident blocks:
 * the leading ones are cut (the rest re-parented), a store of nothing new
 * is dropped, and one eviction still releases the block. */
START_TEST(report_full_repeats)
{
    struct ev x;
    const uint64_t ab[] = {1, 2}, abc[] = {1, 2, 3}, a[] = {1};
    ck_assert_int_eq(run(store(&x, ab, 2, 0, 0, NULL)), PUB);
    ck_assert_int_eq(run(store(&x, abc, 3, 0, 0, NULL)), PUB);
    ck_assert_int_eq(r.n, 1);
    ck_assert_uint_eq(r.blocks[0].block_hash, 3);
    ck_assert(r.has_parent);
    ck_assert_uint_eq(r.parent, 2);
    ck_assert_uint_eq(r.blocks[0].tokens_hash, kvb_tokens_hash(x.t + 8, 4, KVB_TOKENS_HASH_SEED));
    ck_assert_int_eq(run(store(&x, a, 1, 0, 0, NULL)), DROP(KVB_DROP_RESIDENT_REPEAT));
    ck_assert_uint_eq(kvb_get(&m.blocks_repeated_total[0]), 3);
    ck_assert_int_eq(run(removal(&x, a, 1, 0)), PUB); /* one copy: released */
    ck_assert_uint_eq(kvb_get(&m.blocks_held_total[0]), 0);
}
END_TEST

/* zmq_wire/convert.rs: a store that names one hash twice, or its parent. */
START_TEST(duplicate_hash)
{
    struct ev x;
    const uint64_t twice[] = {4, 4}, one[] = {4};
    ck_assert_int_eq(run(store(&x, twice, 2, 0, -1, NULL)), DROP(KVB_DROP_DUPLICATE_HASH));
    ck_assert_int_eq(run(store(&x, one, 1, 4, -1, NULL)), DROP(KVB_DROP_DUPLICATE_HASH));
    ck_assert_int_eq(run(store(&x, one, 1, 3, -1, NULL)), PUB);
}
END_TEST

/* The same rule for long stores: up to 64 hashes in a set on the stack
 * (hashes that share their slot probe on), longer ones sorted. */
START_TEST(duplicate_hash_long)
{
    struct ev x;
    uint64_t hs[MAXB];
    for (uint32_t len = 63; len <= 66; len++) {
        /* i << 57 share one multiplicative slot pattern: every probe run is long */
        for (uint32_t i = 0; i < len; i++)
            hs[i] = ((uint64_t)(i + 1) << 57) + 1000 * len;
        hs[len - 1] = hs[len / 2];
        ck_assert_int_eq(run(store(&x, hs, len, 0, -1, NULL)), DROP(KVB_DROP_DUPLICATE_HASH));
        hs[len - 1] = ((uint64_t)len << 57) + 1000 * len;
        ck_assert_int_eq(run(store(&x, hs, len, hs[0], -1, NULL)), DROP(KVB_DROP_DUPLICATE_HASH));
        ck_assert_int_eq(run(store(&x, hs, len, 0, -1, NULL)), PUB);
    }
    for (uint32_t i = 0; i < MAXB; i++)
        hs[i] = 0x5000 + i;
    ck_assert_int_eq(run(store(&x, hs, MAXB, 7, -1, NULL)), PUB);
}
END_TEST

/* A salted conversation whose later stores carry no salt: they inherit the
 * parent's namespace (propagate_cache_namespace); an ambiguous parent drops. */
START_TEST(salted_conversation)
{
    struct ev x;
    const uint64_t t1[] = {30}, t2[] = {31}, t3[] = {32};
    struct kvb_event *e = store(&x, t1, 1, 0, -1, NULL);
    e->cache_salt = S("conv-1");
    uint64_t salted = kvb_salt_seed(NULL, 0, "conv-1", 6);
    ck_assert_int_eq(run(e), PUB);
    ck_assert_uint_eq(r.blocks[0].tokens_hash, kvb_tokens_hash(x.t, 4, salted));
    ck_assert_int_eq(run(store(&x, t2, 1, 30, -1, NULL)), PUB); /* no salt of its own */
    ck_assert_uint_eq(r.blocks[0].tokens_hash, kvb_tokens_hash(x.t, 4, salted));
    ck_assert_int_eq(run(store(&x, t3, 1, 31, -1, NULL)), PUB); /* and its child */
    ck_assert_uint_eq(r.blocks[0].tokens_hash, kvb_tokens_hash(x.t, 4, salted));
    /* 30 stored again without salt: ambiguous; a child without salt drops */
    ck_assert_int_eq(run(store(&x, t1, 1, 0, 1, "full_attention")), PUB);
    ck_assert_int_eq(run(store(&x, t2, 1, 30, -1, NULL)), DROP(KVB_DROP_AMBIGUOUS_CACHE_NAMESPACE));
    /* a remove forgets 31 (and its copy); stored again under its own salt it
     * is hashed under that one, and its child inherits it */
    ck_assert_int_eq(run(removal(&x, t2, 1, -1)), PUB);
    e = store(&x, t2, 1, 30, -1, NULL);
    e->cache_salt = S("conv-2");
    uint64_t salted2 = kvb_salt_seed(NULL, 0, "conv-2", 6);
    ck_assert_int_eq(run(e), PUB);
    ck_assert_uint_eq(r.blocks[0].tokens_hash, kvb_tokens_hash(x.t, 4, salted2));
    ck_assert_int_eq(run(removal(&x, t3, 1, -1)), PUB);
    ck_assert_int_eq(run(store(&x, t3, 1, 31, -1, NULL)), PUB);
    ck_assert_uint_eq(r.blocks[0].tokens_hash, kvb_tokens_hash(x.t, 4, salted2));
    ck_assert_int_eq(run(removal(&x, t3, 1, -1)), PUB);
    /* an unknown parent: unsalted (the configured namespace, here none) */
    ck_assert_int_eq(run(store(&x, t3, 1, 99, -1, NULL)), PUB);
    ck_assert_uint_eq(r.blocks[0].tokens_hash, kvb_tokens_hash(x.t, 4, KVB_TOKENS_HASH_SEED));
}
END_TEST

/* A remove forgets a namespace (unless ambiguous); AllBlocksCleared forgets
 * the pair's namespaces and copies, not its learned kinds. */
START_TEST(cleared_resets)
{
    struct ev x;
    const uint64_t h[] = {7}, c1[] = {8};
    struct kvb_event *e = store(&x, h, 1, 0, 0, "full_attention");
    e->cache_salt = S("s");
    ck_assert_int_eq(run(e), PUB);
    ck_assert_int_eq(run(store(&x, h, 1, 0, 1, "full_attention")), PUB); /* ambiguous now */
    ck_assert_int_eq(run(store(&x, h, 1, 0, 2, "sliding_window")),
                     DROP(KVB_DROP_NON_MAIN_ATTENTION_KIND));
    struct kvb_event c = {.type = KVB_EV_CLEARED};
    ck_assert_int_eq(run(&c), PUB);
    ck_assert_int_eq(r.type, KVB_REVT_CLEARED);
    /* copies gone: one store, one remove publishes */
    ck_assert_int_eq(run(store(&x, h, 1, 0, 0, NULL)), PUB);
    ck_assert_int_eq(run(removal(&x, h, 1, 0)), PUB);
    /* namespaces gone: 7 is no longer ambiguous */
    ck_assert_int_eq(run(store(&x, h, 1, 0, 0, NULL)), PUB);
    ck_assert_int_eq(run(store(&x, c1, 1, 7, 0, NULL)), PUB);
    /* kinds stay: group 2 is still sliding window */
    ck_assert_int_eq(run(removal(&x, h, 1, 2)), DROP(KVB_DROP_NON_MAIN_ATTENTION_GROUP));
    /* kvbridge's own barriers forget the pair too */
    ck_assert_int_eq(run(store(&x, h, 1, 0, 1, NULL)), PUB);
    kvb_converter_forget(conv, 0);
    ck_assert_int_eq(run(removal(&x, h, 1, 0)), PUB);
    ck_assert_uint_eq(kvb_get(&m.tracked_blocks[0]), 0);
}
END_TEST

/* limits.max_tracked_blocks: past it the converter reports the overflow
 * once, the tracker starts again empty, and it is counted. */
START_TEST(tracker_bound)
{
    struct kvb_convert_cfg small = cfg;
    small.max_tracked = 2;
    kvb_converter_set_config(conv, &small);
    struct ev x;
    const uint64_t abc[] = {1, 2, 3};
    ck_assert_int_eq(run(store(&x, abc, 3, 0, 0, NULL)), PUB);
    ck_assert_int_eq(r.n, 3); /* published whole all the same */
    ck_assert(kvb_converter_take_overflow(conv));
    ck_assert(!kvb_converter_take_overflow(conv));
    ck_assert_uint_eq(kvb_get(&m.tracker_overflows_total[0]), 1);
    ck_assert_uint_eq(kvb_get(&m.tracked_blocks[0]), 0);
    /* 0: nothing tracked, never full */
    small.max_tracked = 0;
    kvb_converter_set_config(conv, &small);
    ck_assert_int_eq(run(store(&x, abc, 3, 0, 0, NULL)), PUB);
    ck_assert_int_eq(run(store(&x, abc, 3, 0, 0, NULL)), PUB);
    ck_assert(!kvb_converter_take_overflow(conv));
}
END_TEST

/* The tracker's table alone: many entries in, half out, the rest intact
 * (backward-shift deletion keeps every probe run reachable). */
START_TEST(track_table)
{
    struct kvb_track *t;
    ck_assert_int_eq(kvb_track_create(100000, &t), 0);
    struct kvb_pair p = {1, 0}, q = {1, 1};
    for (uint64_t h = 0; h < 20000; h++)
        ck_assert_int_eq(kvb_track_hold(t, h & 1 ? p : q, 0, h * 0x9e3779b97f4a7c15ULL, 0), 1);
    ck_assert_uint_eq(kvb_track_entries(t), 20000);
    for (uint64_t h = 0; h < 20000; h += 2)
        ck_assert_int_eq(kvb_track_release(t, q, 0, h * 0x9e3779b97f4a7c15ULL, 0), 1);
    ck_assert_uint_eq(kvb_track_entries(t), 10000);
    for (uint64_t h = 1; h < 20000; h += 2)
        ck_assert(kvb_track_holds(t, p, 0, h * 0x9e3779b97f4a7c15ULL, 0));
    /* a tier is its own key; a pair reset leaves the other pair */
    ck_assert(!kvb_track_holds(t, p, 1, 0x9e3779b97f4a7c15ULL, -1));
    ck_assert_int_eq(kvb_track_ns_store(t, q, 5, true, 77, KVB_TIER_DEVICE), 0);
    kvb_track_reset_pair(t, p);
    ck_assert_uint_eq(kvb_track_entries(t), 1);
    uint64_t ns = 0;
    ck_assert_int_eq(kvb_track_ns_get(t, q, 5, &ns), KVB_NS_SET);
    ck_assert_uint_eq(ns, 77);
    ck_assert_int_eq(kvb_track_ns_store(t, q, 5, true, 78, KVB_TIER_DEVICE), 0);
    ck_assert_int_eq(kvb_track_ns_get(t, q, 5, &ns), KVB_NS_AMBIGUOUS);
    kvb_track_ns_remove(t, q, 5, KVB_TIER_DEVICE); /* an ambiguous record stays */
    ck_assert_int_eq(kvb_track_ns_get(t, q, 5, &ns), KVB_NS_AMBIGUOUS);
    kvb_track_destroy(&t);
    ck_assert(t == NULL);
}
END_TEST

/* Per-tier namespace records (zmq_wire/mod.rs, cache_namespace_tiers): a
 * block salted on the device and offloaded to host_pinned keeps its
 * namespace until both tiers removed it; a remove from one tier alone does
 * not forget it. */
START_TEST(namespace_per_tier)
{
    struct kvb_convert_cfg two = cfg;
    two.forward_tiers = (1u << KVB_TIER_DEVICE) | (1u << KVB_TIER_HOST_PINNED);
    kvb_converter_set_config(conv, &two);
    struct ev x;
    const uint64_t a[] = {20}, b[] = {21}, b2[] = {22};
    uint64_t salted = kvb_salt_seed(NULL, 0, "t", 1);
    struct kvb_event *e = store(&x, a, 1, 0, -1, NULL);
    e->cache_salt = S("t");
    ck_assert_int_eq(run(e), PUB);
    e = store(&x, a, 1, 0, -1, NULL);
    e->cache_salt = S("t");
    e->medium = S("CPU");
    ck_assert_int_eq(run(e), PUB);
    ck_assert_int_eq(r.tier, KVB_TIER_HOST_PINNED);
    /* the device copy goes: the CPU copy still records the namespace */
    e = removal(&x, a, 1, -1);
    ck_assert_int_eq(run(e), PUB);
    ck_assert_int_eq(run(store(&x, b, 1, 20, -1, NULL)), PUB);
    ck_assert_uint_eq(r.blocks[0].tokens_hash, kvb_tokens_hash(x.t, 4, salted));
    /* the CPU copy goes too: forgotten, the next child is unsalted */
    e = removal(&x, a, 1, -1);
    e->medium = S("CPU");
    ck_assert_int_eq(run(e), PUB);
    ck_assert_int_eq(run(store(&x, b2, 1, 20, -1, NULL)), PUB);
    ck_assert_uint_eq(r.blocks[0].tokens_hash, kvb_tokens_hash(x.t, 4, KVB_TOKENS_HASH_SEED));
}
END_TEST

/* TierBlocksCleared (vLLM's tier_scoped_clear_events): one tier emptied.
 * Its namespace records and copies of that tier go, the other tier's stay;
 * the router event is a "cleared" scoped to the tier.  An AllBlocksCleared
 * that names a medium is dropped (ambiguous_scoped_clear); a tier clear of
 * an unknown medium or with an ownership is dropped as other events are. */
START_TEST(tier_cleared)
{
    struct kvb_convert_cfg two = cfg;
    two.forward_tiers = (1u << KVB_TIER_DEVICE) | (1u << KVB_TIER_HOST_PINNED);
    kvb_converter_set_config(conv, &two);
    struct ev x;
    const uint64_t a[] = {30}, b[] = {31}, c2[] = {32}, c3[] = {33};
    uint64_t salted = kvb_salt_seed(NULL, 0, "u", 1);
    struct kvb_event *e = store(&x, a, 1, 0, -1, NULL); /* 30 on the device, salted */
    e->cache_salt = S("u");
    ck_assert_int_eq(run(e), PUB);
    e = store(&x, b, 1, 0, -1, NULL); /* 31 on the device and on the CPU, salted */
    e->cache_salt = S("u");
    ck_assert_int_eq(run(e), PUB);
    e->medium = S("CPU");
    ck_assert_int_eq(run(e), PUB);
    ck_assert_uint_eq(kvb_get(&m.tracked_blocks[0]), 2 + 3); /* 2 namespaces, 3 copies */

    struct kvb_event tc = {.type = KVB_EV_TIER_CLEARED, .medium = S("GPU")};
    ck_assert_int_eq(run(&tc), PUB);
    ck_assert_int_eq(r.type, KVB_REVT_CLEARED);
    ck_assert(r.scoped);
    ck_assert_int_eq(r.tier, KVB_TIER_DEVICE);
    ck_assert_uint_eq(kvb_get(&m.events_received_total[KVB_EVT_TIER_CLEARED]), 1);
    /* 30 had only the device: forgotten; 31 still has the CPU: kept */
    ck_assert_uint_eq(kvb_get(&m.tracked_blocks[0]), 1 + 1);
    ck_assert_int_eq(run(store(&x, c2, 1, 30, -1, NULL)), PUB);
    ck_assert_uint_eq(r.blocks[0].tokens_hash, kvb_tokens_hash(x.t, 4, KVB_TOKENS_HASH_SEED));
    ck_assert_int_eq(run(store(&x, c3, 1, 31, -1, NULL)), PUB);
    ck_assert_uint_eq(r.blocks[0].tokens_hash, kvb_tokens_hash(x.t, 4, salted));
    /* the device copies are gone: a device store of 31 is a new copy, and
     * the CPU copy still counts (its remove publishes) */
    e = store(&x, b, 1, 0, -1, NULL);
    e->cache_salt = S("u");
    ck_assert_int_eq(run(e), PUB);
    e = removal(&x, b, 1, -1);
    e->medium = S("CPU");
    ck_assert_int_eq(run(e), PUB);
    ck_assert_int_eq(r.tier, KVB_TIER_HOST_PINNED);

    /* drops */
    tc.medium = S("FS");
    ck_assert_int_eq(run(&tc), DROP(KVB_DROP_UNKNOWN_MEDIUM));
    tc.medium = S("CPU");
    tc.ownership = S("kvcr");
    ck_assert_int_eq(run(&tc), DROP(KVB_DROP_UNSUPPORTED_OWNERSHIP));
    tc.ownership = S(NULL);
    tc.medium = S("DISK"); /* not forwarded here */
    ck_assert_int_eq(run(&tc), DROP(KVB_DROP_TIER_FILTERED));
    struct kvb_event ac = {.type = KVB_EV_CLEARED, .medium = S("GPU")};
    ck_assert_int_eq(run(&ac), DROP(KVB_DROP_AMBIGUOUS_SCOPED_CLEAR));
    ac.medium = S(""); /* an empty medium is none */
    ck_assert_int_eq(run(&ac), PUB);
    ck_assert(!r.scoped);
}
END_TEST

/* The tracker alone: a tier clear erases a namespace record only when no
 * tier is left, ambiguous or not; records that noted no tier (a version-1
 * state file) stay. */
START_TEST(track_clear_tier)
{
    struct kvb_track *t;
    ck_assert_int_eq(kvb_track_create(1000, &t), 0);
    struct kvb_pair p = {1, 0}, q = {2, 0};
    uint64_t ns;
    ck_assert_int_eq(kvb_track_ns_store(t, p, 1, true, 5, KVB_TIER_DEVICE), 0);
    ck_assert_int_eq(kvb_track_ns_store(t, p, 2, true, 5, KVB_TIER_DEVICE), 0);
    ck_assert_int_eq(kvb_track_ns_store(t, p, 2, true, 6, KVB_TIER_HOST_PINNED), 0);
    ck_assert_int_eq(kvb_track_ns_store(t, q, 1, true, 5, KVB_TIER_DEVICE), 0);
    struct kvb_track_rec old = {
        .worker_id = 1, .hash = 3, .val = 5, .what = KVB_TREC_NS, .state = KVB_NS_AMBIGUOUS};
    ck_assert_int_eq(kvb_track_put(t, &old), 0);
    ck_assert_int_eq(kvb_track_hold(t, p, KVB_TIER_DEVICE, 9, 0), 1);
    ck_assert_int_eq(kvb_track_hold(t, p, KVB_TIER_HOST_PINNED, 9, 0), 1);
    kvb_track_ns_clear_tier(t, p, KVB_TIER_DEVICE);
    ck_assert_int_eq(kvb_track_ns_get(t, p, 1, &ns), KVB_NS_NONE);
    ck_assert_int_eq(kvb_track_ns_get(t, p, 2, &ns), KVB_NS_AMBIGUOUS);
    ck_assert_int_eq(kvb_track_ns_get(t, p, 3, &ns), KVB_NS_AMBIGUOUS);
    ck_assert_int_eq(kvb_track_ns_get(t, q, 1, &ns), KVB_NS_SET);
    kvb_track_ns_clear_tier(t, p, KVB_TIER_HOST_PINNED);
    ck_assert_int_eq(kvb_track_ns_get(t, p, 2, &ns), KVB_NS_NONE);
    ck_assert_int_eq(kvb_track_ns_get(t, p, 3, &ns), KVB_NS_AMBIGUOUS);
    kvb_track_reset_tier(t, p, KVB_TIER_DEVICE);
    ck_assert(!kvb_track_holds(t, p, KVB_TIER_DEVICE, 9, -1));
    ck_assert(kvb_track_holds(t, p, KVB_TIER_HOST_PINNED, 9, 0));
    ck_assert_uint_eq(kvb_track_entries(t), 3); /* q's 1, p's old 3, the CPU copy */
    /* a remove from the one tier noted forgets; a record with none noted
     * is forgotten by any remove unless ambiguous */
    ck_assert_int_eq(kvb_track_ns_store(t, p, 4, true, 5, KVB_TIER_HOST_PINNED), 0);
    kvb_track_ns_remove(t, p, 4, KVB_TIER_DEVICE);
    ck_assert_int_eq(kvb_track_ns_get(t, p, 4, &ns), KVB_NS_SET);
    kvb_track_ns_remove(t, p, 4, KVB_TIER_HOST_PINNED);
    ck_assert_int_eq(kvb_track_ns_get(t, p, 4, &ns), KVB_NS_NONE);
    kvb_track_destroy(&t);
}
END_TEST

/* A held block after a new one in a store: published again (the store is a
 * chain: cutting it would hang the next block under the wrong parent, and
 * Dynamo's dedup.rs passes every store whole; the router's store of a block
 * it holds changes nothing), but no second copy: one remove releases it. */
START_TEST(middle_repeat)
{
    struct ev x;
    const uint64_t ab[] = {1, 2}, cad[] = {3, 1, 4}, a[] = {1}, cd[] = {3, 4};
    ck_assert_int_eq(run(store(&x, ab, 2, 0, 0, NULL)), PUB);
    ck_assert_int_eq(run(store(&x, cad, 3, 0, 0, NULL)), PUB);
    ck_assert_int_eq(r.n, 3);
    ck_assert_uint_eq(r.blocks[0].block_hash, 3);
    ck_assert_uint_eq(r.blocks[1].block_hash, 1);
    ck_assert_uint_eq(r.blocks[2].block_hash, 4);
    ck_assert(!r.has_parent);
    ck_assert_uint_eq(kvb_get(&m.blocks_repeated_total[0]), 0); /* none cut */
    ck_assert_int_eq(run(removal(&x, a, 1, 0)), PUB);           /* its only copy */
    ck_assert_int_eq(r.n, 1);
    ck_assert_uint_eq(r.hashes[0], 1);
    ck_assert_uint_eq(kvb_get(&m.blocks_held_total[0]), 0);
    ck_assert_int_eq(run(removal(&x, cd, 2, 0)), PUB);
    ck_assert_int_eq(r.n, 2);
    ck_assert_uint_eq(kvb_get(&m.tracked_blocks[0]), 1); /* 2, not released */
}
END_TEST

/* A stream cut by a restart with state.dir: the tracker saved with the
 * cursors (kvbridge.state) and restored decides the rest as the uncut
 * stream does; a fresh tracker (no restore) does not. */
#define CUT_EVENTS 10
static struct kvb_event *cut_event(struct ev *x, int i)
{
    static const uint64_t a[] = {40, 41}, b[] = {50}, c[] = {41}, d[] = {60};
    struct kvb_event *e;
    switch (i) {
    case 0: return store(x, a, 2, 0, 1, "full_attention");
    case 1: return store(x, a, 2, 0, 2, "full_attention"); /* a second copy */
    case 2: return store(x, b, 1, 0, 3, "sliding_window"); /* learned: OTHER */
    case 3:
        e = store(x, d, 1, 0, -1, NULL);
        e->cache_salt = S("conv-9");
        return e;
    /* the restart comes here */
    case 4: return removal(x, c, 1, 1);          /* group 2 still holds 41 */
    case 5: return removal(x, b, 1, 3);          /* group 3: not main */
    case 6: return store(x, b, 1, 60, -1, NULL); /* inherits conv-9 */
    case 7: return removal(x, c, 1, 2);          /* the last copy */
    case 8: return removal(x, a, 1, 2);          /* 40: group 1 still holds it */
    default: return removal(x, a, 1, 1);
    }
}

struct outcome {
    int rc;
    uint32_t n;
    uint64_t first; /* hash removed, or tokens_hash stored */
};

static struct outcome run_one(int i)
{
    struct ev x;
    struct outcome o = {run(cut_event(&x, i)), 0, 0};
    if (o.rc == PUB) {
        o.n = r.n;
        o.first = r.type == KVB_REVT_REMOVED ? r.hashes[0] : r.blocks[0].tokens_hash;
    }
    return o;
}

static void add_rec(void *ctx, const struct kvb_track_rec *t)
{
    ck_assert_int_eq(kvb_state_add_track(ctx, t), 0);
}

START_TEST(track_survives_restart)
{
    struct outcome uncut[CUT_EVENTS], resumed[CUT_EVENTS], fresh[CUT_EVENTS];
    for (int i = 0; i < CUT_EVENTS; i++)
        uncut[i] = run_one(i);
    char dir[] = "/tmp/kvb-relay.XXXXXX", path[64];
    ck_assert(mkdtemp(dir) != NULL);
    for (int pass = 0; pass < 2; pass++) {
        kvb_converter_destroy(&conv);
        ck_assert_int_eq(kvb_converter_create(&cfg, &m, &conv), 0);
        for (int i = 0; i < 4; i++)
            ck_assert_int_eq(run_one(i).rc, uncut[i].rc);
        struct kvb_state *st = kvb_state_new(), *back = NULL;
        kvb_converter_track_foreach(conv, add_rec, st);
        ck_assert_uint_gt(st->n_track, 0);
        ck_assert_int_eq(kvb_state_save(dir, st), 0);
        ck_assert_int_eq(kvb_state_load(dir, &back), 0);
        ck_assert_uint_eq(back->n_track, st->n_track);
        kvb_converter_destroy(&conv); /* the restart */
        ck_assert_int_eq(kvb_converter_create(&cfg, &m, &conv), 0);
        for (size_t i = 0; pass == 0 && i < back->n_track; i++)
            ck_assert_int_eq(kvb_converter_track_restore(conv, &back->track[i]), 0);
        for (int i = 4; i < CUT_EVENTS; i++)
            (pass == 0 ? resumed : fresh)[i] = run_one(i);
        kvb_state_free(&st);
        kvb_state_free(&back);
    }
    bool differs = false;
    for (int i = 4; i < CUT_EVENTS; i++) {
        ck_assert_msg(resumed[i].rc == uncut[i].rc && resumed[i].n == uncut[i].n &&
                          resumed[i].first == uncut[i].first,
                      "event %d: uncut %d/%u/%llx, resumed %d/%u/%llx", i, uncut[i].rc, uncut[i].n,
                      (unsigned long long)uncut[i].first, resumed[i].rc, resumed[i].n,
                      (unsigned long long)resumed[i].first);
        differs |= fresh[i].rc != uncut[i].rc || fresh[i].first != uncut[i].first;
    }
    ck_assert_msg(differs, "a fresh tracker decided as the restored one: the test shows nothing");
    /* the expected decisions themselves */
    ck_assert_int_eq(uncut[4].rc, DROP(KVB_DROP_COPIES_REMAIN));
    ck_assert_int_eq(uncut[5].rc, DROP(KVB_DROP_NON_MAIN_ATTENTION_GROUP));
    ck_assert_int_eq(uncut[6].rc, PUB);
    ck_assert_int_eq(uncut[7].rc, PUB);
    ck_assert_uint_eq(uncut[7].first, 41);
    ck_assert_int_eq(uncut[8].rc, DROP(KVB_DROP_COPIES_REMAIN));
    ck_assert_int_eq(uncut[9].rc, PUB);
    snprintf(path, sizeof(path), "%s/kvbridge.state", dir);
    unlink(path);
    rmdir(dir);
}
END_TEST

static Suite *relay_suite(void)
{
    Suite *s = suite_create("relay");
    TCase *tc = tcase_create("relay");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, ownership_locality);
    tcase_add_test(tc, lower_tiers_skip_group_rules);
    tcase_add_test(tc, hybrid_stream);
    tcase_add_test(tc, one_hash_two_groups);
    tcase_add_test(tc, report_full_repeats);
    tcase_add_test(tc, middle_repeat);
    tcase_add_test(tc, duplicate_hash);
    tcase_add_test(tc, duplicate_hash_long);
    tcase_add_test(tc, salted_conversation);
    tcase_add_test(tc, cleared_resets);
    tcase_add_test(tc, tracker_bound);
    tcase_add_test(tc, track_table);
    tcase_add_test(tc, namespace_per_tier);
    tcase_add_test(tc, tier_cleared);
    tcase_add_test(tc, track_clear_tier);
    tcase_add_test(tc, track_survives_restart);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return kvb_run_suite(relay_suite()); }
