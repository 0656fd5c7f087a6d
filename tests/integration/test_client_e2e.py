"""The trainer client end to end: a coordinator, three storage workers and four ranks, each
rank a concurrent `batchwire fetch` process, over `.npy` and TFRecord datasets written by
`batchwire gen` (several files each), in torch and accelerate modes with shuffle (several
seeds), both drop_last settings, and accelerate's split_batches and even_batches on and off
where the combination is valid, for two epochs.

For every rank of every configuration:
* its batches' (epoch, step, indices, padding, real) equal `batchwire plan`'s for the same
  parameters and epoch, in order, with nothing missing or extra;
* each batch's sha256 equals the sha256 of the expected bytes of its samples, concatenated in
  batch order. The expected bytes are read from the generated files by this test (numpy for
  .npy, a TFRecord parser with an independent CRC-32C for TFRecord) and checked against the
  generator's documented formula (reimplemented in bwdata.py) -- never by the C code;
* `real` is the number of non-padding samples, and every rank gets the same number of batches
  per epoch. A combination that would give ranks different batch counts is refused at job
  creation (exit 1 with the reason).

The helpers here (cluster, expected bytes, fetch processes, plan, verification) are imported by
the other test_client_*.py files.
"""

import hashlib
import json
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwtest as bt  # noqa: E402
import bwdata as bd  # noqa: E402

WORLD = 4
EPOCHS = 2
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                   "SUMMARY: UndefinedBehaviorSanitizer")


