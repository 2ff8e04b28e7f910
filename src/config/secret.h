/* secret: the files the configuration names that hold secrets or keys, and
 * the keys in them.
 *
 *   - where a relative file name is looked up ($CREDENTIALS_DIRECTORY, else
 *     next to the config file);
 *   - opening such a file safely (a FIFO cannot hang the caller, only a
 *     regular file is accepted) and reading a secret from it (password,
 *     token, NKey seed: size-capped, every copy zeroed);
 *   - ZMQ CURVE key files (Z85, one key per line, # comments);
 *   - NKey user seeds: checked (base32, CRC-16/XMODEM, prefixes) and their
 *     public key derived with OpenSSL's Ed25519.
 *
 * Pure helpers: no globals, no logging.  Errors come back as negative errno
 * plus, where the caller has to explain the content of a file, a reason
 * (static text or the caller's buffer) that never contains the secret.  The
 * config module turns them into "FILE:LINE:COL: key: ..." messages.
 *
 * Ownership: strings returned through char ** are malloc'd and the caller's;
 * secrets among them are to be zeroed (explicit_bzero) before free().
 */
#ifndef KVB_SECRET_H
#define KVB_SECRET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVB_SECRET_MAX_BYTES 65536 /* a password_file, token_file, key file, ... */

/* NAME as it is to be opened: an absolute name as it is; a relative one in
 * CREDS_DIR when that is non-NULL and not "" (systemd's LoadCredential=),
 * otherwise in the directory of CONFIG_PATH (as it is when CONFIG_PATH has
 * no '/').  malloc'd; NULL when out of memory. */
char *kvb_secret_path(const char *name, const char *creds_dir, const char *config_path);

/* Open PATH read-only (O_NONBLOCK: a FIFO would block open() until a writer
 * comes) and check that it is a regular file.  The fd (the caller closes
 * it), -errno when open() fails, or -EINVAL when it is not a regular file
 * (or fstat() fails). */
int kvb_secret_open(const char *path);

/* Flags of kvb_secret_read_fd(). */
#define KVB_SECRET_TRIM 1u     /* drop white space on both sides, not only line ends */
#define KVB_SECRET_ONE_LINE 2u /* a line break before the trailing ones is an error */

/* Read a secret from FD (not closed) into *out, NUL-terminated, without the
 * trailing line ends (KVB_SECRET_TRIM: without any surrounding white space).
 * 0 on success; -ENOMEM; or -EINVAL / -errno (a read error) with *why set to
 * the reason ("it is empty", ...; never the content).  Every buffer holding
 * the content is zeroed before it is freed. */
int kvb_secret_read_fd(int fd, unsigned flags, char **out, const char **why);

/* ---- ZMQ CURVE keys ------------------------------------------------------ */

#define KVB_Z85_KEY_CHARS 40 /* a 32-byte CURVE key in Z85 */

/* Decode the LEN characters at S, a 40-character Z85 key, into out; false
 * when they are not one (out is then undefined). */
bool kvb_secret_z85_key(const char *s, size_t len, uint8_t out[32]);

/* The next line of the text at *p that holds something (blank lines and #
 * comments skipped, surrounding white space dropped): *start, *len, and its
 * 1-based number in *lineno (start it at 0).  False at the end of the
 * text. */
bool kvb_secret_next_line(const char **p, size_t *lineno, const char **start, size_t *len);

/* A CURVE secret key file's TEXT: exactly one line of 40 Z85 characters
 * besides blank lines and # comments.  0 and key; or -EINVAL with the reason
 * written to why (WHYLEN bytes; never the key) and key zeroed. */
int kvb_secret_curve_secret(const char *text, uint8_t key[32], char *why, size_t whylen);

/* ---- NKeys --------------------------------------------------------------- */

#define KVB_NKEY_SEED_CHARS 58 /* base32 of 36 bytes */
#define KVB_NKEY_PUB_CHARS 56  /* base32 of 35 bytes */

/* CRC-16/XMODEM (poly 0x1021, init 0, no reflection) of N bytes, the NKey
 * checksum. */
uint16_t kvb_secret_crc16(const uint8_t *p, size_t n);

/* Base32 (RFC 4648 alphabet, upper case, no padding) of LEN characters into
 * at most CAP bytes: the bytes written (leftover bits dropped), or -1 on a
 * character outside the alphabet or more than CAP bytes. */
int kvb_secret_b32_decode(const char *s, size_t len, uint8_t *out, size_t cap);
/* N bytes as base32 without padding into out (ceil(8N/5) characters + NUL). */
void kvb_secret_b32_encode(const uint8_t *in, size_t n, char *out);

/* RFC 8032 5.1.5: the Ed25519 public key of a 32-byte private key (seed),
 * through OpenSSL.  0, or -EIO when OpenSSL fails. */
int kvb_secret_ed25519_public(const uint8_t seed[32], uint8_t pk[32]);

/* Check a user NKey seed ("SU...") and write its public key ("U...",
 * KVB_NKEY_PUB_CHARS + NUL) to pub.  NULL when it is good, else what is
 * wrong (static text, never the seed itself). */
const char *kvb_secret_nkey_public(const char *seed, char pub[KVB_NKEY_PUB_CHARS + 1]);

#endif
