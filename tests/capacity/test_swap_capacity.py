"""The swap_space capacity search: the least host swap space (whole GiB per GPU) that meets
every SLO, found by bisection, against a replay of every value in its range."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.errors import ConfigError
from pipeline.plan.capacity import SEARCHES, SearchSpec, capacity_inputs, parse_specs, run_capacity
from pipeline.plan.grid import build_grid
from pipeline.plan.slo import parse_slos
from pipeline.report.sql import query
from pipeline.sim.replay import replay
from pipeline.warehouse import Warehouse
from tests.helpers import BASE, small_warehouse_at

# a KV cache small enough to preempt at 20 req/s, a KV block of 16 MiB (1 GiB of host
# memory holds 64) and a fast host link: swapping is cheaper than recomputing, so too
# little swap space (victims recomputed when host memory is full) costs tail latency
SWAP = {**BASE, "name": "sw", "num_gpu_blocks": 400, "max_num_seqs": 64,
        "async_scheduling": False, "enable_prefix_caching": False, "preemption_mode": "swap",
        "swap_kv_bytes_per_token": 131072 * 8, "swap_link_gb_s": 400.0}  # fmt: skip
TOP = 16


@pytest.fixture(scope="module")
def every_value(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, float]]:
    """The warehouse, and the p99 TTFT of a replay at every swap space 1..TOP GiB."""
    root = tmp_path_factory.mktemp("swapcap") / "wh"
    small_warehouse_at(root, n=300, rate=20.0)
    grid = build_grid({"base": SWAP, "axes": {"swap_space_gb": list(range(1, TOP + 1))}})
    run_id = replay(root, grid.scenarios, quiet=True, intervals=False).run_id
    rows = (
        Warehouse(root)
        .connect()
        .execute(
            "SELECT scenario, list(ttft_s) FROM sim_requests WHERE run_id = ? GROUP BY 1",
            [run_id],
        )
        .fetchall()
    )
    p99 = {
        int(name.removeprefix("swap")): float(np.quantile(np.array(v), 0.99)) for name, v in rows
    }
    return root, p99


def test_the_search_finds_the_least_swap_space_that_meets(
    every_value: tuple[Path, dict[int, float]],
) -> None:
    root, p99 = every_value
    assert p99[1] > p99[TOP]  # too little swap space costs (else the case tests nothing)
    limit = (p99[1] + p99[TOP]) / 2
    want = min(v for v, t in p99.items() if t <= limit)
    result = run_capacity(
        root, SWAP, parse_slos([f"ttft_p99={limit}s"]), [SearchSpec("swap_space", hi=TOP)],
        quiet=True, intervals=False,
    )  # fmt: skip
    (search,) = result.searches
    assert search.knob == "swap_space_gb"
    assert search.answer == want
    for value, met in search.result.probes:  # every probe as the replay of that value says
        assert met == (p99[int(value)] <= limit), value
    df = query(Warehouse(root).connect(), "capacity_answers", run_id=result.run_id)
    assert df.select("search", "knob", "answer").rows() == [
        ("swap_space", "swap_space_gb", float(want))
    ]


def test_the_search_runs_only_when_named() -> None:
    assert [s.kind for s in parse_specs({})] == list(SEARCHES)
    assert "swap_space" not in SEARCHES
    assert [s.kind for s in capacity_inputs(searches=["swap_space"]).specs] == ["swap_space"]
    (spec,) = parse_specs({"swap_space": {"min": 2, "max": 32}})
    assert (spec.kind, spec.lo, spec.hi) == ("swap_space", 2, 32)


@pytest.mark.parametrize(
    ("base", "message"),
    [
        ({**SWAP, "preemption_mode": "recompute"},
         "swap_space search: the base scenario preempts by recompute; set preemption_mode"),
        ({**BASE, "name": "sg", "policy": "sglang"},
         "swap_space search: swap_space_gb: swap preemption is vLLM V0's (policy = vllm)"),
    ],
)  # fmt: skip
def test_a_base_that_cannot_swap_is_one_line(
    every_value: tuple[Path, dict[int, float]], base: dict, message: str
) -> None:
    root, _ = every_value
    with pytest.raises(ConfigError) as exc:
        run_capacity(
            root, base, parse_slos(["ttft_p99=1s"]), [SearchSpec("swap_space")], quiet=True,
            intervals=False,
        )  # fmt: skip
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)
