#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Pipelined one-way messages over loopback tcp, side by side in one run
# (issue 20): taskwire's raw writes (tw_comm_write per message) and its
# batched sender (tw_batched_send), ZeroMQ PUSH/PULL, NNG push/pull and raw
# TCP (8-byte length, one write per message, two reads), 100 B and 1 KiB,
# with both peers on one CPU (taskset -c 0) and unpinned.
#   bench/oneway-bench.sh BUILD_DIR [--rounds N] [--count N] [--sizes "100 1024"] [--hwm BYTES]
# The peers take turns for N rounds (default 5), so a slow spell of a
# shared machine hits them all; the table gives each peer's median round
# and its ratio to ZeroMQ's median in the same run. NNG sends a twentieth
# of COUNT (it is about 100 times slower). --hwm sets the taskwire sender's
# write high-water mark (default the library's, 64 MiB). Last, tw-fill: how
# many messages of each size the mark lets a peer that does not read hold,
# and what they cost in RSS.
set -euo pipefail
build=${1:?build dir}
shift
rounds=5 count=1000000 sizes="100 1024" hwm=
while [ $# -gt 0 ]; do
	case $1 in
	--rounds) rounds=$2; shift 2 ;;
	--count) count=$2; shift 2 ;;
	--sizes) sizes=$2; shift 2 ;;
	--hwm) hwm=$2; shift 2 ;;
	*) echo "unknown option $1" >&2; exit 2 ;;
	esac
done
ow=$build/bench/oneway
[ -x "$ow" ] || make -C "$build" -s bench/oneway >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
peers="tw-raw tw-batched zmq nng tcp"
median() { sort -n "$1" | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
for pin in "taskset -c 0" ""; do
	tag=${pin:+pinned}; tag=${tag:-unpinned}
	for r in $(seq "$rounds"); do
		for s in $sizes; do
			for p in $peers; do
				n=$count; [ "$p" = nng ] && n=$((count / 20))
				line=$($pin "$ow" "$p" "$s" "$n" $hwm)
				echo "[$tag round $r] $line"
				echo "$line" | sed -n 's/.*: \([0-9]*\) msgs\/s.*/\1/p' >>"$tmp/$tag.$s.$p"
				echo "$line" | sed -n 's/.*recv \([0-9.]*\) us.*/\1/p' >>"$tmp/$tag.$s.$p.rcpu"
				echo "$line" | sed -n 's/.*send \([0-9.]*\) us.*/\1/p' >>"$tmp/$tag.$s.$p.scpu"
				echo "$line" | sed -n 's/.*RSS \([0-9]*\) MB.*/\1/p' >>"$tmp/$tag.$s.$p.rss"
			done
		done
	done
done
echo
echo "== one-way, $rounds rounds, medians (count $count, nng $((count / 20))${hwm:+, taskwire hwm $hwm}); ratios to ZeroMQ within this run"
# msgs per CPU second: 1 / (receiver's + sender's CPU per message), the
# rate both peers would reach sharing one core with nothing else on it;
# it holds up better than msgs/s when other work shares the machine
# (ZeroMQ's and NNG's I/O threads get them a larger share of a busy CPU).
printf '| %-8s | %-5s | %-10s | %12s | %8s | %12s | %12s | %12s | %8s | %9s |\n' cpu size peer "msgs/s" "/ zmq" \
	"recv us/msg" "send us/msg" "msgs/cpu-s" "/ zmq" "send RSS"
printf '|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n' ---------- ------- ------------ -------------: ---------: \
	-------------: -------------: -------------: ---------: ----------:
for tag in pinned unpinned; do
	for s in $sizes; do
		z=$(median "$tmp/$tag.$s.zmq")
		zc=$(awk -v r="$(median "$tmp/$tag.$s.zmq.rcpu")" -v w="$(median "$tmp/$tag.$s.zmq.scpu")" \
			'BEGIN { printf "%.0f", 1e6 / (r + w) }')
		for p in $peers; do
			m=$(median "$tmp/$tag.$s.$p")
			r=$(median "$tmp/$tag.$s.$p.rcpu") w=$(median "$tmp/$tag.$s.$p.scpu")
			c=$(awk -v r="$r" -v w="$w" 'BEGIN { printf "%.0f", 1e6 / (r + w) }')
			printf '| %-8s | %-5s | %-10s | %12s | %7.2fx | %12s | %12s | %12s | %7.2fx | %6s MB |\n' \
				"$tag" "$s" "$p" "$m" "$(awk -v a="$m" -v b="$z" 'BEGIN { print a / b }')" "$r" "$w" \
				"$c" "$(awk -v a="$c" -v b="$zc" 'BEGIN { print a / b }')" "$(median "$tmp/$tag.$s.$p.rss")"
		done
	done
done
echo
echo "== what a queued message costs: taskwire queues messages to a peer that does not read until the write high-water mark (${hwm:-64 MiB}) refuses one"
for s in $sizes; do "$ow" tw-fill "$s" 2 $hwm; done
