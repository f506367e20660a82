/* SPDX-License-Identifier: BSD-3-Clause */
/* Relay of large frames, socket -> pipe -> socket (transport/relay.h);
 * the pipes are the loop's (POOL_PIPES), kept with its context. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <taskwire/error.h>
#include <taskwire/relay.h>

#include "core/block.h"
#include "core/context.h"
#include "core/stats.h"
#include "transport/comm_impl.h"
#include "transport/relay.h"
#include "transport/upper.h"

/* A pipe between the sockets; Linux's default is 64 KiB, 1 MiB (the
 * unprivileged maximum) takes a quarter of the splice calls. */
#define PIPE_BYTES (1 << 20)
/* Pipes belong to the loop: at most POOL_PIPES per loop's context, taken by a
 * relay while bytes sit in it and given back as soon as it is empty; a
 * relay that finds none free moves its bytes through a buffer of its own
 * (recv, send: BUF_BYTES at a time) until one is. Linux lets an
 * unprivileged user hold pipes of 1 MiB up to fs/pipe-user-pages-soft
 * (16384 pages: 64 MiB, 16 such pipes) in all; past it, new pipes get one
 * page. With one pipe per relay, 16 relays at once took them all. */
#define POOL_PIPES  8
#define BUF_BYTES   65536
#define DRAIN_CHUNK 65536
/* Rate checks closer together than this gain nothing (comm.c's too). */
#define RATE_MIN_CHECK_MS 100
/* While the relay waits for its source, the source's socket reports
 * readable only once this many bytes (or all the relay still expects, or
 * its end) are in (SO_RCVLOWAT): one wakeup and one splice per large
 * chunk instead of one per few segments. */
#define WAKE_BYTES ((uint64_t)512 << 10)

enum fstate { F_FREE, F_CLAIMED, F_DEAD };

/* The pipes of one loop: its context's extension (core/context.h), made
 * with the loop's first relay and closed with the context, so a loop that
 * relays one message at a time makes one pipe, not one per relay. Only
 * that loop's thread takes and gives. */
struct pipe_pool {
	int made; /* pipes in existence: free ones and taken ones */
	int nfree;
	int free[POOL_PIPES][2];
};

/* The context is freed: its comms (and their relays, which give their
 * pipes back or close them) went first. */
static void pool_release(void *state)
{
	struct pipe_pool *p = state;
	while (p->nfree > 0) {
		p->nfree--;
		close(p->free[p->nfree][0]);
		close(p->free[p->nfree][1]);
	}
	free(p);
}

static const struct tw__ext_ops pipes_ops = {.release = pool_release};

static struct pipe_pool *pool_get(tw_context *ctx)
{
	struct pipe_pool *p = tw__ctx_ext(ctx, &pipes_ops);
	if (p == NULL && (p = calloc(1, sizeof(*p))) != NULL &&
	    tw__ctx_set_ext(ctx, &pipes_ops, p) != 0) {
		free(p);
		p = NULL;
	}
	return p;
}

/* tw_relay_watch_end: fn runs from ev once the relay's end is known, or
 * from the context's teardown (kill_watch). Tracked by the source's
 * context; on r's list until the end is known. */
struct relay_watch {
	struct tw__node node;
	struct relay_watch *next, **pprev;
	struct event *ev;
	tw_relay_ended_fn fn;
	void *arg;
	int err;
	char why[200];
};

struct frame {
	struct tw__relay *r;
	uint64_t off, len;
	enum fstate state;
	int gone; /* its placeholder block was freed: no claim can come */
	void (*wake)(void *warg);
	void *warg;
};

