#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Memory cost of receiving one large out-of-band bytes payload sent by
# Python Dask over tcp (or ws): taskwire's dask-recv beside Dask's own
# receiver, uncompressed and with Python pinned to zstd and lz4.
#   bench/dask-memory.sh BUILD_DIR [MIB] [tcp|ws]
set -euo pipefail
build=${1:?build dir}
mib=${2:-256}
scheme=${3:-tcp}
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT

addr_of() { for _ in $(seq 200); do a=$(awk '/listening on/ {print $3}' "$1"); [ -n "$a" ] && { echo "$a"; return; }; sleep 0.05; done; exit 1; }

run() { # receiver-command label codec kind
	local log=$tmp/recv.log
	: >"$log"
	"$@" >"$log" 2>&1 &
	local pid=$!
	local addr; addr=$(addr_of "$log")
	DASK_DISTRIBUTED__COMM__COMPRESSION=$codec "$py" "$here/dask_peer.py" send "$addr" "$mib" "$kind"
	wait "$pid" || true
	sed "s/^/  [$codec, $kind] /" "$log" | grep -v "listening on" || true
}

echo "== one $mib MiB out-of-band bytes payload from Python over $scheme"
for codec in False zstd lz4; do
	kind=random; [ "$codec" = False ] || kind=compressible
	DASK_DISTRIBUTED__COMM__COMPRESSION=$codec run "$build/bench/dask-recv" "$scheme://127.0.0.1:0"
	DASK_DISTRIBUTED__COMM__COMPRESSION=$codec run "$py" "$here/dask_peer.py" recv "$scheme"
done
