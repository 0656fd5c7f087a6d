"""Accelerate's configurations, live (docs/semantics.md, "accelerate"; python/README.md,
"Accelerate's configurations"), against the semantics re-derived from Accelerate's
data_loader.py and written down in docs/semantics.md. Accelerate itself is not installed:
its references here are PyTorch's own BatchSampler (Debian's python3-torch) and the
procedures of DataLoaderDispatcher and gather_for_metrics as documented, simulated on lists.

A coordinator and two workers on loopback serve a float32 .npy dataset; ranks are Loaders
in threads of this process.

* even_batches=False with unequal counts: refused unless allow_uneven=True (Python) or
  --allow-uneven (CLI); then each rank's epoch_steps() is its own count, known before its
  first batch, and its batches equal `batchwire plan --no-even-batches`.
* One process: accelerate mode yields what prepare_data_loader yields for one process, the
  plain BatchSampler(sampler, B, drop_last) over the same order (a short last batch); with
  pad_single_process=True, BatchSamplerShard's padded last batch.
* dispatch_batches=True: every rank's batches, the last one included, equal the
  DataLoaderDispatcher procedure (R base batches concatenated, or one with split_batches, and
  sliced; a short last global batch sliced with the epoch's first samples appended), for
  several (n, B, R, split_batches, drop_last); bytes equal np.load's rows.
* gather_for_metrics: concatenating every rank's batch per step and cutting the last step to
  Accelerate's remainder gives the same samples, in the same order, as gathering each rank's
  real samples (padding mask) -- each sample of the dataset exactly once -- with and without
  dispatch_batches.
"""

import bwpy
import bwtest as bt

N = 101
SHAPE = (2,)


def run_ranks(batchwire, world, **opts):
    """Every rank's epoch in threads: {rank: (epoch_steps, [(step, indices, padding, bytes)])}."""
    def one(rank):
        with batchwire.Loader(rank=rank, world_size=world, **opts) as lo:
            return lo.epoch_steps(), [(b.step, b.indices.tolist(), b.padding.tolist(),
                                       b.numpy().tobytes()) for b in lo]

    return bwpy.in_threads(one, range(world))


def dispatcher(order, B, R, split, drop_last):
    """DataLoaderDispatcher as docs/semantics.md describes it: each step takes R base batches
    of BatchSampler(order, B, drop_last) concatenated (one with split_batches) and gives rank r
    the r-th slice of len // R; when the last global batch does not divide by R, the first R
    samples of the epoch's first global batch are appended (as padding) and the slices grow by
    one. Returns {rank: [(indices, padding)]}."""
    from torch.utils.data import BatchSampler
    base = [list(b) for b in BatchSampler(order, B, drop_last)]
    out = {r: [] for r in range(R)}
    first = None
    i = 0
    while i < len(base):
        take = 1 if split else R
        if drop_last and i + take > len(base):
            break
        batch = [x for b in base[i:i + take] for x in b]
        i += take
        pad = [False] * len(batch)
        if first is None:
            first = batch[:R]
        bs = len(batch) // R
        if not drop_last and i >= len(base) and len(batch) % R:
            batch, pad, bs = batch + first, pad + [True] * len(first), bs + 1
        for r in range(R):
            out[r].append((batch[r * bs:(r + 1) * bs], pad[r * bs:(r + 1) * bs]))
    return out


