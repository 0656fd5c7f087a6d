"""RUN frames and the FEATURES request on a real worker's data channel (docs/data-channel.md,
"Versions" and "RUN frames"), spoken with a raw socket:

* a client that sends no FEATURES request (as every client before it) gets one SAMPLE frame
  per sample, as before, for samples lying back to back in the file and scattered alike;
* FEATURES offering RUN frames and an unknown bit is answered END 0 with only the RUN bit;
  then a ReadSamples request gets RUN frames -- one header for the request's samples of one
  size, in request order, whatever their indices (back to back in the file, scattered,
  repeated) -- whose bytes are numpy's rows, then END with the count; 4 KiB rows, 256-byte
  rows (copied -- gathered when scattered -- or sent from the file when back to back) and 40
  KiB rows alike; a request with an index out of range at its end is refused whole, before
  any sample, with an ERROR frame naming the index and its position (runs on, and scattered
  small rows before it); a FEATURES answer of 0 bits turns runs off again;
* a FEATURES request whose body is not 8 bytes gets ERROR BW_PROTOCOL and the connection is
  closed; the worker keeps serving;
* `batchwire fetch` (which sends FEATURES) and a fetch over gRPC give the same per-batch
  bytes, plan order and shuffled.
"""

import hashlib
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwtest as bt  # noqa: E402
import bwdata as bd  # noqa: E402
import test_data_channel as dc  # noqa: E402

KIND_FEATURES = 4
RUN = 4
FEATURE_RUNS = 1


def features(s, bits, what):
    """Sends FEATURES offering `bits`; returns the bits the worker answered."""
    s.sendall(dc.frame(struct.pack("<Q", bits), kind=KIND_FEATURES))
    typ, code, a, b = struct.unpack("<IIQQ", dc.read_exact(s, 24, what))
    if (typ, code, a) != (dc.END, 0, 0):
        raise bt.TestFailure("%s: answered with frame type %d code %d a %d b %d, not END 0" %
                             (what, typ, code, a, b))
    return b


def frames(s, what):
    """One response: [(type, first index, count, size, bytes)] then ("end", n) or ("error",
    code, message)."""
    out = []
    while True:
        typ, code, a, b = struct.unpack("<IIQQ", dc.read_exact(s, 24, what + " (header)"))
        if typ == dc.SAMPLE:
            out.append((typ, a, 1, b, dc.read_exact(s, b, what)))
        elif typ == RUN:
            if code < 1 or b < 1:
                raise bt.TestFailure("%s: RUN frame of %d samples of %d bytes" % (what, code, b))
            out.append((typ, a, code, b, dc.read_exact(s, code * b, what)))
        elif typ == dc.END:
            return out, ("end", a)
        elif typ == dc.ERROR:
            msg = dc.read_exact(s, a, what).decode("utf-8", "replace")
            return out, ("error", struct.unpack("<i", struct.pack("<I", code))[0], msg)
        else:
            raise bt.TestFailure("%s: frame type %d" % (what, typ))


def expect(s, rows, indices, what, runs):
    """The response to a request for `indices`: RUN frames (runs) or SAMPLE frames only (not
    runs), carrying numpy's rows in request order, then END with the count."""
    got, tail = frames(s, what)
    if tail != ("end", len(indices)):
        raise bt.TestFailure("%s: ended with %r" % (what, tail))
    kinds = {t for t, *_ in got}
    if not runs and kinds - {dc.SAMPLE}:
        raise bt.TestFailure("%s: RUN frames to a client that did not ask for them" % what)
    if runs and len(indices) > 1 and RUN not in kinds:
        raise bt.TestFailure("%s: no RUN frame for %d samples of one size" % (what, len(indices)))
    check_samples(got, rows, indices, what)
    return len(got)


