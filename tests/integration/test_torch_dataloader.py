"""batchwire.torch (python/README.md, "batchwire.torch"): a rank's batches or samples under
PyTorch's own DataLoader with worker processes.

A coordinator and two workers on loopback serve a float32 .npy dataset and a JSON Lines
dataset; two ranks, shuffled, torch mode.

* torch.utils.data.DataLoader(BatchDataset(...), batch_size=None, num_workers=2,
  pin_memory=True), two epochs via set_epoch: each rank's items are `batchwire plan`'s batches
  in plan order (indices, padding), data equal to np.load's rows -- the two DataLoader
  workers read disjoint shares (the rank's lease is worker 0's; no AlreadyExistsError) and
  the DataLoader restores the order. Also with num_workers=3 and with none.
* batchwire.torch.DataLoader walks the epochs by itself; its state_dict() after k batches,
  through torch.save/torch.load, restores the rest of the epoch in a new DataLoader (also with
  workers), and the next epoch after it.
* samples=True with a transform run in decode threads and DataLoader(batch_size=B,
  num_workers=2): the plan's batches, each sample transformed, order kept.
* A JSON Lines dataset with a decoding transform and collate_fn: each batch's decoded records.
* A Loader opened in the main process and used in a forked DataLoader worker fails with a
  clear error (pointing to BatchDataset) instead of touching the parent's loader; workers
  forked while the parent has a Loader open are refused clearly (the network runtime cannot
  be used in a forked child), and work from a forkserver.
"""

import json
import os
import py_compile

import bwdata
import bwpy
import bwtest as bt

N = 93
B = 5
R = 2
SHAPE = (3, 2)


# Transforms are module functions, not lambdas, so that DataLoader workers started by a
# forkserver (the sanitizer build, below) can unpickle them.
def double_plus_one(t):
    return t * 2 + 1


def record_index(raw):
    return json.loads(raw)["index"]


