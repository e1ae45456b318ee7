"""``calibrate live``: time designed step shapes on the in-process engine, fit a profile.

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
hit every repeat of one shape. Rows go to a measurements file in the
``calibrate measurements`` schema, and the profile is fitted with the same fit
(``fit.calibrate``), starting from a profile derived from the probes themselves (there
is no datasheet for "this model on this machine"); its provenance names the engine,
the torch and transformers versions, the device and the dtype.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from pipeline.errors import PipelineError

DECODE_CONTEXT_SLACK = 2  # prompt c - 1, then contexts c .. c + warmup + repeats
MIXED_DECODE_TOKENS = 120  # what the decodes of a mixed probe generate (they outlast it)


@dataclass(frozen=True)
class ProbeDesign:
    """The step shapes to time."""

    prefill_tokens: tuple[int, ...] = (8, 32, 64, 128, 256, 512)
    prefill_batches: tuple[int, ...] = (1, 2, 4)
    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    decode_contexts: tuple[int, ...] = (16, 128, 512, 1024)
    repeats: int = 5
    warmup: int = 1
    max_batch_tokens: int = 2048  # prefill shapes above it are left out
    rounds: int = 3  # passes over all the shapes; a row is the median of every repeat
    # mixed steps: decodes of (batch, context) plus one prompt chunk of these sizes
    mixed_batches: tuple[int, ...] = (1, 4, 16)
    mixed_contexts: tuple[int, ...] = (128, 512)
    mixed_prompts: tuple[int, ...] = (32, 128, 512)

    def prefill_shapes(self) -> list[tuple[int, int]]:
        return [
            (b, p)
            for p in self.prefill_tokens
            for b in self.prefill_batches
            if b * p <= self.max_batch_tokens
        ]

    def mixed_shapes(self) -> list[tuple[int, int, int]]:
        return [
            (b, c, p)
            for b in self.mixed_batches
            for c in self.mixed_contexts
            for p in self.mixed_prompts
            if b + p <= self.max_batch_tokens
        ]

    def decode_shapes(self) -> list[tuple[int, int]]:
        return [(b, c) for c in self.decode_contexts for b in self.decode_batches]

    def kv_tokens(self) -> int:
        """KV-cache tokens the largest shape needs."""
        decode = max(
            (b * (c + self.warmup + self.repeats + DECODE_CONTEXT_SLACK))
            for b, c in self.decode_shapes()
        )
        prefill = max(b * (p + 1) for b, p in self.prefill_shapes())
        mixed = max(
            (b * (c + MIXED_DECODE_TOKENS) + p + 1 for b, c, p in self.mixed_shapes()), default=0
        )
        return max(decode, prefill, mixed)


DESIGNS: dict[str, ProbeDesign] = {
    # CPU with a tiny or small model: seconds to minutes
    "cpu": ProbeDesign(),
    # a quick check (tests)
    "smoke": ProbeDesign(
        prefill_tokens=(8, 64),
        prefill_batches=(1, 2),
        decode_batches=(1, 4),
        decode_contexts=(16, 64),
        repeats=3,
        warmup=1,
        max_batch_tokens=256,
        rounds=1,
        mixed_batches=(2,),
        mixed_contexts=(32,),
        mixed_prompts=(16, 64),
    ),
    # a GPU with a 7-8B model: shapes that fill its compute and memory bandwidth
    "gpu": ProbeDesign(
        prefill_tokens=(16, 64, 256, 512, 1024, 2048, 4096),
        prefill_batches=(1, 2, 4),
        decode_batches=(1, 4, 16, 32, 64, 128),
        decode_contexts=(128, 512, 1024, 2048),
        repeats=5,
        warmup=2,
        max_batch_tokens=8192,
        rounds=2,
        mixed_batches=(4, 32),
        mixed_contexts=(512, 2048),
        mixed_prompts=(256, 2048),
    ),
}


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


def _gate(manager: Any, rec: StepRecorder, prompts: list[list[int]], out: int) -> None:
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


def _wait_results(manager: Any, n: int) -> None:
    for _ in range(n):
        res = manager.get_result(timeout=120)
        if res is None:
            raise PipelineError("the engine stopped answering during the probes")
        if res.error:
            raise PipelineError(f"probe request failed in the engine: {res.error}")


def _release_together(manager: Any, rec: StepRecorder, prompts: list[list[int]], out: int) -> None:
    """Queue ``prompts`` so that the next step schedules all of them, and wait for the results."""
    _gate(manager, rec, prompts, out)
    _wait_results(manager, len(prompts))


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
        _release_together(manager, rec, [rng.integers(1, vocab, 16).tolist()] * 2, 3)
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
                    _release_together(manager, rec, prompts, 1)
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
                _release_together(manager, rec, prompts, 1 + want + skew)
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
                _gate(manager, rec, decoders, MIXED_DECODE_TOKENS)
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
                    _release_together(manager, rec, [rng.integers(1, vocab, p).tolist()], 1)
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
                _wait_results(manager, b)
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


def mixed_features(mixed: pl.DataFrame) -> Any:
    """The cost model's step features of the mixed rows: one prompt chunk plus decodes."""
    from pipeline.calibrate.features import StepFeatures

    p = mixed["prompt_tokens"].to_numpy().astype(np.float64)
    b = mixed["decode_batch"].to_numpy().astype(np.float64)
    c = mixed["decode_kv_tokens"].to_numpy().astype(np.float64)
    return StepFeatures(P=p, A=(p + b) * (p + c) - c, N=b + 1.0, D=b, C=c)


