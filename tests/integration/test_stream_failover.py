"""A worker SIGKILLed under four ranks reading a stream (iterable mode), over both transports.

* A TFRecord stream of 6 sources (4800 records of 4..48 bytes) is read by four concurrent
  `batchwire fetch --mode iterable` ranks for two epochs with three workers, fault-free: every
  rank's batches equal `batchwire plan --mode iterable`, each batch's sha256 equals that of the
  generator's records at its positions, and the real records over the ranks are every record
  exactly once per epoch.
* The same job again under another name, with record bytes over the workers' data channels
  where they offer ReadStream (`--transport auto`; a worker without it is asked over gRPC),
  then over gRPC (`--transport grpc`). The ranks are held inside the first source of epoch 0
  by backpressure on their stdout (as in test_client_failover.py; the test bounds how far
  ahead a held rank can have fetched) and released just before the worker that owns that
  source is SIGKILLed. Before the kill the test proves the worker was serving (bytes it sent,
  per the kernel's socket counters); after it, that the ranks saw reads of its source fail
  and moved them to the next owner (their info logs), the broken runs resumed from their
  record. Every rank's whole sequence (epoch, step, indices, padding, real, sha256) must equal
  the fault-free run's, and every fetch process must exit 0 within a timeout. The killed
  worker is restarted between the two runs, so each kill is of one of three workers.
"""

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bwtest as bt  # noqa: E402
import test_client_e2e as e2e  # noqa: E402
from test_client_failover import bytes_sent_by, placement_table, release_and_kill  # noqa: E402
from test_client_resume import key, LEASE_WAIT  # noqa: E402
from test_streams import Stream, cfg, check_run  # noqa: E402

NUM_SHARDS = 256  # the loader places source k on shard k % 256 (client/lib/loader_limits.h)
WORLD = 4
EPOCHS = 2
B = 2
GATE = 20
PREFETCH = 2
RECORDS = 4800  # 6 sources of 800: ranks held at positions 160..~700 are inside source 0


def ahead_bound(lines):
    """Batches a rank held by backpressure can have fetched beyond those the test read: its
    one-page pipe and its stdio buffer (a page each) full of its shortest lines, the line the
    test's reader holds, the one being printed, and its prefetched batches."""
    shortest = min(len(x) for x in lines if x.startswith('{"epoch"'))
    return 2 * 4096 // shortest + 2 + PREFETCH


def owners(cl, st):
    """{source: worker id} under the coordinator's current placement."""
    t = placement_table(cl, NUM_SHARDS)
    return {k: t["ids"][t["owners"][k % NUM_SHARDS]] for k in range(len(st.counts))}, t


def source_at(st, pos):
    start = 0
    for k, n in enumerate(st.counts):
        if pos < start + n:
            return k, start
        start += n
    return len(st.counts), start


