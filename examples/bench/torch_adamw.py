#!/usr/bin/env python3
"""Prints torch.optim.AdamW CPU throughput as `variant params_per_second` lines; `zero-bench optim` runs it.

Usage: bench_torch_adamw.py NUMEL ITERATIONS THREADS (torch.set_num_threads, to match zero's OpenMP threads). Variants: foreach=False (single-tensor loop) and foreach=True;
fused=True is listed too when this PyTorch offers it for CPU tensors.
"""
import inspect
import statistics
import sys
import time

import torch


def measure(numel, iterations, **kwargs):
    p = torch.full((numel,), 0.5, requires_grad=True)
    p.grad = torch.full((numel,), 1e-3)
    opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, **kwargs)
    opt.step()  # warm-up: state allocation
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    return numel / statistics.median(times)  # the median step, as zero's side counts it


def main():
    numel, iterations = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(int(sys.argv[3]))
    variants = [("foreach=False", {"foreach": False}), ("foreach=True", {"foreach": True})]
    if "fused" in inspect.signature(torch.optim.AdamW).parameters:
        variants.append(("fused=True", {"fused": True}))
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    for name, kwargs in variants:
        try:
            print(f"{name} {measure(numel, iterations, **kwargs):.6g}", flush=True)
        except RuntimeError as e:  # e.g. fused not supported on CPU in this version
            print(f"# {name} unavailable: {e}", flush=True)


if __name__ == "__main__":
    main()
