"""Read grants under hostile callers (docs/security.md, "Read grants"): with authentication on,
a worker whose principals file lists no trainer serves ReadSamples and ReadStream, over gRPC
and over the data channel, only to the holder of a rank's lease with the grant the coordinator
gave it. Refused, PERMISSION_DENIED naming what failed: a read without a grant, a trainer's
token sent to a worker, a worker's token, an expired grant, a grant used for another job's
dataset, a proof made for another worker, changed claims, and the grant of a lease fenced by
another process taking the rank over. The coordinator's proof on Data.Describe, captured by a
rogue worker, is refused at a real worker and never allows a read; the coordinator sends no
token to workers. Meanwhile a legitimate job reads every sample of its dataset, the same bytes
on both transports; a trainer's loader (the client library, which sends grants and no token to
workers) reads every batch exactly as `batchwire plan` says over both transports; and no log
holds a grant's secret or proof.

Requests are made with python3-grpcio, raw sockets and messages compiled from proto/ by
Debian's protoc, independent of the C code under test; proofs are computed here with hmac.
"""

import concurrent.futures
import hashlib
import hmac
import os
import socket
import struct
import time

import grpc

import bwpy
import bwtest as bt
import jobs_rpc as jr

pb, dpb, bpb = jr.pb, jr.dpb, jr.bpb

S = grpc.StatusCode
TOKENS = {  # the coordinator's principals
    "ops": ("admin", "ops-token-0123456789abcdef"),
    "alice": ("trainer", "alice-token-0123456789abcdef"),
    "bob": ("trainer", "bob-token-0123456789abcdef"),
    "w1": ("worker", "w1-token-0123456789abcdef"),
    "rogue": ("worker", "rogue-token-0123456789abcdef"),
}
LEASE_MS = 2000
SKEW_MS = 5000  # BW_GRANT_SKEW_MS
DS_A = dpb.Dataset(format="npy", sources=["a/*.npy"])
DS_B = dpb.Dataset(format="npy", sources=["b/*.npy"])
N = 64
PERMISSION_DENIED = -6  # BW_PERMISSION_DENIED on the data channel


def write_principals(path, names):
    bt.write_principals(path, [(TOKENS[n][0], n, TOKENS[n][1]) for n in names])


def token_file(tmp, name):
    return bt.secret_file(tmp, "token-" + name, TOKENS[name][1])


def proof(secret, worker_id):
    """The per-worker proof a lease holder sends (core/auth/grant.h)."""
    return hmac.new(secret, b"bw-read-v1\0" + worker_id.encode(), hashlib.sha256).digest()


def grant(resp, worker_id="w1"):
    return dpb.ReadGrant(claims=resp.grant_claims, proof=proof(resp.grant_secret, worker_id))


class Raw:
    """gRPC calls by path, with optional metadata (no credentials by default)."""

    def __init__(self, addr, md=()):
        self.ch = grpc.insecure_channel(addr)
        self.md = list(md)

    def read(self, req):
        path = "/batchwire.v1.Data/" + ("ReadStream" if isinstance(req, dpb.ReadStreamRequest)
                                        else "ReadSamples")
        stub = self.ch.unary_stream(path, request_serializer=lambda m: m.SerializeToString(),
                                    response_deserializer=dpb.SampleBatch.FromString)
        try:
            return S.OK, [s for b in stub(req, timeout=10, metadata=self.md) for s in b.samples]
        except grpc.RpcError as e:
            return e.code(), e.details() or ""

    def describe(self, ds):
        stub = self.ch.unary_unary("/batchwire.v1.Data/Describe",
                                   request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=dpb.DescribeResponse.FromString)
        try:
            return S.OK, stub(dpb.DescribeRequest(dataset=ds), timeout=10, metadata=self.md)
        except grpc.RpcError as e:
            return e.code(), e.details() or ""

    def close(self):
        self.ch.close()


