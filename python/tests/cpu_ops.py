"""CPU kernels for flexjit's custom ops (attention_fwd, attention_bwd,
block_mask), computing dense float64 attention from the specs' Python twins
(reference.py), so that everything around the CUDA kernels (the ops'
plumbing, autograd, torch.compile, the ring over torch.distributed) runs on
a machine without a GPU. Importing this module registers them.

A block mask's empty blocks are masked here as the kernels skip them, so a
mask built for other positions than the launch's changes the result."""
import torch

import flexjit  # noqa: F401  (defines the ops)
from flexjit.spec import core_by_id
from reference import (dense_attention, dense_backward, example_mods, serving_attention,
                       split_sequences)

# The one spec with a trainable buffer these kernels know: a bias on kv.
BIAS_SPEC = """
local bias = buffer("bias", "f32", {grad = true})
return { name = "trainable_bias", mask_mod = causal(),
         score_mod = function(score, b, h, q, kv) return score + bias[kv] end }
"""

# A causal mask whose rows before 12 see no key (in a ring of short shards,
# whole q chunks without a pair).
LATE_SPEC = """
return { name = "late_causal",
         mask_mod = function(b, h, q, kv) return ge(q, 12) & ge(q, kv) end }
"""


def _mods(core, q, k, buffers, ints):
    return _mods_for(core, q.shape[1], q.shape[2], k.shape[2], buffers, ints)


def _mods_for(core, Hq, Lq, Lk, buffers, ints):
    if core.name == "trainable_bias":
        bias = buffers[0]
        return (lambda b, h, qi, ki: qi >= ki), (lambda s, b, h, qi, ki: s + bias[ki])
    if core.name == "late_causal":
        return (lambda b, h, qi, ki: (qi >= 12) & (qi >= ki)), None
    if core.name == "document_causal":
        doc = buffers[0]
        return (lambda b, h, qi, ki: (doc[qi] == doc[ki]) & (qi >= ki)), None
    name = {"sliding_window": "sliding_window", "causal": "causal",
            "causal_bottom_right": "causal_bottom_right", "alibi_causal": "alibi"}[core.name]
    mask, score, _, _ = example_mods(name, Hq, Lq, Lk, "cpu")
    if name == "sliding_window":
        w = ints[0]
        mask = lambda b, h, qi, ki: (qi >= ki) & (qi - ki < w)  # noqa: E731
    return mask, score


def _shifted(mods, q_offset, kv_offset):
    """mask_mod and score_mod seeing positions q + q_offset, kv + kv_offset
    (a context parallel shard, as the kernels apply the offsets)."""
    mask, score = mods
    if not q_offset and not kv_offset:
        return mask, score
    return ((lambda b, h, qi, ki: mask(b, h, qi + q_offset, ki + kv_offset)),
            None if score is None else
            (lambda s, b, h, qi, ki: score(s, b, h, qi + q_offset, ki + kv_offset)))


