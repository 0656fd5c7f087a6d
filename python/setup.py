"""Builds the batchwire wheel with libbatchwire.so inside (pyproject.toml has the metadata).

The library is the one the README's build made: $BATCHWIRE_LIB when set, else
../build/lib/libbatchwire.so next to this directory. It is copied into the package as
batchwire/libbatchwire.so, where the binding looks first after $BATCHWIRE_LIB
(batchwire/_lib.py), so an installed package needs no environment variable. The wheel is
tagged for this platform, since it carries a shared library.
"""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def library():
    env = os.environ.get("BATCHWIRE_LIB")
    path = env or os.path.join(os.path.dirname(HERE), "build", "lib", "libbatchwire.so")
    if not os.path.isfile(path):
        raise SystemExit(
            "batchwire: libbatchwire.so not found at %s%s. Build it first (README: "
            "./scripts/demo, or cmake -S . -B build && cmake --build build), or set "
            "BATCHWIRE_LIB to the library to bundle" %
            (path, " (BATCHWIRE_LIB)" if env else ""))
    return os.path.realpath(path)


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        dest = os.path.join(self.build_lib, "batchwire", "libbatchwire.so")
        self.copy_file(library(), dest, preserve_mode=True)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True  # a platform wheel: it carries libbatchwire.so


if __name__ == "__main__":
    shutil.rmtree(os.path.join(HERE, "build"), ignore_errors=True)  # no stale library
    setup(cmdclass={"build_py": BuildWithLibrary}, distclass=BinaryDistribution)
