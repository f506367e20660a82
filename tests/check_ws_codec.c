/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests: the WebSocket frame codec (transport/ws_codec.c).
 *
 * Every input is decoded several ways (in one piece, one byte at a time,
 * and at random split points, so masks continue across split points) and
 * all transcripts must be identical (tests/fuzz/ws_drive.h writes them).
 * Covered: the RFC 6455 section 5.7 examples; every length form at its
 * boundaries (RFC 6455 section 5.2), masked and unmasked, encoded by our encoder and
 * decoded back; non-minimal lengths; random streams of fragmented
 * messages with interleaved pings and pongs; every bad input of the
 * header checks with its close code, before any payload (RFC 6455
 * sections 5.1 to 5.5 and 7.4, the message limit, Autobahn 1.x-7.x
 * replays for a binary-only receiver); sticky errors; the encoder, masking and close
 * helpers; CSPRNG masking keys; UTF-8 validation; the ping-rate policy
 * (docs/design.md, WebSocket). */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <taskwire/error.h>

#include "tests/fuzz/ws_drive.h"
#include "tests/unit.h"
#include "tests/support/suite.h"
#include "transport/ws_codec.h"

#define MIB ((uint64_t)1 << 20)

static const uint8_t KEY[4] = {0x37, 0xfa, 0x21, 0x3d}; /* RFC 6455 section 5.7 */

/* --- helpers ------------------------------------------------------------ */

struct bytes {
	uint8_t *p;
	size_t len, cap;
};

static uint8_t *bytes_room(struct bytes *b, size_t n)
{
	if (b->len + n > b->cap) {
		b->cap = 2 * (b->len + n) + 64;
		b->p = realloc(b->p, b->cap);
		ck_assert_ptr_nonnull(b->p);
	}
	return b->p + b->len;
}

static void bytes_hex(struct bytes *b, const char *hex)
{
	size_t n = strlen(hex);
	b->len += hex_bytes(hex, bytes_room(b, n / 2 + 1), n / 2 + 1);
}

/* Append a frame made by the encoder: header, then the payload masked with
 * key (unmasked when key is NULL). */
static void put_frame(struct bytes *b, int fin, unsigned op, const uint8_t *payload, size_t n,
		      const uint8_t *key)
{
	int h = tw__ws_encode_header(bytes_room(b, TW__WS_MAX_HEADER), fin, op, n, key);
	ck_assert_int_ge(h, 2);
	b->len += (size_t)h;
	bytes_room(b, n);
	if (key != NULL)
		tw__ws_mask_copy(b->p + b->len, payload, n, key, 0);
	else if (n > 0)
		memcpy(b->p + b->len, payload, n);
	b->len += n;
}

/* Decode p in one piece, byte by byte and at random split points (pieces
 * of up to 2, 7 and 300 bytes); the transcripts, the result and the bytes
 * consumed must agree. *out gets the one-piece run (ws_log_free it). */
static void decode_all(enum tw__ws_role role, uint64_t max_msg, uint64_t max_frags,
		       const uint8_t *p, size_t n, struct ws_log *out)
{
	static const size_t pieces[] = {1, 2, 7, 300};
	struct tw__ws_dec d;
	uint64_t seed = 0x5eed0000 + n;
	ws_log_init(out);
	tw__ws_dec_init(&d, role, max_msg, max_frags);
	ws_drive(&d, p, n, 0, NULL, out);
	ck_assert(!out->oom);
	for (size_t i = 0; i < sizeof(pieces) / sizeof(pieces[0]); i++) {
		struct ws_log l;
		if (pieces[i] == 1 && n > ((size_t)1 << 20))
			continue;
		ws_log_init(&l);
		tw__ws_dec_init(&d, role, max_msg, max_frags);
		ws_drive(&d, p, n, pieces[i], pieces[i] == 1 ? NULL : &seed, &l);
		ck_assert(!l.oom);
		ck_assert_msg(strcmp(l.s != NULL ? l.s : "", out->s != NULL ? out->s : "") == 0,
			      "pieces of %zu: %s\none piece: %s", pieces[i], l.s, out->s);
		ck_assert_int_eq(l.rv, out->rv);
		ck_assert_uint_eq(l.used, out->used);
		ws_log_free(&l);
	}
}

/* Decode hex every way; expect this transcript and result. */
static void expect(enum tw__ws_role role, const char *hex, const char *log, int rv)
{
	struct bytes b = {0};
	struct ws_log l;
	bytes_hex(&b, hex);
	decode_all(role, 0, 0, b.p, b.len, &l);
	ck_assert_msg(strcmp(l.s != NULL ? l.s : "", log) == 0, "%s\n got: %s\nwant: %s", hex, l.s,
		      log);
	ck_assert_int_eq(l.rv, rv);
	ws_log_free(&l);
	free(b.p);
}

/* --- the RFC 6455 section 5.7 examples ----------------------------------- */

START_TEST(rfc_examples)
{
	uint8_t hello[5] = {0x7f, 0x9f, 0x4d, 0x51, 0x58}, out[TW__WS_MAX_HEADER];
	/* The masked "Hello": unmasking gives the text... */
	tw__ws_mask(hello, 5, KEY, 0);
	ck_assert_mem_eq(hello, "Hello", 5);
	/* ...and the encoder makes its header. */
	ck_assert_int_eq(tw__ws_encode_header(out, 1, TW__WS_TEXT, 5, KEY), 6);
	ck_assert_mem_eq(out, "\x81\x85\x37\xfa\x21\x3d", 6);
	ck_assert_int_eq(tw__ws_encode_header(out, 1, TW__WS_TEXT, 5, NULL), 2);
	ck_assert_mem_eq(out, "\x81\x05", 2);
	/* Text is refused (binary-only mapping, 1003), masked or not, whole
	 * or fragmented. */
	expect(TW__WS_CLIENT, "81 05 48 65 6c 6c 6f", "error(1003,text messages not supported)",
	       TW_ENOTSUP);
	expect(TW__WS_SERVER, "81 85 37 fa 21 3d 7f 9f 4d 51 58",
	       "error(1003,text messages not supported)", TW_ENOTSUP);
	expect(TW__WS_CLIENT, "01 03 48 65 6c 80 02 6c 6f",
	       "error(1003,text messages not supported)", TW_ENOTSUP);
	/* The same frames as binary. */
	expect(TW__WS_CLIENT, "82 05 48 65 6c 6c 6f",
	       "data(op=2,fin=1,first=1,len=5,msg=5,frags=1)end(len=5,frags=1,48656c6c6f)", 0);
	expect(TW__WS_SERVER, "82 85 37 fa 21 3d 7f 9f 4d 51 58",
	       "data(op=2,fin=1,first=1,len=5,msg=5,frags=1)end(len=5,frags=1,48656c6c6f)", 0);
	expect(TW__WS_CLIENT, "02 03 48 65 6c 80 02 6c 6f",
	       "data(op=2,fin=0,first=1,len=3,msg=3,frags=1)"
	       "data(op=0,fin=1,first=0,len=2,msg=5,frags=2)end(len=5,frags=2,48656c6c6f)",
	       0);
	/* Unmasked ping, masked pong. */
	expect(TW__WS_CLIENT, "89 05 48 65 6c 6c 6f", "ping(48656c6c6f)", 0);
	expect(TW__WS_SERVER, "8a 85 37 fa 21 3d 7f 9f 4d 51 58", "pong(48656c6c6f)", 0);
}
END_TEST

/* 256 bytes (16-bit length) and 64 KiB (64-bit length) in one unmasked
 * binary frame, section 5.7's last examples. */
START_TEST(rfc_examples_long)
{
	static const struct {
		size_t n;
		const char *hex;
	} cases[] = {{256, "82 7e 01 00"}, {65536, "82 7f 00 00 00 00 00 01 00 00"}};
	for (size_t c = 0; c < 2; c++) {
		struct bytes b = {0};
		struct ws_log l;
		uint8_t *pay = malloc(cases[c].n);
		ck_assert_ptr_nonnull(pay);
		for (size_t i = 0; i < cases[c].n; i++)
			pay[i] = pattern(c, i);
		bytes_hex(&b, cases[c].hex);
		memcpy(bytes_room(&b, cases[c].n), pay, cases[c].n);
		b.len += cases[c].n;
		decode_all(TW__WS_CLIENT, 0, 0, b.p, b.len, &l);
		ck_assert_int_eq(l.rv, 0);
		ck_assert_uint_eq(l.used, b.len);
		free(b.p);
		/* The encoder writes the same frame. */
		memset(&b, 0, sizeof(b));
		put_frame(&b, 1, TW__WS_BINARY, pay, cases[c].n, NULL);
		{
			struct bytes e = {0};
			bytes_hex(&e, cases[c].hex);
			ck_assert_mem_eq(b.p, e.p, e.len);
			free(e.p);
		}
		ws_log_free(&l);
		free(b.p);
		free(pay);
	}
}
END_TEST

