"""Transforms run by the workers (issue 28, item 1; docs/transforms.md, "On the workers"):

* a job of 2 ranks with `batchwire fetch --transform` over `gen --format jpeg` files, shuffled,
  two epochs, served by two workers: every batch is one float32 [B, 3, H, W] tensor equal to
  torchvision's on the same files with the same parameters -- the random_resized_crop boxes
  and flips re-derived from docs/transforms.md by test_transform_equiv's helpers, keyed by
  (seed, epoch, source, dataset index) -- compared by the SHA-256 of the batch's bytes;
* the same over `gen --format tar-jpeg` (3 ranks, --transform-field jpg), whose samples lie in
  three shards (the key's source is the shard); read with fields, the cls member passes
  through and the jpg member is the tensor;
* the same through the Python binding (transform=): Batch.numpy() is the tensor itself, and
  over gRPC instead of the data channel;
* a rank stopped at a random step and resumed from its cursor delivers the same tensors as the
  uninterrupted run;
* a corrupt (truncated) JPEG fails its batch with an error naming the source and the sample's
  index, never an empty tensor; the spec is checked before anything is asked of a worker and
  its canonical text is part of the job's configuration (another transform: BW_MISMATCH);
* the pool (--transform-threads 1 and 3: windows of 2 and 6 samples) and its metrics (time per
  sample, failures by code); results larger than --inflight-bytes are refused naming it;
* a 4-rank job with a worker SIGKILLed mid-job: the ranks that fail over still get
  torchvision's tensors;
* token arrays: truncate and pad over an npy dataset of int32 rows equal numpy's slicing and
  np.pad, over the CLI and Python; a pad value outside the rows' type and other formats are
  refused;
* the acceptance of issue 28 as a user runs it: 4 ranks at once, each stopped at a random step
  and resumed from its cursor after a worker was SIGKILLed, deliver the tensors of an
  uninterrupted run.

BW_TF_RESUME_STEP=K resumes at step K instead of a random one.
"""

import hashlib
import json
import os
import random
import re
import shutil
import sys
import tarfile
import threading
import urllib.request

import numpy as np
import torchvision.transforms.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwpy  # noqa: E402
import bwtest as bt  # noqa: E402
import test_transform_equiv as te  # noqa: E402  (the documented PRNG and boxes, shared)

SIDE = 32
SPEC = "decode | random_resized_crop(%d) | flip(0.5) | %s | chw" % (SIDE, te.NORM)
SEED = 99


def expected(path, seed, epoch, source, index):
    """The sample's tensor as torchvision computes it with the documented draws."""
    im = te.pil(path)
    box = te.rrc_params(te.Rng(seed, epoch, source, index, 1), im.height, im.width)
    ref = F.resized_crop(im, *box, [SIDE, SIDE])
    if te.Rng(seed, epoch, source, index, 2).uniform() < 0.5:
        ref = F.hflip(ref)
    return F.normalize(F.to_tensor(ref), te.MEAN, te.STD).numpy()


def fetch(coord, job, dataset, rank, world, *extra, timeout=120):
    r = bt.cli("fetch", "--coordinator", coord.addr, "--job", job, "--dataset", dataset,
               "--rank", rank, "--world-size", world, "--batch-size", 4, "--shuffle",
               "--seed", SEED, "--transform", SPEC, *extra, timeout=timeout)
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    return r, [x for x in lines if "step" in x]


def check_batches(what, batches, sample_of):
    """Every batch's bytes are the stacked torchvision tensors of its indices."""
    bt.check(batches, "%s: batches delivered" % what)
    for b in batches:
        want = np.stack([expected(sample_of(i)[0], SEED, b["epoch"], sample_of(i)[1], i)
                         for i in b["indices"]])
        bt.check(b["dtype"] == "<f4" and b["shape"] == [len(b["indices"]), 3, SIDE, SIDE],
                 "%s: epoch %d step %d is one float32 [B, 3, %d, %d] tensor" %
                 (what, b["epoch"], b["step"], SIDE, SIDE), b)
        bt.check(b["sha256"] == hashlib.sha256(want.tobytes()).hexdigest(),
                 "%s: epoch %d step %d (indices %s) equals torchvision's tensors" %
                 (what, b["epoch"], b["step"], b["indices"]))


