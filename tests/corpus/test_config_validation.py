"""Held corpus: configs and arguments that must be refused before any work starts.

Every case names the parser, the input and the exact outcome: the one-line error (a
PipelineError naming the file or flag, the key and what is allowed) or the value as it
is accepted. Scenarios, grids, the config file, nightly configs, SLOs, model configs,
GPU specs, profiles, measurement files, the replay/sweep/capacity flags and
``sql --format csv`` of nested columns.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pipeline.calibrate.measurements import MeasurementError, read_measurements
from pipeline.cli import cli
from pipeline.config import load_config
from pipeline.errors import ConfigError, PipelineError, ScenarioError
from pipeline.nightly import load_nightly_config
from pipeline.plan.grid import build_grid
from pipeline.plan.slo import parse_slos
from pipeline.sim.hardware import read_gpu_spec
from pipeline.sim.model_config import read_model_config
from pipeline.sim.profiles import load_profile
from pipeline.sim.scenario import resolve_scenarios
from pipeline.validation import MAX_JSON_DEPTH

INT64_MAX = 2**63 - 1

# --- scenarios: a TOML file, the file named in the error ----------------------------------

SCENARIOS: dict[str, tuple[str, str | dict[str, Any]]] = {
    # id: (TOML body, regex of the message | the accepted values)
    "time_scale-nan": ("time_scale = nan", r"time_scale must be a finite number, got nan"),
    "time_scale-inf": ("time_scale = inf", r"time_scale must be a finite number, got inf"),
    "time_scale--inf": ("time_scale = -inf", r"time_scale must be a finite number, got -inf"),
    "time_scale-1e400": ("time_scale = 1e400", r"time_scale must be a finite number, got inf"),
    "time_scale-1e300": (
        "time_scale = 1e300",
        r"time_scale must be a finite number in \[1e-06, 1e\+06\], got 1e\+300",
    ),
    "time_scale-string-1e400": (
        'time_scale = "1e400"',
        r"time_scale must be a finite number, got '1e400'",
    ),
    "time_scale-string-nan": ('time_scale = "nan"', r"time_scale must be a finite number"),
    "time_scale-zero": ("time_scale = 0", r"time_scale must be > 0, got 0"),
    "time_scale-negative": ("time_scale = -2.0", r"time_scale must be > 0, got -2.0"),
    "time_scale-bool": (
        "time_scale = true",
        r"time_scale must be a finite number, got a boolean \(True\)",
    ),
    "time_scale-list": ("time_scale = [1.0]", r"time_scale must be a finite number, got a list"),
    "time_scale-table": (
        "time_scale = {a = 1}",
        r"time_scale must be a finite number, got a table",
    ),
    "time_scale-word": ('time_scale = "fast"', r"time_scale must be a finite number, got 'fast'"),
    "rate-1e-300": (
        "rate = 1e-300",
        r"rate must be a finite number in \[1e-06, 1e\+06\], got 1e-300",
    ),
    "rate-nan": ("rate = nan", r"rate must be a finite number, got nan"),
    "rate-1e308": ("rate = 1e308", r"rate must be a finite number in \[1e-06, 1e\+06\]"),
    "burstiness-inf": (
        'arrivals = "gamma"\nburstiness = inf',
        r"burstiness must be a finite number, got inf",
    ),
    "max_num_batched_tokens-1e20": (
        "max_num_batched_tokens = 1e20",
        r"max_num_batched_tokens must be an integer in \[0, 2147483647\], "
        r"got 100000000000000000000",
    ),
    "max_num_batched_tokens-past-int64": (
        "max_num_batched_tokens = 9223372036854775808",
        r"max_num_batched_tokens must be an integer in \[0, 2147483647\]",
    ),
    "max_num_seqs-1.5": ("max_num_seqs = 1.5", r"max_num_seqs must be an integer, got 1.5"),
    "max_num_seqs-inf": ("max_num_seqs = inf", r"max_num_seqs must be an integer, got inf"),
    "max_num_seqs-bool": ("max_num_seqs = true", r"max_num_seqs must be an integer, got a boolean"),
    "seed-int64-max": (
        f"seed = {INT64_MAX}",
        rf"seed must be an integer in \[0, 4294967295\], got {INT64_MAX}",
    ),
    "seed-minus-1": ("seed = -1", r"seed must be an integer in \[0, 4294967295\], got -1"),
    "seed-largest": ("seed = 4294967295", {"seed": 4294967295}),
    "replicas-huge": (
        "replicas = 100000",
        r"replicas must be an integer in \[1, 4096\], got 100000",
    ),
    "replicas-zero": ("replicas = 0", r"replicas must be >= 1, got 0"),
    "num_requests-1e12": (
        "num_requests = 1e12",
        r"num_requests must be an integer in \[1, 2147483647\]",
    ),
    "block_size-huge": ("block_size = 1048576", r"block_size must be an integer in \[1, 65536\]"),
    "gpu_memory_utilization-nan": (
        "gpu_memory_utilization = nan",
        r"gpu_memory_utilization must be a finite number, got nan",
    ),
    "watermark-nan": ("watermark = nan", r"watermark must be a finite number, got nan"),
    "cost_uncertainty-inf": ("cost_uncertainty = inf", r"cost_uncertainty must be a finite number"),
    "cost_uncertainty-1e9": (
        "cost_uncertainty = 1e9",
        r"cost_uncertainty must be a finite number in \[0, 10\], got 1e\+09",
    ),
    "frontend_request_s-inf": (
        "frontend_request_s = inf",
        r"frontend_request_s must be a finite number, got inf",
    ),
    "cost-fixed_s-1e300": (
        "num_gpu_blocks = 1000\n[cost]\nfixed_s = 1e300\nflop_s_per_token = 0\n"
        "flop_s_per_attn = 0\nmem_s_weights = 0\nmem_s_per_kv_token = 0\n"
        "mem_s_per_token = 0\ncomm_s_fixed = 0\n"
        "comm_s_per_token = 0",
        r"cost.fixed_s must be a finite number in \[0, 1000\], got 1e\+300",
    ),
    "tenant_priority-1e30": (
        'scheduling_policy = "priority"\n[tenant_priority]\nbatch = 1e30',
        r"tenant_priority.batch must be an integer in \[-2147483648, 2147483647\]",
    ),
    "enable_prefix_caching-number": (
        "enable_prefix_caching = 2",
        r"enable_prefix_caching must be true or false, got an integer \(2\)",
    ),
    "policy-list": ('policy = ["vllm"]', r"policy must be a string, got a list"),
    "unknown-key": ("max_num_sequences = 4", r"unknown key 'max_num_sequences' for policy vllm"),
    "legit-vllm": (
        'policy = "vllm"\nmax_num_seqs = 64\ntime_scale = 0.5\nseed = 7',
        {"policy": "vllm", "max_num_seqs": 64, "time_scale": 0.5, "seed": 7},
    ),
    "legit-integral-float": ("max_num_seqs = 1e2", {"max_num_seqs": 100}),
    "legit-rate-edge": ("rate = 1e-6", {"rate": 1e-6}),
}


@pytest.mark.parametrize("case", list(SCENARIOS), ids=list(SCENARIOS))
def test_scenario_file(tmp_path: Path, case: str) -> None:
    body, expected = SCENARIOS[case]
    path = tmp_path / "s.toml"
    path.write_text(body + "\n")
    if isinstance(expected, str):
        with pytest.raises(ScenarioError) as info:
            resolve_scenarios([path], {})
        msg = str(info.value)
        assert msg.startswith(f"{path}: "), msg
        assert re.search(expected, msg), msg
        assert "\n" not in msg
    else:
        (sc,) = resolve_scenarios([path], {})
        got = sc.to_dict()
        for key, value in expected.items():
            assert got[key] == value, (key, got[key])


# --- replay / sweep / capacity / profile flags: one line naming the flag, exit 1 ----------

FLAGS: dict[str, tuple[list[str], str]] = {
    "replay--time-scale-nan": (
        ["replay", "--time-scale", "nan"],
        "--time-scale: time_scale must be a finite number, got 'nan'",
    ),
    "replay--time-scale-inf": (
        ["replay", "--time-scale", "inf"],
        "--time-scale: time_scale must be a finite number, got 'inf'",
    ),
    "replay--rate-1e-300": (
        ["replay", "--rate", "1e-300"],
        "--rate: rate must be a finite number in [1e-06, 1e+06], got 1e-300",
    ),
    "replay--seed-minus-1": (
        ["replay", "--seed", "-1"],
        "--seed: seed must be an integer in [0, 4294967295], got -1",
    ),
    "replay--seed-int64": (
        ["replay", "--seed", str(INT64_MAX)],
        f"--seed: seed must be an integer in [0, 4294967295], got {INT64_MAX}",
    ),
    "replay--max-num-batched-tokens-1e20": (
        ["replay", "--max-num-batched-tokens", "1e20"],
        "--max-num-batched-tokens: max_num_batched_tokens must be an integer in "
        "[0, 2147483647], got 100000000000000000000",
    ),
    "replay--replicas-word": (
        ["replay", "--replicas", "two"],
        "--replicas: replicas must be an integer, got 'two'",
    ),
    "capacity--target-rate-inf": (
        ["capacity", "--slo", "ttft_p99=1s", "--target-rate", "inf"],
        "--target-rate: value must be a finite number in (0, 1e+06], got 'inf'",
    ),
    "capacity--max-replicas-past-int64": (
        ["capacity", "--slo", "ttft_p99=1s", "--max-replicas", "99999999999999999999"],
        "--max-replicas: value must be an integer in [1, 4096], got '99999999999999999999'",
    ),
    "sweep--jobs-zero": (
        ["sweep", "GRID", "--jobs", "0"],
        "--jobs: value must be an integer in [1, 4096], got '0'",
    ),
    "replay--gpu-hour-price-nan": (
        ["replay", "--gpu-hour-price", "nan"],
        "--gpu-hour-price: value must be a finite number in (0, 1e+06], got 'nan'",
    ),
    "replay--lock-timeout-s-inf": (
        ["replay", "--lock-timeout-s", "inf"],
        "--lock-timeout-s: value must be a finite number in [0, 1e+07], got 'inf'",
    ),
    "ingest--prefix-block-tokens-1e20": (
        ["ingest", "x.jsonl", "--prefix-block-tokens", "1e20"],
        "--prefix-block-tokens: value must be an integer in [1, 65536], got '1e20'",
    ),
    "sql--max-rows-zero": (
        ["sql", "SELECT 1", "--max-rows", "0"],
        "--max-rows: value must be an integer in [1, 1000000000], got '0'",
    ),
    "report--slo-ttft-ms-nan": (
        ["report", "--slo-ttft-ms", "nan"],
        "--slo-ttft-ms: value must be a finite number in (0, 1e+09], got 'nan'",
    ),
    "profile-new--tensor-parallel-size-huge": (
        [
            "profile",
            "new",
            "--model-config",
            "x.json",
            "--gpu",
            "h100",
            "--tensor-parallel-size",
            "4097",
            "-o",
            "o",
        ],  # fmt: skip
        "--tensor-parallel-size: value must be an integer in [1, 1024], got '4097'",
    ),
}


@pytest.mark.parametrize("case", list(FLAGS), ids=list(FLAGS))
def test_flag(tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "GRID").write_text("[axes]\nreplicas = [1]\n")
    args, message = FLAGS[case]
    r = CliRunner().invoke(
        cli, [*args, "--warehouse", str(tmp_path / "wh")] if args[0] != "profile" else args
    )
    assert r.exit_code == 1, r.output
    assert r.output.strip() == f"Error: {message}", r.output
    assert not (tmp_path / "wh" / "runs").exists()  # nothing ran


def test_capacity_slo_1e400_is_one_line(tmp_path: Path) -> None:
    r = CliRunner().invoke(
        cli, ["capacity", "--slo", "ttft_p99=1e400s", "--warehouse", str(tmp_path / "wh")]
    )
    assert r.exit_code == 1, r.output
    assert r.output.strip() == (
        "Error: --slo ttft_p99: '1e400s': the limit must be a time in (0, 1e+06s]"
    )


# --- SLOs ------------------------------------------------------------------------------------

SLOS: dict[str, tuple[list[str] | dict[str, Any], str | float]] = {
    "1e400s": (["ttft_p99=1e400s"], r"'1e400s': the limit must be a time in \(0, 1e\+06s\]"),
    "huge-exponent": (["ttft_p99=1e9999999999ms"], r"the limit must be a time in \(0, 1e\+06s\]"),
    "tiny-is-zero": (["ttft_p99=1e-400s"], r"the limit must be a positive time"),
    "two-weeks": (["e2e_p50=2000000s"], r"the limit must be a time in \(0, 1e\+06s\]"),
    "table-number": ({"ttft_p99": 0.2}, r"give the limit as a string with its unit"),
    "table-nan-string": ({"ttft_p99": "nan"}, r"'nan' is not a time limit"),
    "ok-200ms": (["ttft_p99=200ms"], 0.2),
    "ok-exponent": (["tpot_p50=3e1ms"], 0.03),
}


@pytest.mark.parametrize("case", list(SLOS), ids=list(SLOS))
def test_slo(case: str) -> None:
    items, expected = SLOS[case]
    if isinstance(expected, str):
        with pytest.raises(ConfigError, match=expected):
            parse_slos(items)
    else:
        (slo,) = parse_slos(items)
        assert slo.limit_s == pytest.approx(expected)


# --- grids -----------------------------------------------------------------------------------

GRIDS: dict[str, tuple[dict[str, Any], str]] = {
    "rate_scale-inf": (
        {"axes": {"rate_scale": [1, float("inf")]}},
        r"grid: \[axes\] rate_scale must be a finite number in \[1e-06, 1e\+06\], got inf",
    ),
    "rate_scale-nan": ({"axes": {"rate_scale": [float("nan")]}}, r"rate_scale values must be > 0"),
    "base-time_scale-nan": (
        {"base": {"time_scale": float("nan")}, "axes": {"replicas": [1, 2]}},
        r"time_scale must be a finite number, got nan",
    ),
    "axis-seed-int64": (
        {"axes": {"seed": [0, INT64_MAX]}},
        r"seed must be an integer in \[0, 4294967295\]",
    ),
    "axis-concurrency-1e20": (
        {"axes": {"concurrency": [16, 1e20]}},
        r"max_num_seqs must be an integer in \[0, 2147483647\]",
    ),
}


@pytest.mark.parametrize("case", list(GRIDS), ids=list(GRIDS))
def test_grid(case: str) -> None:
    raw, expected = GRIDS[case]
    with pytest.raises(PipelineError, match=expected):
        build_grid(raw)


def test_capacity_search_bound_inf() -> None:
    from pipeline.plan.capacity import parse_specs

    with pytest.raises(ConfigError, match=r"max must be a finite number in \(0, 1e\+09\], got inf"):
        parse_specs({"concurrency": {"max": float("inf")}})


# --- nightly configs ---------------------------------------------------------------------

NIGHTLY_OK = '[nightly]\ninbox = ["logs/*.jsonl"]\n[[scenario]]\npolicy = "vllm"\n'
NIGHTLY: dict[str, tuple[str, str | None]] = {
    "tokenizer-5": (
        NIGHTLY_OK + "[ingest]\ntokenizer = 5\n",
        "ingest.tokenizer must be a string, got an integer (5)",
    ),
    "warehouse-5": (
        NIGHTLY_OK.replace("[nightly]\n", "[nightly]\nwarehouse = 5\n"),
        "nightly.warehouse must be a string, got an integer (5)",
    ),
    "inbox-mixed": (
        NIGHTLY_OK.replace('inbox = ["logs/*.jsonl"]', "inbox = [1, {a = 2}]"),
        "nightly.inbox item 1 must be a string, got an integer (1)",
    ),
    "inbox-number": (
        NIGHTLY_OK.replace('inbox = ["logs/*.jsonl"]', "inbox = 5"),
        "nightly.inbox must be a non-empty list of strings, e.g. "
        'nightly.inbox = ["logs/*.jsonl.gz"]; got an integer (5)',
    ),
    "inbox-blank-item": (
        NIGHTLY_OK.replace('inbox = ["logs/*.jsonl"]', 'inbox = ["  "]'),
        "nightly.inbox item 1 must be a non-empty string",
    ),
    "block_size-big": (
        NIGHTLY_OK + '[ingest]\nblock_size = "big"\n',
        "ingest.block_size must be an integer in [1, 65536], got a string ('big')",
    ),
    "block_size-zero": (
        NIGHTLY_OK + "[ingest]\nblock_size = 0\n",
        "ingest.block_size must be an integer in [1, 65536], got 0",
    ),
    "block_size-1e20": (
        NIGHTLY_OK + "[ingest]\nblock_size = 1e20\n",
        "ingest.block_size must be an integer in [1, 65536], got 1e+20",
    ),
    "report-string": (
        NIGHTLY_OK.replace("[nightly]\n", '[nightly]\nreport = "false"\n'),
        "nightly.report must be true or false, got a string ('false')",
    ),
    "keep_nights-inf": (
        NIGHTLY_OK.replace("[nightly]\n", "[nightly]\nkeep_nights = inf\n"),
        "nightly.keep_nights must be an integer in [1, 100000], got inf",
    ),
    "keep_nights-past-int64": (
        NIGHTLY_OK.replace("[nightly]\n", "[nightly]\nkeep_nights = 9223372036854775808\n"),
        "nightly.keep_nights must be an integer in [1, 100000], got 9223372036854775808",
    ),
    "replay-time_scale-nan": (
        NIGHTLY_OK + "[replay]\ntime_scale = nan\n",
        "[replay]: time_scale must be a finite number, got nan",
    ),
    "scenario-seed-minus-1": (
        NIGHTLY_OK + "seed = -1\n",
        "[[scenario]] 1: seed must be an integer in [0, 4294967295], got -1",
    ),
    "scenario-file-number": (
        NIGHTLY_OK.replace('policy = "vllm"', "file = 3"),
        "scenario 1 file must be a string, got an integer (3)",
    ),
    "drift-nan": (
        NIGHTLY_OK + "[drift]\ntraffic = nan\n",
        "traffic (a relative change, 0.25 = 25%) must be a finite number",
    ),
    "capacity-summary_only-string": (
        NIGHTLY_OK + '[slo]\nttft_p99 = "1s"\n[capacity]\nsummary_only = "no"\n',
        "capacity.summary_only must be true or false, got a string ('no')",
    ),
    "capacity-scenario-list": (
        NIGHTLY_OK + '[slo]\nttft_p99 = "1s"\n[capacity]\nscenario = ["vllm"]\n',
        "capacity.scenario must be a string, got a list",
    ),
    "trace_start-number": (
        NIGHTLY_OK + "[ingest]\ntrace_start = 2024\n",
        "ingest.trace_start must be a string, got an integer (2024)",
    ),
    "format-unknown": (NIGHTLY_OK + '[ingest]\nformat = "csvv"\n', "unknown ingest.format 'csvv'"),
    "slo-1e400": (
        NIGHTLY_OK + '[slo]\nttft_p99 = "1e400s"\n',
        "the limit must be a time in (0, 1e+06s]",
    ),
    "legit": (NIGHTLY_OK + "[ingest]\nblock_size = 32\n", None),
}


@pytest.mark.parametrize("case", list(NIGHTLY), ids=list(NIGHTLY))
def test_nightly_config(tmp_path: Path, case: str) -> None:
    text, message = NIGHTLY[case]
    path = tmp_path / "nightly.toml"
    path.write_text(text)
    if message is None:
        cfg = load_nightly_config(path)
        assert cfg.ingest.block_size == 32 and cfg.report is True
        assert cfg.inbox == [str(tmp_path / "logs/*.jsonl")]
        return
    with pytest.raises(PipelineError) as info:
        load_nightly_config(path)
    msg = str(info.value)
    assert msg.startswith(str(path)), msg
    assert message in msg, msg
    assert "\n" not in msg


def test_nightly_wrong_type_via_cli_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "nightly.toml"
    path.write_text(NIGHTLY["warehouse-5"][0])
    r = CliRunner().invoke(cli, ["nightly", str(path)])
    assert r.exit_code == 1
    assert r.output.strip() == (
        f"Error: {path}: nightly.warehouse must be a string, got an integer (5)"
    )
    assert not (tmp_path / "5").exists()


# --- the config file -------------------------------------------------------------------------

CONFIGS: dict[str, tuple[str, str | None]] = {
    "block_size-string": (
        '[ingest]\nblock_size = "big"\n',
        "ingest.block_size must be an integer in [1, 65536], got a string ('big')",
    ),
    "block_size-bool": (
        "[ingest]\nblock_size = true\n",
        "ingest.block_size must be an integer in [1, 65536], got a boolean (True)",
    ),
    "tokenizer-5": (
        "[ingest]\ntokenizer = 5\n",
        "ingest.tokenizer must be a string, got an integer (5)",
    ),
    "warehouse-5": (
        "[warehouse]\npath = 5\n",
        "warehouse.path must be a string, got an integer (5)",
    ),
    "warehouse-empty": ('[warehouse]\npath = ""\n', "warehouse.path must be a non-empty string"),
    "trace_start-bad": (
        '[ingest]\ntrace_start = "yesterday"\n',
        "ingest.trace_start 'yesterday' is not an ISO time",
    ),
    "gpu_price-inf": (
        "[gpu_prices]\nh100-80gb = inf\n",
        "gpu_prices.h100-80gb must be a finite number in (0, 1e+06], got inf",
    ),
    "gpu_price-zero": (
        "[gpu_prices]\nh100-80gb = 0\n",
        "gpu_prices.h100-80gb must be a finite number in (0, 1e+06], got 0",
    ),
    "replay-time_scale-inf": (
        "[replay]\ntime_scale = inf\n",
        "[replay]: time_scale must be a finite number, got inf",
    ),
    "replay-max_num_seqs-1e20": (
        "[replay]\nmax_num_seqs = 1e20\n",
        "[replay]: max_num_seqs must be an integer in [0, 2147483647]",
    ),
    "unknown-key": ("[ingest]\nblok_size = 16\n", "unknown key ingest.blok_size"),
    "section-not-table": ("ingest = 5\n", "ingest must be a table"),
    "legit": (
        (
            '[warehouse]\npath = "wh"\n[ingest]\nblock_size = 16\n[replay]\ntime_scale = 0.5\n'
            "max_num_seqs = 64\n[gpu_prices]\nh100-80gb = 2.49\n"
        ),
        None,
    ),
}


@pytest.mark.parametrize("case", list(CONFIGS), ids=list(CONFIGS))
def test_config_file(tmp_path: Path, case: str) -> None:
    text, message = CONFIGS[case]
    path = tmp_path / "tracereplay.toml"
    path.write_text(text)
    if message is None:
        cfg = load_config(path)
        assert cfg.get("ingest", "block_size") == 16
        assert cfg.get("replay", "time_scale") == 0.5
        return
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert msg.startswith(str(path)) and message in msg, msg


# --- model configs (config.json) -----------------------------------------------------------

LLAMA = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "vocab_size": 128256,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
}
MODELS: dict[str, tuple[dict[str, Any] | str, str | None]] = {
    "heads-7-kv-3": (
        {**LLAMA, "hidden_size": 7 * 128, "num_attention_heads": 7, "num_key_value_heads": 3},
        "num_attention_heads (7) must be a multiple of num_key_value_heads (3)",
    ),
    "hidden-1e20": (
        {**LLAMA, "hidden_size": 1e20},
        "key 'hidden_size' must be an integer in [1, 1048576], got 1e+20",
    ),
    "layers-past-int64": (
        {**LLAMA, "num_hidden_layers": 2**64},
        "key 'num_hidden_layers' must be an integer in [1, 16384], got 18446744073709551616",
    ),
    "heads-bool": (
        {**LLAMA, "num_attention_heads": True},
        "key 'num_attention_heads' must be an integer in [1, 16384], got a boolean",
    ),
    "vocab-string": (
        {**LLAMA, "vocab_size": "128k"},
        "key 'vocab_size' must be an integer in [1, 16777216], got a string",
    ),
    "head_dim-float": (
        {**LLAMA, "head_dim": 128.5},
        "key 'head_dim' must be an integer in [1, 16384], got 128.5",
    ),
    "max_len-zero-string": (
        {**LLAMA, "max_position_embeddings": "0"},
        "key 'max_position_embeddings' must be an integer in [2, 2147483647]",
    ),
    "nan-constant": (
        '{"model_type": "llama", "hidden_size": NaN}',
        "hidden_size is not a finite number (NaN, Infinity or past 1e308)",
    ),
    "1e999": (
        '{"model_type": "llama", "hidden_size": 1e999}',
        "hidden_size is not a finite number (NaN, Infinity or past 1e308)",
    ),
    "deep-100000": (
        "[" * 100_000 + "]" * 100_000,
        f"JSON nested more than {MAX_JSON_DEPTH} levels deep (at character {MAX_JSON_DEPTH + 1})",
    ),
    "deep-object": (
        '{"a":' * 5000 + "1" + "}" * 5000,
        f"JSON nested more than {MAX_JSON_DEPTH} levels deep",
    ),
    "list-root": ("[1, 2]", "not a JSON object"),
    "legit-gqa": (LLAMA, None),
    "legit-brackets-in-strings": ({**LLAMA, "note": "[" * 1000}, None),
}


@pytest.mark.parametrize("case", list(MODELS), ids=list(MODELS))
def test_model_config(tmp_path: Path, case: str) -> None:
    cfg, message = MODELS[case]
    path = tmp_path / "config.json"
    path.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    if message is None:
        shape = read_model_config(path)
        assert (shape.num_heads, shape.num_kv_heads, shape.head_dim) == (32, 8, 128)
        return
    with pytest.raises(ConfigError) as info:
        read_model_config(path)
    msg = str(info.value)
    assert msg.startswith(str(path)) and message in msg, msg
    assert "\n" not in msg


def test_profile_new_refuses_7_heads_on_3_kv_heads(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MODELS["heads-7-kv-3"][0]))
    r = CliRunner().invoke(
        cli,
        [
            "profile",
            "new",
            "--model-config",
            str(path),
            "--gpu",
            "h100-80gb",
            "-o",
            str(tmp_path / "p.json"),
        ],
    )
    assert r.exit_code == 1
    assert "must be a multiple of num_key_value_heads (3)" in r.output
    assert not (tmp_path / "p.json").exists()


def test_profile_new_tp_must_divide_heads(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    r = CliRunner().invoke(
        cli,
        [
            "profile",
            "new",
            "--model-config",
            str(path),
            "--gpu",
            "h100-80gb",
            "--tensor-parallel-size",
            "3",
            "-o",
            str(tmp_path / "p.json"),
        ],
    )
    assert r.exit_code == 1
    assert r.output.strip() == (
        f"Error: --tensor-parallel-size 3: {path} has 32 attention heads, which do not split "
        "evenly over that many GPUs; give a --tensor-parallel-size that divides them"
    )


# --- GPU specs -----------------------------------------------------------------------------

GPU = {
    "peak_flops": 989e12,
    "hbm_bytes_per_s": 3.35e12,
    "memory_bytes": 85520809984,
    "nvlink_bytes_per_s": 450e9,
}
GPUS: dict[str, tuple[dict[str, Any] | str, str | None]] = {
    "peak_flops-0": (
        {**GPU, "peak_flops": 0},
        "key 'peak_flops' must be a finite number in (0, 1e+18], got 0",
    ),
    "hbm-1e999": (
        json.dumps(GPU).replace("3350000000000.0", "1e999"),
        "hbm_bytes_per_s is not a finite number (NaN, Infinity or past 1e308)",
    ),
    "hbm-Infinity": (
        json.dumps(GPU).replace("3350000000000.0", "Infinity"),
        "hbm_bytes_per_s is not a finite number (NaN, Infinity or past 1e308)",
    ),
    "hbm-1e300": (
        {**GPU, "hbm_bytes_per_s": 1e300},
        "key 'hbm_bytes_per_s' must be a finite number in (0, 1e+15], got 1e+300",
    ),
    "memory-negative": (
        {**GPU, "memory_bytes": -1},
        "key 'memory_bytes' must be a finite number in [1, 1.1259e+15], got -1",
    ),
    "nvlink-string": (
        {**GPU, "nvlink_bytes_per_s": "fast"},
        "key 'nvlink_bytes_per_s' must be a finite number in [0, 1e+15], got a string",
    ),
    "fp8-bool": (
        {**GPU, "peak_flops_fp8": True},
        "key 'peak_flops_fp8' must be a finite number in [0, 1e+18], got a boolean",
    ),
    "efficiency-zero": (
        {**GPU, "efficiency": {"compute_efficiency": 0}},
        "key 'efficiency.compute_efficiency' must be a finite number in (0, 1], got 0",
    ),
    "like-number": ({**GPU, "like": 5}, "key 'like' must be a string, got an integer (5)"),
    "deep": ('{"a":' * 1000 + "1" + "}" * 1000, "JSON nested more than 64 levels deep"),
    "legit": (GPU, None),
}


@pytest.mark.parametrize("case", list(GPUS), ids=list(GPUS))
def test_gpu_spec(tmp_path: Path, case: str) -> None:
    spec, message = GPUS[case]
    path = tmp_path / "gpu.json"
    path.write_text(spec if isinstance(spec, str) else json.dumps(spec))
    if message is None:
        gpu, _ = read_gpu_spec(path)
        assert gpu.peak_flops == 989e12 and gpu.memory_bytes == 85520809984
        return
    with pytest.raises(ConfigError) as info:
        read_gpu_spec(path)
    msg = str(info.value)
    assert msg.startswith(str(path)) and message in msg, msg


def test_profile_new_never_writes_infinity(tmp_path: Path) -> None:
    cfg, gpu = tmp_path / "config.json", tmp_path / "gpu.json"
    cfg.write_text(json.dumps(LLAMA))
    gpu.write_text(json.dumps(GPU).replace("3350000000000.0", "1e999"))
    out = tmp_path / "p.json"
    r = CliRunner().invoke(
        cli, ["profile", "new", "--model-config", str(cfg), "--gpu-spec", str(gpu), "-o", str(out)]
    )
    assert r.exit_code == 1 and "hbm_bytes_per_s is not a finite number" in r.output
    assert not out.exists()
    gpu.write_text(json.dumps(GPU))
    r = CliRunner().invoke(
        cli, ["profile", "new", "--model-config", str(cfg), "--gpu-spec", str(gpu), "-o", str(out)]
    )
    assert r.exit_code == 0, r.output
    json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the profile"))


# --- profiles --------------------------------------------------------------------------------

PROFILES: dict[str, tuple[str, str]] = {
    "deep": ("[" * 100_000 + "]" * 100_000, "JSON nested more than 64 levels deep"),
    "list-root": ("[]", "not a JSON object; is it a profile JSON?"),
    "nan-coefficient": (
        '{"coefficients": {"fixed_s": NaN}, "memory": {}}',
        "coefficients.fixed_s is not a finite number",
    ),
    "memory-1e30": (
        '{"coefficients": {}, "memory": {"kv_bytes_per_token": 1e30, "weight_bytes": 1, '
        '"gpu_memory_bytes": 1, "max_model_len": 8}}',
        "memory.kv_bytes_per_token must be an integer in [1, 1152921504606846976], got 1e+30",
    ),
}


@pytest.mark.parametrize("case", list(PROFILES), ids=list(PROFILES))
def test_profile_file(tmp_path: Path, case: str) -> None:
    text, message = PROFILES[case]
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(ScenarioError) as info:
        load_profile(str(path))
    assert message in str(info.value), str(info.value)
    # and as a scenario's profile, the scenario is named too
    with pytest.raises(ScenarioError, match=re.escape(message)):
        resolve_scenarios([], {"profile": str(path)})


# --- measurement files -----------------------------------------------------------------------

HEADER = "phase,batch_size,prompt_tokens,context_tokens,time_ms\n"
GOOD_ROWS = [f"prefill,1,{128 * (i + 1)},0,{10 + i}" for i in range(10)] + [
    f"decode,{i + 1},0,{512 * (i + 1)},{5 + i * 0.1}" for i in range(10)
]


def _measurements(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "steps.csv"
    path.write_text(HEADER + "\n".join(rows) + "\n")
    return path


def test_measurements_two_wild_rows_are_left_out_by_name(tmp_path: Path) -> None:
    rows = list(GOOD_ROWS)
    rows[3] = "prefill,1,512,0,1e308"
    rows[12] = "decode,3,1e21,1536,5.2"
    m = read_measurements(_measurements(tmp_path, rows))
    assert len(m) == 18
    assert m.left_out == (
        "row 4 (line 5): time_ms 1e+308 > 3.6e+06",
        "row 13 (line 14): prompt_tokens 1e+21 > 1e+07",
    )
    assert m.time_s.max() < 1.0


def test_measurements_mostly_wild_is_refused(tmp_path: Path) -> None:
    rows = [r.rsplit(",", 1)[0] + ",1e308" for r in GOOD_ROWS[:5]] + GOOD_ROWS[5:]
    path = _measurements(tmp_path, rows)
    with pytest.raises(MeasurementError, match=r"5 of 20 rows are beyond what one engine step"):
        read_measurements(path)


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        ("inf", "time_ms is inf; give a finite number"),
        ("1e999", "time_ms is 1e999; give a finite number"),
        ("nan", "'nan' is not a number; give a number"),
        ("-1", "time_ms must be > 0, got -1; fix the row or drop it"),
    ],
    ids=["inf", "1e999", "nan", "negative"],
)
def test_measurements_non_finite_time_refused_by_name(
    tmp_path: Path, cell: str, message: str
) -> None:
    rows = list(GOOD_ROWS)
    rows[1] = f"prefill,1,256,0,{cell}"
    path = _measurements(tmp_path, rows)
    with pytest.raises(MeasurementError) as info:
        read_measurements(path)
    assert str(info.value) == f"{path}: row 2 (line 3), column time_ms: {message}"


# --- sql --format csv of nested columns --------------------------------------------------------


def test_sql_csv_writes_lists_and_structs_as_json(tmp_path: Path) -> None:
    from pipeline.warehouse import Warehouse

    wh = tmp_path / "wh"
    Warehouse(wh).init()
    r = CliRunner().invoke(
        cli,
        [
            "sql",
            "--warehouse",
            str(wh),
            "--format",
            "csv",
            "SELECT [1, 2, 3] AS l, {'a': 1, 'b': 'x'} AS s, ['p', NULL] AS t, 7 AS n",
        ],
    )
    assert r.exit_code == 0, r.output
    assert r.output == 'l,s,t,n\n"[1, 2, 3]","{""a"": 1, ""b"": ""x""}","[""p"", null]",7\n'


def _synthetic_steps(tmp_path: Path) -> tuple[Path, Any, Any]:
    """(clean CSV, its frame, the true step seconds): a known profile's times, 5% noise."""
    import numpy as np
    import polars as pl

    from pipeline.calibrate.profile import read_profile_json
    from pipeline.calibrate.synthetic import design_grid, profile_truth_s

    like, _ = read_profile_json("llama-3-8b_h100-80gb_tp1")
    frame = design_grid(replicates=2)
    truth = profile_truth_s(like["coefficients"])(frame)
    noise = np.exp(np.random.default_rng(0).normal(0, 0.05, frame.height))
    frame = frame.with_columns(pl.Series("time_ms", truth * 1000 * noise))
    return tmp_path / "steps.csv", frame, truth


