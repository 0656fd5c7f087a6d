#!/usr/bin/env bash
# libbatchwire exports its public API (bw_*) and nothing else: internals (bw__*), the
# protobuf-c code and everything else stay hidden.
set -euo pipefail
lib=$1
syms=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | grep -v '^_' | sort)
bad=$(echo "$syms" | grep -v '^bw_[a-z]' || true)
bad+=$(echo "$syms" | grep '^bw__' || true)
if [ -n "$bad" ]; then
    echo "exports: libbatchwire exports symbols outside its public API:" >&2
    echo "$bad" >&2
    exit 1
fi
for want in bw_version bw_strerror bw_err_name bw_set_log_callback; do
    # A here-string, not a pipe: under pipefail, grep -q leaving at its first match could
    # kill the echo feeding it with SIGPIPE and fail the check on a loaded machine.
    grep -qx "$want" <<<"$syms" || { echo "exports: $want is not exported" >&2; exit 1; }
done
echo "exports: $(echo "$syms" | wc -l) public symbols, all bw_*"