def check_samples(got, rows, indices, what, want=None):
    """Frames [(type, first index, count, size, bytes, ...)] carry rows[i] for each i of
    `indices`, in order (or want[p] at position p, when given: samples of several datasets)."""
    pos = 0
    for typ, first, count, size, data, *_ in got:
        if pos >= len(indices) or indices[pos] != first:
            raise bt.TestFailure("%s: a frame names index %d where %s is due (position %d)" %
                                 (what, first, indices[pos] if pos < len(indices) else "none",
                                  pos))
        for k in range(count):
            due = want[pos + k] if want is not None and pos + k < len(want) else \
                rows[indices[pos + k]] if want is None and pos + k < len(indices) else None
            if data[k * size:(k + 1) * size] != due:
                raise bt.TestFailure("%s: sample %s (position %d) differs from numpy's row" %
                                     (what, indices[pos + k] if pos + k < len(indices) else
                                      "beyond the request", pos + k))
        pos += count
    if pos != len(indices):
        raise bt.TestFailure("%s: %d samples for %d indices" % (what, pos, len(indices)))


def one_worker(tmpdir, root):
    """A coordinator and a live worker w1 serving root: (coordinator, worker, the worker's
    data address, the data.proto module)."""
    coord = bt.coordinator(tmpdir)
    w = bt.worker(tmpdir, coord.addr, "w1", data_root=root)
    st = bt.poll(lambda: (lambda s: s if any(x["state"] == "alive" for x in s["workers"])
                          else None)(bt.status_json(coord.addr)), 15, what="a live worker")
    daddr = st["workers"][0]["data_address"]
    pbm = bd.pb(tmpdir)
    return coord, w, daddr, pbm


