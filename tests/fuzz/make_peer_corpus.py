#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Write the seed corpora of tests/fuzz/fuzz_handshake.c and fuzz_server.c
into corpus/handshake/, corpus/server/ and corpus/stream_dispatch/.

Each file is byte 0 (the target's flags, see the targets) then messages in
tests/fuzz/fuzz_peer.h's layout: a byte n (frame count), n u16le frame
lengths, then the frames. Frames are real Dask encodings made by
distributed.protocol.dumps (Debian's python3-distributed: run with
/usr/bin/python3) and hand-built bad ones. Rewrites the files it owns and
leaves others (crash reproducers, inputs merged in by
scripts/fuzz-long.sh) alone.
"""
import os
import struct

import msgpack
from distributed.protocol import dumps, to_serialize

TOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def msg(frames):
    frames = [bytes(f) for f in frames]
    assert 0 < len(frames) < 16 and all(len(f) < 65536 for f in frames)
    return (bytes([len(frames)]) + b"".join(struct.pack("<H", len(f)) for f in frames)
            + b"".join(frames))


def mp(obj):
    return msg([msgpack.dumps(obj)])


def hs(compression=None, pickle=5, **extra):
    d = {"compression": compression, "python": [3, 11, 2], "pickle-protocol": pickle}
    d.update(extra)
    return mp(d)


def pattern(n, seed=0):
    return bytes((i + seed) % 251 for i in range(n))


def handshake():
    out = {}
    for side in (0, 1):
        for z in (0, 2):
            f = bytes([side | z])
            k = "%s-%s" % ("listener" if side else "connector", "zstd" if z else "none")
            out[k + "-nil"] = f + hs()
            out[k + "-zstd"] = f + hs("zstd")
            out[k + "-then-requests"] = f + hs("zstd") + mp({"op": "identity"}) + msg(
                dumps({"op": "echo", "data": to_serialize(pattern(300))}))
    f = b"\x01"
    out["lz4"] = f + hs("lz4")
    out["false"] = f + hs(False)
    out["unknown-codec"] = f + hs("snappy")
    out["pickle-4"] = f + hs(None, 4)
    out["pickle-negative"] = f + hs(None, -1)
    out["pickle-str"] = f + hs(None, "5")
    out["no-compression"] = f + mp({"python": [3, 11, 2], "pickle-protocol": 5})
    out["no-pickle"] = f + mp({"compression": None})
    out["not-a-map"] = f + mp([1, 2, 3])
    out["empty"] = b"\x00"
    out["bad-msgpack"] = f + msg([b"\x83\xa1"])
    out["zero-frames"] = f + b"\x00"
    out["serialized-payload"] = f + msg(dumps({
        "compression": None, "pickle-protocol": 5, "x": to_serialize(pattern(100))}))
    out["zstd-payload"] = b"\x03" + msg(dumps({
        "compression": "zstd", "pickle-protocol": 5, "x": to_serialize(pattern(20000))},
        context={"compression": "zstd"}))
    return out


def server():
    out = {}
    for flags in (0, 1, 3):
        f = bytes([flags])
        out["identity-%d" % flags] = f + mp({"op": "identity"})
        out["echo-serialized-%d" % flags] = f + msg(
            dumps({"op": "echo", "data": to_serialize(pattern(2000))}))
    f = b"\x00"
    out["echo-plain"] = f + mp({"op": "echo", "data": b"hello"})
    out["echo-zstd"] = b"\x03" + msg(dumps(
        {"op": "echo", "data": to_serialize(pattern(20000))}, context={"compression": "zstd"}))
    out["echo-split"] = f + msg(dumps(
        {"op": "echo", "data": to_serialize(pattern(3000))}, frame_split_size=1000))
    out["fail"] = f + mp({"op": "fail"})
    out["later"] = f + mp({"op": "later"}) + mp({"op": "identity"})
    out["back"] = f + msg(dumps({"op": "back", "a": [to_serialize(b"one"), {"b": 2}]}))
    out["bytes"] = f + msg(dumps({"op": "bytes", "data": to_serialize(pattern(50))}))
    out["bytes-plain"] = f + mp({"op": "bytes", "data": b"xyz"})
    out["close"] = f + mp({"op": "close"}) + mp({"op": "identity"})
    out["close-flag"] = f + mp({"op": "identity", "close": True}) + mp({"op": "identity"})
    out["no-reply"] = f + mp({"op": "identity", "reply": False}) + mp({"op": "identity"})
    out["unknown-op"] = f + mp({"op": "nosuch"})
    out["not-a-map"] = f + mp([1, 2]) + mp({"op": "identity"})
    out["no-op"] = f + mp({"x": 1})
    out["op-int"] = f + mp({"op": 5})
    out["pipelined"] = f + b"".join(mp({"op": op}) for op in
                                    ("identity", "later", "fail", "nosuch", "identity"))
    out["request-then-bad"] = f + mp({"op": "identity"}) + b"\x00"
    out["connection-stream"] = f + mp({"op": "connection_stream", "reply": False}) + mp(
        {"op": "count"})
    out["raw-handshake"] = b"\x04" + hs() + mp({"op": "identity"})
    out["raw-bad-handshake"] = b"\x04" + mp({"op": "identity"})
    return out


def stream():
    out = {}
    f = b"\x00"
    out["count"] = f + mp({"op": "count"})
    out["batch"] = f + mp([{"op": "count"}, {"op": "look", "x": b"abc"}, {"op": "nosuch"}])
    out["look-serialized"] = f + msg(dumps([{"op": "look", "x": to_serialize(pattern(500))}]))
    out["look-zstd"] = b"\x03" + msg(dumps(
        [{"op": "look", "x": to_serialize(pattern(20000))}], context={"compression": "zstd"}))
    out["abort"] = f + mp([{"op": "count"}, {"op": "abort"}, {"op": "count"}])
    out["close-stream"] = f + mp([{"op": "count"}, {"op": "close-stream"}, {"op": "count"}]) + mp(
        {"op": "count"})
    out["not-a-map"] = f + mp(5)
    out["list-of-non-maps"] = f + mp([1, "x", None, {"op": "count"}])
    out["no-op"] = f + mp({"x": 1})
    out["many"] = f + b"".join(mp([{"op": "count"}] * i) for i in range(1, 6))
    return out


def main():
    for name, gen in (("handshake", handshake), ("server", server),
                      ("stream_dispatch", stream)):
        d = os.path.join(TOP, name)
        os.makedirs(d, exist_ok=True)
        for k, v in gen().items():
            with open(os.path.join(d, "seed-" + k), "wb") as fh:
                fh.write(v)


if __name__ == "__main__":
    main()
