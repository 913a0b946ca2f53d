#!/usr/bin/env bash
# compare.sh -- float32 MPI_Allreduce vs THC vs Cnat (integer allreduce and colocated PS) on an
# emulated cluster: N hosts (default 4) at 1 Gbit/s and unshaped, sizes 1 MB .. 256 MB.
#
# Usage:
#   perf/compare.sh [--out DIR] [--np N] [--ranks-per-host R] [--rates "1gbit none"] [--min-size 1M]
#                   [--max-size 256M] [--iters 5] [--warmup 1] [--checks 1] [--bin-dir DIR] [--local]
#                   [--configs "none none-ring bf16 bf16-ring thc-int thc-ps cnat-int cnat-ps thc-agg-switch ..."]
#                   [--agg-threads 1] [--prefix P] [-- EXTRA_TOOL_ARGS...]
#
#   --out DIR       where results go (default perf-compare-YYYYmmdd-HHMMSS)
#   --np N          ranks (default 4)
#   --ranks-per-host R  ranks per emulated host (default 1): N/R hosts, R ranks each sharing the
#                   host's link (and its shared memory: thc's THC_HIER runs hierarchically then);
#                   with --local the hosts are emulated by THC_HIER_HOSTS
#   --rates LIST    netns_cluster.sh --rate values (default "1gbit none")
#   --min-size S    smallest size (default 1M); --max-size S largest (default 256M); factor 2
#   --iters/--warmup/--checks   thc_allreduce_perf -n / -w / -c
#   --bin-dir DIR   directory holding thc_allreduce_perf (default: build*/perf/allreduce_perf or PATH)
#   --local         no testbed: plain `mpirun --oversubscribe` on this machine, unshaped only
#   --configs LIST  subset of: none none-ring bf16 bf16-ring thc-int thc-ps cnat-int cnat-ps (uhc-*,
#                   dnat-*, *-auto also accepted; a -flat suffix, e.g. thc-ps-flat, sets THC_HIER=0:
#                   the flat engine over all ranks even with several ranks per host), SCHEME-ucx-ALGO (thc's
#                   integer reductions over UCX between the ranks, thc_comm_create_ucx, instead of over MPI;
#                   MPI only launches), and aggregator rows SCHEME-agg-PLACE: thc-agg-switch (thc-aggregator on
#                   the bridge, where a switch is: every worker port at the link rate), thc-agg-host
#                   (on a host of its own with one link), thc-agg-2hosts (two aggregator hosts, the
#                   job's slots sharded over them), thc-agg-bmv2 (BMv2's simple_switch running the THC
#                   v1model program on a port of the bridge, thc-switchd its control plane: the
#                   aggregation in a P4 data plane; BMv2 is a functional model of thousands of
#                   packets/s, so these rows stop at --bmv2-max-size); cnat-agg-* alike. none-ring is float32
#                   MPI_Allreduce with Open MPI's ring forced (coll_tuned_allreduce_algorithm 4), the
#                   baseline an HPC user would tune. bf16 is the compression hook of Horovod/PyTorch DDP
#                   (float32 -> bfloat16, MPI_Allreduce with a bfloat16 SUM op, -> float32),
#                   bf16-ring the same with the ring forced.
#   --agg-threads N threads per thc-aggregator (default 1)
#   --bmv2-max-size S  largest size of the *-agg-bmv2 rows (default 2M)
#   --p4-json FILE  the compiled v1model program for *-agg-bmv2 (default: compiled here with
#                   p4c-bm2-ss from switch_offload/p4; simple_switch and p4c-bm2-ss from PATH,
#                   $THC_P4_PREFIX/bin or /opt/p4/bin)
#   --prefix P      namespace prefix of the testbed (default thccmp<pid>)
#   --mpi-yield     every rank's MPI yields the core while it waits (--mca mpi_yield_when_idle 1, every
#                   config alike): what Open MPI does by itself when it sees more ranks than cores. The
#                   testbed's hosts each declare one slot, so by default Open MPI busy-polls: 4 spinning
#                   ranks on this machine's 2 cores, each step of its ring waiting for the next rank's
#                   turn on a core (perf/model/README.md, "Open MPI's step latency"). Off by default
#                   (the published baselines); recorded in DIR/settings
#   after --         extra arguments for every thc_allreduce_perf run (e.g. --bits 2 --block 1M)
#
# Each run goes through perf/testbed/netns_cluster.sh (network namespaces, a bridge and tbf
# shaping; needs root), one testbed per rate, which exports THC_TESTBED_MPIRUN_ARGS for mpirun.
#
# Output in DIR:
#   raw/<rate>_<config>.json|.log   every thc_allreduce_perf run (--json rows and its stdout/stderr)
#   results.md                      markdown tables: time and busbw per size, wire bytes, NMSE, and
#                                   each config's share of its wire limit (the busiest host link's
#                                   bytes at the shaped rate: all ranks of a host share its link)
#   compare.png                     time and busbw against size (gnuplot; python3-matplotlib fallback)
#   data/<rate>_<config>.dat        the plotted numbers (size_bytes time_us busbw_GBps)
# Exit status: 0 when every run succeeded, 1 when some run failed (its row says so), 2 on usage
# errors, 3 when the plot could not be drawn.
set -euo pipefail

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2; exit 2; }
die() { echo "compare.sh: $*" >&2; exit 2; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
OUT="perf-compare-$(date +%Y%m%d-%H%M%S)"
NP=4
RPH=1
PREFIX=""
RATES="1gbit none"
MIN=1M
MAX=256M
ITERS=5
WARMUP=1
CHECKS=1
BIN_DIR=""
LOCAL=0
CONFIGS="none thc-int thc-ps cnat-int cnat-ps"
AGG_THREADS=1
BMV2_MAX=2M
P4_JSON=""
MPI_YIELD=0
EXTRA=()

while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --np|--hosts) NP="$2"; shift 2 ;;
    --ranks-per-host) RPH="$2"; shift 2 ;;
    --prefix) PREFIX="$2"; shift 2 ;;
    --rates) RATES="$2"; shift 2 ;;
    --min-size) MIN="$2"; shift 2 ;;
    --max-size) MAX="$2"; shift 2 ;;
    --iters) ITERS="$2"; shift 2 ;;
    --warmup) WARMUP="$2"; shift 2 ;;
    --checks) CHECKS="$2"; shift 2 ;;
    --bin-dir) BIN_DIR="$2"; shift 2 ;;
    --local) LOCAL=1; shift ;;
    --configs) CONFIGS="$2"; shift 2 ;;
    --agg-threads) AGG_THREADS="$2"; shift 2 ;;
    --bmv2-max-size) BMV2_MAX="$2"; shift 2 ;;
    --p4-json) P4_JSON="$2"; shift 2 ;;
    --mpi-yield) MPI_YIELD=1; shift ;;
    -h|--help) usage ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "compare.sh: unknown argument '$1'" >&2; usage ;;
  esac
