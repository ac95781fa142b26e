#!/usr/bin/env python3
"""Serving benchmarks (issue 23): flexjit vs PyTorch SDPA and FlexAttention on
decode, paged decode, chunked prefill, varlen and Skip Softmax.

Run as `python3 bench/compare.py --serving [options]` (or this file
directly). The method is compare.py's (docs/benchmarking.md): every PyTorch
column by triton.testing.do_bench (warmup 25 ms, rep 100 ms, median, a
256 MiB L2 flush before each timed call), flexjit by `flexjit run --bench`,
which follows the same rules in C, --repeat processes a variant (the median
process, the slower of two, and the range). Decode and chunked prefill are
also timed in-process (compare.py's fjpy column: flexjit.attention by the
baselines' own do_bench call, in compare.py's rounds), which the ratios to
PyTorch use where it ran;
paged / contiguous compares CLI runs. bf16, D=128, GQA 32/8.

Groups (--cases, comma-separated; default all):
  decode   one query token over B x Lk of KV (64x2048, 16x8192, 4x65536,
           1x131072). TB/s = K and V bytes read / time, bytes = B * Lk * Hkv
           * D * 2 (K and V) * 2 (bf16), for every column alike. Columns:
           flexjit (examples/causal_bottom_right.lua; the runtime picks the
           decode kernel), SDPA flash and cuDNN (enable_gqa=True; where a
           backend refuses it, K and V repeated to Hq heads beforehand,
           outside the timed call, and the row says so), FlexAttention
           (compiled, enable_gqa=True, no block mask: one query sees every
           key), and varlen_attn where this PyTorch has it.
  paged    the decode shapes with K and V in pages of 16 and of 64 tokens,
           shuffled (`flexjit run --page-size P`, the logical K and V of
           the contiguous run through --inputs; flexjit lays out the pools
           and the block table itself, seeded). PyTorch's SDPA and
           FlexAttention have no paged path (FlashAttention's
           flash_attn_with_kvcache is not installed): the baselines are the
           contiguous figures, and the target is paged / contiguous flexjit
           >= 0.95. varlen_attn's paged form is timed where it exists.
  chunked  chunked prefill: 512 new tokens over a 16k cache (Lq=512,
           Lk=16384, causal aligned bottom right), 4 sequences. TFLOP/s =
           4 * B * Hq * D * allowed pairs / time. SDPA takes
           torch.nn.attention.bias.causal_lower_right(Lq, Lk); Flex a block
           mask of kv <= q + Lk - Lq.
  varlen   64 sequences of random lengths (torch seed 4) summing to 32768
           tokens, causal within each: flexjit --varlen LENGTHS.npy (packed
           [total, H, D], cu_seqlens), flexjit's document spec over the same
           tokens as one [1, H, 32768, D] batch with a block mask
           (examples/document.lua), FlexAttention's document mask, and
           varlen_attn where it exists. Same q, k, v values in every column.
  skip     Skip Softmax on long-context decode (1 x 131072) and prefill (1 x
           16384, causal), on standard normal inputs and on peaked ones (a
           few hot keys a query: attention sinks and 1% of the keys, see
           peaked_inputs): flexjit at each --skip-thresholds value and at 0
           (exact), each with --dump; the error is max |o_T - o_0| and the
           relative L2 of o_T - o_0 over the exact run's output (and the
           LSE's max difference). Speed as TB/s (decode) or TFLOP/s (prefill).

Inputs: q, k, v standard normal bf16 from torch (seed 0), written as
float32 .npy for `flexjit run --inputs` (varlen: packed [total, H, D]).
Writes $OUT/compare_serving.json after every case.

    python3 bench/compare.py --serving --cases decode,paged
    python3 bench/compare.py --serving --cases chunked,varlen
    python3 bench/compare.py --serving --cases skip
    python3 bench/compare.py --serving --list     # the plan; no GPU, no torch
"""
import argparse
import functools
import inspect
import json
import os
import re
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare as C  # noqa: E402  (the shared timing, monitoring and I/O)

