"""Exact resume of `batchwire fetch` from a cursor, with a coordinator and three workers.

* For many random stopping points k (always including 1 = after step 0, the end of epoch 0,
  a point in the middle of the second epoch, and the very last batch), a rank stopped after
  its k-th batch (`--max-steps k --cursor-out FILE`) and reopened with `--resume CURSOR`
  delivers exactly the rest of an uninterrupted two-epoch run: the same (epoch, step, indices,
  padding, real, sha256), nothing repeated, nothing missing. The uninterrupted run itself is
  checked against `batchwire plan` and the generator's bytes. Two jobs: .npy in torch mode and
  TFRecord in accelerate mode (split_batches).
* Refusals (exit 1, a message naming the reason, no batch printed): a cursor of another job,
  of another rank of the same job, and corrupt cursors (truncated, not base64, bytes that are
  not a cursor, a flipped bit in the job fingerprint or the step: the checksum).
* A second live process claiming a rank that a live process holds is refused with
  ALREADY_EXISTS naming the holder's host and pid; once the holder is gone (SIGKILL) and its
  lease has expired (--lease-ms 500), the rank can be claimed again; after a clean exit
  (the lease is released) at once.

Stopping points come from a seeded random generator (BW_TEST_SEED overrides; the seed is
printed).
"""

import base64
import os
import random
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwtest as bt  # noqa: E402
import test_client_e2e as e2e  # noqa: E402

LEASE_MS = 500
LEASE_WAIT = LEASE_MS / 1000.0 + 0.3
FIELDS = ("epoch", "step", "indices", "padding", "real", "sha256")


def key(b):
    return tuple(tuple(b[f]) if isinstance(b[f], list) else b[f] for f in FIELDS)


def read_cursor(path):
    with open(path) as f:
        text = f.read().strip()
    if not text.startswith("bwc1:"):
        raise bt.TestFailure("--cursor-out wrote %r, not a bwc1: text cursor" % text)
    return text