struct tw__relay {
	int fd; /* the source's socket; -1 once detached */
	struct pipe_pool *pool;
	int pipe[2]; /* from the pool while bytes of frame `cursor` are in it; else -1 */
	uint64_t pipe_bytes;
	uint8_t *buf; /* without a pipe: bytes of frame `cursor` between recv and send */
	size_t buf_off, buf_len;
	struct event *src_ev;   /* one-shot: the source became readable */
	struct event *kick_ev;  /* progress from the loop */
	tw_block *prefix_block; /* bytes of the first frame read ahead: in it */
	const uint8_t *prefix;
	size_t prefix_len, prefix_off;
	size_t n, cursor;
	uint64_t cur_off; /* bytes of frame `cursor` gone out (or dropped) */
	struct frame *f;
	void *map;
	size_t map_len;
	uint64_t sock_left; /* bytes of the frames still in the socket */
	int lowat;          /* the socket's SO_RCVLOWAT as we set it (1: the default) */
	/* The source's minimum receive rate, on the relay's progress: the
	 * clock runs while the relay waits for the source (tw__relay_new). */
	uint64_t min_rate, grace_ms;
	uint64_t taken; /* bytes taken from the socket (spliced or drained) */
	struct event *rate_ev;
	int rate_on;
	uint64_t rate_start_ms, rate_taken;
	int err;
	int done;
	tw_context *ctx;             /* the source's: its loop runs the watches */
	struct relay_watch *watches; /* waiting for the end (tw_relay_watch_end) */
	int refs;                    /* one per frame's block, the source's */
	void (*kick)(void *arg);
	void *kick_arg;
	char error[200];
};

/* Bytes of frame `cursor` taken from the socket and not gone out. */
static uint64_t held(const struct tw__relay *r)
{
	return r->pipe_bytes + (r->buf_len - r->buf_off);
}

/* A pipe from the loop's pool: 1, or 0 when all POOL_PIPES are taken. */
static int take_pipe(struct tw__relay *r)
{
	struct pipe_pool *p = r->pool;
	if (r->pipe[0] >= 0)
		return 1;
	if (p->nfree > 0) {
		p->nfree--;
		r->pipe[0] = p->free[p->nfree][0];
		r->pipe[1] = p->free[p->nfree][1];
		return 1;
	}
	if (p->made == POOL_PIPES || pipe2(r->pipe, O_NONBLOCK | O_CLOEXEC) != 0)
		return 0;
	(void)fcntl(r->pipe[1], F_SETPIPE_SZ, PIPE_BYTES); /* a smaller one works too */
	p->made++;
	return 1;
}

/* The pipe back to the pool once empty; one with bytes in it (the relay
 * stops) is closed. */
static void give_pipe(struct tw__relay *r)
{
	struct pipe_pool *p = r->pool;
	if (r->pipe[0] < 0)
		return;
	if (r->pipe_bytes == 0) {
		p->free[p->nfree][0] = r->pipe[0];
		p->free[p->nfree][1] = r->pipe[1];
		p->nfree++;
	} else {
		close(r->pipe[0]);
		close(r->pipe[1]);
		p->made--;
		r->pipe_bytes = 0;
	}
	r->pipe[0] = r->pipe[1] = -1;
}

static void unref(struct tw__relay *r)
{
	if (--r->refs > 0)
		return;
	munmap(r->map, r->map_len);
	tw_block_free(r->prefix_block);
	free(r->buf);
	free(r->f);
	free(r);
}

static void relay_release(void *data, void *arg)
{
	struct frame *f = arg;
	struct tw__relay *r = f->r;
	(void)data;
	f->gone = 1;
	if (r->fd >= 0 && (size_t)(f - r->f) == r->cursor)
		event_active(r->kick_ev, 0, 0);
	unref(r);
}

/* The relay's end is known (done, or failed): its watches run from the
 * loop, never inside the call that ended it (a tw_comm_free). */
static void told(struct relay_watch *w, int err, const char *why)
{
	w->err = err;
	snprintf(w->why, sizeof(w->why), "%s", why);
	if ((*w->pprev = w->next) != NULL)
		w->next->pprev = w->pprev;
	w->pprev = NULL;
	event_active(w->ev, EV_TIMEOUT, 0);
}

static void ended(struct tw__relay *r)
{
	while (r->watches != NULL)
		told(r->watches, r->err, r->error);
}

