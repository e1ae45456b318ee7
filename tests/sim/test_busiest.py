"""--busiest: the busiest window of the selected requests, by arrivals or tokens, and its
warm-up (replayed, left out of the figures).

The hand-made day (seconds after midnight, 2024-05-01): a slow trickle every 60 s from
0 to 540 (10 requests), a burst of 20 small requests at 600..619 (the most arrivals in
a minute), three huge requests at 1200, 1210, 1220 (the most tokens in a minute), then
one every 100 s from 1300 to 1800.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from pipeline.busiest import Busiest, find_window, format_duration, parse_duration
from pipeline.cli import cli
from pipeline.contracts import REQUESTS, RUNS, SIM_REQUESTS
from pipeline.errors import ConfigError
from pipeline.selection import RequestFilter
from pipeline.sim.replay_input import prepare, read_window
from pipeline.sim.simulate import LeadInput, simulate
from pipeline.sim.state import F_ARRIVAL, F_FIRST_SCHED, SF_START
from pipeline.sim.summary import request_metric
from pipeline.warehouse import Warehouse
from tests.helpers import make_scenario, requests_table, write_requests

DAY = datetime(2024, 5, 1, tzinfo=UTC)
TRICKLE = [60.0 * i for i in range(10)]  # 0 .. 540
BURST = [600.0 + i for i in range(20)]  # 600 .. 619
HUGE = [1200.0, 1210.0, 1220.0]
TAIL = [1300.0 + 100.0 * i for i in range(6)]  # 1300 .. 1800
ARRIVALS = TRICKLE + BURST + HUGE + TAIL
PROMPT = [10] * 10 + [10] * 20 + [2000] * 3 + [10] * 6
OUTPUT = [10] * 10 + [5] * 20 + [100] * 3 + [10] * 6


def _warehouse(root: Path, arrivals: list[float], prompt: list[int], output: list[int]) -> Path:
    gaps = np.diff(np.asarray([arrivals[0], *arrivals]))
    return write_requests(root, requests_table(prompt, output, gaps, start=DAY))


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _warehouse(tmp_path_factory.mktemp("busiest") / "wh", ARRIVALS, PROMPT, OUTPUT)


def _window(root: Path, **kw: object) -> tuple[list[float], object]:
    sel = RequestFilter(busiest=Busiest(**kw))  # type: ignore[arg-type]
    frame, window = read_window(Warehouse(root).files(REQUESTS), sel)
    offsets = [(t - DAY).total_seconds() for t in frame["arrival_time"].to_list()]
    return offsets, window


def test_the_busiest_minute_by_arrivals_is_the_burst_and_by_tokens_the_huge_ones(
    day: Path,
) -> None:
    offsets, w = _window(day, duration_s=60.0, warmup_s=0.0)
    assert offsets == BURST
    assert w.start == DAY + timedelta(seconds=600) and w.end == DAY + timedelta(seconds=660)
    assert (w.num_requests, w.tokens, w.num_warmup) == (20, 20 * 15, 0)
    span = ARRIVALS[-1] - ARRIVALS[0]
    assert w.mean == pytest.approx(len(ARRIVALS) * 60.0 / span)
    assert w.ratio == pytest.approx(20 / w.mean)

    offsets, w = _window(day, duration_s=60.0, by="tokens", warmup_s=0.0)
    assert offsets == HUGE
    assert w.tokens == 3 * 2100 and w.value == w.tokens
    assert w.mean == pytest.approx(sum(PROMPT + OUTPUT) * 60.0 / span)


def test_the_warm_up_is_the_span_before_the_window_and_stops_at_the_selection(
    day: Path,
) -> None:
    offsets, w = _window(day, duration_s=60.0)  # warm-up 5m: 300 .. 599
    assert offsets == [300.0, 360.0, 420.0, 480.0, 540.0, *BURST]
    assert w.num_warmup == 5 and w.warmup_start == DAY + timedelta(seconds=300)
    # by tokens the window starts at 1200; an hour's warm-up stops at the first request
    offsets, w = _window(day, duration_s=60.0, by="tokens", warmup_s=3600.0)
    assert offsets == ARRIVALS[: ARRIVALS.index(1220.0) + 1]  # back to the first request
    assert w.warmup_used_s == 1200.0 and w.num_warmup == 30


def _brute(t: np.ndarray, span: int, w: np.ndarray) -> tuple[int, int]:
    """The first start with the largest sum, by a loop over every start (the reference)."""
    best, at = -1, -1
    for i in range(len(t)):
        inside = (t >= t[i]) & (t < t[i] + span)
        if w[inside].sum() > best:
            best, at = int(w[inside].sum()), i
    return at, best


def test_find_window_matches_a_loop_over_every_start_and_ties_go_to_the_earliest() -> None:
    rng = np.random.default_rng(3)
    for _ in range(30):
        t = np.sort(rng.integers(0, 1_000, size=int(rng.integers(1, 60)))).astype(np.int64)
        w = rng.integers(1, 50, size=len(t)).astype(np.int64)
        span = int(rng.integers(1, 300))
        k, end, value = find_window(t, span, w)
        assert (k, value) == _brute(t, span, w)
        assert end == int(np.searchsorted(t, t[k] + span))
        k, _, value = find_window(t, span)
        assert (k, value) == _brute(t, span, np.ones_like(t))
    # two requests in every 15 s from 0, 10 and 20: the first
    assert find_window(np.array([0, 10, 20, 30]), 15) == (0, 2, 2)
    # equal arrival times: the window starts at the first of them
    assert find_window(np.array([0, 5, 5, 5, 40]), 4) == (1, 4, 3)


def test_a_lead_input_replays_its_lead_and_leaves_it_out() -> None:
    """The measured requests' times are those of the whole replay (from the first of them),
    and the step rows those that start after it arrives: the warm-up ran."""
    sc = make_scenario("vllm", max_num_seqs=2)
    t = np.array([0.0, 0.05, 0.1, 0.15, 2.0, 2.01, 2.02, 2.5])
    prompt = np.array([300, 300, 300, 300, 40, 40, 40, 40])
    output = np.array([400, 400, 400, 400, 20, 20, 20, 20])
    full = simulate(LeadInput(t, prompt, output), sc.engine())
    lead = simulate(LeadInput(t, prompt, output, lead=4), sc.engine())
    assert lead.num_requests == 4
    np.testing.assert_array_equal(lead.rqf, full.rqf[4:] - 2.0)
    keep = full.stf[:, SF_START] >= 2.0
    np.testing.assert_array_equal(lead.st, full.st[keep])
    np.testing.assert_array_equal(lead.stf[:, SF_START], full.stf[keep, SF_START] - 2.0)
    # streamed in chunks, the same rows
    chunks: list[np.ndarray] = []
    simulate(
        LeadInput(t, prompt, output, lead=4),
        sc.engine(),
        on_steps=lambda st, stf: chunks.append(stf.copy()),
        step_rows=3,
    )
    np.testing.assert_array_equal(np.concatenate(chunks), lead.stf)
    # the warm-up's long requests still run at 2.0: the window's first request waits
    alone = simulate(LeadInput(t[4:] - 2.0, prompt[4:], output[4:]), sc.engine())
    assert alone.rqf[0, F_FIRST_SCHED] == alone.rqf[0, F_ARRIVAL]
    assert lead.rqf[0, F_FIRST_SCHED] > lead.rqf[0, F_ARRIVAL]
    assert request_metric(lead, "queue_s").max() > request_metric(alone, "queue_s").max()


def _replay(root: Path, *args: str) -> tuple[int, str]:
    r = CliRunner().invoke(cli, ["replay", "--warehouse", str(root), "--policy", "vllm", *args])
    return r.exit_code, r.stdout if r.exit_code == 0 else r.output


def test_replay_says_which_window_records_it_and_measures_only_it(day: Path) -> None:
    code, out = _replay(day, "--busiest", "1m", "--json")
    assert code == 0, out
    doc = json.loads(out)
    window = doc["selection"]["busiest"]
    assert (window["start"], window["end"]) == ("2024-05-01T00:10:00Z", "2024-05-01T00:11:00Z")
    assert (window["num_requests"], window["num_warmup_requests"], window["by"]) == (
        20,
        5,
        "arrivals",
    )
    assert doc["selection"]["filter"] == "the busiest 1m by arrivals of every request"
    (scenario,) = doc["scenarios"].values()
    assert scenario["summary"]["num_requests"] == 20
    assert scenario["summary"]["num_busiest_warmup_requests"] == 5
    wh = Warehouse(day)
    (row,) = pq.read_table(wh.table_dir(RUNS) / f"{doc['run_id']}.parquet").to_pylist()
    assert json.loads(row["details"])["selection"]["busiest"] == window
    (path,) = [p for p in wh.files(SIM_REQUESTS) if f"run_id={doc['run_id']}" in str(p)]
    ids = pq.read_table(path)["request_id"].to_pylist()
    assert ids == [f"r{ARRIVALS.index(t):06d}" for t in BURST]  # no warm-up request

    code, text = _replay(day, "--busiest", "60s", "--busiest-by", "tokens")
    assert code == 0, text
    line = text.splitlines()[0]
    assert line.startswith("busiest 1m by tokens: 2024-05-01T00:20:00Z to 2024-05-01T00:21:00Z")
    assert "3 arrivals, 6,300 tokens" in line and "--busiest-warmup" in line


def test_busiest_within_from_to_and_with_other_filters(day: Path) -> None:
    # from 00:15 the burst is out of range: the busiest minute by arrivals is the huge ones'
    code, out = _replay(day, "--busiest", "1m", "--from", "2024-05-01T00:15", "--json")
    assert code == 0, out
    window = json.loads(out)["selection"]["busiest"]
    assert window["start"] == "2024-05-01T00:20:00Z" and window["num_requests"] == 3
    # the warm-up starts no earlier than the selection: 00:15 .. 00:20 holds nothing
    assert window["num_warmup_requests"] == 0
    code, out = _replay(day, "--busiest", "1m", "--where", "prompt_tokens < 100", "--json")
    assert code == 0, out
    assert json.loads(out)["selection"]["busiest"]["start"] == "2024-05-01T00:10:00Z"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--busiest", "2h"], 1, "--busiest 2h is longer than the selected requests' span (30m"),
        (["--busiest", "0"], 2, "'0': expected a duration more than 0"),
        (["--busiest", "-5m"], 2, "'-5m': expected a duration more than 0"),
        (["--busiest", "soon"], 2, "'soon': expected a duration more than 0, e.g. 90s, 15m"),
        (["--busiest", "inf"], 2, "'inf': expected a finite duration"),
        (["--busiest", "1m", "--busiest-warmup", "-1s"], 2, "expected a duration 0 or more"),
        (["--busiest", "1m", "--busiest-by", "bytes"], 2, "'bytes' is not one of"),
        (["--busiest-by", "tokens"], 2, "--busiest-by needs --busiest DURATION"),
        (["--busiest-warmup", "1m"], 2, "--busiest-warmup needs --busiest DURATION"),
        (["--busiest", "1m", "--model", "gpt"], 1, "no request matches model in (gpt)"),
    ],
)
def test_bad_input_is_one_line(day: Path, args: list[str], code: int, message: str) -> None:
    got, text = _replay(day, *args)
    assert got == code, text
    assert message in text
    assert len([line for line in text.splitlines() if line.strip()]) <= 3  # usage + error


def test_sweep_and_capacity_take_and_report_the_window(day: Path, tmp_path: Path) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text('[base]\npolicy = "vllm"\n[axes]\nmax_num_seqs = [4, 8]\n')
    args = ["sweep", str(grid), "--warehouse", str(day), "--jobs", "1", "--busiest", "1m"]
    r = CliRunner().invoke(cli, [*args, "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["selection"]["busiest"]["start"] == "2024-05-01T00:10:00Z"
    assert {s["summary"]["num_requests"] for s in out["scenarios"].values()} == {20}
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("busiest 1m by arrivals: 2024-05-01T00:10:00Z")
    # with its interval: the replicates resample the window, its warm-up kept ahead of it
    r = CliRunner().invoke(cli, ["capacity", "--warehouse", str(day), "--slo", "ttft_p99=60s",
                                 "--search", "concurrency", "--max-concurrency", "2",
                                 "--busiest", "1m", "--summary-only", "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["selection"]["busiest"]["num_warmup_requests"] == 5
    search = out["searches"]["concurrency"]
    assert {p["summary"]["num_requests"] for p in search["probes"]} == {20}
    assert search["answer"] is not None and search["interval"] is not None


def test_durations_parse_and_print_in_their_units() -> None:
    assert [parse_duration(x) for x in ("90s", "15m", "1h", "500ms", "2", "1.5h", "1d")] == [
        90.0,
        900.0,
        3600.0,
        0.5,
        2.0,
        5400.0,
        86400.0,
    ]
    assert parse_duration("0", zero=True) == 0.0
    assert [format_duration(s) for s in (90.0, 900.0, 3600.0, 5400.0, 2.5)] == [
        "1m30s",
        "15m",
        "1h",
        "1h30m",
        "2.5s",
    ]
    with pytest.raises(ValueError, match="expected a duration more than 0"):
        parse_duration("1 fortnight")
    with pytest.raises(ConfigError, match="--busiest-by must be one of arrivals, tokens"):
        Busiest(60.0, by="bytes")


def test_replicates_resample_the_window_and_keep_its_warm_up_ahead(day: Path) -> None:
    from pipeline.busiest import WARMUP_COLUMN
    from pipeline.plan.replicates import resample_trace

    sel = RequestFilter(busiest=Busiest(60.0))
    frame, _ = read_window(Warehouse(day).files(REQUESTS), sel)
    drawn = resample_trace(frame, 4, np.random.default_rng(1))
    lead = int(frame[WARMUP_COLUMN].sum())
    assert drawn[:lead].equals(frame[:lead])
    assert not drawn[WARMUP_COLUMN][lead:].any()
    assert set(drawn["request_id"][lead:]) <= set(frame["request_id"][lead:])
    assert drawn["arrival_s"][lead:].min() == frame["arrival_s"][lead]
    sc = make_scenario("vllm")
    assert prepare(drawn, sc).num_lead == lead


def test_drawn_requests_with_a_warm_up_are_refused(day: Path) -> None:
    from pipeline.errors import ScenarioError

    frame, _ = read_window(Warehouse(day).files(REQUESTS), RequestFilter(busiest=Busiest(60.0)))
    sc = make_scenario("vllm", arrivals="poisson", rate=2.0, num_requests=50)
    with pytest.raises(ScenarioError, match="num_requests with arrivals = 'poisson' draws"):
        prepare(frame, sc)
    prep = prepare(frame, make_scenario("vllm", arrivals="poisson", rate=2.0))
    assert (prep.num_lead, len(prep.request_ids)) == (5, 20)


def test_a_warm_up_request_dropped_for_its_length_is_not_counted(tmp_path: Path) -> None:
    root = _warehouse(tmp_path / "wh", [0, 10, 100, 101, 102], [5000, 10, 10, 10, 5000], [5] * 5)
    sel = RequestFilter(busiest=Busiest(5.0, warmup_s=200.0))
    frame, window = read_window(Warehouse(root).files(REQUESTS), sel)
    assert window is not None and window.num_warmup == 2
    prep = prepare(frame, make_scenario("vllm", drop_too_long=True))
    assert (prep.num_lead, prep.num_dropped, len(prep.request_ids)) == (1, 1, 2)