HQ, HKV, D = 32, 8, 128
DECODE_SHAPES = [(64, 2048), (16, 8192), (4, 65536), (1, 131072)]
PAGE_SIZES = [16, 64]
CHUNKED = (4, 512, 16384)  # B, Lq, Lk
VARLEN = (64, 32768)  # sequences, tokens
SKIP_DECODE = (1, 131072)
SKIP_PREFILL = (1, 16384)
# The skip group's inputs: standard normal q, k, v, where every key is about
# as likely as another (nothing to skip), and "peaked" (peaked_inputs), where
# a few keys a query sees take nearly all its weight, as attention sinks and
# retrieved tokens do in trained models.
SKIP_INPUTS = ["normal", "peaked"]
PEAK_SINKS, PEAK_FRACTION, PEAK_SCORE = 4, 0.01, 12.0
GROUPS = ["decode", "paged", "chunked", "varlen", "skip"]
KV_RE = re.compile(r"bench kv: ([0-9.]+) bytes of K and V .*, ([0-9.]+) TB/s")
SPEC_BR = "causal_bottom_right.lua"


def kv_bytes(B, Lk):
    """K and V bytes a decode step reads: every kv position of every
    sequence, once per KV head, bf16."""
    return B * Lk * HKV * D * 2 * 2


def br_pairs(Lq, Lk):
    """Allowed (q, kv) pairs of one (b, h) with bottom-right causal."""
    return sum(max(0, min(Lk, Lk - Lq + i + 1)) for i in range(Lq))


def varlen_lengths():
    """64 lengths >= 1 summing to 32768: 1 each plus a share of the rest
    proportional to uniform weights (torch seed 4), the remainder one each
    to the first ones."""
    import torch

    n, total = VARLEN
    g = torch.Generator().manual_seed(4)
    w = torch.rand(n, generator=g, dtype=torch.float64) + 0.05
    extra = (w / w.sum() * (total - n)).floor().to(torch.int64)
    lens = extra + 1
    rest = total - int(lens.sum())
    lens[:rest] += 1
    return [int(x) for x in lens]


# ---- plan --------------------------------------------------------------


def plan(groups, thresholds, decode_shapes=None):
    """The cases: dicts with name, group, sizes and the flexjit variants
    (label, extra `flexjit run` options); decode_shapes: the decode and
    paged groups' B x Lk (default DECODE_SHAPES)."""
    cases = []
    if "decode" in groups or "paged" in groups:
        for B, Lk in decode_shapes or DECODE_SHAPES:
            variants = [("contiguous", [])]
            if "paged" in groups:
                variants += [("paged %d" % p, ["--page-size", str(p)])
                             for p in PAGE_SIZES]
            cases.append({"name": "decode", "group": "decode", "B": B,
                          "Lq": 1, "Lk": Lk, "spec": SPEC_BR,
                          "variants": variants})
    if "chunked" in groups:
        B, Lq, Lk = CHUNKED
        cases.append({"name": "chunked prefill", "group": "chunked", "B": B,
                      "Lq": Lq, "Lk": Lk, "spec": SPEC_BR,
                      "variants": [("contiguous", [])]})
    if "varlen" in groups:
        n, T = VARLEN
        cases.append({"name": "varlen", "group": "varlen", "B": 1, "Lq": T,
                      "Lk": T, "spec": "causal.lua",
                      "variants": [("varlen", ["--varlen", "{lens}"]),
                                   ("document batch",
                                    ["--buffer", "doc={doc}"])]})
    if "skip" in groups:
        for name, (B, L), Lq in (("skip decode", SKIP_DECODE, 1),
                                 ("skip prefill", SKIP_PREFILL, None)):
            variants = [("T=%g" % t, ["--skip-softmax", "%g" % t] if t else [])
                        for t in [0.0] + thresholds]
            for inputs in SKIP_INPUTS:
                cases.append({"name": name, "group": "skip", "B": B,
                              "Lq": Lq or L, "Lk": L, "inputs": inputs,
                              "spec": SPEC_BR if Lq else "causal.lua",
                              "variants": variants})
    return cases


def peaked_inputs(q, k, generator):
    """Skip Softmax's peaked inputs, in place: each (sequence, KV head) gets a
    random unit direction u; its query heads' rows get sqrt(D) u added (a
    component that all its queries share), and its first PEAK_SINKS keys and
    a random PEAK_FRACTION of the others PEAK_SCORE u (hot keys): a hot key
    scores about PEAK_SCORE above the others (scores q.k / sqrt(D)), so a kv
    slice without one lies far below a row's running max once one was seen."""
    import torch

    B, Hkv, Lk, Dh = k.shape
    u = torch.randn(B, Hkv, Dh, generator=generator, device="cpu", dtype=torch.float32)
    u = (u / u.norm(dim=-1, keepdim=True)).to(q.device)
    group = q.shape[1] // Hkv
    q += (Dh ** 0.5 * u).repeat_interleave(group, dim=1)[:, :, None, :].to(q.dtype)
    hot = torch.rand(B, Hkv, Lk, generator=generator, device="cpu") < PEAK_FRACTION
    hot[:, :, :PEAK_SINKS] = True
    k += (hot.to(q.device)[..., None] * (PEAK_SCORE * u)[:, :, None, :]).to(k.dtype)
    return float(hot.float().mean())


