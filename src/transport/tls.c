/* SPDX-License-Identifier: BSD-3-Clause */
/* tls:// comms: TCP, then an OpenSSL handshake driven by the loop, then
 * stream framing with SSL_read decrypting straight into each frame's block
 * and SSL_write taking pieces of at most INT_MAX bytes (docs/design.md,
 * TLS). */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <taskwire/error.h>

#include "core/pass.h"
#include "transport/comm_impl.h"
#include "transport/stream_comm.h"
#include "transport/tls_config.h"
#include "transport/transport.h"

struct tls_io {
	SSL *ssl;
	char *error;  /* ERROR_BYTES, made by the first error: an idle comm has none */
	int ssl_held; /* the last SSL_write_ex failed: OpenSSL holds its record */
	/* Records of a large write, gathered for one send (tls_writev): out
	 * holds out_len bytes of them, out_sent sent; their plaintext,
	 * out_plain bytes, is reported written once they are all sent. */
	uint8_t *out;
	size_t out_len, out_sent, out_plain;
	int read_end; /* an end or error came after bytes: read_ret, read_errno */
	ssize_t read_ret;
	int read_errno;
	int write_errno; /* a write failed after bytes: its errno, for the next */
};

enum { READING, WRITING };

#define ERROR_BYTES 256

/* The comm's error text, made on first use; NULL without memory (the
 * comm then reports strerror(errno)). */
static char *error_buf(struct tls_io *t)
{
	if (t->error == NULL && (t->error = calloc(1, ERROR_BYTES)) == NULL)
		return NULL;
	return t->error;
}

/* A failed SSL_read_ex/SSL_write_ex as a readv/writev result. A read
 * returns 0 at the end of the stream (close_notify, or a TCP EOF, which
 * SSL_OP_IGNORE_UNEXPECTED_EOF turns into the same); a write never
 * returns 0 (the caller would retry forever): once the peer has closed,
 * OpenSSL reports a failed write as SSL_ERROR_ZERO_RETURN, and that is
 * EPIPE. */
static ssize_t fail_now(struct tls_io *t, int e, int sys, int writing)
{
	unsigned long code;
	char *buf;
	switch (e) {
	case SSL_ERROR_WANT_READ:
	case SSL_ERROR_WANT_WRITE: errno = EAGAIN; return -1;
	case SSL_ERROR_ZERO_RETURN:
	case SSL_ERROR_SYSCALL:
		if (!writing && (e == SSL_ERROR_ZERO_RETURN || sys == 0))
			return 0;
		sys = sys != 0 ? sys : EPIPE;
		if ((buf = error_buf(t)) != NULL)
			snprintf(buf, ERROR_BYTES, "%s", strerror(sys));
		errno = sys;
		return -1;
	default:
		code = ERR_get_error();
		if ((buf = error_buf(t)) != NULL)
			ERR_error_string_n(code, buf, ERROR_BYTES);
		ERR_clear_error();
		errno = EPROTO;
		return -1;
	}
}

/* A write that failed after some of its bytes went reports them; its
 * error comes with the next write (tls_writev). The kernel reports a
 * socket's error once (ETIMEDOUT of the TCP timeout, ECONNRESET) and
 * EPIPE to every send after it: dropped, the comm ended with "Broken
 * pipe" instead of TW_ETIMEDOUT (check_faults comm_stall_writer, wss
 * under valgrind at load: its send of the next 256 KiB of records timed
 * out after the last call's had gone). */
static ssize_t keep_write_error(struct tls_io *t, size_t done)
{
	t->write_errno = errno != 0 ? errno : EPIPE;
	return (ssize_t)done;
}

/* After bytes, an end or error is kept for the next read (tls_end_held
 * says one is due): OpenSSL has taken it off the socket, which may never
 * be readable again (a close_notify in the same TCP segment as data,
 * with no FIN after it); a write's for the next write. */
static ssize_t io_fail(struct tls_io *t, int ret, size_t done, int writing)
{
	int sys = errno, e = SSL_get_error(t->ssl, ret);
	ssize_t r;
	if (done == 0)
		return fail_now(t, e, sys, writing);
	if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
		return (ssize_t)done;
	r = fail_now(t, e, sys, writing);
	if (writing)
		return keep_write_error(t, done);
	t->read_ret = r;
	t->read_errno = errno;
	t->read_end = 1;
	return (ssize_t)done; /* the error on the next call */
}

