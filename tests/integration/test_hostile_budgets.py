"""A storage worker's budgets hold under a hostile client (docs/operating.md, "Worker budgets";
docs/security.md), each abuse answered with a clear refusal while the worker keeps serving:

* a glob matching 20,000 files is refused (RESOURCE_EXHAUSTED naming --max-sources);
* a dataset listing one file 11,740 times opens (every file held counts against
  --max-open-files), a second such dataset drops the idle first, one listing it 12,500 times
  is refused naming --max-open-files, and the worker's descriptors stay within the budget;
* four spellings of one file (nl.txt, ./nl.txt, nl.tx?, nl.t?t) are one cache entry: one
  fingerprint, one source path, one open dataset, one descriptor on the file, one line index
  in memory; a file whose line index (8 bytes a line) alone is over --dataset-memory-bytes is
  refused naming that flag;
* a FIFO below the root is refused at once on both transports (never opened blocking);
* a symbolic link out of the root, and a glob through a link to /, are refused at once and the
  message names nothing outside the root; a missing path below such a link is refused the same
  way (nothing outside can be probed);
* 5,000 data-channel connections from one address (127.0.0.2) that never send a request get
  at most --data-max-connections-per-peer slots, the rest an ERROR naming that flag; a request
  from another address (127.0.0.1) is served meanwhile, and the idle ones are closed after
  --data-hello-timeout-ms;
* a worker registered with ANSI escapes and control characters in its address and version is
  refused, or shown escaped by `batchwire status` (no raw escape reaches the terminal).

Meanwhile a legitimate job on the same worker reads every batch exactly as `batchwire plan`
says.
"""

import os
import re
import resource
import socket
import struct
import time
import urllib.request

import grpc

import bwdata as bd
import bwpy
import bwtest as bt
import test_data_channel as dc
from test_auth import Client, bpb

SC = grpc.StatusCode
REGISTER = "/batchwire.v1.Coordinator/RegisterWorker"
MAX_OPEN_FILES = 12000
MEMORY = 128 << 20          # --dataset-memory-bytes
NL_LINES = 4 << 20          # nl.txt: 4 Mi empty lines, a 32 MiB index
BIG_LINES = 16 << 20        # big.txt: a 128 MiB index, over MEMORY by itself
PER_PEER = 512              # the default --data-max-connections-per-peer
HELLO_MS = 8000
IDLE = 5000


def fd_count(pid, target=None):
    """Open descriptors of pid (those pointing at `target` when given)."""
    d = "/proc/%d/fd" % pid
    n = 0
    for f in os.listdir(d):
        try:
            link = os.readlink(os.path.join(d, f))
        except OSError:
            continue
        n += target is None or link == target
    return n


def rss_anon_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def open_datasets(metrics_addr):
    text = urllib.request.urlopen("http://%s/metrics" % metrics_addr, timeout=10).read().decode()
    m = re.search(r"^batchwire_worker_open_datasets (\S+)$", text, re.M)
    bt.check(m is not None, "the worker's /metrics shows batchwire_worker_open_datasets")
    return int(float(m.group(1)))


def refused(c, fmt, sources, code, needles, what, timeout=10, quick=2.0):
    t0 = time.monotonic()
    details = bd.expect_error(lambda: c.describe(fmt, sources, timeout=timeout), code, *needles)
    took = time.monotonic() - t0
    bt.check(took < quick, "%s: refused in %.2fs: %s" % (what, took, details[:220]))
    return details


def make_data(root):
    with open(os.path.join(root, "one.txt"), "w") as f:
        f.write("a\nb\n")
    with open(os.path.join(root, "nl.txt"), "wb") as f:
        f.write(b"\n" * NL_LINES)
    with open(os.path.join(root, "big.txt"), "wb") as f:
        f.write(b"\n" * BIG_LINES)
    many = os.path.join(root, "many")
    os.makedirs(many)
    for i in range(20000):
        open(os.path.join(many, "f%05d.txt" % i), "w").close()
    os.mkfifo(os.path.join(root, "fifo.txt"))
    os.symlink("/etc", os.path.join(root, "etc"))
    os.symlink("/", os.path.join(root, "rootlink"))


