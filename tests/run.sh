#!/usr/bin/env bash
# The test command: set-up, build, every test (unit and end-to-end against the
# real control plane), then a check that no process the run started is left.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash tests/setup.sh
# Dependencies audited offline (advisories, licenses, duplicates); a failure
# fails the run after the tests, so they still report.
audit_failed=0
bash tests/audit.sh || audit_failed=1

export SLOTKEEPER_TEST_RUN="run-$$-$(date +%s)"
# Processes that ran before the suite are never counted as its leaks.
before=" $(ls /proc | grep -E '^[0-9]+$' | tr '\n' ' ') "
export RUST_BACKTRACE=${RUST_BACKTRACE:-1}
# Incremental artifacts only help edit-compile loops; in a kept build cache
# they grow by gigabytes per run.
export CARGO_INCREMENTAL=0
cargo build --workspace --bins --locked
# The operator image from scratch (static binary; the dev profile keeps a cold
# run short), which tests/operator_image.rs runs from its root filesystem.
bash deploy/image/build.sh --profile dev
log=$(mktemp)
status=0
# Every test binary runs even after one fails, so a run reports all failures.
cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$log" || status=$?

# A process the suite started and left: it carries this run's marker, or (as
# redis-server rewrites its environment for its process title) it runs one of
# the environment's executables, did not exist before the suite, and is an
# orphan (its starter is gone), which tells it from an environment someone
# started by hand meanwhile.
# A process dying as the suite ends (its parent-death signal just fired) is
# given a few seconds to go before it counts.
find_leaks() {
  leaks=()
  for dir in /proc/[0-9]*; do
    pid=${dir#/proc/}
    [[ $pid == "$$" || $before == *" $pid "* ]] && continue
    # comm is the executed file's name, cut to 15 characters.
    comm=$(cat "$dir/comm" 2>/dev/null) || continue
    # A zombie has exited and holds nothing; reaping it is its parent's job
    # (PID 1 here, for a Pod's process whose agent died with a failed test).
    [[ $(awk '/^State:/ {print $2}' "$dir/status" 2>/dev/null) == [ZX] ]] && continue
    marked=0
    tr '\0' '\n' 2>/dev/null < "$dir/environ" | grep -qx "SLOTKEEPER_TEST_RUN=$SLOTKEEPER_TEST_RUN" && marked=1
    case "$comm" in
      redis-server|valkey-server|etcd|kube-*|slotkeeper-*)
        ppid=$(awk '/^PPid:/ {print $2}' "$dir/status" 2>/dev/null)
        [[ $ppid == 1 ]] && ours=1 || ours=0 ;;
      *) ours=0 ;;
    esac
    if ((marked || ours)); then
      leaks+=("$pid $comm $(tr '\0' ' ' < "$dir/cmdline" 2>/dev/null | cut -c1-120)")
    fi
  done
}
for _ in 1 2 3 4 5 6 7 8 9 10; do
  find_leaks
  ((${#leaks[@]})) || break
  sleep 1
done
leak_failed=0
if ((${#leaks[@]})); then
  leak_failed=1
  echo "leak check FAILED: processes left behind by the suite:" >&2
  printf '  %s\n' "${leaks[@]}" >&2
  for l in "${leaks[@]}"; do kill -9 "${l%% *}" 2>/dev/null || true; done
else
  echo "leak check: no process left behind"
fi

passed=$(grep -Eo 'test result: [a-zA-Z]+\. [0-9]+ passed' "$log" | awk '{s+=$4} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed;' "$log" | awk '{s+=$1} END {print s+0}')
ignored=$(grep -Eo '[0-9]+ ignored;' "$log" | awk '{s+=$1} END {print s+0}')
rm -f "$log"
if ((leak_failed)); then failed=$((failed + 1)); else passed=$((passed + 1)); fi
if ((audit_failed)); then
  echo "dependency audit FAILED (bash tests/audit.sh shows why)" >&2
  failed=$((failed + 1))
else
  passed=$((passed + 1))
fi
echo "total: $passed passed, $failed failed, $ignored skipped"
if ((status != 0 || leak_failed || audit_failed)); then exit 1; fi
