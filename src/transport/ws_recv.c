/* SPDX-License-Identifier: BSD-3-Clause */
/* Receiving on a WebSocket comm (ws_comm.h): the frame decoder
 * (ws_codec.c) says where payload bytes go, and they are read straight
 * into their final block. A frame whose size is known from its first
 * fragment gets an exact-size block; a fragmented one gets reserved
 * address space that is trimmed when it ends; consecutive frames the
 * placement hook groups (the shards of one split payload, each its own
 * WebSocket message from Python) share one reserved block, so merging
 * them is a view. */
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include <taskwire/error.h>

#include "core/block.h"
#include "core/msg.h"
#include "core/pass.h"
#include "transport/comm_budget.h"
#include "transport/ws_comm.h"

#define COUNT_RULE "a message must start with 8 bytes of frame count"
#define RX_WAIT    (-2) /* reading waits for the receive budget */
/* A server reads masked payload at most this much at a time, so the
 * unmasking pass after each read runs on bytes still in the cache (half
 * of this VM's 512 KiB of L2 per core): a whole 4 MiB budget read first
 * had the pass go to memory, 10% of a ws echo server's CPU, 5% so. */
#define UNMASK_BYTES ((size_t)256 << 10)

static ssize_t io_read(struct ws *w, void *p, size_t n)
{
	if (w->pre_off < w->pre_len) {
		size_t k = w->pre_len - w->pre_off < n ? w->pre_len - w->pre_off : n;
		memcpy(p, w->pre + w->pre_off, k);
		w->pre_off += k;
		if (w->pre_off == w->pre_len) {
			free(w->pre);
			w->pre = NULL;
			w->pre_len = w->pre_off = 0;
		}
		return (ssize_t)k;
	}
	return tw__sock_read1(&w->sock, p, n);
}

/* tw__wsc_reset_rx, but the message's bytes stay reserved (deliver gives them
 * back once the message is delivered). */
static void reset_rx_held(struct ws *w)
{
	tw_msg_free(w->msg);
	tw_block_free(w->blk);
	w->msg = NULL;
	w->blk = NULL;
	w->nframes = 0;
	w->count_have = 0;
	w->msg_bytes = 0;
	w->span_left = 0;
	w->reserved = 0;
	w->rx_got = 0;
}

void tw__wsc_reset_rx(struct ws *w)
{
	reset_rx_held(w);
	tw__comm_rx_release(&w->sock.base);
}

/* A ping came: answer it, or fail the comm when the peer pings too often
 * (tw_context_set_ws_min_ping_interval_ms). 0, or -1 when the comm ended. */
static int got_ping(struct ws *w, const struct tw__ws_event *ev)
{
	uint8_t key[4];
	if (tw__ws_ping_rate_check(&w->pings, tw__mono_ms()) != 0) {
		tw__comm_seterr(&w->sock.base,
				"too many pings: %u in a row, each less than %u ms after "
				"the one before (WebSocket close %u)",
				w->sock.base.limits.ws_ping_strikes + 1,
				w->sock.base.limits.ws_min_ping_interval_ms, TW__WS_CLOSE_POLICY);
		tw__wsc_send_close_now(w, TW__WS_CLOSE_POLICY, "too many pings");
		tw__comm_end(&w->sock.base, TW_EPROTO);
		return -1;
	}
	/* One pong at a time, for the most recent ping (RFC 6455 section
	 * 5.5.3): a pong not yet written is replaced, so a flood of pings
	 * never queues pongs. */
	if (w->client)
		tw__ws_mask_key(key);
	if (!tw__wsc_ctrl_begun(w))
		tw__wsc_queue_ctrl(w, tw__ws_encode_pong(w->ctrl, ev->payload, ev->payload_len,
							 w->client ? key : NULL));
	return 0;
}

static uint64_t limit_left(const struct ws *w)
{
	return w->sock.base.limits.max_message_bytes - w->msg_bytes;
}

/* Frame i starts: choose its block (see the file comment). */
static int place_frame(struct ws *w, const struct tw__ws_event *ev)
{
	size_t i = tw_msg_nframes(w->msg);
	int span = 0;
	if (w->span_left > 0) {
		w->frame_start = w->blk_off;
		return 0;
	}
	if (w->place != NULL && (span = w->place(w->place_arg, w->msg, NULL, w->nframes, i)) < 0)
		return span;
	if ((uint64_t)span > w->nframes - i)
		span = (int)(w->nframes - i);
	w->blk_off = w->frame_start = 0;
	if (span <= 1 && ev->fin) {
		w->span_left = 1;
		w->reserved = 0;
		return ev->length == 0 ? 0 : tw__block_new_lazy(ev->length, &w->blk);
	}
	w->span_left = span > 1 ? (size_t)span : 1;
	w->reserved = 1;
	return tw__block_reserve(limit_left(w), &w->blk);
}

