#!/usr/bin/env bash
# loss.sh -- what random datagram loss costs the aggregation path: THC (or the scheme given after --) through thc-aggregator,
# lossless and at each --drops probability, time per call, its ratio to lossless, the
# retransmissions and where the time went (waiting on a retransmission timer, held back by the
# congestion window or by the job's slots, other waiting).
#
# Usage:
#   perf/loss.sh [--size 16M] [--drops "0 0.01 0.05"] [--np 4] [--reps 3] [--iters 5] [--warmup 1]
#                [--checks 1] [--cluster] [--rate 1gbit] [--side client|aggregator] [--agg-threads 1]
#                [--bin-dir DIR] [--out DIR] [--prefix P] [-- EXTRA_TOOL_ARGS...]
#
#   --size S        bytes per call (thc_allreduce_perf -b S -e S; K/M/G suffixes), default 16M
#   --drops LIST    drop probabilities per datagram; the first must be 0 (the reference)
#   --np N          ranks (default 4)
#   --reps R        runs per drop probability, interleaved (default 3): the table gives the median
#                   and the spread (min..max) of the time per call
#   --iters/--warmup/--checks   thc_allreduce_perf -n / -w / -c
#   --cluster       run on the emulated cluster of testbed/netns_cluster.sh (root): one host per
#                   rank, links shaped to --rate, the aggregator on the bridge (the switch position,
#                   compare.sh's thc-agg-switch); default: loopback, aggregator on 127.0.0.1
#   --side S        where the loss is injected: client (default: the workers' fault layer,
#                   THC_FAULT_DROP, both directions, as a lossy fabric near every worker) or
#                   aggregator (thc-aggregator --fault-drop, both directions)
#   --agg-threads N threads of thc-aggregator (default 1)
#   --prefix P      namespace prefix of the testbed (default loss<pid>)
#   after --        extra arguments for thc_allreduce_perf (e.g. --bits 2)
#
# Fault seeds are fixed (THC_FAULT_SEED / --fault-seed = the repetition number), so a run of the
# same build on the same machine drops the same datagrams of the same sequence of sends.
#
# Output: a markdown table on stdout and in DIR/loss.md; DIR/raw/ keeps every run's log (the tool's
# rows, every rank's THC_DEBUG client statistics, the aggregator's final statistics).
# Columns (client figures are means over ranks, per call: warm-up, timed and check calls all count):
#   time/call        the tool's time column (slowest rank, mean over -n calls): median of the reps
#                    [min..max]
#   ratio            median time / median lossless time; [min..max] of the ratios of each rep to
#                    the lossless run of the same rep (run just before it: on a shared machine the
#                    load drifts less between them)
#   retx             retransmitted data packets / data packets (all ranks)
#   fast / timeout   retransmissions found by later results / by an expired timer (per rank and call)
#   wait             time a rank spent blocked on the aggregator per call, split into
#     rto            no result arriving until a retransmission timer fired (waiting on the RTO)
#     cwnd, slots    asleep with packets queued that the congestion window / the job's slots (a
#                    hole at the window's base) held back
#     other          the rest: round trips, other workers, pacing
#   cwnd             mean congestion window (packets) over results; cuts: window decreases for loss
#   agg resends      results the aggregator sent again for finished slots (lost results)
# Exit status: 0 when every run succeeded, 1 when one failed, 2 on usage errors.
set -euo pipefail

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2; exit 2; }
die() { echo "loss.sh: $*" >&2; exit 2; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
OUT="perf-loss-$(date +%Y%m%d-%H%M%S)"
SIZE=16M
DROPS="0 0.01 0.05"
NP=4
REPS=3
ITERS=5
WARMUP=1
CHECKS=1
CLUSTER=0
RATE=1gbit
SIDE=client
AGG_THREADS=1
BIN_DIR=""
PREFIX=""
EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --size) SIZE="$2"; shift 2 ;;
    --drops) DROPS="$2"; shift 2 ;;
    --np) NP="$2"; shift 2 ;;
    --reps) REPS="$2"; shift 2 ;;
    --iters) ITERS="$2"; shift 2 ;;
    --warmup) WARMUP="$2"; shift 2 ;;
    --checks) CHECKS="$2"; shift 2 ;;
    --cluster) CLUSTER=1; shift ;;
    --rate) RATE="$2"; shift 2 ;;
    --side) SIDE="$2"; shift 2 ;;
    --agg-threads) AGG_THREADS="$2"; shift 2 ;;
    --bin-dir) BIN_DIR="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --prefix) PREFIX="$2"; shift 2 ;;
    -h|--help) usage ;;
    --) shift; EXTRA=("$@"); break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
