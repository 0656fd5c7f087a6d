#!/usr/bin/python3
"""The coordinator's commit channel (--commit-listen; server/commit_channel.h, docs/operating.md
"Commit channel") against a client independent of the C code (Python sockets and ssl, messages
from proto/ by Debian's protoc), on coordinators with --auth-tokens:

* commits and heartbeats sent pipelined on one connection are answered by id with the Session
  stream's answers, and do what the unary calls do (GetJob shows the cursor, JoinJob after a
  release resumes from it);
* a commit with a stale lease (fenced) is answered LEASE_LOST, in the unary call's words, and
  the connection goes on; another principal's commit is refused PERMISSION_DENIED;
* a wrong token, no hello, and a trainer-less role are refused; the coordinator goes on;
* a malformed frame (bad magic), an oversized frame, an unknown kind and a body that is no
  SessionRequest each get an ERROR frame and a closed connection; the coordinator stays up;
* TLS: the same, over TLS with the coordinator's certificate, verified against the test CA;
* a commit acknowledged on the channel survives kill -9 of the coordinator right after the
  answer;
* a Loader's session (`batchwire fetch --commit`) commits and heartbeats on the channel the
  coordinator announces in JoinJob, not on the Jobs.Session stream; when that channel cannot be
  reached at the host the session reached the coordinator at, it says so once and commits on
  the Jobs.Session stream instead, every commit answered.
"""

import os
import signal
import socket
import ssl
import struct
import tempfile

import re

import bwpy
import bwtest as bt
import jobs_rpc as jr
from test_auth import write_tokens
from test_session_stream import commit_req, hb_req, loader_commits

pb = jr.pb
TOKENS = {
    "alice": ("trainer", "alice-token-0123456789abcdef"),
    "bob": ("trainer", "bob-token-0123456789abcdef"),
    "wrk": ("worker", "wrk-token-0123456789abcdef"),
}
MAGIC = 0x31445742
AUTH, SESSION = 3, 5
END, ERROR, ANSWER = 2, 3, 6


class Chan:
    """One commit-channel connection: hello(), send() a SessionRequest, recv() a frame."""

    def __init__(self, addr, ctx=None):
        host, port = addr.rsplit(":", 1)
        self.s = socket.create_connection((host, int(port)), timeout=10)
        if ctx:
            self.s = ctx.wrap_socket(self.s, server_hostname="localhost")

    def frame(self, kind, body, magic=MAGIC, length=None):
        self.s.sendall(struct.pack("<IIQ", magic, kind, len(body) if length is None else length)
                       + body)

    def hello(self, token):
        self.frame(AUTH, token.encode())
        return self.recv()

    def send(self, req):
        self.frame(SESSION, req.SerializeToString())

    def _read(self, n):
        b = b""
        while len(b) < n:
            chunk = self.s.recv(n - len(b))
            if not chunk:
                raise EOFError("closed after %d of %d bytes" % (len(b), n))
            b += chunk
        return b

    def recv(self):
        """(type, code, a, b, body); an ANSWER's body decoded as a SessionResponse."""
        t, code, a, b = struct.unpack("<IiQQ", self._read(24))
        body = self._read(a) if t in (ERROR, ANSWER) else b""
        if t == ANSWER:
            body = pb.SessionResponse.FromString(body)
        elif t == ERROR:
            body = body.decode()
        return t, code, a, b, body

    def closed(self):
        try:
            return self.s.recv(1) == b""
        except (ConnectionError, ssl.SSLError):
            return True

    def close(self):
        self.s.close()


def _codes():
    """Batchwire error names to numbers, from the X-macro list of include/batchwire/batchwire.h."""
    with open(os.path.join(jr.SOURCE_DIR, "include", "batchwire", "batchwire.h")) as f:
        return {"BW_" + m.group(1): int(m.group(2))
                for m in re.finditer(r"X\((\w+),\s*(-?\d+),", f.read())}


CODE = _codes()


def start(tmp, tokens_path, name, state_dir=None, tls=None):
    args = ["--auth-tokens", tokens_path, "--lease-ms", "5000", "--commit-listen", "127.0.0.1:0"]
    if tls:
        args += ["--tls-cert", tls["server_crt"], "--tls-key", tls["server_key"]]
    coord = bt.coordinator(tmp, name=name, state_dir=state_dir, args=args)
    m = coord.wait_log(r"commit channel on (\S+) \((TLS|plaintext)\)")[0]
    coord.cchan = m.group(1)
    return coord


