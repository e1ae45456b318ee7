"""Held corpus: a full disk, a read-only mount, a missing permission, every command that writes.

Each case arms one fault (``tests/corpus/disk.py``: a real full or read-only
tmpfs where mounting is allowed, else the injection seam) on the directory a
command writes, runs the command, and checks the exact outcome: exit 1, one
line naming the path, what is wrong and the fix; afterwards no temporary
file, no half run, the warehouse's counts as before, the lock free. Some
cases then free the fault and rerun: the run lands exactly once. ``nightly``
records a failed night in its manifest where the manifest's directory can be
written, and says in its line that none could be written where not; kill -9
while it writes that manifest leaves no half manifest.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.calibrate.synthetic import design_grid, measure, profile_truth_s
from pipeline.cli import cli
from pipeline.contracts import REQUESTS
from pipeline.lock import warehouse_lock
from pipeline.sim.profiles import PROFILE_DIR
from pipeline.warehouse import Warehouse
from tests.corpus.disk import FIX, REASON, Fault
from tests.gateway_logs import gateway_lines

ROOT = Path(__file__).resolve().parents[2]
LIKE = "llama-3-70b_h100-80gb_tp4"
NOTHING = r"nothing from this run landed"
WAREHOUSE_FIX = "point --warehouse elsewhere"
OUTPUT_FIX = "give -o another path"
REPORT_FIX = "write the report elsewhere with -o FILE"

NIGHTLY = """
[nightly]
inbox = ["inbox/*.jsonl"]
keep_nights = 3

[[scenario]]
name = "prod"
policy = "vllm"
max_num_seqs = 16
"""


# ------------------------------------------------------------------ the template warehouse


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A warehouse with one ingest (120 requests of 2024-05-01) and one replay, and the
    inputs the commands take."""
    base = tmp_path_factory.mktemp("template")
    (base / "logs").mkdir()
    (base / "logs" / "day0.jsonl").write_text(gateway_lines(range(120), day=0, spacing_s=2))
    (base / "logs" / "day1.jsonl").write_text(gateway_lines(range(1000, 1120), day=1))
    (base / "inbox").mkdir()
    shutil.copy(base / "logs" / "day1.jsonl", base / "inbox" / "day1.jsonl")
    (base / "nightly.toml").write_text(NIGHTLY)
    (base / "sc.toml").write_text('name = "s"\npolicy = "vllm"\nmax_num_seqs = 16\n')
    (base / "grid.toml").write_text('[base]\npolicy = "vllm"\n[axes]\nmax_num_seqs = [4, 8]\n')
    like = json.loads((PROFILE_DIR / f"{LIKE}.json").read_text())
    measure(design_grid(1), profile_truth_s(like["coefficients"]), seed=1).write_csv(
        base / "bench.csv"
    )
    wh = base / "wh"
    ok(["ingest", str(base / "logs" / "day0.jsonl"), "--warehouse", str(wh), "--quiet"])
    ok(["replay", "--warehouse", str(wh), "--scenario", str(base / "sc.toml"), "--quiet"])
    # a requests file for live (what replay reads): the first day's requests
    shutil.copy(Warehouse(wh).files(REQUESTS)[0], base / "requests.parquet")
    return base


def ok(args: list[str]) -> str:
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    return r.output


def counts(wh: Path) -> dict[str, int]:
    con = Warehouse(wh).connect()
    try:
        out = {}
        for view in ("requests", "runs", "scenarios", "sim_requests", "live_requests"):
            row = con.execute(f"SELECT count(*) FROM {view}").fetchone()
            assert row is not None
            out[view] = int(row[0])
        return out
    finally:
        con.close()


def leftovers(*dirs: Path) -> list[Path]:
    """Temporary files, and run folders whose run never committed."""
    found: list[Path] = []
    for d in dirs:
        if not d.exists():
            continue
        found += [p for p in d.rglob(".*.tmp-*")]
        runs = {p.stem for p in (d / "runs").glob("*.parquet")}
        for run_dir in d.glob("*/run_id=*"):
            rid = run_dir.name.split("=", 1)[1]
            if rid != "_empty" and rid not in runs:
                found.append(run_dir)
    return found


