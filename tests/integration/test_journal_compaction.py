"""Journal compaction across many coordinator restarts (docs/operating.md, "Coordinator state").

One coordinator after another runs on the same state directory with --snapshot-bytes 8192.
Each run commits a few cursors through the Jobs service and is then stopped: SIGTERM mostly,
SIGKILL every fourth run. After every run the bytes of the journal-* files are measured; they
must stay within the bound docs/operating.md states (--snapshot-bytes plus what one run
journals; here 8192 + 4096 bytes), some starts must have compacted (a journal found over its
limit), and at the end every acknowledged cursor must be there. Without compaction at start the
journal would grow by every run's records (about 450 bytes a run here).

Two short phases then check the schedule while running: a burst of commits over
--snapshot-bytes is compacted without a restart, and --snapshot-interval-s 1 compacts a
journal that holds one record after about a second.

BW_COMPACTION_RESTARTS sets the number of restarts (default 100, about 10 s).
"""

import os
import re
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwtest as bt  # noqa: E402
import jobs_rpc as jr  # noqa: E402

RESTARTS = int(os.environ.get("BW_COMPACTION_RESTARTS", "100"))
SNAPSHOT_BYTES = 8192
RUN_SLACK = 4096  # more than one run journals (6 commits of about 75 bytes each)
BOUND = SNAPSHOT_BYTES + RUN_SLACK
COMMITS_PER_RUN = 6
WORLD = 4
JOB = "compaction"
JOURNAL_RE = re.compile(r"^journal-\d{20}$")


def journal_bytes(state):
    return sum(os.path.getsize(os.path.join(state, n)) for n in os.listdir(state)
               if JOURNAL_RE.match(n))


def check_cursors(addr, fingerprint, steps, when, leases=None):
    c = jr.Jobs(addr)
    try:
        g = c.get(JOB)
        have = {rp.rank: rp for rp in g.ranks}
        for rank, step in steps.items():
            rp = have.get(rank)
            if rp is None or not rp.committed or rp.step != step:
                raise bt.TestFailure("%s: rank %d should be at step %d: %s" %
                                     (when, rank, step, rp))
            # The same holder joining again gets its committed cursor (and a new lease: a lease
            # id is told only once, docs/security.md).
            j = c.join(JOB, rank, WORLD, host="trainer", pid=100 + rank)
            if leases is not None:
                leases[rank] = j
            cur = jr.decode_cursor(j.cursor)
            if cur.step != step or cur.rank != rank or cur.job_fingerprint != fingerprint:
                raise bt.TestFailure("%s: rank %d's cursor is not the one committed: %s" %
                                     (when, rank, cur))
    finally:
        c.close()