/* --- every length form, masked and unmasked (RFC 6455 section 5.2) ------- */

static const size_t sizes[] = {0, 1, 125, 126, 127, 32767, 32768, 65535, 65536, 65537};
#define N_SIZES ((int)(sizeof(sizes) / sizeof(sizes[0])))

START_TEST(length_forms)
{
	size_t n = sizes[_i / 2];
	int masked = _i % 2;
	enum tw__ws_role role = masked ? TW__WS_SERVER : TW__WS_CLIENT;
	uint8_t *pay = malloc(n + 1);
	struct bytes b = {0};
	struct ws_log l;
	char want[256];
	size_t hlen = tw__ws_header_size(n, masked);
	ck_assert_ptr_nonnull(pay);
	for (size_t i = 0; i < n; i++)
		pay[i] = pattern(7, i);
	put_frame(&b, 1, TW__WS_BINARY, pay, n, masked ? KEY : NULL);
	ck_assert_uint_eq(b.len, hlen + n);
	ck_assert_uint_eq(hlen, (n <= 125 ? 2 : n <= 65535 ? 4 : 10) + (masked ? 4 : 0));
	decode_all(role, 0, 0, b.p, b.len, &l);
	ck_assert_int_eq(l.rv, 0);
	ck_assert_uint_eq(l.used, b.len);
	snprintf(want, sizeof(want), "data(op=2,fin=1,first=1,len=%zu,msg=%zu,frags=1)end(len=%zu,",
		 n, n, n);
	ck_assert_msg(strncmp(l.s, want, strlen(want)) == 0, "%s", l.s);
	ws_log_free(&l);
	/* The payload came out exactly, not just its hash: decode once more
	 * into a buffer of its own. */
	if (n > 0) {
		struct tw__ws_dec d;
		struct ws_log one;
		tw__ws_dec_init(&d, role, 0, 0);
		ws_log_init(&one);
		ck_assert_int_eq(ws_drive(&d, b.p, hlen, 0, NULL, &one), 0);
		ck_assert_uint_eq(tw__ws_dec_payload_room(&d), n);
		ck_assert_int_eq(tw__ws_dec_phase(&d), TW__WS_DEC_PAYLOAD);
		{
			struct tw__ws_event ev;
			uint8_t *dst = malloc(n + 1);
			ck_assert_ptr_nonnull(dst);
			memcpy(dst, b.p + hlen, n);
			ck_assert_int_eq(tw__ws_dec_payload_done(&d, dst, n, &ev), 1);
			ck_assert_int_eq(ev.type, TW__WS_EV_MESSAGE_END);
			ck_assert_uint_eq(ev.length, n);
			ck_assert_mem_eq(dst, pay, n);
			free(dst);
		}
		ws_log_free(&one);
	}
	free(b.p);
	free(pay);
}
END_TEST

/* The exact headers of each length form (server to client, so unmasked). */
START_TEST(length_headers)
{
	static const struct {
		uint64_t n;
		const char *hex;
	} cases[] = {
		{0, "82 00"},
		{125, "82 7d"},
		{126, "82 7e 00 7e"},
		{32768, "82 7e 80 00"},
		{65535, "82 7e ff ff"},
		{65536, "82 7f 00 00 00 00 00 01 00 00"},
		{(UINT64_C(1) << 32) + 1, "82 7f 00 00 00 01 00 00 00 01"},
		{(UINT64_C(1) << 63) - 1, "82 7f 7f ff ff ff ff ff ff ff"},
	};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		uint8_t out[TW__WS_MAX_HEADER], want[TW__WS_MAX_HEADER];
		size_t wn = hex_bytes(cases[c].hex, want, sizeof(want));
		struct tw__ws_dec d;
		struct ws_log l;
		ck_assert_int_eq(tw__ws_encode_header(out, 1, TW__WS_BINARY, cases[c].n, NULL),
				 (int)wn);
		ck_assert_mem_eq(out, want, wn);
		ck_assert_uint_eq(tw__ws_header_size(cases[c].n, 0), wn);
		/* Decoded back one byte at a time: the announced length, no
		 * payload asked for up front. */
		tw__ws_dec_init(&d, TW__WS_CLIENT, UINT64_MAX, 0);
		ws_log_init(&l);
		ck_assert_int_eq(ws_drive(&d, want, wn, 1, NULL, &l), 0);
		ck_assert_uint_eq(l.used, wn);
		ck_assert_uint_eq(tw__ws_dec_payload_room(&d), cases[c].n);
		ws_log_free(&l);
	}
}
END_TEST

/* Non-minimal length encodings are accepted (policy in ws_codec.h). */
START_TEST(non_minimal)
{
	const char *hello = "data(op=2,fin=1,first=1,len=5,msg=5,frags=1)end(len=5,frags=1,"
			    "68656c6c6f)";
	expect(TW__WS_SERVER, "82 fe 00 05 37 fa 21 3d 5f 9f 4d 51 58", hello, 0);
	expect(TW__WS_SERVER, "82 ff 00 00 00 00 00 00 00 05 37 fa 21 3d 5f 9f 4d 51 58", hello, 0);
	expect(TW__WS_CLIENT, "82 7e 00 05 68 65 6c 6c 6f", hello, 0);
	/* On control frames too: the decoded length (5) is what counts. */
	expect(TW__WS_CLIENT, "89 7e 00 05 68 65 6c 6c 6f", "ping(68656c6c6f)", 0);
	/* ...and a 16-bit 126 is still over 125. */
	expect(TW__WS_CLIENT, "89 7e 00 7e", "error(1002,control frame over 125 bytes)", TW_EPROTO);
}
END_TEST

/* --- fragmentation, interleaved control frames ---------------------------- */

/* RFC 6455 section 5.4 and Autobahn 5.6 (binary variant): the ping between fragments is
 * its own event, before the message ends, and never part of it. */
START_TEST(ping_between_fragments)
{
	expect(TW__WS_SERVER,
	       "02 85 37 fa 21 3d 5f 9f 4d 51 58  89 80 37 fa 21 3d  80 85 37 fa 21 3d 40 95 53 51 "
	       "53",
	       "data(op=2,fin=0,first=1,len=5,msg=5,frags=1)ping()"
	       "data(op=0,fin=1,first=0,len=5,msg=10,frags=2)"
	       "end(len=10,frags=2,68656c6c6f776f726c64)",
	       0);
	/* The text variant of the same case (first byte 01): 1003. */
	expect(TW__WS_SERVER,
	       "01 85 37 fa 21 3d 5f 9f 4d 51 58  89 80 37 fa 21 3d  80 85 37 fa 21 3d 40 95 53 51 "
	       "53",
	       "error(1003,text messages not supported)", TW_ENOTSUP);
	/* Ping with a body and an unsolicited pong inside a 3-fragment
	 * message, and empty fragments (Autobahn 6.1.2, binary). */
	expect(TW__WS_CLIENT, "02 01 61 89 02 70 31 00 00 8a 00 80 01 62",
	       "data(op=2,fin=0,first=1,len=1,msg=1,frags=1)ping(7031)"
	       "data(op=0,fin=0,first=0,len=0,msg=1,frags=2)pong()"
	       "data(op=0,fin=1,first=0,len=1,msg=2,frags=3)end(len=2,frags=3,6162)",
	       0);
	expect(TW__WS_SERVER, "02 80 37 fa 21 3d  00 80 37 fa 21 3d  80 80 37 fa 21 3d",
	       "data(op=2,fin=0,first=1,len=0,msg=0,frags=1)"
	       "data(op=0,fin=0,first=0,len=0,msg=0,frags=2)"
	       "data(op=0,fin=1,first=0,len=0,msg=0,frags=3)end(len=0,frags=3,)",
	       0);
	/* An empty message. */
	expect(TW__WS_CLIENT, "82 00 82 00",
	       "data(op=2,fin=1,first=1,len=0,msg=0,frags=1)end(len=0,frags=1,)"
	       "data(op=2,fin=1,first=1,len=0,msg=0,frags=1)end(len=0,frags=1,)",
	       0);
}
END_TEST

