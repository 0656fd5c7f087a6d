"""Compression on a real worker's data channel (docs/data-channel.md, "Compression"):

* spoken with a raw socket: FEATURES offering RUN frames, ZSTD and a level is answered with
  those bits and the level used (the one asked, at most --data-compress-max-level; 0: the
  default 1); a ReadSamples request of Zipf-distributed int32 tokens then comes as ZRUN
  frames whose zstd frames (decompressed here with libzstd through ctypes) hold numpy's rows
  in request order, in fewer bytes than the rows; samples of varying size (jsonl) as ZRUN
  frames of one sample or raw; random bytes as RUN frames (a group that does not shrink goes
  raw); with AUTO, the tokens compressed and random bytes raw; a client offering only RUN
  frames (as before) gets no ZRUN frame;
* `batchwire fetch --compress zstd`, `zstd:7`, `auto` and `none`, and `--transport grpc`,
  deliver the same bytes in every batch, plan order and shuffled;
* a worker started with --data-compress-max-level 0 (as one without compression, or older)
  answers FEATURES without the ZSTD bit, sends raw frames, and `fetch --compress zstd` from it
  delivers the same bytes;
* over TLS, `fetch --compress zstd` and `auto` deliver the same bytes as `none` and gRPC;
* with a transform (`decode|resize(24,24)|chw` on `gen --format jpeg` files) too;
* `--compress` with a bad value is refused naming it; Python's Loader(compress="zstd")
  delivers the same batches as Loader() (compression is not part of the job's configuration:
  both read one job).
"""

import ctypes
import ctypes.util
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwtest as bt  # noqa: E402
import bwpy  # noqa: E402
import test_data_channel as dc  # noqa: E402
import test_data_channel_runs as dr  # noqa: E402

ZRUN = 5
RUNS, ZSTD, AUTO = 1, 2, 4
LEVEL_SHIFT = 8

_zstd = ctypes.CDLL(ctypes.util.find_library("zstd") or "libzstd.so.1")
_zstd.ZSTD_decompress.restype = ctypes.c_size_t
_zstd.ZSTD_decompress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                  ctypes.c_size_t]
_zstd.ZSTD_isError.argtypes = [ctypes.c_size_t]


def unzstd(data, size, what):
    out = ctypes.create_string_buffer(size)
    n = _zstd.ZSTD_decompress(out, size, data, len(data))
    if _zstd.ZSTD_isError(n) or n != size:
        raise bt.TestFailure("%s: a ZRUN frame's %d bytes do not decompress to %d" %
                             (what, len(data), size))
    return out.raw


def frames(s, what):
    """One response: [(type, first, count, size, raw bytes, bytes on the wire)], tail."""
    out = []
    while True:
        typ, code, a, b = struct.unpack("<IIQQ", dc.read_exact(s, 24, what + " (header)"))
        if typ == ZRUN:
            size, clen = b >> 32, b & 0xffffffff
            if code < 1 or size < 1 or clen < 1 or clen >= code * size:
                raise bt.TestFailure("%s: ZRUN of %d x %d bytes in %d" % (what, code, size, clen))
            out.append((typ, a, code, size, unzstd(dc.read_exact(s, clen, what), code * size,
                                                   what), clen))
        elif typ == dc.SAMPLE:
            out.append((typ, a, 1, b, dc.read_exact(s, b, what), b))
        elif typ == dr.RUN:
            out.append((typ, a, code, b, dc.read_exact(s, code * b, what), code * b))
        elif typ == dc.END:
            return out, ("end", a)
        elif typ == dc.ERROR:
            msg = dc.read_exact(s, a, what).decode("utf-8", "replace")
            return out, ("error", code, msg)
        else:
            raise bt.TestFailure("%s: frame type %d" % (what, typ))


def expect(s, rows, indices, what):
    """The response to a request for `indices`: (frame types seen, bytes on the wire)."""
    got, tail = frames(s, what)
    if tail != ("end", len(indices)):
        raise bt.TestFailure("%s: ended with %r" % (what, tail))
    dr.check_samples(got, rows, indices, what)
    return {t for t, *_ in got}, sum(w for *_, w in got)