done

[[ "$NP" =~ ^[0-9]+$ ]] && (( NP >= 1 )) || die "--np must be a positive integer"
[[ "$RPH" =~ ^[0-9]+$ ]] && (( RPH >= 1 && NP % RPH == 0 )) || die "--ranks-per-host must divide --np"
NHOSTS=$((NP / RPH))
[[ -z "$PREFIX" ]] && PREFIX="thccmp$$"
[[ "$PREFIX" =~ ^[A-Za-z0-9]+$ ]] || die "--prefix must be letters and digits"
for n in "$ITERS" "$WARMUP" "$CHECKS"; do [[ "$n" =~ ^[0-9]+$ ]] || die "--iters/--warmup/--checks must be integers"; done
for s in "$MIN" "$MAX"; do [[ "$s" =~ ^[0-9]+[KMGkmg]?$ ]] || die "sizes look like 64K, 1M, 256M (got '$s')"; done
NEED_AGG=0
NEED_BMV2=0
for c in $CONFIGS; do
  [[ "$c" == none || "$c" == none-ring || "$c" == bf16 || "$c" == bf16-ring ||
     "$c" =~ ^(thc|uhc|cnat|dnat)-(int|ps|auto)(-flat)?$ || "$c" =~ ^(thc|uhc|cnat|dnat)-ucx-(int|ps|auto)$ ||
     "$c" =~ ^(thc|uhc|cnat|dnat)-agg-(switch|host|2hosts|bmv2)$ ]] || die "unknown config '$c'"
  [[ "$c" == *-agg-* ]] && NEED_AGG=1
  [[ "$c" == *-agg-bmv2 ]] && NEED_BMV2=1
