#!/usr/bin/python3
"""Transforms of JSON Lines fields against files (docs/performance.md, "Transforms of JSON
Lines fields"; docs/transforms.md, "JSON Lines fields"): the same JPEGs served two ways to a
Python Loader with the same transform, on one cluster (a coordinator and two workers with
`--transform-threads 1`, started here):

* files: `batchwire gen --format jpeg` files, `dataset="files:imgs/samples"`;
* jsonl: the same bytes as base64 strings, one line each, `{"image": "...", "label": N}`, in
  4 files, `dataset="jsonl:lines/*.jsonl", transform_field="image"`.

Each round reads one epoch of each way (interleaved, alternating which goes first, after an
unmeasured warm-up round): images/s delivered (first batch asked for to last received) and
the two workers' CPU seconds per 1,000 images (/proc/PID/stat around the epoch), medians over
--rounds. The difference is what finding the key and decoding the base64 cost the workers
(and reading 4/3 as many bytes).

Usage (after the README's build):
    /usr/bin/python3 bench/bench_transform_jsonl.py [--build build] [--images 1000]
        [--rounds 3] [--batch 64]
"""

import argparse
import base64
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import bench_client as bc  # noqa: E402  (/proc/PID/stat CPU, medians)
import bench_transform_dataloader as tdl  # noqa: E402  (the same SPEC)


def epoch(batchwire, coord, job, dataset, field, batch):
    n = 0
    t0 = time.perf_counter()
    with batchwire.Loader(coordinator=coord, job=job, dataset=dataset, batch_size=batch, rank=0,
                          world_size=1, job_epochs=1, transform=tdl.SPEC,
                          transform_field=field) as loader:
        for b in loader:
            x = b.numpy()
            n += x.shape[0]
    return n, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(SRC, "build"), help="build folder")
    ap.add_argument("--images", type=int, default=1000, help="JPEGs (default 1000)")
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds (default 3)")
    ap.add_argument("--batch", type=int, default=64, help="batch size (default 64)")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    os.environ["BW_BUILD_DIR"] = a.build
    os.environ["BATCHWIRE_LIB"] = os.path.join(a.build, "lib", "libbatchwire.so")
    sys.path.insert(0, os.path.join(SRC, "tests", "integration"))
    sys.path.insert(0, os.path.join(SRC, "python"))
    import batchwire
    import bwpy
    import bwtest as bt
    tmp = tempfile.mkdtemp(prefix="bench-tfjl-")
    root = os.path.join(tmp, "data")
    os.makedirs(os.path.join(root, "lines"))
    try:
        r = bt.cli("gen", "--format", "jpeg", "--out", os.path.join(root, "imgs"),
                   "--num-samples", a.images, "--seed", 1, "--image-min", 160, "--image-max",
                   640, timeout=600)
        if r.returncode != 0:
            raise RuntimeError("batchwire gen failed: %s" % r.stderr)
        files = [os.path.join(root, "imgs", "samples", "sample%08d.jpg" % i)
                 for i in range(a.images)]
        per = (a.images + 3) // 4
        for k in range(4):
            with open(os.path.join(root, "lines", "part%d.jsonl" % k), "w") as out:
                for i in range(k * per, min(a.images, (k + 1) * per)):
                    with open(files[i], "rb") as f:
                        enc = base64.b64encode(f.read()).decode()
                    out.write(json.dumps({"image": enc, "label": i % 10}) + "\n")
        coord, workers = bwpy.cluster(tmp, root, 2, worker_args=("--transform-threads", 1))
        pids = [w.pid for w in workers]
        ways = {"files": ("files:imgs/samples", None), "jsonl": ("jsonl:lines/*.jsonl", "image")}
        res = {w: [] for w in ways}
        for k in range(a.rounds + 1):  # round 0: warm-up
            order = list(ways) if k % 2 == 0 else list(ways)[::-1]
            for way in order:
                ds, field = ways[way]
                w0 = bc.procs_cpu(pids)
                n, secs = epoch(batchwire, coord.addr, "%s-%d" % (way, k), ds, field, a.batch)
                cpu = bc.procs_cpu(pids) - w0
                if n != a.images:
                    raise RuntimeError("%s delivered %d images" % (way, n))
                o = {"way": way, "round": k, "images_per_s": n / secs, "workers_cpu": cpu}
                print(json.dumps(o), file=sys.stderr, flush=True)
                if k:
                    res[way].append(o)
        jpeg_bytes = sum(os.path.getsize(f) for f in files)
        jsonl_bytes = sum(os.path.getsize(os.path.join(root, "lines", f))
                          for f in os.listdir(os.path.join(root, "lines")))
        summary = {"images": a.images, "jpeg_bytes": jpeg_bytes, "jsonl_bytes": jsonl_bytes,
                   "batch": a.batch, "rounds": a.rounds, "spec": tdl.SPEC}
        for way in ways:
            rs = res[way]
            summary[way] = {
                "images_per_s": round(bc.median([o["images_per_s"] for o in rs]), 1),
                "workers_cpu_s_per_1k": round(bc.median([o["workers_cpu"] for o in rs]) *
                                              1000.0 / a.images, 3)}
        print(json.dumps(summary), flush=True)
    finally:
        bt.kill_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
