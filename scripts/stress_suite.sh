#!/usr/bin/env bash
# The suite under CPU load: one busy-looping Python process per core (what a shared CI
# machine or a developer's build does to the tests' clocks), then pytest RUNS times in a
# row; stops at the first failing run. The burners end with the script.
#
#   scripts/stress_suite.sh                     # the whole suite, 3 times
#   scripts/stress_suite.sh -n 1 tests/live     # pytest arguments after the options
#   BURNERS=4 scripts/stress_suite.sh           # more burners than cores
#
# PYTHON (default .venv/bin/python) runs both the burners and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=3
if [[ "${1:-}" == "-n" ]]; then
    runs=$2
    shift 2
fi
py=${PYTHON:-.venv/bin/python}
burners=${BURNERS:-$(nproc)}
pids=()
stop_burners() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
}
trap stop_burners EXIT
for _ in $(seq "$burners"); do
    "$py" -c "while True: pass" &
    pids+=("$!")
done
for run in $(seq "$runs"); do
    echo "stress run $run of $runs, $burners burner(s) on $(nproc) core(s)" >&2
    start=$SECONDS
    if ! "$py" -m pytest "$@"; then
        echo "stress run $run of $runs failed after $((SECONDS - start)) s" >&2
        exit 1
    fi
    echo "stress run $run of $runs passed in $((SECONDS - start)) s" >&2
done
