#!/usr/bin/env bash
# The main job on its embedded default: builds zero, then trains a small GPT-2 on generated 3-digit
# addition with 4 in-process ranks at ZeRO stage 3 (zero-train's built-in config; flags override keys).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh >&2
exec build/bin/zero-train "$@"