done
[[ "$BMV2_MAX" =~ ^[0-9]+[KMGkmg]?$ ]] || die "--bmv2-max-size looks like 1M (got '$BMV2_MAX')"
bytes_of() {  # 64K, 1M, 2G -> bytes
  local n=${1%[KMGkmg]} u=${1: -1}
  case $u in K|k) echo $((n << 10)) ;; M|m) echo $((n << 20)) ;; G|g) echo $((n << 30)) ;; *) echo "$1" ;; esac
}
BMV2_E=$MAX
(( $(bytes_of "$BMV2_MAX") < $(bytes_of "$MAX") )) && BMV2_E=$BMV2_MAX
(( $(bytes_of "$BMV2_E") < $(bytes_of "$MIN") )) && BMV2_E=$MIN
[[ "$AGG_THREADS" =~ ^[0-9]+$ ]] && (( AGG_THREADS >= 1 )) || die "--agg-threads must be a positive integer"

# ---- the tool
TOOL=""
if [[ -n "$BIN_DIR" ]]; then
  TOOL="$BIN_DIR/thc_allreduce_perf"
else
  for cand in "$ROOT"/build*/perf/allreduce_perf/thc_allreduce_perf; do
    [[ -x "$cand" ]] && { TOOL="$cand"; break; }
  done
  [[ -z "$TOOL" ]] && TOOL=$(command -v thc_allreduce_perf || true)
fi
[[ -n "$TOOL" && -x "$TOOL" ]] || die "thc_allreduce_perf not found (build it, or pass --bin-dir DIR)"
TOOL=$(cd "$(dirname "$TOOL")" && pwd)/$(basename "$TOOL")
command -v python3 >/dev/null || die "python3 is needed to write the tables"
AGG_BIN=""
if (( NEED_AGG )); then
  for cand in "$(dirname "$TOOL")/../../switch_offload/thc-aggregator" "$(dirname "$TOOL")/thc-aggregator"; do
    [[ -x "$cand" ]] && { AGG_BIN=$(cd "$(dirname "$cand")" && pwd)/thc-aggregator; break; }
  done
  [[ -z "$AGG_BIN" ]] && AGG_BIN=$(command -v thc-aggregator || true)
  [[ -n "$AGG_BIN" ]] || die "thc-aggregator not found next to thc_allreduce_perf or on PATH"
  (( LOCAL )) && die "aggregator configs need the testbed (no --local)"
fi
SWITCHD_BIN="" SIMPLE_SWITCH=""
if (( NEED_BMV2 )); then
  SWITCHD_BIN=$(dirname "$AGG_BIN")/switchd/thc-switchd
  [[ -x "$SWITCHD_BIN" ]] || SWITCHD_BIN=$(command -v thc-switchd || true)
  [[ -n "$SWITCHD_BIN" ]] || die "thc-switchd not found (build it: needs thrift-compiler, libthrift-dev, libjsoncpp-dev)"
  p4path="$PATH:${THC_P4_PREFIX:-/nonexistent}/bin:/opt/p4/bin"
  SIMPLE_SWITCH=$(PATH=$p4path command -v simple_switch || true)
  [[ -n "$SIMPLE_SWITCH" ]] || die "*-agg-bmv2: simple_switch not found (the P4 toolchain: switch_offload/p4/README.md)"
  if [[ -z "$P4_JSON" ]]; then
    P4C=$(PATH=$p4path command -v p4c-bm2-ss || true)
    [[ -n "$P4C" ]] || die "*-agg-bmv2: p4c-bm2-ss not found (or pass --p4-json)"
    mkdir -p "$OUT/raw"
    P4_JSON=$OUT/raw/thc_v1model.json
    echo "[compare.sh] compiling the v1model program for BMv2" >&2
    "$P4C" --std p4-16 -I "$ROOT/switch_offload/p4/include" -o "$P4_JSON" "$ROOT/switch_offload/p4/v1model/thc_v1model.p4" \
      || die "p4c-bm2-ss failed"
  fi
  [[ -f "$P4_JSON" ]] || die "--p4-json $P4_JSON not found"
  P4_JSON=$(cd "$(dirname "$P4_JSON")" && pwd)/$(basename "$P4_JSON")
fi

