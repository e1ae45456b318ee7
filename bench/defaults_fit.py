"""Re-derive the fitted default efficiencies from the published step times, with hold-out.

For each GPU with published rows (``pipeline/sim/profiles/_published_step_times.csv``),
fit the efficiencies that docs/cost_model.md marks *fitted* (the others stay at their
shipped priors) by robust least squares (soft-L1) on log(predicted / measured), and print
them next to the shipped values (which are these, rounded). Then leave-one-out: refit
without each row and predict it, the hold-out error of the procedure.

    .venv/bin/python bench/defaults_fit.py            # prints, writes bench/RESULTS.md
    .venv/bin/python bench/defaults_fit.py --print    # prints only
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from _measure import record  # noqa: E402

from pipeline.calibrate.published import PublishedStep, predict_ms, published_rows  # noqa: E402
from pipeline.sim.hardware import Efficiency, load_efficiencies, load_gpus, load_models  # noqa: E402
from pipeline.sim.roofline import derive_step_cost  # noqa: E402

# (field, scale, lower, upper): the factors fitted per GPU to its published rows; the rest
# are priors. H100's decode-side factors are fitted to real vLLM runs instead
# (bench/fidelity.py --fit-defaults): its published rows are a check of them here.
FITTED = {
    "a100-80gb": [
        ("compute_efficiency", 1.0, 0.3, 1.0),
        ("gemm_half_tokens", 100.0, 0.0, 20.0),
        ("memory_efficiency", 1.0, 0.4, 1.0),
        ("layer_overhead_s", 1e-5, 0.0, 20.0),
        ("allreduce_latency_s", 1e-5, 0.0, 10.0),
        ("allreduce_hop_latency_s", 1e-6, 0.0, 10.0),
        ("seq_layer_overhead_s", 1e-6, 0.0, 20.0),
    ],
}
CHECKED = ("h100-80gb",)


def _with(
    eff: Efficiency, spec: list[tuple[str, float, float, float]], z: np.ndarray
) -> Efficiency:
    return dataclasses.replace(
        eff, **{n: float(v * s) for (n, s, _, _), v in zip(spec, z, strict=True)}
    )


def _predict(row: PublishedStep, eff: Efficiency) -> float:
    cost = derive_step_cost(load_models()[row.model], load_gpus()[row.gpu], row.tp, eff)
    return predict_ms(cost, row)


def fit(
    rows: list[PublishedStep], eff: Efficiency, spec: list[tuple[str, float, float, float]]
) -> Efficiency:
    """The efficiencies of ``spec`` fitted to ``rows``, starting from ``eff``."""

    def residuals(z: np.ndarray) -> list[float]:
        e = _with(eff, spec, z)
        return [float(np.log(_predict(r, e) / r.time_ms)) for r in rows]

    x0 = np.array([min(max(getattr(eff, n) / s, lo), hi) for n, s, lo, hi in spec])
    lo = np.array([b for _, _, b, _ in spec])
    hi = np.array([b for _, _, _, b in spec])
    z = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.05).x
    return _with(eff, spec, z)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print only")
    args = parser.parse_args()
    rows = published_rows()
    shipped = load_efficiencies()
    out = []
    for gpu, spec in FITTED.items():
        mine = [r for r in rows if r.gpu == gpu]
        fitted = fit(mine, shipped[gpu], spec)
        out.append(f"{gpu} ({len(mine)} rows):\n")
        out.append("| factor | refitted | shipped |\n| --- | --- | --- |")
        for n, *_ in spec:
            out.append(f"| `{n}` | {getattr(fitted, n):.4g} | {getattr(shipped[gpu], n):.4g} |")
        loo = []
        for i, row in enumerate(mine):
            rest = mine[:i] + mine[i + 1 :]
            loo.append(_predict(row, fit(rest, shipped[gpu], spec)) / row.time_ms - 1)
        err = np.abs(np.array(loo))
        worst = int(np.argmax(err))
        w = mine[worst]
        out.append(
            f"\nleave-one-out: median |error| {np.median(err):.1%}, "
            f"p90 {np.quantile(err, 0.9):.1%}, worst {loo[worst]:+.1%} ({w.model} tp{w.tp} "
            f"{w.phase} batch {w.batch_size} prompt {w.prompt_tokens})\n"
        )
    for gpu in CHECKED:
        mine = [r for r in rows if r.gpu == gpu]
        err = np.abs([_predict(r, shipped[gpu]) / r.time_ms - 1 for r in mine])
        out.append(
            f"{gpu} ({len(mine)} rows, none fitted: its factors come from real runs): median "
            f"|error| {np.median(err):.1%}, p90 {np.quantile(err, 0.9):.1%}, worst "
            f"{err.max():.1%}\n"
        )
    body = "\n".join(out)
    print(body)
    if not args.print:
        record("Default efficiencies refitted, leave-one-out", "python bench/defaults_fit.py", body)


if __name__ == "__main__":
    main()
