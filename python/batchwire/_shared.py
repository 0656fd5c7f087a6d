"""What a batchwire.torch.BatchDataset shares with the DataLoader worker processes that run
it, and each worker's tie to the trainer process. Internal to the package.

The shared state is one small region of shared memory (an unlinked file, mapped by every
process): created by the dataset in the main process, inherited by forked workers and
passed to spawn and forkserver workers as a file descriptor while they are started (pickling
it then, as multiprocessing does with its own shared memory). It holds

* the request: the position the next iteration starts at (epoch, step, maybe a cursor), set
  by set_epoch and load_state_dict in the main process, with a generation number;
* the record of the iteration running (or last run): its key, the position it started at,
  the request it consumed, and share 0's lease once share 0 has claimed the rank (or why it
  could not); and, while share 0 holds the lease, until when it is proven (or that it was
  lost, or given back), which share 0 publishes every PROOF_EVERY seconds and
  batchwire.torch.DataLoader's main process checks before it hands out each item;
* one slot per DataLoader worker: the last iteration it ran and whether it is done.

An iteration's key is what every worker of one DataLoader iteration computes alike: torch
gives every worker of one DataLoader iterator the same base seed (WorkerInfo.seed - id;
torch/utils/data/dataloader.py draws it once per iterator, _worker_loop adds the worker id),
and a worker with persistent_workers calls the dataset's __iter__ once per iteration (at its
start and at every _ResumeIteration), so (base seed, that worker's count of __iter__ calls)
names the iteration; without workers the main process's (pid, count). Share 0 (worker 0, or
the only process) decides where an iteration starts and publishes it with its lease; the
other workers wait for the record of their key, so none ever starts from, or confirms the
lease of, a previous iteration.

Every access takes a lock: a thread lock within the process and a POSIX record lock on the
file between processes.
"""

import contextlib
import ctypes
import errno
import fcntl
import mmap
import multiprocessing
import os
import select
import signal
import struct
import tempfile
import threading
import time
from typing import Any, Dict, Iterator, Optional, Tuple

from . import errors

Key = Tuple[int, int, int]  # an iteration: (kind, base seed, count)
Request = Tuple[int, int, int, Optional[str]]  # generation, epoch, step, cursor
Record = Dict[str, Any]  # key, consumed, epoch, step, cursor, status, lease, error

CURSOR_MAX = 1 << 16
LEASE_MAX = 512
ERROR_MAX = 2048
SLOTS = 256

KEY_NONE, KEY_WORKERS, KEY_MAIN = 0, 1, 2
PENDING, READY, FAILED = 0, 1, 2  # the record's status
# the record's lease proof: none published yet, proven until a time, lost, given back
UNPROVEN, PROVEN, LOST, RELEASED = 0, 1, 2, 3
PROOF_EVERY = 0.05  # seconds between share 0's publications of the proof
RUNNING, DONE = 1, 2  # a slot's state

_KEY = struct.Struct("<IQQ")
# request: generation, epoch, step, cursor length
_REQ = struct.Struct("<QqQI")
# record: key, consumed generation, epoch, step, cursor length, status, lease length, error
# length
_REC = struct.Struct("<IQQQqQIBHH")
# the record's lease proof: proven until (CLOCK_MONOTONIC ms), state, publisher's pid
_PROOF = struct.Struct("<QBQ")
# slot: key, pid, state
_SLOT = struct.Struct("<IQQIB")

_REQ_AT = 0
_REQ_CURSOR_AT = 64
_REC_AT = _REQ_CURSOR_AT + CURSOR_MAX
_PROOF_AT = _REC_AT + 64  # (after _REC)
_REC_CURSOR_AT = _REC_AT + 128
_REC_LEASE_AT = _REC_CURSOR_AT + CURSOR_MAX
_REC_ERROR_AT = _REC_LEASE_AT + LEASE_MAX
_SLOTS_AT = _REC_ERROR_AT + ERROR_MAX
SIZE = _SLOTS_AT + SLOTS * 32


def _rebuild(dupfd: Any) -> "SharedState":
    return SharedState(dupfd.detach())


def newer(key: Key, than: Key) -> bool:
    """Whether `key` is a later iteration of the same DataLoader iterator as `than` (same
    kind and base seed, a higher count): persistent workers' iterations are ordered."""
    return key[0] == than[0] != KEY_NONE and key[1] == than[1] and key[2] > than[2]


