#!/usr/bin/env bash
# Calibrate, replay live and validate on one GPU, offline, in one go (< 10 minutes on an
# H200-class GPU with the default Llama-3-8B shape).
#
#   scripts/gpu_calibrate.sh TRACE OUT_DIR [options]
#
#   TRACE        a request log tracereplay can ingest (traces/azure_conv.csv is the bundled
#                Azure conversation sample)
#   OUT_DIR      everything lands here: profile.json (+ .measurements.csv), live_requests.parquet,
#                validation.parquet, validation_requests.parquet, the warehouse, gpu_calibrate.log
#
# Options (each also as an environment variable):
#   --shape NAME          model shape [TR_SHAPE, default llama3-8b]; "tiny" tests it on a CPU
#   --num-requests N      requests replayed live [TR_SAMPLE, default 300]
#   --skip N              leading requests left out [TR_SKIP, default 0]
#   --time-scale X        multiply inter-arrival times [TR_TIME_SCALE, default 1.0]
#   --design NAME         probe design: gpu, cpu, smoke [TR_DESIGN, default gpu on CUDA, else cpu]
#   --num-gpu-blocks N    KV blocks of the live engine [TR_NUM_BLOCKS]
#   --block-size N        tokens per KV block [TR_BLOCK_SIZE, default 64]
#   --max-num-batched-tokens N  tokens per step [TR_MAX_BATCH_TOKENS]
#   --timeout-s S         bound on each live request [TR_TIMEOUT, default 420]
#   (the names of `tracereplay live`; the old --sample, --num-blocks, --max-batch-tokens and
#   --timeout still work for one release)
#   --wheelhouse DIR      install tracereplay's own dependencies from this directory
#                         (pip --no-index) when they are missing; make it on a machine with
#                         network: pip download -d DIR --python-version 3.X --only-binary=:all: \
#                         polars pyarrow duckdb altair click numpy numba rich zstandard jinja2 scipy
#
# Needs torch and transformers (any 5.x from 5.17) and no network: the model gets random
# weights (seeded) from its shape, nothing is downloaded.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TRACE="${1:?usage: scripts/gpu_calibrate.sh TRACE OUT_DIR [options]}"
OUT="${2:?usage: scripts/gpu_calibrate.sh TRACE OUT_DIR [options]}"
shift 2
SHAPE="${TR_SHAPE:-llama3-8b}"
SAMPLE="${TR_SAMPLE:-300}"
SKIP="${TR_SKIP:-0}"
TIME_SCALE="${TR_TIME_SCALE:-1.0}"
DESIGN="${TR_DESIGN:-}"
NUM_BLOCKS="${TR_NUM_BLOCKS:-}"
BLOCK_SIZE="${TR_BLOCK_SIZE:-64}"
MAX_BATCH_TOKENS="${TR_MAX_BATCH_TOKENS:-}"
TIMEOUT="${TR_TIMEOUT:-420}"
WHEELS="${TR_WHEELHOUSE:-}"
while [ $# -gt 0 ]; do
    case "$1" in
        --shape) SHAPE="$2"; shift 2 ;;
        --num-requests) SAMPLE="$2"; shift 2 ;;
        --skip) SKIP="$2"; shift 2 ;;
        --time-scale) TIME_SCALE="$2"; shift 2 ;;
        --design) DESIGN="$2"; shift 2 ;;
        --num-gpu-blocks) NUM_BLOCKS="$2"; shift 2 ;;
        --block-size) BLOCK_SIZE="$2"; shift 2 ;;
        --max-num-batched-tokens) MAX_BATCH_TOKENS="$2"; shift 2 ;;
        --timeout-s) TIMEOUT="$2"; shift 2 ;;
        --sample|--num-blocks|--max-batch-tokens|--timeout)
            case "$1" in
                --sample) new=--num-requests; SAMPLE="$2" ;;
                --num-blocks) new=--num-gpu-blocks; NUM_BLOCKS="$2" ;;
                --max-batch-tokens) new=--max-num-batched-tokens; MAX_BATCH_TOKENS="$2" ;;
                *) new=--timeout-s; TIMEOUT="$2" ;;
            esac
            echo "warning: $1 is deprecated; use $new" >&2; shift 2 ;;
        --wheelhouse) WHEELS="$2"; shift 2 ;;
        *) echo "gpu_calibrate.sh: unknown option $1 (see the header of this script)" >&2; exit 2 ;;
    esac