/* Random valid streams: messages of 1-6 fragments of random sizes, pings
 * and pongs between and inside them, masked with random keys for a server
 * decoder, unmasked for a client. The transcript must be the one the
 * generator expects, however the stream is split. */
static void gen_stream(uint64_t *seed, enum tw__ws_role role, struct bytes *b, struct ws_log *want)
{
	size_t msgs = rnd_range(seed, 1, 8);
	uint8_t *pay = malloc(70000), key[4];
	ck_assert_ptr_nonnull(pay);
	for (size_t m = 0; m < msgs; m++) {
		size_t frags = rnd_range(seed, 1, 6), total = 0;
		uint8_t *whole = NULL;
		for (size_t f = 0; f < frags; f++) {
			size_t n, r = rnd_range(seed, 0, 9);
			int fin = f + 1 == frags;
			n = r == 0  ? 0
			    : r < 6 ? rnd_range(seed, 1, 20)
			    : r < 9 ? rnd_range(seed, 100, 400)
				    : rnd_range(seed, 60000, 70000);
			for (size_t i = 0; i < n; i++)
				pay[i] = (uint8_t)rnd_next(seed);
			for (int i = 0; i < 4; i++)
				key[i] = (uint8_t)rnd_next(seed);
			put_frame(b, fin, f == 0 ? TW__WS_BINARY : TW__WS_CONT, pay, n,
				  role == TW__WS_SERVER ? key : NULL);
			whole = realloc(whole, total + n + 1);
			ck_assert_ptr_nonnull(whole);
			memcpy(whole + total, pay, n);
			total += n;
			ws_logf(want, "data(op=%d,fin=%d,first=%d,len=%zu,msg=%zu,frags=%zu)",
				f == 0 ? 2 : 0, fin, f == 0, n, total, f + 1);
			if (fin) {
				ws_logf(want, "end(len=%zu,frags=%zu,", total, frags);
				ws_log_bytes(want, whole, total);
				ws_logf(want, ")");
			}
			if (rnd_range(seed, 0, 3) == 0) {
				int ping = rnd_range(seed, 0, 1) == 0;
				size_t cn = rnd_range(seed, 0, 1) ? rnd_range(seed, 0, 125) : 0;
				uint8_t frame[TW__WS_MAX_CONTROL_FRAME];
				int fl;
				for (size_t i = 0; i < cn; i++)
					pay[i] = (uint8_t)rnd_next(seed);
				fl = tw__ws_encode_control(frame, ping ? TW__WS_PING : TW__WS_PONG,
							   pay, cn,
							   role == TW__WS_SERVER ? key : NULL);
				ck_assert_int_eq(
					fl, (int)tw__ws_header_size(cn, role == TW__WS_SERVER) +
						    (int)cn);
				memcpy(bytes_room(b, (size_t)fl), frame, (size_t)fl);
				b->len += (size_t)fl;
				ws_logf(want, ping ? "ping(" : "pong(");
				ws_log_bytes(want, pay, cn);
				ws_logf(want, ")");
			}
		}
		free(whole);
	}
	free(pay);
}

START_TEST(random_streams)
{
	uint64_t seed = 0x5eed0100 + (uint64_t)_i;
	for (int iter = 0; iter < 40; iter++) {
		enum tw__ws_role role = iter % 2 ? TW__WS_SERVER : TW__WS_CLIENT;
		struct bytes b = {0};
		struct ws_log want, got;
		ws_log_init(&want);
		gen_stream(&seed, role, &b, &want);
		decode_all(role, 0, 0, b.p, b.len, &got);
		ck_assert_int_eq(got.rv, 0);
		ck_assert_uint_eq(got.used, b.len);
		ck_assert_str_eq(got.s, want.s);
		ws_log_free(&want);
		ws_log_free(&got);
		free(b.p);
	}
}
END_TEST

/* --- bad input, each with its close code ---------------------------------- */

struct bad {
	const char *name;
	enum tw__ws_role role;
	const char *hex;
	const char *log; /* whole transcript, error included */
	int rv;
	size_t used; /* bytes consumed when the error was seen */
};

#define E1002(why) "error(1002," why ")"
#define BIN_HELLO  "data(op=2,fin=1,first=1,len=5,msg=5,frags=1)end(len=5,frags=1,48656c6c6f)"
#define S          TW__WS_SERVER
#define C          TW__WS_CLIENT

static const struct bad bads[] = {
	/* Autobahn 3.x: reserved bits, on data and control frames. */
	{"3.1 text RSV1", S, "91 8d 37 fa 21 3d 7f 9f 4d 51 58 d6 01 4a 58 88 4d 59 16",
	 E1002("reserved bits set"), TW_EPROTO, 2},
	{"3.x binary RSV2", S, "a2 80 37 fa 21 3d", E1002("reserved bits set"), TW_EPROTO, 2},
	{"3.x after a message, RSV3", S,
	 "82 85 37 fa 21 3d 7f 9f 4d 51 58 92 85 37 fa 21 3d 7f 9f 4d 51 58",
	 BIN_HELLO E1002("reserved bits set"), TW_EPROTO, 13},
	{"3.x ping RSV", S, "c9 80 37 fa 21 3d", E1002("reserved bits set"), TW_EPROTO, 2},
	{"3.7 close RSV=7", S, "f8 82 37 fa 21 3d 34 12", E1002("reserved bits set"), TW_EPROTO, 2},
	/* Autobahn 4.x: reserved opcodes. */
	{"4.1.1 opcode 3", S, "83 80 37 fa 21 3d", E1002("reserved opcode"), TW_EPROTO, 2},
	{"4.1.3 binary, opcode 5, ping", S,
	 "82 85 37 fa 21 3d 7f 9f 4d 51 58 85 80 37 fa 21 3d 89 85 37 fa 21 3d 7f 9f 4d 51 58",
	 BIN_HELLO E1002("reserved opcode"), TW_EPROTO, 13},
	{"4.2.1 opcode 11", S, "8b 80 37 fa 21 3d", E1002("reserved opcode"), TW_EPROTO, 2},
	{"opcode 15 from a server", C, "8f 00", E1002("reserved opcode"), TW_EPROTO, 2},
	/* Control frames: fragmented (5.1, 5.2) or over 125 bytes (2.5,
	 * RFC 6455 section 5.5). */
	{"5.1 fragmented ping", S, "09 82 37 fa 21 3d 56 98 80 82 37 fa 21 3d 54 9e",
	 E1002("fragmented control frame"), TW_EPROTO, 2},
	{"5.2 fragmented pong", S, "0a 82 37 fa 21 3d 56 98 80 82 37 fa 21 3d 54 9e",
	 E1002("fragmented control frame"), TW_EPROTO, 2},
	{"fragmented close", C, "08 02 03 e8", E1002("fragmented control frame"), TW_EPROTO, 2},
	{"2.5 ping of 126 bytes", S, "89 fe 00 7e 37 fa 21 3d c9 04 df c3 c9 04 df c3",
	 E1002("control frame over 125 bytes"), TW_EPROTO, 4},
	{"5.5 close of 126 bytes", S, "88 fe 00 7e 37 fa 21 3d 34 12",
	 E1002("control frame over 125 bytes"), TW_EPROTO, 4},
	{"pong with a 64-bit length", C, "8a 7f 00 00 00 00 00 00 00 7e",
	 E1002("control frame over 125 bytes"), TW_EPROTO, 10},
	/* RFC 6455 section 5.2: 64-bit lengths with the top bit set, whatever the limit. */
	{"5.2 length 2^63", S, "82 ff 80 00 00 00 00 00 00 00 37 fa 21 3d",
	 E1002("length with the top bit set"), TW_EPROTO, 10},
	{"5.2 length 2^64-1", S, "82 ff ff ff ff ff ff ff ff ff 37 fa 21 3d 41",
	 E1002("length with the top bit set"), TW_EPROTO, 10},
	{"5.2 length + 4 wraps", S, "82 ff ff ff ff ff ff ff ff fc 37 fa 21 3d",
	 E1002("length with the top bit set"), TW_EPROTO, 10},
	/* RFC 6455 section 5.1: the masking rule, both ways. */
	{"5.1 unmasked client frame", S, "82 03 61 62 63", E1002("unmasked client frame"),
	 TW_EPROTO, 2},
	{"5.1 masked server frame", C, "82 83 37 fa 21 3d 56 98 42", E1002("masked server frame"),
	 TW_EPROTO, 2},
	{"unmasked ping to a server", S, "89 00", E1002("unmasked client frame"), TW_EPROTO, 2},
	/* Message sequence: 5.9 (stray continuation, before the text is
	 * looked at), new message inside a fragmented one (5.18). */
	{"5.9 continuation first", S,
	 "80 89 37 fa 21 3d 51 88 40 5a 5a 9f 4f 49 06 "
	 "81 8d 37 fa 21 3d 7f 9f 4d 51 58 d6 01 4a 58 88 4d 59 16",
	 E1002("continuation without a message"), TW_EPROTO, 2},
	{"5.x continuation after a whole message", C, "82 01 61 00 01 62",
	 "data(op=2,fin=1,first=1,len=1,msg=1,frags=1)end(len=1,frags=1,61)" E1002(
		 "continuation without a message"),
	 TW_EPROTO, 5},
	{"5.18 text inside a fragmented message", S, "02 81 37 fa 21 3d 56 01 81 37 fa 21 3d 55",
	 "data(op=2,fin=0,first=1,len=1,msg=1,frags=1)" E1002(
		 "new message inside a fragmented one"),
	 TW_EPROTO, 9},
	{"binary inside a fragmented message", C, "02 01 61 82 01 62",
	 "data(op=2,fin=0,first=1,len=1,msg=1,frags=1)" E1002(
		 "new message inside a fragmented one"),
	 TW_EPROTO, 5},
	/* Text: refused with 1003 (binary-only mapping); invalid
	 * UTF-8 text and Autobahn 1.1.1 / 6.x never get to UTF-8 checks. */
	{"binary only: invalid UTF-8 text", S,
	 "81 94 37 fa 21 3d f9 40 c0 80 8e 35 a2 f3 8b 34 94 d0 97 7a 44 59 5e 8e 44 59",
	 "error(1003,text messages not supported)", TW_ENOTSUP, 2},
	{"1.1.1 empty text", S, "81 80 37 fa 21 3d", "error(1003,text messages not supported)",
	 TW_ENOTSUP, 2},
	{"6.1.2 empty text fragments", S, "01 80 37 fa 21 3d 00 80 37 fa 21 3d 80 80 37 fa 21 3d",
	 "error(1003,text messages not supported)", TW_ENOTSUP, 2},
	{"text after a binary message", C, "82 01 61 81 01 62",
	 "data(op=2,fin=1,first=1,len=1,msg=1,frags=1)end(len=1,frags=1,61)"
	 "error(1003,text messages not supported)",
	 TW_ENOTSUP, 5},
	/* Close bodies (7.3.2, 7.9; RFC 6455 sections 5.5.1 and 7.4). */
	{"7.3.2 close of 1 byte", S, "88 81 37 fa 21 3d 34", E1002("close body of 1 byte"),
	 TW_EPROTO, 7},
	{"7.9 close code 1005", S, "88 82 37 fa 21 3d 34 17", E1002("invalid close code"),
	 TW_EPROTO, 8},
	{"7.4 close code 999", S, "88 82 37 fa 21 3d 34 1d", E1002("invalid close code"), TW_EPROTO,
	 8},
	{"5.5.1 reason not UTF-8", S,
	 "88 96 37 fa 21 3d 34 12 ef 87 d6 47 98 f2 b4 34 9d f3 82 17 81 bd 52 9e 48 49 52 9e",
	 "error(1007,close reason not UTF-8)", TW_EPROTO, 28},
};
#define N_BAD ((int)(sizeof(bads) / sizeof(bads[0])))

