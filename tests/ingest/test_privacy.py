"""No prompt text reaches the warehouse, from any place any format can carry it.

Distinct text is planted in every place each format can hold it (prompt,
messages, responses, OTel attributes, events and resource attributes, unknown
fields, extra CSV columns and fields), in records that land and in records
that are quarantined (a bad count, a line cut short, a failed call). After
the ingest, every file of the warehouse is scanned: the raw bytes (Parquet
footers and any other file) and every decompressed Parquet value.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from pipeline.ingest import IngestOptions, ingest_logs
from pipeline.warehouse import Warehouse
from tests.ingest.records import (
    AZURE_HEADER,
    BURST_V1_HEADER,
    azure,
    bailian,
    burst_v1,
    gateway,
    jline,
    mooncake,
    otel_attr,
    otel_doc,
    otel_span,
    token_ids,
)

PLANTED: list[str] = []


def secret(where: str) -> str:
    """A distinct text for one place (recorded, so the scan looks for each one)."""
    text = f"SECRET-{where}-{len(PLANTED):03d}-xq"
    PLANTED.append(text)
    return text


def _gateway() -> bytes:
    def rec(i: int, **over: object) -> dict[str, object]:
        return gateway(
            i,
            messages=[{"role": "user", "content": secret("gw-messages")}],
            response={"choices": [{"message": {"content": secret("gw-response")}}]},
            prompt=secret("gw-prompt"),
            metadata={
                "usage_object": {"prompt_tokens_details": {"cached_tokens": 1}},
                "note": secret("gw-metadata"),
            },
            proxy_server_request={"body": {"messages": secret("gw-proxy-body")}},
            **{secret("gw-unknown-key"): secret("gw-unknown-value")},
            **over,
        )

    good = [jline(rec(i)) for i in range(3)]
    failed = jline(rec(5, status="failure"))
    negative = jline(rec(6, prompt_tokens=-1))
    cut = jline(rec(7))[:-60] + b"\n"
    not_object = jline([secret("gw-array")])
    return b"".join([*good, failed, negative, cut, not_object])


def _mooncake() -> bytes:
    def rec(i: int, **over: object) -> dict[str, object]:
        return mooncake(i, prompt=secret("mc-prompt"), extra={"text": secret("mc-extra")}, **over)

    return b"".join(
        [
            jline(rec(0)),
            jline(rec(1)),
            jline(rec(2, input_length=-5)),  # rejected: the line holds a prompt
            jline(rec(3, hash_ids=["x"])),
            jline(rec(4))[:-30] + b"\n",
        ]
    )


def _bailian() -> bytes:
    return jline(bailian(0, prompt=secret("bl-prompt"))) + jline(
        bailian(1, output_length=-1, prompt=secret("bl-prompt-bad"))
    )


def _token_ids() -> bytes:
    def rec(i: int, **over: object) -> dict[str, object]:
        return token_ids(
            i,
            prompt=secret("tk-prompt"),
            messages=[{"role": "user", "content": secret("tk-messages")}],
            output_text=secret("tk-output"),
            **over,
        )

    return b"".join(
        [jline(rec(0)), jline(rec(1)), jline(rec(2, output_tokens=-1)), jline(rec(3))[:-50] + b"\n"]
    )


def _otel() -> bytes:
    def span(i: int, **over: object) -> dict[str, object]:
        return otel_span(
            i,
            otel_attr("gen_ai.prompt", secret("otel-attr-prompt")),
            otel_attr("gen_ai.input.messages", secret("otel-attr-input")),
            otel_attr("gen_ai.output.messages", secret("otel-attr-output")),
            otel_attr("gen_ai.completion", secret("otel-attr-completion")),
            otel_attr("user.note", secret("otel-attr-unknown")),
            events=[
                {
                    "name": "gen_ai.content.prompt",
                    "attributes": [otel_attr("gen_ai.prompt", secret("otel-event"))],
                    "body": {"stringValue": secret("otel-event-body")},
                }
            ],
            **over,
        )

    res = {"attributes": [otel_attr("service.note", secret("otel-resource"))]}
    docs = [
        otel_doc(span(1), span(2), **res),
        otel_doc(span(3, status={"code": 2, "message": secret("otel-status")}), **res),
        otel_doc(span(4, startTimeUnixNano=str(2**70)), **res),
    ]
    return b"".join(jline(d) for d in docs)


def _otel_document() -> bytes:
    doc = otel_doc(
        otel_span(10, otel_attr("gen_ai.prompt", secret("otel-doc-prompt"))),
        otel_span(11, otel_attr("gen_ai.usage.output_tokens", secret("otel-doc-count"))),
    )
    return json.dumps(doc, indent=2).encode()


def _azure() -> bytes:
    extra = azure(2).replace(b"\r\n", b"," + secret("az-extra").encode() + b"\r\n")
    text_count = azure(3, prompt=secret("az-count"))
    return AZURE_HEADER + azure(0) + azure(1) + extra + text_count


def _burstgpt() -> bytes:
    header = BURST_V1_HEADER.replace(b"Log Type", b"Log Type,Prompt")

    def row(i: int) -> bytes:
        return burst_v1(i).replace(b"\n", b"," + secret("bg-column").encode() + b"\n")

    bad = burst_v1(3).replace(b"ChatGPT", secret("bg-model-bad").encode() + b",x")
    return header + row(0) + row(1) + bad


def test_no_planted_text_in_the_warehouse(tmp_path: Path) -> None:
    PLANTED.clear()
    src = tmp_path / "logs"
    src.mkdir()
    files = {
        "gateway.jsonl": _gateway(),
        "mooncake.jsonl": _mooncake(),
        "bailian.jsonl": _bailian(),
        "token_ids.jsonl": _token_ids(),
        "otel.jsonl": _otel(),
        "otel_doc.json": _otel_document(),
        "azure.csv": _azure(),
        "burstgpt.csv": _burstgpt(),
    }
    for name, data in files.items():
        (src / name).write_bytes(data)
        assert any(s.encode() in data for s in PLANTED)
    wh = Warehouse(tmp_path / "wh")
    res = ingest_logs([str(src)], wh, IngestOptions(quiet=True))
    by_name = {Path(f.path).name: f for f in res.files}
    for name in files:
        f = by_name[name]
        assert f.error is None, f.error
        # not vacuous: every file lands records and quarantines the bad ones
        assert f.rows_kept > 0 and f.rows_quarantined > 0, (name, f)

    scanned = 0
    for path in sorted((tmp_path / "wh").rglob("*")):
        if not path.is_file():
            continue
        raw = path.read_bytes()  # Parquet footers (schema, key-value metadata) are plain
        texts = [raw]
        if path.suffix == ".parquet":
            table = pq.read_table(path)  # every value, decompressed
            texts.append(json.dumps(table.to_pylist(), default=str).encode())
            texts.append(str(pq.read_metadata(path).metadata).encode())
            scanned += table.num_rows
        for s in PLANTED:
            for blob in texts:
                assert s.encode() not in blob, (s, path)
        # nor the marker alone (a cut or partly quoted value)
        assert b"SECRET-" not in raw and all(b"SECRET-" not in t for t in texts), path
    assert scanned > 0
    assert len(PLANTED) > 30
