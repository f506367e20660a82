# SPDX-License-Identifier: BSD-3-Clause
"""tw-mini-scheduler with a memory limit, against real Dask peers.

    python3 mini_scheduler_memory.py SCHEDULER_BINARY [relay]

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
line, the replies, socket queues), each with a hang guard; nothing asserts
a time. One window is a time, because it is the rule under test: the
relay held for the pause limit (paused_workers).

With `relay`, the same scheduler relays payloads (the default 64 KiB
threshold: they stay in the sockets, counted in no budget and no limit)
and has --pause-limit 2000. Asserts: honest scatters and gathers as above;
a raw client reading a relayed 320 MiB gather while both workers are
stopped (SIGSTOP) in the middle of it, held (seen in /proc/net/tcp: the
scheduler's socket to it empty, and its own) for the pause limit and a
second, gets every byte and is not ended (before, the relayed bytes counted in the limit and
the client was ended as a hoarder: user19); a raw client that never reads
its relayed 320 MiB gather is ended after the pause limit (TW_ETIMEDOUT:
it held up the workers' sockets), and only it; both workers stay.
"""
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mini_procs import cleanup, start, wait_until  # noqa: E402
from mini_scheduler import GUARD, WRAP, Log, show_worker_logs, start_workers  # noqa: E402

LIMITS = ["--memory-limit", "256M", "--receive-budget", "64M", "--write-budget", "32M"]
MIB = 1 << 20
PAUSE_S = 2.0  # --pause-limit with relay


def raw_message(msg):
    """msg as Dask's tcp comm writes it: the total length, then the
    frames' prelude and the frames (distributed/comm/tcp.py write)."""
    from distributed.protocol import dumps
    from distributed.protocol.utils import pack_frames_prelude

    frames = dumps(msg)
    prelude = pack_frames_prelude(frames)
    total = len(prelude) + sum(len(f) for f in frames)
    return struct.pack("Q", total) + prelude + b"".join(bytes(f) for f in frames)


def hoarder(port, keys, rcvbuf=4096):
    """A peer that sends the Dask handshake and a gather of keys, then never
    reads (a 4 KiB receive buffer; None: the default, for a reader): its
    socket."""
    from distributed.comm.core import Comm

    s = socket.socket()
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", port))
    s.sendall(raw_message(Comm.handshake_info()))
    s.sendall(raw_message({"op": "gather", "keys": list(keys), "reply": True}))
    return s


def read_reply(sock, got, gate=None):
    """Read one message off sock (Dask's tcp framing: its total length,
    then that many bytes), counting its bytes in got[0]: the total. With a
    gate (threading.Event), it stops once 64 MiB are in until the gate is
    set."""
    head = b""
    while len(head) < 8:
        chunk = sock.recv(8 - len(head))
        assert chunk, "the scheduler closed before the reply's length"
        head += chunk
    total = struct.unpack("Q", head)[0]
    while got[0] < total:
        if gate is not None and got[0] >= 64 * MIB:
            gate.wait()
        chunk = sock.recv(min(1 << 20, total - got[0]))
        assert chunk, "the scheduler closed after %d of %d bytes" % (got[0], total)
        got[0] += len(chunk)
    return total


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


def tcp_queues(local, remote):
    """The (send, receive) queue bytes of the 127.0.0.1 tcp socket from port
    local to port remote (/proc/net/tcp: tx_queue, rx_queue), or None."""
    want = ("0100007F:%04X" % local, "0100007F:%04X" % remote)
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if (fields[1], fields[2]) == want:
                tx, rx = fields[4].split(":")
                return int(tx, 16), int(rx, 16)
    return None


