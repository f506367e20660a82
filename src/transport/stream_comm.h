/* SPDX-License-Identifier: BSD-3-Clause */
/* A comm over a connected stream socket (tcp, tls) with stream framing
 * (stream_comm.c; docs/design.md, Receive path and Send path). */
#ifndef TW_TRANSPORT_STREAM_COMM_H
#define TW_TRANSPORT_STREAM_COMM_H

#include <taskwire/comm.h>

#include "core/context.h"
#include "transport/stream_io.h"

/* 1 when c is a stream comm (tcp, tls). */
int tw__stream_is(const tw_comm *c);
/* A stream comm on the connected socket fd, named scheme://. On success
 * it owns fd and io_arg (freed through io->free); on failure the caller
 * still does. Returns 0, or TW_ENOMEM. */
int tw__stream_new(tw_context *ctx, int fd, const char *scheme, const struct tw__stream_io *io,
		   void *io_arg, tw_comm **out);

#endif
