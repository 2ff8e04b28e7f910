/* Unit tests for the url module (libcurl's CURLU underneath): the parts of
 * NATS, http and etcd URLs, the schemeless forms nats.c takes, IPv6
 * literals, user information, ports, percent-encoding, what is refused and
 * why, and the redacted form. */
#include <check.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "url.h"

/* Parse TEXT with DEF as the default scheme: 0 expected. */
static struct kvb_url parse_ok(const char *text, const char *def)
{
    struct kvb_url u;
    const char *why = NULL;
    int rc = kvb_url_parse(text, def, &u, &why);
    ck_assert_msg(rc == 0, "%s: rc %d (%s)", text, rc, why ? why : "?");
    return u;
}

/* TEXT refused with WHY. */
static void parse_bad(const char *text, const char *def, const char *want)
{
    struct kvb_url u;
    const char *why = NULL;
    int rc = kvb_url_parse(text, def, &u, &why);
    ck_assert_msg(rc == -EINVAL, "%s: rc %d", text, rc);
    ck_assert_ptr_nonnull(why);
    ck_assert_msg(strcmp(why, want) == 0, "%s: '%s', not '%s'", text, why, want);
    ck_assert_ptr_null(u.scheme); /* nothing to free after a failure */
    ck_assert_ptr_null(u.host);
    kvb_url_free(&u);
}

START_TEST(test_parts)
{
    struct kvb_url u = parse_ok("nats://kvb:s3cret@nats-0.nats:4222/x?y=1#z", "nats");
    ck_assert_str_eq(u.scheme, "nats");
    ck_assert_str_eq(u.user, "kvb");
    ck_assert_str_eq(u.password, "s3cret");
    ck_assert_str_eq(u.host, "nats-0.nats");
    ck_assert_uint_eq(u.port, 4222);
    ck_assert_str_eq(u.path, "/x");
    ck_assert_str_eq(u.query, "y=1");
    ck_assert_str_eq(u.fragment, "z");
    kvb_url_free(&u);
    ck_assert_ptr_null(u.user);
    kvb_url_free(&u); /* twice is fine */

    /* no port, no path, no user information; the scheme in lower case */
    u = parse_ok("TLS://Host", "nats");
    ck_assert_str_eq(u.scheme, "tls");
    ck_assert_str_eq(u.host, "Host");
    ck_assert_uint_eq(u.port, 0);
    ck_assert_str_eq(u.path, "/");
    ck_assert_ptr_null(u.user);
    ck_assert_ptr_null(u.password);
    ck_assert_ptr_null(u.query);
    ck_assert_ptr_null(u.fragment);
    kvb_url_free(&u);

    /* a token (user only); an empty port is no port (nats.c: 4222) */
    u = parse_ok("nats://t0ken@h:", "nats");
    ck_assert_str_eq(u.user, "t0ken");
    ck_assert_ptr_null(u.password);
    ck_assert_uint_eq(u.port, 0);
    kvb_url_free(&u);

    u = parse_ok("http://10.0.0.1:8000/metrics", NULL);
    ck_assert_str_eq(u.scheme, "http");
    ck_assert_str_eq(u.host, "10.0.0.1");
    ck_assert_uint_eq(u.port, 8000);
    ck_assert_str_eq(u.path, "/metrics");
    kvb_url_free(&u);
}
END_TEST

/* No scheme: read with the default one (nats.c adds nats://), or refused. */
START_TEST(test_no_scheme)
{
    struct kvb_url u = parse_ok("localhost:4223", "nats");
    ck_assert_str_eq(u.scheme, "nats");
    ck_assert_str_eq(u.host, "localhost");
    ck_assert_uint_eq(u.port, 4223);
    kvb_url_free(&u);

    u = parse_ok("u:p@127.0.0.1", "nats");
    ck_assert_str_eq(u.scheme, "nats");
    ck_assert_str_eq(u.user, "u");
    ck_assert_str_eq(u.password, "p");
    ck_assert_str_eq(u.host, "127.0.0.1");
    kvb_url_free(&u);

    u = parse_ok("h", "nats");
    ck_assert_str_eq(u.host, "h");
    kvb_url_free(&u);

    parse_bad("localhost:4223", NULL, "it is not SCHEME://HOST...");
    parse_bad("h", NULL, "it is not SCHEME://HOST...");
}
END_TEST