def gen(tmpdir, fmt, out, n, *extra):
    r = bt.cli("gen", "--format", fmt, "--out", out, "--num-samples", n, "--seed", 5,
               "--image-min", 24, "--image-max", 120, *extra)
    bt.check(r.returncode == 0, "gen --format %s" % fmt, r.stderr)
    return json.loads(r.stdout)


def check_files(tmpdir, coord, data):
    n = 22
    gen(tmpdir, "jpeg", os.path.join(data, "imgs"), n)
    files = [os.path.join(data, "imgs", "samples", "sample%08d.jpg" % i) for i in range(n)]
    runs = {}
    for rank in range(2):
        r, batches = fetch(coord, "tf-files", "files:imgs/samples", rank, 2, "--epochs", 2)
        bt.check(r.returncode == 0, "rank %d of the files job ran two epochs" % rank, r.stderr)
        bt.check({b["epoch"] for b in batches} == {0, 1}, "two epochs delivered", batches)
        check_batches("files rank %d" % rank, batches, lambda i: (files[i], 0))
        runs[rank] = batches
    e0 = sorted(i for rank in runs for b in runs[rank] if b["epoch"] == 0 for i in b["indices"])
    bt.check(set(e0) == set(range(n)), "the two ranks together see every sample in epoch 0")
    bt.ok("files dataset, 2 ranks, 2 epochs: every batch equals torchvision's tensors with the "
          "documented draws (seed, epoch, source, index)")
    r, batches = fetch(coord, "tf-files", "files:imgs/samples", 0, 2, "--epochs", 2,
                       "--transport", "grpc")
    bt.check(r.returncode == 0, "rank 0 again over gRPC", r.stderr)
    bt.check([b["sha256"] for b in batches] == [b["sha256"] for b in runs[0]],
             "over gRPC: the same tensors as over the data channel")

    # Resume at a random step: the same tensors as the uninterrupted run.
    full = runs[1]
    k = int(os.environ.get("BW_TF_RESUME_STEP", 0)) or random.Random().randrange(1, len(full) - 1)
    cur = os.path.join(tmpdir, "cursor")
    r, first = fetch(coord, "tf-files-resume", "files:imgs/samples", 1, 2, "--epochs", 2,
                     "--max-steps", k, "--cursor-out", cur)
    bt.check(r.returncode == 0 and len(first) == k, "a rank stopped after %d batches" % k,
             r.stderr)
    # --epochs counts the rest of the cursor's epoch as the first.
    left = 2 - full[k - 1]["epoch"]  # the cursor's epoch
    r, rest = fetch(coord, "tf-files-resume", "files:imgs/samples", 1, 2, "--epochs", left,
                    "--resume", open(cur).read().strip())
    bt.check(r.returncode == 0, "the rank resumed from its cursor", r.stderr)
    strip = [{key: b[key] for key in ("epoch", "step", "indices", "sha256")} for b in full]
    again = [{key: b[key] for key in ("epoch", "step", "indices", "sha256")} for b in first + rest]
    bt.check(again == strip, "resumed at step %d: the same tensors as the uninterrupted run" % k,
             (len(again), len(strip)))
    bt.ok("resume at step %d of %d gives the same tensors" % (k, len(full)))
    return files


