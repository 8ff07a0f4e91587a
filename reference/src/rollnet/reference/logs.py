"""One logging shape for every rollnet server: stdlib, gRPC and structlog records alike.

Libraries (rollnet.sdk, rollnet.ledger) log through stdlib ``logging`` and never configure it;
servers call :func:`configure_logging` once at start-up. Output is human-readable on a terminal
and JSON lines otherwise.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

_SHARED_PROCESSORS: list[Any] = [
    structlog.contextvars.merge_contextvars,
    # Fields passed to stdlib logging as ``extra=`` become fields of the structured record.
    structlog.stdlib.ExtraAdder(),
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def configure_logging(level: str = "INFO", *, json: bool | None = None) -> None:
    """Route structlog and stdlib logging through one formatter on stderr.

    ``json`` defaults to "stderr is not a terminal".
    """
    use_json = (not sys.stderr.isatty()) if json is None else json
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            # Drop records below the level before any other processor spends time on them.
            structlog.stdlib.filter_by_level,
            *_SHARED_PROCESSORS,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    # Records from stdlib logging (gRPC, the SDK, log.exception in servers) carry exc_info as
    # a tuple: the JSON renderer would print its repr. Format it as the traceback's text, as
    # structlog's own records get it; the console renderer formats tracebacks itself.
    exceptions: list[Any] = [structlog.processors.format_exc_info] if use_json else []
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_SHARED_PROCESSORS,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            *exceptions,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def get_logger(name: str) -> Any:
    """A structlog logger bound to ``name`` (works whether or not logging is configured)."""
    return structlog.get_logger(name)
