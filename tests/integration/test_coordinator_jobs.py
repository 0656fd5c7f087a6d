"""The coordinator's Jobs service end to end, with real processes on loopback.

* Job creation: refused without a live worker; a real worker describes an .npy dataset;
  idempotent by name; a different configuration is refused listing the differing fields;
  malformed requests get INVALID_ARGUMENT naming the field.
* Ranks: a second live holder of a rank gets ALREADY_EXISTS naming both holders; the same
  holder joining again keeps its lease; after the holder's lease expires the rank is taken
  over, and the old holder's heartbeats and commits are refused naming the new one.
* Cursors: a cursor of another job is refused naming that job; corrupt cursors and cursors
  past the end of the epoch are refused; the base64 text form is accepted.
* Elastic resume: an inconsistent set of cursors is refused naming the ranks that disagree
  (and missing ranks); a consistent set records a new world-size segment, revokes the old
  leases, and new ranks start at the resume point; a retry changes nothing.
* Leaving (LeaveJob, default 10 s lease): only the current lease releases the rank, which
  another holder then takes at once; a wrong or old lease id releases nothing; a released
  lease stays released across a restart; two `batchwire fetch --max-steps 1` runs of one rank
  in a row (the second with --resume) both succeed without waiting for the lease.
* `batchwire status` shows jobs and ranks (table and --json).
* Durability: a restart keeps everything; a second coordinator on the same state directory
  refuses to start; a flipped bit in the middle of the journal stops the start naming the
  file and offset, and --truncate-journal-at FILE:OFFSET recovers what precedes it.
"""

import base64
import os
import re
import sys
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwtest as bt  # noqa: E402
import jobs_rpc as jr  # noqa: E402

pb = jr.pb
LEASE_MS = 800
FP = grpc.StatusCode.FAILED_PRECONDITION
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def npy_config(path="ds/x.npy", batch=4, shuffle=True, seed=1):
    return pb.JobConfig(dataset=jr.data_pb2.Dataset(format="npy", sources=[path]),
                        sampler=pb.SamplerConfig(mode=jr.TORCH, batch_size=batch,
                                                 shuffle=shuffle, seed=seed))


