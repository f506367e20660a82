/* SPDX-License-Identifier: BSD-3-Clause */
/* WebSocket opening handshake (transport/ws_upgrade.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <taskwire/error.h>

#include "transport/ws_upgrade.h"

/* --- the header block ------------------------------------------------- */

enum { HEAD_MORE, HEAD_DONE, HEAD_TOO_BIG, HEAD_TOO_MANY };

#define HEAD_FIRST_CAP 512

static void head_init(struct tw__ws_head *h, size_t max_bytes, size_t max_fields)
{
	memset(h, 0, sizeof(*h));
	h->max_bytes = max_bytes != 0 ? max_bytes : TW__WS_DEFAULT_MAX_HEADER_BYTES;
	h->max_fields = max_fields != 0 ? max_fields : TW__WS_DEFAULT_MAX_HEADER_FIELDS;
}

static void head_release(struct tw__ws_head *h)
{
	free(h->buf);
	h->buf = NULL;
	h->len = h->cap = 0;
}

/* Room for need bytes (need <= max_bytes): doubling, capped at the limit. */
static int head_reserve(struct tw__ws_head *h, size_t need)
{
	size_t cap = h->cap != 0 ? h->cap : HEAD_FIRST_CAP;
	char *buf;
	if (need <= h->cap)
		return 0;
	if (need > h->max_bytes) /* head_feed never asks for it */
		return TW_ENOMEM;
	while (cap < need)
		cap = cap > h->max_bytes / 2 ? h->max_bytes : 2 * cap;
	if (cap > h->max_bytes)
		cap = h->max_bytes;
	if ((buf = realloc(h->buf, cap)) == NULL)
		return TW_ENOMEM;
	h->buf = buf;
	h->cap = cap;
	return 0;
}

/* Take bytes up to the end of the block (the first line with nothing but
 * CRs before its LF), checking the limits byte by byte, so a verdict on a
 * limit comes as soon as it is passed. Returns HEAD_* or TW_ENOMEM. */
static int head_feed(struct tw__ws_head *h, const uint8_t *p, size_t n, size_t *used)
{
	size_t i = 0;
	int rv = HEAD_MORE;
	while (i < n) {
		uint8_t c = p[i];
		if (h->len + i >= h->max_bytes) {
			rv = HEAD_TOO_BIG;
			break;
		}
		i++;
		if (c == '\n') {
			if (h->line == 0) {
				rv = HEAD_DONE;
				break;
			}
			h->line = 0;
			/* The first line is the request or status line. */
			if (++h->lines > h->max_fields + 1) {
				rv = HEAD_TOO_MANY;
				break;
			}
		} else if (c != '\r') {
			h->line++;
		}
	}
	*used = i;
	if (rv == HEAD_TOO_BIG || rv == HEAD_TOO_MANY)
		return rv;
	if (i > 0) {
		if (head_reserve(h, h->len + i) != 0)
			return TW_ENOMEM;
		memcpy(h->buf + h->len, p, i);
		h->len += i;
	}
	h->done = rv == HEAD_DONE;
	return rv;
}

/* The next line of a complete block, CRLF or LF removed; 0 at the final
 * empty line (every line before it has a character other than CR, or the
 * scan would have ended there). */
static int next_line(const struct tw__ws_head *h, size_t *pos, const char **s, size_t *n)
{
	const char *b = h->buf + *pos;
	const char *nl = memchr(b, '\n', h->len - *pos);
	size_t k = (size_t)(nl - b);
	*pos += k + 1;
	if (*pos == h->len)
		return 0;
	if (k > 0 && b[k - 1] == '\r')
		k--;
	*s = b;
	*n = k;
	return 1;
}

/* No control characters in a line (HTAB aside): this also refuses a bare
 * CR and NUL. Bytes >= 0x80 are obs-text, allowed in values. */
static int line_clean(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if ((c < 0x20 && c != '\t') || c == 0x7f)
			return 0;
	}
	return 1;
}

