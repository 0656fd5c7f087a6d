#!/usr/bin/env python3
"""Training a classifier on inputs and labels served together by batchwire.

The dataset is two named arrays indexed together, as torch's TensorDataset(x, y) is
(docs/formats.md, "Named arrays"): features `x` (float32, any per-sample shape) and labels `y`
(an integer per sample), as .npy files or one uncompressed .npz archive. Each process is one
rank and reads exactly the (x, y) batches DistributedSampler + DataLoader would give it,
through batchwire.torch with arrays="tuple"; with more than one rank the model is wrapped in
DistributedDataParallel (gloo). It prints each epoch's mean loss and accuracy.

Try it on a synthetic classification problem (batchwire gen: 10 classes, the class signal
plus noise in x, the class in y):

    batchwire gen --format npy --out /data/cls --num-samples 4096 --files 4 \\
        --fields x:float32:3,8,8 y:int64
    python3 examples/fields_train.py --coordinator HOST:PORT \\
        --field x=npy:cls/x/*.npy --field y=npy:cls/y/*.npy --epochs 3
    # or: batchwire gen --format npz ... and --dataset npz:cls/part-*.npz

Environment: RANK and WORLD_SIZE (torchrun, or SLURM_PROCID/SLURM_NTASKS) for several ranks,
MASTER_ADDR/MASTER_PORT for torch.distributed; BATCHWIRE_COORDINATOR instead of
--coordinator.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from batchwire.torch import BatchDataset, DataLoader


def env_int(names, default):
    for n in names:
        if os.environ.get(n):
            return int(os.environ[n])
    return default


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--coordinator", default=os.environ.get("BATCHWIRE_COORDINATOR"))
    ap.add_argument("--field", action="append", default=[], metavar="NAME=npy:PATHS",
                    help="a named array (repeat): the features first, then the labels")
    ap.add_argument("--dataset", help="instead of --field: npz:PATH[,PATH...]")
    ap.add_argument("--job", default="fields-train")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--classes", type=int, default=10)
    args = ap.parse_args(argv)
    if not args.coordinator:
        sys.exit("fields_train: give --coordinator or set BATCHWIRE_COORDINATOR")
    if bool(args.field) == bool(args.dataset):
        sys.exit("fields_train: give the arrays as --field NAME=npy:PATHS (features, then "
                 "labels) or an archive as --dataset npz:PATH")
    dataset = args.dataset or dict(f.split("=", 1) for f in args.field)
    rank = env_int(("RANK", "SLURM_PROCID"), 0)
    world = env_int(("WORLD_SIZE", "SLURM_NTASKS"), 1)
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(args.seed)

    ds = BatchDataset(coordinator=args.coordinator, job=args.job, dataset=dataset,
                      batch_size=args.batch_size, shuffle=True, seed=args.seed, rank=rank,
                      world_size=world, job_epochs=args.epochs, arrays="tuple")
    loader = DataLoader(ds)
    model = None
    for epoch in range(args.epochs):
        total, correct, loss_sum = 0, 0, 0.0
        for x, y in loader:  # this rank's batches, as DataLoader(TensorDataset(x, y)) gives
            x = x.reshape(len(x), -1)
            if model is None:  # the input size is the dataset's
                model = torch.nn.Linear(x.shape[1], args.classes)
                if world > 1:
                    model = DistributedDataParallel(model)
                opt = torch.optim.SGD(model.parameters(), lr=args.lr)
            out = model(x)
            loss = torch.nn.functional.cross_entropy(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum += float(loss) * len(y)
            correct += int((out.argmax(1) == y).sum())
            total += len(y)
        print("rank %d epoch %d: %d samples, loss %.4f, accuracy %.3f" %
              (rank, epoch, total, loss_sum / max(total, 1), correct / max(total, 1)),
              flush=True)
    if world > 1:
        dist.destroy_process_group()
    return correct / max(total, 1)


if __name__ == "__main__":
    main()
