"""The HTTP engine against a real `transformers serve` on CPU: a tiny random Llama and a
word-level tokenizer built here, no mock. One server for the module (~10 s to start)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.extras import require

require("transformers")
require("fastapi")

from pipeline.live.http import HttpOptions, run_http  # noqa: E402
from pipeline.live.types import LiveBatch  # noqa: E402
from tests.live.servers import make_tiny_model, transformers_server  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[str]:
    with transformers_server(model_dir) as url:
        yield url


def test_replay_through_transformers_serve(server: str, model_dir: Path) -> None:
    n = 8
    b = LiveBatch(
        [f"q{i}" for i in range(n)],
        np.linspace(0.0, 0.4, n),
        np.array([2, 5, 9, 17, 33, 64, 100, 3], dtype=np.int64),
        np.array([1, 2, 4, 8, 6, 5, 3, 7], dtype=np.int64),
    )
    opts = HttpOptions(server, tokenizer=model_dir / "tokenizer.json", metrics_interval_s=0.1)
    res = run_http(b, opts)
    info = res.engine_info
    assert info["server_kind"] == "transformers"  # detected: no /metrics, generation_config
    assert info["exact_output"] == "true"
    assert res.error == [None] * n
    # EOS never stopped the random model early: min_new_tokens = max_tokens
    assert res.output_tokens_received.tolist() == b.output_tokens.tolist()
    # the server's own usage count of every prompt equals the logged length
    assert info["prompt_length_mismatches"] == "0", info["prompt_length_mismatch_examples"]
    assert (res.sent_s >= b.arrival_s).all()
    assert (res.first_token_s > res.sent_s).all()
    assert (res.finished_s >= res.first_token_s).all()
    several = b.output_tokens > 1
    assert (res.itl_mean_s[several] > 0).all() and np.isnan(res.itl_mean_s[~several]).all()
    # no /metrics on this server: the series holds the client's own counts only
    assert set(res.metrics) == {"time_s", "client_in_flight", "client_waiting"}


def test_unsupported_fields_are_recorded_as_http_errors(server: str) -> None:
    """Told it is vLLM, the client sends token ids and ignore_eos: the server refuses."""
    b = LiveBatch(["a", "b"], np.array([0.0, 0.0]), np.array([4, 4]), np.array([2, 2]))
    res = run_http(b, HttpOptions(server, server_kind="vllm"))
    assert all(e is not None and e.startswith("HTTP 4") for e in res.error), res.error
    assert (res.output_tokens_received == 0).all()


def test_live_command_against_transformers_serve(
    server: str, model_dir: Path, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from pipeline.cli import cli
    from pipeline.warehouse import Warehouse
    from tests.helpers import requests_file

    reqs = requests_file(tmp_path / "requests.parquet", 6, 0.05)
    wh = tmp_path / "wh"
    args = ["live", "--engine", "http", "--base-url", server, "--requests", str(reqs)]
    args += ["--warehouse", str(wh), "--tokenizer", str(model_dir / "tokenizer.json")]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert "live http (transformers at " in r.output
    assert "6 requests, 6 completed, 0 failed" in r.output
    rows = Warehouse(wh).connect().sql("SELECT * FROM live_requests").pl()
    assert rows["prompt_tokens"].to_list() == [8 + i for i in range(6)]
    assert rows["output_tokens_received"].to_list() == rows["output_tokens"].to_list()
