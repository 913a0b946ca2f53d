#!/usr/bin/env bash
# The plugin's dynamic symbol table defines exactly NCCL's plugin tables, v8 to v11.
set -euo pipefail
so=${1:?usage: check_exports.sh libnccl-net-thc.so}
want="ncclCollNetPlugin_v10
ncclCollNetPlugin_v11
ncclCollNetPlugin_v8
ncclCollNetPlugin_v9
ncclNetPlugin_v10
ncclNetPlugin_v11
ncclNetPlugin_v8
ncclNetPlugin_v9"
got=$(nm -D --defined-only "$so" | awk '{print $NF}' | sort)
if [ "$got" != "$want" ]; then
  echo "FAIL: $so exports:"
  echo "$got"
  echo "expected exactly:"
  echo "$want"
  exit 1
fi
echo "OK: $so exports the 8 plugin tables and nothing else"
