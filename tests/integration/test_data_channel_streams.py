"""Streams on the storage worker's data channel (request kind 2, core/rpc/dchan.h), spoken
with a raw socket and compared with gRPC ReadStream on the same worker:

* for TFRecord, JSON Lines and tar sources written by `batchwire gen`, a whole source read as a
  kind-2 request gives SAMPLE frames whose record numbers and bytes equal gRPC ReadStream's
  records (and the generator's formula, bwdata.py), then END with the count and the byte
  offset where the next record would start (the source's size after its last record);
* reading from a record's offset (offset + first_record, as a client resuming from a cursor)
  and by record number (seek_record), with max_records, gives the same records as gRPC and an
  END offset equal to gRPC's next_offset of the last record sent; locate_only gives no SAMPLE
  and END 0 with first_record's offset (the source's size for first_record = its count), as
  gRPC's locate answer;
* a well-formed request with an error gets one ERROR frame with the same batchwire code as
  gRPC ReadStream's bw-error trailer and the connection keeps serving: a source out of range,
  a source owned by the other worker under the current placement, a wrong fingerprint, a
  map-style format (npy) asked as a stream, an offset that is not a record start; a body that
  is not a ReadStreamRequest gets BW_INVALID_ARGUMENT and the connection is closed;
* Data.Stats: records read through the data channel and located offsets are counted as over
  gRPC.
"""

import os
import struct
import sys

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwtest as bt  # noqa: E402
import bwdata as bd  # noqa: E402
import test_data_channel as dc  # noqa: E402

KIND_READ_STREAM = 2
NUM_SHARDS = 16
CODE_NAMES = dict(dc.CODE_NAMES)
BW_UNIMPLEMENTED, BW_CORRUPT = -12, -10
CODE_NAMES.update({BW_UNIMPLEMENTED: "BW_UNIMPLEMENTED", BW_CORRUPT: "BW_CORRUPT"})
CODE_BY_NAME = {v: k for k, v in CODE_NAMES.items()}


def stream_request(pbm, fmt, sources, source, **kw):
    """A serialized ReadStreamRequest (routing may be a pbm.Routing)."""
    routing = kw.pop("routing", None)
    r = pbm.ReadStreamRequest(dataset=pbm.Dataset(format=fmt, sources=list(sources)),
                              source=source, **kw)
    if routing is not None:
        r.routing.CopyFrom(routing)
    return r


def dchan_stream(s, req, what):
    """Sends req as kind 2 on s; returns ("end", [(key, bytes)], count, offset) or
    ("error", [...], (code, message), hint)."""
    s.sendall(dc.frame(req.SerializeToString(), kind=KIND_READ_STREAM))
    return dc.response_full(s, what)


def grpc_stream(cl, req):
    """gRPC ReadStream with the same request: [(key, bytes, offset, next_offset)], or
    ("error", bw-error name, details)."""
    try:
        got = cl._assemble(cl._stream(req, timeout=30))
    except grpc.RpcError as e:
        trailer = dict(e.trailing_metadata() or ())
        return ("error", trailer.get("bw-error"), e.details() or "")
    return [(x["index"], x["data"], x["offset"], x["next_offset"]) for x in got]


def expect_same(s, cl, req, what, first=0):
    """The kind-2 answer on s equals gRPC ReadStream's for req: records and END offset."""
    want = grpc_stream(cl, req)
    if isinstance(want, tuple):
        raise bt.TestFailure("%s: gRPC ReadStream failed: %r" % (what, want))
    kind, samples, count, offset = dchan_stream(s, req, what)
    if kind != "end":
        raise bt.TestFailure("%s: data channel answered %s: %s" %
                             (what, CODE_NAMES.get(count[0], count[0]), count[1]))
    if [(k, d) for k, d, _, _ in want] != samples:
        raise bt.TestFailure("%s: data channel records %r differ from gRPC's %r" %
                             (what, [(k, len(d)) for k, d in samples][:10],
                              [(k, len(d)) for k, d, _, _ in want][:10]))
    if count != len(samples):
        raise bt.TestFailure("%s: END says %d records, %d came" % (what, count, len(samples)))
    end = want[-1][3] if want else req.offset
    if offset != end:
        raise bt.TestFailure("%s: END offset %d, gRPC's next_offset of the last record is %d" %
                             (what, offset, end))
    if want and [k for k, _, _, _ in want] != list(range(first, first + len(want))):
        raise bt.TestFailure("%s: record numbers %r do not count on from %d" %
                             (what, [k for k, _, _, _ in want][:10], first))
    return want, offset


