#!/usr/bin/python3
"""The coordinator's Jobs.Session stream (docs/architecture.md, "The session stream") against
a client independent of the C code (python3-grpcio, messages from proto/ by Debian's protoc),
on a coordinator with --auth-tokens:

* commits and heartbeats on one stream are answered in order, by id, and are what the unary
  calls do (the cursor is committed, the lease renewed);
* a commit with a stale lease is answered LEASE_LOST for that message alone, worded as the
  unary call's, and the stream goes on;
* another principal's commit and heartbeat for alice's rank, on bob's own stream, are refused
  per message (PERMISSION_DENIED) and touch nothing; bob's stream then still serves bob;
* a message that is no SessionRequest ends the stream with INVALID_ARGUMENT;
* a flood: 16 streams each sending heartbeats as fast as they can and never reading an
  answer. The coordinator stops reading each after a bounded window (BW_RPC_BIDI_WINDOW), so
  its memory stays bounded (VmRSS grows by less than 64 MiB while the clients send ~tens of
  MB), and a unary heartbeat from another client is answered promptly meanwhile;
* a commit acknowledged on the stream survives kill -9 of the coordinator right after the
  answer.
"""

import os
import queue
import threading
import time

import grpc

import bwpy
import bwtest as bt
import jobs_rpc as jr
from test_auth import write_tokens

pb = jr.pb
S = grpc.StatusCode
# One channel that lives as long as this test and is never used (a channel connects only when
# a call needs it). Debian's python3-grpcio 1.51 destroys its event engine's thread pool when
# the last channel closes; starting a coordinator (a fork) while that pool is shutting down
# aborts the test in thread_pool.cc ("ASSERTION FAILED: state_ == State::kRunning",
# grpc/grpc#31885) -- seen once here, where every channel closes before each of five restarts.
# Only here: a test that forks Python workers (a DataLoader) must not keep grpcio's threads
# running, or under AddressSanitizer a worker can inherit the allocator's lock held.
KEEP_ENGINE = grpc.insecure_channel("127.0.0.1:9")
SESSION = "/batchwire.v1.Jobs/Session"
TOKENS = {
    "alice": ("trainer", "alice-token-0123456789abcdef"),
    "bob": ("trainer", "bob-token-0123456789abcdef"),
}


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Stream:
    """One Jobs.Session stream: send() queues a request, recv() waits for the next answer."""

    def __init__(self, addr, token, raw=False):
        self.ch = grpc.insecure_channel(addr)
        self.q = queue.Queue()
        call = self.ch.stream_stream(
            SESSION, request_serializer=(lambda x: x) if raw else (lambda x: x.SerializeToString()),
            response_deserializer=pb.SessionResponse.FromString)
        self.it = call(iter(self.q.get, None), metadata=[("authorization", "Bearer " + token)])

    def send(self, req):
        self.q.put(req)

    def recv(self):
        return next(self.it)

    def close(self):
        self.q.put(None)
        self.ch.close()


def commit_req(i, job, rank, lease, cur):
    return pb.SessionRequest(id=i, commit=pb.CommitCursorRequest(
        job=job, rank=rank, cursor=cur, **jr.lease_fields(lease)))


def hb_req(i, job, rank, lease):
    return pb.SessionRequest(id=i, heartbeat=pb.LeaseHeartbeatRequest(
        job=job, rank=rank, **jr.lease_fields(lease)))


