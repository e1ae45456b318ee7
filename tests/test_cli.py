"""The command line: help everywhere, the main job on the bundled sample."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import COMMANDS, cli

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help_with_an_example(name: str) -> None:
    r = CliRunner().invoke(cli, [name, "--help"])
    assert r.exit_code == 0, r.output
    assert "Example:" in r.output


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_is_in_the_readme(name: str) -> None:
    assert f"tracereplay {name}" in README.read_text()


def test_run_on_bundled_sample(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    r = CliRunner().invoke(cli, ["run", "--warehouse", str(wh), "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    ingest = summary["ingest"]
    assert ingest["rows_kept"] > 0
    assert ingest["rows_read"] == (
        ingest["rows_kept"] + ingest["rows_quarantined"] + ingest["rows_duplicate"]
    )


def test_warehouse_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "a.csv"
    log.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01 00:00:00.0000000,5,6\n")
    monkeypatch.setenv("TRACEREPLAY_WAREHOUSE", str(tmp_path / "envwh"))
    r = CliRunner().invoke(cli, ["ingest", str(log), "--quiet"])
    assert r.exit_code == 0, r.output
    assert list((tmp_path / "envwh" / "requests").glob("date=2024-01-01/*.parquet"))


def test_config_file_unknown_key_is_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[ingest]\nblok_size = 16\n")
    r = CliRunner().invoke(cli, ["ingest", "x", "--config", str(cfg)])
    assert r.exit_code == 1
    assert "unknown key ingest.blok_size" in r.output and "block_size" in r.output
