"""Hold-out checks of ``calibrate measurements`` on measured step-time tables.

A table is one measurements file whose rows may come from several models, GPUs and
tensor-parallel degrees (``groups`` splits it; each group is what one ``calibrate
measurements`` run would be given). ``interpolating_split`` keeps the rows a user would
measure first and holds out the rest, all inside the measured range:

    prefill  batch 1 at a few prompt sizes (128, 512, 2048, 8192), and the largest batch
    decode   batch 1 after those prompts, batch 8, and the largest batch

``holdout`` fits a group's kept rows from a ``--like`` profile and reports, per phase,
the median and p90 of |predicted / measured - 1| over the held-out rows, for the fit,
for the ``--like`` profile itself, and for ``baseline_predict``: a plain least-squares
fit of four terms per phase, the yardstick of what a simple curve fit of the same rows
predicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipeline.calibrate.features import StepFeatures, step_features
from pipeline.calibrate.fit import PhaseError, as_dict, as_vector, fit_coefficients, phase_errors
from pipeline.calibrate.fit import predict as predict_s
from pipeline.calibrate.measurements import Measurements

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

TRAIN_PROMPTS = (128, 512, 2048, 8192)  # batch-1 prefills (and the decodes after them) fitted
TRAIN_DECODE_BATCHES = (1, 8)  # decode batch sizes fitted, besides the largest


@dataclass(frozen=True)
class Group:
    """The rows of one model, GPU and tensor-parallel degree (None: the column is absent
    or empty)."""

    model: str | None
    gpu: str | None
    tensor_parallel: int | None
    rows: I64  # indices into the table, in file order

    @property
    def label(self) -> str:
        tp = "" if self.tensor_parallel is None else f" tp{self.tensor_parallel}"
        return f"{self.model or '?'} {self.gpu or '?'}{tp}"


def groups(m: Measurements) -> list[Group]:
    """The table's rows by (model, gpu, tensor_parallel), in order of first appearance."""
    n = len(m)
    model = m.model or [None] * n
    gpu = m.gpu or [None] * n
    tp = np.full(n, np.nan) if m.tensor_parallel is None else m.tensor_parallel
    keys: dict[tuple[str | None, str | None, int | None], list[int]] = {}
    for i in range(n):
        t = None if np.isnan(tp[i]) else int(tp[i])
        keys.setdefault((model[i], gpu[i], t), []).append(i)
    return [Group(k[0], k[1], k[2], np.array(v, dtype=np.int64)) for k, v in keys.items()]


def interpolating_split(
    m: Measurements,
    rows: I64,
    prompt_sizes: tuple[int, ...] = TRAIN_PROMPTS,
    decode_batches: tuple[int, ...] = TRAIN_DECODE_BATCHES,
) -> tuple[I64, I64]:
    """(fitted, held out) row indices of ``rows``.

    Fitted: prefills at batch 1 with a prompt in ``prompt_sizes`` and every prefill at the
    largest batch size; decodes at a batch size in ``decode_batches`` or the largest, where
    a batch-1 decode counts only after a prompt in ``prompt_sizes`` (so the held-out
    batch-1 decodes are at contexts between fitted ones). Everything else is held out.
    """
    b = m.batch_size[rows]
    p = m.prompt_tokens[rows]
    pre = m.is_prefill[rows]
    fitted = np.zeros(len(rows), dtype=bool)
    sizes = np.isin(p, prompt_sizes)
    for phase, batches in ((True, ()), (False, decode_batches)):
        mask = pre == phase
        if not mask.any():
            continue
        largest = b[mask].max()
        keep = (b == largest) | np.isin(b, batches) | (b == 1)
        fitted |= mask & keep & ((b != 1) | sizes)
    return rows[fitted], rows[~fitted]


def _baseline_columns(f: StepFeatures, prefill: bool) -> F64:
    one = np.ones(len(f))
    if prefill:
        return np.column_stack([one, f.P, f.A, f.N])
    return np.column_stack([one, f.D, f.C, f.D**2])


def baseline_predict(train: Measurements, test: Measurements) -> F64:
    """Seconds of every ``test`` row from plain least-squares curves fitted to ``train``.

    Per phase, four terms, fitted by linear least squares of the relative error (each row
    weighted by 1 / measured), no bounds, no prior:

        prefill  a + b P + c A + d N      (tokens, attention pairs, sequences)
        decode   a + b D + c C + d D^2    (sequences, KV tokens read, sequences squared)

    Raises:
        ValueError: a phase of ``test`` has no ``train`` rows.
    """
    ft, fs = step_features(train), step_features(test)
    out = np.empty(len(test))
    for prefill in (True, False):
        at, on = train.is_prefill == prefill, test.is_prefill == prefill
        if not on.any():
            continue
        if not at.any():
            raise ValueError(f"no {'prefill' if prefill else 'decode'} rows to fit a baseline")
        x = _baseline_columns(_take(ft, np.flatnonzero(at)), prefill)
        w = 1.0 / train.time_s[at]
        coef, *_ = np.linalg.lstsq(x * w[:, None], np.ones(int(at.sum())), rcond=None)
        out[on] = _baseline_columns(_take(fs, np.flatnonzero(on)), prefill) @ coef
    return out


def _take(f: StepFeatures, idx: I64) -> StepFeatures:
    return StepFeatures(P=f.P[idx], A=f.A[idx], N=f.N[idx], D=f.D[idx], C=f.C[idx])


@dataclass(frozen=True)
class HoldOut:
    """How one group's held-out rows are predicted."""

    group: Group
    fitted_rows: int
    held_out: Measurements
    coefficients: dict[str, float]  # the fit
    predicted_s: F64  # the fit, per held-out row
    fit: dict[str, PhaseError]
    like: dict[str, PhaseError]  # the --like profile as it is
    baseline: dict[str, PhaseError]  # baseline_predict


def holdout(
    m: Measurements,
    group: Group,
    like: Mapping[str, float],
    prompt_sizes: tuple[int, ...] = TRAIN_PROMPTS,
    decode_batches: tuple[int, ...] = TRAIN_DECODE_BATCHES,
) -> HoldOut:
    """Fit ``group``'s rows of ``interpolating_split`` from ``like`` (the coefficients of a
    ``--like`` profile) as ``calibrate measurements`` does, and predict the rest."""
    train, test = interpolating_split(m, group.rows, prompt_sizes, decode_batches)
    fit_m, held = m.subset(train), m.subset(test)
    coefficients, _ = fit_coefficients(step_features(fit_m), fit_m.time_s, like)
    pred = predict_s(coefficients, step_features(held))
    like_pred = predict_s(as_vector(like), step_features(held))
    return HoldOut(
        group=group,
        fitted_rows=len(train),
        held_out=held,
        coefficients=as_dict(coefficients),
        predicted_s=pred,
        fit=phase_errors(pred, held.time_s, held.is_prefill),
        like=phase_errors(like_pred, held.time_s, held.is_prefill),
        baseline=phase_errors(baseline_predict(fit_m, held), held.time_s, held.is_prefill),
    )
