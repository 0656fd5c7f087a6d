"""Fault scenarios on a cluster spread over network namespaces (harness: netns.py).

A coordinator, 3 workers and 4 trainer ranks (`batchwire fetch`), each in its own network
namespace on one bridge. First a fault-free run of the 4 ranks (.npy, torch mode with shuffle,
two epochs) is checked against `batchwire plan` and the generator's bytes; it is the reference.
Then each scenario runs the same job under a new name: the ranks are held mid-epoch 0 by
backpressure on their stdout (as in tests/integration/test_client_failover.py), the fault is
applied and the ranks released so they fetch through it (a rank the fault must find still
running is let on by STEP_ON batches only, and held again until the fault is applied). Every
scenario checks that

  * every rank exits 0 within RANK_TIMEOUT_S,
  * every rank's whole sequence (epoch, step, indices, padding, real, sha256) equals the
    fault-free run's and the plan (nothing lost, duplicated or reordered; bytes right),
  * the recovery time -- from the fault's end to every rank that still had batches to deliver
    delivering again (each rank's stdout is line buffered and stamped as read) -- is at most
    RECOVERY_BOUND_S, and so are the time from a rank's last batch to its exit and, after a
    partition, the time until the coordinator lists every worker alive again; no rank goes
    longer than STALL_BOUND_S without a batch (5 s each: issue 15's bounds),

and prints these figures and the ranks' run time. Where a fault must stop a rank (its data
gone, its lease taken over, a disk full under its commit) the scenario checks instead that
every batch it delivered is exact, that it stopped within RECOVERY_BOUND_S with an error that
says why, and that a restarted rank resumes exactly from its last committed cursor.

Scenarios (in this order): worker SIGKILL mid-epoch; 10 % packet loss on every host; SIGSTOP
of a worker for 3 s then SIGCONT; partition of a worker for 2 s; partition of the coordinator
for 2 s; SIGKILL and restart of the coordinator; SIGSTOP of the coordinator for 3 s; partition
of a trainer for 2 s; a dataset file truncated, overwritten in place and deleted under the
ranks (the same workers serving another job meanwhile); the coordinator's state directory's
disk full; a trainer SIGKILLed and restarted; a trainer SIGSTOPped past its lease and taken
over; a worker and the coordinator each SIGKILLed and started again on a new address under
the same name (every host names the others through its namespace's hosts file: netns.py);
the frames to a worker dropped for 5 s, its own delivered, and the reverse. The full set
(BW_FAULTS=full) adds 30 s partitions of a worker, of the coordinator and of a trainer (with
the default batch budget, and with one long enough to wait the outage out), a worker's own
link down for 5 s, and 50 ms and 200 ms of latency each way to one worker (a delaying TCP
proxy) for a whole run.

Scenarios that today's code is known to fail are listed in XFAIL with the reason and the
figure measured: they run, their failure is reported as XFAIL and does not fail the test; one
that passes is reported as XPASS (remove it from XFAIL). BW_FAULTS_STRICT=1 makes XFAILs fail.

Environment: BW_FAULTS=short|full (default short), BW_FAULTS_ONLY=name[,name] to run some
scenarios, BW_FAULTS_STRICT=1, BW_FAULTS_TABLE=PATH to write the recovery table of the
scenarios run (markdown, for scripts/recovery-table: tests/faults/README.md), plus
bwtest.py's BW_BIN_DIR etc. Needs root (namespaces, nft, /etc/netns, a tmpfs for the
coordinator's state directory); without it the test prints SKIP and exits 77 (skipped, for
ctest).
"""

import glob
import os
import re
import shutil
import signal
import struct
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import netns  # noqa: E402
from netns import bt, e2e  # noqa: E402
from test_client_resume import key  # noqa: E402

CFG = dict(mode="torch", B=16, shuffle=True, seed=5)
SPEC = "npy:big/part-*.npy"
NUM_SAMPLES = 6000
GATE = 20
# Where a fault must find a rank still running (its file changed, it is killed or stopped), the
# rank is let on by STEP_ON more batch lines only (step_on) and held there again until the
# fault is applied: it fetches as the fault lands, yet it cannot have finished, however late
# the test gets to the fault on a loaded machine (held, it blocks about 50 lines after what
# the test read: netns.Rank), which release() followed by the fault could not promise -- a
# rank ran to its end before the fault 2 times in 6 runs on a loaded 2-core machine.
STEP_ON = 30
RANK_TIMEOUT_S = 90
# The bounds of issue 15, with default settings (the daemons' and `batchwire fetch`'s; only
# the lease is given, and it is the default, 10 s). The environment may tighten them, never
# loosen them.
#
# Recovery: seconds from a fault's end (a partition healed, a process continued or restarted,
# space freed) until every rank that still had batches delivers again; after a partition also
# until the coordinator lists every worker alive again; and from a rank's last batch to its
# exit. Scenarios where a rank must stop instead (its data gone, its lease taken over) hold
# the time until it stopped, with a clear error, to the same bound.
RECOVERY_BOUND_S = min(5.0, float(os.environ.get("BW_FAULTS_RECOVERY_S", "5")))
# Stall: the longest a rank may go without a batch while a worker or the coordinator is
# faulty. A silent worker is failed over when one attempt's deadline passes (a third of
# --timeout-ms: 3.3 s by default), whatever the coordinator knows; the coordinator is off the
# batch path. For a trainer's own partition the stall includes the partition itself (2 s).
STALL_BOUND_S = min(5.0, float(os.environ.get("BW_FAULTS_STALL_S", "5")))
MODE = os.environ.get("BW_FAULTS", "short")
STRICT = os.environ.get("BW_FAULTS_STRICT") == "1"

# name -> why today's code fails it, with the figures measured; such a scenario runs and is
# reported as XFAIL without failing the test (XPASS once it passes: then delete its entry).
# Empty since 71b8c7a (gRPC keepalive, TCP_USER_TIMEOUT on data sockets, per-attempt fetch
# deadlines): every scenario, the 30 s partitions included, passes its bounds (worker cut
# off 30 s: stall 3.4 s, back in the placement 0.4-1.0 s after the heal). On the tree before
# it (1fe03c1 with the work then in progress) two scenarios failed, as the entries read then:
#   "worker_partition_30s": "a silent worker costs a rank its whole batch budget
#       (--timeout-ms 10 s) before it fails over: stall 10.0 s; and the worker is back in the
#       placement only 24.6 s after the heal (its heartbeats retried every 12 s)",
#   "coord_partition_30s": "the workers are back in the placement only 25.5 s after the heal",
# while scenarios 1-6 passed with the same figures as now.
XFAIL = {}


class Ctx:
    def __init__(self, tmpdir, net, cl, ref, want, samples):
        self.tmpdir, self.net, self.cl = tmpdir, net, cl
        self.ref, self.want, self.samples = ref, want, samples
        self.fault_free_s = None


def start_held(ctx, job, spec=SPEC, extra=()):
    """The 4 ranks of a new job, each held mid-epoch 0 once GATE batches were read."""
    ranks = ctx.cl.ranks(job, spec, CFG, extra=["--epochs", e2e.EPOCHS] + list(extra),
                         gate_after=GATE)
    ctx.running = getattr(ctx, "running", []) + ranks
    bt.poll(lambda: all(p.batches_seen() >= GATE for p in ranks), 60, interval=0.02,
            what="every rank of %s to deliver %d batches" % (job, GATE))
    return ranks


def release(ranks):
    for p in ranks:
        p.open_gate()
    time.sleep(0.005)


def step_on(ranks):
    """The held ranks print STEP_ON more batches each, then are held again (with GATE and the
    pipe, at most ~100 of their 158 or 188 batches)."""
    for p in ranks:
        p.hold_after(p.gate_after + STEP_ON)


