#!/usr/bin/env bash
# The BMv2 testbed of the P4 data-plane test: simple_switch in a namespace of its own, whose ports
# are veths into one namespace per worker (ports 1..4) and one for the CPU port (port 0, where
# thc-switchd's interface would hold the switch IP). Then runs the test program (gtest), which
# installs entries with simple_switch_CLI and sends and receives in the namespaces, and cleans
# everything up, whatever happens.
#
#   bmv2_testbed.sh SIMPLE_SWITCH SIMPLE_SWITCH_CLI P4_JSON TEST_PROGRAM [test args...]
#
# Exit 0: pass; 77: skipped (not root, no simple_switch / p4c output / network namespaces, or
# simple_switch_CLI cannot run); anything else: failure. THC_P4_SWITCH_LOG=PATH makes
# simple_switch log every packet (slow) to PATH.txt; its tail is printed on failure. The test
# program gets THC_P4_TEST_DEADLINE seconds (default 480), so a hung switch ends in a failure with
# cleanup, before ctest's own timeout kills everything without one.
set -u

skip() {
  echo "SKIP: $*"
  exit 77
}
die() {
  echo "FAIL: $*"
  exit 1
}

[ $# -ge 4 ] || die "usage: $0 SIMPLE_SWITCH SIMPLE_SWITCH_CLI P4_JSON TEST_PROGRAM [args...]"
SS=$1
CLI=$2
JSON=$3
PROG=$4
shift 4

[ "$(id -u)" = 0 ] || skip "not root: the test needs network namespaces and veth pairs"
command -v ip >/dev/null 2>&1 || skip "no 'ip' command (iproute2)"
if [ -z "$SS" ] || [ ! -x "$SS" ]; then
  skip "no simple_switch (BMv2): see switch_offload/p4/README.md to install the P4 toolchain"
fi
if [ -z "$CLI" ] || [ ! -x "$CLI" ]; then skip "no simple_switch_CLI (BMv2)"; fi
[ -s "$JSON" ] || skip "$JSON missing: the p4_v1model_compile test (p4c-bm2-ss) did not produce it"
[ -x "$PROG" ] || die "$PROG is not an executable"
"$CLI" --help >/dev/null 2>&1 || skip "simple_switch_CLI does not run (its Python needs python3-thrift)"

# Namespaces of an earlier run that was killed outright (ctest's timeout kills without a trap):
# ours by prefix, and only when the run that made them (the pid in the name) is gone.
for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^thcp4-[a-z0-9]+-[0-9]+$/ {print $1}'); do
  owner=${ns##*-}
  if ! kill -0 "$owner" 2>/dev/null; then
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null && echo "removed $ns, left by a killed run"
  fi
done

ID=$$
NS_SW=thcp4-sw-$ID
NS_CPU=thcp4-cpu-$ID
WORKERS=4
NS_W=()
for i in $(seq 0 $((WORKERS - 1))); do NS_W+=("thcp4-w$i-$ID"); done
SS_PID=
TMP=$(mktemp -d /tmp/thcp4.XXXXXX) || die "mktemp"
MADE=()

# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$SS_PID" ] && kill -0 "$SS_PID" 2>/dev/null; then
    kill -TERM "$SS_PID" 2>/dev/null
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$SS_PID" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$SS_PID" 2>/dev/null
  fi
  local ns p
  for ns in "${MADE[@]}"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  done
  wait 2>/dev/null
  for ns in "${MADE[@]}"; do ip netns del "$ns" 2>/dev/null; done
  if [ "$rc" != 0 ] && [ "$rc" != 77 ]; then
    local f
    for f in "${THC_P4_SWITCH_LOG:-/nonexistent}"*.txt; do
      [ -s "$f" ] || continue
      echo "--- simple_switch log $f (tail) ---"
      tail -n 80 "$f"
    done
  fi
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkns() {
  ip netns add "$1" 2>"$TMP/err" || skip "ip netns add failed: $(cat "$TMP/err")"
  MADE+=("$1")
  ip -n "$1" link set lo up || die "lo up in $1"
  # No IPv6 chatter (router solicitations, MLD): the switch would count it as non-IPv4 drops.
  ip netns exec "$1" sh -c 'echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6' 2>/dev/null
}

SUBNET=10.99.0
SWITCH_IP=$SUBNET.1
ROUTER_MAC=02:00:00:00:00:01  # the switch's MAC as hosts see it (ipv4_fwd's smac)
CPU_MAC=02:00:00:00:00:10
mkns "$NS_SW"
mkns "$NS_CPU"
for ns in "${NS_W[@]}"; do mkns "$ns"; done

# port 0: CPU; port 1 + i: worker i. Interface names carry the pid (they exist briefly before the
# move into the namespace on some kernels).
SS_IFACES=()
link() {  # link PORT NS HOSTIF MAC IP
  local port=$1 ns=$2 hif=$3 mac=$4 ipa=$5
  local sif=t4s${port}x$ID
  ip link add "$sif" netns "$NS_SW" type veth peer name "$hif" netns "$ns" 2>"$TMP/err" ||
    skip "cannot create a veth pair: $(cat "$TMP/err")"
  ip -n "$ns" link set "$hif" address "$mac" || die "mac on $hif"
  ip -n "$ns" addr add "$ipa/24" dev "$hif" || die "address on $hif"
  ip -n "$ns" link set "$hif" up || die "link up $hif"
  ip -n "$NS_SW" link set "$sif" up || die "link up $sif"
  # The kernel would leave UDP checksums to the NIC; simple_switch forwards frames as it reads
  # them, so the receiver would see unfilled checksums (only forwarded packets matter: RESULTs
  # carry checksum 0). Without ethtool the forwarding test fails, which says why.
  if command -v ethtool >/dev/null 2>&1; then
    ip netns exec "$ns" ethtool -K "$hif" tx off >/dev/null 2>&1 || die "ethtool -K $hif tx off"
  fi
  SS_IFACES+=(-i "$port@$sif")
}
link 0 "$NS_CPU" cpu0 "$CPU_MAC" "$SWITCH_IP"
WORKER_IPS=()
WORKER_MACS=()
for i in $(seq 0 $((WORKERS - 1))); do
  WORKER_IPS+=("$SUBNET.$((11 + i))")
  WORKER_MACS+=("02:00:00:00:01:0$i")
  link $((1 + i)) "${NS_W[$i]}" eth0 "${WORKER_MACS[$i]}" "${WORKER_IPS[$i]}"
done
# A second address on worker 0's interface: a stranger on the same host as a worker.
STRANGER_IP=$SUBNET.111
ip -n "${NS_W[0]}" addr add "$STRANGER_IP/24" dev eth0 || die "stranger address"

# Static neighbours: every host reaches every other through the switch's MAC (no ARP on BMv2).
for i in $(seq 0 $((WORKERS - 1))); do
  ip -n "${NS_W[$i]}" neigh replace "$SWITCH_IP" lladdr "$ROUTER_MAC" dev eth0 nud permanent || die "neigh"
  ip -n "$NS_CPU" neigh replace "${WORKER_IPS[$i]}" lladdr "$ROUTER_MAC" dev cpu0 nud permanent || die "neigh"
  ip -n "$NS_CPU" neigh replace "$STRANGER_IP" lladdr "$ROUTER_MAC" dev cpu0 nud permanent || die "neigh"
done

LOG_OPT=()
if [ -n "${THC_P4_SWITCH_LOG:-}" ]; then LOG_OPT=(--log-file "$THC_P4_SWITCH_LOG" --log-flush); fi
ip netns exec "$NS_SW" "$SS" --device-id 0 --thrift-port 9090 --notifications-addr "ipc://$TMP/notifications.ipc" "${SS_IFACES[@]}" "${LOG_OPT[@]}" "$JSON" \
  >"$TMP/switch.out" 2>&1 &
SS_PID=$!
ready=0
for _ in $(seq 1 300); do
  kill -0 "$SS_PID" 2>/dev/null || { cat "$TMP/switch.out"; die "simple_switch exited at start"; }
  if ip netns exec "$NS_SW" bash -c 'exec 3<>/dev/tcp/127.0.0.1/9090' 2>/dev/null; then ready=1; break; fi
  sleep 0.1
done
[ "$ready" = 1 ] || die "simple_switch's Thrift port did not open within 30 s"

export THC_P4_NS_SW=$NS_SW THC_P4_NS_CPU=$NS_CPU THC_P4_CLI=$CLI THC_P4_THRIFT_PORT=9090
export THC_P4_SWITCH_IP=$SWITCH_IP THC_P4_ROUTER_MAC=$ROUTER_MAC THC_P4_CPU_MAC=$CPU_MAC THC_P4_CPU_PORT=0
export THC_P4_STRANGER_IP=$STRANGER_IP
THC_P4_NS_W=$(IFS=,; echo "${NS_W[*]}")
THC_P4_WORKER_IPS=$(IFS=,; echo "${WORKER_IPS[*]}")
THC_P4_WORKER_MACS=$(IFS=,; echo "${WORKER_MACS[*]}")
export THC_P4_NS_W THC_P4_WORKER_IPS THC_P4_WORKER_MACS
timeout --signal=TERM --kill-after=10 "${THC_P4_TEST_DEADLINE:-480}" "$PROG" "$@"
rc=$?
[ "$rc" = 124 ] && echo "FAIL: the test program ran past ${THC_P4_TEST_DEADLINE:-480} s"
kill -0 "$SS_PID" 2>/dev/null || { echo "simple_switch died during the test:"; cat "$TMP/switch.out"; [ $rc = 0 ] && rc=1; }
exit $rc
