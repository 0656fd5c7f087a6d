"""Dataset files that change under a worker that serves them (docs/formats.md, "Files that
change under a worker"). For an .npy file and a TFRecord file, each of three changes is made
while clients read the file with the job's fingerprint over gRPC (ReadSamples, and ReadStream
for TFRecord) and over the data channel (ReadSamples, ReadStream; ReadSamples also with RUN
frames, where a worker sends an .npy file's rows lying back to back as one piece):

* truncated to half its size;
* overwritten in place with different bytes of the same size (a valid file: TFRecord CRCs
  match, so only the file's identity can tell);
* deleted.

In each case no request that ends well returns a byte other than the original file's (the new
bytes, or the zeros a truncated mapping reads as), the requests that touch the file after the change fail
with an error naming the file, the worker stays up (no SIGBUS: the files are mapped), and
another dataset keeps serving over both transports. A read right after the change, inside the
dataset cache's one-second re-check, fails with BW_FAILED_PRECONDITION saying the file changed
on disk; a later one is refused by the fingerprint (or not found).
"""

import os
import sys
import threading
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwtest as bt  # noqa: E402
import bwdata as bd  # noqa: E402
import test_data_channel as dc  # noqa: E402
import test_data_channel_runs as dcr  # noqa: E402
import test_data_channel_streams as dcs  # noqa: E402

SC = grpc.StatusCode
# What a request touching a changed file may fail with: the file changed under the open dataset
# (FAILED_PRECONDITION), the reopened dataset has another fingerprint (MISMATCH), or it is gone.
# A truncated file reopened is refused by its format (BW_CORRUPT, naming the file and offset).
OK_CODES = {"BW_FAILED_PRECONDITION", "BW_MISMATCH", "BW_NOT_FOUND", "BW_CORRUPT"}
# A truncation while gRPC sends a record straight from the mapping: the kernel's copy fails
# (EFAULT) and gRPC closes that connection, failing its calls with UNAVAILABLE (retried by
# clients). Allowed for truncation only.
LOST = "connection lost"
DC_CODES = {-13: "BW_FAILED_PRECONDITION", -20: "BW_MISMATCH", -4: "BW_NOT_FOUND",
            -10: "BW_CORRUPT"}


def write_files(root, tag):
    """npy: 64 rows of 64 KiB (sent from the mapping); tfrecord: 400 records of 1-9 KiB.
    Returns {fmt: (rel path, [record bytes])}."""
    rng = np.random.default_rng(hash(tag) & 0xffff)
    a = rng.integers(0, 256, size=(64, 64 << 10), dtype=np.uint8)
    npy = "%s.npy" % tag
    np.save(os.path.join(root, npy), a)
    recs = [rng.integers(0, 256, size=int(rng.integers(1, 9) << 10), dtype=np.uint8).tobytes()
            for _ in range(400)]
    tfr = "%s.tfrecord" % tag
    with open(os.path.join(root, tfr), "wb") as f:
        f.write(bd.tfrecord_bytes(recs))
    return {"npy": (npy, [a[i].tobytes() for i in range(64)]), "tfrecord": (tfr, recs)}


