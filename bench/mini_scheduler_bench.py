# SPDX-License-Identifier: BSD-3-Clause
"""tw-mini-scheduler beside `dask scheduler` (issue 16), in one run.

    python3 mini_scheduler_bench.py TW_MINI_SCHEDULER [--mib 512] [--keys 100000]
        [--only dask|tw] [--profile 'CMD {pid} {round}'] [--relay BYTES]
        [--repeat N] [--keys-repeat N] [--also LABEL=TW_MINI_SCHEDULER ...]
        [--also-dask LABEL:NAME=VALUE[,NAME=VALUE] ...]

For each scheduler in turn: the scheduler, 4 `dask worker` processes
(1 thread, no nanny, no memory limit) and one distributed.Client over tcp;
then two rounds, each a scatter and a gather of the same data through the
scheduler (direct=False, as Client does by default):
  - 16 numpy uint8 arrays of MIB/16 MiB each (random bytes), checked equal;
  - KEYS small ints (hash=False), checked equal.
Both schedulers are measured the same way over the same window: from just
before client.scatter to just after client.gather returns, the
scheduler's user and system CPU seconds (utime and stime of every thread,
plus cutime and cstime, from /proc/PID/stat), its sleeps (voluntary
context switches: the loop's wakeups), its peak RSS above its idle RSS
(VmHWM reset per round through /proc/PID/clear_refs), and, for
tw-mini-scheduler, the payload bytes it copied (tw_stats, printed when it
stops: all rounds together). Beside them, not in the round's figure: its
CPU per second when idle (measured for 2 s before the first round; Dask's
scheduler runs periodic callbacks), and the CPU it spends after the round
until it is that idle again (the releases of the round's keys; the next
round starts only then, so no round is charged for the one before).
--profile runs CMD (split on spaces, {pid} the scheduler's pid, {round}
the round's index) around each round of tw-mini-scheduler and stops it
with SIGINT at the round's end: e.g. 'perf record -g -o /tmp/r{round}.data
-p {pid}' or 'strace -c -f -o /tmp/s{round}.txt -p {pid}'.
--relay BYTES runs tw-mini-scheduler with --relay BYTES: payload frames of
that size or more go socket to socket with splice(2), never read (tcp).
--repeat N runs the large round N times, then --keys-repeat N (default: as
--repeat) the small-key round, with the same scheduler, workers and
client. --also LABEL=BINARY runs another tw-mini-scheduler build
after the first one (A/B in one run: the same load; each row's CPU over
the median of Dask's rows of its round). --also-dask LABEL:NAME=VALUE
runs another `dask scheduler` with those environment variables, e.g.
dask4k:NUMPY_MADVISE_HUGEPAGE=0 (its receive buffers in 4 KiB pages:
numpy advises transparent huge pages for arrays of 4 MiB or more, and
Dask's TCP comm receives each message into one numpy array).
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
    """(user, sys) CPU seconds of pid: every thread, live or ended, and
    the children it waited for (cutime, cstime; none for either scheduler
    here, counted anyway)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return ((int(fields[11]) + int(fields[13])) / tick, (int(fields[12]) + int(fields[14])) / tick)


