#!/usr/bin/env python3
"""The GPU benchmark's summary: zero's GPT-2 step against PyTorch's on the same GPU, with MFU.

Reads zero-bench stages' CSVs (one stage row each, labelled: zero's runs, e.g. with cuDNN's attention and with
the tiled kernels) and benchmarks/torch_gpt2.py's CSVs (the model's shape and parameter count come from them). Each run's speed is
also given against the fastest PyTorch run. Model FLOPs per token as llm.c counts them: 6·N for the weights' forward
and backward, plus 6·L·C·T for causal attention (QKᵀ and AV over half the T×T scores, times 3 for
forward and backward). MFU is over the GPU's dense bf16 peak, looked up by its name.

usage: bench_report.py --gpu NAME --zero LABEL=CSV [--zero LABEL=CSV ...] TORCH_CSV...
"""
import argparse
import csv

# Dense (not 2:4 sparse) bf16 tensor-core peaks from NVIDIA's data sheets, in FLOP/s; first match wins.
DENSE_BF16_PEAK = [("H100 PCIe", 756e12), ("H100", 989.4e12), ("H200", 989.4e12), ("A100", 312e12)]


def dense_bf16_peak(gpu):
    return next((peak for name, peak in DENSE_BF16_PEAK if name in gpu), None)


def flops_per_token(params, layers, channels, seq):
    return 6 * params + 6 * layers * channels * seq


def read_row(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if len(rows) != 1:
        raise SystemExit(f"{path}: expected one result row, found {len(rows)}")
    return rows[0]


def labelled_csv(text):
    """LABEL=CSV, split at the last '=' (a label may hold one; a path is taken to hold none)."""
    label, sep, path = text.rpartition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"expected LABEL=CSV, got {text!r}")
    return label, path


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu", required=True, help="the GPU's name, as nvidia-smi prints it")
    p.add_argument("--zero", action="append", required=True, type=labelled_csv, metavar="LABEL=CSV",
                   help="a zero-bench stages CSV and the run's label")
    p.add_argument("torch_csvs", nargs="+")
    args = p.parse_args()

    torch_rows = [read_row(path) for path in args.torch_csvs]
    shape = torch_rows[0]
    flops = flops_per_token(*(int(shape[k]) for k in ("params", "layers", "channels", "seq")))
    peak = dense_bf16_peak(args.gpu)
    runs = [(f"zero {label}", float(read_row(path)["tokens/s"])) for label, path in args.zero]
    runs += [(f"torch {r['mode']} ({r['torch']})", float(r["tokens/s"])) for r in torch_rows]
    best_torch = max(float(r["tokens/s"]) for r in torch_rows)

    print(f"GPT-2: {shape['params']} parameters, L={shape['layers']} C={shape['channels']} T={shape['seq']}, "
          f"B={shape['batch']}; {flops / 1e9:.3f} GFLOP per token")
    print(f"{args.gpu}: dense bf16 peak " + (f"{peak / 1e12:.1f} TFLOP/s" if peak else "unknown (no MFU)"))
    print(f"{'run':<32} {'tokens/s':>12} {'TFLOP/s':>9} {'MFU':>7} {'/ fastest torch':>16}")
    for name, tps in runs:
        mfu = f"{tps * flops / peak:7.1%}" if peak else "      -"
        print(f"{name:<32} {tps:12.1f} {tps * flops / 1e12:9.2f} {mfu} {tps / best_torch:16.3f}")


if __name__ == "__main__":
    main()
