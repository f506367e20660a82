#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Write the seed corpus of tests/fuzz/fuzz_decode.c into corpus/decode/.

Each file is one message in the target's layout: byte 0 = frame count
(bits 0-6) | 0x80 when the frames share one block, then u16le frame
lengths, then the frames. Most seeds are real Dask encodings made by
distributed.protocol.dumps (Debian's python3-distributed: run with
/usr/bin/python3), the rest hand-built bad inputs (zstd frames that lie
about their size or inflate past the limit, msgpack bombs). Rewrites the files it owns and leaves others (crash
reproducers added by hand) alone.
"""
import os
import struct

import msgpack
from distributed.core import error_message
from distributed.protocol import dumps, to_serialize
from distributed.protocol.serialize import ToPickle

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "decode")


def enc(frames, one_block=False):
    frames = [bytes(f) for f in frames]
    assert len(frames) < 128 and all(len(f) < 65536 for f in frames)
    head = bytes([len(frames) | (0x80 if one_block else 0)])
    return head + b"".join(struct.pack("<H", len(f)) for f in frames) + b"".join(frames)


def pattern(n, seed=0):
    return bytes((i + seed) % 251 for i in range(n))


def sub(num, compression=None, **extra):
    h = {"serializer": "dask", "num-sub-frames": num}
    if compression is not None:
        h["compression"] = compression
    h.update(extra)
    return msgpack.dumps(h)


FRAME0 = msgpack.dumps({"op": "echo", "data": {"__Serialized__": 1}})


def raise_error():
    try:
        raise RuntimeError("fuzz seed")
    except RuntimeError as e:
        return error_message(e, status="uncaught-error")


def corpus():
    big = pattern(3000, 5)
    comp = pattern(20000)
    return {
        "valid-plain-map": enc([msgpack.dumps({"op": "identity", "reply": True})]),
        "valid-bytes": enc(dumps({"op": "echo", "data": to_serialize(b"hello world")})),
        "valid-nested": enc(dumps({
            "op": "x",
            "a": [to_serialize(b"one"), {"b": to_serialize(pattern(40))}],
            "c": {"d": to_serialize(b"")},
        })),
        "valid-split-one-block": enc(dumps({"data": to_serialize(big)}, frame_split_size=1000),
                                     one_block=True),
        "valid-split-separate": enc(dumps({"data": to_serialize(big)}, frame_split_size=1000)),
        "valid-zstd": enc(dumps({"data": to_serialize(comp)}, context={"compression": "zstd"})),
        "valid-lz4": enc(dumps({"data": to_serialize(comp)}, context={"compression": "lz4"})),
        "valid-pickled": enc(dumps({"x": ToPickle([1, 2, 3])})),
        "valid-error-reply": enc(dumps(raise_error())),
        "valid-msgpack-serializer": enc([FRAME0, msgpack.dumps(
            {"serializer": "msgpack", "num-sub-frames": 1, "compression": [None]}),
            msgpack.dumps([1, "two", None])]),
        "valid-bh32a-streaming-zstd": enc([FRAME0, sub(1, ["zstd"]), bytes.fromhex(
            "28b52ffd045829000068656c6c6fa36d9f88")]),
        "bad-bh31a-claims-100mib": enc([FRAME0, sub(3, ["zstd"] * 3, **{
            "split-num-sub-frames": [3], "split-offsets": [0]})] + [bytes.fromhex(
                "28b52ffde00000400600000000090000" "41")] * 3),
        "bad-num-sub-frames": enc([FRAME0, sub(5), b"abc"]),
        "bad-index-past-end": enc([msgpack.dumps({"data": {"__Serialized__": 9}}), sub(1), b"x"]),
        "bad-nesting-33": enc([b"\x91" * 33 + b"\x01"]),
        "bad-array-huge": enc([b"\xdd\xff\xff\xff\xff\x01\x02\x03\x04\x05"]),
        "bad-utf8": enc([b"\x81\xa2op\xa2\xc3\x28"]),
        "bad-lz4-prefix": enc([FRAME0, sub(1, ["lz4"]), b"\xff\xff\xff\xff\x10\x41"]),
        "bad-unknown-codec": enc([FRAME0, sub(1, ["brotli"]), b"abc"]),
    }


def main():
    os.makedirs(HERE, exist_ok=True)
    for name, data in corpus().items():
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
