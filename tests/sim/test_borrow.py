"""borrow(): a view of the same memory that numba does not reference-count."""

from __future__ import annotations

import sys

import numpy as np
from numba import njit

from pipeline.sim.borrow import borrow


@njit(cache=False)
def _fill_through_views(a: np.ndarray, b: np.ndarray) -> float:
    va = borrow(a)
    vb = borrow(b)
    total = 0.0
    for i in range(va.shape[0]):
        for j in range(va.shape[1]):
            va[i, j] = i * 10 + j
            total += va[i, j]
    vb[1:] = vb[:-1] + 1  # slices of a borrowed view are views of the same memory too
    return total


def test_borrowed_view_writes_the_array_and_leaves_its_refcount() -> None:
    a = np.zeros((3, 4), dtype=np.int32)
    b = np.arange(5, dtype=np.float64)
    _fill_through_views(a.copy(), b.copy())  # compile first
    before = sys.getrefcount(a), sys.getrefcount(b)
    total = _fill_through_views(a, b)
    assert (a == np.arange(3)[:, None] * 10 + np.arange(4)).all()
    assert total == float(a.sum())
    assert b.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert (sys.getrefcount(a), sys.getrefcount(b)) == before
