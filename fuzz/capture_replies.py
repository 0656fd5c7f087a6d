#!/usr/bin/python3
"""Writes fuzz/corpus/fuzz_client_reply/ from real traffic (committed; rerun only to change
it, after a build: BW_BIN_DIR defaults to build/bin).

Replies are captured from a real worker: a coordinator and one worker are started on loopback
(tests/integration/bwtest.py), `batchwire gen` writes an .npy dataset of 16-byte samples and a
TFRecord source of 0..40-byte records, and each request the fuzz target's client makes (the
same indices, or records 3.. of the source) is sent to the worker over its data channel (the
bytes read back as they came) and over gRPC (each SampleBatch message as it came, also with a
32-byte message limit so that samples arrive in chunks). Each seed is the target's two mode
bytes followed by the reply; two samples of 17-24 KB are read too (the data channel receives
them straight into the batch), and some seeds give the batch buffer room beforehand (byte 1),
so that samples land in it as they come. A worker that does not serve ReadStream on its data
channel answers with an error frame (a seed too), and the frames one that does would send are
then written from the records it sent over gRPC.

Then the known hard cases, built from the captured replies by the protocol's rules: a frame
announcing 7*10^18 bytes, all-empty samples, an empty first chunk followed by the data, error
frames (busy with a hint, wrong owner, corrupt, unavailable), the gRPC status after the
messages, and replies cut off inside a frame header and inside a sample's bytes (which once
made the client keep a cut sample as complete).
"""
import os
import shutil
import socket
import struct
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("BW_BIN_DIR", os.path.join(HERE, "..", "build", "bin"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "integration"))
import bwtest as bt  # noqa: E402
import bwdata as bd  # noqa: E402

CORPUS = os.path.join(HERE, "corpus", "fuzz_client_reply")

BATCH = [13, 2, 7, 2, 40, 5, 13, 21]  # fuzz_client_reply.c BATCH
FIRST_RECORD = 3
FIXED = 16  # 1 + byte 1 % 64 with byte 1 = 15
BIG = (17000, 24000)  # over the data channel's 16 KiB read-ahead; two fit in -max_len=65536
MAGIC = 0x31445742
SAMPLE, END, ERROR = 1, 2, 3


def mode(grpc=False, stream=False, fixed=False, n=1, status=0, param=0):
    b0 = (1 if grpc else 0) | (2 if stream else 0) | (4 if fixed else 0) | ((n - 1) << 3) | \
        (status << 6)
    return bytes([b0, param])


def frame(t, code, a, b):
    return struct.pack("<IIQQ", t, code & 0xFFFFFFFF, a, b)


def error_frame(code, msg, hint=0):
    m = msg.encode()
    return frame(ERROR, code, len(m), hint) + m


def frames_of(samples, end_b=0):
    """A data-channel reply: SAMPLE frames for (key, bytes), then END."""
    out = b"".join(frame(SAMPLE, 0, k, len(d)) + d for k, d in samples)
    return out + frame(END, 0, len(samples), end_b)


def messages(msgs):
    """gRPC messages as the target reads them: u16 length + bytes each."""
    return b"".join(struct.pack("<H", len(m)) + m for m in msgs)


def keys_of(n, stream):
    if stream:
        return [FIRST_RECORD + i for i in range(n)]
    # the distinct indices in batch order, as the client asks for them (samples_fetch.c,
    # dedupe_indices)
    return list(dict.fromkeys(BATCH[:n]))


