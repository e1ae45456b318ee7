"""The processes this package starts: how many cores to use, and children that die with
their parent (the sweeps' and searches' workers, ``plan/executor.py``; the replays
beside a replay, ``sim/forked.py``)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def default_jobs() -> int:
    """Every core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def die_with_parent(parent: int) -> None:
    """In a child: be killed when the parent dies, however it dies.

    # NOTE: without it a worker of a parent killed with SIGKILL is re-parented
    # and blocks on its task pipe forever. The signal fires when the *thread*
    # that forked the child ends: fork from a thread that lives as long as the
    # children (a pool forks from the thread that submits tasks).
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)
