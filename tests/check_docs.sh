#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Every function the library exports is documented: it has a man page
# (docs/man3 of the build, made by doxygen from the header comments), and
# doxygen did not call it undocumented. Fails naming each function that
# misses one; prints the counts. The man pages are skipped when configured
# without docs; the error lists are checked always.
#
# Error lists (wslay's style): a public function's comment gives its errors
# as "Returns 0, or:" (words may stand between "0" and ", or", and before
# the colon), then one code a line, " *   TW_EXXX  cause" (or
# " *   (any code)  cause"), the cause's further lines indented deeper. No
# prose lists ("Returns 0, TW_ENOMEM or TW_EINVAL"), and every function
# returning int has the list, unless its comment says the int is "not a
# taskwire error code".
src=${TW_TOP_SRCDIR:?}
build=${TW_TOP_BUILDDIR:?}
lib="$build/.libs/libtaskwire.so"
man="$build/docs/man3"
errlists=$(awk '
function bad(msg) { printf "%s:%d: %s\n", FILENAME, FNR, msg; nbad++ }
FNR == 1 { incomment = 0; comment = ""; inlist = 0 }
/^\/\*/ { incomment = 1; comment = ""; inlist = 0 }
incomment {
	comment = comment "\n" $0
	if (inlist) {
		if ($0 ~ /^ \*   (TW_E[A-Z]+|\(any code\)) +[^ ]/) { nitems++ }
		else if (nitems > 0 && $0 ~ /^ \*      +[^ ]/) { }
		else {
			if (nitems == 0)
				bad("\"Returns 0, or:\" with no code under it (one a line: \" *   TW_EXXX  cause\")")
			inlist = 0
		}
	}
	if ($0 ~ /Returns? .*, or[^:]*:[ ]*(\*\/)?$/) { inlist = 1; nitems = 0 }
	else if ($0 ~ /Returns?[^.]*TW_E[A-Z]/ || $0 ~ /Returns as /)
		bad("error list in prose: write \"Returns 0, or:\" and one code a line")
	if ($0 ~ /\*\//) {
		if (inlist && nitems == 0)
			bad("\"Returns 0, or:\" with no code under it")
		incomment = 0; inlist = 0
	}
	next
}
/^int tw_[a-z0-9_]+\(/ {
	name = $0; sub(/^int /, "", name); sub(/\(.*/, "", name)
	if (comment !~ /Returns? [^\n]*, or[^:\n]*:/ && comment !~ /not a taskwire error code/)
		bad(name ": returns int but its comment has no \"Returns 0, or:\" list (or says \"not a taskwire error code\")")
}
END { exit nbad > 0 }
' "$src"/include/taskwire/*.h) || {
	echo "$errlists" >&2
	echo "check_docs: error lists not in the \"Returns 0, or:\" form (see the head of tests/check_docs.sh)" >&2
	exit 1
}
echo "check_docs: every error list in include/taskwire/ is one code a line"
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