def failed_runs(wh: Path) -> int:
    con = Warehouse(wh).connect()
    try:
        row = con.execute("SELECT count(*) FROM runs WHERE status = 'failed'").fetchone()
        assert row is not None
        return int(row[0])
    finally:
        con.close()


def lock_is_free(wh: Path) -> bool:
    with warehouse_lock(wh, timeout_s=0, clean=False):
        return True


# ------------------------------------------------------------------ the commands


@dataclass
class Case:
    """Where the command writes (``wh``: the warehouse; ``out``: an output file)."""

    wh: Path
    out: Path
    base: Path


def _live_args(c: Case, url: str) -> list[str]:
    return ["live", "--engine", "http", "--base-url", url, "--requests",
            str(c.base / "requests.parquet"), "--warehouse", str(c.wh), "--num-requests", "6",
            "--time-scale", "0.01", "--metrics-interval-s", "0.05", "--quiet"]  # fmt: skip


COMMANDS: dict[str, tuple[str, Callable[[Case], list[str]]]] = {
    # name: (what it writes, its arguments)
    "ingest": ("wh", lambda c: ["ingest", str(c.base / "logs" / "day1.jsonl"),
                                "--warehouse", str(c.wh), "--quiet"]),
    "replay": ("wh", lambda c: ["replay", "--warehouse", str(c.wh), "--scenario",
                                str(c.base / "sc.toml"), "--quiet"]),
    "sweep": ("wh", lambda c: ["sweep", str(c.base / "grid.toml"), "--warehouse", str(c.wh),
                               "--jobs", "1", "--quiet"]),
    "capacity": ("wh", lambda c: ["capacity", "--warehouse", str(c.wh), "--slo",
                                  "ttft_p99=60s", "--search", "concurrency",
                                  "--max-concurrency", "2", "--summary-only", "--quiet"]),
    "run": ("wh", lambda c: ["run", str(c.base / "logs" / "day1.jsonl"), "--warehouse",
                             str(c.wh), "--scenario", str(c.base / "sc.toml"), "--quiet"]),
    "live": ("wh", lambda c: _live_args(c, c.base.name)),  # the URL is set in the case
    "report": ("wh", lambda c: ["report", "--warehouse", str(c.wh), "--quiet"]),
    "nightly": ("wh", lambda c: ["nightly", str(c.base / "nightly.toml"),
                                 "--warehouse", str(c.wh)]),
    "sql-o": ("out", lambda c: ["sql", "--warehouse", str(c.wh), "-o", str(c.out),
                                "SELECT count(*) AS n FROM requests"]),
    "profile-new": ("out", lambda c: ["profile", "new", "--model-config",
                                      str(ROOT / "tests/fixtures/model_configs/llama-3-8b.json"),
                                      "--gpu", "h100-sxm", "-o", str(c.out)]),
    "calibrate": ("out", lambda c: ["calibrate", "measurements", str(c.base / "bench.csv"),
                                    "--like", LIKE, "-o", str(c.out), "-q"]),
}  # fmt: skip


@contextmanager
def engine(name: str) -> Iterator[str | None]:
    if name != "live":
        yield None
        return
    sys.path.insert(0, str(ROOT / "tests" / "live"))
    from tests.live.servers import token_server

    with token_server(0.001, 0.001) as url:
        yield url


def args_of(name: str, c: Case, url: str | None) -> list[str]:
    return _live_args(c, url or "") if name == "live" else COMMANDS[name][1](c)


def fix_of(name: str) -> str:
    return {"report": REPORT_FIX}.get(
        name, WAREHOUSE_FIX if COMMANDS[name][0] == "wh" else OUTPUT_FIX
    )


