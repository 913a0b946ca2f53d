#!/usr/bin/env bash
# calibrate.sh -- measure the scale model's per-core inputs on this machine and write them as JSON
# (perf/model/thc_model.py --calib FILE).
#
# Usage:
#   perf/model/calibrate.sh [--out FILE] [--bin-dir BUILD] [--quick] [--testbed [--mpi-yield]]
#
#   --out FILE     where the JSON goes (default perf/model/calib_local.json; the committed default
#                  is perf/model/calib_default.json)
#   --bin-dir DIR  the build tree (default: build)
#   --quick        shorter runs (Google Benchmark min time 0.2 s, 2 aggregator reps)
#   --testbed      also measure what the emulated cluster adds (root: network namespaces): Open MPI's
#                  ring step latency from small calls at 1 Gbit/s and its transport's CPU per byte
#                  from an unshaped float32 ring (perf/compare.sh --rates "none 1gbit" --min-size
#                  256K --max-size 16M --iters 10 --configs "none-ring thc-int"); the CPU per call
#                  of thc-agg-switch and thc-ps at 128 MB and 1 Gbit/s (the ranks' and the
#                  aggregator's user+sys, the kernel's work in their contexts): per worker datagram
#                  and per byte of thc's schedules; the hop latency of thc's schedules from the int
#                  ring's steady state (thc-int at 6M and 48M: the time difference over 42 more
#                  chunks); then thc_model.py calibrate-testbed. The model's `testbed` scenario
#                  needs it
#   --mpi-yield    with --testbed: the testbed's runs with compare.sh --mpi-yield (Open MPI yields the
#                  core while waiting instead of busy-polling); recorded in the JSON, and `validate`
#                  refuses a run whose setting differs
#
# What it runs (about 1-2 minutes; --testbed 1-3 more):
#   codec_bench --cpu-time   one core: memcpy, THC encode (index and value form, one call per block
#                            as the engine does), THC decode, the PS owner's lookup-add, the
#                            integer ring's add, a float32 sum (the rates the model scales by cores)
#   aggregator_bench         thc-aggregator on loopback, 1 thread, 4 workers, THC b=4 -> u8 at the
#                            MTU's 1408 lanes: lanes added per aggregator CPU-second
#   thc_allreduce_perf       2 ranks, Open MPI's TCP BTL over loopback, float32 ring, 64 MB: CPU per
#                            byte moved through MPI and the kernel's TCP (the `# cpu:` line), less
#                            the float32 sums
# The GPU rates are not measured here: they are README's H200 kernel figures (an earlier
# measurement, `thc_gpu_bench` in perf/gpu_check.sh) and are copied as such.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT="$HERE/calib_local.json"
BIN="$ROOT/build"
QUICK=0
TESTBED=0
YIELD=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --bin-dir) BIN="$2"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --testbed) TESTBED=1; shift ;;
    --mpi-yield) YIELD=(--mpi-yield); shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2; exit 2 ;;
    *) echo "calibrate.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
