"""PyTorch integration: flexjit.attention, flexjit.block_mask and the custom
ops behind them (docs/python.md).

Three ops, registered with torch.library: flexjit::attention_fwd (O and LSE),
flexjit::attention_bwd (dq, dk, dv and the trainable buffers' gradients) and
flexjit::block_mask (the eight FlexAttention arrays), each with a fake
implementation, and attention_fwd with its autograd formula, so torch.compile
traces them without a graph break and AOTAutograd puts the backward in the
backward graph. Their implementations call the C library through ctypes on
torch's current stream; every device allocation (outputs, LSE, the kernels'
scratch, block-mask arrays) comes from torch's allocator, so a CUDA graph can
capture them once the kernels are compiled.

Eager calls on plain CUDA tensors skip the dispatcher: the same
implementations run directly (under an autograd.Function when a gradient is
needed), since a Python custom op's dispatch costs more than the launch
itself (bench/python_overhead.py measures both).

The per-call path caches, per (context, spec, shapes, strides, dtypes), the
ctypes structs of a launch and only writes data pointers, runtime values and
the stream into them.
"""
import ctypes
import warnings
from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from . import _lib, _runtime
from ._lib import lib
from .spec import Spec, core_by_id, core_of

_DTYPES = {torch.bfloat16: (_lib.KDL_BFLOAT, 16), torch.float16: (_lib.KDL_FLOAT, 16),
           torch.float32: (_lib.KDL_FLOAT, 32), torch.int32: (_lib.KDL_INT, 32),
           torch.int64: (_lib.KDL_INT, 64), torch.float64: (_lib.KDL_FLOAT, 64)}

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", None)

BM_NAMES = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
            "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


def _stream(t):
    if not t.is_cuda:
        return None
    if _raw_stream is not None:
        return _raw_stream(t.get_device())
    return torch.cuda.current_stream(t.device).cuda_stream


def _context(t):
    return _runtime.context(max(t.get_device(), 0))


class _DL:
    """A DLTensor for tensors of one shape, strides, dtype and device: the
    launch writes only the data pointer."""
    __slots__ = ("t", "shape", "strides", "addr")

    def __init__(self, tensor):
        self.t = _lib.DLTensor()
        n = tensor.dim()
        self.shape = (ctypes.c_int64 * n)(*tensor.shape)
        self.strides = (ctypes.c_int64 * n)(*tensor.stride())
        self.t.shape = self.shape
        self.t.strides = self.strides
        self.t.ndim = n
        if tensor.is_cuda:
            self.t.device = _lib.DLDevice(_lib.KDL_CUDA, tensor.get_device())
        else:
            self.t.device = _lib.DLDevice(_lib.KDL_CPU, 0)
        code, bits = _DTYPES.get(tensor.dtype, (255, 0))
        self.t.dtype = _lib.DLDataType(code, bits, 1)
        self.addr = ctypes.addressof(self.t)


def _sig(t):
    return (t.shape, t.stride(), t.dtype, t.get_device())


class _Values:
    """The spec's fj_arg array: params and buffers in declaration order."""

    def __init__(self, core, bufs, grads=None):
        n = len(core.args)
        self.args = (_lib.Arg * n)()
        self.addr = ctypes.addressof(self.args) if n else None
        self.n = n
        self.any = n > 0
        self.ints, self.floats, self.bufs = [], [], []
        gi = 0
        bi = 0
        self.grads = []
        for i, a in enumerate(core.args):
            self.args[i].name = core.c_names[i]
            if a.kind == "i32":
                self.ints.append(self.args[i])
            elif a.kind == "f32":
                self.floats.append(self.args[i])
            else:
                d = _DL(bufs[bi])
                self.args[i].buffer = d.addr
                self.bufs.append(d)
                if grads is not None and a.trainable:
                    g = _DL(grads[gi])
                    self.args[i].grad = g.addr
                    self.grads.append(g)
                    gi += 1
                bi += 1

    def set(self, ints, floats, bufs, grads=()):
        for slot, x in zip(self.ints, ints):
            slot.i32 = x
        for slot, x in zip(self.floats, floats):
            slot.f32 = x
        for d, b in zip(self.bufs, bufs):
            d.t.data = b.data_ptr()
        for d, g in zip(self.grads, grads):
            d.t.data = g.data_ptr()