def flexjit_extra(case, variant_extra):
    """The options after compare.flexjit_cmd's own (batch, heads, q-len,
    head dim, dtype, --bench, budgets)."""
    extra = ["--kv-heads", str(HKV), "--kv-len", str(case["Lk"])]
    return extra + variant_extra


def variant_spec(args, case, label):
    if case["group"] == "varlen" and label == "document batch":
        return os.path.join(args.examples, "document.lua")
    return os.path.join(args.examples, case["spec"])


def list_plan(args, cases, budgets):
    print("serving; do_bench budgets warmup %g ms, rep %g ms; %d flexjit "
          "process(es) a variant" % (budgets[0], budgets[1], args.repeat))
    missing = 0
    for c in cases:
        print("  %s: B=%d Hq=%d Hkv=%d Lq=%d Lk=%d D=%d%s" % (
            c["name"], c["B"], HQ, HKV, c["Lq"], c["Lk"], D,
            ", %s inputs" % c["inputs"] if "inputs" in c else ""))
        for label, extra in c["variants"]:
            spec = variant_spec(args, c, label)
            missing += not os.path.isfile(spec)
            ex = [e.replace("{lens}", "WORK/lens.npy")
                  .replace("{doc}", "WORK/doc.npy")
                  for e in flexjit_extra(c, extra)]
            ex += ["--inputs", "WORK/inputs" +
                   ("_packed" if label == "varlen" else "")]
            if c["group"] == "skip":
                ex += ["--dump", "WORK/dump"]
            print("    %s: %s" % (label, " ".join(C.flexjit_cmd(
                args.flexjit, spec, c["B"], HQ, c["Lq"], D, ex, budgets,
                False))))
    return 1 if missing else 0


# ---- torch side ----------------------------------------------------------


def varlen_attn_fn():
    """torch.nn.attention.varlen.varlen_attn and its parameter names, or
    (None, reason)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except Exception as e:  # not in this PyTorch
        return None, "varlen_attn: %s" % C.short_error(e)
    return varlen_attn, set(inspect.signature(varlen_attn).parameters)


def call_varlen(fn, params, q, k, v, cu_q, cu_k, max_q, max_k, causal,
                seqused_k=None, block_table=None):
    """A call of varlen_attn as this PyTorch spells it: causal as
    window_size=(-1, 0) or is_causal=True; GQA by enable_gqa."""
    kw = {}
    if causal:
        if "window_size" in params:
            kw["window_size"] = (-1, 0)
        else:
            kw["is_causal"] = True
    if "enable_gqa" in params:
        kw["enable_gqa"] = True
    if block_table is not None:
        if "block_table" not in params:
            raise RuntimeError("this varlen_attn has no block_table")
        kw["block_table"], kw["seqused_k"] = block_table, seqused_k
    return lambda: fn(q, k, v, cu_q, cu_k, max_q, max_k, **kw)


def sdpa_columns(res, q, k, v, mask, timer):
    """SDPA flash and cuDNN on [B, H, L, D] tensors: enable_gqa=True, or
    where a backend refuses it, K and V repeated to Hq heads before timing
    (res[<col>_gqa] says which)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rep = None
    for col, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                         ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        within = functools.partial(sdpa_kernel, [backend])
        try:
            timer.add_after_run(col, lambda: F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, enable_gqa=True), within)
            res[col + "_gqa"] = "enable_gqa"
            continue
        except Exception as e:
            first = C.short_error(e)
        try:
            if rep is None:
                g = q.shape[1] // k.shape[1]
                rep = (k.repeat_interleave(g, 1), v.repeat_interleave(g, 1))
            timer.add_after_run(col, lambda: F.scaled_dot_product_attention(
                q, rep[0], rep[1], attn_mask=mask), within)
            res[col + "_gqa"] = "K, V repeated (enable_gqa: %s)" % first
        except Exception as e:
            res[col + "_err"] = "enable_gqa: %s; repeated: %s" % (
                first, C.short_error(e))


