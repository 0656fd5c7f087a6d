"""Streaming datasets end to end (docs/streams.md): a coordinator, three storage workers and up
to eight ranks, each rank a concurrent `batchwire fetch --mode iterable` process, over
TFRecord, JSON Lines and tar streams written by `batchwire gen`.

* Single source: each rank's elements (real and padding, in order) equal Accelerate's
  IterableDatasetShard from tests/data/golden/iterable_dataset_shard.public.jsonl, and its
  batches equal the DataLoader's `loader_batches` there.
* 1, 3 and 7 sources, 1-8 ranks, split_batches and drop_last on and off: every rank's batches
  equal `batchwire plan --mode iterable`; each batch's sha256 equals that of the records' bytes
  (the generator's formula, bwdata.py) at those positions of the global stream order; the real
  records over all ranks are every record exactly once; padding is flagged; every rank gets
  the same number of batches and finishes the epoch at the same step (the DDP hang avoided:
  the stream lengths are not multiples of the global batch).
* Per-epoch reshuffle of source order: the order is torch.randperm(sources, seed + epoch).
* Resume at boundary, random, last-real-record and end-of-epoch steps gives the identical
  continuation, after a kill -9 and restart of every worker; the workers' Data.Stats counters
  prove the records before the cursor were not read.
* Pre-sharded streams: rank r receives exactly source r's records (1/R of the data, padded to
  equal batch counts); sharding them again is refused with the double-sharding message.
"""

import hashlib
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwtest as bt  # noqa: E402
import bwdata as bd  # noqa: E402
from test_client_e2e import Cluster, Fetch, gen, plan, read_tfrecords, sanitized_build  # noqa: E402

GOLDEN = os.path.join(bt.SOURCE_DIR, "tests", "data", "golden",
                      "iterable_dataset_shard.public.jsonl")


def cfg(B, split=False, drop=False, shuffle=False, seed=0):
    c = {"mode": "iterable", "B": B, "split_batches": split, "drop_last": drop}
    if shuffle:
        c.update(shuffle=True, seed=seed)
    return c


class Stream:
    """A generated stream: its spec, record counts per source and expected record bytes."""

    def __init__(self, cl, name, fmt, n, files, lo=4, hi=48):
        self.desc = gen(cl, name, fmt, [str(x) for x in ("--num-samples", n, "--files", files,
                                                         "--sample-bytes", lo,
                                                         "--sample-bytes-max", hi)])
        self.fmt, self.n = fmt, n
        self.spec = "%s:%s" % (fmt, ",".join("%s/%s" % (name, x) for x in self.desc["sources"]))
        self.records = [bd.expected_sample(fmt, i, lo, hi)[0] for i in range(n)]
        if fmt == "tfrecord":
            self.counts = [len(read_tfrecords(p)) for p in self.desc["paths"]]
            flat = [r for p in self.desc["paths"] for r in read_tfrecords(p)]
            bt.check(flat == self.records, "%s: the files hold the generator's records" % name)
        elif fmt == "jsonl":
            self.counts = []
            for p in self.desc["paths"]:
                with open(p, "rb") as f:
                    self.counts.append(sum(1 for x in f.read().split(b"\n") if x.strip()))
        else:
            self.counts = None  # tar: only used in declared order
        if self.counts is not None:
            bt.check(sum(self.counts) == n, "%s: %s records per source" % (name, self.counts))

    def order(self, shuffle=False, seed=0, epoch=0):
        """Gen index at each position of the epoch's global stream order."""
        if not shuffle:
            return list(range(self.n))
        perm = randperm(len(self.counts), seed + epoch)
        first = [sum(self.counts[:s]) for s in range(len(self.counts))]
        return [first[s] + k for s in perm for k in range(self.counts[s])]


def randperm(n, seed):
    import torch  # python3-torch; only for the source reshuffle check
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()


def sha(records, idx):
    h = hashlib.sha256()
    for i in idx:
        h.update(records[i])
    return h.hexdigest()


_jobs = [0]


def job_name(tag):
    _jobs[0] += 1
    return "%s-%d" % (tag, _jobs[0])


def run_ranks(cl, spec, c, world, epochs=1, extra=(), job=None, per_rank_extra=None):
    job = job or job_name("s")
    procs = [Fetch(cl.addr, job, spec, c, r, world,
                   ["--epochs", epochs] + list(extra) +
                   list(per_rank_extra[r] if per_rank_extra else []))
             for r in range(world)]
    return job, {p.rank: p.ok(60, "job %s" % job)[0] for p in procs}