def fetch(coord, job, dataset, extra, what, said=None):
    """The batches' sha256; `said`: what the client's debug line about compression must say
    (None: that there is none)."""
    r = bt.cli("fetch", "--coordinator", coord.addr, "--job", job, "--dataset", dataset,
               "--rank", 0, "--world-size", 1, "--batch-size", 64, "--epochs", 1,
               "--log-level", "debug", *extra, timeout=60)
    bt.check(r.returncode == 0, what, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if "compression: " in ln]
    if said is None and lines or said is not None and not (
            lines and all(("compression: " + said) in ln for ln in lines)):
        raise bt.TestFailure("%s: the client's lines about compression are %r, expected %r" %
                             (what, lines, said))
    return [json.loads(line).get("sha256") for line in r.stdout.splitlines()
            if line.startswith("{") and "summary" not in line]


def test(tmpdir):
    root = os.path.join(tmpdir, "data")
    os.makedirs(root)
    rng = np.random.default_rng(28)
    arrays = {"tok.npy": np.minimum(rng.zipf(1.2, (400, 1024)), 50000).astype(np.int32),
              "rand.npy": rng.integers(0, 256, (200, 4096), dtype=np.uint8)}
    rows = {}
    for name, arr in arrays.items():
        np.save(os.path.join(root, name), arr)
        rows[name] = [arr[i].tobytes() for i in range(len(arr))]
    lines = [json.dumps({"i": i, "text": "word " * int(rng.integers(1, 400))})
             for i in range(300)]
    with open(os.path.join(root, "var.jsonl"), "w") as f:
        f.write("\n".join(lines) + "\n")
    rows["var.jsonl"] = [ln.encode() for ln in lines]

    r = bt.cli("gen", "--format", "jpeg", "--out", os.path.join(root, "jpeg"), "--num-samples",
               40, "--seed", 3, "--image-max", 200, timeout=60)
    bt.check(r.returncode == 0, "gen --format jpeg", r.stderr)
    coord, w, daddr, pbm = dr.one_worker(tmpdir, root)

    scattered = [int(i) for i in rng.permutation(400)[:300]] + [7, 7]
    s = dc.connect(daddr)
    got = dr.features(s, RUNS | ZSTD | 5 << LEVEL_SHIFT, "FEATURES RUNS|ZSTD level 5")
    bt.check(got == RUNS | ZSTD | 5 << LEVEL_SHIFT,
             "FEATURES offering runs, zstd and level 5 is answered with all three (%#x)" % got)
    s.sendall(dc.frame(dc.request(pbm, ["tok.npy"], scattered)))
    kinds, wire = expect(s, rows["tok.npy"], scattered, "zstd, tokens")
    raw = len(scattered) * 4096
    bt.check(ZRUN in kinds and wire * 2 < raw,
             "zstd: Zipf int32 tokens (scattered, repeated) come as ZRUN frames holding numpy's "
             "rows, %d bytes on the wire for %d" % (wire, raw), kinds)
    s.sendall(dc.frame(dc.request(pbm, ["rand.npy"], list(range(50, 120)))))
    kinds, wire = expect(s, rows["rand.npy"], list(range(50, 120)), "zstd, random bytes")
    bt.check(ZRUN not in kinds and dr.RUN in kinds,
             "zstd: random bytes, which do not shrink, come as RUN frames", kinds)
    pbj = dc.request(pbm, ["var.jsonl"], list(range(40, 90)), fmt="jsonl")
    s.sendall(dc.frame(pbj))
    kinds, wire = expect(s, rows["var.jsonl"], list(range(40, 90)), "zstd, jsonl")
    bt.check(ZRUN in kinds,
             "zstd: samples of varying sizes (JSON Lines) come as ZRUN frames too", kinds)
    s.sendall(dc.frame(dc.request(pbm, ["tok.npy"], [1, 2, 3, 400])))
    out, tail = frames(s, "an index out of range after three")
    bt.check(tail[0] == "error" and "400" in tail[2],
             "an index out of range is an ERROR frame with compression on", tail)
    s.sendall(dc.frame(dc.request(pbm, ["tok.npy"], [5, 6])))
    expect(s, rows["tok.npy"], [5, 6], "the request after the error")
    s.close()

    # the level: at most the worker's --data-compress-max-level (9 by default); 0: 1
    for asked, used in ((19, 9), (0, 1), (4, 4)):
        s = dc.connect(daddr)
        got = dr.features(s, RUNS | ZSTD | asked << LEVEL_SHIFT, "level %d" % asked)
        bt.check(got == RUNS | ZSTD | used << LEVEL_SHIFT,
                 "FEATURES asking zstd level %d is answered with level %d (%#x)" %
                 (asked, used, got))
        s.close()
    s = dc.connect(daddr)
    bt.check(dr.features(s, ZSTD | AUTO, "zstd without runs") == 0,
             "ZSTD without RUN frames is not granted")
    s.close()

    # --- auto: tokens compressed, random bytes raw
    s = dc.connect(daddr)
    got = dr.features(s, RUNS | ZSTD | AUTO, "FEATURES auto")
    bt.check(got == RUNS | ZSTD | AUTO | 1 << LEVEL_SHIFT,
             "FEATURES auto is answered with level 1 (%#x)" % got)
    s.sendall(dc.frame(dc.request(pbm, ["tok.npy"], scattered)))
    kinds, wire = expect(s, rows["tok.npy"], scattered, "auto, tokens")
    bt.check(ZRUN in kinds and wire * 2 < raw, "auto: tokens come compressed (%d bytes of %d)" %
             (wire, raw), kinds)
    s.sendall(dc.frame(dc.request(pbm, ["rand.npy"], list(range(200)))))
    kinds, wire = expect(s, rows["rand.npy"], list(range(200)), "auto, random bytes")
    bt.check(kinds == {dr.RUN}, "auto: random bytes come raw (RUN frames only)", kinds)
    s.close()

    # --- a client that offers RUN frames only (as before compression): never a ZRUN
    s = dc.connect(daddr)
    bt.check(dr.features(s, RUNS, "runs only") == RUNS, "FEATURES RUNS is answered RUNS")
    s.sendall(dc.frame(dc.request(pbm, ["tok.npy"], scattered)))
    kinds, wire = expect(s, rows["tok.npy"], scattered, "runs only, tokens")
    bt.check(ZRUN not in kinds and wire == raw,
             "a client that does not ask for compression gets raw frames", kinds)
    s.close()

    # --- batchwire fetch: the same bytes with any --compress, and over gRPC
    for ds in ("npy:tok.npy", "npy:rand.npy", "jsonl:var.jsonl"):
        for extra in ([], ["--shuffle", "--seed", "5"]):
            out = {}
            for how in ("none", "zstd", "zstd:7", "auto", "grpc"):
                args = ["--transport", "grpc"] if how == "grpc" else ["--compress", how]
                said = {"none": None, "grpc": None, "auto": "auto"}.get(how, "zstd")
                out[how] = fetch(coord, "j-%s-%s-%d" % (ds.split(":")[1], how.replace(":", ""),
                                                         len(extra)), ds, args + extra,
                                 "fetch %s --compress %s %s" % (ds, how, extra), said)
            bt.check(out["none"] and all(v == out["none"] for v in out.values()),
                     "fetch %s %s: %d batches, the same bytes with --compress none, zstd, "
                     "zstd:7, auto and over gRPC" % (ds, " ".join(extra) or "(plan order)",
                                                     len(out["none"])), out)
    # transformed samples (the workers' results, decoded images) compress the same way
    tf = ["--transform", "decode|resize(24,24)|chw", "--shuffle", "--seed", "2"]
    out = {how: fetch(coord, "tf-" + how, "files:jpeg/*", tf + ["--compress", how],
                      "fetch --transform ... --compress " + how,
                      {"none": None}.get(how, how)) for how in ("none", "zstd", "auto")}
    bt.check(out["none"] and all(v == out["none"] for v in out.values()),
             "with a transform, fetch --compress zstd and auto deliver the %d batches of none" %
             len(out["none"]), out)
    r = bt.cli("fetch", "--coordinator", coord.addr, "--job", "bad", "--dataset", "npy:tok.npy",
               "--rank", 0, "--world-size", 1, "--batch-size", 8, "--epochs", 1,
               "--compress", "zstd:20")
    bt.check(r.returncode != 0 and "zstd:20" in r.stderr and "LEVEL 1 to 19" in r.stderr,
             "--compress zstd:20 is refused naming the value and the levels", r.stderr)

    # --- Python: Loader(compress=...) reads the same job as Loader()
    batchwire = bwpy.import_batchwire()

    def py_run(c):
        kw = {} if c is None else {"compress": c}
        with batchwire.Loader(coordinator=coord.addr, job="py", dataset="npy:tok.npy", rank=0,
                              world_size=1, batch_size=50, **kw) as ld:
            return [b.numpy().tobytes() for b in ld]
    a, b = py_run(None), py_run("zstd:3")
    bt.check(a and a == b, "Python: Loader(compress='zstd:3') delivers the %d batches of "
             "Loader()" % len(a))
    try:
        py_run("lz4")
        raise bt.TestFailure("Python: Loader(compress='lz4') was accepted")
    except batchwire.Error as e:
        bt.check("lz4" in str(e) and "compress" in str(e),
                 "Python: Loader(compress='lz4') is refused naming it", str(e))
    w.stop()

    # --- a worker without compression: raw frames, the same bytes
    w2 = bt.worker(tmpdir, coord.addr, "w2", data_root=root,
                   args=["--data-compress-max-level", "0"])
    st = bt.poll(lambda: (lambda s: s if any(x["id"] == "w2" and x["state"] == "alive"
                                             for x in s["workers"]) else None)(
        bt.status_json(coord.addr)), 15, what="w2 alive")
    daddr2 = [x for x in st["workers"] if x["id"] == "w2"][0]["data_address"]
    s = dc.connect(daddr2)
    got = dr.features(s, RUNS | ZSTD | 3 << LEVEL_SHIFT, "FEATURES to a worker without it")
    bt.check(got == RUNS, "a worker with --data-compress-max-level 0 answers FEATURES without "
             "the ZSTD bit (%#x)" % got)
    s.sendall(dc.frame(dc.request(pbm, ["tok.npy"], scattered)))
    kinds, wire = expect(s, rows["tok.npy"], scattered, "worker without compression")
    bt.check(ZRUN not in kinds, "... and sends raw frames", kinds)
    s.close()
    bt.poll(lambda: (lambda s: all(x["state"] != "alive" for x in s["workers"]
                                   if x["id"] == "w1"))(bt.status_json(coord.addr)), 30,
            what="w1 no longer alive")
    a = fetch(coord, "j-old-zstd", "npy:tok.npy", ["--compress", "zstd"], "fetch --compress "
              "zstd from a worker without compression", "none (the worker does not offer it)")
    b = fetch(coord, "j-old-none", "npy:tok.npy", [], "fetch from a worker without compression")
    bt.check(a and a == b, "fetch --compress zstd from a worker without compression: the same "
             "%d batches" % len(a))
    w2.stop()
    coord.stop()

    # --- over TLS: ZRUN frames decrypted into the connection's buffer, the same bytes
    pki = bt.make_pki(tmpdir)
    ca = ["--tls-ca", pki["ca"]]
    tc = bt.coordinator(tmpdir, name="coordinator-tls",
                        args=["--tls-cert", pki["server_crt"], "--tls-key", pki["server_key"],
                              "--worker-tls-ca", pki["ca"]])
    tw = bt.worker(tmpdir, tc.addr, "t1", data_root=root,
                   args=ca + ["--tls-cert", pki["worker_crt"], "--tls-key", pki["worker_key"]])
    bt.poll(lambda: any(x["state"] == "alive" and x["data_address"]
                        for x in bt.status_json(tc.addr, ca)["workers"]), 15,
            what="a live TLS worker")
    out = {how: fetch(tc, "tls-" + how, "npy:tok.npy",
                      ca + (["--transport", "grpc"] if how == "grpc" else ["--compress", how]),
                      "fetch over TLS --compress " + how,
                      {"none": None, "grpc": None}.get(how, how))
           for how in ("none", "zstd", "auto", "grpc")}
    bt.check(out["none"] and all(v == out["none"] for v in out.values()),
             "over TLS, fetch --compress zstd and auto deliver the %d batches of none and gRPC" %
             len(out["none"]), out)
    tw.stop()
    tc.stop()


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=240)