def sanitized_build():
    """True when the binaries under test were built with sanitizers (slower: smaller runs)."""
    try:
        with open(os.path.join(bt.BUILD_DIR, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("BW_SANITIZE:") and line.strip().split("=", 1)[1]:
                    return True
    except OSError:
        pass
    return False


# ---------------------------------------------------------------------------
# the cluster

class Cluster:
    """A coordinator and `nworkers` workers on loopback over one data root."""

    def __init__(self, tmpdir, nworkers=3, lease_ms=500, heartbeat_ms=200, dead_after=3):
        self.tmpdir = tmpdir
        self.root = os.path.join(tmpdir, "data")
        os.makedirs(self.root, exist_ok=True)
        self.coord = bt.coordinator(tmpdir, args=["--lease-ms", lease_ms, "--heartbeat-ms",
                                                  heartbeat_ms, "--dead-after", dead_after])
        self.addr = self.coord.addr
        self.workers = {}
        for i in range(nworkers):
            wid = "w%d" % (i + 1)
            self.workers[wid] = bt.worker(tmpdir, self.addr, wid, data_root=self.root)
        self.wait_alive(nworkers)

    def wait_alive(self, n):
        bt.poll(lambda: sum(w["state"] == "alive" for w in bt.status_json(self.addr)["workers"])
                == n, 15, interval=0.1, what="%d live workers" % n)

    def daemons(self):
        return [self.coord] + list(self.workers.values())

    def stop(self):
        """SIGTERMs every daemon still running; each must exit 0 and log no sanitizer report."""
        live = [d for d in self.daemons() if d.running()]
        for d in live:
            d.proc.send_signal(signal.SIGTERM)
        for d in live:
            rc = d.wait(20)
            check_clean_log(d.name, d.log_text())
            bt.check(rc == 0, "%s stopped cleanly on SIGTERM (exit 0)" % d.name, d.log_text()[-3000:])


def check_clean_log(name, text):
    for m in SANITIZER_MARKS:
        if m in text:
            raise bt.TestFailure("%s reported a sanitizer error (%r):\n%s" % (name, m, text[-6000:]))


# ---------------------------------------------------------------------------
# datasets and the bytes they must deliver

def gen(cluster, name, fmt, args):
    out = os.path.join(cluster.root, name)
    r = bt.cli("gen", "--format", fmt, "--out", out, *args, timeout=120)
    bt.check(r.returncode == 0, "batchwire gen --format %s --out %s %s" % (fmt, name, " ".join(args)),
             r.stderr)
    desc = json.loads(r.stdout)
    desc["name"] = name
    desc["paths"] = [os.path.join(out, s) for s in desc["sources"]]
    return desc


def read_tfrecords(path):
    """Records of a TFRecord file, both CRCs checked with bwdata's independent CRC-32C."""
    out = []
    with open(path, "rb") as f:
        data = f.read()
    off = 0
    while off < len(data):
        n, = struct.unpack_from("<Q", data, off)
        lcrc, = struct.unpack_from("<I", data, off + 8)
        if lcrc != bd.masked_crc(data[off:off + 8]):
            raise bt.TestFailure("%s: bad length CRC at offset %d" % (path, off))
        rec = data[off + 12:off + 12 + n]
        dcrc, = struct.unpack_from("<I", data, off + 12 + n)
        if dcrc != bd.masked_crc(rec):
            raise bt.TestFailure("%s: bad data CRC at offset %d" % (path, off))
        out.append(rec)
        off += 12 + n + 4
    return out


def expected_samples(desc):
    """[bytes of sample i] for a generated dataset, read from its files by this test and
    checked against the generator's formula."""
    fmt = desc["format"]
    rows = []
    if fmt == "npy":
        for p in desc["paths"]:
            a = np.load(p, mmap_mode="r")
            bt.check(a.dtype.str == desc["dtype"] and list(a.shape[1:]) == desc["shape"],
                     "%s: numpy reads dtype %s shape %s" % (os.path.basename(p), a.dtype.str,
                                                          a.shape), None)
            rows += [a[i].tobytes() for i in range(a.shape[0])]
    elif fmt == "tfrecord":
        for p in desc["paths"]:
            rows += read_tfrecords(p)
    else:
        raise ValueError(fmt)
    if len(rows) != desc["num_samples"]:
        raise bt.TestFailure("%s: %d samples in the files, %d described" %
                             (desc["name"], len(rows), desc["num_samples"]))
    for i, r in enumerate(rows):
        want, _ = bd.expected_sample(fmt, i, desc["sample_bytes"], desc["sample_bytes_max"])
        if r != want:
            raise bt.TestFailure("%s sample %d in the files differs from the generator's formula"
                                 % (desc["name"], i))
    bt.ok("%s: %d samples (%d..%d bytes) read from %d files equal the generator's formula" %
          (desc["name"], len(rows), min(map(len, rows)), max(map(len, rows)), len(desc["paths"])))
    return rows


def batch_sha(samples, indices):
    h = hashlib.sha256()
    for i in indices:
        h.update(samples[i])
    return h.hexdigest()


# ---------------------------------------------------------------------------
# sampler configurations, plans and fetch processes

def cfg_flags(c):
    """Command-line flags shared by `batchwire plan` and `batchwire fetch`."""
    f = ["--mode", c["mode"], "--batch-size", c["B"]]
    if c.get("shuffle"):
        f += ["--shuffle", "--seed", c.get("seed", 0)]
    for k, flag in (("drop_last", "--drop-last"), ("sampler_drop_last", "--sampler-drop-last"),
                    ("split_batches", "--split-batches")):
        if c.get(k):
            f.append(flag)
    if c.get("even_batches") is False:
        f.append("--no-even-batches")
    return [str(x) for x in f]


def describe(c):
    return " ".join(cfg_flags(c))


def plan(c, n, world, epoch):
    """`batchwire plan` for every rank: ({rank: [batch dicts]}, metadata)."""
    r = bt.cli("plan", *cfg_flags(c), "--num-samples", n, "--world-size", world, "--epoch", epoch,
               "--metadata", timeout=60)
    if r.returncode != 0:
        raise bt.TestFailure("batchwire plan %s failed (%d): %s" % (describe(c), r.returncode,
                                                                    r.stderr))
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    meta = lines[0]["metadata"]
    out = {k: [] for k in range(world)}
    for b in lines[1:]:
        b["epoch"] = epoch
        out[b["rank"]].append(b)
    return out, meta


def plans(c, n, world, epochs=EPOCHS):
    """{rank: [batches of epoch 0, then epoch 1, ...]}, and whether ranks are equal."""
    seq = {k: [] for k in range(world)}
    equal = True
    for e in range(epochs):
        p, meta = plan(c, n, world, e)
        equal = equal and meta["equal_batches"]
        for k in range(world):
            seq[k] += p[k]
    return seq, equal


class Fetch:
    """One `batchwire fetch` process; stdout lines and stderr are collected by threads, each
    batch line stamped with the monotonic time it was read (`times`), and the exit too.
    `wrap(argv)` may put the command inside something (a network namespace, stdbuf)."""

    def __init__(self, coord, job, dataset, c, rank, world=WORLD, extra=(), env=None,
                 gate_after=None, wrap=None):
        self.argv = [bt.CLI, "fetch", "--coordinator", coord, "--job", job, "--dataset", dataset,
                     "--rank", str(rank), "--world-size", str(world)] + cfg_flags(c) + \
            [str(x) for x in extra]
        if wrap:
            self.argv = [str(x) for x in wrap(self.argv)]
        self.rank = rank
        self.t0 = time.monotonic()
        self.times = []
        # Backpressure (gate_after): after `gate_after` lines stdout is not read until
        # open_gate(); with a one-page pipe the process then blocks a few dozen batches further
        # on. The pipe is that small before the process starts: shrunk afterwards, it refused
        # (EBUSY) once a process had written more than a page, as on a loaded machine.
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=bt.child_env(env),
                                     start_new_session=True, preexec_fn=bt._child_setup,
                                     pipesize=4096 if gate_after is not None else -1)
        bt._register(self.proc)
        self.lines = []
        self.err = []
        self.gate = None
        if gate_after is not None:
            self.gate = threading.Event()
        self.gate_after = gate_after
        self._threads = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, self.err),
                                          daemon=True)]
        for t in self._threads:
            t.start()
        self.rc = None
        self.seconds = None
        # When the process exited (wait's `seconds` is when the test got round to it).
        self.t_exit = None
        threading.Thread(target=self._stamp_exit, daemon=True).start()

    def _stamp_exit(self):
        try:
            self.proc.wait()
        finally:
            self.t_exit = time.monotonic()

    def exited_at(self):
        """Monotonic time the process exited (after wait() returned)."""
        for _ in range(100):
            if self.t_exit is not None:
                return self.t_exit
            time.sleep(0.01)
        return self.t0 + self.seconds

    def _read_stdout(self):
        pipe = self.proc.stdout
        while True:
            if self.gate is not None and len(self.lines) >= self.gate_after:
                self.gate.wait()
            line = pipe.readline()
            if not line:
                break
            now = time.monotonic()
            text = line.decode("utf-8", "replace")
            if text.startswith('{"epoch"'):
                self.times.append(now)
            self.lines.append(text)
        pipe.close()

    def open_gate(self):
        if self.gate is not None:
            self.gate.set()

    @staticmethod
    def _read(pipe, sink):
        for line in iter(pipe.readline, b""):
            sink.append(line.decode("utf-8", "replace"))
        pipe.close()

    @property
    def pid(self):
        return self.proc.pid

    def batches_seen(self):
        return sum(1 for x in list(self.lines) if x.startswith('{"epoch"'))

    def wait(self, timeout):
        self.open_gate()
        try:
            self.rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            for t in self._threads:
                t.join(5)
            raise bt.TestFailure("rank %d (pid %d) hung: no exit within %ss (%d batches printed)"
                                 "\nargv: %s\nstderr:\n%s" %
                                 (self.rank, self.pid, timeout, self.batches_seen(),
                                  " ".join(self.argv), self.stderr()[-3000:]))
        for t in self._threads:
            t.join(10)
        self.seconds = time.monotonic() - self.t0
        return self.rc

    def stderr(self):
        return "".join(self.err)

    def result(self):
        """(batches, summary) parsed from stdout."""
        batches, summary = [], None
        for x in self.lines:
            o = json.loads(x)
            if "summary" in o:
                summary = o["summary"]
            else:
                batches.append(o)
        return batches, summary

    def ok(self, timeout=60, what="", status=0):
        """Waits; the process must exit with `status` (0; 143 after a SIGTERM, 128 + the
        signal) with a summary and no sanitizer report."""
        rc = self.wait(timeout)
        check_clean_log("fetch rank %d" % self.rank, self.stderr())
        if rc != status:
            raise bt.TestFailure("%sbatchwire fetch rank %d exited %d\nargv: %s\nstderr:\n%s" %
                                 (what and what + ": ", self.rank, rc, " ".join(self.argv),
                                  self.stderr()[-3000:]))
        batches, summary = self.result()
        if summary is None or summary["batches"] != len(batches):
            raise bt.TestFailure("rank %d: summary %r does not match %d batch lines" %
                                 (self.rank, summary, len(batches)))
        return batches, summary

    def refused(self, timeout=60):
        """Waits; the process must exit 1 and print no batch. Returns stderr."""
        rc = self.wait(timeout)
        check_clean_log("fetch rank %d" % self.rank, self.stderr())
        batches, _ = self.result()
        if rc != 1 or batches:
            raise bt.TestFailure("expected batchwire fetch to fail with exit 1 and no batch; "
                                 "exit %s, %d batches\nargv: %s\nstderr:\n%s" %
                                 (rc, len(batches), " ".join(self.argv), self.stderr()))
        return self.stderr()


