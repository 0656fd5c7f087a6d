"""A storage worker's memory stays bounded whatever its clients send (--max-request-bytes,
--inflight-bytes; docs/data-channel.md, "Memory and admission"):

* a data-channel request whose 16-byte header announces 30 MiB -- with no body sent -- is
  answered at once with an ERROR frame BW_TOO_BIG naming the size, the limit and the flag, and
  the connection is closed;
* 12 concurrent data-channel requests with 30 MiB bodies (30 M packed indices) to a worker
  with the default limits are all refused from their headers; to a worker with
  --max-request-bytes above 30 MiB they are admitted within the 256 MiB budget -- one at a
  time, since each is charged for its body and its decoding -- and the others get BW_BUSY with
  a retry hint after waiting: each client gets exactly one ERROR frame (BW_BUSY, or BW_TOO_BIG
  from the bounded decoding), never all at once. In both cases the worker's RssAnon and its
  peak RSS (VmHWM, /proc/PID/status) grow by less than the budget, it stays up and then serves
  a normal request;
* with a budget of 8 MiB, data-channel requests held by clients that do not read fill it: the
  requests after them wait and get BW_BUSY with a hint in the ERROR frame's b field; a gRPC
  ReadSamples meanwhile fails RESOURCE_EXHAUSTED with the trailers bw-error BW_BUSY and
  bw-retry-after-ms; a gRPC request whose charge is larger than the whole budget gets
  BW_TOO_BIG at once; the worker logs the budget being hit; once the clients go away the
  worker serves again.
"""

import os
import socket
import struct
import sys
import threading
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwtest as bt  # noqa: E402
import bwdata as bd  # noqa: E402
import test_data_channel as dc  # noqa: E402

BW_BUSY = -24
MIB = 1 << 20
HUGE = 30 * MIB          # a 30 MiB request body
BUDGET = 256 * MIB       # the default --inflight-bytes
SMALL_BUDGET = 8 * MIB   # the smallest --inflight-bytes
CLIENTS = 12
NAMES = dict(dc.CODE_NAMES)
NAMES[BW_BUSY] = "BW_BUSY"


def proc_status(pid):
    """{field: kB} of /proc/PID/status for RssAnon and VmHWM."""
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("RssAnon", "VmHWM"):
                out[k] = int(v.split()[0])
    return out


def varint(n):
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def huge_request(pbm, sources):
    """A ReadSamplesRequest of HUGE bytes: the dataset, then HUGE - small packed indices 0."""
    head = pbm.ReadSamplesRequest(dataset=pbm.Dataset(format="npy", sources=sources))
    head = head.SerializeToString()
    n = HUGE - len(head) - 1 - len(varint(HUGE))
    body = head + b"\x12" + varint(n) + bytes(n)
    assert len(body) == HUGE, len(body)
    return body


def send_huge(addr, data, results, k):
    """One client: sends data (header + body), then reads one response."""
    try:
        s = dc.connect(addr)
        s.settimeout(60)
        sent_all = True
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            sent_all = False  # refused from its header: the worker closed the connection
        kind, samples, tail, b = dc.response_full(s, "client %d" % k)
        results[k] = (kind, len(samples), tail, b, sent_all)
        s.close()
    except BaseException as e:  # reported by the main thread
        results[k] = ("exception", repr(e)[:500])


