/* SPDX-License-Identifier: BSD-3-Clause */
/* A fault-injection TCP proxy for the tests, on the test's event_base
 * (libevent bufferevents): it sits between a client and a server and
 * forwards bytes both ways, or injects one fault into one or both
 * directions:
 * - FP_PASS:       no fault: a relay that counts connections;
 * - FP_DELAY:      hold each burst of bytes delay_ms before forwarding it;
 * - FP_THROTTLE:   forward at most rate bytes per second (libevent's
 *                  token buckets, 100 ms ticks);
 * - FP_STALL:      forward `after` bytes, then stop forwarding and stop
 *                  reading (the sender's window closes; the connection
 *                  stays up);
 * - FP_RESET:      forward `after` bytes, then reset both connections
 *                  (SO_LINGER 0 and close: RST to the client and the
 *                  server);
 * - FP_HALF_OPEN:  forward `after` bytes, then shut down that direction
 *                  (FIN to its receiver) and discard the rest of it; the
 *                  other direction keeps flowing;
 * - FP_BLACK_HOLE: accept and read, never connect to the server, never
 *                  answer.
 * The proxy carries whatever runs over TCP (tcp, tls, ws, wss): it never
 * parses the bytes. Otherwise it is faithful: a FIN from one side goes
 * on to the other after the bytes before it, a reset goes on as a reset.
 * Everything runs on the loop's thread; test setup failures assert. */
#ifndef TW_TESTS_SUPPORT_FAULT_PROXY_H
#define TW_TESTS_SUPPORT_FAULT_PROXY_H

#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

enum fp_fault {
	FP_PASS,
	FP_DELAY,
	FP_THROTTLE,
	FP_STALL,
	FP_RESET,
	FP_HALF_OPEN,
	FP_BLACK_HOLE,
};

/* Directions a fault applies to. */
#define FP_UP   1 /* client to server */
#define FP_DOWN 2 /* server to client */
#define FP_BOTH 3

struct fp_opts {
	enum fp_fault fault;
	int dir;           /* FP_UP, FP_DOWN or FP_BOTH; 0 means FP_BOTH */
	uint64_t after;    /* FP_STALL, FP_RESET, FP_HALF_OPEN: bytes of the
			    * direction forwarded first, per connection */
	uint32_t delay_ms; /* FP_DELAY */
	size_t rate;       /* FP_THROTTLE: bytes per second, >= 10 */
};

struct fp_conn;

struct fp {
	struct event_base *base;
	struct evconnlistener *l;
	struct fp_opts o;
	char host[64];     /* where the proxy listens and the server is */
	unsigned port;     /* the proxy's port */
	char addr[80];     /* "tcp://host:port" of the proxy */
	unsigned tport;    /* the server's port */
	size_t accepts;    /* connections accepted */
	size_t live;       /* connections open now (client side) */
	size_t peak;       /* most connections open at once */
	size_t faults;     /* faults injected (once per connection and direction) */
	uint64_t moved[2]; /* bytes forwarded up, down (all connections) */
	struct fp_conn *conns;
	struct ev_token_bucket_cfg *rate; /* FP_THROTTLE */
};

/* Listen on the host of target (a "scheme://host:port" URI with a
 * numeric IPv4 host; the scheme is ignored) on a free port, forwarding
 * to target with the fault in o. */
void fp_start(struct fp *p, struct event_base *base, const char *target, const struct fp_opts *o);
/* Close every connection (plainly) and stop listening. Accepts a
 * zeroed or stopped p. */
void fp_stop(struct fp *p);
/* "scheme://host:port" of the proxy, into buf. */
const char *fp_uri(const struct fp *p, const char *scheme, char *buf, size_t len);
/* Predicate for tu_run_until (arg: the struct fp): no connection open. */
int fp_idle(void *arg);

#endif
