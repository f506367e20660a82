/* SPDX-License-Identifier: BSD-3-Clause */
/* WebSocket frames (RFC 6455 section 5), sans-I/O, for ws:// and wss://
 * (docs/design.md, WebSocket).
 *
 *   byte 0   FIN | RSV1 RSV2 RSV3 | opcode (4 bits)
 *   byte 1   MASK | payload length (7 bits: 0-125, 126 = 16-bit, 127 = 64-bit)
 *   then     16- or 64-bit length (network order), 4-byte masking key if MASK
 *   then     payload (XORed with the key, byte i with key[i % 4], if MASK)
 *
 * Decoder. Bytes come in through two doors, and the decoder says which one
 * is open (tw__ws_dec_phase):
 *   - TW__WS_DEC_BYTES: frame headers and control payloads (at most 125
 *     bytes) land in the decoder's own memory: tw__ws_dec_want gives the
 *     place and the exact count still needed there, tw__ws_dec_advance
 *     reports what was written. Never more than the current header or
 *     control frame asks for, so no payload byte is ever taken this way.
 *   - TW__WS_DEC_PAYLOAD: data payload lands in the caller's memory, read
 *     straight into its final place (a message block): the caller asks
 *     tw__ws_dec_payload_room how many bytes of the frame remain, reads up
 *     to that many wherever it wants, and hands them to
 *     tw__ws_dec_payload_done, which unmasks them in place. No copy.
 * Each advance / payload_done returns at most one event (struct
 * tw__ws_event). Every rule is checked on the frame header, before the
 * payload is accepted and before the caller sizes anything from it.
 *
 * A glue read loop:
 *
 *   for (;;) {
 *           struct tw__ws_event ev;
 *           int rv;
 *           if (tw__ws_dec_phase(d) == TW__WS_DEC_BYTES) {
 *                   uint8_t *dst;
 *                   size_t len = tw__ws_dec_want(d, &dst), n;
 *                   if ((n = read_up_to(dst, len)) == 0)
 *                           break;
 *                   rv = tw__ws_dec_advance(d, n, &ev);
 *           } else if (tw__ws_dec_phase(d) == TW__WS_DEC_PAYLOAD) {
 *                   uint64_t room = tw__ws_dec_payload_room(d);
 *                   uint8_t *dst = place_of_next_payload_bytes();
 *                   size_t n = read_up_to(dst, room);
 *                   if (n == 0 && room > 0)
 *                           break;
 *                   rv = tw__ws_dec_payload_done(d, dst, n, &ev);
 *           } else {
 *                   break;   (closed or failed)
 *           }
 *           if (rv < 0)
 *                   send close tw__ws_dec_close_code(d), log tw__ws_dec_error(d);
 *           else if (rv == 1)
 *                   handle ev;
 *   }
 *
 * Policy (taskwire is binary-only, no extensions: docs/design.md,
 * WebSocket):
 *   - RSV1-3 set: 1002 (no extension is ever negotiated).
 *   - opcodes 3-7 and 11-15: 1002.
 *   - control frame (close, ping, pong) with FIN = 0 or a payload over 125
 *     bytes: 1002.
 *   - 64-bit length with its top bit set: 1002. Non-minimal length
 *     encodings (126 announcing 5 bytes, say) are accepted on every frame:
 *     the RFC asks senders, not receivers, for the minimal form; the
 *     decoded length is what every check uses.
 *   - a server decoder requires MASK = 1, a client decoder MASK = 0, on
 *     every frame: else 1002 (RFC 6455 section 5.1).
 *   - continuation with no message open, or a new text/binary frame while
 *     a fragmented message is open: 1002 (section 5.4).
 *   - text messages: 1003 (unsupported data, section 7.4.1). The taskwire
 *     mapping carries binary messages only, so a text frame is refused on
 *     its header, and text payload is never validated as UTF-8.
 *   - a data message whose declared lengths add up past max_message_bytes:
 *     1009, on the header that crosses the limit, before its payload.
 *   - a data message of more than max_fragments frames: 1009 (too big:
 *     fragments are a size dimension, and 1009 tells a sender to send
 *     smaller messages; not 1008, which says nothing about size).
 *   - close body: empty = no code (reported as 1005, TW__WS_CLOSE_NO_STATUS);
 *     1 byte: 1002; codes 0-999, 1004, 1005, 1006, 1015, 1016-2999 and
 *     5000-65535: 1002 (see tw__ws_close_code_valid); a reason that is not
 *     UTF-8: 1007.
 * A failure is sticky: the decoder keeps its error, code and reason; after
 * it only tw__ws_dec_init (to reuse the memory) makes sense. A close frame
 * ends decoding: the phase becomes TW__WS_DEC_CLOSED and later bytes are
 * the glue's to discard (RFC 6455 section 5.5.1: nothing after a close is
 * processed).
 *
 * The decoder holds no heap memory (no _fini). One decoder belongs to one
 * connection and is used from one thread at a time (the comm's loop
 * thread); the encoder functions are pure and callable from any thread. */
