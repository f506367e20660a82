/* SPDX-License-Identifier: BSD-3-Clause */
/* Fuzz target: the WebSocket opening handshake (transport/ws_upgrade.c).
 *
 * Byte 0 of the input picks the setup:
 *   bit 0     0: the rest is a request to a server parser; 1: the rest is
 *             a response to a client whose nonce is RFC 6455's example
 *             ("the sample nonce", accept s3pPLMBiTxaQ9kYGzzhZRbK+xOo=)
 *   bits 1-2  max_header_bytes: the default (8 KiB), 64, 256, 1024
 *   bits 3-4  max_header_fields: the default (100), 1, 5, 20
 * The input is fed in one piece, one byte at a time, and in random pieces
 * of 1..97 bytes: the result, the bytes consumed, the status and the
 * reason must be the same. Invariants: the header buffer never grows past
 * the limit; a server verdict is one of 101, 400, 403, 404, 426, 431 and
 * its response is well formed, never names an extension or subprotocol,
 * and, for a 101 whose key is canonical base64, is accepted by a client
 * holding that key; a client accepts only a response that carries the
 * right accept value and no extension.
 *
 * Built by `CC=clang ./configure --enable-fuzzers && make` (see
 * tests/Makefile.inc); replayed over tests/fuzz/corpus/ws_upgrade by
 * tests/check_ws_fuzz_replay under `make check`. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/evp.h>

#include <taskwire/error.h>

#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/fuzz_ws.h"
#include "transport/ws_upgrade.h"

#define RFC_ACCEPT "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="

static const uint8_t RFC_NONCE[16] = {'t', 'h', 'e', ' ', 's', 'a', 'm', 'p',
				      'l', 'e', ' ', 'n', 'o', 'n', 'c', 'e'};

struct cfg {
	int client;
	size_t max_bytes, max_fields;
};

struct outcome {
	int rv;
	size_t used;
	int status;
	const char *why;
};

static void check(int ok)
{
	if (!ok)
		abort();
}

static uint64_t next(uint64_t *s)
{
	*s = *s * UINT64_C(6364136223846793005) + UINT64_C(1442695040888963407);
	return *s >> 33;
}

static size_t piece(size_t left, size_t max_piece, uint64_t *seed)
{
	size_t k = max_piece == 0 ? left : seed == NULL ? 1 : 1 + next(seed) % max_piece;
	return k < left ? k : left;
}

/* p[0..n) holds s, case-insensitive. */
static int has_nocase(const uint8_t *p, size_t n, const char *s)
{
	size_t k = strlen(s);
	for (size_t i = 0; i + k <= n; i++)
		if (strncasecmp((const char *)p + i, s, k) == 0)
			return 1;
	return 0;
}

/* The value of the request's Sec-WebSocket-Key line (the request was
 * judged 101, so there is exactly one and it is 24 characters). */
static const char *find_key(const uint8_t *p, size_t n)
{
	static const char name[] = "sec-websocket-key";
	size_t k = sizeof(name) - 1;
	for (size_t i = 0; i + k < n; i++) {
		size_t j;
		if ((i != 0 && p[i - 1] != '\n') ||
		    strncasecmp((const char *)p + i, name, k) != 0 || p[i + k] != ':')
			continue;
		for (j = i + k + 1; j < n && (p[j] == ' ' || p[j] == '\t'); j++)
			;
		check(j + TW__WS_KEY_CHARS <= n);
		return (const char *)p + j;
	}
	return NULL;
}

/* A 101 response: a client with the request's key accepts it whole. */
static void check_roundtrip(const uint8_t *req, size_t req_len, const char *resp, size_t resp_len)
{
	const char *key = find_key(req, req_len);
	uint8_t nonce[20];
	struct tw__ws_client c;
	size_t used;
	check(key != NULL);
	check(EVP_DecodeBlock(nonce, (const unsigned char *)key, TW__WS_KEY_CHARS) == 18);
	check(tw__ws_client_init_nonce(&c, nonce, 0, 0) == 0);
	/* Only canonical keys encode back to themselves (the last
	 * character's low bits are free). */
	if (memcmp(tw__ws_client_key(&c), key, TW__WS_KEY_CHARS) == 0) {
		check(tw__ws_client_feed(&c, (const uint8_t *)resp, resp_len, &used) == 1);
		check(used == resp_len);
	}
	tw__ws_client_fini(&c);
}

static void check_response(const struct tw__ws_req *r, const uint8_t *p, size_t used)
{
	char out[TW__WS_RESPONSE_MAX], line[16];
	int n = tw__ws_req_response(r, out, sizeof(out));
	int status = tw__ws_req_status(r);
	check(n > 0 && (size_t)n <= sizeof(out));
	snprintf(line, sizeof(line), "HTTP/1.1 %d ", status);
	check(memcmp(out, line, strlen(line)) == 0);
	check(memcmp(out + n - 4, "\r\n\r\n", 4) == 0);
	check(!has_nocase((const uint8_t *)out, (size_t)n, "Sec-WebSocket-Extensions"));
	check(!has_nocase((const uint8_t *)out, (size_t)n, "Sec-WebSocket-Protocol"));
	check(tw__ws_req_response(r, out, (size_t)n - 1) == TW_EINVAL);
	if (status == 101)
		check_roundtrip(p, used, out, (size_t)n);
	else
		check(has_nocase((const uint8_t *)out, (size_t)n, "\r\nConnection: close\r\n"));
}