def fetch_all(coord, job, dataset, c, world=WORLD, epochs=EPOCHS, extra=(), timeout=90):
    """Runs every rank concurrently for `epochs` epochs; returns {rank: batches}."""
    procs = [Fetch(coord, job, dataset, c, r, world, ["--epochs", epochs] + list(extra))
             for r in range(world)]
    return {p.rank: p.ok(timeout, "job %s" % job)[0] for p in procs}


def compare(label, got, want, samples):
    """got: fetch's batch lines; want: plan's batches (in order). Raises on any difference;
    returns the number of batches checked."""
    if len(got) != len(want):
        raise bt.TestFailure("%s: %d batches, the plan has %d (first missing/extra: %r)" %
                             (label, len(got), len(want),
                              (want[len(got)] if len(want) > len(got) else got[len(want)])))
    for g, w in zip(got, want):
        where = "%s epoch %d step %d" % (label, w["epoch"], w["step"])
        for k in ("epoch", "step", "indices", "padding", "real"):
            if g[k] != w[k]:
                raise bt.TestFailure("%s: %s is %r, the plan says %r" % (where, k, g[k], w[k]))
        if g["real"] != sum(1 for p in g["padding"] if not p):
            raise bt.TestFailure("%s: real %d but %d non-padding flags" %
                                 (where, g["real"], g["padding"].count(0)))
        nbytes = sum(len(samples[i]) for i in w["indices"])
        if g["bytes"] != nbytes:
            raise bt.TestFailure("%s: %d bytes, expected %d" % (where, g["bytes"], nbytes))
        sha = batch_sha(samples, w["indices"])
        if g["sha256"] != sha:
            raise bt.TestFailure("%s: sha256 %s, the generator's bytes give %s" %
                                 (where, g["sha256"], sha))
    return len(got)


