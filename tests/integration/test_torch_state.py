"""Checkpoints in Python (python/README.md, "Checkpoints"): Loader.state_dict() /
load_state_dict() in the torchdata StatefulDataLoader style, through torch.save/torch.load
and Accelerate's register_for_checkpointing protocol, and the job-level checkpoint.

A coordinator and two workers on loopback serve a float32 .npy dataset and a JSON Lines
stream. The reference is an uninterrupted run of the same rank (itself checked against
`batchwire plan` by test_python_binding.py).

* Round trips at random steps, shuffled, two ranks, across an epoch boundary: the state
  taken after step k, saved with torch.save and read back with torch.load(weights_only=True),
  restores exactly the batches that followed -- into a new Loader(resume=state), and with
  load_state_dict() into a loader that is elsewhere (ahead, or in another epoch); the bytes
  equal np.load's rows. A stream (iterable mode) round-trips the same way.
* Accelerate's protocol: an object with state_dict/load_state_dict, saved as
  accelerator.save_state does (torch.save of obj.state_dict()) and restored as load_state
  does (obj.load_state_dict(torch.load(...))).
* A state of another rank, or of another world size, is refused with MismatchError.
* The job-level checkpoint: after every rank commits at one step, batchwire.job_checkpoint()
  (from the coordinator) lists every rank's cursor, equal to job_checkpoint_from() of the
  ranks' state dicts; a rank that committed nothing is named in the refusal.
"""

import os
import random

import bwpy
import bwtest as bt

N = 157
B = 6
R = 2
SHAPE = (2, 3)