def packed_features(m: Any) -> Any:
    """The features of pure probe rows with the attention of the transformers engine.

    Its attention runs over the packed batch (policies/transformers.py): every query of
    the step against every key of the step's sequences, A = (P + D) * K - C.
    """
    from pipeline.calibrate.features import StepFeatures

    b, p, c = m.batch_size, m.prompt_tokens, m.context_tokens
    pre = m.is_prefill
    tokens = np.where(pre, b * p, b)
    keys = np.where(pre, b * (c + p), b * c)
    ctx = np.where(pre, 0.0, b * c)
    return StepFeatures(
        P=np.where(pre, b * p, 0.0),
        A=tokens * keys - ctx,
        N=b.astype(np.float64),
        D=np.where(pre, 0.0, b),
        C=ctx,
    )


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return str(torch.cuda.get_device_name(device))
    return "cpu"


def start_profile(loaded: Any, rows: pl.DataFrame, *, name: str) -> dict[str, Any]:
    """A profile to start the fit from, derived from the model's shape and the probes.

    Its coefficients come from least squares on the probe rows with one term per
    feature (per-step, per-token, per-attention-pair, per-KV-token, per-sequence),
    clipped to be positive: the fit then moves each by a factor, as it does from a
    datasheet profile.
    """
    cfg = loaded.model.config
    layers = int(cfg.num_hidden_layers)
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    dtype_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}.get(loaded.dtype, 4)
    kv_bytes = 2 * layers * kv_heads * head_dim * dtype_bytes
    weight_bytes = int(loaded.num_parameters) * dtype_bytes
    if loaded.device.startswith("cuda"):
        import torch

        memory_bytes = int(torch.cuda.get_device_properties(loaded.device).total_memory)
    else:
        memory_bytes = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    b = rows["batch_size"].to_numpy().astype(float)
    p = rows["prompt_tokens"].to_numpy().astype(float)
    c = rows["context_tokens"].to_numpy().astype(float)
    pre = (rows["phase"] == "prefill").to_numpy()
    t = rows["time_ms"].to_numpy() / 1000.0
    tokens = np.where(pre, b * p, b)
    attn = tokens * np.where(pre, b * p, b * c)  # packed (query, key) pairs
    kv = np.where(pre, 0.0, b * c)
    x = np.column_stack([np.ones_like(t), tokens, attn, kv, b])
    coef, *_ = np.linalg.lstsq(x / t[:, None], np.ones_like(t), rcond=None)  # relative error
    floor = float(np.min(t))
    fixed = max(float(coef[0]), 0.2 * floor)
    per_token = max(float(coef[1]), 0.01 * floor / max(float(tokens.max()), 1.0))
    per_attn = max(float(coef[2]), 1e-3 * per_token / max(float(p.max()), 1.0))
    per_kv = max(float(coef[3]), 1e-3 * per_token)
    coefficients = {
        "fixed_s": fixed,
        "comm_s_fixed": 0.0,
        "seq_s": max(float(coef[4]), 0.0),
        "flop_s_per_token": per_token,
        "flop_tokens_half": 0.0,
        "flop_s_per_attn": per_attn,
        "mem_s_weights": 0.5 * fixed,
        "mem_s_per_kv_token": per_kv,
        "mem_s_per_token": 0.1 * per_token,
        "comm_s_per_token": 0.0,
        "overlap": 0.0,
    }
    max_len = int(getattr(cfg, "max_position_embeddings", 4096))
    return {
        "name": name,
        "cost_model_version": 2,
        "model": {
            "name": loaded.name,
            "num_layers": layers,
            "hidden_size": int(cfg.hidden_size),
            "num_heads": heads,
            "num_kv_heads": kv_heads,
            "head_dim": head_dim,
            "intermediate_size": int(getattr(cfg, "intermediate_size", 0)),
            "vocab_size": int(cfg.vocab_size),
            "dtype_bytes": dtype_bytes,
            "max_model_len": max_len,
        },
        "gpu": {"name": device_name(loaded.device), "memory_bytes": memory_bytes},
        "tensor_parallel": 1,
        "coefficients": coefficients,
        "memory": {
            "kv_bytes_per_token": kv_bytes,
            "weight_bytes": weight_bytes,
            "gpu_memory_bytes": memory_bytes,
            "reserve_bytes": 0,
            "max_model_len": max_len,
        },
    }


