/* SPDX-License-Identifier: BSD-3-Clause */
/* Raw POSIX sockets for bad peers and hand-made servers, on loopback:
 * the bytes on the wire are exactly what the test writes. */
#ifndef TW_TESTS_SUPPORT_SOCK_H
#define TW_TESTS_SUPPORT_SOCK_H

#include <stddef.h>

#include <event2/event.h>

/* Blocking connect to "scheme://host:port" (an IPv6 host in brackets,
 * "tcp://[::1]:5"); the scheme is not looked at. Returns a blocking fd
 * (close-on-exec); asserts that the connect worked. */
int ts_raw_connect(const char *uri);

/* Connect to uri, then reset at once (SO_LINGER 0) before the server's
 * loop ran: a client gone before accept or its handshake. peer gets the
 * client's own address as the server must name it, "scheme://IP:PORT"
 * (from getsockname: 127.0.0.1 on loopback, the test namespace's
 * address across tests/netns-check.sh's link). */
void ts_raw_reset(const char *uri, const char *scheme, char *peer, size_t len);

/* A TCP socket bound to 127.0.0.1 on a free port, listening with backlog
 * (or, with backlog < 0, bound and not listening: connects to it are
 * refused and nobody else can take the port). uri gets
 * "scheme://127.0.0.1:PORT". flags: SOCK_NONBLOCK and the like, besides
 * SOCK_CLOEXEC. Asserts on failure; returns the fd. */
int ts_raw_listen(const char *scheme, int backlog, int flags, char *uri, size_t len);
/* ts_raw_listen on host, a numeric address: "127.0.0.1" or "::1" (uri
 * then gets "scheme://[::1]:PORT", brackets as RFC 3986 section 3.2.2
 * writes an IPv6 host). */
int ts_raw_listen_at(const char *host, const char *scheme, int backlog, int flags, char *uri,
		     size_t len);

/* 1 when a socket can bind ::1 (IPv6 loopback), else 0 (a kernel or a
 * network namespace without IPv6): tests on ::1 skip then, saying so. */
int ts_have_ipv6(void);

/* A free TCP port on 127.0.0.1 (bound, then released). */
unsigned ts_free_port(void);

/* Send n bytes, driving base while the socket is full (the other end may
 * read on this thread). Stops early when the peer closed the connection
 * (EPIPE, ECONNRESET); returns the bytes sent. Asserts when nothing moves
 * for the hang guard's time. */
size_t ts_raw_send(struct event_base *base, int fd, const void *p, size_t n, int ms);

#endif