@pytest.mark.parametrize(
    "wild",
    ["impossible", "possible"],
    ids=["time_ms-1e308-prompt-1e21", "pause-50x-clock-0.02x"],
)
def test_calibrate_with_two_wild_rows_fits_as_if_clean(tmp_path: Path, wild: str) -> None:
    import numpy as np
    import polars as pl

    from pipeline.calibrate.features import step_features
    from pipeline.calibrate.fit import as_vector, predict
    from pipeline.calibrate.measured import calibrate_measurements
    from pipeline.calibrate.synthetic import as_measurements

    path, frame, truth = _synthetic_steps(tmp_path)
    rows = frame.with_columns(pl.col("prompt_tokens").cast(pl.String)).to_dicts()
    if wild == "impossible":
        rows[3]["time_ms"], rows[10]["prompt_tokens"] = 1e308, "1e21"
    else:
        rows[3]["time_ms"] *= 50  # a prefill behind a garbage-collection pause
        rows[100]["time_ms"] *= 0.02  # a decode timed across a clock jump
    pl.DataFrame(rows).write_csv(path)
    cal = calibrate_measurements(path, "llama-3-8b_h100-80gb_tp1", tmp_path / "p.json")
    assert len(cal.measurements.left_out) == (2 if wild == "impossible" else 0)
    assert cal.profile["provenance"]["rows_left_out"] == list(cal.measurements.left_out)
    for phase, err in cal.result.fit_error.items():
        assert err.median is not None and err.median < 0.05, phase  # was 0.70 before
    fitted = predict(as_vector(cal.result.coefficients), step_features(as_measurements(frame)))
    assert float(np.median(np.abs(fitted / truth - 1))) < 0.01