def place(template: Path, tmp_path: Path, fault: Callable[..., Fault], kind: str, name: str,
          **kw: object) -> tuple[Case, Fault, Path]:  # fmt: skip
    """Copy the template, put the fault where ``name`` writes; return the case, the fault
    and the directory a message must name (the fault's root, or the file in the way)."""
    target = COMMANDS[name][0]
    base = tmp_path / "base"
    shutil.copytree(template, base, ignore=shutil.ignore_patterns("wh"))
    if kind == "notdir":
        (tmp_path / "afile").write_text("not a directory\n")
        blocked = tmp_path / "afile"
        f = fault(kind, tmp_path / "unused")
        if target == "wh":
            return Case(blocked / "wh", tmp_path / "out.json", base), f, blocked
        shutil.copytree(template / "wh", tmp_path / "wh")
        return Case(tmp_path / "wh", blocked / "out.json", base), f, blocked
    f = fault(kind, tmp_path / "mnt", **kw)
    if target == "wh":
        shutil.copytree(template / "wh", f.root / "wh")
        return Case(f.root / "wh", tmp_path / "out.json", base), f, f.root
    shutil.copytree(template / "wh", tmp_path / "wh")
    return Case(tmp_path / "wh", f.root / "out.json", base), f, f.root


def expected_line(kind: str, name: str, named: Path) -> str:
    head = rf"Error: {re.escape(str(named))}\S*: {REASON[kind]}; {FIX[kind]} or "
    tail = rf"{re.escape(fix_of(name))}, then rerun \({NOTHING}\)"
    if name == "nightly":
        return (
            head + tail + rf"; and no manifest could be written for night \S+ "
            rf"\({re.escape(str(named))}\S*: {REASON[kind]}\)"
        )
    return head + tail


# The cases: every command on a full disk, a read-only mount and without permission; the
# other kinds on the commands that write the warehouse most (ingest, replay, nightly) and on
# one output file (sql -o).
CASES = [(n, k) for n in COMMANDS for k in ("full", "readonly", "denied")]
CASES += [(n, k) for n in ("ingest", "replay", "nightly", "sql-o")
          for k in ("quota", "eperm", "toobig", "notdir")]  # fmt: skip
CASES += [("ingest", "missing"), ("replay", "missing")]


