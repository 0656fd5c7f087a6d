"""Trainers tell a real worker, and metrics keep to who may read them (docs/security.md,
"Worker certificates" and "Metrics"), with authentication on:

* Over TLS, a rogue worker holding a worker token and a certificate the cluster's CA signed,
  but for another host (DNS:other.example, IP:127.0.0.2), registers and is given shards: the
  trainer refuses it on both transports, naming the address it dialled and what the
  certificate names, and receives not one sample from it. With the legitimate worker back,
  the same job reads every sample exactly once an epoch, the same bytes on both transports.
* --metrics-auth: /metrics without the bearer token, or with another, is 401 and shows no job
  name; with it, 200 and the job's series. Over TLS the endpoint is HTTPS with the daemon's
  certificate.
* Without TLS, each daemon with --auth-tokens warns once at start that tokens and grants cross
  the network in clear; with TLS on its listener and its calls, it does not.
"""

import json
import os
import re
import ssl
import urllib.error
import urllib.request

import bwtest as bt

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
    with open(path, "w") as f:
        for name, (role, tok) in TOKENS.items():
            f.write("%s %s %s\n" % (role, name, tok))
    os.chmod(path, 0o600)


def secret_file(tmp, name, text):
    p = os.path.join(tmp, name)
    with open(p, "w") as f:
        f.write(text + "\n")
    os.chmod(p, 0o600)
    return p


def token_file(tmp, name):
    return secret_file(tmp, "token-" + name, TOKENS[name][1])


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
        "--token-file", token_file(tmp, "coord"), "--metrics-listen", "127.0.0.1:0", "--metrics-auth", mtok])

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


def test(tmp):
    data = os.path.join(tmp, "data")
    os.makedirs(data, exist_ok=True)
    r = bt.cli("gen", "--format", "npy", "--out", os.path.join(data, "d"), "--num-samples", N,
               "--files", 4, "--shape", "4", "--dtype", "float32")
    bt.check(r.returncode == 0, "batchwire gen wrote the dataset", r.stderr)
    principals = os.path.join(tmp, "principals")
    write_principals(principals)
    mtok = secret_file(tmp, "metrics.token", METRICS_TOKEN)
    digests = plaintext(tmp, principals, mtok)
    tls(tmp, principals, mtok, digests)


if __name__ == "__main__":
    bt.main(test, timeout=240)
