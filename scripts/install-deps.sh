#!/usr/bin/env bash
# Installs everything thc builds, tests and demos with, from Debian 12's packages. Idempotent.
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config git
      libhwy-dev librandom123-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev
      libopenmpi-dev openmpi-bin libucx-dev libdpdk-dev libsodium-dev
      clang libclang-rt-14-dev
      iproute2 ethtool gnuplot-nox python3 shellcheck
      python3-dev python3-venv python3-numpy python3-mpi4py python3-pytest
      python3-torch)  # CPU PyTorch 1.13 for the DDP hook's tests (~175 MB, ~2 min to install)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y "${missing[@]}"
fi
