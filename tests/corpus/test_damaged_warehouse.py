"""A damaged warehouse: every kind of damage on every kind of table, with exact outcomes.

Each case damages one file of a small warehouse (two ingested logs over two days, a
replay run, a live run) and checks that:

- ``sql`` still answers, counting exactly the rows of the sound files, and names the
  damaged file on stderr in one line with what to do;
- ``check`` lists exactly that file and exits 3, changing nothing;
- ``check --repair`` moves exactly it to ``damaged/`` with one manifest record;
- a second ``check`` is clean (exit 0) and ``sql`` counts the same, silently.

Plus a file where a table directory belongs, misplaced and stray files, a damaged
schema file, a damaged runs row (its run's files kept, hidden), ``replay`` and
``report`` on a damaged warehouse, a read-only one, and kill -9 while setting aside.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from pipeline.cli import cli
from pipeline.contracts import (
    CONTRACTS,
    LIVE_REQUESTS,
    SCENARIOS,
    SIM_REQUESTS,
    SIM_STEPS,
    VERSION_KEY,
)
from pipeline.ingest import IngestOptions, ingest_logs
from pipeline.integrity import CRASH_AT, manifest
from pipeline.runs import write_run_row
from pipeline.warehouse import Warehouse, source_key
from tests.corpus.disk import Fault
from tests.helpers import sim_rows, step, table, write_run

ROOT = Path(__file__).resolve().parents[2]
REPLAY = "20240503T000000Z-aaaa"
LIVE = "20240504T000000Z-bbbb"
T0 = datetime(2024, 5, 1, 23, 30, tzinfo=UTC)


def _log(path: Path, prefix: str, n: int, start: datetime) -> Path:
    lines = []
    for i in range(n):
        t = start + timedelta(seconds=37 * i)
        lines.append(
            json.dumps(
                {
                    "request_id": f"{prefix}-{i}",
                    "startTime": t.isoformat(),
                    "completionStartTime": (t + timedelta(seconds=0.2)).isoformat(),
                    "endTime": (t + timedelta(seconds=1.5)).isoformat(),
                    "prompt_tokens": 100 + i,
                    "completion_tokens": 1 + i % 7,
                    "model": "m",
                    "status": "success",
                }
            )
        )
    lines.insert(3, '{"request_id": "bad", "startTime": "not a time"}')
    path.write_text("\n".join(lines) + "\n")
    return path


def _build(root: Path, logs: Path) -> Warehouse:
    logs.mkdir(parents=True)
    wh = Warehouse(root)
    # log a spans midnight (two requests files), b lies in one day
    a = _log(logs / "a.jsonl", "a", 120, T0)
    b = _log(logs / "b.jsonl", "b", 30, T0 + timedelta(days=1, hours=4))
    assert ingest_logs([str(a), str(b)], wh, IngestOptions(quiet=True)).ok
    arrivals = [0.0, 1.0, 2.0, 3.0]
    for name in ("s1", "s2"):
        rows = sim_rows(name, arrivals, [0.1] * 4, [1.0, 2.0, 3.0, 4.0], [0] * 4, [0] * 4)
        wh.write(SIM_REQUESTS, table(SIM_REQUESTS, rows), {"run_id": REPLAY}, name)
        steps = [step(name, 0, i, float(i), 1.0) for i in range(3)]
        wh.write(SIM_STEPS, table(SIM_STEPS, steps), {"run_id": REPLAY}, name)
    meta = [{"scenario": n, "policy": "vllm", "replicas": 1, "profile": "tiny",
             "config_json": "{}", "summary_json": "{}"} for n in ("s1", "s2")]  # fmt: skip
    wh.write(SCENARIOS, table(SCENARIOS, meta), {"run_id": REPLAY}, "scenarios")
    write_run(wh, REPLAY, 3)
    live = [
        {"request_id": f"a-{i}", "engine": "http", "arrival_s": float(i), "sent_s": float(i),
         "first_token_s": i + 0.1, "finished_s": i + 1.0, "prompt_tokens": 100,
         "output_tokens": 4, "output_tokens_received": 4, "ttft_s": 0.1, "e2e_s": 1.0,
         "ok": True}
        for i in range(5)
    ]  # fmt: skip
    wh.write(LIVE_REQUESTS, table(LIVE_REQUESTS, live), {"run_id": LIVE}, "http")
    write_run_row(wh, run_id=LIVE, command="live", started=datetime(2024, 5, 4, tzinfo=UTC),
                  status="ok", inputs=[], rows_read=5, rows_kept=5, details={})  # fmt: skip
    wh.init()
    return wh


@dataclass(frozen=True)
class Fixture:
    template: Path
    logs: Path
    counts: dict[str, int]  # rows of each view
    rows: dict[str, int]  # rows in each file (by path under the warehouse)


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> Fixture:
    base = tmp_path_factory.mktemp("damaged")
    wh = _build(base / "wh", base / "logs")
    con = wh.connect()
    try:
        counts = {
            t: int(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0])  # type: ignore[index]
            for t in CONTRACTS
        }
    finally:
        con.close()
    rows = {
        str(p.relative_to(wh.root)): pq.ParquetFile(p).metadata.num_rows
        for p in wh.root.rglob("*.parquet")
    }
    return Fixture(wh.root, base / "logs", counts, rows)


@pytest.fixture
def wh(fx: Fixture, tmp_path: Path) -> Path:
    root = tmp_path / "wh"
    shutil.copytree(fx.template, root)
    return root


def _target(root: Path, table: str) -> Path:
    """The file of ``table`` each case damages."""
    if table == "requests":  # log a's second day
        return root / f"requests/date=2024-05-02/src-{_key_a(root)}.parquet"
    if table == "quarantine":
        return root / f"quarantine/src-{_key_a(root)}.parquet"
    if table == "runs":
        return root / f"runs/{LIVE}.parquet"
    if table == "live_requests":
        return root / f"live_requests/run_id={LIVE}/http.parquet"
    return root / f"{table}/run_id={REPLAY}/s1.parquet"


def _key_a(root: Path) -> str:
    """The source key of log a, from the ingest run's row (which names each file)."""
    for p in (root / "runs").glob("2*.parquet"):
        row = pq.read_table(p).to_pylist()[0]
        files = json.loads(row["details"]).get("files", []) if row["command"] == "ingest" else []
        for f in files:
            if f["path"].endswith("/a.jsonl"):
                return source_key(Path(f["path"]))
    raise AssertionError("no ingest run")