/* The count message arrived: N frames follow. 0, or -1 when the comm
 * failed (and may be freed). */
static int got_count(struct ws *w, uint64_t len)
{
	uint64_t n;
	if (len != 8) {
		tw__wsc_fail_proto(w, TW_EPROTO, TW__WS_CLOSE_PROTOCOL, COUNT_RULE);
		return -1;
	}
	memcpy(&n, w->count, 8);
	n = le64toh(n);
	if (n == 0) {
		tw__wsc_fail_proto(w, TW_ENOFRAMES, TW__WS_CLOSE_PROTOCOL,
				   "message of zero frames");
		return -1;
	}
	if (n > w->sock.base.limits.max_frames) {
		char why[128];
		snprintf(why, sizeof(why),
			 "message declares %llu frames, more than the limit of %llu "
			 "(tw_context_set_max_frames)",
			 (unsigned long long)n, (unsigned long long)w->sock.base.limits.max_frames);
		tw__wsc_fail_proto(w, TW_ETOOMANY, TW__WS_CLOSE_TOO_BIG, why);
		return -1;
	}
	if (tw_msg_new(&w->msg) != 0 || tw__msg_reserve(w->msg, n) != 0) {
		tw__wsc_fail_proto(w, TW_ENOMEM, TW__WS_CLOSE_INTERNAL, "out of memory");
		return -1;
	}
	w->nframes = n;
	tw__ws_dec_set_max_message_bytes(&w->dec, limit_left(w));
	return 0;
}

/* A frame (WebSocket message) ended: it is a slice of the current block. */
static int frame_done(struct ws *w, uint64_t len)
{
	tw_slice s = {NULL, 0, 0};
	if (w->blk != NULL && len > 0)
		s = (tw_slice){tw_block_hold(w->blk), w->frame_start, len};
	tw__msg_append_owned(w->msg, s);
	w->msg_bytes += len;
	if (--w->span_left == 0) {
		if (w->reserved && w->blk != NULL)
			tw__block_trim(w->blk, w->blk_off);
		tw_block_free(w->blk);
		w->blk = NULL;
		w->reserved = 0;
	}
	/* 0 would mean the decoder's default: on_data checks the rest */
	tw__ws_dec_set_max_message_bytes(&w->dec, limit_left(w) ? limit_left(w) : 1);
	return tw_msg_nframes(w->msg) == w->nframes;
}

static int deliver(struct ws *w)
{
	tw_msg *m = w->msg;
	int alive;
	w->msg = NULL;
	reset_rx_held(w);
	tw__ws_dec_set_max_message_bytes(&w->dec, w->sock.base.limits.max_message_bytes);
	TW__COUNT(&w->sock.base.stats, msgs_received, 1);
	alive = tw__comm_deliver(&w->sock.base, m);
	tw_msg_free(m);
	if (alive) /* after delivery, as stream_comm.c does (why there) */
		tw__comm_rx_release(&w->sock.base);
	return alive;
}

/* Before reading payload of a taskwire message that is past the
 * small-frame size (a WebSocket message has no total up front): its bytes
 * come out of the context's receive budget a step ahead of what arrived
 * (tw__comm_rx_budget), and *want is cut to what is reserved. 0 to read
 * on, RX_WAIT to stop reading until rx_granted. */
static int within_budget(struct ws *w, uint64_t room, size_t *want)
{
	uint64_t rest;
	if (w->nframes == 0 || room == 0 ||
	    w->rx_got + room <= w->sock.base.limits.small_frame_bytes)
		return 0;
	/* The message's bytes still to come are known only in the last
	 * fragment of its last frame; before, they are unknown, the most (a
	 * fragment's rest let a peer that sends fragments for ever look
	 * nearest to done and hold the pass, breaker b8, session 13). */
	rest = w->dec.fin && tw_msg_nframes(w->msg) + 1 == w->nframes ? room : UINT64_MAX;
	if (tw__comm_rx_budget(&w->sock.base, w->rx_got, room, rest, want) == 0)
		return 0;
	tw__sock_rx_wait(&w->sock);
	return RX_WAIT;
}

/* A data frame header: the count message (in any fragments, 8 bytes in
 * all) or part of frame i, checked against what the taskwire message may
 * still take before its payload is read. */
