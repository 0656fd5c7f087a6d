"""Trainers tell a real worker, and metrics keep to who may read them (docs/security.md,
"Worker certificates" and "Metrics"), with authentication on:

* Over TLS, a rogue worker holding a worker token and a certificate the cluster's CA signed,
  but for another host (DNS:other.example, IP:127.0.0.2), registers and is given shards: the
  trainer refuses it on both transports, naming the address it dialled and what the
  certificate names, and receives not one sample from it. With the legitimate worker back,
  the same job reads every sample exactly once an epoch, the same bytes on both transports.
* The coordinator verifies workers the same way (Data.Describe through the rogue is refused,
  named), and a worker its coordinator.
* --metrics-auth: /metrics without the bearer token, or with another, is 401 and shows no job
  name; with it, 200 and the job's series. Over TLS the endpoint is HTTPS with the daemon's
  certificate.
* Without TLS, each daemon with --auth-tokens warns once at start that tokens and grants cross
  the network in clear; with TLS on its listener and its calls, it does not.
* A registered worker cannot make a trainer allocate more than the dataset's largest sample:
  a fake worker (this file: registration and heartbeats with python3-grpcio, the data channel
  with a raw socket) announces a text line one byte larger than the largest source file, far
  below the dataset's total size; the trainer refuses it before reading it, naming the worker
  and the bound.
"""

import json
import os
import re
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import grpc

import bwtest as bt
import jobs_rpc as jr

pb, dpb, bpb = jr.pb, jr.dpb, jr.bpb

TOKENS = {
    "ops": ("admin", "ops-token-0123456789abcdef"),
    "alice": ("trainer", "alice-token-0123456789abcdef"),
    "w1": ("worker", "w1-token-0123456789abcdef"),
    "rogue": ("worker", "rogue-token-0123456789abcdef"),
    # The coordinator's own token (--token-file): where it still sends one to workers on
    # Data.Describe, a principal that may only describe.
    "coord": ("worker", "coord-token-0123456789abcdef"),
}
METRICS_TOKEN = "metrics-token-0123456789abcdef"
N = 640
PLAINTEXT_WARNING = "auth: on without TLS"
ROGUE_NAMES = "DNS:other.example, IP:127.0.0.2"


def write_principals(path):
    bt.write_principals(path, [(role, name, tok) for name, (role, tok) in TOKENS.items()])


def token_file(tmp, name):
    return bt.secret_file(tmp, "token-" + name, TOKENS[name][1])


def fetch(coord, job, transport, creds, timeout_ms=10000):
    """`batchwire fetch` rank 0 of 1, two epochs; the finished process."""
    return bt.cli("fetch", "--coordinator", coord.addr, "--job", job, "--dataset", "npy:d/*.npy",
                  "--rank", 0, "--world-size", 1, "--batch-size", 8, "--shuffle", "--seed", 5,
                  "--epochs", 2, "--transport", transport, "--timeout-ms", timeout_ms, *creds,
                  timeout=120)


def batches(r):
    return [json.loads(x) for x in r.stdout.splitlines() if x and "summary" not in x]


def exact(r, what):
    """Every sample once an epoch, two epochs; returns the batches' digests."""
    bt.check(r.returncode == 0, "%s: batchwire fetch exits 0" % what, r.stderr[-3000:])
    got = batches(r)
    for e in (0, 1):
        idx = sorted(i for b in got if b["epoch"] == e for i in b["indices"])
        bt.check(idx == list(range(N)), "%s: epoch %d has each of the %d samples once" %
                 (what, e, N), idx[:20])
    return [b["sha256"] for b in got]


def scrape(url, token=None, cafile=None):
    """(status, body) of GET url."""
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", "Bearer " + token)
    ctx = ssl.create_default_context(cafile=cafile) if cafile else None
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metrics_held(d, job, cafile=None):
    url = d.wait_log(r"metrics on (\S+)")[0].group(1)
    bt.check(url.startswith("https://" if cafile else "http://"),
             "%s serves /metrics over %s: %s" % (d.name, "HTTPS" if cafile else "HTTP", url))
    for token, what in ((None, "no token"), ("not-" + METRICS_TOKEN, "another token")):
        code, body = scrape(url, token, cafile)
        bt.check(code == 401 and "batchwire_" not in body and (job is None or job not in body),
                 "%s /metrics with %s: 401 and no metrics, no job name" % (d.name, what),
                 (code, body[:300]))
    code, body = scrape(url, METRICS_TOKEN, cafile)
    bt.check(code == 200 and "process_open_fds" in body and (job is None or job in body),
             "%s /metrics with the --metrics-auth token: 200 and the metrics%s" %
             (d.name, " naming job %s" % job if job else ""), (code, body[:300]))


