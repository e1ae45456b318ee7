"""Every sql/ query against the tiny warehouse of conftest.py, with results worked out by hand.

Percentiles are linear (quantile_cont): over four sorted values v0..v3 the q-quantile
sits at position 3q, so p50 = (v1 + v2) / 2 and p99 = v2 + 0.97 (v3 - v2).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest

from pipeline.contracts import CONTRACTS
from pipeline.errors import UnknownQueryError
from pipeline.report.sql import QueryError, available, load_query, query, variables_used
from pipeline.warehouse import DERIVED_VIEWS, SQL_DIR, VIEWS_SQL, Warehouse, load_sql
from tests.helpers import R1, R2

Rows = list[dict[str, Any]]

# SLOs with a scope on each kind of thing a scope can name (and p100, which no usual
# quantile covers); as `capacity` and `sweep` write them
SCOPED = ["ttft_p99<=200ms", "ttft_p50@tenant=t1<=150ms", "tpot_mean@prompt>150<=100ms",
          "e2e_p100@model=m-b<=2s"]  # fmt: skip

# name: (query, params, only rows matching these values, expected rows in order)
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any], Rows]] = {
    # the tiny warehouse has no capacity run; tests/capacity checks this query's rows
    "capacity_search_without_a_search": ("capacity_search", {}, {}, []),
    "capacity_answers_without_a_search": ("capacity_answers", {}, {}, []),
    # vllm-2's TTFTs 0.1 0.2 0.3 0.5: p99 = 0.3 + 0.97 * 0.2; R1 has no vllm-2
    # (tests/report/test_compare.py checks pairing and changes)
    # static-4: 2 replicas of 'tiny' (no GPU kind: only the "*" price applies) at $2:
    # $4/hour; 36 output tokens over 4 s = 9/s -> 4 / (9 x 3600) x 1e6; 1536 tokens / 4 s
    "cost": ("cost", {"prices_json": '{"*": 2.0, "h100-80gb": 9.0}'}, {"scenario": "static-4"}, [
        {"profile": "tiny", "gpu": None, "gpus": 2, "usd_per_gpu_hour": 2.0,
         "usd_per_hour": 4.0, "output_tokens_per_s": 9.0, "total_tokens_per_s": 384.0,
         "usd_per_1m_output_tokens": 4 / (9 * 3600) * 1e6,
         "usd_per_1m_total_tokens": 4 / (384 * 3600) * 1e6},
    ]),
    "cost_without_prices": ("cost", {}, {"scenario": "vllm-2"}, [
        {"gpus": 2, "usd_per_hour": None, "usd_per_1m_output_tokens": None},
    ]),
    # r1 and r3 logged 50 + 100 cached of 100 + 400 prompt tokens; vllm-4 simulated
    # 100 + 300 of 1500; r1 and r2 carry hashes; static batching has no prefix cache
    "prefix_cache_observed": ("prefix_cache_observed", {}, {}, [
        {"scenario": "static-4", "prefix_caching": False, "num_requests": 4,
         "hashed_requests": 2, "simulated_cached_share": 0.0, "observed_requests": 2,
         "observed_cached_share": 0.3, "warning": None},
        {"scenario": "vllm-2", "prefix_caching": True, "observed_cached_share": 0.3},
        {"scenario": "vllm-4", "simulated_cached_share": 400 / 1500, "warning": None},
        {"scenario": "vllm-4-fast"},
    ]),
    "compare_runs": ("compare_runs", {"run_id": R2, "compare_run_id": R1},
                     {"scenario": "vllm-2", "metric": "p99_ttft_s"}, [
        {"run_a": R2, "run_b": R1, "scenario_b": None, "value_a": 0.494, "value_b": None,
         "change": None, "relative_change": None, "metric_order": 6},
    ]),
    # paired as `compare --pair vllm-2=old` says: R1's one request of 'old' took 9 s to its
    # first token
    "compare_runs_paired": ("compare_runs",
                            {"run_id": R2, "compare_run_id": R1,
                             "pairs_json": '[["vllm-2", "old"]]'},
                            {"scenario": "vllm-2", "metric": "p99_ttft_s"}, [
        {"scenario_b": "old", "value_a": 0.494, "value_b": 9.0, "change": 9.0 - 0.494},
    ]),
    # each run's scenarios in the order its scenarios file lists them
    "compare_scenarios": ("compare_scenarios", {"run_id": R2, "compare_run_id": R1}, {}, [
        {"run_id": R1, "scenario": "old", "position": 1},
        {"run_id": R2, "scenario": "static-4", "position": 1},
        {"run_id": R2, "scenario": "vllm-2", "position": 2},
        {"run_id": R2, "scenario": "vllm-4", "position": 3},
        {"run_id": R2, "scenario": "vllm-4-fast", "position": 4},
    ]),
    # R1's one request of 'old' beside R2's: TTFT 9 s, E2E 10 s, TPOT 1 s over 9 tokens
    "compare_requests": ("compare_requests", {"run_id": R2, "compare_run_id": R1},
                         {"scenario": "old"}, [
        {"run_id": R1, "request_id": "r1", "arrival_s": 0.0, "ttft_s": 9.0, "tpot_s": 1 / 9,
         "e2e_s": 10.0},
    ]),
    "compare_requests_latest": ("compare_requests", {}, {"request_id": "r1"}, [
        {"run_id": R1, "scenario": "old"}, {"run_id": R2, "scenario": "static-4"},
        {"run_id": R2, "scenario": "vllm-2"}, {"run_id": R2, "scenario": "vllm-4"},
        {"run_id": R2, "scenario": "vllm-4-fast"},
    ]),
    # nor a calibration; tests/calibrate/test_observed.py checks this query's rows
    "calibration_without_a_calibration": ("calibration", {}, {}, []),
    # the tiny warehouse has no live run; tests/live/test_live_sql.py checks these queries' rows
    "live_latency_without_a_run": ("live_latency", {}, {}, []),
    "live_metrics_without_a_run": ("live_metrics", {}, {}, []),
    # no validate run either; tests/live/test_validate.py checks these queries' rows
    "validation_without_a_run": ("validation", {}, {}, []),
    "validation_cdf_without_a_run": ("validation_cdf", {}, {}, []),
    "validation_requests_without_a_run": ("validation_requests", {}, {}, []),
    # the tiny warehouse's run has no swap, speculation, scheduler CPU time or KV tier (its
    # steps' columns are null); tests/report/test_feature_views.py and
    # tests/report/test_kv_tiers_view.py check these queries' rows
    "swaps_without_swaps": ("swaps", {}, {}, []),
    "kv_tiers_without_tiers": ("kv_tiers", {}, {}, []),
    "speculation_without_drafts": ("speculation", {}, {}, []),
    "sched_cpu_without_cpu_time": ("sched_cpu", {}, {}, []),
    "replay_runs": ("replay_runs", {}, {}, [
        {"run_id": R2, "num_scenarios": 4, "num_sim_requests": 16, "version": "0.1.0",
         "rows_read": 0, "inputs": "[]", "slos": None,
         "scenario_names": "static-4, vllm-2, vllm-4, vllm-4-fast"},
        {"run_id": R1, "num_scenarios": 1, "num_sim_requests": 1, "scenario_names": "old"},
    ]),
    # the label: every key that varies across R2 (policy first), never a fixed set; a key
    # only one policy has, at one value (static's max_batch_size), follows from the policy
    "run_scenarios_latest": ("run_scenarios", {}, {}, [
        {"run_id": R2, "scenario": "static-4", "policy": "static", "max_concurrency": 4,
         "num_kv_blocks": 100, "block_size": 16, "num_requests": 4, "replicas": 2,
         "label": "policy=static, enable_prefix_caching=false, time_scale=1"},
        {"scenario": "vllm-2", "policy": "vllm", "max_concurrency": 2, "num_requests": 4,
         "label": "policy=vllm, enable_prefix_caching=true, max_num_seqs=2, time_scale=1"},
        {"scenario": "vllm-4", "max_concurrency": 4},
        {"scenario": "vllm-4-fast", "max_concurrency": 4,
         "label": "policy=vllm, enable_prefix_caching=true, max_num_seqs=4, time_scale=0.5"},
    ]),
    # vllm-2: tenant t1 = r1, r3 (TTFT 0.1, 0.3: p99 0.298), t2 = r2 (0.2), none = r4 (0.5),
    # over 5 s; the scoped SLO judges t1 alone, the unscoped one every class
    "class_slos_scoped": ("class_slos",
                          {"slos": json.dumps(["ttft_p99<=250ms", "ttft_p99@tenant=t1<=150ms"])},
                          {"scenario": "vllm-2", "class_kind": "tenant"}, [
        {"class_label": "tenant=(none)", "requests": 1, "slo": "ttft_p99", "measured_s": 0.5,
         "meets_slo": False, "num_good": 0, "goodput_per_s": 0.0, "is_first": True},
        {"class_label": "tenant=t1", "completed": 2, "slo": "ttft_p99", "measured_s": 0.298,
         "slos_missed": "ttft_p99, ttft_p99@tenant=t1", "meets_all": False, "num_good": 1,
         "goodput_per_s": 0.2, "is_first": True},
        {"class_label": "tenant=t1", "slo": "ttft_p99@tenant=t1",
         "slo_label": "ttft_p99 of tenant=t1 <= 150ms", "limit_s": 0.15, "is_first": False},
        {"class_label": "tenant=t2", "slo": "ttft_p99", "meets_slo": True, "meets_all": True,
         "slos_met": "ttft_p99", "num_good": 1, "goodput_per_s": 0.2},
    ]),
    # no SLO (the tiny runs store none): one row per class, every completed request good
    "class_slos_none": ("class_slos", {}, {"scenario": "vllm-2", "class_kind": "model"}, [
        {"class_label": "model=(none)", "slo": None, "meets_all": True, "num_good": 1},
        {"class_label": "model=m-a", "requests": 2, "ttft_p50_s": 0.15, "num_good": 2,
         "goodput_per_s": 0.4},
        {"class_label": "model=m-b", "slo": None, "num_good": 1},
    ]),
    # the tiny warehouse holds no fleet (tests/report/test_pools_report.py checks the rows)
    "pool_slos_without_a_fleet": ("pool_slos", {}, {}, []),
    # nor an autoscaled scenario (tests/report/test_autoscale_report.py checks the rows)
    "autoscale_summary_without_autoscaling": ("autoscale_summary", {}, {}, []),
    "autoscale_timeline_without_autoscaling": ("autoscale_timeline", {}, {}, []),
    "run_scenarios_old": ("run_scenarios", {"run_id": R1}, {}, [
        {"run_id": R1, "scenario": "old", "num_requests": 1, "label": ""},
    ]),
    "trace_summary_of_run": ("trace_summary", {"run_id": R2}, {}, [
        {"num_requests": 4, "num_days": 1, "duration_s": 3.0, "mean_requests_per_s": 4 / 3,
         "num_models": 2, "num_tenants": 2, "num_sessions": 0, "num_source_files": 2,
         "source_formats": "azure, gateway", "total_prompt_tokens": 1500,
         "total_output_tokens": 36, "mean_prompt_tokens": 375.0, "p50_prompt_tokens": 300.0,
         "p99_prompt_tokens": 788.0, "mean_output_tokens": 9.0, "p50_output_tokens": 7.5,
         "p99_output_tokens": 19.7, "share_with_prefix_hashes": 0.5},
    ]),
    "nightly_traffic_of_a_day": ("nightly_traffic",
        {"date_from": "2024-05-01", "date_to": "2024-05-01"}, {}, [
        # the tiny warehouse's logs carry no latencies
        {"num_days": 1, "num_requests": 4, "requests_per_day": 4.0, "mean_prompt_tokens": 375.0,
         "mean_output_tokens": 9.0, "observed_ttft_p99_s": None, "observed_tpot_p99_s": None},
    ]),
    "nightly_traffic_of_warehouse": ("nightly_traffic", {}, {}, [
        {"num_days": 2, "num_requests": 5, "requests_per_day": 2.5, "mean_prompt_tokens": 310.0,
         "mean_output_tokens": 7.6},
    ]),
    "trace_summary_of_warehouse": ("trace_summary", {}, {}, [
        # five prompts 50..800: p50 = the middle one, p99 at position 3.96
        {"num_requests": 5, "num_days": 2, "duration_s": 86400.0, "total_prompt_tokens": 1550,
         "p50_prompt_tokens": 200.0, "p99_prompt_tokens": 784.0, "p50_output_tokens": 5.0,
         "p99_output_tokens": 19.6, "share_with_prefix_hashes": 0.4},
    ]),
    "trace_groups": ("trace_groups", {"run_id": R2}, {}, [
        {"dimension": "model", "group_name": "m-a", "num_requests": 2, "prompt_tokens": 300,
         "output_tokens": 30, "share": 0.5},
        {"dimension": "model", "group_name": "(none)", "num_requests": 1, "share": 0.25},
        {"dimension": "model", "group_name": "m-b", "prompt_tokens": 400},
        {"dimension": "tenant", "group_name": "t1", "num_requests": 2, "prompt_tokens": 500},
        {"dimension": "tenant", "group_name": "(none)"},
        {"dimension": "tenant", "group_name": "t2"},
    ]),
    "trace_groups_folded": ("trace_groups", {"max_groups": 1}, {"dimension": "tenant"}, [
        # all five requests: t1 and (none) have two each, (none) sorts first and stays
        {"group_name": "(other)", "num_requests": 3, "prompt_tokens": 700, "share": 0.6},
        {"group_name": "(none)", "num_requests": 2, "share": 0.4},
    ]),
    "trace_sources": ("trace_sources", {}, {}, [
        {"source_file": "a.jsonl", "source_format": "gateway", "num_requests": 3,
         "num_quarantined": 2},
        {"source_file": "b.csv", "source_format": "azure", "num_requests": 2,
         "num_quarantined": 0},
    ]),
    "trace_sources_of_old_run": ("trace_sources", {"run_id": R1}, {}, [
        {"source_file": "a.jsonl", "num_requests": 1, "num_quarantined": 2},
    ]),
    "arrival_rate": ("arrival_rate", {"run_id": R2, "bucket_s": 2}, {}, [
        {"bucket_s": 2.0, "num_requests": 2, "requests_per_s": 1.0,
         "prompt_tokens_per_s": 150.0, "output_tokens_per_s": 15.0},
        {"num_requests": 2, "requests_per_s": 1.0, "prompt_tokens_per_s": 600.0,
         "output_tokens_per_s": 3.0},
    ]),
    "length_distribution": ("length_distribution", {"run_id": R2, "bins_per_octave": 1}, {}, [
        {"kind": "prompt", "bin_lo_tokens": 64.0, "bin_hi_tokens": 128.0, "num_requests": 1,
         "share": 0.25},
        {"kind": "prompt", "bin_lo_tokens": 128.0, "bin_hi_tokens": 256.0},
        {"kind": "prompt", "bin_lo_tokens": 256.0, "bin_hi_tokens": 512.0},
        {"kind": "prompt", "bin_lo_tokens": 512.0, "bin_hi_tokens": 1024.0},
        {"kind": "output", "bin_lo_tokens": 1.0, "bin_hi_tokens": 2.0, "share": 0.25},
        {"kind": "output", "bin_lo_tokens": 4.0, "bin_hi_tokens": 8.0},
        {"kind": "output", "bin_lo_tokens": 8.0, "bin_hi_tokens": 16.0},
        {"kind": "output", "bin_lo_tokens": 16.0, "bin_hi_tokens": 32.0},
    ]),
    "quarantine_reasons": ("quarantine_reasons", {}, {}, [
        # numbers become N and details in parentheses go: one kind of reason
        {"reason": "negative output token count N", "source_format": "gateway",
         "num_records": 2, "num_files": 1, "example_reason": "negative output token count -5",
         "example_file": "c.jsonl", "example_line": 2},
        {"reason": "prompt_tokens is missing", "num_records": 2, "num_files": 1,
         "example_reason": "prompt_tokens is missing", "example_file": "a.jsonl",
         "example_line": 7},
    ]),
    "quarantine_reasons_of_run": ("quarantine_reasons", {"run_id": R2}, {}, [
        {"reason": "prompt_tokens is missing", "num_records": 2},
    ]),
    "throughput": ("throughput", {}, {}, [
        # static-4: 4 requests, 36 output + 1500 prompt tokens, from 0 s to 4 s
        {"scenario": "static-4", "batching": "static", "num_requests": 4, "duration_s": 4.0,
         "requests_per_s": 1.0, "output_tokens_per_s": 9.0, "total_tokens_per_s": 384.0,
         "goodput_per_s": 0.25},
        {"scenario": "vllm-2", "batching": "continuous", "duration_s": 5.0,
         "requests_per_s": 0.8, "output_tokens_per_s": 7.2, "total_tokens_per_s": 307.2,
         "goodput_per_s": 0.4},
        {"scenario": "vllm-4", "duration_s": 4.0, "requests_per_s": 1.0, "goodput_per_s": 1.0},
        {"scenario": "vllm-4-fast", "duration_s": 3.0, "requests_per_s": 4 / 3,
         "goodput_per_s": 2 / 3},
    ]),
    "throughput_tighter_slo": ("throughput", {"slo_ttft_s": 0.1}, {"scenario": "vllm-2"}, [
        {"goodput_per_s": 0.2},
    ]),
    # vllm-2's TTFTs 0.1 0.2 0.3 0.5 over 5 s; r1 and r3 are tenant t1's: a limit on t1 alone
    # rejects r3 only, the same limit on every request r2, r3 and r4
    "throughput_scoped_slo": ("throughput", {"slos": json.dumps(["ttft_p99@tenant=t1<=150ms"])},
                              {"scenario": "vllm-2"}, [{"num_good": 3, "goodput_per_s": 0.6}]),
    "throughput_unscoped_slo": ("throughput", {"slos": json.dumps(["ttft_p99<=150ms"])},
                                {"scenario": "vllm-2"}, [{"num_good": 1, "goodput_per_s": 0.2}]),
    # every SLO that holds a request: r3 misses both, r4 the unscoped one
    "throughput_both_slos": ("throughput",
                             {"slos": json.dumps(["ttft_p99<=250ms", "ttft_p99@tenant=t1<=150ms"])},
                             {"scenario": "vllm-2"}, [{"num_good": 2, "goodput_per_s": 0.4}]),
    "latency_percentiles": ("latency_percentiles", {}, {}, [
        {"scenario": "static-4", "num_requests": 4, "p50_ttft_s": 0.35, "p90_ttft_s": 0.47,
         "p99_ttft_s": 0.497, "max_queue_depth": 3, "num_preemptions": 0},
        {"scenario": "vllm-2", "p50_ttft_s": 0.25, "p90_ttft_s": 0.44, "p99_ttft_s": 0.494,
         "max_queue_depth": 9},
        # TPOT of r1..r3: 0.9/9, 0.9/19, 0.9/4; r4 has one output token
        {"scenario": "vllm-4", "p50_ttft_s": 0.1, "p90_ttft_s": 0.17, "p99_ttft_s": 0.197,
         "p50_tpot_s": 0.1, "p99_tpot_s": 0.1 + 0.98 * 0.125, "p50_e2e_s": 1.0},
        {"scenario": "vllm-4-fast", "p50_ttft_s": 0.25, "p99_ttft_s": 0.3, "max_queue_depth": 2},
    ]),
    "latency_cdf": ("latency_cdf", {"bins_per_decade": 4},
                    {"metric": "ttft_s", "scenario": "vllm-2"}, [
        # TTFT 0.1, 0.2, 0.3, 0.5 s against the points 10^(i/4): 0.1, 0.316, 0.562 s
        {"value_s": 0.1, "num_requests": 1, "fraction": 0.25},
        {"value_s": 10 ** -0.5, "num_requests": 3, "fraction": 0.75},
        {"value_s": 10 ** -0.25, "num_requests": 4, "fraction": 1.0},
    ]),
    "latency_cdf_tpot": ("latency_cdf", {"bins_per_decade": 1},
                         {"metric": "tpot_s", "scenario": "vllm-4"}, [
        # TPOT 0.9/19 and 0.9/9 are <= 0.1 s, 0.9/4 is <= 1 s; r4 has one output token
        {"value_s": 0.1, "num_requests": 2, "fraction": 2 / 3},
        {"value_s": 1.0, "num_requests": 3, "fraction": 1.0},
    ]),
    "ttft_by_queue_depth": ("ttft_by_queue_depth", {"min_requests": 1}, {"scenario": "vllm-2"}, [
        {"queue_depth_lo": 0, "queue_depth_hi": 0, "num_requests": 2, "p50_ttft_s": 0.15,
         "p99_ttft_s": 0.199},
        {"queue_depth_lo": 1, "queue_depth_hi": 1, "num_requests": 1, "p99_ttft_s": 0.3},
        {"queue_depth_lo": 8, "queue_depth_hi": 15, "num_requests": 1, "p99_ttft_s": 0.5},
    ]),
    "ttft_by_queue_depth_too_few": ("ttft_by_queue_depth", {}, {}, []),
    "latency_percentiles_cap_and_load": ("latency_percentiles", {}, {}, [
        {"scenario": "static-4", "policy": "static", "max_concurrency": 4,
         "offered_requests_per_s": 4 / 3, "p50_ttft_s": 0.35, "p99_ttft_s": 0.497,
         "mean_queue_depth": 1.5},
        {"scenario": "vllm-2", "max_concurrency": 2, "mean_queue_depth": 2.5},
        {"scenario": "vllm-4", "max_concurrency": 4, "p99_ttft_s": 0.197},
        {"scenario": "vllm-4-fast", "offered_requests_per_s": 4 / 1.5, "mean_queue_depth": 1.0},
    ]),
    "engine_timeline": ("engine_timeline", {"bucket_s": 2}, {"scenario": "vllm-4"}, [
        # [0, 2): replica 0 steps 0 (1 s) and half of step 1, replica 1 for 0.5 s
        {"bucket_start_s": 0.0, "kv_usage": (10 + 30 + 50 * 0.5) / (100 * 2.5),
         "mean_running": (1 + 2 + 0.5) / 2, "mean_waiting": 0.5, "max_waiting": 1,
         "num_preemptions": 1},
        {"bucket_start_s": 2.0, "kv_usage": 0.25, "mean_running": 1.5, "mean_waiting": 2.0,
         "max_waiting": 3, "num_preemptions": 0},
    ]),
    "prefix_cache_hit_rate": ("prefix_cache_hit_rate", {}, {}, [
        {"scenario": "static-4", "cache_tokens": 1600, "query_tokens": 0, "hit_rate": None,
         "prompt_tokens": 1500, "cached_share": 0.0},
        {"scenario": "vllm-2", "query_tokens": 1500, "hit_tokens": 0, "hit_rate": 0.0},
        # weighted by tokens: 500 / 800, not the mean of the replicas' 400/700 and 100/100
        {"scenario": "vllm-4", "query_tokens": 800, "hit_tokens": 500, "hit_rate": 0.625,
         "cached_tokens": 400, "cached_share": 400 / 1500},
        {"scenario": "vllm-4-fast", "query_tokens": 0, "hit_rate": None},
    ]),
    "prefix_cache_hit_rate_over_time": ("prefix_cache_hit_rate_over_time", {"bucket_s": 2}, {}, [
        {"scenario": "vllm-2", "bucket_start_s": 0.0, "query_tokens": 1500, "hit_rate": 0.0},
        {"scenario": "vllm-4", "bucket_start_s": 0.0, "query_tokens": 400, "hit_tokens": 200,
         "hit_rate": 0.5},
        {"scenario": "vllm-4", "bucket_start_s": 2.0, "query_tokens": 400, "hit_tokens": 300,
         "hit_rate": 0.75},
    ]),
    "prefix_cache_hit_rate_by_group": (
        "prefix_cache_hit_rate_by_group", {}, {"scenario": "vllm-4"}, [
            {"dimension": "model", "group_name": "(none)", "num_requests": 1,
             "prompt_tokens": 800, "cached_tokens": 0, "hit_rate": 0.0},
            {"dimension": "model", "group_name": "m-b", "prompt_tokens": 400, "hit_rate": 0.75},
            {"dimension": "model", "group_name": "m-a", "num_requests": 2, "hit_rate": 1 / 3},
            {"dimension": "tenant", "group_name": "(none)", "hit_rate": 0.0},
            {"dimension": "tenant", "group_name": "t1", "prompt_tokens": 500, "hit_rate": 0.6},
            {"dimension": "tenant", "group_name": "t2", "hit_rate": 0.5},
        ]),
    "prefix_cache_hit_rate_by_group_folded": (
        "prefix_cache_hit_rate_by_group", {"max_groups": 1}, {"scenario": "vllm-4"}, [
            {"dimension": "model", "group_name": "(none)", "prompt_tokens": 800},
            {"dimension": "model", "group_name": "(other)", "num_requests": 3,
             "prompt_tokens": 700, "cached_tokens": 400, "hit_rate": 4 / 7},
            {"dimension": "tenant", "group_name": "(none)"},
            {"dimension": "tenant", "group_name": "(other)", "prompt_tokens": 700},
        ]),
    "slo_capacity": ("slo_capacity", {}, {}, [
        # vllm-2 / vllm-4 differ only in max_num_seqs; vllm-4 / vllm-4-fast only in time_scale.
        # Held fixed: the keys that vary across R2 but the swept knob(s)
        {"sweep": "concurrency", "sweep_id": 1, "num_points": 2, "scenario": "vllm-2",
         "sweep_label": "policy=vllm, enable_prefix_caching=true, time_scale=1",
         "value": 2.0, "slo": "ttft_p99", "slo_label": "ttft_p99 <= 200ms", "scope": None,
         "limit_s": 0.2, "scope_requests": 4, "measured_s": 0.494, "meets_slo": False,
         "meets_all": False, "slos_met": None, "slos_missed": "ttft_p99",
         "slos": "ttft_p99 <= 200ms", "capacity": 4.0, "capacity_scenario": "vllm-4",
         "capacity_measured_s": 0.197, "is_capacity": False, "is_first": True},
        {"sweep": "concurrency", "scenario": "vllm-4", "value": 4.0, "meets_slo": True,
         "meets_all": True, "slos_met": "ttft_p99", "is_capacity": True, "is_first": False},
        {"sweep": "rate", "scenario": "vllm-4", "value": 4 / 3, "capacity": 4 / 3,
         "is_capacity": True, "sweep_label": "policy=vllm, enable_prefix_caching=true, "
                                             "max_num_seqs=4"},
        {"sweep": "rate", "scenario": "vllm-4-fast", "value": 4 / 1.5, "measured_s": 0.3,
         "meets_slo": False, "is_capacity": False},
    ]),
    "slo_capacity_none_meets": ("slo_capacity", {"slo_ttft_s": 0.1}, {"is_first": True}, [
        {"sweep": "concurrency", "capacity": None, "capacity_scenario": None},
        {"sweep": "rate", "capacity": None},
    ]),
    # tenant t1 = r1, r3; model m-b = r3; prompts over 150 tokens: r2, r3, r4 (r4 has one
    # output token, so no TPOT). vllm-2: TTFT of r1, r3 0.1, 0.3 -> p50 0.2 (misses 150 ms);
    # TPOT of r2 (2.0 - 1.0 - 0.2) / 19 and r3 (1.0 - 0.3) / 4 -> mean 0.1086 (misses 100 ms)
    "slo_capacity_scoped": ("slo_capacity", {"slos": json.dumps(SCOPED)},
                            {"sweep": "concurrency"}, [
        {"scenario": "vllm-2", "slo": "e2e_p100@model=m-b", "scope": "model=m-b",
         "slo_label": "e2e_p100 of model=m-b <= 2s", "scope_requests": 1, "measured_s": 1.0,
         "meets_slo": True, "meets_all": False, "slos_met": "e2e_p100@model=m-b",
         "slos_missed": "tpot_mean@prompt>150, ttft_p50@tenant=t1, ttft_p99",
         "capacity": None},
        {"scenario": "vllm-2", "slo": "tpot_mean@prompt>150", "scope_requests": 2,
         "measured_s": (0.8 / 19 + 0.7 / 4) / 2, "meets_slo": False},
        {"scenario": "vllm-2", "slo": "ttft_p50@tenant=t1", "scope_requests": 2,
         "measured_s": 0.2, "meets_slo": False},
        {"scenario": "vllm-2", "slo": "ttft_p99", "measured_s": 0.494},
        # vllm-4: TTFT of t1 0.1, 0.1; TPOT of r2 (2.0 - 1.0 - 0.1) / 19, r3 (1.0 - 0.1) / 4
        {"scenario": "vllm-4", "slo": "e2e_p100@model=m-b", "measured_s": 1.0,
         "slos_met": "e2e_p100@model=m-b, ttft_p50@tenant=t1, ttft_p99",
         "slos_missed": "tpot_mean@prompt>150"},
        {"scenario": "vllm-4", "slo": "tpot_mean@prompt>150",
         "measured_s": (0.9 / 19 + 0.9 / 4) / 2},
        {"scenario": "vllm-4", "slo": "ttft_p50@tenant=t1", "measured_s": 0.1,
         "meets_slo": True},
        {"scenario": "vllm-4", "slo": "ttft_p99", "measured_s": 0.197, "meets_all": False},
    ]),
    # a looser TPOT objective: vllm-4 meets all four, vllm-2 still misses TTFT
    "slo_capacity_scoped_capacity": ("slo_capacity",
        {"slos": json.dumps([*SCOPED[:2], "tpot_mean@prompt>150<=0.2s", SCOPED[3]])},
        {"sweep": "concurrency", "is_first": True}, [
        {"capacity": 4.0, "capacity_scenario": "vllm-4",
         "slos": "e2e_p100 of model=m-b <= 2s, tpot_mean of prompt>150 <= 200ms, "
                 "ttft_p50 of tenant=t1 <= 150ms, ttft_p99 <= 200ms"},
    ]),
}  # fmt: skip


@pytest.fixture(scope="module")
def con(tiny_warehouse: Warehouse) -> duckdb.DuckDBPyConnection:
    return tiny_warehouse.connect()


def assert_rows(df: pl.DataFrame, expected: Rows) -> None:
    rows = df.to_dicts()
    assert len(rows) == len(expected), rows
    for i, (got, want) in enumerate(zip(rows, expected, strict=True)):
        for key, value in want.items():
            if isinstance(value, float):
                assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), (i, key, got)
            else:
                assert got[key] == value, (i, key, got)


@pytest.mark.parametrize("case", sorted(CASES))
def test_query_returns_the_hand_worked_rows(con: duckdb.DuckDBPyConnection, case: str) -> None:
    name, params, where, expected = CASES[case]
    df = query(con, name, **params)
    for column, value in where.items():
        df = df.filter(pl.col(column) == value)
    assert_rows(df, expected)


def test_every_query_has_a_case() -> None:
    assert sorted(available()) == sorted({name for name, *_ in CASES.values()})


def _header(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("--")][:40]


def _section(text: str, key: str) -> str:
    """The text of one header key (e.g. Columns), with its indented continuation lines."""
    out: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f"-- {key}:"):
            out.append(line.split(":", 1)[1])
            for more in lines[i + 1 :]:
                if not re.match(r"^--\s{2,}", more):
                    break
                out.append(more[2:])
            break
    return " ".join(out)


def _columns(text: str) -> list[str]:
    spec = _section(text, "Columns")
    while re.search(r"\([^()]*\)", spec):
        spec = re.sub(r"\([^()]*\)", "", spec)
    return [part.split()[0] for part in spec.split(",") if part.strip()]


def _body(text: str) -> str:
    return re.sub(r"--[^\n]*", "", text)


@pytest.mark.parametrize("name", available())
def test_header_states_question_reads_params_grain_columns(
    con: duckdb.DuckDBPyConnection, name: str
) -> None:
    q = load_query(name)
    header = "\n".join(_header(q.text))
    assert header.startswith(f"-- {name}.sql\n")
    assert q.purpose.endswith("?") or q.purpose.endswith(".") or ":" in q.purpose, q.purpose
    keys = re.findall(r"^-- (Reads|Params|Grain|Columns):", header, re.M)
    assert keys == ["Reads", "Params", "Grain", "Columns"]
    # Params: exactly the variables the SQL reads
    assert set(q.params) == variables_used(q.text)
    for p in q.params.values():
        assert "NULL" in p.doc, f"{name}: say what an unset {p.name} means"
    # Reads: exactly the views the SQL reads
    reads = {v.strip() for v in _section(q.text, "Reads").split(",")}
    views = [*CONTRACTS, *(Path(v).stem for v in DERIVED_VIEWS)]  # class_latency too
    used = {c for c in views if re.search(rf"\b{c}\b", _body(q.text))}
    assert reads == used
    # Columns: the result's columns, in order
    assert _columns(q.text) == query(con, name).columns


@pytest.mark.parametrize("name", available())
def test_runs_on_an_empty_warehouse(tmp_path: Path, name: str) -> None:
    wh = Warehouse(tmp_path / "empty")
    wh.init()
    df = query(wh.connect(), name)
    assert df.columns == _columns(load_query(name).text)


@pytest.mark.parametrize("name", available())
def test_pastes_into_the_duckdb_shell_as_it_is(tiny_warehouse: Warehouse, name: str) -> None:
    """What the shell does: read views.sql (and the files of the views over them, as the
    queries that read those say), then the file's text, no variables set."""
    con = duckdb.connect()
    con.execute(f"SET file_search_path = '{tiny_warehouse.root.resolve()}'")
    con.execute(load_sql(VIEWS_SQL))
    for view in DERIVED_VIEWS:
        con.execute(load_sql(view))
    rows = con.execute((SQL_DIR / f"{name}.sql").read_text()).fetchall()
    assert rows == query(tiny_warehouse.connect(), name).rows()