def check_failover(tmpdir, coord, data, files):
    # A 4-rank job over three workers; the third is SIGKILLed after ranks 0 and 1 ran (its
    # placement still lists it), so ranks 2 and 3 find it dead and fetch its samples from the
    # next owners: every batch is still torchvision's tensors, as the key does not name a
    # worker.
    w3 = bt.worker(tmpdir, coord.addr, "w3", data_root=data, args=["--transform-threads", 2])
    bt.poll(lambda: sum(w["state"] == "alive" for w in bt.status_json(coord.addr)["workers"])
            == 3, 15, interval=0.1, what="3 live workers")
    served = {}
    for rank in range(4):
        if rank == 2:
            w3.kill9()
        r, batches = fetch(coord, "tf-kill", "files:imgs/samples", rank, 4, "--epochs", 2)
        bt.check(r.returncode == 0, "rank %d of the 4-rank job ran" % rank, r.stderr)
        check_batches("4-rank rank %d" % rank, batches, lambda i: (files[i], 0))
        served[rank] = r
    failovers = sum(json.loads(x)["summary"]["stats"]["failovers"]
                    for rank in (2, 3) for x in served[rank].stdout.splitlines()
                    if x.startswith('{"summary"'))
    bt.check(failovers > 0, "ranks 2 and 3 failed over from the killed worker (%d)" % failovers)
    bt.ok("4 ranks, a worker SIGKILLed between them: every batch torchvision's tensors (%d "
          "failovers)" % failovers)


def check_tar(tmpdir, coord, data):
    n = 15
    info = gen(tmpdir, "tar-jpeg", os.path.join(data, "wds"), n, "--files", 3)
    src_of, jpgs = {}, {}
    for s, name in enumerate(info["sources"]):
        with tarfile.open(os.path.join(data, "wds", name)) as t:
            for m in t.getmembers():
                if m.name.endswith(".jpg"):
                    i = int(m.name[6:14])
                    path = os.path.join(tmpdir, "wds-%d.jpg" % i)
                    with open(path, "wb") as f:
                        f.write(t.extractfile(m).read())
                    src_of[i], jpgs[i] = s, path
    bt.check(sorted(src_of) == list(range(n)) and len(set(src_of.values())) == 3,
             "the tar-jpeg samples lie in three shards", src_of)
    for rank in range(3):
        r, batches = fetch(coord, "tf-tar", "tar:wds/shard-*.tar", rank, 3, "--transform-field",
                           "jpg")
        bt.check(r.returncode == 0, "rank %d of the tar job ran" % rank, r.stderr)
        check_batches("tar rank %d" % rank, batches, lambda i: (jpgs[i], src_of[i]))
    # With fields the other members pass through: cls stays the label, jpg is the tensor.
    batchwire = bwpy.import_batchwire()
    with batchwire.Loader(coordinator=coord.addr, job="tf-tar-fields",
                          dataset="tar:wds/shard-*.tar", rank=0, world_size=1, batch_size=4,
                          seed=SEED, transform=SPEC, transform_field="jpg",
                          fields=True) as loader:
        seen = 0
        for batch in loader:
            for i, f in zip(batch.indices, batch.fields()):
                i = int(i)
                want = expected(jpgs[i], SEED, int(batch.epoch), src_of[i], i)
                bt.check(sorted(f) == ["cls", "jpg"] and f["jpg"].shape == want.shape and
                         f["jpg"].dtype == want.dtype and f["jpg"].tobytes() == want.tobytes() and
                         f["cls"] == str(te.iword(5, i, 3) % 10).encode(),
                         "tar with fields: sample %d's jpg is its tensor, cls its label" % i,
                         (sorted(f), len(f["jpg"]), f.get("cls")))
                seen += 1
    bt.check(seen == n, "tar with fields: every sample", seen)
    r, _ = fetch(coord, "tf-tar-nofield", "tar:wds/shard-*.tar", 0, 1)
    bt.check(r.returncode != 0 and "give transform_field" in r.stderr,
             "a tar job's transform needs --transform-field", r.stderr)
    bt.ok("tar-jpeg dataset, 3 ranks, --transform-field jpg: torchvision's tensors, the key's "
          "source being the shard")