static int is_tchar(unsigned char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static int is_ows(char c)
{
	return c == ' ' || c == '\t';
}

/* "name: value" (RFC 7230 section 3.2): a token name right before the
 * colon, the value without surrounding whitespace. Returns 0 if malformed
 * (obsolete folding included). */
static int split_field(const char *s, size_t n, const char **name, size_t *name_len,
		       const char **val, size_t *val_len)
{
	const char *colon = memchr(s, ':', n);
	size_t a, b;
	if (colon == NULL || colon == s || !line_clean(s, n))
		return 0;
	for (const char *q = s; q < colon; q++)
		if (!is_tchar((unsigned char)*q))
			return 0;
	a = (size_t)(colon - s) + 1;
	b = n;
	while (a < b && is_ows(s[a]))
		a++;
	while (b > a && is_ows(s[b - 1]))
		b--;
	*name = s;
	*name_len = (size_t)(colon - s);
	*val = s + a;
	*val_len = b - a;
	return 1;
}

static int eq_nocase(const char *s, size_t n, const char *lit)
{
	return n == strlen(lit) && strncasecmp(s, lit, n) == 0;
}

/* A comma-separated list (RFC 7230 section 7) holds tok, case-insensitive. */
static int list_has(const char *v, size_t n, const char *tok)
{
	size_t i = 0;
	while (i <= n) {
		size_t j = i, a, b;
		while (j < n && v[j] != ',')
			j++;
		a = i;
		b = j;
		while (a < b && is_ows(v[a]))
			a++;
		while (b > a && is_ows(v[b - 1]))
			b--;
		if (eq_nocase(v + a, b - a, tok))
			return 1;
		i = j + 1;
	}
	return 0;
}

/* What both sides look for in the header fields. */
struct fields {
	const char *host, *key, *origin, *accept, *upgrade;
	size_t host_len, key_len, origin_len, accept_len, upgrade_len;
	int hosts, keys, origins, versions, accepts, upgrades;
	int upgrade_websocket, connection_upgrade, version_not_13;
	int extensions, protocols, transfer_encoding, content_length_bad;
};

static void one(const char **dst, size_t *dst_len, int *count, const char *v, size_t n)
{
	*dst = v;
	*dst_len = n;
	(*count)++;
}

static int all_zeros(const char *v, size_t n)
{
	if (n == 0)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (v[i] != '0')
			return 0;
	return 1;
}

/* Read every header field after the first line; 0 if one is malformed. */
static int read_fields(const struct tw__ws_head *h, size_t pos, struct fields *f)
{
	const char *s, *name, *v;
	size_t n, name_len, vn;
	memset(f, 0, sizeof(*f));
	while (next_line(h, &pos, &s, &n)) {
		if (!split_field(s, n, &name, &name_len, &v, &vn))
			return 0;
		if (eq_nocase(name, name_len, "host"))
			one(&f->host, &f->host_len, &f->hosts, v, vn);
		else if (eq_nocase(name, name_len, "sec-websocket-key"))
			one(&f->key, &f->key_len, &f->keys, v, vn);
		else if (eq_nocase(name, name_len, "origin"))
			one(&f->origin, &f->origin_len, &f->origins, v, vn);
		else if (eq_nocase(name, name_len, "sec-websocket-accept"))
			one(&f->accept, &f->accept_len, &f->accepts, v, vn);
		else if (eq_nocase(name, name_len, "upgrade")) {
			one(&f->upgrade, &f->upgrade_len, &f->upgrades, v, vn);
			f->upgrade_websocket |= list_has(v, vn, "websocket");
		} else if (eq_nocase(name, name_len, "connection"))
			f->connection_upgrade |= list_has(v, vn, "upgrade");
		else if (eq_nocase(name, name_len, "sec-websocket-version")) {
			f->versions++;
			f->version_not_13 |= !(vn == 2 && memcmp(v, "13", 2) == 0);
		} else if (eq_nocase(name, name_len, "sec-websocket-extensions"))
			f->extensions++;
		else if (eq_nocase(name, name_len, "sec-websocket-protocol"))
			f->protocols++;
		else if (eq_nocase(name, name_len, "transfer-encoding"))
			f->transfer_encoding++;
		else if (eq_nocase(name, name_len, "content-length"))
			f->content_length_bad |= !all_zeros(v, vn);
	}
	return 1;
}

/* --- the accept value ------------------------------------------------- */

int tw__ws_accept(const char *key, size_t key_len, char out[TW__WS_ACCEPT_CHARS + 1])
{
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int md_len = 0;
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	int ok;
	if (ctx == NULL)
		return TW_ENOMEM;
	ok = EVP_DigestInit_ex(ctx, EVP_sha1(), NULL) == 1 &&
	     EVP_DigestUpdate(ctx, key, key_len) == 1 &&
	     EVP_DigestUpdate(ctx, TW__WS_GUID, strlen(TW__WS_GUID)) == 1 &&
	     EVP_DigestFinal_ex(ctx, md, &md_len) == 1 && md_len == 20;
	EVP_MD_CTX_free(ctx);
	if (!ok)
		return TW_ENOTSUP;
	/* 20 bytes make 28 characters and a NUL. */
	EVP_EncodeBlock((unsigned char *)out, md, 20);
	return 0;
}

static int is_b64(unsigned char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
	       c == '+' || c == '/';
}

/* base64 of exactly 16 bytes: 22 characters, then "==". */
static int key_valid(const char *v, size_t n)
{
	if (n != TW__WS_KEY_CHARS || v[22] != '=' || v[23] != '=')
		return 0;
	for (size_t i = 0; i < 22; i++)
		if (!is_b64((unsigned char)v[i]))
			return 0;
	return 1;
}

/* --- server ----------------------------------------------------------- */

void tw__ws_req_init(struct tw__ws_req *r, size_t max_header_bytes, size_t max_header_fields)
{
	memset(r, 0, sizeof(*r));
	head_init(&r->head, max_header_bytes, max_header_fields);
}

void tw__ws_req_fini(struct tw__ws_req *r)
{
	head_release(&r->head);
}

int tw__ws_req_status(const struct tw__ws_req *r)
{
	return r->status;
}

const char *tw__ws_req_error(const struct tw__ws_req *r)
{
	return r->status == 0 ? NULL : r->why;
}

static int verdict(struct tw__ws_req *r, int status, const char *why)
{
	r->status = status;
	r->why = why;
	head_release(&r->head);
	return 1;
}

/* The host part of "host[:port]" or "[v6]:port": its length, 0 if none. */
static size_t host_part(const char *s, size_t n)
{
	const char *e;
	if (n == 0)
		return 0;
	if (s[0] == '[') {
		size_t k;
		if ((e = memchr(s, ']', n)) == NULL)
			return 0;
		k = (size_t)(e - s) + 1;
		return k == n || s[k] == ':' ? k : 0;
	}
	e = memchr(s, ':', n);
	return e != NULL ? (size_t)(e - s) : n;
}

/* Origin "scheme://host[:port]" names the same host as Host (RFC 6455
 * section 10.2; docs/design.md, WebSocket). */
static int origin_matches(const char *origin, size_t on, const char *host, size_t hn)
{
	const char *sep = NULL, *auth;
	size_t an = 0, oh, hh;
	for (size_t i = 0; i + 3 <= on; i++) {
		if (memcmp(origin + i, "://", 3) == 0) {
			sep = origin + i;
			break;
		}
	}
	if (sep == NULL || sep == origin)
		return 0;
	auth = sep + 3;
	while (auth + an < origin + on && auth[an] != '/' && auth[an] != '?' && auth[an] != '#')
		an++;
	if (memchr(auth, '@', an) != NULL)
		return 0;
	oh = host_part(auth, an);
	hh = host_part(host, hn);
	return oh != 0 && oh == hh && strncasecmp(auth, host, oh) == 0;
}

/* "GET <target> HTTP/1.1": the target, or 0 when malformed. */
static int request_line(const char *s, size_t n, const char **target, size_t *target_len,
			const char **why)
{
	const char *sp;
	*why = "malformed request line";
	if (!line_clean(s, n) || (sp = memchr(s, ' ', n)) == NULL)
		return 0;
	if (sp - s != 3 || memcmp(s, "GET", 3) != 0) {
		*why = "method not GET";
		return 0;
	}
	*target = sp + 1;
	sp = memchr(*target, ' ', n - 4);
	if (sp == NULL || sp == *target)
		return 0;
	*target_len = (size_t)(sp - *target);
	if (n - 4 - *target_len - 1 != 8 || memcmp(sp + 1, "HTTP/1.1", 8) != 0) {
		*why = "not HTTP/1.1";
		return 0;
	}
	if ((*target)[0] != '/') {
		*why = "request target not a path";
		return 0;
	}
	return 1;
}

static int judge_request(struct tw__ws_req *r)
{
	const struct tw__ws_head *h = &r->head;
	struct fields f;
	const char *s, *target, *why, *q;
	size_t n, pos = 0, target_len, path_len;
	int rv;
	if (!next_line(h, &pos, &s, &n))
		return verdict(r, 400, "empty request");
	if (!request_line(s, n, &target, &target_len, &why))
		return verdict(r, 400, why);
	if (!read_fields(h, pos, &f))
		return verdict(r, 400, "malformed header line");
	if (f.transfer_encoding || f.content_length_bad)
		return verdict(r, 400, "request has a body");
	q = memchr(target, '?', target_len);
	path_len = q != NULL ? (size_t)(q - target) : target_len;
	if (path_len != 1)
		return verdict(r, 404, "path is not /");
	if (!f.upgrade_websocket)
		return verdict(r, 400, "no Upgrade: websocket");
	if (!f.connection_upgrade)
		return verdict(r, 400, "no Connection: upgrade");
	if (f.versions == 0)
		return verdict(r, 400, "no Sec-WebSocket-Version");
	if (f.version_not_13)
		return verdict(r, 426, "Sec-WebSocket-Version is not 13");
	if (f.hosts != 1 || f.host_len == 0)
		return verdict(r, 400, "Host missing or repeated");
	if (f.keys != 1 || !key_valid(f.key, f.key_len))
		return verdict(r, 400, "bad Sec-WebSocket-Key");
	if (f.origins > 1 ||
	    (f.origins == 1 && !origin_matches(f.origin, f.origin_len, f.host, f.host_len)))
		return verdict(r, 403, "Origin is not this host");
	if ((rv = tw__ws_accept(f.key, f.key_len, r->accept)) != 0) {
		r->err = rv;
		head_release(&r->head);
		return rv;
	}
	return verdict(r, 101, "");
}

int tw__ws_req_feed(struct tw__ws_req *r, const uint8_t *p, size_t n, size_t *used)
{
	int rv;
	*used = 0;
	if (r->err != 0)
		return r->err;
	if (r->status != 0)
		return 1;
	rv = head_feed(&r->head, p, n, used);
	switch (rv) {
	case HEAD_MORE: return 0;
	case HEAD_DONE: return judge_request(r);
	case HEAD_TOO_BIG: return verdict(r, 431, "request header block too big");
	case HEAD_TOO_MANY: return verdict(r, 431, "too many request header fields");
	default: r->err = rv; return rv;
	}
}

static const char *reason_phrase(int status)
{
	switch (status) {
	case 400: return "Bad Request";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 426: return "Upgrade Required";
	default: return "Request Header Fields Too Large";
	}
}

int tw__ws_req_response(const struct tw__ws_req *r, char *out, size_t cap)
{
	char tmp[TW__WS_RESPONSE_MAX];
	int n;
	if (r->status == 0)
		return TW_EINVAL;
	if (r->status == 101)
		n = snprintf(tmp, sizeof(tmp),
			     "HTTP/1.1 101 Switching Protocols\r\n"
			     "Upgrade: websocket\r\n"
			     "Connection: Upgrade\r\n"
			     "Sec-WebSocket-Accept: %s\r\n\r\n",
			     r->accept);
	else
		n = snprintf(tmp, sizeof(tmp),
			     "HTTP/1.1 %d %s\r\n"
			     "%s"
			     "Content-Length: 0\r\n"
			     "Connection: close\r\n\r\n",
			     r->status, reason_phrase(r->status),
			     r->status == 426
				     ? "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
				     : "");
	if (n < 0 || (size_t)n >= sizeof(tmp) || (size_t)n > cap)
		return TW_EINVAL;
	memcpy(out, tmp, (size_t)n);
	return n;
}

/* --- client ----------------------------------------------------------- */

int tw__ws_client_init_nonce(struct tw__ws_client *c, const uint8_t nonce[16],
			     size_t max_header_bytes, size_t max_header_fields)
{
	memset(c, 0, sizeof(*c));
	head_init(&c->head, max_header_bytes, max_header_fields);
	/* 16 bytes make 24 characters and a NUL. */
	EVP_EncodeBlock((unsigned char *)c->key, nonce, 16);
	return tw__ws_accept(c->key, TW__WS_KEY_CHARS, c->accept);
}

int tw__ws_client_init(struct tw__ws_client *c, size_t max_header_bytes, size_t max_header_fields)
{
	uint8_t nonce[16];
	int rv;
	memset(c, 0, sizeof(*c));
	if (RAND_bytes(nonce, sizeof(nonce)) != 1)
		return TW_EIO;
	rv = tw__ws_client_init_nonce(c, nonce, max_header_bytes, max_header_fields);
	memset(nonce, 0, sizeof(nonce));
	return rv;
}

void tw__ws_client_fini(struct tw__ws_client *c)
{
	head_release(&c->head);
}

const char *tw__ws_client_key(const struct tw__ws_client *c)
{
	return c->key;
}

int tw__ws_client_status(const struct tw__ws_client *c)
{
	return c->status;
}

const char *tw__ws_client_error(const struct tw__ws_client *c)
{
	return c->result < 0 ? c->why : NULL;
}

static int host_ok(const char *host, size_t n)
{
	if (n == 0 || n > 255)
		return 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)host[i];
		if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') ||
		      (ch >= 'A' && ch <= 'Z') || strchr("-._:%[]", ch) != NULL))
			return 0;
	}
	return 1;
}

