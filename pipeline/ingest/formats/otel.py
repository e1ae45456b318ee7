"""OpenTelemetry GenAI spans in OTLP JSON (trace export requests).

Accepted layouts:

* one export request for the whole file, possibly pretty-printed:
  ``{"resourceSpans": [{"resource": {...}, "scopeSpans": [{"spans": [...]}]}]}``;
  a record's ``source_line`` is then the span's 1-based index in the document
  (counting every span) and ``byte_offset`` the document's offset;
* JSONL of export requests, one per line, as the OpenTelemetry Collector's file
  exporter writes them; ``source_line`` / ``byte_offset`` are those of the line.

The proto3 JSON mapping is followed: ``intValue`` and ``*UnixNano`` may be
strings or numbers; snake_case keys (``resource_spans``, ``scope_spans``) and
the older ``instrumentationLibrarySpans`` are accepted too.

Only spans with at least one ``gen_ai.usage.*`` attribute are requests; other
spans (HTTP, database, ...) are skipped and not counted. Attributes read:

* tokens: ``gen_ai.usage.input_tokens`` / ``output_tokens`` (current semantic
  conventions) or ``gen_ai.usage.prompt_tokens`` / ``completion_tokens`` (older
  emitters, vLLM's ``--otlp-traces-endpoint``); ``gen_ai.usage.cache_read.input_tokens``
  -> ``cached_tokens``; ``gen_ai.request.max_tokens`` -> ``max_tokens``.
* ``gen_ai.request.model``, else ``gen_ai.response.model`` -> ``model``.
* ``gen_ai.response.id``, else ``gen_ai.request.id``, else ``<traceId>-<spanId>`` ->
  ``request_id``; ``gen_ai.conversation.id`` -> ``session_id``.
* span start -> ``arrival_time``; end - start -> ``observed_e2e_s``;
  ``gen_ai.latency.time_to_first_token`` or ``gen_ai.server.time_to_first_token``
  -> ``observed_ttft_s``; ``gen_ai.latency.time_in_queue`` -> ``observed_queue_s``.

Spans whose status is ERROR are failed requests and are rejected. Output
messages and events are never read; the prompt (``gen_ai.input.messages``, a
JSON string of messages whose ``parts`` hold the text, else ``gen_ai.prompt``)
is read only with ``--tokenizer``: tokenized, hashed into ``prefix_hashes``
(``pipeline.ingest.prompt_text``) and dropped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import polars as pl

from pipeline.errors import SourceError
from pipeline.ingest.formats import Block, Parsed, ParseOptions
from pipeline.ingest.formats._lines import (
    BOM,
    INT64_MAX,
    Rejects,
    as_float,
    as_int,
    json_kind,
    lenient,
    load_json_line,
    split_lines,
    utf8_reason,
)
from pipeline.ingest.prompt_text import Prompt, messages_of, with_prompt_hashes

name = "otel"
line_based = False
has_header = False
may_hold_text = True

# the only attributes ever decoded (message content is never touched)
_WANTED = frozenset(
    {
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "gen_ai.usage.prompt_tokens",
        "gen_ai.usage.completion_tokens",
        "gen_ai.usage.cache_read.input_tokens",
        "gen_ai.request.model",
        "gen_ai.response.model",
        "gen_ai.response.id",
        "gen_ai.request.id",
        "gen_ai.request.max_tokens",
        "gen_ai.conversation.id",
        "gen_ai.latency.time_to_first_token",
        "gen_ai.server.time_to_first_token",
        "gen_ai.latency.time_in_queue",
    }
)
# prompt text, read only with --tokenizer (hashed, then dropped): the current convention's
# JSON messages, else the older plain prompt (or JSON messages in it)
_PROMPT_KEYS = ("gen_ai.input.messages", "gen_ai.prompt")
_USAGE_PREFIX = "gen_ai.usage."
_RESOURCE_KEYS = ("resourceSpans", "resource_spans")
_SCOPE_KEYS = ("scopeSpans", "scope_spans", "instrumentationLibrarySpans")
_OTHER_SIGNALS = ("resourceMetrics", "resourceLogs", "resource_metrics", "resource_logs")
_ERROR = (2, "STATUS_CODE_ERROR", "ERROR")

_SCHEMA: dict[str, pl.DataType] = {
    "request_id": pl.String(),
    "arrival_time": pl.Int64(),  # microseconds, cast to Datetime at the end
    "prompt_tokens": pl.Int64(),
    "output_tokens": pl.Int64(),
    "max_tokens": pl.Int64(),
    "model": pl.String(),
    "session_id": pl.String(),
    "observed_ttft_s": pl.Float64(),
    "observed_e2e_s": pl.Float64(),
    "observed_queue_s": pl.Float64(),
    "cached_tokens": pl.Int64(),
    "source_line": pl.Int64(),
    "byte_offset": pl.Int64(),
}


def sniff(head: bytes) -> bool:
    if head.startswith(BOM):
        head = head[len(BOM) :]
    start = head.lstrip()[:2048]
    return start.startswith(b"{") and (b'"resourceSpans"' in start or b'"resource_spans"' in start)


class _BadRecordError(ValueError):
    """A record that cannot be read; the message is the reject reason."""


def _value(v: Any) -> Any:
    """The Python value of an OTLP ``AnyValue`` (scalars only; arrays and maps -> None)."""
    if not isinstance(v, dict):
        return v  # tolerate already-flattened attributes
    for key in ("stringValue", "string_value"):
        if key in v:
            return v[key]
    for key in ("intValue", "int_value"):
        if key in v:
            return as_int(v[key])
    for key in ("doubleValue", "double_value"):
        if key in v:
            return as_float(v[key])
    for key in ("boolValue", "bool_value"):
        if key in v:
            return v[key]
    return None


def _attributes(span: dict[str, Any], text: bool) -> tuple[dict[str, Any], bool]:
    """The wanted attributes of a span (prompt text too when ``text``), and whether it
    has any gen_ai.usage attribute."""
    attrs = span.get("attributes") or []
    if not isinstance(attrs, list):
        raise _BadRecordError("span attributes: expected a list")
    found: dict[str, Any] = {}
    usage = False
    for a in attrs:
        if not isinstance(a, dict):
            continue
        key = a.get("key")
        if not isinstance(key, str):
            continue
        if key.startswith(_USAGE_PREFIX):
            usage = True
        if key in _WANTED or (text and key in _PROMPT_KEYS):
            found[key] = lenient(_value, a.get("value"))
    return found, usage


def _spans(doc: Any) -> Iterator[Any]:
    """Every span of an export request, in document order."""
    if not isinstance(doc, dict):
        raise _BadRecordError(f"not a JSON object ({json_kind(doc)}); expected an OTLP export")
    resource_spans = next((doc[k] for k in _RESOURCE_KEYS if k in doc), None)
    if resource_spans is None:
        if any(k in doc for k in _OTHER_SIGNALS):
            return  # a metrics or logs export in the same file: not requests
        raise _BadRecordError("not an OTLP trace export: no resourceSpans")
    if not isinstance(resource_spans, list):
        raise _BadRecordError("resourceSpans: expected a list")
    for rs in resource_spans:
        if not isinstance(rs, dict):
            raise _BadRecordError("resourceSpans: expected objects")
        scopes = next((rs[k] for k in _SCOPE_KEYS if k in rs), None) or []
        if not isinstance(scopes, list):
            raise _BadRecordError("scopeSpans: expected a list")
        for ss in scopes:
            spans = ss.get("spans") if isinstance(ss, dict) else None
            if not isinstance(spans, list):
                raise _BadRecordError("scopeSpans: spans is not a list")
            yield from spans


def _first(attrs: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        v = attrs.get(k)
        if v is not None:
            return v
    return None


def _nano(span: dict[str, Any], key: str) -> int | None:
    value = lenient(as_int, span.get(key)) or None  # 0 means unset in OTLP
    if value is not None and not 0 < value < INT64_MAX:
        raise _BadRecordError(f"{key} out of range (nanoseconds since 1970 within 64 bits)")
    return value


def _text(value: Any) -> str | None:
    if value is None:
        return None
    out = str(value)
    try:
        out.encode("utf-8")
    except UnicodeEncodeError:
        raise _BadRecordError(
            "an unpaired surrogate escape (\\ud800-\\udfff) in a text value"
        ) from None
    return out


def _prompt(attrs: dict[str, Any]) -> Prompt | None:
    for key in _PROMPT_KEYS:
        value = attrs.get(key)
        if not isinstance(value, str):
            continue
        try:
            messages = messages_of(json.loads(value))
        except (ValueError, RecursionError):
            messages = None
        if messages is not None:
            return messages
        if key == "gen_ai.prompt":
            return value
    return None


def _row(span: Any, with_text: bool = False) -> dict[str, Any] | None:
    """The canonical fields of one span; None when it is not a GenAI request span.

    With ``with_text``, the span's prompt (if any) is under ``_prompt``.
    """
    if not isinstance(span, dict):
        raise _BadRecordError(f"span: not a JSON object ({json_kind(span)})")
    attrs, usage = _attributes(span, with_text)
    if not usage:
        return None
    status = span.get("status")
    if isinstance(status, dict) and status.get("code") in _ERROR:
        raise _BadRecordError("span status ERROR (failed request)")
    start = _nano(span, "startTimeUnixNano")
    end = _nano(span, "endTimeUnixNano")

    def num(kind: type, *keys: str) -> Any:
        # a value of the wrong type is null: the validator rejects missing counts
        return lenient(as_int if kind is int else as_float, _first(attrs, *keys))

    def text(*keys: str) -> str | None:
        return _text(_first(attrs, *keys))

    request_id = text("gen_ai.response.id", "gen_ai.request.id")
    if request_id is None:
        trace, span_id = span.get("traceId"), span.get("spanId")
        if trace and span_id:
            request_id = _text(f"{trace}-{span_id}")
    return {
        "request_id": request_id,
        "arrival_time": None if start is None else start // 1000,
        "prompt_tokens": num(int, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"),
        "output_tokens": num(int, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens"),
        "max_tokens": num(int, "gen_ai.request.max_tokens"),
        "model": text("gen_ai.request.model", "gen_ai.response.model"),
        "session_id": text("gen_ai.conversation.id"),
        "observed_ttft_s": num(
            float, "gen_ai.latency.time_to_first_token", "gen_ai.server.time_to_first_token"
        ),
        "observed_e2e_s": None if end is None or start is None else (end - start) / 1e9,
        "observed_queue_s": num(float, "gen_ai.latency.time_in_queue"),
        "cached_tokens": num(int, "gen_ai.usage.cache_read.input_tokens"),
        "_prompt": _prompt(attrs) if with_text else None,
    }


def _add_doc(
    doc: Any,
    rows: list[dict[str, Any]],
    rejects: Rejects,
    line: int | None,
    offset: int,
    text: bool,
) -> None:
    """Rows (or rejects) for every GenAI span of one export request.

    ``line`` is the document's line (JSONL); None numbers records by span index.
    """
    index = 0
    try:
        for span in _spans(doc):
            index += 1
            where = line if line is not None else index
            try:
                row = _row(span, text)
            except _BadRecordError as exc:
                rejects.add(where, offset, str(exc))
                continue
            if row is not None:
                row["source_line"] = where
                row["byte_offset"] = offset
                rows.append(row)
    except _BadRecordError as exc:
        rejects.add(line if line is not None else max(index, 1), offset, str(exc))


def _looks_like_jsonl(lines: list[bytes]) -> bool:
    """True when one of the first few lines is a whole export request on its own."""
    for raw in lines[:5]:
        doc, why = load_json_line(raw)
        if why is None and isinstance(doc, dict):
            if any(k in doc for k in _RESOURCE_KEYS + _OTHER_SIGNALS):
                return True
    return False


def parse(block: Block, opts: ParseOptions) -> Parsed:
    data = block.data
    body = data[len(BOM) :] if data.startswith(BOM) else data
    skip = len(data) - len(body)
    rows: list[dict[str, Any]] = []
    rejects = Rejects()
    text = opts.tokenizer is not None
    lines = split_lines(body, block.first_line, block.offset + skip)
    content = [i for i, raw in enumerate(lines.raw) if raw.strip()]

    whole: Any = None
    whole_error: str | None = None
    if len(content) > 1:
        try:
            whole = json.loads(body)
        except UnicodeDecodeError as exc:
            whole_error = utf8_reason(exc)
        except json.JSONDecodeError as exc:
            whole_error = f"{exc.msg} at line {exc.lineno} column {exc.colno}"
        except RecursionError:
            whole_error = "nested too deeply"
        except ValueError:  # an integer literal beyond Python's digit limit
            whole_error = "a number literal too long"

    if len(content) > 1 and whole_error is None:
        # one (pretty-printed) document: records are numbered by span index
        first = content[0]
        _add_doc(whole, rows, rejects, None, int(lines.offsets[first]), text)
    elif len(content) > 1 and not _looks_like_jsonl([lines.raw[i] for i in content[:5]]):
        raise SourceError(
            str(opts.path),
            f"not OTLP JSON: the file is neither one JSON document nor JSON lines ({whole_error})",
        )
    else:
        # JSON lines: one export request per line
        for i in content:
            line_no = int(lines.numbers[i])
            off = int(lines.offsets[i])
            doc, why = load_json_line(lines.raw[i])
            if why is not None:
                rejects.add(line_no, off, why)
                continue
            _add_doc(doc, rows, rejects, line_no, off, text)

    frame = pl.DataFrame({k: [r.get(k) for r in rows] for k in _SCHEMA}, schema=_SCHEMA)
    frame = frame.with_columns(pl.col("arrival_time").cast(pl.Datetime("us", "UTC")))
    if text:
        frame = with_prompt_hashes(frame, [r["_prompt"] for r in rows], opts)
    return Parsed(rows=frame, rejects=rejects.frame())
