#!/usr/bin/python3
"""Sampler benchmark: batchwire's torch-exact randperm against torch.randperm in one run,
O(1) batch lookup in a cached 10^8-sample epoch, and the feistel shuffle.

    /usr/bin/python3 bench/bench_sampler.py [--bin build/bench/bench_sampler] [--quick]

Ratios are batchwire time / torch time on this machine, measured now (lower is better).
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run_c(binary, *args):
    out = subprocess.run([binary, *map(str, args)], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{binary} {' '.join(map(str, args))} failed: {out.stderr.strip()}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def torch_randperm_seconds(n, repeats):
    import torch
    best = float("inf")
    first = None
    for _ in range(repeats):
        g = torch.Generator()
        g.manual_seed(42)
        t0 = time.perf_counter()
        p = torch.randperm(n, generator=g)
        best = min(best, time.perf_counter() - t0)
        first = p[:3].tolist()
        del p
    return best, first


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "bench", "bench_sampler"))
    ap.add_argument("--quick", action="store_true", help="10^6 and 10^7 only")
    a = ap.parse_args()
    import torch
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"{os.cpu_count()} CPUs", flush=True)

    sizes = [10**6, 10**7] if a.quick else [10**7, 10**8]
    print("\n## randperm (seed 42), best of N")
    print("| n | torch.randperm s | batchwire u32 s | ratio | batchwire u64 s | ratio | same |")
    print("|---|---|---|---|---|---|---|")
    for n in sizes:
        reps = 3 if n <= 10**7 else 2
        (c,) = run_c(a.bin, "randperm", n, reps)
        t, first = torch_randperm_seconds(n, reps)
        same = "yes" if first == c["first"] else f"NO {first} vs {c['first']}"
        print(f"| {n:.0e} | {t:.3f} | {c['seconds_u32']:.3f} | {c['seconds_u32'] / t:.2f} | "
              f"{c['seconds_u64']:.3f} | {c['seconds_u64'] / t:.2f} | {same} |", flush=True)

    n, R, B = (10**7, 2, 4) if a.quick else (10**8, 8, 8)
    print(f"\n## batch s (rotating ranks), torch mode, shuffled, n={n:.0e}, R={R}, B={B}, "
          "epoch cached")
    rows = run_c(a.bin, "batch_at", n, R, B)
    for r in rows:
        if r["bench"] == "epoch_cache":
            print(f"epoch cache: {r['seconds']:.3f} s, {r['bytes'] / 2**20:.0f} MiB")
    print("| step s | ns per batch |")
    print("|---|---|")
    for r in rows:
        if r["bench"] == "batch_at":
            print(f"| {r['step']} | {r['ns_per_batch']:.0f} |")

    print("\n## feistel shuffle (batch of 1024 indices at scattered steps)")
    print("| n | ns per index | sampler bytes |")
    print("|---|---|---|")
    for fn in [10**8, 10**12]:
        (r,) = run_c(a.bin, "feistel", fn)
        print(f"| {fn:.0e} | {r['ns_per_index']:.1f} | {r['bytes']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