/* Sticky: nothing more is taken, every call repeats the error. */
static void check_sticky(struct tw__ws_dec *d, int rv, unsigned code)
{
	struct tw__ws_event ev;
	uint8_t *dst = (uint8_t *)&ev, buf[4] = {0};
	ck_assert_int_eq(tw__ws_dec_phase(d), TW__WS_DEC_FAILED);
	ck_assert_uint_eq(tw__ws_dec_want(d, &dst), 0);
	ck_assert_ptr_null(dst);
	ck_assert_uint_eq(tw__ws_dec_payload_room(d), 0);
	ck_assert_int_eq(tw__ws_dec_advance(d, 0, &ev), rv);
	ck_assert_int_eq(tw__ws_dec_advance(d, 1, &ev), rv);
	ck_assert_int_eq(tw__ws_dec_payload_done(d, buf, 0, &ev), rv);
	ck_assert_int_eq(ev.type, TW__WS_EV_NONE);
	ck_assert_uint_eq(tw__ws_dec_close_code(d), code);
	ck_assert_ptr_nonnull(tw__ws_dec_error(d));
}

START_TEST(rejects)
{
	const struct bad *c = &bads[_i];
	struct bytes b = {0};
	struct ws_log l;
	struct tw__ws_dec d;
	uint64_t frame_start;
	bytes_hex(&b, c->hex);
	decode_all(c->role, 0, 0, b.p, b.len, &l);
	ck_assert_msg(strcmp(l.s, c->log) == 0, "%s\n got: %s\nwant: %s", c->name, l.s, c->log);
	ck_assert_int_eq(l.rv, c->rv);
	ck_assert_msg(l.used == c->used, "%s: used %" PRIu64 ", want %zu", c->name, l.used,
		      c->used);
	ws_log_free(&l);
	/* Again to look at the decoder: sticky, and the failing frame's
	 * offset is kept. */
	ws_log_init(&l);
	tw__ws_dec_init(&d, c->role, 0, 0);
	ws_drive(&d, b.p, b.len, 1, NULL, &l);
	frame_start = tw__ws_dec_frame_offset(&d);
	ck_assert_uint_le(frame_start, c->used);
	ck_assert_uint_le(c->used - frame_start, TW__WS_MAX_HEADER + TW__WS_MAX_CONTROL);
	check_sticky(&d, c->rv,
		     strstr(c->log, "error(1003")   ? 1003u
		     : strstr(c->log, "error(1007") ? 1007u
						    : 1002u);
	ws_log_free(&l);
	free(b.p);
}
END_TEST

/* Every reserved opcode, alone and after a valid message; every invalid
 * close code; every valid one (7.7.x, 7.9.x, 7.13.x). */
START_TEST(opcodes_and_close_codes)
{
	static const unsigned bad_codes[] = {0,    1,    999,  1004, 1005, 1006,  1015, 1016,
					     1100, 2000, 2999, 5000, 6000, 65535, 1099};
	static const unsigned good_codes[] = {1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010,
					      1011, 1012, 1013, 1014, 3000, 3999, 4000, 4999};
	char hex[128], log[128];
	for (unsigned op = 0; op < 16; op++) {
		if (op <= 2 || (op >= 8 && op <= 10))
			continue;
		snprintf(hex, sizeof(hex), "%02x 80 37 fa 21 3d", 0x80 | op);
		expect(TW__WS_SERVER, hex, E1002("reserved opcode"), TW_EPROTO);
		snprintf(hex, sizeof(hex), "82 00 %02x 00", 0x80 | op);
		expect(TW__WS_CLIENT, hex,
		       "data(op=2,fin=1,first=1,len=0,msg=0,frags=1)end(len=0,frags=1,)" E1002(
			       "reserved opcode"),
		       TW_EPROTO);
	}
	for (size_t i = 0; i < sizeof(bad_codes) / sizeof(bad_codes[0]); i++) {
		uint8_t f[TW__WS_MAX_CONTROL_FRAME],
			body[2] = {(uint8_t)(bad_codes[i] >> 8), (uint8_t)bad_codes[i]};
		ck_assert_int_eq(tw__ws_close_code_valid(bad_codes[i]), 0);
		ck_assert_int_eq(tw__ws_encode_close(f, bad_codes[i] == 1005 ? 1006 : bad_codes[i],
						     NULL, 0, NULL),
				 TW_EINVAL);
		snprintf(hex, sizeof(hex), "88 82 37 fa 21 3d %02x %02x", body[0] ^ KEY[0],
			 body[1] ^ KEY[1]);
		expect(TW__WS_SERVER, hex, E1002("invalid close code"), TW_EPROTO);
	}
	for (size_t i = 0; i < sizeof(good_codes) / sizeof(good_codes[0]); i++) {
		unsigned code = good_codes[i];
		ck_assert_int_eq(tw__ws_close_code_valid(code), 1);
		snprintf(hex, sizeof(hex), "88 82 37 fa 21 3d %02x %02x", (code >> 8) ^ KEY[0],
			 (code & 0xff) ^ KEY[1]);
		snprintf(log, sizeof(log), "close(%u,)", code);
		expect(TW__WS_SERVER, hex, log, 0);
	}
	/* 7.7 (3000): close code 3000, masked with 37 fa 21 3d. */
	expect(TW__WS_SERVER, "88 82 37 fa 21 3d 3c 42", "close(3000,)", 0);
}
END_TEST

