"""No SQL from a filter reaches the machine: ``--where`` is one checked predicate, run in
the sandbox.

Every injection attempt must be refused in one line that names ``--where`` before
anything runs, and no file may appear or change: the working directory is a scratch
directory, and the warehouse, the scratch directory and the system temporary
directory are compared before and after (the tiny warehouse of
tests/report/conftest.py: r1..r4 on 2024-05-01 at 0, 1, 2, 3 s; r5 a day later).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from pipeline import sandbox
from pipeline.cli import cli
from pipeline.contracts import REQUESTS
from pipeline.errors import PredicateError
from pipeline.predicate import FUNCTIONS, MAX_DEPTH, MAX_LENGTH, check_predicate, statement
from pipeline.selection import RequestFilter
from pipeline.sim.replay_input import read_requests
from pipeline.warehouse import Warehouse
from tests.helpers import build
from tests.untouched import snapshot, tmp_entries

# Each must be refused by the checker. {tmp}: the system temporary directory.
INJECTIONS = [
    # statement breaks: the red team's case, and its kin
    "true); COPY (SELECT 42 AS pwned) TO 'pwned.csv'; SELECT * FROM "
    "read_parquet('warehouse/requests/*/*.parquet') WHERE (true",
    "true; COPY (SELECT 42 AS pwned) TO 'pwned.csv'",
    "true;",
    "model = 'a'; DROP VIEW requests",
    "true) OR (true",
    "true) UNION ALL (SELECT * FROM read_csv('/etc/passwd')",
    "model = 'a\\'; COPY (SELECT 1) TO 'x.csv'; --'",
    "true \uff1b COPY (SELECT 1) TO 'x.csv'",  # a fullwidth semicolon
    "COPY (SELECT 1) TO 'x.csv'",
    "COPY requests TO '{tmp}/x.csv'",
    # comments
    "true -- AND model = 'a'",
    "true /* AND model = 'a' */",
    "/**/true",
    "true /* unterminated",
    "true /* /* nested */ */",
    "true --\n; COPY (SELECT 1) TO 'x.csv'",
    # table functions and subqueries
    "model IN (SELECT column0 FROM read_csv('/etc/passwd', header = false))",
    "(SELECT count(*) FROM read_csv('/etc/passwd', sep = ':')) > 0",
    "EXISTS (FROM read_text('/etc/hostname'))",
    "EXISTS (SELECT * FROM read_blob('/etc/passwd'))",
    "model IN (SELECT file FROM glob('/*'))",
    "1 IN (FROM glob('*'))",
    "model IN (FROM query('SELECT 1'))",
    "EXISTS (FROM query_table('requests'))",
    "(SELECT value FROM duckdb_settings() WHERE name = 'home_directory') <> ''",
    "EXISTS (SELECT 1)",
    "model = ANY (SELECT 'a')",
    "prompt_tokens >= ALL (SELECT 1)",
    "CAST((SELECT 1) AS INT) = 1",
    "model IN (WITH t AS (SELECT 'a') SELECT * FROM t)",
    "model = (SELECT model FROM read_parquet('{tmp}/*.parquet') LIMIT 1)",
    # table functions called as scalars, and functions that read the machine
    "read_csv('/etc/passwd') IS NOT NULL",
    "read_text('/etc/passwd') IS NOT NULL",
    "glob('*') IS NOT NULL",
    "len(glob('/*')) > 0",
    "getenv('HOME') = ''",
    "GETENV('HOME') IS NOT NULL",
    "\"getenv\"('HOME') IS NOT NULL",
    "model = 'x' OR getenv('HOME') IS NOT NULL",
    "md5(getenv('HOME')) = ''",
    "current_setting('home_directory') <> ''",
    "getvariable('x') IS NULL",
    "version() <> ''",
    "parquet_metadata('x.parquet') IS NULL",
    "sniff_csv('/etc/passwd') IS NULL",
    "list_transform(prefix_hashes, x -> getenv('HOME')) IS NULL",
    "list_filter(prefix_hashes, x -> x > 0) = []",
    "system.main.getenv('HOME') = ''",
    "main.lower(model) = 'm-a'",
    "\uff47etenv('HOME') = ''",  # a fullwidth g
    # statements behind a statement break
    "true; ATTACH 'x.duckdb' AS x",
    "ATTACH 'x.duckdb' AS x",
    "true; INSTALL httpfs",
    "true; LOAD httpfs",
    "true; PRAGMA enable_profiling",
    "PRAGMA version",
    "true; SET enable_external_access = true",
    "true; SET VARIABLE x = 1",
    "true; RESET lock_configuration",
    "true; CREATE MACRO m() AS 1",
    "true; EXPORT DATABASE 'exported'",
    # more than a predicate
    "true ORDER BY 1",
    "true LIMIT 1",
    "true OFFSET 0",
    "true UNION SELECT * FROM requests",
    "true GROUP BY ALL",
    "true HAVING true",
    "true QUALIFY true",
    "true WINDOW w AS (ORDER BY (SELECT 1))",
    "true USING SAMPLE 10%",
    # aggregates, windows, stars, parameters, qualified names, unknown columns
    "count(*) > 0",
    "max(prompt_tokens) OVER () > 0",
    "COLUMNS(*) IS NOT NULL",
    "COLUMNS('.*_tokens') > 0",
    "prompt_tokens > ?",
    "prompt_tokens > $1",
    "prompt_tokens > $limit",
    "#1 = 'r1'",
    "requests.model = 'm-a'",
    "colour = 1",
    "lower(model ORDER BY tenant) = 'm-a'",
    # quote and unicode tricks
    "model = 'a\x00'; COPY (SELECT 1) TO 'x.csv'",
    "model = 'a'\u2028; COPY (SELECT 1) TO 'x.csv'",
    "model = $$a$$; COPY (SELECT 1) TO 'x.csv'",
    "model = $t$a$t$ OR (SELECT 1) = 1",
    "model = U&'\\0061'",
    # Unicode spaces DuckDB's parser reads as blanks and its tokenizer does not: a clause
    # hidden behind one would pass a check of the tokens
    "true\xa0WINDOW w AS (ORDER BY (SELECT 1))",
    "true\u3000LIMIT 1",
    "model = 'a'\u200b OR getenv('HOME') IS NOT NULL",
    "true\ufeff",
    "true\ud800",
    "model = 'unterminated",
    # too long, too deep
    " OR ".join(f"prompt_tokens = {i}" for i in range(1000)),
    "(" * (MAX_DEPTH + 1) + "true" + ")" * (MAX_DEPTH + 1),
    "lower(" * (MAX_DEPTH + 1) + "model" + ")" * (MAX_DEPTH + 1) + " = 'm-a'",
    " + ".join(["prompt_tokens"] * (MAX_DEPTH + 2)) + " > 0",
    "(" * 100_000 + "true" + ")" * 100_000,
]

# A string literal is a value, whatever it spells: these run, match nothing, write nothing.
QUOTED_VALUES = [
    "model = 'x''; COPY (SELECT 1) TO ''x.csv''; --'",
    "model = '); COPY (SELECT 1) TO ''x.csv''; SELECT ('",
    "model = $$; COPY (SELECT 1) TO 'x.csv'; $$",
    "model = '/* ; */ -- read_csv(''/etc/passwd'')'",
    "model = \"model\" || ' ORDER BY 1; ATTACH ''x.duckdb'''",
]

# Predicates that must keep working, with the requests they keep.
LEGIT = [
    ("prompt_tokens > 100 AND model = 'm-a'", ["r2"]),
    ("prompt_tokens >= 400 AND output_tokens < 5", ["r4"]),
    ("arrival_s BETWEEN 0 AND 1", ["r1", "r2"]),
    ("arrival_s NOT BETWEEN 0 AND 2", ["r4", "r5"]),
    ("lower(model) LIKE '%m-%' OR upper(tenant) ILIKE 't2'", ["r1", "r2", "r3"]),
    ("model LIKE 'M-%' OR model ILIKE 'M-B'", ["r3"]),
    ("coalesce(tenant, 'none') = 'none'", ["r4", "r5"]),
    ("ifnull(model, '') = '' AND nullif(tenant, 't1') IS NULL", ["r4", "r5"]),
    ("tenant IN ('t1', 't2') AND model NOT IN ('m-b')", ["r1", "r2"]),
    ("CAST(prompt_tokens AS DOUBLE) / output_tokens >= 80", ["r3", "r4"]),
    ("prompt_tokens::BIGINT > 300 AND TRY_CAST(model AS INTEGER) IS NULL", ["r3", "r4"]),
    ("date_trunc('day', arrival_time) = TIMESTAMP '2024-05-02'", ["r5"]),
    ("EXTRACT(day FROM arrival_time) = 1 AND second(arrival_time) >= 2", ["r3", "r4"]),
    ("strftime(arrival_time, '%Y-%m-%d') = '2024-05-02'", ["r5"]),
    ("arrival_time >= DATE '2024-05-01' + INTERVAL 1 DAY", ["r5"]),
    ("arrival_time < now() AND arrival_time < current_date", ["r1", "r2", "r3", "r4", "r5"]),
    ("len(prefix_hashes) = 0", ["r3", "r4", "r5"]),
    ("list_contains(prefix_hashes, 2) AND prefix_hashes[1] = 1", ["r1", "r2"]),
    ("CASE WHEN tenant IS NULL THEN source_format = 'azure' ELSE false END", ["r4", "r5"]),
    ("starts_with(request_id, 'r') AND regexp_matches(request_id, '^r[45]$')", ["r4", "r5"]),
    ("abs(prompt_tokens - 400) < 1 OR greatest(prompt_tokens, 0) = 50", ["r3", "r5"]),
    ("NOT (model IS NOT NULL) AND source_file = 'b.csv'", ["r4", "r5"]),
    ('"prompt_tokens" = 200 OR PROMPT_TOKENS = 800', ["r2", "r4"]),
    (" OR ".join(f"tenant = 'team-{i}'" for i in range(200)) + " OR tenant = 't2'", ["r2"]),
]


# what an attempt could write in the temporary directory
ATTEMPT_TMP_NAMES = {
    "pwned.csv",
    "x.csv",
    "x.parquet",
    "x.duckdb",
    "exported",
}


def _tmp_ours() -> set[str]:
    return tmp_entries(ATTEMPT_TMP_NAMES)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    return build(tmp_path_factory.mktemp("pred") / "wh")


@pytest.fixture
def scratch(tiny: Warehouse, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(warehouse copy, working directory)."""
    wh = tmp_path / "wh"
    shutil.copytree(tiny.root, wh)
    Warehouse(wh).init()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return wh, cwd


