/* SPDX-License-Identifier: BSD-3-Clause */
/* Helpers for the ws:// and wss:// suites (tests/support/ws.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <check.h>
#include <event2/event.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>

#include "tests/support/tran.h"
#include "tests/support/ws.h"
#include "transport/stream_codec.h"

static const uint8_t KEY[4] = {0x37, 0xfa, 0x21, 0x3d};

const char *wu_scheme(int i)
{
	return ts_tran_scheme(TS_WS + i);
}

static int ws_tran(const char *scheme)
{
	return strcmp(scheme, "wss") == 0 ? TS_WSS : TS_WS;
}

void wu_init(struct tu *h, const char *scheme)
{
	ts_tran_init(h, ws_tran(scheme));
}

struct tu_peer *wu_setup_echo(struct tu *h, const char *scheme)
{
	return ts_tran_setup_echo(h, ws_tran(scheme));
}

/* Bytes. */

static int nibble(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

size_t wu_hex(const char *hex, uint8_t *out, size_t cap)
{
	size_t n = 0;
	int hi = -1;
	for (; *hex != '\0'; hex++) {
		int v = nibble(*hex);
		if (v < 0) {
			ck_assert_msg(*hex == ' ' && hi < 0, "bad hex at '%c'", *hex);
			continue;
		}
		if (hi < 0) {
			hi = v;
			continue;
		}
		ck_assert_uint_lt(n, cap);
		out[n++] = (uint8_t)(hi << 4 | v);
		hi = -1;
	}
	ck_assert_int_lt(hi, 0);
	return n;
}

size_t wu_frame(uint8_t *out, int fin, unsigned op, const void *payload, size_t len, int masked)
{
	const uint8_t *p = payload;
	size_t n = 2;
	out[0] = op > 15 ? (uint8_t)op : (uint8_t)((fin ? 0x80 : 0) | op);
	out[1] = masked ? 0x80 : 0;
	if (len <= 125) {
		out[1] |= (uint8_t)len;
	} else if (len <= 0xffff) {
		out[1] |= 126;
		out[2] = (uint8_t)(len >> 8);
		out[3] = (uint8_t)len;
		n = 4;
	} else {
		out[1] |= 127;
		for (int i = 0; i < 8; i++)
			out[2 + i] = (uint8_t)((uint64_t)len >> (56 - 8 * i));
		n = 10;
	}
	if (masked) {
		memcpy(out + n, KEY, 4);
		n += 4;
	}
	for (size_t i = 0; i < len; i++)
		out[n + i] = masked ? p[i] ^ KEY[i % 4] : p[i];
	return n + len;
}

/* One frame at p[0..n): its header size, or 0 when incomplete. */
static size_t parse_one(uint8_t *p, size_t n, struct wu_fr *f)
{
	size_t i = 2;
	uint64_t len;
	if (n < 2)
		return 0;
	f->fin = p[0] >> 7;
	f->rsv = (p[0] >> 4) & 7;
	f->op = p[0] & 15;
	f->masked = p[1] >> 7;
	len = p[1] & 127;
	if (len >= 126) {
		size_t ext = len == 126 ? 2 : 8;
		if (n < 2 + ext)
			return 0;
		len = 0;
		for (size_t k = 0; k < ext; k++)
			len = len << 8 | p[2 + k];
		i += ext;
	}
	i += f->masked ? 4 : 0;
	if (n < i || n - i < len)
		return 0;
	f->len = len;
	f->payload = p + i;
	if (!f->masked)
		return i;
	memcpy(f->key, p + i - 4, 4);
	for (uint64_t k = 0; k < len; k++)
		p[i + k] ^= f->key[k % 4];
	memset(p + i - 4, 0, 4);
	return i;
}

size_t wu_parse(uint8_t *p, size_t n, struct wu_fr *out, size_t max, size_t *used)
{
	size_t k = 0, off = 0;
	while (k < max) {
		size_t hl = parse_one(p + off, n - off, &out[k]);
		if (hl == 0)
			break;
		off += hl + (size_t)out[k].len;
		k++;
	}
	if (used != NULL)
		*used = off;
	return k;
}

int wu_close_code(uint8_t *p, size_t n, char *reason, size_t reason_len)
{
	struct wu_fr f[64];
	size_t k = wu_parse(p, n, f, 64, NULL);
	for (size_t i = 0; i < k; i++) {
		if (f[i].op != 8)
			continue;
		if (f[i].len < 2)
			return 1005;
		if (reason != NULL)
			snprintf(reason, reason_len, "%.*s", (int)f[i].len - 2,
				 (const char *)f[i].payload + 2);
		return f[i].payload[0] << 8 | f[i].payload[1];
	}
	return -1;
}

/* Raw client. */

static void loop_once(struct tu *h)
{
	event_base_loop(h->base, EVLOOP_ONCE);
}

static void tls_open(struct wu_raw *r)
{
	long long deadline = ts_now_ms() + WU_WAIT_MS;
	SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
	SSL *ssl;
	int rv;
	ck_assert_ptr_nonnull(ctx);
	ck_assert_int_eq(SSL_CTX_load_verify_locations(ctx, ts_cert("ca.pem"), NULL), 1);
	ck_assert_int_eq(SSL_CTX_use_certificate_chain_file(ctx, ts_cert("cert.pem")), 1);
	ck_assert_int_eq(SSL_CTX_use_PrivateKey_file(ctx, ts_cert("key.pem"), SSL_FILETYPE_PEM), 1);
	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
	ssl = SSL_new(ctx);
	ck_assert_ptr_nonnull(ssl);
	SSL_set_fd(ssl, r->fd);
	r->ssl = ssl;
	r->ssl_ctx = ctx;
	while ((rv = SSL_connect(ssl)) != 1) {
		int e = SSL_get_error(ssl, rv);
		ck_assert_msg(e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE,
			      "raw TLS connect failed (%d)", e);
		ck_assert_msg(ts_now_ms() < deadline, "raw TLS connect hung");
		loop_once(r->h);
	}
}

void wu_raw_connect(struct tu *h, const char *uri, struct wu_raw *r)
{
	memset(r, 0, sizeof(*r));
	r->h = h;
	r->fd = ts_raw_connect(uri);
	ck_assert_int_eq(fcntl(r->fd, F_SETFL, fcntl(r->fd, F_GETFL) | O_NONBLOCK), 0);
	if (strncmp(uri, "wss://", 6) == 0)
		tls_open(r);
}

ssize_t wu_raw_write(struct wu_raw *r, const uint8_t *p, size_t n)
{
	size_t put = 0;
	ssize_t k;
	int e;
	if (r->ssl == NULL) {
		k = send(r->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (k >= 0)
			return k;
		return errno == EAGAIN || errno == EINTR ? 0 : -1;
	}
	ERR_clear_error();
	if (SSL_write_ex(r->ssl, p, n, &put) == 1)
		return (ssize_t)put;
	e = SSL_get_error(r->ssl, 0);
	return e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ? 0 : -1;
}

size_t wu_raw_send(struct wu_raw *r, const void *p, size_t n)
{
	long long deadline = ts_now_ms() + WU_WAIT_MS;
	size_t done = 0;
	while (done < n) {
		ssize_t k = wu_raw_write(r, (const uint8_t *)p + done, n - done);
		if (k < 0)
			break;
		done += (size_t)k;
		if (k > 0) {
			deadline = ts_now_ms() + WU_WAIT_MS; /* a hang guard: slow is not stuck */
		} else {
			ck_assert_msg(ts_now_ms() < deadline,
				      "raw send stalled at %zu of %zu bytes", done, n);
			loop_once(r->h);
		}
	}
	return done;
}

static void drip_tick(evutil_socket_t fd, short what, void *arg)
{
	struct wu_drip *d = arg;
	(void)fd;
	(void)what;
	for (int i = 0; i < d->n; i++) { /* over TLS a write it could not finish goes again */
		ssize_t k;
		if (d->sp[i]->closed)
			continue;
		if (d->off[i] < d->blen) {
			k = wu_raw_write(&d->r[i], d->burst + d->off[i], d->blen - d->off[i]);
			d->off[i] += k > 0 ? (size_t)k : 0;
		} else {
			(void)wu_raw_write(&d->r[i], d->chunk, d->clen);
		}
	}
}

void wu_drip_start(struct tu *h, struct wu_drip *d, const char *uri, int n, int tick_ms)
{
	struct timeval tv = {0, tick_ms * 1000};
	ck_assert_int_le(n, WU_DRIP_MAX);
	d->n = n;
	for (int i = 0; i < n; i++) {
		d->off[i] = 0;
		wu_raw_connect(h, uri, &d->r[i]);
		ck_assert_ptr_nonnull(d->sp[i] = tu_server_peer(h, (size_t)i));
	}
	ck_assert_ptr_nonnull(d->ev = event_new(h->base, -1, EV_PERSIST, drip_tick, d));
	ck_assert_int_eq(event_add(d->ev, &tv), 0);
}

void wu_drip_stream(struct wu_drip *d, uint64_t declared, size_t n, unsigned seed)
{
	tw_slice f = {NULL, 0, declared};
	size_t head = tw__stream_prelude_bytes(1);
	ck_assert_ptr_nonnull(d->own = malloc(head + n));
	tw__stream_encode_prelude(&f, 1, d->own);
	ts_fill(d->own + head, n, seed);
	ts_fill(d->own_chunk, sizeof(d->own_chunk), seed + 1);
	d->burst = d->own;
	d->blen = head + n;
	d->chunk = d->own_chunk;
	d->clen = sizeof(d->own_chunk);
}

void wu_drip_stop(struct wu_drip *d)
{
	event_free(d->ev);
	for (int i = 0; i < d->n; i++)
		wu_raw_close(&d->r[i]);
	free(d->own);
	d->own = NULL;
}

static uint64_t comm_received(const struct tu_peer *p)
{
	tw_stats st;
	tw_comm_stats(p->comm, &st, sizeof(st));
	return st.bytes_received;
}

void wu_wait_msg_moving(struct tu *h, struct tu_peer *cli, struct tu_peer *srv, int ms)
{
	long long last = ts_now_ms();
	uint64_t seen = 0;
	while (cli->nmsgs == 0) {
		uint64_t now = comm_received(srv) + comm_received(cli);
		if (now != seen)
			last = ts_now_ms();
		seen = now;
		ck_assert_msg(ts_now_ms() - last < ms,
			      "the honest message stalled: %llu bytes read by the server and the "
			      "client",
			      (unsigned long long)now);
		event_base_loop(h->base, EVLOOP_ONCE);
	}
}

void wu_raw_send_hex(struct wu_raw *r, const char *hex)
{
	uint8_t buf[4096];
	size_t n = wu_hex(hex, buf, sizeof(buf));
	wu_raw_send(r, buf, n);
}

static void room_for(struct wu_raw *r, size_t n)
{
	if (r->cap - r->nin >= n)
		return;
	r->cap = r->cap * 2 > r->nin + n ? r->cap * 2 : r->nin + n;
	r->in = realloc(r->in, r->cap);
	ck_assert_ptr_nonnull(r->in);
}

/* Read what is there now; sets eof when the server closed. */
static void raw_read_now(struct wu_raw *r)
{
	for (;;) {
		size_t got = 0;
		ssize_t k;
		room_for(r, 65536);
		if (r->ssl == NULL) {
			k = recv(r->fd, r->in + r->nin, 65536, MSG_DONTWAIT);
			if (k < 0 && (errno == EAGAIN || errno == EINTR))
				return;
			if (k <= 0)
				break;
			r->nin += (size_t)k;
			continue;
		}
		ERR_clear_error();
		if (SSL_read_ex(r->ssl, r->in + r->nin, 65536, &got) == 1) {
			r->nin += got;
			continue;
		}
		k = SSL_get_error(r->ssl, 0);
		if (k == SSL_ERROR_WANT_READ || k == SSL_ERROR_WANT_WRITE)
			return;
		break;
	}
	r->eof = 1;
}

struct n_wait {
	struct wu_raw *r;
	size_t n;
	size_t seen; /* bytes when the guard last restarted */
};

/* Read what is there; 1 when r->in holds n bytes, the server closed, or
 * bytes came (the caller restarts its hang guard then). */
static int raw_has_n(void *arg)
{
	struct n_wait *w = arg;
	if (!w->r->eof)
		raw_read_now(w->r);
	return w->r->nin >= w->n || w->r->eof || w->r->nin > w->seen;
}

/* Read until r->in holds n bytes or the server closed; ms is a hang guard
 * that every byte received restarts. */
static void read_until(struct wu_raw *r, size_t n, int ms)
{
	struct n_wait w = {r, n, r->nin};
	while (tu_run_until(r->h, raw_has_n, &w, ms) && !r->eof && r->nin < n)
		w.seen = r->nin;
}

int wu_raw_read_eof(struct wu_raw *r, int ms)
{
	read_until(r, SIZE_MAX, ms);
	return r->eof;
}

int wu_raw_read_n(struct wu_raw *r, size_t n, int ms)
{
	read_until(r, n, ms);
	return r->nin >= n;
}

static int head_done(void *arg)
{
	struct wu_raw *r = arg;
	if (!r->eof)
		raw_read_now(r);
	return r->eof || memmem(r->in, r->nin, "\r\n\r\n", 4) != NULL;
}

/* Move the header block out of r->in into r->head and r->status. */
static int take_head(struct wu_raw *r)
{
	uint8_t *end = r->nin ? memmem(r->in, r->nin, "\r\n\r\n", 4) : NULL;
	size_t hl;
	int status = 0;
	if (end == NULL)
		return 0;
	hl = (size_t)(end - r->in) + 4;
	snprintf(r->head, sizeof(r->head), "%.*s", (int)hl, (const char *)r->in);
	snprintf(r->status, sizeof(r->status), "%.*s", (int)strcspn(r->head, "\r\n"), r->head);
	memmove(r->in, r->in + hl, r->nin - hl);
	r->nin -= hl;
	if (sscanf(r->status, "HTTP/1.1 %d", &status) != 1)
		return 0;
	return status;
}

int wu_raw_open(struct tu *h, const char *uri, const char *request, struct wu_raw *r)
{
	static const char def[] = "GET / HTTP/1.1\r\nHost: 127.0.0.1:8765\r\nUpgrade: websocket\r\n"
				  "Connection: Upgrade\r\nSec-WebSocket-Key: " WU_KEY "\r\n"
				  "Sec-WebSocket-Version: 13\r\n\r\n";
	const char *req = request != NULL ? request : def;
	wu_raw_connect(h, uri, r);
	wu_raw_send(r, req, strlen(req));
	tu_run_until(h, head_done, r, WU_WAIT_MS);
	return take_head(r);
}

void wu_raw_close(struct wu_raw *r)
{
	if (r->ssl != NULL)
		SSL_free(r->ssl);
	if (r->ssl_ctx != NULL)
		SSL_CTX_free(r->ssl_ctx);
	if (r->fd >= 0)
		close(r->fd);
	free(r->in);
	memset(r, 0, sizeof(*r));
	r->fd = -1;
}

/* Fake server. */

void wu_accept_of(const char *key, char out[32])
{
	char buf[128];
	unsigned char md[20];
	unsigned int mdlen = 20;
	snprintf(buf, sizeof(buf), "%s258EAFA5-E914-47DA-95CA-C5AB0DC85B11", key);
	EVP_Digest(buf, strlen(buf), md, &mdlen, EVP_sha1(), NULL);
	EVP_EncodeBlock((unsigned char *)out, md, 20);
}

/* Blocking read with a poll deadline; 0 on EOF, error or timeout. */
static ssize_t read_deadline(int fd, void *p, size_t n, long long deadline)
{
	struct pollfd pfd = {fd, POLLIN, 0};
	long long left = deadline - ts_now_ms();
	if (left <= 0 || poll(&pfd, 1, (int)left) <= 0)
		return 0;
	return recv(fd, p, n, 0);
}

static void fake_respond(struct wu_fake *f, int fd)
{
	char key[64] = "", acc[32] = "", out[2048];
	const char *k = strcasestr(f->request, "Sec-WebSocket-Key:");
	int n;
	if (k != NULL)
		sscanf(k + 18, " %63s", key);
	wu_accept_of(key, acc);
	if (f->mode == WU_FAKE_200)
		n = snprintf(out, sizeof(out), "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
	else
		n = snprintf(out, sizeof(out),
			     "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
			     "Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n%s\r\n",
			     f->mode == WU_FAKE_BAD_ACCEPT ? "AAAAAAAAAAAAAAAAAAAAAAAAAAA=" : acc,
			     f->mode == WU_FAKE_EXTENSION
				     ? "Sec-WebSocket-Extensions: permessage-deflate\r\n"
				     : "");
	memcpy(out + n, f->extra, f->nextra);
	(void)!send(fd, out, (size_t)n + f->nextra, MSG_NOSIGNAL);
}

static void *fake_main(void *arg)
{
	struct wu_fake *f = arg;
	long long deadline = ts_now_ms() + WU_WAIT_MS;
	struct pollfd pfd = {f->lfd, POLLIN, 0};
	size_t have = 0;
	char *end = NULL;
	int fd = -1;
	if (poll(&pfd, 1, WU_WAIT_MS) == 1)
		fd = accept(f->lfd, NULL, NULL);
	while (fd >= 0 && end == NULL && have < sizeof(f->request) - 1) {
		ssize_t k = read_deadline(fd, f->request + have, sizeof(f->request) - 1 - have,
					  deadline);
		if (k <= 0)
			break;
		have += (size_t)k;
		f->request[have] = '\0';
		end = strstr(f->request, "\r\n\r\n");
	}
	if (end != NULL) {
		size_t hl = (size_t)(end - f->request) + 4;
		f->ngot = have - hl;
		memcpy(f->got, f->request + hl, f->ngot);
		f->request[hl] = '\0';
		fake_respond(f, fd);
		while (f->stall && !atomic_load(&f->release) && ts_now_ms() < deadline)
			poll(NULL, 0, 5);
		for (ssize_t k; !f->stall && f->ngot < sizeof(f->got) &&
				(k = read_deadline(fd, f->got + f->ngot, sizeof(f->got) - f->ngot,
						   deadline)) > 0;)
			f->ngot += (size_t)k;
	}
	if (fd >= 0)
		close(fd);
	return NULL;
}

void wu_fake_start(struct wu_fake *f)
{
	f->lfd = ts_raw_listen("ws", 4, 0, f->uri, sizeof(f->uri));
	ck_assert_int_eq(pthread_create(&f->th, NULL, fake_main, f), 0);
}

void wu_fake_join(struct wu_fake *f)
{
	ck_assert_int_eq(pthread_join(f->th, NULL), 0);
	close(f->lfd);
	f->lfd = -1;
	f->done = 1;
}

/* Dask listener. */

static void on_dask_handshake(tw_comm *c, int err, const tw_handshake_info *info, void *arg)
{
	struct wu_dask_srv *s = arg;
	struct tu_peer *p;
	(void)info;
	if (err != 0) {
		s->failed++;
		tw_comm_free(c);
		return;
	}
	ck_assert_uint_lt(s->h->nsrv, TU_MAX_SERVER_COMMS);
	p = tu_peer_new(s->h);
	p->echo = 1;
	p->on_recv = s->hook;
	p->user = s->user;
	ck_assert_int_eq(tu_peer_start(p, c), 0);
	s->h->srv[s->h->nsrv++] = p;
}

static void on_dask_accept(tw_listener *l, tw_comm *c, void *arg)
{
	(void)l;
	if (tw_comm_handshake(c, TW_HANDSHAKE_LISTENER, on_dask_handshake, arg) != 0)
		tw_comm_free(c);
}

void wu_dask_listen(struct tu *h, const char *uri, struct wu_dask_srv *s)
{
	s->h = h;
	ck_assert_int_eq(tu_tw_listen(h->ctx, uri, on_dask_accept, s, &s->l), 0);
	ck_assert_int_eq(tw_listener_address(s->l, s->addr, sizeof(s->addr)), 0);
}

tw_stats wu_stats(void)
{
	tw_stats st;
	tw_stats_global(&st, sizeof(st));
	return st;
}
