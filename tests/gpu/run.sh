#!/usr/bin/env bash
# GPU check, for a machine with an NVIDIA GPU (not part of the default suite: there is no GPU
# on the development machines or in CI). Builds, starts a coordinator and two workers on
# loopback, generates a float32 .npy dataset, and runs gpu_check: every batch delivered to
# cuda:0 must equal the host batch, and the loader's copy bandwidth is printed next to a plain
# cudaMemcpy of the same bytes.
#   tests/gpu/run.sh [DEVICE]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
device=${1:-0}
cmake -S "$root" -B "$root/build" -G Ninja -DBW_CUDA=ON >/dev/null
cmake --build "$root/build" --target batchwire-coordinator batchwire-worker batchwire-cli gpu_check
bin=$root/build/bin
work=$(mktemp -d)
pids=()
trap 'kill ${pids[*]} 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir -p "$work/data" "$work/state"
"$bin/batchwire" gen --format npy --out "$work/data/img" --num-samples 4096 --shape 3,64,64 \
    --dtype float32 >/dev/null
"$bin/batchwire-coordinator" --listen 127.0.0.1:0 --state-dir "$work/state" 2>"$work/c.log" &
pids+=($!)
for i in $(seq 100); do grep -q 'listening on' "$work/c.log" && break; sleep 0.05; done
coord=$(grep -o 'listening on [^ ]*' "$work/c.log" | cut -d' ' -f3)
for i in 0 1; do
    "$bin/batchwire-worker" --coordinator "$coord" --listen 127.0.0.1:0 --data-root "$work/data" \
        --id "w$i" 2>"$work/w$i.log" &
    pids+=($!)
done
sleep 1.5
"$root/build/tests/gpu_check" "$coord" gpu-check "npy:img/*.npy" "$device" 64
