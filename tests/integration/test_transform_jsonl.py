"""Transforms of JSON Lines fields (issue 28, item 1: `--transform-field KEY` on jsonl;
docs/transforms.md, "JSON Lines fields"):

* images: two .jsonl files whose lines are {"image": "<base64 JPEG or PNG>", "label": N,
  "name": "..."}, written here from `batchwire gen --format jpeg` files (and one PNG Pillow
  writes); a 2-rank job with `batchwire fetch --transform ... --transform-field image`, shuffled,
  two epochs: every batch is one float32 [B, 3, H, W] tensor equal to torchvision's on the same
  bytes with the documented draws keyed by (seed, epoch, source file, dataset index); the same
  over gRPC and after a resume from a cursor at a random step; through Python
  (transform_field=): Batch.numpy() is that tensor, and with fields=True (over the data
  channel and gRPC) the label and name pass through (decoded as JSON, as any jsonl field) and
  "image" holds the tensor's bytes;
* tokens: {"ids": [... 0 to 20 values, int64 extremes among them ...], "label": ...} in two
  files; truncate(L)|pad(L2,V) and pad(L2,V) over 2 ranks equal numpy's int64 rows byte for
  byte (CLI), and Python with fields (ids: the row's int64 bytes, label passed through);
* refusals at job creation, by the client and by the coordinator (a raw GetOrCreateJob is not
  needed: the client and `batchwire plan` share bw__job_check_transform's rules): a token
  pipeline without a final pad, a truncate or pad longer than the final pad, a non-integer pad,
  jsonl without --transform-field;
* failures of a batch, each naming the source file, the sample's index, the field and what was
  wrong: a line without the key, a value of the wrong JSON type, bad base64, a corrupt
  (truncated) JPEG, a row longer than the pad with no truncate, a value that is not an
  integer, one outside int64, a line that is not an object; the samples before it are
  delivered, none after; the workers stay up (a good job still runs afterwards).
"""

import base64
import hashlib
import io
import json
import os
import random
import sys

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwpy  # noqa: E402
import bwtest as bt  # noqa: E402
import test_transform_worker as tw  # noqa: E402  (expected(): torchvision with the draws)

SEED = tw.SEED
SPEC = tw.SPEC
SIDE = tw.SIDE
I64 = (-2 ** 63, 2 ** 63 - 1)


def b64(path):
    with open(path, "rb") as f:
        return base64.b64encode(f.read()).decode()


def write_jsonl(path, lines):
    with open(path, "w") as f:
        for x in lines:
            f.write((x if isinstance(x, str) else json.dumps(x)) + "\n")


def fetch(coord, job, dataset, rank, world, spec, field, *extra, timeout=120):
    r = bt.cli("fetch", "--coordinator", coord.addr, "--job", job, "--dataset", dataset,
               "--rank", rank, "--world-size", world, "--seed", SEED, "--transform", spec,
               *(("--transform-field", field) if field else ()), *extra, timeout=timeout)
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    return r, [x for x in lines if "step" in x]


def make_images(tmpdir, data):
    """Two jsonl files of 9 and 8 images; returns (path, source, label) by dataset index."""
    tw.gen(tmpdir, "jpeg", os.path.join(tmpdir, "jpegs"), 16)
    files = [os.path.join(tmpdir, "jpegs", "samples", "sample%08d.jpg" % i) for i in range(16)]
    png = os.path.join(tmpdir, "one.png")
    Image.fromarray(np.random.default_rng(3).integers(0, 256, (40, 56, 3), dtype=np.uint8)).save(
        png)
    files.insert(4, png)
    os.makedirs(os.path.join(data, "jimg"))
    samples, lines = [], [[], []]
    for i, p in enumerate(files):
        src = 0 if i < 9 else 1
        label = (i * 7) % 10
        samples.append((p, src, label))
        # keys in varying order, the image not always first; "\/" as some encoders write '/'
        enc = b64(p)
        if i % 3 == 1:
            line = '{"label": %d, "image": "%s", "name": "s%d"}' % (label, enc.replace(
                "/", "\\/"), i)
        else:
            line = json.dumps({"image": enc, "label": label, "name": "s%d" % i})
        lines[src].append(line)
    write_jsonl(os.path.join(data, "jimg", "a.jsonl"), lines[0])
    write_jsonl(os.path.join(data, "jimg", "b.jsonl"), lines[1])
    return samples