#ifndef TW_TRANSPORT_WS_CODEC_H
#define TW_TRANSPORT_WS_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "core/limits.h"
#include "core/utf8.h"

/* Opcodes (RFC 6455 section 5.2). */
#define TW__WS_CONT   0x0
#define TW__WS_TEXT   0x1
#define TW__WS_BINARY 0x2
#define TW__WS_CLOSE  0x8
#define TW__WS_PING   0x9
#define TW__WS_PONG   0xa

/* Close codes taskwire sends or reports (RFC 6455 section 7.4.1). */
#define TW__WS_CLOSE_NORMAL      1000
#define TW__WS_CLOSE_GOING_AWAY  1001
#define TW__WS_CLOSE_PROTOCOL    1002
#define TW__WS_CLOSE_UNSUPPORTED 1003
#define TW__WS_CLOSE_NO_STATUS   1005 /* reported for an empty close body; never sent */
#define TW__WS_CLOSE_ABNORMAL    1006 /* the glue's word for "TCP closed"; never sent */
#define TW__WS_CLOSE_INVALID     1007
#define TW__WS_CLOSE_POLICY      1008
#define TW__WS_CLOSE_TOO_BIG     1009
#define TW__WS_CLOSE_INTERNAL    1011

/* Longest frame header: 2 + 8 (64-bit length) + 4 (masking key). */
#define TW__WS_MAX_HEADER 14
/* Longest control payload, and longest close reason (section 5.5). */
#define TW__WS_MAX_CONTROL 125
#define TW__WS_MAX_REASON  123
/* Longest control frame: 2-byte header, masking key, 125 bytes. */
#define TW__WS_MAX_CONTROL_FRAME (2 + 4 + TW__WS_MAX_CONTROL)

/* Default limits (core/limits.h): a whole message, and the frames of one
 * message (8 MiB fragments of a 4 GiB message are 512). */
#define TW__WS_DEFAULT_MAX_MESSAGE_BYTES TW_DEFAULT_MAX_MESSAGE_BYTES
#define TW__WS_DEFAULT_MAX_FRAGMENTS     TW_DEFAULT_WS_MAX_FRAGMENTS

/* Which end decodes: a server reads masked client frames, a client reads
 * unmasked server frames. */
enum tw__ws_role { TW__WS_SERVER = 0, TW__WS_CLIENT = 1 };

/* Which door of the decoder is open. */
enum tw__ws_dec_phase {
	TW__WS_DEC_BYTES,   /* header or control payload: want / advance */
	TW__WS_DEC_PAYLOAD, /* data payload: payload_room / payload_done */
	TW__WS_DEC_CLOSED,  /* a close frame was delivered; nothing more is read */
	TW__WS_DEC_FAILED,  /* sticky error: tw__ws_dec_close_code / _error */
};

enum tw__ws_event_type {
	TW__WS_EV_NONE = 0,
	/* A data frame header. opcode: TW__WS_BINARY on the first frame of a
	 * message, TW__WS_CONT on the others; fin: last frame of the message;
	 * first: first frame of the message; length: this frame's payload
	 * bytes (all of which now come through the payload door, possibly 0);
	 * message_bytes: payload bytes of the message up to and including
	 * this frame (declared, <= max_message_bytes); fragments: frames of
	 * the message so far, this one included. */
	TW__WS_EV_DATA,
	/* The last payload byte of a FIN data frame was delivered (for an
	 * empty FIN frame: on the payload_done call with n = 0). length and
	 * message_bytes: the whole message's payload bytes; fragments: its
	 * frame count. */
	TW__WS_EV_MESSAGE_END,
	/* A ping; payload / payload_len: its unmasked body (0-125 bytes),
	 * answer with tw__ws_encode_pong (section 5.5.2). */
	TW__WS_EV_PING,
	/* A pong (solicited or not: section 5.5.3 lets either come; ignore
	 * what you did not ask for). payload / payload_len: its body. */
	TW__WS_EV_PONG,
	/* A valid close (section 5.5.1). code: the peer's code, or
	 * TW__WS_CLOSE_NO_STATUS (1005) for an empty body; payload /
	 * payload_len: the reason (valid UTF-8, not NUL-terminated, 0-123
	 * bytes). Echo it (tw__ws_encode_close with the same code, or an empty
	 * body for 1005) and close TCP; a partial message is abandoned. The
	 * decoder is now TW__WS_DEC_CLOSED. */
	TW__WS_EV_CLOSE,
};