def paused_workers(sched, port, workers, keys):
    """A raw client reads a relayed gather of keys while every worker is
    stopped in the middle of it: once the relay is held (the scheduler has
    nothing left to write to the client, and the client read it all), it
    stays held for the pause limit and the looks that judge it; the client
    gets all of it and its comm is not ended."""
    sock = hoarder(port, keys, rcvbuf=None)
    mine = sock.getsockname()[1]
    got = [0]
    out = []
    gate = threading.Event()

    def reader():
        read_reply(sock, [0])  # the scheduler's handshake
        out.append(read_reply(sock, got, gate))

    def held():
        """The scheduler's socket to the client has nothing queued and the
        client's nothing unread: the relay waits for its stopped sources."""
        theirs, ours = tcp_queues(port, mine), tcp_queues(mine, port)
        return theirs is not None and ours is not None and theirs[0] == 0 and ours[1] == 0

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    # the reader waits at 64 MiB: the workers stop with most of it unsent
    wait_until("64 MiB of the relayed gather", lambda: got[0] >= 64 * MIB or not t.is_alive(),
               guard=GUARD)
    for w in workers.values():
        w.send_signal(signal.SIGSTOP)
    gate.set()
    try:
        wait_until("the relayed gather held by the stopped workers",
                   lambda: held() or not t.is_alive(), guard=GUARD)
        assert t.is_alive(), "the reader ended before the relay was held: %r" % (out,)
        at_held = got[0]
        # The window is the rule under test, not a synchronization: the
        # scheduler ends a peer that took none of its queued bytes for the
        # pause limit (the memory limit looks every 100 ms, the relay stall
        # watch every eighth of the limit). The client's comm, whose writer
        # waits for the relay's stopped sources, must outlive a judgment:
        # the pause limit, plus a second for those looks, from the moment
        # the relay was seen held. Nothing the scheduler prints tells that
        # a look passed it over, so this cannot wait on progress instead.
        time.sleep(PAUSE_S + 1.0)
        # the relay was held all along: the rest waits behind the workers
        assert t.is_alive() and not out, "the gather ended while the workers were stopped"
        print("relay held with %d bytes read, %d after the window" % (at_held, got[0]), flush=True)
    finally:
        for w in workers.values():
            w.send_signal(signal.SIGCONT)
    t.join(GUARD)
    assert not t.is_alive(), "hang guard: the relayed gather's reader after %g s" % GUARD
    assert out and got[0] == out[0] and out[0] > 320 * MIB, (got, out)
    assert sched.log.count(" ended: ") == 0, [ln for ln in sched.log.lines if " ended: " in ln]
    sock.close()
    print("a relayed gather behind stopped workers: all %d bytes, not ended" % got[0], flush=True)


def main():
    binary = sys.argv[1]
    relay = sys.argv[2:] == ["relay"]
    mode = ["--pause-limit", str(int(PAUSE_S * 1000))] if relay else ["--relay", "0"]
    sched = start(WRAP + [binary, "tcp://127.0.0.1:0"] + mode + LIMITS,
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sched.log = Log(sched.stderr)
    line = sched.stdout.readline()
    assert line.startswith("listening on "), line
    addr = line.split()[2]
    port = int(addr.rsplit(":", 1)[1])
    sched.log.wait("memory limit 256 MiB, receive budget 64 MiB, write budget 32 MiB")
    workers = start_workers(addr, ["w0", "w1"], [])

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

    # relayed: the hoarder holds up the workers' sockets, not memory
    end_text = "took none of our bytes" if relay else "ended by the memory limit"

    def ended():
        return sched.log.count(end_text)

    # Honest work: nothing is ended.
    guarded("scatter and gather of 1-64 MiB", honest, client, "1-64 MiB")
    if relay:
        values = [rng.integers(0, 255, size=64 * MIB, dtype=np.uint8) for _ in range(5)]
        big = guarded("a scatter of 320 MiB", lambda: client.scatter(values, hash=False))
        paused_workers(sched, port, workers, [f.key for f in big])
        hoard(sched, client, port, big, end_text, honest)
        return stop(sched, client)
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
    hoard(sched, client, port, big, end_text, honest)
    stop(sched, client)


def hoard(sched, client, port, big, end_text, honest):
    """A gather of big that is never read: its comm alone is ended (the
    log's one line with end_text); the honest client's work goes on beside
    it and after; both workers stay."""
    sock = hoarder(port, [f.key for f in big])
    hoarder_port = sock.getsockname()[1]
    guarded("scatter and gather beside the hoarder", honest, client, "beside the hoarder")
    sched.log.wait(end_text)
    guarded("scatter and gather after the hoarder", honest, client, "after the hoarder")
    lines = [ln for ln in sched.log.lines if end_text in ln]
    assert len(lines) == 1, lines
    err = "out of memory" if end_text == "ended by the memory limit" else "timed out"
    assert "comm from tcp://127.0.0.1:%d ended: %s" % (hoarder_port, err) in lines[0], lines
    assert len(client.scheduler_info()["workers"]) == 2
    assert sched.log.count("was removed") == 0, "a worker was removed"
    sock.close()
    print("the hoarder alone was ended:", lines[0].strip(), flush=True)


def stop(sched, client):
    """The client closes; the scheduler exits 0 on SIGTERM."""
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