static void fail(struct tw__relay *r, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void fail(struct tw__relay *r, int err, const char *fmt, ...)
{
	va_list ap;
	if (r->err != 0 || r->done)
		return;
	r->err = err;
	va_start(ap, fmt);
	vsnprintf(r->error, sizeof(r->error), fmt, ap);
	va_end(ap);
	event_del(r->src_ev);
	event_del(r->rate_ev);
	ended(r);
	for (size_t i = r->cursor; i < r->n; i++)
		if (r->f[i].state == F_CLAIMED)
			r->f[i].wake(r->f[i].warg);
	if (r->kick != NULL)
		r->kick(r->kick_arg);
}

static void lost(struct tw__relay *r, ssize_t n)
{
	if (n == 0)
		fail(r, TW_ETRUNCATED,
		     "peer closed in the middle of a relayed frame: frame %zu of %zu, after "
		     "%llu of its %llu bytes",
		     r->cursor + 1, r->n, (unsigned long long)(r->cur_off + held(r)),
		     (unsigned long long)r->f[r->cursor].len);
	else
		fail(r, tw__io_err(errno), "read of a relayed frame failed: %s", strerror(errno));
}

static void set_lowat(struct tw__relay *r, int bytes)
{
	if (r->lowat == bytes || r->fd < 0)
		return;
	/* On failure the wakeups stay per segment: slower, still right. */
	if (setsockopt(r->fd, SOL_SOCKET, SO_RCVLOWAT, &bytes, sizeof(bytes)) == 0)
		r->lowat = bytes;
}

/* Wait for the source: readable once a large chunk of what the relay
 * still expects is in. The peer owes every byte of it (the prelude
 * said so), and its end or reset wakes the wait too. */
static void wait_source(struct tw__relay *r)
{
	uint64_t want = r->sock_left < WAKE_BYTES ? r->sock_left : WAKE_BYTES;
	set_lowat(r, want > 0 ? (int)want : 1);
	event_add(r->src_ev, NULL);
	if (r->min_rate != 0 && !r->rate_on) { /* the source's time starts */
		struct timeval tv = {(time_t)(r->grace_ms / 1000),
				     (suseconds_t)(r->grace_ms % 1000) * 1000};
		r->rate_start_ms = tw__mono_ms();
		r->rate_taken = r->taken;
		r->rate_on = evtimer_add(r->rate_ev, &tv) == 0;
	}
}

/* Milliseconds that `bytes` cover at `rate` bytes/s (no overflow). */
static uint64_t covered_ms(uint64_t bytes, uint64_t rate)
{
	return bytes / rate * 1000 + bytes % rate * 1000 / rate;
}

/* The minimum receive rate's rule (comm.c tw__comm_rate_due), on the
 * bytes the relay took since its clock started: the clock runs while the
 * relay waits for the source; time it waits for its destinations (the
 * pipe full, a frame's claimant not writable, a frame not claimed yet)
 * is ours, and stops it. */
static void on_rate(evutil_socket_t fd, short what, void *arg)
{
	struct tw__relay *r = arg;
	uint64_t elapsed, got, covered, next;
	int unread = 0;
	struct timeval tv;
	(void)fd;
	(void)what;
	r->rate_on = 0;
	if (r->err != 0 || r->done || r->fd < 0 || !event_pending(r->src_ev, EV_READ, NULL))
		return;
	elapsed = tw__mono_ms() - r->rate_start_ms;
	got = r->taken - r->rate_taken;
	/* bytes in the socket below SO_RCVLOWAT came too */
	if (ioctl(r->fd, FIONREAD, &unread) == 0 && unread > 0)
		got += (uint64_t)unread;
	covered = covered_ms(got, r->min_rate);
	if (elapsed >= r->grace_ms && covered < elapsed) {
		fail(r, TW_ETIMEDOUT,
		     "peer sent %llu bytes in %.1f s while a relayed frame was in progress (frame "
		     "%zu of %zu, %llu of its %llu bytes), below the minimum of %llu bytes/s",
		     (unsigned long long)got, (double)elapsed / 1000, r->cursor + 1, r->n,
		     (unsigned long long)(r->cur_off + held(r)),
		     (unsigned long long)r->f[r->cursor].len, (unsigned long long)r->min_rate);
		return;
	}
	next = (covered + 1 > r->grace_ms ? covered + 1 : r->grace_ms) - elapsed;
	next = next > RATE_MIN_CHECK_MS ? next : RATE_MIN_CHECK_MS;
	tv.tv_sec = (time_t)(next / 1000);
	tv.tv_usec = (suseconds_t)(next % 1000) * 1000;
	r->rate_on = evtimer_add(r->rate_ev, &tv) == 0;
}

/* Drop the rest of frame `cursor`. 1: done, 0: wait (src_ev armed), -1:
 * failed. */
static int drain(struct tw__relay *r)
{
	static uint8_t scratch[DRAIN_CHUNK]; /* never read: loop thread only */
	struct frame *f = &r->f[r->cursor];
	while (r->cur_off < f->len) {
		uint64_t left = f->len - r->cur_off;
		size_t want = left < DRAIN_CHUNK ? (size_t)left : DRAIN_CHUNK;
		ssize_t n;
		if (r->pipe_bytes > 0) {
			n = read(r->pipe[0], scratch, r->pipe_bytes < want ? r->pipe_bytes : want);
			if (n <= 0)
				return fail(r, TW_EIO, "relay pipe: %s", strerror(errno)), -1;
			r->pipe_bytes -= (uint64_t)n;
			if (r->pipe_bytes == 0)
				give_pipe(r);
		} else if (r->buf_off < r->buf_len) {
			n = (ssize_t)(r->buf_len - r->buf_off < want ? r->buf_len - r->buf_off
								     : want);
			r->buf_off += (size_t)n;
		} else if (r->prefix_off < r->prefix_len) {
			n = (ssize_t)(r->prefix_len - r->prefix_off < want
					      ? r->prefix_len - r->prefix_off
					      : want);
			r->prefix_off += (size_t)n;
		} else {
			n = recv(r->fd, scratch, want, MSG_DONTWAIT);
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
				wait_source(r);
				return 0;
			}
			if (n <= 0)
				return lost(r, n), -1;
			r->sock_left -= (uint64_t)n;
			r->taken += (uint64_t)n;
		}
		r->cur_off += (uint64_t)n;
	}
	return 1;
}