def check_images(tmpdir, coord, data):
    samples = make_images(tmpdir, data)
    n = len(samples)
    seen, runs = set(), {}
    for rank in range(2):
        r, batches = fetch(coord, "jl-img", "jsonl:jimg/*.jsonl", rank, 2, SPEC, "image",
                           "--batch-size", 4, "--shuffle", "--epochs", 2)
        bt.check(r.returncode == 0, "rank %d of the jsonl image job ran" % rank, r.stderr)
        tw.check_batches("jsonl rank %d" % rank, batches, lambda i: samples[i][:2])
        seen |= {(b["epoch"], i) for b in batches for i in b["indices"]}
        runs[rank] = batches
    bt.check(len(seen) == 2 * n, "both epochs of every sample were served", len(seen))
    bt.ok("jsonl images, 2 ranks, 2 epochs, --transform-field image: torchvision's tensors of "
          "the decoded base64 (JPEG and PNG), the key's source being the file")

    # Over gRPC, and resumed from a cursor at a random step: the same tensors.
    r, batches = fetch(coord, "jl-img", "jsonl:jimg/*.jsonl", 0, 2, SPEC, "image",
                       "--batch-size", 4, "--shuffle", "--epochs", 2, "--transport", "grpc")
    keys = ("epoch", "step", "indices", "sha256")
    strip = [{k: b[k] for k in keys} for b in runs[0]]
    bt.check(r.returncode == 0 and [{k: b[k] for k in keys} for b in batches] == strip,
             "over gRPC: the same tensors as over the data channel", r.stderr)
    k = random.Random().randrange(1, len(runs[0]) - 1)
    cur = os.path.join(tmpdir, "jl-cursor")
    r, first = fetch(coord, "jl-img-resume", "jsonl:jimg/*.jsonl", 0, 2, SPEC, "image",
                     "--batch-size", 4, "--shuffle", "--epochs", 2, "--max-steps", k,
                     "--cursor-out", cur)
    bt.check(r.returncode == 0 and len(first) == k, "a rank stopped after %d batches" % k,
             r.stderr)
    with open(cur) as f:
        cursor = f.read().strip()
    r, rest = fetch(coord, "jl-img-resume", "jsonl:jimg/*.jsonl", 0, 2, SPEC, "image",
                    "--batch-size", 4, "--shuffle", "--epochs", 2 - runs[0][k - 1]["epoch"],
                    "--resume", cursor)
    bt.check(r.returncode == 0 and [{k: b[k] for k in keys} for b in first + rest] == strip,
             "resumed at step %d: the same tensors as the uninterrupted run" % k, r.stderr)
    bt.ok("jsonl images over gRPC and resumed at step %d: the same tensors" % k)

    batchwire = bwpy.import_batchwire()
    with batchwire.Loader(coordinator=coord.addr, job="jl-img-py", dataset="jsonl:jimg/*.jsonl",
                          rank=0, world_size=1, batch_size=5, seed=SEED, shuffle=True,
                          transform=SPEC, transform_field="image") as loader:
        got = 0
        for batch in loader:
            a = batch.numpy()
            want = np.stack([tw.expected(samples[int(i)][0], SEED, int(batch.epoch),
                                         samples[int(i)][1], int(i)) for i in batch.indices])
            bt.check(a.dtype == np.float32 and a.shape == want.shape and np.array_equal(a, want),
                     "Python: jsonl batch %d is torchvision's tensor" % batch.step, a.shape)
            got += len(batch.indices)
    bt.check(got == n, "Python: every sample", got)
    for transport in ("auto", "grpc"):
        got = check_fields(batchwire, coord, samples, transport)
        bt.check(got == n, "jsonl with fields (%s): every sample" % transport, got)
    bt.ok("Python transform_field='image' on jsonl: Batch.numpy() the tensor; with fields the "
          "label passes through (data channel and gRPC)")


