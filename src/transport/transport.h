/* SPDX-License-Identifier: BSD-3-Clause */
/* The internal transport contract, for transport/ only (the layer above
 * sees transport/upper.h). Callers (tw_listener_new, tw_comm_connect) go
 * through this table, so tls and ws plug in without touching them. Every
 * member runs on the context's loop thread. */
#ifndef TW_TRANSPORT_TRANSPORT_H
#define TW_TRANSPORT_TRANSPORT_H

#include <taskwire/comm.h>

#include "core/context.h"
#include "core/stats.h"
#include "transport/frame_rx.h"
#include "transport/upper.h"
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
};

/* The clock of the minimum receive rate (tw_context_set_min_receive_rate).
 * The transport makes the timer `ev` with its comm (its callback calls
 * tw__comm_rate_due) and frees it; comm.c runs the clock. */
struct tw__rate {
	struct event *ev;
	int on;            /* the clock runs and ev is armed */
	uint64_t start_ms; /* when it started (CLOCK_MONOTONIC) */
	uint64_t bytes;    /* stats.bytes_received then */
	uint64_t msgs;     /* stats.msgs_received then: a message since is a new one */
};

/* The close linger (tw_context_set_close_linger_ms): while a comm closes
 * (tw_comm_close, a peer's half-close, a failure whose replies still go
 * out), how long bytes may stand still before the close gives up. The
 * transport makes the timer `ev` with its comm (its callback calls
 * tw__linger_due) and frees it; comm.c keeps the books. */
struct tw__linger {
	struct event *ev;
	int on;           /* a close is under way: tw__linger_start ran */
	int fd;           /* the socket, for SIOCOUTQ */
	int told;         /* the error text already says what was not delivered */
	int fin;          /* our FIN was sent (shutdown) */
	uint64_t last_ms; /* bytes last moved (CLOCK_MONOTONIC) */
	uint64_t sent;    /* stats.bytes_sent at the last look */
	uint64_t unacked; /* the kernel's unacknowledged bytes at the last look */
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
	char error[256];
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
	/* The context's budgets (core/budget.h): the receive budget's claim
	 * (the transport sets rx_claim.granted), and a place among the
	 * writers the write budget refused. */
	struct tw__claim rx_claim, wq_claim;
	/* A relay of its input runs (transport/relay.h): the comm must not
	 * be freed for being idle, or its relay frames' messages break. */
	int relaying;
};

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

/* The receive budget (tw_context_set_receive_budget_bytes). Before a read
 * of up to *len bytes of a large message on c, of which `got` bytes have
 * arrived and at most `left` are still to come: the bytes are reserved a
 * step (TW__RX_STEP_BYTES) ahead of what arrived, and *len is cut to what
 * is reserved. 0, or TW_EAGAIN: stop reading; c->rx_claim.granted runs
 * (from inside some other comm's release: schedule the read, do not run
 * it) once the step is reserved. tw__comm_rx_release gives back all c
 * holds (a message complete, a comm ending) and drops c from the
 * waiters. */
#define TW__RX_STEP_BYTES ((uint64_t)4 << 20)
int tw__comm_rx_budget(tw_comm *c, uint64_t got, uint64_t left, size_t *len);
void tw__comm_rx_release(tw_comm *c);
/* The memory of c's write queue, for the receive budget: a message of
 * n bytes (tw_msg_bytes) entered it (hold), or left it written or
 * dropped, after it was freed (unhold). */
void tw__comm_wq_hold(tw_comm *c, uint64_t n);
void tw__comm_wq_unhold(tw_comm *c, uint64_t n);
/* The write budget (tw_context_set_write_budget_bytes): bytes entering
 * c's write queue, and leaving it (written, or dropped). */
void tw__comm_wq_add(tw_comm *c, uint64_t n);
void tw__comm_wq_sub(tw_comm *c, uint64_t n);

/* An accepted connection of l failed before it became a comm: tell the
 * application (tw_listener_set_error_cb); why is also on the context. */
