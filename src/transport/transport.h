/* SPDX-License-Identifier: BSD-3-Clause */
/* The transports (tcp, tls, ws, wss) by URI scheme, their listeners, and
 * how they stack: ws on tcp, tls on tcp, wss on tls (docs/design.md, Layers
 * and files). Callers (tw_listener_new, tw_comm_connect) go through the
 * table, so a transport plugs in without touching them. transport/ only
 * (the layer above sees transport/upper.h); every member runs on the
 * context's loop thread. The comms themselves: comm_impl.h. */
#ifndef TW_TRANSPORT_TRANSPORT_H
#define TW_TRANSPORT_TRANSPORT_H

#include <stdint.h>
#include <sys/socket.h>

#include <taskwire/comm.h>

#include "core/context.h"
#include "transport/uri.h"

struct tw__transport {
	const char *scheme;
	/* Bind and listen on u; accept_cb runs per comm. Returns as tw_listener_new. */
	int (*listen)(tw_context *ctx, const struct tw__uri *u, tw_accept_cb accept_cb, void *arg,
		      tw_listener **out);
	/* Start connecting to u; cb runs once, later. Returns as tw_comm_connect. */
	int (*connect)(tw_context *ctx, const struct tw__uri *u, tw_connect_cb cb, void *arg);
};

/* The transports, by scheme; NULL when unknown. */
const struct tw__transport *tw__transport_find(const char *scheme);
extern const struct tw__transport tw__tcp_transport;
extern const struct tw__transport tw__tls_transport;
extern const struct tw__transport tw__ws_transport;
extern const struct tw__transport tw__wss_transport;

struct tw__stream_io;

/* The step after TCP (and TLS) for transports layered on them (ws, wss):
 * it owns fd and io_arg. Client side: u, cb and arg; server side: l. */
typedef void (*tw__then_fn)(tw_context *ctx, int fd, const struct tw__stream_io *io, void *io_arg,
			    const struct tw__uri *u, tw_connect_cb cb, void *arg, tw_listener *l,
			    uint64_t deadline_ms, const struct sockaddr *peer);

struct tw_listener {
	struct tw__node node;
	tw_context *ctx;
	void (*destroy)(tw_listener *l);
	tw_accept_cb accept_cb;
	void *arg;
	char address[128];
	tw__then_fn then;            /* after TLS, for wss */
	tw_accept_error_cb error_cb; /* tw_listener_set_error_cb */
	void *error_arg;
};

/* Set up the common part of a listener (tracked by the context). */
void tw__listener_init(tw_listener *l, tw_context *ctx, void (*destroy)(tw_listener *),
		       tw_accept_cb cb, void *arg);
/* An accepted connection of l failed before it became a comm: tell the
 * application (tw_listener_set_error_cb); why is also on the context. */
void tw__listener_failed(tw_listener *l, int err, const char *peer, const char *why);

/* TCP underneath other transports. tw__tcp_connect_with connects (with the
 * context's connect timeout) and hands the connected socket to `upgrade`,
 * which owns it and reports to cb (a failed connect reports to cb
 * directly); `host` is the URI's host, for TLS names. The connect timeout
 * covers every stage until the comm is usable: `deadline_ms` (tw__mono_ms)
 * is when it runs out, and the TLS handshake and ws upgrade end there if
 * their own clocks would end later (then: 0 on the accepting side).
 * `then` goes to `upgrade` as it is: the step after TLS for wss, NULL
 * otherwise (a function pointer, since ISO C converts none to void *). */
typedef void (*tw__upgrade_fn)(tw_context *ctx, int fd, const struct tw__uri *u, tw_connect_cb cb,
			       void *arg, tw__then_fn then, uint64_t deadline_ms);
/* The milliseconds left until deadline_ms (0 if past), capped at own_ms;
 * *by_connect set when the connect's deadline is the sooner bound. */
uint32_t tw__stage_ms(uint64_t deadline_ms, uint32_t own_ms, int *by_connect);
int tw__tcp_connect_with(tw_context *ctx, const struct tw__uri *u, tw__upgrade_fn upgrade,
			 tw__then_fn then, tw_connect_cb cb, void *arg);
/* TLS underneath ws: after the TLS handshake, `then` continues on the TLS
 * io (the connect or accept is reported by it, not by tls.c). */
int tw__tls_connect_then(tw_context *ctx, const struct tw__uri *u, tw__then_fn then,
			 tw_connect_cb cb, void *arg);
int tw__tls_listen_then(tw_context *ctx, const struct tw__uri *u, const char *scheme,
			tw__then_fn then, tw_accept_cb cb, void *arg, tw_listener **out);
/* tw__tcp_listen_with listens and hands each accepted socket to on_fd,
 * which owns it; the listener's address uses `scheme`. */
typedef void (*tw__accept_fd_fn)(tw_listener *l, int fd, const struct sockaddr *peer);
int tw__tcp_listen_with(tw_context *ctx, const struct tw__uri *u, const char *scheme,
			tw__accept_fd_fn on_fd, tw_accept_cb cb, void *arg, tw_listener **out);

#endif
