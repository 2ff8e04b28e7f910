/* js_check: reads a JetStream stream kvbridge published to, message by
 * message (js_GetMsg by sequence), and checks what a consumer would get:
 *   - every message has a Nats-Msg-Id {worker_id}.{dp_rank}.{epoch}.{event_id}
 *     that agrees with its payload, and no id is stored twice;
 *   - per (worker_id, dp_rank, epoch) the event_ids form one run without holes
 *     or repeats (reorders, an event_id below one stored before it, are
 *     counted apart: a resent publish may land after later ones).
 * Compiled by the integration tests that use it (gcc ... -lnats).
 *
 *   js_check --server URL --stream NAME [--dump FILE] [--wait-msgs N [--wait-ms MS]]
 *            [--info 1] [--leader NODE]
 *
 * Prints (stdout):
 *   stream: name=S subjects=A[,B] retention=limits max_age_s=N replicas=N duplicates_s=N
 *           msgs=N first_seq=N last_seq=N
 *   cluster: leader=NODE replicas=NODE[,NODE(behind)]     (clustered streams)
 *   jscheck: messages=N missing_seqs=N no_id=N bad_id=N dup_ids=N pairs=N epochs=N
 *            holes=N dup_events=N reorders=N not_from_zero=N stored=N removed=N cleared=N
 * (each on one line).  --dump writes each payload, in stream order, one per line.
 * --info 1: only the stream (and cluster) lines.  --leader NODE: first have
 * the stream's leader step down until NODE leads it (clustered streams).  --wait-msgs: first wait (up to --wait-ms, default 10000) until the stream
 * holds at least N messages.  Exit 0 when it could read the stream, 2 otherwise. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nats/nats.h>

struct rec {
    uint64_t w, r, e, id; /* from the payload; e from the Nats-Msg-Id */
    uint64_t seq;
    char msgid[96];
};

static int cmp_str(const void *a, const void *b)
{
    return strcmp(((const struct rec *)a)->msgid, ((const struct rec *)b)->msgid);
}

static int cmp_pair(const void *a, const void *b)
{
    const struct rec *x = a, *y = b;
    uint64_t kx[4] = {x->w, x->r, x->e, x->id}, ky[4] = {y->w, y->r, y->e, y->id};
    for (int i = 0; i < 4; i++)
        if (kx[i] != ky[i])
            return kx[i] < ky[i] ? -1 : 1;
    return 0;
}

/* The unsigned number after KEY in the JSON text, or false. */
static bool json_u64(const char *d, int n, const char *key, uint64_t *out)
{
    size_t kl = strlen(key);
    for (int i = 0; i + (int)kl < n; i++) {
        if (memcmp(d + i, key, kl) != 0)
            continue;
        int j = i + (int)kl;
        if (j >= n || d[j] < '0' || d[j] > '9')
            return false;
        uint64_t v = 0;
        while (j < n && d[j] >= '0' && d[j] <= '9')
            v = v * 10 + (uint64_t)(d[j++] - '0');
        *out = v;
        return true;
    }
    return false;
}

