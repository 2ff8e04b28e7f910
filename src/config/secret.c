/* secret: see src/config/secret.h. */
#include "secret.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <zmq.h>

/* ------------------------------------------------------------------------ */
/* Files                                                                     */

static char *dup_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *dup_printf(const char *fmt, ...)
{
    char *s = NULL;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    va_end(ap);
    return s;
}

char *kvb_secret_path(const char *name, const char *creds_dir, const char *config_path)
{
    if (name[0] == '/')
        return strdup(name);
    if (creds_dir && *creds_dir) {
        size_t n = strlen(creds_dir);
        return dup_printf("%s%s%s", creds_dir, creds_dir[n - 1] == '/' ? "" : "/", name);
    }
    const char *slash = strrchr(config_path, '/');
    if (!slash)
        return strdup(name);
    return dup_printf("%.*s/%s", (int)(slash - config_path), config_path, name);
}

int kvb_secret_open(const char *path)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return -errno;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return -EINVAL;
    }
    return fd;
}

int kvb_secret_read_fd(int fd, unsigned flags, char **out, const char **why)
{
    int rc = -EINVAL;
    size_t len = 0;
    bool trim = flags & KVB_SECRET_TRIM;
    char *buf = malloc(KVB_SECRET_MAX_BYTES + 1);
    *why = NULL;
    if (!buf)
        return -ENOMEM;
    for (;;) {
        ssize_t r = read(fd, buf + len, KVB_SECRET_MAX_BYTES + 1 - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = -errno;
            *why = strerror(errno);
            break;
        }
        len += (size_t)r;
        if (r == 0 || len > KVB_SECRET_MAX_BYTES)
            break;
    }
    bool big = len > KVB_SECRET_MAX_BYTES;
    size_t start = 0;
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r' ||
                       (trim && (buf[len - 1] == ' ' || buf[len - 1] == '\t'))))
        len--;
    while (trim && start < len &&
           (buf[start] == ' ' || buf[start] == '\t' || buf[start] == '\r' || buf[start] == '\n'))
        start++;
    if (*why)
        goto out;
    if (big)
        *why = "it is larger than 65536 bytes";
    else if (memchr(buf + start, '\0', len - start))
        *why = "it contains a NUL byte";
    else if (start == len)
        *why = "it is empty";
    else if ((flags & KVB_SECRET_ONE_LINE) &&
             (memchr(buf + start, '\n', len - start) || memchr(buf + start, '\r', len - start)))
        *why = "it has more than one line (only a trailing line end is dropped)";
    if (*why)
        goto out;
    if (!(*out = malloc(len - start + 1))) {
        rc = -ENOMEM;
        goto out;
    }
    memcpy(*out, buf + start, len - start);
    (*out)[len - start] = '\0';
    rc = 0;
out:
    explicit_bzero(buf, KVB_SECRET_MAX_BYTES + 1);
    free(buf);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* ZMQ CURVE keys                                                            */

bool kvb_secret_z85_key(const char *s, size_t len, uint8_t out[32])
{
    char buf[KVB_Z85_KEY_CHARS + 1];
    if (len != KVB_Z85_KEY_CHARS)
        return false;
    memcpy(buf, s, len);
    buf[len] = '\0';
    bool ok = zmq_z85_decode(out, buf) != NULL;
    explicit_bzero(buf, sizeof buf);
    return ok;
}

/* ('#' is a Z85 character, but never the first of a key: "#0000" would be
 * above 2^32 - 1.) */
bool kvb_secret_next_line(const char **p, size_t *lineno, const char **start, size_t *len)
{
    while (**p) {
        const char *s = *p, *e = strchr(s, '\n');
        if (!e)
            e = s + strlen(s);
        *p = *e ? e + 1 : e;
        ++*lineno;
        while (s < e && (*s == ' ' || *s == '\t' || *s == '\r'))
            s++;
        while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
            e--;
        if (s == e || *s == '#')
            continue;
        *start = s;
        *len = (size_t)(e - s);
        return true;
    }
    return false;
}

