/* SPDX-License-Identifier: BSD-3-Clause */
/* The WebSocket comm (ws://, wss://; docs/design.md, WebSocket), shared
 * by its files: ws.c opens it (connect, listen, the upgrade driver),
 * ws_send.c writes messages as frames, ws_recv.c reads frames into
 * messages, ws_ops.c holds its comm operations and how it closes. A
 * message of N frames is N + 1 binary WebSocket messages: 8 bytes holding
 * N, then one message per frame. It stands on the socket shell
 * (sock_comm.h), whose queue holds out_msg entries and whose timer times
 * the upgrade, then the close linger. Loop thread only. */
#ifndef TW_TRANSPORT_WS_COMM_H
#define TW_TRANSPORT_WS_COMM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/reap.h"
#include "transport/sock_comm.h"
#include "transport/ws_codec.h"
#include "transport/ws_upgrade.h"

/* A comm's reads and writes per loop pass, of the pass's (core/pass.h). */
#define TW__WSC_IO_BUDGET ((size_t)4 << 20)

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
	int refuse;                   /* server: a non-101 verdict is being written */
	uint32_t upgrade_ms;          /* the upgrade's bound */
	int by_connect;               /* client: that bound is the connect timeout's */
	uint64_t connect_deadline_ms; /* client: when the connect timeout runs out (0: none) */
	uint8_t *pre;                 /* bytes read with the upgrade that belong to frames */
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
	/* Our close frame waiting for a pass with time (core/reap.h): a mass
	 * close is not one long pass. */
	struct tw__reap close_wait;
	/* Failing for bad input with replies queued: they go out, then the
	 * close frame with this code and reason, and no input is processed
	 * (RFC 6455 section 7.1.7); input is read and dropped. */
	int failing;
	unsigned fail_code;
	char fail_why[123];
	int write_err; /* a write failed with it: so does a tw__wsc_read_rest that ends */
};

static inline struct out_msg *tw__wsc_out(const struct ws *w, size_t i)
{
	return tw__sockq_at(&w->sock.q, i);
}

/* ws_send.c */
/* The shell's write event: write queued frames and control frames. */
void tw__wsc_writable(struct tw__sock *sock);
/* tw_comm_write: queue msg as WebSocket messages (ownership as there). */
int tw__wsc_write(tw_comm *c, tw_msg *msg);
/* Free a queued message that leaves the queue. */
void tw__wsc_out_free(struct ws *w, struct out_msg *m);
/* Control frames (pongs, closes) go out between data frames: one begun
 * goes out whole; a new one is encoded at ctrl_slot and queued. */
int tw__wsc_ctrl_begun(const struct ws *w);
uint8_t *tw__wsc_ctrl_slot(struct ws *w);
void tw__wsc_queue_ctrl(struct ws *w, int len);
/* Best effort, for a comm the caller ends next: one write of a close
 * frame, with the socket's release (now, or parked on a later pass). */
void tw__wsc_send_close_now(struct ws *w, unsigned code, const char *why);

/* ws_recv.c */
/* The shell's read event, in every state (upgrade, open, closing). */
void tw__wsc_readable(struct tw__sock *sock);
/* A message (or a WebSocket frame) is partly received. */
int tw__wsc_rx_busy(const struct tw__sock *sock);
/* Drop the message in progress and give back its receive budget. */
void tw__wsc_reset_rx(struct ws *w);
/* Read what the socket still holds after a failed write; 1 when the
 * comm may still be used. */
int tw__wsc_read_rest(struct ws *w);

/* ws_ops.c */
extern const struct tw__comm_ops tw__wsc_ops;
extern const struct tw__sock_hooks tw__wsc_hooks;
/* Fail the comm for bad input: close code, then end with err (after
 * the replies already queued, when there are some). */
void tw__wsc_fail_proto(struct ws *w, int err, unsigned code, const char *why);
/* The peer's close frame arrived. */
void tw__wsc_got_close(struct ws *w, const struct tw__ws_event *ev);
/* Close frames sent and received (or the peer vanished): end the comm. */
void tw__wsc_end_after_close(struct ws *w);
/* The close linger: start it; ask it whether the close is over. */
void tw__wsc_start_linger(struct ws *w);
void tw__wsc_linger_check(struct ws *w);
/* Failing: our close frame is out. */
void tw__wsc_fail_sent(struct ws *w);

/* ws.c: the upgrade driver */
void tw__wsc_upgrade_write(struct ws *w);
void tw__wsc_upgrade_read(struct ws *w);
/* The upgrade's bound passed: fail it (the comm is freed). */
void tw__wsc_upgrade_timeout(struct ws *w);

#endif
