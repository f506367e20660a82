# SPDX-License-Identifier: BSD-3-Clause
"""tw-mini-scheduler beside `dask scheduler` (issue 16), in one run.

    python3 mini_scheduler_bench.py TW_MINI_SCHEDULER [--mib 512] [--keys 100000]
        [--only dask|tw] [--profile 'CMD {pid} {round}'] [--relay BYTES]
        [--repeat N] [--also LABEL=TW_MINI_SCHEDULER ...]

For each scheduler in turn: the scheduler, 4 `dask worker` processes
(1 thread, no nanny, no memory limit) and one distributed.Client over tcp;
then two rounds, each a scatter and a gather of the same data through the
scheduler (direct=False, as Client does by default):
  - 16 numpy uint8 arrays of MIB/16 MiB each (random bytes), checked equal;
  - KEYS small ints (hash=False), checked equal.
Per round: wall time, the scheduler's CPU seconds (utime + stime from
/proc), its sleeps (voluntary context switches: the loop's wakeups), its
peak RSS above its idle RSS (VmHWM reset per round through
/proc/PID/clear_refs), and, for tw-mini-scheduler, the payload bytes it
copied (tw_stats, printed when it stops: both rounds together).
--profile runs CMD (split on spaces, {pid} the scheduler's pid, {round}
0 or 1) around each round of tw-mini-scheduler and stops it with SIGINT
at the round's end: e.g. 'perf record -g -o /tmp/r{round}.data -p {pid}'
or 'strace -c -f -o /tmp/s{round}.txt -p {pid}'.
--relay BYTES runs tw-mini-scheduler with --relay BYTES: payload frames of
that size or more go socket to socket with splice(2), never read (tcp).
--repeat N runs both rounds N times with the same scheduler, workers and
client (N rows per round). --also LABEL=BINARY runs another
tw-mini-scheduler build after the first one (A/B in one run: the same
load; each row's CPU over the median of Dask's rows of its round).
--keys 0 skips the small-key round.
Timing, not a test: run it niced on a quiet machine.
"""
import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import time

PY = "/usr/bin/python3"
procs = []


def start(args, **kw):
    p = subprocess.Popen(args, **kw)
    procs.append(p)
    return p


def status_kib(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def reset_peak(pid):
    try:
        with open("/proc/%d/clear_refs" % pid, "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run(kind, tw_binary, mib, nkeys, profile=None, relay=None, repeat=1, label=None):
    import numpy as np
    from distributed import Client

    label = label or kind
    if kind == "tw":
        extra = ["--relay", str(relay)] if relay is not None else []
        sched = start([tw_binary, "tcp://127.0.0.1:0"] + extra, stdout=subprocess.PIPE, text=True)
        addr = sched.stdout.readline().split()[2]
    else:
        port = free_port()
        addr = "tcp://127.0.0.1:%d" % port
        sched = start([PY, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                       "--port", str(port), "--dashboard-address", "127.0.0.1:0", "--no-show"],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers = [start([PY, "-m", "distributed.cli.dask_worker", addr, "--nthreads", "1",
                      "--no-nanny", "--no-dashboard", "--host", "127.0.0.1",
                      "--memory-limit", "0"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(4)]
    client = Client(addr, timeout=60)
    client.wait_for_workers(4)
    rows = []
    rng = np.random.default_rng(16)
    each = (mib << 20) // 16
    arrays = [rng.integers(0, 256, size=each, dtype=np.uint8) for _ in range(16)]
    small = list(range(nkeys))
    rounds = [("%d MiB, 16 arrays" % mib, arrays, {})]
    if nkeys > 0:
        rounds.append(("%d keys" % nkeys, small, {"hash": False}))
    for rnd, (what, data, kw) in enumerate(rounds * repeat):
        time.sleep(1)  # let the previous round's releases settle
        prof = None
        if profile and kind == "tw":
            prof = subprocess.Popen([a.format(pid=sched.pid, round=rnd) for a in profile.split()])
            time.sleep(2)  # attached before the round starts
        idle = status_kib(sched.pid, "VmRSS")
        peak_ok = reset_peak(sched.pid)
        cpu0 = cpu_s(sched.pid)
        sw0 = status_kib(sched.pid, "voluntary_ctxt_switches")
        t0 = time.monotonic()
        futures = client.scatter(data, **kw)
        back = client.gather(futures)
        wall = time.monotonic() - t0
        cpu = cpu_s(sched.pid) - cpu0
        sleeps = status_kib(sched.pid, "voluntary_ctxt_switches") - sw0
        peak = status_kib(sched.pid, "VmHWM")
        if prof is not None:
            prof.send_signal(signal.SIGINT)
            prof.wait()
        if data is arrays:
            assert all(a.tobytes() == b.tobytes() for a, b in zip(arrays, back))
        else:
            assert back == small
        del futures, back
        rows.append([label, what, wall, cpu, sleeps, (peak - idle) / 1024 if peak_ok else None])
        print("# %s %s: wall %.2f s, CPU %.2f s, %d sleeps (load %.1f)" % (
            label, what, wall, cpu, sleeps, os.getloadavg()[0]), flush=True)
    client.close()
    copied = ""
    sched.send_signal(signal.SIGTERM)
    if kind == "tw":
        out = sched.stdout.read()
        m = re.search(r"payload bytes copied (\d+)", out)
        copied = m.group(1) if m else "?"
    try:
        sched.wait(timeout=30)
    except subprocess.TimeoutExpired:  # Dask's, on a loaded machine
        sched.kill()
        sched.wait()
    for w in workers:
        w.kill()
        w.wait()
    for r in rows:
        r.append(copied)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tw_binary")
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--only", choices=("dask", "tw"))
    ap.add_argument("--profile")
    ap.add_argument("--relay", type=int)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--also", action="append", default=[], metavar="LABEL=BINARY")
    a = ap.parse_args()
    rows = []
    runs = [("dask", "dask", None), ("tw", "tw", a.tw_binary)]
    runs += [("tw", x.split("=", 1)[0], x.split("=", 1)[1]) for x in a.also]
    print("# load average %.1f %.1f %.1f" % os.getloadavg(), flush=True)
    for kind, label, binary in runs:
        if a.only in (None, kind):
            rows += run(kind, binary, a.mib, a.keys, a.profile, a.relay, a.repeat, label)
    print("# load average %.1f %.1f %.1f" % os.getloadavg())
    dask = {}  # the median of Dask's rows of each round
    for label, what, wall, cpu, sleeps, peak, copied in rows:
        if label == "dask":
            dask.setdefault(what, []).append(cpu)
    dask = {k: sorted(v)[len(v) // 2] for k, v in dask.items()}
    print("%-8s %-20s %8s %12s %10s %8s %22s %20s" % (
        "sched", "round", "wall s", "sched CPU s", "CPU/dask", "sleeps", "peak RSS > idle MiB",
        "payload B copied"))
    for label, what, wall, cpu, sleeps, peak, copied in rows:
        d = dask.get(what)
        print("%-8s %-20s %8.2f %12.2f %10s %8d %22s %20s" % (
            label, what, wall, cpu, "%.3f" % (cpu / d) if d else "-", sleeps,
            "%.0f" % peak if peak is not None else "?", copied if label != "dask" else "-"))


if __name__ == "__main__":
    try:
        main()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