/* SSL_get_error reads the thread's error queue, which the application
 * and other comms share: an error left there would turn a plain "would
 * block" into a failure. Start each call with an empty queue (and errno,
 * which SSL_ERROR_SYSCALL reports). Peeking first: ERR_clear_error walks
 * all 16 slots of the queue even when it is empty, once per record
 * (2% of a tls echo's CPU, issue 20); the queue is almost always empty. */
static void io_begin(void)
{
	if (ERR_peek_error() != 0)
		ERR_clear_error();
	errno = 0;
}

/* OpenSSL's read buffer (read-ahead is on, tls_config.c): one recv takes
 * up to this many bytes, four full records, where its default (one record)
 * took a recv per record of a large message. Released when empty
 * (SSL_MODE_RELEASE_BUFFERS): an idle comm holds none. */
#define READ_BUFFER ((size_t)64 << 10)

/* Bytes one tls_readv may decrypt: the caller's read budget counts per
 * call, so a fast sender cannot keep one call (and the loop) busy. */
#define READ_CAP ((size_t)1 << 20)

/* Decrypt into the iovecs in order, record after record (SSL_read_ex
 * returns at most one record), until they are full, READ_CAP bytes were
 * read, or OpenSSL has nothing more without blocking: so a short result
 * means the socket is drained, as for a plain readv. */
static ssize_t read_behind(struct tls_io *t, const struct iovec *iov, int n);

static ssize_t tls_readv(void *io, int fd, const struct iovec *iov, int n)
{
	struct tls_io *t = io;
	size_t done = 0;
	(void)fd;
	if (t->read_end) {
		errno = t->read_errno;
		return t->read_ret;
	}
	if (t->out_len > 0) /* what a read writes (an alert) goes after them */
		return read_behind(t, iov, n);
	for (int i = 0; i < n && done < READ_CAP; i++) {
		uint8_t *p = iov[i].iov_base;
		size_t left = iov[i].iov_len;
		while (left > 0 && done < READ_CAP) {
			size_t want = left < READ_CAP - done ? left : READ_CAP - done, got = 0;
			int r;
			io_begin();
			r = SSL_read_ex(t->ssl, p, want, &got);
			if (r != 1)
				return io_fail(t, r, done, READING);
			done += got;
			p += got;
			left -= got;
		}
	}
	return (ssize_t)done;
}

/* One SSL_write per iovec, each at most INT_MAX bytes; a retry after
 * WANT_WRITE starts at the same byte with at least as many bytes, as
 * OpenSSL requires (the queue is rebuilt from the same frames). */
static ssize_t write_records(struct tls_io *t, const struct iovec *iov, int n)
{
	size_t done = 0;
	for (int i = 0; i < n; i++) {
		size_t want = iov[i].iov_len < INT_MAX ? iov[i].iov_len : INT_MAX, put = 0;
		int r;
		io_begin();
		r = SSL_write_ex(t->ssl, iov[i].iov_base, want, &put);
		t->ssl_held = r != 1;
		if (r != 1)
			return io_fail(t, r, done, WRITING);
		done += put;
		if (put < want)
			break;
	}
	return (ssize_t)done;
}

/* A large write's records are gathered GATHER_BYTES at a time and sent
 * with one send: OpenSSL writes each record (16 KiB at most) with a
 * send of its own, and the kernel's cost per send and per packet was
 * most of what a tls comm spent beyond blocking OpenSSL (issue 20).
 * GATHER_ROOM: what one SSL_write may add (a record, and a KeyUpdate
 * before it); writes of less than GATHER_MIN go record by record. */
#define GATHER_BYTES ((size_t)256 << 10)
#define GATHER_ROOM  ((size_t)2 * (16384 + 512))
#define GATHER_MIN   ((size_t)32 << 10)

/* Send the gathered records; 1 when all went out, 0 when the socket is
 * full, -1 on a socket error (errno). */
static int send_gathered(struct tls_io *t, int fd)
{
	while (t->out_sent < t->out_len) {
		ssize_t k = send(fd, t->out + t->out_sent, t->out_len - t->out_sent, MSG_NOSIGNAL);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
		t->out_sent += (size_t)k;
	}
	t->out_len = t->out_sent = 0;
	return 1;
}

