"""Named arrays indexed together (issue 29; docs/formats.md, "Named arrays"): features and
labels of different dtypes and shapes as one dataset, against real PyTorch.

Data (written by numpy, not by batchwire): x float32 [N, 3, 4, 4] and y int64 [N], random,
each split over three .npy files the same way; the same arrays in one np.savez archive and
split over two archives; a coordinator and two workers on loopback.

* A 4-rank job over {"x": "npy:x/*.npy", "y": "npy:y/*.npy"} equals, batch for batch, torch's
  DataLoader(TensorDataset(x, y, index), sampler=DistributedSampler(...)) -- the indices and
  both tensors' bytes -- shuffled, over three epochs, for the drop_last variants (the
  sampler's and the DataLoader's), over the data channel and over gRPC, and the same over
  the .npz archives; padding is flagged where DistributedSampler repeats indices.
* Resuming rank 0 from a cursor taken mid-epoch, and SIGKILLing a worker mid-epoch, change
  nothing; an elastic resume (4 ranks -> 2 mid-epoch) serves every sample exactly once with
  its own x and y.
* batchwire.torch.BatchDataset(arrays="tuple" | "dict"), and samples=True under a plain
  DataLoader(batch_size=B), give what DataLoader(TensorDataset(x, y)) gives.
* batchwire fetch --dataset-field prints a sha256 per field equal to the rows' bytes.
* batchwire gen --fields writes arrays numpy reads back and the loader serves (npy and npz).
* Refused at job creation, naming the field: different lengths, different splits, a missing
  file, a compressed archive (saying to use np.savez), a bad field name, a field that is not
  npy; joining an existing job with another field-set is a mismatch naming the field.
"""

import hashlib
import json
import os
import sys
import zipfile

import bwpy
import bwtest as bt

bwpy.maybe_reexec_under_asan()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

N = 103
WORLD = 4
B = 5
EPOCHS = 3
SEED = 11
SPLIT = (0, 40, 77, N)  # rows of each of the three files
LEAKS = {"ASAN_OPTIONS": "detect_leaks=1"}  # sanitizer builds: this child checks for leaks


def reference(x, y, rank, epoch, sampler_drop_last, drop_last):
    """What a DDP trainer's DataLoader(TensorDataset(x, y)) yields on `rank` in `epoch`:
    [(indices, x bytes, y bytes)]."""
    ds = TensorDataset(torch.from_numpy(x), torch.from_numpy(y), torch.arange(N))
    s = DistributedSampler(ds, num_replicas=WORLD, rank=rank, shuffle=True, seed=SEED,
                           drop_last=sampler_drop_last)
    s.set_epoch(epoch)
    out = []
    for bx, by, bi in DataLoader(ds, batch_size=B, sampler=s, drop_last=drop_last):
        out.append((bi.tolist(), bx.numpy().tobytes(), by.numpy().tobytes()))
    return out


