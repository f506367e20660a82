/* SPDX-License-Identifier: BSD-3-Clause */
/* A comm over a stream socket with stream framing: the receive loop reads
 * straight into each message's blocks (frame_rx), the send loop writes
 * preludes and frames with scatter-gather writes from the frames' own
 * memory. The byte I/O (plain socket or TLS) comes from a tw__stream_io. */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>

#include <event2/event.h>

#include <taskwire/error.h>

#include "core/msg.h"
#include "core/pass.h"
#include "core/reap.h"
#include "transport/comm_budget.h"
#include "transport/frame_rx.h"
#include "transport/gather.h"
#include "transport/relay.h"
#include "transport/sock_comm.h"
#include "transport/stream_comm.h"

#define IOV_BATCH 64
/* Bytes read per wakeup before yielding to the other comms of the loop:
 * about a millisecond of copying, so a large message never holds the loop
 * for long. */
#define READ_BUDGET ((size_t)4 << 20)
/* ... and at most this many reads: a message of 60,000 tiny frames, each
 * read on its own once placement is per frame, must not hold it either. */
#define READ_CALLS 256
/* The same for writes: a fast reader must not keep one large send going
 * while the loop's other comms wait. */
#define WRITE_BUDGET ((size_t)4 << 20)
/* Largest read-ahead after a run of small messages (frame_rx.h): one
 * read per small message instead of two; a misprediction copies at most
 * this much. */
#define GULP_MAX 4096
/* ... and of a pipelined stream (reads that fill the read-ahead): about
 * 160 messages of 100 B a read, as ZeroMQ's 8 KiB reads take 80. Over
 * TLS a large message right after such a stream has at most this much
 * copied. */
#define GULP_PIPE_MAX 16384
/* ... over tcp, where a read-ahead is two syscalls (peek, then discard
 * what was taken) and copies nothing: four times as much per read, so a
 * stream of 1 KiB messages takes fewer syscalls than the 16 KiB reads did
 * (oneway, 200,000 x 1 KiB: 14,716 recvfrom before peeking, 32,230 with
 * 16 KiB peeks, 11,380 with these). A message kept holds its block. */
#define GULP_PIPE_PEEK_MAX 65536
/* Preludes of up to 6 frames live in the queue entry: no allocation for
 * the messages of small RPCs. */
#define PRELUDE_INLINE 64

struct wq_entry {
	tw_msg *msg;
	uint8_t *prelude; /* NULL: in prelude_inline (entries move as the ring grows) */
	size_t prelude_len;
	uint64_t wire_len;
	size_t cost; /* bookkeeping beyond wire_len: the entry, prelude and message */
	uint8_t prelude_inline[PRELUDE_INLINE];
};

static uint8_t *prelude_of(struct wq_entry *e)
{
	return e->prelude != NULL ? e->prelude : e->prelude_inline;
}

/* The socket shell (sock_comm.h) holds the socket, its events and the
 * queue of wq_entry; this is the stream framing on it. */
struct stream {
	struct tw__sock sock;
	struct tw__rx rx;
	uint64_t head_sent;
	/* What the queued messages cost beyond their bytes (queue entries,
	 * message objects, block headers): the write high-water mark counts
	 * it, as 100-byte messages cost about three times their bytes. */
	uint64_t queued_cost;
	/* Where the head entry's unsent bytes start: part head_part (0: the
	 * prelude, j: frame j-1) at head_off. A cursor, so a message of many
	 * frames is walked once in all, not from its start at every write. */
	size_t head_part;
	uint64_t head_off;
	int closing;     /* 1: flushing, 2: FIN sent, waiting for the peer's */
	int peer_eof;    /* the peer's FIN came while we were closing */
	int fail_err;    /* closing after bad input: the close ends with it */
	int in_read;     /* inside on_readable: writes wait for its end */
	int rx_large;    /* the message in progress is large: it holds receive budget */
	uint64_t rx_got; /* ... and this many of its bytes were read after its head */
	int write_held;  /* a write came meanwhile: on_readable flushes */
	/* The relay of the last message's tail: the socket's next bytes are
	 * its frames, so nothing is read until it is done. */
	struct tw__relay *relay;
	/* It claimed a relay frame once: its queue's messages may hold some
	 * (entry_relayed looks). */
	int relays;
	/* The end (send_end) waiting for a pass with time (core/reap.h). */
	struct tw__reap end_wait;
	/* Its peer takes nothing while a relay's source waits for us
	 * (watch_relay_stall): looks every eighth of the pause limit; the
	 * bytes its peer had acknowledged. */
	struct event *relay_stall_ev;
	uint64_t relay_stall_acked, relay_still_ms; /* ... and since when (tw__mono_ms) */
};

extern const struct tw__stream_io tw__tcp_io;

/* Claims of e's relay frames dropped: what was not written is drained. */
static void unclaim_entry(struct wq_entry *e)
{
	const tw_slice *f = tw__msg_frames(e->msg);
	for (size_t j = 0; j < tw_msg_nframes(e->msg); j++) {
		size_t i;
		struct tw__relay *r = tw__relay_of(&f[j], &i);
		if (r != NULL)
			tw__relay_unclaim(r, i);
	}
}

static struct wq_entry *entry(const struct stream *s, size_t i)
{
	return tw__sockq_at(&s->sock.q, i);
}

/* The bytes of e's relay frames, which were in no budget: none unless
 * the comm ever claimed a relay frame (a walk of every message as it
 * left cost 100 B messages 6-8% of the sender's CPU: breaker20). */
static uint64_t entry_relayed(const struct stream *s, const struct wq_entry *e)
{
	return s->relays ? tw__relay_bytes(e->msg) : 0;
}