/* A read while gathered records wait to be sent: anything OpenSSL writes
 * meanwhile (an alert; a KeyUpdate it owes goes with the next write) is
 * gathered behind them, so records leave in their order. */
static ssize_t read_behind(struct tls_io *t, const struct iovec *iov, int n)
{
	struct tw__tls_gather g = {t->out, t->out_len, GATHER_BYTES};
	ssize_t r;
	size_t was = t->out_len;
	tw__tls_gathering = &g;
	t->out_len = 0; /* tls_readv reads, and does not come back here */
	r = tls_readv(t, -1, iov, n);
	tw__tls_gathering = NULL;
	t->out_len = g.len > was ? g.len : was;
	return r;
}

/* Records gathered in t->out from the plaintext of iov, skipping its
 * first `skip` bytes, until they fill it or iov ends; the plaintext they
 * hold in *plain. 0, or a failed SSL_write_ex's io_fail result when
 * nothing was gathered (else its error comes on the next call). */
static ssize_t gather_records(struct tls_io *t, const struct iovec *iov, int n, size_t skip,
			      size_t *plain)
{
	struct tw__tls_gather g = {t->out, 0, GATHER_BYTES};
	ssize_t rv = 0;
	*plain = 0;
	tw__tls_gathering = &g;
	for (int i = 0; i < n && rv == 0; i++) {
		const uint8_t *p = iov[i].iov_base;
		size_t left = iov[i].iov_len;
		if (skip >= left) {
			skip -= left;
			continue;
		}
		p += skip, left -= skip, skip = 0;
		while (left > 0) {
			size_t put = 0;
			int r;
			if (g.cap - g.len < GATHER_ROOM) {
				rv = 1; /* full */
				break;
			}
			io_begin();
			r = SSL_write_ex(t->ssl, p, left < INT_MAX ? left : INT_MAX, &put);
			t->ssl_held = r != 1;
			if (r != 1) {
				/* WANT_WRITE: OpenSSL holds a record that did not
				 * fit; it goes out on the retry */
				if (*plain == 0)
					rv = io_fail(t, r, 0, WRITING);
				else
					rv = 1;
				break;
			}
			*plain += put, p += put, left -= put;
		}
	}
	tw__tls_gathering = NULL;
	t->out_len = g.len;
	t->out_sent = 0;
	return rv < 0 ? rv : 0;
}

/* Large writes gather records (see GATHER_BYTES); what is gathered and
 * not yet sent is held like OpenSSL's own held record: the plaintext is
 * reported written once its records are sent, write_held says a retry
 * is owed, and it must start at the same byte with at least as many. */
static ssize_t tls_writev(void *io, int fd, const struct iovec *iov, int n)
{
	struct tls_io *t = io;
	size_t total = 0, done = 0, plain;
	ssize_t rv;
	for (int i = 0; i < n; i++)
		total += iov[i].iov_len;
	if (t->write_errno != 0) { /* the last call's, after its bytes */
		errno = t->write_errno;
		return -1;
	}
	if (t->out_len > 0) { /* an earlier call's records: first */
		int s = send_gathered(t, fd);
		if (s <= 0) {
			if (s == 0)
				errno = EAGAIN;
			return -1;
		}
		done = t->out_plain;
		t->out_plain = 0;
	} else if (total < GATHER_MIN) {
		return write_records(t, iov, n);
	}
	while (total > done && total - done >= GATHER_MIN) {
		int s;
		if (t->out == NULL && (t->out = malloc(GATHER_BYTES)) == NULL)
			break; /* record by record */
		if ((rv = gather_records(t, iov, n, done, &plain)) < 0)
			return done > 0 ? keep_write_error(t, done) : rv;
		if (plain == 0)
			break;
		if ((s = send_gathered(t, fd)) < 0)
			return done > 0 ? keep_write_error(t, done) : -1;
		if (s == 0) {
			t->out_plain = plain;
			break;
		}
		done += plain;
		if (t->ssl_held)
			break;
	}
	if (t->out_len == 0) { /* an idle comm holds none */
		free(t->out);
		t->out = NULL;
	}
	if (done == 0) {
		errno = EAGAIN;
		return -1;
	}
	return (ssize_t)done;
}