def check_fields(batchwire, coord, samples, transport):
    with batchwire.Loader(coordinator=coord.addr, job="jl-img-fields-" + transport,
                          dataset="jsonl:jimg/*.jsonl", rank=0, world_size=1, batch_size=4,
                          seed=SEED, transform=SPEC, transform_field="image", fields=True,
                          transport=transport) as loader:
        got = 0
        for batch in loader:
            for i, f in zip(batch.indices, batch.fields()):
                i = int(i)
                p, src, label = samples[i]
                want = tw.expected(p, SEED, int(batch.epoch), src, i)
                bt.check(sorted(f) == ["image", "label", "name"] and
                         f["image"].dtype == want.dtype and f["image"].shape == want.shape and
                         f["image"].tobytes() == want.tobytes() and f["label"] == label and
                         f["name"] == "s%d" % i,
                         "jsonl with fields: sample %d's image is its tensor, its label and "
                         "name pass through" % i, (sorted(f), f.get("label"), f.get("name")))
                got += 1
    return got


def make_tokens(data):
    rng = np.random.default_rng(11)
    rows = []
    for i in range(29):
        k = int(rng.integers(0, 21))
        row = [int(x) for x in rng.integers(-50000, 50000, k)]
        if i == 3:
            row = [I64[0], I64[1], 0, -1]
        rows.append(row)
    os.makedirs(os.path.join(data, "jtok"))
    write_jsonl(os.path.join(data, "jtok", "a.jsonl"),
                [{"label": i % 5, "ids": r} for i, r in enumerate(rows[:15])])
    write_jsonl(os.path.join(data, "jtok", "b.jsonl"),
                [{"ids": r, "label": i % 5} for i, r in enumerate(rows[15:], 15)])
    return rows


def ref_row(row, cut, length, value):
    a = np.array(row[:cut] if cut is not None else row, dtype="<i8")
    return np.pad(a, (0, length - len(a)), constant_values=value)


