/* SPDX-License-Identifier: BSD-3-Clause */
/* The byte I/O under a socket comm: a plain socket (tcp.c) or TLS (tls.c),
 * which the stream comm and the WebSocket comm read and write through. */
#ifndef TW_TRANSPORT_STREAM_IO_H
#define TW_TRANSPORT_STREAM_IO_H

#include <stddef.h>
#include <sys/types.h>
#include <sys/uio.h>

/* readv/writev and what the layer holds that the socket does not show. */
struct tw__stream_io {
	/* readv/writev semantics: > 0 bytes, 0 EOF (read), -1 with errno. */
	ssize_t (*readv)(void *io, int fd, const struct iovec *iov, int n);
	ssize_t (*writev)(void *io, int fd, const struct iovec *iov, int n);
	/* Orderly end of our side (TLS close_notify, then FIN). */
	void (*shutdown)(void *io, int fd);
	/* Text of the last failure when errno alone does not say it, or NULL. */
	const char *(*error)(void *io);
	/* 1 when the layer holds bytes already read from the socket (TLS
	 * records), which the socket's readiness will not announce; or NULL. */
	int (*pending)(void *io);
	void (*free)(void *io);
	/* 1 when the layer holds bytes of a write that did not go through
	 * (an OpenSSL record after WANT_WRITE), which the next write must
	 * repeat unchanged, with nothing written between; or NULL. */
	int (*write_held)(void *io);
	/* 1 when the next read reports an end or error that arrived after
	 * the bytes of an earlier one (a TLS close_notify in the same segment):
	 * it is not a message's bytes, but the socket will not announce it
	 * either; or NULL. */
	int (*end_held)(void *io);
	/* Read ahead without taking (recv MSG_PEEK; same returns as readv),
	 * then take `len` of the bytes seen, discarding them (recv
	 * MSG_TRUNC: the kernel copies nothing). discard gets the buffer the
	 * peek filled: nothing is written there, but a checker (valgrind)
	 * wants an addressable one. NULL when the layer cannot look without
	 * taking (TLS). Lets a read-ahead stop at a message boundary:
	 * frame_rx.h. */
	ssize_t (*peek)(void *io, int fd, void *buf, size_t len);
	ssize_t (*discard)(void *io, int fd, void *peeked, size_t len);
};

/* The plain socket (tcp.c). */
extern const struct tw__stream_io tw__tcp_io;

#endif
