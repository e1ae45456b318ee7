"""Valid records of every ingest format, as bytes, for the bad-input corpus and the fuzzers.

Each builder takes a record number ``i`` (distinct numbers give distinct ids or
content) and keyword overrides of the record's fields.
"""

from __future__ import annotations

import json
from typing import Any

T0 = 1714521600  # 2024-05-01T00:00:00Z
AZURE_HEADER = b"TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
BURST_V1_HEADER = b"Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
BURST_V3_HEADER = (
    b"Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,"
    b"Total tokens,Log Type\n"
)


def jline(obj: Any) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def gateway(i: int, **over: Any) -> dict[str, Any]:
    s = f"2024-05-01T00:{i // 60 % 60:02d}:{i % 60:02d}"
    r: dict[str, Any] = {
        "request_id": f"chatcmpl-{i:06d}",
        "startTime": f"{s}.250000Z",
        "endTime": f"{s}.950000Z",
        "completionStartTime": f"{s}.400000Z",
        "prompt_tokens": 100 + i,
        "completion_tokens": 20 + i % 7,
        "model": "llama-3-8b-instruct",
        "team_id": "team-a",
        "status": "success",
    }
    r.update(over)
    return r


def mooncake(i: int, **over: Any) -> dict[str, Any]:
    r: dict[str, Any] = {
        "timestamp": 1000 * i,
        "input_length": 600 + i,
        "output_length": 10 + i % 5,
        "hash_ids": [7 * i, 7 * i + 1],
    }
    r.update(over)
    return r


def bailian(i: int, **over: Any) -> dict[str, Any]:
    r: dict[str, Any] = {
        "chat_id": 100 + i,
        "parent_chat_id": -1,
        "timestamp": 1.5 * i,
        "input_length": 40 + i,
        "output_length": 5,
        "type": "text",
        "turn": 1,
        "hash_ids": [3 * i, 3 * i + 1, 3 * i + 2],
    }
    r.update(over)
    return r


def token_ids(i: int, **over: Any) -> dict[str, Any]:
    r: dict[str, Any] = {
        "request_id": f"cmpl-{i}",
        "timestamp": T0 + i + 0.25,
        "prompt_token_ids": list(range(i, i + 40)),
        "output_tokens": 17,
        "model": "m",
    }
    r.update(over)
    return r


def azure(i: int, prompt: object = None, output: object = None) -> bytes:
    p = 300 + i if prompt is None else prompt
    o = 40 + i % 9 if output is None else output
    return f"2023-11-16 18:{i // 60 % 60:02d}:{i % 60:02d}.6805900,{p},{o}\r\n".encode()


def burst_v1(i: int, ts: object = None, prompt: object = None) -> bytes:
    t = 5 * i if ts is None else ts
    p = 400 + i if prompt is None else prompt
    return f"{t},ChatGPT,{p},{18 + i % 3},{418 + i},Conversation log\n".encode()


def burst_v3(i: int) -> bytes:
    return f"{5.0 * i},{i},1.5,GPT-4,{400 + i},{18 + i % 3},{418 + i},Conversation log\n".encode()


def otel_attr(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": value}}


def otel_span(i: int, *extra_attrs: dict[str, Any], **over: Any) -> dict[str, Any]:
    span: dict[str, Any] = {
        "traceId": f"{i:032x}",
        "spanId": f"{i:016x}",
        "name": "chat llama",
        "startTimeUnixNano": str((T0 + i) * 10**9),
        "endTimeUnixNano": str((T0 + i) * 10**9 + 2_500_000_000),
        "attributes": [
            otel_attr("gen_ai.request.model", "llama"),
            otel_attr("gen_ai.response.id", f"resp-{i}"),
            otel_attr("gen_ai.usage.input_tokens", 1200 + i),
            otel_attr("gen_ai.usage.output_tokens", 80),
            *extra_attrs,
        ],
    }
    span.update(over)
    return span


def otel_doc(*spans: dict[str, Any], **resource_over: Any) -> dict[str, Any]:
    resource: dict[str, Any] = {"attributes": [otel_attr("service.name", "gw")]}
    resource.update(resource_over)
    return {
        "resourceSpans": [
            {"resource": resource, "scopeSpans": [{"scope": {"name": "x"}, "spans": list(spans)}]}
        ]
    }


def lines(objs: list[Any]) -> bytes:
    return b"".join(jline(o) for o in objs)
