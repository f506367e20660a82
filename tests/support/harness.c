/* SPDX-License-Identifier: BSD-3-Clause */
/* The TCP test harness (tests/support/harness.h). */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <check.h>
#include <event2/event.h>

#include "tests/support/harness.h"
#include "tests/support/tran.h"
#include "tests/proc_status.h"

#define TICK_MS 20

/* Every peer, so tu_fini frees the ones a test did not. */
struct peer_node {
	struct peer_node *next;
	struct tu_peer *p;
};
static struct peer_node *all_peers;

void tu_init(struct tu *h)
{
	memset(h, 0, sizeof(*h));
	h->base = event_base_new();
	ck_assert_ptr_nonnull(h->base);
	ck_assert_int_eq(tw_context_new(h->base, &h->ctx), 0);
	/* The library's clocks get what a loaded machine needs: under
	 * valgrind beside other suites, TLS handshakes outlasted the 10 s
	 * defaults (the connect timeout covers the handshake and the ws
	 * upgrade too), and a raw peer that reads only after a long send must not
	 * meet the 30 s TCP timeout (0: the kernel's). Tests of the timeouts
	 * set their own. */
	ck_assert_int_eq(tw_context_set_connect_timeout_ms(h->ctx, TU_WAIT_MS), 0);
	ck_assert_int_eq(tw_context_set_handshake_timeout_ms(h->ctx, TU_WAIT_MS), 0);
	ck_assert_int_eq(tw_context_set_tls_handshake_timeout_ms(h->ctx, TU_WAIT_MS), 0);
	ck_assert_int_eq(tw_context_set_tcp_timeout_ms(h->ctx, 0), 0);
	h->tick = ts_tick_new(h->base, TICK_MS);
	h->sopts.echo = 1;
}

void tu_fini(struct tu *h)
{
	while (all_peers != NULL)
		tu_peer_free(all_peers->p);
	tw_listener_free(h->lis);
	tw_context_free(h->ctx);
	event_free(h->tick);
	event_base_free(h->base);
	memset(h, 0, sizeof(*h));
}

/* Loop driving. */

int tu_run_until(struct tu *h, int (*pred)(void *arg), void *arg, int ms)
{
	return ts_run_until(h->base, pred, arg, ms);
}

void tu_run_for(struct tu *h, int ms)
{
	ts_run_for(h->base, ms);
}

int tu_wait_flag(struct tu *h, const int *p, int ms)
{
	return ts_wait_flag(h->base, p, ms);
}

void tu_expect_closed(struct tu *h, struct tu_peer *p, int err)
{
	ck_assert_msg(tu_wait_flag(h, &p->closed, TU_WAIT_MS), "no close (%s)", p->last_error);
	ck_assert_msg(p->close_err == err, "closed with %s, not %s: %s", tw_strerror(p->close_err),
		      tw_strerror(err), p->last_error);
}

struct count_wait {
	const size_t *p;
	size_t n;
	const int *stop;
};

static int count_reached(void *arg)
{
	struct count_wait *w = arg;
	return *w->p >= w->n || (w->stop != NULL && *w->stop);
}

int tu_wait_count(struct tu *h, const size_t *p, size_t n, int ms)
{
	return tu_wait_count_or(h, p, n, NULL, ms);
}

int tu_wait_count_or(struct tu *h, const size_t *p, size_t n, const int *stop, int ms)
{
	struct count_wait w = {p, n, stop};
	return tu_run_until(h, count_reached, &w, ms);
}

/* Peers. */

static void push_msg(tw_msg ***arr, size_t *n, size_t *cap, tw_msg *m)
{
	if (*n == *cap) {
		*cap = *cap ? 2 * *cap : 16;
		*arr = realloc(*arr, *cap * sizeof(**arr));
		ck_assert_ptr_nonnull(*arr);
	}
	(*arr)[(*n)++] = m;
}

/* Write the echo backlog in order until the queue refuses again. */
static void flush_pending(struct tu_peer *p)
{
	size_t done = 0;
	while (done < p->npending && p->comm != NULL) {
		int rv = tw_comm_write(p->comm, p->pending[done]);
		if (rv == TW_EAGAIN)
			break;
		ck_assert_msg(rv == 0, "echo write: %s", tw_strerror(rv));
		done++;
	}
	if (done == 0)
		return;
	memmove(p->pending, p->pending + done, (p->npending - done) * sizeof(*p->pending));
	p->npending -= done;
}