TESTBED="$HERE/testbed/netns_cluster.sh"
if (( LOCAL )); then
  RATES="local"
else
  [[ -x "$TESTBED" || -f "$TESTBED" ]] || die "testbed script $TESTBED not found (or use --local)"
  [[ $(id -u) -eq 0 ]] || die "the network-namespace testbed needs root (or use --local)"
fi

mkdir -p "$OUT/raw" "$OUT/data"
OUT=$(cd "$OUT" && pwd)
# What the scale model's `validate` must match its calibration to (perf/model/thc_model.py).
echo "mpi_yield_when_idle=$MPI_YIELD" > "$OUT/settings"
YIELD_ARGS=""
(( MPI_YIELD )) && YIELD_ARGS="--mca mpi_yield_when_idle 1"

# ---- one rate: a script that runs every config with the mpirun prefix it is given
write_runner() {
  {
    echo '#!/usr/bin/env bash'
    echo 'set -u'
    printf 'TOOL=%q\nOUTDIR=%q\nCONFIGS=%q\nAGG_BIN=%q\nAGG_THREADS=%q\n' "$TOOL" "$OUT" "$CONFIGS" "$AGG_BIN" "$AGG_THREADS"
    printf 'SWITCHD_BIN=%q\nSIMPLE_SWITCH=%q\nP4_JSON=%q\n' "$SWITCHD_BIN" "$SIMPLE_SWITCH" "$P4_JSON"
    printf 'COMMON=(-b %q -e %q -f 2 -n %q -w %q -c %q)\n' "$MIN" "$MAX" "$ITERS" "$WARMUP" "$CHECKS"
    printf 'COMMON_BMV2=(-b %q -e %q -f 2 -n %q -w %q -c %q)\n' "$MIN" "$BMV2_E" "$ITERS" "$WARMUP" "$CHECKS"
    printf 'EXTRA=('; for e in "${EXTRA[@]+"${EXTRA[@]}"}"; do printf ' %q' "$e"; done; printf ' )\n'
    cat <<'EOS'
rate="$1"; shift   # then the mpirun command prefix
status=0
# Aggregators for the *-agg-* configs: started in their namespaces (the bridge's for the switch
# position, the aggregator hosts' otherwise) with a key file the workers read too.
AGG_PIDS=()
export THC_AGGREGATOR_KEY_FILE="$OUTDIR/raw/agg.keys"
start_aggs() {  # PLACE LOGPREFIX -> AGG_URLS
  local place=$1 logp=$2 nss=() ips=() i
  case $place in
    switch) nss=("$THC_TESTBED_BRIDGE_NS"); ips=("$THC_TESTBED_SWITCH_IP") ;;
    host) nss=("${THC_TESTBED_AGG_NS%%,*}"); ips=("${THC_TESTBED_AGG_HOSTS%%,*}") ;;
    2hosts) IFS=, read -r -a nss <<<"$THC_TESTBED_AGG_NS"; IFS=, read -r -a ips <<<"$THC_TESTBED_AGG_HOSTS" ;;
  esac
  AGG_URLS=""
  AGG_PIDS=()
  for i in "${!ips[@]}"; do
    [[ -n "${ips[$i]}" ]] || { echo "[compare.sh] no address for an aggregator at $place" >&2; return 1; }
    rm -f "$logp.$i.port"
    ip netns exec "${nss[$i]}" "$AGG_BIN" --key-file "$THC_AGGREGATOR_KEY_FILE" --create-key-file \
      --bind "${ips[$i]}" --port 9471 --threads "$AGG_THREADS" --stats-interval 0 --port-file "$logp.$i.port" \
      > "$logp.$i.log" 2>&1 &
    AGG_PIDS+=($!)
    local t=0
    while [[ ! -s "$logp.$i.port" ]]; do
      sleep 0.1; t=$((t + 1))
      (( t < 100 )) || { echo "[compare.sh] thc-aggregator at ${ips[$i]} did not start:" >&2; cat "$logp.$i.log" >&2; return 1; }
    done
    AGG_URLS+="${AGG_URLS:+,}udp://${ips[$i]}:9471"
  done
}
# The switch position for *-agg-bmv2: simple_switch on a port of the bridge (veth bmv0 in br0 <->
# its port 1; every worker is behind that port), its CPU port 15 a veth to bmcpu, thc-switchd's
# interface holding 10.77.0.253 in the bridge namespace. The hosts reach 10.77.0.253 at the switch's
# MAC (static neighbours) and send with UDP checksums filled in (the program forwards what it does
# not aggregate to thc-switchd's kernel socket, which checks them).
BMV2_IP=10.77.0.253
BMV2_MAC=02:54:48:43:00:01
BMV2_UP=0
start_bmv2() {  # LOGPREFIX -> AGG_URLS
  local logp=$1 br=$THC_TESTBED_BRIDGE_NS i ns mac t=0
  BMV2_UP=1
  ip -n "$br" link add bmv0 type veth peer name bmp1 && ip -n "$br" link add bmc15 type veth peer name bmcpu || return 1
  ip -n "$br" link set bmv0 master br0 || return 1
  for i in bmv0 bmp1 bmc15 bmcpu; do ip -n "$br" link set "$i" up; done
  ip -n "$br" addr add "$BMV2_IP/32" dev bmcpu
  ip netns exec "$br" ethtool -K bmcpu tx off rx off > /dev/null 2>&1
  echo "$BMV2_IP,15,$(ip -n "$br" link show bmcpu | awk '/link\/ether/ {print $2}')" > "$logp.routes"
  for ((i = 0; i < THC_TESTBED_NHOSTS; i++)); do
    ns=$THC_TESTBED_PREFIX-h$i
    ip netns exec "$ns" ethtool -K eth0 tx off > /dev/null 2>&1
    ip -n "$ns" neigh replace "$BMV2_IP" lladdr "$BMV2_MAC" dev eth0 nud permanent
    mac=$(ip -n "$ns" link show eth0 | awk '/link\/ether/ {print $2}')
    echo "10.77.0.$((i + 1)),1,$mac" >> "$logp.routes"
  done
  ip netns exec "$br" "$SIMPLE_SWITCH" --thrift-port 9090 --device-id $(($$ % 10000 + 2000)) \
    --notifications-addr "ipc://$logp.ipc" -i 1@bmp1 -i 15@bmc15 "$P4_JSON" > "$logp.simple_switch.log" 2>&1 &
  AGG_PIDS+=($!)
  until ip netns exec "$br" timeout 1 bash -c 'exec 3<>/dev/tcp/127.0.0.1/9090' 2>/dev/null; do
    sleep 0.2; t=$((t + 1))
    (( t < 150 )) || { echo "[compare.sh] simple_switch did not start" >&2; return 1; }
  done
  rm -f "$logp.port"
  ip netns exec "$br" "$SWITCHD_BIN" --key-file "$THC_AGGREGATOR_KEY_FILE" --create-key-file --ip "$BMV2_IP" \
    --routes "$logp.routes" --switch-mac "$BMV2_MAC" --port 9471 --stats-interval 0 --port-file "$logp.port" \
    > "$logp.switchd.log" 2>&1 &
  AGG_PIDS=("$!" "${AGG_PIDS[@]}")  # stopped first: it removes its jobs from the running switch
  t=0
  while [[ ! -s "$logp.port" ]]; do
    sleep 0.1; t=$((t + 1))
    (( t < 100 )) || { echo "[compare.sh] thc-switchd did not start:" >&2; cat "$logp.switchd.log" >&2; return 1; }
  done
  AGG_URLS="udp://$BMV2_IP:9471"
}
stop_bmv2() {
  (( BMV2_UP )) || return 0
  local br=$THC_TESTBED_BRIDGE_NS i ns
  BMV2_UP=0
  ip -n "$br" link del bmv0 2>/dev/null
  ip -n "$br" link del bmc15 2>/dev/null
  for ((i = 0; i < THC_TESTBED_NHOSTS; i++)); do
    ns=$THC_TESTBED_PREFIX-h$i
    ip -n "$ns" neigh del "$BMV2_IP" dev eth0 2>/dev/null
    ip netns exec "$ns" ethtool -K eth0 tx on > /dev/null 2>&1
  done
}
stop_aggs() {
  local p
  for p in "${AGG_PIDS[@]+"${AGG_PIDS[@]}"}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  AGG_PIDS=()
  stop_bmv2
}
trap stop_aggs EXIT
for c in $CONFIGS; do
  mpi_extra=()
  agg_args=()
  case $c in
    none) scheme=none; algo=auto ;;
    none-ring) scheme=none; algo=auto
      mpi_extra=(--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4) ;;
    bf16) scheme=bf16; algo=auto ;;
    bf16-ring) scheme=bf16; algo=auto
      mpi_extra=(--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4) ;;
    *-agg-bmv2)
      scheme=${c%%-agg-*}; algo=ps
      if ! start_bmv2 "$OUTDIR/raw/${rate}_$c.agg"; then
        status=1; stop_aggs; continue
      fi
      agg_args=(--aggregator "$AGG_URLS")
      mpi_extra=(-x THC_AGGREGATOR_KEY_FILE) ;;
    *-agg-*)
      scheme=${c%%-agg-*}; algo=ps
      if ! start_aggs "${c##*-agg-}" "$OUTDIR/raw/${rate}_$c.agg"; then
        status=1; stop_aggs; continue
      fi
      agg_args=(--aggregator "$AGG_URLS")
      mpi_extra=(-x THC_AGGREGATOR_KEY_FILE) ;;
    *-ucx-*) scheme=${c%%-ucx-*}; algo=${c##*-ucx-}; agg_args=(--ucx auto) ;;
    *-flat) b=${c%-flat}; scheme=${b%-*}; algo=${b#*-}; mpi_extra=(-x THC_HIER=0) ;;
    *) scheme=${c%-*}; algo=${c#*-} ;;
  esac
  log="$OUTDIR/raw/${rate}_$c.log"
  echo "[compare.sh] rate=$rate config=$c" >&2
  common=("${COMMON[@]}")
  [[ $c == *-agg-bmv2 ]] && common=("${COMMON_BMV2[@]}")
  if ! "$@" "${mpi_extra[@]+"${mpi_extra[@]}"}" "$TOOL" "${common[@]}" --scheme "$scheme" --algo "$algo" \
       "${agg_args[@]+"${agg_args[@]}"}" "${EXTRA[@]+"${EXTRA[@]}"}" --json "$OUTDIR/raw/${rate}_$c.json" > "$log" 2>&1; then
    status=1
    echo "[compare.sh] rate=$rate config=$c FAILED (see $log)" >&2
  fi
  stop_aggs
  grep -E '^(#|  )' "$log" >&2 || true
done
exit $status
EOS
  } > "$1"
  chmod 755 "$1"
}

