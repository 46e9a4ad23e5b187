#!/usr/bin/env bash
# Every check CI makes: lints, then the tests in three processes side by side. The timed tests
# (servers timing real speech, admission measuring the machine) run one at a time at normal
# priority; beside them, at the lowest CPU priority, the container image's build and the tests
# that keep no clock (`untimed`) take only the cycles the timed tests leave. Those two are
# separate processes so that, once the timed tests end, each keeps a core busy.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
beside=(image untimed)
pids=()
for marker in "${beside[@]}"; do
    # Their own cache off: runs side by side would write the same last-failed file.
    nice -n 19 .venv/bin/pytest -m "$marker" -p no:cacheprovider >"$logs/$marker" 2>&1 &
    pids+=($!)
done
timed=0
.venv/bin/pytest -m 'not image and not untimed' || timed=$?
failed=0
for index in "${!beside[@]}"; do
    status=0
    wait "${pids[$index]}" || status=$?
    echo "--- beside the timed tests: ${beside[$index]} (exit $status) ---"
    cat "$logs/${beside[$index]}"
    ((status == 0)) || failed=1
done
echo "timed tests: exit $timed"
((timed == 0 && failed == 0))