def creation(tmp, coord, c):
    bt.log("===== job creation =====")
    req = pb.GetOrCreateJobRequest(name="imagenet", config=npy_config(), world_size=2)
    e = c.expect_error("GetOrCreateJob", req, grpc.StatusCode.UNAVAILABLE)
    bt.check_in("no live storage worker", e.details, "creation without a worker is UNAVAILABLE")

    data = os.path.join(tmp, "data", "ds")
    os.makedirs(data, exist_ok=True)
    np.save(os.path.join(data, "x.npy"), np.arange(100 * 3, dtype=np.float32).reshape(100, 3))
    w = bt.worker(tmp, coord.addr, "w1")
    bt.poll(lambda: any(x["state"] == "alive" for x in bt.status_json(coord.addr)["workers"]),
            10, what="worker w1 alive")
    r = c.call("GetOrCreateJob", req)
    bt.check(r.created and r.job.dataset.length == 100 and r.job.dataset.format == "npy" and
             r.job.dataset.fingerprint != "",
             "a live worker described the dataset: %d samples, fingerprint %s" %
             (r.job.dataset.length, r.job.dataset.fingerprint[:16]))
    fp = r.job.fingerprint
    r2 = c.call("GetOrCreateJob", req)
    bt.check(not r2.created and r2.job.fingerprint == fp,
             "the same name and configuration joins the job (created=false, same fingerprint)")
    other = pb.GetOrCreateJobRequest(name="imagenet", config=npy_config(batch=8, shuffle=False),
                                     world_size=2)
    e = c.expect_error("GetOrCreateJob", other, FP)
    bt.check(e.bw == "BW_MISMATCH", "a different configuration is refused with BW_MISMATCH")
    bt.check_in("sampler.batch_size: job has 4, request has 8", e.details,
                "the mismatch names the batch size")
    bt.check_in("sampler.shuffle: job has true, request has false", e.details,
                "the mismatch names shuffle")
    bt.check("seed" not in e.details, "fields that agree are not listed", e.details)

    missing = pb.GetOrCreateJobRequest(name="nope", config=npy_config(path="ds/missing.npy"),
                                       world_size=2)
    e = c.expect_error("GetOrCreateJob", missing)
    bt.check("w1" in e.details and "missing.npy" in e.details,
             "a dataset the worker cannot read is refused naming worker and file: %s" %
             e.details[:150])

    bad = [
        (pb.GetOrCreateJobRequest(name="", config=npy_config(), world_size=2), "job name"),
        (pb.GetOrCreateJobRequest(name="a b", config=npy_config(), world_size=2), "character 2"),
        (pb.GetOrCreateJobRequest(name="x", world_size=2), "config is required"),
        (pb.GetOrCreateJobRequest(name="x", config=npy_config(), world_size=0), "world_size 0"),
        (pb.GetOrCreateJobRequest(name="x", config=pb.JobConfig(
            synthetic_samples=10, sampler=pb.SamplerConfig(batch_size=1)), world_size=1),
         "sampler.mode is required"),
        (pb.GetOrCreateJobRequest(name="x", config=pb.JobConfig(
            synthetic_samples=10, sampler=pb.SamplerConfig(mode=jr.TORCH)), world_size=1),
         "batch_size 0"),
        (pb.GetOrCreateJobRequest(name="x", config=pb.JobConfig(
            synthetic_samples=10, sampler=pb.SamplerConfig(
                mode=jr.ACCELERATE, batch_size=3, split_batches=True)), world_size=2),
         "refused"),
    ]
    # Checked against the described dataset by the coordinator itself, whatever the client:
    # iterable mode needs a stream format; a pre-sharded dataset is never sharded again.
    ds = jr.data_pb2.Dataset(format="npy", sources=["ds/x.npy"])
    bad.append((pb.GetOrCreateJobRequest(name="it", config=pb.JobConfig(
        dataset=ds, sampler=pb.SamplerConfig(mode=jr.ITERABLE, batch_size=4)), world_size=1),
        "iterable mode reads streams"))
    ds_pre = jr.data_pb2.Dataset(format="npy", sources=["ds/x.npy"], pre_sharded=True)
    bad.append((pb.GetOrCreateJobRequest(name="pre", config=pb.JobConfig(
        dataset=ds_pre, sampler=pb.SamplerConfig(mode=jr.TORCH, batch_size=4)), world_size=1),
        "double sharding"))
    for req_, needle in bad:
        e = c.expect_error("GetOrCreateJob", req_, INVALID)
        bt.check_in(needle, e.details, "malformed creation refused")
    w.stop()
    return fp


