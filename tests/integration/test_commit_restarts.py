#!/usr/bin/python3
"""A trainer that commits its cursor after every batch sees no error while the coordinator
is killed and restarted under it (docs/operating.md, "Networks").

One coordinator on a fixed loopback port and its state directory, two workers, and a
batchwire.Loader in this process that takes a batch and commits after each, for 2 epochs,
while a thread restarts the coordinator RESTARTS times on the same port and state directory
(alternately SIGKILL and SIGTERM, down for 0-1.5 s each time). The loader retries joins and
commits with backoff for `retry` seconds; every commit must succeed, every batch must equal
the plan (`batchwire plan`), and the coordinator's committed cursor at the end must be the
last one the trainer committed.
"""

import json
import os
import random
import signal
import socket
import sys
import threading
import time

import bwtest as bt
from bwpy import maybe_reexec_under_asan

N, B, SEED = 600, 4, 11
RESTARTS = int(os.environ.get("BW_COMMIT_RESTARTS", "20"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plan(n, b, epoch):
    r = bt.cli("plan", "--mode", "torch", "--num-samples", n, "--world-size", 1,
               "--batch-size", b, "--epoch", epoch, "--rank", 0, timeout=60)
    bt.check(r.returncode == 0, "batchwire plan for epoch %d" % epoch, r.stderr)
    return [json.loads(line)["indices"] for line in r.stdout.splitlines()
            if line.startswith("{") and "indices" in line]


def test(tmpdir):
    sys.path.insert(0, os.path.join(bt.SOURCE_DIR, "python"))
    os.environ["BATCHWIRE_LIB"] = os.path.join(bt.BUILD_DIR, "lib", "libbatchwire.so")
    import batchwire

    root = os.path.join(tmpdir, "data")
    os.makedirs(root)
    r = bt.cli("gen", "--format", "npy", "--out", os.path.join(root, "ds"), "--num-samples", N,
               "--sample-bytes", 64, timeout=60)
    bt.check(r.returncode == 0, "gen a .npy dataset of %d samples" % N, r.stderr)
    port = free_port()
    addr = "127.0.0.1:%d" % port
    state = os.path.join(tmpdir, "state")
    cargs = ["--listen", addr, "--lease-ms", "60000", "--heartbeat-ms", "200",
             "--dead-after", "3", "--shutdown-grace-ms", "200"]

    def start_coord(name):
        d = bt.Daemon(name, [bt.COORDINATOR, "--state-dir", state] + cargs, tmpdir)
        d.state_dir = state
        d.wait_listening()
        return d

    coord = start_coord("coordinator")
    workers = [bt.worker(tmpdir, addr, "w%d" % i, data_root=root) for i in (1, 2)]
    bt.poll(lambda: sum(w["state"] == "alive" for w in bt.status_json(addr)["workers"]) == 2,
            15, interval=0.1, what="2 live workers")

    box = {"coord": coord, "restarts": 0, "down": [], "got": [], "commits": 0, "done": False}
    rng = random.Random(SEED)
    want = [plan(N, B, e) for e in (0, 1)]

    def trainer():
        # In a thread: the daemons must be started by the main thread (bwtest's children die
        # with the thread that started them, PR_SET_PDEATHSIG).
        try:
            with batchwire.Loader(coordinator=addr, job="commits",
                                  dataset="npy:ds/part-00000.npy", batch_size=B, rank=0,
                                  world_size=1, timeout=5.0, retry=60.0, prefetch=2) as loader:
                for _epoch in loader.epochs(2):
                    for b in loader:
                        box["got"].append(b.indices.tolist())
                        loader.commit()  # raises on any error
                        box["commits"] += 1
                        if box["restarts"] < RESTARTS:
                            time.sleep(0.02)  # keep the run going while the restarts happen
                box["last"] = loader.cursor()
        except BaseException as e:  # reported by the main thread
            box["error"] = e
        box["done"] = True

    t = threading.Thread(target=trainer, daemon=True)
    t.start()
    while box["restarts"] < RESTARTS and not box["done"]:
        time.sleep(rng.uniform(0.1, 0.4))
        c = box["coord"]
        if box["restarts"] % 2:
            c.send(signal.SIGTERM)
        else:
            c.kill9()
        c.wait(20)
        t0 = time.monotonic()
        time.sleep(rng.uniform(0.0, 1.5))
        box["coord"] = start_coord("coordinator-%d" % (box["restarts"] + 1))
        box["down"].append(time.monotonic() - t0)
        box["restarts"] += 1
    t.join(180)
    if "error" in box:
        raise box["error"]
    got, commits, last = box["got"], box["commits"], box.get("last", "")
    bt.check(box["restarts"] == RESTARTS,
             "%d coordinator restarts (SIGKILL and SIGTERM alternately, down %.1f-%.1f s) during "
             "%d commits, none of which failed" %
             (box["restarts"], min(box["down"]), max(box["down"]), commits))
    bt.check(got == want[0] + want[1], "every one of the %d batches equals batchwire plan" %
             len(got))
    st = bt.status_json(addr)
    job = next(j for j in st["jobs"] if j["name"] == "commits")
    rank = next(r for r in job["ranks"] if r["rank"] == 0)
    bt.check(rank.get("epoch") == 1 and rank.get("step") == len(want[1]),
             "the coordinator holds the last committed cursor (epoch 1, step %d)" % len(want[1]),
             json.dumps(rank))
    bt.check(last.startswith("bwc1:"), "the loader's final cursor is a text cursor")
    for d in [box["coord"]] + workers:
        d.stop()


if __name__ == "__main__":
    maybe_reexec_under_asan()
    bt.main(test, timeout=300)
