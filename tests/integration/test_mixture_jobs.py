"""Mixture jobs end to end (docs/semantics.md, "Mixtures"; docs/client.md, "Mixtures"): a
coordinator and three workers on loopback serve three sources of different formats and sizes --
a float32 .npy of 97 samples, TFRecord records (61, two files) and JSON Lines (43) from
`batchwire gen` -- and `batchwire fetch --mix FORMAT:PATHS=WEIGHT ...` reads them as one job.

* plan = fetch: at 4 ranks, torch mode, two epochs, every rank's batches (indices within the
  source, sources, padding) equal `batchwire plan --mix-size N=WEIGHT ...` with the sources'
  sizes; every batch's sha256 is that of its samples' bytes, each read from its own source
  (np.load's rows; tests/integration/bwdata.py's generator bytes); per epoch each source
  gives exactly its c_j samples (largest remainder of w_j * E);
* accelerate mode with --mix-samples E below the sum (a down-sampled epoch) and two sources,
  one rank: equal to the plan, and the second epoch shows the down-sampled source's samples
  not shown in the first;
* resume at a random step: a rank stopped after K steps (--cursor-out) and resumed from its
  cursor (--resume) delivers exactly the plan's steps K..;
* elastic 4 -> 3 (torch) and 2 -> 5 (accelerate): the old ranks run K1 steps (random), are
  resumed from their cursors for K - K1 more (K random) and write their cursors; the new ranks resume from them (--resume-elastic): their batches equal
  `batchwire plan --resume-from-world R0 --resume-from-step K --world-size R1 --mix-size ...`,
  and over both worlds every planned (source, index) of the epoch is delivered exactly once,
  with the right per-source counts;
* a worker SIGKILLed between a rank's stop and its resume: the resumed rank's batches are
  still the plan's, bytes equal, after it routed around the dead worker (a failover);
* the Python Loader(mixture=[...]) reads the plan's batches, batch.sources a numpy array;
  batchwire.torch.BatchDataset(mixture=...) under DataLoader(num_workers=2) too, with
  item["sources"];
* the coordinator's GetOrCreateJob over a mixture describes it (format mixture, length E, each
  source's size and description; another source order is another fingerprint) and refuses,
  naming the field, whatever the client sends: no source, 257, a weight of 0 or above 10^18, a
  source without a format or pre-sharded, an unknown policy, dataset beside mixture, shuffle,
  the stop policy without a stream, a source no worker can describe, a source of named arrays
  (.npz) (stream sources: test_mixture_streams.py);
* refused by the loader: a mixture with --shuffle; the same job name with other weights (the mixture is
  part of the job's configuration); a weight that is not a positive decimal.
"""

import hashlib
import json
import os
import random
from collections import Counter

import bwdata
import bwpy
import bwtest as bt
import jobs_rpc as jr

SIZES = [97, 61, 43]
WEIGHTS = ["0.5", "0.3", "0.2"]
TF = (10, 40)  # tfrecord sample sizes, bytes
JL = (5, 30)  # jsonl
SPECS = ["npy:a/part-00000.npy", "tfrecord:b/*.tfrecord", "jsonl:c/*.jsonl"]
B = 4


def mix_args(specs=SPECS, weights=WEIGHTS):
    out = []
    for s, w in zip(specs, weights):
        out += ["--mix", "%s=%s" % (s, w)]
    return out


def plan_args(sizes=SIZES, weights=WEIGHTS):
    out = []
    for n, w in zip(sizes, weights):
        out += ["--mix-size", "%d=%s" % (n, w)]
    return out