@pytest.mark.parametrize(("name", "kind"), CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_one_line_nothing_partial_lock_released(
    template: Path, tmp_path: Path, fault: Callable[..., Fault], name: str, kind: str
) -> None:
    c, f, named = place(template, tmp_path, fault, kind, name)
    before = counts(c.wh) if c.wh.exists() else None
    with engine(name) as url:
        f.arm()
        try:
            r = CliRunner().invoke(cli, args_of(name, c, url))
        finally:
            f.disarm()
        assert r.exit_code == 1, r.output
        assert not isinstance(r.exception, OSError), r.exception
        lines = r.output.strip().splitlines()
        pattern = expected_line(kind, name, named)
        if kind == "missing":  # the directory removed under the command, inside the warehouse
            pattern = pattern.replace(re.escape(str(named)), re.escape(str(c.wh)), 1)
        assert re.fullmatch(pattern, lines[-1]), lines[-1]
        # nothing partial anywhere, the warehouse as it was, the lock free
        assert leftovers(c.wh, f.root, c.out.parent) == []
        assert not c.out.exists()
        if before is None:
            assert not c.wh.exists()
            return
        after = counts(c.wh)
        if kind == "missing" and name == "replay":  # runs/ was there: the run is recorded failed
            assert after == {**before, "runs": before["runs"] + 1}
            assert failed_runs(c.wh) == 1
        else:
            assert after == before
        assert lock_is_free(c.wh)
        assert not list((c.wh / "nightly").glob("*/manifest.json"))
        assert not [d for d in (c.wh / "nightly").glob("2*") if d.is_dir()]
        if kind == "full":  # space freed: the rerun lands, once
            r = CliRunner().invoke(cli, args_of(name, c, url))
            assert r.exit_code == 0, r.output
            after = counts(c.wh)
            grew = {k: after[k] - before[k] for k in after if after[k] != before[k]}
            assert grew == RERUN_GROWS[name], grew
            assert leftovers(c.wh, f.root) == []


# what one successful rerun adds to the views
RERUN_GROWS = {
    "ingest": {"requests": 120, "runs": 1},
    "replay": {"runs": 1, "scenarios": 1, "sim_requests": 120},
    "sweep": {"runs": 1, "scenarios": 2, "sim_requests": 240},
    "capacity": {"runs": 1, "scenarios": 2},  # --summary-only: the probes' scenarios
    "run": {"requests": 120, "runs": 2, "scenarios": 1, "sim_requests": 120},
    "live": {"runs": 1, "live_requests": 6},
    "report": {},
    "nightly": {"requests": 120, "runs": 2, "scenarios": 1, "sim_requests": 120},
    "sql-o": {},
    "profile-new": {},
    "calibrate": {},
}


# ------------------------------------------------------------------ nightly's own manifest


def nightly_args(c: Case, *extra: str) -> list[str]:
    return ["nightly", str(c.base / "nightly.toml"), "--warehouse", str(c.wh), *extra]


def only_manifest(wh: Path) -> dict[str, object]:
    found = list((wh / "nightly").glob("*/manifest.json"))
    assert len(found) == 1, found
    return dict(json.loads(found[0].read_text()))


def test_nightly_on_a_read_only_warehouse_records_the_night_where_it_can(
    template: Path, tmp_path: Path, fault: Callable[..., Fault]
) -> None:
    """The warehouse is read-only but its nightly/ folder is not (another mount): the night
    fails in one line and its manifest says so."""
    c, f, _ = place(template, tmp_path, fault, "readonly", "nightly")
    (c.wh / "nightly").mkdir(exist_ok=True)
    spare = None
    if f.real:
        f.arm()
        assert subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs",
                               str(c.wh / "nightly")], check=False).returncode == 0  # fmt: skip
        spare = c.wh / "nightly"
    else:
        f.spare = c.wh / "nightly"
        f.arm()
    try:
        r = CliRunner().invoke(cli, nightly_args(c))
        m = only_manifest(c.wh)
    finally:
        if spare is not None:
            subprocess.run(["umount", str(spare)], check=False)
        f.disarm()
    assert r.exit_code == 1, r.output
    error, summary = r.output.strip().splitlines()[-2:]
    line = (rf"{re.escape(str(c.wh / '.lock'))}: read-only file system; remount it read-write "
            rf"or point --warehouse elsewhere, then rerun \({NOTHING}\)")  # fmt: skip
    assert re.fullmatch("error: " + line, error), error
    assert re.fullmatch(rf"night \S+: failed \(exit 1\); manifest {re.escape(str(c.wh))}"
                        r"/nightly/\S+/manifest.json", summary), summary  # fmt: skip
    assert m["status"] == "failed" and m["exit_code"] == 1
    assert isinstance(m["errors"], list) and len(m["errors"]) == 1
    assert re.fullmatch(line, m["errors"][0])


def test_nightly_on_a_disk_that_fills_records_the_failure_and_retries_the_file(
    template: Path, tmp_path: Path, fault: Callable[..., Fault]
) -> None:
    """The night's ingest does not fit (16 KiB left, a 3,000-request log): its temporary
    files go, the manifest (a few KiB) still fits and records the failure; the inbox file
    is not marked done, so the next night, with space, ingests it once."""
    c, f, named = place(template, tmp_path, fault, "full", "nightly", slack=16 * 1024)
    (c.base / "inbox" / "day1.jsonl").write_text(gateway_lines(range(5000, 8000), day=1))
    if not f.real:
        f.spare = c.wh / "nightly"
    before = counts(c.wh)
    f.arm()
    try:
        r = CliRunner().invoke(cli, nightly_args(c, "--json"))
    finally:
        f.disarm()
    assert r.exit_code == 1, r.output
    m = json.loads(r.output[r.output.index("{") :])
    assert m["status"] == "failed" and m["exit_code"] == 1 and "replay_run_id" not in m
    assert len(m["errors"]) == 1
    assert re.fullmatch(rf"{re.escape(str(named))}\S*: no space left on device; free space there "
                        rf"or point --warehouse elsewhere, then rerun \({NOTHING}\)",
                        m["errors"][0]), m["errors"][0]  # fmt: skip
    assert only_manifest(c.wh) == m
    assert leftovers(c.wh) == [] and counts(c.wh) == before and lock_is_free(c.wh)
    r = CliRunner().invoke(cli, nightly_args(c, "--json"))
    assert r.exit_code == 0, r.output
    again = json.loads(r.output[r.output.index("{") :])
    assert again["status"] == "ok" and again["days"] == ["2024-05-02"]
    assert counts(c.wh)["requests"] == before["requests"] + 3000


