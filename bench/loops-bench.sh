#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Aggregate small-RPC round trips against one tw_server with 1 and with 2
# loop threads (tw_context_set_loop_threads), in one run: COMMS comms
# (default 1,000) each doing echo calls of 10 bytes (DEPTH in flight per
# comm, default 1) from bench/loops-bench's raw epoll client, in a process
# of its own. The two servers take turns for ROUNDS rounds (default 3);
# the ratio is of their median rounds. Also printed: the CPU the server
# used (cores) and round trips per server CPU-second, which says whether
# a second loop is starved by other load on the machine.
#   bench/loops-bench.sh BUILD_DIR [COMMS] [SECONDS] [ROUNDS] [DEPTH]
# e.g. bench/loops-bench.sh build    (about 40 s: 3 rounds x 2 servers x 5 s)
set -euo pipefail
build=${1:?build dir}
comms=${2:-1000}
seconds=${3:-5}
rounds=${4:-3}
depth=${5:-1}
bin=$build/bench/loops-bench
[ -x "$bin" ] || make -C "$build" -s bench/loops-bench
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
addr_of() { for _ in $(seq 200); do a=$(awk '/listening on/ {print $3}' "$1"); [ -n "$a" ] && { echo "$a"; return; }; sleep 0.05; done; exit 1; }
median() { sed -n 's/.*: \([0-9]*\) round trips\/s.*/\1/p' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

echo "== $comms comms, echo of 10 bytes, $depth in flight each, ${seconds} s per round, $rounds rounds ($(nproc) CPUs)"
for r in $(seq "$rounds"); do
	for loops in 1 2; do
		"$bin" server "$loops" >"$tmp/srv.log" &
		pid=$!
		addr=$(addr_of "$tmp/srv.log")
		printf 'round %d, %d loop thread(s): ' "$r" "$loops"
		"$bin" client "$addr" "$comms" "$seconds" "$depth" "$pid" | tee "$tmp/r.$loops.$r"
		kill "$pid"
		wait "$pid" || true
	done
done
one=$(median "$tmp"/r.1.*)
two=$(median "$tmp"/r.2.*)
echo "median: 1 loop $one round trips/s, 2 loops $two round trips/s, ratio $(awk -v a="$one" -v b="$two" 'BEGIN { printf "%.2f", b / a }')x"
