"""Prometheus metrics (`--metrics-listen`; docs/operating.md, "Metrics") against what a running
cluster really did.

A coordinator and two storage workers run with `--metrics-listen 127.0.0.1:0`; four ranks of
one job fetch two epochs of a `.npy` dataset with `batchwire fetch --commit`: ranks 0 and 1 over
the data channel (`--transport auto`), ranks 2 and 3 over gRPC (`--transport grpc`). Every
scrape, during the fetch (the ranks held back by their stdout mid-epoch) and after it, must
pass `promtool check metrics` (Debian's prometheus package) and:

* during: every rank holds its lease (`batchwire_coordinator_ranks{state="held"}` is 4), the
  workers are alive, each rank's reported epoch, step and batches handed out (its lease
  heartbeats) match where its output stands, the workers have served some samples but not
  all, and counters never go down between two scrapes;
* after: the bytes the workers served (`batchwire_worker_bytes_served_total`, summed over both
  workers) equal the bytes the ranks received, per transport; the samples served equal the
  distinct samples in the ranks' batches; no request failed; nothing is in flight; every
  request's latency was observed; the coordinator counted the four commits and journaled
  them (fsync histogram, synced bytes); every rank's committed epoch and step are the ones
  its last batch says; per-job series exist exactly for the jobs `batchwire status` lists;
* errors: a ReadSamples of an index past the end, once over gRPC and once over the data
  channel, is counted once each under `code="BW_OUT_OF_RANGE"` and its transport;
* lease takeovers: a trainer SIGKILLed and restarted on this host (the rank reclaimed), and one
  paused past its lease while another takes the rank, count one `reclaimed` and one `expired`.

Also: `/metrics` is plain HTTP served by libmicrohttpd (404 elsewhere), and a second daemon
given the same metrics port refuses to start with a message naming --metrics-listen.
"""

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwdata as bd  # noqa: E402
import bwpy  # noqa: E402
import bwtest as bt  # noqa: E402
import test_client_e2e as e2e  # noqa: E402
import test_data_channel as dc  # noqa: E402

WORLD = 4
EPOCHS = 2
N = 8192            # samples; a multiple of WORLD * B: no padding
SHAPE = 256         # float32: 1 KiB per sample
B = 16
CFG = {"mode": "torch", "B": B, "shuffle": True, "seed": 5}
GRPC_RANKS = (2, 3)
DATASET = "npy:m/part-*.npy"
LEASE_MS = 3000     # trainers heartbeat every third of it
METRICS_RE = r"metrics on http://(\S+)/metrics"
SAMPLE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
PROMTOOL = shutil.which("promtool") or ("/usr/bin/promtool"
                                        if os.access("/usr/bin/promtool", os.X_OK) else None)


def unescape(v):
    return re.sub(r'\\(.)', lambda m: "\n" if m.group(1) == "n" else m.group(1), v)


