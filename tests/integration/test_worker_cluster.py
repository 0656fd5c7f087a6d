"""A coordinator and three workers over one data root: every sample of every format that
`batchwire gen` writes is fetched through the owning worker's RPC and checked byte for byte
against the generator's formula (reimplemented in bwdata.py); streams are read by byte offset
and resumed from a received offset; a request sent to the wrong worker is refused with
BW_WRONG_OWNER; killing a worker moves only its shards, and everything is served again.
"""

import os
import sys

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwtest as bt  # noqa: E402
import bwdata as bd  # noqa: E402

NUM_SHARDS = 16
HEARTBEAT_MS = 200

DATASETS = [
    # format, gen arguments, (lo, hi) sample sizes, sources as the worker sees them
    ("npy", ["--num-samples", "300", "--shape", "3,5", "--dtype", "float32", "--files", "3"]),
    ("tfrecord", ["--num-samples", "250", "--sample-bytes", "0", "--sample-bytes-max", "3000",
                  "--files", "4"]),
    ("jsonl", ["--num-samples", "200", "--sample-bytes", "1", "--sample-bytes-max", "300",
               "--files", "2"]),
    ("tar", ["--num-samples", "120", "--sample-bytes", "0", "--sample-bytes-max", "5000",
             "--files", "3"]),
    ("files", ["--num-samples", "60", "--sample-bytes", "10", "--sample-bytes-max", "9000"]),
]


def gen(tmpdir, root, name, fmt, args):
    out = os.path.join(root, name)
    r = bt.cli("gen", "--format", fmt, "--out", out, *args, timeout=60)
    bt.check(r.returncode == 0, "batchwire gen --format %s %s" % (fmt, " ".join(args)), r.stderr)
    import json
    desc = json.loads(r.stdout)
    desc["sources"] = ["%s/%s" % (name, s) for s in desc["sources"]]
    return desc


def routing(pbm, version):
    return pbm.Routing(placement_version=version, num_shards=NUM_SHARDS,
                       shard_mode=pbm.SHARD_MODE_MODULO)


def fetch_all(clients, table, d, info, pbm, max_message_bytes=0):
    """Fetches every index from its owner; returns {worker id: number of samples}."""
    ids = [w.id for w in table.workers]
    by_owner = {}
    for i in range(info.length):
        by_owner.setdefault(ids[table.owners[i % NUM_SHARDS]], []).append(i)
    got = {}
    for wid, idx in by_owner.items():
        rows = clients[wid].read(d["format"], d["sources"], idx,
                                 routing=routing(pbm, table.version),
                                 max_message_bytes=max_message_bytes)
        if [r["index"] for r in rows] != idx:
            raise bt.TestFailure("%s: worker %s returned indices out of order" % (d["format"], wid))
        for r in rows:
            want, fields = bd.expected_sample(d["format"], r["index"], d["sample_bytes"],
                                              d["sample_bytes_max"])
            if r["data"] != want:
                raise bt.TestFailure("%s sample %d from %s: %d bytes differ from the generator's %d"
                                     % (d["format"], r["index"], wid, len(r["data"]), len(want)))
            if fields is not None and r["fields"] != fields:
                raise bt.TestFailure("%s sample %d: fields %r, expected %r" %
                                     (d["format"], r["index"], r["fields"], fields))
        got[wid] = len(idx)
    return got


def check_streams(clients, table, d, info, pbm):
    ids = [w.id for w in table.workers]
    for k, src in enumerate(info.sources):
        owner = ids[table.owners[k % NUM_SHARDS]]
        c = clients[owner]
        recs = c.read_stream(d["format"], d["sources"], k, routing=routing(pbm, table.version))
        bt.check(len(recs) == src.records,
                 "%s source %s: ReadStream from %s gave all %d records" %
                 (d["format"], src.path, owner, src.records))
        for j, r in enumerate(recs):
            want, _ = bd.expected_sample(d["format"], src.first_index + j, d["sample_bytes"],
                                         d["sample_bytes_max"])
            if r["data"] != want or r["index"] != j:
                raise bt.TestFailure("%s source %d record %d differs" % (d["format"], k, j))
            if j and r["offset"] != recs[j - 1]["next_offset"]:
                raise bt.TestFailure("offsets do not chain at record %d" % j)
        # Resume from the middle: exactly the remaining records.
        mid = len(recs) // 2
        rest = c.read_stream(d["format"], d["sources"], k, offset=recs[mid]["offset"],
                             max_records=0, routing=routing(pbm, table.version))
        if [r["data"] for r in rest] != [r["data"] for r in recs[mid:]]:
            raise bt.TestFailure("%s: resuming at offset %d did not give the remaining records" %
                                 (d["format"], recs[mid]["offset"]))
        part = c.read_stream(d["format"], d["sources"], k, offset=recs[mid]["offset"],
                             max_records=3)
        if len(part) != min(3, len(recs) - mid):
            raise bt.TestFailure("max_records=3 gave %d records" % len(part))
    bt.ok("%s: every source streamed, offsets chain, resume from a received offset is exact"
          % d["format"])


