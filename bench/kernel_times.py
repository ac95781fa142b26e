#!/usr/bin/env python3
"""Forward+backward kernel by kernel: flexjit (the Python package) against
SDPA cuDNN, from PyTorch's profiler (CUPTI's kernel durations).

For each shape, causal or not, runs output = attention(q, k, v) and
output.backward(dO) three times to warm up, then `--iters` times under the
profiler, and prints each kernel's mean time an iteration (flexjit's pre,
main and post backward kernels and its forward; cuDNN's counterparts),
back-to-back launches with no L2 flush: where the time goes, not the
side-by-side figure (bench/compare.py gives that). Runs on the GPU machine:

    python3 bench/kernel_times.py [--flexjit build/flexjit] \\
        [--shapes 8x4096,2x16384] [--causal both|yes|no] [--iters 5]

The package is found as compare.py finds it (flexjit_package): an installed
copy, else this checkout's python/ with the libflexjit.so beside --flexjit's
binary, unless FLEXJIT_LIBRARY names one.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (flexjit_package, the package's lookup)

H, D = 16, 128


def kernel_times(f, q, k, v, do, iters):
    """{kernel name: (mean ms an iteration, launches an iteration)}."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        f(q, k, v).backward(do)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            q.grad = k.grad = v.grad = None
            f(q, k, v).backward(do)
        torch.cuda.synchronize()
    tot = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            t = tot.setdefault(e.name, [0.0, 0])
            t[0] += e.device_time
            t[1] += 1
    return {n: (us / iters / 1000, c / iters) for n, (us, c) in tot.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="8x4096,2x16384", help="BxS,... (H=16, D=128)")
    ap.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    ap.add_argument("--iters", type=int, default=5)
    compare.add_flexjit_option(ap)
    a = ap.parse_args()
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    flexjit = compare.flexjit_package_or_exit(a.flexjit, "kernel_times.py")
    examples = os.path.join(compare.REPO, "examples")
    kinds = {"both": (False, True), "yes": (True,), "no": (False,)}[a.causal]
    print("L2 %d MiB" % (torch.cuda.get_device_properties(0).L2_cache_size >> 20))
    for shape in a.shapes.split(","):
        B, S = (int(x) for x in shape.split("x"))
        for causal in kinds:
            q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
                           for _ in range(4))
            for t in (q, k, v):
                t.requires_grad_(True)
            spec = flexjit.Spec(os.path.join(examples, "causal.lua" if causal else "full.lua"))

            def sdpa(q, k, v):
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

            for name, f in (("flexjit", lambda q, k, v: flexjit.attention(q, k, v, spec)),
                            ("cudnn", sdpa)):
                times = kernel_times(f, q, k, v, do, a.iters)
                print("== %s %dx%d %s" % (name, B, S, "causal" if causal else "full"))
                for n, (ms, c) in sorted(times.items(), key=lambda x: -x[1][0]):
                    print("  %8.3f ms  x%g  %s" % (ms, c, n[:100]))
                print("  %8.3f ms  total" % sum(ms for ms, _ in times.values()))


if __name__ == "__main__":
    main()