static void echo(struct tu_peer *p, tw_msg *m)
{
	push_msg(&p->pending, &p->npending, &p->pcap, tw_msg_hold(m));
	flush_pending(p);
}

static void on_recv(tw_comm *c, tw_msg *m, void *arg)
{
	struct tu_peer *p = arg;
	ck_assert_ptr_eq(c, p->comm);
	p->nmsgs++;
	p->bytes += tw_msg_bytes(m);
	if (p->keep)
		push_msg(&p->msgs, &p->nkept, &p->cap, tw_msg_hold(m));
	if (p->on_recv != NULL)
		p->on_recv(p, m);
	if (p->echo && p->comm != NULL)
		echo(p, m);
	if (p->free_in_recv && p->comm != NULL) {
		tw_comm_free(c);
		p->comm = NULL;
	}
}

static void on_close(tw_comm *c, int err, void *arg)
{
	struct tu_peer *p = arg;
	tw_stats st;
	ck_assert_ptr_eq(c, p->comm);
	ck_assert_int_eq(p->closed, 0);
	tw_stats_global(&st, sizeof(st));
	p->closed = 1;
	p->close_err = err;
	p->nmsgs_at_close = p->nmsgs;
	p->live_at_close = st.block_bytes_live;
	snprintf(p->last_error, sizeof(p->last_error), "%s", tw_comm_last_error(c));
	if (p->on_close != NULL)
		p->on_close(p);
	if (p->free_in_close) {
		tw_comm_free(c);
		p->comm = NULL;
	}
}

static void on_drain(tw_comm *c, void *arg)
{
	struct tu_peer *p = arg;
	ck_assert_ptr_eq(c, p->comm);
	p->drains++;
	flush_pending(p);
}

struct tu_peer *tu_peer_new(struct tu *h)
{
	struct tu_peer *p = calloc(1, sizeof(*p));
	struct peer_node *n = malloc(sizeof(*n));
	ck_assert(p != NULL && n != NULL);
	p->h = h;
	n->p = p;
	n->next = all_peers;
	all_peers = n;
	return p;
}

void tu_peer_free(struct tu_peer *p)
{
	struct peer_node **pp = &all_peers;
	if (p == NULL)
		return;
	while (*pp != NULL && (*pp)->p != p)
		pp = &(*pp)->next;
	if (*pp != NULL) {
		struct peer_node *n = *pp;
		*pp = n->next;
		free(n);
	}
	for (size_t i = 0; i < p->nkept; i++)
		tw_msg_free(p->msgs[i]);
	for (size_t i = 0; i < p->npending; i++)
		tw_msg_free(p->pending[i]);
	tw_comm_free(p->comm);
	free(p->msgs);
	free(p->pending);
	free(p);
}

int tu_peer_start(struct tu_peer *p, tw_comm *c)
{
	p->comm = c;
	return tw_comm_set_callbacks(c, on_recv, on_close, on_drain, p);
}

/* Server side. */

static void on_accept(tw_listener *l, tw_comm *c, void *arg)
{
	struct tu *h = arg;
	struct tu_peer *p = tu_peer_new(h);
	(void)l;
	ck_assert_uint_lt(h->nsrv, TU_MAX_SERVER_COMMS);
	p->echo = h->sopts.echo;
	p->keep = h->sopts.keep;
	p->free_in_recv = h->sopts.free_in_recv;
	p->free_in_close = h->sopts.free_in_close;
	if (h->sopts.no_callbacks)
		p->comm = c;
	else
		ck_assert_int_eq(tu_peer_start(p, c), 0);
	h->srv[h->nsrv++] = p;
}

const char *tu_host(void)
{
	const char *host = getenv("TW_TEST_HOST");
	return host != NULL && *host != '\0' ? host : "127.0.0.1";
}

const char *tu_uri_host(const char *uri, char *buf, size_t len)
{
	const char *at = strstr(uri, "://127.0.0.1:");
	int n;
	if (at == NULL)
		n = snprintf(buf, len, "%s", uri);
	else
		n = snprintf(buf, len, "%.*s://%s%s", (int)(at - uri), uri, tu_host(),
			     at + strlen("://127.0.0.1"));
	ck_assert(n >= 0 && (size_t)n < len);
	return buf;
}

