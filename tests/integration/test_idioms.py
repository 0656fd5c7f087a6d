"""The PyTorch loop idioms (issue 22, item 7): each common loop shape over batchwire, checked
against batches this test computes itself with torch's DistributedSampler (set_epoch(e)) and
BatchSampler over the same data -- every batch's indices, padding and bytes, epoch by epoch.

A coordinator and two workers on loopback serve a float32 .npy dataset of 91 samples; jobs of
two ranks, batch size 4, shuffled (torch mode, seed 11).

* torch's DataLoader over batchwire.torch.BatchDataset, three epochs, in each worker mode:
  the fork, spawn and forkserver contexts, persistent_workers on and off, 0, 2 and 3 workers,
  prefetch_factor, pin_memory, worker_init_fn; epochs by set_epoch(e) each time and by a plain
  ``for epoch in range(3)`` loop (the dataset moves on by itself), set_epoch going back, and
  with persistent workers enumerate + break (the next iteration runs the next epoch).
  len(DataLoader) before the first iteration (asked from a subprocess: the fork context then
  still forks cleanly). batchwire.torch.DataLoader: enumerate, break, state_dict(), a new
  DataLoader resumed with load_state_dict and ``for e in range(sd["epoch"], 3):
  ds.set_epoch(e)``.
* batchwire.Loader: the plain epoch loop, set_epoch (also back to an earlier epoch) and
  loader.epoch, len(loader) (= len of torch's DataLoader over a DistributedSampler), list(loader)
  (every batch still readable afterwards), enumerate + break + resume (state_dict, in the same
  loader and in new ones, with and without set_epoch), zip of the two ranks' loaders.
* Signals, in child processes: Ctrl-C (SIGINT) raises KeyboardInterrupt within 1 s while
  joining an unreachable coordinator (nothing listening, and a listener that never answers),
  mid-loop, while waiting for stopped storage workers, and in a DataLoader loop with workers;
  SIGTERM during a join to an unreachable coordinator runs the program's handler within 1 s
  (after the retry was reported through logging, naming the address), and without a handler
  ends the process within 1 s; SIGTERM while waiting for stopped storage workers runs a
  handler the program installed after the Loader was opened within 1 s.
* Restart: a trainer with DataLoader workers (fork and forkserver in the plain build,
  forkserver and spawn in the sanitizer build) is SIGKILLed mid-epoch; its workers die with
  it, and a trainer started at once gets its rank back within 3 s (from its DataLoader worker
  0's start to its first batch); a second live trainer on the rank is refused with the
  LOCAL_RANK hint, which the restarted one never saw.

BW_IDIOMS_ONLY=dataloader,loader,signals,restart runs only those parts (for debugging).
"""

import os
import signal
import socket
import time

import bwpy
import bwtest as bt

N = 91
B = 4
R = 2
SHAPE = (2, 3)
SEED = 11
EPOCHS = 3


def init_worker(worker_id):
    """A worker_init_fn (module level, so that spawn and forkserver workers unpickle it)."""
    import torch
    torch.set_num_threads(1)
    os.environ["BW_IDIOMS_WORKER"] = str(worker_id)


def reference(epoch, rank):
    """This rank's batches of `epoch` as torch computes them: [(indices, padding)], padding
    being the DistributedSampler's wrap-around (positions past the dataset's end)."""
    from torch.utils.data import BatchSampler, DistributedSampler
    s = DistributedSampler(range(N), num_replicas=R, rank=rank, shuffle=True, seed=SEED)
    s.set_epoch(epoch)
    idx = list(s)
    pad = [rank + k * R >= N for k in range(len(idx))]
    return [([idx[i] for i in b], [pad[i] for i in b])
            for b in BatchSampler(range(len(idx)), B, drop_last=False)]


def want(epoch, rank, from_step=0):
    return [(epoch, s, idx, pad, True) for s, (idx, pad) in enumerate(reference(epoch, rank))
            ][from_step:]


# ---- child programs (signals, restarts)

