"""Trainers never send their bearer token to a worker (docs/security.md, "Read grants"), with
authentication on:

* A rogue listener holding a worker principal's token (bound with ids= to its own id)
  registers as a worker, with a gRPC port and a data channel, and captures everything a
  trainer sends it on both transports while it refuses every read (UNAVAILABLE, so the
  trainer fails over). Each read it received carries a read grant and no token: the trainer's
  token is in none of the captured bytes, gRPC metadata included; there is no data-channel
  hello; the grant's secret is not there either, and the proof is the one bound to the rogue's
  id.
* The captured request replayed to the real worker, on gRPC and on the data channel, is
  refused (PERMISSION_DENIED naming the proof) while the lease that got the grant is still
  live; the same request with the proof for the real worker's id (which only the secret's
  holder can compute; the test computes it from the grant key) is served -- so the refusal is
  the binding to the worker id, nothing else.
* The trainer, whose token is in the coordinator's principals file but not in the workers',
  reads every batch of an epoch exactly as `batchwire plan` says, on both transports,
  map-style and streams; so do two shares of its rank, the second with share 0's lease (its
  grant); a share without the lease has no grant and is refused ("no read grant").

The rogue and the replays use python3-grpcio and messages compiled from proto/ by Debian's
protoc, independent of the C code under test.
"""

import hashlib
import hmac
import os
import socket
import struct
import threading
from concurrent import futures

import grpc

import bwdata as bd
import bwpy
import bwtest as bt
import jobs_rpc as jr

pb, dpb, bpb = jr.pb, jr.dpb, jr.bpb

S = grpc.StatusCode
ROGUE_ID = "rogue-1"
PRINCIPALS = {  # the coordinator's: name -> (role, token, binding)
    "ops": ("admin", "ops-token-0123456789abcdef", ""),
    "alice": ("trainer", "alice-token-0123456789abcdef-not-for-workers", ""),
    "storage": ("worker", "storage-token-0123456789abcdef", "ids=w*"),
    "rogue": ("worker", "rogue-token-0123456789abcdef", "ids=rogue-*"),
}
WORKER_PRINCIPALS = ("ops", "storage")  # the workers' file: no trainer
DCHAN_MAGIC = 0x31445742
DCHAN_READ_SAMPLES, DCHAN_READ_STREAM, DCHAN_AUTH = 1, 2, 3
DCHAN_SAMPLE, DCHAN_END, DCHAN_ERROR = 1, 2, 3
BW_UNAVAILABLE, BW_PERMISSION_DENIED = -7, -6
N, N_STREAM, BATCH = 240, 120, 8
STREAM = "jsonl:st/*.jsonl"
READS = ("/batchwire.v1.Data/ReadSamples", "/batchwire.v1.Data/ReadStream")


def write_principals(path, names):
    bt.write_principals(path, [(PRINCIPALS[n][0], n) + PRINCIPALS[n][1:] for n in names])


def token_file(tmp, name):
    return bt.secret_file(tmp, "token-" + name, PRINCIPALS[name][1])


def grant_keys(path):
    """The --grant-key file's keys: {key id: key bytes}."""
    keys = {}
    for line in open(path):
        line = line.split("#", 1)[0].split()
        if len(line) == 2:
            keys[line[0]] = bytes.fromhex(line[1])
    return keys


def grant_secret(keys, claims):
    """G = HMAC-SHA256(K[key_id], "bw-grant-v1" || claims) (docs/security.md)."""
    key_id = dpb.GrantClaims.FromString(claims).key_id
    return hmac.new(keys[key_id], b"bw-grant-v1" + claims, hashlib.sha256).digest()


def proof_for(secret, worker_id):
    return hmac.new(secret, b"bw-read-v1\0" + worker_id.encode(), hashlib.sha256).digest()