RUNNER="$OUT/run_configs.sh"
write_runner "$RUNNER"

overall=0
for rate in $RATES; do
  rm -f "$OUT"/raw/"${rate}"_*.json
  if [[ "$rate" == local ]]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    local_args=()
    if (( RPH > 1 )); then
      # One machine: hosts emulated for thc (and the tool's host-link figures) by THC_HIER_HOSTS.
      THC_HIER_HOSTS=$(printf "$RPH,%.0s" $(seq "$NHOSTS")); export THC_HIER_HOSTS=${THC_HIER_HOSTS%,}
      local_args=(-x THC_HIER_HOSTS)
    fi
    # shellcheck disable=SC2086
    "$RUNNER" "$rate" mpirun -np "$NP" --oversubscribe --bind-to none $YIELD_ARGS "${local_args[@]+"${local_args[@]}"}" || overall=1
  else
    # The runner expands $THC_TESTBED_MPIRUN_ARGS inside the testbed's host namespace h0.
    testbed_args=(--hosts "$NHOSTS" --slots "$RPH" --rate "$rate" --prefix "$PREFIX")
    (( NEED_AGG )) && testbed_args+=(--switch-ip --agg-hosts 2)
    bash "$TESTBED" "${testbed_args[@]}" -- \
      bash -c 'r="$1"; shift; exec "$@" "$r" mpirun -np '"$NP"' $THC_TESTBED_MPIRUN_ARGS '"$YIELD_ARGS"'' _ "$rate" "$RUNNER" \
      || overall=1
  fi
