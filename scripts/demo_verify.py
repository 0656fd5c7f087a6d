#!/usr/bin/python3
"""Checks what the demo's trainer ranks received (scripts/demo), independently of the C code
that served it, and prints a short report.

    demo_verify.py --gen GEN.json --data DIR --plan PLAN.jsonl --fetch RANK:FILE[,FILE...] ...
                   [--wall SECONDS]

* GEN.json: what `batchwire gen` printed (format npy: dtype, shape, sources).
* PLAN.jsonl: `batchwire plan --metadata` output of every epoch, concatenated.
* RANK:FILE,...: the `batchwire fetch` output of one rank, in order (several files when the
  rank was stopped and resumed).

Every batch must match the plan (epoch, step, indices, padding, real) in order, with nothing
missing or repeated, and its sha256 must equal the sha256 of the generator's bytes for its
indices: the generator's formula (docs: `batchwire gen --help`) is computed here with numpy
and also compared with the .npy files as numpy reads them. Exit 0 when everything matches,
1 otherwise. Only the standard library and numpy are used.
"""

import argparse
import hashlib
import json
import os
import sys

import numpy as np

M = np.uint64


def mix(z):
    z = z ^ (z >> M(30))
    z = z * M(0xbf58476d1ce4e5b9)
    z = z ^ (z >> M(27))
    z = z * M(0x94d049bb133111eb)
    return z ^ (z >> M(31))


def generator_rows(n, sample_bytes):
    """bytes(i, L) for i < n: the first L bytes of word(i,0) word(i,1) ... little endian, where
    word(i,w) = mix(i * 0x9e3779b97f4a7c15 + (w + 1) * 0xd1b54a32d192ed03) mod 2^64."""
    nwords = (sample_bytes + 7) // 8 + 1
    with np.errstate(over="ignore"):
        base = np.arange(n, dtype=np.uint64)[:, None] * M(0x9e3779b97f4a7c15)
        z = base + (np.arange(nwords, dtype=np.uint64)[None, :] + M(1)) * M(0xd1b54a32d192ed03)
        words = mix(z)
    raw = words.astype("<u8").view(np.uint8).reshape(n, nwords * 8)
    return raw[:, :sample_bytes]


def fail(msg):
    print("demo_verify: FAILED: " + msg, file=sys.stderr)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gen", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--fetch", action="append", required=True)
    ap.add_argument("--wall", type=float, default=0.0, help="seconds the ranks spent fetching")
    a = ap.parse_args()

    with open(a.gen) as f:
        gen = json.load(f)
    n, sb = gen["num_samples"], gen["sample_bytes"]
    rows = generator_rows(n, sb)
    files = [np.load(os.path.join(a.data, s), mmap_mode="r") for s in gen["sources"]]
    on_disk = np.concatenate([x.reshape(x.shape[0], -1).view(np.uint8) for x in files])
    if on_disk.shape != rows.shape or not np.array_equal(on_disk, rows):
        fail("the .npy files differ from the generator's formula")

    plan = {}
    for line in open(a.plan):
        o = json.loads(line)
        if "metadata" in o:
            epoch = o["metadata"]["epoch"]
            if not o["metadata"]["equal_batches"]:
                fail("the plan gives ranks different numbers of batches")
            continue
        o["epoch"] = epoch
        plan.setdefault(o["rank"], []).append(o)

    batches = samples = nbytes = 0
    pads = 0
    per_rank = {}
    summaries = []
    for spec in a.fetch:
        rank, paths = spec.split(":", 1)
        rank = int(rank)
        got = []
        for p in paths.split(","):
            for line in open(p):
                o = json.loads(line)
                if "summary" in o:
                    summaries.append(o["summary"])
                else:
                    got.append(o)
        want = plan.get(rank, [])
        if len(got) != len(want):
            fail("rank %d received %d batches; the plan has %d" % (rank, len(got), len(want)))
        for g, w in zip(got, want):
            where = "rank %d epoch %d step %d" % (rank, w["epoch"], w["step"])
            for k in ("epoch", "step", "indices", "padding", "real"):
                if g[k] != w[k]:
                    fail("%s: %s is %r, the plan says %r" % (where, k, g[k], w[k]))
            sha = hashlib.sha256(rows[w["indices"]].tobytes()).hexdigest()
            if g["sha256"] != sha:
                fail("%s: sha256 %s, the generator's bytes give %s" % (where, g["sha256"], sha))
            batches += 1
            samples += len(g["indices"])
            nbytes += g["bytes"]
            pads += sum(g["padding"])
        per_rank[rank] = len(got)
    if set(per_rank) != set(plan):
        fail("ranks %s were checked; the plan has ranks %s" % (sorted(per_rank), sorted(plan)))
    if len(set(per_rank.values())) != 1:
        fail("ranks received different numbers of batches: %r" % per_rank)

    mib = nbytes / 2.0 ** 20
    secs = a.wall or max(s["seconds"] for s in summaries)
    busy = sum(s["seconds"] for s in summaries)
    print("verified %d batches (%d per rank, %d samples, %d of them padding, %.1f MiB) against "
          "batchwire plan and the generator's bytes: all identical" %
          (batches, batches // len(per_rank), samples, pads, mib))
    if secs > 0 and busy > 0:
        print("throughput: %.0f samples/s, %.1f MiB/s for the %d ranks together (%.2f s of "
              "fetching); %.0f samples/s, %.1f MiB/s per rank" %
              (samples / secs, mib / secs, len(per_rank), secs, samples / busy, mib / busy))


if __name__ == "__main__":
    main()
