#!/usr/bin/env bash
# Every check CI makes: lints, then the tests in two processes side by side. The timed tests
# (servers timing real speech, admission measuring the machine) run one at a time at normal
# priority; beside them, at the lowest CPU priority, run the container image's build and the
# tests that keep no clock (`untimed`): they take only the cycles the timed tests leave.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports
beside_log=$(mktemp)
trap 'rm -f "$beside_log"' EXIT
# Its own cache off: two runs would write the same last-failed file.
nice -n 19 .venv/bin/pytest -m 'image or untimed' -p no:cacheprovider >"$beside_log" 2>&1 &
beside=$!
timed=0
.venv/bin/pytest -m 'not image and not untimed' || timed=$?
beside_status=0
wait "$beside" || beside_status=$?
echo "--- beside the timed tests (image, untimed) ---"
cat "$beside_log"
echo "timed tests: exit $timed; beside them: exit $beside_status"
((timed == 0 && beside_status == 0))
