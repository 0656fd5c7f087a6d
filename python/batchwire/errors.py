"""batchwire's exceptions: one class per library error code, all under batchwire.Error.

Every exception carries ``.code`` (the code's stable name, e.g. ``"BW_MISMATCH"``), ``.rc``
(its negative number, as in include/batchwire/batchwire.h) and the library's sentence as its
message. Some also derive from the built-in exception a Python program would catch for the
same situation (``InvalidArgumentError`` is a ``ValueError``, ``DeadlineExceededError`` a
``TimeoutError``, ``OutOfMemoryError`` a ``MemoryError``).
"""

import builtins


class Error(Exception):
    """A failure reported by libbatchwire (or by the binding, with the same codes)."""

    code = "BW_INTERNAL"
    rc = -23

    def __init__(self, message, code=None, rc=None):
        super().__init__(message)
        if code is not None:
            self.code = code
        if rc is not None:
            self.rc = rc

    @property
    def message(self):
        return self.args[0] if self.args else ""

    def __str__(self):
        return "%s: %s" % (self.code, self.message)


def _define(name, number, bases=()):
    return type(name, (Error,) + bases, {"code": "BW_" + _CODE_BY_CLASS[name], "rc": number,
                                         "__module__": __name__,
                                         "__doc__": "The library's BW_%s." % _CODE_BY_CLASS[name]})


# class name, code name (without BW_), number, extra built-in bases. Numbers are stable
# (batchwire.h); the names come from the library at run time when it knows them.
_TABLE = [
    ("InvalidArgumentError", "INVALID_ARGUMENT", -1, (ValueError,)),
    ("OutOfMemoryError", "NOMEM", -2, (MemoryError,)),
    ("InputOutputError", "IO", -3, (OSError,)),
    ("NotFoundError", "NOT_FOUND", -4, (LookupError,)),
    ("AlreadyExistsError", "ALREADY_EXISTS", -5, ()),
    ("PermissionDeniedError", "PERMISSION_DENIED", -6, (PermissionError,)),
    ("UnavailableError", "UNAVAILABLE", -7, (ConnectionError,)),
    ("DeadlineExceededError", "TIMEOUT", -8, (builtins.TimeoutError,)),
    ("TooBigError", "TOO_BIG", -9, ()),
    ("CorruptError", "CORRUPT", -10, ()),
    ("ProtocolError", "PROTOCOL", -11, ()),
    ("UnimplementedError", "UNIMPLEMENTED", -12, (NotImplementedError,)),
    ("FailedPreconditionError", "FAILED_PRECONDITION", -13, ()),
    ("AbortedError", "ABORTED", -14, ()),
    ("OutOfRangeError", "OUT_OF_RANGE", -15, ()),
    ("CancelledError", "CANCELLED", -16, ()),
    ("TLSError", "TLS", -17, ()),
    ("UnauthenticatedError", "UNAUTHENTICATED", -18, ()),
    ("WrongOwnerError", "WRONG_OWNER", -19, ()),
    ("MismatchError", "MISMATCH", -20, ()),
    ("NoDeviceError", "NO_DEVICE", -21, ()),
    ("EndOfEpochError", "END_OF_EPOCH", -22, ()),
    ("InternalError", "INTERNAL", -23, ()),
    ("BusyError", "BUSY", -24, ()),
    ("LeaseLostError", "LEASE_LOST", -25, ()),
]

_CODE_BY_CLASS = {cls: code for cls, code, _, _ in _TABLE}
_BY_RC = {}
_BY_CODE = {}
for _cls, _code, _num, _bases in _TABLE:
    _c = _define(_cls, _num, _bases)
    globals()[_cls] = _c
    _BY_RC[_num] = _c
    _BY_CODE["BW_" + _code] = _c
del _cls, _code, _num, _bases, _c

__all__ = ["Error"] + [row[0] for row in _TABLE]


def from_rc(rc, message, code=None):
    """The exception for library return code `rc` (code: the library's name for it)."""
    cls = _BY_CODE.get(code) or _BY_RC.get(rc) or Error
    return cls(message, code=code or getattr(cls, "code", None), rc=rc)


def by_code(code):
    """The class for a code name such as "BW_MISMATCH" (Error if unknown)."""
    return _BY_CODE.get(code, Error)
