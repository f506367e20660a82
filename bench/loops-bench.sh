#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Aggregate small-RPC round trips against one tw_server with 1 and with 2
# loop threads (tw_context_set_loop_threads), in one run (issue 20). The
# server is bench/loops-bench; the load is bench/rpc-load, a lean epoll
# client in a process of its own: COMMS comms (default 1,000), each
# keeping DEPTH echo calls of 10 bytes in flight, for each DEPTH of
# --depths (default "1 4 16"); then, with --work BYTES (default 16384, about
# 18 us of CPU here; 0 skips it), a server whose echo first hashes BYTES bytes
# with SHA-256 (a handler that works per message, as a scheduler's do),
# at each depth of --work-depths (default "1 16"). Every case runs 1 and 2
# loops in turn, for ROUNDS rounds (default 3), unpinned. The table gives
# the median round of each; "2 / 1", the ratio of those medians; "paired",
# the median of each round's own ratio (its 2-loop run over the 1-loop run
# just before: steadier when other load comes and goes); the CPU per round
# trip of the server (all its threads, /proc/PID/stat) and of the client
# (getrusage); the cores each got (on a shared machine, what the other
# load left them); "srv threads", the cores of each server thread above
# 0.01 core in the median round, busiest first: with 2 loops, two about
# equal numbers say the comms and their handlers spread over both.
#
# What bounds the ratio: on a machine of P CPUs shared by the server and
# its client, with S and C us of CPU per round trip, 1 loop reaches at
# most min(1/S, 1/C, P/(S+C)) round trips per us (its one core, the
# one-threaded client's, all the CPUs) and 2 loops min(1/C, P/(S+C)).
# The "ceiling" column is the second over the first, from the 1-loop S
# and C: on 2 CPUs with C <= S, 2S/(S+C), so 1.7x needs C <= 0.18 S.
#   bench/loops-bench.sh BUILD_DIR [--comms N] [--seconds S] [--rounds R]
#                        [--depths "1 4 16"] [--work BYTES] [--work-depths "1 16"]
# e.g. bench/loops-bench.sh build    (about 4 minutes: 3 rounds x 5 cases x
# 2 servers x (5 s + 1 s warm-up + connecting))
set -euo pipefail
build=${1:?build dir}
shift
comms=1000 seconds=5 rounds=3 depths="1 4 16" work=16384 wdepths="1 16"
while [ $# -gt 0 ]; do
	case $1 in
	--comms) comms=$2; shift 2 ;;
	--seconds) seconds=$2; shift 2 ;;
	--rounds) rounds=$2; shift 2 ;;
	--depths) depths=$2; shift 2 ;;
	--work) work=$2; shift 2 ;;
	--work-depths) wdepths=$2; shift 2 ;;
	*) echo "unknown option $1" >&2; exit 2 ;;
	esac
