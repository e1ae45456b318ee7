"""Synthetic step-time measurements for checking the fit (tests and bench/).

``design_grid`` lays out the steps a benchmark would measure: prefills over prompt sizes
x batch sizes and decodes over batch sizes x contexts. ``measure`` times them with any
truth (a cost-model profile through ``profile_truth_s``, or ``table_truth_s``, a
table-interpolated engine that is NOT of the cost model's form) and adds multiplicative
noise and a few outliers, as a real benchmark run would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.calibrate.features import step_features
from pipeline.calibrate.fit import as_vector, predict
from pipeline.calibrate.measurements import Measurements

F64 = npt.NDArray[np.float64]

PREFILL_TOKENS = (128, 256, 512, 1024, 2048, 4096, 8192)
PREFILL_BATCHES = (1, 2, 4, 8)
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
DECODE_CONTEXTS = (256, 1024, 2048, 4096, 8192)
MAX_PREFILL_BATCH_TOKENS = 16384


def design_grid(replicates: int = 1) -> pl.DataFrame:
    """phase, batch_size, prompt_tokens, context_tokens of every designed step."""
    rows: list[tuple[str, int, int, int]] = []
    for p in PREFILL_TOKENS:
        for b in PREFILL_BATCHES:
            if b * p <= MAX_PREFILL_BATCH_TOKENS:
                rows.append(("prefill", b, p, 0))
    for b in DECODE_BATCHES:
        for c in DECODE_CONTEXTS:
            rows.append(("decode", b, c // 2, c))
    rows = rows * replicates
    return pl.DataFrame(
        rows, schema=["phase", "batch_size", "prompt_tokens", "context_tokens"], orient="row"
    )


def _as_measurements(frame: pl.DataFrame) -> Measurements:
    n = frame.height
    return Measurements(
        path=Path("<synthetic>"),
        sha256="",
        is_prefill=(frame["phase"] == "prefill").to_numpy(),
        batch_size=frame["batch_size"].to_numpy().astype(np.float64),
        prompt_tokens=frame["prompt_tokens"].to_numpy().astype(np.float64),
        context_tokens=frame["context_tokens"].to_numpy().astype(np.float64),
        time_s=np.ones(n),
    )


def profile_truth_s(coefficients: Mapping[str, float]) -> Callable[[pl.DataFrame], F64]:
    """Step seconds of a cost-model profile's coefficients."""
    c = as_vector(coefficients)
    return lambda frame: predict(c, step_features(_as_measurements(frame)))


def table_truth_s(frame: pl.DataFrame) -> F64:
    """A 70B-at-TP-4-like engine described by tables, not by the cost model's formula.

    Prefill: a measured-looking per-token latency that falls with the batch's tokens
    (log-log interpolation of a table: small GEMMs far below peak), an attention term
    quadratic in the prompt at its own rate, and 0.5 ms per sequence. Decode: a base
    step time interpolated from a table over the batch size (flat while memory-bound,
    then rising), 0.4 ms per sequence, and KV reads that grow with the tokens read,
    slightly super-linearly (cache misses at long contexts).
    """
    b = frame["batch_size"].to_numpy().astype(np.float64)
    p = frame["prompt_tokens"].to_numpy().astype(np.float64)
    c = frame["context_tokens"].to_numpy().astype(np.float64)
    pre = (frame["phase"] == "prefill").to_numpy()
    tokens = b * p
    tok_pts = np.log([64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384])
    us_per_tok = np.log([300.0, 170.0, 105.0, 75.0, 62.0, 56.0, 53.0, 52.0, 51.5])
    per_tok = np.exp(np.interp(np.log(np.maximum(tokens, 1)), tok_pts, us_per_tok)) * 1e-6
    attn = 1.6e-9 * b * (p * c + p * p / 2)
    prefill = 0.012 + tokens * per_tok + attn + 5e-4 * b
    batch_pts = np.log([1, 8, 32, 64, 128, 256])
    base_ms = np.array([24.0, 24.5, 26.0, 30.0, 41.0, 64.0])
    base = np.interp(np.log(b), batch_pts, base_ms) * 1e-3
    kv = b * c
    decode = base + 4e-4 * b + 6.5e-9 * kv * (1 + 0.05 * np.log1p(kv / 65536.0))
    return np.where(pre, prefill, decode)


def measure(
    grid: pl.DataFrame,
    truth_s: Callable[[pl.DataFrame], F64],
    *,
    noise: float = 0.05,
    outliers: int = 0,
    seed: int = 0,
) -> pl.DataFrame:
    """``grid`` with a ``time_ms`` column: truth x lognormal noise of sd ``noise``.

    ``outliers`` rows (chosen at random) are multiplied by 2 to 4 instead, as a step
    that hit a garbage collection or a clock change would be.
    """
    rng = np.random.default_rng(seed)
    t = truth_s(grid) * np.exp(rng.normal(0.0, noise, grid.height))
    if outliers:
        at = rng.choice(grid.height, size=outliers, replace=False)
        t[at] *= rng.uniform(2.0, 4.0, outliers)
    return grid.with_columns(pl.Series("time_ms", t * 1000.0))