/* Close handling: empty body (1005 reported), reasons, and nothing read
 * after a close (RFC 6455 section 5.5.1, Autobahn 7.1.x). */
START_TEST(close_frames)
{
	struct bytes b = {0};
	struct ws_log l;
	struct tw__ws_dec d;
	struct tw__ws_event ev;
	uint8_t reason[TW__WS_MAX_REASON + 1], f[TW__WS_MAX_CONTROL_FRAME], *dst;
	char want[512];
	int n;
	expect(TW__WS_SERVER, "88 80 37 fa 21 3d", "close(1005,)", 0);
	expect(TW__WS_CLIENT, "88 00", "close(1005,)", 0);
	/* close 1000, then text that must not be processed. */
	expect(TW__WS_SERVER, "88 82 37 fa 21 3d 34 12 81 85 37 fa 21 3d 5f 9f 4d 51 58",
	       "close(1000,)", 0);
	/* 7.1.3: ping after close: no ping event. 7.1.x: two closes. */
	expect(TW__WS_SERVER, "88 82 37 fa 21 3d 34 12 89 80 37 fa 21 3d", "close(1000,)", 0);
	expect(TW__WS_CLIENT, "88 02 03 e8 88 02 03 e9", "close(1000,)", 0);
	/* Close in the middle of a fragmented message: the message is
	 * abandoned. */
	expect(TW__WS_CLIENT, "02 01 61 88 02 03 e8 80 01 62",
	       "data(op=2,fin=0,first=1,len=1,msg=1,frags=1)close(1000,)", 0);
	/* The decoder stops after the close. */
	bytes_hex(&b, "88 82 37 fa 21 3d 34 12 82 80 37 fa 21 3d");
	tw__ws_dec_init(&d, TW__WS_SERVER, 0, 0);
	ws_log_init(&l);
	ck_assert_int_eq(ws_drive(&d, b.p, b.len, 0, NULL, &l), 0);
	ck_assert_uint_eq(l.used, 8);
	ck_assert_int_eq(tw__ws_dec_phase(&d), TW__WS_DEC_CLOSED);
	ck_assert_uint_eq(tw__ws_dec_want(&d, &dst), 0);
	ck_assert_int_eq(tw__ws_dec_advance(&d, 0, &ev), 0);
	ck_assert_int_eq(tw__ws_dec_payload_done(&d, NULL, 0, &ev), TW_EINVAL);
	ck_assert_uint_eq(tw__ws_dec_close_code(&d), 0);
	ws_log_free(&l);
	free(b.p);
	/* Reasons: multi-byte UTF-8, and the longest (123 bytes, 7.3.5); a
	 * 124-byte reason makes a 126-byte body (7.3.6): 1002. All masked
	 * by our encoder. */
	memset(reason, 'r', sizeof(reason));
	memcpy(reason, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9);
	for (size_t len = 0; len <= TW__WS_MAX_REASON; len += len < 9 ? 9 : 57) {
		size_t rl = len < 9 ? len : len == 9 ? 9 : len > 123 ? 123 : len;
		memset(&b, 0, sizeof(b));
		n = tw__ws_encode_close(f, 4000, (const char *)reason, rl, KEY);
		ck_assert_int_eq(n, (int)(6 + 2 + rl));
		memcpy(bytes_room(&b, (size_t)n), f, (size_t)n);
		b.len = (size_t)n;
		ws_log_init(&l);
		ws_logf(&l, "close(4000,");
		ws_log_bytes(&l, reason, rl);
		ws_logf(&l, ")");
		snprintf(want, sizeof(want), "%s", l.s);
		ws_log_free(&l);
		decode_all(TW__WS_SERVER, 0, 0, b.p, b.len, &l);
		ck_assert_str_eq(l.s, want);
		ws_log_free(&l);
		free(b.p);
	}
	ck_assert_int_eq(tw__ws_encode_close(f, 4000, (const char *)reason, 123, NULL), 2 + 125);
	ck_assert_int_eq(tw__ws_encode_close(f, 4000, (const char *)reason, 124, NULL), TW_EINVAL);
	expect(TW__WS_CLIENT,
	       "88 7e 00 7e 0f a0 72727272727272727272727272727272727272727272727272727272727272"
	       "72727272727272727272727272727272727272727272727272727272727272727272727272727272"
	       "7272727272727272727272727272727272727272727272727272727272727272727272",
	       E1002("control frame over 125 bytes"), TW_EPROTO);
}
END_TEST

/* --- limits ------------------------------------------------------------------ */

/* The message limit, whole frames decoded against it: rv and used are
 * checked where given (not ANY). */
#define ANY (-999)
static const struct limit_case {
	const char *hex;
	enum tw__ws_role side;
	uint64_t limit;
	const char *log;
	int rv;
	long used;
} limit_cases[] = {
	/* a 1 GiB declared length against a 16 MiB limit fails with 1009
	 * right after the 8 length bytes (before the key, before any
	 * payload) */
	{"82 ff 00 00 00 00 40 00 00 00 37 fa 21 3d 41", TW__WS_SERVER, 16 * MIB,
	 "error(1009,message too big)", TW_ETOOBIG, 10},
	/* the limit itself is allowed, one more is not; lengths of every
	 * form */
	{"82 7e 01 00", TW__WS_CLIENT, 256, "data(op=2,fin=1,first=1,len=256,msg=256,frags=1)", ANY,
	 ANY},
	{"82 7e 01 00", TW__WS_CLIENT, 255, "error(1009,message too big)", ANY, 4},
	{"82 06 61 62 63 64 65 66", TW__WS_CLIENT, 5, "error(1009,message too big)", ANY, 2},
};

START_TEST(limit_declared)
{
	for (size_t i = 0; i < sizeof(limit_cases) / sizeof(limit_cases[0]); i++) {
		const struct limit_case *c = &limit_cases[i];
		struct bytes b = {0};
		struct ws_log l;
		bytes_hex(&b, c->hex);
		decode_all(c->side, c->limit, 0, b.p, b.len, &l);
		ck_assert_str_eq(l.s, c->log);
		if (c->rv != ANY)
			ck_assert_int_eq(l.rv, c->rv);
		if (c->used != ANY)
			ck_assert_uint_eq(l.used, (size_t)c->used);
		ws_log_free(&l);
		free(b.p);
	}
}
END_TEST

/* The limit holds for the sum of fragments: five 4 MiB fragments against a 16 MiB limit: the first
 * four (exactly 16 MiB) go through, the fifth header fails with 1009 before its payload. The
 * payload is real (16 MiB masked bytes). */
START_TEST(limit_fragments_sum)
{
	size_t frag = 4 * MIB;
	struct bytes b = {0};
	uint8_t *pay = calloc(1, frag);
	struct tw__ws_dec d;
	struct ws_log l;
	ck_assert_ptr_nonnull(pay);
	put_frame(&b, 0, TW__WS_BINARY, pay, frag, KEY);
	for (int i = 1; i < 5; i++)
		put_frame(&b, 0, TW__WS_CONT, pay, frag, KEY);
	ck_assert_mem_eq(b.p + 4 * (14 + frag), "\x00\xff\x00\x00\x00\x00\x00\x40\x00\x00", 10);
	tw__ws_dec_init(&d, TW__WS_SERVER, 16 * MIB, 0);
	ws_log_init(&l);
	ck_assert_int_eq(ws_drive(&d, b.p, b.len, 65536, &(uint64_t){1}, &l), TW_ETOOBIG);
	ck_assert_uint_eq(l.used, 4 * (14 + frag) + 10);
	ck_assert_uint_eq(tw__ws_dec_frame_offset(&d), 4 * (14 + frag));
	ck_assert_uint_eq(tw__ws_dec_close_code(&d), 1009);
	ck_assert_ptr_nonnull(strstr(l.s,
				     "data(op=0,fin=0,first=0,len=4194304,msg=16777216,frags=4)"
				     "error(1009,message too big)"));
	ws_log_free(&l);
	free(b.p);
	free(pay);
}
END_TEST

/* The fragments limit (1009, TW_ETOOMANY) on the header of the fragment
 * past it; Autobahn 9.3.1's shape (many 64-byte fragments). */