class Rogue:
    """A listener registered as worker ROGUE_ID: a gRPC server and a data channel that
    capture every byte and every call and refuse every read with UNAVAILABLE."""

    def __init__(self, coord_addr, token):
        self.lock = threading.Lock()
        self.calls = []  # (method, metadata [(key, value)], request bytes)
        self.dchan = []  # (raw bytes of a whole connection, [(kind, body), ...])
        self.reads = []  # every read, in arrival order: (transport, method, request bytes)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers((self,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.stopping = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()
        self.coord = grpc.insecure_channel(coord_addr)
        self.md = [("authorization", "Bearer " + token)]
        self.incarnation = int.from_bytes(os.urandom(6), "little") | 1
        self.call("RegisterWorker", bpb.RegisterWorkerRequest(
            id=ROGUE_ID, address="127.0.0.1:%d" % self.port,
            data_address="127.0.0.1:%d" % self.lsock.getsockname()[1],
            incarnation=self.incarnation), bpb.RegisterWorkerResponse)
        threading.Thread(target=self._heartbeat, daemon=True).start()

    def call(self, method, req, resp):
        stub = self.coord.unary_unary("/batchwire.v1.Coordinator/" + method,
                                      request_serializer=lambda m: m.SerializeToString(),
                                      response_deserializer=resp.FromString)
        return stub(req, timeout=10, metadata=self.md)

    def _heartbeat(self):
        while not self.stopping.wait(0.3):
            try:
                self.call("Heartbeat", bpb.HeartbeatRequest(id=ROGUE_ID,
                                                            incarnation=self.incarnation),
                          bpb.HeartbeatResponse)
            except grpc.RpcError:
                pass

    # grpc.GenericRpcHandler: every method, its request as bytes
    def service(self, details):
        method, md = details.method, list(details.invocation_metadata)

        def refuse(request, context):
            with self.lock:
                self.calls.append((method, md, request))
                if method in READS:
                    self.reads.append(("grpc", method, request))
            context.abort(S.UNAVAILABLE, "rogue: not serving")
        ident = lambda b: b  # noqa: E731
        if method in READS:
            return grpc.unary_stream_rpc_method_handler(
                lambda req, ctx: iter(refuse(req, ctx) or ()), ident, ident)
        return grpc.unary_unary_rpc_method_handler(refuse, ident, ident)

    def _accept(self):
        while not self.stopping.is_set():
            try:
                conn, _ = self.lsock.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()

    def _conn(self, conn):
        raw, reqs = bytearray(), []
        pos = 0
        with self.lock:
            self.dchan.append((raw, reqs))

        def read(n):
            nonlocal pos
            while len(raw) - pos < n:
                chunk = conn.recv(65536)
                if not chunk:
                    raise EOFError
                with self.lock:
                    raw.extend(chunk)
            pos += n
            return bytes(raw[pos - n:pos])
        conn.settimeout(30)
        try:
            while True:
                magic, kind, length = struct.unpack("<IIQ", read(16))
                body = read(length) if magic == DCHAN_MAGIC and length < 1 << 20 else b""
                with self.lock:
                    reqs.append((kind, body))
                    if kind in (DCHAN_READ_SAMPLES, DCHAN_READ_STREAM):
                        self.reads.append(("data channel", READS[kind - 1], body))
                msg = b"rogue: not serving"
                conn.sendall(struct.pack("<IiQQ", DCHAN_ERROR, BW_UNAVAILABLE, len(msg), 0) + msg)
        except (EOFError, OSError, struct.error):
            pass
        conn.close()

    def stop(self):
        self.stopping.set()
        self.lsock.close()
        self.server.stop(0)
        self.coord.close()


