"""A hostile client against a coordinator and a worker started with --auth-tokens
(docs/security.md): every RPC with no token, a wrong token and the wrong role; another
principal's job and lease; another worker's id; oversize and malformed fields; the data
channel's hello; quotas, deletion and the cursor that outlives its job; token rotation on
SIGHUP; tokens over TLS and a client certificate mapped to a principal. Afterwards the daemons
still serve and the victim's cursor is untouched.

Messages come from proto/ compiled with Debian's protoc; calls go through python3-grpcio by
method path, so the client is independent of the C code under test.
"""

import os
import signal
import socket
import struct
import time

import grpc

import bwpy
import bwtest as bt
import jobs_rpc as jr

pb, dpb, bpb, hpb = jr.pb, jr.dpb, jr.bpb, jr.hpb

S = grpc.StatusCode
TOKENS = {
    "ops": ("admin", "ops-token-0123456789abcdef"),
    "alice": ("trainer", "alice-token-0123456789abcdef"),
    "bob": ("trainer", "bob-token-0123456789abcdef"),
    "carol": ("trainer", "carol-token-0123456789abcdef"),
    "storage": ("worker", "storage-token-0123456789abcdef", "ids=w1"),
    "intruder": ("worker", "intruder-token-0123456789abcdef"),
    "coord": ("worker", "coord-token-0123456789abcdef"),
}

# Every RPC: path -> (request class, response class, whom it goes to).
METHODS = {
    "/grpc.health.v1.Health/Check": (hpb.HealthCheckRequest, hpb.HealthCheckResponse, "both"),
    "/batchwire.v1.Coordinator/Info": (bpb.InfoRequest, bpb.InfoResponse, "coord"),
    "/batchwire.v1.Coordinator/RegisterWorker": (bpb.RegisterWorkerRequest,
                                                 bpb.RegisterWorkerResponse, "coord"),
    "/batchwire.v1.Coordinator/Heartbeat": (bpb.HeartbeatRequest, bpb.HeartbeatResponse, "coord"),
    "/batchwire.v1.Coordinator/ListWorkers": (bpb.ListWorkersRequest, bpb.ListWorkersResponse,
                                              "coord"),
    "/batchwire.v1.Placement/Get": (dpb.PlacementRequest, dpb.PlacementTable, "coord"),
    "/batchwire.v1.Jobs/GetOrCreateJob": (pb.GetOrCreateJobRequest, pb.GetOrCreateJobResponse,
                                          "coord"),
    "/batchwire.v1.Jobs/JoinJob": (pb.JoinJobRequest, pb.JoinJobResponse, "coord"),
    "/batchwire.v1.Jobs/LeaseHeartbeat": (pb.LeaseHeartbeatRequest, pb.LeaseHeartbeatResponse,
                                          "coord"),
    "/batchwire.v1.Jobs/CommitCursor": (pb.CommitCursorRequest, pb.CommitCursorResponse, "coord"),
    "/batchwire.v1.Jobs/GetJob": (pb.GetJobRequest, pb.GetJobResponse, "coord"),
    "/batchwire.v1.Jobs/ListJobs": (pb.ListJobsRequest, pb.ListJobsResponse, "coord"),
    "/batchwire.v1.Jobs/ResumeElastic": (pb.ResumeElasticRequest, pb.ResumeElasticResponse,
                                         "coord"),
    "/batchwire.v1.Jobs/LeaveJob": (pb.LeaveJobRequest, pb.LeaveJobResponse, "coord"),
    "/batchwire.v1.Jobs/DeleteJob": (pb.DeleteJobRequest, pb.DeleteJobResponse, "coord"),
    "/batchwire.v1.Worker/Info": (bpb.InfoRequest, bpb.InfoResponse, "worker"),
    "/batchwire.v1.Data/Describe": (dpb.DescribeRequest, dpb.DescribeResponse, "worker"),
    "/batchwire.v1.Data/ReadSamples": (dpb.ReadSamplesRequest, dpb.SampleBatch, "worker"),
    "/batchwire.v1.Data/ReadStream": (dpb.ReadStreamRequest, dpb.SampleBatch, "worker"),
    "/batchwire.v1.Data/Stats": (dpb.StatsRequest, dpb.StatsResponse, "worker"),
}
STREAMING = {"/batchwire.v1.Data/ReadSamples", "/batchwire.v1.Data/ReadStream"}
# What each role may call (docs/security.md, "Principals and roles").
ALLOWED = {
    "worker": {"Health/Check", "Coordinator/Info", "Coordinator/RegisterWorker",
               "Coordinator/Heartbeat", "Placement/Get", "Worker/Info"},
    # Data/Describe: the coordinator (its grant-key proof) and admins only (docs/security.md)
    "trainer": {"Health/Check", "Coordinator/Info", "Coordinator/ListWorkers", "Placement/Get",
                "Worker/Info", "Data/ReadSamples", "Data/ReadStream",
                "Data/Stats"} | {"Jobs/" + m for m in (
                    "GetOrCreateJob", "JoinJob", "LeaseHeartbeat", "CommitCursor", "GetJob",
                    "ListJobs", "ResumeElastic", "LeaveJob", "DeleteJob")},
}
DATASET = dpb.Dataset(format="npy", sources=["d/*.npy"])


