"""File-level failures through the command line: one line each, exit 1, the rest lands."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import zstandard
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.ingest.formats import FORMATS
from pipeline.warehouse import Warehouse
from tests.ingest.records import gateway, lines, mooncake

BODY = lines([gateway(i) for i in range(3000)])


def _run(*args: str) -> tuple[int, list[str], list[str]]:
    r = CliRunner().invoke(cli, ["ingest", *args])
    out = r.output.splitlines()
    return r.exit_code, [ln for ln in out if ln.startswith("error:")], out


@pytest.mark.parametrize("forced", [None, "gateway"])
def test_truncated_zstd_is_one_line_and_exit_1(tmp_path: Path, forced: str | None) -> None:
    half = tmp_path / "half.jsonl.zst"
    z = zstandard.ZstdCompressor().compress(BODY)
    half.write_bytes(z[: len(z) // 2])
    good = tmp_path / "good.jsonl.gz"
    good.write_bytes(gzip.compress(lines([gateway(i) for i in range(10_000, 10_020)])))
    wh = tmp_path / "wh"
    args = [str(half), str(good), "--warehouse", str(wh)]
    code, errors, _ = _run(*args, *(["--log-format", forced] if forced else []))
    assert code == 1
    assert errors == [
        f"error: {half}: zstd data is truncated (the file was cut short); re-copy or "
        "re-export it, nothing from it was kept"
    ]
    con = Warehouse(wh).connect()
    assert con.execute("SELECT count(*) FROM requests").fetchall() == [(20,)]
    assert con.execute("SELECT status, rows_kept FROM runs").fetchall() == [("partial", 20)]


def test_unexpected_error_is_one_line_and_the_rest_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in one format's reader fails that file only, in one line; runs is written."""
    moon = FORMATS["mooncake"]

    def broken(block: object, opts: object) -> object:
        raise KeyError("a bug")

    monkeypatch.setattr(moon, "parse", broken)
    (tmp_path / "m.jsonl").write_bytes(lines([mooncake(i) for i in range(5)]))
    (tmp_path / "g.jsonl").write_bytes(lines([gateway(i) for i in range(7)]))
    wh = tmp_path / "wh"
    code, errors, out = _run(
        str(tmp_path / "m.jsonl"), str(tmp_path / "g.jsonl"), "--warehouse", str(wh)
    )
    assert code == 1
    assert len(errors) == 1
    assert "m.jsonl: unexpected error while reading it (KeyError at" in errors[0]
    assert "a bug" not in errors[0]  # messages may quote log content: never shown or stored
    assert any("g.jsonl [gateway]: read 7 = kept 7" in ln for ln in out)
    con = Warehouse(wh).connect()
    assert con.execute("SELECT count(*) FROM requests").fetchall() == [(7,)]
    assert con.execute("SELECT status, rows_read FROM runs").fetchall() == [("partial", 7)]
    assert not [p for p in wh.rglob("*") if ".tmp-" in p.name]


def test_empty_file_is_not_an_error(tmp_path: Path) -> None:
    (tmp_path / "e.jsonl").write_bytes(b"")
    code, errors, out = _run(str(tmp_path / "e.jsonl"), "--warehouse", str(tmp_path / "wh"))
    assert (code, errors) == (0, [])
    assert any(
        ln.endswith("e.jsonl [empty]: read 0 = kept 0 + quarantined 0 + duplicates 0") for ln in out
    )