/* The comm stopped with e queued: its relay frames' claims go back. */
static void drop_entry(struct tw__sock *sock, void *entry)
{
	struct wq_entry *e = entry;
	unclaim_entry(e);
	tw__sock_msg_gone(sock, e->msg, entry_relayed((struct stream *)sock, e));
	free(e->prelude);
}

/* Part j of e: its prelude (j == 0), then frame j-1. */
static size_t part_len(struct wq_entry *e, size_t j)
{
	return j == 0 ? e->prelude_len : tw__msg_frames(e->msg)[j - 1].len;
}

static uint8_t *part_data(struct wq_entry *e, size_t j)
{
	return j == 0 ? prelude_of(e) : tw_slice_data(&tw__msg_frames(e->msg)[j - 1]);
}

/* Fill iov with the unsent bytes of the queue, from the head's cursor on. */
static int gather(struct stream *s, struct iovec *iov, int max)
{
	size_t j0 = s->head_part;
	uint64_t off = s->head_off;
	int k = 0;
	for (size_t i = 0; i < s->sock.q.n && k < max; i++) {
		struct wq_entry *e = entry(s, i);
		size_t nparts = tw_msg_nframes(e->msg) + 1;
		for (size_t j = j0; j < nparts && k < max; j++) {
			size_t len = part_len(e, j), ri;
			if (j > 0 && off < len && tw__relay_of(&tw__msg_frames(e->msg)[j - 1], &ri))
				return k; /* spliced by pump_head, in its turn */
			if (off < len) {
				iov[k].iov_base = part_data(e, j) + off;
				iov[k].iov_len = len - off;
				k++;
			}
			off = 0;
		}
		j0 = 0;
	}
	return k;
}

/* Move the head's cursor n bytes on (n stays within the head entry). */
static void advance_cursor(struct stream *s, uint64_t n)
{
	struct wq_entry *e = entry(s, 0);
	while (n > 0) {
		uint64_t left = part_len(e, s->head_part) - s->head_off;
		if (n < left) {
			s->head_off += n;
			return;
		}
		n -= left;
		s->head_part++;
		s->head_off = 0;
	}
}

/* n bytes left (spliced from a relay's source: relayed): retire the
 * messages they complete. */
static void consume(struct stream *s, uint64_t n, int relayed)
{
	uint64_t was = s->head_sent;
	if (relayed)
		tw__sock_relayed(&s->sock, n);
	else
		tw__sock_sent(&s->sock, n);
	n += s->head_sent;
	while (s->sock.q.n > 0 && n >= entry(s, 0)->wire_len) {
		struct wq_entry *e = entry(s, 0);
		n -= e->wire_len;
		s->queued_cost -= e->cost;
		tw__sock_msg_gone(&s->sock, e->msg, entry_relayed(s, e));
		free(e->prelude);
		tw__sockq_pop(&s->sock.q);
		TW__COUNT(&s->sock.base.stats, msgs_sent, 1);
		s->head_part = 0;
		s->head_off = 0;
		was = 0;
	}
	s->head_sent = n;
	if (s->sock.q.n > 0)
		advance_cursor(s, n - was);
}

static void finish_close(struct stream *s);
static const char *io_error(struct stream *s)
{
	return tw__sock_io_error(&s->sock);
}

/* A relay destination whose peer takes nothing holds up the relay's
 * source: its socket fills, and the source's peer's own TCP timeout
 * (Dask's 30 s) ends that connection (user19: a client that never read
 * its relayed gather made tw-mini-scheduler lose every worker holding its
 * keys). So the destination is ended once its peer acknowledged none of
 * our bytes for the pause limit (tw_context_set_receive_budget_pause_ms,
 * 20 s, below that timeout; 0: never) while it held a source up (a relay
 * frame of its queue is its relay's next: at the head, or behind bytes in
 * memory the peer does not take: breaker20 F2), as the memory limit
 * judges a comm whose peer stands still; its claim is dropped and the
 * source goes on (the rest of the frame is drained). */

/* Bytes of frame j of entry k not yet written (the head: from its
 * cursor). */
static uint64_t frame_left(const struct stream *s, size_t k, size_t j)
{
	uint64_t len = tw__msg_frames(entry(s, k)->msg)[j].len;
	return k == 0 && j + 1 == s->head_part ? len - s->head_off : len;
}

/* Some relay frame of the queue is its relay's next: its source waits
 * for us. Looks no further than the last relay frame (relay_queued). */
static int holds_source(const struct stream *s)
{
	uint64_t left = s->sock.base.relay_queued;
	for (size_t k = 0; k < s->sock.q.n && left > 0; k++) {
		const tw_msg *m = entry(s, k)->msg;
		size_t j = k == 0 && s->head_part > 0 ? s->head_part - 1 : 0, i;
		for (; j < tw_msg_nframes(m) && left > 0; j++) {
			struct tw__relay *r = tw__relay_of(&tw__msg_frames(m)[j], &i);
			uint64_t n;
			if (r == NULL)
				continue;
			if (tw__relay_turn(r, i))
				return 1;
			n = frame_left(s, k, j);
			left -= n < left ? n : left;
		}
	}
	return 0;
}

/* How often the watch looks at what the peer acknowledged: an eighth of
 * the pause limit (at least 10 ms), so the end comes at most that much
 * after the pause limit. A watch that re-armed a whole pause limit each
 * time it saw bytes taken ended the comm up to twice the pause limit
 * after its peer's last acknowledgement (its receive buffer fills for a
 * few ms after the watch starts), 40 s with the defaults: past the
 * source's peer's 30 s TCP timeout (breaker20 F1). */
