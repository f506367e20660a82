# SPDX-License-Identifier: BSD-3-Clause
# Plots of bench/report.sh: gnuplot -e "dir='OUT'" bench/report.gp
set terminal svg size 760,440 dynamic font "sans,12"
set key outside right
set grid

set output dir.'/throughput.svg'
set title "Echo throughput against message size (loopback, one at a time)"
set logscale xy
set xlabel "message size (bytes)"
set ylabel "MB/s payload each way"
set format x "%.0s%cB"
plot for [c=2:9] dir.'/throughput.dat' using 1:c with linespoints lw 2 \
	title word("taskwire-tcp taskwire-tls taskwire-ws taskwire-wss raw-sockets ZeroMQ NNG Dask", c-1)

set output dir.'/latency.svg'
set title "Small-RPC round trip (10 bytes over tcp)"
unset logscale
set logscale y
set format x "%g"
set xlabel ""
set ylabel "microseconds"
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set xtics nomirror
plot dir.'/latency.dat' using 2:xtic(1) title "p50", '' using 3 title "p99"

set output dir.'/memory.svg'
set title "Receiver peak memory against payload size (from Python Dask)"
unset logscale
set style data linespoints
set xlabel "payload (MiB)"
set ylabel "peak RSS above idle (MiB)"
set xtics auto
plot dir.'/memory.dat' using 1:2 lw 2 title "taskwire", '' using 1:3 lw 2 title "Dask", \
	'' using 1:1 lw 1 dt 2 title "1x payload"
