# SPDX-License-Identifier: BSD-3-Clause
"""A user's Python session against tw-mini-scheduler (issue 16's first
"must show" item), typed into the interactive interpreter and printed as
its transcript.

    python3 mini_scheduler_session.py TW_MINI_SCHEDULER CERT_DIR
        [--transport tcp|tls|ws]... [--ttl SECONDS] [--mib 512] [--keys 100000]

Per transport (default: tcp, tls and ws, each on a cluster of its own):
starts `tw-mini-scheduler URI --worker-ttl TTL` and 4 `dask worker`
processes (w0..w3: 1 thread, no nanny, 127.0.0.1 only), then runs the
session below line by line through code.InteractiveInterpreter (the
machinery of Python's own prompt) and prints each line after ">>> " with
what the interpreter printed (a traceback is shortened to its last line).
The session checks each of its claims with an `assert` line: a failed
assert, an unexpected exception, a hang (--guard seconds on one line) or a
scheduler that does not stop cleanly on SIGTERM ends the run with exit
status 1. Every process it starts is killed on the way out, on failure too.
The last lines are the key numbers per transport.
"""
import argparse
import calendar
import code
import os
import signal
import subprocess
import sys
import time
import traceback

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "interop"))
from mini_procs import PY, cleanup, start  # noqa: E402,F401 (also ms.* of the break cases)
from mini_procs import WORKER_MAIN as WORKER  # noqa: E402

NAMES = ["w0", "w1", "w2", "w3"]


class Failed(Exception):
    pass



def on_alarm(signum, frame):
    raise TimeoutError("hang guard: the line ran longer than --guard seconds")


class Session(code.InteractiveInterpreter):
    """Runs typed lines as Python's prompt does and prints the transcript."""

    def __init__(self, guard):
        super().__init__({"__name__": "__console__", "__doc__": None})
        self.guard = guard
        self.exc = None
        self.asserts = 0

    def write(self, data):
        sys.stdout.write(data)

    def showtraceback(self):
        typ, val, tb = sys.exc_info()
        sys.last_type, sys.last_value, sys.last_traceback = typ, val, tb
        self.exc = val
        self.full = "".join(traceback.format_exception(typ, val, tb))
        self.write("Traceback (most recent call last):\n  ...\n")
        self.write("".join(traceback.format_exception_only(typ, val)))

    def type(self, src, raises=None):
        """Type src (one line, or a block) at the prompt. raises: the
        exception class the line must raise (the transcript shows it)."""
        lines = src.strip("\n").split("\n")
        print(">>> " + lines[0])
        for line in lines[1:]:
            print("... " + line)
        if len(lines) > 1:
            print("... ")
        sys.stdout.flush()
        self.exc = None
        signal.alarm(self.guard)
        try:
            self.runcode(compile("\n".join(lines) + "\n", "<stdin>", "single"))
        finally:
            signal.alarm(0)
        sys.stdout.flush()
        if raises is None and self.exc is not None:
            print(self.full, file=sys.stderr)
            what = "a claim failed" if isinstance(self.exc, AssertionError) else "unexpected"
            raise Failed("%s: %s" % (what, src.strip()))
        if raises is not None and not isinstance(self.exc, raises):
            raise Failed("expected %s from: %s" % (raises.__name__, src.strip()))
        if lines[0].startswith("assert "):
            self.asserts += 1

    def __getitem__(self, name):
        return self.locals[name]