def exact(ctx, name, p, got, skip=0, prefix=False):
    """Rank p's batches `got` equal the fault-free run's and the plan's from batch `skip` on
    (a rank resumed from a cursor at that step); all of them, or (prefix=True, a rank that
    stopped early) as many as it delivered."""
    ref = ctx.ref[p.rank][skip:]
    want = ctx.want[p.rank][skip:]
    if prefix:
        ref, want = ref[:len(got)], want[:len(got)]
    if [key(b) for b in got] != [key(b) for b in ref]:
        first = next((i for i, (a, b) in enumerate(zip(got, ref)) if key(a) != key(b)),
                     min(len(got), len(ref)))
        raise bt.TestFailure("%s: rank %d's sequence differs from the fault-free run's at "
                             "batch %d (%d vs %d batches)" % (name, p.rank, skip + first,
                                                              len(got), len(ref)))
    e2e.compare("%s rank %d" % (name, p.rank), got, want, ctx.samples)


def finish(ctx, name, ranks, t_start, t_end, skip=0):
    """Waits for every rank, checks its sequence (from batch `skip` on), returns the
    measurements."""
    for p in ranks:
        got, _ = p.ok(RANK_TIMEOUT_S, "%s: rank %d" % (name, p.rank))
        exact(ctx, name, p, got, skip)
    rec = netns.recovery_s(ranks, t_end)
    m = dict(recovery=rec, stall=netns.stall_s(ranks, t_start),
             run=max(p.exited_at() for p in ranks) - min(p.t0 for p in ranks),
             exit_lag=max(p.exited_at() - p.times[-1] for p in ranks),
             fault=t_end - t_start)
    bt.log("%s: all 4 ranks exited 0 with sequences equal to the fault-free run and the plan; "
           "recovery %s, longest stall %.2f s, fault %.2f s, ranks ran %.2f s, last exit "
           "%.2f s after its last batch" %
           (name, "n/a (all delivered before the fault ended)" if rec is None else "%.2f s" % rec,
            m["stall"], m["fault"], m["run"], m["exit_lag"]))
    return m


def bounded(name, m, stall_bound=None):
    """Fails the scenario (keeping its measurements) where a figure is over its bound."""
    over = []
    if m.get("recovery") is not None and m["recovery"] > RECOVERY_BOUND_S:
        over.append("recovery %.2f s > %.1f s" % (m["recovery"], RECOVERY_BOUND_S))
    if stall_bound is not None and m["stall"] > stall_bound:
        over.append("a rank stalled %.2f s > %.1f s" % (m["stall"], stall_bound))
    if "rejoin" in m and (m["rejoin"] is None or m["rejoin"] > RECOVERY_BOUND_S):
        over.append("the coordinator listed every worker alive %s after the fault's end > %.1f s" %
                    ("never (60 s)" if m["rejoin"] is None else "%.2f s" % m["rejoin"],
                     RECOVERY_BOUND_S))
    if "done" in m and m["done"] > m["done_bound"]:
        over.append("the ranks finished %.2f s after the fault's end > %.2f s (a slow batch "
                    "after another, each under the stall bound)" % (m["done"], m["done_bound"]))
    if m.get("exit_lag", 0) > RECOVERY_BOUND_S:
        over.append("a rank exited %.2f s after its last batch > %.1f s" %
                    (m["exit_lag"], RECOVERY_BOUND_S))
    if over:
        raise bounded_failure(name, m, "; ".join(over))
    return m


def bounded_failure(name, m, why=None):
    """The failure of scenario `name`, carrying its measurements m (for the summary and the
    table); why defaults to the rejoin that never came."""
    e = bt.TestFailure("%s: %s (every rank still exited 0, sequence-exact)" %
                       (name, why or "the coordinator never listed every worker alive again "
                        "(60 s)"))
    e.measure = m
    return e


def wait_healthy(ctx):
    ctx.cl.wait_alive(3, timeout=40)


# ---------------------------------------------------------------------------------------
# scenarios


def worker_sigkill(ctx):
    """(1) A worker SIGKILLed mid-epoch under the 4 ranks (then restarted for the next)."""
    ranks = start_held(ctx, "f-worker-kill")
    release(ranks)
    t = ctx.cl.kill9("w2")
    try:
        return bounded("worker_sigkill", finish(ctx, "worker_sigkill", ranks, t, t),
                       STALL_BOUND_S)
    finally:
        ctx.cl.start_worker("w2")
        wait_healthy(ctx)


def loss_10(ctx):
    """(2) 10 % random loss of the frames crossing the bridge (every host) for 5 s."""
    ranks = start_held(ctx, "f-loss")
    ctx.net.loss(10)
    t0 = time.monotonic()
    release(ranks)
    deadline = t0 + 5.0
    while time.monotonic() < deadline and any(p.proc.poll() is None for p in ranks):
        time.sleep(0.05)
    ctx.net.loss_off()
    t1 = time.monotonic()
    m = finish(ctx, "loss_10", ranks, t0, t1)
    wait_healthy(ctx)
    return bounded("loss_10", m, STALL_BOUND_S)


def _sigstop(ctx, name, daemon, seconds):
    """`daemon` SIGSTOPped for `seconds` under the ranks, then SIGCONT."""
    ranks = start_held(ctx, "f-" + name.replace("_", "-"))
    release(ranks)
    t0 = ctx.cl.pause(daemon)
    time.sleep(seconds)
    t1 = ctx.cl.resume(daemon)
    m = finish(ctx, name, ranks, t0, t1)
    wait_healthy(ctx)
    return bounded(name, m, STALL_BOUND_S)


def worker_sigstop_3s(ctx):
    """(3) A worker SIGSTOPped for 3 s under the ranks, then SIGCONT."""
    return _sigstop(ctx, "worker_sigstop_3s", "w1", 3.0)


def _partition(ctx, name, host, seconds, link=False, extra=(), direction="both"):
    """`host` cut off for `seconds`: dropped at the bridge -- both ways, or (direction "in")
    only the frames to it, or ("out") only those from it -- or (link=True) its own eth0 down,
    which its peers see as silence and it sees as ENETUNREACH; `extra`: the ranks' options."""
    cut = ((lambda: ctx.net.link(host, False)) if link else
           (lambda: ctx.net.partition(host, direction)))
    heal = (lambda: ctx.net.link(host, True)) if link else (lambda: ctx.net.heal(host))
    ranks = start_held(ctx, "f-" + name.replace("_", "-"), extra=extra)
    rejoin = {}

    def watch_rejoin():
        # From the heal until the coordinator lists all 3 workers alive again.
        t1 = rejoin["heal"]
        try:
            bt.poll(lambda: len(ctx.cl.alive()) == 3, 60, interval=0.1, what="3 live workers")
            rejoin["s"] = time.monotonic() - t1
        except bt.TestFailure:
            rejoin["s"] = None

    def healed():
        rejoin["heal"] = time.monotonic()

    t0 = time.monotonic()
    cut()
    release(ranks)
    time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
    heal()
    healed()
    t1 = rejoin["heal"]
    w = threading.Thread(target=watch_rejoin, daemon=True)
    w.start()
    m = finish(ctx, name, ranks, t0, t1)
    w.join(70)
    m["rejoin"] = rejoin.get("s")
    bt.log("%s: all 3 workers alive again (coordinator's view) %s after the heal" %
           (name, "never (60 s)" if m["rejoin"] is None else "%.2f s" % m["rejoin"]))
    wait_healthy(ctx)
    # A silent worker can be routed around: its stall is bounded whatever the partition's
    # length. The coordinator is not on the batch path -- but it vouches for the leases
    # (docs/client.md, "Fencing"): a rank hands out batches only while its lease is proven,
    # at least 0.9 lease - one heartbeat interval (lease / 3) after its last answered
    # heartbeat, 5.7 s at the default lease. A longer cut-off holds every rank from then
    # until the heal, by design; the bound is what is left of the partition after that.
    bound = STALL_BOUND_S
    proven_s = ctx.cl.lease_ms * (0.9 - 1 / 3.0) / 1e3
    if host == "coord" and seconds > proven_s:
        bound += seconds - proven_s
    # A trainer cut off itself delivers nothing until the heal: its stall includes the
    # partition, and after the heal it has the recovery bound.
    if host.startswith("t") and seconds > STALL_BOUND_S:
        bound = seconds + RECOVERY_BOUND_S
    return bounded(name, m, bound)


def worker_partition_2s(ctx):
    """(4) One worker cut off at the bridge (silently) for 2 s."""
    return _partition(ctx, "worker_partition_2s", "w3", 2.0)


def coord_partition_2s(ctx):
    """(5) The coordinator cut off at the bridge for 2 s."""
    return _partition(ctx, "coord_partition_2s", "coord", 2.0)