START_TEST(limit_fragment_count)
{
	struct bytes b = {0};
	struct ws_log l;
	uint8_t pay[64];
	size_t frags = 5000;
	memset(pay, '*', sizeof(pay));
	for (size_t i = 0; i < frags; i++)
		put_frame(&b, i + 1 == frags, i == 0 ? TW__WS_BINARY : TW__WS_CONT, pay, 64, KEY);
	/* Default limit 4,096: fragment 4,097 fails on its header. */
	decode_all(TW__WS_SERVER, 0, 0, b.p, b.len, &l);
	ck_assert_int_eq(l.rv, TW_ETOOMANY);
	ck_assert_uint_eq(l.used, 4096 * 70 + 2);
	ck_assert_ptr_nonnull(strstr(l.s, "frags=4096)error(1009,too many fragments)"));
	ws_log_free(&l);
	/* With room for them, the whole message. */
	decode_all(TW__WS_SERVER, 0, frags, b.p, b.len, &l);
	ck_assert_int_eq(l.rv, 0);
	ck_assert_ptr_nonnull(strstr(l.s, "end(len=320000,frags=5000,"));
	ws_log_free(&l);
	/* max_fragments = 1: no fragmentation at all, but whole messages. */
	free(b.p);
	memset(&b, 0, sizeof(b));
	bytes_hex(&b, "82 01 61 82 01 62 02 01 63 00 01 64");
	decode_all(TW__WS_CLIENT, 0, 1, b.p, b.len, &l);
	ck_assert_str_eq(l.s, "data(op=2,fin=1,first=1,len=1,msg=1,frags=1)end(len=1,frags=1,61)"
			      "data(op=2,fin=1,first=1,len=1,msg=1,frags=1)end(len=1,frags=1,62)"
			      "data(op=2,fin=0,first=1,len=1,msg=1,frags=1)"
			      "error(1009,too many fragments)");
	ws_log_free(&l);
	free(b.p);
}
END_TEST

/* Lowering the limit mid-message applies to the running total. */
START_TEST(limit_lowered)
{
	struct tw__ws_dec d;
	struct ws_log l;
	struct bytes b = {0};
	bytes_hex(&b, "02 0a 30 31 32 33 34 35 36 37 38 39 80 00");
	tw__ws_dec_init(&d, TW__WS_CLIENT, 100, 0);
	ws_log_init(&l);
	ck_assert_int_eq(ws_drive(&d, b.p, 12, 0, NULL, &l), 0);
	tw__ws_dec_set_max_message_bytes(&d, 5);
	ck_assert_int_eq(ws_drive(&d, b.p + 12, 2, 0, NULL, &l), TW_ETOOBIG);
	ck_assert_str_eq(l.s, "data(op=2,fin=0,first=1,len=10,msg=10,frags=1)"
			      "error(1009,message too big)");
	ws_log_free(&l);
	/* Raised again before a header: fine. 0 restores the default. */
	tw__ws_dec_init(&d, TW__WS_CLIENT, 100, 0);
	ws_log_init(&l);
	ck_assert_int_eq(ws_drive(&d, b.p, 12, 0, NULL, &l), 0);
	tw__ws_dec_set_max_message_bytes(&d, 0);
	ck_assert_uint_eq(d.max_message_bytes, TW__WS_DEFAULT_MAX_MESSAGE_BYTES);
	ck_assert_int_eq(ws_drive(&d, b.p + 12, 2, 0, NULL, &l), 0);
	ck_assert_ptr_nonnull(strstr(l.s, "end(len=10,frags=2,30313233343536373839)"));
	ws_log_free(&l);
	free(b.p);
}
END_TEST

/* --- Autobahn cases a binary-only receiver passes ----------------------------- */

/* 1.2.x: binary of 0-65,536 bytes, 1.2.8 written in 997-byte chops; 2.x:
 * pings of 0 and 125 bytes, 2.6 octet by octet, unsolicited pongs, ten
 * pings; 5.3-5.5: two fragments; 10.1.1: 65,536 bytes in 1,300-byte
 * fragments. */
START_TEST(autobahn_valid)
{
	static const size_t lens[] = {0, 125, 126, 127, 128, 65535, 65536};
	uint8_t *pay = malloc(65536);
	struct bytes b = {0};
	struct tw__ws_dec d;
	struct ws_log l;
	ck_assert_ptr_nonnull(pay);
	memset(pay, 0xfe, 65536);
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		char want[128];
		b.len = 0;
		put_frame(&b, 1, TW__WS_BINARY, pay, lens[i], KEY);
		decode_all(TW__WS_SERVER, 0, 0, b.p, b.len, &l);
		snprintf(want, sizeof(want), "data(op=2,fin=1,first=1,len=%zu", lens[i]);
		ck_assert_ptr_nonnull(strstr(l.s, want));
		ck_assert_int_eq(l.rv, 0);
		ws_log_free(&l);
	}
	/* 1.2.8: its header bytes (65536 bytes, masked with 37 fa 21 3d), then 997-byte chops. */
	ck_assert_mem_eq(b.p, "\x82\xff\x00\x00\x00\x00\x00\x01\x00\x00\x37\xfa\x21\x3d", 14);
	tw__ws_dec_init(&d, TW__WS_SERVER, 0, 0);
	ws_log_init(&l);
	for (size_t off = 0; off < b.len; off += 997)
		ck_assert_int_eq(
			ws_drive(&d, b.p + off, b.len - off < 997 ? b.len - off : 997, 0, NULL, &l),
			0);
	ck_assert_uint_eq(l.used, b.len);
	ck_assert_uint_eq(l.msg_len, 0);
	ck_assert_ptr_nonnull(strstr(l.s, "end(len=65536,frags=1,#"));
	ws_log_free(&l);
	/* 2.1, 2.2, 2.4, 2.7: pings, a 125-byte ping, an unsolicited pong. */
	expect(TW__WS_SERVER, "89 80 37 fa 21 3d", "ping()", 0);
	expect(TW__WS_SERVER, "89 85 37 fa 21 3d 7f 9f 4d 51 58", "ping(48656c6c6f)", 0);
	expect(TW__WS_SERVER, "8a 80 37 fa 21 3d", "pong()", 0);
	b.len = 0;
	put_frame(&b, 1, TW__WS_PING, pay, 125, KEY);
	decode_all(TW__WS_SERVER, 0, 0, b.p, b.len, &l);
	{
		struct ws_log want;
		ws_log_init(&want);
		ws_logf(&want, "ping(");
		ws_log_bytes(&want, pay, 125);
		ws_logf(&want, ")");
		ck_assert_str_eq(l.s, want.s);
		ws_log_free(&want);
	}
	ws_log_free(&l);
	/* 2.10: ten pings; their events come in order. */
	b.len = 0;
	for (int i = 0; i < 10; i++) {
		uint8_t c = (uint8_t)('0' + i);
		put_frame(&b, 1, TW__WS_PING, &c, 1, KEY);
	}
	decode_all(TW__WS_SERVER, 0, 0, b.p, b.len, &l);
	ck_assert_str_eq(l.s, "ping(30)ping(31)ping(32)ping(33)ping(34)ping(35)ping(36)ping(37)"
			      "ping(38)ping(39)");
	ws_log_free(&l);
	/* 10.1.1 binary: 65,536 bytes in 1,300-byte fragments. */
	b.len = 0;
	for (size_t off = 0; off < 65536; off += 1300) {
		size_t n = 65536 - off < 1300 ? 65536 - off : 1300;
		put_frame(&b, off + n == 65536, off == 0 ? TW__WS_BINARY : TW__WS_CONT, pay + off,
			  n, KEY);
	}
	ck_assert_mem_eq(b.p, "\x02\xfe\x05\x14\x37\xfa\x21\x3d", 8);
	decode_all(TW__WS_SERVER, 0, 0, b.p, b.len, &l);
	ck_assert_int_eq(l.rv, 0);
	ck_assert_ptr_nonnull(strstr(l.s, "data(op=0,fin=1,first=0,len=536,msg=65536,frags=51)"
					  "end(len=65536,frags=51,#"));
	ws_log_free(&l);
	free(b.p);
	free(pay);
}
END_TEST

/* --- misuse is caught without harm -------------------------------------------- */

