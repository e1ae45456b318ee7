"""A small HTTP/1.1 client for streaming POSTs, on asyncio streams: the HTTP engine's hot path.

httpx adds one to several milliseconds to every request it sends on a busy machine
(building the request, its connection pool's locks, h11), more than the whole budget
of a load client (bench/http_client_overhead.py); this
client writes the request in one call and hands back the response's lines as they
complete. It does only what the engine needs: ``POST`` with a body, keep-alive
connections (at most ``max_connections``, reused last-in first-out), bodies framed by
``transfer-encoding: chunked``, ``content-length`` or the end of the connection, TLS for
``https://`` URLs. No redirects, proxies or compression (an OpenAI-compatible server
needs none of them).

A reused connection the server has closed meanwhile is retried once on a new one, as
long as nothing of the response was read.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import urlsplit

from pipeline.live import stream

MAX_HEADERS = 200  # header (and trailer) lines of one answer


class ConnectError(OSError):
    """The server could not be reached (refused, unknown host, connect timeout)."""


class ProtocolError(OSError):
    """The server's answer is not HTTP/1.x as this client reads it."""


def _hex_size(line: bytes) -> int:
    text = line.split(b";", 1)[0].strip()
    if not text or len(text) > 15 or not all(c in b"0123456789abcdefABCDEF" for c in text):
        raise ProtocolError(f"not a chunk size line: {line[:40]!r}")
    return int(text, 16)


def _decimal_size(value: str) -> int:
    if not value.isascii() or not value.isdigit() or len(value) > 18:
        raise ProtocolError(f"content-length {value[:40]!r} is not a byte count")
    return int(value)


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    reused: bool = False

    def close(self) -> None:
        self.writer.close()


@dataclass
class Response:
    """One response: status and headers read, body read on demand."""

    status: int
    headers: dict[str, str]
    _conn: _Conn
    _client: StreamingClient
    _done: bool = False  # the body was read to its end

    async def _pieces(self) -> AsyncIterator[bytes]:
        r = self._conn.reader
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = await r.readline()
                if not size_line:
                    raise ProtocolError("connection closed inside a chunked body")
                size = _hex_size(size_line)
                if size == 0:
                    for _ in range(MAX_HEADERS):
                        if (await r.readline()) in (b"\r\n", b"\n", b""):
                            break  # trailers end
                    else:
                        raise ProtocolError(f"more than {MAX_HEADERS} trailer lines")
                    break
                while size > 0:  # in pieces: a chunk's declared size allocates nothing
                    data = await r.read(min(size, 65536))
                    if not data:
                        raise ProtocolError("connection closed inside a chunk")
                    size -= len(data)
                    yield data
                if (await r.readline()) not in (b"\r\n", b"\n"):
                    raise ProtocolError("a chunk of the body is longer than its size line says")
        elif "content-length" in self.headers:
            left = _decimal_size(self.headers["content-length"])
            while left > 0:
                data = await r.read(min(left, 65536))
                if not data:
                    raise ProtocolError("connection closed before content-length was read")
                left -= len(data)
                yield data
        else:  # the body ends with the connection
            while data := await r.read(65536):
                yield data
            self.headers["connection"] = "close"
        self._done = True

    def lines(self) -> AsyncIterator[bytes]:
        """The body's lines (bytes, without their line ends) as each one completes.

        Raises:
            StreamError: a line longer than ``MAX_LINE_BYTES``.
        """
        return stream.lines(self._pieces())

    async def read(self, limit: int | None = None) -> bytes:
        """The body, or its first ``limit`` bytes (the rest is left unread)."""
        out = bytearray()
        async for piece in self._pieces():
            out += piece
            if limit is not None and len(out) >= limit:
                return bytes(out[:limit])
        return bytes(out)

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        keep = self._done and exc is None and self.headers.get("connection") != "close"
        self._client._release(self._conn, keep)


class StreamingClient:
    """Keep-alive connections to one server, and ``post`` on them."""

    def __init__(
        self, base_url: str, *, max_connections: int = 256, connect_timeout_s: float = 10.0
    ) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.prefix = url.path.rstrip("/")
        self.ssl = ssl.create_default_context() if url.scheme == "https" else None
        self.host_header = url.netloc.rsplit("@", 1)[-1]
        self.connect_timeout_s = connect_timeout_s
        self.idle: list[_Conn] = []
        self.slots = asyncio.Semaphore(max_connections)

    async def _connect(self) -> _Conn:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=self.ssl, limit=2**20),
                self.connect_timeout_s,
            )
        except (OSError, TimeoutError) as exc:
            raise ConnectError(
                f"cannot connect to {self.host}:{self.port}: {exc or type(exc).__name__}"
            ) from None
        return _Conn(reader, writer)

    def _release(self, conn: _Conn, keep: bool) -> None:
        if keep and not conn.writer.is_closing():
            conn.reused = True
            self.idle.append(conn)
        else:
            conn.close()
        self.slots.release()

    async def post(self, path: str, body: bytes, content_type: str) -> Response:
        """Send ``body`` and read the status line and headers; use the result with ``async with``.

        Raises:
            ConnectError: no connection; ProtocolError: not an HTTP/1.x answer.
        """
        await self.slots.acquire()
        conn: _Conn | None = None
        try:
            head = (
                f"POST {self.prefix}{path} HTTP/1.1\r\nhost: {self.host_header}\r\n"
                f"content-type: {content_type}\r\naccept: text/event-stream\r\n"
                f"content-length: {len(body)}\r\n\r\n"
            ).encode()
            while True:
                conn = self.idle.pop() if self.idle else await self._connect()
                try:
                    conn.writer.write(head + body)
                    await conn.writer.drain()
                    status_line = await conn.reader.readline()
                    if not status_line:
                        raise ConnectionResetError("connection closed before the answer")
                    break
                except (ConnectionError, asyncio.IncompleteReadError):
                    conn.close()
                    if not conn.reused:  # a fresh connection failing is the server's fault
                        raise
            parts = status_line.decode("latin-1").split(" ", 2)
            if (
                len(parts) < 2
                or not parts[0].startswith("HTTP/1.")
                or not (parts[1].isascii() and parts[1].isdigit() and len(parts[1]) == 3)
            ):
                raise ProtocolError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
            headers: dict[str, str] = {}
            for _ in range(MAX_HEADERS):
                line = await conn.reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                key, _, value = line.decode("latin-1").partition(":")
                headers[key.strip().lower()] = value.strip()
            else:
                raise ProtocolError(f"more than {MAX_HEADERS} header lines")
            return Response(int(parts[1]), headers, conn, self)
        except BaseException:
            if conn is not None:
                conn.close()
            self.slots.release()
            raise

    async def aclose(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()