def test(tmpdir):
    batchwire = bwpy.import_batchwire()
    root = os.path.join(tmpdir, "data")
    os.makedirs(root)
    arr = bwpy.gen_npy(root, "a", SIZES[0], (3,))
    bwpy.gen(root, "tfrecord", "b", SIZES[1], TF[0], TF[1], files=2)
    bwpy.gen(root, "jsonl", "c", SIZES[2], JL[0], JL[1])
    r = bt.cli("gen", "--format", "npz", "--out", os.path.join(root, "z"), "--num-samples", 9,
               "--fields", "x:float32:3", "y:int64")
    bt.check(r.returncode == 0, "gen an .npz of two named arrays", r.stderr)
    coord, workers = bwpy.cluster(tmpdir, root, 3)

    def sample(src, i):
        if src == 0:
            return arr[i].tobytes()
        fmt, (lo, hi) = ("tfrecord", TF) if src == 1 else ("jsonl", JL)
        return bwdata.expected_sample(fmt, i, lo, hi)[0]

    def batch_sha(b):
        return hashlib.sha256(b"".join(sample(s, i) for s, i in
                                       zip(b["sources"], b["indices"]))).hexdigest()

    def fetch(job, rank, world, *extra, mode="torch", specs=SPECS, weights=WEIGHTS, ok=True):
        return bwpy.fetch_mix(coord.addr, job, rank, world, mix_args(specs, weights), *extra,
                              mode=mode, batch=B, seed=5, ok=ok)

    def view(batches):
        return [(b["step"], b["indices"], b["sources"], b["padding"]) for b in batches]

    def check_bytes(label, batches):
        bad = [(b["epoch"], b["step"]) for b in batches if b["sha256"] != batch_sha(b)]
        bt.check(not bad, "%s: every batch's sha256 is that of its samples, each read from its "
                 "own source (%d batches)" % (label, len(batches)), bad[:5])

    # --- plan = fetch, 4 ranks, torch, two epochs.
    E = sum(SIZES)
    allb = []
    for rank in range(4):
        got = fetch("mix4", rank, 4, "--epochs", 2)
        allb += got
        for epoch in range(2):
            want = bwpy.plan("--mode", "torch", *plan_args(), "--world-size", 4,
                             "--batch-size", B, "--seed", 5, "--epoch", epoch)[rank]
            mine = [b for b in got if b["epoch"] == epoch]
            bt.check(view(mine) == [(p["step"], p["indices"], p["sources"], p["padding"])
                                    for p in want],
                     "rank %d/4 epoch %d: %d batches = batchwire plan --mix-size (sources and "
                     "indices)" % (rank, epoch, len(want)), (view(mine)[:1], want[:1]))
    check_bytes("4 ranks, torch, 2 epochs", allb)
    for epoch in range(2):
        c = Counter(s for b in allb if b["epoch"] == epoch
                    for s, p in zip(b["sources"], b["padding"]) if not p)
        bt.check([c[j] for j in range(3)] == [101, 60, 40] and sum(c.values()) == E,
                 "epoch %d: the sources give c_j = 101, 60, 40 samples of E = %d (0.5/0.3/0.2 "
                 "of 201: 100.5, 60.3, 40.2, the largest remainder rounded up)" % (epoch, E), c)

    # --- accelerate, E below the sum, two sources, one rank, two epochs.
    specs2, w2 = SPECS[:2], ["3", "1"]
    got = fetch("mixacc", 0, 1, "--epochs", 2, "--mix-samples", 80, mode="accelerate",
                specs=specs2, weights=w2)
    for epoch in range(2):
        want = bwpy.plan("--mode", "accelerate", *plan_args(SIZES[:2], w2), "--mix-samples", 80,
                         "--world-size", 1, "--batch-size", B, "--seed", 5, "--epoch", epoch)[0]
        bt.check(view([b for b in got if b["epoch"] == epoch]) ==
                 [(p["step"], p["indices"], p["sources"], p["padding"]) for p in want],
                 "accelerate, --mix-samples 80, epoch %d: = batchwire plan" % epoch)
    check_bytes("accelerate, --mix-samples 80", got)
    # one rank: batch order is the epoch's position order
    order = [[i for b in got if b["epoch"] == e for s, i in zip(b["sources"], b["indices"])
              if s == 0] for e in range(2)]
    bt.check(len(order[0]) == 60 == len(set(order[0])) and len(order[1]) == 60 and
             set(order[1][:37]) == set(range(97)) - set(order[0]),
             "the down-sampled source (60 of its 97 per epoch): epoch 0 shows 60 different "
             "samples, epoch 1 first the 37 others, then its next pass",
             (len(order[0]), len(set(order[0])), len(set(order[1][:37]) & set(order[0]))))

    # --- resume at a random step.
    rng = random.Random(27)
    full = bwpy.plan("--mode", "torch", *plan_args(), "--world-size", 4, "--batch-size", B,
                     "--seed", 5, "--epoch", 0)
    for rank in (1, 3):
        k = rng.randrange(1, len(full[rank]))
        cfile = os.path.join(tmpdir, "res-%d.cursor" % rank)
        first = fetch("mixres", rank, 4, "--max-steps", k, "--cursor-out", cfile)
        with open(cfile) as f:
            cur = f.read().strip()
        rest = fetch("mixres", rank, 4, "--resume", cur)
        bt.check(view(first + rest) == [(p["step"], p["indices"], p["sources"], p["padding"])
                                        for p in full[rank]],
                 "rank %d/4 stopped after %d steps and resumed from its cursor: steps 0..%d = "
                 "the plan" % (rank, k, len(full[rank]) - 1))

    # --- elastic 4 -> 3 (and 2 -> 5).
    def elastic(job, r0, r1, mode):
        fullp = bwpy.plan("--mode", mode, *plan_args(), "--world-size", r0, "--batch-size", B,
                          "--seed", 5, "--epoch", 0)
        K = rng.randrange(2, len(fullp[0]))
        K1 = rng.randrange(1, K)
        old, cursors = [], []
        for rank in range(r0):
            # K1 steps, a resume from that cursor for K - K1 more, then the elastic resume
            c1 = os.path.join(tmpdir, "%s-%d.first.cursor" % (job, rank))
            cfile = os.path.join(tmpdir, "%s-%d.cursor" % (job, rank))
            legs = fetch(job, rank, r0, "--max-steps", K1, "--cursor-out", c1, mode=mode)
            with open(c1) as f:
                legs += fetch(job, rank, r0, "--resume", f.read().strip(), "--max-steps", K - K1,
                              "--cursor-out", cfile, mode=mode)
            bt.check(view(legs) == [(p["step"], p["indices"], p["sources"], p["padding"])
                                    for p in fullp[rank][:K]],
                     "%d -> %d (%s): rank %d stopped after %d steps, resumed from its cursor for "
                     "%d more: steps 0..%d = the plan" % (r0, r1, mode, rank, K1, K - K1, K - 1))
            old += legs
            with open(cfile) as f:
                cursors.append(f.read())
        ck = os.path.join(tmpdir, "%s.ckpt" % job)
        with open(ck, "w") as f:
            f.write("".join(cursors))
        new = [fetch(job, rank, r1, "--resume-elastic", ck, mode=mode) for rank in range(r1)]
        plan1 = bwpy.plan("--mode", mode, *plan_args(), "--world-size", r1, "--batch-size", B,
                          "--seed", 5, "--resume-from-world", r0, "--resume-from-step", K)
        label = "elastic %d -> %d (%s) at step %d (resumed at %d first)" % (r0, r1, mode, K, K1)
        for rank in range(r1):
            bt.check(view(new[rank]) == [(p["step"], p["indices"], p["sources"], p["padding"])
                                         for p in plan1[rank]],
                     "%s: new rank %d's batches = batchwire plan --resume-from-world %d "
                     "--mix-size ..." % (label, rank, r0))
        both = old + [b for v in new for b in v]
        check_bytes(label, both)
        delivered = Counter((s, i) for b in both
                            for s, i, p in zip(b["sources"], b["indices"], b["padding"]) if not p)
        planned = Counter((s, i) for v in fullp.values() for p in v
                          for s, i, pd in zip(p["sources"], p["indices"], p["padding"]) if not pd)
        bt.check(delivered == planned,
                 "%s: every planned sample of the epoch delivered exactly once over both worlds: "
                 "the (source, index) multiset equals the plan's at %d ranks (%d samples; source "
                 "0, up-sampled to 101 of 97, repeats 4)" % (label, r0, sum(delivered.values())),
                 (delivered - planned, planned - delivered))
        bt.check([sum(c for (s, _i), c in delivered.items() if s == j) for j in range(3)] ==
                 [101, 60, 40], "%s: per-source counts 101, 60, 40" % label)

    elastic("mixel", 4, 3, "torch")
    elastic("mixel25", 2, 5, "accelerate")

    # --- Python.
    want = bwpy.plan("--mode", "torch", *plan_args(), "--world-size", 2, "--batch-size", B,
                     "--seed", 5, "--epoch", 0)[1]
    with batchwire.Loader(coordinator=coord.addr, job="mixpy", rank=1, world_size=2,
                          batch_size=B, seed=5, job_epochs=1,
                          mixture=[(s, float(w)) for s, w in zip(SPECS, WEIGHTS)]) as lo:
        got = [(b.step, b.indices.tolist(), b.sources.tolist(), b.padding.tolist(),
                bytes(b.memoryview())) for b in lo]
    bt.check([g[:3] for g in got] == [(p["step"], p["indices"], p["sources"]) for p in want],
             "Python Loader(mixture=[...]): rank 1/2's %d batches = the plan, batch.sources "
             "included" % len(want))
    bad = [g[0] for g in got if g[4] != b"".join(sample(s, i) for s, i in zip(g[2], g[1]))]
    bt.check(not bad, "Python: every batch's bytes are its samples' from their sources", bad)

    # --- The loader moves while a thread plans the mixture's order ahead of its fetches
    # (docs/client.md, "Planning ahead"): a seek back and forward, epochs set out of order and
    # in order, each batch after a move the plan's, never one planned for the old position.
    plans = {e: bwpy.plan("--mode", "torch", *plan_args(), "--world-size", 1, "--batch-size",
                          B, "--seed", 5, "--epoch", e)[0] for e in range(4)}

    # BATCHWIRE_PLAN_AHEAD=on: the planner runs here even on a machine of fewer than 4 CPUs
    # (where "auto" leaves it off); a value that is none of auto, on, off is refused.
    os.environ["BATCHWIRE_PLAN_AHEAD"] = "sometimes"
    try:
        batchwire.Loader(coordinator=coord.addr, job="mixmove", rank=0, world_size=1,
                         batch_size=B, seed=5,
                         mixture=[(s, float(w)) for s, w in zip(SPECS, WEIGHTS)]).close()
        refused = None
    except batchwire.InvalidArgumentError as e:
        refused = str(e)
    bt.check(refused and "BATCHWIRE_PLAN_AHEAD is 'sometimes': expected auto, on or off" in
             refused, "BATCHWIRE_PLAN_AHEAD=sometimes is refused, saying what it expects",
             refused)
    os.environ["BATCHWIRE_PLAN_AHEAD"] = "on"
    with batchwire.Loader(coordinator=coord.addr, job="mixmove", rank=0, world_size=1,
                          batch_size=B, seed=5, prefetch=8,
                          mixture=[(s, float(w)) for s, w in zip(SPECS, WEIGHTS)]) as lo:
        moves, bad = 0, []
        it = iter(lo)
        first = [next(it).step for _ in range(3)]
        saved = lo.state_dict()  # after step 2
        for _ in range(9):
            next(it)
        lo.load_state_dict(saved)  # back: steps 3.. again
        for label, e, start, n in (("seek back", 0, 3, 12), ("set_epoch(2)", 2, 0, 20),
                                   ("set_epoch(1)", 1, 0, 7), ("next_epoch", 2, 0, 30),
                                   ("set_epoch(3)", 3, 0, len(plans[3]))):
            if label.startswith("set_epoch"):
                lo.set_epoch(e)
            elif label == "next_epoch":
                lo.next_epoch()
            got = [(lo.epoch, b.step, b.indices.tolist(), b.sources.tolist())
                   for _, b in zip(range(n), iter(lo))]
            exp = [(e, p["step"], p["indices"], p["sources"]) for p in plans[e][start:start + n]]
            moves += 1
            if got != exp:
                bad.append((label, got[:2], exp[:2]))
    bt.check(first == [0, 1, 2] and moves == 5 and not bad,
             "a mixture loader with its order planned ahead (prefetch 8): after a seek back, "
             "set_epoch out of order, next_epoch, each move's batches are the plan's", bad)
    # Many moves in a row, each right after a few batches, while the planner is busy: a move
    # that waits for the planner must neither hang nor keep an order the planner computed for
    # the old position during the wait (both happened: docs/client.md, "Planning ahead").
    with batchwire.Loader(coordinator=coord.addr, job="mixmove", rank=0, world_size=1,
                          batch_size=B, seed=5, prefetch=8,
                          mixture=[(s, float(w)) for s, w in zip(SPECS, WEIGHTS)]) as lo:
        bad, moves, e = [], 0, 0
        for k in range(240):
            e = (e + 1 + k % 3) % 4  # never the epoch it is in: every set_epoch moves
            lo.set_epoch(e)
            n = 1 + k % 6
            got = [(b.step, b.indices.tolist(), b.sources.tolist())
                   for _, b in zip(range(n), iter(lo))]
            exp = [(p["step"], p["indices"], p["sources"]) for p in plans[e][:n]]
            moves += 1
            if got != exp:
                bad.append((k, e, got[:1], exp[:1]))
    del os.environ["BATCHWIRE_PLAN_AHEAD"]
    bt.check(moves == 240 and not bad,
             "240 set_epoch moves, each after 1-6 batches, with the planner running: every "
             "batch the plan's, no move hung", bad[:3])

    # --- batchwire.torch: a mixture under DataLoader(num_workers=2).
    import batchwire.torch as bwt
    from torch.utils.data import DataLoader
    ds = bwt.BatchDataset(coordinator=coord.addr, job="mixtorch", rank=1, world_size=2,
                          batch_size=B, seed=5,
                          mixture=[(sp, w) for sp, w in zip(SPECS, WEIGHTS)])
    items = list(DataLoader(ds, batch_size=None, num_workers=2))
    bt.check([(it["step"], it["indices"].tolist(), it["sources"].tolist()) for it in items] ==
             [(p["step"], p["indices"], p["sources"]) for p in want],
             "batchwire.torch.BatchDataset(mixture=...) under DataLoader(num_workers=2): the "
             "plan's %d batches, item[\"sources\"] included" % len(want))

    # --- a worker SIGKILLed between a rank's stop and its resume: the rest is the plan's.
    k = rng.randrange(1, len(full[2]))
    cfile = os.path.join(tmpdir, "kill.cursor")
    first = fetch("mixkill", 2, 4, "--max-steps", k, "--cursor-out", cfile)
    workers[1].kill9()
    with open(cfile) as f:
        cur = f.read().strip()
    r = fetch("mixkill", 2, 4, "--resume", cur, ok=False)
    bt.check(r.returncode == 0, "rank 2/4 resumed after w1 was killed", r.stderr)
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    rest = [x for x in lines if "epoch" in x]
    stats = [x["summary"]["stats"] for x in lines if "summary" in x][0]
    bt.check(stats["failovers"] > 0, "the resumed rank routed around the dead worker (%d "
             "failover(s) in its statistics)" % stats["failovers"], stats)
    bt.check(view(first + rest) == [(p["step"], p["indices"], p["sources"], p["padding"])
                                    for p in full[2]],
             "worker w1 SIGKILLed after rank 2/4's step %d: resumed, its batches are still the "
             "plan's" % (k - 1))
    check_bytes("after a worker was killed", rest)

    # --- the coordinator itself, whatever the client (raw GetOrCreateJob).
    c = jr.Jobs(coord.addr)
    pb = jr.pb

    def source(spec, weight):
        fmt, paths = spec.split(":", 1)
        return pb.MixSource(dataset=jr.data_pb2.Dataset(format=fmt, sources=paths.split(",")),
                            weight=weight)

    def config(sources, samples=0, policy=0, **sampler):
        sampler = dict(dict(mode=jr.TORCH, batch_size=B), **sampler)
        return pb.JobConfig(mixture=pb.Mixture(sources=sources, samples=samples, policy=policy),
                            sampler=pb.SamplerConfig(**sampler))

    two = [source(SPECS[0], 700000000), source(SPECS[2], 300000000)]
    r = c.call("GetOrCreateJob", pb.GetOrCreateJobRequest(name="raw", config=config(two),
                                                          world_size=2))
    d = r.job.dataset
    bt.check(r.created and d.format == "mixture" and d.length == SIZES[0] + SIZES[2] and
             [s.records for s in d.sources] == [SIZES[0], SIZES[2]] and
             [m.format for m in d.mix_sources] == ["npy", "jsonl"] and
             [m.length for m in d.mix_sources] == [SIZES[0], SIZES[2]],
             "GetOrCreateJob over a mixture: the job's description is format mixture, length E, "
             "one SourceInfo per source with its size, each source's own description")
    r2 = c.call("GetOrCreateJob", pb.GetOrCreateJobRequest(name="raw2", config=config(two[::-1]),
                                                           world_size=2))
    bt.check(r2.job.fingerprint != r.job.fingerprint and
             r2.job.dataset.fingerprint != d.fingerprint,
             "the same sources in another order make another job fingerprint and description")
    bad = [
        (config([]), "has 0 sources"),
        (config([source(SPECS[0], 1)] * 257), "257 sources"),
        (config([two[0], source(SPECS[1], 0)]), "sources[1].weight 0"),
        (config([two[0], source(SPECS[1], 10**18 + 1)]), "sources[1].weight"),
        (config([two[0], pb.MixSource(weight=1)]), "sources[1].dataset.format is required"),
        (config([two[0], pb.MixSource(dataset=jr.data_pb2.Dataset(
            format="npy", sources=["a/part-00000.npy"], pre_sharded=True), weight=1)]),
         "pre-sharded"),
        (config(two, policy=2), "policy 2"),
        (pb.JobConfig(dataset=jr.data_pb2.Dataset(format="npy", sources=["a/part-00000.npy"]),
                      mixture=pb.Mixture(sources=two),
                      sampler=pb.SamplerConfig(mode=jr.TORCH, batch_size=B)),
         "exclude each other"),
        (config(two, shuffle=True), "shuffle"),
        (config(two, policy=1), "stop"),
        (config([two[0], source("npy:missing/x.npy", 1)]), "mixture source 1"),
        (config([two[0], source("npz:z/*.npz", 1)]), "named arrays (2 fields)"),
    ]
    for i, (cfg, needle) in enumerate(bad):
        e = c.expect_error("GetOrCreateJob", pb.GetOrCreateJobRequest(
            name="bad%d" % i, config=cfg, world_size=2))
        bt.check(needle in e.details, "GetOrCreateJob refuses a bad mixture (%s): %s"
                 % (needle, e.details[:170]))
    c.close()

    # --- refusals.
    r = fetch("mixsh", 0, 1, "--shuffle", ok=False)
    bt.check(r.returncode != 0 and "shuffle" in r.stderr,
             "a mixture with --shuffle is refused: %s" % r.stderr.strip()[-160:])
    r = fetch("mix4", 0, 4, weights=["0.5", "0.25", "0.25"], ok=False)
    bt.check(r.returncode != 0 and "different configuration" in r.stderr
             and "sources[1].weight: job has 0.3, request has 0.25" in r.stderr, "job mix4 with other weights is refused (the mixture is part of the "
             "job's configuration): %s" % r.stderr.strip()[-200:])
    r = fetch("mixbad", 0, 1, weights=["0.5", "-1", "1"], ok=False)
    bt.check(r.returncode != 0 and "mixture source 1" in r.stderr,
             "a negative weight is refused naming the source: %s" % r.stderr.strip()[-160:])


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=300)