def warned_once(d, expect):
    n = d.log_text().count(PLAINTEXT_WARNING)
    bt.check(n == (1 if expect else 0), "%s logs the plaintext-with-auth warning %s (%d)" %
             (d.name, "once" if expect else "never", n), d.log_text()[-2000:])


def plaintext(tmp, principals, mtok):
    bt.log("===== auth without TLS: one warning each; --metrics-auth over HTTP =====")
    coord = bt.coordinator(tmp, args=["--heartbeat-ms", 200, "--auth-tokens", principals,
                                      "--token-file", token_file(tmp, "coord"),
                                      "--metrics-listen", "127.0.0.1:0", "--metrics-auth", mtok])
    w1 = bt.worker(tmp, coord.addr, "w1", args=[
        "--auth-tokens", principals, "--token-file", token_file(tmp, "w1"),
        "--metrics-listen", "127.0.0.1:0", "--metrics-auth", mtok])
    coord.wait_log(r"worker=w1 address=\S+ peer=\S+ registered")
    creds = ["--token-file", token_file(tmp, "alice")]
    digests = {t: exact(fetch(coord, "plain-" + t, t, creds), "plaintext, --transport " + t)
               for t in ("auto", "grpc")}
    bt.check(digests["auto"] == digests["grpc"], "plaintext: both transports, the same bytes")
    for d in (coord, w1):
        warned_once(d, True)
    bt.check("serves and calls in plaintext" in coord.log_text(),
             "the coordinator's warning says it serves and calls in plaintext")
    metrics_held(coord, "plain-auto")
    metrics_held(w1, None)
    for d in (w1, coord):
        bt.check(d.stop() == 0, "%s stops cleanly" % d.name)
    return digests["auto"]


def tls(tmp, principals, mtok, plain_digests):
    bt.log("===== TLS: a CA-valid certificate for another host cannot feed a trainer =====")
    pki = bt.make_pki(tmp)
    bt._leaf(pki["dir"], "other", "other.example", "ca", "DNS:other.example,IP:127.0.0.2")
    other = [os.path.join(pki["dir"], "other.crt"), os.path.join(pki["dir"], "other.key")]
    ca = ["--tls-ca", pki["ca"]]
    coord = bt.coordinator(tmp, name="coordinator-tls", args=[
        "--heartbeat-ms", 200, "--tls-cert", pki["server_crt"], "--tls-key", pki["server_key"],
        "--worker-tls-ca", pki["ca"], "--auth-tokens", principals,
        "--token-file", token_file(tmp, "coord"), "--metrics-listen", "127.0.0.1:0",
        "--metrics-auth", mtok])

    def worker(wid, cert, key):
        return bt.worker(tmp, coord.addr, wid, args=ca + [
            "--tls-cert", cert, "--tls-key", key, "--auth-tokens", principals,
            "--token-file", token_file(tmp, wid)])

    w1 = worker("w1", pki["worker_crt"], pki["worker_key"])
    coord.wait_log(r"worker=w1 address=\S+ peer=\S+ registered")
    creds = ca + ["--token-file", token_file(tmp, "alice")]
    for t in ("auto", "grpc"):
        bt.check(exact(fetch(coord, "tls-" + t, t, creds), "TLS, --transport " + t) ==
                 plain_digests, "TLS, --transport %s: the plaintext run's bytes" % t)
    for d in (coord, w1):
        warned_once(d, False)
    metrics_held(coord, "tls-auto", cafile=pki["ca"])

    # The rogue: a worker principal's token and a certificate the CA signed for another host.
    bt.check(w1.stop() == 0, "w1 stops cleanly")
    coord.wait_log(r"worker=w1 address=\S+ marked dead", timeout=15)
    rogue = worker("rogue", *other)
    coord.wait_log(r"worker=rogue address=127\.0\.0\.1:\d+ peer=\S+ registered")
    bt.poll(lambda: [w["id"] for w in bt.status_json(coord.addr, ca + [
        "--token-file", token_file(tmp, "ops")])["workers"] if w["state"] == "alive"] ==
        ["rogue"] or None, 15, what="the rogue the only live worker")
    for t in ("auto", "grpc"):
        r = fetch(coord, "tls-" + t, t, creds, timeout_ms=3000)
        bt.check(r.returncode != 0 and not batches(r),
                 "--transport %s: the trainer takes nothing from the rogue (exit %d)" %
                 (t, r.returncode), r.stdout[-1000:])
        bt.check('"samples_received":0' in r.stdout,
                 "--transport %s: not one sample received from it" % t, r.stdout[-1000:])
        bt.check(re.search(r"Peer name 127\.0\.0\.1 is not in peer certificate \(the certificate "
                           r"there names %s" % re.escape(ROGUE_NAMES), r.stderr),
                 "--transport %s: gRPC's refusal names the address dialled and what the "
                 "certificate names" % t, r.stderr[-3000:])
        if t == "auto":
            bt.check("the certificate names %s, not 127.0.0.1" % ROGUE_NAMES in r.stderr,
                     "--transport auto: the data channel's refusal names both too",
                     r.stderr[-3000:])

    # The coordinator verifies it the same way when it asks it to describe a new dataset.
    r = bt.cli("fetch", "--coordinator", coord.addr, "--job", "tls-new", "--dataset",
               "npy:d/*.npy", "--rank", 0, "--world-size", 1, "--batch-size", 8, "--epochs", 1,
               "--retry-ms", 0, *creds, timeout=60)
    bt.check(r.returncode != 0 and "could not describe the dataset" in r.stderr and
             "the certificate there names %s" % ROGUE_NAMES in r.stderr,
             "the coordinator refuses to describe a dataset through the rogue, naming what its "
             "certificate names", r.stderr[-2000:])

    bt.log("===== the legitimate worker back: the same job finishes exactly =====")
    bt.check(rogue.stop() == 0, "the rogue stops cleanly")
    coord.wait_log(r"worker=rogue address=\S+ marked dead", timeout=15)
    w1 = worker("w1", pki["worker_crt"], pki["worker_key"])
    coord.wait_log(r"worker=w1 address=\S+ peer=\S+ registered", count=2)
    for t in ("auto", "grpc"):
        bt.check(exact(fetch(coord, "tls-" + t, t, creds), "TLS again, --transport " + t) ==
                 plain_digests, "TLS again, --transport %s: the same bytes" % t)
    for d in (w1, coord):
        bt.check(d.stop() == 0, "%s stops cleanly" % d.name)

    # A worker verifies its coordinator: one serving a CA-valid certificate for another host
    # is refused, named.
    other_coord = bt.coordinator(tmp, name="coordinator-other", args=[
        "--tls-cert", other[0], "--tls-key", other[1]])
    w9 = bt.worker(tmp, other_coord.addr, "w9", args=ca)
    w9.wait_log(r"Peer name 127\.0\.0\.1 is not in peer certificate \(the certificate there "
                r"names %s" % re.escape(ROGUE_NAMES), timeout=15)
    bt.ok("a worker refuses a coordinator whose certificate names another host, naming both")
    bt.check("registered" not in other_coord.log_text(),
             "nothing registered at that coordinator")
    for d in (w9, other_coord):
        d.stop()


