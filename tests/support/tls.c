/* SPDX-License-Identifier: BSD-3-Clause */
/* Helpers for the tls:// suites (tests/support/tls.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <check.h>
#include <event2/event.h>
#include <openssl/evp.h>

#include "tests/support/tls.h"
#include "tests/support/tran.h"

#define MAX_EXTRA 8

static tw_context *extra[MAX_EXTRA];
static size_t nextra;
struct listen_arg {
	struct tu *h;
	int dask;
	int *failed;
};
static struct listen_arg largs[MAX_EXTRA];
static size_t nlargs;

/* Peers made here (they may live on extra contexts): freed before them. */
static struct tu_peer **mine;
static size_t nmine, capmine;

tw_tls_config *tt_config(const char *ca, const char *cert, const char *key)
{
	tw_tls_config *cfg;
	ck_assert_int_eq(tw_tls_config_new(&cfg), 0);
	if (ca != NULL)
		ck_assert_msg(tw_tls_config_set_ca_file(cfg, ts_cert(ca)) == 0, "%s",
			      tw_tls_config_last_error(cfg));
	if (cert != NULL)
		ck_assert_msg(tw_tls_config_set_cert_files(cfg, ts_cert(cert), ts_cert(key)) == 0,
			      "%s", tw_tls_config_last_error(cfg));
	return cfg;
}

void tt_use_tls(tw_context *ctx, const char *ca, const char *cert, const char *key)
{
	tw_tls_config *cfg = tt_config(ca, cert, key);
	ck_assert_int_eq(tw_context_set_tls(ctx, cfg), 0);
	tw_tls_config_free(cfg); /* the context holds its own reference */
}

/* Harness. */

void tt_init(struct tu *h)
{
	ts_tran_init(h, TS_TLS);
}

struct tu_peer *tt_setup_echo(struct tu *h)
{
	return ts_tran_setup_echo(h, TS_TLS);
}

static struct tu_peer *my_peer(struct tu *h)
{
	struct tu_peer *p = tu_peer_new(h);
	if (nmine == capmine) {
		capmine = capmine ? 2 * capmine : 64;
		mine = realloc(mine, capmine * sizeof(*mine));
		ck_assert_ptr_nonnull(mine);
	}
	mine[nmine++] = p;
	return p;
}

struct tu_peer *tt_peer(struct tu *h, tw_comm *c)
{
	struct tu_peer *p = my_peer(h);
	ck_assert_int_eq(tu_peer_start(p, c), 0);
	return p;
}

void tt_peer_free(struct tu_peer *p)
{
	for (size_t i = 0; i < nmine; i++)
		if (mine[i] == p) {
			mine[i] = mine[--nmine];
			break;
		}
	tu_peer_free(p);
}

void tt_fini(struct tu *h)
{
	for (size_t i = 0; i < nmine; i++)
		tu_peer_free(mine[i]);
	free(mine);
	mine = NULL;
	nmine = capmine = 0;
	for (size_t i = 0; i < nextra; i++)
		tw_context_free(extra[i]);
	nextra = 0;
	nlargs = 0;
	tu_fini(h);
}

tw_context *tt_context(struct tu *h, const char *ca, const char *cert, const char *key)
{
	tw_context *ctx;
	ck_assert_uint_lt(nextra, MAX_EXTRA);
	ck_assert_int_eq(tw_context_new(h->base, &ctx), 0);
	/* the clocks of tu_init's context (tests/support/harness.c): a TLS handshake
	 * under valgrind on a loaded machine outlasts the 10 s defaults */
	ck_assert_int_eq(tw_context_set_handshake_timeout_ms(ctx, TU_WAIT_MS), 0);
	ck_assert_int_eq(tw_context_set_tls_handshake_timeout_ms(ctx, TU_WAIT_MS), 0);
	ck_assert_int_eq(tw_context_set_tcp_timeout_ms(ctx, 0), 0);
	if (ca != NULL || cert != NULL)
		tt_use_tls(ctx, ca, cert, key);
	extra[nextra++] = ctx;
	return ctx;
}

/* Connects. */

struct conn_wait {
	struct tu *h;
	tw_context *ctx;
	int start;
	struct tu_peer *peer;
	tw_comm *comm;
	int err; /* 1 until the callback ran */
	char why[512];
};

static void on_connected(tw_comm *c, int err, void *arg)
{
	struct conn_wait *w = arg;
	w->err = err;
	w->comm = c;
	if (err != 0) {
		ck_assert_ptr_null(c);
		snprintf(w->why, sizeof(w->why), "%s", tw_context_last_error(w->ctx));
		return;
	}
	if (!w->start)
		return;
	w->peer = my_peer(w->h);
	ck_assert_int_eq(tu_peer_start(w->peer, c), 0);
}

