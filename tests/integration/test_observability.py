"""What an operator sees, end to end (docs/operating.md: "Status", "Logs", "Versions"):

* --version on every program -- the daemons, the CLI and each of its commands, the bench
  binaries -- prints one line "PROG VERSION commit=... build=... tls=yes cuda=..." and they all
  agree; the Info RPC (status --json) reports the same build;
* `batchwire gen` reports progress: plain log lines with state=running/done when stderr is a
  file, one line redrawn in place on a terminal (a pty);
* a coordinator and two workers logging JSON (--log-format json): every line of their stderr
  parses as one JSON object with ts, level, component, pid and msg, context fields included;
  a worker indexing a dataset logs its progress (state=done);
* client statistics (`batchwire fetch`'s summary) against what was fetched: batches = the
  plan's length and the batch lines printed, bytes = the sum of the batch bytes, the samples
  received = the distinct indices; once the heartbeats carry them, the workers' served totals
  in `status` equal what the ranks received;
* `batchwire status` while two ranks run: every worker's and rank's samples/s and MiB/s are
  positive, each rank's lag behind the fastest is reported, --watch refreshes (JSON lines,
  ends cleanly on SIGINT); a worker SIGKILLed under the ranks makes their failover and retry
  counters positive;
* a live worker of another version (registered by an independent gRPC client) is flagged as
  MIXED VERSIONS in the table and mixed_versions/version_differs in JSON.
"""

import glob
import json
import os
import pty
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwtest as bt  # noqa: E402

BUILD_RE = re.compile(r"^(?P<prog>.+?) (?P<version>\d+\.\d+\.\d+) commit=(?P<commit>\S+) "
                      r"build=(?P<build>\S+) tls=yes cuda=(?P<cuda>yes|no)( sanitize=\S+)?$")
N = 200000         # tfrecord records of RECORD bytes
RECORD = 100
B = 16
R = 2


def check_versions():
    argvs = [[bt.COORDINATOR, "--version"], [bt.WORKER, "--version"], [bt.CLI, "--version"],
             [bt.CLI, "version"]]
    argvs += [[bt.CLI, c, "--version"] for c in ("status", "health", "fetch", "plan", "gen")]
    benches = sorted(p for p in glob.glob(os.path.join(bt.BUILD_DIR, "bench", "bench_*"))
                     if os.access(p, os.X_OK) and os.path.isfile(p))
    argvs += [[b, "--version"] for b in benches]
    seen = set()
    for argv in argvs:
        r = bt.run(argv)
        m = BUILD_RE.match(r.stdout.strip())
        bt.check(r.returncode == 0 and m is not None and len(r.stdout.splitlines()) == 1,
                 "%s: exit 0 and one build line: %s" %
                 (" ".join(os.path.basename(a) for a in argv), r.stdout.strip()), r.stderr)
        seen.add((m["version"], m["commit"], m["build"], m["cuda"]))
    bt.check(len(seen) == 1, "all %d programs (%d bench binaries) report one build: %s" %
             (len(argvs), len(benches), sorted(seen)))
    return seen.pop()


def check_gen_progress(tmp, root):
    r = bt.cli("gen", "--format", "tfrecord", "--out", os.path.join(root, "ds"), "--num-samples",
               N, "--sample-bytes", RECORD, "--files", 2, "--progress-ms", 1, timeout=120)
    bt.check(r.returncode == 0 and json.loads(r.stdout)["num_samples"] == N,
             "gen writes %d records" % N, r.stderr)
    lines = r.stderr.splitlines()
    running = [ln for ln in lines if "state=running" in ln]
    done = [ln for ln in lines if "state=done" in ln]
    bt.check(running and len(done) == 1 and
             all(re.search(r"INFO +gen\[\d+\]: writing format=tfrecord samples=%d .* done=\d+ "
                           r"total=%d pct=[\d.]+ rate=\d+/s eta=\d+s" % (N, N), ln)
                 for ln in running) and ("done=%d total=%d pct=100.0" % (N, N)) in done[0],
             "gen's stderr (a file): %d progress lines with count, share, rate and time left, "
             "then one done line" % len(running), r.stderr)
    # On a terminal: one line redrawn in place ("\r" + erase line), no newline until done.
    master, slave = pty.openpty()
    p = subprocess.Popen([bt.CLI, "gen", "--format", "jsonl", "--out",
                          os.path.join(tmp, "tty-ds"), "--num-samples", "30000", "--sample-bytes",
                          "300"], stdout=subprocess.DEVNULL, stderr=slave, stdin=subprocess.DEVNULL,
                         env=bt.child_env(), start_new_session=True)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break  # EIO: the writer is gone
        if not chunk:
            break
        out += chunk
    os.close(master)
    bt.check(p.wait(60) == 0, "gen on a terminal exits 0")
    text = out.decode("utf-8", "replace")
    redraws = text.count("\r\x1b[Kwriting format=jsonl")
    bt.check(redraws >= 1 and "state=done" in text and "state=running" not in text,
             "gen on a terminal: the progress line redrawn in place %d times, then the done "
             "line" % redraws, repr(text[-600:]))