def short(path):
    return path.split(".v1.", 1)[-1] if ".v1." in path else path.split("/", 1)[1].replace(
        "grpc.health.v1.", "")


class Client:
    """Raw calls by path with an optional bearer token (or raw request bytes)."""

    def __init__(self, addr, token=None, creds=None):
        self.ch = (grpc.secure_channel(addr, creds, options=[
            ("grpc.ssl_target_name_override", "localhost")]) if creds
            else grpc.insecure_channel(addr))
        self.md = [("authorization", "Bearer " + token)] if token else []

    def close(self):
        self.ch.close()

    def call(self, path, req, raw=False, timeout=10):
        reqc, respc, _ = METHODS[path]
        ser = (lambda b: b) if raw else (lambda m: m.SerializeToString())
        if path in STREAMING:
            stub = self.ch.unary_stream(path, request_serializer=ser,
                                        response_deserializer=respc.FromString)
            return list(stub(req, timeout=timeout, metadata=self.md))
        stub = self.ch.unary_unary(path, request_serializer=ser,
                                   response_deserializer=respc.FromString)
        return stub(req, timeout=timeout, metadata=self.md)

    def code(self, path, req, raw=False):
        """(status code, details) of a call; (OK, "") when it succeeded."""
        try:
            self.call(path, req, raw=raw)
            return S.OK, ""
        except grpc.RpcError as e:
            return e.code(), e.details() or ""

    def expect(self, path, req, code, what, needle=None, raw=False):
        got, details = self.code(path, req, raw=raw)
        bt.check(got == code and (needle is None or needle in details),
                 "%s: %s -> %s" % (short(path), what, code.name),
                 "got %s: %s" % (got.name, details))
        return details


def sample_request(path):
    """A well-formed request for each method (its content matters little: refusals come
    before handlers)."""
    reqc = METHODS[path][0]
    if path.endswith("RegisterWorker"):
        return reqc(id="w-hostile", address="127.0.0.1:1", incarnation=1)
    if path.endswith("Heartbeat") and "Coordinator" in path:
        return reqc(id="w1", incarnation=1)
    if path.endswith("/GetOrCreateJob"):
        return reqc(name="hostile-job", world_size=1, config=pb.JobConfig(
            synthetic_samples=10, sampler=pb.SamplerConfig(mode=jr.TORCH, batch_size=2)))
    if path.endswith("/JoinJob"):
        return reqc(job="victim", rank=0, world_size=2, holder=pb.Holder(host="x", pid=1))
    if path.endswith(("/LeaseHeartbeat", "/CommitCursor", "/LeaveJob")):
        return reqc(job="victim", rank=0, lease_id=1)
    if path.endswith(("/GetJob",)):
        return reqc(name="victim")
    if path.endswith(("/DeleteJob",)):
        return reqc(job="victim")
    if path.endswith("/ResumeElastic"):
        return reqc(job="victim", world_size=1, cursors=[b"x"])
    if path.endswith("/Describe"):
        return reqc(dataset=DATASET)
    if path.endswith("/ReadSamples"):
        return reqc(dataset=DATASET, indices=[0])
    if path.endswith("/ReadStream"):
        return reqc(dataset=dpb.Dataset(format="jsonl", sources=["d/none.jsonl"]))
    return reqc()


def write_tokens(path, tokens):
    with open(path, "w") as f:
        for name, (role, tok, *ids) in tokens.items():  # ids: a worker's ids= binding
            f.write(" ".join([role, name, tok] + ids) + "\n")
        f.write("trainer batchwire-cli -\n")  # the test PKI's client certificate
    os.chmod(path, 0o600)


def token_file(tmp, name, token=None):
    p = os.path.join(tmp, "token-" + name)
    with open(p, "w") as f:
        f.write((token or TOKENS[name][1]) + "\n")
    return p


