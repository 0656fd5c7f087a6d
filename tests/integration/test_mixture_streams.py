"""Mixture jobs with stream sources (docs/semantics.md, "Streams in a mixture" and "Mixture
jobs"; docs/client.md, "Mixtures"): a coordinator and three workers on loopback serve a float32
.npy of 97 samples (map-style) beside `batchwire gen` streams -- TFRecord (61 records, two
files), JSON Lines (43, two files) and tar (29) -- marked `stream:` in `batchwire fetch --mix`.

* plan = fetch under `cycle`: torch mode at 4 ranks over two epochs (three sources, two
  streams up-sampled so they wrap within an epoch and continue across epochs), every rank's
  batches (indices -- a stream's: its record --, sources, padding) equal `batchwire plan
  --mix-size [stream:]N=WEIGHT ...`; each batch's sha256 is its samples' bytes, a stream
  record read from its own stream; per epoch source j gives exactly c_j samples;
* plan = fetch under `stop`: iterable mode at 2 ranks (four sources, tar included), the epoch
  ends at the plan's mix_end P for every rank, both epochs read each stream from its start;
  accelerate mode at 3 ranks with a down-sampled stream (`--mix-samples`), cycle;
* resume at random steps (epoch 1, where each stream starts mid-way): a rank stopped after K
  steps resumes from its cursor; the cursor carries, per stream source, the record the stream
  reads next (the formula's) and a byte offset, and the workers read no record before the
  cursor's (Data.Stats records_read: exactly the records served after it);
* a cursor whose stream record is not the formula's is refused, naming the source;
* elastic 4 -> 3 (torch, cycle) and 2 -> 5 (iterable, stop): every planned (source, record)
  delivered exactly once;
* a worker SIGKILLed between a rank's stop and its resume: the rest is the plan's, same bytes;
* Python Loader(mixture=[("stream:...", w)], mix_policy="stop"), batch.passes; the same
  through batchwire.torch.BatchDataset under DataLoader(num_workers=2);
* refusals naming the parameter: --mix-policy without a stream source, an unknown policy,
  stream: on a map-style format, --shuffle with a stream source; the coordinator, whatever the
  client sends: stream on an npy source, policy stop without a stream source; another policy
  for the same job name is another configuration.
"""

import base64
import hashlib
import json
import os
import random
import sys
from collections import Counter

import bwdata
import bwpy
import bwtest as bt
import jobs_rpc as jr

SIZES = {"npy": 97, "tfrecord": 61, "jsonl": 43, "tar": 29}
SPEC = {"npy": "npy:a/part-00000.npy", "tfrecord": "tfrecord:b/*.tfrecord",
        "jsonl": "jsonl:c/*.jsonl", "tar": "tar:d/*.tar"}
LOHI = {"tfrecord": (10, 40), "jsonl": (5, 30), "tar": (8, 20)}
B = 4


def mix_args(srcs):
    """srcs: [(kind, weight)], kind a format; every format but npy a stream source."""
    out = []
    for k, w in srcs:
        out += ["--mix", "%s%s=%s" % ("" if k == "npy" else "stream:", SPEC[k], w)]
    return out


def plan_args(srcs):
    out = []
    for k, w in srcs:
        out += ["--mix-size", "%s%d=%s" % ("" if k == "npy" else "stream:", SIZES[k], w)]
    return out


STATS = r"""
import sys
sys.path.insert(0, sys.argv[1])
import grpc, data_pb2 as p
tot = 0
for addr in sys.argv[2:]:
    with grpc.insecure_channel(addr) as ch:
        call = ch.unary_unary("/batchwire.v1.Data/Stats",
                              request_serializer=p.StatsRequest.SerializeToString,
                              response_deserializer=p.StatsResponse.FromString)
        tot += call(p.StatsRequest(), timeout=10).records_read
print(tot)
"""


