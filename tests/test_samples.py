"""The sample generator: committed samples are what it generates; shapes of each format."""

from __future__ import annotations

import gzip
import json
import math
import re
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from pipeline import samples
from pipeline.ingest.formats import detect
from pipeline.samples import SAMPLES, SAMPLES_DIR, read_sample
from tests.gateway_logs import BAD_KINDS, write_gateway_log

FORMAT_OF = {
    "azure_conv.csv": "azure",
    "burstgpt_v1.csv": "burstgpt",
    "burstgpt_v3.csv": "burstgpt",
    "mooncake.jsonl.zst": "mooncake",
    "bailian.jsonl": "bailian",
    "gateway.jsonl.gz": "gateway",
    "otel_export.jsonl": "otel",
    "otel_spans.json": "otel",
    "token_ids.jsonl": "token_ids",
}


def _jsonl(name: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in read_sample(SAMPLES_DIR / name).splitlines()]


def test_every_format_has_a_sample() -> None:
    assert set(SAMPLES) == set(FORMAT_OF)
    assert set(FORMAT_OF.values()) >= {"azure", "mooncake", "bailian", "burstgpt"}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_committed_sample_is_what_the_generator_makes(name: str) -> None:
    path = SAMPLES_DIR / name
    assert path.exists(), f"{name} missing: run python -m pipeline.samples"
    assert read_sample(path) == samples.sample_content(name), (
        f"traces/{name} differs from the generator: run python -m pipeline.samples"
    )
    assert path.stat().st_size < 100_000


def test_regeneration_is_byte_identical(tmp_path: Path) -> None:
    written = samples.write_samples(tmp_path)
    assert sorted(p.name for p in written) == sorted(SAMPLES)
    for p in written:
        committed = SAMPLES_DIR / p.name
        if p.suffix in (".gz", ".zst"):  # compressors may differ by build: compare content
            assert read_sample(p) == read_sample(committed)
        else:
            assert p.read_bytes() == committed.read_bytes(), p.name
    # a second run over the same folder changes nothing
    before = {p.name: p.read_bytes() for p in written}
    samples.write_samples(tmp_path)
    assert {p.name: p.read_bytes() for p in written} == before


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_each_sample_is_detected_as_its_format(name: str) -> None:
    fmt = detect(read_sample(SAMPLES_DIR / name)[:65536])
    assert fmt is not None and fmt.name == FORMAT_OF[name]


