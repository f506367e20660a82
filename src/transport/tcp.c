/* SPDX-License-Identifier: BSD-3-Clause */
/* tcp:// comms: connector and listener on libevent, stream framing over a
 * plain socket (docs/design.md, Receive path (tcp); Dask's
 * distributed/comm/tcp.py). */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <event2/dns.h>
#include <event2/event.h>
#include <event2/listener.h>

#include <taskwire/error.h>

#include "core/pass.h"
#include "transport/comm_impl.h"
#include "transport/dns.h"
#include "transport/stream_comm.h"
#include "transport/transport.h"

/* One buffer goes through recv/send: the kernel skips copying in and
 * checking an iovec array, which small RPCs measurably pay for. */
static ssize_t tcp_readv(void *io, int fd, const struct iovec *iov, int n)
{
	(void)io;
	return n == 1 ? recv(fd, iov->iov_base, iov->iov_len, 0) : readv(fd, iov, n);
}

/* sendmsg, not writev: MSG_NOSIGNAL turns a dead peer into EPIPE instead
 * of a process-killing SIGPIPE. */
static ssize_t tcp_writev(void *io, int fd, const struct iovec *iov, int n)
{
	struct msghdr mh;
	(void)io;
	if (n == 1)
		return send(fd, iov->iov_base, iov->iov_len, MSG_NOSIGNAL);
	memset(&mh, 0, sizeof(mh));
	mh.msg_iov = (struct iovec *)iov;
	mh.msg_iovlen = (size_t)n;
	return sendmsg(fd, &mh, MSG_NOSIGNAL);
}

static ssize_t tcp_peek(void *io, int fd, void *buf, size_t len)
{
	(void)io;
	return recv(fd, buf, len, MSG_PEEK);
}

/* tcp(7): MSG_TRUNC discards the bytes instead of copying them out.
 * peeked holds them already (valgrind checks recv's buffer even then). */
static ssize_t tcp_discard(void *io, int fd, void *peeked, size_t len)
{
	(void)io;
	return recv(fd, peeked, len, MSG_TRUNC);
}

static void tcp_shutdown(void *io, int fd)
{
	(void)io;
	shutdown(fd, SHUT_WR);
}

const struct tw__stream_io tw__tcp_io = {
	.readv = tcp_readv,
	.writev = tcp_writev,
	.shutdown = tcp_shutdown,
	.peek = tcp_peek,
	.discard = tcp_discard,
};

/* The kernel's largest keepalive idle time and interval (tcp(7)). */
#define KEEPALIVE_MAX_SECS 32767

/* Dask's set_tcp_timeout (distributed/comm/tcp.py), on a connected
 * socket: keepalive finds peers that vanished from an idle connection,
 * the user timeout peers that stopped acknowledging or reading what we
 * send; both within `ms` (at most INT_MAX: the setter refuses more). */
static void set_tcp_timeout(int fd, uint32_t ms)
{
	int probes = 10, secs = (int)(ms / 1000), idle, interval;
	unsigned user = ms;
	if (ms == 0)
		return;
	setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user, sizeof(user));
	if (secs < probes + 1)
		return;
	idle = secs / 4 > 2 ? secs / 4 : 2;
	interval = (secs - idle) / probes > 1 ? (secs - idle) / probes : 1;
	if (interval > KEEPALIVE_MAX_SECS)
		interval = KEEPALIVE_MAX_SECS;
	idle = secs - interval * probes;
	if (idle > KEEPALIVE_MAX_SECS) /* the user timeout still bounds it all */
		idle = KEEPALIVE_MAX_SECS;
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
}

/* TCP_NODELAY: a message's last segment must not wait for an ACK. */
static void tune_socket(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
}

static void hints_for(struct evutil_addrinfo *hints, int flags)
{
	memset(hints, 0, sizeof(*hints));
	hints->ai_family = AF_UNSPEC;
	hints->ai_socktype = SOCK_STREAM;
	hints->ai_protocol = IPPROTO_TCP;
	hints->ai_flags = flags;
}

/* Listeners resolve at once (a name blocks the caller: listen on numeric
 * addresses from a running loop). */
static int resolve(const struct tw__uri *u, int passive, struct evutil_addrinfo **out)
{
	struct evutil_addrinfo hints;
	char port[8];
	hints_for(&hints, passive ? EVUTIL_AI_PASSIVE : 0);
	snprintf(port, sizeof(port), "%u", (unsigned)u->port);
	return evutil_getaddrinfo(u->host, port, &hints, out) == 0 ? 0 : TW_EADDR;
}