def check_equal_counts(label, per_rank, epochs=EPOCHS):
    counts = {r: [sum(1 for b in bs if b["epoch"] == e) for e in range(epochs)]
              for r, bs in per_rank.items()}
    if len({tuple(v) for v in counts.values()}) != 1:
        raise bt.TestFailure("%s: ranks got different numbers of batches per epoch: %r" %
                             (label, counts))
    return counts[0]


# ---------------------------------------------------------------------------
# the test

CONFIGS = [
    dict(mode="torch", B=8, shuffle=True, seed=0),
    dict(mode="torch", B=8, shuffle=True, seed=1234, drop_last=True),
    dict(mode="torch", B=5, shuffle=True, seed=2 ** 33 + 5, sampler_drop_last=True),
    dict(mode="torch", B=5, drop_last=True, sampler_drop_last=True),
    dict(mode="accelerate", B=6, shuffle=True, seed=3),
    dict(mode="accelerate", B=6, shuffle=True, seed=4, drop_last=True),
    dict(mode="accelerate", B=8, shuffle=True, seed=5, split_batches=True),
    dict(mode="accelerate", B=8, shuffle=True, seed=6, split_batches=True, even_batches=False,
         drop_last=True),
    dict(mode="accelerate", B=7, shuffle=True, seed=9, even_batches=False, drop_last=True),
    # even_batches off without drop_last: valid only where ranks stay equal, else refused at
    # creation. 523 samples: 48 base batches of 11 (equal), 53 of 10 (refused); 397 samples:
    # 37 of 11 (refused), 40 of 10 (equal).
    dict(mode="accelerate", B=11, shuffle=True, seed=10, even_batches=False),
    dict(mode="accelerate", B=10, even_batches=False),
]


