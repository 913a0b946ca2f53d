#!/usr/bin/env bash
# The first run: install dependencies, build, then compare float32 MPI_Allreduce (Open MPI's default
# and with the ring algorithm forced, what a tuned HPC job uses) with THC and Cnat on an emulated
# cluster of 4 hosts with 1 Gbit/s links (network namespaces + tbf, perf/testbed), and THC through
# thc-aggregator placed where the switch is. 32 MB of float32 gradients per rank, about a minute.
# Prints time, speedup, bytes per element on the wire and NMSE, then what shared memory shows.
#
#   ./scripts/demo.sh            (root: apt and network namespaces; everything is cleaned up,
#                                 also on Ctrl-C)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
# Its own build folder: ./scripts/test.sh builds build/ with other options (tests, debug info), and
# neither run should undo the other's configuration.
B=build-demo
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTHC_BUILD_TESTS=OFF -DTHC_BUILD_PERF=ON >/dev/null
cmake --build "$B" --target thc_allreduce_perf thc-aggregator thc_demo
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

OUT=$B/demo-results
SIZE=${THC_DEMO_SIZE:-32M}
if [ "$(id -u)" -ne 0 ] || ! ip netns list >/dev/null 2>&1; then
  echo "demo: the 1 Gbit/s cluster needs root (network namespaces); running on shared memory only" >&2
else
  echo "demo: 4 emulated hosts, 1 Gbit/s links, $SIZE of float32 per rank (this takes about a minute)"
  rm -rf "$OUT"
  if ! perf/compare.sh --bin-dir "$B/perf/allreduce_perf" --out "$OUT" --rates 1gbit --min-size "$SIZE" --max-size "$SIZE" --iters 2 --warmup 1 \
      --checks 1 --configs "none none-ring thc-auto cnat-auto thc-agg-switch" >"$OUT.log" 2>&1; then
    tail -n 30 "$OUT.log" >&2
    echo "demo: some runs failed (log: $OUT.log)" >&2
  fi
  python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
names = {"none": "float32 MPI_Allreduce (Open MPI default)",
         "none-ring": "float32 MPI_Allreduce (ring forced)",
         "thc-auto": "THC (4-bit, over MPI)",
         "cnat-auto": "Cnat (over MPI)",
         "thc-agg-switch": "THC through thc-aggregator at the switch"}
runs = {}
for c in names:
    try:
        with open(os.path.join(out, "raw", f"1gbit_{c}.json")) as f:
            runs[c] = json.load(f)["rows"][-1]
    except (OSError, ValueError, IndexError, KeyError):
        runs[c] = None
base, ring = runs.get("none"), runs.get("none-ring")
print(f"\n{'method':44s} {'time':>9s} {'vs default':>10s} {'vs ring':>8s} {'B/elem':>7s} {'NMSE':>9s}")
for c, label in names.items():
    r = runs[c]
    if r is None:
        print(f"{label:44s} {'failed':>9s}")
        continue
    t = r["time_us"] / 1e3
    sp = lambda ref: f"{ref['time_us'] / r['time_us']:.1f}x" if ref else "-"
    print(f"{label:44s} {t:7.0f}ms {sp(base):>10s} {sp(ring):>8s} {r['wire_bytes_per_elem']:7.2f} {r['nmse']:9.2e}")
print("\nB/elem: bytes per element on each rank's link in its busier direction (float32 ring: 2(n-1)/n x 4 = 6).")
EOF
fi
# Shared memory: no bandwidth bottleneck at all.
mpirun --oversubscribe --bind-to none -np 4 "$B/examples/thc_demo" >"$B/demo-shm.txt" 2>&1 || true
python3 - "$B/demo-shm.txt" <<'EOF'
import re, sys
f32 = thc = None
for line in open(sys.argv[1]):
    nums = [float(x) for x in re.findall(r"\s(\d+\.\d+)\s", " " + line + " ")]
    if line.startswith("float32") and nums:
        f32 = nums[0]
    elif line.startswith("THC") and nums:
        thc = nums[0] if thc is None else min(thc, nums[0])
fmt = lambda v: "?" if v is None else f"{v:.0f} ms"
print(f"\nOn shared memory (one machine, no network) float32 takes {fmt(f32)} and THC {fmt(thc)}: with no bandwidth "
      "bottleneck, compression only adds CPU work; THC pays where the network is the bottleneck, as above.")
EOF
