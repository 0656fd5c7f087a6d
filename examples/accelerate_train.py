#!/usr/bin/env python3
"""Training with Hugging Face Accelerate and batchwire, without re-sharding the data.

batchwire already gives each process exactly its rank's batches (Accelerate's own
BatchSamplerShard semantics in mode="accelerate", docs/semantics.md), so only the model and
the optimizer go through accelerator.prepare(). Preparing the DataLoader as well would shard
it a second time: each process would see 1/world_size of its share.

Run on every process of the job, e.g. with two processes on one machine:

    accelerate launch --num_processes 2 examples/accelerate_train.py \
        --coordinator 10.0.0.5:7700 --dataset npy:train/*.npy --features 3072 --job demo-acc

(`accelerate launch` and torchrun set RANK and WORLD_SIZE, which batchwire reads.) The
data's rows are the model's inputs; the targets here are a stand-in (their sum), to keep
the example short. Checkpoints: the loader's position is saved and restored with the rest of
the state by save_state()/load_state() (register_for_checkpointing).
"""

import argparse
import os

import torch
from accelerate import Accelerator

from batchwire.torch import BatchDataset, DataLoader


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--coordinator", default=os.environ.get("BATCHWIRE_COORDINATOR"))
    ap.add_argument("--dataset", required=True, help="FORMAT:PATH of a float32 .npy dataset")
    ap.add_argument("--features", type=int, required=True,
                    help="values per sample (the product of the .npy row's shape)")
    ap.add_argument("--job", default="accelerate-example")
    ap.add_argument("--batch-size", type=int, default=32, help="per process")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    ap.add_argument("--checkpoint-dir", default=None, help="save_state() here each epoch")
    args = ap.parse_args()

    accelerator = Accelerator()
    data = BatchDataset(coordinator=args.coordinator, job=args.job, dataset=args.dataset,
                        batch_size=args.batch_size, mode="accelerate", shuffle=True, seed=0,
                        rank=accelerator.process_index, world_size=accelerator.num_processes)
    loader = DataLoader(data, num_workers=args.workers, pin_memory=True)
    model = torch.nn.Linear(args.features, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)  # not the loader

    accelerator.register_for_checkpointing(loader)  # its state_dict()/load_state_dict()
    if args.checkpoint_dir and os.path.isdir(args.checkpoint_dir):
        accelerator.load_state(args.checkpoint_dir)  # the loader continues after its state

    for epoch in range(args.epochs):
        for batch in loader:                   # this process's batches; not re-sharded
            x = batch["data"].flatten(1).to(accelerator.device, non_blocking=True)
            real = (~batch["padding"]).to(accelerator.device, torch.float32)  # padding: no loss
            y = x.sum(dim=1, keepdim=True)
            err = ((model(x) - y) ** 2).squeeze(1)
            loss = (err * real).sum() / real.sum().clamp(min=1)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        accelerator.print("epoch %d: loss %.4f" % (epoch, loss.item()))
        if args.checkpoint_dir:
            accelerator.save_state(args.checkpoint_dir)


if __name__ == "__main__":
    main()
