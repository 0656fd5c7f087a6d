"""A short soak of the trainer client, sized for the AddressSanitizer build (ctest runs it in
both builds): memory stays bounded and every process exits without a leak or sanitizer report.

* Two ranks pull an .npy and a TFRecord dataset (variable-size records) for several epochs
  with deep prefetch while the test samples their resident memory (/proc/PID/status VmRSS):
  the peak over the second half of the run may not exceed the peak over the first half by
  more than a small margin (in a sanitizer build, whose allocator quarantines freed memory,
  only a coarse bound applies). Every batch's sha256 is checked against the generator's bytes.
* Error paths must be leak-free too: a corrupt cursor, a duplicate rank, a resume from a
  cursor, and a worker SIGKILLed under a running rank (failover).
* At the end every daemon is stopped with SIGTERM: exit 0, no sanitizer report. Fetch
  processes must exit 0 (or 1 where refused) -- LeakSanitizer makes a leaking process exit 23.
"""

import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwtest as bt  # noqa: E402
import test_client_e2e as e2e  # noqa: E402
from test_client_resume import LEASE_MS, LEASE_WAIT, read_cursor  # noqa: E402

EPOCHS = 6      # the failover and resume parts
SOAK_EPOCHS = 40  # the memory part


def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class RssSampler:
    def __init__(self, pid, interval=0.02):
        self.pid = pid
        self.samples = []
        self._stop = threading.Event()
        self.t = threading.Thread(target=self._loop, args=(interval,), daemon=True)
        self.t.start()

    def _loop(self, interval):
        while not self._stop.is_set():
            v = rss_kib(self.pid)
            if v is None:
                break
            self.samples.append(v)
            time.sleep(interval)

    def stop(self):
        self._stop.set()
        self.t.join(5)


def soak(cl, name, spec, samples, c, sanitized, epochs=SOAK_EPOCHS):
    """epochs: enough that a rank's start (joining, a worker describing the dataset, first
    connections: RSS below its working size) stays well inside the first half of its run."""
    n = len(samples)
    want, _ = e2e.plans(c, n, 2, epochs)
    procs = [e2e.Fetch(cl.addr, name, spec, c, r, world=2,
                       extra=["--epochs", epochs, "--prefetch", 8]) for r in range(2)]
    samplers = [RssSampler(p.pid) for p in procs]
    results = [p.ok(240, name) for p in procs]
    for s in samplers:
        s.stop()
    for p, (got, summary), s in zip(procs, results, samplers):
        e2e.compare("%s rank %d" % (name, p.rank), got, want[p.rank], samples)
        v = s.samples
        if len(v) < 6:
            bt.log("%s rank %d: only %d RSS samples (the run took %.2f s); skipping the memory "
                   "bound" % (name, p.rank, len(v), p.seconds))
            continue
        half = len(v) // 2
        first, second = max(v[:half]), max(v[half:])
        margin = first // 2 + 65536 if sanitized else first // 10 + 4096
        bt.check(second <= first + margin,
                 "%s rank %d: %d batches over %d epochs (%.1f MiB) verified; resident memory "
                 "peak %d KiB in the first half, %d KiB in the second (bound +%d KiB, %d samples)"
                 % (name, p.rank, len(got), epochs, summary["bytes"] / 2 ** 20, first, second,
                    margin, len(v)))


