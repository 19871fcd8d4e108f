#!/usr/bin/env bash
# Installs the Debian 12 packages kvferry builds and tests with, when missing.
# Safe to rerun; does nothing when everything is present. Needs root (or sudo).
#   --tests  also what the multi-host tests use (tests/multihost): test hosts
#            (iproute2, nftables, iptables), ssh into them (openssh), a Slurm cluster
#            (slurmctld, slurmd, munge), and pip for the PyPI package
#            kubernetes-validate (tests/deploy/test_k8s_manifests.py), and clang
#            with its libFuzzer/sanitizer runtime and llvm-symbolizer for the
#            fuzz targets (tests/fuzz).
#            tests/run.sh passes it.
set -euo pipefail
pkgs=(build-essential cmake pkg-config git python3
      libucx-dev ucx-utils libprotobuf-c-dev protobuf-c-compiler libzmq3-dev libxxhash-dev libcjson-dev libpcre2-dev
      libopenblas-dev libmicrohttpd-dev libcmocka-dev curl procps
      gnuplot-nox)   # gnuplot: kvf tune's plot
if [ "${1:-}" = "--tests" ]; then
    pkgs+=(iproute2 nftables iptables openssh-server openssh-client slurm-wlm slurmctld slurmd
           slurm-client munge python3-pip python3-yaml clang libclang-rt-dev llvm
           openssl)   # openssl: test_proxy_edge's self-signed certificate
fi
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
echo "kvferry: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
