/* SPDX-License-Identifier: BSD-3-Clause */
/* Addresses as Dask's scheduler reads them: Scheduler.coerce_address
 * (scheduler.py: a worker's name, then resolve_address), which resolves
 * host names (comm/addressing.py resolve_address, comm/tcp.py
 * BaseTCPBackend.resolve_address, utils.py ensure_ip: getaddrinfo for
 * IPv4, then IPv6, the first answer's address), and the `workers=`
 * argument of scatter and ncores, iterated as Python iterates it.
 *
 * Host names are resolved before the op runs, never blocking the loop:
 * the ops that take addresses run through op_resolving, which looks up
 * each name their request carries with libevent's evdns (/etc/hosts,
 * then the DNS servers of /etc/resolv.conf; the base the library's
 * connects use too, tw_context_set_dns_base) and then runs the op with
 * the answers (names_use). Numeric hosts are read at once
 * (getaddrinfo with AI_NUMERICHOST, which never blocks). */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/dns.h>
#include <event2/util.h>

#include "examples/mini-scheduler/sched.h"

struct dns_name {
	char *host;
	int done;
	int err; /* 0, or glibc's EAI_* code (Python's socket.gaierror) */
	char ip[80];
};

struct names {
	struct dns_name *v;
	size_t n, cap;
};

/* The answers the running op reads (NULL: none). */
static struct names *cur;
/* Set by names_keep: the running op keeps cur. */
static int cur_kept;

void names_use(struct names *nm)
{
	cur = nm;
}

struct names *names_keep(void)
{
	cur_kept = 1;
	return cur;
}

void names_free(struct names *nm)
{
	for (size_t i = 0; nm != NULL && i < nm->n; i++)
		free(nm->v[i].host);
	if (nm != NULL)
		free(nm->v);
	free(nm);
}

static struct dns_name *name_find(const struct names *nm, const char *host, size_t n)
{
	for (size_t i = 0; nm != NULL && i < nm->n; i++)
		if (strlen(nm->v[i].host) == n && memcmp(nm->v[i].host, host, n) == 0)
			return &nm->v[i];
	return NULL;
}

static void name_add(struct names *nm, const char *host, size_t n)
{
	if (name_find(nm, host, n) != NULL)
		return;
	if (nm->n == nm->cap) {
		nm->cap = nm->cap ? 2 * nm->cap : 4;
		if ((nm->v = realloc(nm->v, nm->cap * sizeof(*nm->v))) == NULL)
			abort();
	}
	memset(&nm->v[nm->n], 0, sizeof(nm->v[0]));
	if ((nm->v[nm->n++].host = strndup(host, n)) == NULL)
		abort();
}

/* Python's repr of a str (ASCII; the quote as Python picks it) into dst. */
static void pyrepr(char *dst, size_t len, const char *s, size_t n)
{
	char q = memchr(s, '\'', n) != NULL && memchr(s, '"', n) == NULL ? '"' : '\'';
	size_t o = 0;
	if (len < 3)
		return;
	dst[o++] = q;
	for (size_t i = 0; i < n && o + 3 < len; i++) {
		if (s[i] == '\\' || s[i] == q)
			dst[o++] = '\\';
		dst[o++] = s[i];
	}
	dst[o++] = q;
	dst[o] = '\0';
}

static int fail(struct exc *e, const char *type, const char *fmt, const char *s, size_t n)
{
	char r[400];
	pyrepr(r, sizeof(r), s, n);
	e->type = type;
	snprintf(e->text, sizeof(e->text), fmt, r);
	return -1;
}

/* Python's int(s) of a port, as decimal digits (sign kept) into out, or
 * -1: s is not a base-10 literal (underscores between digits and
 * surrounding blanks allowed, as Python's int). */
static int port_int(const char *s, size_t n, char *out, size_t len)
{
	size_t i = 0, o = 0, digits = 0;
	int neg = 0, lead = 1;
	while (n > 0 && strchr(" \t\n\r\f\v", s[n - 1]) != NULL)
		n--;
	while (i < n && strchr(" \t\n\r\f\v", s[i]) != NULL)
		i++;
	if (i < n && (s[i] == '+' || s[i] == '-'))
		neg = s[i++] == '-';
	for (; i < n; i++) {
		if (s[i] == '_' && digits > 0 && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '9')
			continue;
		if (s[i] < '0' || s[i] > '9' || o + 2 >= len)
			return -1;
		digits++;
		if (lead && s[i] == '0')
			continue;
		if (lead && neg)
			out[o++] = '-';
		lead = 0;
		out[o++] = s[i];
	}
	if (digits == 0)
		return -1;
	if (lead)
		out[o++] = '0';
	out[o] = '\0';
	return 0;
}

