"""``BackgroundWriter``: tables appended on a thread of their own land as a plain
``TableWriter``'s do, and a write's error reaches the caller."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.contracts import SIM_STEPS, BackgroundWriter, TableWriter, read_table
from pipeline.errors import ContractError
from pipeline.sim.replay_tables import sim_steps_table
from pipeline.sim.state import NST, NSTF


def _chunks(n: int, rows: int) -> list[pa.Table]:
    rng = np.random.default_rng(1)
    out = []
    for k in range(n):
        st = rng.integers(0, 50, (rows, NST)).astype(np.int64)
        st[:, 1] = np.arange(k * rows, (k + 1) * rows)  # S_STEP: unique
        stf = rng.random((rows, NSTF))
        out.append(sim_steps_table("s", st, stf, 1000))
    return out


def test_same_file_as_a_plain_writer(tmp_path: Path) -> None:
    chunks = _chunks(12, 50)
    with TableWriter(SIM_STEPS, tmp_path / "plain.parquet") as out:
        for c in chunks:
            out.write(c)
    with (
        TableWriter(SIM_STEPS, tmp_path / "bg.parquet") as out,
        BackgroundWriter(out, depth=2) as bg,
    ):
        for c in chunks:
            bg.write(c)
    a = read_table(tmp_path / "plain.parquet", SIM_STEPS)
    b = read_table(tmp_path / "bg.parquet", SIM_STEPS)
    assert b.num_rows == 600 and b.equals(a)
    assert pq.ParquetFile(tmp_path / "bg.parquet").metadata.num_row_groups == 12


def test_a_write_error_reaches_the_caller_and_nothing_lands(tmp_path: Path) -> None:
    bad = pa.table({"scenario": ["s"], "replica": pa.array([-1], pa.int32())})
    path = tmp_path / "bad.parquet"
    with pytest.raises(ContractError):
        with TableWriter(SIM_STEPS, path) as out, BackgroundWriter(out) as bg:
            bg.write(_chunks(1, 5)[0])
            bg.write(bad)
            for c in _chunks(20, 5):  # a later write, or leaving the block, raises it
                bg.write(c)
    assert not path.exists() and not list(tmp_path.iterdir())


def test_leaving_on_an_exception_drops_what_waits(tmp_path: Path) -> None:
    path = tmp_path / "x.parquet"
    with pytest.raises(RuntimeError, match="stop"):
        with TableWriter(SIM_STEPS, path) as out, BackgroundWriter(out) as bg:
            for c in _chunks(5, 5):
                bg.write(c)
            raise RuntimeError("stop")
    assert not path.exists() and not list(tmp_path.iterdir())


def test_one_thread_for_two_files(tmp_path: Path) -> None:
    chunks = _chunks(6, 20)
    with (
        TableWriter(SIM_STEPS, tmp_path / "a.parquet") as a,
        TableWriter(SIM_STEPS, tmp_path / "b.parquet") as b,
        BackgroundWriter(a) as bg,
    ):
        for k, c in enumerate(chunks):
            bg.write(c, to=b if k % 2 else None)
    got_a = read_table(tmp_path / "a.parquet", SIM_STEPS)
    got_b = read_table(tmp_path / "b.parquet", SIM_STEPS)
    assert got_a.equals(pa.concat_tables(chunks[0::2]).cast(got_a.schema))
    assert got_b.equals(pa.concat_tables(chunks[1::2]).cast(got_b.schema))
