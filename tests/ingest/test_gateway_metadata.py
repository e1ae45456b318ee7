"""Gateway cached tokens nested in ``metadata``: polars' JSON path and the Python fallback agree."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from pipeline.contracts import REQUESTS
from pipeline.ingest import IngestOptions, ingest_logs
from pipeline.ingest.fields import to_number
from pipeline.ingest.formats.gateway import _dig, _nested_cached
from pipeline.warehouse import Warehouse
from tests.ingest.records import gateway, jline

VALUES = [5, "7", 7.0, 7.5, True, None, [1], {"x": 1}, "abc", 10**20]


def _meta(value: object) -> dict[str, object]:
    return {"usage_object": {"prompt_tokens_details": {"cached_tokens": value}}, "note": "n"}


def test_json_path_and_fallback_agree() -> None:
    texts = [json.dumps(_meta(v)) for v in VALUES] + [None, '"a string"', "[1, 2]", "{}"]
    fast = _nested_cached(pl.Series("metadata", texts, dtype=pl.String))
    slow = pl.Series("metadata", [_dig(t) for t in texts], dtype=pl.String)
    # booleans, lists and objects are text on one path and null on the other: no number
    assert to_number(fast).to_list() == to_number(slow).to_list()
    assert slow.to_list()[:4] == ["5", "7", "7.0", "7.5"]


def test_cached_tokens_from_metadata_land(tmp_path: Path) -> None:
    log = tmp_path / "gw.jsonl"
    log.write_bytes(
        b"".join(
            jline(gateway(i, prompt_tokens=100, metadata=_meta(v)))
            for i, v in enumerate([5, "7", 7.0, 7.5, None])
        )
    )
    wh = Warehouse(tmp_path / "wh")
    res = ingest_logs([str(log)], wh, IngestOptions(quiet=True))
    assert (res.total("rows_kept"), res.total("rows_quarantined")) == (5, 0)
    rows = sorted(
        (r for p in wh.files(REQUESTS) for r in pq.read_table(p).to_pylist()),
        key=lambda r: r["source_line"],
    )
    # 7.5 is not a whole number: no cached count (the record still lands)
    assert [r["cached_tokens"] for r in rows] == [5, 7, 7, None, None]
