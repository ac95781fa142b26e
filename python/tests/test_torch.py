"""The PyTorch integration without a GPU: the custom ops' schemas and fake
implementations, autograd through them, and torch.compile (fullgraph, so a
graph break fails) of a model calling flexjit.attention. The ops' CUDA
implementations need a GPU (test_gpu.py); here CPU kernels computing dense
attention from the specs' Python twins (reference.py) stand in for them, so
everything around the kernels is exercised as it runs on the GPU."""
import pytest

torch = pytest.importorskip("torch")

import flexjit  # noqa: E402
from flexjit import _torch as fjt  # noqa: E402
from flexjit.spec import core_by_id  # noqa: E402

from conftest import example  # noqa: E402
from reference import dense_attention, dense_backward, example_mods  # noqa: E402

BIAS_SPEC = """
local bias = buffer("bias", "f32", {grad = true})
return { name = "trainable_bias", mask_mod = causal(),
         score_mod = function(score, b, h, q, kv) return score + bias[kv] end }
"""


def _mods(core, q, k, buffers, ints):
    if core.name == "trainable_bias":
        bias = buffers[0]
        return (lambda b, h, qi, ki: qi >= ki), (lambda s, b, h, qi, ki: s + bias[ki])
    name = {"sliding_window": "sliding_window", "causal": "causal"}[core.name]
    mask, score, _, _ = example_mods(name, q.shape[1], q.shape[2], k.shape[2], q.device)
    if name == "sliding_window":
        w = ints[0]
        mask = lambda b, h, qi, ki: (qi >= ki) & (qi - ki < w)  # noqa: E731
    return mask, score


def _cpu_fwd(q, k, v, spec, scale, ints, floats, buffers, block_mask, block_size, *serving):
    mask, score = _mods(core_by_id(spec), q, k, buffers, ints)
    with torch.no_grad():
        o, lse = dense_attention(q.double(), k.double(), v.double(), mask, score,
                                 scale or None)
    return torch.empty_like(q).copy_(o), lse.float().contiguous()


def _cpu_bwd(dout, dlse, q, k, v, out, lse, spec, scale, ints, floats, buffers, block_mask,
             block_size, *varlen):
    core = core_by_id(spec)
    mask, score = _mods(core, q, k, [b.double() for b in buffers], ints)
    dq, dk, dv, ds = dense_backward(q.double(), k.double(), v.double(), dout.double(),
                                    None if dlse is None else dlse.double(), mask, score,
                                    scale or None)
    # The one trainable buffer of these tests is a bias on kv: its gradient
    # sums dS' over everything but kv.
    grads = [ds.sum((0, 1, 2)).float() for tr in core.trainable if tr]
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), grads


torch.library.register_kernel("flexjit::attention_fwd", "cpu", _cpu_fwd)
torch.library.register_kernel("flexjit::attention_bwd", "cpu", _cpu_bwd)


def _inputs(B=2, Hq=4, Hkv=2, L=48, D=16, grad=True):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, h, L, D, generator=g, dtype=torch.bfloat16).requires_grad_(grad)
               for h in (Hq, Hkv, Hkv))
    return q, k, v


def test_ops_and_schemas():
    for name in ("attention_fwd", "attention_bwd", "block_mask"):
        assert hasattr(torch.ops.flexjit, name)
    s = str(torch.ops.flexjit.attention_bwd.default._schema)
    assert "Tensor? dlse" in s and "-> (Tensor, Tensor, Tensor, Tensor[])" in s