START_TEST(test_ipv6)
{
    struct kvb_url u = parse_ok("nats://u:p@[::1]:4222", "nats");
    ck_assert_str_eq(u.host, "[::1]");
    ck_assert_uint_eq(u.port, 4222);
    kvb_url_free(&u);
    u = parse_ok("tls://[2001:db8::17]/x", "nats");
    ck_assert_str_eq(u.host, "[2001:db8::17]");
    ck_assert_uint_eq(u.port, 0);
    kvb_url_free(&u);
    u = parse_ok("[::1]:1", "nats"); /* no scheme */
    ck_assert_str_eq(u.host, "[::1]");
    ck_assert_uint_eq(u.port, 1);
    kvb_url_free(&u);

    parse_bad("nats://[::1", "nats", "the IPv6 address in brackets is not valid");
    parse_bad("nats://[zz::1]:1", "nats", "the IPv6 address in brackets is not valid");
    parse_bad("nats://[::1]x", "nats", "the port is not a number in 1..65535");
}
END_TEST

START_TEST(test_ports)
{
    struct kvb_url u = parse_ok("nats://h:1", "nats");
    ck_assert_uint_eq(u.port, 1);
    kvb_url_free(&u);
    u = parse_ok("nats://h:65535", "nats");
    ck_assert_uint_eq(u.port, 65535);
    kvb_url_free(&u);

    static const char *const bad[] = {
        "nats://h:0",  "nats://h:65536", "nats://h:-1",         "nats://h:+1",
        "nats://h:4x", "nats://h:1 ",    "nats://u:pw@h:99999", "h:4x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        parse_bad(bad[i], "nats", "the port is not a number in 1..65535");
}
END_TEST

/* Percent-encoding: user information stays as written (nats.c sends it
 * so); the host is decoded by libcurl. */
START_TEST(test_percent)
{
    struct kvb_url u = parse_ok("nats://u%40x:p%3Aw@h%41:1/a%20b", "nats");
    ck_assert_str_eq(u.user, "u%40x");
    ck_assert_str_eq(u.password, "p%3Aw");
    ck_assert_str_eq(u.host, "hA");
    ck_assert_str_eq(u.path, "/a%20b");
    kvb_url_free(&u);
}
END_TEST

START_TEST(test_refused)
{
    parse_bad("nats://", "nats", "there is no host");
    parse_bad("nats://:4222", "nats", "there is no host");
    parse_bad("nats://u:p@:4222", "nats", "there is no host");
    parse_bad("http://", NULL, "there is no host");
    parse_bad("nats://a$b:1", "nats", "the host is not a host name or an IP address");
    parse_bad("nats://h h", "nats", "the host is not a host name or an IP address");
    parse_bad("nats://u:p w@h", "nats", "the user information (before '@') is not valid");
    parse_bad("http://h/a b", NULL,
              "the part after the host holds white space or control characters");
    parse_bad("nats://h?a\tb", "nats",
              "the part after the host holds white space or control characters");
    struct kvb_url u;
    const char *why = NULL;
    ck_assert_int_eq(kvb_url_parse(NULL, "nats", &u, &why), -EINVAL);
    ck_assert_int_eq(kvb_url_parse("nats://", "nats", &u, NULL), -EINVAL); /* why may be NULL */
}
END_TEST

START_TEST(test_redacted)
{
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"nats://u:pw@h:4222", "nats://***@h:4222"},
        {"nats://t0ken@h:4222", "nats://***@h:4222"},
        {"nats://:pw@h", "nats://***@h"},
        {"nats://@h", "nats://***@h"},
        {"tls://u:pw@[::1]:4222/x?y#z", "tls://***@[::1]:4222/x?y#z"},
        {"u:pw@h:1", "nats://***@h:1"}, /* no scheme: nats.c's */
        {"NATS://u:pw@h:1/", "nats://***@h:1"},
        /* no user information: the text as it is */
        {"nats://h:4222", "nats://h:4222"},
        {"h:4222", "h:4222"},
        {"NATS://H:1/", "NATS://H:1/"},
        /* not a URL: nothing of it shown */
        {"nats://u:p w@h", "***"},
        {"nats://u:pw@h:99999", "***"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *r = kvb_url_redacted(cases[i].in, "nats", "***");
        ck_assert_ptr_nonnull(r);
        ck_assert_msg(strcmp(r, cases[i].out) == 0, "%s: '%s', not '%s'", cases[i].in, r,
                      cases[i].out);
        free(r);
    }
}
END_TEST

static Suite *url_suite(void)
{
    Suite *su = suite_create("url");
    TCase *tc = tcase_create("url");
    tcase_add_test(tc, test_parts);
    tcase_add_test(tc, test_no_scheme);
    tcase_add_test(tc, test_ipv6);
    tcase_add_test(tc, test_ports);
    tcase_add_test(tc, test_percent);
    tcase_add_test(tc, test_refused);
    tcase_add_test(tc, test_redacted);
    suite_add_tcase(su, tc);
    return su;
}

int main(void) { return kvb_run_suite(url_suite()); }
