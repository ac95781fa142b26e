"""Context parallel attention over torch.distributed (docs/context_parallel.md):
ring_attention, forward and backward.

Each rank of a process group holds a shard of the sequence: q, k and v of its
positions. The kv shards pass around the ring (rank r sends to r + 1 and
receives from r - 1) while each rank attends its q shard to the kv shard it
holds, placed in the whole sequence by q_offset and kv_offset, so any spec's
mask and score_mod apply as in the whole. The partial results merge by their
LSE in float32. The backward passes the kv shards around again with their
dk and dv accumulators (float32), each pair's gradients computed by the
backward kernel from the whole attention's O and LSE; an accumulator sent
after one step is received while the next step computes.

Layouts: "contiguous", rank r holds positions [r S, (r + 1) S); "zigzag",
the sequence cut into 2N chunks of S / 2 and rank r holds chunks r and
2N - 1 - r (concatenated), which gives every rank the same share of a causal
mask's work.

Sends and receives are posted before each step's attention and waited for
after it: with NCCL they run on its own stream, beside the kernels."""
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

try:
    from torch.distributed.device_mesh import DeviceMesh
except ImportError:  # a torch without the distributed package: no mesh can come
    DeviceMesh = ()

from . import _torch as fjt
from .spec import Spec, core_of

LAYOUTS = ("contiguous", "zigzag")


def _chunks(rank: int, n: int, length: int, layout: str) -> List[Tuple[int, int, int]]:
    """(start in the local tensor, position in the whole sequence, length) of
    each chunk a rank holds."""
    if layout == "contiguous":
        return [(0, rank * length, length)]
    c = length // 2
    return [(0, rank * c, c), (c, (2 * n - 1 - rank) * c, c)]


# Block size of the pairs' block masks (fits every kernel's tiles).
_BLOCK = 128


def _pair_mask(core, ints, floats, bufs, q, ql, qp, kl, kp):
    """The block mask of a (q chunk, kv chunk) pair at its offsets, where the
    spec's mask reads a buffer (document ids): the kernels cannot classify
    its tiles from indices, and without one every tile the interval analysis
    leaves undecided would be computed. [] for an index-only mask."""
    if not core.mask_reads_buffer:
        return []
    B = q.shape[0] if core.mask_reads_b else 1
    H = q.shape[1] if core.mask_reads_h else 1
    return fjt.run_block_mask(core.id, B, H, ql, kl, _BLOCK, _BLOCK, ints, floats, bufs,
                              q.device, qp, kp)


def _pair_fwd(q, k, v, sid, scale, ints, floats, bufs, bm, q_off, kv_off):
    return fjt.run_forward(q, k, v, sid, scale, ints, floats, bufs, bm,
                           [_BLOCK, _BLOCK] if bm else [],
                           *fjt.Layout(q_offset=q_off, kv_offset=kv_off))


def _pair_bwd(dout, q, k, v, out, lse, sid, scale, ints, floats, bufs, bm, q_off, kv_off):
    return fjt.run_backward(dout, None, q, k, v, out, lse, sid, scale, ints, floats, bufs, bm,
                            [_BLOCK, _BLOCK] if bm else [], None, None, 0, 0, q_off, kv_off)


def _empty(core, ints, floats, q, k, qp, ql, kp, kl):
    """Whether the mask allows no pair of q positions qp.. (ql of them) and
    kv positions kp.. (kl), every batch index and head: fj_spec_block_class,
    on the host, so that the pair costs no launch."""
    B, Hq, Hkv = q.shape[0], q.shape[1], k.shape[1]
    return core.block_class(ints, floats, B, Hq, Hkv, ql, kl, qp, kp, 0, ql - 1, 0,
                            kl - 1) == "empty"


def _merge(acc, o, lse):
    """acc (O float32, LSE) with one more segment (o, lse); rows of no keys
    (LSE -inf) add nothing."""
    if acc is None:
        return o.float(), lse.clone()
    ao, al = acc
    new = torch.logaddexp(al, lse)
    keep = torch.isfinite(new)
    wa = torch.where(keep, torch.exp(al - new), torch.zeros_like(new))
    wb = torch.where(keep, torch.exp(lse - new), torch.zeros_like(new))
    return ao * wa[..., None] + o.float() * wb[..., None], new


