#!/usr/bin/env python3
"""Side-by-side forward benchmark: flexjit vs FlexAttention vs PyTorch SDPA.

Runs on the GPU machine (PyTorch with CUDA, Triton). For each case, one
after another in one run: draws q, k, v (bf16, seed 0) with torch, times
PyTorch SDPA (flash and cuDNN backends, where the case is expressible) and
compiled FlexAttention with triton.testing.do_bench(warmup=25, rep=100,
return_mode="median") in this process, then writes the same q, k, v (and
the same document ids) as .npy files and times `flexjit run SPEC --bench
--inputs DIR` as a subprocess, --repeat times (2 by default: the same
kernel measures up to 7% apart from one process to the next, so the table
gives the median process, the slower of two, and the range). Every side is
timed by the same rules: `flexjit run --bench` follows do_bench's (a
256 MiB L2 flush before each timed launch, counts from a 5-launch estimate
and the 25 ms / 100 ms budgets, no synchronization between launches, the
median); docs/benchmarking.md has the details. The GPU's clocks, power,
temperature and clock-event reasons (nvidia-smi) are sampled before the
case, after the PyTorch timings and after flexjit's, so a throttled run
shows. Prints a markdown table and writes $OUT/compare.json.

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
import shutil
import struct
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_RE = re.compile(r"bench: ([0-9.]+) ms median of ([0-9]+) launches")
# The line before it: the rules it was timed by and the counts.
METHOD_RE = re.compile(r"bench +(triton do_bench rules: .*)")
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


def write_inputs(directory, q, k, v):
    """q, k, v as float32 .npy files [B, H, S, D] for `flexjit run --inputs`
    (bf16 values are exact in float32). False when numpy is missing."""
    try:
        import numpy as np
    except ImportError:
        return False
    os.makedirs(directory, exist_ok=True)
    for name, t in (("q", q), ("k", k), ("v", v)):
        np.save(os.path.join(directory, name + ".npy"),
                t.float().cpu().numpy())
    return True


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


# ---- GPU state ---------------------------------------------------------------

SMI_FIELDS = ["clocks.sm", "clocks.max.sm", "clocks.mem", "power.draw",
              "power.limit", "temperature.gpu", "utilization.gpu"]
# Why the clocks are held down; older drivers name the field
# clocks_throttle_reasons.active.
REASON_FIELDS = ["clocks_event_reasons.active",
                 "clocks_throttle_reasons.active"]
# Bits of that mask (nvml's nvmlClocksEventReason*).
REASON_BITS = [(0x1, "idle"), (0x2, "applications clocks"),
               (0x4, "sw power cap"), (0x8, "hw slowdown"),
               (0x10, "sync boost"), (0x20, "sw thermal"),
               (0x40, "hw thermal"), (0x80, "hw power brake"),
               (0x100, "display clocks")]
_SMI = {"fields": None, "broken": False}


def _smi_cmd(fields, extra=()):
    gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    return (["nvidia-smi", "-i", gpu, "--query-gpu=" + ",".join(fields),
             "--format=csv,noheader,nounits"] + list(extra))


def _smi_parse(fields, line):
    """One nvidia-smi csv line as a dict (keys with '_' for '.', reasons
    as a list of names), or None when it does not fit the fields."""
    values = [x.strip() for x in line.split(",")]
    if len(values) != len(fields):
        return None
    state = {}
    for f, x in zip(fields, values):
        key = "reasons" if f in REASON_FIELDS else f.replace(".", "_")
        try:
            state[key] = int(x, 16) if key == "reasons" else float(x)
        except ValueError:
            state[key] = x  # "[N/A]" and the like, as printed
    if isinstance(state.get("reasons"), int):
        state["reasons"] = [n for bit, n in REASON_BITS
                            if state["reasons"] & bit]
    return state


def gpu_state():
    """One nvidia-smi sample of the GPU the run uses (the first of
    CUDA_VISIBLE_DEVICES, else 0): SM and memory clocks (MHz), the SM
    clock's maximum, power draw and limit (W), temperature (C), utilization
    (%) and why the clocks are held down. None without nvidia-smi."""
    if _SMI["broken"] or not shutil.which("nvidia-smi"):
        return None
    choices = ([_SMI["fields"]] if _SMI["fields"] else
               [SMI_FIELDS + [r] for r in REASON_FIELDS] + [SMI_FIELDS])
    for fields in choices:
        try:
            p = subprocess.run(_smi_cmd(fields), capture_output=True,
                               text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            break
        st = (_smi_parse(fields, p.stdout.strip().split("\n")[0])
              if p.returncode == 0 else None)
        if st:
            _SMI["fields"] = fields
            st["time"] = round(time.time(), 1)
            return st
    _SMI["broken"] = True
    return None


class GpuMonitor:
    """nvidia-smi sampling every 100 ms while a phase runs (PyTorch's
    timings, flexjit's processes); stop() sums up the busy samples
    (utilization > 0): SM clock min/median/max, power and temperature
    maxima, every clock-event reason seen. Sampling costs the GPU nothing
    measurable (NVML reads counters)."""

    def __init__(self):
        self.proc = None
        if gpu_state() is None:  # also picks the fields this driver knows
            return
        try:
            self.proc = subprocess.Popen(
                _smi_cmd(_SMI["fields"], ["-lms", "100"]),
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.proc = None

    def stop(self):
        if not self.proc:
            return None
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        rows = [r for r in (_smi_parse(_SMI["fields"], line)
                            for line in out.splitlines()) if r]
        busy = [r for r in rows if isinstance(r.get("utilization_gpu"), float)
                and r["utilization_gpu"] > 0]
        summary = {"samples": len(rows), "busy_samples": len(busy)}
        clocks = sorted(r["clocks_sm"] for r in busy
                        if isinstance(r.get("clocks_sm"), float))
        if clocks:
            summary["sm_mhz"] = [clocks[0], clocks[len(clocks) // 2],
                                 clocks[-1]]
        for key, name in (("power_draw", "power_w_max"),
                          ("temperature_gpu", "temp_c_max")):
            xs = [r[key] for r in busy if isinstance(r.get(key), float)]
            if xs:
                summary[name] = max(xs)
        reasons = set()
        for r in busy:
            if isinstance(r.get("reasons"), list):
                reasons.update(x for x in r["reasons"] if x != "idle")
        summary["reasons"] = sorted(reasons)
        return summary


def describe_phase(m):
    """'SM 1755-1980 MHz (median 1980), <= 690 W, <= 61 C, sw power cap'."""
    if not m or not m.get("busy_samples"):
        return "-"
    text = ""
    if "sm_mhz" in m:
        lo, med, hi = m["sm_mhz"]
        text = "SM %.0f-%.0f MHz (median %.0f)" % (lo, hi, med)
    if "power_w_max" in m:
        text += ", <= %.0f W" % m["power_w_max"]
    if "temp_c_max" in m:
        text += ", <= %.0f C" % m["temp_c_max"]
    return text + (", " + ", ".join(m["reasons"]) if m["reasons"] else "")


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


def make_qkv(B, H, S, D):
    """The case's inputs, for every implementation: standard normal bf16,
    seed 0."""
    import torch

    torch.manual_seed(0)
    return [torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
            for _ in range(3)]


def time_torch(q, k, v, desc, doc, warmup_ms, rep_ms):
    """FlexAttention and SDPA on q, k, v, each by do_bench (median)."""
    import torch
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask
    import torch.nn.functional as F

    res = {}
    H, S = q.shape[1], q.shape[2]
    mask_fn, score_mod = torch_mods(desc, H, doc)
    bench = lambda f: triton.testing.do_bench(f, warmup=warmup_ms, rep=rep_ms,
                                              return_mode="median")
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
    return res


# ---- flexjit side ----------------------------------------------------------


def run_flexjit(binary, spec, B, H, S, D, extra, budgets, timeout,
                template=None):
    """One `flexjit run --bench` with do_bench's budgets (warmup_ms,
    rep_ms); extra carries --inputs when the inputs are shared; template
    (FLEXJIT_TEMPLATE) None = default."""
    cmd = [binary, "run", spec, "--batch", str(B), "--heads", str(H),
           "--q-len", str(S), "--head-dim", str(D), "--dtype", "bf16",
           "--bench", "--warmup-ms", "%g" % budgets[0],
           "--rep-ms", "%g" % budgets[1]] + extra
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
    res["flexjit_launches"] = int(m.group(2))
    how = METHOD_RE.search(p.stdout)
    if how:
        res["flexjit_method"] = how.group(1).strip()
    t = TFLOPS_RE.search(p.stdout[m.start():])
    if t:
        res["flexjit_own_tflops"] = float(t.group(1))
    b = BM_BUILD_RE.search(p.stdout)
    if b:
        res["flexjit_block_mask_build_ms"] = float(b.group(1))
    return res


def run_flexjit_repeated(binary, spec, B, H, S, D, extra, budgets, timeout,
                         repeat):
    """run_flexjit in `repeat` processes: the median process's result (of an
    even count, the slower middle one), with every process's time in
    flexjit_ms_all. The first failure is returned as it is."""
    runs = []
    for _ in range(max(1, repeat)):
        r = run_flexjit(binary, spec, B, H, S, D, extra, budgets, timeout)
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
    ap.add_argument("--warmup-ms", type=float, default=25,
                    help="do_bench's warmup budget, for every column "
                    "(default 25)")
    ap.add_argument("--rep-ms", type=float, default=100,
                    help="do_bench's rep budget, for every column "
                    "(default 100)")
    ap.add_argument("--repeat", type=int, default=2,
                    help="flexjit processes per case; the median (the slower "
                    "of two) is reported, with the range")
    ap.add_argument("--quick", action="store_true",
                    help="2x2048, three cases")
    ap.add_argument("--only", choices=["all", "flexjit"], default="all",
                    help="flexjit: skip the PyTorch baselines")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--cases", default="",
                    help="comma-separated substrings: run only the cases "
                    "whose name contains one (e.g. 'D=64,document')")
    ap.add_argument("--also-sm80", action="store_true",
                    help="also time flexjit with FLEXJIT_TEMPLATE=sm80")
    args = ap.parse_args()
    if not (args.warmup_ms > 0 and args.rep_ms > 0):
        ap.error("--warmup-ms and --rep-ms must be positive")
    budgets = (args.warmup_ms, args.rep_ms)

    shapes = [tuple(int(x) for x in s.split("x"))
              for s in args.shapes.split(",")]
    if args.quick:
        shapes = [(2, 2048)]
    out_dir = os.environ.get("OUT", ".")
    work = tempfile.mkdtemp(prefix="flexjit-compare-")
    try:
        return compare(args, shapes, budgets, out_dir, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def compare(args, shapes, budgets, out_dir, work):
    try:
        import torch
        have_torch = torch.cuda.is_available()
    except ImportError:
        have_torch = False
    if have_torch:
        print("torch", torch.__version__, torch.cuda.get_device_name(),
              flush=True)
    skip_torch = args.only == "flexjit" or not have_torch
    print("method: every column by triton.testing.do_bench's rules "
          "(warmup %g ms, rep %g ms, 256 MiB L2 flush before each timed "
          "launch, median); flexjit by `flexjit run --bench`, the same rules "
          "in C; docs/benchmarking.md" % budgets, flush=True)

    rows = []
    wanted = [w.strip() for w in args.cases.split(",") if w.strip()]
    cases = [c for c in make_cases(shapes, args.quick)
             if not wanted or any(w in c[0] for w in wanted)]
    if not cases:
        print("no case matches --cases %r" % args.cases, file=sys.stderr)
        return 2
    inputs = os.path.join(work, "inputs")
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
        res = {"case": name, "B": B, "H": H, "S": S, "D": D,
               "gpu_before": gpu_state()}
        shared = False
        if have_torch:
            res["pairs"] = allowed_pairs(torch_mods(desc, H, doc)[0], S)
            q, k, v = make_qkv(B, H, S, D)
            shared = write_inputs(inputs, q, k, v)
            if not skip_torch:
                mon = GpuMonitor()
                res.update(time_torch(q, k, v, desc, doc, *budgets))
                res["gpu_torch"] = mon.stop()
            del q, k, v
            torch.cuda.empty_cache()
        res["inputs"] = ("shared (torch, seed 0)" if shared
                         else "flexjit's own draw (no torch or numpy)")
        if shared:
            extra += ["--inputs", inputs]
        mon = GpuMonitor()
        res.update(run_flexjit_repeated(args.flexjit, spec_path, B, H, S, D,
                                        extra, budgets, args.timeout,
                                        args.repeat))
        if args.also_sm80:
            alt = run_flexjit(args.flexjit, spec_path, B, H, S, D, extra,
                              budgets, args.timeout, template="sm80")
            res.update({k.replace("flexjit", "sm80"): v
                        for k, v in alt.items()})
        res["gpu_flexjit"] = mon.stop()
        shutil.rmtree(inputs, ignore_errors=True)
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

    if any(r.get("gpu_flexjit") for r in rows):
        print()
        print("GPU while busy (nvidia-smi every 100 ms: SM clock range, peak "
              "power and temperature, clock-event reasons): PyTorch | "
              "flexjit")
        for r in rows:
            print("  %s, %d x %d: %s | %s" % (
                r["case"], r["B"], r["S"], describe_phase(r.get("gpu_torch")),
                describe_phase(r.get("gpu_flexjit"))))
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
        print("flexjit block-mask build (GPU, median, do_bench's rules; "
              "FlexAttention's eager create_block_mask: see "
              "../shared/anchors):")
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
