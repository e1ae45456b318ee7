"""A one-node Ray cluster for the tests that run on Ray (sweeps, sharded replays)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.extras import require


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def local_ray_cluster() -> Iterator[str]:
    """A one-node Ray cluster in its own process group, stopped by that group's id."""
    require("ray")
    port = _free_port()
    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay short
    ray_bin = Path(sys.executable).with_name("ray")
    proc = subprocess.Popen(
        [
            str(ray_bin if ray_bin.exists() else "ray"),
            "start",
            "--head",
            f"--port={port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            "--object-store-memory=200000000",
            f"--temp-dir={tmp}",
            "--block",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        # other processes on a shared test machine must not get our workers OOM-killed
        env={**os.environ, "RAY_memory_monitor_refresh_ms": "0"},
    )
    try:
        deadline = time.monotonic() + 120
        while True:  # the head is up when its GCS port accepts connections
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the Ray head did not start") from None
                time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=3)
                time.sleep(0.5)
            except subprocess.TimeoutExpired:
                continue
        shutil.rmtree(tmp, ignore_errors=True)
