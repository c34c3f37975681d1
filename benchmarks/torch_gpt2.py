#!/usr/bin/env python3
"""PyTorch's GPT-2 training step on one GPU, the baseline zero's GPU benchmark reports against.

The model zero trains (models/gpt2.h): pre-LayerNorm blocks, causal attention, GELU (tanh), wte tied as the
head with the padded vocab's rows, mean cross-entropy over the real vocab, AdamW. PyTorch's fastest settings
for it: fp32 parameters under bf16 autocast (zero's bf16 keeps fp32 master weights the same way), fused
scaled-dot-product attention, fused AdamW, and --mode=compile for torch.compile.
Random tokens. Writes one CSV row: mode, torch version, shape, parameters, median step time, tokens/s.

usage: torch_gpt2.py --mode eager|compile [--batch 8] [--seq 1024] [--layers 12] [--heads 12] [--channels 768]
                     [--warmup 5] [--iters 20] --csv FILE
"""
import argparse
import csv
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 50257


def padded_vocab(vocab):
    return (vocab + 127) // 128 * 128  # as zero pads wte's rows (models/gpt2_config.h)


class Block(nn.Module):
    def __init__(self, channels, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(channels)
        self.c_attn = nn.Linear(channels, 3 * channels)
        self.attn_proj = nn.Linear(channels, channels)
        self.ln_2 = nn.LayerNorm(channels)
        self.c_fc = nn.Linear(channels, 4 * channels)
        self.mlp_proj = nn.Linear(4 * channels, channels)

    def forward(self, x):  # x: (B, T, C)
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))  # (B, NH, T, HS)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt2(nn.Module):
    def __init__(self, max_seq, layers, heads, channels, vocab=VOCAB):
        super().__init__()
        self.vocab = vocab
        self.wte = nn.Embedding(padded_vocab(vocab), channels)
        self.wpe = nn.Embedding(max_seq, channels)
        self.blocks = nn.ModuleList(Block(channels, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(channels)

    def forward(self, tokens, targets):  # tokens, targets: (B, T)
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # (B, T, padded vocab); the padded rows are never targets
        return F.cross_entropy(logits[..., :self.vocab].float().flatten(0, 1), targets.flatten())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["eager", "compile"], required=True)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--channels", type=int, default=768)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--csv", required=True)
    args = p.parse_args()

    torch.manual_seed(0)
    model = Gpt2(args.seq, args.layers, args.heads, args.channels).cuda()
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    forward = torch.compile(model) if args.mode == "compile" else model
    tokens = torch.randint(0, VOCAB, (args.batch, args.seq), device="cuda")
    targets = torch.randint(0, VOCAB, (args.batch, args.seq), device="cuda")

    def step():
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = forward(tokens, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup):  # torch.compile compiles here
        step()
    times = []
    for _ in range(args.iters):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    row = {"mode": args.mode, "torch": torch.__version__, "batch": args.batch, "seq": args.seq,
           "layers": args.layers, "channels": args.channels, "params": params,
           "step_ms": round(step_s * 1e3, 3), "tokens/s": round(args.batch * args.seq / step_s, 1),
           "peak_memory_MiB": round(torch.cuda.max_memory_allocated() / 2**20, 1)}
    with open(args.csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(row))
        writer.writeheader()
        writer.writerow(row)
    print(", ".join(f"{k} {v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
