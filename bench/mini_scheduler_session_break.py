# SPDX-License-Identifier: BSD-3-Clause
"""Trying to break tw-mini-scheduler as a user would (issue 16).

    python3 mini_scheduler_session_break.py TW_MINI_SCHEDULER CERT_DIR
        [--transport tcp|tls|ws] [--case NAME]... [--ttl SECONDS]

Each case starts a cluster of its own (tw-mini-scheduler and 4 `dask
worker` processes w0..w3, as mini_scheduler_session.py does), does what a
user might, and compares with what Dask's own scheduler does (the
expectation is written beside each case). It prints one line per case,
"ok" or "FAIL: what happened", and exits 1 when a case failed. Every
process it starts is killed on the way out, on failure too.
"""
import argparse
import functools
import os
import signal
import subprocess
import sys
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mini_scheduler_session as ms  # noqa: E402
import mini_procs  # noqa: E402 (on the path mini_scheduler_session made)

PY = ms.PY
GUARD = 120
wait_until = functools.partial(mini_procs.wait_until, guard=GUARD)


class Cluster:
    def __init__(self, a, transport, ttl=None):
        self.a = a
        self.transport = transport
        devnull = open(os.devnull, "w")
        stdout = sys.stdout
        sys.stdout = devnull  # start_cluster prints the shell lines
        try:
            self.addr, self.sched, self.workers = ms.start_cluster(
                a.binary, transport, a.certs, ttl or a.ttl, a.logdir)
        finally:
            sys.stdout = stdout
        self.security = None
        self.client_kw = {}
        if transport == "tls":
            from distributed.security import Security
            c = a.certs
            self.security = Security(tls_ca_file=c + "/ca.pem", tls_client_cert=c + "/cert.pem",
                                     tls_client_key=c + "/key.pem", require_encryption=True)
            self.client_kw = {"security": self.security}

    def client(self, n=4):
        from distributed import Client
        c = Client(self.addr, timeout=60, **self.client_kw)
        if n:
            c.wait_for_workers(n, timeout=GUARD)
        return c

    def names(self, client):
        info = client.scheduler_info()["workers"]
        return {w["name"]: a for a, w in info.items()}

    def start_worker(self, name, port=None):
        args = [PY, "-c", ms.WORKER, self.addr, "--name", name, "--nthreads", "1",
                "--no-nanny", "--no-dashboard", "--host", "127.0.0.1"]
        if port:
            args += ["--worker-port", str(port)]
        if self.transport == "tls":
            c = self.a.certs
            args += ["--tls-ca-file", c + "/ca.pem", "--tls-cert", c + "/cert.pem",
                     "--tls-key", c + "/key.pem"]
        log = open(os.path.join(self.a.logdir, "%s-%s-extra.log" % (name, self.transport)), "a")
        self.workers[name] = ms.start(args, stdout=log, stderr=subprocess.STDOUT)
        return self.workers[name]

    def alive(self):
        return self.sched.poll() is None

    def worker_keys(self, client, addr):
        return client.sync(client.rpc(addr).keys)


def client_script(c, body):
    """Python source for a client in a process of its own."""
    sec = ""
    if c.transport == "tls":
        d = c.a.certs
        sec = ("from distributed.security import Security\n"
               "kw = dict(security=Security(tls_ca_file=%r, tls_client_cert=%r, "
               "tls_client_key=%r, require_encryption=True))\n" % (
                   d + "/ca.pem", d + "/cert.pem", d + "/key.pem"))
    else:
        sec = "kw = {}\n"
    return ("import os, sys, time\nimport numpy as np\nfrom distributed import Client\n" + sec +
            "client = Client(%r, timeout=60, **kw)\n" % c.addr + body)


# --- the cases: each returns None (ok) or raises AssertionError ---

def case_worker_restart(c):
    """SIGKILL a worker, start it again on the same port: it registers again,
    and scatter/gather use it. Dask: the same."""
    client = c.client()
    addr = c.names(client)["w0"]
    port = int(addr.rsplit(":", 1)[1])
    c.workers["w0"].kill()
    c.workers["w0"].wait()
    wait_until("w0 removed", lambda: "w0" not in c.names(client))
    c.start_worker("w0", port)
    client.wait_for_workers(4, timeout=GUARD)
    assert c.names(client)["w0"] == addr, c.names(client)
    futs = client.scatter(list(range(100)), workers=[addr])
    assert set(a for v in client.who_has(futs).values() for a in v) == {addr}
    assert client.gather(futs) == list(range(100))
    client.close()


