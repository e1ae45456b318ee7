"""``tracereplay nightly``: new files only, drift flagged with its exit code, retention."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.nightly import EXIT_DRIFT, EXIT_FAILED, EXIT_OK, load_nightly_config, nights
from pipeline.warehouse import Warehouse
from tests.gateway_logs import gateway_lines

CONFIG = """
[nightly]
warehouse = "wh"
inbox = ["inbox/*.jsonl"]
keep_nights = 2

[[scenario]]
name = "prod"
policy = "vllm"
max_num_seqs = 32

[slo]
ttft_p99 = "500ms"

[capacity]
[capacity.search.concurrency]
max = 16

[drift]
traffic = 0.25
"""


def night(tmp_path: Path) -> tuple[int, dict]:
    r = CliRunner().invoke(cli, ["nightly", str(tmp_path / "nightly.toml"), "--json"])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.output
    return r.exit_code, json.loads(r.output)


def count(wh: Path, sql: str) -> int:
    row = Warehouse(wh).connect().execute(sql).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def setup(tmp_path: Path) -> Path:
    (tmp_path / "nightly.toml").write_text(CONFIG)
    (tmp_path / "inbox").mkdir()
    (tmp_path / "inbox" / "day0.jsonl").write_text(gateway_lines(range(300), day=0, spacing_s=2))
    return tmp_path


def test_two_nights_then_an_unchanged_inbox(setup: Path) -> None:
    wh = setup / "wh"
    code, first = night(setup)
    assert code == EXIT_OK, first
    assert first["status"] == "ok" and first["days"] == ["2024-05-01"]
    assert first["figures"]["traffic.requests_per_day"] == 300
    assert first["previous_night"] is None and first["drifts"] == []
    # the report judges by the config's [slo]: its TTFT objective is 500 ms, not 200 ms
    page = Path(first["report"]).read_text()
    assert '<dt>SLOs</dt><dd id="slos">ttft_p99 &lt;= 500ms' in page
    assert first["capacity"]["concurrency"]["answer"] is not None
    # simulated against observed: the logs' TTFTs are 0.05 + ((31 i) mod 100) / 400 s
    observed = float(np.percentile([0.05 + (i * 31 % 100) / 400 for i in range(300)], 99))
    sim = first["scenarios"]["prod"]["ttft_p99_s"]
    assert first["figures"]["sim_vs_observed.ttft.prod"] == pytest.approx(sim / observed, 1e-3)

    # the second night: a new day with twice the traffic
    (setup / "inbox" / "day1.jsonl").write_text(
        gateway_lines(range(1000, 1600), day=1, spacing_s=1)
    )
    code, second = night(setup)
    assert code == EXIT_DRIFT, second
    assert second["status"] == "drift"
    assert second["previous_night"] == first["night_id"]
    assert [f["path"] for f in second["inbox"]["new_or_changed"]] == [
        str((setup / "inbox" / "day1.jsonl").resolve())
    ]
    traffic = next(c for c in second["changes"] if c["name"] == "traffic.requests_per_day")
    assert (traffic["previous"], traffic["current"], traffic["relative"]) == (300, 600, 1.0)
    assert traffic["drift"]
    assert any(
        d.startswith("traffic.requests_per_day: 300 -> 600 (+100.0%") for d in second["drifts"]
    )
    ingest_runs = count(wh, "SELECT count(*) FROM runs WHERE command = 'ingest'")
    rows = count(wh, "SELECT count(*) FROM requests")
    assert rows == 900

    # the third night: nothing new, nothing re-ingested, nothing replayed
    code, third = night(setup)
    assert code == EXIT_OK, third
    assert third["status"] == "nothing new"
    assert third["inbox"] == {"matched": 2, "skipped_unchanged": 2, "new_or_changed": []}
    assert "ingest" not in third and "replay_run_id" not in third
    assert count(wh, "SELECT count(*) FROM runs WHERE command = 'ingest'") == ingest_runs
    assert count(wh, "SELECT count(*) FROM requests") == rows

    # retention keeps two nights, and their runs; the first night is gone whole
    kept = [p.parent.name for p in nights(wh)]
    assert kept == [second["night_id"], third["night_id"]]
    gone = (first["replay_run_id"], first["capacity_run_id"])
    for run_id in gone:
        assert not (wh / "runs" / f"{run_id}.parquet").exists()
        assert not list(wh.glob(f"*/run_id={run_id}"))
    assert count(wh, f"SELECT count(*) FROM scenarios WHERE run_id IN {gone}") == 0
    assert count(wh, f"SELECT count(*) FROM scenarios WHERE run_id = '{second['replay_run_id']}'")

    # a changed file is ingested again (and replaces what it wrote)
    (setup / "inbox" / "day0.jsonl").write_text(
        gateway_lines(range(300), day=0, spacing_s=2, seed=1)
    )
    code, fourth = night(setup)
    assert [f["path"] for f in fourth["inbox"]["new_or_changed"]] == [
        str((setup / "inbox" / "day0.jsonl").resolve())
    ]
    assert fourth["days"] == ["2024-05-01"]
    assert count(wh, "SELECT count(*) FROM requests") == 900
    # the drift baseline is the last night that measured something (the second)
    assert fourth["previous_night"] == second["night_id"]
    assert code == EXIT_DRIFT  # 300 a day against 600


def test_a_file_that_fails_to_ingest_exits_1_and_is_tried_again(setup: Path) -> None:
    (setup / "inbox" / "bad.jsonl").write_bytes(b"\xff\xfe" + "not a log\n".encode("utf-16-le"))
    code, m = night(setup)
    assert code == EXIT_FAILED, m
    assert m["status"] == "failed" and m["errors"]
    assert m["days"] == ["2024-05-01"]  # the good file still landed and was replayed
    code, again = night(setup)
    assert [Path(f["path"]).name for f in again["inbox"]["new_or_changed"]] == ["bad.jsonl"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[nightly]\ninbox = []\n", "nightly.inbox must list the log globs"),
        ('[nightly]\ninbox = ["x"]\n', "at least one production scenario"),
        ('[nightly]\ninbox = ["x"]\n[[scenario]]\npolicy = "vlm"\n', "vlm"),
        ('[nightly]\ninbox = ["x"]\n[[scenario]]\npolicy = "vllm"\n[drift]\ntraffik = 1\n',
         "unknown key 'traffik'"),
        ('[nightly]\ninbox = ["x"]\n[[scenario]]\npolicy = "vllm"\n[capacity]\n',
         "[capacity] needs the SLOs"),
        ('[nightly]\ninbox = ["x"]\nkeep_nights = 0\n[[scenario]]\npolicy = "vllm"\n',
         "keep_nights"),
    ],
)  # fmt: skip
def test_bad_config_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    cfg = tmp_path / "nightly.toml"
    cfg.write_text(text)
    r = CliRunner().invoke(cli, ["nightly", str(cfg)])
    assert r.exit_code == 1
    assert message in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_example_config_loads() -> None:
    example = Path(__file__).resolve().parents[1] / "examples" / "nightly.toml"
    cfg = load_nightly_config(example)
    assert cfg.scenarios and cfg.slos and cfg.capacity_base is not None
