"""The Loader and its batches: libbatchwire's bw_loader through cffi (_lib.py)."""

import inspect
import json
import operator
import os
import threading
import types
import weakref
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Mapping, NoReturn,
                    Optional, Sequence, Tuple, Union)

from . import _lib
from . import _runtime
from . import errors
from . import state as _state
from ._cdefs import BW_END_OF_EPOCH, BW_FAILED_PRECONDITION, BW_OK, BW_TOO_BIG
from ._lib import CData, ffi

if TYPE_CHECKING:
    import numpy as np

_open = {"pid": 0, "count": 0}  # loaders open in this process (inherited by forked children)
_open_lock = threading.Lock()
_CURSOR_TEXT_MAX = 1 << 16

# What a device may be given as: None/"cpu", "cuda", "cuda:N", N or a torch.device.
Device = Union[None, int, str, Any]
# A dataset: "FORMAT:PATH[,PATH...]", or named arrays {"x": "npy:...", "y": "npy:..."}.
Dataset = Union[str, Dict[str, Union[str, bytes]]]
# An array of a batch of named arrays: (name, dtype, shape, offset, nbytes).
ArraySpec = Tuple[str, "np.dtype[Any]", Tuple[int, ...], int, int]
# A file path option (TLS files, the token file).
PathArg = Union[str, bytes, "os.PathLike[str]"]


def _address(p: CData) -> int:
    return int(ffi.cast("uintptr_t", p))


def _keeping(addr: int, nbytes: int, owner: object) -> CData:
    """A byte buffer over nbytes at addr that keeps `owner` (what keeps the bytes: a hold, or
    the loader) alive for as long as the buffer or a view of it (numpy's .base,
    memoryview.obj) lives: the pointer's destructor references it."""
    if not nbytes:
        return ffi.buffer(ffi.new("uint8_t[]", 0))
    p = ffi.gc(ffi.cast("uint8_t *", addr), lambda _p, _owner=owner: None)
    return ffi.buffer(p, nbytes)


def _parse_device(device: Device) -> int:
    """None/"cpu" -> -1; "cuda", "cuda:N", N, torch.device("cuda", N) -> N."""
    if device is None:
        return -1
    if isinstance(device, bool):
        raise errors.InvalidArgumentError("device: expected None, 'cpu', 'cuda:N' or N, got %r"
                                          % (device,), code="BW_INVALID_ARGUMENT")
    if isinstance(device, int):
        if device < 0:
            raise errors.InvalidArgumentError("device: %d is not a device number" % device)
        return device
    text = str(device)  # also torch.device
    if text == "cpu":
        return -1
    if text == "cuda":
        return 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    raise errors.InvalidArgumentError("device: expected None, 'cpu', 'cuda' or 'cuda:N', got %r"
                                      % (device,))


