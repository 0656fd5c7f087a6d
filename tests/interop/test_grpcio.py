"""Interop: an independent gRPC client (python3-grpcio) against a running coordinator and worker.

No generated stubs: methods are called by path with raw bytes, and the few messages needed are
encoded / decoded here by hand from the field numbers in proto/batchwire.proto and
proto/health.proto.

Checks: unknown methods -> UNIMPLEMENTED promptly; the standard health check -> SERVING
(unknown service -> NOT_FOUND); Info -> the role, id, address, pid; a RegisterWorker /
Heartbeat / ListWorkers round trip; malformed request bytes -> INVALID_ARGUMENT with a message;
invalid worker ids -> INVALID_ARGUMENT naming the id; a request over --max-message-bytes ->
RESOURCE_EXHAUSTED; after every error the daemon still answers. Also TLS and mutual TLS with
grpcio's own TLS client.
"""

import os
import sys
import time

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
import bwtest as bt  # noqa: E402

MAX_MSG = 65536
HEARTBEAT_MS = 300
DEADLINE = 10.0   # per call
PROMPT = 2.0      # an error answer must come well before the deadline

ROLE_COORDINATOR, ROLE_WORKER = 1, 2
SERVING = 1
WORKER_STATE_ALIVE = 1


# ---------------------------------------------------------------------------
# protobuf wire format, by hand

def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def f_varint(field, n):
    return varint(field << 3 | 0) + varint(n)


def f_bytes(field, data):
    if isinstance(data, str):
        data = data.encode()
    return varint(field << 3 | 2) + varint(len(data)) + data