def restarts(tmp, state):
    # --heartbeat-ms 60000: the scheduled check runs every 15 s, after these short runs, so
    # every compaction here is one at start, however slow the machine.
    args = ["--snapshot-bytes", str(SNAPSHOT_BYTES), "--lease-ms", "600000",
            "--shutdown-grace-ms", "100", "--heartbeat-ms", "60000"]
    coord = bt.coordinator(tmp, name="coordinator-0", state_dir=state, args=args)
    c = jr.Jobs(coord.addr)
    fingerprint = c.create(JOB, samples=100000, batch=1, world=WORLD).job.fingerprint
    leases = {r: c.join(JOB, r, WORLD, host="trainer", pid=100 + r) for r in range(WORLD)}
    c.close()
    steps = {}
    sizes = []
    start_compactions = 0
    kills = 0
    t0 = time.monotonic()
    for run in range(1, RESTARTS + 1):
        c = jr.Jobs(coord.addr)
        for i in range(COMMITS_PER_RUN):
            rank = (run + i) % WORLD
            step = steps.get(rank, 0) + 1
            c.commit(JOB, rank, leases[rank], jr.cursor(fingerprint, JOB, rank, WORLD, 0, step))
            steps[rank] = step  # acknowledged: durable from here on
        c.close()
        if run % 4 == 0:
            coord.kill9()
            kills += 1
        else:
            rc = coord.stop()
            if rc != 0:
                raise bt.TestFailure("run %d: SIGTERM exit status %s; log:\n%s" %
                                     (run, rc, coord.log_text()))
        sizes.append(journal_bytes(state))
        coord = bt.coordinator(tmp, name="coordinator-%d" % run, state_dir=state, args=args)
        coord.wait_log(r"state: snapshot up to record \d+", timeout=10)
        # Over the limit (record bytes; each file adds a 16-byte header): this start compacts.
        if sizes[-1] >= SNAPSHOT_BYTES + 64:
            coord.wait_log(r"state: compacted at start: \d+ journal bytes", timeout=5)
            start_compactions += 1
            now = journal_bytes(state)
            if now >= SNAPSHOT_BYTES:
                raise bt.TestFailure("run %d: %d journal bytes after a compaction at start" %
                                     (run, now))
        if run % 10 == 0 or run == RESTARTS:
            check_cursors(coord.addr, fingerprint, steps, "restart %d" % run, leases)
        if run % 25 == 0:
            bt.log("%d restarts: journal bytes after each stop, last 25: min %d max %d" %
                   (run, min(sizes[-25:]), max(sizes[-25:])))
    elapsed = time.monotonic() - t0
    bt.log("journal bytes after each of %d stops (%d SIGKILL): max %d, mean %.0f, last %d; "
           "%d starts compacted; %.1fs" % (RESTARTS, kills, max(sizes), sum(sizes) / len(sizes),
                                            sizes[-1], start_compactions, elapsed))
    bt.check(max(sizes) <= BOUND, "the journal stays within %d bytes across %d restarts "
             "(largest %d)" % (BOUND, RESTARTS, max(sizes)))
    bt.check(start_compactions >= RESTARTS // 25,
             "%d starts found the journal over --snapshot-bytes and compacted it (to under "
             "--snapshot-bytes) before listening" % start_compactions)
    check_cursors(coord.addr, fingerprint, steps, "the end", leases)
    bt.ok("every one of the %d acknowledged cursors is there after %d restarts" %
          (sum(steps.values()), RESTARTS))
    return coord, fingerprint, leases, steps


def test(tmp):
    state = os.path.join(tmp, "state")
    coord, fingerprint, leases, steps = restarts(tmp, state)

    # On the schedule, without a restart: a burst over --snapshot-bytes is compacted within
    # a few checks (every --heartbeat-ms / 4, 250 ms by default).
    bt.check(coord.stop() == 0, "stops on SIGTERM")
    coord = bt.coordinator(tmp, name="coordinator-burst", state_dir=state,
                           args=["--snapshot-bytes", str(SNAPSHOT_BYTES), "--lease-ms", "600000"])
    c = jr.Jobs(coord.addr)
    for i in range(200):
        rank = i % WORLD
        steps[rank] += 1
        c.commit(JOB, rank, leases[rank], jr.cursor(fingerprint, JOB, rank, WORLD, 0, steps[rank]))
    c.close()
    coord.wait_log(r"state: compacted: \d+ journal bytes", timeout=5)
    bt.poll(lambda: journal_bytes(state) < SNAPSHOT_BYTES, 5,
            what="the journal to shrink below --snapshot-bytes after a scheduled compaction")
    bt.ok("a burst of commits over --snapshot-bytes is compacted while running")
    bt.check(coord.stop() == 0, "stops on SIGTERM")

    # By age: one record, --snapshot-interval-s 1.
    coord = bt.coordinator(tmp, name="coordinator-interval", state_dir=state,
                           args=["--snapshot-interval-s", "1", "--lease-ms", "600000"])
    c = jr.Jobs(coord.addr)
    steps[0] += 1
    c.commit(JOB, 0, leases[0], jr.cursor(fingerprint, JOB, 0, WORLD, 0, steps[0]))
    c.close()
    t = time.monotonic()
    coord.wait_log(r"state: compacted: the oldest journal record", timeout=5)
    bt.ok("--snapshot-interval-s 1 compacted a journal of one record after %.1fs" %
          (time.monotonic() - t))
    check_cursors(coord.addr, fingerprint, steps, "after the interval compaction", leases)
    coord.send(signal.SIGKILL)
    coord.proc.wait(timeout=10)
    coord = bt.coordinator(tmp, name="coordinator-last", state_dir=state)
    check_cursors(coord.addr, fingerprint, steps, "the last start")
    bt.check(coord.stop() == 0, "the last coordinator stops cleanly")


if __name__ == "__main__":
    bt.main(test, timeout=max(120, RESTARTS * 2))
