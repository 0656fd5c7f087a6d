#!/usr/bin/env python3
"""Writes a small regression dataset for examples/ddp_train.py: .npy files of float32 rows,
FEATURES inputs then one target, y = tanh(x . w) + noise, from a fixed seed.

    python3 examples/ddp_make_data.py --out DATA_ROOT/regress --rows 8192 --features 16 --files 4

The workers then serve it as "npy:regress/*.npy" (with --data-root DATA_ROOT). Only numpy is
needed.
"""

import argparse
import os

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory to write part-NNNNN.npy into")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--features", type=int, default=16)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.rows < 1 or a.features < 1 or not 1 <= a.files <= a.rows:
        ap.error("need rows >= 1, features >= 1 and 1 <= files <= rows")
    rng = np.random.default_rng(a.seed)
    x = rng.standard_normal((a.rows, a.features), dtype=np.float32)
    w = rng.standard_normal(a.features).astype(np.float32) / np.float32(np.sqrt(a.features))
    y = np.tanh(x @ w) + np.float32(0.05) * rng.standard_normal(a.rows, dtype=np.float32)
    data = np.concatenate([x, y[:, None].astype(np.float32)], axis=1)
    os.makedirs(a.out, exist_ok=True)
    for i, part in enumerate(np.array_split(data, a.files)):
        np.save(os.path.join(a.out, "part-%05d.npy" % i), np.ascontiguousarray(part))
    print("wrote %d rows of %d features + 1 target in %d file(s) to %s" %
          (a.rows, a.features, a.files, a.out))


if __name__ == "__main__":
    main()
