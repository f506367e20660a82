#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Side-by-side echo throughput: taskwire over tcp against raw blocking
# sockets doing the same exchange, in one run, as a ratio; then taskwire
# over tls:// against blocking OpenSSL (bench/tls-echo, TLS 1.3, mutual
# TLS, certificates from scripts/make-test-certs.sh); then taskwire over
# ws:// and wss:// (same client and server, WebSocket framing: 8 MiB
# fragments, client masking) as ratios to its own tcp and tls numbers.
# Each round runs all six one after the other, so the ratios compare runs
# seconds apart (the machine may be shared); the summary gives each
# ratio's median over the rounds, and its lowest and highest. Beside the
# throughput ratio, the CPU ratio: CPU seconds (user + system, client and
# server together) the baseline took over those this one took for the
# same bytes, which a machine shared with other work disturbs less. Each
# round ends with the 1-minute load average (above 2, the 2-CPU VM is
# shared and the throughput ratios are mostly noise).
# With ECHO_BASE set to another build directory, each round also runs that
# build's ws and wss client and server (before or after this build's, in
# turn) and gives their ratios to this build's tcp and tls: a change to
# the ws path compared before and after within one run.
#   [ECHO_BASE=OTHER_BUILD] bench/echo-bench.sh BUILD_DIR [SIZE] [COUNT] [ROUNDS]
set -euo pipefail
build=${1:?build dir}
size=${2:-64MiB}
count=${3:-30}
rounds=${4:-5}
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_line() { for _ in $(seq 100); do [ -s "$1" ] && return 0; sleep 0.05; done; echo "server did not start" >&2; exit 1; }
mbs() { sed -n 's/.* \([0-9.]*\) MB\/s.*/\1/p' "$1" | tail -1; }

"$build/examples/tw-echo-server" tcp://127.0.0.1:0 --quiet >"$tmp/tw.log" &
pids+=($!)
tw_pid=$!
rport=$(free_port)
"$build/bench/raw-echo" --serve "$rport" >"$tmp/raw.log" &
pids+=($!)
raw_pid=$!
wait_line "$tmp/tw.log"
wait_line "$tmp/raw.log"
addr=$(awk '{print $3}' "$tmp/tw.log")

# tw-echo-server over tls://, ws://, wss:// beside tls-echo (blocking OpenSSL)
src=$(cd "$(dirname "$0")/.." && pwd)
sh "$src/scripts/make-test-certs.sh" "$tmp/certs" >/dev/null
tlsopt=(--tls-ca "$tmp/certs/ca.pem" --tls-cert "$tmp/certs/cert.pem" --tls-key "$tmp/certs/key.pem")
"$build/examples/tw-echo-server" tls://127.0.0.1:0 --quiet "${tlsopt[@]}" >"$tmp/twtls.log" &
pids+=($!)
twtls_pid=$!
tport=$(free_port)
"$build/bench/tls-echo" --serve "$tport" "${tlsopt[@]}" >"$tmp/tls.log" &
pids+=($!)
tls_pid=$!
wait_line "$tmp/twtls.log"
wait_line "$tmp/tls.log"
taddr=$(awk '{print $3}' "$tmp/twtls.log")

# start_ws BUILD LOG: a ws and a wss tw-echo-server of BUILD; sets the
# globals ws_pid wss_pid waddr wsaddr (logs $tmp/LOG-ws.log, LOG-wss.log)
start_ws() {
	"$1/examples/tw-echo-server" ws://127.0.0.1:0 --quiet >"$tmp/$2-ws.log" &
	pids+=($!)
	ws_pid=$!
	"$1/examples/tw-echo-server" wss://127.0.0.1:0 --quiet "${tlsopt[@]}" >"$tmp/$2-wss.log" &
	pids+=($!)
	wss_pid=$!
	wait_line "$tmp/$2-ws.log"
	wait_line "$tmp/$2-wss.log"
	waddr=$(awk '{print $3}' "$tmp/$2-ws.log")
	wsaddr=$(awk '{print $3}' "$tmp/$2-wss.log")
}
base=${ECHO_BASE:-}
if [ -n "$base" ]; then
	start_ws "$base" base
	bws_pid=$ws_pid bwss_pid=$wss_pid bwaddr=$waddr bwsaddr=$wsaddr