def wait_placement(coord_client, pred, what, timeout=15):
    return bt.poll(lambda: (lambda t: t if pred(t) else None)(coord_client.placement(NUM_SHARDS)),
                   timeout, interval=0.1, what=what)


def test(tmpdir):
    root = os.path.join(tmpdir, "data")
    os.makedirs(root)
    datasets = [gen(tmpdir, root, fmt, fmt, args) for fmt, args in DATASETS]
    # Samples bigger than the message limit the client asks for: chunked and reassembled.
    big = gen(tmpdir, root, "big", "tfrecord", ["--num-samples", "12", "--sample-bytes",
                                                "100000", "--sample-bytes-max", "300000"])

    coord = bt.coordinator(tmpdir, args=["--heartbeat-ms", HEARTBEAT_MS, "--dead-after", "3"])
    workers = {wid: bt.worker(tmpdir, coord.addr, wid, data_root=root)
               for wid in ("w1", "w2", "w3")}
    cc = bd.DataClient(tmpdir, coord.addr)
    pbm = cc.pb
    clients = {wid: bd.DataClient(tmpdir, w.addr) for wid, w in workers.items()}
    table = wait_placement(cc, lambda t: len(t.workers) == 3, "3 live workers in the placement")
    bt.check([w.id for w in table.workers] == ["w1", "w2", "w3"] and len(table.owners) ==
             NUM_SHARDS, "placement version %d lists w1 w2 w3 and owns all %d shards" %
             (table.version, NUM_SHARDS))
    counts = {i: list(table.owners).count(i) for i in range(3)}
    bt.check(all(counts.values()), "every worker owns some shards: %r" % counts)
    for wid, w in workers.items():
        w.wait_log(r"placement version %d: 3 live workers" % table.version)

    for d in datasets:
        infos = [clients[w].describe(d["format"], d["sources"]) for w in ("w1", "w2", "w3")]
        info = infos[0]
        bt.check(info.length == d["num_samples"] and
                 len({i.fingerprint for i in infos}) == 1,
                 "%s: Describe on 3 workers: length %d, one fingerprint %s" %
                 (d["format"], info.length, info.fingerprint))
        if d["format"] == "npy":
            bt.check(info.layout.dtype == "<f4" and list(info.layout.shape) == [3, 5] and
                     info.layout.sample_bytes == 60, "npy layout is <f4 (3, 5), 60 bytes")
        got = fetch_all(clients, table, d, info, pbm)
        bt.check(sum(got.values()) == info.length,
                 "%s: all %d samples fetched from their owners %r and equal to the generator's" %
                 (d["format"], info.length, got))
        if d["format"] in ("tfrecord", "jsonl", "tar"):
            check_streams(clients, table, d, info, pbm)

    info = clients["w1"].describe("tfrecord", big["sources"])
    stats = {}
    rows = clients["w1"].read("tfrecord", big["sources"], list(range(info.length)) * 2,
                              max_message_bytes=65536, stats=stats)
    for r in rows:
        want, _ = bd.expected_sample("tfrecord", r["index"], big["sample_bytes"],
                                     big["sample_bytes_max"])
        if r["data"] != want:
            raise bt.TestFailure("big sample %d differs" % r["index"])
    bt.check(stats["max_message"] <= 65536 and max(r["chunks"] for r in rows) >= 2,
             "samples of up to 300 KB under a 64 KiB message limit: %d messages, largest %d "
             "bytes, reassembled from up to %d chunks" %
             (stats["messages"], stats["max_message"], max(r["chunks"] for r in rows)))

    # The wrong worker refuses, naming the owner; the right one serves.
    npy = datasets[0]
    ids = [w.id for w in table.workers]
    shard = next(s for s in range(NUM_SHARDS) if ids[table.owners[s]] == "w2")
    details, code = bd.expect_error(
        lambda: clients["w1"].read("npy", npy["sources"], [shard],
                                   routing=routing(pbm, table.version)),
        grpc.StatusCode.FAILED_PRECONDITION, "owned by worker w2", "refresh placement")
    bt.check(code == "BW_WRONG_OWNER", "a request for w2's shard at w1 is refused: " + details)
    # Blocks (Routing.block_samples): a block of neighbouring indices is one shard's, checked
    # by the rule the request carries -- served whole by its owner, refused whole elsewhere.
    blk = 4
    bshard = next(s for s in range(NUM_SHARDS) if ids[table.owners[s]] == "w2" and
                  ids[table.owners[(blk * s) % NUM_SHARDS]] != "w2")
    block_idx = list(range(blk * bshard, blk * bshard + blk))
    rows = clients["w2"].read("npy", npy["sources"], block_idx,
                              routing=pbm.Routing(placement_version=table.version,
                                                  num_shards=NUM_SHARDS,
                                                  shard_mode=pbm.SHARD_MODE_MODULO,
                                                  block_samples=blk))
    bt.check([r["index"] for r in rows] == block_idx,
             "block %d of %d samples (indices %r, shard %d by blocks, %d alone) is served by "
             "w2, its owner" % (bshard, blk, block_idx, bshard, block_idx[0] % NUM_SHARDS))
    details, code = bd.expect_error(
        lambda: clients["w2"].read("npy", npy["sources"], block_idx[:1],
                                   routing=routing(pbm, table.version)),
        grpc.StatusCode.FAILED_PRECONDITION, "shard %d of %d" % (block_idx[0] % NUM_SHARDS,
                                                                NUM_SHARDS), "refresh placement")
    bt.check(code == "BW_WRONG_OWNER",
             "index %d routed sample by sample (shard %d, not w2's) is refused at w2: %s" %
             (block_idx[0], block_idx[0] % NUM_SHARDS, details))
    details, code = bd.expect_error(
        lambda: clients["w1"].read("npy", npy["sources"], block_idx,
                                   routing=pbm.Routing(placement_version=table.version,
                                                       num_shards=NUM_SHARDS,
                                                       shard_mode=pbm.SHARD_MODE_MODULO,
                                                       block_samples=blk)),
        grpc.StatusCode.FAILED_PRECONDITION, "shard %d of %d is owned by worker w2" %
        (bshard, NUM_SHARDS))
    bt.check(code == "BW_WRONG_OWNER", "the same block at w1 is refused: " + details)
    # Any block a request carries is checked by its rule: the largest puts every index of the
    # dataset in block 0, shard 0, served by shard 0's owner alone.
    huge = pbm.Routing(placement_version=table.version, num_shards=NUM_SHARDS,
                       shard_mode=pbm.SHARD_MODE_MODULO, block_samples=2**32 - 1)
    owner0 = ids[table.owners[0]]
    other = next(w for w in ("w1", "w2", "w3") if w != owner0)
    far = [0, 299, 150]
    rows = clients[owner0].read("npy", npy["sources"], far, routing=huge)
    bt.check([r["index"] for r in rows] == far,
             "blocks of 2^32-1 samples: indices %r are all shard 0's, served by %s" % (far, owner0))
    details, code = bd.expect_error(
        lambda: clients[other].read("npy", npy["sources"], far, routing=huge),
        grpc.StatusCode.FAILED_PRECONDITION, "shard 0 of %d is owned by worker %s" %
        (NUM_SHARDS, owner0))
    bt.check(code == "BW_WRONG_OWNER", "... and refused at %s: %s" % (other, details))

    # Kill w2: only its shards move.
    workers["w2"].kill9()
    bt.poll(lambda: bt.workers_by_id(bt.status_json(coord.addr))["w2"]["state"] == "dead", 15,
            interval=0.02, what="status to show w2 dead")
    # The moment the worker table says dead, the placement no longer lists it.
    new = cc.placement(NUM_SHARDS)
    bt.check([w.id for w in new.workers] == ["w1", "w3"],
             "as soon as status shows w2 dead, the placement (version %d) lists only w1 and w3"
             % new.version, [w.id for w in new.workers])
    old_owner = [ids[o] for o in table.owners]
    new_owner = [[w.id for w in new.workers][o] for o in new.owners]
    moved = [s for s in range(NUM_SHARDS) if old_owner[s] != new_owner[s]]
    bt.check(new.version > table.version and
             all(old_owner[s] == "w2" for s in moved) and
             len(moved) == old_owner.count("w2"),
             "w2 killed: placement version %d -> %d moved exactly w2's %d shards %r" %
             (table.version, new.version, len(moved), moved))
    for wid in ("w1", "w3"):
        workers[wid].wait_log(r"placement version %d: 2 live workers" % new.version)
    del clients["w2"]
    # A client still routing by the old version is told to refresh by the new owner's peer.
    s_w1 = next(s for s in range(NUM_SHARDS) if new_owner[s] == "w1")
    bd.expect_error(lambda: clients["w3"].read("npy", npy["sources"], [s_w1],
                                               routing=routing(pbm, table.version)),
                    grpc.StatusCode.FAILED_PRECONDITION, "refresh placement")
    for d in datasets:
        info = clients["w1"].describe(d["format"], d["sources"])
        got = fetch_all(clients, new, d, info, pbm)
        bt.check(sum(got.values()) == info.length,
                 "%s: after w2 died all %d samples are served by %r" %
                 (d["format"], info.length, got))
    for wid in ("w1", "w3"):
        bt.check(workers[wid].running(), "worker %s still running" % wid)


if __name__ == "__main__":
    bt.main(test, timeout=120)