class _Forward:
    def __init__(self, core, q, k, v, o, lse, bufs, serving):
        self.q, self.k, self.v, self.o, self.lse = (_DL(x) for x in (q, k, v, o, lse))
        self.values = _Values(core, bufs)
        a = self.a = _lib.ForwardArgs()
        a.q, a.k, a.v, a.o, a.lse = (x.addr for x in (self.q, self.k, self.v, self.o, self.lse))
        a.args = self.values.addr
        a.num_args = self.values.n
        # seqlens_k, block_table, cu_seqlens_q, cu_seqlens_k: a DLTensor for
        # each one given (None: the field stays NULL).
        self.serving = None
        if serving is not None:
            self.serving = [None if t is None else _DL(t) for t in serving]
            (a.seqlens_k, a.block_table, a.cu_seqlens_q, a.cu_seqlens_k) = (
                None if d is None else d.addr for d in self.serving)
        self.addr = ctypes.addressof(a)
        # LSE [B, Hq, Lq], or [Hq, total_q] for packed queries, then the
        # workspace 256-byte aligned in the same float32 allocation.
        self.lse_shape, self.lse_strides = lse.shape, lse.stride()
        self.lse_at = (lse.numel() + 63) & ~63
        self.packed = serving is not None and serving[2] is not None
        self.ws = {}

    def workspace_bytes(self, q, cu_seqlens_q, max_seqlen_q):
        """fj_forward_workspace_size for this launch (at least 256): by the
        shapes, and for packed queries by max_seqlen_q too (the launch's Lq).
        A q of neither layout gets 256 (the library refuses it, naming q)."""
        lq = max_seqlen_q if self.packed else q.shape[2] if q.dim() == 4 else 0
        ws = self.ws.get(lq)
        if ws is None:
            if self.packed:
                B, H, D = cu_seqlens_q.shape[0] - 1, q.shape[1], q.shape[-1]
            else:
                B, H, D = q.shape[0], q.shape[1], q.shape[-1]
            n = lib.fj_forward_workspace_size(B, H, lq, D) if q.dim() >= 3 else 0
            ws = self.ws[lq] = max(256, (n + 255) & ~255)
            if len(self.ws) > 64:
                self.ws.clear()
        return ws


class _Backward:
    def __init__(self, core, ts, dlse, bufs, grads, cu):
        self.ts = [_DL(x) for x in ts]  # q, k, v, o, lse, dout, dq, dk, dv
        self.dlse = _DL(dlse) if dlse is not None else None
        self.values = _Values(core, bufs, grads)
        a = self.a = _lib.BackwardArgs()
        a.q, a.k, a.v, a.o, a.lse, a.dout, a.dq, a.dk, a.dv = (x.addr for x in self.ts)
        a.dlse = self.dlse.addr if self.dlse else None
        a.args = self.values.addr
        a.num_args = self.values.n
        # cu_seqlens_q, cu_seqlens_k of a packed batch (None: NULL).
        self.cu = [None if t is None else _DL(t) for t in cu]
        a.cu_seqlens_q, a.cu_seqlens_k = (None if d is None else d.addr for d in self.cu)
        self.addr = ctypes.addressof(a)


_CACHE_LIMIT = 256


def _cache_put(cache, key, value):
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value
    return value


def _wrap_mask(ctx, bm, bs, Lq, Lk, q_offset, kv_offset):
    """An fj_block_mask over the eight tensors bm, for a launch at q_offset,
    kv_offset (cached by their addresses and geometry: it holds nothing
    else). attention() has checked that the mask was built for those
    offsets."""
    if not bm:
        return None
    ptrs = tuple(t.data_ptr() for t in bm)
    B, H, nq = bm[0].shape
    nkv = bm[1].shape[3]
    key = (ptrs, B, H, nq, nkv, Lq, Lk, bs[0], bs[1], q_offset, kv_offset)
    cache = ctx.wrapped_masks
    h = cache.get(key)
    if h is not None:
        return h
    for name, t in zip(BM_NAMES, bm):
        if t.dtype != torch.int32 or not t.is_contiguous() or t.device != bm[0].device:
            raise ValueError(f"block mask: {name} must be a contiguous int32 tensor on "
                             f"the launch's device (got {t.dtype}, {t.device})")
    info = _lib.BlockMaskInfo(B, H, Lq, Lk, bs[0], bs[1], nq, nkv, q_offset, kv_offset)
    arr = (ctypes.c_uint64 * 8)(*ptrs)
    out = ctypes.c_void_p()
    ctx.check(lib.fj_block_mask_wrap(ctx.ptr, ctypes.byref(info), arr, ctypes.byref(out)))
    if len(cache) >= _CACHE_LIMIT:
        for old in cache.values():
            lib.fj_block_mask_destroy(old)
        cache.clear()
    cache[key] = out.value
    return out.value


