"""batchwire with PyTorch's DataLoader: one rank's batches (or samples) as an IterableDataset.

    from batchwire.torch import BatchDataset, DataLoader
    ds = BatchDataset(coordinator=..., job="run1", dataset="npy:train/*.npy", batch_size=32,
                      shuffle=True, seed=0)                 # rank / world_size: RANK, WORLD_SIZE
    loader = DataLoader(ds, num_workers=2, pin_memory=True)   # torch's, plus state_dict()
    for epoch in range(10):
        for batch in loader:                                  # this rank's batches, plan order
            train_step(batch["data"], batch["padding"])

A BatchDataset yields this rank's batches of one epoch in plan order (docs/semantics.md).
Under ``torch.utils.data.DataLoader(num_workers=N)`` each DataLoader worker reads a disjoint
share of the rank's batches -- worker w the steps first + w, first + w + N, ... -- and the
DataLoader, which takes one item from each worker in turn, restores the plan's order. Worker
0 claims the rank's lease (on behalf of the trainer process: holder_pid) and hands it to the
others, which confirm it too (bw_loader_options.share_*, .lease), so wrapping the rank in a
DataLoader is not refused as a second claim, and every worker stops once the lease is lost;
batchwire.torch.DataLoader's main process hands out an item only while worker 0's lease is
proven (worker 0 publishes until when: _Proof, _Fence), so the items read ahead into torch's
queue are not handed out after a takeover. The main process opens nothing: the workers it
forks start with no library state. Workers die with the trainer (a trainer killed and
restarted gets its rank back at once).

Epochs: as with torch's DataLoader over a DistributedSampler. Each iteration runs one epoch:
the one set_epoch (or load_state_dict: the rest of that epoch) named, else the epoch after
the last iteration's -- so a plain ``for epoch in range(E): for batch in loader:`` walks the
epochs, and ``ds.set_epoch(e)`` each time does the same. The epoch reaches the workers
through state shared with them (batchwire._shared), also with persistent_workers=True and
under the fork, spawn and forkserver contexts.

Items (batch mode): ``{"data", "indices", "padding", "epoch", "step"}`` (and ``"sources"``, an
int64 tensor, for a mixture: Loader's ``mixture``; ``"passes"`` too when it has a stream
source) -- data is the
batch's tensor for .npy datasets (no transform), else ``collate_fn`` of the transformed
samples; indices an int64 tensor, padding a bool tensor (True for padding duplicates). Use
``DataLoader(ds, batch_size=None)`` (the default of batchwire.torch.DataLoader): the batches
are already made. With ``samples=True`` the dataset yields samples instead, and the
DataLoader batches them (``batch_size`` equal to the job's per-rank batch size keeps the
plan's batches); padding duplicates are included, as DistributedSampler's are.

``transform`` is called on every sample (a row tensor for .npy datasets, the sample's bytes
otherwise), in ``decode_threads`` threads when given (order kept), inside the DataLoader's
worker processes when it has them. batchwire.torch.DataLoader adds ``state_dict()`` /
``load_state_dict()`` (python/README.md, "batchwire.torch").
"""

import concurrent.futures
import os
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.utils.data

from . import _lib
from . import _probe
from . import _shared
from . import errors
from . import state as _state
from ._cdefs import BW_OK
from .loader import Batch, Loader

_MANAGED = ("resume", "start", "share", "elastic", "lease", "holder_pid")
_MASK64 = (1 << 64) - 1


def _env_int(names: Sequence[str]) -> Optional[int]:
    for n in names:
        v = os.environ.get(n)
        if v is not None and v.strip().isdigit():
            return int(v)
    return None


