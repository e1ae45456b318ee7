"""Scenario loading: precedence, resolution, and bad scenarios failing early and clearly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.errors import ScenarioError
from pipeline.sim.policies import POLICIES
from pipeline.sim.scenario import build_scenario, parse_value, resolve_scenarios
from tests.helpers import UNIT_COST, make_scenario

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "scenarios"


def test_defaults_come_from_the_default_profile() -> None:
    sc = build_scenario({})
    assert sc.policy == "vllm"
    assert sc.profile == "llama-3-8b_h100-80gb_tp1"
    assert sc.memory.num_gpu_blocks > 1000
    assert sc.num_kv_blocks == sc.memory.num_gpu_blocks - 1  # vLLM's null block
    assert sc.params.max_num_seqs == 256
    # vLLM resolves async scheduling on; the scenarios table records it
    assert sc.params.async_scheduling is True and sc.to_dict()["async_scheduling"] is True
    assert build_scenario({"async_scheduling": False}).to_dict()["async_scheduling"] is False


def test_gpu_memory_utilization_sizes_the_cache() -> None:
    small = build_scenario({"gpu_memory_utilization": 0.5})
    big = build_scenario({"gpu_memory_utilization": 0.95})
    assert 0 < small.memory.num_gpu_blocks < big.memory.num_gpu_blocks


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.stem)
def test_example_scenarios_are_valid(path: Path) -> None:
    (sc,) = resolve_scenarios([path], {})
    assert sc.name == path.stem


def test_flags_override_files_and_files_override_config(tmp_path: Path) -> None:
    f = tmp_path / "a.toml"
    f.write_text('policy = "vllm"\nmax_num_seqs = 64\nseed = 3\n')
    (sc,) = resolve_scenarios([f], {"max_num_seqs": 32}, defaults={"seed": 9, "replicas": 2})
    assert (sc.name, sc.params.max_num_seqs, sc.seed, sc.replicas) == ("a", 32, 3, 2)


def test_flags_alone_make_one_scenario() -> None:
    (sc,) = resolve_scenarios([], {"policy": "sarathi", "chunk_size": 1024})
    assert (sc.name, sc.params.chunk_size, sc.params.max_num_seqs) == ("sarathi", 1024, 128)


def test_duplicate_names_are_rejected(tmp_path: Path) -> None:
    for stem in ("a", "b"):
        (tmp_path / f"{stem}.toml").write_text('name = "same"\n')
    with pytest.raises(ScenarioError, match="name 'same' is also used"):
        resolve_scenarios([tmp_path / "a.toml", tmp_path / "b.toml"], {})


def test_set_values_parse_as_toml() -> None:
    assert parse_value("true") is True
    assert parse_value("0.25") == 0.25
    assert parse_value("64") == 64
    assert parse_value("least_outstanding") == "least_outstanding"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"policy": "fcfs"},
            "unknown policy 'fcfs'; allowed: orca, sarathi, sglang, static, tgi, transformers, "
            "vllm",
        ),
        ({"max_batch_size": 4}, "max_batch_size is a parameter of static"),
        ({"max_num_sequences": 4}, "unknown key 'max_num_sequences'.*allowed: .*max_num_seqs"),
        ({"router": "random"}, "unknown router 'random'; allowed: least_outstanding"),
        ({"arrivals": "uniform"}, "unknown arrivals 'uniform'; allowed: gamma, poisson, trace"),
        ({"rate": -1.0}, "rate must be > 0"),
        ({"rate": 0}, "rate must be > 0"),
        ({"time_scale": 0}, "time_scale must be > 0"),
        ({"rate": 2.0, "time_scale": 0.5}, "time_scale or rate, not both"),
        ({"replicas": 0}, "replicas must be >= 1"),
        ({"max_num_seqs": 0}, "max_num_seqs must be > 0"),
        ({"max_num_seqs": "many"}, "max_num_seqs must be an integer"),
        ({"watermark": 1.5}, r"watermark must be in \[0, 1\)"),
        ({"max_num_batched_tokens": 64, "max_num_seqs": 128}, "must be >= max_num_seqs"),
        (
            {"enable_chunked_prefill": False, "max_num_batched_tokens": 2048},
            "without chunked prefill max_num_batched_tokens",
        ),
        ({"gpu_memory_utilization": 0.1}, "gpu_memory_utilization: .*leave no room"),
        ({"gpu_memory_utilization": 1.5}, r"gpu_memory_utilization must be in \(0, 1\]"),
        ({"profile": "llama-3-70b_h100-80gb_tp1"}, "weights .* leave no room"),
        ({"profile": "gpt-5"}, "unknown profile 'gpt-5'.*llama-3-8b_h100-80gb_tp1"),
        ({"name": "a b"}, "name 'a b' must be letters"),
        ({"policy": "sarathi", "chunk_size": 64}, "chunk_size .* must be >= max_num_seqs"),
        ({"policy": "static", "max_wait_s": -1}, "max_wait_s must be >= 0"),
        ({"policy": "sglang", "async_scheduling": True}, "async_scheduling is a parameter of vllm"),
        ({"async_scheduling": "sometimes"}, "async_scheduling must be true or false"),
        ({"arrivals": "poisson", "burstiness": 0.5}, "burstiness applies to arrivals = 'gamma'"),
        ({"arrivals": "gamma", "burstiness": 0}, "burstiness must be > 0"),
    ],
)
def test_bad_scenarios_name_the_key(values: dict[str, object], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        build_scenario(values)


def test_cost_table_is_checked() -> None:
    with pytest.raises(ScenarioError, match="num_gpu_blocks is required"):
        build_scenario({"cost": UNIT_COST})
    with pytest.raises(ScenarioError, match="missing: comm_s_per_token"):
        build_scenario(
            {
                "cost": {k: v for k, v in UNIT_COST.items() if k != "comm_s_per_token"},
                "num_gpu_blocks": 10,
            }
        )
    with pytest.raises(ScenarioError, match="either profile or a"):
        build_scenario({"cost": UNIT_COST, "profile": "x", "num_gpu_blocks": 10})


def test_every_policy_parameter_has_help() -> None:
    for pol in POLICIES.values():
        assert all(pol.param_help().values()), pol.name


def _caps(sc, prompt, output, max_tokens=None):  # type: ignore[no-untyped-def]
    p = np.asarray(prompt, dtype=np.int64)
    o = np.asarray(output, dtype=np.int64)
    m = np.asarray(max_tokens if max_tokens is not None else [0] * len(p), dtype=np.int64)
    return sc.cap_lengths(p, o, m)


def test_output_caps() -> None:
    sc = make_scenario("vllm", max_output_tokens=50, max_model_len=200)
    prompt, output, keep = _caps(sc, [10, 10, 180, 10], [100, 100, 100, 0], [20, 0, 0, 0])
    # request cap, scenario cap, max_model_len - prompt, at least one token
    assert output.tolist() == [20, 50, 20, 1]
    assert keep.all()


def test_prompt_too_long_fails_or_is_dropped() -> None:
    with pytest.raises(ScenarioError, match="prompt of max_model_len .* drop_too_long"):
        _caps(make_scenario("vllm", max_model_len=100), [50, 100], [5, 5])
    _, _, keep = _caps(
        make_scenario("vllm", max_model_len=100, drop_too_long=True), [50, 100], [5, 5]
    )
    assert keep.tolist() == [True, False]


@pytest.mark.parametrize("policy", ["static", "orca", "vllm", "sarathi"])
def test_a_request_that_can_never_fit_fails_before_running(policy: str) -> None:
    sc = make_scenario(policy, num_gpu_blocks=8, block_size=16, max_model_len=4096)
    with pytest.raises(ScenarioError, match="needs .* KV blocks on its own .* num_gpu_blocks"):
        _caps(sc, [1000], [100])