done
srv=$build/bench/loops-bench
load=$build/bench/rpc-load
[ -x "$srv" ] && [ -x "$load" ] || make -C "$build" -s bench/loops-bench bench/rpc-load
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
addr_of() { for _ in $(seq 200); do a=$(awk '/listening on/ {print $3}' "$1" 2>/dev/null); [ -n "$a" ] && { echo "$a"; return; }; sleep 0.05; done; exit 1; }
median() { [ -s "$1" ] || { echo 0; return; }; sort -n "$1" | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# the server's threads' cores in the median round (by round trips/s)
threads() { [ -s "$1" ] || { echo -; return; }; sort -n "$1" | awk '{ v[NR] = $2 } END { print v[int((NR + 1) / 2)] }'; }

cases=""
for d in $depths; do cases="$cases $d:0"; done
if [ "$work" -gt 0 ]; then for d in $wdepths; do cases="$cases $d:$work"; done; fi
echo "== $comms comms, echo of 10 bytes, ${seconds} s per round, $rounds rounds, $(nproc) CPUs, unpinned; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$rounds"); do
	for c in $cases; do
		d=${c%:*} w=${c#*:}
		last=
		for loops in 1 2; do
			rm -f "$tmp/srv.log" # else addr_of may read the last server's address
			"$srv" server "$loops" "$w" >"$tmp/srv.log" &
			pid=$!
			addr=$(addr_of "$tmp/srv.log")
			k="$d.$w.$loops"
			[ "$w" -gt 0 ] && sed -n 's/^work: \([0-9.]*\) us.*/\1/p' "$tmp/srv.log" >>"$tmp/$k.work"
			if ! line=$("$load" "$addr" "$comms" "$seconds" "$d" "$pid" 2>&1); then
				kill -0 "$pid" 2>/dev/null && alive="still running" || alive="gone"
				kill "$pid" 2>/dev/null || true
				st=0
				wait "$pid" || st=$?
				echo "round $r, work $w B, $loops loop(s), depth $d: FAILED: $line (server $alive, exit status $st)"
				echo "$r" >>"$tmp/$k.failed"
				continue
			fi
			echo "round $r, work $w B, $loops loop(s): $line"
			rate=$(echo "$line" | sed -n 's/.*: \([0-9]*\) round trips\/s.*/\1/p')
			echo "$rate" >>"$tmp/$k.rate"
			# the round's own ratio: its 2-loop run over the 1-loop run just before
			if [ "$loops" = 1 ]; then
				last=$rate
			elif [ -n "$last" ]; then
				awk -v a="$last" -v b="$rate" 'BEGIN { printf "%.2f\n", b / a }' >>"$tmp/$d.$w.pair"
			fi
			echo "$line" | sed -n 's/.*server CPU [0-9.]* cores, \([0-9.]*\) us.*/\1/p' >>"$tmp/$k.s"
			echo "$line" | sed -n 's/.*client CPU [0-9.]* cores, \([0-9.]*\) us.*/\1/p' >>"$tmp/$k.c"
			echo "$line" | sed -n 's/.*server CPU \([0-9.]*\) cores.*/\1/p' >>"$tmp/$k.sc"
			echo "$line" | sed -n 's/.*client CPU \([0-9.]*\) cores.*/\1/p' >>"$tmp/$k.cc"
			echo "$line" | sed -n 's/.*: \([0-9]*\) round trips\/s.*server threads (cores) \([0-9. ]*\)$/\1 \2/p' |
				awk '{ printf "%s %s", $1, $2; for (i = 3; i <= NF; i++) printf "+%s", $i; print "" }' >>"$tmp/$k.thr"
			kill "$pid"
			wait "$pid" || true
		done
	done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "== medians of $rounds rounds; CPU per round trip in us and cores used, server (all its threads) and client"
printf '| %-24s | %5s | %5s | %13s | %6s | %6s | %9s | %9s | %6s | %9s | %9s | %-14s | %7s |\n' handler depth loops \
	"round trips/s" "2 / 1" "paired" "server us" "client us" "C / S" "srv cores" "cli cores" "srv threads" ceiling
printf '|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n' -------------------------- ------: ------: --------------: -------: -------: \
	----------: ----------: -------: ----------: ----------: ---------------- --------:
for c in $cases; do
	d=${c%:*} w=${c#*:}
	h="echo"
	[ "$w" -gt 0 ] && h="sha256 $w B, $(median "$tmp/$d.$w.1.work") us"
	one=$(median "$tmp/$d.$w.1.rate")
	s1=$(median "$tmp/$d.$w.1.s") c1=$(median "$tmp/$d.$w.1.c")
	for loops in 1 2; do
		k="$d.$w.$loops"
		rate=$(median "$tmp/$k.rate") s=$(median "$tmp/$k.s") cl=$(median "$tmp/$k.c")
		if [ "$loops" = 1 ]; then
			ratio="" pair="" ceil=$(awk -v s="$s1" -v c="$c1" -v p="$(nproc)" \
				'function min(x, y) { return x < y ? x : y }
				BEGIN { if (s <= 0 || c <= 0) print "-"; else printf "%.2fx", min(p / (s + c), 1 / c) / min(min(1 / s, 1 / c), p / (s + c)) }')
		else
			ratio=$(awk -v a="$one" -v b="$rate" 'BEGIN { if (a > 0) printf "%.2fx", b / a; else print "-" }') ceil=""
			pair=$(median "$tmp/$d.$w.pair")x
		fi
		printf '| %-24s | %5s | %5s | %13s | %6s | %6s | %9s | %9s | %6s | %9s | %9s | %-14s | %7s |\n' "$h" "$d" \
			"$loops" "$rate" "$ratio" "$pair" "$s" "$cl" "$(awk -v s="$s" -v c="$cl" 'BEGIN { if (s > 0) printf "%.2f", c / s; else print "-" }')" \
			"$(median "$tmp/$k.sc")" "$(median "$tmp/$k.cc")" "$(threads "$tmp/$k.thr")" "$ceil"
	done
done
for f in "$tmp"/*.failed; do
	[ -e "$f" ] || continue
	k=$(basename "$f" .failed)
	echo "FAILED: depth ${k%%.*}, work $(echo "$k" | cut -d. -f2) B, $(echo "$k" | cut -d. -f3) loop(s): rounds $(tr '\n' ' ' <"$f")(not in the medians)"
done
