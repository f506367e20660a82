/* SPDX-License-Identifier: BSD-3-Clause */
/* What every comm has (struct tw_comm), the operations a transport fills
 * in for its comms, and the calls a transport makes on its comm (comm.c).
 * transport/ only: the layer above sees transport/upper.h. Loop thread. */
#ifndef TW_TRANSPORT_COMM_IMPL_H
#define TW_TRANSPORT_COMM_IMPL_H

#include <sys/socket.h>

#include <taskwire/comm.h>

#include "core/context.h"
#include "core/stats.h"
#include "transport/linger.h"
#include "transport/rate.h"
#include "transport/upper.h"

/* Per-comm operations of one transport. */
struct tw__comm_ops {
	int (*start)(tw_comm *c);             /* begin reading */
	int (*write)(tw_comm *c, tw_msg *m);  /* queue; ownership as tw_comm_write */
	uint64_t (*queued)(const tw_comm *c); /* bytes not yet written */
	void (*close)(tw_comm *c);            /* flush, then end with 0 */
	void (*stop)(tw_comm *c);             /* release I/O now; no callbacks */
	void (*destroy)(tw_comm *c);          /* free the memory */
	void (*set_place)(tw_comm *c, tw__place_fn fn, void *arg);
	void (*pause)(tw_comm *c);           /* stop reading until start */
	int (*rx_pending)(const tw_comm *c); /* bytes of a next message already taken in */
	void (*fail)(tw_comm *c, int err);   /* bad input: write what is queued, then end */
	uint64_t (*acked)(const tw_comm *c); /* bytes its peer's TCP acknowledged, all */
	/* The context's pause limit changed (tw_context_set_receive_budget_pause_ms):
	 * watches timed by it look again now, and then at its new step. NULL:
	 * none. */
	void (*pause_limit_set)(tw_comm *c);
};

/* What every comm has. The application owns the comm; `depth` counts the
 * callbacks running so a free inside one is deferred. */
struct tw_comm {
	const struct tw__comm_ops *ops;
	tw_context *ctx;
	struct tw__node node;
	struct tw__limits limits;
	tw_recv_cb recv_cb;
	tw_close_cb close_cb;
	tw_drain_cb drain_cb;
	void *arg;
	struct tw__stats stats;
	int depth;        /* callbacks of this comm on the stack */
	int free_pending; /* tw_comm_free ran inside a callback */
	int ended;        /* no more callbacks */
	int closing;      /* no more writes (tw__comm_closing) */
	/* tw_comm_last_error; 512: the memory limit's and the receive
	 * budget's texts, with the bytes not delivered after them, passed
	 * 256 and were cut mid-word, the undelivered count lost */
	char error[512];
	char peer[128], local[128];
	struct event *timeout_ev; /* tw__comm_arm_timeout */
	/* tw_comm_set_recv_deadline_ms: the next message within deadline_ms
	 * of the last (or of the call); 0: off. The timer is not re-armed per
	 * message: when it fires early it sleeps for the rest. */
	struct event *deadline_ev;
	uint32_t deadline_ms;
	uint64_t last_msg_ms;     /* tw__mono_ms of the last message, or of the arming */
	int app_paused;           /* tw_comm_pause */
	struct tw__rate rate;     /* tw__comm_rate_watch */
	struct tw__linger linger; /* tw__linger_start */
	/* The upper layer (transport/upper.h): its hooks and its state. */
	const struct tw__upper_ops *up_ops;
	void *up;
	struct tw__watch *watchers;
	/* References (tw_comm_hold); the owner's is one of them. The memory
	 * goes when the last is dropped and no callback of c is running. */
	int refs;
	int end_err;    /* why it ended, for the end watches */
	int end_known;  /* the end was told to the owner: watches may run */
	int close_owed; /* tw__comm_end_owed: the owner's close runs later */
	int owner_gone; /* tw_comm_free ran */
	struct tw_comm_watch *end_watches, **end_tail;
	struct event *end_ev; /* runs the end watches, outside any call */
	/* The receive budget's claim (core/budget.h; the transport sets
	 * rx_claim.granted). */
	struct tw__claim rx_claim;
	/* A relay of its input runs (transport/relay.h): the comm must not
	 * be freed for being idle, or its relay frames' messages break. */
	int relaying;
	/* A comm from tw_comm_connect: what the connect timeout had left when
	 * it was handed to the connect's callback (ms, at least 1); 0 for
	 * any other comm (tw__comm_connected). */
	uint32_t connect_left_ms;
	/* The memory limit's look (transport/overload.c): the look that last
	 * saw bytes queued (0: none did); the bytes its peer had acknowledged
	 * and the time when a look first saw them queued (from), and when its
	 * peer last took some (acked, still). */
	uint64_t ov_look, ov_from_acked, ov_from_ms, ov_acked, ov_still_ms;
	unsigned ov_drips; /* bit i: its peer took bytes i looks ago */
	/* Of the bytes queued (ops->queued), those of relay frames not yet
	 * written (transport/relay.h): they wait in their source's socket,
	 * not in memory, so they count in no budget and in no memory limit;
	 * and the writer waits for its relay's source (the peer took all we
	 * had), so the memory limit does not judge the peer by them. */
	uint64_t relay_queued;
	int relay_wait;
	/* Ended because its peer takes nothing (the memory limit, the relay
	 * stall rule): its socket is reset (SO_LINGER 0), not closed with a
	 * FIN behind bytes the peer will never read, which left the socket in
	 * FIN-WAIT-1 with MiBs of kernel memory and the peer never learned
	 * that the comm ended (evidence18 D2). */
	int reset_on_end;
	/* Bad input came while the upper layer still held messages to
	 * deliver (a request decoding on the offload pool): its error, kept
	 * until they are delivered (tw__comm_delivered), so that their
	 * replies go out before the comm closes; nothing is read meanwhile. */
	int fail_deferred;
};

