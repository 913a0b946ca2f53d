#!/usr/bin/env bash
# Live test of thc-aggregator-dpdk: two network namespaces joined by a veth pair; the aggregator
# runs in namespace A on its veth end through DPDK's af_packet vdev (no IP address on that end:
# the aggregator answers ARP itself), thc_udp_worker processes run in namespace B against
# udp://10.77.0.1:9471. Every worker's result must equal the exact result (thc_wl_expected) and
# the others'; the aggregator's final statistics line must show exactly the elements the workers
# contributed and every noise frame (thc_dpdk_noise) dropped under its reason.
#
# Cases: one worker lcore (shared tx queue, noise sent during the run); two worker lcores with
# two concurrent jobs over three af_packet queue pairs; single-core mode (--workers 0) polling
# two rx queues (af_packet qpairs=2) with one tx queue.
#
#   live_test.sh THC_AGGREGATOR_DPDK THC_UDP_WORKER THC_WL_EXPECTED THC_DPDK_NOISE
# Exit 0: pass; 77: skipped (not root, no network namespaces or veth); anything else: failure.
# Every wait has a deadline; the namespaces (and with them the veth pair) are always deleted.
set -u

if [ $# -ne 4 ]; then
  echo "usage: $0 THC_AGGREGATOR_DPDK THC_UDP_WORKER THC_WL_EXPECTED THC_DPDK_NOISE" >&2
  exit 2
fi
AGG=$1
WORKER=$2
EXPECTED=$3
NOISE=$4
COUNT=${THC_DPDK_TEST_COUNT:-2000}
WORLD=3
AGG_IP=10.77.0.1
PEER_IP=10.77.0.2
PORT=9471

TAG=thcdpdk
# shellcheck source=../../netns/veth_pair.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../netns/veth_pair.sh"
for b in "$AGG" "$WORKER" "$EXPECTED" "$NOISE"; do
  [ -x "$b" ] || die "$b is not an executable"
done
veth_pair_up
ip -n "$NSB" addr add "$PEER_IP/24" dev "$VB" || die "address on $VB"

# A veth offloads UDP checksums: the sender's kernel leaves them unfilled (CHECKSUM_PARTIAL) and
# af_packet hands such frames to DPDK as they are, so the aggregator would drop every datagram as
# bad_udp_checksum (checked: 253 of 253 with the offloads on). Turn the offloads off; without
# ethtool (or with THC_DPDK_TEST_NO_ETHTOOL=1), tell the aggregator not to verify instead.
CSUM_OPT=
if [ -z "${THC_DPDK_TEST_NO_ETHTOOL:-}" ] && command -v ethtool >/dev/null 2>&1; then
  ip netns exec "$NSA" ethtool -K "$VA" tx off rx off >/dev/null 2>&1 || die "ethtool -K $VA"
  ip netns exec "$NSB" ethtool -K "$VB" tx off rx off >/dev/null 2>&1 || die "ethtool -K $VB"
else
  echo "note: no ethtool; the aggregator runs with --skip-udp-checksum"
  CSUM_OPT=--skip-udp-checksum
fi

EXP_FILE=$TMP/expected
EXP_OUT=$("$EXPECTED" "$WORLD" "$COUNT" "$EXP_FILE")
ELEMS_PER_RANK=$(printf '%s\n' "$EXP_OUT" | awk '$1 == "elements_per_rank" {print $2}')
MAX_ELEMS_PER_RANK=$(printf '%s\n' "$EXP_OUT" | awk '$1 == "max_elements_per_rank" {print $2}')
[ -n "$ELEMS_PER_RANK" ] && [ -n "$MAX_ELEMS_PER_RANK" ] && [ -s "$EXP_FILE" ] || die "thc_wl_expected failed"
AGG_MAC=$(ip -n "$NSA" link show "$VA" | awk '/link\/ether/ {print $2}')
[ -n "$AGG_MAC" ] || die "cannot read the MAC of $VA"

# The key file both sides hold (tenant key 1; mode 0600).
KEYS=$TMP/keys
printf '1:%s\n' "$(head -c 32 /dev/urandom | od -An -tx1 -v | tr -d ' \n')" >"$KEYS"
chmod 600 "$KEYS"

# run_case NAME LCORE_ARG WORKERS QPAIRS JOBS NOISE(0|1)
run_case() {
  local name=$1 lcores=$2 workers=$3 qpairs=$4 jobs=$5 noise=$6
  local dir=$TMP/$name
  mkdir -p "$dir"
  local vdev="net_af_packet0,iface=$VA"
  [ "$qpairs" -gt 1 ] && vdev="$vdev,qpairs=$qpairs"
  echo "== case $name: $lcores --workers $workers, qpairs $qpairs, $jobs job(s) of $WORLD workers, noise $noise"
  # Forget the aggregator's MAC, so that every case starts with an ARP request to answer.
  ip -n "$NSB" neigh flush dev "$VB" 2>/dev/null

  ip netns exec "$NSA" "$AGG" --no-huge -m 512 --no-pci --file-prefix="$PREFIX$name" "$lcores" --vdev="$vdev" \
    -- --ip "$AGG_IP" --port "$PORT" --key-file "$KEYS" --workers "$workers" --port-file "$dir/port" --stats-interval 5 \
    --seed 42 $CSUM_OPT \
    >"$dir/agg.log" 2>&1 &
  AGG_PID=$!
  local deadline=$((SECONDS + 30))
  while [ ! -s "$dir/port" ]; do
    kill -0 "$AGG_PID" 2>/dev/null || { cat "$dir/agg.log"; die "$name: the aggregator exited during startup"; }
    [ "$SECONDS" -lt "$deadline" ] || { cat "$dir/agg.log"; die "$name: the aggregator was not ready within 30 s"; }
    sleep 0.1
  done
  grep "listening on" "$dir/agg.log"

  local pids=() files=() logs=() j r t0 t1
  t0=$(date +%s.%N)
  for j in $(seq 1 "$jobs"); do
    local job=$((10 + j))
    for r in $(seq 0 $((WORLD - 1))); do
      files+=("$dir/out.$job.$r")
      logs+=("$dir/worker.$job.$r.log")
      ip netns exec "$NSB" env THC_AGGREGATOR_KEY_FILE="$KEYS" timeout -k 5 90 "$WORKER" "udp://$AGG_IP:$PORT" "$r" \
        "$WORLD" "$job" "$COUNT" \
        "$dir/out.$job.$r" >"$dir/worker.$job.$r.log" 2>&1 &
      pids+=($!)
    done
  done
  local noise_pid=
  if [ "$noise" = 1 ]; then
    ip netns exec "$NSB" timeout -k 5 60 "$NOISE" "$VB" "$AGG_MAC" "$AGG_IP" "$PORT" "$PEER_IP" >"$dir/noise.out" 2>&1 &
    noise_pid=$!
  fi

  local i st bad=0
  for i in "${!pids[@]}"; do
    wait_pid "${pids[$i]}" 100
    st=$WAIT_STATUS
    if [ "$st" != 0 ]; then
      echo "worker ${files[$i]##*/} exited with $st:"
      cat "${logs[$i]}"
      bad=1
    fi
  done
  t1=$(date +%s.%N)
  if [ -n "$noise_pid" ]; then
    wait_pid "$noise_pid" 70
    st=$WAIT_STATUS
    [ "$st" = 0 ] || { cat "$dir/noise.out"; bad=1; echo "thc_dpdk_noise exited with $st"; }
  fi

  kill -INT "$AGG_PID" 2>/dev/null
  wait_pid "$AGG_PID" 20
  st=$WAIT_STATUS
  AGG_PID=
  if [ "$bad" = 1 ] || [ "$st" != 0 ]; then
    echo "--- aggregator log ($name), exit status $st:"
    cat "$dir/agg.log"
    die "$name: workers or aggregator failed (aggregator status $st; 124 = did not stop on SIGINT within 20 s)"
  fi

  # Results: exact, and identical on every rank.
  for i in "${!files[@]}"; do
    cmp -s "${files[$i]}" "$EXP_FILE" || die "$name: ${files[$i]##*/} differs from the exact result"
  done

  local line
  line=$(grep "final stats:" "$dir/agg.log")
  [ -n "$line" ] || { cat "$dir/agg.log"; die "$name: no final stats line"; }
  echo "$line"
  line=" ${line#*final stats: }"
  # Every job has one instance per worker lcore (JOIN_ACK shards); a MAX op goes to each of them.
  local shards=$((workers > 0 ? workers : 1))
  local want_elems=$((jobs * WORLD * (ELEMS_PER_RANK + (shards - 1) * MAX_ELEMS_PER_RANK)))
  [ "$(stat "$line" elements)" = "$want_elems" ] ||
    die "$name: elements=$(stat "$line" elements), the workers contributed $want_elems"
  awk -v e="$want_elems" -v a="$t0" -v b="$t1" \
    'BEGIN { printf "throughput: %d lanes aggregated in %.2f s (workers start to end): %.3g lanes/s\n", e, b - a, e / (b - a) }'
  # The UDP workers use every instance of their jobs.
  [ "$(stat "$line" jobs_created)" = "$((jobs * shards))" ] ||
    die "$name: jobs_created=$(stat "$line" jobs_created), want $((jobs * shards))"
  [ "$(stat "$line" slots_completed)" -gt 0 ] || die "$name: no slot completed"
  [ "$(stat "$line" arp_requests)" -ge 1 ] && [ "$(stat "$line" arp_replies)" -ge 1 ] ||
    die "$name: the aggregator answered no ARP request"
  [ "$(stat "$line" tx_frames)" -gt 0 ] && [ "$(stat "$line" port_tx_packets)" -gt 0 ] || die "$name: nothing transmitted"
  [ "$(stat "$line" port_rx_packets)" -ge "$(stat "$line" udp_frames)" ] || die "$name: port_rx_packets < udp_frames"
  local want_drops=0 extra_drops=0
  if [ "$noise" = 1 ]; then
    want_drops=$(awk '$1 == "drop_truncated" {print $2}' "$dir/noise.out")
    local reason n got
    while read -r reason n; do
      [ "$reason" = drop_truncated ] && continue
      if [ "$reason" = frame_drop_bad_udp_checksum ] && [ -n "$CSUM_OPT" ]; then
        # Not verified: the frame reaches an engine, which drops its garbage payload.
        extra_drops=$((extra_drops + n))
        continue
      fi
      got=$(stat "$line" "$reason")
      case $reason in
        # Counted exactly, except kinds namespace B's kernel may send too: ICMP port unreachable
        # (not_udp) for a result that reaches a worker after it exited, ARP, other ethertypes.
        frame_drop_not_ipv4 | frame_drop_arp_ignored | frame_drop_not_udp)
          [ "$got" -ge "$n" ] || die "$name: $reason=$got, sent $n" ;;
        *) [ "$got" = "$n" ] || die "$name: $reason=$got, sent $n" ;;
      esac
    done <"$dir/noise.out"
    echo "noise: $(tr '\n' ' ' <"$dir/noise.out")"
  fi
  # Each worker's first JOIN per job instance draws the cookie challenge (drop_cookie; more if a
  # first JOIN was retransmitted before its challenge arrived).
  local cookies
  cookies=$(stat "$line" drop_cookie)
  [ "$cookies" -ge "$((jobs * WORLD * shards))" ] ||
    die "$name: drop_cookie=$cookies, want at least $((jobs * WORLD * shards))"
  # A retransmission (a result late on a loaded machine) may arrive after its slot moved on
  # (drop_stale) or after another copy of the same attempt (drop_replay): allowed, at most one
  # per retransmission.
  # On a slow machine (the sanitizer build) a worker may also resend its LEAVE after the last
  # LEAVE freed the job instance: drop_unknown_job, a few per worker and instance at most.
  local unknown
  unknown=$(stat "$line" drop_unknown_job)
  [ "$unknown" -le "$((4 * jobs * WORLD * shards))" ] || die "$name: drop_unknown_job=$unknown"
  local late=$(($(stat "$line" drop_stale) + $(stat "$line" drop_replay)))
  [ "$late" -le "$(stat "$line" retransmissions)" ] ||
    die "$name: drop_stale + drop_replay = $late, more than the $(stat "$line" retransmissions) retransmissions"
  [ "$(stat "$line" drops_total)" = "$((want_drops + extra_drops + cookies + late + unknown))" ] ||
    die "$name: engine drops_total=$(stat "$line" drops_total), want $((want_drops + extra_drops + cookies + late + unknown))"
  [ "$(stat "$line" drop_truncated)" = "$want_drops" ] || die "$name: drop_truncated=$(stat "$line" drop_truncated), want $want_drops"
  rm -rf /var/run/dpdk/"$PREFIX$name" 2>/dev/null
  echo "== case $name: ok"
}

