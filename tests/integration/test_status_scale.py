"""`batchwire status` and the coordinator's /metrics for a job too large to list rank by rank.

A coordinator with `--metrics-rank-series 4` holds job "big" (10 ranks) and job "small" (3).
Ranks 0-7 of big heartbeat with their progress (rank k at step 100 - 10k), rank 9 joins and
falls silent until its lease expires, rank 8 never joins. Then:
  * /metrics has per-rank series for small and none for big; both have the per-job summary,
    big's with 8 ranks reporting, lag median 40 and max 70 steps, rates min <= max <= sum;
    every family is listed in docs/operating.md;
  * `status --job big --limit 3` summarises all ten ranks (8 live, 1 expired, 1 none, the
    lag) and lists three: the expired, the never-joined and the furthest behind (ranks 7, 8,
    9 in rank order), saying that 3 of 10 are shown; `--limit 0` lists all ten;
  * `--ranks 2-4` lists exactly ranks 2, 3 and 4, in the table and in JSON (which also
    carries the summary); a bad `--ranks` is a usage error (exit 2) naming it.
"""

import json
import os
import re
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwtest as bt  # noqa: E402
import jobs_rpc as jr  # noqa: E402

LEASE_MS = 1500
METRICS_RE = r"metrics on http://(\S+)/metrics"


def scrape(addr):
    with urllib.request.urlopen("http://%s/metrics" % addr, timeout=10) as r:
        return r.read().decode("utf-8")


def samples(text, name):
    """{frozenset of label items: value} of the series of family `name`."""
    out = {}
    for m in re.finditer(r"^%s\{([^}]*)\} (\S+)$" % re.escape(name), text, re.M):
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        out[labels] = float(m.group(2))
    return out


def value(text, name, **labels):
    return samples(text, name).get(frozenset(labels.items()))


def test(tmp):
    coord = bt.coordinator(tmp, args=["--metrics-listen", "127.0.0.1:0", "--metrics-rank-series",
                                      4, "--lease-ms", LEASE_MS])
    maddr = coord.wait_log(METRICS_RE)[0].group(1)
    j = jr.Jobs(coord.addr)
    j.create("big", world=10)
    j.create("small", world=3)
    leases = {k: j.join("big", k, 10, pid=2000 + k) for k in range(8)}
    j.join("big", 9, 10, pid=2009)  # then silent: its lease expires
    small = {k: j.join("small", k, 3, pid=3000 + k) for k in range(3)}

    stop = threading.Event()

    def beat():
        while not stop.is_set():
            for k, lz in leases.items():
                live = jr.pb.RankLive(epoch=0, step=100 - 10 * k, epoch_steps=1000,
                                      batches=100 - 10 * k)
                j.call("LeaseHeartbeat", jr.pb.LeaseHeartbeatRequest(
                    job="big", rank=k, live=live, **jr.lease_fields(lz)))
            for k, lz in small.items():
                live = jr.pb.RankLive(epoch=0, step=5, epoch_steps=1000, batches=5)
                j.call("LeaseHeartbeat", jr.pb.LeaseHeartbeatRequest(
                    job="small", rank=k, live=live, **jr.lease_fields(lz)))
            stop.wait(0.2)

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        bt.poll(lambda: [r.lease for r in j.get("big").ranks][9] == jr.pb.LEASE_STATE_EXPIRED,
                10, interval=0.1, what="rank 9's lease expired")
        check_metrics(maddr)
        check_status(coord.addr)
    finally:
        stop.set()
        t.join()
        j.close()
    coord.stop()


