/* SPDX-License-Identifier: BSD-3-Clause */
/* Small writes in one buffer (gather.c; docs/design.md, Send path). */
#ifndef TW_TRANSPORT_GATHER_H
#define TW_TRANSPORT_GATHER_H

#include <stdint.h>
#include <sys/uio.h>

/* Small pieces of a write (preludes, WebSocket headers, small frames)
 * are copied into one buffer of up to this many bytes: one send(2) with
 * no iovec over tcp, one record instead of one per piece over tls. */
#define TW__GATHER_MAX 4096

/* tw__gather_small: copy the leading iovecs of iov[0..k-1], while they
 * total at most TW__GATHER_MAX bytes, into buf (TW__GATHER_MAX bytes) and
 * make them iov[0]; returns the new count (k, buf unused, when fewer than
 * two fit). Counted in the write_bytes_gathered stat. Given the same
 * unsent bytes again, iov[0] is never shorter than before (a queue only
 * grows behind them), as a TLS write retry needs (SSL_write(3): the
 * retry passes the same bytes). */
int tw__gather_small(struct iovec *iov, int k, uint8_t *buf);

#endif