# --- damage -------------------------------------------------------------------------------


def _zero(p: Path, root: Path) -> None:
    p.write_bytes(b"")


def _truncated(p: Path, root: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


def _bad_footer(p: Path, root: Path) -> None:
    data = bytearray(p.read_bytes())
    n = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - n
    data[start : start + 24] = b"\xff" * 24
    p.write_bytes(bytes(data))


def _flipped_page(p: Path, root: Path) -> None:
    md = pq.ParquetFile(p).metadata
    col = md.row_group(0).column(md.num_columns - 1 if md.num_columns < 3 else 2)
    end = (col.dictionary_page_offset or col.data_page_offset) + col.total_compressed_size
    data = bytearray(p.read_bytes())
    for i in range(end - 6, end - 2):
        data[i] ^= 0x5A
    p.write_bytes(bytes(data))


def _not_parquet(p: Path, root: Path) -> None:
    p.write_text("request_id,prompt_tokens\nx,1\n")


def _directory(p: Path, root: Path) -> None:
    p.unlink()
    p.mkdir()
    (p / "part-0.parquet").write_bytes(b"PAR1")


def _wrong_table(p: Path, root: Path) -> None:
    other = "runs" if "runs/" not in str(p.relative_to(root)) else "quarantine"
    shutil.copy(next((root / other).glob("[!_]*.parquet")), p)


def _rewrite(p: Path, change: Callable[[pa.Table], pa.Table]) -> None:
    t = pq.read_table(p)
    t = t.replace_schema_metadata(t.schema.metadata)
    t = change(t)
    pq.write_table(t, p, write_page_checksum=True)


def _wrong_version(p: Path, root: Path) -> None:
    _rewrite(p, lambda t: t.replace_schema_metadata({**t.schema.metadata, VERSION_KEY: b"99"}))


WILD = {  # a column per table and the wild value written into its first row
    "requests": ("arrival_s", 4.9e298),
    "quarantine": ("source_line", -5),
    "runs": ("rows_read", -1),
    "sim_requests": ("arrival_s", float("nan")),
    "sim_steps": ("start_s", -1.3e281),
    "live_requests": ("prompt_tokens", -7),
}


def _wild(p: Path, root: Path) -> None:
    table = p.relative_to(root).parts[0]
    name, value = WILD[table]

    def change(t: pa.Table) -> pa.Table:
        i = t.schema.get_field_index(name)
        values = t.column(name).to_pylist()
        values[0] = value
        return t.set_column(i, t.schema.field(i), pa.array(values, t.schema.field(i).type))

    _rewrite(p, change)


DAMAGE: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    # kind: (how, what the message says)
    "zero-byte": (_zero, "an empty file (0 bytes)"),
    "truncated": (_truncated, "not a readable Parquet file"),
    "bad-footer": (_bad_footer, "not a readable Parquet file"),
    "flipped-page": (_flipped_page, "a damaged page"),
    "not-parquet": (_not_parquet, "not a readable Parquet file"),
    "directory": (_directory, "a directory where a Parquet file should be"),
    "wrong-table": (_wrong_table, "footer says"),
    "wrong-version": (_wrong_version, "has schema version 99"),
    "wild-values": (_wild, "outside"),
}
TABLES = ("requests", "quarantine", "runs", "sim_requests", "sim_steps", "live_requests")
FIX = {
    "requests": "re-ingest its source: tracereplay ingest ",
    "quarantine": "re-ingest its source: tracereplay ingest ",
    "runs": f"re-run the command of run {LIVE}",
    "sim_requests": f"re-run the replay that wrote run {REPLAY}",
    "sim_steps": f"re-run the replay that wrote run {REPLAY}",
    "live_requests": f"re-run the live that wrote run {LIVE}",
}


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def _count(root: Path, table: str) -> Result:
    return _invoke("sql", "--warehouse", str(root), "--format", "csv",
                   f"SELECT count(*) AS n FROM {table}")  # fmt: skip


