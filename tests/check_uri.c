/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests: transport addresses (transport/uri.c). */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <taskwire/error.h>

#include "tests/unit.h"
#include "tests/support/suite.h"
#include "transport/uri.h"

struct good {
	const char *uri, *scheme, *host;
	unsigned port;
	const char *path;
};

static const struct good goods[] = {
	{"tcp://127.0.0.1:8786", "tcp", "127.0.0.1", 8786, "/"},
	{"tcp://[::1]:0", "tcp", "::1", 0, "/"},
	{"tcp://localhost:1/path", "tcp", "localhost", 1, "/path"},
	{"tls://[fe80::1:2]:65535/a/b", "tls", "fe80::1:2", 65535, "/a/b"},
	{"ws://h:00080/", "ws", "h", 80, "/"},
	{"wss://example.org:443/x:y", "wss", "example.org", 443, "/x:y"},
};
#define N_GOOD (sizeof(goods) / sizeof(goods[0]))

START_TEST(parse_good)
{
	const struct good *g = &goods[_i];
	struct tw__uri u;
	ck_assert_int_eq(tw__uri_parse(g->uri, &u), 0);
	ck_assert_str_eq(u.scheme, g->scheme);
	ck_assert_str_eq(u.host, g->host);
	ck_assert_uint_eq(u.port, g->port);
	ck_assert_str_eq(u.path, g->path);
}
END_TEST

static const char *const bads[] = {
	"127.0.0.1:8786",         /* no scheme */
	"tcp:/127.0.0.1:8786",    /* no "://" */
	"://127.0.0.1:8786",      /* empty scheme */
	"tcp://127.0.0.1",        /* no port */
	"tcp://127.0.0.1:",       /* empty port */
	"tcp://127.0.0.1/x",      /* no port before the path */
	"tcp://127.0.0.1:/x",     /* empty port before the path */
	"tcp://127.0.0.1:65536",  /* port too large */
	"tcp://127.0.0.1:99999",  /* port too large */
	"tcp://127.0.0.1:123456", /* too many digits */
	"tcp://127.0.0.1:8x",     /* not a number */
	"tcp://127.0.0.1:-1",     /* not a number */
	"tcp://127.0.0.1: 80",    /* not a number */
	"tcp://127.0.0.1:+80",    /* not a number */
	"tcp://127.0.0.1:80:90",  /* two ports */
	"tcp://:8786",            /* empty host */
	"tcp://[]:8786",          /* empty bracketed host */
	"tcp://[::1:8786",        /* no closing bracket */
	"tcp://[::1]8786",        /* no colon after the bracket */
	"tcp://[::1]",            /* no port */
	"tcp://::1]:8786",        /* closing bracket only */
	"tcp://::1:8786",         /* IPv6 without brackets */
	"tcp://a]b:8786",         /* stray closing bracket */
	"tcp://a[b:8786",         /* stray opening bracket */
	"tcp://[a[b]:8786",       /* bracket inside brackets */
	"tcp://a/b:8786",         /* path inside the host */
	"",
};
#define N_BAD (sizeof(bads) / sizeof(bads[0]))

START_TEST(parse_bad)
{
	struct tw__uri u;
	ck_assert_msg(tw__uri_parse(bads[_i], &u) == TW_EADDR, "accepted \"%s\"", bads[_i]);
}
END_TEST

START_TEST(parse_null)
{
	struct tw__uri u;
	ck_assert_int_eq(tw__uri_parse(NULL, &u), TW_EADDR);
}
END_TEST

/* Field sizes: 15-byte scheme, 255-byte host and path fit; one more does
 * not. */