def test(tmpdir):
    import multiprocessing

    import torch
    from torch.utils.data import DataLoader
    # A plain fork of this multi-threaded process under AddressSanitizer can deadlock the child
    # inside the ASan runtime before Python runs (fresh-clone CI runs hung here twice): in the
    # sanitizer build every DataLoader's workers come from a forkserver; the plain build forks.
    forks = "address" not in bwpy.sanitize_flags()
    if not forks:
        multiprocessing.set_start_method("forkserver", force=True)
        bt.log("sanitizer build: DataLoader workers start from a forkserver")
    batchwire, root, arr, coord = bwpy.npy_cluster(tmpdir, N, SHAPE)
    import batchwire.torch as bwt
    bwpy.gen(root, "jsonl", "lines", 23, 4, 20)

    def ds(job, rank, **kw):
        o = dict(coordinator=coord.addr, job=job, dataset=bwpy.NPY, batch_size=B, shuffle=True,
                 seed=21, rank=rank, world_size=R, prefetch=2)
        o.update(kw)
        return bwt.BatchDataset(**o)

    plans = {e: bwpy.plan("--mode", "torch", "--num-samples", N, "--world-size", R,
                          "--batch-size", B, "--shuffle", "--seed", 21, "--epoch", e)
             for e in range(2)}

    def want(rank, epoch, from_step=0):
        return [(epoch, p["step"], p["indices"], [bool(x) for x in p["padding"]])
                for p in plans[epoch][rank][from_step:]]

    def items(loader):
        out, bad = [], []
        for it in loader:
            idx = it["indices"].tolist()
            out.append((it["epoch"], it["step"], idx, it["padding"].tolist()))
            if it["data"].numpy().tobytes() != arr[idx].tobytes():
                bad.append(it["step"])
        return out, bad

    # --- torch's own DataLoader with workers.
    for workers in (2, 3, 0):
        for rank in range(R):
            d = ds("dl-%d" % workers, rank)
            dl = DataLoader(d, batch_size=None, num_workers=workers, pin_memory=True)
            for epoch in range(2):
                d.set_epoch(epoch)
                got, bad = items(dl)
                bt.check(got == want(rank, epoch) and not bad,
                         "DataLoader(num_workers=%d, pin_memory=True), rank %d, epoch %d: the "
                         "plan's %d batches in order, bytes = np.load's rows"
                         % (workers, rank, epoch, len(got)), (got[:3], want(rank, epoch)[:3]))

    # --- batchwire.torch.DataLoader: epochs and state.
    d = ds("state", 1)
    dl = bwt.DataLoader(d, num_workers=2)
    got0, _ = items(dl)
    got1, _ = items(dl)
    bt.check(got0 == want(1, 0) and got1 == want(1, 1), "batchwire.torch.DataLoader walks "
             "epoch 0 then epoch 1 by itself (set_epoch)")
    path = os.path.join(tmpdir, "dl.pt")
    for workers, k in ((2, 7), (0, 3), (3, len(plans[0][1]) - 1)):
        d = ds("state-%d" % workers, 1)
        dl = bwt.DataLoader(d, num_workers=workers)
        it = iter(dl)
        first = [next(it)["step"] for _ in range(k)]
        torch.save(dl.state_dict(), path)
        del it
        sd = torch.load(path, weights_only=True)
        d2 = ds("state-%d" % workers, 1)
        dl2 = bwt.DataLoader(d2, num_workers=workers)
        dl2.load_state_dict(sd)
        rest, bad = items(dl2)
        nxt, _ = items(dl2)
        bt.check(first == list(range(k)) and sd["epoch"] == 0 and sd["step"] == k and
                 rest == want(1, 0, k) and nxt == want(1, 1) and not bad,
                 "state_dict() after %d batches (workers=%d), torch.save/torch.load: a new "
                 "DataLoader continues with step %d and then runs epoch 1" % (k, workers, k))

    # --- samples, a transform in decode threads, the DataLoader's own batching.
    d = ds("samples", 0, samples=True, transform=double_plus_one, decode_threads=3)
    dl = DataLoader(d, batch_size=B, num_workers=2)
    got = [b for b in dl]
    plan0 = plans[0][0]
    same = len(got) == len(plan0) and all(
        torch.equal(g, torch.from_numpy(arr[p["indices"]]) * 2 + 1) or
        g.numpy().tobytes() == (torch.from_numpy(arr[p["indices"]]) * 2 + 1).numpy().tobytes()
        for g, p in zip(got, plan0))
    bt.check(same, "samples=True, transform in 3 decode threads, DataLoader(batch_size=%d, "
             "num_workers=2): the plan's %d batches of transformed samples, in order"
             % (B, len(plan0)))

    # --- another format: decoded records.
    d = bwt.BatchDataset(coordinator=coord.addr, job="lines", dataset="jsonl:lines/*",
                         batch_size=4, rank=0, world_size=1,
                         transform=record_index, collate_fn=list)
    got = [(it["indices"].tolist(), it["data"]) for it in DataLoader(d, batch_size=None,
                                                                    num_workers=2)]
    ok = [bwdata.expected_sample("jsonl", i, 4, 20)[0] for i in range(23)]
    bt.check(len(got) == 6 and all(idx == data for idx, data in got) and
             all(json.loads(ok[i])["index"] == i for i in range(23)),
             "a JSON Lines dataset, transform=json.loads, collate_fn=list: every batch's "
             "decoded records in plan order")

    # --- a Loader used in a forked worker: a clear error.
    class Wrapped(torch.utils.data.IterableDataset):
        def __init__(self, lo):
            self.lo = lo

        def __iter__(self):
            yield self.lo.next_batch()

    # The plain-fork checks run in the plain build (see above); the forkserver case in both.
    # Every DataLoader here has a timeout: a hung worker is an error, not a hang.
    def refused(loader_args, what, *needles):
        """Runs a DataLoader that must fail; checks its error names `needles`."""
        try:
            list(DataLoader(*loader_args[0], **loader_args[1]))
        except Exception as e:  # the worker's exception, re-raised by the DataLoader
            msg = str(e).strip().splitlines()[-1] if str(e).strip() else repr(e)
            bt.check(all(n in str(e) for n in needles), "%s: %s" % (what, msg[:160]), str(e))
            return
        raise bt.TestFailure("%s: the DataLoader ran" % what)

    with batchwire.Loader(coordinator=coord.addr, job="wrapped", dataset=bwpy.NPY,
                          batch_size=B, rank=0, world_size=1) as lo:
        if forks:
            refused(((Wrapped(lo),), dict(batch_size=None, num_workers=1, timeout=60)),
                    "a Loader used in a DataLoader worker fails clearly", "BatchDataset",
                    "process")
        bt.check(lo.next_batch() is not None, "and the parent's loader still works")
        # Workers forked while this loader is open cannot use the network runtime: refused
        # clearly; forked from a clean forkserver they work.
        if forks:
            refused(((ds("forked", 0),), dict(batch_size=None, num_workers=2, timeout=60)),
                    "workers forked while the parent has a Loader open are refused clearly",
                    "forkserver", "forked")
        got, bad = items(DataLoader(ds("forkserver", 0), batch_size=None, num_workers=2,
                                    multiprocessing_context="forkserver", timeout=120))
        bt.check(got == want(0, 0) and not bad, "multiprocessing_context='forkserver' with the "
                 "parent's Loader open: the plan's batches")

    # The Accelerate example (accelerate is not installed here): it compiles.
    py_compile.compile(os.path.join(bt.SOURCE_DIR, "examples", "accelerate_train.py"),
                       cfile=os.path.join(tmpdir, "example.pyc"), doraise=True)
    bt.ok("examples/accelerate_train.py compiles")


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=300)
