# SPDX-License-Identifier: BSD-3-Clause
"""Real Dask peers against tw-mini-scheduler (issue 16).

    python3 mini_scheduler.py SCHEDULER_BINARY tcp|tls|ws [CERT_DIR]

Starts tw-mini-scheduler, 4 `dask worker` processes and a distributed.Client,
and asserts: scheduler_info lists the 4 workers; scatter + gather of numpy
arrays come back byte-identical; who_has and ncores; 100,000 small keys;
a SIGKILLed worker leaves and a gather of its keys fails (CancelledError)
instead of hanging; scatter with broadcast=True and with direct=True; a
SIGSTOPped worker is removed at the worker TTL, and
a gather of its keys started while it is stopped fails then.

The SIGSTOP case runs on a second scheduler with a short TTL (5 s) and 2
workers of its own, started after the first cluster's rounds: a worker busy
storing 25,000 keys (or starved of CPU by them) sends no heartbeat for
seconds, so the first scheduler keeps Dask's long default TTL. Waits are on progress (poll until...), each with a generous hang guard; the
times it measures are printed, not asserted. Every process it starts is
killed on the way out, on failure too.
"""
import os
import signal
import subprocess
import sys
import time

PY = "/usr/bin/python3"
# TW_MINI_KEYS: the small-key round's size; TW_MINI_WRAP: a command the
# schedulers run under (e.g. "valgrind --error-exitcode=9"), whose exit
# status must be 0 after SIGTERM.
NKEYS = int(os.environ.get("TW_MINI_KEYS", "100000"))
WRAP = os.environ.get("TW_MINI_WRAP", "").split()
TTL = 5.0  # --worker-ttl of the SIGSTOP cluster
GUARD = 60.0  # hang guard for any one wait

procs = []

# `dask worker`, except that a server given no address binds 127.0.0.1:
# Dask 2022.12.1's ws listener (comm/ws.py WSListener.start) calls
# HTTPServer.listen(port) with no address, so a ws worker bound every
# interface and gave the scheduler a non-loopback contact address.
WORKER = """
import sys, tornado.tcpserver
listen = tornado.tcpserver.TCPServer.listen
def loopback_listen(self, port, address=None, *a, **kw):
    return listen(self, port, address or "127.0.0.1", *a, **kw)
tornado.tcpserver.TCPServer.listen = loopback_listen
sys.argv[0] = "dask-worker"
from distributed.cli.dask_worker import main
main()
"""


def start(args, **kw):
    p = subprocess.Popen(args, **kw)
    procs.append(p)
    return p


def cleanup():
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
            pass


def wait_until(what, pred, guard=GUARD, step=0.02):
    end = time.monotonic() + guard
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError("hang guard: still waiting for " + what)
        time.sleep(step)