static struct timeval stall_step(uint32_t ms)
{
	/* with the limit off (0) the watch still looks every second, ending
	 * nobody, so that a limit set later applies (breaker20: a limit set
	 * to 0 and back never looked at a destination stuck meanwhile) */
	uint32_t step = ms == 0 ? 1000 : ms / 8 > 10 ? ms / 8 : 10;
	return (struct timeval){step / 1000, (step % 1000) * 1000};
}

static void relay_stalled(evutil_socket_t fd, short what, void *arg)
{
	struct stream *s = arg;
	tw_comm *c = &s->sock.base;
	uint32_t ms = c->ctx->limits.budget_pause_ms;
	uint64_t acked, now;
	int still;
	(void)fd;
	(void)what;
	if (c->relay_queued == 0 || c->relay_wait)
		return; /* nothing relayed left, or we wait for the source: a pump watches again */
	acked = tw__sock_acked(c);
	now = tw__mono_ms();
	still = acked == s->relay_stall_acked && holds_source(s);
	c->ctx->relay_still_looks += (uint64_t)still;
	/* it took some since the last look, or holds no source up (yet), or
	 * the limit is off: the stillness counts from now */
	if (!still || ms == 0) {
		s->relay_stall_acked = acked;
		s->relay_still_ms = now;
	}
	if (ms == 0 || now - s->relay_still_ms < ms) {
		struct timeval tv = stall_step(ms);
		event_add(s->relay_stall_ev, &tv);
		return;
	}
	tw__comm_seterr(
		c,
		"its peer took none of our bytes for %llu ms while a relayed frame's source "
		"waited for it (the pause limit of %u ms, "
		"tw_context_set_receive_budget_pause_ms)",
		(unsigned long long)(now - s->relay_still_ms), ms);
	c->reset_on_end = 1;
	tw__comm_end(c, TW_ETIMEDOUT);
}

/* The writer waits for our peer with relay frames queued (on: the watch
 * runs, its baseline kept while it does), or for a relay's source (off).
 * On whenever a pump did not wait for the source, not only when the
 * socket was full: a pump that used up the pass's budget waits for the
 * socket to be writable again, which a peer that stopped reading never
 * makes it. */
static void watch_relay_stall(struct stream *s, int on)
{
	uint32_t ms = s->sock.base.ctx->limits.budget_pause_ms;
	struct timeval tv = stall_step(ms);
	if (!on) {
		if (s->relay_stall_ev != NULL)
			event_del(s->relay_stall_ev);
		return;
	}
	if (s->relay_stall_ev == NULL &&
	    (s->relay_stall_ev = event_new(event_get_base(s->sock.wev), -1, 0, relay_stalled, s)) ==
		    NULL)
		return; /* no memory for the watch: the TCP timeout still ends it */
	if (!event_pending(s->relay_stall_ev, EV_TIMEOUT, NULL)) {
		s->relay_stall_acked = tw__sock_acked(&s->sock.base);
		s->relay_still_ms = tw__mono_ms();
		event_add(s->relay_stall_ev, &tv);
	}
}

/* The pause limit changed: a running watch looks now (a look event made
 * active runs from the loop, not inside the setter), and re-arms at the
 * new limit's step. Its baseline is kept: a peer that stood still for
 * longer than a lowered limit is ended at that look. */
static void s_pause_limit_set(tw_comm *c)
{
	struct stream *s = (struct stream *)c;
	if (s->relay_stall_ev == NULL || !event_pending(s->relay_stall_ev, EV_TIMEOUT, NULL))
		return;
	event_del(s->relay_stall_ev);
	event_active(s->relay_stall_ev, EV_TIMEOUT, 0);
}

/* The writer stops at bytes in memory (the socket is full, or the pass's
 * budget is spent) with relay frames queued behind them: a relay's source
 * may wait for those frames (holds_source). */
static void watch_bytes_before(struct stream *s)
{
	if (s->sock.base.relay_queued > 0)
		watch_relay_stall(s, 1);
}

/* Splice the head's relay frame from its source (transport/relay.h).
 * Returns 0 with *n bytes moved (0: wait, for the socket or the relay's
 * wake), or an error after which the comm has ended. */
static int pump_head(struct stream *s, size_t budget, ssize_t *n)
{
	struct wq_entry *e = entry(s, 0);
	size_t i, moved;
	struct tw__relay *r;
	int rv, err;
	while (s->head_off == part_len(e, s->head_part)) { /* empty frames before it */
		s->head_part++;
		s->head_off = 0;
	}
	r = tw__relay_of(&tw__msg_frames(e->msg)[s->head_part - 1], &i);
	rv = tw__relay_pump(r, i, s->sock.fd, budget, &moved);
	*n = (ssize_t)moved;
	/* waiting for the source, not for our peer (overload.c) */
	s->sock.base.relay_wait = rv == 0 && moved == 0;
	watch_relay_stall(s, !s->sock.base.relay_wait);
	if (rv == 0 && moved == 0)
		event_del(s->sock.wev); /* the relay wakes us in the frame's turn */
	else if (rv == TW_EAGAIN)
		event_add(s->sock.wev, NULL);
	if (rv == 0 || rv == TW_EAGAIN) {
		if (rv == TW_EAGAIN)
			*n = 0;
		return 0;
	}
	if (rv == TW_EIO && tw__relay_state(r) >= 0) { /* the relay's own failure may be TW_EIO */
		err = tw__io_err(errno);
		tw__comm_seterr(&s->sock.base, "write failed: %s", io_error(s));
	} else {
		/* the message is cut short on the wire: the peer cannot use it */
		err = rv;
		tw__comm_seterr(&s->sock.base,
				"a relayed frame was lost, its message is corrupt: %s",
				tw__relay_error(r));
	}
	tw__comm_end(&s->sock.base, err);
	return err;
}

static void relay_wake(void *arg)
{
	struct stream *s = arg;
	if (s->sock.fd >= 0 && !s->sock.base.ended)
		event_active(s->sock.wev, EV_WRITE, 0);
}