def flex_column(res, q, k, v, mask_fn, Lq, Lk, timer, key="flex"):
    from torch.nn.attention.flex_attention import create_block_mask

    flex = C.compiled_flex()
    try:
        bm = (create_block_mask(mask_fn, None, None, Lq, Lk, device="cuda")
              if mask_fn else None)
        timer.add_after_run(key, lambda: flex(q, k, v, block_mask=bm,
                                              enable_gqa=True))
    except Exception as e:
        res[key + "_err"] = C.short_error(e)


def torch_decode(res, case, q, k, v, budgets, rounds, make_fj=None):
    """Contiguous decode (and chunked prefill): SDPA, Flex, varlen_attn, and
    flexjit in-process (make_fj: compare.in_process's), timed in rounds
    (compare.Rounds)."""
    timer = C.Rounds(budgets, rounds)
    torch_decode_columns(res, case, q, k, v, timer, make_fj)
    timer.run(res)


def torch_decode_columns(res, case, q, k, v, timer, make_fj):
    import torch
    from torch.nn.attention.bias import causal_lower_right

    B, Lq, Lk = case["B"], case["Lq"], case["Lk"]
    mask = None if Lq == 1 else causal_lower_right(Lq, Lk)
    sdpa_columns(res, q, k, v, mask, timer)
    shift = Lk - Lq
    mask_fn = None if Lq == 1 else (lambda b, h, qi, kv: kv <= qi + shift)
    flex_column(res, q, k, v, mask_fn, Lq, Lk, timer)
    C.fjpy_column(res, q, k, v, make_fj, timer)
    fn, params = varlen_attn_fn()
    if fn is None:
        res["varlen_err"] = params
        return
    qp = q.transpose(1, 2).reshape(B * Lq, HQ, D)
    kp = k.transpose(1, 2).reshape(B * Lk, HKV, D)
    vp = v.transpose(1, 2).reshape(B * Lk, HKV, D)
    i32 = dict(device="cuda", dtype=torch.int32)
    cu_q = torch.arange(0, B + 1, **i32) * Lq
    cu_k = torch.arange(0, B + 1, **i32) * Lk
    try:
        timer.add_after_run("varlen", call_varlen(fn, params, qp, kp, vp, cu_q,
                                                  cu_k, Lq, Lk, Lq > 1))
    except Exception as e:
        res["varlen_err"] = C.short_error(e)
    if "paged" not in [lbl.split()[0] for lbl, _ in case["variants"]]:
        return
    for p in PAGE_SIZES:  # varlen_attn's paged form, pages shuffled
        key = "varlen_paged%d" % p
        try:
            pages = Lk // p
            g = torch.Generator(device="cuda").manual_seed(p)
            perm = torch.randperm(B * pages, device="cuda", generator=g)
            table = perm.view(B, pages).to(torch.int32)
            pool_k = torch.empty(B * pages, p, HKV, D, device="cuda",
                                 dtype=k.dtype)
            pool_v = torch.empty_like(pool_k)
            pool_k[perm] = kp.view(B * pages, p, HKV, D)
            pool_v[perm] = vp.view(B * pages, p, HKV, D)
            used = torch.full((B,), Lk, **i32)
            timer.add_after_run(key, call_varlen(
                fn, params, qp, pool_k, pool_v, cu_q, None, Lq, Lk, False,
                seqused_k=used, block_table=table))
        except Exception as e:
            res[key + "_err"] = C.short_error(e)


def torch_varlen(res, q, k, v, lens, doc, budgets, rounds):
    """Flex's document mask over [1, H, T, D], and varlen_attn packed,
    timed in rounds (compare.Rounds)."""
    import torch

    timer = C.Rounds(budgets, rounds)
    T = q.shape[2]
    flex_column(res, q, k, v,
                lambda b, h, qi, kv: (doc[qi] == doc[kv]) & (qi >= kv),
                T, T, timer)
    fn, params = varlen_attn_fn()
    if fn is None:
        res["varlen_err"] = params
    else:
        cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
        try:
            timer.add_after_run("varlen", call_varlen(
                fn, params, q[0].transpose(0, 1).contiguous(),
                k[0].transpose(0, 1).contiguous(),
                v[0].transpose(0, 1).contiguous(), cu, cu, max(lens),
                max(lens), True))
        except Exception as e:
            res["varlen_err"] = C.short_error(e)
    timer.run(res)


