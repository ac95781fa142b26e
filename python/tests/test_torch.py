"""The PyTorch integration without a GPU: the custom ops' schemas and fake
implementations, autograd through them, and torch.compile (fullgraph, so a
graph break fails) of a model calling flexjit.attention. The ops' CUDA
implementations need a GPU (test_gpu.py); here CPU kernels computing dense
attention from the specs' Python twins (reference.py) stand in for them, so
everything around the kernels is exercised as it runs on the GPU."""
import pytest

torch = pytest.importorskip("torch")

import flexjit  # noqa: E402
from flexjit import _serving as fjs  # noqa: E402
from flexjit import _torch as fjt  # noqa: E402

from conftest import example  # noqa: E402
from cpu_ops import BIAS_SPEC, _mods  # noqa: E402  (registers the ops' CPU kernels)
from reference import dense_attention, example_mods, serving_attention  # noqa: E402




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
    # Seeded: the bias gradient sums dS over many pairs, and some draws take
    # it near the fixed tolerance.
    g = torch.Generator().manual_seed(2)
    bias = (torch.randn(48, generator=g) * 0.3).requires_grad_()
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
    args = (q, k, v, spec._core.id, 0.0, [], [], [], [], []) + fjt.Layout()
    torch.library.opcheck(torch.ops.flexjit.attention_fwd.default, args,
                          test_utils=("test_schema", "test_faketensor",
                                      "test_autograd_registration"))


def test_non_trainable_buffer_with_grad_is_refused():
    spec = flexjit.Spec(example("relative_buckets.lua"))
    q, k, v = _inputs(grad=False)
    bias = torch.zeros(4 * 32, requires_grad=True)
    with pytest.raises(ValueError, match="without {grad = true}"):
        flexjit.attention(q, k, v, spec, buffers={"rel_bias": bias})


def test_deterministic_mode_follows_torch():
    """torch.use_deterministic_algorithms(True) asks for the backward's
    deterministic mode; a spec with a trainable buffer has none: refused like
    a PyTorch op without a deterministic implementation, or with warn_only a
    warning and the default mode."""
    plain = flexjit.Spec(example("causal.lua"))._core
    trained = flexjit.Spec.from_string(BIAS_SPEC, "bias.lua")._core
    assert fjt._deterministic(plain) == 0 and fjt._deterministic(trained) == 0
    try:
        torch.use_deterministic_algorithms(True)
        assert fjt._deterministic(plain) == 1
        with pytest.raises(RuntimeError, match="trainable buffer"):
            fjt._deterministic(trained)
        torch.use_deterministic_algorithms(True, warn_only=True)
        with pytest.warns(UserWarning, match="deterministic"):
            assert fjt._deterministic(trained) == 0
    finally:
        torch.use_deterministic_algorithms(False)


def test_library_errors_become_exceptions():
    spec = flexjit.Spec(example("causal.lua"))
    q, k, v = _inputs(grad=False)
    with pytest.raises(flexjit.FlexjitError, match="q: tensor is not on a CUDA device"):
        fjt.forward_impl(q, k, v, spec._core.id, 0.0, [], [], [], [], [], *fjt.Layout())


def test_a_spec_that_is_not_a_spec_is_refused():
    q, k, v = _inputs(grad=False)
    for wrong in ("examples/causal.lua", lambda b, h, q, kv: q >= kv, None):
        with pytest.raises(TypeError, match=r"spec must be a flexjit.Spec \(got "):
            flexjit.attention(q, k, v, wrong)
        with pytest.raises(TypeError, match="flexjit.Spec"):
            flexjit.varlen_attention(q[0], k[0], v[0], wrong, None, None, 1, None)
        with pytest.raises(TypeError, match="flexjit.Spec"):
            flexjit.block_mask(wrong, 1, 1, 128, 128)


def test_values_and_masks_of_the_wrong_type_are_refused():
    q, k, v = _inputs(grad=False)
    causal, doc = flexjit.Spec(example("causal.lua")), flexjit.Spec(example("document.lua"))
    with pytest.raises(TypeError, match=r"params must be a dict by name \(got list\)"):
        flexjit.attention(q, k, v, causal, params=[1, 2])
    with pytest.raises(TypeError, match=r"buffers must be a dict by name \(got tuple\)"):
        flexjit.attention(q, k, v, doc, buffers=(1,))
    with pytest.raises(TypeError, match=r"buffer 'doc' must be a torch.Tensor .*got list"):
        flexjit.attention(q, k, v, doc, buffers={"doc": [0, 0, 1]})
    with pytest.raises(TypeError, match=r"block_mask must be a flexjit.BlockMask .*got str"):
        flexjit.attention(q, k, v, causal, block_mask="causal")


