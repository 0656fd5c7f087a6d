"""Mixture jobs with authentication on (docs/security.md, "Read grants"; docs/semantics.md,
"Mixture jobs"): a coordinator with --auth-tokens and two workers whose principals list no
trainer serve a mixture of three sources (two .npy, one JSON Lines) to a trainer that holds a
rank's lease.

* The lease's grant names each source: JoinJob's claims carry one 32-byte hash a source
  (GrantClaims.sources) beside the dataset hash (the empty message's: no read names it).
* With that grant, ReadSamples of every source is served, over gRPC and over the data
  channel, the same bytes on both, again after the first reads (the workers cache a verified
  grant once per source); a dataset outside the mixture is refused (PERMISSION_DENIED naming
  the dataset), and so is a source read with a proof made for another worker.
* `batchwire fetch --mix ... --token-file` at two ranks, over both transports: every batch
  equals `batchwire plan --mix-size ...` (sources and indices), and its sha256 is that of its
  samples, each read from its own source; again with the JSON Lines source marked `stream:`
  (its records read with ReadStream under the same grant).
* One ReadSamples request of several datasets (docs/data-channel.md, "Several datasets in one
  request") with the grant: all three sources' samples in request order; a source beside a
  dataset outside the mixture: refused over both transports naming that dataset.

Raw requests use python3-grpcio and messages compiled from proto/ (test_hostile_grants.py's
helpers), independent of the C code under test.
"""

import hashlib
import json
import os

import bwdata
import bwpy
import bwtest as bt
import jobs_rpc as jr
import test_hostile_grants as hg

pb, dpb = jr.pb, jr.dpb
SIZES = [40, 23, 17]
WEIGHTS = ["0.5", "0.3", "0.2"]
SPECS = ["npy:a/part-00000.npy", "npy:b/part-00000.npy", "jsonl:c/*.jsonl"]
JL = (5, 30)
B = 4
TOKENS = dict(hg.TOKENS, w2=("worker", "w2-token-0123456789abcdef"))


def principals(path, names):
    bt.write_principals(path, [(TOKENS[n][0], n, TOKENS[n][1]) for n in names])


def token_file(tmp, name):
    return bt.secret_file(tmp, "token-" + name, TOKENS[name][1])


def dataset(spec):
    fmt, paths = spec.split(":", 1)
    return dpb.Dataset(format=fmt, sources=paths.split(","))