def sources_and_descriptors(c, w):
    bt.log("===== sources bounded, descriptors within --max-open-files =====")
    refused(c, "text", ["many/*.txt"], SC.RESOURCE_EXHAUSTED,
            ["more than 16384", "--max-sources"], "a glob matching 20,000 files")
    base = fd_count(w.pid)
    info = c.describe("text", ["one.txt"] * 11740, timeout=60)
    bt.check(info.length == 2 * 11740, "a dataset listing one file 11,740 times opens (%d samples)"
             % info.length)
    held = fd_count(w.pid)
    bt.check(held - base >= 11740 and held < MAX_OPEN_FILES + 600,
             "the worker holds %d descriptors (%d before), within --max-open-files %d" %
             (held, base, MAX_OPEN_FILES))
    info = c.describe("text", ["one.txt"] * 11741, timeout=60)
    held2 = fd_count(w.pid)
    bt.check(info.length == 2 * 11741 and held2 < MAX_OPEN_FILES + 600,
             "a second such dataset (11,741 copies) drops the idle first: %d descriptors" % held2)
    refused(c, "text", ["one.txt"] * 12500, SC.RESOURCE_EXHAUSTED,
            ["open files", "--max-open-files", str(MAX_OPEN_FILES)],
            "a dataset listing one file 12,500 times", quick=10)
    bt.check(fd_count(w.pid) < MAX_OPEN_FILES + 600, "descriptors still within the budget")


def spellings(c, w, root, metrics_addr):
    bt.log("===== four spellings of one file are one cache entry =====")
    c.describe("npy", ["ds/part-00000.npy"])  # the legitimate job's
    before_sets = open_datasets(metrics_addr)
    rss0 = rss_anon_kb(w.pid)
    infos = [c.describe("text", [s], timeout=60)
             for s in ["nl.txt", "./nl.txt", "nl.tx?", "nl.t?t"]]
    rss1 = rss_anon_kb(w.pid)
    fps = set(i.fingerprint for i in infos)
    paths = set(tuple(s.path for s in i.sources) for i in infos)
    bt.check(len(fps) == 1 and paths == {("nl.txt",)} and
             all(i.length == NL_LINES for i in infos),
             "nl.txt, ./nl.txt, nl.tx?, nl.t?t: one fingerprint %s, one source path %r" %
             (fps, paths))
    sets = open_datasets(metrics_addr)
    nl = os.path.join(os.path.realpath(root), "nl.txt")
    bt.check(sets <= before_sets + 1 and fd_count(w.pid, nl) == 1,
             "one open dataset for the four (%d open, %d before), one descriptor on nl.txt" %
             (sets, before_sets))
    grew = (rss1 - rss0) / 1024.0
    # four indexes would be 128 MiB; one is 32 (under ASan its quarantine keeps the 16 MiB
    # the index grew from, and more)
    bt.check(grew < 3 * NL_LINES * 8 / (1 << 20),
             "the worker's anonymous memory grew %.1f MiB for the four (one index: %d MiB, "
             "four: %d)" % (grew, NL_LINES * 8 >> 20, 4 * NL_LINES * 8 >> 20))
    refused(c, "text", ["big.txt"], SC.RESOURCE_EXHAUSTED,
            ["dataset memory", "--dataset-memory-bytes", str(MEMORY)],
            "a file whose line index alone (128 MiB) is over the budget", quick=20)


def fifo_and_links(c, w, root):
    bt.log("===== a FIFO, a link out of the root, a glob through a link to / =====")
    for src in ["fifo.txt", "fif?.txt"]:
        refused(c, "text", [src], SC.INVALID_ARGUMENT, ["not a regular file"],
                "gRPC: a FIFO (%s)" % src)
    pbm = c.pb
    s = dc.connect(w.data_addr)
    s.sendall(dc.frame(dc.request(pbm, ["fifo.txt"], [0], fmt="text")))
    dc.expect_error(s, dc.BW_INVALID_ARGUMENT, ["not a regular file"], "data channel: a FIFO")
    s.close()
    for src, what in [("etc/hostname", "a file through a link to /etc"),
                      ("etc/*", "a glob through a link to /etc"),
                      ("etc/no-such-file-xyz", "a missing file through a link to /etc"),
                      ("rootlink/*/*/*", "a glob through a link to /"),
                      ("rootlink/etc/passwd", "a file through a link to /")]:
        d, _code = refused(c, "text", [src], SC.PERMISSION_DENIED, ["outside the data root"],
                           what)
        outside = [p for p in (" /", "'/", "root:x:") if p in d]  # a resolved path, a line
        bt.check(not outside, "and the message names nothing outside the root (only the path "
                 "as given)", outside)


