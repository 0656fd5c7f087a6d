#!/usr/bin/python3
"""The stream benchmark: bytes of a TFRecord stream delivered to 4 ranks, in one run on
loopback with a coordinator and two workers it starts, three ways:

(a) batchwire iterable mode: the stream is read once by the workers that own its sources and
    each global batch is sliced among the ranks (4 concurrent `batchwire fetch --mode iterable
    --world-size 4`);
(b) what IterableDatasetShard does, through the same service: every rank reads the whole
    stream (4 concurrent `batchwire fetch --mode iterable --world-size 1`, one job each) and
    would keep 1/4 of it;
(c) what IterableDatasetShard does on a shared file system: every rank parses the whole
    TFRecord files itself (4 Python processes reading through the page cache, length and
    both CRCs skipped -- the cheapest possible reader) and keeps every 4th global slice.

The figure is useful bytes delivered per second over all ranks (each byte of the stream
counted once), median of --repeat runs, interleaved. Usage (after the README's build):
    /usr/bin/python3 bench/bench_streams.py [--build build] [--records N] [--repeat N]
"""

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)

RANK_READER = r"""
import struct, sys, time
paths, rank, world, b = sys.argv[1].split(','), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t0 = time.monotonic(); pos = kept = 0
for p in paths:
    with open(p, 'rb') as f:
        data = f.read()
    off = 0
    while off < len(data):
        n, = struct.unpack_from('<Q', data, off)
        rec = data[off + 12:off + 12 + n]
        off += 16 + n
        if (pos // b) % world == rank:
            kept += len(rec)
        pos += 1
print(kept, time.monotonic() - t0)
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--records", type=int, default=16384)
    ap.add_argument("--record-bytes", type=int, default=4096)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    os.environ["BW_BUILD_DIR"] = args.build
    os.environ["BW_BIN_DIR"] = os.path.join(args.build, "bin")
    sys.path.insert(0, os.path.join(SRC, "tests", "integration"))
    import bwtest as bt
    from test_client_e2e import Cluster

    tmp = tempfile.mkdtemp(prefix="bench-streams-")
    cl = Cluster(tmp, nworkers=2)
    try:
        out = os.path.join(cl.root, "s")
        r = bt.cli("gen", "--format", "tfrecord", "--out", out, "--num-samples", args.records,
                   "--files", args.files, "--sample-bytes", args.record_bytes, timeout=300)
        desc = json.loads(r.stdout)
        spec = "tfrecord:" + ",".join("s/" + x for x in desc["sources"])
        paths = [os.path.join(out, x) for x in desc["sources"]]
        total = args.records * args.record_bytes
        W, B = 4, args.batch_size
        runs = {"a": [], "b": [], "c": []}
        for rep in range(args.repeat):
            # (a) read once, dispatched
            t0 = time.monotonic()
            ps = [subprocess.Popen([bt.CLI, "fetch", "--coordinator", cl.addr, "--job",
                                    "a%d" % rep, "--dataset", spec, "--mode", "iterable",
                                    "--batch-size", str(B), "--rank", str(k), "--world-size",
                                    str(W), "--quiet", "--prefetch", "8"],
                                   stdout=subprocess.PIPE, text=True) for k in range(W)]
            got = sum(json.loads(p.communicate()[0].splitlines()[-1])["summary"]["bytes"]
                      for p in ps)
            runs["a"].append(got / (time.monotonic() - t0))
            # (b) every rank reads the whole stream from the service
            t0 = time.monotonic()
            ps = [subprocess.Popen([bt.CLI, "fetch", "--coordinator", cl.addr, "--job",
                                    "b%d-%d" % (rep, k), "--dataset", spec, "--mode",
                                    "iterable", "--batch-size", str(B), "--rank", "0",
                                    "--world-size", "1", "--quiet", "--prefetch", "8"],
                                   stdout=subprocess.PIPE, text=True) for k in range(W)]
            for p in ps:
                p.communicate()
            runs["b"].append(total / (time.monotonic() - t0))
            # (c) every rank parses the whole files itself
            t0 = time.monotonic()
            ps = [subprocess.Popen([sys.executable, "-c", RANK_READER, ",".join(paths), str(k),
                                    str(W), str(B)], stdout=subprocess.PIPE, text=True)
                  for k in range(W)]
            kept = sum(int(p.communicate()[0].split()[0]) for p in ps)
            runs["c"].append(kept / (time.monotonic() - t0))
        med = {k: statistics.median(v) / (1 << 20) for k, v in runs.items()}
        print(json.dumps({
            "records": args.records, "record_bytes": args.record_bytes, "files": args.files,
            "ranks": W, "batch_size": B, "repeat": args.repeat,
            "useful_mib_per_s": {"read_once_dispatched": round(med["a"], 1),
                                 "every_rank_reads_all_via_service": round(med["b"], 1),
                                 "every_rank_parses_files": round(med["c"], 1)},
            "ratio_vs_service_baseline": round(med["a"] / med["b"], 2),
            "ratio_vs_file_baseline": round(med["a"] / med["c"], 2)}, indent=1))
    finally:
        cl.stop()
        bt.kill_all()


if __name__ == "__main__":
    main()
