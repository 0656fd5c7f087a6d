"""python -m batchwire --version: the package's version and the library it loads."""

import argparse
import sys

from typing import Optional, Sequence

from . import build_info, library_path
from ._version import __version__
from .errors import Error


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m batchwire",
        description="The batchwire Python package (python/README.md). --version prints its "
                    "version and the libbatchwire it loads (path and build).")
    ap.add_argument("--version", action="store_true",
                    help="print the package's version and the library's, with its path")
    args = ap.parse_args(argv)
    if not args.version:
        ap.print_help()
        return 0
    print("batchwire %s (Python package)" % __version__)
    try:
        print("libbatchwire %s (%s)" % (build_info(), library_path()))
    except Error as e:
        print("libbatchwire: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