class Batch:
    """One batch of this rank, handed out by its Loader.

    Plain attributes (copies, valid forever): ``epoch``, ``step``, ``count`` (samples, padding
    included), ``real`` (samples that are not padding), ``indices`` (numpy int64 array of the
    sample indices), ``padding`` (numpy bool array, True for padding duplicates), ``nbytes``,
    ``dtype`` (numpy dtype for .npy datasets, else None), ``shape`` (tuple for .npy datasets,
    else None), ``device`` (-1: host memory; N: the loader delivered it to cuda:N).

    A batch keeps its bytes for as long as it (or a view of it) is referenced: it holds them
    from the moment it is handed out (bw_loader_hold), so the loader never overwrites them --
    it continues with another buffer when it needs the slot. So every batch a program keeps
    (``list(loader)``, a list for metrics) stays valid: ``numpy()``, ``torch()`` and
    ``memoryview()`` are zero-copy views of the held bytes, ``samples()`` and ``fields()``
    copies from them. A loader opened with ``reuse_buffers=True`` takes no hold: its batches
    and their views are valid only until the next batch, and asking a batch for data after
    the loader moved on raises FailedPreconditionError.
    """

    __slots__ = ("_loader", "_ptr", "_gen", "_hold", "_spans", "_fieldtab", "_idx_raw",
                 "_pad_raw", "_src_raw", "_pass_raw", "_indices", "_padding", "_sources",
                 "_passes", "epoch", "step",
                 "count", "real", "nbytes", "dtype", "shape", "device", "arrays", "_bf16",
                 "__weakref__")

    def __init__(self, loader: "Loader", ptr: CData, gen: int) -> None:
        # Called once a batch: no numpy and no loop over the samples here. indices and padding
        # are copied out of the slot as bytes (valid forever, as the slot is reused) and become
        # numpy arrays when first asked for; dtypes come from a table (_dtype).
        L = _lib.lib()
        self._loader = loader
        self._ptr = ptr
        self._gen = gen
        self._hold: Optional[_Hold] = None
        self._spans: Optional[List[Tuple[int, int]]] = None  # each sample's (offset, size)
        # each sample's [(name, offset, size)], or the error
        self._fieldtab: Union[None, List[List[Tuple[str, int, int]]], errors.Error] = None
        self.epoch = int(L.bw_batch_epoch(ptr))
        self.step = int(L.bw_batch_step(ptr))
        self.count = n = int(L.bw_batch_count(ptr))
        self.real = int(L.bw_batch_real(ptr))
        self.nbytes = int(L.bw_batch_nbytes(ptr))
        self.device = int(L.bw_batch_device(ptr))
        self._idx_raw = ffi.buffer(L.bw_batch_indices(ptr), 8 * n)[:] if n else b""
        self._pad_raw = ffi.buffer(L.bw_batch_padding(ptr), n)[:] if n else b""
        src = L.bw_batch_sources(ptr)
        self._src_raw = ffi.buffer(src, 4 * n)[:] if n and src != ffi.NULL else None
        passes = L.bw_batch_passes(ptr)
        self._pass_raw = ffi.buffer(passes, 8 * n)[:] if n and passes != ffi.NULL else None
        self._passes: "Optional[np.ndarray[Any, Any]]" = None
        self._indices: "Optional[np.ndarray[Any, Any]]" = None
        self._padding: "Optional[np.ndarray[Any, Any]]" = None
        self._sources: "Optional[np.ndarray[Any, Any]]" = None
        ndim = int(L.bw_batch_ndim(ptr))
        self.shape: Optional[Tuple[int, ...]]
        self.dtype: "Optional[np.dtype[Any]]"
        if ndim:
            self.shape = shape = tuple(ffi.unpack(L.bw_batch_shape(ptr), ndim))
            text = ffi.string(L.bw_batch_dtype(ptr))
            self.dtype = dtype = _dtype(text)
            self._bf16 = text == BFLOAT16
            want = dtype.itemsize
            for d in shape:
                want *= d
            if want != self.nbytes:
                raise errors.ProtocolError(
                    "batch of step %d: shape %r of %s needs %d bytes, the batch has %d" %
                    (self.step, shape, dtype.str, want, self.nbytes))
        else:
            self.shape = None
            self.dtype = None
            self._bf16 = False
        # Named arrays: [(name, dtype, shape, offset, nbytes)] of each field, else None.
        self.arrays = _batch_arrays(L, ptr, self.step, self.nbytes)
        if not loader._reuse_buffers:
            self._hold = _Hold(loader, self)

    @property
    def indices(self) -> "np.ndarray[Any, Any]":
        """The sample indices, a numpy int64 array (a copy, valid forever)."""
        if self._indices is None:
            import numpy as np

            self._indices = np.frombuffer(self._idx_raw, dtype=np.uint64).astype(np.int64)
        return self._indices

    @indices.setter
    def indices(self, value: "np.ndarray[Any, Any]") -> None:
        self._indices = value

    @property
    def padding(self) -> "np.ndarray[Any, Any]":
        """A numpy bool array, True for the padding duplicates (a copy, valid forever)."""
        if self._padding is None:
            import numpy as np

            self._padding = np.frombuffer(self._pad_raw, dtype=np.uint8).astype(bool)
        return self._padding

    @padding.setter
    def padding(self, value: "np.ndarray[Any, Any]") -> None:
        self._padding = value

    @property
    def sources(self) -> "Optional[np.ndarray[Any, Any]]":
        """A mixture job's batch: each sample's source (its entry in Loader's `mixture`), a
        numpy int64 array (a copy, valid forever); ``indices`` are then within that source.
        None for other jobs."""
        if self._sources is None and self._src_raw is not None:
            import numpy as np

            self._sources = np.frombuffer(self._src_raw, dtype=np.uint32).astype(np.int64)
        return self._sources

    @property
    def passes(self) -> "Optional[np.ndarray[Any, Any]]":
        """A mixture job with stream sources: each sample's pass over its source's stream
        (``batchwire plan``'s "passes"), a numpy int64 array (a copy). None for other jobs."""
        if self._passes is None and self._pass_raw is not None:
            import numpy as np

            self._passes = np.frombuffer(self._pass_raw, dtype=np.uint64).astype(np.int64)
        return self._passes

    def __repr__(self) -> str:
        extra = "" if self.shape is None else " shape=%r dtype=%s" % (self.shape, self.dtype)
        if self.arrays:  # named arrays: each field's dtype and shape
            extra = " fields=" + ",".join("%s:%s%r" % (n, d.str, list(sh))
                                          for n, d, sh, _o, _b in self.arrays)
        return ("<batchwire.Batch epoch=%d step=%d count=%d real=%d%s>" %
                (self.epoch, self.step, self.count, self.real, extra))

    def __len__(self) -> int:
        return self.count

    @property
    def valid(self) -> bool:
        """Whether the batch's data can still be read: always for a held batch (the default);
        with reuse_buffers, until the loader moves on."""
        if self._hold is not None:
            return True
        lo = self._loader
        return lo._handle is not None and lo._gen == self._gen

    def _check(self) -> None:
        if not self.valid:
            raise errors.FailedPreconditionError(
                "batch of epoch %d step %d was released when the loader moved on (next "
                "batch, next_epoch or close): a loader opened with reuse_buffers=True keeps a "
                "batch's data only until its next batch; take what you need before it, or "
                "open the loader without reuse_buffers" % (self.epoch, self.step))

    def _current(self) -> bool:
        """Whether this is still the loader's current batch (its slot may be asked about)."""
        lo = self._loader
        return lo._handle is not None and lo._gen == self._gen

    def _base(self) -> int:
        """The address of the batch's host bytes: its hold's, or (reuse_buffers) the slot's
        while the batch is current."""
        if self._hold is not None:
            return self._hold.address
        self._check()
        return _address(_lib.lib().bw_batch_host_data(self._ptr))

    def _host_buffer(self) -> CData:
        """A byte buffer over the batch's host bytes. Views made from it reference it (numpy's
        .base, memoryview.obj), and it references what keeps the bytes: the batch's hold, or
        with reuse_buffers the loader, which then outlives the views."""
        owner = self._hold if self._hold is not None else self._loader
        return _keeping(self._base(), self.nbytes, owner)

    def _bytes_at(self, addr: int, n: int) -> bytes:
        """A copy of n bytes at addr."""
        return bytes(ffi.buffer(ffi.cast("const uint8_t *", addr), n)) if n else b""

    def _sample_spans(self) -> List[Tuple[int, int]]:
        """[(offset, size)] of every sample in the host bytes. .npy rows are equal slices;
        other formats ask the slot, which is possible only while the batch is current: the
        loader snapshots a batch's spans before it moves on (_snapshot)."""
        if self._spans is None:
            if self.shape is not None:
                row = self.nbytes // self.count if self.count else 0
                self._spans = [(i * row, row) for i in range(self.count)]
            else:
                self._check()
                L = _lib.lib()
                base = _address(L.bw_batch_host_data(self._ptr))
                p = ffi.new("const void **")
                n = ffi.new("size_t *")
                spans = []
                for i in range(self.count):
                    rc = L.bw_batch_sample(self._ptr, i, p, n)
                    if rc != BW_OK:
                        raise _lib.error(rc, "sample %d of the batch of step %d" %
                                         (i, self.step))
                    spans.append((_address(p[0]) - base if n[0] else 0, int(n[0])))
                self._spans = spans
        return self._spans

    def _field_table(self) -> Union[List[List[Tuple[str, int, int]]], errors.Error]:
        """Every sample's [(name, offset in the sample, size)] (bw_batch_fields), taken while
        the batch is current and kept; an error is kept and raised by fields()."""
        if self._fieldtab is None:
            self._check()
            L = _lib.lib()
            f = ffi.new("const bw_field **")
            n = ffi.new("size_t *")
            table = []
            for i in range(self.count):
                rc = L.bw_batch_fields(self._ptr, i, f, n)
                if rc != BW_OK:
                    if rc == BW_FAILED_PRECONDITION:
                        self._fieldtab = errors.FailedPreconditionError(
                            "fields(): the loader was opened with fields=False (or the "
                            "dataset's format has no fields)")
                    else:
                        self._fieldtab = _lib.error(rc, "fields of sample %d of the batch of "
                                                        "step %d" % (i, self.step))
                    return self._fieldtab
                table.append([(_lib.text(f[0][j].name), int(f[0][j].offset),
                               int(f[0][j].size)) for j in range(n[0])])
            self._fieldtab = table
        return self._fieldtab

    def _snapshot(self) -> None:
        """Called by the loader before it moves on from this batch: what samples() and
        fields() need from the slot, kept with the held bytes."""
        if self._hold is None:
            return
        if self.shape is None and not self.arrays:
            self._sample_spans()
        if self._loader._fields:
            self._field_table()

    def memoryview(self) -> memoryview:
        """The batch's bytes (host memory) as a read-only memoryview, in batch order."""
        return memoryview(self._host_buffer()).cast("B").toreadonly()

    def numpy(self) -> Any:
        """.npy datasets: a numpy array [count, ...] with the dataset's dtype, viewing the
        batch's held bytes (with reuse_buffers valid only until the next batch). Other formats:
        the list of samples' bytes (copies)."""
        import numpy as np

        if self.arrays:
            return self.fields()
        if self.shape is None:
            return self.samples()
        arr = np.frombuffer(self._host_buffer(), dtype=self.dtype)
        return arr.reshape(self.shape)

    def fields(self, keys: Optional[Sequence[str]] = None, as_torch: bool = False) -> Any:
        """Each sample as a dict of its fields (a loader with fields, the default for tar and
        jsonl datasets): tar (WebDataset) members by extension ({"jpg": b"...", "cls":
        b"3"}), bytes; JSON Lines top-level keys, decoded values. The member or key a
        transform_field transforms: its result as a numpy array of the transform's dtype and
        shape (np.stack over the samples gives the [count, ...] tensor). `keys` keeps only those
        (only they are copied or decoded); a sample without one of them raises
        NotFoundError.

        Datasets of named arrays (Loader(dataset={"x": ..., "y": ...}), npz): one dict for the
        whole batch, {"x": array [count, ...], "y": array [count, ...]} in the dataset's
        field order -- numpy arrays, or torch tensors with as_torch=True -- viewing the
        batch's held bytes like numpy() and torch(). `keys` keeps only those fields, in that
        order."""
        if self.arrays:
            return self._array_fields(keys, as_torch)
        table = self._field_table()
        if isinstance(table, Exception):
            raise table
        base = self._base()
        want = None if keys is None else list(keys)
        jsonl = self._loader._format == "jsonl"
        tfield = getattr(self._loader, "_tfield", None)  # the transformed member or key
        layout = getattr(self._loader, "_tf_layout", None)  # its result's (dtype, shape)
        out = []
        for i, ((soff, _), fl) in enumerate(zip(self._sample_spans(), table)):
            spans = {name: (off, sz) for name, off, sz in fl}
            names = list(spans) if want is None else want
            d: Dict[str, Any] = {}
            for k in names:
                if k not in spans:
                    raise errors.NotFoundError(
                        "sample %d (index %d) has no field %r; it has %s" %
                        (i, int(self.indices[i]), k, sorted(spans)))
                off, sz = spans[k]
                raw = self._bytes_at(base + soff + off, sz)
                if k == tfield and layout is not None:
                    d[k] = _result_array(raw, layout)
                else:
                    d[k] = json.loads(raw) if jsonl else raw
            out.append(d)
        return out

    def _array_fields(self, keys: Optional[Sequence[str]], as_torch: bool) -> Dict[str, Any]:
        import numpy as np

        assert self.arrays is not None
        names = [a[0] for a in self.arrays]
        want = names if keys is None else list(keys)
        for k in want:
            if k not in names:
                raise errors.NotFoundError("the dataset has no field %r; it has %s" % (k, names))
        if as_torch and self.device >= 0 and self._current():
            return {k: self._device_array(names.index(k)) for k in want}
        buf = self._host_buffer()
        out: Dict[str, Any] = {}
        for name, dtype, shape, offset, nbytes in self.arrays:
            if name not in want:
                continue
            arr = np.frombuffer(buf, dtype=dtype, count=nbytes // dtype.itemsize,
                                offset=offset).reshape(shape)
            if as_torch:
                import torch

                t = torch.from_numpy(self._native(arr))
                if self.device >= 0:  # the slot's device buffer was reused: from the host
                    t = t.to("cuda:%d" % self.device)
                out[name] = t
            else:
                out[name] = arr
        return {k: out[k] for k in want}

    def _device_array(self, k: int) -> Any:
        """Field k of the current batch on its GPU, as a tensor there (a copy unless
        reuse_buffers)."""
        import torch

        assert self.arrays is not None
        name, dtype, shape, offset, nbytes = self.arrays[k]
        ptr = _address(_lib.lib().bw_batch_data(self._ptr)) + offset

        class _Dev:
            __cuda_array_interface__ = {"shape": shape, "typestr": dtype.str,
                                        "data": (ptr, False), "version": 2, "strides": None}

        t = torch.as_tensor(_Dev(), device="cuda:%d" % self.device)
        return t if self._loader._reuse_buffers else t.clone()

    def samples(self) -> List[bytes]:
        """Every sample's bytes (copies), in batch order."""
        spans = self._sample_spans()
        base = self._base()
        return [self._bytes_at(base + off, n) for off, n in spans]

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        """For batches the loader delivered to a GPU (device >= 0): the slot's device buffer,
        for torch.as_tensor, CuPy or Numba. Valid until the next batch (the hold keeps the
        host bytes, not the device buffer: torch() copies it unless the loader reuses
        buffers)."""
        if not self._current():
            raise errors.FailedPreconditionError(
                "batch of epoch %d step %d: its device buffer was reused when the loader "
                "moved on (the host bytes stay: batch.numpy())" % (self.epoch, self.step))
        if self.device < 0 or self.shape is None or self.dtype is None:
            raise AttributeError("__cuda_array_interface__: the batch is not a tensor on a GPU")
        ptr = _address(_lib.lib().bw_batch_data(self._ptr))
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (ptr, False),
                "version": 2, "strides": None}

    def torch(self) -> Any:
        """.npy datasets: a torch.Tensor [count, ...]. On the CPU (loader without device) it
        shares the batch's held bytes through torch.from_numpy (see the class docstring).
        With the loader's device set, a tensor on that GPU: a copy of the slot's device
        buffer while the batch is current (later: of the held host bytes), or with
        reuse_buffers a view of it (valid until the next batch). Other formats: a list of
        uint8 tensors (copies)."""
        import torch

        if self.arrays:
            return self.fields(as_torch=True)
        if self.shape is None:
            return [torch.frombuffer(bytearray(s), dtype=torch.uint8) if s else
                    torch.zeros(0, dtype=torch.uint8) for s in self.samples()]
        if self.device >= 0:
            if not torch.cuda.is_available():
                raise errors.NoDeviceError(
                    "the batch is on cuda:%d but this PyTorch (%s) cannot use CUDA; use "
                    "batch.numpy() for the host copy" % (self.device, torch.__version__))
            dev = "cuda:%d" % self.device
            if not self._current():
                return self._bf16_view(torch.from_numpy(self._native(self.numpy()))).to(dev)
            t = self._bf16_view(torch.as_tensor(self, device=dev))
            # The device buffer is the slot's own: a copy on the GPU unless reuse_buffers.
            return t if self._loader._reuse_buffers else t.clone()
        return self._bf16_view(torch.from_numpy(self._native(self.numpy())))

    def _bf16_view(self, t: Any) -> Any:
        """A bfloat16 batch's int16 bits as torch.bfloat16 (the same bytes)."""
        if not self._bf16:
            return t
        import torch

        return t.view(torch.bfloat16)

    @staticmethod
    def _native(arr: Any) -> Any:
        if not arr.dtype.isnative:
            # torch needs native byte order: this is a converted copy, not a view.
            arr = arr.astype(arr.dtype.newbyteorder("="))
        return arr


