"""ctypes bindings of include/flexjit.h: the library, its structs and functions.

The shared library is the package's own libflexjit.so (the wheel puts it beside
this file), or the file $FLEXJIT_LIBRARY names (a build tree's, for
development). Struct layouts mirror the header field by field;
python/tests/test_abi.py compiles a C program against the header and checks
every size and offset.
"""
import ctypes
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_double,
                    c_float, c_int, c_int32, c_int64, c_size_t, c_uint, c_uint8,
                    c_uint16, c_uint64, c_void_p)

# DLPack (v0.6, the version include/flexjit.h is built against).
KDL_CPU = 1
KDL_CUDA = 2
KDL_INT = 0
KDL_FLOAT = 2
KDL_BFLOAT = 4


class DLDevice(Structure):
    _fields_ = [("device_type", c_int), ("device_id", c_int)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int),
                ("dtype", DLDataType), ("shape", POINTER(c_int64)),
                ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


LOG_FN = CFUNCTYPE(None, c_void_p, c_int, c_char_p)


class ContextOptions(Structure):
    _fields_ = [("cache_dir", c_char_p), ("device", c_int), ("arch", c_char_p),
                ("cache_max_bytes", c_uint64), ("kernel_template", c_char_p),
                ("log", LOG_FN), ("log_user", c_void_p)]


# fj_arg_kind
ARG_I32, ARG_F32, ARG_BUFFER = 0, 1, 2
# fj_dtype
DTYPE_BF16, DTYPE_F16 = 0, 1


class Arg(Structure):
    _fields_ = [("name", c_char_p), ("i32", c_int32), ("f32", c_float),
                ("buffer", c_void_p), ("grad", c_void_p)]


class KernelOptions(Structure):
    _fields_ = [("head_dim", c_int), ("dtype", c_int), ("arch", c_char_p),
                ("kernel_template", c_char_p), ("block_mask_block_q", c_int),
                ("deterministic", c_int), ("varlen", c_int),
                ("skip_softmax", c_int), ("long_rows", c_int)]


class KernelInfo(Structure):
    _fields_ = [("key", c_char * 33), ("source_key", c_char * 33),
                ("name", c_char * 96), ("cubin_path", c_char * 1024),
                ("arch", c_char * 16), ("kernel_template", c_char * 16),
                ("from_cache", c_int), ("compile_ms", c_double),
                ("cubin_size", c_size_t)]


class ForwardArgs(Structure):
    _fields_ = [("q", c_void_p), ("k", c_void_p), ("v", c_void_p), ("o", c_void_p),
                ("lse", c_void_p), ("scale", c_float), ("args", c_void_p),
                ("num_args", c_int), ("stream", c_void_p), ("block_mask", c_void_p),
                ("workspace", c_void_p), ("workspace_bytes", c_size_t),
                ("seqlens_k", c_void_p), ("block_table", c_void_p),
                ("cu_seqlens_q", c_void_p), ("cu_seqlens_k", c_void_p),
                ("max_seqlen_q", c_int), ("max_seqlen_k", c_int),
                ("skip_softmax_threshold", c_float),
                ("q_offset", c_int64), ("kv_offset", c_int64)]


class BackwardArgs(Structure):
    _fields_ = [("q", c_void_p), ("k", c_void_p), ("v", c_void_p), ("o", c_void_p),
                ("lse", c_void_p), ("dout", c_void_p), ("dlse", c_void_p),
                ("dq", c_void_p), ("dk", c_void_p), ("dv", c_void_p),
                ("scale", c_float), ("args", c_void_p), ("num_args", c_int),
                ("block_mask", c_void_p), ("workspace", c_void_p),
                ("workspace_bytes", c_size_t), ("deterministic", c_int),
                ("stream", c_void_p), ("cu_seqlens_q", c_void_p),
                ("cu_seqlens_k", c_void_p), ("max_seqlen_q", c_int),
                ("max_seqlen_k", c_int),
                ("q_offset", c_int64), ("kv_offset", c_int64)]


class MergeArgs(Structure):
    _fields_ = [("o_parts", c_void_p), ("lse_parts", c_void_p), ("o", c_void_p),
                ("lse", c_void_p), ("stream", c_void_p)]


class BlockQuery(Structure):
    _fields_ = [(n, c_int64) for n in ("B", "Hq", "Hkv", "Lq", "Lk", "q_offset", "kv_offset",
                                        "q0", "q1", "kv0", "kv1")]


# fj_spec_block_class's classes, by value
BLOCK_CLASSES = ("empty", "partial", "full")
MASK_READS_BUFFER, MASK_READS_B, MASK_READS_H = 1, 2, 4  # fj_mask_dep
# The header's enum values mirrored here (tests/test_abi.py checks them).
CONSTANTS = {"FJ_MASK_READS_BUFFER": MASK_READS_BUFFER, "FJ_MASK_READS_B": MASK_READS_B,
             "FJ_MASK_READS_H": MASK_READS_H}


