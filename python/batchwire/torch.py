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
0 holds the rank's lease; the others read without claiming it (bw_loader_options.share_*),
so wrapping the rank in a DataLoader is not refused as a second claim (AlreadyExistsError).
The main process opens nothing: the workers it forks start with no library state.

Items (batch mode): ``{"data", "indices", "padding", "epoch", "step"}`` -- data is the
batch's tensor for .npy datasets (no transform), else ``collate_fn`` of the transformed
samples; indices an int64 tensor, padding a bool tensor (True for padding duplicates). Use
``DataLoader(ds, batch_size=None)`` (the default of batchwire.torch.DataLoader): the batches
are already made. With ``samples=True`` the dataset yields samples instead, and the
DataLoader batches them (``batch_size`` equal to the job's per-rank batch size keeps the
plan's batches); padding duplicates are included, as DistributedSampler's are.

``transform`` is called on every sample (a row tensor for .npy datasets, the sample's bytes
otherwise), in ``decode_threads`` threads when given (order kept), inside the DataLoader's
worker processes when it has them. The epoch is the one ``set_epoch`` names (0 by default),
like DistributedSampler; batchwire.torch.DataLoader calls set_epoch for you and adds
``state_dict()``/``load_state_dict()`` (python/README.md, "batchwire.torch").
"""

import concurrent.futures
import os
from typing import Any, Callable, Dict, Iterator, Optional

import torch
import torch.utils.data

from . import errors
from . import state as _state
from .loader import Loader

_MANAGED = ("resume", "start", "share", "elastic")


def _env_int(names):
    for n in names:
        v = os.environ.get(n)
        if v is not None and v.strip().isdigit():
            return int(v)
    return None


class BatchDataset(torch.utils.data.IterableDataset):
    """One rank's batches (or samples) of one epoch, for torch.utils.data.DataLoader.

    Keyword arguments are Loader's (coordinator, job, dataset, batch_size, mode, shuffle,
    seed, rank, world_size, drop_last, ..., prefetch, timeout, tls_*), except resume, start,
    share and elastic, which the dataset manages, plus:

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
    """

    def __init__(self, samples: bool = False, transform: Optional[Callable] = None,
                 collate_fn: Optional[Callable] = None, decode_threads: int = 0,
                 keys=None, arrays: Optional[str] = None, **loader_kw):
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
                                             os.environ.get("BATCHWIRE_COORDINATOR")):
                raise errors.InvalidArgumentError("BatchDataset: %s is required" % k)
        self.samples = bool(samples)
        self.transform = transform
        self.collate_fn = collate_fn
        self.decode_threads = int(decode_threads)
        self.keys = keys
        self.loader_kw = loader_kw
        self.epoch = 0
        self._resume = None  # a state_dict to start from (its epoch), or None

    # ---- epochs and state (main process)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs (from its start, unless a loaded state is of
        that epoch), as DistributedSampler.set_epoch."""
        self.epoch = int(epoch)

    def rank_and_world(self):
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

    def start(self):
        """(epoch, step) where the next iteration starts."""
        sd = self._resume
        if sd is not None and sd["epoch"] == self.epoch:
            return sd["epoch"], sd["step"]
        return self.epoch, 0

    def state_dict_at(self, epoch: int, step: int) -> Dict[str, Any]:
        rank, world = self.rank_and_world()
        return _state.rank_state(self.loader_kw["job"], rank, world, epoch, step)

    def load_state_dict(self, sd: Dict[str, Any]) -> None:
        """Starts the next iteration after the batch a state describes (its epoch becomes
        the current one). A state of another rank, job or world size is refused."""
        sd = _state.check_state(sd, "load_state_dict")
        rank, world = self.rank_and_world()
        if (sd["job"], sd["rank"], sd["world_size"]) != (self.loader_kw["job"], rank, world):
            raise errors.MismatchError(
                "load_state_dict: the state is job %r rank %d of %d, this dataset job %r rank "
                "%d of %d (another world size resumes with Loader(elastic=True))" % (
                    sd["job"], sd["rank"], sd["world_size"], self.loader_kw["job"], rank,
                    world))
        self._resume = dict(sd)
        self.epoch = sd["epoch"]

    # ---- iteration (a DataLoader worker, or the main process without workers)

    def _open(self) -> Loader:
        info = torch.utils.data.get_worker_info()
        kw = dict(self.loader_kw)
        if info is not None and info.num_workers > 1:
            kw["share"] = (info.id, info.num_workers)
        sd = self._resume
        if sd is not None and sd["epoch"] == self.epoch and "cursor" in sd:
            kw["resume"] = sd["cursor"]
        else:
            kw["start"] = self.start()
        return Loader(**kw)

    def _sample_values(self, batch):
        if batch.arrays:  # named arrays: each sample's rows, as a tuple or a dict
            t = batch.fields(as_torch=True)
            if self.arrays == "dict":
                return [{k: v[i] for k, v in t.items()} for i in range(batch.count)]
            return [tuple(v[i] for v in t.values()) for i in range(batch.count)]
        if batch.shape is not None:
            return list(batch.torch())  # rows of the held batch tensor
        if self.keys is not None:
            return batch.fields(None if self.keys is True else self.keys)
        return batch.samples()

    def _decode(self, values, pool):
        if self.transform is None:
            return values
        if pool is not None:
            return list(pool.map(self.transform, values))
        return [self.transform(v) for v in values]

    def _item(self, batch, pool) -> Any:
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
        return {"data": data, "indices": torch.from_numpy(batch.indices),
                "padding": torch.from_numpy(batch.padding), "epoch": batch.epoch,
                "step": batch.step}

    def __iter__(self) -> Iterator[Any]:
        pool = (concurrent.futures.ThreadPoolExecutor(self.decode_threads)
                if self.decode_threads > 0 and self.transform is not None else None)
        try:
            with self._open() as lo:
                for batch in lo:
                    if self.samples:
                        yield from self._decode(self._sample_values(batch), pool)
                    else:
                        yield self._item(batch, pool)
        finally:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)


