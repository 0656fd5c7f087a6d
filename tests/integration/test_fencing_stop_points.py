#!/usr/bin/python3
"""Fencing wherever the trainer is stopped (docs/client.md, "Fencing"; issue 30).

Each trial: trainer A (`batchwire fetch`, rank 0 of 1, 3 workers, batches that span every
worker, --prefetch 1..16 so that fetches to every worker are in flight, --commit-every K so that
commits happen all the time) reads at full speed and is SIGSTOPped at a random moment of its
cycle -- mid-fetch, mid-heartbeat, mid-commit, between batches, printing. Half the trials reach
the coordinator through a proxy that delays every byte (tests/faults/delay_proxy.py), so that a
heartbeat or a commit is in flight at the stop most of the time: its answer, sent before the
takeover, is read only after SIGCONT and must not make the stale lease look fresh. A stays
stopped past its lease; trainer B joins rank 0 and takes it over (and keeps it: B's stdout is
left unread after its first batch, so it holds the rank with its heartbeats running); then A is
continued. A flushes each batch line as it hands the batch out, so every line it printed before
the stop is in the pipe by then: after SIGCONT it may print at most the one batch whose
hand-out was under way, and must exit with BW_LEASE_LOST naming B's process.

BW_FENCING_TRIALS (default 40), BW_FENCING_LEASE_MS (default 500; the coordinator's
--lease-ms, heartbeats every third of it), BW_FENCING_PARALLEL (default 2: trials at once, each
on a job of its own, on one cluster), BW_FENCING_RUN_S (longest random run before the stop;
default: one lease). The default-lease variant (10 s lease, 100 trials) is registered with the
long tests (label long: -DBW_LONG_TESTS=ON).
"""

import collections
import os
import random
import signal
import subprocess
import sys
import threading
import time

import bwtest as bt
from test_client_e2e import Cluster, Fetch

