"""The replay stage writes its results in chunks: the rows must not depend on the chunk size.

``simulate(..., on_steps=...)`` hands the step timeline out in chunks that the
stage converts and writes as row groups; sim_requests is written a row group
at a time too. A replay cut into many tiny chunks must write exactly the rows,
and report exactly the summary, of one whose chunks hold everything, and of
the loop that keeps its timeline whole.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.contracts import SIM_REQUESTS, SIM_STEPS, TableWriter, read_table
from pipeline.errors import ContractError
from pipeline.sim.replay import replay
from pipeline.sim.replay_input import prepare, read_requests, select_request_files
from pipeline.sim.scenario import Scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.state import NST, NSTF, S_WAITING, SF_DURATION, SimInput, SimResult
from pipeline.sim.summary import StepTotals, _exact_sum, summarize
from pipeline.warehouse import Warehouse
from tests.helpers import H100_8B_COST, make_scenario, requests_table

N = 300


def _scenarios() -> list[Scenario]:
    """Two replicas behind a load-aware router, a tight KV cache (preemptions), a prompt
    too long (dropped), and a sampled scenario (drawn ids)."""
    return [
        make_scenario(
            "vllm",
            H100_8B_COST,
            name="tight",
            replicas=2,
            router="least_outstanding",
            num_gpu_blocks=120,
            max_model_len=2048,
            drop_too_long=True,
        ),
        make_scenario(
            "sglang",
            H100_8B_COST,
            name="drawn",
            num_gpu_blocks=2000,
            max_model_len=2048,
            drop_too_long=True,
            arrivals="poisson",
            rate=30.0,
            num_requests=200,
        ),
    ]


@pytest.fixture
def root(warehouse_with: Callable[..., Path]) -> Path:
    rng = np.random.default_rng(7)
    prompt = rng.integers(10, 900, N)
    prompt[17] = 5000  # longer than max_model_len: dropped
    table = requests_table(
        prompt,
        rng.integers(1, 120, N),
        rng.exponential(0.02, N),
        start=datetime(2024, 5, 1, 12, tzinfo=UTC),
    )
    return warehouse_with(table)


def _rows(path: Path, contract: object) -> pa.Table:
    return read_table(path, contract)  # type: ignore[arg-type]


def test_many_chunks_write_the_rows_of_one(root: Path) -> None:
    one = replay(root, _scenarios(), quiet=True, run_id="one", chunk_rows=1 << 20)
    many = replay(root, _scenarios(), quiet=True, run_id="many", chunk_rows=7)
    for a, b in zip(one.runs, many.runs, strict=True):
        assert a.summary == b.summary
        assert a.summary["num_step_rows"] > 7 * 10  # many chunks indeed
        for name, contract in (("sim_steps", SIM_STEPS), ("sim_requests", SIM_REQUESTS)):
            rows_one = _rows(a.paths[name], contract)
            rows_many = _rows(b.paths[name], contract)
            assert rows_many.num_rows == rows_one.num_rows > 0
            assert rows_many.equals(rows_one), name
            assert pq.ParquetFile(a.paths[name]).metadata.num_row_groups == 1
            groups = pq.ParquetFile(b.paths[name]).metadata.num_row_groups
            assert groups == math.ceil(rows_one.num_rows / 7)
    tight = one.runs[0].summary
    assert tight["num_preemptions"] > 0 and tight["num_dropped"] == 1
    assert "#" in _rows(many.runs[1].paths["sim_requests"], SIM_REQUESTS)["request_id"][0].as_py()
    # no temporary file is left behind
    assert not [p for p in root.rglob(".*.tmp-*")]


def _streamed(
    inp: SimInput, sc: Scenario, rows: int
) -> tuple[SimResult, list[tuple[np.ndarray, np.ndarray]], StepTotals]:
    chunks: list[tuple[np.ndarray, np.ndarray]] = []
    totals = StepTotals()

    def keep(st: np.ndarray, stf: np.ndarray) -> None:
        chunks.append((st.copy(), stf.copy()))  # the views are overwritten after the call
        totals.add(st, stf)

    return simulate(inp, sc.engine(), on_steps=keep, step_rows=rows), chunks, totals


def test_chunked_timeline_is_the_whole_one(root: Path) -> None:
    """The rows the loop hands out chunk by chunk are the rows it keeps when it keeps them all."""
    frame = read_requests(select_request_files(Warehouse(root)))
    for sc in _scenarios():
        inp = prepare(frame, sc).inp
        whole = simulate(inp, sc.engine())
        streamed, chunks, totals = _streamed(inp, sc, 5)
        assert len(streamed.st) == 0 and len(chunks) == math.ceil(len(whole.st) / 5)
        assert all(len(st) == 5 for st, _ in chunks[:-1])
        assert np.array_equal(np.concatenate([st for st, _ in chunks]), whole.st)
        assert np.array_equal(np.concatenate([f for _, f in chunks]), whole.stf)
        assert np.array_equal(streamed.rq, whole.rq)
        assert np.array_equal(streamed.rqf, whole.rqf, equal_nan=True)
        assert summarize(streamed, totals) == summarize(whole)


def test_step_totals_do_not_depend_on_the_cut() -> None:
    """Float sums over the timeline are exact, so any cut into chunks gives the same bits."""
    rng = np.random.default_rng(3)
    n = 5000
    st = np.zeros((n, NST), dtype=np.int64)
    stf = np.zeros((n, NSTF))
    st[:, S_WAITING] = rng.integers(0, 50, n)
    # durations over many magnitudes, the kind of input where summation order shows
    stf[:, SF_DURATION] = rng.random(n) * 10.0 ** rng.integers(-9, 4, n)
    stf[::97, SF_DURATION] = 0.0
    whole = StepTotals.of(st, stf)
    for cut in (1, 2, 7, 1000, 4999):
        parts = StepTotals()
        for a in range(0, n, cut):
            parts.add(st[a : a + cut], stf[a : a + cut])
        assert parts == whole
    for x in (stf[:, SF_DURATION], rng.normal(0, 1e6, n), np.array([5e-324, -1e300, 1e300, 3.0])):
        assert _exact_sum(0, x) / 2**1126 == math.fsum(x)  # exact: then correctly rounded
    waiting_s = st[:, S_WAITING] * stf[:, SF_DURATION]
    exact = math.fsum(waiting_s) / math.fsum(stf[:, SF_DURATION])  # each sum correctly rounded
    assert whole.mean_waiting == pytest.approx(exact, rel=1e-15)


def test_a_failed_writer_leaves_no_file(tmp_path: Path) -> None:
    path = tmp_path / "run_id=x" / "s.parquet"
    good = pa.table({"scenario": ["s"], "replica": pa.array([0], pa.int32())})
    with pytest.raises(ContractError), TableWriter(SIM_STEPS, path) as out:
        out.write(good)  # columns missing: refused by the contract
    assert not path.exists() and not list(path.parent.glob(".*"))
    with pytest.raises(RuntimeError), TableWriter(SIM_STEPS, path) as out:
        raise RuntimeError("killed mid-way")
    assert not path.exists() and not list(path.parent.glob(".*"))