def ranks(c):
    bt.log("===== ranks and leases =====")
    c.create("ranks", samples=1000, batch=10, world=2)
    a = c.join("ranks", 0, 2, host="node-a", pid=11)
    e = c.expect_error("JoinJob", pb.JoinJobRequest(job="ranks", rank=0, world_size=2,
                                                   holder=pb.Holder(host="node-b", pid=22)),
                       grpc.StatusCode.ALREADY_EXISTS)
    bt.check("node-a pid 11" in e.details and "node-b pid 22" in e.details,
             "a second live holder is refused naming both: %s" % e.details[:120])
    again = c.join("ranks", 0, 2, host="node-a", pid=11)
    bt.check(jr.lease(again) != jr.lease(a) and again.lease_id_hi != 0,
             "the same holder joining again gets a new 128-bit lease (a lease id is told once)")
    c.expect_error("LeaseHeartbeat", pb.LeaseHeartbeatRequest(job="ranks", rank=0,
                                                             **jr.lease_fields(a)), FP)
    bt.ok("and the lease it replaces stops working")
    a = again
    for _ in range(int(1.5 * LEASE_MS / 200)):
        hb = c.heartbeat("ranks", 0, a)
        time.sleep(0.2)
    bt.check(hb.lease_ms == LEASE_MS and hb.world_size == 2, "heartbeats keep the lease")
    e = c.expect_error("JoinJob", pb.JoinJobRequest(job="ranks", rank=0, world_size=2,
                                                   holder=pb.Holder(host="node-b", pid=22)),
                       grpc.StatusCode.ALREADY_EXISTS)
    bt.ok("still refused after %.1f lease periods of heartbeats" % 1.5)
    time.sleep(LEASE_MS / 1000 * 1.5)
    b = c.join("ranks", 0, 2, host="node-b", pid=22)
    bt.check(jr.lease(b) != jr.lease(a), "after the holder's lease expired, another takes the rank")
    e = c.expect_error("LeaseHeartbeat", pb.LeaseHeartbeatRequest(job="ranks", rank=0,
                                                                 **jr.lease_fields(a)), FP)
    bt.check_in("node-b pid 22", e.details, "the old holder's heartbeat is refused naming the new")
    fp = c.get("ranks").job.fingerprint
    e = c.expect_error("CommitCursor", pb.CommitCursorRequest(
        job="ranks", rank=0, **jr.lease_fields(a), cursor=jr.cursor(fp, "ranks", 0, 2, 0, 1)), FP)
    bt.ok("the old holder's commit is refused")
    e = c.expect_error("JoinJob", pb.JoinJobRequest(job="ranks", rank=1, world_size=3,
                                                   holder=pb.Holder(host="n", pid=1)), FP)
    bt.check_in("resume the job elastically", e.details, "a different world size is refused")
    e = c.expect_error("JoinJob", pb.JoinJobRequest(job="ranks", rank=1, world_size=2), INVALID)
    bt.check_in("holder", e.details, "a join without a holder is refused")
    e = c.expect_error("JoinJob", pb.JoinJobRequest(job="nosuch", rank=0, world_size=2,
                                                   holder=pb.Holder(host="n", pid=1)),
                       grpc.StatusCode.NOT_FOUND)
    bt.ok("a join of an unknown job is NOT_FOUND")
    return b


def cursors(c, b):
    bt.log("===== cursors =====")
    fp = c.get("ranks").job.fingerprint
    other = c.create("other", samples=500, batch=5, world=2).job
    e = c.expect_error("CommitCursor", pb.CommitCursorRequest(
        job="ranks", rank=0, **jr.lease_fields(b),
        cursor=jr.cursor(other.fingerprint, "other", 0, 2, 0, 3)), FP)
    bt.check(e.bw == "BW_MISMATCH" and "job 'other'" in e.details,
             "a cursor of another job is refused naming that job: %s" % e.details[:100])
    e = c.expect_error("CommitCursor", pb.CommitCursorRequest(
        job="ranks", rank=0, **jr.lease_fields(b), cursor=b"\x08\x01garbage"), INVALID)
    bt.check_in("cursor", e.details, "a corrupt cursor is refused")
    e = c.expect_error("CommitCursor", pb.CommitCursorRequest(
        job="ranks", rank=0, **jr.lease_fields(b),
        cursor=jr.cursor(fp, "ranks", 0, 2, 0, 51)), grpc.StatusCode.OUT_OF_RANGE)
    bt.check_in("past the end of epoch 0", e.details, "a step past the epoch's end is refused")
    text = b"bwc1:" + base64.b64encode(jr.cursor(fp, "ranks", 0, 2, 1, 7))
    c.commit("ranks", 0, b, text)
    g = c.get("ranks")
    bt.check(g.ranks[0].committed and g.ranks[0].epoch == 1 and g.ranks[0].step == 7,
             "a text cursor is accepted and recorded (epoch 1 step 7)")


