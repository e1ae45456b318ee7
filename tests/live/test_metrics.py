"""The Prometheus parser and the metric names, on expositions written like vLLM's, SGLang's
and TGI's (metric names from their documentation; values chosen so sums and means differ)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pipeline.live.metrics import MetricsParseError, extract, parse_prometheus

DATA = Path(__file__).parent / "data"


def test_vllm_exposition_sums_counts_and_averages_ratios() -> None:
    got = extract((DATA / "metrics_vllm.prom").read_text())
    assert got == {
        "num_requests_running": 12.0,  # 7 + 5 over two engines
        "num_requests_waiting": 3.0,
        "kv_cache_usage": 0.5,  # mean of 0.25 and 0.75; the deprecated alias (0.99) ignored
        "prefix_cache_queries": 20000.0,  # counters exposed with _total
        "prefix_cache_hits": 4000.0,
    }


def test_sglang_and_tgi_names() -> None:
    assert extract((DATA / "metrics_sglang.prom").read_text()) == {
        "num_requests_running": 16.0,
        "num_requests_waiting": 4.0,
        "kv_cache_usage": 0.42,
        "prefix_cache_hit_rate": 0.6,
    }
    assert extract((DATA / "metrics_tgi.prom").read_text()) == {
        "num_requests_running": 9.0,
        "num_requests_waiting": 2.0,
    }


def test_parser_reads_labels_escapes_specials_and_timestamps() -> None:
    samples = list(parse_prometheus((DATA / "metrics_vllm.prom").read_text()))
    by_name = {s.name: s for s in samples}
    lora = by_name["vllm:lora_requests_info"]
    assert lora.labels == {
        "max_lora": "0",
        "running_lora_adapters": "",
        "waiting_lora_adapters": 'a "quoted", odd} name',
    }
    assert lora.value == 1.7e9
    assert by_name["process_cpu_seconds_total"].labels == {}
    assert by_name["process_cpu_seconds_total"].value == 123.45
    assert math.isnan(by_name["vllm:num_preemptions_total"].value)
    inf = [s for s in samples if s.labels.get("le") == "+Inf"]
    assert [s.value for s in inf] == [42.0]
    tgi = {s.name: s.value for s in parse_prometheus((DATA / "metrics_tgi.prom").read_text())}
    assert tgi["tgi_request_count"] == 1234.0  # the trailing timestamp is not the value


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("ok 1\nbroken_no_value\n", "line 2"),
        ('x{a="1" 2\n', "line 1"),
        ("x{a=1} 2\n", "no quoted value"),
        ("x 1.2.3\n", "line 1"),
    ],
)
def test_bad_lines_name_the_line(text: str, what: str) -> None:
    with pytest.raises(MetricsParseError, match=what):
        list(parse_prometheus(text))
