"""Fuzzing the config parsers: any TOML value under any key either loads into a valid
object or raises the pipeline's one-line error (a PipelineError), never another
exception. Scenarios (and the engine config they pack into int64/float64 arrays),
nightly configs, the config file, grids, SLOs, model configs and JSON of any depth.
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.config import KNOWN, load_config
from pipeline.errors import PipelineError
from pipeline.nightly import INGEST_KEYS, NIGHTLY_KEYS, load_nightly_config
from pipeline.plan.grid import build_grid
from pipeline.plan.slo import parse_slos
from pipeline.sim.model_config import model_shape_from_config
from pipeline.sim.policies import POLICIES
from pipeline.sim.scenario import COMMON, build_scenario
from pipeline.validation import loads_json, loads_toml

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# text TOML and JSON can both write (no surrogates)
TEXT = st.text(st.characters(max_codepoint=0x2FFF, exclude_categories=("Cs", "Cc")), max_size=12)
EDGE_INTS = st.sampled_from(
    [0, 1, -1, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**63, -(2**63), 10**30]
)
EDGE_FLOATS = st.sampled_from(
    [0.0, -0.0, 1e-300, 5e-324, 1e300, 1.7976931348623157e308, math.inf, -math.inf, math.nan]
)
SCALARS = st.one_of(
    st.booleans(),
    st.integers(),
    EDGE_INTS,
    st.floats(allow_nan=True, allow_infinity=True),
    EDGE_FLOATS,
    TEXT,
    st.sampled_from(["nan", "inf", "1e400", "-1", "true", "vllm", "trace", "64", "0.5"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=6,
)

POLICY_KEYS = sorted({k for p in POLICIES.values() for k in p.param_help()})
SCENARIO_KEYS = st.sampled_from(sorted(COMMON) + POLICY_KEYS + ["cost", "bogus"])


def scenario_values() -> st.SearchStrategy[dict[str, Any]]:
    """Mostly sensible scenarios with a few keys of any value."""
    sensible = st.fixed_dictionaries(
        {},
        optional={
            "policy": st.sampled_from(sorted(POLICIES)),
            "time_scale": st.floats(1e-3, 10),
            "max_num_seqs": st.integers(1, 512),
            "replicas": st.integers(1, 4),
            "seed": st.integers(0, 2**32 - 1),
        },
    )
    wild = st.dictionaries(SCENARIO_KEYS, VALUES, max_size=3)
    return st.builds(lambda a, b: {**a, **b}, sensible, wild)


@FUZZ
@given(scenario_values())
def test_scenario_loads_or_one_line_error(values: dict[str, Any]) -> None:
    try:
        sc = build_scenario(values, where="fuzz.toml")
    except PipelineError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("fuzz.toml")
        return
    eng = sc.engine()  # what the loops read: every value fits its array
    assert eng.cfg.dtype == np.int64 and np.isfinite(eng.cfgf).all()
    assert np.isfinite(eng.cost).all() and np.isfinite(eng.frontend).all()
    assert 1e-6 <= sc.arrivals.time_scale <= 1e6
    assert 0 <= sc.seed <= 2**32 - 1


def toml_value(v: Any) -> str:
    """A Python value as a TOML inline value."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(x)}" for k, x in v.items()) + "}"


def toml_doc(sections: dict[str, dict[str, Any]], arrays: dict[str, list[dict[str, Any]]]) -> str:
    out = []
    for name, table in sections.items():
        out.append(f"[{name}]")
        out.extend(f"{json.dumps(k)} = {toml_value(v)}" for k, v in table.items())
    for name, tables in arrays.items():
        for table in tables:
            out.append(f"[[{name}]]")
            out.extend(f"{json.dumps(k)} = {toml_value(v)}" for k, v in table.items())
    text = "\n".join(out) + "\n"
    tomllib.loads(text)  # the writer above writes TOML
    return text


NIGHTLY_SECTIONS = st.fixed_dictionaries(
    {
        "nightly": st.fixed_dictionaries(
            {"inbox": st.one_of(st.just(["logs/*.jsonl"]), VALUES)},
            optional={k: VALUES for k in sorted(NIGHTLY_KEYS - {"inbox"})},
        )
    },
    optional={
        "ingest": st.dictionaries(st.sampled_from(sorted(INGEST_KEYS)), VALUES, max_size=2),
        "replay": st.dictionaries(SCENARIO_KEYS, VALUES, max_size=2),
        "slo": st.dictionaries(st.sampled_from(["ttft_p99", "tpot_p50"]), VALUES, max_size=2),
        "drift": st.dictionaries(st.sampled_from(["traffic", "bogus"]), VALUES, max_size=1),
        "capacity": st.dictionaries(
            st.sampled_from(["scenario", "summary_only"]), VALUES, max_size=2
        ),
    },
)


