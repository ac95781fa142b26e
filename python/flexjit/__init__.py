"""flexjit: JIT-compiled FlashAttention kernels for attention variants written
as small Lua functions (FlexAttention-style mask_mod and score_mod).

    import flexjit
    spec = flexjit.Spec("examples/sliding_window.lua")
    out = flexjit.attention(q, k, v, spec, params={"window": 1024})

Everything but attention, block masks and the serving utilities
(merge_states, paged_from_csr) works without PyTorch (loading
specs, compiling and caching kernels for any target, precompiling, packs).
docs/python.md has the whole API.
"""
from ._lib import library_path
from ._runtime import FlexjitError, mount_pack, version
from .precompile import cli_path, precompile
from .spec import KernelInfo, Spec, SpecArg

__version__ = version()

try:
    import torch  # noqa: F401
except ImportError:
    _TORCH_ERROR = "flexjit.{} needs PyTorch (pip install torch)"

    def attention(*args, **kwargs):
        raise ImportError(_TORCH_ERROR.format("attention"))

    def _needs_torch(name):
        def f(*args, **kwargs):
            raise ImportError(_TORCH_ERROR.format(name))
        f.__name__ = name
        return f

    attention = _needs_torch("attention")
    varlen_attention = _needs_torch("varlen_attention")
    block_mask = _needs_torch("block_mask")
    merge_states = _needs_torch("merge_states")
    paged_from_csr = _needs_torch("paged_from_csr")
    ring_attention = _needs_torch("ring_attention")
    BlockMask = None
else:
    from ._ring import ring_attention
    from ._serving import merge_states, paged_from_csr
    from ._torch import BlockMask, attention, block_mask, varlen_attention

__all__ = ["Spec", "SpecArg", "KernelInfo", "FlexjitError", "attention", "varlen_attention",
           "block_mask", "BlockMask", "merge_states", "paged_from_csr", "ring_attention",
           "precompile",
           "mount_pack", "version", "library_path", "cli_path"]