def forward_impl(q: Tensor, k: Tensor, v: Tensor, spec: int, scale: float,
                 ints: List[int], floats: List[float], buffers: List[Tensor],
                 block_mask: List[Tensor], block_size: List[int],
                 seqlens_k: Optional[Tensor], block_table: Optional[Tensor],
                 cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
                 max_seqlen_q: int, max_seqlen_k: int,
                 skip_softmax_threshold: float, q_offset: int,
                 kv_offset: int) -> Tuple[Tensor, Tensor]:
    # The hot path: one flat key, two allocations, pointer writes, one call.
    dev = q.get_device()
    ctx = _runtime.context(dev if dev > 0 else 0)
    key = (spec, q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype,
           k.dtype, v.dtype, dev)
    if buffers:
        key += tuple(_sig(b) for b in buffers)
    serving = None
    if (seqlens_k is not None or block_table is not None or cu_seqlens_q is not None or
            cu_seqlens_k is not None):
        serving = (seqlens_k, block_table, cu_seqlens_q, cu_seqlens_k)
        key += tuple(None if t is None else _sig(t) for t in serving)
    o = torch.empty_like(q)
    L = ctx.forward_launches.get(key)
    if L is None:
        with ctx.lock:
            L = _new_forward(ctx, key, spec, q, k, v, o, buffers, serving)
    at = L.lse_at
    ws = L.workspace_bytes(q, cu_seqlens_q, max_seqlen_q)
    buf = torch.empty(at + ws // 4, dtype=torch.float32, device=q.device)
    lse = buf.as_strided(L.lse_shape, L.lse_strides)
    stream = _stream(q)
    with ctx.lock:
        a = L.a
        L.q.t.data = q.data_ptr()
        L.k.t.data = k.data_ptr()
        L.v.t.data = v.data_ptr()
        L.o.t.data = o.data_ptr()
        L.lse.t.data = lse.data_ptr()
        if L.values.any:
            L.values.set(ints, floats, buffers)
        if serving is not None:
            for d, t in zip(L.serving, serving):
                if d is not None:
                    d.t.data = t.data_ptr()
        a.max_seqlen_q = max_seqlen_q
        a.max_seqlen_k = max_seqlen_k
        a.skip_softmax_threshold = skip_softmax_threshold
        a.q_offset = q_offset
        a.kv_offset = kv_offset
        a.scale = scale
        a.stream = stream
        a.block_mask = _wrap_mask(ctx, block_mask, block_size, q.shape[-2], k.shape[2],
                                  q_offset, kv_offset) if block_mask else None
        a.workspace = buf.data_ptr() + at * 4
        a.workspace_bytes = ws
        st = lib.fj_attention_forward(ctx.ptr, L.handle, L.addr)
        if st:
            raise ctx.error(st)
    return o, lse


def _lse_like(q):
    """An LSE tensor of q's launch: [B, Hq, Lq], or [Hq, total_q] for packed
    q [total_q, Hq, D] (float32, contiguous); for a q of neither layout,
    which the library refuses, q's shape without its last dimension."""
    if q.dim() == 3:
        return q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return q.new_empty(tuple(q.shape[:3] if q.dim() >= 4 else q.shape[:-1]),
                       dtype=torch.float32)


def _new_forward(ctx, key, spec, q, k, v, o, buffers, serving):
    L = ctx.forward_launches.get(key)
    if L is not None:
        return L
    core = core_by_id(spec)
    L = _Forward(core, q, k, v, o, _lse_like(q), buffers, serving)
    L.handle = core.handle(ctx)
    return _cache_put(ctx.forward_launches, key, L)


def _launchable(t):
    """t, or a contiguous copy where the kernels' layout rules (contiguous
    last dimension, strides multiple of 8, 16-byte aligned) do not hold."""
    s = t.stride()
    if (s[-1] != 1 or t.data_ptr() % 16 or
            any(x % 8 for x, n in zip(s[:-1], t.shape[:-1]) if n > 1)):
        return t.contiguous()
    return t


def _deterministic(core) -> int:
    """1 where torch.use_deterministic_algorithms(True) is in force: the
    backward's deterministic mode (dq added in a fixed order). A spec with a
    trainable buffer has none (its gradient is added in no fixed order):
    refused as PyTorch refuses an op without a deterministic implementation,
    or, with warn_only=True, a warning and the default mode."""
    if not torch.are_deterministic_algorithms_enabled():
        return 0
    if not any(core.trainable):
        return 1
    msg = ("flexjit: the backward of a spec with a trainable buffer has no "
           "deterministic implementation (its gradient is added in no fixed order), "
           "but torch.use_deterministic_algorithms(True) is set")
    if torch.is_deterministic_algorithms_warn_only_enabled():
        warnings.warn(msg)
        return 0
    raise RuntimeError(msg)


def backward_impl(dout: Tensor, dlse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor,
                  out: Tensor, lse: Tensor, spec: int, scale: float, ints: List[int],
                  floats: List[float], buffers: List[Tensor], block_mask: List[Tensor],
                  block_size: List[int], cu_seqlens_q: Optional[Tensor],
                  cu_seqlens_k: Optional[Tensor], max_seqlen_q: int,
                  max_seqlen_k: int, q_offset: int,
                  kv_offset: int) -> Tuple[Tensor, Tensor, Tensor, List[Tensor]]:
    core = core_by_id(spec)
    ctx = _context(q)
    h = core.handle(ctx)
    dout = _launchable(dout)
    if dlse is not None and not dlse.is_contiguous():
        dlse = dlse.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    grads = [torch.zeros(b.shape[0], dtype=torch.float32, device=b.device)
             for b, tr in zip(buffers, core.trainable) if tr]
    if cu_seqlens_q is not None:
        # A packed batch: the launch's rows are B x Hq x max_seqlen_q, as the
        # forward sizes it.
        B, H, L, D = cu_seqlens_q.shape[0] - 1, q.shape[1], max_seqlen_q, q.shape[2]
    else:
        B, H, L, D = q.shape
    det = _deterministic(core)
    ws_bytes = lib.fj_backward_workspace_size(B, H, L, D)
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device=q.device)
    ts = (q, k, v, out, lse, dout, dq, dk, dv)
    cu = (cu_seqlens_q, cu_seqlens_k)
    key = (spec, tuple(_sig(t) for t in ts), None if dlse is None else _sig(dlse),
           tuple(_sig(b) for b in buffers), tuple(None if t is None else _sig(t) for t in cu))
    with ctx.lock:
        cache = ctx.backward_launches
        Lb = cache.get(key)
        if Lb is None:
            Lb = _cache_put(cache, key, _Backward(core, ts, dlse, buffers, grads, cu))
        for d, t in zip(Lb.ts, ts):
            d.t.data = t.data_ptr()
        if dlse is not None:
            Lb.dlse.t.data = dlse.data_ptr()
        for d, t in zip(Lb.cu, cu):
            if d is not None:
                d.t.data = t.data_ptr()
        Lb.values.set(ints, floats, buffers, grads)
        a = Lb.a
        a.scale = scale
        a.stream = _stream(q)
        a.block_mask = _wrap_mask(ctx, block_mask, block_size, q.shape[-2], k.shape[-2],
                                  q_offset, kv_offset) if block_mask else None
        a.max_seqlen_q = max_seqlen_q
        a.max_seqlen_k = max_seqlen_k
        a.q_offset = q_offset
        a.kv_offset = kv_offset
        a.workspace = ws.data_ptr()
        a.workspace_bytes = ws_bytes
        a.deterministic = det
        st = lib.fj_attention_backward(ctx.ptr, h, Lb.addr)
        if st:
            raise ctx.error(st)
    return dq, dk, dv, grads


