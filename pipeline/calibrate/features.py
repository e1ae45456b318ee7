"""Measured rows as the step features of the cost model (docs/cost_model.md).

Per step (one replica):

    P  prefill tokens computed          prefill row: batch * prompt_tokens
    A  prefill causal (query, key) pairs prefill row: batch * (p * c + p * (p + 1) / 2)
                                        with p = prompt_tokens, c = context_tokens
    N  sequences in the step            batch, either phase
    D  decode sequences                 decode row: batch
    C  KV tokens the decodes read       decode row: batch * context_tokens

A prefill row has D = C = 0; a decode row has P = A = 0.

The probes of ``calibrate live`` have their own: ``mixed_features`` (one prompt chunk
released into running decodes) and ``packed_features`` (the transformers engine's
attention over the packed batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.calibrate.measurements import Measurements

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class StepFeatures:
    """One entry per step, in the order of the rows they came from."""

    P: F64  # noqa: N815 - the cost model's feature names
    A: F64  # noqa: N815
    N: F64  # noqa: N815
    D: F64  # noqa: N815
    C: F64  # noqa: N815

    def __len__(self) -> int:
        return len(self.P)


def step_features(m: Measurements) -> StepFeatures:
    """The features of every row of ``m``."""
    b = m.batch_size
    p = m.prompt_tokens
    c = m.context_tokens
    pre = m.is_prefill
    zero = np.zeros_like(b)
    return StepFeatures(
        P=np.where(pre, b * p, zero),
        A=np.where(pre, b * (p * c + p * (p + 1) / 2.0), zero),
        N=b.astype(np.float64),
        D=np.where(pre, zero, b),
        C=np.where(pre, zero, b * c),
    )


def mixed_features(mixed: pl.DataFrame) -> StepFeatures:
    """The cost model's step features of the mixed rows: one prompt chunk plus decodes."""
    p = mixed["prompt_tokens"].to_numpy().astype(np.float64)
    b = mixed["decode_batch"].to_numpy().astype(np.float64)
    c = mixed["decode_kv_tokens"].to_numpy().astype(np.float64)
    return StepFeatures(P=p, A=(p + b) * (p + c) - c, N=b + 1.0, D=b, C=c)


def packed_features(m: Measurements) -> StepFeatures:
    """The features of pure probe rows with the attention of the transformers engine.

    Its attention runs over the packed batch (policies/transformers.py): every query of
    the step against every key of the step's sequences, A = (P + D) * K - C.
    """
    b, p, c = m.batch_size, m.prompt_tokens, m.context_tokens
    pre = m.is_prefill
    tokens = np.where(pre, b * p, b)
    keys = np.where(pre, b * (c + p), b * c)
    ctx = np.where(pre, 0.0, b * c)
    return StepFeatures(
        P=np.where(pre, b * p, 0.0),
        A=tokens * keys - ctx,
        N=b.astype(np.float64),
        D=np.where(pre, 0.0, b),
        C=ctx,
    )
