"""flexjit.ring_attention over torch.distributed without a GPU: 2 and 3
processes on the gloo backend, the ops' CPU kernels (cpu_ops.py) standing in
for the CUDA ones. Each rank's output, LSE and gradients (q, k, v and a
trainable buffer's) against float64 attention over the whole sequence, for
the contiguous and the zigzag layout and specs whose masks span the shards
(causal, sliding window, document ids, a learned bias by kv position, and
one whose first rows see no key, so that whole q chunks have no pair: the
ring skips the pairs fj_spec_block_class calls empty). The document mask
reads a buffer, so each pair takes a block mask built at its offsets; the
CPU kernels mask what it leaves out, and blocks of 2 here make a mask of
the wrong positions change the result."""
import os
import socket
import traceback

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402

import flexjit  # noqa: E402

from conftest import example  # noqa: E402
from cpu_ops import BIAS_SPEC, LATE_SPEC  # noqa: E402

B, HQ, HKV = 2, 4, 2


def _positions(rank, n, S, layout):
    if layout == "contiguous":
        return torch.arange(rank * S, (rank + 1) * S)
    c = S // 2
    return torch.cat([torch.arange(rank * c, (rank + 1) * c),
                      torch.arange((2 * n - 1 - rank) * c, (2 * n - rank) * c)])


def _case(name, L):
    """spec, params, buffers (whole sequence), float64 mask and score, and
    the float64 leaf of a trainable buffer (None without one)."""
    g = torch.Generator().manual_seed(11)
    if name == "causal":
        return flexjit.Spec(example("causal.lua")), {}, {}, (lambda b, h, q, k: q >= k), None, None
    if name == "sliding_window":
        w = 7
        return (flexjit.Spec(example("sliding_window.lua")), {"window": w}, {},
                (lambda b, h, q, k: (q >= k) & (q - k < w)), None, None)
    if name == "document":
        doc = torch.repeat_interleave(torch.arange(L), torch.randint(1, 9, (L,), generator=g))
        doc = doc[:L].to(torch.int32)
        return (flexjit.Spec(example("document.lua")), {}, {"doc": doc},
                (lambda b, h, q, k: (doc[q] == doc[k]) & (q >= k)), None, None)
    if name == "late":  # rows before 12 see no key: whole q chunks without a pair
        return (flexjit.Spec.from_string(LATE_SPEC, "late.lua"), {}, {},
                (lambda b, h, q, k: (q >= 12) & (q >= k)), None, None)
    bias = (torch.randn(L, generator=g) * 0.5).requires_grad_()
    ref = bias.detach().double().requires_grad_()
    return (flexjit.Spec.from_string(BIAS_SPEC, "bias.lua"), {}, {"bias": bias},
            (lambda b, h, q, k: q >= k), (lambda s, b, h, q, k: s + ref[k]), ref)


def _worker(rank, n, port, name, layout, S, errors, backend="gloo"):
    try:
        import cpu_ops  # noqa: F401  (the ops' CPU kernels, in this process too)
        from reference import dense_attention

        from flexjit import _ring
        if backend == "gloo":
            _ring._BLOCK = 2  # block masks fine enough to matter at these lengths
        from torch.distributed.device_mesh import init_device_mesh
        dev = torch.device("cpu")
        if backend == "nccl":
            dev = torch.device("cuda", rank)
            torch.cuda.set_device(dev)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=n)
        L = n * S
        D = 128 if backend == "nccl" else 16  # a head dim the kernels have
        spec, params, buffers, mask, score, bias_ref = _case(name, L)
        g = torch.Generator().manual_seed(5)
        q_all, k_all, v_all = (torch.randn(B, h, L, D, generator=g, dtype=torch.bfloat16)
                               for h in (HQ, HKV, HKV))
        dout_all = torch.randn(B, HQ, L, D, generator=g, dtype=torch.float64)
        pos = _positions(rank, n, S, layout)
        q, k, v = (t[:, :, pos].to(dev).requires_grad_() for t in (q_all, k_all, v_all))
        bufs = {key: b.detach().to(dev).requires_grad_(b.requires_grad)
                for key, b in buffers.items()}
        # The zigzag runs pass their group as a DeviceMesh.
        group = init_device_mesh(dev.type, (n,)) if layout == "zigzag" else None
        out, lse = flexjit.ring_attention(q, k, v, spec, params, bufs, return_lse=True,
                                          layout=layout, group=group)
        (out.double() * dout_all[:, :, pos].to(dev)).sum().backward()
        out, lse = out.cpu(), lse.cpu()
        whole = [t.double().requires_grad_() for t in (q_all, k_all, v_all)]
        ro, rl = dense_attention(*whole, mask, score)
        (ro * dout_all).sum().backward()
        what = f"rank {rank}/{n} {name} {layout}"
        torch.testing.assert_close(out.double(), ro[:, :, pos], atol=2e-2, rtol=2e-2,
                                   msg=lambda m: f"{what} O: {m}")
        torch.testing.assert_close(lse.double(), rl[:, :, pos], atol=1e-3, rtol=1e-3,
                                   msg=lambda m: f"{what} LSE: {m}")
        for t, r, x in zip((q, k, v), whole, "qkv"):
            torch.testing.assert_close(t.grad.cpu().double(), r.grad[:, :, pos], atol=3e-2,
                                       rtol=3e-2, msg=lambda m, x=x: f"{what} d{x}: {m}")
        if bias_ref is not None:  # summed over the ranks by the ring's backward
            torch.testing.assert_close(bufs["bias"].grad.cpu().double(), bias_ref.grad,
                                       atol=3e-2, rtol=3e-2,
                                       msg=lambda m: f"{what} dbias: {m}")
        dist.destroy_process_group()
    except Exception:
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        raise


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ring(n, name, layout, S, backend):
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, n, port, name, layout, S, errors, backend))
             for r in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    msgs = []
    while not errors.empty():
        msgs.append(errors.get())
    assert not msgs, "\n".join(msgs)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("name", ["causal", "sliding_window", "document", "bias", "late"])
