#!/usr/bin/env python3
"""Side-by-side forward benchmark: flexjit vs FlexAttention vs PyTorch SDPA.

Runs on the GPU machine (PyTorch with CUDA, Triton). For each case it times
PyTorch SDPA (flash and cuDNN backends, where the case is expressible),
compiled FlexAttention (triton.testing.do_bench, median), and
`flexjit run SPEC --bench` as a subprocess (--repeat times, 2 by default:
the same kernel measures up to 7% apart from one process to the next, so
the table gives the median process, the slower of two, and the range), then
prints a markdown table and writes $OUT/compare.json.

FLOPs count only allowed (q, kv) pairs: 4 * B * H * D * pairs, for every
implementation alike (the convention of ../shared/anchors).

    python3 bench/compare.py                 # the full set
    python3 bench/compare.py --quick         # small shapes, three cases
    python3 bench/compare.py --only flexjit  # skip the PyTorch baselines
"""
import argparse
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_RE = re.compile(r"bench: ([0-9.]+) ms median")
TFLOPS_RE = re.compile(r"([0-9.]+) TFLOP/s")
# Printed by `flexjit run --bench` when it launched with a block mask.
BM_BUILD_RE = re.compile(r"block-mask build: ([0-9.]+) ms median")

# ---- cases -------------------------------------------------------------


def document_ids(S):
    """Document id per position for a packed sequence of length S: up to 64
    documents of S/16 .. S/2 tokens drawn with seed 1 (the anchors' doc)."""
    import torch

    torch.manual_seed(1)
    lengths = torch.randint(S // 16, S // 2, (64,))
    starts = torch.cumsum(lengths, 0)
    starts = starts[starts < S]
    marks = torch.zeros(S, dtype=torch.int32)
    marks[starts] = 1
    return torch.cumsum(marks, 0).to(torch.int32)


def write_npy_i32(path, values):
    """A 1-D int32 .npy (format 1.0) without needing numpy."""
    n = len(values)
    header = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }" % n
    pad = (64 - (10 + len(header) + 1) % 64) % 64
    header = header + " " * pad + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)))
        f.write(header.encode("latin1"))
        f.write(struct.pack("<%di" % n, *values))


def make_cases(shapes, quick):
    """(name, B, H, S, D, spec file, flexjit extra args, torch description)."""
    cases = []
    for B, S in shapes:
        base = [
            ("full", "full.lua", [], {"sdpa": "full"}),
            ("causal", "causal.lua", [], {"mask": "causal", "sdpa": "causal"}),
            ("sliding window 1024", "sliding_window.lua",
             ["--param", "window=1024"], {"mask": "sliding", "window": 1024}),
            ("document", "document.lua", ["--buffer", "doc={doc}"],
             {"mask": "document"}),
            ("prefix-LM 1024", "prefix_lm.lua", ["--param", "prefix=1024"],
             {"mask": "prefix", "prefix": 1024}),
            ("ALiBi + causal", "alibi.lua", [],
             {"mask": "causal", "score": "alibi"}),
            ("softcap 30 + causal", "softcap.lua", [],
             {"mask": "causal", "score": "softcap", "cap": 30.0}),
        ]
        if quick:
            base = [c for c in base if c[0] in ("causal", "document",
                                                 "ALiBi + causal")]
        for name, spec, extra, desc in base:
            cases.append((name, B, 16, S, 128, spec, extra, desc))
    if not quick:
        cases.append(("causal, D=64, H=32", 8, 32, 4096, 64, "causal.lua", [],
                      {"mask": "causal", "sdpa": "causal"}))
        cases.append(("causal, D=256, H=8", 8, 8, 4096, 256, "causal.lua", [],
                      {"mask": "causal", "sdpa": "causal"}))
        cases.append(("full, D=256, H=8", 8, 8, 4096, 256, "full.lua", [],
                      {"sdpa": "full"}))
    return cases


# ---- torch side ----------------------------------------------------------


def torch_mods(desc, H, doc):
    import torch

    mask = desc.get("mask")
    if mask == "causal":
        mask_fn = lambda b, h, q, kv: q >= kv
    elif mask == "sliding":
        w = desc["window"]
        mask_fn = lambda b, h, q, kv: (q >= kv) & (q - kv < w)
    elif mask == "prefix":
        p = desc["prefix"]
        mask_fn = lambda b, h, q, kv: (q >= kv) | (kv < p)
    elif mask == "document":
        mask_fn = lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv)
    else:
        mask_fn = None
    score = desc.get("score")
    if score == "alibi":
        slopes = torch.exp2(-8.0 * torch.arange(1, H + 1, device="cuda") / H)
        score_mod = lambda s, b, h, q, kv: s + slopes[h] * (kv - q)
    elif score == "softcap":
        c = desc["cap"]
        score_mod = lambda s, b, h, q, kv: c * torch.tanh(s / c)
    else:
        score_mod = None
    return mask_fn, score_mod