def test(tmpdir):
    batchwire = bwpy.import_batchwire()
    root = os.path.join(tmpdir, "data")
    os.makedirs(root)
    arr = bwpy.gen_npy(root, "a", SIZES["npy"], (3,))
    bwpy.gen(root, "tfrecord", "b", SIZES["tfrecord"], *LOHI["tfrecord"], files=2)
    bwpy.gen(root, "jsonl", "c", SIZES["jsonl"], *LOHI["jsonl"], files=2)
    bwpy.gen(root, "tar", "d", SIZES["tar"], *LOHI["tar"])
    coord, workers = bwpy.cluster(tmpdir, root, 3)

    def sample(kind, i):
        if kind == "npy":
            return arr[i].tobytes()
        return bwdata.expected_sample(kind, i, *LOHI[kind])[0]

    def check_bytes(label, srcs, batches):
        bad = [(b["epoch"], b["step"]) for b in batches if b["sha256"] != hashlib.sha256(
            b"".join(sample(srcs[s][0], i) for s, i in zip(b["sources"], b["indices"])))
            .hexdigest()]
        bt.check(not bad, "%s: every batch's sha256 is that of its samples, each stream record "
                 "read from its own stream (%d batches)" % (label, len(batches)), bad[:5])

    def fetch(job, rank, world, srcs, *extra, mode="torch", ok=True, b=B):
        return bwpy.fetch_mix(coord.addr, job, rank, world, mix_args(srcs), *extra, mode=mode,
                              batch=b, seed=7, ok=ok)

    def plan(srcs, *extra, mode="torch", world=4, b=B):
        return bwpy.plan("--mode", mode, *plan_args(srcs), "--world-size", world,
                         "--batch-size", b, "--seed", 7, *extra)

    def view(batches):
        return [(x["step"], x["indices"], x["sources"], x["passes"], x["padding"])
                for x in batches]

    def same(label, got, want):
        bt.check(view(got) == view(want), "%s: %d batches = batchwire plan --mix-size "
                 "[stream:]N=W ... (records, sources, passes, padding)" % (label, len(want)),
                 (view(got)[:2], view(want)[:2]))

    # --- cycle, torch, 4 ranks, two epochs: streams up-sampled (wrap within an epoch).
    S1 = [("npy", "0.3"), ("tfrecord", "0.4"), ("jsonl", "0.3")]
    allb = []
    for rank in range(4):
        got = fetch("ms-cyc", rank, 4, S1, "--epochs", 2)
        allb += got
        for epoch in range(2):
            same("cycle, torch, rank %d/4, epoch %d" % (rank, epoch),
                 [x for x in got if x["epoch"] == epoch], plan(S1, "--epoch", epoch)[rank])
    check_bytes("cycle, torch, 4 ranks, 2 epochs", S1, allb)
    for epoch in range(2):
        c = Counter(s for x in allb if x["epoch"] == epoch
                    for s, p in zip(x["sources"], x["padding"]) if not p)
        bt.check([c[j] for j in range(3)] == [60, 81, 60],
                 "epoch %d: c_j = 60, 81, 60 of E = 201 (the tfrecord stream of 61 and the "
                 "JSON Lines stream of 43 wrap within the epoch)" % epoch, c)
    recs = [i for x in allb for s, i, p in zip(x["sources"], x["indices"], x["padding"])
            if s == 2 and not p]
    bt.check(Counter(recs) == Counter({i: (120 // 43) + (1 if i < 120 % 43 else 0)
                                       for i in range(43)}),
             "the JSON Lines stream under cycle: 120 records over two epochs are its passes "
             "in order (each record 2 or 3 times, the first 34 three times)")

    # --- stop, iterable, 2 ranks, four sources: the epoch ends where a stream runs dry.
    S2 = [("jsonl", "0.5"), ("npy", "0.2"), ("tar", "0.3"), ("tfrecord", "0.1")]
    meta = bt.cli("plan", "--mode", "iterable", *plan_args(S2), "--world-size", 2,
                  "--batch-size", 3, "--seed", 7, "--mix-policy", "stop", "--metadata")
    md = json.loads(meta.stdout.splitlines()[0])["metadata"]
    bt.check(md["mix_end"] < sum(SIZES.values()), "stop: the plan's epoch ends early (P = %d of "
             "E = %d)" % (md["mix_end"], sum(SIZES.values())), md)
    s2b = []
    for rank in range(2):
        got = fetch("ms-stop", rank, 2, S2, "--epochs", 2, "--mix-policy", "stop",
                    mode="iterable", b=3)
        s2b += got
        for epoch in range(2):
            want = plan(S2, "--epoch", epoch, "--mix-policy", "stop", mode="iterable", world=2,
                        b=3)[rank]
            same("stop, iterable, rank %d/2, epoch %d" % (rank, epoch),
                 [x for x in got if x["epoch"] == epoch], want)
    check_bytes("stop, iterable, 2 ranks", S2, s2b)
    real = sum(1 for x in s2b if x["epoch"] == 0 for p in x["padding"] if not p)
    bt.check(real == md["mix_end"], "stop: epoch 0 delivered exactly P = %d positions (%d)"
             % (md["mix_end"], real))

    # --- cycle, accelerate, 3 ranks, a down-sampled stream (E below the sum).
    S3 = [("jsonl", "1"), ("npy", "1")]
    s3b = []
    for rank in range(3):
        got = fetch("ms-acc", rank, 3, S3, "--epochs", 2, "--mix-samples", 50,
                    mode="accelerate")
        s3b += got
        for epoch in range(2):
            same("cycle, accelerate, --mix-samples 50, rank %d/3, epoch %d" % (rank, epoch),
                 [x for x in got if x["epoch"] == epoch],
                 plan(S3, "--epoch", epoch, "--mix-samples", 50, mode="accelerate",
                      world=3)[rank])
    check_bytes("cycle, accelerate", S3, s3b)
    e1 = sorted(i for x in s3b if x["epoch"] == 1
                for s, i, p in zip(x["sources"], x["indices"], x["padding"]) if s == 0 and not p)
    bt.check(e1 == sorted(list(range(25, 43)) + list(range(0, 7))),
             "the down-sampled stream (25 of its 43 records an epoch): epoch 1 continues at "
             "record 25, wraps to record 0", e1)

    # --- resume at random steps (epoch 1: every stream starts mid-way), seek not replay.
    rng = random.Random(2727)
    full = plan(S1, "--epoch", 1)
    for rank in (0, 3):
        k = rng.randrange(1, len(full[rank]))
        cfile = os.path.join(tmpdir, "res-%d.cursor" % rank)
        first = fetch("ms-res", rank, 4, S1, "--epochs", 2, "--max-steps", len(
            plan(S1, "--epoch", 0)[rank]) + k, "--cursor-out", cfile)
        first = [x for x in first if x["epoch"] == 1]
        with open(cfile) as f:
            cur = f.read().strip()
        c = jr.decode_cursor(base64.b64decode(cur[len("bwc1:"):]))
        from_pos = c.stream_position
        bt.check(c.epoch == 1 and c.step == k and len(c.source_records) == 3 and
                 c.source_records[0] == 0 and c.source_offsets[0] == 0,
                 "rank %d's cursor after step %d of epoch 1: one record and offset per source "
                 "(0 for the map-style one)" % (rank, k), c)
        # the formula: epoch 1 starts stream j at 1 * c_j, then its samples before the
        # cursor's position (one rank, batches of one: the epoch's order)
        one = bwpy.plan("--mode", "torch", *plan_args(S1), "--world-size", 1, "--batch-size",
                        1, "--seed", 7, "--epoch", 1)[0]
        before = Counter(p["sources"][0] for p in one[:from_pos])
        for j, (cj, n) in ((1, (81, 61)), (2, (60, 43))):
            bt.check(c.source_records[j] == (cj + before[j]) % n,
                     "rank %d's cursor: stream source %d at record %d = (1 * c_j + consumed) "
                     "mod n_j" % (rank, j, c.source_records[j]))
        r0 = read_records(tmpdir, workers)
        rest = fetch("ms-res", rank, 4, S1, "--resume", cur)
        read = read_records(tmpdir, workers) - r0
        # Data.Stats counts every sample served: each stream record of the batches, and
        # each distinct map-style sample of a batch (a repeat in one batch is read once)
        served = sum(sum(1 for s in x["sources"] if s != 0) +
                     len({i for s, i in zip(x["sources"], x["indices"]) if s == 0})
                     for x in rest)
        same("rank %d/4 resumed at step %d of epoch 1" % (rank, k),
             [x for x in first + rest if x["epoch"] == 1], full[rank])
        bt.check(read == served, "rank %d resumed by seek: the workers read %d records, exactly "
                 "the %d samples it was served after the cursor (nothing before it)" % (rank, read, served))
        # a cursor whose stream record is not the formula's
        c.source_records[2] = (c.source_records[2] + 1) % 43
        bad = "bwc1:" + base64.b64encode(jr.seal_cursor(strip_seal(c))).decode()
        r = fetch("ms-res", rank, 4, S1, "--resume", bad, ok=False)
        bt.check(r.returncode != 0 and "mixture source 2" in r.stderr,
                 "a cursor with another record for stream source 2 is refused: %s"
                 % r.stderr.strip()[-200:])

    # --- elastic 4 -> 3 (torch, cycle) and 2 -> 5 (iterable, stop).
    def elastic(job, srcs, r0, r1, mode, *pol, b=B):
        fullp = plan(srcs, "--epoch", 0, *pol, mode=mode, world=r0, b=b)
        K = rng.randrange(2, len(fullp[0]))
        old, cursors = [], []
        for rank in range(r0):
            cfile = os.path.join(tmpdir, "%s-%d.cursor" % (job, rank))
            old += fetch(job, rank, r0, srcs, "--max-steps", K, "--cursor-out", cfile, *pol,
                         mode=mode, b=b)
            with open(cfile) as f:
                cursors.append(f.read())
        ck = os.path.join(tmpdir, "%s.ckpt" % job)
        with open(ck, "w") as f:
            f.write("".join(cursors))
        new = [fetch(job, rank, r1, srcs, "--resume-elastic", ck, *pol, mode=mode, b=b)
               for rank in range(r1)]
        plan1 = plan(srcs, "--resume-from-world", r0, "--resume-from-step", K, *pol, mode=mode,
                     world=r1, b=b)
        label = "elastic %d -> %d (%s%s) at step %d" % (r0, r1, mode, "".join(
            " " + x for x in pol), K)
        for rank in range(r1):
            same("%s, new rank %d" % (label, rank), new[rank], plan1[rank])
        both = old + [x for v in new for x in v]
        check_bytes(label, srcs, both)
        key = lambda xs: Counter((s, i) for x in xs for s, i, p in
                                 zip(x["sources"], x["indices"], x["padding"]) if not p)
        planned = key(p for v in fullp.values() for p in v)
        bt.check(key(both) == planned, "%s: every planned (source, record) of the epoch "
                 "delivered exactly once over both worlds (%d)" % (label, sum(
                     planned.values())), (key(both) - planned, planned - key(both)))
        return fullp

    fullp = elastic("ms-el", S1, 4, 3, "torch")
    elastic("ms-el25", S2, 2, 5, "iterable", "--mix-policy", "stop", b=3)

    # --- Python, stop.
    want = plan(S2, "--epoch", 0, "--mix-policy", "stop", mode="iterable", world=2, b=3)[1]
    with batchwire.Loader(coordinator=coord.addr, job="ms-py", rank=1, world_size=2,
                          batch_size=3, seed=7, job_epochs=1, mode="iterable",
                          mix_policy="stop",
                          mixture=[(("" if k == "npy" else "stream:") + SPEC[k], w)
                                   for k, w in S2]) as lo:
        got = [(x.step, x.indices.tolist(), x.sources.tolist(), x.passes.tolist(),
                bytes(x.memoryview())) for x in lo]
    bt.check([g[:4] for g in got] == [(p["step"], p["indices"], p["sources"], p["passes"])
                                      for p in want],
             "Python Loader(mixture=[(\"stream:...\", w)], mix_policy=\"stop\"): rank 1/2's %d "
             "batches = the plan, batch.sources and batch.passes included" % len(want))
    bad = [g[0] for g in got
           if g[4] != b"".join(sample(S2[s][0], i) for s, i in zip(g[2], g[1]))]
    bt.check(not bad, "Python: every batch's bytes are its samples' from their sources", bad)

    # --- batchwire.torch: a stream mixture under DataLoader(num_workers=2).
    import batchwire.torch as bwt
    from torch.utils.data import DataLoader
    ds = bwt.BatchDataset(coordinator=coord.addr, job="ms-torch", rank=1, world_size=2,
                          batch_size=3, seed=7, mode="iterable", mix_policy="stop",
                          mixture=[(("" if k == "npy" else "stream:") + SPEC[k], w)
                                   for k, w in S2])
    items = list(DataLoader(ds, batch_size=None, num_workers=2))
    bt.check([(it["step"], it["indices"].tolist(), it["sources"].tolist(),
               it["passes"].tolist()) for it in items] ==
             [(p["step"], p["indices"], p["sources"], p["passes"]) for p in want],
             "batchwire.torch.BatchDataset(mixture=[stream:...], mix_policy=\"stop\") under "
             "DataLoader(num_workers=2): the plan's %d batches, item[\"passes\"] included"
             % len(want))

    # --- a worker SIGKILLed between a rank's stop and its resume.
    k = rng.randrange(1, len(fullp[2]))
    cfile = os.path.join(tmpdir, "kill.cursor")
    first = fetch("ms-kill", 2, 4, S1, "--max-steps", k, "--cursor-out", cfile)
    workers[1].kill9()
    with open(cfile) as f:
        cur = f.read().strip()
    r = fetch("ms-kill", 2, 4, S1, "--resume", cur, ok=False)
    bt.check(r.returncode == 0, "rank 2/4 resumed after w1 was killed", r.stderr)
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    rest = [x for x in lines if "epoch" in x]
    stats = [x["summary"]["stats"] for x in lines if "summary" in x][0]
    bt.check(stats["failovers"] > 0, "the resumed rank routed around the dead worker (%d "
             "failover(s) in its statistics)" % stats["failovers"], stats)
    same("worker w1 SIGKILLed after rank 2/4's step %d: resumed" % (k - 1), first + rest,
         fullp[2])
    check_bytes("after a worker was killed", S1, rest)

    # --- refusals, by the loader.
    S4 = [("npy", "1"), ("npy", "1")]
    for srcs, extra, needle, what in [
            (S4, ["--mix-policy", "stop"], "mix_policy stop needs a stream source",
             "--mix-policy without a stream source"),
            (S1, ["--mix-policy", "sometimes"], "mix_policy 'sometimes'", "an unknown policy"),
            (S1, ["--shuffle"], "shuffle", "--shuffle with stream sources")]:
        r = fetch("ms-bad", 0, 1, srcs, *extra, ok=False)
        bt.check(r.returncode != 0 and needle in r.stderr,
                 "%s is refused: %s" % (what, r.stderr.strip()[-200:]))
    r = bt.cli("fetch", "--coordinator", coord.addr, "--job", "ms-bad", "--mix",
               "stream:" + SPEC["npy"] + "=1", "--batch-size", B, "--rank", 0, "--world-size", 1)
    bt.check(r.returncode != 0 and "stream: needs a stream format" in r.stderr,
             "stream: on an npy source is refused: %s" % r.stderr.strip()[-200:])
    r = fetch("ms-cyc", 0, 4, S1, "--mix-policy", "stop", ok=False)
    bt.check(r.returncode != 0 and "different configuration" in r.stderr and "policy" in
             r.stderr, "job ms-cyc with policy stop is refused (the policy is part of the job's "
             "configuration): %s" % r.stderr.strip()[-200:])

    # --- the coordinator, whatever the client sends.
    c = jr.Jobs(coord.addr)
    pb = jr.pb

    def source(spec, weight, stream):
        fmt, paths = spec.split(":", 1)
        return pb.MixSource(dataset=jr.data_pb2.Dataset(format=fmt, sources=paths.split(",")),
                            weight=weight, stream=stream)

    def config(sources, policy=0):
        return pb.JobConfig(mixture=pb.Mixture(sources=sources, policy=policy),
                            sampler=pb.SamplerConfig(mode=jr.TORCH, batch_size=B))

    for i, (cfg, needle) in enumerate([
            (config([source(SPEC["npy"], 1, True)]), "sources[0].stream: format 'npy'"),
            (config([source(SPEC["npy"], 1, False), source(SPEC["jsonl"], 1, False)], 1),
             "policy stop needs a stream source")]):
        e = c.expect_error("GetOrCreateJob", pb.GetOrCreateJobRequest(
            name="msraw%d" % i, config=cfg, world_size=2))
        bt.check(needle in e.details, "GetOrCreateJob refuses a bad stream mixture (%s): %s"
                 % (needle, e.details[:170]))
    r = c.call("GetOrCreateJob", pb.GetOrCreateJobRequest(
        name="msraw-ok", config=config([source(SPEC["jsonl"], 1, True)], 1), world_size=1))
    bt.check(r.created and r.job.dataset.sources[0].records == SIZES["jsonl"],
             "GetOrCreateJob over a stream source takes its record count from the workers' "
             "Describe (%d)" % r.job.dataset.sources[0].records)
    c.close()


def strip_seal(c):
    """The cursor's bytes without its checksum, for jobs_rpc.seal_cursor to seal again."""
    c.ClearField("checksum")
    return c.SerializeToString()


def read_records(tmpdir, workers):
    """Stream records the live workers have read (Data.Stats), in a child process."""
    bwdata.pb(tmpdir)  # generates the stubs
    stubs = os.path.join(tmpdir, "pystubs")
    live = [w.addr for w in workers if w.running()]
    r = bt.run([sys.executable, "-c", STATS, stubs] + live, timeout=30)
    if r.returncode != 0:
        raise bt.TestFailure("Data.Stats: %s" % r.stderr)
    return int(r.stdout.split()[0])


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=400)