def test(tmpdir):
    import torch
    from torch.utils.data import BatchSampler
    batchwire, _root, arr, coord = bwpy.npy_cluster(tmpdir, N, SHAPE)

    def opts(job, **kw):
        o = dict(coordinator=coord.addr, job=job, dataset=bwpy.NPY, mode="accelerate",
                 prefetch=2)
        o.update(kw)
        return o

    def order(seed, shuffle):
        if not shuffle:
            return list(range(N))
        return torch.randperm(N, generator=torch.Generator().manual_seed(seed)).tolist()

    # --- even_batches=False: refused unless asked for.
    B, R = 4, 3
    try:
        run_ranks(batchwire, R, **opts("uneven-refused", batch_size=B, even_batches=False))
        raise bt.TestFailure("a job with unequal batch counts was created without allow_uneven")
    except batchwire.InvalidArgumentError as e:
        bt.check("allow_uneven" in e.message, "even_batches=False with unequal counts is "
                 "refused, naming allow_uneven: %s" % e.message[:160])
    got = run_ranks(batchwire, R, **opts("uneven", batch_size=B, even_batches=False,
                                         allow_uneven=True))
    plan = bwpy.plan("--mode", "accelerate", "--num-samples", N, "--world-size", R,
                     "--batch-size", B, "--no-even-batches")
    counts = [got[r][0] for r in range(R)]
    bt.check(len(set(counts)) > 1 and all(
        got[r][0] == len(plan[r]) and [(s, i, [bool(x) for x in p]) for s, i, p, _ in got[r][1]]
        == [(p["step"], p["indices"], [bool(x) for x in p["padding"]]) for p in plan[r]]
        for r in range(R)), "allow_uneven=True: ranks get %r batches, each rank's "
        "epoch_steps() known up front, batches = batchwire plan --no-even-batches" % counts)
    r = bt.cli("fetch", "--coordinator", coord.addr, "--job", "uneven-cli", "--dataset", bwpy.NPY,
               "--mode", "accelerate", "--batch-size", B, "--no-even-batches", "--rank", 2,
               "--world-size", R, "--quiet")
    bt.check(r.returncode == 1 and "allow_uneven" in r.stderr,
             "batchwire fetch --no-even-batches without --allow-uneven is refused", r.stderr)
    r = bt.cli("fetch", "--coordinator", coord.addr, "--job", "uneven-cli", "--dataset", bwpy.NPY,
               "--mode", "accelerate", "--batch-size", B, "--no-even-batches", "--rank", 2,
               "--world-size", R, "--allow-uneven", "--quiet")
    bt.check(r.returncode == 0 and '"batches":%d' % len(plan[2]) in r.stdout,
             "batchwire fetch --allow-uneven: rank 2 gets its %d batches" % len(plan[2]),
             r.stdout + r.stderr)

    # --- One process: prepare_data_loader's plain BatchSampler, or the padding on request.
    for B1, shuffle, drop_last in ((7, True, False), (10, False, False), (7, True, True)):
        o = order(5, shuffle)
        want = [list(b) for b in BatchSampler(o, B1, drop_last)]
        got = run_ranks(batchwire, 1, **opts("one-%d-%d-%d" % (B1, shuffle, drop_last),
                                             batch_size=B1, shuffle=shuffle, seed=5,
                                             drop_last=drop_last))[0][1]
        bt.check([g[1] for g in got] == want and not any(any(g[2]) for g in got) and
                 all(g[3] == arr[g[1]].tobytes() for g in got),
                 "one process (B=%d, shuffle=%s, drop_last=%s): the plain BatchSampler's %d "
                 "batches, last one of %d" % (B1, shuffle, drop_last, len(want),
                                              len(want[-1])))
    got = run_ranks(batchwire, 1, **opts("one-pad", batch_size=7, pad_single_process=True))[0][1]
    last = got[-1]
    bt.check(last[1] == [98, 99, 100, 0, 1, 2, 3] and last[2] == [False] * 3 + [True] * 4,
             "pad_single_process=True: BatchSamplerShard's last batch [98, 99, 100] + padding "
             "[0, 1, 2, 3]")

    # --- dispatch_batches=True: the DataLoaderDispatcher procedure.
    cases = [(4, 3, False, False, False), (4, 2, False, False, True), (6, 3, True, False, True),
             (5, 4, False, True, True), (9, 3, True, True, False), (8, 4, False, False, False)]
    for B2, R2, split, drop_last, shuffle in cases:
        label = "B=%d R=%d split=%s drop_last=%s" % (B2, R2, split, drop_last)
        want = dispatcher(order(3, shuffle), B2, R2, split, drop_last)
        got = run_ranks(batchwire, R2, **opts("disp-%d-%d-%d-%d" % (B2, R2, split, drop_last),
                                              batch_size=B2, split_batches=split,
                                              drop_last=drop_last, dispatch_batches=True,
                                              shuffle=shuffle, seed=3))
        same = all([(g[1], g[2]) for g in got[r][1]] == want[r] for r in range(R2))
        bt.check(same and all(g[3] == arr[g[1]].tobytes() for r in got for g in got[r][1]),
                 "dispatch_batches, %s: every rank's %d batches = DataLoaderDispatcher's, last "
                 "batch %r" % (label, len(want[0]), [want[r][-1][0] for r in range(R2)]),
                 ({r: [x[1] for x in got[r][1]][-2:] for r in got},
                  {r: [x[0] for x in want[r]][-2:] for r in want}))

    # --- gather_for_metrics.
    for B3, R3, extra in ((4, 3, {}), (5, 2, {"split_batches": True, "batch_size": 6}),
                          (4, 3, {"dispatch_batches": True})):
        kw = dict(batch_size=B3, shuffle=True, seed=8)
        kw.update(extra)
        got = run_ranks(batchwire, R3, **opts("gather-%d-%d-%d" % (B3, R3, len(extra)), **kw))
        steps = len(got[0][1])
        rows = arr.itemsize * SHAPE[0]
        # Accelerate: gather concatenates the ranks' batches; at the end of the dataloader it
        # keeps the first `remainder` samples, remainder being n % total_batch_size
        # (DataLoaderShard) or the size of the last global batch (DataLoaderDispatcher).
        total = kw["batch_size"] if kw.get("split_batches") else kw["batch_size"] * R3
        acc = []
        for s in range(steps):
            gathered = [(i, g[3][j * rows:(j + 1) * rows]) for r in range(R3)
                        for g in [got[r][1][s]] for j, i in enumerate(g[1])]
            if s == steps - 1:
                rem = (sum(len(got[r][1][s][1]) - sum(got[r][1][s][2]) for r in range(R3))
                       if kw.get("dispatch_batches") else N % total)
                if rem > 0:
                    gathered = gathered[:rem]
            acc += gathered
        masked = [(i, g[3][j * rows:(j + 1) * rows]) for s in range(steps) for r in range(R3)
                  for g in [got[r][1][s]] for j, i in enumerate(g[1]) if not g[2][j]]
        want_order = order(8, True)
        bt.check(acc == masked and [i for i, _ in masked] == want_order and
                 all(d == arr[i].tobytes() for i, d in masked),
                 "gather_for_metrics (%s): the padding-masked gather equals it, each of the %d "
                 "samples once, in the epoch's order" % (
                     ", ".join("%s=%s" % kv for kv in sorted(kw.items())), N))


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=300)
