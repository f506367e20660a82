#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# tw-mini-scheduler beside `dask scheduler`: same 4 workers and client
# script, a 512 MiB scatter+gather and a 100,000-key scatter+gather;
# wall time, scheduler CPU, peak RSS above idle, payload bytes copied
# (bench/mini_scheduler_bench.py). Run from a scratch directory (workers
# write dask-worker-space there):
#   bench/mini-scheduler-bench.sh BUILD_DIR [--mib 512] [--keys 100000]
set -e
build=${1:?build dir}
shift
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
nice /usr/bin/python3 "$here/mini_scheduler_bench.py" "$build/examples/tw-mini-scheduler" "$@"