def test_clean_measurements_fit_exactly_as_without_the_outlier_screen(tmp_path: Path) -> None:
    import numpy as np

    from pipeline.calibrate.features import step_features
    from pipeline.calibrate.fit import _fit_rows, fit_coefficients
    from pipeline.calibrate.profile import read_profile_json
    from pipeline.calibrate.synthetic import as_measurements

    _, frame, _ = _synthetic_steps(tmp_path)
    m = as_measurements(frame)
    like = read_profile_json("llama-3-8b_h100-80gb_tp1")[0]["coefficients"]
    f = step_features(m)
    screened, _ = fit_coefficients(f, m.time_s, like)
    plain, _ = _fit_rows(f, m.time_s, like, None)
    assert np.array_equal(screened, plain)


# --- any TOML file: too deep, not text, unknown keys -------------------------------------------

DEEP_TOML = "a = " + "[" * 100_000 + "]" * 100_000 + "\n"
DEEP_INLINE = "a = " + "{b = " * 5000 + "1" + "}" * 5000 + "\n"
NESTED_MSG = "arrays or inline tables nested too deeply to read"


def _load_any(kind: str, path: Path) -> Any:
    from pipeline.plan.grid import load_grid

    return {
        "scenario": lambda: resolve_scenarios([path], {}),
        "nightly": lambda: load_nightly_config(path),
        "config": lambda: load_config(path),
        "grid": lambda: load_grid(path),
    }[kind]()


