#!/usr/bin/env bash
# The main job: set-up, build, then the local environment (control plane and
# node agent) until Ctrl-C.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash tests/setup.sh
cargo build --workspace --bins --locked
exec "${CARGO_TARGET_DIR:-$root/target}/debug/slotkeeper-env" "$@"