# numpy dtypes by the library's dtype text (b"<f4"): a batch's dtype is one lookup.
_DTYPES: Dict[bytes, "np.dtype[Any]"] = {}
BFLOAT16 = b"bfloat16"


def _result_array(raw: bytes, layout: Tuple[bytes, Tuple[int, ...]]) -> Any:
    """A transform's result for one sample (bw_loader_transform_layout's dtype and shape) as a
    numpy array over its own copy of the bytes (writable; bfloat16 as its int16 bits)."""
    import numpy as np

    return np.frombuffer(bytearray(raw), dtype=_dtype(layout[0])).reshape(layout[1])


def _dtype(text: bytes) -> "np.dtype[Any]":
    """The numpy dtype of a batch's or array's dtype text (bw_batch_dtype, bw_array)."""
    dt = _DTYPES.get(text)
    if dt is None:
        import numpy as np

        # A transform's bfloat16 (docs/transforms.md): numpy has no such type, so the array
        # holds its bits as int16 (what torch.from_numpy takes); Batch.torch() views them as
        # torch.bfloat16.
        dt = np.dtype("<i2" if text == BFLOAT16 else text.decode("utf-8", "replace"))
        if len(_DTYPES) < 256:  # a handful in practice; never unbounded
            _DTYPES[text] = dt
    return dt


def _batch_arrays(L: CData, ptr: CData, step: int, nbytes: int) -> Optional[List[ArraySpec]]:
    """Datasets of named arrays: [(name, numpy dtype, shape, offset, nbytes)] of a batch
    (bw_batch_array), checked against its bytes; None for other datasets."""
    n = int(L.bw_batch_narrays(ptr))
    if not n:
        return None
    out: List[ArraySpec] = []
    a = ffi.new("bw_array *")
    for k in range(n):
        rc = L.bw_batch_array(ptr, k, a)
        if rc != BW_OK:
            raise _lib.error(rc, "array %d of the batch of step %d" % (k, step))
        dtype = _dtype(ffi.string(a.dtype))
        name = _lib.text(a.name)
        shape = tuple(ffi.unpack(a.shape, a.ndim)) if a.ndim else ()
        want = dtype.itemsize
        for d in shape:
            want *= d
        if want != a.nbytes or a.offset + a.nbytes > nbytes:
            raise errors.ProtocolError(
                "batch of step %d: field %s, shape %r of %s, needs %d bytes at %d; the batch "
                "has %d" % (step, name, shape, dtype.str, want, a.offset, nbytes))
        out.append((name, dtype, shape, int(a.offset), int(a.nbytes)))
    return out


