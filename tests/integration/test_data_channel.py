"""The storage worker's bulk data channel (core/rpc/dchan.h): ReadSamples over TCP (or TLS),
spoken here with a raw socket, byte for byte as the header comment of dchan.h describes it.

* every worker of a plaintext cluster registers a data_address (`batchwire status --json`,
  the placement table), the address its first log line names; `--data-listen off` registers
  ""; `--data-advertise` is what gets registered; a malformed `--data-listen` refuses to
  start (exit 1, naming the flag);
* a worker whose data port cannot be reached is fetched from over gRPC with one warning and
  the same batches; a worker restarted on the same ports under a client's idle connections
  costs no failover (the client asks again on new connections); a worker at
  --data-max-connections refuses more with BW_UNAVAILABLE and its clients ask it over gRPC
  instead of failing over; --data-idle-timeout-ms closes idle connections;
* workers serving mutual TLS offer a TLS data channel: `batchwire fetch` with a client
  certificate gives the same batches through it (connections to the data ports) as over gRPC;
  a plaintext request on the TLS port gets no frame; without a client certificate the fetch
  fails clearly (exit 1, "certificate required"), and the worker keeps serving; a worker
  SIGKILLed under a TLS client is failed over with exact batches;
* a valid request (indices shuffled, with repeats) gets SAMPLE frames in request order whose
  bytes are numpy's rows of the .npy file, then END with the count -- small rows (copied into
  the worker's staging buffer), large ones (sent from the mapped file), TFRecord records of 0
  bytes to 290 KB and tar samples of two members (the generator's formula, bwdata.py); several
  requests on one connection, pipelined requests, a request that arrives in pieces, and six
  connections at once;
* a well-formed request with an error gets one ERROR frame with the right batchwire code and
  a sentence naming the problem, and the connection keeps serving: an index out of range, a
  wrong fingerprint, a path that leaves the data root, more than 2^20 indices, an index owned
  by the other worker under the current placement (routing by version, modulo shards);
* malformed input gets an ERROR frame and the connection is closed (HTTP/1.1, an HTTP/2
  preface, an unknown request kind, a length over 32 MiB, a body that is not a
  ReadSamplesRequest, an empty body); clients that leave in the middle of a header or a body,
  or reset without reading a 14 MB answer, do no harm: the worker stays up, the same
  incarnation, and keeps serving (fresh requests, `batchwire health`);
* `batchwire fetch --transport auto` (which uses the data channel: the kernel's socket table
  shows connections to the data ports) and `--transport grpc` (which does not) print the same
  per-batch sha256, equal to numpy's bytes; so does BATCHWIRE_TRANSPORT=grpc; a bogus
  transport is refused by the CLI (flag and BATCHWIRE_TRANSPORT, exit 2) and by the Python
  binding (InvalidArgumentError, option and environment), which fetches the same bytes over
  either transport;
* SIGTERM stops workers promptly (exit 0) with data-channel clients connected: idle, not
  reading a large answer, and in the middle of a request.
"""

import hashlib
import json
import os
import shutil
import socket
import struct
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwtest as bt
import test_client_e2e as e2e  # noqa: E402
import bwdata as bd  # noqa: E402

MAGIC = 0x31445742  # "BWD1"
KIND_READ_SAMPLES = 1
SAMPLE, END, ERROR = 1, 2, 3
MAX_REQUEST = 32 << 20

BW_INVALID_ARGUMENT = -1
BW_PERMISSION_DENIED = -6
BW_TOO_BIG = -9
BW_PROTOCOL = -11
BW_OUT_OF_RANGE = -15
BW_WRONG_OWNER = -19
BW_MISMATCH = -20
BW_UNAVAILABLE = -7
CODE_NAMES = {BW_UNAVAILABLE: "BW_UNAVAILABLE", BW_INVALID_ARGUMENT: "BW_INVALID_ARGUMENT", BW_PERMISSION_DENIED:
              "BW_PERMISSION_DENIED", BW_TOO_BIG: "BW_TOO_BIG", BW_PROTOCOL: "BW_PROTOCOL",
              BW_OUT_OF_RANGE: "BW_OUT_OF_RANGE", BW_WRONG_OWNER: "BW_WRONG_OWNER",
              BW_MISMATCH: "BW_MISMATCH"}

NUM_SHARDS = 16
SMALL = "small.npy"   # 61 rows of 3x7 float32 (84 bytes): copied into the staging buffer
BIG = "big.npy"       # 9 rows of 80x128 uint32 (40 KiB): sent straight from the mapping
IO_TIMEOUT = 10


# ---------------------------------------------------------------------------
# the wire protocol

def request(pbm, sources, indices, fmt="npy", fingerprint="", routing=None):
    """A serialized ReadSamplesRequest."""
    r = pbm.ReadSamplesRequest(dataset=pbm.Dataset(format=fmt, sources=list(sources)),
                               indices=list(indices), fingerprint=fingerprint)
    if routing is not None:
        r.routing.CopyFrom(routing)
    return r.SerializeToString()


def frame(body, kind=KIND_READ_SAMPLES, length=None):
    return struct.pack("<IIQ", MAGIC, kind, len(body) if length is None else length) + body


def connect(addr):
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host.strip("[]"), int(port)), timeout=IO_TIMEOUT)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_exact(s, n, what):
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = s.recv(min(n - len(buf), 1 << 20))
        except socket.timeout:
            raise bt.TestFailure("%s: no data within %ss (%d of %d bytes came)" %
                                 (what, IO_TIMEOUT, len(buf), n))
        if not chunk:
            raise bt.TestFailure("%s: the worker closed the connection after %d of %d bytes" %
                                 (what, len(buf), n))
        buf += chunk
    return bytes(buf)