def _one_line_refusal(message: str) -> None:
    assert len(message.strip().splitlines()) == 1, message
    assert message.startswith("--where "), message
    assert "root:" not in message and "/bin/" not in message, message  # no file contents


@pytest.mark.parametrize("attempt", INJECTIONS)
def test_injection_is_refused_and_nothing_runs(
    scratch: tuple[Path, Path], tmp_path: Path, attempt: str
) -> None:
    text = attempt.format(tmp=tempfile.gettempdir())
    before, tmp_before = snapshot(tmp_path), _tmp_ours()
    with pytest.raises(PredicateError) as refused:
        check_predicate(text)
    _one_line_refusal(str(refused.value))
    with pytest.raises(PredicateError):
        RequestFilter(where=text)  # the library refuses it as the CLI does
    assert snapshot(tmp_path) == before
    assert _tmp_ours() == tmp_before


@pytest.mark.parametrize("value", QUOTED_VALUES)
def test_quoted_values_are_values(scratch: tuple[Path, Path], tmp_path: Path, value: str) -> None:
    wh, _ = scratch
    before = snapshot(tmp_path)
    with pytest.raises(Exception, match="no request matches"):
        read_requests(Warehouse(wh).files(REQUESTS), RequestFilter(where=value))
    assert snapshot(tmp_path) == before


