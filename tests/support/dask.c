/* SPDX-License-Identifier: BSD-3-Clause */
/* The real-peer test harness (tests/support/dask.h). */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <check.h>
#include <event2/event.h>

#include "tests/support/dask.h"

/* The client comm. */

static void on_recv(tw_comm *comm, tw_msg *msg, void *arg)
{
	struct du_client *c = arg;
	(void)comm;
	if (c->nmsgs == c->cap) {
		c->cap = c->cap ? 2 * c->cap : 8;
		c->msgs = realloc(c->msgs, c->cap * sizeof(*c->msgs));
		if (c->msgs == NULL)
			abort();
	}
	c->msgs[c->nmsgs++] = tw_msg_hold(msg);
}

static void on_close(tw_comm *comm, int err, void *arg)
{
	struct du_client *c = arg;
	snprintf(c->last_error, sizeof(c->last_error), "%s", tw_comm_last_error(comm));
	c->close_err = err;
	c->closed = 1;
}

static void copy_name(char *dst, size_t len, const char *s)
{
	snprintf(dst, len, "%s", s != NULL ? s : "");
}

static void on_handshake(tw_comm *comm, int err, const tw_handshake_info *info, void *arg)
{
	struct du_client *c = arg;
	c->comm = comm;
	if (err == 0) {
		copy_name(c->compression, sizeof(c->compression), info->compression);
		copy_name(c->peer_compression, sizeof(c->peer_compression), info->peer_compression);
		c->pickle_protocol = info->pickle_protocol;
		err = tw_comm_set_callbacks(comm, on_recv, on_close, NULL, c);
	} else if (comm != NULL) {
		snprintf(c->last_error, sizeof(c->last_error), "%s", tw_comm_last_error(comm));
	}
	c->err = err;
	c->done = 1;
}

int du_client_open(struct tu *l, const char *uri, struct du_client **out)
{
	struct du_client *c = calloc(1, sizeof(*c));
	int rv;
	ck_assert_ptr_nonnull(c);
	c->loop = l;
	*out = c;
	if ((rv = tu_connect_handshake(l->ctx, uri, on_handshake, c)) != 0)
		return rv;
	if (!tu_wait_flag(l, &c->done, DU_WAIT_MS))
		return TW_ETIMEDOUT;
	return c->err;
}

int du_client_write(struct du_client *c, tw_msg *msg)
{
	int rv = c->comm != NULL ? tw_comm_write(c->comm, msg) : TW_ECLOSED;
	if (rv != 0)
		tw_msg_free(msg);
	return rv;
}

tw_msg *du_client_msg(struct du_client *c, size_t i, int ms)
{
	tu_wait_count_or(c->loop, &c->nmsgs, i + 1, &c->closed, ms);
	return i < c->nmsgs ? c->msgs[i] : NULL;
}

void du_client_free(struct du_client *c)
{
	if (c == NULL)
		return;
	for (size_t i = 0; i < c->nmsgs; i++)
		tw_msg_free(c->msgs[i]);
	free(c->msgs);
	tw_comm_free(c->comm);
	free(c);
}

/* Handshake server. */

static void srv_handshake(tw_comm *comm, int err, const tw_handshake_info *info, void *arg)
{
	struct du_srv *s = arg;
	(void)info;
	if (err != 0 || tw_comm_set_callbacks(comm, s->recv, s->close, NULL, s->arg) != 0)
		s->hs_failures++;
}

static void srv_accept(tw_listener *l, tw_comm *comm, void *arg)
{
	struct du_srv *s = arg;
	(void)l;
	if (s->ncomms == DU_SRV_MAX_COMMS ||
	    tw_comm_handshake(comm, TW_HANDSHAKE_LISTENER, srv_handshake, s) != 0) {
		tw_comm_free(comm);
		s->hs_failures++;
		return;
	}
	s->comms[s->ncomms++] = comm;
}

