"""Calibration on published step-time tables: held-out error of `calibrate measurements`.

For every group (model, GPU, tensor-parallel degree) of the published tables in
tests/fixtures/step_tables/ (README there: source, rows, what was derived and dropped),
fit the rows of ``holdout.interpolating_split`` (batch-1 prefills at 128, 512, 2048 and
8192 tokens plus the largest batched prefill; decodes at batch 1 after those prompts,
batch 8 and the largest batch) from the analytic profile of the group's model, GPU and
degree (``pipeline.sim.profiles.build_profile``), and predict the held-out rows. Per
phase, median and p90 of |predicted / measured - 1| for:

- like: the analytic --like profile as it is;
- fixed 5%: the fit with the robust loss scale fixed at 5% (``fit.SCALE_SPREADS = 0``),
  the fit before the scale was set per phase;
- fit: `calibrate measurements` as it is;
- baseline: ``holdout.baseline_predict``, plain least squares of four terms per phase
  (prefill a + b P + c A + d N, decode a + b D + c C + d D^2).

Target (issue 20): median <= 10% and p90 <= 20% per group and phase.

Run from the repository root:

    .venv/bin/python bench/calibrate_tables.py           # prints, writes bench/RESULTS.md
    .venv/bin/python bench/calibrate_tables.py --print   # prints only
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from _measure import record  # noqa: E402

from pipeline.calibrate import fit  # noqa: E402
from pipeline.calibrate.fit import PhaseError  # noqa: E402
from pipeline.calibrate.holdout import (  # noqa: E402
    Group,
    HoldOut,
    groups,
    holdout,
)
from pipeline.calibrate.measurements import read_measurements  # noqa: E402
from pipeline.sim.profiles import build_profile  # noqa: E402

F64 = npt.NDArray[np.float64]
TABLES = ROOT / "tests" / "fixtures" / "step_tables"
MEDIAN_MAX, P90_MAX = 0.10, 0.20


def like_of(g: Group) -> dict[str, float]:
    assert g.model is not None and g.gpu is not None and g.tensor_parallel is not None
    return build_profile(g.model, g.gpu, g.tensor_parallel)["coefficients"]


def pct(e: PhaseError | None, which: str) -> str:
    v = None if e is None else getattr(e, which)
    return "-" if v is None else f"{v:.1%}"


def met(e: PhaseError) -> bool:
    return (
        e.median is not None and e.p90 is not None and e.median <= MEDIAN_MAX and e.p90 <= P90_MAX
    )


def holdout_table(results: list[tuple[HoldOut, HoldOut]]) -> tuple[str, int, int]:
    head = (
        "| group | phase | held out | like median / p90 | fixed 5% median / p90 "
        "| fit median / p90 | baseline median / p90 | fit met | baseline met |\n"
        "|---|---|---:|---:|---:|---:|---:|:---:|:---:|"
    )
    lines, fit_met, base_met = [head], 0, 0
    for now, before in results:
        for phase in ("prefill", "decode"):
            e, b, lk, old = (
                now.fit[phase],
                now.baseline[phase],
                now.like[phase],
                before.fit[phase],
            )
            fit_met += met(e)
            base_met += met(b)
            cells = [now.group.label, phase, str(e.rows)]
            cells += [f"{pct(x, 'median')} / {pct(x, 'p90')}" for x in (lk, old, e, b)]
            cells += ["yes" if met(e) else "no", "yes" if met(b) else "no"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines), fit_met, base_met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print only")
    args = parser.parse_args()
    parts = []
    for path in sorted(TABLES.glob("*.csv")):
        m = read_measurements(path)
        gs = groups(m)
        results = []
        for g in gs:
            now = holdout(m, g, like_of(g))
            spreads, fit.SCALE_SPREADS = fit.SCALE_SPREADS, 0.0
            try:
                before = holdout(m, g, like_of(g))
            finally:
                fit.SCALE_SPREADS = spreads
            results.append((now, before))
        table, fit_met, base_met = holdout_table(results)
        n = 2 * len(gs)
        parts.append(
            f"`{path.relative_to(ROOT)}` ({len(m)} rows, {len(gs)} groups), held-out rows, "
            f"|predicted / measured - 1|; {fit_met} of {n} (group, phase) cells meet median "
            f"<= 10% and p90 <= 20% with the fit, {base_met} with the baseline:\n\n{table}\n"
        )
    body = "\n".join(parts)
    print(body)
    if not args.print:
        record("Calibration on published tables", "python bench/calibrate_tables.py", body)


if __name__ == "__main__":
    main()