def _damaged_lines(r: Result) -> list[str]:
    return [ln for ln in r.stdout.splitlines() if ln.startswith("damaged: ")]


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("kind", DAMAGE)
def test_damage(fx: Fixture, wh: Path, table: str, kind: str) -> None:
    target = _target(wh, table)
    rel = str(target.relative_to(wh))
    how, says = DAMAGE[kind]
    how(target, wh)
    good = fx.counts[table] - fx.rows[rel]

    # sql: the other files are served; one line names the file and the fix
    r = _count(wh, table)
    assert (r.exit_code, r.stdout) == (0, f"n\n{good}\n"), r.output
    warned = [ln for ln in r.stderr.splitlines() if ln.startswith("warning: damaged file")]
    assert len(warned) == 1, r.stderr
    assert f"{wh / rel}: " in warned[0] and says in warned[0] and "left out" in warned[0]
    assert FIX[table] in warned[0]
    assert target.exists()  # sql moves nothing

    # check: exactly that file, changing nothing
    r = _invoke("check", "--warehouse", str(wh))
    assert r.exit_code == 3, r.output
    lines = _damaged_lines(r)
    assert len(lines) == 1 and lines[0].startswith(f"damaged: {rel}: ") and says in lines[0]
    assert "1 damaged" in r.stdout
    assert not (wh / "damaged").exists()

    # check --repair: exactly it moved aside, with its record
    r = _invoke("check", "--warehouse", str(wh), "--repair")
    assert r.exit_code == 3, r.output
    assert f"moved to damaged/{rel}" in r.stdout and "1 set aside" in r.stdout
    assert not target.exists() and (wh / "damaged" / rel).exists()
    records = manifest(Warehouse(wh))
    assert [(m["path"], m["moved_to"], m["table"]) for m in records] == [
        (rel, f"damaged/{rel}", table)
    ]
    assert says in records[0]["problem"] and FIX[table] in records[0]["fix"]

    # a second check is clean, and sql counts the same, silently
    r = _invoke("check", "--warehouse", str(wh))
    assert r.exit_code == 0, r.output
    assert "no damage" in r.stdout and "1 set aside before" in r.stdout
    r = _count(wh, table)
    assert (r.exit_code, r.stdout, r.stderr) == (0, f"n\n{good}\n", "")


