#!/usr/bin/python3
"""Epochs and interrupts through the C API (ctypes; include/batchwire/loader.h and
batchwire.h; docs/client.md, "Epochs" and "Signals"), against `batchwire plan`.

* bw_loader_rank_steps: a job that does not exist is created as bw_loader_open would create
  it, and every rank's count for epochs 0 and 1 is the plan's (one past the last step), with
  nothing claimed (a loader then opens rank 0 at once); another configuration of the same job
  is refused with BW_MISMATCH naming the field, another world size too.
  After an elastic resize (2 ranks -> 1 after 3 steps), the resized epoch's count is one
  past the last step the resumed rank delivers, the next epoch's the plan's at world size 1,
  and world size 2 is refused.
* bw_loader_set_epoch / bw_loader_epoch / bw_loader_next_epoch: after 3 batches of epoch 0,
  set_epoch(0) starts epoch 0 over; set_epoch(2) jumps to epoch 2; next_epoch after its end
  gives epoch 3 -- every batch the plan's. A loader opened at a cursor in the middle of epoch 1
  continues there after set_epoch(1) (a no-op), and the same call after a batch starts epoch 1
  over.
* bw_interrupt from another thread while bw_loader_next waits for a worker that was stopped
  (SIGSTOP): it returns BW_INTERRUPTED within a second, having handed out nothing; a call
  made while the flag is raised returns it at once; after bw_interrupt_clear (and SIGCONT)
  the repeated calls deliver exactly the plan's next batches, none lost or repeated.
  bw_loader_close while interrupted, with the worker stopped again, returns within a second.
"""

import ctypes
import os
import threading
import time

import bwpy
import bwtest as bt

bwpy.maybe_reexec_under_asan()

N, B = 1000, 8
INTERRUPTED, MISMATCH, END = -26, -20, -22


