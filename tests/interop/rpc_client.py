# SPDX-License-Identifier: BSD-3-Clause
"""Python's distributed.core.rpc against a taskwire server (tests/check_rpc_dask.c).

    /usr/bin/python3 rpc_client.py ADDR [--tls CA CERT KEY] [--big BYTES] [--many N]

The server has the ops of examples/tw-rpc-server: identity, echo(data),
sum(data), nbytes(data), slow(delay), fail(), and the built-in close.
Checks, one line each ("ok NAME" or "FAIL NAME: why"):
  identity          {"type": "taskwire", "id": "taskwire-..."}
  echo inline       bytes sent inline (msgpack bin) come back equal
  echo oob          to_serialize(bytes) of 1,000 and BIG bytes come back equal
  sum               float64 arrays sent out of band (numpy, to_serialize)
  nbytes            the server sees BIG bytes
  fail              the call raises, with the server's exception text
  unknown           an op the server does not have returns None
  slow              four concurrent slow(0.1) calls return "done"
  echo many         (--many N) a dict of N out-of-band values comes back equal: one
                    message of 2N+1 frames each way, as a gather of N small results
  close op          {"op": "close"} -> "OK", then the server closes the comm
  close flag        echo with close=True -> the data, then the server closes
  identity again    the server still answers
Exits 0 and prints "ALL OK n" when every check passed, 1 otherwise.
"""
import argparse
import asyncio
import sys

import numpy as np
from distributed.comm import CommClosedError, connect
from distributed.core import rpc
from distributed.protocol import to_serialize
from distributed.security import Security

from peer_common import pattern

class Checks:
    def __init__(self):
        self.failed = 0
        self.passed = 0

    def check(self, name, ok, why=""):
        if ok:
            self.passed += 1
            print("ok", name, flush=True)
        else:
            self.failed += 1
            print("FAIL %s: %s" % (name, why), flush=True)


def short(v):
    if isinstance(v, (bytes, bytearray, memoryview)):
        return "%s of %d bytes" % (type(v).__name__, len(v))
    return repr(v)[:200]


async def rpc_checks(c, addr, args, big, many):
    async with rpc(addr, connection_args=args) as r:
        ident = await r.identity()
        c.check("identity", isinstance(ident, dict) and ident.get("type") == "taskwire"
                and str(ident.get("id", "")).startswith("taskwire-"), short(ident))
        data = b"taskwire \x00\xff inline"
        got = await r.echo(data=data)
        c.check("echo inline", got == data, short(got))
        for n in (1000, big):
            data = pattern(n, 7)
            got = await r.echo(data=to_serialize(data))
            c.check("echo oob %d B" % n, bytes(got) == data, short(got))
        for n in (1000, big // 8):
            arr = np.arange(n, dtype="float64")
            got = await r.sum(data=to_serialize(arr))
            want = float(n) * (n - 1) / 2
            c.check("sum of %d float64" % n, got == want, "%r != %r" % (got, want))
        got = await r.nbytes(data=to_serialize(pattern(big)))
        c.check("nbytes", got == big, short(got))
        try:
            got = await r.fail()
            c.check("fail", False, "returned %s" % short(got))
        except Exception as e:  # the server's uncaught-error reply
            c.check("fail", "fail: this op always fails" in str(e), repr(e))
        got = await r.no_such_op()
        c.check("unknown", got is None, short(got))
        got = await asyncio.gather(*[r.slow(delay=0.1) for _ in range(4)])
        c.check("slow", list(got) == ["done"] * 4, short(got))
        if many:
            data = {"k%d" % i: b"v%d" % i for i in range(many)}
            try:
                got = await r.echo(data={k: to_serialize(v) for k, v in data.items()})
                c.check("echo many", got == data, "%d keys back" % len(got))
            except Exception as e:  # the old default frame limit: the comm dropped
                c.check("echo many", False, repr(e))


async def expect_closed(comm):
    try:
        got = await asyncio.wait_for(comm.read(), 20)
        return "read %s" % short(got)
    except CommClosedError:
        return None


async def close_checks(c, addr, args):
    comm = await connect(addr, **args)
    await comm.write({"op": "close", "reply": True})
    got = await comm.read()
    why = await expect_closed(comm) if got == "OK" else "reply %s" % short(got)
    c.check("close op", why is None, why)
    await comm.close()
    comm = await connect(addr, **args)
    await comm.write({"op": "echo", "data": b"last", "close": True, "reply": True})
    got = await comm.read()
    why = await expect_closed(comm) if got == b"last" else "reply %s" % short(got)
    c.check("close flag", why is None, why)
    await comm.close()
    async with rpc(addr, connection_args=args) as r:
        ident = await r.identity()
        c.check("identity again", ident.get("type") == "taskwire", short(ident))


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("addr")
    ap.add_argument("--tls", nargs=3, metavar=("CA", "CERT", "KEY"))
    ap.add_argument("--big", type=int, default=20_000_000)
    ap.add_argument("--many", type=int, default=0)
    a = ap.parse_args()
    args = {}
    if a.tls:
        sec = Security(tls_ca_file=a.tls[0], tls_client_cert=a.tls[1],
                       tls_client_key=a.tls[2], require_encryption=True)
        args = sec.get_connection_args("client")
    c = Checks()
    await asyncio.wait_for(rpc_checks(c, a.addr, args, a.big, a.many), 240)
    await asyncio.wait_for(close_checks(c, a.addr, args), 60)
    if c.failed:
        print("FAILED %d of %d" % (c.failed, c.failed + c.passed), flush=True)
        return 1
    print("ALL OK", c.passed, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