@pytest.mark.parametrize("name", available())
def test_every_query_and_parameter_is_documented(name: str) -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "report.md").read_text()
    row = next((line for line in docs.splitlines() if line.startswith(f"| `{name}.sql` |")), "")
    assert row, f"docs/report.md has no row for {name}.sql"
    for param in load_query(name).params:
        assert f"`{param}`" in row


def test_unknown_query_lists_the_available_ones() -> None:
    with pytest.raises(UnknownQueryError, match="available: .*throughput"):
        load_query("througput")


def test_unknown_parameter_names_the_declared_ones(con: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(QueryError, match="no parameter slo_s; it takes: run_id, slos, slo_ttft_s"):
        query(con, "throughput", slo_s=0.1)


def test_bad_parameter_value_is_one_line(con: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(QueryError, match=r"parameter slo_ttft_s: cannot use 'soon' as DOUBLE"):
        query(con, "throughput", slo_ttft_s="soon")


def test_parameters_do_not_leak_between_queries(con: duckdb.DuckDBPyConnection) -> None:
    assert query(con, "run_scenarios", run_id=R1).height == 1
    assert query(con, "run_scenarios").height == 4


def test_compare_requests_leaves_out_unfinished_requests_written_to_parquet(
    tmp_path: Path,
) -> None:
    # pyarrow's Parquet statistics leave NaN out, and DuckDB folded `NOT isnan(x)` to true
    # from them, so an unfinished request (finished_s NaN) reached the bootstrap
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    nan = float("nan")
    table = pa.table({
        "run_id": [R1] * 3,
        "scenario": ["s"] * 3,
        "request_id": ["r1", "r2", "r3"],
        "arrival_s": [0.0, 1.0, 2.0],
        "finished_s": [3.0, nan, 4.0],
        "ttft_s": [1.0, nan, 1.5],
        "tpot_s": [0.1, nan, 0.2],
        "e2e_s": [3.0, nan, 2.0],
    })  # fmt: skip
    pq.write_table(table, tmp_path / "sim_requests.parquet")
    con = duckdb.connect()
    con.execute(f"CREATE VIEW sim_requests AS SELECT * FROM '{tmp_path / 'sim_requests.parquet'}'")
    rows = query(con, "compare_requests", run_id=R1, compare_run_id=R1)
    assert rows["request_id"].to_list() == ["r1", "r3"]
    assert not np.isnan(rows["ttft_s"].to_numpy()).any()