def test_corpus_size() -> None:
    assert len(INJECTIONS) + len(QUOTED_VALUES) >= 100
    assert len(INJECTIONS[-5]) > MAX_LENGTH  # the long one is long


@pytest.mark.parametrize(("predicate", "ids"), LEGIT)
def test_legitimate_predicates_keep_working(
    tiny: Warehouse, predicate: str, ids: list[str]
) -> None:
    sel = RequestFilter(where=predicate)
    assert read_requests(tiny.files(REQUESTS), sel)["request_id"].to_list() == ids


def test_where_comes_with_its_origin() -> None:
    with pytest.raises(
        PredicateError, match=r"^tracereplay.toml \[replay\] where \"getenv.*: the function getenv"
    ):
        RequestFilter(where="getenv('HOME') = ''", where_origin="tracereplay.toml [replay] where")
    assert RequestFilter(where="  ").where is None  # blank: every request, as no --where
    with pytest.raises(PredicateError, match=r"^--where '': is empty; leave the option out"):
        check_predicate(" ")
    assert RequestFilter(where="  model = 'm-a' ").where == "model = 'm-a'"


def test_a_predicate_that_fails_as_it_runs_is_one_line(tiny: Warehouse) -> None:
    with pytest.raises(Exception, match=r"^--where 'CAST\(model AS INTEGER\) = 1': ") as e:
        read_requests(tiny.files(REQUESTS), RequestFilter(where="CAST(model AS INTEGER) = 1"))
    assert len(str(e.value).splitlines()) == 1


