"""Request selection: --model, --tenant, --where, --from/--to with a time of day, and
--requests with any Parquet that has the requests columns (the tiny warehouse of
tests/report/conftest.py: r1..r4 on 2024-05-01 at 0, 1, 2, 3 s; r5 a day later)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.contracts import REQUESTS
from pipeline.errors import ConfigError
from pipeline.selection import RequestFilter, check_request_columns
from pipeline.sim.replay_input import read_requests
from pipeline.warehouse import Warehouse
from tests.helpers import build


@pytest.fixture(scope="module")
def wh(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    return build(tmp_path_factory.mktemp("sel") / "wh")


def _ids(wh: Warehouse, sel: RequestFilter) -> list[str]:
    return read_requests(wh.files(REQUESTS), sel)["request_id"].to_list()


def test_models_tenants_predicates_and_time_windows(wh: Warehouse) -> None:
    from datetime import UTC, datetime

    assert _ids(wh, RequestFilter(models=("m-a",))) == ["r1", "r2"]
    assert _ids(wh, RequestFilter(models=("m-a", "m-b"), tenants=("t1",))) == ["r1", "r3"]
    assert _ids(wh, RequestFilter(where="prompt_tokens >= 400 AND output_tokens < 5")) == ["r4"]
    t = datetime(2024, 5, 1, 0, 0, 1, tzinfo=UTC)
    window = RequestFilter(start=t, end=t.replace(second=3))
    frame = read_requests(wh.files(REQUESTS), window)
    assert frame["request_id"].to_list() == ["r2", "r3"]
    assert frame["arrival_s"].to_list() == [0.0, 1.0]  # counted from the first selected


def test_bad_predicate_and_nothing_left_are_one_line(wh: Warehouse) -> None:
    with pytest.raises(ConfigError, match=r"--where 'colour = 1': .*may use: request_id, "):
        _ids(wh, RequestFilter(where="colour = 1"))
    with pytest.raises(ConfigError, match=r"no request matches model in \(gpt\); .*models: "
                       r"m-a, m-b; tenants: t1, t2; arrivals from 2024-05-01"):  # fmt: skip
        _ids(wh, RequestFilter(models=("gpt",)))


def _replay(wh: Warehouse, *args: str) -> tuple[int, str]:
    r = CliRunner().invoke(
        cli, ["replay", "--warehouse", str(wh.root), "--policy", "vllm", "--json", *args]
    )
    return r.exit_code, r.stdout if r.exit_code == 0 else r.output


def _served(out: str) -> int:
    (scenario,) = json.loads(out)["scenarios"].values()
    return int(scenario["summary"]["num_requests"])


def test_replay_flags(wh: Warehouse) -> None:
    code, out = _replay(wh, "--model", "m-a", "--tenant", "t2")
    assert code == 0, out
    assert _served(out) == 1
    code, out = _replay(wh, "--from", "2024-05-01T00:00:02", "--to", "2024-05-01T00:00:04")
    assert code == 0, out
    assert _served(out) == 2  # r3, r4
    code, out = _replay(wh, "--from", "2024-05-01T00:00:03", "--to", "2024-05-01T00:00:01")
    assert code == 1 and "is not before --to" in out
    code, out = _replay(wh, "--from", "2024-06-01")
    assert code == 1 and "it holds days 2024-05-01, 2024-05-02" in out
    code, out = _replay(wh, "--from", "1 May")
    assert code == 2 and "write 2024-05-01 or 2024-05-01T18:00" in out


def test_a_sql_export_replays_and_a_foreign_file_is_checked(wh: Warehouse, tmp_path: Path) -> None:
    out = tmp_path / "m-a.parquet"
    sql = "SELECT * FROM requests WHERE model = 'm-a'"
    args = ["sql", "--warehouse", str(wh.root), "--format", "parquet", "-o", str(out), sql]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    check_request_columns(out)
    code, text = _replay(wh, "--requests", str(out))
    assert code == 0, text
    assert _served(text) == 2
    bad = tmp_path / "bad.parquet"
    pq.write_table(pq.read_table(out).drop_columns(["prompt_tokens"]), bad)
    code, text = _replay(wh, "--requests", str(bad))
    assert code == 1 and f"{bad}: column 'prompt_tokens' is missing" in text
    worse = tmp_path / "worse.parquet"
    table = pq.read_table(out)
    i = table.schema.get_field_index("output_tokens")
    pq.write_table(table.set_column(i, "output_tokens", table.column(i).cast("string")), worse)
    with pytest.raises(ConfigError, match="column 'output_tokens' has type string, expected int32"):
        check_request_columns(worse)


def test_sweep_and_capacity_take_the_selection(wh: Warehouse, tmp_path: Path) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text('[base]\npolicy = "vllm"\n[axes]\nmax_num_seqs = [4, 8]\n')
    r = CliRunner().invoke(cli, ["sweep", str(grid), "--warehouse", str(wh.root), "--jobs", "1",
                                 "--tenant", "t1", "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["num_requests_read"] == 2  # r1, r3
    assert {s["summary"]["num_requests"] for s in out["scenarios"].values()} == {2}
    r = CliRunner().invoke(cli, ["capacity", "--warehouse", str(wh.root), "--slo",
                                 "ttft_p99=60s", "--search", "concurrency", "--max-concurrency",
                                 "2", "--model", "m-a", "--summary-only", "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["num_requests_read"] == 2  # r1, r2