def coord_restart(ctx):
    """(6) The coordinator SIGKILLed under the ranks and restarted at once (same address and
    state directory); the fault ends when it listens again."""
    ranks = start_held(ctx, "f-coord-restart")
    release(ranks)
    t0, t1 = ctx.cl.restart_coordinator()
    m = finish(ctx, "coord_restart", ranks, t0, t1)
    wait_healthy(ctx)
    return bounded("coord_restart", m, STALL_BOUND_S)


def coord_sigstop_3s(ctx):
    """(7) The coordinator SIGSTOPped for 3 s under the ranks (it is off the batch path:
    heartbeats and placement wait), then SIGCONT."""
    return _sigstop(ctx, "coord_sigstop_3s", "coord", 3.0)


def trainer_partition_2s(ctx):
    """(8) One trainer cut off at the bridge for 2 s: it reaches neither workers nor
    coordinator, then goes on where it was."""
    return _partition(ctx, "trainer_partition_2s", "t1", 2.0)


def worker_partition_30s(ctx):
    """(full) One worker cut off for 30 s."""
    return _partition(ctx, "worker_partition_30s", "w3", 30.0)


def coord_partition_30s(ctx):
    """(full) The coordinator cut off for 30 s."""
    return _partition(ctx, "coord_partition_30s", "coord", 30.0)


def worker_link_down_5s(ctx):
    """(full) One worker's own link down for 5 s."""
    return _partition(ctx, "worker_link_down_5s", "w2", 5.0, link=True)


def worker_oneway_in(ctx):
    """(17) The frames to one worker dropped at the bridge for 5 s, its own delivered (its
    requests and heartbeats arrive, the answers to them do not)."""
    return _partition(ctx, "worker_oneway_in", "w3", 5.0, direction="in")


def worker_oneway_out(ctx):
    """(18) The frames from one worker dropped at the bridge for 5 s, those to it delivered
    (it hears every request and no answer gets out)."""
    return _partition(ctx, "worker_oneway_out", "w3", 5.0, direction="out")


# Where a moved host goes (the last octet of its new address, netns.SUBNET); not moved back:
# every daemon and client names hosts (netns.FaultCluster), so no later scenario depends on
# an address, and a restart of the daemon (after a failed scenario too) is at the new one.
NEW_ADDRESS = {"w2": 112, "coord": 102}


def _heard_since(cl, t):
    """Whether the coordinator lists all 3 workers alive, each with a heartbeat received
    after monotonic time `t` (so from a worker process, and at a coordinator, that exist
    after a move)."""
    try:
        st = cl.status()
    except bt.TestFailure:
        return False
    ago = time.monotonic() - t
    return len([w for w in st["workers"] if w["state"] == "alive" and
                w["seconds_since_heartbeat"] < ago]) == 3


def _served(cl, wid, since):
    """Worker `wid`'s served samples, as the coordinator lists them once it has a heartbeat of
    the worker's sent after monotonic time `since` (heartbeats carry the count: every 1 s)."""
    def get():
        ago = time.monotonic() - since
        for w in cl.status()["workers"]:
            if w["id"] == wid and w["seconds_since_heartbeat"] < ago:
                return [w["served_samples"]]  # a list: bt.poll waits on a false value, like 0
        return None
    return bt.poll(get, 20, interval=0.1, what="a heartbeat of %s" % wid)[0]


def _moved(ctx, name, host):
    """`host`'s daemon SIGKILLed under the ranks and started again on a new address under the
    same name, id and state directory (the hosts files of every namespace rewritten first).
    The fault ends when it listens at the new address. Two jobs' ranks, both committing their
    cursors at the end (at the coordinator):

      * the first job's ranks fetch as the daemon is killed -- let on by STEP_ON batches
        (step_on), so none can have finished -- and are released at the fault's end: from
        then every rank must deliver again within RECOVERY_BOUND_S and finish within
        RECOVERY_BOUND_S + twice the fault-free run; the coordinator must list all 3 workers
        alive with a heartbeat heard since within RECOVERY_BOUND_S;
      * the second job's ranks stay held (idle, their connections to the old address broken)
        until then, and are released once the first job is done: long-lived clients that
        must find the daemon under its name. For a worker, it must serve some of their
        samples (its served count, as its heartbeats report it, grows): followed, not routed
        around.

    Every batch of both exact, every rank's committed cursor its end (its commit made at the
    moved coordinator, for the coordinator)."""
    cl = ctx.cl
    job = "f-" + name.replace("_", "-")
    ranks = start_held(ctx, job, extra=["--commit"])
    idle = start_held(ctx, job + "-idle", extra=["--commit"])
    old = ctx.net.ip(host)
    step_on(ranks)
    if host == "coord":
        t0, t1 = cl.move_coordinator(NEW_ADDRESS[host])
    else:
        t0, t1 = cl.move_worker(host, NEW_ADDRESS[host])
    release(ranks)
    rejoin = {}

    def watch_rejoin():
        try:
            bt.poll(lambda: _heard_since(cl, t1), 60, interval=0.1,
                    what="3 live workers heard from after the move")
            rejoin["s"] = time.monotonic() - t1
        except bt.TestFailure:
            rejoin["s"] = None

    w = threading.Thread(target=watch_rejoin, daemon=True)
    w.start()
    m = finish(ctx, name, ranks, t0, t1)
    # A moved worker still dialled at its old address costs a batch that tries it an attempt
    # (3.3 s, under the stall bound); before the loader avoided failed workers across fetches
    # (d7036e1) every batch did, and the ranks took 29 and 49 s with the hosts files left
    # naming the old address.
    m["done"] = max(p.exited_at() for p in ranks) - t1
    m["done_bound"] = RECOVERY_BOUND_S + 2 * ctx.fault_free_s
    w.join(70)
    m["rejoin"] = rejoin.get("s")
    _committed_at_end(ctx, name, job, " (the ranks commit at the coordinator's name)")
    if m["rejoin"] is None:
        raise bounded_failure(name, m)
    served = None if host == "coord" else _served(cl, host, max(p.exited_at() for p in ranks))
    t2 = time.monotonic()
    release(idle)
    mi = finish(ctx, name + " (idle job)", idle, t2, t2)
    _committed_at_end(ctx, name, job + "-idle", " (the ranks commit at the coordinator's name)")
    m["stall"] = max(m["stall"], mi["stall"])
    m["done"] = max(m["done"], max(p.exited_at() for p in idle) - t2)
    m["exit_lag"] = max(m["exit_lag"], mi["exit_lag"])
    followed = ""
    if served is not None:
        more = _served(cl, host, max(p.exited_at() for p in idle)) - served
        if more <= 0:
            raise bounded_failure(name, m, "%s served none of the idle job's samples: its ranks "
                                  "routed around it instead of following its name to %s" %
                                  (host, ctx.net.ip(host)))
        followed = "; %s served %d of the idle job's samples at its new address" % (host, more)
    rj = "never (60 s)" if m["rejoin"] is None else "%.2f s" % m["rejoin"]
    m["note"] = ("%s (%s moved %s -> %s); every worker heard from again %s after it listened; "
                 "the ranks done %.2f s after%s; their final commits made%s" %
                 (rec_cell(m["recovery"]), host, old, ctx.net.ip(host), rj, m["done"], followed,
                  " at the moved coordinator" if host == "coord" else ""))
    bt.log("%s: %s down %.2f s (SIGKILL to listening at %s); all 3 workers alive with a "
           "heartbeat since (coordinator's view) %s after; the ranks finished %.2f s after "
           "(fault-free run %.2f s)%s; every rank of both jobs committed its end" %
           (name, host, t1 - t0, ctx.net.ip(host), rj, m["done"], ctx.fault_free_s, followed))
    wait_healthy(ctx)
    return bounded(name, m, STALL_BOUND_S)


def worker_new_ip(ctx):
    """(15) A worker SIGKILLed mid-epoch and started again at once on a new address under
    the same name (w2: the hosts files name the new one) and id."""
    return _moved(ctx, "worker_new_ip", "w2")


def coord_new_ip(ctx):
    """(16) The coordinator SIGKILLed and started again at once on a new address under the
    same name, on the same state directory."""
    return _moved(ctx, "coord_new_ip", "coord")