int tu_ns_enter(void)
{
	const char *ns = getenv("TW_TEST_LISTEN_NETNS");
	int saved, fd;
	if (ns == NULL || *ns == '\0')
		return -1;
	saved = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
	fd = open(ns, O_RDONLY | O_CLOEXEC);
	ck_assert_msg(saved >= 0 && fd >= 0, "TW_TEST_LISTEN_NETNS=%s: %s", ns, strerror(errno));
	ck_assert_msg(setns(fd, CLONE_NEWNET) == 0, "setns %s: %s", ns, strerror(errno));
	close(fd);
	return saved;
}

void tu_ns_leave(int saved)
{
	if (saved < 0)
		return;
	ck_assert_msg(setns(saved, CLONE_NEWNET) == 0, "setns back: %s", strerror(errno));
	close(saved);
}

int tu_tw_listen(tw_context *ctx, const char *uri, tw_accept_cb cb, void *arg, tw_listener **out)
{
	char buf[256];
	int saved = tu_ns_enter();
	int rv = tw_listener_new(ctx, tu_uri_host(uri, buf, sizeof(buf)), cb, arg, out);
	tu_ns_leave(saved);
	return rv;
}

int tu_listen(struct tu *h, const char *uri)
{
	int rv = tu_tw_listen(h->ctx, uri, on_accept, h, &h->lis);
	if (rv == 0)
		ck_assert_int_eq(tw_listener_address(h->lis, h->addr, sizeof(h->addr)), 0);
	return rv;
}

struct tu_peer *tu_server_peer(struct tu *h, size_t n)
{
	if (!tu_wait_count(h, &h->nsrv, n + 1, TU_WAIT_MS))
		return NULL;
	return h->srv[n];
}

/* Client side. */

struct connect_wait {
	struct tu *h;
	struct tu_peer **out;
	int *err;
};

static void on_connected(tw_comm *c, int err, void *arg)
{
	struct connect_wait *w = arg;
	if (err == 0) {
		struct tu_peer *p = tu_peer_new(w->h);
		ck_assert_ptr_nonnull(c);
		ck_assert_int_eq(tu_peer_start(p, c), 0);
		*w->out = p;
	} else {
		ck_assert_ptr_null(c);
	}
	*w->err = err;
	free(w);
}

int tu_connect_async(struct tu *h, const char *uri, struct tu_peer **out, int *err)
{
	struct connect_wait *w = malloc(sizeof(*w));
	int rv;
	ck_assert_ptr_nonnull(w);
	*w = (struct connect_wait){h, out, err};
	*out = NULL;
	*err = 1;
	if ((rv = tw_comm_connect(h->ctx, uri, on_connected, w)) != 0)
		free(w);
	return rv;
}

struct connect_hs {
	tw_handshake_cb cb;
	void *arg;
};

static void handshake_done(tw_comm *c, int err, const tw_handshake_info *info, void *arg)
{
	struct connect_hs w = *(struct connect_hs *)arg;
	free(arg);
	w.cb(c, err, info, w.arg);
}

static void connected_then_handshake(tw_comm *c, int err, void *arg)
{
	if (err == 0 &&
	    (err = tw_comm_handshake(c, TW_HANDSHAKE_CONNECTOR, handshake_done, arg)) == 0)
		return;
	handshake_done(c, err, NULL, arg);
}

void tu_ended_cb(tw_comm *comm, int err, void *arg)
{
	struct tu_ended *e = arg;
	(void)comm;
	e->n++;
	e->err = err;
}

void tu_connect_result_cb(tw_comm *c, int err, void *arg)
{
	struct tu_connect_result *r = arg;
	r->done = 1;
	r->err = err;
	snprintf(r->why, sizeof(r->why), "%s", tw_context_last_error(r->ctx));
	tw_comm_free(c);
}

int tu_connect_handshake(tw_context *ctx, const char *uri, tw_handshake_cb cb, void *arg)
{
	struct connect_hs *w = malloc(sizeof(*w));
	int rv;
	ck_assert_ptr_nonnull(w);
	*w = (struct connect_hs){cb, arg};
	if ((rv = tw_comm_connect(ctx, uri, connected_then_handshake, w)) != 0)
		free(w);
	return rv;
}

static int connect_done(void *arg)
{
	return *(const int *)arg != 1;
}

int tu_wait_connected(struct tu *h, const int *err, int ms)
{
	return tu_run_until(h, connect_done, (void *)err, ms);
}

int tu_connect(struct tu *h, const char *uri, struct tu_peer **out)
{
	int err, rv = tu_connect_async(h, uri, out, &err);
	if (rv != 0)
		return rv;
	ck_assert_msg(tu_run_until(h, connect_done, &err, TU_WAIT_MS), "connect hung");
	return err;
}

