#!/usr/bin/python3
"""The rank's lease shared with the trainer's other processes, and the holder's pid
(include/batchwire/loader.h: bw_loader_lease, bw_loader_options.lease and .holder_pid;
docs/client.md, "Fencing"), through the C API (ctypes).

* Share 0 of 2 claims rank 0 with holder_pid set to a stand-in "trainer" process: the
  coordinator reports that pid as the holder. bw_loader_lease gives its lease as "bwl1:" and 32
  hex digits (BW_TOO_BIG for a short buffer); a share holds none (BW_FAILED_PRECONDITION).
* Share 1 given the lease confirms it at open and reads its steps; text that is not a lease,
  a lease given to share 0, and a lease that is not the rank's are refused before anything is
  read, naming the option (and never echoing the secret).
* bw_loader_lease_state: share 0 and share 1 (given the lease) report the lease proven until a
  CLOCK_MONOTONIC time ahead of now and within the lease less its tenth, not lost; a share
  without a lease: BW_FAILED_PRECONDITION.
* The "trainer" exits while both shares are still open (the DataLoader-worker orphan of issue
  22): a loader restarted on this host reclaims rank 0 at once, and both shares then stop for
  good with BW_LEASE_LOST (bw_loader_lease_state: lost, proven until 0).
"""

import ctypes
import os
import re
import subprocess
import time

import bwpy
import bwtest as bt

bwpy.maybe_reexec_under_asan()

N, B, LEASE_MS = 2000, 4, 6000


