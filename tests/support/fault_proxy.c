/* SPDX-License-Identifier: BSD-3-Clause */
/* The fault-injection proxy (tests/support/fault_proxy.h).
 *
 * A connection is two bufferevents: bev[0] faces the client, bev[1] the
 * server. Direction d (0 up, 1 down) reads bev[d] and writes bev[1 - d].
 * Each direction forwards what it reads unless its fault says otherwise;
 * a direction whose receiver holds more than HIGH bytes unsent stops
 * reading until they are gone, so the proxy's memory stays bounded and
 * senders feel backpressure as they would from the real peer. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <check.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>

#include "tests/support/fault_proxy.h"
#include "tests/support/harness.h"

#define HIGH ((size_t)1 << 20)

struct fp_conn {
	struct fp_conn *next;
	struct fp *p;
	struct bufferevent *bev[2]; /* client side, server side (NULL: black hole) */
	struct event *hold[2];      /* FP_DELAY: a burst being held */
	struct fp_hold {
		struct fp_conn *c;
		int d;
	} hold_arg[2];
	uint64_t moved[2]; /* bytes forwarded per direction */
	int hit[2];        /* the fault fired in that direction */
	int eof[2];        /* the sender ended: end the receiver after the bytes */
	int shut[2];       /* the receiver got its FIN */
	int held[2];       /* reading stopped for backpressure */
	int reset;         /* reset once direction reset_d is flushed */
	int reset_d;
	int connected; /* bev[1] reached the server */
};

static int applies(const struct fp *p, int d)
{
	int dir = p->o.dir == 0 ? FP_BOTH : p->o.dir;
	return (dir & (d == 0 ? FP_UP : FP_DOWN)) != 0;
}

static void conn_free(struct fp_conn *c)
{
	struct fp_conn **pp = &c->p->conns;
	int i;
	while (*pp != c)
		pp = &(*pp)->next;
	*pp = c->next;
	for (i = 0; i < 2; i++) {
		if (c->hold[i] != NULL)
			event_free(c->hold[i]);
		if (c->bev[i] != NULL)
			bufferevent_free(c->bev[i]);
	}
	c->p->live--;
	free(c);
}

/* Close both sockets with SO_LINGER 0: each peer gets an RST. */
static void conn_reset(struct fp_conn *c)
{
	struct linger lg = {1, 0};
	int i;
	for (i = 0; i < 2; i++) {
		evutil_socket_t fd = c->bev[i] != NULL ? bufferevent_getfd(c->bev[i]) : -1;
		if (fd >= 0)
			setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	}
	conn_free(c);
}

static size_t out_len(struct fp_conn *c, int d)
{
	return evbuffer_get_length(bufferevent_get_output(c->bev[1 - d]));
}

/* Act on what waits for direction d's receiver to be flushed: a reset, a
 * FIN, resuming a held sender, the end of the connection. Returns 1 when
 * c was freed. */
static int settle(struct fp_conn *c, int d)
{
	struct bufferevent *src = c->bev[d], *dst = c->bev[1 - d];
	if (dst == NULL || (d == 0 && !c->connected) || out_len(c, d) > 0)
		return 0;
	if (c->reset && c->reset_d == d) {
		conn_reset(c);
		return 1;
	}
	if (c->eof[d] && !c->shut[d] && evbuffer_get_length(bufferevent_get_input(src)) == 0 &&
	    (c->hold[d] == NULL || !evtimer_pending(c->hold[d], NULL))) {
		shutdown(bufferevent_getfd(dst), SHUT_WR);
		c->shut[d] = 1;
	}
	if (c->held[d]) {
		c->held[d] = 0;
		bufferevent_enable(src, EV_READ);
	}
	if (c->shut[0] && c->shut[1]) {
		conn_free(c);
		return 1;
	}
	return 0;
}

static void forward(struct fp_conn *c, int d, size_t n)
{
	int moved = evbuffer_remove_buffer(bufferevent_get_input(c->bev[d]),
					   bufferevent_get_output(c->bev[1 - d]), n);
	if (moved > 0) {
		c->moved[d] += (uint64_t)moved;
		c->p->moved[d] += (uint64_t)moved;
	}
	if (out_len(c, d) > HIGH) {
		c->held[d] = 1;
		bufferevent_disable(c->bev[d], EV_READ);
	}
}

