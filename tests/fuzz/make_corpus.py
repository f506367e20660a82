#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Write the seed corpus of tests/fuzz/fuzz_stream.c into corpus/stream/.

Each file is a byte stream a peer could send over tcp (docs/design.md,
Receive path (tcp)): u64le total | u64le N | u64le len_0 .. len_N-1 | frames. Valid
messages of several shapes, and one file per kind of bad prelude (the
fuzz target runs with 1 MiB and 1,024-frame limits), and streams for the
read-ahead receivers (gulp-*: runs of small messages, pipelined, then
mispredicted large messages, bad heads right after a run or inside the
read-ahead block, truncation inside it). Run it from anywhere;
it rewrites the files it owns and leaves others (crash reproducers added
by hand) alone.
"""
import os
import struct

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "stream")


def u64(*vals):
    return b"".join(struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF) for v in vals)


def msg(*frames):
    n = len(frames)
    total = 8 + 8 * n + sum(len(f) for f in frames)
    return u64(total, n, *(len(f) for f in frames)) + b"".join(frames)


def pattern(i, n):
    return bytes((i * 31 + j) % 251 for j in range(n))


def small(k, i=0):
    """A one-frame message of k payload bytes."""
    return msg(pattern(i, k))


RUN = b"".join(small(28, i) for i in range(3))  # two small ones switch read-ahead on

CORPUS = {
    "valid-one-empty-frame": msg(b""),
    "valid-one-byte": msg(b"x"),
    "valid-three-frames": msg(b"hi", b"", b"xyz"),
    "valid-many-frames": msg(*(pattern(i, i % 23) for i in range(100))),
    "valid-mixed-large": msg(pattern(0, 10), pattern(1, 300), b"", pattern(3, 70), pattern(4, 2)),
    "valid-back-to-back": msg(b"a", b"") + msg(pattern(1, 200)) + msg(b"", b"", b"z"),
    "valid-then-truncated": msg(b"ok") + msg(pattern(0, 50), pattern(1, 50))[:70],
    "bad-zero-frames": u64(8, 0),
    "bad-zero-frames-room": u64(16, 0, 0),
    "bad-too-many-frames": u64(8 + 8 * 1025, 1025),
    "bad-too-big": bytes.fromhex("f0ffffffffffffff"),
    "bad-too-big-1gib": u64(16 + (1 << 30), 1, 1 << 30),
    "bad-total-too-small": u64(16, 2, 0, 0),
    "bad-total-below-8": u64(7, 1),
    "bad-length-overflow": u64(8 + 16 + 16, 2, 0x20, 0xFFFFFFFFFFFFFFF0) + bytes(16),
    "bad-length-mismatch": u64(8 + 16 + 10, 2, 3, 4) + bytes(10),
    "bad-envelope-form": bytes.fromhex("0100000000000000ffffffffffffff7f"),
    "bad-after-valid": msg(b"first") + u64(8, 0),
    # read-ahead (gulp) paths
    "gulp-pipelined-small": b"".join(small(i % 40, i) for i in range(200)),
    "gulp-pipelined-tiny": b"".join(msg(b"") if i % 3 else small(1, i) for i in range(300)),
    "gulp-pipelined-frames": b"".join(msg(b"a", b"", pattern(i, 5)) for i in range(100)),
    "gulp-body-equals-block": b"".join(small(56, i) for i in range(20)),  # body 64 = block
    "gulp-sizes-grow": b"".join(small(k, k) for k in (20, 20, 100, 200, 1000, 4000, 4080,
                                                      4088, 4089, 4200, 20, 20, 20)),
    "gulp-sizes-shrink": b"".join(small(k, k) for k in (4000, 4000, 3000, 20, 1, 4000, 4000)),
    "gulp-mispredict-large": RUN + msg(pattern(0, 3), pattern(1, 70000)) + RUN,
    "gulp-mispredict-many-frames": RUN + msg(*(pattern(i, 40) for i in range(900))) + RUN,
    "gulp-mispredict-near-small": RUN + small(64 * 1024 - 8) + small(64 * 1024 - 7) + RUN,
    "gulp-large-after-run-then-run": (RUN + msg(pattern(0, 1), pattern(1, 100000), b"")) * 2
    + RUN,
    "gulp-bad-n0-after-run": RUN + u64(16, 0),
    "gulp-bad-toobig-after-run": RUN + u64(2 << 20, 1, (2 << 20) - 16),
    "gulp-bad-toomany-after-run": RUN + u64(8 + 8 * 1025, 1025),
    "gulp-bad-total-below-8-after-run": RUN + u64(7, 1),
    "gulp-bad-head-in-carry": b"".join(small(1, i) for i in range(4)) + u64(16, 0),
    "gulp-bad-toobig-in-carry": b"".join(small(1, i) for i in range(4)) + u64(2 << 20, 1),
    "gulp-bad-lengths-in-carry": b"".join(small(1, i) for i in range(4))
    + u64(8 + 16 + 10, 2, 3, 4) + bytes(10) + small(1),
    "gulp-bad-after-large-in-carry": RUN + msg(pattern(0, 2), pattern(1, 3000)) + u64(16, 0),
    "gulp-truncated-in-carry": b"".join(small(1, i) for i in range(4)) + small(20)[:30],
    "gulp-truncated-head-in-carry": b"".join(small(1, i) for i in range(4)) + u64(33)[:5],
}


def main():
    os.makedirs(HERE, exist_ok=True)
    for name, data in sorted(CORPUS.items()):
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
