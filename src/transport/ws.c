/* SPDX-License-Identifier: BSD-3-Clause */
/* The ws:// and wss:// transports (docs/design.md, WebSocket): connect
 * and listen over TCP (ws) or TLS (wss), then drive the HTTP upgrade
 * (ws_upgrade.c, sans-I/O) on the new comm; once it is done the comm is
 * handed out (ws_comm.h). */
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include <taskwire/error.h>

#include "core/pass.h"
#include "transport/transport.h"
#include "transport/ws_comm.h"

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
	if (cb != NULL) {
		tw__comm_connected(&w->sock.base, w->connect_deadline_ms);
		cb(&w->sock.base, 0, w->cb_arg);
	} else
		w->l->accept_cb(w->l, &w->sock.base, w->l->arg);
}

void tw__wsc_upgrade_write(struct ws *w)
{
	while (w->hs_sent < w->hs_len) {
		struct iovec iov = {w->hs_out + w->hs_sent, w->hs_len - w->hs_sent};
		ssize_t n = w->sock.io->writev(w->sock.io_arg, w->sock.fd, &iov, 1);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
			event_add(w->sock.wev, NULL); /* rare: a 300-byte write on a fresh socket */
			return;
		}
		if (n < 0) {
			upgrade_failed(w, TW_EIO, tw__sock_io_error(&w->sock));
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
			       n == 0 ? "connection closed during the upgrade"
				      : tw__sock_io_error(&w->sock));
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
	tw__wsc_upgrade_write(w);
	return 0;
}

/* Read until the upgrade is judged or nothing is left: TLS may hold
 * bytes already taken from the socket, which readiness will not report. */
void tw__wsc_upgrade_read(struct ws *w)
{
	while (upgrade_read_once(w))
		;
}

void tw__wsc_upgrade_timeout(struct ws *w)
{
	char why[160];
	/* the connect timeout as set: it ran from the connect's start */
	snprintf(why, sizeof(why), "no %s within %u ms (the %s)",
		 w->client ? "answer from the server" : "upgrade request",
		 (unsigned)(w->by_connect ? w->sock.base.limits.connect_timeout_ms : w->upgrade_ms),
		 w->by_connect ? "connect timeout" : "handshake timeout");
	upgrade_failed(w, TW_ETIMEDOUT, why);
}

/* deadline_ms: a client's connect deadline (0: none). */
static int ws_new(tw_context *ctx, int fd, const struct tw__stream_io *io, void *io_arg, int client,
		  uint64_t deadline_ms, struct ws **out)
{
	struct ws *w = calloc(1, sizeof(*w));
	struct timeval tv;
	uint64_t ms;
	if (w == NULL)
		return TW_ENOMEM;
	if ((w->hs_out = malloc(TW__WS_REQUEST_MAX)) == NULL ||
	    tw__sock_init(&w->sock, &tw__wsc_ops, &tw__wsc_hooks, ctx, fd,
			  io == &tw__tcp_io ? "ws" : "wss", io, io_arg,
			  sizeof(struct out_msg)) != 0) {
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
	w->connect_deadline_ms = deadline_ms;
	/* from now: a wss upgrade starts in the pass of the TLS step that
	 * ended the handshake (core/pass.h) */
	ms = (uint64_t)w->upgrade_ms + tw__pass_lag_ms(ctx->base);
	tv.tv_sec = (time_t)(ms / 1000);
	tv.tv_usec = (suseconds_t)(ms % 1000) * 1000;
	evtimer_add(w->sock.timer, &tv);
	*out = w;
	return 0;
}

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
	tw__wsc_upgrade_write(w);
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
		if (c != NULL && c->ops == &tw__wsc_ops && ((struct ws *)c)->l == l &&
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

/* One entry for both schemes: wss is ws over TLS (u->scheme is exactly
 * "ws" or "wss", as tw__transport_find matched it). */
static int ws_listen(tw_context *ctx, const struct tw__uri *u, tw_accept_cb cb, void *arg,
		     tw_listener **out)
{
	int tls = strcmp(u->scheme, "wss") == 0;
	int rv;
	if ((rv = path_refused(ctx, u)) != 0)
		return rv;
	if (tls)
		rv = tw__tls_listen_then(ctx, u, "wss", server_then, cb, arg, out);
	else
		rv = tw__tcp_listen_with(ctx, u, "ws", plain_accept, cb, arg, out);
	if (rv != 0)
		return rv;
	atomic_store_explicit(tls ? &tls_destroy : &tcp_destroy, (*out)->destroy,
			      memory_order_relaxed);
	(*out)->destroy = tls ? wss_listener_destroy : ws_listener_destroy;
	return 0;
}

static int ws_connect(tw_context *ctx, const struct tw__uri *u, tw_connect_cb cb, void *arg)
{
	if (path_refused(ctx, u) != 0)
		return TW_EADDR;
	if (strcmp(u->scheme, "wss") == 0)
		return tw__tls_connect_then(ctx, u, client_then, cb, arg);
	return tw__tcp_connect_with(ctx, u, plain_client, NULL, cb, arg);
}

const struct tw__transport tw__ws_transport = {"ws", ws_listen, ws_connect};
const struct tw__transport tw__wss_transport = {"wss", ws_listen, ws_connect};
