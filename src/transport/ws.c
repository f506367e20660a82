/* SPDX-License-Identifier: BSD-3-Clause */
/* ws:// and wss:// comms (docs/design.md, WebSocket): the HTTP
 * upgrade (ws_upgrade.c), then a message of N frames as N + 1 binary
 * WebSocket messages: 8 bytes holding N, then one message per frame.
 *
 * Receive: the frame decoder (ws_codec.c) says where payload bytes go, and
 * they are read straight into their final block. A frame whose size is
 * known from its first fragment gets an exact-size block; a fragmented one
 * gets reserved address space that is trimmed when it ends; consecutive
 * frames the placement hook groups (the shards of one split payload, each
 * its own WebSocket message from Python) share one reserved block, so
 * merging them is a view.
 *
 * Send: the transport splits: a frame larger than the shard size goes out
 * as one message in several fragments. A server writes headers and the
 * frames' own memory with scatter-gather writes; a client must mask (RFC
 * 6455 section 5.3), so it masks into a scratch buffer, chunk by chunk,
 * with a fresh key per fragment. */
#include <endian.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include <taskwire/error.h>

#include "core/block.h"
#include "core/msg.h"
#include "core/pass.h"
#include "transport/sock_comm.h"
#include "transport/ws_codec.h"
#include "transport/ws_upgrade.h"

#define IOV_BATCH     64
#define SCRATCH_BYTES ((size_t)512 << 10) /* a client's scratch buffer, at most */
#define IO_BUDGET     ((size_t)4 << 20)   /* a comm's per pass, of the pass's (core/pass.h) */
#define COUNT_RULE    "a message must start with 8 bytes of frame count"
#define RX_WAIT       (-2) /* reading waits for the receive budget */
/* A server reads masked payload at most this much at a time, so the
 * unmasking pass after each read runs on bytes still in the cache (half
 * of this VM's 512 KiB of L2 per core): a whole 4 MiB budget read first
 * had the pass go to memory, 10% of a ws echo server's CPU, 5% so. */
#define UNMASK_BYTES ((size_t)256 << 10)

/* One WebSocket frame to send: header, then len payload bytes at p. */
struct seg {
	const uint8_t *p;
	uint64_t len;
	uint8_t hdr[TW__WS_MAX_HEADER];
	uint8_t hlen;
	uint8_t key[4];
};

/* A queued message. The count message's 8 bytes (u64 N) follow the
 * segments in their allocation: the queue array moves when it grows, the
 * segments do not. */
struct out_msg {
	tw_msg *msg;
	struct seg *segs;
	size_t nsegs;
};

enum ws_state { WS_UPGRADE, WS_OPEN, WS_CLOSING, WS_DONE };

/* On the socket shell (sock_comm.h), whose queue holds out_msg entries
 * and whose timer times the upgrade, then the close linger. */
struct ws {
	struct tw__sock sock;
	int client;
	enum ws_state state;
	/* upgrade */
	struct tw__ws_req req;
	struct tw__ws_client hs;
	char *hs_out; /* TW__WS_REQUEST_MAX bytes during the upgrade, then NULL */
	size_t hs_len, hs_sent;
	int refuse;          /* server: a non-101 verdict is being written */
	uint32_t upgrade_ms; /* the upgrade's bound */
	int by_connect;      /* client: that bound is the connect timeout's */
	uint8_t *pre;        /* bytes read with the upgrade that belong to frames */
	size_t pre_len, pre_off;
	tw_connect_cb cb;
	void *cb_arg;
	tw_listener *l;
	/* receive */
	struct tw__ws_dec dec;
	uint8_t count[8];
	size_t count_have;
	uint64_t nframes; /* 0 until the count message of a message arrived */
	tw_msg *msg;      /* frames so far */
	uint64_t msg_bytes;
	tw_block *blk; /* block of the current frame (or span of frames) */
	size_t blk_off, frame_start;
	size_t span_left; /* frames still to land in blk */
	int reserved;     /* blk is reserved address space, trimmed at the end */
	uint64_t rx_got;  /* payload bytes of the taskwire message read so far */
	tw__place_fn place;
	void *place_arg;
	struct tw__ws_ping_rate pings;
	/* send */
	size_t seg, seg_off; /* cursor: segment of the head out_msg, bytes of it sent */
	/* room for a close queued behind a control frame already begun */
	uint8_t ctrl[2 * TW__WS_MAX_CONTROL_FRAME];
	size_t ctrl_len, ctrl_sent;
	/* The I/O layer holds bytes of the last data or control write (an
	 * OpenSSL record after WANT_WRITE) that the next write must repeat:
	 * nothing may be written in between, and those bytes may not change
	 * (a pong written there went out as the held bytes of a data frame,
	 * corrupting the stream). */
	int data_owed, ctrl_owed;
	/* Client: masked bytes being written (scratch_cap bytes, allocated
	 * for a write and freed when the queue is empty: an idle comm holds
	 * none). */
	uint8_t *scratch;
	size_t scratch_cap, scratch_len, scratch_sent;
	int close_sent, close_rcvd, err_after_close;
	/* Failing for bad input with replies queued: they go out, then the
	 * close frame with this code and reason, and no input is processed
	 * (RFC 6455 section 7.1.7); input is read and dropped. */
	int failing;
	unsigned fail_code;
	char fail_why[123];
	int write_err; /* a write failed with it: so does a read_rest that ends */
};

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

static const char *io_error(struct ws *w)
{
	return tw__sock_io_error(&w->sock);
}

static struct out_msg *out_at(const struct ws *w, size_t i)
{
	return tw__sockq_at(&w->sock.q, i);
}

/* Sending. */

static size_t shard_bytes(const struct ws *w)
{
	return w->sock.base.limits.ws_shard_bytes;
}

static int add_seg(struct ws *w, struct out_msg *m, size_t *n, int fin, unsigned op,
		   const uint8_t *p, uint64_t len)
{
	struct seg *s = &m->segs[(*n)++];
	uint8_t *key = NULL;
	int h;
	s->p = p;
	s->len = len;
	if (w->client) {
		if (tw__ws_mask_key(s->key) != 0)
			return TW_EIO;
		key = s->key;
	}
	if ((h = tw__ws_encode_header(s->hdr, fin, op, len, key)) < 0)
		return h;
	s->hlen = (uint8_t)h;
	return 0;
}