/* getaddrinfo of a numeric host in one family: its address as Python
 * gives it (getnameinfo NI_NUMERICHOST), or -1. */
static int numeric(const char *host, int family, char *ip, size_t len)
{
	struct addrinfo hints = {
		.ai_family = family, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST};
	struct addrinfo *ai;
	int rv;
	if (getaddrinfo(host, "1234", &hints, &ai) != 0)
		return -1;
	rv = getnameinfo(ai->ai_addr, ai->ai_addrlen, ip, (socklen_t)len, NULL, 0,
			 NI_NUMERICHOST) == 0
		     ? 0
		     : -1;
	freeaddrinfo(ai);
	return rv;
}

/* Dask's ensure_ip(host): "" is localhost; IPv4 first, then IPv6. A name
 * is read from the answers (cur); one not there yet goes into `collect`
 * (when given) and -2 is returned. */
static int ensure_ip(const char *host, size_t n, char *ip, size_t len, struct exc *e,
		     struct names *collect)
{
	char h[260];
	const struct dns_name *a;
	if (n == 0)
		host = "localhost", n = 9;
	if (memchr(host, 0, n) != NULL || n >= sizeof(h))
		return fail(e, "ValueError", "invalid host name %s", host, strnlen(host, n));
	memcpy(h, host, n);
	h[n] = '\0';
	if (numeric(h, AF_INET, ip, len) == 0 || numeric(h, AF_INET6, ip, len) == 0)
		return 0;
	if ((a = name_find(cur, h, n)) == NULL || !a->done) {
		if (collect == NULL) { /* not looked up: as a failed lookup */
			e->type = "socket.gaierror";
			e->errnum = EAI_AGAIN;
			snprintf(e->text, sizeof(e->text), "%s", gai_strerror(EAI_AGAIN));
			return -1;
		}
		name_add(collect, h, n);
		return -2;
	}
	if (a->err != 0) {
		e->type = "socket.gaierror";
		e->errnum = a->err;
		snprintf(e->text, sizeof(e->text), "%s", gai_strerror(a->err));
		return -1;
	}
	snprintf(ip, len, "%s", a->ip);
	return 0;
}

/* Dask's resolve_address(addr): parse_address (the scheme before the last
 * "://", tcp when none), then the backend's: tcp, tls, ws and wss
 * parse_host_port, ensure_ip and unparse_host_port; inproc and ucx leave
 * the location as it is. */
static int resolve_address(const char *addr, size_t alen, char *out, size_t len, struct exc *e,
			   struct names *collect)
{
	static const char *const tcpish[] = {"tcp", "tls", "ws", "wss"};
	const char *scheme = "tcp", *loc = addr, *host, *port, *end = addr + alen;
	size_t slen = 3, hlen;
	char ip[80], num[64];
	int rv, known = 0;
	for (const char *p = addr; p + 3 <= end; p++)
		if (memcmp(p, "://", 3) == 0)
			scheme = addr, slen = (size_t)(p - addr), loc = p + 3;
	if ((slen == 6 && memcmp(scheme, "inproc", 6) == 0) ||
	    (slen == 3 && memcmp(scheme, "ucx", 3) == 0)) {
		snprintf(out, len, "%.*s://%.*s", (int)slen, scheme, (int)(end - loc), loc);
		return 0;
	}
	for (size_t i = 0; i < sizeof(tcpish) / sizeof(tcpish[0]); i++)
		known |= strlen(tcpish[i]) == slen && memcmp(tcpish[i], scheme, slen) == 0;
	if (!known)
		return fail(e, "ValueError",
			    "unknown address scheme %s (known schemes: ['inproc', 'tcp', 'tls', "
			    "'ucx', 'ws', 'wss'])",
			    scheme, slen);
	/* parse_host_port(loc): "[v6]:port" or "host:port" */
	if (loc < end && *loc == '[') {
		const char *close = memchr(loc + 1, ']', (size_t)(end - loc - 1));
		if (close == NULL || (close + 1 < end && close[1] != ':'))
			return fail(e, "ValueError",
				    "invalid address %s; maybe: ipv6 needs brackets like [::1]",
				    loc, (size_t)(end - loc));
		if (close + 1 == end)
			return fail(e, "ValueError", "missing port number in address %s", loc,
				    (size_t)(end - loc));
		host = loc + 1, hlen = (size_t)(close - host), port = close + 2;
	} else {
		const char *colon = NULL;
		for (const char *p = loc; p < end; p++)
			if (*p == ':')
				colon = p;
		if (colon == NULL)
			return fail(e, "ValueError", "missing port number in address %s", loc,
				    (size_t)(end - loc));
		if (memchr(loc, ':', (size_t)(colon - loc)) != NULL)
			return fail(e, "ValueError",
				    "invalid address %s; maybe: ipv6 needs brackets like [::1]",
				    loc, (size_t)(end - loc));
		host = loc, hlen = (size_t)(colon - loc), port = colon + 1;
	}
	if (port_int(port, (size_t)(end - port), num, sizeof(num)) != 0)
		return fail(e, "ValueError", "invalid literal for int() with base 10: %s", port,
			    (size_t)(end - port));
	if ((rv = ensure_ip(host, hlen, ip, sizeof(ip), e, collect)) != 0)
		return rv;
	snprintf(out, len, strchr(ip, ':') ? "%.*s://[%s]:%s" : "%.*s://%s:%s", (int)slen, scheme,
		 ip, num);
	return 0;
}

