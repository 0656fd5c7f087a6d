"""The Python binding (python/batchwire) against a real cluster: a coordinator and two
workers on loopback, a float32 .npy dataset written by `batchwire gen`.

* two ranks iterated in-process (one thread each), two epochs: indices, padding and real
  counts equal `batchwire plan`; every tensor equals numpy's np.load rows, bit for bit;
* torch mode is PyTorch's own: each batch tensor equals what DataLoader(TensorDataset,
  sampler=DistributedSampler(...)) yields for the same seed and epoch;
* resume: Loader(resume=cursor) after random steps continues identically; bad cursors, a
  cursor of another job and a conflicting configuration raise batchwire.Error subclasses with
  the library's code and sentence; device="cuda:0" fails clearly on a machine without a GPU;
* rank and world size from RANK/WORLD_SIZE; non-.npy batches are lists of bytes.

Sanitizer builds: libbatchwire built with AddressSanitizer cannot be loaded into an
unsanitized Python (the ASan runtime must come first), so the test re-executes itself with
LD_PRELOAD=libasan.so (ASAN_OPTIONS=detect_leaks=0: the interpreter itself "leaks" at exit;
the C tests cover the library's leaks). If that runtime cannot be found it skips (exit 0 with
a SKIP line) and says why.
"""

import json
import os
import random
import re
import sys
import threading

import numpy as np

import bwpy
import bwtest as bt

N = 103        # odd with R = 2: torch's DistributedSampler pads one sample
SHAPE = (3, 5)
B = 8
R = 2
SEED = 7
EPOCHS = 2


def plan(epoch, n=N, world=R, batch=B, seed=SEED):
    """batchwire plan for every rank: {rank: [line, ...]} in step order."""
    r = bt.cli("plan", "--mode", "torch", "--num-samples", n, "--world-size", world,
               "--batch-size", batch, "--shuffle", "--seed", seed, "--epoch", epoch)
    bt.check(r.returncode == 0, "batchwire plan (epoch %d)" % epoch, r.stderr)
    out = {}
    for line in r.stdout.splitlines():
        o = json.loads(line)
        out.setdefault(o["rank"], []).append(o)
    return out


def run_rank(batchwire, coord, job, rank, epochs, resume=None, max_batches=None, **kw):
    """Iterates one rank; returns [(epoch, step, indices, padding, real, bytes, tensor)]."""
    got = []
    args = dict(coordinator=coord, job=job, dataset="npy:ds/part-00000.npy", batch_size=B,
                mode="torch", shuffle=True, seed=SEED, rank=rank, world_size=R,
                resume=resume, prefetch=3)
    args.update(kw)
    with batchwire.Loader(**args) as loader:
        for _epoch in loader.epochs(epochs):
            for b in loader:
                x = b.numpy()
                t = b.torch()
                got.append((b.epoch, b.step, b.indices.tolist(), b.padding.tolist(), b.real,
                            x.tobytes(), t.clone(), x.dtype, x.shape))
                if max_batches is not None and len(got) >= max_batches:
                    return got, loader.cursor()
        return got, loader.cursor()


def expect_error(batchwire, cls, what, pattern, fn):
    try:
        fn()
    except batchwire.Error as e:
        bt.check(isinstance(e, cls) and e.code == cls.code and re.search(pattern, e.message),
                 "%s raises %s (%s) with a clear message: %s" % (what, cls.__name__, e.code,
                                                                 e.message[:160]),
                 "got %s %s: %s" % (type(e).__name__, e.code, e.message))
        return e
    raise bt.TestFailure("%s did not raise" % what)


