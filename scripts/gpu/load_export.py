#!/usr/bin/env python3
"""Loads a zero-train export (DIR/model.safetensors + DIR/config.json) with transformers' from_pretrained.

The GPU image has transformers, this machine does not: the train phase proves the export loads unchanged, every
weight from the file (from_pretrained fills a missing one randomly and only warns), and computes a finite loss.
usage: load_export.py DIR
"""
import math
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder; nothing to fetch

import torch
import transformers


def main(path):
    model, info = transformers.GPT2LMHeadModel.from_pretrained(path, output_loading_info=True)
    problems = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if problems:
        print(f"transformers loaded {path} with {problems}")
        return 1
    params = sum(p.numel() for p in model.parameters())
    tokens = torch.arange(min(8, model.config.vocab_size)).unsqueeze(0)  # (1, T)
    with torch.no_grad():
        loss = model(tokens, labels=tokens).loss.item()
    print(f"transformers {transformers.__version__} loaded {path}: {params} parameters, "
          f"n_layer {model.config.n_layer}, vocab {model.config.vocab_size}; loss on tokens 0..7 {loss:.4f}")
    return 0 if math.isfinite(loss) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
