"""Where settings come from: CLI flag > environment > config file > default.

The config file is TOML: ``--config FILE``, else ``$TRACEREPLAY_CONFIG``, else
``./tracereplay.toml`` when it exists. Known sections and keys::

    [warehouse]
    path = "warehouse"          # also $TRACEREPLAY_WAREHOUSE and --warehouse

    [ingest]
    block_size = 16             # tokens per block when hashing prompt_token_ids
    hash_salt = ""              # optional salt mixed into the first block hash
    trace_start = "1970-01-01T00:00:00Z"  # base time for logs with relative times
    tokenizer = ""              # tokenizer.json for logs that carry only text

    [replay]                    # see pipeline/sim/scenario.py

    [gpu_prices]                # dollars per GPU-hour, per GPU kind (pipeline/pricing.py)
    h100-80gb = 2.49

Every value is checked when the file is read, before any work starts: its type, and
numbers finite and in range (``block_size`` 1 to 65536, prices above 0 and at most
1e6); ``[replay]`` keys get the scenario checks of one key at a time (the checks
across keys run when a scenario is built). A wrong value is one line naming the
file, the key and what is allowed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline import validation
from pipeline.errors import ConfigError, PipelineError

DEFAULT_WAREHOUSE = "warehouse"
MAX_BLOCK_SIZE = 1 << 16  # tokens per hashed block
MAX_GPU_PRICE = 1e6  # dollars per GPU-hour
KNOWN: dict[str, set[str]] = {
    "warehouse": {"path"},
    "ingest": {"block_size", "hash_salt", "trace_start", "tokenizer"},
    "replay": set(),  # validated by the scenario loader
    "gpu_prices": set(),  # GPU kind = dollars per GPU-hour (pipeline/pricing.py checks them)
}


@dataclass(frozen=True)
class Config:
    """The parsed config file (sections as plain dicts, checked for unknown keys)."""

    path: Path | None = None
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)

    def get(self, section: str, key: str, default: Any = None) -> Any:
        return self.sections.get(section, {}).get(key, default)


def load_config(path: Path | None = None) -> Config:
    """Load the config file (see the module docstring for where it is looked for).

    Raises:
        ConfigError: unreadable TOML, an unknown section or key; names the file and key.
    """
    if path is None:
        env = os.environ.get("TRACEREPLAY_CONFIG")
        if env:
            path = Path(env)
        elif Path("tracereplay.toml").exists():
            path = Path("tracereplay.toml")
    if path is None:
        return Config()
    data = validation.read_toml_file(path, "config file")
    for section, values in data.items():
        if section not in KNOWN:
            raise ConfigError(
                f"{path}: unknown section [{section}]; known: {', '.join(sorted(KNOWN))}"
            )
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: {section} must be a table")
        if KNOWN[section]:
            for key in values:
                if key not in KNOWN[section]:
                    raise ConfigError(
                        f"{path}: unknown key {section}.{key}; known: "
                        f"{', '.join(sorted(KNOWN[section]))}"
                    )
    where = str(path)
    if "path" in data.get("warehouse", {}):
        validation.string(data["warehouse"]["path"], "warehouse.path", where, nonempty=True)
    check_ingest_table(data.get("ingest", {}), "ingest", where)
    for kind, value in data.get("gpu_prices", {}).items():
        validation.finite_float(
            value, f"gpu_prices.{kind}", where, lo=0.0, lo_open=True, hi=MAX_GPU_PRICE
        )
    if data.get("replay"):
        from pipeline.sim.scenario import check_scenario_keys

        try:
            check_scenario_keys(data["replay"], f"{where} [replay]")
        except PipelineError as exc:
            raise ConfigError(str(exc)) from None
    return Config(path=Path(path), sections=data)


def check_ingest_table(values: dict[str, Any], section: str, where: str) -> None:
    """The ``[ingest]`` keys shared by the config file and nightly configs: of the right
    type, ``block_size`` a whole number in [1, 65536], ``trace_start`` an ISO time.

    Raises:
        ConfigError: naming ``where``, ``section.key`` and what is allowed.
    """
    if "block_size" in values:
        validation.integer(
            values["block_size"], f"{section}.block_size", where, lo=1, hi=MAX_BLOCK_SIZE
        )
    for key in ("hash_salt", "tokenizer", "format"):
        if key in values:
            validation.string(values[key], f"{section}.{key}", where)
    if "trace_start" in values:
        text = validation.string(values["trace_start"], f"{section}.trace_start", where)
        parse_trace_start(text, f"{section}.trace_start", where)


def parse_trace_start(text: str, key: str, where: str) -> Any:
    """An ISO time (``Z`` for UTC) as a datetime; naive times are UTC."""
    from datetime import UTC, datetime

    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"{where}: {key} {text!r} is not an ISO time, e.g. 2024-05-01T00:00:00Z"
        ) from None
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def warehouse_path(flag: str | None, config: Config) -> Path:
    """Resolve the warehouse directory: flag > $TRACEREPLAY_WAREHOUSE > config > ./warehouse."""
    value = flag or os.environ.get("TRACEREPLAY_WAREHOUSE") or config.get("warehouse", "path")
    if value and str(value).startswith("s3://"):
        from pipeline import objectstore

        return objectstore.mirror(str(value))  # the local stand-in (pipeline.objectstore)
    return Path(value or DEFAULT_WAREHOUSE)
