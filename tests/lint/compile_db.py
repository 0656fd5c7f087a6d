#!/usr/bin/python3
"""The compile commands of a build for the static analyzers (tests/lint/tidy.sh, cppcheck.sh).

  compile_db.py BUILD_DIR SOURCE_DIR OUT_DIR

Reads BUILD_DIR/compile_commands.json (CMake writes it: CMAKE_EXPORT_COMPILE_COMMANDS) and
writes OUT_DIR/compile_commands.json with only the project's own .c files (generated protobuf
code and anything outside SOURCE_DIR left out), each once, and without a compiler launcher
such as ccache in front of the compiler (clang-tidy would take the launcher for the compiler).
Prints those files on stdout, one a line, and on stderr the .c files tracked by git that the
build does not compile (e.g. tests/gpu/gpu_check.c without CUDA), so the caller can say what
it skipped. Exits 1 when the build has no compile_commands.json.
"""

import json
import os
import shlex
import subprocess
import sys

LAUNCHERS = {"ccache", "sccache", "distcc"}


def main():
    build, src, out = sys.argv[1:4]
    path = os.path.join(build, "compile_commands.json")
    try:
        with open(path) as f:
            db = json.load(f)
    except OSError as e:
        print("compile_db: %s: %s (configure the build with CMake first)" % (path, e.strerror),
              file=sys.stderr)
        return 1
    src = os.path.realpath(src)
    seen, kept = set(), []
    for e in db:
        f = os.path.realpath(os.path.join(e.get("directory", ""), e["file"]))
        if not f.startswith(src + os.sep) or not f.endswith(".c") or f in seen:
            continue
        if "arguments" in e:
            args = list(e["arguments"])
        else:
            args = shlex.split(e["command"])
        while args and os.path.basename(args[0]) in LAUNCHERS:
            args = args[1:]
        seen.add(f)
        # "command", not "arguments": cppcheck 2.10 drops the quotes of -DNAME=\"text\" given
        # as an argument list.
        kept.append({"directory": e["directory"], "file": f, "command": shlex.join(args)})
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "compile_commands.json"), "w") as f:
        json.dump(kept, f, indent=1)
    try:
        tracked = subprocess.run(["git", "-C", src, "ls-files", "*.c"], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        tracked = []
    for e in kept:
        print(e["file"])
    for t in tracked:
        if os.path.realpath(os.path.join(src, t)) not in seen:
            print("not compiled by this build, not analyzed: %s" % t, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
