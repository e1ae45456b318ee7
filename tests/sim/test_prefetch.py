"""prefetch(): a hint that compiles to a prefetch instruction and changes nothing."""

from __future__ import annotations

import numpy as np
from numba import njit

from pipeline.sim.prefetch import prefetch


@njit(cache=False)
def _sum_ahead(a: np.ndarray, ahead: int) -> float:
    """Sum a 2-D array row by row, prefetching ``ahead`` elements on (past its end too)."""
    total = 0.0
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            prefetch(a, i * a.shape[1] + j + ahead)
            total += a[i, j]
    return total


def test_prefetch_leaves_values_and_compiles_to_the_instruction() -> None:
    a = np.arange(12.0).reshape(3, 4)
    for ahead in (0, 1, 8, 1000):
        assert _sum_ahead(a, ahead) == 66.0
    assert a.tolist() == np.arange(12.0).reshape(3, 4).tolist()
    asm = _sum_ahead.inspect_asm(_sum_ahead.signatures[0])
    assert "prefetch" in asm or "prfm" in asm  # x86 prefetcht0, ARM prfm: emitted, not dropped
