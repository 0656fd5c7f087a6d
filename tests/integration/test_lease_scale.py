#!/usr/bin/python3
"""Leases at scale (docs/operating.md, "Leases at scale"): the coordinator asks at most
--max-heartbeats-per-second of all trainers together. A lease is --lease-ms, or longer when
the leases held, each heartbeating every third of its length, would ask more: 3 x leases /
max seconds. Each rank's lease is the length it was last told (JoinJob, LeaseHeartbeat), and
the coordinator holds the rank exactly that long after its last heartbeat.

Against a real coordinator (--lease-ms 600 --max-heartbeats-per-second 20), over gRPC:
* joins 1..4 get 600 ms; the k-th join after that ceil(3000 k / 20) ms; a heartbeat is told the
  length for every lease held now (40 ranks: 6,000 ms, a beat every 2 s: 20 beats/s in all);
* a rank whose holder went quiet stays held for the length it was told (6 s), not --lease-ms:
  another holder is refused after 1 s, with the sentence naming 6.0 s, and takes the rank
  after it;
* 20 ranks leave: heartbeats are told 3,000 ms;
* a restarted coordinator renews the restored leases for the length their number gives;
* batchwire_coordinator_lease_seconds is the length given now (0.6 s, then 6 s);
* --max-heartbeats-per-second 0: every lease is --lease-ms, whatever their number.
"""

import re
import time
import urllib.request

import grpc

import bwtest as bt
import jobs_rpc as jr

LEASE_MS, MAX_BEATS, WORLD = 600, 20, 40


def expected(leases):
    return max(LEASE_MS, -(-3000 * leases // MAX_BEATS))


def lease_metric(coord):
    addr = coord.wait_log(r"metrics on http://(\S+)/metrics")[0].group(1)
    text = urllib.request.urlopen("http://%s/metrics" % addr, timeout=10).read().decode()
    m = re.search(r"^batchwire_coordinator_lease_seconds (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def test(tmp):
    coord = bt.coordinator(tmp, args=["--lease-ms", LEASE_MS, "--max-heartbeats-per-second",
                                      MAX_BEATS, "--metrics-listen", "127.0.0.1:0"])
    bt.check(lease_metric(coord) == 0.6, "no lease yet: the metric says --lease-ms")
    c = jr.Jobs(coord.addr)
    c.create("big", samples=4000, batch=4, world=WORLD)
    leases, told = [], []
    for r in range(WORLD):
        j = c.join("big", r, WORLD, pid=1000 + r)
        leases.append(jr.lease(j))
        told.append((j.lease_ms, j.heartbeat_ms))
    bt.check(all(told[k] == (expected(k + 1), expected(k + 1) // 3) for k in range(WORLD)),
             "the k-th join is told max(--lease-ms, 3000 k / max) ms and a heartbeat every "
             "third: %s" % (told[:6] + told[-2:]))
    hb = c.heartbeat("big", 0, leases[0])
    bt.check(hb.lease_ms == expected(WORLD) == 6000,
             "a heartbeat is told the length for all 40 leases: %d ms" % hb.lease_ms)
    bt.check(lease_metric(coord) == 6.0, "batchwire_coordinator_lease_seconds says 6 s")

    # Rank 39 was told 6,000 ms at its join: its holder goes quiet, and the rank stays its.
    time.sleep(1.0)
    e = c.expect_error("JoinJob", jr.pb.JoinJobRequest(
        job="big", rank=WORLD - 1, world_size=WORLD, holder=jr.pb.Holder(host="other", pid=7)),
        code=grpc.StatusCode.ALREADY_EXISTS)
    bt.check("expires 6.0 s after that" in e.details,
             "a quiet holder's rank is refused to another holder within the lease it was told, "
             "not --lease-ms: %s" % e.details[:200])
    time.sleep(5.5)
    j = c.join("big", WORLD - 1, WORLD, host="other", pid=7)
    bt.check(j.lease_ms == expected(WORLD),
             "after its 6 s the rank is taken over (%d ms for the new holder)" % j.lease_ms)
    leases[WORLD - 1] = jr.lease(j)

    for r in range(20, WORLD):
        c.leave("big", r, leases[r])
    hb = c.heartbeat("big", 0, leases[0])
    bt.check(hb.lease_ms == expected(20) == 3000,
             "with 20 leases left a heartbeat is told %d ms" % hb.lease_ms)
    c.close()

    bt.check(coord.stop() == 0, "SIGTERM stops the coordinator")
    coord = bt.coordinator(tmp, name="restarted", state_dir=coord.state_dir,
                           args=["--lease-ms", LEASE_MS, "--max-heartbeats-per-second", 10])
    c = jr.Jobs(coord.addr)
    hb = c.heartbeat("big", 5, leases[5])
    bt.check(hb.lease_ms == 6000,
             "a restarted coordinator (max 10/s) renews the 20 restored leases for "
             "3000 x 20 / 10 ms: %d" % hb.lease_ms)
    c.close()
    bt.check(coord.stop() == 0, "the restarted coordinator stops cleanly")

    coord = bt.coordinator(tmp, name="unscaled", args=["--lease-ms", LEASE_MS,
                                                       "--max-heartbeats-per-second", 0])
    c = jr.Jobs(coord.addr)
    c.create("big", samples=4000, batch=4, world=WORLD)
    told = [c.join("big", r, WORLD, pid=1000 + r).lease_ms for r in range(WORLD)]
    bt.check(set(told) == {LEASE_MS},
             "--max-heartbeats-per-second 0: every lease is --lease-ms (%s)" % sorted(set(told)))
    c.close()
    bt.check(coord.stop() == 0, "the coordinator stops cleanly")


if __name__ == "__main__":
    bt.main(test, timeout=60)
