#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# make bench: a markdown report with plots (gnuplot, SVG) in OUT_DIR:
# - echo throughput against message size: taskwire over tcp, tls, ws and
#   wss beside raw blocking sockets (bench/raw-echo), ZeroMQ REQ/REP and
#   NNG req/rep (bench/rpc-peers) and Dask's rpc (bench/dask_rpc.py), one
#   message at a time, payload MB/s each way;
# - small-RPC latency (p50, p99 of 10-byte echo calls) from
#   bench/rpc-bench.sh: taskwire, ZeroMQ, NNG, Dask, raw epoll;
# - receiver peak memory against payload size, taskwire's dask-recv
#   beside Dask's receiver (bench/dask-memory.sh, uncompressed).
#   bench/report.sh BUILD_DIR OUT_DIR [--quick]
# --quick (make bench-quick): fewer sizes and bytes, about 3 minutes.
# Timings depend on the machine and its load: the report records both.
set -euo pipefail
build=$(cd "${1:?build dir}" && pwd)
mkdir -p "${2:?out dir}"
out=$(cd "$2" && pwd)
quick=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/.." && pwd)
py=/usr/bin/python3
if [ "$quick" = --quick ]; then
	sizes="1024 65536 1048576 16777216" per_point=$((32 << 20)) max_count=2000
	rpc_count=3000 mem_mib="16 64"
else
	sizes="1024 16384 262144 1048576 4194304 16777216 67108864" per_point=$((256 << 20))
	max_count=20000 rpc_count=20000 mem_mib="16 64 256"
fi
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
port() { $py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
addr_of() { for _ in $(seq 200); do a=$(awk '/listening on/ {print $3}' "$1"); [ -n "$a" ] && { echo "$a"; return; }; sleep 0.05; done; echo "no server in $1" >&2; exit 1; }
mbs() { sed -n 's/.* \([0-9.]*\) MB\/s payload.*/\1/p' | tail -1; }

sh "$src/scripts/make-test-certs.sh" "$tmp/certs" >/dev/null
tlsopt=(--tls-ca "$tmp/certs/ca.pem" --tls-cert "$tmp/certs/cert.pem" --tls-key "$tmp/certs/key.pem")
"$build/examples/tw-echo-server" tcp://127.0.0.1:0 --quiet >"$tmp/tcp.log" & pids+=($!)
"$build/examples/tw-echo-server" tls://127.0.0.1:0 --quiet "${tlsopt[@]}" >"$tmp/tls.log" & pids+=($!)
"$build/examples/tw-echo-server" ws://127.0.0.1:0 --quiet >"$tmp/ws.log" & pids+=($!)
"$build/examples/tw-echo-server" wss://127.0.0.1:0 --quiet "${tlsopt[@]}" >"$tmp/wss.log" & pids+=($!)
rp=$(port); "$build/bench/raw-echo" --serve "$rp" >"$tmp/raw.log" & pids+=($!)
zp=$(port); "$build/bench/rpc-peers" zmq-server "$zp" & pids+=($!)
np=$(port); "$build/bench/rpc-peers" nng-server "$np" & pids+=($!)
$py "$here/dask_rpc.py" server >"$tmp/dask.log" 2>&1 & pids+=($!)
for t in tcp tls ws wss; do eval "addr_$t=\$(addr_of \"$tmp/$t.log\")"; done
addr_of "$tmp/raw.log" >/dev/null
dask=$(addr_of "$tmp/dask.log")
sleep 0.3

echo "== throughput against message size (one message at a time, loopback)"
echo "# size tcp tls ws wss raw zeromq nng dask (MB/s payload each way)" >"$out/throughput.dat"
for size in $sizes; do
	count=$((per_point / size)); [ "$count" -gt "$max_count" ] && count=$max_count
	[ "$count" -lt 10 ] && count=10
	dcount=$((count / 4)); [ "$dcount" -lt 5 ] && dcount=5
	row="$size"
	for t in tcp tls ws wss; do
		eval "a=\$addr_$t"
		opt=(); case $t in tls | wss) opt=("${tlsopt[@]}") ;; esac
		row="$row $("$build/examples/tw-echo-client" "$a" --size "$size" --count "$count" "${opt[@]}" | mbs)"
	done
	row="$row $("$build/bench/raw-echo" --connect "$rp" --size "$size" --count "$count" | mbs)"
	row="$row $("$build/bench/rpc-peers" zmq-client "$zp" "$count" "$size" | mbs)"
	row="$row $("$build/bench/rpc-peers" nng-client "$np" "$count" "$size" | mbs)"
	row="$row $($py "$here/dask_rpc.py" client "$dask" "$dcount" "$size" | mbs)"
	echo "$row" | tee -a "$out/throughput.dat"