def _as_is(item):
    """A DataLoader's collate_fn that leaves a ready item as it is (module level: DataLoader
    workers unpickle it)."""
    return item


class DataLoader(torch.utils.data.DataLoader):
    """torch.utils.data.DataLoader over a BatchDataset, with the epoch handled and a state:

    * each iteration runs the dataset's current epoch and then moves it to the next one
      (set_epoch), so ``for epoch in range(E): for batch in loader: ...`` walks the epochs;
    * ``state_dict()`` is the position after the last batch this loader yielded (torchdata
      StatefulDataLoader style: a plain dict for torch.save and Accelerate's
      register_for_checkpointing); ``load_state_dict()`` makes the next iteration continue
      after it.

    Batch mode defaults to ``batch_size=None`` (the dataset's items are batches already).
    Every other argument is torch's: num_workers, pin_memory, prefetch_factor,
    persistent_workers=False (the default; workers read one epoch each), ...
    """

    def __init__(self, dataset: BatchDataset, **kwargs):
        if not isinstance(dataset, BatchDataset):
            raise errors.InvalidArgumentError("batchwire.torch.DataLoader takes a BatchDataset")
        if not dataset.samples:
            kwargs.setdefault("batch_size", None)
            if dataset.arrays == "tuple" and kwargs["batch_size"] is None:
                # torch's default (default_convert) would make each (x, y) tuple a list
                kwargs.setdefault("collate_fn", _as_is)
        super().__init__(dataset, **kwargs)
        self._position = None  # (epoch, next step) while iterating or after

    def __iter__(self):
        ds = self.dataset
        epoch, step = ds.start()
        self._position = (epoch, step)
        for item in super().__iter__():
            step += 1
            self._position = (epoch, step)
            yield item
        ds.set_epoch(epoch + 1)
        self._position = (epoch + 1, 0)

    def state_dict(self) -> Dict[str, Any]:
        epoch, step = self._position or self.dataset.start()
        return self.dataset.state_dict_at(epoch, step)

    def load_state_dict(self, sd: Dict[str, Any]) -> None:
        self.dataset.load_state_dict(sd)
        self._position = None