static void next_frame(struct tw__relay *r)
{
	r->cursor++;
	r->cur_off = 0;
}

/* Move on: wake the claimant of the cursor's frame, drain frames nobody
 * will take, or finish. */
static void progress(struct tw__relay *r)
{
	while (r->err == 0 && !r->done && r->fd >= 0) {
		struct frame *f;
		if (r->cursor == r->n) {
			r->done = 1;
			ended(r);
			r->kick(r->kick_arg);
			return;
		}
		f = &r->f[r->cursor];
		if (f->len == 0) { /* nothing to move: no writer ever pumps it */
			next_frame(r);
			continue;
		}
		if (f->state == F_CLAIMED) {
			f->wake(f->warg);
			return;
		}
		if (f->state == F_FREE && !f->gone)
			return; /* someone may still claim it */
		if (drain(r) != 1)
			return;
		next_frame(r);
	}
}

static void on_kick(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	progress(arg);
}

/* Frame i's placeholder, appended to m: its own block, so a frame
 * nobody holds any more is known to be dropped. */
static int append_frame(struct tw__relay *r, size_t i, tw_msg *m)
{
	tw_block *b;
	int rv = tw_block_wrap((uint8_t *)r->map + r->f[i].off, (size_t)r->f[i].len, relay_release,
			       &r->f[i], &b);
	if (rv != 0)
		return rv;
	r->refs++;
	rv = tw_msg_append(m, &(tw_slice){b, 0, (size_t)r->f[i].len});
	tw_block_free(b); /* m holds it, or it is released (and r's ref with it) */
	return rv;
}

/* r's frames laid out in its address range, lens[i] bytes each; the
 * events; the range itself. */
static int relay_init(struct tw__relay *r, struct event_base *base, const uint64_t *lens)
{
	uint64_t total = 0;
	if ((r->f = calloc(r->n, sizeof(*r->f))) == NULL)
		return TW_ENOMEM;
	for (size_t i = 0; i < r->n; i++) {
		r->f[i].r = r;
		r->f[i].off = total;
		r->f[i].len = lens[i];
		total += lens[i];
	}
	r->src_ev = event_new(base, r->fd, EV_READ, on_kick, r);
	r->kick_ev = event_new(base, -1, 0, on_kick, r);
	r->rate_ev = evtimer_new(base, on_rate, r);
	if (r->src_ev == NULL || r->kick_ev == NULL || r->rate_ev == NULL)
		return TW_ENOMEM;
	/* Address space only: a frame's bytes never land here. */
	r->map_len = total > 0 ? (size_t)total : 1;
	r->map = mmap(NULL, r->map_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
		      0);
	if (r->map == MAP_FAILED)
		return TW_ENOMEM;
	r->sock_left = total;
	return 0;
}