def run_matrix(cl, ds, dataset_spec, samples, configs, transport="auto"):
    n = ds["num_samples"]
    total = 0
    for k, c in enumerate(configs):
        job = "%s-%s-%d" % (ds["name"], transport, k)
        want, equal = plans(c, n, WORLD)
        if not equal:
            p = Fetch(cl.addr, job, dataset_spec, c, 0)
            err = p.refused(30)
            bt.check("different numbers of batches" in err and "drop_last" in err,
                     "%s [%s]: ranks would differ, so the job is refused: %s" %
                     (ds["name"], describe(c), err.strip()[-160:]))
            continue
        got = fetch_all(cl.addr, job, dataset_spec, c, extra=("--transport", transport))
        checked = 0
        pad = 0
        for r in range(WORLD):
            checked += compare("%s [%s] rank %d" % (ds["name"], describe(c), r), got[r], want[r],
                               samples)
            pad += sum(sum(b["padding"]) for b in got[r])
        counts = check_equal_counts(ds["name"], got)
        bt.ok("%s [%s] --transport %s: 4 ranks x 2 epochs, %d batches (%r per rank per epoch, "
              "%d padding samples) equal the plan and the generator's bytes" %
              (ds["name"], describe(c), transport, checked, counts, pad))
        total += checked
    return total


def grouped_reads(cl, samples):
    """Small batches of fixed-size samples are read several at a time (one request per worker
    for the samples of a group of batches; docs/performance.md, "Per-sample cost, third
    pass"): with --prefetch 16 (groups of 4, four in flight) a rank's batches equal the plan
    and the generator's bytes as with --prefetch 1 (no groups), over fewer requests; the
    --prefetch 4 does not group (it would leave fewer requests in flight); the default,
    --prefetch 0 (auto), keeps 128 of these small batches in flight in groups of 32
    ("Per-sample cost, sixth pass"). Padding, a short last batch and an epoch boundary fall
    inside groups."""
    c = dict(mode="torch", B=7, shuffle=True, seed=77)
    want, _ = plans(c, 523, 1)
    requests = {}
    for prefetch in (1, 4, 16, 0):
        job = "grouped-%d" % prefetch
        p = Fetch(cl.addr, job, "npy:npy/part-*.npy", c, 0, 1,
                  ["--epochs", EPOCHS, "--prefetch", prefetch])
        got, summary = p.ok(90, "job %s" % job)
        compare("grouped reads, --prefetch %d" % prefetch, got, want[0], samples)
        requests[prefetch] = summary["stats"]["requests"]
    bt.check(requests[16] * 2 < requests[1] == requests[4],
             "--prefetch 16 read %d batches with %d requests, --prefetch 1 and 4 with %d and %d "
             "(fewer than half: groups of 4 batches share requests; none at 4)"
             % (len(want[0]), requests[16], requests[1], requests[4]))
    bt.check(requests[0] * 5 < requests[1] and requests[0] < requests[16],
             "the default prefetch (auto) read %d batches of 672 bytes with %d requests, "
             "--prefetch 1 with %d, 16 with %d (groups of 32)"
             % (len(want[0]), requests[0], requests[1], requests[16]))


