"""The live client against misbehaving servers and bad arguments: a held corpus.

Each case is a small server in this process (tests.live.servers.scripted_server) that
sends exactly the bad bytes, or a bad argument, with the exact outcome: the request's
``ok=false`` reason, the command's exit code and one-line message, what the views show.
Whatever a server sends, no request is recorded as a success it was not, and the run
ends; no case here waits on the wall clock beyond a sub-second per-request timeout.
"""

from __future__ import annotations

import json
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.contracts import REQUESTS, write_table
from pipeline.errors import ConfigError
from pipeline.live.http import HttpOptions, run_http
from pipeline.live.replay import Selection
from pipeline.live.types import LiveBatch, LiveResult
from pipeline.warehouse import Warehouse
from tests.extras import require
from tests.helpers import request, table
from tests.live.servers import (
    HANG,
    Reply,
    json_reply,
    make_tokenizer,
    scripted_server,
    sse_reply,
)

# the HTTP engine runs on httpx whichever client sends the requests
require("httpx")

CHUNKED = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"


def tok(text: Any = "ka", finish: Any = None, usage: Any = None, **extra: Any) -> str:
    """One completion chunk, as vLLM sends it."""
    chunk: dict[str, Any] = {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    if usage is not None:
        chunk["usage"] = usage
    return json.dumps({**chunk, **extra})


def last(usage: str) -> str:
    """The third chunk of three with a usage object given as raw JSON text."""
    head = '{"choices": [{"index": 0, "text": "ka", "finish_reason": "length"}], "usage": '
    return head + usage + "}"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


GOOD = [tok(), tok(), tok(finish="length", usage={"completion_tokens": 3, "prompt_tokens": 8})]
DEEP = 50_000


def batch(n: int = 2, prompt: int = 8, output: int = 3) -> LiveBatch:
    return LiveBatch(
        [f"r{i}" for i in range(n)],
        np.zeros(n),
        np.full(n, prompt, dtype=np.int64),
        np.full(n, output, dtype=np.int64),
    )


def replay(
    reply: Reply, b: LiveBatch | None = None, routes: dict[str, Reply] | None = None, **kw: Any
) -> LiveResult:
    kw.setdefault("server_kind", "vllm")
    kw.setdefault("timeout_s", 5.0)
    kw.setdefault("metrics_interval_s", 0.05)
    with scripted_server({"/v1/completions": reply, **(routes or {})}) as srv:
        return run_http(b or batch(), HttpOptions(srv.url, **kw))


# --- a stream's bytes: each request fails with this reason, the run goes on -----------

STREAMS: dict[str, tuple[Reply, str]] = {
    # numbers
    "usage-infinity": (
        sse_reply(*GOOD[:2], last('{"completion_tokens": Infinity}')),
        "bad stream chunk: non-finite number Infinity: ",
    ),
    "usage-minus-infinity": (
        sse_reply(*GOOD[:2], last('{"completion_tokens": -Infinity}')),
        "bad stream chunk: non-finite number -Infinity: ",
    ),
    "usage-nan": (
        sse_reply(*GOOD[:2], last('{"completion_tokens": NaN}')),
        "bad stream chunk: non-finite number NaN: ",
    ),
    "usage-1e30-float": (
        sse_reply(*GOOD[:2], last('{"completion_tokens": 1e30}')),
        "bad stream chunk: usage.completion_tokens is 1e+30, outside 0..2147483647",
    ),
    "usage-10^30-int": (
        sse_reply(*GOOD[:2], last('{"completion_tokens": 1%s}' % ("0" * 30))),
        "bad stream chunk: an integer of 31 digits: ",
    ),
    "usage-10^20-int": (
        sse_reply(*GOOD[:2], last('{"completion_tokens": 1%s}' % ("0" * 20))),
        "bad stream chunk: usage.completion_tokens is 1e+20, outside 0..2147483647",
    ),
    "usage-5000-digits": (
        sse_reply(*GOOD[:2], last('{"completion_tokens": %s}' % ("9" * 5000))),
        "bad stream chunk: an integer of 5,000 digits: ",
    ),
    "usage-1e400": (
        sse_reply(*GOOD[:2], last('{"completion_tokens": 1e400}')),
        "bad stream chunk: number 1e400 is past a double: ",
    ),
    "usage-negative": (
        sse_reply(*GOOD[:2], last('{"completion_tokens": -3}')),
        "bad stream chunk: usage.completion_tokens is -3, outside 0..2147483647",
    ),
    "usage-fraction": (
        sse_reply(*GOOD[:2], last('{"completion_tokens": 2.5}')),
        "bad stream chunk: usage.completion_tokens is 2.5, not a whole token count",
    ),
    "usage-string": (
        sse_reply(*GOOD[:2], last('{"completion_tokens": "3"}')),
        'bad stream chunk: usage.completion_tokens is "3", not a token count',
    ),
    "usage-bool": (
        sse_reply(*GOOD[:2], last('{"completion_tokens": true}')),
        "bad stream chunk: usage.completion_tokens is true, not a token count",
    ),
    "usage-more-than-asked": (
        sse_reply(*GOOD[:2], last('{"completion_tokens": 1000}')),
        "bad stream chunk: usage.completion_tokens 1000, 3 asked",
    ),
    "prompt-tokens-list": (
        sse_reply(*GOOD[:2], last('{"completion_tokens": 3, "prompt_tokens": [8]}')),
        "bad stream chunk: usage.prompt_tokens is [8], not a token count",
    ),
    "usage-a-list": (
        sse_reply(*GOOD[:2], last("[3]")),
        "bad stream chunk: usage is a JSON list",
    ),
    # depth
    "nested-50000-arrays": (
        sse_reply(GOOD[0], "[" * DEEP + "]" * DEEP),
        "bad stream chunk: JSON nested deeper than 64 levels: ",
    ),
    "nested-50000-objects-in-text": (
        sse_reply(
            '{"choices": [{"text": ' + '{"a": ' * DEEP + "1" + "}" * DEEP + "}]}",
        ),
        "bad stream chunk: JSON nested deeper than 64 levels: ",
    ),
    "nested-65-levels": (
        sse_reply(tok(extra=json.loads("[" * 64 + "]" * 64))),
        "bad stream chunk: JSON nested deeper than 64 levels: ",
    ),
    # shapes
    "chunk-a-number": (sse_reply("5"), "bad stream chunk: a JSON int, not an object"),
    "chunk-a-list": (sse_reply("[1, 2]"), "bad stream chunk: a JSON list, not an object"),
    "chunk-empty-data": (sse_reply(""), "bad stream chunk: not JSON (Expecting value at 0): ''"),
    "chunk-truncated-json": (
        sse_reply('{"choices": [{"text": "ka"'),
        "bad stream chunk: not JSON (Expecting ',' delimiter at 26): ",
    ),
    "choices-an-object": (
        sse_reply('{"choices": {"text": "ka"}}'),
        "bad stream chunk: choices is a JSON dict",
    ),
    "choice-a-string": (
        sse_reply('{"choices": ["ka"]}'),
        "bad stream chunk: choices[0] is a JSON str",
    ),
    "text-a-number": (sse_reply(tok(text=7)), "bad stream chunk: choices[0].text is a JSON int"),
    "text-an-object": (
        sse_reply(tok(text={"t": "ka"})),
        "bad stream chunk: choices[0].text is a JSON dict",
    ),
    "finish-reason-a-list": (
        sse_reply(tok(finish=["stop"])),
        "bad stream chunk: finish_reason is a JSON list",
    ),
    "second-choice-index": (
        sse_reply('{"choices": [{"index": 1, "text": "ka"}]}'),
        "bad stream chunk: choice index '1', one was asked",
    ),
    "error-chunk-object": (
        sse_reply(GOOD[0], '{"error": {"message": "CUDA out of\\nmemory", "code": 500}}'),
        "server error: CUDA out of memory",
    ),
    "error-chunk-nested": (
        sse_reply('{"error": %s}' % ("[" * 60 + "]" * 60)),
        "server error: " + "[" * 60 + "]" * 60,
    ),
    # order and length
    "usage-only-stream": (
        sse_reply('{"choices": [], "usage": {"completion_tokens": 3}}', "[DONE]"),
        "usage-only stream: usage counts 3 tokens, no chunk carried text",
    ),
    "empty-texts-only": (
        sse_reply(tok(text=""), tok(text="", finish="stop"), "[DONE]"),
        "no token streamed (finish_reason stop)",
    ),
    "empty-body": (sse_reply(), "no token streamed (finish_reason None)"),
    "done-only": (sse_reply("[DONE]"), "no token streamed (finish_reason None)"),
    "ends-early": (sse_reply(GOOD[0]), "short answer: 1 of 3 tokens (finish_reason None)"),
    "token-after-finish": (
        sse_reply(tok(), tok(finish="stop"), tok()),
        "bad stream: a token after finish_reason 'stop'",
    ),
    "data-after-done": (sse_reply(*GOOD, "[DONE]", tok()), "bad stream: data after [DONE]"),
    "more-tokens-than-asked": (
        sse_reply(tok(), tok(), tok(), tok()),
        "bad stream: 4 tokens streamed, 3 asked",
    ),
    "never-ends": (
        [CHUNKED + chunk(b"data: " + GOOD[0].encode() + b"\n\n"), HANG],
        "timeout after 0.5 s (1 chunks received)",
    ),
    "headers-then-nothing": ([CHUNKED, HANG], "timeout after 0.5 s (0 chunks received)"),
    "nothing-at-all": ([HANG], "timeout after 0.5 s (0 chunks received)"),
    # bytes and HTTP framing
    "not-utf8": (
        sse_reply(b'{"choices": [{"text": "\xff\xfe"}]}'),
        "stream line is not UTF-8 (byte 0xff at 29)",
    ),
    "line-of-2-mib": (
        b"HTTP/1.1 200 OK\r\n\r\ndata: " + b"x" * (2 * 2**20),
        "bad stream: a stream line longer than 1,048,576 bytes",
    ),
    "chunk-size-garbage": (
        CHUNKED + b"zz\r\n",
        "ProtocolError: not a chunk size line: b'zz\\r\\n'",
    ),
    "chunk-size-huge": (
        CHUNKED + b"fffffffffffffff\r\ndata: {}\n\n",
        "ProtocolError: connection closed inside a chunk",
    ),
    "chunk-size-negative": (
        CHUNKED + b"-5\r\n",
        "ProtocolError: not a chunk size line: b'-5\\r\\n'",
    ),
    "chunk-longer-than-size": (
        CHUNKED + b"2\r\ndata: {}\n\n\r\n",
        "ProtocolError: a chunk of the body is longer than its size line says",
    ),
    "content-length-negative": (
        b"HTTP/1.1 200 OK\r\ncontent-length: -5\r\n\r\n",
        "ProtocolError: content-length '-5' is not a byte count",
    ),
    "content-length-short-body": (
        b"HTTP/1.1 200 OK\r\ncontent-length: 500\r\n\r\ndata: " + GOOD[0].encode() + b"\n\n",
        "ProtocolError: connection closed before content-length was read",
    ),
    "status-not-a-number": (
        b"HTTP/1.1 2OO OK\r\n\r\n",
        "ProtocolError: not an HTTP/1.x status line: b'HTTP/1.1 2OO OK\\r\\n'",
    ),
    "not-http": (b"SSH-2.0-OpenSSH\r\n", "ProtocolError: not an HTTP/1.x status line: b'SSH-2.0-"),
    "300-header-lines": (
        b"HTTP/1.1 200 OK\r\n" + b"".join(b"x-h%d: v\r\n" % i for i in range(300)) + b"\r\n",
        "ProtocolError: more than 200 header lines",
    ),
    "http-500-with-10-mib-body": (
        b"HTTP/1.1 500 Oops\r\ncontent-length: %d\r\n\r\n" % (10 * 2**20) + b"e" * (10 * 2**20),
        "HTTP 500: " + "e" * 200,
    ),
    "connection-closed-at-once": (b"", "ConnectionResetError: connection closed before the answer"),
}


@pytest.mark.parametrize("case", list(STREAMS), ids=list(STREAMS))
def test_a_bad_stream_fails_each_request_with_its_reason(case: str) -> None:
    reply, reason = STREAMS[case]
    timeout = 0.5 if "timeout" in reason else 5.0
    res = replay(reply, timeout_s=timeout)
    assert len(res.error) == 2
    for err in res.error:
        assert err is not None and err.startswith(reason), (case, err)
        assert "\n" not in err and len(err) < 400


HTTPX = [
    "usage-infinity",
    "usage-1e30-float",
    "nested-50000-arrays",
    "usage-only-stream",
    "not-utf8",
    "line-of-2-mib",
    "more-tokens-than-asked",
    "text-a-number",
]


@pytest.mark.parametrize("case", HTTPX, ids=HTTPX)
def test_the_httpx_client_reads_the_same_streams_the_same_way(case: str) -> None:
    reply, reason = STREAMS[case]
    res = replay(reply, client="httpx")
    assert all(e is not None and e.startswith(reason) for e in res.error), res.error


OK_STREAMS: dict[str, Reply] = {
    "exact": sse_reply(*GOOD, "[DONE]"),
    "chunked": sse_reply(*GOOD, "[DONE]", chunked=True),
    "comments-events-and-extra-fields": sse_reply(
        ": ping",
        "event: completion",
        tok(id="x", extra={"a": [1, {"b": None}]}, system_fingerprint=5),
        tok(),
        tok(finish="length", usage={"completion_tokens": 3.0, "total_tokens": "n/a"}),
        "[DONE]",
    ),
    "nested-64-levels-is-fine": sse_reply(
        tok(extra=json.loads("[" * 62 + "]" * 62)), tok(), tok(), "[DONE]"
    ),
    "crlf-lines": sse_reply(*[g + "\r" for g in GOOD]),
}


@pytest.mark.parametrize("case", list(OK_STREAMS), ids=list(OK_STREAMS))
def test_odd_but_valid_streams_complete(case: str) -> None:
    res = replay(OK_STREAMS[case])
    assert res.error == [None, None]
    assert res.output_tokens_received.tolist() == [3, 3]
    assert np.isfinite(res.first_token_s).all() and (res.finished_s >= res.first_token_s).all()


# --- detection and the engine's limits --------------------------------------------------

VLLM_METRICS = b"HTTP/1.1 200 OK\r\ncontent-length: 28\r\n\r\nvllm:num_requests_running 1\n"
MODELS: dict[str, Any] = {
    "data-a-string": {"data": "llama"},
    "entries-lists": {"data": [["llama"], 5, None]},
    "id-a-list": {"data": [{"id": ["llama"], "owned_by": {"x": 1}}]},
    "document-a-list": [{"id": "llama"}],
    "not-json": b"<html>models</html>",
    "nested-50000": b"[" * DEEP + b"]" * DEEP,
    "max-model-len-a-string": {"data": [{"id": "m", "max_model_len": "4096"}]},
    "max-model-len-negative": {"data": [{"id": "m", "max_model_len": -1}]},
    "max-model-len-true": {"data": [{"id": "m", "max_model_len": True}]},
}


@pytest.mark.parametrize("case", list(MODELS), ids=list(MODELS))
def test_detection_takes_any_models_shape(case: str) -> None:
    routes = {"/metrics": VLLM_METRICS, "/v1/models": json_reply(MODELS[case])}
    with scripted_server({"/v1/completions": sse_reply(*GOOD), **routes}) as srv:
        res = run_http(batch(), HttpOptions(srv.url, metrics_interval_s=0.05))
    assert res.error == [None, None]
    assert res.engine_info["server_kind"] == "vllm"
    model = "m" if case.startswith("max-model-len") else ""
    assert res.engine_info["model"] == model
    assert res.engine_info["max_model_len"] == str(2**20)  # the bound, nothing reported


def lengths(prompts: list[int], outputs: list[int]) -> LiveBatch:
    n = len(prompts)
    return LiveBatch(
        [f"r{i}" for i in range(n)],
        np.zeros(n),
        np.array(prompts, dtype=np.int64),
        np.array(outputs, dtype=np.int64),
    )


def test_a_request_past_the_servers_max_model_len_is_refused_and_not_sent() -> None:
    models = json_reply({"data": [{"id": "m", "max_model_len": 16}]})
    with scripted_server({"/v1/completions": sse_reply(*GOOD), "/v1/models": models}) as srv:
        res = run_http(lengths([8, 14, 13], [3, 3, 3]), HttpOptions(srv.url, "vllm"))
        sent = srv.count("/v1/completions")
    assert res.error[0] is None and res.error[2] is None
    assert res.error[1] == (
        "refused: prompt 14 + output 3 tokens exceed the max model length 16 (the server's "
        "max_model_len); cap them with --max-prompt-tokens and --max-output-tokens, or give "
        "--max-model-len"
    )
    assert sent == 2 and np.isnan(res.sent_s[1])
    assert res.engine_info["max_model_len"] == "16"


def test_the_flag_overrides_the_servers_length() -> None:
    models = json_reply({"data": [{"id": "m", "max_model_len": 16}]})
    with scripted_server({"/v1/completions": sse_reply(*GOOD), "/v1/models": models}) as srv:
        opts = HttpOptions(srv.url, "vllm", max_model_len=10)
        res = run_http(lengths([8, 7], [3, 3]), opts)
    assert res.error[1] is None
    assert (
        res.error[0] is not None
        and "exceed the max model length 10 (--max-model-len)" in (res.error[0])
    )


def test_a_billion_token_prompt_is_refused_before_anything_is_built() -> None:
    """10^9 logged tokens would be a ~40 GB body: refused; the client's memory stays small."""
    tracemalloc.start()
    try:
        with scripted_server({"/v1/completions": sse_reply(*GOOD)}) as srv:
            res = run_http(lengths([10**9, 8], [3, 10**9]), HttpOptions(srv.url, "vllm"))
            sent = srv.count("/v1/completions")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20
    assert sent == 0
    assert res.error == [
        "refused: prompt 1,000,000,000 + output 3 tokens exceed the max model length 1,048,576 "
        "(the client's bound when the server names none); cap them with --max-prompt-tokens "
        "and --max-output-tokens, or give --max-model-len",
        "refused: prompt 8 + output 1,000,000,000 tokens exceed the max model length 1,048,576 "
        "(the client's bound when the server names none); cap them with --max-prompt-tokens "
        "and --max-output-tokens, or give --max-model-len",
    ]


def test_tgi_reports_its_length_on_info(tmp_path: Path) -> None:
    routes = {"/info": json_reply({"max_total_tokens": 12}), "/v1/completions": sse_reply(*GOOD)}
    b = lengths([8, 10], [3, 3])
    with scripted_server(routes) as srv:
        res = run_http(b, HttpOptions(srv.url, "vllm"))
        assert res.error == [None, None] and srv.count("/info") == 0  # vLLM: not asked
        tgi = HttpOptions(srv.url, "tgi", tokenizer=make_tokenizer(tmp_path))
        res = run_http(b, tgi)
    assert res.error[0] is None
    assert res.error[1] is not None and res.error[1].startswith(
        "refused: prompt 10 + output 3 tokens exceed the max model length 12 (the server's"
    )


SCRAPES = {
    "infinite-value": b"vllm:num_requests_running 1e999\nvllm:num_requests_waiting +Inf\n",
    "unparsable-line": b"vllm:num_requests_running 1\n{{{{{{\n",
    "not-utf8": b"vllm:num_requests_running \xff\n",
}


@pytest.mark.parametrize("case", list(SCRAPES), ids=list(SCRAPES))
def test_a_scrape_that_cannot_be_read_loses_its_sample_not_the_run(case: str) -> None:
    body = SCRAPES[case]
    scrape = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    with scripted_server({"/metrics": scrape, "/v1/completions": sse_reply(*GOOD)}) as srv:
        res = run_http(batch(), HttpOptions(srv.url, metrics_interval_s=0.01))
    assert res.error == [None, None] and res.engine_info["server_kind"] == "vllm"
    assert set(res.metrics) == {"time_s", "client_in_flight", "client_waiting"}


# --- arguments refused before anything is sent -----------------------------------------

OPTIONS: dict[str, tuple[dict[str, Any], str]] = {
    "timeout-inf": ({"timeout_s": float("inf")}, "--timeout-s inf: must be a finite number"),
    "timeout-nan": ({"timeout_s": float("nan")}, "--timeout-s nan: must be a finite number"),
    "metrics-interval-0": ({"metrics_interval_s": 0.0}, "--metrics-interval-s 0.0: must be"),
    "metrics-interval-nan": ({"metrics_interval_s": float("nan")}, "--metrics-interval-s nan"),
    "max-model-len-1": ({"max_model_len": 1}, "--max-model-len 1: must be 2 to 2147483647"),
    "max-model-len-huge": ({"max_model_len": 10**30}, "--max-model-len 1000000000000000000"),
    "max-in-flight-0": ({"max_in_flight": 0}, "--max-in-flight 0: must be 1 to 100000"),
    "max-wait-0": ({"max_wait_s": 0.0}, "--max-gap-s 0.0: must be more than 0 seconds"),
}


@pytest.mark.parametrize("case", list(OPTIONS), ids=list(OPTIONS))
def test_bad_http_options_are_refused(case: str) -> None:
    kw, message = OPTIONS[case]
    with pytest.raises(ConfigError) as exc:
        HttpOptions("http://127.0.0.1:9", **kw)
    assert str(exc.value).startswith(message)


SELECTIONS: dict[str, tuple[dict[str, Any], str]] = {
    "time-scale-1e300": (
        {"time_scale": 1e300},
        "--time-scale 1e+300: must be a finite number from 1e-06 to 1e+06",
    ),
    "time-scale-inf": ({"time_scale": float("inf")}, "--time-scale inf: must be a finite"),
    "time-scale-nan": ({"time_scale": float("nan")}, "--time-scale nan: must be a finite"),
    "time-scale-negative": ({"time_scale": -1.0}, "--time-scale -1: must be a finite"),
    "time-scale-1e-300": ({"time_scale": 1e-300}, "--time-scale 1e-300: must be a finite"),
    "max-wait-negative": ({"max_wait_s": -5.0}, "--max-gap-s -5: must be more than 0"),
}


@pytest.mark.parametrize("case", list(SELECTIONS), ids=list(SELECTIONS))
def test_bad_selections_are_refused(case: str) -> None:
    kw, message = SELECTIONS[case]
    with pytest.raises(ConfigError) as exc:
        Selection(**kw)
    assert str(exc.value).startswith(message)


def test_a_long_sleep_in_a_batch_is_refused_before_anything_is_sent() -> None:
    b = LiveBatch(["a", "b"], np.array([0.0, 400.0]), np.array([8, 8]), np.array([3, 3]))
    with scripted_server({"/v1/completions": sse_reply(*GOOD)}) as srv:
        with pytest.raises(ConfigError) as exc:
            run_http(b, HttpOptions(srv.url, "vllm"))
        assert srv.requests == []  # not even detection
    assert str(exc.value) == (
        "the replay would sleep 400 s before request 2 (b), past --max-gap-s 300 s; replay "
        "faster (--time-scale), --skip past the gap, or replay one day"
    )


# --- whole runs through the command ----------------------------------------------------


def requests_file(path: Path, arrivals: list[float], prompt: int = 8, output: int = 3) -> Path:
    rows: list[dict[str, Any]] = []
    for i, a in enumerate(arrivals):
        rows.append(request(f"req-{i:02d}", 0, prompt, output))
        rows[-1]["arrival_time"] = datetime.fromtimestamp(1_700_000_000 + a, UTC)
        rows[-1]["arrival_s"] = a
    return write_table(table(REQUESTS, rows), REQUESTS, path)


def live(tmp_path: Path, url: str, *extra: str, arrivals: list[float] | None = None) -> Any:
    reqs = requests_file(tmp_path / "requests.parquet", arrivals or [0.0, 0.0, 0.01, 0.01])
    args = ["live", "--engine", "http", "--base-url", url, "--requests", str(reqs)]
    args += ["--warehouse", str(tmp_path / "wh"), "--server-kind", "vllm", "--timeout-s", "5"]
    return CliRunner().invoke(cli, [*args, "--metrics-interval-s", "0.05", *extra])


def visible(tmp_path: Path) -> tuple[int, int, list[tuple[str, str]]]:
    """(live_requests rows, live_metrics rows, (status, command) of each run) in the views."""
    con = Warehouse(tmp_path / "wh").connect()
    try:
        reqs = con.execute("SELECT count(*) FROM live_requests").fetchall()[0]
        metrics = con.execute("SELECT count(*) FROM live_metrics").fetchall()[0]
        runs = con.sql("SELECT status, command FROM runs ORDER BY run_id").fetchall()
    finally:
        con.close()
    return reqs[0], metrics[0], runs


NO_TOKEN_RUNS: dict[str, tuple[Reply, str]] = {
    "usage-only": (
        sse_reply('{"choices": [], "usage": {"completion_tokens": 3}}', "[DONE]"),
        "usage-only stream: usage counts 3 tokens, no chunk carried",
    ),
    "infinity": (
        sse_reply('{"choices": [], "usage": {"completion_tokens": Infinity}}'),
        "bad stream chunk: non-finite number Infinity: ",
    ),
    "nested-50000": (
        sse_reply("[" * DEEP + "]" * DEEP),
        "bad stream chunk: JSON nested deeper than 64 levels: ",
    ),
    "http-503": (json_reply(b"busy", 503), "HTTP 503: busy"),
    "closed-mid-answer": (
        b"HTTP/1.1 200 OK\r\ncontent-length: 99\r\n\r\n",
        "ProtocolError: connection closed before content-length was r",  # summary: 60 chars
    ),
}


@pytest.mark.parametrize("case", list(NO_TOKEN_RUNS), ids=list(NO_TOKEN_RUNS))
def test_a_run_where_no_request_streamed_a_token_fails_and_is_hidden(
    tmp_path: Path, case: str
) -> None:
    reply, reason = NO_TOKEN_RUNS[case]
    with scripted_server({"/v1/completions": reply}) as srv:
        r = live(tmp_path, srv.url)
    assert r.exit_code == 1, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: live run "), r.output
    assert "none of the 4 requests streamed a token (4 x " + reason in lines[0]
    assert "the run is kept as failed and hidden from live_requests" in lines[0]
    assert visible(tmp_path) == (0, 0, [("failed", "live")])
    files = list((tmp_path / "wh" / "live_requests").glob("run_id=2*/http.parquet"))
    rows = pq.read_table(files[0]).to_pylist()  # the reasons stay on disk
    assert len(rows) == 4 and not any(row["ok"] for row in rows)
    assert all(row["error"].startswith(reason) for row in rows)


def test_every_request_refused_is_a_failed_run(tmp_path: Path) -> None:
    with scripted_server({"/v1/completions": sse_reply(*GOOD)}) as srv:
        r = live(tmp_path, srv.url, "--max-model-len", "10")
        assert srv.count("/v1/completions") == 0
    assert r.exit_code == 1
    assert "none of the 4 requests streamed a token (4 x refused: prompt 8 + output 3 tok" in (
        r.output
    )
    assert visible(tmp_path) == (0, 0, [("failed", "live")])


def test_a_request_exactly_at_the_max_model_len_is_sent(tmp_path: Path) -> None:
    with scripted_server({"/v1/completions": sse_reply(*GOOD)}) as srv:
        r = live(tmp_path, srv.url, "--max-model-len", "11", "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)["summary"]
    assert (s["num_requests"], s["completed"], s["failed"]) == (4, 4, 0)
    reqs, _, runs = visible(tmp_path)
    assert reqs == 4 and runs == [("ok", "live")]


def test_a_mixed_run_shows_ok_and_failed_rows(tmp_path: Path) -> None:
    reqs = tmp_path / "requests.parquet"
    rows = [request(f"req-{i}", 0, p, 3) for i, p in enumerate([8, 8, 30, 30])]
    write_table(table(REQUESTS, rows), REQUESTS, reqs)
    with scripted_server({"/v1/completions": sse_reply(*GOOD)}) as srv:
        args = ["live", "--engine", "http", "--base-url", srv.url, "--requests", str(reqs)]
        args += ["--warehouse", str(tmp_path / "wh"), "--server-kind", "vllm"]
        r = CliRunner().invoke(cli, [*args, "--max-model-len", "20"])
    assert r.exit_code == 0, r.output
    assert "4 requests, 2 completed, 2 failed" in r.output
    assert "failed x2: refused: prompt 30 + output 3 tokens exceed the max mod" in r.output
    con = Warehouse(tmp_path / "wh").connect()
    got = con.sql("SELECT ok, count(*) FROM live_requests GROUP BY ok ORDER BY ok").fetchall()
    con.close()
    assert got == [(False, 2), (True, 2)]


def test_validate_refuses_a_failed_live_run(tmp_path: Path) -> None:
    with scripted_server({"/v1/completions": sse_reply("[DONE]")}) as srv:
        assert live(tmp_path, srv.url).exit_code == 1
    run_id = Warehouse(tmp_path / "wh").connect().execute("SELECT run_id FROM runs").fetchall()[0]
    r = CliRunner().invoke(cli, ["validate", run_id[0], "--warehouse", str(tmp_path / "wh")])
    assert r.exit_code == 1
    assert f"live run {run_id[0]} failed (no request streamed a token, or it was" in r.output


GAPS: dict[str, tuple[list[float], list[str], str]] = {
    "166-day-gap": (
        [0.0, 1.0, 1.0 + 166 * 86400, 2.0 + 166 * 86400],
        [],
        "--time-scale 1: the replay would sleep 1.43424e+07 s (166 days) before request "
        "req-02 (#3 of the slice), past --max-gap-s 300 s; replay faster (--time-scale 2.09e-05 "
        "or less), --skip 2 past the gap, or replay one day (--from/--to); --max-gap-s raises "
        "the bound",
    ),
    "time-scale-1e6-of-a-second": (
        [0.0, 1.0],
        ["--time-scale", "1e6"],
        "--time-scale 1e+06: the replay would sleep 1e+06 s (11.6 days) before request req-01",
    ),
    "max-wait-5m-of-a-10-min-gap": (
        [0.0, 600.0],
        ["--max-gap-s", "5m", "--skip", "0"],
        "--time-scale 1: the replay would sleep 600 s (0.00694 days) before request req-01 "
        "(#2 of the slice), past --max-gap-s 300 s",
    ),
    "skip-counts-in-the-fix": (
        [0.0, 1.0, 2.0, 1000.0],
        ["--skip", "1"],
        "--time-scale 1: the replay would sleep 998 s (0.0116 days) before request req-03 (#3 "
        "of the slice), past --max-gap-s 300 s; replay faster (--time-scale 0.301 or less), "
        "--skip 3 past the gap",
    ),
}


@pytest.mark.parametrize("case", list(GAPS), ids=list(GAPS))
def test_a_long_sleep_is_refused_up_front_with_the_fix(tmp_path: Path, case: str) -> None:
    arrivals, extra, message = GAPS[case]
    with scripted_server({"/v1/completions": sse_reply(*GOOD)}) as srv:
        r = live(tmp_path, srv.url, *extra, arrivals=arrivals)
        assert srv.requests == []  # nothing sent, not even detection
    assert r.exit_code == 1
    assert r.output.strip().splitlines() == [r.output.strip()]
    assert r.output.startswith("Error: " + message), r.output


def test_a_gap_within_max_wait_runs(tmp_path: Path) -> None:
    with scripted_server({"/v1/completions": sse_reply(*GOOD)}) as srv:
        r = live(tmp_path, srv.url, "--max-gap-s", "500ms", arrivals=[0.0, 0.2])
    assert r.exit_code == 0, r.output
    assert "2 requests, 2 completed, 0 failed" in r.output


ARGS: dict[str, tuple[list[str], int, str]] = {
    "time-scale-1e300": (["--time-scale", "1e300"], 1, "Error: --time-scale 1e+300: must be"),
    "time-scale-nan": (["--time-scale", "nan"], 1, "Error: --time-scale nan: must be a finite"),
    "time-scale-inf": (["--time-scale", "inf"], 1, "Error: --time-scale inf: must be a finite"),
    "max-wait-words": (["--max-gap-s", "soon"], 2, "'soon': expected a duration more than 0"),
    "max-wait-zero": (["--max-gap-s", "0s"], 2, "'0s': expected a duration more than 0"),
    "timeout-inf": (["--timeout-s", "inf"], 1, "Error: --timeout-s inf: must be a finite number"),
    "metrics-interval-0": (["--metrics-interval-s", "0"], 1, "Error: --metrics-interval-s 0.0:"),
    "max-model-len-1": (["--max-model-len", "1"], 1, "Error: --max-model-len 1: must be 2 to"),
}


@pytest.mark.parametrize("case", list(ARGS), ids=list(ARGS))
def test_bad_arguments_end_in_one_line_before_anything_is_sent(tmp_path: Path, case: str) -> None:
    extra, code, message = ARGS[case]
    with scripted_server({"/v1/completions": sse_reply(*GOOD)}) as srv:
        r = live(tmp_path, srv.url, *extra)
        assert srv.requests == []
    assert r.exit_code == code, r.output
    assert message in r.output
    if code == 1:
        assert r.output.strip().splitlines() == [r.output.strip()]
