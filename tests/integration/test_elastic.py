"""Elastic resume everywhere (docs/semantics.md, "Elastic resume"): a job checkpointed at
world size R0 continues at R1 from the C loader (`batchwire fetch`, bw_loader_open_elastic),
from Python (Loader(elastic=True)) and from the CLI's two forms (--resume-elastic FILE,
--elastic), through the coordinator's ResumeElastic.

A coordinator and two workers on loopback serve a float32 .npy dataset.

* 4 -> 3, torch mode, shuffled: four `batchwire fetch` ranks run K steps and write their
  cursors (--cursor-out); three new ranks resume from the four cursors concatenated
  (--resume-elastic FILE). Every sample of the epoch is delivered exactly once over both
  worlds (padding flagged and counted apart), each new rank's batches equal `batchwire plan
  --resume-from-world 4 --resume-from-step K --world-size 3`, and every batch's sha256 is
  that of np.load's rows.
* The same with the coordinator's committed cursors (--commit, then --elastic), accelerate
  mode.
* 2 -> 5, accelerate mode, Python: two Loaders run K steps and commit; five
  Loader(elastic=True, resume=batchwire.job_checkpoint(...)) ranks (in threads) finish the
  epoch: exactly once, equal to the plan, bytes equal. The second epoch runs at 5 ranks.
* Refusals: cursors of ranks stopped at different steps; a checkpoint lacking a rank.
"""

import hashlib
import json
import os

import bwpy
import bwtest as bt

N = 211
B = 4
SHAPE = (3,)


def fetch_lines(out):
    return [json.loads(x) for x in out.splitlines() if x.startswith("{\"epoch\"")]


def check_exactly_once(label, batches):
    """batches: (indices, padding) of every batch delivered in the epoch, both worlds."""
    counts = [0] * N
    pads = 0
    for idx, pad in batches:
        for i, p in zip(idx, pad):
            if p:
                pads += 1
            else:
                counts[i] += 1
    bad = [i for i, c in enumerate(counts) if c != 1]
    bt.check(not bad, "%s: every one of the %d samples delivered exactly once over both worlds "
             "(%d padding samples flagged)" % (label, N, pads),
             "samples delivered other than once: %r" % [(i, counts[i]) for i in bad[:10]])