def elastic(c):
    bt.log("===== elastic resume =====")
    job = c.create("elastic", samples=1000, batch=10, world=4).job
    fp = job.fingerprint
    twin = c.create("elastic-twin", samples=1000, batch=10, world=4).job
    bt.check(twin.fingerprint != fp, "two jobs with one configuration have different fingerprints")
    leases = [c.join("elastic", r, 4, host="old", pid=100 + r) for r in range(4)]
    curs = [jr.cursor(fp, "elastic", r, 4, 0, 10) for r in range(4)]
    for r in range(4):
        c.commit("elastic", r, leases[r], curs[r])
    bad = list(curs)
    bad[2] = jr.cursor(fp, "elastic", 2, 4, 0, 9)
    e = c.expect_error("ResumeElastic", pb.ResumeElasticRequest(job="elastic", world_size=2,
                                                               cursors=bad), FP)
    bt.check("epoch 0 step 9: rank 2" in e.details and "epoch 0 step 10: ranks 0,1,3" in e.details,
             "inconsistent cursors are refused naming the ranks that disagree: %s" %
             e.details[:140])
    e = c.expect_error("ResumeElastic", pb.ResumeElasticRequest(job="elastic", world_size=2,
                                                               cursors=curs[:3]), INVALID)
    bt.check_in("lack rank(s) 3", e.details, "a missing rank is named")
    r = c.resume("elastic", 2, curs)
    h = [(s.epoch, s.start_step, s.world_size) for s in r.job.history]
    bt.check(r.resumed and r.job.world_size == 2 and h == [(0, 0, 4), (0, 10, 2)],
             "consistent cursors record a new segment: %s" % h)
    r2 = c.resume("elastic", 2, curs)
    bt.check(not r2.resumed and len(r2.job.history) == 2, "the same resume again changes nothing")
    e = c.expect_error("LeaseHeartbeat", pb.LeaseHeartbeatRequest(job="elastic", rank=0,
                                                                 **jr.lease_fields(leases[0])), FP)
    bt.check_in("resumed with world size 2", e.details, "old leases are revoked by the resume")
    e = c.expect_error("JoinJob", pb.JoinJobRequest(job="elastic", rank=3, world_size=4,
                                                   holder=pb.Holder(host="old", pid=103)), FP)
    bt.ok("joining with the old world size is refused")
    j = c.join("elastic", 1, 2, host="new", pid=201)
    cur = jr.decode_cursor(j.cursor)
    bt.check((cur.rank, cur.world_size, cur.epoch, cur.step) == (1, 2, 0, 10),
             "a new rank starts at the resume point (rank 1/2, epoch 0, step 10)")
    c.commit("elastic", 1, j, jr.cursor(fp, "elastic", 1, 2, 0, 12))
    e = c.expect_error("CommitCursor", pb.CommitCursorRequest(
        job="elastic", rank=1, **jr.lease_fields(j), cursor=jr.cursor(fp, "elastic", 1, 2, 0, 9)),
        FP)
    bt.check_in("precedes the start of world size 2", e.details,
                "a cursor before the resume point is refused")


