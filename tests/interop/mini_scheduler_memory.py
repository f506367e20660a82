# SPDX-License-Identifier: BSD-3-Clause
"""tw-mini-scheduler with a memory limit, against real Dask peers.

    python3 mini_scheduler_memory.py SCHEDULER_BINARY

The scheduler runs over tcp with --memory-limit 256M --receive-budget 64M
--write-budget 32M and --relay 0 (payloads pass through its memory, where
the limit applies), with 2 `dask worker` processes. Asserts: a
distributed.Client's scatters and gathers of numpy arrays of 1-64 MiB (127
MiB in one message), two clients at once, and a broadcast, all come back
byte-identical with no comm ended; a client that asks for a gather of 320
MiB and never reads (a raw socket that sent the Dask handshake and the
request) is ended by the memory limit (TW_ENOMEM: the scheduler logs
"ended by the memory limit" for its comm, and for no other), while the
honest client's scatters and gathers go on, during and after; both workers
stay; the scheduler exits 0 on SIGTERM. Waits are on progress (the log
line, the replies), each with a hang guard; nothing asserts a time.
"""
import os
import socket
import struct
import subprocess
import sys
import threading

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mini_procs import cleanup, start  # noqa: E402
from mini_scheduler import GUARD, WRAP, Log, show_worker_logs, start_workers  # noqa: E402

LIMITS = ["--memory-limit", "256M", "--receive-budget", "64M", "--write-budget", "32M"]
MIB = 1 << 20


def raw_message(msg):
    """msg as Dask's tcp comm writes it: the total length, then the
    frames' prelude and the frames (distributed/comm/tcp.py write)."""
    from distributed.protocol import dumps
    from distributed.protocol.utils import pack_frames_prelude

    frames = dumps(msg)
    prelude = pack_frames_prelude(frames)
    total = len(prelude) + sum(len(f) for f in frames)
    return struct.pack("Q", total) + prelude + b"".join(bytes(f) for f in frames)


def hoarder(port, keys):
    """A peer that sends the Dask handshake and a gather of keys, then never
    reads (a 4 KiB receive buffer): its socket."""
    from distributed.comm.core import Comm

    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(raw_message(Comm.handshake_info()))
    s.sendall(raw_message({"op": "gather", "keys": list(keys), "reply": True}))
    return s


def guarded(what, fn, *args):
    """fn(*args) in a thread, waited for at most GUARD seconds (a hang
    guard, not a measurement): its value, or its exception raised here."""
    out = []

    def run():
        try:
            out.append((True, fn(*args)))
        except BaseException as e:  # noqa: BLE001 (raised below)
            out.append((False, e))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(GUARD)
    assert out, "hang guard: still waiting after %g s for %s" % (GUARD, what)
    if not out[0][0]:
        raise out[0][1]
    return out[0][1]


def main():
    binary = sys.argv[1]
    sched = start(WRAP + [binary, "tcp://127.0.0.1:0", "--relay", "0"] + LIMITS,
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sched.log = Log(sched.stderr)
    line = sched.stdout.readline()
    assert line.startswith("listening on "), line
    addr = line.split()[2]
    port = int(addr.rsplit(":", 1)[1])
    sched.log.wait("memory limit 256 MiB, receive budget 64 MiB, write budget 32 MiB")
    start_workers(addr, ["w0", "w1"], [])

    import numpy as np
    from distributed import Client

    client = Client(addr, timeout=GUARD)
    client.wait_for_workers(2, timeout=GUARD)
    rng = np.random.default_rng(17)
    arrays = [rng.integers(0, 255, size=m * MIB, dtype=np.uint8) for m in (1, 2, 4, 8, 16, 32, 64)]

    # hash=False: fresh keys each time (with Dask's default the same arrays
    # scattered again share keys with futures still being released).
    def honest(c, what):
        futs = c.scatter(arrays, hash=False)
        back = c.gather(futs)
        assert all(np.array_equal(a, b) for a, b in zip(arrays, back)), what
        del futs, back

    def ended():
        return sched.log.count("ended by the memory limit")

    # Honest work: nothing is ended.
    guarded("scatter and gather of 1-64 MiB", honest, client, "1-64 MiB")
    f = guarded("a broadcast", lambda: client.scatter(arrays[5], broadcast=True, hash=False))
    assert np.array_equal(guarded("its gather", client.gather, f), arrays[5]), "broadcast of 32 MiB"
    del f
    other = Client(addr, timeout=GUARD)
    errors = []

    def run(c, what):
        try:
            honest(c, what)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append("%s: %r" % (what, e))

    ts = [threading.Thread(target=run, args=(c, "client %d at once" % i))
          for i, c in enumerate((client, other))]
    [t.start() for t in ts]
    for t in ts:
        t.join(GUARD)
        assert not t.is_alive(), "hang guard: a client's scatter and gather took over %g s" % GUARD
    assert errors == [], errors
    other.close()
    assert ended() == 0, "an honest comm was ended by the memory limit"
    print("honest scatters and gathers: right, none ended", flush=True)

    # A gather of 320 MiB that is never read: its comm alone is ended.
    values = [rng.integers(0, 255, size=64 * MIB, dtype=np.uint8) for _ in range(5)]
    big = guarded("a scatter of 320 MiB", lambda: client.scatter(values, hash=False))
    sock = hoarder(port, [f.key for f in big])
    hoarder_port = sock.getsockname()[1]
    guarded("scatter and gather beside the hoarder", honest, client, "beside the hoarder")
    sched.log.wait("ended by the memory limit")
    guarded("scatter and gather after the hoarder", honest, client, "after the hoarder")
    lines = [ln for ln in sched.log.lines if "ended by the memory limit" in ln]
    assert len(lines) == 1, lines
    assert "comm from tcp://127.0.0.1:%d ended: out of memory" % hoarder_port in lines[0], lines
    assert len(client.scheduler_info()["workers"]) == 2
    assert sched.log.count("was removed") == 0, "a worker was removed"
    sock.close()
    print("the hoarder alone was ended:", lines[0].strip(), flush=True)
    client.close()

    sched.send_signal(15)
    sched.wait(timeout=GUARD)
    print(sched.stdout.read().strip(), flush=True)
    assert sched.returncode == 0, sched.returncode
    print("all assertions passed (memory limit)", flush=True)


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        show_worker_logs()
        raise
    finally:
        cleanup()
