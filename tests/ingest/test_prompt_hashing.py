"""Prompt text hashed with --tokenizer in every format that carries it, then dropped.

A real word-level tokenizer is built offline (``offline_tokenizer``); the hashes
are checked against ``hashing.prefix_hashes`` of the ids that tokenizer gives,
the simulator is shown to find prefix hits in a gateway log only once its
prompts are hashed, equal text hashes equally in every format, and the text
never reaches the warehouse.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq
import pytest

from pipeline.contracts import REQUESTS
from pipeline.ingest import IngestOptions, ingest_logs
from pipeline.ingest.hashing import prefix_hashes
from pipeline.ingest.prompt_text import load_tokenizer
from pipeline.sim.replay_input import prepare, read_requests
from pipeline.sim.scenario import build_scenario
from pipeline.sim.simulate import simulate
from pipeline.sim.summary import summarize
from pipeline.warehouse import Warehouse
from tests.ingest import offline_tokenizer
from tests.ingest.records import gateway, jline, otel_attr, otel_doc, otel_span, token_ids

SYSTEM = "you are a helpful assistant answer the question below in one short sentence " * 3
QUESTIONS = [
    "what is the capital of france",
    "what is the capital of spain",
    "why is the sky blue",
    "tell me a story about a cat",
    "tell me a story about a dog",
    "what is the capital of italy",
]


def _messages(q: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]


def _ids(tok: Path, text: str, special: bool = True) -> list[int]:
    from tokenizers import Tokenizer

    return list(Tokenizer.from_file(str(tok)).encode(text, add_special_tokens=special).ids)


def _ingest(tmp_path: Path, name: str, data: bytes, tok: Path | None, **opts: Any) -> pl.DataFrame:
    log = tmp_path / name
    log.write_bytes(data)
    wh = Warehouse(tmp_path / f"wh-{name}-{tok is not None}")
    res = ingest_logs([str(log)], wh, IngestOptions(quiet=True, tokenizer=tok, **opts))
    assert res.ok, res.files
    return read_requests(wh.files(REQUESTS)).sort("arrival_s")


def _gateway_log(count: int = 60) -> bytes:
    return b"".join(
        jline(gateway(i, prompt_tokens=150, messages=_messages(QUESTIONS[i % len(QUESTIONS)])))
        for i in range(count)
    )


@pytest.fixture
def tok(tmp_path: Path) -> Path:
    load_tokenizer.cache_clear()
    return offline_tokenizer.build(tmp_path / "tok")


def test_gateway_messages_are_hashed_as_the_tokenizer_counts(tmp_path: Path, tok: Path) -> None:
    rows = _ingest(tmp_path, "gw.jsonl", _gateway_log(6), tok)
    for i, row in enumerate(rows.iter_rows(named=True)):
        q = QUESTIONS[i % len(QUESTIONS)]
        text = f"system: {SYSTEM}\nuser: {q}"  # no chat template: role: content lines
        ids = _ids(tok, text)
        assert row["prompt_tokens"] == 150  # the logged count stays
        assert row["block_size"] == 16
        assert row["prefix_hashes"] == prefix_hashes(ids[: 150 // 16 * 16]).tolist()
        assert len(row["prefix_hashes"]) == len(ids) // 16  # fewer tokens than logged: all blocks
    # the shared system prompt: equal leading hashes, then they part
    first, third = rows["prefix_hashes"][0].to_list(), rows["prefix_hashes"][2].to_list()
    assert len(first) == len(third) == 3 and first[:2] == third[:2] and first[2] != third[2]


def test_without_a_tokenizer_the_text_is_not_read(tmp_path: Path) -> None:
    rows = _ingest(tmp_path, "gw.jsonl", _gateway_log(6), None)
    assert rows["prefix_hashes"].list.len().sum() == 0
    assert rows["block_size"].null_count() == rows.height


def test_the_simulator_finds_prefix_hits_once_the_text_is_hashed(tmp_path: Path, tok: Path) -> None:
    sc = build_scenario({"policy": "vllm", "num_gpu_blocks": 100_000})
    rates = {}
    for t in (None, tok):
        frame = _ingest(tmp_path, "gw.jsonl", _gateway_log(), t)
        prep = prepare(frame, sc)
        rates[t is not None] = summarize(simulate(prep.inp, sc.engine()))["prefix_token_hit_rate"]
    assert not rates[False]  # no hashes: caching finds nothing
    # an unbounded cache hits the longest leading run of blocks seen before (one request
    # a second, so each is cached before the next arrives)
    seen: set[int] = set()
    hit = total = 0
    for hashes in frame["prefix_hashes"].to_list():
        k = 0
        while k < len(hashes) and hashes[k] in seen:
            k += 1
        hit, total = hit + 16 * k, total + 150
        seen.update(hashes)
    assert hit > 0.2 * total
    assert rates[True] == pytest.approx(hit / total, rel=1e-12)


def test_the_chat_template_is_followed_when_the_tokenizer_has_one(tmp_path: Path) -> None:
    load_tokenizer.cache_clear()
    tok = offline_tokenizer.build(tmp_path / "tok", template=True)
    rows = _ingest(tmp_path, "gw.jsonl", _gateway_log(1), tok)
    rendered = load_tokenizer(str(tok), "x").render(_messages(QUESTIONS[0]))
    assert rendered.startswith("<s><|system|> you are") and rendered.endswith("<|assistant|>")
    ids = _ids(tok, rendered, special=False)  # the template writes the BOS itself
    assert ids.count(_ids(tok, "", special=True)[0]) == 1  # one BOS, not two
    assert rows["prefix_hashes"][0].to_list() == prefix_hashes(ids[: 150 // 16 * 16]).tolist()


def test_missing_prompt_tokens_are_filled_with_the_tokenized_length(
    tmp_path: Path, tok: Path
) -> None:
    rec = gateway(0, messages=_messages(QUESTIONS[0]))
    del rec["prompt_tokens"]
    rows = _ingest(tmp_path, "gw.jsonl", jline(rec), tok)
    ids = _ids(tok, f"system: {SYSTEM}\nuser: {QUESTIONS[0]}")
    assert rows["prompt_tokens"].to_list() == [len(ids)]
    assert rows["prefix_hashes"][0].to_list() == prefix_hashes(ids).tolist()


@pytest.mark.parametrize("template", [False, True])
def test_same_text_same_hashes_in_every_format(tmp_path: Path, template: bool) -> None:
    load_tokenizer.cache_clear()
    tok = offline_tokenizer.build(tmp_path / "tok", template=template)
    msgs = _messages(QUESTIONS[3])
    n = 500  # a logged count above the tokenized length: every full block is hashed
    gw = jline(gateway(0, prompt_tokens=n, messages=msgs))
    ti = jline({**token_ids(0, prompt_tokens=n), "prompt_token_ids": None, "messages": msgs})
    # OTel: the current convention's parts, and the older gen_ai.prompt holding messages
    parts = [
        {"role": m["role"], "parts": [{"type": "text", "content": m["content"]}]} for m in msgs
    ]
    spans = [
        otel_span(0, otel_attr("gen_ai.input.messages", json.dumps(parts))),
        otel_span(1, otel_attr("gen_ai.prompt", json.dumps(msgs))),
    ]
    ot = jline(otel_doc(*spans))
    got = {
        name: _ingest(tmp_path, name, data, tok)["prefix_hashes"].to_list()
        for name, data in (("gw.jsonl", gw), ("ti.jsonl", ti), ("otel.jsonl", ot))
    }
    expected = got["gw.jsonl"][0]
    assert len(expected) == 3
    assert got["ti.jsonl"] == [expected]
    assert got["otel.jsonl"] == [expected, expected]


def test_a_plain_prompt_hashes_like_token_ids_of_the_same_text(tmp_path: Path, tok: Path) -> None:
    text = SYSTEM + "why is the sky blue"
    gw = _ingest(tmp_path, "gw.jsonl", jline(gateway(0, prompt_tokens=900, prompt=text)), tok)
    span = otel_span(0, otel_attr("gen_ai.prompt", text))
    ot = _ingest(tmp_path, "otel.jsonl", jline(otel_doc(span)), tok)
    ids = _ids(tok, text)
    ti = _ingest(tmp_path, "ti.jsonl", jline(token_ids(0, prompt_token_ids=ids)), None)
    assert gw["prefix_hashes"].to_list() == ot["prefix_hashes"].to_list()
    assert gw["prefix_hashes"].to_list() == ti["prefix_hashes"].to_list()
    assert len(ti["prefix_hashes"][0]) == len(ids) // 16


def test_hashed_text_is_not_stored(tmp_path: Path, tok: Path) -> None:
    marker = "SECRETWORD"
    msgs = [{"role": "user", "content": f"{marker} " + SYSTEM}]
    data = {
        "gw.jsonl": jline(gateway(0, messages=msgs, prompt_tokens=80))
        + jline(gateway(1, messages=msgs, prompt_tokens=-1)),  # quarantined
        "otel.jsonl": jline(
            otel_doc(otel_span(0, otel_attr("gen_ai.input.messages", json.dumps(msgs))))
        ),
        "ti.jsonl": jline({**token_ids(0), "prompt_token_ids": None, "messages": msgs}),
    }
    src = tmp_path / "logs"
    src.mkdir()
    for name, blob in data.items():
        (src / name).write_bytes(blob)
    wh = tmp_path / "wh"
    res = ingest_logs([str(src)], Warehouse(wh), IngestOptions(quiet=True, tokenizer=tok))
    assert res.ok and res.total("rows_kept") == 3 and res.total("rows_quarantined") == 1
    hashed = 0
    for path in wh.rglob("*"):
        if not path.is_file():
            continue
        blobs = [path.read_bytes()]
        if path.suffix == ".parquet":
            table = pq.read_table(path)
            blobs.append(json.dumps(table.to_pylist(), default=str).encode())
            if "prefix_hashes" in table.column_names:
                hashed += sum(len(h) for h in table.column("prefix_hashes").to_pylist())
        for blob in blobs:
            assert marker.encode() not in blob and b"helpful assistant" not in blob, path
    assert hashed > 0