def mutate(path, how):
    if how == "truncate":
        os.truncate(path, os.path.getsize(path) // 2)
    elif how == "delete":
        os.unlink(path)
    else:  # overwrite in place: same size, other bytes, still a valid file of its format
        data = open(path, "rb").read()
        if path.endswith(".npy"):
            hdr = len(data) - 64 * (64 << 10)
            new = data[:hdr] + bytes((b ^ 0x5a) for b in data[hdr:hdr + 4096]) + \
                bytes(len(data) - hdr - 4096)
        else:
            recs, off = [], 0
            while off < len(data):
                n = int.from_bytes(data[off:off + 8], "little")
                recs.append(bytes(n))  # same lengths, all zeros: valid CRCs
                off += 16 + n
            new = bd.tfrecord_bytes(recs)
        assert len(new) == len(data)
        with open(path, "r+b") as f:
            f.write(new)


class Readers:
    """Client threads reading one dataset with its fingerprint until stopped; every response
    is checked against the original records."""

    def __init__(self, c, daddr, fmt, rel, recs, fp):
        self.c, self.daddr, self.fmt, self.rel, self.recs, self.fp = c, daddr, fmt, rel, recs, fp
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.good, self.errors, self.wrong, self.closed = 0, [], [], 0
        self.changed_at, self.late = 0.0, []  # complete answers to requests sent after it
        # dc_runs: the data channel with RUN frames (FEATURES), where a worker sends samples
        # lying back to back in an .npy file as one piece (bw__rp_next_span)
        kinds = ["grpc_samples", "dc_samples", "dc_runs"]
        if fmt == "tfrecord":
            kinds += ["grpc_stream", "dc_stream"]
        self.threads = [threading.Thread(target=self.loop, args=(k,), daemon=True) for k in kinds]

    def record(self, kind, result, started=0.0, whole=True):
        """result: [(key, bytes)] (whole: a complete answer) or (code name, message)."""
        with self.lock:
            if isinstance(result, tuple):
                self.errors.append((kind, result[0], result[1]))
                return
            # The samples before an error are dropped with the request: only answers that
            # end well must hold the original bytes.
            for key, data in result if whole else ():
                if data != self.recs[key]:
                    self.wrong.append((kind, key, len(data)))
                    return
            if whole:
                self.good += 1
                if self.changed_at and started > self.changed_at:
                    self.late.append(kind)

    def once(self, kind, sock):
        n = len(self.recs)
        if kind == "grpc_samples":
            try:
                rows = self.c.read(self.fmt, [self.rel], list(range(n)), fingerprint=self.fp,
                                   timeout=20)
            except grpc.RpcError as e:
                if e.code() == SC.UNAVAILABLE and not dict(e.trailing_metadata() or ()):
                    return (LOST, e.details() or "")
                return (dict(e.trailing_metadata() or ()).get("bw-error"), e.details() or "")
            return [(r["index"], r["data"]) for r in rows]
        if kind == "grpc_stream":
            req = dcs.stream_request(self.c.pb, self.fmt, [self.rel], 0, fingerprint=self.fp)
            got = dcs.grpc_stream(self.c, req)
            if got and got[0] == "error" and got[1] is None:
                return (LOST, got[2])
            return got[1:] if got and got[0] == "error" else [(k, d) for k, d, _, _ in got]
        if kind == "dc_samples":
            sock.sendall(dc.frame(dc.request(self.c.pb, [self.rel], range(n), fmt=self.fmt,
                                             fingerprint=self.fp)))
            got = dc.response_full(sock, "%s %s" % (kind, self.rel))
        elif kind == "dc_runs":
            sock.sendall(dc.frame(dc.request(self.c.pb, [self.rel], range(n), fmt=self.fmt,
                                             fingerprint=self.fp)))
            frames, tail = dcr.frames(sock, "%s %s" % (kind, self.rel))
            samples = []  # (index, bytes) in request order: the indices are 0, 1, ...
            for _, _, count, size, data in frames:
                for j in range(count):
                    samples.append((len(samples), data[j * size:(j + 1) * size]))
            got = ("end", samples) if tail[0] == "end" else ("error", samples, tail[1:])
        else:
            req = dcs.stream_request(self.c.pb, self.fmt, [self.rel], 0, fingerprint=self.fp)
            got = dcs.dchan_stream(sock, req, "%s %s" % (kind, self.rel))
        if got[0] == "error":
            # the records before the error were served: they must be the original ones too
            self.record(kind, got[1], whole=False)
            code, msg = got[2]
            return (DC_CODES.get(code, str(code)), msg)
        return got[1]

    def connect(self, kind):
        sock = dc.connect(self.daddr)
        if kind == "dc_runs" and dcr.features(sock, dcr.FEATURE_RUNS, "FEATURES") != \
                dcr.FEATURE_RUNS:
            raise bt.TestFailure("the worker did not turn RUN frames on")
        return sock

    def loop(self, kind):
        sock = self.connect(kind) if kind.startswith("dc") else None
        while not self.stop.is_set():
            try:
                started = time.monotonic()
                self.record(kind, self.once(kind, sock), started)
            except (OSError, bt.TestFailure) as e:
                # A record checked just before the file shrank: the kernel's copy from the
                # mapping fails (EFAULT) and the worker closes the connection mid-answer.
                if not sock or (isinstance(e, bt.TestFailure) and "closed" not in str(e)):
                    raise
                with self.lock:
                    self.closed += 1
                sock.close()
                sock = self.connect(kind)
        if sock:
            sock.close()

    def start(self):
        for t in self.threads:
            t.start()

    def join(self):
        self.stop.set()
        for t in self.threads:
            t.join(30)
            bt.check(not t.is_alive(), "reader thread %s ended" % t.name)


def check_other(c, daddr, other, fps):
    """The other dataset is served bit-exact over gRPC and the data channel."""
    for fmt, (rel, recs) in other.items():
        rows = c.read(fmt, [rel], list(range(len(recs))), fingerprint=fps[rel])
        if [r["data"] for r in rows] != recs:
            raise bt.TestFailure("%s: gRPC served other bytes" % rel)
        s = dc.connect(daddr)
        s.sendall(dc.frame(dc.request(c.pb, [rel], range(len(recs)), fmt=fmt,
                                      fingerprint=fps[rel])))
        kind, samples, _ = dc.response(s, "other " + rel)
        s.close()
        if kind != "end" or [d for _, d in samples] != recs:
            raise bt.TestFailure("%s: the data channel served other bytes or failed" % rel)


def scenario(c, w, daddr, root, how, fmt, other, fps):
    tag = "%s_%s" % (how, fmt)
    rel, recs = write_files(root, tag)[fmt]
    fp = c.describe(fmt, [rel]).fingerprint
    rd = Readers(c, daddr, fmt, rel, recs, fp)
    rd.start()
    time.sleep(0.4)
    with rd.lock:
        before = rd.good
    mutate(os.path.join(root, rel), how)
    # Within the cache's one-second re-check: the open dataset still has the old file's
    # fingerprint, and the read must be refused because the file changed.
    err = None
    for attempt in range(40):
        try:
            c.read(fmt, [rel], [0, len(recs) - 1], fingerprint=fp, timeout=20)
            raise bt.TestFailure("%s %s: a read right after the change succeeded" % (how, rel))
        except grpc.RpcError as e:
            err = e
            if how != "truncate" or dict(e.trailing_metadata() or ()).get("bw-error"):
                break
            # No answer of the worker's (no bw-error): the connection was lost (LOST, above).
            # The readers' gRPC calls share it, and one whose sendmsg met the shrunk mapping
            # (EFAULT, "Bad address") ends it for every call on it -- under ASan that can
            # happen several times in a row. Retried, as clients do.
            time.sleep(0.05)
    bt.check(w.running(), "%s %s: the worker is up after the change (exit status %s)" %
             (how, fmt, w.proc.poll()))
    code = dict(err.trailing_metadata() or ()).get("bw-error")
    bt.check(code in OK_CODES and rel in (err.details() or ""),
             "%s %s: a read right after the change fails naming the file: %s %s" %
             (how, fmt, code, err.details()))
    rd.changed_at = time.monotonic()
    time.sleep(1.3)
    rd.join()
    bt.check(not rd.late, "%s %s: every request sent after the change failed (%d succeeded: %s)" %
             (how, fmt, len(rd.late), sorted(set(rd.late))))
    bt.check(not rd.wrong, "%s %s: %d responses before and %d after the change, none with a byte "
             "other than the original file's (%d errors, %d data-channel connections closed "
             "mid-answer) %s" %
             (how, fmt, before, rd.good - before, len(rd.errors), rd.closed, rd.wrong[:3]))
    bt.check(before > 0 and rd.errors, "%s %s: reads succeeded before and failed after" %
             (how, fmt))
    bad = [e for e in rd.errors if not (e[1] in OK_CODES and rel in e[2] or
                                        e[1] == LOST and how == "truncate")]
    bt.check(not bad, "%s %s: every failure has an expected code and names the file (%s)" %
             (how, fmt, "; ".join(sorted({"%s %s" % (e[0], e[1]) for e in rd.errors}))),
             bad[:3])
    lost = sum(e[1] == LOST for e in rd.errors)
    if lost:
        bt.log("  %d gRPC calls lost their connection (UNAVAILABLE)" % lost)
    changed = [e for e in rd.errors if e[1] == "BW_FAILED_PRECONDITION"]
    if changed:
        bt.log("  e.g. %s: %s" % (changed[0][0], changed[0][2]))
    bt.check(w.running(), "%s %s: the worker is still up" % (how, fmt))
    check_other(c, daddr, other, fps)
    return len(changed)


def test(tmpdir):
    root = os.path.join(tmpdir, "data")
    os.makedirs(root)
    other = write_files(root, "other")
    coord = bt.coordinator(tmpdir)
    w = bt.worker(tmpdir, coord.addr, "w1", data_root=root)
    daddr = w.first_line.split("data-channel=", 1)[1].split()[0]
    c = bd.DataClient(tmpdir, w.addr)
    fps = {rel: c.describe(fmt, [rel]).fingerprint for fmt, (rel, _) in other.items()}
    check_other(c, daddr, other, fps)
    changed = 0
    for how in ("truncate", "overwrite", "delete"):
        for fmt in ("npy", "tfrecord"):
            changed += scenario(c, w, daddr, root, how, fmt, other, fps)
    bt.check(changed > 0, "%d requests in all were refused because their file changed under "
             "the open dataset (BW_FAILED_PRECONDITION)" % changed)
    bt.check(w.running() and "SIGBUS" not in w.log_text(), "the worker is up after all of it")


if __name__ == "__main__":
    bt.main(test, timeout=120)