for v in NP REPS ITERS WARMUP CHECKS AGG_THREADS; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || die "--${v,,} must be a non-negative integer"
done
(( NP >= 1 && REPS >= 1 && ITERS >= 1 && AGG_THREADS >= 1 )) || die "--np, --reps, --iters, --agg-threads must be >= 1"
[[ "$SIZE" =~ ^[0-9]+[KMG]?$ ]] || die "--size must be bytes with an optional K/M/G suffix"
[[ "$SIDE" == client || "$SIDE" == aggregator ]] || die "--side must be client or aggregator"
read -r -a DROP_LIST <<<"$DROPS"
(( ${#DROP_LIST[@]} >= 1 )) || die "--drops is empty"
for d in "${DROP_LIST[@]}"; do
  [[ "$d" =~ ^(0|1|0?\.[0-9]+|0\.[0-9]*)$ ]] || die "--drops: '$d' is not a probability in [0, 1]"
done
python3 -c "import sys; sys.exit(0 if float('${DROP_LIST[0]}') == 0 else 1)" || die "--drops must start with 0 (the reference)"
[[ -z "$PREFIX" ]] && PREFIX="loss$$"

TOOL=""
if [[ -n "$BIN_DIR" ]]; then
  TOOL="$BIN_DIR/thc_allreduce_perf"
else
  for cand in "$ROOT"/build/perf/allreduce_perf/thc_allreduce_perf "$ROOT"/build*/perf/allreduce_perf/thc_allreduce_perf; do
    [[ -x "$cand" ]] && { TOOL="$cand"; break; }
  done
  [[ -z "$TOOL" ]] && TOOL=$(command -v thc_allreduce_perf || true)
fi
[[ -n "$TOOL" && -x "$TOOL" ]] || die "thc_allreduce_perf not found (build it, or pass --bin-dir DIR)"
TOOL=$(cd "$(dirname "$TOOL")" && pwd)/$(basename "$TOOL")
AGG_BIN=""
for cand in "$(dirname "$TOOL")/../../switch_offload/thc-aggregator" "$(dirname "$TOOL")/thc-aggregator"; do
  [[ -x "$cand" ]] && { AGG_BIN=$(cd "$(dirname "$cand")" && pwd)/thc-aggregator; break; }
done
[[ -z "$AGG_BIN" ]] && AGG_BIN=$(command -v thc-aggregator || true)
[[ -n "$AGG_BIN" ]] || die "thc-aggregator not found next to thc_allreduce_perf or on PATH"
command -v python3 >/dev/null || die "python3 is needed for the table"
command -v mpirun >/dev/null || die "mpirun not found"
if (( CLUSTER )); then
  [[ $(id -u) -eq 0 ]] || die "--cluster needs root (network namespaces)"
fi

mkdir -p "$OUT/raw"
OUT=$(cd "$OUT" && pwd)

# ---- the runs: a script that gets the mpirun prefix (loopback, or inside the testbed's host h0)
RUNNER="$OUT/run_loss.sh"
{
  echo '#!/usr/bin/env bash'
  echo 'set -u'
  printf 'TOOL=%q\nAGG_BIN=%q\nOUTDIR=%q\nDROPS=%q\nREPS=%q\nSIDE=%q\nAGG_THREADS=%q\nCLUSTER=%q\n' \
    "$TOOL" "$AGG_BIN" "$OUT" "$DROPS" "$REPS" "$SIDE" "$AGG_THREADS" "$CLUSTER"
  printf 'COMMON=(-b %q -e %q -n %q -w %q -c %q --scheme thc)\n' "$SIZE" "$SIZE" "$ITERS" "$WARMUP" "$CHECKS"
  printf 'EXTRA=('; for e in "${EXTRA[@]+"${EXTRA[@]}"}"; do printf ' %q' "$e"; done; printf ' )\n'
  cat <<'EOS'
export THC_AGGREGATOR_KEY_FILE="$OUTDIR/raw/agg.keys"
AGG_PID=""
stop_agg() {
  [[ -n "$AGG_PID" ]] || return 0
  kill -TERM "$AGG_PID" 2>/dev/null
  wait "$AGG_PID" 2>/dev/null
  AGG_PID=""
}
trap stop_agg EXIT
start_agg() {  # LOG DROP -> AGG_URL
  local log=$1 drop=$2 rep=$3 ip=127.0.0.1 ns=() fault=()
  if (( CLUSTER )); then ip=$THC_TESTBED_SWITCH_IP; ns=(ip netns exec "$THC_TESTBED_BRIDGE_NS"); fi
  [[ "$SIDE" == aggregator ]] && fault=(--fault-drop "$drop" --fault-seed "$rep")
  rm -f "$log.port"
  "${ns[@]+"${ns[@]}"}" "$AGG_BIN" --key-file "$THC_AGGREGATOR_KEY_FILE" --create-key-file --bind "$ip" --port 0 \
    --threads "$AGG_THREADS" --stats-interval 0 --port-file "$log.port" "${fault[@]+"${fault[@]}"}" > "$log" 2>&1 &
  AGG_PID=$!
  local t=0
  while [[ ! -s "$log.port" ]]; do
    sleep 0.1; t=$((t + 1))
    (( t < 100 )) || { echo "[loss.sh] thc-aggregator did not start:" >&2; cat "$log" >&2; return 1; }
  done
  AGG_URL="udp://$ip:$(cat "$log.port")"
}
status=0
for rep in $(seq 1 "$REPS"); do
  for drop in $DROPS; do
    base="$OUTDIR/raw/drop${drop}_rep$rep"
    echo "[loss.sh] drop=$drop rep=$rep" >&2
    if ! start_agg "$base.agg.log" "$drop" "$rep"; then status=1; continue; fi
    client_drop=0
    [[ "$SIDE" == client ]] && client_drop=$drop
    if ! THC_DEBUG=1 THC_FAULT_DROP=$client_drop THC_FAULT_SEED=$rep "$@" -x THC_DEBUG -x THC_FAULT_DROP \
         -x THC_FAULT_SEED -x THC_AGGREGATOR_KEY_FILE "$TOOL" "${COMMON[@]}" --aggregator "$AGG_URL" \
         "${EXTRA[@]+"${EXTRA[@]}"}" > "$base.log" 2>&1; then
      status=1
      echo "[loss.sh] drop=$drop rep=$rep FAILED (see $base.log)" >&2
    fi
    stop_agg
  done
done
exit $status
EOS
} > "$RUNNER"
chmod 755 "$RUNNER"

status=0
if (( CLUSTER )); then
  bash "$HERE/testbed/netns_cluster.sh" --hosts "$NP" --rate "$RATE" --prefix "$PREFIX" --switch-ip -- \
    bash -c 'exec "$1" mpirun -np '"$NP"' $THC_TESTBED_MPIRUN_ARGS' _ "$RUNNER" || status=1
  where="$NP hosts at $RATE, thc-aggregator on the bridge (switch position)"
else
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  "$RUNNER" mpirun -np "$NP" --oversubscribe --bind-to none || status=1
  where="loopback, $NP ranks and thc-aggregator on this machine ($(nproc) cores)"
fi

# The scheme the runs used: thc unless the extra arguments chose another (the last --scheme wins).
SCHEME=thc
prev=
for e in "${EXTRA[@]+"${EXTRA[@]}"}"; do
  if [ "$prev" = --scheme ]; then SCHEME=$e; fi
  case $e in --scheme=*) SCHEME=${e#--scheme=} ;; esac
  prev=$e
done
python3 - "$OUT" "$DROPS" "$REPS" "$NP" "$SIZE" "$ITERS" "$WARMUP" "$CHECKS" "$SIDE" "$where" "$SCHEME" <<'EOF' | tee "$OUT/loss.md"
import os, re, statistics, sys
out, drops, reps, np_, size, iters, warmup, checks, side, where, scheme = sys.argv[1:12]
drops, reps, n = drops.split(), int(reps), int(np_)
calls = int(iters) + int(warmup) + int(checks)

row_re = re.compile(r"^\s+(\d+)\s+(\d+)\s+\S+\s+\S+\s+([0-9.]+)\s+\S+\s+\S+\s+\S+\s+(\S+)\s+\S+")
def kv(line):
    return {k: float(v) for k, v in re.findall(r"(\w+)=([0-9.]+)", line)}

def parse(drop, rep):
    base = os.path.join(out, "raw", f"drop{drop}_rep{rep}")
    r = {"time": None, "ranks": [], "agg": {}, "nmse": None}
    try:
        for line in open(base + ".log"):
            m = row_re.match(line)
            if m and r["time"] is None:
                r["time"], r["nmse"] = float(m.group(3)) / 1e3, m.group(4)
            m = re.search(r"aggregator wire: (\d+) data packets, (\d+) retransmissions", line)
            if m:
                r["packets"], r["retx"] = int(m.group(1)), int(m.group(2))
            if re.match(r"thc: rank \d+ udp: ", line):
                r["ranks"].append(kv(line.split(": ", 1)[1].replace("(", "").replace(",", "")))
        for line in open(base + ".agg.log"):
            if "final stats:" in line:
                r["agg"] = kv(line.split("final stats:", 1)[1])
    except OSError:
        pass
    return r

def fmt(v, d=1):
    return "-" if v is None else f"{v:.{d}f}"

runs = {d: [parse(d, k) for k in range(1, reps + 1)] for d in drops}
def med_time(d):
    t = [r["time"] for r in runs[d] if r["time"] is not None]
    return (statistics.median(t), min(t), max(t)) if t else (None, None, None)
ref = med_time(drops[0])[0]

print(f"# Random loss: {scheme.upper() if scheme == 'thc' else scheme.capitalize()} through thc-aggregator, {size} per call, {n} ranks, {where}")
print()
print(f"Loss injected by the {'workers (THC_FAULT_DROP)' if side == 'client' else 'aggregator (--fault-drop)'}, "
      f"per datagram, both directions; {reps} interleaved runs per row, {iters} timed calls each "
      f"(+{warmup} warm-up, {checks} check). Client figures: per rank and call, mean over ranks and reps.")
print()
print("| drop | time/call ms, median [min..max] | ratio | retx % | fast | timeout | wait ms | rto ms | cwnd ms | "
      "slots ms | other ms | cwnd | cuts | agg resends | nmse |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for d in drops:
    med, lo, hi = med_time(d)
    rs = [r for r in runs[d] if r["ranks"]]
    def per_call(key):
        v = [x.get(key, 0) for r in rs for x in r["ranks"]]
        return sum(v) / len(v) / calls if v else None
    def mean(key):
        v = [x.get(key, 0) for r in rs for x in r["ranks"]]
        return sum(v) / len(v) if v else None
    pk = sum(r.get("packets", 0) for r in runs[d])
    rt = sum(r.get("retx", 0) for r in runs[d])
    wait, rto, cw, sl = (per_call(k) for k in ("wait_ms", "rto_wait_ms", "cwnd_wait_ms", "slots_wait_ms"))
    other = None if wait is None else wait - rto - cw - sl
    cuts = per_call("loss_cuts")
    agg = [r["agg"].get("result_resends", 0) / calls for r in runs[d] if r["agg"]]
    nm = sorted({r["nmse"] for r in runs[d] if r["nmse"]})
    ratio = "-" if med is None or not ref else f"{med / ref:.2f}x"
    paired = [r["time"] / z["time"] for r, z in zip(runs[d], runs[drops[0]]) if r["time"] and z["time"]]
    if paired and d != drops[0]:
        ratio += f" [{min(paired):.2f}..{max(paired):.2f}]"
    spread = "FAILED" if med is None else f"{med:.1f} [{lo:.1f}..{hi:.1f}]"
    print(f"| {float(d) * 100:g} % | {spread} | {ratio} | {fmt(100 * rt / pk if pk else None, 2)} | "
          f"{fmt(per_call('fast'))} | {fmt(per_call('timeouts'))} | {fmt(wait)} | {fmt(rto)} | {fmt(cw)} | {fmt(sl)} | "
          f"{fmt(other)} | {fmt(mean('cwnd_mean'), 0)} | {fmt(cuts)} | {fmt(statistics.mean(agg) if agg else None)} | "
          f"{' '.join(nm) or '-'} |")
EOF
exit $status
