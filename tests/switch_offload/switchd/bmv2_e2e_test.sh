#!/usr/bin/env bash
# The switch end to end on BMv2 (ctest p4_bmv2_e2e_workers): simple_switch running the THC v1model
# program in the switch position, thc-switchd as its control plane, real workers (thc_udp_worker:
# MAX prelude, value sums of every integer type, index sums with b = 4, 2 (five tables: table ids
# recycled) and 8, and b = 3, which a switch job sends in value form) in host namespaces behind
# switch ports. Checks, each against the exact sums (thc_wl_expected) and the software
# thc-aggregator's output for the same workload:
#   1. 4 workers on the switch: exact; the job is installed, aggregated in the data plane (its
#      counters moved, no data packet reached thc-switchd) and removed when the workers leave;
#   2. 1 % loss injected at every worker (THC_FAULT_DROP, both directions): exact;
#   3. two jobs at once (4 and 2 workers) while strangers send well-formed MAX packets of all ones
#      for the first job's first slots, from an address no job holds and from worker 0's own IP on
#      another port: both jobs exact, nothing answered to the strangers, the data plane counted
#      the drops.
#
#   bmv2_e2e_test.sh THC_SWITCHD THC_AGGREGATOR THC_UDP_WORKER THC_WL_EXPECTED THC_PROBE
# Environment: THC_SIMPLE_SWITCH, THC_P4_JSON. Root; skipped (77) otherwise or without the toolchain.
set -u
THC_SWITCHD=$1 THC_AGGREGATOR=$2 WORKER=$3 WL_EXPECTED=$4 THC_PROBE=$5
TAG=thcsw
source "$(dirname "$0")/bmv2_testbed.sh"
testbed_up 4

COUNT=3000
"$WL_EXPECTED" 4 $COUNT "$TMP/exp4" > /dev/null || die "thc_wl_expected"
"$WL_EXPECTED" 2 $COUNT "$TMP/exp2" > /dev/null || die "thc_wl_expected"

# run_workers URL JOB N NAME [HOST_OFFSET] [ENV...]: N workers of job JOB, rank r in host
# (r + HOST_OFFSET) % 4, in the background; PIDS and OUTS name them.
PIDS=() OUTS=() NAMES=()
run_workers() {
  local url=$1 job=$2 n=$3 name=$4 off=${5:-0} r
  shift 5 2>/dev/null || shift $#
  for ((r = 0; r < n; r++)); do
    ip netns exec "${HOSTNS[$(((r + off) % 4))]}" env "$@" "$WORKER" "$url" "$r" "$n" "$job" "$COUNT" "$TMP/$name.$r" \
      > "$TMP/$name.$r.log" 2>&1 &
    PIDS+=($!)
    OUTS+=("$TMP/$name.$r")
    NAMES+=("$name rank $r")
  done
}
# check_workers EXPECTED...: wait for every worker started since the last check; each output must
# equal the expected bytes of its job (one EXPECTED per worker, in start order).
check_workers() {
  local i exp exps=("$@")
  for i in "${!PIDS[@]}"; do
    wait_pid "${PIDS[$i]}" 300
    [ "$WAIT_STATUS" = 0 ] || die "${NAMES[$i]} exited $WAIT_STATUS: $(tail -n 3 "${OUTS[$i]}.log")"
    exp=${exps[$i]}
    cmp -s "${OUTS[$i]}" "$exp" || die "${NAMES[$i]}: result differs from the exact sums ($exp)"
  done
  PIDS=() OUTS=() NAMES=()
}
E4=("$TMP/exp4" "$TMP/exp4" "$TMP/exp4" "$TMP/exp4")

echo "== reference: 4 workers on the software thc-aggregator ($REF_URL)"
run_workers "$REF_URL" 11 4 ref 0
check_workers "${E4[@]}"

echo "== 1. 4 workers on the switch ($SWITCH_URL)"
before=$(switchd_stats) || die "no STATS from thc-switchd"
run_workers "$SWITCH_URL" 11 4 sw 0
check_workers "${E4[@]}"
for r in 0 1 2 3; do cmp -s "$TMP/sw.$r" "$TMP/ref.$r" || die "rank $r: switch and software aggregator differ"; done
sleep 1.5  # one counter poll
after=$(switchd_stats) || die "no STATS from thc-switchd"
echo "   $(grep -h '^rank' "$TMP"/sw.*.log | head -n 1)"
echo "   thc-switchd: $after"
[ "$(stat "$after" jobs_created)" = 1 ] || die "expected one job created: $after"
[ "$(stat "$after" jobs_freed)" = 1 ] || die "the job was not freed after every worker left: $after"
[ "$(stat "$after" drop_data_plane)" = 0 ] || die "data packets reached thc-switchd (not aggregated in the switch)"
agg=$(($(stat "$after" dp_aggregated) - $(stat "$before" dp_aggregated)))
res=$(($(stat "$after" dp_results) - $(stat "$before" dp_results)))
if [ "$agg" -le 0 ] || [ "$res" -le 0 ]; then die "the data plane counted no aggregation ($agg) or results ($res)"; fi
grep -q "worker 3 admitted" "$TMP/switchd.log" || die "thc-switchd did not log the admissions"

echo "== 2. 1 % loss at every worker"
run_workers "$SWITCH_URL" 12 4 loss 0 THC_FAULT_DROP=0.01 THC_FAULT_SEED=5
check_workers "${E4[@]}"
retx=$(grep -ho 'retransmissions=[0-9]*' "$TMP"/loss.*.log | cut -d= -f2 | awk '{s += $1} END {print s + 0}')
echo "   retransmissions over the 4 workers: $retx"
[ "${retx:-0}" -gt 0 ] || die "no retransmission under 1 % loss: the faults were not injected"

echo "== 3. two jobs at once, strangers sending for the first one"
before=$(switchd_stats) || die "no STATS"
ip netns exec "$NSX" "$THC_PROBE" inject 10.99.0.50 7000 "$SWITCH_IP" "$SW_PORT" 1 13 4 1024 4 > "$TMP/inject_x.out" 2>&1 &
INJ1=$!
ip netns exec "${HOSTNS[0]}" "$THC_PROBE" inject 10.99.0.11 7001 "$SWITCH_IP" "$SW_PORT" 1 13 4 1024 4 > "$TMP/inject_h0.out" 2>&1 &
INJ2=$!
sleep 0.5
run_workers "$SWITCH_URL" 13 4 two_a 0
run_workers "$SWITCH_URL" 14 2 two_b 1
check_workers "${E4[@]}" "$TMP/exp2" "$TMP/exp2"
wait_pid $INJ1 30
wait_pid $INJ2 30
sleep 1.5
after=$(switchd_stats) || die "no STATS"
echo "   strangers: $(cat "$TMP/inject_x.out") / worker 0's IP: $(cat "$TMP/inject_h0.out")"
echo "   thc-switchd: $after"
for f in inject_x inject_h0; do
  grep -q 'injected=[1-9]' "$TMP/$f.out" || die "$f sent nothing: $(cat "$TMP/$f.out")"
  grep -q 'replies=0' "$TMP/$f.out" || die "the switch answered a stranger ($f): $(cat "$TMP/$f.out")"
done
drops=$(($(stat "$after" dp_drop_not_admitted) - $(stat "$before" dp_drop_not_admitted)))
[ "$drops" -gt 0 ] || die "the data plane counted none of the strangers' packets as not admitted"
echo "   data-plane drops as not admitted during the run: $drops"
[ "$(stat "$after" jobs_created)" = "$(stat "$after" jobs_freed)" ] || die "jobs left installed: $after"
echo "PASS"
