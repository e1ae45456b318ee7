"""The probes of ``calibrate live``: time designed step shapes on the in-process engine.

What is timed is the engine's own step, not a bare forward pass: from the start of
``ContinuousBatchProcessor.prepare_next_batch`` (scheduling, building the batch tensors)
to the end of ``update_batch`` (sampling, bookkeeping), which is what one step of the
simulator stands for. On a small model most of a step is that per-step work, which a
forward pass alone would miss.

Each designed shape is made to happen exactly: with the engine idle, the scheduler's
``block_new_requests`` is raised, the shape's requests are queued (prompts of random ids
of the designed length), and the flag is lowered only once all of them wait, so the next
step schedules them together:

* prefill ``batch x prompt``: ``batch`` prompts of ``prompt`` tokens, one output token
  each: the step is exactly that prefill; repeated ``warmup + repeats`` times;
* decode ``batch x context``: ``batch`` prompts of ``context - 1`` tokens generating
  ``1 + warmup + repeats`` tokens: after the prefill, the decode steps read contexts
  ``context``, ``context + 1``, ...; the first ``warmup`` are dropped.

* mixed ``decodes x context + prompt``: ``decodes`` requests decoding at about
  ``context``, then one prompt of ``prompt`` tokens released into them: the step is those
  decodes plus that prefill. Pure rows cannot tell how a prompt's compute and the decodes'
  memory traffic add up in one step (the cost model's ``overlap``); mixed rows can. The
  measurements schema holds pure rows only, so they go to ``<stem>.mixed.csv``
  (``decode_batch, decode_kv_tokens, prompt_tokens, time_ms``) and join the fit directly.

The recorded shape of every step is checked against the design (a step that is not the
shape asked for is an error, never a row). A row's time is the median of its repeats
(a decode row's context is the middle repeat's); ``rounds`` passes over all the
shapes interleave the repeats, so that a burst of load on a shared machine does not
hit every repeat of one shape. The designs are ``probe_design``; the step timing and
the gate are ``pipeline.live.step_timing``; the fit to the rows is ``calibrate.live``.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import polars as pl

from pipeline.calibrate.probe_design import MIXED_DECODE_TOKENS, ProbeDesign
from pipeline.errors import PipelineError
from pipeline.live.step_timing import StepRecord, StepRecorder, gate, release_together, wait_results


def run_probes(
    loaded: Any,
    design: ProbeDesign,
    *,
    block_size: int = 32,
    seed: int = 0,
    progress: Any = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Time every shape of ``design`` on ``loaded``'s model: (pure rows, mixed rows)."""
    from transformers import GenerationConfig

    from pipeline.live.inprocess import cb_config

    vocab = int(loaded.model.config.vocab_size)
    rng = np.random.default_rng(seed)
    # headroom over the largest shape: under 15% free blocks the fifo scheduler's safety
    # margin would hold prompts back, and a decode shape would never have all its requests
    num_blocks = math.ceil(design.kv_tokens() * 1.25 / block_size) + 4
    budget = max(b * p for b, p in design.prefill_shapes())
    cbc = cb_config(
        num_blocks=num_blocks,
        block_size=block_size,
        max_batch_tokens=budget,
        scheduler="fifo",
        max_requests_per_batch=max(max(design.decode_batches), max(design.prefill_batches)),
    )
    manager = loaded.model.init_continuous_batching(
        generation_config=GenerationConfig(do_sample=False, eos_token_id=-1),
        continuous_batching_config=cbc,
    )
    rows: list[dict[str, Any]] = []
    mixed_rows: list[dict[str, Any]] = []
    model_name = loaded.name
    gpu = device_name(loaded.device)
    try:
        manager.start()
        rec = StepRecorder(manager)
        # warm the engine up on every path once
        release_together(manager, rec, [rng.integers(1, vocab, 16).tolist()] * 2, 3)
        prefill_times: dict[tuple[int, int], list[float]] = {}
        decode_times: dict[tuple[int, int], list[float]] = {}
        decode_context: dict[tuple[int, int], int] = {}
        mixed_times: dict[tuple[int, int, int], list[float]] = {}
        mixed_kv: dict[tuple[int, int, int], list[float]] = {}
        done = 0
        # rounds interleave the shapes, so that a burst of load on a shared machine
        # lands on different shapes rather than on every repeat of one
        for rnd in range(design.rounds):
            for b, p in design.prefill_shapes():
                warm = design.warmup if rnd == 0 else 0
                for rep in range(warm + design.repeats):
                    rec.steps.clear()
                    prompts = [rng.integers(1, vocab, p).tolist() for _ in range(b)]
                    release_together(manager, rec, prompts, 1)
                    step = _only_step(rec, [(p, 0)] * b, f"prefill {b} x {p}")
                    if rep >= warm:
                        prefill_times.setdefault((b, p), []).append(step.duration_s)
                done += 1
                if progress is not None:
                    progress(done)
            for b, c in design.decode_shapes():
                rec.steps.clear()
                want = design.warmup + design.repeats
                # prompts longer than the budget are prefilled over several steps, and the
                # first ones done start decoding early: generate enough for want full steps
                skew = math.ceil(b * (c - 1) / budget)
                prompts = [rng.integers(1, vocab, c - 1).tolist() for _ in range(b)]
                release_together(manager, rec, prompts, 1 + want + skew)
                decodes = [
                    s for s in rec.steps if len(s.shape) == b and all(q == 1 for q, _ in s.shape)
                ]
                if len(decodes) < want:
                    raise PipelineError(
                        f"decode probe {b} x {c}: the engine ran {len(decodes)} decode steps "
                        f"of all {b} requests, fewer than {want}"
                    )
                kept = decodes[design.warmup : want]
                middle = kept[len(kept) // 2]
                decode_context[(b, c)] = int(round(np.mean([kv for _, kv in middle.shape]))) + 1
                decode_times.setdefault((b, c), []).extend(s.duration_s for s in kept)
                done += 1
                if progress is not None:
                    progress(done)
            for b, c, p in design.mixed_shapes():
                key = (b, c, p)
                rec.steps.clear()
                decoders = [rng.integers(1, vocab, c - 1).tolist() for _ in range(b)]
                gate(manager, rec, decoders, MIXED_DECODE_TOKENS)
                deadline = time.perf_counter() + 120
                while not any(
                    len(st.shape) == b and all(q == 1 for q, _ in st.shape) for st in rec.steps
                ):
                    if time.perf_counter() > deadline:
                        raise PipelineError(f"mixed probe {key}: the decodes never ran together")
                    time.sleep(0.0005)
                warm = design.warmup if rnd == 0 else 0
                for rep in range(warm + design.repeats):
                    rec.steps.clear()
                    release_together(manager, rec, [rng.integers(1, vocab, p).tolist()], 1)
                    steps = [st for st in rec.steps if (p, 0) in st.shape]
                    decs = [kv for q, kv in steps[0].shape if q == 1 and kv > 0] if steps else []
                    if len(steps) != 1 or len(steps[0].shape) != b + 1 or len(decs) != b:
                        raise PipelineError(
                            f"mixed probe {key}: the engine scheduled "
                            f"{[st.shape for st in steps]}, not {b} decodes and one chunk of {p}"
                        )
                    if rep >= warm:
                        mixed_times.setdefault(key, []).append(steps[0].duration_s)
                        mixed_kv.setdefault(key, []).append(float(sum(kv + 1 for kv in decs)))
                wait_results(manager, b)
                done += 1
                if progress is not None:
                    progress(done)
        for (b, c, p), times in mixed_times.items():
            mixed_rows.append(
                {
                    "decode_batch": b,
                    "decode_kv_tokens": float(np.median(mixed_kv[(b, c, p)])),
                    "prompt_tokens": p,
                    "time_ms": float(np.median(times) * 1000.0),
                }
            )
        for (b, p), times in prefill_times.items():
            rows.append(_row("prefill", b, p, 0, times, model_name, gpu))
        for (b, c), times in decode_times.items():
            rows.append(_row("decode", b, 0, decode_context[(b, c)], times, model_name, gpu))
    finally:
        manager.stop(block=True, timeout=60)
    mixed = pl.DataFrame(
        mixed_rows,
        schema={
            "decode_batch": pl.Int64,
            "decode_kv_tokens": pl.Float64,
            "prompt_tokens": pl.Int64,
            "time_ms": pl.Float64,
        },
    )
    return pl.DataFrame(rows), mixed


def _only_step(rec: StepRecorder, want: list[tuple[int, int]], what: str) -> StepRecord:
    steps = [s for s in rec.steps if s.shape]
    if len(steps) != 1 or sorted(steps[0].shape) != sorted(want):
        got = [s.shape for s in steps]
        raise PipelineError(f"probe {what}: the engine scheduled {got}, not one step {want}")
    return steps[0]


def _row(
    phase: str, b: int, p: int, c: int, times: list[float], model: str, gpu: str
) -> dict[str, Any]:
    return {
        "phase": phase,
        "batch_size": b,
        "prompt_tokens": p,
        "context_tokens": c,
        "time_ms": float(np.median(times) * 1000.0),
        "model": model,
        "gpu": gpu,
        "tensor_parallel": 1,
    }


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return str(torch.cuda.get_device_name(device))
    return "cpu"