/* Connector: numeric hosts resolve at once, names through libevent's
 * asynchronous resolver (evdns: /etc/resolv.conf and /etc/hosts, or the
 * application's, tw_context_set_dns_base), so the loop never waits on DNS.
 * Then each address is tried in turn, as Python's create_connection
 * does (localhost is ::1 and 127.0.0.1). One timer bounds it all. */

struct connect_req {
	struct tw__node node;
	tw_context *ctx;
	int fd;
	int err;                               /* the last attempt's, reported when none is left */
	int os_err;                            /* its errno, for tw_context_last_error */
	int gai_err;                           /* the lookup's error, when it failed */
	int timed_out;                         /* the connect timeout ended it */
	uint64_t deadline_ms;                  /* tw__mono_ms when it runs out: every stage's */
	struct event *ev;                      /* the socket of this attempt becoming writable */
	struct event *step;                    /* go on from the loop, never from tw_comm_connect */
	struct event *timer;                   /* the connect timeout */
	struct evdns_getaddrinfo_request *dns; /* the lookup in flight */
	struct tw__dns *resolver;              /* its reference, while in flight */
	int orphan;                            /* freed: waits for its lookup's report */
	struct evutil_addrinfo *ai, *next;     /* the addresses; the next to try */
	tw__upgrade_fn upgrade;
	tw__then_fn then; /* for upgrade: the layer above TLS (wss), or NULL */
	tw_connect_cb cb;
	void *arg;
	struct tw__uri uri;
};

static void end_attempt(struct connect_req *r)
{
	tw__event_free(r->ev);
	r->ev = NULL;
	if (r->fd >= 0)
		close(r->fd);
	r->fd = -1;
}

/* With a lookup in flight, r stays until evdns reports its cancel. */
static void connect_free(struct connect_req *r)
{
	end_attempt(r);
	tw__event_free(r->step);
	tw__event_free(r->timer);
	r->step = r->timer = NULL;
	if (r->ai != NULL)
		evutil_freeaddrinfo(r->ai);
	r->ai = r->next = NULL;
	if (r->dns != NULL) {
		r->orphan = 1;
		evdns_getaddrinfo_cancel(r->dns);
		return;
	}
	free(r);
}

static void kill_connect(struct tw__node *n)
{
	connect_free((struct connect_req *)n);
}

static int map_errno(int e)
{
	switch (e) {
	case ECONNREFUSED: return TW_ECONNREFUSED;
	case ETIMEDOUT: return TW_ETIMEDOUT;
	default: return TW_EIO;
	}
}

static void attempt_failed(struct connect_req *r, int e)
{
	r->err = map_errno(e);
	r->os_err = e;
}

/* Every failed connect says why in tw_context_last_error just before its
 * callback, so the text there is its own, never another connect's. */
static void say_failed(struct connect_req *r, int err)
{
	if (r->timed_out)
		tw__ctx_seterr(r->ctx, "connect to %s:%u timed out: no connection within %u ms%s",
			       r->uri.host, (unsigned)r->uri.port,
			       (unsigned)r->ctx->limits.connect_timeout_ms,
			       r->dns != NULL ? " (still resolving the name)" : "");
	else if (r->gai_err != 0)
		tw__ctx_seterr(r->ctx, "cannot resolve %s: %s", r->uri.host,
			       evutil_gai_strerror(r->gai_err));
	else
		tw__ctx_seterr(r->ctx, "connect to %s:%u: %s", r->uri.host, (unsigned)r->uri.port,
			       r->os_err != 0 ? strerror(r->os_err) : tw_strerror(err));
}

/* Connected (the socket goes to the transport's upgrade step, which
 * reports to the application), or failed. */
static void finish_connect(struct connect_req *r, int err)
{
	tw__ctx_untrack(&r->node);
	if (err == 0) {
		/* connected: not earlier, where it would also cut SYN retries */
		set_tcp_timeout(r->fd, r->ctx->limits.tcp_timeout_ms);
		r->upgrade(r->ctx, r->fd, &r->uri, r->cb, r->arg, r->then, r->deadline_ms);
		r->fd = -1;
	} else {
		say_failed(r, err);
		r->cb(NULL, err, r->arg);
	}
	connect_free(r);
}

static void on_writable(evutil_socket_t fd, short what, void *arg);

/* Start a connect to the next address; none left: report the last
 * attempt's error. */
