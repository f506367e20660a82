/* SPDX-License-Identifier: BSD-3-Clause */
/* The comm operations of a WebSocket comm (ws_comm.h) and how it ends:
 * close frames both ways (RFC 6455 section 5.5.1), failing for bad input
 * after the replies (section 7.1.7), bounded by the close linger. */
#include <stdio.h>
#include <stdlib.h>

#include <event2/event.h>

#include <taskwire/error.h>

#include "transport/comm_budget.h"
#include "transport/ws_comm.h"

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
	tw__wsc_start_linger(w);
	event_active(w->sock.wev, EV_WRITE, 0);
}

/* Bad input while requests before it are still to be delivered (decoding
 * on the offload pool): nothing more is read, and the fail runs with its
 * close code once they are (tw__comm_delivered calls w_fail), so that
 * their replies go out first (evidence18 D1, as stream_comm.c does). 1
 * when deferred. */
static int defer_fail(struct ws *w, int err, unsigned code, const char *why)
{
	if (w->state != WS_OPEN || w->close_sent || !tw__comm_defer_fail(&w->sock.base, err))
		return 0;
	w->fail_code = code;
	snprintf(w->fail_why, sizeof(w->fail_why), "%s", why);
	event_del(w->sock.rev);
	w->sock.reading = 0;
	tw__comm_rate_stop(&w->sock.base);
	tw__wsc_reset_rx(w);
	return 1;
}

/* Fail the comm: send the close code, then end with err. */
void tw__wsc_fail_proto(struct ws *w, int err, unsigned code, const char *why)
{
	tw__comm_seterr(&w->sock.base, "%s (WebSocket close %u)", why, code);
	if (defer_fail(w, err, code, why))
		return;
	/* closing (tw_comm_close), our close frame waits for the replies */
	if (!w->close_sent &&
	    (w->state == WS_CLOSING || (w->state == WS_OPEN && w->sock.q.n > 0))) {
		fail_after_replies(w, err, code, why);
		return;
	}
	tw__wsc_send_close_now(w, code, why);
	tw__comm_end(&w->sock.base, err);
}

/* The peer's close frame. Unless ours went out, it is answered at once
 * (RFC 6455 section 5.5.1): at the end of the frame being written (a
 * control frame may come between fragments), never after the rest of
 * the queue, which the peer would not read; the linger bounds the wait
 * for that boundary. What stays queued is not delivered: the comm then
 * ends with an error that says how much. */
void tw__wsc_got_close(struct ws *w, const struct tw__ws_event *ev)
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
		tw__wsc_queue_ctrl(w, tw__ws_encode_close(tw__wsc_ctrl_slot(w), ev->code, NULL, 0,
							  w->client ? key : NULL));
		w->close_sent = 1;
		w->state = WS_CLOSING;
		/* no data after our close (RFC 6455 5.5.1) */
		tw__comm_closing(&w->sock.base);
		tw__comm_rate_stop(&w->sock.base);
		tw__wsc_start_linger(w);
		return;
	}
	if (w->ctrl_len == 0)
		tw__wsc_end_after_close(w);
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
	tw__wsc_send_close_now(w, TW__WS_CLOSE_POLICY, "message arriving too slowly");
	tw__comm_end(&w->sock.base, TW_ETIMEDOUT);
}

/* After a close was sent and received (or the peer vanished): close TCP
 * and end the comm. */
void tw__wsc_end_after_close(struct ws *w)
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
void tw__wsc_linger_check(struct ws *w)
{
	int r = tw__sock_linger(&w->sock, w->close_sent && w->ctrl_len == 0,
				w->close_rcvd || w->failing);
	if (r > 0) {
		tw__wsc_end_after_close(w);
		return;
	}
	if (r < 0) {
		w->state = WS_DONE;
		tw__comm_end(&w->sock.base,
			     w->err_after_close != 0 ? w->err_after_close : TW_ETIMEDOUT);
	}
}

void tw__wsc_start_linger(struct ws *w)
{
	tw__linger_start(&w->sock.base, w->sock.fd);
}

/* Failing: our close frame is out; FIN too, and end once the peer's TCP
 * has every byte (the replies before the close). */
void tw__wsc_fail_sent(struct ws *w)
{
	event_del(w->sock.wev);
	w->sock.io->shutdown(w->sock.io_arg, w->sock.fd);
	w->sock.base.linger.fin = 1;
	tw__wsc_linger_check(w);
}

