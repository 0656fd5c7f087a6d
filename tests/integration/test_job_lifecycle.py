"""How jobs end (docs/security.md, "Jobs"): a job whose ranks all left after their last epoch
is removed; a job idle past --job-ttl is removed, but not while a lease is live; every removal
is journaled (a restarted coordinator does not bring the job back, also from a snapshot); and
the global --max-jobs quota names itself. A removed job created again resumes from a saved
cursor exactly (the batches after it equal those of an uninterrupted run)."""

import json
import os
import time

import bwtest as bt
import jobs_rpc as jr

pb = jr.pb


def fetch(coord, job, extra=(), timeout=60):
    r = bt.cli("fetch", "--coordinator", coord.addr, "--job", job, "--dataset", "npy:d/*.npy",
               "--rank", "0", "--world-size", "1", "--batch-size", "8", "--shuffle", "--seed",
               "3", *extra, timeout=timeout)
    if r.returncode != 0:
        raise bt.TestFailure("fetch %s %s exited %d:\n%s" % (job, " ".join(extra), r.returncode,
                                                             r.stderr[-800:]))
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


def batches(lines):
    return [(o["epoch"], o["step"], tuple(o["indices"])) for o in lines if "indices" in o]


def exists(c, name):
    try:
        c.get(name)
        return True
    except jr.CallError as e:
        if e.code == jr.grpc.StatusCode.NOT_FOUND:
            return False
        raise


def test(tmp):
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    r = bt.cli("gen", "--format", "npy", "--out", os.path.join(data, "d"), "--num-samples", "40",
               "--shape", "4", "--dtype", "float32")
    bt.check(r.returncode == 0, "batchwire gen", r.stderr)
    coord = bt.coordinator(tmp, args=["--max-jobs", "6"])
    worker = bt.worker(tmp, coord.addr, "w1")
    bt.poll(lambda: any(w["state"] == "alive" for w in bt.status_json(coord.addr)["workers"]),
            10, what="worker alive")
    c = jr.Jobs(coord.addr)

    bt.log("===== finished: every rank left after its last epoch =====")
    fetch(coord, "two-epochs", ["--epochs", "1", "--job-epochs", "2"])
    bt.check(exists(c, "two-epochs"), "after epoch 0 of 2 the job stays")
    # From the end of epoch 0 (the committed cursor), two more loop turns: the rest of epoch 0
    # (nothing) and epoch 1, the last.
    fetch(coord, "two-epochs", ["--epochs", "2", "--job-epochs", "2"])
    bt.check(not exists(c, "two-epochs"), "after the last epoch the job is removed")
    bt.check(any("two-epochs" in line and "removed" in line and "last epoch" in line
                 for line in open(coord.log_path)), "and the removal is logged with its reason")
    fetch(coord, "no-epochs", ["--epochs", "1"])
    bt.check(exists(c, "no-epochs"), "a job whose ranks did not say how many epochs stays")

    bt.log("===== a removed job created again resumes from a saved cursor =====")
    whole = batches(fetch(coord, "resume-ref", ["--epochs", "2"]))
    cursor = os.path.join(tmp, "cursor")
    first = batches(fetch(coord, "resume", ["--epochs", "1", "--max-steps", "3",
                                            "--cursor-out", cursor]))
    r = bt.cli("job", "delete", "--coordinator", coord.addr, "--job", "resume")
    bt.check(r.returncode == 0 and not exists(c, "resume"), "job deleted", r.stderr)
    with open(cursor) as f:
        text = f.read().strip()
    rest = batches(fetch(coord, "resume", ["--epochs", "2", "--resume", text]))
    bt.check([b[1:] for b in first + rest] == [b[1:] for b in whole] and
             [b[0] for b in first + rest] == [b[0] for b in whole],
             "3 batches, delete, create again, resume: the %d batches equal one run's" %
             len(whole))

    r = bt.cli("job", "delete", "--coordinator", coord.addr, "--job", "resume-ref")
    bt.check(r.returncode == 0, "resume-ref deleted", r.stderr)

    bt.log("===== --max-jobs names itself =====")
    for i in range(10):
        try:
            c.create("fill-%d" % i, samples=10, batch=2, world=1)
        except jr.CallError as e:
            bt.check(e.code == jr.grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-jobs" in e.details
                     and "job delete" in e.details,
                     "job %d is over --max-jobs: RESOURCE_EXHAUSTED naming it" % i, e.details)
            break
    else:
        raise bt.TestFailure("--max-jobs 6 never refused a job")

    bt.log("===== removals survive restarts (journal, then snapshot) =====")
    bt.check(coord.stop() == 0, "SIGTERM")
    coord = bt.coordinator(tmp, name="coordinator-2", state_dir=coord.state_dir,
                           args=["--snapshot-bytes", "1"])
    c = jr.Jobs(coord.addr)
    bt.check(not exists(c, "two-epochs") and not exists(c, "resume-ref") and
             exists(c, "no-epochs"), "after a restart (replay) the removed jobs stay removed")
    coord.wait_log(r"compacted", timeout=10)
    c.close()
    bt.check(coord.stop() == 0, "SIGTERM")
    coord = bt.coordinator(tmp, name="coordinator-3", state_dir=coord.state_dir)
    c = jr.Jobs(coord.addr)
    bt.check(not exists(c, "two-epochs") and not exists(c, "resume-ref") and
             exists(c, "no-epochs"), "and after a restart from the snapshot")
    c.close()
    bt.check(coord.stop() == 0, "the coordinator stops cleanly")

    bt.log("===== idle past --job-ttl (3 s) =====")
    coord = bt.coordinator(tmp, name="coordinator-ttl", args=["--job-ttl", "3"])
    c = jr.Jobs(coord.addr)
    c.create("idle", samples=100, batch=10, world=1)
    held = c.create("held", samples=100, batch=10, world=1)
    lease = c.join("held", 0, 1, host="h", pid=1)
    t0 = time.monotonic()
    while exists(c, "idle") and time.monotonic() - t0 < 10:
        c.heartbeat("held", 0, lease)
        time.sleep(0.25)
    took = time.monotonic() - t0
    bt.check(not exists(c, "idle") and 2.5 < took < 8,
             "an idle job is removed after --job-ttl (%.1f s)" % took)
    for _ in range(12):  # 3 s more: the held job's lease is live through heartbeats
        c.heartbeat("held", 0, lease)
        time.sleep(0.25)
    bt.check(exists(c, "held"), "a job with a live lease is not removed however idle", held)
    bt.check("idle for" in open(coord.log_path).read(), "the removal is logged with its reason")
    c.close()
    bt.check(coord.stop() == 0, "the coordinator stops cleanly")


if __name__ == "__main__":
    bt.main(test, timeout=180)
