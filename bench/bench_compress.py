#!/usr/bin/python3
"""The wire-compression benchmark (docs/performance.md, "Wire compression"): one rank reading
one epoch with `batchwire fetch --compress none|zstd|auto` over the data channel, for three
kinds of samples, on loopback and on a link capped at 1 Gbit/s:

* tokens: int32 token ids drawn from a Zipf distribution (numpy's zipf(1.2), modulo a
  50,257-word vocabulary), 2,048 tokens (8 KiB) a sample;
* float16: normally distributed float16 arrays, 4,096 values (8 KiB) a sample;
* jpeg: `batchwire gen --format jpeg` images (64 to 640 px a side, varied quality), one file a
  sample (format files).

Topology: two network namespaces this script creates, `bwz<pid>-srv` (the coordinator and one
worker, on 10.233.0.1) and `bwz<pid>-cli`, joined by a veth pair whose server end has a
`tc tbf rate 1gbit burst 256kb latency 50ms` qdisc. The link case runs the client in
`-cli`; the loopback case runs it in `-srv`, where the same address is local (its lo). Bytes
on the wire are the server namespace's transmit counter of the interface used (lo or the
veth; gRPC's control traffic included, a few KiB) over the run; MiB/s and samples/s are the
client's (fetch's summary: delivered sample bytes over its wall time); CPU seconds are the
worker process's (/proc/PID/stat) and the fetch process's (its rusage) over the run. Each configuration runs
--repeat times, interleaved, after one untimed read of each dataset; the table gives medians.

Needs root (ip netns, tc). Usage (after the README's build):
    /usr/bin/python3 bench/bench_compress.py [--build build] [--mib 64] [--repeat 3]
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
SUB = "10.233.0"


def sh(argv, check=True, **kw):
    r = subprocess.run([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, **kw)
    if check and r.returncode != 0:
        sys.exit("%s: exit %d: %s" % (" ".join(map(str, argv)), r.returncode, r.stderr))
    return r


class Net:
    """Two namespaces joined by a veth pair capped at 1 Gbit/s on the server's side."""

    def __init__(self):
        self.srv, self.cli = "bwz%d-srv" % os.getpid(), "bwz%d-cli" % os.getpid()
        for ns in (self.srv, self.cli):
            sh(["ip", "netns", "add", ns])
            sh(["ip", "-n", ns, "link", "set", "lo", "up"])
        sh(["ip", "-n", self.srv, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0",
            "netns", self.cli])
        for ns, octet in ((self.srv, 1), (self.cli, 2)):
            sh(["ip", "-n", ns, "addr", "add", "%s.%d/24" % (SUB, octet), "dev", "eth0"])
            sh(["ip", "-n", ns, "link", "set", "eth0", "up"])
        sh(["tc", "-n", self.srv, "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "1gbit",
            "burst", "256kb", "latency", "50ms"])

    def tx_bytes(self, dev):
        r = sh(["ip", "netns", "exec", self.srv, "cat",
                "/sys/class/net/%s/statistics/tx_bytes" % dev])
        return int(r.stdout)

    def close(self):
        for ns in (self.srv, self.cli):
            sh(["ip", "netns", "del", ns], check=False)


def start(net, argv, log):
    return subprocess.Popen(["ip", "netns", "exec", net.srv] + argv, stdout=log,
                            stderr=subprocess.STDOUT)


def wait_worker(cli, net, addr):
    for _ in range(200):
        r = sh(["ip", "netns", "exec", net.srv, cli, "status", "--coordinator", addr, "--json"],
               check=False)
        if r.returncode == 0 and any(w.get("state") == "alive"
                                     for w in json.loads(r.stdout).get("workers", [])):
            return
        time.sleep(0.1)
    sys.exit("the worker did not come up")