def response_full(s, what):
    """Reads one request's frames: ("end", [(key, bytes)], count, END's b) or
    ("error", [(key, bytes)] before it, (code, message), ERROR's b: the retry hint)."""
    samples = []
    while True:
        typ, code, a, b = struct.unpack("<IIQQ", read_exact(s, 24, what + " (frame header)"))
        if typ == SAMPLE:
            if code != 0:
                raise bt.TestFailure("%s: SAMPLE frame with code %d" % (what, code))
            samples.append((a, read_exact(s, b, what + " (sample %d, %d bytes)" % (a, b))))
        elif typ == END:
            return "end", samples, a, b
        elif typ == ERROR:
            if a > 4096:
                raise bt.TestFailure("%s: ERROR frame with a %d-byte message" % (what, a))
            msg = read_exact(s, a, what + " (error message)").decode("utf-8", "replace")
            return "error", samples, (struct.unpack("<i", struct.pack("<I", code))[0], msg), b
        else:
            raise bt.TestFailure("%s: unknown frame type %d (code %d, a %d, b %d)" %
                                 (what, typ, code, a, b))


def response(s, what):
    """Reads one request's frames: ("end", [(index, bytes)], count) or
    ("error", [(index, bytes)] before it, (code, message))."""
    return response_full(s, what)[:3]


def expect_samples(s, rows, indices, what):
    """Reads one response: SAMPLE frames for `indices` in order with numpy's bytes, then END."""
    kind, samples, tail = response(s, what)
    if kind != "end":
        raise bt.TestFailure("%s: expected samples, got %s: %s" %
                             (what, CODE_NAMES.get(tail[0], tail[0]), tail[1]))
    got_idx = [i for i, _ in samples]
    if got_idx != list(indices):
        raise bt.TestFailure("%s: SAMPLE frames for indices %r, requested %r" %
                             (what, got_idx, list(indices)))
    for i, data in samples:
        if data != rows[i]:
            raise bt.TestFailure("%s: sample %d: %d bytes differ from numpy's row (%d bytes)" %
                                 (what, i, len(data), len(rows[i])))
    if tail != len(indices):
        raise bt.TestFailure("%s: END says %d samples, %d were requested" %
                             (what, tail, len(indices)))
    return samples


def expect_error(s, code, needles, what):
    """Reads one response: an ERROR frame with `code` whose message has every needle."""
    kind, samples, tail = response(s, what)
    if kind != "error":
        raise bt.TestFailure("%s: expected %s, got %d samples and END" %
                             (what, CODE_NAMES[code], len(samples)))
    got, msg = tail
    if got != code or any(n not in msg for n in needles):
        raise bt.TestFailure("%s: expected %s with %r, got %s: %s" %
                             (what, CODE_NAMES[code], needles, CODE_NAMES.get(got, got), msg))
    if samples:
        raise bt.TestFailure("%s: %d SAMPLE frames before the ERROR" % (what, len(samples)))
    bt.ok("%s -> %s: %s" % (what, CODE_NAMES[code], msg[:200]))
    return msg


def expect_closed(s, what):
    """The worker closed the connection (EOF or reset) after its ERROR frame."""
    try:
        rest = s.recv(1 << 16)
    except ConnectionResetError:
        rest = b""
    except socket.timeout:
        raise bt.TestFailure("%s: the worker kept the connection open after the error" % what)
    if rest:
        raise bt.TestFailure("%s: %d more bytes after the ERROR frame: %r" %
                             (what, len(rest), rest[:64]))


# ---------------------------------------------------------------------------
# sockets the kernel knows about

def tcp_tuples(ports):
    """{(local address, remote address)} (hex, as /proc/net/tcp* print them) of every TCP
    socket in this network namespace, in any state but LISTEN (TIME_WAIT included), with a
    local or remote port in `ports`."""
    out = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 4:
                continue
            local, remote = fields[1], fields[2]
            lp, rp = int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16)
            if (lp in ports or rp in ports) and fields[3] != "0A":  # not the listener
                out.add((local, remote))
    return out


# ---------------------------------------------------------------------------
# the test

def write_npy(root, name, arr):
    path = os.path.join(root, name)
    np.save(path, arr)
    back = np.load(path)
    rows = [back[i].tobytes() for i in range(back.shape[0])]
    bt.check(back.dtype == arr.dtype and back.shape == arr.shape and
             all(r == arr[i].tobytes() for i, r in enumerate(rows)),
             "%s: %d rows of %r %s, %d bytes each" % (name, arr.shape[0], arr.shape[1:],
                                                     arr.dtype, len(rows[0])))
    return rows


def gen(root, name, fmt, args):
    """`batchwire gen` into root/name: (sources relative to the root, [bytes of sample i]) with
    the bytes from the generator's formula (bwdata.py), not from the C code."""
    r = bt.cli("gen", "--format", fmt, "--out", os.path.join(root, name), *args, timeout=60)
    bt.check(r.returncode == 0, "batchwire gen --format %s %s" % (fmt, " ".join(map(str, args))),
             r.stderr)
    d = json.loads(r.stdout)
    rows = [bd.expected_sample(fmt, i, d["sample_bytes"], d["sample_bytes_max"])[0]
            for i in range(d["num_samples"])]
    return ["%s/%s" % (name, x) for x in d["sources"]], rows


