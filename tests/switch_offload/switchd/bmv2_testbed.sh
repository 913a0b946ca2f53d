# shellcheck shell=bash
# shellcheck disable=SC2034  # WAIT_STATUS, SWITCH_URL, REF_URL, ...: for the scripts that source this
# Sourced by the switch end-to-end tests: BMv2's simple_switch in the switch position of a
# namespace testbed, thc-switchd beside it, and host namespaces whose links are switch ports.
#
#   TAG=thcsw; source bmv2_testbed.sh; testbed_up NHOSTS     # needs THC_P4_JSON, THC_SWITCHD, ...
#
#   $NSS  the switch: simple_switch with ports 1..NHOSTS (a veth to each host), port 9 (a veth to
#         the stranger's namespace $NSX) and port 15, the CPU port: a veth to "cpu", the kernel
#         interface that holds the switch's address 10.99.0.1, where thc-switchd (and, as the
#         reference, a software thc-aggregator on port 9472, reached through the switch's plain
#         IPv4 forwarding) listen. simple_switch's Thrift server is 127.0.0.1:9090 there.
#   host i (namespace ${HOSTNS[i]}, i = 0..NHOSTS-1): eth0 10.99.0.(11+i), MAC 02:00:00:00:00:(11+i)
#   $NSX  the stranger: eth0 10.99.0.50, on switch port 9, installed in no job
#
# Static neighbour entries (the program forwards IPv4 only); checksum offloads off on the kernel
# ends (a veth leaves locally sent UDP checksums to the NIC, which simple_switch is not), IPv6
# off. Provides skip (exit 77), die, stat, wait_pid, hosts_run, switchd_stats; a trap kills
# everything in the namespaces and deletes them and $TMP.

skip() {
  echo "SKIP: $*"
  exit 77
}
die() {
  echo "FAIL: $*"
  [ -n "${TMP:-}" ] && for f in "$TMP"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 30 "$f"; }; done
  exit 1
}

ID=$$
NSS=${TAG}-s-$ID
NSX=${TAG}-x-$ID
HOSTNS=()
SWITCH_IP=10.99.0.1
SWITCH_MAC=02:54:48:43:00:01
CPU_MAC=02:00:00:00:00:01
SW_PORT=9471
REF_PORT=9472
CPU_PORT=15
TMP=
NS_LIST=()
# More thc-switchd options (a script sets them before testbed_up).
SWITCHD_EXTRA=("${SWITCHD_EXTRA[@]}")

cleanup() {
  local rc=$? ns p
  trap - EXIT INT TERM
  for ns in "${NS_LIST[@]}"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  done
  wait 2>/dev/null
  for ns in "${NS_LIST[@]}"; do ip netns del "$ns" 2>/dev/null; done
  [ -n "$TMP" ] && [ -z "${THC_KEEP_TMP:-}" ] && rm -rf "$TMP"
  exit "$rc"
}

# stat LINE NAME: NAME=... of a "name=value ..." line (0 when absent).
stat() {
  local v
  v=$(printf ' %s\n' "$1" | grep -o " $2=[0-9]*" | head -n 1 | cut -d= -f2)
  echo "${v:-0}"
}

WAIT_STATUS=
wait_pid() {
  local pid=$1 deadline=$((SECONDS + $2))
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      kill -KILL "$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
      WAIT_STATUS=124
      return
    fi
    sleep 0.1
  done
  wait "$pid"
  WAIT_STATUS=$?
}

mkns() {
  ip netns add "$1" 2>"$TMP/err" || skip "ip netns add failed: $(cat "$TMP/err")"
  NS_LIST+=("$1")
  ip -n "$1" link set lo up
  ip netns exec "$1" sh -c 'echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6' 2>/dev/null
}

# host_link NS PORT IP MAC: a host namespace's eth0 on switch port PORT.
host_link() {
  local ns=$1 port=$2 ip=$3 mac=$4
  ip link add "s$port" netns "$NSS" type veth peer name eth0 netns "$ns" 2>"$TMP/err" ||
    skip "cannot create a veth pair: $(cat "$TMP/err")"
  ip -n "$ns" link set eth0 address "$mac"
  ip -n "$ns" addr add "$ip/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$NSS" link set "s$port" up
  ip netns exec "$ns" ethtool -K eth0 tx off rx off >/dev/null 2>&1 || die "ethtool -K eth0 tx off in $ns"
  echo "$ip,$port,$mac" >> "$TMP/routes"
}