SIGNAL_CHILD = r'''
import signal, sys, time
import batchwire


def main():
    phase, addr, job = sys.argv[1], sys.argv[2], sys.argv[3]
    opts = dict(coordinator=addr, job=job, dataset="npy:ds/part-00000.npy", batch_size=4,
                rank=0, world_size=1, timeout=2.0, retry=60.0, prefetch=2)

    def on_term(signum, frame):
        print("handled %.6f" % time.time(), flush=True)
        sys.exit(0)
    if phase == "term-handler":
        signal.signal(signal.SIGTERM, on_term)
    try:
        if phase == "dataloader":
            import torch.utils.data
            from batchwire.torch import BatchDataset
            # Persistent workers, and "ready" once they run: a SIGINT that lands while Python
            # forks is lost in its at-fork hooks (an exception there is only printed).
            dl = torch.utils.data.DataLoader(BatchDataset(**opts), batch_size=None, num_workers=2,
                                             multiprocessing_context=sys.argv[4],
                                             persistent_workers=True)
            while True:
                for item in dl:
                    if item["step"] == 0 and item["epoch"] == 0:
                        print("ready %.6f" % time.time(), flush=True)
                    time.sleep(0.001)
        if phase in ("join", "term-handler", "term-default"):
            print("ready %.6f" % time.time(), flush=True)
        lo = batchwire.Loader(**opts)
        print("opened", flush=True)
        if phase == "mid-loop":
            print("ready %.6f" % time.time(), flush=True)
        n = 0
        while True:
            for b in lo:
                n += 1
                if phase.startswith("stalled") and n == 1:
                    if phase == "stalled-term":  # installed after the Loader was opened
                        signal.signal(signal.SIGTERM, on_term)
                    print("ready %.6f" % time.time(), flush=True)
    except KeyboardInterrupt:
        print("KeyboardInterrupt %.6f" % time.time(), flush=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
'''

RESTART_CHILD = r'''
import os, sys, time
import torch.utils.data
from batchwire.torch import BatchDataset


def say(line):
    """One write per line: the DataLoader's workers print to the same pipe."""
    os.write(1, (line + "\n").encode())


def announce(worker_id):
    say("worker %d %.6f" % (worker_id, time.time()))


def main():
    addr, job, ctx = sys.argv[1], sys.argv[2], sys.argv[3]
    ds = BatchDataset(coordinator=addr, job=job, dataset="npy:ds/part-00000.npy", batch_size=1,
                      rank=0, world_size=1, prefetch=2)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                     multiprocessing_context=ctx, worker_init_fn=announce)
    say("iterating %.6f" % time.time())
    try:
        while True:
            for item in dl:
                say("batch %d %.6f" % (item["step"], time.time()))
                time.sleep(0.5)  # an epoch lasts 45 s: the later trainers come within it
    except Exception as e:
        say("error %s" % " | ".join(str(e).splitlines()))
        sys.exit(3)


if __name__ == "__main__":
    main()
'''