def make_data(root, cli, mib, rng):
    import numpy as np
    n8k = max(64, (mib << 20) // 8192)
    tok = (rng.zipf(1.2, (n8k, 2048)) % 50257).astype(np.int32)
    np.save(os.path.join(root, "tokens.npy"), tok)
    np.save(os.path.join(root, "float16.npy"),
            rng.standard_normal((n8k, 4096)).astype(np.float16))
    # about 30 KiB an image at the defaults: mib MiB of them
    sh([cli, "gen", "--format", "jpeg", "--out", os.path.join(root, "jpeg"), "--num-samples",
        max(64, (mib << 20) // (30 << 10)), "--seed", 28])
    jpeg_bytes = sum(os.path.getsize(os.path.join(root, "jpeg", f))
                     for f in os.listdir(os.path.join(root, "jpeg")))
    return {"tokens": ("npy:tokens.npy", 64, tok.nbytes),
            "float16": ("npy:float16.npy", 64, n8k * 8192),
            "jpeg": ("files:jpeg/*", 64, jpeg_bytes)}


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def fetch(net, ns, cli, addr, job, spec, batch, compress):
    t0 = time.monotonic()
    r = sh(["ip", "netns", "exec", ns, cli, "fetch", "--coordinator", addr, "--job", job,
            "--dataset", spec, "--rank", 0, "--world-size", 1, "--batch-size", batch,
            "--epochs", 1, "--quiet", "--compress", compress], timeout=600)
    wall = time.monotonic() - t0
    summ = json.loads([ln for ln in r.stdout.splitlines() if '"summary"' in ln][-1])["summary"]
    return summ, wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--mib", type=int, default=64, help="MiB of samples per dataset")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write the medians here too")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root: it creates network namespaces and a tc qdisc")
    import numpy as np
    cli = os.path.join(a.build, "bin", "batchwire")
    tmp = tempfile.mkdtemp(prefix="bw-bench-compress-")
    net = Net()
    procs = []
    try:
        root = os.path.join(tmp, "data")
        os.makedirs(root)
        data = make_data(root, cli, a.mib, np.random.default_rng(28))
        logs = open(os.path.join(tmp, "daemons.log"), "w")
        addr = "%s.1:7700" % SUB
        procs.append(start(net, [os.path.join(a.build, "bin", "batchwire-coordinator"),
                                 "--listen", addr, "--state-dir", os.path.join(tmp, "state")],
                           logs))
        time.sleep(0.3)
        procs.append(start(net, [os.path.join(a.build, "bin", "batchwire-worker"),
                                 "--coordinator", addr, "--listen", "%s.1:7701" % SUB,
                                 "--data-root", root, "--id", "w1"], logs))
        wait_worker(cli, net, addr)
        for name, (spec, batch, _) in data.items():  # untimed: files cached, datasets open
            fetch(net, net.srv, cli, addr, "warm-" + name, spec, batch, "none")
        results = {}
        k = 0
        for rep in range(a.repeat):
            for where, ns, dev in (("loopback", net.srv, "lo"), ("1gbit", net.cli, "eth0")):
                for name, (spec, batch, _) in data.items():
                    for comp in ("none", "zstd", "auto"):
                        k += 1
                        before = net.tx_bytes(dev)
                        wcpu, ccpu = cpu_seconds(procs[1].pid), children_cpu()
                        summ, wall = fetch(net, ns, cli, addr, "j%d" % k, spec, batch, comp)
                        wire = net.tx_bytes(dev) - before
                        wcpu = cpu_seconds(procs[1].pid) - wcpu
                        ccpu = children_cpu() - ccpu
                        results.setdefault((where, name, comp), []).append(
                            (wire, summ["mib_per_s"], summ["samples"] / summ["seconds"],
                             summ["bytes"], wcpu, ccpu))
        rows = []
        print("%-9s %-8s %-5s %10s %9s %6s %8s %10s %9s %9s" % (
            "link", "data", "mode", "sample MiB", "wire MiB", "ratio", "MiB/s", "samples/s",
            "wrk CPU s", "cli CPU s"))
        for (where, name, comp), v in results.items():
            wire = statistics.median(x[0] for x in v)
            mibs = statistics.median(x[1] for x in v)
            sps = statistics.median(x[2] for x in v)
            raw = v[0][3]
            wcpu = statistics.median(x[4] for x in v)
            ccpu = statistics.median(x[5] for x in v)
            rows.append({"link": where, "data": name, "compress": comp, "sample_bytes": raw,
                         "wire_bytes": wire, "mib_per_s": mibs, "samples_per_s": sps,
                         "worker_cpu_s": wcpu, "client_cpu_s": ccpu, "runs": len(v)})
            print("%-9s %-8s %-5s %10.1f %9.1f %6.2f %8.1f %10.0f %9.2f %9.2f" % (
                where, name, comp, raw / 2**20, wire / 2**20, raw / wire if wire else 0, mibs,
                sps, wcpu, ccpu))
        for where in ("loopback", "1gbit"):
            for name in data:
                base = results[(where, name, "none")]
                for comp in ("zstd", "auto"):
                    v = results[(where, name, comp)]
                    print("%s %s %s vs none: %.2fx fewer bytes on the wire, %.2fx samples/s" % (
                        where, name, comp,
                        statistics.median(x[0] for x in base) / statistics.median(x[0] for x in v),
                        statistics.median(x[2] for x in v) / statistics.median(x[2] for x in base)))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        net.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