START_TEST(misuse)
{
	struct tw__ws_dec d;
	struct tw__ws_event ev;
	uint8_t *dst, buf[8] = {0x82, 0x03, 'a', 'b', 'c'};
	tw__ws_dec_init(&d, TW__WS_CLIENT, 0, 0);
	ck_assert_uint_eq(tw__ws_dec_want(&d, &dst), 2);
	/* More than the want, payload_done before a header. */
	ck_assert_int_eq(tw__ws_dec_advance(&d, 3, &ev), TW_EINVAL);
	ck_assert_int_eq(tw__ws_dec_payload_done(&d, buf, 0, &ev), TW_EINVAL);
	ck_assert_int_eq(tw__ws_dec_phase(&d), TW__WS_DEC_BYTES);
	memcpy(dst, buf, 2);
	ck_assert_int_eq(tw__ws_dec_advance(&d, 2, &ev), 1);
	ck_assert_int_eq(ev.type, TW__WS_EV_DATA);
	/* In the payload phase: advance takes nothing, payload_done no more
	 * than the room; neither is sticky. */
	ck_assert_uint_eq(tw__ws_dec_want(&d, &dst), 0);
	ck_assert_int_eq(tw__ws_dec_advance(&d, 1, &ev), TW_EINVAL);
	ck_assert_int_eq(tw__ws_dec_payload_done(&d, buf + 2, 4, &ev), TW_EINVAL);
	ck_assert_uint_eq(tw__ws_dec_payload_room(&d), 3);
	ck_assert_int_eq(tw__ws_dec_payload_done(&d, buf + 2, 3, &ev), 1);
	ck_assert_int_eq(ev.type, TW__WS_EV_MESSAGE_END);
	ck_assert_mem_eq(buf + 2, "abc", 3);
	/* init resets everything. */
	tw__ws_dec_init(&d, TW__WS_SERVER, 7, 9);
	ck_assert_uint_eq(d.max_message_bytes, 7);
	ck_assert_uint_eq(d.max_fragments, 9);
	ck_assert_uint_eq(tw__ws_dec_frame_offset(&d), 0);
	ck_assert_ptr_null(tw__ws_dec_error(&d));
}
END_TEST

/* Payload delivered in pieces of every size: the mask continues across
 * each split (the offset into the key is kept). */
START_TEST(mask_across_splits)
{
	uint8_t pay[50], frame[64], key[4] = {0x01, 0x80, 0xff, 0x5a};
	for (size_t i = 0; i < sizeof(pay); i++)
		pay[i] = (uint8_t)(i * 7);
	ck_assert_int_eq(tw__ws_encode_header(frame, 1, TW__WS_BINARY, 50, key), 6);
	tw__ws_mask_copy(frame + 6, pay, 50, key, 0);
	for (size_t first = 0; first <= 50; first++) {
		for (size_t second = 0; first + second <= 50; second += 3) {
			struct tw__ws_dec d;
			struct tw__ws_event ev;
			uint8_t *dst, out[50];
			size_t k = 0;
			tw__ws_dec_init(&d, TW__WS_SERVER, 0, 0);
			while (tw__ws_dec_phase(&d) == TW__WS_DEC_BYTES) {
				size_t w = tw__ws_dec_want(&d, &dst);
				memcpy(dst, frame + k, w);
				k += w;
				REQUIRE(tw__ws_dec_advance(&d, w, &ev) >= 0);
			}
			size_t piece[3] = {first, second, 50 - first - second}, at = 0;
			memcpy(out, frame + 6, 50);
			for (int i = 0; i < 3; i++) {
				if (piece[i] == 0)
					continue;
				at += piece[i];
				REQUIRE(tw__ws_dec_payload_done(&d, out + at - piece[i], piece[i],
								&ev) == (at == 50));
			}
			REQUIRE(ev.type == TW__WS_EV_MESSAGE_END);
			REQUIRE(memcmp(out, pay, 50) == 0);
		}
	}
}
END_TEST

/* --- encoder, masking, keys, UTF-8 ---------------------------------------------- */

START_TEST(encoder)
{
	uint8_t out[TW__WS_MAX_CONTROL_FRAME], src[125], copy[125];
	struct ws_log l;
	struct bytes b = {0};
	/* Refused: unknown opcodes, fragmented or long control frames,
	 * lengths of 2^63 and up. */
	for (unsigned op = 0; op < 16; op++) {
		int known = op <= 2 || (op >= 8 && op <= 10);
		ck_assert_int_eq(tw__ws_encode_header(out, 1, op, 0, NULL) > 0, known);
	}
	ck_assert_int_eq(tw__ws_encode_header(out, 0, TW__WS_PING, 0, NULL), TW_EINVAL);
	ck_assert_int_eq(tw__ws_encode_header(out, 1, TW__WS_CLOSE, 126, NULL), TW_EINVAL);
	ck_assert_int_eq(tw__ws_encode_header(out, 1, TW__WS_BINARY, UINT64_C(1) << 63, NULL),
			 TW_EINVAL);
	ck_assert_int_eq(tw__ws_encode_header(out, 0, TW__WS_CONT, 3, KEY), 6);
	ck_assert_mem_eq(out, "\x00\x83\x37\xfa\x21\x3d", 6);
	ck_assert_int_eq(tw__ws_encode_header(out, 1, TW__WS_BINARY, 70000, KEY), 14);
	ck_assert_mem_eq(out, "\x82\xff\x00\x00\x00\x00\x00\x01\x11\x70\x37\xfa\x21\x3d", 14);
	/* Control frames: the payload is only read. */
	for (size_t i = 0; i < sizeof(src); i++)
		src[i] = (uint8_t)i;
	memcpy(copy, src, sizeof(src));
	ck_assert_int_eq(tw__ws_encode_control(out, TW__WS_PING, src, 125, KEY), 131);
	ck_assert_mem_eq(src, copy, sizeof(src));
	ck_assert_int_eq(tw__ws_encode_control(out, TW__WS_PING, src, 126, KEY), TW_EINVAL);
	ck_assert_int_eq(tw__ws_encode_control(out, TW__WS_BINARY, src, 1, KEY), TW_EINVAL);
	/* The pong for the ping of 2.2, masked by a client and decoded by a
	 * server; unmasked the other way. */
	ck_assert_int_eq(tw__ws_encode_pong(out, (const uint8_t *)"Hello", 5, KEY), 11);
	ck_assert_mem_eq(out, "\x8a\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x58", 11);
	ck_assert_int_eq(tw__ws_encode_pong(out, NULL, 0, NULL), 2);
	ck_assert_mem_eq(out, "\x8a\x00", 2);
	/* Close frames: code and reason; 1005 is an empty body; a reason
	 * that is not UTF-8 or too long, or an unsendable code, is refused. */
	ck_assert_int_eq(tw__ws_encode_close(out, 1000, NULL, 0, NULL), 4);
	ck_assert_mem_eq(out, "\x88\x02\x03\xe8", 4);
	ck_assert_int_eq(tw__ws_encode_close(out, 1000, NULL, 0, KEY), 8);
	ck_assert_mem_eq(out, "\x88\x82\x37\xfa\x21\x3d\x34\x12", 8);
	ck_assert_int_eq(tw__ws_encode_close(out, 1005, NULL, 0, NULL), 2);
	ck_assert_mem_eq(out, "\x88\x00", 2);
	ck_assert_int_eq(tw__ws_encode_close(out, 1005, "x", 1, NULL), TW_EINVAL);
	ck_assert_int_eq(tw__ws_encode_close(out, 1006, NULL, 0, NULL), TW_EINVAL);
	ck_assert_int_eq(tw__ws_encode_close(out, 1015, NULL, 0, NULL), TW_EINVAL);
	ck_assert_int_eq(tw__ws_encode_close(out, 1002, "\xff", 1, NULL), TW_EINVAL);
	ck_assert_int_eq(tw__ws_encode_close(out, 1009, "message too big", 15, NULL), 19);
	ck_assert_mem_eq(out, "\x88\x11\x03\xf1message too big", 19);
	/* What the encoder makes, the decoder takes. */
	memcpy(bytes_room(&b, 19), out, 19);
	b.len = 19;
	decode_all(TW__WS_CLIENT, 0, 0, b.p, b.len, &l);
	ck_assert_str_eq(l.s, "close(1009,6d65737361676520746f6f20626967)");
	ws_log_free(&l);
	free(b.p);
}
END_TEST

