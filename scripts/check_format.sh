#!/usr/bin/env bash
# Fails naming every C++/CUDA file that .clang-format would change, or that has a line over its 120 columns.
# With --fix, rewrites the files in place instead. clang-format 14 (Debian 12's): another version formats
# some constructs differently, so the check names the binary.
set -euo pipefail
cd "$(dirname "$0")/.."

formatter=clang-format-14
command -v "$formatter" >/dev/null || { echo "check_format: $formatter not found; run scripts/install_deps.sh" >&2; exit 1; }
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')

if [ "${1:-}" = "--fix" ]; then
  "$formatter" -i "${files[@]}"
  exit 0
fi
status=0
unformatted=$("$formatter" --dry-run --Werror "${files[@]}" 2>&1 | grep -oE "^[^ :]+:[0-9]+:[0-9]+: error" | cut -d: -f1 |
  sort -u || true)
if [ -n "$unformatted" ]; then
  echo "$unformatted" | sed 's|^|check_format: not formatted (fix: scripts/check_format.sh --fix): |' >&2
  status=1
fi
long=$(LC_ALL=C.UTF-8 grep -Hn '.\{121,\}' "${files[@]}" | cut -d: -f1,2 || true)  # characters, not bytes
if [ -n "$long" ]; then
  echo "$long" | sed 's|^|check_format: over 120 columns: |' >&2
  status=1
fi
[ "$status" -eq 0 ] && echo "check_format: ${#files[@]} files follow .clang-format"
exit "$status"