/* Claim m's relay frames for this comm (tcp only): 0 with *relayed their
 * bytes (counted in the walk every write makes anyway), or TW_EINVAL with
 * nothing claimed. */
static int claim_relay(struct stream *s, tw_msg *m, uint64_t *relayed)
{
	const tw_slice *f = tw__msg_frames(m);
	size_t nf = tw_msg_nframes(m);
	*relayed = 0;
	for (size_t j = 0; j < nf; j++) {
		size_t i;
		struct tw__relay *r = tw__relay_of(&f[j], &i);
		if (r == NULL)
			continue;
		*relayed += f[j].len;
		s->relays = 1;
		/* never to its source: what the source writes waits until its
		 * relay frames are consumed (flush), so it could never go */
		if (s->sock.io != &tw__tcp_io || r == s->relay ||
		    tw__relay_claim(r, i, relay_wake, s) != 0) {
			while (j-- > 0)
				if ((r = tw__relay_of(&f[j], &i)) != NULL)
					tw__relay_unclaim(r, i);
			return TW_EINVAL;
		}
	}
	return 0;
}

/* Write as much of the queue as the socket takes. Returns 0, or an error
 * after which the comm has ended. */
static int flush(struct stream *s)
{
	struct iovec iov[IOV_BATCH];
	uint8_t buf[TW__GATHER_MAX];
	size_t budget = tw__pass_allow(event_get_base(s->sock.wev), WRITE_BUDGET);
	int calls = 0;
	if (s->relay != NULL && s->sock.q.n > 0) {
		/* What we write to a relay's source waits until its message is
		 * consumed: the pool's "OK" after a relayed get_data reply says
		 * the reply was taken, as Dask's does (relay_check flushes). */
		event_del(s->sock.wev);
		return 0;
	}
	while (s->sock.q.n > 0) {
		if (budget == 0 || ++calls > READ_CALLS) {
			/* Let the loop's other comms run: epoll reports the
			 * socket writable again next pass (core/pass.h), or never
			 * (a peer that stopped reading: bytes before a relay frame
			 * whose source may wait for them are watched) */
			event_add(s->sock.wev, NULL);
			watch_bytes_before(s);
			return 0;
		}
		int k = gather(s, iov, IOV_BATCH);
		ssize_t n;
		if (k == 0) { /* the head is at a relay frame */
			int rv = pump_head(s, budget, &n);
			if (rv != 0)
				return rv;
			if (n == 0)
				return 0;
			consume(s, (uint64_t)n, 1);
			budget = tw__pass_spent(budget, (size_t)n);
			continue;
		}
		k = tw__gather_small(iov, k, buf);
		n = tw__sock_send(&s->sock, iov, k, budget);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			event_add(s->sock.wev, NULL);
			/* bytes before a relay frame whose source may wait for them */
			watch_bytes_before(s);
			return 0;
		}
		if (n < 0) {
			int err = tw__io_err(errno);
			tw__comm_seterr(&s->sock.base, "write failed: %s", io_error(s));
			tw__comm_end(&s->sock.base, err);
			return err;
		}
		consume(s, (uint64_t)n, 0);
		budget = tw__pass_spent(budget, (size_t)n);
	}
	event_del(s->sock.wev);
	if (s->closing) {
		finish_close(s);
		return TW_ECLOSED;
	}
	return tw__comm_drained(&s->sock.base) ? 0 : TW_ECLOSED;
}

static void on_writable(struct tw__sock *sock)
{
	flush((struct stream *)sock);
}

static int s_write(tw_comm *c, tw_msg *m)
{
	struct stream *s = (struct stream *)c;
	struct wq_entry *e;
	size_t nf = tw_msg_nframes(m);
	uint64_t relayed;
	if (s->closing)
		return TW_ECLOSED;
	/* relay frames' bytes wait in their sources' sockets, not here */
	if (s->sock.queued_bytes - c->relay_queued + s->queued_cost >= c->limits.write_hwm_bytes)
		return TW_EAGAIN;
	if ((e = tw__sockq_tail(&s->sock.q)) == NULL)
		return TW_ENOMEM;
	e->prelude_len = tw__stream_prelude_bytes(nf);
	e->prelude = NULL;
	if (e->prelude_len > PRELUDE_INLINE && (e->prelude = malloc(e->prelude_len)) == NULL)
		return TW_ENOMEM;
	if (claim_relay(s, m, &relayed) != 0) {
		free(e->prelude);
		return TW_EINVAL;
	}
	tw__stream_encode_prelude(tw__msg_frames(m), nf, prelude_of(e));
	e->msg = m;
	e->wire_len = e->prelude_len + tw_msg_bytes(m);
	e->cost = sizeof(*e) + (e->prelude != NULL ? e->prelude_len : 0) + tw__msg_footprint(m);
	s->queued_cost += e->cost;
	tw__sockq_commit(&s->sock.q);
	tw__sock_queue_add(&s->sock, m, e->wire_len, relayed);
	/* Write from the loop, not from inside this call: the caller never
	 * sees a callback (drain, close) run within tw_comm_write, and the
	 * writes of one loop turn go out in one writev. A reply written by a
	 * callback of our own read goes out when that read ends, with no trip
	 * through the loop. */
	if (s->in_read)
		s->write_held = 1;
	else
		tw__sock_kick_write(&s->sock);
	return 0;
}

/* The true count of what arrived (issue 17 saw "after 0" where 99 MiB
 * had), and the size the prelude declared once its total was in. */
