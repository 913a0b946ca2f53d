#!/usr/bin/env bash
# Live test of the switch client's DPDK channel (dpdk://): two network namespaces joined by a veth
# pair. The workers (thc_udp_worker with a dpdk:// address) run in namespace B, each its own DPDK
# process on the veth end through the af_packet vdev, each with its own IPv4 address (no kernel
# address on that end: the workers answer ARP themselves and ARP for the aggregator). Cases:
#   kernel  the UDP thc-aggregator in namespace A on a kernel address
#   dpdk    thc-aggregator-dpdk in namespace A (DPDK on both ends)
# Every worker's result must equal the exact result (thc_wl_expected), and the aggregator's final
# statistics must count exactly the elements the workers contributed.
#
#   dpdk_client_live_test.sh THC_AGGREGATOR THC_AGGREGATOR_DPDK THC_UDP_WORKER THC_WL_EXPECTED
# Exit 0: pass; 77: skipped (not root, no network namespaces or veth); anything else: failure.
set -u

if [ $# -ne 4 ]; then
  echo "usage: $0 THC_AGGREGATOR THC_AGGREGATOR_DPDK THC_UDP_WORKER THC_WL_EXPECTED" >&2
  exit 2
fi
AGG=$1
AGG_DPDK=$2
WORKER=$3
EXPECTED=$4
COUNT=${THC_DPDK_TEST_COUNT:-2000}
WORLD=3
AGG_IP=10.78.0.1
PORT=9471

TAG=thccli
# shellcheck source=../../netns/veth_pair.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../netns/veth_pair.sh"
for b in "$AGG" "$AGG_DPDK" "$WORKER" "$EXPECTED"; do
  [ -x "$b" ] || die "$b is not an executable"
done
veth_pair_up
# Checksum offloads leave UDP checksums unfilled on a veth, and af_packet hands such frames to
# DPDK as they are; the DPDK ends verify checksums, so the offloads go off (ethtool is in the
# project's dependencies).
command -v ethtool >/dev/null 2>&1 || die "ethtool is missing (scripts/install-deps.sh installs it)"
ip netns exec "$NSA" ethtool -K "$VA" tx off rx off >/dev/null 2>&1 || die "ethtool -K $VA"
ip netns exec "$NSB" ethtool -K "$VB" tx off rx off >/dev/null 2>&1 || die "ethtool -K $VB"

EXP_FILE=$TMP/expected
ELEMS_PER_RANK=$("$EXPECTED" "$WORLD" "$COUNT" "$EXP_FILE" | awk '/^elements_per_rank/ {print $2}')
[ -n "$ELEMS_PER_RANK" ] && [ -s "$EXP_FILE" ] || die "thc_wl_expected failed"

# The key file both sides hold (tenant key 1; mode 0600).
KEYS=$TMP/keys
printf '1:%s\n' "$(head -c 32 /dev/urandom | od -An -tx1 -v | tr -d ' \n')" >"$KEYS"
chmod 600 "$KEYS"

CPU0=$(awk '/^Cpus_allowed_list/ {print $2}' /proc/self/status | cut -d, -f1 | cut -d- -f1)

# run_case NAME kernel|dpdk
run_case() {
  local name=$1 kind=$2 dir=$TMP/$1
  mkdir -p "$dir"
  echo "== case $name: aggregator $kind, $WORLD DPDK workers"
  ip -n "$NSA" addr flush dev "$VA"
  if [ "$kind" = kernel ]; then
    ip -n "$NSA" addr add "$AGG_IP/24" dev "$VA" || die "address on $VA"
    ip netns exec "$NSA" "$AGG" --key-file "$KEYS" --bind "$AGG_IP" --port "$PORT" --port-file "$dir/port" \
      --stats-interval 0 --seed 42 \
      >"$dir/agg.log" 2>&1 &
  else
    ip netns exec "$NSA" "$AGG_DPDK" --no-huge -m 256 --no-pci --file-prefix="${PREFIX}agg" "--lcores=0@$CPU0" \
      --vdev="net_af_packet0,iface=$VA" -- --ip "$AGG_IP" --port "$PORT" --key-file "$KEYS" --workers 0 \
      --port-file "$dir/port" \
      --stats-interval 0 --seed 42 >"$dir/agg.log" 2>&1 &
  fi
  AGG_PID=$!
  local deadline=$((SECONDS + 30))
  while [ ! -s "$dir/port" ]; do
    kill -0 "$AGG_PID" 2>/dev/null || { cat "$dir/agg.log"; die "$name: the aggregator exited during startup"; }
    [ "$SECONDS" -lt "$deadline" ] || { cat "$dir/agg.log"; die "$name: the aggregator was not ready within 30 s"; }
    sleep 0.1
  done

  local pids=() r st bad=0
  for r in $(seq 0 $((WORLD - 1))); do
    ip netns exec "$NSB" env THC_AGGREGATOR_KEY_FILE="$KEYS" THC_DPDK_EAL="--no-huge -m 256 --no-pci --vdev=net_af_packet0,iface=$VB" \
      THC_DPDK_LOCAL="10.78.0.11+" timeout -k 5 90 "$WORKER" "dpdk://$AGG_IP:$PORT" "$r" "$WORLD" 21 "$COUNT" \
      "$dir/out.$r" >"$dir/worker.$r.log" 2>&1 &
    pids+=($!)
  done
  for r in "${!pids[@]}"; do
    wait_pid "${pids[$r]}" 100
    st=$WAIT_STATUS
    if [ "$st" != 0 ]; then
      echo "worker $r exited with $st:"
      cat "$dir/worker.$r.log"
      bad=1
    fi
  done
  kill -INT "$AGG_PID" 2>/dev/null
  wait_pid "$AGG_PID" 20
  st=$WAIT_STATUS
  AGG_PID=
  if [ "$bad" = 1 ] || [ "$st" != 0 ]; then
    echo "--- aggregator log ($name), exit status $st:"
    cat "$dir/agg.log"
    die "$name: workers or aggregator failed"
  fi
  for r in $(seq 0 $((WORLD - 1))); do
    cmp -s "$dir/out.$r" "$EXP_FILE" || die "$name: worker $r's result differs from the exact result"
  done
  local line
  line=$(grep "final stats:" "$dir/agg.log")
  [ -n "$line" ] || { cat "$dir/agg.log"; die "$name: no final stats line"; }
  echo "$line"
  line=" ${line#*final stats: }"
  local want=$((WORLD * ELEMS_PER_RANK))
  [ "$(stat "$line" elements)" = "$want" ] || die "$name: elements=$(stat "$line" elements), the workers contributed $want"
  [ "$(stat "$line" jobs_created)" = 1 ] || die "$name: jobs_created=$(stat "$line" jobs_created), want 1"
  echo "== case $name: ok"
}

run_case kernel kernel
run_case dpdk dpdk
echo "PASS"
