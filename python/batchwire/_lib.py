"""Finding and declaring libbatchwire (cffi, ABI mode). Internal to the package.

The declarations are the C headers' own: _cdefs.py is generated from include/batchwire/*.h
by python/gen_bindings.py (ctest's lint/bindings checks it is current), so the structs'
layouts, the enums and every signature come from the headers, not from a copy kept by hand.
Nothing is compiled: cffi's ABI mode reads the declarations and calls the shared library.

The library is searched, in order:
  1. $BATCHWIRE_LIB (a path to libbatchwire.so; an error if it does not exist);
  2. next to this package (an installed copy: batchwire/libbatchwire.so[.0]);
  3. the source tree's build folder: <repo>/build/lib/libbatchwire.so when the package is
     used from <repo>/python (the README's build);
  4. the system loader path (ctypes.util.find_library("batchwire"), then libbatchwire.so.0).
"""

import ctypes.util
import os
import threading
from typing import Any, Dict, List, Optional

import cffi

from . import errors
from ._cdefs import CDEF, FUNCTIONS

ffi = cffi.FFI()
ffi.cdef(CDEF)

# A C object of the library (a cffi cdata or the loaded library): typed Any for mypy, as
# cffi ships no type information.
CData = Any

_lock = threading.Lock()
_lib: Optional[CData] = None
_path: Optional[str] = None


def candidates() -> List[str]:
    """The paths tried, in order (the last entries are names for the system loader)."""
    env = os.environ.get("BATCHWIRE_LIB")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    out = [os.path.join(here, "libbatchwire.so"), os.path.join(here, "libbatchwire.so.0"),
           os.path.join(repo, "build", "lib", "libbatchwire.so")]
    found = ctypes.util.find_library("batchwire")
    if found:
        out.append(found)
    out.append("libbatchwire.so.0")
    return out


def _needs_asan(path: str) -> bool:
    """True when `path` links the AddressSanitizer runtime and this process has not loaded
    it: dlopen would then abort the interpreter ("ASan runtime does not come first")."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return False
    if b"libasan.so" not in data:
        return False
    try:
        with open("/proc/self/maps") as f:
            return "libasan" not in f.read()
    except OSError:
        return False


def _missing(handle: CData) -> List[str]:
    """The declared functions the library does not have (an older library)."""
    out = []
    for name in FUNCTIONS:
        try:
            getattr(handle, name)
        except AttributeError:
            out.append(name)
    return out


def lib() -> CData:
    """The loaded library (loaded on first use): its functions as the headers declare them."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        env = os.environ.get("BATCHWIRE_LIB")
        for c in candidates():
            is_path = os.sep in c
            if is_path and not os.path.exists(c):
                tried.append("%s (no such file)" % c)
                continue
            if is_path and _needs_asan(c):
                raise errors.FailedPreconditionError(
                    "%s is built with AddressSanitizer and this Python process is not: start "
                    "python with LD_PRELOAD=$(gcc -print-file-name=libasan.so) "
                    "ASAN_OPTIONS=detect_leaks=0, or point BATCHWIRE_LIB at a build without "
                    "sanitizers" % c)
            try:
                handle = ffi.dlopen(c)
            except OSError as e:
                tried.append("%s (%s)" % (c, e))
                continue
            missing = _missing(handle)
            if missing:
                raise errors.InternalError(
                    "%s lacks %s: it is older than this binding; rebuild it (cmake --build) "
                    "or point BATCHWIRE_LIB at a current build" % (c, ", ".join(missing)))
            _lib, _path = handle, c
            return _lib
        raise errors.NotFoundError(
            "libbatchwire not found; tried: %s. Build it (README: cmake --build build) or set "
            "BATCHWIRE_LIB to the path of libbatchwire.so" % "; ".join(tried) +
            ("" if not env else " (BATCHWIRE_LIB is set, so nothing else was tried)"))


def path() -> str:
    """The path (or loader name) the library was loaded from."""
    lib()
    assert _path is not None
    return _path


def text(p: CData) -> str:
    """A C string the library returned ("" for NULL)."""
    return "" if p == ffi.NULL else bytes(ffi.string(p)).decode("utf-8", "replace")


def err_name(rc: int) -> str:
    return text(lib().bw_err_name(rc))


def error(rc: int, message: str) -> errors.Error:
    """The exception for return code rc with the library's sentence."""
    if not message:
        message = text(lib().bw_strerror(rc))
    return errors.from_rc(rc, message, code=err_name(rc))


def errbuf(size: int = 2048) -> CData:
    """A buffer for a call's `char *err, size_t errlen`."""
    return ffi.new("char[]", size)


def new_options() -> CData:
    """A bw_loader_options with the library's defaults (bw_loader_options_init_sized with the
    size of the struct as the headers declare it: the library checks it)."""
    o = ffi.new("bw_loader_options *")
    lib().bw_loader_options_init_sized(o, ffi.sizeof("bw_loader_options"))
    return o


def cursor_info(data: bytes) -> Dict[str, Any]:
    """What a cursor (bytes, or text "bwc1:...") says, decoded and checked by the library
    (bw_cursor_describe): job, fingerprint, rank, world_size, epoch, step. CorruptError for
    anything that is not an intact cursor."""
    info = ffi.new("bw_cursor_info *")
    err = errbuf(1024)
    buf = ffi.new("char[]", bytes(data))  # NUL-terminated: text cursors pass len 0
    rc = lib().bw_cursor_describe(buf, len(data), info, ffi.sizeof("bw_cursor_info"), err,
                                  len(err))
    if rc != 0:
        raise error(rc, text(err))
    return {"job": text(info.job), "fingerprint": int(info.fingerprint),
            "rank": int(info.rank), "world_size": int(info.world_size),
            "epoch": int(info.epoch), "step": int(info.step)}