def check_fork_safe(what: str) -> None:
    """Raises FailedPreconditionError when this process was forked while its parent had
    loaders open: the library's network runtime (gRPC) was running then, and a forked child
    cannot use it. A parent with none open (all closed) forks cleanly."""
    if _open["count"] > 0 and _open["pid"] != os.getpid():
        raise errors.FailedPreconditionError(
            "%s: this process was forked (pid %d) while its parent (pid %d) had %d batchwire "
            "Loader(s) open, whose network runtime cannot work in a forked child; close them "
            "before the DataLoader starts its workers, or give the DataLoader "
            "multiprocessing_context='forkserver' (or 'spawn')" % (what, os.getpid(),
                                                                  _open["pid"], _open["count"]))


# Loader's arguments that are not bw_loader_options.
_LOADER_ONLY = ("resume", "elastic", "reuse_buffers")


def _option_defaults() -> Dict[str, Any]:
    """The options and their defaults, from Loader's signature: the one list of them."""
    params = inspect.signature(Loader.__init__).parameters.values()
    return {p.name: p.default for p in params
            if p.kind is p.KEYWORD_ONLY and p.name not in _LOADER_ONLY}


# The options that are whole numbers, and those in seconds (None: unset where allowed).
_INTEGER_OPTIONS = ("rank", "world_size", "batch_size", "seed", "prefetch", "max_buffer_bytes",
                    "job_epochs", "holder_pid")
_NEEDED_OPTIONS = ("batch_size", "seed", "prefetch")  # (None is no integer for these)
_PAIR_OPTIONS = ("start", "share")
_SECONDS_OPTIONS = ("timeout", "retry")


def _integer(name: str, v: Any) -> int:
    """v as an int -- an int or a numpy integer, not a bool, float or string, which int()
    would truncate or parse -- or InvalidArgumentError naming the option."""
    try:
        if isinstance(v, bool):
            raise TypeError
        return operator.index(v)
    except TypeError:
        raise errors.InvalidArgumentError("%s: %r is not an integer" % (name, v)) from None


