"""Serving utilities on PyTorch tensors: flexjit.merge_states (fj_merge_states)
and flexjit.paged_from_csr (fj_paged_from_csr), as custom ops with fake
implementations (torch.compile) whose outputs come from torch's allocator
and whose kernels run on torch's current stream (CUDA graphs).

The attention ops' serving options (seqlens_k, block_table, cu_seqlens,
Skip Softmax) are in _torch.py, with the ops they extend."""
import ctypes
from typing import Tuple

import torch
from torch import Tensor

from . import _lib
from ._lib import lib
from ._torch import _DL, _context, _stream

# fj_merge_states' output dtypes, by the int the op takes.
_OUT_DTYPES = (torch.bfloat16, torch.float16)


def merge_impl(o_parts: Tensor, lse_parts: Tensor, out_dtype: int) -> Tuple[Tensor, Tensor]:
    N, B, H, L, D = o_parts.shape
    o = torch.empty((B, H, L, D), dtype=_OUT_DTYPES[out_dtype], device=o_parts.device)
    lse = torch.empty((B, H, L), dtype=torch.float32, device=o_parts.device)
    ctx = _context(o_parts)
    ts = [_DL(t) for t in (o_parts, lse_parts, o, lse)]
    for d, t in zip(ts, (o_parts, lse_parts, o, lse)):
        d.t.data = t.data_ptr()
    a = _lib.MergeArgs(*(d.addr for d in ts), _stream(o_parts))
    with ctx.lock:
        ctx.check(lib.fj_merge_states(ctx.ptr, ctypes.byref(a)), "merge_states")
    return o, lse


def csr_impl(kv_indptr: Tensor, kv_indices: Tensor, kv_last_page_len: Tensor, page_size: int,
             max_pages: int) -> Tuple[Tensor, Tensor]:
    B = kv_indptr.shape[0] - 1
    block_table = torch.empty((B, max_pages), dtype=torch.int32, device=kv_indptr.device)
    seqlens_k = torch.empty((B,), dtype=torch.int32, device=kv_indptr.device)
    ctx = _context(kv_indptr)
    ins = (kv_indptr, kv_indices, kv_last_page_len)
    outs = (block_table, seqlens_k)
    ds = [_DL(t) for t in ins + outs]
    for d, t in zip(ds, ins + outs):
        d.t.data = t.data_ptr()
    a = _lib.PagedCsrArgs(ds[0].addr, ds[1].addr, ds[2].addr, page_size, ds[3].addr,
                          ds[4].addr, _stream(kv_indptr))
    with ctx.lock:
        ctx.check(lib.fj_paged_from_csr(ctx.ptr, ctypes.byref(a)), "paged_from_csr")
    return block_table, seqlens_k


merge_op = torch.library.custom_op("flexjit::merge_states", mutates_args=())(merge_impl)
csr_op = torch.library.custom_op("flexjit::paged_from_csr", mutates_args=())(csr_impl)


@merge_op.register_fake
def _(o_parts, lse_parts, out_dtype):
    N, B, H, L, D = o_parts.shape
    return (o_parts.new_empty((B, H, L, D), dtype=_OUT_DTYPES[out_dtype]),
            o_parts.new_empty((B, H, L), dtype=torch.float32))


@csr_op.register_fake
def _(kv_indptr, kv_indices, kv_last_page_len, page_size, max_pages):
    B = kv_indptr.shape[0] - 1
    return (kv_indptr.new_empty((B, max_pages), dtype=torch.int32),
            kv_indptr.new_empty((B,), dtype=torch.int32))


def _stacked(x, name):
    if isinstance(x, (list, tuple)):
        if not x:
            raise ValueError(f"{name} is empty: merge_states needs at least one part")
        return torch.stack(list(x))
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a tensor or a list of tensors, not {type(x).__name__}")
    return x


