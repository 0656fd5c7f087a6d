#!/usr/bin/python3
"""Allocation-failure injection against a real cluster (tests/alloc/alloc_fail.c says what one
run does and checks, and how only batchwire's own allocations are failed).

Two clusters, each a coordinator and one worker on loopback serving a 64-sample .npy dataset:
  * plaintext;
  * TLS everywhere with a bearer token: the coordinator requires a token (--auth-tokens) and
    serves only TLS; the worker's gRPC and data channel serve only TLS and require a client
    certificate. A loader that silently dropped TLS, its client certificate or the token could
    not open or read there, so every run that succeeds shows the settings held.
For each, alloc_fail probes a run's allocations, then fails the Nth allocation for every N
("once"; the library must recover) and every allocation from the Nth on ("from").
On the plaintext cluster also with the loader held open for 400 ms before its first batch
(--hold-ms), so that the heartbeat thread's allocations fail.
The default suite (about 80 s) sweeps every N on the plaintext cluster; held open and over TLS
every N of bw_loader_open, then every 3rd ("once") or 5th ("from"). BW_LONG_TESTS=1 (which
-DBW_LONG_TESTS=ON sets) sweeps every N everywhere. In the ASan build LeakSanitizer checks
alloc_fail's exit too.
"""

import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "integration"))
import bwtest as bt  # noqa: E402

SAMPLES, BATCH = 64, 8
PROGRAM = os.environ.get("BW_ALLOC_FAIL") or os.path.join(bt.BUILD_DIR, "tests", "alloc_fail")
LONG = os.environ.get("BW_LONG_TESTS", "0").lower() in ("1", "on", "true", "yes")
# For debugging: BW_ALLOC_FAIL_CLUSTERS=tls runs one cluster; BW_ALLOC_FAIL_ARGS="--first 10
# --last 20" narrows the sweeps.
CLUSTERS = os.environ.get("BW_ALLOC_FAIL_CLUSTERS", "plain,tls").split(",")


def alive(coord, n, tls_args=()):
    bt.poll(lambda: sum(w["state"] == "alive" and bool(w["data_address"])
                        for w in bt.status_json(coord.addr, tls_args)["workers"]) == n,
            20, what="%d live worker(s) with a data channel" % n)


FRAME_RE = re.compile(r"alloc_fail\(\+(0x[0-9a-f]+)\)")