fi
start_ws "$build" tw


ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f", a/b}'; }
# median, lowest and highest of the numbers on stdin
stats() { sort -g | awk '{v[NR]=$1} END{m=(NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2; printf "median %.2f (%.2f-%.2f)", m, v[1], v[NR]}'; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# run OUT SERVER_PID CLIENT...: the client's last line to OUT, and the CPU
# seconds of client and server together to OUT.cpu
run() {
	local out=$1 spid=$2 t0 t1 hz
	shift 2
	hz=$(getconf CLK_TCK)
	t0=$(ticks "$spid")
	{ TIMEFORMAT='%U %S'; time "$@" | tail -1 >"$out"; } 2>"$out.time"
	t1=$(ticks "$spid")
	awk -v a="$t0" -v b="$t1" -v hz="$hz" '{printf "%.3f\n", $1 + $2 + (b - a) / hz}' "$out.time" >"$out.cpu"
}
echo "== echo of $count messages of $size, one at a time, over loopback; $rounds rounds"
echo "   MB/s: taskwire tcp, raw sockets, taskwire tls, blocking OpenSSL (TLS 1.3, mutual), taskwire ws, wss"
echo "   ratios: throughput (CPU seconds of the baseline / this one's)"
: >"$tmp/r"
for round in $(seq "$rounds"); do
	run "$tmp/c1" "$tw_pid" "$build/examples/tw-echo-client" "$addr" --size "$size" --count "$count"
	run "$tmp/c2" "$raw_pid" "$build/bench/raw-echo" --connect "$rport" --size "$size" --count "$count"
	run "$tmp/c3" "$twtls_pid" "$build/examples/tw-echo-client" "$taddr" --size "$size" --count "$count" \
		"${tlsopt[@]}"
	run "$tmp/c4" "$tls_pid" "$build/bench/tls-echo" --connect "$tport" --size "$size" --count "$count" \
		"${tlsopt[@]}"
	# ECHO_BASE's ws and wss go first in even rounds, after this build's in odd ones
	for i in $(if [ -n "$base" ] && [ $((round % 2)) = 0 ]; then echo 7 5; else echo 5 7; fi); do
		[ "$i" = 7 ] && [ -z "$base" ] && continue
		if [ "$i" = 5 ]; then
			b=$build wp=$ws_pid wa=$waddr sp=$wss_pid sa=$wsaddr
		else
			b=$base wp=$bws_pid wa=$bwaddr sp=$bwss_pid sa=$bwsaddr
		fi
		run "$tmp/c$i" "$wp" "$b/examples/tw-echo-client" "$wa" --size "$size" --count "$count"
		run "$tmp/c$((i + 1))" "$sp" "$b/examples/tw-echo-client" "$sa" --size "$size" \
			--count "$count" "${tlsopt[@]}"
	done
	for i in 1 2 3 4 5 6; do
		read -r "mb$i" < <(mbs "$tmp/c$i")
		read -r "cpu$i" <"$tmp/c$i.cpu"
	done
	# throughput ratios, then CPU ratios: tcp/raw tls/openssl ws/tcp wss/tls
	echo "$(ratio "$mb1" "$mb2") $(ratio "$mb3" "$mb4") $(ratio "$mb5" "$mb1") $(ratio "$mb6" "$mb3")" \
		"$(ratio "$cpu2" "$cpu1") $(ratio "$cpu4" "$cpu3") $(ratio "$cpu1" "$cpu5") $(ratio "$cpu3" "$cpu6")" \
		>>"$tmp/r"
	read -r a b c d e f g h < <(tail -1 "$tmp/r")
	printf 'round %d: tcp %7.1f raw %7.1f | tls %7.1f openssl %7.1f | ws %7.1f wss %7.1f | ' \
		"$round" "$mb1" "$mb2" "$mb3" "$mb4" "$mb5" "$mb6"
	printf 'tcp/raw %.2f (%.2f) tls/openssl %.2f (%.2f) ws/tcp %.2f (%.2f) wss/tls %.2f (%.2f) | ' \
		"$a" "$e" "$b" "$f" "$c" "$g" "$d" "$h"
	if [ -n "$base" ]; then
		for i in 7 8; do
			read -r "mb$i" < <(mbs "$tmp/c$i")
			read -r "cpu$i" <"$tmp/c$i.cpu"
		done
		echo "$(ratio "$mb7" "$mb1") $(ratio "$mb8" "$mb3") $(ratio "$cpu1" "$cpu7") $(ratio "$cpu3" "$cpu8")" \
			>>"$tmp/rb"
		read -r a b c d < <(tail -1 "$tmp/rb")
		printf 'ECHO_BASE: ws %.1f wss %.1f ws/tcp %.2f (%.2f) wss/tls %.2f (%.2f) | ' \
			"$mb7" "$mb8" "$a" "$c" "$b" "$d"
	fi
	echo "load $(cut -d' ' -f1 /proc/loadavg)"
done
echo "summary over $rounds rounds, throughput ratio | CPU ratio (load average now: $(cut -d' ' -f1-3 /proc/loadavg)):"
for k in "1 tcp/raw" "2 tls/openssl" "3 ws/tcp" "4 wss/tls"; do
	set -- $k
	printf '  %-12s %s | %s\n' "$2" "$(awk -v i="$1" '{print $i}' "$tmp/r" | stats)" \
		"$(awk -v i="$(($1 + 4))" '{print $i}' "$tmp/r" | stats)"
done
[ -z "$base" ] && exit 0
for k in "1 ws/tcp" "2 wss/tls"; do
	set -- $k
	printf '  %-12s %s | %s\n' "base $2" "$(awk -v i="$1" '{print $i}' "$tmp/rb" | stats)" \
		"$(awk -v i="$(($1 + 2))" '{print $i}' "$tmp/rb" | stats)"
done
