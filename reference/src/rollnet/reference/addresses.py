"""``HOST:PORT`` addresses as every rollnet command and configuration file writes them.

One parser for all of them, so ``--listen localhost`` (no port: gRPC would pick 443),
``--listen 127.0.0.1:99999`` (gRPC wraps it to another port) and ``--coordinator localhost`` are
refused with the same message wherever they are typed, instead of doing something else silently.
"""

from __future__ import annotations

import ipaddress

MAX_PORT = 65535


def split_host_port(text: str, *, allow_port_zero: bool = False) -> tuple[str, int]:
    """``(host, port)`` of ``HOST:PORT`` (``[v6-address]:PORT`` for IPv6).

    ``allow_port_zero``: port 0 (any free port) is accepted, as a listen address may ask for it.
    Raises :class:`ValueError` saying what is missing or out of range.
    """

    def refuse(problem: str) -> ValueError:
        return ValueError(f"{text!r} is not HOST:PORT: {problem}")

    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise refuse("the IPv6 address has no closing ']'")
        host, rest = text[1:end], text[end + 1 :]
        if not rest.startswith(":"):
            raise refuse(f"no port (write [{host}]:PORT)")
        port_text = rest[1:]
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon:
            raise refuse(f"no port (write {text or 'HOST'}:PORT)")
        if ":" in host:
            raise refuse("an IPv6 address goes in brackets, as [::1]:PORT")
    if not host:
        raise refuse("no host (127.0.0.1 is this machine)")
    if not (port_text.isascii() and port_text.isdigit()):
        raise refuse(f"the port {port_text!r} is not a number")
    port = int(port_text)
    lowest = 0 if allow_port_zero else 1
    if not lowest <= port <= MAX_PORT:
        raise refuse(f"port {port} is out of range ({lowest}-{MAX_PORT})")
    return host, port


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def join_host_port(host: str, port: int) -> str:
    """The inverse of :func:`split_host_port` (brackets around an IPv6 address)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