def test_requests_fix_names_the_source(fx: Fixture, wh: Path) -> None:
    _zero(_target(wh, "requests"), wh)
    r = _invoke("check", "--warehouse", str(wh))
    assert _damaged_lines(r)[0].endswith(
        f"re-ingest its source: tracereplay ingest {fx.logs}/a.jsonl"
    )


def test_every_other_table_still_served(fx: Fixture, wh: Path) -> None:
    """A damaged file of one table blocks no other view (here: a zero-byte runs row of a
    live run, the case that once failed every view). That run's own rows are hidden, as
    an uncommitted run's are; every other table is served whole."""
    _zero(_target(wh, "runs"), wh)
    hidden = {"runs": 1, "live_requests": fx.counts["live_requests"]}
    con = Warehouse(wh).connect()
    try:
        for t, n in fx.counts.items():
            got = con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # type: ignore[index]
            assert got == n - hidden.get(t, 0), t
    finally:
        con.close()


@pytest.mark.parametrize("table", ["runs", "sim_steps", "requests"])
def test_a_file_where_the_table_directory_belongs(fx: Fixture, wh: Path, table: str) -> None:
    shutil.rmtree(wh / table)
    (wh / table).write_text("not a directory\n")
    r = _count(wh, table)
    assert (r.exit_code, r.stdout) == (0, "n\n0\n"), r.output
    assert f"warning: damaged file {wh / table}: a file where the table's directory" in r.stderr
    other = "quarantine"
    assert _count(wh, other).stdout == f"n\n{fx.counts[other]}\n"
    r = _invoke("check", "--warehouse", str(wh), "--repair")
    assert r.exit_code == 3 and _damaged_lines(r)[0].startswith(f"damaged: {table}: ")
    assert (wh / table).is_dir() and (wh / "damaged" / table).is_file()
    assert _invoke("check", "--warehouse", str(wh)).exit_code == 0
    if table == "runs":  # no run's files are taken for stale when runs/ itself was lost
        assert (wh / f"sim_requests/run_id={REPLAY}/s1.parquet").exists()


def test_stray_files_the_views_never_read_are_left_alone(fx: Fixture, wh: Path) -> None:
    (wh / "requests/date=2024-05-01/notes.txt").write_text("hello\n")
    (wh / "requests/stray.parquet").write_text("not a partition\n")
    r = _invoke("check", "--warehouse", str(wh))
    assert (r.exit_code, _damaged_lines(r)) == (0, [])
    assert _count(wh, "requests").stdout == f"n\n{fx.counts['requests']}\n"


def test_a_file_outside_a_partition_directory(fx: Fixture, wh: Path) -> None:
    src = _target(wh, "requests")
    (wh / "requests/garbage").mkdir()
    shutil.copy(src, wh / "requests/garbage/x.parquet")
    (wh / "requests/date=May").mkdir()
    shutil.copy(src, wh / "requests/date=May/y.parquet")
    r = _invoke("check", "--warehouse", str(wh))
    assert r.exit_code == 3
    assert [ln.split(": ")[1] for ln in _damaged_lines(r)] == [
        "requests/date=May/y.parquet",
        "requests/garbage/x.parquet",
    ]
    assert _count(wh, "requests").stdout == f"n\n{fx.counts['requests']}\n"


