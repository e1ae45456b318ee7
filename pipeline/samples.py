"""Sample request logs in every supported format, generated from fixed seeds.

``python -m pipeline.samples [OUT_DIR]`` rewrites the samples in ``traces/`` (or
OUT_DIR). The output is byte-identical on every run and machine: the small
samples draw only on ``random.Random(seed).random()``, whose sequence Python
guarantees across versions, and turn it into distributions with ``math``. (The
compressed samples are compared by content: zlib and zstd builds may encode the
same bytes differently, so a compressed file is only rewritten when its content
changes.)

What the samples model (see ``traces/README.md``):

* lengths: lognormal, fitted roughly to the Azure 2023 conversation trace
  (prompt p50 1,020 / mean 1,155 / p99 4,142; output p50 129 / mean 211, capped at
  1,000); arrivals: Poisson.
* conversations (formats with prefix information): a few system prompts shared by
  all sessions of a tenant, multi-turn sessions whose next prompt is the previous
  prompt + the reply + a new user message. Prompts are real token-id sequences, so
  the block hashes (Mooncake 512-token ids, Bailian 16-token ids, vLLM-style hashes)
  and the cached-token counts follow from them exactly.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import zstandard

from pipeline.ingest.hashing import prefix_hashes

SAMPLES_DIR = Path(__file__).resolve().parent.parent / "traces"

# Lognormal fits (median, sigma) to the Azure 2023 conversation trace, rounded.
PROMPT_MEDIAN, PROMPT_SIGMA = 1020.0, 0.55
OUTPUT_MEDIAN, OUTPUT_SIGMA, OUTPUT_CAP = 129.0, 0.8, 1000
VOCAB = 32000


# ---------------------------------------------------------------- random numbers


class _Rng:
    """Distributions built on ``random.Random.random()`` only (stable across Pythons)."""

    def __init__(self, seed: int) -> None:
        self._r = random.Random(seed)

    def uniform(self) -> float:
        return self._r.random()

    def exponential(self, mean: float) -> float:
        return -mean * math.log(1.0 - self._r.random())

    def normal(self) -> float:
        u1, u2 = self._r.random(), self._r.random()
        return math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(2.0 * math.pi * u2)

    def lognormal(self, median: float, sigma: float) -> float:
        return median * math.exp(sigma * self.normal())

    def below(self, n: int) -> int:
        """An integer in [0, n)."""
        return min(int(self._r.random() * n), n - 1)

    def chance(self, p: float) -> bool:
        return self._r.random() < p

    def pick(self, items: Sequence[Any], weights: Sequence[float] | None = None) -> Any:
        if weights is None:
            return items[self.below(len(items))]
        u = self._r.random() * sum(weights)
        for item, w in zip(items, weights, strict=True):
            u -= w
            if u < 0:
                return item
        return items[-1]

    def tokens(self, n: int) -> list[int]:
        return [1 + self.below(VOCAB - 1) for _ in range(n)]

    def hex(self, digits: int) -> str:
        return "".join("0123456789abcdef"[self.below(16)] for _ in range(digits))

    def uuid4(self) -> str:
        h = self.hex(32)
        return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[self.below(4)]}{h[17:20]}-{h[20:]}"


def _prompt_len(rng: _Rng, scale: float = 1.0) -> int:
    return max(1, round(rng.lognormal(PROMPT_MEDIAN * scale, PROMPT_SIGMA)))


def _output_len(rng: _Rng, scale: float = 1.0) -> int:
    return max(
        1, min(round(OUTPUT_CAP * scale), round(rng.lognormal(OUTPUT_MEDIAN * scale, OUTPUT_SIGMA)))
    )


# ---------------------------------------------------------------- conversations


@dataclass
class _Request:
    arrival_s: float
    session: int
    turn: int
    tenant: int
    user: int
    tokens: list[int]
    output: int
    parent: int = -1  # index (after sorting) of the previous turn, -1 for the first
    index: int = 0


TENANTS = ("team-a", "team-b", "team-c")


def _conversations(seed: int, n: int, *, rate: float, scale: float = 1.0) -> list[_Request]:
    """``n`` requests from multi-turn sessions, sorted by arrival (seconds from 0).

    Each tenant has a system prompt that every one of its sessions starts with; a
    session's next prompt is its previous prompt, the reply, and a new message.
    ``scale`` shrinks every length (for samples that spell out token ids).
    """
    rng = _Rng(seed)
    system = [rng.tokens(round(m * scale)) for m in (700, 400, 1100)]
    mean_turns = 2.0
    reqs: list[_Request] = []
    t = 0.0
    session = 0
    while len(reqs) < 2 * n:
        t += rng.exponential(mean_turns / rate)
        tenant = rng.pick(range(len(TENANTS)), (0.5, 0.3, 0.2))
        user = rng.below(40)
        turns = 1
        while turns < 6 and rng.chance(0.5):
            turns += 1
        arrival = t
        prompt = list(system[tenant])
        first = max(1, _prompt_len(rng, scale) - len(prompt) // 2)
        prompt += rng.tokens(first)
        for turn in range(1, turns + 1):
            out = _output_len(rng, scale)
            reqs.append(_Request(arrival, session, turn, tenant, user, list(prompt), out))
            # the reply, then the next user message, after a think time
            prompt += rng.tokens(out) + rng.tokens(max(1, round(rng.lognormal(150 * scale, 0.8))))
            arrival += 0.02 + out * 0.012 + rng.exponential(30.0)
        session += 1
    reqs.sort(key=lambda r: (r.arrival_s, r.session, r.turn))
    reqs = reqs[:n]
    last: dict[int, int] = {}
    for i, r in enumerate(reqs):
        r.index = i
        r.parent = last.get(r.session, -1)
        last[r.session] = i
    return reqs


def _chained_ids(reqs: list[_Request], block: int) -> list[list[int]]:
    """Mooncake/Bailian-style ids: one per (possibly partial) block, equal prefix -> equal id.

    Ids are small integers given out in order of first appearance; an id stands for
    the whole prefix up to and including its block.
    """
    table: dict[tuple[int, tuple[int, ...]], int] = {}
    out = []
    for r in reqs:
        parent = -1
        ids = []
        for s in range(0, len(r.tokens), block):
            key = (parent, tuple(r.tokens[s : s + block]))
            parent = table.setdefault(key, len(table))
            ids.append(parent)
        out.append(ids)
    return out


def _cached_tokens(reqs: list[_Request], block: int = 16) -> list[int]:
    """Prompt tokens an unbounded vLLM prefix cache would serve, request by request."""
    seen: set[int] = set()
    out = []
    for r in reqs:
        hashes = prefix_hashes(r.tokens, block).tolist()
        hit = 0
        for h in hashes:
            if h not in seen:
                break
            hit += 1
        # vLLM recomputes at least the last prompt token
        out.append(min(hit, (len(r.tokens) - 1) // block) * block)
        seen.update(hashes)
    return out


# ---------------------------------------------------------------- small helpers

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
BASE = datetime(2024, 5, 1, tzinfo=UTC)


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _at(seconds: float, base: datetime = BASE) -> datetime:
    return base + timedelta(microseconds=round(seconds * 1e6))


def _jsonl(records: list[dict[str, Any]], *, compact: bool = False) -> bytes:
    seps = (",", ":") if compact else (", ", ": ")
    return "".join(json.dumps(r, separators=seps) + "\n" for r in records).encode()


def _poisson_times(rng: _Rng, n: int, rate: float) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        t += rng.exponential(1.0 / rate)
        out.append(t)
    return out


# ---------------------------------------------------------------- formats


def azure_csv(seed: int = 11, n: int = 600) -> bytes:
    """Azure LLM inference trace 2023 layout: 7 fractional digits, CRLF, no final newline."""
    rng = _Rng(seed)
    start = datetime(2023, 11, 16, 18, 0, 0, tzinfo=UTC)
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for t in _poisson_times(rng, n, 5.5):
        ticks = round(t * 1e7)  # 100 ns ticks
        stamp = start + timedelta(seconds=ticks // 10**7)
        rows.append(
            f"{stamp:%Y-%m-%d %H:%M:%S}.{ticks % 10**7:07d},{_prompt_len(rng)},{_output_len(rng)}"
        )
    return "\r\n".join(rows).encode()


def burstgpt_csv(version: int, seed: int = 12, n: int = 500) -> bytes:
    """BurstGPT v1 (integer timestamps) or v3 (Session ID, Elapsed time, float timestamps).

    About 8% of rows are failed requests with zero response tokens.
    """
    rng = _Rng(seed + version)
    if version == 1:
        rows = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
        t0 = 5.0
    else:
        rows = [
            "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,"
            "Total tokens,Log Type"
        ]
        t0 = 19_440_000.0
    sessions: list[str] = []
    for t in _poisson_times(rng, n, 0.5):
        model = rng.pick(("ChatGPT", "GPT-4"), (0.85, 0.15))
        conversation = rng.chance(0.3)
        log_type = "Conversation log" if conversation else "API log"
        req = _prompt_len(rng)
        resp = 0 if rng.chance(0.08) else _output_len(rng)
        stamp = int(t0 + t)
        if version == 1:
            rows.append(f"{stamp},{model},{req},{resp},{req + resp},{log_type}")
            continue
        session = ""
        if conversation:
            if sessions and rng.chance(0.5):
                session = rng.pick(sessions[-10:])
            else:
                session = rng.uuid4()
                sessions.append(session)
        elapsed = max(1, round(resp * (0.05 if model == "GPT-4" else 0.02) + rng.exponential(1.0)))
        rows.append(f"{stamp}.0,{session},{elapsed},{model},{req},{resp},{req + resp},{log_type}")
    return ("\n".join(rows) + "\n").encode()


def mooncake_jsonl(seed: int = 13, n: int = 300) -> bytes:
    """Mooncake FAST'25 layout: ms timestamps from 0, one hash id per 512-token block."""
    reqs = _conversations(seed, n, rate=3.4)
    ids = _chained_ids(reqs, 512)
    t0 = reqs[0].arrival_s
    return _jsonl(
        [
            {
                "timestamp": int((r.arrival_s - t0) * 1000),
                "input_length": len(r.tokens),
                "output_length": r.output,
                "hash_ids": h,
            }
            for r, h in zip(reqs, ids, strict=True)
        ]
    )