class Worker:
    def __init__(self, tmpdir, dc, addr, data_addr):
        self.pb = dc.pb
        self.dc = dc
        self.addr = addr
        host, port = data_addr.rsplit(":", 1)
        self.data = (host, int(port))
        raw = lambda b: b  # noqa: E731  the messages as they came
        self.read_raw = dc.ch.unary_stream("/batchwire.v1.Data/ReadSamples",
                                           request_serializer=self.pb.ReadSamplesRequest
                                           .SerializeToString, response_deserializer=raw)
        self.stream_raw = dc.ch.unary_stream("/batchwire.v1.Data/ReadStream",
                                             request_serializer=self.pb.ReadStreamRequest
                                             .SerializeToString, response_deserializer=raw)

    def request(self, fmt, source, n, stream, limit=0):
        ds = self.pb.Dataset(format=fmt, sources=[source])
        if stream:
            return 2, self.pb.ReadStreamRequest(dataset=ds, source=0, first_record=FIRST_RECORD,
                                                max_records=n, seek_record=True,
                                                max_message_bytes=limit)
        return 1, self.pb.ReadSamplesRequest(dataset=ds, indices=keys_of(n, False),
                                             max_message_bytes=limit)

    def dchan(self, kind, req):
        """The data channel's reply to req, read until its END or ERROR frame is complete."""
        body = req.SerializeToString()
        with socket.create_connection(self.data, timeout=10) as s:
            s.sendall(struct.pack("<IIQ", MAGIC, kind, len(body)) + body)
            got = b""
            pos = 0
            while True:
                while len(got) < pos + 24:
                    chunk = s.recv(65536)
                    if not chunk:
                        return got
                    got += chunk
                t, _code, a, b = struct.unpack_from("<IIQQ", got, pos)
                need = pos + 24 + (b if t == SAMPLE else a if t == ERROR else 0)
                while len(got) < need:
                    chunk = s.recv(65536)
                    if not chunk:
                        return got
                    got += chunk
                pos = need
                if t != SAMPLE:
                    return got[:pos]

    def grpc(self, kind, req):
        call = self.stream_raw if kind == 2 else self.read_raw
        return list(call(req, timeout=10))


def put(d, name, data):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def capture(tmpdir):
    cl_root = os.path.join(tmpdir, "data")
    coord = bt.coordinator(tmpdir)
    bt.worker(tmpdir, coord.addr, "w1", data_root=cl_root)
    for args in (["--format", "npy", "--out", os.path.join(cl_root, "npy"), "--num-samples",
                  "64", "--shape", str(FIXED), "--dtype", "uint8", "--files", "1"],
                 ["--format", "tfrecord", "--out", os.path.join(cl_root, "tfr"), "--num-samples",
                  "64", "--sample-bytes", "0", "--sample-bytes-max", "40", "--files", "1"],
                 ["--format", "tfrecord", "--out", os.path.join(cl_root, "big"), "--num-samples",
                  "16", "--sample-bytes", str(BIG[0]), "--sample-bytes-max", str(BIG[1]),
                  "--files", "1"]):
        r = bt.cli("gen", *args, timeout=60)
        if r.returncode != 0:
            raise bt.TestFailure("batchwire gen failed: " + r.stderr)
    bt.poll(lambda: any(w.get("data_address") for w in bt.status_json(coord.addr)["workers"]),
            15, what="the worker's data channel")
    w0 = bt.status_json(coord.addr)["workers"][0]
    dc = bd.DataClient(tmpdir, w0["address"])
    w = Worker(tmpdir, dc, w0["address"], w0["data_address"])
    npy = ("npy", "npy/part-00000.npy")
    tfr = ("tfrecord", "tfr/part-00000.tfrecord")
    seeds = {}
    real = {}  # (stream, fixed, n) -> [(key, bytes)] from the gRPC replies

    for fixed, stream, n in ((False, False, 1), (False, False, 3), (False, False, 8),
                             (True, False, 8), (True, False, 2), (False, True, 1),
                             (False, True, 5), (False, True, 8)):
        fmt, src = npy if fixed else tfr
        param = FIXED - 1 if fixed else 0
        tag = "%s%s-n%d" % ("stream" if stream else "samples", "-fixed" if fixed else "", n)
        kind, req = w.request(fmt, src, n, stream)
        msgs = w.grpc(kind, req)
        seeds["grpc-" + tag] = mode(True, stream, fixed, n, 0, param) + messages(msgs)
        samples = []
        for m in msgs:
            for s in dc.pb.SampleBatch.FromString(m).samples:
                samples.append((s.index, s.data, s.next_offset))
        real[(stream, fixed, n)] = samples
        kind, req = w.request(fmt, src, n, stream, limit=32)
        seeds["grpc-chunked-" + tag] = mode(True, stream, fixed, n, 0, param) + \
            messages(w.grpc(kind, req))
        reply = w.dchan(kind, req)
        t, = struct.unpack_from("<I", reply, 0)
        seeds["dchan-" + tag] = mode(False, stream, fixed, n, 0, param) + reply
        if not fixed and n == 8:  # room in the batch buffer for 256 bytes: some samples
            seeds["dchan-room-" + tag] = mode(False, stream, False, n, 0, 1) + reply
            seeds["grpc-room-" + tag] = mode(True, stream, False, n, 0, 1) + \
                seeds["grpc-" + tag][2:]
        if stream and t == ERROR:
            # A worker without ReadStream on its data channel answers an error frame (the
            # client then asks over gRPC); the frames a worker with it sends, from the records.
            end = samples[-1][2] if samples else 0
            seeds["dchan-frames-" + tag] = mode(False, stream, fixed, n, 0, param) + \
                frames_of([(k, d) for k, d, _ in samples], end)
    # samples the data channel receives straight into the batch, not through its buffer
    kind, req = w.request("tfrecord", "big/part-00000.tfrecord", 2, False)
    big = w.dchan(kind, req)
    seeds["dchan-samples-big-n2"] = mode(False, False, False, 2) + big
    gbig = messages(w.grpc(kind, req))
    seeds["grpc-samples-big-n2"] = mode(True, False, False, 2) + gbig
    # ... with room in the batch buffer for the first (25600 bytes), not the second
    seeds["dchan-samples-big-n2-room"] = mode(False, False, False, 2, 0, 100) + big
    seeds["grpc-samples-big-n2-room"] = mode(True, False, False, 2, 0, 100) + gbig
    real["big"] = big
    # real error frames: an index past the end, a dataset that is not there
    bad = dc.pb.ReadSamplesRequest(dataset=dc.pb.Dataset(format="npy", sources=[npy[1]]),
                                   indices=[1000])
    seeds["dchan-error-out-of-range"] = mode(False, False, True, 1, 0, FIXED - 1) + \
        w.dchan(1, bad)
    bad = dc.pb.ReadSamplesRequest(dataset=dc.pb.Dataset(format="npy", sources=["nope.npy"]),
                                   indices=[2])
    seeds["dchan-error-not-found"] = mode(False, False, False, 1) + w.dchan(1, bad)
    dc.close()
    return seeds, real