START_TEST(parse_lengths)
{
	char s[700], host[300], path[300];
	struct tw__uri u;
	memset(host, 'h', sizeof(host));
	memset(path, 'p', sizeof(path));
	path[0] = '/';
	snprintf(s, sizeof(s), "abcdefghijklmno://h:1");
	ck_assert_int_eq(tw__uri_parse(s, &u), 0);
	snprintf(s, sizeof(s), "abcdefghijklmnop://h:1");
	ck_assert_int_eq(tw__uri_parse(s, &u), TW_EADDR);
	snprintf(s, sizeof(s), "tcp://%.255s:1", host);
	ck_assert_int_eq(tw__uri_parse(s, &u), 0);
	ck_assert_uint_eq(strlen(u.host), 255);
	snprintf(s, sizeof(s), "tcp://%.256s:1", host);
	ck_assert_int_eq(tw__uri_parse(s, &u), TW_EADDR);
	snprintf(s, sizeof(s), "tcp://h:1%.255s", path);
	ck_assert_int_eq(tw__uri_parse(s, &u), 0);
	ck_assert_uint_eq(strlen(u.path), 255);
	snprintf(s, sizeof(s), "tcp://h:1%.256s", path);
	ck_assert_int_eq(tw__uri_parse(s, &u), TW_EADDR);
}
END_TEST

START_TEST(format)
{
	char buf[64];
	ck_assert_int_eq(tw__uri_format("tcp", "::1", 8786, buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "tcp://[::1]:8786");
	ck_assert_int_eq(tw__uri_format("tcp", "127.0.0.1", 0, buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "tcp://127.0.0.1:0");
	ck_assert_int_eq(tw__uri_format("tls", "fe80::1", 65535, buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "tls://[fe80::1]:65535");
	ck_assert_int_eq(tw__uri_format("tcp", "localhost", 1, buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "tcp://localhost:1");
}
END_TEST

/* "tcp://[::1]:8786" is 16 bytes: 17 fit with the NUL, 16 do not. */
START_TEST(format_range)
{
	char buf[17];
	ck_assert_int_eq(tw__uri_format("tcp", "::1", 8786, buf, 17), 0);
	ck_assert_str_eq(buf, "tcp://[::1]:8786");
	ck_assert_int_eq(tw__uri_format("tcp", "::1", 8786, buf, 16), TW_ERANGE);
	ck_assert_int_eq(tw__uri_format("tcp", "::1", 8786, buf, 0), TW_ERANGE);
}
END_TEST

/* format then parse gives the same fields back. */
START_TEST(roundtrip)
{
	static const char *hosts[] = {"::1", "2001:db8::7", "10.0.0.1", "localhost"};
	for (size_t i = 0; i < 4; i++) {
		char buf[128];
		struct tw__uri u;
		uint16_t port = (uint16_t)(1000 + i);
		ck_assert_int_eq(tw__uri_format("tcp", hosts[i], port, buf, sizeof(buf)), 0);
		ck_assert_int_eq(tw__uri_parse(buf, &u), 0);
		ck_assert_str_eq(u.host, hosts[i]);
		ck_assert_uint_eq(u.port, 1000 + i);
		ck_assert_str_eq(u.path, "/");
	}
}
END_TEST

START_TEST(format_sockaddr)
{
	struct sockaddr_in6 s6;
	struct sockaddr_in s4;
	struct sockaddr_un su;
	char buf[64];
	memset(&s6, 0, sizeof(s6));
	s6.sin6_family = AF_INET6;
	s6.sin6_addr = in6addr_loopback;
	s6.sin6_port = htons(8786);
	ck_assert_int_eq(tw__uri_format_sa("tcp", (struct sockaddr *)&s6, buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "tcp://[::1]:8786");
	memset(&s4, 0, sizeof(s4));
	s4.sin_family = AF_INET;
	s4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	s4.sin_port = htons(5);
	ck_assert_int_eq(tw__uri_format_sa("tcp", (struct sockaddr *)&s4, buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "tcp://127.0.0.1:5");
	ck_assert_int_eq(tw__uri_format_sa("tcp", (struct sockaddr *)&s4, buf, 10), TW_ERANGE);
	memset(&su, 0, sizeof(su));
	su.sun_family = AF_UNIX;
	ck_assert_int_eq(tw__uri_format_sa("tcp", (struct sockaddr *)&su, buf, sizeof(buf)),
			 TW_EADDR);
}
END_TEST

int main(void)
{
	TCase *tc = ts_tcase("uri", 0, NULL);
	ts_add_loop(tc, (int)N_GOOD, TS_TESTS(parse_good));
	ts_add_loop(tc, (int)N_BAD, TS_TESTS(parse_bad));
	ts_add(tc, TS_TESTS(parse_null, parse_lengths, format, format_range, roundtrip,
			    format_sockaddr));
	return ts_main("uri", 0, TS_CASES(tc));
}