def _check_numbers(a: types.SimpleNamespace) -> None:
    """Refuses, naming the option, a number option given something else (Loader's signature
    says the types; this is its check at run time)."""
    for name in _INTEGER_OPTIONS:
        if getattr(a, name) is not None or name in _NEEDED_OPTIONS:
            setattr(a, name, _integer(name, getattr(a, name)))
    for name in _PAIR_OPTIONS:
        v = getattr(a, name)
        if v is not None:
            if isinstance(v, (str, bytes)) or not hasattr(v, "__len__") or len(v) != 2:
                raise errors.InvalidArgumentError("%s: %r is not a pair of integers" % (name, v))
            setattr(a, name, (_integer(name, v[0]), _integer(name, v[1])))
    for name in _SECONDS_OPTIONS:
        v = getattr(a, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v == v:
            raise errors.InvalidArgumentError("%s: %r is not a number of seconds" % (name, v))


def _weight_text(w: Any) -> str:
    """A mixture weight as the decimal text the library reads ("0.7", "70"): an int, a float
    (its shortest repr, never an exponent, rounded to 9 decimal places) or a str as given."""
    if isinstance(w, str):
        return w
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not w == w:
        raise errors.InvalidArgumentError("mixture: weight %r is not a positive number" % (w,))
    if isinstance(w, int):
        return str(w)
    from decimal import Decimal
    d = Decimal(repr(w))
    if d.as_tuple().exponent < -9:  # type: ignore[operator]
        d = d.quantize(Decimal("1e-9"))  # the library reads 9 decimal places (1/3 -> 0.333333333)
    return format(d.normalize(), "f")


class _Options:
    """bw_loader_options built from the Loader's keyword arguments (one place for Loader,
    job_checkpoint and rank_steps): `args` names some of them (TypeError for a name Loader
    does not take), the rest keep Loader's defaults. .raw is the struct (cffi, its layout from
    include/batchwire/loader.h); the strings it points into live as long as this object."""

    def __init__(self, args: Mapping[str, Any], need_dataset: bool = True) -> None:
        defaults = _option_defaults()
        unknown = sorted(set(args) - set(defaults))
        if unknown:
            raise TypeError("unexpected keyword argument%s %s: Loader takes %s" % (
                "s" if len(unknown) > 1 else "", ", ".join(map(repr, unknown)),
                ", ".join(sorted(defaults))))
        a = types.SimpleNamespace(**{**defaults, **args})
        _check_numbers(a)
        a.coordinator = a.coordinator or os.environ.get("BATCHWIRE_COORDINATOR")
        need_dataset = need_dataset and not a.mixture
        required = ("coordinator", "job", "dataset") if need_dataset else ("coordinator", "job")
        given = {"coordinator": a.coordinator, "job": a.job, "dataset": a.dataset}
        for name in required:
            if isinstance(given[name], dict) and not given[name]:
                raise errors.InvalidArgumentError(
                    "%s: the dict names no fields; give each field's files, e.g. "
                    "{'x': 'npy:x/*.npy', 'y': 'npy:y/*.npy'}" % name)
            if not given[name]:
                raise errors.InvalidArgumentError("%s: required" % name)
        if isinstance(a.batch_size, bool) or int(a.batch_size) < 1:
            raise errors.InvalidArgumentError("batch_size: %r is not a positive integer" %
                                              (a.batch_size,))
        if int(a.prefetch) < 0:
            raise errors.InvalidArgumentError("prefetch: %r is below 0 (0: auto)" % (a.prefetch,))
        self.device = _parse_device(a.device)
        self.raw = o = _lib.new_options()
        self._keep: List[CData] = []  # the strings the struct points into

        def s(x: Optional[PathArg]) -> CData:
            if x is None:
                return ffi.NULL
            c = ffi.new("char[]", os.fsencode(x))
            self._keep.append(c)
            return c

        o.coordinator = s(a.coordinator)
        o.tls_ca, o.tls_cert, o.tls_key = s(a.tls_ca), s(a.tls_cert), s(a.tls_key)
        o.tls_server_name = s(a.tls_server_name)
        o.token_file = s(a.token_file)
        if a.job_epochs is not None:
            if isinstance(a.job_epochs, bool) or int(a.job_epochs) < 1:
                raise errors.InvalidArgumentError("job_epochs: %r is not a positive integer" %
                                                  (a.job_epochs,))
            o.epochs = int(a.job_epochs)
        o.job = s(a.job)
        if isinstance(a.dataset, dict):
            # Named arrays indexed together (docs/formats.md, "Named arrays").
            specs = []
            for name, spec in a.dataset.items():
                if not isinstance(name, str) or not isinstance(spec, (str, bytes)):
                    raise errors.InvalidArgumentError(
                        "dataset: a dict of named arrays maps names to \"npy:PATH[,PATH...]\" "
                        "(got %r: %r)" % (name, spec))
                spec = spec.decode() if isinstance(spec, bytes) else spec
                specs.append(s("%s=%s" % (name, spec)))
            fields_arr = ffi.new("const char *[]", specs)
            self._keep.append(fields_arr)
            o.dataset_fields = fields_arr
            o.n_dataset_fields = len(specs)
        else:
            o.dataset = s(a.dataset)
        if a.mixture:
            # A weighted mixture (docs/semantics.md, "Mixtures"): "SPEC=WEIGHT" each.
            entries = []
            for item in a.mixture:
                if (isinstance(item, (str, bytes)) or not hasattr(item, "__len__") or
                        len(item) != 2 or not isinstance(item[0], (str, bytes))):
                    raise errors.InvalidArgumentError(
                        "mixture: each source is (\"FORMAT:PATH[,PATH...]\", weight); got %r"
                        % (item,))
                spec = item[0].decode() if isinstance(item[0], bytes) else item[0]
                entries.append(s("%s=%s" % (spec, _weight_text(item[1]))))
            mix_arr = ffi.new("const char *[]", entries)
            self._keep.append(mix_arr)
            o.mixture = mix_arr
            o.n_mixture = len(entries)
        if a.mix_samples is not None:
            if isinstance(a.mix_samples, bool) or int(a.mix_samples) < 1:
                raise errors.InvalidArgumentError("mix_samples: %r is not a positive integer" %
                                                  (a.mix_samples,))
            o.mix_samples = int(a.mix_samples)
        if a.mix_policy is not None:
            o.mix_policy = s(a.mix_policy)
        o.rank = -1 if a.rank is None else int(a.rank)
        o.world_size = -1 if a.world_size is None else int(a.world_size)
        o.mode = s(a.mode)
        o.batch_size = int(a.batch_size)
        o.shuffle = 1 if a.shuffle else 0
        a.seed = int(a.seed)
        o.seed = a.seed - (1 << 64) if a.seed >= 1 << 63 else a.seed
        o.shuffle_algo = s(a.shuffle_algo)
        o.drop_last = 1 if a.drop_last else 0
        o.sampler_drop_last = 1 if a.sampler_drop_last else 0
        o.split_batches = 1 if a.split_batches else 0
        o.even_batches = 1 if a.even_batches else 0
        o.prefetch_batches = int(a.prefetch)
        if a.max_buffer_bytes is not None:
            o.max_buffer_bytes = int(a.max_buffer_bytes)
        o.timeout_ms = max(1, int(round(float(a.timeout) * 1000)))
        o.retry_ms = max(0, int(round(float(a.retry) * 1000)))
        o.device = self.device
        o.transport = s(a.transport)
        if a.compress is not None:
            o.compress = s(a.compress)
        o.allow_uneven = 1 if a.allow_uneven else 0
        o.dispatch_batches = 1 if a.dispatch_batches else 0
        o.pad_single_process = 1 if a.pad_single_process else 0
        if isinstance(a.dataset, dict):
            fmt = "fields"
        elif a.mixture:
            fmt = "mixture"
        else:
            parts = str(a.dataset).split(":", 2)
            fmt = parts[1] if parts[0] == "pre_sharded" and len(parts) > 1 else parts[0]
        if a.transform is not None:
            o.transform = s(a.transform)
        if a.transform_field is not None:
            o.transform_field = s(a.transform_field)
        if a.fields is None:
            a.fields = fmt in ("tar", "jsonl") and not a.transform
        o.fields = 1 if a.fields else 0
        self.format, self.fields = fmt, bool(a.fields)
        if a.start is not None:
            o.start_epoch, o.start_step = int(a.start[0]), int(a.start[1])
        if a.share is not None:
            idx, cnt = int(a.share[0]), int(a.share[1])
            if cnt < 1 or not 0 <= idx < cnt:
                raise errors.InvalidArgumentError("share: (%d, %d) is not (index, count) with "
                                                  "0 <= index < count" % (idx, cnt))
            o.share_index, o.share_count = idx, cnt
        if a.holder_pid is not None:
            if isinstance(a.holder_pid, bool) or not 0 < int(a.holder_pid) < 1 << 32:
                raise errors.InvalidArgumentError("holder_pid: %r is not a process id" %
                                                  (a.holder_pid,))
            o.holder_pid = int(a.holder_pid)
        if a.lease is not None:
            o.lease = s(a.lease)


def job_checkpoint(*, coordinator: Optional[str] = None, job: Optional[str] = None,
                   tls_ca: Optional[PathArg] = None, tls_cert: Optional[PathArg] = None,
                   tls_key: Optional[PathArg] = None, tls_server_name: Optional[str] = None,
                   token_file: Optional[PathArg] = None, timeout: float = 10.0,
                   retry: float = 60.0) -> Dict[str, Any]:
    """The job-level checkpoint from the coordinator: every rank's committed cursor
    (Loader.commit()), as {"batchwire_job": 1, "job", "world_size", "cursors": [...]}
    (batchwire.state). For launchers: store it, and resume the job from it at any world size
    with Loader(elastic=True, resume=checkpoint) on every new rank. Raises
    FailedPreconditionError naming a rank that has committed nothing, NotFoundError for an
    unknown job."""
    coordinator = coordinator or os.environ.get("BATCHWIRE_COORDINATOR")
    if not coordinator or not job:
        raise errors.InvalidArgumentError("job_checkpoint: coordinator and job are required")
    check_fork_safe("job_checkpoint")
    _runtime.prepare()
    L = _lib.lib()
    opts = _Options(dict(coordinator=coordinator, job=job, tls_ca=tls_ca, tls_cert=tls_cert,
                         tls_key=tls_key, tls_server_name=tls_server_name,
                         token_file=token_file, timeout=timeout, retry=retry),
                    need_dataset=False)
    err = _lib.errbuf()
    size = 1 << 16
    while True:
        buf = ffi.new("char[]", size)
        rc = _runtime.call(L.bw_job_checkpoint, opts.raw, buf, size, err, len(err))
        if rc != BW_TOO_BIG or size >= 1 << 30:  # a larger buffer
            break
        size *= 8
    if rc != BW_OK:
        raise _lib.error(rc, _lib.text(err))
    return _state.job_checkpoint(job, _lib.text(buf).split())


def rank_steps(epoch: int = 0, **options: Any) -> int:
    """This rank's number of batches in `epoch` (what len(loader) says for it), asked of the
    coordinator without claiming the rank (bw_loader_rank_steps): `options` are Loader's.
    Like a Loader it starts the library's network runtime in this process, which a process
    that later forks DataLoader workers must not have done: batchwire.torch.BatchDataset's
    len() therefore asks from a short-lived subprocess (batchwire._probe)."""
    check_fork_safe("rank_steps")
    _runtime.prepare()
    opts = _Options(options)
    steps = ffi.new("uint64_t *")
    err = _lib.errbuf()
    rc = _runtime.call(_lib.lib().bw_loader_rank_steps, opts.raw, int(epoch), steps, err,
                       len(err))
    if rc != BW_OK:
        raise _lib.error(rc, _lib.text(err))
    return int(steps[0])


class _Hold:
    """A reference to a batch's held bytes (bw_loader_hold); released when collected."""

    __slots__ = ("_h", "address", "__weakref__")

    def __init__(self, loader: "Loader", batch: Batch) -> None:
        L = _lib.lib()
        with loader._lock:
            batch._check()
            h = loader._hold_out  # the loader's, used under its lock
            rc = L.bw_loader_hold(loader._h(), batch._ptr, h)
            if rc != BW_OK:
                loader._raise(rc)
            self._h: Optional[CData] = h[0]
        self.address: int = _address(L.bw_hold_data(self._h))

    def __del__(self) -> None:
        h, self._h = getattr(self, "_h", None), None
        if h:
            try:
                _lib.lib().bw_hold_release(h)
            except Exception:
                pass  # interpreter shutdown: the process is ending anyway


class Loader:
    """This rank's batches of a batchwire job, in plan order, with exact resume.

    Arguments (keyword-only, typed) mirror ``batchwire fetch`` and bw_loader_options
    (include/batchwire/loader.h), in groups:

    Where and who
      coordinator   "HOST:PORT" (default: $BATCHWIRE_COORDINATOR)
      job           job name; created by the first rank, joined by the others (required)
      dataset       "FORMAT:PATH[,PATH...]" below the workers' --data-root (required), or a
                    dict of named arrays indexed together, like TensorDataset(x, y):
                    {"x": "npy:x/*.npy", "y": "npy:y/*.npy"} (batch.fields(); docs/formats.md)
      mixture       instead of dataset, a weighted mixture of datasets (docs/semantics.md,
                    "Mixtures"): [("npy:a/*.npy", 0.7), ("tfrecord:b/*", 0.3)], source j
                    being entry j; weights positive, normalised by their sum; a
                    "stream:FORMAT:PATH" source (tfrecord, jsonl, text, tar) is read as a
                    stream, in its own order. No shuffle; batch.sources says each sample's
                    source, batch.indices its index (a stream's: its record) within it
      mix_samples   the mixture's epoch size E (None: the sum of the sources' sizes)
      mix_policy    a stream source that runs dry: "cycle" (None, the default) starts it
                    again, "stop" ends the epoch there; needs a stream: source
      rank, world_size   None: from RANK/WORLD_SIZE (torchrun) or SLURM_PROCID/SLURM_NTASKS

    The sampler (docs/semantics.md): every rank must agree
      batch_size    per rank (global with split_batches)
      mode          "torch" (DistributedSampler + DataLoader), "accelerate" or "iterable"
      shuffle, seed, shuffle_algo ("torch" or "feistel"), drop_last, sampler_drop_last,
      split_batches, even_batches
      allow_uneven  accelerate with even_batches=False: serve ranks different numbers of
                    batches (refused otherwise, since a DDP job would hang); see epoch_steps()
      dispatch_batches   accelerate: Accelerate's DataLoaderDispatcher batches
      pad_single_process accelerate with world_size 1: BatchSamplerShard's padding instead of
                    the short last batch prepare_data_loader yields for one process

    Where to start, how long the job runs
      resume        a cursor (text "bwc1:..." or bytes) or a state_dict() to continue after;
                    None: where the coordinator says this rank resumes (its committed cursor,
                    or the start)
      elastic       resume the job at this world_size from a checkpoint of another one:
                    `resume` is then a job-level checkpoint (batchwire.job_checkpoint(),
                    job_checkpoint_from()) or every rank's cursors or states; None takes every
                    rank's committed cursor from the coordinator
      start         (epoch, step) to start at when no cursor is given
      job_epochs    the job's total number of epochs, when known: a rank that delivered the
                    last one says so when it closes, and once every rank has, the coordinator
                    removes the job (its cursors stay valid); None: unknown

    One rank read by several processes (batchwire.torch; python/README.md)
      share         (index, count): read one share of the rank's batches from one of `count`
                    processes (batchwire.torch's DataLoader workers)
      lease         share index > 0: share 0's lease (its Loader.lease()), which this share
                    then confirms as share 0 does, stopping for good (LeaseLostError) once it
                    is lost
      holder_pid    the trainer process the rank's claim belongs to (default: this process);
                    a trainer restarted on the same host reclaims the rank at once when that
                    process has exited (batchwire.torch passes the DataLoader's main process)

    The fast path
      prefetch      batches fetched ahead (0, the default: for batches of fixed-size samples
                    about 8 MiB, in groups for batches up to 1 MiB, else 2 to 4 batches; else 4);
                    max_buffer_bytes caps their memory
      device        None or "cpu": host memory; "cuda:N": batches copied to that GPU
      reuse_buffers False (default): every batch keeps its bytes for as long as it or a view
                    of it lives. True: a batch and its views are valid only until the next
                    batch (the loader then reuses the buffer under them); nothing is held
      fields        samples as named fields (Batch.fields): tar (WebDataset) members, JSON
                    Lines keys; None (default): on for tar and jsonl datasets, off with a
                    transform
      transform     a pipeline the workers run on every sample (docs/transforms.md), e.g.
                    "decode|random_resized_crop(224)|flip|normalize(0.485,0.456,0.406;"
                    "0.229,0.224,0.225)|chw": each batch is then one tensor [B, C, H, W] of
                    the spec's dtype (Batch.numpy(), Batch.tensor()); part of the job's
                    configuration. files datasets (one image per file), or tar or jsonl
                    with transform_field; or "truncate(L)|pad(L,VALUE)" on the 1-D rows of an
                    npy dataset (token arrays): batches [B, L] of the dataset's dtype, or on
                    a jsonl key's arrays of integers: batches [B, L] of int64 (the spec must
                    end with pad(L,VALUE))
      transform_field  the tar member ("jpg") or jsonl key ("image": a base64 string of the
                    JPEG/PNG; "ids": an array of integers) transformed; with fields=True the
                    other members or keys pass through and that one's bytes are its result

    The connection
      timeout       seconds per call to a worker or the coordinator
      retry         seconds a call to the coordinator (join, commit) is retried while it is
                    unreachable or restarting (default 60; 0: no retry); the library says so
                    on the "batchwire" logger while it retries
      transport     "auto" (default, or $BATCHWIRE_TRANSPORT): the workers' data channel where
                    offered (TLS with the tls_* settings), else gRPC; "grpc": always gRPC
      compress      "none" (default, or $BATCHWIRE_COMPRESS), "zstd", "zstd:LEVEL" (1-19) or
                    "auto": compression of sample bytes on the data channel, asked of each
                    worker (docs/data-channel.md, "Compression"); the bytes delivered are the
                    same
      tls_ca, tls_cert, tls_key, tls_server_name   TLS to the coordinator and workers
      token_file    a file whose first line is the bearer token for a service started with
                    --auth-tokens (default: $BATCHWIRE_TOKEN_FILE; docs/security.md)

    Epochs work as with torch's DataLoader over a DistributedSampler whose set_epoch is
    called each time: ``for batch in loader`` runs the current position's epoch to its end
    when the loader was just opened (or resumed mid-epoch: the rest of that epoch), moved
    (load_state_dict) or given an epoch (set_epoch, next_epoch); iterating again starts the
    next epoch. So ``for epoch in range(E): for batch in loader:`` walks E epochs, and
    ``for e in range(start, E): loader.set_epoch(e); for batch in loader:`` too, also after a
    resume mid-epoch (set_epoch of the epoch the loader is at, before any batch of it, keeps
    the position). ``loader.epoch`` is the epoch of the position; ``len(loader)`` this rank's
    batches per epoch. Ctrl-C raises KeyboardInterrupt within a second also while the loader
    waits (joining, retrying, waiting for a worker), and a SIGTERM handler runs as promptly.
    One loader is used by one thread at a time (calls are serialised by a lock); different
    loaders are independent and may run in parallel threads.
    """

    def __init__(
            self, *,
            # where and who
            coordinator: Optional[str] = None, job: Optional[str] = None,
            dataset: Optional[Dataset] = None,
            mixture: Optional[Sequence[Tuple[str, Union[float, int, str]]]] = None,
            mix_samples: Optional[int] = None, mix_policy: Optional[str] = None,
            rank: Optional[int] = None,
            world_size: Optional[int] = None,
            # the sampler (docs/semantics.md): every rank of a job must agree
            batch_size: int = 1, mode: str = "torch", shuffle: bool = False, seed: int = 0,
            shuffle_algo: str = "torch", drop_last: bool = False,
            sampler_drop_last: bool = False, split_batches: bool = False,
            even_batches: bool = True, allow_uneven: bool = False,
            dispatch_batches: bool = False, pad_single_process: bool = False,
            # where to start, how long the job runs
            resume: Any = None, elastic: bool = False, start: Optional[Tuple[int, int]] = None,
            job_epochs: Optional[int] = None,
            # one rank read by several processes
            share: Optional[Tuple[int, int]] = None, lease: Optional[str] = None,
            holder_pid: Optional[int] = None,
            # the fast path
            prefetch: int = 0, max_buffer_bytes: Optional[int] = None, device: Device = None,
            reuse_buffers: bool = False, fields: Optional[bool] = None,
            # the workers' preprocessing (docs/transforms.md)
            transform: Optional[str] = None, transform_field: Optional[str] = None,
            # the connection: deadlines, transport, TLS and token
            timeout: float = 10.0, retry: float = 60.0, transport: Optional[str] = None,
            compress: Optional[str] = None,
            tls_ca: Optional[PathArg] = None, tls_cert: Optional[PathArg] = None,
            tls_key: Optional[PathArg] = None, tls_server_name: Optional[str] = None,
            token_file: Optional[PathArg] = None) -> None:
        args = dict(locals())  # the arguments, first: the options as given
        del args["self"]
        for own in _LOADER_ONLY:
            del args[own]
        self._handle: Optional[CData] = None
        self._gen = 0
        self._reuse_buffers = bool(reuse_buffers)
        # weak reference to the last batch handed out
        self._current: Optional["weakref.ref[Batch]"] = None
        # An iteration consumed the position: the next one starts the next epoch.
        self._iterated = False
        check_fork_safe("Loader")
        self._lock = threading.RLock()
        # Out-parameters of bw_loader_next and bw_loader_hold, used under the lock: one each,
        # not one a batch.
        self._next_out = ffi.new("const bw_batch **")
        self._hold_out = ffi.new("bw_hold **")
        _runtime.prepare()
        L = _lib.lib()
        if isinstance(resume, dict) and not elastic:
            sd = _state.check_state(resume, "resume")
            resume = sd.get("cursor")
            if resume is None:
                args["start"] = (sd["epoch"], sd["step"])
        opts = _Options(args)
        self._device = dev = opts.device
        self._format, self._fields = opts.format, opts.fields
        self._tfield: Optional[str] = transform_field or None
        raw = opts.raw

        handle = ffi.new("bw_loader **")
        err = _lib.errbuf()
        if elastic:
            curs = _state.elastic_cursors(resume)
            bufs = [ffi.new("char[]", c) for c in curs]
            ptrs = ffi.new("const void *[]", bufs or [ffi.NULL])
            lens = ffi.new("size_t[]", [len(c) for c in curs] or [0])
            rc = _runtime.call(L.bw_loader_open_elastic, raw, ptrs, lens, len(curs), handle,
                               err, len(err))
        elif resume is None:
            rc = _runtime.call(L.bw_loader_open, raw, handle, err, len(err))
        else:
            if isinstance(resume, str):
                cur = resume.strip().encode()
                clen = 0  # NUL-terminated text
            elif isinstance(resume, (bytes, bytearray, memoryview)):
                cur = bytes(resume)
                clen = len(cur)
            else:
                raise errors.InvalidArgumentError(
                    "resume: expected the cursor's text (str, 'bwc1:...'), bytes or a "
                    "state_dict(), got %s" % type(resume).__name__)
            if not cur:
                raise errors.CorruptError("cursor refused: it is empty")
            cbuf = ffi.new("char[]", cur)
            rc = _runtime.call(L.bw_loader_open_at, raw, cbuf, clen, handle, err, len(err))
        del opts
        if rc != BW_OK:
            raise _lib.error(rc, _lib.text(err))
        self._handle = h = handle[0]
        self._pid = os.getpid()
        with _open_lock:
            if _open["pid"] != self._pid:
                _open["pid"], _open["count"] = self._pid, 0
            _open["count"] += 1
        self.rank = int(L.bw_loader_rank(h))
        self.world_size = int(L.bw_loader_world_size(h))
        self.num_samples = int(L.bw_loader_num_samples(h))
        # A transform's result per sample: what fields() makes of the transformed member or
        # key (docs/transforms.md, "What a batch is").
        self._tf_layout: Optional[Tuple[bytes, Tuple[int, ...]]] = None
        tdt, tshape, tnd = ffi.new("const char **"), ffi.new("uint64_t[8]"), ffi.new("size_t *")
        if L.bw_loader_transform_layout(h, tdt, tshape, 8, tnd) == BW_OK and tnd[0] <= 8:
            self._tf_layout = (ffi.string(tdt[0]), tuple(int(tshape[i]) for i in range(tnd[0])))
        self.job = job
        self.device = dev

    # ---- lifetime

    def close(self) -> None:
        """Leaves the job (releases the rank) and frees every buffer. Batches handed out stay
        readable (they hold their bytes) unless the loader reuses buffers. Idempotent."""
        with self._lock:
            if self._handle is not None and os.getpid() == self._pid:
                self._move_on()
            h, self._handle = self._handle, None
            self._gen += 1
            # In a forked child the loader (its threads, its lease) is the parent's: leave it.
            if h is not None and os.getpid() == self._pid:
                _lib.lib().bw_loader_close(h)
                with _open_lock:
                    _open["count"] -= 1

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if getattr(self, "_handle", None) is not None:
                self.close()
        except Exception:
            pass

    def _h(self) -> CData:
        if self._handle is None:
            raise errors.FailedPreconditionError("the loader is closed")
        if os.getpid() != self._pid:
            # A forked child (a DataLoader worker) has the handle but not the loader's threads.
            raise errors.FailedPreconditionError(
                "this Loader was opened by process %d and cannot be used in process %d (a "
                "DataLoader worker?): give the DataLoader a batchwire.torch.BatchDataset, "
                "whose workers each read a share of the rank" % (self._pid, os.getpid()))
        return self._handle

    def _raise(self, rc: int) -> NoReturn:
        msg = _lib.text(_lib.lib().bw_loader_errmsg(self._handle)) \
            if self._handle is not None else ""
        raise _lib.error(rc, msg)

    def _move_on(self) -> None:
        """Before the loader leaves its current batch (next batch, an epoch, a seek, close):
        that batch, if still referenced, keeps what its samples() and fields() need."""
        ref, self._current = self._current, None
        b = ref() if ref is not None else None
        if b is not None and b._gen == self._gen:
            b._snapshot()
        self._gen += 1

    def _position_call(self, fn: Callable[..., int], *args: Any) -> None:
        """A call that moves the loader (next_epoch, set_epoch, seek): the next iteration runs
        the new position."""
        with self._lock:
            h = self._h()
            self._move_on()
            rc = _runtime.call(fn, h, *args)
            if rc != BW_OK:
                self._raise(rc)
            self._iterated = False

    # ---- batches

    def next_batch(self) -> Optional["Batch"]:
        """The next batch of the current epoch, or None at the end of the epoch. With
        reuse_buffers the previous batch's data becomes invalid."""
        with self._lock:
            h = self._h()
            self._move_on()
            out = self._next_out
            out[0] = ffi.NULL
            try:
                rc = _runtime.call(_lib.lib().bw_loader_next, h, out)
                if rc == BW_END_OF_EPOCH:
                    return None
                if rc != BW_OK:
                    self._raise(rc)
                b = Batch(self, out[0], self._gen)
                self._current = weakref.ref(b)
            except BaseException:
                # Handed out by the library (out is set) but not to the caller: a signal
                # handler raised as the call returned (KeyboardInterrupt), or the batch could
                # not be made. Give it back, so that the cursor -- a checkpoint taken in the
                # handler -- does not count a batch the trainer never saw, and the next call
                # returns it again (bw_loader_unnext).
                if out[0] != ffi.NULL:
                    self._gen += 1
                    _lib.lib().bw_loader_unnext(h)
                raise
            return b

    def __iter__(self) -> Iterator["Batch"]:
        """This rank's batches to the end of an epoch: the current position's epoch (the rest
        of it) when nothing has iterated since the loader was opened or moved, else the next
        epoch (as iterating a DataLoader again does)."""
        with self._lock:
            if self._iterated:
                self.next_epoch()
            self._iterated = True
        return self._batches()

    def _batches(self) -> Iterator[Batch]:
        while True:
            b = self.next_batch()
            if b is None:
                return
            yield b
            # Not kept here while the next batch is asked for: a batch nobody else holds
            # needs no snapshot (_move_on).
            del b

    def next_epoch(self) -> None:
        """Starts the next epoch at step 0 (also when the current one was left unfinished)."""
        self._position_call(_lib.lib().bw_loader_next_epoch)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs, from its step 0 (as DistributedSampler.set_epoch
        before iterating a DataLoader). The epoch the loader is at, before any batch of it was
        handed out, is kept as it is: after a resume mid-epoch, set_epoch of that epoch
        continues it (bw_loader_set_epoch)."""
        epoch = int(epoch)
        if epoch < 0:
            raise errors.InvalidArgumentError("set_epoch: %d is not an epoch" % epoch)
        self._position_call(_lib.lib().bw_loader_set_epoch, epoch)

    @property
    def epoch(self) -> int:
        """The epoch of the loader's position (the next batch's): the one being iterated, or
        last iterated, or the one set_epoch, next_epoch or a resume named."""
        with self._lock:
            return int(_lib.lib().bw_loader_epoch(self._h()))

    def epochs(self, n: int) -> Iterator[int]:
        """Yields n epoch numbers, the first being the current epoch (which may be resumed
        mid-way; the next one if the current one was iterated already), starting each further
        one with next_epoch(); iterate the loader inside:
        ``for epoch in loader.epochs(3): for batch in loader: ...``."""
        for i in range(int(n)):
            if i > 0 or self._iterated:
                self.next_epoch()
            yield self.position()[0]

    # ---- cursors

    def cursor_bytes(self) -> bytes:
        """The cursor after the last batch handed out (binary form)."""
        with self._lock:
            h = self._h()
            L = _lib.lib()
            n = ffi.new("size_t *", 256)
            while True:
                buf = ffi.new("char[]", n[0])
                rc = L.bw_loader_cursor(h, buf, n)
                if rc == BW_OK:
                    return bytes(ffi.buffer(buf, n[0]))
                if rc != BW_TOO_BIG:  # BW_TOO_BIG: n is now the size needed
                    self._raise(rc)

    def cursor(self) -> str:
        """The cursor after the last batch handed out, as text ("bwc1:..."): store it in the
        checkpoint and pass it back as Loader(resume=...)."""
        with self._lock:
            h = self._h()
            buf = ffi.new("char[]", _CURSOR_TEXT_MAX)
            rc = _lib.lib().bw_loader_cursor_text(h, buf, len(buf))
            if rc != BW_OK:
                self._raise(rc)
            return _lib.text(buf)

    def position(self) -> Tuple[int, int]:
        """(epoch, step) of the next batch to be handed out."""
        info = _state.cursor_info(self.cursor_bytes())
        return int(info["epoch"]), int(info["step"])

    def epoch_steps(self) -> int:
        """One past the last step of this rank in the current epoch (its batches this epoch
        are numbered up to it), known before the first batch. Equal on every rank except with
        allow_uneven."""
        with self._lock:
            return int(_lib.lib().bw_loader_epoch_steps(self._h()))

    def __len__(self) -> int:
        """This rank's batches per epoch (epoch_steps(): what len() of a DataLoader over a
        DistributedSampler gives for the same settings)."""
        return self.epoch_steps()

    def lease(self) -> str:
        """The rank's lease as text, for share 0 (the loader that claimed the rank): the
        other shares of the rank open with it (Loader(share=(i, n), lease=...)), so that they
        stop as soon as it is lost (bw_loader_lease)."""
        with self._lock:
            h = self._h()
            buf = ffi.new("char[]", 256)
            rc = _lib.lib().bw_loader_lease(h, buf, len(buf))
            if rc != BW_OK:
                self._raise(rc)
            return _lib.text(buf)

    def state_dict(self) -> Dict[str, Any]:
        """This rank's position as a plain dict (torchdata StatefulDataLoader style): store it
        with torch.save or Accelerate's register_for_checkpointing, restore it with
        load_state_dict() or Loader(resume=...). See batchwire.state."""
        cur = self.cursor()
        info = _state.cursor_info(cur)
        return _state.rank_state(str(self.job), self.rank, self.world_size, info["epoch"],
                                 info["step"], cur)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Continues after the batch a state_dict() of this job's same rank describes (the
        next iteration runs the rest of its epoch; prefetched batches are discarded). A state
        of another world size is refused: resume those with Loader(elastic=True,
        resume=...)."""
        sd = _state.check_state(state_dict, "load_state_dict")
        if sd["world_size"] != self.world_size or sd["rank"] != self.rank:
            raise errors.MismatchError(
                "load_state_dict: the state is rank %d of world size %d, this loader rank %d of "
                "%d; a checkpoint taken at another world size resumes with Loader(elastic=True, "
                "resume=job checkpoint)" % (sd["rank"], sd["world_size"], self.rank,
                                           self.world_size))
        if "cursor" not in sd:
            raise errors.InvalidArgumentError(
                "load_state_dict: the state has no cursor (a position from batchwire.torch): "
                "open a Loader with resume=state instead")
        cur = sd["cursor"]
        data = cur.strip().encode() if isinstance(cur, str) else bytes(cur)
        buf = ffi.new("char[]", data)
        self._position_call(_lib.lib().bw_loader_seek, buf,
                            0 if isinstance(cur, str) else len(data))

    def stats(self) -> Dict[str, Union[int, float]]:
        """What this loader has done since it opened, as a dict (docs/client.md,
        "Statistics"): batches, samples and bytes handed out; wait_seconds, the time spent
        waiting for data in next_batch; samples_received and bytes_received from workers;
        requests sent, retries, failovers and busy answers."""
        st = ffi.new("bw_loader_stats *")
        rc = _lib.lib().bw_loader_get_stats(self._h(), st, ffi.sizeof("bw_loader_stats"))
        if rc != BW_OK:
            self._raise(rc)
        out: Dict[str, Union[int, float]] = {
            name: int(getattr(st, name)) for name, _ in ffi.typeof("bw_loader_stats").fields}
        out["wait_seconds"] = out.pop("wait_ns") / 1e9
        return out

    def commit(self) -> None:
        """Records the cursor with the coordinator (durably) for this rank: a restarted
        Loader without ``resume`` continues from it."""
        with self._lock:
            rc = _runtime.call(_lib.lib().bw_loader_commit, self._h())
            if rc != BW_OK:
                self._raise(rc)

    def __repr__(self) -> str:
        return "<batchwire.Loader job=%r rank=%s/%s%s>" % (
            self.__dict__.get("job"), self.__dict__.get("rank"), self.__dict__.get("world_size"),
            "" if self._handle is not None else " closed")
