#!/usr/bin/env python3
"""Context parallel forward+backward throughput per GPU (issue 24;
docs/context_parallel.md): flexjit.ring_attention against torch's context
parallel with SDPA and with FlexAttention, on the same shards, by the same
timer, in one run.

    torchrun --standalone --nproc-per-node N bench/context_parallel.py \\
        [--cases causal,document] [--seqs 65536,131072] [--batch 2] \\
        [--heads 16] [--head-dim 128] [--iters 10] [--out DIR]

Run it with N = 1, 2, 4, ... for the scaling (N = 1: one GPU, no exchange).
The package is the installed one, or a checkout's python/ on PYTHONPATH with
FLEXJIT_LIBRARY pointing at a build's libflexjit.so.

Every rank draws the whole q, k, v and dO of B x S positions (bf16, the same
seed) and keeps its shard in the head-tail layout (rank r holds chunks r and
2N - 1 - r of S / 2N positions: flexjit's "zigzag", torch's load balancer),
which gives each rank the same share of a causal mask's work.

Columns (each a forward and a backward of its implementation):
  flexjit        flexjit.ring_attention(layout="zigzag"): kv shards around
                 the ring over NCCL, the spec's mask on global positions
  SDPA ring      torch's context_parallel() over scaled_dot_product_attention
                 (is_causal; causal case only: SDPA has no document mask),
                 rotate method "alltoall" (its ring)
  SDPA allgather the same with rotate method "allgather"
  FlexAttention  torch's _ContextParallel module wrapper over the compiled
                 flex_attention (K and V all-gathered), the block mask
                 sharded by _context_parallel_shard with the head-tail load
                 balancer
torch's context parallel API is experimental; a column whose call fails
shows "err" and the JSON holds the error.

Timing: a warm-up, then --iters steps, each between dist.barrier() and a
synchronize, timed by CUDA events on every rank; a step's time is the
slowest rank's (all_reduce MAX), and the figure is the median step.
TFLOP/s per GPU = 3.5 * 4 * B * H * D * (allowed pairs of the whole
sequence) / time / N (DESIGN.md's convention: the backward 2.5x the
forward). Writes context_parallel_N.json into --out (default $OUT or .)."""
import argparse
import json
import os
import statistics
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import allowed_pairs, document_ids, short_error  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def head_tail(x, rank, n, dim=2):
    """Rank's shard of x along dim: chunks rank and 2n - 1 - rank of 2n."""
    chunks = x.chunk(2 * n, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * n - 1 - rank]], dim=dim).contiguous()