int tw__ws_client_request(const struct tw__ws_client *c, const char *host, unsigned port, char *out,
			  size_t cap)
{
	size_t hn = host != NULL ? strlen(host) : 0;
	int bracket, n;
	if (!host_ok(host, hn) || port == 0 || port > 65535)
		return TW_EINVAL;
	bracket = host[0] != '[' && memchr(host, ':', hn) != NULL;
	n = snprintf(out, cap,
		     "GET / HTTP/1.1\r\n"
		     "Host: %s%s%s:%u\r\n"
		     "Upgrade: websocket\r\n"
		     "Connection: Upgrade\r\n"
		     "Sec-WebSocket-Key: %s\r\n"
		     "Sec-WebSocket-Version: 13\r\n\r\n",
		     bracket ? "[" : "", host, bracket ? "]" : "", port, c->key);
	if (n < 0 || (size_t)n >= cap)
		return TW_EINVAL;
	return n;
}

static int client_fail(struct tw__ws_client *c, const char *why)
{
	c->result = TW_EPROTO;
	c->why = why;
	head_release(&c->head);
	return TW_EPROTO;
}

/* "HTTP/1.1 NNN[ reason]": the status, or 0 when malformed. */
static int status_line(const char *s, size_t n)
{
	if (!line_clean(s, n) || n < 12 || memcmp(s, "HTTP/1.1 ", 9) != 0)
		return 0;
	for (size_t i = 9; i < 12; i++)
		if (s[i] < '0' || s[i] > '9')
			return 0;
	if (n > 12 && s[12] != ' ')
		return 0;
	return (s[9] - '0') * 100 + (s[10] - '0') * 10 + (s[11] - '0');
}