@dataclass
class LiveCalibration:
    profile: dict[str, Any]
    measurements_path: Path
    output: Path
    rows: pl.DataFrame
    mixed: pl.DataFrame
    fit: Any  # fit.FitResult


def calibrate_live(
    output: Path,
    *,
    model: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    design: ProbeDesign | str = "cpu",
    block_size: int = 32,
    seed: int = 0,
    cpu_threads: int | None = 1,
    loaded: Any = None,
    progress: Any = None,
) -> LiveCalibration:
    """Probe the in-process engine, write ``<output stem>.measurements.csv`` and the profile."""
    import torch
    import transformers

    from pipeline.calibrate.features import StepFeatures
    from pipeline.calibrate.fit import as_vector, calibrate, phase_errors, predict
    from pipeline.calibrate.measurements import Measurements, read_measurements
    from pipeline.calibrate.profile import calibrated_profile, write_profile
    from pipeline.live.model import load_model

    if isinstance(design, str):
        if design not in DESIGNS:
            raise PipelineError(f"unknown probe design {design!r}; allowed: {', '.join(DESIGNS)}")
        design = DESIGNS[design]
    if loaded is None:
        loaded = load_model(model, device=device, dtype=dtype, seed=seed)
    if loaded.device == "cpu" and cpu_threads is not None:
        torch.set_num_threads(int(cpu_threads))
    rows, mixed = run_probes(loaded, design, block_size=block_size, seed=seed, progress=progress)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    mpath = output.with_name(f"{output.stem}.measurements.csv")
    rows.write_csv(mpath)
    mixed_path = output.with_name(f"{output.stem}.mixed.csv")
    mixed.write_csv(mixed_path)
    m = read_measurements(mpath)
    like = start_profile(loaded, rows, name=f"{output.stem}.start")
    fm = mixed_features(mixed)
    tm = mixed["time_ms"].to_numpy() / 1000.0
    both = Measurements(
        path=m.path,
        sha256=m.sha256,
        is_prefill=np.concatenate([m.is_prefill, np.ones(len(tm), dtype=bool)]),
        batch_size=np.concatenate([m.batch_size, fm.N]),
        prompt_tokens=np.concatenate([m.prompt_tokens, fm.P]),
        context_tokens=np.concatenate([m.context_tokens, np.zeros(len(tm))]),
        time_s=np.concatenate([m.time_s, tm]),
    )
    pure = packed_features(m)
    features = StepFeatures(
        *(np.concatenate([getattr(pure, k), getattr(fm, k)]) for k in ("P", "A", "N", "D", "C"))
    )
    result = calibrate(both, features, like["coefficients"], cv=None)
    coeffs = as_vector(result.coefficients)
    result.fit_error = phase_errors(predict(coeffs, pure), m.time_s, m.is_prefill)
    result.like_error = phase_errors(
        predict(as_vector(like["coefficients"]), pure), m.time_s, m.is_prefill
    )
    if len(tm):
        mixed_err = phase_errors(predict(coeffs, fm), tm, np.ones(len(tm), dtype=bool))
        result.fit_error["mixed"] = mixed_err["prefill"]
    profile = calibrated_profile(like, like["name"], output.stem, result, m)
    profile["provenance"]["method"] = "in-process engine probes (engine steps), fitted"
    profile["provenance"]["mixed_source_file"] = str(mixed_path)
    # A counts (query, key) pairs over the packed batch: a profile for the transformers policy
    profile["provenance"]["attention"] = "packed (policy transformers)"
    profile["provenance"]["engine"] = {
        "engine": "inprocess",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "device": loaded.device,
        "gpu": device_name(loaded.device),
        "dtype": loaded.dtype,
        "model": loaded.name,
        "weights": loaded.weights,
        "num_parameters": loaded.num_parameters,
        "block_size": block_size,
        "cpu_threads": torch.get_num_threads() if loaded.device == "cpu" else None,
        "design": {
            "prefill": design.prefill_shapes(),
            "decode": design.decode_shapes(),
            "repeats": design.repeats,
            "warmup": design.warmup,
        },
    }
    write_profile(profile, output)
    return LiveCalibration(profile, mpath, output, rows, mixed, result)
