#!/usr/bin/python3
"""Restart reclaim (docs/client.md, "Joins the job"): a trainer restarted on the host where its
rank's holder ran, after that process exited, gets the rank back at once instead of after the
holder's lease expires -- also while that process is a zombie (exited, not reaped yet); a
second live trainer on the same rank is still refused, with the LOCAL_RANK hint, and a holder
that has stopped heartbeating (here: SIGSTOPped) is named without that hint.

Leases last 10 s here, so "at once" is easy to tell from "after the lease".
"""

import json
import os
import signal
import subprocess
import time

import bwtest as bt
from test_client_e2e import Cluster

N, B, LEASE_MS = 4000, 4, 10000


def fetch_argv(addr, extra=()):
    return [str(x) for x in [bt.CLI, "fetch", "--coordinator", addr, "--job", "reclaim",
                             "--dataset", "npy:ds/part-00000.npy", "--rank", "0", "--world-size",
                             "1", "--batch-size", B, "--prefetch", "2"] + list(extra)]


def held(addr):
    """A trainer on rank 0 held mid-epoch by its unread stdout."""
    p = subprocess.Popen(fetch_argv(addr), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=bt.child_env())
    bt.poll(lambda: any(rk.get("lease") == "live" and rk.get("pid") == p.pid
                        for j in bt.status_json(addr)["jobs"] for rk in j["ranks"]),
            15, what="pid %d holds rank 0" % p.pid)
    return p


def test(tmpdir):
    cl = Cluster(tmpdir, nworkers=2, lease_ms=LEASE_MS, heartbeat_ms=200)
    r = bt.cli("gen", "--format", "npy", "--out", os.path.join(cl.root, "ds"), "--num-samples", N,
               "--sample-bytes", 64, timeout=60)
    bt.check(r.returncode == 0, "gen a .npy dataset of %d samples" % N, r.stderr)

    # A crashed trainer: its restart reclaims the rank at once.
    a = held(cl.addr)
    a.send_signal(signal.SIGKILL)
    a.wait(10)
    t0 = time.monotonic()
    rb = bt.run(fetch_argv(cl.addr, ["--max-steps", "5", "--log-level", "info"]), timeout=60)
    took = time.monotonic() - t0
    steps = [x for x in (json.loads(y) for y in rb.stdout.splitlines()) if "indices" in x]
    bt.check(rb.returncode == 0 and len(steps) == 5,
             "a trainer restarted after its predecessor (pid %d) was SIGKILLed got rank 0 back "
             "in %.2f s (the lease lasts %.0f s)" % (a.pid, took, LEASE_MS / 1000), rb.stderr)
    bt.check(took < LEASE_MS / 1000 / 2, "the reclaim did not wait for the lease")
    bt.check_in("reclaiming the rank", rb.stderr, "the restarted trainer says it reclaimed")

    # A holder that has exited but is not reaped yet (a zombie: here the test does not wait
    # for it; an orphan stays one until init reaps it) counts as exited.
    z = held(cl.addr)
    z.send_signal(signal.SIGKILL)

    def state():
        with open("/proc/%d/stat" % z.pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    bt.poll(lambda: state() == "Z", 10, what="pid %d is a zombie" % z.pid)
    t0 = time.monotonic()
    rz = bt.run(fetch_argv(cl.addr, ["--max-steps", "5", "--log-level", "info"]), timeout=60)
    took = time.monotonic() - t0
    bt.check(rz.returncode == 0 and "reclaiming the rank" in rz.stderr and state() == "Z",
             "a trainer restarted while its predecessor (pid %d) was a zombie got rank 0 back in "
             "%.2f s" % (z.pid, took), rz.stderr)
    bt.check(took < LEASE_MS / 1000 / 2, "the reclaim from a zombie did not wait for the lease")
    z.wait(10)

    # A real duplicate: refused while the holder lives, with the LOCAL_RANK hint.
    c = held(cl.addr)
    rd = bt.run(fetch_argv(cl.addr, ["--max-steps", "1"]), timeout=60)
    bt.check(rd.returncode != 0 and "BW_ALREADY_EXISTS" in rd.stderr and "LOCAL_RANK" in rd.stderr,
             "a second live trainer on rank 0 is refused with the LOCAL_RANK hint: %s" %
             rd.stderr.strip()[-200:], rd.stderr)

    # The holder stops heartbeating (paused): past two heartbeat intervals (2/3 of the lease)
    # it is no longer taken for a live trainer -- no LOCAL_RANK hint -- though its lease still
    # holds the rank until it expires.
    c.send_signal(signal.SIGSTOP)
    time.sleep(LEASE_MS * 0.75 / 1000)
    rs = bt.run(fetch_argv(cl.addr, ["--max-steps", "1"]), timeout=60)
    bt.check(rs.returncode != 0 and "BW_ALREADY_EXISTS" in rs.stderr and
             "missed its heartbeats" in rs.stderr and "LOCAL_RANK" not in rs.stderr,
             "a trainer joining a rank whose holder stopped heartbeating is refused without the "
             "LOCAL_RANK hint: %s" % rs.stderr.strip()[-300:], rs.stderr)
    c.send_signal(signal.SIGKILL)
    c.wait(10)
    cl.stop()


if __name__ == "__main__":
    bt.main(test, timeout=120)
