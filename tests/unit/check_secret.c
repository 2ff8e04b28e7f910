/* secret: Ed25519 public keys (RFC 8032 section 7.1), NKey seeds, the
 * base32 and CRC-16 they are made of, CURVE key files, and reading secret
 * files. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "config/secret.h"
#include "testutil.h"

/* unhex() of testutil.h, for exactly n bytes. */
static void unhex_n(const char *h, uint8_t *out, size_t n)
{
    ck_assert_uint_eq(strlen(h), 2 * n);
    unhex(h, out);
}

/* RFC 8032 section 7.1: SECRET KEY -> PUBLIC KEY. */
static const char *const rfc8032[][2] = {
    /* TEST 1 */
    {"9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
     "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"},
    /* TEST 2 */
    {"4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
     "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c"},
    /* TEST 3 */
    {"c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
     "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025"},
    /* TEST 1024 */
    {"f5e5767cf153319517630f226876b86c8160cc583bc013744c6bf255f5cc0ee5",
     "278117fc144c72340f67d0f2316e8386ceffbf2b2428c9c51fef7c597f1d426e"},
    /* TEST SHA(abc) */
    {"833fe62409237b9d62ec77587520911e9a759cec1d19755b7da901b96dca3d42",
     "ec172b93ad5e563bf4932c70e1245034c35467ef2efd4d64ebf819683467e2bf"},
};

START_TEST(test_ed25519_rfc8032)
{
    uint8_t sk[32], want[32], pk[32];
    unhex_n(rfc8032[_i][0], sk, 32);
    unhex_n(rfc8032[_i][1], want, 32);
    memset(pk, 0xaa, sizeof pk);
    ck_assert_int_eq(kvb_secret_ed25519_public(sk, pk), 0);
    ck_assert_mem_eq(pk, want, 32);
}
END_TEST

/* Seed -> public key.  The first is the user NKey of the NATS server
 * documentation (nkey authentication); the others are the vectors the config
 * tests use (made with Python's cryptography package; the second wraps RFC
 * 8032 TEST 1). */
static const char *const nkeys[][2] = {
    {"SUACSSL3UAHUDXKFSNVUZRF5UHPMWZ6BFDTJ7M6USDXIEDNPPQYYYCU3VY",
     "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4"},
    {"SUAJ2YNRTXX72WTAXKCEV5ES5QWMIRCJYVUXWMTJDFYDXLADDSXH6YALCA",
     "UDLVVGABQKYQVN6VJP7NHSLEA45A5YLS6PNKMIZFV4BBU2HXA5IRUVAL"},
};

START_TEST(test_nkey_known_answer)
{
    char pub[KVB_NKEY_PUB_CHARS + 1];
    memset(pub, 'x', sizeof pub);
    ck_assert_ptr_null(kvb_secret_nkey_public(nkeys[_i][0], pub));
    ck_assert_str_eq(pub, nkeys[_i][1]);
}
END_TEST

START_TEST(test_nkey_bad)
{
    char pub[KVB_NKEY_PUB_CHARS + 1];
    const char *good = nkeys[0][0];
    char s[80];
    /* a public key is not a seed */
    ck_assert_ptr_nonnull(strstr(kvb_secret_nkey_public(nkeys[0][1], pub), "public key"));
    /* one character short */
    snprintf(s, sizeof s, "%.57s", good);
    ck_assert_str_eq(kvb_secret_nkey_public(s, pub), "a seed has 58 characters");
    /* outside the alphabet */
    snprintf(s, sizeof s, "%.50s1%s", good, good + 51);
    ck_assert_str_eq(kvb_secret_nkey_public(s, pub), "a seed has only the characters A-Z and 2-7");
    /* one character changed: the checksum catches it */
    snprintf(s, sizeof s, "%s", good);
    s[20] = s[20] == 'A' ? 'B' : 'A';
    ck_assert_ptr_nonnull(strstr(kvb_secret_nkey_public(s, pub), "checksum"));
}
END_TEST

/* CRC-16/XMODEM's check value (the CRC of "123456789"). */
START_TEST(test_crc16)
{
    ck_assert_uint_eq(kvb_secret_crc16((const uint8_t *)"123456789", 9), 0x31c3);
    ck_assert_uint_eq(kvb_secret_crc16((const uint8_t *)"", 0), 0);
}
END_TEST

/* RFC 4648 section 10, without the padding. */
static const char *const b32[][2] = {
    {"", ""},
    {"f", "MY"},
    {"fo", "MZXQ"},
    {"foo", "MZXW6"},
    {"foob", "MZXW6YQ"},
    {"fooba", "MZXW6YTB"},
    {"foobar", "MZXW6YTBOI"},
};

