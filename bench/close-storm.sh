#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# close-storm.sh: N comms ending at once beside a canary comm (issue 17),
# over tcp, tls, ws and wss, with two builds' libraries side by side in
# one run (before/after a change).
#
#   bench/close-storm.sh [--modes M] [--rounds R] BUILD [BASE_BUILD] [N...]
#
# BUILD: a build tree (its bench/.libs/handshake-storm is the program;
# `make bench/handshake-storm` makes it); BASE_BUILD: another build tree
# whose .libs/libtaskwire.so the same program runs against next (same
# ABI). N: comms per round (default 500 2000). M: the close modes of
# bench/handshake-storm (default exit,reset,close,free). Prints, per
# transport, N, mode and build, the longest pass of the server's loop
# (loop-thread CPU between 1 ms ticks) and the canary's p50/p99/max while
# the comms ended, with how long the canary's thread and the server's
# loop waited for a CPU (a canary outlier with the server's passes short
# is the machine's). Run it niced on a shared machine and say the load.
set -e
modes=exit,reset,close,free
rounds=1
while [ $# -gt 0 ]; do
	case $1 in
	--modes) modes=$2; shift 2 ;;
	--rounds) rounds=$2; shift 2 ;;
	*) break ;;
	esac
done
build=$(cd "${1:?usage: close-storm.sh [--modes M] [--rounds R] BUILD [BASE_BUILD] [N...]}" && pwd)
shift
builds=$build
if [ $# -gt 0 ] && [ -d "$1" ]; then
	builds="$build $(cd "$1" && pwd)"
	shift
fi
sizes=${*:-500 2000}
prog=$build/bench/.libs/handshake-storm
[ -x "$prog" ] || { echo "close-storm.sh: no $prog (make bench/handshake-storm)" >&2; exit 2; }
certs=$(mktemp -d)
trap 'rm -rf "$certs"' EXIT
"$(dirname "$0")/../scripts/make-test-certs.sh" "$certs" >/dev/null 2>&1
tls="--tls-ca $certs/ca.pem --tls-cert $certs/cert.pem --tls-key $certs/key.pem"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$rounds"); do
	for n in $sizes; do
		for scheme in tcp tls ws wss; do
			for b in $builds; do
				# shellcheck disable=SC2086
				LD_LIBRARY_PATH=$b/.libs timeout 900 "$prog" $tls --clients "$n" \
					--close "$modes" "$scheme" 2>&1 | grep -v ' clients: ' |
					sed "s|^|$(basename "$b"): |" || true
			done
		done
	done
done
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
