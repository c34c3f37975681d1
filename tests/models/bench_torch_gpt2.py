#!/usr/bin/env python3
"""Prints PyTorch's GPT-2 forward+backward CPU throughput as a `tokens_per_s N` line; models_bench runs it.

Usage: bench_torch_gpt2.py MAX_T VOCAB PADDED_VOCAB LAYERS HEADS CHANNELS B T ITERATIONS MIN_SECONDS THREADS
The same model as zero's (and as make_model_fixtures.py): pre-LayerNorm blocks, causal attention (explicit
masked softmax: this PyTorch may predate scaled_dot_product_attention), GELU (tanh), wte tied as the head
with the padded vocab's rows, fp32, mean cross-entropy over the real vocab. One warm-up iteration, then
timed ones of loss.backward() (at least ITERATIONS and at least MIN_SECONDS) with gradients accumulating,
as zero's do.
"""
import math
import sys
import time

import torch
import torch.nn.functional as F


def make_params(max_t, padded_vocab, layers, channels):
    gen = torch.Generator().manual_seed(0)

    def normal(*shape):
        return (torch.randn(*shape, generator=gen) * 0.02).requires_grad_(True)

    def zeros(n):
        return torch.zeros(n, requires_grad=True)

    def ones(n):
        return torch.ones(n, requires_grad=True)

    c = channels
    p = {"wte": normal(padded_vocab, c), "wpe": normal(max_t, c), "ln_f.w": ones(c), "ln_f.b": zeros(c), "blocks": []}
    for _ in range(layers):
        p["blocks"].append({
            "ln_1.w": ones(c), "ln_1.b": zeros(c),
            "c_attn.w": normal(3 * c, c), "c_attn.b": zeros(3 * c),
            "attn.c_proj.w": normal(c, c), "attn.c_proj.b": zeros(c),
            "ln_2.w": ones(c), "ln_2.b": zeros(c),
            "c_fc.w": normal(4 * c, c), "c_fc.b": zeros(4 * c),
            "mlp.c_proj.w": normal(c, 4 * c), "mlp.c_proj.b": zeros(c),
        })
    return p


def loss_of(p, tokens, targets, heads, vocab):
    bsz, t = tokens.shape
    c = p["wte"].shape[1]
    x = p["wte"][tokens] + p["wpe"][:t]
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
    for b in p["blocks"]:
        a = F.layer_norm(x, (c,), b["ln_1.w"], b["ln_1.b"], eps=1e-5)
        q, k, v = F.linear(a, b["c_attn.w"], b["c_attn.b"]).split(c, dim=2)
        q, k, v = (z.view(bsz, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // heads))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(bsz, t, c)
        x = x + F.linear(y, b["attn.c_proj.w"], b["attn.c_proj.b"])
        m = F.layer_norm(x, (c,), b["ln_2.w"], b["ln_2.b"], eps=1e-5)
        m = F.gelu(F.linear(m, b["c_fc.w"], b["c_fc.b"]), approximate="tanh")
        x = x + F.linear(m, b["mlp.c_proj.w"], b["mlp.c_proj.b"])
    x = F.layer_norm(x, (c,), p["ln_f.w"], p["ln_f.b"], eps=1e-5)
    logits = F.linear(x, p["wte"])[..., :vocab]
    return F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))


def main():
    max_t, vocab, padded, layers, heads, channels, bsz, t, iterations = map(int, sys.argv[1:10])
    min_seconds, threads = float(sys.argv[10]), int(sys.argv[11])
    torch.set_num_threads(threads)
    print(f"torch {torch.__version__} threads {torch.get_num_threads()}", flush=True)
    p = make_params(max_t, padded, layers, channels)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (bsz, t), generator=gen)
    targets = torch.randint(0, vocab, (bsz, t), generator=gen)
    loss_of(p, tokens, targets, heads, vocab).backward()  # warm-up
    start, done, elapsed = time.perf_counter(), 0, 0.0
    while done < iterations or elapsed < min_seconds:
        loss_of(p, tokens, targets, heads, vocab).backward()
        done += 1
        elapsed = time.perf_counter() - start
    print(f"tokens_per_s {bsz * t * done / elapsed:.6g}", flush=True)


if __name__ == "__main__":
    main()
