#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# What an idle comm costs (issue 20): COUNT comms over tcp, tls, ws and
# wss (mutual TLS 1.3, certificates from scripts/make-test-certs.sh) to a
# server in its own process on 127.0.0.1, one small echo each, then idle;
# RSS and malloc heap per idle comm on the server and on the client side,
# and the time to connect them. ROUNDS rounds of the four.
#   bench/idle-bench.sh BUILD_DIR [COUNT] [ROUNDS]
set -euo pipefail
build=${1:?build dir}
count=${2:-5000}
rounds=${3:-1}
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sh "$src/scripts/make-test-certs.sh" "$tmp/certs" >/dev/null
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
echo "== $count idle comms to one server over loopback (fds: $(ulimit -n))"
for round in $(seq "$rounds"); do
	echo "round $round"
	"$build/bench/idle-bench" --count "$count" --tls-ca "$tmp/certs/ca.pem" \
		--tls-cert "$tmp/certs/cert.pem" --tls-key "$tmp/certs/key.pem" tcp tls ws wss
done