/* One event. payload points into the decoder and stays valid until the
 * next call on it (tw__ws_dec_advance, _payload_done or _init). */
struct tw__ws_event {
	enum tw__ws_event_type type;
	unsigned opcode;        /* DATA */
	int fin, first;         /* DATA */
	uint64_t length;        /* DATA, MESSAGE_END */
	uint64_t message_bytes; /* DATA, MESSAGE_END */
	uint64_t fragments;     /* DATA, MESSAGE_END */
	const uint8_t *payload; /* PING, PONG, CLOSE (reason) */
	size_t payload_len;
	unsigned code; /* CLOSE */
};

/* The decoder. Embedded by the comm; fields are private (use the
 * functions below), shown only so the struct can be embedded. */
struct tw__ws_dec {
	enum tw__ws_role role;
	uint64_t max_message_bytes, max_fragments;
	int state;           /* internal state (ST_* in ws_codec.c) */
	int err;             /* sticky TW_E* once failed */
	unsigned close_code; /* to send once failed */
	const char *why;     /* static text once failed */
	uint8_t head[TW__WS_MAX_HEADER];
	size_t head_have; /* header bytes received */
	size_t ext;       /* extended length bytes: 0, 2 or 8 */
	size_t head_len;  /* 2 + ext + 4 * masked */
	unsigned opcode;  /* of the current frame */
	int fin, masked;  /* of the current frame */
	uint8_t key[4];   /* of the current frame */
	uint64_t len;     /* payload bytes of the current frame */
	uint64_t done;    /* of them, delivered */
	uint8_t ctrl[TW__WS_MAX_CONTROL];
	int in_message;        /* a data message has started and not ended */
	uint64_t msg_bytes;    /* its payload bytes, declared so far */
	uint64_t msg_frames;   /* its frames so far */
	uint64_t offset;       /* bytes consumed since init */
	uint64_t frame_offset; /* where the current frame started */
};

/* tw__ws_dec_init: set up (or reset) a decoder.
 *   role: TW__WS_SERVER (expects masked frames from a client) or
 *         TW__WS_CLIENT (expects unmasked frames from a server).
 *   max_message_bytes: limit on one message's payload bytes (sum over its
 *         fragments), checked on each data header; 0 means
 *         TW__WS_DEFAULT_MAX_MESSAGE_BYTES (4 GiB).
 *   max_fragments: limit on the frames of one message (>= 1); 0 means
 *         TW__WS_DEFAULT_MAX_FRAGMENTS (4,096).
 * Holds no resources; calling it again discards all state. Never fails. */
void tw__ws_dec_init(struct tw__ws_dec *d, enum tw__ws_role role, uint64_t max_message_bytes,
		     uint64_t max_fragments);

/* tw__ws_dec_set_max_message_bytes: change the message limit (0: the
 * default). It applies from the next data frame header on, to the running
 * total of the message open then (so a glue can shrink it to what the
 * taskwire message still may take). */
void tw__ws_dec_set_max_message_bytes(struct tw__ws_dec *d, uint64_t max_message_bytes);

/* tw__ws_dec_phase: which door is open (enum tw__ws_dec_phase). */
enum tw__ws_dec_phase tw__ws_dec_phase(const struct tw__ws_dec *d);

/* tw__ws_dec_want: in phase TW__WS_DEC_BYTES, set *dst to where the next
 * header or control-payload bytes go (inside the decoder) and return how
 * many are needed there (>= 1). Reading fewer is fine; reading more is not
 * (the extra bytes would belong to the next field or the payload). Header
 * bytes are asked for in steps (2 bytes, then the extended length, then
 * the masking key), so a length is checked as soon as it is complete. In
 * any other phase: *dst = NULL, returns 0. */
size_t tw__ws_dec_want(struct tw__ws_dec *d, uint8_t **dst);

/* tw__ws_dec_advance: n bytes (0 <= n <= the last want) were written at
 * the place tw__ws_dec_want gave. Fills *ev and returns 1 when they
 * complete something with an event (DATA, PING, PONG, CLOSE), returns 0
 * when more is needed (ev->type = TW__WS_EV_NONE), or a negative code:
 *   TW_EPROTO    1002 (framing rule broken) or 1007 (close reason not
 *                UTF-8): see tw__ws_dec_close_code;
 *   TW_ENOTSUP   1003, a text message;
 *   TW_ETOOBIG   1009, message over max_message_bytes;
 *   TW_ETOOMANY  1009, message over max_fragments;
 *   TW_EINVAL    n larger than the want (programmer error; not sticky).
 * Errors other than TW_EINVAL are sticky: every later call returns them.
 * In phase PAYLOAD it takes nothing (n = 0 returns 0, more is TW_EINVAL);
 * in CLOSED it returns 0; in FAILED the sticky error. */