def roles_and_tokens(coord, worker):
    bt.log("===== every RPC: no token, a wrong token, each role =====")
    addrs = {"coord": coord.addr, "worker": worker.addr}
    for path, (_, _, where) in METHODS.items():
        for target in (("coord", "worker") if where == "both" else (where,)):
            req = sample_request(path)
            c = Client(addrs[target])
            code, details = c.code(path, req)
            if path.endswith("Health/Check"):
                bt.check(code == S.OK, "%s at the %s answers without credentials" %
                         (short(path), target), details)
            elif path in STREAMING:
                # a read without credentials needs a read grant (test_hostile_grants.py)
                bt.check(code == S.PERMISSION_DENIED and "no read grant" in details,
                         "%s at the worker without a token or grant -> PERMISSION_DENIED" %
                         short(path), "%s: %s" % (code.name, details))
            else:
                bt.check(code == S.UNAUTHENTICATED and short(path).split("/")[1] in details,
                         "%s at the %s without a token -> UNAUTHENTICATED naming the method" %
                         (short(path), target), "%s: %s" % (code.name, details))
            c.close()
            c = Client(addrs[target], "not-a-valid-token-0123456789")
            code, details = c.code(path, req)
            if not path.endswith("Health/Check"):
                bt.check(code == S.UNAUTHENTICATED and "not-a-valid" not in details,
                         "%s with a wrong token -> UNAUTHENTICATED (the token is not echoed)" %
                         short(path), "%s: %s" % (code.name, details))
            c.close()
            for who in ("storage", "alice"):
                role = TOKENS[who][0]
                c = Client(addrs[target], TOKENS[who][1])
                code, details = c.code(path, req)
                c.close()
                allowed = short(path) in ALLOWED[role]
                if allowed and path in STREAMING:
                    # a trainer reads only with its lease's grant (test_hostile_grants.py)
                    bt.check(code == S.PERMISSION_DENIED and "no read grant" in details,
                             "%s as a %s without a read grant -> PERMISSION_DENIED" %
                             (short(path), role), "%s: %s" % (code.name, details))
                elif allowed:
                    bt.check(code not in (S.UNAUTHENTICATED, S.PERMISSION_DENIED) or
                             "belongs to another" in details or "registered by another" in
                             details or "not an id" in details or "may not register worker id"
                             in details,
                             "%s as a %s is not refused by role (%s)" % (short(path), role,
                                                                          code.name), details)
                else:
                    bt.check(code == S.PERMISSION_DENIED and role in details,
                             "%s as a %s -> PERMISSION_DENIED" % (short(path), role),
                             "%s: %s" % (code.name, details))
    admin = Client(coord.addr, TOKENS["ops"][1])
    code, _ = admin.code("/batchwire.v1.Jobs/ListJobs", pb.ListJobsRequest())
    bt.check(code == S.OK, "an admin may list jobs")
    admin.close()
    # Logged with the peer, at most a line a second (a hostile client cannot flood the log):
    # the next line says how many were left out.
    time.sleep(1.1)
    Client(coord.addr).code("/batchwire.v1.Jobs/ListJobs", pb.ListJobsRequest())
    lines = [line for line in open(coord.log_path)
             if "request refused" in line and "peer=ipv4:127.0.0.1" in line]
    left_out = [int(x.split("not_logged_before=")[1].split()[0]) for x in lines]
    bt.check(1 <= len(lines) <= 4 and max(left_out) >= 20,
             "refusals are logged with the peer, at most once a second: %d lines for %d refusals"
             % (len(lines), len(lines) + sum(left_out)), lines[-1:])


