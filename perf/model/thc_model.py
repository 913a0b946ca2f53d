#!/usr/bin/env python3
"""thc_model.py -- a scale model of one allreduce of S bytes of float32 on N ranks.

Algorithms (what each moves is taken from the code, see perf/model/README.md):
  f32-ring   float32 ring allreduce (reduce-scatter + allgather), 2(N-1)/N * 4 B/elem per link
  bf16-ring  the DDP/Horovod bf16 hook: the same ring on 2-byte values, plus the conversions
  thc-ps     THC, colocated parameter server (transport/schedules PsSum): (N-1)/N * (b/8 + w) B/elem
  thc-int    THC value form on the pipelined integer ring (RingSum): 2(N-1)/N * w B/elem
  thc-switch THC through an aggregating switch (Tofino profile: 256 lanes per packet, line rate)
  thc-agg    THC through k software aggregators (thc-aggregator, hosts of their own, c cores each)
where b = 4 index bits and w = the sum width in bytes (u8 while N*g <= 255, u16 up to N*g <= 65535).

A THC call is the engine's pipeline (collectives/engine/engine.cc): a prelude pass over the input
and a MAX exchange of the block statistics, then chunks of THC_CHUNK_BYTES float32: encode chunk
k+1 while chunk k is on the network (two in flight), then decode chunk k. Per chunk the steady
state is bound by the slower of the rank's CPU work (codec, reduction, transport), the busiest link
direction's bytes, and half the chunk's latency chain (two chunks overlap); the first encode and
the last chunk's transfer and decode are not overlapped.

Measured inputs (per-core codec rates, aggregator lanes per CPU-second, transport CPU per byte)
come from a calibration JSON (perf/model/calibrate.sh); link and placement parameters from a
scenario. Subcommands:

  thc_model.py [--calib FILE] validate DIR...     model vs compare.sh results (DIR/raw/*.json)
  thc_model.py [--calib FILE] datacenter --out D  tables (markdown) and plots for datacenter sizes
  thc_model.py [--calib FILE] one --n 64 --size 100M --rate 100gbit [--scenario cpu|gpu|testbed]
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CALIB = os.path.join(HERE, "calib_default.json")

# ---------------------------------------------------------------- wire formats (from the code)
THC_BITS = 4          # THC_BITS default
THC_G = 30            # THC_GRANULARITY default: the table's largest value (sums size by N*g)
THC_BLOCK = 16384     # THC_BLOCK default (RHT block; the tail is padded to a power of two >= 64)
CHUNK_BYTES = 1 << 20  # THC_CHUNK_BYTES default (float32 bytes per pipelined chunk)
PIECE_BYTES = 256 * 1024  # transport/schedules ScheduleOptions::piece_bytes
MPI_HDR_BYTES = 256  # transport/mpi: room left for ob1's header under the eager limit
PRELUDE_HDR_WORDS = 256  # engine.cc kHeaderWords: the fixed first MAX exchange
PRELUDE_INLINE = 256 - 6 - 7 * 4  # statistics carried inline in it (kInlineStats)
AGG_HDR = 64          # switch_offload/protocol: header bytes of every datagram
IP_UDP = 28
AGG_MAX_LANES = 8192  # THC_AGG_LANES default
AGG_WORKER_LIMIT = 64  # the protocol's 64-bit worker bitmap
TOFINO_LANES = 256    # the Tofino profile (THC_AGG_LANES=256)
AGG_SLOTS = 1024      # THC_AGG_SLOTS default: packets in flight per job at most


def sum_width(n, g=THC_G):
    """Bytes of a THC sum: the narrowest of 8/16/32 bits holding n*g (codec.cc)."""
    m = n * g
    if m <= 255:
        return 1
    if m <= 65535:
        return 2
    if m <= 4294967295:
        return 4
    raise ValueError(f"n*g = {m} does not fit 32-bit sums")


def wire_elems(count, block=THC_BLOCK):
    """Wire elements of a THC call: whole blocks, the tail padded to a power of two >= 64."""
    full, tail = divmod(count, block)
    w = full * block
    if tail:
        w += max(64, 1 << (tail - 1).bit_length())
    return w


def lanes_for(up_bits_per_lane, down_bytes_per_lane, max_lanes, budget):
    """switch_offload/protocol/wire.cc lanes_for: the largest multiple of 64 lanes whose upstream
    payload and RESULT both fit the payload budget."""
    per8 = max(up_bits_per_lane, 8 * down_bytes_per_lane)
    lanes = budget // per8 * 8
    lanes -= lanes % 64
    return max(0, min(lanes, max_lanes))


def parse_size(s):
    m = re.fullmatch(r"([0-9.]+)\s*([KMG]?)B?", str(s).strip(), re.I)
    if not m:
        raise ValueError(f"bad size '{s}'")
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()])


def parse_rate(s):
    """'100gbit' -> bytes/s."""
    m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", str(s).strip().lower())
    if not m:
        raise ValueError(f"bad rate '{s}' (e.g. 1gbit, 100gbit)")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8


def human(b):
    for unit, f in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if b >= f:
            return f"{b / f:g} {unit}"
    return f"{b} B"


# ---------------------------------------------------------------- framing
class Framing:
    """Bytes a link carries per payload byte. tbf (the testbed) counts the Ethernet header but no
    FCS, preamble or gap; a real Ethernet link carries all of them (38 B per frame)."""

    def __init__(self, mtu, l2):
        self.mtu, self.l2 = mtu, l2

    def stream(self, ack_every=2):
        """A byte stream (TCP, or RDMA-like with the same header size): MSS = MTU - 52 (IP 20,
        TCP 20 + timestamps 12), plus the ACKs the peer's data make us send on this direction
        (66 B + L2 per `ack_every` segments; every link direction carries data both ways here)."""
        mss = self.mtu - 52
        frame = self.mtu + self.l2
        ack = 52 + self.l2 if ack_every else 0
        return (frame + (ack / ack_every if ack_every else 0)) / mss

    def datagram(self, payload):
        """Link bytes of one aggregator datagram with `payload` bytes after the 64-byte header."""
        return payload + AGG_HDR + IP_UDP + self.l2


# ---------------------------------------------------------------- scenarios
# Everything not measured. `cores` is per rank; with `machine_cores` set, every process (ranks and
# aggregators) shares that many cores instead (the testbed: one 2-core machine).
SCENARIOS = {
    # The 4-host emulated cluster of perf/testbed/netns_cluster.sh: tbf on both ends of every
    # veth, Open MPI over TCP, 4 ranks + the aggregator on this machine's 2 cores.
    # hop_wait_max: a hop is a napping rank's wake-up on a loaded machine, a random delay; a wait
    # for the last of k peers costs the mean of the largest of k exponential delays, H_k hops.
    "testbed": dict(testbed_measured=True, alpha=None, hop_wait_max=True, msg_cpu=5e-6, eager_limit=65536, mtu=1500, l2=14, ack_every=2, machine_cores=2, cores=None,
                    codec="cpu", transport_cpu=True, mpi_ring="ompi", agg_cores=None,
                    note="4 netns hosts, tbf per link, Open MPI TCP BTL, all processes on 2 shared cores"),
    # A datacenter with RDMA-class transport (no CPU per byte moved: the NIC does it), MTU 4096,
    # 5 us per hop (NIC + switch + software), the codec on 8 CPU cores per rank.
    "cpu": dict(alpha=5e-6, msg_cpu=1e-6, mtu=4096, l2=38, ack_every=0, machine_cores=None, cores=8,
                codec="cpu", transport_cpu=False, mpi_ring="pipelined", agg_cores=16,
                note="RDMA-class links (transport CPU 0), MTU 4096, 5 us/hop, codec on 8 CPU cores per rank"),
    # The same with the codec on the GPU at the H200 kernel rates of README (GPU verification).
    "gpu": dict(alpha=5e-6, msg_cpu=1e-6, mtu=4096, l2=38, ack_every=0, machine_cores=None, cores=8,
                codec="gpu", transport_cpu=False, mpi_ring="pipelined", agg_cores=16,
                note="as cpu, codec on an H200 at README's kernel rates (earlier measurement)"),
}


class Model:
    def __init__(self, calib, scenario, n, size, rate_Bps, chunk_bytes=CHUNK_BYTES, k_aggs=1, **over):
        self.cal = calib
        self.sc = dict(SCENARIOS[scenario] if isinstance(scenario, str) else scenario)
        if self.sc.get("testbed_measured"):
            tb = calib.get("testbed")
            if not tb:
                raise SystemExit("thc_model.py: the testbed scenario needs the calibration's 'testbed' section "
                                 "(perf/model/calibrate.sh --testbed)")
            if "codec" in tb:
                # The codec rates measured with the testbed's figures (the same load), which the
                # CPU figures were split by; the top-level ones may come from a quieter machine.
                self.cal = dict(calib, codec=tb["codec"])
            self.sc["alpha"] = tb["alpha_sched_s"]
            self.sc["alpha_ompi"] = tb["alpha_ompi_s"]
            self.sc["transport_cpu_s_per_GB"] = tb["transport_cpu_s_per_GB"]
            # What thc's own paths cost the machine per byte / per datagram on the testbed, from the
            # CPU accounting of whole calls (calibrate.sh --testbed); older calibrations lack them.
            self.sc["thc_transport_cpu_s_per_GB"] = tb.get("thc_transport_cpu_s_per_GB")
            self.sc["dgram_cpu_s"] = tb.get("dgram_cpu_s")
        self.sc.update(over)
        self.n, self.size, self.B = n, size, rate_Bps
        self.E = size // 4
        self.chunk_bytes = chunk_bytes
        self.k = k_aggs
        self.fr = Framing(self.sc["mtu"], self.sc["l2"])
        self.w = sum_width(n)

    # --- per-core rates (bytes of float32 per second unless named otherwise)
    def codec_rates(self, value_form):
        c = self.cal
        if self.sc["codec"] == "gpu":
            g = c["gpu_h200"]
            enc = g["thc_encode_GBps"] * 1e9
            dec = g["thc_decode_GBps"] * 1e9
            pre = g["thc_prelude_GBps"] * 1e9
            return pre, enc, dec
        cc = c["codec"]
        enc_all = (cc["thc_encode_value_GBps"] if value_form else cc["thc_encode_GBps"]) * 1e9
        # codec_bench's encode includes the prelude's read; split it by the measured share.
        f = cc["prelude_share_of_encode"]
        pre = enc_all / f
        enc = enc_all / (1 - f)
        dec = cc["thc_decode_GBps"] * 1e9
        return pre, enc, dec

    def rank_cores(self):
        """Cores one rank's CPU work gets: its own (datacenter) or a share of the machine."""
        if self.sc["machine_cores"]:
            return None
        return self.sc["cores"]

    def share(self, rank_cpu, agg_cpu=0.0):
        """Wall time of CPU work: per rank on its own cores, or everything (n ranks + aggregator)
        on the machine's cores."""
        if self.sc["machine_cores"]:
            return (self.n * rank_cpu + agg_cpu) / self.sc["machine_cores"]
        t = rank_cpu / self.sc["cores"]
        if agg_cpu:
            t = max(t, agg_cpu)  # aggregator CPU is already per aggregator core set
        return t

    def net_cpu(self, bytes_moved, thc=False):
        """CPU of moving bytes through the transport (kernel TCP and MPI copies): per byte sent
        plus per byte received; zero where the NIC does it (RDMA). thc: thc's schedules (ranks nap
        while waiting) where the testbed measured them apart from Open MPI's busy-polling ring."""
        if not self.sc["transport_cpu"]:
            return 0.0
        per_GB = (thc and self.sc.get("thc_transport_cpu_s_per_GB")) or self.sc.get("transport_cpu_s_per_GB") \
            or self.cal["transport"]["tcp_cpu_s_per_GB"]
        return bytes_moved * per_GB / 1e9

    def small_allreduce(self, nbytes):
        """An MPI allreduce of a few KB (the prelude MAX): recursive doubling, log2 N hops."""
        if self.n == 1:
            return 0.0
        hops = math.ceil(math.log2(self.n))
        return hops * (self.sc["alpha"] + self.sc["msg_cpu"] + nbytes * self.fr.stream(0) / self.B)

    # --- uncompressed baselines
    def ring(self, elem_bytes, reduce_Bps, extra_cpu=0.0):
        n, E = self.n, self.E
        if n == 1:
            return dict(time=extra_cpu, wire=0.0, bound="cpu")
        seg = E * elem_bytes / n
        f = self.fr.stream(self.sc["ack_every"])
        steps = 2 * (n - 1)
        wire_B = steps * seg  # per link direction
        t_wire = wire_B * f / self.B
        # CPU per rank: sum the received segment in the reduce-scatter (n-1 steps), move the bytes.
        red_cpu = (n - 1) * seg / reduce_Bps
        cpu = red_cpu + self.net_cpu(2 * wire_B) + extra_cpu + steps * self.sc["msg_cpu"]
        alpha = self.sc["alpha"]
        if self.sc["mpi_ring"] == "ompi":
            alpha = self.sc.get("alpha_ompi", alpha)
            # Open MPI's ring (coll_tuned_allreduce_algorithm 4): one message per step, the next
            # step's send only after this step's receive (and, in the reduce-scatter, its
            # reduction): steps do not overlap. CPU of the step (the reduction, the TCP copies)
            # runs while the step's bytes arrive, except the reduction after the last byte.
            t_step_wire = seg * f / self.B
            step_cpu = self.share((cpu - extra_cpu) / steps)
            t = steps * (max(t_step_wire, step_cpu) + alpha) + (n - 1) * self.share(seg / reduce_Bps)
            t += self.share(extra_cpu)
        else:
            # NCCL-like pipelined ring: pieces stream around the ring, a step costs at least one
            # piece's latency.
            piece = min(seg, PIECE_BYTES)
            t = steps * max(seg * f / self.B, piece * f / self.B + alpha) + self.share(extra_cpu)
            t = max(t, self.share(cpu))
        bound = "wire" if t_wire >= 0.8 * t else "latency/cpu"
        return dict(time=t, wire=wire_B / E, bound=bound)

    def f32_ring(self):
        return self.ring(4, self.reduce_rate())

    def bf16_ring(self):
        # float32 -> bf16 before, bf16 -> float32 after: two passes over the vector; the sum op
        # adds bf16 pairs in float. On a GPU these run at memory speed (negligible here).
        if self.sc["codec"] == "gpu":
            return self.ring(2, 1e13)
        cc = self.cal["codec"]
        conv = self.E * 4 / (cc["bf16_convert_GBps"] * 1e9) * 2
        return self.ring(2, cc["bf16_sum_GBps"] * 1e9, extra_cpu=conv)

    def reduce_rate(self):
        if self.sc["codec"] == "gpu":
            return 1e13
        return self.cal["codec"]["f32_sum_GBps"] * 1e9

    # --- THC through the engine's pipeline
    def eager_bytes(self):
        """What the schedules send without a handshake (transport/mpi: Open MPI's TCP eager limit
        less ob1's header, ScheduleOptions::eager_bytes); 0 where the scenario has no such limit."""
        lim = self.sc.get("eager_limit")
        return lim - MPI_HDR_BYTES if lim else 0

    def parts(self, nbytes):
        """Messages the schedules send for one of nbytes: one up to twice the eager bytes is cut
        into two equal eager parts (transport/schedules), anything else goes whole."""
        e = self.eager_bytes()
        return 2 if e and e < nbytes <= 2 * e else 1

    def hop(self, alpha, nbytes):
        """Latency of one message: one hop, two where the transport's rendezvous protocol first
        asks the receiver (Open MPI's TCP BTL above its eager limit; the schedules cut messages
        up to twice that into eager parts)."""
        e = self.eager_bytes()
        return alpha * (2 if e and nbytes > 2 * e else 1)

    def ps_chunk_elems(self, chunk_elems, b, w):
        """engine::ps_chunk_blocks: a PS chunk whose largest shard message (codes or sums) is just
        over the eager bytes (by at most an eighth) shrinks by at most an eighth until it fits."""
        lim, n = self.eager_bytes(), self.n
        cb = chunk_elems // THC_BLOCK

        def largest(c):
            groups = -(-(c * THC_BLOCK) // 8)
            e = -(-groups // n) * 8
            return max(-(-(e * b) // 8), e * w)

        top = largest(cb)
        if not lim or n < 2 or cb < 2 or top <= lim or top > lim + lim // 8:
            return chunk_elems
        c = cb - 1
        while c >= 1 and c * 8 > cb * 7:
            if largest(c) <= lim:
                return c * THC_BLOCK
            c -= 1
        return chunk_elems

    def thc(self, algo):
        return self._thc(algo, self.sc["alpha"])

    def _thc(self, algo, alpha):
        n, E = self.n, self.E
        b, w = THC_BITS, self.w
        W = wire_elems(E)
        nblocks = -(-E // THC_BLOCK)
        value_form = algo == "int"
        pre_rate, enc_rate, dec_rate = self.codec_rates(value_form)
        chunk_elems = max(THC_BLOCK, self.chunk_bytes // 4 // THC_BLOCK * THC_BLOCK)
        if algo == "ps":
            chunk_elems = self.ps_chunk_elems(chunk_elems, b, w)
        nch = -(-E // chunk_elems)
        Ec = min(chunk_elems, W)  # wire elements of a full chunk
        msg = self.sc["msg_cpu"]
        agg_cpu_chunk = 0.0
        if algo == "ps":
            f = self.fr.stream(self.sc["ack_every"])
            shard = Ec / n
            sent = (n - 1) * shard * (b / 8 + w)  # indices to n-1 owners, own shard's sums to n-1
            wire_chunk = sent * f / self.B
            pieces = max(1, math.ceil(shard * w / PIECE_BYTES))
            idx_piece_b = min(shard, PIECE_BYTES / w) * b / 8
            sum_piece_b = min(shard * w, PIECE_BYTES)
            msgs = (n - 1) * pieces * (self.parts(idx_piece_b) + self.parts(sum_piece_b))
            red_cpu = Ec / (self.cal["codec"]["lookup_add_Glanes_s"] * 1e9) if self.sc["codec"] == "cpu" else 0.0
            net = self.net_cpu(2 * sent, thc=True) + msgs * msg
            # The allgather of a piece waits for the piece's indices from every peer.
            # The owner waits for every peer's indices, a rank for every owner's sums: n-1 each.
            last_of = sum(1 / i for i in range(1, n)) if self.sc.get("hop_wait_max") else 1.0
            chain = wire_chunk + last_of * (self.hop(alpha, idx_piece_b) + self.hop(alpha, sum_piece_b))
            wire_B = sent / Ec
        elif algo == "int":
            f = self.fr.stream(self.sc["ack_every"])
            seg = Ec * w / n
            piece = min(seg, PIECE_BYTES)
            sent = 2 * (n - 1) * seg
            wire_chunk = sent * f / self.B
            steps = 2 * (n - 1)
            msgs = steps * max(1, math.ceil(seg / PIECE_BYTES)) * self.parts(piece)
            red_cpu = (n - 1) * seg / (self.cal["codec"]["int_add_GBps"] * 1e9) if self.sc["codec"] == "cpu" else 0.0
            net = self.net_cpu(2 * sent, thc=True) + msgs * msg
            chain = steps * max(seg * f / self.B, piece * f / self.B + self.hop(alpha, piece))
            wire_B = sent / Ec
        else:  # aggregators: "switch" (line rate, Tofino profile) or "agg" (k software aggregators)
            if algo == "switch":
                lanes = TOFINO_LANES
            else:
                budget = self.sc["mtu"] - IP_UDP - AGG_HDR
                lanes = lanes_for(b, w, AGG_MAX_LANES, budget)
            pkts = math.ceil(Ec / lanes)
            up = pkts * self.fr.datagram(lanes * b // 8)
            down = pkts * self.fr.datagram(lanes * w)
            wire_B = max(up, down) / Ec
            t_worker = max(up, down) / self.B
            rtt = 2 * alpha + (2 * alpha if algo == "agg" else 0)  # worker <-> switch, or via a switch to a host
            red_cpu = 0.0
            # Worker CPU per datagram (UDP send of the data, receive of the result): taken as the
            # aggregator's measured CPU per worker datagram (it receives and sends one per lane set).
            # The client sends over kernel UDP sockets (the DPDK client has not run on a real NIC):
            # the datagram cost holds in every scenario, RDMA-class or not.
            per_pkt = self.cal["aggregator"]["cpu_s_per_worker_packet"]
            # The testbed measured the whole cost of a worker datagram (its send and its result's
            # receive, the aggregator's receive, lookup-add and send, the kernel's work through
            # veth, bridge and tbf in every process): it is charged here, and no aggregator CPU apart.
            dgram_all = self.sc.get("dgram_cpu_s") if algo == "agg" and self.sc["machine_cores"] else None
            net = pkts * (dgram_all or per_pkt)
            if algo == "switch":
                wire_chunk = t_worker
                agg_t = 0.0
            else:
                k = self.k
                # Each aggregator's link carries 1/k of every worker's datagrams; its CPU adds
                # n lanes per element of its share.
                t_agglink = n * max(up, down) / k / self.B
                lanes_rate = self.cal["aggregator"]["lanes_per_cpu_s"]
                agg_cpu_chunk = 0.0 if dgram_all else n * Ec / lanes_rate / (1 if self.sc["machine_cores"] else k)
                wire_chunk = max(t_worker, t_agglink)
                agg_t = agg_cpu_chunk
            # The window: at most AGG_SLOTS packets per round trip.
            chain = max(wire_chunk, pkts / AGG_SLOTS * rtt) + rtt
            if not self.sc["machine_cores"] and algo == "agg":
                agg_cpu_chunk = agg_t / self.sc["agg_cores"]
        enc_c = Ec * 4 / enc_rate
        dec_c = Ec * 4 / dec_rate
        rank_cpu_chunk = enc_c + dec_c + red_cpu + net
        cores = self.sc["cores"] or 1
        if self.sc["machine_cores"]:
            steady_cpu = (n * rank_cpu_chunk + agg_cpu_chunk) / self.sc["machine_cores"]
            enc_t = self.share(enc_c)
            dec_t = self.share(dec_c + red_cpu)
        else:
            steady_cpu = max(rank_cpu_chunk / cores, agg_cpu_chunk)
            enc_t, dec_t = enc_c / cores, (dec_c + red_cpu) / cores
        # Two chunks are in flight, but a wait on the schedules (transport/schedules Sched::wait)
        # progresses only the chunk waited on: the next chunk's steps advance only while this rank
        # encodes and decodes (between blocks), so chunk latencies do not overlap there. The
        # aggregator client drives every operation of its window whenever it polls.
        overlap = 2 if algo in ("switch", "agg") else 1
        steady = max(steady_cpu, wire_chunk, chain / overlap)
        # Scale the full-chunk figures to the call (the last chunk may be partial).
        frac_last = (W - (nch - 1) * Ec) / Ec if nch > 1 else 1.0
        pre_t = self.share(E * 4 / pre_rate) if self.sc["machine_cores"] else E * 4 / pre_rate / cores
        pre_x = self.small_allreduce(PRELUDE_HDR_WORDS * 4)
        if nblocks > PRELUDE_INLINE:
            pre_x += self.small_allreduce((nblocks - PRELUDE_INLINE) * 4)
        if algo in ("switch", "agg"):
            # The prelude goes through the aggregator as DATA_MAX packets: one round trip each.
            pre_x = 2 * (2 * alpha + (2 * alpha if algo == "agg" else 0))
        t = pre_t + pre_x + enc_t + (nch - 1) * steady + frac_last * (max(wire_chunk, chain) + dec_t)
        parts = dict(cpu=steady_cpu, wire=wire_chunk, latency=chain / overlap)
        bound = max(parts, key=parts.get)
        if bound == "latency" and wire_chunk >= 0.8 * parts["latency"]:
            bound = "wire"  # the chain is the wire time plus a few hops
        return dict(time=t, wire=wire_B, bound=bound, chunks=nch, rho=steady_cpu / steady, alpha=alpha)

    def run(self, name):
        if name == "f32-ring":
            return self.f32_ring()
        if name == "bf16-ring":
            return self.bf16_ring()
        if name == "thc-ps":
            return self.thc("ps")
        if name == "thc-int":
            return self.thc("int")
        if name == "thc-switch":
            return self.thc("switch")
        if name == "thc-agg":
            return self.thc("agg")
        raise ValueError(f"unknown algorithm '{name}'")


ALGOS = ["f32-ring", "bf16-ring", "thc-ps", "thc-int", "thc-switch", "thc-agg"]


def load_calib(path):
    with open(path) as f:
        cal = json.load(f)
    need = {"codec": ["thc_encode_GBps", "thc_encode_value_GBps", "thc_decode_GBps", "prelude_share_of_encode",
                      "f32_sum_GBps", "int_add_GBps", "lookup_add_Glanes_s", "bf16_convert_GBps", "bf16_sum_GBps"],
            "aggregator": ["lanes_per_cpu_s", "cpu_s_per_worker_packet"],
            "transport": ["tcp_cpu_s_per_GB"],
            "gpu_h200": ["thc_encode_GBps", "thc_decode_GBps", "thc_prelude_GBps"]}
    for sec, keys in need.items():
        for k in keys:
            v = cal.get(sec, {}).get(k)
            if not isinstance(v, (int, float)) or v <= 0:
                raise SystemExit(f"thc_model.py: {path}: {sec}.{k} missing or not a positive number")
    return cal


# ---------------------------------------------------------------- validation
# compare.sh config -> (model algorithm, extra scenario settings)
VALIDATE = {
    "none-ring": ("f32-ring", {}),
    "bf16-ring": ("bf16-ring", {}),
    "thc-ps": ("thc-ps", {}),
    "thc-int": ("thc-int", {}),
    "thc-agg-switch": ("thc-agg", {"agg_switch_position": True}),
}


def run_settings(d):
    """compare.sh's DIR/settings (key=value lines); runs older than the file had the defaults."""
    st = {"mpi_yield_when_idle": "0"}
    p = os.path.join(d, "settings")
    if os.path.exists(p):
        with open(p) as f:
            for line in f:
                if "=" in line:
                    k, v = line.strip().split("=", 1)
                    st[k] = v
    return st


def check_settings(d, cal, cal_name):
    """The testbed's latencies depend on whether Open MPI busy-polls (several-fold on the rings'
    small steps): a run is modelled only with a calibration made the same way."""
    run_y = run_settings(d)["mpi_yield_when_idle"] == "1"
    cal_y = bool(cal.get("testbed", {}).get("mpi_yield_when_idle", False))
    if run_y != cal_y:
        raise SystemExit(f"thc_model.py validate: {d} ran with mpi_yield_when_idle={int(run_y)} but {cal_name} "
                         f"was calibrated with {int(cal_y)} (calibrate.sh --testbed{' --mpi-yield' if run_y else ''})")


def validate(cal, dirs, out_md=None):
    """Reads compare.sh's raw JSON (DIR/raw/<rate>_<config>.json) from one or more runs and models
    each run with DIR/calib.json where there is one (a calibration made with the run: the shared
    machine's load changes the testbed's latencies 2-3x), else with `cal`. Prints per point the
    median and range of the measured and the modelled times over runs and the median of the runs'
    errors."""
    pts = {}
    rate = None
    n = None
    for d in dirs:
        cp = os.path.join(d, "calib.json")
        cal_d = load_calib(cp) if os.path.exists(cp) else cal
        check_settings(d, cal_d, cp if os.path.exists(cp) else "the calibration")
        for c in VALIDATE:
            for fn in sorted(os.listdir(os.path.join(d, "raw"))):
                m = re.fullmatch(r"(.+)_" + re.escape(c) + r"\.json", fn)
                if not m:
                    continue
                with open(os.path.join(d, "raw", fn)) as f:
                    js = json.load(f)
                rate = m.group(1)
                n = js.get("world", js.get("ranks", n))
                for r in js["rows"]:
                    pts.setdefault((c, r["size"]), []).append((r["time_us"] * 1e-6, r["wire_bytes_per_elem"], cal_d))
    if not pts:
        raise SystemExit("thc_model.py validate: no compare.sh results (raw/<rate>_<config>.json) in " + " ".join(dirs))
    B = parse_rate(rate)
    n = n or 4
    rows = []
    for (c, size) in sorted(pts, key=lambda k: (list(VALIDATE).index(k[0]), k[1])):
        algo, _ = VALIDATE[c]
        ts, ms, errs = [], [], []
        for t_meas, wm, cal_d in pts[(c, size)]:
            mdl = Model(cal_d, "testbed", n, size, B)
            # thc-agg-switch: thc-aggregator in the bridge namespace, behind every worker's shaped
            # port (its own side unshaped), on the machine's shared cores.
            r = mdl.thc_agg_switch_position() if algo == "thc-agg" else mdl.run(algo)
            ts.append(t_meas)
            ms.append(r["time"])
            errs.append((r["time"] - t_meas) / t_meas)
        rows.append((c, size, ts, ms, _median(errs), wm, r["wire"], r["bound"]))
    lines = ["| config | size | measured ms (median [min–max], runs) | model ms (median [min–max]) | error (median of runs) "
             "| wire B/elem measured / model | model bound |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for c, size, ts, ms, err, wm, wp, bound in rows:
        lines.append(f"| {c} | {human(size)} | {_median(ts) * 1e3:.1f} [{min(ts) * 1e3:.1f}–{max(ts) * 1e3:.1f}], {len(ts)} | "
                     f"{_median(ms) * 1e3:.1f} [{min(ms) * 1e3:.1f}–{max(ms) * 1e3:.1f}] | "
                     f"{err * 100:+.1f} % | {wm:.3f} / {wp:.3f} | {bound} |")
    worst = max(abs(r[4]) for r in rows)
    lines.append("")
    lines.append(f"worst |error| {worst * 100:.1f} % over {len(rows)} points (target 20 %); {n} ranks at {rate}")
    text = "\n".join(lines)
    print(text)
    if out_md:
        with open(out_md, "w") as f:
            f.write(text + "\n")
    return worst


def _agg_switch_position(self):
    """The testbed's thc-agg-switch: the aggregator sits on the bridge, so each worker's link
    carries its own datagrams (as a switch) but the aggregation costs CPU on the shared cores."""
    sc = dict(self.sc)
    sc.pop("testbed_measured", None)  # already resolved (with any overrides) in self.sc
    m = Model(self.cal, sc, self.n, self.size, self.B, self.chunk_bytes, k_aggs=self.n)
    # k = n aggregator "links" of rate B: the bridge-side ports are the workers' own; the
    # aggregator's CPU is the shared machine's.
    return m.thc("agg")


Model.thc_agg_switch_position = _agg_switch_position


# ---------------------------------------------------------------- testbed calibration
def _rows(d, rate, config):
    path = os.path.join(d, "raw", f"{rate}_{config}.json")
    try:
        with open(path) as f:
            return json.load(f)["rows"]
    except (OSError, ValueError, KeyError):
        raise SystemExit(f"thc_model.py calibrate-testbed: no rows in {path}")


def _median(v):
    v = sorted(v)
    return v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])


def calibrate_testbed(cal, d, n=4, rate="1gbit", cores=2, cpu_file=None, steady=None):
    """What the emulated cluster adds to the per-core rates, from calls that are not validation
    points: small calls (256 KB - 1 MB, latency-bound) and an unshaped float32 ring (CPU-bound).
      alpha_ompi_s   a step of Open MPI's blocking ring: the float32 ring at 1 Gbit/s, less its wire
                     time (its ranks busy-poll, 4 of them on 2 cores)
      transport_cpu_s_per_GB  CPU per byte sent or received through MPI, TCP, veth, bridge and tbf,
                     kernel work outside the ranks' own accounts included: the unshaped float32 ring
                     at 16 MB is CPU-bound, its time less its steps' latency is that work spread
                     over the machine's cores
      alpha_sched_s  a hop of thc's schedules (nonblocking, ranks nap while waiting): the THC int
                     ring at 1 Gbit/s fitted with the model, from the steady state when `steady` has
                     thc-int at two sizes of 4 MB or more (the smallest and the largest: their time
                     difference over their chunk difference, per-call costs cancel), else from one-chunk
                     calls (256 KB - 1 MB, where per-call costs the model misses count as hop)"""
    B = parse_rate(rate)
    f = Framing(1500, 14).stream(2)
    steps = 2 * (n - 1)
    a = []
    for r in _rows(d, rate, "none-ring"):
        if (256 << 10) <= r["size"] <= (1 << 20):
            seg = r["size"] / n
            a.append(r["time_us"] * 1e-6 / steps - seg * f / B)
    if not a:
        raise SystemExit("thc_model.py calibrate-testbed: no none-ring rows of 256 KB - 1 MB at " + rate)
    alpha_ompi = _median(a)
    big = max(_rows(d, "none", "none-ring"), key=lambda r: r["size"])
    S = big["size"]
    moved = 2 * 2 * (n - 1) / n * S
    sums = (n - 1) * (S / n) / (cal["codec"]["f32_sum_GBps"] * 1e9)
    busy = big["time_us"] * 1e-6 - steps * alpha_ompi
    tcpu = max(1e-3, (busy * cores / n - sums) / moved * 1e9)
    tb = {"alpha_ompi_s": alpha_ompi, "transport_cpu_s_per_GB": tcpu, "alpha_sched_s": 1e-4,
          "codec": dict(cal["codec"])}
    cal2 = dict(cal)
    cal2["testbed"] = tb
    if cpu_file:
        tb.update(calibrate_testbed_cpu(cal, cpu_file, n))
    fits = []
    big = [r for r in (_rows(steady, rate, "thc-int") if steady else []) if r["size"] >= (4 << 20)]
    if steady and len(big) < 2:
        raise SystemExit(f"thc_model.py calibrate-testbed: {steady}: thc-int at two sizes of 4 MB or more needed")
    if big:
        big.sort(key=lambda r: r["size"])
        lo_r, hi_r = big[0], big[-1]
        dt = (hi_r["time_us"] - lo_r["time_us"]) * 1e-6
        lo, hi = 0.0, 0.1
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            t = (Model(cal2, "testbed", n, hi_r["size"], B, alpha=mid).thc("int")["time"]
                 - Model(cal2, "testbed", n, lo_r["size"], B, alpha=mid).thc("int")["time"])
            lo, hi = (mid, hi) if t < dt else (lo, mid)
        tb["alpha_sched_s"] = lo
        tb["source"] = (f"compare.sh results in {d}: none-ring at {rate} (256 KB - 1 MB) and unshaped ({human(S)}); "
                        f"in {steady}: thc-int at {rate}, {human(lo_r['size'])} and {human(hi_r['size'])}; "
                        f"{n} ranks, {cores} cores")
        return tb
    for r in _rows(d, rate, "thc-int"):
        if not ((256 << 10) <= r["size"] <= (1 << 20)):
            continue
        lo, hi = 0.0, 0.1
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            t = Model(cal2, "testbed", n, r["size"], B, alpha=mid).thc("int")["time"]
            lo, hi = (mid, hi) if t < r["time_us"] * 1e-6 else (lo, mid)
        fits.append(lo)
    if not fits:
        raise SystemExit("thc_model.py calibrate-testbed: no thc-int rows of 256 KB - 1 MB at " + rate)
    tb["alpha_sched_s"] = _median(fits)
    tb["source"] = (f"compare.sh results in {d}: none-ring at {rate} (256 KB - 1 MB) and unshaped ({human(S)}), "
                    f"thc-int at {rate} (256 KB - 1 MB); {n} ranks, {cores} cores")
    return tb


def calibrate_testbed_cpu(cal, path, n=4):
    """CPU that the processes of one call use on the testbed, the kernel's work through veth, bridge
    and tbf in their contexts included, from compare.sh runs at 1 Gbit/s (calibrate.sh --testbed
    writes the lines `config size rank_cpu_ms agg_cpu_s agg_rx_packets`): the ranks' user+sys per
    call (thc_allreduce_perf's `# cpu:` line, timed calls only) and the aggregator's user+sys over
    its life (/proc/PID/stat; it sleeps between calls), per call by its datagram count. Less the
    codec's CPU at the calibrated one-core rates, it gives
      dgram_cpu_s                 per worker datagram of thc-agg-switch: the worker's send and its
                                  result's receive, the aggregator's receive, lookup-add and send
      thc_transport_cpu_s_per_GB  per payload byte sent or received by thc's schedules (thc-ps)"""
    rows = {}
    with open(path) as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            c, size, rank_ms, agg_s, agg_rx = line.split()
            rows[c] = (parse_size(size), float(rank_ms) * 1e-3, float(agg_s), int(agg_rx))
    cc = cal["codec"]
    out, notes = {}, []
    for c, (size, rank_cpu, agg_s, agg_rx) in sorted(rows.items()):
        E = size // 4
        W = wire_elems(E)
        codec = E * 4 / (cc["thc_encode_GBps"] * 1e9) + E * 4 / (cc["thc_decode_GBps"] * 1e9)
        if c == "thc-agg-switch":
            lanes = lanes_for(THC_BITS, sum_width(n), AGG_MAX_LANES, 1500 - IP_UDP - AGG_HDR)
            chunk = CHUNK_BYTES // 4
            pkts = sum(math.ceil(min(chunk, W - i) / lanes) for i in range(0, W, chunk))
            if agg_rx < n * pkts:
                raise SystemExit(f"thc_model.py: {path}: the aggregator received {agg_rx} datagrams, "
                                 f"fewer than one call's {n * pkts}")
            agg_cpu = agg_s / (agg_rx / (n * pkts))  # calls it served: warm-up, timed and check calls
            out["dgram_cpu_s"] = (n * (rank_cpu - codec) + agg_cpu) / (n * pkts)
            notes.append(f"{c} {human(size)}: ranks {rank_cpu * 1e3:.1f} ms, aggregator {agg_cpu * 1e3:.1f} ms "
                         f"per call, {n * pkts} worker datagrams")
        elif c == "thc-ps":
            sent = (n - 1) / n * W * (THC_BITS / 8 + sum_width(n))
            lookup = W / (cc["lookup_add_Glanes_s"] * 1e9)
            out["thc_transport_cpu_s_per_GB"] = (rank_cpu - codec - lookup) / (2 * sent) * 1e9
            notes.append(f"{c} {human(size)}: ranks {rank_cpu * 1e3:.1f} ms per call")
    out["cpu_source"] = f"compare.sh at 1gbit ({path}): " + "; ".join(notes)
    return out


# ---------------------------------------------------------------- datacenter tables
DC_N = [8, 64, 256, 1024]
DC_RATES = ["10gbit", "100gbit", "200gbit", "400gbit"]
DC_SIZES = ["25M", "100M", "1G"]


def best_chunk(cal, scen, n, size, B, algo, k=1):
    """THC_CHUNK_BYTES among powers of two from 1 MB to the call: the model's best (and the
    default's time) so that a default tuned for 4 ranks does not decide the comparison."""
    best = None
    c = CHUNK_BYTES
    while True:
        r = Model(cal, scen, n, size, B, chunk_bytes=c, k_aggs=k).run(algo)
        if best is None or r["time"] < best[1]["time"]:
            best = (c, r)
        if c >= size:
            break
        c *= 2
    return best


def datacenter(cal, out, scenarios=("cpu", "gpu"), plot=True):
    os.makedirs(out, exist_ok=True)
    md = []
    data = {}
    for scen in scenarios:
        md.append(f"### Scenario `{scen}`: {SCENARIOS[scen]['note']}")
        md.append("")
        md.append("Time of one allreduce (ms) and speedup of the best THC variant over the better of the "
                  "float32 and bf16 rings (what a user would deploy); `thc-agg`: k = N software "
                  "aggregator hosts (as many as workers) with 16 cores each; N > 64 on an aggregator is beyond the protocol's "
                  "64-worker bitmap (a tree of aggregators assumed). THC rows use the model's best "
                  "THC_CHUNK_BYTES (shown when not the 1 MB default).")
        md.append("")
        hdr = "| N | link | size | " + " | ".join(ALGOS) + " | best THC vs best ring | THC bound |"
        md.append(hdr)
        md.append("|---:|---:|---:|" + "---:|" * len(ALGOS) + "---:|---|")
        for n in DC_N:
            for rate in DC_RATES:
                B = parse_rate(rate)
                for s in DC_SIZES:
                    size = parse_size(s)
                    cells, times = [], {}
                    for a in ALGOS:
                        k = n
                        if a.startswith("thc"):
                            c, r = best_chunk(cal, scen, n, size, B, a, k)
                        else:
                            c, r = CHUNK_BYTES, Model(cal, scen, n, size, B).run(a)
                        times[a] = r
                        note = "" if c == CHUNK_BYTES or not a.startswith("thc") else f" ({human(c)})"
                        cells.append(f"{r['time'] * 1e3:.2f}{note}")
                    base = min(times["f32-ring"]["time"], times["bf16-ring"]["time"])
                    best_thc = min(("thc-ps", "thc-int", "thc-switch", "thc-agg"), key=lambda a: times[a]["time"])
                    # The deployable THC (no special hardware): ps or int.
                    dep = min(("thc-ps", "thc-int"), key=lambda a: times[a]["time"])
                    sp = base / times[dep]["time"]
                    sp_best = base / times[best_thc]["time"]
                    md.append(f"| {n} | {rate} | {s} | " + " | ".join(cells) +
                              f" | {dep} {sp:.2f}× ({best_thc} {sp_best:.2f}×) | {times[dep]['bound']} |")
                    data[(scen, n, rate, s)] = {a: times[a]["time"] for a in ALGOS}
        md.append("")
    with open(os.path.join(out, "datacenter.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    # Plot data: speedup over the best ring against link rate, one file per (scenario, size).
    files = []
    for scen in scenarios:
        for s in DC_SIZES:
            fn = os.path.join(out, f"speedup_{scen}_{s}.dat")
            with open(fn, "w") as f:
                f.write("# N rate_gbit " + " ".join(ALGOS) + "  (speedup over min(f32-ring, bf16-ring))\n")
                for n in DC_N:
                    for rate in DC_RATES:
                        t = data[(scen, n, rate, s)]
                        base = min(t["f32-ring"], t["bf16-ring"])
                        f.write(f"{n} {parse_rate(rate) * 8 / 1e9:g} " + " ".join(f"{base / t[a]:.4f}" for a in ALGOS) + "\n")
                    f.write("\n\n")
            files.append((scen, s, fn))
    if plot:
        return plot_dc(out, files)
    return 0


def plot_dc(out, files):
    if not shutil.which("gnuplot"):
        print("thc_model.py: no gnuplot: plot data left in " + out, file=sys.stderr)
        return 3
    status = 0
    for scen in sorted({f[0] for f in files}):
        png = os.path.join(out, f"speedup_{scen}.png")
        mine = [f for f in files if f[0] == scen]
        gp = [
            "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size 1500,900 noenhanced } "
            "else { set terminal png size 1500,900 noenhanced }",
            f"set output '{png}'",
            f"set multiplot layout {len(mine)},{len(DC_N)} title 'THC speedup over the best uncompressed ring "
            f"(min of float32, bf16), scenario {scen}; >1: THC faster'",
            "set logscale x 2; set grid; set key top right font ',8'; set xlabel 'link Gbit/s'",
            "set xtics (10, 100, 200, 400); set yrange [0:*]",
        ]
        for scen_, s, fn in mine:
            for i, n in enumerate(DC_N):
                gp.append(f"set title 'N={n}, S={s}'")
                cols = []
                for j, a in enumerate(ALGOS):
                    if a in ("f32-ring",):
                        continue
                    cols.append(f"'{fn}' index {i} using 2:{3 + j} with linespoints title '{a}'")
                cols.append("1 with lines dt 2 lc rgb 'black' notitle")
                gp.append("plot " + ", ".join(cols))
        gp.append("unset multiplot")
        script = os.path.join(out, f"speedup_{scen}.gp")
        with open(script, "w") as f:
            f.write("\n".join(gp) + "\n")
        if subprocess.call(["gnuplot", script]) != 0:
            status = 3
        else:
            print(f"thc_model.py: plot {png}", file=sys.stderr)
    return status


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calib", default=DEFAULT_CALIB, help="calibration JSON (perf/model/calibrate.sh)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("validate", help="model vs compare.sh results")
    v.add_argument("dirs", nargs="+")
    v.add_argument("--md", help="also write the table here")
    d = sub.add_parser("datacenter", help="tables and plots for datacenter sizes")
    d.add_argument("--out", required=True)
    d.add_argument("--no-plot", action="store_true")
    c = sub.add_parser("calibrate-testbed", help="add the testbed's latencies and transport CPU to the calibration")
    c.add_argument("dir", help="compare.sh --rates 'none 1gbit' --min-size 256K --max-size 16M --configs 'none-ring thc-int'")
    c.add_argument("--write", help="write the calibration with the testbed section here")
    c.add_argument("--steady", help="compare.sh --rates 1gbit --min-size 6M --max-size 48M --configs thc-int: "
                   "the hop of thc's schedules from the steady state")
    c.add_argument("--mpi-yield", type=int, choices=(0, 1), default=0,
                   help="1: the testbed runs had compare.sh --mpi-yield (recorded; validate matches runs to it)")
    c.add_argument("--cpu", help="CPU per call: lines 'config size rank_cpu_ms agg_cpu_s agg_rx_packets' (calibrate.sh --testbed)")
    o = sub.add_parser("one", help="one configuration, every algorithm")
    o.add_argument("--n", type=int, required=True)
    o.add_argument("--size", required=True)
    o.add_argument("--rate", required=True)
    o.add_argument("--scenario", default="cpu", choices=sorted(SCENARIOS))
    o.add_argument("--chunk", default=None, help="THC_CHUNK_BYTES (default 1M)")
    o.add_argument("--k", type=int, default=1, help="software aggregators for thc-agg")
    o.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    cal = load_calib(a.calib)
    if a.cmd == "validate":
        worst = validate(cal, a.dirs, a.md)
        return 0 if worst <= 0.2 else 1
    if a.cmd == "calibrate-testbed":
        tb = calibrate_testbed(cal, a.dir, cpu_file=a.cpu, steady=a.steady)
        tb["mpi_yield_when_idle"] = bool(a.mpi_yield)
        print(json.dumps(tb, indent=1))
        if a.write:
            cal["testbed"] = tb
            with open(a.write, "w") as f:
                json.dump(cal, f, indent=1)
                f.write("\n")
        return 0
    if a.cmd == "datacenter":
        return datacenter(cal, a.out, plot=not a.no_plot)
    n = a.n
    if n < 1:
        raise SystemExit("thc_model.py: --n must be >= 1")
    size = parse_size(a.size)
    B = parse_rate(a.rate)
    chunk = parse_size(a.chunk) if a.chunk else CHUNK_BYTES
    res = {}
    for alg in ALGOS:
        res[alg] = Model(cal, a.scenario, n, size, B, chunk_bytes=chunk, k_aggs=a.k).run(alg)
    if a.json:
        print(json.dumps({"n": n, "size": size, "rate_Bps": B, "scenario": a.scenario, "results": res}, indent=1))
    else:
        print(f"# N={n} S={human(size)} link={a.rate} scenario={a.scenario} chunk={human(chunk)} k={a.k}")
        print(f"{'algorithm':12s} {'time_ms':>10s} {'wire_B/elem':>12s}  bound")
        for alg, r in res.items():
            print(f"{alg:12s} {r['time'] * 1e3:10.3f} {r['wire']:12.4f}  {r['bound']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
