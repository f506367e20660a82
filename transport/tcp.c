/* tcp:// comms: connector and listener on libevent, stream framing over a
 * plain socket (DESIGN.md, Wire protocol: TCP and TLS). */
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

#include <event2/event.h>
#include <event2/listener.h>

#include <taskwire/error.h>

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

static void tcp_shutdown(void *io, int fd)
{
	(void)io;
	shutdown(fd, SHUT_WR);
}

const struct tw__stream_io tw__tcp_io = {tcp_readv, tcp_writev, tcp_shutdown, NULL, NULL, NULL};

/* TCP_NODELAY: a message's last segment must not wait for an ACK.
 * Keepalive: find peers that vanished without a FIN. */
static void tune_socket(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
}

static int resolve(const struct tw__uri *u, int passive, struct evutil_addrinfo **out)
{
	struct evutil_addrinfo hints;
	char port[8];
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_protocol = IPPROTO_TCP;
	hints.ai_flags = passive ? EVUTIL_AI_PASSIVE : 0;
	snprintf(port, sizeof(port), "%u", (unsigned)u->port);
	return evutil_getaddrinfo(u->host, port, &hints, out) == 0 ? 0 : TW_EADDR;
}

/* Connector. */

struct connect_req {
	struct tw__node node;
	tw_context *ctx;
	int fd;
	int err;
	struct event *ev;
	tw__upgrade_fn upgrade;
	void *up_arg;
	tw_connect_cb cb;
	void *arg;
	struct tw__uri uri;
};

static void connect_free(struct connect_req *r)
{
	if (r->fd >= 0)
		close(r->fd);
	event_free(r->ev);
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

/* The TCP connection is up (or failed): hand the socket to the
 * transport's upgrade step, which reports to the application. */
static void on_connected(evutil_socket_t fd, short what, void *arg)
{
	struct connect_req *r = arg;
	int err = r->err, soerr = 0;
	socklen_t sl = sizeof(soerr);
	(void)fd;
	tw__ctx_untrack(&r->node);
	if (err == 0 && (what & EV_TIMEOUT))
		err = TW_ETIMEDOUT;
	if (err == 0 && getsockopt(r->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr != 0)
		err = map_errno(soerr);
	if (err == 0) {
		r->upgrade(r->ctx, r->fd, &r->uri, r->cb, r->arg, r->up_arg);
		r->fd = -1;
	} else {
		r->cb(NULL, err, r->arg);
	}
	connect_free(r);
}

static void plain_upgrade(tw_context *ctx, int fd, const struct tw__uri *u, tw_connect_cb cb,
			  void *arg, void *up_arg)
{
	tw_comm *c = NULL;
	int err = tw__stream_new(ctx, fd, "tcp", &tw__tcp_io, NULL, &c);
	(void)u;
	(void)up_arg;
	if (err != 0)
		close(fd);
	cb(c, err, arg);
}

static int tcp_connect(tw_context *ctx, const struct tw__uri *u, tw_connect_cb cb, void *arg)
{
	return tw__tcp_connect_with(ctx, u, plain_upgrade, NULL, cb, arg);
}

int tw__tcp_connect_with(tw_context *ctx, const struct tw__uri *u, tw__upgrade_fn upgrade,
			 void *up_arg, tw_connect_cb cb, void *arg)
{
	struct evutil_addrinfo *ai;
	struct connect_req *r;
	struct timeval tv;
	if (resolve(u, 0, &ai) != 0)
		return TW_EADDR;
	if ((r = calloc(1, sizeof(*r))) == NULL) {
		evutil_freeaddrinfo(ai);
		return TW_ENOMEM;
	}
	r->ctx = ctx;
	r->upgrade = upgrade;
	r->up_arg = up_arg;
	r->cb = cb;
	r->arg = arg;
	r->uri = *u;
	r->fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	r->ev = event_new(ctx->base, r->fd, EV_WRITE, on_connected, r);
	if (r->ev == NULL) {
		if (r->fd >= 0)
			close(r->fd);
		free(r);
		evutil_freeaddrinfo(ai);
		return TW_ENOMEM;
	}
	if (r->fd < 0)
		r->err = TW_EIO;
	else if (connect(r->fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS)
		r->err = map_errno(errno);
	else
		tune_socket(r->fd);
	evutil_freeaddrinfo(ai);
	tw__ctx_track(ctx, &r->node, kill_connect);
	/* Report even an immediate failure from the loop, never from here. */
	if (r->err != 0) {
		event_active(r->ev, EV_WRITE, 0);
		return 0;
	}
	tv.tv_sec = ctx->limits.connect_timeout_ms / 1000;
	tv.tv_usec = (ctx->limits.connect_timeout_ms % 1000) * 1000;
	event_add(r->ev, &tv);
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
	struct evconnlistener *lev;
	tw__accept_fd_fn on_fd;
};

static void on_accept(struct evconnlistener *lev, evutil_socket_t fd, struct sockaddr *sa,
		      int salen, void *arg)
{
	struct tcp_listener *l = arg;
	(void)lev;
	(void)sa;
	(void)salen;
	tune_socket(fd);
	l->on_fd(&l->base, fd);
}

static void plain_accept(tw_listener *l, int fd)
{
	tw_comm *c;
	if (tw__stream_new(l->ctx, fd, "tcp", &tw__tcp_io, NULL, &c) != 0) {
		close(fd);
		return;
	}
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
	l->lev = evconnlistener_new_bind(ctx->base, on_accept, l,
					 LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE |
						 LEV_OPT_CLOSE_ON_EXEC,
					 LISTEN_BACKLOG, ai->ai_addr, (int)ai->ai_addrlen);
	err = errno;
	evutil_freeaddrinfo(ai);
	if (l->lev == NULL) {
		free(l);
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