def idle_connections(c, w, coord, arr, rows):
    bt.log("===== %d idle data-channel connections from one address =====" % IDLE)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, IDLE + 2000)), hard))
    host, port = w.data_addr.rsplit(":", 1)
    socks = []
    t0 = time.monotonic()
    for _ in range(IDLE):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.2", 0))
        s.settimeout(10)
        s.connect((host, int(port)))
        socks.append(s)
    bt.log("connected %d in %.1fs" % (IDLE, time.monotonic() - t0))

    def classify():
        held, shut, msgs = [], 0, set()
        for s in socks:
            s.setblocking(False)
            try:
                data = s.recv(4096)
            except BlockingIOError:
                held.append(s)
                continue
            except ConnectionResetError:
                data = b""
            shut += 1
            if len(data) >= 24:
                typ, code, n, _ = struct.unpack("<IIQQ", data[:24])
                msgs.add((typ, data[24:24 + n].decode(errors="replace")))
        return held, shut, msgs
    held, shut, msgs = classify()
    for _ in range(50):
        if len(held) <= PER_PEER:
            break
        time.sleep(0.1)
        h2, s2, m2 = classify()
        held, shut, msgs = h2, shut + s2, msgs | m2
        socks[:] = h2
    bt.check(len(held) <= PER_PEER and any("--data-max-connections-per-peer" in m for _, m in msgs),
             "%d of %d connections from 127.0.0.2 are held, the others refused: %s" %
             (len(held), IDLE, sorted(m for _, m in msgs)[:1]))
    socks[:] = held
    pbm = c.pb
    s = dc.connect(w.data_addr)
    s.sendall(dc.frame(dc.request(pbm, ["ds/part-00000.npy"], [0, 5, 7])))
    dc.expect_samples(s, rows, [0, 5, 7], "a data-channel request from 127.0.0.1 meanwhile")
    s.close()
    legitimate_job(coord, arr)
    t0 = time.monotonic()
    bt.poll(lambda: all(closed(s) for s in socks), HELLO_MS / 1000.0 + 10,
            what="the idle connections closed by --data-hello-timeout-ms")
    bt.ok("the %d idle connections were closed %.1fs later (--data-hello-timeout-ms %d)" %
          (len(socks), time.monotonic() - t0, HELLO_MS))
    for s in socks:
        s.close()


def closed(s):
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def legitimate_job(coord, arr):
    bt.log("===== a legitimate job on the same worker =====")
    bwpy.job_reads_plan(coord.addr, arr, 8, "the legitimate job")


def escapes(coord):
    bt.log("===== escape sequences in a worker's address and version =====")
    cl = Client(coord.addr)
    code, details = cl.code(REGISTER, bpb.RegisterWorkerRequest(
        id="esc-1", address="127.0.0.1:1\x1b[2J\x1b[31mRED", data_address="x\x07:2",
        incarnation=7, capabilities=bpb.WorkerCapabilities(version="v1\x1b]0;pwned\x07",
                                                           commit="c\x9b31m")))
    cl.close()
    r = bt.cli("status", "--coordinator", coord.addr)
    bt.check(r.returncode == 0, "batchwire status runs", r.stderr)
    raw = [c for c in ("\x1b", "\x07", "\x9b") if c in r.stdout or c in r.stderr]
    bt.check(not raw, "no raw escape or control character reaches the terminal (%r)" % raw)
    if code == SC.OK:
        bt.check("\\x1B[2J" in r.stdout and "esc-1" in r.stdout,
                 "the registered address is shown escaped",
                 [line for line in r.stdout.splitlines() if "esc-1" in line])
    else:
        bt.ok("the coordinator refused the registration: %s %s" % (code, details[:160]))


def test(tmpdir):
    root = os.path.join(tmpdir, "data")
    os.makedirs(root)
    arr = bwpy.gen_npy(root, "ds", 200, (3, 5))
    rows = [arr[i].tobytes() for i in range(len(arr))]
    make_data(root)
    coord = bt.coordinator(tmpdir, args=["--heartbeat-ms", "500", "--dead-after", "2"])
    w = bt.worker(tmpdir, coord.addr, "w1", data_root=root, args=[
        "--max-open-files", MAX_OPEN_FILES, "--dataset-memory-bytes", MEMORY,
        "--data-hello-timeout-ms", HELLO_MS, "--data-max-connections", 1024,
        "--metrics-listen", "127.0.0.1:0"])
    w.wait_log(r"registered with coordinator")
    m = re.search(r"data-channel=(\S+)", w.log_text())
    w.data_addr = m.group(1)
    metrics = re.search(r"metrics on (?:https?://)?([0-9.]+:[0-9]+)", w.log_text()).group(1)
    c = bd.DataClient(tmpdir, w.addr)
    sources_and_descriptors(c, w)
    spellings(c, w, root, metrics)
    fifo_and_links(c, w, root)
    idle_connections(c, w, coord, arr, rows)
    escapes(coord)
    c.close()
    bt.check(w.running() and coord.running(), "both daemons are still up")
    bt.check(w.stop() == 0 and coord.stop() == 0, "and stop cleanly")


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=180)
