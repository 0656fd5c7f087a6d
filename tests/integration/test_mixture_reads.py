"""ReadSamples requests of several datasets (docs/data-channel.md, "Several datasets in one
request"): what a mixture job's client sends a worker that offered FEATURES bit 3, one request
per worker for a batch of several sources. Spoken with a raw socket and raw gRPC to one worker:

* FEATURES offering RUN frames and bit 3 is answered with both;
* a request naming three datasets (two .npy of 256-byte rows, one of 192-byte rows), its
  indices interleaved and repeated, gets every sample's bytes in request order, each from the
  dataset its index names: SAMPLE frames on a connection without FEATURES, RUN frames with
  them -- one RUN across the two sources of one sample size -- and the same over gRPC;
* with compression (FEATURES RUNS|ZSTD|bit 3), Zipf tokens of two sources come as ZRUN frames
  holding the right rows;
* refused with a sentence naming the request's dataset by position and name, the connection
  reusable and the worker up: an index out of range in one source, a wrong fingerprint of one,
  a dataset that does not exist, an index naming dataset 5 of 2, fewer index_datasets than
  indices, `dataset` beside `datasets`, a transform, an entry without a dataset, 257
  datasets; an older-style request (one dataset) is still served on the same connection;
  routed by a placement of two workers, indices of both datasets that the worker owns are
  served and one of the second dataset that the other worker owns is BW_WRONG_OWNER;
* `batchwire fetch --mix` over the data channel (plain and --compress zstd) equals `batchwire
  plan --mix-size` and its bytes are the sources' rows, in about one request per batch (the
  old way made one per source: two), and over gRPC too;
* older workers, played by a proxy in front of the worker's data channel (its advertised
  address) that takes bit 3 out of every FEATURES request: a fetch asks them one dataset a
  request (about two a batch, no retry); and when the worker behind the address turns older
  during a fetch (the proxy closes the connections opened before, at their next request), the
  request of several datasets that reaches it is ended and asked again the old way at once:
  the batches are still the plan's, with the same bytes.

Authentication (a grant naming only some of a request's datasets) is in test_mixture_auth.py.
"""

import hashlib
import json
import os
import socket
import struct
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwdata as bd  # noqa: E402
import bwpy  # noqa: E402
import bwtest as bt  # noqa: E402
import test_data_channel as dc  # noqa: E402
import test_data_channel_compress as dz  # noqa: E402
import test_data_channel_runs as dr  # noqa: E402
import test_hostile_grants as hg  # noqa: E402

dpb = hg.dpb
DATASETS = 8  # FEATURES bit 3
FIXED = 16  # FEATURES bit 4: fixed-width indices
NAMES = ["a.npy", "b.npy", "c.npy"]


def free_port():
    x = socket.socket()
    x.bind(("127.0.0.1", 0))
    port = x.getsockname()[1]
    x.close()
    return port


def ds(name):
    return dpb.Dataset(format="npy", sources=[name])


def several(names, indices, of, fingerprints=None, **extra):
    """A ReadSamplesRequest of datasets `names`, index i read from names[of[i]]."""
    fps = fingerprints or [""] * len(names)
    return dpb.ReadSamplesRequest(
        datasets=[dpb.DatasetRef(dataset=ds(n), fingerprint=f) for n, f in zip(names, fps)],
        indices=list(indices), index_datasets=list(of), **extra)


def fixed(req):
    """req with its indices as packed fixed64 and its index_datasets as a byte each
    (docs/data-channel.md, "Fixed-width indices")."""
    out = dpb.ReadSamplesRequest()
    out.CopyFrom(req)
    out.ClearField("indices")
    out.ClearField("index_datasets")
    out.indices_fixed.extend(req.indices)
    if len(req.index_datasets):
        out.index_datasets_bytes = bytes(req.index_datasets)
    return out


def send(s, req):
    s.sendall(dc.frame(req.SerializeToString()))


def check_frames(got, want, keys, what):
    """Frames carry want[p] at position p, each frame's first index being keys[its position]."""
    dr.check_samples(got, None, keys, what, want=want)


