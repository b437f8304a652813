#!/usr/bin/env bash
# The test command: set-up, build, every test (unit and end-to-end against the
# real control plane), then a check that no process the run started is left.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash tests/setup.sh

export SLOTKEEPER_TEST_RUN="run-$$-$(date +%s)"
export RUST_BACKTRACE=${RUST_BACKTRACE:-1}
cargo build --workspace --bins --locked
log=$(mktemp)
status=0
cargo test --workspace --locked 2>&1 | tee "$log" || status=$?

# Any process carrying this run's marker outlived the test that started it.
leaks=()
for environ in /proc/[0-9]*/environ; do
  pid=${environ#/proc/}; pid=${pid%/environ}
  [[ $pid == "$$" ]] && continue
  if tr '\0' '\n' < "$environ" 2>/dev/null | grep -qx "SLOTKEEPER_TEST_RUN=$SLOTKEEPER_TEST_RUN"; then
    leaks+=("$pid $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-120)")
  fi
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
echo "total: $passed passed, $failed failed, $ignored skipped"
if ((status != 0 || leak_failed)); then exit 1; fi