def synthetic(real):
    """The known hard cases, from the captured samples."""
    pb = bd._pb
    seeds, cuts = {}, {}
    var3 = [(k, d) for k, d, _ in real[(False, False, 3)]]
    fix8 = [(k, d) for k, d, _ in real[(False, True, 8)]]
    keys3 = [k for k, _ in var3]
    m = mode(False, False, False, 3)
    full = frames_of(var3)
    seeds["dchan-huge"] = m + frame(SAMPLE, 0, keys3[0], 7 * 10 ** 18)
    seeds["dchan-huge-after-one"] = m + frame(SAMPLE, 0, var3[0][0], len(var3[0][1])) + \
        var3[0][1] + frame(SAMPLE, 0, keys3[1], 7 * 10 ** 18) + b"\0" * 64
    seeds["dchan-empty-samples"] = m + frames_of([(k, b"") for k in keys3])
    seeds["dchan-wrong-size-fixed"] = mode(False, False, True, 8, 0, FIXED - 1) + frames_of(
        [(k, d + b"!") if i == 3 else (k, d) for i, (k, d) in enumerate(fix8)])
    seeds["dchan-wrong-key"] = m + frames_of([(k + 1, d) for k, d in var3])
    seeds["dchan-extra-after-end"] = m + full + frame(SAMPLE, 0, 99, 3) + b"xyz"
    seeds["dchan-end-miscount"] = m + full[:-24] + frame(END, 0, 7, 0)
    seeds["dchan-busy"] = m + error_frame(-24, "over its in-flight budget", 250)
    seeds["dchan-busy-after-one"] = m + frame(SAMPLE, 0, var3[0][0], len(var3[0][1])) + \
        var3[0][1] + error_frame(-24, "over its in-flight budget", 60001)
    seeds["dchan-wrong-owner"] = m + error_frame(-19, "shard 13 of 256 is owned by worker w2")
    seeds["dchan-unavailable-limit"] = m + error_frame(-7, "at its limit of 1 connections")
    seeds["dchan-corrupt-after-one"] = m + frame(SAMPLE, 0, var3[0][0], len(var3[0][1])) + \
        var3[0][1] + error_frame(-10, "record 7 fails its checksum")
    seeds["dchan-error-unknown-code"] = m + error_frame(-999, "?")
    seeds["dchan-error-long-message"] = m + frame(ERROR, -7, 5000, 0) + b"x" * 5000
    seeds["dchan-unknown-frame"] = m + frame(9, 0, 0, 0)
    # cut inside a frame header, inside a sample that is not the last one, and inside the last
    first = 24 + len(var3[0][1])
    seeds["dchan-cut-in-header"] = m + full[:first + 10]
    for label, mm, smp in (("", m, var3), ("-fixed", mode(False, False, True, 8, 0, FIXED - 1),
                                           fix8)):
        data = frames_of(smp)
        off = 0
        for i, (k, d) in enumerate(smp):
            start = off + 24
            cut = mm + data[:start + len(d) // 2]
            if d and i < len(smp) - 1:
                seeds["dchan-cut-in-sample-%d%s" % (i, label)] = cut
            elif d:
                cuts["dchan-cut-in-last-sample" + label] = cut
            off = start + len(d)
    mb = mode(False, False, False, 2)
    a = struct.unpack_from("<Q", real["big"], 16)[0]  # the first sample's size
    seeds["dchan-cut-in-big-sample-0"] = mb + real["big"][:24 + a // 2]
    cuts["dchan-cut-in-last-big-sample"] = mb + real["big"][:24 + a + 24 + 1000]
    # gRPC: an empty first chunk, then the data; a message cut short; the call's status
    g = mode(True, False, False, 3)
    k0, d0 = var3[0] if var3[0][1] else next(x for x in var3 if x[1])
    if (k0, d0) == var3[0]:
        first_chunks = [pb.Sample(index=k0, size=len(d0), chunk_offset=0, data=b""),
                        pb.Sample(index=k0, size=len(d0), chunk_offset=0, data=d0)]
        rest = [pb.Sample(index=k, size=len(d), data=d) for k, d in var3[1:]]
        seeds["grpc-empty-first-chunk"] = g + messages(
            [pb.SampleBatch(samples=first_chunks).SerializeToString(),
             pb.SampleBatch(samples=rest).SerializeToString()])
    one = pb.SampleBatch(samples=[pb.Sample(index=k, size=len(d), data=d) for k, d in var3])
    msg = one.SerializeToString()
    seeds["grpc-header-after-data"] = g + messages([msg + bytes([0x0A, 0x04, 0x22, 0x00, 0x08,
                                                                  0x01])])
    for st in (1, 2, 3):
        seeds["grpc-status-%d" % st] = mode(True, False, False, 3, st, 20) + messages([msg])
    seeds["grpc-cut-message"] = g + messages([msg[:len(msg) // 2]])
    # a Sample whose declared length runs past the message, its data all there
    s0 = pb.Sample(index=var3[-1][0], size=len(var3[-1][1]), data=var3[-1][1])
    head = pb.SampleBatch(samples=[pb.Sample(index=k, size=len(d), data=d)
                                   for k, d in var3[:-1]]).SerializeToString()
    body = s0.SerializeToString()
    over = head + bytes([0x0A, len(body) + 5]) + body
    seeds["grpc-sample-overruns-message"] = g + messages([over])
    # ... and its data cut off: the decoder places the chunk, then finds the bytes missing
    if var3[-1][1]:
        cuts["grpc-cut-in-last-data"] = g + messages([head + bytes([0x0A, len(body)]) +
                                                        body[:-1]])
    return seeds, cuts


ZRUN, RUN, ZSTD_MODE = 5, 4, 0x40  # byte 0's bit 6: the client asks for compression


def zstd_compress(data, level=3):
    """One zstd frame of data (libzstd through ctypes), declaring its content size."""
    import ctypes
    import ctypes.util
    z = ctypes.CDLL(ctypes.util.find_library("zstd") or "libzstd.so.1")
    z.ZSTD_compressBound.restype = ctypes.c_size_t
    z.ZSTD_compress.restype = ctypes.c_size_t
    z.ZSTD_compress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                ctypes.c_size_t, ctypes.c_int]
    cap = z.ZSTD_compressBound(ctypes.c_size_t(len(data)))
    out = ctypes.create_string_buffer(cap)
    n = z.ZSTD_compress(out, cap, data, len(data), level)
    return out.raw[:n]


def zrun(n, first, size, comp):
    return frame(ZRUN, n, first, size << 32 | len(comp)) + comp


def zstd_seeds():
    """ZRUN frames (docs/data-channel.md, "Compression") on a connection that asked for them,
    built here: fixed-size samples in one frame or split with a RUN between, samples of varying
    sizes one a frame, and the refusals -- a corrupt frame, one declaring more than its
    samples, one that does not shrink, bytes after the zstd frame, a ZRUN where none was asked
    for."""
    seeds = {}
    m8 = bytes([mode(False, False, True, 8, 0, FIXED - 1)[0] | ZSTD_MODE, FIXED - 1])
    keys = keys_of(8, False)
    smp = [bytes([k % 7]) * (FIXED // 2) + bytes(range(FIXED // 2)) for k in keys]
    allz = zstd_compress(b"".join(smp))
    end = frame(END, 0, len(keys), 0)
    seeds["dchan-zrun-fixed"] = m8 + zrun(len(keys), keys[0], FIXED, allz) + end
    seeds["dchan-zrun-split"] = m8 + zrun(3, keys[0], FIXED, zstd_compress(b"".join(smp[:3]))) + \
        frame(RUN, 2, keys[3], FIXED) + smp[3] + smp[4] + \
        frame(SAMPLE, 0, keys[5], FIXED) + smp[5] + end
    seeds["dchan-zrun-after-samples"] = m8 + frame(SAMPLE, 0, keys[0], FIXED) + smp[0] + \
        frame(RUN, 3, keys[1], FIXED) + b"".join(smp[1:4]) + \
        zrun(2, keys[4], FIXED, zstd_compress(b"\0" * 2 * FIXED)) + end
    bad = bytearray(allz)
    bad[len(bad) // 2] ^= 0x55
    seeds["dchan-zrun-corrupt"] = m8 + zrun(len(keys), keys[0], FIXED, bytes(bad)) + end
    more = zstd_compress(b"".join(smp) + b"\0" * 64)
    seeds["dchan-zrun-declares-more"] = m8 + zrun(len(keys), keys[0], FIXED, more) + end
    seeds["dchan-zrun-bytes-after"] = m8 + zrun(len(keys), keys[0], FIXED, allz + b"\0\0") + end
    seeds["dchan-zrun-no-gain"] = m8 + frame(ZRUN, len(keys), keys[0], FIXED << 32 | 4096) + \
        allz + b"\0" * (4096 - len(allz)) + end
    seeds["dchan-zrun-unasked"] = mode(False, False, True, 8, 0, FIXED - 1) + \
        zrun(len(keys), keys[0], FIXED, allz) + end
    m3 = bytes([mode(False, False, False, 3)[0] | ZSTD_MODE, 40])
    var = [(k, b"record %d " % k * (5 + 7 * i)) for i, k in enumerate(keys_of(3, False))]
    seeds["dchan-zrun-varying"] = m3 + b"".join(
        zrun(1, k, len(d), zstd_compress(d)) for k, d in var) + frame(END, 0, len(var), 0)
    return seeds


def main():
    tmpdir = tempfile.mkdtemp(prefix="bw-corpus-")
    try:
        seeds, real = capture(tmpdir)
        more, cuts = synthetic(real)
        seeds.update(more)
        seeds.update(cuts)
        seeds.update(zstd_seeds())
    finally:
        bt.kill_all()
        shutil.rmtree(tmpdir, ignore_errors=True)
    shutil.rmtree(CORPUS, ignore_errors=True)
    for name, data in sorted(seeds.items()):
        put(CORPUS, name, data)
    print("%d seeds in %s" % (len(seeds), CORPUS))


if __name__ == "__main__":
    main()