def _mask_shapes(B, H, nq, nkv):
    return ((B, H, nq), (B, H, nq, nkv), (B, H, nq), (B, H, nq, nkv),
            (B, H, nkv), (B, H, nkv, nq), (B, H, nkv), (B, H, nkv, nq))


def _build_into(spec, arrays, B, H, q_len, kv_len, block_q, block_kv, ints, floats,
                buffers, device, q_offset=0, kv_offset=0):
    core = core_by_id(spec)
    ctx = _runtime.context(device.index or 0)
    h = core.handle(ctx)
    nq, nkv = arrays[0].shape[2], arrays[1].shape[3]
    scratch = torch.empty(B * H * nq * nkv, dtype=torch.uint8, device=device)
    values = _Values(core, buffers)
    values.set(ints, floats, buffers)
    o = _lib.BlockMaskOptions()
    lib.fj_block_mask_options_init(ctypes.byref(o))
    o.B, o.H, o.q_len, o.kv_len, o.block_q, o.block_kv = B, H, q_len, kv_len, block_q, block_kv
    o.q_offset, o.kv_offset = q_offset, kv_offset
    o.args = values.addr
    o.num_args = values.n
    o.stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else None
    ptrs = (ctypes.c_uint64 * 8)(*(t.data_ptr() for t in arrays))
    o.arrays = ptrs
    o.scratch = scratch.data_ptr()
    out = ctypes.c_void_p()
    with ctx.lock:
        ctx.check(lib.fj_block_mask_build(ctx.ptr, h, ctypes.byref(o), ctypes.byref(out)))
        # The mask borrows torch's memory: destroying it frees nothing and
        # waits for nothing; the build kernels are queued on the stream.
        lib.fj_block_mask_destroy(out.value)


def block_mask_impl(spec: int, B: int, H: int, q_len: int, kv_len: int, block_q: int,
                    block_kv: int, ints: List[int], floats: List[float],
                    buffers: List[Tensor], device: torch.device, q_offset: int = 0,
                    kv_offset: int = 0) -> List[Tensor]:
    nq, nkv = -(-q_len // block_q), -(-kv_len // block_kv)
    arrays = [torch.empty(s, dtype=torch.int32, device=device)
              for s in _mask_shapes(B, H, nq, nkv)]
    _build_into(spec, arrays, B, H, q_len, kv_len, block_q, block_kv, ints, floats,
                buffers, device, q_offset, kv_offset)
    return arrays


# ---- the custom ops ----

attention_fwd = torch.library.custom_op("flexjit::attention_fwd", mutates_args=())(
    forward_impl)
attention_bwd = torch.library.custom_op("flexjit::attention_bwd", mutates_args=())(
    backward_impl)
block_mask_op = torch.library.custom_op("flexjit::block_mask", mutates_args=())(
    block_mask_impl)


@attention_fwd.register_fake
def _(q, k, v, spec, scale, ints, floats, buffers, block_mask, block_size, seqlens_k,
      block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
      skip_softmax_threshold, q_offset, kv_offset):
    return torch.empty_like(q), _lse_like(q)


@attention_bwd.register_fake
def _(dout, dlse, q, k, v, out, lse, spec, scale, ints, floats, buffers, block_mask,
      block_size, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q_offset,
      kv_offset):
    core = core_by_id(spec)
    grads = [b.new_zeros((b.shape[0],), dtype=torch.float32)
             for b, tr in zip(buffers, core.trainable) if tr]
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), grads


