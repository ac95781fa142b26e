#!/usr/bin/env python3
"""How one case's time spreads over fresh allocations: flexjit through the
Python package, timed by do_bench's rules (as compare.py's in-process
column), trial after trial in one process, each trial on tensors allocated
anew behind a padding allocation of random size (the caching allocator
emptied in between), so that every tensor, and the library's scratch from
torch's allocator, lands at other addresses. Prints each trial's median
time beside its tensors' addresses, then the spread. Runs on the GPU
machine:

    python3 bench/spread.py [--flexjit build/flexjit] [--cases alibi,chunked]
        [--trials 6] [--seed 0]

A case whose time moves with the addresses within one process is
address-dependent; one that moves only from process to process is not
(run this several times to see that).
"""
import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (flexjit_package, REPO)

# name: (spec, B, Hq, Hkv, Lq, Lk, backward)
CASES = {
    "alibi": ("alibi.lua", 2, 16, 16, 16384, 16384, True),
    "causal": ("causal.lua", 2, 16, 16, 16384, 16384, True),
    "softcap": ("softcap.lua", 2, 16, 16, 16384, 16384, True),
    "sliding": ("sliding_window.lua", 2, 16, 16, 16384, 16384, True),
    "chunked": ("causal_bottom_right.lua", 4, 32, 8, 512, 16384, False),
    "causal-fwd": ("causal.lua", 2, 16, 16, 16384, 16384, False),
}
D = 128
MIB = 1 << 20


def trial(fj, spec, case, pad_mib, warmup, rep):
    """One trial: (median ms, {tensor: address}) on fresh tensors."""
    import torch
    import triton

    _, B, Hq, Hkv, Lq, Lk, backward = case
    pad = torch.empty(pad_mib * MIB + 512 * random.randrange(64), dtype=torch.uint8,
                      device="cuda")
    bf = dict(device="cuda", dtype=torch.bfloat16)
    q = torch.randn(B, Hq, Lq, D, **bf)
    k = torch.randn(B, Hkv, Lk, D, **bf)
    v = torch.randn(B, Hkv, Lk, D, **bf)
    params = {"window": 1024} if any(x.name == "window" for x in spec.args) else {}
    ptrs = {"pad": pad.data_ptr(), "q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr()}
    if backward:
        for t in (q, k, v):
            t.requires_grad_(True)
        dout = torch.randn(B, Hq, Lq, D, **bf)
        ptrs["dout"] = dout.data_ptr()

        def f():
            torch.autograd.grad(fj.attention(q, k, v, spec, params=params), (q, k, v), dout)
    else:
        def f():
            fj.attention(q, k, v, spec, params=params)
    f()
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(f, warmup=warmup, rep=rep, return_mode="median")
    return ms, ptrs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="alibi,chunked", help=",".join(CASES))
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pad-mib", type=int, default=512, help="largest padding, MiB")
    compare.add_flexjit_option(ap)
    a = ap.parse_args()
    import torch

    fj = compare.flexjit_package_or_exit(a.flexjit, "spread.py")
    random.seed(a.seed)
    for name in a.cases.split(","):
        case = CASES[name]
        spec = fj.Spec(os.path.join(compare.REPO, "examples", case[0]))
        warmup, rep = (50, 300) if case[6] else (25, 100)
        times = []
        print("%s (%s, B=%d Hq=%d Hkv=%d Lq=%d Lk=%d, %s):" % (
            name, case[0], *case[1:6], "forward+backward" if case[6] else "forward"))
        for i in range(a.trials):
            pad = random.randrange(a.pad_mib + 1)
            ms, ptrs = trial(fj, spec, case, pad, warmup, rep)
            times.append(ms)
            print("  trial %d  pad %4d MiB  %.4f ms  %s" % (
                i, pad, ms, "  ".join("%s %#x" % kv for kv in ptrs.items())), flush=True)
            torch.cuda.empty_cache()
        times.sort()
        print("  min %.4f  median %.4f  max %.4f  spread %.1f%%" % (
            times[0], times[len(times) // 2], times[-1], 100 * (times[-1] / times[0] - 1)))


if __name__ == "__main__":
    main()