done

# ---- tables and plot data
python3 - "$OUT" "$RATES" "$CONFIGS" "$NP" "$RPH" <<'EOF'
import json, os, re, sys
out, rates, configs, np_, rph = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4], int(sys.argv[5])
n = int(np_)

def rate_bytes_per_s(rate):
    m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", rate.lower())
    if not m:
        return None
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8

def wire_limit_s(c, row, bps):
    """Time the busiest link needs for this config's bytes at the shaped rate: each host's link
    carries, in its busier direction (full duplex), what all of its ranks exchange with other
    hosts (the tool's host_link_per_elem; older JSON: max(up, down) of one rank); an aggregator
    on a host of its own carries n workers' traffic on its one link (half of it each with two
    aggregator hosts)."""
    if bps is None:
        return None
    up = row.get("wire_up_per_elem", row["wire_bytes_per_elem"])
    down = row.get("wire_down_per_elem", row["wire_bytes_per_elem"])
    per_elem = row.get("host_link_per_elem") or max(up, down)
    if c.endswith("-agg-host"):
        per_elem = max(per_elem, max(up, down) * n)
    elif c.endswith("-agg-2hosts"):
        per_elem = max(per_elem, max(up, down) * n / 2)
    return per_elem * row["count"] / bps

def human(b):
    for unit, f in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if b >= f:
            return f"{b / f:g} {unit}"
    return f"{b} B"