def test(tmp):
    path = os.path.join(tmp, "principals")
    write_tokens(path, TOKENS)
    # Under ASan, freed memory is kept in quarantine (256 MiB by default): a small one, so that
    # VmRSS measures what the coordinator holds.
    asan = os.environ.get("ASAN_OPTIONS", "")
    coord = bt.coordinator(tmp, args=["--auth-tokens", path, "--lease-ms", "5000"],
                           env={"ASAN_OPTIONS": (asan + ":" if asan else "") +
                                "quarantine_size_mb=4"})
    alice = jr.Jobs(coord.addr, token=TOKENS["alice"][1])
    bob = jr.Jobs(coord.addr, token=TOKENS["bob"][1])
    fp = alice.create("a", world=2).job.fingerprint
    la = jr.lease(alice.join("a", 0, 2))
    bob.create("b", world=1)
    lb = jr.lease(bob.join("b", 0, 1))

    bt.log("===== commits and heartbeats on one stream =====")
    s = Stream(coord.addr, TOKENS["alice"][1])
    s.send(commit_req(1, "a", 0, la, jr.cursor(fp, "a", 0, 2, 0, 5)))
    s.send(hb_req(2, "a", 0, la))
    s.send(commit_req(3, "a", 0, la, jr.cursor(fp, "a", 0, 2, 0, 6)))
    r1, r2, r3 = s.recv(), s.recv(), s.recv()
    bt.check([r.id for r in (r1, r2, r3)] == [1, 2, 3], "three answers, in order, by id")
    bt.check(r1.WhichOneof("result") == "commit" and not r1.error_code, "commit 1 answered", r1)
    bt.check(r2.WhichOneof("result") == "heartbeat" and r2.heartbeat.lease_ms == 5000,
             "the heartbeat renewed the lease (lease_ms 5000)", r2)
    g = alice.get("a")
    bt.check(g.ranks[0].committed and g.ranks[0].step == 6,
             "GetJob shows the cursor committed on the stream (step 6)", g.ranks[0])

    bt.log("===== a stale lease: LEASE_LOST for that message only =====")
    s.send(commit_req(4, "a", 0, (la[0] ^ 1, la[1]), jr.cursor(fp, "a", 0, 2, 0, 7)))
    r4 = s.recv()
    bt.check(r4.id == 4 and r4.error_code == "BW_LEASE_LOST" and r4.WhichOneof("result") is None,
             "a commit with another lease id -> LEASE_LOST", r4)
    unary = alice.expect_error("CommitCursor", pb.CommitCursorRequest(
        job="a", rank=0, cursor=jr.cursor(fp, "a", 0, 2, 0, 7), lease_id=la[0] ^ 1,
        lease_id_hi=la[1]))
    bt.check(unary.bw == "BW_LEASE_LOST" and unary.details == r4.error_message,
             "the same words as the unary call's", (unary.details, r4.error_message))
    s.send(commit_req(5, "a", 0, la, jr.cursor(fp, "a", 0, 2, 0, 8)))
    r5 = s.recv()
    bt.check(r5.id == 5 and not r5.error_code, "the stream goes on: the next commit lands", r5)
    bt.check(alice.get("a").ranks[0].step == 8, "step 8 committed")

    bt.log("===== bob's stream, alice's rank: refused per message =====")
    b = Stream(coord.addr, TOKENS["bob"][1])
    b.send(commit_req(1, "a", 0, la, jr.cursor(fp, "a", 0, 2, 0, 99)))
    b.send(hb_req(2, "a", 0, la))
    b.send(hb_req(3, "b", 0, lb))
    rb = [b.recv() for _ in range(3)]
    bt.check(rb[0].error_code == "BW_PERMISSION_DENIED" and "bob" in rb[0].error_message,
             "bob's commit to alice's job -> PERMISSION_DENIED naming bob", rb[0])
    bt.check(rb[1].error_code == "BW_PERMISSION_DENIED", "bob's heartbeat of alice's rank too", rb[1])
    bt.check(not rb[2].error_code and rb[2].heartbeat.lease_ms == 5000,
             "bob's stream still serves bob's own rank", rb[2])
    bt.check(alice.get("a").ranks[0].step == 8, "alice's cursor is untouched (step 8)")
    b.close()

    bt.log("===== a message that is no SessionRequest ends the stream =====")
    g = Stream(coord.addr, TOKENS["alice"][1], raw=True)
    g.send(b"\xff\xff\xff\xff\xff")
    try:
        g.recv()
        bt.check(False, "garbage was answered")
    except grpc.RpcError as e:
        bt.check(e.code() == S.INVALID_ARGUMENT and "Session" in (e.details() or ""),
                 "garbage -> INVALID_ARGUMENT naming Jobs.Session", e.details())
    g.close()
    nobody = Stream(coord.addr, "not-a-valid-token-0123456789")
    nobody.send(hb_req(1, "a", 0, la))
    try:
        nobody.recv()
        bt.check(False, "a stream without a valid token was answered")
    except grpc.RpcError as e:
        bt.check(e.code() == S.UNAUTHENTICATED, "a wrong token -> UNAUTHENTICATED", e.details())
    nobody.close()

    bt.log("===== a flood of streams that never read their answers =====")
    rss0 = rss_kib(coord.pid)
    stop = threading.Event()
    sent = [0]
    big = pb.RankLive(epoch=1, step=2, epoch_steps=3, batches=4, samples=5, bytes=6, wait_ms=7)
    msg = hb_req(1, "b", 0, lb)
    msg.heartbeat.live.CopyFrom(big)
    msg.heartbeat.job = "b" * 2000  # no such job: each answer is an error, each request 2 KB
    blob = msg.SerializeToString()
    floods = []

    def requests():
        while not stop.is_set():
            sent[0] += 1
            yield blob

    for _ in range(16):
        # No BDP probing: the client's receive window stays at 64 KiB per stream, so that the
        # coordinator's answers, which nobody reads, stall after a few hundred.
        ch = grpc.insecure_channel(coord.addr, options=[("grpc.http2.bdp_probe", 0)])
        call = ch.stream_stream(SESSION, request_serializer=lambda x: x,
                                response_deserializer=lambda x: x)
        floods.append((ch, call(requests(), metadata=[("authorization",
                                                        "Bearer " + TOKENS["bob"][1])])))
    worst_hb, peak = 0.0, rss0
    t_end = time.monotonic() + 6
    while time.monotonic() < t_end:
        t0 = time.monotonic()
        r = bob.heartbeat("b", 0, lb)
        worst_hb = max(worst_hb, time.monotonic() - t0)
        bt.check(r.lease_ms == 5000, "a unary heartbeat during the flood")
        peak = max(peak, rss_kib(coord.pid))
        time.sleep(0.2)
    stop.set()
    bt.ok("flood: %d messages of %d bytes sent on 16 streams (none read); coordinator VmRSS "
          "%d -> %d KiB; slowest unary heartbeat meanwhile %.0f ms"
          % (sent[0], len(blob), rss0, peak, worst_hb * 1e3))
    bt.check(peak - rss0 < 64 << 10, "the coordinator's memory grew by less than 64 MiB "
             "(%d KiB)" % (peak - rss0))
    bt.check(worst_hb < 2.0, "unary heartbeats were answered within 2 s during the flood "
             "(%.0f ms)" % (worst_hb * 1e3))
    for ch, it in floods:
        it.cancel()
        ch.close()
    r = bt.cli("health", "--addr", coord.addr, "--timeout-ms", 5000)
    bt.check(r.returncode == 0 and "SERVING" in r.stdout, "the coordinator is up and serving")

    bt.log("===== commits acknowledged on the stream survive kill -9 =====")
    bob.close()
    for k in range(5):
        step = 70 + k
        s.send(commit_req(6 + k, "a", 0, la, jr.cursor(fp, "a", 0, 2, 3, step)))
        r6 = s.recv()
        coord.kill9()  # right after the answer
        bt.check(r6.id == 6 + k and not r6.error_code, "commit of step %d acknowledged" % step,
                 r6)
        s.close()
        alice.close()
        coord = bt.coordinator(tmp, name="coordinator-%d" % (k + 2), state_dir=coord.state_dir,
                               args=["--auth-tokens", path, "--lease-ms", "5000"])
        alice = jr.Jobs(coord.addr, token=TOKENS["alice"][1])
        rk = alice.get("a").ranks[0]
        bt.check(rk.committed and rk.epoch == 3 and rk.step == step,
                 "after kill -9 and a restart the cursor is epoch 3 step %d" % step, rk)
        s = Stream(coord.addr, TOKENS["alice"][1])
    s.close()
    alice.close()
    coord.stop()

    loader_uses_stream(tmp)