def decode(buf):
    """{field: [values]}; varints as int, length-delimited as bytes. Raises on bad input."""
    out = {}
    i = 0

    def rd_varint():
        nonlocal i
        shift = n = 0
        while True:
            if i >= len(buf):
                raise ValueError("truncated varint")
            b = buf[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return n
    while i < len(buf):
        key = rd_varint()
        field, wt = key >> 3, key & 7
        if wt == 0:
            v = rd_varint()
        elif wt == 2:
            ln = rd_varint()
            if i + ln > len(buf):
                raise ValueError("truncated field %d" % field)
            v = bytes(buf[i:i + ln])
            i += ln
        elif wt == 1:
            v = bytes(buf[i:i + 8])
            i += 8
        elif wt == 5:
            v = bytes(buf[i:i + 4])
            i += 4
        else:
            raise ValueError("wire type %d" % wt)
        out.setdefault(field, []).append(v)
    return out


def one(msg, field, default=None):
    return msg.get(field, [default])[-1]


def s(msg, field):
    return one(msg, field, b"").decode()


# ---------------------------------------------------------------------------

def call(ch, path, payload, timeout=DEADLINE):
    """Unary call with raw bytes; returns (code, details, response bytes, seconds)."""
    fn = ch.unary_unary(path, request_serializer=None, response_deserializer=None)
    t = time.monotonic()
    try:
        resp = fn(payload, timeout=timeout)
        return grpc.StatusCode.OK, "", resp, time.monotonic() - t
    except grpc.RpcError as e:
        return e.code(), e.details() or "", None, time.monotonic() - t


def expect_ok(ch, path, payload, what):
    code, det, resp, el = call(ch, path, payload)
    bt.check(code == grpc.StatusCode.OK, "%s: OK in %.3fs" % (what, el), "%s: %s" % (code, det))
    return decode(resp)


def expect_err(ch, path, payload, want, what, needles=()):
    code, det, _resp, el = call(ch, path, payload)
    bt.check(code == want and el < PROMPT,
             "%s: %s in %.3fs (deadline %.0fs): %r" % (what, want.name, el, DEADLINE, det[:160]),
             "got %s after %.3fs: %r" % (code, el, det))
    for n in needles:
        bt.check_in(n, det, "  ... the message")
    return det


def health(ch, what, service=""):
    m = expect_ok(ch, "/grpc.health.v1.Health/Check",
                  f_bytes(1, service) if service else b"", what)
    bt.check(one(m, 1, 0) == SERVING, "%s: status SERVING" % what, m)


def register_req(wid, address="127.0.0.1:1", incarnation=1, version="grpcio-test"):
    caps = f_varint(2, MAX_MSG) + f_bytes(3, version) + f_bytes(1, "npy")
    return (f_bytes(1, wid) + f_bytes(2, address) + f_bytes(3, caps) +
            f_varint(4, incarnation))


def list_workers(ch, what):
    m = expect_ok(ch, "/batchwire.v1.Coordinator/ListWorkers", b"", what)
    ws = {}
    for raw in m.get(1, []):
        w = decode(raw)
        ws[s(w, 1)] = w
    return m, ws


# ---------------------------------------------------------------------------

def test_plaintext(tmp):
    coord = bt.coordinator(tmp, args=["--max-message-bytes", MAX_MSG,
                                      "--heartbeat-ms", HEARTBEAT_MS, "--dead-after", 3])
    worker = bt.worker(tmp, coord.addr, "interop-w1", args=["--max-message-bytes", MAX_MSG])
    coord.wait_log(r"worker=interop-w1 address=\S+ peer=\S+ registered")
    bt.ok("coordinator %s and worker %s are up; the worker registered" % (coord.addr, worker.addr))
    cch = grpc.insecure_channel(coord.addr)
    wch = grpc.insecure_channel(worker.addr)
    grpc.channel_ready_future(cch).result(timeout=DEADLINE)
    grpc.channel_ready_future(wch).result(timeout=DEADLINE)
    try:
        targets = [("coordinator", coord, cch), ("worker", worker, wch)]

        bt.log("--- health ---")
        for name, _d, ch in targets:
            health(ch, "%s Health/Check (empty request)" % name)
        health(cch, "coordinator Health/Check service=batchwire.v1.Coordinator",
               "batchwire.v1.Coordinator")
        health(wch, "worker Health/Check service=batchwire.v1.Worker", "batchwire.v1.Worker")
        for name, _d, ch in targets:
            expect_err(ch, "/grpc.health.v1.Health/Check", f_bytes(1, "no.such.Service"),
                       grpc.StatusCode.NOT_FOUND, "%s Health/Check unknown service" % name,
                       ["no.such.Service"])

        bt.log("--- unknown methods ---")
        for name, _d, ch in targets:
            for path in ("/batchwire.v1.Coordinator/NoSuchMethod", "/foo.Bar/Baz",
                         "/batchwire.v1.Worker/NoSuchMethod"):
                expect_err(ch, path, b"", grpc.StatusCode.UNIMPLEMENTED,
                           "%s %s" % (name, path))
        expect_err(wch, "/batchwire.v1.Coordinator/ListWorkers", b"",
                   grpc.StatusCode.UNIMPLEMENTED, "worker /batchwire.v1.Coordinator/ListWorkers")
        expect_err(cch, "/batchwire.v1.Worker/Info", b"", grpc.StatusCode.UNIMPLEMENTED,
                   "coordinator /batchwire.v1.Worker/Info")

        bt.log("--- Info ---")
        m = expect_ok(cch, "/batchwire.v1.Coordinator/Info", b"", "coordinator Info")
        bt.check(one(m, 1) == ROLE_COORDINATOR and s(m, 3) == "" and
                 s(m, 4) == coord.addr and one(m, 6) == coord.pid and s(m, 2) != "" and
                 s(m, 7) != "",
                 "coordinator Info: role=COORDINATOR, no id, listen_address=%s, pid=%d, "
                 "version=%s, hostname=%s" % (s(m, 4), coord.pid, s(m, 2), s(m, 7)), m)
        version = s(m, 2)
        m = expect_ok(wch, "/batchwire.v1.Worker/Info", b"", "worker Info")
        bt.check(one(m, 1) == ROLE_WORKER and s(m, 3) == "interop-w1" and
                 s(m, 4) == worker.addr and one(m, 6) == worker.pid and s(m, 2) == version,
                 "worker Info: role=WORKER, id=interop-w1, listen_address=%s, pid=%d, "
                 "version=%s" % (s(m, 4), worker.pid, s(m, 2)), m)

        bt.log("--- membership round trip ---")
        m = expect_ok(cch, "/batchwire.v1.Coordinator/RegisterWorker",
                      register_req("grpcio-fake", "127.0.0.1:9", incarnation=77),
                      "RegisterWorker grpcio-fake")
        bt.check(one(m, 1) == HEARTBEAT_MS and one(m, 2) == 3,
                 "RegisterWorker answers heartbeat_interval_ms=%d missed_heartbeats_dead=3" %
                 HEARTBEAT_MS, m)
        m = expect_ok(cch, "/batchwire.v1.Coordinator/Heartbeat",
                      f_bytes(1, "grpcio-fake") + f_varint(2, 77), "Heartbeat grpcio-fake")
        bt.check(one(m, 1, 0) == 1 and one(m, 2) == HEARTBEAT_MS,
                 "Heartbeat of the registered incarnation: known=true", m)
        m = expect_ok(cch, "/batchwire.v1.Coordinator/Heartbeat",
                      f_bytes(1, "never-registered") + f_varint(2, 5), "Heartbeat unknown id")
        bt.check(one(m, 1, 0) == 0, "Heartbeat of an unknown id: known=false", m)
        expect_err(cch, "/batchwire.v1.Coordinator/Heartbeat",
                   f_bytes(1, "grpcio-fake") + f_varint(2, 78), grpc.StatusCode.ALREADY_EXISTS,
                   "Heartbeat with another incarnation of grpcio-fake", ["grpcio-fake"])
        top, ws = list_workers(cch, "ListWorkers")
        fake = ws.get("grpcio-fake")
        bt.check(fake is not None and s(fake, 2) == "127.0.0.1:9" and
                 one(fake, 3) == WORKER_STATE_ALIVE and one(fake, 6) == 77,
                 "ListWorkers has grpcio-fake alive at 127.0.0.1:9 with incarnation 77", ws)
        caps = decode(one(fake, 5, b""))
        bt.check([c.decode() for c in caps.get(1, [])] == ["npy"] and
                 one(caps, 2) == MAX_MSG and s(caps, 3) == "grpcio-test",
                 "  ... with the capabilities sent (formats [npy], max_message_bytes, version)",
                 caps)
        w1 = ws.get("interop-w1")
        bt.check(w1 is not None and s(w1, 2) == worker.addr and
                 one(w1, 3) == WORKER_STATE_ALIVE,
                 "ListWorkers has the real worker interop-w1 alive at %s" % worker.addr, ws)
        bt.check(one(top, 2) == HEARTBEAT_MS and one(top, 3) == 3,
                 "ListWorkers reports the heartbeat settings", top)

        bt.log("--- malformed requests ---")
        malformed = [
            (b"\x0a\x10abc", "a length past the end"),
            (b"\xff\xff\xff", "a truncated varint key"),
            (b"\x08", "a key without its value"),
        ]
        for path in ("/batchwire.v1.Coordinator/ListWorkers",
                     "/batchwire.v1.Coordinator/RegisterWorker",
                     "/batchwire.v1.Coordinator/Heartbeat", "/batchwire.v1.Coordinator/Info"):
            for payload, why in malformed:
                det = expect_err(cch, path, payload, grpc.StatusCode.INVALID_ARGUMENT,
                                 "coordinator %s with %s" % (path.rsplit("/", 1)[1], why))
                bt.check(det.strip() != "", "  ... with a non-empty message", det)
        # A field of the wrong wire type (id as a varint).
        expect_err(cch, "/batchwire.v1.Coordinator/RegisterWorker", f_varint(1, 5),
                   grpc.StatusCode.INVALID_ARGUMENT, "RegisterWorker with id as a varint")
        for path in ("/batchwire.v1.Worker/Info", "/grpc.health.v1.Health/Check"):
            expect_err(wch, path, b"\x0a\x10abc", grpc.StatusCode.INVALID_ARGUMENT,
                       "worker %s with a length past the end" % path)
        for name, _d, ch in targets:
            health(ch, "%s still answers after malformed requests" % name)

        bt.log("--- invalid worker ids ---")
        for wid, needle in (("", "worker id"), ("bad id", "'bad id'"), ("tab\tid", "worker id"),
                            ("x" * 256, "worker id"), ("del\x7fid", "control character")):
            expect_err(cch, "/batchwire.v1.Coordinator/RegisterWorker", register_req(wid),
                       grpc.StatusCode.INVALID_ARGUMENT, "RegisterWorker id=%r" % wid[:20],
                       [needle])
        expect_err(cch, "/batchwire.v1.Coordinator/RegisterWorker",
                   register_req("good-id", address=""), grpc.StatusCode.INVALID_ARGUMENT,
                   "RegisterWorker with an empty address", ["address"])
        _top, ws = list_workers(cch, "ListWorkers after the invalid registrations")
        bt.check(set(ws) == {"interop-w1", "grpcio-fake"},
                 "no invalid registration was recorded (ids: %s)" % sorted(ws), ws)

        bt.log("--- message size limit (--max-message-bytes %d) ---" % MAX_MSG)
        big = f_bytes(15, b"\0" * (100 * 1024))           # unknown field: ~100 KiB
        near = f_bytes(15, b"\0" * (MAX_MSG - 1024))        # under the limit
        expect_ok(cch, "/batchwire.v1.Coordinator/ListWorkers", near,
                  "coordinator ListWorkers with a %d-byte request (under the limit)" % len(near))
        for name, _d, ch, path in (
                ("coordinator", None, cch, "/batchwire.v1.Coordinator/ListWorkers"),
                ("coordinator", None, cch, "/batchwire.v1.Coordinator/RegisterWorker"),
                ("worker", None, wch, "/batchwire.v1.Worker/Info"),
                ("worker", None, wch, "/grpc.health.v1.Health/Check")):
            expect_err(ch, path, big, grpc.StatusCode.RESOURCE_EXHAUSTED,
                       "%s %s with a %d-byte request" % (name, path.rsplit("/", 1)[1], len(big)))
        for name, _d, ch in targets:
            health(ch, "%s still answers after oversized requests" % name)
        _top, ws = list_workers(cch, "ListWorkers at the end")
        bt.check(one(ws["interop-w1"], 3) == WORKER_STATE_ALIVE,
                 "the real worker is still alive in ListWorkers", ws)
    finally:
        cch.close()
        wch.close()
    for d in (worker, coord):
        bt.check(d.running(), "%s is still running" % d.name, d.log_text())
        bt.check(d.stop() == 0, "%s exits 0 on SIGTERM" % d.name, d.log_text())


def test_tls(tmp):
    bt.log("--- grpcio's TLS client against a mutual-TLS coordinator ---")
    pki = bt.make_pki(tmp)

    def rd(p):
        with open(p, "rb") as f:
            return f.read()
    coord = bt.coordinator(tmp, name="coordinator-mtls",
                           args=["--tls-cert", pki["server_crt"], "--tls-key", pki["server_key"],
                                 "--tls-client-ca", pki["ca"]])
    good = grpc.ssl_channel_credentials(rd(pki["ca"]), rd(pki["client_key"]),
                                        rd(pki["client_crt"]))
    nocert = grpc.ssl_channel_credentials(rd(pki["ca"]))
    rogue = grpc.ssl_channel_credentials(rd(pki["ca"]), rd(pki["rogue_key"]),
                                         rd(pki["rogue_crt"]))
    wrong_ca = grpc.ssl_channel_credentials(rd(pki["rogue_ca"]), rd(pki["client_key"]),
                                            rd(pki["client_crt"]))
    chans = []
    try:
        ch = grpc.secure_channel(coord.addr, good)
        chans.append(ch)
        health(ch, "mTLS Health/Check with a client certificate from the CA")
        m = expect_ok(ch, "/batchwire.v1.Coordinator/Info", b"", "mTLS Info")
        bt.check(one(m, 1) == ROLE_COORDINATOR, "mTLS Info: role=COORDINATOR", m)
        ch = grpc.secure_channel(coord.addr, good,
                                 options=[("grpc.ssl_target_name_override", "localhost")])
        chans.append(ch)
        health(ch, "mTLS Health/Check verifying the name 'localhost' (SAN)")
        for what, creds in (("without a client certificate", nocert),
                            ("with a client certificate from an unrelated CA", rogue),
                            ("trusting an unrelated CA", wrong_ca)):
            ch = grpc.secure_channel(coord.addr, creds)
            chans.append(ch)
            code, det, _r, el = call(ch, "/grpc.health.v1.Health/Check", b"", timeout=5)
            bt.check(code == grpc.StatusCode.UNAVAILABLE,
                     "mTLS Health/Check %s: UNAVAILABLE in %.2fs (%s)" % (what, el, det[:100]),
                     "%s %r" % (code, det))
        ch = grpc.insecure_channel(coord.addr)
        chans.append(ch)
        code, det, _r, el = call(ch, "/grpc.health.v1.Health/Check", b"", timeout=5)
        bt.check(code == grpc.StatusCode.UNAVAILABLE,
                 "plaintext Health/Check against the TLS port: UNAVAILABLE in %.2fs" % el,
                 "%s %r" % (code, det))
        health(chans[0], "the coordinator still answers with a good certificate")
    finally:
        for ch in chans:
            ch.close()
    bt.check(coord.stop() == 0, "coordinator-mtls exits 0 on SIGTERM", coord.log_text())


def test(tmp):
    t = time.monotonic()
    test_plaintext(tmp)
    t1 = time.monotonic()
    test_tls(tmp)
    bt.log("plaintext part %.1fs, TLS part %.1fs" % (t1 - t, time.monotonic() - t1))


if __name__ == "__main__":
    bt.main(test, timeout=90)