@pytest.mark.parametrize("kind", ["scenario", "nightly", "config", "grid"])
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (DEEP_TOML.encode(), NESTED_MSG),
        (DEEP_INLINE.encode(), NESTED_MSG),
        (b"a = 1\n\xff\xfe\x00binary", "not UTF-8 text (byte 7)"),
        (b"a = [1, 2\n", "not valid TOML (Unclosed array"),
    ],
    ids=["arrays-100000-deep", "inline-tables-5000-deep", "binary", "invalid"],
)
def test_toml_file_that_cannot_be_read_is_one_line(
    tmp_path: Path, kind: str, body: bytes, message: str
) -> None:
    path = tmp_path / "x.toml"
    path.write_bytes(body)
    with pytest.raises(PipelineError) as info:
        _load_any(kind, path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: ") and message in msg and "\n" not in msg, msg


def test_set_value_nested_too_deep_is_a_plain_string() -> None:
    from pipeline.sim.scenario import parse_value

    text = "[" * 5000 + "]" * 5000
    assert parse_value(text) == text
    with pytest.raises(ScenarioError, match="time_scale must be a finite number, got '"):
        resolve_scenarios([], {"time_scale": parse_value(text)})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            NIGHTLY_OK.replace("[nightly]\n", "[nightly]\nkeep_night = 3\n"),
            "unknown key(s) nightly.keep_night",
        ),
        (NIGHTLY_OK + "[ingest]\nblocksize = 3\n", "unknown key(s) ingest.blocksize"),
        (
            NIGHTLY_OK + "[replay]\ntime_scale = [0.5]\n",
            "[replay]: time_scale must be a finite number, got a list",
        ),
        (NIGHTLY_OK + "[reply]\n", "unknown section(s) reply"),
    ],
    ids=["nightly-unknown-key", "ingest-unknown-key", "replay-list", "unknown-section"],
)
def test_nightly_unknown_or_misplaced(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "nightly.toml"
    path.write_text(text)
    with pytest.raises(PipelineError) as info:
        load_nightly_config(path)
    assert message in str(info.value), str(info.value)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"axes": {"max_num_sequences": [1, 2]}}, "unknown axis 'max_num_sequences'"),
        ({"axes": {"replicas": 4}}, "replicas must be a list of values"),
        ({"axes": {"replicas": [[1]]}}, "values must be numbers, strings or bools"),
        ({"axes": {"replicas": [1]}, "slo": {"ttft_p99": "1e400s"}}, "the limit must be a time"),
        ({"axes": {"replicas": [1, True]}}, "replicas must be an integer, got a boolean"),
    ],
    ids=["unknown-axis", "axis-scalar", "axis-list-of-lists", "slo-1e400", "axis-bool"],
)
def test_grid_malformed(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(PipelineError) as info:
        build_grid(raw)
    assert message in str(info.value), str(info.value)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[" * 100_000 + "]" * 100_000, "JSON nested more than 64 levels deep"),
        ('{"bos_token": ', "not valid JSON"),
        (b"\xff\xfe{}", "not UTF-8 text"),
    ],
    ids=["nested-100000", "truncated", "not-utf8"],
)
def test_tokenizer_config_json_is_bounded(tmp_path: Path, text: str | bytes, says: str) -> None:
    """A tokenizer folder's tokenizer_config.json is a file from outside too: a bad one
    ends that source file's ingest with one line naming it, no RecursionError."""
    from pipeline.errors import SourceError
    from pipeline.ingest.prompt_text import load_tokenizer
    from tests.ingest import offline_tokenizer

    offline_tokenizer.build(tmp_path / "tok")
    cfg = tmp_path / "tok" / "tokenizer_config.json"
    cfg.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(SourceError) as err:
        load_tokenizer(str(tmp_path / "tok"), "log.jsonl")
    message = str(err.value)
    assert message.startswith(f"log.jsonl: cannot load tokenizer {tmp_path / 'tok'}: {cfg}: ")
    assert says in message and "\n" not in message
