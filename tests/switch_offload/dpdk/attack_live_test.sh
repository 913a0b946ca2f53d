#!/usr/bin/env bash
# Attacks on thc-aggregator-dpdk. Two network namespaces joined by a veth pair (as live_test.sh).
# 1. MAC learning: the aggregator answers each peer at the MAC its frames came from, and must
#    learn that MAC only from frames that prove something. In namespace B, three thc_udp_worker
#    processes run a job while thc_dpdk_replay, on the same link, resends some of their data
#    frames with a forged Ethernet source (genuine tags: replays) and counts what the aggregator
#    then sends to the forged MAC. Pass: every worker's result is exact and nothing was redirected.
# 2. Restart: thc_dpdk_replay also recorded the workers' data frames of run 1. The aggregator is
#    restarted with the same --seed, and a second run of the same job label (other data) runs
#    while the recording is injected again and again. Pass: exact results, and every injected
#    frame failed authentication (job seeds never repeat across processes, --seed or not).
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

ip netns exec "$NSB" timeout -k 5 120 "$REPLAY" "$VB" "$FAKE_MAC" "$PORT" "$TMP/recorded" >"$TMP/replay.out" 2>&1 &
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
[ -s "$TMP/recorded" ] || die "nothing was recorded of run 1"

# 2. Restart with the same --seed; run 2 (another element count: other data) under the recording.
COUNT2=$((COUNT + 7))
EXP2=$TMP/expected2
"$EXPECTED" "$WORLD" "$COUNT2" "$EXP2" >/dev/null || die "thc_wl_expected failed"
rm -f "$TMP/port"
ip netns exec "$NSA" "$AGG" --no-huge -m 512 --no-pci --file-prefix="$PREFIX" "--lcores=0@${CPU:-0},1@${CPU:-0}" \
  --vdev="net_af_packet0,iface=$VA" -- --ip "$AGG_IP" --port "$PORT" --key-file "$KEYS" --workers 1 \
  --port-file "$TMP/port" --stats-interval 0 --seed 7 $CSUM_OPT >"$TMP/agg2.log" 2>&1 &
AGG_PID=$!
deadline=$((SECONDS + 30))
while [ ! -s "$TMP/port" ]; do
  kill -0 "$AGG_PID" 2>/dev/null || { cat "$TMP/agg2.log"; die "the restarted aggregator exited during startup"; }
  [ "$SECONDS" -lt "$deadline" ] || { cat "$TMP/agg2.log"; die "the restarted aggregator was not ready within 30 s"; }
  sleep 0.1
done
ip netns exec "$NSB" timeout -k 5 120 "$REPLAY" "$VB" inject "$TMP/recorded" >"$TMP/inject.out" 2>&1 &
INJECT_PID=$!
deadline=$((SECONDS + 10))
until grep -q '^ready' "$TMP/inject.out" 2>/dev/null; do
  kill -0 "$INJECT_PID" 2>/dev/null || { cat "$TMP/inject.out"; die "the injector exited"; }
  [ "$SECONDS" -lt "$deadline" ] || die "the injector did not start"
  sleep 0.05
done
pids=()
for r in $(seq 0 $((WORLD - 1))); do
  ip netns exec "$NSB" env THC_AGGREGATOR_KEY_FILE="$KEYS" timeout -k 5 90 "$WORKER" "udp://$AGG_IP:$PORT" "$r" \
    "$WORLD" 21 "$COUNT2" "$TMP/out2.$r" >"$TMP/worker2.$r.log" 2>&1 &
  pids+=($!)
done
for r in $(seq 0 $((WORLD - 1))); do
  wait_pid "${pids[$r]}" 100
  if [ "$WAIT_STATUS" != 0 ]; then
    echo "run 2, worker $r exited with $WAIT_STATUS:"
    cat "$TMP/worker2.$r.log"
    bad=1
  elif ! cmp -s "$TMP/out2.$r" "$EXP2"; then
    echo "run 2, worker $r: result differs from the exact result"
    bad=1
  fi
done
kill -INT "$INJECT_PID" 2>/dev/null
wait_pid "$INJECT_PID" 10
cat "$TMP/inject.out"
kill -INT "$AGG_PID" 2>/dev/null
wait_pid "$AGG_PID" 20
AGG_PID=
grep "final stats:" "$TMP/agg2.log"
injected=$(awk '$1 == "injected" {print $2}' "$TMP/inject.out")
final2=$(grep "final stats:" "$TMP/agg2.log")
bad_tags=$(stat "$final2" drop_bad_tag)
unknown=$(stat "$final2" drop_unknown_job)  # injected after run 2's job ended
[ -n "$injected" ] && [ "$injected" -gt 0 ] || die "nothing of run 1 was injected into run 2"
[ "$bad" = 0 ] || die "workers of run 2 failed while run 1's frames were replayed after the restart"
[ $((bad_tags + unknown)) -ge "$injected" ] ||
  die "of $injected frames of run 1, only $bad_tags failed authentication after the restart and $unknown found no job:" \
    "the rest verified in run 2's job (--seed 7 both times)"
[ "$bad_tags" -gt 0 ] || die "no frame of run 1 reached run 2's job (the attack did not run)"
echo "PASS"