class SharedState:
    """The region and its operations (see the module docstring)."""

    def __init__(self, fd: Optional[int] = None) -> None:
        created = fd is None
        if created:
            where = "/dev/shm" if os.path.isdir("/dev/shm") else None
            try:
                fd, path = tempfile.mkstemp(prefix="batchwire-", dir=where)
            except OSError:
                fd, path = tempfile.mkstemp(prefix="batchwire-")
            os.unlink(path)
            os.ftruncate(fd, SIZE)
        assert fd is not None
        self._fd = fd
        self._map = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._tlock, self._pid = threading.Lock(), os.getpid()
        if created:
            _REQ.pack_into(self._map, _REQ_AT, 1, 0, 0, 0)  # requested: epoch 0, step 0

    def __del__(self) -> None:
        # This process's mapping and descriptor (workers have their own copies).
        for close in (getattr(self, "_map", None) and self._map.close,
                      lambda: os.close(self._fd)):
            try:
                if close:
                    close()
            except (OSError, ValueError, AttributeError):
                pass

    def __reduce__(self) -> Tuple[Any, Tuple[Any]]:
        # A duplicate of the descriptor travels with the pickle into a spawn or forkserver
        # worker while it is being started (multiprocessing.reduction.DupFd).
        from multiprocessing import reduction
        return _rebuild, (reduction.DupFd(self._fd),)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self._pid != os.getpid():  # a forked worker: a fresh thread lock
            self._tlock, self._pid = threading.Lock(), os.getpid()
        with self._tlock:
            while True:
                try:
                    fcntl.lockf(self._fd, fcntl.LOCK_EX)
                    break
                except InterruptedError:
                    continue
            try:
                yield
            finally:
                fcntl.lockf(self._fd, fcntl.LOCK_UN)

    # ---- raw access (under the lock)

    def _req(self) -> Request:
        gen, epoch, step, clen = _REQ.unpack_from(self._map, _REQ_AT)
        cur = bytes(self._map[_REQ_CURSOR_AT:_REQ_CURSOR_AT + clen]).decode() if clen else None
        return gen, epoch, step, cur

    def _rec(self) -> Record:
        (kind, a, b, consumed, epoch, step, clen, status, llen,
         elen) = _REC.unpack_from(self._map, _REC_AT)
        cur = bytes(self._map[_REC_CURSOR_AT:_REC_CURSOR_AT + clen]).decode() if clen else None
        lease = bytes(self._map[_REC_LEASE_AT:_REC_LEASE_AT + llen]).decode()
        err = bytes(self._map[_REC_ERROR_AT:_REC_ERROR_AT + elen]).decode("utf-8", "replace")
        return {"key": (kind, a, b), "consumed": consumed, "epoch": epoch, "step": step,
                "cursor": cur, "status": status, "lease": lease, "error": err}

    def _write_rec(self, key: Key, consumed: int, epoch: int, step: int, cursor: Optional[str],
                   status: int, lease: str = "", error: str = "") -> None:
        cb = (cursor or "").encode()
        lb = lease.encode()[:LEASE_MAX]
        eb = error.encode("utf-8", "replace")[:ERROR_MAX]
        self._map[_REC_CURSOR_AT:_REC_CURSOR_AT + len(cb)] = cb
        self._map[_REC_LEASE_AT:_REC_LEASE_AT + len(lb)] = lb
        self._map[_REC_ERROR_AT:_REC_ERROR_AT + len(eb)] = eb
        _REC.pack_into(self._map, _REC_AT, key[0], key[1], key[2], consumed, epoch, step,
                       len(cb), status, len(lb), len(eb))

    def _pending(self, req: Optional[Request] = None, rec: Optional[Record] = None) -> bool:
        req = req or self._req()
        rec = rec or self._rec()
        return bool(req[0] > rec["consumed"])

    # ---- the main process: where the next iteration starts

    def request(self, epoch: int, step: int, cursor: Optional[str] = None) -> None:
        """The next iteration starts at (epoch, step), after `cursor` when given."""
        cb = (cursor or "").encode()
        if len(cb) > CURSOR_MAX:
            raise errors.TooBigError("the cursor's %d bytes do not fit the %d the dataset "
                                     "shares with its workers" % (len(cb), CURSOR_MAX))
        with self._locked():
            gen = self._req()[0] + 1
            self._map[_REQ_CURSOR_AT:_REQ_CURSOR_AT + len(cb)] = cb
            _REQ.pack_into(self._map, _REQ_AT, gen, int(epoch), int(step), len(cb))

    def set_epoch(self, epoch: int) -> None:
        """Requests (epoch, 0), unless the next iteration already starts in that epoch at a
        position requested and not yet run (a resume mid-epoch keeps its step)."""
        with self._locked():
            req = self._req()
            if self._pending(req) and req[1] == epoch:
                return
        self.request(epoch, 0)

    def next_start(self, arm: bool = False) -> Tuple[int, int]:
        """(epoch, step) where the next iteration starts: the pending request, else the epoch
        after the last iteration's. arm: make that an explicit request (so the workers start
        exactly there)."""
        with self._locked():
            req, rec = self._req(), self._rec()
            if self._pending(req, rec):
                return req[1], req[2]
            nxt = int(rec["epoch"]) + 1
        if arm:
            self.request(nxt, 0)
        return nxt, 0

    def epoch(self) -> int:
        """The epoch of the iteration running or last run, or the one requested for the next
        iteration when there is such a request."""
        with self._locked():
            req, rec = self._req(), self._rec()
            return req[1] if self._pending(req, rec) else int(rec["epoch"])

    # ---- share 0: an iteration starts

    def begin(self, key: Key) -> Tuple[int, int, Optional[str]]:
        """Share 0 starts the iteration `key`: its position (epoch, step, cursor or None) --
        the pending request, else the epoch after the last iteration's -- recorded (status
        PENDING) for the other shares."""
        with self._locked():
            req, rec = self._req(), self._rec()
            if rec["key"] == key:
                return int(rec["epoch"]), int(rec["step"]), rec["cursor"]
            if self._pending(req, rec):
                consumed, epoch, step, cursor = req
            else:
                consumed, epoch, step, cursor = int(rec["consumed"]), int(rec["epoch"]) + 1, 0, None
            self._write_rec(key, consumed, epoch, step, cursor, PENDING)
            _PROOF.pack_into(self._map, _PROOF_AT, 0, UNPROVEN, 0)
            return epoch, step, cursor

    def publish(self, key: Key, lease: str) -> None:
        """Share 0 claimed the rank for iteration `key`: the other shares may open."""
        self._finish(key, READY, lease=lease)

    def fail(self, key: Key, message: str) -> None:
        """Share 0 could not open for iteration `key`: the other shares give up."""
        self._finish(key, FAILED, error=message)

    def _finish(self, key: Key, status: int, lease: str = "", error: str = "") -> None:
        with self._locked():
            rec = self._rec()
            if rec["key"] == key:
                self._write_rec(key, rec["consumed"], rec["epoch"], rec["step"], rec["cursor"],
                                status, lease, error)

    def prove(self, key: Key, until_ms: int, state: int) -> None:
        """Share 0 of iteration `key`: its lease is proven until `until_ms` (CLOCK_MONOTONIC
        milliseconds, bw_loader_lease_state), or LOST, or RELEASED. Nothing once a later
        iteration began; a lost lease stays lost."""
        with self._locked():
            if self._rec()["key"] != key:
                return
            if _PROOF.unpack_from(self._map, _PROOF_AT)[1] == LOST:
                return
            _PROOF.pack_into(self._map, _PROOF_AT, int(until_ms), state, os.getpid())

    def proof(self, consumed: int, base: Optional[int] = None) -> Tuple[int, int, int]:
        """(until_ms, state, pid) that share 0 published for the DataLoader iteration that
        consumed request `consumed` (and, given `base`, whose workers' base seed it is);
        (0, UNPROVEN, 0) while that iteration's share 0 has published nothing."""
        with self._locked():
            rec = self._rec()
            if (rec["key"][0] != KEY_WORKERS or rec["consumed"] != consumed or
                    (base is not None and rec["key"][1] != base)):
                return 0, UNPROVEN, 0
            until, state, pid = _PROOF.unpack_from(self._map, _PROOF_AT)
            return int(until), int(state), int(pid)

    def generation(self) -> int:
        """The generation of the latest request (the one the next iteration consumes, after
        next_start(arm=True))."""
        with self._locked():
            return self._req()[0]

    # ---- the other shares

    def wait_ready(self, key: Key, timeout: float) -> Optional[Record]:
        """The record of iteration `key` once share 0 has opened (or failed); None when a
        later iteration of the same workers has begun (this one was abandoned). Polls,
        interruptibly; DeadlineExceededError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        pause = 0.001
        while True:
            with self._locked():
                rec = self._rec()
            if rec["key"] == key and rec["status"] != PENDING:
                return rec
            if newer(rec["key"], key):
                return None
            if time.monotonic() > deadline:
                raise errors.DeadlineExceededError(
                    "DataLoader worker: share 0 of the rank (DataLoader worker 0) did not "
                    "claim the rank within %.0f s" % timeout)
            time.sleep(pause)
            pause = min(pause * 2, 0.02)

    # ---- slots: which worker is done with which iteration

    def slot(self, worker: int, key: Key, state: int) -> None:
        if not 0 <= worker < SLOTS:
            return
        with self._locked():
            at = _SLOTS_AT + worker * 32
            if state == DONE and _SLOT.unpack_from(self._map, at)[:3] != key:
                return  # a later iteration began in this slot already
            _SLOT.pack_into(self._map, at, key[0], key[1], key[2], os.getpid(), state)

    def wait_done(self, key: Key, nworkers: int) -> None:
        """Share 0 at the end of iteration `key` waits until every other worker is done with
        it (or has moved on to a later iteration, or has exited), so that the lease the
        others confirm is not given back under them."""
        pause = 0.001
        todo = set(range(1, min(nworkers, SLOTS)))
        while todo:
            with self._locked():
                slots = {w: _SLOT.unpack_from(self._map, _SLOTS_AT + w * 32) for w in todo}
            for w, (kind, a, b, pid, state) in slots.items():
                k = (kind, a, b)
                if newer(k, key) or (k == key and (state == DONE or not alive(pid))):
                    todo.discard(w)
            if todo:
                time.sleep(pause)
                pause = min(pause * 2, 0.005)


def alive(pid: int) -> bool:
    """Whether process `pid` exists and has not exited (a zombie, exited but not yet
    reaped, counts as gone)."""
    if pid <= 0:
        return False
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read()
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ESRCH):
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    state = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]
    return state not in (b"Z", b"X", b"x")


_tied = {"pid": 0}
_PR_SET_PDEATHSIG = 1


def trainer_pid() -> int:
    """The trainer process this DataLoader worker serves: the process that created the worker
    (multiprocessing's parent process, also under forkserver, whose workers are children of
    the fork server, not of the trainer); this process when it is no worker."""
    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None and parent.pid is not None else os.getpid()


def tie_to_trainer() -> None:
    """Makes this DataLoader worker die with the trainer (once per process). A worker the
    trainer forked or spawned is its child: the kernel kills it when the trainer exits (prctl
    PR_SET_PDEATHSIG), and if the trainer is already gone it dies now. A forkserver's worker
    is the fork server's child, and the fork server outlives the trainer while its children
    live (they hold its liveness pipe): a thread waits for the trainer's exit (a pidfd, else
    polling /proc every 0.2 s) and then kills the worker. An orphaned worker would otherwise
    go on holding the rank's lease and reading batches after the trainer was killed."""
    if _tied["pid"] == os.getpid():
        return
    _tied["pid"] = os.getpid()
    trainer = trainer_pid()
    ppid = os.getppid()
    if ppid != trainer:
        threading.Thread(target=_watch, args=(trainer,), name="batchwire-trainer-watch",
                         daemon=True).start()
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0),
                   ctypes.c_ulong(0), ctypes.c_ulong(0))
    except (OSError, AttributeError):
        pass  # not Linux: torch's own watchdog still ends the worker, later
    if os.getppid() != ppid or not alive(trainer):  # the trainer died before prctl
        os.kill(os.getpid(), signal.SIGKILL)


def _watch(trainer: int) -> None:
    try:
        fd = os.pidfd_open(trainer)
    except (OSError, AttributeError):
        fd = None
    if fd is not None:
        while alive(trainer):
            # Readable once the process has exited (also while it is a zombie).
            if select.select([fd], [], [], 5.0)[0]:
                break
    else:
        while alive(trainer):
            time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGKILL)