# ---- serving (docs/python.md, "Serving") ----

def _cpu_merge(o_parts, lse_parts, out_dtype):
    # An empty segment (LSE -inf) adds nothing, whatever its O holds.
    lse = torch.logsumexp(lse_parts.double(), dim=0)
    empty = torch.isinf(lse_parts).unsqueeze(-1)
    w = torch.exp(lse_parts.double() - lse.masked_fill(torch.isinf(lse), 0)).unsqueeze(-1)
    o = torch.where(empty, 0.0, w * o_parts.double()).sum(0)
    return o.to(fjs._OUT_DTYPES[out_dtype]), lse.float()


def _cpu_csr(kv_indptr, kv_indices, kv_last_page_len, page_size, max_pages):
    B = kv_indptr.shape[0] - 1
    table = torch.zeros(B, max_pages, dtype=torch.int32)
    lens = torch.zeros(B, dtype=torch.int32)
    for b in range(B):
        pages = kv_indices[kv_indptr[b]:kv_indptr[b + 1]][:max_pages]
        table[b, :len(pages)] = pages
        n = int(kv_indptr[b + 1] - kv_indptr[b])
        lens[b] = 0 if n == 0 else ((min(n, max_pages) - 1) * page_size +
                                    (int(kv_last_page_len[b]) if n <= max_pages else page_size))
    return table, lens


torch.library.register_kernel("flexjit::merge_states", "cpu", _cpu_merge)
torch.library.register_kernel("flexjit::paged_from_csr", "cpu", _cpu_csr)