# Lcores are mapped onto the first two CPUs this process may use (one if that is all), so three
# lcores also run on a two-CPU machine.
CPUS=$(awk '/^Cpus_allowed_list/ {print $2}' /proc/self/status | tr ',' '\n' |
  awk -F- '{ e = ($2 == "" ? $1 : $2); for (c = $1; c <= e; ++c) print c }' | head -n 2)
C0=$(printf '%s\n' "$CPUS" | sed -n 1p)
C1=$(printf '%s\n' "$CPUS" | sed -n 2p)
C0=${C0:-0}
C1=${C1:-$C0}

run_case w1 "--lcores=0@$C0,1@$C1" 1 1 1 1
run_case w2 "--lcores=0@$C0,1@$C1,2@$C1" 2 3 2 0
run_case w0 "--lcores=0@$C0" 0 2 1 0

# Jumbo frames on a port that cannot take them (af_packet in DPDK 22.11: 1518-byte frames at most,
# whatever the veth's MTU): a clear refusal at start, not a server that drops every result.
echo "== case mtu9000: refused on af_packet"
ip netns exec "$NSA" timeout -k 5 30 "$AGG" --no-huge -m 512 --no-pci --file-prefix="${PREFIX}mtu" "--lcores=0@$C0" \
  --vdev="net_af_packet0,iface=$VA" -- --ip "$AGG_IP" --port "$PORT" --key-file "$KEYS" --workers 0 --mtu 9000 \
  --stats-interval 0 >"$TMP/mtu9000.log" 2>&1
rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { cat "$TMP/mtu9000.log"; die "mtu9000: the server started (rc $rc)"; }
grep -q -- "--mtu 9000: port 0 (net_af_packet) takes frames of" "$TMP/mtu9000.log" ||
  { cat "$TMP/mtu9000.log"; die "mtu9000: no clear error"; }
grep -- "--mtu 9000" "$TMP/mtu9000.log"
echo "== case mtu9000: ok"
echo "PASS"