def test(tmpdir):
    root = os.path.join(tmpdir, "data")
    os.makedirs(root)
    rng = np.random.default_rng(26)
    arrays = {"r4k.npy": rng.integers(0, 256, (300, 4096), dtype=np.uint8),
              "r256.npy": rng.random((2000, 64), dtype=np.float32),
              "r40k.npy": rng.integers(0, 256, (40, 40960), dtype=np.uint8)}
    rows = {}
    for name, arr in arrays.items():
        np.save(os.path.join(root, name), arr)
        rows[name] = [arr[i].tobytes() for i in range(len(arr))]

    coord, w, daddr, pbm = one_worker(tmpdir, root)

    back_to_back = list(range(10, 150))
    scattered = [int(i) for i in rng.permutation(300)[:120]] + [7, 7, 8]

    # --- an old client (no FEATURES): SAMPLE frames only
    s = dc.connect(daddr)
    for name, idx in (("r4k.npy", back_to_back), ("r256.npy", back_to_back),
                      ("r4k.npy", scattered)):
        s.sendall(dc.frame(dc.request(pbm, [name], idx)))
        expect(s, rows[name], idx, "no FEATURES, %s" % name, runs=False)
    bt.ok("a client that sends no FEATURES request gets SAMPLE frames only (back to back, "
          "scattered, repeated indices)")

    # --- FEATURES: RUN frames
    got = features(s, FEATURE_RUNS | (1 << 40), "FEATURES offering runs and bit 40")
    bt.check(got == FEATURE_RUNS, "FEATURES offering runs and an unknown bit is answered "
             "END 0 with the RUN bit alone (%#x)" % got)
    for name, idx in (("r4k.npy", back_to_back), ("r4k.npy", scattered),
                      ("r256.npy", back_to_back), ("r256.npy", scattered),
                      ("r256.npy", list(range(2000))), ("r40k.npy", [3, 4, 5, 9, 0, 39])):
        s.sendall(dc.frame(dc.request(pbm, [name], idx)))
        n = expect(s, rows[name], idx, "runs, %s" % name, runs=True)
        if n > 1 + len(idx) * len(rows[name][0]) // (128 << 10):
            raise bt.TestFailure("runs, %s: %d frames for %d samples" % (name, n, len(idx)))
    bt.ok("after FEATURES, RUN frames in request order carry numpy's rows: back to back, "
          "scattered and repeated indices, 256-byte, 4 KiB and 40 KiB rows; at most one frame "
          "per 128 KiB")
    s.sendall(dc.frame(dc.request(pbm, ["r4k.npy"], [1, 2, 3, 300])))
    out, tail = frames(s, "an index out of range after three")
    bt.check(tail[0] == "error" and tail[1] == dc.BW_OUT_OF_RANGE and "300" in tail[2],
             "an index out of range is an ERROR frame with runs on", tail)
    # scattered small rows (the worker gathers them), then an index out of range: the request is
    # refused whole when it is opened -- no row before it is sent -- naming index and position
    idx = [int(i) for i in rng.permutation(2000)[:300]]
    s.sendall(dc.frame(dc.request(pbm, ["r256.npy"], idx + [2000, 7])))
    out, tail = frames(s, "scattered small rows, then an index out of range")
    bt.check(not out and tail[0] == "error" and tail[1] == dc.BW_OUT_OF_RANGE and
             "index 2000 requested (position 300)" in tail[2],
             "scattered small rows then an index out of range: refused whole, an ERROR frame "
             "naming the index and its position, no row before it", (len(out), tail))
    s.sendall(dc.frame(dc.request(pbm, ["r256.npy"], idx)))
    expect(s, rows["r256.npy"], idx, "the same rows without it", runs=True)
    s.sendall(dc.frame(dc.request(pbm, ["r4k.npy"], [5, 6])))
    expect(s, rows["r4k.npy"], [5, 6], "the request after the error", runs=True)
    bt.check(features(s, 0, "FEATURES offering nothing") == 0, "FEATURES 0 is answered 0")
    s.sendall(dc.frame(dc.request(pbm, ["r4k.npy"], back_to_back)))
    expect(s, rows["r4k.npy"], back_to_back, "after FEATURES 0", runs=False)
    bt.ok("FEATURES 0 turns runs off on the connection")
    s.close()

    # --- a malformed FEATURES request: ERROR, closed; the worker serves on
    s = dc.connect(daddr)
    s.sendall(dc.frame(b"\x01\x00\x00\x00", kind=KIND_FEATURES))
    dc.expect_error(s, dc.BW_PROTOCOL, ["FEATURES", "8 bytes"], "a 4-byte FEATURES body")
    dc.expect_closed(s, "a 4-byte FEATURES body")
    s = dc.connect(daddr)
    s.sendall(dc.frame(dc.request(pbm, ["r256.npy"], [1, 2])))
    expect(s, rows["r256.npy"], [1, 2], "a new connection after it", runs=False)
    s.close()
    bt.ok("a malformed FEATURES request closes its connection; the worker keeps serving")

    # --- batchwire fetch (FEATURES, RUN frames) and gRPC: the same batches
    for extra in ([], ["--shuffle", "--seed", "3"]):
        out = {}
        for transport in ("auto", "grpc"):
            r = bt.cli("fetch", "--coordinator", coord.addr, "--job",
                       "j-%s-%d" % (transport, len(extra)), "--dataset", "npy:r256.npy",
                       "--rank", 0, "--world-size", 1, "--batch-size", 96, "--epochs", 1,
                       "--transport", transport, *extra, timeout=60)
            bt.check(r.returncode == 0, "batchwire fetch --transport %s %s" % (transport, extra),
                     r.stderr)
            out[transport] = [json.loads(line).get("sha256") for line in r.stdout.splitlines()
                              if line.startswith("{") and "summary" not in line]
        bt.check(out["auto"] and out["auto"] == out["grpc"],
                 "batchwire fetch %s: %d batches, the same bytes over the data channel (RUN "
                 "frames) and gRPC" % (" ".join(extra) or "(plan order)", len(out["auto"])),
                 out)
    w.stop()
    coord.stop()


if __name__ == "__main__":
    bt.main(test, timeout=120)