static void tls_shutdown(void *io, int fd)
{
	struct tls_io *t = io;
	io_begin();
	/* close_notify, after the records gathered (never before them: the
	 * peer would fail on the sequence); no wait for the peer's */
	if (t->out_len == 0 || send_gathered(t, fd) == 1)
		SSL_shutdown(t->ssl);
	ERR_clear_error();
	shutdown(fd, SHUT_WR);
}

static const char *tls_error(void *io)
{
	struct tls_io *t = io;
	return t->error != NULL && t->error[0] ? t->error : NULL;
}

static void tls_free(void *io)
{
	struct tls_io *t = io;
	SSL_free(t->ssl);
	free(t->out);
	free(t->error);
	free(t);
}

static int tls_pending(void *io)
{
	return SSL_has_pending(((struct tls_io *)io)->ssl);
}

static int tls_end_held(void *io)
{
	return ((struct tls_io *)io)->read_end;
}

static int tls_write_held(void *io)
{
	const struct tls_io *t = io;
	return t->ssl_held || t->out_len > 0;
}

static const struct tw__stream_io tls_io_ops = {
	.readv = tls_readv,
	.writev = tls_writev,
	.shutdown = tls_shutdown,
	.error = tls_error,
	.pending = tls_pending,
	.free = tls_free,
	.write_held = tls_write_held,
	.end_held = tls_end_held,
};

/* A TLS handshake in progress, on either side. */
struct handshake {
	struct tw__node node;
	tw_context *ctx;
	int fd;
	SSL *ssl;
	struct event *ev;
	/* CLOCK_MONOTONIC (us) when its bound runs out: for a client bound
	 * by the connect timeout, the connect's own deadline (tcp.c), which
	 * every stage shares */
	uint64_t deadline_us;
	tw_listener *l;   /* server side */
	tw_connect_cb cb; /* client side */
	void *arg;
	tw__then_fn then;             /* the layer above (ws), or NULL for a tls comm */
	uint64_t connect_deadline_ms; /* client: when the connect timeout runs out */
	uint32_t timeout_ms;          /* the bound it has */
	int by_connect;               /* that bound is the connect timeout's */
	struct sockaddr_storage peer; /* server: the client, as accept gave it */
	int has_peer;
	struct tw__uri uri;
	/* In its context's queue of steps waiting for a pass (hs_queue). */
	struct handshake *qnext, **qprev;
	/* The SSL is made by the first step (hs_ssl), which the pass bounds:
	 * SSL_new is 15 us, and 500 connects accepted in one callback made
	 * a pass of 7 ms more. Until then the configuration's context, held. */
	SSL_CTX *ssl_ctx;
	int verify_host; /* client: check the name it connects to */
};

/* Handshake steps waiting for a pass with time for them (tw__pass_step):
 * a context's queue, in the order they came, run by a timer on the next
 * pass. A step waits here whatever woke it (the socket readable or
 * writable, the start of a connect or accept), so it never depends on
 * epoll reporting the socket again, and once the queue holds one, every
 * step waits behind it: a step woken later cannot overtake. */
struct hs_queue {
	struct event *ev;
	struct handshake *head, **tail;
};

static void q_release(void *state)
{
	struct hs_queue *q = state;
	/* the handshakes went first (kill_hs): none is left in it */
	tw__event_free(q->ev);
	free(q);
}

static const struct tw__ext_ops queue_ops = {.release = q_release};

static void q_unlink(struct handshake *h)
{
	if (h->qprev == NULL)
		return;
	*h->qprev = h->qnext;
	if (h->qnext != NULL)
		h->qnext->qprev = h->qprev;
	else
		((struct hs_queue *)tw__ctx_ext(h->ctx, &queue_ops))->tail = h->qprev;
	h->qnext = NULL, h->qprev = NULL;
}

static void hs_free(struct handshake *h)
{
	q_unlink(h);
	tw__event_free(h->ev);
	SSL_free(h->ssl);
	SSL_CTX_free(h->ssl_ctx);
	if (h->fd >= 0)
		close(h->fd);
	free(h);
}

static void kill_hs(struct tw__node *n)
{
	hs_free((struct handshake *)n);
}