static void say_truncated(struct stream *s)
{
	unsigned long long got = tw__rx_progress(&s->rx), total = s->rx.dec.total;
	if (total != 0)
		tw__comm_seterr(
			&s->sock.base,
			"peer closed in the middle of a message: after %llu of its %llu bytes", got,
			total + 8);
	else
		tw__comm_seterr(&s->sock.base,
				"peer closed in the middle of a message: after %llu bytes of its "
				"prelude",
				got);
}

/* The peer closed (or errored) while we were reading. */
static void read_ended(struct stream *s, ssize_t n)
{
	if (n == 0 && tw__rx_idle(&s->rx) && s->sock.q.n > 0) {
		/* A half-close: the peer may still read what we owe it. */
		tw__comm_closing(&s->sock.base); /* a batched sender's last maps first */
		s->closing = 1;
		s->peer_eof = 1;
		event_del(s->sock.rev);
		tw__linger_start(&s->sock.base, s->sock.fd);
	} else if (n == 0 && tw__rx_idle(&s->rx)) {
		/* err 0 (orderly), yet never an empty text: a killed peer's
		 * kernel closes this way too (issue 16: workers saw "") */
		tw__comm_seterr(&s->sock.base, "peer closed the connection between messages");
		tw__comm_end(&s->sock.base, 0);
	} else if (n == 0) {
		say_truncated(s);
		tw__comm_end(&s->sock.base, TW_ETRUNCATED);
	} else {
		int err = tw__io_err(errno);
		tw__comm_seterr(&s->sock.base, "read failed: %s", io_error(s));
		tw__comm_end(&s->sock.base, err);
	}
}

static void begin_close(struct stream *s, int err);
static void unreserve(struct stream *s);

static void protocol_error(struct stream *s, int err)
{
	const struct tw__sdec *d = &s->rx.dec;
	if (err == TW_ENOMEM) /* ours, not the peer's: memory for its bytes refused */
		tw__comm_seterr(&s->sock.base, "out of memory receiving a message of %llu bytes",
				(unsigned long long)d->total);
	else
		tw__comm_seterr(
			&s->sock.base,
			"bad message from peer: %s (total %llu, frames %llu, limits %llu bytes, "
			"%llu frames)",
			tw_strerror(err), (unsigned long long)d->total, (unsigned long long)d->n,
			(unsigned long long)d->max_message_bytes,
			(unsigned long long)d->max_frames);
	/* Requests before it still to be delivered (decoding on the offload
	 * pool): they are served first, reading nothing meanwhile, and the
	 * fail runs once they are (tw__comm_delivered). */
	if (tw__comm_defer_fail(&s->sock.base, err)) {
		event_del(s->sock.rev);
		s->sock.reading = 0;
		tw__comm_rate_stop(&s->sock.base);
		unreserve(s);
		return;
	}
	/* Replies to the requests served before the bad input go out
	 * first: the comm then closes as tw_comm_close does, reading no
	 * more, and ends with err (design.md, Close). */
	if (s->sock.q.n > 0) {
		begin_close(s, err);
		return;
	}
	tw__comm_end(&s->sock.base, err);
}

static void try_finish(struct stream *s);

/* While closing, input is read and dropped until the peer's EOF
 * (tw__sock_drain says why). */
static void drain_input(struct stream *s)
{
	int r = tw__sock_drain(&s->sock);
	if (r == 0)
		return;
	if (r < 0) {
		int err = tw__io_err(errno);
		tw__comm_seterr(&s->sock.base, "read failed while closing: %s", io_error(s));
		tw__comm_end(&s->sock.base, err);
		return;
	}
	s->peer_eof = 1;
	if (s->closing == 2)
		try_finish(s);
}

/* The socket ran dry: cheap when the rate clock is not running, which
 * is what small messages that arrive whole leave (tw__sock_ran_dry). */
static void ran_dry(struct stream *s)
{
	tw__sock_ran_dry(&s->sock);
}

/* The I/O layer holds bytes (TLS records already read), or an end that
 * came with them, which the socket's readiness does not show. */
static int io_more(const struct stream *s)
{
	return tw__sock_io_more(&s->sock);
}

/* Bytes may wait inside the I/O layer (TLS records already read), where
 * the socket's readiness does not show them: look again from the loop. */
static void read_again(struct stream *s)
{
	tw__sock_read_again(&s->sock);
}

/* A large message (its head is in; small ones reserve nothing) takes its
 * bytes out of the context's receive budget as they arrive, a step ahead
 * of them (tw__comm_rx_budget), so the budget follows memory, and a peer
 * that declares 1 GiB and drips holds a step of it, not 1 GiB. Returns
 * the iovecs of want that fit what is reserved (>= 1), or 0 to wait:
 * reading stops until rx_granted. */
static int within_budget(struct stream *s, struct iovec *iov, int k)
{
	size_t cap = SIZE_MAX;
	if (s->rx.phase != RX_LENGTHS && s->rx.phase != RX_FRAMES)
		return k;
	if (!s->rx_large) {
		s->rx_large = 1;
		s->rx_got = 0;
	}
	uint64_t left = s->rx.dec.total - 8 - s->rx_got;
	if (tw__comm_rx_budget(&s->sock.base, s->rx_got, left, left, &cap) != 0) {
		tw__sock_rx_wait(&s->sock);
		return 0;
	}
	return tw__iov_cap(iov, k, cap);
}

static void unreserve(struct stream *s)
{
	s->rx_large = 0;
	tw__comm_rx_release(&s->sock.base);
}

/* A read-ahead over tcp: peek, then take what tw__rx_safe allows (the
 * kernel discards it, having copied it once, into the peeked place).
 * *seen gets what the peek saw (a short one drained the socket); returns
 * the bytes taken, with readv's returns otherwise. */