void tw__listener_failed(tw_listener *l, int err, const char *peer, const char *why);

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
/* The minimum receive rate. A transport calls tw__comm_rate_watch when
 * its socket ran dry (a read would block) and when reading resumes, with
 * busy = a message is partly received: the clock starts for a message
 * that has none (bytes and time are counted from now), and stops when no
 * message is in progress. Cheap when idle with the clock stopped, which
 * is what small messages that arrive whole leave behind. */
void tw__comm_rate_watch(tw_comm *c, int busy);
/* Stop the clock: we stop reading (pause, close, stop). */
void tw__comm_rate_stop(tw_comm *c);
/* The timer fired; busy as above. Returns 0 when the peer keeps up (the
 * timer is armed for the next check, or the clock stopped), or 1 when it
 * is too slow: the error text is set, and the transport ends the comm
 * with TW_ETIMEDOUT. Bytes unread in fd's socket count as received. */
int tw__comm_rate_due(tw_comm *c, int busy, int fd);

/* The close linger. tw__linger_start: a close began on socket fd; arms
 * the timer (idempotent). tw__linger_due, from the timer or when the
 * peer's end arrives: `queued` bytes are still ours to write (linger.fin
 * says our FIN is in the kernel: its sequence number is not a byte),
 * `end_sent` that our end (FIN, close_notify or close frame) went out,
 * `peer_done` that the peer's end arrived. Returns 1 when everything was
 * delivered (our end sent, nothing queued, the kernel's send queue
 * acknowledged by the peer's TCP) and the peer's end came or the wait for
 * it is over (the linger, at most TW__LINGER_END_MS): end the comm with
 * its close error; -1 when no byte moved for the linger: the error text
 * says how many bytes were not delivered, and the transport aborts
 * (tw__abort_fd) and ends the comm; 0 to wait (the timer is re-armed). */
#define TW__LINGER_END_MS 2000
void tw__linger_start(tw_comm *c, int fd);
int tw__linger_due(tw_comm *c, uint64_t queued, int end_sent, int peer_done);
/* Bytes in fd's send queue that the peer's TCP has not acknowledged
 * (SIOCOUTQ), our FIN excluded when fin_sent; 0 when unknown. */
uint64_t tw__unacked_bytes(int fd, int fin_sent);
/* Make close(fd) reset the connection (SO_LINGER 0): a close that gave
 * up leaves nothing for the kernel to retry. */
void tw__abort_fd(int fd);

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

/* Fill c->peer and c->local from the socket, as scheme:// URIs. */
void tw__comm_set_addresses(tw_comm *c, int fd, const char *scheme);
/* The peer's address as accept gave it (NULL: keep what the socket
 * said): a client that reset before its comm was made has none left. */
void tw__comm_set_peer(tw_comm *c, const struct sockaddr *sa, const char *scheme);
/* The code of a failed socket read or write, by errno: EPROTO is the TLS
 * layer's, ETIMEDOUT the kernel's TCP timeout (tw_context_set_tcp_timeout_ms). */
int tw__io_err(int e);

/* A comm over a connected stream socket (tcp, tls): stream framing. */
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
/* 1 when c is a stream comm (tcp, tls). */
int tw__stream_is(const tw_comm *c);
int tw__stream_new(tw_context *ctx, int fd, const char *scheme, const struct tw__stream_io *io,
		   void *io_arg, tw_comm **out);

void tw__listener_init(tw_listener *l, tw_context *ctx, void (*destroy)(tw_listener *),
		       tw_accept_cb cb, void *arg);

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
extern const struct tw__stream_io tw__tcp_io;
/* tw__tcp_listen_with listens and hands each accepted socket to on_fd,
 * which owns it; the listener's address uses `scheme`. */
typedef void (*tw__accept_fd_fn)(tw_listener *l, int fd, const struct sockaddr *peer);
int tw__tcp_listen_with(tw_context *ctx, const struct tw__uri *u, const char *scheme,
			tw__accept_fd_fn on_fd, tw_accept_cb cb, void *arg, tw_listener **out);

#endif