def test(tmpdir):
    batchwire = bwpy.import_batchwire()
    root = os.path.join(tmpdir, "data")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((N, 3, 4, 4)).astype(np.float32)
    y = rng.integers(0, 1000, N).astype(np.int64)
    for name, arr in (("x", x), ("y", y)):
        os.makedirs(os.path.join(root, name))
        for k in range(3):
            np.save(os.path.join(root, name, "part-%d.npy" % k), arr[SPLIT[k]:SPLIT[k + 1]])
    np.savez(os.path.join(root, "xy.npz"), x=x, y=y)
    os.makedirs(os.path.join(root, "npz2"))
    np.savez(os.path.join(root, "npz2", "a.npz"), x=x[:60], y=y[:60])
    np.savez(os.path.join(root, "npz2", "b.npz"), x=x[60:], y=y[60:])
    # zip64 end records and central directory extras, as archives over 4 GiB have (zipfile
    # writes them past its limits: lowered here to make a small one)
    limits = zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT
    zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = 100, 1
    try:
        np.savez(os.path.join(root, "xy64.npz"), x=x, y=y)
    finally:
        zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = limits
    with open(os.path.join(root, "xy64.npz"), "rb") as f:
        bt.check(b"PK\x06\x06" in f.read(), "an .npz with zip64 end of central directory records")
    with zipfile.ZipFile(os.path.join(root, "xy.npz")) as z:
        bt.check(all(i.compress_type == zipfile.ZIP_STORED for i in z.infolist()),
                 "np.savez writes stored (uncompressed) members")
    coord, workers = bwpy.cluster(tmpdir, root, 2)
    fields = {"x": "npy:x/*.npy", "y": "npy:y/part-0.npy,y/part-1.npy,y/part-2.npy"}

    def run_rank(job, dataset, rank, sdl, dl, **kw):
        got = []
        with batchwire.Loader(coordinator=coord.addr, job=job, dataset=dataset, batch_size=B,
                              shuffle=True, seed=SEED, sampler_drop_last=sdl, drop_last=dl,
                              rank=rank, world_size=WORLD, **kw) as lo:
            for epoch in lo.epochs(EPOCHS):
                for b in lo:
                    f = b.fields()
                    t = b.fields(as_torch=True)
                    if not (list(f) == ["x", "y"] and f["x"].dtype == np.float32 and
                            f["x"].shape == (b.count, 3, 4, 4) and f["y"].dtype == np.int64 and
                            f["y"].shape == (b.count,) and isinstance(t["x"], torch.Tensor) and
                            t["y"].dtype == torch.int64):
                        bt.check(False, "fields(): x [B,3,4,4] float32 and y [B] int64",
                                 {k: (v.dtype, v.shape) for k, v in f.items()})
                    got.append((epoch, b.indices.tolist(), f["x"].tobytes(), f["y"].tobytes(),
                                np.flatnonzero(b.padding).tolist(),
                                t["x"].numpy().tobytes() == f["x"].tobytes()))
        return got

    def compare(label, results, sdl, dl):
        for rank in range(WORLD):
            want = []
            for epoch in range(EPOCHS):
                for bi, bx, by in reference(x, y, rank, epoch, sdl, dl):
                    want.append((epoch, bi, bx, by))
            got = results[rank]
            bt.check(len(got) == len(want),
                     "%s rank %d: %d batches, as torch's DataLoader" % (label, rank, len(want)),
                     "got %d" % len(got))
            for g, w in zip(got, want):
                if g[:4] != w:
                    bt.check(False, "%s rank %d epoch %d: batch equals torch's" %
                             (label, rank, w[0]),
                             "indices %r vs %r; x equal %s; y equal %s" %
                             (g[1], w[1], g[2] == w[2], g[3] == w[3]))
                if not g[5]:
                    bt.check(False, "%s rank %d: fields(as_torch=True) views the same bytes as "
                             "fields()" % (label, rank))
        bt.ok("%s: %d ranks x %d epochs equal DataLoader(TensorDataset(x, y), "
              "DistributedSampler(shuffle, seed=%d, drop_last=%s), drop_last=%s) in indices and "
              "both tensors' bytes" % (label, WORLD, EPOCHS, SEED, sdl, dl))

    variants = [(False, False), (True, True), (False, True)]
    for sdl, dl in variants:
        for label, ds, kw in (("fields over the data channel", fields, {}),
                              ("fields over gRPC", fields, {"transport": "grpc"}),
                              ("one .npz", "npz:xy.npz", {}),
                              ("two .npz archives", "npz:npz2/*.npz", {"transport": "grpc"}),
                              ("a zip64 .npz", "npz:xy64.npz", {})):
            if (sdl, dl) != (False, False) and label not in ("fields over the data channel",
                                                              "one .npz"):
                continue
            job = "arr-%s-%d%d" % (label.replace(" ", "-").replace(".", ""), sdl, dl)
            res = bwpy.in_threads(lambda r: run_rank(job, ds, r, sdl, dl, **kw), range(WORLD))
            compare(label, res, sdl, dl)
            # padding where DistributedSampler repeats (both drop_lasts off): flagged
            if not sdl and not dl:
                flagged = sum(len(g[4]) for r in range(WORLD) for g in res[r])
                bt.check(flagged == EPOCHS * (-(-N // WORLD) * WORLD - N),
                         "%s: %d padding samples flagged (DistributedSampler's repeats)" %
                         (label, flagged))

    # ---- resume from a cursor mid-epoch, and a worker SIGKILLed mid-epoch
    want = [w for e in range(EPOCHS) for w in
            [(e,) + r for r in reference(x, y, 0, e, False, False)]]

    def open0(job, **kw):
        return batchwire.Loader(coordinator=coord.addr, job=job, dataset=fields, batch_size=B,
                                shuffle=True, seed=SEED, rank=0, world_size=WORLD, **kw)

    # views stay valid after the loader moved on (as numpy()'s do)
    with open0("arr-views") as lo:
        kept = [(b.indices.tolist(), b.fields(), b.fields(as_torch=True)) for b in lo]
    w0 = reference(x, y, 0, 0, False, False)
    bt.check(len(kept) == len(w0) and all(
        k[0] == w[0] and k[1]["x"].tobytes() == w[1] and k[1]["y"].tobytes() == w[2] and
        k[2]["x"].numpy().tobytes() == w[1] and k[2]["y"].numpy().tobytes() == w[2]
        for k, w in zip(kept, w0)),
        "every batch's fields() (numpy and torch) kept past the epoch and the loader's close "
        "still hold their rows")
    del kept

    got = []
    with open0("arr-resume") as lo:
        it = iter(lo)
        for _ in range(4):
            b = next(it)
            got.append((0, b.indices.tolist(), b.fields()["x"].tobytes(),
                        b.fields()["y"].tobytes()))
        cursor = lo.cursor()
    with open0("arr-resume", resume=cursor) as lo:
        for epoch in lo.epochs(EPOCHS):
            for b in lo:
                f = b.fields()
                got.append((epoch, b.indices.tolist(), f["x"].tobytes(), f["y"].tobytes()))
    bt.check(got == [(w[0], w[1], w[2], w[3]) for w in want],
             "resumed from a cursor after 4 batches: %d batches equal torch's, none repeated "
             "or lost" % len(want))

    got = []
    with open0("arr-kill", timeout=20, prefetch=1) as lo:
        n = 0
        for epoch in lo.epochs(EPOCHS):
            for b in lo:
                f = b.fields()
                got.append((epoch, b.indices.tolist(), f["x"].tobytes(), f["y"].tobytes()))
                n += 1
                if n == 3:
                    workers[0].kill9()
        failovers = lo.stats()["failovers"]
    bt.check(got == [(w[0], w[1], w[2], w[3]) for w in want] and failovers >= 1,
             "a worker SIGKILLed mid-epoch (%d failover(s)): the rest read from the other "
             "worker, equal to torch's (%d batches)" % (failovers, len(want)))
    # in a sanitizer build this worker and the command-line runs below check for leaks
    # (the test's own python runs with detect_leaks=0)
    workers[0] = bt.worker(tmpdir, coord.addr, "w2", data_root=root, env=LEAKS)

    # ---- elastic resume: 4 ranks stop after 2 batches, 2 ranks finish the epoch
    eopts = dict(coordinator=coord.addr, dataset=fields, batch_size=B, shuffle=True, seed=SEED)
    seen = []
    for rank in range(WORLD):
        with batchwire.Loader(job="arr-elastic", rank=rank, world_size=WORLD, **eopts) as lo:
            for _ in range(2):
                b = lo.next_batch()
                seen.append((b.indices.tolist(), b.padding.tolist(), b.fields()))
            lo.commit()
    ck = batchwire.job_checkpoint(coordinator=coord.addr, job="arr-elastic")

    def new_rank(rank):
        with batchwire.Loader(job="arr-elastic", rank=rank, world_size=2, elastic=True,
                              resume=ck, **eopts) as lo:
            return [(b.indices.tolist(), b.padding.tolist(), b.fields()) for b in lo]

    for v in bwpy.in_threads(new_rank, range(2)).values():
        seen.extend(v)
    real = sorted(i for idx, pad, _f in seen for i, p in zip(idx, pad) if not p)
    rows_ok = all((f["x"] == x[idx]).all() and (f["y"] == y[idx]).all() for idx, _p, f in seen)
    bt.check(real == list(range(N)) and rows_ok,
             "elastic resume 4 -> 2 ranks mid-epoch: every sample exactly once (padding "
             "aside), each batch's x and y the rows of its indices")

    # ---- batchwire.torch: tuples and dicts, as DataLoader(TensorDataset(x, y)) gives
    import batchwire.torch as bwt
    ref = reference(x, y, 1, 0, False, False)
    common = dict(coordinator=coord.addr, dataset=fields, batch_size=B, shuffle=True,
                  seed=SEED, rank=1, world_size=WORLD)
    items = list(bwt.DataLoader(bwt.BatchDataset(job="arr-torch-t", arrays="tuple", **common)))
    bt.check(len(items) == len(ref) and all(
        isinstance(it, tuple) and len(it) == 2 and it[0].numpy().tobytes() == r[1] and
        it[1].numpy().tobytes() == r[2] and it[1].dtype == torch.int64
        for it, r in zip(items, ref)),
        "BatchDataset(arrays='tuple') under batchwire.torch.DataLoader: (x, y) tuples equal "
        "torch's, %d batches" % len(ref),
        [(type(it).__name__, [getattr(v, "shape", v) for v in it]) for it in items[:3]])
    items = list(DataLoader(bwt.BatchDataset(job="arr-torch-l", arrays="tuple", **common),
                            batch_size=None, num_workers=2, multiprocessing_context="forkserver",
                            timeout=60))
    bt.check(len(items) == len(ref) and all(
        len(it) == 2 and it[0].numpy().tobytes() == r[1] and it[1].numpy().tobytes() == r[2]
        for it, r in zip(items, ref)),
        "BatchDataset(arrays='tuple') under torch's DataLoader with 2 worker processes: "
        "[x, y] (default_convert's list, as for TensorDataset) equal torch's, in order")
    items = list(bwt.DataLoader(bwt.BatchDataset(job="arr-torch-d", arrays="dict", **common)))
    bt.check(len(items) == len(ref) and all(
        list(it) == ["x", "y"] and it["x"].numpy().tobytes() == r[1] and
        it["y"].numpy().tobytes() == r[2] for it, r in zip(items, ref)),
        "BatchDataset(arrays='dict'): {'x', 'y'} dicts equal torch's")
    items = list(bwt.DataLoader(bwt.BatchDataset(job="arr-torch-i", **common)))
    bt.check(all(it["data"]["y"].numpy().tobytes() == r[2] and it["indices"].tolist() == r[0]
                 for it, r in zip(items, ref)),
             "BatchDataset(): the item dict's data is {'x', 'y'}, with indices")
    items = list(bwt.DataLoader(bwt.BatchDataset(job="arr-torch-s", samples=True, **common),
                                batch_size=B))
    bt.check(len(items) == len(ref) and all(
        it[0].numpy().tobytes() == r[1] and it[1].numpy().tobytes() == r[2]
        for it, r in zip(items, ref)),
        "BatchDataset(samples=True) under DataLoader(batch_size=%d): [x, y] as "
        "TensorDataset's" % B)

    # ---- batchwire fetch: a sha256 per field
    r = bt.cli("fetch", "--coordinator", coord.addr, "--job", "arr-cli", "--dataset-field",
               "x=npy:x/*.npy", "--dataset-field", "y=npy:y/*.npy", "--rank", "2",
               "--world-size", str(WORLD), "--batch-size", str(B), "--shuffle", "--seed",
               str(SEED), env=LEAKS, timeout=60)
    bt.check(r.returncode == 0, "batchwire fetch --dataset-field x=... --dataset-field y=...",
             r.stderr)
    lines = [json.loads(s) for s in r.stdout.splitlines() if '"step"' in s]
    ref = reference(x, y, 2, 0, False, False)
    ok = len(lines) == len(ref)
    for o, (bi, bx, by) in zip(lines, ref):
        ok &= o["indices"] == bi and \
            o["fields"]["x"]["sha256"] == hashlib.sha256(bx).hexdigest() and \
            o["fields"]["y"]["sha256"] == hashlib.sha256(by).hexdigest() and \
            o["fields"]["x"]["shape"] == [len(bi), 3, 4, 4] and \
            o["fields"]["y"]["dtype"] == "<i8"
    bt.check(ok, "fetch's JSON lines: a sha256, dtype and shape per field, equal to the rows' "
                 "bytes (%d batches)" % len(ref), r.stdout[:400])

    # ---- batchwire gen --fields (npy and npz)
    for fmt in ("npy", "npz"):
        out = os.path.join(root, "gen-" + fmt)
        r = bt.cli("gen", "--format", fmt, "--out", out, "--num-samples", "57", "--files", "2",
                   "--fields", "img:float32:2,3", "label:int64", "--progress-ms", "0")
        bt.check(r.returncode == 0, "batchwire gen --format %s --fields img:float32:2,3 "
                                    "label:int64" % fmt, r.stderr)
        desc = json.loads(r.stdout)
        if fmt == "npy":
            gx = np.concatenate([np.load(os.path.join(out, "img", "part-%05d.npy" % k))
                                 for k in range(2)])
            gy = np.concatenate([np.load(os.path.join(out, "label", "part-%05d.npy" % k))
                                 for k in range(2)])
            ds = {s.split("=")[0]: s.split("=", 1)[1].replace("npy:", "npy:gen-npy/")
                  for s in desc["dataset_fields"]}
        else:
            zs = [np.load(os.path.join(out, "part-%05d.npz" % k)) for k in range(2)]
            gx = np.concatenate([z["img"] for z in zs])
            gy = np.concatenate([z["label"] for z in zs])
            ds = "npz:gen-npz/part-*.npz"
        bt.check(gx.shape == (57, 2, 3) and gx.dtype == np.float32 and gy.shape == (57,) and
                 gy.dtype == np.int64 and set(gy.tolist()) <= set(range(10)),
                 "gen %s: numpy reads img [57,2,3] float32 and label [57] int64 (classes 0-9)"
                 % fmt)
        with batchwire.Loader(coordinator=coord.addr, job="arr-gen-" + fmt, dataset=ds,
                              batch_size=8, rank=0, world_size=1) as lo:
            okg = True
            for b in lo:
                f = b.fields()
                okg &= (f["img"] == gx[b.indices]).all() and (f["label"] == gy[b.indices]).all()
        bt.check(okg, "gen %s: the loader serves what numpy reads" % fmt)

    # ---- the example trainer learns from the labels (examples/fields_train.py)
    r = bt.cli("gen", "--format", "npz", "--out", os.path.join(root, "cls"), "--num-samples",
               "1200", "--files", "2", "--fields", "x:float32:3,4,4", "y:int64",
               "--progress-ms", "0")
    bt.check(r.returncode == 0, "gen a classification dataset as .npz", r.stderr)
    env = dict(os.environ, PYTHONPATH=os.path.join(bt.SOURCE_DIR, "python"), RANK="0",
               WORLD_SIZE="1")
    r = bt.run([sys.executable, os.path.join(bt.SOURCE_DIR, "examples", "fields_train.py"),
                "--coordinator", coord.addr, "--dataset", "npz:cls/part-*.npz", "--epochs",
                "3", "--batch-size", "32"], env=env, timeout=120)
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    acc = float(last.rsplit(" ", 1)[1]) if "accuracy" in last else 0.0
    bt.check(r.returncode == 0 and acc >= 0.9,
             "examples/fields_train.py learns the labels: %s" % last, r.stdout + r.stderr)

    # ---- the wire (docs/data-channel.md, docs/formats.md): Describe's fields, a sample's bytes
    # as row i of x then row i of y, and requests a hostile client makes
    import grpc
    import bwdata as bd
    c = bd.DataClient(tmpdir, workers[0].addr)
    pbm = c.pb

    def fields_ds(spec):
        return pbm.Dataset(format="fields", fields=[
            pbm.DatasetField(name=n, format=f, sources=src) for n, f, src in spec])

    xy = [("x", "npy", ["x/*.npy"]), ("y", "npy", ["y/*.npy"])]
    info = c._describe(pbm.DescribeRequest(dataset=fields_ds(xy)), timeout=20).info
    bt.check(info.format == "fields" and info.length == N and
             [f.name for f in info.fields] == ["x", "y"] and
             info.fields[0].layout.dtype == "<f4" and list(info.fields[0].layout.shape) ==
             [3, 4, 4] and info.fields[1].layout.sample_bytes == 8 and
             info.layout.sample_bytes == 3 * 4 * 4 * 4 + 8 and
             [s.records for s in info.fields[1].sources] == [40, 37, 26] and
             len(info.sources) == 3,
             "Describe: DatasetInfo.fields gives each field's name, layout and files", info)
    idx = [5, 0, 102, 5]
    got = c._assemble(c._read(pbm.ReadSamplesRequest(dataset=fields_ds(xy), indices=idx,
                                                     fingerprint=info.fingerprint), timeout=20))
    bt.check([g["data"] for g in got] == [x[i].tobytes() + y[i].tobytes() for i in idx],
             "ReadSamples: each sample's bytes are row i of x then row i of y, one request")
    SC = grpc.StatusCode
    hostile = [
        ("65 fields", fields_ds([("f%d" % k, "npy", ["y/*.npy"]) for k in range(65)]),
         SC.INVALID_ARGUMENT, "1 to 64 fields"),
        ("a control character in a name", fields_ds([("x\x01", "npy", ["x/*.npy"])]),
         SC.INVALID_ARGUMENT, "control character"),
        ("fields and sources at once", pbm.Dataset(format="fields", sources=["x/part-0.npy"],
                                                   fields=fields_ds(xy).fields),
         SC.INVALID_ARGUMENT, "lists no sources of its own"),
        ("fields under another format", pbm.Dataset(format="npz", sources=["xy.npz"],
                                                    fields=fields_ds(xy).fields),
         SC.INVALID_ARGUMENT, "lists fields but its format is 'npz'"),
        ("a field outside the data root", fields_ds([("x", "npy", ["../x.npy"])]),
         SC.PERMISSION_DENIED, "field 'x'"),
        ("no fields", pbm.Dataset(format="fields"), SC.INVALID_ARGUMENT, "1 to 64 fields"),
    ]
    for label, ds, code, words in hostile:
        details, _ = bd.expect_error(
            lambda: c._describe(pbm.DescribeRequest(dataset=ds), timeout=20), code, words)
        bt.ok("a hostile request, %s, refused: %s" % (label, details[-120:]))
    c.close()

    # ---- refusals at job creation, naming the field
    np.save(os.path.join(root, "y_short.npy"), y[:N - 1])
    os.makedirs(os.path.join(root, "y2"))
    np.save(os.path.join(root, "y2", "a.npy"), y[:50])
    np.save(os.path.join(root, "y2", "b.npy"), y[50:])
    np.savez_compressed(os.path.join(root, "c.npz"), x=x, y=y)
    cases = [
        ("different lengths", {"x": "npy:x/*.npy", "y": "npy:y_short.npy"},
         batchwire.MismatchError, ["field 'y'", "102", "103", "same length"]),
        ("different splits", {"x": "npy:x/*.npy", "y": "npy:y2/*.npy"},
         batchwire.MismatchError, ["field 'y'", "split"]),
        ("a missing file", {"x": "npy:x/*.npy", "lab": "npy:y/nope.npy"},
         batchwire.NotFoundError, ["field 'lab'", "y/nope.npy"]),
        ("a compressed .npz", "npz:c.npz", batchwire.UnimplementedError,
         ["c.npz", "compressed", "np.savez", "savez_compressed"]),
        ("a field name with a space", {"x": "npy:x/*.npy", "my y": "npy:y/*.npy"},
         batchwire.InvalidArgumentError, ["my y", "space"]),
        ("a field that is not npy", {"x": "npy:x/*.npy", "y": "tar:y/*.npy"},
         batchwire.InvalidArgumentError, ["field 'y'", "npy"]),
    ]
    for label, ds, exc, words in cases:
        try:
            batchwire.Loader(coordinator=coord.addr, job="arr-bad-" + label.replace(" ", "-"),
                             dataset=ds, batch_size=4, rank=0, world_size=1).close()
            bt.check(False, "%s refused" % label)
        except exc as e:
            msg = str(e)
            bt.check(all(w in msg for w in words), "%s refused (%s): %s" %
                     (label, exc.__name__, msg[-230:]), msg)
    # a job is one field-set: joining it with other fields is refused, naming the difference
    for other, what in (({"x": "npy:x/*.npy", "z": "npy:y/*.npy"}, "dataset.fields[1].name"),
                        ({"x": "npy:x/*.npy"}, "dataset.fields: job has 2, request has 1")):
        try:
            batchwire.Loader(coordinator=coord.addr, job="arr-resume", dataset=other,
                             batch_size=B, shuffle=True, seed=SEED, rank=0,
                             world_size=WORLD).close()
            bt.check(False, "another field-set for an existing job refused")
        except batchwire.MismatchError as e:
            bt.check(what in str(e), "joining a job with other fields refused: %s" %
                     str(e)[-160:], str(e))
    r = bt.cli("fetch", "--coordinator", coord.addr, "--job", "arr-bad-cli", "--dataset-field",
               "x=npy:x/*.npy", "--dataset-field", "y=npy:y_short.npy", "--rank", "0",
               "--world-size", "1", env=LEAKS)
    bt.check(r.returncode != 0 and "field 'y'" in r.stderr,
             "batchwire fetch refuses mismatched lengths naming the field", r.stderr)
    bt.check(all(w.running() for w in workers) and coord.running(),
             "after every refusal the coordinator and the workers are up",
             [(w.name, w.proc.returncode, w.log_text()[-1500:]) for w in workers])
    rc = workers[0].stop()
    log = workers[0].log_text()
    bt.check(rc == 0 and "Sanitizer" not in log,
             "the worker that served the wire checks and the hostile requests stops cleanly "
             "(exit 0, no sanitizer report)", log[-2000:])


if __name__ == "__main__":
    bt.main(test, timeout=300)
