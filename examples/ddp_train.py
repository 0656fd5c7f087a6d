#!/usr/bin/env python3
"""PyTorch DistributedDataParallel training on batchwire, with exact resume.

Each process is one rank: it reads exactly its rank's batches from batchwire (the batches
PyTorch's DistributedSampler + DataLoader would give it) and trains a small MLP regressor on
rows of `features..., target` (examples/ddp_make_data.py writes such a dataset). gloo on the
CPU, NCCL when there is a GPU (cuda:LOCAL_RANK).

Checkpoints hold the model, the optimizer and every rank's data position (Loader.state_dict(),
gathered to rank 0), all taken at the same step, written atomically. A restarted run -- a
requeued Slurm job, a rescheduled Kubernetes pod -- loads the checkpoint and continues with
the very next batch of every rank: its final parameters are bit-identical to those of an
uninterrupted run (tests/slurm/test_slurm_requeue.py checks it under a real Slurm).

SIGUSR1 or SIGTERM (slurm/batchwire.sbatch sends SIGUSR1 before the time limit, scancel and
Kubernetes send SIGTERM) makes every rank stop after the step in progress, once all of them
agree, with a checkpoint; the process then exits 0.

Environment (set by slurm/batchwire.sbatch, torchrun or k8s/): RANK, WORLD_SIZE, LOCAL_RANK
(else SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID), MASTER_ADDR, MASTER_PORT,
BATCHWIRE_COORDINATOR, BATCHWIRE_TOKEN_FILE (with authentication), BATCHWIRE_TLS_CA (with
TLS), BATCHWIRE_RUN_DIR (the default checkpoint directory).

    srun python3 examples/ddp_train.py --dataset npy:regress/*.npy --epochs 3
"""

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import batchwire

_stop = {"signal": None}


def _on_signal(signum, _frame):
    _stop["signal"] = signal.Signals(signum).name


def env_int(*names, default=None):
    for n in names:
        if os.environ.get(n):
            return int(os.environ[n])
    if default is None:
        sys.exit("ddp_train: none of %s is set (run under srun, torchrun or the k8s Job)" %
                 "/".join(names))
    return default


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", required=True,
                    help="FORMAT:PATH below the workers' --data-root, e.g. npy:regress/*.npy")
    ap.add_argument("--job", default=None,
                    help="batchwire job name (default: ddp-$SLURM_JOB_ID, or ddp)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0, help="model init and data shuffling")
    ap.add_argument("--checkpoint", default=None,
                    help="checkpoint file (default: $BATCHWIRE_RUN_DIR/ddp_checkpoint.pt)")
    ap.add_argument("--checkpoint-every", type=int, default=50, help="steps between them")
    ap.add_argument("--out", default=None, help="write the final model's state_dict here")
    ap.add_argument("--log-every", type=int, default=20, help="steps between progress lines")
    ap.add_argument("--join-wait", type=float, default=30.0,
                    help="seconds to retry while the rank is still held by this job's "
                         "previous run on another host (its lease runs out)")
    return ap.parse_args()


def open_loader(args, rank, world_size, ckpt):
    opts = dict(job=args.job, dataset=args.dataset, batch_size=args.batch_size, shuffle=True,
                seed=args.seed, rank=rank, world_size=world_size,
                tls_ca=os.environ.get("BATCHWIRE_TLS_CA"))  # None: plaintext
    if ckpt is None:
        opts["start"] = (0, 0)  # a new model starts the data from the beginning too
    elif ckpt["world_size"] == world_size:
        opts["resume"] = ckpt["data"][rank]
    else:  # resized: the rest of the epoch re-sharded over the new world (docs/semantics.md)
        opts.update(elastic=True, resume=ckpt["data"])
    deadline = time.monotonic() + args.join_wait
    while True:
        try:
            return batchwire.Loader(**opts)
        except batchwire.AlreadyExistsError as e:
            # A run killed on another host still holds the rank until its lease runs out
            # (the coordinator's --lease-ms); one on this host is reclaimed at once.
            if time.monotonic() >= deadline:
                raise
            print("rank %d: %s; retrying" % (rank, e), flush=True)
            time.sleep(1.0)


def save_checkpoint(path, rank, world_size, model, opt, loader, global_step, commit=True):
    """Every rank's data position at this step, with rank 0's model and optimizer (DDP keeps
    them equal on every rank), written by rank 0 to a temporary file and renamed. With
    commit, each rank's cursor is also committed to the coordinator."""
    states = [None] * world_size
    dist.all_gather_object(states, loader.state_dict())
    if rank == 0:
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "data": states, "world_size": world_size,
                        "global_step": global_step}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        d = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(d)
        finally:
            os.close(d)
    dist.barrier()
    if commit:  # batchwire status shows it; batchwire.job_checkpoint() reads it
        loader.commit()