def dchan_exchange(addr, kind, body):
    """Sends one data-channel request (no hello) and returns ([(type, code, a, b), ...] up to
    END or ERROR, the ERROR's message)."""
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(struct.pack("<IIQ", DCHAN_MAGIC, kind, len(body)) + body)
    buf = b""

    def take(n):
        nonlocal buf
        while len(buf) < n:
            chunk = s.recv(65536)
            if not chunk:
                raise EOFError("the worker closed the connection")
            buf += chunk
        out, buf = buf[:n], buf[n:]
        return out
    frames, msg = [], b""
    while True:
        f = struct.unpack("<IiQQ", take(24))
        frames.append(f)
        if f[0] == DCHAN_SAMPLE:
            take(f[3])
        elif f[0] == DCHAN_ERROR:
            msg = take(f[2])
            break
        elif f[0] == DCHAN_END:
            break
    s.close()
    return frames, msg.decode(errors="replace")


def grpc_read(addr, method, body):
    """(status code, details, messages) of a read at addr with no token."""
    ch = grpc.insecure_channel(addr)
    stub = ch.unary_stream(method, request_serializer=lambda b: b,
                           response_deserializer=lambda b: b)
    try:
        got = list(stub(body, timeout=10))
        return S.OK, "", got
    except grpc.RpcError as e:
        return e.code(), e.details() or "", []
    finally:
        ch.close()


def captured(rogue):
    """Every read request the rogue received, in arrival order: (transport, method, request
    message, its bytes); and its gRPC calls and data-channel connections."""
    with rogue.lock:
        reads = list(rogue.reads)
        calls = list(rogue.calls)
        conns = [(bytes(raw), list(reqs)) for raw, reqs in rogue.dchan]
    out = [(t, m, (dpb.ReadSamplesRequest if m == READS[0] else dpb.ReadStreamRequest)
            .FromString(body), body) for t, m, body in reads]
    return out, calls, conns


def nothing_secret(rogue, keys, granted):
    """What the rogue received: no token and no hello anywhere; the first `granted` reads (all
    but the lease-less share's) each with a grant whose secret is nowhere."""
    bt.log("===== what the rogue received =====")
    reads, calls, conns = captured(rogue)
    kinds = sorted({(t, m) for t, m, _r, _b in reads})
    bt.check(kinds == sorted((t, m) for t in ("data channel", "grpc") for m in READS),
             "the rogue received ReadSamples and ReadStream over both transports (%d reads)" %
             len(reads), kinds)
    tok = PRINCIPALS["alice"][1].encode()
    everything = b"".join(raw for raw, _ in conns) + b"".join(
        body + b"".join(k.encode() + str(v).encode() for k, v in md) for _m, md, body in calls)
    bt.check(tok not in everything and tok.hex().encode() not in everything,
             "the trainer's token is in none of the %d bytes the rogue captured (gRPC metadata "
             "and bodies, every data-channel byte)" % len(everything))
    bt.check(not any(k.lower() == "authorization" for _m, md, _b in calls for k, _v in md),
             "no gRPC call to the rogue carries 'authorization'",
             [md for _m, md, _b in calls][:3])
    bt.check(all(kind != DCHAN_AUTH for _raw, reqs in conns for kind, _b in reqs),
             "no data-channel connection sends a hello (kind 3)")
    reads = reads[:granted]
    bare = [r for r in reads if not (r[2].HasField("grant") and r[2].grant.claims and
                                     len(r[2].grant.proof) == 32)]
    bt.check(not bare, "each of the %d reads of the lease holders carries a read grant" %
             len(reads), bare[:1])
    secrets = {grant_secret(keys, r[2].grant.claims) for r in reads}
    bt.check(not any(x in everything or x.hex().encode() in everything for x in secrets),
             "none of their grants' %d secrets is in anything the rogue received" %
             len(secrets))
    bt.check(all(r[2].grant.proof == proof_for(grant_secret(keys, r[2].grant.claims), ROGUE_ID)
                 for r in reads), "each proof is the one bound to the rogue's id")