def _varlen_inputs(lens_q, lens_k, Hq=4, Hkv=2, D=16, grad=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda n, h: torch.randn(n, h, D, generator=g, dtype=torch.bfloat16  # noqa: E731
                                  ).requires_grad_(grad)
    cu = lambda lens: torch.tensor([0] + lens, dtype=torch.int32).cumsum(0).to(  # noqa: E731
        torch.int32)
    return (mk(sum(lens_q), Hq), mk(sum(lens_k), Hkv), mk(sum(lens_k), Hkv), cu(lens_q),
            cu(lens_k))


def test_serving_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    spec = flexjit.Spec(example("causal_bottom_right.lua"))
    with FakeTensorMode():
        bf = dict(dtype=torch.bfloat16, device="cuda")
        i32 = dict(dtype=torch.int32, device="cuda")
        # Decode over a paged cache: q [B, Hq, Lq, D], pools [pages, 16, Hkv, D].
        q = torch.empty(3, 8, 1, 64, **bf)
        pool = torch.empty(40, 16, 2, 64, **bf)
        out, lse = flexjit.attention(q, pool, pool, spec, return_lse=True,
                                     seqlens_k=torch.empty(3, **i32),
                                     block_table=torch.empty(3, 7, **i32))
        assert out.shape == q.shape and lse.shape == (3, 8, 1)
        # Packed: O like q, LSE [Hq, total_q].
        q = torch.empty(37, 8, 128, **bf)
        kv = torch.empty(50, 2, 128, **bf)
        cu = torch.empty(4, **i32)
        out, lse = flexjit.varlen_attention(q, kv, kv, spec, cu, cu, 20, 30, return_lse=True)
        assert out.shape == (37, 8, 128) and lse.shape == (8, 37)
        assert lse.dtype == torch.float32 and lse.stride() == (37, 1)
        # Chunked prefill into a paged cache: packed q, paged k and v.
        pool = torch.empty(40, 16, 2, 128, **bf)
        out = flexjit.varlen_attention(q, pool, pool, spec, cu, None, 20, None,
                                       seqlens_k=torch.empty(3, **i32),
                                       block_table=torch.empty(3, 7, **i32))
        assert out.shape == q.shape
        o, l = flexjit.merge_states(torch.empty(3, 2, 8, 5, 64, dtype=torch.float32,
                                                device="cuda"),
                                    torch.empty(3, 2, 8, 5, dtype=torch.float32, device="cuda"),
                                    out_dtype=torch.float16)
        assert o.shape == (2, 8, 5, 64) and o.dtype == torch.float16 and l.shape == (2, 8, 5)
        t, n = flexjit.paged_from_csr(torch.empty(5, **i32), torch.empty(11, **i32),
                                      torch.empty(4, **i32), 16, 9)
        assert t.shape == (4, 9) and n.shape == (4,) and t.dtype == n.dtype == torch.int32


def test_serving_argument_errors():
    spec = flexjit.Spec(example("causal.lua"))
    q, k, v = _inputs(B=2, Hq=4, Hkv=2, L=32, grad=False)
    lens = torch.tensor([5, 32], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"seqlens_k must be int32 \(got torch.int64\)"):
        flexjit.attention(q, k, v, spec, seqlens_k=lens.long())
    with pytest.raises(ValueError, match="seqlens_k has 3 entries for a batch of 2"):
        flexjit.attention(q, k, v, spec, seqlens_k=torch.ones(3, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"seqlens_k must be \[B\]"):
        flexjit.attention(q, k, v, spec, seqlens_k=lens[None])
    with pytest.raises(TypeError, match="block_table must be an int32 tensor"):
        flexjit.attention(q, k, v, spec, block_table=[[0, 1]])
    table = torch.zeros(2, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="page pools"):
        flexjit.attention(q, k, v[:, :, :16], spec, block_table=table)
    with pytest.raises(ValueError, match="block_table has 1 rows for a batch of 2"):
        flexjit.attention(q, k, v, spec, block_table=table[:1])
    with pytest.raises(ValueError, match=r"outside \[0, 1\)"):
        flexjit.attention(q, k, v, spec, skip_softmax_threshold=1.5)
    with pytest.raises(ValueError, match="block_mask cannot be combined"):
        flexjit.attention(q, k, v, spec, seqlens_k=lens, block_mask=fjt.BlockMask(
            [torch.zeros(1, 1, 1, dtype=torch.int32)] * 8, (128, 128), (32, 32)))
    with pytest.raises(ValueError, match="varlen_attention"):
        flexjit.attention(q[0], k[0], v[0], spec, seqlens_k=lens)
    # Inference only: refused with a gradient required, allowed without.
    qg = q.detach().requires_grad_()
    with pytest.raises(ValueError, match="inference only"):
        flexjit.attention(qg, k, v, spec, seqlens_k=lens)
    with pytest.raises(ValueError, match="inference only"):
        flexjit.attention(qg, k, v, spec, skip_softmax_threshold=0.01)
    with torch.no_grad():
        assert flexjit.attention(qg, k, v, spec, seqlens_k=lens).shape == q.shape


def test_varlen_argument_errors():
    spec = flexjit.Spec(example("causal.lua"))
    q, k, v, cq, ck = _varlen_inputs([3, 0, 9], [5, 2, 9], grad=False)
    with pytest.raises(ValueError, match=r"packed \[total_q, Hq, D\]"):
        flexjit.varlen_attention(q[None], k, v, spec, cq, ck, 9, 9)
    with pytest.raises(ValueError, match="cu_seqlens_q must be int32"):
        flexjit.varlen_attention(q, k, v, spec, cq.long(), ck, 9, 9)
    with pytest.raises(ValueError, match="cu_seqlens_k has 3 entries and cu_seqlens_q 4"):
        flexjit.varlen_attention(q, k, v, spec, cq, ck[:3], 9, 9)
    with pytest.raises(ValueError, match="max_seqlen_q is 0"):
        flexjit.varlen_attention(q, k, v, spec, cq, ck, 0, 9)
    with pytest.raises(ValueError, match="max_seqlen_k is None"):
        flexjit.varlen_attention(q, k, v, spec, cq, ck, 9, None)
    with pytest.raises(ValueError, match="B \\+ 1 >= 2"):
        flexjit.varlen_attention(q, k, v, spec, cq[:1], ck[:1], 9, 9)
    with pytest.raises(ValueError, match="cannot be combined with seqlens_k"):
        flexjit.varlen_attention(q, k, v, spec, cq, ck, 9, 9,
                                 seqlens_k=torch.ones(3, dtype=torch.int32))
    with pytest.raises(ValueError, match="max_seqlen_k is 9 but cu_seqlens_k is None"):
        flexjit.varlen_attention(q, k, v, spec, cq, None, 9, 9)
    with pytest.raises(ValueError, match=r"\[B, Hkv, Lk, D\] or page pools"):
        flexjit.varlen_attention(q, k, v, spec, cq, None, 9, None)
    kb = torch.zeros(3, 2, 9, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="inference only"):
        flexjit.varlen_attention(q.detach().requires_grad_(), kb, kb, spec, cq, None, 9, 0,
                                 seqlens_k=torch.ones(3, dtype=torch.int32))


def test_merge_and_csr_argument_errors():
    o = torch.zeros(2, 1, 4, 3, 8)
    lse = torch.zeros(2, 1, 4, 3)
    with pytest.raises(ValueError, match="give out_dtype"):
        flexjit.merge_states(o, lse)
    with pytest.raises(ValueError, match=r"lse_parts must be \[N, B, H, L\]"):
        flexjit.merge_states(o, lse[:, :, :2], out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="lse_parts must be float32"):
        flexjit.merge_states(o, lse.double(), out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="out_dtype must be"):
        flexjit.merge_states(o, lse, out_dtype=torch.float32)
    with pytest.raises(ValueError, match="is empty"):
        flexjit.merge_states([], [])
    i32 = lambda *x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    with pytest.raises(ValueError, match="kv_indices must be a 1-D int32"):
        flexjit.paged_from_csr(i32(0, 2), i32(0, 1).long(), i32(3), 16, 4)
    with pytest.raises(ValueError, match="kv_last_page_len has 2 entries for 1"):
        flexjit.paged_from_csr(i32(0, 2), i32(0, 1), i32(3, 3), 16, 4)
    with pytest.raises(ValueError, match="page_size"):
        flexjit.paged_from_csr(i32(0, 2), i32(0, 1), i32(3), 0, 4)


def test_serving_ops_opcheck():
    g = torch.Generator().manual_seed(3)
    o = torch.randn(3, 2, 4, 5, 16, generator=g, dtype=torch.bfloat16)
    lse = torch.randn(3, 2, 4, 5, generator=g)
    lse[1, 0] = float("-inf")
    tests = ("test_schema", "test_faketensor")
    torch.library.opcheck(torch.ops.flexjit.merge_states.default, (o, lse, 0),
                          test_utils=tests)
    i32 = lambda *x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    torch.library.opcheck(torch.ops.flexjit.paged_from_csr.default,
                          (i32(0, 2, 2, 5), i32(4, 1, 0, 2, 3), i32(3, 16, 1), 16, 4),
                          test_utils=tests)
    q, k, v, cq, ck = _varlen_inputs([3, 0, 9], [5, 2, 9])
    spec = flexjit.Spec(example("causal_bottom_right.lua"))
    args = (q, k, v, spec._core.id, 0.0, [], [], [], [], [], None, None, cq, ck, 9, 9, 0.0, 0,
            0)
    torch.library.opcheck(torch.ops.flexjit.attention_fwd.default, args,
                          test_utils=tests + ("test_autograd_registration",))


def _varlen_reference(spec_name, q, k, v, cq, ck, dout):
    """O, LSE and gradients of a packed batch by autograd through float64
    attention a sequence at a time (independent of the ops' CPU kernels'
    backward formulas)."""
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    mods = lambda lq, lk: example_mods(spec_name, q.shape[1], lq, lk, "cpu")[:2]  # noqa
    o, lse = serving_attention(qd, kd, vd, mods, cu_seqlens_q=cq, cu_seqlens_k=ck)
    grads = torch.autograd.grad((o * dout).sum(), (qd, kd, vd))
    return o, lse, grads


@pytest.mark.parametrize("compiled", [False, True])
def test_varlen_forward_backward_through_the_ops(compiled):
    spec = flexjit.Spec(example("causal_bottom_right.lua"))
    lens_q, lens_k = [3, 0, 9, 1], [5, 2, 9, 7]
    q, k, v, cq, ck = _varlen_inputs(lens_q, lens_k)

    def f(q, k, v, cq, ck):
        return flexjit.varlen_attention(q, k, v, spec, cq, ck, 9, 9, return_lse=True)

    if compiled:
        torch._dynamo.reset()
        f = torch.compile(f, fullgraph=True, backend="aot_eager")
    out, lse = f(q, k, v, cq, ck)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1),
                       dtype=torch.float64)
    ro, rl, rg = _varlen_reference("causal_bottom_right", q, k, v, cq, ck, dout)
    assert out.shape == q.shape and lse.shape == (4, 13)
    torch.testing.assert_close(out.double(), ro, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double(), rl, atol=1e-3, rtol=1e-3)
    (out.double() * dout).sum().backward()
    for a, b in zip((q.grad, k.grad, v.grad), rg):
        torch.testing.assert_close(a.double(), b, atol=3e-2, rtol=3e-2)
    # The sequence with no queries gives its keys no gradient.
    assert k.grad[5:7].abs().sum() == 0