def symbolize(lines):
    """alloc_fail's stack frames (backtrace_symbols_fd: PATH(+OFFSET)[ADDRESS]) as function,
    file and line, through addr2line when binutils has it."""
    out = []
    for line in lines:
        m = FRAME_RE.search(line)
        if m and shutil.which("addr2line"):
            r = subprocess.run(["addr2line", "-f", "-i", "-p", "-e", PROGRAM, m.group(1)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            out.extend("    " + x for x in r.stdout.splitlines())
        elif not line.startswith("/") or m:
            out.append(line)
    return out


def sweep(name, args, kinds, budget_s):
    """Runs alloc_fail; checks it passed; returns its summary lines."""
    argv = [PROGRAM, "--dataset", "npy:ds/part-00000.npy", "--samples", SAMPLES,
            "--batch", BATCH, "--job", "%s-%s" % (name, kinds), "--other-holder",
            os.getpid()] + list(args) + \
        ["--sweep", kinds] + os.environ.get("BW_ALLOC_FAIL_ARGS", "").split()
    env = dict(os.environ)
    # LeakSanitizer at exit (the ASan build); alloc_fail checks each run's blocks itself. A
    # failing run prints where its first allocation failure was injected.
    env["ASAN_OPTIONS"] = ((env["ASAN_OPTIONS"] + ":") if env.get("ASAN_OPTIONS") else "") + \
        "detect_leaks=1"
    env["BW_ALLOC_FAIL_TRACE"] = "1"
    bt.log("running %s" % " ".join(map(str, argv)))
    t0 = time.monotonic()
    r = subprocess.run([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=budget_s, env=env, start_new_session=True)
    lines = r.stdout.splitlines()
    for line in lines:
        if line.startswith(("probe:", "sweep")):
            bt.log("  " + line)
    fails = [line for line in lines if not line.startswith(("probe:", "sweep", "0 failed"))]
    bt.check(r.returncode == 0 and not fails,
             "%s: every injected allocation failure gave an error with its sentence; no crash, "
             "hang, leak, or wrong batch (exit %d, %.1f s)" % (name, r.returncode,
                                                              time.monotonic() - t0),
             "\n".join(symbolize(fails[:400])) + "\n--- stderr (last 4000 chars) ---\n" +
             r.stderr[-4000:])
    bt.check(any(line.startswith("probe:") for line in lines) and
             all(("sweep %s:" % k) in r.stdout for k in
                 (("once", "from") if kinds == "both" else (kinds,))),
             "%s: the probe and the %s sweep(s) ran" % (name, kinds))
    return lines


def test(tmp):
    bt.check(os.access(PROGRAM, os.X_OK), "alloc_fail is built (%s)" % PROGRAM)
    root = os.path.join(tmp, "data")
    os.makedirs(root)
    r = bt.cli("gen", "--format", "npy", "--out", os.path.join(root, "ds"), "--num-samples",
               SAMPLES, "--shape", "4", "--dtype", "float32")
    bt.check(r.returncode == 0, "batchwire gen wrote a %d-sample dataset" % SAMPLES, r.stderr)
    # Every run is a job of its own (a failed run may leave its rank claimed until the lease
    # ends): room for all of them. Leases of 600 ms: the heartbeat thread beats every 200 ms.
    jobs = ["--max-jobs", "100000", "--lease-ms", "600"]
    thin = (lambda k: []) if LONG else (lambda k: ["--stride", str(k)])

    if "plain" in CLUSTERS:
        coord = bt.coordinator(tmp, args=jobs)
        bt.worker(tmp, coord.addr, "w1", data_root=root)
        alive(coord, 1)
        sweep("plain", ["--coordinator", coord.addr], "both", 420)
        # The loader held open 400 ms before its first batch: the heartbeat thread's
        # allocations (and the fetch threads' first batches) fail.
        sweep("hold", ["--coordinator", coord.addr, "--hold-ms", "400", "--margin", "3"] +
              thin(3), "both", 420)
        coord.stop()
    if "tls" in CLUSTERS:
        tls_cluster(tmp, root, jobs, thin)


def tls_cluster(tmp, root, jobs, thin):
    pki = bt.make_pki(tmp)
    # The coordinator and the worker require a bearer token (docs/security.md): ROLE NAME TOKEN.
    # The coordinator presents its own ("coord") when it asks the worker to describe a dataset.
    principals = {"trainer": ("trainer", "tok-trainer-0123456789abcdef"),
                  "storage": ("worker", "tok-storage-0123456789abcdef"),
                  "coord": ("worker", "tok-coord-0123456789abcdefgh"),
                  "ops": ("admin", "tok-ops-0123456789abcdefghijk")}
    tokens = os.path.join(tmp, "tokens")
    with open(tokens, "w") as f:
        # "storage" registers the worker id t1: its ids= binding (docs/security.md).
        f.writelines("%s %s %s%s\n" % (role, name, t, " ids=t1" if name == "storage" else "")
                     for name, (role, t) in principals.items())
    os.chmod(tokens, 0o600)
    tok = {}
    for name, (_role, t) in principals.items():
        tok[name] = os.path.join(tmp, name + ".token")
        with open(tok[name], "w") as f:
            f.write(t + "\n")
    ca = ["--tls-ca", pki["ca"]]
    coord = bt.coordinator(tmp, name="tls-coordinator", args=jobs + [
        "--auth-tokens", tokens, "--token-file", tok["coord"], "--max-jobs-per-principal", "100000",
        "--tls-cert", pki["server_crt"], "--tls-key", pki["server_key"],
        "--worker-tls-ca", pki["ca"]])
    bt.worker(tmp, coord.addr, "t1", data_root=root, args=ca + [
        "--tls-cert", pki["worker_crt"], "--tls-key", pki["worker_key"],
        "--tls-client-ca", pki["ca"], "--auth-tokens", tokens, "--token-file", tok["storage"]])
    alive(coord, 1, ca + ["--token-file", tok["ops"]])
    creds = ["--coordinator", coord.addr, "--tls-ca", pki["ca"], "--tls-cert", pki["client_crt"],
             "--tls-key", pki["client_key"], "--token-file", tok["trainer"]]
    sweep("tls", creds + thin(3), "once", 420)
    sweep("tls", creds + thin(5), "from", 420)
    coord.stop()


if __name__ == "__main__":
    bt.main(test, timeout=1800 if LONG else 900)