def expect_error_same(s, cl, req, code, needles, what):
    """The kind-2 answer is one ERROR frame with `code` (and the needles), and gRPC ReadStream
    fails with the same bw-error."""
    kind, samples, tail, hint = dchan_stream(s, req, what)
    if kind != "error" or samples:
        raise bt.TestFailure("%s: expected %s, got %s with %d records" %
                             (what, CODE_NAMES[code], kind, len(samples)))
    got, msg = tail
    if got != code or any(n not in msg for n in needles) or hint != 0:
        raise bt.TestFailure("%s: expected %s with %r, got %s (hint %d): %s" %
                             (what, CODE_NAMES[code], needles, CODE_NAMES.get(got, got), hint,
                              msg))
    g = grpc_stream(cl, req)
    bt.check(isinstance(g, tuple) and g[1] == CODE_NAMES[code],
             "%s: data channel %s (%s); gRPC ReadStream %s" %
             (what, CODE_NAMES[code], msg[:160], g[1] if isinstance(g, tuple) else g))


def stats(cl):
    return cl.ch.unary_unary("/batchwire.v1.Data/Stats",
                             request_serializer=cl.pb.StatsRequest.SerializeToString,
                             response_deserializer=cl.pb.StatsResponse.FromString)(
        cl.pb.StatsRequest(), timeout=10)


