"""Specs: a Lua mask_mod / score_mod traced into a graph (docs/lua.md), and
compiling their kernels without a GPU."""
import ctypes
import os
import threading
from collections.abc import Mapping
from typing import NamedTuple, Optional

from . import _lib, _runtime
from ._lib import lib
from ._runtime import FlexjitError


class SpecArg(NamedTuple):
    """A runtime value the spec declared: param(name, "i32"|"f32") or
    buffer(name, dtype[, {grad = true}])."""
    name: str
    kind: str        # "i32", "f32" (params) or "buffer"
    dtype: str       # "int32" or "float32": a param's type, a buffer's elements
    trainable: bool  # a buffer whose gradient the backward pass computes


class KernelInfo(NamedTuple):
    """What compiling a kernel gave: its cache key, readable name, cubin."""
    key: str
    source_key: str
    name: str
    cubin_path: str   # "" when not stored on disk
    arch: str
    kernel_template: str
    from_cache: bool  # found in memory, a pack or the disk cache
    compile_ms: float
    cubin_size: int


_KINDS = {_lib.ARG_I32: "i32", _lib.ARG_F32: "f32", _lib.ARG_BUFFER: "buffer"}
_DTYPES = {"bf16": _lib.DTYPE_BF16, "bfloat16": _lib.DTYPE_BF16,
           "fp16": _lib.DTYPE_F16, "float16": _lib.DTYPE_F16, "f16": _lib.DTYPE_F16}


class _Core:
    """One spec text: its fj_spec in each context it was used in, and what
    it declared. Never freed (the ops refer to it by id)."""

    def __init__(self, source, chunkname):
        self.source = source
        self.chunkname = chunkname
        self.handles = {}
        self.lock = threading.Lock()
        ctx = _runtime.context(0)
        handle = self.handle(ctx)
        self.name = lib.fj_spec_name(handle).decode()
        args = []
        for i in range(lib.fj_spec_num_args(handle)):
            name, kind = ctypes.c_char_p(), ctypes.c_int()
            dt, tr = _lib.DLDataType(), ctypes.c_int()
            if (lib.fj_spec_arg_info(handle, i, ctypes.byref(name), ctypes.byref(kind)) or
                    lib.fj_spec_arg_dtype(handle, i, ctypes.byref(dt)) or
                    lib.fj_spec_arg_trainable(handle, i, ctypes.byref(tr))):
                raise FlexjitError(f"{chunkname}: cannot read argument {i}")
            args.append(SpecArg(name.value.decode(), _KINDS[kind.value],
                                "int32" if dt.code == _lib.KDL_INT else "float32",
                                bool(tr.value)))
        self.args = tuple(args)
        self.params = tuple(a for a in args if a.kind != "buffer")
        self.buffers = tuple(a for a in args if a.kind == "buffer")
        self.param_names = frozenset(a.name for a in self.params)
        self.buffer_names = frozenset(a.name for a in self.buffers)
        self.trainable = tuple(a.trainable for a in self.buffers)
        # fj_spec_mask_deps's flags: whether mask_mod reads a buffer, b, h.
        deps = lib.fj_spec_mask_deps(handle)
        self.mask_reads_buffer = bool(deps & _lib.MASK_READS_BUFFER)
        self.mask_reads_b = bool(deps & _lib.MASK_READS_B)
        self.mask_reads_h = bool(deps & _lib.MASK_READS_H)
        # fj_arg name fields for launches, kept alive with the core.
        self.c_names = tuple(a.name.encode() for a in args)

    def handle(self, ctx):
        """This spec's fj_spec in ctx (loaded there on first use)."""
        h = self.handles.get(ctx.device)
        if h is not None:
            return h
        with self.lock:
            h = self.handles.get(ctx.device)
            if h is None:
                out = ctypes.c_void_p()
                src = self.source.encode()
                with ctx.lock:
                    ctx.check(lib.fj_spec_load_string(ctx.ptr, src, len(src),
                                                      self.chunkname.encode(),
                                                      ctypes.byref(out)))
                h = self.handles[ctx.device] = out.value
        return h

    def block_class(self, ints, floats, B, Hq, Hkv, Lq, Lk, q_offset, kv_offset, q0, q1,
                    kv0, kv1):
        """fj_spec_block_class with the params as values() lists them:
        "empty", "partial" or "full"."""
        arr = (_lib.Arg * max(len(self.params), 1))()
        ii, fi = iter(ints), iter(floats)
        for k, a in enumerate(self.params):
            arr[k].name = a.name.encode()
            if a.kind == "i32":
                arr[k].i32 = next(ii)
            else:
                arr[k].f32 = next(fi)
        query = _lib.BlockQuery(B, Hq, Hkv, Lq, Lk, q_offset, kv_offset, q0, q1, kv0, kv1)
        out = ctypes.c_int()
        ctx = _runtime.context(0)
        handle = self.handle(ctx)
        with ctx.lock:
            ctx.check(lib.fj_spec_block_class(handle, arr, len(self.params),
                                              ctypes.byref(query), ctypes.byref(out)))
        return _lib.BLOCK_CLASSES[out.value]

    def values(self, params, buffers, need_buffers=True):
        """params and buffers (dicts by name) as the launch lists: i32 values,
        f32 values and buffers, each in declaration order (without
        need_buffers, the buffers given, which may be none)."""
        params = params or {}
        buffers = buffers or {}
        for what, d in (("params", params), ("buffers", buffers)):
            if not isinstance(d, Mapping):
                raise TypeError(f"{what} must be a dict by name (got {type(d).__name__})")
        for n in params:
            if n not in self.param_names:
                raise ValueError(f"spec '{self.name}' declares no param named '{n}'"
                                 f" (its params: {[p.name for p in self.params]})")
        for n in buffers:
            if n not in self.buffer_names:
                raise ValueError(f"spec '{self.name}' declares no buffer named '{n}'"
                                 f" (its buffers: {[b.name for b in self.buffers]})")
        ints, floats, bufs = [], [], []
        for a in self.params:
            if a.name not in params:
                raise ValueError(f"spec '{self.name}' needs param '{a.name}' ({a.kind})")
            if a.kind == "i32":
                ints.append(int(params[a.name]))
            else:
                floats.append(float(params[a.name]))
        for a in self.buffers:
            if a.name not in buffers and not need_buffers:
                continue
            if a.name not in buffers:
                raise ValueError(f"spec '{self.name}' needs buffer '{a.name}' "
                                 f"(1-D {a.dtype} on the GPU)")
            bufs.append(buffers[a.name])
        return ints, floats, bufs