static int on_data(struct ws *w, const struct tw__ws_event *ev)
{
	if (w->nframes == 0) {
		if (ev->message_bytes <= 8)
			return 0;
		tw__wsc_fail_proto(w, TW_EPROTO, TW__WS_CLOSE_PROTOCOL, COUNT_RULE);
		return -1;
	}
	if (ev->message_bytes > limit_left(w)) {
		tw__wsc_fail_proto(w, TW_ETOOBIG, TW__WS_CLOSE_TOO_BIG, "message too big");
		return -1;
	}
	if (ev->first && place_frame(w, ev) != 0) {
		tw__wsc_fail_proto(w, TW_ENOMEM, TW__WS_CLOSE_INTERNAL, "out of memory");
		return -1;
	}
	return 0;
}

/* Handle one decoder event; 0 to go on, -1 when the comm ended or was
 * freed. */
static int on_event(struct ws *w, const struct tw__ws_event *ev)
{
	switch (ev->type) {
	case TW__WS_EV_DATA: return on_data(w, ev);
	case TW__WS_EV_MESSAGE_END:
		if (w->nframes == 0)
			return got_count(w, ev->length);
		if (frame_done(w, ev->length))
			return deliver(w) ? 0 : -1;
		return 0;
	case TW__WS_EV_PING: return got_ping(w, ev);
	case TW__WS_EV_CLOSE: tw__wsc_got_close(w, ev); return -1;
	default: return 0;
	}
}

static void decode_error(struct ws *w, int rv)
{
	char why[160];
	const char *text = tw__ws_dec_error(&w->dec);
	if (rv == TW_ETOOMANY) { /* fragments of one WebSocket message, not our frames */
		snprintf(why, sizeof(why),
			 "message in more than %llu WebSocket fragments (RFC 6455 section 5.4), "
			 "the limit (tw_context_set_ws_max_fragments)",
			 (unsigned long long)w->dec.max_fragments);
		text = why;
	}
	tw__wsc_fail_proto(w, rv == TW_ENOTSUP ? TW_EPROTO : rv, tw__ws_dec_close_code(&w->dec),
			   text);
}

/* Where the next payload bytes go. */
static uint8_t *payload_dst(struct ws *w)
{
	if (w->nframes == 0)
		return w->count + w->count_have;
	return w->blk != NULL ? tw_block_data(w->blk) + w->blk_off : NULL;
}

static void peer_gone(struct ws *w, ssize_t n)
{
	int err = tw__io_err(errno);
	if (w->close_rcvd || w->state == WS_CLOSING) {
		tw__wsc_end_after_close(w);
		return;
	}
	if (w->write_err != 0) { /* tw__wsc_read_rest: write_failed said why */
		tw__comm_end(&w->sock.base, w->write_err);
		return;
	}
	if (n == 0 && w->nframes == 0 && w->count_have == 0 && tw__ws_dec_idle(&w->dec)) {
		tw__comm_seterr(
			&w->sock.base,
			"peer closed the connection between messages, without a close frame");
		tw__comm_end(&w->sock.base, 0);
		return;
	}
	if (n == 0 && w->nframes == 0) {
		/* the message's head: bytes of its count, or of a WebSocket
		 * frame begun before it (a header cut short), as tcp counts
		 * the bytes of its prelude (stream_comm.c say_truncated) */
		uint64_t fb = tw__ws_dec_frame_have(&w->dec);
		tw__comm_seterr(&w->sock.base,
				"peer closed the connection in the middle of a message, without a "
				"close frame: after %zu of the 8 bytes of its frame count, %llu "
				"byte%s into a WebSocket frame",
				w->count_have, (unsigned long long)fb, fb == 1 ? "" : "s");
		tw__comm_end(&w->sock.base, TW_ETRUNCATED);
		return;
	}
	if (n == 0) {
		/* what arrived: frames complete, and the bytes of the one in
		 * progress (its block fills from frame_start) */
		uint64_t got = w->msg_bytes + (w->blk != NULL ? w->blk_off - w->frame_start : 0);
		tw__comm_seterr(&w->sock.base,
				"peer closed the connection in the middle of a message, without a "
				"close frame: after %llu bytes of its frames (%zu of %llu frames "
				"complete)",
				(unsigned long long)got,
				w->msg != NULL ? tw_msg_nframes(w->msg) : 0,
				(unsigned long long)w->nframes);
		tw__comm_end(&w->sock.base, TW_ETRUNCATED);
		return;
	}
	tw__comm_seterr(&w->sock.base, "read failed: %s", tw__sock_io_error(&w->sock));
	tw__comm_end(&w->sock.base, err);
}