/* The WebSocket frames of one message: the count, then each frame as one
 * message, split into fragments of at most the shard size. */
static int build_segs(struct ws *w, struct out_msg *m)
{
	const tw_slice *f = tw__msg_frames(m->msg);
	size_t nf = tw_msg_nframes(m->msg), shard = shard_bytes(w), n = 0, total = 1;
	uint64_t v = htole64((uint64_t)nf);
	uint8_t *count;
	int rv;
	for (size_t i = 0; i < nf; i++)
		total += f[i].len == 0 ? 1 : (f[i].len + shard - 1) / shard;
	if ((m->segs = calloc(1, total * sizeof(*m->segs) + 8)) == NULL)
		return TW_ENOMEM;
	count = (uint8_t *)(m->segs + total);
	memcpy(count, &v, 8);
	if ((rv = add_seg(w, m, &n, 1, TW__WS_BINARY, count, 8)) != 0)
		return rv;
	for (size_t i = 0; i < nf; i++) {
		const uint8_t *p = tw_slice_data(&f[i]);
		uint64_t left = f[i].len;
		unsigned op = TW__WS_BINARY;
		do {
			uint64_t k = left < shard ? left : shard;
			if ((rv = add_seg(w, m, &n, k == left, op, p, k)) != 0)
				return rv;
			p += k;
			left -= k;
			op = TW__WS_CONT;
		} while (left > 0);
	}
	m->nsegs = n;
	return 0;
}

static uint64_t seg_bytes(const struct seg *s)
{
	return s->hlen + s->len;
}

static uint64_t msg_wire(const struct out_msg *m)
{
	uint64_t n = 0;
	for (size_t i = 0; i < m->nsegs; i++)
		n += seg_bytes(&m->segs[i]);
	return n;
}

static void out_free(struct ws *w, struct out_msg *m)
{
	tw__sock_msg_gone(&w->sock, m->msg);
	free(m->segs);
}

/* n bytes of segments went out: move the cursor, retire messages. */
static void consume(struct ws *w, uint64_t n)
{
	tw__sock_sent(&w->sock, n);
	while (n > 0) {
		struct out_msg *m = out_at(w, 0);
		uint64_t left = seg_bytes(&m->segs[w->seg]) - w->seg_off;
		uint64_t k = n < left ? n : left;
		w->seg_off += k;
		n -= k;
		if (w->seg_off < seg_bytes(&m->segs[w->seg]))
			break;
		w->seg_off = 0;
		if (++w->seg < m->nsegs)
			continue;
		out_free(w, m);
		w->seg = 0;
		tw__sockq_pop(&w->sock.q);
		TW__COUNT(&w->sock.base.stats, msgs_sent, 1);
	}
	/* Empty messages and segments at the cursor: nothing to write. */
}

/* Server: headers and payload straight from the frames' memory. */
static int gather(struct ws *w, struct iovec *iov, int max)
{
	size_t seg = w->seg;
	uint64_t skip = w->seg_off;
	int k = 0;
	for (size_t i = 0; i < w->sock.q.n && k < max - 1; i++) {
		struct out_msg *m = out_at(w, i);
		for (; seg < m->nsegs && k < max - 1; seg++) {
			struct seg *s = &m->segs[seg];
			if (skip < s->hlen) {
				iov[k].iov_base = s->hdr + skip;
				iov[k++].iov_len = s->hlen - skip;
				skip = 0;
			} else {
				skip -= s->hlen;
			}
			if (s->len > skip) {
				iov[k].iov_base = (uint8_t *)s->p + skip;
				iov[k++].iov_len = s->len - skip;
			}
			skip = 0;
			/* A control frame waits (a close, a pong): only to the
			 * end of this segment, where it can go out. */
			if (w->ctrl_len > 0)
				return k;
		}
		seg = 0;
	}
	return k;
}

/* Client: headers and masked payload copied into the scratch buffer,
 * from the cursor on, as much as fits. */
static void fill_scratch(struct ws *w)
{
	size_t seg = w->seg, pos = 0, cap = w->scratch_cap;
	uint64_t skip = w->seg_off;
	for (size_t i = 0; i < w->sock.q.n && pos < cap; i++) {
		struct out_msg *m = out_at(w, i);
		for (; seg < m->nsegs && pos < cap; seg++) {
			struct seg *s = &m->segs[seg];
			size_t k;
			if (skip < s->hlen) {
				k = s->hlen - skip < cap - pos ? s->hlen - skip : cap - pos;
				memcpy(w->scratch + pos, s->hdr + skip, k);
				pos += k;
				skip += k;
			}
			if (skip < s->hlen)
				break;
			skip -= s->hlen;
			k = s->len - skip < cap - pos ? s->len - skip : cap - pos;
			tw__ws_mask_copy(w->scratch + pos, s->p + skip, k, s->key, skip);
			pos += k;
			if (skip + k < s->len)
				break;
			if (w->ctrl_len > 0)
				goto done; /* a control frame waits for this boundary */
			skip = 0;
		}
		seg = 0;
	}
done:
	w->scratch_len = pos;
	w->scratch_sent = 0;
}

static void end_after_close(struct ws *w);
static void fail_sent(struct ws *w);
static void start_linger(struct ws *w);

static int write_held(const struct ws *w)
{
	return tw__sock_write_held(&w->sock);
}