def test(tmpdir):
    batchwire, _root, arr, coord = bwpy.npy_cluster(tmpdir, N, SHAPE)
    ds = bwpy.NPY

    def sha(idx):
        return hashlib.sha256(arr[idx].tobytes()).hexdigest()

    def cli_rank(job, mode, rank, world, *extra):
        r = bt.cli("fetch", "--coordinator", coord.addr, "--job", job, "--dataset", ds,
                   "--mode", mode, "--batch-size", B, "--shuffle", "--seed", 9, "--rank", rank,
                   "--world-size", world, *extra, timeout=60)
        bt.check(r.returncode == 0, "fetch rank %d/%d %s" % (rank, world, " ".join(
            map(str, extra))), r.stderr)
        return fetch_lines(r.stdout)

    def plan_args(mode, r0, k, r1):
        return ["--mode", mode, "--num-samples", N, "--world-size", r1, "--batch-size", B,
                "--shuffle", "--seed", 9, "--resume-from-world", r0, "--resume-from-step", k]

    def cli_case(label, job, mode, r0, r1, k, by_file):
        old, cursors = [], []
        for rank in range(r0):
            cfile = os.path.join(tmpdir, "%s-%d.cursor" % (job, rank))
            extra = ["--max-steps", k, "--cursor-out", cfile]
            old += cli_rank(job, mode, rank, r0, *(extra + ([] if by_file else ["--commit"])))
            with open(cfile) as f:
                cursors.append(f.read())
        ck = os.path.join(tmpdir, "%s.ckpt" % job)
        with open(ck, "w") as f:
            f.write("".join(cursors))
        new = {}
        for rank in range(r1):
            new[rank] = cli_rank(job, mode, rank, r1,
                                 *(["--resume-elastic", ck] if by_file else ["--elastic"]))
        plan = bwpy.plan(*plan_args(mode, r0, k, r1))
        for rank in range(r1):
            got = [(b["step"], b["indices"], b["padding"]) for b in new[rank]]
            want = [(p["step"], p["indices"], p["padding"]) for p in plan[rank]]
            bt.check(got == want, "%s: new rank %d/%d's %d batches (steps %d..) = batchwire plan "
                     "--resume-from-world %d --resume-from-step %d"
                     % (label, rank, r1, len(got), k, r0, k), (got[:2], want[:2]))
        allb = old + [b for v in new.values() for b in v]
        bad = [b["step"] for b in allb if b["sha256"] != sha(b["indices"])]
        bt.check(not bad, "%s: every batch's sha256 is np.load's rows (%d batches)"
                 % (label, len(allb)), bad)
        check_exactly_once(label, [(b["indices"], b["padding"]) for b in allb])

    cli_case("4 -> 3, torch, --resume-elastic FILE (C loader)", "el43", "torch", 4, 3, 5, True)
    cli_case("4 -> 3, accelerate, --elastic (committed cursors)", "el43c", "accelerate", 4, 3, 4,
             False)

    # --- Python: 2 -> 5, accelerate, from the coordinator's job-level checkpoint.
    K = 7
    opts = dict(coordinator=coord.addr, dataset=ds, batch_size=B, mode="accelerate",
                shuffle=True, seed=9)
    old = []
    for rank in range(2):
        with batchwire.Loader(job="el25", rank=rank, world_size=2, **opts) as lo:
            for _ in range(K):
                b = lo.next_batch()
                old.append((b.indices.tolist(), b.padding.tolist(), b.numpy().tobytes()))
            lo.commit()
    ck = batchwire.job_checkpoint(coordinator=coord.addr, job="el25")
    bt.check(ck["world_size"] == 2 and len(ck["cursors"]) == 2,
             "job_checkpoint(): the two ranks' committed cursors")
    def new_rank(rank):
        with batchwire.Loader(job="el25", rank=rank, world_size=5, elastic=True, resume=ck,
                              **opts) as lo:
            steps = lo.epoch_steps()
            got = [(b.step, b.indices.tolist(), b.padding.tolist(), b.numpy().tobytes())
                   for b in lo]
            lo.next_epoch()
            return steps, got, [b.indices.tolist() for b in lo]

    results = bwpy.in_threads(new_rank, range(5))
    bt.ok("five Loader(elastic=True, resume=checkpoint) ranks ran in threads")
    plan = bwpy.plan(*plan_args("accelerate", 2, K, 5))
    for rank in range(5):
        steps, got, _ = results[rank]
        want = [(p["step"], p["indices"], [bool(x) for x in p["padding"]]) for p in plan[rank]]
        bt.check([g[:3] for g in got] == want and steps == (want[-1][0] + 1 if want else K),
                 "2 -> 5 (Python): new rank %d's batches = batchwire plan (steps %d..%d)"
                 % (rank, K, steps - 1), ([g[:3] for g in got][:2], want[:2]))
    allb = [(i, p) for i, p, _d in old] + [(g[1], g[2]) for v in results.values() for g in v[1]]
    bad = [i for i, _p, d in old if d != arr[i].tobytes()] + \
        [g[0] for v in results.values() for g in v[1] if g[3] != arr[g[1]].tobytes()]
    bt.check(not bad, "2 -> 5: every batch's bytes are np.load's rows")
    check_exactly_once("2 -> 5, accelerate, Python elastic=True", [(list(i), list(p))
                                                                   for i, p in allb])
    e1 = bwpy.plan("--mode", "accelerate", "--num-samples", N, "--world-size", 5,
                   "--batch-size", B, "--shuffle", "--seed", 9, "--epoch", 1)
    bt.check(all(results[r][2] == [p["indices"] for p in e1[r]] for r in range(5)),
             "the next epoch runs at world size 5 from its start (= batchwire plan --epoch 1)")

    # --- Refusals.
    cur = []
    for rank in range(2):
        with batchwire.Loader(job="el-bad", rank=rank, world_size=2, **opts) as lo:
            for _ in range(3 + rank):
                lo.next_batch()
            cur.append(lo.cursor())
    try:
        batchwire.Loader(job="el-bad", rank=0, world_size=3, elastic=True, resume=cur, **opts)
        raise bt.TestFailure("cursors of ranks at different steps were accepted")
    except batchwire.FailedPreconditionError as e:
        bt.check("different steps" in e.message or "disagree" in e.message,
                 "cursors of different steps are refused: %s" % e.message[:150])
    try:
        batchwire.Loader(job="el-bad", rank=0, world_size=3, elastic=True, resume=cur[:1],
                         **opts)
        raise bt.TestFailure("a checkpoint lacking rank 1 was accepted")
    except batchwire.InvalidArgumentError as e:
        bt.check("lack rank" in e.message, "a checkpoint lacking a rank is refused: %s"
                 % e.message[:150])


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=300)
