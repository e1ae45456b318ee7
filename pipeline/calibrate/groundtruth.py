"""Real engine runs as ground truth: what a published benchmark run sent, how the engine was
set up, and what it measured, read from the files the benchmark wrote.

Two formats (docs/fidelity.md has what each holds and its quirks):

``llmservingsim``  a run of LLMServingSim's ``bench`` (vLLM driven in process through
                   AsyncLLM): ``vllm/meta.json`` (engine settings, KV blocks, device),
                   ``vllm/requests.jsonl`` (per request: vLLM's RequestStateStats
                   timestamps), the workload JSONL it replayed (token ids and arrival
                   times), and ``validation/summary.txt`` (LLMServingSim's own prediction of
                   the run). Timed at the engine core: TTFT = first token - queued.
``inference-perf`` an experiment of inference-perf against a vLLM HTTP server:
                   ``exp-config.yaml`` (engine settings), ``results/config.yaml`` (the
                   load generator's resolved configuration: stages, the shared-prefix data
                   set), ``results/stage_N_lifecycle_metrics.json`` (per load stage:
                   count, failures, mean / median / p90 / p99 of TTFT, E2E, TPOT, ITL).
                   Timed by the client over HTTP. There are no per-request arrivals: the
                   fixed-interval schedule and the shared-prefix prompts are regenerated
                   from the configuration (``shared_prefix_workload``).

``read_run`` tells the two apart and returns a ``GroundTruthRun``: the engine settings as
scenario keys, the model shape and GPU in the simulator's tables, and one ``Stage`` per
load level with the requests to replay and the measured statistics. A file that is missing
or malformed raises ``ConfigError`` naming it and what is wrong.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.errors import ConfigError

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

STATS = ("p50", "p90", "p99", "mean")
METRICS = ("ttft_s", "tpot_s", "e2e_s")
BLOCK = 16  # tokens per hashed block of the regenerated and re-hashed prompts

# Model names the benchmarks record -> the simulator's model shapes (_models.json).
MODELS = {
    "meta-llama/llama-2-7b-hf": "llama-2-7b",
    "meta-llama/llama-2-70b-hf": "llama-2-70b",
    "mistralai/mixtral-8x7b-v0.1": "mixtral-8x7b",
    "codellama/codellama-34b-instruct-hf": "codellama-34b",
    "meta-llama/llama-3.1-8b": "llama-3.1-8b",
    "qwen/qwen3-32b": "qwen3-32b",
    "qwen/qwen3-30b-a3b-instruct-2507": "qwen3-30b-a3b",
}
# Devices the benchmarks record -> the simulator's GPUs (_gpus.json).
DEVICES = {
    "nvidia geforce rtx 4090": "rtx-4090",
    "nvidia rtx pro 6000 blackwell server edition": "rtx-pro-6000",
    "nvidia h100 80gb hbm3": "h100-80gb",
}
# LLMServingSim's hardware directory names -> GPUs (their meta.json records no device).
HARDWARE_DIRS = {"RTX4090": "rtx-4090", "RTXPRO6000": "rtx-pro-6000"}


@dataclass
class Requests:
    """What one run sent, in arrival order."""

    arrival_s: F64  # seconds from the run's first request
    prompt_tokens: I64
    output_tokens: I64
    block_size: int  # tokens per entry of prefix_hashes
    prefix_hashes: list[list[int]]  # per request: chained hashes of its full prompt blocks
    output_hashes: list[list[int]] = field(default_factory=list)  # ... of its generated blocks

    def __len__(self) -> int:
        return len(self.arrival_s)


@dataclass
class Stage:
    """One load level of a run: the requests that arrived in [start_s, end_s) and what the
    engine measured for them."""

    index: int
    rate: float | None  # offered req/s (None: the trace's own)
    start_s: float
    end_s: float
    measured: dict[str, dict[str, float]]  # metric -> stat -> seconds (METRICS x STATS)
    count: int  # requests measured (successes)
    failures: int = 0
    throughput: dict[str, float] = field(default_factory=dict)  # requests_per_s, ...
    # per request (llmservingsim only): measured ttft_s / tpot_s / e2e_s, in request order
    per_request: dict[str, F64] = field(default_factory=dict)


@dataclass
class GroundTruthRun:
    """A real engine run: its settings, its traffic and what it measured, stage by stage."""

    name: str
    source: str  # llmservingsim | inference-perf
    model: str  # a model of _models.json
    gpu: str  # a GPU of _gpus.json
    tensor_parallel: int
    replicas: int  # data-parallel engines
    expert_parallel: int  # 1, or the EP degree of an MoE across the replicas' GPUs
    timing: str  # engine (in process, at the core) | client (over HTTP)
    scenario: dict[str, Any]  # scenario keys of the engine's recorded settings
    requests: Requests
    stages: list[Stage]
    engine_version: str = ""
    peer: dict[str, dict[str, float]] = field(default_factory=dict)  # peer's prediction
    peer_name: str = ""
    notes: list[str] = field(default_factory=list)
    path: Path = Path()

    @property
    def label(self) -> str:
        return self.name


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(_text(path))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None


def _read_yaml(path: Path) -> Any:
    import yaml

    try:
        return yaml.safe_load(_text(path))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None


def _need(obj: Any, key: str, path: Path, kind: type | tuple[type, ...] = object) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise ConfigError(f"{path}: missing key {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ConfigError(
            f"{path}: key {key!r} has {value!r}, not a {getattr(kind, '__name__', kind)}"
        )
    return value


def _model(name: str, path: Path) -> str:
    key = MODELS.get(name.strip().lower())
    if key is None:
        raise ConfigError(
            f"{path}: model {name!r} has no shape in the simulator's table; known: "
            + ", ".join(sorted(MODELS))
        )
    return key


def stats_of(x: F64) -> dict[str, float]:
    """p50, p90, p99 and mean of the finite values (linear interpolation)."""
    x = x[np.isfinite(x)]
    if not len(x):
        return {s: math.nan for s in STATS}
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(x.mean())}


def tpot_of(ttft: F64, e2e: F64, output: I64) -> F64:
    """(E2E - TTFT) / (output - 1), NaN for one token (vLLM's definition)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(output > 1, (e2e - ttft) / np.maximum(output - 1, 1), np.nan)


# --- LLMServingSim -----------------------------------------------------------------------


def _peer_summary(path: Path) -> dict[str, dict[str, float]]:
    """LLMServingSim's own prediction from validation/summary.txt (ms in the file)."""
    names = {"TTFT": "ttft_s", "TPOT": "tpot_s", "Latency": "e2e_s"}
    stats = {"Mean": "mean", "Median": "p50", "P90": "p90", "P99": "p99"}
    out: dict[str, dict[str, float]] = {}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        m = re.match(r"^(TTFT|TPOT|Latency) (Mean|Median|P90|P95|P99)\s+([\d.]+)\s+([\d.]+)", line)
        if m and m.group(2) in stats:
            out.setdefault(names[m.group(1)], {})[stats[m.group(2)]] = float(m.group(4)) / 1e3
    return out


def read_llmservingsim(run_dir: Path, workloads: Path | None = None) -> GroundTruthRun:
    """One run directory of LLMServingSim's bench (``<hardware>/<model>/``).

    ``workloads`` is the directory of the workload JSONL files (default: ``workloads/`` two
    levels above the run's ``bench/examples`` directory, as the repository lays it out).
    The run is replayed at the times vLLM queued each request (its ``queued_ts``), with the
    prompts' block hashes computed from the workload's token ids the way vLLM hashes them.
    """
    from pipeline.ingest.hashing import prefix_hashes

    run_dir = Path(run_dir)
    meta_path = run_dir / "vllm" / "meta.json"
    meta = _read_json(meta_path)
    kwargs = _need(meta, "engine_kwargs", meta_path, dict)
    dataset = Path(str(_need(meta, "dataset_path", meta_path, str)))
    if workloads is None:
        workloads = run_dir.parents[2] / "workloads"
    wl_path = Path(workloads) / dataset.name
    lines = _jsonl(wl_path)
    req_path = run_dir / "vllm" / "requests.jsonl"
    measured = _jsonl(req_path)
    if len(measured) != len(lines):
        raise ConfigError(
            f"{req_path}: {len(measured)} requests but the workload {wl_path} has {len(lines)}"
        )
    order = sorted(range(len(measured)), key=lambda i: _index(measured[i], req_path))
    measured = [measured[i] for i in order]
    queued = np.array([float(_need(r, "queued_ts", req_path, (int, float))) for r in measured])
    first = np.array([float(_need(r, "first_token_ts", req_path, (int, float))) for r in measured])
    last = np.array([float(_need(r, "last_token_ts", req_path, (int, float))) for r in measured])
    out = np.array([int(_need(r, "output_toks", req_path, int)) for r in measured])
    prompt = np.array([int(_need(r, "input_toks", req_path, int)) for r in measured])
    ttft, e2e = first - queued, last - queued
    tpot = tpot_of(ttft, e2e, out)
    t0 = float(queued.min())
    arrival = queued - t0
    sort = np.argsort(arrival, kind="stable")
    hashes = [prefix_hashes(w["input_tok_ids"], BLOCK).tolist() for w in lines]
    outputs = [
        prefix_hashes(list(w["input_tok_ids"]) + list(w.get("output_tok_ids", [])), BLOCK).tolist()[
            len(h) :
        ]
        for w, h in zip(lines, hashes, strict=True)
    ]
    reqs = Requests(
        arrival_s=arrival[sort],
        prompt_tokens=prompt[sort].astype(np.int64),
        output_tokens=out[sort].astype(np.int64),
        block_size=BLOCK,
        prefix_hashes=[hashes[i] for i in sort],
        output_hashes=[outputs[i] for i in sort],
    )
    per = {"ttft_s": ttft[sort], "tpot_s": tpot[sort], "e2e_s": e2e[sort]}
    span = float(arrival.max()) if len(arrival) else 0.0
    stage = Stage(
        index=0,
        rate=None,
        start_s=0.0,
        end_s=math.nextafter(span, math.inf),
        measured={m: stats_of(v) for m, v in per.items()},
        count=len(reqs),
        per_request=per,
        throughput={"requests_per_s": len(reqs) / float(last.max() - t0)},
    )
    kv = meta.get("kv_cache") or {}
    hardware = meta.get("hardware") or {}
    device = str(hardware.get("device_name", "")).strip().lower()
    gpu = DEVICES.get(device) or HARDWARE_DIRS.get(run_dir.parent.name)
    if gpu is None:
        raise ConfigError(f"{meta_path}: no device name and an unknown hardware directory")
    tp = int(kwargs.get("tensor_parallel_size") or 1)
    dp = int(kwargs.get("data_parallel_size") or 1)
    ep = dp * tp if kwargs.get("enable_expert_parallel") else 1
    scenario: dict[str, Any] = {
        "policy": "vllm",
        "max_num_seqs": int(_need(kwargs, "max_num_seqs", meta_path, int)),
        "max_num_batched_tokens": int(_need(kwargs, "max_num_batched_tokens", meta_path, int)),
        "enable_chunked_prefill": True,
        "enable_prefix_caching": bool(kv.get("enable_prefix_caching", True)),
        "block_size": int(kv.get("block_size") or BLOCK),
        "replicas": dp,
    }
    if kwargs.get("max_model_len"):
        scenario["max_model_len"] = int(kwargs["max_model_len"])
    if kv.get("num_gpu_blocks"):
        scenario["num_gpu_blocks"] = int(kv["num_gpu_blocks"])
    if kv.get("gpu_memory_utilization"):
        scenario["gpu_memory_utilization"] = float(kv["gpu_memory_utilization"])
    if dp > 1:
        scenario["router"] = "least_outstanding"
    notes = []
    if "num_gpu_blocks" not in scenario:
        notes.append("KV blocks not recorded: derived from GPU memory")
    return GroundTruthRun(
        name=f"{run_dir.parent.name}/{run_dir.name}",
        source="llmservingsim",
        model=_model(str(_need(meta, "model", meta_path, str)), meta_path),
        gpu=gpu,
        tensor_parallel=tp,
        replicas=dp,
        expert_parallel=ep,
        timing="engine",
        scenario=scenario,
        requests=reqs,
        stages=[stage],
        engine_version=f"vLLM {meta.get('vllm_version', '?')}",
        peer=_peer_summary(run_dir / "validation" / "summary.txt"),
        peer_name="LLMServingSim",
        notes=notes,
        path=run_dir,
    )


def _jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    for n, line in enumerate(_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: line {n}: not valid JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise ConfigError(f"{path}: line {n}: not a JSON object")
        out.append(rec)
    return out


def _index(rec: dict[str, Any], path: Path) -> int:
    """The workload line of a measured request: its id is ``bench-<line>``."""
    m = re.search(r"(\d+)$", str(rec.get("request_id", "")))
    if not m:
        raise ConfigError(f"{path}: request id {rec.get('request_id')!r} names no workload line")
    return int(m.group(1))


# --- inference-perf ----------------------------------------------------------------------


def shared_prefix_workload(
    data: dict[str, Any],
    stages: list[tuple[float, float]],
    prompt_len_mean: float | None = None,
    seed: int = 0,
) -> tuple[Requests, list[tuple[float, float]]]:
    """inference-perf's shared-prefix data set at fixed-interval ("constant") arrivals.

    ``data`` is the ``shared_prefix`` section of its resolved configuration: ``num_groups``
    system prompts of ``system_prompt_len`` tokens, each with ``num_prompts_per_group``
    questions of ``question_len`` tokens, ``output_len`` tokens forced out (ignore_eos).
    Requests cycle through the ``num_groups * num_prompts_per_group`` prompts (in one
    shuffled order), so every prompt comes back, its blocks cached. ``stages`` are (rate
    req/s, duration s), run back to back. The prompts were random token ids decoded to text
    and tokenised again on the server, which makes them a few percent longer: with
    ``prompt_len_mean`` (the mean the server counted) each prompt's length is drawn around
    it (sd 8 tokens, the spread the measured prompt lengths show), else system + question.

    Returns the requests and each stage's [start, end) in seconds.
    """
    groups = int(data["num_groups"])
    per = int(data["num_prompts_per_group"])
    system = int(data["system_prompt_len"])
    question = int(data["question_len"])
    output = int(data["output_len"])
    rng = np.random.default_rng(seed)
    num = groups * per
    mean = prompt_len_mean if prompt_len_mean else float(system + question)
    lengths = np.maximum(np.round(rng.normal(mean, 8.0, num)), system + BLOCK).astype(np.int64)
    order = rng.permutation(num)  # the generator shuffles its prompts once
    arrival, windows, t = [], [], 0.0
    for rate, duration in stages:
        n = int(round(rate * duration))
        arrival.append(t + np.arange(n) / rate)
        windows.append((t, t + n / rate))
        t += n / rate
    times = np.concatenate(arrival) if arrival else np.zeros(0)
    idx = order[np.arange(len(times)) % num]
    prompt = lengths[idx]
    shared = system // BLOCK  # full blocks of the system prompt, shared within its group
    hashes = []
    for p, length in zip(idx, prompt, strict=True):
        g = int(p) // per
        blocks = int(length) // BLOCK
        # distinct synthetic chains: the group's system blocks, then the prompt's own
        chain = [_key(1, g, j) for j in range(min(shared, blocks))]
        chain += [_key(2, int(p), j) for j in range(shared, blocks)]
        hashes.append(chain)
    reqs = Requests(
        arrival_s=times,
        prompt_tokens=prompt,
        output_tokens=np.full(len(times), output, dtype=np.int64),
        block_size=BLOCK,
        prefix_hashes=hashes,
    )
    return reqs, windows


def _key(kind: int, a: int, b: int) -> int:
    """A deterministic 63-bit key for a synthetic block (no Python hash randomisation)."""
    x = (kind * 0x9E3779B97F4A7C15 + a * 0xBF58476D1CE4E5B9 + b * 0x94D049BB133111EB) % (1 << 64)
    x ^= x >> 31
    x = (x * 0xD6E8FEB86659FD93) % (1 << 64)
    return int(x ^ (x >> 32)) & ((1 << 63) - 1)


_IP_METRICS = {"time_to_first_token": "ttft_s", "request_latency": "e2e_s"}
_IP_STATS = {"median": "p50", "p90": "p90", "p99": "p99", "mean": "mean"}


def read_inference_perf(
    exp_dir: Path, kv_blocks: int | None = None, engine_version: str = ""
) -> GroundTruthRun:
    """One inference-perf experiment directory (``default_args/<experiment>/``).

    ``kv_blocks``: the engine's GPU KV blocks and ``engine_version`` the server's, where the
    experiment does not record them (a data set's README may give them).
    """
    exp_dir = Path(exp_dir)
    exp_path = exp_dir / "exp-config.yaml"
    exp = _read_yaml(exp_path)
    cfg_path = exp_dir / "results" / "config.yaml"
    cfg = _read_yaml(cfg_path)
    data = _need(_need(cfg, "data", cfg_path, dict), "shared_prefix", cfg_path, dict)
    load = _need(cfg, "load", cfg_path, dict)
    if load.get("type") != "constant":
        raise ConfigError(f"{cfg_path}: load type {load.get('type')!r}; only 'constant' is read")
    stage_specs = [
        (
            float(_need(s, "rate", cfg_path, (int, float))),
            float(_need(s, "duration", cfg_path, (int, float))),
        )
        for s in _need(load, "stages", cfg_path, list)
    ]
    results = []
    for i in range(len(stage_specs)):
        path = exp_dir / "results" / f"stage_{i}_lifecycle_metrics.json"
        res = _read_json(path)
        succ = _need(res, "successes", path, dict)
        _need(succ, "count", path, int)
        _need(succ, "latency", path, dict)
        results.append((path, res))
    prompt_mean = None
    lens = [(r["successes"].get("prompt_len") or {}).get("mean") for _, r in results]
    counts = [int(r["successes"]["count"]) for _, r in results]
    if all(isinstance(x, int | float) for x in lens) and sum(counts) > 0:
        prompt_mean = float(np.average(np.array(lens, dtype=np.float64), weights=counts))
    reqs, windows = shared_prefix_workload(data, stage_specs, prompt_mean)
    stages = []
    for i, ((path, res), (rate, _)) in enumerate(zip(results, stage_specs, strict=True)):
        succ = _need(res, "successes", path, dict)
        lat = _need(succ, "latency", path, dict)
        measured: dict[str, dict[str, float]] = {}
        for key, metric in _IP_METRICS.items():
            block = _need(lat, key, path, dict)
            measured[metric] = {s: float(block[k]) for k, s in _IP_STATS.items()}
        # inference-perf's own TPOT divides by output tokens it counts low (about 200 of
        # 248): TPOT here is (E2E - TTFT) / (output - 1) of the medians and the means,
        # exact for the p50 where every request has the same output length and TTFT is
        # a small share of E2E; no p90 / p99
        steps = max(int(data["output_len"]) - 1, 1)
        e, t = measured["e2e_s"], measured["ttft_s"]
        measured["tpot_s"] = {
            "p50": (e["p50"] - t["p50"]) / steps,
            "p90": math.nan,
            "p99": math.nan,
            "mean": (e["mean"] - t["mean"]) / steps,
        }
        fails = res.get("failures", {}).get("count", 0)
        stages.append(
            Stage(
                index=i,
                rate=rate,
                start_s=windows[i][0],
                end_s=windows[i][1],
                measured=measured,
                count=int(succ["count"]),
                failures=int(fails or 0),
                throughput={
                    k: float(v) for k, v in (succ.get("throughput") or {}).items() if v is not None
                },
            )
        )
    tp = int(exp.get("tensor_parallelism") or 1)
    scenario: dict[str, Any] = {
        "policy": "vllm",
        "max_num_seqs": int(_need(exp, "max_num_seqs", exp_path, int)),
        "max_num_batched_tokens": int(_need(exp, "max_num_batched_tokens", exp_path, int)),
        "max_model_len": int(_need(exp, "max_model_len", exp_path, int)),
        "enable_chunked_prefill": True,
        "enable_prefix_caching": True,
        "block_size": BLOCK,
    }
    if kv_blocks:
        scenario["num_gpu_blocks"] = int(kv_blocks)
    return GroundTruthRun(
        name=exp_dir.name,
        source="inference-perf",
        model=_model(str(_need(exp, "model", exp_path, str)), exp_path),
        gpu="h100-80gb",
        tensor_parallel=tp,
        replicas=1,
        expert_parallel=1,
        timing="client",
        scenario=scenario,
        requests=reqs,
        stages=stages,
        engine_version=engine_version,
        notes=[
            "arrivals and shared-prefix prompts regenerated from results/config.yaml",
            "TPOT p50 = (E2E p50 - TTFT p50) / (output - 1): the client's token counts run low",
        ],
        path=exp_dir,
    )
