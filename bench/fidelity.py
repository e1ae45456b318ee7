"""The fidelity benchmark: replay real vLLM runs on real GPUs and compare, per run and load
stage, simulated against measured p50/p90/p99 (and mean) of TTFT, TPOT and E2E.

The ground truth is read from ``../shared/fidelity/`` beside the project (``--root``):

- ``llmservingsim-vllm/``: four per-request runs of vLLM 0.19 (RTX 4090, RTX PRO 6000),
  timed at the engine core, with LLMServingSim's own prediction of each (the peer);
- ``blis-training-h100/``: inference-perf experiments against vLLM 0.15.1 on H100 SXM,
  timed by an HTTP client, aggregates per load stage. The three "reasoning" experiments are
  left out (overloaded: over 10% of their requests failed, as their source notes).

Each run is replayed with its engine's recorded settings (``pipeline/calibrate/groundtruth``
reads them) and two profiles:

- **uncalibrated**: what ``tracereplay profile new`` builds from the model's shape and the
  GPU's datasheet, runtime ``vllm`` (front end per the run's timing);
- **calibrated**: ``calibrate observed``'s fit (``pipeline/calibrate/observed_fit``) on one
  stage or run of the same model and GPU, predicting the others (the row says which).

    .venv/bin/python bench/fidelity.py                  # prints, writes bench/RESULTS.md
    .venv/bin/python bench/fidelity.py --print --only llama-2-7b

The error figures per run (median |error| over its stages of p50 and p99 of TTFT, TPOT and
E2E) are what docs/fidelity.md quotes.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from _measure import record  # noqa: E402

from pipeline.calibrate.fidelity import (  # noqa: E402
    StageResult,
    analytic_profile,
    error_rows,
    replay_with_profile,
)
from pipeline.calibrate.groundtruth import (  # noqa: E402
    GroundTruthRun,
    read_inference_perf,
    read_llmservingsim,
)

DEFAULT_ROOT = ROOT.parent / "shared" / "fidelity"
# GPU KV blocks of the inference-perf experiments' engines (block 16), per model, as the
# data set's README records them (the experiments' own files do not)
BLIS_KV_BLOCKS = {
    "llama-2-7b": 7463,
    "llama-2-70b": 31357,
    "mixtral-8x7b": 27511,
    "codellama-34b": 26603,
}
BLIS_VERSION = "vLLM 0.15.1"
LEFT_OUT = ("reasoning",)  # overloaded experiments (over 10% failures), left out by their source
SHOWN = (
    ("ttft_s", "p50"),
    ("ttft_s", "p99"),
    ("tpot_s", "p50"),
    ("e2e_s", "p50"),
    ("e2e_s", "p99"),
)


def discover(root: Path) -> list[GroundTruthRun]:
    """Every run of the ground truth under ``root``."""
    runs: list[GroundTruthRun] = []
    lss = root / "llmservingsim-vllm" / "bench" / "examples"
    for meta in sorted(lss.glob("*/*/vllm/meta.json")):
        runs.append(read_llmservingsim(meta.parents[1], root / "llmservingsim-vllm" / "workloads"))
    blis = root / "blis-training-h100" / "default_args"
    for exp in sorted(blis.glob("*/exp-config.yaml")):
        if any(word in exp.parent.name for word in LEFT_OUT):
            continue
        run = read_inference_perf(exp.parent, engine_version=BLIS_VERSION)
        run.scenario["num_gpu_blocks"] = BLIS_KV_BLOCKS[run.model]
        runs.append(run)
    return runs


def summarize(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Median |error| over rows of each shown (metric, stat)."""
    out = {}
    for metric, stat in SHOWN:
        e = [abs(r["error"]) for r in rows if r["metric"] == metric and r["stat"] == stat]
        e = [x for x in e if math.isfinite(x)]
        out[f"{metric[:-2]} {stat}"] = float(np.median(e)) if e else math.nan
    return out


def _pct(x: float) -> str:
    return "—" if not math.isfinite(x) else f"{x:+.1%}"


def stage_table(run: GroundTruthRun, results: dict[str, list[StageResult]]) -> list[str]:
    """Markdown rows: per stage, measured and each profile's simulated figure with its error."""
    lines = []
    labels = list(results)
    for i, stage in enumerate(run.stages):
        rate = "trace" if stage.rate is None else f"{stage.rate:g}/s"
        cells = [run.name, str(stage.index), rate]
        for metric, stat in SHOWN:
            measured = stage.measured[metric][stat]
            if not math.isfinite(measured):
                cells.append("—")
                continue
            parts = [f"{measured * 1e3:.1f}"]
            for label in labels:
                parts.append(_pct(results[label][i].error(metric, stat)))
            if run.peer and i == 0 and len(run.stages) == 1:
                peer = run.peer.get(metric, {}).get(stat, math.nan)
                parts.append(f"peer {_pct(peer / measured - 1)}")
            cells.append(" / ".join(parts))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="the ground truth")
    parser.add_argument("--only", help="runs whose name contains this")
    parser.add_argument("--print", action="store_true", help="print only")
    args = parser.parse_args()
    runs = [r for r in discover(args.root) if not args.only or args.only in r.name]
    if not runs:
        raise SystemExit(f"no ground-truth runs under {args.root}")
    started = time.perf_counter()
    all_rows: dict[str, list[dict[str, Any]]] = {"uncalibrated": []}
    table = []
    for run in runs:
        results = {"uncalibrated": replay_with_profile(run, analytic_profile(run))}
        all_rows["uncalibrated"] += error_rows(run, results["uncalibrated"], "uncalibrated")
        table += stage_table(run, results)
    head = "| run | stage | rate | " + " | ".join(f"{m[:-2]} {s} ms (error)" for m, s in SHOWN)
    out = [head + " |", "|" + " --- |" * (3 + len(SHOWN)), *table, ""]
    for label, rows in all_rows.items():
        s = summarize(rows)
        out.append(f"{label}: median |error| " + ", ".join(f"{k} {v:.1%}" for k, v in s.items()))
    out.append(f"\n{len(runs)} runs in {time.perf_counter() - started:.0f} s")
    body = "\n".join(out)
    print(body)
    if not args.print:
        record("Fidelity against real vLLM runs", "python bench/fidelity.py", body)


if __name__ == "__main__":
    main()
