"""Files written by independent tools, read back bit-exact through a worker's RPC, and
corrupted copies of each refused with the documented error (file, offset, reason):

* .npy written by numpy (np.save and np.lib.format.write_array for versions 1.0, 2.0, 3.0):
  many dtypes in both byte orders, 1-D and N-D; Fortran order, structured and object dtypes
  refused; truncated files, bad magic and bad headers refused.
* tar written by Python's tarfile (ustar, GNU and pax formats; long names; directories, links
  and extension-less members skipped) grouped into WebDataset samples.
* TFRecord written here with an independent bitwise CRC-32C; the index sidecar is written,
  reused, and rebuilt when it is corrupt.
* JSON Lines and text lines written by Python.
* Paths escaping the data root refused; the worker keeps serving after every error.
"""

import io
import json
import os
import shutil
import sys
import tarfile

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwtest as bt  # noqa: E402
import bwdata as bd  # noqa: E402

SC = grpc.StatusCode
DTYPES = ["|b1", "|i1", "|u1", "<i2", ">i2", "<u2", ">u2", "<i4", ">i4", "<u4", ">u4", "<i8",
          ">i8", "<u8", ">u8", "<f2", ">f2", "<f4", ">f4", "<f8", ">f8", "<c8", ">c8", "<c16",
          ">c16", "<f16", "|S7", "<U3", ">U2", "<M8[ns]", ">m8[s]", "|V5"]
SHAPES = [(17,), (9, 3), (5, 2, 3, 4), (1, 1), (0, 4), (300, 2)]


def random_array(rng, dtype, shape):
    dt = np.dtype(dtype)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
    if dt.kind == "b":
        raw = raw & 1
    if dt.kind == "U":  # valid code points only
        n, width = int(np.prod(shape)), dt.itemsize // 4
        return np.array(["".join(chr(65 + (k + j) % 26) for j in range(width)) for k in range(n)],
                        dtype=dt).reshape(shape)
    return np.frombuffer(raw.tobytes(), dtype=dt).reshape(shape)