/* The client's address (server side), in the listener's scheme. */
static void peer_text(const struct handshake *h, char *buf, size_t len)
{
	char scheme[8] = "tls";
	sscanf(h->l->address, "%7[a-z]", scheme);
	buf[0] = '\0';
	if (h->has_peer)
		tw__uri_format_sa(scheme, (const struct sockaddr *)&h->peer, buf, len);
}

static const struct sockaddr *peer_sa(const struct handshake *h)
{
	return h->has_peer ? (const struct sockaddr *)&h->peer : NULL;
}

/* A server's failed handshake is also told to the listener's error
 * callback: a client refused for its certificate left no trace before. */
static void hs_report(struct handshake *h, int err, const char *why)
{
	char peer[TW__URI_TEXT_BYTES];
	tw__ctx_untrack(&h->node);
	if (h->l != NULL) {
		peer_text(h, peer, sizeof(peer));
		tw__ctx_seterr(h->ctx, "TLS handshake with a client (%s) failed: %s", peer,
			       why != NULL ? why : tw_strerror(err));
		tw__listener_failed(h->l, err, peer, h->ctx->error);
	} else if (why != NULL) {
		tw__ctx_seterr(h->ctx, "TLS handshake with the server failed: %s", why);
	}
	if (h->l == NULL)
		h->cb(NULL, err, h->arg);
	hs_free(h);
}

/* Handshake done: the socket and SSL become a stream comm. */
static void hs_done(struct handshake *h)
{
	struct tls_io *t = calloc(1, sizeof(*t));
	tw_comm *c = NULL;
	int err = TW_ENOMEM;
	tw__ctx_untrack(&h->node);
	if (t != NULL && h->then != NULL) {
		tw__then_fn then = h->then;
		tw_context *ctx = h->ctx;
		int fd = h->fd;
		t->ssl = h->ssl;
		h->ssl = NULL, h->fd = -1;
		then(ctx, fd, &tls_io_ops, t, &h->uri, h->cb, h->arg, h->l, h->connect_deadline_ms,
		     peer_sa(h));
		hs_free(h);
		return;
	}
	if (t != NULL) {
		t->ssl = h->ssl;
		err = tw__stream_new(h->ctx, h->fd, "tls", &tls_io_ops, t, &c);
		if (err == 0) {
			h->ssl = NULL, h->fd = -1;
			tw__comm_set_peer(c, peer_sa(h), "tls");
		} else
			free(t);
	}
	if (c == NULL)
		tw__ctx_seterr(h->ctx, "TLS handshake with %s: %s",
			       h->l != NULL ? "a client" : "the server", tw_strerror(err));
	if (h->l != NULL && c != NULL)
		h->l->accept_cb(h->l, c, h->l->arg);
	else if (h->l == NULL) {
		if (c != NULL)
			tw__comm_connected(c, h->connect_deadline_ms);
		h->cb(c, err, h->arg);
	}
	hs_free(h);
}

static uint64_t mono_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static int remaining(const struct handshake *h, struct timeval *left)
{
	uint64_t now = mono_us(), rest;
	if (now >= h->deadline_us)
		return 0;
	rest = h->deadline_us - now;
	left->tv_sec = (time_t)(rest / 1000000);
	left->tv_usec = (suseconds_t)(rest % 1000000);
	return 1;
}

/* A client's connect timeout ran out: tw__mono_ms's clock, to the us. */
static int connect_over(const struct handshake *h)
{
	return h->l == NULL && h->connect_deadline_ms != 0 &&
	       mono_us() >= h->connect_deadline_ms * 1000;
}

/* OpenSSL's reason, with the certificate check's own ("certificate has
 * expired", "unable to get local issuer certificate") when that failed. */
static void hs_reason(SSL *ssl, int r, char *why, size_t len)
{
	long v = SSL_get_verify_result(ssl);
	size_t n;
	if (ERR_peek_error() != 0)
		ERR_error_string_n(ERR_get_error(), why, len);
	else
		snprintf(why, len, "%s", r == 0 || errno == 0 ? "peer closed" : strerror(errno));
	ERR_clear_error();
	n = strlen(why);
	if (v != X509_V_OK && n < len)
		snprintf(why + n, len - n, " (%s)", X509_verify_cert_error_string(v));
}