def jobs_and_leases(coord):
    bt.log("===== another principal's job and lease =====")
    alice = jr.Jobs(coord.addr, token=TOKENS["alice"][1])
    fp = alice.create("victim", samples=1000, batch=10, world=2).job.fingerprint
    lease = alice.join("victim", 0, 2, host="alice-node", pid=4242)
    bt.check(lease.lease_id_hi != 0 or lease.lease_id != 0, "alice holds rank 0 (128-bit lease)")
    alice.commit("victim", 0, lease, jr.cursor(fp, "victim", 0, 2, 0, 7))
    lo_hi = struct.pack("<QQ", lease.lease_id, lease.lease_id_hi)

    bob = Client(coord.addr, TOKENS["bob"][1])
    fields = jr.lease_fields(lease)
    for path, req in (
            ("/batchwire.v1.Jobs/GetJob", pb.GetJobRequest(name="victim")),
            ("/batchwire.v1.Jobs/JoinJob", pb.JoinJobRequest(
                job="victim", rank=0, world_size=2, holder=pb.Holder(host="alice-node",
                                                                     pid=4242))),
            ("/batchwire.v1.Jobs/CommitCursor", pb.CommitCursorRequest(
                job="victim", rank=0, cursor=jr.cursor(fp, "victim", 0, 2, 0, 9), **fields)),
            ("/batchwire.v1.Jobs/LeaseHeartbeat", pb.LeaseHeartbeatRequest(
                job="victim", rank=0, **fields)),
            ("/batchwire.v1.Jobs/LeaveJob", pb.LeaveJobRequest(job="victim", rank=0, **fields)),
            ("/batchwire.v1.Jobs/DeleteJob", pb.DeleteJobRequest(job="victim")),
            ("/batchwire.v1.Jobs/GetOrCreateJob", pb.GetOrCreateJobRequest(
                name="victim", world_size=2, config=pb.JobConfig(
                    synthetic_samples=1000, sampler=pb.SamplerConfig(
                        mode=jr.TORCH, batch_size=10, shuffle=True, seed=7)))),
            ("/batchwire.v1.Jobs/ResumeElastic", pb.ResumeElasticRequest(
                job="victim", world_size=1, cursors=[jr.cursor(fp, "victim", r, 2, 0, 7)
                                                     for r in range(2)]))):
        details = bob.expect(path, req, S.PERMISSION_DENIED,
                             "bob on alice's job (even with her real lease)")
        bt.check("alice" not in details and str(lease.lease_id) not in details,
                 "the refusal names neither the owner nor the lease", details)
    listed = bob.call("/batchwire.v1.Jobs/ListJobs", pb.ListJobsRequest())
    bt.check("victim" not in [j.name for j in listed.jobs], "bob's ListJobs does not show it")

    bt.log("----- no answer holds a lease id but the caller's own -----")
    g = alice.call("GetJob", pb.GetJobRequest(name="victim"))
    raw = g.SerializeToString()
    bt.check(lo_hi[:8] not in raw and lo_hi[8:] not in raw,
             "GetJob (by the owner) holds no lease id")
    raw = alice.call("ListJobs", pb.ListJobsRequest()).SerializeToString()
    bt.check(lo_hi[:8] not in raw and lo_hi[8:] not in raw, "ListJobs holds no lease id")
    e = alice.expect_error("JoinJob", pb.JoinJobRequest(job="victim", rank=0, world_size=2,
                                                       holder=pb.Holder(host="other", pid=1)))
    bt.check(str(lease.lease_id) not in e.details and "%x" % lease.lease_id not in e.details,
             "a refused join names the holder but not its lease", e.details)
    again = alice.join("victim", 0, 2, host="alice-node", pid=4242)
    bt.check(jr.lease(again) != jr.lease(lease),
             "the holder joining again gets a new lease, not the live one")
    e = alice.expect_error("CommitCursor", pb.CommitCursorRequest(
        job="victim", rank=0, cursor=jr.cursor(fp, "victim", 0, 2, 0, 8), **fields))
    bt.check(e.bw == "BW_LEASE_LOST", "and the old lease is fenced (LEASE_LOST)", e.details)
    log = open(coord.log_path).read()
    bt.check(str(again.lease_id) not in log and "%016x" % again.lease_id not in log,
             "the coordinator's log holds no lease id")
    bob.close()
    return alice, fp, again


def worker_ids(coord, worker):
    bt.log("===== another worker's id =====")
    intruder = Client(coord.addr, TOKENS["intruder"][1])
    intruder.expect("/batchwire.v1.Coordinator/RegisterWorker", bpb.RegisterWorkerRequest(
        id="w1", address="127.0.0.1:9", incarnation=99), S.PERMISSION_DENIED,
        "registering the live w1 as another worker principal", "registered by another")
    intruder.expect("/batchwire.v1.Coordinator/Heartbeat", bpb.HeartbeatRequest(
        id="w1", incarnation=99), S.PERMISSION_DENIED, "heartbeating w1 as another principal")
    intruder.close()
    ws = Client(coord.addr, TOKENS["ops"][1]).call("/batchwire.v1.Coordinator/ListWorkers",
                                                   bpb.ListWorkersRequest())
    w = [x for x in ws.workers if x.id == "w1"]
    bt.check(w and w[0].address == worker.addr and w[0].state == bpb.WORKER_STATE_ALIVE,
             "w1 keeps its address and stays alive", ws)