def _exchange(group, sends: List[Tensor], recvs: List[Tensor]):
    """Posts sends of `sends` to the next rank and receives into `recvs` from
    the previous one; returns the requests to wait for."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    nxt = dist.get_global_rank(group, (rank + 1) % n) if group is not None else (rank + 1) % n
    prv = dist.get_global_rank(group, (rank - 1) % n) if group is not None else (rank - 1) % n
    ops = [dist.P2POp(dist.isend, t, nxt, group) for t in sends]
    ops += [dist.P2POp(dist.irecv, t, prv, group) for t in recvs]
    return dist.batch_isend_irecv(ops)


def _wait(reqs):
    for r in reqs:
        r.wait()


class _Ring(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sid, scale, ints, floats, layout, group, *bufs):
        bufs = list(bufs)
        rank, n = dist.get_rank(group), dist.get_world_size(group)
        S = q.shape[2]
        mine = _chunks(rank, n, S, layout)
        acc = [None] * len(mine)
        core = fjt.core_by_id(sid)
        empty = set()  # (q position, kv position) of the pairs not launched
        masks = {}  # their block masks, by the same key, for the backward
        k_cur, v_cur = k.contiguous(), v.contiguous()
        for step in range(n):
            reqs = []
            if step < n - 1:
                k_nxt, v_nxt = torch.empty_like(k_cur), torch.empty_like(v_cur)
                reqs = _exchange(group, [k_cur, v_cur], [k_nxt, v_nxt])
            src = (rank - step) % n
            for i, (qs, qp, ql) in enumerate(mine):
                for ks, kp, kl in _chunks(src, n, S, layout):
                    if _empty(core, ints, floats, q, k_cur, qp, ql, kp, kl):
                        empty.add((qp, kp))
                        continue
                    bm = masks[qp, kp] = _pair_mask(core, ints, floats, bufs, q, ql, qp, kl,
                                                    kp)
                    o, lse = _pair_fwd(q[:, :, qs:qs + ql], k_cur[:, :, ks:ks + kl],
                                       v_cur[:, :, ks:ks + kl], sid, scale, ints, floats,
                                       bufs, bm, qp, kp)
                    acc[i] = _merge(acc[i], o, lse)
            _wait(reqs)
            if step < n - 1:
                k_cur, v_cur = k_nxt, v_nxt
        # A q chunk that no kv position reaches: O 0, LSE -inf.
        B, Hq, _, D = q.shape
        acc = [a if a is not None else
               (q.new_zeros(B, Hq, ql, D, dtype=torch.float32),
                q.new_full((B, Hq, ql), float("-inf"), dtype=torch.float32))
               for a, (_, _, ql) in zip(acc, mine)]
        out = torch.cat([a[0] for a in acc], 2).to(q.dtype)
        lse = torch.cat([a[1] for a in acc], 2)
        ctx.save_for_backward(q, k, v, out, lse, *bufs)
        ctx.flexjit = (sid, scale, ints, floats, layout, group, empty, masks)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, *bufs = ctx.saved_tensors
        sid, scale, ints, floats, layout, group, empty, masks = ctx.flexjit
        rank, n = dist.get_rank(group), dist.get_world_size(group)
        S = q.shape[2]
        mine = _chunks(rank, n, S, layout)
        dout = dout.contiguous()
        dq = torch.zeros_like(q, dtype=torch.float32)
        k_cur, v_cur = k.contiguous(), v.contiguous()
        core = fjt.core_by_id(sid)
        trainable = [t for t, a in zip(bufs, core.buffers) if a.trainable]
        dbufs = [torch.zeros(b.shape[0], dtype=torch.float32, device=b.device)
                 for b in trainable]
        # The dk and dv accumulators (float32) travel with their kv shard;
        # those sent after step s - 1 arrive while step s computes. grads_in:
        # the requests, dk and dv received, and dk and dv sent (kept alive
        # until the requests are done).
        grads_in = None
        for step in range(n):
            src = (rank - step) % n
            kv_reqs = []
            if step < n - 1:  # k and v move on while this step's gradients are computed
                k_nxt, v_nxt = torch.empty_like(k_cur), torch.empty_like(v_cur)
                kv_reqs = _exchange(group, [k_cur, v_cur], [k_nxt, v_nxt])
            dk_step = torch.zeros_like(k_cur, dtype=torch.float32)
            dv_step = torch.zeros_like(v_cur, dtype=torch.float32)
            for qs, qp, ql in mine:
                rows = slice(qs, qs + ql)
                for ks, kp, kl in _chunks(src, n, S, layout):
                    if (qp, kp) in empty:
                        continue
                    cols = slice(ks, ks + kl)
                    gq, gk, gv, gb = _pair_bwd(dout[:, :, rows], q[:, :, rows],
                                               k_cur[:, :, cols], v_cur[:, :, cols],
                                               out[:, :, rows], lse[:, :, rows], sid, scale,
                                               ints, floats, bufs, masks[qp, kp], qp, kp)
                    dq[:, :, rows] += gq
                    dk_step[:, :, cols] += gk
                    dv_step[:, :, cols] += gv
                    for acc, g in zip(dbufs, gb):
                        acc += g
            if grads_in is not None:  # what the ranks before this one added
                _wait(grads_in[0])
                dk_step += grads_in[1]
                dv_step += grads_in[2]
            dk_cur, dv_cur = dk_step, dv_step
            # On to the next rank; after the last step they reach the shard's
            # owner.
            if n > 1:
                recvs = [torch.empty_like(dk_cur), torch.empty_like(dv_cur)]
                grads_in = (_exchange(group, [dk_cur, dv_cur], recvs), *recvs, dk_cur, dv_cur)
            _wait(kv_reqs)
            if step < n - 1:
                k_cur, v_cur = k_nxt, v_nxt
        if grads_in is not None:
            _wait(grads_in[0])
            dk_cur, dv_cur = grads_in[1], grads_in[2]
        # A buffer every rank holds whole: its gradient sums every rank's part.
        for g in dbufs:
            dist.all_reduce(g, group=group)
        it = iter(dbufs)
        grads = [next(it) if b.requires_grad and a.trainable else None
                 for b, a in zip(bufs, core.buffers)]
        return (dq.to(q.dtype), dk_cur.to(k.dtype), dv_cur.to(v.dtype), None, None, None,
                None, None, None, *grads)


def ring_attention(q: Tensor, k: Tensor, v: Tensor, spec: Spec, params=None, buffers=None,
                   scale: Optional[float] = None, return_lse: bool = False, *,
                   group=None, layout: str = "contiguous"):
    """Attention over a sequence split across the ranks of `group` (None:
    the default group; a one-dimensional DeviceMesh, or mesh[dim] of a larger
    one, stands for its group): q [B, Hq, S,
    D], k and v [B, Hkv, S, D], this rank's shard of S positions of the whole
    N x S (layout "contiguous": positions rank S .. rank S + S - 1; "zigzag":
    chunks rank and 2N - 1 - rank of S / 2 positions each, concatenated, S
    even). The spec's mask_mod and score_mod see positions of the whole
    sequence; buffers they index by position (document ids) hold the whole
    sequence on every rank. Not with a spec that reads Lq or Lk.

    Returns this rank's O (like q, contiguous), and LSE [B, Hq, S] (float32)
    with return_lse. Differentiable in q, k, v and trainable buffers (their
    gradient summed over the group). Every rank of the group calls it with
    the same shapes, spec, params and layout."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS} (got {layout!r})")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("ring_attention takes q [B, Hq, S, D] and k, v [B, Hkv, S, D] "
                         f"(got q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)})")
    if k.shape[2] != q.shape[2] or v.shape[2] != q.shape[2]:
        raise ValueError("q, k and v of a rank hold the same positions (the same S: got "
                         f"{q.shape[2]}, {k.shape[2]}, {v.shape[2]})")
    if layout == "zigzag" and q.shape[2] % 2:
        raise ValueError(f"the zigzag layout holds two chunks of S / 2 (S = {q.shape[2]} is "
                         "odd)")
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("ring_attention needs torch.distributed initialized "
                           "(dist.init_process_group)")
    if isinstance(group, DeviceMesh):
        if group.ndim != 1:
            raise ValueError(f"a DeviceMesh of {group.ndim} dimensions: pass the context "
                             "parallel one, mesh[name] (or its group)")
        group = group.get_group()
    core = core_of(spec)
    ints, floats, bufs = fjt._launch_values(core, params, buffers)
    sc = 0.0 if scale is None else float(scale)
    out, lse = _Ring.apply(q, k, v, core.id, sc, ints, floats, layout, group, *bufs)
    return (out, lse) if return_lse else out
