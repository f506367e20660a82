#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Side-by-side echo throughput: taskwire over tcp against raw blocking
# sockets doing the same exchange, in one run, as a ratio; then taskwire
# over tls:// against blocking OpenSSL (bench/tls-echo, TLS 1.3, mutual
# TLS, certificates from scripts/make-test-certs.sh); then taskwire over
# ws:// and wss:// (same client and server, WebSocket framing: 8 MiB
# fragments, client masking) as ratios to its own tcp and tls numbers.
#   bench/echo-bench.sh BUILD_DIR [SIZE] [COUNT]
set -euo pipefail
build=${1:?build dir}
size=${2:-64MiB}
count=${3:-30}
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_line() { for _ in $(seq 100); do [ -s "$1" ] && return 0; sleep 0.05; done; echo "server did not start" >&2; exit 1; }
mbs() { sed -n 's/.* \([0-9.]*\) MB\/s.*/\1/p' "$1" | tail -1; }

"$build/examples/tw-echo-server" tcp://127.0.0.1:0 --quiet >"$tmp/tw.log" &
pids+=($!)
rport=$(free_port)
"$build/bench/raw-echo" --serve "$rport" >"$tmp/raw.log" &
pids+=($!)
wait_line "$tmp/tw.log"
wait_line "$tmp/raw.log"
addr=$(awk '{print $3}' "$tmp/tw.log")

echo "== echo of $count messages of $size, one at a time, over loopback tcp"
for round in 1 2; do
	"$build/examples/tw-echo-client" "$addr" --size "$size" --count "$count" | tail -1 >"$tmp/c1"
	"$build/bench/raw-echo" --connect "$rport" --size "$size" --count "$count" >"$tmp/c2"
	t=$(mbs "$tmp/c1"); r=$(mbs "$tmp/c2"); tcp_mbs=$t
	printf 'round %d: taskwire %8.1f MB/s   raw sockets %8.1f MB/s   ratio %.2f\n' \
		"$round" "$t" "$r" "$(awk -v a="$t" -v b="$r" "BEGIN{print a/b}")"
done

# --- tls round: tw-echo-client/-server over tls:// beside tls-echo ---
src=$(cd "$(dirname "$0")/.." && pwd)
sh "$src/scripts/make-test-certs.sh" "$tmp/certs" >/dev/null
tlsopt=(--tls-ca "$tmp/certs/ca.pem" --tls-cert "$tmp/certs/cert.pem" --tls-key "$tmp/certs/key.pem")
"$build/examples/tw-echo-server" tls://127.0.0.1:0 --quiet "${tlsopt[@]}" >"$tmp/twtls.log" &
pids+=($!)
tport=$(free_port)
"$build/bench/tls-echo" --serve "$tport" "${tlsopt[@]}" >"$tmp/tls.log" &
pids+=($!)
wait_line "$tmp/twtls.log"
wait_line "$tmp/tls.log"
taddr=$(awk '{print $3}' "$tmp/twtls.log")

echo "== echo of $count messages of $size, one at a time, over loopback tls (TLS 1.3, mutual)"
for round in 1 2; do
	"$build/examples/tw-echo-client" "$taddr" --size "$size" --count "$count" "${tlsopt[@]}" |
		tail -1 >"$tmp/c1"
	"$build/bench/tls-echo" --connect "$tport" --size "$size" --count "$count" "${tlsopt[@]}" >"$tmp/c2"
	t=$(mbs "$tmp/c1"); r=$(mbs "$tmp/c2"); tls_mbs=$t
	printf 'round %d: taskwire %8.1f MB/s   blocking OpenSSL %8.1f MB/s   ratio %.2f\n' \
		"$round" "$t" "$r" "$(awk -v a="$t" -v b="$r" "BEGIN{print a/b}")"
done

# --- ws and wss rounds: the same echo over ws:// and wss:// ---
"$build/examples/tw-echo-server" ws://127.0.0.1:0 --quiet >"$tmp/twws.log" &
pids+=($!)
"$build/examples/tw-echo-server" wss://127.0.0.1:0 --quiet "${tlsopt[@]}" >"$tmp/twwss.log" &
pids+=($!)
wait_line "$tmp/twws.log"
wait_line "$tmp/twwss.log"
waddr=$(awk '{print $3}' "$tmp/twws.log")
wsaddr=$(awk '{print $3}' "$tmp/twwss.log")

echo "== echo of $count messages of $size, one at a time, over loopback ws and wss (TLS 1.3, mutual)"
for round in 1 2; do
	"$build/examples/tw-echo-client" "$waddr" --size "$size" --count "$count" | tail -1 >"$tmp/c1"
	"$build/examples/tw-echo-client" "$wsaddr" --size "$size" --count "$count" "${tlsopt[@]}" |
		tail -1 >"$tmp/c2"
	ws_mbs=$(mbs "$tmp/c1"); wss_mbs=$(mbs "$tmp/c2")
	printf 'round %d: taskwire ws %8.1f MB/s   wss %8.1f MB/s\n' "$round" "$ws_mbs" "$wss_mbs"
done
printf 'summary: tcp %.1f  tls %.1f  ws %.1f  wss %.1f MB/s   ws/tcp %.2f   wss/tls %.2f\n' \
	"$tcp_mbs" "$tls_mbs" "$ws_mbs" "$wss_mbs" \
	"$(awk -v a="$ws_mbs" -v b="$tcp_mbs" "BEGIN{print a/b}")" \
	"$(awk -v a="$wss_mbs" -v b="$tls_mbs" "BEGIN{print a/b}")"