def start_cluster(binary, transport, certs, ttl, logdir):
    """tw-mini-scheduler and 4 workers: (address, scheduler Popen, {name: Popen})."""
    args = [binary, transport + "://127.0.0.1:0", "--worker-ttl", str(ttl)]
    worker_tls = []
    if transport == "tls":
        ca, cert, key = (os.path.join(certs, f) for f in ("ca.pem", "cert.pem", "key.pem"))
        args += ["--tls-ca", ca, "--tls-cert", cert, "--tls-key", key]
        worker_tls = ["--tls-ca-file", ca, "--tls-cert", cert, "--tls-key", key]
    log = open(os.path.join(logdir, "scheduler-%s.log" % transport), "w")
    sched = start(args, stdout=subprocess.PIPE, stderr=log, text=True)
    line = sched.stdout.readline()
    if not line.startswith("listening on "):
        raise Failed("tw-mini-scheduler did not start: %r" % line)
    addr = line.split()[2]
    workers = {}
    for name in NAMES:
        wlog = open(os.path.join(logdir, "%s-%s.log" % (name, transport)), "w")
        workers[name] = start(
            [PY, "-c", WORKER, addr, "--name", name, "--nthreads", "1", "--no-nanny",
             "--no-dashboard", "--host", "127.0.0.1"] + worker_tls,
            stdout=wlog, stderr=subprocess.STDOUT)
    print("$ %s &    # pid %d" % (" ".join(args), sched.pid))
    print("listening on %s" % addr)
    print("$ for w in %s; do dask worker %s --name $w --nthreads 1 --no-nanny "
          "--no-dashboard --host 127.0.0.1%s & done" % (
              " ".join(NAMES), addr, " --tls-ca-file ... --tls-cert ... --tls-key ..."
              if worker_tls else ""))
    # Debian's interpreter, the one with distributed (README: a python3
    # first on PATH, a pyenv one, may not have it)
    print("$ /usr/bin/python3")
    sys.stdout.flush()
    return addr, sched, workers