def parse(text):
    """[(name, {label: value}, float)] of a text exposition (comments skipped)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE_RE.match(line)
        if not m:
            raise bt.TestFailure("unparsable line in a scrape: %r" % line)
        labels = {k: unescape(v) for k, v in LABEL_RE.findall(m.group(3) or "")}
        out.append((m.group(1), labels, float(m.group(4))))
    return out


def total(samples, name, **want):
    return sum(v for n, l, v in samples if n == name and all(l.get(k) == x for k, x in want.items()))


def series(samples, name):
    return [(l, v) for n, l, v in samples if n == name]


class Scraper:
    def __init__(self, tmpdir):
        self.tmpdir = tmpdir
        self.count = 0
        if not PROMTOOL:
            bt.log("SKIP promtool check: promtool not found (Debian package prometheus; "
                   "scripts/lib.sh installs it with the test packages)")

    def documented(self, text, name):
        """Every family in a scrape is listed in docs/operating.md, "Metrics"."""
        with open(os.path.join(bt.SOURCE_DIR, "docs", "operating.md")) as f:
            doc = f.read()
        doc = doc[doc.index("## Metrics"):]
        families = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
        missing = sorted(f for f in families if "`%s`" % f not in doc)
        bt.check(not missing, "%s: its %d metric families are listed in docs/operating.md"
                 % (name, len(families)), missing)

    def scrape(self, name, addr):
        url = "http://%s/metrics" % addr
        with urllib.request.urlopen(url, timeout=10) as r:
            ctype = r.headers.get("Content-Type")
            text = r.read().decode("utf-8")
        bt.check(ctype == "text/plain; version=0.0.4; charset=utf-8",
                 "%s: /metrics is the text exposition format (%s)" % (name, ctype))
        self.count += 1
        if self.count <= 3:
            self.documented(text, name)
        if PROMTOOL:
            path = os.path.join(self.tmpdir, "scrape-%d-%s.txt" % (self.count, name))
            with open(path, "w") as f:
                f.write(text)
            with open(path) as f:
                p = subprocess.run([PROMTOOL, "check", "metrics"], stdin=f, capture_output=True,
                                   text=True, timeout=60)
            bt.check(p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(),
                     "%s: promtool check metrics passes (%d lines)" % (name, text.count("\n")),
                     "exit %d\n%s%s\n--- scrape ---\n%s" % (p.returncode, p.stdout, p.stderr,
                                                            text[:4000]))
        return parse(text)


def metrics_addr(daemon):
    return daemon.wait_log(METRICS_RE)[0].group(1)


def counters(samples):
    return {(n, tuple(sorted(l.items()))): v for n, l, v in samples
            if n.endswith("_total") or n.endswith("_count") or n.endswith("_bucket")}


def check_monotonic(before, after, what):
    down = [(k, before[k], after.get(k)) for k in before if after.get(k, -1) < before[k]]
    bt.check(not down, "%s: no counter went down between two scrapes" % what, down[:5])


def mixture_served(root, coord, workers, waddr, scr):
    """One rank reads a mixture of DATASET and a second .npy over the data channel, where one
    request carries samples of both (docs/data-channel.md, "Several datasets in one request"):
    each dataset's samples_served_total and bytes_served_total, summed over the workers, grow by
    exactly the samples (and their bytes) of that source in the rank's batches."""
    other = "npy:mx/part-00000.npy"
    bwpy.gen_npy(root, "mx", 1000, (64,), "uint8")

    def by_dataset(name):
        got = {}
        for w in workers:
            for labels, v in series(scr.scrape(w, waddr[w]), name):
                got[labels["dataset"]] = got.get(labels["dataset"], 0) + v
        return got

    before = {n: by_dataset(n) for n in ("batchwire_worker_samples_served_total",
                                         "batchwire_worker_bytes_served_total")}
    r = bt.cli("fetch", "--coordinator", coord.addr, "--job", "metrics-mix", "--mix",
               DATASET + "=0.5", "--mix", other + "=0.5", "--mix-samples", 3000, "--rank", 0,
               "--world-size", 1, "--batch-size", 64, "--epochs", 1, timeout=120)
    bt.check(r.returncode == 0, "a mixture of %s and %s fetched" % (DATASET, other), r.stderr)
    batches = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{\"epoch\"")]
    want = {DATASET: [0, 0], other: [0, 0]}
    for b in batches:  # a batch's distinct samples are fetched once each
        for src, _ in set(zip(b["sources"], b["indices"])):
            name = (DATASET, other)[src]
            want[name][0] += 1
            want[name][1] += SHAPE * 4 if src == 0 else 64
    bt.check(sum(len(b["indices"]) for b in batches) == 3000 and all(v[0] for v in want.values()),
             "the mixture's batches hold 3000 samples of both sources (the second, of 1000, "
             "up-sampled: a batch across two of its passes may hold a sample twice)", want)
    after = {n: by_dataset(n) for n in before}
    for k, name in enumerate(before):
        got = {d: after[name].get(d, 0) - before[name].get(d, 0) for d in want}
        bt.check(got == {d: v[k] for d, v in want.items()},
                 "mixture: %s grew by each source's %s in the batches, under its dataset (%s)"
                 % (name, ("samples", "bytes")[k], got), {d: v[k] for d, v in want.items()})