def stopping_points(rng, per_epoch, total, count):
    """k values: 1, end of epoch 0, middle of epoch 1, the last batch, and random others."""
    ks = [1, per_epoch, per_epoch + per_epoch // 2, total, per_epoch + 1, total - 1]
    while len(ks) < count:
        ks.append(rng.randint(1, total))
    return ks[:count]


def scenario(cl, name, dataset, samples, c, rng, npoints):
    spec = dataset["spec"]
    n = dataset["num_samples"]
    want, equal = e2e.plans(c, n, e2e.WORLD)
    assert equal
    ref = e2e.fetch_all(cl.addr, name, spec, c)
    for r in range(e2e.WORLD):
        e2e.compare("%s rank %d (uninterrupted)" % (name, r), ref[r], want[r], samples)
    per_epoch = sum(1 for b in ref[0] if b["epoch"] == 0)
    total = len(ref[0])
    bt.ok("%s [%s]: uninterrupted run: %d batches per rank (%d per epoch) equal the plan and "
          "the generator's bytes" % (name, e2e.describe(c), total, per_epoch))
    time.sleep(LEASE_WAIT)

    points = [(i % e2e.WORLD, k) for i, k in enumerate(
        stopping_points(rng, per_epoch, total, npoints))]
    rng.shuffle(points)
    checked = 0
    cursors = {}
    # One round stops (and then resumes) up to one point per rank, concurrently.
    rounds = []
    for rank, k in points:
        for rd in rounds:
            if rank not in rd:
                rd[rank] = k
                break
        else:
            rounds.append({rank: k})
    for rd in rounds:
        stops = {}
        for rank, k in rd.items():
            path = os.path.join(cl.tmpdir, "%s-r%d-k%d.cursor" % (name, rank, k))
            stops[rank] = (k, path, e2e.Fetch(cl.addr, name, spec, c, rank, extra=[
                "--epochs", e2e.EPOCHS, "--max-steps", k, "--cursor-out", path]))
        for rank, (k, path, p) in stops.items():
            got, summary = p.ok(60, "%s rank %d stopped after %d batches" % (name, rank, k))
            if [key(b) for b in got] != [key(b) for b in ref[rank][:k]]:
                raise bt.TestFailure("%s rank %d: the first %d batches differ from the "
                                     "uninterrupted run's" % (name, rank, k))
            cursors[(rank, k)] = read_cursor(path)
        time.sleep(LEASE_WAIT)  # the stopped processes' leases expire
        resumes = {}
        for rank, (k, path, _) in stops.items():
            last = ref[rank][k - 1]
            epochs = e2e.EPOCHS - last["epoch"]
            resumes[rank] = (k, e2e.Fetch(cl.addr, name, spec, c, rank, extra=[
                "--epochs", epochs, "--resume", cursors[(rank, k)]]))
        for rank, (k, p) in resumes.items():
            got, _ = p.ok(60, "%s rank %d resumed after %d batches" % (name, rank, k))
            rest = ref[rank][k:]
            if [key(b) for b in got] != [key(b) for b in rest]:
                first = next((i for i, (a, b) in enumerate(zip(got, rest)) if key(a) != key(b)),
                             min(len(got), len(rest)))
                raise bt.TestFailure(
                    "%s rank %d resumed after batch %d (epoch %d step %d): %d batches, the "
                    "uninterrupted run has %d more; first difference at %d:\n got  %r\n want %r"
                    % (name, rank, k, ref[rank][k - 1]["epoch"], ref[rank][k - 1]["step"],
                       len(got), len(rest), first, got[first] if first < len(got) else None,
                       rest[first] if first < len(rest) else None))
            checked += len(got)
            bt.ok("%s rank %d stopped after batch %d/%d (epoch %d step %d), resumed from its "
                  "cursor: the remaining %d batches are identical" %
                  (name, rank, k, total, ref[rank][k - 1]["epoch"], ref[rank][k - 1]["step"],
                   len(got)))
        time.sleep(LEASE_WAIT)
    ks = sorted({k for _, k in points})
    bt.check(1 in ks and per_epoch in ks and total in ks and
             any(per_epoch < k < total for k in ks),
             "%s: %d stopping points %r include after step 0, the end of epoch 0, the second "
             "epoch and the last batch; %d resumed batches compared" %
             (name, len(points), ks, checked))
    return cursors


def refuse(cl, job, spec, c, rank, cursor, what, *needles):
    p = e2e.Fetch(cl.addr, job, spec, c, rank, extra=["--resume", cursor])
    err = p.refused(30)
    for nd in needles:
        if nd not in err:
            raise bt.TestFailure("%s: expected %r in the error, got:\n%s" % (what, nd, err))
    bt.ok("%s is refused (exit 1): %s" % (what, err.strip()[:220]))


def refusals(cl, spec, c, cursors):
    npy = spec["spec"]
    (r0, k0), cur = next(((rk, v) for rk, v in sorted(cursors.items()) if rk[1] > 1))
    # A cursor of another job with the same dataset and sampler.
    other = os.path.join(cl.tmpdir, "other.cursor")
    p = e2e.Fetch(cl.addr, "other-job", npy, c, r0, extra=["--max-steps", 2, "--cursor-out", other])
    p.ok(60)
    time.sleep(LEASE_WAIT)
    refuse(cl, "npy-resume", npy, c, r0, read_cursor(other), "a cursor of job other-job",
           "BW_MISMATCH", "other-job", "npy-resume")
    time.sleep(LEASE_WAIT)  # the refused open above joined before it saw the cursor's job
    # A cursor of another rank of the same job.
    wrong = (r0 + 1) % e2e.WORLD
    refuse(cl, "npy-resume", npy, c, wrong, cur, "rank %d's cursor used by rank %d" % (r0, wrong),
           "BW_MISMATCH", "rank %d" % r0)
    time.sleep(LEASE_WAIT)
    raw = base64.b64decode(cur[len("bwc1:"):])
    corrupt = [
        ("a truncated cursor", cur[:len(cur) - 3]),
        ("a cursor with characters that are not base64", cur[:8] + "*!" + cur[10:]),
        ("a cursor whose bytes are not a cursor",
         "bwc1:" + base64.b64encode(b"\xff\xfe\xfd\xfc not a cursor").decode()),
        ("a cursor cut to half its bytes",
         "bwc1:" + base64.b64encode(raw[:len(raw) // 2]).decode()),
        ("an unknown cursor text prefix", "bwc9:" + cur[5:]),
    ]
    for what, text in corrupt:
        refuse(cl, "npy-resume", npy, c, r0, text, what, "cursor")
    # A flipped bit in the fingerprint (protobuf field 3, fixed64: tag byte 0x19) or in the
    # step: the cursor's checksum catches both, rather than resuming elsewhere.
    tag = raw.index(b"\x19")
    flipped = bytearray(raw)
    flipped[tag + 3] ^= 0x10
    refuse(cl, "npy-resume", npy, c, r0, "bwc1:" + base64.b64encode(bytes(flipped)).decode(),
           "a cursor with a flipped bit in its job fingerprint", "BW_CORRUPT", "checksum")
    flipped = bytearray(raw)
    flipped[len(raw) - 6] ^= 0x01  # the last byte before the checksum field (the step)
    refuse(cl, "npy-resume", npy, c, r0, "bwc1:" + base64.b64encode(bytes(flipped)).decode(),
           "a cursor with a flipped bit in its step", "BW_CORRUPT", "checksum")


def fetch_blocked(cl, job, spec, c, rank):
    """A fetch whose stdout is never read: it blocks once the pipe is full, alive and holding
    its lease (its heartbeat thread keeps running)."""
    argv = [bt.CLI, "fetch", "--coordinator", cl.addr, "--job", job, "--dataset", spec,
            "--rank", str(rank), "--world-size", str(e2e.WORLD), "--epochs", "1000"] + \
        e2e.cfg_flags(c)
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, env=bt.child_env(),
                         start_new_session=True, preexec_fn=bt._child_setup)
    bt._register(p)
    return p


def rank_state(cl, job, rank):
    for j in bt.status_json(cl.addr)["jobs"]:
        if j["name"] == job:
            for r in j["ranks"]:
                if r["rank"] == rank:
                    return r
    return None


def duplicates(cl, spec, c):
    job = "dup-job"
    holder = fetch_blocked(cl, job, spec["spec"], c, 1)
    st = bt.poll(lambda: (lambda r: r if r and r.get("lease") == "live" and
                          r.get("pid") == holder.pid else None)(rank_state(cl, job, 1)),
                 20, interval=0.1, what="the first process to hold rank 1")
    time.sleep(2 * LEASE_MS / 1000.0)  # longer than a lease: it is kept alive by heartbeats
    bt.check(holder.poll() is None and rank_state(cl, job, 1)["lease"] == "live",
             "a live fetch (pid %d, blocked on its full stdout) keeps its lease past --lease-ms"
             % holder.pid)
    host = socket.gethostname()
    p = e2e.Fetch(cl.addr, job, spec["spec"], c, 1)
    err = p.refused(30)
    bt.check("BW_ALREADY_EXISTS" in err and ("host %s pid %d" % (host, holder.pid)) in err and
             ("pid %d" % p.pid) in err,
             "a second live process on rank 1 is refused with ALREADY_EXISTS naming the holder "
             "(host %s pid %d) and itself: %s" % (st["host"], holder.pid, err.strip()[-200:]),
             err)
    bt.check(rank_state(cl, job, 1)["pid"] == holder.pid and holder.poll() is None,
             "the holder keeps the rank and keeps running")
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()
    t0 = time.monotonic()

    def takeover():
        q = e2e.Fetch(cl.addr, job, spec["spec"], c, 1, extra=["--max-steps", 1])
        return q if q.wait(30) == 0 else None
    q = bt.poll(takeover, 10, interval=0.1, what="rank 1 to be free after its holder died")
    bt.check(q.result()[1]["batches"] == 1,
             "after SIGKILL of the holder, rank 1 was claimed again %.1f s later (lease %d ms)"
             % (time.monotonic() - t0, LEASE_MS))
    # A process that exits cleanly releases its rank (loader.h: bw_loader_close "Leaves the
    # job (the rank's lease is released)"): an immediate restart must not be refused.
    time.sleep(LEASE_WAIT)
    a = e2e.Fetch(cl.addr, job, spec["spec"], c, 2, extra=["--max-steps", 1])
    a.ok(30)
    b = e2e.Fetch(cl.addr, job, spec["spec"], c, 2, extra=["--max-steps", 1])
    rc = b.wait(30)
    bt.check(rc == 0, "a rank restarted right after a clean exit is not refused as a duplicate "
             "(bw_loader_close released the lease)", "exit %d: %s" % (rc, b.stderr()))


def test(tmpdir):
    seed = int(os.environ.get("BW_TEST_SEED", random.randrange(1 << 30)))
    bt.log("random stopping points: BW_TEST_SEED=%d" % seed)
    rng = random.Random(seed)
    cl = e2e.Cluster(tmpdir, lease_ms=LEASE_MS)
    npy = e2e.gen(cl, "npy", "npy", ["--num-samples", "301", "--shape", "3,5", "--dtype",
                                     "float64", "--files", "3"])
    tfr = e2e.gen(cl, "tfr", "tfrecord", ["--num-samples", "259", "--sample-bytes", "1",
                                          "--sample-bytes-max", "900", "--files", "3"])
    npy["spec"] = "npy:npy/part-*.npy"
    tfr["spec"] = "tfrecord:tfr/part-*.tfrecord"
    npy_samples = e2e.expected_samples(npy)
    tfr_samples = e2e.expected_samples(tfr)
    npoints = 12
    c_npy = dict(mode="torch", B=6, shuffle=True, seed=42)
    cursors = scenario(cl, "npy-resume", npy, npy_samples, c_npy, rng, npoints)
    c_tfr = dict(mode="accelerate", B=8, shuffle=True, seed=7, split_batches=True)
    scenario(cl, "tfr-resume", tfr, tfr_samples, c_tfr, rng, npoints)
    refusals(cl, npy, c_npy, cursors)
    duplicates(cl, npy, c_npy)
    cl.stop()


if __name__ == "__main__":
    bt.main(test, timeout=300)