def test(tmpdir):
    sanitized = e2e.sanitized_build()
    bt.log("sanitizer build: %s" % sanitized)
    if sanitized:
        # ASan keeps freed memory in a quarantine (256 MiB by default) before reusing it,
        # which looks like growth to an RSS probe; a small one keeps the bound meaningful.
        os.environ["ASAN_OPTIONS"] = (os.environ.get("ASAN_OPTIONS", "") +
                                      ":quarantine_size_mb=8").lstrip(":")
    cl = e2e.Cluster(tmpdir, nworkers=3, lease_ms=LEASE_MS)
    npy = e2e.gen(cl, "npy", "npy", ["--num-samples", "1500", "--shape", "512", "--dtype",
                                     "float32", "--files", "2"])
    tfr = e2e.gen(cl, "tfr", "tfrecord", ["--num-samples", "500", "--sample-bytes", "1",
                                          "--sample-bytes-max", "3000", "--files", "3"])
    npy_samples = e2e.expected_samples(npy)
    tfr_samples = e2e.expected_samples(tfr)
    c = dict(mode="torch", B=16, shuffle=True, seed=3)
    soak(cl, "soak-npy", "npy:npy/part-*.npy", npy_samples, c, sanitized)
    # (a run of 40 epochs of these took ~1 s: a rank that waited 0.5 s to start had its whole
    # warm-up in the first half)
    soak(cl, "soak-tfr", "tfrecord:tfr/part-*.tfrecord", tfr_samples,
         dict(mode="accelerate", B=12, shuffle=True, seed=4), sanitized, epochs=3 * SOAK_EPOCHS)

    # Error paths.
    spec = "npy:npy/part-*.npy"
    time.sleep(LEASE_WAIT)
    cur = os.path.join(tmpdir, "soak.cursor")
    first, _ = e2e.Fetch(cl.addr, "soak-npy", spec, c, 0, world=2,
                         extra=["--max-steps", 30, "--cursor-out", cur]).ok(60)
    # The holder must still run when the duplicate joins: a clean exit releases the rank at
    # once (LeaveJob), so it runs until SIGTERM, which ends it cleanly (exit 128 + SIGTERM).
    holder = e2e.Fetch(cl.addr, "soak-npy", spec, c, 1, world=2, extra=["--epochs", 100000])
    bt.poll(lambda: holder.batches_seen() > 0 or holder.proc.poll() is not None, 30,
            what="rank 1 to start")
    dup = e2e.Fetch(cl.addr, "soak-npy", spec, c, 1, world=2)
    err = dup.refused(60)
    bt.check("BW_ALREADY_EXISTS" in err, "a duplicate rank is refused, leak-free", err)
    holder.proc.send_signal(signal.SIGTERM)
    holder.ok(120, status=143)
    text = read_cursor(cur)
    bad = e2e.Fetch(cl.addr, "soak-npy", spec, c, 0, world=2, extra=["--resume", text[:-2]])
    bt.check("BW_CORRUPT" in bad.refused(60), "a corrupt cursor is refused, leak-free")
    time.sleep(LEASE_WAIT)
    rest, _ = e2e.Fetch(cl.addr, "soak-npy", spec, c, 0, world=2,
                        extra=["--resume", text, "--epochs", 2]).ok(60)
    want, _ = e2e.plans(c, len(npy_samples), 2, 2)
    e2e.compare("soak resume rank 0", first + rest, want[0], npy_samples)
    bt.ok("stopped after 30 batches and resumed from the cursor: %d batches as planned" %
          (len(first) + len(rest)))

    # Failover under a running rank: w3 is SIGKILLed; the rank finishes cleanly.
    time.sleep(LEASE_WAIT)
    p = e2e.Fetch(cl.addr, "soak-tfr", "tfrecord:tfr/part-*.tfrecord",
                  dict(mode="accelerate", B=12, shuffle=True, seed=4), 0, world=2,
                  extra=["--epochs", EPOCHS, "--prefetch", 2])
    bt.poll(lambda: p.batches_seen() > 0 or p.proc.poll() is not None, 30, what="rank 0 to start")
    cl.workers["w3"].kill9()
    got, _ = p.ok(120, "soak failover")
    want, _ = e2e.plans(dict(mode="accelerate", B=12, shuffle=True, seed=4), len(tfr_samples), 2,
                        EPOCHS)
    e2e.compare("soak failover rank 0", got, want[0], tfr_samples)
    bt.ok("w3 SIGKILLed under a running rank: %d batches as planned, leak-free exit" % len(got))
    cl.stop()


if __name__ == "__main__":
    bt.main(test, timeout=300)
