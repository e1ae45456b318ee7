"""The in-process engine: transformers' continuous batching, driven open loop.

``run_inprocess`` builds (or loads) the model, starts the continuous-batching manager
(``model.init_continuous_batching``) with explicit settings, adds each request at its
arrival time from the calling thread (a feeder: open loop, it never waits for results)
while a collector thread takes finished requests (``get_result``), and always stops the
manager in a ``finally``.

Settings are explicit so the simulator can be given the same ones (``engine_info``):

- ``num_blocks`` KV blocks of ``block_size`` tokens (``page_size`` from 5.18 on), no
  block sharing (prompts are random ids: nothing to share, and the simulator's
  ``transformers`` policy has no prefix cache), no CPU offloading (a starved request is
  soft reset: recomputed);
- ``max_batch_tokens`` tokens per step; ``scheduler`` ``fifo`` or ``prefill_first``;
- synchronous batching and no CUDA graphs, so one step is one forward pass of exactly
  the scheduled tokens (what the probes time);
- EOS disabled (``eos_token_id=-1``), greedy, so every request generates exactly its
  logged output length.

Times (seconds from the replay start, ``time.perf_counter``): ``sent_s`` when
``add_request`` returned, ``first_scheduled_s`` when the engine moved the request out of
PENDING (its ``lifespan[0]``), ``first_token_s`` / ``finished_s`` the first / last token
timestamps (``record_timestamps=True``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import ConfigError
from pipeline.live.model import LoadedModel, load_model, random_prompts
from pipeline.live.types import LiveBatch, LiveResult

SCHEDULERS = ("fifo", "prefill_first")
DEFAULTS: dict[str, Any] = {
    "num_blocks": 256,
    "block_size": 32,
    "max_batch_tokens": 256,
    "scheduler": "fifo",
    "max_requests_per_batch": 256,
}


def cb_config(
    *,
    num_blocks: int,
    block_size: int,
    max_batch_tokens: int,
    scheduler: str,
    max_requests_per_batch: int,
) -> Any:
    """A ContinuousBatchingConfig for 5.17 (``block_size``) and later (``page_size``)."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    if scheduler not in SCHEDULERS:
        raise ConfigError(f"unknown scheduler {scheduler!r}; allowed: {', '.join(SCHEDULERS)}")
    for name, value in (
        ("num_blocks", num_blocks),
        ("block_size", block_size),
        ("max_batch_tokens", max_batch_tokens),
        ("max_requests_per_batch", max_requests_per_batch),
    ):
        if int(value) <= 0:
            raise ConfigError(f"{name} must be > 0, got {value}")
    names = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    kwargs: dict[str, Any] = {
        "num_blocks": int(num_blocks),
        "max_batch_tokens": int(max_batch_tokens),
        "scheduler_type": scheduler,
        "max_requests_per_batch": int(max_requests_per_batch),
        "allow_block_sharing": False,
        "use_async_batching": False,
        "use_cuda_graph": False,
        "cpu_offload_space": 0.0,
    }
    kwargs["page_size" if "page_size" in names else "block_size"] = int(block_size)
    if "auto_switch_to_flash" in names:
        kwargs["auto_switch_to_flash"] = False
    return ContinuousBatchingConfig(**{k: v for k, v in kwargs.items() if k in names})


def engine_info(loaded: LoadedModel, manager: Any, settings: dict[str, Any]) -> dict[str, str]:
    import torch
    import transformers

    info = {
        "engine": "inprocess",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "model": loaded.name,
        "weights": loaded.weights,
        "num_parameters": str(loaded.num_parameters),
        "device": loaded.device,
        "dtype": loaded.dtype,
        "attn_implementation": str(getattr(loaded.model.config, "_attn_implementation", "")),
    }
    if loaded.device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(loaded.device)
    info.update({k: str(v) for k, v in settings.items()})
    cache = getattr(getattr(manager, "batch_processor", None), "cache", None)
    if cache is not None:  # what the engine actually allocated
        info["num_blocks_effective"] = str(int(cache.num_blocks))
    return info