def leave(tmp):
    bt.log("===== leaving a job (default 10 s lease) =====")
    coord = bt.coordinator(tmp, name="leave-coordinator")
    c = jr.Jobs(coord.addr)
    c.create("leave", samples=100, batch=10, world=2)
    a = c.join("leave", 0, 2, host="node-a", pid=11)
    c.join("leave", 1, 2, host="node-a", pid=12)
    other = pb.JoinJobRequest(job="leave", rank=0, world_size=2,
                              holder=pb.Holder(host="node-b", pid=22))
    r = c.leave("leave", 0, (a.lease_id, a.lease_id_hi ^ 1))
    bt.check(not r.released, "a wrong lease id releases nothing (released=false)")
    c.expect_error("JoinJob", other, grpc.StatusCode.ALREADY_EXISTS)
    bt.ok("and the rank stays held by its holder")
    e = c.expect_error("LeaveJob", pb.LeaveJobRequest(job="leave", rank=0), INVALID)
    bt.check_in("lease_id is required", e.details, "a leave without a lease id is refused")
    c.expect_error("LeaveJob", pb.LeaveJobRequest(job="nosuch", rank=0, lease_id=1),
                   grpc.StatusCode.NOT_FOUND)
    bt.ok("a leave of an unknown job is NOT_FOUND")

    t0 = time.monotonic()
    r = c.leave("leave", 0, a)
    bt.check(r.released, "the holder's leave releases its lease")
    bt.check(c.get("leave").ranks[0].lease == pb.LEASE_STATE_NONE, "GetJob shows no lease")
    b = c.call("JoinJob", other)
    bt.check(jr.lease(b) != jr.lease(a) and time.monotonic() - t0 < 5,
             "another holder takes the rank at once (%.2f s, lease 10 s)" % (time.monotonic() - t0))
    r = c.leave("leave", 0, a)
    bt.check(not r.released, "the old lease leaving again (a retry) succeeds and releases nothing")
    e = c.expect_error("LeaseHeartbeat", pb.LeaseHeartbeatRequest(job="leave", rank=0,
                                                                 **jr.lease_fields(a)), FP)
    bt.check_in("node-b pid 22", e.details, "the new holder keeps the rank")
    c.heartbeat("leave", 0, b)
    bt.check(c.leave("leave", 0, b).released, "the new holder leaves too")

    c.close()
    bt.check(coord.stop() == 0, "SIGTERM stops the coordinator")
    coord = bt.coordinator(tmp, name="leave-restarted", state_dir=coord.state_dir)
    c = jr.Jobs(coord.addr)
    g = c.get("leave")
    bt.check(g.ranks[0].lease == pb.LEASE_STATE_NONE and g.ranks[1].lease == pb.LEASE_STATE_LIVE,
             "after a restart the released lease stays released (the held one is renewed)")
    c.expect_error("LeaseHeartbeat", pb.LeaseHeartbeatRequest(job="leave", rank=0,
                                                             **jr.lease_fields(b)), FP)
    c.join("leave", 0, 2, host="node-c", pid=33)
    bt.ok("a released lease cannot heartbeat after the restart; a new holder joins at once")

    bt.log("----- two `batchwire fetch` runs of one rank in a row -----")
    w = bt.worker(tmp, coord.addr, "leave-w1")
    out = os.path.join(tmp, "data", "leave")
    r = bt.cli("gen", "--format", "npy", "--out", out, "--num-samples", "64", "--shape", "3",
               "--dtype", "float32")
    bt.check(r.returncode == 0, "batchwire gen wrote an npy dataset", r.stderr)
    bt.poll(lambda: any(x["state"] == "alive" for x in bt.status_json(coord.addr)["workers"]),
            10, what="worker leave-w1 alive")
    cursor_file = os.path.join(tmp, "leave.cursor")
    common = ["fetch", "--coordinator", coord.addr, "--job", "leave-fetch", "--dataset",
              "npy:leave/*.npy", "--rank", "0", "--world-size", "1", "--batch-size", "4",
              "--max-steps", "1", "--quiet"]
    for run, extra in (("first", ["--cursor-out", cursor_file]), ("second", None)):
        if extra is None:
            with open(cursor_file) as f:
                extra = ["--resume", f.read().strip()]
        t0 = time.monotonic()
        r = bt.cli(*(common + extra), timeout=30)
        took = time.monotonic() - t0
        bt.check(r.returncode == 0 and took < 5,
                 "the %s fetch of rank 0 succeeds without waiting for the lease (%.2f s)" %
                 (run, took), r.stdout + r.stderr)
    g = c.get("leave-fetch")
    bt.check(g.ranks[0].lease == pb.LEASE_STATE_NONE, "a fetch that closes cleanly leaves the job")
    c.close()
    w.stop()
    bt.check(coord.stop() == 0, "the coordinator stops cleanly")


