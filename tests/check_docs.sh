#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Every function the library exports is documented: it has a man page
# (docs/man3 of the build, made by doxygen from the header comments), and
# doxygen did not call it undocumented. Fails naming each function that
# misses one; prints the counts. Skipped when configured without docs.
build=${TW_TOP_BUILDDIR:?}
lib="$build/.libs/libtaskwire.so"
man="$build/docs/man3"
[ -d "$man" ] || { echo "check_docs: no docs/man3 (configured without doxygen): skipped"; exit 77; }
fns=$(nm -D --defined-only "$lib" | awk '$2 == "T" { sub(/@.*/, "", $3); print $3 }' | sort -u)
bad=0
for f in $fns; do
	[ -f "$man/$f.3" ] || { echo "check_docs: $f is exported but has no documentation (no man page $f.3): add a comment above its declaration" >&2; bad=1; }
done
undoc=$(grep ' (function) .* is not documented' "$build/docs/doxygen-warnings.txt")
[ -z "$undoc" ] || { echo "$undoc" >&2; bad=1; }
nfn=$(echo "$fns" | wc -l)
npages=0
for f in $fns; do [ -f "$man/$f.3" ] && npages=$((npages + 1)); done
echo "check_docs: $nfn exported functions, $npages with a man page"
exit $bad
