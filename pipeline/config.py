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
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError

DEFAULT_WAREHOUSE = "warehouse"
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
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file ({exc.strerror})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from exc
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
    return Config(path=Path(path), sections=data)


def warehouse_path(flag: str | None, config: Config) -> Path:
    """Resolve the warehouse directory: flag > $TRACEREPLAY_WAREHOUSE > config > ./warehouse."""
    value = flag or os.environ.get("TRACEREPLAY_WAREHOUSE") or config.get("warehouse", "path")
    return Path(value or DEFAULT_WAREHOUSE)