def check_metrics(maddr):
    text = scrape(maddr)
    with open(os.path.join(bt.SOURCE_DIR, "docs", "operating.md")) as f:
        doc = f.read()
    doc = doc[doc.index("## Metrics"):]
    missing = sorted(f for f in set(re.findall(r"^# TYPE (\S+) ", text, re.M))
                     if "`%s`" % f not in doc)
    bt.check(not missing, "every family of the scrape is listed in docs/operating.md", missing)
    steps = samples(text, "batchwire_coordinator_rank_step")
    jobs = {dict(k)["job_name"] for k in steps}
    bt.check(jobs == {"small"} and len(steps) == 3,
             "per-rank series for small (3 ranks) only, none for big (10 > 4)", steps)
    bt.check(value(text, "batchwire_coordinator_job_ranks_reporting", job_name="big") == 8 and
             value(text, "batchwire_coordinator_job_ranks_reporting", job_name="small") == 3,
             "ranks reporting: big 8, small 3")
    med = value(text, "batchwire_coordinator_job_lag_steps", job_name="big", stat="median")
    mx = value(text, "batchwire_coordinator_job_lag_steps", job_name="big", stat="max")
    bt.check(med == 40 and mx == 70, "big's lag: median 40, max 70 steps (%s, %s)" % (med, mx))
    rmin, rmax, rsum = (value(text, "batchwire_coordinator_job_batches_per_second",
                              job_name="big", stat=s) for s in ("min", "max", "sum"))
    bt.check(None not in (rmin, rmax, rsum) and 0 <= rmin <= rmax <= rsum,
             "big's rates: 0 <= min %s <= max %s <= sum %s" % (rmin, rmax, rsum))
    bt.check(value(text, "batchwire_coordinator_job_ranks_committed", job_name="big") == 0 and
             not samples(text, "batchwire_coordinator_job_commit_age_seconds"),
             "no commits: 0 ranks committed, no commit age")


def rank_rows(stdout):
    return [int(ln.split()[0]) for ln in stdout.splitlines() if re.match(r"^\s+\d+\s+(live|expired|none)\s", ln)]


def check_status(addr):
    r = bt.cli("status", "--coordinator", addr, "--job", "big", "--limit", 3)
    bt.check(r.returncode == 0, "status --job big --limit 3 exits 0", r.stderr)
    bt.check("ranks by lease: 8 live, 1 expired, 1 none; 8 report progress, lag behind the "
             "furthest rank: median 40, max 70 steps (rank 7)" in r.stdout,
             "the summary counts all ten ranks by lease and gives the lag", r.stdout)
    bt.check(rank_rows(r.stdout) == [7, 8, 9] and "3 of 10 ranks shown" in r.stdout,
             "three rows, the unusual first: furthest behind, never joined, expired", r.stdout)
    r = bt.cli("status", "--coordinator", addr, "--job", "big", "--limit", 0)
    bt.check(r.returncode == 0 and rank_rows(r.stdout) == list(range(10)) and
             "ranks shown" not in r.stdout, "--limit 0 lists all ten ranks", r.stdout)
    r = bt.cli("status", "--coordinator", addr, "--job", "big", "--ranks", "2-4")
    bt.check(r.returncode == 0 and rank_rows(r.stdout) == [2, 3, 4],
             "--ranks 2-4 lists ranks 2, 3 and 4", r.stdout + r.stderr)
    r = bt.cli("status", "--coordinator", addr, "--job", "big", "--ranks", "2-4", "--json")
    one = json.loads(r.stdout)
    bt.check([x["rank"] for x in one["ranks"]] == [2, 3, 4] and
             one["rank_summary"] == {"live": 8, "expired": 1, "none": 1, "committed": 0,
                                     "reporting": 8, "lag_median_steps": 40,
                                     "lag_max_steps": 70, "lag_max_rank": 7},
             "--json --ranks 2-4: those ranks, and the summary of all", one)
    full = bt.status_json(addr)
    big = [x for x in full["jobs"] if x["name"] == "big"][0]
    bt.check(len(big["ranks"]) == 10, "the full --json lists every rank of big")
    for bad in ("5-2", "x", "1-", "-3", "3-99999999999"):
        r = bt.cli("status", "--coordinator", addr, "--ranks", bad)
        bt.check(r.returncode == 2 and "--ranks '%s'" % bad in r.stderr,
                 "--ranks %s is a usage error naming it" % bad, r.stderr)


if __name__ == "__main__":
    bt.main(test, timeout=90)
