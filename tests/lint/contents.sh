#!/usr/bin/env bash
# libbatchwire (what trainers load, also inside the Python wheel) contains client code only.
#
# The rule: the shared library is built from client/lib and the client half of core/
# (CMakeLists.txt, BW_CORE_SRCS); everything daemon-only lives in static libraries that only
# the daemons, the CLI, tests, benches and fuzz targets link (docs/development.md, "Code
# map"). So, in `nm` of the .so (every symbol, not only the exported ones):
#  * no symbol of the daemon-only families below: the journal, daemon start-up, the RPC server
#    runtime and its handlers, the daemons' principals table, configuration tables, progress,
#    rates, dataset opening and the format readers, the jobs state, membership, the worker's
#    read path and executor, metrics;
#  * no symbol that one of the static libraries given after the .so defines (libbwdaemon.a,
#    libbwserver.a, libbwworker.a, libbwmetrics.a), so a file moved between them is caught too.
# Usage: contents.sh LIBBATCHWIRE.so [DAEMON_ONLY.a ...]
set -euo pipefail
lib=$1
shift
defined=$(nm --defined-only "$lib" | awk 'NF == 3 {print $3}' | sort -u)
families='^bw__(journal|daemon|rpc_server|rpc_fail|rpc_finish|rpc_stream_start|rpc_stream_begin'
families+='|rpc_call_(arena|peer|principal|request|cancelled)|rpc_health_check|rpc_info'
families+='|auth_(open|check|reload|allowed)|config|progress|rate|dataset|fmt|format|source'
families+='|mapping|npy|npz|tfrecord|synth|starts|jobs|membership|coordinator|state_dir|ds'
families+='|exec|req|rp|sstream|pview|wm|worker|data|metrics|counter|gauge|histogram'
families+='|tls_server_credentials|dchan_tls_server_ctx|sock_listen|proto_check)(_|$)'
bad=$(echo "$defined" | grep -E "$families" || true)
for a in "$@"; do
    theirs=$(nm --defined-only "$a" 2>/dev/null | awk 'NF == 3 && $2 ~ /^[TDBRVW]$/ {print $3}' |
        sort -u)
    bad+=$(comm -12 <(echo "$defined") <(echo "$theirs") | sed "s|\$| (defined in $(basename "$a"))|")
done
if [ -n "$bad" ]; then
    echo "contents: $(basename "$lib") contains daemon-only code:" >&2
    echo "$bad" >&2
    exit 1
fi
echo "contents: $(echo "$defined" | wc -l) symbols in $(basename "$lib"), none daemon-only"
