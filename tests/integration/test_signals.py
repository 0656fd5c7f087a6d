"""Signals and silence (issue 22, item 4; docs/client.md, "Signals" and "Retries"): SIGTERM
and SIGINT stop `batchwire fetch` within STOP_BOUND_S in every phase, and a coordinator that
cannot be reached is not met with silence.

* Joining a coordinator whose port is closed (every connection refused): SIGTERM 0.3 s in
  (the first tries) and SIGINT 2.5 s in (retrying) -- exit 143 and 130 within the bound, a
  message naming the signal, no cursor file (no batch was delivered).
* A coordinator that accepts connections and never answers (a call in flight, with a 10 s
  deadline): a WARN line 1.5 s into the try (not at its deadline), then SIGTERM -- the call is
  cancelled, not waited out.
* While it retries, the client says so: a WARN line within 2 s of the first failure naming the
  address, the time left and the error, then one every 10 s (not more often).
* A host name that does not resolve fails at once (exit 1, well before --retry-ms) saying so.
  Loopback only: the client runs in a private network namespace whose resolver (this test, on
  the namespace's loopback) answers NXDOMAIN.
* A live cluster, mid-epoch: SIGTERM after 30 batches of a run at full speed -- exit 143
  within the bound, --cursor-out holds the cursor of the last batch printed (a fetch resumed
  from it at once -- the rank was left, with a 20 s lease -- prints exactly the plan's batches
  after it, to the end of the epoch).
* Waiting for a worker that stops (SIGSTOP) after 10 batches: once nothing came for a second,
  SIGINT (data channel) or SIGTERM (--transport grpc: a stream in flight) -- exit 130/143
  within the bound, the cursor of the last batch printed; after SIGCONT a resumed fetch
  continues exactly after it.
* --epochs and --job-epochs: a resumed run of `--job-epochs 3` (no --epochs) runs every epoch
  the job has left from the resume point, and the job is finished (removed) when every rank
  has delivered its last epoch.

Timings are the issue's acceptance bounds (1 s to stop, 2 s to the first WARN line, 10 s
between them), not speed; both builds must meet them.
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwtest as bt  # noqa: E402
import test_client_e2e as e2e  # noqa: E402

STOP_BOUND_S = 1.0
CFG = {"mode": "torch", "B": 2, "shuffle": True, "seed": 5}
N = 3000  # samples: 1500 batches an epoch for one rank


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def startup_seconds():
    """How long this build's `batchwire` takes to start and exit on this machine now (the
    slowest of three `--version` runs): the allowance for process start-up in the WARN
    timings below, which the tests measure from before the process is started (a sanitizer
    build on a loaded 2-core machine takes a good part of a second)."""
    took = []
    for _ in range(3):
        t0 = time.monotonic()
        subprocess.run([bt.CLI, "--version"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=True)
        took.append(time.monotonic() - t0)
    return max(took)


def fetch(coord, job, extra=(), wrap=None, rank=0, world=1):
    return e2e.Fetch(coord, job, "npy:npy/*.npy", CFG, rank, world, list(extra), wrap=wrap)


def stop(f, sig, what):
    """Sends sig to the fetch process; it must exit 128+sig within STOP_BOUND_S. Returns the
    time it took."""
    t = time.monotonic()
    f.proc.send_signal(sig)
    f.wait(30)
    took = f.exited_at() - t
    e2e.check_clean_log(what, f.stderr())
    bt.check(f.rc == 128 + sig, "%s: exit status %d after signal %d (want %d)" %
             (what, f.rc, sig, 128 + sig), f.stderr()[-2000:])
    bt.check(took <= STOP_BOUND_S, "%s: exited %.3f s after the signal (bound %.1f s)" %
             (what, took, STOP_BOUND_S), f.stderr()[-2000:])
    return took


def unreachable(tmpdir):
    port = closed_port()
    addr = "127.0.0.1:%d" % port
    for sig, after, phase in ((15, 0.3, "joining"), (2, 2.5, "retrying")):
        cur = os.path.join(tmpdir, "cursor-unreachable-%d" % sig)
        f = fetch(addr, "sig", ["--retry-ms", 60000, "--cursor-out", cur])
        time.sleep(after)
        bt.check(f.proc.poll() is None, "fetch is still %s after %.1f s" % (phase, after))
        took = stop(f, sig, "closed port, %s" % phase)
        bt.check("stopped by %s" % ("SIGTERM" if sig == 15 else "SIGINT") in f.stderr(),
                 "it says which signal stopped it", f.stderr())
        bt.check(not os.path.exists(cur), "no cursor file: no batch was delivered")
        bt.ok("signal %d while %s (connections refused): exit %d in %.3f s" %
              (sig, phase, f.rc, took))


def silent_coordinator(tmpdir):
    """A listener that accepts and never speaks HTTP/2: the join's call waits on its deadline."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held = []
    done = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not done.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                pass
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    addr = "127.0.0.1:%d" % srv.getsockname()[1]
    try:
        start = startup_seconds()
        t0 = time.monotonic()
        f = fetch(addr, "sig", ["--retry-ms", 60000, "--timeout-ms", 10000])
        line = bt.poll(lambda: next((x for x in f.err if " WARN " in x), None), 6, interval=0.02,
                       what="a WARN line about the silent coordinator")
        waited = time.monotonic() - t0
        # Reported when the try has waited 1.5 s without an answer ("no answer yet") or, first,
        # when the connection attempt ends at its own 1 s deadline, the peer having never sent
        # HTTP/2 settings (docs/operating.md, "Networks") -- never at the call's 10 s deadline.
        bt.check(1.0 <= waited <= 2.0 + start and addr in line and
                 ("no answer yet" in line or "connection attempt timed out" in line),
                 "a try without an answer is reported after %.2f s (the connection attempt's "
                 "1 s deadline, or 1.5 s into the try: within 2 s + %.2f s of start-up, not at "
                 "its 10 s deadline)" % (waited, start), line)
        bt.check(f.proc.poll() is None, "fetch is still waiting on the silent coordinator")
        took = stop(f, 15, "silent coordinator, call in flight")
        bt.ok("a coordinator that never answers: WARN after %.2f s, SIGTERM with the call in "
              "flight (10 s deadline): exit 143 in %.3f s" % (waited, took))
    finally:
        done.set()
        t.join(2)
        for c in held:
            c.close()
        srv.close()


