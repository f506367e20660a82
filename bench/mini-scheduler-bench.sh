#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# tw-mini-scheduler beside `dask scheduler`: same 4 workers and client
# script, a 512 MiB scatter+gather and a 100,000-key scatter+gather;
# wall time, scheduler CPU (user and sys), peak RSS above idle, payload
# bytes copied (bench/mini_scheduler_bench.py). Run from a scratch
# directory (workers write dask-worker-space there):
#   bench/mini-scheduler-bench.sh [--cc NAME] BUILD_DIR [--mib 512] [--keys 100000]
#       [--only dask|tw] [--profile 'perf record -g -o /tmp/r{round}.data -p {pid}']
#       [--relay BYTES]   (tw-mini-scheduler --relay: splice payloads, tcp)
#       [--repeat N]      (the 512 MiB round N times, same processes)
#       [--keys-repeat N] (the small-key round N times; default: --repeat)
#       [--also LABEL=OTHER_BUILD/examples/tw-mini-scheduler]  (A/B, one run)
#       [--also-dask LABEL:NAME=VALUE,...]  (another dask scheduler with
#                         that environment, e.g. dask4k:NUMPY_MADVISE_HUGEPAGE=0)
# --cc NAME runs everything in a network namespace of its own whose TCP
# congestion control is NAME (unshare -n: needs CAP_SYS_ADMIN; the
# machine's other processes keep theirs), e.g. --cc cubic beside --cc bbr.
# Then, when BUILD_DIR has bench/forward-floor (make bench/forward-floor),
# the CPU floor of the 512 MiB round: 1 GiB read from one loopback socket
# and written to another through one reused buffer (the kernel's copies
# alone), through fresh buffers (page faults and zeroing added, as a
# process pays for memory it has not touched before), through fresh
# buffers in transparent huge pages (as Dask's receive buffers: numpy
# advises MADV_HUGEPAGE for arrays of 4 MiB or more), and socket -> pipe
# -> socket with splice(2) (the relay's floor).
set -e
if [ "$1" = --cc ]; then
	cc=${2:?congestion control}
	shift 2
	exec unshare -n sh -c 'ip link set lo up &&
		sysctl -qw net.ipv4.tcp_congestion_control="$0" &&
		echo "# network namespace of its own, congestion control $(sysctl -n net.ipv4.tcp_congestion_control)" &&
		exec "$@"' "$cc" "$0" "$@"
fi
build=$(cd "${1:?build dir}" && pwd)
shift
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
nice /usr/bin/python3 "$here/mini_scheduler_bench.py" "$build/examples/tw-mini-scheduler" "$@"
if [ -x "$build/bench/forward-floor" ]; then
	nice "$build/bench/forward-floor" --mib 1024
	nice "$build/bench/forward-floor" --mib 1024 --fresh
	nice "$build/bench/forward-floor" --mib 1024 --huge
	nice "$build/bench/forward-floor" --mib 1024 --splice
fi
