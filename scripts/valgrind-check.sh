#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Run every Check suite of a build under valgrind (no fork, so leaks in
# the tests themselves count too; TW_TEST_QUICK=1 shrinks the 1 GiB
# messages to 64 MiB). Fails on any error or definite leak.
set -e
build=${1:?build dir}
TW_TOP_SRCDIR=$(cd "$(dirname "$0")/.." && pwd)
export TW_TOP_SRCDIR
cd "$build"
status=0
for t in $(ls tests/check_* 2>/dev/null | grep -v '\.' | grep -v -e check_install -e check_dask); do
	if CK_FORK=no TW_TEST_QUICK=1 ./libtool --mode=execute valgrind -q --leak-check=full \
		--errors-for-leak-kinds=definite --error-exitcode=99 "./$t" >"$t.vg.log" 2>&1; then
		echo "valgrind: $t: clean"
	else
		echo "valgrind: $t: FAILED"; tail -40 "$t.vg.log"; status=1
	fi
done
exit $status
