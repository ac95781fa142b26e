#!/usr/bin/env python3
"""Where a CTA's time goes: phase timings of the sm90 forward kernel.

Builds the kernel with FJ_TRACE (templates/sm90/trace.cuh), which writes SM
clock stamps of each work item's phases over the LSE (an item is a CTA, or
one query block of the persistent kernel), runs one launch through
`flexjit run --dump`, and prints the median of each phase over the items,
of each step of loop iterations 1 and 2, and how long a consumer warpgroup
waits between the end of one item and the start of the next on its SM.
Timing only: the traced kernel's LSE is not an LSE. Runs on the GPU machine.

    python3 bench/trace.py [--persistent] [CASE...]
    (CASE: sliding causal causal64 document full)
"""
import os
import struct
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {
    "causal": ("causal.lua", [], 1, 16, 16384, 128),
    "full": ("full.lua", [], 1, 16, 16384, 128),
    "sliding": ("sliding_window.lua", ["--param", "window=1024"], 1, 16, 16384, 128),
    "document": ("document.lua", [], 1, 16, 16384, 128),
    "causal64": ("causal.lua", [], 4, 32, 4096, 64),
}
# Consumer c's stamps at 32 c + k, the producer's at 64 + k (sm90/trace.cuh).
C_ENTRY, C_Q, C_K, C_FIRST, C_LOOP, C_LASTPV, C_EPI, C_TILES = range(8)
P_ENTRY, P_ROLE, P_ISSUED, P_SMID, P_NS_LO, P_NS_HI = 64, 65, 66, 67, 68, 69
# Loop iterations 1 and 2 of consumer c: nine stamps each at 32 c + 8 and
# 32 c + 17 (sm90/trace.cuh); the producer's tile i: 64 + 8 + 2 i (K of tile i + 1
# issued), + 9 (V of tile i issued), i < 24.