def time_steps(step, iters, warmup):
    """Median over iters of the slowest rank's time (ms) of step()."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        dist.barrier()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        torch.cuda.synchronize()
        t = torch.tensor([a.elapsed_time(b)], device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times.append(float(t.item()))
    return statistics.median(times)


def mask_fn(case, doc):
    if case == "causal":
        return lambda b, h, q, kv: q >= kv
    return lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv)


def run_flexjit(case, q, k, v, dout, doc, rank, n, iters, warmup):
    import flexjit

    spec = flexjit.Spec(os.path.join(REPO, "examples", "%s.lua" % case))
    buffers = {"doc": doc} if case == "document" else None
    ql, kl, vl = (head_tail(t, rank, n).requires_grad_() for t in (q, k, v))
    dl = head_tail(dout, rank, n)

    def step():
        out = flexjit.ring_attention(ql, kl, vl, spec, buffers=buffers, layout="zigzag")
        torch.autograd.grad(out, (ql, kl, vl), dl)

    return time_steps(step, iters, warmup)


def run_sdpa(rotate, q, k, v, dout, mesh, iters, warmup):
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method
    from torch.nn.attention import SDPBackend, sdpa_kernel

    set_rotate_method(rotate)
    bufs = [t.clone() for t in (q, k, v, dout)]
    with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2, 2, 2, 2],
                          no_restore_buffers=set(bufs)):
        ql, kl, vl, dl = bufs
        for t in (ql, kl, vl):
            t.requires_grad_()

        def step():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]):
                out = torch.nn.functional.scaled_dot_product_attention(ql, kl, vl,
                                                                       is_causal=True)
            torch.autograd.grad(out, (ql, kl, vl), dl)

        return time_steps(step, iters, warmup)


def run_flex(case, q, k, v, dout, doc, mesh, iters, warmup):
    from torch.distributed.tensor.experimental._attention import (
        _context_parallel_shard, _ContextParallel, _HeadTailLoadBalancer)
    from torch.distributed.tensor.parallel import parallelize_module
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    B, H, S, _ = q.shape
    n = mesh.size()
    compiled = torch.compile(flex_attention, dynamic=False)

    class Flex(torch.nn.Module):
        def forward(self, q, k, v, block_mask):
            return compiled(q, k, v, block_mask=block_mask)

    mod = parallelize_module(Flex(), mesh, _ContextParallel(
        seq_dim=2, attention_type=_ContextParallel.AttentionType.FLEX))
    bm = create_block_mask(mask_fn(case, doc), 1, 1, S, S, device="cuda")
    lb = _HeadTailLoadBalancer(S, n, torch.device("cuda"))
    ql, kl, vl, dl, bml = _context_parallel_shard(mesh, [q, k, v, dout, bm],
                                                  [2, 2, 2, 2, 2], load_balancer=lb)
    for t in (ql, kl, vl):
        t.requires_grad_()

    def step():
        out = mod(ql, kl, vl, bml)
        torch.autograd.grad(out, (ql, kl, vl), dl)

    return time_steps(step, iters, warmup)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="causal,document")
    ap.add_argument("--seqs", default="65536,131072", help="whole sequence lengths")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--only", default="", help="comma list of columns to run")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()

    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cuda", (n,))
    B, H, D = args.batch, args.heads, args.head_dim
    only = set(filter(None, args.only.split(",")))
    rows = []
    for S in (int(s) for s in args.seqs.split(",")):
        if S % (2 * n):
            raise SystemExit(f"sequence length {S} is not a multiple of 2 x {n} ranks")
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, dout = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16,
                                     generator=g) for _ in range(4))
        for case in args.cases.split(","):
            doc = document_ids(S).cuda() if case == "document" else None
            pairs = allowed_pairs(mask_fn(case, doc), S)
            row = {"case": case, "B": B, "H": H, "S": S, "D": D, "gpus": n, "pairs": pairs,
                   "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
            runs = [("flexjit", lambda: run_flexjit(case, q, k, v, dout, doc, rank, n,
                                                    args.iters, args.warmup))]
            if case == "causal":
                runs += [("SDPA ring", lambda: run_sdpa("alltoall", q, k, v, dout, mesh,
                                                        args.iters, args.warmup)),
                         ("SDPA allgather", lambda: run_sdpa("allgather", q, k, v, dout,
                                                             mesh, args.iters, args.warmup))]
            runs += [("FlexAttention", lambda: run_flex(case, q, k, v, dout, doc, mesh,
                                                        args.iters, args.warmup))]
            for col, fn in runs:
                if only and col not in only:
                    continue
                try:
                    ms = fn()
                    row[col + "_ms"] = ms
                    flops = 3.5 * 4 * B * H * D * pairs
                    row[col + "_tflops_per_gpu"] = flops / (ms * 1e-3) / n / 1e12
                except Exception as e:  # an experimental API that fails is a column of "err"
                    row[col + "_err"] = short_error(e)
                    torch.cuda.synchronize()
                    dist.barrier()
            rows.append(row)
            if rank == 0:
                print(json.dumps(row), flush=True)
    if rank == 0:
        cols = ["flexjit", "SDPA ring", "SDPA allgather", "FlexAttention"]
        print(f"\nforward+backward TFLOP/s per GPU, {n} GPU(s), bf16, H={H}, D={D}, "
              f"median of {args.iters} steps (slowest rank):\n")
        print("| case | B x S | " + " | ".join(cols) + " |")
        print("| --- | --- |" + " --- |" * len(cols))
        for r in rows:
            cells = []
            for c in cols:
                if c + "_tflops_per_gpu" in r:
                    cells.append("%.1f" % r[c + "_tflops_per_gpu"])
                else:
                    cells.append("err" if c + "_err" in r else "-")
            print(f"| {r['case']} | {r['B']} x {r['S']} | " + " | ".join(cells) + " |")
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "context_parallel_%d.json" % n), "w") as f:
            json.dump(rows, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