static ssize_t read_ahead(struct stream *s, const struct iovec *iov, ssize_t *seen)
{
	size_t safe;
	ssize_t n = *seen =
		s->sock.io->peek(s->sock.io_arg, s->sock.fd, iov->iov_base, iov->iov_len);
	if (n <= 0)
		return n;
	if ((safe = tw__rx_safe(&s->rx, iov->iov_base, (size_t)n)) == 0)
		return 0;
	n = s->sock.io->discard(s->sock.io_arg, s->sock.fd, iov->iov_base, safe);
	return n < 0 || (size_t)n == safe ? n : (errno = EIO, -1); /* only we read */
}

/* The relay kicks the source when it is done or failed. */
static void relay_kick(void *arg)
{
	struct stream *s = arg;
	tw__sock_read_again(&s->sock);
}

/* m stopped at a relay frame: append the frames left in the socket (and
 * the bytes of them read ahead) as relay frames; nothing is read until
 * they are consumed. 0 or a TW_E* code. */
static int relay_start(struct stream *s, tw_msg *m)
{
	struct tw__rx *rx = &s->rx;
	const uint8_t *pre = rx->carry_len ? tw_block_data(rx->carry) + rx->carry_off : NULL;
	const struct tw__limits *lim = &s->sock.base.limits;
	int rv = tw__relay_new(s->sock.base.ctx, s->sock.fd, rx->relay_lens, rx->relay_n, rx->carry,
			       pre, rx->carry_len, relay_kick, s, lim->min_rate_bytes,
			       lim->min_rate_grace_ms, m, &s->relay);
	if (rv == 0)
		tw__rx_drop_carry(rx);
	free(rx->relay_lens);
	rx->relay_lens = NULL;
	rx->relay_n = 0;
	event_del(s->sock.rev);
	/* the relay runs the rate clock on its own progress (relay.h) */
	tw__comm_rate_stop(&s->sock.base);
	s->sock.base.relaying = s->relay != NULL;
	return rv;
}

/* While a relay runs, the socket is its. Returns 1 to stop reading (it
 * runs, or it failed and the comm ended), 0 when it is over. */
static int relay_check(struct stream *s)
{
	struct tw__relay *r = s->relay;
	int st = tw__relay_state(r);
	if (st == 0) {
		event_del(s->sock.rev);
		return 1;
	}
	s->relay = NULL;
	s->sock.base.relaying = 0;
	if (st < 0) {
		tw__comm_seterr(&s->sock.base, "%s", tw__relay_error(r));
		tw__relay_detach(r, 0, NULL);
		tw__comm_end(&s->sock.base, st);
		return 1;
	}
	tw__relay_detach(r, 0, NULL);
	if (s->sock.reading || s->closing)
		event_add(s->sock.rev, NULL);
	if (s->sock.q.n > 0)
		tw__sock_kick_write(&s->sock); /* writes held while it ran */
	tw__comm_relayed(&s->sock.base);       /* a pool's comm may take its next call */
	return 0;
}

/* What one read of read_step asked for and got: a read that comes back
 * short (seen < asked) drained the socket. */
struct step {
	size_t asked;
	ssize_t n, seen; /* bytes taken; bytes seen (a peek may see more) */
};

/* read_step's returns besides tw__rx_advance's (0, 1, < 0). */
#define STEP_AGAIN 2 /* read again: EINTR, or a peek that saw no whole message */
#define STEP_STOP  3 /* reading stops here: dry, waiting for the budget, ended */

/* One read of the socket into where frame_rx wants the bytes, at most
 * *budget of them (spent here). */
static int read_step(struct stream *s, size_t *budget, struct step *st)
{
	struct iovec iov[IOV_BATCH];
	int k = tw__rx_want(&s->rx, iov, IOV_BATCH);
	ssize_t n;
	if (k < 0)
		return k;
	if ((k = within_budget(s, iov, k)) == 0)
		return STEP_STOP;
	k = tw__iov_cap(iov, k, tw__pass_call(*budget));
	for (int i = 0; i < k; i++)
		st->asked += iov[i].iov_len;
	if (k == 1 && s->sock.io->peek != NULL && tw__rx_reads_ahead(&s->rx))
		n = read_ahead(s, iov, &st->seen);
	else
		n = st->seen = s->sock.io->readv(s->sock.io_arg, s->sock.fd, iov, k);
	st->n = n;
	if (n == 0 && st->seen > 0)
		return STEP_AGAIN; /* no whole message seen: read its head */
	if (n < 0 && errno == EINTR)
		return STEP_AGAIN;
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
		ran_dry(s);
		return STEP_STOP;
	}
	if (n <= 0) {
		read_ended(s, n);
		return STEP_STOP;
	}
	TW__COUNT(&s->sock.base.stats, bytes_received, (uint64_t)n);
	*budget = tw__pass_spent(*budget, (size_t)n);
	s->rx_got += (uint64_t)n;
	return tw__rx_advance(&s->rx, (size_t)n);
}

/* A whole message is in: deliver it. 1 to read on; 0 when reading stops
 * (the comm ended or was freed, closes, pauses, or a relay took its
 * socket). */
static int took_message(struct stream *s)
{
	tw_msg *m = tw__rx_take(&s->rx);
	int alive, rv;
	if (s->rx.relay_lens != NULL && (rv = relay_start(s, m)) != 0) {
		tw_msg_free(m);
		protocol_error(s, rv);
		return 0;
	}
	TW__COUNT(&s->sock.base.stats, msgs_received, 1);
	alive = tw__comm_deliver(&s->sock.base, m);
	tw_msg_free(m);
	/* Its bytes go back to the budget once the message is where it stays
	 * counted (a write queue, the reclaimer) or the application's: given
	 * back before delivery, they went to waiters while an echo of them
	 * queued, twice the message in memory (budget-bench: VmHWM 1367 MiB
	 * for a 1 GiB budget). */
	if (alive && s->rx_large)
		unreserve(s);
	/* tw_comm_close in the callback stops reading: the next wakeup
	 * drains input instead of delivering. */
	return alive && !s->closing && s->sock.reading && s->relay == NULL;
}