def test(tmpdir):
    batchwire = bwpy.import_batchwire()
    from batchwire import _lib
    L = ctypes.CDLL(_lib.path())  # the C API, declared here as loader.h has it
    P = ctypes.c_void_p
    for fn, res, args in (
            ("bw_loader_open", ctypes.c_int, [P, ctypes.POINTER(P), ctypes.c_char_p,
                                              ctypes.c_size_t]),
            ("bw_loader_next", ctypes.c_int, [P, ctypes.POINTER(P)]),
            ("bw_loader_next_epoch", ctypes.c_int, [P]),
            ("bw_batch_step", ctypes.c_uint64, [P]),
            ("bw_loader_errmsg", ctypes.c_char_p, [P]),
            ("bw_loader_close", None, [P]),
            ("bw_loader_lease", ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_size_t]),
            ("bw_loader_lease_state", ctypes.c_int, [P, ctypes.POINTER(ctypes.c_uint64),
                                                     ctypes.POINTER(ctypes.c_int)]),
            ("bw_err_name", ctypes.c_char_p, [ctypes.c_int])):
        getattr(L, fn).restype = res
        getattr(L, fn).argtypes = args

    def name(rc):
        return L.bw_err_name(rc).decode()

    def lease_state(h):
        until, lost = ctypes.c_uint64(), ctypes.c_int(-1)
        rc = L.bw_loader_lease_state(h, ctypes.byref(until), ctypes.byref(lost))
        return name(rc), until.value, lost.value

    root = os.path.join(tmpdir, "data")
    os.makedirs(root)
    bwpy.gen_npy(root, "ds", N)
    coord = bt.coordinator(tmpdir, args=["--lease-ms", LEASE_MS])
    for i in range(2):
        bt.worker(tmpdir, coord.addr, "w%d" % i, data_root=root)
    bt.poll(lambda: sum(w["state"] == "alive" for w in bt.status_json(coord.addr)["workers"]) ==
            2, 20, what="2 live workers")

    keep = []

    def open_loader(share, count, lease=None, holder_pid=0):
        # bw_loader_options with the library's defaults, its layout from the headers (cffi).
        o = _lib.new_options()
        strs = [_lib.ffi.new("char[]", x) if x is not None else _lib.ffi.NULL for x in
                (coord.addr.encode(), b"share", bwpy.NPY.encode(), lease)]
        buf = P(int(_lib.ffi.cast("uintptr_t", o)))
        keep.append((o, strs))
        o.coordinator, o.job, o.dataset = strs[0], strs[1], strs[2]
        o.rank, o.world_size, o.batch_size = 0, 1, B
        o.share_index, o.share_count = share, count
        o.holder_pid = holder_pid
        o.lease = strs[3]
        o.retry_ms = 0
        h = P()
        err = ctypes.create_string_buffer(2048)
        rc = L.bw_loader_open(buf, ctypes.byref(h), err, len(err))
        return rc, h, err.value.decode()

    def steps(h, n):
        out = []
        b = P()
        for _ in range(n):
            rc = L.bw_loader_next(h, ctypes.byref(b))
            if rc != 0:
                return out, rc
            out.append(L.bw_batch_step(b))
        return out, 0

    # A stand-in trainer process: the shares name it as the holder.
    trainer = subprocess.Popen(["sleep", "600"])
    rc, s0, err = open_loader(0, 2, holder_pid=trainer.pid)
    bt.check(rc == 0, "share 0 of 2 claims rank 0 for holder pid %d" % trainer.pid, err)
    st = bt.status_json(coord.addr)
    holder = [rk.get("pid") for j in st["jobs"] for rk in j["ranks"] if j["name"] == "share"]
    bt.check(holder == [trainer.pid], "the coordinator reports pid %d as the holder: %s" %
             (trainer.pid, holder))

    small = ctypes.create_string_buffer(16)
    rc = L.bw_loader_lease(s0, small, len(small))
    bt.check(name(rc) == "BW_TOO_BIG", "bw_loader_lease into 16 bytes: %s (%s)" %
             (name(rc), L.bw_loader_errmsg(s0).decode()))
    buf = ctypes.create_string_buffer(64)
    rc = L.bw_loader_lease(s0, buf, len(buf))
    lease = buf.value
    bt.check(rc == 0 and re.fullmatch(rb"bwl1:[0-9a-f]{32}", lease) is not None,
             "bw_loader_lease gives share 0's lease as bwl1: and 32 hex digits (%d bytes)" %
             len(lease))

    rc, s1, err = open_loader(1, 2, lease=lease, holder_pid=trainer.pid)
    bt.check(rc == 0, "share 1 of 2 opens with the lease and confirms it", err)
    got, rc = steps(s1, 5)
    bt.check(rc == 0 and got == [1, 3, 5, 7, 9], "share 1 reads its steps: %s" % got)
    rc = L.bw_loader_lease(s1, buf, len(buf))
    bt.check(name(rc) == "BW_FAILED_PRECONDITION", "bw_loader_lease of a share: %s (%s)" %
             (name(rc), L.bw_loader_errmsg(s1).decode()))
    for h, what in ((s0, "share 0"), (s1, "share 1 (given the lease)")):
        now = time.monotonic() * 1000
        st, until, lost = lease_state(h)
        bt.check(st == "BW_OK" and lost == 0 and now < until <= now + LEASE_MS * 0.9 + 1,
                 "bw_loader_lease_state of %s: %s, proven %.0f ms ahead (lease %d ms less its "
                 "tenth at most), lost %d" % (what, st, until - now, LEASE_MS, lost))
    rc, unfenced, err = open_loader(1, 2)
    bt.check(rc == 0, "share 1 of 2 without the lease opens (unfenced)", err)
    bt.check(lease_state(unfenced)[0] == "BW_FAILED_PRECONDITION",
             "bw_loader_lease_state of a share without a lease: %s" % lease_state(unfenced)[0])
    L.bw_loader_close(unfenced)

    bad = [(b"bwl1:" + b"0" * 32, 1, "all zero"), (b"bwl1:" + b"G" * 32, 1, "not hex"),
           (lease[:-1], 1, "one digit short"), (lease + b"0", 1, "one digit long"),
           (b"bwl2:" + lease[5:], 1, "another version"), (b"", 1, "empty"),
           (lease, 0, "given to share 0")]
    for text, share, what in bad:
        rc, h, err = open_loader(share, 2, lease=text)
        bt.check(name(rc) == "BW_INVALID_ARGUMENT" and err.startswith("lease: ") and
                 lease[5:].decode() not in err,
                 "a lease option %s is refused naming the option: %s" % (what, err))
        if h:
            L.bw_loader_close(h)
    other = b"bwl1:" + bytes("%032x" % (int(lease[5:], 16) ^ 1), "ascii")
    rc, h, err = open_loader(1, 2, lease=other)
    bt.check(name(rc) == "BW_LEASE_LOST" and "lease" in err and other[5:].decode() not in err,
             "a lease that is not the rank's is refused at open: %s" % err)

    # The trainer exits; its shares linger (orphaned DataLoader workers). A trainer restarted
    # on this host reclaims the rank at once, and the shares are fenced.
    trainer.kill()
    trainer.wait()
    t0 = time.monotonic()
    rc, fresh, err = open_loader(0, 1)
    took = time.monotonic() - t0
    bt.check(rc == 0 and took < LEASE_MS / 2000.0,
             "a loader restarted on this host reclaimed rank 0 from its exited holder in %.2f s "
             "(the lease lasts %d s)" % (took, LEASE_MS // 1000), err)
    # Until its next heartbeat (a third of the lease) a share cannot tell: a reclaim ends the
    # lease early, on the word of the restarted trainer that the holder exited.
    t1 = time.monotonic()
    for h, what in ((s0, "share 0"), (s1, "share 1")):
        n, rc, b = 0, 0, P()
        while time.monotonic() - t1 < LEASE_MS / 1000.0:
            rc = L.bw_loader_next(h, ctypes.byref(b))
            if name(rc) == "BW_END_OF_EPOCH":
                rc = L.bw_loader_next_epoch(h)
            elif rc != 0:
                break
            n += 1
            time.sleep(0.005)
        bt.check(name(rc) == "BW_LEASE_LOST",
                 "%s stops with BW_LEASE_LOST %.2f s after the reclaim (%d batches before its "
                 "heartbeat was refused): %s" %
                 (what, time.monotonic() - t1, n, L.bw_loader_errmsg(h).decode()))
        got, rc = steps(h, 1)
        bt.check(name(rc) == "BW_LEASE_LOST" and not got, "%s stays stopped" % what)
        bt.check(lease_state(h) == ("BW_OK", 0, 1),
                 "bw_loader_lease_state of %s: lost, proven until 0: %s" %
                 (what, lease_state(h)))
    got, rc = steps(fresh, 3)
    bt.check(rc == 0 and len(got) == 3, "the restarted loader reads: %s" % got)
    for h in (s0, s1, fresh):
        L.bw_loader_close(h)


if __name__ == "__main__":
    bt.main(test, timeout=120)
