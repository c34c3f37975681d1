#!/usr/bin/env bash
# Fetches Abseil's sources into the folder given ($1), for the ThreadSanitizer build (cmake/ZeroAbseilSource.cmake):
# the copy vendored in grpcio's source release on PyPI, pinned by version and SHA-256. Does nothing when present.
set -euo pipefail
dest=$1
[ -f "$dest/absl/base/config.h" ] && exit 0

release=grpcio-1.85.3
url="https://files.pythonhosted.org/packages/1e/48/8e14d92cca434b448c7018654da80f574aea3663f7d1f87ed044455c45c6/$release.tar.gz"
sha256=8e18f15d1b09b8771edbf59d634b26cbe4903bc2577cb667264934a6655eb8b4
archive="$dest.download.tar.gz"
mkdir -p "$(dirname "$dest")"
echo "abseil_source: fetching Abseil's sources from $release on PyPI" >&2
python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' "$url" "$archive"
echo "$sha256  $archive" | sha256sum --check --quiet || {
  echo "abseil_source: $archive does not have the pinned SHA-256 $sha256; delete it and retry" >&2
  exit 1
}
rm -rf "$dest.partial" && mkdir -p "$dest.partial"
tar -xzf "$archive" -C "$dest.partial" --strip-components=3 "$release/third_party/abseil-cpp"
mv "$dest.partial" "$dest" && rm -f "$archive"