static bool contains(const char *d, int n, const char *s)
{
    size_t l = strlen(s);
    for (int i = 0; i + (int)l <= n; i++)
        if (memcmp(d + i, s, l) == 0)
            return true;
    return false;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int main(int argc, char **argv)
{
    const char *url = "nats://127.0.0.1:4222", *stream = NULL, *dump = NULL;
    uint64_t wait_msgs = 0, wait_ms = 10000;
    bool info_only = false;
    const char *want_leader = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--server"))
            url = argv[i + 1];
        else if (!strcmp(argv[i], "--stream"))
            stream = argv[i + 1];
        else if (!strcmp(argv[i], "--dump"))
            dump = argv[i + 1];
        else if (!strcmp(argv[i], "--wait-msgs"))
            wait_msgs = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--wait-ms"))
            wait_ms = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--info"))
            info_only = !strcmp(argv[i + 1], "1");
        else if (!strcmp(argv[i], "--leader"))
            want_leader = argv[i + 1];
        else {
            fprintf(stderr, "js_check: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (!stream) {
        fprintf(stderr, "usage: js_check --server URL --stream NAME [--dump FILE]\n");
        return 2;
    }
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    jsStreamInfo *si = NULL;
    jsErrCode ec = 0;
    natsStatus st = natsConnection_ConnectTo(&nc, url);
    if (st == NATS_OK)
        st = natsConnection_JetStream(&js, nc, NULL);
    uint64_t deadline = now_ms() + wait_ms;
    for (;;) {
        if (st == NATS_OK)
            st = js_GetStreamInfo(&si, js, stream, NULL, &ec);
        if (st != NATS_OK || !wait_msgs || si->State.Msgs >= wait_msgs || now_ms() >= deadline)
            break;
        jsStreamInfo_Destroy(si);
        si = NULL;
        nats_Sleep(100);
    }
    /* --leader NODE: ask the stream's leader to step down until NODE leads */
    for (int tries = 0; st == NATS_OK && want_leader && tries < 20; tries++) {
        const char *l = si->Cluster && si->Cluster->Leader ? si->Cluster->Leader : "";
        if (!strcmp(l, want_leader))
            break;
        char subj[512];
        natsMsg *reply = NULL;
        snprintf(subj, sizeof subj, "$JS.API.STREAM.LEADER.STEPDOWN.%s", stream);
        if (*l)
            natsConnection_Request(&reply, nc, subj, "", 0, 5000);
        natsMsg_Destroy(reply);
        nats_Sleep(500);
        jsStreamInfo_Destroy(si);
        si = NULL;
        do {
            st = js_GetStreamInfo(&si, js, stream, NULL, &ec);
        } while (st != NATS_OK && ++tries < 20 && (nats_Sleep(200), 1));
    }
    if (st != NATS_OK) {
        fprintf(stderr, "js_check: %s: stream %s: %s (error %d)\n", url, stream,
                natsStatus_GetText(st), (int)ec);
        return 2;
    }
    const jsStreamConfig *c = si->Config;
    static const char *ret[] = {"limits", "interest", "workqueue"};
    printf("stream: name=%s subjects=", c->Name);
    for (int i = 0; i < c->SubjectsLen; i++)
        printf("%s%s", i ? "," : "", c->Subjects[i]);
    printf(" retention=%s max_age_s=%" PRId64 " replicas=%" PRId64 " duplicates_s=%" PRId64
           " msgs=%" PRIu64 " first_seq=%" PRIu64 " last_seq=%" PRIu64 "\n",
           (int)c->Retention >= 0 && (int)c->Retention < 3 ? ret[c->Retention] : "?",
           (int64_t)(c->MaxAge / 1000000000LL), (int64_t)c->Replicas,
           (int64_t)(c->Duplicates / 1000000000LL), si->State.Msgs, si->State.FirstSeq,
           si->State.LastSeq);
    if (si->Cluster) {
        printf("cluster: leader=%s replicas=", si->Cluster->Leader ? si->Cluster->Leader : "none");
        for (int i = 0; i < si->Cluster->ReplicasLen; i++)
            printf("%s%s%s", i ? "," : "", si->Cluster->Replicas[i]->Name,
                   si->Cluster->Replicas[i]->Current ? "" : "(behind)");
        printf("\n");
    }
    fflush(stdout);
    if (info_only) {
        jsStreamInfo_Destroy(si);
        jsCtx_Destroy(js);
        natsConnection_Destroy(nc);
        nats_Close();
        return 0;
    }

    uint64_t first = si->State.FirstSeq, last = si->State.LastSeq;
    size_t cap = last >= first && si->State.Msgs ? (size_t)(last - first + 1) : 1;
    struct rec *r = calloc(cap, sizeof(*r));
    FILE *df = dump ? fopen(dump, "w") : NULL;
    if (!r || (dump && !df)) {
        fprintf(stderr, "js_check: out of memory or cannot write %s\n", dump ? dump : "");
        return 2;
    }
    size_t n = 0;
    uint64_t missing = 0, no_id = 0, bad_id = 0, stored = 0, removed = 0, cleared = 0;
    /* One subject: read the stream with an ordered consumer (a message after
     * another, no request per message: a soak's million messages in seconds);
     * else (or if it cannot be made) one request per seq. */
    natsSubscription *osub = NULL;
    natsMsg *pend = NULL; /* the consumer's next message, and its stream seq */
    uint64_t pseq = 0;
    if (si->State.Msgs && c->SubjectsLen == 1) {
        jsSubOptions so;
        jsSubOptions_Init(&so);
        so.Stream = stream;
        so.Ordered = true;
        so.Config.DeliverPolicy = js_DeliverAll;
        if (js_SubscribeSync(&osub, js, c->Subjects[0], NULL, &so, &ec) != NATS_OK)
            osub = NULL;
    }
    for (uint64_t seq = first; si->State.Msgs && seq <= last; seq++) {
        natsMsg *m = NULL;
        int tries = 0;
        if (osub) {
            if (!pend) {
                jsMsgMetaData *md = NULL;
                st = natsSubscription_NextMsg(&pend, osub, 20000);
                if (st == NATS_OK && natsMsg_GetMetaData(&md, pend) == NATS_OK) {
                    pseq = md->Sequence.Stream;
                    jsMsgMetaData_Destroy(md);
                } else if (st == NATS_OK) {
                    st = NATS_ERR;
                }
                if (st != NATS_OK) {
                    fprintf(stderr, "js_check: seq %" PRIu64 ": consumer: %s\n", seq,
                            natsStatus_GetText(st));
                    return 2;
                }
            }
            if (pseq > seq) { /* not in the stream */
                missing++;
                continue;
            }
            m = pend;
            pend = NULL;
            st = NATS_OK;
            goto got;
        }
        /* a timeout, or no leader yet (no responders, JetStream error 10008
         * "cluster temporarily unavailable"): an election; try for 20 s */
        for (;;) {
            ec = 0;
            st = js_GetMsg(&m, js, stream, seq, NULL, &ec);
            bool again =
                st == NATS_TIMEOUT || st == NATS_NO_RESPONDERS || (st == NATS_ERR && ec == 10008);
            if (!again || ++tries >= 100)
                break;
            nats_Sleep(200);
        }
        if (st == NATS_NOT_FOUND) {
            missing++;
            continue;
        }
        if (st != NATS_OK) {
            fprintf(stderr, "js_check: seq %" PRIu64 ": %s (error %d)\n", seq,
                    natsStatus_GetText(st), (int)ec);
            return 2;
        }
    got:;
        const char *d = natsMsg_GetData(m);
        int dl = natsMsg_GetDataLength(m);
        if (df) {
            fwrite(d, 1, (size_t)dl, df);
            fputc('\n', df);
        }
        struct rec *x = &r[n];
        x->seq = seq;
        bool ok = json_u64(d, dl, "\"worker_id\":", &x->w) &&
                  json_u64(d, dl, "\"event_id\":", &x->id) &&
                  json_u64(d, dl, "\"dp_rank\":", &x->r);
        if (contains(d, dl, "\"data\":{\"stored\""))
            stored++;
        else if (contains(d, dl, "\"data\":{\"removed\""))
            removed++;
        else if (contains(d, dl, "\"data\":\"cleared\""))
            cleared++;
        const char *id = NULL;
        if (natsMsgHeader_Get(m, "Nats-Msg-Id", &id) != NATS_OK || !id) {
            no_id++;
        } else {
            uint64_t v[4] = {0};
            int k = 0;
            const char *p = id;
            for (; k < 4; k++) {
                if (*p < '0' || *p > '9')
                    break;
                while (*p >= '0' && *p <= '9')
                    v[k] = v[k] * 10 + (uint64_t)(*p++ - '0');
                if (k < 3 && *p++ != '.')
                    break;
            }
            if (!ok || k != 4 || *p || v[0] != x->w || v[1] != x->r || v[3] != x->id ||
                strlen(id) >= sizeof(x->msgid)) {
                bad_id++;
                if (bad_id <= 3)
                    fprintf(stderr, "js_check: seq %" PRIu64 ": id %s does not match %.*s\n", seq,
                            id, dl > 200 ? 200 : dl, d);
            } else {
                x->e = v[2];
                strcpy(x->msgid, id);
                n++;
            }
        }
        natsMsg_Destroy(m);
    }
    if (df)
        fclose(df);
    natsMsg_Destroy(pend);
    natsSubscription_Destroy(osub);

    /* reorders: in stream order, an event_id below the highest seen for its pair */
    uint64_t reorders = 0;
    {
        struct {
            uint64_t w, r, e, max;
        } pairs[256];
        size_t np = 0;
        for (size_t i = 0; i < n; i++) {
            size_t k = 0;
            while (k < np &&
                   !(pairs[k].w == r[i].w && pairs[k].r == r[i].r && pairs[k].e == r[i].e))
                k++;
            if (k == np && np < 256) {
                pairs[np].w = r[i].w;
                pairs[np].r = r[i].r;
                pairs[np].e = r[i].e;
                pairs[np].max = r[i].id;
                np++;
                continue;
            }
            if (k == np)
                continue;
            if (r[i].id < pairs[k].max)
                reorders++;
            else
                pairs[k].max = r[i].id;
        }
    }
    /* ids stored twice */
    uint64_t dup_ids = 0;
    qsort(r, n, sizeof(*r), cmp_str);
    for (size_t i = 1; i < n; i++)
        if (!strcmp(r[i].msgid, r[i - 1].msgid)) {
            dup_ids++;
            if (dup_ids <= 3)
                fprintf(stderr, "js_check: id %s stored twice (seqs %" PRIu64 ", %" PRIu64 ")\n",
                        r[i].msgid, r[i - 1].seq, r[i].seq);
        }
    /* per (worker, rank, epoch): one run of event_ids */
    uint64_t pairs = 0, holes = 0, dup_events = 0, not_zero = 0;
    qsort(r, n, sizeof(*r), cmp_pair);
    for (size_t i = 0; i < n; i++) {
        bool first_of =
            i == 0 || r[i].w != r[i - 1].w || r[i].r != r[i - 1].r || r[i].e != r[i - 1].e;
        if (first_of) {
            pairs++;
            if (r[i].id != 0)
                not_zero++;
            continue;
        }
        if (r[i].id == r[i - 1].id)
            dup_events++;
        else if (r[i].id != r[i - 1].id + 1) {
            holes += r[i].id - r[i - 1].id - 1;
            if (holes <= 3)
                fprintf(stderr,
                        "js_check: hole: %" PRIu64 ".%" PRIu64 ".%" PRIu64 " event_ids %" PRIu64
                        "..%" PRIu64 " missing\n",
                        r[i].w, r[i].r, r[i].e, r[i - 1].id + 1, r[i].id - 1);
        }
    }
    uint64_t epochs = 0;
    for (size_t i = 0; i < n; i++)
        if (i == 0 || r[i].e != r[i - 1].e)
            epochs++; /* distinct per pair; enough for one worker, one rank */
    printf("jscheck: messages=%zu missing_seqs=%" PRIu64 " no_id=%" PRIu64 " bad_id=%" PRIu64
           " dup_ids=%" PRIu64 " pairs=%" PRIu64 " epochs=%" PRIu64 " holes=%" PRIu64
           " dup_events=%" PRIu64 " reorders=%" PRIu64 " not_from_zero=%" PRIu64 " stored=%" PRIu64
           " removed=%" PRIu64 " cleared=%" PRIu64 "\n",
           n + no_id + bad_id, missing, no_id, bad_id, dup_ids, pairs, epochs, holes, dup_events,
           reorders, not_zero, stored, removed, cleared);
    free(r);
    jsStreamInfo_Destroy(si);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    nats_Close();
    return 0;
}