def check_npy(c, root, tmpdir):
    rng = np.random.default_rng(7)
    os.makedirs(os.path.join(root, "npy"))
    n_files = 0
    for di, dtype in enumerate(DTYPES):
        for si, shape in enumerate(SHAPES):
            if (di + si) % 2 and shape != (17,):
                continue  # a diagonal of the grid keeps the test fast; every dtype still runs
            a = random_array(rng, dtype, shape)
            for version in ((1, 0), (2, 0), (3, 0)):
                if version != (1, 0) and (di + si) % 5:
                    continue
                rel = "npy/%d_%d_v%d.npy" % (di, si, version[0])
                with open(os.path.join(root, rel), "wb") as f:
                    if version == (1, 0):
                        np.save(f, a)
                    else:
                        np.lib.format.write_array(f, a, version=version)
                info = c.describe("npy", [rel])
                if (info.length != shape[0] or info.layout.dtype != a.dtype.str or
                        tuple(info.layout.shape) != shape[1:]):
                    raise bt.TestFailure("%s: described as %d x %s %r, numpy says %r %s" %
                                         (rel, info.length, info.layout.dtype,
                                          tuple(info.layout.shape), shape, a.dtype.str))
                idx = list(range(shape[0]))[::-1] + list(range(min(shape[0], 3)))
                rows = c.read("npy", [rel], idx)
                for r in rows:
                    if r["data"] != a[r["index"]:r["index"] + 1].tobytes():
                        raise bt.TestFailure("%s row %d differs from numpy's bytes" %
                                             (rel, r["index"]))
                n_files += 1
    bt.ok("%d .npy files written by numpy %s (%d dtypes in both byte orders, shapes %r, format "
          "versions 1.0/2.0/3.0) read back bit-exact" % (n_files, np.__version__, len(DTYPES),
                                                          SHAPES))

    # A dataset of several files: indices run across them in glob order.
    parts = [random_array(rng, "<f4", (n, 2, 3)) for n in (4, 0, 7, 5)]
    for k, p in enumerate(parts):
        np.save(os.path.join(root, "npy", "multi-%d.npy" % k), p)
    whole = np.concatenate(parts)
    info = c.describe("npy", ["npy/multi-*.npy"])
    rows = c.read("npy", ["npy/multi-*.npy"], list(range(len(whole))))
    bt.check(info.length == 16 and [s.records for s in info.sources] == [4, 0, 7, 5] and
             all(r["data"] == whole[r["index"]:r["index"] + 1].tobytes() for r in rows),
             "a glob of 4 .npy files (one empty) is one dataset of 16 samples")
    mixed = os.path.join(root, "npy", "mixed-1.npy")
    np.save(os.path.join(root, "npy", "mixed-0.npy"), parts[0])
    np.save(mixed, random_array(rng, "<f8", (3, 2, 3)))
    bd.expect_error(lambda: c.describe("npy", ["npy/mixed-*.npy"]), SC.FAILED_PRECONDITION,
                    "npy/mixed-1.npy", "'<f8'", "share the sample layout")

    # Refused clearly.
    np.save(os.path.join(root, "npy", "fortran.npy"), np.asfortranarray(
        random_array(rng, "<i4", (4, 3))))
    d, _ = bd.expect_error(lambda: c.describe("npy", ["npy/fortran.npy"]), SC.UNIMPLEMENTED,
                           "npy/fortran.npy", "Fortran-order", "np.ascontiguousarray")
    bt.ok("Fortran order refused: " + d)
    np.save(os.path.join(root, "npy", "struct.npy"),
            np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")]))
    bd.expect_error(lambda: c.describe("npy", ["npy/struct.npy"]), SC.DATA_LOSS,
                    "npy/struct.npy", "structured dtypes")
    np.save(os.path.join(root, "npy", "object.npy"), np.array([1, "x", None], dtype=object),
            allow_pickle=True)
    bd.expect_error(lambda: c.describe("npy", ["npy/object.npy"]), SC.UNIMPLEMENTED,
                    "npy/object.npy", "dtype '|O'")

    good = random_array(rng, "<f4", (10, 4))
    buf = io.BytesIO()
    np.save(buf, good)
    raw = buf.getvalue()
    hdr = len(raw) - good.nbytes
    cases = [
        ("truncated.npy", raw[:-10], SC.DATA_LOSS,
         ["offset %d" % hdr, "truncated: shape[0]=10 rows of 16 bytes", "the file has 150"]),
        ("badmagic.npy", b"\x93NUMPZ" + raw[6:], SC.DATA_LOSS, ["offset 0", "not a .npy file"]),
        ("badheader.npy", raw.replace(b"'descr'", b"'dexcr'"), SC.DATA_LOSS,
         ["bad .npy header", "unexpected or repeated key"]),
        ("badshape.npy", raw.replace(b"(10, 4)", b"(10, x)"), SC.DATA_LOSS,
         ["bad .npy header", "'shape'"]),
        ("badversion.npy", raw[:6] + b"\x07\x00" + raw[8:], SC.DATA_LOSS,
         ["offset 6", "version 7.0"]),
        ("hugehdr.npy", raw[:8] + b"\xff\xff" + raw[10:], SC.DATA_LOSS,
         ["offset 10", "truncated .npy header"]),
        ("extra.npy", raw + b"xx", SC.DATA_LOSS, ["2 unexpected bytes after the array"]),
    ]
    for name, data, code, needles in cases:
        with open(os.path.join(root, "npy", name), "wb") as f:
            f.write(data)
        d, _ = bd.expect_error(lambda: c.describe("npy", ["npy/" + name]), code,
                               "npy/" + name, *needles)
        bt.ok("corrupt .npy refused: " + d)
    np.save(os.path.join(root, "npy", "ok.npy"), good)
    d, code = bd.expect_error(lambda: c.read("npy", ["npy/ok.npy"], [3, 10]), SC.OUT_OF_RANGE,
                              "index 10 requested", "has 10 samples")
    bt.check(code == "BW_OUT_OF_RANGE", "an index past the end: " + d)


def check_tar(c, root):
    os.makedirs(os.path.join(root, "tar"))
    rng = np.random.default_rng(11)
    long_dir = "d" * 90 + "/" + "e" * 60  # > 100 characters: ustar prefix, GNU 'L' or pax path
    samples = []
    for k in range(23):
        key = ("%s/s%05d" % (long_dir, k)) if k % 3 == 0 else "flat/s%05d" % k
        fields = [("jpg", rng.integers(0, 256, int(rng.integers(0, 3000)), dtype=np.uint8)
                   .tobytes()), ("cls", str(k % 7).encode())]
        if k % 4 == 0:
            fields.append(("seg.png", rng.bytes(int(rng.integers(1, 700)))))
        samples.append((key, fields))
    formats = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT,
               "pax": tarfile.PAX_FORMAT}
    for fname, fmt in formats.items():
        path = os.path.join(root, "tar", fname + ".tar")
        with tarfile.open(path, "w", format=fmt) as t:
            d = tarfile.TarInfo("flat")
            d.type = tarfile.DIRTYPE
            t.addfile(d)
            for i, (key, fields) in enumerate(samples):
                for ext, data in fields:
                    ti = tarfile.TarInfo("%s.%s" % (key, ext))
                    ti.size = len(data)
                    ti.mtime = 1700000000 + i
                    t.addfile(ti, io.BytesIO(data))
                if i == 5:
                    ln = tarfile.TarInfo("flat/link.jpg")
                    ln.type = tarfile.SYMTYPE
                    ln.linkname = "s00005.jpg"
                    t.addfile(ln)
                    ti = tarfile.TarInfo("flat/README")  # no extension: skipped
                    ti.size = 3
                    t.addfile(ti, io.BytesIO(b"hi\n"))
        if fname == "pax":
            with tarfile.open(path, "a", format=fmt) as t:
                ti = tarfile.TarInfo("flat/s99999.txt")
                ti.pax_headers = {"comment": "x" * 300}
                data = "\u00e9t\u00e9".encode()
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
        expect = list(samples) + ([("flat/s99999", [("txt", "\u00e9t\u00e9".encode())])]
                                  if fname == "pax" else [])
        info = c.describe("tar", ["tar/%s.tar" % fname])
        rows = c.read("tar", ["tar/%s.tar" % fname], list(range(info.length)))
        got = [(r["key"], r["fields"], r["data"]) for r in rows]
        want = [(k, [(e, len(d)) for e, d in f], b"".join(d for _, d in f)) for k, f in expect]
        bt.check(info.length == len(expect) and got == want,
                 "tar written by Python's tarfile (%s format, long names, dirs/links skipped): "
                 "%d samples with keys, fields and bytes as written" % (fname, len(expect)))
        recs = c.read_stream("tar", ["tar/%s.tar" % fname], 0)
        bt.check([(r["key"], r["data"]) for r in recs] == [(k, d) for k, _, d in want],
                 "the same archive streamed by offset")

    raw = open(os.path.join(root, "tar", "ustar.tar"), "rb").read()
    # The header of the third member (sample 0's seg.png? no: find by name).
    off = raw.index(b"flat/s00001.cls")
    bad = bytearray(raw)
    bad[off + 124 + 3] ^= 0x01  # one bit of the size field: checksum no longer matches
    with open(os.path.join(root, "tar", "badsum.tar"), "wb") as f:
        f.write(bad)
    d, _ = bd.expect_error(lambda: c.describe("tar", ["tar/badsum.tar"]), SC.DATA_LOSS,
                           "tar/badsum.tar", "offset %d" % off, "checksum mismatch")
    bt.ok("tar with a damaged header refused: " + d)
    # Truncated inside a member's data.
    off2 = raw.index(b"flat/s00004.jpg")
    with open(os.path.join(root, "tar", "trunc.tar"), "wb") as f:
        f.write(raw[:off2 + 512 + 10])
    d, _ = bd.expect_error(lambda: c.describe("tar", ["tar/trunc.tar"]), SC.DATA_LOSS,
                           "tar/trunc.tar", "offset %d" % off2, "truncated tar member")
    bt.ok("truncated tar refused: " + d)
    with open(os.path.join(root, "tar", "junk.tar"), "wb") as f:
        f.write(b"this is not a tar file at all" * 40)
    bd.expect_error(lambda: c.describe("tar", ["tar/junk.tar"]), SC.DATA_LOSS, "offset 0",
                    "checksum")
    d, _ = bd.expect_error(lambda: c.read_stream("tar", ["tar/ustar.tar"], 0, offset=100),
                           SC.INVALID_ARGUMENT, "not a tar block boundary")