def check_tokens(coord, data):
    rows = make_tokens(data)
    cases = (("truncate(12)|pad(16,-1)", 12, 16, -1), ("pad(24, 7)", None, 24, 7),
             ("truncate(5)|pad(5,0)", 5, 5, 0), ("truncate(3)|pad(8,%d)" % I64[0], 3, 8, I64[0]))
    for k, (spec, cut, length, value) in enumerate(cases):
        for rank in range(2):
            r, batches = fetch(coord, "jl-tok-%d" % k, "jsonl:jtok/*.jsonl", rank, 2, spec, "ids",
                               "--batch-size", 4, "--shuffle", timeout=60)
            bt.check(r.returncode == 0, "tokens %s rank %d" % (spec, rank), r.stderr)
            bt.check(batches, "tokens %s: batches" % spec)
            for b in batches:
                want = np.stack([ref_row(rows[i], cut, length, value) for i in b["indices"]])
                bt.check(b["dtype"] == "<i8" and b["shape"] == list(want.shape) and
                         b["sha256"] == hashlib.sha256(want.tobytes()).hexdigest(),
                         "tokens %s rank %d step %d: numpy's int64 rows" % (spec, rank,
                                                                            b["step"]),
                         (b["dtype"], b["shape"], want.shape))
    batchwire = bwpy.import_batchwire()
    with batchwire.Loader(coordinator=coord.addr, job="jl-tok-py", dataset="jsonl:jtok/*.jsonl",
                          rank=0, world_size=1, batch_size=8, seed=SEED,
                          transform="truncate(10)|pad(10,-3)", transform_field="ids",
                          fields=True) as loader:
        seen = 0
        for batch in loader:
            for i, f in zip(batch.indices, batch.fields()):
                i = int(i)
                bt.check(sorted(f) == ["ids", "label"] and
                         f["ids"].dtype == "<i8" and f["ids"].shape == (10,) and
                         f["ids"].tobytes() == ref_row(rows[i], 10, 10, -3).tobytes() and
                         f["label"] == i % 5,
                         "Python with fields: row %d's ids are numpy's, its label passes "
                         "through" % i, f)
                seen += 1
    bt.check(seen == len(rows), "Python: every row", seen)
    with batchwire.Loader(coordinator=coord.addr, job="jl-tok-py2", dataset="jsonl:jtok/*.jsonl",
                          rank=0, world_size=1, batch_size=8, seed=SEED,
                          transform="truncate(6)|pad(6,0)", transform_field="ids") as loader:
        batch = next(iter(loader))
        t = batch.torch()
        import torch
        want = torch.stack([torch.tensor((rows[int(i)][:6] + [0] * 6)[:6])
                            for i in batch.indices])
        bt.check(t.dtype == torch.int64 and torch.equal(t, want),
                 "Python: Batch.torch() equals torch.tensor of the Python ints", t.shape)
    bt.ok("jsonl tokens: truncate/pad to int64 rows equal numpy's (4 specs x 2 ranks), Python "
          "with fields and torch")


def check_refusals(coord):
    cases = (("truncate(8)", "ids", "must end with pad(L,VALUE)"),
             ("truncate(20)|pad(16,0)", "ids", "op 1 truncate(20): longer than the final pad"),
             ("truncate(4)|pad(8,0.5)", "ids", "not an integer"),
             (SPEC, None, "give transform_field, the key"))
    for k, (spec, field, why) in enumerate(cases):
        r, _ = fetch(coord, "jl-bad-%d" % k, "jsonl:jtok/*.jsonl", 0, 1, spec, field,
                     "--batch-size", 4, timeout=60)
        bt.check(r.returncode != 0 and why in r.stderr and "BW_INVALID_ARGUMENT" in r.stderr,
                 "%s on jsonl is refused: %s" % (spec, why), r.stderr)
        if field:
            p = bt.cli("plan", "--mode", "torch", "--num-samples", 10, "--world-size", 1,
                       "--batch-size", 2, "--transform", spec, "--transform-field", field)
            bt.check(p.returncode == 2 and why in p.stderr,
                     "plan refuses %s on a jsonl key as fetch does" % spec, p.stderr)
    r, _ = fetch(coord, "jl-bad-npy", "npy:nothing.npy", 0, 1, "truncate(3)|pad(3,0)", "ids",
                 "--batch-size", 4, timeout=60)
    bt.check(r.returncode != 0 and "transform_field is for tar members and jsonl keys" in r.stderr,
             "token ops with a field on npy are refused", r.stderr)
    p = bt.cli("plan", "--mode", "torch", "--num-samples", 10, "--world-size", 1, "--batch-size",
               2, "--transform", "truncate(12)|pad(16,-1)", "--transform-field", "ids",
               "--metadata")
    meta = json.loads(p.stdout.splitlines()[0])["metadata"] if p.returncode == 0 else {}
    bt.check(meta.get("transform") == "truncate(12)|pad(16,-1)" and
             meta.get("transform_field") == "ids" and meta.get("sample_dtype") == "<i8" and
             meta.get("sample_shape") == [16], "plan --transform-field: int64 rows of 16", meta)
    bt.ok("refused at job creation (fetch and plan): no final pad, a longer truncate or pad, a "
          "non-integer pad, jsonl without --transform-field")


