"""Worker ids (docs/operating.md, "Worker ids"), end to end with real processes.

* Two workers started on one host without --id get distinct default ids (HOST:PORT), both
  appear alive in `batchwire status`, and both serve a job's reads (each one's served-samples
  count grows while `batchwire fetch` reads the job).
* A third worker started with the first one's id (another address) is refused: it exits with
  status 1 naming the id, the live worker's address and --takeover; the first worker keeps its
  id, its process and its place, and keeps serving.
* A worker SIGKILLed and restarted at its address without --id comes back under the same id
  at once: registered while the coordinator has not yet declared the old process dead.
* --takeover takes a live worker's id; the old one stops with status 1.
* A worker SIGKILLed and restarted under its id at another address waits for the old
  process to be declared dead, says so, and then takes its id.
"""

import json
import os
import re
import signal
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwtest as bt  # noqa: E402

HEARTBEAT_MS = 500
DEAD_AFTER = 12  # 6 s: a restart in place must register well within it, also under ASan
NUM_SAMPLES = 1024


def start_worker(tmp, coord, name, listen="127.0.0.1:0", args=()):
    """A worker without --id unless args give one; returns the daemon, listening."""
    data = os.path.join(tmp, "data")
    os.makedirs(data, exist_ok=True)
    d = bt.Daemon(name, [bt.WORKER, "--coordinator", coord, "--listen", listen, "--data-root",
                         data] + list(args), tmp)
    d.wait_listening()
    return d


def worker_id(d):
    m = re.search(r" worker=(\S+) ", d.first_line)
    if not m:
        raise bt.TestFailure("%s: no worker= in %r" % (d.name, d.first_line))
    return m.group(1)


def port_of(addr):
    return int(addr.rsplit(":", 1)[1])


def workers(coord):
    return bt.workers_by_id(bt.status_json(coord))


def wait_alive(coord, wid, address, timeout=20):
    def ok():
        w = workers(coord).get(wid)
        return w if w and w["state"] == "alive" and w["address"] == address else None
    return bt.poll(ok, timeout, interval=0.1, what="worker %s alive at %s" % (wid, address))


def fetch(coord, job):
    r = bt.cli("fetch", "--coordinator", coord, "--job", job, "--dataset", "npy:ds/*.npy",
               "--rank", 0, "--world-size", 1, "--batch-size", 32, "--epochs", 1,
               "--transport", "grpc", timeout=120)
    bt.check(r.returncode == 0, "batchwire fetch of job %s exits 0" % job, r.stderr)
    lines = [json.loads(ln) for ln in r.stdout.splitlines() if ln.strip()]
    batches = [o for o in lines if "summary" not in o]
    got = sorted(i for b in batches for i in b["indices"])
    bt.check(got == list(range(NUM_SAMPLES)),
             "job %s: every sample once (%d batches)" % (job, len(batches)),
             "got %d indices" % len(got))


def served(coord):
    return {wid: w["served_samples"] for wid, w in workers(coord).items()}


