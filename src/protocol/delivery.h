/* SPDX-License-Identifier: BSD-3-Clause */
/* Internal hooks of decoded delivery (protocol/delivery.c). */
#ifndef TW_PROTOCOL_DELIVERY_H
#define TW_PROTOCOL_DELIVERY_H

#include <taskwire/offload.h>

/* Send comm's next decoded messages (those already queued too) and its
 * close to new callbacks, with arg; the drain callback is cleared (its arg
 * would be the new one). Works from inside the decoded callback. Returns
 * 0, or TW_EINVAL when comm has no decoded delivery. Loop thread. */
int tw__deliver_rebind(tw_comm *comm, tw_decoded_cb cb, tw_close_cb close_cb, void *arg);
/* The decoded callback of comm, or NULL when it has no decoded delivery. */
tw_decoded_cb tw__deliver_cb(const tw_comm *comm);

#endif
