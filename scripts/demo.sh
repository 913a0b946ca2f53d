#!/usr/bin/env bash
# Install dependencies, build, and run the demo: 4 MPI ranks allreduce the same synthetic
# gradients with float32, THC and Cnat and print time, bytes on the wire per element and NMSE.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTHC_BUILD_TESTS=OFF
cmake --build build --target thc_demo thc_inproc_demo
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
mpirun --oversubscribe --bind-to none -np 4 build/examples/thc_demo "$@"
