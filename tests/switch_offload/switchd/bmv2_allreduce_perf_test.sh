#!/usr/bin/env bash
# thc_allreduce_perf through the switch (ctest p4_bmv2_allreduce_perf): simple_switch with the THC
# v1model program in the switch position, thc-switchd beside it, 4 MPI ranks in a host namespace
# behind switch port 1 (one address, a UDP port each), --aggregator udp://SWITCH:9471. For THC
# (index form, b = 4) and Cnat (b = 5: value form on a switch) at SIZES, with fixed seeds: the
# accuracy (NMSE against the exact float64 allreduce, 9 digits) must equal that of the same run
# on the software thc-aggregator, lossless and (THC) with 1 % loss injected at every rank
# (THC_FAULT_DROP) -- the decoded results being identical is what makes them equal.
#
#   bmv2_allreduce_perf_test.sh THC_SWITCHD THC_AGGREGATOR THC_ALLREDUCE_PERF THC_PROBE [SIZES]
set -u
THC_SWITCHD=$1 THC_AGGREGATOR=$2 PERF=$3 THC_PROBE=$4 SIZES=${5:-"256K"}
TAG=thcar
source "$(dirname "$0")/bmv2_testbed.sh"
command -v mpirun >/dev/null 2>&1 || skip "no mpirun"
testbed_up 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader,tcp
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
# BMv2 runs the program at a few hundred packets per second: a small window of slots lets a
# quarter-megabyte call reuse every slot several times (each slot's next use after its result).
export THC_AGG_SLOTS=${THC_AGG_SLOTS:-64}

# run NAME URL SCHEME SIZE [ENV=V...]: one thc_allreduce_perf run; its NMSE to $TMP/NAME.nmse.
run() {
  local name=$1 url=$2 scheme=$3 size=$4 e x=()
  shift 4
  for e in "$@"; do x+=(-x "$e"); done
  ip netns exec "${HOSTNS[0]}" timeout 400 mpirun -np 4 --oversubscribe --bind-to none -x THC_AGGREGATOR_KEY_FILE -x THC_AGG_SLOTS \
    "${x[@]+"${x[@]}"}" "$PERF" -b "$size" -e "$size" -n 1 -w 0 -c 1 --seed 7 --scheme "$scheme" --algo ps \
    --aggregator "$url" --json "$TMP/$name.json" > "$TMP/$name.log" 2>&1 ||
    die "$name: thc_allreduce_perf failed: $(tail -n 5 "$TMP/$name.log")"
  python3 -c 'import json,sys; print(repr(json.load(open(sys.argv[1]))["rows"][0]["nmse"]))' "$TMP/$name.json" \
    > "$TMP/$name.nmse" || die "$name: no NMSE in its JSON"
  echo "   $name: $(grep -E '^ +[0-9]' "$TMP/$name.log" | head -n 1)"
}

for size in $SIZES; do
  for scheme in thc cnat; do
    echo "== $scheme $size"
    run "ref_${scheme}_$size" "$REF_URL" $scheme "$size"
    run "sw_${scheme}_$size" "$SWITCH_URL" $scheme "$size"
    variants=(sw)
    # Loss once (THC): the value form (Cnat) under loss is p4_bmv2_e2e_workers' case too.
    if [ $scheme = thc ]; then
      run "loss_${scheme}_$size" "$SWITCH_URL" $scheme "$size" THC_FAULT_DROP=0.01 THC_FAULT_SEED=3
      variants+=(loss)
    fi
    want=$(cat "$TMP/ref_${scheme}_$size.nmse")
    for v in "${variants[@]}"; do
      got=$(cat "$TMP/${v}_${scheme}_$size.nmse")
      [ "$got" = "$want" ] || die "$scheme $size ($v): NMSE $got on the switch, $want on thc-aggregator"
    done
  done
done
after=$(switchd_stats) || die "no STATS from thc-switchd"
echo "   thc-switchd: $after"
[ "$(stat "$after" drop_data_plane)" = 0 ] || die "data packets reached thc-switchd (not aggregated in the switch)"
[ "$(stat "$after" dp_aggregated)" -gt 0 ] || die "the data plane aggregated nothing"
echo "PASS"