/* Nothing (or not enough) came back: say which clock ended it. */
static void hs_timed_out(struct handshake *h)
{
	char why[256];
	snprintf(why, sizeof(why), "timed out: no handshake within %u ms (the %s)",
		 (unsigned)(h->by_connect ? h->ctx->limits.connect_timeout_ms : h->timeout_ms),
		 h->by_connect ? "connect timeout" : "TLS handshake timeout");
	hs_report(h, TW_ETIMEDOUT, why);
}

static void hs_step(evutil_socket_t fd, short what, void *arg);
static void set_peer_name(SSL *ssl, int verify, const char *host);

/* h's SSL on its socket, for its side; 0, or TW_ENOMEM. */
static int hs_ssl(struct handshake *h)
{
	BIO *bio = tw__tls_socket_bio(h->fd);
	if (bio == NULL || (h->ssl = SSL_new(h->ssl_ctx)) == NULL) {
		BIO_free(bio);
		return TW_ENOMEM;
	}
	SSL_set_bio(h->ssl, bio, bio); /* the SSL owns the BIO */
	SSL_set_default_read_buffer_len(h->ssl, READ_BUFFER);
	if (h->l != NULL) {
		SSL_set_accept_state(h->ssl);
	} else {
		SSL_set_connect_state(h->ssl);
		set_peer_name(h->ssl, h->verify_host, h->uri.host);
	}
	return 0;
}

/* One step: as far as OpenSSL gets without blocking, then the wait for
 * the socket, the comm, or the failure. */
static void hs_run(struct handshake *h)
{
	struct timeval left;
	char why[256];
	int r, e;
	if (!remaining(h, &left)) {
		hs_timed_out(h);
		return;
	}
	if (h->ssl == NULL && hs_ssl(h) != 0) {
		hs_report(h, TW_ENOMEM, "out of memory");
		return;
	}
	io_begin();
	if ((r = SSL_do_handshake(h->ssl)) == 1) {
		/* A step begun before the connect's deadline may end after it:
		 * the client's last (the server's certificate checked, the keys
		 * made) took 2.5 ms of CPU, 4.5-9 ms at a load of 8 (breaker18
		 * b18-7: a 10 ms connect timeout ended after 17-19 ms). The
		 * connect has then failed, as Dask's wait_for(..., time_left())
		 * gives up at once when none is left: its comm is not handed
		 * to the next stage with 1 ms. */
		if (connect_over(h))
			hs_timed_out(h);
		else
			hs_done(h);
		return;
	}
	e = SSL_get_error(h->ssl, r);
	if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
		event_del(h->ev);
		event_assign(h->ev, h->ctx->base, h->fd,
			     e == SSL_ERROR_WANT_READ ? EV_READ : EV_WRITE, hs_step, h);
		event_add(h->ev, &left);
		return;
	}
	hs_reason(h->ssl, r, why, sizeof(why));
	hs_report(h, e == SSL_ERROR_SSL ? TW_ETLS : TW_EIO, why);
}

static void q_arm(struct hs_queue *q)
{
	static const struct timeval next = {0, TW__PASS_NEXT_US};
	if (q->head != NULL && !event_pending(q->ev, EV_TIMEOUT, NULL))
		event_add(q->ev, &next);
}

/* A pass after steps waited: they start in their order, the first at
 * least (tw__pass_step); one whose time is up ends now, as no step. */
static void q_run(evutil_socket_t fd, short what, void *arg)
{
	tw_context *ctx = arg;
	struct hs_queue *q = tw__ctx_ext(ctx, &queue_ops);
	struct timeval left;
	(void)fd;
	(void)what;
	while (q->head != NULL) {
		struct handshake *h = q->head;
		if (remaining(h, &left) && !tw__pass_step(ctx->base))
			break;
		q_unlink(h);
		hs_run(h); /* the callbacks it runs may add steps, or free some */
	}
	q_arm(q);
}

/* ctx's queue, made on first use; NULL without memory. */
static struct hs_queue *q_of(tw_context *ctx)
{
	struct hs_queue *q = tw__ctx_ext(ctx, &queue_ops);
	if (q != NULL)
		return q;
	if ((q = calloc(1, sizeof(*q))) == NULL)
		return NULL;
	q->tail = &q->head;
	if ((q->ev = event_new(ctx->base, -1, 0, q_run, ctx)) == NULL ||
	    tw__ctx_set_ext(ctx, &queue_ops, q) != 0) {
		tw__event_free(q->ev);
		free(q);
		return NULL;
	}
	return q;
}

