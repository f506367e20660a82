/* SPDX-License-Identifier: BSD-3-Clause */
/* Raw loopback sockets (tests/support/sock.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <check.h>

#include "tests/support/loop.h"
#include "tests/support/sock.h"

int ts_raw_connect(const char *uri)
{
	char host[128];
	struct addrinfo hints, *ai;
	const char *h = strstr(uri, "://"), *colon = strrchr(uri, ':');
	size_t hl;
	int fd;
	ck_assert_msg(h != NULL && colon != NULL && colon > h + 3, "not a URI: %s", uri);
	h += 3;
	hl = (size_t)(colon - h);
	if (*h == '[' && hl >= 2 && colon[-1] == ']') {
		h++;
		hl -= 2;
	}
	ck_assert_uint_lt(hl, sizeof(host));
	memcpy(host, h, hl);
	host[hl] = '\0';
	memset(&hints, 0, sizeof(hints));
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV;
	ck_assert_msg(getaddrinfo(host, colon + 1, &hints, &ai) == 0, "cannot resolve %s", uri);
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(fd, 0);
	ck_assert_msg(connect(fd, ai->ai_addr, ai->ai_addrlen) == 0, "connect %s: %s", uri,
		      strerror(errno));
	freeaddrinfo(ai);
	return fd;
}

void ts_raw_reset(const char *uri, const char *scheme, char *peer, size_t len)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	struct linger lg = {1, 0};
	char ip[INET6_ADDRSTRLEN];
	const void *a;
	unsigned port;
	int fd = ts_raw_connect(uri), n;
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&ss, &sl), 0);
	if (ss.ss_family == AF_INET6) {
		a = &((struct sockaddr_in6 *)&ss)->sin6_addr;
		port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	} else {
		a = &((struct sockaddr_in *)&ss)->sin_addr;
		port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
	}
	ck_assert_ptr_nonnull(inet_ntop(ss.ss_family, a, ip, sizeof(ip)));
	n = snprintf(peer, len, ss.ss_family == AF_INET6 ? "%s://[%s]:%u" : "%s://%s:%u", scheme,
		     ip, port);
	ck_assert(n > 0 && (size_t)n < len);
	ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
	close(fd);
}

int ts_raw_listen_at(const char *host, const char *scheme, int backlog, int flags, char *uri,
		     size_t len)
{
	struct sockaddr_storage ss;
	struct sockaddr_in *in = (struct sockaddr_in *)&ss;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
	int v6 = strchr(host, ':') != NULL;
	socklen_t sl = v6 ? sizeof(*in6) : sizeof(*in);
	int fd;
	memset(&ss, 0, sizeof(ss));
	ss.ss_family = v6 ? AF_INET6 : AF_INET;
	ck_assert_msg(inet_pton(ss.ss_family, host,
				v6 ? (void *)&in6->sin6_addr : (void *)&in->sin_addr) == 1,
		      "not a numeric address: %s", host);
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | flags, 0);
	ck_assert_int_ge(fd, 0);
	ck_assert_msg(bind(fd, (struct sockaddr *)&ss, sl) == 0, "bind %s: %s", host,
		      strerror(errno));
	if (backlog >= 0)
		ck_assert_int_eq(listen(fd, backlog), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&ss, &sl), 0);
	if (uri != NULL)
		snprintf(uri, len, v6 ? "%s://[%s]:%u" : "%s://%s:%u", scheme, host,
			 (unsigned)ntohs(v6 ? in6->sin6_port : in->sin_port));
	return fd;
}

int ts_raw_listen(const char *scheme, int backlog, int flags, char *uri, size_t len)
{
	return ts_raw_listen_at("127.0.0.1", scheme, backlog, flags, uri, len);
}

int ts_have_ipv6(void)
{
	struct sockaddr_in6 sa = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
	int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0), ok;
	if (fd < 0)
		return 0;
	ok = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	close(fd);
	return ok;
}

unsigned ts_free_port(void)
{
	char uri[64];
	int fd = ts_raw_listen("tcp", -1, 0, uri, sizeof(uri));
	close(fd);
	return (unsigned)strtoul(strrchr(uri, ':') + 1, NULL, 10);
}

size_t ts_raw_send(struct event_base *base, int fd, const void *p, size_t n, int ms)
{
	const uint8_t *b = p;
	size_t done = 0;
	long long deadline = ts_now_ms() + ms;
	while (done < n) {
		ssize_t k = send(fd, b + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (k > 0) {
			done += (size_t)k;
			deadline = ts_now_ms() + ms; /* a hang guard: slow is not stuck */
			continue;
		}
		if (k < 0 && (errno == EPIPE || errno == ECONNRESET))
			break;
		ck_assert_msg(k < 0 && (errno == EAGAIN || errno == EINTR), "send: %s",
			      strerror(errno));
		ck_assert_msg(ts_now_ms() < deadline, "raw send stalled at %zu of %zu bytes", done,
			      n);
		event_base_loop(base, EVLOOP_ONCE);
	}
	return done;
}