def large_batch_depth(cl):
    """The default prefetch (auto) for batches of fixed-size samples too large to group (over
    1 MiB): as many as hold 8 MiB, from 2 to 4 (docs/client.md, "Fetches ahead"), so 4 MiB
    batches go two at a time, 3 MiB three, 2 MiB four; 1 MiB batches, the largest grouped, go
    in pairs, eight in flight -- with the plan's samples and the generator's bytes at each."""
    big = gen(cl, "big", "npy", ["--num-samples", "160", "--shape", "65536", "--dtype", "uint8",
                                 "--files", "2"])
    samples = expected_samples(big)
    for batch, depth, group in ((64, 2, 1), (48, 3, 1), (32, 4, 1), (16, 8, 2)):
        c = dict(mode="torch", B=batch, shuffle=True, seed=5)
        want, _ = plans(c, 160, 1, 1)
        job = "depth-%d" % batch
        p = Fetch(cl.addr, job, "npy:big/part-*.npy", c, 0, 1,
                  ["--epochs", 1, "--log-level", "info"])
        got, _ = p.ok(90, "job %s" % job)
        compare("batches of %d x 64 KiB, the default prefetch" % batch, got, want[0], samples)
        chose = re.search(r"prefetch=(\d+) group=(\d+)", p.stderr())
        bt.check(chose and (int(chose.group(1)), int(chose.group(2))) == (depth, group),
                 "batches of %d KiB: the default prefetch is %d batches, %s (the loader said %r)"
                 % (batch * 64, depth, "in groups of %d" % group if group > 1 else "ungrouped",
                    chose and chose.group(0)))


def test(tmpdir):
    cl = Cluster(tmpdir)
    npy = gen(cl, "npy", "npy", ["--num-samples", "523", "--shape", "4,6", "--dtype", "float32",
                                 "--files", "3"])
    tfr = gen(cl, "tfr", "tfrecord", ["--num-samples", "397", "--sample-bytes", "0",
                                      "--sample-bytes-max", "700", "--files", "4"])
    npy_samples = expected_samples(npy)
    tfr_samples = expected_samples(tfr)
    grouped_reads(cl, npy_samples)
    large_batch_depth(cl)
    total = run_matrix(cl, npy, "npy:npy/part-*.npy", npy_samples, CONFIGS)
    # TFRecord: sources listed one by one (no glob), variable sizes including empty records.
    total += run_matrix(cl, tfr, "tfrecord:" + ",".join("tfr/" + s for s in tfr["sources"]),
                        tfr_samples, CONFIGS)
    # The same checks with sample bytes over gRPC instead of the workers' data channels.
    total += run_matrix(cl, npy, "npy:npy/part-*.npy", npy_samples, CONFIGS[:2], "grpc")
    total += run_matrix(cl, tfr, "tfrecord:" + ",".join("tfr/" + s for s in tfr["sources"]),
                        tfr_samples, CONFIGS[:2], "grpc")
    bt.ok("%d batches verified in all" % total)
    cl.stop()


if __name__ == "__main__":
    bt.main(test, timeout=300)