/* The socket is ready, or the handshake starts: a step now if this pass
 * has time for it and none waits before it, else one in its turn. */
static void hs_step(evutil_socket_t fd, short what, void *arg)
{
	struct handshake *h = arg;
	struct hs_queue *q = tw__ctx_ext(h->ctx, &queue_ops);
	struct timeval left;
	(void)fd;
	if ((what & EV_TIMEOUT) && remaining(h, &left)) {
		/* libevent timed the wait from its pass's start: early by
		 * that pass's length; the deadline is the clock */
		event_add(h->ev, &left);
		return;
	}
	if (what & EV_TIMEOUT) {
		hs_timed_out(h);
		return;
	}
	if ((q == NULL || q->head == NULL) && tw__pass_step(h->ctx->base)) {
		hs_run(h);
		return;
	}
	if (q == NULL && (q = q_of(h->ctx)) == NULL) {
		hs_run(h); /* no memory to wait in: a step now */
		return;
	}
	h->qnext = NULL;
	h->qprev = q->tail;
	*q->tail = h;
	q->tail = &h->qnext;
	q_arm(q);
}

/* Names get SNI and, when configured, a host name check; IP addresses
 * get neither (Dask clusters address each other by IP). */
static void set_peer_name(SSL *ssl, int verify, const char *host)
{
	unsigned char buf[16];
	if (inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1)
		return;
	SSL_set_tlsext_host_name(ssl, host);
	if (verify)
		SSL_set1_host(ssl, host);
}

/* deadline_ms: a client's connect deadline (0: none, accepting side). */
static int hs_start(tw_context *ctx, int fd, SSL_CTX *ssl_ctx, uint64_t deadline_ms,
		    struct handshake **out)
{
	struct handshake *h = calloc(1, sizeof(*h));
	if (h == NULL)
		return TW_ENOMEM;
	h->connect_deadline_ms = deadline_ms;
	h->timeout_ms =
		tw__stage_ms(deadline_ms, ctx->limits.tls_handshake_timeout_ms, &h->by_connect);
	/* the connect's deadline itself, not the ms left of it: no
	 * rounding between stages */
	h->deadline_us =
		h->by_connect ? deadline_ms * 1000 : mono_us() + (uint64_t)h->timeout_ms * 1000;
	h->ctx = ctx;
	h->fd = fd;
	if (SSL_CTX_up_ref(ssl_ctx) == 1)
		h->ssl_ctx = ssl_ctx;
	h->ev = event_new(ctx->base, -1, 0, hs_step, h);
	if (h->ssl_ctx == NULL || h->ev == NULL) {
		h->fd = -1;
		hs_free(h);
		return TW_ENOMEM;
	}
	*out = h;
	return 0;
}

static void hs_go(struct handshake *h)
{
	tw__ctx_track(h->ctx, &h->node, kill_hs);
	event_active(h->ev, EV_WRITE, 0);
}

/* The context's configuration for a new handshake: the one it has now,
 * which may have been replaced (certificates rotated) or removed since
 * the listen or connect call. NULL, with the reason on the context, when
 * there is none (or no certificate for a listener). */
static const tw_tls_config *current_config(tw_context *ctx, int server)
{
	const tw_tls_config *cfg = tw__tls_config_of(ctx);
	if (cfg != NULL && (!server || cfg->has_cert))
		return cfg;
	tw__ctx_seterr(ctx, "TLS handshake with %s failed: no TLS configuration%s",
		       server ? "a client" : "the server", server ? " with a certificate" : "");
	return NULL;
}

static void tls_upgrade(tw_context *ctx, int fd, const struct tw__uri *u, tw_connect_cb cb,
			void *arg, tw__then_fn then, uint64_t deadline_ms)
{
	const tw_tls_config *cfg = current_config(ctx, 0);
	struct handshake *h;
	int err = cfg != NULL ? hs_start(ctx, fd, cfg->client, deadline_ms, &h) : TW_EINVAL;
	if (err != 0) {
		if (cfg != NULL)
			tw__ctx_seterr(ctx, "TLS handshake with the server: %s", tw_strerror(err));
		close(fd);
		cb(NULL, err, arg);
		return;
	}
	h->cb = cb;
	h->arg = arg;
	h->then = then;
	h->uri = *u;
	h->verify_host = cfg->verify_hostname;
	hs_go(h);
	h->node.connect_arg = arg; /* tw__connect_cancel finds it */
}

