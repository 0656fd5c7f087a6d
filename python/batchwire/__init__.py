"""batchwire: exactly this rank's training batches from a batchwire cluster.

    from batchwire import Loader
    with Loader(coordinator="10.0.0.5:7700", job="run1", dataset="npy:train/*.npy",
                batch_size=32, shuffle=True, seed=0) as loader:
        for epoch in range(10):            # each pass is the next epoch (or set_epoch)
            for batch in loader:
                x = batch.torch()          # [32, ...] tensor, zero-copy, never overwritten
                ...
            ckpt["data_cursor"] = loader.cursor()

A thin binding over libbatchwire (include/batchwire/loader.h) through cffi's ABI mode, its
declarations generated from the C headers (python/gen_bindings.py); nothing to compile.
The library is found through $BATCHWIRE_LIB, next to this package, in the source tree's
build/lib, or on the system loader path (see python/README.md). numpy is needed for batches,
torch only for Batch.torch().
"""

from . import _lib
from ._runtime import log_to_python
from ._version import __version__
from .errors import *  # noqa: F401,F403  (the exception classes)
from .errors import Error, __all__ as _error_names
from .loader import Batch, Loader, job_checkpoint, rank_steps
from .state import job_checkpoint_from

__all__ = ["Loader", "Batch", "Error", "library_path", "version", "build_info", "log_to_python",
           "job_checkpoint", "job_checkpoint_from", "rank_steps"] + \
    [n for n in _error_names if n != "Error"]


def library_path() -> str:
    """Where libbatchwire was loaded from (loads it if needed)."""
    return _lib.path()


def version() -> str:
    """libbatchwire's version, "MAJOR.MINOR.PATCH" (the package's is __version__)."""
    return _lib.text(_lib.lib().bw_version())


def build_info() -> str:
    """What the loaded libbatchwire is: version, commit, build type, TLS and CUDA, e.g.
    "0.1.0 commit=2bfd0fe build=RelWithDebInfo tls=yes cuda=no"."""
    return _lib.text(_lib.lib().bw_build_info())