/* The fault of a counted mode fires in direction d. Returns 1 when c was
 * freed. */
static int fire(struct fp_conn *c, int d)
{
	struct evbuffer *in = bufferevent_get_input(c->bev[d]);
	c->hit[d] = 1;
	c->p->faults++;
	switch (c->p->o.fault) {
	case FP_STALL: bufferevent_disable(c->bev[d], EV_READ); return 0;
	case FP_RESET:
		c->reset = 1;
		c->reset_d = d;
		return settle(c, d);
	case FP_HALF_OPEN:
		c->eof[d] = 1;
		evbuffer_drain(in, evbuffer_get_length(in));
		return settle(c, d);
	default: return 0;
	}
}

/* Move what direction d has read, as its fault allows. Returns 1 when c
 * was freed. */
static int pump(struct fp_conn *c, int d)
{
	const struct fp_opts *o = &c->p->o;
	struct evbuffer *in = bufferevent_get_input(c->bev[d]);
	size_t n = evbuffer_get_length(in);
	int counted = o->fault == FP_STALL || o->fault == FP_RESET || o->fault == FP_HALF_OPEN;
	if (c->reset || (c->hit[d] && o->fault == FP_STALL))
		return 0;
	if (c->hit[d] && o->fault == FP_HALF_OPEN) {
		evbuffer_drain(in, n); /* that direction is shut: discard */
		return 0;
	}
	if (applies(c->p, d) && o->fault == FP_DELAY) {
		struct timeval tv = {o->delay_ms / 1000, (o->delay_ms % 1000) * 1000};
		if (n > 0 && !evtimer_pending(c->hold[d], NULL))
			evtimer_add(c->hold[d], &tv);
		return 0;
	}
	if (applies(c->p, d) && counted) {
		uint64_t room = o->after - c->moved[d];
		forward(c, d, n < room ? n : (size_t)room);
		if (c->moved[d] >= o->after)
			return fire(c, d);
		return settle(c, d);
	}
	forward(c, d, n);
	return settle(c, d);
}

static int dir_of(struct fp_conn *c, struct bufferevent *bev)
{
	return bev == c->bev[0] ? 0 : 1;
}

static void on_read(struct bufferevent *bev, void *arg)
{
	struct fp_conn *c = arg;
	pump(c, dir_of(c, bev));
}

/* bev's output is empty: settle the direction that writes into it. */
static void on_write(struct bufferevent *bev, void *arg)
{
	struct fp_conn *c = arg;
	settle(c, 1 - dir_of(c, bev));
}

