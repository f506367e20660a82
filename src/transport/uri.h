/* SPDX-License-Identifier: BSD-3-Clause */
/* Transport addresses: `scheme://host:port[/path]`, host a name, an IPv4
 * address, or an IPv6 address in brackets. */
#ifndef TW_TRANSPORT_URI_H
#define TW_TRANSPORT_URI_H

#include <stddef.h>
#include <stdint.h>

struct tw__uri {
	char scheme[16];
	char host[256]; /* without brackets */
	uint16_t port;
	char path[256]; /* "/" when absent */
};

/* tw__uri_parse: parse `s`. Returns 0, or TW_EADDR when s is malformed:
 * no "://", an empty or over-long scheme or host, a bad bracket, a missing
 * port, a port that is not a decimal number up to 65535. */
int tw__uri_parse(const char *s, struct tw__uri *u);

/* tw__uri_format: "scheme://host:port" (host bracketed when it has a
 * colon) into buf of len bytes. Returns 0 or TW_ERANGE. A buffer of
 * TW__URI_TEXT_BYTES holds any struct tw__uri's. */
#define TW__URI_TEXT_BYTES (16 + 3 + 256 + 2 + 6 + 1)
int tw__uri_format(const char *scheme, const char *host, uint16_t port, char *buf, size_t len);

struct sockaddr;
/* tw__uri_format_sa: the same from a socket address. */
int tw__uri_format_sa(const char *scheme, const struct sockaddr *sa, char *buf, size_t len);

#endif
