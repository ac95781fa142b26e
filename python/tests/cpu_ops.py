"""CPU kernels for flexjit's custom ops (attention_fwd, attention_bwd),
computing dense float64 attention from the specs' Python twins
(reference.py), so that everything around the CUDA kernels (the ops'
plumbing, autograd, torch.compile, the ring over torch.distributed) runs on
a machine without a GPU. Importing this module registers them."""
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


def _cpu_fwd(q, k, v, spec, scale, ints, floats, buffers, block_mask, block_size, seqlens_k,
             block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, skip,
             q_offset, kv_offset):
    core = core_by_id(spec)
    with torch.no_grad():
        if (seqlens_k is None and block_table is None and cu_seqlens_q is None and
                cu_seqlens_k is None):
            mask, score = _shifted(_mods(core, q, k, buffers, ints), q_offset, kv_offset)
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
    mask, score = _shifted(_mods(core, q, k, [b.double() for b in buffers], ints), q_offset,
                           kv_offset)
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
