#!/usr/bin/python3
"""The stream benchmark: a TFRecord stream read once by 4 ranks, against two baselines
measured in the same run on loopback (a coordinator and two workers it starts), for records
of 4 KiB and 64 KiB (docs/performance.md, "Streams"):

(a) stream: batchwire iterable mode -- each record read once by the worker that owns its
    source and each global batch sliced among the ranks (4 concurrent `batchwire fetch --mode
    iterable --world-size 4`, default prefetch), over the data channel (`--transport auto`);
(g) the same over gRPC (`--transport grpc`), for comparison;
(m) map-style over the same bytes: the same TFRecord files read by index (4 concurrent
    `batchwire fetch --mode torch --world-size 4`, no shuffle), over the data channel;
(l) one local process parsing the same files: Python reading each file through the page
    cache and slicing out every record (length read, both CRCs skipped -- the cheapest
    possible reader).

The figure is bytes of records delivered per second (all ranks together), median of --repeat
runs, interleaved, after one untimed round of each (so every reader starts warm: the files in
the page cache, the workers' datasets open and mapped). The acceptance ratios are a/m (>= 0.75) and a/l (>= 1.5). Usage (after
the README's build):
    /usr/bin/python3 bench/bench_streams.py [--build build] [--mib 1024] [--repeat 3]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)

LOCAL_READER = r"""
import struct, sys, time
t0 = time.monotonic(); kept = 0
for p in sys.argv[1].split(','):
    with open(p, 'rb') as f:
        data = f.read()
    off = 0
    while off < len(data):
        n, = struct.unpack_from('<Q', data, off)
        rec = data[off + 12:off + 12 + n]
        kept += len(rec)
        off += 16 + n
print(kept, time.monotonic() - t0)
"""


def fetch_ranks(bt, addr, job, spec, mode, transport, world, b):
    t0 = time.monotonic()
    ps = [subprocess.Popen([bt.CLI, "fetch", "--coordinator", addr, "--job", job, "--dataset",
                            spec, "--mode", mode, "--batch-size", str(b), "--rank", str(k),
                            "--world-size", str(world), "--quiet", "--transport", transport],
                           stdout=subprocess.PIPE, text=True) for k in range(world)]
    got = 0
    for p in ps:
        out = p.communicate()[0]
        if p.returncode != 0:
            raise SystemExit("batchwire fetch (%s) exited %d" % (job, p.returncode))
        s = json.loads(out.splitlines()[-1])["summary"]
        # padding repeats records: count each real record once
        got += s["bytes"]
    return got, time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--mib", type=int, default=1024, help="stream size per record size")
    ap.add_argument("--record-bytes", default="4096,65536")
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
    results = []
    try:
        for rb in [int(x) for x in args.record_bytes.split(",")]:
            records = (args.mib << 20) // rb
            name = "s%d" % rb
            out = os.path.join(cl.root, name)
            r = bt.cli("gen", "--format", "tfrecord", "--out", out, "--num-samples", records,
                       "--files", args.files, "--sample-bytes", rb, timeout=600)
            desc = json.loads(r.stdout)
            spec = "tfrecord:" + ",".join(name + "/" + x for x in desc["sources"])
            paths = [os.path.join(out, x) for x in desc["sources"]]
            W, B = 4, args.batch_size
            runs = {"a": [], "g": [], "m": [], "l": []}
            for rep in range(args.repeat + 1):  # round 0 warms up and is not counted
                for key, mode, tr in (("a", "iterable", "auto"), ("g", "iterable", "grpc"),
                                      ("m", "torch", "auto")):
                    got, dt = fetch_ranks(bt, cl.addr, "%s%s%d" % (key, name, rep), spec, mode,
                                          tr, W, B)
                    if rep:
                        runs[key].append(got / dt)
                t0 = time.monotonic()
                p = subprocess.run([sys.executable, "-c", LOCAL_READER, ",".join(paths)],
                                   stdout=subprocess.PIPE, text=True, check=True)
                if rep:
                    runs["l"].append(int(p.stdout.split()[0]) / (time.monotonic() - t0))
            med = {k: statistics.median(v) / (1 << 20) for k, v in runs.items()}
            results.append({
                "record_bytes": rb, "records": records, "files": args.files, "ranks": W,
                "batch_size": B, "repeat": args.repeat,
                "mib_per_s": {"stream_data_channel": round(med["a"], 1),
                              "stream_grpc": round(med["g"], 1),
                              "map_style_data_channel": round(med["m"], 1),
                              "one_local_process": round(med["l"], 1)},
                "stream_vs_map_style": round(med["a"] / med["m"], 2),
                "stream_vs_local_process": round(med["a"] / med["l"], 2)})
    finally:
        cl.stop()
        bt.kill_all()
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