@FUZZ
@given(NIGHTLY_SECTIONS, st.lists(st.dictionaries(SCENARIO_KEYS, VALUES, max_size=2), max_size=2))
def test_nightly_config_loads_or_one_line_error(
    tmp_path_factory: pytest.TempPathFactory,
    sections: dict[str, dict[str, Any]],
    scenarios: list[dict[str, Any]],
) -> None:
    path = tmp_path_factory.mktemp("n") / "nightly.toml"
    path.write_text(toml_doc(sections, {"scenario": [{"policy": "vllm", **s} for s in scenarios]}))
    try:
        cfg = load_nightly_config(path)
    except PipelineError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(str(path)), str(exc)
        return
    assert cfg.inbox and all(isinstance(g, str) and g for g in cfg.inbox)
    assert isinstance(cfg.report, bool) and 1 <= cfg.keep_nights <= 100_000
    assert cfg.ingest.block_size is None or 1 <= cfg.ingest.block_size <= 65536
    assert all(math.isfinite(v) for v in cfg.thresholds.values())


CONFIG_SECTIONS = st.fixed_dictionaries(
    {},
    optional={
        "warehouse": st.dictionaries(st.just("path"), VALUES, max_size=1),
        "ingest": st.dictionaries(st.sampled_from(sorted(KNOWN["ingest"])), VALUES, max_size=3),
        "replay": st.dictionaries(SCENARIO_KEYS, VALUES, max_size=3),
        "gpu_prices": st.dictionaries(st.sampled_from(["h100-80gb", "a100"]), VALUES, max_size=2),
    },
)


@FUZZ
@given(CONFIG_SECTIONS)
def test_config_file_loads_or_one_line_error(
    tmp_path_factory: pytest.TempPathFactory, sections: dict[str, dict[str, Any]]
) -> None:
    path = tmp_path_factory.mktemp("c") / "tracereplay.toml"
    path.write_text(toml_doc(sections, {}))
    try:
        cfg = load_config(path)
    except PipelineError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(str(path)), str(exc)
        return
    block = cfg.get("ingest", "block_size")
    assert block is None or (isinstance(block, int) and 1 <= block <= 65536)
    for price in cfg.sections.get("gpu_prices", {}).values():
        assert math.isfinite(price) and price > 0


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(["replicas", "max_num_seqs", "seed", "rate_scale"]),
        st.lists(VALUES, min_size=1, max_size=2),
        min_size=1,
        max_size=2,
    ),
    st.dictionaries(SCENARIO_KEYS, VALUES, max_size=2),
)
def test_grid_loads_or_one_line_error(axes: dict[str, list[Any]], base: dict[str, Any]) -> None:
    try:
        grid = build_grid({"axes": axes, "base": base})
    except PipelineError as exc:
        assert "\n" not in str(exc)
        return
    for sc in grid.scenarios:
        assert np.isfinite(sc.engine().cfgf).all()


@FUZZ
@given(
    st.lists(
        st.one_of(
            TEXT,
            st.builds(
                lambda n, u: f"ttft_p99={n}{u}",
                st.sampled_from(["1e400", "nan", "inf", "0", "1e-9", "200", "1e6", "1e7"]),
                st.sampled_from(["s", "ms", "us", "", "h"]),
            ),
        ),
        max_size=3,
    )
)
def test_slos_parse_or_one_line_error(items: list[str]) -> None:
    try:
        slos = parse_slos(items)
    except PipelineError as exc:
        assert "\n" not in str(exc)
        return
    assert all(0 < s.limit_s <= 1e6 for s in slos)


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "model_type",
                "hidden_size",
                "num_attention_heads",
                "num_key_value_heads",
                "num_hidden_layers",
                "vocab_size",
                "intermediate_size",
                "max_position_embeddings",
                "head_dim",
            ]
        ),
        VALUES,
    )
)
def test_model_config_loads_or_one_line_error(extra: dict[str, Any]) -> None:
    cfg = {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "vocab_size": 32000,
        "intermediate_size": 11008,
        "max_position_embeddings": 4096,
        **extra,
    }
    try:
        shape = model_shape_from_config(cfg, Path("config.json"))
    except PipelineError as exc:
        assert "\n" not in str(exc)
        return
    assert shape.num_heads % shape.num_kv_heads == 0


@FUZZ
@given(st.integers(0, 3000), st.sampled_from(["[", '{"a":', '[{"b": [', '"[", [']))
def test_json_of_any_depth_is_one_line(depth: int, opener: str) -> None:
    text = opener * depth
    try:
        loads_json(text, "x.json")
    except PipelineError as exc:
        assert "\n" not in str(exc)


@FUZZ
@given(st.integers(0, 3000), st.sampled_from(["[", "{b = ", "[{c = [", "'[', ["]))
def test_toml_of_any_depth_is_one_line(depth: int, opener: str) -> None:
    closer = {"[": "]", "{b = ": "}", "[{c = [": "]}]", "'[', [": "]"}[opener]
    text = "a = " + opener * depth + ("1" if "=" in opener else "") + closer * depth + "\n"
    try:
        loads_toml(text, "x.toml")
    except PipelineError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("x.toml: ")