def check_python(tmpdir, coord, files):
    batchwire = bwpy.import_batchwire()
    with batchwire.Loader(coordinator=coord.addr, job="tf-py", dataset="files:imgs/samples",
                          rank=0, world_size=1, batch_size=5, shuffle=True, seed=SEED,
                          transform=SPEC) as loader:
        got = 0
        for batch in loader:
            a = batch.numpy()
            want = np.stack([expected(files[int(i)], SEED, int(batch.epoch), 0, int(i))
                             for i in batch.indices])
            bt.check(a.dtype == np.float32 and a.shape == want.shape and np.array_equal(a, want),
                     "Python: batch %d is torchvision's tensor %s" % (batch.step, want.shape))
            got += 1
    bt.check(got == 5, "Python: 5 batches of 22 samples", got)
    import torch
    with batchwire.Loader(coordinator=coord.addr, job="tf-py-bf16", dataset="files:imgs/samples",
                          rank=0, world_size=1, batch_size=8, seed=SEED,
                          transform=SPEC + "|cast(bfloat16)") as loader:
        batch = next(iter(loader))
        t = batch.torch()
        want = torch.from_numpy(np.stack([expected(files[int(i)], SEED, 0, 0, int(i))
                                          for i in batch.indices])).to(torch.bfloat16)
        bt.check(t.dtype == torch.bfloat16 and torch.equal(t, want),
                 "Python: a cast(bfloat16) batch is a torch.bfloat16 tensor equal to torch's "
                 "conversion of torchvision's", (t.dtype, tuple(t.shape)))
    bt.ok("Python Loader(transform=...): Batch.numpy() is the [B, 3, H, W] float32 tensor")