def test_azure_layout() -> None:
    data = (SAMPLES_DIR / "azure_conv.csv").read_bytes()
    assert not data.endswith(b"\n")
    lines = data.split(b"\r\n")
    assert b"\n" not in data.replace(b"\r\n", b"")
    assert lines[0] == b"TIMESTAMP,ContextTokens,GeneratedTokens"
    stamp = re.compile(rb"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{7},\d+,\d+$")
    assert all(stamp.match(x) for x in lines[1:])
    times = [datetime.fromisoformat(x.split(b",")[0].decode()[:26]) for x in lines[1:]]
    assert times == sorted(times)
    prompts = sorted(int(x.split(b",")[1]) for x in lines[1:])
    outputs = sorted(int(x.split(b",")[2]) for x in lines[1:])
    assert 800 < prompts[len(prompts) // 2] < 1300  # Azure conv median 1,020
    assert 90 < outputs[len(outputs) // 2] < 180 and outputs[-1] <= 1000  # median 129, cap
    rate = len(times) / (times[-1] - times[0]).total_seconds()
    assert 4.5 < rate < 6.5  # about 5.5 requests per second


def test_mooncake_layout() -> None:
    recs = _jsonl("mooncake.jsonl.zst")
    assert all(list(r) == ["timestamp", "input_length", "output_length", "hash_ids"] for r in recs)
    assert recs[0]["timestamp"] == 0
    ts = [r["timestamp"] for r in recs]
    assert all(isinstance(t, int) for t in ts) and ts == sorted(ts)
    for r in recs:
        assert len(r["hash_ids"]) == math.ceil(r["input_length"] / 512)
    firsts = Counter(r["hash_ids"][0] for r in recs)
    assert firsts.most_common(1)[0][1] > len(recs) // 5  # a shared system prompt
    # multi-turn: some prompt's ids extend an earlier prompt's full blocks
    seen = {tuple(r["hash_ids"][:-1]) for r in recs if len(r["hash_ids"]) > 2}
    assert any(tuple(r["hash_ids"][: len(s)]) == s for r in recs for s in seen if len(s) > 1)


def test_bailian_layout() -> None:
    recs = _jsonl("bailian.jsonl")
    keys = ["chat_id", "parent_chat_id", "timestamp", "input_length", "output_length"]
    assert all(list(r)[:5] == keys for r in recs)
    ids = set()
    for r in recs:
        assert len(r["hash_ids"]) == math.ceil(r["input_length"] / 16)
        assert isinstance(r["timestamp"], float)
        assert r["type"] in ("text", "search", "image", "file")
        parent = r["parent_chat_id"]
        assert parent == -1 or parent in ids  # parents come first
        assert (parent == -1) == (r["turn"] == 1)
        ids.add(r["chat_id"])
    assert any(r["turn"] > 1 for r in recs)


def test_gateway_layout() -> None:
    lines = read_sample(SAMPLES_DIR / "gateway.jsonl.gz").splitlines()
    recs = [json.loads(x) for x in lines]
    first = recs[0]
    assert list(first) == [
        "request_id", "call_type", "api_key", "spend", "total_tokens", "prompt_tokens",
        "completion_tokens", "startTime", "endTime", "completionStartTime", "model",
        "model_group", "user", "team_id", "end_user", "cache_hit", "metadata", "status",
        "session_id",
    ]  # fmt: skip
    for r in recs:
        assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}", r["request_id"])
        assert re.fullmatch(r"[0-9a-f]{64}", r["api_key"])
        assert r["startTime"] < r["completionStartTime"] < r["endTime"]
        assert r["total_tokens"] == r["prompt_tokens"] + r["completion_tokens"]
        cached = r["metadata"]["usage_object"]["prompt_tokens_details"]["cached_tokens"]
        assert 0 <= cached < r["prompt_tokens"] and cached % 16 == 0
    assert (
        sum(
            r["metadata"]["usage_object"]["prompt_tokens_details"]["cached_tokens"] > 0
            for r in recs
        )
        > len(recs) // 2
    )
    assert len({r["request_id"] for r in recs}) == len(recs)


def test_token_ids_sample_has_no_text() -> None:
    for r in _jsonl("token_ids.jsonl"):
        assert "prompt" not in r and "messages" not in r


def _kind(line: bytes) -> str:
    try:
        rec = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        return "invalid_utf8"
    except json.JSONDecodeError:
        return "truncated_json"
    if "prompt_tokens" not in rec:
        return "missing_prompt_tokens"
    if rec["completion_tokens"] < 0:
        return "negative_completion_tokens"
    try:
        datetime.fromisoformat(rec["startTime"])
    except ValueError:
        return "bad_start_time"
    return "ok"


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_write_gateway_log_bad_lines(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"big{suffix}"
    log = write_gateway_log(path, 6000, seed=5, bad_fraction=0.05, chunk=2500)
    data = gzip.decompress(path.read_bytes()) if suffix.endswith(".gz") else path.read_bytes()
    lines = data.split(b"\n")
    assert lines[-1] == b"" and len(lines) - 1 == log.lines == 6000
    assert log.bytes == len(data)
    assert log.bad_total == 300
    assert set(log.bad) == set(BAD_KINDS)
    assert all(len(v) > 20 for v in log.bad.values())  # varied
    expected = {n: kind for kind, ns in log.bad.items() for n in ns}
    ids: dict[str, int] = {}
    for n, line in enumerate(lines[:-1], start=1):
        kind = _kind(line)
        if kind == "ok":
            rid = json.loads(line)["request_id"]
            if rid in ids:
                kind = "duplicate_request_id"
                assert ids[rid] < n and ids[rid] not in expected  # copies a good line
            ids.setdefault(rid, n)
        assert kind == expected.get(n, "ok"), n
    # bad lines are spread over the whole file
    bad_lines = sorted(expected)
    assert bad_lines[0] < 600 and bad_lines[-1] > 5400


def test_write_gateway_log_is_deterministic(tmp_path: Path) -> None:
    a = write_gateway_log(tmp_path / "a.jsonl", 3000, seed=9, bad_fraction=0.01, chunk=1000)
    b = write_gateway_log(tmp_path / "b.jsonl", 3000, seed=9, bad_fraction=0.01, chunk=700)
    assert a.bad == b.bad
    assert (tmp_path / "a.jsonl").read_bytes() != b""
    # chunking does not matter for ids and bad lines; arrivals use per-chunk draws
    ids_a = [json.loads(x)["request_id"] for x in _good(tmp_path / "a.jsonl")]
    ids_b = [json.loads(x)["request_id"] for x in _good(tmp_path / "b.jsonl")]
    assert ids_a == ids_b
    c = write_gateway_log(tmp_path / "c.jsonl", 3000, seed=9, bad_fraction=0.01, chunk=1000)
    assert (tmp_path / "c.jsonl").read_bytes() == (tmp_path / "a.jsonl").read_bytes()
    assert c.bad == a.bad
    clean = write_gateway_log(tmp_path / "d.jsonl", 500, seed=1)
    assert clean.bad_total == 0
    assert all(_kind(x) == "ok" for x in (tmp_path / "d.jsonl").read_bytes().splitlines())


def _good(path: Path) -> list[bytes]:
    return [x for x in path.read_bytes().splitlines() if _kind(x) == "ok"]