START_TEST(masking)
{
	uint8_t src[300], dst[300], in_place[300], key[4] = {0xde, 0xad, 0xbe, 0xef};
	uint64_t seed = 42;
	for (size_t i = 0; i < sizeof(src); i++)
		src[i] = (uint8_t)rnd_next(&seed);
	for (uint64_t off = 0; off < 9; off++) {
		for (size_t start = 0; start < 9; start++) {
			for (size_t n = 0; n + start <= 280; n += n < 40 ? 1 : 37) {
				uint8_t keep[300];
				memcpy(keep, src, sizeof(src));
				memset(dst, 0, sizeof(dst));
				tw__ws_mask_copy(dst + start, src + start, n, key, off);
				REQUIRE(memcmp(src, keep, sizeof(src)) == 0);
				for (size_t i = 0; i < n; i++)
					REQUIRE(dst[start + i] ==
						(src[start + i] ^ key[(off + i) % 4]));
				memcpy(in_place, src, sizeof(src));
				tw__ws_mask(in_place + start, n, key, off);
				REQUIRE(memcmp(in_place + start, dst + start, n) == 0);
				/* Twice is the identity. */
				tw__ws_mask(in_place + start, n, key, off);
				REQUIRE(memcmp(in_place, src, sizeof(src)) == 0);
			}
		}
	}
	/* In pieces with running offsets, as a client masks a frame it sends
	 * from several application buffers. */
	tw__ws_mask_copy(dst, src, 300, key, 0);
	for (size_t cut = 0; cut <= 300; cut += 13) {
		uint8_t piece[300];
		tw__ws_mask_copy(piece, src, cut, key, 0);
		tw__ws_mask_copy(piece + cut, src + cut, 300 - cut, key, cut);
		REQUIRE(memcmp(piece, dst, 300) == 0);
	}
	/* A huge running offset only matters modulo 4. */
	tw__ws_mask_copy(in_place, src, 10, key, (UINT64_C(1) << 40) + 2);
	tw__ws_mask_copy(dst, src, 10, key, 2);
	ck_assert_mem_eq(in_place, dst, 10);
}
END_TEST

/* RFC 6455 section 5.3: keys come from the CSPRNG: 10,000 of them, barely any repeated
 * (a repeat among 10,000 random 32-bit keys has odds of about 1 in 86). */
static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

START_TEST(mask_keys)
{
	enum { N = 10000 };
	uint32_t *keys = malloc(N * sizeof(uint32_t));
	int repeats = 0, zeros = 0;
	ck_assert_ptr_nonnull(keys);
	for (int i = 0; i < N; i++) {
		uint8_t k[4];
		ck_assert_int_eq(tw__ws_mask_key(k), 0);
		memcpy(&keys[i], k, 4);
		zeros += keys[i] == 0;
	}
	qsort(keys, N, sizeof(uint32_t), cmp_u32);
	for (int i = 1; i < N; i++)
		repeats += keys[i] == keys[i - 1];
	ck_assert_int_le(repeats, 2);
	ck_assert_int_le(zeros, 1);
	free(keys);
}
END_TEST

START_TEST(utf8)
{
	static const struct {
		const char *s;
		size_t n;
		int ok;
	} cases[] = {
		{"", 0, 1},
		{"hello", 5, 1},
		{"\x00", 1, 1},
		{"\xc2\x80", 2, 1},
		{"\xdf\xbf", 2, 1},
		{"\xe0\xa0\x80", 3, 1},
		{"\xed\x9f\xbf", 3, 1},                 /* U+D7FF */
		{"\xee\x80\x80", 3, 1},                 /* U+E000 */
		{"\xef\xbf\xbf", 3, 1},                 /* U+FFFF */
		{"\xf0\x90\x80\x80", 4, 1},             /* U+10000 */
		{"\xf4\x8f\xbf\xbf", 4, 1},             /* U+10FFFF */
		{"\xce\xba\xe1\xbd\xb9\xcf\x83", 7, 1}, /* "kosme", Autobahn 6.2 */
		{"\x80", 1, 0},
		{"\xbf", 1, 0},
		{"\xc0\x80", 2, 0},         /* overlong NUL */
		{"\xc1\xbf", 2, 0},         /* overlong */
		{"\xe0\x9f\xbf", 3, 0},     /* overlong */
		{"\xed\xa0\x80", 3, 0},     /* U+D800 */
		{"\xed\xbf\xbf", 3, 0},     /* U+DFFF */
		{"\xf0\x8f\xbf\xbf", 4, 0}, /* overlong */
		{"\xf4\x90\x80\x80", 4, 0}, /* U+110000, Autobahn 6.4.1 */
		{"\xf5\x80\x80\x80", 4, 0},
		{"\xf8\x88\x80\x80\x80", 5, 0}, /* 5-byte form */
		{"\xfe", 1, 0},
		{"\xff", 1, 0},
		{"\xc2", 1, 0}, /* truncated */
		{"\xe2\x82", 2, 0},
		{"\xf0\x9f\x98", 3, 0},
		{"\xe2\x28\xa1", 3, 0}, /* bad continuation */
		{"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80\x65\x64\x69\x74\x65\x64",
		 20, 0}, /* Autobahn 6.3.1's text, unmasked */
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		ck_assert_msg(tw__ws_utf8_valid((const uint8_t *)cases[i].s, cases[i].n) ==
				      cases[i].ok,
			      "case %zu", i);
}
END_TEST

/* --- ping rate (docs/design.md, WebSocket) -------------------------------- */

/* Feed pings at the given times (ms); returns the index of the first one
 * refused, or -1 when all are answered. */
static int ping_times(uint32_t min_ms, uint32_t strikes, const uint64_t *t, size_t n)
{
	struct tw__ws_ping_rate r;
	tw__ws_ping_rate_init(&r, min_ms, strikes);
	for (size_t i = 0; i < n; i++) {
		int rv = tw__ws_ping_rate_check(&r, t[i]);
		if (rv != 0) {
			ck_assert_int_eq(rv, TW_EPROTO);
			return (int)i;
		}
	}
	return -1;
}

/* The first ping is never early; with 2 strikes the third early ping in a
 * row (the fourth ping) is refused; a ping exactly min_ms after the one
 * before is on time; a ping on time clears the strikes, so bursts of
 * strikes + 1 pings per interval go on for ever; 0 in either setting
 * turns the policy off; a clock that goes back counts as early. */
START_TEST(ping_rate)
{
	static const uint64_t every_10ms[] = {0, 10, 20, 30, 40, 50};
	static const uint64_t bh22[] = {0, 1000, 2000, 3000, 4000}; /* 1 s pings, 5 s policy */
	static const uint64_t spaced[] = {0, 1000, 2000, 3000, 4000, 5000};
	static const uint64_t bursts[] = {0, 1, 2, 1002, 1003, 1004, 2004, 2005, 2006};
	static const uint64_t burst4[] = {0, 1, 2, 1002, 1003, 1004, 1005};
	static const uint64_t back[] = {5000, 4000, 3000, 2000};
	static uint64_t flood[10000];
	for (size_t i = 0; i < 10000; i++)
		flood[i] = i / 10; /* 10,000 pings a second */
	ck_assert_int_eq(ping_times(1000, 2, every_10ms, 6), 3);
	ck_assert_int_eq(ping_times(5000, 2, bh22, 5), 3);
	ck_assert_int_eq(ping_times(1000, 2, spaced, 6), -1);
	ck_assert_int_eq(ping_times(1001, 2, spaced, 6), 3);
	ck_assert_int_eq(ping_times(1000, 2, bursts, 9), -1);
	ck_assert_int_eq(ping_times(1000, 2, burst4, 7), 6);
	ck_assert_int_eq(ping_times(1000, 1, every_10ms, 6), 2);
	ck_assert_int_eq(ping_times(1000, 2, back, 4), 3);
	ck_assert_int_eq(ping_times(1000, 2, flood, 10000), 3);
	ck_assert_int_eq(ping_times(0, 2, flood, 10000), -1);
	ck_assert_int_eq(ping_times(1000, 0, flood, 10000), -1);
	ck_assert_int_eq(ping_times(UINT32_MAX, 2, spaced, 6), 3);
}
END_TEST

int main(void)
{
	TCase *frames = ts_tcase("frames", 0, NULL), *bad = ts_tcase("rejects", 0, NULL);
	ts_add_loop(frames, 2 * N_SIZES, TS_TESTS(length_forms));
	ts_add(frames, TS_TESTS(length_headers, non_minimal, ping_between_fragments));
	ts_add_loop(frames, 4, TS_TESTS(random_streams));
	ts_add(frames, TS_TESTS(autobahn_valid, misuse, mask_across_splits));
	ts_add_loop(bad, N_BAD, TS_TESTS(rejects));
	ts_add(bad, TS_TESTS(opcodes_and_close_codes, close_frames));
	return ts_main(
		"ws_codec", 0,
		TS_CASES(ts_tcase("rfc", 0, TS_TESTS(rfc_examples, rfc_examples_long)), frames, bad,
			 ts_tcase("limits", 0,
				  TS_TESTS(limit_declared, limit_fragments_sum,
					   limit_fragment_count, limit_lowered, ping_rate)),
			 ts_tcase("encoder", 0, TS_TESTS(encoder, masking, mask_keys, utf8))));
}