/* What relay_init made of r, and r: it failed. */
static void relay_init_undo(struct tw__relay *r)
{
	tw__event_free(r->src_ev);
	tw__event_free(r->kick_ev);
	tw__event_free(r->rate_ev);
	free(r->f);
	free(r);
}

int tw__relay_new(tw_context *ctx, int fd, const uint64_t *lens, size_t n, tw_block *prefix_block,
		  const uint8_t *prefix, size_t prefix_len, void (*kick)(void *arg), void *kick_arg,
		  uint64_t min_rate, uint64_t grace_ms, tw_msg *m, struct tw__relay **out)
{
	int rv = 0;
	struct tw__relay *r = calloc(1, sizeof(*r));
	if (r == NULL)
		return TW_ENOMEM;
	r->pipe[0] = r->pipe[1] = -1;
	r->fd = fd;
	r->n = n;
	r->kick = kick;
	r->kick_arg = kick_arg;
	r->min_rate = grace_ms > 0 ? min_rate : 0;
	r->grace_ms = grace_ms;
	r->ctx = ctx;
	if ((r->pool = pool_get(ctx)) == NULL || relay_init(r, ctx->base, lens) != 0) {
		relay_init_undo(r);
		return TW_ENOMEM;
	}
	if (prefix_len > 0) { /* sent from where the read put it: no copy */
		r->prefix_block = tw_block_hold(prefix_block);
		r->prefix = prefix;
		r->prefix_len = prefix_len;
	}
	r->refs = 1; /* the source's */
	r->sock_left -= prefix_len;
	r->lowat = 1;
	for (size_t i = 0; i < n && rv == 0; i++)
		rv = append_frame(r, i, m);
	if (rv != 0) { /* m (the caller frees it) holds what was appended */
		r->kick = NULL;
		r->err = rv;
		tw__relay_detach(r, 0, NULL);
		return rv;
	}
	*out = r;
	return 0;
}

int tw__relay_state(const struct tw__relay *r)
{
	return r->err != 0 ? r->err : r->done;
}

const char *tw__relay_error(const struct tw__relay *r)
{
	return r->error;
}

void tw__relay_detach(struct tw__relay *r, int err, const char *why)
{
	r->kick = NULL; /* the source knows */
	if (err != 0)
		fail(r, err, "the relay's source ended: %s", why != NULL ? why : tw_strerror(err));
	/* the events go now: frames may outlive the loop (freed after it) */
	event_free(r->src_ev);
	event_free(r->kick_ev);
	event_free(r->rate_ev);
	r->src_ev = r->kick_ev = r->rate_ev = NULL;
	set_lowat(r, 1); /* the socket's next message wakes its reader */
	give_pipe(r);
	r->pool = NULL;
	r->buf_off = r->buf_len = 0;
	r->fd = -1;
	unref(r);
}

struct tw__relay *tw__relay_of(const tw_slice *s, size_t *i)
{
	struct frame *f = s->block ? tw__block_wrap_arg(s->block, relay_release) : NULL;
	if (f == NULL)
		return NULL;
	*i = s->offset == 0 && s->len == f->len ? (size_t)(f - f->r->f) : SIZE_MAX;
	return f->r;
}

int tw__relay_in_msg(const tw_msg *m)
{
	size_t n = tw_msg_nframes(m), i;
	for (size_t j = 0; j < n; j++)
		if (tw__relay_of(tw_msg_frame(m, j), &i) != NULL)
			return 1;
	return 0;
}

uint64_t tw__relay_bytes(const tw_msg *m)
{
	size_t n = tw_msg_nframes(m), i;
	uint64_t bytes = 0;
	for (size_t j = 0; j < n; j++) {
		const tw_slice *s = tw_msg_frame(m, j);
		if (tw__relay_of(s, &i) != NULL)
			bytes += s->len;
	}
	return bytes;
}

int tw__relay_turn(const struct tw__relay *r, size_t i)
{
	return r->fd >= 0 && r->err == 0 && !r->done && r->cursor == i;
}

