#!/usr/bin/python3
"""Generate PyTorch reference vectors for the sampler core (tests/data/torch/).

Run with Debian's real PyTorch:  /usr/bin/python3 tests/golden/gen_torch_vectors.py
Outputs (JSON Lines, one record per line, deterministic):
  randperm.jsonl     torch.randperm(n, generator=torch.Generator().manual_seed(seed))
                     (seed as given, may be negative or >= 2**63); small n in full, larger n
                     as a prefix plus an FNV-1a-64 digest of the values (little-endian u64).
  randperm_large_algo.jsonl
                     the inside-out Fisher-Yates with random64() that PyTorch >= 2.6 uses for
                     n >= 214748364, computed by a Python reimplementation (the torch installed
                     here, 1.13, always uses the small-n algorithm). The reimplementation of the
                     generator is first checked against torch's own randperm. Records give the
                     permutation the algorithm produces for small n (the algorithm is forced).
  distributed.jsonl  DistributedSampler(range(n), R, r, shuffle, seed, drop_last=sdl) after
                     set_epoch(epoch), wrapped in DataLoader(batch_size=B, drop_last=dl):
                     per rank the loader's batches and len(loader).
"""
import json
import os
import random
import sys

import torch
from torch.utils.data import DataLoader, DistributedSampler

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "torch")
MASK64 = (1 << 64) - 1


def fnv1a64(values):
    h = 0xCBF29CE484222325
    for v in values:
        v &= MASK64
        for _ in range(8):
            h ^= v & 0xFF
            h = (h * 0x100000001B3) & MASK64
            v >>= 8
    return h


def torch_randperm(n, seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return torch.randperm(n, generator=g).tolist()


class MT:
    """MT19937 seeded the way c10's mt19937 is (init_genrand with the low 32 bits)."""

    def __init__(self, seed):
        s = seed & 0xFFFFFFFF
        st = [s]
        for j in range(1, 624):
            s = (1812433253 * (s ^ (s >> 30)) + j) & 0xFFFFFFFF
            st.append(s)
        self.r = random.Random()
        self.r.setstate((3, tuple(st) + (624,), None))

    def random(self):
        return self.r.getrandbits(32)

    def random64(self):
        hi = self.random()
        lo = self.random()
        return (hi << 32) | lo


def py_randperm_small(n, seed):
    g = MT(seed)
    r = list(range(n))
    for i in range(n - 1):
        z = g.random() % (n - i)
        r[i], r[i + z] = r[i + z], r[i]
    return r


def py_randperm_inside_out(n, seed):
    g = MT(seed)
    r = [0] * n
    for i in range(n):
        z = g.random64() % (i + 1)
        r[i] = r[z]
        r[z] = i
    return r


SEEDS = [0, 1, 42, 12345, 2**31 - 1, 2**32 - 1, 2**32, 2**33 + 1, 2**63 - 1, 2**64 - 1,
         -1, -2, -12345, -(2**63), 123456789012345678]


def gen_randperm():
    recs = []
    for seed in SEEDS:
        for n in [0, 1, 2, 3, 4, 5, 7, 10, 16, 17, 31, 100, 257, 1000]:
            recs.append({"n": n, "seed": seed, "perm": torch_randperm(n, seed)})
        for n in [4099, 100003, 1000000]:
            p = torch_randperm(n, seed)
            recs.append({"n": n, "seed": seed, "prefix": p[:16], "fnv1a64": fnv1a64(p)})
    return recs


def gen_large_algo():
    # The Python generator must agree with torch before it is trusted for the other path.
    for seed in SEEDS:
        for n in [1, 2, 10, 1000, 5000]:
            assert py_randperm_small(n, seed) == torch_randperm(n, seed), (n, seed)
    recs = []
    for seed in SEEDS:
        for n in [0, 1, 2, 3, 5, 10, 17, 100, 1000]:
            recs.append({"n": n, "seed": seed, "perm": py_randperm_inside_out(n, seed)})
        p = py_randperm_inside_out(50000, seed)
        recs.append({"n": 50000, "seed": seed, "prefix": p[:16], "fnv1a64": fnv1a64(p)})
    return recs


def gen_distributed():
    rng = random.Random(20240601)
    recs = []
    grid = []
    for n in [0, 1, 5, 7, 10, 13, 31, 100]:
        for R in [1, 2, 3, 4, 8]:
            for B in [1, 3, 5, 8]:
                for sdl in [False, True]:
                    for dl in [False, True]:
                        grid.append((n, R, B, sdl, dl, False, 0, 0))
                        for seed in [0, 2**33 + 1, -5, 2**63 - 1]:
                            for epoch in [0, 1, 3]:
                                grid.append((n, R, B, sdl, dl, True, seed, epoch))
    # Every unshuffled combination plus a fixed random sample of shuffled ones keeps the
    # file small while covering every (n, R, B, drop_last) cell.
    plain = [g for g in grid if not g[5]]
    shuffled = [g for g in grid if g[5]]
    chosen = plain + sorted(rng.sample(shuffled, 400))
    for (n, R, B, sdl, dl, shuffle, seed, epoch) in chosen:
        per_rank = []
        for r in range(R):
            s = DistributedSampler(list(range(n)), num_replicas=R, rank=r, shuffle=shuffle,
                                   seed=seed, drop_last=sdl)
            s.set_epoch(epoch)
            dlr = DataLoader(list(range(n)), batch_size=B, sampler=s, drop_last=dl,
                             collate_fn=lambda x: x)
            per_rank.append({"len": len(dlr), "batches": [list(b) for b in dlr]})
        recs.append({"n": n, "world_size": R, "batch_size": B, "sampler_drop_last": sdl,
                     "drop_last": dl, "shuffle": shuffle, "seed": seed, "epoch": epoch,
                     "per_rank": per_rank})
    return recs


def write(name, recs):
    path = os.path.join(OUT, name)
    with open(path, "w") as f:
        for r in recs:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    print(f"{path}: {len(recs)} records, {os.path.getsize(path)} bytes", file=sys.stderr)


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(1)
    write("randperm.jsonl", gen_randperm())
    write("randperm_large_algo.jsonl", gen_large_algo())
    write("distributed.jsonl", gen_distributed())


if __name__ == "__main__":
    main()