def worker_latency_50ms(ctx, delay_ms=50, name="worker_latency_50ms"):
    """(full) One worker reachable only with 50 ms added each way (a delaying proxy) for a
    whole run: every batch must still be exact, no stall over the bound."""
    cl = ctx.cl
    cl.workers["w1"].stop()
    cl.start_worker("w1", delay_ms=delay_ms)
    # The restarted w1 advertises the proxy's address: it gets its id once the coordinator has
    # declared the stopped one dead. Until then the placement still lists w1 at its old
    # address, and the ranks would simply route around it (the run then never saw the delay).
    _wait_worker_at(ctx, "w1", "w1:%d" % (netns.WORKER_PORT + netns.PROXY_OFFSET))
    wait_healthy(ctx)
    try:
        ranks = start_held(ctx, "f-latency")
        t0 = time.monotonic()
        release(ranks)
        m = finish(ctx, name, ranks, t0, t0)
        m["recovery"] = None  # the fault lasts the whole run
        m["fault"] = m["run"]
        m["note"] = "-- (the ranks ran %.2f s; fault-free %.2f s)" % (m["run"], ctx.fault_free_s)
        bt.log("%s: the ranks ran %.2f s (fault-free: %.2f s)" % (name, m["run"],
                                                                 ctx.fault_free_s))
        return bounded(name, m, STALL_BOUND_S)
    finally:
        cl.workers["w1"].stop()
        for p in cl.proxies:
            p.kill9()
        cl.proxies = []
        cl.start_worker("w1")
        _wait_worker_at(ctx, "w1", "w1:%d" % netns.WORKER_PORT)
        wait_healthy(ctx)


def _wait_worker_at(ctx, wid, address, timeout=30):
    """Until the coordinator lists worker `wid` alive at `address`."""
    def there():
        try:
            return any(w["id"] == wid and w["state"] == "alive" and w["address"] == address
                       for w in ctx.cl.status()["workers"])
        except bt.TestFailure:
            return False
    bt.poll(there, timeout, interval=0.2, what="worker %s alive at %s" % (wid, address))


def worker_latency_200ms(ctx):
    """(full) The same with 200 ms added each way."""
    return worker_latency_50ms(ctx, 200, "worker_latency_200ms")


DISK_STALL_S = 10.0


def worker_disk_stall_10s(ctx):
    """(new) Worker w1's disk stops answering for 10 s under the ranks: w1 reads the data root
    through stall_fs.py (a FUSE passthrough, bind-mounted over the data root in w1's own mount
    namespace), w2 and w3 read the same files directly. Its page cache dropped while the ranks
    are held, every read of w1's then stalls; the ranks are released into it and must fail over
    to w2/w3 within STALL_BOUND_S, every batch exact. w1 stays up, its stalled reads go on once
    the disk answers, and the coordinator lists all 3 workers alive within RECOVERY_BOUND_S
    of the stall's end. Afterwards w1 is a plain worker again. Skipped (SKIP, not a failure)
    where FUSE is not available: no /dev/fuse, no fusepy/libfuse 2, or the mount refused."""
    import stall_fs
    name, cl = "worker_disk_stall_10s", ctx.cl
    okf, why = stall_fs.available()
    mnt = None
    if okf:
        try:
            mnt = stall_fs.StallMount(ctx.tmpdir, cl.root, "w1")
        except bt.TestFailure as e:
            said = [x for x in str(e).splitlines() if x.startswith("fuse: ")]
            if not said:  # libfuse's own line is missing: not a refused mount
                raise
            okf, why = False, "mounting FUSE failed: %s" % said[0]
    if not okf:
        bt.log("SKIP: %s: %s" % (name, why))
        return dict(skipped=why)
    try:
        cl.workers["w1"].stop()
        cl.start_worker("w1", data_via=mnt.mountpoint)
        wait_healthy(ctx)
        ranks = start_held(ctx, "f-disk-stall")  # w1 serves its part through FUSE
        t0, nfiles = mnt.stall()
        release(ranks)
        time.sleep(max(0.0, DISK_STALL_S - (time.monotonic() - t0)))
        t1 = mnt.unstall()
        m = finish(ctx, name, ranks, t0, t1)
        stalled = mnt.stalled_reads()
        if not stalled:
            raise bt.TestFailure("%s: no read of w1's stalled (%d files invalidated): the fault "
                                 "never reached the worker" % (name, nfiles))
        if not cl.workers["w1"].running():
            raise bt.TestFailure("%s: w1 exited during its disk stall:\n%s" %
                                 (name, cl.workers["w1"].log_text()[-3000:]))
        e2e.check_clean_log("worker w1", cl.workers["w1"].log_text())
        mnt.daemon.wait_log(r"goes on after", RECOVERY_BOUND_S, count=stalled)
        try:
            bt.poll(lambda: cl.alive() == ["w1", "w2", "w3"], 60, interval=0.1,
                    what="3 live workers")
            m["rejoin"] = time.monotonic() - t1
        except bt.TestFailure:
            m["rejoin"] = None
        # How often a rank waited out w1 (a gap over 1 s): an attempt's deadline each. The
        # loader avoids a worker that failed for one attempt's time, doubling while it fails
        # (docs/operating.md, "Networks"): at most twice in a 10 s stall (0-3.3 s, then
        # 6.6-9.9 s), where a memory of one batch only waited it out for every batch (3 times).
        waits = max(sum(1 for a, b in zip([t0] + p.times, p.times) if b > t0 and b - a > 1.0)
                    for p in ranks)
        alive = "never (60 s)" if m["rejoin"] is None else "%.2f s" % m["rejoin"]
        times = "once" if waits == 1 else "%d times" % waits
        m["note"] = ("%s; w1 stayed up, listed alive %s after the stall; a rank waited out w1 "
                     "(one attempt, 3.3 s) at most %s" % (cell_s(m["recovery"]), alive, times))
        bt.log("%s: %d of w1's reads stalled %.1f s and went on; w1 stayed up; all 3 workers "
               "listed alive %s after the stall; a rank waited out w1 (a gap over 1 s) at most "
               "%s" % (name, stalled, t1 - t0, alive, times))
        if waits > 2:
            raise bt.TestFailure("%s: a rank waited out the stalled w1 %d times in %.0f s: the "
                                 "loader should avoid it after the first" %
                                 (name, waits, DISK_STALL_S))
        return bounded(name, m, STALL_BOUND_S)
    finally:
        mnt.unstall()
        cl.workers["w1"].stop()
        mnt.close()
        cl.start_worker("w1")
        wait_healthy(ctx)


# A batch budget long enough to wait out a 30 s outage (issue 25's measurement).
LONG_TIMEOUT_MS = 120000


def trainer_partition_30s_wait(ctx):
    """(new) One trainer cut off for 30 s with --timeout-ms 120000, so that it waits the
    outage out: it must deliver again within the recovery bound of the heal, every batch
    exact, whatever its batch budget (connection attempts are bounded on their own)."""
    return _partition(ctx, "trainer_partition_30s_wait", "t1", 30.0,
                      extra=["--timeout-ms", LONG_TIMEOUT_MS])


def trainer_partition_30s(ctx):
    """(full) One trainer cut off for 30 s with default settings -- longer than its lease
    (10 s) and its batch budget (--timeout-ms 10 s): unable to prove its lease it hands out
    nothing and keeps confirming it for --retry-ms (60 s by default, docs/client.md); after
    the heal the coordinator renews the lease nobody took, and the rank delivers again within
    the recovery bound, every batch exact (it stopped with "could not be fetched" after two
    batch budgets before leases were fenced)."""
    return _partition(ctx, "trainer_partition_30s", "t1", 30.0)


# A trainer that reaches nothing stops once its lease has gone unconfirmed for --retry-ms.
# The loader looks at its lease before handing a batch out, which it does after that batch's
# fetch failed (--timeout-ms, 10 s) at the latest; confirming the lease is then tried for
# --retry-ms (measured: 20.6 s in all).
GIVE_UP_RETRY_MS = 10000
GIVE_UP_BOUND_S = 10.0 + GIVE_UP_RETRY_MS / 1e3 + RECOVERY_BOUND_S
GIVE_UP_SAYS = ("has not vouched for this loader's lease", "could not be fetched")