def dchan_read(daddr, req, hello=None):
    """One request on a fresh data-channel connection: ("ok", [sample bytes]) or
    ("error", code, message)."""
    host, port = daddr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)

    def recv(n):
        out = b""
        while len(out) < n:
            chunk = s.recv(n - len(out))
            if not chunk:
                raise bt.TestFailure("data channel closed after %d of %d bytes" % (len(out), n))
            out += chunk
        return out
    try:
        if hello is not None:
            s.sendall(struct.pack("<IIQ", 0x31445742, 3, len(hello)) + hello)
            typ, code, a, _ = struct.unpack("<IiQQ", recv(24))
            if typ == 3:
                return ("error", code, recv(a).decode(errors="replace"))
        body = req.SerializeToString()
        kind = 2 if isinstance(req, dpb.ReadStreamRequest) else 1
        s.sendall(struct.pack("<IIQ", 0x31445742, kind, len(body)) + body)
        samples = []
        while True:
            typ, code, a, b = struct.unpack("<IiQQ", recv(24))
            if typ == 1:
                samples.append(recv(b))
            elif typ == 2:
                return ("ok", samples)
            else:
                return ("error", code, recv(a).decode(errors="replace"))
    finally:
        s.close()


def refused_both(w, daddr, req, needle, what):
    """req is refused over gRPC (PERMISSION_DENIED) and the data channel, naming `needle`."""
    code, details = Raw(w.addr).read(req)
    bt.check(code == S.PERMISSION_DENIED and needle in details,
             "gRPC: %s -> PERMISSION_DENIED naming %r" % (what, needle), "%s: %s" % (code, details))
    got = dchan_read(daddr, req)
    bt.check(got[0] == "error" and got[1] == PERMISSION_DENIED and needle in got[2],
             "data channel: %s -> PERMISSION_DENIED naming %r" % (what, needle), got)


