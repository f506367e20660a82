# SPDX-License-Identifier: BSD-3-Clause
"""tw-mini-scheduler beside `dask scheduler` (issue 16), in one run.

    python3 mini_scheduler_bench.py TW_MINI_SCHEDULER [--mib 512] [--keys 100000]
        [--only dask|tw] [--profile 'CMD {pid} {round}'] [--relay BYTES]

For each scheduler in turn: the scheduler, 4 `dask worker` processes
(1 thread, no nanny, no memory limit) and one distributed.Client over tcp;
then two rounds, each a scatter and a gather of the same data through the
scheduler (direct=False, as Client does by default):
  - 16 numpy uint8 arrays of MIB/16 MiB each (random bytes), checked equal;
  - KEYS small ints (hash=False), checked equal.
Per round: wall time, the scheduler's CPU seconds (utime + stime from
/proc), its peak RSS above its idle RSS (VmHWM reset per round through
/proc/PID/clear_refs), and, for tw-mini-scheduler, the payload bytes it
copied (tw_stats, printed when it stops: both rounds together).
--profile runs CMD (split on spaces, {pid} the scheduler's pid, {round}
0 or 1) around each round of tw-mini-scheduler and stops it with SIGINT
at the round's end: e.g. 'perf record -g -o /tmp/r{round}.data -p {pid}'
or 'strace -c -f -o /tmp/s{round}.txt -p {pid}'.
--relay BYTES runs tw-mini-scheduler with --relay BYTES: payload frames of
that size or more go socket to socket with splice(2), never read (tcp).
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


def run(kind, tw_binary, mib, nkeys, profile=None, relay=None):
    import numpy as np
    from distributed import Client

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
    for rnd, (label, data, kw) in enumerate((("%d MiB, 16 arrays" % mib, arrays, {}),
                                             ("%d keys" % nkeys, small, {"hash": False}))):
        time.sleep(1)  # let the previous round's releases settle
        prof = None
        if profile and kind == "tw":
            prof = subprocess.Popen([a.format(pid=sched.pid, round=rnd) for a in profile.split()])
            time.sleep(2)  # attached before the round starts
        idle = status_kib(sched.pid, "VmRSS")
        peak_ok = reset_peak(sched.pid)
        cpu0 = cpu_s(sched.pid)
        t0 = time.monotonic()
        futures = client.scatter(data, **kw)
        back = client.gather(futures)
        wall = time.monotonic() - t0
        cpu = cpu_s(sched.pid) - cpu0
        peak = status_kib(sched.pid, "VmHWM")
        if prof is not None:
            prof.send_signal(signal.SIGINT)
            prof.wait()
        if data is arrays:
            assert all(a.tobytes() == b.tobytes() for a, b in zip(arrays, back))
        else:
            assert back == small
        del futures, back
        rows.append([kind, label, wall, cpu, (peak - idle) / 1024 if peak_ok else None])
        print("# %s %s: wall %.2f s, CPU %.2f s" % (kind, label, wall, cpu), flush=True)
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
    a = ap.parse_args()
    rows = []
    for kind in ("dask", "tw"):
        if a.only in (None, kind):
            rows += run(kind, a.tw_binary, a.mib, a.keys, a.profile, a.relay)
    print("%-6s %-20s %8s %12s %22s %20s" % ("sched", "round", "wall s", "sched CPU s",
                                            "peak RSS > idle MiB", "payload B copied"))
    for kind, label, wall, cpu, peak, copied in rows:
        print("%-6s %-20s %8.2f %12.2f %22s %20s" % (
            kind, label, wall, cpu, "%.0f" % peak if peak is not None else "?",
            copied if kind == "tw" else "-"))


if __name__ == "__main__":
    try:
        main()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