layout = f"{np_} ranks" + (f" ({n // rph} hosts x {rph} ranks)" if rph > 1 else "")
md = [f"# thc_allreduce_perf comparison: {layout}", "",
      "time = average over -n iterations of the slowest rank; busbw = size/time * 2(n-1)/n (nccl-tests); "
      "wire = bytes per element on each rank's link in its busier direction (aggregator configs: counted "
      "datagrams, headers included); wire limit = the busiest link's bytes at the shaped rate; "
      "nmse against an exact float64 allreduce.", ""]
if open(os.path.join(out, "settings")).read().strip() == "mpi_yield_when_idle=1":
    md[-1:-1] = ["Open MPI yields the core while it waits (--mpi-yield: mpi_yield_when_idle 1, every config).", ""]
for rate in rates:
    runs = {}
    for c in configs:
        path = os.path.join(out, "raw", f"{rate}_{c}.json")
        try:
            with open(path) as f:
                runs[c] = json.load(f)
        except (OSError, ValueError):
            runs[c] = None
        with open(os.path.join(out, "data", f"{rate}_{c}.dat"), "w") as f:
            f.write("# size_bytes time_us busbw_GBps\n")
            for r in (runs[c] or {}).get("rows", []):
                f.write(f"{r['size']} {r['time_us']} {r['busbw']}\n")
    md.append(f"## rate: {rate}")
    md.append("")
    sizes = sorted({r["size"] for v in runs.values() if v for r in v["rows"]})
    for title, key, fmt in (("time (ms)", "time_us", lambda v: f"{v / 1e3:.2f}"),
                            ("busbw (GB/s)", "busbw", lambda v: f"{v:.3f}")):
        md += [f"### {title}", "", "| size |" + "".join(f" {c} |" for c in configs),
               "|---:|" + "---:|" * len(configs)]
        for s in sizes:
            line = f"| {human(s)} |"
            for c in configs:
                row = next((r for r in (runs[c] or {}).get("rows", []) if r["size"] == s), None)
                line += " - |" if row is None else f" {fmt(row[key])} |"
            md.append(line)
        md.append("")
    base = runs.get("none")
    ring = runs.get("none-ring")
    bps = rate_bytes_per_s(rate)
    host_col = rph > 1  # several ranks share a host link: show what crosses it
    md += ["| config | algo ran | wire B/elem (busier way) | " + ("host link B/elem | " if host_col else "") +
           "worst nmse | time at the largest size (ms) | "
           "wire limit (ms) | share of wire limit | speedup vs none | speedup vs none-ring | retransmissions | status |",
           "|---|---|---:|" + ("---:|" if host_col else "") + "---:|---:|---:|---:|---:|---:|---:|---|"]
    for c in configs:
        v = runs[c]
        if not v or not v["rows"]:
            md.append(f"| {c} | - | - | - | - | FAILED (see raw/{rate}_{c}.log) |")
            continue
        last = v["rows"][-1]
        def speedup(ref):
            if not ref or not ref["rows"] or ref is v:
                return "-"
            b = next((r for r in ref["rows"] if r["size"] == last["size"]), None)
            return f"{b['time_us'] / last['time_us']:.2f}x" if b and last["time_us"] > 0 else "-"
        lim = wire_limit_s(c, last, bps)
        lim_s = "-" if lim is None else f"{lim * 1e3:.1f}"
        share = "-" if lim is None or last["time_us"] <= 0 else f"{100 * lim / (last['time_us'] * 1e-6):.0f} %"
        rt = "-"
        if last.get("packets"):
            rt = f"{100 * last['retransmissions'] / last['packets']:.2f} %"
        algos = sorted({r["algo"] + ("/hier" if r.get("hier_hosts") else "") for r in v["rows"]})
        hl = f"{last.get('host_link_per_elem', 0):.3f} | " if host_col else ""
        md.append(f"| {c} | {','.join(algos)} | {last['wire_bytes_per_elem']:.3f} | {hl}{v['worst_nmse']:.3g} | "
                  f"{last['time_us'] / 1e3:.1f} | {lim_s} | {share} | {speedup(base)} | {speedup(ring)} | {rt} | "
                  f"{'ok' if v['ok'] else 'NMSE above bound ' + str(v['nmse_bound'])} |")
    md.append("")