_cores = {}
_cores_by_id = []
_cores_lock = threading.Lock()


def _core(source, chunkname):
    key = (source, chunkname)
    core = _cores.get(key)
    if core is None:
        with _cores_lock:
            core = _cores.get(key)
            if core is None:
                core = _Core(source, chunkname)
                core.id = len(_cores_by_id)
                _cores_by_id.append(core)
                _cores[key] = core
    return core


def core_by_id(i):
    return _cores_by_id[i]


def _looks_like_path(s):
    return "\n" not in s and (s.endswith(".lua") or os.path.isfile(s))


class Spec:
    """An attention variant: a Lua chunk returning {mask_mod = ..., score_mod
    = ...} (docs/lua.md), traced once into a graph.

        Spec("examples/document.lua")            # a file
        Spec("return {mask_mod = causal()}")     # source text
        Spec.from_string(src, chunkname="my.lua")

    A string is read as a path when it has no newline and ends with .lua or
    names a file. Errors raise FlexjitError with `chunk:line:`. Specs of the
    same text share their traced graphs and kernels.
    """

    def __init__(self, source_or_path, chunkname: Optional[str] = None):
        if isinstance(source_or_path, os.PathLike) or (
                isinstance(source_or_path, str) and _looks_like_path(source_or_path)):
            path = os.fspath(source_or_path)
            with open(path, "r", encoding="utf-8") as f:
                source = f.read()
            chunkname = chunkname or path
        elif isinstance(source_or_path, str):
            source = source_or_path
            chunkname = chunkname or "spec"
        else:
            raise TypeError("Spec takes Lua source text or a path to a .lua file")
        self._core = _core(source, chunkname)

    @classmethod
    def from_string(cls, source: str, chunkname: str = "spec") -> "Spec":
        s = cls.__new__(cls)
        s._core = _core(source, chunkname)
        return s

    @classmethod
    def from_file(cls, path) -> "Spec":
        return cls(os.fspath(path))

    @property
    def name(self) -> str:
        """The spec's `name` field, else its chunk name."""
        return self._core.name

    @property
    def args(self):
        """The declared params and buffers (SpecArg), in declaration order."""
        return self._core.args

    @property
    def source(self) -> str:
        return self._core.source

    @property
    def mask_reads_buffer(self) -> bool:
        """Whether mask_mod reads a buffer (document ids): the kernel cannot
        then tell empty and full tiles from indices, and a block mask
        (flexjit.block_mask) is what lets it skip them."""
        return self._core.mask_reads_buffer

    def __repr__(self):
        return f"flexjit.Spec({self.name!r}, args={[a.name for a in self.args]})"

    def block_class(self, q_rows, kv_rows, *, Lq: int, Lk: int, B: int = 1, Hq: int = 1,
                    Hkv: int = 1, q_offset: int = 0, kv_offset: int = 0,
                    params=None) -> str:
        """What mask_mod allows on a block of pairs, decided on the host by the
        interval analysis the kernels skip tiles with: "empty" (no pair),
        "full" (every pair) or "partial" (some, or the analysis cannot tell;
        buffer values are not read). q_rows, kv_rows: (first, last) rows,
        inclusive, of a launch of sizes B, Hq, Hkv, Lq, Lk and offsets as
        attention()'s, for every batch index and query head; params as
        attention()'s (buffers are not needed). ring_attention skips the
        pairs this calls empty."""
        ints, floats, _ = self._core.values(params, None, need_buffers=False)
        return self._core.block_class(ints, floats, B, Hq, Hkv, Lq, Lk, q_offset, kv_offset,
                                      q_rows[0], q_rows[1], kv_rows[0], kv_rows[1])

    def compile(self, head_dim: int = 128, dtype: str = "bf16", arch: Optional[str] = None,
                kernel_template: Optional[str] = None, kind: str = "forward",
                block_mask_block_q: int = 0, device: int = 0) -> KernelInfo:
        """Compiles one kernel of this spec (or finds it in a pack or the
        cache) and returns its KernelInfo. Needs NVRTC on a miss, never a GPU
        when `arch` is given ("sm_80", "sm_90a", ...; None: the device's).
        kind: "forward", "backward", "decode" (what launches of up to 16
        query tokens run: the decode kernel's two row blocks and the LSE
        merge; the KernelInfo describes the 32-row kernel) or "blockmask"
        (the block-mask builder; head_dim and dtype do not apply)."""
        ctx = _runtime.context(device)
        h = self._core.handle(ctx)
        info = _lib.KernelInfo()
        c_arch = arch.encode() if arch else None
        with ctx.lock:
            if kind == "blockmask":
                st = lib.fj_compile_block_mask(ctx.ptr, h, c_arch, ctypes.byref(info))
            else:
                ko = _kernel_options(head_dim, dtype, c_arch, kernel_template,
                                     block_mask_block_q)
                if kind == "forward":
                    st = lib.fj_compile_forward(ctx.ptr, h, ctypes.byref(ko), ctypes.byref(info))
                elif kind == "backward":
                    st = lib.fj_compile_backward(ctx.ptr, h, ctypes.byref(ko), ctypes.byref(info))
                elif kind == "decode":
                    st = lib.fj_compile_decode(ctx.ptr, h, ctypes.byref(ko), ctypes.byref(info))
                else:
                    raise ValueError(f"kind must be 'forward', 'backward', 'decode' or "
                                     f"'blockmask', not {kind!r}")
            ctx.check(st)
        return KernelInfo(info.key.decode(), info.source_key.decode(), info.name.decode(),
                          info.cubin_path.decode(), info.arch.decode(),
                          info.kernel_template.decode(), bool(info.from_cache),
                          info.compile_ms, info.cubin_size)

    def emit_cuda(self, path, head_dim: int = 128, dtype: str = "bf16",
                  arch: Optional[str] = None, kernel_template: Optional[str] = None,
                  block_mask_block_q: int = 0, device: int = 0) -> None:
        """Writes the CUDA translation unit of the forward kernel to `path`
        (exactly what compile() hands NVRTC)."""
        ctx = _runtime.context(device)
        h = self._core.handle(ctx)
        ko = _kernel_options(head_dim, dtype, arch.encode() if arch else None,
                             kernel_template, block_mask_block_q)
        with ctx.lock:
            ctx.check(lib.fj_emit_forward_source(ctx.ptr, h, ctypes.byref(ko),
                                                 os.fspath(path).encode()))


def _kernel_options(head_dim, dtype, c_arch, kernel_template, block_mask_block_q):
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be 'bf16' or 'fp16', not {dtype!r}")
    ko = _lib.KernelOptions()
    ko.head_dim = int(head_dim)
    ko.dtype = _DTYPES[dtype]
    ko.arch = c_arch
    ko.kernel_template = kernel_template.encode() if kernel_template else None
    ko.block_mask_block_q = int(block_mask_block_q)
    return ko


def core_of(spec):
    """spec's traced graph; a TypeError that says what to pass for anything
    but a Spec (a path or Lua text, FlexAttention's functions)."""
    if not isinstance(spec, Spec):
        raise TypeError(f"spec must be a flexjit.Spec (got {type(spec).__name__}): "
                        "flexjit.Spec(path_or_lua_source) loads one")
    return spec._core