N, B = 50000, 8
C = {"mode": "torch", "B": B}
DS = "npy:ds/part-00000.npy"
TRIALS = int(os.environ.get("BW_FENCING_TRIALS", "40"))
LEASE_MS = int(os.environ.get("BW_FENCING_LEASE_MS", "500"))
PARALLEL = max(1, int(os.environ.get("BW_FENCING_PARALLEL", "2")))
RUN_S = float(os.environ.get("BW_FENCING_RUN_S", str(LEASE_MS / 1000.0)))
PROXY_DELAY_MS = max(5, min(50, LEASE_MS // 20))
PROXY = os.path.join(os.environ.get("BW_SOURCE_DIR", os.path.join(os.path.dirname(
    os.path.abspath(__file__)), "..", "..")), "tests", "faults", "delay_proxy.py")


def start_proxy(target):
    p = subprocess.Popen([sys.executable, PROXY, "127.0.0.1:0", target, str(PROXY_DELAY_MS)],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         start_new_session=True, preexec_fn=bt._child_setup)
    bt._register(p)
    line = p.stdout.readline().strip()
    bt.check(line.startswith("listening on "), "delay proxy (%d ms each way) to the coordinator: "
             "%s" % (PROXY_DELAY_MS, line))
    return p, line.split()[-1]


def take_over(cl, job, deadline_s):
    """Trainer B on rank 0 of `job`: started again until it holds the rank (its first batch
    printed); B's stdout is not read after that, so it stays, holding the rank."""
    t_end = time.monotonic() + deadline_s
    tries = 0
    while True:
        tries += 1
        b = Fetch(cl.addr, job, DS, C, 0, world=1, gate_after=1,
                  extra=["--epochs", 1000, "--prefetch", 1])
        while b.batches_seen() < 1 and b.proc.poll() is None and time.monotonic() < t_end:
            time.sleep(0.01)
        if b.batches_seen() >= 1:
            return b, tries
        rc = b.wait(30)
        if "BW_ALREADY_EXISTS" not in b.stderr() or time.monotonic() >= t_end:
            raise bt.TestFailure("B could not take rank 0 of %s over (exit %s, try %d):\n%s" %
                                 (job, rc, tries, b.stderr()[-2000:]))
        time.sleep(0.1)  # A's lease had not quite expired by the coordinator's clock


def trial(cl, i, rng, proxy_addr, results):
    job = "stop%d" % i
    k = rng.choice([1, 2, 3, 5, 8, 13])
    prefetch = rng.choice([1, 2, 4, 8, 16])
    proxied = proxy_addr is not None and i % 2 == 1
    run_s = rng.uniform(0, RUN_S)
    a = Fetch(proxy_addr if proxied else cl.addr, job, DS, C, 0, world=1,
              extra=["--epochs", 1000, "--prefetch", prefetch, "--commit-every", k,
                     "--retry-ms", 60000])
    bt.poll(lambda: a.batches_seen() >= 1 or a.proc.poll() is not None, 60,
            what="trial %d: A's first batch" % i)
    bt.check(a.proc.poll() is None, "trial %d: A runs" % i, a.stderr()[-2000:])
    time.sleep(run_s)
    os.kill(a.pid, signal.SIGSTOP)
    time.sleep(LEASE_MS * 1.25 / 1000.0 + 0.1)  # past the lease; lines before the stop are read
    printed_at_stop = a.batches_seen()
    b, tries = take_over(cl, job, 20 + LEASE_MS / 1000.0)
    before = a.batches_seen()  # A is still stopped: nothing it printed after the takeover
    t_cont = time.monotonic()
    os.kill(a.pid, signal.SIGCONT)
    rc = a.wait(30 + 2 * LEASE_MS / 1000.0)
    stopped_s = time.monotonic() - t_cont
    after = a.batches_seen() - before
    err = a.stderr()
    results.append({"trial": i, "k": k, "prefetch": prefetch, "proxied": proxied,
                    "run_s": run_s, "printed": printed_at_stop, "after": after, "rc": rc,
                    "stopped_s": stopped_s, "b_tries": tries})
    what = ("trial %d (%s, --commit-every %d, --prefetch %d, stopped after %.3f s and %d "
            "batches)" % (i, "via the delay proxy" if proxied else "direct", k, prefetch, run_s,
                          printed_at_stop))
    bt.check(after <= 1, "%s: A printed %d batch(es) after the takeover (at most the one it "
             "held)" % (what, after), "".join(a.lines[-5:]) + err[-2000:])
    bt.check(rc == 1 and "BW_LEASE_LOST" in err,
             "%s: A exited %s with BW_LEASE_LOST %.2f s after SIGCONT" % (what, rc, stopped_s),
             err[-3000:])
    bt.check("pid %d holds it now" % b.pid in err,
             "%s: A's message names B (pid %d) as the holder" % (what, b.pid), err[-2000:])
    os.killpg(b.pid, signal.SIGKILL)
    b.wait(30)


def test(tmpdir):
    cl = Cluster(tmpdir, nworkers=3, lease_ms=LEASE_MS, heartbeat_ms=200)
    r = bt.cli("gen", "--format", "npy", "--out", os.path.join(cl.root, "ds"), "--num-samples", N,
               "--sample-bytes", 64, timeout=60)
    bt.check(r.returncode == 0, "gen a .npy dataset of %d samples" % N, r.stderr)
    _proxy, proxy_addr = start_proxy(cl.addr)
    seed = int(os.environ.get("BW_FENCING_SEED", str(int(time.time()))))
    bt.log("%d trials, lease %d ms, %d at once, runs of up to %.2f s before the stop, seed %d" %
           (TRIALS, LEASE_MS, PARALLEL, RUN_S, seed))
    results, failures = [], []
    todo = collections.deque(range(TRIALS))
    lock = threading.Lock()

    def lane(n):
        rng = random.Random(seed * 1000 + n)
        while True:
            with lock:
                if not todo or failures:
                    return
                i = todo.popleft()
            try:
                trial(cl, i, rng, proxy_addr, results)
            except BaseException as e:  # noqa: B902 -- reported by the main thread
                with lock:
                    failures.append(e)
                return

    t0 = time.monotonic()
    lanes = [threading.Thread(target=lane, args=(n,)) for n in range(PARALLEL)]
    for t in lanes:
        t.start()
    for t in lanes:
        t.join()
    if failures:
        raise failures[0]
    hist = collections.Counter(x["after"] for x in results)
    bt.check(len(results) == TRIALS and all(x["after"] <= 1 and x["rc"] == 1 for x in results),
             "%d consecutive trials in %.1f s: every stale trainer printed at most one batch after "
             "the takeover (%s) and exited with BW_LEASE_LOST within %.2f s of SIGCONT; %d via "
             "the delay proxy; B needed %d extra join(s)" %
             (len(results), time.monotonic() - t0,
              ", ".join("%d trial(s) %d" % (hist[n], n) for n in sorted(hist)),
              max(x["stopped_s"] for x in results), sum(x["proxied"] for x in results),
              sum(x["b_tries"] - 1 for x in results)))
    cl.stop()


if __name__ == "__main__":
    bt.main(test, timeout=max(120, int(TRIALS * (LEASE_MS * 1.25 / 1000 + RUN_S + 8) /
                                         PARALLEL) + 60))
