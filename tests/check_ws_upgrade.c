/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests: the WebSocket opening handshake (transport/ws_upgrade.c).
 *
 * The RFC 6455 example key and accept value; the Autobahn handshake of
 * the Autobahn testsuite, split at every byte, byte by byte and at random points,
 * with the same verdict and the same bytes consumed every time; headers in
 * any case and with LF line ends; each verdict of the server (101, 400,
 * 403, 404, 426, 431) with its response; the bad ones (bad accept,
 * unrequested extension, 200 instead of 101, version 8, bad key, 2,000
 * header lines, 1 MiB of headers) with bounded memory; the client's
 * request; frames bundled with the 101 handed on (RFC 6455 section 4.1); a client and
 * a server talking to each other; parsers reading input that ends at a
 * guard page. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <taskwire/error.h>

#include "tests/unit.h"
#include "tests/support/suite.h"
#include "transport/ws_codec.h"
#include "transport/ws_upgrade.h"

#define RFC_KEY    "dGhlIHNhbXBsZSBub25jZQ=="
#define RFC_ACCEPT "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="

/* The handshake the Autobahn testsuite's client sends. */
#define AUTOBAHN_REQUEST                                                                           \
	"GET / HTTP/1.1\r\nHost: 127.0.0.1:8765\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"  \
	"Sec-WebSocket-Key: " RFC_KEY "\r\nSec-WebSocket-Version: 13\r\n\r\n"

#define RESPONSE_101                                                                               \
	"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"        \
	"Sec-WebSocket-Accept: " RFC_ACCEPT "\r\n\r\n"

static const uint8_t RFC_NONCE[16] = "the sample nonce";

/* --- helpers ------------------------------------------------------------ */

struct outcome {
	int rv;
	size_t used;
	int status;
};

/* Feed the request parser r, or (r NULL) the response parser cl, in
 * pieces: cut at the given offsets (sorted, within len), or byte by byte
 * when bytewise. Stops at the verdict. */
static struct outcome feed(struct tw__ws_req *r, struct tw__ws_client *cl, const char *p,
			   size_t len, const size_t *cuts, size_t ncuts, int bytewise)
{
	const struct tw__ws_head *head = r != NULL ? &r->head : &cl->head;
	struct outcome o = {0, 0, 0};
	size_t off = 0, c = 0;
	while (off < len && o.rv == 0) {
		size_t end = bytewise ? off + 1 : c < ncuts ? cuts[c++] : len, used = 0;
		const uint8_t *in = (const uint8_t *)p + off;
		if (end < off)
			end = off;
		if (end > len)
			end = len;
		o.rv = r != NULL ? tw__ws_req_feed(r, in, end - off, &used)
				 : tw__ws_client_feed(cl, in, end - off, &used);
		REQUIRE(head->cap <= head->max_bytes);
		REQUIRE(used <= end - off);
		REQUIRE(o.rv != 0 || used == end - off);
		off += used;
		o.used += used;
	}
	o.status = r != NULL ? tw__ws_req_status(r) : tw__ws_client_status(cl);
	return o;
}

static struct outcome feed_req(struct tw__ws_req *r, const char *p, size_t len, const size_t *cuts,
			       size_t ncuts, int bytewise)
{
	return feed(r, NULL, p, len, cuts, ncuts, bytewise);
}

static struct outcome feed_client(struct tw__ws_client *cl, const char *p, size_t len,
				  const size_t *cuts, size_t ncuts, int bytewise)
{
	return feed(NULL, cl, p, len, cuts, ncuts, bytewise);
}

/* A request's verdict, the same whole, byte by byte and at 20 random cut
 * sets; the whole-feed outcome. */
static struct outcome judge(const char *req, size_t len, size_t max_bytes, size_t max_fields)
{
	struct tw__ws_req r;
	struct outcome whole, o;
	uint64_t seed = len;
	tw__ws_req_init(&r, max_bytes, max_fields);
	whole = feed_req(&r, req, len, NULL, 0, 0);
	tw__ws_req_fini(&r);
	if (len <= 20000) {
		tw__ws_req_init(&r, max_bytes, max_fields);
		o = feed_req(&r, req, len, NULL, 0, 1);
		REQUIRE(o.rv == whole.rv && o.used == whole.used && o.status == whole.status);
		tw__ws_req_fini(&r);
	}
	for (int i = 0; i < 20; i++) {
		size_t cuts[6];
		for (int k = 0; k < 6; k++)
			cuts[k] = rnd_range(&seed, 0, len);
		for (int a = 0; a < 6; a++)
			for (int b = a + 1; b < 6; b++)
				if (cuts[b] < cuts[a]) {
					size_t t = cuts[a];
					cuts[a] = cuts[b];
					cuts[b] = t;
				}
		tw__ws_req_init(&r, max_bytes, max_fields);
		o = feed_req(&r, req, len, cuts, 6, 0);
		REQUIRE(o.rv == whole.rv && o.used == whole.used && o.status == whole.status);
		tw__ws_req_fini(&r);
	}
	return whole;
}

static int status_of(const char *req)
{
	struct outcome o = judge(req, strlen(req), 0, 0);
	ck_assert_int_eq(o.rv, 1);
	ck_assert_uint_eq(o.used, strlen(req));
	return o.status;
}