def check_refusals(tmpdir, coord, data, files):
    bad = os.path.join(data, "bad")
    os.makedirs(bad)
    for i, f in enumerate(files[:8]):
        shutil.copy(f, os.path.join(bad, "sample%08d.jpg" % i))
    target = os.path.join(bad, "sample%08d.jpg" % 5)
    blob = open(target, "rb").read()
    with open(target, "wb") as f:
        f.write(blob[:len(blob) // 2])
    r, batches = fetch(coord, "tf-bad", "files:bad", 0, 1, "--timeout-ms", 20000)
    bt.check(r.returncode == 1, "a corrupt JPEG fails the fetch", (r.returncode, r.stderr))
    bt.check(all(5 not in b["indices"] for b in batches),
             "no batch holding the corrupt sample was delivered", batches)
    bt.check_in("source 0 'bad' sample 5", r.stderr, "the error names the source and the index")
    bt.check_in("decode", r.stderr, "the error names the op that failed")

    r, _ = fetch(coord, "tf-files", "files:imgs/samples", 0, 2, "--transform",
                 "decode|center_crop(8)")
    bt.check(r.returncode != 0 and "transform" in r.stderr,
             "another transform for an existing job is refused as a mismatch", r.stderr)
    r = bt.cli("fetch", "--coordinator", coord.addr, "--job", "tf-badspec", "--dataset",
               "files:imgs/samples", "--rank", 0, "--world-size", 1, "--transform",
               "decode|resize(0)")
    bt.check(r.returncode != 0 and "op 2 'resize(0)'" in r.stderr,
             "a bad spec is refused naming the op", r.stderr)
    r = bt.cli("fetch", "--coordinator", coord.addr, "--job", "tf-badfmt", "--dataset",
               "npy:x.npy", "--rank", 0, "--world-size", 1, "--transform", "decode|resize(4,4)")
    bt.check(r.returncode != 0 and "holds no images" in r.stderr,
             "a transform on an npy dataset is refused", r.stderr)
    bt.ok("a corrupt JPEG fails its batch naming source and index; specs, formats and a "
          "changed transform refused")


def scrape(addr):
    with urllib.request.urlopen("http://%s/metrics" % addr, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def check_pool(coord, workers):
    # w1 runs windows of 2 samples (1 thread), w2 of 6 (3 threads): both served every job
    # above, a request of several windows included, and the corrupt sample was counted.
    totals = {"count": 0, "failures": 0}
    for wid, (d, threads) in workers.items():
        bt.check_in("transform_threads=%d" % threads, d.log_text(),
                    "worker %s runs %d transform threads" % (wid, threads))
        m = scrape(re.search(r"metrics on http://(\S+)/metrics", d.log_text()).group(1))
        n = m.get("batchwire_worker_transform_duration_seconds_count", 0)
        bt.check(n > 0 and m.get("batchwire_worker_transform_duration_seconds_sum", 0) > 0,
                 "worker %s counts its transforms' time (%d samples)" % (wid, n))
        totals["count"] += n
        totals["failures"] += m.get(
            'batchwire_worker_transform_failures_total{code="BW_CORRUPT"}', 0)
    bt.check(totals["failures"] >= 1, "the corrupt JPEG is counted as a BW_CORRUPT failure",
             totals)
    bt.ok("transform pools of 1 and 3 threads; %d samples timed, %d failures counted" %
          (totals["count"], totals["failures"]))


def check_budget(coord):
    # A 1024x1024 float32 result is 12 MiB: more than the whole 8 MiB in-flight budget.
    r = bt.cli("fetch", "--coordinator", coord.addr, "--job", "tf-big", "--dataset",
               "files:imgs/samples", "--rank", 0, "--world-size", 1, "--batch-size", 2,
               "--transform", "decode|resize(1024,1024)|" + te.NORM, "--max-steps", 1,
               timeout=60)
    bt.check(r.returncode == 1 and "in-flight budget" in r.stderr, "results larger than the "
             "worker's in-flight budget are refused, naming it", (r.returncode, r.stderr))
    bt.ok("a transform's results are charged against --inflight-bytes")


def check_tokens(tmpdir, coord, data):
    # Token arrays (docs/transforms.md, "Token arrays"): an npy dataset of int32 rows of 10,
    # truncated and padded on the workers, equals numpy's slicing and np.pad on the same
    # rows; the pad value must be one of the rows' type; other formats are refused.
    info = gen(tmpdir, "npy", os.path.join(data, "tok"), 37, "--shape", 10, "--dtype", "int32",
               "--files", 2)
    rows = np.concatenate([np.load(os.path.join(data, "tok", name))
                           for name in info["sources"]])
    bt.check(rows.shape == (37, 10), "the token rows", rows.shape)
    cases = (("truncate(6)", lambda x: x[:6]),
             ("pad(13,-1)", lambda x: np.pad(x, (0, 3), constant_values=-1)),
             ("truncate(4) | pad(4, 7)", lambda x: x[:4]),
             ("truncate(3)|pad(8,-5)", lambda x: np.pad(x[:3], (0, 5), constant_values=-5)),
             ("truncate(16)|pad(16,2147483647)", lambda x: np.pad(x, (0, 6),
                                                                   constant_values=2 ** 31 - 1)))
    for k, (spec, ref) in enumerate(cases):
        for rank in range(2):
            r = bt.cli("fetch", "--coordinator", coord.addr, "--job", "tok-%d" % k, "--dataset",
                       "npy:tok/*.npy", "--rank", rank, "--world-size", 2, "--batch-size", 5,
                       "--shuffle", "--seed", SEED, "--transform", spec, timeout=60)
            bt.check(r.returncode == 0, "tokens %s rank %d" % (spec, rank), r.stderr)
            batches = [json.loads(x) for x in r.stdout.splitlines() if x.startswith('{"epoch')]
            bt.check(batches, "tokens %s: batches" % spec)
            for b in batches:
                want = np.stack([ref(rows[i]) for i in b["indices"]]).astype("<i4")
                bt.check(b["dtype"] == "<i4" and b["shape"] == list(want.shape) and
                         b["sha256"] == hashlib.sha256(want.tobytes()).hexdigest(),
                         "tokens %s rank %d step %d: numpy's rows" % (spec, rank, b["step"]),
                         (b["dtype"], b["shape"], want.shape))
    batchwire = bwpy.import_batchwire()
    with batchwire.Loader(coordinator=coord.addr, job="tok-py", dataset="npy:tok/*.npy", rank=0,
                          world_size=1, batch_size=8, seed=SEED,
                          transform="truncate(3)|pad(3,0)") as loader:
        seen = 0
        for batch in loader:
            a = batch.numpy()
            idx = [int(i) for i in batch.indices]
            bt.check(a.dtype == np.dtype("<i4") and a.shape == (len(idx), 3) and
                     (a == rows[idx, :3]).all(), "Python: the batch is numpy's [B, 3] rows",
                     (a.dtype, a.shape))
            seen += len(idx)
    bt.check(seen == 37, "Python: every row", seen)
    refusals = (("npy:tok/*.npy", "pad(12,2147483648)", "out of the range of int32"),
                ("npy:tok/*.npy", "pad(12,0.5)", "not an integer"),
                ("files:imgs/samples", "truncate(3)", "token ops (truncate, pad) read the rows "
                 "of an npy dataset"))
    for k, (ds, spec, why) in enumerate(refusals):
        r = bt.cli("fetch", "--coordinator", coord.addr, "--job", "tok-bad-%d" % k, "--dataset",
                   ds, "--rank", 0, "--world-size", 1, "--batch-size", 4, "--transform", spec,
                   timeout=60)
        bt.check(r.returncode != 0 and why in r.stderr and "BW_INVALID_ARGUMENT" in r.stderr,
                 "%s on %s is refused: %s" % (spec, ds, why), r.stderr)
    bt.ok("token arrays: truncate and pad on the workers equal numpy's slicing and np.pad "
          "(5 specs x 2 ranks, and Python); out-of-type pad values and other formats refused")


def check_plan():
    # `batchwire plan --transform`: checked as fetch checks it, named in --metadata (canonical
    # text, each sample's dtype and shape), the batches' indices the same as without it.
    base = ["plan", "--mode", "torch", "--num-samples", 50, "--world-size", 3, "--batch-size", 4,
            "--shuffle", "--seed", SEED, "--metadata"]
    r0, r1 = bt.cli(*base), bt.cli(*base, "--transform", SPEC)
    bt.check(r0.returncode == 0 and r1.returncode == 0, "plan with and without --transform",
             r0.stderr + r1.stderr)
    m0, m1 = json.loads(r0.stdout.splitlines()[0]), json.loads(r1.stdout.splitlines()[0])
    bt.check(r0.stdout.splitlines()[1:] == r1.stdout.splitlines()[1:],
             "plan --transform: the same batches")
    meta = m1["metadata"]
    bt.check(meta.get("transform", "").startswith("decode|random_resized_crop(%d,%d," %
                                                  (SIDE, SIDE)) and
             meta.get("sample_dtype") == "<f4" and meta.get("sample_shape") == [3, SIDE, SIDE] and
             "transform" not in m0["metadata"], "plan --metadata names the transform", meta)
    r = bt.cli(*base, "--transform", "decode|resize(5)")
    bt.check(r.returncode == 2 and "--transform 'decode|resize(5)': the output size depends" in
             r.stderr, "plan refuses a transform fetch refuses", r.stderr)
    bt.ok("plan --transform: checked, named in --metadata, the same batches")


def check_acceptance(tmpdir, coord, data):
    # Issue 28's acceptance as a user runs it: a 4-rank job with the transform, the four ranks
    # running at once, each stopped at its own random step and resumed from its cursor, a
    # worker SIGKILLed between the stops and the resumes (its placement still lists it, so
    # the resumed ranks meet it dead and fail over): every rank's batches are those of an
    # uninterrupted run of the same configuration, byte for byte, and torchvision's tensors.
    n = 40
    gen(tmpdir, "jpeg", os.path.join(data, "acc"), n)
    files = [os.path.join(data, "acc", "samples", "sample%08d.jpg" % i) for i in range(n)]
    victim = bt.worker(tmpdir, coord.addr, "w-acc", data_root=data,
                       args=["--transform-threads", 2])
    bt.poll(lambda: sum(w["state"] == "alive" for w in bt.status_json(coord.addr)["workers"])
            >= 3, 15, interval=0.1, what="3 live workers")
    world, epochs = 4, 2
    keys = ("epoch", "step", "indices", "sha256")

    def in_parallel(fn):
        out, threads = {}, []
        for rank in range(world):
            t = threading.Thread(target=lambda r=rank: out.__setitem__(r, fn(r)))
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
        return [out[r] for r in range(world)]

    full = in_parallel(lambda r: fetch(coord, "tf-acc-ref", "files:acc/samples", r, world,
                                       "--epochs", epochs))
    for rank, (r, batches) in enumerate(full):
        bt.check(r.returncode == 0, "uninterrupted rank %d ran" % rank, r.stderr)
        check_batches("uninterrupted rank %d" % rank, batches, lambda i: (files[i], 0))
    rng = random.Random()
    stops = [rng.randrange(1, len(full[r][1])) for r in range(world)]
    cursor = [os.path.join(tmpdir, "acc-cursor-%d" % r) for r in range(world)]
    first = in_parallel(lambda r: fetch(coord, "tf-acc", "files:acc/samples", r, world,
                                        "--epochs", epochs, "--max-steps", stops[r],
                                        "--cursor-out", cursor[r]))
    victim.kill9()
    rest = in_parallel(lambda r: fetch(coord, "tf-acc", "files:acc/samples", r, world,
                                       "--epochs", epochs - full[r][1][stops[r] - 1]["epoch"],
                                       "--resume", open(cursor[r]).read().strip()))
    failovers = 0
    for rank in range(world):
        bt.check(first[rank][0].returncode == 0 and len(first[rank][1]) == stops[rank],
                 "rank %d stopped after %d batches" % (rank, stops[rank]), first[rank][0].stderr)
        bt.check(rest[rank][0].returncode == 0, "rank %d resumed from its cursor" % rank,
                 rest[rank][0].stderr)
        got = [{k: b[k] for k in keys} for b in first[rank][1] + rest[rank][1]]
        want = [{k: b[k] for k in keys} for b in full[rank][1]]
        bt.check(got == want, "rank %d, stopped at step %d, resumed after a worker's SIGKILL: "
                 "the uninterrupted run's tensors" % (rank, stops[rank]), (len(got), len(want)))
        failovers += sum(json.loads(x)["summary"]["stats"]["failovers"]
                         for x in rest[rank][0].stdout.splitlines()
                         if x.startswith('{"summary"'))
    bt.check(failovers > 0, "the resumed ranks failed over from the killed worker (%d)" %
             failovers)
    bt.ok("4 ranks at once, stopped at steps %s, resumed after a worker's SIGKILL (%d failovers): "
          "every rank's tensors equal the uninterrupted run's" % (stops, failovers))


def test(tmpdir):
    data = os.path.join(tmpdir, "data")
    os.makedirs(data)
    coord = bt.coordinator(tmpdir)
    workers = {}
    for wid, threads in (("w1", 1), ("w2", 3)):
        d = bt.worker(tmpdir, coord.addr, wid, data_root=data,
                      args=["--transform-threads", threads, "--metrics-listen", "127.0.0.1:0",
                            "--inflight-bytes", 8 << 20])
        workers[wid] = (d, threads)
    files = check_files(tmpdir, coord, data)
    check_tar(tmpdir, coord, data)
    check_python(tmpdir, coord, files)
    check_refusals(tmpdir, coord, data, files)
    check_tokens(tmpdir, coord, data)
    check_plan()
    check_pool(coord, workers)
    check_budget(coord)
    check_failover(tmpdir, coord, data, files)
    check_acceptance(tmpdir, coord, data)


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=500)