/* Feed the request parser r, or (r NULL) the response parser cl, in
 * pieces of at most max_piece bytes until the verdict; the outcome. */
static struct outcome feed(struct tw__ws_req *r, struct tw__ws_client *cl, const uint8_t *p,
			   size_t n, size_t max_piece, uint64_t *seed)
{
	const struct tw__ws_head *head = r != NULL ? &r->head : &cl->head;
	struct outcome o = {0, 0, 0, NULL};
	size_t off = 0;
	while (off < n && o.rv == 0) {
		size_t k = piece(n - off, max_piece, seed), used = 0;
		o.rv = r != NULL ? tw__ws_req_feed(r, p + off, k, &used)
				 : tw__ws_client_feed(cl, p + off, k, &used);
		check(used <= k && (o.rv != 0 || used == k));
		check(head->cap <= head->max_bytes);
		off += used;
	}
	o.used = off;
	o.status = r != NULL ? tw__ws_req_status(r) : tw__ws_client_status(cl);
	o.why = r != NULL ? tw__ws_req_error(r) : tw__ws_client_error(cl);
	return o;
}

static struct outcome server_run(const struct cfg *c, const uint8_t *p, size_t n, size_t max_piece,
				 uint64_t *seed)
{
	struct tw__ws_req r;
	struct outcome o;
	tw__ws_req_init(&r, c->max_bytes, c->max_fields);
	o = feed(&r, NULL, p, n, max_piece, seed);
	check(o.rv == 0 || o.rv == 1 || o.rv == TW_ENOMEM);
	if (o.rv == 1) {
		size_t used = 99;
		check(o.status == 101 || o.status == 400 || o.status == 403 || o.status == 404 ||
		      o.status == 426 || o.status == 431);
		check(o.why != NULL && (o.why[0] == '\0') == (o.status == 101));
		check(o.status == 431 || (o.used >= 1 && p[o.used - 1] == '\n'));
		check_response(&r, p, o.used);
		check(tw__ws_req_feed(&r, p, n, &used) == 1 && used == 0);
	} else if (o.rv == 0) {
		check(o.used == n && o.status == 0 && o.why == NULL);
	}
	tw__ws_req_fini(&r);
	return o;
}

static struct outcome client_run(const struct cfg *c, const uint8_t *p, size_t n, size_t max_piece,
				 uint64_t *seed)
{
	struct tw__ws_client cl;
	struct outcome o;
	check(tw__ws_client_init_nonce(&cl, RFC_NONCE, c->max_bytes, c->max_fields) == 0);
	o = feed(NULL, &cl, p, n, max_piece, seed);
	check(o.rv == 0 || o.rv == 1 || o.rv == TW_EPROTO || o.rv == TW_ENOMEM);
	if (o.rv == 1) {
		check(o.status == 101 && o.why == NULL);
		check(o.used >= 2 && p[o.used - 1] == '\n');
		check(has_nocase(p, o.used, RFC_ACCEPT));
		/* No such header line (names such as X-Sec-WebSocket-Protocol
		 * are other headers). */
		check(!has_nocase(p, o.used, "\nsec-websocket-extensions:"));
		check(!has_nocase(p, o.used, "\nsec-websocket-protocol:"));
	} else if (o.rv == TW_EPROTO) {
		check(o.why != NULL);
	} else if (o.rv == 0) {
		check(o.used == n && o.why == NULL);
	}
	tw__ws_client_fini(&cl);
	return o;
}

static struct outcome one(const struct cfg *c, const uint8_t *p, size_t n, size_t max_piece,
			  uint64_t *seed)
{
	return c->client ? client_run(c, p, n, max_piece, seed)
			 : server_run(c, p, n, max_piece, seed);
}

static int same(struct outcome a, struct outcome b)
{
	return a.rv == b.rv && a.used == b.used && a.status == b.status && a.why == b.why;
}

int ws_fuzz_upgrade(const uint8_t *data, size_t size)
{
	static const size_t bytes[] = {0, 64, 256, 1024}, fields[] = {0, 1, 5, 20};
	struct cfg c;
	struct outcome a, b, d;
	uint64_t seed = size;
	if (size == 0)
		return 0;
	c.client = data[0] & 1;
	c.max_bytes = bytes[(data[0] >> 1) & 3];
	c.max_fields = fields[(data[0] >> 3) & 3];
	a = one(&c, data + 1, size - 1, 0, NULL);
	b = one(&c, data + 1, size - 1, 1, NULL);
	d = one(&c, data + 1, size - 1, 97, &seed);
	check(same(a, b) && same(a, d));
	return 0;
}

#ifndef TW_FUZZ_REPLAY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return ws_fuzz_upgrade(data, size);
}
#endif
