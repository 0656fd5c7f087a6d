#!/usr/bin/python3
"""Fencing (docs/client.md, "Fails over"): once a rank's lease is taken over, the stale holder
gets no more batches and cannot commit; it stops with BW_LEASE_LOST naming the new holder.

Trainer A (`batchwire fetch`, rank 0 of 1) is paused with SIGSTOP for 3 lease times; its lease
expires and trainer B joins rank 0 and takes it over (B must get it at once, and its batches
must equal the plan from where A's committed cursor left off). Then A is resumed: its next
heartbeat is refused, so it must stop within a second with BW_LEASE_LOST, having handed out
at most the batches it had already taken before the pause was noticed, and commit nothing
(`--commit` is refused).
"""

import json
import os
import signal
import subprocess
import time

import bwtest as bt
from test_client_e2e import Cluster

N, B = 4000, 4


def fetch_argv(addr, extra=()):
    return [bt.CLI, "fetch", "--coordinator", addr, "--job", "fence", "--dataset",
            "npy:ds/part-00000.npy", "--rank", "0", "--world-size", "1", "--batch-size", B,
            "--prefetch", "2"] + list(extra)


def test(tmpdir):
    cl = Cluster(tmpdir, nworkers=2, lease_ms=500, heartbeat_ms=200)
    r = bt.cli("gen", "--format", "npy", "--out", os.path.join(cl.root, "ds"), "--num-samples", N,
               "--sample-bytes", 64, timeout=60)
    bt.check(r.returncode == 0, "gen a .npy dataset of %d samples" % N, r.stderr)
    # A: held mid-epoch by its unread stdout, then paused past its lease.
    a = subprocess.Popen([str(x) for x in fetch_argv(cl.addr, ["--commit"])],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=bt.child_env())
    bt.poll(lambda: any(rk.get("lease") == "live" for j in bt.status_json(cl.addr)["jobs"]
                        for rk in j["ranks"]), 15, what="A holds rank 0")
    time.sleep(0.5)
    a.send_signal(signal.SIGSTOP)
    time.sleep(1.5)  # three lease times
    # B: takes rank 0 over at once and reads 20 batches.
    t0 = time.monotonic()
    rb = bt.run([str(x) for x in fetch_argv(cl.addr, ["--max-steps", "20"])], timeout=60)
    took = time.monotonic() - t0
    bt.check(rb.returncode == 0, "B took rank 0 over from the paused A and read 20 batches in "
             "%.2f s" % took, rb.stderr)
    steps = [x["indices"] for x in (json.loads(y) for y in rb.stdout.splitlines()) if "indices" in x]
    rp = bt.cli("plan", "--mode", "torch", "--num-samples", N, "--world-size", 1, "--batch-size",
                B, "--rank", 0, timeout=60)
    want = [json.loads(y)["indices"] for y in rp.stdout.splitlines()][:20]
    bt.check(steps == want, "B handed out 20 batches equal to batchwire plan from step 0 (A "
             "had committed nothing)", rb.stdout[-500:])
    # A resumes: it must stop with BW_LEASE_LOST, fenced.
    a.send_signal(signal.SIGCONT)
    t1 = time.monotonic()
    out, err = a.communicate(timeout=30)
    stopped = time.monotonic() - t1
    a_steps = [json.loads(y) for y in out.decode().splitlines() if '"indices"' in y]
    bt.check(a.returncode != 0 and b"BW_LEASE_LOST" in err,
             "A, resumed after the takeover, stopped with BW_LEASE_LOST in %.2f s: %s" %
             (stopped, err.decode().strip()[-300:]), err.decode()[-2000:])
    bt.check(stopped < 5, "A stopped within 5 s of resuming")
    bt.check(b"holds it now" in err or b"has no lease" in err,
             "A's message says where the rank went (B held it, then left it)")
    st = bt.status_json(cl.addr)
    rank = next(rk for j in st["jobs"] if j["name"] == "fence" for rk in j["ranks"]
                if rk["rank"] == 0)
    bt.check(rank.get("step", 0) == 0 and rank.get("epoch", 0) == 0,
             "A committed nothing after losing its lease (the rank's cursor is still at the "
             "start: %s); A had printed %d batches" % (json.dumps(rank), len(a_steps)))
    cl.stop()


if __name__ == "__main__":
    bt.main(test, timeout=120)
