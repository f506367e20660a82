#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Long fuzzing runs, one target at a time; never part of `make check` or CI
# (those replay the corpora only). docs/fuzzing.md has the results table.
#
#   scripts/fuzz-long.sh [TARGET[=SECONDS]...]   (default: every target below)
#
# For each target: build it with clang (--enable-fuzzers, ASan + UBSan) in
# $TW_FUZZ_BUILD (default build-fuzz), run it niced, one process (no -jobs),
# until TW_FUZZ_RUNS executions (default 10,000,000) or TW_FUZZ_SECONDS
# (default 1800) pass, whichever comes first, starting from the replayed
# corpus tests/fuzz/corpus/<dir>; new inputs go to $out/<target>/new. Then
# -merge=1 adds to the replayed corpus only the new inputs that add
# coverage (TW_FUZZ_MERGE=0 leaves the corpus alone). Then coverage:
# the same target built with clang source-based coverage
# (-fprofile-instr-generate -fcoverage-mapping) in $TW_FUZZ_COV_BUILD runs
# every corpus file once, and llvm-profdata/llvm-cov (Debian's llvm
# matching clang) report line, region and branch coverage of the library
# files the target links. A crash stops that target with libFuzzer's
# crash-* file in $out/<target>/; replay it with the check_*fuzz_replay
# program named in tests/Makefile.inc, fix, and copy it into the corpus.
#
# Prints one summary line per target and appends it to $out/summary.txt:
#   target execs seconds edges (libFuzzer's cov / PCs instrumented), line,
#   region and branch coverage of every library file linked, crash (1: a
#   crash or hang stopped it), corpus files before->after the merge; then
#   line and branch coverage of the decoder files the target is about.
set -e
top=$(cd "$(dirname "$0")/.." && pwd)
build=${TW_FUZZ_BUILD:-$top/build-fuzz}
covbuild=${TW_FUZZ_COV_BUILD:-$top/build-fuzz-cov}
out=${TW_FUZZ_OUT:-$top/build-fuzz/fuzz-long}
runs=${TW_FUZZ_RUNS:-10000000}
secs=${TW_FUZZ_SECONDS:-1800}
merge=${TW_FUZZ_MERGE:-1}

# target:corpus dir:max_len
all="stream:stream:65536 decode:decode:65536 ws_codec:ws_codec:65536
ws_upgrade:ws_upgrade:16384 handshake:handshake:16384 server:server:16384
stream_dispatch:stream_dispatch:16384"

# The decoder files each target is about (its own line in the summary:
# the whole report also counts support code the target only passes through).
focus() {
	case $1 in
	stream) echo "src/transport/frame_rx.c src/transport/stream_codec.c" ;;
	decode) echo "src/protocol/decode.c src/protocol/compress.c src/protocol/mpcheck.c src/protocol/placeholder.c src/protocol/merge.c" ;;
	ws_codec) echo "src/transport/ws_codec.c" ;;
	ws_upgrade) echo "src/transport/ws_upgrade.c" ;;
	handshake) echo "src/protocol/handshake.c" ;;
	server | stream_dispatch) echo "src/protocol/server.c src/protocol/optable.c src/protocol/delivery.c" ;;
	esac
}

# Lines and branches covered in the files named, from llvm-cov report's
# rows: "covered/total lines (x%) covered/total branches (y%)". A report
# of one file names it without its folder.
focus_cov() {
	awk -v files=" $2 " '
		index(files, " " $1 " ") || index(files, "/" $1 " ") {
			l += $8; lm += $9; b += $11; bm += $12
		}
		END { printf "%d/%d lines (%.1f%%) %d/%d branches (%.1f%%)", l - lm, l,
			l ? 100 * (l - lm) / l : 0, b - bm, b, b ? 100 * (b - bm) / b : 0 }' "$1"
}

configure() {
	mkdir -p "$1"
	[ -f "$1/Makefile" ] && return 0
	(cd "$1" && CC=clang CFLAGS="$2" "$top/configure" -q --enable-fuzzers)
}

[ -x "$top/configure" ] || "$top/autogen.sh"
configure "$build" "-O1 -g"
configure "$covbuild" "-O1 -g -fprofile-instr-generate -fcoverage-mapping"
mkdir -p "$out"

one() {
	name=$1 dir=$2 maxlen=$3 tsecs=$4
	bin=tests/fuzz/fuzz_$name
	corpus=$top/tests/fuzz/corpus/$dir
	w=$out/$name
	mkdir -p "$w/new" "$corpus"
	make -s -C "$build" -j2 "$bin" >/dev/null
	make -s -C "$covbuild" -j2 "$bin" >/dev/null
	before=$(ls "$corpus" | wc -l)
	crash=0
	start=$(date +%s)
	(cd "$w" && nice -n 19 "$build/$bin" -runs="$runs" \
		-max_total_time="$tsecs" -max_len="$maxlen" -timeout=60 -print_final_stats=1 \
		-artifact_prefix="$w/" "$w/new" "$corpus" >"$w/run.log" 2>&1) || crash=1
	end=$(date +%s)
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$w/run.log" | tail -1)
	edges=$(grep -E '^#[0-9]+.*cov: ' "$w/run.log" | tail -1 | sed 's/.*cov: \([0-9]*\).*/\1/')
	pcs=$(sed -n 's/.*PC tables (\([0-9]*\) PCs).*/\1/p' "$w/run.log" | head -1)
	if [ "$merge" = 1 ] && [ "$crash" = 0 ]; then
		nice -n 19 "$build/$bin" -merge=1 -max_len="$maxlen" "$corpus" "$w/new" \
			>"$w/merge.log" 2>&1
	fi
	after=$(ls "$corpus" | wc -l)
	# coverage over the (merged) corpus, library sources only
	rm -f "$w"/cov-*.profraw
	(cd "$w" && LLVM_PROFILE_FILE="$w/cov-%p.profraw" nice -n 19 \
		"$covbuild/$bin" -runs=0 "$corpus" >"$w/cov.log" 2>&1) || true
	llvm-profdata merge -sparse "$w"/cov-*.profraw -o "$w/cov.profdata"
	llvm-cov report "$covbuild/$bin" -instr-profile="$w/cov.profdata" \
		-ignore-filename-regex='tests/|/usr/' >"$w/cov.txt"
	tot=$(grep '^TOTAL' "$w/cov.txt")
	# TOTAL regions missed % functions missed % lines missed % branches missed %
	regions=$(echo "$tot" | awk '{print $4}')
	lines=$(echo "$tot" | awk '{print $10}')
	branches=$(echo "$tot" | awk '{print $13}')
	line="$name execs=$execs seconds=$((end - start)) edges=$edges/$pcs lines=$lines"
	line="$line regions=$regions branches=$branches crash=$crash corpus=$before->$after"
	line="$line | $(focus "$name"): $(focus_cov "$w/cov.txt" "$(focus "$name")")"
	echo "$line" | tee -a "$out/summary.txt"
}

targets=${*:-$(echo "$all" | sed 's/:.*//')}
for arg in $targets; do
	t=${arg%%=*}
	s=$secs
	[ "$t" = "$arg" ] || s=${arg#*=}
	spec=$(echo "$all" | tr ' ' '\n' | grep "^$t:") || {
		echo "fuzz-long.sh: unknown target $t" >&2
		exit 1
	}
	one $(echo "$spec" | tr ':' ' ') "$s"
done