def malformed(coord, worker, fp, alice_lease):
    bt.log("===== oversize and malformed fields =====")
    c = Client(coord.addr, TOKENS["alice"][1])
    join = "/batchwire.v1.Jobs/JoinJob"
    # JoinJobRequest: 1 job (string), 2 rank, 3 world_size, 4 holder
    def field(num, data):
        return bytes([num << 3 | 2]) + _varint(len(data)) + data
    holder = field(4, field(1, b"h") + bytes([0x10, 1]))
    c.expect(join, field(1, b"vic\x00tim") + bytes([0x10, 0, 0x18, 2]) + holder,
             S.INVALID_ARGUMENT, "a job name with a NUL byte", "NUL", raw=True)
    c.expect(join, field(1, b"\xff\xfe") + bytes([0x10, 0, 0x18, 2]) + holder,
             S.INVALID_ARGUMENT, "a job name that is not UTF-8", "UTF-8", raw=True)
    c.expect(join, field(1, b"x" * 5000) + bytes([0x10, 0, 0x18, 2]) + holder,
             S.RESOURCE_EXHAUSTED, "a 5000-byte job name", "JoinJobRequest.job", raw=True)
    c.expect(join, pb.JoinJobRequest(job="x" * 256, rank=0, world_size=2,
                                     holder=pb.Holder(host="h", pid=1)),
             S.INVALID_ARGUMENT, "a 256-byte job name", "255")
    c.expect(join, pb.JoinJobRequest(job="a\tb", rank=0, world_size=2,
                                     holder=pb.Holder(host="h", pid=1)),
             S.INVALID_ARGUMENT, "a job name with a control character", "control character")
    c.expect("/batchwire.v1.Jobs/GetOrCreateJob", pb.GetOrCreateJobRequest(
        name="paths", world_size=1, config=pb.JobConfig(
            dataset=dpb.Dataset(format="npy", sources=["../etc/passwd"]),
            sampler=pb.SamplerConfig(mode=jr.TORCH, batch_size=2))),
        S.PERMISSION_DENIED, "a dataset path leaving --data-root", "data root")
    c.expect("/batchwire.v1.Jobs/GetOrCreateJob", pb.GetOrCreateJobRequest(
        name="paths", world_size=1, config=pb.JobConfig(
            dataset=dpb.Dataset(format="npy", sources=["d/\x01.npy"]),
            sampler=pb.SamplerConfig(mode=jr.TORCH, batch_size=2))),
        S.INVALID_ARGUMENT, "a dataset path with a control character", "sources[0]")
    big = pb.ResumeElasticRequest(job="victim", world_size=1)
    big.cursors.extend([b"c"] * (1 << 20 | 1))
    c.expect("/batchwire.v1.Jobs/ResumeElastic", big, S.RESOURCE_EXHAUSTED,
             "a repeated field of over 2^20 elements", "cursors")
    # A cursor with an unknown field 0 (found by fuzzing): refused, never journaled.
    good = jr.cursor(fp, "victim", 0, 2, 0, 9)
    body = good[:-5]
    bad = body + b"\x00\x00"
    sealed = jr.seal_cursor(bad)
    c.expect("/batchwire.v1.Jobs/CommitCursor", pb.CommitCursorRequest(
        job="victim", rank=0, cursor=sealed, **jr.lease_fields(alice_lease)),
        S.INVALID_ARGUMENT, "a cursor with an unknown field", "cursor")
    c.close()
    w = Client(worker.addr, TOKENS["alice"][1])
    w.expect("/batchwire.v1.Data/ReadSamples", b"\x0a\x05\x0a\x03n\x00y", S.INVALID_ARGUMENT,
             "ReadSamples at the worker with a NUL in a string", "NUL", raw=True)
    w.close()


