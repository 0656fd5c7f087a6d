#!/usr/bin/python3
"""The cost of mixing in a job (issue 27; docs/semantics.md, "Mixture jobs"): one run, on
loopback, with a coordinator and two workers it starts.

`batchwire fetch --quiet` (rank 0 of world size 1, --epochs E) over a mixture of two uint8
.npy sources of n samples each (`--mix npy:a=0.5 --mix npy:b=0.5`), against the same fetch over
one .npy of 2n samples of the same size (`--dataset npy:c`), in plan order and shuffled
(`--shuffle --seed 1`): the same number of samples and bytes per epoch. The mixture reads each
source in a keyed permutation, so its reads are scattered like the shuffled job's, not runs of
consecutive indices like the plan-order job's: the shuffled job is the like-for-like baseline.
A mixture of the one .npy alone (`--mix npy:c=1`) separates the order's cost (the same reads,
one request per worker) from the cost of two sources (a request per source and worker).
Reported per sample size: the median samples/s of --repeat runs of each (interleaved, so that
load on the machine hits both alike), their ratio, and the CPU per GiB of
the fetch process and of the workers (getrusage / /proc/PID/stat, as bench/bench_client.py),
which load disturbs much less than the rates.

Each run is long enough to be measured (--epochs; by default about 3 million 256-byte or 1
million 4 KiB samples a run, ~2 s on the shared VM, so that /proc's 10 ms CPU ticks are under
1 % of a run), after one unmeasured epoch of each job (the workers' first touch of each file
is not counted). The runs go in rounds, one run of each job a round, every other round in
the reverse order, each compared pair side by side (single shuffled, mixture, the baseline's
mixture, the baseline's single shuffled), so that a pair sees about the same load. Beside the
medians, each ratio is given per round ("mixture / single shuffled" of the same round) as its
median and range over the rounds: a 5 % question needs that spread, not only a ratio of
medians.

--baseline-cli PATH adds "mixture_baseline": the same mixture fetched by another build's
`batchwire` CLI (e.g. a copy of the CLI from before a change to the client's mixture path)
against the same coordinator and workers, interleaved with the rest, so a change is measured
against its predecessor in one run.

--baseline-bin DIR adds a second cluster (coordinator and two workers from DIR, e.g. a copy of
another build's bin/) over the same files, and on it "single_shuffled_baseline" and
"mixture_baseline" fetched by DIR's `batchwire`, interleaved in the same rounds: the workers'
and the client's change together, each build against its own shuffled job (it replaces
--baseline-cli).

--prefetch N passes `--prefetch N` to every fetch (the CLI's default is 4; small batches are
read in groups from 8 on, docs/client.md).

--world-size R makes every fetch rank 0 of R (torch mode: its positions are R apart in the
global order, so a mixture's interleave is reached position by position rather than a merged
span at a time) over R times the epochs, the same samples a run.

Usage (after the README's build):
    /usr/bin/python3 bench/bench_mixture_jobs.py [--build build] [--repeat N] [--quick]
        [--epochs E] [--prefetch N] [--world-size R] [--baseline-cli PATH | --baseline-bin DIR]
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

# sample bytes, batch size, samples per source, epochs a run (full run: ~2 s each)
SIZES = [(256, 256, 1 << 17, 12), (4 << 10, 256, 1 << 14, 32)]


PREFETCH = []  # ["--prefetch", N] from --prefetch
WORLD = [1]  # --world-size: rank 0 of that many fetches


def fetch(bt, coord, job, source_args, batch, epochs=2, cli=None):
    r = bt.run([cli or bt.CLI] + [str(x) for x in (
               "fetch", "--quiet", "--coordinator", coord, "--job", job, *source_args,
               "--rank", 0, "--world-size", WORLD[0], "--batch-size", batch, "--epochs", epochs,
               *PREFETCH)],
               timeout=600)
    if r.returncode != 0:
        raise RuntimeError("batchwire fetch failed:\n%s%s" % (r.stdout, r.stderr))
    return json.loads(r.stdout.strip().splitlines()[-1])["summary"]


def spread(xs):
    """{"median", "min", "max"} of per-round ratios, to 3 places."""
    return {"median": round(bc.median(xs), 3), "min": round(min(xs), 3),
            "max": round(max(xs), 3)}


def baseline_cluster(bt, bwpy, tmp, root, bindir):
    """A coordinator and two workers started from bindir's binaries over root."""
    saved = bt.COORDINATOR, bt.WORKER
    bt.COORDINATOR = os.path.join(bindir, "batchwire-coordinator")
    bt.WORKER = os.path.join(bindir, "batchwire-worker")
    try:
        os.makedirs(os.path.join(tmp, "baseline"))
        return bwpy.cluster(os.path.join(tmp, "baseline"), root, 2)
    finally:
        bt.COORDINATOR, bt.WORKER = saved


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(SRC, "build"), help="build folder")
    ap.add_argument("--repeat", type=int, default=5, help="runs per figure (default 5)")
    ap.add_argument("--quick", action="store_true",
                    help="a quarter of the samples, 2 epochs a run")
    ap.add_argument("--epochs", type=int, help="epochs a run (default: 12 at 256 B, 32 at 4 KiB, "
                    "2 with --quick)")
    ap.add_argument("--baseline-cli", help="another build's batchwire CLI: adds "
                    "mixture_baseline, the mixture fetched by it")
    ap.add_argument("--baseline-bin", help="another build's bin/ folder: adds a cluster of its "
                    "daemons, and single_shuffled_baseline and mixture_baseline on it")
    ap.add_argument("--prefetch", type=int, help="--prefetch for every fetch (default: the CLI's)")
    ap.add_argument("--world-size", type=int, default=1,
                    help="every fetch is rank 0 of this many, in torch mode (default 1); the "
                    "epochs a run are multiplied by it, so that a run reads as many samples")
    a = ap.parse_args()
    if a.baseline_cli and a.baseline_bin:
        ap.error("--baseline-cli and --baseline-bin: one or the other")
    if a.epochs is not None and a.epochs < 1:
        ap.error("--epochs must be at least 1 (got %d)" % a.epochs)
    if a.prefetch is not None:
        if a.prefetch < 1:
            ap.error("--prefetch must be at least 1 (got %d)" % a.prefetch)
        PREFETCH[:] = ["--prefetch", a.prefetch]
    if a.repeat < 1:
        ap.error("--repeat must be at least 1 (got %d)" % a.repeat)
    if a.world_size < 1:
        ap.error("--world-size must be at least 1 (got %d)" % a.world_size)
    WORLD[0] = a.world_size
    os.environ["BW_BUILD_DIR"] = os.path.abspath(a.build)
    import bwpy
    import bwtest as bt

    tmp = tempfile.mkdtemp(prefix="bench-mixjobs-")
    root = os.path.join(tmp, "data")
    os.makedirs(root)
    out = []
    try:
        for size, batch, n, _ in SIZES:
            n = n // 4 if a.quick else n
            for name, count in (("a%d" % size, n), ("b%d" % size, n), ("c%d" % size, 2 * n)):
                bwpy.gen_npy(root, name, count, (size,), "uint8")
        coord, workers = bwpy.cluster(tmp, root, 2)
        pids = {None: [w.pid for w in workers]}
        bcoord = None
        if a.baseline_bin:
            bindir = os.path.abspath(a.baseline_bin)
            bcoord, bworkers = baseline_cluster(bt, bwpy, tmp, root, bindir)
            pids[bcoord.addr] = [w.pid for w in bworkers]
        for size, batch, n, epochs in SIZES:
            epochs = (a.epochs or (2 if a.quick else epochs)) * a.world_size
            mix = ["--mix", "npy:a%d/part-00000.npy=0.5" % size,
                   "--mix", "npy:b%d/part-00000.npy=0.5" % size]
            one = ["--dataset", "npy:c%d/part-00000.npy" % size]
            shuf = one + ["--shuffle", "--seed", 1]
            mix1 = ["--mix", "npy:c%d/part-00000.npy=1" % size]
            # (label, arguments, CLI, coordinator: None for the main cluster)
            # in an order that puts each compared pair side by side
            runs = [("single", one, None, None), ("mixture_of_one", mix1, None, None),
                    ("single_shuffled", shuf, None, None), ("mixture", mix, None, None)]
            if a.baseline_cli:
                runs.append(("mixture_baseline", mix, os.path.abspath(a.baseline_cli), None))
            if bcoord:
                bcli = os.path.join(bindir, "batchwire")
                runs += [("mixture_baseline", mix, bcli, bcoord.addr),
                         ("single_shuffled_baseline", shuf, bcli, bcoord.addr)]
            labels = [r[0] for r in runs]
            res = {label: [] for label in labels}
            for label, args, cli, at in runs:  # unmeasured: files mapped, connections made
                fetch(bt, at or coord.addr, "%s-%d-warm" % (label, size), args, batch, 1, cli)
            for k in range(a.repeat):
                for label, args, cli, at in (runs if k % 2 == 0 else runs[::-1]):
                    wp = pids[at]
                    c0, w0 = bc.children_cpu(), bc.procs_cpu(wp)
                    s = fetch(bt, at or coord.addr, "%s-%d-%d" % (label, size, k), args, batch,
                              epochs, cli)
                    c, w = bc.children_cpu() - c0, bc.procs_cpu(wp) - w0
                    res[label].append((s["samples"] / s["seconds"],
                                       bc.ms_per_gib(c, s["bytes"]),
                                       bc.ms_per_gib(w, s["bytes"]), s["samples"]))
            row = {"sample_bytes": size, "batch": batch, "epochs": epochs,
                   "samples_per_run": res["single"][0][3], "rounds": a.repeat}
            for label in labels:
                row[label] = {
                    "samples_per_s": round(bc.median([x[0] for x in res[label]])),
                    "client_ms_per_gib": round(bc.median([x[1] for x in res[label]]), 1),
                    "workers_ms_per_gib": round(bc.median([x[2] for x in res[label]]), 1)}

            def ratios(num, den, field):
                return [x[field] / y[field] for x, y in zip(res[num], res[den])]

            row["rate_ratio"] = round(row["mixture"]["samples_per_s"] /
                                      row["single"]["samples_per_s"], 3)
            row["rate_ratio_shuffled"] = round(row["mixture"]["samples_per_s"] /
                                               row["single_shuffled"]["samples_per_s"], 3)
            row["client_cpu_ratio"] = round(row["mixture"]["client_ms_per_gib"] /
                                            row["single"]["client_ms_per_gib"], 3)
            row["client_cpu_ratio_shuffled"] = round(
                row["mixture"]["client_ms_per_gib"] /
                row["single_shuffled"]["client_ms_per_gib"], 3)
            # per round: mixture against the shuffled single-source job of the same round
            row["per_round_shuffled"] = {
                "rate": spread(ratios("mixture", "single_shuffled", 0)),
                "client_cpu": spread(ratios("mixture", "single_shuffled", 1)),
                "workers_cpu": spread(ratios("mixture", "single_shuffled", 2))}
            if a.baseline_cli:
                row["rate_ratio_baseline"] = round(
                    row["mixture"]["samples_per_s"] /
                    row["mixture_baseline"]["samples_per_s"], 3)
                row["per_round_baseline"] = {
                    "rate": spread(ratios("mixture", "mixture_baseline", 0)),
                    "client_cpu": spread(ratios("mixture", "mixture_baseline", 1))}
            if bcoord:
                row["per_round_shuffled_baseline"] = {
                    "rate": spread(ratios("mixture_baseline", "single_shuffled_baseline", 0)),
                    "client_cpu": spread(ratios("mixture_baseline", "single_shuffled_baseline",
                                                1)),
                    "workers_cpu": spread(ratios("mixture_baseline",
                                                 "single_shuffled_baseline", 2))}
                row["per_round_baseline"] = {
                    "rate": spread(ratios("mixture", "mixture_baseline", 0)),
                    "client_cpu": spread(ratios("mixture", "mixture_baseline", 1)),
                    "workers_cpu": spread(ratios("mixture", "mixture_baseline", 2))}
            out.append(row)
            print(json.dumps(row), flush=True)
    finally:
        bt.kill_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