class OlderProxy:
    """Forwards data-channel connections to `upstream`. While `older` is set, it takes bits 3
    and 4 out of FEATURES requests (the worker behind then does not offer them, as an older
    one), and closes a connection opened before `older` was set when its next request comes (the
    worker behind the address changed). It counts the ReadSamples requests that pass with
    fixed-width indices and with varints, and the connections."""

    def __init__(self, upstream):
        self.upstream = upstream
        self.older = False
        self.generation = 0  # bumped each time `older` is set
        self.switch_after = None  # set `older` once this many ReadSamples requests passed
        self.requests = 0
        self.stripped = 0
        self.closed = 0
        self.fixed = self.varint = self.conns = 0
        self.mu = threading.Lock()
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.addr = "127.0.0.1:%d" % self.lsock.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def set_older(self):
        with self.mu:
            self.older = True
            self.generation += 1

    def accept(self):
        while True:
            c, _ = self.lsock.accept()
            with self.mu:
                self.conns += 1
            u = socket.create_connection(self.upstream)
            threading.Thread(target=self.requests_of, args=(c, u, self.generation),
                             daemon=True).start()
            threading.Thread(target=self.pump, args=(u, c), daemon=True).start()

    @staticmethod
    def close(*socks):
        for x in socks:
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def pump(self, src, dst):
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        self.close(src, dst)

    def requests_of(self, c, u, born):
        buf = b""
        try:
            while True:
                while len(buf) < 16:
                    data = c.recv(1 << 16)
                    if not data:
                        raise OSError("closed")
                    buf += data
                magic, kind, n = struct.unpack("<IIQ", buf[:16])
                while len(buf) < 16 + n:
                    data = c.recv(1 << 16)
                    if not data:
                        raise OSError("closed")
                    buf += data
                req, buf = buf[:16 + n], buf[16 + n:]
                with self.mu:
                    if self.older and born != self.generation:
                        self.closed += 1
                        raise OSError("the worker behind changed")
                    if kind == 4 and self.older:
                        bits = struct.unpack("<Q", req[16:24])[0]
                        req = req[:16] + struct.pack("<Q", bits & ~(DATASETS | FIXED))
                        self.stripped += 1
                    if kind == 1:
                        self.requests += 1
                        if len(dpb.ReadSamplesRequest.FromString(req[16:]).indices_fixed):
                            self.fixed += 1
                        else:
                            self.varint += 1
                        if self.switch_after is not None and self.requests >= self.switch_after:
                            self.switch_after = None
                            self.older = True
                            self.generation += 1
                            born = self.generation  # this connection's request goes through
                u.sendall(req)
        except OSError:
            pass
        self.close(c, u)


