"""A killed parent leaves no worker processes behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def children(pid: int) -> set[int]:
    """Processes whose parent is ``pid``."""
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(d.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_workers_die_with_a_killed_parent() -> None:
    code = (
        "import time\n"
        "from pipeline.plan.executor import run_tasks\n"
        "for _ in run_tasks(time.sleep, [60] * 4, jobs=2):\n"
        "    pass\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 60
        workers: set[int] = set()
        while len(workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            workers = {p for p in children(parent.pid) if alive(p)}
        assert len(workers) >= 2, "the pool did not start"
        time.sleep(1)  # let the workers run their initializer and take a task
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        # a limit, not a measure: they die at once, or, on a loaded machine, when they get
        # the CPU to run their initializer (which exits where the parent is gone)
        deadline = time.monotonic() + 60
        while any(alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(p) for p in workers), "workers outlived their parent"
    finally:
        if parent.poll() is None:
            parent.kill()