def test(tmp):
    host = socket.gethostname()
    coord = bt.coordinator(tmp, args=["--heartbeat-ms", HEARTBEAT_MS, "--dead-after", DEAD_AFTER])
    os.makedirs(os.path.join(tmp, "data"), exist_ok=True)
    r = bt.cli("gen", "--format", "npy", "--out", os.path.join(tmp, "data", "ds"),
               "--num-samples", NUM_SAMPLES, "--shape", "4", "--dtype", "float32",
               "--files", 4)
    bt.check(r.returncode == 0, "batchwire gen wrote the dataset", r.stderr)

    bt.log("----- two workers on one host without --id -----")
    w1 = start_worker(tmp, coord.addr, "w1")
    w2 = start_worker(tmp, coord.addr, "w2")
    id1, id2 = worker_id(w1), worker_id(w2)
    bt.check(id1 == "%s:%d" % (host, port_of(w1.addr)) and
             id2 == "%s:%d" % (host, port_of(w2.addr)) and id1 != id2,
             "default ids are HOST:PORT, one per process: %s, %s" % (id1, id2))
    wait_alive(coord.addr, id1, w1.addr)
    wait_alive(coord.addr, id2, w2.addr)
    st = workers(coord.addr)
    bt.check(sorted(st) == sorted([id1, id2]) and
             all(w["state"] == "alive" for w in st.values()),
             "batchwire status shows both alive", st)
    w1.wait_log(r"placement version \d+: 2 live workers")
    w2.wait_log(r"placement version \d+: 2 live workers")
    fetch(coord.addr, "two-default-ids")
    # Workers report their counters with their heartbeats, each on its own schedule: wait
    # until both have reported and the reports cover the job, not just until both are > 0.
    both = bt.poll(lambda: (lambda s: s if s.get(id1, 0) > 0 and s.get(id2, 0) > 0 and
                            sum(s.values()) >= NUM_SAMPLES else None)(served(coord.addr)),
                   20, interval=0.2, what="both workers to report the job's samples served")
    bt.check(sum(both.values()) >= NUM_SAMPLES,
             "both workers served the job's reads: %s" % both)
    bt.check(w1.running() and w2.running(), "neither evicted the other")

    bt.log("----- a second worker with a live worker's id is refused -----")
    inc1 = workers(coord.addr)[id1]["incarnation"]
    w3 = start_worker(tmp, coord.addr, "w3-dup", args=["--id", id1])
    rc = w3.wait(30)
    log3 = w3.log_text()
    bt.check(rc == 1, "the duplicate exits with status 1 (got %s)" % rc, log3)
    for needle in ("worker id '%s'" % id1, "live worker at %s" % w1.addr, "--takeover",
                   "cannot start"):
        bt.check_in(needle, log3, "its message")
    coord.wait_log(r"worker=%s address=%s .*registration refused" %
                   (re.escape(id1), re.escape(w3.addr)))
    before = served(coord.addr)[id1]
    fetch(coord.addr, "after-refusal")
    st = workers(coord.addr)[id1]
    bt.check(w1.running() and st["address"] == w1.addr and st["incarnation"] == inc1 and
             st["restarts"] == 0 and st["state"] == "alive",
             "the first worker keeps its id, process and address", st)
    bt.poll(lambda: served(coord.addr)[id1] > before, 20, interval=0.2,
            what="the first worker to serve the next job too")
    bt.ok("the first worker keeps serving")

    bt.log("----- SIGKILL, then restart at the same address: the same worker, at once -----")
    inc2 = workers(coord.addr)[id2]["incarnation"]
    addr2 = w2.addr
    w2.kill9()
    w2b = start_worker(tmp, coord.addr, "w2-restarted", listen=addr2)
    bt.check(worker_id(w2b) == id2, "restarted without --id at port %d: id %s again" %
             (port_of(addr2), worker_id(w2b)))
    w2b.wait_log(r"registered with coordinator")
    coord.wait_log(r"worker=%s .*registered again \(new process at the same address; the "
                   r"previous one had not been marked dead yet\)" % re.escape(id2))
    st = workers(coord.addr)[id2]
    bt.check(st["state"] == "alive" and st["incarnation"] != inc2 and st["restarts"] == 1,
             "it took its id back before the old process's heartbeats expired", st)
    bt.check(" marked dead: no heartbeat" not in coord.log_text(),
             "no worker was declared dead meanwhile")

    bt.log("----- --takeover -----")
    w4 = start_worker(tmp, coord.addr, "w4-takeover", args=["--id", id1, "--takeover"])
    w4.wait_log(r"registered with coordinator")
    rc = w1.wait(30)
    bt.check(rc == 1, "the worker whose id was taken over exits with status 1 (got %s)" % rc)
    bt.check(re.search(r"worker=%s stopping err=.*worker id '%s' is now held by another process "
                       r"at %s" % (re.escape(id1), re.escape(id1), re.escape(w4.addr)),
                       w1.log_text()), "it says why", w1.log_text())
    wait_alive(coord.addr, id1, w4.addr)
    bt.ok("%s is now served at %s" % (id1, w4.addr))

    bt.log("----- SIGKILL, then restart at another address: waits for the old one's death -----")
    w4.kill9()
    w5 = start_worker(tmp, coord.addr, "w5-moved", args=["--id", id1])
    w5.wait_log(r"registration failed \(will retry\).*waiting for its next heartbeat", timeout=20)
    w5.wait_log(r"registered with coordinator", timeout=HEARTBEAT_MS * DEAD_AFTER / 1000 + 20)
    coord.wait_log(r"worker=%s address=%s .*registered again \(new process; alive again\)" %
                   (re.escape(id1), re.escape(w5.addr)))
    wait_alive(coord.addr, id1, w5.addr)
    bt.check(w5.running() and w2b.running(), "both workers still run")
    fetch(coord.addr, "after-move")

    for d in (w5, w2b, coord):
        bt.check(d.stop() == 0, "%s stops cleanly" % d.name)


if __name__ == "__main__":
    bt.main(test, timeout=240)