def test_decode_paged_compiles_without_graph_breaks():
    spec = flexjit.Spec(example("causal_bottom_right.lua"))
    g = torch.Generator().manual_seed(5)
    B, Hq, Hkv, D, ps = 3, 4, 2, 16, 16
    pool_k = torch.randn(9, ps, Hkv, D, generator=g, dtype=torch.bfloat16)
    pool_v = torch.randn(9, ps, Hkv, D, generator=g, dtype=torch.bfloat16)
    table = torch.randperm(9, generator=g)[:6].to(torch.int32).view(B, 2)
    lens = torch.tensor([1, 32, 17], dtype=torch.int32)
    q = torch.randn(B, Hq, 2, D, generator=g, dtype=torch.bfloat16)

    def step(q, pool_k, pool_v, table, lens):
        return flexjit.attention(q, pool_k, pool_v, spec, seqlens_k=lens, block_table=table)

    torch._dynamo.reset()
    out = torch.compile(step, fullgraph=True, backend="aot_eager")(q, pool_k, pool_v, table,
                                                                   lens)
    mods = lambda lq, lk: example_mods("causal_bottom_right", Hq, lq, lk, "cpu")[:2]  # noqa
    ro, _ = serving_attention(q.double(), pool_k.double(), pool_v.double(), mods,
                              seqlens_k=lens, block_table=table)
    torch.testing.assert_close(out.double(), ro, atol=2e-2, rtol=2e-2)
    # The sequence of one key with two queries: its first query sees none.
    assert out[0, :, 0].abs().sum() == 0


