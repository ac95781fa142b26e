"""Python twins of the example specs (examples/*.lua) for comparing with
PyTorch: mask_mod and score_mod as FlexAttention takes them, and the runtime
values each needs. Used by test_torch.py (dense CPU reference) and
test_gpu.py (FlexAttention)."""
import math

import torch

# relative_buckets.lua's thresholds (plain Lua in the spec, constants here).
_EXACT, _BUCKETS, _MAXD = 16, 32, 128
_THRESH = [math.ceil(_EXACT * (_MAXD / _EXACT) ** (k / (_BUCKETS - _EXACT)))
           for k in range(1, _BUCKETS - _EXACT)]


def example_mods(name, Hq, Lq, Lk, device, seed=0):
    """(mask_mod, score_mod, params, buffers) of examples/<name>.lua; mask_mod
    or score_mod None where the spec has none."""
    g = torch.Generator().manual_seed(seed)
    causal = lambda b, h, q, kv: q >= kv  # noqa: E731
    if name == "causal":
        return causal, None, {}, {}
    if name == "causal_bottom_right":
        return (lambda b, h, q, kv: q + (Lk - Lq) >= kv), None, {}, {}
    if name == "full":
        return None, (lambda s, b, h, q, kv: s), {}, {}
    if name == "sliding_window":
        w = 37
        return (lambda b, h, q, kv: (q >= kv) & (q - kv < w)), None, {"window": w}, {}
    if name == "prefix_lm":
        p = 45
        return (lambda b, h, q, kv: (q >= kv) | (kv < p)), None, {"prefix": p}, {}
    if name == "document":
        lengths = torch.randint(1, max(2, Lq // 3), (64,), generator=g)
        doc = torch.repeat_interleave(torch.arange(64), lengths)[:Lq]
        doc = torch.cat([doc, doc.new_full((Lq - doc.numel(),), 64)]).to(torch.int32)
        doc = doc.to(device)
        return ((lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv)), None, {},
                {"doc": doc})
    if name == "alibi":
        def score(s, b, h, q, kv):
            return s + torch.exp2(-8.0 * (h + 1) / Hq) * (kv - q)
        return causal, score, {}, {}
    if name == "softcap":
        return causal, (lambda s, b, h, q, kv: 30.0 * torch.tanh(s / 30.0)), {}, {}
    if name == "relative_buckets":
        bias = (torch.randn(Hq * _BUCKETS, generator=g) * 0.5).to(device)

        def score(s, b, h, q, kv):
            n = torch.clamp(q - kv, min=0)
            idx = torch.clamp(n, max=_EXACT)
            for t in _THRESH:
                idx = idx + (n >= t).to(idx.dtype)
            return s + bias[h * _BUCKETS + idx]
        return causal, score, {}, {"rel_bias": bias}
    raise KeyError(name)


EXAMPLES = ["alibi", "causal", "causal_bottom_right", "document", "full", "prefix_lm",
            "relative_buckets", "sliding_window", "softcap"]


def dense_attention(q, k, v, mask_mod, score_mod, scale=None):
    """Attention over dense scores in q's dtype (float64 for a reference):
    O and the natural-log LSE; fully masked rows give O = 0, LSE = -inf.
    GQA by head counts."""
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(Hq // Hkv, dim=1)
    v = v.repeat_interleave(Hq // Hkv, dim=1)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    b = torch.arange(B, device=q.device).view(B, 1, 1, 1)
    h = torch.arange(Hq, device=q.device).view(1, Hq, 1, 1)
    qi = torch.arange(Lq, device=q.device).view(1, 1, Lq, 1)
    ki = torch.arange(Lk, device=q.device).view(1, 1, 1, Lk)
    if score_mod is not None:
        s = score_mod(s, b, h, qi, ki)
    if mask_mod is not None:
        allowed = mask_mod(b, h, qi, ki).expand(B, Hq, Lq, Lk)
        s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1).masked_fill(torch.isinf(lse).unsqueeze(-1), 0))
    p = torch.nan_to_num(p, nan=0.0)
    # P in v's dtype for P V, as the kernels round it (a float32 bias
    # buffer promotes the scores of a low-precision run to float32).
    return p.to(v.dtype) @ v, lse


def dense_backward(q, k, v, dout, dlse, mask_mod, score_mod, scale=None, o=None, lse=None):
    """Gradients of dense_attention (float64) by the backward pass's formulas
    (docs/backward.md) for a score_mod whose derivative in the score is 1 (a
    bias): dq, dk, dv (GQA summed over groups) and dS', whose sums give a
    bias buffer's gradient. Without autograd, so that it runs inside a custom
    op's kernel. o and lse: the forward's, as the backward kernels take them
    (a context parallel pair's are the whole attention's); None: computed
    here from q, k, v."""
    B, Hq, Lq, D = q.shape
    Hkv = k.shape[1]
    g = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    if o is None or lse is None:
        o, lse = dense_attention(q, k, v, mask_mod, score_mod, scale)
    kr, vr = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = (q @ kr.transpose(-1, -2)) * scale
    b = torch.arange(B).view(B, 1, 1, 1)
    h = torch.arange(Hq).view(1, Hq, 1, 1)
    qi = torch.arange(Lq).view(1, 1, Lq, 1)
    ki = torch.arange(k.shape[2]).view(1, 1, 1, -1)
    if score_mod is not None:
        s = score_mod(s, b, h, qi, ki)
    if mask_mod is not None:
        s = s.masked_fill(~mask_mod(b, h, qi, ki).expand_as(s), float("-inf"))
    p = torch.nan_to_num(torch.exp(s - lse.unsqueeze(-1)), nan=0.0)
    delta = (dout * o).sum(-1)
    if dlse is not None:
        delta = delta - dlse
    dp = dout @ vr.transpose(-1, -2)
    ds = p * (dp - delta.unsqueeze(-1))
    dq = scale * ds @ kr
    dk = (scale * ds.transpose(-1, -2) @ q).view(B, Hkv, g, -1, D).sum(2)
    dv = (p.transpose(-1, -2) @ dout).view(B, Hkv, g, -1, D).sum(2)
    return dq, dk, dv, ds


# ---- serving layouts (docs/python.md, "Serving") ----

def gather_paged(pool, table_row, length):
    """kv rows [0, length) of one sequence from a page pool [num_pages,
    page_size, H, D] through its block-table row: [H, length, D]. Position
    j is row j % page_size of page table_row[j // page_size]."""
    ps = pool.shape[1]
    j = torch.arange(length, device=pool.device)
    pages = table_row.to(pool.device).long()[j // ps]
    return pool[pages, j % ps].transpose(0, 1)


def split_sequences(q, k, v, seqlens_k=None, block_table=None, cu_seqlens_q=None,
                    cu_seqlens_k=None):
    """The batch of a serving launch as lists of sequences, each [H, L_b, D]:
    q [B, Hq, Lq, D] or packed [total_q, Hq, D] (cu_seqlens_q); k and v
    [B, Hkv, Lk, D], packed (cu_seqlens_k) or page pools (block_table), cut to
    seqlens_k where given."""
    cq = None if cu_seqlens_q is None else cu_seqlens_q.tolist()
    ck = None if cu_seqlens_k is None else cu_seqlens_k.tolist()
    lens = None if seqlens_k is None else seqlens_k.tolist()
    B = len(cq) - 1 if cq is not None else q.shape[0]
    qs, ks, vs = [], [], []
    for b in range(B):
        qs.append(q[cq[b]:cq[b + 1]].transpose(0, 1) if cq is not None else q[b])
        if ck is not None:
            ks.append(k[ck[b]:ck[b + 1]].transpose(0, 1))
            vs.append(v[ck[b]:ck[b + 1]].transpose(0, 1))
        elif block_table is not None:
            n = lens[b] if lens is not None else block_table.shape[1] * k.shape[1]
            ks.append(gather_paged(k, block_table[b], n))
            vs.append(gather_paged(v, block_table[b], n))
        else:
            n = lens[b] if lens is not None else k.shape[2]
            ks.append(k[b, :, :n])
            vs.append(v[b, :, :n])
    return qs, ks, vs


def serving_attention(q, k, v, mods, seqlens_k=None, block_table=None, cu_seqlens_q=None,
                      cu_seqlens_k=None, scale=None):
    """dense_attention of every sequence on its own (in q's dtype; float64
    for a reference; differentiable), assembled as the launch returns it: O
    like q, LSE [B, Hq, Lq] or [Hq, total_q] for packed q. mods(Lq, Lk) gives
    the (mask_mod, score_mod) of a sequence of those lengths."""
    qs, ks, vs = split_sequences(q, k, v, seqlens_k, block_table, cu_seqlens_q, cu_seqlens_k)
    os_, ls = [], []
    for qb, kb, vb in zip(qs, ks, vs):
        mask, score = mods(qb.shape[1], kb.shape[1])
        o, lse = dense_attention(qb[None], kb[None], vb[None], mask, score, scale)
        os_.append(o[0])
        ls.append(lse[0])
    if cu_seqlens_q is not None:
        return torch.cat([o.transpose(0, 1) for o in os_]), torch.cat(ls, dim=1)
    return torch.stack(os_), torch.stack(ls)
