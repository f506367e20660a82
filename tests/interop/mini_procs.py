# SPDX-License-Identifier: BSD-3-Clause
"""What the tw-mini-scheduler scripts share (tests/interop/mini_scheduler.py,
bench/mini_scheduler_session.py and mini_scheduler_session_break.py): the
processes they start, killed and reaped on the way out (stopped ones too),
waits on progress with a hang guard, and the `dask worker` they run."""
import signal
import subprocess
import sys
import time

PY = "/usr/bin/python3"

# `dask worker`, except that a server given no address binds 127.0.0.1
# (or $TW_MINI_BIND, "::1" for a worker given --host [::1]): Dask
# 2022.12.1's ws listener (comm/ws.py WSListener.start) calls
# HTTPServer.listen(port) with no address, so a ws worker bound every
# interface and gave the scheduler a non-loopback contact address.
# `python3 -c WORKER_MAIN ADDRESS ARGS...`; a script may patch more first.
WORKER_MAIN = """
import os, sys, tornado.tcpserver
listen = tornado.tcpserver.TCPServer.listen
def loopback_listen(self, port, address=None, *a, **kw):
    return listen(self, port, address or os.environ.get("TW_MINI_BIND", "127.0.0.1"), *a, **kw)
tornado.tcpserver.TCPServer.listen = loopback_listen
sys.argv[0] = "dask-worker"
from distributed.cli.dask_worker import main
main()
"""

procs = []


def start(args, **kw):
    """subprocess.Popen(args, **kw), recorded for cleanup()."""
    p = subprocess.Popen(args, **kw)
    procs.append(p)
    return p


def report_ended():
    """After a failure, before cleanup(): every process start() made that
    had already ended on its own, with its exit status (negative: the
    signal), to stderr (a scheduler that died shows only as refused
    connections in the client's traceback)."""
    for p in procs:
        if p.poll() is not None:
            sys.stderr.write("ended before cleanup: %s, exit status %d\n"
                             % (" ".join(str(a) for a in p.args[:3]), p.returncode))
    sys.stderr.flush()


def cleanup():
    """Kill (after SIGCONT: stopped ones too) and reap every process
    start() made."""
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGCONT)
                p.kill()
            except OSError:
                pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            print("could not reap pid %d" % p.pid, file=sys.stderr)
    procs.clear()


def wait_until(what, pred, guard=60.0, step=0.02):
    """Poll pred() until it is true (its value), at most guard seconds:
    a hang guard, not a measurement."""
    end = time.monotonic() + guard
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError("hang guard: still waiting after %g s for %s" % (guard, what))
        time.sleep(step)


def raises(exc, what, fn, *args, **kw):
    """fn(*args, **kw) must raise exc (a type or a tuple): the exception."""
    try:
        fn(*args, **kw)
    except exc as e:
        return e
    raise AssertionError(what + " succeeded")
