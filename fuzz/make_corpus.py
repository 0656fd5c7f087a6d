#!/usr/bin/python3
"""Writes the small seed corpora in fuzz/corpus/ (committed; rerun only to change them).

npy from numpy, tar from tarfile, TFRecord with zlib-free bitwise CRC-32C, lines by hand.
Each target's first byte conventions are in its fuzz_*.c.
"""
import io
import os
import struct
import tarfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(records):
    out = b""
    for r in records:
        n = struct.pack("<Q", len(r))
        out += n + struct.pack("<I", masked(n)) + r + struct.pack("<I", masked(r))
    return out


def main():
    for i, (dt, shape) in enumerate([("<f4", (3, 2)), (">i2", (5,)), ("|b1", (2, 2, 2)),
                                     ("<c16", (1, 1)), ("|u1", (0, 3))]):
        buf = io.BytesIO()
        np.save(buf, np.zeros(shape, dtype=dt))
        put("fuzz_npy", "np%d.npy" % i, buf.getvalue())
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.arange(4, dtype="<u2"), version=(2, 0))
    put("fuzz_npy", "v2.npy", buf.getvalue())
    put("fuzz_npy", "fortran.npy", buf.getvalue().replace(b"False", b"True "))

    # npz: stored (np.savez, which writes zip64 local headers), compressed (refused), one
    # member, and a member that is not .npy
    import zipfile
    for name, fn, arrays in (("savez", np.savez, dict(x=np.arange(6, dtype="<f4").reshape(3, 2),
                                                      y=np.arange(3, dtype="<i8"))),
                             ("compressed", np.savez_compressed, dict(x=np.zeros(4))),
                             ("one", np.savez, dict(a=np.ones((2, 2), dtype="|u1")))):
        buf = io.BytesIO()
        fn(buf, **arrays)
        put("fuzz_npz", name + ".npz", buf.getvalue())
    limits = zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT
    zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = 10, 1  # zip64 records in a small file
    buf = io.BytesIO()
    np.savez(buf, x=np.arange(5, dtype="<i2"), y=np.ones((5, 2), dtype="<f8"))
    zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = limits
    put("fuzz_npz", "zip64.npz", buf.getvalue())
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(zipfile.ZipInfo("notes.txt", date_time=(2020, 1, 1, 0, 0, 0)), b"hello")
    put("fuzz_npz", "not-npy.npz", buf.getvalue())

    recs = [b"abc", b"", b"x" * 100]
    put("fuzz_tfrecord", "three", b"\x00" + tfrecord(recs))
    put("fuzz_tfrecord", "one", b"\x02" + tfrecord([b"hello"]))
    # A valid sidecar for the fixed file in fuzz_tfrecord.c (records "abc", "", "0123456789").
    fixed = tfrecord([b"abc", b"", b"0123456789"])
    offs = [0, 19, 35]
    side = b"BWTFIDX1" + struct.pack("<QqQ", len(fixed), 0, 3) + b"".join(
        struct.pack("<Q", o) for o in offs)
    side += struct.pack("<I", crc32c(side))
    put("fuzz_tfrecord", "sidecar", b"\x01" + side)

    for fmt, name in ((tarfile.USTAR_FORMAT, "ustar"), (tarfile.GNU_FORMAT, "gnu"),
                      (tarfile.PAX_FORMAT, "pax")):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
            for key, ext, data in [("a/x" * 40 + "1", "jpg", b"J" * 10), ("a/x" * 40 + "1", "cls",
                                   b"3"), ("b", "txt", b"\xc3\xa9"), ("noext", "", b"z")]:
                ti = tarfile.TarInfo(key + ("." + ext if ext else ""))
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
        put("fuzz_tar", name + ".tar", buf.getvalue())

    put("fuzz_lines", "jsonl", b"\x00" + b'{"a":1}\n\n{"b":[1,2]}\r\n  \n{"c":3}')
    put("fuzz_lines", "text", b"\x01" + b"one\n\ntwo\nthree")
    put("fuzz_lines", "empty", b"\x00")


if __name__ == "__main__":
    main()