KILLER = r"""
import errno, os, sys, time
from pathlib import Path
wh, marker, point = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
real_replace, real_fsync = os.replace, os.fsync
def replace(src, dst, **kw):
    if "/requests/" in str(dst):  # the ingest: a full disk
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(src))
    if point == "rename" and Path(dst).name == "manifest.json":
        marker.write_text("at the rename")
        time.sleep(600)
    real_replace(src, dst, **kw)
def fsync(fd):
    if point == "fsync" and "manifest" in os.readlink(f"/proc/self/fd/{fd}"):
        marker.write_text("at the fsync")
        time.sleep(600)
    real_fsync(fd)
os.replace, os.fsync = replace, fsync
from pipeline.cli import cli
cli(["nightly", sys.argv[4], "--warehouse", str(wh)])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("point", ["fsync", "rename"])
def test_kill_9_while_nightly_writes_its_failure_manifest(
    template: Path, tmp_path: Path, point: str
) -> None:
    """Killed after the failure manifest's bytes are written (before its fsync, or before
    its rename): no manifest.json, half or whole, and the next night cleans up and runs."""
    base = tmp_path / "base"
    shutil.copytree(template, base)
    wh, marker = base / "wh", tmp_path / "marker"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", KILLER, str(wh), str(marker), point,
                             str(base / "nightly.toml")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the nightly never reached its manifest"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate()  # waits for it and closes its stderr pipe
    assert not list((wh / "nightly").glob("*/manifest.json"))
    tmps = list((wh / "nightly").glob("*/.manifest.json.tmp-*"))
    assert [t.name for t in tmps] == [f".manifest.json.tmp-{proc.pid}"]
    assert leftovers(wh) == tmps  # the ingest's own temporary files are gone
    r = CliRunner().invoke(cli, ["nightly", str(base / "nightly.toml"),
                                 "--warehouse", str(wh), "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert json.loads(r.output[r.output.index("{") :])["status"] == "ok"
    assert leftovers(wh) == [] and len(list((wh / "nightly").glob("*/manifest.json"))) == 1


# ------------------------------------------------------------------ reading a read-only warehouse


def _replay_run(wh: Path) -> str:
    con = Warehouse(wh).connect()
    try:
        row = con.execute("SELECT run_id FROM runs WHERE command = 'replay'").fetchone()
        assert row is not None
        return str(row[0])
    finally:
        con.close()


READERS: dict[str, Callable[[Case, str], list[str]]] = {
    "sql": lambda c, run: ["sql", "--warehouse", str(c.wh), "--format", "csv",
                           "SELECT count(*) AS n FROM requests"],
    "compare": lambda c, run: ["compare", run, run, "--warehouse", str(c.wh), "--json"],
    "report-o": lambda c, run: ["report", run, "--warehouse", str(c.wh), "-o",
                                str(c.out.with_suffix(".html")), "--quiet"],
}  # fmt: skip


@pytest.mark.parametrize("name", list(READERS))
def test_reading_a_read_only_warehouse_works(
    template: Path, tmp_path: Path, fault: Callable[..., Fault], name: str
) -> None:
    """sql and compare only read; report writes where -o says, outside the warehouse."""
    c, f, _ = place(template, tmp_path, fault, "readonly", "report")
    run = _replay_run(c.wh)
    f.arm()
    try:
        r = CliRunner().invoke(cli, READERS[name](c, run))
    finally:
        f.disarm()
    assert r.exit_code == 0, r.output
    if name == "sql":
        assert r.output == "n\n120\n"
    elif name == "compare":
        assert json.loads(r.output)["run_a"] == run
    else:
        html = c.out.with_suffix(".html")
        assert r.output.strip() == str(html) and html.stat().st_size > 0
    assert leftovers(c.wh) == [] and not (c.wh / "reports").exists()