def check_run(label, st, c, world, got, epochs=1):
    """Batches equal the plan, bytes equal the records at those positions, every record once."""
    for e in range(epochs):
        # positions do not depend on the source order: plan without --shuffle
        want, meta = plan({k: v for k, v in c.items() if k not in ("shuffle", "seed")}, st.n,
                          world, e)
        order = st.order(c.get("shuffle", False), c.get("seed", 0), e)
        steps = set()
        seen = []
        for r in range(world):
            mine = [b for b in got[r] if b["epoch"] == e]
            w = want[r]
            if [(b["step"], b["indices"], b["padding"], b["real"]) for b in mine] != \
                    [(b["step"], b["indices"], b["padding"], b["real"]) for b in w]:
                raise bt.TestFailure("%s epoch %d rank %d: batches differ from batchwire plan\n"
                                     "got:  %s\nwant: %s" % (label, e, r, mine[:4], w[:4]))
            for b in mine:
                s = sha(st.records, [order[i] for i in b["indices"]])
                if b["sha256"] != s:
                    raise bt.TestFailure("%s epoch %d rank %d step %d: bytes differ from the "
                                         "records at positions %s" %
                                         (label, e, r, b["step"], b["indices"]))
                seen += [i for i, p in zip(b["indices"], b["padding"]) if not p]
                if sum(b["padding"]) != len(b["indices"]) - b["real"]:
                    raise bt.TestFailure("%s: real does not count the unflagged samples" % label)
            steps.add((len(mine), mine[-1]["step"] if mine else -1))
        if len(steps) != 1:
            raise bt.TestFailure("%s epoch %d: ranks end at different steps: %s" %
                                 (label, e, steps))
        full = (st.n // (world * (c["B"] // world if c["split_batches"] else c["B"]))) * \
            world * (c["B"] // world if c["split_batches"] else c["B"])
        expect = list(range(full if c["drop_last"] else st.n))
        if sorted(seen) != expect:
            raise bt.TestFailure("%s epoch %d: real records over the ranks are not each record "
                                 "exactly once (%d seen, %d expected)" %
                                 (label, e, len(seen), len(expect)))
    bt.ok("%s: %d ranks x %d epoch(s) = plan, bytes, every record once, equal steps" %
          (label, world, epochs))


# ---------------------------------------------------------------------------

def test_golden(cl):
    recs = [json.loads(x) for x in open(GOLDEN)]
    rng = random.Random(7)
    usable = [r for r in recs if r["n"] in (5, 7, 10, 23) and "error" not in r and
              "loader_error" not in r["per_rank"][0]]
    by_world = {}
    for r in usable:
        by_world.setdefault(r["num_processes"], []).append(r)
    picked = []
    for R in sorted(by_world):
        picked += rng.sample(by_world[R], min(3, len(by_world[R])))
    streams = {}
    for rec in picked:
        n = rec["n"]
        if n not in streams:
            streams[n] = Stream(cl, "g%d" % n, "tfrecord", n, 1)
        st = streams[n]
        c = cfg(rec["batch_size"], rec["split_batches"], rec["drop_last"])
        R = rec["num_processes"]
        _, got = run_ranks(cl, st.spec, c, R)
        for r in range(R):
            elements = [i for b in got[r] for i in b["indices"]]
            g = rec["per_rank"][r]
            if elements != g["elements"] or [b["indices"] for b in got[r]] != g["loader_batches"]:
                raise bt.TestFailure("golden n=%d B=%d R=%d drop_last=%s split=%s rank %d:\n"
                                     "got  %s\nwant %s (batches %s)" %
                                     (n, rec["batch_size"], R, rec["drop_last"],
                                      rec["split_batches"], r, elements, g["elements"],
                                      g["loader_batches"]))
            for b in got[r]:
                if b["sha256"] != sha(st.records, b["indices"]):
                    raise bt.TestFailure("golden n=%d rank %d: bytes differ" % (n, r))
    bt.ok("single source: %d configurations equal Accelerate's IterableDatasetShard and "
          "DataLoader batches, bytes checked" % len(picked))
    # split_batches with batch_size % R != 0 raises in Accelerate: refused here
    p = Fetch(cl.addr, job_name("bad"), streams[23].spec, cfg(3, split=True), 0, 2)
    bt.check_in("split_batches", p.refused(), "split_batches with 3 % 2 != 0 is refused")


def test_grid(cl, small):
    t = {1: Stream(cl, "t1", "tfrecord", 23, 1), 3: Stream(cl, "t3", "tfrecord", 29, 3),
         7: Stream(cl, "t7", "tfrecord", 41, 7)}
    worlds = [1, 3, 8] if small else [1, 2, 3, 4, 8]
    rng = random.Random(11)
    n = 0
    for files, st in sorted(t.items()):
        for R in worlds:
            for split in (False, True):
                for drop in (False, True):
                    if (small or files == 1) and rng.random() < 0.5:
                        continue
                    B = R * rng.choice([1, 2]) if split else rng.choice([1, 2, 3])
                    c = cfg(B, split, drop)
                    _, got = run_ranks(cl, st.spec, c, R)
                    check_run("tfrecord %d sources B=%d split=%s drop=%s" %
                              (files, B, split, drop), st, c, R, got)
                    n += 1
    for fmt, n_, files in (("jsonl", 17, 3), ("tar", 13, 3)):
        st = Stream(cl, fmt + "3", fmt, n_, files)
        for R, c in ((2, cfg(2)), (3, cfg(3, split=True, drop=True))):
            _, got = run_ranks(cl, st.spec, c, R)
            check_run("%s %d sources" % (fmt, files), st, c, R, got)
    # the source reshuffle: a new order each epoch, two epochs
    c = cfg(2, shuffle=True, seed=5)
    _, got = run_ranks(cl, t[7].spec, c, 3, epochs=2)
    check_run("tfrecord 7 sources, shuffled sources (seed 5)", t[7], c, 3, got, epochs=2)
    return t


STATS = r"""
import sys
sys.path.insert(0, sys.argv[1])
import grpc, data_pb2 as p
tot = [0, 0]
for addr in sys.argv[2:]:
    with grpc.insecure_channel(addr) as ch:
        call = ch.unary_unary("/batchwire.v1.Data/Stats",
                              request_serializer=p.StatsRequest.SerializeToString,
                              response_deserializer=p.StatsResponse.FromString)
        s = call(p.StatsRequest(), timeout=10)
        tot[0] += s.records_read
        tot[1] += s.record_bytes_read
print(tot[0], tot[1])
"""


def stats(cl):
    """Records and bytes the workers read, summed (Data.Stats). In a child process: gRPC's
    Python threads and this test's forks of fetch processes do not mix."""
    bd.pb(cl.tmpdir)  # generates the stubs
    r = bt.run([sys.executable, "-c", STATS, os.path.join(cl.tmpdir, "pystubs")] +
               [w.addr for w in cl.workers.values()], timeout=30)
    if r.returncode != 0:
        raise bt.TestFailure("Data.Stats failed:\n" + r.stderr)
    return [int(x) for x in r.stdout.split()]


def test_resume(cl, tmpdir):
    st = Stream(cl, "r3", "tfrecord", 25, 3)
    R, c = 2, cfg(1)
    G = 2
    job, full = run_ranks(cl, st.spec, c, R)
    steps = len(full[0])
    bounds = [sum(st.counts[:k]) for k in range(1, len(st.counts))]
    ks = sorted(set([b // G for b in bounds if b % G == 0] + [steps - 1, steps] +
                    random.Random(3).sample(range(1, steps - 1), 2)))
    bt.check(any(b % G == 0 for b in bounds), "a resume point falls on a source boundary "
             "(boundaries %s, %d positions a step)" % (bounds, G))
    for i, K in enumerate(ks):
        rjob = job_name("resume")
        curs = [os.path.join(tmpdir, "cur-%s-%d" % (rjob, r)) for r in range(R)]
        _, first = run_ranks(cl, st.spec, c, R, job=rjob,
                             per_rank_extra=[["--max-steps", K, "--cursor-out", curs[r]]
                                             for r in range(R)])
        restart = i == len(ks) // 2
        if restart:
            for wid in list(cl.workers):
                cl.workers[wid].kill9()
                cl.workers[wid] = bt.worker(tmpdir, cl.addr, wid, data_root=cl.root)
            cl.wait_alive(len(cl.workers))
        before = stats(cl)
        _, rest = run_ranks(cl, st.spec, c, R, job=rjob,
                            per_rank_extra=[["--resume", open(curs[r]).read().strip()]
                                            for r in range(R)])
        after = stats(cl)
        for r in range(R):
            got = first[r] + rest[r]
            if [(b["step"], b["indices"], b["sha256"]) for b in got] != \
                    [(b["step"], b["indices"], b["sha256"]) for b in full[r]]:
                raise bt.TestFailure("resume at step %d rank %d: the continuation differs\n"
                                     "got  %s\nwant %s" % (K, r, [b["indices"] for b in got],
                                                           [b["indices"] for b in full[r]]))
        read = [after[0] - before[0], after[1] - before[1]]
        served = [sum(len(b["indices"]) for r in range(R) for b in rest[r]),
                  sum(b["bytes"] for r in range(R) for b in rest[r])]
        if read != served:
            raise bt.TestFailure("resume at step %d: workers read %d records (%d bytes) to serve "
                                 "%d records (%d bytes)" % (K, read[0], read[1], served[0],
                                                            served[1]))
        bt.ok("resume at step %d of %d (position %d%s%s): identical continuation; workers read "
              "exactly the %d records (%d bytes) served after the cursor" %
              (K, steps, min(K * G, st.n), ", a source boundary" if K * G in bounds else "",
               ", after every worker was restarted" if restart else "", read[0], read[1]))


def test_pre_sharded(cl):
    sizes = [10, 7, 9, 4]
    os.makedirs(os.path.join(cl.root, "ps"), exist_ok=True)
    for i, n in enumerate(sizes):
        gen(cl, "ps/%d" % i, "jsonl", ["--num-samples", str(n), "--files", "1"])
    spec = "pre_sharded:jsonl:" + ",".join("ps/%d/part-00000.jsonl" % i for i in range(4))
    recs = [[bd.expected_sample("jsonl", k, 256, 0)[0] for k in range(n)] for n in sizes]
    first = [sum(sizes[:r]) for r in range(4)]
    for drop in (False, True):
        c = cfg(3, drop=drop)
        # --commit: the coordinator must accept each rank's end-of-epoch cursor, whose step
        # (the longest source's batches) exceeds what the whole stream would give.
        _, got = run_ranks(cl, spec, c, 4, extra=["--commit"])
        counts = set(len(got[r]) for r in range(4))
        bt.check(len(counts) == 1, "pre-sharded drop_last=%s: every rank %s batches" %
                 (drop, counts))
        for r in range(4):
            real, allrec = [], []
            for b in got[r]:
                ks = [i - first[r] for i in b["indices"]]
                if any(k < 0 or k >= sizes[r] for k in ks):
                    raise bt.TestFailure("rank %d got records of another source: %s" %
                                         (r, b["indices"]))
                if b["sha256"] != sha(recs[r], ks):
                    raise bt.TestFailure("pre-sharded rank %d step %d: bytes differ" %
                                         (r, b["step"]))
                real += [k for k, p in zip(ks, b["padding"]) if not p]
                allrec += ks
            want = list(range((sizes[r] // 3) * 3 if drop else sizes[r]))
            if drop:
                want = list(range(min(sizes) // 3 * 3))
            if real != want:
                raise bt.TestFailure("pre-sharded rank %d: real records %s, want %s" %
                                     (r, real, want))
        bt.ok("pre-sharded drop_last=%s: rank r receives exactly source r's records "
              "(1/R of the data), padded from its own start to equal batch counts" % drop)
    err = Fetch(cl.addr, job_name("ps"), spec, {"mode": "torch", "B": 2}, 0, 4).refused()
    bt.check_in("double sharding", err, "sharding a pre-sharded stream again is refused")
    bt.check_in("1/16", err, "the refusal names the 1/R^2 fraction")
    err = Fetch(cl.addr, job_name("ps"), spec, cfg(2), 0, 3).refused()
    bt.check_in("one source per rank", err, "a pre-sharded stream needs one source per rank")


def test(tmpdir):
    small = sanitized_build()
    cl = Cluster(tmpdir, nworkers=3)
    test_golden(cl)
    test_grid(cl, small)
    test_resume(cl, tmpdir)
    test_pre_sharded(cl)
    cl.stop()


if __name__ == "__main__":
    bt.main(test, timeout=300)
