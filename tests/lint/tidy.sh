#!/usr/bin/env bash
# clang-tidy over every project .c file that the build compiles, with the checks of the
# committed .clang-tidy (which says why each check is on or off) and the build's own compile
# commands. The baseline is zero findings: any warning fails. A false positive is silenced on
# its line with `// NOLINT(check): why`.
#   tests/lint/tidy.sh BUILD_DIR      (ctest: lint/tidy; BW_LINT_JOBS clang-tidy processes, 2)
set -euo pipefail
src=${BW_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
build=${1:?usage: tests/lint/tidy.sh BUILD_DIR}
if ! command -v clang-tidy >/dev/null; then
    echo "lint/tidy: clang-tidy is not installed (scripts/test installs Debian's clang-tidy)" >&2
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$src/tests/lint/compile_db.py" "$build" "$src" "$tmp" >"$tmp/files"
t0=$(date +%s)
# -Wno-unknown-warning-option: the commands are GCC's; clang need not know every flag. One file
# per clang-tidy process: clang-tidy 14 given several reports va_list false positives
# (clang-analyzer-valist.Uninitialized) in every file after the first.
status=0
xargs -a "$tmp/files" -P "${BW_LINT_JOBS:-2}" -n 1 clang-tidy -p "$tmp" --quiet \
    --extra-arg=-Wno-unknown-warning-option --warnings-as-errors='*' >"$tmp/out" 2>&1 ||
    status=1
n=$(grep -c ': \(warning\|error\): ' "$tmp/out" || true)
if [ $status -ne 0 ]; then
    grep -v '^[0-9]* warnings\? \(and [0-9]* errors\? \)\?generated\.$' "$tmp/out" >&2 || true
    echo "lint/tidy: $n finding(s) above in $(wc -l <"$tmp/files") files ($(($(date +%s) - t0)) s);" \
        "fix them, or silence a false positive with // NOLINT(check): why" >&2
    exit 1
fi
echo "lint/tidy: $(wc -l <"$tmp/files") files clean ($(($(date +%s) - t0)) s)"