/* Read up to want payload bytes into dst (committed) and feed them to the
 * decoder. The call's bytes are committed at once, as over tcp (256 KiB
 * commits had the block's prefaulter walk pages already in, 7% of a ws
 * echo server's CPU); a server reads and unmasks it in UNMASK_BYTES
 * pieces. Only the last can complete the frame. *got: the bytes read;
 * *n: the last read's result (a failed read after some bytes is left
 * for the next read_once to see). Returns the decoder's verdict. */
static int read_payload(struct ws *w, uint8_t *dst, size_t want, size_t *got, ssize_t *n,
			struct tw__ws_event *ev)
{
	int rv = 0;
	*got = 0;
	do {
		size_t k = want - *got;
		if (!w->client && k > UNMASK_BYTES)
			k = UNMASK_BYTES;
		*n = k == 0 ? 0 : io_read(w, dst + *got, k);
		if (*n < 0 || (*n == 0 && k > 0))
			break;
		rv = tw__ws_dec_payload_done(&w->dec, dst + *got, (size_t)*n, ev);
		*got += (size_t)*n;
		if (rv != 0 || (size_t)*n < k)
			break;
	} while (*got < want);
	return rv;
}

/* One read into the decoder; 1 to go on, 0 to wait for the socket,
 * RX_WAIT for the receive budget, -1 when ended. */
static int read_once(struct ws *w, size_t *budget)
{
	struct tw__ws_event ev = {0};
	enum tw__ws_dec_phase ph = tw__ws_dec_phase(&w->dec);
	ssize_t n;
	int rv;
	if (ph == TW__WS_DEC_BYTES) {
		uint8_t *dst;
		size_t want = tw__ws_dec_want(&w->dec, &dst);
		if ((n = io_read(w, dst, want)) <= 0)
			goto io;
		rv = tw__ws_dec_advance(&w->dec, (size_t)n, &ev);
	} else if (ph == TW__WS_DEC_PAYLOAD) {
		uint64_t room = tw__ws_dec_payload_room(&w->dec);
		uint8_t *dst = payload_dst(w);
		/* one call moves at most TW__PASS_CALL (core/pass.h) */
		size_t want = tw__pass_call(room < *budget ? (size_t)room : *budget), got;
		if ((rv = within_budget(w, room, &want)) != 0)
			return rv;
		if (w->nframes != 0 && w->blk != NULL &&
		    tw__block_commit(w->blk, w->blk_off, &want) < 0) {
			tw__wsc_fail_proto(w, TW_ENOMEM, TW__WS_CLOSE_INTERNAL, "out of memory");
			return -1;
		}
		rv = read_payload(w, dst, want, &got, &n, &ev);
		if (got == 0 && want > 0)
			goto io; /* the first read failed: n says how */
		n = (ssize_t)got;
		if (w->nframes == 0) {
			w->count_have += (size_t)n;
		} else {
			w->blk_off += (size_t)n;
			w->rx_got += (uint64_t)n;
		}
	} else {
		return 0;
	}
	TW__COUNT(&w->sock.base.stats, bytes_received, (uint64_t)n);
	*budget = tw__pass_spent(*budget, (size_t)n);
	if (rv < 0) {
		decode_error(w, rv);
		return -1;
	}
	if (rv == 1 && on_event(w, &ev) < 0)
		return -1;
	return 1;
io:
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return 0;
	peer_gone(w, n);
	return -1;
}

/* Read what the socket still holds, as the read event would have: bytes
 * that came before a reset stay readable (Linux returns them, then EOF).
 * 1 when the comm may still be used. */
int tw__wsc_read_rest(struct ws *w)
{
	size_t budget = SIZE_MAX;
	tw__comm_hold(&w->sock.base);
	/* no pass budget here: the socket is ending (tw__pass_spent may say
	 * 0, and a read of 0 bytes would come back here for ever) */
	while (w->state == WS_OPEN && w->sock.reading && read_once(w, &budget) > 0)
		budget = SIZE_MAX;
	return tw__comm_release(&w->sock.base);
}

/* A message is partly received: a taskwire message begun (its count or
 * its frames), or any WebSocket frame begun. */
int tw__wsc_rx_busy(const struct tw__sock *sock)
{
	const struct ws *w = (const struct ws *)sock;
	return w->nframes != 0 || w->count_have != 0 || !tw__ws_dec_idle(&w->dec);
}

/* Bytes already in memory (read with the upgrade, decrypted by TLS), or
 * an end that came with them: epoll does not report them. */
static int io_more(const struct ws *w)
{
	return w->pre_off < w->pre_len || tw__sock_io_more(&w->sock);
}

