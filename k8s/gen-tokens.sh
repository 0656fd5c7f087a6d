#!/usr/bin/env bash
# Writes the bearer tokens that k8s/base/kustomization.yaml turns into Secrets
# (docs/security.md, docs/deploy.md): k8s/base/auth/tokens (the principals file,
# `ROLE NAME TOKEN [ids=PATTERN]`), and the tokens of the admin ("ops"), worker ("storage",
# bound to the worker ids batchwire-worker-*: the StatefulSet's pod names) and trainer
# ("trainer") principals, each 32 random bytes in hex, and the read grants' key shared by the
# coordinator and the workers (grant.key, `KEYID HEX`; docs/security.md, "Read grants"), in
# files readable by you only. An existing k8s/base/auth/ is kept unless --force.
#   k8s/gen-tokens.sh [--force] [DIR]      (DIR: default k8s/base/auth)
set -euo pipefail
force=0
[ "${1:-}" = --force ] && force=1 && shift
dir=${1:-$(cd "$(dirname "$0")" && pwd)/base/auth}
if [ -e "$dir/tokens" ] && [ $force -eq 0 ]; then
    echo "gen-tokens.sh: $dir/tokens exists; keeping it (--force writes new tokens: then" \
        "kubectl apply -k again, which restarts the pods with them)" >&2
    exit 0
fi
umask 077
mkdir -p "$dir"
chmod 700 "$dir"
token() { od -An -N32 -tx1 /dev/urandom | tr -d ' \n'; }
admin=$(token) worker=$(token) trainer=$(token)
printf '# role name token [ids=PATTERN] (docs/security.md)\nadmin ops %s\n%s\ntrainer trainer %s\n' \
    "$admin" "worker storage $worker ids=batchwire-worker-*" "$trainer" >"$dir/tokens"
printf '%s\n' "$admin" >"$dir/admin.token"
printf '%s\n' "$worker" >"$dir/worker.token"
printf '%s\n' "$trainer" >"$dir/trainer.token"
printf 'k1 %s\n' "$(token)" >"$dir/grant.key"
echo "gen-tokens.sh: wrote $dir/{tokens,admin.token,worker.token,trainer.token,grant.key}"
