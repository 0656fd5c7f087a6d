#!/usr/bin/env bash
# cppcheck over every project .c file that the build compiles (its compile_commands.json), with
# the warning, portability and performance checks. The baseline is zero findings. A false
# positive is suppressed on its line (`// cppcheck-suppress id` with the reason beside it) or,
# for a whole file, in tests/lint/cppcheck.supp, each line saying why.
#   tests/lint/cppcheck.sh BUILD_DIR      (ctest: lint/cppcheck; BW_LINT_JOBS processes, 2)
set -euo pipefail
src=${BW_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
build=${1:?usage: tests/lint/cppcheck.sh BUILD_DIR}
if ! command -v cppcheck >/dev/null; then
    echo "lint/cppcheck: cppcheck is not installed (scripts/test installs Debian's cppcheck)" >&2
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$src/tests/lint/compile_db.py" "$build" "$src" "$tmp" >"$tmp/files"
# cppcheck.supp: comments (#) and blank lines are ours; cppcheck gets the rest.
grep -v '^\s*\(#\|$\)' "$src/tests/lint/cppcheck.supp" | sed 's/\s*#.*$//' >"$tmp/supp" || true
t0=$(date +%s)
status=0
cppcheck --project="$tmp/compile_commands.json" -j "${BW_LINT_JOBS:-2}" --quiet \
    --enable=warning,portability,performance --error-exitcode=1 --inline-suppr \
    --suppressions-list="$tmp/supp" --library=posix --std=c11 \
    --template='{file}:{line}:{column}: {severity}: {message} [{id}]' >"$tmp/out" 2>&1 ||
    status=1
if [ $status -ne 0 ]; then
    cat "$tmp/out" >&2
    echo "lint/cppcheck: findings above in $(wc -l <"$tmp/files") files ($(($(date +%s) - t0)) s);" \
        "fix them, or suppress a false positive saying why" >&2
    exit 1
fi
echo "lint/cppcheck: $(wc -l <"$tmp/files") files clean ($(($(date +%s) - t0)) s)"
