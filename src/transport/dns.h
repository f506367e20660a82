/* SPDX-License-Identifier: BSD-3-Clause */
/* The resolver for host names in connect URIs: the application's evdns
 * base (tw_context_set_dns_base) or one the context makes on first use,
 * from /etc/resolv.conf and /etc/hosts. evdns reports a canceled lookup
 * later, from the loop, so the resolver is reference-counted by the
 * context and each lookup in flight, and a base we made is freed after
 * the last of them (evdns_base_free under a pending callback is a
 * use-after-free inside libevent). */
#ifndef TW_TRANSPORT_DNS_H
#define TW_TRANSPORT_DNS_H

#include <taskwire/context.h>

struct tw__dns {
	struct evdns_base *base;
	struct event_base *loop;
	int refs;  /* the context's, plus one per lookup in flight (refs++) */
	int owned; /* ours: freed with the last reference */
};

/* The context's resolver, made on first use; NULL: no memory. */
struct tw__dns *tw__dns_resolver(tw_context *ctx);

/* Drop a reference; from_cb: inside an evdns callback, where the base may
 * not be freed (then it is, on the loop's next pass). */
void tw__dns_unref(struct tw__dns *d, int from_cb);

#endif
