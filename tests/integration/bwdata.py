"""Data-plane helpers for the worker tests (not a test itself).

* Python stubs for proto/data.proto, generated with protoc into a temporary directory.
* A client for the Data and Placement services (grpcio) that reassembles chunked samples.
* The generator's formula (core/formats/synth.h, docs/formats.md) reimplemented with numpy,
  so tests verify what workers serve without trusting the C code that wrote it.
* An independent CRC-32C (bitwise, no tables shared with the C code) for TFRecord files.
"""

import os
import subprocess
import sys

import grpc
import numpy as np

import bwtest as bt

_pb = None


def pb(tmpdir):
    """The generated module for data.proto (built once per process)."""
    global _pb
    if _pb is None:
        out = os.path.join(tmpdir, "pystubs")
        os.makedirs(out, exist_ok=True)
        proto_dir = os.path.join(bt.SOURCE_DIR, "proto")
        r = subprocess.run(["protoc", "--proto_path=" + proto_dir, "--python_out=" + out,
                            os.path.join(proto_dir, "data.proto")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            raise bt.TestFailure("protoc failed:\n" + r.stdout)
        sys.path.insert(0, out)
        import data_pb2  # noqa: E402
        _pb = data_pb2
    return _pb


# ---------------------------------------------------------------------------
# the generator's formula

M64 = (1 << 64) - 1


def _mix(z):
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xbf58476d1ce4e5b9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94d049bb133111eb)
    z = z ^ (z >> np.uint64(31))
    return z


def _mix_int(z):
    z &= M64
    z ^= z >> 30
    z = (z * 0xbf58476d1ce4e5b9) & M64
    z ^= z >> 27
    z = (z * 0x94d049bb133111eb) & M64
    z ^= z >> 31
    return z


# ---------------------------------------------------------------------------
# the loader's placement, written from docs/formats.md ("Shards and placement")

LOADER_SHARDS = 256
BLOCK_BYTES = 64 << 10


def loader_block(length, total_bytes, num_shards=LOADER_SHARDS):
    """The loader's block of neighbouring samples for a dataset of `length` samples and
    `total_bytes` bytes: the largest power of two b with b x the mean size (rounded down) <=
    64 KiB and b x num_shards <= length; 1 at least."""
    if length <= 0:
        return 1
    mean = max(1, total_bytes // length)
    b = 1
    while b * 2 * mean <= BLOCK_BYTES and b * 2 * num_shards <= length:
        b *= 2
    return b


def loader_shard(index, block, num_shards=LOADER_SHARDS):
    """The storage shard the loader routes map-style sample `index` by (modulo)."""
    return (index // max(block, 1)) % num_shards


def synth_bytes(index, length):
    """bytes(i, L): the first L bytes of word(i,0) word(i,1) ..., little endian."""
    nwords = (length + 7) // 8 + 1
    with np.errstate(over="ignore"):
        w = np.arange(nwords, dtype=np.uint64)
        base = np.uint64((index * 0x9e3779b97f4a7c15) & M64)
        z = base + (w + np.uint64(1)) * np.uint64(0xd1b54a32d192ed03)
        words = _mix(z)
    return words.astype("<u8").tobytes()[:length]


def synth_len(index, lo, hi):
    if hi <= lo:
        return lo
    return lo + _mix_int(index ^ 0x5851f42d4c957f2d) % (hi - lo + 1)


def expected_sample(fmt, index, lo, hi):
    """What sample `index` of a `batchwire gen` dataset is, as the worker serves it:
    (bytes, fields) where fields is a list of (name, size) for tar, else None."""
    n = synth_len(index, lo, hi)
    data = synth_bytes(index, n)
    if fmt == "jsonl":
        return ('{"index":%d,"hex":"%s"}' % (index, data.hex())).encode(), None
    if fmt == "tar":
        js = ('{"index":%d}' % index).encode()
        return data + js, [("bin", len(data)), ("json", len(js))]
    return data, None


# ---------------------------------------------------------------------------
# an independent CRC-32C and TFRecord writer

def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked_crc(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord_bytes(records):
    out = bytearray()
    for r in records:
        n = len(r).to_bytes(8, "little")
        out += n + masked_crc(n).to_bytes(4, "little") + r + masked_crc(r).to_bytes(4, "little")
    return bytes(out)


# ---------------------------------------------------------------------------
# client

class DataClient:
    def __init__(self, tmpdir, addr, max_receive=64 << 20):
        self.pb = pb(tmpdir)
        self.addr = addr
        self.ch = grpc.insecure_channel(addr, options=[
            ("grpc.max_receive_message_length", max_receive)])
        p = self.pb
        self._describe = self.ch.unary_unary(
            "/batchwire.v1.Data/Describe", request_serializer=p.DescribeRequest.SerializeToString,
            response_deserializer=p.DescribeResponse.FromString)
        self._read = self.ch.unary_stream(
            "/batchwire.v1.Data/ReadSamples",
            request_serializer=p.ReadSamplesRequest.SerializeToString,
            response_deserializer=p.SampleBatch.FromString)
        self._stream = self.ch.unary_stream(
            "/batchwire.v1.Data/ReadStream",
            request_serializer=p.ReadStreamRequest.SerializeToString,
            response_deserializer=p.SampleBatch.FromString)
        self._placement = self.ch.unary_unary(
            "/batchwire.v1.Placement/Get",
            request_serializer=p.PlacementRequest.SerializeToString,
            response_deserializer=p.PlacementTable.FromString)

    def close(self):
        self.ch.close()

    def dataset(self, fmt, sources):
        return self.pb.Dataset(format=fmt, sources=list(sources))

    def describe(self, fmt, sources, timeout=20):
        return self._describe(self.pb.DescribeRequest(dataset=self.dataset(fmt, sources)),
                              timeout=timeout).info

    def placement(self, num_shards=0, timeout=10):
        return self._placement(self.pb.PlacementRequest(num_shards=num_shards), timeout=timeout)

    @staticmethod
    def _assemble(batches, stats=None):
        """Joins chunks: returns a list of (Sample-with-full-data-as-bytes) dicts."""
        out = []
        cur = None
        for b in batches:
            if stats is not None:
                stats["messages"] = stats.get("messages", 0) + 1
                stats["max_message"] = max(stats.get("max_message", 0), b.ByteSize())
            for s in b.samples:
                if s.chunk_offset == 0:
                    cur = {"index": s.index, "size": s.size, "data": bytearray(s.data),
                           "fields": [(f.name, f.size) for f in s.fields], "key": s.key,
                           "offset": s.offset, "next_offset": s.next_offset, "chunks": 1}
                    out.append(cur)
                else:
                    if cur is None or cur["index"] != s.index or len(cur["data"]) != s.chunk_offset:
                        raise bt.TestFailure("chunk out of order: %r" % (s,))
                    cur["data"] += s.data
                    cur["chunks"] += 1
        for c in out:
            if len(c["data"]) != c["size"]:
                raise bt.TestFailure("sample %d: %d of %d bytes" % (c["index"], len(c["data"]),
                                                                     c["size"]))
            c["data"] = bytes(c["data"])
        return out

    def read(self, fmt, sources, indices, routing=None, max_message_bytes=0, fingerprint="",
             stats=None, timeout=60):
        req = self.pb.ReadSamplesRequest(dataset=self.dataset(fmt, sources), indices=indices,
                                         max_message_bytes=max_message_bytes,
                                         fingerprint=fingerprint)
        if routing:
            req.routing.CopyFrom(routing)
        return self._assemble(self._read(req, timeout=timeout), stats)

    def read_stream(self, fmt, sources, source, offset=0, max_records=0, routing=None,
                    max_message_bytes=0, timeout=60):
        req = self.pb.ReadStreamRequest(dataset=self.dataset(fmt, sources), source=source,
                                        offset=offset, max_records=max_records,
                                        max_message_bytes=max_message_bytes)
        if routing:
            req.routing.CopyFrom(routing)
        return self._assemble(self._stream(req, timeout=timeout))


def expect_error(fn, code, *needles):
    """Calls fn(); it must raise grpc.RpcError with `code` and details containing needles.
    Returns the details."""
    try:
        fn()
    except grpc.RpcError as e:
        details = e.details() or ""
        if e.code() != code or any(n not in details for n in needles):
            raise bt.TestFailure("expected %s with %r, got %s: %s" % (code, needles, e.code(),
                                                                      details))
        trailer = dict(e.trailing_metadata() or ())
        return details, trailer.get("bw-error")
    raise bt.TestFailure("expected %s with %r, but the call succeeded" % (code, needles))