with open(os.path.join(out, "results.md"), "w") as f:
    f.write("\n".join(md) + "\n")
EOF

# ---- plot: time and busbw against size
plot_status=0
series=()
for rate in $RATES; do for c in $CONFIGS; do
  f="$OUT/data/${rate}_$c.dat"
  [[ $(grep -vc '^#' "$f" || true) -gt 0 ]] && series+=("$rate $c $f")
done; done
if (( ${#series[@]} == 0 )); then
  echo "compare.sh: no data to plot" >&2; plot_status=3
elif command -v gnuplot >/dev/null; then
  gp="$OUT/compare.gp"
  {
    echo "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size 1400,600 noenhanced } else { set terminal png size 1400,600 noenhanced }"
    echo "set output '$OUT/compare.png'"
    echo "set multiplot layout 1,2 title 'thc_allreduce_perf, $NP ranks'"
    echo "set logscale x 2; set grid; set key top left; set xlabel 'size (bytes)'"
    echo "set format x '%.0b %BB'"
    echo "set logscale y; set ylabel 'time (us)'; set title 'time'"
    printf "plot "; sep=""
    for s in "${series[@]}"; do read -r r c f <<<"$s"; printf "%s'%s' using 1:2 with linespoints title '%s %s'" "$sep" "$f" "$c" "$r"; sep=", "; done; echo
    echo "unset logscale y; set ylabel 'busbw (GB/s)'; set title 'bus bandwidth'"
    printf "plot "; sep=""
    for s in "${series[@]}"; do read -r r c f <<<"$s"; printf "%s'%s' using 1:3 with linespoints title '%s %s'" "$sep" "$f" "$c" "$r"; sep=", "; done; echo
    echo "unset multiplot"
  } > "$gp"
  gnuplot "$gp" || { echo "compare.sh: gnuplot failed" >&2; plot_status=3; }
elif python3 -c 'import matplotlib' 2>/dev/null; then
  python3 - "$OUT/compare.png" "$NP" "${series[@]}" <<'EOF'
import sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
png, np_ = sys.argv[1], sys.argv[2]
fig, (a, b) = plt.subplots(1, 2, figsize=(14, 6))
for s in sys.argv[3:]:
    rate, c, path = s.split(" ", 2)
    pts = [tuple(map(float, l.split())) for l in open(path) if l.strip() and not l.startswith("#")]
    a.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{c} {rate}")
    b.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=f"{c} {rate}")
for ax, yl in ((a, "time (us)"), (b, "busbw (GB/s)")):
    ax.set_xscale("log", base=2); ax.set_xlabel("size (bytes)"); ax.set_ylabel(yl); ax.grid(True); ax.legend()
a.set_yscale("log")
fig.suptitle(f"thc_allreduce_perf, {np_} ranks")
fig.tight_layout()
fig.savefig(png, dpi=100)
EOF
  [[ $? -eq 0 ]] || plot_status=3
else
  echo "compare.sh: no plot: needs gnuplot (apt-get install gnuplot-nox) or python3-matplotlib" >&2
  plot_status=3
fi

echo "compare.sh: results in $OUT/results.md" >&2
[[ -f "$OUT/compare.png" ]] && echo "compare.sh: plot in $OUT/compare.png" >&2
(( overall )) && exit 1
(( plot_status )) && exit "$plot_status"
exit 0