def test_bad_query_layouts_reach_the_library():
    """A q of neither layout (3-D without cu_seqlens_q, 2-D) is refused by
    the library with its message, not a Python error on the way."""
    spec = flexjit.Spec(example("causal.lua"))
    q, k, v = _inputs(grad=False)
    for bad in (q[0], q[0, 0]):
        with pytest.raises(flexjit.FlexjitError, match="q: "):
            fjt.forward_impl(bad, k, v, spec._core.id, 0.0, [], [], [], [], [],
                             *fjt.Layout())


@pytest.mark.parametrize("compiled", [False, True])
def test_context_parallel_offsets_through_the_ops(compiled):
    """q_offset and kv_offset reach the forward and backward ops: a shard
    pair of a sliding window (q rows 40.., kv rows 16..) against dense
    attention with the whole sequence's mask on those rows."""
    spec = flexjit.Spec(example("sliding_window.lua"))
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, h, n, 16, generator=g, dtype=torch.bfloat16).requires_grad_()
               for h, n in ((4, 32), (2, 40), (2, 40)))
    a, c, w = 40, 16, 9

    def f(q, k, v):
        return flexjit.attention(q, k, v, spec, {"window": w}, return_lse=True, q_offset=a,
                                 kv_offset=c)

    if compiled:
        torch._dynamo.reset()
        f = torch.compile(f, fullgraph=True, backend="aot_eager")
    out, lse = f(q, k, v)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    mask = lambda b, h, qi, ki: (qi + a >= ki + c) & (qi + a - (ki + c) < w)  # noqa: E731
    ro, rl = dense_attention(qd, kd, vd, mask, None)
    torch.testing.assert_close(out.double(), ro, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double(), rl, atol=1e-3, rtol=1e-3)
    dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    (out.double() * dout).sum().backward()
    (ro * dout).sum().backward()
    for x, r in ((q, qd), (k, kd), (v, vd)):
        torch.testing.assert_close(x.grad.double(), r.grad, atol=3e-2, rtol=3e-2)


def test_context_parallel_offset_errors():
    spec = flexjit.Spec(example("sliding_window.lua"))
    q, k, v = _inputs(grad=False)
    with pytest.raises(ValueError, match="must be >= 0"):
        flexjit.attention(q, k, v, spec, {"window": 5}, q_offset=-1)
    bm = fjt.BlockMask([torch.zeros(1, 1, 1, dtype=torch.int32)] * 8, (128, 128), (48, 48))
    with pytest.raises(ValueError, match=r"built at q_offset, kv_offset \(0, 0\), the call "
                       r"has \(0, 48\)"):
        flexjit.attention(q, k, v, spec, {"window": 5}, block_mask=bm, kv_offset=48)
    bm.offsets = (0, 48)  # as flexjit.block_mask(..., kv_offset=48) makes it
    with pytest.raises(ValueError, match=r"built at q_offset, kv_offset \(0, 48\)"):
        flexjit.attention(q, k, v, spec, {"window": 5}, block_mask=bm)
