#!/usr/bin/python3
"""The cost of mixing streams in a job (issue 27; docs/semantics.md, "Mixture jobs"): one run,
on loopback, with a coordinator and two workers it starts.

`batchwire fetch --quiet --mode iterable` (one rank, world size 1, --epochs 2) over:

* "single stream": one TFRecord stream of 2n records in 8 files (`--dataset tfrecord:c/*`);
* "mixture of one stream": the same files as the one source of a mixture
  (`--mix stream:tfrecord:c/*=1`): the same records in the same order, so the difference is
  the mixture's path (the order, the per-source reads, the repacking);
* "mixture of two streams": two TFRecord streams of n records (`--mix stream:tfrecord:a/*=0.5
  --mix stream:tfrecord:b/*=0.5`): the same number of records and bytes, interleaved, so each
  batch reads two runs (one per source) instead of one.

Reported per record size: the median records/s of --repeat runs of each (interleaved, so that
load on the machine hits all alike), the ratios to the single stream, and the CPU per GiB of
the fetch process and of the workers (bench_client.py's counters).

Usage (after the README's build):
    /usr/bin/python3 bench/bench_mixture_streams.py [--build build] [--repeat N] [--quick]
"""

import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(SRC, "tests", "integration"))

import bench_client as bc  # noqa: E402
from bench_mixture_jobs import fetch  # noqa: E402

# record bytes, batch size, records per source of the two-stream mixture (full run)
SIZES = [(256, 256, 1 << 16), (4 << 10, 256, 1 << 13)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(SRC, "build"), help="build folder")
    ap.add_argument("--repeat", type=int, default=5, help="runs per figure (default 5)")
    ap.add_argument("--quick", action="store_true", help="a quarter of the records")
    a = ap.parse_args()
    os.environ["BW_BUILD_DIR"] = os.path.abspath(a.build)
    import bwpy
    import bwtest as bt

    tmp = tempfile.mkdtemp(prefix="bench-mixstreams-")
    root = os.path.join(tmp, "data")
    os.makedirs(root)
    out = []
    try:
        for size, batch, n in SIZES:
            n = n // 4 if a.quick else n
            for name, count in (("a%d" % size, n), ("b%d" % size, n), ("c%d" % size, 2 * n)):
                bwpy.gen(root, "tfrecord", name, count, size, size, files=8)
        coord, workers = bwpy.cluster(tmp, root, 2)
        pids = [w.pid for w in workers]
        for size, batch, n in SIZES:
            it = ["--mode", "iterable"]
            runs = [("single_stream", it + ["--dataset", "tfrecord:c%d/*.tfrecord" % size]),
                    ("mixture_of_one_stream",
                     it + ["--mix", "stream:tfrecord:c%d/*.tfrecord=1" % size]),
                    ("mixture_of_two_streams",
                     it + ["--mix", "stream:tfrecord:a%d/*.tfrecord=0.5" % size,
                           "--mix", "stream:tfrecord:b%d/*.tfrecord=0.5" % size])]
            res = {label: [] for label, _ in runs}
            for k in range(a.repeat):
                for label, args in runs:
                    c0, w0 = bc.children_cpu(), bc.procs_cpu(pids)
                    s = fetch(bt, coord.addr, "%s-%d-%d" % (label, size, k), args, batch)
                    c, w = bc.children_cpu() - c0, bc.procs_cpu(pids) - w0
                    res[label].append((s["samples"] / s["seconds"],
                                       bc.ms_per_gib(c, s["bytes"]),
                                       bc.ms_per_gib(w, s["bytes"]), s["samples"]))
            row = {"record_bytes": size, "batch": batch,
                   "records_per_run": res["single_stream"][0][3]}
            for label, _ in runs:
                row[label] = {
                    "records_per_s": round(bc.median([x[0] for x in res[label]])),
                    "client_ms_per_gib": round(bc.median([x[1] for x in res[label]]), 1),
                    "workers_ms_per_gib": round(bc.median([x[2] for x in res[label]]), 1)}
            base = row["single_stream"]
            for label in ("mixture_of_one_stream", "mixture_of_two_streams"):
                row[label]["rate_ratio"] = round(row[label]["records_per_s"] /
                                                 base["records_per_s"], 3)
                row[label]["client_cpu_ratio"] = round(row[label]["client_ms_per_gib"] /
                                                       base["client_ms_per_gib"], 3)
            out.append(row)
            print(json.dumps(row), flush=True)
    finally:
        bt.kill_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
