"""``nightly``'s SLO headroom: each SLO's value, headroom and change, exit 3 below a margin.

The issue's case: on a shifted day chat's p99 TTFT rises toward its SLO (261 -> 493 ms
against 500 ms) while the whole traffic's p99 barely moves; the drift lines must show the
shrinking headroom.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.drift import compare, headrooms, thresholds
from pipeline.nightly import EXIT_DRIFT, EXIT_OK

CHAT = "ttft_p99@tenant=chat"


def test_the_issue_s_day_by_hand() -> None:
    prev: dict[str, float | None] = {
        "ttft_p99.prod": 0.600,
        f"slo.prod.{CHAT}": 0.261,
        "slo.prod.ttft_p99": 0.600,
    }
    cur: dict[str, float | None] = {
        "ttft_p99.prod": 0.606,
        f"slo.prod.{CHAT}": 0.493,
        "slo.prod.ttft_p99": 0.606,
    }
    changes = compare(prev, cur, thresholds({}))
    assert not any(c.drift for c in changes)  # +1% whole traffic; SLO values: headroom only
    chat, whole = headrooms(prev, cur, [("prod", CHAT, 0.5), ("prod", "ttft_p99", 1.0)], 10.0)
    assert chat.headroom_s == pytest.approx(0.007)
    assert chat.headroom_pct == pytest.approx(1.4)
    assert chat.change_s == pytest.approx(0.232)
    assert chat.below_margin and not whole.below_margin  # whole: 39.4% left
    assert chat.describe() == (
        "ttft_p99@tenant=chat in prod: 493.0 ms of 500.0 ms, headroom 7.0 ms (1.4% of the "
        "limit); +232.0 ms since last night (261.0 ms); below the 10% margin"
    )
    # no margin configured: reported, never flagged; a missed SLO has negative headroom
    (missed,) = headrooms({}, {f"slo.prod.{CHAT}": 0.6}, [("prod", CHAT, 0.5)], None)
    assert missed.headroom_pct == pytest.approx(-20.0) and not missed.below_margin
    assert missed.change_s is None and missed.to_dict()["previous_s"] is None
    (none,) = headrooms({}, {}, [("prod", CHAT, 0.5)], 10.0)
    assert none.value_s is None and not none.below_margin


# --- end to end -----------------------------------------------------------------------

T0 = datetime(2024, 5, 1, tzinfo=UTC)


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _log(day: int, chat_prompt: int) -> str:
    """Every 2 s a request (no queueing): two of three batch with long prompts, one chat
    with ``chat_prompt`` tokens; the batch requests set the whole traffic's p99."""
    lines = []
    for i in range(240):
        start = T0 + timedelta(days=day, seconds=2 * i)
        chat = i % 3 == 0
        prompt = chat_prompt + i % 7 if chat else 6000 + 10 * (i % 11)
        lines.append(
            json.dumps(
                {
                    "request_id": f"d{day}-{i}",
                    "startTime": _iso(start),
                    "endTime": _iso(start + timedelta(seconds=1)),
                    "prompt_tokens": prompt,
                    "completion_tokens": 20,
                    "model": "m",
                    "user": "chat" if chat else "batch",
                    "status": "success",
                }
            )
        )
    return "\n".join(lines) + "\n"


def _config(chat_limit: str, margin: float | None) -> str:
    drift = f"[drift]\nslo_headroom_pct = {margin}\n" if margin is not None else ""
    return f"""
[nightly]
warehouse = "wh"
inbox = ["inbox/*.jsonl"]
report = false

[[scenario]]
name = "prod"
policy = "vllm"
max_num_seqs = 32

[slo]
ttft_p99 = "60s"
"{CHAT}" = "{chat_limit}"

{drift}"""


def _night(root: Path) -> tuple[int, dict]:
    r = CliRunner().invoke(cli, ["nightly", str(root / "nightly.toml"), "--json"])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.output
    return r.exit_code, json.loads(r.output)


def _chat(m: dict) -> dict:
    (h,) = [h for h in m["slo_headroom"] if h["slo"] == CHAT]
    return h  # type: ignore[no-any-return]


