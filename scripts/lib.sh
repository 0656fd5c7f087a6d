# Shared by scripts/demo and scripts/test: install missing Debian packages, configure, build.
# shellcheck shell=bash

BW_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# What building needs (Debian 12 / Ubuntu 22.04+ package names); the default build includes
# the unit tests, hence cmocka.
BW_BUILD_PACKAGES=(gcc libc6-dev make cmake ninja-build pkg-config libgrpc-dev libprotobuf-c-dev
    protobuf-c-compiler libssl-dev openssl ca-certificates libcmocka-dev libmicrohttpd-dev
    libturbojpeg0-dev libpng-dev libzstd-dev)
# What the demo needs on top (its verifier, scripts/demo_verify.py).
BW_DEMO_PACKAGES=(python3 python3-numpy)
# What running the test suite needs on top.
# protoc builds the Python stubs the interop tests use; python3-torch is the reference the
# sampler and binding tests compare with, python3-pil and python3-torchvision the transforms'
# (tests/integration/test_transform_equiv.py); iproute2's ss shows which worker served a batch;
# prometheus brings promtool, which lints every /metrics scrape the tests take (the package
# also installs Prometheus's server, which the tests do not use); python3-venv, -setuptools,
# -wheel and -pip install the Python package offline into a venv (test_pip_install.py);
# slurmctld, slurmd, slurm-client and munge run a real single-node Slurm for the launcher's
# test (tests/slurm/). The lint tests (tests/lint/) need clang-format, clang-tidy and cppcheck
# (they fail, not skip, without them); python3-cffi and python3-mypy serve the Python
# binding's generated declarations and its type check. python3-fusepy (and its libfuse2) is
# the fault suite's stalling disk (tests/faults/stall_fs.py; run as root, libfuse mounts
# without fusermount, and the suite unmounts with umount).
BW_TEST_PACKAGES=(python3 python3-grpcio python3-protobuf protobuf-compiler python3-numpy
    python3-yaml python3-torch clang-format clang-tidy cppcheck python3-cffi python3-mypy
    iproute2 procps nftables iptables prometheus python3-venv python3-setuptools python3-wheel
    python3-pip slurmctld slurmd slurm-client munge python3-fusepy python3-pil
    python3-torchvision)
# test_k8s_manifests.py renders k8s/ with kubectl's kustomize and validates it with Node.js
# (npm's kubernetes-models, tests/k8s/package.json): Debian's kubernetes-client, nodejs and
# npm, unless a kubectl or an npm of another origin is installed (their files would clash).
command -v kubectl >/dev/null 2>&1 || BW_TEST_PACKAGES+=(kubernetes-client)
command -v npm >/dev/null 2>&1 || BW_TEST_PACKAGES+=(nodejs npm)

bw_log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

# bw_install PKG...: installs the packages that are not installed yet (sudo when not root).
bw_install() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
            missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    bw_log "installing missing packages: ${missing[*]}"
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}"
}

# bw_npm_test_deps: the manifest test's npm packages into tests/k8s/node_modules, exactly as
# tests/k8s/package-lock.json pins them (npm ci; again only when the lock file changes).
bw_npm_test_deps() {
    local dir=$BW_ROOT/tests/k8s
    [ "$dir/node_modules/.package-lock.json" -nt "$dir/package-lock.json" ] && return 0
    bw_log "installing the manifest test's npm packages into tests/k8s/node_modules"
    npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error
}

# bw_build DIR [CMAKE_ARGS...]: configures (once) and builds into DIR.
bw_build() {
    local dir=$1
    shift
    bw_log "building into ${dir#"$BW_ROOT"/}"
    cmake -S "$BW_ROOT" -B "$dir" -G Ninja "$@" >/dev/null
    cmake --build "$dir" -- -j"$(nproc)"
}