def scattered_on(c, client, name):
    """40 small values scattered: (their futures, those only worker
    `name` holds)."""
    names = c.names(client)
    futs = client.scatter(list(range(40)), hash=False)
    who = client.who_has(futs)
    return futs, [f for f in futs if set(who[f.key]) == {names[name]}]


def case_worker_sigterm(c):
    """A worker stopped with SIGTERM (the way `dask worker` is stopped):
    it leaves, its keys are lost, a gather of them fails at once.
    Dask: the worker unregisters (or its stream closes), keys cancelled."""
    client = c.client()
    futs, lost = scattered_on(c, client, "w1")
    c.workers["w1"].send_signal(signal.SIGTERM)
    wait_until("w1 removed", lambda: "w1" not in c.names(client), guard=30)
    from concurrent.futures import CancelledError
    t = time.monotonic()
    mini_procs.raises(CancelledError, "gather of keys only the stopped worker held",
                      client.gather, lost)
    assert time.monotonic() - t < 2, time.monotonic() - t
    client.close()


def case_worker_restart_same_name(c):
    """A second worker with the name of a running one. Dask refuses it
    ("name taken") and the first stays."""
    client = c.client()
    before = c.names(client)
    p = c.start_worker("w2")
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pass
    info = client.scheduler_info()["workers"]
    names = sorted(w["name"] for w in info.values())
    assert names == ["w0", "w1", "w2", "w3"], "workers now: %s" % names
    assert c.names(client)["w2"] == before["w2"]
    client.close()


