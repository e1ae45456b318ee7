"""A minimal OpenAI-compatible streaming server whose tokens leave at known times.

It measures the HTTP client, not a model: each ``POST /v1/completions`` streams
``max_tokens`` chunks, the first ``ttft_s`` after the request was read and one every
``itl_s`` after that, then a usage chunk and ``[DONE]``. It records, per request, when
the request was read and when its first chunk was written (``time.perf_counter``, the
same clock as the client's on one machine), so the client's own overhead is what the
client measured minus what the server did (a request is known by the start of its
prompt, ``prompt_head``). ``GET /stats`` returns those records and the
most requests it held open at once; ``GET /metrics`` answers like vLLM
(``vllm:num_requests_running``) so the metrics scraper can be exercised.

    python -m pipeline.live.token_server --port 8123 --ttft 0.02 --itl 0.01

Plain asyncio streams, HTTP/1.1 with keep-alive and chunked responses; nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any


class TokenServer:
    def __init__(
        self,
        ttft_s: float,
        itl_s: float,
        stop_after: int | None = None,
        close_after_answer: bool = False,
    ) -> None:
        self.ttft_s = ttft_s
        self.itl_s = itl_s
        self.stop_after = stop_after
        self.close_after_answer = close_after_answer
        self.open = 0
        self.max_open = 0
        self.records: list[dict[str, Any]] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                received = time.perf_counter()
                if method == "POST" and path == "/v1/completions":
                    await self.complete(writer, json.loads(body), received)
                    if self.close_after_answer:  # as if its keep-alive timed out
                        await writer.drain()
                        break
                elif path == "/stats":
                    stats = {"max_open": self.max_open, "records": self.records}
                    self.reply(writer, 200, "application/json", json.dumps(stats))
                elif path == "/metrics":
                    text = (
                        "# HELP vllm:num_requests_running Requests in the batch.\n"
                        "# TYPE vllm:num_requests_running gauge\n"
                        f'vllm:num_requests_running{{model_name="token-server"}} {self.open}\n'
                    )
                    self.reply(writer, 200, "text/plain; version=0.0.4", text)
                else:
                    self.reply(writer, 404, "application/json", '{"error": "not found"}')
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @staticmethod
    def reply(writer: asyncio.StreamWriter, status: int, ctype: str, text: str) -> None:
        data = text.encode()
        reason = "OK" if status == 200 else "Not Found"
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: {ctype}\r\n"
            f"content-length: {len(data)}\r\n\r\n".encode()
            + data
        )

    async def complete(
        self, writer: asyncio.StreamWriter, req: dict[str, Any], received: float
    ) -> None:
        n = int(req.get("max_tokens") or 16)
        if self.stop_after is not None and self.stop_after < n:
            n, finish = self.stop_after, "stop"  # as a server that met EOS
        else:
            finish = "length"
        self.open += 1
        self.max_open = max(self.max_open, self.open)
        prompt = req.get("prompt")
        head = prompt[:4] if isinstance(prompt, list) else str(prompt)[:32]
        record: dict[str, Any] = {"received": received, "tokens": n, "prompt_head": head}
        try:
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            for k in range(n):
                delay = received + self.ttft_s + k * self.itl_s - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                choice = {"index": 0, "text": f" t{k}", "finish_reason": None}
                self.chunk(writer, {"choices": [choice]})
                if k == 0:
                    record["first_written"] = time.perf_counter()
                await writer.drain()
            record["last_token_written"] = time.perf_counter()
            last = {"index": 0, "text": "", "finish_reason": finish}
            self.chunk(writer, {"choices": [last], "usage": {"completion_tokens": n}})
            writer.write(self._frame(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            record["last_written"] = time.perf_counter()
        finally:
            self.open -= 1
            self.records.append(record)

    def chunk(self, writer: asyncio.StreamWriter, obj: dict[str, Any]) -> None:
        writer.write(self._frame(b"data: " + json.dumps(obj).encode() + b"\n\n"))

    @staticmethod
    def _frame(data: bytes) -> bytes:
        return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def serve(
    host: str,
    port: int,
    ttft_s: float,
    itl_s: float,
    stop_after: int | None = None,
    close_after_answer: bool = False,
) -> None:
    server = TokenServer(ttft_s, itl_s, stop_after, close_after_answer)
    async with await asyncio.start_server(server.handle, host, port, backlog=1024) as srv:
        print(f"token server on http://{host}:{port}", flush=True)
        await srv.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--ttft", type=float, default=0.02, help="seconds to the first chunk")
    p.add_argument("--itl", type=float, default=0.01, help="seconds between chunks")
    p.add_argument("--stop-after", type=int, default=None, help="stop every answer there")
    p.add_argument(
        "--close-after-answer",
        action="store_true",
        help="close each connection after one answer, without saying so beforehand",
    )
    args = p.parse_args()
    asyncio.run(
        serve(args.host, args.port, args.ttft, args.itl, args.stop_after, args.close_after_answer)
    )


if __name__ == "__main__":
    main()
