"""The process-wide glue between Python and libbatchwire: where the library's log lines go
(Python's ``logging``), and how a blocking library call lets Python's signal handling run
(Ctrl-C, a launcher's SIGTERM). Internal to the package: every blocking call of the binding
goes through call() below, and every entry point calls prepare() first.
"""

import atexit
import logging
import re
import threading
from typing import Any, Callable, Dict, Optional

from . import _lib
from ._cdefs import BW_INTERRUPTED, BW_LOG_DEBUG, BW_LOG_ERROR, BW_LOG_INFO, BW_LOG_WARN
from ._lib import CData, ffi

_LEVELS = {BW_LOG_ERROR: logging.ERROR, BW_LOG_WARN: logging.WARNING, BW_LOG_INFO: logging.INFO,
           BW_LOG_DEBUG: logging.DEBUG}
# "2026-12-02T09:26:25.441Z WARN  batchwire[6900]: " -- core/common/log.c's text prefix.
_PREFIX = re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+Z [A-Z]+ +[^ \[\]]+\[\d+\]: ")
_state: Dict[str, Any] = {"fn": None, "explicit": False, "atexit": False}
_lock = threading.Lock()


def log_to_python(level: Optional[int] = logging.INFO, logger: str = "batchwire") -> None:
    """Sends libbatchwire's log lines to the `logging` logger named `logger`, for events at
    `level` or more severe; None turns them off. Without a call the package sends WARNING and
    ERROR lines to the "batchwire" logger (a coordinator being retried, a worker failing over
    for good...), which Python prints on stderr unless logging is configured otherwise."""
    with _lock:
        _state["explicit"] = True
        _install(level, logger)


def _install(level: Optional[int], logger: str) -> None:
    L = _lib.lib()
    if level is None:
        L.bw_set_log_callback(ffi.NULL, ffi.NULL, 0)
        _state["fn"] = None
        return
    log = logging.getLogger(logger)
    max_level = max((k for k, v in _LEVELS.items() if v >= level), default=0)

    def cb(_user: CData, lvl: int, line: CData) -> None:
        try:
            text = _lib.text(line)
            # The library's line starts with its own time, level and "batchwire[pid]: " (or
            # is JSON with --log-format json): logging's record has those already.
            m = _PREFIX.match(text)
            log.log(_LEVELS.get(lvl, logging.INFO), "%s", text[m.end():] if m else text)
        except Exception:
            pass

    fn = ffi.callback("bw_log_fn", cb)
    L.bw_set_log_callback(fn, ffi.NULL, max_level)
    _state["fn"] = fn  # keep the trampoline alive as long as the library may call it
    if not _state["atexit"]:
        # Library threads must not call into an interpreter that is shutting down.
        atexit.register(_quiet)
        _state["atexit"] = True


def _quiet() -> None:
    if _state["fn"] is not None:
        _lib.lib().bw_set_log_callback(ffi.NULL, ffi.NULL, 0)


def prepare() -> None:
    """Before the first library call of a Loader (or job_checkpoint, rank_steps): the default
    log routing (WARNING to the "batchwire" logger) unless log_to_python() chose otherwise, and
    the library's SIGINT/SIGTERM handlers in front of Python's (bw_interrupt_on_signals; again
    if someone replaced them since)."""
    L = _lib.lib()
    if not _state["explicit"] and _state["fn"] is None:
        with _lock:
            if not _state["explicit"] and _state["fn"] is None:
                _install(logging.WARNING, "batchwire")
    L.bw_interrupt_on_signals()


def _pending_signals() -> None:
    """Nothing: calling a Python function is where the interpreter runs the signal handlers
    that are pending (KeyboardInterrupt for SIGINT, the program's own SIGTERM handler)."""


def call(fn: Callable[..., int], *args: Any) -> int:
    """fn(*args), a blocking library call, under the library's interrupt contract
    (include/batchwire/batchwire.h, bw_interrupt_on_signals): when a signal interrupts it
    (BW_INTERRUPTED), the flag is lowered, Python runs its signal handlers -- Ctrl-C raises
    KeyboardInterrupt here, a SIGTERM handler runs (and may raise) -- and if they return, the
    call is made again. Returns fn's result otherwise. The handlers are put back in front of
    Python's first, in case the program installed its own since (signal.signal)."""
    L = _lib.lib()
    while True:
        L.bw_interrupt_on_signals()
        rc = int(fn(*args))
        if rc != BW_INTERRUPTED:
            return rc
        L.bw_interrupt_clear()
        _pending_signals()