/* Read and deliver until the socket is dry or budget (this pass's) spent. */
static void read_messages(struct stream *s, size_t budget)
{
	int rv;
	/* A head read along with a message whose delivery paused reading (a
	 * server waits for a handler's late reply): checked now, on resume.
	 * Else bad input there waited for the peer's next bytes, which a peer
	 * that got its reply may never send (breaker21). */
	if ((rv = tw__rx_check_head(&s->rx)) < 0) {
		protocol_error(s, rv);
		return;
	}
	for (int reads = 0; budget > 0 && reads < READ_CALLS; reads++) {
		struct step st = {0, 0, 0};
		/* Messages read ahead come before the socket's bytes. */
		rv = tw__rx_pending(&s->rx) ? tw__rx_replay(&s->rx) : read_step(s, &budget, &st);
		if (rv == STEP_AGAIN)
			continue;
		if (rv == STEP_STOP)
			return;
		if (rv < 0) {
			protocol_error(s, rv);
			return;
		}
		if (rv == 1 && !took_message(s))
			return;
		/* A head read along with the last message may already be bad. */
		if ((rv = tw__rx_check_head(&s->rx)) < 0) {
			protocol_error(s, rv);
			return;
		}
		/* A short read drained the socket: wait for epoll rather than
		 * spend a read on EAGAIN (unless TLS holds decrypted bytes, or
		 * messages were read ahead, or a peek left a message's first
		 * bytes in the socket: read them now, not on the next wakeup). */
		if ((size_t)st.seen < st.asked && st.seen == st.n && !tw__rx_pending(&s->rx) &&
		    !io_more(s)) {
			ran_dry(s);
			return;
		}
	}
	/* Budget spent. What is already in memory (read ahead, decrypted by
	 * TLS) epoll cannot report: go on with it now. The socket's bytes
	 * wait for the next pass (rev persists), behind the comms whose bytes
	 * arrived meanwhile (core/pass.h); if it holds none, the rate clock
	 * runs (tw__sock_yield). */
	tw__sock_yield(&s->sock);
	if (tw__rx_pending(&s->rx) || io_more(s))
		read_again(s);
}

static void read_input(struct stream *s)
{
	size_t budget = tw__pass_read(event_get_base(s->sock.rev), READ_BUDGET);
	if (s->relay != NULL && relay_check(s))
		return;
	/* relay bytes count from the comm's limits at each message */
	s->rx.relay_min = s->sock.io == &tw__tcp_io ? s->sock.base.limits.relay_min_bytes : 0;
	if (s->closing) {
		drain_input(s);
		return;
	}
	if (!s->sock.reading) {
		event_del(s->sock.rev);
		return;
	}
	read_messages(s, budget);
}

/* The comm is held while its input is read, so a callback that frees it
 * cannot pull it from under us; what the callbacks wrote is flushed
 * before the hold ends. */
static void on_readable(struct tw__sock *sock)
{
	struct stream *s = (struct stream *)sock;
	tw__comm_hold(&s->sock.base);
	s->in_read = 1;
	read_input(s);
	tw__pass_close();
	s->in_read = 0;
	if (s->write_held) {
		s->write_held = 0;
		if (!s->sock.base.ended && !event_pending(s->sock.wev, EV_WRITE, NULL))
			flush(s);
	}
	tw__comm_release(&s->sock.base);
}

/* Ask the linger whether the close is over (tw__linger_due): delivered,
 * given up, or not yet. */
static void linger_check(struct stream *s, int peer_done)
{
	int r = tw__sock_linger(&s->sock, s->closing == 2, peer_done);
	if (r > 0) {
		tw__comm_end(&s->sock.base, s->fail_err);
		return;
	}
	if (r < 0)
		tw__comm_end(&s->sock.base, s->fail_err != 0 ? s->fail_err : TW_ETIMEDOUT);
}

static void on_linger_timeout(struct tw__sock *sock)
{
	struct stream *s = (struct stream *)sock;
	linger_check(s, s->peer_eof);
}

static void try_finish(struct stream *s)
{
	linger_check(s, 1);
}

static void end_now(struct stream *s);

static void end_later(struct tw__reap *r)
{
	end_now((struct stream *)(void *)((char *)r - offsetof(struct stream, end_wait)));
}

/* The queue is flushed: send our end (FIN, after close_notify for tls),
 * then wait (bounded by the linger) for the peer's and for the peer's TCP
 * to acknowledge every byte. When the loop's pass has no time left, on a
 * later pass (core/reap.h): a mass close is not one long pass. */
static void send_end(struct stream *s)
{
	if (!tw__reap_defer(s->sock.base.ctx, &s->end_wait, end_later))
		end_now(s);
}

static void end_now(struct stream *s)
{
	s->sock.io->shutdown(s->sock.io_arg, s->sock.fd);
	s->closing = 2;
	s->sock.base.linger.fin = 1;
	if (s->peer_eof) {
		try_finish(s);
		return;
	}
	event_add(s->sock.rev, NULL);
}

static void finish_close(struct stream *s)
{
	if (s->closing == 1)
		send_end(s);
}

/* Close: stop delivering, write what is queued, then end as above; a
 * close for bad input (err) ends with err once its replies are out. */
static void begin_close(struct stream *s, int err)
{
	if (s->closing)
		return;
	tw__comm_closing(&s->sock.base);
	s->closing = 1;
	s->fail_err = err;
	tw__comm_rate_stop(&s->sock.base); /* input is dropped from now on */
	unreserve(s);
	event_add(s->sock.rev, NULL);
	tw__linger_start(&s->sock.base, s->sock.fd);
	if (s->sock.q.n == 0)
		send_end(s);
}