static int coerce(const msgpack_object *o, char *out, size_t len, struct exc *e,
		  struct names *collect)
{
	const struct worker *w = worker_named(o);
	const char *s;
	size_t n;
	char buf[512];
	if (w != NULL) { /* Dask's self.aliases: a worker's name */
		snprintf(out, len, "%s", w->address);
		return 0;
	}
	e->type = "TypeError";
	if (o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size == 2 &&
	    obj_str(&o->via.array.ptr[0], &s, &n) == 0 &&
	    o->via.array.ptr[1].type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
		/* a (host, port) tuple: unparse_host_port, then as a string */
		int v6 = memchr(s, ':', n) != NULL && (n == 0 || s[0] != '[');
		snprintf(buf, sizeof(buf), "%s%.*s%s:%llu", v6 ? "[" : "", (int)(n > 400 ? 400 : n),
			 s, v6 ? "]" : "", (unsigned long long)o->via.array.ptr[1].via.u64);
		return resolve_address(buf, strlen(buf), out, len, e, collect);
	}
	if (obj_str(o, &s, &n) == 0)
		return resolve_address(s, n, out, len, e, collect);
	if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
		snprintf(e->text, sizeof(e->text),
			 "addresses should be strings or tuples, got %llu",
			 (unsigned long long)o->via.u64);
	else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
		snprintf(e->text, sizeof(e->text),
			 "addresses should be strings or tuples, got %lld", (long long)o->via.i64);
	else if (o->type == MSGPACK_OBJECT_NIL)
		snprintf(e->text, sizeof(e->text),
			 "addresses should be strings or tuples, got None");
	else if (o->type == MSGPACK_OBJECT_BOOLEAN)
		snprintf(e->text, sizeof(e->text), "addresses should be strings or tuples, got %s",
			 o->via.boolean ? "True" : "False");
	else
		snprintf(e->text, sizeof(e->text), "addresses should be strings or tuples");
	return -1;
}

int coerce_address(const msgpack_object *o, char *out, size_t len, struct exc *e)
{
	return coerce(o, out, len, e, NULL);
}

/* Calls fn on each entry of a `workers=` argument as Python iterates it:
 * a list's (msgpack array's) items, a str's characters, a dict's keys,
 * bytes' ints; anything else is not iterable (TypeError). fn's first
 * nonzero is returned. */
static int each_entry(const msgpack_object *arg, int (*fn)(const msgpack_object *o, void *a),
		      void *a, struct exc *e)
{
	int rv = 0;
	if (arg->type == MSGPACK_OBJECT_ARRAY) {
		for (uint32_t i = 0; rv == 0 && i < arg->via.array.size; i++)
			rv = fn(&arg->via.array.ptr[i], a);
	} else if (arg->type == MSGPACK_OBJECT_MAP) {
		for (uint32_t i = 0; rv == 0 && i < arg->via.map.size; i++)
			rv = fn(&arg->via.map.ptr[i].key, a);
	} else if (arg->type == MSGPACK_OBJECT_STR) {
		const char *s = arg->via.str.ptr;
		for (uint32_t i = 0, cl; rv == 0 && i < arg->via.str.size; i += cl) {
			msgpack_object c = {.type = MSGPACK_OBJECT_STR};
			unsigned char b = (unsigned char)s[i];
			cl = b < 0x80 ? 1 : b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : 2; /* one code point */
			if (cl > arg->via.str.size - i)
				cl = arg->via.str.size - i;
			c.via.str.ptr = s + i;
			c.via.str.size = cl;
			rv = fn(&c, a);
		}
	} else if (arg->type == MSGPACK_OBJECT_BIN) {
		for (uint32_t i = 0; rv == 0 && i < arg->via.bin.size; i++) {
			msgpack_object c = {.type = MSGPACK_OBJECT_POSITIVE_INTEGER};
			c.via.u64 = (unsigned char)arg->via.bin.ptr[i];
			rv = fn(&c, a);
		}
	} else {
		e->type = "TypeError";
		snprintf(e->text, sizeof(e->text), "'%s' object is not iterable",
			 arg->type == MSGPACK_OBJECT_BOOLEAN ? "bool"
			 : arg->type == MSGPACK_OBJECT_FLOAT64 ||
					 arg->type == MSGPACK_OBJECT_FLOAT32
				 ? "float"
				 : "int");
		rv = -1;
	}
	return rv;
}

