/* SPDX-License-Identifier: BSD-3-Clause */
/* The WebSocket opening handshake (RFC 6455 section 4), sans-I/O, both
 * sides, as docs/design.md (WebSocket) fixes it for ws:// and wss://:
 * path "/", no subprotocol, no extensions, a client sends no Origin, a
 * server accepts a missing Origin or one whose host equals the Host
 * header's.
 *
 * Server: tw__ws_req_feed takes the client's request in any pieces until
 * the header block is complete (or a limit is hit), then judges it; the
 * verdict is an HTTP status (101 to upgrade, else 400, 403, 404, 426 or
 * 431) and tw__ws_req_response writes the matching response.
 *
 * Client: tw__ws_client_request writes the request (random key);
 * tw__ws_client_feed takes the response in any pieces and accepts only an
 * HTTP/1.1 101 with Upgrade: websocket, Connection: upgrade and the right
 * Sec-WebSocket-Accept, and no extension or subprotocol. It stops at the
 * end of the header block and says how many bytes that took: the bytes
 * after it (frames a server sent right behind its 101) belong to the
 * frame decoder (ws_codec.h), never dropped.
 *
 * Both parsers copy the header block into one buffer that grows to at
 * most max_header_bytes (the only allocation), read nothing outside the
 * bytes they are given, and give the same answer however the input is
 * split. Header names are case-insensitive; a line ends with LF or CRLF;
 * obsolete line folding, bare CR and control characters are malformed.
 * One parser per connection, one thread at a time (the comm's loop
 * thread). A verdict or a failure is final: later feeds consume nothing
 * and repeat it. */
#ifndef TW_TRANSPORT_WS_UPGRADE_H
#define TW_TRANSPORT_WS_UPGRADE_H

#include <stddef.h>
#include <stdint.h>

/* RFC 6455 section 1.3. */
#define TW__WS_GUID "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
/* Sec-WebSocket-Key: base64 of 16 bytes; Sec-WebSocket-Accept: base64 of a
 * SHA-1 digest (20 bytes). Characters, without a NUL. */
#define TW__WS_KEY_CHARS    24
#define TW__WS_ACCEPT_CHARS 28

/* Default limits on a header block (request or response line included):
 * its bytes, and its header fields (lines after the first). */
#define TW__WS_DEFAULT_MAX_HEADER_BYTES  8192
#define TW__WS_DEFAULT_MAX_HEADER_FIELDS 100

/* Room that always holds a response from tw__ws_req_response. */
#define TW__WS_RESPONSE_MAX 256
/* Room that always holds a request from tw__ws_client_request (host of at
 * most 255 characters). */
#define TW__WS_REQUEST_MAX 512

/* A header block being collected (private to ws_upgrade.c). */
struct tw__ws_head {
	char *buf;
	size_t len, cap;
	size_t max_bytes, max_fields;
	size_t lines; /* complete non-empty lines */
	size_t line;  /* bytes of the current line, CR not counted */
	int done;     /* the empty line arrived */
};

/* Server side: one client request. Fields private. */
struct tw__ws_req {
	struct tw__ws_head head;
	int status;      /* 0 while reading, then the verdict */
	int err;         /* sticky TW_ENOMEM / TW_ENOTSUP */
	const char *why; /* static text for the verdict */
	char accept[TW__WS_ACCEPT_CHARS + 1];
};

/* tw__ws_req_init: a parser for one request.
 *   max_header_bytes: most bytes the request line and header fields may
 *     take, final empty line included; 0 means 8 KiB
 *     (TW__WS_DEFAULT_MAX_HEADER_BYTES). Beyond it the verdict is 431.
 *   max_header_fields: most header lines; 0 means 100. Beyond it: 431.
 * Allocates nothing yet; never fails. Pair with tw__ws_req_fini. */
void tw__ws_req_init(struct tw__ws_req *r, size_t max_header_bytes, size_t max_header_fields);

/* tw__ws_req_fini: release the header buffer. */
void tw__ws_req_fini(struct tw__ws_req *r);

