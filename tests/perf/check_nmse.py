#!/usr/bin/env python3
"""Correctness checks of thc_nmse (never timings).

usage: check_nmse.py CASE THC_NMSE [WORKDIR]

Each CASE is one ctest entry; it runs the tool on small synthetic (or generated file) inputs and
checks that the rows say what theory says: THC b=4 far below TernGrad, Cnat at most 1/8, QSGD better
with more levels, the JSON is one object per line, file input works and fails clearly.
"""
import json
import os
import struct
import subprocess
import sys
import random
import tempfile

SMALL = ["--count", "16384", "--block", "4096", "--workers", "4", "--seed", "7"]


def run(tool, args, expect_rc=0):
    p = subprocess.run([tool] + args, capture_output=True, text=True, timeout=240)
    if expect_rc is not None and p.returncode != expect_rc:
        sys.exit(f"FAIL: {' '.join([tool] + args)} exited {p.returncode}, expected {expect_rc}\n"
                 f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def rows_of(tool, args):
    p = run(tool, args + ["--json"])
    rows = []
    for line in p.stdout.splitlines():
        if not line.strip():
            continue
        r = json.loads(line)  # every line must be one JSON object
        for key in ("scheme", "params", "nmse", "bits_up", "bits_down", "homomorphic"):
            check(key in r, f"row lacks '{key}': {line}")
        rows.append(r)
    check(rows, f"no rows from {args}")
    return rows


def check(cond, msg):
    if not cond:
        sys.exit("FAIL: " + msg)


def by_scheme(rows):
    out = {}
    for r in rows:
        out.setdefault(r["scheme"], []).append(r)
    return out


def case_json(tool, wd):
    rows = rows_of(tool, SMALL)
    s = by_scheme(rows)
    check(set(s) == {"thc", "uhc", "cnat", "dnat2", "dnatinf", "topk", "dgc", "terngrad", "qsgd"},
          f"default schemes: {sorted(s)}")
    for name, rs in s.items():
        r = rs[0]
        homo = name in ("thc", "uhc", "cnat", "dnat2", "dnatinf")
        check(r["homomorphic"] is homo, f"{name}: homomorphic={r['homomorphic']}")
        check(isinstance(r["params"], dict), f"{name}: params is not an object")
        check(r["nmse"] is not None and r["nmse"] >= 0, f"{name}: nmse {r['nmse']}")
        check(r["bits_up"] > 0 and r["bits_down"] > 0, f"{name}: bits {r['bits_up']} {r['bits_down']}")
    # THC: b bits up (+ 32 bits of prelude per block), sums of 8 bits down for 4 workers, g = 30.
    t = s["thc"][0]
    check(abs(t["bits_up"] - (4 + 32 / 4096)) < 1e-6, f"thc bits_up {t['bits_up']}")
    check(abs(t["bits_down"] - (8 + 32 / 4096)) < 1e-6, f"thc bits_down {t['bits_down']}")
    check(t["params"]["g"] == 30 and t["params"]["b"] == 4, f"thc params {t['params']}")
    # TopK: k = b/64 -> 64k = 4 bits up; down is the union support, between 4 and 32 bits.
    k = s["topk"][0]
    check(abs(k["bits_up"] - 4.0) < 1e-3, f"topk bits_up {k['bits_up']}")
    check(4.0 - 1e-3 <= k["bits_down"] <= 32.0, f"topk bits_down {k['bits_down']}")
    check(s["terngrad"][0]["bits_down"] == 32 and s["qsgd"][0]["bits_down"] == 32, "PS baselines send float32 down")
    # The table (default output) has the documented columns.
    p = run(tool, SMALL + ["--schemes", "thc,topk"])
    header = [l for l in p.stdout.splitlines() if l.startswith("scheme")]
    check(header and header[0].split() == ["scheme", "params", "workers", "nmse", "bits_up", "bits_down",
                                           "homomorphic"], f"table header: {header}")
    body = [l for l in p.stdout.splitlines() if l.startswith("thc ") or l.startswith("topk ")]
    check(len(body) == 2, f"table rows: {p.stdout}")


def case_ordering(tool, wd):
    rows = rows_of(tool, SMALL + ["--rounds", "2"])
    s = {r["scheme"]: r["nmse"] for r in rows}
    # THC b=4 is an order of magnitude better than TernGrad and TopK at the same uplink budget.
    check(s["thc"] * 10 < s["terngrad"], f"thc {s['thc']} vs terngrad {s['terngrad']}")
    check(s["thc"] * 10 < s["topk"], f"thc {s['thc']} vs topk {s['topk']}")
    check(s["thc"] < s["qsgd"], f"thc {s['thc']} vs qsgd {s['qsgd']}")
    # Cnat: variance at most 1/8 of the norm (uncorrelated workers: the mean's NMSE too).
    check(s["cnat"] <= 0.125, f"cnat nmse {s['cnat']} > 1/8")
    # Natural dithering with the inf-norm and few levels is worse than Cnat with many.
    check(s["cnat"] <= s["dnatinf"] * 1.05, f"cnat {s['cnat']} vs dnatinf {s['dnatinf']}")
    # DGC with one round is TopK.
    one = {r["scheme"]: r["nmse"] for r in rows_of(tool, SMALL + ["--schemes", "topk,dgc"])}
    check(abs(one["dgc"] - one["topk"]) <= 1e-12 + 1e-9 * one["topk"], f"dgc {one['dgc']} != topk {one['topk']}")


def case_qsgd_levels(tool, wd):
    rows = rows_of(tool, SMALL + ["--schemes", "qsgd", "--sweep", "s=1,3,7,15,31"])
    nm = [r["nmse"] for r in rows]
    check(len(nm) == 5, f"rows {rows}")
    check(all(a > b for a, b in zip(nm, nm[1:])), f"qsgd nmse must fall with more levels: {nm}")
    ups = [r["bits_up"] for r in rows]
    check(all(a < b for a, b in zip(ups, ups[1:])), f"qsgd bits must grow with levels: {ups}")


def case_thc_bits(tool, wd):
    rows = rows_of(tool, SMALL + ["--schemes", "thc,uhc,terngrad", "--sweep", "bits=2..5"])
    s = by_scheme(rows)
    check(len(s["thc"]) == 4 and len(s["uhc"]) == 4, f"bits sweep rows: {[r['scheme'] for r in rows]}")
    check(len(s["terngrad"]) == 1, "terngrad does not depend on bits: one row")
    nm = [r["nmse"] for r in s["thc"]]
    check(all(a > b for a, b in zip(nm, nm[1:])), f"thc nmse must fall with b: {nm}")
    # Geometric continuation in a workers sweep: 1,2,4,...,16.
    rows = rows_of(tool, ["--count", "8192", "--block", "4096", "--schemes", "cnat", "--sweep", "workers=1,2,4,...,16"])
    check([r["workers"] for r in rows] == [1, 2, 4, 8, 16], f"workers sweep: {[r['workers'] for r in rows]}")


def case_dgc_ef(tool, wd):
    # k = 1 keeps everything: TopK and DGC are exact.
    rows = rows_of(tool, SMALL + ["--schemes", "topk,dgc", "--k", "1", "--rounds", "3"])
    for r in rows:
        check(r["nmse"] < 1e-10, f"{r['scheme']} with k=1: nmse {r['nmse']}")
    # Error feedback keeps THC unbiased over rounds; its per-round NMSE stays the same order.
    a = rows_of(tool, SMALL + ["--schemes", "thc", "--rounds", "4"])[0]["nmse"]
    b = rows_of(tool, SMALL + ["--schemes", "thc", "--rounds", "4", "--ef"])[0]["nmse"]
    check(b < 4 * a, f"thc with ef {b} vs without {a}")


def write_f32(path, values):
    with open(path, "wb") as f:
        f.write(struct.pack("<%df" % len(values), *values))


def case_files(tool, wd):
    d = tempfile.mkdtemp(prefix="thc_nmse_files.", dir=wd)
    rnd = random.Random(3)
    n = 3000
    for w in range(3):
        write_f32(os.path.join(d, f"rank{w}.f32"), [rnd.gauss(0, 1) for _ in range(n)])
    pat = os.path.join(d, "rank%d.f32")
    rows = rows_of(tool, ["--input", pat, "--workers", "3", "--block", "1024", "--schemes", "thc,cnat,topk"])
    check(all(r["count"] == n and r["workers"] == 3 for r in rows), f"file rows: {rows}")
    check(by_scheme(rows)["cnat"][0]["nmse"] <= 0.125, "cnat on files")
    rows = rows_of(tool, ["--input", pat, "--workers", "3", "--count", "2000", "--block", "1024", "--schemes", "thc"])
    check(rows[0]["count"] == 2000, "--count takes a prefix of the files")
    # Missing file: names it.
    p = run(tool, ["--input", pat, "--workers", "4"], expect_rc=None)
    check(p.returncode != 0 and "rank3.f32" in p.stderr, f"missing file: rc {p.returncode} {p.stderr}")
    # Short file: different length from the others.
    write_f32(os.path.join(d, "rank2.f32"), [1.0] * (n - 10))
    p = run(tool, ["--input", pat, "--workers", "3"], expect_rc=None)
    check(p.returncode != 0 and "rank2.f32" in p.stderr and "same length" in p.stderr, f"short file: {p.stderr}")
    # --count beyond the files.
    p = run(tool, ["--input", pat, "--workers", "2", "--count", str(n + 1)], expect_rc=None)
    check(p.returncode != 0 and "short" in p.stderr, f"count beyond file: {p.stderr}")
    # Not a whole number of floats.
    with open(os.path.join(d, "rank1.f32"), "ab") as f:
        f.write(b"\x00")
    p = run(tool, ["--input", pat, "--workers", "2"], expect_rc=None)
    check(p.returncode != 0 and "rank1.f32" in p.stderr, f"odd-sized file: {p.stderr}")


def case_plot(tool, wd):
    out = os.path.join(wd, "thc_nmse_plot.png")
    if os.path.exists(out):
        os.remove(out)
    p = run(tool, SMALL + ["--schemes", "thc,qsgd", "--sweep", "bits=2..4", "--plot", out], expect_rc=None)
    have_backend = subprocess.run("command -v gnuplot", shell=True).returncode == 0 or \
        subprocess.run([sys.executable, "-c", "import matplotlib"], capture_output=True).returncode == 0
    if have_backend:
        check(p.returncode == 0, f"--plot failed: {p.stderr}")
        with open(out, "rb") as f:
            check(f.read(8) == b"\x89PNG\r\n\x1a\n", "--plot did not write a PNG")
    else:
        check(p.returncode != 0 and "gnuplot" in p.stderr, f"--plot without a backend must fail clearly: {p.stderr}")
    # Forcing a backend that is absent fails clearly.
    env = dict(os.environ, THC_PLOT="no-such-backend")
    q = subprocess.run([tool] + SMALL + ["--schemes", "thc", "--plot", out], capture_output=True, text=True, env=env,
                       timeout=120)
    check(q.returncode != 0 and "gnuplot" in q.stderr, f"THC_PLOT=no-such-backend: {q.returncode} {q.stderr}")


def case_errors(tool, wd):
    for args, needle in ((["--schemes", "thc,nope"], "nope"), (["--sweep", "bits=0..3"], "bits"),
                         (["--sweep", "zzz=1"], "zzz"), (["--block", "1000"], "block"),
                         (["--dist", "cauchy"], "dist")):
        p = run(tool, args, expect_rc=None)
        check(p.returncode != 0 and needle in (p.stderr + p.stdout), f"{args}: rc {p.returncode} {p.stderr}")


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}

if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in CASES:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(CASES)}}} THC_NMSE [WORKDIR]")
    wd = sys.argv[3] if len(sys.argv) > 3 else tempfile.gettempdir()
    os.makedirs(wd, exist_ok=True)
    CASES[sys.argv[1]](sys.argv[2], wd)
    print(f"ok: {sys.argv[1]}")
