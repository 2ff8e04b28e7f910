/* sink options: the natsOptions a sink connects with (servers, name,
 * timeouts, reconnect, reconnect buffer), authentication and TLS.  See
 * sink_priv.h for the parts of the sink; this file holds no lock: it runs in
 * create, before any thread uses the options.
 *
 * Authentication (config.h: at most one method): user + password
 * (natsOptions_SetUserInfo), token (SetToken), NKey (SetNKey with the public
 * key the config derived from the seed, and a callback signing the server's
 * nonce with nats_Sign(seed): the seed stays in this process's memory, never
 * in a file; natsOptions_SetNKeyFromSeed would need it in a file), .creds
 * file (SetUserCredentialsFromFiles).  TLS: SetSecure, the CA file (else
 * OpenSSL's default trust store), the client chain, SkipServerVerification
 * when verify is off, SetExpectedHostname.  nats.c keeps its own copies of
 * the password and token and frees them without zeroing.
 */
#include "sink_priv.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "config.h"

/* Called by nats.c after each full pass over the server list that failed. */
static int64_t reconnect_delay(natsConnection *nc, int attempts, void *closure)
{
    struct kvb_sink *s = closure;
    (void)nc;
    uint64_t d = kvb_sink_backoff_ms(s, attempts, &s->rng);
    kvb_sink_guard_attempt(s, kvb_mono_ms() + d); /* nats.c sleeps D, then attempts */
    return (int64_t)d;
}

/* NKey authentication: sign the server's nonce with the seed (nats.c frees
 * the signature). */
static natsStatus sign_nonce(char **custom_err, unsigned char **sig, int *sig_len,
                             const char *nonce, void *closure)
{
    struct kvb_sink *s = closure;
    (void)custom_err;
    return nats_Sign(s->seed, nonce, sig, sig_len);
}

static bool set(const char *v) { return v && *v; }

/* Authentication and TLS (the config allows one method at most). */
static natsStatus set_security(struct kvb_sink *s, const struct kvb_config *cfg)
{
    natsOptions *o = s->opts;
    natsStatus st = NATS_OK;
    const char *what = "authentication";

    if (set(cfg->nats.user)) {
        st = natsOptions_SetUserInfo(o, cfg->nats.user, cfg->nats.password);
    } else if (set(cfg->nats.token)) {
        st = natsOptions_SetToken(o, cfg->nats.token);
    } else if (set(cfg->nats.nkey_seed) && set(cfg->nats.nkey_public)) {
        if (!(s->seed = strdup(cfg->nats.nkey_seed)))
            return NATS_NO_MEMORY;
        st = natsOptions_SetNKey(o, cfg->nats.nkey_public, sign_nonce, s);
    } else if (set(cfg->nats.credentials)) {
        st = natsOptions_SetUserCredentialsFromFiles(o, cfg->nats.credentials, NULL);
    }
    if (st == NATS_OK && cfg->nats.tls.enabled) {
        what = "TLS";
        st = natsOptions_SetSecure(o, true);
        if (st == NATS_OK && set(cfg->nats.tls.ca))
            st = natsOptions_LoadCATrustedCertificates(o, cfg->nats.tls.ca);
        if (st == NATS_OK && set(cfg->nats.tls.cert))
            st = natsOptions_LoadCertificatesChain(o, cfg->nats.tls.cert, cfg->nats.tls.key);
        if (st == NATS_OK && !cfg->nats.tls.verify)
            st = natsOptions_SkipServerVerification(o, true);
        if (st == NATS_OK && set(cfg->nats.tls.server_name))
            st = natsOptions_SetExpectedHostname(o, cfg->nats.tls.server_name);
    }
    if (st != NATS_OK) {
        char why[512];
        kvb_sink_last_error(st, why, sizeof(why));
        kvb_err(STAGE, "NATS %s options: %s", what, why);
    }
    return st;
}

natsStatus kvb_sink_set_options(struct kvb_sink *s, const struct kvb_config *cfg)
{
    natsOptions *o = s->opts;
    natsStatus st;
    uint64_t rbuf = cfg->nats.reconnect_buffer_bytes;
    int64_t attempt_ms = CONNECT_ATTEMPT_MS;

    if (cfg->nats.connect_timeout_ms > 0 && cfg->nats.connect_timeout_ms < attempt_ms)
        attempt_ms = cfg->nats.connect_timeout_ms;
    if (rbuf > INT_MAX)
        rbuf = INT_MAX;

    st = natsOptions_SetServers(o, (const char **)cfg->nats.servers, (int)cfg->nats.n_servers);
    if (st == NATS_OK) /* credentials go only to the servers configured */
        st = natsOptions_SetIgnoreDiscoveredServers(o, !cfg->nats.discovered_servers);
    if (st == NATS_OK)
        st = natsOptions_SetName(o, "kvbridge");
    if (st == NATS_OK)
        st = natsOptions_SetTimeout(o, attempt_ms);
    if (st == NATS_OK)
        st = natsOptions_SetAllowReconnect(o, true);
    if (st == NATS_OK)
        st = natsOptions_SetMaxReconnect(o, -1); /* forever */
    if (st == NATS_OK)
        st = natsOptions_SetCustomReconnectDelay(o, reconnect_delay, s);
    if (st == NATS_OK) /* 0 = nats.c's default (8 MiB) */
        st = natsOptions_SetReconnectBufSize(o, (int)rbuf);
    if (st == NATS_OK)
        st = set_security(s, cfg);
    return st;
}
