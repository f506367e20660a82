#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Run every Check suite of a build under valgrind (no fork, so leaks in
# the tests themselves count too; TW_TEST_QUICK=1 shrinks the 1 GiB
# messages to 64 MiB). Fails on any error or definite leak.
# Suites run one per CPU at a time (TW_VALGRIND_JOBS overrides): valgrind
# runs all of a process's threads on one CPU, so one suite uses one CPU.
# Each suite prints one line with its wall time.
set -e
if [ "$1" = --one ]; then
	t0=$(date +%s)
	if CK_FORK=no TW_TEST_QUICK=1 ./libtool --mode=execute valgrind -q --leak-check=full \
		--errors-for-leak-kinds=definite --error-exitcode=99 "./$2" >"$2.vg.log" 2>&1; then
		echo "valgrind: $2: clean ($(($(date +%s) - t0)) s)"
	else
		echo "valgrind: $2: FAILED ($(($(date +%s) - t0)) s)"
		# Check's verdicts first: a failed assertion (no fork) leaks, and
		# its leak records alone fill the tail.
		grep -E '^[0-9]+%: Checks|:[EF]:' "$2.vg.log" || true
		tail -40 "$2.vg.log"
		exit 1
	fi
	exit 0
fi
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
build=${1:?build dir}
TW_TOP_SRCDIR=$(cd "$(dirname "$0")/.." && pwd)
export TW_TOP_SRCDIR
cd "$build"
# The longest suites first (their order by wall time in CI, session 16), so that
# the last to start are short ones (check_wbudget, 107 s, used to start last).
first="check_tls check_commit check_conformance check_faults check_wbudget check_tcp check_ws check_rate check_rpc check_frame_rx check_close check_relay check_ws_codec check_fuzz_replay check_loops"
suites=$(ls tests/check_* 2>/dev/null | grep -v '\.' | grep -v -e check_install -e check_dask)
# TW_VALGRIND_SUITES="check_tcp check_ws" runs only those.
if [ -n "$TW_VALGRIND_SUITES" ]; then
	suites=$(for s in $TW_VALGRIND_SUITES; do echo "tests/$s"; done)
fi
{
	for s in $first; do
		echo "$suites" | grep -x "tests/$s" || true
	done
	for s in $suites; do
		echo " $first " | grep -q " ${s#tests/} " || echo "$s"
	done
} | xargs -P "${TW_VALGRIND_JOBS:-$(nproc)}" -n 1 "$self" --one || {
	echo "valgrind: some suites failed (above)"
	exit 1
}
