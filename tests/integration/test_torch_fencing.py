"""Fencing under PyTorch's DataLoader workers (issue 30, item 2; docs/client.md, "Fencing",
"Under PyTorch's DataLoader").

A coordinator with a 1 s lease and two storage workers serve a .npy dataset. A trainer runs a
DataLoader(batchwire.torch.BatchDataset, num_workers=2, prefetch_factor=2) over rank 0,
printing every item (and each worker the exception that ended its iteration). The test stops
the trainer and its workers (SIGSTOP to its process group) at a random moment, waits past the
lease, lets `batchwire fetch` take the rank and give it back, and continues the trainer.

* batchwire.torch.DataLoader (twice: plain, and with persistent workers and a loop that
  breaks out every 25 items, so that iterations follow each other and each item must be
  checked against its own iteration's lease): the main process hands an item out only while
  worker 0's lease is proven, so the trainer prints at most the one item its loop held when
  it was stopped, then stops with LeaseLostError (BW_LEASE_LOST) -- none of the items the
  workers had read ahead into torch's result queue.
* torch.utils.data.DataLoader, whose main process nothing checks: worker 0 holds the lease and
  worker 1 confirms the same lease (it opened its share with it), so both stop for good with
  LeaseLostError while the stopped loop's iterator still gives them tasks; the trainer prints
  at most the items already under way -- torch's prefetch_factor x num_workers outstanding
  items, plus the one its loop held -- and then raises LeaseLostError from a worker.

With the fork and forkserver contexts in the plain build, forkserver and spawn in the sanitizer
build (a plain fork of a multi-threaded process under ASan can deadlock).
"""

import os
import random
import signal
import time

import bwpy
import bwtest as bt

N, B = 4000, 2
PREFETCH_FACTOR, WORKERS = 2, 2
LEASE_MS = 1000

TRAINER = r'''
import os, sys, time
import torch.utils.data
from batchwire.torch import BatchDataset, DataLoader


def say(line):
    """One write per line: the DataLoader's workers print to the same pipe."""
    os.write(1, (line + "\n").encode())


class Reporting(BatchDataset):
    """Says on stdout which exception ended each DataLoader worker's iteration."""

    def __iter__(self):
        it = super().__iter__()
        info = torch.utils.data.get_worker_info()

        def run():
            try:
                yield from it
            except Exception as e:
                say("worker-error %%d %%s" %% (info.id, type(e).__name__))
                raise
        return run()


def main():
    addr, job, ctx, kind = sys.argv[1:5]
    ds = Reporting(coordinator=addr, job=job, dataset="npy:ds/part-00000.npy",
                   batch_size=%d, rank=0, world_size=1, prefetch=2)
    kw = dict(num_workers=%d, prefetch_factor=%d, multiprocessing_context=ctx)
    if kind == "torch":
        dl = torch.utils.data.DataLoader(ds, batch_size=None, **kw)
    else:
        dl = DataLoader(ds, persistent_workers=kind == "persistent", **kw)
    try:
        while True:
            for i, item in enumerate(dl):
                say("batch %%d %%d" %% (item["epoch"], item["step"]))
                time.sleep(0.005)
                if kind == "persistent" and i == 24:
                    break
    except Exception as e:
        say("error %%s" %% " | ".join(str(e).splitlines()))
        if kind == "torch":
            time.sleep(1.5)  # the iterator lives on: its workers run the tasks they were given
        sys.exit(3)


if __name__ == "__main__":
    main()
''' % (B, WORKERS, PREFETCH_FACTOR)