static void try_next(struct connect_req *r)
{
	for (; r->next != NULL; r->next = r->next->ai_next) {
		const struct evutil_addrinfo *a = r->next;
		r->fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (r->fd < 0) {
			attempt_failed(r, errno);
			continue;
		}
		if (connect(r->fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
			attempt_failed(r, errno);
			end_attempt(r);
			continue;
		}
		tune_socket(r->fd);
		if ((r->ev = event_new(r->ctx->base, r->fd, EV_WRITE, on_writable, r)) == NULL ||
		    event_add(r->ev, NULL) != 0) {
			end_attempt(r);
			finish_connect(r, TW_ENOMEM);
			return;
		}
		return;
	}
	finish_connect(r, r->err != 0 ? r->err : TW_EIO);
}

static void on_writable(evutil_socket_t fd, short what, void *arg)
{
	struct connect_req *r = arg;
	int soerr = 0;
	socklen_t sl = sizeof(soerr);
	(void)fd;
	(void)what;
	if (getsockopt(r->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0) {
		finish_connect(r, 0);
		return;
	}
	attempt_failed(r, soerr != 0 ? soerr : errno);
	end_attempt(r);
	r->next = r->next->ai_next;
	try_next(r);
}

static void on_step(evutil_socket_t fd, short what, void *arg)
{
	struct connect_req *r = arg;
	(void)fd;
	(void)what;
	if (r->ai == NULL) {
		finish_connect(r, r->err); /* the name did not resolve */
		return;
	}
	try_next(r);
}

static void on_connect_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct connect_req *r = arg;
	(void)fd;
	(void)what;
	r->timed_out = 1;
	finish_connect(r, TW_ETIMEDOUT);
}

static void on_resolved(int result, struct evutil_addrinfo *res, void *arg)
{
	struct connect_req *r = arg;
	struct tw__dns *d = r->resolver;
	r->dns = NULL;
	r->resolver = NULL;
	if (r->orphan) { /* the connect ended meanwhile */
		if (res != NULL)
			evutil_freeaddrinfo(res);
		free(r);
		tw__dns_unref(d, 1);
		return;
	}
	tw__dns_unref(d, 1);
	if (result != 0 || res == NULL) {
		r->err = TW_EADDR;
		r->gai_err = result != 0 ? result : EVUTIL_EAI_FAIL;
		if (res != NULL)
			evutil_freeaddrinfo(res);
	} else {
		r->ai = r->next = res;
	}
	event_active(r->step, EV_TIMEOUT, 0); /* may run inside evdns_getaddrinfo */
}

/* Numeric at once; a name through evdns. TW_EADDR: neither. */
static int start_resolve(struct connect_req *r)
{
	struct evutil_addrinfo hints;
	char port[8];
	int rv;
	struct tw__dns *d;
	hints_for(&hints, EVUTIL_AI_NUMERICHOST);
	snprintf(port, sizeof(port), "%u", (unsigned)r->uri.port);
	rv = evutil_getaddrinfo(r->uri.host, port, &hints, &r->ai);
	if (rv == 0) {
		r->next = r->ai;
		event_active(r->step, EV_TIMEOUT, 0);
		return 0;
	}
	if (rv != EVUTIL_EAI_NONAME)
		return TW_EADDR;
	if ((d = tw__dns_resolver(r->ctx)) == NULL)
		return TW_ENOMEM;
	hints_for(&hints, 0);
	d->refs++;
	r->resolver = d;
	/* NULL: answered already (hosts file), on_resolved has run */
	r->dns = evdns_getaddrinfo(d->base, r->uri.host, port, &hints, on_resolved, r);
	return 0;
}

static void plain_upgrade(tw_context *ctx, int fd, const struct tw__uri *u, tw_connect_cb cb,
			  void *arg, tw__then_fn then, uint64_t deadline_ms)
{
	tw_comm *c = NULL;
	int err = tw__stream_new(ctx, fd, "tcp", &tw__tcp_io, NULL, &c);
	(void)then;
	if (err != 0) {
		tw__ctx_seterr(ctx, "connect to %s:%u: %s", u->host, (unsigned)u->port,
			       tw_strerror(err));
		close(fd);
	} else {
		tw__comm_connected(c, deadline_ms);
	}
	cb(c, err, arg);
}

static int tcp_connect(tw_context *ctx, const struct tw__uri *u, tw_connect_cb cb, void *arg)
{
	return tw__tcp_connect_with(ctx, u, plain_upgrade, NULL, cb, arg);
}

int tw__tcp_connect_with(tw_context *ctx, const struct tw__uri *u, tw__upgrade_fn upgrade,
			 tw__then_fn then, tw_connect_cb cb, void *arg)
{
	struct connect_req *r = calloc(1, sizeof(*r));
	struct timeval tv;
	uint64_t ms;
	int rv;
	if (r == NULL)
		return TW_ENOMEM;
	r->ctx = ctx;
	r->fd = -1;
	r->upgrade = upgrade;
	r->then = then;
	r->cb = cb;
	r->arg = arg;
	r->uri = *u;
	r->step = event_new(ctx->base, -1, 0, on_step, r);
	r->timer = evtimer_new(ctx->base, on_connect_timeout, r);
	if (r->step == NULL || r->timer == NULL) {
		connect_free(r);
		return TW_ENOMEM;
	}
	if ((rv = start_resolve(r)) != 0) {
		connect_free(r);
		return rv;
	}
	tw__ctx_track(ctx, &r->node, kill_connect);
	r->node.connect_arg = arg;
	r->deadline_ms = tw__mono_ms() + ctx->limits.connect_timeout_ms;
	/* from now, as the deadline: not from the pass's start (core/pass.h) */
	ms = (uint64_t)ctx->limits.connect_timeout_ms + tw__pass_lag_ms(ctx->base);
	tv.tv_sec = (time_t)(ms / 1000);
	tv.tv_usec = (suseconds_t)(ms % 1000) * 1000;
	event_add(r->timer, &tv);
	return 0;
}

/* Listener. */

/* Accept-queue length. libevent's default (backlog -1) is 128: when more
 * clients connect at once (a cluster's workers at start-up), the kernel
 * drops their SYNs and each retries after a second. 2048 is Dask's
 * distributed.comm.socket-backlog; the kernel caps it at somaxconn. */
#define LISTEN_BACKLOG 2048

struct tcp_listener {
	struct tw_listener base;
	struct evconnlistener *lev; /* NULL on a stand-in */
	tw__accept_fd_fn on_fd;
	/* With loop threads: a stand-in per other loop (stand[i] on loop
	 * i + 1), which owns the comms and handshakes of the sockets handed
	 * to that loop, as this listener does on its own. */
	struct tcp_listener **stand;
	unsigned nstand;
	tw_context *loop;     /* a stand-in's loop */
	struct tw__call gone; /* a stand-in: its free, posted to its loop */
};

/* An accepted socket on its way to another loop, with what the listener
 * was (its destroy, callbacks and `then` are set once listening). */
struct handoff {
	struct tw__call call; /* first: freed with the record */
	struct tcp_listener *to;
	struct tw_listener from;
	tw__accept_fd_fn on_fd;
	int fd;
	struct sockaddr_storage peer;
	struct tw__loop_conf conf;
};

/* On the stand-in's loop: it becomes the listener of this socket. */
static void handoff_run(void *arg)
{
	struct handoff *h = arg;
	struct tcp_listener *to = h->to;
	tw__loop_conf_apply(to->loop, &h->conf);
	if (to->base.ctx == NULL) {
		tw__listener_init(&to->base, to->loop, h->from.destroy, NULL, NULL);
		memcpy(to->base.address, h->from.address, sizeof(to->base.address));
	}
	to->base.accept_cb = h->from.accept_cb;
	to->base.arg = h->from.arg;
	to->base.then = h->from.then;
	to->base.error_cb = h->from.error_cb;
	to->base.error_arg = h->from.error_arg;
	to->on_fd = h->on_fd;
	to->on_fd(&to->base, h->fd, (struct sockaddr *)&h->peer);
}

static void handoff(struct tcp_listener *l, tw_context *loop, int fd, const struct sockaddr *sa,
		    int salen)
{
	struct handoff *h = calloc(1, sizeof(*h));
	if (h == NULL) {
		close(fd);
		return;
	}
	h->to = l->stand[loop->index - 1];
	h->from = l->base;
	h->on_fd = l->on_fd;
	h->fd = fd;
	if (salen > 0)
		memcpy(&h->peer, sa,
		       (size_t)salen < sizeof(h->peer) ? (size_t)salen : sizeof(h->peer));
	tw__loop_conf_take(l->base.ctx, &h->conf);
	h->call.fn = handoff_run;
	h->call.arg = h;
	h->call.owned = 1;
	tw__context_post(loop, &h->call);
}

static void on_accept(struct evconnlistener *lev, evutil_socket_t fd, struct sockaddr *sa,
		      int salen, void *arg)
{
	struct tcp_listener *l = arg;
	tw_context *loop = tw__ctx_next_loop(l->base.ctx);
	(void)lev;
	tune_socket(fd);
	set_tcp_timeout(fd, l->base.ctx->limits.tcp_timeout_ms);
	if (loop != l->base.ctx)
		handoff(l, loop, fd, sa, salen);
	else
		l->on_fd(&l->base, fd, sa);
}

/* On its loop: a stand-in goes with its listener (the sockets handed
 * before that got theirs: the queue is in order). */
static void stand_free(void *arg)
{
	struct tcp_listener *s = arg;
	if (s->base.ctx == NULL) {
		free(s);
		return;
	}
	tw__ctx_untrack(&s->base.node);
	s->base.destroy(&s->base);
}

/* A listener that failed to start: its stand-ins never reached a loop. */
static void stands_drop(struct tcp_listener *l)
{
	for (unsigned i = 0; i < l->nstand; i++)
		free(l->stand[i]);
	free(l->stand);
	free(l);
}

static int stand_new(struct tcp_listener *l, tw_context *ctx)
{
	if (ctx->nloops <= 1)
		return 0;
	if ((l->stand = calloc(ctx->nloops - 1, sizeof(*l->stand))) == NULL)
		return TW_ENOMEM;
	for (; l->nstand < ctx->nloops - 1; l->nstand++) {
		struct tcp_listener *s = calloc(1, sizeof(*s));
		if (s == NULL)
			return TW_ENOMEM;
		s->loop = ctx->loops[l->nstand + 1];
		s->gone.fn = stand_free;
		s->gone.arg = s;
		l->stand[l->nstand] = s;
	}
	return 0;
}

static void plain_accept(tw_listener *l, int fd, const struct sockaddr *peer)
{
	tw_comm *c;
	if (tw__stream_new(l->ctx, fd, "tcp", &tw__tcp_io, NULL, &c) != 0) {
		close(fd);
		return;
	}
	tw__comm_set_peer(c, peer, "tcp");
	l->accept_cb(l, c, l->arg);
}

/* accept() failed (EMFILE, ENOBUFS ...): keep listening; the pending
 * connection is retried on the next wakeup. */
static void on_accept_error(struct evconnlistener *lev, void *arg)
{
	(void)lev;
	(void)arg;
}

static void tcp_listener_destroy(tw_listener *base)
{
	struct tcp_listener *l = (struct tcp_listener *)base;
	for (unsigned i = 0; i < l->nstand; i++)
		tw__context_post(l->stand[i]->loop, &l->stand[i]->gone);
	free(l->stand);
	if (l->lev != NULL)
		evconnlistener_free(l->lev);
	free(l);
}

static int tcp_listen(tw_context *ctx, const struct tw__uri *u, tw_accept_cb cb, void *arg,
		      tw_listener **out)
{
	return tw__tcp_listen_with(ctx, u, "tcp", plain_accept, cb, arg, out);
}

int tw__tcp_listen_with(tw_context *ctx, const struct tw__uri *u, const char *scheme,
			tw__accept_fd_fn on_fd, tw_accept_cb cb, void *arg, tw_listener **out)
{
	struct evutil_addrinfo *ai;
	struct tcp_listener *l;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	int err;
	if (resolve(u, 1, &ai) != 0)
		return TW_EADDR;
	if ((l = calloc(1, sizeof(*l))) == NULL) {
		evutil_freeaddrinfo(ai);
		return TW_ENOMEM;
	}
	l->on_fd = on_fd;
	if (stand_new(l, ctx) != 0) {
		evutil_freeaddrinfo(ai);
		stands_drop(l);
		return TW_ENOMEM;
	}
	l->lev = evconnlistener_new_bind(ctx->base, on_accept, l,
					 LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE |
						 LEV_OPT_CLOSE_ON_EXEC,
					 LISTEN_BACKLOG, ai->ai_addr, (int)ai->ai_addrlen);
	err = errno;
	evutil_freeaddrinfo(ai);
	if (l->lev == NULL) {
		stands_drop(l);
		return err == EADDRINUSE ? TW_EADDRINUSE : TW_EIO;
	}
	evconnlistener_set_error_cb(l->lev, on_accept_error);
	getsockname(evconnlistener_get_fd(l->lev), (struct sockaddr *)&ss, &sl);
	tw__uri_format_sa(scheme, (struct sockaddr *)&ss, l->base.address, sizeof(l->base.address));
	tw__listener_init(&l->base, ctx, tcp_listener_destroy, cb, arg);
	*out = &l->base;
	return 0;
}

const struct tw__transport tw__tcp_transport = {"tcp", tcp_listen, tcp_connect};