def test_the_sandbox_stops_what_the_checker_would_miss(tiny: Warehouse, tmp_path: Path) -> None:
    """The connection a predicate runs on opens its requests files and nothing else."""
    files = tiny.files(REQUESTS)
    rows = f"SELECT * FROM read_parquet({sandbox.sql_list(map(sandbox.allowed_path, files))})"
    con = sandbox.connect(files=files)
    try:
        assert con.sql(statement("true", rows)).fetchall()
        for unchecked in (
            "(SELECT count(*) FROM read_csv('/etc/passwd', sep = ':')) > 0",
            f"(SELECT count(*) FROM (COPY (SELECT 1) TO '{tmp_path}/x.csv')) > 0",
            f"EXISTS (FROM read_parquet('{tiny.root}/runs/*.parquet'))",
        ):
            with pytest.raises(duckdb.Error):
                con.sql(statement(unchecked, rows)).fetchall()
        for setting in ("SET enable_external_access = true", "SET allowed_paths = ['/']"):
            with pytest.raises(duckdb.Error, match="locked"):
                con.execute(setting)
        with pytest.raises(duckdb.Error):
            con.execute("LOAD httpfs")
    finally:
        con.close()
    assert not (tmp_path / "x.csv").exists()


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.output


@pytest.mark.parametrize(
    "attempt",
    [
        INJECTIONS[0],
        "model IN (SELECT column0 FROM read_csv('/etc/passwd', header = false))",
        "getenv('HOME') = ''",
        "true; ATTACH 'x.duckdb' AS x",
        "true -- comment",
    ],
)
def test_replay_refuses_before_anything_runs(
    scratch: tuple[Path, Path], tmp_path: Path, attempt: str
) -> None:
    wh, cwd = scratch
    before = snapshot(tmp_path)
    code, out = _cli("replay", "--warehouse", str(wh), "--policy", "vllm", "--where", attempt)
    assert code == 1, out
    assert out.startswith("Error: --where "), out
    _one_line_refusal(out.removeprefix("Error: "))
    assert snapshot(tmp_path) == before  # not even the warehouse lock file
    assert not (cwd / "pwned.csv").exists()


def test_every_command_with_where_checks_it(scratch: tuple[Path, Path], tmp_path: Path) -> None:
    wh, cwd = scratch
    (cwd / "grid.toml").write_text('[base]\npolicy = "vllm"\n[axes]\nmax_num_seqs = [4, 8]\n')
    (cwd / "prod.toml").write_text('policy = "vllm"\n')
    before = snapshot(tmp_path)
    bad = "getenv('HOME') = ''"
    for args in (
        ["sweep", "grid.toml", "--jobs", "1"],
        ["capacity", "--slo", "ttft_p99=60s", "--search", "concurrency"],
        ["calibrate", "observed", "--scenario", "prod.toml"],
        ["live", "--engine", "http"],
    ):
        code, out = _cli(*args, "--warehouse", str(wh), "--where", bad)
        assert code == 1, (args, out)
        assert out.startswith("Error: --where \"getenv('HOME') = ''\": the function getenv "), out
        assert len(out.strip().splitlines()) == 1, out
    assert snapshot(tmp_path) == before


def test_replay_with_a_legitimate_predicate(scratch: tuple[Path, Path]) -> None:
    wh, _ = scratch
    code, out = _cli("replay", "--warehouse", str(wh), "--policy", "vllm", "--json",
                     "--where", "lower(model) LIKE 'm-%' AND prompt_tokens > 100")  # fmt: skip
    assert code == 0, out
    (scenario,) = json.loads(out)["scenarios"].values()
    assert scenario["summary"]["num_requests"] == 2  # r2, r3


def test_the_docs_list_every_allowed_function() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "replay.md").read_text()
    section = doc.split("## Selecting requests with `--where`")[1].split("\n## ")[0]
    words = set(section.replace("`", " ").replace(",", " ").split())
    missing = sorted(f for f in FUNCTIONS if f.isidentifier() and f not in words)
    assert not missing, f"docs/replay.md does not list: {', '.join(missing)}"