class BatchDataset(torch.utils.data.IterableDataset):
    """One rank's batches (or samples) of one epoch per iteration, for
    torch.utils.data.DataLoader.

    Keyword arguments are Loader's (coordinator, job, dataset, batch_size, mode, shuffle,
    seed, rank, world_size, drop_last, ..., prefetch, timeout, tls_*), except resume, start,
    share, elastic, lease and holder_pid, which the dataset manages, plus:

    samples         False: one item per batch (a dict); True: one item per sample
    transform       callable on each sample (decode, augment); default: none
    collate_fn      batch mode with a transform or a non-.npy dataset: combines the batch's
                    (transformed) samples; default torch's default_collate with a transform,
                    else the list as it is
    decode_threads  run transform in this many threads per process (order kept); 0: inline
    keys            tar (WebDataset) and JSON Lines datasets: each sample is a dict of its
                    fields (Batch.fields) -- True: all of them, a list: only those keys;
                    None (default): the sample's bytes
    arrays          datasets of named arrays (dataset={"x": ..., "y": ...}, or npz): what an
                    item is -- "tuple": (x, y, ...) in the dataset's field order (a tuple
                    under batchwire.torch.DataLoader; torch's own makes it a list, as it does
                    TensorDataset's batches); "dict": {"x": x, "y": y};
                    None (default): the usual item dict, its "data" {"x": x, "y": y}. With
                    samples=True each sample is a tuple (None, "tuple") or a dict ("dict")
                    of its rows

    Which epoch an iteration runs: the one set_epoch named (from its start) or
    load_state_dict (after its batch), else the epoch after the previous iteration's; 0 at
    first. ``len(ds)`` is this rank's batches per epoch (samples with samples=True), asked of
    the coordinator from a short-lived subprocess (the main process must not start the
    library's network runtime before the DataLoader forks its workers) and cached.
    """

    def __init__(self, samples: bool = False, transform: Optional[Callable[[Any], Any]] = None,
                 collate_fn: Optional[Callable[[List[Any]], Any]] = None, decode_threads: int = 0,
                 keys: Union[None, bool, Sequence[str]] = None, arrays: Optional[str] = None,
                 **loader_kw: Any) -> None:
        super().__init__()
        if arrays not in (None, "tuple", "dict"):
            raise errors.InvalidArgumentError(
                "BatchDataset: arrays=%r: expected \"tuple\", \"dict\" or None" % (arrays,))
        self.arrays = arrays
        bad = [k for k in _MANAGED if k in loader_kw]
        if bad:
            raise errors.InvalidArgumentError(
                "BatchDataset manages %s itself: use set_epoch() and load_state_dict()" %
                ", ".join(bad))
        for k in ("coordinator", "job", "dataset"):
            if not loader_kw.get(k) and not (k == "coordinator" and
                                             os.environ.get("BATCHWIRE_COORDINATOR")) and \
                    not (k == "dataset" and loader_kw.get("mixture")):
                raise errors.InvalidArgumentError("BatchDataset: %s is required" % k)
        self.samples = bool(samples)
        self.transform = transform
        self.collate_fn = collate_fn
        self.decode_threads = int(decode_threads)
        self.keys = keys
        self.loader_kw = loader_kw
        self._shared = _shared.SharedState()
        self._iters = 0  # __iter__ calls in this process (the count of an iteration's key)
        self._len: Dict[int, int] = {}  # epoch -> len(self), the main process's cache

    # ---- epochs and state (main process)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs, from its start, as DistributedSampler.set_epoch.
        Naming the epoch the next iteration already starts in (after load_state_dict, or a
        set_epoch before) keeps that position."""
        epoch = int(epoch)
        if epoch < 0:
            raise errors.InvalidArgumentError("set_epoch: %d is not an epoch" % epoch)
        self._shared.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        """The epoch of the iteration running (or last run); before an iteration, the one
        set_epoch or load_state_dict named for it."""
        return self._shared.epoch()

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self.set_epoch(epoch)

    def rank_and_world(self) -> Tuple[int, int]:
        """This rank and world size: the options', else RANK/WORLD_SIZE, else
        SLURM_PROCID/SLURM_NTASKS (as the library resolves them)."""
        rank = self.loader_kw.get("rank")
        world = self.loader_kw.get("world_size")
        rank = _env_int(("RANK", "SLURM_PROCID")) if rank is None else int(rank)
        world = _env_int(("WORLD_SIZE", "SLURM_NTASKS")) if world is None else int(world)
        if rank is None or world is None:
            raise errors.InvalidArgumentError("BatchDataset: rank and world size not given "
                                              "(options, RANK/WORLD_SIZE or SLURM_*)")
        return rank, world

    def start(self) -> Tuple[int, int]:
        """(epoch, step) where the next iteration starts."""
        return self._shared.next_start()

    def state_dict_at(self, epoch: int, step: int) -> Dict[str, Any]:
        rank, world = self.rank_and_world()
        return _state.rank_state(self.loader_kw["job"], rank, world, epoch, step)

    def load_state_dict(self, sd: Dict[str, Any]) -> None:
        """Starts the next iteration after the batch a state describes (the rest of its
        epoch). A state of another rank, job or world size is refused."""
        sd = _state.check_state(sd, "load_state_dict")
        rank, world = self.rank_and_world()
        if (sd["job"], sd["rank"], sd["world_size"]) != (self.loader_kw["job"], rank, world):
            raise errors.MismatchError(
                "load_state_dict: the state is job %r rank %d of %d, this dataset job %r rank "
                "%d of %d (another world size resumes with Loader(elastic=True))" % (
                    sd["job"], sd["rank"], sd["world_size"], self.loader_kw["job"], rank,
                    world))
        cur = sd.get("cursor")
        if isinstance(cur, bytes):
            cur = _state.cursor_text(cur)
        self._shared.request(sd["epoch"], sd["step"], cur)

    def __len__(self) -> int:
        """This rank's batches per epoch (what len() of a DataLoader over a
        DistributedSampler gives for the same settings); with samples=True its samples per
        epoch (padding included). Asked from a subprocess, cached."""
        epoch = self.epoch
        if epoch not in self._len:
            if self.samples:
                self._len[epoch] = _probe.rank_samples(self.loader_kw, epoch)
            else:
                self._len[epoch] = _probe.rank_steps(self.loader_kw, epoch)
        return self._len[epoch]

    # ---- iteration (a DataLoader worker, or the main process without workers)

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        self._iters += 1
        if info is None:
            key = (_shared.KEY_MAIN, os.getpid(), self._iters)
            return self._run(key, 0, 1, None)
        _shared.tie_to_trainer()
        key = (_shared.KEY_WORKERS, (info.seed - info.id) & _MASK64, self._iters)
        return self._run(key, info.id, info.num_workers, _shared.trainer_pid())

    def _open_first(self, key: _shared.Key, nshares: int, holder: Optional[int]) -> Loader:
        """Share 0 (worker 0, or the only process): where the iteration starts, the rank
        claimed on behalf of the trainer, the lease published for the other shares."""
        epoch, step, cursor = self._shared.begin(key)
        kw = dict(self.loader_kw, holder_pid=holder)
        if cursor:
            kw["resume"] = cursor
        else:
            kw["start"] = (epoch, step)
        if nshares > 1:
            kw["share"] = (0, nshares)
        try:
            lo = Loader(**kw)
            if nshares > 1:
                try:
                    self._shared.publish(key, lo.lease())
                except BaseException:
                    lo.close()
                    raise
        except BaseException as e:
            if nshares > 1:
                self._shared.fail(key, "%s: %s" % (type(e).__name__, e))
            raise
        return lo

    def _open_other(self, key: _shared.Key, index: int, nshares: int) -> Optional[Loader]:
        """Share `index` > 0: waits for share 0's record of this iteration and opens where it
        starts, confirming its lease; None when the iteration was abandoned meanwhile."""
        kw = self.loader_kw
        wait = float(kw.get("retry", 60.0)) + 3 * float(kw.get("timeout", 10.0)) + 30.0
        rec = self._shared.wait_ready(key, wait)
        if rec is None:
            return None
        if rec["status"] == _shared.FAILED:
            raise errors.FailedPreconditionError(
                "DataLoader worker %d: worker 0 could not claim the rank, so this worker "
                "reads nothing (%s)" % (index, rec["error"]))
        kw = dict(kw, share=(index, nshares), lease=rec["lease"])
        if rec["cursor"]:
            kw["resume"] = rec["cursor"]
        else:
            kw["start"] = (rec["epoch"], rec["step"])
        return Loader(**kw)

    def _run(self, key: _shared.Key, index: int, nshares: int,
             holder: Optional[int]) -> Iterator[Any]:
        pool = (concurrent.futures.ThreadPoolExecutor(self.decode_threads)
                if self.decode_threads > 0 and self.transform is not None else None)
        if index > 0:
            self._shared.slot(index, key, _shared.RUNNING)
        try:
            lo = (self._open_first(key, nshares, holder) if index == 0 else
                  self._open_other(key, index, nshares))
            if lo is None:
                return
            with lo:
                # Worker 0 (also the only one): the main process hands out items only while
                # this loader's lease is proven (DataLoader.__iter__); published before any
                # item.
                proof = (_Proof(self._shared, key, lo)
                         if index == 0 and key[0] == _shared.KEY_WORKERS else None)
                try:
                    for batch in lo:
                        out = (self._decode(self._sample_values(batch), pool) if self.samples
                               else [self._item(batch, pool)])
                        del batch  # (the loader then keeps nothing of it for later: _move_on)
                        yield from out
                    if index == 0 and nshares > 1:
                        # The others confirm this loader's lease: keep it until they are done.
                        self._shared.wait_done(key, nshares)
                finally:
                    if proof is not None:
                        proof.stop()  # before the loader closes
        finally:
            if index > 0:
                self._shared.slot(index, key, _shared.DONE)
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)

    def _sample_values(self, batch: Batch) -> List[Any]:
        if batch.arrays:  # named arrays: each sample's rows, as a tuple or a dict
            t = batch.fields(as_torch=True)
            if self.arrays == "dict":
                return [{k: v[i] for k, v in t.items()} for i in range(batch.count)]
            return [tuple(v[i] for v in t.values()) for i in range(batch.count)]
        if batch.shape is not None:
            return list(batch.torch())  # rows of the held batch tensor
        if self.keys is not None:
            keys = None if isinstance(self.keys, bool) else self.keys
            return list(batch.fields(keys))
        return batch.samples()

    def _decode(self, values: List[Any],
                pool: Optional[concurrent.futures.ThreadPoolExecutor]) -> List[Any]:
        if self.transform is None:
            return values
        if pool is not None:
            return list(pool.map(self.transform, values))
        return [self.transform(v) for v in values]

    def _item(self, batch: Batch, pool: Optional[concurrent.futures.ThreadPoolExecutor]) -> Any:
        if self.transform is None and batch.arrays:
            data = batch.fields(as_torch=True)
            if self.arrays is not None:  # the arrays themselves, as TensorDataset's batches
                return tuple(data.values()) if self.arrays == "tuple" else data
        elif self.transform is None and batch.shape is not None:
            data = batch.torch()
        else:
            values = self._decode(self._sample_values(batch), pool)
            collate = self.collate_fn or (torch.utils.data.default_collate
                                          if self.transform is not None else list)
            data = collate(values)
            if batch.arrays and self.arrays is not None:
                return data
        item = {"data": data, "indices": torch.from_numpy(batch.indices),
                "padding": torch.from_numpy(batch.padding), "epoch": batch.epoch,
                "step": batch.step}
        if batch.sources is not None:  # a mixture: each sample's source (docs/client.md)
            item["sources"] = torch.from_numpy(batch.sources)
        if batch.passes is not None:  # ... with a stream source: each sample's pass
            item["passes"] = torch.from_numpy(batch.passes)
        return item


class _Proof:
    """DataLoader worker 0 (share 0 of the rank): publishes until when its loader's lease is
    proven, or that it was lost (bw_loader_lease_state), into the shared state for the main
    process -- once now, then every PROOF_EVERY seconds from a thread, and at stop (before
    the loader closes) LOST or RELEASED, so that the main process neither hands out an
    unproven item nor waits on an iteration whose loader is closed."""

    def __init__(self, shared: _shared.SharedState, key: _shared.Key, loader: Loader) -> None:
        self._shared, self._key, self._h = shared, key, loader._handle
        self._stopping = threading.Event()
        self._publish(final=False)
        self._thread = threading.Thread(target=self._loop, name="batchwire-lease-proof",
                                        daemon=True)
        self._thread.start()

    def _publish(self, final: bool) -> None:
        until, lost = _lib.ffi.new("uint64_t *"), _lib.ffi.new("int *")
        rc = _lib.lib().bw_loader_lease_state(self._h, until, lost)
        if rc != BW_OK:  # a loader without a lease to confirm: share 0 always has one
            return
        if lost[0]:
            self._shared.prove(self._key, 0, _shared.LOST)
        elif final:
            self._shared.prove(self._key, int(until[0]), _shared.RELEASED)
        else:
            self._shared.prove(self._key, int(until[0]), _shared.PROVEN)

    def _loop(self) -> None:
        while not self._stopping.wait(_shared.PROOF_EVERY):
            self._publish(final=False)

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()
        self._publish(final=True)


class _Fence:
    """The main process's check before DataLoader.__iter__ hands out an item read by its
    workers: worker 0's lease, as worker 0 published it for this iteration, must be proven
    now (docs/client.md, "Fencing")."""

    def __init__(self, dataset: BatchDataset, consumed: int, iterator: Any) -> None:
        self._ds, self._consumed = dataset, consumed
        base = getattr(iterator, "_base_seed", None)  # the workers' key (_shared's docstring)
        self._base = base & _MASK64 if isinstance(base, int) else None
        kw = dataset.loader_kw
        # As the C loader: bounded by retry (at least one call's timeout, so that a heartbeat
        # under way can answer).
        self._bound = max(float(kw.get("retry", 60.0)), float(kw.get("timeout", 10.0)))

    def check(self) -> None:
        """Returns when the item may be handed out; raises LeaseLostError once the lease is
        lost, UnavailableError when it stays unproven for the bound."""
        t0: Optional[float] = None
        while True:
            until, state, pid = self._ds._shared.proof(self._consumed, self._base)
            now = time.monotonic()
            if state == _shared.LOST:
                raise errors.LeaseLostError(self._where() + (
                    "the lease was lost: the coordinator refused it to DataLoader worker 0, "
                    "which holds it for this process (another process holds the rank now); "
                    "the items the workers had read ahead are not handed out"))
            if state == _shared.RELEASED or (state == _shared.PROVEN and now * 1000 < until):
                return
            if t0 is None:
                t0 = now
            if state == _shared.PROVEN and not _shared.alive(pid):
                raise errors.UnavailableError(self._where() + (
                    "DataLoader worker 0 (pid %d), which holds the rank's lease, exited: "
                    "nothing it read ahead is handed out unproven" % pid))
            if now - t0 >= self._bound:
                raise errors.UnavailableError(self._where() + (
                    "the coordinator has not vouched for the lease DataLoader worker 0 holds "
                    "%s (this process was paused, or the coordinator cannot be reached), and "
                    "it was not confirmed within %.0f s; nothing is handed out until it is "
                    "confirmed" % (
                        "for %.0f ms" % (now * 1000 - until) if state == _shared.PROVEN
                        else "since this iteration began", self._bound)))
            time.sleep(0.02)  # (a KeyboardInterrupt ends it)

    def _where(self) -> str:
        try:
            rank = "%d" % self._ds.rank_and_world()[0]
        except errors.Error:
            rank = "?"
        return "rank %s of job %s: " % (rank, self._ds.loader_kw.get("job"))


def _as_is(item: Any) -> Any:
    """A DataLoader's collate_fn that leaves a ready item as it is (module level: DataLoader
    workers unpickle it)."""
    return item


class DataLoader(torch.utils.data.DataLoader):
    """torch.utils.data.DataLoader over a BatchDataset, with a state:

    * each iteration runs one epoch as the dataset's does (the epoch set_epoch or
      load_state_dict named, else the next one), so ``for epoch in range(E): for batch in
      loader: ...`` walks the epochs;
    * ``state_dict()`` is the position after the last batch this loader yielded (torchdata
      StatefulDataLoader style: a plain dict for torch.save and Accelerate's
      register_for_checkpointing); ``load_state_dict()`` makes the next iteration continue
      after it;
    * with workers, each item is handed out only while worker 0's lease is proven: after a
      pause past the lease it waits until worker 0 confirms it, and raises LeaseLostError
      once the rank was taken over (none of the items read ahead; docs/client.md, "Fencing").

    Batch mode defaults to ``batch_size=None`` (the dataset's items are batches already).
    Every other argument is torch's: num_workers, pin_memory, prefetch_factor,
    persistent_workers, multiprocessing_context, worker_init_fn, ...
    """

    def __init__(self, dataset: BatchDataset, **kwargs: Any) -> None:
        if not isinstance(dataset, BatchDataset):
            raise errors.InvalidArgumentError("batchwire.torch.DataLoader takes a BatchDataset")
        if not dataset.samples:
            kwargs.setdefault("batch_size", None)
            if dataset.arrays == "tuple" and kwargs["batch_size"] is None:
                # torch's default (default_convert) would make each (x, y) tuple a list
                kwargs.setdefault("collate_fn", _as_is)
        super().__init__(dataset, **kwargs)
        # (epoch, next step) while iterating or after
        self._position: Optional[Tuple[int, int]] = None

    def __iter__(self) -> Iterator[Any]:
        # The iteration's start made explicit, so that its items are counted from it.
        ds: BatchDataset = self.dataset
        epoch, step = ds._shared.next_start(arm=True)
        consumed = ds._shared.generation()  # what this iteration's worker 0 consumes
        self._position = (epoch, step)
        it = super().__iter__()
        # With workers, each item is handed out only while worker 0's lease is proven (the
        # loader in this process fences itself).
        fence = _Fence(ds, consumed, it) if self.num_workers > 0 else None
        for item in it:
            if fence is not None:
                fence.check()
            step += 1
            self._position = (epoch, step)
            yield item
        self._position = (epoch + 1, 0)

    def state_dict(self) -> Dict[str, Any]:
        ds: BatchDataset = self.dataset
        epoch, step = self._position or ds.start()
        return ds.state_dict_at(epoch, step)

    def load_state_dict(self, sd: Dict[str, Any]) -> None:
        ds: BatchDataset = self.dataset
        ds.load_state_dict(sd)
        self._position = None
