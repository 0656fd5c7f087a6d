#!/usr/bin/python3
"""The cost of mixing in a job (issue 27; docs/semantics.md, "Mixture jobs"): one run, on
loopback, with a coordinator and two workers it starts.

`batchwire fetch --quiet` (one rank, world size 1, --epochs 2) over a mixture of two uint8
.npy sources of n samples each (`--mix npy:a=0.5 --mix npy:b=0.5`), against the same fetch over
one .npy of 2n samples of the same size (`--dataset npy:c`), in plan order and shuffled
(`--shuffle --seed 1`): the same number of samples and bytes per epoch. The mixture reads each
source in a keyed permutation, so its reads are scattered like the shuffled job's, not runs of
consecutive indices like the plan-order job's: the shuffled job is the like-for-like baseline.
A mixture of the one .npy alone (`--mix npy:c=1`) separates the order's cost (the same reads,
one request per worker) from the cost of two sources (a request per source and worker). Reported per sample size: the median samples/s of --repeat runs of each
(interleaved, so that load on the machine hits both alike), their ratio, and the CPU per GiB of
the fetch process and of the workers (getrusage / /proc/PID/stat, as bench/bench_client.py),
which load disturbs much less than the rates.

--baseline-cli PATH adds "mixture_baseline": the same mixture fetched by another build's
`batchwire` CLI (e.g. a copy of the CLI from before a change to the client's mixture path)
against the same coordinator and workers, interleaved with the rest, so a change is measured
against its predecessor in one run.

Usage (after the README's build):
    /usr/bin/python3 bench/bench_mixture_jobs.py [--build build] [--repeat N] [--quick]
        [--baseline-cli PATH]
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

# sample bytes, batch size, samples per source (full run)
SIZES = [(256, 256, 1 << 17), (4 << 10, 256, 1 << 14)]


def fetch(bt, coord, job, source_args, batch, cli=None):
    r = bt.run([cli or bt.CLI] + [str(x) for x in (
               "fetch", "--quiet", "--coordinator", coord, "--job", job, *source_args,
               "--rank", 0, "--world-size", 1, "--batch-size", batch, "--epochs", 2)],
               timeout=600)
    if r.returncode != 0:
        raise RuntimeError("batchwire fetch failed:\n%s%s" % (r.stdout, r.stderr))
    return json.loads(r.stdout.strip().splitlines()[-1])["summary"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(SRC, "build"), help="build folder")
    ap.add_argument("--repeat", type=int, default=5, help="runs per figure (default 5)")
    ap.add_argument("--quick", action="store_true", help="a quarter of the samples")
    ap.add_argument("--baseline-cli", help="another build's batchwire CLI: adds "
                    "mixture_baseline, the mixture fetched by it")
    a = ap.parse_args()
    os.environ["BW_BUILD_DIR"] = os.path.abspath(a.build)
    import bwpy
    import bwtest as bt

    tmp = tempfile.mkdtemp(prefix="bench-mixjobs-")
    root = os.path.join(tmp, "data")
    os.makedirs(root)
    out = []
    try:
        for size, batch, n in SIZES:
            n = n // 4 if a.quick else n
            for name, count in (("a%d" % size, n), ("b%d" % size, n), ("c%d" % size, 2 * n)):
                bwpy.gen_npy(root, name, count, (size,), "uint8")
        coord, workers = bwpy.cluster(tmp, root, 2)
        pids = [w.pid for w in workers]
        for size, batch, n in SIZES:
            mix = ["--mix", "npy:a%d/part-00000.npy=0.5" % size,
                   "--mix", "npy:b%d/part-00000.npy=0.5" % size]
            one = ["--dataset", "npy:c%d/part-00000.npy" % size]
            shuf = one + ["--shuffle", "--seed", 1]
            mix1 = ["--mix", "npy:c%d/part-00000.npy=1" % size]
            runs = [("single", one, None), ("single_shuffled", shuf, None),
                    ("mixture_of_one", mix1, None), ("mixture", mix, None)]
            if a.baseline_cli:
                runs.append(("mixture_baseline", mix, os.path.abspath(a.baseline_cli)))
            labels = [r[0] for r in runs]
            res = {label: [] for label in labels}
            for k in range(a.repeat):
                for label, args, cli in runs:
                    c0, w0 = bc.children_cpu(), bc.procs_cpu(pids)
                    s = fetch(bt, coord.addr, "%s-%d-%d" % (label, size, k), args, batch, cli)
                    c, w = bc.children_cpu() - c0, bc.procs_cpu(pids) - w0
                    res[label].append((s["samples"] / s["seconds"],
                                       bc.ms_per_gib(c, s["bytes"]),
                                       bc.ms_per_gib(w, s["bytes"]), s["samples"]))
            row = {"sample_bytes": size, "batch": batch, "samples_per_run": res["single"][0][3]}
            for label in labels:
                row[label] = {
                    "samples_per_s": round(bc.median([x[0] for x in res[label]])),
                    "client_ms_per_gib": round(bc.median([x[1] for x in res[label]]), 1),
                    "workers_ms_per_gib": round(bc.median([x[2] for x in res[label]]), 1)}
            row["rate_ratio"] = round(row["mixture"]["samples_per_s"] /
                                      row["single"]["samples_per_s"], 3)
            row["rate_ratio_shuffled"] = round(row["mixture"]["samples_per_s"] /
                                               row["single_shuffled"]["samples_per_s"], 3)
            row["client_cpu_ratio"] = round(row["mixture"]["client_ms_per_gib"] /
                                            row["single"]["client_ms_per_gib"], 3)
            row["client_cpu_ratio_shuffled"] = round(
                row["mixture"]["client_ms_per_gib"] /
                row["single_shuffled"]["client_ms_per_gib"], 3)
            if a.baseline_cli:
                row["rate_ratio_baseline"] = round(
                    row["mixture"]["samples_per_s"] /
                    row["mixture_baseline"]["samples_per_s"], 3)
            out.append(row)
            print(json.dumps(row), flush=True)
    finally:
        bt.kill_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