@block_mask_op.register_fake
def _(spec, B, H, q_len, kv_len, block_q, block_kv, ints, floats, buffers, device,
      q_offset=0, kv_offset=0):
    nq, nkv = -(-q_len // block_q), -(-kv_len // block_kv)
    return [torch.empty(s, dtype=torch.int32, device=device)
            for s in _mask_shapes(B, H, nq, nkv)]


def _buffer_grads(spec, grads, n):
    """The trainable buffers' gradients spread over all n buffers (None for
    the others)."""
    it = iter(grads)
    return [next(it) if tr else None for tr in core_by_id(spec).trainable[:n]]


class Layout(NamedTuple):
    """The layout inputs of attention_fwd after block_size, in its order
    (a tuple, so `*layout` passes them to the op)."""
    seqlens_k: Optional[Tensor] = None
    block_table: Optional[Tensor] = None
    cu_seqlens_q: Optional[Tensor] = None
    cu_seqlens_k: Optional[Tensor] = None
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    skip_softmax_threshold: float = 0.0
    q_offset: int = 0
    kv_offset: int = 0


INFERENCE_ONLY = ("no gradient flows through attention with seqlens_k, block_table or "
                  "skip_softmax_threshold (inference only; the backward takes packed "
                  "batches, cu_seqlens): run it under torch.no_grad() or "
                  "torch.inference_mode(), or detach q, k, v and the buffers")


def _inference_only(layout):
    return (layout.seqlens_k is not None or layout.block_table is not None or
            layout.skip_softmax_threshold != 0.0)


def _setup_context(ctx, inputs, output):
    q, k, v, spec, scale, ints, floats, buffers, bm, bs = inputs[:10]
    layout = Layout(*inputs[10:])
    out, lse = output
    cu = [t for t in (layout.cu_seqlens_q, layout.cu_seqlens_k) if t is not None]
    ctx.save_for_backward(q, k, v, out, lse, *buffers, *bm, *cu)
    ctx.flexjit = (spec, scale, ints, floats, len(buffers), len(bm), bs,
                   layout.cu_seqlens_q is not None, layout.cu_seqlens_k is not None,
                   layout.max_seqlen_q, layout.max_seqlen_k, _inference_only(layout),
                   layout.q_offset, layout.kv_offset)


def _op_backward(ctx, dout, dlse):
    (spec, scale, ints, floats, nb, nm, bs, has_cq, has_ck, mq, mk, inference, q_off,
     kv_off) = ctx.flexjit
    if inference:
        raise RuntimeError("flexjit: " + INFERENCE_ONLY)
    saved = ctx.saved_tensors
    q, k, v, out, lse = saved[:5]
    buffers, bm = list(saved[5:5 + nb]), list(saved[5 + nb:5 + nb + nm])
    cu = iter(saved[5 + nb + nm:])
    cq = next(cu) if has_cq else None
    ck = next(cu) if has_ck else None
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv, grads = torch.ops.flexjit.attention_bwd.default(
        dout, dlse, q, k, v, out, lse, spec, scale, ints, floats, buffers, bm, bs, cq, ck,
        mq, mk, q_off, kv_off)
    # One entry per input, in the inputs' structure as torch.library sees
    # it: a list of tensors gets a list, a list of numbers None (or [] when
    # empty, which it cannot tell from a list of tensors).
    return (dq, dk, dv, None, None, _no_grad(ints), _no_grad(floats),
            _buffer_grads(spec, grads, nb), [None] * len(bm), _no_grad(bs)) + (None,) * 9


def _no_grad(numbers):
    return [] if not numbers else None


attention_fwd.register_autograd(_op_backward, setup_context=_setup_context)


class _Attention(torch.autograd.Function):
    """The eager path with gradients: the ops' implementations called
    directly (same formula as _op_backward)."""

    @staticmethod
    def forward(ctx, q, k, v, spec, scale, ints, floats, bm, bs, layout, *buffers):
        out, lse = forward_impl(q, k, v, spec, scale, ints, floats, list(buffers), bm, bs,
                                *layout)
        ctx.save_for_backward(q, k, v, out, lse, *buffers)
        ctx.flexjit = (spec, scale, ints, floats, bm, bs, layout)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, dlse):
        spec, scale, ints, floats, bm, bs, layout = ctx.flexjit
        if _inference_only(layout):
            raise RuntimeError("flexjit: " + INFERENCE_ONLY)
        q, k, v, out, lse, *buffers = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        dq, dk, dv, grads = backward_impl(dout, dlse, q, k, v, out, lse, spec, scale, ints,
                                          floats, buffers, bm, bs, layout.cu_seqlens_q,
                                          layout.cu_seqlens_k, layout.max_seqlen_q,
                                          layout.max_seqlen_k, layout.q_offset,
                                          layout.kv_offset)
        return (dq, dk, dv, None, None, None, None, None, None, None,
                *_buffer_grads(spec, grads, len(buffers)))


# ---- block masks ----

class BlockMask:
    """A block mask in FlexAttention's layout (docs/block_sparsity.md): int32
    tensors kv_num_blocks [B, H, nq], kv_indices [B, H, nq, nkv],
    full_kv_num_blocks, full_kv_indices, and the transposed q_num_blocks
    [B, H, nkv], q_indices [B, H, nkv, nq], full_q_num_blocks,
    full_q_indices; BLOCK_SIZE (block_q, block_kv) and seq_lengths (q_len,
    kv_len). B and H of 1 broadcast. offsets (q_offset, kv_offset): the
    whole sequence's positions it was built at (a context parallel shard's;
    docs/context_parallel.md), which a launch must share. flexjit.attention
    takes it (and FlexAttention's own BlockMask, at offsets 0)."""

    def __init__(self, arrays, block_size, seq_lengths, spec=None, offsets=(0, 0)):
        (self.kv_num_blocks, self.kv_indices, self.full_kv_num_blocks, self.full_kv_indices,
         self.q_num_blocks, self.q_indices, self.full_q_num_blocks,
         self.full_q_indices) = arrays
        self.BLOCK_SIZE = tuple(block_size)
        self.seq_lengths = tuple(seq_lengths)
        self.spec = spec
        self.offsets = tuple(offsets)

    @property
    def shape(self):
        B, H = self.kv_num_blocks.shape[:2]
        return (B, H) + self.seq_lengths

    def arrays(self):
        """The eight tensors in fj_block_mask_array order."""
        return [getattr(self, n) for n in BM_NAMES]

    def update(self, params=None, buffers=None):
        """Rebuilds the mask in place for new runtime values (the next
        batch's document ids), on the current stream; eager only."""
        core = self.spec._core
        ints, floats, bufs = _launch_values(core, params, buffers)
        B, H = self.kv_num_blocks.shape[:2]
        _build_into(core.id, self.arrays(), B, H, self.seq_lengths[0], self.seq_lengths[1],
                    self.BLOCK_SIZE[0], self.BLOCK_SIZE[1], ints, floats, bufs,
                    self.kv_num_blocks.device, *self.offsets)
        return self

    def to_flex_attention(self, mask_mod=None):
        """The same blocks as torch.nn.attention.flex_attention.BlockMask
        (mask_mod: the Python mask FlexAttention evaluates on partial
        blocks)."""
        from torch.nn.attention.flex_attention import BlockMask as FlexBlockMask
        return FlexBlockMask.from_kv_blocks(
            self.kv_num_blocks, self.kv_indices, self.full_kv_num_blocks,
            self.full_kv_indices, BLOCK_SIZE=self.BLOCK_SIZE, mask_mod=mask_mod,
            seq_lengths=self.seq_lengths)

    def __repr__(self):
        at = f", offsets={self.offsets}" if any(self.offsets) else ""
        return (f"flexjit.BlockMask(shape={self.shape}, BLOCK_SIZE={self.BLOCK_SIZE}{at}, "
                f"spec={self.spec.name if self.spec else None!r})")


