#!/usr/bin/env python3
"""Hand estimate of the recirculation load of tna/thc_tna.p4 on one Tofino 1 pipe (README.md,
"Resources"). Not a measurement: bytes per pass follow from the program's layout, the rest are
public figures (100 Gbit/s recirculation port, 16 x 100 G ports per pipe).

Passes 1..4 carry the bridged header, Ethernet..THC and the chunks not yet consumed; the packet
that completes a set then makes 8 harvest passes carrying the result lanes read so far.
"""
HEADERS = 14 + 20 + 8 + 64   # Ethernet, IPv4, UDP, THC
BRIDGE = 13                  # thc_bridge_h
FRAME = 4 + 20               # FCS, preamble + inter-frame gap, per frame on a port
LANES = 256


def per_set(payload_in, result_width, n):
    chunk = payload_in // 4
    add = sum(BRIDGE + HEADERS + (4 - i) * chunk + FRAME for i in range(4))
    harvest = sum(BRIDGE + HEADERS + h * 32 * result_width + FRAME for h in range(8))
    upstream = HEADERS + payload_in + FRAME
    return add, harvest, upstream, (n * add + harvest) / (n * upstream)


FORMS = [("THC index b=4, u8 sums", 128, 1), ("THC index b=4, u16 sums", 128, 2),
         ("u8 values", 256, 1), ("Cnat as u16 values", 512, 2), ("u32 values / MAX", 1024, 4)]

print(f"{'form':24s} {'n':>3s} {'wire B':>7s} {'recirc B/pkt':>12s} {'harvest B':>9s} {'ratio':>6s} "
      f"{'Gbit/s @1x100G':>14s} {'Mpps':>6s} {'Gbit/s @8x100G':>14s} {'passes':>6s}")
for name, payload, width in FORMS:
    for n in (4, 8, 16):
        add, harvest, up, ratio = per_set(payload, width, n)
        g1 = 100 / ratio
        print(f"{name:24s} {n:3d} {up:7d} {add:12d} {harvest:9d} {ratio:6.2f} {g1:14.1f} "
              f"{g1 * 1e3 / (8 * up):6.1f} {min(800 / ratio, 800):14.0f} {5 + 8 / n:6.2f}")