def test(tmpdir):
    import torch
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    batchwire = bwpy.import_batchwire()
    root = os.path.join(tmpdir, "data")
    os.makedirs(root)
    arr = bwpy.gen_npy(root, "ds", N, SHAPE)
    coord, storage = bwpy.cluster(tmpdir, root, 2)
    import batchwire.torch as bwt
    asan = "address" in bwpy.sanitize_flags()
    contexts = ("forkserver", "spawn") if asan else ("fork", "forkserver", "spawn")
    if asan:
        # A plain fork of this multi-threaded process under AddressSanitizer can deadlock the
        # child in the ASan runtime (test_torch_dataloader.py): fork runs in the plain build.
        bt.log("sanitizer build: the fork context is checked in the plain build only")
    opts = dict(coordinator=coord.addr, dataset=bwpy.NPY, batch_size=B, shuffle=True,
                seed=SEED, world_size=R, prefetch=2)

    def item_row(it):
        idx = it["indices"].tolist()
        return (it["epoch"], it["step"], idx, it["padding"].tolist(),
                it["data"].numpy().tobytes() == arr[idx].tobytes())

    def batch_row(b):
        idx = b.indices.tolist()
        return (b.epoch, b.step, idx, b.padding.tolist(),
                b.numpy().tobytes() == arr[idx].tobytes())

    only = os.environ.get("BW_IDIOMS_ONLY", "dataloader,loader,signals,restart").split(",")
    ref_len = len(reference(0, 0))
    torch_len = len(DataLoader(TensorDataset(torch.from_numpy(arr)), batch_size=B,
                               sampler=DistributedSampler(range(N), num_replicas=R, rank=0)))
    bt.check(ref_len == torch_len == 12, "the reference: %d batches per rank and epoch, as "
             "len(DataLoader(..., sampler=DistributedSampler))" % ref_len)

    # ---- DataLoader over BatchDataset, every worker mode (before this process opens any
    # Loader, so that the fork context forks a process that never ran the network runtime).
    combos = [  # (context, persistent_workers, num_workers, extra DataLoader arguments, epochs)
        ("fork", True, 2, dict(prefetch_factor=4, pin_memory=True), "set_epoch"),
        ("fork", False, 3, dict(worker_init_fn=init_worker), "plain"),
        ("spawn", True, 2, dict(worker_init_fn=init_worker, pin_memory=True), "plain"),
        ("spawn", False, 2, dict(prefetch_factor=1), "set_epoch"),
        ("forkserver", True, 3, dict(prefetch_factor=3, worker_init_fn=init_worker),
         "set_epoch"),
        ("forkserver", False, 2, dict(pin_memory=True), "plain"),
        (None, False, 0, {}, "plain"),
    ]
    for n, (ctx, persistent, workers, extra, style) in enumerate(combos):
        if "dataloader" not in only or ctx is not None and ctx not in contexts:
            continue
        rank = n % R
        ds = bwt.BatchDataset(job="dl-%d" % n, rank=rank, **opts)
        kw = dict(extra, batch_size=None, num_workers=workers, timeout=120 if workers else 0)
        if workers:
            kw.update(persistent_workers=persistent, multiprocessing_context=ctx)
        dl = DataLoader(ds, **kw)
        what = "DataLoader(%s)" % ", ".join(
            ["num_workers=%d" % workers] + (["multiprocessing_context=%r" % ctx,
                                             "persistent_workers=%s" % persistent]
                                            if workers else []) +
            ["%s=%s" % (k, getattr(v, "__name__", v)) for k, v in sorted(extra.items())])
        bt.check(len(dl) == len(ds) == ref_len, "%s: len() = %d before the first iteration "
                 "(asked from a subprocess)" % (what, len(dl)))
        for epoch in range(EPOCHS):
            if style == "set_epoch":
                ds.set_epoch(epoch)
            got = [item_row(it) for it in dl]
            bt.check(got == want(epoch, rank), "%s, rank %d, epoch %d (%s): the %d batches of "
                     "DistributedSampler.set_epoch(%d), indices, padding and bytes"
                     % (what, rank, epoch, "set_epoch(%d)" % epoch if style == "set_epoch" else
                        "plain loop", len(got), epoch), (got[:2], want(epoch, rank)[:2]))
        if persistent:
            ds.set_epoch(1)
            got = [item_row(it) for it in dl]
            bt.check(got == want(1, rank) and ds.epoch == 1, "%s: set_epoch(1) after epoch 2 "
                     "runs epoch 1 again (set_epoch wins)" % what)
            first, _ = enumerate_break(dl, item_row, 2, lambda: None)
            got = [item_row(it) for it in dl]
            bt.check(first == want(2, rank)[:3] and got == want(3, rank), "%s: enumerate + "
                     "break after 3 batches of epoch 2; the next iteration runs epoch 3" % what)
        del dl

    # batchwire.torch.DataLoader: enumerate + break + state_dict, resumed in a new one.
    if "dataloader" in only:
        dataloader_state(bwt, opts, item_row, contexts[0])
    if "loader" in only:
        loader_idioms(batchwire, opts, arr, ref_len)
    if "signals" in only:
        signals(tmpdir, coord, storage, contexts)
    if "restart" in only:
        restart(tmpdir, coord, contexts)


def enumerate_break(loader, row, k, state):
    """`for i, x in enumerate(loader): ... if i == k: sd = state(); break`: the rows of the
    k + 1 items taken, and the state taken before the break."""
    first = []
    for i, x in enumerate(loader):
        first.append(row(x))
        if i == k:
            return first, state()
    raise bt.TestFailure("the loader ended after %d items" % len(first))


