/* SPDX-License-Identifier: BSD-3-Clause */
/* Fuzz target: the WebSocket frame decoder and encoder
 * (transport/ws_codec.c).
 *
 * Byte 0 of the input picks the setup:
 *   bit 0     role: 0 server (expects masked frames), 1 client
 *   bits 1-2  max_message_bytes: the default (4 GiB), 64, 1000, 70000
 *   bits 3-4  max_fragments: the default (4,096), 1, 3, 16
 *   bit 7     script mode (below)
 * The rest is the byte stream from the peer, or in script mode a list of
 * frames to build with the encoder (the fuzzer finds valid streams that
 * way): per frame an op byte (bits 0-1: data, ping, pong, close; bit 2:
 * FIN; bits 3-4: data opcode: auto, binary, continuation, raw nibble;
 * bit 5: length x 300; bits 6+7 both set: the wrong masking for the role),
 * a 4-byte key, a length byte, then what the frame needs (payload bytes,
 * taken from the input in turn).
 *
 * The stream is decoded four ways, which must write the same transcript
 * (tests/fuzz/ws_drive.h), end with the same result and consume the same
 * bytes:
 *   R  a reference decoder written here the plain way: the whole input in
 *      a buffer, each rule in RFC order, a code-point UTF-8 check;
 *   A  the decoder, input in one piece, with invariants checked on every
 *      event (limits held, control payloads <= 125 bytes, close codes and
 *      reasons valid, pongs for pings round-trip through the encoder);
 *   B  one byte at a time (pieces of 1..64 above 64 KiB);
 *   C  random pieces of 1..97 bytes.
 * After a failure: a known close code, and an error text that
 * tw__ws_encode_close accepts as a reason.
 *
 * Built by `CC=clang ./configure --enable-fuzzers && make` (see
 * tests/Makefile.inc); replayed over tests/fuzz/corpus/ws_codec by
 * tests/check_ws_fuzz_replay under `make check`. */
#include <stdlib.h>
#include <string.h>

#include <taskwire/error.h>

#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/fuzz_ws.h"
#include "tests/fuzz/ws_drive.h"
#include "transport/ws_codec.h"

#define SCRIPT_MAX_BYTES ((size_t)1 << 20)

struct cfg {
	enum tw__ws_role role;
	uint64_t max_msg, max_frags;
};

static void check(int ok)
{
	if (!ok)
		abort();
}

static int same(const struct ws_log *a, const struct ws_log *b)
{
	const char *x = a->s != NULL ? a->s : "", *y = b->s != NULL ? b->s : "";
	return strcmp(x, y) == 0 && a->rv == b->rv && a->used == b->used;
}

/* --- the reference ------------------------------------------------------ */