# ---- one case ------------------------------------------------------------


def write_packed(directory, q, k, v):
    """[1, H, T, D] tensors as packed [T, H, D] float32 .npy files."""
    import numpy as np

    os.makedirs(directory, exist_ok=True)
    for name, t in (("q", q), ("k", k), ("v", v)):
        np.save(os.path.join(directory, name + ".npy"),
                t[0].transpose(0, 1).float().cpu().numpy())


def dump_error(exact_dir, dump_dir):
    """max |o - o_exact|, ||o - o_exact|| / ||o_exact||, max |lse -
    lse_exact| from two --dump folders."""
    import numpy as np

    o0 = np.load(os.path.join(exact_dir, "o.npy")).astype(np.float64)
    o1 = np.load(os.path.join(dump_dir, "o.npy")).astype(np.float64)
    l0 = np.load(os.path.join(exact_dir, "lse.npy")).astype(np.float64)
    l1 = np.load(os.path.join(dump_dir, "lse.npy")).astype(np.float64)
    d = o1 - o0
    return {"max_err": float(np.abs(d).max()),
            "rel_l2": float(np.linalg.norm(d) / np.linalg.norm(o0)),
            "lse_max_err": float(np.abs(l1 - l0).max())}


def run_case(args, case, budgets, work):
    import torch

    B, Lq, Lk = case["B"], case["Lq"], case["Lk"]
    res = {"case": case["name"], "group": case["group"], "B": B, "Lq": Lq,
           "Lk": Lk, "Hq": HQ, "Hkv": HKV, "D": D,
           "gpu_before": C.gpu_state()}
    t0 = time.time()
    torch.manual_seed(0)
    q = torch.randn(B, HQ, Lq, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, HKV, Lk, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, HKV, Lk, D, device="cuda", dtype=torch.bfloat16)
    if case.get("inputs") == "peaked":
        res["inputs"] = "peaked"
        res["hot_fraction"] = peaked_inputs(q, k, torch.Generator().manual_seed(1))
    inputs = os.path.join(work, "inputs")
    C.write_inputs(inputs, q, k, v)
    subst = {}
    if case["group"] == "varlen":
        lens = varlen_lengths()
        res["lengths"] = lens
        subst["{lens}"] = os.path.join(work, "lens.npy")
        C.write_npy_i32(subst["{lens}"], lens)
        ids = torch.repeat_interleave(torch.arange(len(lens)),
                                      torch.tensor(lens)).to(torch.int32)
        subst["{doc}"] = os.path.join(work, "doc.npy")
        C.write_npy_i32(subst["{doc}"], ids.tolist())
        write_packed(inputs + "_packed", q, k, v)
        res["pairs"] = sum(n * (n + 1) // 2 for n in lens)
    else:
        res["pairs"] = br_pairs(Lq, Lk) if case["spec"] == SPEC_BR else \
            Lq * (Lq + 1) // 2
        res["pairs"] *= B
    if args.only != "flexjit" and case["group"] != "skip":
        mon = C.GpuMonitor()
        if case["group"] == "varlen":
            torch_varlen(res, q, k, v, lens, ids.to("cuda"), budgets,
                         args.rounds)
        else:
            torch_decode(res, case, q, k, v, budgets, args.rounds,
                         C.in_process(args, res,
                                      variant_spec(args, case, "contiguous"),
                                      [], Lk, None))
        res["gpu_torch"] = mon.stop()
    del q, k, v
    torch.cuda.empty_cache()
    res["torch_wall_s"] = round(time.time() - t0, 1)
    mon = C.GpuMonitor()
    exact_dump = None
    for label, extra in case["variants"]:
        ex = list(extra)
        for hole, path in subst.items():
            ex = [x.replace(hole, path) for x in ex]
        ex = flexjit_extra(case, ex)
        ex += ["--inputs", inputs + ("_packed" if label == "varlen" else "")]
        dump = None
        if case["group"] == "skip":
            dump = os.path.join(work, "dump_" + label.replace("=", ""))
            ex += ["--dump", dump]
        spec = variant_spec(args, case, label)
        r = C.run_flexjit_repeated(args.flexjit, spec, B, HQ, Lq, D, ex,
                                   budgets, args.timeout,
                                   1 if dump else args.repeat)
        key = "fj[%s]" % label
        res.update({k2.replace("flexjit", key): v2 for k2, v2 in r.items()})
        if dump and "flexjit_ms" in r:
            if exact_dump is None:
                exact_dump = dump
            else:
                res[key + "_error"] = dump_error(exact_dump, dump)
                shutil.rmtree(dump, ignore_errors=True)
    if exact_dump:
        shutil.rmtree(exact_dump, ignore_errors=True)
    res["gpu_flexjit"] = mon.stop()
    for d in (inputs, inputs + "_packed"):
        shutil.rmtree(d, ignore_errors=True)
    add_figures(res)
    res["case_wall_s"] = round(time.time() - t0, 1)
    return res


# ---- figures and tables --------------------------------------------------

TORCH_COLS = [("flex", "FlexAttention"), ("flash", "SDPA flash"),
              ("cudnn", "SDPA cuDNN"), ("varlen", "varlen_attn")]


def figure(res, ms):
    """TB/s of K+V for one-query decode, else TFLOP/s."""
    if not ms or ms <= 0:
        return None
    if res["Lq"] == 1:
        return kv_bytes(res["B"], res["Lk"]) / (ms * 1e-3) / 1e12
    return 4.0 * HQ * D * res["pairs"] / (ms * 1e-3) / 1e12


def add_figures(res):
    for key in list(res):
        if key.endswith("_ms") and "block_mask" not in key:
            f = figure(res, res[key])
            res[key[:-3] + "_fig"] = None if f is None else round(f, 3)
        if key.endswith("_ms_all"):
            res[key[:-7] + "_fig_range"] = [
                round(figure(res, ms), 3) for ms in
                (max(res[key]), min(res[key]))]


def cellf(res, key, digits):
    f = res.get(key + "_fig")
    if f is not None:
        return "%.*f" % (digits, f)
    return "err" if (key + "_err") in res else "-"


def best_torch(res, cols=("flex", "flash", "cudnn")):
    """The best of the issue's three baselines (varlen_attn is shown beside
    them, not counted)."""
    xs = [(res.get(c + "_fig"), c) for c in cols if res.get(c + "_fig")]
    return max(xs) if xs else (None, None)


def rng(res, key, digits):
    r = res.get(key + "_fig_range")
    return "-" if not r else "%.*f-%.*f" % (digits, r[0], digits, r[1])


def headline(res):
    """The flexjit figure the ratios to PyTorch use: in-process where it
    ran (the baselines' own do_bench call), else the CLI's contiguous run."""
    fj = res.get("fjpy_fig")
    return fj if fj is not None else res.get("fj[contiguous]_fig")


def report(rows):
    dec = [r for r in rows if r["group"] == "decode"]
    if dec:
        paged = any("fj[paged 16]_fig" in r or "fj[paged 16]_err" in r
                    for r in dec)
        print()
        print("Decode, one query token, GQA 32/8, D=128: TB/s of K+V read "
              "(B * Lk * Hkv * D * 2 * 2 bytes / time)%s:" % (
                  "; paged: pages shuffled" if paged else ""))
        print()
        head = ["B x Lk", "flexjit CLI", "CLI range", "flexjit in-process"]
        if paged:
            head += ["paged 16", "paged 64"]
        head += [h for _, h in TORCH_COLS]
        if paged:
            head += ["varlen_attn paged 16", "varlen_attn paged 64"]
        head += ["flexjit / best PyTorch"]
        if paged:
            head += ["CLI paged 16 / contiguous", "CLI paged 64 / contiguous"]
        print("| " + " | ".join(head) + " |")
        print("|" + " --- |" * len(head))
        for r in dec:
            cli = r.get("fj[contiguous]_fig")
            fj = headline(r)
            best, col = best_torch(r)
            cells = ["%d x %d" % (r["B"], r["Lk"]),
                     cellf(r, "fj[contiguous]", 2), rng(r, "fj[contiguous]", 2),
                     cellf(r, "fjpy", 2)]
            if paged:
                cells += [cellf(r, "fj[paged %d]" % p, 2) for p in PAGE_SIZES]
            cells += [cellf(r, c, 2) for c, _ in TORCH_COLS]
            if paged:
                cells += [cellf(r, "varlen_paged%d" % p, 2) for p in PAGE_SIZES]
            cells += [C.ratio(fj, best) + ("" if not col else " (%s)" % col)]
            if paged:
                cells += [C.ratio(r.get("fj[paged %d]_fig" % p), cli)
                          for p in PAGE_SIZES]
            print("| " + " | ".join(cells) + " |")
        gqa = sorted({"%s: %s" % (c, r[c + "_gqa"]) for r in dec
                      for c in ("flash", "cudnn") if c + "_gqa" in r})
        if gqa:
            print("\nSDPA's GQA: " + "; ".join(gqa))
    ch = [r for r in rows if r["group"] == "chunked"]
    if ch:
        print()
        print("Chunked prefill, causal bottom right, GQA 32/8, D=128: TFLOP/s "
              "= 4 * B * Hq * D * pairs / time:")
        print()
        print("| B x Lq x Lk | flexjit CLI | CLI range | flexjit in-process | "
              "FlexAttention | SDPA flash | SDPA cuDNN | varlen_attn | "
              "flexjit / Flex | flexjit / best PyTorch |")
        print("|" + " --- |" * 10)
        for r in ch:
            fj = headline(r)
            best, col = best_torch(r)
            print("| %d x %d x %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |"
                  % (r["B"], r["Lq"], r["Lk"], cellf(r, "fj[contiguous]", 1),
                rng(r, "fj[contiguous]", 1), cellf(r, "fjpy", 1),
                cellf(r, "flex", 1),
                cellf(r, "flash", 1), cellf(r, "cudnn", 1),
                cellf(r, "varlen", 1), C.ratio(fj, r.get("flex_fig")),
                C.ratio(fj, best) + ("" if not col else " (%s)" % col)))
    vl = [r for r in rows if r["group"] == "varlen"]
    if vl:
        print()
        print("Varlen, 64 sequences summing to 32768 tokens, causal within "
              "each, GQA 32/8, D=128: TFLOP/s = 4 * Hq * D * pairs / time:")
        print()
        print("| flexjit varlen | range | flexjit document batch | range | "
              "FlexAttention document | varlen_attn | varlen / document "
              "batch | varlen / Flex |")
        print("|" + " --- |" * 8)
        for r in vl:
            fv, fd = r.get("fj[varlen]_fig"), r.get("fj[document batch]_fig")
            print("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                cellf(r, "fj[varlen]", 1), rng(r, "fj[varlen]", 1),
                cellf(r, "fj[document batch]", 1),
                rng(r, "fj[document batch]", 1), cellf(r, "flex", 1),
                cellf(r, "varlen", 1), C.ratio(fv, fd),
                C.ratio(fv, r.get("flex_fig"))))
    sk = [r for r in rows if r["group"] == "skip"]
    if sk:
        print()
        print("Skip Softmax (flexjit), error against flexjit's exact run "
              "(T=0) on the same inputs (normal: standard normal q, k, v; "
              "peaked: compare_serving.peaked_inputs):")
        print()
        print("| case | inputs | B x Lq x Lk | threshold | speed | speed / exact | "
              "max err o | rel L2 o | max err lse |")
        print("|" + " --- |" * 9)
        for r in sk:
            unit = "TB/s" if r["Lq"] == 1 else "TFLOP/s"
            exact = r.get("fj[T=0]_fig")
            keys = [k[:-4] for k in r if k.startswith("fj[T=")
                    and k.endswith("_fig")]
            for key in sorted(keys, key=lambda k: float(k[5:-1])):
                e = r.get(key + "_error", {})
                print("| %s | %s | %d x %d x %d | %s | %s %s | %s | %s | %s | %s |"
                      % (r["case"], r.get("inputs", "normal"), r["B"], r["Lq"],
                         r["Lk"], key[5:-1],
                         cellf(r, key, 2), unit,
                         C.ratio(r.get(key + "_fig"), exact),
                         "%.2e" % e["max_err"] if e else "-",
                         "%.2e" % e["rel_l2"] if e else "-",
                         "%.2e" % e["lse_max_err"] if e else "-"))
    errs = [(r, k) for r in rows for k in sorted(r) if k.endswith("_err")]
    if errs:
        print("\nfailures (recorded, the run went on):")
        for r, k in errs:
            print("  %s %d x %d x %d, %s: %s" % (r["case"], r["B"], r["Lq"],
                                                r["Lk"], k[:-4], r[k]))


