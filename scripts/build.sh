#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Install missing packages, then configure and build taskwire in build/
# (or $TW_BUILD_DIR). Re-running is cheap. Extra arguments go to configure.
set -e
top=$(cd "$(dirname "$0")/.." && pwd)
build=${TW_BUILD_DIR:-$top/build}
"$top/scripts/install-deps.sh"
[ -x "$top/configure" ] || "$top/autogen.sh"
mkdir -p "$build"
cd "$build"
[ -f Makefile ] || "$top/configure" --enable-werror -q "$@"
make -s -j"$(nproc)" >/dev/null
make -s -j"$(nproc)" bench/raw-echo >/dev/null