def run_inprocess(
    batch: LiveBatch,
    *,
    model: str | Path | None = None,
    num_blocks: int = DEFAULTS["num_blocks"],
    block_size: int = DEFAULTS["block_size"],
    max_batch_tokens: int = DEFAULTS["max_batch_tokens"],
    scheduler: str = DEFAULTS["scheduler"],
    max_requests_per_batch: int = DEFAULTS["max_requests_per_batch"],
    device: str | None = None,
    dtype: str | None = None,
    timeout_s: float | None = None,
    seed: int = 0,
    warmup: int = 2,
    loaded: LoadedModel | None = None,
    cpu_threads: int | None = 1,
) -> LiveResult:
    """Replay ``batch`` through transformers' continuous batching; see the module docstring.

    ``loaded`` reuses a model already built (repeated runs); else ``model`` names it
    (``pipeline.live.model``). ``timeout_s`` bounds the whole replay: requests not finished
    by then are recorded with an error. ``warmup`` requests run before the clock starts.
    ``cpu_threads`` sets torch's intra-op threads on CPU (1 by default: on a shared machine
    more threads spin against each other and make step times erratic; None leaves torch's).
    """
    import torch
    from transformers import GenerationConfig

    if loaded is None:
        loaded = load_model(model, device=device, dtype=dtype, seed=seed)
    if loaded.device == "cpu" and cpu_threads is not None:
        torch.set_num_threads(int(cpu_threads))
    settings: dict[str, Any] = {
        "num_blocks": num_blocks,
        "block_size": block_size,
        "max_batch_tokens": max_batch_tokens,
        "scheduler": scheduler,
        "max_requests_per_batch": max_requests_per_batch,
    }
    cbc = cb_config(**settings)
    n = len(batch)
    vocab = int(loaded.model.config.vocab_size)
    capacity = int(num_blocks) * int(block_size)
    too_long = np.flatnonzero(batch.prompt_tokens + batch.output_tokens > capacity)
    prompts = random_prompts(batch.prompt_tokens, vocab, seed)
    gen = GenerationConfig(do_sample=False, eos_token_id=-1, max_new_tokens=1)
    result = LiveResult.empty(n)
    index = {rid: k for k, rid in enumerate(batch.request_id)}
    manager = loaded.model.init_continuous_batching(
        generation_config=gen, continuous_batching_config=cbc
    )
    done = threading.Event()
    outputs: dict[str, Any] = {}
    died: list[str] = []
    expected = n - len(too_long)
    try:
        manager.start()
        for j in range(warmup):  # first forwards pay one-off costs: keep them off the clock
            wid = f"__warmup{j}"
            manager.add_request(
                prompts[0][:8] if n else [1, 2, 3],
                request_id=wid,
                max_new_tokens=2,
                eos_token_id=-1,
            )
            manager.get_result(request_id=None, timeout=60)

        def collect() -> None:
            while len(outputs) < expected and not done.is_set():
                out = manager.get_result(timeout=0.05)
                if out is not None and out.request_id in index:
                    outputs[out.request_id] = out
                elif out is None and not manager.is_running():  # the engine thread died
                    status = getattr(manager, "background_thread_status", None)
                    fatal = getattr(status, "fatal_error", None)
                    died.append(" ".join(f"engine stopped: {fatal}".split())[:300])
                    break
            done.set()

        t0 = time.perf_counter()
        collector = threading.Thread(target=collect, name="inprocess-collector", daemon=True)
        collector.start()
        deadline = None if timeout_s is None else t0 + timeout_s
        skip = set(int(k) for k in too_long)
        for k in range(n):
            if k in skip:
                result.error[k] = (
                    f"prompt + output ({batch.prompt_tokens[k] + batch.output_tokens[k]} tokens) "
                    f"exceeds the KV cache ({capacity} tokens); raise num_blocks"
                )
                continue
            target = t0 + float(batch.arrival_s[k])
            while True:
                wait = target - time.perf_counter()
                if wait <= 0:
                    break
                time.sleep(min(wait, 0.05))
            if done.is_set() or (deadline is not None and time.perf_counter() > deadline):
                break
            manager.add_request(
                prompts[k],
                request_id=batch.request_id[k],
                max_new_tokens=int(batch.output_tokens[k]),
                record_timestamps=True,
                eos_token_id=-1,
            )
            result.sent_s[k] = time.perf_counter() - t0
        remaining = None if deadline is None else max(0.0, deadline - time.perf_counter())
        collector.join(remaining)
        done.set()
        collector.join(1.0)
    finally:
        done.set()
        info = engine_info(loaded, manager, settings)
        manager.stop(block=True, timeout=30)
    for rid, out in list(outputs.items()):
        k = index[rid]
        if out.error:
            result.error[k] = " ".join(str(out.error).split())[:300]
            continue
        ts = np.asarray(out.timestamps or [], dtype=np.float64) - t0
        result.output_tokens_received[k] = len(out.generated_tokens)
        if out.lifespan[0] > 0:
            result.first_scheduled_s[k] = out.lifespan[0] - t0
        if len(ts):
            result.first_token_s[k] = ts[0]
            result.finished_s[k] = ts[-1]
        if len(ts) >= 2:
            gaps = np.diff(ts)
            result.itl_mean_s[k] = float(gaps.mean())
            result.itl_max_s[k] = float(gaps.max())
        if len(out.generated_tokens) != int(batch.output_tokens[k]):
            result.error[k] = (
                f"generated {len(out.generated_tokens)} tokens, asked for {batch.output_tokens[k]}"
            )
    for k in range(n):
        if result.error[k] is None and batch.request_id[k] not in outputs:
            if died:
                result.error[k] = died[0]
            else:
                result.error[k] = (
                    "not sent before the timeout" if np.isnan(result.sent_s[k]) else "timed out"
                )
    if loaded.device == "cpu":
        info["cpu_threads"] = str(torch.get_num_threads())
    result.engine_info = info
    return result