def block_mask(spec: Spec, B: Optional[int], H: Optional[int], q_len: int, kv_len: int,
               params=None, buffers=None, block_size=128, device=None, *,
               q_offset: int = 0, kv_offset: int = 0) -> BlockMask:
    """Builds spec's block mask on the GPU (as FlexAttention's
    create_block_mask, without materializing the mask): B and H None or 1
    broadcast; params and buffers as flexjit.attention takes them;
    block_size an int or (block_q, block_kv); q_offset and kv_offset as
    flexjit.attention takes them (a shard of the whole sequence: the mask
    is for launches at those offsets). The arrays come from torch's
    allocator and the build runs on the current stream."""
    core = core_of(spec)
    ints, floats, bufs = _launch_values(core, params, buffers)
    bq, bkv = (block_size, block_size) if isinstance(block_size, int) else block_size
    if device is None:
        device = bufs[0].device if bufs else torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    q_offset, kv_offset = int(q_offset), int(kv_offset)
    arrays = block_mask_op(core.id, B or 1, H or 1, q_len, kv_len, bq, bkv, ints, floats,
                           bufs, device, q_offset, kv_offset)
    return BlockMask(arrays, (bq, bkv), (q_len, kv_len), spec, (q_offset, kv_offset))


def _launch_values(core, params, buffers):
    """core.values, with each buffer a tensor."""
    ints, floats, bufs = core.values(params, buffers)
    for a, b in zip(core.buffers, bufs):
        if not isinstance(b, Tensor):
            raise TypeError(f"buffer '{a.name}' must be a torch.Tensor (1-D {a.dtype} on the "
                            f"GPU; got {type(b).__name__})")
    return ints, floats, bufs


def _mask_args(m):
    if m is None:
        return [], []
    if isinstance(m, BlockMask):
        return m.arrays(), list(m.BLOCK_SIZE)
    if not all(hasattr(m, n) for n in ("kv_num_blocks", "q_num_blocks", "BLOCK_SIZE")):
        raise TypeError("block_mask must be a flexjit.BlockMask or FlexAttention's BlockMask "
                        f"(got {type(m).__name__})")
    # FlexAttention's BlockMask: full_* may be None (no full blocks).
    arrays = []
    for n in BM_NAMES:
        t = getattr(m, n, None)
        if t is None:
            like = m.kv_num_blocks if n.startswith("full_kv") else m.q_num_blocks
            t = torch.zeros_like(like if n.endswith("num_blocks") else
                                 (m.kv_indices if n.startswith("full_kv") else m.q_indices))
        if t.dtype != torch.int32:
            t = t.to(torch.int32)
        arrays.append(t.contiguous())
    bs = m.BLOCK_SIZE
    return arrays, [int(bs[0]), int(bs[1])]


# ---- attention ----

def _eager_on(device):
    """Whether work on device can call an implementation directly: a CUDA
    device, outside tracing and dispatch modes."""
    return (device.type == "cuda" and not torch.compiler.is_compiling() and
            (_dispatch_modes is None or _dispatch_modes() == 0))


def _eager(q):
    return type(q) is Tensor and _eager_on(q.device)


def _shape(t):
    return list(t.shape)