def session(s, addr, transport, certs, ttl, workers, mib, nkeys, log):
    """The user's session. Returns the key numbers."""
    t = s.type
    t("import os, signal, sys, time")
    t("import numpy as np")
    t("from distributed import Client")
    t("from concurrent.futures import CancelledError")
    if transport == "tls":
        t("from distributed.security import Security")
        t("certs = %r  # scripts/make-test-certs.sh made them" % certs)
        t('sec = Security(tls_ca_file=certs + "/ca.pem", tls_client_cert=certs + "/cert.pem",\n'
          '               tls_client_key=certs + "/key.pem", require_encryption=True)')
        t("client = Client(%r, security=sec)" % addr)
    else:
        t("client = Client(%r)" % addr)
    t("client.wait_for_workers(4)")
    t("client")
    t("info = client.scheduler_info()")
    t('info["type"], info["address"]')
    t('assert info["address"] == %r' % addr)
    t('{a: (w["name"], w["status"], w["nthreads"]) for a, w in info["workers"].items()}')
    t('assert sorted(w["name"] for w in info["workers"].values()) == %r' % NAMES)
    t('addr_of = {w["name"]: a for a, w in info["workers"].items()}')
    t("pids = %r  # the workers' process ids ($! in the shell)" %
      {n: p.pid for n, p in workers.items()})

    # 16 numpy arrays, MIB MiB in all: scatter, gather, byte-identical
    t("rng = np.random.default_rng(16)")
    t("arrays = [rng.integers(0, 256, size=%d << 20, dtype=np.uint8) for i in range(16)]"
      % (mib // 16))
    t("sum(a.nbytes for a in arrays) >> 20  # MiB")
    t("t0 = time.monotonic(); futs = client.scatter(arrays); t_scatter = time.monotonic() - t0")
    t("t0 = time.monotonic(); back = client.gather(futs); t_gather = time.monotonic() - t0")
    t('print(f"scatter {t_scatter:.2f} s + gather {t_gather:.2f} s = {t_scatter + t_gather:.2f} s")')
    t("same = [a.dtype == b.dtype and a.tobytes() == b.tobytes() for a, b in zip(arrays, back)]")
    t("assert len(back) == 16 and all(same); all(same)")
    t("del back")
    t("who = client.who_has(futs)")
    t("who")
    t("holders = [a for f in futs for a in who[f.key]]")
    t("{n: holders.count(a) for n, a in addr_of.items()}  # arrays per worker")
    t("assert len(holders) == 16 and set(holders) == set(addr_of.values())")

    # NKEYS small values
    t("values = list(range(%d))" % nkeys)
    t("t0 = time.monotonic(); small = client.scatter(values); t_scatter_small = time.monotonic() - t0")
    t("t0 = time.monotonic(); back = client.gather(small); t_gather_small = time.monotonic() - t0")
    t('print(f"scatter {t_scatter_small:.2f} s + gather {t_gather_small:.2f} s = '
      '{t_scatter_small + t_gather_small:.2f} s")')
    t("len(small), back[:3], back[-3:]")
    t("assert back == values; back == values")
    t("del small, back")

    # SIGKILL: gone from scheduler_info within 1 s, its keys lost at once
    t("signalled = {}")
    t('def removed_after(name, sig):\n'
      '    """Signal a worker, call scheduler_info() until it no longer lists it:\n'
      '    (s until that reply, s at which that last call was made)."""\n'
      '    os.kill(pids[name], sig); t0 = time.monotonic(); signalled[name] = time.time()\n'
      '    while True:\n'
      '        asked = time.monotonic() - t0\n'
      '        if addr_of[name] not in client.scheduler_info()["workers"]:\n'
      '            return round(time.monotonic() - t0, 3), round(asked, 3)\n'
      '        time.sleep(0.01)')
    t('lost = [f for f in futs if set(who[f.key]) == {addr_of["w0"]}]; len(lost)')
    t("assert lost")
    t('killed, asked = removed_after("w0", signal.SIGKILL); killed, asked  # s')
    t("assert asked <= 1.0")
    removed = log_removal(s, log, addr_of(s, "w0"), s["signalled"]["w0"], "SIGKILL")
    if removed > 1.0:
        raise Failed("the scheduler removed the SIGKILLed worker %.3f s after the kill" % removed)
    t("t0 = time.monotonic()")
    t("client.gather(lost)", raises=Exception)
    t("failed = round(time.monotonic() - t0, 3); failed  # s")
    t("assert isinstance(sys.last_value, CancelledError) and failed <= 1.0")
    t('sorted(w["name"] for w in client.scheduler_info()["workers"].values())')
    t('assert sorted(w["name"] for w in client.scheduler_info()["workers"].values()) == '
      '["w1", "w2", "w3"]')
    t('rest = [i for i, f in enumerate(futs) if addr_of["w0"] not in who[f.key]]')
    t("back = client.gather([futs[i] for i in rest])")
    t("assert all(arrays[i].tobytes() == b.tobytes() for i, b in zip(rest, back)); len(back)")
    t("del back")

    # SIGSTOP: removed at the TTL (+ at most 1 s)
    t("ttl = %r  # tw-mini-scheduler's --worker-ttl" % float(ttl))
    t('beat = client.scheduler_info()["workers"][addr_of["w1"]]["last_seen"]')
    t('stopped, asked = removed_after("w1", signal.SIGSTOP); stopped, asked  # s')
    t("since_beat = round(time.time() - beat, 3); since_beat  # s since its last heartbeat")
    t("assert asked <= ttl + 1 and since_beat >= ttl")
    removed = log_removal(s, log, addr_of(s, "w1"), s["beat"], "last heartbeat")
    if not ttl <= removed <= ttl + 1:
        raise Failed("the scheduler removed the SIGSTOPped worker %.3f s after its last "
                     "heartbeat (TTL %g s)" % (removed, ttl))
    t('lost = [f for f in futs if set(who[f.key]) == {addr_of["w1"]}]; len(lost)')
    t("assert lost")
    t("t0 = time.monotonic()")
    t("client.gather(lost)", raises=Exception)
    t("failed_stopped = round(time.monotonic() - t0, 3); failed_stopped  # s")
    t("assert isinstance(sys.last_value, CancelledError) and failed_stopped <= 1.0")
    t('os.kill(pids["w1"], signal.SIGCONT); os.kill(pids["w1"], signal.SIGKILL)')
    t('sorted(w["name"] for w in client.scheduler_info()["workers"].values())')
    t('assert sorted(w["name"] for w in client.scheduler_info()["workers"].values()) == '
      '["w2", "w3"]')
    t("client.close()")
    nums = {k: s[k] for k in ("t_scatter", "t_gather", "t_scatter_small", "t_gather_small",
                              "killed", "failed", "stopped", "since_beat", "failed_stopped")}
    nums["log_killed"], nums["log_stopped"] = s.log_removed
    return nums


def addr_of(s, name):
    return s["addr_of"][name]


def log_removal(s, log, addr, since, what):
    """The scheduler's own log line for addr's removal (stamped with the
    wall clock, HH:MM:SS.mmm UTC); prints it, returns its seconds after
    `since` (a wall-clock time)."""
    mark = "worker %s was removed: " % addr
    line = None
    end = time.monotonic() + 5
    while line is None and time.monotonic() < end:
        with open(log) as f:
            line = next((ln.strip() for ln in f if mark in ln), None)
        if line is None:
            time.sleep(0.05)
    if line is None:
        raise Failed("no removal of %s in the scheduler's log" % addr)
    hms, frac = line.split()[0].split(".")
    day = time.strftime("%Y-%m-%d", time.gmtime(since))
    stamp = calendar.timegm(time.strptime(day + " " + hms, "%Y-%m-%d %H:%M:%S")) + \
        int(frac) / 1000
    after = stamp - since
    print("# tw-mini-scheduler's log: %s  (%.3f s after the %s)" % (line, after, what))
    s.log_removed = getattr(s, "log_removed", ()) + (after,)
    return after


def run_transport(a, transport, logdir):
    addr, sched, workers = start_cluster(a.binary, transport, a.certs, a.ttl, logdir)
    s = Session(a.guard)
    try:
        nums = session(s, addr, transport, a.certs, a.ttl, workers, a.mib, a.keys,
                       os.path.join(logdir, "scheduler-%s.log" % transport))
    except BaseException:
        print("--- scheduler log (tail) ---", file=sys.stderr)
        with open(os.path.join(logdir, "scheduler-%s.log" % transport)) as f:
            sys.stderr.write("".join(f.readlines()[-30:]))
        raise
    print(">>> ^D")
    sched.send_signal(signal.SIGTERM)
    out = sched.communicate(timeout=a.guard)[0].strip()
    print("$ kill %d   # SIGTERM: the scheduler stops and says" % sched.pid)
    print(out)
    if sched.returncode != 0:
        raise Failed("tw-mini-scheduler exited with %s after SIGTERM" % sched.returncode)
    cleanup()
    nums["asserts"] = s.asserts
    nums["stop"] = out
    return nums


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary")
    ap.add_argument("certs")
    ap.add_argument("--transport", action="append", choices=["tcp", "tls", "ws"])
    ap.add_argument("--ttl", type=float, default=120.0, help="--worker-ttl (default 120 s)")
    ap.add_argument("--mib", type=int, default=512, help="MiB in the 16 arrays (default 512)")
    ap.add_argument("--keys", type=int, default=100_000, help="small values (default 100000)")
    ap.add_argument("--guard", type=int, default=1200, help="hang guard per line, s (default 1200)")
    ap.add_argument("--logdir", default=".", help="scheduler and worker logs (default .)")
    a = ap.parse_args()
    transports = a.transport or ["tcp", "tls", "ws"]
    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.stdout.reconfigure(line_buffering=True)
    results = {}
    for tr in transports:
        print("\n### %s:// (%s UTC)" % (tr, time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())))
        results[tr] = run_transport(a, tr, a.logdir)
    print("\n### key numbers (every claim asserted; %d MiB in 16 arrays, %d small values, "
          "TTL %g s)" % (a.mib, a.keys, a.ttl))
    print("SIGKILL: s from the kill to the scheduler's removal (its log) / to a scheduler_info()"
          " reply without it;\nSIGSTOP: s from the last heartbeat to the removal (log) / from "
          "the SIGSTOP to a reply without it;\ngather fail: s until client.gather of its keys "
          "raised CancelledError")
    print("%-4s %9s %9s %9s %10s %17s %12s %17s %8s" % (
        "", "%d MiB" % a.mib, "scatter", "gather", "small keys", "SIGKILL log/info",
        "gather fail", "SIGSTOP log/info", "asserts"))
    for tr, n in results.items():
        print("%-4s %8.2fs %8.2fs %8.2fs %9.2fs %8.3f/%-8.3f %11.3fs %8.3f/%-8.3f %8d" % (
            tr, n["t_scatter"] + n["t_gather"], n["t_scatter"], n["t_gather"],
            n["t_scatter_small"] + n["t_gather_small"], n["log_killed"], n["killed"],
            n["failed"], n["log_stopped"], n["stopped"], n["asserts"]))
    for tr, n in results.items():
        print("%s: %s" % (tr, n["stop"]))
    print("all claims held over", ", ".join(transports))


if __name__ == "__main__":
    try:
        main()
    except Failed as e:
        print("FAILED:", e, file=sys.stderr)
        sys.exit(1)
    except TimeoutError as e:
        print("FAILED:", e, file=sys.stderr)
        sys.exit(1)
    finally:
        cleanup()