struct coerce_all {
	struct addrs *out;
	struct exc *e;
};

static int coerce_one(const msgpack_object *o, void *arg)
{
	struct coerce_all *c = arg;
	char addr[512];
	if (coerce_address(o, addr, sizeof(addr), c->e) != 0)
		return -1;
	if (c->out->n % 8 == 0 &&
	    (c->out->v = realloc(c->out->v, (c->out->n + 8) * sizeof(*c->out->v))) == NULL)
		abort();
	if ((c->out->v[c->out->n++] = strdup(addr)) == NULL)
		abort();
	return 0;
}

int workers_arg(const msgpack_object *arg, int must_exist, struct addrs *out, struct exc *e)
{
	struct coerce_all c = {out, e};
	memset(out, 0, sizeof(*out));
	out->any = arg == NULL || arg->type == MSGPACK_OBJECT_NIL;
	if (out->any)
		return 0;
	/* Dask coerces the whole list first, then looks each up. */
	if (each_entry(arg, coerce_one, &c, e) != 0) {
		addrs_free(out);
		return -1;
	}
	for (size_t i = 0; must_exist && i < out->n; i++)
		if (worker_find(out->v[i], strlen(out->v[i])) == NULL) {
			e->type = "KeyError";
			snprintf(e->text, sizeof(e->text), "%s", out->v[i]);
			addrs_free(out);
			return -1;
		}
	return 0;
}

int addrs_has(const struct addrs *a, const char *address)
{
	if (a->any)
		return 1;
	for (size_t i = 0; i < a->n; i++)
		if (strcmp(a->v[i], address) == 0)
			return 1;
	return 0;
}

void addrs_free(struct addrs *a)
{
	for (size_t i = 0; i < a->n; i++)
		free(a->v[i]);
	free(a->v);
	memset(a, 0, sizeof(*a));
}

/* --- resolving names before an op runs --- */

struct resolving {
	tw_request *r; /* NULL once answered (the scheduler stopped) */
	const struct resolving_op *op;
	struct names *names;
	int left; /* lookups in flight, +1 while they are being started */
};

struct lookup {
	struct lookup *next; /* in flight */
	struct resolving *rs;
	size_t i; /* rs->names->v[i] */
	int family;
	struct evdns_getaddrinfo_request *req; /* NULL until evdns_getaddrinfo returned */
};
static struct lookup *inflight;

static void run(const struct resolving_op *op, tw_request *r, struct names *nm)
{
	cur = nm;
	cur_kept = 0;
	op->fn(r, op->arg);
	if (!cur_kept)
		names_free(nm);
	cur = NULL;
	cur_kept = 0;
}

static void resolving_done(struct resolving *rs)
{
	if (rs->r != NULL)
		run(rs->op, rs->r, rs->names);
	else
		names_free(rs->names);
	free(rs);
}

/* evdns's error as glibc's getaddrinfo gives it (Python's gaierror). */
static int gai_code(int ev)
{
	switch (ev) {
	case EVUTIL_EAI_ADDRFAMILY: return EAI_ADDRFAMILY;
	case EVUTIL_EAI_AGAIN: return EAI_AGAIN;
	case EVUTIL_EAI_FAMILY: return EAI_FAMILY;
	case EVUTIL_EAI_MEMORY: return EAI_MEMORY;
	case EVUTIL_EAI_NODATA: return EAI_NODATA;
	case EVUTIL_EAI_NONAME: return EAI_NONAME;
	default: return EAI_FAIL;
	}
}

static void lookup_start(struct resolving *rs, size_t i, int family);