def burst(addr, data):
    """CLIENTS concurrent senders of data; returns their results."""
    results = [None] * CLIENTS
    threads = [threading.Thread(target=send_huge, args=(addr, data, results, k))
               for k in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    bt.check(not any(t.is_alive() for t in threads), "%d concurrent 30 MiB requests answered"
             % CLIENTS)
    return results


def check_memory(w, before, what):
    """RssAnon and the peak RSS grew by less than the budget: 12 bodies read at once would be
    360 MiB before any decoding (which used to cost 270 MB more each)."""
    after = proc_status(w.pid)
    grow_anon = after["RssAnon"] - before["RssAnon"]
    grow_peak = after["VmHWM"] - before["VmHWM"]
    bt.log("%s: RssAnon %d kB -> %d kB (%+d kB), VmHWM %d kB -> %d kB (%+d kB)" %
           (what, before["RssAnon"], after["RssAnon"], grow_anon, before["VmHWM"],
            after["VmHWM"], grow_peak))
    bt.check(grow_anon <= BUDGET // 1024 and grow_peak <= BUDGET // 1024,
             "%s: RssAnon grew %d kB and the peak %d kB, within the %d kB budget" %
             (what, grow_anon, grow_peak, BUDGET // 1024))


def serves(addr, pbm, rows, what):
    c = dc.connect(addr)
    c.sendall(dc.frame(dc.request(pbm, [dc.SMALL], [3, 1, 4])))
    dc.expect_samples(c, rows, [3, 1, 4], what)
    c.close()
    bt.ok(what)


def test(tmpdir):
    root = os.path.join(tmpdir, "data")
    os.makedirs(root)
    rng = np.random.default_rng(3)
    small = dc.write_npy(root, dc.SMALL, rng.standard_normal((61, 3, 7)).astype(np.float32))
    big = dc.write_npy(root, dc.BIG, rng.integers(0, 2 ** 32, (9, 80, 128), dtype=np.uint32))
    del big
    pbm = bd.pb(tmpdir)
    coord = bt.coordinator(tmpdir, args=["--heartbeat-ms", 200])

    def start(wid, args):
        w = bt.worker(tmpdir, coord.addr, wid, data_root=root, args=args)
        addr = w.first_line.split("data-channel=", 1)[1].split()[0]
        return w, addr

    # --- the size limit: refused from the header, before any of the body
    w1, a1 = start("w1", [])
    c = dc.connect(a1)
    t0 = time.monotonic()
    c.sendall(struct.pack("<IIQ", dc.MAGIC, dc.KIND_READ_SAMPLES, HUGE))
    dc.expect_error(c, dc.BW_TOO_BIG, [str(HUGE), "16777216", "--max-request-bytes"],
                    "a header announcing %d bytes and no body" % HUGE)
    dc.expect_closed(c, "the refused connection")
    bt.check(time.monotonic() - t0 < 5, "the refusal came from the header alone in %.2fs" %
             (time.monotonic() - t0))
    c.close()
    serves(a1, pbm, small, "w1 serves a normal request after the refusal")

    data = dc.frame(huge_request(pbm, [dc.SMALL]))
    before = proc_status(w1.pid)
    results = burst(a1, data)
    bad = [r for r in results if r[0] != "error" or r[2][0] != dc.BW_TOO_BIG or
           "--max-request-bytes" not in r[2][1]]
    bt.check(not bad, "default limits: all %d requests refused from their headers with "
             "BW_TOO_BIG naming --max-request-bytes" % CLIENTS, results)
    check_memory(w1, before, "12 x 30 MiB, default limits")
    bt.check(w1.running(), "w1 still running")
    serves(a1, pbm, small, "w1 serves a normal request after the burst")

    # --- a limit above 30 MiB: admitted within the budget, never all at once
    w2, a2 = start("w2", ["--max-request-bytes", 32 * MIB])
    serves(a2, pbm, small, "w2 (--max-request-bytes 32 MiB) serves a normal request")
    before = proc_status(w2.pid)
    t0 = time.monotonic()
    results = burst(a2, data)
    elapsed = time.monotonic() - t0
    busy = [r for r in results if r[0] == "error" and r[2][0] == BW_BUSY]
    decoded = [r for r in results if r[0] == "error" and r[2][0] == dc.BW_TOO_BIG]
    bt.check(len(busy) + len(decoded) == CLIENTS and all(r[4] for r in results) and
             all(r[1] == 0 for r in results),
             "--max-request-bytes 32 MiB: each of the %d bodies was read and answered with one "
             "ERROR frame: %d admitted (BW_TOO_BIG from the bounded decoding), %d BW_BUSY, in "
             "%.1fs" % (CLIENTS, len(decoded), len(busy), elapsed), results)
    # Refused by the request checks before decoding (more than 2^20 elements), or by the
    # bounded decoding itself: either way within the request's charge.
    bt.check(decoded and all(("needs more than" in r[2][1] and "1048576 indices" in r[2][1]) or
                             "more than the limit of 1048576" in r[2][1] for r in decoded),
             "admitted requests fail to decode within their charge: %s" %
             (decoded[0][2][1] if decoded else ""), results)
    bt.check(all(r[3] > 0 and "retry after %d ms" % r[3] in r[2][1] and
                 "--inflight-bytes" in r[2][1] for r in busy),
             "every BW_BUSY carries its hint in b and names --inflight-bytes: %s" %
             (busy[0][2][1] if busy else "(none: the requests were admitted in turn)"), busy)
    check_memory(w2, before, "12 x 30 MiB, --max-request-bytes 32 MiB")
    bt.check(w2.running(), "w2 still running")
    serves(a2, pbm, small, "w2 serves a normal request after the burst")
    for w in (w1, w2):
        bt.check(w.stop() == 0, "%s exits 0 on SIGTERM" % w.name, w.log_text()[-2000:])

    # --- a small budget: BW_BUSY with a hint on both transports
    w3, a3 = start("w3", ["--inflight-bytes", SMALL_BUDGET])
    stuck = []
    # Clients that ask for 36 MB and do not read: each holds about 0.6 MiB once decoded and
    # needs about 1.6 MiB to be admitted, so 11 fit in 8 MiB and the others find no room.
    for k in range(16):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        host, port = a3.rsplit(":", 1)
        s.connect((host, int(port)))
        s.settimeout(10)
        s.sendall(dc.frame(dc.request(pbm, [dc.BIG], list(range(9)) * 100)))
        stuck.append(s)
    time.sleep(1.5)  # past the 1 s wait of those that found no room
    cl = bd.DataClient(tmpdir, w3.addr)
    t0 = time.monotonic()
    try:
        cl.read("npy", [dc.SMALL], [1, 2])
        raise bt.TestFailure("gRPC ReadSamples succeeded while the budget was held")
    except grpc.RpcError as e:
        err = e
    trailer = dict(err.trailing_metadata() or ())
    hint = int(trailer.get("bw-retry-after-ms", "0"))
    bt.check(err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and
             trailer.get("bw-error") == "BW_BUSY" and hint > 0 and
             "retry after %d ms" % hint in err.details() and "--inflight-bytes" in err.details(),
             "gRPC ReadSamples while the budget is held: RESOURCE_EXHAUSTED, bw-error BW_BUSY, "
             "bw-retry-after-ms %d, after %.1fs: %s" % (hint, time.monotonic() - t0,
                                                        err.details()), trailer)
    admitted, refused = 0, []
    for s in stuck:
        typ, code, a, b = struct.unpack("<IIQQ", dc.read_exact(s, 24, "a held request"))
        if typ == dc.SAMPLE:
            admitted += 1
        else:
            msg = dc.read_exact(s, a, "its message").decode()
            refused.append((typ, struct.unpack("<i", struct.pack("<I", code))[0], b, msg))
    bt.check(admitted >= 1 and refused and
             all(t == dc.ERROR and c == BW_BUSY and b > 0 and "retry after %d ms" % b in m
                 for t, c, b, m in refused),
             "--inflight-bytes 8 MiB: %d requests held by clients that do not read; the other %d "
             "got BW_BUSY with hints %s ms: %s" % (admitted, len(refused),
                                                   sorted(r[2] for r in refused),
                                                   refused[0][3] if refused else ""), refused)
    big_req = pbm.ReadSamplesRequest(dataset=pbm.Dataset(format="npy", sources=[dc.SMALL]),
                                     indices=[0] * 500000)
    details, code = bd.expect_error(lambda: cl._read(big_req, timeout=10).__iter__().__next__(),
                                    grpc.StatusCode.RESOURCE_EXHAUSTED, "more than the worker's "
                                    "whole in-flight budget", "--inflight-bytes")
    bt.check(code == "BW_TOO_BIG", "a gRPC request charged more than the whole budget: "
             "BW_TOO_BIG at once: %s" % details)
    for s in stuck:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    w3.wait_log(r"in-flight budget of %d bytes \(--inflight-bytes\) hit: \d+ requests found no "
                r"room" % SMALL_BUDGET)
    bt.poll(lambda: _try_serve(a3, pbm, small), 20, interval=0.2, what="w3 to serve again")
    got = cl.read("npy", [dc.SMALL], [5, 6])
    bt.check([x["data"] for x in got] == [small[5], small[6]],
             "w3 serves gRPC again once the clients that held its budget left")
    cl.close()
    bt.check(w3.stop() == 0, "w3 exits 0 on SIGTERM", w3.log_text()[-2000:])
    coord.stop()


def _try_serve(addr, pbm, rows):
    c = dc.connect(addr)
    try:
        c.sendall(dc.frame(dc.request(pbm, [dc.SMALL], [7])))
        kind, samples, tail = dc.response(c, "a request after the held ones")
        return kind == "end" and samples == [(7, rows[7])]
    finally:
        c.close()


if __name__ == "__main__":
    bt.main(test, timeout=300)