def code_of(name):
    return CODE[name]


def refused(ch, code, words, what):
    t, c, _, _, msg = ch.recv()
    bt.check(t == ERROR and c == code and words in msg, what, (t, c, msg))
    bt.check(ch.closed(), what + ": the connection is closed")
    ch.close()


def test(tmp):
    path = os.path.join(tmp, "principals")
    write_tokens(path, TOKENS)
    coord = start(tmp, path, "coordinator")

    bt.log("===== a second coordinator on the same commit port =====")
    r = bt.run([bt.COORDINATOR, "--listen", "127.0.0.1:0", "--state-dir",
                tempfile.mkdtemp(prefix="state-", dir=tmp), "--commit-listen", coord.cchan],
               timeout=30)
    bt.check(r.returncode != 0 and "--commit-listen" in r.stderr and "in use" in r.stderr,
             "a coordinator whose --commit-listen address is taken exits naming the flag",
             (r.returncode, r.stderr[-600:]))
    alice = jr.Jobs(coord.addr, token=TOKENS["alice"][1])
    bob = jr.Jobs(coord.addr, token=TOKENS["bob"][1])
    fp = alice.create("a", world=2).job.fingerprint
    la = jr.lease(alice.join("a", 0, 2))

    bt.log("===== pipelined commits and a heartbeat on one connection =====")
    ch = Chan(coord.cchan)
    t, code, _, _, _ = ch.hello(TOKENS["alice"][1])
    bt.check(t == END and code == 0, "the hello is answered END", (t, code))
    for i in range(1, 9):
        ch.send(commit_req(i, "a", 0, la, jr.cursor(fp, "a", 0, 2, 0, 10 + i)))
    ch.send(hb_req(9, "a", 0, la))
    got = {}
    for _ in range(9):
        t, _, _, b, r = ch.recv()
        bt.check(t == ANSWER and b == r.id, "an ANSWER frame carrying its id", (t, b, r))
        got[r.id] = r
    bt.check(sorted(got) == list(range(1, 10)), "nine answers, one per request", sorted(got))
    bt.check(all(got[i].WhichOneof("result") == "commit" and not got[i].error_code
                 for i in range(1, 9)), "eight commits acknowledged", got)
    bt.check(got[9].WhichOneof("result") == "heartbeat" and got[9].heartbeat.lease_ms == 5000,
             "the heartbeat renewed the lease (lease_ms 5000)", got[9])
    rk = alice.get("a").ranks[0]
    bt.check(rk.committed and rk.step == 18, "GetJob shows the last commit (step 18)", rk)
    alice.call("LeaveJob", pb.LeaveJobRequest(job="a", rank=0, **jr.lease_fields(la)))
    j = alice.join("a", 0, 2)
    c = jr.decode_cursor(j.cursor)
    bt.check(c.step == 18, "JoinJob after leaving resumes from the channel's commit (step 18)", c)
    la_old, la = la, jr.lease(j)

    bt.log("===== a fenced lease: LEASE_LOST for that commit, as the unary call says =====")
    ch.send(commit_req(20, "a", 0, la_old, jr.cursor(fp, "a", 0, 2, 0, 30)))
    _, _, _, _, r = ch.recv()
    unary = alice.expect_error("CommitCursor", pb.CommitCursorRequest(
        job="a", rank=0, cursor=jr.cursor(fp, "a", 0, 2, 0, 30), **jr.lease_fields(la_old)))
    bt.check(r.id == 20 and r.error_code == "BW_LEASE_LOST" and r.WhichOneof("result") is None,
             "a commit with the released lease -> LEASE_LOST", r)
    bt.check(unary.bw == "BW_LEASE_LOST" and unary.details == r.error_message,
             "the same words as the unary call's", (unary.details, r.error_message))
    ch.send(commit_req(21, "a", 0, la, jr.cursor(fp, "a", 0, 2, 0, 31)))
    _, _, _, _, r = ch.recv()
    bt.check(r.id == 21 and not r.error_code, "the connection goes on: the next commit lands", r)
    ch.close()

    bt.log("===== bob's connection, alice's rank =====")
    b = Chan(coord.cchan)
    b.hello(TOKENS["bob"][1])
    b.send(commit_req(1, "a", 0, la, jr.cursor(fp, "a", 0, 2, 0, 99)))
    _, _, _, _, r = b.recv()
    bt.check(r.error_code == "BW_PERMISSION_DENIED" and "bob" in r.error_message,
             "bob's commit to alice's job -> PERMISSION_DENIED naming bob", r)
    b.close()
    bt.check(alice.get("a").ranks[0].step == 31, "alice's cursor is untouched (step 31)")

    bt.log("===== refused connections; the coordinator goes on =====")
    ch = Chan(coord.cchan)
    ch.frame(AUTH, b"not-a-valid-token-0123456789")
    refused(ch, code_of("BW_UNAUTHENTICATED"), "", "a wrong token -> UNAUTHENTICATED")
    ch = Chan(coord.cchan)
    ch.frame(AUTH, b"")
    refused(ch, code_of("BW_UNAUTHENTICATED"), "", "no token -> UNAUTHENTICATED")
    ch = Chan(coord.cchan)
    ch.send(commit_req(1, "a", 0, la, jr.cursor(fp, "a", 0, 2, 0, 40)))
    refused(ch, code_of("BW_UNAUTHENTICATED"), "before the hello",
            "a commit without a hello -> UNAUTHENTICATED")
    ch = Chan(coord.cchan)
    ch.frame(AUTH, TOKENS["wrk"][1].encode())
    refused(ch, code_of("BW_PERMISSION_DENIED"), "", "a worker principal -> PERMISSION_DENIED")

    bt.log("===== malformed and oversized frames =====")
    for what, send, code, words in (
            ("bad magic", lambda c: c.frame(SESSION, b"x", magic=0x12345678), "BW_PROTOCOL", ""),
            ("an oversized frame", lambda c: c.frame(SESSION, b"", length=1 << 20), "BW_TOO_BIG",
             "over the limit"),
            ("an unknown kind", lambda c: c.frame(77, b""), "BW_PROTOCOL", "unknown"),
            ("a body that is no SessionRequest", lambda c: c.frame(SESSION, b"\xff" * 5),
             "BW_INVALID_ARGUMENT", "no SessionRequest"),
            ("an empty SessionRequest", lambda c: c.frame(SESSION, b""), "BW_INVALID_ARGUMENT",
             "carries no request")):
        ch = Chan(coord.cchan)
        ch.hello(TOKENS["alice"][1])
        send(ch)
        refused(ch, code_of(code), words, "%s -> %s, connection closed" % (what, code))
    ch = Chan(coord.cchan)
    ch.hello(TOKENS["alice"][1])
    ch.send(commit_req(50, "a", 0, la, jr.cursor(fp, "a", 0, 2, 0, 50)))
    _, _, _, _, r = ch.recv()
    bt.check(coord.running() and not r.error_code, "the coordinator still serves commits", r)
    ch.close()

    bt.log("===== a token removed on SIGHUP stops working on an open connection =====")
    ch = Chan(coord.cchan)
    ch.hello(TOKENS["alice"][1])
    write_tokens(path, {k: v for k, v in TOKENS.items() if k != "alice"})
    coord.send(signal.SIGHUP)
    coord.wait_log(r"reloaded --auth-tokens", count=1)
    ch.send(commit_req(55, "a", 0, la, jr.cursor(fp, "a", 0, 2, 0, 55)))
    refused(ch, code_of("BW_UNAUTHENTICATED"), "not valid",
            "alice's next commit after her token was removed -> UNAUTHENTICATED")
    write_tokens(path, TOKENS)
    coord.send(signal.SIGHUP)
    coord.wait_log(r"reloaded --auth-tokens", count=2)
    bt.check(alice.get("a").ranks[0].step == 50, "the refused commit changed nothing (step 50)")

    bt.log("===== kill -9 right after an answer: the commit is durable =====")
    for k in range(8):  # a wrong order (answer, then write) loses some of 8
        step = 60 + k
        ch = Chan(coord.cchan)
        ch.hello(TOKENS["alice"][1])
        ch.send(commit_req(60 + k, "a", 0, la, jr.cursor(fp, "a", 0, 2, 1, step)))
        _, _, _, _, r = ch.recv()
        coord.kill9()  # right after the answer
        bt.check(not r.error_code, "commit of step %d acknowledged" % step, r)
        ch.close()
        alice.close()
        coord = start(tmp, path, "coordinator-%d" % (k + 2), state_dir=coord.state_dir)
        alice = jr.Jobs(coord.addr, token=TOKENS["alice"][1])
        rk = alice.get("a").ranks[0]
        bt.check(rk.committed and rk.epoch == 1 and rk.step == step,
                 "after kill -9 and a restart the cursor is epoch 1 step %d" % step, rk)
    alice.close()
    bob.close()
    coord.stop()
    bt.check("Sanitizer" not in coord.log_text(), "no sanitizer report", coord.log_text()[-3000:])

    bt.log("===== TLS, with the coordinator's certificate =====")
    pki = bt.make_pki(tmp)
    coord = start(tmp, path, "coordinator-tls", tls=pki)
    ctx = ssl.create_default_context(cafile=pki["ca"])
    ch = Chan(coord.cchan, ctx)
    t, _, _, _, _ = ch.hello(TOKENS["alice"][1])
    bt.check(t == END, "the hello over TLS is answered END", t)
    ch.send(hb_req(1, "nosuchjob", 0, la))
    _, _, _, _, r = ch.recv()
    bt.check(r.id == 1 and r.error_code == "BW_NOT_FOUND", "a heartbeat over TLS is answered "
             "(NOT_FOUND for a job that is not there)", r)
    ch.close()
    plain = Chan(coord.cchan)
    plain.frame(AUTH, TOKENS["alice"][1].encode())
    bt.check(plain.closed(), "a plaintext hello to the TLS channel gets no answer")
    plain.close()
    rogue = ssl.create_default_context(cafile=pki["rogue_ca"])
    try:
        Chan(coord.cchan, rogue).hello(TOKENS["alice"][1])
        bt.check(False, "a client trusting another CA completed the handshake")
    except ssl.SSLError as e:
        bt.ok("a client that trusts another CA refuses the coordinator: %s" % e)
    bt.check(coord.running(), "the coordinator is up after the TLS refusals")
    coord.stop()

    loader_uses_channel(tmp)
    loader_falls_back(tmp)


