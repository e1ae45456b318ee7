"""The unloaded floor of an SLO, against the simulator, and the capacity search's 'none'."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from pipeline.contracts import REQUESTS
from pipeline.plan.capacity import SearchSpec, run_capacity
from pipeline.plan.slo import parse_slos
from pipeline.plan.unloaded import floor, prefill_chunk, unloaded_ttft_s
from pipeline.sim.replay_tables import sim_requests_table
from pipeline.sim.simulate import simulate
from pipeline.warehouse import Warehouse
from tests.helpers import BASE, H100_8B_COST, make_input, make_scenario, requests_table


@pytest.mark.parametrize(
    ("policy", "values"),
    [
        ("vllm", {"enable_chunked_prefill": False, "max_num_batched_tokens": 8192}),
        ("vllm", {"enable_chunked_prefill": True, "max_num_batched_tokens": 512}),
        ("sarathi", {"chunk_size": 256}),
    ],
)
def test_a_lone_request_ttft_is_what_the_simulator_gives(policy: str, values: dict) -> None:
    """The slow reference: replay each prompt alone, far apart, and read its TTFT."""
    sc = make_scenario(policy, H100_8B_COST, **values)
    prompts = [17, 300, 1500, 3000]
    res = simulate(make_input([0.0, 100.0, 200.0, 300.0], prompts, [5] * 4), sc.engine())
    ids = pa.array([f"r{i}" for i in range(4)])
    ttft = sim_requests_table("alone", ids, res).column("ttft_s").to_pylist()
    chunk = prefill_chunk(sc)
    assert chunk == (values.get("max_num_batched_tokens") if values.get(
        "enable_chunked_prefill") else values.get("chunk_size"))  # fmt: skip
    want = [unloaded_ttft_s(sc.cost, p, chunk) for p in prompts]
    assert ttft == pytest.approx(want, rel=1e-9)


def test_the_floor_is_the_percentile_of_lone_requests() -> None:
    sc = make_scenario("vllm", H100_8B_COST, enable_chunked_prefill=False)
    prompts = np.arange(1, 201) * 10  # 10 .. 2000 tokens
    frame = pl.DataFrame({"prompt_tokens": prompts, "output_tokens": [4] * 200})
    (slo,) = parse_slos(["ttft_p99=1ms"])
    f = floor(sc, frame, slo)
    each = [unloaded_ttft_s(sc.cost, int(p), None) for p in prompts]
    assert f.value_s == pytest.approx(float(np.quantile(each, 0.99)), rel=1e-12)
    assert f.prompt_tokens == pytest.approx(float(np.quantile(prompts, 0.99)))
    assert not f.reachable
    assert "even unloaded, ttft_p99 is" in f.explanation
    assert "the prefill of the longest 1% of prompts (1,980+ tokens" in f.explanation


def test_an_unreachable_slo_says_why(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    n = 120
    table = requests_table(rng.integers(50, 3000, n), rng.integers(2, 50, n), 0.2)
    wh = tmp_path / "wh"
    Warehouse(wh).write(REQUESTS, table, {"date": "2024-05-01"}, "src-test")
    slos = parse_slos(["ttft_p99=5ms"])
    specs = [SearchSpec("concurrency", hi=8)]
    result = run_capacity(wh, {**BASE, "name": "base"}, slos, specs, summary_only=True, quiet=True)
    (search,) = result.searches
    assert search.answer is None
    assert search.note is not None
    assert "no max_num_seqs in [1, 8] meets every SLO" in search.note
    assert "even unloaded, ttft_p99 is" in search.note and "above the 5ms limit" in search.note
    assert "prefill of the longest 1% of prompts" in search.note


def test_a_scoped_floor_uses_only_its_requests() -> None:
    sc = make_scenario("vllm", H100_8B_COST, enable_chunked_prefill=False)
    frame = pl.DataFrame({"prompt_tokens": [100, 4000], "output_tokens": [4, 4],
                          "tenant": ["chat", "batch"], "model": ["m", "m"]})  # fmt: skip
    (chat,) = parse_slos(["ttft_p100@tenant=chat=1ms"])
    assert floor(sc, frame, chat).value_s == pytest.approx(unloaded_ttft_s(sc.cost, 100, None))
    (nobody,) = parse_slos(["ttft_p100@tenant=ops=1ms"])
    assert "no request is in the scope" in floor(sc, frame, nobody).explanation
