"""Timing the in-process engine's own steps, and releasing requests into one step.

What is timed is the engine's own step, not a bare forward pass: from the start of
``ContinuousBatchProcessor.prepare_next_batch`` (scheduling, building the batch tensors)
to the end of ``update_batch`` (sampling, bookkeeping), which is what one step of the
simulator stands for. ``StepRecorder`` wraps those methods of a running
continuous-batching manager (on the instance: the transformers classes stay as they
are) and records each step's duration and shape.

``gate`` makes a designed step happen exactly: with the engine idle, the scheduler's
``block_new_requests`` is raised, the requests are queued, and the flag is lowered only
once all of them wait, so the next step schedules them together.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import PipelineError


@dataclass
class StepRecord:
    """One engine step: its duration and, per scheduled request, (query tokens, KV before)."""

    duration_s: float
    shape: list[tuple[int, int]] = field(default_factory=list)


class StepRecorder:
    """Times the engine's steps by wrapping its batch processor's methods (instance-level)."""

    def __init__(self, manager: Any) -> None:
        deadline = time.perf_counter() + 60
        while getattr(manager, "batch_processor", None) is None:
            status = getattr(manager, "background_thread_status", None)
            fatal = getattr(status, "fatal_error", None)
            if fatal is not None:
                raise PipelineError(f"the continuous-batching engine failed to start: {fatal}")
            if time.perf_counter() > deadline:
                raise PipelineError("the continuous-batching engine did not start within 60 s")
            time.sleep(0.005)
        self.bp = manager.batch_processor
        self.steps: list[StepRecord] = []
        self._start = 0.0
        self._shape: list[tuple[int, int]] = []
        scheduler = self.bp.scheduler
        orig_schedule = scheduler.schedule_batch
        orig_prepare = self.bp.prepare_next_batch
        orig_update = self.bp.update_batch

        def schedule(*args: Any, **kwargs: Any) -> Any:
            out = orig_schedule(*args, **kwargs)
            batch = out[0] or []
            self._shape = [(int(f.query_length), int(f.state.position_offset)) for f in batch]
            return out

        def prepare() -> bool:
            self._start = time.perf_counter()
            return bool(orig_prepare())

        def update() -> None:
            orig_update()
            self.steps.append(StepRecord(time.perf_counter() - self._start, self._shape))

        scheduler.schedule_batch = schedule
        self.bp.prepare_next_batch = prepare
        self.bp.update_batch = update


def gate(manager: Any, rec: StepRecorder, prompts: list[list[int]], out: int) -> None:
    """Queue ``prompts`` so that the next step schedules all of them together."""
    scheduler = rec.bp.scheduler
    scheduler.block_new_requests = True
    ids = [f"probe{time.perf_counter_ns()}_{k}" for k in range(len(prompts))]
    for rid, prompt in zip(ids, prompts, strict=True):
        manager.add_request(prompt, request_id=rid, max_new_tokens=out, eos_token_id=-1)
    deadline = time.perf_counter() + 60
    while len(scheduler.waiting_requests) < len(prompts):
        if time.perf_counter() > deadline:
            raise PipelineError("probe requests did not reach the engine's waiting queue")
        time.sleep(0.0005)
    scheduler.block_new_requests = False
    for name in ("_wake_up_loop", "_has_new_requests"):  # 5.18+ / 5.17
        event = getattr(manager, name, None)
        if isinstance(event, threading.Event):
            event.set()


def wait_results(manager: Any, n: int) -> None:
    for _ in range(n):
        res = manager.get_result(timeout=120)
        if res is None:
            raise PipelineError("the engine stopped answering during the probes")
        if res.error:
            raise PipelineError(f"probe request failed in the engine: {res.error}")


def release_together(manager: Any, rec: StepRecorder, prompts: list[list[int]], out: int) -> None:
    """Queue ``prompts`` so that the next step schedules all of them, and wait for the results."""
    gate(manager, rec, prompts, out)
    wait_results(manager, len(prompts))