def reset_peak(pid):
    try:
        with open("/proc/%d/clear_refs" % pid, "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def settle(pid, idle_rate, step=0.5, most=180):
    """Wait until pid's CPU in the last `step` seconds is no more than when
    idle (plus one clock tick), at least 1 s, at most `most` s: Dask's
    scheduler takes seconds of CPU to release 100,000 keys after the
    round, and a round started before it is done would be charged for
    them."""
    time.sleep(1)
    end = time.monotonic() + most
    u, s = cpu_s(pid)
    while time.monotonic() < end:
        time.sleep(step)
        u1, s1 = cpu_s(pid)
        if u1 + s1 - u - s <= idle_rate * step + 1.0 / os.sysconf("SC_CLK_TCK"):
            return
        u, s = u1, s1


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run(kind, binary, mib, nkeys, profile=None, relay=None, repeat=1, label=None, env=None,
        keys_repeat=1):
    import numpy as np
    from distributed import Client

    label = label or kind
    if kind == "tw":
        extra = ["--relay", str(relay)] if relay is not None else []
        sched = start([binary, "tcp://127.0.0.1:0"] + extra, stdout=subprocess.PIPE, text=True)
        addr = sched.stdout.readline().split()[2]
    else:
        port = free_port()
        addr = "tcp://127.0.0.1:%d" % port
        sched = start([PY, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                       "--port", str(port), "--dashboard-address", "127.0.0.1:0", "--no-show"],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                      env=dict(os.environ, **(env or {})))
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
    rounds = [("%d MiB, 16 arrays" % mib, arrays, {})] * repeat
    if nkeys > 0:
        rounds += [("%d keys" % nkeys, small, {"hash": False})] * keys_repeat
    time.sleep(1)
    u0, s0 = cpu_s(sched.pid)
    time.sleep(2)
    u1, s1 = cpu_s(sched.pid)
    idle_rate = (u1 + s1 - u0 - s0) / 2  # CPU s per s with nothing to do
    settle(sched.pid, idle_rate)
    for rnd, (what, data, kw) in enumerate(rounds):
        prof = None
        if profile and kind == "tw":
            prof = subprocess.Popen([a.format(pid=sched.pid, round=rnd) for a in profile.split()])
            time.sleep(2)  # attached before the round starts
        idle = status_kib(sched.pid, "VmRSS")
        peak_ok = reset_peak(sched.pid)
        u0, s0 = cpu_s(sched.pid)
        sw0 = status_kib(sched.pid, "voluntary_ctxt_switches")
        t0 = time.monotonic()
        futures = client.scatter(data, **kw)
        back = client.gather(futures)
        wall = time.monotonic() - t0
        u1, s1 = cpu_s(sched.pid)
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
        t1 = time.monotonic()
        settle(sched.pid, idle_rate)  # the round's releases, before the next round
        u2, s2 = cpu_s(sched.pid)
        row = dict(label=label, what=what, wall=wall, user=u1 - u0, sys=s1 - s0, cpu=u1 + s1 - u0 - s0,
                   after=u2 + s2 - u1 - s1, settle=time.monotonic() - t1, idle_rate=idle_rate, sleeps=sleeps,
                   peak=(peak - idle) / 1024 if peak_ok else None, load=os.getloadavg()[0])
        rows.append(row)
        print("# %s %s: wall %.2f s, CPU %.2f s (user %.2f, sys %.2f), %d sleeps, after %.2f s in %.1f s"
              " (load %.1f)" % (label, what, wall, row["cpu"], row["user"], row["sys"], sleeps,
                                row["after"], row["settle"], row["load"]), flush=True)
    client.close()
    copied = "-"
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
        r["copied"] = copied
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
    ap.add_argument("--keys-repeat", type=int)
    ap.add_argument("--also", action="append", default=[], metavar="LABEL=BINARY")
    ap.add_argument("--also-dask", action="append", default=[], metavar="LABEL:NAME=VALUE[,NAME=VALUE]")
    a = ap.parse_args()
    rows = []
    runs = [("dask", "dask", None, None)]
    for x in a.also_dask:
        label, _, envs = x.partition(":")
        runs.append(("dask", label, None, dict(e.split("=", 1) for e in envs.split(",") if e)))
    runs.append(("tw", "tw", a.tw_binary, None))
    runs += [("tw", x.split("=", 1)[0], x.split("=", 1)[1], None) for x in a.also]
    print("# load average %.1f %.1f %.1f" % os.getloadavg(), flush=True)
    for kind, label, binary, env in runs:
        if a.only in (None, kind):
            rows += run(kind, binary, a.mib, a.keys, a.profile, a.relay, a.repeat, label, env,
                        a.repeat if a.keys_repeat is None else a.keys_repeat)
    print("# load average %.1f %.1f %.1f" % os.getloadavg())
    dask = {}  # the median of Dask's rows of each round
    for r in rows:
        if r["label"] == "dask":
            dask.setdefault(r["what"], []).append(r["cpu"])
    dask = {k: sorted(v)[len(v) // 2] for k, v in dask.items()}
    print("%-8s %-20s %7s %7s %7s %7s %8s %7s %7s %7s %5s %9s %10s" % (
        "sched", "round", "wall s", "CPU s", "user s", "sys s", "CPU/dask", "sleeps", "after s",
        "idle/s", "load", "RSS>idle", "copied B"))
    for r in rows:
        d = dask.get(r["what"])
        print("%-8s %-20s %7.2f %7.2f %7.2f %7.2f %8s %7d %7.2f %7.3f %5.1f %9s %10s" % (
            r["label"], r["what"], r["wall"], r["cpu"], r["user"], r["sys"],
            "%.3f" % (r["cpu"] / d) if d else "-", r["sleeps"], r["after"], r["idle_rate"],
            r["load"], "%.0f" % r["peak"] if r["peak"] is not None else "?", r["copied"]))


if __name__ == "__main__":
    try:
        main()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