/* Set ctx's memory limit look (ctx->mem_cut) to transport/overload.c's. */
void tw__overload_attach(tw_context *ctx);

/* The relay of c's input is over (relaying cleared): tell the watchers
 * that asked (tw__watch.relayed). */
void tw__comm_relayed(tw_comm *c);
/* The comm a context node belongs to, or NULL when it is no comm. */
tw_comm *tw__node_comm(struct tw__node *n);
/* Set up the common part (tracked by the context). */
void tw__comm_init(tw_comm *c, const struct tw__comm_ops *ops, tw_context *ctx);
/* Deliver a received message (borrowed by the callback). Returns 1 when
 * the comm may still be used, 0 when it ended or was freed meanwhile:
 * then the caller must not touch it. */
int tw__comm_deliver(tw_comm *c, tw_msg *m);
/* The queue drained: run the drain callback. Same returns. */
int tw__comm_drained(tw_comm *c);
/* tw__comm_hold / tw__comm_release: keep c alive across a stretch that
 * runs callbacks (a tw_comm_free inside waits); release frees it if one
 * came and returns 0 then, else !c->ended. */
void tw__comm_hold(tw_comm *c);
int tw__comm_release(tw_comm *c);
/* c, made by a connect whose timeout runs out at deadline_ms
 * (tw__mono_ms), is about to be handed to the connect's callback: keep
 * what is left of it for the Dask handshake that follows
 * (tw__comm_connect_left_ms). */
void tw__comm_connected(tw_comm *c, uint64_t deadline_ms);
/* Fill c->peer and c->local from the socket, as scheme:// URIs. */
void tw__comm_set_addresses(tw_comm *c, int fd, const char *scheme);
/* The peer's address as accept gave it (NULL: keep what the socket
 * said): a client that reset before its comm was made has none left. */
void tw__comm_set_peer(tw_comm *c, const struct sockaddr *sa, const char *scheme);
/* The code of a failed socket read or write, by errno: EPROTO is the TLS
 * layer's, ETIMEDOUT the kernel's TCP timeout (tw_context_set_tcp_timeout_ms). */
int tw__io_err(int e);

#endif