int tw__ws_dec_advance(struct tw__ws_dec *d, size_t n, struct tw__ws_event *ev);

/* tw__ws_dec_payload_room: in phase TW__WS_DEC_PAYLOAD, the payload bytes
 * of the current data frame not yet delivered (0 for an empty frame, which
 * still takes one tw__ws_dec_payload_done call with n = 0). In any other
 * phase 0. */
uint64_t tw__ws_dec_payload_room(const struct tw__ws_dec *d);

/* tw__ws_dec_payload_done: the caller read the next n payload bytes of the
 * current data frame into buf (its own memory; n <= payload_room; buf may
 * be NULL when n is 0). Unmasks buf[0..n) in place when the frame is
 * masked, continuing the key where the previous call stopped, so the
 * caller may deliver a frame in any pieces. Returns 1 with a MESSAGE_END
 * event when the last byte of a FIN frame arrived; 0 otherwise (when the
 * last byte of a non-FIN frame arrived, the phase is BYTES again for the
 * next header). Errors: TW_EINVAL (not in the payload phase, or n above
 * the room: programmer errors, not sticky; buf is untouched), or the
 * sticky error in phase FAILED. */
int tw__ws_dec_payload_done(struct tw__ws_dec *d, uint8_t *buf, size_t n, struct tw__ws_event *ev);

/* tw__ws_dec_close_code: once failed, the close code to send (1002, 1003,
 * 1007 or 1009); 0 before. */
unsigned tw__ws_dec_close_code(const struct tw__ws_dec *d);

/* tw__ws_dec_error: once failed, a short static ASCII text naming the rule
 * ("reserved opcode", "unmasked client frame", ...), fit for a log line
 * and as the close reason (<= 123 bytes); NULL before. */
const char *tw__ws_dec_error(const struct tw__ws_dec *d);

/* tw__ws_dec_idle: 1 between messages: no byte of a next frame has
 * arrived and no data message is open (fragments of it may follow). */
int tw__ws_dec_idle(const struct tw__ws_dec *d);

/* tw__ws_dec_frame_offset: byte offset, counted from init, of the first
 * byte of the current frame (the failing one, once failed). */
uint64_t tw__ws_dec_frame_offset(const struct tw__ws_dec *d);

/* tw__ws_dec_frame_have: bytes of the current frame received so far,
 * its header included; 0 between frames. */
uint64_t tw__ws_dec_frame_have(const struct tw__ws_dec *d);

/* Ping rate: how often a peer may ping (include/taskwire/context.h,
 * tw_context_set_ws_min_ping_interval_ms). RFC 6455 lets a peer ping at
 * any time and asks for a pong to each (sections 5.5.2, 5.5.3); this keeps
 * a peer from making us write pongs without pause. A ping less than
 * min_interval_ms after the peer's previous ping is early; one early ping
 * more than `strikes` in a row is refused (close 1008, section 7.4.1). A
 * ping on time clears the strikes, which bounds the sustained rate at
 * strikes + 1 pings per interval; the model is gRPC's ping strikes
 * (proposal A8). Sans-I/O: the caller reads the clock. Fields are private. */
struct tw__ws_ping_rate {
	uint32_t min_interval_ms; /* 0: no limit */
	uint32_t strikes;         /* 0: no limit */
	uint32_t early;           /* early pings in a row so far */
	uint64_t last_ms;         /* when the previous ping came */
	int seen;                 /* a ping came before */
};

/* tw__ws_ping_rate_init: a policy of min_interval_ms and strikes; either 0
 * turns it off. Holds no resources. */
void tw__ws_ping_rate_init(struct tw__ws_ping_rate *r, uint32_t min_interval_ms, uint32_t strikes);

/* tw__ws_ping_rate_check: a ping came at now_ms (any clock that never goes
 * back, in milliseconds). Returns 0 to answer it, or TW_EPROTO when it is
 * the early ping that ends the connection (send close 1008). */
int tw__ws_ping_rate_check(struct tw__ws_ping_rate *r, uint64_t now_ms);

/* tw__ws_header_size: bytes of the header tw__ws_encode_header writes for
 * a payload of len bytes, masked (1) or not (0): 2, 4 or 10, plus 4 when
 * masked. */
