"""flexjit: JIT-compiled FlashAttention kernels for attention variants written
as small Lua functions (FlexAttention-style mask_mod and score_mod).

    import flexjit
    spec = flexjit.Spec("examples/sliding_window.lua")
    out = flexjit.attention(q, k, v, spec, params={"window": 1024})

Everything but attention and block masks works without PyTorch (loading
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

    def block_mask(*args, **kwargs):
        raise ImportError(_TORCH_ERROR.format("block_mask"))

    BlockMask = None
else:
    from ._torch import BlockMask, attention, block_mask

__all__ = ["Spec", "SpecArg", "KernelInfo", "FlexjitError", "attention", "block_mask",
           "BlockMask", "precompile", "mount_pack", "version", "library_path", "cli_path"]
