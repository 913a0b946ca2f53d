#!/usr/bin/env python3
"""ctest perf_model: the scale model (perf/model/thc_model.py) on the committed calibration gives
sane figures: wire bytes equal the hand formulas of what the code sends, times grow with the size,
a faster link never makes a call slower, the CLI and the table writer run. No timing of this
machine is asserted (the model only computes)."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = sys.argv[1]
sys.path.insert(0, os.path.join(ROOT, "perf", "model"))
import thc_model as m  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


cal = m.load_calib(os.path.join(ROOT, "perf", "model", "calib_default.json"))
MB = 1 << 20
for scen in ("cpu", "gpu", "testbed"):
    for n in (4, 8, 64, 1024):
        B = m.parse_rate("100gbit")
        E = 64 * MB // 4
        md = m.Model(cal, scen, n, 64 * MB, B)
        # float32 ring: 2(N-1)/N * 4 bytes per element on each link direction; bf16 half of it.
        check(abs(md.run("f32-ring")["wire"] - 2 * (n - 1) / n * 4) < 1e-9, f"{scen} n={n}: f32 ring bytes")
        check(abs(md.run("bf16-ring")["wire"] - 2 * (n - 1) / n * 2) < 1e-9, f"{scen} n={n}: bf16 ring bytes")
        # THC: u8 sums while n*30 <= 255, u16 after; PS (N-1)/N (b/8 + w), int ring 2(N-1)/N w.
        w = 1 if n * 30 <= 255 else 2
        check(m.sum_width(n) == w, f"sum width n={n}")
        check(abs(md.run("thc-ps")["wire"] - (n - 1) / n * (0.5 + w)) < 1e-9, f"{scen} n={n}: thc ps bytes")
        check(abs(md.run("thc-int")["wire"] - 2 * (n - 1) / n * w) < 1e-9, f"{scen} n={n}: thc int bytes")
        for alg in m.ALGOS:
            prev = 0.0
            for s in (1, 4, 16, 64, 256):
                t = m.Model(cal, scen, n, s * MB, B, k_aggs=n).run(alg)["time"]
                check(t > prev, f"{scen} n={n} {alg}: time grows with size ({s} MB: {t} after {prev})")
                prev = t
            slow = m.Model(cal, scen, n, 64 * MB, m.parse_rate("10gbit"), k_aggs=n).run(alg)["time"]
            fast = m.Model(cal, scen, n, 64 * MB, m.parse_rate("400gbit"), k_aggs=n).run(alg)["time"]
            check(fast <= slow, f"{scen} n={n} {alg}: 400 Gbit/s not slower than 10 ({fast} vs {slow})")
# The protocol's lanes per packet (switch_offload/protocol/README.md): 1408 for 4-bit indices / u8
# sums at MTU 1500, 704 for u16 sums; the wire format's tail padding.
check(m.lanes_for(4, 1, 8192, 1500 - 28 - 64) == 1408, "lanes u8 at MTU 1500")
check(m.lanes_for(4, 2, 8192, 1500 - 28 - 64) == 704, "lanes u16 at MTU 1500")
check(m.wire_elems(16384 * 3 + 100) == 16384 * 3 + 128, "tail padded to a power of two")
check(m.wire_elems(10) == 64, "tail padded to at least 64")
# A wire-bound float32 ring at 1 Gbit/s on the testbed: at least its bytes at line rate.
t = m.Model(cal, "testbed", 4, 64 * MB, m.parse_rate("1gbit")).run("f32-ring")["time"]
check(t >= 6 * 16 * MB / 125e6, "testbed f32 ring not faster than its wire bytes")
# The testbed's CPU per call (calibrate.sh --testbed lines): per worker datagram, all processes,
# less the codec; 1 MB chunks of 262144 elements carry ceil(262144 / 1408) = 187 datagrams.
with tempfile.TemporaryDirectory() as d:
    cpu = os.path.join(d, "cpu.txt")
    with open(cpu, "w") as f:
        f.write("thc-agg-switch 128M 100 0.7 478720\nthc-ps 128M 150 0 0\n")
    got = m.calibrate_testbed_cpu(cal, cpu)
    cc = cal["codec"]
    codec = 128 * MB * (1 / (cc["thc_encode_GBps"] * 1e9) + 1 / (cc["thc_decode_GBps"] * 1e9))
    pkts = 4 * 128 * 187
    want = (4 * (0.1 - codec) + 0.7 / (478720 / pkts)) / pkts
    check(abs(got["dgram_cpu_s"] - want) < 1e-12, f"testbed CPU per datagram {got['dgram_cpu_s']} vs {want}")
    sent = 3 / 4 * 32 * MB * 1.5
    want = (0.15 - codec - 32 * MB / (cc["lookup_add_Glanes_s"] * 1e9)) / (2 * sent) * 1e9
    check(abs(got["thc_transport_cpu_s_per_GB"] - want) < 1e-9, "testbed CPU per byte of thc's schedules")
# On the testbed every process shares the machine's cores: a dearer datagram makes the
# aggregator path CPU-bound and slower.
cheap = m.Model(cal, "testbed", 4, 64 * MB, m.parse_rate("1gbit"), dgram_cpu_s=1e-6).thc_agg_switch_position()
dear = m.Model(cal, "testbed", 4, 64 * MB, m.parse_rate("1gbit"), dgram_cpu_s=2e-5).thc_agg_switch_position()
check(dear["bound"] == "cpu" and dear["time"] > 4 * 64 * 187 * 2e-5 / 2 and dear["time"] > cheap["time"],
      f"testbed thc-agg charges the datagram CPU on the shared cores ({cheap}, {dear})")
# The PS chunk as engine::ps_chunk_blocks cuts it over Open MPI's TCP (eager limit 64 KiB less
# 256 bytes of header): at 4 ranks 1 MB chunks of 16 blocks would make 64 KiB sums messages, so
# 15 blocks; at 2 and 8 ranks the messages fit (or are far over) and 16 stay.
for n, want in ((2, 16), (4, 15), (8, 16), (16, 16)):
    md = m.Model(cal, "testbed", n, 64 * MB, m.parse_rate("1gbit"))
    got = md.ps_chunk_elems(262144, 4, md.w) // 16384
    check(got == want, f"testbed PS chunk at n={n}: {got} blocks, want {want}")
# A message up to twice the eager bytes goes as two eager parts (one hop), a longer one as a
# rendezvous (two hops).
md = m.Model(cal, "testbed", 4, 64 * MB, m.parse_rate("1gbit"))
check(md.parts(65280) == 1 and md.parts(65281) == 2 and md.parts(130560) == 2 and md.parts(130561) == 1,
      "schedules cut messages just over the eager bytes into two parts")
check(md.hop(1.0, 130560) == 1.0 and md.hop(1.0, 130561) == 2.0, "rendezvous only past twice the eager bytes")
# On the testbed a PS rank waits for the last of its 3 peers in each of a chunk's two phases:
# H_3 = 11/6 hops each instead of one (a random wake-up delay, the largest of 3); the 64 MB call
# is 16 Mi / (15 * 16 Ki) chunks of two eager hops each.
one = m.Model(cal, "testbed", 4, 64 * MB, m.parse_rate("100gbit"), alpha=3e-3, hop_wait_max=False).thc("ps")
last = m.Model(cal, "testbed", 4, 64 * MB, m.parse_rate("100gbit"), alpha=3e-3).thc("ps")
want = 16 * MB / (15 * 16384) * 2 * (11 / 6 - 1) * 3e-3
check(one["bound"] == "latency" and last["bound"] == "latency" and abs((last["time"] - one["time"]) - want) < 1e-3,
      f"testbed PS waits for the last of 3 peers ({one['time']} vs {last['time']}, difference want {want})")
# Bad input is refused with a message.
r = subprocess.run([sys.executable, os.path.join(ROOT, "perf", "model", "thc_model.py"), "one", "--n", "4",
                    "--size", "64Q", "--rate", "1gbit"], capture_output=True, text=True)
check(r.returncode != 0 and "bad size" in r.stderr, "bad size refused")
# The CLI and the datacenter tables run (no plot: gnuplot is optional here).
r = subprocess.run([sys.executable, os.path.join(ROOT, "perf", "model", "thc_model.py"), "one", "--n", "64",
                    "--size", "100M", "--rate", "100gbit", "--json"], capture_output=True, text=True)
check(r.returncode == 0 and set(json.loads(r.stdout)["results"]) == set(m.ALGOS), "one --json")
with tempfile.TemporaryDirectory() as d:
    r = subprocess.run([sys.executable, os.path.join(ROOT, "perf", "model", "thc_model.py"), "datacenter", "--out", d,
                        "--no-plot"], capture_output=True, text=True)
    check(r.returncode == 0, "datacenter: " + r.stderr[-500:])
    md = open(os.path.join(d, "datacenter.md")).read() if r.returncode == 0 else ""
    check(md.count("| 1024 | 400gbit | 1G |") == 2, "datacenter table has both scenarios' rows")
# validate models a run only with a calibration made the same way: Open MPI busy-polling or yielding
# (compare.sh --mpi-yield, DIR/settings) changes the testbed's ring latencies several-fold.
with tempfile.TemporaryDirectory() as d:
    run = os.path.join(d, "run")
    os.makedirs(os.path.join(run, "raw"))
    with open(os.path.join(run, "raw", "1gbit_none-ring.json"), "w") as f:
        json.dump({"ranks": 4, "rows": [{"size": 4 * MB, "time_us": 5e4, "wire_bytes_per_elem": 6}]}, f)
    with open(os.path.join(run, "settings"), "w") as f:
        f.write("mpi_yield_when_idle=1\n")
    cal_busy = dict(cal, testbed=dict(cal["testbed"], mpi_yield_when_idle=False))
    cal_yield = dict(cal, testbed=dict(cal["testbed"], mpi_yield_when_idle=True))
    for name, c in (("busy", cal_busy), ("yield", cal_yield)):
        with open(os.path.join(d, name + ".json"), "w") as f:
            json.dump(c, f)
    tool = os.path.join(ROOT, "perf", "model", "thc_model.py")
    r = subprocess.run([sys.executable, tool, "--calib", os.path.join(d, "busy.json"), "validate", run],
                       capture_output=True, text=True)
    check(r.returncode != 0 and "mpi_yield_when_idle=1" in r.stderr, "validate refuses a yielding run with a busy-poll calibration")
    r = subprocess.run([sys.executable, tool, "--calib", os.path.join(d, "yield.json"), "validate", run],
                       capture_output=True, text=True)
    check("| none-ring | 4 MB |" in r.stdout, "validate models a yielding run with a yielding calibration: " + r.stderr[-300:])
    os.remove(os.path.join(run, "settings"))  # runs from before the file: busy-polling
    r = subprocess.run([sys.executable, tool, "--calib", os.path.join(d, "yield.json"), "validate", run],
                       capture_output=True, text=True)
    check(r.returncode != 0 and "mpi_yield_when_idle=0" in r.stderr, "a run without settings is a busy-polling run")
print("perf_model:", "FAILED" if failures else "ok", f"({len(failures)} failures)")
sys.exit(1 if failures else 0)