def dataloader_state(bwt, opts, item_row, ctx):
    """batchwire.torch.DataLoader: enumerate + break + state_dict, resumed in a new one."""
    ds = bwt.BatchDataset(job="dl-state", rank=1, **opts)
    dl = bwt.DataLoader(ds, num_workers=2, persistent_workers=True, multiprocessing_context=ctx,
                        timeout=120)
    first, sd = enumerate_break(dl, item_row, 4, dl.state_dict)
    del dl
    ds2 = bwt.BatchDataset(job="dl-state", rank=1, **opts)
    dl2 = bwt.DataLoader(ds2, num_workers=2, persistent_workers=True,
                         multiprocessing_context=ctx, timeout=120)
    dl2.load_state_dict(sd)
    rest = []
    for epoch in range(sd["epoch"], EPOCHS):
        ds2.set_epoch(epoch)
        rest.append([item_row(it) for it in dl2])
    bt.check(first == want(0, 1)[:5] and (sd["epoch"], sd["step"]) == (0, 5) and
             rest == [want(0, 1, 5), want(1, 1), want(2, 1)],
             "batchwire.torch.DataLoader (%s, persistent): enumerate, break after 5 batches, "
             "state_dict(); a new one resumed with load_state_dict and `for e in "
             "range(sd['epoch'], 3): ds.set_epoch(e)` runs the rest of epoch 0, then 1 and 2"
             % ctx, (sd, [len(r) for r in rest]))
    del dl2


def loader_idioms(batchwire, opts, arr, ref_len):
    """batchwire.Loader in this process."""
    def batch_row(b):
        idx = b.indices.tolist()
        return (b.epoch, b.step, idx, b.padding.tolist(),
                b.numpy().tobytes() == arr[idx].tobytes())

    def loader(job, rank=0, **kw):
        return batchwire.Loader(**dict(opts, job=job, rank=rank, **kw))

    with loader("plain") as lo:
        got = [[batch_row(b) for b in lo] for _ in range(EPOCHS)]
        bt.check(got == [want(e, 0) for e in range(EPOCHS)], "Loader: `for epoch in range(3): "
                 "for batch in loader` runs epochs 0, 1, 2 (%s batches)" % [len(g) for g in got])

    with loader("set-epoch", rank=1) as lo:
        ok = True
        for e in range(EPOCHS):
            lo.set_epoch(e)
            ok = ok and lo.epoch == e and [batch_row(b) for b in lo] == want(e, 1)
        lo.set_epoch(1)
        again = [batch_row(b) for b in lo]
        bt.check(ok and again == want(1, 1) and lo.epoch == 1,
                 "Loader: set_epoch(e) before each epoch (loader.epoch follows), and "
                 "set_epoch(1) after epoch 2 runs epoch 1 again")
        bt.check(len(lo) == ref_len, "len(loader) = %d, len() of torch's DataLoader over a "
                 "DistributedSampler" % len(lo))

    with loader("list") as lo:
        kept = list(lo)
        kept2 = list(lo)
        bt.check([batch_row(b) for b in kept] == want(0, 0) and
                 [batch_row(b) for b in kept2] == want(1, 0) and
                 all(b"".join(b.samples()) == arr[b.indices].tobytes() for b in kept),
                 "list(loader) twice: epochs 0 and 1, every kept batch readable afterwards "
                 "(numpy(), samples())")

    with loader("resume") as lo:
        first, sd = enumerate_break(lo, batch_row, 6, lo.state_dict)
        after_break = [batch_row(b) for b in lo]
    bt.check(first == want(0, 0)[:7] and (sd["epoch"], sd["step"]) == (0, 7) and
             after_break == want(1, 0), "Loader: enumerate + break after 7 batches, "
             "state_dict() at (0, 7); iterating the same loader again starts epoch 1 (as a "
             "DataLoader does)")
    with loader("resume", resume=sd) as lo:
        rest = []
        for e in range(sd["epoch"], EPOCHS):
            lo.set_epoch(e)
            rest.append([batch_row(b) for b in lo])
        bt.check(rest == [want(0, 0, 7), want(1, 0), want(2, 0)], "Loader(resume=state): `for "
                 "e in range(sd['epoch'], 3): loader.set_epoch(e)` continues epoch 0 at step 7 "
                 "(set_epoch of the resumed epoch keeps the position), then epochs 1 and 2")
    with loader("resume", resume=sd) as lo:
        rest = [[batch_row(b) for b in lo] for _ in range(2)]
        bt.check(rest == [want(0, 0, 7), want(1, 0)], "Loader(resume=state), plain loop: the "
                 "rest of epoch 0, then epoch 1")
    with loader("resume") as lo:
        lo.load_state_dict(sd)
        bt.check([batch_row(b) for b in lo] == want(0, 0, 7), "load_state_dict(state) on an "
                 "open loader: the next iteration runs the rest of epoch 0")

    with loader("zip", rank=0) as lo0, loader("zip", rank=1) as lo1:
        ok = True
        for e in range(2):
            pairs = [(batch_row(a), batch_row(b)) for a, b in zip(lo0, lo1)]
            ok = ok and pairs == list(zip(want(e, 0), want(e, 1)))
        bt.check(ok, "zip(rank 0's loader, rank 1's loader) for two epochs: each rank's batches")