static void on_lookup(int result, struct evutil_addrinfo *ai, void *arg)
{
	struct lookup *l = arg, **p = &inflight;
	struct resolving *rs = l->rs;
	struct dns_name *nm = &rs->names->v[l->i];
	while (*p != l)
		p = &(*p)->next;
	*p = l->next;
	if (result == 0 && ai != NULL &&
	    getnameinfo(ai->ai_addr, ai->ai_addrlen, nm->ip, sizeof(nm->ip), NULL, 0,
			NI_NUMERICHOST) == 0) {
		nm->done = 1;
	} else if (l->family == AF_INET && result != EVUTIL_EAI_CANCEL && rs->r != NULL) {
		lookup_start(rs, l->i, AF_INET6); /* ensure_ip: then IPv6 */
	} else {
		nm->done = 1;
		nm->err = gai_code(result);
	}
	if (ai != NULL)
		evutil_freeaddrinfo(ai);
	free(l);
	if (--rs->left == 0)
		resolving_done(rs);
}

static void lookup_start(struct resolving *rs, size_t i, int family)
{
	struct evutil_addrinfo hints = {.ai_family = family, .ai_socktype = SOCK_STREAM};
	struct evdns_getaddrinfo_request *req;
	struct lookup *l = calloc(1, sizeof(*l));
	if (l == NULL)
		abort();
	l->rs = rs;
	l->i = i;
	l->family = family;
	l->next = inflight;
	inflight = l;
	rs->left++;
	/* NULL: answered already (numeric, /etc/hosts), l is gone */
	if ((req = evdns_getaddrinfo(S.dns, rs->names->v[i].host, "1234", &hints, on_lookup, l)) !=
	    NULL)
		l->req = req;
}

/* Which fields of a request hold addresses: `workers` (scatter, ncores),
 * the lists of `who_has` (update_data), `address` (register-worker,
 * heartbeat_worker, unregister). Their names go into nm. */
static int collect_one(const msgpack_object *o, void *arg)
{
	char out[512];
	struct exc e;
	coerce(o, out, sizeof(out), &e, arg);
	return 0;
}

static void collect(tw_request *r, struct names *nm)
{
	const msgpack_object *workers = tw_request_arg(r, "workers");
	const msgpack_object *who_has = tw_request_arg(r, "who_has");
	const msgpack_object *address = tw_request_arg(r, "address");
	struct exc e;
	if (workers != NULL && workers->type != MSGPACK_OBJECT_NIL)
		each_entry(workers, collect_one, nm, &e);
	for (uint32_t i = 0;
	     who_has != NULL && who_has->type == MSGPACK_OBJECT_MAP && i < who_has->via.map.size;
	     i++)
		if (who_has->via.map.ptr[i].val.type == MSGPACK_OBJECT_ARRAY)
			each_entry(&who_has->via.map.ptr[i].val, collect_one, nm, &e);
	if (address != NULL)
		collect_one(address, nm);
}

void op_resolving(tw_request *r, void *arg)
{
	const struct resolving_op *op = arg;
	struct resolving *rs;
	struct names *nm = calloc(1, sizeof(*nm));
	if (nm == NULL)
		abort();
	collect(r, nm);
	if (nm->n == 0) {
		run(op, r, nm);
		return;
	}
	if ((rs = calloc(1, sizeof(*rs))) == NULL)
		abort();
	rs->r = r;
	rs->op = op;
	rs->names = nm;
	rs->left = 1;
	for (size_t i = 0; i < nm->n; i++) {
		say("resolving %s (Dask's coerce_address)\n", nm->v[i].host);
		lookup_start(rs, i, AF_INET);
	}
	if (--rs->left == 0)
		resolving_done(rs);
}

void resolving_stop(void)
{
	for (struct lookup *l = inflight; l != NULL; l = l->next)
		if (l->rs->r != NULL) {
			reply_error(l->rs->r, "the scheduler stopped");
			l->rs->r = NULL;
		}
	/* evdns reports each cancel from the loop, where on_lookup frees
	 * its lookup; the requests are taken first, in case it does so at
	 * once. */
	size_t n = 0, i = 0;
	struct evdns_getaddrinfo_request **reqs;
	for (struct lookup *l = inflight; l != NULL; l = l->next)
		n++;
	if ((reqs = calloc(n + 1, sizeof(*reqs))) == NULL)
		abort();
	for (struct lookup *l = inflight; l != NULL; l = l->next)
		if (l->req != NULL)
			reqs[i++] = l->req;
	while (i > 0)
		evdns_getaddrinfo_cancel(reqs[--i]);
	free(reqs);
}
