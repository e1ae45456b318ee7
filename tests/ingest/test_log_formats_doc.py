"""docs/log_formats.md stays true: its minimal records ingest to the columns it names, and
the timestamp layouts it lists parse to the same instant."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.contracts import QUARANTINE, REQUESTS
from pipeline.ingest import IngestOptions, ingest_logs
from pipeline.warehouse import Warehouse
from tests.ingest import offline_tokenizer

DOC = Path(__file__).resolve().parents[2] / "docs" / "log_formats.md"


def _records() -> list[str]:
    return re.findall(r"```json\n(.*?)\n```", DOC.read_text(), re.S)


def _ingest(tmp_path: Path, name: str, text: str, fmt: str) -> tuple[list[dict], list[dict]]:
    src = tmp_path / name
    src.write_text(text + "\n")
    wh = Warehouse(tmp_path / "wh")
    ingest_logs([str(src)], wh, IngestOptions(quiet=True, format=fmt))
    rows = [r for p in wh.files(REQUESTS) for r in pq.read_table(p).to_pylist()]
    rejects = [r for p in wh.files(QUARANTINE) for r in pq.read_table(p).to_pylist()]
    return rows, rejects


def test_the_minimal_gateway_record(tmp_path: Path) -> None:
    gateway, _, _ = _records()
    (row,), _ = _ingest(tmp_path, "gw.jsonl", gateway, "gateway")
    assert row["request_id"] == "req-1" and row["model"] == "llama-3-8b"
    assert row["tenant"] == "chat" and row["cached_tokens"] == 512
    assert (row["prompt_tokens"], row["output_tokens"]) == (1200, 150)
    assert row["arrival_time"] == datetime(2024, 5, 1, 18, 20, tzinfo=UTC)
    assert row["observed_ttft_s"] == pytest.approx(0.18)
    assert row["observed_e2e_s"] == pytest.approx(2.5)


def test_the_minimal_otel_document(tmp_path: Path) -> None:
    _, otel, _ = _records()
    (row,), _ = _ingest(tmp_path, "spans.json", otel, "otel")
    assert row["request_id"] == "5b8efff798038103d269b633813fc60c-eee19b7ec3c1b174"
    assert row["model"] == "llama-3-8b" and row["cached_tokens"] == 512
    assert (row["prompt_tokens"], row["output_tokens"]) == (1200, 150)
    assert row["arrival_time"] == datetime(2024, 5, 1, 18, 20, tzinfo=UTC)
    assert row["observed_ttft_s"] == pytest.approx(0.18)
    assert row["observed_e2e_s"] == pytest.approx(2.5)


def test_the_gateway_record_with_a_prompt_is_hashed_and_dropped(tmp_path: Path) -> None:
    _, _, with_prompt = _records()
    tok = offline_tokenizer.build(tmp_path / "tok")
    src = tmp_path / "gw.jsonl"
    src.write_text(with_prompt + "\n")
    wh = Warehouse(tmp_path / "wh")
    ingest_logs([str(src)], wh, IngestOptions(quiet=True, tokenizer=tok))
    (row,) = [r for p in wh.files(REQUESTS) for r in pq.read_table(p).to_pylist()]
    assert row["prompt_tokens"] == 40 and row["block_size"] == 16
    assert len(row["prefix_hashes"]) == 1  # 18 tokens with this small vocabulary: one block
    assert "capital" not in json.dumps(row, default=str)


def test_listed_timestamps_and_failed_calls(tmp_path: Path) -> None:
    stamps = [
        "2024-05-01T18:20:00Z",
        "2024-05-01 18:20:00.000000+00:00",
        "2024-05-01T20:20:00+02:00",
        "2024-05-01T20:20:00+0200",
        "2024-05-01 18:20:00",
    ]
    lines = [json.dumps({"request_id": f"t{i}", "startTime": t, "prompt_tokens": 10,
                         "completion_tokens": 2}) for i, t in enumerate(stamps)]  # fmt: skip
    lines.append(json.dumps({"request_id": "f", "startTime": stamps[0], "prompt_tokens": 1,
                             "completion_tokens": 0, "status": "failure"}))  # fmt: skip
    lines.append(json.dumps({"request_id": "n", "startTime": stamps[0], "prompt_tokens": 1,
                             "completion_tokens": 1, "model_group": "g", "user": "u"}))  # fmt: skip
    rows, rejects = _ingest(tmp_path, "ts.jsonl", "\n".join(lines), "gateway")
    by_id = {r["request_id"]: r for r in rows}
    assert {by_id[f"t{i}"]["arrival_time"] for i in range(len(stamps))} == {
        datetime(2024, 5, 1, 18, 20, tzinfo=UTC)
    }
    assert by_id["n"]["model"] == "g" and by_id["n"]["tenant"] == "u"  # no status: a success
    (reject,) = rejects
    assert reject["reason"] == "status failure (a failed call never ran)"