def signals(tmpdir, coord, storage, contexts):
    """Ctrl-C and SIGTERM in child processes, in each phase."""
    code = os.path.join(tmpdir, "signal_child.py")
    with open(code, "w") as f:
        f.write(SIGNAL_CHILD)

    runs = []

    def signalled(phase, addr, sig, after, expect, extra=()):
        """Starts a child in `phase`, sends `sig` `after` s after it is there, returns
        (seconds from the signal to `expect`'s line -- or to the exit for None --, the
        child's exit status, its stderr)."""
        runs.append(phase)
        name = "sig-%s-%d" % (phase, len(runs))
        p = bwpy.python_child(tmpdir, name, [code, phase, addr, "sig-" + phase] + list(extra))
        p.out.next("ready")
        time.sleep(after)
        t0 = time.time()
        p.send_signal(sig)
        if expect is None:
            p.wait(30)
            took = time.time() - t0
        else:
            took = float(p.out.next(expect, 30)[1]) - t0
        p.wait(30)
        with open(os.path.join(tmpdir, name + ".log"), errors="replace") as f:
            return took, p.returncode, f.read()

    dead_port = socket.socket()
    dead_port.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts nothing: connections hang in the handshake
    dead = "127.0.0.1:%d" % dead_port.getsockname()[1]
    mute = "127.0.0.1:%d" % silent.getsockname()[1]
    for addr, what in ((dead, "nothing listening"), (mute, "a listener that never answers")):
        took, rc, _ = signalled("join", addr, signal.SIGINT, 0.7, "KeyboardInterrupt")
        bt.check(took <= 1.0 and rc == 130, "Ctrl-C while joining a coordinator with %s: "
                 "KeyboardInterrupt after %.2f s" % (what, took))
    took, rc, err = signalled("term-handler", dead, signal.SIGTERM, 2.5, "handled")
    bt.check(took <= 1.0 and rc == 0, "SIGTERM with a Python handler while retrying the join: "
             "the handler ran after %.2f s" % took)
    bt.check("does not answer; retrying" in err and dead in err, "while retrying, the library said so through "
             "logging (the 'batchwire' logger), naming the address: %s" %
             ([ln for ln in err.splitlines() if dead in ln] or [""])[0][:160], err[-2000:])
    took, rc, _ = signalled("term-default", mute, signal.SIGTERM, 0.7, None)
    bt.check(took <= 1.0 and rc == -signal.SIGTERM, "SIGTERM without a handler while joining: "
             "the process ended after %.2f s (status %s)" % (took, rc))
    took, rc, _ = signalled("mid-loop", coord.addr, signal.SIGINT, 0.5, "KeyboardInterrupt")
    bt.check(took <= 1.0 and rc == 130, "Ctrl-C in the middle of an epoch loop: "
             "KeyboardInterrupt after %.2f s" % took)
    took, rc, _ = signalled("dataloader", coord.addr, signal.SIGINT, 0.5, "KeyboardInterrupt",
                            [contexts[0]])
    bt.check(took <= 1.0 and rc == 130, "Ctrl-C in a DataLoader(num_workers=2, %s, "
             "persistent) loop: KeyboardInterrupt after %.2f s" % (contexts[0], took))

    # Waiting for storage workers that are stopped: Ctrl-C, and SIGTERM with a handler the
    # program installed after the Loader was opened (the library's is put back in front).
    stopped = [w.pid for w in storage]
    for phase, sig, expect, status, what in (
            ("stalled", signal.SIGINT, "KeyboardInterrupt", 130, "Ctrl-C: KeyboardInterrupt"),
            ("stalled-term", signal.SIGTERM, "handled", 0,
             "SIGTERM: the handler installed after the Loader opened ran")):
        p = bwpy.python_child(tmpdir, "sig-" + phase, [code, phase, coord.addr, "sig-" + phase])
        p.out.next("ready")
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(1.5)  # the prefetched batches are gone; the loader waits for a worker
            t0 = time.time()
            p.send_signal(sig)
            took = float(p.out.next(expect, 30)[1]) - t0
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        p.wait(30)
        bt.check(took <= 1.0 and p.returncode == status, "while waiting for stopped storage "
                 "workers, %s after %.2f s" % (what, took))
    bt.poll(lambda: sum(w["state"] == "alive"
                        for w in bt.status_json(coord.addr)["workers"]) == len(storage),
            30, what="the storage workers alive again")


