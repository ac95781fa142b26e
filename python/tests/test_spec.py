"""The package without PyTorch or a GPU: loading specs and their errors,
compiling kernels for named targets, precompiling packs and mounting them."""
import os
import subprocess
import sys
import textwrap

import pytest

import flexjit
from conftest import REPO, example


def test_version_matches_header():
    header = open(os.path.join(REPO, "include", "flexjit.h")).read()
    assert f'#define FJ_VERSION_STRING "{flexjit.__version__}"' in header
    assert os.path.exists(flexjit.library_path())


def test_spec_from_file_and_string():
    s = flexjit.Spec(example("sliding_window.lua"))
    assert s.name == "sliding_window"
    assert s.args == (flexjit.SpecArg("window", "i32", "int32", False),)
    t = flexjit.Spec("return { mask_mod = causal() }")
    assert t.name == "spec"  # no name field: the chunk name
    u = flexjit.Spec.from_string("return { name = 'c', mask_mod = causal() }", "c.lua")
    assert u.name == "c" and u.args == ()
    d = flexjit.Spec(example("document.lua"))
    assert [(a.name, a.kind, a.dtype) for a in d.args] == [("doc", "buffer", "int32")]
    assert d.mask_reads_buffer and not s.mask_reads_buffer
    bias = flexjit.Spec(os.path.join(REPO, "bench", "specs", "rel_bias.lua"))
    assert not bias.mask_reads_buffer  # its buffer is read by score_mod alone


def test_trainable_buffer():
    s = flexjit.Spec.from_string(textwrap.dedent("""
        local scale = param("scale", "f32")
        local bias = buffer("bias", "f32", {grad = true})
        local ids = buffer("ids", "i32")
        return { mask_mod = causal(),
                 score_mod = function(score, b, h, q, kv)
                   return score * scale + bias[ids[kv]] end }
        """), "bias.lua")
    assert [(a.name, a.kind, a.trainable) for a in s.args] == [
        ("scale", "f32", False), ("bias", "buffer", True), ("ids", "buffer", False)]


def test_block_class():
    """Spec.block_class: the host's interval analysis on blocks of pairs, with
    offsets, params (an f32 one beside), a buffer's mask decided by its index
    part, and its errors."""
    c = flexjit.Spec(example("causal.lua"))
    assert c.block_class((0, 99), (100, 199), Lq=1000, Lk=1000) == "empty"
    assert c.block_class((100, 199), (0, 99), Lq=1000, Lk=1000, B=2, Hq=8, Hkv=2) == "full"
    assert c.block_class((0, 99), (0, 99), Lq=100, Lk=100) == "partial"
    assert c.block_class((0, 99), (0, 99), Lq=100, Lk=100, q_offset=100) == "full"
    assert c.block_class((0, 99), (0, 99), Lq=100, Lk=100, kv_offset=100) == "empty"
    w = flexjit.Spec.from_string(textwrap.dedent("""
        local window, t = param("window", "i32"), param("t", "f32")
        return { mask_mod = sliding_window(window),
                 score_mod = function(s, b, h, q, kv) return s * t end }
        """), "window.lua")
    args = dict(Lq=100, Lk=100, q_offset=1000)
    assert w.block_class((0, 99), (0, 99), params={"window": 50, "t": 0.5}, **args) == "empty"
    assert w.block_class((0, 99), (0, 99), params={"window": 2000, "t": 0.5}, **args) == "full"
    d = flexjit.Spec(example("document.lua"))
    assert d.block_class((0, 9), (10, 19), Lq=20, Lk=20) == "empty"
    assert d.block_class((10, 19), (0, 9), Lq=20, Lk=20) == "partial"
    with pytest.raises(ValueError, match="needs param 'window'"):
        w.block_class((0, 9), (0, 9), Lq=10, Lk=10, params={"t": 1.0})
    with pytest.raises(flexjit.FlexjitError, match=r"outside Lq 10"):
        c.block_class((0, 10), (0, 9), Lq=10, Lk=10)


def test_errors_carry_chunk_and_line():
    bad = "return {\n  mask_mod = function(b, h, q, kv)\n    return q < kv\n  end }\n"
    with pytest.raises(flexjit.FlexjitError) as e:
        flexjit.Spec.from_string(bad, "spec.lua")
    assert str(e.value).startswith("spec.lua:3:")
    assert "lt(" in str(e.value)
    assert e.value.status_name == "FJ_ELUA"
    with pytest.raises(flexjit.FlexjitError) as e:
        flexjit.Spec.from_string("return { mask_mod = causal( }", "syntax.lua")
    assert str(e.value).startswith("syntax.lua:1:")
    with pytest.raises(FileNotFoundError):
        flexjit.Spec("/nonexistent/spec.lua")
    with pytest.raises(TypeError):
        flexjit.Spec(42)


def test_compile_for_named_targets():
    s = flexjit.Spec(example("causal.lua"))
    a = s.compile(head_dim=64, dtype="bf16", arch="sm_80")
    assert a.arch == "sm_80" and a.kernel_template == "sm80"
    assert len(a.key) == 32 and a.cubin_size > 0 and a.name.startswith("fj_fwd_causal")
    assert os.path.exists(a.cubin_path)
    again = s.compile(head_dim=64, dtype="bf16", arch="sm_80")
    assert again.from_cache and again.key == a.key
    h = s.compile(head_dim=128, dtype="fp16", arch="sm_90a")
    assert h.kernel_template == "sm90" and h.key != a.key
    b = s.compile(head_dim=64, arch="sm_80", kind="backward")
    assert b.cubin_size > 0 and b.key not in (a.key, h.key)
    m = flexjit.Spec(example("document.lua")).compile(arch="sm_90a", kind="blockmask")
    assert m.name.startswith("fj_blockmask_")
    d = s.compile(head_dim=64, arch="sm_80", kind="decode")
    assert d.name.startswith("fj_dec_causal_d64_bf16") and d.cubin_size > 0
    assert d.key not in (a.key, b.key)


