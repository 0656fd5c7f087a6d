#!/usr/bin/python3
"""What safe views cost: batchwire.Loader epochs over loopback, same run, four ways.

  reuse    Loader(reuse_buffers=True): the loader reuses its buffers under live views (the
           unsafe opt-in); the baseline;
  dropped  safe views (the default), each batch's tensor (and the Batch) released before the
           next batch: the hold is taken and given back, no buffer changes hands;
  kept     safe views, the usual loop (`for b in lo: x = b.torch()`): the previous tensor is
           still alive when the next batch is taken, so every batch's buffer goes to its
           view and the slot continues with a spare one (no copy);
  copy     the other way to be safe: reuse_buffers=True and `b.torch().clone()` per batch.

Every variant reads one byte of every 4 KiB page of each batch (so a fresh buffer's page
faults are paid). Also measured: the time of the batch.torch() call itself, with a hold
(safe) and without (reuse), over 4096 small batches -- what safety adds per batch in Python. One rank, world size 1, shuffled, a uint8 .npy dataset per sample size.
Medians of --repeat interleaved runs. Usage (after the README's build):
    /usr/bin/python3 bench/bench_views.py [--build build] [--repeat 5] [--mib 256]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(SRC, "tests", "integration"))
sys.path.insert(0, os.path.join(SRC, "python"))

KiB, MiB = 1 << 10, 1 << 20
SIZES = [(4 * KiB, 256), (64 * KiB, 64), (MiB, 16)]  # sample bytes, batch size
VARIANTS = ["reuse", "dropped", "kept", "copy"]


def run_epoch(batchwire, coord, job, dataset, batch, variant):
    reuse = variant in ("reuse", "copy")
    nbytes = 0
    t0 = time.perf_counter()
    with batchwire.Loader(coordinator=coord, job=job, dataset=dataset, batch_size=batch,
                          shuffle=True, seed=0, rank=0, world_size=1,
                          reuse_buffers=reuse) as lo:
        x = flat = None
        for b in lo:
            x = b.torch()
            if variant == "copy":
                x = x.clone()
            flat = x.view(-1)
            int(flat[::4096].sum())
            nbytes += flat.numel()
            if variant == "dropped":
                x = flat = b = None  # all released before the next batch is taken
        x = flat = None
    return nbytes / MiB / (time.perf_counter() - t0)


def torch_call_us(batchwire, coord, job, dataset, reuse):
    """Mean time of batch.torch() in microseconds over one epoch."""
    spent = n = 0
    with batchwire.Loader(coordinator=coord, job=job, dataset=dataset, batch_size=16, rank=0,
                          world_size=1, reuse_buffers=reuse, prefetch=8) as lo:
        for b in lo:
            t0 = time.perf_counter()
            x = b.torch()
            spent += time.perf_counter() - t0
            n += 1
        del x
    return spent / n * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--mib", type=int, default=256, help="dataset size per sample size")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    os.environ.setdefault("BW_BUILD_DIR", build)
    os.environ.setdefault("BW_BIN_DIR", os.path.join(build, "bin"))
    os.environ["BATCHWIRE_LIB"] = os.path.join(build, "lib", "libbatchwire.so")
    import bwtest as bt
    import batchwire
    import torch  # noqa: F401  (imported before timing)

    rows, calls = [], {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="bench-views-") as tmp:
        root = os.path.join(tmp, "data")
        os.makedirs(root)
        coord = bt.coordinator(tmp)
        workers = [bt.worker(tmp, coord.addr, "w%d" % i, data_root=root) for i in range(2)]
        bt.poll(lambda: sum(w["state"] == "alive"
                            for w in bt.status_json(coord.addr)["workers"]) == 2, 20,
                what="two live workers")
        try:
            for sample, batch in SIZES:
                n = args.mib * MiB // sample
                name = "s%d" % sample
                r = bt.cli("gen", "--format", "npy", "--out", os.path.join(root, name),
                           "--num-samples", n, "--shape", str(sample), "--dtype", "uint8",
                           timeout=600)
                if r.returncode != 0:
                    raise RuntimeError(r.stderr)
                ds = "npy:%s/part-00000.npy" % name
                rates = {v: [] for v in VARIANTS}
                for i in range(args.repeat + 1):  # the first round warms the page cache
                    for v in VARIANTS:
                        rate = run_epoch(batchwire, coord.addr, "%s-%s-%d" % (name, v, i), ds,
                                         batch, v)
                        if i:
                            rates[v].append(rate)
                med = {v: statistics.median(rates[v]) for v in VARIANTS}
                rows.append((sample, batch, n // batch, med))
                print("sample %d B, batch %d: %s" % (sample, batch, ", ".join(
                    "%s %.0f MiB/s" % (v, med[v]) for v in VARIANTS)), file=sys.stderr,
                    flush=True)
            r = bt.cli("gen", "--format", "npy", "--out", os.path.join(root, "small"),
                       "--num-samples", 4096 * 16, "--shape", "64", "--dtype", "uint8",
                       timeout=600)
            if r.returncode != 0:
                raise RuntimeError(r.stderr)
            for i in range(args.repeat):
                for reuse in (True, False):
                    calls[reuse].append(torch_call_us(batchwire, coord.addr, "call-%d-%d" % (
                        i, reuse), "npy:small/part-00000.npy", reuse))
        finally:
            for w in workers:
                w.stop()
            coord.stop()
    print("| sample | batch | batches | reuse (baseline) MiB/s | dropped | kept | copy |")
    print("|---|---|---|---|---|---|---|")
    for sample, batch, nb, med in rows:
        base = med["reuse"]
        print("| %s | %d | %d | %.0f | %.0f (%.2f) | %.0f (%.2f) | %.0f (%.2f) |" % (
            "%d KiB" % (sample // KiB) if sample < MiB else "%d MiB" % (sample // MiB), batch,
            nb, base, med["dropped"], med["dropped"] / base, med["kept"], med["kept"] / base,
            med["copy"], med["copy"] / base))
    print("\nbatch.torch(): %.1f us with a hold (safe), %.1f us without (reuse_buffers=True)" % (
        statistics.median(calls[False]), statistics.median(calls[True])))


if __name__ == "__main__":
    main()