testbed_up() {
  local n=$1 i
  [ "$(id -u)" = 0 ] || skip "not root: the testbed needs network namespaces and veth pairs"
  for t in ip ethtool timeout; do command -v $t >/dev/null 2>&1 || skip "no '$t' command"; done
  if [ -z "${THC_SIMPLE_SWITCH:-}" ] || [ ! -x "$THC_SIMPLE_SWITCH" ]; then
    skip "no simple_switch (the P4 toolchain is not installed: switch_offload/p4/README.md)"
  fi
  if [ -z "${THC_P4_JSON:-}" ] || [ ! -f "$THC_P4_JSON" ]; then
    skip "no compiled v1model program (${THC_P4_JSON:-}; p4c-bm2-ss missing: switch_offload/p4/README.md)"
  fi
  TMP=$(mktemp -d "/tmp/${TAG}_bmv2.XXXXXX") || die "mktemp"
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  : > "$TMP/routes"
  mkns "$NSS"
  for ((i = 0; i < n; i++)); do
    HOSTNS+=("${TAG}-h$i-$ID")
    mkns "${HOSTNS[$i]}"
    host_link "${HOSTNS[$i]}" $((i + 1)) 10.99.0.$((11 + i)) 02:00:00:00:00:$((11 + i))
  done
  mkns "$NSX"
  host_link "$NSX" 9 10.99.0.50 02:00:00:00:00:50
  # The CPU port: simple_switch's port 15 and thc-switchd's interface, both in the switch namespace.
  ip -n "$NSS" link add "s$CPU_PORT" type veth peer name cpu || die "cpu veth"
  ip -n "$NSS" link set cpu address "$CPU_MAC"
  ip -n "$NSS" addr add "$SWITCH_IP/24" dev cpu
  ip -n "$NSS" link set cpu up
  ip -n "$NSS" link set "s$CPU_PORT" up
  ip netns exec "$NSS" ethtool -K cpu tx off rx off >/dev/null 2>&1 || die "ethtool -K cpu tx off"
  echo "$SWITCH_IP,$CPU_PORT,$CPU_MAC" >> "$TMP/routes"
  # Neighbours: every address is reached through the switch, which rewrites the MACs.
  local ips=(10.99.0.50) ns
  for ((i = 0; i < n; i++)); do ips+=(10.99.0.$((11 + i))); done
  for ip in "${ips[@]}"; do ip -n "$NSS" neigh replace "$ip" lladdr "$SWITCH_MAC" dev cpu nud permanent; done
  for ns in "${HOSTNS[@]}" "$NSX"; do
    for ip in "$SWITCH_IP" "${ips[@]}"; do ip -n "$ns" neigh replace "$ip" lladdr "$SWITCH_MAC" dev eth0 nud permanent; done
  done

  local ports=()
  for ((i = 1; i <= n; i++)); do ports+=(-i "$i@s$i"); done
  ip netns exec "$NSS" "$THC_SIMPLE_SWITCH" --thrift-port 9090 --device-id $((ID % 10000 + 1000)) \
    --notifications-addr "ipc://$TMP/bmv2-notifications.ipc" "${ports[@]}" -i 9@s9 -i "$CPU_PORT@s$CPU_PORT" \
    "$THC_P4_JSON" > "$TMP/simple_switch.log" 2>&1 &
  local t=0
  until ip netns exec "$NSS" timeout 1 bash -c 'exec 3<>/dev/tcp/127.0.0.1/9090' 2>/dev/null; do
    sleep 0.2
    t=$((t + 1))
    [ $t -lt 150 ] || die "simple_switch did not start: $(tail -n 5 "$TMP/simple_switch.log")"
  done
  THC_KEYS=$TMP/keys
  export THC_AGGREGATOR_KEY_FILE=$THC_KEYS
  ip netns exec "$NSS" "$THC_SWITCHD" --key-file "$THC_KEYS" --create-key-file --ip "$SWITCH_IP" \
    --port "$SW_PORT" --routes "$TMP/routes" --switch-mac "$SWITCH_MAC" --thrift 127.0.0.1:9090 --seed 1 \
    --stats-interval 0 --port-file "$TMP/switchd.port" "${SWITCHD_EXTRA[@]}" > "$TMP/switchd.log" 2>&1 &
  SWITCHD_PID=$!
  t=0
  until [ -s "$TMP/switchd.port" ]; do
    kill -0 "$SWITCHD_PID" 2>/dev/null || die "thc-switchd exited: $(tail -n 5 "$TMP/switchd.log")"
    sleep 0.1
    t=$((t + 1))
    [ $t -lt 300 ] || die "thc-switchd did not start"
  done
  ip netns exec "$NSS" "$THC_AGGREGATOR" --key-file "$THC_KEYS" --bind "$SWITCH_IP" --port "$REF_PORT" --seed 1 \
    --stats-interval 0 --port-file "$TMP/ref.port" > "$TMP/thc-aggregator.log" 2>&1 &
  t=0
  until [ -s "$TMP/ref.port" ]; do
    sleep 0.1
    t=$((t + 1))
    [ $t -lt 300 ] || die "thc-aggregator did not start"
  done
  SWITCH_URL=udp://$SWITCH_IP:$SW_PORT
  REF_URL=udp://$SWITCH_IP:$REF_PORT
}

# switchd_stats: thc-switchd's counters (engine and data plane) as one "name=value ..." line.
switchd_stats() {
  ip netns exec "$NSS" "$THC_PROBE" stats "$SWITCH_IP" "$SW_PORT" "$THC_KEYS"
}