def test(tmpdir):
    scr = Scraper(tmpdir)
    root = os.path.join(tmpdir, "data")
    os.makedirs(root)
    margs = ["--metrics-listen", "127.0.0.1:0"]
    coord = bt.coordinator(tmpdir, args=margs + ["--heartbeat-ms", 200, "--lease-ms", LEASE_MS])
    caddr = metrics_addr(coord)
    workers = {w: bt.worker(tmpdir, coord.addr, w, args=margs, data_root=root)
               for w in ("w1", "w2")}
    waddr = {w: metrics_addr(d) for w, d in workers.items()}
    bt.poll(lambda: sum(w["state"] == "alive" for w in bt.status_json(coord.addr)["workers"]) == 2,
            15, interval=0.1, what="2 live workers")

    # Plain HTTP from libmicrohttpd: another path is 404.
    try:
        urllib.request.urlopen("http://%s/other" % caddr, timeout=10)
        bt.check(False, "GET /other is refused")
    except urllib.error.HTTPError as e:
        bt.check(e.code == 404, "GET /other answers 404 (%d)" % e.code)

    # The same metrics port twice: a clear error, exit 1.
    r = bt.run([bt.WORKER, "--coordinator", coord.addr, "--listen", "127.0.0.1:0",
                "--data-root", root, "--id", "w3", "--metrics-listen", waddr["w1"]], timeout=30)
    bt.check(r.returncode == 1 and "--metrics-listen" in r.stderr,
             "a worker given a metrics port in use exits 1 naming --metrics-listen", r.stderr)

    r = bt.cli("gen", "--format", "npy", "--out", os.path.join(root, "m"), "--num-samples", N,
               "--shape", SHAPE, "--dtype", "float32", "--files", 4, timeout=120)
    bt.check(r.returncode == 0, "batchwire gen: %d samples of %d bytes in 4 files"
             % (N, SHAPE * 4), r.stderr)
    sample_bytes = json.loads(r.stdout)["sample_bytes"]

    scraped = {"coordinator": scr.scrape("coordinator", caddr)}
    for w in workers:
        scraped[w] = scr.scrape(w, waddr[w])
        bt.check(total(scraped[w], "batchwire_worker_samples_served_total") == 0,
                 "%s: nothing served before the fetch" % w)

    ranks = [e2e.Fetch(coord.addr, "metrics", DATASET, CFG, k, world=WORLD,
                       extra=["--epochs", EPOCHS, "--commit"] +
                       (["--transport", "grpc"] if k in GRPC_RANKS else []),
                       gate_after=10)
             for k in range(WORLD)]
    steps = N // (WORLD * B)
    bt.poll(lambda: all(f.batches_seen() >= 10 for f in ranks), 60, interval=0.05,
            what="every rank at 10 batches")

    # During the fetch: the ranks are held back by their stdout, mid-epoch.
    during = {"coordinator": scr.scrape("coordinator", caddr)}
    c = during["coordinator"]
    bt.check(total(c, "batchwire_coordinator_ranks", job_name="metrics", state="held") == WORLD,
             "during: %d ranks of job metrics hold their lease" % WORLD)
    bt.check(total(c, "batchwire_coordinator_job_world_size", job_name="metrics") == WORLD,
             "during: the job's world size is %d" % WORLD)
    bt.check(total(c, "batchwire_coordinator_workers", state="alive") == 2 and
             total(c, "batchwire_coordinator_workers", state="dead") == 0,
             "during: 2 workers alive, none dead")
    # Each rank's progress, as its holder reports with its lease heartbeats (every --lease-ms / 3).
    def reported():
        got = scr.scrape("coordinator", caddr)
        steps = {l["rank"]: v for l, v in series(got, "batchwire_coordinator_rank_step")
                 if l.get("job_name") == "metrics"}
        return got if len(steps) == WORLD else None
    c = bt.poll(reported, 15, interval=0.3, what="every rank's progress in the coordinator's scrape")
    for f in ranks:
        k = str(f.rank)
        ep = total(c, "batchwire_coordinator_rank_epoch", job_name="metrics", rank=k)
        sp = total(c, "batchwire_coordinator_rank_step", job_name="metrics", rank=k)
        nb = total(c, "batchwire_coordinator_rank_batches_total", job_name="metrics", rank=k)
        rate = series(c, "batchwire_coordinator_rank_batches_per_second")
        bt.check(ep == 0 and f.batches_seen() <= sp <= steps and nb == sp and
                 any(l == {"job_name": "metrics", "rank": k} and v >= 0 for l, v in rate),
                 "during: rank %s reported epoch 0, step %d (it printed %d batches so far, "
                 "the epoch has %d), %d batches handed out, a batches/s gauge" %
                 (k, sp, f.batches_seen(), steps, nb))
    served_during = 0
    for w in workers:
        during[w] = scr.scrape(w, waddr[w])
        served_during += total(during[w], "batchwire_worker_samples_served_total")
        check_monotonic(counters(scraped[w]), counters(during[w]), w)
    bt.check(0 < served_during < N * EPOCHS,
             "during: the workers served %d of the %d samples so far" % (served_during,
                                                                         N * EPOCHS))

    for f in ranks:
        f.open_gate()
    got_bytes = {"grpc": 0, "data_channel": 0}
    got_samples = 0
    last = {}
    for f in ranks:
        rc = f.wait(180)
        bt.check(rc == 0, "rank %d exited 0" % f.rank, f.stderr()[-2000:])
        batches, summary = f.result()
        bt.check(len(batches) == EPOCHS * steps, "rank %d: %d batches" % (f.rank, len(batches)))
        transport = "grpc" if f.rank in GRPC_RANKS else "data_channel"
        for b in batches:
            # A batch's distinct indices are fetched once each (padding repeats one).
            distinct = len(set(b["indices"]))
            got_samples += distinct
            got_bytes[transport] += distinct * sample_bytes
        bt.check(summary["bytes"] == sum(b["bytes"] for b in batches),
                 "rank %d: its summary's bytes are its batches' (%d)" % (f.rank,
                                                                          summary["bytes"]))
        last[f.rank] = batches[-1]

    after = {"coordinator": scr.scrape("coordinator", caddr)}
    served = {"grpc": 0, "data_channel": 0}
    samples = 0
    for w in workers:
        s = after[w] = scr.scrape(w, waddr[w])
        check_monotonic(counters(during[w]), counters(s), w)
        for t in served:
            served[t] += total(s, "batchwire_worker_bytes_served_total", transport=t)
        samples += total(s, "batchwire_worker_samples_served_total")
        datasets = {l["dataset"] for l, _ in series(s, "batchwire_worker_bytes_served_total")}
        bt.check(datasets == {DATASET},
                 "%s: what it served is labelled with the dataset as the job names it (%s)"
                 % (w, datasets))
        errors = series(s, "batchwire_worker_request_errors_total")
        bt.check(sum(v for _, v in errors) == 0, "%s: no request failed" % w, errors)
        bt.check(total(s, "batchwire_worker_requests_in_flight") == 0,
                 "%s: nothing in flight after the fetch" % w)
        bt.check(total(s, "batchwire_worker_in_flight_bytes") == 0,
                 "%s: no bytes held against the budget after the fetch" % w)
        for t in served:
            n = total(s, "batchwire_worker_request_duration_seconds_count", transport=t)
            inf = total(s, "batchwire_worker_request_duration_seconds_bucket", transport=t,
                        le="+Inf")
            bt.check(n == inf, "%s: %s latency: +Inf bucket = count (%d requests)" % (w, t, n))
        bt.check(total(s, "batchwire_worker_dataset_open_duration_seconds_count") >= 1 and
                 total(s, "batchwire_worker_open_files") == 4,
                 "%s: the dataset was opened (timed) and its 4 files are open" % w)
    for t in served:
        bt.check(served[t] == got_bytes[t],
                 "bytes served over %s by both workers (%d) = bytes its ranks received (%d)"
                 % (t, served[t], got_bytes[t]))
        n = sum(total(after[w], "batchwire_worker_request_duration_seconds_count", transport=t)
                for w in workers)
        bt.check(n > 0, "%d %s requests had their latency observed" % (n, t))
    bt.check(samples == got_samples,
             "samples served (%d) = distinct samples in the ranks' batches (%d)" %
             (samples, got_samples))
    # Each worker served the samples of the blocks it owns (docs/formats.md, "Shards and
    # placement"): every index once an epoch, from the owner of its block's shard.
    paths = sorted(glob.glob(os.path.join(root, "m", "part-*.npy")))
    block = bd.loader_block(N, sum(os.path.getsize(p) for p in paths))
    cc = bd.DataClient(tmpdir, coord.addr)
    table = cc.placement(bd.LOADER_SHARDS)
    ids = [w.id for w in table.workers]
    want = {w: 0 for w in workers}
    for i in range(N):
        want[ids[table.owners[bd.loader_shard(i, block)]]] += EPOCHS
    got = {w: total(after[w], "batchwire_worker_samples_served_total") for w in workers}
    bt.check(block > 1 and got == want,
             "each worker served its own blocks' samples: %r, as blocks of %d neighbouring "
             "samples over %d shards give (placement version %d)" %
             (got, block, bd.LOADER_SHARDS, table.version), want)

    # Errors by code, one a transport: an index past the end, over gRPC and the data channel.
    bad = [N + 5]
    client = bd.DataClient(tmpdir, workers["w1"].addr)
    bd.expect_error(lambda: client.read("npy", ["m/part-*.npy"], bad), grpc.StatusCode.OUT_OF_RANGE)
    # Closed at the end, after the last process this test starts: grpcio (Debian's 1.51) aborts
    # in its thread pool (thread_pool.cc:225, state_ == kRunning) when a fork runs while the
    # channel's shutdown is still winding the pool down (seen 3 times, right after a close).
    daddr = bt.workers_by_id(bt.status_json(coord.addr))["w1"]["data_address"]
    sock = dc.connect(daddr)
    sock.sendall(dc.frame(dc.request(bd.pb(tmpdir), ["m/part-*.npy"], bad)))
    dc.expect_error(sock, dc.BW_OUT_OF_RANGE, ["index %d" % bad[0]], "data channel, index past the end")
    sock.close()
    s = scr.scrape("w1", waddr["w1"])
    for t in ("grpc", "data_channel"):
        bt.check(total(s, "batchwire_worker_request_errors_total", transport=t,
                       code="BW_OUT_OF_RANGE") == 1,
                 "w1: the refused %s request is counted once under code BW_OUT_OF_RANGE" % t)
    bt.check(total(s, "batchwire_worker_request_errors_total") == 2, "w1: and nothing else failed")

    c = after["coordinator"]
    check_monotonic(counters(during["coordinator"]), counters(c), "coordinator")
    bt.check(total(c, "batchwire_coordinator_commits_total") == WORLD,
             "the coordinator counted %d commits" % WORLD)
    bt.check(total(c, "batchwire_coordinator_journal_fsync_duration_seconds_count") > 0 and
             total(c, "batchwire_coordinator_journal_synced_bytes_total") > 0,
             "journal fsyncs observed (%d, %d bytes)" %
             (total(c, "batchwire_coordinator_journal_fsync_duration_seconds_count"),
              total(c, "batchwire_coordinator_journal_synced_bytes_total")))
    st = bt.status_json(coord.addr)
    jobs = {j["name"] for j in st["jobs"]}
    bt.check(total(c, "batchwire_coordinator_jobs") == len(jobs),
             "jobs gauge = jobs in batchwire status (%d)" % len(jobs))
    labelled = {l["job_name"] for _, l, _ in c if "job_name" in l}
    bt.check(labelled == jobs, "per-job series exist exactly for the jobs status lists (%s)"
             % sorted(labelled))
    if "metrics" in jobs:
        for k, b in last.items():
            ep = total(c, "batchwire_coordinator_rank_committed_epoch", job_name="metrics", rank=str(k))
            sp = total(c, "batchwire_coordinator_rank_committed_step", job_name="metrics", rank=str(k))
            bt.check((ep, sp) == (b["epoch"], b["step"] + 1),
                     "rank %d: committed epoch %d step %d, after its last batch" % (k, ep, sp))
    # Lease takeovers, on rank 0 of a second job: a trainer SIGKILLed, whose restart on this
    # host reclaims the rank at once; then a trainer paused past its lease, whose rank another
    # one takes.
    def holder(extra=()):
        f = e2e.Fetch(coord.addr, "metrics-b", DATASET, CFG, 0, world=1, extra=extra,
                      gate_after=1)
        bt.poll(lambda: any(j["name"] == "metrics-b" and j["ranks"][0].get("pid") == f.pid and
                            j["ranks"][0].get("lease") == "live"
                            for j in bt.status_json(coord.addr)["jobs"]),
                15, what="pid %d holding rank 0 of metrics-b" % f.pid)
        return f

    def rank0(*extra):
        r = bt.cli("fetch", "--coordinator", coord.addr, "--job", "metrics-b", "--dataset",
                   DATASET, "--rank", 0, "--world-size", 1, *e2e.cfg_flags(CFG), "--max-steps", 3,
                   "--log-level", "info", *extra, timeout=60)
        bt.check(r.returncode == 0, "a trainer took rank 0 of metrics-b", r.stderr)
        return r

    a = holder()
    a.proc.send_signal(signal.SIGKILL)
    a.wait(10)
    bt.check_in("reclaiming the rank", rank0().stderr, "the restarted trainer reclaimed rank 0")
    b = holder()
    b.proc.send_signal(signal.SIGSTOP)
    time.sleep(LEASE_MS / 1000 + 0.5)
    rank0()
    b.proc.send_signal(signal.SIGKILL)
    b.wait(10)
    c = scr.scrape("coordinator", caddr)
    bt.check(total(c, "batchwire_coordinator_lease_takeovers_total", reason="reclaimed") == 1 and
             total(c, "batchwire_coordinator_lease_takeovers_total", reason="expired") == 1,
             "one takeover of each kind counted: reclaimed, expired")
    bt.check(total(c, "batchwire_coordinator_ranks", job_name="metrics-b", state="free") == 1,
             "metrics-b's rank 0 is free again once its last trainer left")

    # A mixture: a request's samples of both sources, counted each under its own dataset.
    mixture_served(root, coord, workers, waddr, scr)

    client.close()
    cc.close()
    daemons = [coord] + list(workers.values())
    for d in daemons:
        d.proc.send_signal(signal.SIGTERM)
    for d in daemons:
        rc = d.wait(20)
        e2e.check_clean_log(d.name, d.log_text())
        bt.check(rc == 0, "%s stopped cleanly on SIGTERM, its /metrics too" % d.name,
                 d.log_text()[-3000:])


if __name__ == "__main__":
    bt.main(test, timeout=300)
