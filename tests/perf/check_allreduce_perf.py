#!/usr/bin/env python3
"""Correctness checks of thc_allreduce_perf under mpirun (never timings).

usage: check_allreduce_perf.py CASE NP THC_ALLREDUCE_PERF MPIEXEC [MPIEXEC_ARGS...]

Runs the tool on small sizes and checks the output: one row per size with the columns
size count type redop time algbw busbw wire_B/elem nmse algo, busbw = algbw * 2(n-1)/n (exactly in
the --json file, to print precision in the table), the bytes on the wire, the NMSE against the
exact float64 allreduce within bounds, and a failing exit status when --nmse-bound is too tight.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

COLUMNS = ["size", "count", "type", "redop", "time", "algbw", "busbw", "wire_B/elem", "nmse", "algo"]
ESIZE = {"float": 4, "double": 8, "half": 2, "bfloat16": 2}


def check(cond, msg):
    if not cond:
        sys.exit("FAIL: " + msg)


def run(ctx, args, expect_rc=0, env=None):
    cmd = ctx["mpiexec"] + ["-np", str(ctx["np"]), ctx["tool"]] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    if expect_rc is not None:
        check(p.returncode == expect_rc,
              f"{' '.join(cmd)} exited {p.returncode}, expected {expect_rc}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def parse(ctx, out):
    lines = out.splitlines()
    hdr = [l for l in lines if l.startswith("#") and "size" in l and "count" in l and "busbw" in l]
    check(len(hdr) == 1 and hdr[0].lstrip("#").split() == COLUMNS, f"column header: {hdr}")
    check(any(l.startswith("# thc_allreduce_perf") and f"nRanks {ctx['np']}" in l for l in lines), "nRanks header")
    check(sum(1 for l in lines if l.startswith("#  Rank")) == ctx["np"], "one '#  Rank' line per rank")
    check(any(l.startswith("# Avg bus bandwidth") for l in lines), "footer: average bus bandwidth")
    check(any(l.startswith("# Worst NMSE") for l in lines), "footer: worst NMSE")
    rows = []
    for l in lines:
        if not l.strip() or l.startswith("#"):
            continue
        f = l.split()
        if f and f[-1] == "FAILED":
            f = f[:-1]
        check(len(f) == len(COLUMNS), f"row has {len(f)} columns, expected {len(COLUMNS)}: {l!r}")
        rows.append(dict(zip(COLUMNS, f)))
    return rows


def check_rows(ctx, rows, js, dtype, op, sizes, scheme, algo=None, nmse_max=None):
    n = ctx["np"]
    factor = 2.0 * (n - 1) / n if n > 1 else 0.0
    check([int(r["size"]) for r in rows] == sizes, f"sizes {[r['size'] for r in rows]} != {sizes}")
    check(len(js["rows"]) == len(rows), "json rows match the table")
    for r, j in zip(rows, js["rows"]):
        size, count = int(r["size"]), int(r["count"])
        check(count == size // ESIZE[dtype] and j["count"] == count, f"count {count} for size {size}")
        check(r["type"] == dtype and r["redop"] == op, f"type/op {r['type']} {r['redop']}")
        t, alg, bus = float(r["time"]), float(r["algbw"]), float(r["busbw"])
        check(t > 0, f"time {t}")
        # nccl-tests: algbw = size / time (GB/s = 1e9 B/s), busbw = algbw * 2(n-1)/n.
        check(abs(j["algbw"] - size / 1e9 / (j["time_us"] / 1e6)) <= 1e-7 * max(1e-9, j["algbw"]), f"json algbw {j}")
        check(abs(j["busbw"] - j["algbw"] * factor) <= 1e-7 * max(1e-9, j["busbw"]), f"json busbw {j}")
        check(abs(bus - alg * factor) <= 0.0011 + 1e-3 * bus, f"table busbw {bus} vs algbw {alg} * {factor}")
        wire, nm = float(r["wire_B/elem"]), float(r["nmse"])
        if scheme in ("none", "bf16"):
            esize = 2 if scheme == "bf16" else ESIZE[dtype]
            check(abs(wire - factor * esize) < 1e-3, f"{scheme} wire {wire}")
            check(r["algo"] == "mpi", f"{scheme} algo {r['algo']}")
        elif "wire_up_per_elem" in j and "--aggregator" in ctx.get("last_args", []):
            # Counted datagrams: headers, the prelude and the JOIN make small sizes cost more than
            # float32 would; the largest size must be well below it, and up/down add up.
            check(wire > 0 and abs(wire - max(j["wire_up_per_elem"], j["wire_down_per_elem"])) < 1e-3,
                  f"aggregator wire {wire} vs json {j}")
            if size == max(sizes):
                check(wire < 4.0, f"{scheme} aggregator wire {wire} B/elem at {size} B must be below float32's 4")
        else:
            check(0 < wire < factor * 4 or n == 1, f"{scheme} wire {wire} must be below float32's {factor * 4}")
            check(r["algo"] in ("int", "ps"), f"algo {r['algo']}")
            if algo in ("int", "ps"):
                check(r["algo"] == algo, f"asked --algo {algo}, ran {r['algo']}")
        if nmse_max is not None:
            check(0 <= nm <= nmse_max, f"nmse {nm} > {nmse_max}")
        # Every rank on this one machine: nothing crosses a host link unless hosts are emulated, or
        # the ranks talk to an aggregator (a process off the host by design: the host link carries
        # every rank's counted datagrams, at least what this rank sent).
        check("host_link_per_elem" in j, f"json row without host_link_per_elem: {j}")
        if "--aggregator" in ctx.get("last_args", []):
            check(j["host_link_per_elem"] >= wire - 1e-6, f"aggregator host link {j['host_link_per_elem']} < {wire}")
        elif js["hosts"] == 1:
            check(j["host_link_per_elem"] == 0, f"one host, host link {j['host_link_per_elem']}")
    check(js["ranks"] == n and js["ok"] is True, f"json header {js}")


def sized(ctx, args, dtype="float", op="sum", scheme="none", algo=None, nmse_max=None, env=None):
    with tempfile.TemporaryDirectory() as d:
        jf = os.path.join(d, "rows.json")
        sizes_args = ["-b", "4K", "-e", "64K", "-f", "4", "-n", "2", "-w", "1", "-c", "2"]
        ctx["last_args"] = args
        p = run(ctx, sizes_args + ["-d", dtype, "-o", op, "--scheme", scheme, "--json", jf] + args, env=env)
        with open(jf) as f:
            js = json.load(f)
    rows = parse(ctx, p.stdout)
    esz = ESIZE[dtype]
    sizes = [(s // esz) * esz for s in (4096, 16384, 65536)]
    check_rows(ctx, rows, js, dtype, op, sizes, scheme, algo, nmse_max)
    return rows


def case_none(ctx):
    sized(ctx, [], nmse_max=1e-10)
    sized(ctx, [], dtype="double", op="avg", nmse_max=1e-24)
    sized(ctx, [], dtype="half", nmse_max=1e-5)
    # -i increments when -f is 1.
    p = run(ctx, ["-b", "1000", "-e", "3000", "-i", "1000", "-n", "1", "-w", "0", "-c", "1"])
    check([int(r["size"]) for r in parse(ctx, p.stdout)] == [1000, 2000, 3000], "-i increments")


def case_thc(ctx):
    for algo in ("int", "ps"):
        sized(ctx, ["--block", "1024", "--algo", algo], scheme="thc", algo=algo, nmse_max=0.1)
    sized(ctx, ["--block", "1024", "--ef"], scheme="thc", op="avg", nmse_max=0.1)
    sized(ctx, ["--block", "1024"], scheme="thc", dtype="bfloat16", nmse_max=0.1)


def case_cnat(ctx):
    for algo in ("int", "ps"):
        sized(ctx, ["--block", "1024", "--algo", algo], scheme="cnat", algo=algo, nmse_max=0.125)
    sized(ctx, ["--block", "1024", "--dnat-norm", "inf"], scheme="dnat", nmse_max=0.2)


def case_bf16(ctx):
    """The DDP/Horovod bf16 compression hook: float32 in and out, 2 bytes per element on the ring,
    the rounding error of bfloat16 (well above float32's, far below the compressed schemes')."""
    rows = sized(ctx, [], scheme="bf16", nmse_max=1e-3)
    if ctx["np"] > 1:
        check(all(float(r["nmse"]) > 1e-8 for r in rows), f"bf16 rounds: nmse {[r['nmse'] for r in rows]}")
    sized(ctx, [], scheme="bf16", op="avg", nmse_max=1e-3)
    p = run(ctx, ["-n", "1", "-w", "0", "-b", "4K", "-e", "4K", "--scheme", "bf16", "-d", "half"], expect_rc=None)
    check(p.returncode != 0 and "bf16" in p.stderr + p.stdout, f"bf16 on half input must be refused:\n{p.stderr}")


def case_hier(ctx):
    """Hosts emulated by THC_HIER_HOSTS: the tool reports the hierarchical compressed stage, the
    wire share of its hosts, and what crosses the busiest host link (all ranks of a host)."""
    n = ctx["np"]
    hosts = ",".join(["2", str(n - 2)]) if n >= 3 else ",".join(["1"] * n)
    nhosts = len(hosts.split(","))
    env = dict(os.environ, THC_HIER_HOSTS=hosts, THC_HIER="1")
    ctx = dict(ctx, mpiexec=ctx["mpiexec"] + ["-x", "THC_HIER_HOSTS", "-x", "THC_HIER"])
    for scheme, bound in (("thc", 0.1), ("cnat", 0.125)):
        with tempfile.TemporaryDirectory() as d:
            jf = os.path.join(d, "rows.json")
            p = run(ctx, ["-b", "64K", "-e", "64K", "-n", "1", "-w", "1", "-c", "1", "--block", "1024", "--algo", "ps",
                          "--scheme", scheme, "--json", jf], env=env)
            js = json.load(open(jf))
        check(f"compressed stage across {nhosts} hosts" in p.stdout, f"header names the hierarchy:\n{p.stdout}")
        check(js["hosts"] == nhosts, f"json hosts {js['hosts']} != {nhosts}")
        row = js["rows"][0]
        check(row["hier_hosts"] == nhosts and 0 < row["nmse"] <= bound, f"hier row {row}")
        # Rank 0 compresses a slice on host 0, whose link carries its own and its host peers'.
        check(0 < row["wire_bytes_per_elem"] <= row["host_link_per_elem"], f"wire vs host link {row}")
    with tempfile.TemporaryDirectory() as d:
        jf = os.path.join(d, "rows.json")
        run(ctx, ["-b", "64K", "-e", "64K", "-n", "1", "-w", "0", "-c", "1", "--json", jf], env=env)
        row = json.load(open(jf))["rows"][0]
    # float32 ring over ranks placed host by host: each host link carries one rank's ring traffic
    check(abs(row["host_link_per_elem"] - 2.0 * (n - 1) / n * 4) < 1e-6, f"none host link {row}")


def case_tight_bound(ctx):
    p = run(ctx, ["-b", "16K", "-e", "16K", "-n", "1", "-w", "0", "-c", "1", "--scheme", "thc", "--block", "1024",
                  "--nmse-bound", "1e-9"], expect_rc=None)
    check(p.returncode != 0, f"a too-tight --nmse-bound must fail: rc {p.returncode}\n{p.stdout}")
    check("FAILED" in p.stdout, f"the failing row and footer say FAILED:\n{p.stdout}")
    # The same run with the default bound passes.
    run(ctx, ["-b", "16K", "-e", "16K", "-n", "1", "-w", "0", "-c", "1", "--scheme", "thc", "--block", "1024"])


def case_aggregator(ctx):
    env = dict(os.environ, THC_TIMEOUT_MS="3000",
               THC_AGGREGATOR_KEY="1:" + "11" * 32)
    p = run(ctx, ["-b", "4K", "-e", "4K", "-n", "1", "-w", "0", "--scheme", "thc", "--block", "1024",
                  "--aggregator", "udp://127.0.0.1:9"], expect_rc=None, env=env)
    check(p.returncode != 0 and "aggregator" in p.stderr, f"--aggregator without a server must fail clearly:\n{p.stderr}")


def case_aggregator_live(ctx):
    """thc_allreduce / cnat_allreduce through a real thc-aggregator process (thc_comm_create_aggregator),
    lossless and with 5% client-side drops and duplicates: correct rows and NMSE within bounds."""
    agg = os.environ.get("THC_AGGREGATOR_BIN")
    check(agg and os.path.exists(agg), f"THC_AGGREGATOR_BIN not set or missing: {agg}")
    with tempfile.TemporaryDirectory() as d:
        pf = os.path.join(d, "port")
        keys = os.path.join(d, "keys")  # created by the aggregator (mode 0600), read by the workers
        srv = subprocess.Popen([agg, "--key-file", keys, "--create-key-file", "--port", "0", "--port-file", pf,
                                "--stats-interval", "0", "--threads", "2"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            for _ in range(200):
                if os.path.exists(pf) and open(pf).read().strip():
                    break
                time.sleep(0.05)
            port = int(open(pf).read().strip())
            url = f"udp://127.0.0.1:{port}"
            base = dict(os.environ, THC_TIMEOUT_MS="20000", THC_AGGREGATOR_KEY_FILE=keys)
            sized(ctx, ["--block", "1024", "--aggregator", url], scheme="thc", nmse_max=0.1, env=base)
            sized(ctx, ["--block", "1024", "--aggregator", url], scheme="cnat", nmse_max=0.125, env=base)
            lossy = dict(base, THC_FAULT_DROP="0.05", THC_FAULT_DUP="0.05", THC_FAULT_REORDER="0.05")
            sized(ctx, ["--block", "1024", "--aggregator", url, "--ef"], scheme="thc", op="avg", nmse_max=0.1, env=lossy)
        finally:
            srv.terminate()
            out, _ = srv.communicate(timeout=30)
        check(srv.returncode == 0, f"thc-aggregator exited {srv.returncode}:\n{out}")
        check("packets" in out, f"thc-aggregator prints statistics at SIGTERM:\n{out}")
        # The reductions really ran at the aggregator (not over MPI): it aggregated elements for
        # the three jobs (one per thc_allreduce_perf run).
        last = [l for l in out.splitlines() if "rx_packets=" in l]
        check(last, f"no statistics line from thc-aggregator:\n{out}")
        st = dict(kv.split("=", 1) for kv in last[-1].split() if "=" in kv)
        # Three runs, each a job with one instance per aggregator thread.
        check(int(st.get("elements", "0")) > 0 and int(st.get("jobs_created", "0")) >= 6,
              f"thc-aggregator aggregated nothing: {last[-1]}")


def case_errors(ctx):
    for args, needle in ((["--algo", "nccl"], "--algo"), (["-d", "int8"], "int8"), (["-b", "12X"], "-b"),
                         (["--scheme", "zip"], "scheme")):
        p = run(ctx, ["-n", "1", "-w", "0", "-b", "4K", "-e", "4K"] + args, expect_rc=None)
        check(p.returncode != 0 and needle in (p.stderr + p.stdout), f"{args}: rc {p.returncode}\n{p.stderr}")


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}

if __name__ == "__main__":
    if len(sys.argv) < 5 or sys.argv[1] not in CASES:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(CASES)}}} NP THC_ALLREDUCE_PERF MPIEXEC [ARGS...]")
    ctx = {"np": int(sys.argv[2]), "tool": sys.argv[3], "mpiexec": sys.argv[4:]}
    CASES[sys.argv[1]](ctx)
    print(f"ok: {sys.argv[1]} np={ctx['np']}")