static int w_start(tw_comm *c)
{
	struct ws *w = (struct ws *)c;
	if (c->fail_deferred)
		return 0; /* bad input came: nothing more is read */
	w->sock.reading = 1;
	/* Time we did not read was ours: restart the clock. */
	if (w->state == WS_OPEN && tw__wsc_rx_busy(&w->sock))
		tw__comm_rate_watch(c, 1);
	if (!event_pending(w->sock.rev, EV_READ, NULL) && event_add(w->sock.rev, NULL) != 0)
		return TW_EIO;
	tw__sock_read_again(&w->sock); /* bytes may wait in pre or TLS */
	return 0;
}

static void w_close(tw_comm *c)
{
	struct ws *w = (struct ws *)c;
	char why[sizeof(w->fail_why)];
	if (w->state != WS_OPEN)
		return;
	if (c->fail_deferred != 0) {
		/* Bad input came, its fail deferred (a handler closes, as the
		 * close op does): the close is that fail, replies first, then
		 * the input's code. A plain close read on from inside the bad
		 * frame and ended at its garbage with the replies queued
		 * (breaker21). */
		int err = c->fail_deferred;
		c->fail_deferred = 0;
		snprintf(why, sizeof(why), "%s", w->fail_why);
		fail_after_replies(w, err, w->fail_code, why);
		return;
	}
	w->state = WS_CLOSING;
	w->err_after_close = 0;
	tw__comm_rate_stop(c); /* input is dropped from now on */
	tw__comm_rx_release(c);
	event_add(w->sock.rev, NULL);
	tw__wsc_start_linger(w);
	event_active(w->sock.wev, EV_WRITE, 0);
}

/* Bad input above the transport (a request that is not a map): close
 * 1008, policy violation (RFC 6455 section 7.4.1), after the replies.
 * A fail deferred by defer_fail sends the code it kept. */
static void w_fail(tw_comm *c, int err)
{
	struct ws *w = (struct ws *)c;
	char why[sizeof(w->fail_why)];
	unsigned code = w->fail_code != 0 ? w->fail_code : TW__WS_CLOSE_POLICY;
	snprintf(why, sizeof(why), "%s", w->fail_code != 0 ? w->fail_why : "bad request");
	if (w->state == WS_CLOSING) {
		/* The close goes on (bounded by the linger) and ends with err:
		 * ending now dropped the replies it was writing (breaker21).
		 * Our close frame not yet out carries the code. */
		if (!w->close_sent && !w->failing)
			fail_after_replies(w, err, code, why);
		else if (w->err_after_close == 0)
			w->err_after_close = err;
		return;
	}
	if (w->state != WS_OPEN || w->close_sent) {
		tw__comm_end(c, err);
		return;
	}
	if (w->sock.q.n == 0) {
		tw__wsc_send_close_now(w, code, why);
		tw__comm_end(c, err);
		return;
	}
	fail_after_replies(w, err, code, why);
}

/* Stopped: an ended comm holds no memory for its peer's bytes. */
static void stopped(struct tw__sock *sock)
{
	tw__reap_cancel(sock->base.ctx, &((struct ws *)sock)->close_wait);
	tw__wsc_reset_rx((struct ws *)sock);
}

static void drop_out(struct tw__sock *sock, void *entry)
{
	tw__wsc_out_free((struct ws *)sock, entry);
}

static void fini(struct tw__sock *sock)
{
	struct ws *w = (struct ws *)sock;
	tw__wsc_reset_rx(w);
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

const struct tw__comm_ops tw__wsc_ops = {
	w_start,
	tw__wsc_write,
	tw__sock_queued,
	w_close,
	tw__sock_stop,
	tw__sock_destroy,
	w_set_place,
	tw__sock_pause,
	tw__sock_rx_pending,
	w_fail,
	tw__sock_acked,
	NULL, /* no watch timed by the pause limit: ws relays nothing */
};

/* The shell's timer times the upgrade, then the close linger. */
static void on_timer(struct tw__sock *sock)
{
	struct ws *w = (struct ws *)sock;
	if (w->state == WS_UPGRADE)
		tw__wsc_upgrade_timeout(w);
	else
		tw__wsc_linger_check(w);
}

const struct tw__sock_hooks tw__wsc_hooks = {
	.readable = tw__wsc_readable,
	.writable = tw__wsc_writable,
	.timer = on_timer,
	.rx_busy = tw__wsc_rx_busy,
	.open = rx_open,
	.too_slow = too_slow,
	.drop = drop_out,
	.stopped = stopped,
	.fini = fini,
};
