#!/usr/bin/env bash
# The seed lab on a trace, end to end:
#   1. a sweep (grid.toml): static vs continuous batching throughput, a concurrency
#      cap sweep, queue depth vs p99 wait, with goodput at p99 TTFT <= 200 ms;
#   2. prefill and decode cost separated (prefill_decode.sql) and wait by queue
#      depth (queue_wait.sql) for the sweep;
#   3. the capacity searches (capacity.toml): the highest concurrency and the
#      highest rate meeting p99 TTFT <= 200 ms, and the replicas for 4x the traffic.
#
#   examples/seed_lab/run.sh [TRACE] [WAREHOUSE]
#
# TRACE defaults to the bundled sample traces/azure_conv.csv (any log
# `tracereplay ingest` reads works); WAREHOUSE to out/seed_lab/<trace file name>.
# Installs tracereplay into ./.venv first when it is not there.
set -euo pipefail
cd "$(dirname "$0")/../.."
trace="${1:-traces/azure_conv.csv}"
wh="${2:-out/seed_lab/$(basename "$trace")}"
if [ ! -x .venv/bin/tracereplay ]; then
    python3 -m venv .venv
    .venv/bin/python -m pip install --quiet -e .
fi
tr=.venv/bin/tracereplay
"$tr" ingest "$trace" --warehouse "$wh" --quiet
"$tr" sweep examples/seed_lab/grid.toml --warehouse "$wh" --quiet
echo
echo "prefill and decode cost, separated:"
"$tr" sql --warehouse "$wh" -f examples/seed_lab/prefill_decode.sql --format csv
echo
echo "wait by queue depth on arrival (vllm, cap 16, the logged rate):"
"$tr" sql --warehouse "$wh" -f examples/seed_lab/queue_wait.sql \
    --param scenario=lab-vllm-c16-x1 --format csv
echo
"$tr" capacity examples/seed_lab/capacity.toml --warehouse "$wh" --quiet