def test(tmp):
    root = os.path.join(tmp, "data")
    os.makedirs(root)
    arrs = [bwpy.gen_npy(root, "a", SIZES[0], (3,)), bwpy.gen_npy(root, "b", SIZES[1], (3,))]
    bwpy.gen(root, "jsonl", "c", SIZES[2], JL[0], JL[1])
    bwpy.gen_npy(root, "d", 10, (3,))  # not in the mixture
    coord_tokens = os.path.join(tmp, "coord-principals")
    principals(coord_tokens, TOKENS)
    coord = bt.coordinator(tmp, args=["--auth-tokens", coord_tokens])
    worker_tokens = os.path.join(tmp, "worker-principals")
    principals(worker_tokens, ["ops", "w1", "w2"])
    workers = [bt.worker(tmp, coord.addr, wid, data_root=root, args=[
        "--auth-tokens", worker_tokens, "--token-file", token_file(tmp, wid)])
        for wid in ("w1", "w2")]
    ops = ("--token-file", token_file(tmp, "ops"))
    bt.poll(lambda: sorted(x["id"] for x in bt.status_json(coord.addr, ops)["workers"]
                           if x["state"] == "alive") == ["w1", "w2"], 15,
            what="w1 and w2 alive")

    def sample(src, i):
        if src < 2:
            return arrs[src][i].tobytes()
        return bwdata.expected_sample("jsonl", i, JL[0], JL[1])[0]

    bt.log("===== the lease's grant names each source =====")
    alice = jr.Jobs(coord.addr, token=TOKENS["alice"][1])
    weights = [500000000, 300000000, 200000000]
    config = pb.JobConfig(
        mixture=pb.Mixture(sources=[pb.MixSource(dataset=dataset(s), weight=w)
                                    for s, w in zip(SPECS, weights)]),
        sampler=pb.SamplerConfig(mode=jr.TORCH, batch_size=B))
    r = alice.call("GetOrCreateJob", pb.GetOrCreateJobRequest(name="mix-raw", world_size=1,
                                                              config=config))
    bt.check(r.created and r.job.dataset.format == "mixture",
             "a mixture job is created with authentication on")
    ja = alice.join("mix-raw", 0, 1, host="node-a", pid=100)
    claims = dpb.GrantClaims.FromString(ja.grant_claims)
    bt.check(len(ja.grant_secret) == 32 and len(claims.sources) == 3 and
             all(len(h) == 32 for h in claims.sources) and len(set(claims.sources)) == 3 and
             claims.dataset not in claims.sources,
             "JoinJob's grant has one hash a source (GrantClaims.sources), none the dataset's",
             claims)

    bt.log("===== the grant reads every source, nothing else =====")
    for w in workers:
        wid = w.name.split("-", 1)[1]
        daddr = w.first_line.split("data-channel=", 1)[1].split()[0]
        g = hg.grant(ja, wid)
        for rnd in range(2):
            for j, spec in enumerate(SPECS):
                req = dpb.ReadSamplesRequest(dataset=dataset(spec),
                                             indices=list(range(SIZES[j])), grant=g)
                code, got = hg.Raw(w.addr).read(req)
                want = [sample(j, i) for i in range(SIZES[j])]
                bt.check(code == hg.S.OK and [s.data for s in got] == want,
                         "%s gRPC (round %d): source %d's %d samples with the mixture's grant" %
                         (wid, rnd, j, SIZES[j]), got if code != hg.S.OK else len(got))
                dc = hg.dchan_read(daddr, req)
                bt.check(dc[0] == "ok" and dc[1] == want,
                         "%s data channel (round %d): the same bytes of source %d" %
                         (wid, rnd, j), dc[:3])
        hg.refused_both(w, daddr, dpb.ReadSamplesRequest(dataset=dataset("npy:d/part-00000.npy"),
                                                         indices=[0], grant=g),
                        "dataset", "%s: the mixture's grant used for a dataset outside it" % wid)
        hg.refused_both(w, daddr, dpb.ReadSamplesRequest(dataset=dataset(SPECS[1]), indices=[0],
                                                         grant=hg.grant(ja, "w9")),
                        "worker '%s'" % wid, "%s: a source read with a proof for w9" % wid)
        # one request of several sources (docs/data-channel.md, "Several datasets in one
        # request"): the grant covers each, or the request is refused naming the one it misses
        of = [2, 0, 1, 0, 2, 1]
        idx = [3, 39, 22, 0, 16, 5]
        req = dpb.ReadSamplesRequest(datasets=[dpb.DatasetRef(dataset=dataset(x)) for x in SPECS],
                                     indices=idx, index_datasets=of, grant=g)
        code, got = hg.Raw(w.addr).read(req)
        want = [sample(j, i) for j, i in zip(of, idx)]
        bt.check(code == hg.S.OK and [x.data for x in got] == want,
                 "%s gRPC: one request of the three sources with the mixture's grant" % wid,
                 got if code != hg.S.OK else len(got))
        bt.check(hg.dchan_read(daddr, req) == ("ok", want),
                 "%s data channel: the same request, the same bytes" % wid)
        hg.refused_both(w, daddr, dpb.ReadSamplesRequest(
            datasets=[dpb.DatasetRef(dataset=dataset(SPECS[0])),
                      dpb.DatasetRef(dataset=dataset("npy:d/part-00000.npy"))],
            indices=[0, 0], index_datasets=[0, 1], grant=g),
            "dataset 1 of 2 (npy d/part-00000.npy)",
            "%s: one request of a source and a dataset outside the mixture" % wid)
        bt.check(w.running(), "%s is still up" % wid)

    bt.log("===== batchwire fetch --mix with a token: plan = fetch, bytes =====")
    # and again with the JSON Lines source read as a stream (its records through ReadStream,
    # under the same grant)
    for stream, transport in [(st, t) for st in ("", "stream:") for t in ("auto", "grpc")]:
        mix = []
        for j, (sp, w) in enumerate(zip(SPECS, WEIGHTS)):
            mix += ["--mix", "%s%s=%s" % (stream if j == 2 else "", sp, w)]
        plan_mix = []
        for j, (n, w) in enumerate(zip(SIZES, WEIGHTS)):
            plan_mix += ["--mix-size", "%s%d=%s" % (stream if j == 2 else "", n, w)]
        transport_job = ("mixs-" if stream else "mix-") + transport
        for rank in range(2):
            r = bt.cli("fetch", "--coordinator", coord.addr, "--job", transport_job, *mix,
                       "--batch-size", B, "--seed", 3, "--rank", rank, "--world-size", 2,
                       "--transport", transport, "--token-file", token_file(tmp, "alice"),
                       timeout=60)
            bt.check(r.returncode == 0, "fetch --mix --token-file rank %d/2 (transport %s%s)" %
                     (rank, transport, ", a stream source" if stream else ""), r.stderr[-800:])
            got = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{\"epoch\"")]
            want = bwpy.plan("--mode", "torch", *plan_mix, "--world-size", 2, "--batch-size", B,
                             "--seed", 3)[rank]
            bt.check([(b["indices"], b["sources"]) for b in got] ==
                     [(p["indices"], p["sources"]) for p in want],
                     "rank %d/2 (%s%s): %d batches = batchwire plan --mix-size" %
                     (rank, transport, " " + stream if stream else "", len(want)),
                     (got[:1], want[:1]))
            bad = [b["step"] for b in got if b["sha256"] != hashlib.sha256(b"".join(
                sample(s, i) for s, i in zip(b["sources"], b["indices"]))).hexdigest()]
            bt.check(not bad, "rank %d/2 (%s): every batch's bytes are its samples' bytes" %
                     (rank, transport), bad[:5])


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=240)