def test_ring_matches_whole_attention(name, layout, n):
    _run_ring(n, name, layout, 10, "gloo")


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs 2 or more CUDA devices (NCCL)")
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("name", ["causal", "document", "bias"])
def test_ring_nccl_matches_whole_attention(name, layout):
    """The real kernels and NCCL, a rank a GPU, at kernel-sized shards."""
    _run_ring(min(torch.cuda.device_count(), 8), name, layout, 256, "nccl")


def test_ring_skips_empty_pairs(monkeypatch):
    """A pair fj_spec_block_class calls empty costs no launch: on one gloo
    rank, a shard whose rows all precede the late mask's first allowed row
    runs no kernel, and gives O 0, LSE -inf and zero gradients; a shard
    past it runs its one pair, forward and backward."""
    import cpu_ops  # noqa: F401
    from flexjit import _ring
    calls = []
    for fn in ("_pair_fwd", "_pair_bwd"):
        real = getattr(_ring, fn)
        monkeypatch.setattr(_ring, fn, lambda *a, _f=real, _n=fn: calls.append(_n) or _f(*a))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
                            world_size=1)
    try:
        spec = flexjit.Spec.from_string(LATE_SPEC, "late.lua")
        for S, launches in ((12, 0), (20, 1)):
            calls.clear()
            q, k, v = (torch.randn(1, 2, S, 16, dtype=torch.bfloat16).requires_grad_()
                       for _ in range(3))
            out, lse = flexjit.ring_attention(q, k, v, spec, return_lse=True)
            out.float().sum().backward()
            assert sorted(calls) == ["_pair_bwd", "_pair_fwd"] * launches, calls
            assert torch.isinf(lse[:, :, :12]).all() and (out[:, :, :12] == 0).all()
            assert (q.grad[:, :, :12] == 0).all()
            if launches:
                assert torch.isfinite(lse[:, :, 12:]).all()
        # A mesh stands for its group: one dimension of it, not the whole of a
        # larger one.
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "cp"))
        q = torch.randn(1, 2, 20, 16, dtype=torch.bfloat16)
        with pytest.raises(ValueError, match="DeviceMesh of 2 dimensions"):
            flexjit.ring_attention(q, q, q, spec, group=mesh)
        out = flexjit.ring_attention(q, q, q, spec, group=mesh["cp"])
        assert (out[:, :, :12] == 0).all() and (out[:, :, 12:] != 0).any()
    finally:
        dist.destroy_process_group()


def test_ring_document_pairs_take_block_masks(monkeypatch):
    """A mask that reads a buffer gets a block mask for each pair launched,
    built at the pair's offsets and handed to its forward and backward; an
    index-only mask gets none."""
    import cpu_ops  # noqa: F401
    from flexjit import _ring
    built, given = [], []
    real_mask = _ring.fjt.run_block_mask
    monkeypatch.setattr(_ring.fjt, "run_block_mask",
                        lambda *a: built.append((a[3], a[4], a[11], a[12])) or real_mask(*a))
    for fn, at in (("_pair_fwd", 8), ("_pair_bwd", 11)):
        real = getattr(_ring, fn)
        monkeypatch.setattr(_ring, fn, lambda *a, _f=real, _n=fn, _at=at:
                            given.append((_n, bool(a[_at]), a[-2], a[-1])) or _f(*a))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
                            world_size=1)
    try:
        S = 20
        doc = torch.repeat_interleave(torch.arange(5, dtype=torch.int32), 4)
        for name, buffers, masked in (("document", {"doc": doc}, True),
                                      ("causal", None, False)):
            built.clear(), given.clear()
            q, k, v = (torch.randn(1, 2, S, 16, dtype=torch.bfloat16).requires_grad_()
                       for _ in range(3))
            out = flexjit.ring_attention(q, k, v, flexjit.Spec(example(f"{name}.lua")),
                                         buffers=buffers, layout="zigzag")
            out.float().sum().backward()
            # Zigzag on one rank: chunks at 0 and 10; (0, 10) is empty (causal).
            pairs = [(0, 0), (10, 0), (10, 10)]
            assert built == ([(10, 10, qp, kp) for qp, kp in pairs] if masked else []), built
            assert sorted(given) == sorted((fn, masked, qp, kp) for fn in ("_pair_fwd", "_pair_bwd")
                                           for qp, kp in pairs), given
    finally:
        dist.destroy_process_group()


def test_ring_argument_errors():
    spec = flexjit.Spec(example("causal.lua"))
    q = torch.zeros(1, 2, 9, 16, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 9, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="layout must be one of"):
        flexjit.ring_attention(q, k, k, spec, layout="ring")
    with pytest.raises(ValueError, match="S = 9 is odd"):
        flexjit.ring_attention(q, k, k, spec, layout="zigzag")
    with pytest.raises(ValueError, match="the same S"):
        flexjit.ring_attention(q, k[:, :, :8], k, spec)
    with pytest.raises(ValueError, match=r"q \[B, Hq, S, D\]"):
        flexjit.ring_attention(q[0], k, k, spec)
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="init_process_group"):
            flexjit.ring_attention(q, k, k, spec)