def summary(text):
    for line in text.splitlines():
        if line.startswith('{"summary"'):
            return json.loads(line)["summary"]
    raise bt.TestFailure("no summary line in:\n%s" % text[-2000:])


def fetch_args(caddr, job, rank, *extra):
    return ["fetch", "--coordinator", caddr, "--job", job, "--dataset", "tfrecord:ds/*.tfrecord",
            "--rank", rank, "--world-size", R, "--batch-size", B] + [str(x) for x in extra]


def check_counts(caddr, workers):
    """One epoch of both ranks: the library's counters against the batches printed."""
    plan = bt.cli("plan", "--mode", "torch", "--num-samples", N, "--world-size", R,
                  "--batch-size", B)
    bt.check(plan.returncode == 0, "batchwire plan", plan.stderr)
    steps = {}
    for line in plan.stdout.splitlines():
        o = json.loads(line)
        if "rank" in o:
            steps[o["rank"]] = steps.get(o["rank"], 0) + 1
    received = 0
    for rank in range(R):
        r = bt.cli(*fetch_args(caddr, "counts", rank), timeout=120)
        bt.check(r.returncode == 0, "rank %d fetches one epoch" % rank, r.stderr)
        batches = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith('{"epoch"')]
        s = summary(r.stdout)
        st = s["stats"]
        distinct = sum(len(set(b["indices"])) for b in batches)
        bt.check(st["batches"] == len(batches) == steps[rank] and
                 st["samples"] == sum(len(b["indices"]) for b in batches) and
                 st["bytes"] == sum(b["bytes"] for b in batches) == s["bytes"],
                 "rank %d: stats batches %d = plan %d = lines; samples, bytes = the batches' "
                 "(%d bytes)" % (rank, st["batches"], steps[rank], st["bytes"]), json.dumps(s))
        bt.check(st["samples_received"] == distinct and
                 st["bytes_received"] == distinct * RECORD and st["retries"] == 0 and
                 st["failovers"] == 0 and st["requests"] >= len(batches) and
                 st["wait_seconds"] > 0,
                 "rank %d: %d distinct samples received (%d bytes), %d requests, no retries, "
                 "waited %.3fs" % (rank, distinct, st["bytes_received"], st["requests"],
                                   st["wait_seconds"]), json.dumps(st))
        received += st["bytes_received"]

    def served():
        ws = bt.workers_by_id(bt.status_json(caddr))
        total = sum(ws[w]["served_bytes"] for w in workers)
        return total if total == received else None
    bt.poll(served, 15, what="the workers' served bytes (status) to reach the %d the ranks "
            "received" % received)
    bt.ok("the workers' served totals in status = the bytes both ranks received (%d)" % received)


