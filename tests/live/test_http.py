"""The HTTP engine against a real local server whose tokens leave at known times
(pipeline.live.token_server, a subprocess): open-loop sending, the in-flight bound, timing,
timeouts, refused connections and metrics scraping. transformers serve: test_http_server.py."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.errors import ConfigError
from pipeline.live.http import HttpOptions, TextPrompts, run_http, token_prompt
from pipeline.live.types import LiveBatch
from tests.extras import needs, require
from tests.live.servers import free_port, make_bpe_tokenizer, make_tokenizer, token_server

# the HTTP engine runs on httpx whichever client sends the requests
httpx = require("httpx")

TTFT, ITL = 0.05, 0.01


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with token_server(TTFT, ITL) as url:
        yield url


def batch(arrivals: list[float], prompt: int = 8, output: int = 5) -> LiveBatch:
    n = len(arrivals)
    return LiveBatch(
        [f"r{i}" for i in range(n)],
        np.asarray(arrivals, dtype=np.float64),
        np.full(n, prompt, dtype=np.int64),
        np.full(n, output, dtype=np.int64),
    )


def server_records(url: str) -> dict:  # type: ignore[type-arg]
    return httpx.get(url + "/stats").json()  # type: ignore[no-any-return]


# Timing on a shared machine: the client's and the server's processes wait for a CPU for
# milliseconds at a time (8 ms median lateness measured with 7 jobs on 2 cores), so the
# timing test uses a server of its own whose tokens are GAP apart, as are the arrivals,
# and bounds what load can move by GAP: a client that sent a request only after an
# earlier one was answered, or timed a token when the next one came, is off by a GAP or
# more. What load cannot move (never early, order, causality) is asserted exactly.
GAP = 0.05


@pytest.fixture(scope="module")
def gap_server() -> Iterator[str]:
    with token_server(GAP, GAP) as url:
        yield url


@pytest.mark.parametrize("client", ["asyncio", "httpx"])
def test_open_loop_sends_at_arrival_times_and_times_tokens(gap_server: str, client: str) -> None:
    server = gap_server
    before = len(server_records(server)["records"])
    # 20 requests GAP apart, each open ~5 GAP: later ones go while earlier ones stream
    b = batch([GAP * i for i in range(20)])
    opts = HttpOptions(server, server_kind="vllm", metrics_interval_s=0.05, client=client)
    res = run_http(b, opts)
    assert res.engine_info["client"] == client
    assert res.error == [None] * 20
    assert (res.output_tokens_received == 5).all()
    # the client's own record: never before its arrival time, in arrival order, and late
    # by the machine's scheduling, not by waiting for earlier requests (module note)
    late = res.sent_s - b.arrival_s
    assert (late >= 0).all() and (np.diff(res.sent_s) >= 0).all(), late
    assert np.median(late) < GAP, late
    stats = server_records(server)
    assert len(stats["records"]) - before == 20
    by_head = {tuple(r["prompt_head"]): r for r in stats["records"][before:]}
    t0 = float(res.engine_info["perf_counter_t0"])
    rec = [by_head[tuple(token_prompt(i, 8)[:4])] for i in range(20)]
    first_lag = t0 + res.first_token_s - [r["first_written"] for r in rec]
    last_lag = t0 + res.finished_s - [r["last_token_written"] for r in rec]
    # causality on one clock (perf_counter is the machine's monotonic clock): sent before
    # the server read it, each token read after the server's time for it (less 1 ms: its
    # timers may fire up to the clock's resolution early); and not a token late
    received = np.array([r["received"] for r in rec]) - t0
    assert (res.sent_s <= received).all()
    assert (res.first_token_s >= received + GAP - 1e-3).all()
    assert (res.finished_s >= received + 5 * GAP - 1e-3).all()  # 5 tokens, GAP apart
    assert np.median(np.abs(first_lag)) < GAP and np.median(np.abs(last_lag)) < GAP
    server_span = np.array([r["last_token_written"] - r["first_written"] for r in rec])
    assert np.allclose(res.itl_mean_s * 4, res.finished_s - res.first_token_s)  # 4 gaps
    assert np.median(np.abs(res.itl_mean_s * 4 - server_span)) < GAP
    assert (res.itl_max_s >= res.itl_mean_s).all()
    assert stats["max_open"] >= 3  # open loop: never waited for the earlier ones
    # the scraper found vLLM-style /metrics and sampled the server's running count
    assert res.engine_info["server_kind"] == "vllm"
    m = res.metrics
    assert len(m["time_s"]) >= 4 and np.all(np.diff(m["time_s"]) > 0)
    assert np.nanmax(m["num_requests_running"]) >= 2
    assert np.nanmax(m["client_in_flight"]) >= 2


def test_in_flight_bound_holds_on_the_server() -> None:
    with token_server(0.05, 0.01) as url:  # a fresh server: its max_open is this test's
        b = batch([0.0] * 12)
        opts = HttpOptions(url, server_kind="vllm", max_in_flight=3, metrics_interval_s=0.05)
        res = run_http(b, opts)
        assert res.error == [None] * 12
        assert server_records(url)["max_open"] == 3
    # 12 requests, 3 at a time, ~0.09 s each: four waves; the last wave waited for the first
    order = np.sort(res.sent_s)
    assert order[-1] - order[0] >= 3 * 0.09 * 0.9
    waited = res.sent_s > 0.05
    assert waited.sum() >= 8
    assert np.nanmax(res.metrics["client_waiting"]) >= 1


def test_timeout_is_recorded_and_the_rest_completes(server: str) -> None:
    b = LiveBatch(
        ["quick", "slow"],
        np.array([0.0, 0.0]),
        np.array([4, 4], dtype=np.int64),
        np.array([1, 200], dtype=np.int64),  # 200 tokens take 2 s; the limit is 0.5 s
    )
    res = run_http(b, HttpOptions(server, server_kind="vllm", timeout_s=0.5))
    assert res.error[0] is None and res.output_tokens_received[0] == 1
    assert res.error[1] is not None and res.error[1].startswith("timeout after 0.5 s")
    assert 0 < res.output_tokens_received[1] < 200
    assert not np.isnan(res.first_token_s[1])


def test_closed_port_records_every_request_as_failed() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    b = batch([0.0, 0.01, 0.02])
    res = run_http(b, HttpOptions(url, server_kind="vllm"))
    assert len(res.error) == 3
    assert all(e is not None and e.startswith("ConnectError") for e in res.error), res.error
    assert np.isnan(res.first_token_s).all() and (res.output_tokens_received == 0).all()
    assert not np.isnan(res.sent_s).any()
    with pytest.raises(ConfigError, match="cannot reach"):
        run_http(b, HttpOptions(url))  # detection needs the server


def test_text_server_without_tokenizer_is_a_config_error(server: str) -> None:
    with pytest.raises(ConfigError, match="--tokenizer"):
        run_http(batch([0.0]), HttpOptions(server, server_kind="openai"))


def test_text_prompts_to_a_plain_openai_server(server: str, tmp_path: Path) -> None:
    tok = make_tokenizer(tmp_path)
    b = batch([0.0, 0.0], prompt=6, output=5)
    res = run_http(b, HttpOptions(server, server_kind="openai", tokenizer=tok))
    assert res.error == [None, None]
    assert res.engine_info["prompts"].startswith("text")


def test_short_answers_are_failures() -> None:
    """A server that stops before max_tokens (EOS it was not told to ignore)."""
    with token_server(0.01, 0.001, stop_after=3) as url:
        b = batch([0.0, 0.0], output=5)
        res = run_http(b, HttpOptions(url, server_kind="vllm"))
    assert (res.output_tokens_received == 3).all()
    assert res.error == ["short answer: 3 of 5 tokens (finish_reason stop)"] * 2
    assert not np.isnan(res.finished_s).any()  # its times are kept


@pytest.mark.parametrize("kind", ["wordlevel", "bytelevel-bpe"])
@pytest.mark.parametrize("n", [1, 2, 3, 17, 64, 300, 3000])
@needs("tokenizers")
def test_text_prompts_encode_to_the_exact_length(tmp_path: Path, n: int, kind: str) -> None:
    from tokenizers import Tokenizer

    path = make_tokenizer(tmp_path) if kind == "wordlevel" else make_bpe_tokenizer(tmp_path)
    prompts = TextPrompts(path)
    tok = Tokenizer.from_file(str(path))
    texts = {prompts.build(seed, n) for seed in range(5)}
    for text in texts:
        assert len(tok.encode(text).ids) == n  # BOS included, as a server counts it
    # distinct prompts, no shared prefix (one word of a small vocabulary may repeat)
    assert len(texts) == 1 if n == 1 else len(texts) >= (2 if n == 2 else 5)


def test_text_prompts_reject_impossible_lengths(tmp_path: Path) -> None:
    prompts = TextPrompts(make_tokenizer(tmp_path))
    with pytest.raises(ConfigError, match="shorter than the 1 special tokens"):
        prompts.build(0, 0)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not a tokenizers tokenizer.json"):
        TextPrompts(bad)


@contextmanager
def canned_server(reply: bytes) -> Iterator[str]:
    """A listener (in a thread) that answers every request with ``reply``, then closes."""
    import asyncio
    import threading

    ready = threading.Event()
    port = free_port()
    held: dict[str, Any] = {}

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(reply)
        await writer.drain()
        writer.close()

    async def serve() -> None:
        held["loop"], held["stop"] = asyncio.get_running_loop(), asyncio.Event()
        async with await asyncio.start_server(answer, "127.0.0.1", port):
            ready.set()
            await held["stop"].wait()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        held["loop"].call_soon_threadsafe(held["stop"].set)
        thread.join(10)


def sse(*events: str) -> bytes:
    body = "".join(f"data: {e}\n\n" for e in events).encode()
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (b"SSH-2.0-not-http\r\n", "ProtocolError: not an HTTP/1.x status line: b'SSH-2.0-"),
        (sse("5"), "bad stream chunk: a JSON int, not an object"),
        (sse('{"choices": "x"}'), "bad stream chunk: choices is a JSON str"),
        (sse("{not json"), "bad stream chunk: not JSON (Expecting property name"),
        (sse('{"error": "out of memory"}'), "server error: out of memory"),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            "ProtocolError: not a chunk size line",
        ),
        (b"HTTP/1.1 503 Busy\r\ncontent-length: 9\r\n\r\ntoo  busy", "HTTP 503: too busy"),
    ],
)
def test_odd_answers_are_recorded_failures(reply: bytes, error: str) -> None:
    with canned_server(reply) as url:
        res = run_http(batch([0.0, 0.0]), HttpOptions(url, "vllm"))
    assert all(e is not None and e.startswith(error) for e in res.error), res.error


def test_base_url_is_checked_and_may_end_in_v1(server: str) -> None:
    with pytest.raises(ConfigError, match="expected http://HOST:PORT"):
        HttpOptions("localhost:8000")
    assert HttpOptions(server + "/v1/").base_url == server
    res = run_http(batch([0.0]), HttpOptions(server + "/v1", server_kind="vllm"))
    assert res.error == [None]


def test_a_kept_connection_the_server_closed_is_retried_on_a_new_one() -> None:
    """One connection at a time; the server drops it after every answer (keep-alive ended)."""
    with token_server(0.01, 0.001, close_after_answer=True) as url:
        b = batch([0.0, 0.1, 0.2, 0.3])
        res = run_http(b, HttpOptions(url, server_kind="vllm", max_in_flight=1))
        assert res.error == [None] * 4
        assert len(server_records(url)["records"]) == 4  # each sent once


def test_prompts_share_the_blocks_the_trace_shared(tmp_path: Path) -> None:
    """Equal chained hashes give equal tokens; a block that does not fit is left out."""
    a = token_prompt(0, 12, [11, 22], 4)
    b = token_prompt(1, 10, [11, 22], 4)
    c = token_prompt(2, 12, [11, 33], 4)
    short = token_prompt(3, 6, [11, 22], 4)
    alone = token_prompt(4, 12)
    assert (len(a), len(b), len(c), len(short)) == (12, 10, 12, 6)
    assert a[:8] == b[:8] and a[8:10] != b[8:10]
    assert a[:4] == c[:4] and a[4:8] != c[4:8]
    assert short[:4] == a[:4] and short[4:] != a[4:6]
    assert alone[:4] != a[:4]
    text = TextPrompts(make_tokenizer(tmp_path))
    ta = text.build(0, 13, [11, 22], 4).split()
    tb = text.build(1, 11, [11, 22], 4).split()
    assert (len(ta), len(tb)) == (12, 10)  # + BOS
    assert ta[:8] == tb[:8] and ta[8:10] != tb[8:10]


def test_shared_prefixes_reach_the_server(server: str) -> None:
    before = len(server_records(server)["records"])
    b = LiveBatch(
        ["a", "b", "c"],
        np.array([0.0, 0.01, 0.02]),
        np.array([40, 40, 40], dtype=np.int64),
        np.array([2, 2, 2], dtype=np.int64),
        prefix_hashes=[[7, 8], [7, 9], []],
        block_size=np.array([16, 16, 16], dtype=np.int64),
    )
    res = run_http(b, HttpOptions(server, server_kind="vllm"))
    assert res.error == [None] * 3
    heads = sorted(tuple(r["prompt_head"]) for r in server_records(server)["records"][before:])
    shared = tuple(token_prompt(0, 40, [7], 16)[:4])
    assert heads.count(shared) == 2  # a and b begin alike, c does not
