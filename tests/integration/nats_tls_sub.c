/* nats_tls_sub: a minimal NATS subscriber for test_nats_security.sh, for
 * servers that want TLS with a client certificate (tools/kvtail only takes a
 * URL).  Built by the test itself:
 *   gcc -o nats_tls_sub nats_tls_sub.c $(pkg-config --cflags --libs libnats)
 *
 *   nats_tls_sub URL CA CERT KEY SUBJECT READY_FILE IDLE_MS
 *
 * Connects over TLS (verifying the server with CA, presenting CERT/KEY),
 * subscribes to SUBJECT, creates READY_FILE once the server has the
 * subscription, then receives until IDLE_MS pass without a message (or 20 s
 * with none).  Prints the first message, then "messages=N".  Exit 0, or 2
 * when it cannot connect (nats.c's error on stderr).
 */
#include <stdio.h>
#include <stdlib.h>

#include <nats/nats.h>

int main(int argc, char **argv)
{
    natsOptions *o = NULL;
    natsConnection *nc = NULL;
    natsSubscription *sub = NULL;
    natsMsg *msg = NULL;
    natsStatus st;
    long n = 0;

    if (argc != 8) {
        fprintf(stderr, "usage: nats_tls_sub URL CA CERT KEY SUBJECT READY_FILE IDLE_MS\n");
        return 2;
    }
    int64_t idle = atoll(argv[7]);
    st = natsOptions_Create(&o);
    if (st == NATS_OK)
        st = natsOptions_SetURL(o, argv[1]);
    if (st == NATS_OK)
        st = natsOptions_SetSecure(o, true);
    if (st == NATS_OK)
        st = natsOptions_LoadCATrustedCertificates(o, argv[2]);
    if (st == NATS_OK)
        st = natsOptions_LoadCertificatesChain(o, argv[3], argv[4]);
    if (st == NATS_OK)
        st = natsConnection_Connect(&nc, o);
    if (st == NATS_OK)
        st = natsConnection_SubscribeSync(&sub, nc, argv[5]);
    if (st == NATS_OK)
        st = natsConnection_FlushTimeout(nc, 5000);
    if (st != NATS_OK) {
        fprintf(stderr, "nats_tls_sub: %s: %s\n", natsStatus_GetText(st), nats_GetLastError(NULL));
        natsSubscription_Destroy(sub);
        natsConnection_Destroy(nc);
        natsOptions_Destroy(o);
        nats_Close();
        return 2;
    }
    FILE *f = fopen(argv[6], "w");
    if (f)
        fclose(f);
    while (natsSubscription_NextMsg(&msg, sub, n ? idle : 20000) == NATS_OK) {
        if (n++ == 0)
            printf("%.*s\n", natsMsg_GetDataLength(msg), natsMsg_GetData(msg));
        natsMsg_Destroy(msg);
    }
    printf("messages=%ld\n", n);
    natsSubscription_Destroy(sub);
    natsConnection_Destroy(nc);
    natsOptions_Destroy(o);
    nats_Close();
    return 0;
}