def bailian_jsonl(seed: int = 14, n: int = 100) -> bytes:
    """Qwen Bailian layout: float seconds, 16-token hash blocks, chat ids and turns."""
    reqs = _conversations(seed, n, rate=2.0, scale=0.5)
    ids = _chained_ids(reqs, 16)
    rng = _Rng(seed + 1000)
    t0 = reqs[0].arrival_s
    out = []
    for r, h in zip(reqs, ids, strict=True):
        kind = rng.pick(("text", "search", "image", "file"), (0.8, 0.1, 0.05, 0.05))
        out.append(
            {
                "chat_id": r.index,
                "parent_chat_id": r.parent,
                "timestamp": round(r.arrival_s - t0, 3),
                "input_length": len(r.tokens),
                "output_length": r.output,
                "type": kind,
                "turn": r.turn,
                "hash_ids": h,
            }
        )
    return _jsonl(out)


MODEL = "llama-3-8b-instruct"
MODEL_GROUP = "llama-3-8b"


def api_key(tenant: int) -> str:
    return _Rng(1_000_003 + tenant).hex(64)  # hashed keys, one per team


def _timing(prompt: int, output: int, cached: int) -> tuple[float, float]:
    """(ttft, e2e) seconds of a plausible 8B-model server."""
    ttft = 0.03 + (prompt - cached) * 0.00012
    return ttft, ttft + max(0, output - 1) * 0.011