def check_tfrecord(c, root, worker):
    os.makedirs(os.path.join(root, "tfr"))
    rng = np.random.default_rng(3)
    recs = [rng.bytes(int(n)) for n in rng.integers(0, 5000, 40)] + [b""]
    data = bd.tfrecord_bytes(recs)
    path = os.path.join(root, "tfr", "a.tfrecord")
    with open(path, "wb") as f:
        f.write(data)
    info = c.describe("tfrecord", ["tfr/a.tfrecord"])
    rows = c.read("tfrecord", ["tfr/a.tfrecord"], list(range(len(recs))))
    bt.check(info.length == len(recs) and [r["data"] for r in rows] == recs,
             "TFRecord with CRCs from an independent CRC-32C: %d records bit-exact" % len(recs))
    bt.check(os.path.exists(path + ".bwidx"), "the offset index was saved as a sidecar")
    recs2 = c.read_stream("tfrecord", ["tfr/a.tfrecord"], 0)
    bt.check([r["data"] for r in recs2] == recs, "and streamed by offset")

    offs = [0]
    for r in recs:
        offs.append(offs[-1] + 16 + len(r))
    # A damaged payload byte in record 7: that record fails with its offset, others serve.
    k = next(i for i in range(7, len(recs)) if len(recs[i]) > 0)
    bad = bytearray(data)
    bad[offs[k] + 12] ^= 0xFF
    with open(os.path.join(root, "tfr", "baddata.tfrecord"), "wb") as f:
        f.write(bad)
    src = ["tfr/baddata.tfrecord"]
    d, code = bd.expect_error(lambda: c.read("tfrecord", src, [k]), SC.DATA_LOSS,
                              "tfr/baddata.tfrecord", "offset %d" % offs[k], "data CRC mismatch")
    bt.check(code == "BW_CORRUPT", "a corrupt record is an error, never wrong bytes: " + d)
    rows = c.read("tfrecord", src, [k - 1, k + 1])
    bt.check([r["data"] for r in rows] == [recs[k - 1], recs[k + 1]],
             "its neighbours are still served")
    bd.expect_error(lambda: c.read_stream("tfrecord", src, 0), SC.DATA_LOSS,
                    "offset %d" % offs[k])
    # A damaged length: the index cannot be built.
    bad = bytearray(data)
    bad[offs[3] + 2] ^= 0x10
    with open(os.path.join(root, "tfr", "badlen.tfrecord"), "wb") as f:
        f.write(bad)
    d, _ = bd.expect_error(lambda: c.describe("tfrecord", ["tfr/badlen.tfrecord"]),
                           SC.DATA_LOSS, "offset %d" % offs[3], "length CRC mismatch")
    bt.ok("damaged length refused: " + d)
    with open(os.path.join(root, "tfr", "trunc.tfrecord"), "wb") as f:
        f.write(data[:offs[5] + 30])
    d, _ = bd.expect_error(lambda: c.describe("tfrecord", ["tfr/trunc.tfrecord"]),
                           SC.DATA_LOSS, "offset %d" % offs[5], "truncated record")
    bt.ok("truncated TFRecord refused: " + d)

    # A sidecar that does not match is ignored and rebuilt.
    shutil.copy(path, os.path.join(root, "tfr", "b.tfrecord"))
    side = os.path.join(root, "tfr", "b.tfrecord.bwidx")
    blob = bytearray(open(path + ".bwidx", "rb").read())
    os.utime(os.path.join(root, "tfr", "b.tfrecord"),
             ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns))
    blob[40] ^= 0x01  # an offset: CRC no longer matches
    with open(side, "wb") as f:
        f.write(blob)
    rows = c.read("tfrecord", ["tfr/b.tfrecord"], list(range(len(recs))))
    bt.check([r["data"] for r in rows] == recs, "a corrupt sidecar does not change what is served")
    worker.wait_log(r"ignoring the index sidecar; rebuilding it source=\S*b\.tfrecord "
                    r"sidecar=\S*b\.tfrecord\.bwidx err=CRC mismatch")
    bt.check(open(side, "rb").read() == open(path + ".bwidx", "rb").read(),
             "the worker logged it and rewrote the sidecar")


