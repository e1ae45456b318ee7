"""The shipped default profiles against published step times: the validation table.

Every row of ``pipeline/sim/profiles/_published_step_times.csv`` (vLLM decode steps from
Lambda's vllm-benchmark, TensorRT-LLM first-token latencies; docs/cost_model.md cites
each) predicted by the default profile of its model, GPU and tensor-parallel degree;
then the median and p90 of |predicted / measured - 1| per phase and per (phase, TP).
Target: within +-30% median per phase at TP 1-8. Those rows set the defaults, so the
held-out figures (``HELD_OUT``: vLLM's end-to-end latency tests on H200, TensorRT-LLM's
fp8 first tokens on H100) are printed too.

    .venv/bin/python bench/defaults_accuracy.py            # prints, writes bench/RESULTS.md
    .venv/bin/python bench/defaults_accuracy.py --print    # prints only
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from _measure import record  # noqa: E402

from pipeline.calibrate.published import HELD_OUT, defaults_accuracy, held_out_ms  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print only")
    args = parser.parse_args()
    rows = defaults_accuracy()
    lines = [
        "| source | model | GPU | TP | phase | batch | prompt | context | measured (ms) "
        "| predicted (ms) | error |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    errors: dict[tuple[str, int | None], list[float]] = {}
    for row, pred in rows:
        err = pred / row.time_ms - 1
        for key in ((row.phase, None), (row.phase, row.tp)):
            errors.setdefault(key, []).append(err)
        lines.append(
            f"| {row.source} | {row.model} | {row.gpu} | {row.tp} | {row.phase} | "
            f"{row.batch_size} | {row.prompt_tokens} | {row.context_tokens} | "
            f"{row.time_ms:g} | {pred:.2f} | {err:+.1%} |"
        )
    summary = [
        "| phase | TP | rows | median error | median abs error | p90 abs error |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for (phase, tp), errs in sorted(errors.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        e = np.array(errs)
        summary.append(
            f"| {phase} | {'all' if tp is None else tp} | {len(e)} | {np.median(e):+.1%} | "
            f"{np.median(np.abs(e)):.1%} | {np.quantile(np.abs(e), 0.9):.1%} |"
        )
    held = [
        "| held out | source | GPU | TP | dtype | batch | prompt | output | measured (ms) "
        "| predicted (ms) | error |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for h in HELD_OUT:
        pred = held_out_ms(h)
        held.append(
            f"| {h.label} | {h.source} | {h.gpu} | {h.tp} | {h.dtype} | {h.batch} | "
            f"{h.prompt_tokens} | {h.output_tokens} | {h.measured_ms:g} | {pred:.1f} | "
            f"{pred / h.measured_ms - 1:+.1%} |"
        )
    body = (
        "Fitted rows (every row set a default):\n\n"
        + "\n".join(summary)
        + "\n\nHeld out (never fitted; whole requests or first tokens):\n\n"
        + "\n".join(held)
        + "\n\nPer fitted row:\n\n"
        + "\n".join(lines)
    )
    print(body)
    if not args.print:
        section = "Default profiles vs published step times"
        record(section, "python bench/defaults_accuracy.py", body)


if __name__ == "__main__":
    main()