def _varint(n):
    out = b""
    while True:
        b = n & 0x7f
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def data_channel(tmp, coord, worker):
    bt.log("===== the data channel's hello =====")
    daddr = worker.first_line.split("data-channel=", 1)[1].split()[0]
    host, port = daddr.rsplit(":", 1)
    req = dpb.ReadSamplesRequest(dataset=DATASET, indices=[0]).SerializeToString()

    def frame(sock):
        h = b""
        while len(h) < 24:
            chunk = sock.recv(24 - len(h))
            if not chunk:
                return None, b""
            h += chunk
        typ, code, a, b = struct.unpack("<IiQQ", h)
        msg = b""
        if typ == 3:
            while len(msg) < a:
                msg += sock.recv(a - len(msg))
        return (typ, code), msg

    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(struct.pack("<IIQ", 0x31445742, 1, len(req)) + req)
    (typ, code), msg = frame(s)
    bt.check(typ == 3 and code == -6 and b"ReadSamples" in msg and b"no read grant" in msg,
             "ReadSamples without a hello or a grant -> PERMISSION_DENIED naming the method: %s"
             % msg[:100])
    s.close()
    s = socket.create_connection((host, int(port)), timeout=5)
    tok = b"wrong-token-0123456789"
    s.sendall(struct.pack("<IIQ", 0x31445742, 3, len(tok)) + tok)
    (typ, code), msg = frame(s)
    bt.check(typ == 3 and code == -18, "a hello with a wrong token -> UNAUTHENTICATED")
    s.close()
    s = socket.create_connection((host, int(port)), timeout=5)
    tok = TOKENS["storage"][1].encode()
    s.sendall(struct.pack("<IIQ", 0x31445742, 3, len(tok)) + tok)
    (typ, code), msg = frame(s)
    bt.check(typ == 3 and code == -6, "a hello with a worker's token -> PERMISSION_DENIED")
    s.close()
    s = socket.create_connection((host, int(port)), timeout=5)
    tok = TOKENS["alice"][1].encode()
    s.sendall(struct.pack("<IIQ", 0x31445742, 3, len(tok)) + tok)
    (typ, code), msg = frame(s)
    bt.check(typ == 2, "a hello with a trainer's token -> END")
    s.sendall(struct.pack("<IIQ", 0x31445742, 1, len(req)) + req)
    (typ, code), msg = frame(s)
    bt.check(typ == 3 and code == -6 and b"no read grant" in msg,
             "but ReadSamples without a read grant is refused on that connection: %s" % msg[:100])
    s.close()
    s = socket.create_connection((host, int(port)), timeout=5)
    tok = TOKENS["ops"][1].encode()
    s.sendall(struct.pack("<IIQ", 0x31445742, 3, len(tok)) + tok)
    (typ, code), msg = frame(s)
    bt.check(typ == 2, "a hello with an admin's token -> END")
    s.sendall(struct.pack("<IIQ", 0x31445742, 1, len(req)) + req)
    (typ, code), msg = frame(s)
    bt.check(typ == 1, "then ReadSamples is served on that connection (a SAMPLE frame)")
    s.close()

    bt.log("----- a real fetch, with and without a token -----")
    common = ["fetch", "--coordinator", coord.addr, "--dataset", "npy:d/*.npy", "--rank", "0",
              "--world-size", "1", "--batch-size", "8", "--quiet"]
    r = bt.cli(*(common + ["--job", "fetch-open"]), timeout=30)
    bt.check(r.returncode != 0 and "UNAUTHENTICATED" in r.stderr + r.stdout,
             "batchwire fetch without a token fails with UNAUTHENTICATED", r.stderr[-300:])
    for transport in ("auto", "grpc"):
        r = bt.cli(*(common + ["--job", "fetch-" + transport, "--transport", transport,
                               "--token-file", token_file(tmp, "alice")]), timeout=60)
        bt.check(r.returncode == 0, "batchwire fetch --token-file (transport %s) delivers" %
                 transport, r.stderr[-500:])


def quotas(tmp, coord):
    bt.log("===== quotas, deletion, a cursor that outlives its job =====")
    carol = Client(coord.addr, TOKENS["carol"][1])

    def create(name):
        return carol.code("/batchwire.v1.Jobs/GetOrCreateJob", pb.GetOrCreateJobRequest(
            name=name, world_size=1, config=pb.JobConfig(
                synthetic_samples=100, sampler=pb.SamplerConfig(mode=jr.TORCH, batch_size=10))))
    for i in range(5):
        bt.check(create("carol-%d" % i)[0] == S.OK, "carol creates job carol-%d" % i)
    code, details = create("carol-5")
    bt.check(code == S.RESOURCE_EXHAUSTED and "--max-jobs-per-principal" in details and
             "batchwire job delete" in details,
             "a 6th job is over carol's quota: RESOURCE_EXHAUSTED saying which and how to delete",
             details)
    r = bt.cli("job", "delete", "--coordinator", coord.addr, "--job", "carol-0",
               "--token-file", token_file(tmp, "alice"))
    bt.check(r.returncode != 0 and "PERMISSION_DENIED" in r.stderr,
             "alice may not delete carol's job", r.stderr)
    r = bt.cli("job", "delete", "--coordinator", coord.addr, "--job", "carol-0",
               "--token-file", token_file(tmp, "carol"))
    bt.check(r.returncode == 0, "carol deletes her job carol-0 with `batchwire job delete`",
             r.stderr)
    bt.check(create("carol-5")[0] == S.OK, "then carol-5 fits")
    r = bt.cli("job", "delete", "--coordinator", coord.addr, "--job", "carol-1",
               "--token-file", token_file(tmp, "ops"))
    bt.check(r.returncode == 0, "an admin deletes any job", r.stderr)

    # A checkpoint outlives its job: commit, delete, create again, resume from the cursor.
    j = carol.call("/batchwire.v1.Jobs/JoinJob", pb.JoinJobRequest(
        job="carol-2", rank=0, world_size=1, holder=pb.Holder(host="b", pid=5)))
    fp = jr.decode_cursor(j.cursor).job_fingerprint
    cur = jr.cursor(fp, "carol-2", 0, 1, 0, 4)
    carol.call("/batchwire.v1.Jobs/CommitCursor", pb.CommitCursorRequest(
        job="carol-2", rank=0, cursor=cur, **jr.lease_fields(j)))
    carol.call("/batchwire.v1.Jobs/DeleteJob", pb.DeleteJobRequest(job="carol-2"))
    code, _ = carol.code("/batchwire.v1.Jobs/GetJob", pb.GetJobRequest(name="carol-2"))
    bt.check(code == S.NOT_FOUND, "a deleted job is gone")
    bt.check(create("carol-2")[0] == S.OK, "and can be created again")
    j = carol.call("/batchwire.v1.Jobs/JoinJob", pb.JoinJobRequest(
        job="carol-2", rank=0, world_size=1, holder=pb.Holder(host="b", pid=6)))
    code, details = carol.code("/batchwire.v1.Jobs/CommitCursor", pb.CommitCursorRequest(
        job="carol-2", rank=0, cursor=jr.cursor(fp, "carol-2", 0, 1, 0, 5), **jr.lease_fields(j)))
    bt.check(code == S.OK, "the old job's cursors are valid for the job created again "
             "(same fingerprint)", details)
    carol.close()


