#!/usr/bin/env python3
"""PyTorch's GPT-2 forward+backward CPU throughput, eager and under torch.compile; models_bench runs it.

Usage: bench_torch_gpt2.py MAX_T VOCAB PADDED_VOCAB LAYERS HEADS CHANNELS B T ITERATIONS MIN_SECONDS THREADS
The benchmarks' one PyTorch GPT-2 (benchmarks/torch_gpt2.py: zero's model, with fused scaled-dot-product
attention), fp32. Per mode, one warm-up iteration (where torch.compile compiles), then timed ones of
loss.backward() (at least ITERATIONS and at least MIN_SECONDS) with gradients accumulating, as zero's do.
Prints `tokens_per_s MODE N` lines; a mode that fails prints `# MODE failed: ...` instead.
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))
from torch_gpt2 import Gpt2, padded_vocab  # noqa: E402


def tokens_per_second(loss_fn, tokens, targets, iterations, min_seconds):
    loss_fn(tokens, targets).backward()  # warm-up (and, compiled, the compilation)
    start, done, elapsed = time.perf_counter(), 0, 0.0
    while done < iterations or elapsed < min_seconds:
        loss_fn(tokens, targets).backward()
        done += 1
        elapsed = time.perf_counter() - start
    return tokens.numel() * done / elapsed


def main():
    max_t, vocab, padded, layers, heads, channels, bsz, t, iterations = map(int, sys.argv[1:10])
    min_seconds, threads = float(sys.argv[10]), int(sys.argv[11])
    assert padded == padded_vocab(vocab), "zero and the PyTorch model pad the vocabulary alike"
    torch.set_num_threads(threads)
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    torch.manual_seed(0)
    model = Gpt2(max_t, layers, heads, channels, vocab=vocab)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (bsz, t), generator=gen)
    targets = torch.randint(0, vocab, (bsz, t), generator=gen)
    for mode, loss_fn in (("eager", model), ("compile", torch.compile(model))):
        try:
            rate = tokens_per_second(loss_fn, tokens, targets, iterations, min_seconds)
            print(f"tokens_per_s {mode} {rate:.6g}", flush=True)
        except Exception as e:  # noqa: BLE001  (a compiler that cannot build here leaves the eager row)
            print(f"# {mode} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)


if __name__ == "__main__":
    main()