def check_status_live(tmp, caddr, workers, victim):
    """Two ranks running: rates, lag and --watch; then a worker killed under them."""
    ranks = [bt.Daemon("fetch-r%d" % rank,
                       [bt.CLI] + [str(a) for a in fetch_args(caddr, "live", rank, "--epochs",
                                                               100000, "--quiet",
                                                               "--timeout-ms", 20000)],
                       tmp) for rank in range(R)]

    def rated():
        st = bt.status_json(caddr)
        ws = [w for w in st["workers"] if w["id"] in workers]
        jobs = [j for j in st["jobs"] if j["name"] == "live"]
        if not jobs or not all(w["samples_per_s"] > 0 and w["bytes_per_s"] > 0 for w in ws):
            return None
        rs = jobs[0]["ranks"]
        if not all("live" in r and r["samples_per_s"] > 0 and r["bytes_per_s"] > 0 for r in rs):
            return None
        return st, jobs[0]
    st, job = bt.poll(rated, 60, interval=0.3, what="positive rates for both workers and ranks")
    rs = job["ranks"]
    bt.check(min(r["lag_steps"] for r in rs) == 0 and all(r["lag_steps"] >= 0 for r in rs) and
             all(r["live"]["epoch_steps"] > 0 for r in rs) and
             abs(job["samples_per_s"] - sum(r["samples_per_s"] for r in rs)) <= 0.1 * len(rs),
             "status --json: per-rank samples/s %s, lag %s steps (the fastest at 0); the job's "
             "rate is their sum" % ([round(r["samples_per_s"]) for r in rs],
                                    [r["lag_steps"] for r in rs]), json.dumps(job)[:1500])
    bt.ok("workers serve %s samples/s" % [round(w["samples_per_s"]) for w in st["workers"]])
    table = bt.cli("status", "--coordinator", caddr)
    bt.check(table.returncode == 0 and "SAMPLES/S" in table.stdout and "LAG" in table.stdout and
             "AT EPOCH:STEP" in table.stdout and "MIXED VERSIONS" not in table.stdout,
             "the table has rate, position and lag columns and no version warning",
             table.stdout)

    # --watch: a JSON object per refresh until SIGINT, then exit 0.
    w = bt.Daemon("status-watch", [bt.CLI, "status", "--coordinator", caddr, "--json",
                                   "--watch", "1"], tmp)
    time.sleep(2.6)
    w.send(signal.SIGINT)
    rc = w.wait(10)
    objs = [json.loads(ln) for ln in w.log_text().splitlines() if ln.startswith("{")]
    bt.check(rc == 0 and len(objs) >= 2 and all("workers" in o for o in objs),
             "status --watch 1 --json: %d refreshes in 2.6 s, exit %s on SIGINT" % (len(objs), rc),
             w.log_text()[-1000:])
    bare = bt.Daemon("status-watch-bare", [bt.CLI, "status", "--coordinator", caddr, "--watch",
                                           "--json"], tmp)
    bt.poll(lambda: bare.log_text().startswith("{"), 10, what="a first refresh of bare --watch")
    bare.send(signal.SIGINT)
    bt.check(bare.wait(10) == 0, "--watch without SECONDS is accepted (default 2 s)")

    # A worker dies under the ranks: both fail over and say so in their counters.
    workers[victim].kill9()
    time.sleep(2.0)
    for r in ranks:
        r.send(signal.SIGTERM)
    for i, r in enumerate(ranks):
        # 128 + SIGTERM: stopped by the signal, after a clean stop (docs/client.md, "Signals").
        bt.check(r.wait(30) == 143, "rank %d stops on SIGTERM with exit 143" % i, r.log_text()[-2000:])
        s = summary(r.log_text())
        st = s["stats"]
        bt.check(s["stopped"] and st["batches"] == s["batches"] and st["bytes"] == s["bytes"] and
                 st["failovers"] >= 1 and st["retries"] >= st["failovers"],
                 "rank %d after the kill: %d batches, %d failovers, %d retries" %
                 (i, st["batches"], st["failovers"], st["retries"]), json.dumps(s))