def test(tmpdir):
    bwpy.import_batchwire()
    from batchwire import _lib
    L = ctypes.CDLL(_lib.path())  # the C API, declared here as loader.h has it
    P, U64 = ctypes.c_void_p, ctypes.c_uint64
    for fn, res, args in (
            ("bw_loader_open", ctypes.c_int, [P, ctypes.POINTER(P), ctypes.c_char_p,
                                              ctypes.c_size_t]),
            ("bw_loader_next", ctypes.c_int, [P, ctypes.POINTER(P)]),
            ("bw_loader_close", None, [P]),
            ("bw_loader_rank_steps", ctypes.c_int, [P, U64, ctypes.POINTER(U64), ctypes.c_char_p,
                                                    ctypes.c_size_t]),
            ("bw_loader_set_epoch", ctypes.c_int, [P, U64]),
            ("bw_loader_epoch", U64, [P]),
            ("bw_loader_next_epoch", ctypes.c_int, [P]),
            ("bw_loader_unnext", ctypes.c_int, [P]),
            ("bw_loader_cursor_text", ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_size_t]),
            ("bw_loader_open_at", ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_size_t,
                                                 ctypes.POINTER(P), ctypes.c_char_p,
                                                 ctypes.c_size_t]),
            ("bw_interrupt", None, []), ("bw_interrupt_clear", None, []),
            ("bw_interrupted", ctypes.c_int, [])):
        getattr(L, fn).restype = res
        getattr(L, fn).argtypes = args

    root = os.path.join(tmpdir, "data")
    os.makedirs(root)
    bwpy.gen_npy(root, "ds", N)
    coord, workers = bwpy.cluster(tmpdir, root, 1)
    keep = []

    def options(job, world=1, rank=0, batch=B):
        # bw_loader_options with the library's defaults, its layout from the headers (cffi).
        o = _lib.new_options()
        strs = [_lib.ffi.new("char[]", x) for x in (coord.addr.encode(), job.encode(),
                                                       bwpy.NPY.encode())]
        buf = P(int(_lib.ffi.cast("uintptr_t", o)))
        keep.append((o, strs))
        o.coordinator, o.job, o.dataset = strs
        o.rank, o.world_size, o.batch_size = rank, world, batch
        o.shuffle, o.seed = 1, 3
        o.retry_ms = 0
        o.prefetch_batches = 2
        return buf

    def plan(world, epoch):
        return bwpy.plan("--mode", "torch", "--num-samples", N, "--world-size", world, "--batch-size", B,
                         "--shuffle", "--seed", 3, "--epoch", epoch)

    def rank_steps(job, world, rank, epoch, batch=B):
        n = U64(12345)
        err = ctypes.create_string_buffer(2048)
        rc = L.bw_loader_rank_steps(options(job, world, rank, batch), epoch, ctypes.byref(n),
                                    err, len(err))
        return rc, n.value, err.value.decode()

    def open_loader(job, cursor=None):
        h = P()
        err = ctypes.create_string_buffer(2048)
        if cursor is None:
            rc = L.bw_loader_open(options(job), ctypes.byref(h), err, len(err))
        else:
            rc = L.bw_loader_open_at(options(job), cursor, 0, ctypes.byref(h), err, len(err))
        bt.check(rc == 0, "open %s" % job, err.value.decode())
        return h

    def nxt(h):
        b = P()
        rc = L.bw_loader_next(h, ctypes.byref(b))
        if rc != 0:
            return rc, None
        n = L.bw_batch_count(b)
        idx = ctypes.cast(L.bw_batch_indices(b), ctypes.POINTER(U64))
        return 0, (L.bw_batch_epoch(b), L.bw_batch_step(b), [idx[i] for i in range(n)])

    def want(epoch, steps, world=1):
        p = plan(world, epoch)[0]
        return [(epoch, b["step"], b["indices"]) for b in p if b["step"] in steps]

    for fn, res, args in (("bw_batch_count", ctypes.c_size_t, [P]), ("bw_batch_indices", P, [P]),
                          ("bw_batch_epoch", U64, [P]), ("bw_batch_step", U64, [P])):
        getattr(L, fn).restype = res
        getattr(L, fn).argtypes = args

    # ---- bw_loader_rank_steps ----
    for world in (1, 3):
        job = "steps-%d" % world
        for epoch in (0, 1):
            p = plan(world, epoch)
            for r in range(world):
                rc, n, err = rank_steps(job, world, r, epoch)
                bt.check(rc == 0 and n == len(p[r]),
                         "rank_steps(world %d, rank %d, epoch %d) = %d, the plan's %d" %
                         (world, r, epoch, n, len(p[r])), err)
    st = bt.status_json(coord.addr)
    jobs = {j["name"]: j for j in st.get("jobs", [])}
    bt.check("steps-3" in jobs, "the job was created as bw_loader_open would", sorted(jobs))
    rc, n, err = rank_steps("steps-3", 3, 0, 0, batch=B + 1)
    bt.check(rc == MISMATCH and "batch" in err, "another batch size: BW_MISMATCH naming it", err)
    rc, n, err = rank_steps("steps-3", 2, 0, 0)
    bt.check(rc == MISMATCH and n == 0, "another world size: BW_MISMATCH (%d)" % rc, err)
    h = P()
    e = ctypes.create_string_buffer(2048)
    o = options("steps-3", 3, 0)
    bt.check(L.bw_loader_open(o, ctypes.byref(h), e, len(e)) == 0,
             "nothing was claimed: rank 0 opens at once", e.value.decode())
    L.bw_loader_close(h)
    bt.ok("bw_loader_rank_steps: every rank's count is the plan's, the job created, nothing "
          "claimed; another configuration or world size refused")

    # An elastic resize from 2 ranks to 1 after 3 steps of epoch 0: epoch 0 then ends where
    # the resumed world-1 rank's last step says, epoch 1 runs at world 1, world 2 is refused.
    flags = ["--coordinator", coord.addr, "--job", "el", "--dataset", bwpy.NPY, "--mode",
             "torch", "--batch-size", B, "--shuffle", "--seed", 3]
    for r in range(2):
        x = bt.cli("fetch", *flags, "--rank", r, "--world-size", 2, "--max-steps", 3,
                   "--commit", "--quiet", timeout=60)
        bt.check(x.returncode == 0, "rank %d of 2 runs 3 steps and commits" % r, x.stderr)
    x = bt.cli("fetch", *flags, "--rank", 0, "--world-size", 1, "--elastic", timeout=60)
    bt.check(x.returncode == 0, "an elastic resume at world size 1", x.stderr)
    steps = [int(line.split('"step":')[1].split(",")[0]) for line in x.stdout.splitlines()
             if line.startswith('{"epoch":0')]
    rc, n, err = rank_steps("el", 1, 0, 0)
    bt.check(rc == 0 and steps and n == steps[-1] + 1,
             "resized epoch 0: rank_steps = %d, one past the last step the resumed rank "
             "delivered (%s)" % (n, steps[-1] if steps else None), err)
    rc, n, err = rank_steps("el", 1, 0, 1)
    bt.check(rc == 0 and n == len(plan(1, 1)[0]), "epoch 1 at world size 1: %d steps" % n, err)
    rc, n, err = rank_steps("el", 2, 0, 1)
    bt.check(rc == MISMATCH and "world size" in err, "the old world size is refused now", err)
    bt.ok("bw_loader_rank_steps after an elastic resize 2 -> 1: the resized epoch ends at the "
          "resumed rank's end (%d), the next has the plan's count at the new size" % steps[-1])

    # ---- set_epoch / epoch / next_epoch ----
    h = open_loader("epochs")
    got = [nxt(h)[1] for _ in range(3)]
    bt.check(got == want(0, {0, 1, 2}), "3 batches of epoch 0")
    bt.check(L.bw_loader_set_epoch(h, 0) == 0 and L.bw_loader_epoch(h) == 0, "set_epoch(0)")
    got = [nxt(h)[1] for _ in range(2)]
    bt.check(got == want(0, {0, 1}), "set_epoch(0) after batches starts epoch 0 over", got[0][:2])
    bt.check(L.bw_loader_set_epoch(h, 2) == 0 and L.bw_loader_epoch(h) == 2, "set_epoch(2)")
    p2 = want(2, set(range(1000)))
    got = []
    while True:
        rc, b = nxt(h)
        if rc != 0:
            break
        got.append(b)
    bt.check(rc == END and got == p2, "set_epoch(2): all of epoch 2 as planned, then its end "
             "(%d batches, rc %d)" % (len(got), rc))
    bt.check(L.bw_loader_next_epoch(h) == 0 and L.bw_loader_epoch(h) == 3, "next_epoch -> 3")
    bt.check([nxt(h)[1]] == want(3, {0}), "epoch 3 starts at its step 0")
    L.bw_loader_close(h)

    h = open_loader("resume")
    L.bw_loader_set_epoch(h, 1)
    [nxt(h) for _ in range(4)]
    cur = ctypes.create_string_buffer(512)
    bt.check(L.bw_loader_cursor_text(h, cur, len(cur)) == 0, "cursor after step 3 of epoch 1")
    L.bw_loader_close(h)
    h = open_loader("resume", cursor=cur.value)
    bt.check(L.bw_loader_epoch(h) == 1 and L.bw_loader_set_epoch(h, 1) == 0,
             "opened at the cursor: epoch 1, set_epoch(1)")
    bt.check([nxt(h)[1]] == want(1, {4}), "set_epoch(1) on a loader resumed mid-epoch 1 is a "
             "no-op: it continues at step 4")
    bt.check(L.bw_loader_set_epoch(h, 1) == 0 and [nxt(h)[1]] == want(1, {0}),
             "after a batch, set_epoch(1) starts epoch 1 over")
    # bw_loader_unnext: the batch handed out last is given back -- the cursor is the one
    # before it, and the next call hands the same batch out again; twice is refused.
    before = ctypes.create_string_buffer(512)
    L.bw_loader_cursor_text(h, before, len(before))
    rc, got = nxt(h)
    bt.check(rc == 0 and [got] == want(1, {1}), "step 1 of epoch 1 handed out")
    bt.check(L.bw_loader_unnext(h) == 0, "bw_loader_unnext gives it back")
    again = ctypes.create_string_buffer(512)
    L.bw_loader_cursor_text(h, again, len(again))
    bt.check(again.value == before.value, "the cursor is the one before the given-back batch")
    bt.check(L.bw_loader_unnext(h) == -13, "a second bw_loader_unnext is refused "
             "(BW_FAILED_PRECONDITION): nothing was handed out since")
    bt.check([nxt(h)[1]] == want(1, {1}) and [nxt(h)[1]] == want(1, {2}),
             "the next calls hand out step 1 again, then step 2")
    L.bw_loader_close(h)
    bt.ok("set_epoch / next_epoch / epoch: restart, jump, next, and a resumed loader kept "
          "mid-epoch; every batch the plan's")

    # ---- bw_interrupt from another thread ----
    h = open_loader("interrupt")
    plan0 = want(0, set(range(1000)))
    got = [nxt(h)[1] for _ in range(5)]
    w = workers[0]
    w.send(19)  # SIGSTOP
    out = {}

    def reader():
        while True:
            rc, b = nxt(h)
            if rc != 0:
                out["rc"], out["t"] = rc, time.monotonic()
                return
            got.append(b)
    try:
        t = threading.Thread(target=reader)
        t.start()
        time.sleep(1.5)  # past the prefetched batches: waiting for the stopped worker
        bt.check(t.is_alive(), "bw_loader_next is waiting for the stopped worker")
        t0 = time.monotonic()
        L.bw_interrupt()
        t.join(10)
        bt.check(out.get("rc") == INTERRUPTED and out["t"] - t0 <= 1.0,
                 "bw_loader_next returned BW_INTERRUPTED %.3f s after bw_interrupt from another "
                 "thread" % (out.get("t", t0 + 99) - t0), out)
        t0 = time.monotonic()
        rc, _ = nxt(h)
        bt.check(rc == INTERRUPTED and time.monotonic() - t0 < 0.5,
                 "a call made while it is raised returns it at once")
    finally:
        w.send(18)  # SIGCONT
    L.bw_interrupt_clear()
    before = len(got)
    for _ in range(20):
        rc, b = nxt(h)
        if rc != 0:
            raise bt.TestFailure("after bw_interrupt_clear the repeated call failed (rc %d)" % rc)
        got.append(b)
    bt.check(got == plan0[:len(got)], "after %d batches before the interrupt, the repeated calls "
             "deliver exactly the plan's next 20: none lost or repeated" % before)
    w.send(19)
    try:
        time.sleep(0.3)
        L.bw_interrupt()
        t0 = time.monotonic()
        L.bw_loader_close(h)
        took = time.monotonic() - t0
        bt.check(took <= 1.0, "bw_loader_close while interrupted, a worker stopped: %.3f s" % took)
    finally:
        w.send(18)
        L.bw_interrupt_clear()
    bt.ok("bw_interrupt from another thread ends a waiting bw_loader_next; repeated after clear "
          "it continues exactly; close while interrupted is prompt")


if __name__ == "__main__":
    bt.main(test, timeout=180)
