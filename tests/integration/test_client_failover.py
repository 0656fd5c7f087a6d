"""Worker failover under four trainer ranks, and clear failures instead of hangs.

* A fault-free run of four concurrent `batchwire fetch` ranks (two epochs, .npy, torch mode
  with shuffle) is checked against `batchwire plan` and the generator's bytes.
* The same job again under another name: while all four ranks are mid-epoch, one of the three
  workers is SIGKILLed. The ranks are held mid-epoch by backpressure on their stdout (a
  one-page pipe the test stops reading) and released just before the kill, so that it lands
  while they are fetching again. Before the kill the test proves the victim was serving these ranks: the kernel's
  per-socket counters (`ss`) show bytes it sent on its data connections, and batches already
  delivered contain samples of shards the coordinator's placement assigns to it. Afterwards
  every rank's whole sequence (epoch, step, indices, padding, real, sha256) must equal the
  fault-free run's, and every fetch process must exit 0 within a timeout (no hang). This runs
  twice: with sample bytes over the workers' data channels (w2 killed), then with
  `--transport grpc` (w3 killed).
* `--device cuda:0` on a machine without a GPU fails with exit 1 and BW_NO_DEVICE before the
  rank is claimed (the rank can be taken at once by another process; no job is created).
* With every worker dead -- killed under a running rank, and before a rank starts -- fetch
  exits 1 with a message saying the samples could not be fetched, within a bounded time
  (about 2 x --timeout-ms), instead of hanging.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bwdata as bd  # noqa: E402
import bwtest as bt  # noqa: E402
import test_client_e2e as e2e  # noqa: E402
from test_client_resume import key, LEASE_MS, LEASE_WAIT  # noqa: E402

NUM_SHARDS = bd.LOADER_SHARDS  # the loader routes by blocks of samples, modulo 256
CFG = dict(mode="torch", B=16, shuffle=True, seed=5)
SPEC = "npy:big/part-*.npy"
GATE = 20
TIMEOUT_MS = 2000
# A fetch gives up within about 2 x --timeout-ms (the fetch thread's deadline, then one more
# attempt by bw_loader_next); allow for a loaded machine.
LIMIT_S = 5 * TIMEOUT_MS / 1000.0


def bytes_sent_by(pid, ports):
    """Bytes the kernel says process `pid` sent on established TCP connections whose local
    port is one of `ports` (its listeners' accepted connections: gRPC and data channel)."""
    r = subprocess.run(["ss", "-tnpiH", "state", "established"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=20)
    total, conns = 0, 0
    lines = r.stdout.splitlines()
    for i, line in enumerate(lines):
        if ("pid=%d," % pid) not in line:
            continue
        fields = line.split()
        local = fields[2] if len(fields) > 2 else ""
        if not any(local.endswith(":%d" % port) for port in ports):
            continue
        info = lines[i + 1] if i + 1 < len(lines) else ""
        m = re.search(r"bytes_sent:(\d+)", info)
        if m:
            total += int(m.group(1))
            conns += 1
    return total, conns


def gpu_present():
    return any(n.startswith("nvidia") and n[6:].isdigit() for n in os.listdir("/dev"))


def job_names(cl):
    return [j["name"] for j in bt.status_json(cl.addr)["jobs"]]


def rank_holder(cl, job, rank):
    for j in bt.status_json(cl.addr)["jobs"]:
        if j["name"] == job:
            for r in j["ranks"]:
                if r["rank"] == rank:
                    return r
    return None


def device_check(cl):
    if gpu_present():
        bt.log("a GPU is present: skipping the no-device check")
        return
    # A new job: refused before anything is created.
    p = e2e.Fetch(cl.addr, "gpu-job", SPEC, CFG, 0, extra=["--device", "cuda:0"])
    err = p.refused(30)
    bt.check("BW_NO_DEVICE" in err and "cuda:0" in err,
             "--device cuda:0 without a GPU: exit 1 with BW_NO_DEVICE: %s" % err.strip()[-200:], err)
    bt.check("gpu-job" not in job_names(cl), "... and the job was not created")
    # An existing job: the rank is not claimed, so another process takes it at once.
    p = e2e.Fetch(cl.addr, "ref", SPEC, CFG, 3, extra=["--device", "cuda:0"])
    err = p.refused(30)
    h = rank_holder(cl, "ref", 3)
    bt.check("BW_NO_DEVICE" in err and h.get("pid") != p.pid,
             "--device cuda:0 on job ref rank 3: BW_NO_DEVICE, and rank 3 is not held by it "
             "(holder pid %s, lease %s)" % (h.get("pid"), h.get("lease")), err)
    q = e2e.Fetch(cl.addr, "ref", SPEC, CFG, 3, extra=["--max-steps", 2])
    got, _ = q.ok(30, "rank 3 right after the refused --device open")
    bt.check(len(got) == 2, "rank 3 is claimed by a host-memory fetch right after the refusal")


def placement_table(cl, num_shards):
    """Placement.Get through python3-grpcio in a child process: grpcio used in this process
    between the forks that start fetch processes tripped its thread-pool assertion
    (state_ == State::kRunning) and aborted the test."""
    code = ("import json, sys; sys.path.insert(0, %r); import bwdata as bd; "
            "dc = bd.DataClient(%r, %r); t = dc.placement(%d); "
            "print(json.dumps({'version': t.version, 'ids': [w.id for w in t.workers], "
            "'owners': list(t.owners)}))" % (HERE, cl.tmpdir, cl.addr, num_shards))
    r = bt.run([sys.executable, "-c", code], timeout=30)
    if r.returncode != 0:
        raise bt.TestFailure("Placement.Get failed (%d): %s" % (r.returncode, r.stderr))
    return json.loads(r.stdout.strip().splitlines()[-1])


def release_and_kill(cl, ranks, victim):
    """Lets the held ranks go on and SIGKILLs the victim worker 5 ms later, while they read;
    returns the monotonic time of the kill."""
    for p in ranks:
        p.open_gate()
    time.sleep(0.005)
    cl.workers[victim].send(signal.SIGKILL)
    t_kill = time.monotonic()
    cl.workers[victim].proc.wait(10)
    return t_kill


def failover(cl, ref, want, samples, ds, victim="w2", transport="auto"):
    job = "failover-" + transport
    fo = [e2e.Fetch(cl.addr, job, SPEC, CFG, r, gate_after=GATE,
                    extra=["--epochs", e2e.EPOCHS, "--prefetch", 2, "--timeout-ms", 5000,
                           "--transport", transport])
          for r in range(e2e.WORLD)]
    total = len(ref[0])
    per_epoch = total // e2e.EPOCHS
    # Each rank is held by backpressure once the test has read GATE of its lines (stdout is
    # not read further: the rank blocks a few dozen batches later, whatever the machine's
    # load), so the kill finds every rank in the middle of epoch 0. The gates open just before
    # the kill, so the ranks are fetching again when it lands.
    bt.poll(lambda: all(p.batches_seen() >= GATE for p in fo), 60, interval=0.02,
            what="every rank to deliver %d batches" % GATE)
    table = placement_table(cl, NUM_SHARDS)
    ids = table["ids"]
    vshards = {s for s in range(NUM_SHARDS) if ids[table["owners"][s]] == victim}
    block = bd.loader_block(ds["num_samples"], sum(os.path.getsize(p) for p in ds["paths"]))
    vports = {int(cl.workers[victim].addr.rsplit(":", 1)[1])}
    for w in bt.status_json(cl.addr)["workers"]:
        if w["id"] == victim and w.get("data_address"):
            vports.add(int(w["data_address"].rsplit(":", 1)[1]))
    evidence = {"seen": [p.batches_seen() for p in fo],
                "sent": bytes_sent_by(cl.workers[victim].pid, vports)}
    t_kill = release_and_kill(cl, fo, victim)
    seen = evidence["seen"]
    sent, conns = evidence["sent"]
    bt.check(all(0 < s < per_epoch for s in seen),
             "%s SIGKILLed while every rank was in epoch 0: %r of its %d batches read per rank, "
             "each rank held by backpressure well before the end of the epoch" %
             (victim, seen, per_epoch))
    served = sum(1 for p in fo for b in p.result()[0][:seen[p.rank]]
                 for i in b["indices"] if bd.loader_shard(i, block) in vshards)
    bt.check(sent > 0 and served > 0,
             "%s was serving before the kill: it had sent %d bytes on %d data connections (ss), "
             "and %d samples delivered before the kill are in its %d of %d shards (placement "
             "version %d)" % (victim, sent, conns, served, len(vshards), NUM_SHARDS,
                              table["version"]))
    for p in fo:
        got, _ = p.ok(60, "rank %d after the kill of %s" % (p.rank, victim))
        if [key(b) for b in got] != [key(b) for b in ref[p.rank]]:
            first = next((i for i, (a, b) in enumerate(zip(got, ref[p.rank])) if key(a) != key(b)),
                         min(len(got), len(ref[p.rank])))
            raise bt.TestFailure("rank %d: the sequence differs from the fault-free run's at "
                                 "batch %d (%d vs %d batches)" % (p.rank, first, len(got),
                                                                  len(ref[p.rank])))
        e2e.compare("failover rank %d" % p.rank, got, want[p.rank], samples)
    bt.ok("after %s died mid-epoch, all 4 ranks exited 0 (the last %.1f s after the kill) with "
          "sequences identical to the fault-free run and the plan (%d batches each)" %
          (victim, max(p.t0 + p.seconds for p in fo) - t_kill, total))


def all_dead(cl):
    # Under a running rank: it has started, then every remaining worker dies.
    p = e2e.Fetch(cl.addr, "ref", SPEC, CFG, 0, gate_after=5,
                  extra=["--epochs", e2e.EPOCHS, "--prefetch", 2, "--timeout-ms", TIMEOUT_MS])
    bt.poll(lambda: p.batches_seen() >= 5 or p.proc.poll() is not None, 60, interval=0.02,
            what="rank 0 to deliver 5 batches")
    p.open_gate()
    t0 = [time.monotonic()]
    for w in cl.workers.values():
        w.send(signal.SIGKILL)
    # A rank started right after the kill, before the coordinator can have marked the workers
    # dead (heartbeat 200 ms x 3): its placement still lists them.
    early = e2e.Fetch(cl.addr, "ref", SPEC, CFG, 1, extra=["--timeout-ms", TIMEOUT_MS])
    early_at = time.monotonic() - t0[0]
    for w in cl.workers.values():
        w.proc.wait(10)
    err = p.refused_after_batches(40)
    took = time.monotonic() - t0[0]
    bt.check(re.search(r"BW_UNAVAILABLE: .*(could not be fetched|no storage worker|every "
                       r"storage worker failed)", err) is not None and took < LIMIT_S,
             "every worker killed under a running rank: fetch exits 1 after %d batches, %.1f s "
             "after the kill (--timeout-ms %d): %s" % (p.batches_seen(), took, TIMEOUT_MS,
                                                       err.strip()[-220:]), err)
    cases = [(early, "started %.2f s after the kill, while the coordinator still listed them" %
              early_at, early_at)]
    bt.poll(lambda: not any(w["state"] == "alive" for w in bt.status_json(cl.addr)["workers"]),
            15, interval=0.1, what="the coordinator to mark every worker dead")
    late = e2e.Fetch(cl.addr, "ref", SPEC, CFG, 2, extra=["--timeout-ms", TIMEOUT_MS])
    cases.append((late, "started after the coordinator marked them dead", 0))
    for q, label, _ in cases:
        err = q.refused(40)
        bt.check("BW_UNAVAILABLE" in err and q.seconds < LIMIT_S,
                 "all workers dead, rank %d %s: exit 1 after %.1f s: %s" %
                 (q.rank, label, q.seconds, err.strip()[-200:]), err)


def refused_after_batches(self, timeout):
    """Waits; the process must exit 1 (it may have printed batches). Returns stderr."""
    rc = self.wait(timeout)
    e2e.check_clean_log("fetch rank %d" % self.rank, self.stderr())
    if rc != 1:
        raise bt.TestFailure("expected exit 1, got %s\nstderr:\n%s" % (rc, self.stderr()))
    return self.stderr()


e2e.Fetch.refused_after_batches = refused_after_batches


def test(tmpdir):
    cl = e2e.Cluster(tmpdir, lease_ms=LEASE_MS)
    ds = e2e.gen(cl, "big", "npy", ["--num-samples", "6000", "--shape", "256", "--dtype",
                                    "float32", "--files", "3"])
    samples = e2e.expected_samples(ds)
    want, _ = e2e.plans(CFG, 6000, e2e.WORLD)
    ref = e2e.fetch_all(cl.addr, "ref", SPEC, CFG, extra=["--prefetch", 2])
    for r in range(e2e.WORLD):
        e2e.compare("fault-free rank %d" % r, ref[r], want[r], samples)
    bt.ok("fault-free run: 4 ranks x %d batches equal the plan and the generator's bytes" %
          len(ref[0]))
    time.sleep(LEASE_WAIT)
    device_check(cl)
    failover(cl, ref, want, samples, ds)  # sample bytes over the workers' data channels
    failover(cl, ref, want, samples, ds, "w3", "grpc")  # ... and over gRPC (w1 is left)
    time.sleep(LEASE_WAIT)
    all_dead(cl)
    cl.stop()


if __name__ == "__main__":
    bt.main(test, timeout=300)
