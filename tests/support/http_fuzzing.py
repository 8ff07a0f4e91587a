"""Raw HTTP/1.1 over a socket, for requests no HTTP client library would send: any method, any
request target, header lines of any size and count, broken request lines."""

from __future__ import annotations

import contextlib
import re
import socket
from dataclasses import dataclass

from hypothesis import strategies as st

#: Printable ASCII, what a header value or a path may hold on the wire (and some it may not).
PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
METHODS = st.one_of(
    st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE", "PATCH"]),
    st.sampled_from(["get", "CONNECT", "G\x00T", "X" * 300, ""]),
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=12),
)


@dataclass(frozen=True)
class Answer:
    """A parsed HTTP response (``status`` 0: none came back, the connection just closed)."""

    status: int
    headers: dict[str, str]
    body: bytes


def header_lines() -> st.SearchStrategy[list[tuple[str, str]]]:
    """Extra header lines: random, huge, many, or broken."""
    name = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=20)
    value = st.one_of(
        st.text(PRINTABLE, max_size=60), st.sampled_from([10_000, 70_000]).map("v".__mul__)
    )
    line = st.tuples(name.filter(lambda n: ":" not in n), value)
    return st.one_of(
        st.lists(line, max_size=4),
        st.tuples(line, st.sampled_from([120, 1_000])).map(lambda t: [t[0]] * t[1]),
    )


_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FRAMING = {"content-length", "transfer-encoding", "host", "connection", "range", "expect"}


def plain_headers(headers: list[tuple[str, str]]) -> bool:
    """Whether ``headers`` are ones any HTTP server takes (so the answer is the application's,
    not the parser's 400): valid names, none that changes framing, short and few enough."""
    return (
        len(headers) < 100
        and all(_TOKEN.fullmatch(name) and name.lower() not in _FRAMING for name, _ in headers)
        and sum(len(name) + len(value) for name, value in headers) < 8000
        and all(len(value) < 8000 for _, value in headers)
    )


def request(
    port: int,
    method: str,
    target: str,
    headers: list[tuple[str, str]],
    *,
    version: str = "HTTP/1.1",
    body: bytes = b"",
    timeout: float = 20.0,
) -> Answer:
    """Send one request on a new connection (``Connection: close``) and read the answer."""
    head = f"{method} {target} {version}\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
    head += "".join(f"{key}: {value}\r\n" for key, value in headers)
    if body:
        head += f"Content-Length: {len(body)}\r\n"
    raw = head.encode("latin-1", "replace") + b"\r\n" + body
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        # The server may refuse mid-request: then read what it said.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            connection.sendall(raw)
        chunks = []
        while True:
            try:
                chunk = connection.recv(1 << 16)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return parse(b"".join(chunks), head_only=method == "HEAD")


def parse(data: bytes, *, head_only: bool = False) -> Answer:
    """Parse one HTTP/1.x response (Content-Length or chunked body)."""
    if not data:
        return Answer(0, {}, b"")
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    assert len(parts) >= 2, f"not HTTP: {lines[0]!r}"
    assert parts[0].startswith("HTTP/1."), f"not HTTP: {lines[0]!r}"
    headers = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    if head_only:
        return Answer(int(parts[1]), headers, b"")
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0] or b"0", 16)
            if size == 0:
                break
            body += rest[:size]
            rest = rest[size + 2 :]
        return Answer(int(parts[1]), headers, bytes(body))
    if "content-length" in headers:
        rest = rest[: int(headers["content-length"])]
    return Answer(int(parts[1]), headers, rest)
