/* SPDX-License-Identifier: BSD-3-Clause */
/* tw-mini-scheduler: a minimal Dask-compatible scheduler on taskwire's
 * public API. Real `dask worker` processes register with it and a real
 * distributed.Client scatters to and gathers from them through it.
 *
 *   tw-mini-scheduler URI [--worker-ttl SECONDS] [--relay BYTES]
 *                     [--memory-limit BYTES] [--receive-budget BYTES]
 *                     [--write-budget BYTES] [TLS options]
 *
 * Prints "listening on URI" first; on SIGINT or SIGTERM it stops and
 * prints the payload bytes it copied (tw_stats) and its peak RSS. */
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/dns.h>
#include <event2/event.h>

#include "examples/common.h"
#include "examples/mini-scheduler/sched.h"

struct sched S;

double now_wall(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

double now_mono(void)
{
	return tw_ex_now();
}

void say(const char *fmt, ...)
{
	double t = now_wall();
	time_t secs = (time_t)t;
	struct tm tm;
	char stamp[32];
	va_list ap;
	gmtime_r(&secs, &tm);
	strftime(stamp, sizeof(stamp), "%H:%M:%S", &tm);
	fprintf(stderr, "%s.%03d ", stamp, (int)((t - (double)secs) * 1000));
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
}

static void on_ttl_tick(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
	workers_check_ttl();
}

static void on_signal(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	event_base_loopbreak(arg);
}

static void usage(FILE *f)
{
	fputs("usage: tw-mini-scheduler URI [--worker-ttl SECONDS] [--relay BYTES]\n"
	      "                         [--memory-limit BYTES] [--receive-budget BYTES]\n"
	      "                         [--write-budget BYTES] [--pause-limit MS] [TLS options]\n"
	      "  A minimal Dask scheduler (no tasks) on URI (tcp://, tls://, ws:// or wss://;\n"
	      "  port 0 picks a free port) for real dask workers and distributed.Client:\n"
	      "  scatter, gather, who_has (docs/mini-scheduler.md). Prints \"listening on\n"
	      "  URI\", then a line per event; SIGINT/SIGTERM stop it and print the payload\n"
	      "  bytes it copied.\n"
	      "  --worker-ttl SECONDS   remove a worker whose heartbeats stop this long\n"
	      "                         (default 300, Dask's distributed.scheduler.worker-ttl)\n"
	      "  --relay BYTES          over tcp, forward payload frames of BYTES or more\n"
	      "                         socket to socket (splice), never reading them\n"
	      "                         (default 65536; 0: off)\n",
	      f);
	fputs(TW_EX_MEMORY_USAGE, f);
	fputs(TW_EX_TLS_USAGE, f);
}

/* The server: Dask's Scheduler handlers and stream handlers that this
 * scheduler has; other ops reply nil (as Dask's Server.handle_comm,
 * which logs "No handler ... found" and writes None), other stream ops
 * are skipped. The ops whose requests hold addresses run through
 * op_resolving (addr.c: their host names are looked up first). */
static int add_ops(void)
{
	static int running_only = 1;
	static struct resolving_op wrapped[16];
	static const struct {
		const char *name;
		tw_op_fn fn;
		void *arg;
		int addresses;
	} ops[] = {
		{"identity", op_identity, NULL, 0},
		{"register-worker", op_register_worker, NULL, 1},
		{"heartbeat_worker", op_heartbeat_worker, NULL, 1},
		{"unregister", op_unregister, NULL, 1},
		{"register-client", op_register_client, NULL, 0},
		{"scatter", op_scatter, NULL, 1},
		{"update_data", op_update_data, NULL, 1},
		{"gather", op_gather, NULL, 0},
		{"who_has", op_who_has, NULL, 0},
		{"ncores", op_ncores, NULL, 1},
		{"ncores_running", op_ncores, &running_only, 1},
	};
	static const struct {
		const char *name;
		tw_stream_fn fn;
	} stream_ops[] = {
		{"worker-status-change", worker_stream_op}, {"add-keys", worker_stream_op},
		{"client-releases-keys", client_stream_op}, {"report-key", client_stream_op},
		{"client-desires-keys", client_stream_op},
	};
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		wrapped[i].fn = ops[i].fn;
		wrapped[i].arg = ops[i].arg;
		if (tw_server_add_op(S.server, ops[i].name,
				     ops[i].addresses ? op_resolving : ops[i].fn,
				     ops[i].addresses ? (void *)&wrapped[i] : ops[i].arg) != 0)
			return -1;
	}
	for (size_t i = 0; i < sizeof(stream_ops) / sizeof(stream_ops[0]); i++)
		if (tw_server_add_stream_op(S.server, stream_ops[i].name, stream_ops[i].fn, NULL) !=
		    0)
			return -1;
	return 0;
}

/* Stop: comms first (their end watches are canceled by the removals),
 * then requests resolving names and scatters waiting for a worker, then
 * every worker and client, whose pending calls fail (their requests'
 * replies are dropped), then the pool. The resolver goes last (main),
 * after one more pass of the loop: evdns reports canceled lookups there. */
