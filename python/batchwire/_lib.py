"""Finding and declaring libbatchwire (ctypes). Internal to the package.

The library is searched, in order:
  1. $BATCHWIRE_LIB (a path to libbatchwire.so; an error if it does not exist);
  2. next to this package (an installed copy: batchwire/libbatchwire.so[.0]);
  3. the source tree's build folder: <repo>/build/lib/libbatchwire.so when the package is
     used from <repo>/python (the README's build);
  4. the system loader path (ctypes.util.find_library("batchwire"), then libbatchwire.so.0).
"""

import ctypes
import ctypes.util
import os
import threading

from . import errors

c_char_p = ctypes.c_char_p
c_void_p = ctypes.c_void_p
c_size_t = ctypes.c_size_t
c_int = ctypes.c_int
c_int64 = ctypes.c_int64
c_uint64 = ctypes.c_uint64


class Options(ctypes.Structure):
    """bw_loader_options (include/batchwire/loader.h), field for field."""

    _fields_ = [
        ("coordinator", c_char_p),
        ("tls_ca", c_char_p),
        ("tls_cert", c_char_p),
        ("tls_key", c_char_p),
        ("tls_server_name", c_char_p),
        ("job", c_char_p),
        ("dataset", c_char_p),
        ("rank", c_int64),
        ("world_size", c_int64),
        ("mode", c_char_p),
        ("batch_size", c_uint64),
        ("shuffle", c_int),
        ("seed", c_int64),
        ("shuffle_algo", c_char_p),
        ("drop_last", c_int),
        ("sampler_drop_last", c_int),
        ("split_batches", c_int),
        ("even_batches", c_int),
        ("prefetch_batches", ctypes.c_uint),
        ("max_buffer_bytes", c_size_t),
        ("timeout_ms", c_int),
        ("device", c_int),
        ("transport", c_char_p),
        ("retry_ms", c_int),
        ("token_file", c_char_p),
        ("epochs", c_uint64),
        ("allow_uneven", c_int),
        ("dispatch_batches", c_int),
        ("pad_single_process", c_int),
        ("start_epoch", c_int64),
        ("start_step", c_uint64),
        ("share_index", ctypes.c_uint32),
        ("share_count", ctypes.c_uint32),
        ("fields", c_int),
        ("holder_pid", ctypes.c_uint32),
        ("lease", c_char_p),
        ("dataset_fields", ctypes.POINTER(c_char_p)),
        ("n_dataset_fields", c_size_t),
    ]


class Field(ctypes.Structure):
    """bw_field (include/batchwire/loader.h)."""

    _fields_ = [("name", c_char_p), ("offset", c_size_t), ("size", c_size_t)]


class Array(ctypes.Structure):
    """bw_array (include/batchwire/loader.h): one named array of a batch."""

    _fields_ = [("name", c_char_p), ("dtype", c_char_p), ("ndim", c_size_t),
                ("shape", ctypes.POINTER(c_uint64)), ("offset", c_size_t), ("nbytes", c_size_t)]


class Stats(ctypes.Structure):
    """bw_loader_stats (include/batchwire/loader.h), field for field."""

    _fields_ = [(name, c_uint64) for name in (
        "batches", "samples", "bytes", "wait_ns", "samples_received", "bytes_received",
        "requests", "retries", "failovers", "busy")]


# The options struct is allocated inside a larger zeroed buffer, so that a library whose
# struct has grown at its end cannot write past what Python allocated.
OPTIONS_ALLOC = 4096

_LOG_FN = ctypes.CFUNCTYPE(None, c_void_p, c_int, c_char_p)

_lock = threading.Lock()
_lib = None
_path = None


def candidates():
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


def _needs_asan(path):
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


