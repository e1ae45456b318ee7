"""Run independent tasks in parallel: in this process, on local processes, or on Ray.

``run_tasks(fn, tasks, jobs=..., ray_address=...)`` yields ``(index, result)``
as tasks finish, where ``result`` is what ``fn`` returned or the exception
that stopped it, so one failing task never loses the others.

- ``jobs == 1`` runs the tasks here, one after the other.
- Otherwise a pool of ``jobs`` worker processes. On Linux they are forked, so
  they inherit everything the parent loaded: the compiled simulator and any
  module state. A worker process that dies (killed, out of memory) breaks
  the pool; the tasks it may have been running are then retried one at a
  time, each in a fresh process, and only the one that dies again fails.
  Workers die with the parent: on Linux each asks the kernel for SIGKILL
  when its parent dies (``PR_SET_PDEATHSIG``), so a killed sweep leaves no
  worker behind.
- ``ray_address`` runs each task as a Ray task (one CPU each) on the cluster
  at that address (``ray start --head`` prints it; ``auto`` finds a local
  one). Ray is an optional dependency: ``pip install 'tracereplay[ray]'``.
  Every node needs tracereplay installed; results come back to this process.

Tasks are drawn from the iterable lazily, a few ahead of the free workers, so
that a caller can build large inputs (prepared requests) just in time.

# NOTE: forked workers must not use polars: its thread pool does not survive a
# fork, and a polars call in the child can hang. The simulator's workers use
# numpy and pyarrow only.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from pipeline.errors import ConfigError
from pipeline.processes import die_with_parent

T = TypeVar("T")
R = TypeVar("R")

AHEAD = 2  # tasks queued per worker beyond the one it runs


def run_tasks(
    fn: Callable[[T], R],
    tasks: Iterable[T],
    *,
    jobs: int = 1,
    ray_address: str | None = None,
    ahead: int = AHEAD,
) -> Iterator[tuple[int, R | BaseException]]:
    """Run ``fn`` on every task; yield (index in ``tasks``, result or exception) as they end.

    Args:
        fn: a module-level function (it is pickled by name for other processes).
        tasks: the inputs, drawn lazily.
        jobs: worker processes (ignored with ``ray_address``).
        ray_address: a Ray cluster address, or None for local processes.
        ahead: tasks drawn per worker beyond the one it runs (0 where each task is large:
            a sharded replay's parts, whose inputs the caller makes as they are drawn).

    Raises:
        ConfigError: jobs < 1, Ray not installed or not reachable.
    """
    if ray_address is not None:
        return _run_ray(fn, tasks, ray_address, ahead)
    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    if jobs == 1:
        return _run_here(fn, tasks)
    return _run_pool(fn, tasks, jobs, ahead)


def _run_here(fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[tuple[int, R | BaseException]]:
    for i, task in enumerate(tasks):
        try:
            yield i, fn(task)
        except Exception as exc:  # reported per task; the others go on
            yield i, exc


def _pool(jobs: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(
        max_workers=jobs,
        mp_context=_context(),
        initializer=die_with_parent,
        initargs=(os.getpid(),),
    )


def _context() -> Any:
    # fork shares the loaded simulator; macOS and Windows start clean interpreters
    method = "fork" if sys.platform.startswith("linux") else "spawn"
    return multiprocessing.get_context(method)


def _run_pool(
    fn: Callable[[T], R], tasks: Iterable[T], jobs: int, ahead: int = AHEAD
) -> Iterator[tuple[int, R | BaseException]]:
    source = enumerate(tasks)
    suspects: deque[tuple[int, T]] = deque()
    exhausted = False
    while not exhausted or suspects:
        if suspects:
            # after a worker died: each task it may have held runs alone
            i, task = suspects.popleft()
            yield i, _run_alone(fn, task)
            continue
        with _pool(jobs) as pool:
            running: dict[Future[R], tuple[int, T]] = {}
            broken = False
            while True:
                while not broken and len(running) < jobs * (1 + ahead):
                    nxt = next(source, None)
                    if nxt is None:
                        exhausted = True
                        break
                    try:
                        running[pool.submit(fn, nxt[1])] = nxt
                    except BrokenProcessPool:
                        suspects.append(nxt)
                        broken = True
                if not running:
                    break
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in done:
                    i, task = running.pop(fut)
                    try:
                        yield i, fut.result()
                    except BrokenProcessPool:
                        suspects.append((i, task))
                        broken = True
                    except Exception as exc:
                        yield i, exc
                if broken:
                    suspects.extend(running.values())
                    running.clear()
                    break
        if broken:
            suspects = deque(sorted(suspects, key=lambda it: it[0]))


def _run_alone(fn: Callable[[T], R], task: T) -> R | BaseException:
    with _pool(1) as pool:
        try:
            return pool.submit(fn, task).result()
        except BrokenProcessPool:
            return RuntimeError("the worker process died (killed, or out of memory)")
        except Exception as exc:
            return exc


def _run_ray(
    fn: Callable[[T], R], tasks: Iterable[T], address: str, ahead: int = AHEAD
) -> Iterator[tuple[int, R | BaseException]]:
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "--ray needs Ray, an optional dependency: pip install 'tracereplay[ray]'"
        ) from None
    try:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(
            f"--ray {address}: cannot connect to a Ray cluster ({str(exc).splitlines()[0]}); "
            "start one with `ray start --head` and pass the address it prints"
        ) from None
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(fn)
        width = max(1, int(ray.cluster_resources().get("CPU", 1))) * (1 + ahead)
        source = enumerate(tasks)
        running: dict[Any, int] = {}
        while True:
            while len(running) < width:
                nxt = next(source, None)
                if nxt is None:
                    break
                running[remote.remote(nxt[1])] = nxt[0]
            if not running:
                break
            done, _ = ray.wait(list(running), num_returns=1)
            for ref in done:
                i = running.pop(ref)
                try:
                    yield i, ray.get(ref)
                except Exception as exc:  # RayTaskError, a crashed worker, ...
                    yield i, exc
    finally:
        ray.shutdown()