def check_mixed_versions(tmp, caddr, build):
    import grpc
    gen = tempfile.mkdtemp(prefix="pb2-", dir=tmp)
    subprocess.run(["protoc", "--python_out=" + gen, "-I", os.path.join(bt.SOURCE_DIR, "proto"),
                    os.path.join(bt.SOURCE_DIR, "proto", "batchwire.proto")], check=True)
    sys.path.insert(0, gen)
    import batchwire_pb2 as pb
    ch = grpc.insecure_channel(caddr)
    register = ch.unary_unary("/batchwire.v1.Coordinator/RegisterWorker",
                              request_serializer=pb.RegisterWorkerRequest.SerializeToString,
                              response_deserializer=pb.RegisterWorkerResponse.FromString)
    req = pb.RegisterWorkerRequest(id="old-build", address="127.0.0.1:9", incarnation=7,
                                   capabilities=pb.WorkerCapabilities(version="0.0.1",
                                                                      commit="0123456789ab"))
    register(req, timeout=10)
    table = bt.cli("status", "--coordinator", caddr)
    st = bt.status_json(caddr)
    ch.close()
    ws = bt.workers_by_id(st)
    bt.check(st["mixed_versions"] and ws["old-build"]["version_differs"] and
             not ws["w0"]["version_differs"] and ws["w0"]["commit"] == build[1] and
             st["coordinator"]["commit"] == build[1] and
             st["coordinator"]["version"] == build[0] and
             st["coordinator"]["build_type"] == build[2],
             "status --json: the Info RPC reports this build (%s %s %s); the worker of version "
             "0.0.1 is flagged" % build[:3], json.dumps(st)[:1500])
    bt.check("MIXED VERSIONS" in table.stdout and "old-build: 0.0.1 (0123456789ab)" in table.stdout,
             "the table flags MIXED VERSIONS and names the worker", table.stdout)


def check_json_logs(daemons):
    for d in daemons:
        lines = d.log_text().splitlines()
        objs = []
        for ln in lines:
            try:
                objs.append(json.loads(ln))
            except ValueError as e:
                raise bt.TestFailure("%s: a stderr line is not JSON (%s): %r" % (d.name, e, ln))
        bt.check(objs and all(isinstance(o, dict) and {"ts", "level", "component", "pid", "msg"}
                              <= set(o) and o["level"] in ("error", "warn", "info", "debug")
                              for o in objs),
                 "%s: all %d stderr lines are JSON objects with ts, level, component, pid, msg" %
                 (d.name, len(objs)))
        yield d, objs


def test(tmp):
    build = check_versions()
    root = os.path.join(tmp, "data")
    os.makedirs(root)
    check_gen_progress(tmp, root)
    coord = bt.coordinator(tmp, args=["--log-format", "json", "--heartbeat-ms", 200,
                                      "--lease-ms", 1500])
    ws = {"w%d" % i: bt.worker(tmp, coord.addr, "w%d" % i, data_root=root,
                               args=["--log-format", "json", "--progress-ms", 1])
          for i in range(2)}
    bt.poll(lambda: sum(w["state"] == "alive" for w in bt.status_json(coord.addr)["workers"])
            == 2, 20, what="2 live workers")
    check_counts(coord.addr, list(ws))
    check_status_live(tmp, coord.addr, ws, "w1")
    ws["w1"].proc.wait()
    check_mixed_versions(tmp, coord.addr, build)
    coord.stop()
    ws["w0"].stop()
    indexed = []
    for d, objs in check_json_logs([coord, ws["w0"], ws["w1"]]):
        if d is coord:
            first = [o for o in objs if o["msg"].startswith("listening on ")]
            bt.check(first and first[0]["component"] == "coordinator",
                     "coordinator: a JSON 'listening on' line", json.dumps(first[:1]))
            reg = [o for o in objs if o.get("worker") == "w0" and "registered" in o["msg"]]
            bt.check(reg and reg[0].get("address") and reg[0].get("peer"),
                     "coordinator: 'registered' with worker, address and peer as fields: %s" %
                     json.dumps(reg[:1]))
        else:
            indexed += [o for o in objs if o["msg"] == "indexing" and o.get("state") == "done"]
    # The first worker to index writes the tfrecord index sidecar; one that starts later loads
    # it and has nothing to report.
    bt.check(indexed and indexed[0]["dataset"].startswith("tfrecord:") and
             indexed[0]["pct"] == "100.0" and "rate" in indexed[0] and "elapsed" in indexed[0],
             "a worker logged its indexing progress with JSON fields: %s" %
             json.dumps(indexed[:1]))


if __name__ == "__main__":
    bt.main(test, timeout=240)