def _declare(lib):
    P = c_void_p
    sig = {
        "bw_version": (c_char_p, []),
        "bw_build_info": (c_char_p, []),
        "bw_strerror": (c_char_p, [c_int]),
        "bw_err_name": (c_char_p, [c_int]),
        "bw_set_log_callback": (None, [_LOG_FN, c_void_p, c_int]),
        "bw_loader_options_init": (None, [P]),
        "bw_loader_open": (c_int, [P, ctypes.POINTER(P), ctypes.c_char_p, c_size_t]),
        "bw_loader_open_at": (c_int, [P, c_void_p, c_size_t, ctypes.POINTER(P), ctypes.c_char_p,
                                      c_size_t]),
        "bw_loader_next": (c_int, [P, ctypes.POINTER(P)]),
        "bw_loader_next_epoch": (c_int, [P]),
        "bw_loader_unnext": (c_int, [P]),
        "bw_loader_cursor": (c_int, [P, c_void_p, ctypes.POINTER(c_size_t)]),
        "bw_loader_cursor_text": (c_int, [P, ctypes.c_char_p, c_size_t]),
        "bw_loader_commit": (c_int, [P]),
        "bw_loader_errmsg": (c_char_p, [P]),
        "bw_loader_rank": (c_int64, [P]),
        "bw_loader_world_size": (c_int64, [P]),
        "bw_loader_num_samples": (c_uint64, [P]),
        "bw_loader_close": (None, [P]),
        "bw_loader_get_stats": (c_int, [P, ctypes.POINTER(Stats), c_size_t]),
        "bw_batch_epoch": (c_uint64, [P]),
        "bw_batch_step": (c_uint64, [P]),
        "bw_batch_count": (c_size_t, [P]),
        "bw_batch_real": (c_size_t, [P]),
        "bw_batch_indices": (c_void_p, [P]),
        "bw_batch_padding": (c_void_p, [P]),
        "bw_batch_data": (c_void_p, [P]),
        "bw_batch_host_data": (c_void_p, [P]),
        "bw_batch_nbytes": (c_size_t, [P]),
        "bw_batch_dtype": (c_char_p, [P]),
        "bw_batch_ndim": (c_size_t, [P]),
        "bw_batch_shape": (c_void_p, [P]),
        "bw_batch_device": (c_int, [P]),
        "bw_batch_narrays": (c_size_t, [P]),
        "bw_batch_array": (c_int, [P, c_size_t, ctypes.POINTER(Array)]),
        "bw_batch_sample": (c_int, [P, c_size_t, ctypes.POINTER(c_void_p),
                                    ctypes.POINTER(c_size_t)]),
        "bw_loader_seek": (c_int, [P, c_void_p, c_size_t]),
        "bw_loader_epoch_steps": (c_uint64, [P]),
        "bw_loader_open_elastic": (c_int, [P, ctypes.POINTER(c_void_p), ctypes.POINTER(c_size_t),
                                           c_size_t, ctypes.POINTER(P), ctypes.c_char_p,
                                           c_size_t]),
        "bw_job_checkpoint": (c_int, [P, ctypes.c_char_p, c_size_t, ctypes.c_char_p, c_size_t]),
        "bw_loader_hold": (c_int, [P, P, ctypes.POINTER(P)]),
        "bw_batch_fields": (c_int, [P, c_size_t, ctypes.POINTER(ctypes.POINTER(Field)),
                                    ctypes.POINTER(c_size_t)]),
        "bw_hold_data": (c_void_p, [P]),
        "bw_hold_nbytes": (c_size_t, [P]),
        "bw_hold_release": (None, [P]),
        "bw_loader_lease": (c_int, [P, ctypes.c_char_p, c_size_t]),
        "bw_loader_lease_state": (c_int, [P, ctypes.POINTER(c_uint64), ctypes.POINTER(c_int)]),
        "bw_loader_set_epoch": (c_int, [P, c_uint64]),
        "bw_loader_epoch": (c_uint64, [P]),
        "bw_loader_rank_steps": (c_int, [P, c_uint64, ctypes.POINTER(c_uint64), ctypes.c_char_p,
                                         c_size_t]),
        "bw_interrupt_clear": (None, []),
        "bw_interrupt_on_signals": (c_int, []),
    }
    missing = []
    for name, (res, args) in sig.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            missing.append(name)
            continue
        fn.restype = res
        fn.argtypes = args
    return missing


def _check_layout(lib, path):
    """Fails clearly if the library's bw_loader_options differs from Options."""
    buf = ctypes.create_string_buffer(OPTIONS_ALLOC)
    lib.bw_loader_options_init(buf)
    o = Options.from_buffer(buf)
    want = {"rank": -1, "world_size": -1, "batch_size": 1, "even_batches": 1,
            "prefetch_batches": 4, "max_buffer_bytes": 1 << 30, "timeout_ms": 10000,
            "device": -1, "retry_ms": 60000, "start_epoch": -1, "share_count": 1}
    got = {k: getattr(o, k) for k in want}
    if got != want or o.mode != b"torch" or o.shuffle_algo != b"torch" or o.coordinator:
        raise errors.InternalError(
            "%s: bw_loader_options does not have the layout this binding expects (defaults "
            "read back as %r); use the python/ package from the same source tree as the "
            "library" % (path, got))


def lib():
    """The loaded, declared library (loaded on first use)."""
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
                handle = ctypes.CDLL(c)
            except OSError as e:
                tried.append("%s (%s)" % (c, e))
                continue
            missing = _declare(handle)
            if missing:
                raise errors.InternalError(
                    "%s lacks %s: it is older than this binding; rebuild it (cmake --build) "
                    "or point BATCHWIRE_LIB at a current build" % (c, ", ".join(missing)))
            _check_layout(handle, c)
            _lib, _path = handle, c
            return _lib
        raise errors.NotFoundError(
            "libbatchwire not found; tried: %s. Build it (README: cmake --build build) or set "
            "BATCHWIRE_LIB to the path of libbatchwire.so" % "; ".join(tried) +
            ("" if not env else " (BATCHWIRE_LIB is set, so nothing else was tried)"))


def path():
    """The path (or loader name) the library was loaded from."""
    lib()
    return _path


def err_name(rc):
    return lib().bw_err_name(rc).decode()


def error(rc, message):
    """The exception for return code rc with the library's sentence."""
    name = err_name(rc)
    if not message:
        message = lib().bw_strerror(rc).decode()
    return errors.from_rc(rc, message, code=name)
