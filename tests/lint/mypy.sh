#!/usr/bin/env bash
# The Python binding's checks: `mypy --strict` on the package (its settings in
# python/pyproject.toml, [tool.mypy]), and the modules generated from include/batchwire/*.h
# (python/gen_bindings.py --check: a header changed without regenerating them fails here).
# Like the rest of lint, a missing tool fails rather than skips (scripts/test installs
# Debian's python3-mypy and python3-cffi).
set -euo pipefail
cd "${BW_SOURCE_DIR:-$(dirname "$0")/../..}/python"
py=${BW_PYTHON:-/usr/bin/python3}
status=0
if ! "$py" gen_bindings.py --check; then
    status=1
fi
if ! "$py" -m mypy --version >/dev/null 2>&1; then
    echo "mypy: not installed for $py (scripts/test installs Debian's python3-mypy)" >&2
    exit 1
fi
# No cache: the check reads the tree as it is, and writes nothing into it.
if ! "$py" -m mypy --cache-dir=/dev/null; then
    echo "mypy: the package does not pass mypy --strict (python/pyproject.toml)" >&2
    status=1
fi
exit $status