def warn_lines(tmpdir):
    addr = "127.0.0.1:%d" % closed_port()
    start = startup_seconds()
    t0 = time.monotonic()
    f = fetch(addr, "sig", ["--retry-ms", 30000, "--log-level", "warn"])
    stamps = []

    def warns():
        out = [x for x in f.err if " WARN " in x and "does not answer" in x]
        while len(stamps) < len(out):
            stamps.append(time.monotonic())
        return out
    first = bt.poll(lambda: warns() or None, 5, interval=0.02, what="the first WARN line")[0]
    bt.check(stamps[0] - t0 <= 2.0 + start, "the first WARN line came %.2f s after the start "
             "(bound 2 s + %.2f s of start-up)" % (stamps[0] - t0, start), first)
    for needle in (addr, "retrying for", "left_ms=", "err=", "Connection refused"):
        bt.check(needle in first, "the WARN line names %r" % needle, first)
    left = float(first.split("retrying for ", 1)[1].split(" s", 1)[0])
    bt.check(28.0 <= left <= 30.0, "it gives the time left (%.1f s of 30)" % left, first)
    bt.poll(lambda: len(warns()) >= 2 or None, 14, interval=0.05, what="the second WARN line")
    gap = stamps[1] - stamps[0]
    bt.check(9.0 <= gap <= 11.5, "the second WARN line came %.2f s after the first (every 10 s)"
             % gap, "".join(f.err))
    second = warns()[1]
    left2 = float(second.split("retrying for ", 1)[1].split(" s", 1)[0])
    bt.check(left - 11.5 <= left2 <= left - 9.0, "the time left went down (%.1f -> %.1f s)" %
             (left, left2), second)
    took = stop(f, 2, "closed port, after two WARN lines")
    bt.check(len(warns()) == 2, "no other WARN line in %.1f s (every 10 s, not more often)" %
             (time.monotonic() - t0), "".join(f.err))
    bt.ok("retrying says so: WARN %.2f s after the start naming %s, the time left (%.1f s) and "
          "the error; the next %.2f s later; SIGINT then: exit 130 in %.3f s" %
          (stamps[0] - t0, addr, left, gap, took))


NXDOMAIN_RESOLVER = r"""
import socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 53))
sys.stdout.write("ready\n"); sys.stdout.flush()
while True:
    q, peer = s.recvfrom(2048)
    if len(q) < 12:
        continue
    # the same id and question, QR=1 RD=1 RA=1, RCODE=3 (NXDOMAIN), no answers
    s.sendto(q[:2] + struct.pack(">HHHHH", 0x8183, struct.unpack(">H", q[4:6])[0], 0, 0, 0)
             + q[12:], peer)
"""