def status(coord):
    bt.log("===== batchwire status =====")
    st = bt.status_json(coord.addr)
    jobs = {j["name"]: j for j in st["jobs"]}
    bt.check(set(jobs) >= {"imagenet", "ranks", "other", "elastic", "elastic-twin"},
             "status --json lists the jobs: %s" % sorted(jobs))
    e = jobs["elastic"]
    bt.check(e["world_size"] == 2 and len(e["history"]) == 2 and e["ranks"][1]["host"] == "new" and
             e["ranks"][1]["step"] == 12 and e["ranks"][1]["lease"] == "live",
             "status --json shows ranks, leases, steps and history")
    r = bt.cli("status", "--coordinator", coord.addr)
    bt.check(r.returncode == 0 and "job elastic" in r.stdout and "new:201" in r.stdout,
             "the status table shows jobs and ranks", r.stdout + r.stderr)
    return st


def durability(tmp, coord, c, before):
    bt.log("===== restart, lock, corruption =====")
    second = bt.coordinator(tmp, name="second", state_dir=coord.state_dir, wait=False)
    bt.check(second.wait(10) == 1, "a second coordinator on the same state directory exits 1")
    bt.check_in("in use by another coordinator", second.log_text(), "it says why")
    c.close()
    bt.check(coord.stop() == 0, "SIGTERM stops the coordinator")
    coord2 = bt.coordinator(tmp, name="restarted", state_dir=coord.state_dir,
                            args=["--lease-ms", LEASE_MS])
    coord2.wait_log(r"state: .* replayed")
    after = bt.status_json(coord2.addr)

    def strip(st):
        return {j["name"]: (j["fingerprint"], j["history"],
                            [(r["rank"], r.get("host"), r["committed"], r["epoch"], r["step"])
                             for r in j["ranks"]]) for j in st["jobs"]}
    bt.check(strip(after) == strip(before), "a restart keeps every job, lease and cursor")
    coord2.stop()

    journals = sorted(f for f in os.listdir(coord.state_dir) if re.match(r"journal-\d{20}$", f))
    path = os.path.join(coord.state_dir, journals[-1])
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size // 2)
        b = f.read(1)
        f.seek(size // 2)
        f.write(bytes([b[0] ^ 0x10]))
    bad = bt.coordinator(tmp, name="corrupt", state_dir=coord.state_dir, wait=False)
    bt.check(bad.wait(10) == 1, "a journal corrupt in the middle stops the start (exit 1)")
    m = re.search(r"(journal-\d{20}) is corrupt at offset (\d+).*--truncate-journal-at (\S+)",
                  bad.log_text())
    bt.check(m is not None, "the message names the file and the offset: %s" %
             (m.group(0)[:100] if m else bad.log_text()))
    fixed = bt.coordinator(tmp, name="truncated", state_dir=coord.state_dir,
                           args=["--truncate-journal-at", "%s:%s" % (m.group(1), m.group(2))])
    fixed.wait_log("truncated at offset %s as asked" % m.group(2))
    st = bt.status_json(fixed.addr)
    bt.check(len(st["jobs"]) >= 1, "--truncate-journal-at recovers the records before it "
             "(%d jobs)" % len(st["jobs"]))
    bt.check(fixed.stop() == 0, "and the coordinator runs and stops cleanly")


def test(tmp):
    coord = bt.coordinator(tmp, args=["--lease-ms", LEASE_MS, "--heartbeat-ms", 200])
    c = jr.Jobs(coord.addr)
    creation(tmp, coord, c)
    b = ranks(c)
    cursors(c, b)
    elastic(c)
    st = status(coord)
    durability(tmp, coord, c, st)
    leave(tmp)  # its own coordinator, with the default lease


if __name__ == "__main__":
    bt.main(test, timeout=90)