def test_fake_tensors_give_shapes_and_strides():
    from torch._subclasses.fake_tensor import FakeTensorMode
    spec = flexjit.Spec(example("document.lua"))
    with FakeTensorMode():
        # BSHD storage seen as BHSD: O keeps q's strides.
        q = torch.empty(2, 300, 8, 64, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
        k = torch.empty(2, 2, 300, 64, dtype=torch.bfloat16, device="cuda")
        doc = torch.zeros(300, dtype=torch.int32, device="cuda")
        out, lse = flexjit.attention(q, k, k, spec, buffers={"doc": doc}, return_lse=True)
        assert out.shape == q.shape and out.stride() == q.stride()
        assert lse.shape == (2, 8, 300) and lse.dtype == torch.float32
        m = flexjit.block_mask(spec, None, None, 300, 300, buffers={"doc": doc})
        assert m.kv_num_blocks.shape == (1, 1, 3) and m.kv_indices.shape == (1, 1, 3, 3)
        assert m.q_indices.shape == (1, 1, 3, 3) and m.BLOCK_SIZE == (128, 128)
        m2 = flexjit.block_mask(spec, 2, 8, 300, 1000, buffers={"doc": doc},
                                block_size=(128, 64))
        assert m2.kv_indices.shape == (2, 8, 3, 16) and m2.q_num_blocks.shape == (2, 8, 16)


def _check_grads(spec, params=None, buffers=None, fn=None):
    fn = fn or flexjit.attention
    q, k, v = _inputs()
    bufs = dict(buffers or {})
    out, lse = fn(q, k, v, spec, params=params, buffers=bufs, return_lse=True)
    core = spec._core
    ints, _, blist = core.values(params, bufs)
    mask, score = _mods(core, q, k, [b.detach().double() for b in blist], ints)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    bd = {n: b.detach().double().requires_grad_() for n, b in bufs.items()}
    if bd:
        mask, score = _mods(core, q, k, list(bd.values()), ints)
    ro, rl = dense_attention(qd, kd, vd, mask, score)
    torch.testing.assert_close(out.float(), ro.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, rl.float(), atol=1e-3, rtol=1e-3)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (out.double() * w).sum().backward()
    (ro * w).sum().backward()
    for a, b in ((q, qd), (k, kd), (v, vd)):
        torch.testing.assert_close(a.grad.double(), b.grad, atol=3e-2, rtol=3e-2)
    for n, b in bufs.items():
        if b.requires_grad:
            torch.testing.assert_close(b.grad.double(), bd[n].grad, atol=3e-2, rtol=3e-2)


def test_autograd_through_the_ops():
    _check_grads(flexjit.Spec(example("causal.lua")))
    _check_grads(flexjit.Spec(example("sliding_window.lua")), params={"window": 5})
    bias = (torch.randn(48) * 0.3).requires_grad_()
    _check_grads(flexjit.Spec.from_string(BIAS_SPEC, "bias.lua"), buffers={"bias": bias})
    assert bias.grad is not None and bias.grad.abs().sum() > 0


def test_compile_fullgraph_forward_and_backward():
    spec = flexjit.Spec.from_string(BIAS_SPEC, "bias.lua")

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = torch.nn.Parameter(torch.randn(48) * 0.3)

        def forward(self, q, k, v):
            return flexjit.attention(q, k, v, spec, buffers={"bias": self.bias}) * 2.0

    layer = Layer()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    q, k, v = _inputs()
    ref = layer(q, k, v)
    ref.float().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)] + [layer.bias.grad.clone()]
    for t in (q, k, v):
        t.grad = None
    layer.bias.grad = None
    out = compiled(q, k, v)
    torch.testing.assert_close(out, ref)
    out.float().sum().backward()
    for a, b in zip([q.grad, k.grad, v.grad, layer.bias.grad], grads):
        torch.testing.assert_close(a, b)


def test_opcheck():
    spec = flexjit.Spec(example("causal.lua"))
    q, k, v = _inputs(grad=True)
    args = (q, k, v, spec._core.id, 0.0, [], [], [], [], []) + fjt.NO_SERVING
    torch.library.opcheck(torch.ops.flexjit.attention_fwd.default, args,
                          test_utils=("test_schema", "test_faketensor",
                                      "test_autograd_registration"))


def test_non_trainable_buffer_with_grad_is_refused():
    spec = flexjit.Spec(example("relative_buckets.lua"))
    q, k, v = _inputs(grad=False)
    bias = torch.zeros(4 * 32, requires_grad=True)
    with pytest.raises(ValueError, match="without {grad = true}"):
        flexjit.attention(q, k, v, spec, buffers={"rel_bias": bias})


def test_library_errors_become_exceptions():
    spec = flexjit.Spec(example("causal.lua"))
    q, k, v = _inputs(grad=False)
    with pytest.raises(flexjit.FlexjitError, match="q: tensor is not on a CUDA device"):
        fjt.forward_impl(q, k, v, spec._core.id, 0.0, [], [], [], [], [], *fjt.NO_SERVING)