START_TEST(test_base32)
{
    const char *bin = b32[_i][0], *txt = b32[_i][1];
    char enc[32];
    uint8_t dec[16];
    kvb_secret_b32_encode((const uint8_t *)bin, strlen(bin), enc);
    ck_assert_str_eq(enc, txt);
    ck_assert_int_eq(kvb_secret_b32_decode(txt, strlen(txt), dec, sizeof dec), (int)strlen(bin));
    ck_assert_mem_eq(dec, bin, strlen(bin));
}
END_TEST

START_TEST(test_base32_bad)
{
    uint8_t dec[8];
    ck_assert_int_eq(kvb_secret_b32_decode("MZXW6yQ", 7, dec, sizeof dec), -1); /* lower case */
    ck_assert_int_eq(kvb_secret_b32_decode("MZXW6=", 6, dec, sizeof dec), -1);  /* padding */
    ck_assert_int_eq(kvb_secret_b32_decode("MZ1W6", 5, dec, sizeof dec), -1);   /* 1 */
    ck_assert_int_eq(kvb_secret_b32_decode("MZXW6YTBOI", 10, dec, 5), -1);      /* > cap */
}
END_TEST

START_TEST(test_z85_and_lines)
{
    uint8_t key[32], back[32];
    char z[KVB_Z85_KEY_CHARS + 1];
    for (int i = 0; i < 32; i++)
        key[i] = (uint8_t)(i * 37 + 11);
    ck_assert_ptr_nonnull(zmq_z85_encode(z, key, 32));
    ck_assert(kvb_secret_z85_key(z, strlen(z), back));
    ck_assert_mem_eq(back, key, 32);
    ck_assert(!kvb_secret_z85_key(z, strlen(z) - 1, back));
    z[3] = '~'; /* not a Z85 character */
    ck_assert(!kvb_secret_z85_key(z, strlen(z), back));

    const char *text = "# comment\n\n  first line \r\n\t# more\nsecond", *p = text, *s;
    size_t lineno = 0, len;
    ck_assert(kvb_secret_next_line(&p, &lineno, &s, &len));
    ck_assert_uint_eq(lineno, 3);
    ck_assert_int_eq((int)len, 10);
    ck_assert(strncmp(s, "first line", len) == 0);
    ck_assert(kvb_secret_next_line(&p, &lineno, &s, &len));
    ck_assert_uint_eq(lineno, 5);
    ck_assert(strncmp(s, "second", len) == 0 && len == 6);
    ck_assert(!kvb_secret_next_line(&p, &lineno, &s, &len));
}
END_TEST

START_TEST(test_curve_secret)
{
    uint8_t key[32], want[32];
    char z[KVB_Z85_KEY_CHARS + 1], text[256], why[128];
    for (int i = 0; i < 32; i++)
        want[i] = (uint8_t)(255 - i);
    zmq_z85_encode(z, want, 32);
    snprintf(text, sizeof text, "# secret\n%s\n", z);
    ck_assert_int_eq(kvb_secret_curve_secret(text, key, why, sizeof why), 0);
    ck_assert_mem_eq(key, want, 32);

    snprintf(text, sizeof text, "%s\n%s\n", z, z);
    ck_assert_int_eq(kvb_secret_curve_secret(text, key, why, sizeof why), -EINVAL);
    ck_assert_str_eq(why, "holds more than one line besides # comments");
    ck_assert_mem_eq(key, (uint8_t[32]){0}, 32); /* zeroed */
    ck_assert_int_eq(kvb_secret_curve_secret("# only\n\n", key, why, sizeof why), -EINVAL);
    ck_assert_str_eq(why, "holds no key (only blank lines or # comments)");
    ck_assert_int_eq(kvb_secret_curve_secret("\nshort\n", key, why, sizeof why), -EINVAL);
    ck_assert_str_eq(why, "line 2 is not 40 Z85 characters");
}
END_TEST

START_TEST(test_paths)
{
    char *p;
    ck_assert_str_eq(p = kvb_secret_path("/abs/f", "/creds", "/etc/kvb.yaml"), "/abs/f");
    free(p);
    ck_assert_str_eq(p = kvb_secret_path("f", "/creds", "/etc/kvb.yaml"), "/creds/f");
    free(p);
    ck_assert_str_eq(p = kvb_secret_path("f", "/creds/", "/etc/kvb.yaml"), "/creds/f");
    free(p);
    ck_assert_str_eq(p = kvb_secret_path("d/f", "", "/etc/kvb/kvb.yaml"), "/etc/kvb/d/f");
    free(p);
    ck_assert_str_eq(p = kvb_secret_path("f", NULL, "kvb.yaml"), "f");
    free(p);
}
END_TEST

static char tmpdir[64];

