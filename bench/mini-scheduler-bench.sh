#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# tw-mini-scheduler beside `dask scheduler`: same 4 workers and client
# script, a 512 MiB scatter+gather and a 100,000-key scatter+gather;
# wall time, scheduler CPU, peak RSS above idle, payload bytes copied
# (bench/mini_scheduler_bench.py). Run from a scratch directory (workers
# write dask-worker-space there):
#   bench/mini-scheduler-bench.sh BUILD_DIR [--mib 512] [--keys 100000]
#       [--only dask|tw] [--profile 'perf record -g -o /tmp/r{round}.data -p {pid}']
#       [--relay BYTES]   (tw-mini-scheduler --relay: splice payloads, tcp)
#       [--repeat N]      (both rounds N times, same processes)
#       [--also LABEL=OTHER_BUILD/examples/tw-mini-scheduler]  (A/B, one run)
# Then, when BUILD_DIR has bench/forward-floor (make bench/forward-floor),
# the CPU floor of the 512 MiB round: 1 GiB read from one loopback socket
# and written to another through one reused buffer (the kernel's copies
# alone), and the same through fresh buffers (page faults and zeroing
# added, as a process pays for memory it has not touched before), and
# socket -> pipe -> socket with splice(2) (the relay's floor).
set -e
build=${1:?build dir}
shift
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
nice /usr/bin/python3 "$here/mini_scheduler_bench.py" "$build/examples/tw-mini-scheduler" "$@"
if [ -x "$build/bench/forward-floor" ]; then
	nice "$build/bench/forward-floor" --mib 1024
	nice "$build/bench/forward-floor" --mib 1024 --fresh
	nice "$build/bench/forward-floor" --mib 1024 --splice
fi