static int judge_response(struct tw__ws_client *c)
{
	const struct tw__ws_head *h = &c->head;
	struct fields f;
	const char *s;
	size_t n, pos = 0;
	if (!next_line(h, &pos, &s, &n) || (c->status = status_line(s, n)) == 0)
		return client_fail(c, "malformed status line");
	if (c->status != 101)
		return client_fail(c, "status is not 101");
	if (!read_fields(h, pos, &f))
		return client_fail(c, "malformed header line");
	if (f.upgrades != 1 || !eq_nocase(f.upgrade, f.upgrade_len, "websocket"))
		return client_fail(c, "no Upgrade: websocket");
	if (!f.connection_upgrade)
		return client_fail(c, "no Connection: upgrade");
	if (f.accepts != 1 || f.accept_len != TW__WS_ACCEPT_CHARS ||
	    memcmp(f.accept, c->accept, TW__WS_ACCEPT_CHARS) != 0)
		return client_fail(c, "wrong Sec-WebSocket-Accept");
	if (f.extensions != 0)
		return client_fail(c, "unrequested Sec-WebSocket-Extensions");
	if (f.protocols != 0)
		return client_fail(c, "unrequested Sec-WebSocket-Protocol");
	c->result = 1;
	head_release(&c->head);
	return 1;
}

int tw__ws_client_feed(struct tw__ws_client *c, const uint8_t *p, size_t n, size_t *used)
{
	int rv;
	*used = 0;
	if (c->result != 0)
		return c->result;
	rv = head_feed(&c->head, p, n, used);
	switch (rv) {
	case HEAD_MORE: return 0;
	case HEAD_DONE: return judge_response(c);
	case HEAD_TOO_BIG: return client_fail(c, "response header block too big");
	case HEAD_TOO_MANY: return client_fail(c, "too many response header fields");
	default: c->result = rv; return rv;
	}
}
