"""OTLP JSON GenAI spans: both layouts, both attribute generations, rejects."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import polars as pl
import pytest

from pipeline.errors import SourceError
from pipeline.ingest.formats import CANONICAL, Block, ParseOptions, otel
from pipeline.samples import SAMPLES_DIR, read_sample

T0 = 1714521600 * 10**9  # 2024-05-01T00:00:00Z in ns


def _attr(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": value}}


def _span(i: int, attrs: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    span = {
        "traceId": f"{i:032x}",
        "spanId": f"{i:016x}",
        "name": "chat m",
        "startTimeUnixNano": str(T0 + i * 10**9),
        "endTimeUnixNano": T0 + i * 10**9 + 2_500_000_000,  # a number, not a string
        "attributes": attrs,
    }
    span.update(extra)
    return span


def _doc(*spans: dict[str, Any]) -> dict[str, Any]:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [_attr("service.name", "gw")]},
                "scopeSpans": [{"scope": {"name": "x"}, "spans": list(spans)}],
            }
        ]
    }


NEW = [
    _attr("gen_ai.request.model", "llama"),
    _attr("gen_ai.response.model", "llama-resp"),
    _attr("gen_ai.response.id", "chatcmpl-new"),
    _attr("gen_ai.usage.input_tokens", 1200),
    _attr("gen_ai.usage.output_tokens", 80),
    _attr("gen_ai.usage.cache_read.input_tokens", 1024),
    _attr("gen_ai.request.max_tokens", 256),
    _attr("gen_ai.conversation.id", "conv-9"),
    _attr("gen_ai.server.time_to_first_token", 0.125),
    {"key": "gen_ai.input.messages", "value": {"stringValue": "TOP SECRET PROMPT"}},
]
OLD = [
    _attr("gen_ai.response.model", "llama-resp"),
    _attr("gen_ai.request.id", "cmpl-old"),
    {"key": "gen_ai.usage.prompt_tokens", "value": {"intValue": 300}},  # int, not string
    _attr("gen_ai.usage.completion_tokens", 20),
    _attr("gen_ai.latency.time_to_first_token", 0.05),
    _attr("gen_ai.latency.time_in_queue", 0.01),
]
HTTP = [_attr("http.request.method", "POST")]


def _parse(data: bytes, first_line: int = 1, offset: int = 0) -> Any:
    return otel.parse(Block(data, first_line, offset), ParseOptions())


def test_jsonl_both_attribute_generations() -> None:
    line1 = json.dumps(_doc(_span(1, HTTP), _span(2, NEW), _span(3, OLD))).encode() + b"\n"
    line2 = json.dumps(_doc(_span(4, OLD[1:] + [_attr("gen_ai.usage.prompt_tokens", 5)])))
    data = line1 + line2.encode() + b"\n"
    p = _parse(data, first_line=3, offset=50)
    assert p.rejects.height == 0
    rows = p.rows
    for name, dtype in rows.schema.items():
        assert dtype == (pl.Int64 if name in ("source_line", "byte_offset") else CANONICAL[name])
    r = rows.to_dicts()
    assert [x["request_id"] for x in r] == ["chatcmpl-new", "cmpl-old", "cmpl-old"]
    assert [x["source_line"] for x in r] == [3, 3, 4]
    assert [x["byte_offset"] for x in r] == [50, 50, 50 + len(line1)]
    new, old = r[0], r[1]
    assert new["arrival_time"] == datetime(2024, 5, 1, 0, 0, 2, tzinfo=UTC)
    assert new["prompt_tokens"] == 1200 and new["output_tokens"] == 80
    assert new["cached_tokens"] == 1024 and new["max_tokens"] == 256
    assert new["model"] == "llama" and new["session_id"] == "conv-9"
    assert new["observed_ttft_s"] == 0.125 and new["observed_e2e_s"] == 2.5
    assert new["observed_queue_s"] is None
    assert old["prompt_tokens"] == 300 and old["output_tokens"] == 20
    assert old["model"] == "llama-resp"
    assert old["observed_ttft_s"] == 0.05 and old["observed_queue_s"] == 0.01
    assert "SECRET" not in str(r)


def test_single_document_numbers_spans() -> None:
    doc = _doc(_span(1, HTTP), _span(2, NEW), _span(3, HTTP), _span(4, OLD))
    data = json.dumps(doc, indent=2).encode()
    p = _parse(data, first_line=1, offset=0)
    assert p.rows["source_line"].to_list() == [2, 4]  # span index in the document
    assert p.rows["byte_offset"].to_list() == [0, 0]


def test_request_id_falls_back_to_trace_and_span() -> None:
    attrs = [_attr("gen_ai.usage.input_tokens", 5), _attr("gen_ai.usage.output_tokens", 1)]
    p = _parse(json.dumps(_doc(_span(7, attrs))).encode())
    assert p.rows["request_id"].to_list() == [f"{7:032x}-{7:016x}"]


def test_rejects_in_jsonl() -> None:
    good = json.dumps(_doc(_span(1, NEW))).encode() + b"\n"
    error = json.dumps(_doc(_span(2, NEW, status={"code": "STATUS_CODE_ERROR"}))).encode()
    lines = [
        good,
        good[:40] + b"\n",  # cut short
        good.replace(b"gw", b"g\xffw"),  # invalid UTF-8
        error + b"\n",
        b'{"something": "else"}\n',
        b'{"resourceMetrics": []}\n',  # another signal: skipped, not rejected
        good,
    ]
    data = b"".join(lines)
    starts = [sum(len(x) for x in lines[:i]) for i in range(len(lines))]
    p = _parse(data, first_line=1, offset=0)
    assert p.rows["source_line"].to_list() == [1, 7]
    rej = p.rejects.to_dicts()
    assert [x["source_line"] for x in rej] == [2, 3, 4, 5]
    assert [x["byte_offset"] for x in rej] == [starts[i] for i in (1, 2, 3, 4)]
    assert rej[0]["reason"].startswith("not valid JSON")
    assert rej[1]["reason"].startswith("invalid UTF-8")
    assert rej[2]["reason"] == "span status ERROR (failed request)"
    assert "no resourceSpans" in rej[3]["reason"]


def test_bad_values_become_null() -> None:
    attrs = [
        {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "lots"}},
        _attr("gen_ai.usage.output_tokens", 3),
    ]
    span = _span(1, attrs, startTimeUnixNano="soon")
    p = _parse(json.dumps(_doc(span)).encode())
    assert p.rejects.height == 0
    row = p.rows.row(0, named=True)
    assert row["prompt_tokens"] is None and row["arrival_time"] is None
    assert row["observed_e2e_s"] is None and row["output_tokens"] == 3


def test_truncated_single_document_is_a_source_error() -> None:
    data = json.dumps(_doc(_span(1, NEW), _span(2, OLD)), indent=2).encode()
    with pytest.raises(SourceError, match="not OTLP JSON"):
        _parse(data[: len(data) // 2])


def test_spans_without_usage_give_no_rows() -> None:
    p = _parse(json.dumps(_doc(_span(1, HTTP))).encode())
    assert p.rows.height == 0 and p.rejects.height == 0
    assert p.rows.schema["arrival_time"] == pl.Datetime("us", "UTC")


def test_sniff() -> None:
    assert otel.sniff(b'{"resourceSpans":[{"resource":')
    assert otel.sniff(b'{\n  "resourceSpans": [\n')
    assert not otel.sniff(b'{"resourceLogs":[]}')
    assert not otel.sniff(b'{"request_id": "a", "prompt_token_ids": [1]}')


def test_the_samples() -> None:
    p = _parse(read_sample(SAMPLES_DIR / "otel_export.jsonl"))
    assert p.rows.height == 47 and p.rejects.height == 1
    assert p.rows["prompt_tokens"].null_count() == 0
    assert p.rows["arrival_time"].is_sorted()
    # 24 vLLM-style spans carry latencies, 23 semconv ones (one failed) cache reads
    assert p.rows["observed_ttft_s"].null_count() == 23
    assert p.rows["cached_tokens"].null_count() == 24
    assert p.rows["source_line"].unique().sort().to_list() == list(range(1, 9))
    doc = _parse(read_sample(SAMPLES_DIR / "otel_spans.json"))
    assert doc.rows.height == 7 and doc.rejects["source_line"].to_list() == [16]
    assert doc.rows["source_line"].to_list() == [2, 4, 6, 8, 10, 12, 14]