static int connect_done(void *arg)
{
	return ((struct conn_wait *)arg)->err != 1;
}

static int connect_wait(struct conn_wait *w, const char *uri, char *why, size_t why_len)
{
	int rv = tw_comm_connect(w->ctx, uri, on_connected, w);
	if (rv != 0)
		return rv;
	ck_assert_msg(tu_run_until(w->h, connect_done, w, TU_WAIT_MS), "connect hung");
	if (why != NULL)
		snprintf(why, why_len, "%s", w->why);
	return w->err;
}

int tt_connect(struct tu *h, tw_context *ctx, const char *uri, struct tu_peer **out, char *why,
	       size_t why_len)
{
	struct conn_wait w = {.h = h, .ctx = ctx, .start = 1, .err = 1};
	int rv = connect_wait(&w, uri, why, why_len);
	*out = w.peer;
	return rv;
}

int tt_connect_bare(struct tu *h, tw_context *ctx, const char *uri, tw_comm **out, char *why,
		    size_t why_len)
{
	struct conn_wait w = {.h = h, .ctx = ctx, .start = 0, .err = 1};
	int rv = connect_wait(&w, uri, why, why_len);
	*out = w.comm;
	return rv;
}

int tt_refused(struct tu *h, tw_context *ctx, const char *uri, int write, int ms, int *stage,
	       char *why, size_t why_len)
{
	struct tu_peer *p;
	int rv = tt_connect(h, ctx, uri, &p, why, why_len);
	*stage = 0;
	if (rv != 0)
		return rv;
	*stage = 1;
	if (write) {
		/* Under TLS 1.3 the server's refusal may already have ended the
		 * comm (read while the connect finished): then the write is
		 * refused, and the close error below still says why. */
		size_t lens[] = {100};
		tw_msg *m = ts_msg_pattern(lens, 1, 0);
		int wr = tw_comm_write(p->comm, m);
		if (wr != 0) {
			ck_assert_int_eq(wr, TW_ECLOSED);
			tw_msg_free(m);
		}
	}
	tu_wait_flag(h, &p->closed, ms);
	rv = p->closed ? p->close_err : 0;
	snprintf(why, why_len, "%s", p->last_error);
	tt_peer_free(p);
	return rv;
}

/* The Dask handshake. */

struct hs_wait {
	int done, err;
	char why[512];
};

static void on_handshake(tw_comm *c, int err, const tw_handshake_info *info, void *arg)
{
	struct hs_wait *w = arg;
	(void)info;
	w->done = 1;
	w->err = err;
	if (err != 0) {
		snprintf(w->why, sizeof(w->why), "%s", tw_comm_last_error(c));
		tw_comm_free(c);
	}
}

int tt_handshake(struct tu *h, tw_comm *c, int listener_side, char *why, size_t why_len)
{
	struct hs_wait w = {0, 0, ""};
	int rv = tw_comm_handshake(c, listener_side, on_handshake, &w);
	if (rv != 0)
		return rv;
	ck_assert_msg(tu_wait_flag(h, &w.done, TU_WAIT_MS), "handshake hung");
	if (why != NULL)
		snprintf(why, why_len, "%s", w.why);
	return w.err;
}

struct tu_peer *tt_dask_client(struct tu *h, const char *uri)
{
	char why[512] = "";
	struct tu_peer *p;
	tw_comm *c;
	int rv = tt_connect_bare(h, h->ctx, uri, &c, why, sizeof(why));
	ck_assert_msg(rv == 0, "connect %s: %s: %s", uri, tw_strerror(rv), why);
	rv = tt_handshake(h, c, 0, why, sizeof(why));
	ck_assert_msg(rv == 0, "handshake: %s: %s", tw_strerror(rv), why);
	p = tt_peer(h, c);
	p->keep = 1;
	return p;
}

void tt_assert_scheduler(struct tu *h, struct tu_peer *p, int ms)
{
	tw_decoded *d = tu_call(h, p, tu_request("identity", NULL), ms);
	const msgpack_object *root = tw_decoded_root(d);
	ck_assert_int_eq(root->type, MSGPACK_OBJECT_MAP);
	ck_assert_ptr_nonnull(tw_msgpack_map_get(root, "id"));
	ck_assert_msg(tw_msgpack_str_eq(tw_msgpack_map_get(root, "type"), "Scheduler"),
		      "no type Scheduler");
	tw_decoded_free(d);
}