def case_client_killed(c):
    """A client process SIGKILLed while it holds 64 MiB of scattered data.
    Dask: the client's stream ends, the scheduler releases its keys and the
    workers free them."""
    client = c.client()
    names = c.names(client)
    p = ms.start([PY, "-c", client_script(c, (
        "futs = client.scatter([np.full(4 << 20, i, dtype=np.uint8) for i in range(16)])\n"
        "print('scattered', flush=True)\n"
        "time.sleep(600)\n"))], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "scattered"
    held = sum(len(c.worker_keys(client, a)) for a in names.values())
    assert held == 16, held
    p.kill()
    p.wait()
    wait_until("the workers to free the dead client's keys",
               lambda: sum(len(c.worker_keys(client, a)) for a in names.values()) == 0, guard=30)
    assert client.who_has() == {} or not client.who_has(), client.who_has()
    client.close()


def _killed_mid(c, body, delay):
    client = c.client()
    names = c.names(client)
    p = ms.start([PY, "-c", client_script(c, body)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "go"
    time.sleep(delay)
    p.kill()
    p.wait()
    # The scheduler keeps serving: a new round works, nothing is left behind.
    futs = client.scatter([np.arange(1 << 20) + i for i in range(8)])
    back = client.gather(futs)
    assert all((b == np.arange(1 << 20) + i).all() for i, b in enumerate(back))
    del futs, back
    wait_until("the workers to hold no keys",
               lambda: sum(len(c.worker_keys(client, a)) for a in names.values()) == 0, guard=30)
    client.close()


def case_client_killed_mid_scatter(c):
    """A client SIGKILLed while its 512 MiB scatter is on the wire. Dask: the
    scheduler drops the half message; nothing stays behind."""
    _killed_mid(c, "a = [np.full(32 << 20, i, dtype=np.uint8) for i in range(16)]\n"
                   "print('go', flush=True)\nclient.scatter(a)\n", 0.5)


def case_client_killed_mid_gather(c):
    """A client SIGKILLed while the scheduler sends it a 512 MiB gather
    reply. Dask: the write fails, the client's keys are released."""
    _killed_mid(c, "f = client.scatter([np.full(32 << 20, i, dtype=np.uint8) for i in range(16)])\n"
                   "print('go', flush=True)\nwhile True: client.gather(f)\n", 2.0)


def case_scatter_broadcast(c):
    """client.scatter(x, broadcast=True). Dask: every running worker holds
    each key (Scheduler.scatter replicates to all)."""
    client = c.client()
    names = c.names(client)
    futs = client.scatter([1, 2, 3], broadcast=True)
    who = client.who_has(futs)
    got = {k: sorted(v) for k, v in who.items()}
    assert all(len(v) == 4 for v in got.values()), "who_has after broadcast=True: %s" % got
    client.close()


def case_scatter_to_address(c):
    """client.scatter(x, workers=[address]): only that worker holds them.
    Dask: the same."""
    client = c.client()
    names = c.names(client)
    futs = client.scatter(list(range(10)), workers=[names["w2"]])
    got = {a for v in client.who_has(futs).values() for a in v}
    assert got == {names["w2"]}, got
    assert client.gather(futs) == list(range(10))
    client.close()


def case_scatter_to_name(c):
    """client.scatter(x, workers=["w2"]): Dask resolves worker names
    (Scheduler.coerce_address: aliases) and scatters to w2."""
    client = c.client()
    names = c.names(client)
    futs = client.scatter(list(range(10)), workers=["w2"])
    got = {a for v in client.who_has(futs).values() for a in v}
    assert got == {names["w2"]}, got
    client.close()


def case_scatter_to_hostport(c):
    """client.scatter(x, workers=["127.0.0.1:PORT"]) without the scheme
    (tcp only): Dask's coerce_address adds tcp:// and scatters there."""
    if c.transport != "tcp":
        return "skipped (tcp only)"
    client = c.client()
    names = c.names(client)
    hp = names["w3"].split("://", 1)[1]
    futs = client.scatter(list(range(10)), workers=[hp])
    got = {a for v in client.who_has(futs).values() for a in v}
    assert got == {names["w3"]}, got
    client.close()


def case_scatter_direct(c):
    """client.scatter(x, direct=True): the client sends to the workers
    itself and tells the scheduler (update_data). Dask: works."""
    client = c.client()
    futs = client.scatter(list(range(10)), direct=True)
    assert client.gather(futs) == list(range(10))
    assert len(client.who_has(futs)) == 10
    client.close()


def case_gather_direct(c):
    """client.gather(futs, direct=True): who_has, then get_data from the
    workers. Dask: works."""
    client = c.client()
    futs = client.scatter(list(range(1000)))
    assert client.gather(futs, direct=True) == list(range(1000))
    client.close()


def case_gather_missing(c):
    """The scheduler's gather op asked for a key nobody has. Dask replies
    {"status": "error", "keys": {key: []}} at once."""
    client = c.client()
    r = client.sync(client.scheduler.gather, keys=["no-such-key"])
    assert r["status"] == "error" and list(r["keys"]) == ["no-such-key"], r
    client.close()


def case_many_clients(c):
    """32 clients at once, each scattering and gathering its own data.
    Dask: all correct."""
    from distributed import Client
    errors = []

    def one(i):
        try:
            cl = Client(c.addr, timeout=60, **c.client_kw)
            data = [np.full(1 << 16, i, dtype=np.uint8)] + list(range(i * 1000, i * 1000 + 100))
            futs = cl.scatter(data, hash=False)
            back = cl.gather(futs)
            assert (back[0] == i).all() and back[1:] == data[1:]
            cl.close()
        except BaseException as e:
            errors.append("client %d: %r" % (i, e))

    client = c.client()
    ts = [threading.Thread(target=one, args=(i,)) for i in range(32)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(GUARD)
    assert not any(t.is_alive() for t in ts), "a client hung"
    assert not errors, errors[:3]
    assert len(client.scheduler_info()["workers"]) == 4
    client.close()


def case_clients_churn(c):
    """50 clients from 10 processes: each connects, scatters one value,
    and the process leaves without closing them (os._exit). Dask: all
    removed, no keys left."""
    client = c.client()
    names = c.names(client)
    body = ("for i in range(5):\n"
            "    cl = Client(%r, timeout=60, **kw)\n"
            "    cl.scatter([i], hash=False)\n"
            "os._exit(0)\n") % c.addr
    ps = [ms.start([PY, "-c", client_script(c, body)], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL) for _ in range(10)]
    for p in ps:
        p.wait(600)
    wait_until("no keys left on workers",
               lambda: sum(len(c.worker_keys(client, a)) for a in names.values()) == 0, guard=30)
    assert len(client.scheduler_info()["workers"]) == 4
    client.close()


def _worker_dies_during(c, what, delay):
    from concurrent.futures import CancelledError
    client = c.client()
    names = c.names(client)
    arrays = [np.full(32 << 20, i, dtype=np.uint8) for i in range(16)]
    futs = None
    if what == "gather":
        futs = client.scatter(arrays)
    result = {}

    def run():
        try:
            if what == "scatter":
                result["v"] = client.scatter(arrays)
            else:
                result["v"] = client.gather(futs)
        except BaseException as e:
            result["e"] = e

    th = threading.Thread(target=run)
    th.start()
    time.sleep(delay)
    c.workers["w1"].kill()
    t = time.monotonic()
    th.join(GUARD)
    assert not th.is_alive(), "%s hung after the worker died" % what
    took = time.monotonic() - t
    # Afterwards the cluster works with the other 3
    wait_until("w1 removed", lambda: "w1" not in c.names(client), guard=10)
    f2 = client.scatter(list(range(100)), hash=False)
    assert client.gather(f2) == list(range(100))
    client.close()
    e = result.get("e")
    if what == "scatter":
        # Dask: scatter fails with an error naming the dead worker, or succeeds
        # on the others; never a hang.
        return "scatter %s after %.2f s" % ("raised %r" % e if e else "succeeded", took)
    assert e is None or isinstance(e, CancelledError), repr(e)
    return "gather %s after %.2f s" % ("raised %s" % type(e).__name__ if e else "succeeded",
                                        took)


def case_worker_dies_mid_scatter(c):
    """SIGKILL a worker while a 512 MiB scatter is being forwarded. Dask:
    scatter raises (or completes), promptly; the cluster keeps working."""
    return _worker_dies_during(c, "scatter", 0.8)


def case_worker_dies_mid_gather(c):
    """SIGKILL a worker while a 512 MiB gather is collected. Dask: the gather
    fails with CancelledError for the lost keys, promptly."""
    return _worker_dies_during(c, "gather", 0.5)


def case_worker_stopped_mid_gather(c):
    """SIGSTOP a worker, then gather keys it holds: the gather fails at the
    TTL (+1 s), not at the 30 s call timeout or never."""
    from concurrent.futures import CancelledError
    client = c.client()
    futs, mine = scattered_on(c, client, "w3")
    c.workers["w3"].send_signal(signal.SIGSTOP)
    t = time.monotonic()
    mini_procs.raises(CancelledError, "gather from a stopped worker", client.gather, mine)
    took = time.monotonic() - t
    assert took <= c.ttl + 1, "gather failed after %.2f s (TTL %g)" % (took, c.ttl)
    c.workers["w3"].send_signal(signal.SIGCONT)
    client.close()
    return "failed after %.2f s (TTL %g s)" % (took, c.ttl)


def case_shared_keys_two_clients(c):
    """Two clients scatter the same values (hash=True: the same keys); the
    first closes; the second still gathers them. Dask: a key lives while
    any client wants it."""
    a = c.client()
    b = c.client()
    fa = a.scatter([101, 102, 103])
    fb = b.scatter([101, 102, 103])
    assert [f.key for f in fa] == [f.key for f in fb]
    a.close()
    time.sleep(1)  # let the release reach the scheduler and the workers
    assert b.gather(fb) == [101, 102, 103]
    b.close()


def case_scatter_before_workers(c):
    """A client scatters right after connecting, before any worker has
    registered. Dask: Scheduler.scatter waits up to its timeout for a
    running worker, then scatters."""
    client = c.client(n=0)
    futs = client.scatter([1, 2, 3])
    assert client.gather(futs) == [1, 2, 3]
    client.close()


def case_large_keys_count(c):
    """who_has() of everything after 200,000 keys. Dask: a dict of them."""
    client = c.client()
    futs = client.scatter(list(range(200_000)), hash=False)
    w = client.who_has()
    assert len(w) == 200_000, len(w)
    client.close()


CASES = [(n[5:], f) for n, f in sorted(globals().items()) if n.startswith("case_")]


def main():
    global np
    import numpy as np
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("certs")
    ap.add_argument("--transport", default="tcp", choices=["tcp", "tls", "ws"])
    ap.add_argument("--case", action="append", choices=[n for n, _ in CASES])
    ap.add_argument("--ttl", type=float, default=10.0)
    ap.add_argument("--logdir", default=".")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.stdout.reconfigure(line_buffering=True)
    failed = 0
    for name, fn in CASES:
        if a.case and name not in a.case:
            continue
        print("%s/%s: %s" % (a.transport, name, " ".join(fn.__doc__.split())))
        c = Cluster(a, a.transport)
        c.ttl = a.ttl
        t = time.monotonic()
        try:
            note = fn(c)
            alive = c.alive()
            print("  -> %s (%.1f s)%s" % ("ok" if alive else "FAIL: the scheduler died",
                                         time.monotonic() - t, ": " + note if note else ""))
            failed += not alive
        except Exception as e:
            failed += 1
            print("  -> FAIL (%.1f s): %s%s" % (time.monotonic() - t, "".join(
                traceback.format_exception_only(type(e), e)).strip(),
                "" if c.alive() else "; the scheduler died (exit %s)" % c.sched.returncode))
            with open(os.path.join(a.logdir, "scheduler-%s.log" % a.transport)) as f:
                tail = f.readlines()[-8:]
            print("     scheduler log: " + "     ".join(tail), end="")
        finally:
            ms.cleanup()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    try:
        main()
    finally:
        ms.cleanup()