/* Write a pending control frame, whole, before any more segments. */
static int write_ctrl(struct ws *w)
{
	ssize_t n = tw__sock_write1(&w->sock, w->ctrl + w->ctrl_sent, w->ctrl_len - w->ctrl_sent);
	w->ctrl_owed = write_held(w);
	if (n < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 1 : -1;
	w->ctrl_sent += (size_t)n;
	if (w->ctrl_sent < w->ctrl_len)
		return 1;
	w->ctrl_len = w->ctrl_sent = 0;
	return 0;
}

static int at_boundary(const struct ws *w)
{
	return w->seg_off == 0 && w->scratch_sent == w->scratch_len && !w->data_owed;
}

static int read_once(struct ws *w, size_t *budget);

/* Read what the socket still holds, as the read event would have: bytes
 * that came before a reset stay readable (Linux returns them, then EOF).
 * 1 when the comm may still be used. */
static int read_rest(struct ws *w)
{
	size_t budget = SIZE_MAX;
	tw__comm_hold(&w->sock.base);
	/* no pass budget here: the socket is ending (tw__pass_spent may say
	 * 0, and a read of 0 bytes would come back here for ever) */
	while (w->state == WS_OPEN && w->sock.reading && read_once(w, &budget) > 0)
		budget = SIZE_MAX;
	return tw__comm_release(&w->sock.base);
}

static void write_failed(struct ws *w)
{
	int reset = errno == ECONNRESET || errno == EPIPE;
	if (!w->close_rcvd) {
		w->write_err = tw__io_err(errno);
		tw__comm_seterr(&w->sock.base, "write failed: %s", io_error(w));
		/* A peer that fails the connection may send its close and
		 * reset at once (RFC 6455 section 7.1.7): read it first. */
		if (reset && !read_rest(w))
			return;
	}
	/* The peer closed first: its close code, not the failed write (or
	 * the echo of its close), says why the comm ended (section 7.1.5). */
	if (w->close_rcvd) {
		end_after_close(w);
		return;
	}
	tw__comm_end(&w->sock.base, w->write_err);
}

/* A client's scratch buffer holds 64 KiB while little is queued, and
 * SCRATCH_BYTES for more. Masking 64 KiB per write cost a ws echo of
 * 64 MiB messages one write and one wakeup of the peer per 64 KiB: 512 KiB
 * (still in the L2 cache when the write copies it out) took 3-15% less
 * CPU over client and server, side by side (issue 20); throughput moved
 * within the noise of the loaded 2-CPU machine. */
#define SCRATCH_MIN ((size_t)64 << 10)

/* Client, all of the scratch buffer sent (nothing in it is owed to
 * TLS): a larger one when more is queued than the one there holds, then
 * the next bytes masked into it. */
static int refill_scratch(struct ws *w)
{
	size_t want = w->sock.queued_bytes > SCRATCH_MIN ? SCRATCH_BYTES : SCRATCH_MIN;
	if (w->scratch == NULL || w->scratch_cap < want) {
		uint8_t *p = malloc(want);
		if (p == NULL && w->scratch == NULL)
			return -1;
		if (p != NULL) { /* else: go on with the small one */
			free(w->scratch);
			w->scratch = p;
			w->scratch_cap = want;
		}
	}
	fill_scratch(w);
	return 0;
}

/* Write segments until the socket is full, at most budget bytes unless
 * TLS holds a record of the last write (its retry must offer at least as
 * many bytes: OpenSSL fails it with "bad length"); a client's come from
 * its masking buffer. */
static ssize_t write_some(struct ws *w, size_t budget)
{
	struct iovec iov[IOV_BATCH];
	uint8_t buf[TW__GATHER_MAX];
	int k;
	if (!w->client) {
		k = tw__gather_small(iov, gather(w, iov, IOV_BATCH), buf);
		return tw__sock_send(&w->sock, iov, k, budget);
	}
	if (w->scratch_sent == w->scratch_len && refill_scratch(w) != 0) {
		errno = ENOMEM;
		return -1;
	}
	iov[0].iov_base = w->scratch + w->scratch_sent;
	iov[0].iov_len = w->scratch_len - w->scratch_sent;
	return tw__sock_send(&w->sock, iov, 1, budget);
}

static void flush(struct ws *w)
{
	size_t budget = tw__pass_allow(event_get_base(w->sock.wev), IO_BUDGET);
	for (;;) {
		ssize_t n;
		if (w->ctrl_len > 0 && at_boundary(w)) {
			int r = write_ctrl(w);
			if (r < 0) {
				write_failed(w);
				return;
			}
			if (r > 0)
				goto wait;
			if (w->close_sent && w->close_rcvd) {
				end_after_close(w);
				return;
			}
			if (w->failing && w->close_sent && w->ctrl_len == 0) {
				fail_sent(w);
				return;
			}
			continue;
		}
		if (w->sock.q.n == 0)
			break;
		if (budget == 0) {
			/* The loop's other comms first: epoll reports the socket
			 * writable again next pass (core/pass.h). */
			if (!event_pending(w->sock.wev, EV_WRITE, NULL))
				event_add(w->sock.wev, NULL);
			return;
		}
		n = write_some(w, budget);
		w->data_owed = write_held(w);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			goto wait;
		if (n < 0) {
			write_failed(w);
			return;
		}
		if (w->client)
			w->scratch_sent += (size_t)n;
		consume(w, (uint64_t)n);
		budget = tw__pass_spent(budget, (size_t)n);
	}
	event_del(w->sock.wev);
	free(w->scratch); /* all sent: nothing in it is owed to TLS */
	w->scratch = NULL;
	w->scratch_cap = w->scratch_len = w->scratch_sent = 0;
	if (w->state == WS_CLOSING && !w->close_sent) {
		uint8_t key[4];
		int len;
		if (w->client)
			tw__ws_mask_key(key);
		if (w->failing)
			len = tw__ws_encode_close(w->ctrl, w->fail_code, w->fail_why,
						  strlen(w->fail_why), w->client ? key : NULL);
		else
			len = tw__ws_encode_close(w->ctrl, TW__WS_CLOSE_NORMAL, NULL, 0,
						  w->client ? key : NULL);
		w->ctrl_len = len > 0 ? (size_t)len : 0;
		w->close_sent = 1;
		event_active(w->sock.wev, EV_WRITE, 0);
		return;
	}
	if (w->state == WS_OPEN)
		tw__comm_drained(&w->sock.base);
	return;
wait:
	event_add(w->sock.wev, NULL);
}

static void upgrade_write(struct ws *w);

static void on_writable(struct tw__sock *sock)
{
	struct ws *w = (struct ws *)sock;
	if (w->state == WS_UPGRADE) {
		upgrade_write(w);
		return;
	}
	flush(w);
}

static int w_write(tw_comm *c, tw_msg *msg)
{
	struct ws *w = (struct ws *)c;
	struct out_msg m = {msg, NULL, 0}, *slot;
	int rv;
	if (w->state != WS_OPEN)
		return TW_ECLOSED;
	if (w->sock.queued_bytes >= c->limits.write_hwm_bytes)
		return TW_EAGAIN;
	if ((slot = tw__sockq_tail(&w->sock.q)) == NULL)
		return TW_ENOMEM;
	if ((rv = build_segs(w, &m)) != 0) {
		free(m.segs);
		return rv;
	}
	*slot = m;
	tw__sockq_commit(&w->sock.q);
	tw__sock_queue_add(&w->sock, msg, msg_wire(&m));
	tw__sock_kick_write(&w->sock);
	return 0;
}

/* A control frame already begun (partly written, or owed to TLS) goes
 * out whole and unchanged: a new one is encoded after it. */
static int ctrl_begun(const struct ws *w)
{
	return w->ctrl_len > 0 && (w->ctrl_sent > 0 || w->ctrl_owed);
}

static uint8_t *ctrl_slot(struct ws *w)
{
	return ctrl_begun(w) ? w->ctrl + w->ctrl_len : w->ctrl;
}

/* Queue a control frame of len bytes encoded at ctrl_slot(): after one
 * begun, or in place of one not begun (a pong not yet written gives way
 * to a newer pong or to a close). */
static void queue_ctrl(struct ws *w, int len)
{
	if (len <= 0)
		return;
	if (ctrl_begun(w)) {
		w->ctrl_len += (size_t)len;
	} else {
		w->ctrl_len = (size_t)len;
		w->ctrl_sent = 0;
	}
	event_active(w->sock.wev, EV_WRITE, 0);
}

/* Receiving. */

/* reset_rx, but the message's bytes stay reserved (deliver gives them
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

static void reset_rx(struct ws *w)
{
	reset_rx_held(w);
	tw__comm_rx_release(&w->sock.base);
}

/* Send the close code and reason now, before the comm ends. It goes out
 * only between frames (inside a data frame or a control frame partly
 * written it would corrupt the stream: then TCP just closes); a pong not
 * yet written gives way to it. */
static void send_close_now(struct ws *w, unsigned code, const char *why)
{
	if (!w->close_sent && !ctrl_begun(w) && at_boundary(w)) {
		uint8_t key[4];
		int len;
		if (w->client)
			tw__ws_mask_key(key);
		len = tw__ws_encode_close(w->ctrl, code, why, strlen(why) < 123 ? strlen(why) : 0,
					  w->client ? key : NULL);
		/* Best effort: one write, then the socket closes. */
		if (len > 0)
			tw__sock_write1(&w->sock, w->ctrl, (size_t)len);
		w->close_sent = 1;
	}
}

/* Bad input with replies queued: they go out first, then the close code
 * (design.md, Close); no more input is processed. */
static void fail_after_replies(struct ws *w, int err, unsigned code, const char *why)
{
	w->state = WS_CLOSING;
	w->failing = 1;
	w->fail_code = code;
	snprintf(w->fail_why, sizeof(w->fail_why), "%s", why);
	w->err_after_close = err;
	tw__comm_closing(&w->sock.base);
	tw__comm_rate_stop(&w->sock.base);
	event_add(w->sock.rev, NULL); /* input is read and dropped */
	start_linger(w);
	event_active(w->sock.wev, EV_WRITE, 0);
}

/* Fail the comm: send the close code, then end with err. */
static void fail_proto(struct ws *w, int err, unsigned code, const char *why)
{
	tw__comm_seterr(&w->sock.base, "%s (WebSocket close %u)", why, code);
	if (w->sock.q.n > 0 && w->state == WS_OPEN && !w->close_sent) {
		fail_after_replies(w, err, code, why);
		return;
	}
	send_close_now(w, code, why);
	tw__comm_end(&w->sock.base, err);
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
		send_close_now(w, TW__WS_CLOSE_POLICY, "too many pings");
		tw__comm_end(&w->sock.base, TW_EPROTO);
		return -1;
	}
	/* One pong at a time, for the most recent ping (RFC 6455 section
	 * 5.5.3): a pong not yet written is replaced, so a flood of pings
	 * never queues pongs. */
	if (w->client)
		tw__ws_mask_key(key);
	if (!ctrl_begun(w))
		queue_ctrl(w, tw__ws_encode_pong(w->ctrl, ev->payload, ev->payload_len,
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
		fail_proto(w, TW_EPROTO, TW__WS_CLOSE_PROTOCOL, COUNT_RULE);
		return -1;
	}
	memcpy(&n, w->count, 8);
	n = le64toh(n);
	if (n == 0 || n > w->sock.base.limits.max_frames) {
		fail_proto(w, n == 0 ? TW_ENOFRAMES : TW_ETOOMANY,
			   n == 0 ? TW__WS_CLOSE_PROTOCOL : TW__WS_CLOSE_TOO_BIG,
			   n == 0 ? "message of zero frames" : "more frames than the limit");
		return -1;
	}
	if (tw_msg_new(&w->msg) != 0 || tw__msg_reserve(w->msg, n) != 0) {
		fail_proto(w, TW_ENOMEM, TW__WS_CLOSE_INTERNAL, "out of memory");
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

/* The peer's close frame. Unless ours went out, it is answered at once
 * (RFC 6455 section 5.5.1): at the end of the frame being written (a
 * control frame may come between fragments), never after the rest of
 * the queue, which the peer would not read; the linger bounds the wait
 * for that boundary. What stays queued is not delivered: the comm then
 * ends with an error that says how much. */
static void got_close(struct ws *w, const struct tw__ws_event *ev)
{
	uint8_t key[4];
	int normal = ev->code == TW__WS_CLOSE_NORMAL || ev->code == TW__WS_CLOSE_GOING_AWAY ||
		     ev->code == TW__WS_CLOSE_NO_STATUS;
	w->close_rcvd = 1;
	if (normal && w->state == WS_OPEN)
		w->err_after_close = w->msg == NULL && w->count_have == 0 ? 0 : TW_ETRUNCATED;
	else if (!normal)
		w->err_after_close = ev->code == TW__WS_CLOSE_TOO_BIG ? TW_ETOOBIG : TW_ECLOSED;
	if (w->state == WS_OPEN || !normal || w->sock.queued_bytes > 0)
		tw__comm_seterr(&w->sock.base, "closed by peer (code %u: %.*s)", ev->code,
				(int)ev->payload_len, (const char *)ev->payload);
	if (!w->close_sent) {
		if (w->client)
			tw__ws_mask_key(key);
		queue_ctrl(w, tw__ws_encode_close(ctrl_slot(w), ev->code, NULL, 0,
						  w->client ? key : NULL));
		w->close_sent = 1;
		w->state = WS_CLOSING;
		/* no data after our close (RFC 6455 5.5.1) */
		tw__comm_closing(&w->sock.base);
		tw__comm_rate_stop(&w->sock.base);
		start_linger(w);
		return;
	}
	if (w->ctrl_len == 0)
		end_after_close(w);
}

/* Before reading payload of a taskwire message that is past the
 * small-frame size (a WebSocket message has no total up front): its bytes
 * come out of the context's receive budget a step ahead of what arrived
 * (tw__comm_rx_budget), and *want is cut to what is reserved. 0 to read
 * on, RX_WAIT to stop reading until rx_granted. */
static int within_budget(struct ws *w, uint64_t room, size_t *want)
{
	if (w->nframes == 0 || room == 0 ||
	    w->rx_got + room <= w->sock.base.limits.small_frame_bytes)
		return 0;
	if (tw__comm_rx_budget(&w->sock.base, w->rx_got, room, want) == 0)
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
		fail_proto(w, TW_EPROTO, TW__WS_CLOSE_PROTOCOL, COUNT_RULE);
		return -1;
	}
	if (ev->message_bytes > limit_left(w)) {
		fail_proto(w, TW_ETOOBIG, TW__WS_CLOSE_TOO_BIG, "message too big");
		return -1;
	}
	if (ev->first && place_frame(w, ev) != 0) {
		fail_proto(w, TW_ENOMEM, TW__WS_CLOSE_INTERNAL, "out of memory");
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
	case TW__WS_EV_CLOSE: got_close(w, ev); return -1;
	default: return 0;
	}
}

static void decode_error(struct ws *w, int rv)
{
	fail_proto(w, rv == TW_ENOTSUP ? TW_EPROTO : rv, tw__ws_dec_close_code(&w->dec),
		   tw__ws_dec_error(&w->dec));
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
		end_after_close(w);
		return;
	}
	if (w->write_err != 0) { /* read_rest: write_failed said why */
		tw__comm_end(&w->sock.base, w->write_err);
		return;
	}
	if (n == 0 && w->msg == NULL && w->count_have == 0) {
		tw__comm_seterr(
			&w->sock.base,
			"peer closed the connection between messages, without a close frame");
		tw__comm_end(&w->sock.base, 0);
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
	tw__comm_seterr(&w->sock.base, "read failed: %s", io_error(w));
	tw__comm_end(&w->sock.base, err);
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
		size_t want = room < *budget ? (size_t)room : *budget;
		if (!w->client && want > UNMASK_BYTES)
			want = UNMASK_BYTES;
		if ((rv = within_budget(w, room, &want)) != 0)
			return rv;
		if (w->nframes != 0 && w->blk != NULL &&
		    tw__block_commit(w->blk, w->blk_off, &want) < 0) {
			fail_proto(w, TW_ENOMEM, TW__WS_CLOSE_INTERNAL, "out of memory");
			return -1;
		}
		n = 0;
		if (want > 0 && (n = io_read(w, dst, want)) <= 0)
			goto io;
		rv = tw__ws_dec_payload_done(&w->dec, dst, (size_t)n, &ev);
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

/* A message is partly received: a taskwire message begun (its count or
 * its frames), or any WebSocket frame begun. */
static int rx_busy(const struct tw__sock *sock)
{
	const struct ws *w = (const struct ws *)sock;
	return w->nframes != 0 || w->count_have != 0 || !tw__ws_dec_idle(&w->dec);
}

/* Input is delivered only while open: closing, it is dropped. */
static int rx_open(const struct tw__sock *sock)
{
	return ((const struct ws *)sock)->state == WS_OPEN;
}

/* The peer is too slow (tw_context_set_min_receive_rate): close 1008,
 * policy violation (RFC 6455 section 7.4.1), as for too many pings. */
static void too_slow(struct tw__sock *sock)
{
	struct ws *w = (struct ws *)sock;
	char why[sizeof(w->sock.base.error)];
	snprintf(why, sizeof(why), "%s", w->sock.base.error);
	tw__comm_seterr(&w->sock.base, "%s (WebSocket close %u)", why, TW__WS_CLOSE_POLICY);
	send_close_now(w, TW__WS_CLOSE_POLICY, "message arriving too slowly");
	tw__comm_end(&w->sock.base, TW_ETIMEDOUT);
}

/* Bytes already in memory (read with the upgrade, decrypted by TLS), or
 * an end that came with them: epoll does not report them. */
static int io_more(const struct ws *w)
{
	return w->pre_off < w->pre_len || tw__sock_io_more(&w->sock);
}

static void read_frames(struct ws *w)
{
	size_t budget = tw__pass_read(event_get_base(w->sock.rev), IO_BUDGET);
	while (budget > 0 && w->sock.reading && !w->sock.base.ended) {
		int r = read_once(w, &budget);
		if (r == 0)
			tw__sock_ran_dry(&w->sock);
		if (r <= 0)
			return;
	}
	/* Budget spent: the socket's bytes wait for the next pass (rev
	 * persists), behind the comms whose bytes arrived meanwhile
	 * (core/pass.h); what is in memory already epoll cannot report. */
	if (w->sock.reading && !w->sock.base.ended && io_more(w))
		tw__sock_read_again(&w->sock);
}

/* After a close was sent and received (or the peer vanished): close TCP
 * and end the comm. */
static void end_after_close(struct ws *w)
{
	int err = w->err_after_close;
	w->state = WS_DONE;
	if (err == 0 && w->sock.queued_bytes > 0) {
		/* the peer closed before it had all we queued */
		if (w->sock.base.error[0] == '\0')
			tw__comm_seterr(&w->sock.base, "closed by peer");
		err = TW_ECLOSED;
	}
	tw__comm_end(&w->sock.base, err);
}

/* Closing: ask the linger whether the close is over (tw__linger_due).
 * Our end is our close frame, written; the peer's is its close frame
 * (while failing we read none: nothing of the peer's counts then). */
static void linger_check(struct ws *w)
{
	int r = tw__sock_linger(&w->sock, w->close_sent && w->ctrl_len == 0,
				w->close_rcvd || w->failing);
	if (r > 0) {
		end_after_close(w);
		return;
	}
	if (r < 0) {
		w->state = WS_DONE;
		tw__comm_end(&w->sock.base,
			     w->err_after_close != 0 ? w->err_after_close : TW_ETIMEDOUT);
	}
}

static void start_linger(struct ws *w)
{
	tw__linger_start(&w->sock.base, w->sock.fd);
}

/* Failing: our close frame is out; FIN too, and end once the peer's TCP
 * has every byte (the replies before the close). */
static void fail_sent(struct ws *w)
{
	event_del(w->sock.wev);
	w->sock.io->shutdown(w->sock.io_arg, w->sock.fd);
	w->sock.base.linger.fin = 1;
	linger_check(w);
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
		linger_check(w);
}

/* Closing: drop data, look only for the peer's close frame or EOF. */
static void read_closing(struct ws *w)
{
	size_t budget = tw__pass_read(event_get_base(w->sock.rev), IO_BUDGET);
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
			end_after_close(w);
			return;
		}
		if (rv == 1 && ev.type == TW__WS_EV_CLOSE) {
			got_close(w, &ev);
			return;
		}
		if (rv < 0) {
			w->close_rcvd = 1;
			if (w->ctrl_len == 0)
				end_after_close(w);
			return;
		}
		if ((budget = tw__pass_spent(budget, (size_t)n)) == 0)
			return;
	}
	if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
		end_after_close(w);
}

static void upgrade_read(struct ws *w);

static void read_ready(struct ws *w)
{
	if (w->state == WS_UPGRADE) {
		upgrade_read(w);
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

static void on_readable(struct tw__sock *sock)
{
	read_ready((struct ws *)sock);
	tw__pass_close(); /* the comm's turn ends (core/pass.h) */
}

/* Comm operations. */

static int w_start(tw_comm *c)
{
	struct ws *w = (struct ws *)c;
	w->sock.reading = 1;
	/* Time we did not read was ours: restart the clock. */
	if (w->state == WS_OPEN && rx_busy(&w->sock))
		tw__comm_rate_watch(c, 1);
	if (!event_pending(w->sock.rev, EV_READ, NULL) && event_add(w->sock.rev, NULL) != 0)
		return TW_EIO;
	tw__sock_read_again(&w->sock); /* bytes may wait in pre or TLS */
	return 0;
}

static void w_close(tw_comm *c)
{
	struct ws *w = (struct ws *)c;
	if (w->state != WS_OPEN)
		return;
	w->state = WS_CLOSING;
	w->err_after_close = 0;
	tw__comm_rate_stop(c); /* input is dropped from now on */
	tw__comm_rx_release(c);
	event_add(w->sock.rev, NULL);
	start_linger(w);
	event_active(w->sock.wev, EV_WRITE, 0);
}

/* Bad input above the transport (a request that is not a map): close
 * 1008, policy violation (RFC 6455 section 7.4.1), after the replies. */
static void w_fail(tw_comm *c, int err)
{
	struct ws *w = (struct ws *)c;
	if (w->state != WS_OPEN || w->close_sent) {
		tw__comm_end(c, err);
		return;
	}
	fail_after_replies(w, err, TW__WS_CLOSE_POLICY, "bad request");
}

/* Stopped: an ended comm holds no memory for its peer's bytes. */
static void stopped(struct tw__sock *sock)
{
	reset_rx((struct ws *)sock);
}

static void drop_out(struct tw__sock *sock, void *entry)
{
	out_free((struct ws *)sock, entry);
}

static void fini(struct tw__sock *sock)
{
	struct ws *w = (struct ws *)sock;
	reset_rx(w);
	tw__ws_req_fini(&w->req);
	tw__ws_client_fini(&w->hs);
	free(w->scratch);
	free(w->pre);
	free(w->hs_out);
}

static void w_set_place(tw_comm *c, tw__place_fn fn, void *arg)
{
	((struct ws *)c)->place = fn;
	((struct ws *)c)->place_arg = arg;
}

static const struct tw__comm_ops ws_ops = {
	w_start,     w_write,        tw__sock_queued,     w_close, tw__sock_stop, tw__sock_destroy,
	w_set_place, tw__sock_pause, tw__sock_rx_pending, w_fail,
};

/* The upgrade. */

/* The upgrade failed or timed out: report (client) and free. */
/* "refused" only when the server answered with a refusal (TW_EPROTO);
 * "timed out" when nothing (or not all) came back in time. */
static void upgrade_failed(struct ws *w, int err, const char *why)
{
	tw_connect_cb cb = w->cb;
	void *arg = w->cb_arg;
	tw_listener *l = w->client ? NULL : w->l;
	char peer[sizeof(w->sock.base.peer)];
	memcpy(peer, w->sock.base.peer, sizeof(peer));
	if (!w->client)
		tw__ctx_seterr(w->sock.base.ctx, "WebSocket upgrade of a client (%s) %s: %s",
			       w->sock.base.peer, err == TW_ETIMEDOUT ? "timed out" : "failed",
			       why);
	else
		tw__ctx_seterr(w->sock.base.ctx, "WebSocket upgrade %s (%s): %s",
			       err == TW_EPROTO      ? "refused by the server"
			       : err == TW_ETIMEDOUT ? "timed out"
						     : "failed",
			       w->sock.base.peer, why);
	w->sock.base.node.connect_arg = NULL;
	tw_comm_free(&w->sock.base);
	if (cb != NULL)
		cb(NULL, err, arg);
	else if (l != NULL) /* after the free: the callback may free l, and its upgrades */
		tw__listener_failed(l, err, peer, l->ctx->error);
}

static void upgrade_done(struct ws *w)
{
	tw_connect_cb cb = w->cb;
	event_del(w->sock.timer);
	w->sock.base.node.connect_arg = NULL; /* handed out: no longer a connect */
	w->state = WS_OPEN;
	/* What only the upgrade needed goes: an idle comm keeps its state. */
	tw__ws_req_fini(&w->req);
	tw__ws_client_fini(&w->hs);
	free(w->hs_out);
	w->hs_out = NULL;
	event_del(w->sock.rev);
	event_del(w->sock.wev);
	if (cb != NULL)
		cb(&w->sock.base, 0, w->cb_arg);
	else
		w->l->accept_cb(w->l, &w->sock.base, w->l->arg);
}

static void upgrade_write(struct ws *w)
{
	while (w->hs_sent < w->hs_len) {
		struct iovec iov = {w->hs_out + w->hs_sent, w->hs_len - w->hs_sent};
		ssize_t n = w->sock.io->writev(w->sock.io_arg, w->sock.fd, &iov, 1);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
			event_add(w->sock.wev, NULL); /* rare: a 300-byte write on a fresh socket */
			return;
		}
		if (n < 0) {
			upgrade_failed(w, TW_EIO, io_error(w));
			return;
		}
		w->hs_sent += (size_t)n;
	}
	event_del(w->sock.wev);
	if (w->refuse) {
		upgrade_failed(w, TW_EPROTO, tw__ws_req_error(&w->req));
		return;
	}
	if (!w->client)
		upgrade_done(w);
}

/* Bytes read past the header block belong to the frame decoder: kept
 * until it takes them. 0, or -1 when the upgrade failed (w is gone). */
static int keep_rest(struct ws *w, const uint8_t *p, size_t n)
{
	if (n == 0)
		return 0;
	if ((w->pre = malloc(n)) == NULL) {
		upgrade_failed(w, TW_ENOMEM, "out of memory");
		return -1;
	}
	memcpy(w->pre, p, n);
	w->pre_len = n;
	w->pre_off = 0;
	return 0;
}

/* One read of the upgrade: 1 to read again, 0 when done (or waiting). */
static int upgrade_read_once(struct ws *w)
{
	uint8_t buf[1024];
	struct iovec iov = {buf, sizeof(buf)};
	ssize_t n = w->sock.io->readv(w->sock.io_arg, w->sock.fd, &iov, 1);
	size_t used = 0;
	int rv;
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return 0;
	if (n <= 0) {
		upgrade_failed(w, n == 0 ? TW_ECLOSED : TW_EIO,
			       n == 0 ? "connection closed during the upgrade" : io_error(w));
		return 0;
	}
	if (w->client) {
		rv = tw__ws_client_feed(&w->hs, buf, (size_t)n, &used);
		if (rv < 0)
			upgrade_failed(w, TW_EPROTO, tw__ws_client_error(&w->hs));
		if (rv != 1)
			return rv == 0;
		if (keep_rest(w, buf + used, (size_t)n - used) == 0)
			upgrade_done(w);
		return 0;
	}
	rv = tw__ws_req_feed(&w->req, buf, (size_t)n, &used);
	if (rv < 0)
		upgrade_failed(w, rv, "out of memory");
	if (rv != 1)
		return rv == 0;
	event_del(w->sock.rev);
	if (keep_rest(w, buf + used, (size_t)n - used) != 0)
		return 0;
	w->refuse = tw__ws_req_status(&w->req) != 101;
	rv = tw__ws_req_response(&w->req, w->hs_out, TW__WS_REQUEST_MAX);
	w->hs_len = rv > 0 ? (size_t)rv : 0;
	upgrade_write(w);
	return 0;
}

/* Read until the upgrade is judged or nothing is left: TLS may hold
 * bytes already taken from the socket, which readiness will not report. */
static void upgrade_read(struct ws *w)
{
	while (upgrade_read_once(w))
		;
}

/* The shell's timer times the upgrade, then the close linger. */
static void on_timer(struct tw__sock *sock)
{
	struct ws *w = (struct ws *)sock;
	char why[160];
	if (w->state == WS_UPGRADE) {
		/* the connect timeout as set: it ran from the connect's start */
		snprintf(why, sizeof(why), "no %s within %u ms (the %s)",
			 w->client ? "answer from the server" : "upgrade request",
			 (unsigned)(w->by_connect ? w->sock.base.limits.connect_timeout_ms
						  : w->upgrade_ms),
			 w->by_connect ? "connect timeout" : "handshake timeout");
		upgrade_failed(w, TW_ETIMEDOUT, why);
	} else
		linger_check(w);
}

static const struct tw__sock_hooks ws_hooks = {
	.readable = on_readable,
	.writable = on_writable,
	.timer = on_timer,
	.rx_busy = rx_busy,
	.open = rx_open,
	.too_slow = too_slow,
	.drop = drop_out,
	.stopped = stopped,
	.fini = fini,
};

/* deadline_ms: a client's connect deadline (0: none). */
static int ws_new(tw_context *ctx, int fd, const struct tw__stream_io *io, void *io_arg, int client,
		  uint64_t deadline_ms, struct ws **out)
{
	struct ws *w = calloc(1, sizeof(*w));
	struct timeval tv;
	if (w == NULL)
		return TW_ENOMEM;
	if ((w->hs_out = malloc(TW__WS_REQUEST_MAX)) == NULL ||
	    tw__sock_init(&w->sock, &ws_ops, &ws_hooks, ctx, fd, io == &tw__tcp_io ? "ws" : "wss",
			  io, io_arg, sizeof(struct out_msg)) != 0) {
		free(w->hs_out);
		free(w);
		return TW_ENOMEM;
	}
	w->client = client;
	tw__ws_dec_init(&w->dec, client ? TW__WS_CLIENT : TW__WS_SERVER,
			ctx->limits.max_message_bytes, ctx->limits.ws_max_fragments);
	tw__ws_ping_rate_init(&w->pings, ctx->limits.ws_min_ping_interval_ms,
			      ctx->limits.ws_ping_strikes);
	tw__ws_req_init(&w->req, 0, 0);
	w->upgrade_ms = tw__stage_ms(deadline_ms, ctx->limits.handshake_timeout_ms, &w->by_connect);
	tv.tv_sec = (time_t)(w->upgrade_ms / 1000);
	tv.tv_usec = (suseconds_t)(w->upgrade_ms % 1000) * 1000;
	evtimer_add(w->sock.timer, &tv);
	*out = w;
	return 0;
}

/* Entry points: after TCP (ws) or TLS (wss). */

static void client_then(tw_context *ctx, int fd, const struct tw__stream_io *io, void *io_arg,
			const struct tw__uri *u, tw_connect_cb cb, void *arg, tw_listener *l,
			uint64_t deadline_ms, const struct sockaddr *peer)
{
	struct ws *w;
	int rv, len;
	(void)l;
	(void)peer;
	if ((rv = ws_new(ctx, fd, io, io_arg, 1, deadline_ms, &w)) != 0) {
		tw__ctx_seterr(ctx, "WebSocket upgrade: %s", tw_strerror(rv));
		if (io->free != NULL)
			io->free(io_arg);
		close(fd);
		cb(NULL, rv, arg);
		return;
	}
	w->cb = cb;
	w->cb_arg = arg;
	w->sock.base.node.connect_arg = arg; /* tw__connect_cancel finds it */
	if ((rv = tw__ws_client_init(&w->hs, 0, 0)) != 0 ||
	    (len = tw__ws_client_request(&w->hs, u->host, u->port, w->hs_out, TW__WS_REQUEST_MAX)) <
		    0) {
		upgrade_failed(w, rv != 0 ? rv : TW_EADDR, "cannot build the upgrade request");
		return;
	}
	w->hs_len = (size_t)len;
	event_add(w->sock.rev, NULL);
	upgrade_write(w);
}

static void server_then(tw_context *ctx, int fd, const struct tw__stream_io *io, void *io_arg,
			const struct tw__uri *u, tw_connect_cb cb, void *arg, tw_listener *l,
			uint64_t deadline_ms, const struct sockaddr *peer)
{
	struct ws *w;
	(void)u;
	(void)cb;
	(void)arg;
	if (ws_new(ctx, fd, io, io_arg, 0, deadline_ms, &w) != 0) {
		if (io->free != NULL)
			io->free(io_arg);
		close(fd);
		return;
	}
	tw__comm_set_peer(&w->sock.base, peer, io == &tw__tcp_io ? "ws" : "wss");
	w->l = l;
	event_add(w->sock.rev, NULL);
	event_active(w->sock.rev, EV_READ, 0); /* TLS may hold the request already */
}

static void plain_client(tw_context *ctx, int fd, const struct tw__uri *u, tw_connect_cb cb,
			 void *arg, tw__then_fn then, uint64_t deadline_ms)
{
	(void)then;
	client_then(ctx, fd, &tw__tcp_io, NULL, u, cb, arg, NULL, deadline_ms, NULL);
}

static void plain_accept(tw_listener *l, int fd, const struct sockaddr *peer)
{
	server_then(l->ctx, fd, &tw__tcp_io, NULL, NULL, NULL, NULL, l, 0, peer);
}

/* A freed listener must not be reached by upgrades it started. */
static void (*_Atomic tcp_destroy)(tw_listener *l);
static void (*_Atomic tls_destroy)(tw_listener *l);

static void drop_upgrades(tw_listener *l)
{
	struct tw__node *head = &l->ctx->objects, *n, *next;
	for (n = head->next; n != head; n = next) {
		tw_comm *c = tw__node_comm(n);
		next = n->next;
		if (c != NULL && c->ops == &ws_ops && ((struct ws *)c)->l == l &&
		    ((struct ws *)c)->state == WS_UPGRADE)
			tw_comm_free(c);
	}
}

static void ws_listener_destroy(tw_listener *l)
{
	drop_upgrades(l);
	atomic_load_explicit(&tcp_destroy, memory_order_relaxed)(l);
}

static void wss_listener_destroy(tw_listener *l)
{
	drop_upgrades(l);
	atomic_load_explicit(&tls_destroy, memory_order_relaxed)(l);
}

/* Connectors send `GET /`, the only path a listener (ours, Dask's)
 * serves: a URI naming another would be silently ignored, so it is
 * refused, by tw_listener_new and tw_comm_connect alike, saying why. */
static int path_refused(tw_context *ctx, const struct tw__uri *u)
{
	char addr[TW__URI_TEXT_BYTES];
	if (strcmp(u->path, "/") == 0)
		return 0;
	tw__uri_format(u->scheme, u->host, u->port, addr, sizeof(addr));
	tw__ctx_seterr(ctx, "%s%s: WebSocket comms are served at path / only (as Dask's)", addr,
		       u->path);
	return TW_EADDR;
}

static int ws_listen(tw_context *ctx, const struct tw__uri *u, tw_accept_cb cb, void *arg,
		     tw_listener **out)
{
	int rv;
	if ((rv = path_refused(ctx, u)) != 0)
		return rv;
	if ((rv = tw__tcp_listen_with(ctx, u, "ws", plain_accept, cb, arg, out)) != 0)
		return rv;
	atomic_store_explicit(&tcp_destroy, (*out)->destroy, memory_order_relaxed);
	(*out)->destroy = ws_listener_destroy;
	return 0;
}

static int wss_listen(tw_context *ctx, const struct tw__uri *u, tw_accept_cb cb, void *arg,
		      tw_listener **out)
{
	int rv;
	if ((rv = path_refused(ctx, u)) != 0)
		return rv;
	if ((rv = tw__tls_listen_then(ctx, u, "wss", server_then, cb, arg, out)) != 0)
		return rv;
	atomic_store_explicit(&tls_destroy, (*out)->destroy, memory_order_relaxed);
	(*out)->destroy = wss_listener_destroy;
	return 0;
}

static int ws_connect(tw_context *ctx, const struct tw__uri *u, tw_connect_cb cb, void *arg)
{
	if (path_refused(ctx, u) != 0)
		return TW_EADDR;
	return tw__tcp_connect_with(ctx, u, plain_client, NULL, cb, arg);
}

static int wss_connect(tw_context *ctx, const struct tw__uri *u, tw_connect_cb cb, void *arg)
{
	if (path_refused(ctx, u) != 0)
		return TW_EADDR;
	return tw__tls_connect_then(ctx, u, client_then, cb, arg);
}

const struct tw__transport tw__ws_transport = {"ws", ws_listen, ws_connect};
const struct tw__transport tw__wss_transport = {"wss", wss_listen, wss_connect};