def loader_commits(tmp, args=(), fetch_args=()):
    """A coordinator at debug level (with `args`), a worker and `batchwire fetch --commit` of 30
    steps (with `fetch_args`) against them, checked; returns (the coordinator, stopped; fetch's
    result)."""
    coord = bt.coordinator(tmp, name="coordinator-debug", wait=False,
                           args=["--log-level", "debug", "--lease-ms", "600"] + list(args))
    # At debug level gRPC's own lines come first: the address from the line that names it.
    coord.addr = bt.LISTEN_RE.search(coord.wait_log(r"listening on \S+")[0].group(0)).group(1)
    root = os.path.join(tmp, "data")
    os.makedirs(root, exist_ok=True)
    bt.worker(tmp, coord.addr, "w1", data_root=root)
    r = bt.cli("gen", "--format", "npy", "--out", os.path.join(root, "ds"), "--num-samples", 400,
               "--sample-bytes", 16, timeout=60)
    bt.check(r.returncode == 0, "gen a dataset", r.stderr)
    bt.poll(lambda: any(w["state"] == "alive" for w in bt.status_json(coord.addr)["workers"]),
            15, what="a live worker")
    r = bt.run([bt.CLI, "fetch", "--coordinator", coord.addr, "--job", "loader", "--dataset",
                "npy:ds/part-00000.npy", "--rank", "0", "--world-size", "1", "--batch-size", "4",
                "--commit", "--commit-every", "1", "--max-steps", "30", *fetch_args], timeout=60)
    bt.check(r.returncode == 0, "batchwire fetch --commit read 30 steps", r.stderr)
    rk = jr.Jobs(coord.addr).get("loader").ranks[0]
    bt.check(rk.committed and rk.step == 30, "its last commit is step 30", rk)
    coord.stop()
    for who, text in (("batchwire fetch", r.stderr), ("the coordinator", coord.log_text())):
        bt.check("Sanitizer" not in text and "runtime error" not in text,
                 "%s reported no sanitizer error" % who, text[-3000:])
    return coord, r


def loader_uses_stream(tmp):
    """`batchwire fetch --commit` (a Loader's session) commits and heartbeats on the stream."""
    bt.log("===== a Loader's session commits on the stream =====")
    coord, _ = loader_commits(tmp)
    ends = [line for line in coord.log_text().splitlines()
            if "stream ended method=Jobs.Session" in line]
    bt.check(len(ends) == 1 and "code=BW_OK" in ends[0] and
             int(ends[0].split("messages=")[1].split()[0]) >= 30,
             "the coordinator answered its 30 commits (and heartbeats) on one Jobs.Session "
             "stream, which ended cleanly", ends)


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=240)
