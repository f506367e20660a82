#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Quick start, part 2: the whole test suite. Installs what is missing,
# builds with -Werror, checks the style (`make format-check`: library,
# examples, benches; SPDX lines), checks the ABI (`make abi-check`), runs
# `make check`, runs the transport suites between two network namespaces
# (`make check-netns`; skipped when not root), runs the suites under
# valgrind, builds again with AddressSanitizer and UndefinedBehaviorSanitizer
# and runs `make check` there, runs the multi-threaded suites (offload, tcp)
# under ThreadSanitizer, builds the libFuzzer targets with clang, then
# `make distcheck`. Fails on the first failing step.
set -e
top=$(cd "$(dirname "$0")/.." && pwd)
build=${TW_BUILD_DIR:-$top/build}
t0=$(date +%s)
t_step=
# Each step's heading; the step before it gets its wall time.
step() {
	now=$(date +%s)
	[ -z "$t_step" ] || printf '(%s s)\n' $((now - t_step))
	t_step=$now
	printf '\n== %s\n' "$*"
}

step "build ($build)"
"$top/scripts/build.sh"
cd "$build"

step "make format-check (clang-format)"
make format-check

step "make abi-check (abidiff against the last release's ABI)"
make abi-check

step "make check"
make -j"$(nproc)" check || { cat test-suite.log >&2; exit 1; }

step "transport suites across network namespaces (veth, MTU 1500)"
make check-netns

step "suites under valgrind"
"$top/scripts/valgrind-check.sh" "$build"

step "make check with ASan + UBSan"
TW_BUILD_DIR="$build-asan" "$top/scripts/build.sh" --enable-sanitizers
cd "$build-asan"
ASAN_OPTIONS=detect_leaks=1 make -j"$(nproc)" check || { cat test-suite.log >&2; exit 1; }

step "offload and tcp suites under ThreadSanitizer"
TW_TEST_QUICK=1 "$top/scripts/tsan-check.sh" "$build-tsan"

step "libFuzzer targets build (clang)"
TW_BUILD_DIR="$build-fuzz" CC=clang "$top/scripts/build.sh" --enable-fuzzers
echo "fuzzers: built in $build-fuzz/tests/fuzz (corpora replay in make check)"

# The tarball is built, configured out of tree, built, checked, installed
# and uninstalled; distcheck-hook (Makefile.am) checks that every tracked
# file is in it. Its log is kept (build/distcheck.log) and its tail shown
# when it fails.
step "make distcheck"
cd "$build"
make -j"$(nproc)" distcheck DISTCHECK_CONFIGURE_FLAGS=--enable-werror >distcheck.log 2>&1 ||
	{ tail -60 distcheck.log >&2; exit 1; }
grep -h '^distcheck: ' distcheck.log || true
echo "distcheck: ok"
printf '(%s s)\n' $(($(date +%s) - t_step))
printf '\ncheck.sh: all steps passed in %s s (format-check, abi-check, make check, netns, valgrind, ASan+UBSan, TSan, fuzzer build, distcheck)\n' $(($(date +%s) - t0))