def concurrent_clients(pbm, addr, datasets, nclients=6, nrequests=4):
    """nclients connections at once, each with nrequests requests over every dataset."""
    failures = []

    def client(k):
        try:
            rng = np.random.default_rng(100 + k)
            with connect(addr) as c:
                for j in range(nrequests):
                    sources, rows = datasets[(k + j) % len(datasets)]
                    idx = [int(i) for i in rng.integers(0, len(rows), 25)]
                    c.sendall(frame(request(pbm, sources, idx, fmt=sources_fmt(sources))))
                    expect_samples(c, rows, idx, "client %d request %d" % (k, j))
        except BaseException as e:  # reported by the main thread
            failures.append((k, repr(e)[:2000]))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(nclients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    bt.check(not failures and not any(t.is_alive() for t in threads),
             "%d concurrent connections x %d requests over %d datasets: every answer exact" %
             (nclients, nrequests, len(datasets)), failures)


def sources_fmt(sources):
    top = sources[0].split("/", 1)[0]
    return {"tfr": "tfrecord", "tiny": "tfrecord", "tar": "tar"}.get(top, "npy")


def health(addr):
    r = bt.cli("health", "--addr", addr, "--timeout-ms", 5000)
    return r.returncode == 0 and "SERVING" in r.stdout


def fetch(coord, job, transport, epochs=3, env=None):
    """`batchwire fetch` rank 0 of 1 over SMALL: [(epoch, step, indices, bytes, sha256)]."""
    r = bt.cli("fetch", "--coordinator", coord, "--job", job, "--dataset", "npy:" + SMALL,
               "--rank", 0, "--world-size", 1, "--batch-size", 7, "--shuffle", "--seed", 11,
               "--epochs", epochs, "--transport", transport, env=env, timeout=60)
    if r.returncode != 0:
        raise bt.TestFailure("batchwire fetch --transport %s exited %d\nstderr:\n%s" %
                             (transport, r.returncode, r.stderr))
    out = []
    for line in r.stdout.splitlines():
        o = json.loads(line)
        if "summary" not in o:
            out.append((o["epoch"], o["step"], tuple(o["indices"]), o["bytes"], o["sha256"]))
    return out


def equals_plan(got, cfg, rows, epochs):
    """Whether `batchwire fetch` lines (rank 0 of 1) have the plan's indices for `epochs` epochs
    and each batch's sha256 is that of the numpy rows in batch order."""
    want, _ = e2e.plans(cfg, len(rows), 1, epochs)
    return [b["indices"] for b in got] == [b["indices"] for b in want[0]] and all(
        b["sha256"] == hashlib.sha256(b"".join(rows[i] for i in b["indices"])).hexdigest()
        for b in got)


def python_binding_checks(coord, rows):
    """Loader(transport=...) in a child interpreter (libbatchwire never loaded here)."""
    cache = os.path.join(bt.BUILD_DIR, "CMakeCache.txt")
    try:
        with open(cache) as f:
            sanitized = any(line.startswith("BW_SANITIZE:") and line.strip().split("=", 1)[1]
                            for line in f)
    except OSError:
        sanitized = False
    if sanitized:
        bt.log("sanitizer build: the Python binding's transport checks are left to the CLI ones "
               "(libbatchwire needs the sanitizer runtime preloaded; test_python_binding does "
               "that)")
        return
    probe = r'''
import hashlib, json, os, sys
import batchwire
opts = dict(coordinator=sys.argv[1], job="dc-py", dataset="npy:%s", batch_size=5, rank=0,
            world_size=1)
res = {}
try:
    batchwire.Loader(transport="bogus", **opts)
    res["option"] = None
except batchwire.Error as e:
    res["option"] = [type(e).__name__, e.code, e.message]
os.environ["BATCHWIRE_TRANSPORT"] = "bogus"
try:
    batchwire.Loader(**opts)
    res["env"] = None
except batchwire.Error as e:
    res["env"] = [type(e).__name__, e.code, e.message]
del os.environ["BATCHWIRE_TRANSPORT"]
res["batches"] = {}
for t in ("auto", "grpc"):
    with batchwire.Loader(transport=t, **dict(opts, job="dc-py-" + t)) as lo:
        b = lo.next_batch()
        res["batches"][t] = [b.indices.tolist(), hashlib.sha256(b.numpy().tobytes()).hexdigest()]
print(json.dumps(res))
''' % SMALL
    env = {"PYTHONPATH": os.path.join(bt.SOURCE_DIR, "python"),
           "BATCHWIRE_LIB": os.path.join(bt.BUILD_DIR, "lib", "libbatchwire.so")}
    r = bt.run([sys.executable, "-c", probe, coord], env=env, timeout=60)
    if r.returncode != 0:
        raise bt.TestFailure("the Python probe exited %d\nstdout:\n%s\nstderr:\n%s" %
                             (r.returncode, r.stdout, r.stderr))
    res = json.loads(r.stdout.strip().splitlines()[-1])
    opt, env_err = res["option"], res["env"]
    bt.check(opt is not None and opt[0] == "InvalidArgumentError" and "bogus" in opt[2] and
             "transport" in opt[2] and "auto or grpc" in opt[2],
             "batchwire.Loader(transport='bogus') raises InvalidArgumentError: %s" %
             (opt and opt[2]), res)
    bt.check(env_err is not None and env_err[0] == "InvalidArgumentError" and
             "BATCHWIRE_TRANSPORT" in env_err[2] and "bogus" in env_err[2],
             "batchwire.Loader() with BATCHWIRE_TRANSPORT=bogus raises InvalidArgumentError: %s"
             % (env_err and env_err[2]), res)
    for t, (idx, sha) in res["batches"].items():
        want = hashlib.sha256(b"".join(rows[i] for i in idx)).hexdigest()
        bt.check(idx == list(range(5)) and sha == want,
                 "batchwire.Loader(transport=%r): the first batch is numpy's rows 0..4" % t, res)


def test(tmpdir):
    root = os.path.join(tmpdir, "data")
    os.makedirs(root)
    rng = np.random.default_rng(5)
    small = write_npy(root, SMALL, rng.standard_normal((61, 3, 7)).astype(np.float32))
    big = write_npy(root, BIG, rng.integers(0, 2 ** 32, (9, 80, 128), dtype=np.uint32))
    # Variable sizes across the 32 KiB copy threshold and the 256 KiB staging buffer, and
    # records of 0 to 2 bytes; tar samples are two members (a record of several parts).
    tfr = gen(root, "tfr", "tfrecord", ["--num-samples", 40, "--sample-bytes", 0,
                                        "--sample-bytes-max", 300000, "--files", 3])
    tar = gen(root, "tar", "tar", ["--num-samples", 30, "--sample-bytes", 0,
                                   "--sample-bytes-max", 60000, "--files", 2])
    tiny = gen(root, "tiny", "tfrecord", ["--num-samples", 12, "--sample-bytes", 0,
                                          "--sample-bytes-max", 2])
    shutil.copyfile(os.path.join(root, SMALL), os.path.join(tmpdir, "x.npy"))  # outside the root

    # --- a plaintext cluster of two workers: each registers its data channel
    coord = bt.coordinator(tmpdir, args=["--heartbeat-ms", 200, "--dead-after", 3])
    workers = {wid: bt.worker(tmpdir, coord.addr, wid, data_root=root) for wid in ("w1", "w2")}
    st = bt.poll(lambda: (lambda s: s if sum(w["state"] == "alive" for w in s["workers"]) == 2
                          else None)(bt.status_json(coord.addr)), 15, interval=0.1,
                 what="two live workers")
    ws = bt.workers_by_id(st)
    daddr = {}
    for wid, w in workers.items():
        da = ws[wid].get("data_address", None)
        logged = w.first_line.split("data-channel=", 1)[1].split()[0]
        bt.check(da and da != ws[wid]["address"] and da == logged and
                 da.startswith("127.0.0.1:") and int(da.rsplit(":", 1)[1]) > 0,
                 "status --json: worker %s has data_address %s (its gRPC address is %s; its log "
                 "says data-channel=%s)" % (wid, da, ws[wid]["address"], logged), ws[wid])
        daddr[wid] = da

    pbm = bd.pb(tmpdir)
    cc = bd.DataClient(tmpdir, coord.addr)
    table = bt.poll(lambda: (lambda t: t if len(t.workers) == 2 else None)(
        cc.placement(NUM_SHARDS)), 15, interval=0.1, what="two workers in the placement")
    bt.check({w.id: w.data_address for w in table.workers} == daddr,
             "the placement table (version %d) carries both data addresses" % table.version,
             table)
    fp = bd.DataClient(tmpdir, workers["w1"].addr)
    fingerprint = fp.describe("npy", [SMALL]).fingerprint
    fp.close()

    # --- valid requests: request order, repeats, exact bytes, one connection for several
    order = [int(i) for i in rng.permutation(len(small))[:40]]
    order = order[:10] + [order[3], order[3]] + order[10:] + [order[0]]
    s = connect(daddr["w1"])
    s.sendall(frame(request(pbm, [SMALL], order, fingerprint=fingerprint)))
    expect_samples(s, small, order, "w1 %s" % SMALL)
    bt.ok("w1: %d shuffled indices of %s with repeats: SAMPLE frames in request order with "
          "numpy's bytes, then END %d" % (len(order), SMALL, len(order)))
    big_order = [8, 0, 4, 4, 7, 1, 2, 3, 5, 6, 0]
    s.sendall(frame(request(pbm, [BIG], big_order)))
    expect_samples(s, big, big_order, "w1 %s on the same connection" % BIG)
    bt.ok("the same connection serves a second request: %d rows of %d bytes of %s" %
          (len(big_order), len(big[0]), BIG))
    for fmt, (sources, rows) in (("tfrecord", tfr), ("tar", tar), ("tfrecord", tiny)):
        idx = [int(i) for i in rng.permutation(len(rows))] * 2 + [0, 0]
        s.sendall(frame(request(pbm, sources, idx, fmt=fmt)))
        expect_samples(s, rows, idx, "w1 %s" % fmt)
        sizes = [len(rows[i]) for i in idx]
        bt.ok("%s (%d files): %d samples of %d..%d bytes in request order, as the generator's "
              "formula says" % (fmt, len(sources), len(idx), min(sizes), max(sizes)))
    # Pipelined: three requests written at once are answered in order.
    reqs = [[5], [], [60, 0, 60] + list(range(30))]
    s.sendall(b"".join(frame(request(pbm, [SMALL], r)) for r in reqs))
    for r in reqs:
        expect_samples(s, small, r, "pipelined request %r" % (r[:5],))
    bt.ok("three pipelined requests (one of them empty: END 0) are answered in order")

    # --- well-formed requests with errors: ERROR frame, the connection keeps serving
    n = len(small)
    s.sendall(frame(request(pbm, [SMALL], [3, n + 4, 1])))
    expect_error(s, BW_OUT_OF_RANGE, ["index %d" % (n + 4), "position 1", "%d samples" % n],
                 "index %d of a %d-sample dataset" % (n + 4, n))
    s.sendall(frame(request(pbm, [SMALL], [2, 9])))
    expect_samples(s, small, [2, 9], "the request after an out-of-range index")
    s.sendall(frame(request(pbm, [SMALL], [1], fingerprint="0123456789abcdef")))
    expect_error(s, BW_MISMATCH, ["fingerprint", "0123456789abcdef", fingerprint],
                 "a wrong fingerprint")
    s.sendall(frame(request(pbm, ["../x.npy"], [0])))
    expect_error(s, BW_PERMISSION_DENIED, ["../x.npy", "data root"], "dataset ../x.npy")
    s.sendall(frame(request(pbm, [SMALL], [7], fingerprint=fingerprint)))
    expect_samples(s, small, [7], "the request after a wrong fingerprint and ../x.npy")
    s.sendall(frame(request(pbm, [SMALL], [0] * ((1 << 20) + 1))))
    expect_error(s, BW_TOO_BIG, ["1048577 indices", "limit"], "a request for 2^20+1 indices")
    # A slow client: the header, then the body in pieces.
    data = frame(request(pbm, [SMALL], [4, 4, 40]))
    for k in (0, 10, 16, 20):
        s.sendall(data[k:{0: 10, 10: 16, 16: 20}.get(k, len(data))])
        time.sleep(0.05)
    expect_samples(s, small, [4, 4, 40], "a request that came in four pieces")
    bt.ok("after four refused requests the connection still serves")

    for wid in workers:
        workers[wid].wait_log(r"placement version %d: 2 live workers" % table.version)
    ids = [w.id for w in table.workers]
    owner = {i: ids[table.owners[i % NUM_SHARDS]] for i in range(n)}
    mine = [i for i in range(n) if owner[i] == "w1"]
    theirs = [i for i in range(n) if owner[i] == "w2"]
    bt.check(mine and theirs, "placement version %d: w1 owns %d and w2 %d of the %d indices "
             "(%d shards, modulo)" % (table.version, len(mine), len(theirs), n, NUM_SHARDS))
    rt = pbm.Routing(placement_version=table.version, num_shards=NUM_SHARDS,
                     shard_mode=pbm.SHARD_MODE_MODULO)
    s.sendall(frame(request(pbm, [SMALL], mine[:5], routing=rt)))
    expect_samples(s, small, mine[:5], "w1's own indices routed by placement version %d" %
                   table.version)
    s.sendall(frame(request(pbm, [SMALL], mine[:2] + theirs[:1], routing=rt)))
    expect_error(s, BW_WRONG_OWNER, ["shard %d of %d" % (theirs[0] % NUM_SHARDS, NUM_SHARDS),
                                     "owned by worker w2", "refresh placement"],
                 "index %d (owned by w2) sent to w1" % theirs[0])
    s.sendall(frame(request(pbm, [SMALL], mine[-3:], routing=rt)))
    expect_samples(s, small, mine[-3:], "the request after a wrong owner")
    s.close()
    s2 = connect(daddr["w2"])
    s2.sendall(frame(request(pbm, [SMALL], theirs, routing=rt)))
    expect_samples(s2, small, theirs, "w2's own %d indices at w2" % len(theirs))
    s2.close()
    bt.ok("each worker serves its own indices under the placement and refuses the other's")

    concurrent_clients(pbm, daddr["w2"], [([SMALL], small), ([BIG], big), tfr, tar, tiny])

    # --- malformed input: an ERROR frame, the connection closed, the worker keeps serving
    malformed = [
        ("GET / HTTP/1.1", b"GET / HTTP/1.1\r\n\r\n", BW_PROTOCOL, ["BWD1"]),
        ("an HTTP/2 (gRPC) client preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", BW_PROTOCOL,
         ["BWD1", "gRPC"]),
        ("request kind 7", frame(request(pbm, [SMALL], [0]), kind=7), BW_PROTOCOL,
         ["kind 7"]),
        ("a header declaring %d bytes" % (MAX_REQUEST + 1), frame(b"", length=MAX_REQUEST + 1),
         BW_TOO_BIG, [str(MAX_REQUEST + 1), "limit"]),
        ("a header declaring 2^64-1 bytes", frame(b"", length=(1 << 64) - 1), BW_TOO_BIG,
         [str((1 << 64) - 1)]),
        ("a body that is not a protobuf", frame(b"\x0a\xff\xff\xff\xff\x0fBWD1"),
         BW_INVALID_ARGUMENT, ["ReadSamplesRequest"]),
        ("an empty body (no dataset)", frame(b""), BW_INVALID_ARGUMENT,
         ["ReadSamplesRequest", "dataset"]),
    ]
    for what, data, code, needles in malformed:
        c = connect(daddr["w1"])
        c.sendall(data)
        expect_error(c, code, needles, what)
        expect_closed(c, what)
        c.close()
    bt.ok("after each malformed request the worker closed the connection")
    # A header, part of the body, then the client goes away.
    body = request(pbm, [SMALL], list(range(50)))
    c = connect(daddr["w1"])
    c.sendall(frame(body)[:16 + len(body) // 2])
    c.close()
    # And a client that leaves in the middle of a header, and one that never reads its
    # answer (the big rows fill the socket buffers) and then resets.
    c = connect(daddr["w1"])
    c.sendall(frame(body)[:9])
    c.close()
    c = connect(daddr["w1"])
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    c.sendall(frame(request(pbm, [BIG], list(range(9)) * 40)))
    time.sleep(0.3)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()
    time.sleep(0.3)
    bt.check(workers["w1"].running() and health(workers["w1"].addr),
             "w1 still running and SERVING (batchwire health) after clients that closed in the "
             "middle of a body, of a header and of a 14 MB answer")
    c = connect(daddr["w1"])
    c.sendall(frame(request(pbm, [SMALL], order)))
    expect_samples(c, small, order, "a fresh connection after the malformed ones")
    c.close()
    st = bt.workers_by_id(bt.status_json(coord.addr))
    bt.check(all(st[w]["state"] == "alive" for w in workers) and
             st["w1"]["incarnation"] == ws["w1"]["incarnation"],
             "w1 keeps serving fresh connections and is still the same live incarnation "
             "(status --json)", st)

    # --- batchwire fetch: the data channel and gRPC give the same batches
    ports = {int(a.rsplit(":", 1)[1]) for a in daddr.values()}
    before = tcp_tuples(ports)
    auto = fetch(coord.addr, "dc-auto", "auto")
    during_auto = tcp_tuples(ports) - before
    grpc = fetch(coord.addr, "dc-grpc", "grpc")
    during_grpc = tcp_tuples(ports) - before - during_auto
    bt.check(during_auto and not during_grpc,
             "--transport auto connected to the workers' data ports (%d sockets in the kernel's "
             "table, TIME_WAIT included), --transport grpc did not" % len(during_auto),
             (during_auto, during_grpc))
    bt.check(len(auto) == 3 * 9 and auto == grpc,
             "batchwire fetch --transport auto and --transport grpc print the same %d batch lines "
             "(epoch, step, indices, bytes, sha256) over 3 epochs" % len(auto),
             "\n".join("%r\n%r" % (a, g) for a, g in zip(auto, grpc) if a != g)[:3000])
    bad = [b for b in auto if b[4] != hashlib.sha256(b"".join(small[i] for i in b[2])).hexdigest()
           or b[3] != sum(len(small[i]) for i in b[2])]
    bt.check(not bad, "every batch's sha256 is that of numpy's rows in batch order", bad[:3])
    r = bt.cli("fetch", "--coordinator", coord.addr, "--job", "dc-bogus", "--dataset",
               "npy:" + SMALL, "--rank", 0, "--world-size", 1, "--transport", "bogus")
    bt.check(r.returncode == 2 and "--transport" in r.stderr and "bogus" in r.stderr and
             not r.stdout, "batchwire fetch --transport bogus exits 2 naming the flag: %s" %
             r.stderr.strip()[:200], r)
    r = bt.cli("fetch", "--coordinator", coord.addr, "--job", "dc-bogus", "--dataset",
               "npy:" + SMALL, "--rank", 0, "--world-size", 1,
               env={"BATCHWIRE_TRANSPORT": "bogus"})
    bt.check(r.returncode == 2 and "BATCHWIRE_TRANSPORT" in r.stderr and "bogus" in r.stderr
             and not r.stdout, "BATCHWIRE_TRANSPORT=bogus batchwire fetch exits 2 naming the "
             "variable: %s" % r.stderr.strip()[:200], r)
    r = bt.cli("fetch", "--coordinator", coord.addr, "--job", "dc-env-grpc", "--dataset",
               "npy:" + SMALL, "--rank", 0, "--world-size", 1, "--batch-size", 7, "--shuffle",
               "--seed", 11, "--epochs", 3, env={"BATCHWIRE_TRANSPORT": "grpc"}, timeout=60)
    bt.check(r.returncode == 0 and
             [json.loads(x)["sha256"] for x in r.stdout.splitlines()[:-1]] == [b[4] for b in auto],
             "BATCHWIRE_TRANSPORT=grpc batchwire fetch gives the same batches", r.stderr)
    python_binding_checks(coord.addr, small)
    cc.close()

    # --- a data port nobody can reach (a firewall, a port not published): that worker is
    # fetched from over gRPC, with one warning, and the batches are the same.
    w3 = bt.worker(tmpdir, coord.addr, "w3", data_root=root,
                   args=["--data-listen", "127.0.0.1:0", "--data-advertise", "127.0.0.1:1"])
    bt.poll(lambda: bt.workers_by_id(bt.status_json(coord.addr)).get("w3", {}).get("state") ==
            "alive", 15, interval=0.1, what="w3 alive")
    r = bt.cli("fetch", "--coordinator", coord.addr, "--job", "dc-fallback", "--dataset",
               "npy:" + SMALL, "--rank", 0, "--world-size", 1, "--batch-size", 7, "--shuffle",
               "--seed", 11, "--epochs", 3, timeout=60)
    warns = [x for x in r.stderr.splitlines() if "data_channel=127.0.0.1:1 " in x]
    bt.check(r.returncode == 0 and
             [json.loads(x)["sha256"] for x in r.stdout.splitlines()[:-1]] == [b[4] for b in auto],
             "with w3's data port unreachable, batchwire fetch gives the same batches", r.stderr)
    bt.check(len(warns) == 1 and "worker=w3" in warns[0] and "over gRPC" in warns[0],
             "... with one warning naming the worker and the fallback: %s" %
             (warns[0] if warns else ""), r.stderr)
    w3.stop()
    # (dead in placement once the coordinator's sweep marks it, which it logs)
    coord.wait_log(r"worker=w3 address=\S+ marked dead", timeout=15)

    # --- a worker restarted on the same ports while a client holds idle connections to it:
    # the first request on each stale connection fails before any byte and is asked again on
    # a new connection -- no failover, and the batches are exact.
    cfg = dict(mode="torch", B=7, shuffle=True, seed=11)
    held = e2e.Fetch(coord.addr, "dc-restart", "npy:" + SMALL, cfg, 0, world=1,
                     extra=["--epochs", 30, "--prefetch", 2, "--log-level", "debug"],
                     gate_after=30)
    bt.poll(lambda: held.batches_seen() >= 30, 30, interval=0.02, what="30 batches")
    time.sleep(0.5)  # the prefetch fills up; the client's connections sit idle
    w1_grpc = workers["w1"].addr
    workers["w1"].stop()
    workers["w1"] = bt.worker(tmpdir, coord.addr, "w1", data_root=root,
                              args=["--listen", w1_grpc, "--data-listen", daddr["w1"]])
    bt.poll(lambda: (lambda w: w["state"] == "alive" and w["data_address"] == daddr["w1"])(
        bt.workers_by_id(bt.status_json(coord.addr))["w1"]), 15, interval=0.05,
        what="w1 alive again on the same data address")
    held.open_gate()
    got, _ = held.ok(60, "the fetch across w1's restart")
    bt.check(equals_plan(got, cfg, small, 30),
             "across w1's restart on the same ports: %d batches equal the plan and numpy's rows"
             % len(got))
    err = held.stderr()
    bt.check("an idle connection was closed" in err and "failed while serving" not in err,
             "the client asked again on new connections (%d times) and failed over to no other "
             "worker" % err.count("an idle connection was closed"), err[-3000:])

    # --- a data port unreachable at first and reachable later (published late, a heal): the
    # client asks that worker over gRPC meanwhile, tries the data channel again 1 s after the
    # first failed connection (doubling while it fails), and uses it again as soon as a
    # connection is made -- one warning for the outage, one line when it is over; the batches
    # are exact throughout (docs/data-channel.md).
    probes = [socket.socket(), socket.socket()]
    for p in probes:
        p.bind(("127.0.0.1", 0))
    d5, late = ["127.0.0.1:%d" % p.getsockname()[1] for p in probes]
    for p in probes:
        p.close()  # nothing listens at `late` until the proxy below starts
    w5 = bt.worker(tmpdir, coord.addr, "w5", data_root=root,
                   args=["--data-listen", d5, "--data-advertise", late])
    bt.poll(lambda: bt.workers_by_id(bt.status_json(coord.addr)).get("w5", {}).get("state") ==
            "alive", 15, interval=0.1, what="w5 alive")
    cfg5 = dict(mode="torch", B=7, shuffle=True, seed=11)
    slow = e2e.Fetch(coord.addr, "dc-late", "npy:" + SMALL, cfg5, 0, world=1,
                     extra=["--epochs", 400, "--log-level", "info"], gate_after=20)
    bt.poll(lambda: slow.batches_seen() >= 20, 30, interval=0.02, what="20 batches")
    time.sleep(1.5)  # the first retry (1 s) fails too: the next comes 2 s after it
    proxy = bt.Daemon("proxy-w5", [sys.executable, os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "faults", "delay_proxy.py"),
        late, d5, 0], tmpdir)
    proxy.wait_listening(15)
    t_up = time.monotonic()
    slow.open_gate()
    bt.poll(lambda: "data_channel=%s reachable again" % late in slow.stderr(), 10, interval=0.05,
            what="the client to use w5's data channel again")
    back_s = time.monotonic() - t_up
    got, _ = slow.ok(120, "the fetch across w5's late data port")
    err = slow.stderr()
    warns = [x for x in err.splitlines() if "data_channel=%s unusable" % late in x]
    bt.check(equals_plan(got, cfg5, small, 400),
             "with w5's data port reachable only later: %d batches equal the plan and numpy's "
             "rows" % len(got))
    bt.check(len(warns) == 1 and "worker=w5" in warns[0] and "trying it again" in warns[0] and
             "failed while serving" not in err,
             "... one warning for the outage (%s), no failover to another worker" %
             (warns[0].split("WARN", 1)[-1][:160] if warns else "none"), err[-3000:])
    bt.check(back_s <= 5.0, "... and the data channel was used again %.2f s after its port "
             "became reachable (retries 1 s, 2 s, 4 s after failures)" % back_s)
    w5.stop()
    proxy.kill9()
    coord.wait_log(r"worker=w5 address=\S+ marked dead", timeout=15)

    # --- a worker at its data-connection limit refuses more connections with BW_UNAVAILABLE
    # (its clients fetch from it over gRPC, not elsewhere), and closes idle connections.
    w4 = bt.worker(tmpdir, coord.addr, "w4", data_root=root,
                   args=["--data-max-connections", 2, "--data-idle-timeout-ms", 1500])
    d4 = bt.poll(lambda: (lambda w: w["data_address"] if w.get("state") == "alive" else None)(
        bt.workers_by_id(bt.status_json(coord.addr)).get("w4", {})), 15, interval=0.05,
        what="w4 alive")
    hold = [connect(d4), connect(d4)]
    for h in hold:  # both are served (so both hold a connection slot)
        h.sendall(frame(request(pbm, [SMALL], [2])))
        expect_samples(h, small, [2], "w4 serves connection %d of its 2" % (hold.index(h) + 1))
    t_idle = time.monotonic()  # both connections idle from here
    extra = connect(d4)
    expect_error(extra, BW_UNAVAILABLE, ["limit of 2 connections"],
                 "a third connection to w4 (--data-max-connections 2)")
    expect_closed(extra, "the refused connection")
    extra.close()
    r = bt.cli("fetch", "--coordinator", coord.addr, "--job", "dc-busy", "--dataset",
               "npy:" + SMALL, "--rank", 0, "--world-size", 1, "--batch-size", 7, "--shuffle",
               "--seed", 11, "--epochs", 3, "--log-level", "info", timeout=60)
    bt.check(r.returncode == 0 and
             [json.loads(x)["sha256"] for x in r.stdout.splitlines()[:-1]] == [b[4] for b in auto],
             "with w4's data channel full, batchwire fetch gives the same batches", r.stderr)
    bt.check("worker=w4 data_channel=" in r.stderr and "over gRPC" in r.stderr and
             "failed while serving" not in r.stderr,
             "... asking w4 over gRPC (a warning), failing over to no other worker", r.stderr)
    for h in hold:
        h.settimeout(10)
        bt.check(h.recv(1) == b"", "w4 closes a connection left idle")
        h.close()
    idle_s = time.monotonic() - t_idle
    bt.check(1.4 < idle_s < 8, "... after --data-idle-timeout-ms 1500 (closed %.1f s after its "
             "last answer)" % idle_s)
    c = connect(d4)
    c.sendall(frame(request(pbm, [SMALL], [3, 4])))
    expect_samples(c, small, [3, 4], "w4 serves a new connection once slots are free")
    c.close()
    w4.stop()
    coord.wait_log(r"worker=w4 address=\S+ marked dead", timeout=15)

    # --- workers without a data channel, and the refusals at start
    # A second coordinator, serving TLS: a worker with --tls-ca talks TLS to it.
    pki = bt.make_pki(tmpdir)
    aux = bt.coordinator(tmpdir, name="coordinator-tls",
                         args=["--heartbeat-ms", 200, "--tls-cert", pki["server_crt"],
                               "--tls-key", pki["server_key"], "--worker-tls-ca", pki["ca"]])
    ca = ["--tls-ca", pki["ca"]]
    tls = ca + ["--tls-cert", pki["worker_crt"], "--tls-key", pki["worker_key"]]
    off = bt.worker(tmpdir, aux.addr, "off", data_root=root, args=ca + ["--data-listen", "off"])
    adv = bt.worker(tmpdir, aux.addr, "adv", data_root=root,
                    args=ca + ["--data-listen", "127.0.0.1:0", "--data-advertise",
                               "data.example:7007"])
    st = bt.poll(lambda: (lambda s: s if sum(w["state"] == "alive" for w in s["workers"]) == 2
                          else None)(bt.status_json(aux.addr, ca)), 15, interval=0.1,
                 what="two live workers at the TLS coordinator")
    ws = bt.workers_by_id(st)
    bt.check(ws["off"]["data_address"] == "" and "data-channel=off" in off.first_line,
             "a worker started with --data-listen off registers data_address \"\"", ws["off"])
    bt.check(ws["adv"]["data_address"] == "data.example:7007",
             "--data-advertise data.example:7007 is the data_address registered", ws["adv"])
    real = adv.first_line.split("listening on ", 1)[1].split()[0]  # the gRPC address
    bt.check(real.startswith("127.0.0.1:"), "adv listens on loopback")
    r = bt.run([bt.WORKER, "--coordinator", aux.addr, "--listen", "127.0.0.1:0", "--data-root",
                root, "--id", "bad", "--data-listen", "nonsense"] + ca, timeout=20)
    bt.check(r.returncode != 0 and "--data-listen nonsense" in r.stderr,
             "--data-listen nonsense refuses to start (exit %d)" % r.returncode, r.stderr)
    for d in (off, adv):
        d.stop()
    for wid in ("off", "adv"):  # out of the placement before the next clients start
        aux.wait_log(r"worker=%s address=\S+ marked dead" % wid, timeout=15)

    # --- the data channel over mutual TLS: the workers' certificate and client-CA rule
    mt = {wid: bt.worker(tmpdir, aux.addr, wid, data_root=root,
                         args=tls + ["--tls-client-ca", pki["ca"]]) for wid in ("t1", "t2")}
    tdaddr = bt.poll(lambda: (lambda s: {w: s[w]["data_address"] for w in mt} if all(
        s.get(w, {}).get("state") == "alive" and s[w]["data_address"] for w in mt) else None)(
        bt.workers_by_id(bt.status_json(aux.addr, ca))), 15, interval=0.1,
        what="t1 and t2 alive with a data channel")
    bt.check(all("(TLS, client certificates required)" in d.first_line and "data-channel=" +
                 tdaddr[w] in d.first_line for w, d in mt.items()),
             "workers serving mutual TLS offer a data channel: %s" % sorted(tdaddr.values()))
    client = ca + ["--tls-cert", pki["client_crt"], "--tls-key", pki["client_key"]]

    def tls_fetch(job, transport, creds, timeout_ms=10000):
        return bt.cli("fetch", "--coordinator", aux.addr, "--job", job, "--dataset",
                      "npy:" + SMALL, "--rank", 0, "--world-size", 1, "--batch-size", 7,
                      "--shuffle", "--seed", 11, "--epochs", 3, "--transport", transport,
                      "--timeout-ms", timeout_ms, *creds, timeout=60)

    tports = {int(a.rsplit(":", 1)[1]) for a in tdaddr.values()}
    before = tcp_tuples(tports)
    r_auto = tls_fetch("tls-auto", "auto", client)
    used = tcp_tuples(tports) - before
    r_grpc = tls_fetch("tls-grpc", "grpc", client)
    shas = lambda r: [json.loads(x)["sha256"] for x in r.stdout.splitlines()[:-1]]
    bt.check(r_auto.returncode == 0 and r_grpc.returncode == 0 and
             shas(r_auto) == shas(r_grpc) == [b[4] for b in auto] and used,
             "over mutual TLS, batchwire fetch --transport auto (through the data channels: %d "
             "connections) and --transport grpc give the plaintext run's batches" % len(used),
             r_auto.stderr + r_grpc.stderr)
    # A plaintext client on a TLS data port gets no frame: the handshake fails, the worker
    # logs it and keeps serving.
    c = connect(tdaddr["t1"])
    c.sendall(frame(request(pbm, [SMALL], [1])))
    c.settimeout(10)
    got = b""
    try:
        while True:
            chunk = c.recv(4096)
            if not chunk:
                break
            got += chunk
    except ConnectionResetError:
        pass
    c.close()
    bt.check(len(got) < 24 or got[0] == 0x15,
             "a plaintext request on t1's TLS data port gets no frame (%d bytes: a TLS alert at "
             "most) and the connection closed" % len(got), got[:64])
    mt["t1"].wait_log(r"data channel: closing the connection peer=\S+ err=TLS handshake",
                      timeout=10)
    # Without a client certificate the workers refuse the data channel (and gRPC): a clear
    # error, not a hang.
    r = tls_fetch("tls-nocert", "auto", ca, timeout_ms=2000)
    bt.check(r.returncode == 1 and "could not be fetched" in r.stderr,
             "without a client certificate, fetch fails with exit 1: %s" %
             (r.stderr.strip().splitlines() or [""])[-1][:300], (r.returncode, r.stdout[-2000:],
                                                                r.stderr))
    bt.check("data channel" in r.stderr and "certificate required" in r.stderr,
             "... and says the worker's data channel required a client certificate", r.stderr)
    r = bt.cli("health", "--addr", mt["t1"].addr, *client)
    bt.check(r.returncode == 0 and "SERVING" in r.stdout, "t1 still SERVING", r.stderr)
    # A worker SIGKILLed under a client reading it over TLS: failover, exact batches, no hang.
    held = e2e.Fetch(aux.addr, "tls-failover", "npy:" + SMALL, cfg, 0, world=1,
                     extra=["--epochs", 30, "--prefetch", 2, "--timeout-ms", 5000,
                            "--log-level", "info"] + client, gate_after=30)
    bt.poll(lambda: held.batches_seen() >= 30, 30, interval=0.02, what="30 batches over TLS")
    held.open_gate()
    mt["t2"].kill9()
    got, _ = held.ok(60, "the TLS fetch across t2's death")
    bt.check(equals_plan(got, cfg, small, 30),
             "t2 SIGKILLed under a TLS data-channel client: %d batches equal the plan and numpy's "
             "rows (%s)" % (len(got), "failed over" if "failed while serving" in held.stderr()
                            else "t2 was not needed after the kill"))
    del mt["t2"]

    # SIGTERM while clients are connected: one idle between requests (w1), one that does not
    # read a large answer, so the worker is blocked sending (w2), one in the middle of a body.
    idle = connect(daddr["w1"])
    idle.sendall(frame(request(pbm, [SMALL], [1])))
    expect_samples(idle, small, [1], "a request before going idle")
    stuck = connect(daddr["w2"])
    stuck.sendall(frame(request(pbm, [BIG], list(range(9)) * 100)))
    half = connect(daddr["w2"])
    half.sendall(frame(request(pbm, [SMALL], [1, 2]))[:20])
    time.sleep(0.3)
    t0 = time.monotonic()
    for d in list(workers.values()) + list(mt.values()) + [aux, coord]:
        d.proc.send_signal(15)
    for d in list(workers.values()) + list(mt.values()) + [aux, coord]:
        rc = d.wait(20)
        bt.check(rc == 0, "%s exits 0 on SIGTERM" % d.name, d.log_text()[-3000:])
    bt.check(time.monotonic() - t0 < 10, "every daemon stopped within %.1fs of SIGTERM, w1 and "
             "w2 with data-channel clients connected (idle, not reading, mid-request)" %
             (time.monotonic() - t0))
    for c in (idle, stuck, half):
        c.close()


if __name__ == "__main__":
    bt.main(test, timeout=120)