int tw__relay_claim(struct tw__relay *r, size_t i, void (*wake)(void *warg), void *warg)
{
	if (i >= r->n || i < r->cursor || r->f[i].state != F_FREE)
		return TW_EINVAL;
	r->f[i].state = F_CLAIMED;
	r->f[i].wake = wake;
	r->f[i].warg = warg;
	if (i == r->cursor && r->fd >= 0)
		event_active(r->kick_ev, 0, 0);
	return 0;
}

void tw__relay_unclaim(struct tw__relay *r, size_t i)
{
	if (i < r->cursor || i >= r->n || r->f[i].state != F_CLAIMED)
		return; /* consumed */
	r->f[i].state = F_DEAD;
	if (i == r->cursor && r->fd >= 0)
		event_active(r->kick_ev, 0, 0);
}

/* Bytes of frame `cursor` from the socket into the relay's pipe, or into
 * its buffer when it holds no pipe: > 0 there are some, 0 wait, < 0
 * failed. */
static int fill(struct tw__relay *r, uint64_t left)
{
	int piped = r->pipe[0] >= 0;
	size_t cap = piped ? PIPE_BYTES : BUF_BYTES;
	size_t want = left < cap ? (size_t)left : cap;
	if (!piped && r->buf == NULL && (r->buf = malloc(BUF_BYTES)) == NULL) {
		fail(r, TW_ENOMEM, "relay buffer: out of memory");
		return -1;
	}
	for (;;) {
		ssize_t n = piped ? splice(r->fd, NULL, r->pipe[1], NULL, want,
					   SPLICE_F_MOVE | SPLICE_F_NONBLOCK)
				  : recv(r->fd, r->buf, want, MSG_DONTWAIT);
		if (n > 0) {
			if (piped) {
				r->pipe_bytes += (uint64_t)n;
			} else {
				r->buf_off = 0;
				r->buf_len = (size_t)n;
			}
			r->sock_left -= (uint64_t)n;
			r->taken += (uint64_t)n;
			return 1;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			wait_source(r);
			return 0;
		}
		lost(r, n);
		return -1;
	}
}

/* splice(2) into a socket has no MSG_NOSIGNAL: a write to a connection
 * the peer has reset raises SIGPIPE (EPIPE), and the library never
 * raises it (stream_comm.c sends with MSG_NOSIGNAL). So SIGPIPE is
 * blocked while a pump splices out, and one raised meanwhile is taken
 * before unblocking: three syscalls per pump, however many splices it
 * makes. Taken whatever splice returned: a splice that moved some bytes
 * before its next send failed with EPIPE returns the count, with SIGPIPE
 * raised (check_relay relay_destination_closed_no_sigpipe saw it). One
 * that was pending before (blocked by the caller) is left alone. */
struct sigpipe_guard {
	int on, had;
	sigset_t set, old;
};

