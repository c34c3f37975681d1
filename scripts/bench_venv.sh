#!/usr/bin/env bash
# The baseline the benchmarks compare against: the newest PyTorch from PyPI (its Linux wheel brings CUDA's
# libraries, ~5 GB) in .venv-bench/ (git-ignored), the Python zero-bench's --python and models_bench default to.
# Run it when you want the PyTorch rows; the test suite does not need it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh  # python3-venv
[ -x .venv-bench/bin/python3 ] || python3 -m venv .venv-bench
.venv-bench/bin/pip install --quiet --upgrade torch numpy
.venv-bench/bin/python3 -c 'import torch; print("bench_venv: .venv-bench has torch", torch.__version__)'
