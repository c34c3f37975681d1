#!/usr/bin/env python3
"""PyTorch's counterpart of each ZeRO stage on the CPU, the baseline `zero-bench stages --torch` prints beside zero.

The same GPT-2 (benchmarks/torch_gpt2.py's model), one process per rank over gloo, AdamW (fused), random tokens:
  stage 0  DistributedDataParallel                       (gradients allreduced, everything replicated)
  stage 1  DDP + ZeroRedundancyOptimizer                 (optimizer state partitioned)
  stage 2  FullyShardedDataParallel SHARD_GRAD_OP        (gradients and optimizer state partitioned)
  stage 3  FullyShardedDataParallel FULL_SHARD           (parameters too)
Each rank runs --threads intra-op threads. Prints one line per stage, for zero-bench to parse:
  stage=S wrapper=NAME step_ms=MEDIAN peak_rss_mib=RANK0 torch=VERSION
step_ms is the median over --iters steps after --warmup, each ended by a barrier (the slowest rank's time);
peak_rss_mib is rank 0's process peak resident memory, which holds the model states and everything else: each
stage runs in processes of its own, so the peak is that stage's. FSDP wraps each block as a unit of its own,
as zero wraps GPT-2, so FULL_SHARD gathers one block at a time.

usage: torch_stages.py --layers L --heads NH --channels C --max_seq T --vocab V --batch B --seq T --ranks N
                       [--stages 0,1,2,3] [--warmup 2] [--iters 5] [--threads 1]
"""
import argparse
import os
import resource
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt2 import Block, Gpt2  # noqa: E402  (the benchmarks' one PyTorch GPT-2)

WRAPPERS = {0: "DDP", 1: "DDP+ZeroRedundancyOptimizer", 2: "FSDP(SHARD_GRAD_OP)", 3: "FSDP(FULL_SHARD)"}


def wrap(stage, model):
    """The model and its AdamW as PyTorch partitions them at `stage`."""
    if stage <= 1:
        wrapped = DDP(model)
    else:
        strategy = ShardingStrategy.SHARD_GRAD_OP if stage == 2 else ShardingStrategy.FULL_SHARD
        wrapped = FSDP(model, sharding_strategy=strategy, auto_wrap_policy=ModuleWrapPolicy({Block}),
                       device_id=torch.device("cpu"), use_orig_params=True)
    adamw = dict(lr=1e-4, weight_decay=0.0, fused=True)
    if stage == 1:
        return wrapped, ZeroRedundancyOptimizer(wrapped.parameters(), optimizer_class=torch.optim.AdamW, **adamw)
    return wrapped, torch.optim.AdamW(wrapped.parameters(), **adamw)


def rank_main(rank, args, stage, store, results):
    torch.set_num_threads(args.threads)
    # A file store: no port to race other programs for between choosing it and binding it.
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=args.ranks)
    torch.manual_seed(0)  # the same initial model on every rank
    model = Gpt2(args.max_seq, args.layers, args.heads, args.channels, vocab=args.vocab)
    wrapped, optimizer = wrap(stage, model)
    gen = torch.Generator().manual_seed(1009 + rank)
    times = []
    for k in range(args.warmup + args.iters):
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=gen)
        start = time.perf_counter()
        wrapped(tokens[:, :-1], tokens[:, 1:]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        dist.barrier()
        if k >= args.warmup:
            times.append(time.perf_counter() - start)
    if rank == 0:
        rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        results.put(f"stage={stage} wrapper={WRAPPERS[stage]} step_ms={1e3 * statistics.median(times):.3f} "
                    f"peak_rss_mib={rss_mib:.1f} torch={torch.__version__}")
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("layers", "heads", "channels", "max_seq", "vocab", "batch", "seq", "ranks"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--stages", default="0,1,2,3", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    results = mp.get_context("spawn").SimpleQueue()
    for stage in args.stages:  # fresh processes per stage, so each peak is that stage's own
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(rank_main, args=(args, stage, os.path.join(tmp, "store"), results), nprocs=args.ranks)
        print(results.get(), flush=True)

if __name__ == "__main__":
    main()