def test(tmpdir):
    bwpy.import_batchwire()
    root = os.path.join(tmpdir, "data")
    os.makedirs(root)
    bwpy.gen_npy(root, "ds", N, (4,))
    coord = bt.coordinator(tmpdir, args=["--lease-ms", str(LEASE_MS)])
    for i in range(2):
        bt.worker(tmpdir, coord.addr, "w%d" % i, data_root=root)
    bt.poll(lambda: sum(w["state"] == "alive"
                        for w in bt.status_json(coord.addr)["workers"]) == 2,
            20, what="2 live workers")
    asan = "address" in bwpy.sanitize_flags()
    contexts = ("forkserver", "spawn") if asan else ("fork", "forkserver")
    code = os.path.join(tmpdir, "trainer.py")
    with open(code, "w") as f:
        f.write(TRAINER)
    rng = random.Random(7)
    for ctx in contexts:
        for trial, kind in enumerate(("batchwire", "persistent", "torch")):
            # batchwire.torch.DataLoader: the one item the loop held; torch's: also the
            # prefetch_factor x num_workers items under way.
            bound = 1 if kind != "torch" else PREFETCH_FACTOR * WORKERS + 1
            job = "fence-%s-%d" % (ctx, trial)
            p = bwpy.python_child(tmpdir, "trainer-" + job, [code, coord.addr, job, ctx, kind])
            out = p.out
            out.wait(lambda ls: sum(1 for x in ls if x and x.startswith("batch")) >= 30, 120,
                     "30 batches")
            time.sleep(rng.uniform(0.0, 0.3))
            os.killpg(p.pid, signal.SIGSTOP)  # the trainer and its DataLoader workers
            time.sleep(LEASE_MS / 1000.0 * 1.6)
            before = len(out.wait(lambda ls: True, 1, "lines"))
            r = bt.cli("fetch", "--coordinator", coord.addr, "--job", job, "--dataset",
                       bwpy.NPY, "--rank", 0, "--world-size", 1, "--batch-size", B,
                       "--max-steps", 1, "--quiet", timeout=60)
            bt.check(r.returncode == 0, "%s, trial %d: with the trainer stopped past its lease, "
                     "batchwire fetch takes rank 0 (and gives it back)" % (ctx, trial),
                     r.stderr)
            os.killpg(p.pid, signal.SIGCONT)
            held = [x for x in out.wait(lambda ls: True, 1, "lines")[:before]
                    if x and x.startswith("batch")]
            stop_epoch = int(held[-1].split()[1])

            def settled(ls):
                new = [x for x in ls[before:] if x]
                return any(x.startswith("error") or (x.startswith("batch") and
                                                     int(x.split()[1]) > stop_epoch)
                           for x in new)
            lines = out.wait(settled, 60, "error (or a new iteration) after it was continued")
            if kind == "persistent" and not any(x and x.startswith("error")
                                                for x in lines[before:]):
                # The stop fell between two iterations (the loop had taken its iteration's
                # last item, or was taking it): the stopped iteration hands out nothing more
                # and the next one opens a new loader, which claims the rank anew since the
                # other process gave it back -- as a restarted trainer would
                # (docs/client.md, "Fencing").
                old = [x for x in lines[before:] if x and x.startswith("batch") and
                       int(x.split()[1]) == stop_epoch]
                first_new = [x for x in lines[before:] if x and x.startswith("batch") and
                             int(x.split()[1]) > stop_epoch][0]
                print("%s, trial %d (%s): stopped between iterations; %d item(s) of epoch %d "
                      "after the takeover, then %s" % (ctx, trial, kind, len(old), stop_epoch,
                                                      first_new), flush=True)
                bt.check(len(old) <= bound and int(held[-1].split()[2]) + 1 + len(old) == 25 and
                         first_new == "batch %d 0" % (stop_epoch + 1),
                         "%s, trial %d (persistent DataLoader), stopped between iterations: "
                         "the stopped iteration ends with its own items (at most %d after "
                         "the takeover) and the next one starts its epoch anew with a claim "
                         "of its own" % (ctx, trial, bound), (held[-3:], lines[before:][:5]))
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(60)
                continue
            after = [x for x in lines[before:] if x and x.startswith("batch")]
            err = [x for x in lines[before:] if x and x.startswith("error")][0]
            p.wait(60)
            lines = out.wait(lambda ls: ls and ls[-1] is None, 30, "end of output")
            stopped = sorted({x.split()[1] for x in lines[before:]
                              if x and x.startswith("worker-error") and
                              x.endswith("LeaseLostError")})
            print("%s, trial %d (%s): %d item(s) after the takeover; %s" % (
                ctx, trial, kind, len(after), err[:200]), flush=True)
            bt.check(len(after) <= bound and "LEASE_LOST" in err and p.returncode == 3,
                     "%s, trial %d (%s DataLoader): continued after the takeover, the trainer "
                     "printed %d item(s) (at most %d: %s) and stopped with LeaseLostError"
                     % (ctx, trial, kind, len(after), bound,
                        "the one its loop held" if kind != "torch" else
                        "torch's prefetch_factor x num_workers under way, and the one its loop "
                        "held"), (after, err[:600]))
            if kind == "torch":
                bt.check(stopped == ["0", "1"], "%s, trial %d: both DataLoader workers stopped "
                         "with LeaseLostError (worker 1 confirms worker 0's lease)" % (ctx, trial),
                         [x for x in lines[before:] if x and not x.startswith("batch")])


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=300)