def merge_states(o_parts, lse_parts, out_dtype=None):
    """Merges attention over N key/value segments into attention over their
    union, by the segments' LSE (split-KV decoding, cascade and shared-prefix
    attention): o = sum_i exp(lse_i - lse) o_i with lse = log sum_i
    exp(lse_i).

    o_parts: [N, B, H, L, D] (bf16, fp16 or float32), or a list of N
    [B, H, L, D] tensors (stacked, a copy); lse_parts: float32 [N, B, H, L]
    or a list (natural log, -inf for an empty segment, which adds nothing).
    flexjit.attention's (O, LSE) of each segment are such parts. out_dtype:
    bf16 or fp16, None: o_parts' (given for float32 parts). D a multiple of 8
    up to 256. Returns (o [B, H, L, D], lse float32 [B, H, L]); a row whose
    segments are all empty gets o = 0 and lse = -inf. No gradient."""
    o_parts = _stacked(o_parts, "o_parts")
    lse_parts = _stacked(lse_parts, "lse_parts")
    if o_parts.dim() != 5:
        raise ValueError(f"o_parts must be [N, B, H, L, D] (got shape {list(o_parts.shape)})")
    if lse_parts.shape != o_parts.shape[:4]:
        raise ValueError(f"lse_parts must be [N, B, H, L] = {list(o_parts.shape[:4])} (got "
                         f"{list(lse_parts.shape)})")
    if lse_parts.dtype != torch.float32:
        raise ValueError(f"lse_parts must be float32 (got {lse_parts.dtype})")
    if o_parts.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"o_parts must be bf16, fp16 or float32 (got {o_parts.dtype})")
    if lse_parts.device != o_parts.device:
        raise ValueError(f"lse_parts is on {lse_parts.device} and o_parts on "
                         f"{o_parts.device}: one device")
    if out_dtype is None:
        out_dtype = o_parts.dtype
        if out_dtype == torch.float32:
            raise ValueError("float32 o_parts: give out_dtype (torch.bfloat16 or "
                             "torch.float16)")
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(f"out_dtype must be torch.bfloat16 or torch.float16, not {out_dtype}")
    if o_parts.stride(-1) != 1:
        o_parts = o_parts.contiguous()
    if lse_parts.stride(-1) != 1:
        lse_parts = lse_parts.contiguous()
    return merge_op(o_parts, lse_parts, _OUT_DTYPES.index(out_dtype))


def paged_from_csr(kv_indptr, kv_indices, kv_last_page_len, page_size: int, max_pages: int):
    """FlashInfer's CSR page layout to the block table flexjit.attention
    takes, on the GPU: kv_indptr int32 [B + 1] and kv_indices int32 (sequence
    b's pages are kv_indices[kv_indptr[b]:kv_indptr[b + 1]]), kv_last_page_len
    int32 [B] (tokens in each sequence's last page, 1 to page_size). Returns
    (block_table int32 [B, max_pages], entries past a sequence's pages 0;
    seqlens_k int32 [B]). A sequence of more than max_pages pages is cut to
    max_pages (its seqlens_k counts those)."""
    for name, t in (("kv_indptr", kv_indptr), ("kv_indices", kv_indices),
                    ("kv_last_page_len", kv_last_page_len)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be an int32 tensor, not {type(t).__name__}")
        if t.dtype != torch.int32 or t.dim() != 1:
            raise ValueError(f"{name} must be a 1-D int32 tensor (got {t.dtype}, shape "
                             f"{list(t.shape)})")
        if t.device != kv_indptr.device:
            raise ValueError(f"{name} is on {t.device} and kv_indptr on {kv_indptr.device}: "
                             "one device")
    B = kv_indptr.shape[0] - 1
    if B < 1:
        raise ValueError("kv_indptr must have B + 1 >= 2 entries")
    if kv_last_page_len.shape[0] != B:
        raise ValueError(f"kv_last_page_len has {kv_last_page_len.shape[0]} entries for "
                         f"{B} sequences (kv_indptr has B + 1)")
    if page_size < 1 or max_pages < 1:
        raise ValueError(f"page_size ({page_size}) and max_pages ({max_pages}) must be >= 1")
    ins = [t if t.is_contiguous() else t.contiguous()
           for t in (kv_indptr, kv_indices, kv_last_page_len)]
    return csr_op(*ins, int(page_size), int(max_pages))