def gateway_jsonl(seed: int = 15, n: int = 150) -> bytes:
    """LiteLLM ``LiteLLM_SpendLogs`` rows as JSON lines (one per request)."""
    reqs = _conversations(seed, n, rate=5.0)
    cached = _cached_tokens(reqs)
    rng = _Rng(seed + 1000)
    out = []
    for r, c in zip(reqs, cached, strict=True):
        prompt = len(r.tokens)
        ttft, e2e = _timing(prompt, r.output, c)
        start = _at(r.arrival_s)
        out.append(
            {
                "request_id": f"chatcmpl-{rng.hex(32)}",
                "call_type": "acompletion",
                "api_key": api_key(r.tenant),
                "spend": round((prompt * 0.15 + r.output * 0.6) / 1e6, 8),
                "total_tokens": prompt + r.output,
                "prompt_tokens": prompt,
                "completion_tokens": r.output,
                "startTime": _iso(start),
                "endTime": _iso(start + timedelta(microseconds=round(e2e * 1e6))),
                "completionStartTime": _iso(start + timedelta(microseconds=round(ttft * 1e6))),
                "model": MODEL,
                "model_group": MODEL_GROUP,
                "user": f"user-{r.user}",
                "team_id": TENANTS[r.tenant],
                "end_user": "",
                "cache_hit": "False",
                "metadata": {"usage_object": {"prompt_tokens_details": {"cached_tokens": c}}},
                "status": "success",
                "session_id": f"sess-{r.session:06d}",
            }
        )
    return _jsonl(out, compact=True)


