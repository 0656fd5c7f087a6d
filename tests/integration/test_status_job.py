"""`batchwire status --job NAME` and `batchwire health --coordinator`, against a real cluster.

Two jobs are read with `batchwire fetch` (one committing its cursor). `status --job j1` shows
j1 alone -- its line and its rank, no worker table, not j2 -- and `--json` prints j1's object,
equal to j1's entry in the full `status --json`. An unknown job is an error (exit 1) naming
the job, the coordinator and the jobs it has. `health --coordinator` checks the coordinator,
`--addr` a worker, and `--addr` wins over BATCHWIRE_COORDINATOR.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwtest as bt  # noqa: E402


def fetch(coord, job, extra=()):
    r = bt.cli("fetch", "--coordinator", coord, "--job", job, "--dataset", "npy:ds/*.npy",
               "--rank", 0, "--world-size", 1, "--batch-size", 10, "--max-steps", 3, "--quiet",
               *extra, timeout=60)
    bt.check(r.returncode == 0, "batchwire fetch --job %s" % job, r.stderr)


def test(tmp):
    coord = bt.coordinator(tmp)
    os.makedirs(os.path.join(tmp, "data"), exist_ok=True)
    r = bt.cli("gen", "--format", "npy", "--out", os.path.join(tmp, "data", "ds"),
               "--num-samples", 100, "--shape", 2, "--dtype", "int32")
    bt.check(r.returncode == 0, "batchwire gen", r.stderr)
    w = bt.worker(tmp, coord.addr, "w1")
    bt.poll(lambda: bt.workers_by_id(bt.status_json(coord.addr)).get("w1", {}).get("state") ==
            "alive", 20, what="w1 alive")
    fetch(coord.addr, "j1", ["--commit"])
    fetch(coord.addr, "j2")

    r = bt.cli("status", "--coordinator", coord.addr, "--job", "j1")
    bt.check(r.returncode == 0, "status --job j1 exits 0", r.stderr)
    lines = r.stdout.splitlines()
    bt.check(lines[0] == "coordinator %s" % coord.addr and
             any(ln.startswith("job j1  torch  world 1  100 samples") for ln in lines) and
             "j2" not in r.stdout and "ADDRESS" not in r.stdout and "w1" not in r.stdout,
             "the table shows j1 alone, without workers or other jobs", r.stdout)
    rank = [ln.split() for ln in lines if ln.split()[:1] == ["0"]]
    bt.check(len(rank) == 1 and rank[0][1] == "none" and rank[0][4:6] == ["0", "3"],
             "and its rank 0: no lease, committed epoch 0 step 3", r.stdout)

    r = bt.cli("status", "--coordinator", coord.addr, "--job", "j1", "--json")
    bt.check(r.returncode == 0 and len(r.stdout.splitlines()) == 1,
             "status --job j1 --json prints one line", r.stdout + r.stderr)
    one = json.loads(r.stdout)
    full = {j["name"]: j for j in bt.status_json(coord.addr)["jobs"]}
    bt.check(one["name"] == "j1" and [x["rank"] for x in one["ranks"]] == [0] and
             one["ranks"][0]["committed"] and one["ranks"][0]["step"] == 3 and
             one["world_size"] == 1 and one["num_samples"] == 100,
             "--json is j1's object with its rank", one)
    for k in ("name", "mode", "world_size", "num_samples", "fingerprint", "history", "ranks"):
        bt.check(one[k] == full["j1"][k], "  %s as in the full status's entry" % k)

    r = bt.cli("status", "--coordinator", coord.addr, "--job", "nope")
    bt.check(r.returncode == 1 and r.stdout == "" and
             "batchwire status: no job 'nope' on the coordinator at %s" % coord.addr in r.stderr
             and "its jobs: j1, j2" in r.stderr,
             "an unknown job: exit 1 naming it, the coordinator and its jobs", r.stderr)
    r = bt.cli("status", "--coordinator", coord.addr, "--job", "nope", "--json")
    bt.check(r.returncode == 1 and r.stdout == "" and "no job 'nope'" in r.stderr,
             "also with --json", r.stderr)

    r = bt.cli("health", "--coordinator", coord.addr)
    bt.check(r.returncode == 0 and r.stdout.strip() == "SERVING", "health --coordinator",
             r.stderr)
    r = bt.cli("health", "--addr", w.addr, env={"BATCHWIRE_COORDINATOR": "127.0.0.1:1"})
    bt.check(r.returncode == 0 and r.stdout.strip() == "SERVING",
             "health --addr WORKER (wins over BATCHWIRE_COORDINATOR)", r.stderr)
    r = bt.cli("health", env={"BATCHWIRE_COORDINATOR": coord.addr})
    bt.check(r.returncode == 0 and r.stdout.strip() == "SERVING",
             "health with BATCHWIRE_COORDINATOR only", r.stderr)

    for d in (w, coord):
        bt.check(d.stop() == 0, "%s stops cleanly" % d.name)


if __name__ == "__main__":
    bt.main(test, timeout=120)
