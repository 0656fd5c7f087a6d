#!/usr/bin/env bash
# Source lint: banned unsafe functions, and formatting by the committed .clang-format.
set -euo pipefail
cd "${BW_SOURCE_DIR:-$(dirname "$0")/../..}"
files=$(git ls-files '*.c' '*.h' 2>/dev/null || find . -name '*.[ch]' -not -path './build*')
status=0
# sprintf/strcpy/strcat/gets/atoi have no bounds or no error reporting.
if grep -nE '(^|[^_a-zA-Z0-9])(sprintf|vsprintf|strcpy|strcat|gets|atoi|atol)\s*\(' $files; then
    echo "lint: banned function used above (use snprintf, memcpy with a length, strtol...)" >&2
    status=1
fi
# Formatting is checked, never skipped: without clang-format the lint fails (scripts/test
# installs Debian's clang-format).
if command -v clang-format >/dev/null; then
    bad=$(for f in $files; do clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || echo "$f"; done)
    if [ -n "$bad" ]; then
        echo "lint: not formatted by .clang-format (run clang-format -i):" >&2
        echo "$bad" >&2
        status=1
    fi
else
    echo "lint: clang-format is not installed, so formatting cannot be checked (scripts/test" \
        "installs Debian's clang-format)" >&2
    status=1
fi
[ $status -eq 0 ] && echo "lint: $(echo "$files" | wc -w) files clean"
exit $status