# ---- main ----------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="compare.py --serving", description=__doc__.split("\n")[0])
    ap.add_argument("--flexjit", default=os.path.join(C.REPO, "build",
                                                      "flexjit"))
    ap.add_argument("--examples", default=os.path.join(C.REPO, "examples"))
    ap.add_argument("--cases", default=",".join(GROUPS),
                    help="groups to run: " + ",".join(GROUPS))
    ap.add_argument("--decode-shapes", default=None,
                    help="B x Lk list for decode and paged, e.g. "
                    "64x2048,16x8192 (default: the four of issue 23)")
    ap.add_argument("--skip-thresholds", default="0.01,0.1,0.3",
                    help="Skip Softmax thresholds of the skip group "
                    "(0, exact, is always run)")
    ap.add_argument("--warmup-ms", type=float, default=25)
    ap.add_argument("--rep-ms", type=float, default=100)
    ap.add_argument("--repeat", type=int, default=2,
                    help="flexjit processes a variant (skip: 1)")
    C.add_rounds_option(ap)
    ap.add_argument("--only", choices=["all", "flexjit"], default="all")
    ap.add_argument("--no-in-process", dest="in_process", action="store_false",
                    help="skip the in-process flexjit column (decode and "
                    "chunked prefill through the Python package)")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--deadline", type=float, default=0,
                    help="start no case after this many seconds (0: none)")
    ap.add_argument("--list", action="store_true",
                    help="print the plan and exit (no torch, no GPU)")
    args = ap.parse_args(argv)
    groups = [g.strip() for g in args.cases.split(",") if g.strip()]
    bad = [g for g in groups if g not in GROUPS]
    if bad or not groups:
        ap.error("--cases %r: choose from %s" % (args.cases, ",".join(GROUPS)))
    try:
        thresholds = [float(t) for t in args.skip_thresholds.split(",")]
    except ValueError:
        ap.error("--skip-thresholds %r: numbers in (0, 1)" %
                 args.skip_thresholds)
    if any(not 0 < t < 1 for t in thresholds):
        ap.error("--skip-thresholds %r: numbers in (0, 1)" %
                 args.skip_thresholds)
    if (args.repeat < 1 or args.rounds < 1 or args.warmup_ms <= 0
            or args.rep_ms <= 0):
        ap.error("--repeat, --rounds, --warmup-ms and --rep-ms must be "
                 "positive")
    shapes = None
    if args.decode_shapes:
        try:
            shapes = [tuple(int(x) for x in t.split("x"))
                      for t in args.decode_shapes.split(",")]
        except ValueError:
            shapes = [()]
        if any(len(t) != 2 or min(t) < 1 for t in shapes):
            ap.error("--decode-shapes %r: expected BxLk[,BxLk...]" %
                     args.decode_shapes)
    budgets = (args.warmup_ms, args.rep_ms)
    cases = plan(groups, thresholds, shapes)
    if args.list:
        return list_plan(args, cases, budgets)
    import torch

    print("torch", torch.__version__, torch.cuda.get_device_name(),
          flush=True)
    print("method: do_bench rules (warmup %g ms, rep %g ms, L2 flush, "
          "median) on every column; the in-process columns in %d round(s), "
          "every other one in reverse order, each column's median; "
          "docs/benchmarking.md" % (budgets + (args.rounds,)), flush=True)
    out_dir = os.environ.get("OUT", ".")
    work = tempfile.mkdtemp(prefix="flexjit-serving-")
    rows, start = [], time.time()
    try:
        for case in cases:
            if args.deadline and time.time() - start > args.deadline:
                rows.append({"case": case["name"], "group": case["group"],
                             "B": case["B"], "Lq": case["Lq"],
                             "Lk": case["Lk"], "skipped": "--deadline"})
                continue
            rows.append(run_case(args, case, budgets, work))
            print(json.dumps(rows[-1]), flush=True)
            os.makedirs(out_dir, exist_ok=True)
            path = os.path.join(out_dir, "compare_serving.json")
            with open(path + ".tmp", "w") as f:
                json.dump(rows, f, indent=1)
            os.replace(path + ".tmp", path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    done = [r for r in rows if "skipped" not in r]
    C.print_gpu_phases([dict(r, S=r["Lk"]) for r in done])
    report(done)
    skipped = [r for r in rows if "skipped" in r]
    if skipped:
        print("\nskipped (--deadline): " + ", ".join(
            "%s %d x %d" % (r["case"], r["B"], r["Lk"]) for r in skipped))
    print("\nwall time: %.0f s" % (time.time() - start))
    failed = [k for r in done for k in r if k.startswith("fj[")
              and k.endswith("_err")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
