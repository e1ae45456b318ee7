"""Server metrics: parse Prometheus text and keep the few series the live stage compares.

vLLM, SGLang and TGI expose ``GET /metrics`` in the Prometheus text exposition format
(one sample a line: ``name{label="v",...} value [timestamp]``; ``#`` lines are help and
type comments). Each server names the same quantities differently; ``NAMES`` maps them
onto one vocabulary:

    num_requests_running   requests in the running batch
    num_requests_waiting   requests queued in the server
    kv_cache_usage         share of KV-cache blocks in use, 0..1
    prefix_cache_queries   prompt tokens looked up in the prefix cache (counter)
    prefix_cache_hits      of which found (counter)
    prefix_cache_hit_rate  the server's own hit-rate gauge, 0..1, where it has one

Samples of one metric with several label sets (one per model or engine) are summed,
except the 0..1 ratios, which are averaged. Where a server exposes an old and a new name
for one quantity, the first one in the text is kept.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

# server metric name -> our name (vLLM, SGLang, TGI). Counters are matched with or
# without the ``_total`` suffix the exposition format adds to them.
NAMES: dict[str, str] = {
    # vLLM (docs: "Metrics", production metrics of the V1 engine)
    "vllm:num_requests_running": "num_requests_running",
    "vllm:num_requests_waiting": "num_requests_waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:gpu_cache_usage_perc": "kv_cache_usage",  # before vLLM 0.10
    "vllm:prefix_cache_queries": "prefix_cache_queries",
    "vllm:prefix_cache_hits": "prefix_cache_hits",
    "vllm:gpu_prefix_cache_queries": "prefix_cache_queries",
    "vllm:gpu_prefix_cache_hits": "prefix_cache_hits",
    "vllm:gpu_prefix_cache_hit_rate": "prefix_cache_hit_rate",
    # SGLang (--enable-metrics)
    "sglang:num_running_reqs": "num_requests_running",
    "sglang:num_queue_reqs": "num_requests_waiting",
    "sglang:token_usage": "kv_cache_usage",
    "sglang:cache_hit_rate": "prefix_cache_hit_rate",
    # TGI
    "tgi_batch_current_size": "num_requests_running",
    "tgi_queue_size": "num_requests_waiting",
}

RATIOS = frozenset({"kv_cache_usage", "prefix_cache_hit_rate"})


@dataclass(frozen=True)
class Sample:
    """One line of the exposition: a metric name, its labels and its value."""

    name: str
    labels: dict[str, str]
    value: float


class MetricsParseError(ValueError):
    """A line of the exposition that is not a sample."""


def parse_prometheus(text: str) -> Iterator[Sample]:
    """Every sample of a Prometheus text exposition, in order.

    Raises:
        MetricsParseError: naming the line number and what is wrong with it.
    """
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            yield _parse_line(line)
        except (ValueError, IndexError) as exc:
            raise MetricsParseError(f"/metrics line {lineno}: {exc}: {line[:120]!r}") from None


def _parse_line(line: str) -> Sample:
    labels: dict[str, str] = {}
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        name = line[:brace]
        i = brace + 1
        while True:
            while i < len(line) and line[i] in " ,":
                i += 1
            if line[i] == "}":
                i += 1
                break
            eq = line.index("=", i)
            key = line[i:eq].strip()
            if line[eq + 1] != '"':
                raise ValueError(f"label {key!r} has no quoted value")
            value, i = _quoted(line, eq + 2)
            labels[key] = value
        rest = line[i:].split()
    else:
        name, *rest = line.split()
    if not rest:
        raise ValueError(f"sample {name!r} has no value")
    return Sample(name, labels, _number(rest[0]))


def _quoted(line: str, i: int) -> tuple[str, int]:
    """The label value starting at ``i`` (after its opening quote) and the index past it."""
    out: list[str] = []
    while line[i] != '"':
        if line[i] == "\\":
            i += 1
            out.append({"n": "\n", "\\": "\\", '"': '"'}.get(line[i], line[i]))
        else:
            out.append(line[i])
        i += 1
    return "".join(out), i + 1


def _number(s: str) -> float:
    special = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}
    return special[s] if s in special else float(s)


def extract(text: str) -> dict[str, float]:
    """The metrics of ``NAMES`` found in one scrape, under our names."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    source: dict[str, str] = {}  # our name -> the server name it came from first
    for sample in parse_prometheus(text):
        name = sample.name.removesuffix("_total")
        ours = NAMES.get(name)
        if ours is None or math.isnan(sample.value):
            continue
        if source.setdefault(ours, name) != name:  # an old alias next to the new name
            continue
        sums[ours] = sums.get(ours, 0.0) + sample.value
        counts[ours] = counts.get(ours, 0) + 1
    return {k: v / counts[k] if k in RATIOS else v for k, v in sums.items()}
