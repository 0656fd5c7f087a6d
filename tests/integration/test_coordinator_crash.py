"""Crash test: SIGKILL the coordinator at random moments while clients create jobs, join
ranks and commit cursors; restart it on the same state directory; check that every change
acknowledged before the kill is there and that nothing unacknowledged is half there.

Four client threads each own their jobs (world size 4) and issue a stream of operations,
one at a time: create a job, join a rank, commit the next step of a joined rank. A thread
whose call fails (the coordinator is dead) remembers that call as "uncertain" and repeats it
after the restart until it is acknowledged (every operation is idempotent by design). The
coordinator snapshots every few kilobytes (--snapshot-bytes), so kills also land during
compaction.

After each restart, with the clients paused, the state must be exactly:
  jobs:   every acknowledged job, with its fingerprint and configuration, plus at most the
          uncertain creation of each thread (whole or absent);
  ranks:  every acknowledged join held by its holder; no other lease except an uncertain one;
  steps:  each rank at its last acknowledged step, or at the uncertain step in flight.

BW_CRASH_KILLS sets the number of kills (default 50; the `long` variant runs 500).
"""

import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwtest as bt  # noqa: E402
import jobs_rpc as jr  # noqa: E402

KILLS = int(os.environ.get("BW_CRASH_KILLS", "50"))
THREADS = 4
WORLD = 4
SAMPLES = 100000  # batch 1: 25000 steps per rank and epoch, far more than a run commits
SEED = int(os.environ.get("BW_CRASH_SEED", str(int(time.time()))))


class Client(threading.Thread):
    def __init__(self, idx, addr_box, gate):
        super().__init__(daemon=True)
        self.idx = idx
        self.addr_box = addr_box
        self.gate = gate            # set: run; clear: park after the current call
        self.parked = threading.Event()
        self.stop = False
        self.rng = random.Random(SEED * 31 + idx)
        self.jobs = {}              # name -> fingerprint (acknowledged)
        self.leases = {}            # (job, rank) -> lease id (acknowledged)
        self.steps = {}             # (job, rank) -> last acknowledged step
        self.uncertain = None       # (kind, args) of a call whose outcome is unknown
        self.acked = 0
        self.failures = 0
        self.error = None
        self.client = None
        self.client_addr = None

    def next_op(self):
        if self.uncertain:
            return self.uncertain
        mine = sorted(self.jobs)
        unjoined = [(j, r) for j in mine for r in range(WORLD) if (j, r) not in self.leases]
        joined = sorted(self.leases)
        x = self.rng.random()
        if not mine or (x < 0.08 and len(mine) < 60):
            return ("create", ("t%d-job%03d" % (self.idx, len(mine)),))
        if unjoined and (x < 0.35 or not joined):
            return ("join", unjoined[0])
        j, r = self.rng.choice(joined)
        return ("commit", (j, r, self.steps.get((j, r), 0) + 1))

    def do(self, op):
        kind, args = op
        c = self.client
        if kind == "create":
            r = c.create(args[0], samples=SAMPLES, batch=1, world=WORLD, seed=self.idx)
            self.jobs[args[0]] = r.job.fingerprint
        elif kind == "join":
            j, rank = args
            r = c.join(j, rank, WORLD, host="client-%d" % self.idx, pid=1000 + self.idx)
            self.leases[(j, rank)] = jr.lease(r)
        else:
            j, rank, step = args
            cur = jr.cursor(self.jobs[j], j, rank, WORLD, 0, step)
            c.commit(j, rank, self.leases[(j, rank)], cur)
            self.steps[(j, rank)] = step

    def run(self):
        try:
            while not self.stop:
                if not self.gate.is_set():
                    self.parked.set()
                    self.gate.wait()
                    continue
                self.parked.clear()
                if self.client_addr != self.addr_box[0]:
                    if self.client:
                        self.client.close()
                    self.client = jr.Jobs(self.addr_box[0], timeout=3.0)
                    self.client_addr = self.addr_box[0]
                op = self.next_op()
                try:
                    self.do(op)
                    self.uncertain = None
                    self.acked += 1
                except jr.CallError as e:
                    if e.code.name not in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED",
                                           "UNKNOWN", "INTERNAL"):
                        raise AssertionError("client %d: %s %r refused: %s" %
                                             (self.idx, op[0], op[1], e))
                    self.uncertain = op
                    self.failures += 1
                    self.gate.wait(0.05)
        except BaseException as e:  # reported by the main thread
            self.error = e
            self.parked.set()