size_t tw__ws_header_size(uint64_t len, int masked);

/* tw__ws_encode_header: write a frame header into out (room for
 * TW__WS_MAX_HEADER bytes), using the minimal length form.
 *   fin: 1 for the last (or only) frame of a message;
 *   opcode: one of TW__WS_CONT, _TEXT, _BINARY, _CLOSE, _PING, _PONG;
 *   len: payload bytes that will follow;
 *   key: 4-byte masking key (client frames, from tw__ws_mask_key, fresh
 *        for every frame), or NULL for an unmasked (server) frame. The
 *        payload must then be masked with the same key from offset 0
 *        (tw__ws_mask_copy).
 * RSV bits are always 0. Returns the header length (2..14), or TW_EINVAL
 * for an unknown opcode, a control frame with fin = 0 or len > 125, or
 * len >= 2^63. RFC 6455 section 5.2. */
int tw__ws_encode_header(uint8_t *out, int fin, unsigned opcode, uint64_t len, const uint8_t *key);

/* tw__ws_mask_copy: dst[i] = src[i] ^ key[(offset + i) % 4] for i < n.
 * src is only read, so a client masks the application's frame memory into
 * a send buffer without touching it; dst == src masks in place; any other
 * overlap is not allowed. offset: payload bytes of the frame before src
 * (so a frame can be masked in pieces). Unmasking is the same operation.
 * RFC 6455 section 5.3. */
void tw__ws_mask_copy(uint8_t *dst, const uint8_t *src, size_t n, const uint8_t key[4],
		      uint64_t offset);

/* tw__ws_mask: tw__ws_mask_copy(buf, buf, n, key, offset): masks (or
 * unmasks) in place. */
void tw__ws_mask(uint8_t *buf, size_t n, const uint8_t key[4], uint64_t offset);

/* tw__ws_mask_key: fill key with 4 bytes from OpenSSL's CSPRNG
 * (RAND_bytes): a client takes a fresh key for every frame it sends
 * (RFC 6455 section 5.3 and 10.3: never a fixed or reused key, never
 * rand()). Any thread. Returns 0, or TW_EIO when RAND_bytes fails (the
 * reason is on OpenSSL's error queue); key is then zeroed and must not be
 * used. */
int tw__ws_mask_key(uint8_t key[4]);

/* tw__ws_encode_control: a whole control frame (header, then payload,
 * masked with key when key is not NULL) into out, which has room for
 * TW__WS_MAX_CONTROL_FRAME bytes. opcode: TW__WS_PING, _PONG or _CLOSE
 * (for close prefer tw__ws_encode_close, which checks the body); payload:
 * len <= 125 bytes, only read (may be NULL when len is 0). Returns the
 * frame length, or TW_EINVAL (not a control opcode, len > 125). */
int tw__ws_encode_control(uint8_t *out, unsigned opcode, const uint8_t *payload, size_t len,
			  const uint8_t *key);

/* tw__ws_encode_pong: the pong answering a ping whose body is payload/len
 * (the event's payload and payload_len): same body, section 5.5.3. Same
 * out, key and returns as tw__ws_encode_control. */
int tw__ws_encode_pong(uint8_t *out, const uint8_t *payload, size_t len, const uint8_t *key);

/* tw__ws_encode_close: a whole close frame into out (room for
 * TW__WS_MAX_CONTROL_FRAME bytes). code: a code valid on the wire
 * (tw__ws_close_code_valid), written big-endian before the reason; or
 * TW__WS_CLOSE_NO_STATUS (1005) for an empty body (to echo a close that
 * had none), reason_len must then be 0. reason: reason_len <= 123 bytes of
 * UTF-8 (may be NULL when reason_len is 0), only read. key: as for
 * tw__ws_encode_header. Returns the frame length, or TW_EINVAL (code not
 * sendable, reason too long or not UTF-8). RFC 6455 section 5.5.1, 7.4. */
int tw__ws_encode_close(uint8_t *out, unsigned code, const char *reason, size_t reason_len,
			const uint8_t *key);

/* tw__ws_close_code_valid: 1 when code may appear in a close frame: 1000-
 * 1003, 1007-1014 (IANA-registered, RFC 6455 section 7.4.1 and 11.7) and
 * 3000-4999 (registered and private use, section 7.4.2); 0 for 0-999,
 * 1004, 1005, 1006, 1015, 1016-2999 and 5000-65535. */
int tw__ws_close_code_valid(unsigned code);

/* tw__ws_utf8_valid: close reasons must be UTF-8 (core/utf8.h). */
#define tw__ws_utf8_valid tw__utf8_valid

#endif