/* The response of a request's verdict, NUL-terminated in out. */
static void response_of(const char *req, char *out, size_t cap)
{
	struct tw__ws_req r;
	size_t used;
	int n;
	tw__ws_req_init(&r, 0, 0);
	ck_assert_int_eq(tw__ws_req_feed(&r, (const uint8_t *)req, strlen(req), &used), 1);
	n = tw__ws_req_response(&r, out, cap - 1);
	ck_assert_int_gt(n, 0);
	out[n] = '\0';
	tw__ws_req_fini(&r);
}

/* Bytes placed right before an inaccessible page: reading past the end
 * faults. */
struct guarded {
	uint8_t *map, *p;
	size_t map_len;
};

static void guard_copy(struct guarded *g, const void *src, size_t len)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE), data = (len + page - 1) / page * page;
	g->map_len = data + page;
	g->map = mmap(NULL, g->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ck_assert(g->map != MAP_FAILED);
	ck_assert_int_eq(mprotect(g->map + data, page, PROT_NONE), 0);
	g->p = g->map + data - len;
	memcpy(g->p, src, len);
}

static void guard_free(struct guarded *g)
{
	munmap(g->map, g->map_len);
}

/* --- accept value and key --------------------------------------------------- */

START_TEST(accept_value)
{
	char out[TW__WS_ACCEPT_CHARS + 1];
	struct tw__ws_client c;
	ck_assert_int_eq(tw__ws_accept(RFC_KEY, strlen(RFC_KEY), out), 0);
	ck_assert_str_eq(out, RFC_ACCEPT);
	ck_assert_int_eq(tw__ws_client_init_nonce(&c, RFC_NONCE, 0, 0), 0);
	ck_assert_str_eq(tw__ws_client_key(&c), RFC_KEY);
	ck_assert_str_eq(c.accept, RFC_ACCEPT);
	tw__ws_client_fini(&c);
	/* Another pair, checked with Python's hashlib and base64. */
	ck_assert_int_eq(tw__ws_accept("x3JJHMbDL1EzLkh9GBhXDw==", 24, out), 0);
	ck_assert_str_eq(out, "HSmrc0sMlYUkAGmm5OPpG2HaGWk=");
}
END_TEST

/* Random keys: 24 base64 characters of 16 bytes, a new one per client. */
START_TEST(client_keys)
{
	char seen[64][TW__WS_KEY_CHARS + 1];
	for (int i = 0; i < 64; i++) {
		struct tw__ws_client c;
		const char *k;
		char accept[TW__WS_ACCEPT_CHARS + 1];
		ck_assert_int_eq(tw__ws_client_init(&c, 0, 0), 0);
		k = tw__ws_client_key(&c);
		ck_assert_uint_eq(strlen(k), 24);
		ck_assert(k[22] == '=' && k[23] == '=');
		ck_assert_int_eq(tw__ws_accept(k, 24, accept), 0);
		ck_assert_str_eq(accept, c.accept);
		for (int j = 0; j < i; j++)
			ck_assert_str_ne(seen[j], k);
		memcpy(seen[i], k, sizeof(seen[i]));
		tw__ws_client_fini(&c);
	}
}
END_TEST

/* --- server ----------------------------------------------------------------- */

START_TEST(server_autobahn)
{
	char out[TW__WS_RESPONSE_MAX + 1];
	ck_assert_int_eq(status_of(AUTOBAHN_REQUEST), 101);
	response_of(AUTOBAHN_REQUEST, out, sizeof(out));
	ck_assert_str_eq(out, RESPONSE_101);
}
END_TEST

/* Split at every byte (two pieces), with frames behind the block: the
 * verdict comes at the block's end and the frames are left alone. */
START_TEST(server_every_split)
{
	static const char req[] = AUTOBAHN_REQUEST "\x82\x83\x37\xfa\x21\x3d\x56\x98\x42";
	size_t len = sizeof(req) - 1, block = strlen(AUTOBAHN_REQUEST);
	for (size_t cut = 0; cut <= len; cut++) {
		struct tw__ws_req r;
		struct outcome o;
		tw__ws_req_init(&r, 0, 0);
		o = feed_req(&r, req, len, &cut, 1, 0);
		REQUIRE(o.rv == 1 && o.status == 101 && o.used == block);
		tw__ws_req_fini(&r);
	}
	{
		struct outcome o = judge(req, len, 0, 0);
		ck_assert_int_eq(o.status, 101);
		ck_assert_uint_eq(o.used, block);
	}
}
END_TEST

START_TEST(server_case_insensitive)
{
	char out[TW__WS_RESPONSE_MAX + 1];
	/* Any case in names, the value tokens too; LF-only lines; spaces
	 * around values; Connection and Upgrade as lists. */
	static const char req[] = "GET / HTTP/1.1\n"
				  "hOsT:localhost:8786\n"
				  "uPgRaDe:   WebSocket  \n"
				  "CONNECTION: keep-alive, UPGRADE\n"
				  "sec-websocket-key: \t" RFC_KEY "\n"
				  "SEC-WEBSOCKET-VERSION: 13\n"
				  "User-Agent: test\n"
				  "\n";
	ck_assert_int_eq(status_of(req), 101);
	response_of(req, out, sizeof(out));
	ck_assert_str_eq(out, RESPONSE_101);
	ck_assert_int_eq(status_of("GET / HTTP/1.1\r\nHost: a\r\nUpgrade: h2c, websocket\r\n"
				   "Connection: Upgrade\r\nConnection: close\r\n"
				   "Sec-WebSocket-Key: " RFC_KEY
				   "\r\nSec-WebSocket-Version: 13\r\n\r\n"),
			 101);
}
END_TEST

