#!/usr/bin/env bash
# Compiles the THC P4 programs (switch_offload/p4) with the toolchain CMake found.
#
#   p4c_check.sh v1model P4C_BM2_SS SOURCE INCLUDE_DIR OUT_JSON
#     p4c-bm2-ss must succeed without a single warning; OUT_JSON is what simple_switch runs.
#   p4c_check.sh tna P4C_BM2_SS SOURCE INCLUDE_DIR TNA_INCLUDE_DIR [P4C_BAREFOOT]
#     With p4c-barefoot (Intel's or p4c's open Tofino back end): a full Tofino compile, which must
#     succeed. Without it: p4c's front end (parser, type checker) through p4c-bm2-ss, which must
#     stop at the BMv2 back end's "main package ... match the expected model" error (a TNA
#     program is not v1model) and at nothing else; a warning from our own files fails too.
#
# Exit 0: pass; 77: skipped (the compiler is not installed; switch_offload/p4/README.md says how to
# get it); anything else: failure.
set -u
skip() {
  echo "SKIP: $*"
  exit 77
}
die() {
  echo "FAIL: $*"
  exit 1
}
[ $# -ge 5 ] || die "usage: $0 v1model|tna P4C_BM2_SS SOURCE INCLUDE_DIR OUT_JSON|TNA_INCLUDE_DIR [P4C_BAREFOOT]"
MODE=$1
P4C=$2
SRC=$3
INC=$4
OUT=$5
BAREFOOT=${6:-}
[ -f "$SRC" ] || die "$SRC missing"
SRC_DIR=$(cd "$(dirname "$SRC")/.." && pwd)
TMP=$(mktemp -d /tmp/thcp4c.XXXXXX) || die "mktemp"
trap 'rm -rf "$TMP"' EXIT

# Warnings that point into our own sources (p4c prints "file(line): [--Wwarn=...] warning: ...").
own_warnings() {
  grep -E '\[--Wwarn=[a-z_-]+\] warning:' "$1" | grep -F "$SRC_DIR" || true
}

case "$MODE" in
  v1model)
    if [ -z "$P4C" ] || [ ! -x "$P4C" ]; then
      skip "no p4c-bm2-ss: see switch_offload/p4/README.md to install the P4 toolchain"
    fi
    mkdir -p "$(dirname "$OUT")" || die "mkdir for $OUT"
    echo "running: $P4C --std p4-16 -I $INC -o $OUT.tmp $SRC"
    if ! "$P4C" --std p4-16 -I "$INC" -o "$OUT.tmp" "$SRC" >"$TMP/log" 2>&1; then
      cat "$TMP/log"
      rm -f "$OUT.tmp"
      die "p4c-bm2-ss failed on $SRC"
    fi
    cat "$TMP/log"
    if grep -q 'warning' "$TMP/log"; then
      rm -f "$OUT.tmp"
      die "p4c-bm2-ss warned (the program must compile cleanly)"
    fi
    # Replace the JSON only once it is complete: the data-plane test may read an older one.
    mv -f "$OUT.tmp" "$OUT" || die "mv $OUT"
    echo "PASS: v1model program compiled to $OUT ($(wc -c <"$OUT") bytes)"
    ;;
  tna)
    TNA_INC=$OUT
    if [ -n "$BAREFOOT" ] && [ -x "$BAREFOOT" ]; then
      echo "running the Tofino back end: $BAREFOOT --target tofino --arch tna -I $INC -o $TMP/out $SRC"
      if ! "$BAREFOOT" --target tofino --arch tna -I "$INC" -o "$TMP/out" "$SRC" >"$TMP/log" 2>&1; then
        cat "$TMP/log"
        die "p4c-barefoot failed on $SRC"
      fi
      cat "$TMP/log"
      echo "PASS: TNA program compiled by p4c-barefoot (resources: $TMP/out was removed; rerun by hand to keep it)"
      exit 0
    fi
    if [ -z "$P4C" ] || [ ! -x "$P4C" ]; then
      skip "no p4c-bm2-ss (nor p4c-barefoot): see switch_offload/p4/README.md"
    fi
    [ -f "$TNA_INC/tna.p4" ] || skip "no TNA include files (tna.p4) at '$TNA_INC': see switch_offload/p4/README.md"
    echo "p4c-barefoot not found: checking the TNA program with p4c's front end (p4c-bm2-ss)"
    echo "running: $P4C --std p4-16 -D__TARGET_TOFINO__=1 -I $INC -I $TNA_INC -o /dev/null $SRC"
    "$P4C" --std p4-16 -D__TARGET_TOFINO__=1 -I "$INC" -I "$TNA_INC" -o /dev/null "$SRC" >"$TMP/log" 2>&1
    rc=$?
    cat "$TMP/log"
    [ "$rc" != 0 ] || die "p4c-bm2-ss accepted a TNA program as v1model: the check is broken"
    errors=$(grep -c 'error:' "$TMP/log")
    expected=$(grep -c 'error: package Switch: main package .*match the expected model' "$TMP/log")
    [ "$expected" = 1 ] || die "the front end did not reach the back end's model check (see the errors above)"
    [ "$errors" = 1 ] || die "$errors errors: only the back end's model check is expected"
    w=$(own_warnings "$TMP/log")
    [ -z "$w" ] || die "warnings in our sources: $w"
    echo "PASS: TNA program passed p4c's front end (the only error is the BMv2 back end's model check)"
    ;;
  *)
    die "mode must be v1model or tna"
    ;;
esac