static void stop_all(void)
{
	tw_server_free(S.server);
	resolving_stop();
	scatters_stop();
	requesters_stop();
	while (S.workers != NULL)
		worker_remove(S.workers, TW_ECANCELED, "the scheduler stopped", 0);
	while (S.clients != NULL)
		client_remove(S.clients);
	tw_pool_free(S.pool);
	tw_context_free(S.ctx);
	table_fini(&S.keys);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {{"worker-ttl", required_argument, NULL, 't'},
					     {"relay", required_argument, NULL, 'r'},
					     {"help", no_argument, NULL, 'h'},
					     TW_EX_TLS_OPTIONS,
					     TW_EX_MEMORY_OPTIONS,
					     {NULL, 0, NULL, 0}};
	struct tw_ex_tls tls = {0};
	struct tw_ex_memory mem = TW_EX_MEMORY_INIT;
	char bounds[256];
	struct timeval tick = {0, 100 * 1000};
	struct event *ttl, *sigint, *sigterm;
	tw_stats st;
	uint64_t idle_rss;
	int o, rv;
	unsigned long long relay = 65536;
	S.worker_ttl = 300;
	while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		if (o == 't') {
			char *end;
			S.worker_ttl = strtod(optarg, &end);
			if (*end != '\0' || S.worker_ttl <= 0) {
				fprintf(stderr, "bad --worker-ttl: %s\n", optarg);
				return 2;
			}
		} else if (o == 'r') {
			char *end;
			relay = strtoull(optarg, &end, 10);
			if (*end != '\0' || (relay != 0 && relay < 65536)) {
				fprintf(stderr, "bad --relay: %s (0, or 65536 bytes or more)\n",
					optarg);
				return 2;
			}
		} else if (o == 'h') {
			usage(stdout);
			return 0;
		} else if (!tw_ex_memory_option(&mem, o, optarg) &&
			   !tw_ex_tls_option(&tls, o, optarg)) {
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc - 1) {
		usage(stderr);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	if ((S.base = event_base_new()) == NULL || tw_context_new(S.base, &S.ctx) != 0)
		return 1;
	tw_ex_tls_setup(S.ctx, &tls);
	tw_ex_memory_setup(S.ctx, &mem, bounds, sizeof(bounds));
	/* Host names in addresses (addr.c, Dask's coerce_address) and in the
	 * library's connects: libevent's resolver, never blocking the loop. */
	if ((S.dns = evdns_base_new(S.base, EVDNS_BASE_INITIALIZE_NAMESERVERS |
						    EVDNS_BASE_DISABLE_WHEN_INACTIVE)) == NULL ||
	    tw_context_set_dns_base(S.ctx, S.dns) != 0) {
		fputs("tw-mini-scheduler: no resolver (evdns_base_new)\n", stderr);
		return 1;
	}
	/* A Dask peer writes a ws message frame by frame and may run other
	 * work between frames: a busy worker (storing 25,000 keys on a loaded
	 * machine) was seen pausing mid-message for over 10 s. Keep the drip
	 * protection, with Python's pace in mind. */
	tw_context_set_min_receive_rate(S.ctx, TW_DEFAULT_MIN_RECEIVE_RATE, 120000);
	/* Dask's distributed.comm.timeouts.connect (30 s) bounds a connect
	 * and its handshake: a worker busy in Python (freeing 25,000 keys on
	 * a loaded machine) was seen answering a new comm's handshake after
	 * more than the library's 10 s default. */
	tw_context_set_connect_timeout_ms(S.ctx, 30000);
	tw_context_set_handshake_timeout_ms(S.ctx, 30000);
	/* Replies and forwarded scatters are single large messages. */
	tw_context_set_write_hwm_bytes(S.ctx, (size_t)16 << 30);
	/* Payloads the scheduler only forwards go socket to socket (tcp;
	 * include/taskwire/relay.h): scatter's to workers, get_data's to the
	 * client. */
	tw_context_set_relay_bytes(S.ctx, relay);
	if (tw_server_new(S.ctx, &S.server) != 0 || tw_pool_new(S.ctx, &S.pool) != 0 ||
	    add_ops() != 0)
		return 1;
	/* Dask's ConnectionPool closes no idle comm for its age: a worker
	 * busy for a minute (freeing 25,000 keys on a loaded machine) then
	 * gets the next call on its old comm instead of a new comm's
	 * handshake, which it may not answer within the connect timeout. */
	tw_pool_set_idle(S.pool, TW_DEFAULT_POOL_MAX_IDLE, 3600 * 1000);
	if ((rv = tw_server_listen(S.server, argv[optind])) != 0) {
		fprintf(stderr, "listen on %s: %s: %s\n", argv[optind], tw_strerror(rv),
			tw_context_last_error(S.ctx));
		return 1;
	}
	tw_server_address(S.server, 0, S.address, sizeof(S.address));
	S.started = now_wall();
	printf("listening on %s\n", S.address);
	fflush(stdout);
	say("%s\n", bounds);
	idle_rss = tw_ex_rss();
	ttl = event_new(S.base, -1, EV_PERSIST, on_ttl_tick, NULL);
	sigint = evsignal_new(S.base, SIGINT, on_signal, S.base);
	sigterm = evsignal_new(S.base, SIGTERM, on_signal, S.base);
	if (ttl == NULL || sigint == NULL || sigterm == NULL || event_add(ttl, &tick) != 0 ||
	    event_add(sigint, NULL) != 0 || event_add(sigterm, NULL) != 0)
		return 1;
	event_base_dispatch(S.base);
	tw_stats_global(&st, sizeof(st));
	printf("stopped: payload bytes copied %llu (merges copied %llu, zero-copy %llu); "
	       "peak RSS %llu MiB above idle\n",
	       (unsigned long long)st.payload_bytes_copied, (unsigned long long)st.merges_copied,
	       (unsigned long long)st.merges_zero_copy,
	       (unsigned long long)((tw_ex_peak_rss() - idle_rss) >> 20));
	fflush(stdout);
	stop_all();
	event_free(ttl);
	event_free(sigint);
	event_free(sigterm);
	event_base_loop(S.base, EVLOOP_NONBLOCK); /* evdns reports canceled lookups */
	evdns_base_free(S.dns, 0);
	event_base_free(S.base);
	return 0;
}