def start_cluster(binary, transport, certs, ttl, names):
    """A scheduler and `dask worker`s named `names`: (address, {name: Popen}, security)."""
    sched_args = WRAP + [binary, transport + "://127.0.0.1:0", "--worker-ttl", str(ttl)]
    worker_tls = []
    security = None
    if transport == "tls":
        ca, cert, key = (os.path.join(certs, f) for f in ("ca.pem", "cert.pem", "key.pem"))
        sched_args += ["--tls-ca", ca, "--tls-cert", cert, "--tls-key", key]
        worker_tls = ["--tls-ca-file", ca, "--tls-cert", cert, "--tls-key", key]
        from distributed.security import Security

        security = Security(
            tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key, require_encryption=True
        )
    sched = start(sched_args, stdout=subprocess.PIPE, text=True)
    line = sched.stdout.readline()
    assert line.startswith("listening on "), line
    addr = line.split()[2]
    print("scheduler", addr, "TTL", ttl, flush=True)
    workers = {}
    for name in names:
        workers[name] = start(
            [PY, "-c", WORKER, addr, "--name", name, "--nthreads", "1", "--no-nanny",
             "--no-dashboard", "--host", "127.0.0.1"] + worker_tls,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers["scheduler"] = sched
    return addr, workers, security


def running_workers(client, n):
    """Wait until the scheduler lists n running workers; {name: address}."""
    def ident():
        return client.sync(client.scheduler.identity)["workers"]
    wait_until("%d running workers" % n,
               lambda: len([w for w in ident().values() if w["status"] == "running"]) == n)
    return {w["name"]: a for a, w in ident().items()}


def main():
    binary, transport = sys.argv[1], sys.argv[2]
    certs = sys.argv[3] if len(sys.argv) > 3 else None
    addr, workers, security = start_cluster(binary, transport, certs, 300,
                                            ["w0", "w1", "w2", "w3"])

    import numpy as np
    from distributed import Client
    from concurrent.futures import CancelledError

    client = Client(addr, security=security, timeout=GUARD)

    def ident():
        return client.sync(client.scheduler.identity)["workers"]

    # 1. registration: scheduler_info lists the 4 workers, running
    running_workers(client, 4)
    client.sync(client._update_scheduler_info)
    info = client.scheduler_info()
    assert info["type"] == "Scheduler" and info["address"] == addr, info
    assert sorted(w["name"] for w in info["workers"].values()) == ["w0", "w1", "w2", "w3"], info
    by_name = {w["name"]: a for a, w in info["workers"].items()}
    assert client.ncores() == {a: 1 for a in by_name.values()}, client.ncores()
    print("scheduler_info: 4 workers", flush=True)

    # 2. scatter + gather, byte-identical; who_has
    rng = np.random.default_rng(16)
    arrays = [rng.integers(0, 256, size=(1 << 20) + i, dtype=np.uint8) for i in range(16)]
    futures = client.scatter(arrays)
    who = client.who_has(futures)
    assert set(who) == {f.key for f in futures}, who
    holders = {a for v in who.values() for a in v}
    assert holders == set(by_name.values()), who  # round robin: every worker got some
    back = client.gather(futures)
    assert all(a.dtype == b.dtype and a.tobytes() == b.tobytes() for a, b in zip(arrays, back))
    print("scatter+gather of 16 arrays: identical; who_has ok", flush=True)

    # 3. 100,000 small keys
    t = time.monotonic()
    small = client.scatter(list(range(NKEYS)), hash=False)
    assert client.gather(small) == list(range(NKEYS))
    print("%d keys scatter+gather: %.1f s" % (NKEYS, time.monotonic() - t), flush=True)
    del small

    # 4. SIGKILL: the worker leaves, gather of keys only it held fails
    victim = by_name["w0"]
    lost = [f for f in futures if list(who[f.key]) == [victim]]
    assert lost, who
    workers["w0"].kill()
    t = time.monotonic()
    wait_until("the SIGKILLed worker to leave", lambda: victim not in ident())
    print("SIGKILL: worker gone after %.3f s" % (time.monotonic() - t), flush=True)
    t = time.monotonic()
    try:
        client.gather(lost, direct=False)
    except CancelledError:
        pass
    else:
        raise AssertionError("gather of a lost key succeeded")
    print("SIGKILL: gather of its keys failed (CancelledError) after %.3f s"
          % (time.monotonic() - t), flush=True)
    keep = [f for f in futures if f not in lost and victim not in who[f.key]]
    back = client.gather(keep)
    assert all(a.tobytes() == b.tobytes()
               for a, b in zip([arrays[futures.index(f)] for f in keep], back))
    assert len(ident()) == 3

    client.close()

    # 5. SIGSTOP: removed at the TTL; a gather waiting on it fails then.
    # Its cluster starts now, when the first is idle: with a short TTL, a
    # worker starved of CPU by the 100,000-key round (load 50 on 2 CPUs)
    # missed its heartbeats for 2 s and was removed before the test began.
    addr2, workers2, _ = start_cluster(binary, transport, certs, TTL, ["s0", "s1"])
    client = Client(addr2, security=security, timeout=GUARD)
    by_name = running_workers(client, 2)
    # broadcast: every worker holds every key (Dask: scatter, then replicate)
    b = client.scatter([b"x" * 100, b"y" * 100], broadcast=True, hash=False)
    who = client.who_has(b)
    assert all(sorted(v) == sorted(by_name.values()) for v in who.values()), who
    assert client.gather(b) == [b"x" * 100, b"y" * 100]
    # direct: the client calls update_data on workers itself, then tells the
    # scheduler (its update_data op); the scheduler gathers them all the same
    d = client.scatter(list(range(10)), direct=True, hash=False)
    who = client.who_has(d)
    assert all(len(v) == 1 for v in who.values()) and len(who) == 10, who
    assert client.gather(d, direct=False) == list(range(10))
    # workers= by name, and (tcp) by host:port without the scheme, as Dask's
    # coerce_address reads them
    n = client.scatter([b"named"], workers=["s1"], hash=False)
    assert list(client.who_has(n).values()) == [(by_name["s1"],)], client.who_has(n)
    if transport == "tcp":
        h = client.scatter([b"hostport"], workers=[by_name["s1"][6:]], hash=False)
        assert list(client.who_has(h).values()) == [(by_name["s1"],)], client.who_has(h)
    del b, d, n
    print("broadcast, direct, by name and by host:port scatter: ok", flush=True)
    futures = client.scatter(arrays[:4])
    who = client.who_has(futures)
    victim = by_name["s0"]
    lost = [f for f in futures if list(who[f.key]) == [victim]]
    assert lost, who
    workers2["s0"].send_signal(signal.SIGSTOP)
    t = time.monotonic()
    try:
        client.gather(lost)
    except CancelledError:
        pass
    else:
        raise AssertionError("gather from a stopped worker succeeded")
    waited = time.monotonic() - t
    idents = client.sync(client.scheduler.identity)["workers"]
    assert list(idents) == [by_name["s1"]], idents
    print("SIGSTOP: gather failed and worker removed after %.3f s (TTL %.1f s)"
          % (waited, TTL), flush=True)
    client.close()
    # The schedulers stop cleanly on SIGTERM (under TW_MINI_WRAP too).
    for sched in (workers["scheduler"], workers2["scheduler"]):
        sched.send_signal(signal.SIGTERM)
        out = sched.communicate(timeout=GUARD)[0]
        print(out.strip(), flush=True)
        assert sched.returncode == 0, sched.returncode
    print("all assertions passed over", transport, flush=True)


if __name__ == "__main__":
    try:
        main()
    finally:
        cleanup()
