"""--tenant and --model: one tenant's log mixed with another's in one warehouse."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.contracts import REQUESTS, read_table
from pipeline.warehouse import Warehouse

TRACES = Path(__file__).resolve().parents[2] / "traces"


def _tenants(root: Path) -> dict[str | None, int]:
    out: dict[str | None, int] = {}
    for f in Warehouse(root).files(REQUESTS):
        for t in read_table(f, REQUESTS).column("tenant").to_pylist():
            out[t] = out.get(t, 0) + 1
    return out


def test_each_log_lands_with_its_tenant(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    run = CliRunner().invoke
    a = run(
        cli,
        [
            "ingest",
            str(TRACES / "azure_conv.csv"),
            "--tenant",
            "chat",
            "--warehouse",
            str(wh),
            "-q",
        ],
    )
    b = run(
        cli,
        [
            "ingest",
            str(TRACES / "burstgpt_v1.csv"),
            "--tenant",
            "batch",
            "--model",
            "m",
            "--warehouse",
            str(wh),
            "-q",
        ],
    )
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    got = _tenants(wh)
    assert set(got) == {"chat", "batch"} and got["chat"] == 600


def test_a_record_that_names_its_tenant_keeps_it(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    gateway = TRACES / "gateway.jsonl.gz"
    plain = CliRunner().invoke(
        cli, ["ingest", str(gateway), "--warehouse", str(tmp_path / "w0"), "-q"]
    )
    assert plain.exit_code == 0, plain.output
    before = _tenants(tmp_path / "w0")
    res = CliRunner().invoke(
        cli, ["ingest", str(gateway), "--tenant", "zz", "--warehouse", str(wh), "-q"]
    )
    assert res.exit_code == 0, res.output
    after = _tenants(wh)
    named = {t: n for t, n in before.items() if t is not None}
    assert {t: after[t] for t in named} == named  # named tenants untouched
    assert after.get("zz", 0) == before.get(None, 0)


@pytest.mark.parametrize("bad", ["", "  ", "a\nb", "x" * 300])
def test_a_bad_label_is_refused_in_one_line(tmp_path: Path, bad: str) -> None:
    res = CliRunner().invoke(
        cli,
        ["ingest", str(TRACES / "azure_conv.csv"), "--tenant", bad, "--warehouse", str(tmp_path)],
    )
    assert res.exit_code != 0
    assert "--tenant" in res.output and "printable" in res.output
    assert not list(Warehouse(tmp_path).files(REQUESTS))