def trainer_partition_30s_giveup(ctx):
    """(full) One trainer cut off for 30 s with --retry-ms 10000: it stops with a clear error
    once its lease has gone unconfirmed for that long (GIVE_UP_BOUND_S), never hanging, every
    batch it handed out exact; the other ranks go on exactly. (A trainer is expected to
    restart from its cursor.)"""
    name = "trainer_partition_30s_giveup"
    ranks = start_held(ctx, "f-trainer-partition-giveup", extra=["--retry-ms", GIVE_UP_RETRY_MS])
    cut = ranks[1]
    t0 = time.monotonic()
    ctx.net.partition("t1")
    release(ranks)
    try:
        rc = cut.wait(GIVE_UP_BOUND_S + 10)
        t_exit = cut.exited_at() - t0
    finally:
        time.sleep(max(0.0, 30.0 - (time.monotonic() - t0)))
        ctx.net.heal("t1")
    t1 = time.monotonic()
    err = cut.stderr()
    e2e.check_clean_log("%s: rank 1" % name, err)
    exact(ctx, name, cut, cut.result()[0], prefix=True)
    said = next((x for x in err.splitlines() if any(k in x for k in GIVE_UP_SAYS)), "")
    if rc == 0:
        raise bt.TestFailure("%s: rank 1 finished inside a 30 s partition" % name)
    if not said:
        raise bt.TestFailure("%s: rank 1 exited %d without saying why: %s" % (name, rc,
                                                                             err[-600:]))
    bt.log("%s: rank 1 stopped %.1f s into the partition, every batch it handed out exact, "
           "with a clear error: %s" % (name, t_exit, said[:300]))
    others = [p for p in ranks if p is not cut]
    m = finish(ctx, name, others, t0, t1)
    m["exit_lag"] = 0.0
    m["note"] = ("with `--retry-ms 10000` the rank stops after %.1f s (\"%s\"); the others go "
                 "on (%s)" % (t_exit, next(k for k in GIVE_UP_SAYS if k in said),
                              rec_cell(m["recovery"])))
    wait_healthy(ctx)
    if t_exit > GIVE_UP_BOUND_S:
        raise bt.TestFailure("%s: rank 1 took %.1f s to give up (bound %.1f s)" %
                             (name, t_exit, GIVE_UP_BOUND_S))
    return bounded(name, m, STALL_BOUND_S)


# ---------------------------------------------------------------------------------------
# the dataset's files change under the workers


def _overwrite(path):
    """Every byte after the .npy header replaced by another, in place (one pwrite, prepared
    beforehand): same size, same inode, a valid file with other samples."""
    with open(path, "rb") as f:
        data = f.read()
    start = 10 + struct.unpack_from("<H", data, 8)[0]  # format 1.0: u16 header length
    new = (int.from_bytes(data[start:], "little") ^ int.from_bytes(b"\xa5" * (len(data) - start),
                                                                   "little"))
    new = new.to_bytes(len(data) - start, "little")

    def change():
        fd = os.open(path, os.O_WRONLY)
        try:
            if os.pwrite(fd, new, start) != len(new):
                raise bt.TestFailure("short write overwriting %s" % path)
        finally:
            os.close(fd)
    return change


