#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# ThreadSanitizer run of the suites whose code runs on several threads
# (the offload pool, contexts with their own loop thread or several of
# them): configure a
# separate build with --enable-tsan (in $1, default build-tsan next to
# build/ or $TW_BUILD_DIR), build the suites, run each without forking and
# fail on any TSan report. `make check-tsan` in a build runs this. Other
# suites: TW_TSAN_TESTS='tests/check_offload tests/check_tls'; add
# TW_TEST_QUICK=1 for suites with GiB messages (TSan's shadow memory makes
# check_tls's 3 GiB case run out of memory).
set -e
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${TW_BUILD_DIR:-$top/build}-tsan}
tests=${TW_TSAN_TESTS:-tests/check_offload tests/check_tcp tests/check_loops}
[ -x "$top/configure" ] || "$top/autogen.sh"
mkdir -p "$build"
cd "$build"
[ -f Makefile ] || "$top/configure" --enable-werror --enable-tsan -q
make -s -j"$(nproc)" $tests >/dev/null
TW_TOP_SRCDIR=$top TW_TOP_BUILDDIR=$(pwd)
export TW_TOP_SRCDIR TW_TOP_BUILDDIR
# scripts/tsan.supp: races inside OpenSSL, each with its upstream report.
TSAN_OPTIONS=${TSAN_OPTIONS:-second_deadlock_stack=1 suppressions=$top/scripts/tsan.supp}
export TSAN_OPTIONS
# TSan's fixed memory layout can collide with high ASLR entropy
# ("unexpected memory mapping"): run without address randomization.
norand() {
	if setarch "$(uname -m)" -R true 2>/dev/null; then
		setarch "$(uname -m)" -R "$@"
	else
		"$@"
	fi
}
status=0
for t in $tests; do
	log=$t.tsan.log
	if CK_FORK=no norand "./$t" >"$log" 2>&1 && ! grep -q 'ThreadSanitizer' "$log"; then
		echo "tsan: $t: clean"
	else
		echo "tsan: $t: FAILED (log: $(pwd)/$log)"
		grep -A40 'WARNING: ThreadSanitizer' "$log" | head -120 || tail -40 "$log"
		status=1
	fi
done
exit $status