def test_a_damaged_schema_file_is_written_again(fx: Fixture, wh: Path) -> None:
    empty = wh / "runs/_empty.parquet"
    _zero(empty, wh)
    r = _invoke("check", "--warehouse", str(wh), "--repair")
    assert r.exit_code == 3 and "the next command writes this schema file again" in r.stdout
    assert pq.read_table(empty).num_rows == 0  # written again by the repair
    assert _invoke("check", "--warehouse", str(wh)).exit_code == 0


def test_a_damaged_runs_row_hides_its_run_and_keeps_its_files(fx: Fixture, wh: Path) -> None:
    _zero(wh / f"runs/{REPLAY}.parquet", wh)
    r = _invoke("check", "--warehouse", str(wh), "--repair")
    assert r.exit_code == 3
    assert _count(wh, "sim_requests").stdout == "n\n0\n"  # uncommitted: hidden
    # a writing command's clean-up keeps the files of a run whose runs row was set aside
    Warehouse(wh).remove_stale()
    assert (wh / f"sim_requests/run_id={REPLAY}/s1.parquet").exists()


def test_a_locked_reader_moves_damage_aside(fx: Fixture, wh: Path) -> None:
    """ingest (holding the lock) sets aside the damaged requests file it reads, and lands
    its own; a damaged file of a table it does not read waits for the next reader."""
    _flipped_page(_target(wh, "quarantine"), wh)
    _wild(_target(wh, "requests"), wh)
    again = _log(wh.parent / "c.jsonl", "c", 10, T0 + timedelta(days=2))
    r = _invoke("ingest", "--warehouse", str(wh), "--quiet", str(again))
    assert r.exit_code == 0, r.output
    warned = [ln for ln in r.stderr.splitlines() if ln.startswith("warning: damaged file")]
    assert len(warned) == 1 and "moved to" in warned[0] and "'arrival_s'" in warned[0]
    assert [m["table"] for m in manifest(Warehouse(wh))] == ["requests"]
    n = fx.counts["requests"] - fx.rows[str(_target(wh, "requests").relative_to(wh))] + 10
    assert _count(wh, "requests").stdout == f"n\n{n}\n"
    r = _invoke("check", "--warehouse", str(wh))
    assert r.exit_code == 3
    assert [ln.split(": ")[1] for ln in _damaged_lines(r)] == [
        str(_target(wh, "quarantine").relative_to(wh))
    ]


def test_read_only_warehouse_leaves_damage_in_place(
    fx: Fixture, fault: Callable[..., Fault], tmp_path: Path
) -> None:
    """On a read-only mount (a real one where the tests may mount, else the injected
    refusal) a damaged file cannot be moved: it is left out of the views, named, and left
    where it is; every other file is served."""
    f = fault("readonly", tmp_path / "ro", size="16m")
    root = f.root / "wh"
    shutil.copytree(fx.template, root)
    target = _target(root, "runs")
    _zero(target, root)
    f.arm()
    r = _count(root, "runs")
    assert (r.exit_code, r.stdout) == (0, f"n\n{fx.counts['runs'] - 1}\n"), r.output
    assert f"damaged file {target}: an empty file (0 bytes); left out" in r.stderr
    assert target.exists() and not (root / "damaged").exists()