def check_failures(tmpdir, coord, data):
    with open(os.path.join(tmpdir, "jpegs", "samples", "sample00000002.jpg"), "rb") as f:
        raw = f.read()
    good = base64.b64encode(raw).decode()
    cut = base64.b64encode(raw[:len(raw) // 2]).decode()
    img_bad = (
        ("nokey", '{"label": 1, "img": "%s"}' % good, "no key 'image' (its keys: label, img)"),
        ("type", '{"image": [1, 2], "label": 1}', "the value is an array, not a string of base64"),
        ("b64", '{"image": "%s*%s", "label": 1}' % (good[:8], good[9:]),
         "character 8 of the string ('*') is not in the base64 alphabet"),
        ("pad", '{"image": "%s", "label": 1}' % good.rstrip("=")[:-1],
         "not a multiple of 4"),
        ("jpeg", '{"image": "%s", "label": 1}' % cut, "op 1: decode"),
        ("object", '["image", 1]', "not a JSON object"),
    )
    tok_bad = (
        ("long", '{"ids": [%s], "label": 1}' % ",".join(["1"] * 9),
         "the row has 9 values, more than the 8 of the final pad"),
        ("float", '{"ids": [1, 2.5, 3], "label": 1}', "value 1 of the array, 2.5, is not an "
         "integer"),
        ("big", '{"ids": [1, 9223372036854775808], "label": 1}',
         "value 1 of the array, 9223372036854775808, is outside int64"),
        ("str", '{"ids": "1 2 3", "label": 1}', "the value is a string, not an array of integers"),
    )
    cases = [(n, line, why, SPEC, "image", good) for n, line, why in img_bad] + \
            [(n, line, why, "pad(8,0)", "ids", None) for n, line, why in tok_bad]
    for name, line, why, spec, field, enc in cases:
        d = os.path.join(data, "jbad-" + name)
        os.makedirs(d)
        ok = ('{"image": "%s", "label": 0}' % enc) if enc else '{"ids": [1, 2], "label": 0}'
        write_jsonl(os.path.join(d, "x.jsonl"), [ok, ok, ok, line, ok, ok])
        r, batches = fetch(coord, "jl-fail-" + name, "jsonl:jbad-%s/*.jsonl" % name, 0, 1, spec,
                           field, "--batch-size", 2, "--timeout-ms", 20000, timeout=60)
        bt.check(r.returncode == 1, "%s: the fetch fails" % name, (r.returncode, r.stderr))
        bt.check([b["indices"] for b in batches] == [[0, 1]],
                 "%s: the batch before it was delivered, none with the bad sample" % name,
                 batches)
        where = "source 0 'jbad-%s/x.jsonl' sample 3 field '%s': " % (name, field)
        bt.check_in(where, r.stderr, "%s: the error names the file, index and field" % name)
        bt.check_in(why, r.stderr, "%s: the error says what was wrong" % name)
    bt.ok("bad samples (%d kinds) fail their batch naming the file, index, field and reason" %
          len(cases))


def test(tmpdir):
    data = os.path.join(tmpdir, "data")
    os.makedirs(data)
    coord = bt.coordinator(tmpdir)
    workers = [bt.worker(tmpdir, coord.addr, wid, data_root=data,
                         args=["--transform-threads", threads])
               for wid, threads in (("w1", 1), ("w2", 3))]
    check_images(tmpdir, coord, data)
    check_tokens(coord, data)
    check_refusals(coord)
    check_failures(tmpdir, coord, data)
    # The workers stayed up through the failures: a good job still runs on both.
    for rank in range(2):
        r, batches = fetch(coord, "jl-after", "jsonl:jtok/*.jsonl", rank, 2, "pad(24,0)", "ids",
                           "--batch-size", 4, timeout=60)
        bt.check(r.returncode == 0 and batches, "after the failures rank %d still runs" % rank,
                 r.stderr)
    bt.check(all(w.proc.poll() is None for w in workers), "both workers are still running")
    bt.ok("the workers stayed up")


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=400)
