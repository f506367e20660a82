/* SPDX-License-Identifier: BSD-3-Clause */
/* Transport address parsing (transport/uri.h). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include <taskwire/error.h>

#include "transport/uri.h"

static int copy_part(char *dst, size_t cap, const char *p, size_t n)
{
	if (n == 0 || n >= cap)
		return TW_EADDR;
	memcpy(dst, p, n);
	dst[n] = '\0';
	return 0;
}

static int parse_port(const char *p, size_t n, uint16_t *out)
{
	unsigned long v = 0;
	if (n == 0 || n > 5)
		return TW_EADDR;
	for (size_t i = 0; i < n; i++) {
		if (p[i] < '0' || p[i] > '9')
			return TW_EADDR;
		v = v * 10 + (unsigned long)(p[i] - '0');
	}
	if (v > 65535)
		return TW_EADDR;
	*out = (uint16_t)v;
	return 0;
}

int tw__uri_parse(const char *s, struct tw__uri *u)
{
	const char *sep, *host, *host_end, *port, *end;
	if (s == NULL || (sep = strstr(s, "://")) == NULL)
		return TW_EADDR;
	memset(u, 0, sizeof(*u));
	if (copy_part(u->scheme, sizeof(u->scheme), s, (size_t)(sep - s)) != 0)
		return TW_EADDR;
	host = sep + 3;
	if (*host == '[') {
		host++;
		if ((host_end = strchr(host, ']')) == NULL || host_end[1] != ':')
			return TW_EADDR;
		port = host_end + 2;
	} else {
		if ((host_end = strchr(host, ':')) == NULL)
			return TW_EADDR;
		port = host_end + 1;
	}
	/* Brackets only around the whole host; no path inside it. */
	if (copy_part(u->host, sizeof(u->host), host, (size_t)(host_end - host)) != 0 ||
	    strpbrk(u->host, "[]/") != NULL)
		return TW_EADDR;
	end = strchr(port, '/');
	if (end == NULL)
		end = port + strlen(port);
	if (parse_port(port, (size_t)(end - port), &u->port) != 0)
		return TW_EADDR;
	if (*end == '\0')
		end = "/";
	return copy_part(u->path, sizeof(u->path), end, strlen(end));
}

int tw__uri_format(const char *scheme, const char *host, uint16_t port, char *buf, size_t len)
{
	int v6 = strchr(host, ':') != NULL;
	int n = snprintf(buf, len, v6 ? "%s://[%s]:%u" : "%s://%s:%u", scheme, host,
			 (unsigned)port);
	return n < 0 || (size_t)n >= len ? TW_ERANGE : 0;
}

int tw__uri_format_sa(const char *scheme, const struct sockaddr *sa, char *buf, size_t len)
{
	char host[INET6_ADDRSTRLEN];
	uint16_t port;
	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
		inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof(host));
		port = ntohs(s6->sin6_port);
	} else if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
		inet_ntop(AF_INET, &s4->sin_addr, host, sizeof(host));
		port = ntohs(s4->sin_port);
	} else {
		return TW_EADDR;
	}
	return tw__uri_format(scheme, host, port, buf, len);
}