def read_npy_u32(path):
    with open(path, "rb") as f:
        data = f.read()
    hlen = struct.unpack("<H", data[8:10])[0]
    body = data[10 + hlen:]
    return struct.unpack("<%dI" % (len(body) // 4), body)


def diff(a, b):
    """b - a on the 32-bit clock."""
    return (b - a) & 0xFFFFFFFF


def by_clock(lst):
    """lst (tuples whose first field is a 32-bit clock stamp of one SM) in
    time order, wrap-around included."""
    base = lst[0][0]
    return sorted(lst, key=lambda x: diff(base, x[0]) if diff(base, x[0]) < 2**31
                  else -diff(x[0], base))


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


def clock_ghz(ctas):
    """SM clock from each SM's first and last CTA: clock stamps against
    the global timer (ns) read next to them."""
    per_sm = {}
    for t in ctas:
        ns = t[P_NS_LO] | (t[P_NS_HI] << 32)
        per_sm.setdefault(t[P_SMID], []).append((ns, t[P_ISSUED]))
    rates = []
    for lst in per_sm.values():
        lst.sort()
        (n0, c0), (n1, c1) = lst[0], lst[-1]
        if n1 - n0 > 20000:
            rates.append(diff(c0, c1) / (n1 - n0))
    return median(rates) if rates else 1.98


def run_case(name, persistent):
    spec, extra, B, H, S, D = CASES[name]
    # The overlap named, so that the spill fallback cannot swap the variant
    # (the stamps may cost a traced kernel a spill the shipped one has not).
    # Two consumer warpgroups (128-row tiles) at every head dim: the stamps'
    # slots have no room for D=64's third (its default), which is not traced.
    env = dict(os.environ, FLEXJIT_KERNEL_DEFINES="FJ_TRACE=1 FJ_INTRA_WG_OVERLAP=1",
               FLEXJIT_CONSUMERS="2")
    # Say which kernel: the persistent one is the default at D=128.
    env.update(FLEXJIT_PERSISTENT="1" if persistent else "0")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [os.path.join(REPO, "build", "flexjit"), "run", os.path.join(REPO, "examples", spec),
               "--batch", str(B), "--heads", str(H), "--q-len", str(S), "--head-dim", str(D),
               "--dump", tmp, "--warmup", "0"] + extra
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if p.returncode != 0:
            print("%s: flexjit run failed: %s" % (name, p.stderr.strip()[-400:]))
            return
        lse = read_npy_u32(os.path.join(tmp, "lse.npy"))
    nm = S // 128
    ctas = []
    for b in range(B):
        for h in range(H):
            for m in range(nm):
                base = (b * H + h) * S + m * 128
                ctas.append(lse[base:base + 128])
    ghz = clock_ghz(ctas)
    us = 1.0 / (ghz * 1000.0)
    rows = {k: [] for k in ("range+init", "Q arrives", "K0 after Q", "tile 0 (S, softmax)",
                            "loop per tile", "last P V", "epilogue", "item span")}
    per_sm = {}
    tiles = []
    idle = {}  # SM -> [(consumer 0's entry, Q ready, epilogue end)]
    for t in ctas:
        p0 = t[P_ENTRY]
        rows["range+init"].append(diff(p0, t[P_ROLE]))
        span = 0
        for c in (0, 1):
            s = t[32 * c:32 * c + 8]
            n = s[C_TILES]
            if n == 0 or n > 1 << 24:  # no tile, or not written (the NaN poison)
                continue
            if c == 0:
                idle.setdefault(t[P_SMID], []).append((s[C_ENTRY], s[C_Q], s[C_EPI]))
            tiles.append(n)
            rows["Q arrives"].append(diff(t[P_ROLE], s[C_Q]))
            rows["K0 after Q"].append(diff(s[C_Q], s[C_K]))
            rows["tile 0 (S, softmax)"].append(diff(s[C_K], s[C_FIRST]))
            if n > 1:
                rows["loop per tile"].append(diff(s[C_FIRST], s[C_LOOP]) / (n - 1))
            rows["last P V"].append(diff(s[C_LOOP], s[C_LASTPV]))
            rows["epilogue"].append(diff(s[C_LASTPV], s[C_EPI]))
            span = max(span, diff(p0, s[C_EPI]))
        rows["item span"].append(span)
        per_sm.setdefault(t[P_SMID], []).append((p0, span))
    gaps = []
    for lst in per_sm.values():
        # Stamps are one SM's clock: order that SM's CTAs by their start.
        lst = by_clock(lst)
        for (a, sa), (bb, _) in zip(lst, lst[1:]):
            g = diff(a, bb)
            if g < 2**31:
                gaps.append(g - sa)
    waits = []
    for lst in idle.values():
        lst = by_clock(lst)
        for prev, nxt in zip(lst, lst[1:]):
            w = diff(prev[2], nxt[1])
            if w < 2**31:
                waits.append(w)
    print("\n%s%s: B=%d H=%d S=%d D=%d, %d items on %d SMs, median %d tiles a consumer, "
          "clock %.2f GHz (stamps against the global timer)"
          % (name, " (persistent)" if persistent else "", B, H, S, D, len(ctas), len(per_sm),
             median(tiles), ghz))
    print("| phase | median us | p90 us |")
    print("|---|---:|---:|")
    for k, v in rows.items():
        v = sorted(v)
        if v:
            print("| %s | %.2f | %.2f |" % (k, median(v) * us, v[int(len(v) * 0.9)] * us))
    if gaps and not persistent:
        g = sorted(gaps)
        print("| gap between CTAs on an SM | %.2f | %.2f |" % (median(g) * us, g[int(len(g) * 0.9)] * us))
    if waits:
        w = sorted(waits)
        print("| consumer 0: epilogue end to next item's Q ready | %.2f | %.2f |"
              % (median(w) * us, w[int(len(w) * 0.9)] * us))
    # Loop iterations 1 and 2 (consumers with at least 4 tiles): where the
    # time between consecutive stamps goes. The walk to the tile after next
    # and its mode run after the GEMMs are issued ("issue QK, V wait, PV,
    # walk"): "tile mode" is empty and "pack, next tile" holds the pack of P.
    steps = ["tile mode", "turn (ping-pong)", "K ready", "issue QK, V wait, PV, walk",
             "S ready", "softmax", "P V done, rescale", "pack, next tile"]
    cols = {k: [] for k in steps}
    loop = []
    for t in ctas:
        for c in (0, 1):
            s = t[32 * c:32 * c + 32]
            if s[C_TILES] < 4 or s[C_TILES] > 1 << 24:
                continue
            for it in (0, 1):
                base = 8 + 9 * it
                for k, name in enumerate(steps):
                    cols[name].append(diff(s[base + k], s[base + k + 1]))
                loop.append(diff(s[base], s[base + 8]))
    if loop:
        print("\n| loop iteration (1 and 2) | median us |")
        print("|---|---:|")
        for name in steps:
            print("| %s | %.3f |" % (name, median(cols[name]) * us))
        print("| whole iteration | %.3f |" % (median(loop) * us))
    pk, pv = [], []
    for t in ctas:
        if 4 <= t[C_TILES] <= 1 << 24:
            pk.append([diff(t[P_ROLE], t[64 + 8 + 2 * i]) for i in range(4)])
            pv.append([diff(t[P_ROLE], t[64 + 9 + 2 * i]) for i in range(4)])
    if pk:
        print("producer, us after its start: K(i+1) issued " +
              " ".join("%.2f" % (median([x[i] for x in pk]) * us) for i in range(4)) +
              "; V(i) issued " +
              " ".join("%.2f" % (median([x[i] for x in pv]) * us) for i in range(4)))


def main():
    args = sys.argv[1:]
    persistent = "--persistent" in args
    names = [a for a in args if a != "--persistent"] or ["sliding", "causal"]
    for n in names:
        if n not in CASES:
            print("unknown case %s (%s)" % (n, " ".join(CASES)))
            continue
        run_case(n, persistent)


if __name__ == "__main__":
    main()
