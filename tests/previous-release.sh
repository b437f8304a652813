#!/usr/bin/env bash
# Builds the release Slotkeeper's own upgrade is tested from: this repository
# at the commit upgrade/PREVIOUS_RELEASE names, built once per machine into a
# cache keyed by that commit (the node agent runs it as image slotkeeper:0.1.0).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
commit=$(grep -v '^#' "$root/upgrade/PREVIOUS_RELEASE" | grep . | tail -1)
cache="${XDG_CACHE_HOME:-$HOME/.cache}/slotkeeper/releases/$commit"
[[ -x $cache/slotkeeper ]] && exit 0

if ! git -C "$root" cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "previous-release: commit $commit is not in this clone; fetch the full history (git fetch --unshallow)" >&2
  exit 1
fi
echo "setup: building the previous release ($commit) once for this machine" >&2
target="${CARGO_TARGET_DIR:-$root/target}"
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
git -C "$root" archive "$commit" | tar -x -C "$src"
# The same target directory: the dependencies both releases share are built once.
(cd "$src" && CARGO_TARGET_DIR="$target" CARGO_INCREMENTAL=0 cargo build --locked --quiet -p slotkeeper --bin slotkeeper)
mkdir -p "$cache"
cp "$target/debug/slotkeeper" "$cache/slotkeeper.partial"
mv "$cache/slotkeeper.partial" "$cache/slotkeeper"
# That build put the previous binary at $target/debug/slotkeeper, and cargo
# does not put this checkout's back while its sources are unchanged: forget
# the fingerprint of the slotkeeper binary so the next build links it again.
for dir in "$target"/debug/.fingerprint/slotkeeper-*/; do
  [[ -e $dir/bin-slotkeeper ]] && rm -rf "$dir"
done
rm -f "$target/debug/slotkeeper"
echo "setup: previous release at $cache/slotkeeper" >&2
