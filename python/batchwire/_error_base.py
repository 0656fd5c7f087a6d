"""batchwire.Error, the base of every exception the binding raises (the classes for each code
are generated into errors.py from include/batchwire/batchwire.h's BW_ERR_MAP)."""

from typing import Optional

from ._cdefs import BW_INTERNAL


class Error(Exception):
    """A failure reported by libbatchwire (or by the binding, with the same codes)."""

    code = "BW_INTERNAL"
    rc = BW_INTERNAL

    def __init__(self, message: str, code: Optional[str] = None,
                 rc: Optional[int] = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        if rc is not None:
            self.rc = rc

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __str__(self) -> str:
        return "%s: %s" % (self.code, self.message)

    # Shown and pickled as batchwire.errors.Error, where programs import it from.
    __module__ = "batchwire.errors"