DCHAN_MAGIC, DCHAN_SAMPLE = 0x31445742, 1  # docs/data-channel.md, "Protocol"


class FakeWorker:
    """Registers as worker `wid` (a data channel only; its gRPC address refuses connections),
    heartbeats, and answers each ReadSamples on the data channel with a SAMPLE frame
    announcing `announce` bytes for the first index asked, then closes. It runs in a process of
    its own (fake_main): threads here would hang the test's forks of batchwire."""

    def __init__(self, coord_addr, wid, announce):
        self.announce = announce
        self.lsock = socket.create_server(("127.0.0.1", 0))
        dead = socket.create_server(("127.0.0.1", 0))  # bound, then closed: refuses
        self.grpc_addr = "127.0.0.1:%d" % dead.getsockname()[1]
        dead.close()
        self.chan = grpc.insecure_channel(coord_addr)
        self.wid, self.inc = wid, int.from_bytes(os.urandom(7), "little")
        call = self.chan.unary_unary("/batchwire.v1.Coordinator/RegisterWorker",
                                     request_serializer=bpb.RegisterWorkerRequest.SerializeToString,
                                     response_deserializer=bpb.RegisterWorkerResponse.FromString)
        r = call(bpb.RegisterWorkerRequest(
            id=wid, address=self.grpc_addr, incarnation=self.inc,
            data_address="127.0.0.1:%d" % self.lsock.getsockname()[1]), timeout=10)
        self.interval = max(r.heartbeat_interval_ms, 50) / 1000.0
        threading.Thread(target=self.beat, daemon=True).start()
        print("registered", flush=True)
        while True:
            c, _ = self.lsock.accept()
            threading.Thread(target=self.answer, args=(c,), daemon=True).start()

    def beat(self):
        call = self.chan.unary_unary("/batchwire.v1.Coordinator/Heartbeat",
                                     request_serializer=bpb.HeartbeatRequest.SerializeToString,
                                     response_deserializer=bpb.HeartbeatResponse.FromString)
        while True:
            time.sleep(self.interval)
            try:
                call(bpb.HeartbeatRequest(id=self.wid, incarnation=self.inc), timeout=5)
            except grpc.RpcError:
                pass

    def answer(self, c):
        c.settimeout(10)
        try:
            while True:
                magic, kind, n = struct.unpack("<IIQ", self.read(c, 16))
                body = self.read(c, n)
                if magic == DCHAN_MAGIC and kind == 4:  # FEATURES ("Versions"): none used
                    c.sendall(struct.pack("<IIQQ", 2, 0, 0, 0))
                    continue
                if magic != DCHAN_MAGIC or kind != 1:
                    continue  # a hello: nothing to answer here
                req = dpb.ReadSamplesRequest.FromString(body)
                print("asked %s" % list(req.indices), flush=True)
                c.sendall(struct.pack("<IIQQ", DCHAN_SAMPLE, 0, req.indices[0], self.announce))
                c.sendall(b"x" * 4096)  # the start of its bytes; the rest never comes
                break
        except (OSError, EOFError):
            pass
        c.close()

    @staticmethod
    def read(c, n):
        buf = b""
        while len(buf) < n:
            chunk = c.recv(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf


def allocation_bound(tmp):
    bt.log("===== a worker announcing more than the largest sample is refused =====")
    text = os.path.join(tmp, "data", "t")
    os.makedirs(text, exist_ok=True)
    sizes = []
    for i, (lines, width) in enumerate(((40, 99), (80, 199), (200, 499), (20, 9))):
        with open(os.path.join(text, "part-%d.txt" % i), "w") as f:
            f.write(("%s\n" % ("l" * width)) * lines)
        sizes.append(lines * (width + 1))
    largest, total = max(sizes), sum(sizes)
    coord = bt.coordinator(tmp, name="coordinator-bound", args=["--heartbeat-ms", 200])
    w1 = bt.worker(tmp, coord.addr, "w1")
    coord.wait_log(r"worker=w1 address=\S+ peer=\S+ registered")

    def read(job, timeout_ms=10000):
        # --log-level info: the failover lines say why each attempt failed.
        return bt.cli("fetch", "--coordinator", coord.addr, "--job", job, "--dataset",
                      "text:t/*.txt", "--rank", 0, "--world-size", 1, "--batch-size", 8,
                      "--epochs", 1, "--timeout-ms", timeout_ms, "--log-level", "info",
                      timeout=120)

    r = read("bound")
    got = sorted(i for b in batches(r) for i in b["indices"])
    bt.check(r.returncode == 0 and got == list(range(340)),
             "the text job reads its 340 lines once from w1", r.stderr[-2000:])
    bt.check(w1.stop() == 0, "w1 stops cleanly")
    coord.wait_log(r"worker=w1 address=\S+ marked dead", timeout=15)
    out = os.path.join(tmp, "fake-worker.out")
    with open(out, "w") as f:
        fake = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--fake-worker",
                                 coord.addr, "fake", str(largest + 1)], stdout=f,
                                stderr=subprocess.STDOUT, env=bt.child_env())
    try:
        coord.wait_log(r"worker=fake address=\S+ peer=\S+ registered")
        r = read("bound", timeout_ms=3000)
    finally:
        fake.kill()
        fake.wait(10)
    asked = open(out).read().count("asked ")
    bt.check(asked > 0, "the trainer asked the fake worker for samples (%d requests)" % asked,
             open(out).read()[-2000:])
    bt.check(r.returncode != 0 and not batches(r) and '"samples_received":0' in r.stdout,
             "nothing taken from the fake worker (exit %d)" % r.returncode, r.stdout[-1000:])
    refused = re.search(r"worker fake data channel \S+: worker sent sample \d+ \(\d+ bytes at 0 "
                        r"of %d\) where sample \d+ at 0 \(at most %d bytes\) was due" %
                        (largest + 1, largest), r.stderr)
    bt.check(refused, "a sample of %d bytes announced (the dataset holds %d) is refused at the "
             "largest source's %d bytes, naming the worker" % (largest + 1, total, largest),
             r.stderr[-3000:])
    bt.check(coord.stop() == 0, "the coordinator stops cleanly")


def test(tmp):
    data = os.path.join(tmp, "data")
    os.makedirs(data, exist_ok=True)
    r = bt.cli("gen", "--format", "npy", "--out", os.path.join(data, "d"), "--num-samples", N,
               "--files", 4, "--shape", "4", "--dtype", "float32")
    bt.check(r.returncode == 0, "batchwire gen wrote the dataset", r.stderr)
    principals = os.path.join(tmp, "principals")
    write_principals(principals)
    mtok = bt.secret_file(tmp, "metrics.token", METRICS_TOKEN)
    digests = plaintext(tmp, principals, mtok)
    tls(tmp, principals, mtok, digests)
    allocation_bound(tmp)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--fake-worker"]:
        FakeWorker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        bt.main(test, timeout=240)