def rogue_capture(tmp, coord):
    """A rogue worker (a worker principal's token, its own listener) registers and is asked to
    describe a dataset: returns the metadata the coordinator sent it."""
    seen = []

    class Handler(grpc.GenericRpcHandler):
        def service(self, details):
            def describe(req, ctx):
                seen.append(dict(ctx.invocation_metadata()))
                ctx.abort(S.UNAVAILABLE, "rogue")
            if details.method == "/batchwire.v1.Data/Describe":
                return grpc.unary_unary_rpc_method_handler(describe)
            return None
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((Handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    reg = grpc.insecure_channel(coord.addr).unary_unary(
        "/batchwire.v1.Coordinator/RegisterWorker",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=bpb.RegisterWorkerResponse.FromString)
    beat = grpc.insecure_channel(coord.addr).unary_unary(
        "/batchwire.v1.Coordinator/Heartbeat", request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=bpb.HeartbeatResponse.FromString)
    md = [("authorization", "Bearer " + TOKENS["rogue"][1])]
    reg(bpb.RegisterWorkerRequest(id="rogue", address="127.0.0.1:%d" % port, incarnation=1),
        timeout=10, metadata=md)
    alice = jr.Jobs(coord.addr, token=TOKENS["alice"][1])
    e = None
    for _ in range(5):  # the rogue is the only live worker (it heartbeats while it is asked)
        beat(bpb.HeartbeatRequest(id="rogue", incarnation=1), timeout=10, metadata=md)
        e = alice.expect_error("GetOrCreateJob", pb.GetOrCreateJobRequest(
            name="probe", world_size=1, config=pb.JobConfig(
                dataset=DS_A, sampler=pb.SamplerConfig(mode=jr.TORCH, batch_size=8))))
        if seen:
            break
        time.sleep(0.2)
    alice.close()
    server.stop(0)
    bt.check(seen, "the coordinator asked the rogue worker to describe (%s)" % e.details[:80])
    md = seen[0]
    bt.check("authorization" not in md and "x-batchwire-coordinator" in md,
             "the coordinator sent the rogue no token, only its proof", sorted(md))
    return md["x-batchwire-coordinator"]


def legitimate_loaders(tmp, coord, arr, w):
    """A trainer's loader (the client library: grants, no token to workers) against the worker
    whose principals file lists no trainer, on both transports: every batch exactly as
    `batchwire plan` says."""
    bt.log("===== legitimate jobs: the loader, both transports =====")
    batchwire = bwpy.import_batchwire()
    before = len(open(w.log_path).read())
    want = bwpy.plan("--mode", "torch", "--num-samples", len(arr), "--world-size", 1,
                     "--batch-size", 8, "--epoch", 0)[0]
    for transport in ("auto", "grpc"):
        got = []
        with batchwire.Loader(coordinator=coord.addr, job="legit-" + transport,
                              dataset=bwpy.NPY, batch_size=8, rank=0, world_size=1,
                              job_epochs=1, transport=transport,
                              token_file=token_file(tmp, "alice")) as loader:
            for b in loader:
                got.append((b.indices.tolist(), b.numpy().copy()))
        bt.check(len(got) == len(want) and all(
            g == x["indices"] and y.tobytes() == arr[g].tobytes()
            for (g, y), x in zip(got, want)),
            "transport %s: alice's loader read all %d batches exactly as planned from w1, "
            "whose principals file has no trainer" % (transport, len(want)),
            "%d batches, %d planned" % (len(got), len(want)))
    # A trainer that commits every step, more often than the heartbeat interval, for longer
    # than a grant lasts (LEASE_MS + the 5 s skew): its commits renew the lease, not the grant,
    # so the library must still heartbeat for a fresh grant or its later reads are refused.
    got, t0 = [], time.monotonic()
    with batchwire.Loader(coordinator=coord.addr, job="legit-commits", dataset=bwpy.NPY,
                          batch_size=2, rank=0, world_size=1, job_epochs=1, prefetch=1,
                          token_file=token_file(tmp, "alice")) as loader:
        for b in loader:
            got.append(b.indices.tolist())
            loader.commit()
            time.sleep(0.2)
    took = time.monotonic() - t0
    bt.check(len(got) == len(arr) // 2 and took > (LEASE_MS + 5000) / 1000.0,
             "a loader committing every 0.2 s (the lease's heartbeat interval is %d ms) read "
             "all %d batches over %.1f s, longer than a grant lasts" % (LEASE_MS // 3, len(got),
                                                                         took), len(got))
    new = open(w.log_path).read()[before:]
    bt.check("refused" not in new, "and the worker refused nothing meanwhile (no token was sent "
             "to it: one would be UNAUTHENTICATED there; no grant ran out)", new[-600:])


def test(tmp):
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    arr = bwpy.gen_npy(data, "ds", 96, (3, 5))
    for d in ("a", "b"):
        r = bt.cli("gen", "--format", "npy", "--out", os.path.join(data, d),
                   "--num-samples", str(N), "--shape", "4", "--dtype", "float32")
        bt.check(r.returncode == 0, "batchwire gen wrote dataset %s" % d, r.stderr)
    coord_tokens = os.path.join(tmp, "coord-principals")
    write_principals(coord_tokens, TOKENS)
    coord = bt.coordinator(tmp, args=["--auth-tokens", coord_tokens, "--lease-ms", str(LEASE_MS),
                                      "--heartbeat-ms", "300"])

    bt.log("===== the coordinator's proof, captured by a rogue worker =====")
    captured = rogue_capture(tmp, coord)

    # The worker's principals: no trainer (trainers prove themselves with grants).
    worker_tokens = os.path.join(tmp, "worker-principals")
    write_principals(worker_tokens, ["ops", "w1"])
    w = bt.worker(tmp, coord.addr, "w1", args=["--auth-tokens", worker_tokens, "--token-file",
                                               token_file(tmp, "w1")])
    daddr = w.first_line.split("data-channel=", 1)[1].split()[0]
    ops = ("--token-file", token_file(tmp, "ops"))
    bt.poll(lambda: {x["id"]: x["state"] for x in bt.status_json(coord.addr, ops)["workers"]}
            == {"w1": "alive", "rogue": "dead"}, 15, what="w1 alive and the rogue dead")
    code, details = Raw(w.addr, [("x-batchwire-coordinator", captured)]).describe(DS_A)
    bt.check(code == S.PERMISSION_DENIED and "worker 'w1'" in details,
             "the proof captured at the rogue is refused at w1 (Describe)", "%s: %s" %
             (code, details))
    code, details = Raw(w.addr, [("x-batchwire-coordinator", captured)]).read(
        dpb.ReadSamplesRequest(dataset=DS_A, indices=[0]))
    bt.check(code == S.PERMISSION_DENIED, "and allows no read", "%s: %s" % (code, details))

    # A proof made here with the shared key, as the coordinator makes one for w1: Describe
    # and nothing else; expired, refused.
    kid, khex = open(bt.grant_key(tmp)).read().split()

    def coord_proof(wid, expires_ms):
        mac = hmac.new(bytes.fromhex(khex), b"bw-coord-v1\0" + wid.encode() + b"\0" +
                       str(expires_ms).encode(), hashlib.sha256).hexdigest()
        return "%s.%d.%s" % (kid, expires_ms, mac)
    good = [("x-batchwire-coordinator", coord_proof("w1", int(time.time() * 1000) + 30000))]
    code, details = Raw(w.addr, good).describe(DS_A)
    bt.check(code == S.OK, "a coordinator proof for w1 describes at w1 (role coordinator)",
             "%s: %s" % (code, details))
    code, details = Raw(w.addr, good).read(dpb.ReadSamplesRequest(dataset=DS_A, indices=[0]))
    bt.check(code == S.PERMISSION_DENIED and "only Data.Describe" in details,
             "but may not read", "%s: %s" % (code, details))
    old = [("x-batchwire-coordinator", coord_proof("w1", int(time.time() * 1000) - 10000))]
    code, details = Raw(w.addr, old).describe(DS_A)
    bt.check(code == S.PERMISSION_DENIED and "expired" in details,
             "an expired coordinator proof is refused", "%s: %s" % (code, details))

    bt.log("===== jobs created through w1 (the coordinator's proof, no token) =====")
    alice = jr.Jobs(coord.addr, token=TOKENS["alice"][1])
    bob = jr.Jobs(coord.addr, token=TOKENS["bob"][1])
    for c, name, ds in ((alice, "job-a", DS_A), (bob, "job-b", DS_B)):
        c.call("GetOrCreateJob", pb.GetOrCreateJobRequest(
            name=name, world_size=1, config=pb.JobConfig(
                dataset=ds, sampler=pb.SamplerConfig(mode=jr.TORCH, batch_size=8))))
    bt.ok("job-a and job-b created: w1 described their datasets for the coordinator")
    ja = alice.join("job-a", 0, 1, host="node-a", pid=100)
    bt.check(len(ja.grant_secret) == 32 and ja.grant_claims,
             "JoinJob hands the lease holder a grant (claims and a 32-byte secret)")
    time.sleep(0.01)  # a later expiry (claims minted in the same millisecond are the same)
    hb = alice.heartbeat("job-a", 0, ja)
    c0, c1 = (dpb.GrantClaims.FromString(x.grant_claims) for x in (ja, hb))
    bt.check(c1.expires_ms > c0.expires_ms and c1.lease_tag == c0.lease_tag and
             (c1.job, c1.rank) == ("job-a", 0) and len(c1.dataset) == 32,
             "each lease heartbeat renews it (same job, rank and lease tag, a later expiry)",
             (c0, c1))
    all_a = dpb.ReadSamplesRequest(dataset=DS_A, indices=list(range(N)), grant=grant(ja))

    bt.log("===== the lease holder reads; an admin reads without a grant =====")
    code, samples = Raw(w.addr).read(all_a)
    bt.check(code == S.OK and [s.index for s in samples] == list(range(N)),
             "gRPC: job-a's grant reads all %d samples of its dataset, no credentials" % N,
             samples if code != S.OK else len(samples))
    grpc_bytes = [s.data for s in samples]
    got = dchan_read(daddr, all_a)
    bt.check(got[0] == "ok" and got[1] == grpc_bytes,
             "data channel: the same %d samples, the same bytes, without a hello" % N, got[:3])
    stream = dpb.ReadStreamRequest(dataset=DS_A, grant=grant(ja))
    code, details = Raw(w.addr).read(stream)
    bt.check(code != S.PERMISSION_DENIED, "ReadStream with a grant passes the grant check "
             "(whatever the format says)", "%s: %s" % (code, details))
    code, samples = Raw(w.addr, [("authorization", "Bearer " + TOKENS["ops"][1])]).read(
        dpb.ReadSamplesRequest(dataset=DS_B, indices=[0, 1]))
    bt.check(code == S.OK and len(samples) == 2, "an admin token reads without a grant",
             samples)

    bt.log("===== refused =====")
    refused_both(w, daddr, dpb.ReadSamplesRequest(dataset=DS_A, indices=[0]), "no read grant",
                 "a read without a grant")
    code, details = Raw(w.addr, [("authorization", "Bearer " + TOKENS["alice"][1])]).read(all_a)
    bt.check(code == S.UNAUTHENTICATED, "a trainer's token means nothing to the worker "
             "(its file lists no trainer)", "%s: %s" % (code, details))
    code, details = Raw(w.addr, [("authorization", "Bearer " + TOKENS["w1"][1])]).read(all_a)
    bt.check(code == S.PERMISSION_DENIED and "worker" in details,
             "a worker's token may not read, grant or not", "%s: %s" % (code, details))
    got = dchan_read(daddr, all_a, hello=TOKENS["w1"][1].encode())
    bt.check(got[0] == "error" and got[1] == PERMISSION_DENIED,
             "nor over the data channel", got)
    refused_both(w, daddr, dpb.ReadSamplesRequest(dataset=DS_B, indices=[0], grant=grant(ja)),
                 "dataset", "job-a's grant used for job-b's dataset")
    refused_both(w, daddr, dpb.ReadSamplesRequest(dataset=DS_A, indices=[0],
                                                  grant=grant(ja, "w2")),
                 "worker 'w1'", "a proof made for worker w2")
    claims = dpb.GrantClaims.FromString(ja.grant_claims)
    claims.rank = 1
    forged = dpb.ReadGrant(claims=claims.SerializeToString(), proof=grant(ja).proof)
    refused_both(w, daddr, dpb.ReadSamplesRequest(dataset=DS_A, indices=[0], grant=forged),
                 "does not verify", "claims changed (another rank)")

    bt.log("----- a fenced lease -----")
    jb = alice.call("JoinJob", pb.JoinJobRequest(job="job-a", rank=0, world_size=1,
                                                 holder=pb.Holder(host="node-a", pid=101),
                                                 reclaim_pid=100))
    t0 = time.monotonic()
    bt.poll(lambda: Raw(w.addr).read(all_a)[0] == S.PERMISSION_DENIED, 5,
            what="the worker refusing the fenced lease's grant")
    bt.ok("the fenced lease's grant is refused %.1f s after another process took the rank" %
          (time.monotonic() - t0))
    refused_both(w, daddr, all_a, "fenced", "the fenced lease's grant")
    new = dpb.ReadSamplesRequest(dataset=DS_A, indices=list(range(N)), grant=grant(jb))
    code, samples = Raw(w.addr).read(new)
    bt.check(code == S.OK and [s.data for s in samples] == grpc_bytes,
             "the new holder's grant reads the same %d samples" % N)

    bt.log("----- an expired grant -----")
    kb = bob.join("job-b", 0, 1, host="node-b", pid=200)
    old = dpb.ReadSamplesRequest(dataset=DS_B, indices=[0], grant=grant(kb))
    code, _ = Raw(w.addr).read(old)
    bt.check(code == S.OK, "bob's grant reads job-b's dataset")
    time.sleep((LEASE_MS + SKEW_MS) / 1000 + 0.5)
    refused_both(w, daddr, old, "expired", "a grant past its expiry (and the skew)")

    legitimate_loaders(tmp, coord, arr, w)

    bt.log("===== afterwards =====")
    code, samples = Raw(w.addr).read(dpb.ReadSamplesRequest(
        dataset=DS_A, indices=list(range(N)), grant=grant(alice.heartbeat("job-a", 0, jb))))
    bt.check(code == S.OK and len(samples) == N, "the legitimate holder still reads everything")
    secrets = [x.hex() for x in (ja.grant_secret, jb.grant_secret, kb.grant_secret,
                                 grant(ja).proof, grant(jb).proof)]
    for d in (coord, w):
        text = open(d.log_path).read()
        bt.check(not any(s in text for s in secrets) and TOKENS["alice"][1] not in text,
                 "%s's log holds no grant secret, proof or trainer token" % d.name)
    for c in (alice, bob):
        c.close()
    for d in (w, coord):
        bt.check(d.stop() == 0, "%s stops cleanly" % d.name)


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=240)