/* tw__ws_req_feed: take request bytes p[0..n), in any pieces. *used: bytes
 * consumed: all of n while the header block is incomplete; on a verdict,
 * those up to and including the block's empty line (a client must wait for
 * the 101 before it sends frames, so anything after is its error; for a
 * 431 verdict, up to the byte over the limit). Returns 1 once the verdict
 * is in (tw__ws_req_status), 0 when more bytes are needed, or TW_ENOMEM
 * (growing the buffer) or TW_ENOTSUP (SHA-1 failed in OpenSSL), both
 * sticky. The verdict, in the order checked:
 *   431  the block passes max_header_bytes or max_header_fields (decided
 *        as soon as it does, without waiting for the end);
 *   400  malformed: request line not "GET <target> HTTP/1.1", target not
 *        starting with "/", a header line without "name:" (token name, no
 *        space before the colon), obsolete folding, control characters,
 *        Transfer-Encoding, or a Content-Length other than 0;
 *   404  target path (before any "?") other than "/";
 *   400  no Upgrade header with the token "websocket" (case-insensitive,
 *        comma lists allowed), no Connection header with the token
 *        "upgrade", no Sec-WebSocket-Version;
 *   426  a Sec-WebSocket-Version other than exactly "13";
 *   400  Host missing, empty or repeated; Sec-WebSocket-Key missing,
 *        repeated, or not base64 of 16 bytes (22 base64 characters then
 *        "==");
 *   403  Origin repeated, or present with a host (scheme, userinfo, port
 *        and path aside, case-insensitive) other than Host's host ("null"
 *        and unparsable origins included): docs/design.md's policy
 *        (WebSocket); ports are not compared, so a page from the same
 *        host on another port may connect;
 *   101  upgrade. Sec-WebSocket-Protocol and Sec-WebSocket-Extensions are
 *        ignored: the response names neither, which declines them.
 * RFC 6455 section 4.2.1 and 4.2.2; RFC 7230 section 3 (syntax); RFC 6585
 * section 5 (431). */
int tw__ws_req_feed(struct tw__ws_req *r, const uint8_t *p, size_t n, size_t *used);

/* tw__ws_req_status: the verdict (101, 400, 403, 404, 426, 431), or 0
 * while the request is incomplete or after a TW_ENOMEM / TW_ENOTSUP. */
int tw__ws_req_status(const struct tw__ws_req *r);

/* tw__ws_req_error: a static text saying why the verdict is not 101 (for
 * logs), "" for 101, NULL before a verdict. */
const char *tw__ws_req_error(const struct tw__ws_req *r);

/* tw__ws_req_response: write the response for the verdict into out (cap
 * bytes; TW__WS_RESPONSE_MAX always suffices), no NUL added. 101:
 *   HTTP/1.1 101 Switching Protocols / Upgrade: websocket /
 *   Connection: Upgrade / Sec-WebSocket-Accept: <accept>
 * (no Sec-WebSocket-Protocol, no Sec-WebSocket-Extensions). Any other
 * verdict: its status line, Content-Length: 0 and Connection: close, plus
 * Upgrade: websocket and Sec-WebSocket-Version: 13 for 426 (RFC 6455
 * section 4.4); the glue closes after writing it. Returns the length, or
 * TW_EINVAL (no verdict yet, or cap too small). */
int tw__ws_req_response(const struct tw__ws_req *r, char *out, size_t cap);

/* Client side: one handshake. Fields private. */
struct tw__ws_client {
	struct tw__ws_head head;
	int status;      /* HTTP status of the response once its line is in */
	int result;      /* 0 reading, 1 accepted, < 0 failed (sticky) */
	const char *why; /* static text once failed */
	char key[TW__WS_KEY_CHARS + 1];
	char accept[TW__WS_ACCEPT_CHARS + 1];
};

/* tw__ws_client_init: a client handshake with a fresh key: 16 bytes from
 * OpenSSL's RAND_bytes, base64 (RFC 6455 section 4.1: randomly selected
 * per connection). Limits as for tw__ws_req_init (0: defaults) apply to
 * the response. Returns 0, TW_EIO (RAND_bytes failed) or TW_ENOTSUP (SHA-1
 * failed); on error nothing needs freeing, but tw__ws_client_fini is
 * harmless. */
