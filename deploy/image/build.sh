#!/usr/bin/env bash
# Builds the operator image from scratch with buildah: the operator linked
# statically (glibc, crt-static), a passwd entry for the non-root user 65532,
# entrypoint /slotkeeper. The result is an OCI image layout, by default at
# target/image/slotkeeper, and the image stays in buildah's store under the
# build directory for `buildah push` (see the README).
#
#   bash deploy/image/build.sh [--profile release|dev] [--out DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
profile=release
out=$root/target/image/slotkeeper
while (($#)); do
  case $1 in
    --profile) profile=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--profile release|dev] [--out DIR]" >&2; exit 2 ;;
  esac
done
command -v buildah > /dev/null || { echo "buildah is not installed: apt-get install buildah" >&2; exit 1; }
target=${CARGO_TARGET_DIR:-$root/target}
triple=$(rustc -vV | sed -n 's/^host: //p')
# With --target, RUSTFLAGS reach only the operator's own code and libraries,
# not build scripts and proc-macros (which cannot be static).
(cd "$root" && RUSTFLAGS="-C target-feature=+crt-static" cargo build --quiet --locked \
  --profile "$profile" --target "$triple" -p slotkeeper --bin slotkeeper)
[[ $profile == dev ]] && dir=debug || dir=$profile
binary=$target/$triple/$dir/slotkeeper
if ldd "$binary" 2>&1 | grep -q '=>'; then
  echo "$binary is linked dynamically; a scratch image cannot run it" >&2
  exit 1
fi
version=$(sed -n 's/^ *image: slotkeeper:\(.*\)$/\1/p' "$root/deploy/operator.yaml" | head -1)
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
# Without debug information (a debug build's is most of its size).
strip --strip-debug -o "$context/slotkeeper" "$binary"
cp "$root/deploy/image/Containerfile" "$root/deploy/image/passwd" "$root/deploy/image/group" "$context/"
# Its own storage under the build directory (vfs: no overlay mount needed).
storage=(--storage-driver vfs --root "$target/buildah/storage" --runroot "$target/buildah/run")
buildah "${storage[@]}" rmi --force "slotkeeper:$version" > /dev/null 2>&1 || true
buildah "${storage[@]}" bud --quiet --layers=false -f "$context/Containerfile" -t "slotkeeper:$version" "$context" > /dev/null
rm -rf "$out"
mkdir -p "$(dirname "$out")"
buildah "${storage[@]}" push --quiet "slotkeeper:$version" "oci:$out:slotkeeper:$version"
echo "built slotkeeper:$version ($profile, static) as an OCI layout at $out"