def test(tmpdir):
    import torch
    batchwire, root, arr, coord = bwpy.npy_cluster(tmpdir, N, SHAPE)
    bwpy.gen(root, "jsonl", "lines", 90, 8, 30, files=3)
    rng = random.Random(5)

    def opts(job, rank, **kw):
        o = dict(coordinator=coord.addr, job=job, dataset=bwpy.NPY,
                 batch_size=B, shuffle=True, seed=11, rank=rank, world_size=R, prefetch=3)
        o.update(kw)
        return o

    def take(lo, n):
        """The next n batches (crossing into the next epoch) as (epoch, step, indices, bytes)."""
        out = []
        while len(out) < n:
            b = lo.next_batch()
            if b is None:
                lo.next_epoch()
                continue
            data = b.numpy()
            data = data.tobytes() if not isinstance(data, list) else b"".join(data)
            out.append((b.epoch, b.step, b.indices.tolist(), data))
        return out

    # The uninterrupted reference: two epochs of each rank.
    ref = {}
    for rank in range(R):
        with batchwire.Loader(**opts("state-ref", rank)) as lo:
            per_epoch = len(lo)
            ref[rank] = take(lo, 2 * per_epoch)
    bt.check(all(d == arr[idx].tobytes() for rk in ref.values() for _e, _s, idx, d in rk),
             "reference: %d batches per rank, every batch np.load's rows" % len(ref[0]))

    path = os.path.join(tmpdir, "ckpt.pt")
    rounds = 0
    for rank in range(R):
        for trial in range(4):
            k = rng.randrange(1, 2 * per_epoch - 2)
            job = "state-%d-%d" % (rank, trial)
            with batchwire.Loader(**opts(job, rank)) as lo:
                before = take(lo, k)
                torch.save({"data": lo.state_dict(), "model": torch.zeros(2)}, path)
                after = take(lo, 2)
            sd = torch.load(path, weights_only=True)["data"]
            # A new loader from the saved state.
            with batchwire.Loader(**opts(job, rank, resume=sd)) as lo2:
                again = take(lo2, 2 * per_epoch - k)
            bt.check(before == ref[rank][:k] and after == ref[rank][k:k + 2] and
                     again == ref[rank][k:], "rank %d, state after step %d (epoch %d step %d, "
                     "torch.save/torch.load): a new Loader(resume=state) continues exactly "
                     "(%d batches)" % (rank, k, sd["epoch"], sd["step"], len(again)))
            # load_state_dict into a loader that is elsewhere (ahead, or an epoch later).
            with batchwire.Loader(**opts(job, rank, resume=sd)) as lo3:
                take(lo3, rng.randrange(1, per_epoch + 2))
                lo3.load_state_dict(sd)
                again = take(lo3, min(5, 2 * per_epoch - k))
            bt.check(again == ref[rank][k:k + 5], "rank %d: load_state_dict(state of step %d) "
                     "into a loader that had moved on restores the same batches" % (rank, k))
            rounds += 1
    bt.log("%d round trips at random steps" % rounds)

    # Accelerate's register_for_checkpointing protocol: state_dict / load_state_dict.
    with batchwire.Loader(**opts("state-acc", 0)) as lo:
        bt.check(callable(getattr(lo, "state_dict", None)) and
                 callable(getattr(lo, "load_state_dict", None)),
                 "a Loader has state_dict and load_state_dict (what register_for_checkpointing "
                 "asks of an object)")
        take(lo, 7)
        torch.save(lo.state_dict(), os.path.join(tmpdir, "custom_checkpoint_0.pkl"))
        take(lo, 4)
        lo.load_state_dict(torch.load(os.path.join(tmpdir, "custom_checkpoint_0.pkl")))
        bt.check(take(lo, 3) == ref[0][7:10], "saved as accelerator.save_state does and "
                 "loaded as load_state does: the loader continues after step 7")

        # Another rank's state, another world size: refused.
        with batchwire.Loader(**opts("state-acc", 1)) as other:
            take(other, 2)
            sd1 = other.state_dict()
        try:
            lo.load_state_dict(sd1)
            raise bt.TestFailure("rank 1's state was accepted by rank 0")
        except batchwire.MismatchError as e:
            bt.check("rank 1" in e.message, "rank 1's state into rank 0: MismatchError: %s"
                     % e.message[:120])
        sd_w = dict(lo.state_dict(), world_size=3)
        try:
            lo.load_state_dict(sd_w)
            raise bt.TestFailure("a state of world size 3 was accepted")
        except batchwire.MismatchError as e:
            bt.check("elastic" in e.message, "a state of another world size points to the "
                     "elastic resume: %s" % e.message[:140])

    # A stream (iterable mode, 3 sources): cursors carry byte offsets.
    sopts = dict(coordinator=coord.addr, dataset="jsonl:lines/*", batch_size=4, mode="iterable",
                 world_size=R, prefetch=2)
    with batchwire.Loader(job="state-stream-ref", rank=1, **sopts) as lo:
        sref = take(lo, len(lo))
    k = 5
    with batchwire.Loader(job="state-stream", rank=1, **sopts) as lo:
        take(lo, k)
        torch.save(lo.state_dict(), path)
        take(lo, 3)
        lo.load_state_dict(torch.load(path))
        rest = take(lo, len(sref) - k)
    with batchwire.Loader(job="state-stream", rank=1, resume=torch.load(path), **sopts) as lo:
        rest2 = take(lo, len(sref) - k)
    bt.check(rest == sref[k:] and rest2 == sref[k:], "a stream's state after step %d restores "
             "the same records (load_state_dict and resume=): %d batches" % (k, len(rest)))

    # The job-level checkpoint: every rank commits at one step.
    states = []
    loaders = [batchwire.Loader(**opts("state-job", rank)) for rank in range(R)]
    try:
        take(loaders[0], 4)
        loaders[0].commit()
        try:
            batchwire.job_checkpoint(coordinator=coord.addr, job="state-job")
            raise bt.TestFailure("a job checkpoint with rank 1 uncommitted was given")
        except batchwire.FailedPreconditionError as e:
            bt.check("rank 1" in e.message, "job_checkpoint() before rank 1 committed names it: "
                     "%s" % e.message[:120])
        take(loaders[1], 4)
        loaders[1].commit()
        states = [lo.state_dict() for lo in loaders]
    finally:
        for lo in loaders:
            lo.close()
    ck = batchwire.job_checkpoint(coordinator=coord.addr, job="state-job")
    bt.check(ck["world_size"] == R and len(ck["cursors"]) == R and
             ck == batchwire.job_checkpoint_from(list(reversed(states))),
             "job_checkpoint() from the coordinator = job_checkpoint_from(the ranks' states): "
             "%d cursors of world size %d" % (len(ck["cursors"]), ck["world_size"]))
    torch.save(ck, path)
    bt.check(torch.load(path, weights_only=True) == ck, "the job checkpoint survives "
             "torch.save/torch.load(weights_only=True)")


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=240)