done
[ -f "$TRACE" ] || { echo "gpu_calibrate.sh: $TRACE: no such file" >&2; exit 2; }
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/gpu_calibrate.log"
: > "$LOG"
exec > >(tee -a "$LOG") 2>&1
PY="${PYTHON:-python3}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
START=$(date +%s)
stamp() { echo "[$(( $(date +%s) - START ))s] $*"; }

stamp "torch and transformers:"
# one import of torch for the versions and whether CUDA is there (the first line)
INFO=$("$PY" -c "import torch, transformers; print(int(torch.cuda.is_available())); print('  torch', torch.__version__, '| transformers', transformers.__version__, '| cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')")
CUDA=$(head -n 1 <<<"$INFO")
tail -n +2 <<<"$INFO"
if ! "$PY" -c "import polars, pyarrow, duckdb, numba, scipy, click, rich, altair, zstandard, jinja2" 2>/dev/null; then
    if [ -z "$WHEELS" ]; then
        echo "gpu_calibrate.sh: tracereplay's dependencies are missing; pass --wheelhouse DIR (see the header)" >&2
        exit 2
    fi
    stamp "installing tracereplay's dependencies from $WHEELS (no network)"
    "$PY" -m pip install --no-index --find-links "$WHEELS" --quiet \
        polars pyarrow duckdb altair click numpy numba rich zstandard jinja2 scipy
fi
if [ "$CUDA" = 1 ]; then
    DESIGN="${DESIGN:-gpu}"; NUM_BLOCKS="${NUM_BLOCKS:-2048}"; MAX_BATCH_TOKENS="${MAX_BATCH_TOKENS:-2048}"
else
    DESIGN="${DESIGN:-cpu}"; NUM_BLOCKS="${NUM_BLOCKS:-512}"; MAX_BATCH_TOKENS="${MAX_BATCH_TOKENS:-512}"
fi
TR=("$PY" -m pipeline)
WH="$OUT/warehouse"

stamp "ingest $TRACE"
"${TR[@]}" ingest "$TRACE" --warehouse "$WH"

stamp "calibrate live: shape $SHAPE, design $DESIGN"
"${TR[@]}" calibrate live --engine inprocess --model-config "$SHAPE" --design "$DESIGN" \
    --block-size "$BLOCK_SIZE" -o "$OUT/profile.json"

stamp "live: $SAMPLE requests (skip $SKIP), time scale $TIME_SCALE"
"${TR[@]}" live --engine inprocess --model-config "$SHAPE" --warehouse "$WH" \
    --num-requests "$SAMPLE" --skip "$SKIP" --time-scale "$TIME_SCALE" \
    --num-gpu-blocks "$NUM_BLOCKS" --block-size "$BLOCK_SIZE" \
    --max-num-batched-tokens "$MAX_BATCH_TOKENS" --timeout-s "$TIMEOUT" \
    --json > "$OUT/live.json"
RUN=$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['run_id'])" "$OUT/live.json")
"$PY" -c "import json, sys; s = json.load(open(sys.argv[1]))['summary']; print('  completed', s['completed'], 'of', s['num_requests'], '| TTFT p50', s['ttft_p50_s'], '| TPOT p50', s['tpot_p50_s'])" "$OUT/live.json"

stamp "validate $RUN"
"${TR[@]}" validate "$RUN" --warehouse "$WH" --profile "$OUT/profile.json" --json > "$OUT/validation.json"
VAL=$("$PY" - "$OUT/validation.json" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
for e in v["errors"]:
    err = "n/a" if e["error"] is None else f"{e['error']:+.1%}"
    print(f"  {e['metric']:>24} {e['stat']:>7}  live {e['live']!s:>22}  sim {e['simulated']!s:>22}  {err}", file=sys.stderr)
print(v["run_id"])
PY
)

for table in live_requests live_metrics; do
    cp "$WH/$table/run_id=$RUN/"*.parquet "$OUT/$table.parquet" 2>/dev/null || true
done
for table in validation validation_requests; do
    cp "$WH/$table/run_id=$VAL/"*.parquet "$OUT/$table.parquet"
done
stamp "done: $(ls "$OUT" | tr '\n' ' ')"
