# SPDX-License-Identifier: BSD-3-Clause
"""tw-mini-scheduler beside `dask scheduler` (issue 16), in one run.

    python3 mini_scheduler_bench.py TW_MINI_SCHEDULER [--mib 512] [--keys 100000]
        [--only dask|tw] [--profile 'CMD {pid} {round}'] [--relay BYTES]
        [--repeat N] [--keys-repeat N] [--also LABEL=TW_MINI_SCHEDULER ...]
        [--also-dask LABEL:NAME=VALUE[,NAME=VALUE] ...]

Each scheduler gets 4 `dask worker` processes (1 thread, no nanny, no
memory limit) and a distributed.Client of its own over tcp, all started
first; then each round goes through every scheduler in turn, so a load
that changes during the run falls on all of them alike. A round is a
scatter and a gather of the same data through the scheduler (direct=False,
as Client does by default):
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
client. --also LABEL=BINARY runs another tw-mini-scheduler build beside
the first one (A/B in one run; each row's CPU over the median of Dask's
rows of its round). --also-dask LABEL:NAME=VALUE
runs another `dask scheduler` beside them with those environment variables, e.g.
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


class Cluster:
    """One scheduler (Dask's or a tw-mini-scheduler build), its 4 workers and a Client."""

    def __init__(self, kind, label, binary, relay=None, env=None):
        from distributed import Client

        self.kind, self.label = kind, label
        if kind == "tw":
            extra = ["--relay", str(relay)] if relay is not None else []
            self.sched = start([binary, "tcp://127.0.0.1:0"] + extra, stdout=subprocess.PIPE, text=True)
            addr = self.sched.stdout.readline().split()[2]
        else:
            port = free_port()
            addr = "tcp://127.0.0.1:%d" % port
            self.sched = start([PY, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                "--port", str(port), "--dashboard-address", "127.0.0.1:0", "--no-show"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=dict(os.environ, **(env or {})))
        self.workers = [start([PY, "-m", "distributed.cli.dask_worker", addr, "--nthreads", "1",
                               "--no-nanny", "--no-dashboard", "--host", "127.0.0.1",
                               "--memory-limit", "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(4)]
        self.client = Client(addr, timeout=60, set_as_default=False)
        self.client.wait_for_workers(4)
        self.idle_rate = None

    def measure_idle(self):
        pid = self.sched.pid
        time.sleep(1)
        u0, s0 = cpu_s(pid)
        time.sleep(2)
        u1, s1 = cpu_s(pid)
        self.idle_rate = (u1 + s1 - u0 - s0) / 2  # CPU s per s with nothing to do
        settle(pid, self.idle_rate)

    def round(self, rnd, what, data, kw, check, profile=None):
        pid = self.sched.pid
        prof = None
        if profile and self.kind == "tw":
            prof = subprocess.Popen([a.format(pid=pid, round=rnd) for a in profile.split()])
            time.sleep(2)  # attached before the round starts
        idle = status_kib(pid, "VmRSS")
        peak_ok = reset_peak(pid)
        u0, s0 = cpu_s(pid)
        sw0 = status_kib(pid, "voluntary_ctxt_switches")
        t0 = time.monotonic()
        futures = self.client.scatter(data, **kw)
        back = self.client.gather(futures)
        wall = time.monotonic() - t0
        u1, s1 = cpu_s(pid)
        sleeps = status_kib(pid, "voluntary_ctxt_switches") - sw0
        peak = status_kib(pid, "VmHWM")
        if prof is not None:
            prof.send_signal(signal.SIGINT)
            prof.wait()
        check(back)
        del futures, back
        t1 = time.monotonic()
        settle(pid, self.idle_rate)  # the round's releases, before the next round
        u2, s2 = cpu_s(pid)
        row = dict(label=self.label, what=what, wall=wall, user=u1 - u0, sys=s1 - s0,
                   cpu=u1 + s1 - u0 - s0, after=u2 + s2 - u1 - s1, settle=time.monotonic() - t1,
                   idle_rate=self.idle_rate, sleeps=sleeps,
                   peak=(peak - idle) / 1024 if peak_ok else None, load=os.getloadavg()[0])
        print("# %s %s: wall %.2f s, CPU %.2f s (user %.2f, sys %.2f), %d sleeps, after %.2f s in %.1f s"
              " (load %.1f)" % (self.label, what, wall, row["cpu"], row["user"], row["sys"], sleeps,
                                row["after"], row["settle"], row["load"]), flush=True)
        return row

    def close(self):
        """Stops it all; returns the payload bytes tw-mini-scheduler copied ("-" for Dask's)."""
        self.client.close()
        copied = "-"
        self.sched.send_signal(signal.SIGTERM)
        if self.kind == "tw":
            out = self.sched.stdout.read()
            m = re.search(r"payload bytes copied (\d+)", out)
            copied = m.group(1) if m else "?"
        try:
            self.sched.wait(timeout=30)
        except subprocess.TimeoutExpired:  # Dask's, on a loaded machine
            self.sched.kill()
            self.sched.wait()
        for w in self.workers:
            w.kill()
            w.wait()
        return copied


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
    import numpy as np

    print("# load average %.1f %.1f %.1f" % os.getloadavg(), flush=True)
    rng = np.random.default_rng(16)
    arrays = [rng.integers(0, 256, size=(a.mib << 20) // 16, dtype=np.uint8) for _ in range(16)]
    small = list(range(a.keys))

    def same_arrays(back):
        assert all(x.tobytes() == y.tobytes() for x, y in zip(arrays, back))

    def same_small(back):
        assert back == small

    rounds = [("%d MiB, 16 arrays" % a.mib, arrays, {}, same_arrays)] * a.repeat
    if a.keys > 0:
        keys_repeat = a.repeat if a.keys_repeat is None else a.keys_repeat
        rounds += [("%d keys" % a.keys, small, {"hash": False}, same_small)] * keys_repeat
    clusters = [Cluster(kind, label, binary, a.relay, env)
                for kind, label, binary, env in runs if a.only in (None, kind)]
    for c in clusters:
        c.measure_idle()
    by_label = {c.label: [] for c in clusters}
    for rnd, (what, data, kw, check) in enumerate(rounds):
        for c in clusters:  # each round through every scheduler in turn: the same load
            by_label[c.label].append(c.round(rnd, what, data, kw, check, a.profile))
    for c in clusters:
        copied = c.close()
        for r in by_label[c.label]:
            r["copied"] = copied
        rows += by_label[c.label]
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