def main():
    args = parse_args()
    rank = env_int("RANK", "SLURM_PROCID")
    world_size = env_int("WORLD_SIZE", "SLURM_NTASKS")
    local_rank = env_int("LOCAL_RANK", "SLURM_LOCALID", default=0)
    args.job = args.job or ("ddp-" + os.environ["SLURM_JOB_ID"]
                            if os.environ.get("SLURM_JOB_ID") else "ddp")
    ckpt_path = args.checkpoint or os.path.join(os.environ.get("BATCHWIRE_RUN_DIR", "."),
                                                "ddp_checkpoint.pt")
    for s in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(s, _on_signal)

    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size)

    ckpt = None
    if os.path.exists(ckpt_path):
        # This script's own file in the job's directory (torch < 2.4 cannot read the
        # optimizer's floats with weights_only=True).
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        print("rank %d: resuming from %s at global step %d (data: epoch %d step %d)" %
              (rank, ckpt_path, ckpt["global_step"], ckpt["data"][rank]["epoch"],
               ckpt["data"][rank]["step"]) if ckpt["world_size"] == world_size else
              "rank %d: resuming from %s, taken at world size %d" %
              (rank, ckpt_path, ckpt["world_size"]), flush=True)
    loader = open_loader(args, rank, world_size, ckpt)
    global_step = ckpt["global_step"] if ckpt else 0

    # The model is built at the first batch, when the row width is known (or from the
    # checkpoint's shapes), from the same seed on every rank.
    model = ddp = opt = None

    def build(features):
        nonlocal model, ddp, opt
        torch.manual_seed(args.seed)
        model = Regressor(features, args.hidden).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        if ckpt is not None:
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
        ddp = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda"
                                      else None)

    loss_fn = torch.nn.MSELoss()
    stop = torch.zeros(1, device=device)
    t0 = time.monotonic()
    for epoch in loader.epochs(max(0, args.epochs - loader.position()[0])):
        for batch in loader:
            x = batch.torch().to(device, non_blocking=True)
            if model is None:
                build(x.shape[1] - 1)
            loss = loss_fn(ddp(x[:, :-1]), x[:, -1:])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            global_step += 1
            if rank == 0 and global_step % args.log_every == 0:
                print("epoch %d step %d global_step %d loss %.5f" %
                      (epoch, batch.step, global_step, loss.item()), flush=True)
            # Stop together: every rank learns whether any was signalled at this step.
            stop.fill_(1.0 if _stop["signal"] else 0.0)
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            if stop.item():
                # No commit: when Slurm cancels the job the coordinator is stopping too, and
                # the checkpoint is what the next run resumes from.
                save_checkpoint(ckpt_path, rank, world_size, model, opt, loader, global_step,
                                commit=False)
                e, s = loader.position()
                print("rank %d: stopped (%s) after global step %d, epoch %d step %d, with a "
                      "checkpoint in %s" % (rank, _stop["signal"] or "another rank's signal",
                                            global_step, e, s, ckpt_path), flush=True)
                loader.close()
                dist.destroy_process_group()
                return 0
            if global_step % args.checkpoint_every == 0:
                save_checkpoint(ckpt_path, rank, world_size, model, opt, loader, global_step)
    if model is None and ckpt is not None:  # nothing was left to train
        build(ckpt["model"]["net.0.weight"].shape[1])
    if model is not None:
        save_checkpoint(ckpt_path, rank, world_size, model, opt, loader, global_step)
    if rank == 0:
        print("done: %d epochs, global step %d, %.1f s" %
              (args.epochs, global_step, time.monotonic() - t0), flush=True)
        if args.out and model is not None:
            torch.save(model.state_dict(), args.out)
    loader.close()
    dist.destroy_process_group()
    return 0


class Regressor(torch.nn.Module):
    def __init__(self, features, hidden):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.Tanh(),
                                       torch.nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x)


if __name__ == "__main__":
    sys.exit(main())
