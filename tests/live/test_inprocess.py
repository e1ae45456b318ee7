"""The in-process engine: transformers' continuous batching on CPU with a tiny random model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.extras import require

require("torch")
require("transformers")

from pipeline.errors import ConfigError  # noqa: E402
from pipeline.live.inprocess import run_inprocess  # noqa: E402
from pipeline.live.model import SHAPES, load_model, random_prompts  # noqa: E402
from pipeline.live.types import LiveBatch  # noqa: E402


def _batch(n: int, seed: int = 1, span: float = 0.3) -> LiveBatch:
    rng = np.random.default_rng(seed)
    return LiveBatch(
        [f"q{k}" for k in range(n)],
        np.sort(rng.uniform(0.0, span, n)),
        rng.integers(3, 70, n).astype(np.int64),
        rng.integers(1, 12, n).astype(np.int64),
    )


@pytest.fixture(scope="module")
def tiny():  # type: ignore[no-untyped-def]
    return load_model("tiny", device="cpu", seed=0)


def test_every_request_generates_exactly_its_output_length(tiny) -> None:  # type: ignore[no-untyped-def]
    batch = _batch(10)
    res = run_inprocess(batch, loaded=tiny, num_blocks=48, block_size=16, max_batch_tokens=64)
    assert res.error == [None] * 10
    np.testing.assert_array_equal(res.output_tokens_received, batch.output_tokens)
    # open loop: sent at (not before) its arrival, in order; then scheduled, first token,
    # finished. How late is the machine's load (a stalled thread moves a single send), so
    # the bound is on the median and at a third of the arrivals' span: a feeder that
    # waited for results would fall behind by the generation of every earlier request.
    assert np.all(res.sent_s >= batch.arrival_s - 1e-6) and np.all(np.diff(res.sent_s) >= 0)
    assert np.median(res.sent_s - batch.arrival_s) < 0.1
    assert np.all(res.first_scheduled_s >= res.sent_s)
    assert np.all(res.first_token_s >= res.first_scheduled_s)
    assert np.all(res.finished_s >= res.first_token_s)
    one = batch.output_tokens == 1
    assert np.all(np.isnan(res.itl_mean_s[one])) and not np.any(np.isnan(res.itl_mean_s[~one]))
    info = res.engine_info
    assert info["engine"] == "inprocess" and info["num_blocks_effective"] == "48"
    assert info["block_size"] == "16" and info["dtype"] == "float32"


def test_a_request_longer_than_the_cache_is_recorded_not_dropped(tiny) -> None:  # type: ignore[no-untyped-def]
    batch = LiveBatch(["ok", "huge"], np.array([0.0, 0.0]), np.array([10, 200]), np.array([3, 3]))
    res = run_inprocess(batch, loaded=tiny, num_blocks=8, block_size=16, max_batch_tokens=32)
    assert res.error[0] is None and res.output_tokens_received[0] == 3
    assert res.error[1] is not None and "raise num_blocks" in res.error[1]
    assert np.isnan(res.first_token_s[1])


def test_prefill_first_scheduler_and_a_full_cache_still_finish(tiny) -> None:  # type: ignore[no-untyped-def]
    # 6 blocks of 16 tokens for requests of up to ~80 tokens: the engine must wait or
    # soft-reset requests, and still finish every one of them
    batch = _batch(8, seed=3, span=0.05)
    res = run_inprocess(
        batch,
        loaded=tiny,
        num_blocks=6,
        block_size=16,
        max_batch_tokens=32,
        scheduler="prefill_first",
    )
    assert res.error == [None] * 8
    np.testing.assert_array_equal(res.output_tokens_received, batch.output_tokens)


def test_model_from_config_json_and_from_a_checkpoint_dir(tmp_path, tiny) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", **SHAPES["tiny"], "vocab_size": 300}))
    m = load_model(str(cfg), device="cpu")
    assert m.weights == "random" and m.config["vocab_size"] == 300
    again = load_model(str(cfg), device="cpu")
    a = next(iter(m.model.parameters()))
    b = next(iter(again.model.parameters()))
    assert bool((a == b).all()), "random weights are seeded"
    ckpt = tmp_path / "ckpt"
    tiny.model.save_pretrained(ckpt)
    loaded = load_model(str(ckpt), device="cpu")
    assert loaded.weights == "checkpoint"
    sd = loaded.model.state_dict()
    for name, value in tiny.model.state_dict().items():
        assert bool((sd[name] == value).all()), name


def test_bad_model_specs_say_what_to_do(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="built-in shape"):
        load_model(str(tmp_path / "nope"))
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama",\n "hidden_size": }')
    with pytest.raises(ConfigError, match="line 2"):
        load_model(str(bad))
    with pytest.raises(ConfigError, match="scheduler"):
        run_inprocess(_batch(1), model="tiny", scheduler="lifo")


def test_random_prompts_are_seeded_and_of_the_logged_length() -> None:
    lengths = np.array([1, 5, 40])
    a = random_prompts(lengths, 100, seed=7)
    assert [len(p) for p in a] == [1, 5, 40]
    assert a == random_prompts(lengths, 100, seed=7)
    assert all(1 <= t < 100 for p in a for t in p)


def test_an_engine_that_dies_fails_every_request_instead_of_hanging(tiny) -> None:  # type: ignore[no-untyped-def]
    # a KV cache far larger than this machine's memory: the engine thread fails to start
    batch = _batch(3)
    res = run_inprocess(
        batch,
        loaded=tiny,
        num_blocks=10**9,
        block_size=256,
        max_batch_tokens=64,
        warmup=0,
        timeout_s=120,
    )
    assert all(e is not None and e.startswith("engine stopped") for e in res.error), res.error
    assert (res.output_tokens_received == 0).all()
