"""Errors the pipeline raises on purpose. The CLI prints these as one line (exit 1).

* PipelineError
  x ConfigError            bad or unknown config key (names the file and key path)
    x PredicateError       a --where predicate that may not run (names the option or key)
  x ContractError          a table does not match its contract (names table, column, file)
  x SourceError            a whole input file cannot be ingested (unreadable, unknown
                           format, truncated compression, wrong encoding); other files
                           of the same run still land
  x ScenarioError          a replay scenario is invalid (names the key, lists allowed values)
  x UnknownQueryError           no sql/<name>.sql (lists the available names)
  x StorageError           the file system refused a write: full, read-only, no
                           permission, ... (pipeline/storage.py; names the path and the fix)

Anything that is not a PipelineError is a bug and keeps its traceback.
"""


class PipelineError(Exception):
    """Base class of every expected failure."""


class ConfigError(PipelineError):
    """A config file or flag is wrong; the message names the file and the key."""


class PredicateError(ConfigError):
    """A ``--where`` predicate is refused before it runs (``pipeline.predicate``); the
    message names the option or config key, what is not allowed, and how to write it."""


class ContractError(PipelineError):
    """A frame or Parquet file does not match its table contract."""


class SourceError(PipelineError):
    """A source file cannot be ingested at all.

    Attributes:
        path: the file.
        reason: what is wrong and what to do about it.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class ScenarioError(PipelineError):
    """A replay scenario cannot run; the message names the key and the allowed values."""


class UnknownQueryError(PipelineError):
    """No sql/<name>.sql exists."""