def allowed_pairs(mask_fn, S):
    """Exact count of allowed (q, kv) pairs, a block of rows at a time."""
    import torch

    if mask_fn is None:
        return S * S
    kv = torch.arange(S, device="cuda")[None, :]
    total = 0
    for r0 in range(0, S, 1024):
        q = torch.arange(r0, min(S, r0 + 1024), device="cuda")[:, None]
        total += int(mask_fn(0, 0, q, kv).sum().item())
    return total


_FLEX = None


def compiled_flex():
    """One compiled flex_attention for every case. Each mask and score_mod
    recompiles it; dynamo's default limit (8) would silently fall back to the
    unfused eager path after a few cases, so the limits are raised."""
    global _FLEX
    if _FLEX is None:
        import torch
        import torch._dynamo
        from torch.nn.attention.flex_attention import flex_attention
        torch._dynamo.config.recompile_limit = 256
        torch._dynamo.config.cache_size_limit = 256
        _FLEX = torch.compile(flex_attention, dynamic=False)
    return _FLEX


def time_torch(name, B, H, S, D, desc, doc, skip_torch):
    import torch
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import (create_block_mask,
                                                   flex_attention)
    import torch.nn.functional as F

    res = {}
    mask_fn, score_mod = torch_mods(desc, H, doc)
    res["pairs"] = allowed_pairs(mask_fn, S)
    if skip_torch:
        return res
    bench = lambda f: triton.testing.do_bench(f, warmup=25, rep=100,
                                              return_mode="median")
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    flex = compiled_flex()
    bm = (create_block_mask(mask_fn, None, None, S, S, device="cuda")
          if mask_fn else None)
    try:
        flex(q, k, v, score_mod=score_mod, block_mask=bm)
        res["flex_ms"] = bench(lambda: flex(q, k, v, score_mod=score_mod,
                                            block_mask=bm))
    except Exception as e:  # report, keep going
        res["flex_err"] = str(e)[:200]
    kind = desc.get("sdpa")
    if kind and not desc.get("score"):
        for key, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                             ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                with sdpa_kernel([backend]):
                    f = lambda: F.scaled_dot_product_attention(
                        q, k, v, is_causal=(kind == "causal"))
                    f()
                    torch.cuda.synchronize()
                    res[key + "_ms"] = bench(f)
            except Exception as e:
                res[key + "_err"] = str(e)[:200]
    del q, k, v
    torch.cuda.empty_cache()
    return res


# ---- flexjit side ----------------------------------------------------------


def run_flexjit(binary, spec, B, H, S, D, extra, iters, timeout,
                template=None):
    """One `flexjit run --bench`; template (FLEXJIT_TEMPLATE) None = default."""
    cmd = [binary, "run", spec, "--batch", str(B), "--heads", str(H),
           "--q-len", str(S), "--head-dim", str(D), "--dtype", "bf16",
           "--bench", "--iters", str(iters)] + extra
    env = dict(os.environ)
    env.pop("FLEXJIT_TEMPLATE", None)
    if template:
        env["FLEXJIT_TEMPLATE"] = template
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True,
                           timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"flexjit_err": "timeout", "flexjit_cmd": " ".join(cmd)}
    res = {"flexjit_cmd": " ".join(cmd),
           "flexjit_wall_s": round(time.time() - t0, 2)}
    m = BENCH_RE.search(p.stdout)
    if p.returncode != 0 or not m:
        res["flexjit_err"] = (p.stderr.strip() or p.stdout.strip())[-400:]
        return res
    res["flexjit_ms"] = float(m.group(1))
    t = TFLOPS_RE.search(p.stdout[m.start():])
    if t:
        res["flexjit_own_tflops"] = float(t.group(1))
    b = BM_BUILD_RE.search(p.stdout)
    if b:
        res["flexjit_block_mask_build_ms"] = float(b.group(1))
    return res