def _attr(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}  # proto3 JSON: int64 as string
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": value}}


def _otel_spans(seed: int, n: int) -> list[dict[str, Any]]:
    """GenAI spans (half in vLLM's older attribute names), each after an HTTP server span.

    The one with index 7 has status ERROR (a failed request).
    """
    reqs = _conversations(seed, n, rate=4.0)
    cached = _cached_tokens(reqs)
    rng = _Rng(seed + 1000)
    spans: list[dict[str, Any]] = []
    for i, (r, c) in enumerate(zip(reqs, cached, strict=True)):
        prompt = len(r.tokens)
        ttft, e2e = _timing(prompt, r.output, c)
        queue = round(rng.exponential(0.01), 6)
        start_ns = round(_at_ns(r.arrival_s))
        end_ns = start_ns + round(e2e * 1e9)
        trace = rng.hex(32)
        http_id, span_id = rng.hex(16), rng.hex(16)
        spans.append(
            {
                "traceId": trace,
                "spanId": http_id,
                "name": "POST /v1/chat/completions",
                "kind": 2,
                "startTimeUnixNano": str(start_ns - 200_000),
                "endTimeUnixNano": str(end_ns + 300_000),
                "attributes": [
                    _attr("http.request.method", "POST"),
                    _attr("url.path", "/v1/chat/completions"),
                    _attr("http.response.status_code", 200),
                ],
                "status": {},
            }
        )
        if i % 2 == 0:  # vLLM --otlp-traces-endpoint style (older names)
            attrs = [
                _attr("gen_ai.response.model", MODEL),
                _attr("gen_ai.request.id", f"cmpl-{rng.hex(32)}"),
                _attr("gen_ai.request.max_tokens", 1024),
                _attr("gen_ai.request.temperature", 0.7),
                _attr("gen_ai.usage.prompt_tokens", prompt),
                _attr("gen_ai.usage.completion_tokens", r.output),
                _attr("gen_ai.latency.time_in_queue", queue),
                _attr("gen_ai.latency.time_to_first_token", round(ttft + queue, 6)),
                _attr("gen_ai.latency.e2e", round(e2e + queue, 6)),
            ]
            name = "llm_request"
        else:  # current GenAI semantic conventions
            attrs = [
                _attr("gen_ai.operation.name", "chat"),
                _attr("gen_ai.provider.name", "vllm"),
                _attr("gen_ai.request.model", MODEL),
                _attr("gen_ai.response.model", MODEL),
                _attr("gen_ai.response.id", f"chatcmpl-{rng.hex(32)}"),
                _attr("gen_ai.conversation.id", f"conv-{r.session:06d}"),
                _attr("gen_ai.usage.input_tokens", prompt),
                _attr("gen_ai.usage.output_tokens", r.output),
                _attr("gen_ai.usage.cache_read.input_tokens", c),
                _attr("gen_ai.response.finish_reasons", "stop"),
            ]
            name = f"chat {MODEL}"
        span: dict[str, Any] = {
            "traceId": trace,
            "spanId": span_id,
            "parentSpanId": http_id,
            "name": name,
            "kind": 3,
            "startTimeUnixNano": str(start_ns),
            "endTimeUnixNano": str(end_ns),
            "attributes": attrs,
            "status": {"code": 2, "message": "upstream timeout"} if i == 7 else {},
        }
        spans.append(span)
    return spans


