/* SPDX-License-Identifier: BSD-3-Clause */
/* The protocol layer's state of one comm: what the handshake negotiated,
 * where split payloads land, the decoded-delivery queue, whether a server
 * serves it. The comm holds it as its upper layer (transport/upper.h) and
 * frees it with itself; the transport never looks inside. Loop thread. */
#ifndef TW_PROTOCOL_PCOMM_H
#define TW_PROTOCOL_PCOMM_H

#include "transport/upper.h"

struct tw__dask_place;
struct tw__deliver_q;

struct tw__pcomm {
	const char *compression;       /* negotiated by the handshake (static), or NULL */
	void *handshake;               /* a handshake running (handshake.c), freed with free() */
	struct tw__dask_place *place;  /* after a handshake: the placement hook's state */
	struct tw__deliver_q *deliver; /* decoded delivery (delivery.c), or NULL */
	int served;                    /* a tw_server's: its callbacks, its reference */
	int hs_by_connect;             /* the handshake ended at the connect timeout */
};

/* c's protocol state, made on first use; NULL when out of memory. */
struct tw__pcomm *tw__pcomm_get(tw_comm *c);
/* c's protocol state, or NULL when it has none yet. */
struct tw__pcomm *tw__pcomm_find(const tw_comm *c);

/* Decoded delivery's side of the hooks (delivery.c). detach: the comm
 * goes or its owner freed it; items in a worker keep q until they come
 * back. resume: the application resumed reading. backlog: messages
 * received, not yet delivered. */
void tw__deliver_detach(struct tw__deliver_q *q);
void tw__deliver_resume(struct tw__deliver_q *q);
int tw__deliver_backlog(const struct tw__deliver_q *q);

#endif
