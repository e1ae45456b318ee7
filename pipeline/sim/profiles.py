"""Step-cost profiles: the shipped ones, generated from the hardware tables, and loading any.

``generate_profiles`` writes one readable JSON profile per entry of ``PROFILE_MATRIX``
(every GPU of ``PROFILE_GPUS``), derived by the analytic roofline (``roofline``) from the
tables of ``hardware``, into ``profiles/<model>_<gpu>_tp<N>.json``. Regenerate them with
``tracereplay profile regenerate`` (``--check`` only compares). ``load_profile`` reads a
shipped profile by name, or any profile JSON file, into a ``Profile``.
docs/cost_model.md explains every term and what the defaults were checked against.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline import validation
from pipeline.errors import ScenarioError
from pipeline.sim.cost_model import COST_MODEL_VERSION, StepCost
from pipeline.sim.frontend import Frontend
from pipeline.sim.hardware import TABLE_DIR, load_efficiencies, load_gpus, load_models
from pipeline.sim.roofline import GENERATOR_VERSION, profile_dict, profile_name

PROFILE_DIR = TABLE_DIR
DEFAULT_PROFILE = "llama-3-8b_h100-80gb_tp1"

# GPUs the shipped profiles are generated for (_gpus.json has more, for `profile new`).
PROFILE_GPUS: tuple[str, ...] = ("a100-80gb", "h100-80gb", "h200")

# (model, tensor parallel degrees); every entry is generated for every GPU in PROFILE_GPUS.
# NOTE: llama-3-70b at tp1 does not fit in 80 GB (141 GB of weights): the profile exists so
# that its step time can be compared, and Profile.num_gpu_blocks raises for it.
PROFILE_MATRIX: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("llama-3-8b", (1,)),
    ("llama-3-70b", (1, 2, 4, 8)),
    ("mistral-7b", (1,)),
    ("qwen2.5-32b", (1, 2)),
)

# Profiles of single models on other GPUs: a fleet's cheaper pool (an L40S serving an
# 8B model at tp1; 48 GB does not hold the larger models at the degrees above).
PROFILE_EXTRA: tuple[tuple[str, str, int], ...] = (
    ("llama-3-8b", "l40s", 1),
    ("mistral-7b", "l40s", 1),
)


def build_profile(model_name: str, gpu_name: str, tp: int) -> dict[str, Any]:
    """A shipped profile: a model of _models.json on a GPU of _gpus.json."""
    provenance = {
        "method": "analytic roofline",
        "generator": "pipeline.sim.profiles",
        "generator_version": GENERATOR_VERSION,
    }
    return profile_dict(
        load_models()[model_name],
        load_gpus()[gpu_name],
        tp,
        load_efficiencies()[gpu_name],
        profile_name(model_name, gpu_name, tp),
        provenance,
    )


def expected_profiles() -> dict[str, dict[str, Any]]:
    """Every profile of PROFILE_MATRIX on every GPU, and of PROFILE_EXTRA, by name."""
    out = {}
    wanted = [
        (model_name, gpu_name, tp)
        for gpu_name in PROFILE_GPUS
        for model_name, tps in PROFILE_MATRIX
        for tp in tps
    ]
    for model_name, gpu_name, tp in wanted + list(PROFILE_EXTRA):
        profile = build_profile(model_name, gpu_name, tp)
        out[profile["name"]] = profile
    return out


def render(profile: dict[str, Any]) -> str:
    return json.dumps(profile, indent=2) + "\n"


def generate_profiles(out_dir: Path = PROFILE_DIR) -> list[Path]:
    """Write every profile JSON into out_dir and remove profiles no longer generated."""
    out_dir.mkdir(parents=True, exist_ok=True)
    expected = expected_profiles()
    for stale in out_dir.glob("*.json"):
        if not stale.name.startswith("_") and stale.stem not in expected:
            stale.unlink()
    written = []
    for name, profile in sorted(expected.items()):
        path = out_dir / f"{name}.json"
        path.write_text(render(profile))
        written.append(path)
    return written


def stale_profiles() -> list[str]:
    """The shipped profiles that are not what ``generate_profiles`` would write: those
    that differ (sorted), then those it no longer writes (sorted). Empty when up to date."""
    expected = expected_profiles()
    stale = [n for n, p in expected.items() if _read(PROFILE_DIR / f"{n}.json") != render(p)]
    extra = sorted(set(list_profiles()) - set(expected))
    return sorted(stale) + extra


def _read(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


def describe_profiles() -> list[dict[str, Any]]:
    """One row per shipped profile: name, model, gpu, tp, cost model version, method."""
    rows = []
    for name in list_profiles():
        data = json.loads((PROFILE_DIR / f"{name}.json").read_text())
        rows.append(
            {
                "name": name,
                "model": data.get("model", {}).get("name", "?"),
                "gpu": data.get("gpu", {}).get("name", "?"),
                "tp": data.get("tensor_parallel", "?"),
                "cost_model_version": data.get("cost_model_version", 1),
                "method": data.get("provenance", {}).get("method", "?"),
            }
        )
    return rows


@dataclass(frozen=True)
class Profile:
    """A step-cost profile plus what the simulator needs to size one replica's KV cache."""

    name: str  # "llama-3-8b_h100-80gb_tp1"
    cost: StepCost
    kv_bytes_per_token: int  # per replica (all layers, K+V, all TP ranks together)
    weight_bytes: int  # per replica
    gpu_memory_bytes: int  # per replica (per-GPU memory * tp)
    max_model_len: int
    reserve_bytes: int = 0  # per replica: runtime reserve + profiling-pass activations
    cost_model_version: int = 1  # 1: no seq_s / flop_tokens_half / overlap (they are 0)
    frontend: Frontend = Frontend()  # what a client sees on top of the engine (0: none given)

    def num_gpu_blocks(self, block_size: int, gpu_memory_utilization: float) -> int:
        """KV-cache blocks the replica can hold, as vLLM sizes its cache.

        (gpu_memory_bytes * utilization - weight_bytes - reserve_bytes)
            // (kv_bytes_per_token * block_size)

        ``reserve_bytes`` is, per GPU, the runtime reserve (CUDA context, cuBLAS and NCCL
        workspaces, CUDA graph pool; 1 GiB by default) plus the peak activations of a
        forward pass over 8,192 tokens (see ``reserve_bytes_per_gpu``), times tp.

        Raises:
            ValueError: bad arguments, or weights plus reserve leave no room for one block.
        """
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}"
            )
        budget = int(self.gpu_memory_bytes * gpu_memory_utilization)
        free = budget - self.weight_bytes - self.reserve_bytes
        block_bytes = self.kv_bytes_per_token * block_size
        if free < block_bytes:
            gib = 2**30
            raise ValueError(
                f"{self.name}: weights ({self.weight_bytes / gib:.1f} GiB) plus reserve "
                f"({self.reserve_bytes / gib:.1f} GiB) leave no room for a KV block in "
                f"{gpu_memory_utilization:.0%} of {self.gpu_memory_bytes / gib:.1f} GiB; "
                "use more tensor-parallel GPUs or a higher gpu_memory_utilization"
            )
        return free // block_bytes