def python_loader(tmp, coord):
    bt.log("===== the Python loader with token_file= =====")
    batchwire = bwpy.import_batchwire()
    args = dict(coordinator=coord.addr, dataset="npy:d/*.npy", batch_size=8, rank=0,
                world_size=1)
    try:
        batchwire.Loader(job="py-open", **args)
    except batchwire.UnauthenticatedError as e:
        bt.ok("without a token: UnauthenticatedError (%s)" % str(e)[:100])
    else:
        raise bt.TestFailure("a Loader without a token was let in")
    loader = batchwire.Loader(job="py-auth", token_file=token_file(tmp, "alice"), job_epochs=1,
                              **args)
    n = sum(1 for _ in loader)
    loader.close()
    bt.check(n == 8, "token_file=: one epoch of 8 batches")
    c = jr.Jobs(coord.addr, token=TOKENS["alice"][1])
    e = c.expect_error("GetJob", pb.GetJobRequest(name="py-auth"))
    bt.check(e.code == S.NOT_FOUND, "job_epochs=1: after its last epoch the job is removed")
    c.close()


def quota_metrics(coord):
    bt.log("===== quota use in /metrics =====")
    import re
    import urllib.request
    url = bt.poll(lambda: re.search(r"metrics on (http://\S+/metrics)",
                                    open(coord.log_path).read()), 5, what="the metrics address")
    text = urllib.request.urlopen(url.group(1), timeout=5).read().decode()
    got = {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^batchwire_coordinator_principal_jobs\{principal="([^"]*)"\} (\S+)$', text, re.M)}
    bt.check(got.get("carol") == 4 and got.get("alice") == 4,
             "batchwire_coordinator_principal_jobs shows each principal's jobs (4 each)", got)
    bt.check(re.search(r'^batchwire_coordinator_jobs_limit\{quota="per_principal"\} 5$', text,
                       re.M), "and the per-principal quota (5)")


def rotation(tmp, coord):
    bt.log("===== rotating a token (SIGHUP) =====")
    path = coord.auth_path
    rotated = dict(TOKENS)
    rotated["carol"] = ("trainer", "carol-rotated-0123456789abcdef")
    write_tokens(path, rotated)
    coord.send(signal.SIGHUP)
    coord.wait_log(r"reloaded --auth-tokens", timeout=5)
    old = Client(coord.addr, TOKENS["carol"][1])
    old.expect("/batchwire.v1.Jobs/ListJobs", pb.ListJobsRequest(), S.UNAUTHENTICATED,
               "carol's old token after the reload")
    old.close()
    new = Client(coord.addr, rotated["carol"][1])
    jobs = new.call("/batchwire.v1.Jobs/ListJobs", pb.ListJobsRequest())
    bt.check("carol-5" in [j.name for j in jobs.jobs],
             "carol's new token works and she keeps her jobs (they belong to her name)")
    new.close()
    with open(path, "a") as f:
        f.write("nonsense line\n")
    coord.send(signal.SIGHUP)
    coord.wait_log(r"the principals loaded before stay in force", timeout=5)
    new = Client(coord.addr, rotated["carol"][1])
    bt.check(new.code("/batchwire.v1.Jobs/ListJobs", pb.ListJobsRequest())[0] == S.OK,
             "a broken file on reload keeps the principals in force")
    new.close()
    write_tokens(path, TOKENS)