def test_a_class_closing_in_on_its_slo_exits_3(tmp_path: Path) -> None:
    first = tmp_path / "first"
    (first / "inbox").mkdir(parents=True)
    (first / "nightly.toml").write_text(_config("60s", None))
    (first / "inbox" / "day0.jsonl").write_text(_log(0, chat_prompt=100))
    code, night1 = _night(first)
    assert code == EXIT_OK, night1
    # the shifted day: chat's prompts 20 times longer; the batch requests as before
    (first / "inbox" / "day1.jsonl").write_text(_log(1, chat_prompt=2000))
    second = tmp_path / "second"
    shutil.copytree(first, second)
    code, measured = _night(first)  # a generous limit: tonight's values, no flag
    assert code == EXIT_OK, measured
    chat = _chat(measured)
    assert chat["previous_s"] == _chat(night1)["value_s"]
    assert chat["value_s"] > 3 * chat["previous_s"]  # chat's p99 rose ...
    whole = measured["figures"]["ttft_p99.prod"]
    assert abs(whole / night1["figures"]["ttft_p99.prod"] - 1) < 0.05  # ... the whole one not
    assert chat["change_s"] == pytest.approx(chat["value_s"] - chat["previous_s"])

    # the same night again (the replay is deterministic), its chat limit 5% above the value
    limit_ms = chat["value_s"] * 1e3 / 0.95
    (second / "nightly.toml").write_text(_config(f"{limit_ms:.6f}ms", 10))
    code, flagged = _night(second)
    assert code == EXIT_DRIFT, flagged
    assert flagged["status"] == "drift"
    got = _chat(flagged)
    assert got["value_s"] == pytest.approx(chat["value_s"], rel=1e-12)
    assert got["headroom_pct"] == pytest.approx(5.0, rel=1e-6)
    assert got["headroom_s"] == pytest.approx(got["limit_s"] - got["value_s"])
    assert got["below_margin"] and got["margin_pct"] == 10
    (line,) = [d for d in flagged["drifts"] if d.startswith("slo headroom: ")]
    assert f"{CHAT} in prod:" in line and "below the 10% margin" in line
    whole_slo = next(h for h in flagged["slo_headroom"] if h["slo"] == "ttft_p99")
    assert not whole_slo["below_margin"]
    assert flagged["figures"][f"slo.prod.{CHAT}"] == got["value_s"]


@pytest.mark.parametrize(
    ("drift", "slo", "message"),
    [
        ('slo_headroom_pct = "10%"', True, "slo_headroom_pct (percent of each SLO's limit"),
        ("slo_headroom_pct = 100", True, "must be a finite number in [0, 100)"),
        ("slo_headroom_pct = -1", True, "must be a finite number in [0, 100)"),
        ("slo_headroom_pct = true", True, "got a boolean"),
        ("slo_headroom_pct = 10", False, "slo_headroom_pct needs the SLOs to watch: add [slo]"),
        ("slo_headrom_pct = 10", True, "unknown key 'slo_headrom_pct'"),
    ],
)
def test_bad_margin_is_one_line(tmp_path: Path, drift: str, slo: bool, message: str) -> None:
    cfg = tmp_path / "nightly.toml"
    slos = '[slo]\nttft_p99 = "1s"\n' if slo else ""
    cfg.write_text(
        f'[nightly]\ninbox = ["x"]\n[[scenario]]\npolicy = "vllm"\n{slos}[drift]\n{drift}\n'
    )
    r = CliRunner().invoke(cli, ["nightly", str(cfg)])
    assert r.exit_code == 1
    assert message in r.output and len(r.output.strip().splitlines()) == 1, r.output


# --- a fleet: each pool's headroom -----------------------------------------------------


def _fleet_config(limit: str, margin: float | None) -> str:
    """The production scenario as a fleet: chat's requests on a pool of their own."""
    drift = f"[drift]\nslo_headroom_pct = {margin}\n" if margin is not None else ""
    return f"""
[nightly]
warehouse = "wh"
inbox = ["inbox/*.jsonl"]
report = false

[[scenario]]
name = "prod"
policy = "vllm"
max_num_seqs = 32

[[scenario.pool]]
name = "chat"
tenants = ["chat"]

[[scenario.pool]]
name = "batch"

[slo]
ttft_p99 = "{limit}"

{drift}"""


def _pool(m: dict, pool: str | None) -> dict:
    (h,) = [h for h in m["slo_headroom"] if h["pool"] == pool]
    return h  # type: ignore[no-any-return]


def test_a_fleet_s_pool_closing_in_on_its_slo_exits_3(tmp_path: Path) -> None:
    first = tmp_path / "first"
    (first / "inbox").mkdir(parents=True)
    (first / "nightly.toml").write_text(_fleet_config("60s", None))
    (first / "inbox" / "day0.jsonl").write_text(_log(0, chat_prompt=100))
    second = tmp_path / "second"
    shutil.copytree(first, second)
    code, night = _night(first)  # a generous limit: tonight's values, no flag
    assert code == EXIT_OK, night
    assert [h["pool"] for h in night["slo_headroom"]] == [None, "chat", "batch"]
    pools = night["scenarios"]["prod"]["pools"]
    for name in ("chat", "batch"):
        value = night["figures"][f"slo.prod.pool={name}.ttft_p99"]
        assert value == pools[name]["slo"]["ttft_p99"]["measured_s"]
        assert _pool(night, name)["value_s"] == value
    chat = _pool(night, "chat")["value_s"]
    # the same night again, the limit 5% above chat's pool's value: chat's pool flags
    (second / "nightly.toml").write_text(_fleet_config(f"{chat * 1e3 / 0.95:.6f}ms", 10))
    code, flagged = _night(second)
    assert code == EXIT_DRIFT, flagged
    got = _pool(flagged, "chat")
    assert got["headroom_pct"] == pytest.approx(5.0, rel=1e-6) and got["below_margin"]
    lines = [d for d in flagged["drifts"] if "(pool chat)" in d]
    assert len(lines) == 1 and lines[0].startswith("slo headroom: ttft_p99 in prod (pool chat):")
