#!/usr/bin/env bash
# Installs the Debian 12 packages kvferry builds and tests with, when missing.
# Safe to rerun; does nothing when everything is present. Needs root (or sudo).
#   --tests  also what the multi-host tests use (tests/multihost): test hosts
#            (iproute2, nftables, iptables), ssh into them (openssh), a Slurm cluster
#            (slurmctld, slurmd, munge), and pip for the PyPI package
#            kubernetes-validate (tests/deploy/test_k8s_manifests.py), and clang
#            with its libFuzzer/sanitizer runtime and llvm-symbolizer for the
#            fuzz targets (tests/fuzz), and Prometheus (its server and promtool evaluate
#            the Grafana dashboard and the alert rules, tests/deploy/prom_server.py).
#            tests/run.sh passes it.
# UCX with CUDA: Debian's UCX 1.13 cannot reach CUDA memory, so CUDA builds use the UCX
# of the PyPI wheel libucx-cu13 (headers, pkg-config files, libraries, lib/ucx/ modules
# cuda_copy / cuda_ipc, and the libcudart its libucm_cuda loads, in libucx_cu13.libs/).
# It is installed with pip --target into KVF_UCX_WHEEL_DIR (default
# /opt/kvferry/ucx-cu13), where CMake looks for it (CMakeLists.txt, KVF_UCX_PREFIX),
# when nvcc is found, with --tests (tests/run.sh builds the transfer tests against it
# too), or with --ucx-cuda. pip's own PIP_FIND_LINKS / PIP_INDEX_URL apply.
set -euo pipefail
ucx_wheel_dir="${KVF_UCX_WHEEL_DIR:-/opt/kvferry/ucx-cu13}"
ucx_wheel_req="libucx-cu13==1.22.0"
want_ucx_wheel=0
if [ "${1:-}" = "--tests" ] || [ "${1:-}" = "--ucx-cuda" ] || command -v nvcc >/dev/null 2>&1 ||
   [ -x /usr/local/cuda/bin/nvcc ]; then
    want_ucx_wheel=1
fi
pkgs=(build-essential cmake pkg-config git python3
      libucx-dev ucx-utils libprotobuf-c-dev protobuf-c-compiler libzmq3-dev libxxhash-dev libcjson-dev libpcre2-dev
      libopenblas-dev libmicrohttpd-dev libmsgpack-dev libcmocka-dev curl procps
      gnuplot-nox)   # gnuplot: kvf tune's plot
if [ "${1:-}" = "--tests" ]; then
    pkgs+=(iproute2 nftables iptables openssh-server openssh-client slurm-wlm slurmctld slurmd
           slurm-client munge python3-pip python3-yaml clang libclang-rt-dev llvm
           openssl    # openssl: test_proxy_edge's self-signed certificate
           prometheus    # prometheus, promtool: dashboards and alert rules (tests/deploy)
           python3-zmq python3-msgpack)   # test_e2e_kv_events: a vLLM-style KV event subscriber
fi
if [ $want_ucx_wheel = 1 ]; then
    pkgs+=(python3-pip)
fi
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
if [ ${#missing[@]} -gt 0 ]; then
    echo "kvferry: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
ucx_pc="$ucx_wheel_dir/libucx/lib/pkgconfig/ucx.pc"
if [ $want_ucx_wheel = 1 ] && ! grep -qx "Version: ${ucx_wheel_req##*==}" "$ucx_pc" 2>/dev/null; then
    echo "kvferry: installing $ucx_wheel_req into $ucx_wheel_dir (UCX with CUDA)"
    # --target installs outside any Python environment (PEP 668 does not apply there);
    # the second try is for a pip that still refuses
    $SUDO python3 -m pip install -q --upgrade --no-deps --root-user-action=ignore --target "$ucx_wheel_dir" \
        "$ucx_wheel_req" ||
        $SUDO python3 -m pip install -q --upgrade --no-deps --root-user-action=ignore --break-system-packages \
            --target "$ucx_wheel_dir" "$ucx_wheel_req"
    grep -qx "Version: ${ucx_wheel_req##*==}" "$ucx_pc" || {
        echo "kvferry: $ucx_wheel_req did not install a UCX at $ucx_pc" >&2
        exit 1
    }
fi