def loader_falls_back(tmp):
    """A channel the session cannot reach: the session says so and commits on the stream."""
    bt.log("===== a Loader's session falls back to the stream =====")
    # The channel listens on 127.0.0.2 only; the session reached the coordinator at
    # 127.0.0.1, so its connection to the announced port there is refused.
    coord, r = loader_commits(tmp, ["--commit-listen", "127.0.0.2:0"],
                              ["--log-level", "info"])
    said = [ln for ln in r.stderr.splitlines() if "commit channel" in ln]
    bt.check(len(said) == 1 and "cannot be used" in said[0],
             "the session said once that the commit channel cannot be used", said)
    ends = [ln for ln in coord.log_text().splitlines()
            if "stream ended method=Jobs.Session" in ln]
    bt.check(len(ends) == 1 and "code=BW_OK" in ends[0] and
             int(ends[0].split("messages=")[1].split()[0]) >= 30,
             "the coordinator answered the 30 commits on one Jobs.Session stream", ends)


def loader_uses_channel(tmp):
    """`batchwire fetch --commit` (a Loader's session) commits on the announced channel."""
    bt.log("===== a Loader's session commits on the commit channel =====")
    coord, _ = loader_commits(tmp, ["--commit-listen", "127.0.0.1:0"])
    text = coord.log_text()
    closed = re.findall(r"commit channel: connection closed .*answered=(\d+)", text)
    bt.check(len(closed) == 1 and int(closed[0]) >= 30,
             "the coordinator answered the 30 commits (and heartbeats) on one commit-channel "
             "connection", closed)
    bt.check("stream ended method=Jobs.Session" not in text,
             "no Jobs.Session stream was opened", [ln for ln in text.splitlines()
                                                   if "Jobs.Session" in ln][:5])


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=180)