def restart(tmpdir, coord, contexts):
    """A trainer with DataLoader workers SIGKILLed and restarted at once."""
    rcode = os.path.join(tmpdir, "restart_child.py")
    with open(rcode, "w") as f:
        f.write(RESTART_CHILD)
    for ctx in contexts[:2]:
        job = "restart-" + ctx
        t1 = bwpy.python_child(tmpdir, job + "-1", [rcode, coord.addr, job, ctx])
        t1.out.next("batch")
        t1.out.next("batch")
        workers = bt.poll(lambda: descendants(t1.pid), 30, what="the DataLoader's workers")
        os.kill(t1.pid, signal.SIGKILL)
        t2 = bwpy.python_child(tmpdir, job + "-2", [rcode, coord.addr, job, ctx])
        t_iter = float(t2.out.next("worker 0")[2])  # worker 0 is about to claim the rank
        first = t2.out.next("batch")
        took = float(first[2]) - t_iter
        try:
            bt.poll(lambda: not any(alive(w) for w in workers), 10,
                    what="the killed trainer's DataLoader workers to exit")
        except bt.TestFailure:
            raise bt.TestFailure("still there after 10 s: %s" % [
                (w, cmdline(w)) for w in workers if alive(w)])
        bt.check(took <= 3.0, "trainer with DataLoader workers (%s) SIGKILLed mid-epoch: its "
                 "%d processes (workers, any fork server) died with it, and a trainer started "
                 "at once has its rank back %.2f s after its DataLoader worker 0 started"
                 % (ctx, len(workers), took))
        t3 = bwpy.python_child(tmpdir, job + "-3", [rcode, coord.addr, job, ctx])
        line = " ".join(t3.out.next("error", 120))
        line = line[line.rfind("BW_ALREADY_EXISTS"):]
        bt.check("ALREADY_EXISTS" in line and "LOCAL_RANK" in line,
                 "a second live trainer on the rank is refused with the LOCAL_RANK hint: %s"
                 % line[:240], line)
        t2.kill()
        t2.wait(30)
        t1.wait(30)
        with open(os.path.join(tmpdir, job + "-2.log"), errors="replace") as f:
            err2 = f.read()
        out2 = "\n".join(x for x in t2.out.lines if x is not None)
        bt.check("LOCAL_RANK" not in err2 + out2,
                 "the restarted trainer never saw the LOCAL_RANK hint")


def descendants(pid):
    """The live processes below `pid` (from /proc): a DataLoader's workers, and under
    forkserver the fork server and multiprocessing's resource tracker."""
    parent = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d, "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if fields[0] not in (b"Z", b"X"):
            parent[int(d)] = int(fields[1])
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")[:200]
    except OSError:
        return "?"


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] not in (b"Z", b"X")


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=400)