def check_lines(c, root):
    os.makedirs(os.path.join(root, "lines"))
    objs = [{"i": i, "text": "x" * i, "nested": {"u": "\u00fc"}} for i in range(30)]
    lines = [json.dumps(o) for o in objs]
    with open(os.path.join(root, "lines", "a.jsonl"), "w") as f:
        for i, ln in enumerate(lines):
            f.write(ln + "\n" + ("\n" if i % 7 == 0 else ""))
    rows = c.read("jsonl", ["lines/a.jsonl"], list(range(30)))
    bt.check([json.loads(r["data"]) for r in rows] == objs,
             "JSON Lines written by Python: 30 objects (blank lines skipped)")
    with open(os.path.join(root, "lines", "t.txt"), "wb") as f:
        f.write(b"one\n\nthree\r\nlast-no-newline")
    info = c.describe("text", ["lines/t.txt"])
    rows = c.read("text", ["lines/t.txt"], list(range(info.length)))
    bt.check([r["data"] for r in rows] == [b"one", b"", b"three\r", b"last-no-newline"],
             "text lines keep empty lines; the last line needs no newline")
    bd.expect_error(lambda: c.read_stream("jsonl", ["lines/a.jsonl"], 0, offset=3),
                    SC.INVALID_ARGUMENT, "not the start of a line")
    bd.expect_error(lambda: c.read_stream("npy", ["npy/ok.npy"], 0), SC.UNIMPLEMENTED,
                    "not a stream")