int kvb_secret_curve_secret(const char *text, uint8_t key[32], char *why, size_t whylen)
{
    const char *p = text, *line;
    size_t lineno = 0, len, n = 0;
    bool bad = false;
    while (!bad && kvb_secret_next_line(&p, &lineno, &line, &len)) {
        if (++n > 1) {
            snprintf(why, whylen, "holds more than one line besides # comments");
            bad = true;
        } else if (!kvb_secret_z85_key(line, len, key)) {
            snprintf(why, whylen, "line %zu is not 40 Z85 characters", lineno);
            bad = true;
        }
    }
    if (!bad && n == 0) {
        snprintf(why, whylen, "holds no key (only blank lines or # comments)");
        bad = true;
    }
    if (bad) {
        explicit_bzero(key, 32);
        return -EINVAL;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* NKeys                                                                     */

/* An NKey seed is base32 (RFC 4648, no padding) of: two prefix bytes (seed,
 * key type), the 32-byte Ed25519 seed, CRC-16/XMODEM little-endian.  The
 * public key is base32 of: one prefix byte (key type), the 32-byte Ed25519
 * public key, the CRC.  nats.c signs with the seed (nats_Sign) but needs the
 * public key as well and cannot derive it; OpenSSL can.  OpenSSL has neither
 * base32 nor this CRC, hence the two small functions below. */

#define NKEY_PREFIX_SEED (18u << 3) /* 'S' */
#define NKEY_PREFIX_USER (20u << 3) /* 'U' */

uint16_t kvb_secret_crc16(const uint8_t *p, size_t n)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)(p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

static const char b32_alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

int kvb_secret_b32_decode(const char *s, size_t len, uint8_t *out, size_t cap)
{
    uint32_t acc = 0;
    int bits = 0, rc = 0;
    size_t n = 0;
    for (size_t i = 0; i < len && rc == 0; i++) {
        unsigned ch = (unsigned char)s[i], v;
        if (ch >= 'A' && ch <= 'Z')
            v = ch - 'A';
        else if (ch >= '2' && ch <= '7')
            v = ch - '2' + 26;
        else {
            rc = -1;
            break;
        }
        acc = (acc << 5) | v;
        bits += 5;
        if (bits >= 8) {
            bits -= 8;
            if (n == cap)
                rc = -1;
            else
                out[n++] = (uint8_t)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    explicit_bzero(&acc, sizeof acc);
    return rc < 0 ? -1 : (int)n;
}

void kvb_secret_b32_encode(const uint8_t *in, size_t n, char *out)
{
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        acc = (acc << 8) | in[i];
        bits += 8;
        while (bits >= 5) {
            bits -= 5;
            *out++ = b32_alphabet[(acc >> bits) & 31];
        }
        acc &= (1u << bits) - 1;
    }
    if (bits > 0)
        *out++ = b32_alphabet[(acc << (5 - bits)) & 31];
    *out = '\0';
}

int kvb_secret_ed25519_public(const uint8_t seed[32], uint8_t pk[32])
{
    int rc = -EIO;
    size_t n = 32;
    EVP_PKEY *key = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, seed, 32);
    if (key && EVP_PKEY_get_raw_public_key(key, pk, &n) == 1 && n == 32)
        rc = 0;
    EVP_PKEY_free(key); /* clears its copy of the private key */
    return rc;
}

const char *kvb_secret_nkey_public(const char *seed, char pub[KVB_NKEY_PUB_CHARS + 1])
{
    uint8_t raw[36], key[35];
    const char *why = NULL;
    size_t len = strlen(seed);
    if (seed[0] != 'S')
        why = "seeds start with \"SU\" (one starting with \"U\" is a public key, "
              "which cannot sign)";
    else if (len != KVB_NKEY_SEED_CHARS)
        why = "a seed has 58 characters";
    else if (kvb_secret_b32_decode(seed, len, raw, sizeof raw) != (int)sizeof raw)
        why = "a seed has only the characters A-Z and 2-7";
    else if (kvb_secret_crc16(raw, 34) != (uint16_t)(raw[34] | raw[35] << 8))
        why = "its checksum does not match (a character is wrong or missing)";
    else if ((raw[0] & 0xf8) != NKEY_PREFIX_SEED ||
             (((raw[0] & 7u) << 5) | (raw[1] >> 3)) != NKEY_PREFIX_USER)
        why = "it is not a user seed (those start with \"SU\")";
    else if (kvb_secret_ed25519_public(raw + 2, key + 1) < 0)
        why = "OpenSSL could not derive its Ed25519 public key";
    if (!why) {
        key[0] = NKEY_PREFIX_USER;
        uint16_t crc = kvb_secret_crc16(key, 33);
        key[33] = (uint8_t)(crc & 0xff);
        key[34] = (uint8_t)(crc >> 8);
        kvb_secret_b32_encode(key, sizeof key, pub);
    }
    explicit_bzero(raw, sizeof raw);
    return why;
}
