#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Quick start, part 1: install what is missing, build, and run the echo
# demo: a server and a client over tcp on 127.0.0.1, printing what was
# exchanged and the throughput.
set -e
top=$(cd "$(dirname "$0")/.." && pwd)
build=${TW_BUILD_DIR:-$top/build}
"$top/scripts/build.sh"
log=$(mktemp)
"$build/examples/tw-echo-server" tcp://127.0.0.1:0 >"$log" &
server=$!
trap 'kill $server 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 50); do [ -s "$log" ] && break; sleep 0.1; done
addr=$(awk '/listening on/ {print $3}' "$log")
echo "server: listening on $addr"
echo "client: 1,000 small messages, then 20 messages of 3 frames of 16 MiB"
"$build/examples/tw-echo-client" "$addr" --size 100 --frames 10 --count 1000
"$build/examples/tw-echo-client" "$addr" --size 16MiB --frames 3 --count 20
sleep 0.3
echo "server said:"
sed 's/^/  /' "$log"