class PagedCsrArgs(Structure):
    _fields_ = [("kv_indptr", c_void_p), ("kv_indices", c_void_p),
                ("kv_last_page_len", c_void_p), ("page_size", c_int),
                ("block_table", c_void_p), ("seqlens_k", c_void_p),
                ("stream", c_void_p)]


BM_NUM_ARRAYS = 8


class BlockMaskOptions(Structure):
    _fields_ = [("B", c_int), ("H", c_int), ("q_len", c_int), ("kv_len", c_int),
                ("block_q", c_int), ("block_kv", c_int), ("args", c_void_p),
                ("num_args", c_int), ("stream", c_void_p),
                ("arrays", POINTER(c_uint64)), ("scratch", c_uint64),
                ("q_offset", c_int), ("kv_offset", c_int)]


class BlockMaskInfo(Structure):
    _fields_ = [("B", c_int), ("H", c_int), ("q_len", c_int), ("kv_len", c_int),
                ("block_q", c_int), ("block_kv", c_int), ("num_q_blocks", c_int),
                ("num_kv_blocks", c_int), ("q_offset", c_int), ("kv_offset", c_int)]


STRUCTS = {
    "DLTensor": DLTensor, "fj_context_options": ContextOptions, "fj_arg": Arg,
    "fj_kernel_options": KernelOptions, "fj_kernel_info": KernelInfo,
    "fj_forward_args": ForwardArgs, "fj_backward_args": BackwardArgs,
    "fj_block_mask_options": BlockMaskOptions, "fj_block_mask_info": BlockMaskInfo,
    "fj_merge_args": MergeArgs, "fj_paged_csr_args": PagedCsrArgs,
    "fj_block_query": BlockQuery,
}

# name: (restype, argtypes)
_PROTOTYPES = {
    "fj_version_number": (c_uint, []),
    "fj_spec_mask_deps": (c_uint, [c_void_p]),
    "fj_version_string": (c_char_p, []),
    "fj_status_name": (c_char_p, [c_int]),
    "fj_context_options_init": (None, [c_void_p]),
    "fj_context_create": (c_int, [c_void_p, POINTER(c_void_p)]),
    "fj_context_destroy": (None, [c_void_p]),
    "fj_context_mount_pack": (c_int, [c_void_p, c_char_p]),
    "fj_context_last_error": (c_char_p, [c_void_p]),
    "fj_spec_load_string": (c_int, [c_void_p, c_char_p, c_size_t, c_char_p,
                                    POINTER(c_void_p)]),
    "fj_spec_destroy": (None, [c_void_p]),
    "fj_spec_name": (c_char_p, [c_void_p]),
    "fj_spec_num_args": (c_int, [c_void_p]),
    "fj_spec_arg_info": (c_int, [c_void_p, c_int, POINTER(c_char_p), POINTER(c_int)]),
    "fj_spec_arg_dtype": (c_int, [c_void_p, c_int, POINTER(DLDataType)]),
    "fj_spec_arg_trainable": (c_int, [c_void_p, c_int, POINTER(c_int)]),
    "fj_spec_block_class": (c_int, [c_void_p, c_void_p, c_int, POINTER(BlockQuery),
                                    POINTER(c_int)]),
    "fj_compile_forward": (c_int, [c_void_p, c_void_p, c_void_p, c_void_p]),
    "fj_compile_backward": (c_int, [c_void_p, c_void_p, c_void_p, c_void_p]),
    "fj_compile_block_mask": (c_int, [c_void_p, c_void_p, c_char_p, c_void_p]),
    "fj_compile_decode": (c_int, [c_void_p, c_void_p, c_void_p, c_void_p]),
    "fj_emit_forward_source": (c_int, [c_void_p, c_void_p, c_void_p, c_char_p]),
    "fj_attention_forward": (c_int, [c_void_p, c_void_p, c_void_p]),
    "fj_attention_backward": (c_int, [c_void_p, c_void_p, c_void_p]),
    "fj_merge_states": (c_int, [c_void_p, c_void_p]),
    "fj_paged_from_csr": (c_int, [c_void_p, c_void_p]),
    "fj_forward_workspace_size": (c_size_t, [c_int64, c_int64, c_int64, c_int64]),
    "fj_backward_workspace_size": (c_size_t, [c_int64, c_int64, c_int64, c_int64]),
    "fj_block_mask_options_init": (None, [c_void_p]),
    "fj_block_mask_build": (c_int, [c_void_p, c_void_p, c_void_p, POINTER(c_void_p)]),
    "fj_block_mask_wrap": (c_int, [c_void_p, c_void_p, c_void_p, POINTER(c_void_p)]),
    "fj_block_mask_destroy": (None, [c_void_p]),
}


def library_path():
    """The libflexjit.so this package loads: $FLEXJIT_LIBRARY, else the
    package's own."""
    env = os.environ.get("FLEXJIT_LIBRARY")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libflexjit.so")


def _load():
    path = library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(
            f"flexjit: cannot load {path} ({e}); install the package with pip "
            "(it builds the library) or point FLEXJIT_LIBRARY at a built "
            "libflexjit.so") from None
    for name, (res, args) in _PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    return lib


lib = _load()