/* A request built from the Autobahn one: one line replaced (by "" to drop
 * it), or extra lines added. */
static char *request_with(const char *name, const char *line, const char *extra)
{
	static const char *lines[] = {
		"GET / HTTP/1.1",      "Host: 127.0.0.1:8765",        "Upgrade: websocket",
		"Connection: Upgrade", "Sec-WebSocket-Key: " RFC_KEY, "Sec-WebSocket-Version: 13"};
	static const char *names[] = {"GET", "Host", "Upgrade", "Connection", "Key", "Version"};
	static char buf[4096];
	size_t n = 0;
	for (int i = 0; i < 6; i++) {
		const char *l = name != NULL && strcmp(name, names[i]) == 0 ? line : lines[i];
		if (l[0] != '\0')
			n += (size_t)snprintf(buf + n, sizeof(buf) - n, "%s\r\n", l);
	}
	snprintf(buf + n, sizeof(buf) - n, "%s\r\n", extra != NULL ? extra : "");
	return buf;
}

struct verdict_case {
	const char *name, *line, *extra;
	int status;
	const char *why;
};

static const struct verdict_case verdicts[] = {
	/* RFC 6455 section 4.4: versions other than 13 */
	{"Version", "Sec-WebSocket-Version: 8", NULL, 426, "Sec-WebSocket-Version is not 13"},
	{"Version", "Sec-WebSocket-Version: 13, 8", NULL, 426, NULL},
	{"Version", "", "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Version: 7\r\n", 426, NULL},
	{"Key", "Sec-WebSocket-Key: !!!!!!!!!!!!!!!!!!!!!!==", NULL, 400, "bad Sec-WebSocket-Key"},
	{"Key", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=", NULL, 400, NULL},
	{"Key", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ===", NULL, 400, NULL},
	{"Key", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZ===", NULL, 400, NULL}, /* 15 bytes */
	{"Key", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZSE=", NULL, 400, NULL}, /* 17 bytes */
	{"Key", "Sec-WebSocket-Key: ", NULL, 400, NULL},
	{"Key", "", NULL, 400, "bad Sec-WebSocket-Key"},
	{NULL, NULL, "Sec-WebSocket-Key: " RFC_KEY "\r\n", 400, "bad Sec-WebSocket-Key"},
	/* the upgrade itself */
	{"Upgrade", "", NULL, 400, "no Upgrade: websocket"},
	{"Upgrade", "Upgrade: h2c", NULL, 400, NULL},
	{"Upgrade", "Upgrade: websockets", NULL, 400, NULL},
	{"Connection", "", NULL, 400, "no Connection: upgrade"},
	{"Connection", "Connection: keep-alive", NULL, 400, NULL},
	{"Connection", "Connection: upgraded", NULL, 400, NULL},
	{"Version", "", NULL, 400, "no Sec-WebSocket-Version"},
	{"Host", "", NULL, 400, "Host missing or repeated"},
	{"Host", "Host:", NULL, 400, NULL},
	{NULL, NULL, "Host: 127.0.0.1:8765\r\n", 400, "Host missing or repeated"},
	/* request line */
	{"GET", "POST / HTTP/1.1", NULL, 400, "method not GET"},
	{"GET", "get / HTTP/1.1", NULL, 400, NULL},
	{"GET", "GET / HTTP/1.0", NULL, 400, "not HTTP/1.1"},
	{"GET", "GET / HTTP/2.0", NULL, 400, NULL},
	{"GET", "GET / HTTP/1.1 ", NULL, 400, NULL},
	{"GET", "GET  / HTTP/1.1", NULL, 400, NULL},
	{"GET", "GET /", NULL, 400, "malformed request line"},
	{"GET", "GET", NULL, 400, NULL},
	{"GET", "GET * HTTP/1.1", NULL, 400, "request target not a path"},
	{"GET", "GET http://127.0.0.1:8765/ HTTP/1.1", NULL, 400, NULL},
	{"GET", "", NULL, 400, NULL}, /* first line is Host */
	/* path */
	{"GET", "GET /foo HTTP/1.1", NULL, 404, "path is not /"},
	{"GET", "GET /index.html?x=1 HTTP/1.1", NULL, 404, NULL},
	{"GET", "GET //  HTTP/1.1", NULL, 400, NULL},
	{"GET", "GET /?x=1 HTTP/1.1", NULL, 101, ""},
	{"GET", "GET /? HTTP/1.1", NULL, 101, NULL},
	/* header syntax */
	{NULL, NULL, "NoColon\r\n", 400, "malformed header line"},
	{NULL, NULL, "Bad Name: x\r\n", 400, NULL},
	{NULL, NULL, "Name : x\r\n", 400, NULL},
	{NULL, NULL, ": x\r\n", 400, NULL},
	{NULL, NULL, "X-A: 1\r\n folded\r\n", 400, NULL},
	{NULL, NULL, "X-A: a\rb\r\n", 400, NULL},
	{NULL, NULL, "X-A: a\x01\r\n", 400, NULL},
	{NULL, NULL, "X-A: caf\xc3\xa9\r\n", 101, NULL}, /* obs-text in a value */
	{NULL, NULL, "X-Empty:\r\n", 101, NULL},
	/* no body on an upgrade */
	{NULL, NULL, "Transfer-Encoding: chunked\r\n", 400, "request has a body"},
	{NULL, NULL, "Content-Length: 5\r\n", 400, NULL},
	{NULL, NULL, "Content-Length: x\r\n", 400, NULL},
	{NULL, NULL, "Content-Length: 0\r\n", 101, NULL},
	/* Origin: docs/design.md's policy (WebSocket: host compared, ports
	 * not) */
	{NULL, NULL, "Origin: http://127.0.0.1:8765\r\n", 101, NULL},
	{NULL, NULL, "Origin: https://127.0.0.1\r\n", 101, NULL},
	{NULL, NULL, "Origin: http://127.0.0.1:9999\r\n", 101, NULL},
	{NULL, NULL, "Origin: http://evil.example\r\n", 403, "Origin is not this host"},
	{NULL, NULL, "Origin: http://127.0.0.10:8765\r\n", 403, NULL},
	{NULL, NULL, "Origin: http://127.0.0.1.evil:8765\r\n", 403, NULL},
	{NULL, NULL, "Origin: http://127.0.0.1@evil:8765\r\n", 403, NULL},
	{NULL, NULL, "Origin: http://evil@127.0.0.1:8765\r\n", 403, NULL},
	{NULL, NULL, "Origin: null\r\n", 403, NULL},
	{NULL, NULL, "Origin: 127.0.0.1\r\n", 403, NULL},
	{NULL, NULL, "Origin:\r\n", 403, NULL},
	{NULL, NULL, "Origin: http://127.0.0.1\r\nOrigin: http://127.0.0.1\r\n", 403, NULL},
	{"Host", "Host: LocalHost:1", "Origin: http://localhost:2\r\n", 101, NULL},
	{"Host", "Host: [::1]:8765", "Origin: http://[::1]:3000\r\n", 101, NULL},
	{"Host", "Host: [::1]:8765", "Origin: http://[::2]:8765\r\n", 403, NULL},
	{"Host", "Host: example.com", "Origin: https://example.com/path\r\n", 101, NULL},
	/* offers are declined by silence, not refused */
	{NULL, NULL, "Sec-WebSocket-Extensions: permessage-deflate\r\n", 101, NULL},
	{NULL, NULL, "Sec-WebSocket-Protocol: chat\r\n", 101, NULL},
};
#define N_VERDICTS ((int)(sizeof(verdicts) / sizeof(verdicts[0])))

START_TEST(server_verdicts)
{
	const struct verdict_case *c = &verdicts[_i];
	const char *req = request_with(c->name, c->line, c->extra);
	char copy[4096], out[TW__WS_RESPONSE_MAX + 1];
	struct tw__ws_req r;
	size_t used;
	int n;
	snprintf(copy, sizeof(copy), "%s", req);
	ck_assert_msg(status_of(copy) == c->status, "case %d: %s: status %d", _i, copy,
		      status_of(copy));
	tw__ws_req_init(&r, 0, 0);
	ck_assert_int_eq(tw__ws_req_feed(&r, (const uint8_t *)copy, strlen(copy), &used), 1);
	if (c->why != NULL)
		ck_assert_str_eq(tw__ws_req_error(&r), c->why);
	n = tw__ws_req_response(&r, out, sizeof(out) - 1);
	ck_assert_int_gt(n, 0);
	out[n] = '\0';
	/* Never an extension or subprotocol in a response. */
	ck_assert_ptr_null(strstr(out, "Sec-WebSocket-Extensions"));
	ck_assert_ptr_null(strstr(out, "Sec-WebSocket-Protocol"));
	if (c->status == 101) {
		ck_assert_str_eq(out, RESPONSE_101);
		ck_assert_str_eq(tw__ws_req_error(&r), "");
	} else {
		char line[64];
		snprintf(line, sizeof(line), "HTTP/1.1 %d ", c->status);
		ck_assert_msg(strncmp(out, line, strlen(line)) == 0, "%s", out);
		ck_assert_ptr_nonnull(strstr(out, "\r\nContent-Length: 0\r\n"));
		ck_assert_ptr_nonnull(strstr(out, "\r\nConnection: close\r\n"));
		ck_assert_ptr_null(strstr(out, "Sec-WebSocket-Accept"));
		ck_assert_int_eq(strstr(out, "\r\nSec-WebSocket-Version: 13\r\n") != NULL,
				 c->status == 426);
		ck_assert_str_eq(out + n - 4, "\r\n\r\n");
	}
	tw__ws_req_fini(&r);
}
END_TEST

START_TEST(server_responses)
{
	char out[TW__WS_RESPONSE_MAX + 1];
	response_of(request_with("Version", "Sec-WebSocket-Version: 8", NULL), out, sizeof(out));
	ck_assert_str_eq(out, "HTTP/1.1 426 Upgrade Required\r\nUpgrade: websocket\r\n"
			      "Sec-WebSocket-Version: 13\r\nContent-Length: 0\r\n"
			      "Connection: close\r\n\r\n");
	response_of(request_with("GET", "GET /x HTTP/1.1", NULL), out, sizeof(out));
	ck_assert_str_eq(
		out, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
	response_of(request_with("Key", "", NULL), out, sizeof(out));
	ck_assert_str_eq(
		out, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
	response_of(request_with(NULL, NULL, "Origin: http://evil\r\n"), out, sizeof(out));
	ck_assert_str_eq(
		out, "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
}
END_TEST

/* A verdict is final; the response needs one and room for it. */
START_TEST(server_sticky)
{
	struct tw__ws_req r;
	size_t used = 99;
	char out[TW__WS_RESPONSE_MAX];
	tw__ws_req_init(&r, 0, 0);
	ck_assert_int_eq(tw__ws_req_response(&r, out, sizeof(out)), TW_EINVAL);
	ck_assert_ptr_null(tw__ws_req_error(&r));
	ck_assert_int_eq(tw__ws_req_feed(&r, (const uint8_t *)"GET", 3, &used), 0);
	ck_assert_uint_eq(used, 3);
	ck_assert_int_eq(tw__ws_req_status(&r), 0);
	ck_assert_int_eq(tw__ws_req_feed(&r, (const uint8_t *)" /x HTTP/1.1\r\n\r\n", 16, &used),
			 1);
	ck_assert_int_eq(tw__ws_req_status(&r), 404);
	ck_assert_int_eq(tw__ws_req_feed(&r, (const uint8_t *)"GET / HTTP/1.1\r\n", 16, &used), 1);
	ck_assert_uint_eq(used, 0);
	ck_assert_int_eq(tw__ws_req_status(&r), 404);
	ck_assert_int_eq(tw__ws_req_response(&r, out, 20), TW_EINVAL);
	ck_assert_int_gt(tw__ws_req_response(&r, out, sizeof(out)), 20);
	tw__ws_req_fini(&r);
	tw__ws_req_fini(&r); /* twice is harmless */
	/* An empty request (a blank first line). */
	tw__ws_req_init(&r, 0, 0);
	ck_assert_int_eq(tw__ws_req_feed(&r, (const uint8_t *)"\r\nGET", 5, &used), 1);
	ck_assert_uint_eq(used, 2);
	ck_assert_int_eq(tw__ws_req_status(&r), 400);
	tw__ws_req_fini(&r);
}
END_TEST

/* Header floods and the limits: 431 as soon as a limit is passed, memory
 * never above the limit. */
START_TEST(server_limits)
{
	const char *base = request_with(NULL, NULL, NULL);
	size_t base_len = strlen(base), big = (size_t)1 << 20;
	char *req = malloc(big + 4096);
	struct outcome o;
	struct tw__ws_req r;
	size_t off, n;
	ck_assert_ptr_nonnull(req);
	/* 2,000 header lines: 431 on the 101st field line. */
	memcpy(req, base, base_len - 2);
	n = base_len - 2;
	for (int i = 0; i < 2000; i++)
		n += (size_t)sprintf(req + n, "X-%d: y\r\n", i);
	n += (size_t)sprintf(req + n, "\r\n");
	o = judge(req, n, 0, 0);
	ck_assert_int_eq(o.rv, 1);
	ck_assert_int_eq(o.status, 431);
	{
		/* 5 fields in the base request, so X-0..X-94 fit, X-95 is the
		 * 101st. */
		const char *cut = strstr(req, "X-95: y\r\n");
		ck_assert_uint_eq(o.used, (size_t)(cut - req) + 9);
	}
	/* 1 MiB of headers in one line, then in many: 431 within the first
	 * 8 KiB, the buffer never larger than 8 KiB. */
	for (int shape = 0; shape < 2; shape++) {
		memcpy(req, base, base_len - 2);
		n = base_len - 2;
		n += (size_t)sprintf(req + n, "X-Big: ");
		while (n < big) {
			req[n++] = 'a';
			if (shape == 1 && n % 80 == 0) {
				memcpy(req + n, "\r\nX: ", 5);
				n += 5;
			}
		}
		n += (size_t)sprintf(req + n, "\r\n\r\n");
		tw__ws_req_init(&r, 0, 20000);
		for (off = 0; off < n && tw__ws_req_status(&r) == 0; off += 1000) {
			size_t used;
			int rv = tw__ws_req_feed(&r, (const uint8_t *)req + off,
						 n - off < 1000 ? n - off : 1000, &used);
			REQUIRE(r.head.cap <= TW__WS_DEFAULT_MAX_HEADER_BYTES);
			REQUIRE(rv == 0 || rv == 1);
		}
		ck_assert_int_eq(tw__ws_req_status(&r), 431);
		ck_assert_uint_le(off, 9000);
		ck_assert_str_eq(tw__ws_req_error(&r), "request header block too big");
		ck_assert_ptr_null(r.head.buf); /* released on the verdict */
		tw__ws_req_fini(&r);
	}
	/* Exactly at the limits is fine; one more is not. */
	{
		char small[512];
		size_t sn;
		snprintf(small, sizeof(small), "%s", base);
		sn = strlen(small);
		o = judge(small, sn, sn, 5);
		ck_assert_int_eq(o.status, 101);
		o = judge(small, sn, sn - 1, 5);
		ck_assert_int_eq(o.status, 431);
		ck_assert_uint_eq(o.used, sn - 1);
		o = judge(small, sn, sn, 4);
		ck_assert_int_eq(o.status, 431);
	}
	/* 100 fields by default. */
	memcpy(req, base, base_len - 2);
	n = base_len - 2;
	for (int i = 0; i < 95; i++)
		n += (size_t)sprintf(req + n, "X-%d: y\r\n", i);
	n += (size_t)sprintf(req + n, "\r\n");
	ck_assert_int_eq(judge(req, n, 0, 0).status, 101);
	free(req);
}
END_TEST

/* Input that ends at an inaccessible page: no byte past it is read. */
START_TEST(guard_page)
{
	static const char resp[] = RESPONSE_101;
	struct guarded g;
	struct tw__ws_req r;
	struct tw__ws_client c;
	size_t len = strlen(AUTOBAHN_REQUEST), used;
	for (size_t cut = 1; cut <= len; cut++) {
		/* A request cut short, then whole. */
		guard_copy(&g, AUTOBAHN_REQUEST, cut);
		tw__ws_req_init(&r, 0, 0);
		REQUIRE(tw__ws_req_feed(&r, g.p, cut, &used) == (cut == len));
		tw__ws_req_fini(&r);
		guard_free(&g);
	}
	guard_copy(&g, resp, strlen(resp));
	ck_assert_int_eq(tw__ws_client_init_nonce(&c, RFC_NONCE, 0, 0), 0);
	ck_assert_int_eq(tw__ws_client_feed(&c, g.p, strlen(resp), &used), 1);
	ck_assert_uint_eq(used, strlen(resp));
	tw__ws_client_fini(&c);
	guard_free(&g);
	/* A malformed request line at the very end. */
	guard_copy(&g, "GET\r\n\r\n", 7);
	tw__ws_req_init(&r, 0, 0);
	ck_assert_int_eq(tw__ws_req_feed(&r, g.p, 7, &used), 1);
	ck_assert_int_eq(tw__ws_req_status(&r), 400);
	tw__ws_req_fini(&r);
	guard_free(&g);
}
END_TEST

/* --- client ------------------------------------------------------------------ */

START_TEST(client_request)
{
	struct tw__ws_client c;
	char out[TW__WS_REQUEST_MAX], host[300];
	int n;
	ck_assert_int_eq(tw__ws_client_init_nonce(&c, RFC_NONCE, 0, 0), 0);
	n = tw__ws_client_request(&c, "127.0.0.1", 8765, out, sizeof(out));
	ck_assert_int_eq(n, (int)strlen(AUTOBAHN_REQUEST));
	ck_assert_str_eq(out, AUTOBAHN_REQUEST);
	ck_assert_ptr_null(strstr(out, "Origin"));
	/* Our server accepts our request. */
	ck_assert_int_eq(status_of(out), 101);
	/* IPv6 literals get brackets once. */
	ck_assert_int_gt(tw__ws_client_request(&c, "::1", 80, out, sizeof(out)), 0);
	ck_assert_ptr_nonnull(strstr(out, "\r\nHost: [::1]:80\r\n"));
	ck_assert_int_eq(status_of(out), 101);
	ck_assert_int_gt(tw__ws_client_request(&c, "[fe80::1%25eth0]", 65535, out, sizeof(out)), 0);
	ck_assert_ptr_nonnull(strstr(out, "\r\nHost: [fe80::1%25eth0]:65535\r\n"));
	/* Refused: header injection, empty or long hosts, bad ports, small
	 * buffers. */
	ck_assert_int_eq(tw__ws_client_request(&c, "a\r\nX: y", 80, out, sizeof(out)), TW_EINVAL);
	ck_assert_int_eq(tw__ws_client_request(&c, "a b", 80, out, sizeof(out)), TW_EINVAL);
	ck_assert_int_eq(tw__ws_client_request(&c, "a/b", 80, out, sizeof(out)), TW_EINVAL);
	ck_assert_int_eq(tw__ws_client_request(&c, "", 80, out, sizeof(out)), TW_EINVAL);
	ck_assert_int_eq(tw__ws_client_request(&c, NULL, 80, out, sizeof(out)), TW_EINVAL);
	ck_assert_int_eq(tw__ws_client_request(&c, "h", 0, out, sizeof(out)), TW_EINVAL);
	ck_assert_int_eq(tw__ws_client_request(&c, "h", 65536, out, sizeof(out)), TW_EINVAL);
	ck_assert_int_eq(tw__ws_client_request(&c, "127.0.0.1", 8765, out, 50), TW_EINVAL);
	ck_assert_int_eq(
		tw__ws_client_request(&c, "127.0.0.1", 8765, out, strlen(AUTOBAHN_REQUEST)),
		TW_EINVAL);
	memset(host, 'h', 255);
	host[255] = '\0';
	ck_assert_int_gt(tw__ws_client_request(&c, host, 65535, out, sizeof(out)), 0);
	host[255] = 'h';
	host[256] = '\0';
	ck_assert_int_eq(tw__ws_client_request(&c, host, 1, out, sizeof(out)), TW_EINVAL);
	tw__ws_client_fini(&c);
}
END_TEST

/* RFC 6455 section 4.1: frames bundled with the 101, at every split of the response: the
 * client stops at the block's end, and the rest decodes as frames. */
START_TEST(client_bundled_frames)
{
	static const char resp[] = RESPONSE_101 "\x82\x03"
						"abc"
						"\x89\x00";
	size_t len = sizeof(resp) - 1, block = strlen(RESPONSE_101);
	for (size_t cut = 0; cut <= len; cut++) {
		struct tw__ws_client c;
		struct outcome o;
		struct tw__ws_dec d;
		struct tw__ws_event ev;
		uint8_t *dst, payload[3];
		size_t k = block;
		ck_assert_int_eq(tw__ws_client_init_nonce(&c, RFC_NONCE, 0, 0), 0);
		o = feed_client(&c, resp, len, &cut, 1, 0);
		REQUIRE(o.rv == 1 && o.status == 101 && o.used == block);
		tw__ws_client_fini(&c);
		/* The rest goes to a client decoder. */
		tw__ws_dec_init(&d, TW__WS_CLIENT, 0, 0);
		while (tw__ws_dec_phase(&d) == TW__WS_DEC_BYTES && k < len) {
			size_t w = tw__ws_dec_want(&d, &dst);
			memcpy(dst, resp + k, w);
			k += w;
			REQUIRE(tw__ws_dec_advance(&d, w, &ev) >= 0);
		}
		REQUIRE(ev.type == TW__WS_EV_DATA && ev.length == 3);
		memcpy(payload, resp + k, 3);
		k += 3;
		REQUIRE(tw__ws_dec_payload_done(&d, payload, 3, &ev) == 1);
		REQUIRE(memcmp(payload, "abc", 3) == 0);
		dst = NULL;
		REQUIRE(tw__ws_dec_want(&d, &dst) == 2);
		memcpy(dst, resp + k, 2);
		REQUIRE(tw__ws_dec_advance(&d, 2, &ev) == 1 && ev.type == TW__WS_EV_PING);
	}
}
END_TEST

START_TEST(client_accepts)
{
	static const char *ok[] = {
		RESPONSE_101,
		/* no reason phrase, any case, LF lines, extra headers */
		"HTTP/1.1 101\r\nupgrade: WEBSOCKET\r\nconnection: upgrade\r\n"
		"sec-websocket-accept: " RFC_ACCEPT "\r\nServer: x\r\n\r\n",
		"HTTP/1.1 101 Switching Protocols\nUpgrade: websocket\nConnection: keep-alive, "
		"Upgrade\nSec-WebSocket-Accept:" RFC_ACCEPT "\nDate: now\n\n",
	};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		size_t len = strlen(ok[i]);
		for (size_t cut = 0; cut <= len; cut++) {
			struct tw__ws_client c;
			struct outcome o;
			ck_assert_int_eq(tw__ws_client_init_nonce(&c, RFC_NONCE, 0, 0), 0);
			o = feed_client(&c, ok[i], len, &cut, 1, cut == len);
			REQUIRE(o.rv == 1 && o.used == len && o.status == 101);
			REQUIRE(tw__ws_client_error(&c) == NULL);
			/* Final: more bytes are not consumed. */
			REQUIRE(tw__ws_client_feed(&c, (const uint8_t *)"x", 1, &o.used) == 1);
			REQUIRE(o.used == 0);
			tw__ws_client_fini(&c);
		}
	}
}
END_TEST

struct client_bad {
	const char *resp, *why;
	int status;
};

#define H101   "HTTP/1.1 101 Switching Protocols\r\n"
#define UPG    "Upgrade: websocket\r\n"
#define CONN   "Connection: Upgrade\r\n"
#define ACCEPT "Sec-WebSocket-Accept: " RFC_ACCEPT "\r\n"

static const struct client_bad client_bads[] = {
	/* RFC 6455 section 4.1: the client's checks of the 101 */
	{H101 UPG CONN "Sec-WebSocket-Accept: AAAAAAAAAAAAAAAAAAAAAAAAAAA=\r\n\r\n",
	 "wrong Sec-WebSocket-Accept", 101},
	{H101 UPG CONN ACCEPT "Sec-WebSocket-Extensions: permessage-deflate\r\n\r\n",
	 "unrequested Sec-WebSocket-Extensions", 101},
	{"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "status is not 101", 200},
	/* status line */
	{"HTTP/1.1 426 Upgrade Required\r\nSec-WebSocket-Version: 13\r\n\r\n", "status is not 101",
	 426},
	{"HTTP/1.0 101 Switching Protocols\r\n" UPG CONN ACCEPT "\r\n", "malformed status line", 0},
	{"HTTP/1.1 10 Switching\r\n" UPG CONN ACCEPT "\r\n", "malformed status line", 0},
	{"HTTP/1.1 1010\r\n" UPG CONN ACCEPT "\r\n", "malformed status line", 0},
	{"HTTP/1.1  101\r\n" UPG CONN ACCEPT "\r\n", "malformed status line", 0},
	{"SSH-2.0-OpenSSH_9.2\r\n\r\n", "malformed status line", 0},
	{"\r\n", "malformed status line", 0},
	/* the headers */
	{H101 CONN ACCEPT "\r\n", "no Upgrade: websocket", 101},
	{H101 "Upgrade: h2c\r\n" CONN ACCEPT "\r\n", "no Upgrade: websocket", 101},
	{H101 "Upgrade: websocket, h2c\r\n" CONN ACCEPT "\r\n", "no Upgrade: websocket", 101},
	{H101 UPG UPG CONN ACCEPT "\r\n", "no Upgrade: websocket", 101},
	{H101 UPG ACCEPT "\r\n", "no Connection: upgrade", 101},
	{H101 UPG "Connection: close\r\n" ACCEPT "\r\n", "no Connection: upgrade", 101},
	{H101 UPG CONN "\r\n", "wrong Sec-WebSocket-Accept", 101},
	{H101 UPG CONN ACCEPT ACCEPT "\r\n", "wrong Sec-WebSocket-Accept", 101},
	{H101 UPG CONN "Sec-WebSocket-Accept: s3pplmbitxaq9kygzzhzrbk+xoo=\r\n\r\n",
	 "wrong Sec-WebSocket-Accept", 101},
	{H101 UPG CONN "Sec-WebSocket-Accept: " RFC_ACCEPT "x\r\n\r\n",
	 "wrong Sec-WebSocket-Accept", 101},
	{H101 UPG CONN ACCEPT "Sec-WebSocket-Protocol: chat\r\n\r\n",
	 "unrequested Sec-WebSocket-Protocol", 101},
	{H101 UPG CONN ACCEPT "sec-websocket-extensions:\r\n\r\n",
	 "unrequested Sec-WebSocket-Extensions", 101},
	{H101 UPG CONN ACCEPT "Bad Header\r\n\r\n", "malformed header line", 101},
	{H101 UPG CONN ACCEPT " folded\r\n\r\n", "malformed header line", 101},
};
#define N_CLIENT_BADS ((int)(sizeof(client_bads) / sizeof(client_bads[0])))

START_TEST(client_rejects)
{
	const struct client_bad *b = &client_bads[_i];
	size_t len = strlen(b->resp);
	for (size_t cut = 0; cut <= len; cut++) {
		struct tw__ws_client c;
		struct outcome o;
		size_t used = 99;
		ck_assert_int_eq(tw__ws_client_init_nonce(&c, RFC_NONCE, 0, 0), 0);
		o = feed_client(&c, b->resp, len, &cut, 1, cut == 0);
		ck_assert_msg(o.rv == TW_EPROTO && o.used == len && o.status == b->status,
			      "%s: rv %d used %zu status %d", b->resp, o.rv, o.used, o.status);
		ck_assert_str_eq(tw__ws_client_error(&c), b->why);
		/* Sticky. */
		REQUIRE(tw__ws_client_feed(&c, (const uint8_t *)RESPONSE_101, 10, &used) ==
			TW_EPROTO);
		REQUIRE(used == 0);
		tw__ws_client_fini(&c);
	}
}
END_TEST

/* The response's limits: 1 MiB of headers, 2,000 lines. */
START_TEST(client_limits)
{
	size_t big = (size_t)1 << 20, n, off;
	char *resp = malloc(big + 64);
	struct tw__ws_client c;
	struct outcome o;
	ck_assert_ptr_nonnull(resp);
	n = (size_t)sprintf(resp, H101 UPG CONN ACCEPT);
	while (n < big)
		n += (size_t)sprintf(resp + n,
				     "X-Pad: 0123456789012345678901234567890123456789\r\n");
	n += (size_t)sprintf(resp + n, "\r\n");
	ck_assert_int_eq(tw__ws_client_init_nonce(&c, RFC_NONCE, 0, 0), 0);
	o = feed_client(&c, resp, n, NULL, 0, 0);
	ck_assert_int_eq(o.rv, TW_EPROTO);
	ck_assert_str_eq(tw__ws_client_error(&c), "too many response header fields");
	ck_assert_uint_lt(o.used, 8192);
	tw__ws_client_fini(&c);
	ck_assert_int_eq(tw__ws_client_init_nonce(&c, RFC_NONCE, 0, 100000), 0);
	for (off = 0; off < n && c.result == 0; off += 4096) {
		size_t used;
		tw__ws_client_feed(&c, (const uint8_t *)resp + off, n - off < 4096 ? n - off : 4096,
				   &used);
		REQUIRE(c.head.cap <= TW__WS_DEFAULT_MAX_HEADER_BYTES);
	}
	ck_assert_int_eq(c.result, TW_EPROTO);
	ck_assert_str_eq(tw__ws_client_error(&c), "response header block too big");
	ck_assert_uint_le(off, 8192 + 4096);
	tw__ws_client_fini(&c);
	free(resp);
}
END_TEST

/* Our client and our server agree, with random keys. */
START_TEST(client_server)
{
	for (int i = 0; i < 100; i++) {
		struct tw__ws_client c;
		struct tw__ws_req r;
		char req[TW__WS_REQUEST_MAX], resp[TW__WS_RESPONSE_MAX];
		size_t used;
		int n, m;
		ck_assert_int_eq(tw__ws_client_init(&c, 0, 0), 0);
		n = tw__ws_client_request(&c, i % 2 ? "localhost" : "::1", (unsigned)(1000 + i),
					  req, sizeof(req));
		REQUIRE(n > 0);
		tw__ws_req_init(&r, 0, 0);
		REQUIRE(tw__ws_req_feed(&r, (const uint8_t *)req, (size_t)n, &used) == 1);
		REQUIRE(used == (size_t)n && tw__ws_req_status(&r) == 101);
		m = tw__ws_req_response(&r, resp, sizeof(resp));
		REQUIRE(m > 0);
		REQUIRE(tw__ws_client_feed(&c, (const uint8_t *)resp, (size_t)m, &used) == 1);
		REQUIRE(used == (size_t)m);
		tw__ws_req_fini(&r);
		tw__ws_client_fini(&c);
	}
}
END_TEST

int main(void)
{
	TCase *srv =
		ts_tcase("server", 0,
			 TS_TESTS(server_autobahn, server_every_split, server_case_insensitive));
	TCase *cli = ts_tcase("client", 0,
			      TS_TESTS(client_request, client_bundled_frames, client_accepts));
	ts_add_loop(srv, N_VERDICTS, TS_TESTS(server_verdicts));
	ts_add(srv, TS_TESTS(server_responses, server_sticky, server_limits, guard_page));
	ts_add_loop(cli, N_CLIENT_BADS, TS_TESTS(client_rejects));
	ts_add(cli, TS_TESTS(client_limits, client_server));
	return ts_main(
		"ws_upgrade", 0,
		TS_CASES(ts_tcase("keys", 0, TS_TESTS(accept_value, client_keys)), srv, cli));
}