(( ${#YIELD[@]} && ! TESTBED )) && { echo "calibrate.sh: --mpi-yield applies to the testbed's runs: add --testbed" >&2; exit 2; }
CB="$BIN/perf/codec_bench"
AB="$BIN/perf/aggregator_bench/aggregator_bench"
AP="$BIN/perf/allreduce_perf/thc_allreduce_perf"
for b in "$CB" "$AB" "$AP"; do
  [[ -x "$b" ]] || { echo "calibrate.sh: $b not built (cmake --build $BIN --target codec_bench aggregator_bench thc_allreduce_perf)" >&2; exit 2; }
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

MIN_TIME=()
(( QUICK )) && MIN_TIME=(--benchmark_min_time=0.2)
echo "calibrate.sh: codec_bench" >&2
"$CB" --cpu-time "${MIN_TIME[@]+"${MIN_TIME[@]}"}" \
  --benchmark_filter='^BM_Memcpy/|^BM_ThcEncode/log2B:14/value:[01]/calls:1/|^BM_ThcDecode/log2B:14/threads:0/|^BM_LookupAdd/|^BM_AddInts/|^BM_FloatSum/' \
  --benchmark_out="$TMP/codec.json" --benchmark_out_format=json > "$TMP/codec.log" 2>&1 \
  || { cat "$TMP/codec.log" >&2; exit 1; }

REPS=5
(( QUICK )) && REPS=2
echo "calibrate.sh: aggregator_bench" >&2
"$AB" --reps "$REPS" --threads 1 --jobs 1 --lanes 8192 --workers 4 > "$TMP/agg.log" 2>&1 \
  || { cat "$TMP/agg.log" >&2; exit 1; }

echo "calibrate.sh: thc_allreduce_perf over loopback TCP" >&2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun -np 2 --oversubscribe --bind-to none --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo \
  --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4 \
  "$AP" -b 64M -e 64M -n 5 -w 1 -c 0 --scheme none > "$TMP/tcp.log" 2>&1 \
  || { cat "$TMP/tcp.log" >&2; exit 1; }

python3 - "$TMP" "$OUT" "$*" <<'EOF'
import json, os, platform, re, subprocess, sys, time
tmp, out, args = sys.argv[1], sys.argv[2], sys.argv[3]
with open(os.path.join(tmp, "codec.json")) as f:
    bench = json.load(f)
rate = {}
for b in bench["benchmarks"]:
    if b.get("run_type") == "aggregate":
        continue
    rate[re.sub(r"/(min_time|real_time)[^/]*", "", b["name"])] = b["bytes_per_second"] / 1e9
def get(name):
    if name in rate:
        return rate[name]
    sys.exit(f"calibrate.sh: codec_bench gave no {name} row (rows: {sorted(rate)})")
memcpy = get("BM_Memcpy")
codec = {
    "memcpy_GBps": memcpy,
    "thc_encode_GBps": get("BM_ThcEncode/log2B:14/value:0/calls:1"),
    "thc_encode_value_GBps": get("BM_ThcEncode/log2B:14/value:1/calls:1"),
    "thc_decode_GBps": get("BM_ThcDecode/log2B:14/threads:0"),
    # Rates per element of float32 input (bytes/4 = elements): lookup-add per contributor lane.
    "lookup_add_Glanes_s": get("BM_LookupAdd") / 4,
    "int_add_GBps": get("BM_AddInts/bytes:2") / 2,   # bytes of u16 sums added per second
    "f32_sum_GBps": get("BM_FloatSum"),
    # The bf16 hook converts float32 <-> bf16 (a pass over the vector each way) and sums pairs in
    # float: taken as memcpy and the float32 sum of the same run (not benchmarked separately).
    "bf16_convert_GBps": memcpy,
    "bf16_sum_GBps": get("BM_FloatSum") / 2,
    # The share of codec_bench's THC encode time that is the prelude's read of the input: README
    # (Codec throughput, `perf record` of ThcEncode): 18 %.
    "prelude_share_of_encode": 0.18,
}
agg = None
cols = None
for line in open(os.path.join(tmp, "agg.log")):
    if line.startswith("encoding"):
        cols = line.split()[1:]  # the columns after the encoding's name (which has spaces)
    elif line.startswith("index b=4 -> u8") and cols:
        f = dict(zip(cols, line.split()[-len(cols):]))
        lanes, cpu_rate = int(f["lanes"]), float(f["Mlanes/cpu-s"])
        agg = {"lanes_per_packet": lanes, "lanes_per_cpu_s": cpu_rate * 1e6, "Mlanes_per_s": float(f["Mlanes/s"]),
               # One worker datagram carries `lanes` lanes; the aggregator receives it and sends a
               # result back: its CPU per worker datagram. The model charges a worker the same per
               # datagram (a UDP send and a receive).
               "cpu_s_per_worker_packet": lanes / (cpu_rate * 1e6)}
if not agg:
    sys.exit("calibrate.sh: aggregator_bench printed no 'index b=4 -> u8' row")
cpu_ms = None
size = None
for line in open(os.path.join(tmp, "tcp.log")):
    m = re.search(r"cpu: ([0-9.]+) ms per call per rank", line)
    if m:
        cpu_ms = float(m.group(1))
if cpu_ms is None:
    sys.exit("calibrate.sh: thc_allreduce_perf printed no '# cpu:' line")
S = 64 << 20
n = 2
moved = 2 * (2 * (n - 1) / n) * S      # bytes sent plus received per rank by the ring
sums = (n - 1) / n * S / (codec["f32_sum_GBps"] * 1e9)
tcp = {"tcp_cpu_s_per_GB": max(1e-6, (cpu_ms / 1e3 - sums) / moved * 1e9), "measured_cpu_ms_per_call": cpu_ms}
cpu = "unknown"
try:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
except OSError:
    pass
res = {
    "machine": f"{platform.node()}: {cpu}, {os.cpu_count()} cores, Linux {platform.release()}",
    "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    "load_average": os.getloadavg()[0],
    "command": "perf/model/calibrate.sh " + args,
    "note": "one-core rates (codec_bench --cpu-time); the machine may have been shared (load_average)",
    "codec": codec,
    "aggregator": agg,
    "transport": tcp,
    "gpu_h200": {
        "source": "README.md, GPU verification: thc_gpu_bench --count 67108864 --iters 20 on an H200 (commit bb5f539), block 2^15; not measured by this script",
        "thc_encode_GBps": 755, "thc_decode_GBps": 786, "thc_prelude_GBps": 3837},
}
with open(out, "w") as f:
    json.dump(res, f, indent=1)
    f.write("\n")
print(json.dumps(res, indent=1))
EOF
if (( TESTBED )); then
  echo "calibrate.sh: testbed (perf/compare.sh on the emulated cluster)" >&2
  bash "$ROOT/perf/compare.sh" "${YIELD[@]+"${YIELD[@]}"}" --out "$TMP/testbed" --rates "none 1gbit" --min-size 256K --max-size 16M --iters 10 \
    --configs "none-ring thc-int" --bin-dir "$BIN/perf/allreduce_perf" > "$TMP/testbed.log" 2>&1 \
    || { tail -30 "$TMP/testbed.log" >&2; exit 1; }
  # CPU per call of thc's own paths at 128 MB (outside the validation's sizes): the ranks' `# cpu:`
  # line; the aggregator's user+sys from /proc while it runs (it sleeps between calls).
  : > "$TMP/cpu.txt"
  for cfg in thc-agg-switch thc-ps; do
    echo "calibrate.sh: testbed CPU of $cfg at 128M" >&2
    d="$TMP/cpu_$cfg"
    bash "$ROOT/perf/compare.sh" "${YIELD[@]+"${YIELD[@]}"}" --out "$d" --rates 1gbit --min-size 128M --max-size 128M --iters 5 \
      --configs "$cfg" --bin-dir "$BIN/perf/allreduce_perf" > "$TMP/cpu_$cfg.log" 2>&1 &
    cpid=$! agg_ticks=0
    while kill -0 "$cpid" 2>/dev/null; do
      p=$(pgrep -f -- "--key-file $d/raw/agg.keys" | head -1 || true)
      [[ -n "$p" ]] && t=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null) && [[ -n "$t" ]] && agg_ticks=$t
      sleep 0.2
    done
    wait "$cpid" || { tail -30 "$TMP/cpu_$cfg.log" >&2; exit 1; }
    rank_ms=$(sed -n 's/.*cpu: \([0-9.]*\) ms per call per rank.*/\1/p' "$d"/raw/1gbit_"$cfg".log | head -1)
    rx=$(grep -ho 'rx_packets=[0-9]*' "$d"/raw/*agg.0.log 2>/dev/null | tail -1 | cut -d= -f2 || true)
    [[ -n "$rank_ms" ]] || { echo "calibrate.sh: no '# cpu:' line from $cfg" >&2; exit 1; }
    echo "$cfg 128M $rank_ms $(awk -v t="$agg_ticks" -v hz="$(getconf CLK_TCK)" 'BEGIN{print t / hz}') ${rx:-0}" >> "$TMP/cpu.txt"
  done
  cat "$TMP/cpu.txt" >&2
  # The hop of thc's schedules in the steady state: the int ring at 6 and 48 MB (6 and 48 chunks;
  # sizes between the validation's 4-64 MB, not equal to them; 12 and 24 MB come along).
  echo "calibrate.sh: testbed thc-int at 6M-48M" >&2
  bash "$ROOT/perf/compare.sh" "${YIELD[@]+"${YIELD[@]}"}" --out "$TMP/steady" --rates 1gbit --min-size 6M --max-size 48M --iters 5 \
    --configs thc-int --bin-dir "$BIN/perf/allreduce_perf" > "$TMP/steady.log" 2>&1 \
    || { tail -30 "$TMP/steady.log" >&2; exit 1; }
  python3 "$HERE/thc_model.py" --calib "$OUT" calibrate-testbed "$TMP/testbed" --cpu "$TMP/cpu.txt" \
    --steady "$TMP/steady" --mpi-yield "${#YIELD[@]}" --write "$OUT"
fi
echo "calibrate.sh: wrote $OUT" >&2