static int ref_utf8(const uint8_t *p, size_t n)
{
	size_t i = 0;
	while (i < n) {
		uint8_t c = p[i];
		uint32_t cp, min;
		size_t k;
		if (c < 0x80) {
			i++;
			continue;
		}
		if ((c & 0xe0) == 0xc0) {
			k = 1, cp = c & 0x1f, min = 0x80;
		} else if ((c & 0xf0) == 0xe0) {
			k = 2, cp = c & 0x0f, min = 0x800;
		} else if ((c & 0xf8) == 0xf0) {
			k = 3, cp = c & 0x07, min = 0x10000;
		} else {
			return 0;
		}
		if (n - i <= k)
			return 0;
		for (size_t j = 1; j <= k; j++) {
			if ((p[i + j] & 0xc0) != 0x80)
				return 0;
			cp = cp << 6 | (p[i + j] & 0x3f);
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return 0;
		i += k + 1;
	}
	return 1;
}

static int ref_code_ok(unsigned code)
{
	if (code < 1000 || code >= 5000)
		return 0;
	if (code >= 3000)
		return 1;
	switch (code) {
	case 1000:
	case 1001:
	case 1002:
	case 1003:
	case 1007:
	case 1008:
	case 1009:
	case 1010:
	case 1011:
	case 1012:
	case 1013:
	case 1014: return 1;
	default: return 0;
	}
}

static void ref_fail(struct ws_log *l, unsigned code, int err, const char *why, size_t at)
{
	ws_logf(l, "error(%u,%s)", code, why);
	l->rv = err;
	l->used = at;
}

#define FAIL(code, err, why, at)                                                                   \
	do {                                                                                       \
		ref_fail(l, code, err, why, at);                                                   \
		return;                                                                            \
	} while (0)

static void ref_decode(const struct cfg *c, const uint8_t *p, size_t n, struct ws_log *l)
{
	size_t pos = 0;
	int in_msg = 0;
	uint64_t msg_bytes = 0, frags = 0;
	l->used = n; /* unless an error or a close comes first */
	for (;;) {
		struct tw__ws_event ev;
		size_t start = pos, ext, hl, avail;
		unsigned op;
		int fin, masked;
		uint64_t len;
		const uint8_t *key;
		uint8_t *dst = NULL;
		memset(&ev, 0, sizeof(ev));
		if (n - pos < 2)
			return;
		fin = p[pos] >> 7;
		op = p[pos] & 15;
		masked = p[pos + 1] >> 7;
		if (p[pos] & 0x70)
			FAIL(1002, TW_EPROTO, "reserved bits set", start + 2);
		if (!(op <= 2 || (op >= 8 && op <= 10)))
			FAIL(1002, TW_EPROTO, "reserved opcode", start + 2);
		if (op >= 8 && !fin)
			FAIL(1002, TW_EPROTO, "fragmented control frame", start + 2);
		if (c->role == TW__WS_SERVER && !masked)
			FAIL(1002, TW_EPROTO, "unmasked client frame", start + 2);
		if (c->role == TW__WS_CLIENT && masked)
			FAIL(1002, TW_EPROTO, "masked server frame", start + 2);
		if (op == 0 && !in_msg)
			FAIL(1002, TW_EPROTO, "continuation without a message", start + 2);
		if ((op == 1 || op == 2) && in_msg)
			FAIL(1002, TW_EPROTO, "new message inside a fragmented one", start + 2);
		if (op == 1)
			FAIL(1003, TW_ENOTSUP, "text messages not supported", start + 2);
		if (op == 0 && frags + 1 > c->max_frags)
			FAIL(1009, TW_ETOOMANY, "too many fragments", start + 2);
		len = p[pos + 1] & 127;
		ext = len == 127 ? 8 : len == 126 ? 2 : 0;
		if (n - pos < 2 + ext)
			return;
		if (ext != 0) {
			len = 0;
			for (size_t i = 0; i < ext; i++)
				len = len * 256 + p[pos + 2 + i];
		}
		if (len >= (UINT64_C(1) << 63))
			FAIL(1002, TW_EPROTO, "length with the top bit set", start + 2 + ext);
		if (op >= 8 && len > 125)
			FAIL(1002, TW_EPROTO, "control frame over 125 bytes", start + 2 + ext);
		if (op < 8 && msg_bytes + len > c->max_msg)
			FAIL(1009, TW_ETOOBIG, "message too big", start + 2 + ext);
		hl = 2 + ext + (masked ? 4 : 0);
		if (n - pos < hl)
			return;
		key = masked ? p + pos + 2 + ext : NULL;
		pos += hl;
		if (op >= 8) {
			uint8_t body[125];
			if (n - pos < len)
				return;
			for (size_t i = 0; i < len; i++)
				body[i] = p[pos + i] ^ (key != NULL ? key[i % 4] : 0);
			pos += (size_t)len;
			ev.payload = body;
			ev.payload_len = (size_t)len;
			if (op != 8) {
				ev.type = op == 9 ? TW__WS_EV_PING : TW__WS_EV_PONG;
				ws_log_event(l, &ev);
				continue;
			}
			ev.code = 1005;
			if (len == 1)
				FAIL(1002, TW_EPROTO, "close body of 1 byte", pos);
			if (len >= 2) {
				ev.code = (unsigned)body[0] * 256 + body[1];
				if (!ref_code_ok(ev.code))
					FAIL(1002, TW_EPROTO, "invalid close code", pos);
				if (!ref_utf8(body + 2, (size_t)len - 2))
					FAIL(1007, TW_EPROTO, "close reason not UTF-8", pos);
				ev.payload = body + 2;
				ev.payload_len = (size_t)len - 2;
			}
			ev.type = TW__WS_EV_CLOSE;
			ws_log_event(l, &ev);
			l->used = pos;
			return;
		}
		ev.first = !in_msg;
		if (!in_msg) {
			in_msg = 1;
			msg_bytes = frags = 0;
		}
		msg_bytes += len;
		frags++;
		ev.type = TW__WS_EV_DATA;
		ev.opcode = op;
		ev.fin = fin;
		ev.length = len;
		ev.message_bytes = msg_bytes;
		ev.fragments = frags;
		ws_log_event(l, &ev);
		avail = n - pos < len ? n - pos : (size_t)len;
		if (avail > 0 && (dst = ws_log_room(l, avail)) == NULL)
			return;
		for (size_t i = 0; i < avail; i++)
			dst[i] = p[pos + i] ^ (key != NULL ? key[i % 4] : 0);
		l->msg_len += avail;
		pos += avail;
		if (avail < len)
			return;
		if (fin) {
			memset(&ev, 0, sizeof(ev));
			ev.type = TW__WS_EV_MESSAGE_END;
			ev.length = ev.message_bytes = msg_bytes;
			ev.fragments = frags;
			ws_log_event(l, &ev);
			in_msg = 0;
			msg_bytes = frags = 0;
		}
	}
}

/* --- the decoder, with invariants ------------------------------------------ */

/* A pong answering ping payload p, sent the other way, decodes back. */
static void check_pong(const struct cfg *c, const uint8_t *p, size_t n)
{
	static const uint8_t key[4] = {1, 2, 3, 4};
	uint8_t frame[TW__WS_MAX_CONTROL_FRAME], copy[TW__WS_MAX_CONTROL];
	struct tw__ws_dec d;
	struct ws_log l;
	int len;
	/* We mask what we send as a client. */
	memcpy(copy, p, n);
	len = tw__ws_encode_pong(frame, p, n, c->role == TW__WS_CLIENT ? key : NULL);
	check(len == (int)(tw__ws_header_size(n, c->role == TW__WS_CLIENT) + n));
	check(memcmp(copy, p, n) == 0);
	tw__ws_dec_init(&d, c->role == TW__WS_CLIENT ? TW__WS_SERVER : TW__WS_CLIENT, 0, 0);
	ws_log_init(&l);
	check(ws_drive(&d, frame, (size_t)len, 0, NULL, &l) == 0 && l.used == (size_t)len);
	check(!l.oom && l.s != NULL && strncmp(l.s, "pong(", 5) == 0);
	ws_log_free(&l);
}

static void on_event(void *arg, const struct tw__ws_dec *d, const struct tw__ws_event *ev)
{
	const struct cfg *c = arg;
	enum tw__ws_dec_phase ph = tw__ws_dec_phase(d);
	switch (ev->type) {
	case TW__WS_EV_DATA:
		check(ev->opcode == (ev->first ? TW__WS_BINARY : TW__WS_CONT));
		check(ev->length <= ev->message_bytes && ev->message_bytes <= c->max_msg);
		check(ev->fragments >= 1 && ev->fragments <= c->max_frags);
		check(ev->first == (ev->fragments == 1));
		check(ph == TW__WS_DEC_PAYLOAD && tw__ws_dec_payload_room(d) == ev->length);
		break;
	case TW__WS_EV_MESSAGE_END:
		check(ev->length == ev->message_bytes && ev->length <= c->max_msg);
		check(ev->fragments >= 1 && ev->fragments <= c->max_frags);
		check(ph == TW__WS_DEC_BYTES && tw__ws_dec_payload_room(d) == 0);
		break;
	case TW__WS_EV_PING:
		check_pong(c, ev->payload, ev->payload_len);
		/* fall through */
	case TW__WS_EV_PONG:
		check(ev->payload_len <= TW__WS_MAX_CONTROL && ph == TW__WS_DEC_BYTES);
		break;
	case TW__WS_EV_CLOSE:
		check(ph == TW__WS_DEC_CLOSED);
		check(ev->payload_len <= TW__WS_MAX_REASON);
		check(tw__ws_utf8_valid(ev->payload, ev->payload_len));
		if (ev->code == TW__WS_CLOSE_NO_STATUS)
			check(ev->payload_len == 0);
		else
			check(tw__ws_close_code_valid(ev->code));
		break;
	default: check(0);
	}
}

static void run(const struct cfg *c, const uint8_t *p, size_t n, size_t max_piece, uint64_t *seed,
		struct ws_log *l)
{
	struct tw__ws_dec d;
	tw__ws_dec_init(&d, c->role, c->max_msg, c->max_frags);
	ws_log_init(l);
	l->hook = on_event;
	l->hook_arg = (void *)c;
	ws_drive(&d, p, n, max_piece, seed, l);
	check(!l->oom && l->used <= n);
	if (l->rv < 0) {
		uint8_t frame[TW__WS_MAX_CONTROL_FRAME], *dst = NULL;
		unsigned code = tw__ws_dec_close_code(&d);
		const char *why = tw__ws_dec_error(&d);
		struct tw__ws_event ev;
		check(tw__ws_dec_phase(&d) == TW__WS_DEC_FAILED);
		check(code == 1002 || code == 1003 || code == 1007 || code == 1009);
		check(why != NULL && tw__ws_encode_close(frame, code, why, strlen(why), NULL) > 0);
		check(tw__ws_dec_want(&d, &dst) == 0 && dst == NULL);
		check(tw__ws_dec_advance(&d, 0, &ev) == l->rv);
		check(tw__ws_dec_frame_offset(&d) < l->used);
	} else if (tw__ws_dec_phase(&d) == TW__WS_DEC_CLOSED) {
		check(l->s != NULL && strstr(l->s, "close(") != NULL);
	} else {
		check(l->used == n);
	}
}

static void compare(const struct cfg *c, const uint8_t *p, size_t n)
{
	struct ws_log r, a, b, cc;
	uint64_t seed = n;
	ws_log_init(&r);
	ref_decode(c, p, n, &r);
	check(!r.oom);
	run(c, p, n, 0, NULL, &a);
	run(c, p, n, n <= ((size_t)64 << 10) ? 1 : 64, n <= ((size_t)64 << 10) ? NULL : &seed, &b);
	run(c, p, n, 97, &seed, &cc);
	check(same(&r, &a));
	check(same(&a, &b));
	check(same(&a, &cc));
	ws_log_free(&r);
	ws_log_free(&a);
	ws_log_free(&b);
	ws_log_free(&cc);
}

/* --- script mode: frames made by the encoder ---------------------------------- */

struct script {
	const uint8_t *in;
	size_t n, off;
	uint8_t *out;
	size_t len, cap;
};

static uint8_t take(struct script *s)
{
	return s->off < s->n ? s->in[s->off++] : 0;
}

static uint8_t *room(struct script *s, size_t k)
{
	if (s->len + k > s->cap) {
		size_t cap = 2 * (s->len + k) + 256;
		uint8_t *o = realloc(s->out, cap);
		if (o == NULL)
			return NULL;
		s->out = o;
		s->cap = cap;
	}
	return s->out + s->len;
}

static void put_bytes(struct script *s, uint8_t *dst, size_t k)
{
	for (size_t i = 0; i < k; i++)
		dst[i] = s->off < s->n ? s->in[s->off++] : (uint8_t)(i * 31 + 7);
}

static int build(struct script *s, const struct cfg *c)
{
	int in_msg = 0;
	while (s->off < s->n && s->len < SCRIPT_MAX_BYTES) {
		uint8_t op = take(s), key[4], *dst, body[TW__WS_MAX_CONTROL];
		int kind = op & 3, fin = (op >> 2) & 1, variant = (op >> 3) & 3;
		int masked = (c->role == TW__WS_SERVER) ^ ((op & 0xc0) == 0xc0);
		size_t len, h;
		int rv;
		for (int i = 0; i < 4; i++)
			key[i] = take(s);
		len = take(s);
		if (kind == 0) {
			unsigned opcode = variant == 0   ? (in_msg ? TW__WS_CONT : TW__WS_BINARY)
					  : variant == 1 ? TW__WS_BINARY
					  : variant == 2 ? TW__WS_CONT
							 : take(s) & 15u;
			if (op & 0x20)
				len *= 300;
			if ((dst = room(s, TW__WS_MAX_HEADER + len)) == NULL)
				return -1;
			rv = tw__ws_encode_header(dst, fin, opcode, len, masked ? key : NULL);
			if (rv < 0) {
				check((opcode > 2 && opcode < 8) || opcode > 10 ||
				      (opcode >= 8 && (!fin || len > 125)));
				continue;
			}
			check(rv == (int)tw__ws_header_size(len, masked));
			h = (size_t)rv;
			put_bytes(s, dst + h, len);
			if (masked)
				tw__ws_mask(dst + h, len, key, 0);
			s->len += h + len;
			if (opcode < 8)
				in_msg = !fin;
		} else if (kind == 1 || kind == 2) {
			len %= TW__WS_MAX_CONTROL + 1;
			put_bytes(s, body, len);
			if ((dst = room(s, TW__WS_MAX_CONTROL_FRAME)) == NULL)
				return -1;
			rv = kind == 1 ? tw__ws_encode_control(dst, TW__WS_PING, body, len,
							       masked ? key : NULL)
				       : tw__ws_encode_pong(dst, body, len, masked ? key : NULL);
			check(rv == (int)(tw__ws_header_size(len, masked) + len));
			s->len += (size_t)rv;
		} else {
			unsigned code = (unsigned)take(s) << 8;
			code |= take(s);
			len %= TW__WS_MAX_REASON + 1;
			put_bytes(s, body + 2, len);
			if ((dst = room(s, TW__WS_MAX_CONTROL_FRAME)) == NULL)
				return -1;
			rv = tw__ws_encode_close(dst, code, (const char *)body + 2, len,
						 masked ? key : NULL);
			if (rv < 0) {
				/* Refused for a reason; send the body raw to
				 * see the decoder refuse it too. */
				check(code == 1005
					      ? len > 0
					      : !ref_code_ok(code) || !ref_utf8(body + 2, len));
				body[0] = (uint8_t)(code >> 8);
				body[1] = (uint8_t)code;
				rv = tw__ws_encode_control(dst, TW__WS_CLOSE, body, len + 2,
							   masked ? key : NULL);
				check(rv > 0);
			} else {
				check(rv ==
				      (int)(tw__ws_header_size(code == 1005 ? 0 : len + 2, masked) +
					    (code == 1005 ? 0 : len + 2)));
			}
			s->len += (size_t)rv;
		}
	}
	return 0;
}

int ws_fuzz_codec(const uint8_t *data, size_t size)
{
	static const uint64_t msgs[] = {0, 64, 1000, 70000}, frags[] = {0, 1, 3, 16};
	struct cfg c;
	if (size == 0)
		return 0;
	c.role = (data[0] & 1) ? TW__WS_CLIENT : TW__WS_SERVER;
	c.max_msg = msgs[(data[0] >> 1) & 3];
	c.max_frags = frags[(data[0] >> 3) & 3];
	if (c.max_msg == 0)
		c.max_msg = TW__WS_DEFAULT_MAX_MESSAGE_BYTES;
	if (c.max_frags == 0)
		c.max_frags = TW__WS_DEFAULT_MAX_FRAGMENTS;
	if (data[0] & 0x80) {
		struct script s = {data + 1, size - 1, 0, NULL, 0, 0};
		if (build(&s, &c) == 0)
			compare(&c, s.out, s.len);
		free(s.out);
	} else {
		compare(&c, data + 1, size - 1);
	}
	return 0;
}

#ifndef TW_FUZZ_REPLAY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return ws_fuzz_codec(data, size);
}
#endif