def tls(tmp):
    bt.log("===== tokens over TLS, and a client certificate as a principal =====")
    pki = bt.make_pki(tmp)
    path = os.path.join(tmp, "tls-tokens")
    write_tokens(path, TOKENS)
    coord = bt.coordinator(tmp, name="tls-coordinator", args=[
        "--auth-tokens", path, "--tls-cert", pki["server_crt"], "--tls-key", pki["server_key"],
        "--tls-client-ca", pki["ca"]])
    root = open(pki["ca"], "rb").read()
    cert = open(pki["client_crt"], "rb").read()
    key = open(pki["client_key"], "rb").read()
    rogue_cert = open(pki["worker_crt"], "rb").read()  # CN worker.localhost: no principal
    rogue_key = open(pki["worker_key"], "rb").read()
    with_cert = grpc.ssl_channel_credentials(root, key, cert)
    c = Client(coord.addr, None, with_cert)
    bt.check(c.code("/batchwire.v1.Jobs/ListJobs", pb.ListJobsRequest())[0] == S.OK,
             "a client certificate with CN batchwire-cli is trainer principal batchwire-cli")
    c.expect("/batchwire.v1.Coordinator/RegisterWorker", bpb.RegisterWorkerRequest(
        id="x", address="127.0.0.1:1", incarnation=1), S.PERMISSION_DENIED,
        "and is refused a worker's method")
    c.close()
    c = Client(coord.addr, TOKENS["alice"][1], with_cert)
    c.expect("/batchwire.v1.Jobs/ListJobs", pb.ListJobsRequest(), S.UNAUTHENTICATED,
             "a token and a certificate of two principals", "certificate")
    c.close()
    other = grpc.ssl_channel_credentials(root, rogue_key, rogue_cert)
    c = Client(coord.addr, None, other)
    c.expect("/batchwire.v1.Jobs/ListJobs", pb.ListJobsRequest(), S.UNAUTHENTICATED,
             "a certificate whose CN is no principal, without a token", "worker.localhost")
    c.close()
    c = Client(coord.addr, TOKENS["alice"][1], grpc.ssl_channel_credentials(root, rogue_key,
                                                                           rogue_cert))
    bt.check(c.code("/batchwire.v1.Jobs/ListJobs", pb.ListJobsRequest())[0] == S.OK,
             "a token over TLS authenticates (the certificate then only secures the channel)")
    c.close()
    c = Client(coord.addr, "not-a-valid-token-0123456789", with_cert)
    c.expect("/batchwire.v1.Jobs/ListJobs", pb.ListJobsRequest(), S.UNAUTHENTICATED,
             "a wrong token over TLS, even with a good certificate")
    c.close()
    bt.check(coord.stop() == 0, "the TLS coordinator stops cleanly")


def test(tmp):
    tokens = os.path.join(tmp, "tokens")
    write_tokens(tokens, TOKENS)
    coord = bt.coordinator(tmp, args=["--auth-tokens", tokens, "--max-jobs-per-principal", "5",
                                      "--token-file", token_file(tmp, "coord"),
                                      "--metrics-listen", "127.0.0.1:0"])
    coord.auth_path = tokens
    bt.check("auth: on" in open(coord.log_path).read(), "the coordinator says auth is on")
    data = os.path.join(tmp, "data")
    os.makedirs(data, exist_ok=True)
    r = bt.cli("gen", "--format", "npy", "--out", os.path.join(data, "d"), "--num-samples", "64",
               "--shape", "4", "--dtype", "float32")
    bt.check(r.returncode == 0, "batchwire gen wrote the dataset", r.stderr)
    worker = bt.worker(tmp, coord.addr, "w1", args=[
        "--auth-tokens", tokens, "--token-file", token_file(tmp, "storage")])
    st = bt.status_json(coord.addr, tls_args=("--token-file", token_file(tmp, "ops")))
    bt.poll(lambda: any(w["state"] == "alive" for w in bt.status_json(
        coord.addr, tls_args=("--token-file", token_file(tmp, "ops")))["workers"]), 10,
        what="w1 alive")
    bt.check(st["coordinator"]["auth"] == "on", "status --json says auth on")

    roles_and_tokens(coord, worker)
    alice, fp, lease = jobs_and_leases(coord)
    worker_ids(coord, worker)
    malformed(coord, worker, fp, lease)
    data_channel(tmp, coord, worker)
    python_loader(tmp, coord)
    quotas(tmp, coord)
    quota_metrics(coord)
    rotation(tmp, coord)

    bt.log("===== afterwards =====")
    for d in (coord, worker):
        r = bt.cli("health", "--addr", d.addr, "--timeout-ms", 5000)
        bt.check(r.returncode == 0 and "SERVING" in r.stdout, "%s is up and serving" % d.name)
    g = alice.call("GetJob", pb.GetJobRequest(name="victim"))
    bt.check(g.ranks[0].committed and g.ranks[0].step == 7,
             "alice's cursor is untouched (step 7)", g.ranks[0])
    alice.close()
    tls(tmp)

    bt.log("===== an open service says so =====")
    open_coord = bt.coordinator(tmp, name="open-coordinator")
    bt.check("auth: OFF" in open(open_coord.log_path).read(), "it warns at start")
    r = bt.cli("status", "--coordinator", open_coord.addr)
    bt.check(r.returncode == 0 and "auth: off" in r.stdout, "`batchwire status` shows auth: off",
             r.stdout)


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=240)
