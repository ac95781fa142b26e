#!/usr/bin/env python3
"""Host time per call of the Python package (issue 22's budget: Python's part,
op dispatch + DLPack structs + ctypes, under 20 us a call).

Run on the GPU machine, with the package installed (pip install .):

    python3 bench/python_overhead.py            # B=1 H=1 L=128 D=64, bf16
    python3 bench/python_overhead.py --iters 20000 --spec examples/sliding_window.lua

Each row times N back-to-back calls on tiny tensors (the kernel takes a few
microseconds, less than a call's host time, so the GPU never holds the host
back; the kernel's own time is printed to show it) and divides by N:

  C floor           fj_attention_forward through ctypes with its argument
                    structs built once: the library's own host time (tensor
                    checks, parameter packing, cuLaunchKernel) plus one
                    ctypes call
  attention         flexjit.attention, no gradient (the eager path: the op's
                    implementation without the dispatcher; output and LSE
                    allocated by torch)
  attention, grad   inputs that require grad: the same under an
                    autograd.Function
  op (dispatcher)   torch.ops.flexjit.attention_fwd, the custom op as a
                    compiled graph (without CUDA graphs) calls it
  fwd+bwd           attention and backward on a random dO, per step; its C
                    floor is fj_attention_forward + fj_attention_backward
  SDPA              torch's scaled_dot_product_attention on the same
                    tensors, a native op's host time, for scale

Python overhead = row - its C floor. The script ends with PASS or FAIL for
the eager forward (attention - C floor < 20 us).
"""
import argparse
import ctypes
import os
import sys
import time

import torch

import flexjit
from flexjit import _torch as fjt
from flexjit._lib import lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def per_call_us(fn, iters):
    for _ in range(max(50, iters // 20)):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / iters * 1e6


def kernel_us(fn, iters=200):
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=10000)
    ap.add_argument("--spec", default=os.path.join(REPO, "examples", "causal.lua"))
    ap.add_argument("--shape", default="1,1,128,64", help="B,H,L,D")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("python_overhead.py needs a CUDA device")
    B, H, L, D = (int(x) for x in args.shape.split(","))
    spec = flexjit.Spec(args.spec)
    params = {a.name: 64 for a in spec.args if a.kind == "i32"}
    params.update({a.name: 1.0 for a in spec.args if a.kind == "f32"})
    buffers = {a.name: (torch.zeros(L, dtype=torch.int32, device="cuda") if a.dtype == "int32"
                        else torch.zeros(max(L, 4096), device="cuda"))
               for a in spec.args if a.kind == "buffer"}
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    core = spec._core
    ints, floats, bufs = core.values(params, buffers)

    # The C floor: the cached launch structs of the eager path, relaunched.
    o, lse = flexjit.attention(q, k, v, spec, params=params, buffers=buffers,
                               return_lse=True)
    ctx = fjt._context(q)
    launch = next(iter(ctx.forward_launches.values()))
    launch.a.stream = fjt._stream(q)
    handle, ctx_ptr, addr = core.handle(ctx), ctx.ptr, launch.addr
    fwd = lib.fj_attention_forward

    def c_floor():
        fwd(ctx_ptr, handle, addr)

    rows = []
    rows.append(("C floor", per_call_us(c_floor, args.iters)))
    rows.append(("attention", per_call_us(
        lambda: flexjit.attention(q, k, v, spec, params=params, buffers=buffers), args.iters)))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    rows.append(("attention, grad", per_call_us(
        lambda: flexjit.attention(qg, kg, vg, spec, params=params, buffers=buffers),
        args.iters)))
    op = torch.ops.flexjit.attention_fwd.default
    rows.append(("op (dispatcher)", per_call_us(
        lambda: op(q, k, v, core.id, 0.0, ints, floats, bufs, [], [], *fjt.NO_SERVING),
        args.iters)))

    dout = torch.randn_like(q)

    def step():
        flexjit.attention(qg, kg, vg, spec, params=params, buffers=buffers).backward(dout)
    step()
    blaunch = next(iter(ctx.backward_launches.values()))
    blaunch.a.stream = fjt._stream(q)
    bwd, baddr = lib.fj_attention_backward, blaunch.addr

    def c_step():
        fwd(ctx_ptr, handle, addr)
        bwd(ctx_ptr, handle, baddr)
    bw_iters = max(1000, args.iters // 5)
    rows.append(("C floor fwd+bwd", per_call_us(c_step, bw_iters)))
    rows.append(("fwd+bwd", per_call_us(step, bw_iters)))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    rows.append(("SDPA (native op)", per_call_us(lambda: sdpa(q, k, v, is_causal=True),
                                                 args.iters)))

    print(f"torch {torch.__version__}, flexjit {flexjit.__version__}, "
          f"{torch.cuda.get_device_name()}, spec {spec.name}, "
          f"B={B} H={H} L={L} D={D} bf16, {args.iters} calls a row")
    print(f"kernel time: forward {kernel_us(c_floor):.1f} us, "
          f"forward+backward {kernel_us(c_step):.1f} us (GPU, for scale)")
    print(f"{'':18s} {'us/call':>8s} {'Python':>8s}")
    floor = dict(rows)
    for name, us in rows:
        base = floor["C floor fwd+bwd"] if name == "fwd+bwd" else floor["C floor"]
        extra = "" if name.startswith(("C floor", "SDPA")) else f"{us - base:8.1f}"
        print(f"{name:18s} {us:8.1f} {extra}")
    overhead = floor["attention"] - floor["C floor"]
    print(f"{'PASS' if overhead < 20 else 'FAIL'}: eager forward Python overhead "
          f"{overhead:.1f} us (budget 20 us)")


if __name__ == "__main__":
    main()
