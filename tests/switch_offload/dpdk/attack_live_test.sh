#!/usr/bin/env bash
# Attack on thc-aggregator-dpdk's MAC learning: the aggregator answers each peer at the MAC its
# frames came from, and must learn that MAC only from frames that prove something. Two network
# namespaces joined by a veth pair (as live_test.sh); in namespace B, three thc_udp_worker
# processes run a job while thc_dpdk_replay, on the same link, resends some of their data frames
# with a forged Ethernet source (genuine tags: replays) and counts what the aggregator then sends
# to the forged MAC. Pass: every worker's result is exact and nothing was redirected.
#
#   attack_live_test.sh THC_AGGREGATOR_DPDK THC_UDP_WORKER THC_WL_EXPECTED THC_DPDK_REPLAY
# Exit 0: pass; 77: skipped (not root, no network namespaces or veth); anything else: failure.
set -u

if [ $# -ne 4 ]; then
  echo "usage: $0 THC_AGGREGATOR_DPDK THC_UDP_WORKER THC_WL_EXPECTED THC_DPDK_REPLAY" >&2
  exit 2
fi
AGG=$1
WORKER=$2
EXPECTED=$3
REPLAY=$4
COUNT=${THC_DPDK_TEST_COUNT:-2000}
WORLD=3
AGG_IP=10.78.0.1
PEER_IP=10.78.0.2
PORT=9471
FAKE_MAC=02:66:61:6b:65:01

TAG=thcattk
# shellcheck source=../../netns/veth_pair.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../netns/veth_pair.sh"
for b in "$AGG" "$WORKER" "$EXPECTED" "$REPLAY"; do
  [ -x "$b" ] || die "$b is not an executable"
done
veth_pair_up
ip -n "$NSB" addr add "$PEER_IP/24" dev "$VB" || die "address on $VB"

# Checksums filled by the kernel (see live_test.sh), or not verified by the aggregator.
CSUM_OPT=
if [ -z "${THC_DPDK_TEST_NO_ETHTOOL:-}" ] && command -v ethtool >/dev/null 2>&1; then
  ip netns exec "$NSA" ethtool -K "$VA" tx off rx off >/dev/null 2>&1 || die "ethtool -K $VA"
  ip netns exec "$NSB" ethtool -K "$VB" tx off rx off >/dev/null 2>&1 || die "ethtool -K $VB"
else
  CSUM_OPT=--skip-udp-checksum
fi

EXP_FILE=$TMP/expected
"$EXPECTED" "$WORLD" "$COUNT" "$EXP_FILE" >/dev/null || die "thc_wl_expected failed"
KEYS=$TMP/keys
printf '1:%s\n' "$(head -c 32 /dev/urandom | od -An -tx1 -v | tr -d ' \n')" >"$KEYS"
chmod 600 "$KEYS"

CPU=$(awk '/^Cpus_allowed_list/ {print $2}' /proc/self/status | cut -d, -f1 | cut -d- -f1)
ip netns exec "$NSA" "$AGG" --no-huge -m 512 --no-pci --file-prefix="$PREFIX" "--lcores=0@${CPU:-0},1@${CPU:-0}" \
  --vdev="net_af_packet0,iface=$VA" -- --ip "$AGG_IP" --port "$PORT" --key-file "$KEYS" --workers 1 \
  --port-file "$TMP/port" --stats-interval 0 --seed 7 $CSUM_OPT >"$TMP/agg.log" 2>&1 &
AGG_PID=$!
deadline=$((SECONDS + 30))
while [ ! -s "$TMP/port" ]; do
  kill -0 "$AGG_PID" 2>/dev/null || { cat "$TMP/agg.log"; die "the aggregator exited during startup"; }
  [ "$SECONDS" -lt "$deadline" ] || { cat "$TMP/agg.log"; die "the aggregator was not ready within 30 s"; }
  sleep 0.1
done

ip netns exec "$NSB" timeout -k 5 120 "$REPLAY" "$VB" "$FAKE_MAC" "$PORT" >"$TMP/replay.out" 2>&1 &
REPLAY_PID=$!
sleep 0.2
pids=()
for r in $(seq 0 $((WORLD - 1))); do
  ip netns exec "$NSB" env THC_AGGREGATOR_KEY_FILE="$KEYS" timeout -k 5 90 "$WORKER" "udp://$AGG_IP:$PORT" "$r" \
    "$WORLD" 21 "$COUNT" "$TMP/out.$r" >"$TMP/worker.$r.log" 2>&1 &
  pids+=($!)
done
bad=0
for r in $(seq 0 $((WORLD - 1))); do
  wait_pid "${pids[$r]}" 100
  if [ "$WAIT_STATUS" != 0 ]; then
    echo "worker $r exited with $WAIT_STATUS:"
    cat "$TMP/worker.$r.log"
    bad=1
  elif ! cmp -s "$TMP/out.$r" "$EXP_FILE"; then
    echo "worker $r: result differs from the exact result"
    bad=1
  fi
done
kill -INT "$REPLAY_PID" 2>/dev/null
wait_pid "$REPLAY_PID" 10
cat "$TMP/replay.out"
kill -INT "$AGG_PID" 2>/dev/null
wait_pid "$AGG_PID" 20
AGG_PID=
grep "final stats:" "$TMP/agg.log"
replayed=$(awk '$1 == "replayed" {print $2}' "$TMP/replay.out")
redirected=$(awk '$1 == "redirected" {print $2}' "$TMP/replay.out")
if [ -z "$replayed" ] || [ -z "$redirected" ]; then die "thc_dpdk_replay printed no counts"; fi
[ "$replayed" -gt 0 ] || die "nothing was replayed (the attack did not run)"
[ "$bad" = 0 ] || die "workers failed under the replay attack"
[ "$redirected" = 0 ] ||
  die "$redirected frames went to the attacker's MAC: replayed data frames re-pointed the workers' MAC"
echo "PASS"