def failover(cl, st, c, ref, ahead, transport, job):
    fo = [e2e.Fetch(cl.addr, job, st.spec, c, r, WORLD, gate_after=GATE,
                    extra=["--epochs", EPOCHS, "--prefetch", PREFETCH, "--timeout-ms", 5000,
                           "--transport", transport, "--log-level", "info"])
          for r in range(WORLD)]
    per_epoch = sum(1 for b in ref[0] if b["epoch"] == 0)
    G = c["B"] * WORLD
    bt.poll(lambda: all(p.batches_seen() >= GATE for p in fo), 60, interval=0.02,
            what="every rank to deliver %d batches" % GATE)
    own, table = owners(cl, st)
    # Where the ranks are: the next position one of them reads is at least `low`, and no rank
    # can have fetched a position past `high` yet.
    seen = [p.batches_seen() for p in fo]
    low = min(seen) * G
    high = (max(seen) + ahead) * G
    reading, _ = source_at(st, low)
    bt.check(reading == source_at(st, high)[0],
             "every rank is reading source %d of epoch 0 (positions %d..%d, the source ends at "
             "%d): its remaining records are read after the kill" %
             (reading, low, high, source_at(st, low)[1] + st.counts[reading]))
    victim = own[reading]
    mine = sorted(k for k, w in own.items() if w == victim)
    grpc_port = int(cl.workers[victim].addr.rsplit(":", 1)[1])
    data_port = next(int(w["data_address"].rsplit(":", 1)[1])
                     for w in bt.status_json(cl.addr)["workers"] if w["id"] == victim)
    sent_grpc, conns_grpc = bytes_sent_by(cl.workers[victim].pid, {grpc_port})
    sent_data, conns_data = bytes_sent_by(cl.workers[victim].pid, {data_port})
    t_kill = release_and_kill(cl, fo, victim)
    # --transport grpc never touches a data channel; auto uses it where the worker serves
    # ReadStream on it, else gRPC: either way the worker was sending records.
    bt.check(all(0 < s < per_epoch - ahead for s in seen) and sent_grpc + sent_data > 0 and
             (transport != "grpc" or conns_data == 0),
             "%s SIGKILLed while every rank was reading its source %d in epoch 0: %r of %d "
             "batches read per rank; it owns sources %s of 0..%d (placement version %d) and had "
             "sent %d bytes on %d data-channel connections and %d on %d gRPC ones (ss)" %
             (victim, reading, seen, per_epoch, mine, len(st.counts) - 1, table["version"],
              sent_data, conns_data, sent_grpc, conns_grpc))
    got = {}
    for p in fo:
        got[p.rank], _ = p.ok(60, "rank %d after the kill of %s" % (p.rank, victim))
    for r in range(WORLD):
        if [key(b) for b in got[r]] != [key(b) for b in ref[r]]:
            first = next((i for i, (a, b) in enumerate(zip(got[r], ref[r])) if key(a) != key(b)),
                         min(len(got[r]), len(ref[r])))
            raise bt.TestFailure("%s, %s killed: rank %d's sequence differs from the fault-free "
                                 "run's at batch %d (%d vs %d batches)\n got  %r\n want %r" %
                                 (transport, victim, r, first, len(got[r]), len(ref[r]),
                                  got[r][first] if first < len(got[r]) else None,
                                  ref[r][first] if first < len(ref[r]) else None))
    failed_over = sum(p.stderr().count("worker=%s failed while serving" % victim) for p in fo)
    bt.check(failed_over > 0, "the kill cut off reads in flight: the ranks logged %d reads of "
             "%s's source failed over to the next owner" % (failed_over, victim),
             "\n".join(p.stderr()[-2000:] for p in fo))
    bt.ok("--transport %s: after %s died mid-epoch, all 4 ranks exited 0 (the last %.1f s after "
          "the kill) with sequences identical to the fault-free run (%d batches each)" %
          (transport, victim, max(p.t0 + p.seconds for p in fo) - t_kill, len(ref[0])))
    return victim


def test(tmpdir):
    cl = e2e.Cluster(tmpdir, nworkers=3, lease_ms=500)
    st = Stream(cl, "s6", "tfrecord", RECORDS, 6)
    bt.check(len(st.counts) == 6 and min(st.counts) > 0,
             "6 TFRecord sources of %s records" % st.counts)
    c = cfg(B)
    procs = [e2e.Fetch(cl.addr, "ref", st.spec, c, r, WORLD, ["--epochs", EPOCHS])
             for r in range(WORLD)]
    ref = {p.rank: p.ok(90, "fault-free rank %d" % p.rank)[0] for p in procs}
    ahead = ahead_bound([x for p in procs for x in p.lines])
    check_run("fault-free stream of 6 sources", st, c, WORLD, ref, epochs=EPOCHS)
    time.sleep(LEASE_WAIT)
    for transport in ("auto", "grpc"):
        victim = failover(cl, st, c, ref, ahead, transport, "stream-failover-" + transport)
        cl.workers[victim] = bt.worker(tmpdir, cl.addr, victim, data_root=cl.root)
        # Restarted at another port, it gets its id once the killed one is declared dead;
        # until then the coordinator still lists the killed one alive, and the next run's
        # ranks would route around it instead of reading from the new one.
        bt.poll(lambda: (lambda w: w.get("state") == "alive" and
                         w.get("address") == cl.workers[victim].addr)(
            bt.workers_by_id(bt.status_json(cl.addr)).get(victim, {})), 15, interval=0.05,
            what="%s alive at its new address" % victim)
        cl.wait_alive(3)
    cl.stop()


if __name__ == "__main__":
    bt.main(test, timeout=300)