static ssize_t splice_out(struct sigpipe_guard *g, int pfd, int dfd, size_t n)
{
	if (!g->on) {
		sigset_t pending;
		sigemptyset(&g->set);
		sigaddset(&g->set, SIGPIPE);
		pthread_sigmask(SIG_BLOCK, &g->set, &g->old);
		/* unblocked until now, none can be pending for this thread */
		g->had = sigismember(&g->old, SIGPIPE) && sigpending(&pending) == 0 &&
			 sigismember(&pending, SIGPIPE);
		g->on = 1;
	}
	return splice(pfd, NULL, dfd, NULL, n, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
}

static void sigpipe_restore(struct sigpipe_guard *g)
{
	int e = errno;
	if (!g->on)
		return;
	if (!g->had) {
		struct timespec zero = {0, 0};
		(void)sigtimedwait(&g->set, NULL, &zero);
	}
	pthread_sigmask(SIG_SETMASK, &g->old, NULL);
	errno = e;
}

static int dest_busy(size_t moved)
{
	return moved > 0 ? 0 : TW_EAGAIN;
}

static int pump(struct tw__relay *r, size_t i, int dfd, size_t max, size_t *moved,
		struct sigpipe_guard *g)
{
	while (*moved < max && r->cursor == i) {
		struct frame *f = &r->f[i];
		uint64_t left = f->len - r->cur_off;
		ssize_t n;
		if (left == 0) { /* an empty frame */
			next_frame(r);
			break;
		}
		if (held(r) == 0 && r->prefix_off < r->prefix_len) {
			size_t k = r->prefix_len - r->prefix_off;
			n = send(dfd, r->prefix + r->prefix_off, k < left ? k : (size_t)left,
				 MSG_NOSIGNAL | MSG_DONTWAIT);
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
				return dest_busy(*moved);
			if (n < 0)
				return TW_EIO;
			r->prefix_off += (size_t)n;
		} else {
			/* a pipe of the loop's; with all taken, through user space */
			int piped = r->pipe_bytes > 0 || (r->buf_off == r->buf_len && take_pipe(r));
			int rv = held(r) > 0 ? 1 : fill(r, left);
			if (rv <= 0) {
				give_pipe(r); /* empty: another relay may use it meanwhile */
				return rv < 0 ? r->err : 0;
			}
			n = piped ? splice_out(g, r->pipe[0], dfd, (size_t)r->pipe_bytes)
				  : send(dfd, r->buf + r->buf_off, r->buf_len - r->buf_off,
					 MSG_NOSIGNAL | MSG_DONTWAIT);
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
				return dest_busy(*moved);
			if (n <= 0)
				return TW_EIO;
			if (!piped) {
				r->buf_off += (size_t)n;
			} else if ((r->pipe_bytes -= (uint64_t)n) == 0) {
				give_pipe(r);
			}
		}
		r->cur_off += (uint64_t)n;
		*moved += (size_t)n;
		if (r->cur_off == f->len)
			next_frame(r);
	}
	return 0;
}

int tw__relay_pump(struct tw__relay *r, size_t i, int dfd, size_t max, size_t *moved)
{
	struct sigpipe_guard g = {0};
	int rv;
	*moved = 0;
	if (r->err != 0)
		return r->err;
	if (r->fd < 0 || i != r->cursor)
		return 0; /* its turn has not come: woken when it does */
	rv = pump(r, i, dfd, max, moved, &g);
	sigpipe_restore(&g);
	if (rv == 0 && r->cursor != i) /* the next frame's claimant, a drain, or the end */
		event_active(r->kick_ev, 0, 0);
	return rv;
}

/* tw_relay_watch_end's fn runs once: from the loop once the end is known
 * (on_told), or from the context's teardown before that (kill_watch). */
static void watch_free(struct relay_watch *w)
{
	event_free(w->ev);
	free(w);
}

static void on_told(evutil_socket_t fd, short what, void *arg)
{
	struct relay_watch *w = arg;
	(void)fd;
	(void)what;
	tw__ctx_untrack(&w->node);
	w->fn(w->err, w->why, w->arg);
	watch_free(w);
}

static void kill_watch(struct tw__node *n)
{
	struct relay_watch *w = (struct relay_watch *)n;
	int waiting = w->pprev != NULL; /* on its relay's list: the end is not known */
	if (waiting && (*w->pprev = w->next) != NULL)
		w->next->pprev = w->pprev;
	if (waiting)
		w->fn(TW_ECANCELED, "the context was freed before the relay ended", w->arg);
	else
		w->fn(w->err, w->why, w->arg);
	watch_free(w);
}

int tw_relay_watch_end(const tw_slice *frame, tw_relay_ended_fn fn, void *arg)
{
	struct tw__relay *r;
	struct relay_watch *w;
	size_t i;
	if (frame == NULL || fn == NULL || (r = tw__relay_of(frame, &i)) == NULL)
		return TW_EINVAL;
	if ((w = calloc(1, sizeof(*w))) == NULL)
		return TW_ENOMEM;
	if ((w->ev = event_new(r->ctx->base, -1, 0, on_told, w)) == NULL) {
		free(w);
		return TW_ENOMEM;
	}
	w->fn = fn;
	w->arg = arg;
	tw__ctx_track(r->ctx, &w->node, kill_watch);
	w->next = r->watches;
	w->pprev = &r->watches;
	if (r->watches != NULL)
		r->watches->pprev = &w->next;
	r->watches = w;
	if (r->err != 0 || r->done) /* over already: told on the next pass */
		ended(r);
	return 0;
}