def verify(addr, clients, cycle):
    c = jr.Jobs(addr)
    try:
        listed = {j.name: j for j in c.list().jobs}
        expected_jobs = set()
        allowed_extra = set()
        for cl in clients:
            expected_jobs |= set(cl.jobs)
            if cl.uncertain and cl.uncertain[0] == "create":
                allowed_extra.add(cl.uncertain[1][0])
        missing = expected_jobs - set(listed)
        if missing:
            raise bt.TestFailure("cycle %d: acknowledged jobs lost: %s" % (cycle, sorted(missing)))
        extra = set(listed) - expected_jobs - allowed_extra
        if extra:
            raise bt.TestFailure("cycle %d: jobs nobody was told exist: %s" % (cycle, sorted(extra)))
        for cl in clients:
            for name in sorted(set(listed) & (set(cl.jobs) | allowed_extra)):
                if not name.startswith("t%d-" % cl.idx):
                    continue
                g = c.get(name)
                sc = g.job.config.sampler
                if (g.job.world_size != WORLD or g.job.config.synthetic_samples != SAMPLES or
                        sc.batch_size != 1 or sc.seed != cl.idx or g.job.dataset.length != SAMPLES):
                    raise bt.TestFailure("cycle %d: job %s is not what was asked: %s" %
                                         (cycle, name, g.job))
                if name in cl.jobs and g.job.fingerprint != cl.jobs[name]:
                    raise bt.TestFailure("cycle %d: job %s changed fingerprint" % (cycle, name))
                for rp in g.ranks:
                    key = (name, rp.rank)
                    unc = cl.uncertain
                    if key in cl.leases:
                        if rp.lease == jr.pb.LEASE_STATE_NONE or rp.holder.pid != 1000 + cl.idx:
                            raise bt.TestFailure("cycle %d: acknowledged join %s lost: %s" %
                                                 (cycle, key, rp))
                    elif rp.lease != jr.pb.LEASE_STATE_NONE and not (
                            unc and unc[0] == "join" and unc[1] == key):
                        raise bt.TestFailure("cycle %d: unacknowledged lease %s: %s" %
                                             (cycle, key, rp))
                    want = cl.steps.get(key, 0)
                    ok_steps = {want}
                    if unc and unc[0] == "commit" and unc[1][:2] == key:
                        ok_steps.add(unc[1][2])
                    have = rp.step if rp.committed else 0
                    if have not in ok_steps:
                        raise bt.TestFailure("cycle %d: rank %s at step %d, expected one of %s" %
                                             (cycle, key, have, sorted(ok_steps)))
    finally:
        c.close()


def test(tmp):
    bt.log("seed %d, %d kills" % (SEED, KILLS))
    rng = random.Random(SEED)
    state = os.path.join(tmp, "state")
    args = ["--snapshot-bytes", "4096", "--lease-ms", "600000", "--shutdown-grace-ms", "500"]
    coord = bt.coordinator(tmp, state_dir=state, args=args)
    addr_box = [coord.addr]
    gate = threading.Event()
    gate.set()
    clients = [Client(i, addr_box, gate) for i in range(THREADS)]
    for cl in clients:
        cl.start()
    t0 = time.monotonic()
    torn = 0
    for cycle in range(1, KILLS + 1):
        time.sleep(rng.uniform(0.02, 0.35))
        coord.kill9()
        gate.clear()
        for cl in clients:
            if not cl.parked.wait(20):
                raise bt.TestFailure("client %d did not park" % cl.idx)
            if cl.error:
                raise cl.error
        coord = bt.coordinator(tmp, name="coordinator-%d" % cycle, state_dir=state, args=args)
        text = coord.wait_log(r"state: snapshot up to record \d+", timeout=10)
        torn += "torn final record" in coord.log_text()
        addr_box[0] = coord.addr
        verify(coord.addr, clients, cycle)
        if cycle % 10 == 0:
            bt.ok("%d kills so far: every acknowledged change present, nothing half-applied "
                  "(%d acknowledged)" % (cycle, sum(cl.acked for cl in clients)))
        gate.set()
    elapsed = time.monotonic() - t0
    gate.clear()
    for cl in clients:
        cl.parked.wait(20)
        if cl.error:
            raise cl.error
    verify(coord.addr, clients, KILLS + 1)
    acked = sum(cl.acked for cl in clients)
    bt.check(acked > KILLS * 5, "%d changes acknowledged across %d kills in %.1fs "
             "(%d calls failed by a kill and were repeated; %d restarts found a torn tail)" %
             (acked, KILLS, elapsed, sum(cl.failures for cl in clients), torn))
    bt.check(coord.stop() == 0, "the last coordinator stops cleanly on SIGTERM")
    for cl in clients:
        cl.stop = True
    gate.set()
    _ = text


if __name__ == "__main__":
    bt.main(test, timeout=max(120, KILLS * 3))