def replay(reads, keys, w1):
    """The newest read captured over each transport, replayed to w1 (while the lease that got
    its grant is live)."""
    daddr = w1.first_line.split("data-channel=", 1)[1].split()[0]
    latest = {r[0]: r for r in reads}
    bt.check(len(latest) == 2, "the rogue captured reads over both transports during this job",
             list(latest))
    for t, method, req, body in latest.values():
        what = "%s captured over %s, replayed" % (method.rsplit("/", 1)[1], t)
        kind = DCHAN_READ_SAMPLES if method == READS[0] else DCHAN_READ_STREAM
        code, details, _ = grpc_read(w1.addr, method, body)
        bt.check(code == S.PERMISSION_DENIED and "proof" in details,
                 "%s to w1 over gRPC -> PERMISSION_DENIED naming the proof" % what,
                 "%s: %s" % (code.name, details))
        frames, msg = dchan_exchange(daddr, kind, body)
        bt.check(frames[-1][0] == DCHAN_ERROR and frames[-1][1] == BW_PERMISSION_DENIED and
                 "proof" in msg and not any(f[0] == DCHAN_SAMPLE for f in frames),
                 "%s to w1's data channel -> PERMISSION_DENIED naming the proof, no sample" %
                 what, (frames, msg))
        # The control: the same request with w1's own proof (and routed around the rogue, as
        # the loader's failover sends it: no ownership check) is served, so the refusal above
        # is the proof's binding to the rogue's id, not an expired or fenced grant.
        req.grant.proof = proof_for(grant_secret(keys, req.grant.claims), "w1")
        req.routing.placement_version = 0
        good = req.SerializeToString()
        code, details, got = grpc_read(w1.addr, method, good)
        bt.check(code == S.OK and got, "the same request with w1's proof is served over gRPC",
                 "%s: %s" % (code.name, details))
        frames, msg = dchan_exchange(daddr, kind, good)
        bt.check(frames[-1][0] == DCHAN_END and any(f[0] == DCHAN_SAMPLE for f in frames),
                 "and over w1's data channel", (frames[-3:], msg))


def alice_epoch(tmp, coord, data, transport, stream, rogue, keys, w1):
    """One epoch of alice's job (map-style over the .npy dataset, or a stream over the JSON
    Lines one) with the rogue in the placement: every batch as `batchwire plan` says, every
    sample's bytes the file's. With --transport auto, the reads the rogue captured meanwhile are
    replayed to w1 while the lease is live."""
    what = "%s, --transport %s" % ("a stream" if stream else "map-style", transport)
    bt.log("===== alice's job (%s), the rogue in the placement =====" % what)
    batchwire = bwpy.import_batchwire()
    arr, records = data
    n = len(records) if stream else len(arr)
    want = bwpy.plan("--mode", "iterable" if stream else "torch", "--num-samples", n,
                     "--world-size", 1, "--batch-size", BATCH, "--epoch", 0)[0]
    got = []
    start = len(captured(rogue)[0])
    with batchwire.Loader(coordinator=coord.addr, job="alice-%s-%s" % (
            "stream" if stream else "map", transport), dataset=STREAM if stream else bwpy.NPY,
            mode="iterable" if stream else "torch", batch_size=BATCH, rank=0, world_size=1,
            job_epochs=1, transport=transport, timeout=5,
            token_file=token_file(tmp, "alice")) as loader:
        for b in loader:
            idx = b.indices.tolist()
            got.append((idx, b.samples() == [records[i] for i in idx] if stream
                        else b.numpy().tobytes() == arr[idx].tobytes()))
        bt.check(len(got) == len(want) and all(
            g == w["indices"] and same for (g, same), w in zip(got, want)),
            "%s: alice (in no worker's principals file) read all %d batches exactly as "
            "batchwire plan says, every sample the file's" % (what, len(want)),
            "%d batches, %d planned: %s" % (len(got), len(want), got[:2]))
        if transport == "auto":
            replay(captured(rogue)[0][start:], keys, w1)


