"""The warehouse lock: concurrent writers end as if run one after the other."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.lock import LOCK_FILE, LockTimeoutError, holder, warehouse_lock
from pipeline.warehouse import Warehouse
from tests.gateway_logs import gateway_lines


def tracereplay(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def requests_state(root: Path) -> tuple[int, int, str]:
    """(rows, distinct ids, order-independent checksum of id, source file and lengths)."""
    con = Warehouse(root).connect()
    row = con.execute(
        "SELECT count(*), count(DISTINCT request_id), "
        "bit_xor(hash(request_id, source_file, prompt_tokens, output_tokens)) FROM requests"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), str(row[2])


def test_concurrent_ingests_of_shared_ids_end_as_one_after_the_other(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(gateway_lines(range(0, 3000)))
    b.write_text(gateway_lines(range(1500, 4500)))  # 1,500 ids in both
    sequential = []
    for order in ((a, b), (b, a)):
        wh = tmp_path / f"seq-{order[0].stem}"
        for f in order:
            p = tracereplay("ingest", str(f), "--warehouse", str(wh), "--quiet")
            _, err = p.communicate()  # waits for it and closes its pipes
            assert p.returncode == 0, err
        sequential.append(requests_state(wh))
    assert sequential[0][:2] == (4500, 4500)
    for trial in range(3):
        wh = tmp_path / f"concurrent-{trial}"
        procs = [tracereplay("ingest", str(f), "--warehouse", str(wh), "--quiet") for f in (a, b)]
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err
        assert requests_state(wh) in sequential


def test_a_waiting_command_says_what_it_waits_for_and_gives_up(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    log = tmp_path / "a.jsonl"
    log.write_text(gateway_lines(range(10)))
    with warehouse_lock(wh, command="tracereplay sweep grid.toml"):
        t0 = time.monotonic()
        p = tracereplay("ingest", str(log), "--warehouse", str(wh), "--lock-timeout-s", "1")
        out, err = p.communicate(timeout=120)
        waited = time.monotonic() - t0
    assert p.returncode == 1
    lines = err.strip().splitlines()
    assert lines[0].startswith(f"waiting for the warehouse lock of {wh}, held by pid {os.getpid()}")
    assert "(tracereplay sweep grid.toml, since " in lines[0]
    assert lines[-1].startswith(f"Error: warehouse {wh} is locked by pid {os.getpid()}")
    assert "gave up after 1 s" in lines[-1] and "--lock-timeout-s" in lines[-1]
    assert len(lines) == 2
    assert waited >= 1
    assert not (wh / "requests").exists() or not list((wh / "requests").rglob("src-*"))


def test_the_waiter_runs_when_the_holder_ends(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    log = tmp_path / "a.jsonl"
    log.write_text(gateway_lines(range(10)))
    with warehouse_lock(wh):
        p = tracereplay("ingest", str(log), "--warehouse", str(wh), "--quiet")
        assert p.stderr is not None
        ready, _, _ = select.select([p.stderr], [], [], 120)  # it says it waits
        assert ready, "the second command never said it waits"
        first = p.stderr.readline()
        assert first.startswith("waiting for the warehouse lock"), first
        assert p.poll() is None  # still waiting
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert requests_state(wh)[0] == 10


def test_lock_is_reentrant_and_records_its_holder(tmp_path: Path) -> None:
    with warehouse_lock(tmp_path, command="outer"):
        info = holder(tmp_path)
        assert info is not None and info["pid"] == os.getpid() and info["command"] == "outer"
        with warehouse_lock(tmp_path, timeout_s=0):
            pass
        assert holder(tmp_path) == info
    assert holder(tmp_path) is None  # emptied on release
    assert (tmp_path / LOCK_FILE).exists()


def test_timeout_zero_does_not_wait(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from pipeline.lock import warehouse_lock\n"
        "with warehouse_lock(Path(sys.argv[1]), command='holder'):\n"
        "    print('held', flush=True); sys.stdin.readline()\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None and p.stdout.readline() == "held\n"
    try:
        with pytest.raises(LockTimeoutError, match="locked by pid .* \\(holder, since"):
            with warehouse_lock(tmp_path, timeout_s=0, on_wait=lambda m: None):
                pass
    finally:
        p.kill()  # a killed holder releases the lock
        p.communicate()  # waits for it and closes its pipes
    with warehouse_lock(tmp_path, timeout_s=5):
        pass


def test_next_writer_removes_what_killed_commands_left(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path)
    wh.init()
    stale_tmp = tmp_path / "requests" / "date=2024-05-01" / ".src-x.parquet.tmp-999999"
    stale_tmp.parent.mkdir(parents=True)
    stale_tmp.write_bytes(b"x" * 100)
    uncommitted = tmp_path / "sim_requests" / "run_id=20240501T000000Z-dead"
    uncommitted.mkdir(parents=True)
    (uncommitted / "vllm.parquet").write_bytes(b"partial")
    committed = tmp_path / "sim_requests" / "run_id=20240501T000000Z-good"
    committed.mkdir(parents=True)
    (committed / "vllm.parquet").write_bytes(b"kept")
    (tmp_path / "runs" / "20240501T000000Z-good.parquet").write_bytes(b"row")
    with warehouse_lock(tmp_path):
        pass
    assert not stale_tmp.exists()
    assert not uncommitted.exists()
    assert (committed / "vllm.parquet").exists()
    assert (tmp_path / "sim_requests" / "run_id=_empty" / "_empty.parquet").exists()
