#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# make abi-check: compare the built libtaskwire.so with the stored ABI dump
# of the last release (abidiff, from Debian's abigail-tools). Only the
# public headers' types count (types defined elsewhere are opaque to
# callers). Added functions are compatible and pass; a removed or changed
# function, or a changed public type, fails. abi/taskwire.abignore lists
# the changes we know are compatible (tw_stats growing at its end).
#   scripts/abi-check.sh BUILDDIR BASELINE        check
#   scripts/abi-check.sh --dump BUILDDIR BASELINE  write BASELINE (refresh
#                                                  at a release: docs/versioning.md)
set -e
top=$(cd "$(dirname "$0")/.." && pwd)
dump=
[ "$1" = --dump ] && { dump=1; shift; }
build=${1:?usage: abi-check.sh [--dump] BUILDDIR BASELINE}
base=${2:?usage: abi-check.sh [--dump] BUILDDIR BASELINE}
lib="$build/.libs/libtaskwire.so"
[ -f "$lib" ] || { echo "abi-check: $lib not built (run make)" >&2; exit 1; }
command -v abidiff >/dev/null ||
	{ echo "abi-check: abidiff not found: install the Debian package abigail-tools (scripts/install-deps.sh)" >&2; exit 1; }
if [ -n "$dump" ]; then
	abidw --headers-dir "$top/include/taskwire" --drop-private-types --drop-undefined-syms \
		--short-locs --no-corpus-path --no-comp-dir-path --type-id-style hash \
		--out-file "$base" "$lib"
	echo "abi-check: wrote $base"
	exit 0
fi
report=$(mktemp)
trap 'rm -f "$report"' EXIT
rc=0
abidiff --no-added-syms --suppressions "$top/abi/taskwire.abignore" \
	--headers-dir2 "$top/include/taskwire" --drop-private-types \
	"$base" "$lib" >"$report" 2>&1 || rc=$?
if [ "$rc" = 0 ]; then
	echo "abi-check: compatible with $(basename "$base")"
	exit 0
fi
cat "$report" >&2
# abidiff's exit status is a bit set: 1 error, 2 usage, 4 ABI change,
# 8 incompatible change.
if [ $((rc & 3)) != 0 ]; then
	echo "abi-check: abidiff failed (status $rc)" >&2
else
	echo "abi-check: the ABI changed against $(basename "$base") (abidiff status $rc)." >&2
	echo "abi-check: keep the old signature and layout, or follow docs/versioning.md (new SONAME, new baseline)." >&2
fi
exit 1