def test(tmpdir):
    import torch
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    sys.path.insert(0, os.path.join(bt.SOURCE_DIR, "python"))
    os.environ["BATCHWIRE_LIB"] = os.path.join(bt.BUILD_DIR, "lib", "libbatchwire.so")
    import batchwire
    bt.check(batchwire.library_path() == os.environ["BATCHWIRE_LIB"],
             "batchwire loads %s (version %s)" % (batchwire.library_path(), batchwire.version()))

    root = os.path.join(tmpdir, "data")
    os.makedirs(root)
    r = bt.cli("gen", "--format", "npy", "--out", os.path.join(root, "ds"), "--num-samples", N,
               "--shape", ",".join(map(str, SHAPE)), "--dtype", "float32", timeout=60)
    bt.check(r.returncode == 0, "gen a float32 .npy dataset of %d x %r" % (N, SHAPE), r.stderr)
    r = bt.cli("gen", "--format", "jsonl", "--out", os.path.join(root, "lines"), "--num-samples",
               20, "--sample-bytes", 8, "--sample-bytes-max", 40, timeout=60)
    bt.check(r.returncode == 0, "gen a JSON Lines dataset", r.stderr)
    arr = np.load(os.path.join(root, "ds", "part-00000.npy"))

    coord = bt.coordinator(tmpdir)
    workers = [bt.worker(tmpdir, coord.addr, "w%d" % i, data_root=root) for i in range(2)]
    bt.poll(lambda: sum(w["state"] == "alive" for w in bt.status_json(coord.addr)["workers"]) == 2,
            20, what="two live workers")
    ok_workers = [w.running() for w in workers]
    bt.check(all(ok_workers), "coordinator and two workers up")

    # --- two ranks in threads, two epochs
    results, failures = {}, []

    def rank_thread(rank):
        try:
            results[rank] = run_rank(batchwire, coord.addr, "py", rank, EPOCHS)
        except BaseException as e:  # reported by the main thread
            failures.append((rank, e))

    threads = [threading.Thread(target=rank_thread, args=(r_,)) for r_ in range(R)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    bt.check(not failures and len(results) == R, "two ranks iterated in parallel threads",
             failures)
    plans = {e: plan(e) for e in range(EPOCHS)}
    for rank in range(R):
        got = results[rank][0]
        want = [(e, p["step"], p["indices"], [bool(x) for x in p["padding"]], p["real"])
                for e in range(EPOCHS) for p in plans[e][rank]]
        bt.check([g[:5] for g in got] == want,
                 "rank %d: %d batches over %d epochs = batchwire plan (indices, padding, real)"
                 % (rank, len(got), EPOCHS),
                 "got %r\nwant %r" % ([g[:5] for g in got][:4], want[:4]))
        bad = [g[1] for g in got if g[5] != arr[g[2]].tobytes()
               or g[7] != arr.dtype or g[8] != (len(g[2]),) + SHAPE]
        bt.check(not bad, "rank %d: every batch.numpy() is np.load's rows (dtype %s, shape "
                 "[B, 3, 5]), bit for bit" % (rank, arr.dtype), bad)
    pads = sum(sum(g[3]) for rk in results.values() for g in rk[0])
    bt.check(pads == EPOCHS, "DistributedSampler's padding sample is flagged once per epoch")

    # --- the same tensors as PyTorch's own DataLoader + DistributedSampler
    ds = TensorDataset(torch.from_numpy(arr))
    for rank in range(R):
        sampler = DistributedSampler(ds, num_replicas=R, rank=rank, shuffle=True, seed=SEED)
        dl = DataLoader(ds, batch_size=B, sampler=sampler, num_workers=0)
        ref = []
        for e in range(EPOCHS):
            sampler.set_epoch(e)
            ref += [x for (x,) in dl]
        got = [g[6] for g in results[rank][0]]
        same = len(ref) == len(got) and all(
            a.dtype == b.dtype and a.shape == b.shape and
            a.numpy().tobytes() == b.numpy().tobytes() for a, b in zip(ref, got))
        bt.check(same, "rank %d: batch.torch() equals DataLoader(TensorDataset, "
                 "sampler=DistributedSampler(seed=%d)) tensor for tensor, bit for bit, over "
                 "%d epochs (%d batches)" % (rank, SEED, EPOCHS, len(ref)))

    # --- resume via cursor: identical continuation
    rng = random.Random(1)
    full = results[0][0]
    per_epoch = len(full) // EPOCHS
    for i, stop in enumerate(sorted(rng.sample(range(1, len(full) - 1), 4)) + [per_epoch]):
        head, cur = run_rank(batchwire, coord.addr, "py", 0, EPOCHS, max_batches=stop)
        bt.check(cur.startswith("bwc1:"), "cursor after %d batches is text: %s" % (stop, cur))
        e_stop = head[-1][0]
        tail, _ = run_rank(batchwire, coord.addr, "py", 0, EPOCHS - e_stop, resume=cur)
        cont = [g[:6] for g in head + tail]
        bt.check(cont == [g[:6] for g in full],
                 "stopped after batch %d (epoch %d step %d), Loader(resume=cursor) continues "
                 "with identical batches" % (stop, e_stop, head[-1][1]))
        if i == 0:
            bcur = None
            with batchwire.Loader(coordinator=coord.addr, job="py",
                                  dataset="npy:ds/part-00000.npy", batch_size=B, shuffle=True,
                                  seed=SEED, rank=0, world_size=R, resume=cur) as lo:
                bt.check(lo.position() == (head[-1][0], head[-1][1] + 1),
                         "position() of a resumed loader is the batch after the cursor's")
                bcur = lo.cursor_bytes()
            tail2, _ = run_rank(batchwire, coord.addr, "py", 0, 1, resume=bcur, max_batches=2)
            bt.check([g[:6] for g in tail2] == [g[:6] for g in tail[:2]],
                     "the binary cursor (cursor_bytes) resumes like the text one")

    # --- errors carry the library's code and sentence
    opts = dict(coordinator=coord.addr, job="py", dataset="npy:ds/part-00000.npy",
                batch_size=B, shuffle=True, seed=SEED, rank=0, world_size=R)
    expect_error(batchwire, batchwire.CorruptError, "a garbled cursor", r"cursor",
                 lambda: batchwire.Loader(resume="bwc1:AAAAnotacursor", **opts))
    expect_error(batchwire, batchwire.CorruptError, "a cursor that is not a cursor", r"cursor",
                 lambda: batchwire.Loader(resume="hello", **opts))
    _, other_cur = run_rank(batchwire, coord.addr, "py-other", 0, 1, max_batches=1)
    expect_error(batchwire, batchwire.MismatchError, "another job's cursor",
                 r"belongs to job 'py-other'",
                 lambda: batchwire.Loader(resume=other_cur, **opts))
    e = expect_error(batchwire, batchwire.MismatchError, "joining the job with another "
                     "batch size", r"batch_size",
                     lambda: batchwire.Loader(**dict(opts, batch_size=B + 1)))
    bt.check(e.rc == -20 and str(e).startswith("BW_MISMATCH: "),
             "the exception's rc and str carry the code")
    # A second process on a held rank (the holder is host:pid, so it must be another process).
    probe = ("import sys, batchwire\n"
             "try:\n"
             "    batchwire.Loader(coordinator=%r, job='py', dataset='npy:ds/part-00000.npy',"
             " batch_size=%d, shuffle=True, seed=%d, rank=0, world_size=%d)\n"
             "except batchwire.AlreadyExistsError as e:\n"
             "    print(e.code, e.message); sys.exit(0)\n"
             "sys.exit(1)\n" % (coord.addr, B, SEED, R))
    with batchwire.Loader(**opts):
        p = bt.run([sys.executable, "-c", probe],
                   env=bt.child_env({"PYTHONPATH": os.path.join(bt.SOURCE_DIR, "python"),
                                     "BATCHWIRE_LIB": bwpy.lib_path()}), timeout=60)
    bt.check(p.returncode == 0 and p.stdout.startswith("BW_ALREADY_EXISTS"),
             "another process's Loader on a held rank raises AlreadyExistsError: %s"
             % p.stdout.strip()[:160], p.stdout + p.stderr)
    expect_error(batchwire, batchwire.InvalidArgumentError, "an unknown dataset format",
                 r"unknown format", lambda: batchwire.Loader(**dict(opts, dataset="csv:x")))
    expect_error(batchwire, batchwire.InvalidArgumentError, "device='gpu'", r"device",
                 lambda: batchwire.Loader(**dict(opts, device="gpu")))
    # Numbers of the wrong kind are refused, naming the option, not truncated (2.5 -> 2),
    # parsed ("10") or passed on to a bare int() error.
    for name, bad in (("batch_size", 2.5), ("batch_size", "10"), ("batch_size", None),
                      ("rank", 1.0), ("start", (0, 1.5)), ("share", 3), ("timeout", "5")):
        expect_error(batchwire, batchwire.InvalidArgumentError, "%s=%r" % (name, bad),
                     r"^%s: " % name, lambda: batchwire.Loader(**dict(opts, **{name: bad})))
    has_gpu = os.path.exists("/dev/nvidia0")
    if not has_gpu:
        expect_error(batchwire, batchwire.NoDeviceError, "device='cuda:0' without a GPU",
                     r"cuda:0", lambda: batchwire.Loader(**dict(opts, device="cuda:0")))
        with batchwire.Loader(**opts) as lo:
            b = lo.next_batch()
            bt.check(b is not None and b.numpy().shape == (B,) + SHAPE,
                     "the host path works after the refused device")
    else:
        bt.log("a GPU is present (/dev/nvidia0): device='cuda:0' not checked for refusal")

    # --- every batch keeps its bytes (it holds them from the moment it is handed out): one
    # viewed before the next one, and one never viewed before the loader moved on, also after
    # close; closing is idempotent
    lo = batchwire.Loader(**opts)
    b1 = lo.next_batch()
    x1 = b1.numpy().copy()
    b2 = lo.next_batch()
    lo.next_batch()
    bt.check(b1.numpy().tobytes() == x1.tobytes(), "a batch viewed before the loader moved on "
             "still gives its own bytes two batches later")
    bt.check(b2.numpy().tobytes() == arr[b2.indices].tobytes() and
             b"".join(b2.samples()) == arr[b2.indices].tobytes(),
             "a batch never viewed before the loader moved on gives its own bytes (numpy(), "
             "samples())")
    lo.close()
    lo.close()
    bt.check(b2.numpy().tobytes() == arr[b2.indices].tobytes(), "and after close")
    expect_error(batchwire, batchwire.FailedPreconditionError, "next_batch() after close",
                 r"closed", lo.next_batch)

    # --- rank and world size from the environment (torchrun's RANK / WORLD_SIZE)
    os.environ["RANK"], os.environ["WORLD_SIZE"] = "1", "2"
    try:
        with batchwire.Loader(**dict(opts, rank=None, world_size=None)) as lo:
            b = lo.next_batch()
            bt.check(lo.rank == 1 and lo.world_size == 2 and
                     b.indices.tolist() == plans[0][1][0]["indices"],
                     "rank=None, world_size=None take RANK=1 WORLD_SIZE=2")
    finally:
        del os.environ["RANK"], os.environ["WORLD_SIZE"]

    # --- other formats: a list of bytes per batch
    import bwdata
    with batchwire.Loader(coordinator=coord.addr, job="py-lines", dataset="jsonl:lines/*",
                          batch_size=6, rank=0, world_size=1) as lo:
        got = [(b.indices.tolist(), b.numpy(), b.dtype) for b in lo]
    want_ok = all(dt is None and isinstance(s, list) and
                  s == [bwdata.expected_sample("jsonl", i, 8, 40)[0] for i in idx]
                  for idx, s, dt in got)
    bt.check(len(got) == 4 and want_ok, "a JSON Lines batch's numpy() is its samples' bytes, "
             "as the generator wrote them")

    for w in workers:
        bt.check(w.running(), "worker %s still running" % w.name)


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=240)