def test_replay_and_report_run_beside_damage(fx: Fixture, wh: Path, tmp_path: Path) -> None:
    _truncated(_target(wh, "requests"), wh)
    _zero(_target(wh, "live_requests"), wh)
    r = _invoke("replay", "--warehouse", str(wh), "--quiet", "--policy", "vllm",
                "--profile", "llama-3-8b_h100-80gb_tp1")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert f"{_target(wh, 'requests').name}" in r.stderr and "moved to" in r.stderr
    html = tmp_path / "r.html"
    r = _invoke("report", "--warehouse", str(wh), "-o", str(html))
    assert r.exit_code == 0, r.output
    assert html.is_file()
    # what the replay wrote passes every check; only the live file (no reader set it
    # aside: report takes no lock) is left
    r = _invoke("check", "--warehouse", str(wh))
    assert r.exit_code == 3
    assert [ln.split(": ")[1] for ln in _damaged_lines(r)] == [
        str(_target(wh, "live_requests").relative_to(wh))
    ]


def test_verdicts_are_reused_until_a_file_changes(fx: Fixture, wh: Path) -> None:
    from pipeline.integrity import scan

    first = scan(Warehouse(wh))
    assert first.read == first.checked and not first.damaged
    again = scan(Warehouse(wh))
    assert (again.read, again.damaged) == (0, [])
    _flipped_page(_target(wh, "sim_steps"), wh)
    third = scan(Warehouse(wh))
    assert third.read == 1 and [d.table for d in third.damaged] == ["sim_steps"]


# --- kill -9 while setting aside ------------------------------------------------------------


@pytest.mark.parametrize(
    "point", ["verdicts:written", "set-aside:manifest-written", "set-aside:recorded",
              "set-aside:moved"]
)  # fmt: skip
def test_kill_9_while_setting_aside(fx: Fixture, wh: Path, point: str) -> None:
    victims = [_target(wh, "requests"), _target(wh, "sim_steps")]
    for v in victims:
        _zero(v, wh)
    rels = sorted(str(v.relative_to(wh)) for v in victims)
    env = {**os.environ, CRASH_AT: point, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "check", "--warehouse", str(wh), "--repair"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    # every file is in place, or in damaged/ with its record: none lost
    records = {m["path"]: m["moved_to"] for m in manifest(Warehouse(wh))}
    for rel in rels:
        assert (wh / rel).exists() or (rel in records and (wh / records[rel]).exists())
    # the next run completes it: both set aside, one record each, nothing left over
    env.pop(CRASH_AT)
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "check", "--warehouse", str(wh), "--repair"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode in (0, 3), proc.stderr
    got = sorted((m["path"], m["moved_to"]) for m in manifest(Warehouse(wh)))
    assert got == [(rel, f"damaged/{rel}") for rel in rels]
    assert all(not (wh / rel).exists() and (wh / "damaged" / rel).is_file() for rel in rels)
    assert not list(wh.rglob(".*.tmp-*"))
    assert _invoke("check", "--warehouse", str(wh)).exit_code == 0


def test_corpus_size() -> None:
    assert len(DAMAGE) * len(TABLES) >= 40


def test_check_json_and_quiet(wh: Path) -> None:
    """`check --json` lists each damaged file with its problem and fix; `--quiet` prints
    the summary line only; both keep the exit status (3: damage found)."""
    target = _target(wh, "runs")
    _zero(target, wh)
    rel = str(target.relative_to(wh))
    r = _invoke("check", "--warehouse", str(wh), "--json")
    assert r.exit_code == 3, r.output
    doc = json.loads(r.stdout)
    assert [(d["table"], d["path"], d["moved_to"]) for d in doc["damaged"]] == [("runs", rel, None)]
    assert doc["damaged"][0]["problem"] == "an empty file (0 bytes)"
    assert (doc["set_aside"], doc["warehouse"]) == (0, str(wh))
    r = _invoke("check", "--warehouse", str(wh), "--quiet")
    assert r.exit_code == 3
    assert _damaged_lines(r) == [] and "1 damaged" in r.stdout
    r = _invoke("check", "--warehouse", str(wh), "--json", "--repair")
    assert r.exit_code == 3
    assert json.loads(r.stdout)["damaged"][0]["moved_to"] == f"damaged/{rel}"
    r = _invoke("check", "--warehouse", str(wh), "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["damaged"] == []
