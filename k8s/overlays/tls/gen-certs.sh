#!/usr/bin/env bash
# Writes the certificates k8s/overlays/tls turns into Secrets (docs/deploy.md, "TLS"): a CA
# (certs/ca.crt; its key certs/ca.key stays here, to issue more) and one certificate for the
# coordinator and the workers (certs/tls.crt, certs/tls.key; P-256, 365 days) naming the
# addresses clients dial in NAMESPACE: batchwire-coordinator[.NAMESPACE[.svc[.cluster.local]]],
# *.batchwire-worker.NAMESPACE.svc[.cluster.local] (the addresses the placement gives: each
# worker pod advertises $(POD_NAME).batchwire-worker.NAMESPACE.svc, and trainers and the
# coordinator refuse a worker whose certificate does not name it; docs/security.md, "Worker
# certificates"), and batchwire-worker (the probes' --tls-server-name). Server and client
# use: a worker presents it to the coordinator too. One key for every pod: any pod can stand
# in for another whose traffic it receives; for a key per pod see that section. Kept unless
# --force.
#   k8s/overlays/tls/gen-certs.sh [--force] NAMESPACE [DIR]      (DIR: default ./certs)
set -euo pipefail
force=0
[ "${1:-}" = --force ] && force=1 && shift
if [ $# -lt 1 ]; then
    echo "usage: gen-certs.sh [--force] NAMESPACE [DIR]" >&2
    exit 2
fi
ns=$1
dir=${2:-$(cd "$(dirname "$0")" && pwd)/certs}
if [ -e "$dir/tls.crt" ] && [ $force -eq 0 ]; then
    echo "gen-certs.sh: $dir/tls.crt exists; keeping it (--force writes new ones)" >&2
    exit 0
fi
umask 077
mkdir -p "$dir"
cd "$dir"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -keyout ca.key -out ca.crt -subj /CN=batchwire-ca 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout tls.key -out tls.csr \
    -subj /CN=batchwire 2>/dev/null
c=batchwire-coordinator w=batchwire-worker
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' \
    "DNS:$c,DNS:$c.$ns,DNS:$c.$ns.svc,DNS:$c.$ns.svc.cluster.local,DNS:$w,DNS:*.$w.$ns.svc,DNS:*.$w.$ns.svc.cluster.local" \
    >tls.ext
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 \
    -extfile tls.ext -out tls.crt 2>/dev/null
rm -f tls.csr tls.ext ca.srl
echo "gen-certs.sh: wrote $dir/{ca.crt,ca.key,tls.crt,tls.key} for namespace $ns"
