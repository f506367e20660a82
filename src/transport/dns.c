/* SPDX-License-Identifier: BSD-3-Clause */
/* The resolver for host names in connect URIs (transport/dns.h): the
 * application's evdns base (tw_context_set_dns_base) or the context's own,
 * reference-counted by the context and its lookups in flight. */
#include <stdlib.h>

#include <event2/dns.h>
#include <event2/event.h>

#include <taskwire/context.h>
#include <taskwire/error.h>

#include "core/context.h"
#include "transport/dns.h"

static void dns_free_later(evutil_socket_t fd, short what, void *arg)
{
	struct tw__dns *d = arg;
	(void)fd;
	(void)what;
	evdns_base_free(d->base, 0);
	free(d);
}

void tw__dns_unref(struct tw__dns *d, int from_cb)
{
	if (--d->refs > 0)
		return;
	if (!d->owned)
		free(d);
	else if (!from_cb)
		dns_free_later(-1, 0, d);
	else /* no memory for the event: the base stays, not freed under evdns */
		(void)event_base_once(d->loop, -1, EV_TIMEOUT, dns_free_later, d, NULL);
}

static void dns_release(void *d)
{
	tw__dns_unref(d, 0);
}

/* The context's reference, its extension (core/context.h). A loop thread's
 * context makes its own resolver, on its own base. */
static const struct tw__ext_ops dns_ops = {
	.release = dns_release,
};

static struct tw__dns *dns_wrap(tw_context *ctx, struct evdns_base *base, int owned)
{
	struct tw__dns *d = calloc(1, sizeof(*d));
	if (d != NULL) {
		d->base = base;
		d->loop = ctx->base;
		d->refs = 1;
		d->owned = owned;
	}
	return d;
}

int tw_context_set_dns_base(tw_context *ctx, struct evdns_base *base)
{
	struct tw__dns *d = NULL;
	if (ctx == NULL)
		return TW_EINVAL;
	if (base != NULL && (d = dns_wrap(ctx, base, 0)) == NULL)
		return TW_ENOMEM;
	if (tw__ctx_set_ext(ctx, &dns_ops, d) != 0) {
		free(d);
		return TW_ENOMEM;
	}
	return 0;
}

struct tw__dns *tw__dns_resolver(tw_context *ctx)
{
	struct tw__dns *d = tw__ctx_ext(ctx, &dns_ops);
	struct evdns_base *base;
	if (d == NULL) {
		base = evdns_base_new(ctx->base, EVDNS_BASE_INITIALIZE_NAMESERVERS |
							 EVDNS_BASE_DISABLE_WHEN_INACTIVE);
		if (base == NULL)
			return NULL;
		if ((d = dns_wrap(ctx, base, 1)) == NULL ||
		    tw__ctx_set_ext(ctx, &dns_ops, d) != 0) {
			free(d);
			evdns_base_free(base, 0);
			return NULL;
		}
	}
	return d;
}