def unresolvable(tmpdir):
    """In a user + network + mount namespace: loopback only, /etc/resolv.conf pointing at this
    test's resolver there, which says every name does not exist."""
    conf = os.path.join(tmpdir, "resolv.conf")
    with open(conf, "w") as fh:
        fh.write("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    script = os.path.join(tmpdir, "nxdomain.py")
    with open(script, "w") as fh:
        fh.write(NXDOMAIN_RESOLVER)
    inner = ("ip link set lo up && mount --bind %s /etc/resolv.conf && "
             "(%s %s > %s/resolver.out 2>&1 &) && "
             "for i in $(seq 100); do grep -q ready %s/resolver.out && break; sleep 0.05; done && "
             "exec \"$@\"" % (conf, sys.executable, script, tmpdir, tmpdir))

    def wrap(argv):
        return ["unshare", "-rnm", "--kill-child", "sh", "-c", inner, "sh"] + argv
    t = time.monotonic()
    f = fetch("no-such-host.invalid:7700", "sig", ["--retry-ms", 60000], wrap=wrap)
    f.wait(30)
    took = time.monotonic() - t
    err = f.stderr()
    bt.check(f.rc == 1, "an unresolvable coordinator name fails (exit %s)" % f.rc, err)
    for needle in ("no-such-host.invalid:7700", "does not resolve", "Domain name not found"):
        bt.check(needle in err, "the message names %r" % needle, err)
    bt.check("tries" not in err and took < 5.0, "at once: %.2f s, no retries (--retry-ms 60000)"
             % took, err)
    bt.ok("unresolvable name: exit 1 in %.2f s: %s" % (took, err.strip().splitlines()[-1][:200]))


def plan_epoch(epoch):
    p, _ = e2e.plan(CFG, N, 1, epoch)
    return [(b["step"], b["indices"]) for b in p[0]]


def check_resume(cl, job, cur, last, want, what):
    """A fetch resumed from the cursor file prints exactly the plan after batch `last`."""
    with open(cur) as fh:
        text = fh.read().strip()
    bt.check(text.startswith("bwc1:"), "%s: --cursor-out holds a cursor" % what, text)
    r = fetch(cl.addr, job, ["--resume", text, "--max-steps", 40])
    got, _ = r.ok(60, what + ", resumed")
    step0 = last["step"] + 1 if last else 0
    exp = [x for x in want if x[0] >= step0][:40]
    bt.check([(b["step"], b["indices"]) for b in got] == exp and got[0]["epoch"] == 0,
             "%s: the resumed fetch continues exactly after step %s (steps %d..%d as planned)"
             % (what, last["step"] if last else None, exp[0][0], exp[-1][0]),
             "got %s" % [(b["epoch"], b["step"]) for b in got[:5]])


def live(tmpdir):
    cl = e2e.Cluster(tmpdir, nworkers=1, lease_ms=20000, heartbeat_ms=500)
    e2e.gen(cl, "npy", "npy", ["--num-samples", str(N), "--shape", "4", "--dtype", "float32",
                               "--files", "2"])
    want = plan_epoch(0)

    # mid-epoch, at full speed
    cur = os.path.join(tmpdir, "cursor-live")
    f = fetch(cl.addr, "live", ["--cursor-out", cur])
    bt.poll(lambda: f.batches_seen() >= 30 or None, 30, interval=0.005, what="30 batches")
    took = stop(f, 15, "mid-epoch")
    got, summary = f.result()
    bt.check(0 < len(got) < len(want) and summary and summary["stopped"],
             "stopped mid-epoch after %d of %d batches, the summary says so" %
             (len(got), len(want)), f.stderr())
    bt.check([(b["step"], b["indices"]) for b in got] == want[:len(got)],
             "every batch printed is the plan's")
    check_resume(cl, "live", cur, got[-1], want, "mid-epoch SIGTERM")
    bt.ok("SIGTERM mid-epoch: exit 143 in %.3f s after %d batches; the cursor file is the last "
          "printed batch's (step %d), and the rank was left (resumed at once)" %
          (took, len(got), got[-1]["step"]))

    # waiting for a stopped worker: over its data channel, and over gRPC (a stream in flight)
    for transport, sig in (("auto", 2), ("grpc", 15)):
        stalled(cl, tmpdir, want, transport, sig)

    epochs(cl)
    cl.stop()


def stalled(cl, tmpdir, want, transport, sig):
    job = "stalled-" + transport
    cur = os.path.join(tmpdir, "cursor-" + job)
    f = fetch(cl.addr, job, ["--cursor-out", cur, "--prefetch", 2, "--transport", transport])
    bt.poll(lambda: f.batches_seen() >= 10 or None, 30, interval=0.002, what="10 batches")
    w = cl.workers["w1"]
    w.send(19)  # SIGSTOP
    try:
        seen = [f.batches_seen(), time.monotonic()]

        def quiet():
            n = f.batches_seen()
            if n != seen[0]:
                seen[0], seen[1] = n, time.monotonic()
            return time.monotonic() - seen[1] >= 1.0 or None
        bt.poll(quiet, 20, interval=0.05, what="the fetch to stall on the stopped worker")
        took = stop(f, sig, "waiting for a stopped worker (--transport %s)" % transport)
    finally:
        w.send(18)  # SIGCONT
    got, _ = f.result()
    bt.check(len(got) >= 10 and [(b["step"], b["indices"]) for b in got] == want[:len(got)],
             "the %d batches printed before the stall are the plan's" % len(got))
    check_resume(cl, job, cur, got[-1], want, "signal %d while waiting for a worker" % sig)
    bt.ok("signal %d while waiting for a stopped worker (--transport %s): exit %d in %.3f s; "
          "the cursor is the last printed batch's (step %d); resumed exactly after it" %
          (sig, transport, 128 + sig, took, got[-1]["step"]))


def epochs(cl):
    """--job-epochs without --epochs runs what the job has left; the job ends finished."""
    small = {"mode": "torch", "B": 500, "shuffle": True, "seed": 5}
    args = ["--job-epochs", 3] + e2e.cfg_flags(small)[4:]  # the flags after --mode/--batch-size

    r = bt.cli("fetch", "--coordinator", cl.addr, "--job", "ep", "--dataset", "npy:npy/*.npy",
               "--rank", 0, "--world-size", 1, "--mode", "torch", "--batch-size", 500, *args,
               "--max-steps", 8, "--cursor-out", os.path.join(cl.tmpdir, "cur-ep"), timeout=60)
    bt.check(r.returncode == 0, "fetch --job-epochs 3 --max-steps 8", r.stderr)
    first = [json.loads(x) for x in r.stdout.splitlines() if x.startswith('{"epoch"')]
    bt.check([(b["epoch"], b["step"]) for b in first] == [(e, s) for e in range(2) for s in
                                                           range(6)][:8],
             "8 batches: epoch 0 (6 batches) and two of epoch 1",
             [(b["epoch"], b["step"]) for b in first])
    with open(os.path.join(cl.tmpdir, "cur-ep")) as fh:
        cur = fh.read().strip()
    r = bt.cli("fetch", "--coordinator", cl.addr, "--job", "ep", "--dataset", "npy:npy/*.npy",
               "--rank", 0, "--world-size", 1, "--mode", "torch", "--batch-size", 500, *args,
               "--resume", cur, timeout=60)
    bt.check(r.returncode == 0, "resumed fetch --job-epochs 3", r.stderr)
    rest = [json.loads(x) for x in r.stdout.splitlines() if x.startswith('{"epoch"')]
    bt.check([(b["epoch"], b["step"]) for b in rest] ==
             [(1, s) for s in range(2, 6)] + [(2, s) for s in range(6)],
             "the resumed run delivers the rest of epoch 1 and epoch 2, then stops",
             [(b["epoch"], b["step"]) for b in rest])
    for e in range(3):
        p = plan_epoch_cfg(small, e)
        got = [b["indices"] for b in first + rest if b["epoch"] == e]
        bt.check(got == p[-len(got):] if e == 1 else got == p,
                 "epoch %d's batches are the plan's" % e)
    st = bt.status_json(cl.addr)
    names = [j.get("name") for j in st.get("jobs", [])]
    bt.check("ep" not in names, "the job is finished and removed after its last epoch", names)
    bt.ok("--job-epochs 3 resumed mid-epoch 1 runs the rest of epoch 1 and epoch 2, then the "
          "job is finished")


def plan_epoch_cfg(c, epoch):
    p, _ = e2e.plan(c, N, 1, epoch)
    return [b["indices"] for b in p[0]]


def test(tmpdir):
    unreachable(tmpdir)
    silent_coordinator(tmpdir)
    unresolvable(tmpdir)
    live(tmpdir)
    warn_lines(tmpdir)


if __name__ == "__main__":
    bt.main(test, timeout=240)
