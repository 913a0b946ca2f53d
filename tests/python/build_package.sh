#!/usr/bin/env bash
# ctest python_package_build: the Python package (python/) built and installed as a user would,
# into a virtual environment of Debian's python3 that sees the Debian packages (numpy, mpi4py,
# pytest, torch). The wheel is built against this build tree's libthc (thc_DIR=BUILD_DIR, not a
# second compile of libthc) and carries it; scikit-build-core and nanobind come from PyPI.
#   build_package.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
SRC=$1 BUILD=$2 WORK=$3
PY=/usr/bin/python3  # Debian's; not a pyenv or other python3 earlier on PATH
rm -rf "$WORK"
mkdir -p "$WORK"
"$PY" -m venv --system-site-packages "$WORK/venv"
VPY=$WORK/venv/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
"$VPY" -m pip wheel --no-deps -w "$WORK/dist" "$SRC/python" \
  --config-settings=cmake.define.THC_PYTHON_USE_INSTALLED=ON --config-settings=cmake.define.thc_DIR="$BUILD"
"$VPY" -m pip install --no-deps "$WORK"/dist/thc-*.whl
# NumPy's bfloat16 is ml_dtypes' (not in Debian 12); pinned to Debian's NumPy so torch and mpi4py
# keep the NumPy they were built with. Without it the bfloat16 NumPy test is skipped, saying so.
NPV=$("$VPY" -c 'import numpy; print(numpy.__version__)')
"$VPY" -m pip install "ml_dtypes" "numpy==$NPV" ||
  echo "python_package_build: ml_dtypes could not be installed; NumPy bfloat16 tests will be skipped"
cd "$WORK"
"$VPY" -c 'import thc; print("thc", thc.__version__, "from", thc.__file__)'
"$VPY" -c 'import torch; print("torch", torch.__version__)' ||
  echo "python_package_build: torch is not installed; the DDP hook tests will be skipped (Debian: python3-torch)"