struct tu_peer *tu_setup_echo(struct tu *h)
{
	return ts_tran_setup_echo(h, TS_TCP);
}

void tu_echo_check(struct tu_peer *cli, const size_t *lens, size_t nf, unsigned seed, int ms)
{
	size_t idx = cli->nmsgs, kidx = cli->nkept;
	tw_msg *m = ts_msg_pattern(lens, nf, seed);
	int rv = tw_comm_write(cli->comm, m);
	ck_assert_msg(rv == 0, "write: %s", tw_strerror(rv));
	ck_assert_msg(tu_wait_count(cli->h, &cli->nmsgs, idx + 1, ms), "no echo (closed %d: %s)",
		      cli->closed, cli->last_error);
	ck_assert(cli->keep && cli->nkept == kidx + 1);
	ck_assert_msg(ts_msg_matches(cli->msgs[kidx], lens, nf, seed), "echo differs");
}

/* Raw sockets. */

size_t tu_raw_send(struct tu *h, int fd, const void *p, size_t n)
{
	return ts_raw_send(h->base, fd, p, n, TU_WAIT_MS);
}

static int raw_closed(void *arg)
{
	int fd = *(int *)arg;
	char buf[4096];
	ssize_t n;
	while ((n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0)
		;
	return n == 0 || (n < 0 && errno == ECONNRESET);
}

int tu_raw_wait_closed(struct tu *h, int fd, int ms)
{
	return tu_run_until(h, raw_closed, &fd, ms);
}

uint64_t tu_rss_bytes(void)
{
	return status_bytes("VmRSS");
}

tw_msg *tu_request(const char *op, const tw_slice *data)
{
	tw_builder *b;
	msgpack_packer *pk;
	tw_msg *m;
	ck_assert_int_eq(tw_builder_new(NULL, &b), 0);
	pk = tw_builder_packer(b);
	msgpack_pack_map(pk, data ? 2 : 1);
	tw_msgpack_pack_str(pk, "op");
	tw_msgpack_pack_str(pk, op);
	if (data != NULL) {
		tw_msgpack_pack_str(pk, "data");
		ck_assert_int_eq(tw_builder_pack_bytes(b, data), 0);
	}
	ck_assert_int_eq(tw_builder_finish(b, &m), 0);
	tw_builder_free(b);
	return m;
}

tw_decoded *tu_call(struct tu *h, struct tu_peer *p, tw_msg *m, int ms)
{
	size_t idx = p->nkept;
	char why[256] = "";
	tw_decoded *d;
	int rv;
	ck_assert_int_eq(tw_comm_write(p->comm, m), 0);
	ck_assert_msg(tu_wait_count(h, &p->nkept, idx + 1, ms), "no reply (closed %d: %s)",
		      p->closed, p->last_error);
	rv = tw_decode(p->msgs[idx], NULL, &d, why, sizeof(why));
	ck_assert_msg(rv == 0, "reply: %s: %s", tw_strerror(rv), why);
	return d;
}

void tu_on_refused(tw_listener *l, int err, const char *peer, const char *why, void *arg)
{
	struct tu_refusal *r = arg;
	(void)l;
	r->n++;
	r->err = err;
	snprintf(r->peer, sizeof(r->peer), "%s", peer);
	snprintf(r->why, sizeof(r->why), "%s", why);
}

void tu_reset_named(struct tu *h, const char *scheme)
{
	struct tu_refusal r = {0, 0, "", ""};
	size_t nsrv = h->nsrv;
	char want[128];
	ck_assert_int_eq(tw_listener_set_error_cb(h->lis, tu_on_refused, &r), 0);
	ts_raw_reset(h->addr, scheme, want, sizeof(want));
	ck_assert_msg(tu_wait_flag(h, &r.n, TU_WAIT_MS), "no error callback for a reset client");
	ck_assert_int_eq(tw_listener_set_error_cb(h->lis, NULL, NULL), 0);
	ck_assert_int_eq(r.n, 1);
	ck_assert_msg(r.err == TW_EIO, "err %s: %s", tw_strerror(r.err), r.why);
	ck_assert_str_eq(r.peer, want);
	ck_assert_msg(strstr(r.why, want) != NULL, "why: %s", r.why);
	ck_assert_uint_eq(h->nsrv, nsrv);
}