static void on_hold(evutil_socket_t fd, short what, void *arg)
{
	struct fp_hold *ha = arg;
	struct fp_conn *c = ha->c;
	int d = ha->d;
	(void)fd;
	(void)what;
	forward(c, d, evbuffer_get_length(bufferevent_get_input(c->bev[d])));
	settle(c, d);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
	struct fp_conn *c = arg;
	int d = dir_of(c, bev);
	if (what & BEV_EVENT_CONNECTED) {
		int one = 1;
		setsockopt(bufferevent_getfd(bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		c->connected = 1;
		settle(c, 0);
		return;
	}
	if (what & BEV_EVENT_ERROR) { /* a reset (or a refused connect) goes on as a reset */
		conn_reset(c);
		return;
	}
	if (!(what & BEV_EVENT_EOF))
		return;
	if (pump(c, d))
		return;
	bufferevent_disable(bev, EV_READ);
	c->eof[d] = 1;
	settle(c, d);
}

/* FP_BLACK_HOLE: read and forget, until the client goes. */
static void bh_read(struct bufferevent *bev, void *arg)
{
	struct evbuffer *in = bufferevent_get_input(bev);
	(void)arg;
	evbuffer_drain(in, evbuffer_get_length(in));
}

static void bh_event(struct bufferevent *bev, short what, void *arg)
{
	(void)bev;
	if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
		conn_free(arg);
}

static void connect_server(struct fp_conn *c)
{
	struct fp *p = c->p;
	struct sockaddr_in to;
	memset(&to, 0, sizeof(to));
	to.sin_family = AF_INET;
	ck_assert_int_eq(inet_pton(AF_INET, p->host, &to.sin_addr), 1);
	to.sin_port = htons((uint16_t)p->tport);
	c->bev[1] = bufferevent_socket_new(p->base, -1, BEV_OPT_CLOSE_ON_FREE);
	ck_assert_ptr_nonnull(c->bev[1]);
	bufferevent_setcb(c->bev[1], on_read, on_write, on_event, c);
	for (int d = 0; d < 2; d++) {
		c->hold_arg[d].c = c;
		c->hold_arg[d].d = d;
		c->hold[d] = evtimer_new(p->base, on_hold, &c->hold_arg[d]);
		ck_assert_ptr_nonnull(c->hold[d]);
	}
	if (p->o.fault == FP_THROTTLE) {
		if (applies(p, 0))
			ck_assert_int_eq(bufferevent_set_rate_limit(c->bev[0], p->rate), 0);
		if (applies(p, 1))
			ck_assert_int_eq(bufferevent_set_rate_limit(c->bev[1], p->rate), 0);
	}
	/* a failed connect reports through on_event (BEV_EVENT_ERROR) */
	bufferevent_socket_connect(c->bev[1], (struct sockaddr *)&to, sizeof(to));
	bufferevent_enable(c->bev[1], EV_READ | EV_WRITE);
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len,
		      void *arg)
{
	struct fp *p = arg;
	struct fp_conn *c = calloc(1, sizeof(*c));
	int one = 1;
	(void)l;
	(void)sa;
	(void)len;
	ck_assert_ptr_nonnull(c);
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	c->p = p;
	c->bev[0] = bufferevent_socket_new(p->base, fd, BEV_OPT_CLOSE_ON_FREE);
	ck_assert_ptr_nonnull(c->bev[0]);
	c->next = p->conns;
	p->conns = c;
	p->accepts++;
	if (++p->live > p->peak)
		p->peak = p->live;
	if (p->o.fault == FP_BLACK_HOLE) {
		bufferevent_setcb(c->bev[0], bh_read, NULL, bh_event, c);
	} else {
		bufferevent_setcb(c->bev[0], on_read, on_write, on_event, c);
		connect_server(c);
	}
	bufferevent_enable(c->bev[0], EV_READ | EV_WRITE);
}

void fp_start(struct fp *p, struct event_base *base, const char *target, const struct fp_opts *o)
{
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);
	const char *h = strstr(target, "://"), *colon = strrchr(target, ':');
	int saved;
	memset(p, 0, sizeof(*p));
	p->base = base;
	p->o = *o;
	ck_assert(h != NULL && colon != NULL && colon > h + 3);
	h += 3;
	ck_assert_uint_lt((size_t)(colon - h), sizeof(p->host));
	memcpy(p->host, h, (size_t)(colon - h));
	p->tport = (unsigned)strtoul(colon + 1, NULL, 10);
	if (o->fault == FP_THROTTLE) {
		struct timeval tick = {0, 100000};
		size_t per = o->rate / 10;
		ck_assert_uint_gt(per, 0);
		p->rate = ev_token_bucket_cfg_new(per, per, EV_RATE_LIMIT_MAX, EV_RATE_LIMIT_MAX,
						  &tick);
		ck_assert_ptr_nonnull(p->rate);
	}
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	ck_assert_int_eq(inet_pton(AF_INET, p->host, &sa.sin_addr), 1);
	saved = tu_ns_enter(); /* the server's namespace (tests/netns-check.sh) */
	p->l = evconnlistener_new_bind(base, on_accept, p,
				       LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, -1,
				       (struct sockaddr *)&sa, sizeof(sa));
	tu_ns_leave(saved);
	ck_assert_ptr_nonnull(p->l);
	ck_assert_int_eq(getsockname(evconnlistener_get_fd(p->l), (struct sockaddr *)&sa, &sl), 0);
	p->port = ntohs(sa.sin_port);
	fp_uri(p, "tcp", p->addr, sizeof(p->addr));
}

void fp_stop(struct fp *p)
{
	while (p->conns != NULL)
		conn_free(p->conns);
	if (p->l != NULL)
		evconnlistener_free(p->l);
	if (p->rate != NULL)
		ev_token_bucket_cfg_free(p->rate);
	memset(p, 0, sizeof(*p));
}

const char *fp_uri(const struct fp *p, const char *scheme, char *buf, size_t len)
{
	snprintf(buf, len, "%s://%s:%u", scheme, p->host, p->port);
	return buf;
}

int fp_idle(void *arg)
{
	const struct fp *p = arg;
	return p->live == 0;
}