def run_flexjit_repeated(binary, spec, B, H, S, D, extra, iters, timeout,
                         repeat):
    """run_flexjit in `repeat` processes: the median process's result (of an
    even count, the slower middle one), with every process's time in
    flexjit_ms_all. The first failure is returned as it is."""
    runs = []
    for _ in range(max(1, repeat)):
        r = run_flexjit(binary, spec, B, H, S, D, extra, iters, timeout)
        if "flexjit_err" in r:
            return r
        runs.append(r)
    runs.sort(key=lambda r: r["flexjit_ms"])
    res = dict(runs[len(runs) // 2])
    res["flexjit_ms_all"] = [r["flexjit_ms"] for r in runs]
    return res


# ---- report ----------------------------------------------------------------


def tflops(res, key, B, H, D):
    ms = res.get(key)
    if not ms or "pairs" not in res:
        return None
    return 4.0 * B * H * D * res["pairs"] / (ms * 1e-3) / 1e12


def fmt(x):
    return "-" if x is None else "%.1f" % x


def ratio(a, b):
    return "-" if a is None or b is None or b == 0 else "%.2f" % (a / b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flexjit", default=os.path.join(REPO, "build",
                                                      "flexjit"))
    ap.add_argument("--examples", default=os.path.join(REPO, "examples"))
    ap.add_argument("--shapes", default="8x4096,2x16384",
                    help="B x S list, e.g. 8x4096,2x16384")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=2,
                    help="flexjit processes per case; the median (the slower "
                    "of two) is reported, with the range")
    ap.add_argument("--quick", action="store_true",
                    help="2x2048, three cases, 10 iterations")
    ap.add_argument("--only", choices=["all", "flexjit"], default="all",
                    help="flexjit: skip the PyTorch baselines")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--cases", default="",
                    help="comma-separated substrings: run only the cases "
                    "whose name contains one (e.g. 'D=64,document')")
    ap.add_argument("--also-sm80", action="store_true",
                    help="also time flexjit with FLEXJIT_TEMPLATE=sm80")
    args = ap.parse_args()

    shapes = [tuple(int(x) for x in s.split("x"))
              for s in args.shapes.split(",")]
    if args.quick:
        shapes, args.iters = [(2, 2048)], min(args.iters, 10)
    out_dir = os.environ.get("OUT", ".")
    work = tempfile.mkdtemp(prefix="flexjit-compare-")

    try:
        import torch
        have_torch = torch.cuda.is_available()
    except ImportError:
        have_torch = False
    if have_torch:
        print("torch", torch.__version__, torch.cuda.get_device_name(),
              flush=True)
    skip_torch = args.only == "flexjit" or not have_torch

    rows = []
    wanted = [w.strip() for w in args.cases.split(",") if w.strip()]
    cases = [c for c in make_cases(shapes, args.quick)
             if not wanted or any(w in c[0] for w in wanted)]
    if not cases:
        print("no case matches --cases %r" % args.cases, file=sys.stderr)
        return 2
    for name, B, H, S, D, spec, extra, desc in cases:
        doc = None
        extra = list(extra)
        if desc.get("mask") == "document":
            ids = document_ids(S)
            npy = os.path.join(work, "doc_%d.npy" % S)
            write_npy_i32(npy, ids.tolist())
            extra = [e.replace("{doc}", npy) for e in extra]
            if have_torch:
                doc = ids.to("cuda")
        spec_path = os.path.join(args.examples, spec)
        res = {"case": name, "B": B, "H": H, "S": S, "D": D}
        if have_torch:
            res.update(time_torch(name, B, H, S, D, desc, doc, skip_torch))
        res.update(run_flexjit_repeated(args.flexjit, spec_path, B, H, S, D,
                                        extra, args.iters, args.timeout,
                                        args.repeat))
        if args.also_sm80:
            alt = run_flexjit(args.flexjit, spec_path, B, H, S, D, extra,
                              args.iters, args.timeout, template="sm80")
            res.update({k.replace("flexjit", "sm80"): v
                        for k, v in alt.items()})
        for key in ("flexjit", "sm80", "flex", "flash", "cudnn"):
            t = tflops(res, key + "_ms", B, H, D)
            if t is None and key == "flexjit":
                t = res.get("flexjit_own_tflops")  # no torch: its own count
            res[key + "_tflops"] = None if t is None else round(t, 1)
        if "flexjit_ms_all" in res and "pairs" in res:
            res["flexjit_tflops_range"] = [
                round(4.0 * B * H * D * res["pairs"] / (ms * 1e-3) / 1e12, 1)
                for ms in (max(res["flexjit_ms_all"]),
                           min(res["flexjit_ms_all"]))]
        rows.append(res)
        print(json.dumps(res), flush=True)

    print()
    print("| case | B x S | flexjit TFLOP/s | flexjit range | flexjit sm80 | "
          "FlexAttention | SDPA flash | SDPA cuDNN | flexjit / Flex | "
          "flexjit / cuDNN |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        fj, fl = r["flexjit_tflops"], r["flex_tflops"]
        fa, cu = r["flash_tflops"], r["cudnn_tflops"]
        label = r["case"] + (" (err)" if "flexjit_err" in r else "")
        rng = r.get("flexjit_tflops_range")
        rng = "-" if not rng else "%.1f-%.1f" % tuple(rng)
        print("| %s | %d x %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            label, r["B"], r["S"], fmt(fj), rng, fmt(r.get("sm80_tflops")),
            fmt(fl), fmt(fa), fmt(cu), ratio(fj, fl), ratio(fj, cu)))
    built = [r for r in rows if "flexjit_block_mask_build_ms" in r]
    if built:
        print()
        print("flexjit block-mask build (GPU, median; FlexAttention's eager "
              "create_block_mask: see ../shared/anchors):")
        for r in built:
            print("  %s, %d x %d: %.4f ms" % (r["case"], r["S"], r["S"],
                                            r["flexjit_block_mask_build_ms"]))
    errs = [r for r in rows if "flexjit_err" in r]
    for r in errs:
        print("\nflexjit failed on %s: %s" % (r["case"], r["flexjit_err"]),
              file=sys.stderr)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "compare.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