static void tmp_setup(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kvb-secret.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void tmp_teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    ck_assert_int_eq(system(cmd), 0);
}

static char *tmp_file(const char *name, const void *data, size_t len)
{
    static char path[128];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, len, f), len);
    fclose(f);
    return path;
}

/* Read PATH with FLAGS: the return code; *out or *why. */
static int read_path(const char *path, unsigned flags, char **out, const char **why)
{
    int fd = kvb_secret_open(path);
    ck_assert_int_ge(fd, 0);
    *out = NULL;
    int rc = kvb_secret_read_fd(fd, flags, out, why);
    close(fd);
    return rc;
}

START_TEST(test_open_and_read)
{
    char *out, path[160];
    const char *why;

    snprintf(path, sizeof path, "%s/missing", tmpdir);
    ck_assert_int_eq(kvb_secret_open(path), -ENOENT);
    ck_assert_int_eq(kvb_secret_open(tmpdir), -EINVAL); /* a directory */
    snprintf(path, sizeof path, "%s/fifo", tmpdir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    ck_assert_int_eq(kvb_secret_open(path), -EINVAL); /* and it did not block */

    ck_assert_int_eq(read_path(tmp_file("pw", "s3cret\r\n\n", 9), 0, &out, &why), 0);
    ck_assert_str_eq(out, "s3cret");
    free(out);
    ck_assert_int_eq(read_path(tmp_file("pw", " a b \n", 6), 0, &out, &why), 0);
    ck_assert_str_eq(out, " a b ");
    free(out);
    ck_assert_int_eq(read_path(tmp_file("pw", " a b \n", 6), KVB_SECRET_TRIM, &out, &why), 0);
    ck_assert_str_eq(out, "a b");
    free(out);

    /* one line: a trailing line end (or several) is fine, a second line is not */
    ck_assert_int_eq(read_path(tmp_file("pw", "pw\r\n\n", 5), KVB_SECRET_ONE_LINE, &out, &why), 0);
    ck_assert_str_eq(out, "pw");
    free(out);
    ck_assert_int_eq(read_path(tmp_file("pw", "a\nb\n", 4), KVB_SECRET_ONE_LINE, &out, &why),
                     -EINVAL);
    ck_assert_str_eq(why, "it has more than one line (only a trailing line end is dropped)");
    ck_assert_ptr_null(out);
    ck_assert_int_eq(read_path(tmp_file("pw", "a\nb\n", 4), 0, &out, &why), 0);
    ck_assert_str_eq(out, "a\nb");
    free(out);

    ck_assert_int_eq(read_path(tmp_file("pw", "\n\n", 2), 0, &out, &why), -EINVAL);
    ck_assert_str_eq(why, "it is empty");
    ck_assert_ptr_null(out);
    ck_assert_int_eq(read_path(tmp_file("pw", "a\0b", 3), 0, &out, &why), -EINVAL);
    ck_assert_str_eq(why, "it contains a NUL byte");
    char *big = malloc(KVB_SECRET_MAX_BYTES + 1);
    memset(big, 'x', KVB_SECRET_MAX_BYTES + 1);
    ck_assert_int_eq(read_path(tmp_file("pw", big, KVB_SECRET_MAX_BYTES), 0, &out, &why), 0);
    ck_assert_uint_eq(strlen(out), KVB_SECRET_MAX_BYTES);
    free(out);
    ck_assert_int_eq(read_path(tmp_file("pw", big, KVB_SECRET_MAX_BYTES + 1), 0, &out, &why),
                     -EINVAL);
    ck_assert_str_eq(why, "it is larger than 65536 bytes");
    free(big);
}
END_TEST

static Suite *secret_suite(void)
{
    Suite *s = suite_create("secret");
    TCase *tc = tcase_create("secret");
    tcase_add_loop_test(tc, test_ed25519_rfc8032, 0, (int)(sizeof rfc8032 / sizeof *rfc8032));
    tcase_add_loop_test(tc, test_nkey_known_answer, 0, (int)(sizeof nkeys / sizeof *nkeys));
    tcase_add_test(tc, test_nkey_bad);
    tcase_add_test(tc, test_crc16);
    tcase_add_loop_test(tc, test_base32, 0, (int)(sizeof b32 / sizeof *b32));
    tcase_add_test(tc, test_base32_bad);
    tcase_add_test(tc, test_z85_and_lines);
    tcase_add_test(tc, test_curve_secret);
    tcase_add_test(tc, test_paths);
    suite_add_tcase(s, tc);
    TCase *tf = tcase_create("files");
    tcase_add_checked_fixture(tf, tmp_setup, tmp_teardown);
    tcase_add_test(tf, test_open_and_read);
    suite_add_tcase(s, tf);
    return s;
}

int main(void) { return kvb_run_suite(secret_suite()); }
