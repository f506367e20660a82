#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Small-RPC round trips over loopback tcp, side by side in one run:
# taskwire (tw_pool -> tw-rpc-server), ZeroMQ REQ/REP, NNG req/rep and
# Dask's Python rpc, each echoing a 10-byte payload sequentially, and raw
# epoll: the same 10 bytes with no protocol at all (send, epoll_wait,
# recv per side), the floor any epoll-driven peer stays above.
#   bench/rpc-bench.sh BUILD_DIR [COUNT] [ROUNDS]
# PIN="taskset -c 0" runs every server and client on one CPU (numbers
# that compare across machines of one core's speed); PIN= lets them spread.
# The peers take turns for ROUNDS rounds (default 3), so a slow spell of
# the machine hits them all; ratios are of each peer's median round.
set -euo pipefail
PIN=${PIN-}
build=${1:?build dir}
count=${2:-20000}
rounds=${3:-3}
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
port() { $py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
addr_of() { for _ in $(seq 200); do a=$(awk '/listening on/ {print $3}' "$1"); [ -n "$a" ] && { echo "$a"; return; }; sleep 0.05; done; exit 1; }
median() { sed -n 's/.*: \([0-9]*\) round trips.*/\1/p' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

$PIN "$build/examples/tw-rpc-server" tcp://127.0.0.1:0 >"$tmp/tw.log" &
zp=$(port); $PIN "$build/bench/rpc-peers" zmq-server "$zp" &
np=$(port); $PIN "$build/bench/rpc-peers" nng-server "$np" &
rp=$(port); $PIN "$build/bench/rpc-peers" raw-server "$rp" &
$PIN $py "$here/dask_rpc.py" server >"$tmp/dask.log" 2>&1 &
tw=$(addr_of "$tmp/tw.log"); dask=$(addr_of "$tmp/dask.log")
sleep 0.3
echo "== $count sequential echo calls of 10 bytes over loopback tcp, $rounds rounds${PIN:+ (all peers on one CPU: $PIN)}"
for r in $(seq "$rounds"); do
	$PIN "$build/bench/rpc-client" "$tw" "$count" | tee "$tmp/r.tw.$r"
	$PIN "$build/bench/rpc-peers" zmq-client "$zp" "$count" | tee "$tmp/r.zmq.$r"
	$PIN "$build/bench/rpc-peers" nng-client "$np" "$count" | tee "$tmp/r.nng.$r"
	$PIN $py "$here/dask_rpc.py" client "$dask" $((count / 4)) | tee "$tmp/r.dask.$r"
	$PIN "$build/bench/rpc-peers" raw-client "$rp" "$count" | tee "$tmp/r.raw.$r"
done
awk -v t="$(median "$tmp"/r.tw.*)" -v z="$(median "$tmp"/r.zmq.*)" -v n="$(median "$tmp"/r.nng.*)" \
	-v d="$(median "$tmp"/r.dask.*)" -v w="$(median "$tmp"/r.raw.*)" 'BEGIN { printf "medians (round trips/s): taskwire %d, zeromq %d, nng %d, dask %d, raw epoll %d\ntaskwire / zeromq %.2fx, / nng %.2fx, / dask %.1fx; taskwire at %.0f%% of raw epoll, which is %.1fx dask\n", t, z, n, d, w, t / z, t / n, t / d, 100 * t / w, w / d }'