# how -> a function of the file's path that prepares the change and returns it (to be run
# while the ranks fetch).
CHANGES = {
    "truncated": lambda path: lambda: os.truncate(path, os.path.getsize(path) // 2),
    "overwritten": _overwrite,
    "deleted": lambda path: lambda: os.unlink(path),
}


# What a rank of a dataset whose file changed may stop with: the read that found the change
# (FAILED_PRECONDITION, "changed on disk since the dataset was opened"), or, from the
# dataset reopened for the next request, the new file's own error (a truncated .npy is
# CORRUPT), a fingerprint that is not the job's (MISMATCH: the same glob now names other
# bytes, or fewer files) or a file gone (NOT_FOUND). Never UNAVAILABLE or a deadline: data
# that is gone is not a failure to retry.
DATA_GONE = ("BW_FAILED_PRECONDITION", "BW_CORRUPT", "BW_MISMATCH", "BW_NOT_FOUND")


def _file_changed(ctx, how):
    """One of the 3 files of a dataset read by 4 ranks is changed (`how`) under the workers
    while the ranks fetch, and while the same workers serve another dataset to 4 ranks of
    another job. The ranks of the changed dataset must stop with a DATA_GONE error naming the
    file or the dataset within RECOVERY_BOUND_S of the change, having delivered only exact
    batches (the old file's bytes: never the new file's under the old fingerprint); the other
    job's ranks must deliver their whole sequence exactly, with no stall over STALL_BOUND_S;
    no worker may die."""
    name = "file_" + how
    cl = ctx.cl
    sub = "chg-" + how
    shutil.copytree(os.path.join(cl.root, "big"), os.path.join(cl.root, sub))
    try:
        victim = sorted(glob.glob(os.path.join(cl.root, sub, "part-*.npy")))[1]
        rel = os.path.relpath(victim, cl.root)
        changed = start_held(ctx, "f-" + name.replace("_", "-"), spec="npy:%s/part-*.npy" % sub)
        others = start_held(ctx, "f-" + name.replace("_", "-") + "-other")
        change = CHANGES[how](victim)
        release(others)
        step_on(changed)
        t0 = time.monotonic()
        change()  # the other job's requests are in flight, the changed dataset's ranks run on
        release(changed)
        stops, msgs = [], []
        for p in changed:
            rc = p.wait(RANK_TIMEOUT_S)
            err = p.stderr()
            e2e.check_clean_log("%s: rank %d" % (name, p.rank), err)
            got, _ = p.result()
            if rc == 0:
                raise bt.TestFailure("%s: rank %d finished its %d batches though %s was %s" %
                                     (name, p.rank, len(got), rel, how))
            exact(ctx, name, p, got, prefix=True)
            last = err.strip().splitlines()[-1] if err.strip() else ""
            if (rel not in last and "%s/part-*.npy" % sub not in last) or \
                    not any(c in last for c in DATA_GONE):
                raise bt.TestFailure("%s: rank %d exited %d without a clear error naming %s or "
                                     "its dataset: %s" % (name, p.rank, rc, rel, err[-1500:]))
            stops.append(p.exited_at() - t0)
            msgs.append(last)
        bt.log("%s: the 4 ranks of the changed dataset stopped %.2f-%.2f s after the change, "
               "after %s exact batches, with %s; rank 0 said: %s" %
               (name, min(stops), max(stops),
                "/".join(str(len(p.result()[0])) for p in changed),
                "/".join(sorted({c for c in DATA_GONE for x in msgs if c in x})), msgs[0][:400]))
        m = finish(ctx, name, others, t0, t0)
        m["recovery"] = max(stops)  # the changed dataset's ranks: until each stopped
        m["fault"] = 0.0
        m["note"] = ("its 4 ranks stop %.2f-%.2f s after with %s naming the file or the "
                     "dataset, every batch before exact; 4 ranks of another dataset on the "
                     "same workers finish exactly; no worker dies" %
                     (min(stops), max(stops), " or ".join(
                         "`%s`" % c for c in DATA_GONE if any(c in x for x in msgs))))
        dead = [w for w, d in cl.workers.items() if not d.running()]
        if dead:
            raise bt.TestFailure("%s: worker(s) %s died" % (name, ", ".join(dead)))
        for w, d in cl.workers.items():
            e2e.check_clean_log("worker " + w, d.log_text())
        wait_healthy(ctx)
        bt.log("%s: every worker still up; the other job's 4 ranks exact" % name)
        return bounded(name, m, STALL_BOUND_S)
    finally:
        shutil.rmtree(os.path.join(cl.root, sub), ignore_errors=True)


def file_truncated(ctx):
    """(9) A dataset file truncated to half under the ranks (another dataset keeps serving)."""
    return _file_changed(ctx, "truncated")


def file_overwritten(ctx):
    """(10) A dataset file overwritten in place (same size, other bytes) under the ranks."""
    return _file_changed(ctx, "overwritten")


def file_deleted(ctx):
    """(11) A dataset file deleted under the ranks (the workers still hold it open)."""
    return _file_changed(ctx, "deleted")


# ---------------------------------------------------------------------------------------
# the coordinator's disk, and the trainers themselves

COMMIT_STEP = 30  # where a job's ranks commit before the fault, to resume from


def _committed(ctx, name, job):
    """The 4 ranks of `job` read COMMIT_STEP batches each and commit their cursors (each
    commit acknowledged); the next process of a rank resumes there."""
    first = ctx.cl.ranks(job, SPEC, CFG, extra=["--epochs", e2e.EPOCHS, "--max-steps",
                                                COMMIT_STEP, "--commit"])
    ctx.running += first
    for p in first:
        got, _ = p.ok(RANK_TIMEOUT_S, "%s: rank %d committing at step %d" % (name, p.rank,
                                                                           COMMIT_STEP))
        if len(got) != COMMIT_STEP:
            raise bt.TestFailure("%s: rank %d read %d batches, not %d" % (name, p.rank, len(got),
                                                                          COMMIT_STEP))
        exact(ctx, name, p, got, prefix=True)


def _resumed(ctx, name, job, sig):
    """The 4 ranks of `job` after _committed: resumed from step COMMIT_STEP, committing at
    their end, held mid-epoch; the others released, rank 1 let on by STEP_ON batches (step_on)
    and sent `sig` while still running. Returns (the ranks, rank 1, when it was sent)."""
    _committed(ctx, name, job)
    ranks = start_held(ctx, job, extra=["--commit"])
    target = ranks[1]
    release([p for p in ranks if p is not target])
    step_on([target])
    t0 = time.monotonic()
    os.kill(target.pid, sig)
    target.open_gate()  # what it printed before the signal is read (a stopped one prints no more)
    return ranks, target, t0


def end_cursor(ctx, rank):
    """(epoch, step) of the cursor committed after a rank's last batch (a cursor names the
    next step)."""
    return ctx.ref[rank][-1]["epoch"], ctx.ref[rank][-1]["step"] + 1


def _committed_steps(ctx, job):
    """{rank: (epoch, step)} of each rank's committed cursor, as `batchwire status` shows."""
    for j in ctx.cl.status()["jobs"]:
        if j["name"] == job:
            return {r["rank"]: (r.get("epoch", 0), r.get("step", 0)) for r in j["ranks"]}
    raise bt.TestFailure("batchwire status does not list job %s" % job)


def _committed_at_end(ctx, name, job, hint=""):
    """Every rank of `job` has committed the cursor after its last batch, and nothing else."""
    want = {r: end_cursor(ctx, r) for r in range(e2e.WORLD)}
    got = _committed_steps(ctx, job)
    if got != want:
        raise bt.TestFailure("%s: the committed cursors are %r, the ranks finished at %r%s" %
                             (name, got, want, hint))


# What a commit or a join refused on a full disk must say, with the directory's path.
DISK_FULL = ("state directory is full", "No space left on device")
FULL_RETRY_MS = 1000  # the ranks' --retry-ms while the disk is full (the default is 60 s)


def coord_disk_full(ctx):
    """(12) The coordinator's state directory's disk fills up (a tmpfs, filled by another
    file) under 4 ranks: the coordinator stays up and so does every rank's batch stream; a
    join and each rank's final commit are refused with an error naming the directory and the
    full disk; no acknowledged cursor is lost; once space is freed (the fault's end) the
    ranks are restarted, resume exactly from the cursors committed before the disk filled, and
    commit again, and a coordinator restarted afterwards still holds every commit."""
    name, job = "coord_disk_full", "f-disk-full"
    cl = ctx.cl
    _committed(ctx, name, job)
    ranks = start_held(ctx, job, extra=["--commit", "--retry-ms", FULL_RETRY_MS])
    try:
        filled = cl.fill_state_dir()
        t0 = time.monotonic()
        # A new job's trainer: its changes fill what room the journal's last page had, until
        # one finds no space; from then on every change is refused at once.
        for probe in range(1, 21):
            r = bt.run(cl.net.argv("t0", [
                bt.CLI, "fetch", "--coordinator", cl.addr, "--job", "f-disk-probe-%d" % probe,
                "--dataset", SPEC, "--rank", 0, "--world-size", 1, "--batch-size", 16,
                "--max-steps", 1, "--retry-ms", 0, "--commit"]), timeout=30)
            if r.returncode != 0:
                break
        else:
            raise bt.TestFailure("%s: 20 trainers joined new jobs and committed on a full disk"
                                 % name)
        refused = next((x for x in r.stderr.splitlines() if x.startswith("batchwire fetch:")),
                       "")
        if not all(x in refused for x in DISK_FULL + (cl.state_dir,)):
            raise bt.TestFailure("%s: a trainer refused on a full disk did not say why: %s" %
                                 (name, r.stderr[-1500:]))
        bt.log("%s: state directory filled (%d MiB); the %s new job's trainer was refused: %s" %
               (name, filled >> 20, ["1st", "2nd", "3rd"][probe - 1] if probe <= 3 else
                "%dth" % probe, refused[:400]))
        release(ranks)
        for p in ranks:
            rc = p.wait(RANK_TIMEOUT_S)
            err = p.stderr()
            e2e.check_clean_log("%s: rank %d" % (name, p.rank), err)
            got, _ = p.result()
            exact(ctx, name, p, got, skip=COMMIT_STEP)
            last = next((x for x in err.splitlines() if "batchwire fetch: commit:" in x), "")
            if rc == 0 or not all(x in last for x in DISK_FULL + (cl.state_dir,)):
                raise bt.TestFailure("%s: rank %d exited %d after its %d batches; its commit "
                                     "on the full disk should have been refused, naming it: %s"
                                     % (name, p.rank, rc, len(got), err[-1500:]))
        bt.log("%s: the 4 held ranks delivered their %d..%d batches exactly; each final commit "
               "was refused: %s" % (name, min(len(p.result()[0]) for p in ranks),
                                    max(len(p.result()[0]) for p in ranks), last[:400]))
        if not cl.coord.running():
            raise bt.TestFailure("%s: the coordinator exited on a full disk:\n%s" %
                                 (name, cl.coord.log_text()[-3000:]))
        m = dict(stall=netns.stall_s(ranks, t0),
                 exit_lag=max(p.exited_at() - p.times[-1] for p in ranks))
    finally:
        if os.path.exists(cl.filler):
            cl.free_state_dir()
    t1 = time.monotonic()
    m["fault"] = t1 - t0
    again = cl.ranks(job, SPEC, CFG, extra=["--epochs", e2e.EPOCHS, "--commit"])
    ctx.running += again
    for p in again:
        got, _ = p.ok(RANK_TIMEOUT_S, "%s: rank %d after the space was freed" % (name, p.rank))
        exact(ctx, name, p, got, skip=COMMIT_STEP)
    m["recovery"] = netns.recovery_s(again, t1)
    m["run"] = max(p.exited_at() for p in again) - t1
    last = {p.rank: end_cursor(ctx, p.rank) for p in again}
    cl.restart_coordinator()
    got = bt.poll(lambda: _committed_steps(ctx, job), 20, what="the restarted coordinator")
    if got != last:
        raise bt.TestFailure("%s: after a restart the coordinator holds the cursors %r, the ranks "
                             "committed %r" % (name, got, last))
    wait_healthy(ctx)
    m["note"] = ("joins and commits refused at once, naming the directory (\"state directory is "
                 "full ... No space left on device\"); the coordinator stays up, batches keep "
                 "flowing; once space is freed the ranks, restarted, resume exactly from the "
                 "cursors acknowledged before and deliver %.2f s after; a restarted "
                 "coordinator holds every commit" % m["recovery"])
    bt.log("%s: the coordinator stayed up; after the space was freed the 4 ranks resumed from "
           "step %d exactly and committed (first batch %.2f s after), and a restarted "
           "coordinator holds their cursors %r" % (name, COMMIT_STEP, m["recovery"], got))
    return bounded(name, m, STALL_BOUND_S)


def trainer_sigkill(ctx):
    """(13) A trainer SIGKILLed mid-epoch and started again at once with the same identity
    (its rank, on the same host): it gets its rank back at once -- restart reclaim, not
    after its 10 s lease -- and resumes exactly from its last committed cursor; the other
    ranks go on exactly."""
    name, job, cl = "trainer_sigkill", "f-trainer-kill", ctx.cl
    ranks, dead, t0 = _resumed(ctx, name, job, signal.SIGKILL)
    rc = dead.wait(10)
    delivered = dead.result()[0]
    if rc != -signal.SIGKILL:
        raise bt.TestFailure("%s: rank 1 exited %d after %d batches, not by the SIGKILL" %
                             (name, rc, len(delivered)))
    exact(ctx, name, dead, delivered, skip=COMMIT_STEP, prefix=True)
    # The restart resumes from the coordinator's cursor for rank 1: the one committed at
    # COMMIT_STEP (the killed process commits only at its end, which it never reached).
    before = _committed_steps(ctx, job).get(1)
    if before != (0, COMMIT_STEP):
        raise bt.TestFailure("%s: rank 1's committed cursor is %r after the kill, not (0, %d)" %
                             (name, before, COMMIT_STEP))
    t_start = time.monotonic()
    again = cl.rank(job, SPEC, CFG, 1, extra=["--epochs", e2e.EPOCHS, "--commit"])
    ctx.running.append(again)
    got, _ = again.ok(RANK_TIMEOUT_S, "%s: rank 1 restarted" % name)
    exact(ctx, name, again, got, skip=COMMIT_STEP)
    others = [p for p in ranks if p is not dead]
    m = finish(ctx, name, others, t0, t0, skip=COMMIT_STEP)
    _committed_at_end(ctx, name, job)
    m["recovery"] = again.times[0] - t0
    m["fault"] = t_start - t0
    m["note"] = ("its rank back at once (restart reclaim, not after the %.0f s lease): first "
                 "batch %.2f s after the kill, then every batch from its committed cursor "
                 "exactly" % (cl.lease_ms / 1e3, m["recovery"]))
    bt.log("%s: rank 1 killed after %d batches; restarted, it delivered its first batch %.2f s "
           "after the kill (%.2f s after its start; lease %.0f s) and all %d from step %d "
           "exactly" % (name, len(dead.result()[0]), m["recovery"], again.times[0] - t_start,
                        cl.lease_ms / 1e3, len(got), COMMIT_STEP))
    return bounded(name, m, STALL_BOUND_S)


def trainer_sigstop_lease(ctx):
    """(14) A trainer SIGSTOPped for longer than its lease (10 s here): once the lease has
    run out a new process for its rank takes it over at once and resumes exactly from the
    last committed cursor; the stopped one, continued, is fenced -- it stops with
    BW_LEASE_LOST within RECOVERY_BOUND_S, every batch it handed out exact, and commits
    nothing; the other ranks go on exactly."""
    name, job, cl = "trainer_sigstop_lease", "f-trainer-stop", ctx.cl
    ranks, stale, t0 = _resumed(ctx, name, job, signal.SIGSTOP)
    try:
        time.sleep(cl.lease_ms / 1e3 + 1.0)
        t_take = time.monotonic()
        new = cl.rank(job, SPEC, CFG, 1, extra=["--epochs", e2e.EPOCHS, "--commit"])
        ctx.running.append(new)
        taken, _ = new.ok(RANK_TIMEOUT_S, "%s: rank 1 taken over" % name)
        exact(ctx, name, new, taken, skip=COMMIT_STEP)
        takeover = new.times[0] - t_take
        seen = stale.batches_seen()
    finally:
        t1 = time.monotonic()
        os.kill(stale.pid, signal.SIGCONT)
    rc = stale.wait(RANK_TIMEOUT_S)
    err = stale.stderr()
    e2e.check_clean_log("%s: the stale rank 1" % name, err)
    mine, _ = stale.result()
    exact(ctx, name, stale, mine, skip=COMMIT_STEP, prefix=True)
    stopped = stale.exited_at() - t1
    if rc == 0 or "BW_LEASE_LOST" not in err:
        raise bt.TestFailure("%s: the stale rank 1 exited %d after the takeover, not with "
                             "BW_LEASE_LOST: %s" % (name, rc, err[-1500:]))
    # Fenced before it hands out anything more: a loader that has not heard from the
    # coordinator for longer than its lease confirms the lease before the next batch
    # (docs/client.md). At most the one batch whose hand-out was under way at the SIGSTOP.
    if len(mine) - seen > 1:
        raise bt.TestFailure("%s: the stale rank 1 handed out %d batches after it was "
                             "continued, before it learned its lease was gone" %
                             (name, len(mine) - seen))
    others = [p for p in ranks if p is not stale]
    m = finish(ctx, name, others, t0, t0, skip=COMMIT_STEP)
    _committed_at_end(ctx, name, job, " (did the stale rank commit?)")
    m.update(recovery=stopped, fault=t1 - t0)
    m["note"] = ("a new process for the rank takes it over, first batch %.2f s after its start, "
                 "exact from the committed cursor; the stopped one, continued, stops %.2f s "
                 "later with `BW_LEASE_LOST` and commits nothing (it handed out %d batch%s it "
                 "had fetched before its first heartbeat was refused)" %
                 (takeover, stopped, len(mine) - seen, "" if len(mine) - seen == 1 else "es"))
    lost = next((x for x in err.splitlines() if "BW_LEASE_LOST" in x), "")
    bt.log("%s: rank 1 paused %.1f s; a new process took rank 1 over %.2f s after it started "
           "and read its %d batches from step %d exactly; the stale one, continued, stopped "
           "%.2f s later with: %s (%d batches handed out after the pause)" %
           (name, t1 - t0, takeover, len(taken), COMMIT_STEP, stopped,
            lost[:300], len(mine) - seen))
    if takeover > RECOVERY_BOUND_S:
        raise bt.TestFailure("%s: the new process took %.2f s to deliver" % (name, takeover))
    return bounded(name, m, STALL_BOUND_S)


SHORT = [worker_sigkill, loss_10, worker_sigstop_3s, worker_partition_2s, coord_partition_2s,
         coord_restart, coord_sigstop_3s, trainer_partition_2s, file_truncated,
         file_overwritten, file_deleted, coord_disk_full, trainer_sigkill, trainer_sigstop_lease,
         worker_new_ip, coord_new_ip, worker_oneway_in, worker_oneway_out,
         worker_disk_stall_10s]
FULL = SHORT + [worker_partition_30s, coord_partition_30s, worker_link_down_5s,
                worker_latency_50ms, worker_latency_200ms, trainer_partition_30s,
                trainer_partition_30s_giveup,
                trainer_partition_30s_wait]


# ---------------------------------------------------------------------------------------
# the recovery table (docs/operating.md, "Measured recovery"; scripts/recovery-table)

# scenario -> its row's fault, one line (a scenario not here gets its docstring's first
# sentence).
TABLE_FAULT = {
    "worker_sigkill": "worker SIGKILL mid-epoch",
    "loss_10": "10 % packet loss on every host for 5 s",
    "worker_sigstop_3s": "worker SIGSTOP 3 s",
    "worker_partition_2s": "worker partitioned 2 s",
    "coord_partition_2s": "coordinator partitioned 2 s",
    "coord_restart": "coordinator SIGKILL and restart",
    "coord_sigstop_3s": "coordinator SIGSTOP 3 s",
    "trainer_partition_2s": "trainer partitioned 2 s",
    "file_truncated": "a dataset file truncated to half while 4 ranks read it",
    "file_overwritten": "a dataset file overwritten in place (same size)",
    "file_deleted": "a dataset file deleted",
    "coord_disk_full": "the coordinator's state directory's disk full",
    "trainer_sigkill": "trainer SIGKILL, started again at once",
    "trainer_sigstop_lease": "trainer SIGSTOP 11 s (past its 10 s lease)",
    "worker_new_ip": "worker SIGKILL, started again at once on a new IP under the same name",
    "coord_new_ip": "coordinator SIGKILL, started again at once on a new IP under the same name",
    "worker_oneway_in": "frames to a worker dropped 5 s (its own delivered)",
    "worker_oneway_out": "frames from a worker dropped 5 s (those to it delivered)",
    "worker_disk_stall_10s": "a worker's disk reads stall 10 s (other workers hold the same "
                             "shards)",
    "worker_partition_30s": "worker partitioned 30 s (full set)",
    "coord_partition_30s": "coordinator partitioned 30 s (full set)",
    "worker_link_down_5s": "worker's own link down 5 s (full set)",
    "worker_latency_50ms": "50 ms added each way to one worker, whole run (full set)",
    "worker_latency_200ms": "200 ms added each way to one worker, whole run (full set)",
    "trainer_partition_30s": "trainer partitioned 30 s, longer than its lease and batch budget "
                             "(full set)",
    "trainer_partition_30s_giveup": "trainer partitioned 30 s with `--retry-ms 10000` (full set)",
    "trainer_partition_30s_wait": "trainer partitioned 30 s with `--timeout-ms 120000` (full "
                                  "set)",
}
TABLE_HEAD = "| fault | recovery | longest stall |\n|---|---|---|\n"


def cell_s(v):
    return "--" if v is None else "%.2f s" % v


def rec_cell(v):
    """A recovery figure (recovery_s: None where every rank had delivered all before the
    fault's end)."""
    return "none (every rank done before the fault's end)" if v is None else "%.2f s" % v


def table_row(name, fn, verdict, m, detail):
    """One markdown row: the fault, the recovery (the scenario's note where it gave one, which
    holds its figures; else the figure, with the time until the coordinator listed every
    worker alive where it was measured), the longest stall. A run that failed says so."""
    # Else the docstring's first sentence, without its "(N)" / "(full)" tag.
    doc = re.sub(r"^\([^)]*\) ", "", " ".join((getattr(fn, "__doc__", None) or name).split()))
    fault = TABLE_FAULT.get(name) or re.split(r"(?<=[^.]\.) ", doc, 1)[0].rstrip(".:")
    rec = m.get("note")
    if rec is None:
        rec = rec_cell(m["recovery"]) if "recovery" in m else "--"
        if "rejoin" in m:
            healed = any(x in name for x in ("partition", "oneway", "link"))
            rec += "; workers listed alive again %s after the %s" % (
                "never (60 s)" if m["rejoin"] is None else "%.2f s" % m["rejoin"],
                "heal" if healed else "fault's end")
    if verdict not in ("PASS", "XPASS"):
        rec = ("" if rec == "--" else rec + " -- ") + "**%s**: %s" % (verdict, detail)
    cells = [fault, rec, cell_s(m.get("stall"))]
    return "| %s |\n" % " | ".join(" ".join(c.replace("|", "\\|").split()) for c in cells)


def write_table(path, results, fns):
    """The table of the scenarios run, in run order, to `path` (BW_FAULTS_TABLE)."""
    with open(path, "w") as f:
        f.write(TABLE_HEAD)
        for name, verdict, m, detail, _ in results:
            f.write(table_row(name, fns.get(name), verdict, m, detail))
    bt.log("recovery table (%d rows) written to %s; scripts/recovery-table %s puts it in "
           "docs/operating.md" % (len(results), path, path))


def test(tmpdir):
    okp, why = netns.have_privileges()
    if not okp:
        print("SKIP: the fault suite needs network namespaces and nft: %s" % why, flush=True)
        sys.exit(77)  # ctest: SKIP_RETURN_CODE
    scenarios = FULL if MODE == "full" else SHORT
    only = [s for s in os.environ.get("BW_FAULTS_ONLY", "").split(",") if s]
    if only:
        unknown = sorted(set(only) - {s.__name__ for s in FULL})
        if unknown:
            raise bt.TestFailure("BW_FAULTS_ONLY names no scenario %s (the scenarios: %s)" %
                                 (", ".join(unknown), ", ".join(s.__name__ for s in FULL)))
        scenarios = [s for s in FULL if s.__name__ in only]
    net = netns.Net()
    results = []
    cl = None
    try:
        cl = netns.FaultCluster(tmpdir, net, state_tmpfs_mib=16)
        r = bt.cli("gen", "--format", "npy", "--out", os.path.join(cl.root, "big"),
                   "--num-samples", NUM_SAMPLES, "--shape", "256", "--dtype", "float32",
                   "--files", "3", timeout=120)
        bt.check(r.returncode == 0, "batchwire gen: %d samples in 3 .npy files" % NUM_SAMPLES,
                 r.stderr)
        import json
        ds = json.loads(r.stdout)
        ds["name"] = "big"
        ds["paths"] = [os.path.join(cl.root, "big", s) for s in ds["sources"]]
        samples = e2e.expected_samples(ds)
        want, _ = e2e.plans(CFG, NUM_SAMPLES, e2e.WORLD)
        t = time.monotonic()
        ranks = cl.ranks("ref", SPEC, CFG, extra=["--epochs", e2e.EPOCHS])
        ref = {p.rank: p.ok(RANK_TIMEOUT_S, "fault-free")[0] for p in ranks}
        for k in range(e2e.WORLD):
            e2e.compare("fault-free rank %d" % k, ref[k], want[k], samples)
        ctx = Ctx(tmpdir, net, cl, ref, want, samples)
        ctx.fault_free_s = time.monotonic() - t
        bt.ok("fault-free run in namespaces: 4 ranks x %d batches equal the plan and the "
              "generator's bytes (%.2f s)" % (len(ref[0]), ctx.fault_free_s))
        for fn in scenarios:
            name = fn.__name__
            t = time.monotonic()
            bt.log("=== scenario %s: %s" % (name, (fn.__doc__ or "").strip().splitlines()[0]))
            ctx.running = []
            try:
                m = fn(ctx)
                verdict = "XPASS" if name in XFAIL else "PASS"
                detail = ""
                if m.get("skipped"):  # this machine cannot apply the fault (no FUSE)
                    verdict, detail = "SKIP", m["skipped"]
            except bt.TestFailure as e:
                m = getattr(e, "measure", {})
                verdict = "XFAIL" if name in XFAIL else "FAIL"
                detail = str(e).splitlines()[0][:300]
                bt.log("%s: %s" % (verdict, str(e)[:3000]))
                # Leave a clean cluster to the next scenario.
                for p in getattr(ctx, "running", []):
                    if p.proc.poll() is None:
                        os.killpg(p.proc.pid, signal.SIGKILL)
                for d in [cl.coord] + list(cl.workers.values()):
                    d.send(signal.SIGCONT)
                for h in list(net.cut):
                    net.heal(h)
                for h in net.hosts:
                    net.link(h, True)
                net.loss_off()
                if not cl.coord.running():
                    cl.start_coordinator()
                for wid, d in list(cl.workers.items()):
                    if not d.running():
                        cl.start_worker(wid)
                wait_healthy(ctx)
            results.append((name, verdict, m, detail, time.monotonic() - t))
    finally:
        bt.kill_all()
        net.close()
        if cl is not None:
            cl.unmount()
    fmt = lambda v: "-" if v is None else "%.2fs" % v  # noqa: E731
    print("\n%-22s %-6s %9s %8s %8s %8s %8s %7s  %s" % (
        "scenario", "result", "recovery", "stall", "exitlag", "rejoin", "fault", "took", "note"))
    for name, verdict, m, detail, took in results:
        print("%-22s %-6s %9s %8s %8s %8s %8s %6.1fs  %s" % (
            name, verdict, fmt(m.get("recovery")), fmt(m.get("stall")), fmt(m.get("exit_lag")),
            fmt(m.get("rejoin")), fmt(m.get("fault")), took, detail or XFAIL.get(name, "")))
    print("bounds: recovery (fault end -> every rank delivering) %.1f s, stall %.1f s; "
          "fault-free run of the 4 ranks: %.2f s" %
          (RECOVERY_BOUND_S, STALL_BOUND_S, ctx.fault_free_s), flush=True)
    if os.environ.get("BW_FAULTS_TABLE"):
        write_table(os.environ["BW_FAULTS_TABLE"], results, {f.__name__: f for f in FULL})
    bad = [n for n, v, _, _, _ in results if v == "FAIL" or (STRICT and v == "XFAIL")]
    if bad:
        raise bt.TestFailure("scenarios failed: %s" % ", ".join(bad))


if __name__ == "__main__":
    bt.main(test, timeout=int(os.environ.get("BW_FAULTS_TIMEOUT", "900" if MODE == "full"
                                                                      else "240")))