done
kill "${pids[@]}" 2>/dev/null || true
wait 2>/dev/null || true
pids=()

echo "== small-RPC latency"
"$here/rpc-bench.sh" "$build" "$rpc_count" 3 | tee "$tmp/rpc.txt"
# Each peer's round with the median p50, as "name p50 p99".
for peer in taskwire "zeromq req/rep" "nng req/rep" "dask rpc" "raw epoll"; do
	grep "^$peer: " "$tmp/rpc.txt" | sed -n 's/.*p50 \([0-9.]*\) us, p99 \([0-9.]*\) us.*/\1 \2/p' |
		sort -n | awk -v n="$peer" '{ l[NR] = $0 } END { if (NR) print "\"" n "\"", l[int((NR + 1) / 2)] }'
done >"$out/latency.dat"
cat "$out/latency.dat"

echo "== receiver peak memory against payload size (from Python Dask, uncompressed)"
echo "# MiB taskwire dask (peak RSS above idle, MiB)" >"$out/memory.dat"
for mib in $mem_mib; do
	"$here/dask-memory.sh" "$build" "$mib" tcp | tee "$tmp/mem.txt"
	tw=$(sed -n 's/.*\[False, random\] taskwire:.*peak RSS above idle \([0-9.]*\) MiB.*/\1/p' "$tmp/mem.txt")
	dk=$(sed -n 's/.*\[False, random\] dask:.*peak RSS above idle \([0-9.]*\) MiB.*/\1/p' "$tmp/mem.txt")
	echo "$mib $tw $dk" | tee -a "$out/memory.dat"
done

gnuplot -e "dir='$out'" "$here/report.gp"

{
	echo "# taskwire benchmark report"
	echo
	echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)),"
	echo "load average at the end $(cut -d' ' -f1-3 /proc/loadavg), taskwire $(git -C "$src" describe --always --dirty 2>/dev/null || echo '?')${quick:+, quick mode}."
	echo "Everything runs on loopback on this one machine; on a shared machine the"
	echo "numbers move with the load, so compare peers within one report."
	echo
	echo "## Throughput against message size"
	echo
	echo "One message at a time (send, wait for the echo), payload MB/s each way."
	echo "taskwire: tw-echo-client against tw-echo-server; raw: blocking sockets"
	echo "with a length prefix (bench/raw-echo); ZeroMQ REQ/REP and NNG req/rep"
	echo "(bench/rpc-peers); Dask: distributed.core.rpc echo calls (bench/dask_rpc.py)."
	echo
	echo "![throughput](throughput.svg)"
	echo
	echo "| size (bytes) | tcp | tls | ws | wss | raw | ZeroMQ | NNG | Dask |"
	echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
	grep -v '^#' "$out/throughput.dat" | awk '{ printf "|"; for (i = 1; i <= NF; i++) printf " %s |", $i; print "" }'
	echo
	echo "## Small-RPC latency"
	echo
	echo "Sequential echo calls of 10 bytes over tcp (bench/rpc-bench.sh, $rpc_count calls"
	echo "a round, 3 rounds; Dask a quarter of them): p50 and p99 of each call's round"
	echo "trip, from each peer's median round."
	echo
	echo "![latency](latency.svg)"
	echo
	echo "| peer | p50 (us) | p99 (us) |"
	echo "|---|---:|---:|"
	awk -F'"' '{ split($3, v, " "); printf "| %s | %s | %s |\n", $2, v[1], v[2] }' "$out/latency.dat"
	echo
	echo "## Receiver peak memory against payload size"
	echo
	echo "One out-of-band bytes payload sent by Python Dask over tcp, uncompressed;"
	echo "peak RSS above idle of the receiver (bench/dask-memory.sh): taskwire's"
	echo "dask-recv beside Dask's own receiver."
	echo
	echo "![memory](memory.svg)"
	echo
	echo "| payload (MiB) | taskwire (MiB) | Dask (MiB) |"
	echo "|---:|---:|---:|"
	grep -v '^#' "$out/memory.dat" | awk '{ printf "| %s | %s | %s |\n", $1, $2, $3 }'
} >"$out/report.md"
echo "report: $out/report.md"