void tt_assert_echo(struct tu *h, struct tu_peer *p, tw_block *data, size_t off, size_t len, int ms)
{
	tw_slice s = len ? (tw_slice){data, off, len} : (tw_slice){NULL, 0, 0};
	tw_decoded *d = tu_call(h, p, tu_request("echo", &s), ms);
	const uint8_t *got;
	size_t n;
	ck_assert_msg(tw_decoded_bytes(d, tw_decoded_root(d), &got, &n) == 0,
		      "reply to %zu bytes is not bytes", len);
	ck_assert_uint_eq(n, len);
	ck_assert_msg(n == 0 || memcmp(got, tw_block_data(data) + off, n) == 0,
		      "echo of %zu bytes differs", len);
	tw_decoded_free(d);
}

/* Listeners. */

static void start_server_peer(struct tu *h, tw_comm *c)
{
	struct tu_peer *p;
	ck_assert_uint_lt(h->nsrv, TU_MAX_SERVER_COMMS);
	p = my_peer(h);
	p->echo = 1;
	ck_assert_int_eq(tu_peer_start(p, c), 0);
	h->srv[h->nsrv++] = p;
}

static void on_server_handshake(tw_comm *c, int err, const tw_handshake_info *info, void *arg)
{
	struct listen_arg *la = arg;
	(void)info;
	if (err != 0) {
		if (la->failed != NULL)
			(*la->failed)++;
		tw_comm_free(c);
		return;
	}
	start_server_peer(la->h, c);
}

static void on_accept(tw_listener *l, tw_comm *c, void *arg)
{
	struct listen_arg *la = arg;
	(void)l;
	if (!la->dask)
		start_server_peer(la->h, c);
	else if (tw_comm_handshake(c, TW_HANDSHAKE_LISTENER, on_server_handshake, la) != 0)
		tw_comm_free(c);
}

tw_listener *tt_listen(struct tu *h, tw_context *ctx, const char *uri, int dask, int *failed,
		       char *addr, size_t addr_len)
{
	struct listen_arg *la;
	tw_listener *l;
	ck_assert_uint_lt(nlargs, MAX_EXTRA);
	la = &largs[nlargs++];
	*la = (struct listen_arg){h, dask, failed};
	ck_assert_int_eq(tu_tw_listen(ctx, uri, on_accept, la, &l), 0);
	ck_assert_int_eq(tw_listener_address(l, addr, addr_len), 0);
	return l;
}

const char *tt_uri_as(const char *uri, const char *scheme, char *buf, size_t len)
{
	const char *rest = strstr(uri, "://");
	ck_assert_ptr_nonnull(rest);
	snprintf(buf, len, "%s%s", scheme, rest);
	return buf;
}

void tt_canary(struct tu_peer *cli, unsigned seed)
{
	size_t lens[] = {10, 100000};
	tu_echo_check(cli, lens, 2, seed, TU_WAIT_MS);
	ck_assert_int_eq(cli->closed, 0);
}

/* Counting, hashing. */

int tt_fd_count(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;
	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d)) != NULL)
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1; /* the directory's own fd */
}

static int close_wait_in(const char *path, unsigned port)
{
	FILE *f = fopen(path, "r");
	char line[512];
	int n = 0;
	if (f == NULL)
		return 0;
	while (fgets(line, sizeof(line), f) != NULL) {
		char local[64], remote[64];
		unsigned st;
		const char *lp, *rp;
		if (sscanf(line, " %*d: %63s %63s %x", local, remote, &st) != 3)
			continue;
		lp = strrchr(local, ':');
		rp = strrchr(remote, ':');
		if (st == 8 && lp && rp &&
		    (strtoul(lp + 1, NULL, 16) == port || strtoul(rp + 1, NULL, 16) == port))
			n++;
	}
	fclose(f);
	return n;
}

int tt_close_wait_count(unsigned port)
{
	return close_wait_in("/proc/net/tcp", port) + close_wait_in("/proc/net/tcp6", port);
}

unsigned tt_uri_port(const char *uri)
{
	const char *colon = strrchr(uri, ':');
	ck_assert_ptr_nonnull(colon);
	return (unsigned)strtoul(colon + 1, NULL, 10);
}

void tt_sha256(const void *p, size_t n, uint8_t out[32])
{
	unsigned int len = 32;
	ck_assert_int_eq(EVP_Digest(p, n, out, &len, EVP_sha256(), NULL), 1);
}

/* Child processes. */