def _at_ns(seconds: float) -> int:
    return (BASE - EPOCH) // timedelta(microseconds=1) * 1000 + round(seconds * 1e9)


def _export(spans: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [
                        _attr("service.name", "llm-gateway"),
                        _attr("service.version", "1.4.2"),
                    ]
                },
                "scopeSpans": [
                    {"scope": {"name": "tracereplay.samples", "version": "1"}, "spans": spans}
                ],
            }
        ]
    }


def otel_jsonl(seed: int = 16, n: int = 48) -> bytes:
    """OTLP JSON lines, as the OpenTelemetry Collector's file exporter writes them."""
    spans = _otel_spans(seed, n)
    batch = 12  # spans per export request: 6 requests with their HTTP spans
    return _jsonl(
        [_export(spans[i : i + batch]) for i in range(0, len(spans), batch)], compact=True
    )


def otel_json(seed: int = 17, n: int = 8) -> bytes:
    """One pretty-printed OTLP JSON export request holding every span."""
    return (json.dumps(_export(_otel_spans(seed, n)), indent=2) + "\n").encode()


def token_ids_jsonl(seed: int = 18, n: int = 60) -> bytes:
    """Per-request records with prompt_token_ids (lengths scaled down 8x to stay small)."""
    reqs = _conversations(seed, n, rate=3.0, scale=0.125)
    rng = _Rng(seed + 1000)
    out = []
    for r in reqs:
        start = _at(r.arrival_s)
        rec: dict[str, Any] = {"request_id": f"cmpl-{rng.hex(24)}-0"}
        if r.index % 3 == 0:
            rec["timestamp"] = _iso(start)
        else:
            rec["timestamp"] = round((start - EPOCH).total_seconds(), 6)
        rec["model"] = MODEL
        rec["user"] = TENANTS[r.tenant]
        if r.tenant == 2:
            rec["cache_salt"] = "team-c-isolated"
        rec["priority"] = 0 if r.tenant == 0 else 1
        rec["max_tokens"] = 512
        rec["prompt_token_ids"] = r.tokens
        if r.index % 2 == 0:
            rec["output_tokens"] = r.output
        else:
            rec["output_token_ids"] = rng.tokens(r.output)
        out.append(rec)
    return _jsonl(out, compact=True)


# ---------------------------------------------------------------- writing the samples


def _gzip(data: bytes) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as f:
        f.write(data)
    return buf.getvalue()


def _zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=19, write_checksum=True).compress(data)


def read_sample(path: Path) -> bytes:
    """The decompressed content of a sample file."""
    data = path.read_bytes()
    if path.suffix == ".gz":
        return gzip.decompress(data)
    if path.suffix == ".zst":
        return zstandard.ZstdDecompressor().decompress(data)
    return data


# file name -> content generator
SAMPLES: dict[str, Callable[[], bytes]] = {
    "azure_conv.csv": azure_csv,
    "burstgpt_v1.csv": lambda: burstgpt_csv(1),
    "burstgpt_v3.csv": lambda: burstgpt_csv(3),
    "mooncake.jsonl.zst": mooncake_jsonl,
    "bailian.jsonl": bailian_jsonl,
    "gateway.jsonl.gz": gateway_jsonl,
    "otel_export.jsonl": otel_jsonl,
    "otel_spans.json": otel_json,
    "token_ids.jsonl": token_ids_jsonl,
}


def sample_content(name: str) -> bytes:
    """The decompressed content the generator gives for sample ``name``."""
    return SAMPLES[name]()


def write_samples(out_dir: Path = SAMPLES_DIR) -> list[Path]:
    """Write every sample into ``out_dir``; compressed files only when their content changed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for fname, make in SAMPLES.items():
        path = out_dir / fname
        content = make()
        if path.suffix in (".gz", ".zst"):
            if path.exists() and read_sample(path) == content:
                paths.append(path)
                continue
            data = _gzip(content) if path.suffix == ".gz" else _zstd(content)
        else:
            data = content
        tmp = path.with_name(f".{fname}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else SAMPLES_DIR
    for p in write_samples(out):
        print(f"{p}  {p.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
