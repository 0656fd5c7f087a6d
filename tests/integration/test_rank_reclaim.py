#!/usr/bin/python3
"""Restart reclaim (docs/client.md, "Joins the job"): a trainer restarted on the host where its
rank's holder ran, after that process exited, gets the rank back at once instead of after the
holder's lease expires; a second live trainer on the same rank is still refused, with the
LOCAL_RANK hint.

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

    # A real duplicate: refused while the holder lives, with the LOCAL_RANK hint.
    c = held(cl.addr)
    rd = bt.run(fetch_argv(cl.addr, ["--max-steps", "1"]), timeout=60)
    bt.check(rd.returncode != 0 and "BW_ALREADY_EXISTS" in rd.stderr and "LOCAL_RANK" in rd.stderr,
             "a second live trainer on rank 0 is refused with the LOCAL_RANK hint: %s" %
             rd.stderr.strip()[-200:], rd.stderr)
    c.send_signal(signal.SIGKILL)
    c.wait(10)
    cl.stop()


if __name__ == "__main__":
    bt.main(test, timeout=120)