def _cpu_block_mask(spec, B, H, q_len, kv_len, block_q, block_kv, ints, floats, buffers,
                    device, q_offset=0, kv_offset=0):
    """The eight arrays (fj_block_mask_array order) of the spec's mask at the
    offsets, from the dense mask of its Python twin (b = h = 0: these specs
    read neither)."""
    core = core_by_id(spec)
    mask, _ = _shifted(_mods_for(core, H, q_len, kv_len, buffers, ints), q_offset, kv_offset)
    qi = torch.arange(q_len).view(q_len, 1)
    ki = torch.arange(kv_len).view(1, kv_len)
    dense = mask(torch.tensor(0), torch.tensor(0), qi, ki).expand(q_len, kv_len)
    nq, nkv = -(-q_len // block_q), -(-kv_len // block_kv)
    pad = torch.zeros(nq * block_q, nkv * block_kv, dtype=torch.int64)
    valid = torch.zeros_like(pad)
    pad[:q_len, :kv_len] = dense.long()
    valid[:q_len, :kv_len] = 1
    count = pad.view(nq, block_q, nkv, block_kv).sum((1, 3))
    size = valid.view(nq, block_q, nkv, block_kv).sum((1, 3))
    full, partial = count == size, (count > 0) & (count < size)

    def lists(cls):  # per row: how many, then their indices ascending, then 0s
        num = cls.sum(1).to(torch.int32)
        idx = torch.zeros(cls.shape, dtype=torch.int32)
        for r in range(cls.shape[0]):
            cols = cls[r].nonzero().flatten()
            idx[r, :cols.numel()] = cols.to(torch.int32)
        return num.expand(B, H, -1).contiguous(), idx.expand(B, H, -1, -1).contiguous()

    return [*lists(partial), *lists(full), *lists(partial.T), *lists(full.T)]


def _blocks_allowed(block_mask, block_size, Lq, Lk):
    """[Lq, Lk]: True where a block the mask lists (partial or full) lies."""
    bq, bkv = block_size
    num, idx, fnum, fidx = (t[0, 0] for t in block_mask[:4])
    nq, nkv = num.shape[0], idx.shape[1]
    listed = torch.zeros(nq, nkv, dtype=torch.bool)
    for r in range(nq):
        listed[r, idx[r, :num[r]].long()] = True
        listed[r, fidx[r, :fnum[r]].long()] = True
    return listed.repeat_interleave(bq, 0).repeat_interleave(bkv, 1)[:Lq, :Lk]


def _with_blocks(mods, block_mask, block_size, Lq, Lk):
    """mask_mod limited to the blocks block_mask lists, as the kernels read it."""
    mask, score = mods
    if not block_mask:
        return mask, score
    allowed = _blocks_allowed(block_mask, block_size, Lq, Lk)
    if mask is None:
        return (lambda b, h, qi, ki: allowed[qi, ki]), score
    return (lambda b, h, qi, ki: mask(b, h, qi, ki) & allowed[qi, ki]), score


def _cpu_fwd(q, k, v, spec, scale, ints, floats, buffers, block_mask, block_size, seqlens_k,
             block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, skip,
             q_offset, kv_offset):
    core = core_by_id(spec)
    with torch.no_grad():
        if (seqlens_k is None and block_table is None and cu_seqlens_q is None and
                cu_seqlens_k is None):
            mask, score = _with_blocks(
                _shifted(_mods(core, q, k, buffers, ints), q_offset, kv_offset), block_mask,
                block_size, q.shape[2], k.shape[2])
            o, lse = dense_attention(q.double(), k.double(), v.double(), mask, score,
                                     scale or None)
        else:
            mods = lambda lq, lk: _mods_for(core, q.shape[1], lq, lk, buffers, ints)  # noqa
            o, lse = serving_attention(q.double(), k.double(), v.double(), mods, seqlens_k,
                                       block_table, cu_seqlens_q, cu_seqlens_k, scale or None)
    return torch.empty_like(q).copy_(o), lse.float().contiguous()


def _cpu_bwd(dout, dlse, q, k, v, out, lse, spec, scale, ints, floats, buffers, block_mask,
             block_size, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q_offset,
             kv_offset):
    core = core_by_id(spec)
    if cu_seqlens_q is not None:
        return _cpu_varlen_bwd(dout, dlse, q, k, v, core, scale, ints, buffers, cu_seqlens_q,
                               cu_seqlens_k)
    mask, score = _with_blocks(
        _shifted(_mods(core, q, k, [b.double() for b in buffers], ints), q_offset, kv_offset),
        block_mask, block_size, q.shape[2], k.shape[2])
    dq, dk, dv, ds = dense_backward(q.double(), k.double(), v.double(), dout.double(),
                                    None if dlse is None else dlse.double(), mask, score,
                                    scale or None, out.double(), lse.double())
    # The one trainable buffer of these tests is a bias on kv: its gradient
    # sums dS' over everything but kv, at the kv positions (kv_offset on).
    grads = []
    for b, tr in zip(buffers, core.trainable):
        if tr:
            g = torch.zeros(b.shape[0], dtype=torch.float32)
            g[kv_offset:kv_offset + k.shape[2]] += ds.sum((0, 1, 2)).float()
            grads.append(g)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), grads


def _cpu_varlen_bwd(dout, dlse, q, k, v, core, scale, ints, buffers, cu_q, cu_k):
    """dense_backward a sequence at a time over packed q, k, v (cu_k) or
    [B, Hkv, Lk, D] k and v, assembled packed like the inputs."""
    cq = cu_q.tolist()
    qs, ks, vs = split_sequences(q.double(), k.double(), v.double(), None, None, cu_q, cu_k)
    dq, dk, dv = [], [], []
    for b, (qb, kb, vb) in enumerate(zip(qs, ks, vs)):
        rows = slice(cq[b], cq[b + 1])
        mask, score = _mods_for(core, q.shape[1], qb.shape[1], kb.shape[1], buffers, ints)
        g = dense_backward(qb[None], kb[None], vb[None], dout[rows].transpose(0, 1)[None].double(),
                           None if dlse is None else dlse[:, rows][None].double(), mask, score,
                           scale or None)
        dq.append(g[0][0].transpose(0, 1))
        dk.append(g[1][0].transpose(0, 1) if cu_k is not None else g[1][0])
        dv.append(g[2][0].transpose(0, 1) if cu_k is not None else g[2][0])
    cat = torch.cat if cu_k is not None else torch.stack
    return (torch.cat(dq).to(q.dtype), cat(dk).to(k.dtype), cat(dv).to(v.dtype), [])


torch.library.register_kernel("flexjit::attention_fwd", "cpu", _cpu_fwd)
torch.library.register_kernel("flexjit::attention_bwd", "cpu", _cpu_bwd)
torch.library.register_kernel("flexjit::block_mask", "cpu", _cpu_block_mask)