/* The decoder is at a data frame's empty payload (an empty frame, or the
 * empty last fragment that Python websockets sends after the fragments
 * of send(async iterator)): it ends, and may end the message, without a
 * byte more, so no read event comes for it. A pass spent on that frame's
 * header left the message undelivered for ever, every byte of it read
 * (breaker17 b17-22: 1 in 60 ws peers under load). */
static int empty_payload_due(const struct ws *w)
{
	return tw__ws_dec_phase(&w->dec) == TW__WS_DEC_PAYLOAD &&
	       tw__ws_dec_payload_room(&w->dec) == 0;
}

static void read_frames(struct ws *w)
{
	size_t budget = tw__pass_read(event_get_base(w->sock.rev), TW__WSC_IO_BUDGET);
	while (budget > 0 && w->sock.reading && !w->sock.base.ended) {
		int r = read_once(w, &budget);
		if (r == 0)
			tw__sock_ran_dry(&w->sock);
		if (r <= 0)
			return;
	}
	/* Budget spent: the socket's bytes wait for the next pass (rev
	 * persists), behind the comms whose bytes arrived meanwhile
	 * (core/pass.h), and if it holds none the rate clock runs
	 * (tw__sock_yield); what is in memory already, or an empty payload
	 * still to end, epoll cannot report. */
	if (!w->sock.reading || w->sock.base.ended)
		return;
	tw__sock_yield(&w->sock);
	if (io_more(w) || empty_payload_due(w))
		tw__sock_read_again(&w->sock);
}

/* Failing: drop what the peer sends, until its EOF. */
static void read_failing(struct ws *w)
{
	int r = tw__sock_drain(&w->sock);
	if (r == 0)
		return;
	if (r < 0) {
		tw__comm_end(&w->sock.base, w->err_after_close);
		return;
	}
	if (w->close_sent && w->ctrl_len == 0)
		tw__wsc_linger_check(w);
}

/* Closing: drop data, look only for the peer's close frame or EOF. */
static void read_closing(struct ws *w)
{
	size_t budget = tw__pass_read(event_get_base(w->sock.rev), TW__WSC_IO_BUDGET);
	ssize_t n = -1;
	while (!w->sock.base.ended) {
		struct tw__ws_event ev = {0};
		enum tw__ws_dec_phase ph = tw__ws_dec_phase(&w->dec);
		uint8_t sink[16384], *dst;
		int rv;
		if (ph == TW__WS_DEC_BYTES) {
			size_t want = tw__ws_dec_want(&w->dec, &dst);
			if ((n = io_read(w, dst, want)) <= 0)
				break;
			rv = tw__ws_dec_advance(&w->dec, (size_t)n, &ev);
		} else if (ph == TW__WS_DEC_PAYLOAD) {
			uint64_t room = tw__ws_dec_payload_room(&w->dec);
			size_t want = room < sizeof(sink) ? (size_t)room : sizeof(sink);
			n = 0;
			if (want > 0 && (n = io_read(w, sink, want)) <= 0)
				break;
			rv = tw__ws_dec_payload_done(&w->dec, sink, (size_t)n, &ev);
		} else if (w->ctrl_len > 0) {
			/* The peer's close arrived; our echo of it is still queued:
			 * the writer ends the comm once it is out (RFC 6455 5.5.1). */
			event_del(w->sock.rev);
			return;
		} else {
			tw__wsc_end_after_close(w);
			return;
		}
		if (rv == 1 && ev.type == TW__WS_EV_CLOSE) {
			tw__wsc_got_close(w, &ev);
			return;
		}
		if (rv < 0 && !w->close_sent) {
			/* Bad input before our close went: the replies queued
			 * go first, then its close code (design.md, Close). */
			decode_error(w, rv);
			return;
		}
		if (rv < 0) {
			w->close_rcvd = 1;
			if (w->ctrl_len == 0)
				tw__wsc_end_after_close(w);
			return;
		}
		if ((budget = tw__pass_spent(budget, (size_t)n)) == 0)
			return;
	}
	if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
		tw__wsc_end_after_close(w);
}

static void read_ready(struct ws *w)
{
	if (w->state == WS_UPGRADE) {
		tw__wsc_upgrade_read(w);
		return;
	}
	if (w->failing) {
		read_failing(w);
		return;
	}
	if (w->state == WS_CLOSING) {
		read_closing(w);
		return;
	}
	if (!w->sock.reading) {
		event_del(w->sock.rev);
		return;
	}
	read_frames(w);
}

void tw__wsc_readable(struct tw__sock *sock)
{
	read_ready((struct ws *)sock);
	tw__pass_close(); /* the comm's turn ends (core/pass.h) */
}
