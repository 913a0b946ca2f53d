#!/usr/bin/env bash
# compile_v1model.sh P4_DIR OUT.json: the THC v1model program for BMv2 (the p4 tests' fixture).
# Exit 77 (skip) when p4c-bm2-ss is not installed.
set -u
P4_DIR=$1
OUT=$2
P4C=${THC_P4C_BM2_SS:-}
[ -n "$P4C" ] && [ -x "$P4C" ] || P4C=$(command -v p4c-bm2-ss || true)
if [ -z "$P4C" ]; then
  echo "SKIP: p4c-bm2-ss not found (install the P4 toolchain: switch_offload/p4/README.md); the BMv2 tests skip"
  rm -f "$OUT"
  exit 77
fi
SRC=$P4_DIR/v1model/thc_v1model.p4
[ -f "$SRC" ] || { echo "FAIL: $SRC missing"; exit 1; }
rm -f "$OUT"
echo "$P4C --std p4-16 -I $P4_DIR/include -o $OUT $SRC"
"$P4C" --std p4-16 -I "$P4_DIR/include" -o "$OUT.tmp" "$SRC" || { echo "FAIL: p4c-bm2-ss failed"; exit 1; }
mv "$OUT.tmp" "$OUT"