def check_escapes(c, root, tmpdir):
    outside = os.path.join(tmpdir, "outside.npy")
    np.save(outside, np.zeros(3))
    os.symlink(outside, os.path.join(root, "link.npy"))
    for src, needle in [("../outside.npy", "'..' would leave the data root"),
                        ("npy/../../outside.npy", "'..'"),
                        (outside, "must be relative"),
                        ("link.npy", "outside the data root")]:
        d, code = bd.expect_error(lambda: c.describe("npy", [src]), SC.PERMISSION_DENIED, needle)
        bt.check(code == "BW_PERMISSION_DENIED", "source %r refused: %s" % (src, d))
    bd.expect_error(lambda: c.describe("npy", ["nothing/*.npy"]), SC.NOT_FOUND, "matches nothing")
    bd.expect_error(lambda: c.describe("npy", ["missing.npy"]), SC.NOT_FOUND, "missing.npy")
    bd.expect_error(lambda: c.describe("parquet", ["x"]), SC.INVALID_ARGUMENT,
                    "unknown dataset format 'parquet'", "npy")


def test(tmpdir):
    root = os.path.join(tmpdir, "data")
    os.makedirs(root)
    coord = bt.coordinator(tmpdir)
    w = bt.worker(tmpdir, coord.addr, "w1", data_root=root)
    c = bd.DataClient(tmpdir, w.addr)
    check_npy(c, root, tmpdir)
    check_tar(c, root)
    check_tfrecord(c, root, w)
    check_lines(c, root)
    check_escapes(c, root, tmpdir)
    info = c.describe("npy", ["npy/ok.npy"])
    bt.check(w.running() and info.length == 10,
             "after every error above the worker is still up and serving")


if __name__ == "__main__":
    bt.main(test, timeout=120)