def _int32(name, t, dims, q):
    """Checks a serving index array: an int32 tensor of len(dims) dimensions
    (dims names them, for the message) on q's device."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be an int32 tensor {dims}, not {type(t).__name__}")
    if t.dtype != torch.int32:
        raise ValueError(f"{name} must be int32 (got {t.dtype}): pass "
                         f"{name}.to(torch.int32)")
    if t.dim() != len(dims.split(",")):
        raise ValueError(f"{name} must be {dims} (got shape {_shape(t)})")
    if t.device != q.device:
        raise ValueError(f"{name} is on {t.device} and q on {q.device}: one device")


def _check_serving(q, k, v, B, seqlens_k, block_table, block_mask, skip):
    """The checks the serving options share (batch size B): seqlens_k [B],
    block_table [B, max_pages] with k and v page pools, no block mask, the
    skip threshold's range."""
    if seqlens_k is not None:
        _int32("seqlens_k", seqlens_k, "[B]", q)
        if seqlens_k.shape[0] != B:
            raise ValueError(f"seqlens_k has {seqlens_k.shape[0]} entries for a batch of "
                             f"{B} sequences (it is [B])")
    if block_table is not None:
        _int32("block_table", block_table, "[B, max_pages]", q)
        if block_table.shape[0] != B:
            raise ValueError(f"block_table has {block_table.shape[0]} rows for a batch of "
                             f"{B} sequences (it is [B, max_pages])")
        if k.dim() != 4 or k.shape != v.shape:
            raise ValueError("with block_table, k and v are page pools [num_pages, "
                             f"page_size, Hkv, D] of one shape (got k {_shape(k)}, "
                             f"v {_shape(v)})")
    if block_mask is not None:
        raise ValueError("block_mask cannot be combined with seqlens_k, block_table or "
                         "cu_seqlens: the spec's mask_mod sees each sequence's own lengths")
    if not 0.0 <= skip < 1.0:
        raise ValueError(f"skip_softmax_threshold {skip} is outside [0, 1) (0: exact "
                         "attention)")


def _needs_grad(q, k, v, bufs):
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or
                                        v.requires_grad or any(b.requires_grad for b in bufs))


def _run(q, k, v, core, sc, ints, floats, bufs, bm, bs, layout):
    for b, a in zip(bufs, core.buffers):
        if b.requires_grad and not a.trainable:
            raise ValueError(f"buffer '{a.name}' requires grad, but spec '{core.name}' "
                             f"declares it without {{grad = true}}")
    if _eager(q) and _needs_grad(q, k, v, bufs):
        return _Attention.apply(q, k, v, core.id, sc, ints, floats, bm, bs, layout, *bufs)
    return run_forward(q, k, v, core.id, sc, ints, floats, bufs, bm, bs, *layout)


def run_forward(*args):
    """attention_fwd on its arguments: its implementation straight on the
    eager path (no dispatcher: _eager), else the op."""
    return forward_impl(*args) if _eager(args[0]) else attention_fwd(*args)


def run_backward(*args):
    """attention_bwd on its arguments (q third), as run_forward decides."""
    return backward_impl(*args) if _eager(args[2]) else attention_bwd(*args)


def run_block_mask(spec, B, H, q_len, kv_len, block_q, block_kv, ints, floats, buffers,
                   device, q_offset=0, kv_offset=0):
    """flexjit::block_mask's arrays, as run_forward decides (_eager_on)."""
    args = (spec, B, H, q_len, kv_len, block_q, block_kv, ints, floats, buffers, device,
            q_offset, kv_offset)
    return block_mask_impl(*args) if _eager_on(device) else block_mask_op(*args)