void du_srv_start(struct du_srv *s, tw_context *ctx, const char *uri, tw_recv_cb recv,
		  tw_close_cb close, void *arg)
{
	s->recv = recv;
	s->close = close;
	s->arg = arg;
	ck_assert_int_eq(tw_listener_new(ctx, uri, srv_accept, s, &s->lis), 0);
	ck_assert_int_eq(tw_listener_address(s->lis, s->addr, sizeof(s->addr)), 0);
}

void du_srv_stop(struct du_srv *s)
{
	for (size_t i = 0; i < s->ncomms; i++)
		tw_comm_free(s->comms[i]);
	s->ncomms = 0;
	tw_listener_free(s->lis);
	s->lis = NULL;
}

/* Raw client. */

/* Read exactly n bytes into p, driving the loop while none are there;
 * -1 after ms without a byte. */
static int raw_read(struct tu *l, int fd, void *p, size_t n, int ms)
{
	uint8_t *b = p;
	long long deadline = ts_now_ms() + ms;
	while (n > 0) {
		ssize_t r = recv(fd, b, n, MSG_DONTWAIT);
		if (r > 0) {
			b += r;
			n -= (size_t)r;
			deadline = ts_now_ms() + ms;
		} else if (r == 0 || (errno != EAGAIN && errno != EINTR) ||
			   ts_now_ms() > deadline) {
			return -1;
		} else {
			event_base_loop(l->base, EVLOOP_ONCE);
		}
	}
	return 0;
}

static uint64_t le64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return le64toh(v);
}

static int raw_frames(struct tu *l, int fd, uint64_t n, tw_msg *m, int ms)
{
	uint8_t word[8];
	uint64_t *lens = calloc(n, sizeof(*lens));
	int rv = lens != NULL ? 0 : -1;
	for (uint64_t i = 0; rv == 0 && i < n; i++)
		if ((rv = raw_read(l, fd, word, 8, ms)) == 0)
			lens[i] = le64(word);
	for (uint64_t i = 0; rv == 0 && i < n; i++) {
		uint8_t *buf = malloc(lens[i] ? lens[i] : 1);
		rv = buf != NULL ? raw_read(l, fd, buf, lens[i], ms) : -1;
		if (rv == 0)
			rv = tw_msg_append_copy(m, buf, lens[i]) == 0 ? 0 : -1;
		free(buf);
	}
	free(lens);
	return rv;
}

int du_raw_recv_msg(struct tu *l, int fd, tw_msg **out, int ms)
{
	uint8_t head[16];
	tw_msg *m;
	uint64_t n;
	if (raw_read(l, fd, head, 16, ms) != 0)
		return -1;
	n = le64(head + 8);
	if (n == 0 || n > 1024 || tw_msg_new(&m) != 0)
		return -1;
	if (raw_frames(l, fd, n, m, ms) != 0) {
		tw_msg_free(m);
		return -1;
	}
	*out = m;
	return 0;
}

int du_raw_wait_eof(struct tu *l, int fd, int ms)
{
	long long deadline = ts_now_ms() + ms;
	uint8_t b;
	while (ts_now_ms() < deadline) {
		ssize_t r = recv(fd, &b, 1, MSG_DONTWAIT);
		if (r == 0 || (r < 0 && errno == ECONNRESET))
			return 1;
		if (r > 0 || (errno != EAGAIN && errno != EINTR))
			return 0;
		event_base_loop(l->base, EVLOOP_ONCE);
	}
	return 0;
}

static void put_le64(uint8_t *p, uint64_t v)
{
	v = htole64(v);
	memcpy(p, &v, 8);
}

uint8_t *du_encode(const tw_msg *msg, size_t *len)
{
	size_t n = tw_msg_nframes(msg), off = 16 + 8 * n;
	size_t total = off + (size_t)tw_msg_bytes(msg);
	uint8_t *p = malloc(total);
	if (p == NULL)
		return NULL;
	put_le64(p, total - 8);
	put_le64(p + 8, n);
	for (size_t i = 0; i < n; i++) {
		const tw_slice *f = tw_msg_frame(msg, i);
		put_le64(p + 16 + 8 * i, f->len);
		if (f->len > 0)
			memcpy(p + off, tw_slice_data(f), f->len);
		off += f->len;
	}
	*len = total;
	return p;
}
