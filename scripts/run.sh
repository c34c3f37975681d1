#!/usr/bin/env bash
# The main job on its embedded default: builds zero, then runs the communicator self-check on 4 in-process ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh >&2
exec build/bin/zero-selfcheck --ranks 4 "$@"
