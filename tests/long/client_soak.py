"""The long memory soak of the trainer client (not in the default suite: ctest label "long",
configured with -DBW_LONG_TESTS=ON; BW_SOAK_SECONDS sets the duration, 600 by default).

Two ranks pull a shuffled .npy dataset with deep prefetch, epoch after epoch, for the whole
duration while the test samples their resident memory every 0.1 s. Then they are stopped with
SIGTERM (which ends a fetch cleanly after the current batch) and must exit 0. The peak resident
memory over the last third of the run may not exceed the peak over the first third by more than
5% + 2 MiB: memory is bounded, not growing with time or batches. The same holds for each storage
worker (which serves the ranks over its data channel).
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import bwtest as bt  # noqa: E402
import test_client_e2e as e2e  # noqa: E402

SECONDS = float(os.environ.get("BW_SOAK_SECONDS", "600"))


def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def test(tmpdir):
    cl = e2e.Cluster(tmpdir, nworkers=3)
    e2e.gen(cl, "npy", "npy", ["--num-samples", "4000", "--shape", "1024", "--dtype", "float32",
                               "--files", "3"])
    procs = []
    for rank in range(2):
        argv = [bt.CLI, "fetch", "--coordinator", cl.addr, "--job", "soak", "--dataset",
                "npy:npy/part-*.npy", "--rank", str(rank), "--world-size", "2", "--batch-size",
                "32", "--shuffle", "--seed", "5", "--epochs", "1000000", "--prefetch", "8",
                "--quiet"]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    watched = [(p.pid, "rank %d" % r) for r, p in enumerate(procs)] + \
        [(w.pid, "worker %s" % wid) for wid, w in sorted(cl.workers.items())]
    samples = [[] for _ in watched]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            for i, (pid, _) in enumerate(watched):
                v = rss_kib(pid)
                if v is not None:
                    samples[i].append((time.monotonic(), v))
            time.sleep(0.1)

    t = threading.Thread(target=sample, daemon=True)
    t0 = time.monotonic()
    t.start()
    while time.monotonic() - t0 < SECONDS:
        time.sleep(1)
        for p in procs:
            bt.check(p.poll() is None, "rank still running after %.0f s" % (time.monotonic() - t0),
                     p.stderr.read() if p.poll() is not None else None)
    stop.set()
    t.join()
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for rank, p in enumerate(procs):
        out, err = p.communicate(timeout=60)
        bt.check(p.returncode == 0, "rank %d exits 0 after SIGTERM" % rank, err)
        summary = json.loads(out.strip().splitlines()[-1])["summary"]
        bt.log("rank %d: %d batches (%.0f MiB) in %.0f s" %
               (rank, summary["batches"], summary["bytes"] / 2 ** 20, SECONDS))
    for i, (_, name) in enumerate(watched):
        v = [kib for _, kib in samples[i]]
        third = len(v) // 3
        first, last = max(v[:third]), max(v[-third:])
        bt.check(last <= first * 1.05 + 2048,
                 "%s: resident memory peak %d KiB in the first third of %.0f s, %d KiB in the "
                 "last (%d samples)" % (name, first, SECONDS, last, len(v)))
    cl.stop()


if __name__ == "__main__":
    bt.main(test, timeout=int(SECONDS) + 300)