def list_profiles() -> list[str]:
    """Names of the shipped profiles, sorted."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json") if not p.name.startswith("_"))


# a profile's memory section: bytes up to 1 PiB x 1024 GPUs, lengths the state holds
PROFILE_MEMORY_RANGES: dict[str, tuple[int, int]] = {
    "kv_bytes_per_token": (1, 2**60),
    "weight_bytes": (0, 2**60),
    "gpu_memory_bytes": (1, 2**60),
    "max_model_len": (2, validation.MAX_COUNT),
    "reserve_bytes": (0, 2**60),
}


def load_profile(name_or_path: str | Path) -> Profile:
    """A shipped profile by name, or any profile JSON file by path.

    Raises:
        ScenarioError: unknown name (the message lists the shipped ones), or a file that is
            not a profile (the message names the file and the missing key).
    """
    text = str(name_or_path)
    if text in list_profiles():
        path = PROFILE_DIR / f"{text}.json"
    else:
        path = Path(text)
        if not path.is_file():
            raise ScenarioError(
                f"unknown profile {text!r}: not a file; shipped profiles are "
                + ", ".join(list_profiles())
            )
    try:
        data = validation.loads_json(path.read_text(), f"profile {path}", error=ScenarioError)
        if not isinstance(data, dict):
            raise ScenarioError(f"profile {path}: not a JSON object; is it a profile JSON?")
        version = validation.integer(
            data.get("cost_model_version", 1),
            "cost_model_version",
            f"profile {path}",
            lo=None,
            hi=None,
            integral_floats=True,
            error=ScenarioError,
        )
        if not 1 <= version <= COST_MODEL_VERSION:
            raise ScenarioError(
                f"profile {path}: cost_model_version {version} is not known to this version "
                f"(it reads 1 to {COST_MODEL_VERSION}); upgrade tracereplay"
            )
        memory = data["memory"]
        if not isinstance(memory, dict) or not isinstance(data["coefficients"], dict):
            raise ScenarioError(f"profile {path}: memory and coefficients must be objects")
        sizes = {
            key: validation.integer(
                memory[key] if key != "reserve_bytes" else memory.get(key, 0),
                f"memory.{key}",
                f"profile {path}",
                lo=lo,
                hi=hi,
                integral_floats=True,
                error=ScenarioError,
            )
            for key, (lo, hi) in PROFILE_MEMORY_RANGES.items()
        }
        return Profile(
            name=str(data.get("name", path.stem)),
            cost=StepCost.from_dict(data["coefficients"]),
            kv_bytes_per_token=sizes["kv_bytes_per_token"],
            weight_bytes=sizes["weight_bytes"],
            gpu_memory_bytes=sizes["gpu_memory_bytes"],
            max_model_len=sizes["max_model_len"],
            reserve_bytes=sizes["reserve_bytes"],
            cost_model_version=version,
            frontend=Frontend.from_dict(data.get("frontend")),
        )
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"profile {path}: not valid JSON ({exc})") from exc
    except (KeyError, TypeError, ValueError) as exc:
        raise ScenarioError(f"profile {path}: missing or bad key {exc}") from exc