static void tls_accept(tw_listener *l, int fd, const struct sockaddr *peer)
{
	const tw_tls_config *cfg = current_config(l->ctx, 1);
	struct handshake *h;
	if (cfg == NULL || hs_start(l->ctx, fd, cfg->server, 0, &h) != 0) {
		close(fd);
		return;
	}
	if (peer != NULL && (peer->sa_family == AF_INET || peer->sa_family == AF_INET6)) {
		memcpy(&h->peer, peer,
		       peer->sa_family == AF_INET ? sizeof(struct sockaddr_in)
						  : sizeof(struct sockaddr_in6));
		h->has_peer = 1;
	}
	h->l = l;
	h->then = l->then;
	hs_go(h);
}

/* TW_EINVAL, and why: no configuration to connect with. */
static int no_config(tw_context *ctx, const struct tw__uri *u)
{
	char addr[TW__URI_TEXT_BYTES];
	tw__uri_format(u->scheme, u->host, u->port, addr, sizeof(addr));
	tw__ctx_seterr(ctx,
		       "cannot connect to %s: no TLS configuration on the context "
		       "(tw_context_set_tls)",
		       addr);
	return TW_EINVAL;
}

static int tls_connect(tw_context *ctx, const struct tw__uri *u, tw_connect_cb cb, void *arg)
{
	if (tw__tls_config_of(ctx) == NULL)
		return no_config(ctx, u);
	return tw__tcp_connect_with(ctx, u, tls_upgrade, NULL, cb, arg);
}

int tw__tls_connect_then(tw_context *ctx, const struct tw__uri *u, tw__then_fn then,
			 tw_connect_cb cb, void *arg)
{
	if (tw__tls_config_of(ctx) == NULL)
		return no_config(ctx, u);
	return tw__tcp_connect_with(ctx, u, tls_upgrade, then, cb, arg);
}

/* A freed listener must not be reached by the handshakes it started:
 * the TLS listener's destroy drops them (they have no one to be handed
 * to), then runs the TCP listener's own destroy (the same function for
 * every listener; kept atomic as loops of other contexts store it too). */
static void (*_Atomic tcp_destroy)(tw_listener *l);

static void drop_handshakes(tw_listener *l)
{
	struct tw__node *head = &l->ctx->objects, *n, *next;
	for (n = head->next; n != head; n = next) {
		next = n->next;
		if (n->kill == kill_hs && ((struct handshake *)n)->l == l) {
			tw__ctx_untrack(n);
			hs_free((struct handshake *)n);
		}
	}
}

static void tls_listener_destroy(tw_listener *l)
{
	drop_handshakes(l);
	atomic_load_explicit(&tcp_destroy, memory_order_relaxed)(l);
}

int tw__tls_listen_then(tw_context *ctx, const struct tw__uri *u, const char *scheme,
			tw__then_fn then, tw_accept_cb cb, void *arg, tw_listener **out)
{
	int err;
	if (tw__tls_config_of(ctx) == NULL || !tw__tls_config_of(ctx)->has_cert) {
		tw__ctx_seterr(
			ctx, "%s:// listeners need a TLS configuration with a certificate and key",
			scheme);
		return TW_EINVAL;
	}
	if ((err = tw__tcp_listen_with(ctx, u, scheme, tls_accept, cb, arg, out)) != 0)
		return err;
	(*out)->then = then;
	atomic_store_explicit(&tcp_destroy, (*out)->destroy, memory_order_relaxed);
	(*out)->destroy = tls_listener_destroy;
	return 0;
}

static int tls_listen(tw_context *ctx, const struct tw__uri *u, tw_accept_cb cb, void *arg,
		      tw_listener **out)
{
	return tw__tls_listen_then(ctx, u, "tls", NULL, cb, arg, out);
}

const struct tw__transport tw__tls_transport = {"tls", tls_listen, tls_connect};
