#!/usr/bin/env bash
# ctest python_package_tests: pytest of python/tests in the environment python_package_build made,
# from outside the source tree (import thc is the installed wheel). Skips print their reasons (-rs).
#   run_pytest.sh SOURCE_DIR WORK_DIR [pytest args]
set -euo pipefail
SRC=$1 WORK=$2
shift 2
cd "$WORK"
PYTHONDONTWRITEBYTECODE=1 exec "$WORK/venv/bin/python" -m pytest -p no:cacheprovider -rs -v "$SRC/python/tests" "$@"