def test_compile_errors():
    s = flexjit.Spec(example("causal.lua"))
    with pytest.raises(flexjit.FlexjitError) as e:
        s.compile(head_dim=96, arch="sm_80")
    assert "96" in str(e.value) and e.value.status_name == "FJ_EUNSUPPORTED"
    with pytest.raises(flexjit.FlexjitError) as e:
        s.compile(head_dim=64, arch="sm_70")
    assert "sm_70" in str(e.value)
    with pytest.raises(ValueError):
        s.compile(dtype="fp32", arch="sm_80")
    with pytest.raises(ValueError, match="'decode'"):
        s.compile(arch="sm_80", kind="sideways")


def test_emit_cuda(tmp_path):
    out = tmp_path / "sw.cu"
    flexjit.Spec(example("sliding_window.lua")).emit_cuda(out, head_dim=64, arch="sm_80")
    text = out.read_text()
    assert "fj_attention_fwd" in text and "FJ_HEAD_DIM 64" in text


def test_runtime_values_checked():
    core = flexjit.Spec(example("sliding_window.lua"))._core
    assert core.values({"window": 7}, None) == ([7], [], [])
    with pytest.raises(ValueError, match="needs param 'window'"):
        core.values({}, None)
    with pytest.raises(ValueError, match="no param named 'widow'"):
        core.values({"window": 1, "widow": 2}, None)
    with pytest.raises(ValueError, match="no buffer named 'window'"):
        core.values({"window": 1}, {"window": object()})


_PACK_CHECK = textwrap.dedent("""
    import sys, flexjit
    pack = sys.argv[1]
    s = flexjit.Spec(sys.argv[2])
    kind = sys.argv[3]
    if pack != "-":
        flexjit.mount_pack(pack)
    try:
        k = s.compile(head_dim=64, dtype="bf16", arch="sm_80", kind=kind)
        print("found", k.from_cache, k.name)
    except flexjit.FlexjitError as e:
        print("error", e.status_name, e)
    """)


def _run_without_nvrtc(tmp_path, pack, spec, kind="forward"):
    env = dict(os.environ, FLEXJIT_NVRTC="/nonexistent/libnvrtc.so",
               FLEXJIT_CACHE_DIR=str(tmp_path / "empty-cache"))
    r = subprocess.run([sys.executable, "-c", _PACK_CHECK, pack, spec, kind], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_precompile_pack_and_mount(tmp_path):
    pack = tmp_path / "kernels.fjpack"
    spec = example("prefix_lm.lua")
    out = flexjit.precompile([flexjit.Spec(spec)], pack, head_dims=[64], archs=["sm_80"],
                             passes=["forward"], jobs=2)
    assert out == str(pack) and pack.stat().st_size > 0
    # A machine without NVRTC: the kernel comes from the pack, and without
    # the pack the error names the kernel.
    assert _run_without_nvrtc(tmp_path, str(pack), spec).startswith(
        "found True fj_fwd_prefix_lm_d64_bf16_sm80")
    missing = _run_without_nvrtc(tmp_path, "-", spec)
    assert missing.startswith("error") and "fj_fwd_prefix_lm_d64_bf16_sm80" in missing


def test_precompile_decode_pass_to_pack(tmp_path):
    """The decode pass: what launches of up to 16 query tokens run, found in
    the pack on a machine without NVRTC."""
    pack = tmp_path / "decode.fjpack"
    spec = example("prefix_lm.lua")
    flexjit.precompile([spec], pack, head_dims=[64], archs=["sm_80"], passes=["decode"])
    assert _run_without_nvrtc(tmp_path, "-", spec, "decode").startswith("error")
    assert _run_without_nvrtc(tmp_path, str(pack), spec, "decode").startswith(
        "found True fj_dec_prefix_lm_d64_bf16")


def test_precompile_manifest_to_directory(tmp_path):
    (tmp_path / "causal.lua").write_text(open(example("causal.lua")).read())
    (tmp_path / "m.lua").write_text('return { specs = {"causal.lua"}, head_dims = {64},\n'
                                    '  dtypes = {"bf16"}, archs = {"sm_80"} }\n')
    cache = tmp_path / "cache"
    flexjit.precompile(tmp_path / "m.lua", cache)
    cubins = [f for _, _, fs in os.walk(cache) for f in fs if f.endswith(".cubin")]
    assert len(cubins) == 1


def test_precompile_errors(tmp_path):
    (tmp_path / "bad.lua").write_text("return {\n  mask_mod = function(b, h, q, kv)\n"
                                      "    return q < kv\n  end }\n")
    (tmp_path / "m.lua").write_text('return { specs = {"bad.lua"}, head_dims = {64},\n'
                                    '  dtypes = {"bf16"}, archs = {"sm_80"} }\n')
    with pytest.raises(flexjit.FlexjitError, match="bad.lua:3:"):
        flexjit.precompile(tmp_path / "m.lua", tmp_path / "out.fjpack")
    with pytest.raises(flexjit.FlexjitError):
        flexjit.mount_pack(tmp_path / "missing.fjpack")


def test_attention_without_torch_says_so():
    try:
        import torch  # noqa: F401
    except ImportError:
        for name in ("attention", "varlen_attention", "block_mask", "merge_states",
                     "paged_from_csr"):
            with pytest.raises(ImportError, match=f"flexjit.{name} needs PyTorch"):
                getattr(flexjit, name)(None, None, None, None)
    else:
        pytest.skip("PyTorch is installed")