def test(tmpdir):
    root = os.path.join(tmpdir, "data")
    os.makedirs(root)
    streams = {}
    for fmt, n, files, hi in (("tfrecord", 40, 3, 70000), ("jsonl", 30, 2, 300),
                              ("tar", 24, 2, 50000)):
        sources, rows = dc.gen(root, fmt, fmt, ["--num-samples", n, "--sample-bytes", 0,
                                                "--sample-bytes-max", hi, "--files", files])
        streams[fmt] = (sources, rows)
    np.save(os.path.join(root, "m.npy"), np.arange(60, dtype=np.float32).reshape(20, 3))

    coord = bt.coordinator(tmpdir, args=["--heartbeat-ms", 200, "--dead-after", 3])
    workers = {wid: bt.worker(tmpdir, coord.addr, wid, data_root=root) for wid in ("w1", "w2")}
    st = bt.poll(lambda: (lambda s: s if sum(w["state"] == "alive" for w in s["workers"]) == 2
                          and all(w["data_address"] for w in s["workers"]) else None)(
        bt.status_json(coord.addr)), 15, interval=0.1, what="two live workers")
    daddr = {w["id"]: w["data_address"] for w in st["workers"]}
    pbm = bd.pb(tmpdir)
    cl = bd.DataClient(tmpdir, workers["w1"].addr)
    s = dc.connect(daddr["w1"])

    # --- whole sources, resumed reads, seeks and locates: the same as gRPC ReadStream
    for fmt, (sources, rows) in streams.items():
        info = cl.describe(fmt, sources)
        for k, src in enumerate(info.sources):
            want, end = expect_same(s, cl, stream_request(pbm, fmt, sources, k),
                                    "%s source %d whole" % (fmt, k))
            # (a tar file ends with its end-of-archive blocks, after the last record)
            bt.check(len(want) == src.records and (end == src.size_bytes or fmt == "tar") and
                     end <= src.size_bytes and [d for _, d, _, _ in want] ==
                     rows[src.first_index:src.first_index + src.records],
                     "%s source %d (%s): %d records equal gRPC's and the generator's, END offset "
                     "%d (the file has %d bytes)" % (fmt, k, src.path, len(want), end,
                                                     src.size_bytes))
            mid = len(want) // 2
            expect_same(s, cl, stream_request(pbm, fmt, sources, k, offset=want[mid][2],
                                              first_record=mid, max_records=3),
                        "%s source %d from record %d's offset, 3 records" % (fmt, k, mid),
                        first=mid)
            expect_same(s, cl, stream_request(pbm, fmt, sources, k, first_record=mid,
                                              seek_record=True),
                        "%s source %d seek to record %d" % (fmt, k, mid), first=mid)
            for rec in (0, mid, len(want)):
                req = stream_request(pbm, fmt, sources, k, first_record=rec, locate_only=True)
                kind, samples, count, offset = dchan_stream(s, req, "locate %d" % rec)
                g = cl._assemble(cl._stream(req, timeout=30))
                where = want[rec][2] if rec < len(want) else g[0]["offset"]
                bt.check(kind == "end" and not samples and count == 0 and offset == where and
                         len(g) == 1 and g[0]["offset"] == where and g[0]["index"] == rec and
                         (rec < len(want) or fmt == "tar" or where == src.size_bytes),
                         "%s source %d locate_only record %d: END 0 at offset %d, as gRPC's "
                         "answer" % (fmt, k, rec, where), (kind, samples, count, offset, g))
        bt.ok("%s: every source over the data channel equals gRPC ReadStream" % fmt)

    # --- errors: one ERROR frame with gRPC's code; the connection keeps serving
    sources, rows = streams["tfrecord"]
    expect_error_same(s, cl, stream_request(pbm, "tfrecord", sources, 3), dc.BW_OUT_OF_RANGE,
                      ["source 3", "3 sources"], "source 3 of a 3-source stream")
    expect_error_same(s, cl, stream_request(pbm, "tfrecord", sources, 0,
                                            fingerprint="0123456789abcdef"),
                      dc.BW_MISMATCH, ["fingerprint", "0123456789abcdef"], "a wrong fingerprint")
    expect_error_same(s, cl, stream_request(pbm, "npy", ["m.npy"], 0), BW_UNIMPLEMENTED,
                      ["npy", "not a stream"], "a map-style format (npy) as a stream")
    expect_error_same(s, cl, stream_request(pbm, "tfrecord", sources, 0, offset=5),
                      BW_CORRUPT, ["offset 5"], "an offset inside a record")
    expect_error_same(s, cl, stream_request(pbm, "tfrecord", sources, 0, first_record=1000,
                                            seek_record=True),
                      dc.BW_OUT_OF_RANGE, ["1000"], "seek past the source's records")
    table = bt.poll(lambda: (lambda t: t if len(t.workers) == 2 else None)(
        bd.DataClient(tmpdir, coord.addr).placement(NUM_SHARDS)), 15, interval=0.1,
        what="two workers in the placement")
    for wid in workers:
        workers[wid].wait_log(r"placement version %d: 2 live workers" % table.version)
    ids = [w.id for w in table.workers]
    owner0 = ids[table.owners[0]]  # streams, modulo: source k is shard k
    other = "w2" if owner0 == "w1" else "w1"
    rt = pbm.Routing(placement_version=table.version, num_shards=NUM_SHARDS,
                     shard_mode=pbm.SHARD_MODE_MODULO, by_source=True)
    wrong = dc.connect(daddr[other])
    wcl = bd.DataClient(tmpdir, workers[other].addr)
    expect_error_same(wrong, wcl, stream_request(pbm, "tfrecord", sources, 0, routing=rt),
                      dc.BW_WRONG_OWNER, ["owned by worker %s" % owner0, "refresh placement"],
                      "source 0 (owned by %s) asked of %s" % (owner0, other))
    right = dc.connect(daddr[owner0])
    ocl = bd.DataClient(tmpdir, workers[owner0].addr)
    expect_same(right, ocl, stream_request(pbm, "tfrecord", sources, 0, routing=rt),
                "source 0 at its owner %s under placement version %d" % (owner0, table.version))
    expect_same(wrong, wcl, stream_request(pbm, "tfrecord", sources, 1, max_records=2),
                "a request after the wrong-owner error on the same connection")
    for c in (wrong, right):
        c.close()
    for c in (wcl, ocl):
        c.close()
    expect_same(s, cl, stream_request(pbm, "jsonl", streams["jsonl"][0], 1),
                "a request after five errors on the same connection")

    # --- Data.Stats counts data-channel reads as gRPC ones
    before = stats(cl)
    sources, rows = streams["jsonl"]
    kind, samples, count, _ = dchan_stream(s, stream_request(pbm, "jsonl", sources, 0,
                                                              max_records=4),
                                           "4 records for Stats")
    dchan_stream(s, stream_request(pbm, "jsonl", sources, 0, first_record=2, locate_only=True),
                 "a locate for Stats")
    after = stats(cl)
    bt.check(kind == "end" and count == 4 and after.records_read - before.records_read == 4 and
             after.record_bytes_read - before.record_bytes_read == sum(len(d) for _, d in samples)
             and after.records_located - before.records_located == 1,
             "Data.Stats counts the data channel's 4 records, their bytes and the located offset",
             (before, after))

    # --- a body that is not a ReadStreamRequest: BW_INVALID_ARGUMENT, the connection closed
    c = dc.connect(daddr["w1"])
    c.sendall(dc.frame(b"\x0a\xff\xff\xff\xff\x0fBWD1", kind=KIND_READ_STREAM))
    dc.expect_error(c, dc.BW_INVALID_ARGUMENT, ["ReadStreamRequest"], "kind 2 with garbage")
    dc.expect_closed(c, "kind 2 with garbage")
    c.close()
    c = dc.connect(daddr["w1"])
    c.sendall(dc.frame(b"", kind=KIND_READ_STREAM))
    dc.expect_error(c, dc.BW_INVALID_ARGUMENT, ["ReadStreamRequest", "dataset"],
                    "kind 2 with an empty body")
    dc.expect_closed(c, "kind 2 with an empty body")
    c.close()
    expect_same(s, cl, stream_request(pbm, "tar", streams["tar"][0], 1),
                "the first connection still serves after the malformed ones")
    s.close()
    cl.close()
    for d in list(workers.values()) + [coord]:
        bt.check(d.stop() == 0, "%s exits 0 on SIGTERM" % d.name, d.log_text()[-2000:])


if __name__ == "__main__":
    bt.main(test, timeout=120)
