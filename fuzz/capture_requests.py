#!/usr/bin/python3
"""Writes fuzz/corpus/fuzz_worker_request/ from real traffic (committed; rerun only to change
it, after a build: BW_BIN_DIR defaults to build/bin).

A coordinator and a worker run on loopback; the worker's data channel is advertised at a
recording proxy in front of it, and `batchwire fetch` reads map-style (.npy shuffled, TFRecord
with placement routing) and iterable (TFRecord, JSON Lines, tar) datasets through it. Every
request the client sent is kept as data-channel input ("dchan-KIND-N": the 16-byte header and
the body, fuzz_worker_request.c) and, since gRPC carries exactly the same message, as a gRPC
body ("grpc-KIND-N": a first byte choosing the kind, then the body). A few hand-made edge
cases follow (a header over the limit, an unknown kind, an empty body).
"""
import os
import shutil
import socket
import struct
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import bwtest as bt  # noqa: E402

OUT = os.path.join(HERE, "corpus", "fuzz_worker_request")
PER_KIND = 4


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Proxy:
    """Forwards connections to `upstream`, keeping what each client sent."""

    def __init__(self, upstream):
        self.upstream = upstream
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.port = self.lsock.getsockname()[1]
        self.sent = []  # bytearray per connection
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            c, _ = self.lsock.accept()
            u = socket.create_connection(self.upstream)
            buf = bytearray()
            self.sent.append(buf)
            threading.Thread(target=self.pump, args=(c, u, buf), daemon=True).start()
            threading.Thread(target=self.pump, args=(u, c, None), daemon=True).start()

    @staticmethod
    def pump(src, dst, keep):
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if keep is not None:
                    keep += data
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def requests(buf):
    """Splits what a client sent into (kind, header + body)."""
    out = []
    while len(buf) >= 16:
        magic, kind, n = struct.unpack("<IIQ", buf[:16])
        if magic != 0x31445742 or len(buf) < 16 + n:
            break
        out.append((kind, bytes(buf[:16 + n])))
        buf = buf[16 + n:]
    return out


def fetch(coord, job, dataset, *extra):
    r = bt.cli("fetch", "--coordinator", coord, "--job", job, "--dataset", dataset, "--rank", 0,
               "--world-size", 2, "--batch-size", 4, "--max-steps", 3, *extra, timeout=60)
    if r.returncode != 0:
        raise SystemExit("batchwire fetch %s failed:\n%s" % (dataset, r.stderr))


def several(tmp):
    """A ReadSamples request of several datasets (a mixture's batch, docs/data-channel.md,
    "Several datasets in one request"), as data-channel and gRPC input."""
    import bwdata
    dpb = bwdata.pb(tmp)
    req = dpb.ReadSamplesRequest(
        datasets=[dpb.DatasetRef(dataset=dpb.Dataset(format="npy", sources=["npy/*.npy"]),
                                 fingerprint="f" * 64),
                  dpb.DatasetRef(dataset=dpb.Dataset(format="jsonl", sources=["jsonl/*"]))],
        indices=[3, 1, 4, 1, 5], index_datasets=[0, 1, 1, 0, 1],
        routing=dpb.Routing(placement_version=2, num_shards=16)).SerializeToString()
    return {"dchan-several": struct.pack("<IIQ", 0x31445742, 1, len(req)) + req,
            "grpc-several": b"\x00" + req}


def main():
    tmp = tempfile.mkdtemp(prefix="bw-capture-")
    try:
        root = os.path.join(tmp, "data")
        os.makedirs(root)
        for fmt, files in (("npy", 1), ("tfrecord", 3), ("jsonl", 2), ("tar", 2)):
            r = bt.cli("gen", "--format", fmt, "--out", os.path.join(root, fmt), "--num-samples",
                       40, "--sample-bytes", 16, "--sample-bytes-max", 64, "--files", files)
            if r.returncode != 0:
                raise SystemExit(r.stderr)
        coord = bt.coordinator(tmp)
        port = free_port()
        proxy = Proxy(("127.0.0.1", port))
        w = bt.worker(tmp, coord.addr, "capture", data_root=root,
                      args=["--data-listen", "127.0.0.1:%d" % port, "--data-advertise",
                            "127.0.0.1:%d" % proxy.port])
        fetch(coord.addr, "cap-npy", "npy:npy/*.npy", "--shuffle", "--seed", 3)
        fetch(coord.addr, "cap-tfr", "tfrecord:tfrecord/*.tfrecord", "--mode", "accelerate")
        for fmt, glob in (("tfrecord", "*.tfrecord"), ("jsonl", "*.jsonl"), ("tar", "*.tar")):
            fetch(coord.addr, "cap-it-" + fmt, "%s:%s/%s" % (fmt, fmt, glob), "--mode",
                  "iterable")
        w.stop()
        coord.stop()
        seen, kept = set(), {1: 0, 2: 0}
        shutil.rmtree(OUT, ignore_errors=True)
        os.makedirs(OUT)
        for buf in proxy.sent:
            for kind, req in requests(buf):
                # one request per kind and dataset (field 1, first in the body; its length
                # fits in one byte here)
                key = (kind, req[16:18 + req[17]])
                if key in seen or kept.get(kind, PER_KIND) >= PER_KIND:
                    continue
                seen.add(key)
                n = kept[kind]
                kept[kind] += 1
                with open(os.path.join(OUT, "dchan-%d-%d" % (kind, n)), "wb") as f:
                    f.write(req)
                with open(os.path.join(OUT, "grpc-%d-%d" % (kind, n)), "wb") as f:
                    f.write(bytes([kind - 1]) + req[16:])
        if kept[1] == 0 or kept[2] == 0:
            raise SystemExit("no traffic of kind %s was seen" % [k for k in kept if not kept[k]])
        edge = {
            "header-too-big": struct.pack("<IIQ", 0x31445742, 1, 40 << 20),
            "header-kind-9": struct.pack("<IIQ", 0x31445742, 9, 4) + b"\x0a\x00\x10\x01",
            "dchan-empty-body": struct.pack("<IIQ", 0x31445742, 2, 0),
        }
        edge.update(several(tmp))
        for name, data in edge.items():
            with open(os.path.join(OUT, name), "wb") as f:
                f.write(data)
        print("wrote %d ReadSamples and %d ReadStream requests (each twice) and %d edge cases "
              "to %s" % (kept[1], kept[2], len(edge), OUT))
    finally:
        bt.kill_all()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
