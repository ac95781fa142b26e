#!/usr/bin/env python3
"""A small causal transformer language model trained with document masking,
with FlexAttention or flexjit as its attention (the --attn flag picks); the
rest of the model is the same. What a model author copies to move from
flex_attention to flexjit.

    pip install .            # flexjit, from the repository root
    python3 examples/python/train_lm.py --attn flexjit
    python3 examples/python/train_lm.py --attn flex

Data: synthetic token streams packed into rows of --seq tokens, each row a
run of documents of random lengths. A document is a random phrase repeated,
so after its first copy every token can be predicted by attending to the
same document only: document masking matters, and the loss falls to near
zero as the model learns to copy. Prints the loss every --log steps, then
the step time and tokens/s (medians after the first 10 steps, which
compile).

The attention mask: a query sees earlier keys of its own document. Each
batch row has its own documents, so the spec indexes its document-id buffer
by batch row (doc[b * Lq + q]); FlexAttention's mask_mod does the same on a
[B, L] tensor. Both build a block mask per batch from the ids.
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DOC_SPEC = """
-- Document masking for a batch of packed rows: doc holds the document id of
-- every token, row after row (B * L entries).
local doc = buffer("doc", "i32")
return {
  name = "batched_document",
  mask_mod = function(b, h, q, kv)
    return eq(doc[b * Lq + q], doc[b * Lk + kv]) & ge(q, kv)
  end,
}
"""


class Attention(nn.Module):
    def __init__(self, dim, heads, backend):
        super().__init__()
        self.heads, self.backend = heads, backend
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x, rope, mask):
        B, L, D = x.shape
        # [B, L, 3, H, d] viewed as three [B, H, L, d] tensors: BSHD strides,
        # which both attentions take without a copy.
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, D // self.heads).unbind(2)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.backend.name == "flexjit":
            o = self.backend.flexjit.attention(q, k, v, self.backend.spec,
                                               buffers={"doc": mask.doc}, block_mask=mask.blocks)
        else:
            o = self.backend.flex(q, k, v, block_mask=mask.blocks)
        return self.out(o.transpose(1, 2).reshape(B, L, D))


def rope_table(L, d, device):
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=device).float() / d))
    ang = torch.outer(torch.arange(L, device=device).float(), inv)
    return torch.cos(ang), torch.sin(ang)


def apply_rope(x, rope):
    cos, sin = (t[None, :, None, :].to(x.dtype) for t in rope)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)


class Block(nn.Module):
    def __init__(self, dim, heads, backend):
        super().__init__()
        self.n1, self.n2 = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.attn = Attention(dim, heads, backend)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim, bias=False), nn.GELU(),
                                 nn.Linear(4 * dim, dim, bias=False))

    def forward(self, x, rope, mask):
        x = x + self.attn(self.n1(x), rope, mask)
        return x + self.mlp(self.n2(x))


class LM(nn.Module):
    def __init__(self, vocab, dim, heads, layers, backend):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, backend) for _ in range(layers))
        self.norm = nn.RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens, rope, mask):
        x = self.emb(tokens)
        for b in self.blocks:
            x = b(x, rope, mask)
        return self.head(self.norm(x))


def batch(B, L, vocab, gen, device):
    """Token rows of packed documents and their document ids."""
    tokens = torch.empty(B, L, dtype=torch.long)
    doc = torch.empty(B, L, dtype=torch.int32)
    for r in range(B):
        at, d = 0, 0
        while at < L:
            n = int(torch.randint(32, 512, (1,), generator=gen))
            period = int(torch.randint(4, 24, (1,), generator=gen))
            phrase = torch.randint(1, vocab, (period,), generator=gen)
            seg = phrase.repeat(n // period + 1)[: min(n, L - at)]
            tokens[r, at:at + len(seg)] = seg
            doc[r, at:at + len(seg)] = d
            at, d = at + len(seg), d + 1
    return tokens.to(device), doc.to(device)


class Mask:
    """What a step's attention needs: the ids and the block mask built from
    them, once per batch for every layer."""

    def __init__(self, backend, doc):
        B, L = doc.shape
        if backend.name == "flexjit":
            self.doc = doc.flatten().contiguous()
            self.blocks = backend.flexjit.block_mask(backend.spec, B, None, L, L,
                                                     buffers={"doc": self.doc})
        else:
            def mask_mod(b, h, q, kv):
                return (doc[b, q] == doc[b, kv]) & (q >= kv)
            self.doc = doc
            self.blocks = backend.create_block_mask(mask_mod, B, None, L, L,
                                                    device=doc.device)


class Backend:
    def __init__(self, name):
        self.name = name
        if name == "flexjit":
            import flexjit
            self.flexjit = flexjit
            self.spec = flexjit.Spec.from_string(DOC_SPEC, "batched_document.lua")
        else:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            self.flex = torch.compile(flex_attention, dynamic=False)
            self.create_block_mask = create_block_mask


def main():
    ap = argparse.ArgumentParser(description="train a small LM with document masking")
    ap.add_argument("--attn", choices=["flexjit", "flex"], default="flexjit")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--heads", type=int, default=4, help="head dim = dim / heads (64 or 128)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--log", type=int, default=25)
    ap.add_argument("--no-compile", action="store_true", help="run the model eagerly")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(args.seed)
    backend = Backend(args.attn)
    model = LM(args.vocab, args.dim, args.heads, args.layers, backend).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, fused=True)
    fwd = model if args.no_compile else torch.compile(model)
    rope = rope_table(args.seq, args.dim // args.heads, dev)
    gen = torch.Generator().manual_seed(args.seed)
    times = []
    print(f"attention: {args.attn}, {args.layers} layers, dim {args.dim}, {args.heads} heads, "
          f"batch {args.batch} x {args.seq} tokens, {args.steps} steps")
    for step in range(1, args.steps + 1):
        tokens, doc = batch(args.batch, args.seq, args.vocab, gen, dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        mask = Mask(backend, doc)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = fwd(tokens, rope, mask)
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(),
                                   tokens[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if step % args.log == 0 or step == 1:
            print(f"step {step:5d}  loss {loss.item():.4f}")
    steady = times[10:] or times
    ms = statistics.median(steady) * 1e3
    print(f"step time {ms:.1f} ms (median of steps 11-{args.steps}), "
          f"{args.batch * args.seq / (ms / 1e3):,.0f} tokens/s, final loss {loss.item():.4f}, "
          f"ln(vocab) {math.log(args.vocab):.2f}")


if __name__ == "__main__":
    main()