/* The input already read holds what epoll cannot report: messages read
 * ahead, or the next message's head read along with the last one (or the
 * error it gave), unchecked when that message's delivery paused reading.
 * A handler that replied late, with bad input behind its request in the
 * same read: the reply went, and the comm waited for bytes that a peer
 * with its reply may never send (breaker21). */
static int rx_holds(const struct stream *s)
{
	return tw__rx_pending(&s->rx) || s->rx.phase == RX_ERROR ||
	       (s->rx.phase == RX_HEAD && s->rx.have > 0);
}

/* Pausing is lazy: the read event stays registered, and the next wakeup
 * while paused takes it off. A pause and resume within one callback (a
 * server answering at once) then cost no epoll_ctl calls. */
static int s_start(tw_comm *c)
{
	struct stream *s = (struct stream *)c;
	if (c->fail_deferred)
		return 0; /* bad input came: nothing more is read */
	s->sock.reading = 1;
	/* Time we did not read was ours: a message in progress starts its
	 * clock again, even if the peer sends nothing more. */
	if (!tw__rx_idle(&s->rx))
		tw__comm_rate_watch(c, 1);
	if (event_pending(s->sock.rev, EV_READ, NULL)) {
		if (rx_holds(s) || io_more(s))
			read_again(s);
		return 0;
	}
	if (event_add(s->sock.rev, NULL) != 0)
		return TW_EIO;
	read_again(s);
	return 0;
}

/* With a fail deferred for bad input (a handler closing, as the close op
 * does), the close is that fail: it ends with the input's error. */
static void s_close(tw_comm *c)
{
	int err = c->fail_deferred;
	c->fail_deferred = 0;
	begin_close((struct stream *)c, err);
}

static void s_fail(tw_comm *c, int err)
{
	struct stream *s = (struct stream *)c;
	if (s->closing) {
		/* The close goes on (bounded by the linger) and ends with err:
		 * ending now dropped the replies it was writing (breaker21: a
		 * request that failed to decode, then a deferred fail). */
		if (s->fail_err == 0)
			s->fail_err = err;
		return;
	}
	if (s->sock.queued_bytes == 0) {
		tw__comm_end(c, err); /* no replies to send first */
		return;
	}
	begin_close(s, err);
}

/* The comm stopped: what it received goes now, not when it is freed (an
 * ended comm holds no memory for its peer's bytes), and a relay of its
 * input fails. */
static void stopped(struct tw__sock *sock)
{
	struct stream *s = (struct stream *)sock;
	tw__reap_cancel(sock->base.ctx, &s->end_wait);
	s->queued_cost = 0;
	s->head_sent = 0;
	s->head_part = 0;
	s->head_off = 0;
	unreserve(s);
	if (s->relay_stall_ev != NULL) {
		event_free(s->relay_stall_ev);
		s->relay_stall_ev = NULL;
	}
	if (s->relay != NULL) {
		tw__relay_detach(s->relay, TW_ECLOSED, "the comm was closed or freed");
		s->relay = NULL;
		s->sock.base.relaying = 0;
	}
	tw__rx_fini(&s->rx);
}

static void fini(struct tw__sock *sock)
{
	tw__rx_fini(&((struct stream *)sock)->rx);
}

static void s_set_place(tw_comm *c, tw__place_fn fn, void *arg)
{
	tw__rx_set_place(&((struct stream *)c)->rx, fn, arg);
}

/* A running relay is not a next message: it holds the socket's bytes for
 * its destinations, and what is written to the comm meanwhile waits for it
 * (flush). A pool still gives such a comm no call (TW__COMM_RELAYING): the
 * call would wait for the relay's slowest destination. */
static int rx_busy(const struct tw__sock *sock)
{
	return !tw__rx_idle(&((const struct stream *)sock)->rx);
}

static int rx_open(const struct tw__sock *sock)
{
	return !((const struct stream *)sock)->closing && !sock->base.ended;
}

static void too_slow(struct tw__sock *sock)
{
	tw__comm_end(&sock->base, TW_ETIMEDOUT);
}

static const struct tw__sock_hooks stream_hooks = {
	.readable = on_readable,
	.writable = on_writable,
	.timer = on_linger_timeout,
	.rx_busy = rx_busy,
	.open = rx_open,
	.too_slow = too_slow,
	.drop = drop_entry,
	.stopped = stopped,
	.fini = fini,
};

static const struct tw__comm_ops stream_ops = {
	s_start,     s_write,        tw__sock_queued,
	s_close,     tw__sock_stop,  tw__sock_destroy,
	s_set_place, tw__sock_pause, tw__sock_rx_pending,
	s_fail,      tw__sock_acked, s_pause_limit_set,
};

int tw__stream_is(const tw_comm *c)
{
	return c->ops == &stream_ops;
}

int tw__stream_new(tw_context *ctx, int fd, const char *scheme, const struct tw__stream_io *io,
		   void *io_arg, tw_comm **out)
{
	struct stream *s = calloc(1, sizeof(*s));
	if (s == NULL)
		return TW_ENOMEM;
	if (tw__sock_init(&s->sock, &stream_ops, &stream_hooks, ctx, fd, scheme, io, io_arg,
			  sizeof(struct wq_entry)) != 0) {
		free(s);
		return TW_ENOMEM;
	}
	tw__rx_init(&s->rx, &s->sock.base.limits);
	s->rx.gulp_max = GULP_MAX;
	s->rx.gulp_pipe_max = io->peek != NULL ? GULP_PIPE_PEEK_MAX : GULP_PIPE_MAX;
	*out = &s->sock.base;
	return 0;
}