int tw__ws_client_init(struct tw__ws_client *c, size_t max_header_bytes, size_t max_header_fields);

/* tw__ws_client_init_nonce: the same with a given 16-byte nonce instead of
 * a random one (tests and replays: the RFC example nonce is the bytes of
 * "the sample nonce"). Returns 0 or TW_ENOTSUP. */
int tw__ws_client_init_nonce(struct tw__ws_client *c, const uint8_t nonce[16],
			     size_t max_header_bytes, size_t max_header_fields);

/* tw__ws_client_fini: release the header buffer. */
void tw__ws_client_fini(struct tw__ws_client *c);

/* tw__ws_client_key: the Sec-WebSocket-Key sent (24 characters, NUL
 * ended), owned by c. */
const char *tw__ws_client_key(const struct tw__ws_client *c);

/* tw__ws_client_request: write the upgrade request into out (cap bytes; a
 * NUL follows it, so cap must exceed the length; TW__WS_REQUEST_MAX
 * suffices):
 *   GET / HTTP/1.1 / Host: <host>:<port> / Upgrade: websocket /
 *   Connection: Upgrade / Sec-WebSocket-Key: <key> /
 *   Sec-WebSocket-Version: 13
 * and no Origin, no Sec-WebSocket-Protocol, no Sec-WebSocket-Extensions.
 * host: a name or IP literal, 1-255 characters of letters, digits and
 * "-._:%[]"; an IPv6 literal without brackets gets them. port: 1-65535.
 * Returns the length, or TW_EINVAL (bad host or port, cap too small).
 * RFC 6455 section 4.1. */
int tw__ws_client_request(const struct tw__ws_client *c, const char *host, unsigned port, char *out,
			  size_t cap);

/* tw__ws_client_feed: take response bytes p[0..n), in any pieces. Returns
 * 0 when more are needed (*used = n); 1 when the response is an
 * acceptable 101 (*used = the bytes of p up to and including the header
 * block's empty line: hand p[*used..n) to the frame decoder); TW_EPROTO
 * when it fails the connection (RFC 6455 section 4.1, "fail the WebSocket
 * connection"; *used as for 1, or up to the byte over a limit); or
 * TW_ENOMEM. Failures are sticky, with the status (tw__ws_client_status)
 * and a reason (tw__ws_client_error): status line not "HTTP/1.1 <3
 * digits>", a status other than 101 (200 included), Upgrade not exactly
 * "websocket" (case-insensitive), no Connection token "upgrade",
 * Sec-WebSocket-Accept missing, repeated or not the value for our key,
 * any Sec-WebSocket-Extensions or Sec-WebSocket-Protocol (we offered
 * none), malformed header lines, or the block over max_header_bytes or
 * max_header_fields. */
int tw__ws_client_feed(struct tw__ws_client *c, const uint8_t *p, size_t n, size_t *used);

/* tw__ws_client_status: the response's HTTP status once its header block
 * is in (0 before, or when the status line is malformed). */
int tw__ws_client_status(const struct tw__ws_client *c);

/* tw__ws_client_error: static text for a failure (for logs and for the
 * application's error), NULL otherwise. */
const char *tw__ws_client_error(const struct tw__ws_client *c);

/* tw__ws_accept: Sec-WebSocket-Accept for a key: base64(SHA-1(key ||
 * TW__WS_GUID)), with OpenSSL (EVP SHA-1, EVP_EncodeBlock). key: key_len
 * bytes as sent on the wire (not decoded). out: TW__WS_ACCEPT_CHARS
 * characters and a NUL. Any thread. Returns 0, TW_ENOMEM, or TW_ENOTSUP
 * (the SHA-1 digest failed, e.g. no provider offers it). RFC 6455 section
 * 4.2.2, step 5.4. */
int tw__ws_accept(const char *key, size_t key_len, char out[TW__WS_ACCEPT_CHARS + 1]);

#endif