def attention(q: Tensor, k: Tensor, v: Tensor, spec: Spec, params=None, buffers=None,
              block_mask=None, scale: Optional[float] = None, return_lse: bool = False, *,
              seqlens_k: Optional[Tensor] = None, block_table: Optional[Tensor] = None,
              skip_softmax_threshold: float = 0.0, q_offset: int = 0, kv_offset: int = 0):
    """Attention with spec's mask_mod and score_mod, as FlexAttention's
    flex_attention: q [B, Hq, Lq, D], k and v [B, Hkv, Lk, D] (bf16 or fp16,
    contiguous last dimension, any other strides; Hq a multiple of Hkv).
    params: {name: number} for the spec's param()s; buffers: {name: 1-D CUDA
    tensor} for its buffer()s (a trainable one gets a gradient). block_mask:
    flexjit.block_mask's or FlexAttention's. scale: None is 1/sqrt(D).
    Returns O (shaped and strided like q), and LSE [B, Hq, Lq] (float32,
    natural log) with return_lse. Runs on torch's current stream.

    Serving (inference only: no gradient flows through these): seqlens_k,
    int32 [B], the kv length of each sequence (kv positions [0, seqlens_k[b])
    are attended, and the spec sees Lk = seqlens_k[b]); block_table, int32
    [B, max_pages], makes k and v page pools [num_pages, page_size, Hkv, D]
    (page_size a multiple of 16, at most 256; Lk = max_pages x page_size,
    seqlens_k the lengths in use); skip_softmax_threshold in [0, 1), 0 exact,
    else Skip Softmax's approximation. Up to 16 query tokens run the decode
    kernel.

    Context parallel shards (docs/context_parallel.md): q_offset and
    kv_offset, the positions of q's and k's first rows in the whole
    sequence; the spec sees q + q_offset and kv + kv_offset, so a shard of a
    causal, sliding-window or document mask is masked as in the whole
    (buffers indexed by position cover the whole sequence). Differentiable;
    a block mask must be flexjit.block_mask's at the same offsets; not with
    a spec that reads Lq or Lk."""
    core = core_of(spec)
    ints, floats, bufs = _launch_values(core, params, buffers)
    bm, bs = _mask_args(block_mask)
    sc = 0.0 if scale is None else float(scale)
    layout = Layout()
    if seqlens_k is not None or block_table is not None or skip_softmax_threshold:
        skip = float(skip_softmax_threshold)
        if q.dim() != 4:
            raise ValueError(f"q must be [B, Hq, Lq, D] (got shape {_shape(q)}); packed "
                             "queries [total_q, Hq, D] go to flexjit.varlen_attention")
        _check_serving(q, k, v, q.shape[0], seqlens_k, block_table, block_mask, skip)
        if _needs_grad(q, k, v, bufs):
            raise ValueError(INFERENCE_ONLY)
        layout = Layout(seqlens_k, block_table, skip_softmax_threshold=skip)
    if q_offset or kv_offset:
        q_offset, kv_offset = int(q_offset), int(kv_offset)
        if q_offset < 0 or kv_offset < 0:
            raise ValueError(f"q_offset ({q_offset}) and kv_offset ({kv_offset}) must be >= 0")
        layout = layout._replace(q_offset=q_offset, kv_offset=kv_offset)
    if block_mask is not None:
        at = getattr(block_mask, "offsets", (0, 0))
        if tuple(at) != (int(q_offset), int(kv_offset)):
            raise ValueError(f"the block mask was built at q_offset, kv_offset {tuple(at)}, the "
                             f"call has ({q_offset}, {kv_offset}): build it with "
                             "flexjit.block_mask(..., q_offset=, kv_offset=) at the call's")
    out, lse = _run(q, k, v, core, sc, ints, floats, bufs, bm, bs, layout)
    return (out, lse) if return_lse else out


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, spec: Spec, cu_seqlens_q: Tensor,
                     cu_seqlens_k: Optional[Tensor], max_seqlen_q: int,
                     max_seqlen_k: Optional[int], params=None, buffers=None,
                     scale: Optional[float] = None, return_lse: bool = False, *,
                     seqlens_k: Optional[Tensor] = None, block_table: Optional[Tensor] = None,
                     skip_softmax_threshold: float = 0.0):
    """Attention over a packed batch of variable-length sequences, as
    FlashAttention's flash_attn_varlen_func: q [total_q, Hq, D], sequence b's
    queries rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 (int32 [B + 1],
    nondecreasing from 0); k and v [total_k, Hkv, D] split by cu_seqlens_k
    likewise. max_seqlen_q, max_seqlen_k: at least the longest sequence
    (they size the grid). Each sequence is attended on its own: the spec's
    mask_mod and score_mod see its b, positions from 0 and its own Lq and Lk,
    so a packed batch needs no document mask.

    cu_seqlens_k None (max_seqlen_k None or 0): k and v are [B, Hkv, Lk, D],
    or page pools [num_pages, page_size, Hkv, D] with block_table (a chunked
    prefill into a paged cache), seqlens_k giving the kv lengths. Those and
    skip_softmax_threshold are inference only, as in flexjit.attention; a
    packed batch alone is differentiable (the backward takes cu_seqlens).

    Returns O [total_q, Hq, D], and LSE [Hq, total_q] (float32) with
    return_lse."""
    core = core_of(spec)
    ints, floats, bufs = _launch_values(core, params, buffers)
    sc = 0.0 if scale is None else float(scale)
    skip = float(skip_softmax_threshold)
    if q.dim() != 3:
        raise ValueError(f"q must be packed [total_q, Hq, D] (got shape {_shape(q)})")
    _int32("cu_seqlens_q", cu_seqlens_q, "[B + 1]", q)
    B = cu_seqlens_q.shape[0] - 1
    if B < 1:
        raise ValueError("cu_seqlens_q must have B + 1 >= 2 entries (offsets from 0)")
    if max_seqlen_q < 1:
        raise ValueError(f"max_seqlen_q is {max_seqlen_q}: it must be at least the longest "
                         "query sequence (>= 1)")
    if cu_seqlens_k is not None:
        _int32("cu_seqlens_k", cu_seqlens_k, "[B + 1]", q)
        if cu_seqlens_k.shape[0] != B + 1:
            raise ValueError(f"cu_seqlens_k has {cu_seqlens_k.shape[0]} entries and "
                             f"cu_seqlens_q {B + 1}: both are [B + 1]")
        if max_seqlen_k is None or max_seqlen_k < 1:
            raise ValueError(f"max_seqlen_k is {max_seqlen_k}: with cu_seqlens_k it must be "
                             "at least the longest key/value sequence (>= 1)")
        if seqlens_k is not None or block_table is not None:
            raise ValueError("cu_seqlens_k cannot be combined with seqlens_k or block_table: "
                             "with paged or [B, Hkv, Lk, D] k and v, pass cu_seqlens_k=None "
                             "and the kv lengths as seqlens_k")
        if k.dim() != 3 or v.dim() != 3:
            raise ValueError(f"with cu_seqlens_k, k and v are packed [total_k, Hkv, D] (got "
                             f"k {_shape(k)}, v {_shape(v)})")
    else:
        if max_seqlen_k:
            raise ValueError(f"max_seqlen_k is {max_seqlen_k} but cu_seqlens_k is None: it "
                             "sizes packed k and v only (pass None or 0)")
        max_seqlen_k = 0
        if k.dim() != 4 or v.dim() != 4:
            raise ValueError("without cu_seqlens_k, k and v are [B, Hkv, Lk, D] or page "
                             f"pools with block_table (got k {_shape(k)}, v {_shape(v)})")
    _check_serving(q, k, v, B, seqlens_k, block_table, None, skip)
    layout = Layout(seqlens_k, block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                     max_seqlen_k, skip)
    if _inference_only(layout) and _needs_grad(q, k, v, bufs):
        raise ValueError(INFERENCE_ONLY)
    out, lse = _run(q, k, v, core, sc, ints, floats, bufs, [], [], layout)
    return (out, lse) if return_lse else out
