#!/usr/bin/env bash
# Installs everything thc builds, tests and demos with, from Debian 12's packages. Idempotent.
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config git
      libhwy-dev librandom123-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev
      libopenmpi-dev openmpi-bin libucx-dev libdpdk-dev libsodium-dev
      thrift-compiler libthrift-dev libboost-dev libboost-context-dev libjsoncpp-dev
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

# The P4 toolchain for the p4 tests (BMv2 simple_switch + simple_switch_CLI, p4c-bm2-ss, p4c's TNA
# include files), prebuilt in the project's shared folder next to the clone
# (../shared/third_party/p4-toolchain, or THC_P4_TOOLCHAIN_DIR): its runtime packages, then its
# install.sh into THC_P4_PREFIX (default /opt/thc-p4; idempotent, checks the tarballs' hashes).
# p4c is never built here. Where the folder is missing (a user's clone) the p4 tests skip and say
# why; switch_offload/p4/README.md says how to get p4c and BMv2.
P4_TOOLCHAIN=${THC_P4_TOOLCHAIN_DIR:-$(cd "$(dirname "$0")/.." && pwd)/../shared/third_party/p4-toolchain}
if [ -f "$P4_TOOLCHAIN/install.sh" ]; then
  P4_PKGS=(zstd libboost-program-options1.74.0 libgmp10 libjsoncpp25 libnanomsg5 libpcap0.8 libssl3
           libthrift-0.17.0 libxxhash0 libgc1 libboost-iostreams1.74.0 cpp python3 python3-thrift)
  p4_missing=()
  for p in "${P4_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || p4_missing+=("$p")
  done
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  if [ ${#p4_missing[@]} -gt 0 ]; then
    $SUDO apt-get update
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y "${p4_missing[@]}"
  fi
  P4_PREFIX=${THC_P4_PREFIX:-/opt/thc-p4}
  $SUDO bash "$P4_TOOLCHAIN/install.sh" "$P4_PREFIX" >/dev/null
  if [ -d "$P4_TOOLCHAIN/tofino-p4include" ]; then
    $SUDO mkdir -p "$P4_PREFIX/share/thc-p4"
    $SUDO cp -a "$P4_TOOLCHAIN/tofino-p4include" "$P4_PREFIX/share/thc-p4/"
  fi
  echo "P4 toolchain in $P4_PREFIX (CMake finds it there)"
else
  echo "note: no P4 toolchain at $P4_TOOLCHAIN: the p4 tests will skip (see switch_offload/p4/README.md)"
fi