def shares(tmp, coord, arr, rogue):
    """A share of the rank reads with the grant of the lease it is given (its own heartbeats
    renew it); without the lease it has no grant (nor sends a token), and the workers serve it
    nothing. Returns how many reads the rogue had received before the share without one."""
    bt.log("===== shares of a rank: with the lease's grant, and without a lease =====")
    batchwire = bwpy.import_batchwire()
    want = bwpy.plan("--mode", "torch", "--num-samples", len(arr), "--world-size", 1,
                     "--batch-size", BATCH, "--epoch", 0)[0]
    args = dict(coordinator=coord.addr, job="alice-shares", dataset=bwpy.NPY, batch_size=BATCH,
                rank=0, world_size=1, timeout=5, token_file=token_file(tmp, "alice"))
    got = {}
    with batchwire.Loader(share=(0, 2), **args) as l0:
        with batchwire.Loader(share=(1, 2), lease=l0.lease(), **args) as l1:
            got[1] = [(b.indices.tolist(), b.numpy().tobytes()) for b in l1]
        got[0] = [(b.indices.tolist(), b.numpy().tobytes()) for b in l0]
        for i in (0, 1):
            mine = want[i::2]
            bt.check(len(got[i]) == len(mine) and all(
                g == w["indices"] and x == arr[g].tobytes() for (g, x), w in zip(got[i], mine)),
                "share %d of 2 reads its %d batches exactly" % (i, len(mine)),
                "%d batches, %d planned" % (len(got[i]), len(mine)))
        granted = len(captured(rogue)[0])
        try:
            with batchwire.Loader(share=(1, 2), **args) as bare:
                n = sum(1 for _ in bare)
            raise bt.TestFailure("a share without the lease read %d batches" % n)
        except batchwire.PermissionDeniedError as e:
            bt.check("no read grant" in str(e),
                     "a share without the lease: PermissionDeniedError, no read grant", str(e))
    return granted


def test(tmp):
    coord_principals = os.path.join(tmp, "principals-coordinator")
    write_principals(coord_principals, PRINCIPALS)
    worker_principals = os.path.join(tmp, "principals-workers")
    write_principals(worker_principals, WORKER_PRINCIPALS)
    keys = grant_keys(bt.grant_key(tmp))
    root = os.path.join(tmp, "data")
    os.makedirs(root)
    arr = bwpy.gen_npy(root, "ds", N, (3, 5))
    bwpy.gen(root, "jsonl", "st", N_STREAM, 4, 48, files=3)
    data = (arr, [bd.expected_sample("jsonl", i, 4, 48)[0] for i in range(N_STREAM)])
    coord = bt.coordinator(tmp, args=["--auth-tokens", coord_principals,
                                      "--heartbeat-ms", "1000", "--dead-after", "3"])
    w1 = bt.worker(tmp, coord.addr, "w1", data_root=root, args=[
        "--auth-tokens", worker_principals, "--token-file", token_file(tmp, "storage")])
    rogue = Rogue(coord.addr, PRINCIPALS["rogue"][1])
    ops = ("--token-file", token_file(tmp, "ops"))
    bt.poll(lambda: sorted(w["id"] for w in bt.status_json(coord.addr, ops)["workers"]
                           if w["state"] == "alive") == [ROGUE_ID, "w1"] or None, 20,
            what="w1 and the rogue alive")
    try:
        for stream in (False, True):
            alice_epoch(tmp, coord, data, "auto", stream, rogue, keys, w1)
            before = [r[0] for r in captured(rogue)[0]]
            alice_epoch(tmp, coord, data, "grpc", stream, rogue, keys, w1)
            new = [r[0] for r in captured(rogue)[0]][len(before):]
            bt.check(new and set(new) == {"grpc"},
                     "--transport grpc: the rogue was asked again, over gRPC only (%d reads)" %
                     len(new))
        nothing_secret(rogue, keys, shares(tmp, coord, arr, rogue))
    finally:
        rogue.stop()
    bt.check(w1.running() and coord.running(), "both daemons are still up")
    bt.check(w1.stop() == 0 and coord.stop() == 0, "and stop cleanly")


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=240)