def test(tmpdir):
    root = os.path.join(tmpdir, "data")
    os.makedirs(root)
    rng = np.random.default_rng(27)
    arrays = {"a.npy": np.minimum(rng.zipf(1.3, (300, 64)), 5000).astype(np.int32),
              "b.npy": np.minimum(rng.zipf(1.3, (200, 64)), 5000).astype(np.int32),
              "c.npy": rng.random((50, 48), dtype=np.float32)}
    rows = {}
    for name, arr in arrays.items():
        np.save(os.path.join(root, name), arr)
        rows[name] = [arr[i].tobytes() for i in range(len(arr))]
    coord = bt.coordinator(tmpdir)
    port = free_port()
    daddr = "127.0.0.1:%d" % port
    proxy = OlderProxy(("127.0.0.1", port))
    w = bt.worker(tmpdir, coord.addr, "w1", data_root=root,
                  args=["--data-listen", daddr, "--data-advertise", proxy.addr])
    bt.poll(lambda: any(x["state"] == "alive" for x in bt.status_json(coord.addr)["workers"]),
            15, what="a live worker")

    # interleaved, repeated, each source's indices scattered
    of, idx = [], []
    for k in range(120):
        j = int(rng.integers(0, 3))
        of.append(j)
        idx.append(int(rng.integers(0, len(rows[NAMES[j]]))))
    of += [0, 0, 1]
    idx += [idx[0], 299, 199]
    want = [rows[NAMES[j]][i] for j, i in zip(of, idx)]
    req = several(NAMES, idx, of)

    bt.log("===== the data channel: SAMPLE frames, then RUN frames =====")
    s = dc.connect(daddr)
    send(s, req)
    got, tail = dr.frames(s, "three datasets, no FEATURES")
    bt.check(tail == ("end", len(idx)) and {t for t, *_ in got} == {dc.SAMPLE},
             "without FEATURES: %d SAMPLE frames then END" % len(idx), tail)
    check_frames(got, want, idx, "three datasets, no FEATURES")
    bt.ok("a request of three datasets, indices interleaved and repeated: each sample from the "
          "dataset its index names, in request order")
    answer = dr.features(s, dr.FEATURE_RUNS | DATASETS, "FEATURES RUNS|DATASETS")
    bt.check(answer == dr.FEATURE_RUNS | DATASETS,
             "FEATURES offering RUN frames and bit 3 is answered with both (%#x)" % answer)
    send(s, req)
    got, tail = dr.frames(s, "three datasets, RUN frames")
    bt.check(tail == ("end", len(idx)) and dr.RUN in {t for t, *_ in got},
             "with RUN frames: RUN frames then END", tail)
    check_frames(got, want, idx, "three datasets, RUN frames")
    bt.log("===== fixed-width indices (FEATURES bit 4): the same samples =====")
    s.close()
    s = dc.connect(daddr)
    answer = dr.features(s, dr.FEATURE_RUNS | DATASETS | FIXED, "FEATURES RUNS|DATASETS|FIXED")
    bt.check(answer == dr.FEATURE_RUNS | DATASETS | FIXED,
             "FEATURES offering bit 4 is answered with it (%#x)" % answer)
    send(s, fixed(req))
    got, tail = dr.frames(s, "three datasets, fixed-width indices")
    bt.check(tail == ("end", len(idx)), "fixed-width indices of three datasets: END", tail)
    check_frames(got, want, idx, "three datasets, fixed-width indices")
    one = dpb.ReadSamplesRequest(dataset=ds("b.npy"), indices=[199, 0, 7, 7, 2**7, 2**7 - 1])
    send(s, fixed(one))
    got, tail = dr.frames(s, "one dataset, fixed-width indices")
    check_frames(got, [rows["b.npy"][i] for i in one.indices], list(one.indices),
                 "one dataset, fixed-width indices")
    bt.check(tail == ("end", 6), "fixed-width indices of one dataset: the same rows", tail)
    code, got = hg.Raw(w.addr).read(fixed(req))
    bt.check(code == hg.S.OK and [x.data for x in got] == want and [x.index for x in got] == idx,
             "gRPC ReadSamples with fixed-width indices: the same samples",
             code if code != hg.S.OK else len(got))
    bt.ok("fixed-width indices (packed fixed64, a byte per index's dataset): the samples of "
          "the varint form, on the data channel and over gRPC")
    ab_of = [k % 2 for k in range(40)]
    ab_idx = [int(i) for i in rng.integers(0, 200, 40)]
    send(s, several(NAMES[:2], ab_idx, ab_of))
    got, tail = dr.frames(s, "two datasets of one sample size")
    check_frames(got, [rows[NAMES[j]][i] for j, i in zip(ab_of, ab_idx)], ab_idx,
                 "two datasets of one sample size")
    bt.check(tail == ("end", 40) and len(got) == 1 and got[0][0] == dr.RUN,
             "two sources of one sample size, alternating: one RUN frame for the 40 samples",
             [(t, c) for t, _, c, *_ in got])

    bt.log("===== refused, naming the dataset; the connection and the worker go on =====")
    fp = [hg.Raw(w.addr).describe(ds(n))[1].info.fingerprint for n in NAMES]
    bad = [
        (several(NAMES[:2], [1, 200], [0, 1]), dc.BW_OUT_OF_RANGE,
         ["dataset 1 of 2 (npy b.npy)", "index 200", "position 1", "200 samples"],
         "an index out of range in source b"),
        (several(NAMES[:2], [1, 2], [0, 1], fingerprints=[fp[0], "0" * 64]), dc.BW_MISMATCH,
         ["dataset 1 of 2", "b.npy", "fingerprint"], "a wrong fingerprint of source b"),
        (several(["a.npy", "nope.npy"], [1, 2], [0, 1]), None,
         ["dataset 1 of 2", "nope.npy"], "a dataset that does not exist"),
        (several(NAMES[:2], [1, 2], [0, 5]), dc.BW_INVALID_ARGUMENT,
         ["position 1", "names dataset 5", "2 datasets"], "an index naming dataset 5 of 2"),
        (several(NAMES[:2], [1, 2], [0]), dc.BW_INVALID_ARGUMENT,
         ["2 indices but 1 index_datasets"], "fewer index_datasets than indices"),
        (several(NAMES[:2], [1], [0], dataset=ds("a.npy")), dc.BW_INVALID_ARGUMENT,
         ["not both"], "dataset beside datasets"),
        (several(NAMES[:2], [1], [0], transform=dpb.Transform(spec="flip(0.5)")),
         dc.BW_INVALID_ARGUMENT, ["no transform"], "a transform"),
        (dpb.ReadSamplesRequest(datasets=[dpb.DatasetRef(dataset=ds("a.npy")),
                                          dpb.DatasetRef()], indices=[1], index_datasets=[0]),
         dc.BW_INVALID_ARGUMENT, ["dataset 1 of 2", "has no dataset"], "an entry without one"),
        (several(["a.npy"] * 257, [1], [0]), dc.BW_TOO_BIG, ["257 datasets", "256"],
         "257 datasets"),
        (fixed(several(NAMES[:2], [1, 200], [0, 1])), dc.BW_OUT_OF_RANGE,
         ["dataset 1 of 2 (npy b.npy)", "index 200", "position 1", "200 samples"],
         "fixed-width: an index out of range in source b"),
        (fixed(several(NAMES[:2], [1, 2], [0, 5])), dc.BW_INVALID_ARGUMENT,
         ["position 1", "names dataset 5", "2 datasets"], "fixed-width: a byte naming dataset 5"),
        (fixed(several(NAMES[:2], [1, 2], [0])), dc.BW_INVALID_ARGUMENT,
         ["2 indices but 1 index_datasets_bytes"], "fewer index_datasets_bytes than indices"),
        (dpb.ReadSamplesRequest(dataset=ds("a.npy"), indices=[1], indices_fixed=[2]),
         dc.BW_INVALID_ARGUMENT, ["both `indices` (1) and `indices_fixed` (1)"],
         "indices in both forms"),
        (several(NAMES[:2], [1, 2], [0, 1], index_datasets_bytes=b"\x00\x01"),
         dc.BW_INVALID_ARGUMENT, ["both `index_datasets` (2) and `index_datasets_bytes` (2)"],
         "index datasets in both forms"),
        (dpb.ReadSamplesRequest(dataset=ds("a.npy"), indices_fixed=[1, 300]),
         dc.BW_OUT_OF_RANGE, ["index 300", "position 1", "300 samples"],
         "fixed-width: one dataset, an index out of range"),
    ]
    for r, code, needles, what in bad:
        send(s, r)
        got, tail = dr.frames(s, what)
        code_ok = code is None or tail[:2] == ("error", code)
        bt.check(not got and tail[0] == "error" and code_ok and all(n in tail[2] for n in needles),
                 "data channel: %s -> ERROR naming %r" % (what, needles), tail)
        gcode, details = hg.Raw(w.addr).read(r)
        bt.check(gcode != hg.S.OK and all(n in details for n in needles),
                 "gRPC: %s -> %s naming it" % (what, gcode), details)
    send(s, dpb.ReadSamplesRequest(dataset=ds("a.npy"), indices=[5, 6, 7]))
    got, tail = dr.frames(s, "an older-style request after the errors")
    check_frames(got, [rows["a.npy"][i] for i in (5, 6, 7)], [5, 6, 7], "older-style request")
    bt.check(tail == ("end", 3), "an older-style request (one dataset) is served on the same "
             "connection after the errors", tail)
    s.close()
    s = dc.connect(daddr)
    # a packed fixed64 field that is no whole number of elements (7 bytes), as an attacker
    # would write it by hand: refused naming the field; a malformed request closes its
    # connection (docs/data-channel.md), the worker goes on
    s.sendall(dc.frame(dpb.ReadSamplesRequest(dataset=ds("a.npy")).SerializeToString() +
                       bytes([(10 << 3) | 2, 7]) + b"\x01" * 7))
    got, tail = dr.frames(s, "indices_fixed of 7 bytes")
    bt.check(not got and tail[:2] == ("error", dc.BW_INVALID_ARGUMENT) and
             "indices_fixed: 7 bytes, not a whole number of 8-byte elements" in tail[2],
             "indices_fixed of 7 bytes -> ERROR naming the field", tail)
    bt.check(w.running(), "the worker is still up")
    s.close()

    bt.log("===== gRPC and compression =====")
    code, got = hg.Raw(w.addr).read(several(NAMES, idx, of, fingerprints=fp))
    bt.check(code == hg.S.OK and [x.data for x in got] == want and
             [x.index for x in got] == idx,
             "gRPC ReadSamples of three datasets (fingerprints checked): the same samples",
             code if code != hg.S.OK else len(got))
    s = dc.connect(daddr)
    feats = dr.FEATURE_RUNS | dz.ZSTD | DATASETS
    answer = dr.features(s, feats, "FEATURES RUNS|ZSTD|DATASETS")
    bt.check(answer & feats == feats, "FEATURES with compression and bit 3: both (%#x)" % answer)
    send(s, several(NAMES[:2], ab_idx, ab_of))
    got, tail = dz.frames(s, "two token sources, zstd")
    check_frames(got, [rows[NAMES[j]][i] for j, i in zip(ab_of, ab_idx)], ab_idx,
                 "two token sources, zstd")
    bt.check(tail == ("end", 40) and dz.ZRUN in {t for t, *_ in got},
             "compressed: two token sources' samples as ZRUN frames with the right rows",
             [(t, c) for t, _, c, *_ in got])
    s.close()

    bt.log("===== batchwire fetch --mix: plan = fetch, one request a batch =====")
    sizes, weights, batch = [300, 200], ["0.5", "0.5"], 8
    mix = []
    for n, wt in zip(NAMES[:2], weights):
        mix += ["--mix", "npy:%s=%s" % (n, wt)]
    plan_mix = []
    for n, wt in zip(sizes, weights):
        plan_mix += ["--mix-size", "%d=%s" % (n, wt)]
    want_plan = bwpy.plan("--mode", "torch", *plan_mix, "--world-size", 1, "--batch-size",
                          batch, "--seed", 5)[0]

    def fetch(label, *extra):
        # --prefetch 4: batch by batch, four requests in flight on as many connections, so
        # that the worker turning older meets requests of several datasets in flight
        r = bt.cli("fetch", "--coordinator", coord.addr, "--job", "mix-" + label.split()[0],
                   *mix, "--batch-size", batch, "--seed", 5, "--rank", 0, "--world-size", 1,
                   "--epochs", 1, "--log-level", "debug", "--prefetch", 4, *extra, timeout=60)
        bt.check(r.returncode == 0, "fetch --mix (%s)" % label, r.stderr[-800:])
        lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
        got = [b for b in lines if "epoch" in b]
        bt.check([(b["indices"], b["sources"]) for b in got] ==
                 [(p["indices"], p["sources"]) for p in want_plan],
                 "%s: %d batches = batchwire plan --mix-size" % (label, len(want_plan)),
                 (got[:1], want_plan[:1]))
        bad = [b["step"] for b in got if b["sha256"] != hashlib.sha256(b"".join(
            rows[NAMES[j]][i] for j, i in zip(b["sources"], b["indices"]))).hexdigest()]
        bt.check(not bad, "%s: every batch's bytes are its sources' rows" % label, bad[:5])
        return lines[-1]["summary"]["stats"], len(got), r.stderr

    requests = {}  # the fetch's requests by label: small batches are read a few at a time
    for label, extra in (("data channel", []), ("zstd", ["--compress", "zstd"]),
                         ("gRPC", ["--transport", "grpc"])):
        with proxy.mu:
            proxy.fixed = proxy.varint = proxy.conns = 0
        stats, nb, _ = fetch(label, *extra)
        with proxy.mu:
            counts = (proxy.fixed, proxy.varint, proxy.conns)
        if label != "gRPC":
            bt.check(counts[0] > 0 and counts[1] <= counts[2],
                     "%s: %d requests with fixed-width indices, %d as varints (at most the first "
                     "of each of the %d connections)" % ((label,) + counts), counts)
        requests[label] = stats["requests"]
        if label != "gRPC":
            bt.check(stats["requests"] < 1.5 * nb,
                     "%s: %d requests for %d batches of two sources from one worker (one per "
                     "source would be about %d)" % (label, stats["requests"], nb, 2 * nb), stats)

    bt.log("===== older workers: asked one dataset a request =====")
    proxy.set_older()
    with proxy.mu:
        proxy.fixed = proxy.varint = 0
    stats, nb, _ = fetch("older")
    # Before its first FEATURES answer the worker is not known to lack bit 3: the requests of
    # several datasets in flight then (at most --prefetch 4) are asked again, none after.
    bt.check(proxy.stripped > 0 and stats["requests"] > 1.5 * nb and stats["retries"] <= 4,
             "a worker that does not offer bit 3: %d requests for %d batches (one per source), "
             "%d retries (at most the 4 in flight before its first answer)"
             % (stats["requests"], nb, stats["retries"]), stats)
    bt.check(proxy.fixed == 0 and proxy.varint >= stats["requests"],
             "a worker that does not offer bit 4: all %d requests as varints" % proxy.varint,
             (proxy.fixed, proxy.varint))
    with proxy.mu:
        proxy.older = False
        proxy.requests = 0
        proxy.switch_after = max(2, requests["data channel"] * 2 // 3)  # two thirds in
    stats, nb, err = fetch("turned")
    asked_again = [ln for ln in err.splitlines() if "asked again one dataset a request" in ln]
    bt.check(proxy.closed > 0 and stats["retries"] >= 1 and asked_again and
             requests["data channel"] < stats["requests"] < 2.5 * nb,
             "the worker turned older during the fetch (%d connections closed): the request of "
             "several datasets that reached it was asked again the old way (%d retries, %d "
             "requests for %d batches)" % (proxy.closed, stats["retries"], stats["requests"], nb),
             (stats, asked_again[:1]))

    bt.log("===== ownership: every index's shard, whatever its dataset =====")
    w2 = bt.worker(tmpdir, coord.addr, "w2", data_root=root)
    cc = bd.DataClient(tmpdir, coord.addr)
    table = bt.poll(lambda: (lambda t: t if len(t.workers) == 2 else None)(cc.placement(16)),
                    15, interval=0.1, what="two workers in the placement")
    cc.close()
    w.wait_log(r"placement version %d: 2 live workers" % table.version)
    ids = [x.id for x in table.workers]
    mine = [i for i in range(200) if ids[table.owners[i % 16]] == "w1"]
    theirs = [i for i in range(200) if ids[table.owners[i % 16]] == "w2"]
    rt = dpb.Routing(placement_version=table.version, num_shards=16,
                     shard_mode=dpb.SHARD_MODE_MODULO)
    s = dc.connect(daddr)
    send(s, several(NAMES[:2], mine[:3] + mine[:3], [0, 0, 0, 1, 1, 1], routing=rt))
    got, tail = dr.frames(s, "w1's own indices of two datasets, routed")
    check_frames(got, [rows[NAMES[j]][i] for j, i in zip([0] * 3 + [1] * 3, mine[:3] * 2)],
                 mine[:3] * 2, "w1's own indices of two datasets, routed")
    bt.check(tail == ("end", 6), "routed by placement version %d: w1's own indices of both "
             "datasets are served" % table.version, tail)
    send(s, several(NAMES[:2], mine[:2] + theirs[:1], [0, 0, 1], routing=rt))
    got, tail = dr.frames(s, "an index of b owned by w2, sent to w1")
    bt.check(not got and tail[:2] == ("error", dc.BW_WRONG_OWNER) and
             "owned by worker w2" in tail[2],
             "an index of the second dataset owned by w2, sent to w1 -> BW_WRONG_OWNER", tail)
    s.close()
    bt.check(w.running() and w2.running(), "the workers are still up")
    w2.stop()
    w.stop()
    coord.stop()


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=180)
