"""Server logs: in JSON, an exception logged through stdlib logging (gRPC, the SDK, servers'
``log.exception``) carries its traceback as text, like structlog's own records."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from rollnet.reference.logs import configure_logging


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    yield
    logging.getLogger().handlers.clear()
    structlog.reset_defaults()


def test_json_records_carry_tracebacks_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("INFO", json=True)
    try:
        raise ZeroDivisionError("division by zero")
    except ZeroDivisionError:
        logging.getLogger("rollnet.worker").exception("task failed")
        structlog.get_logger("rollnet.validator").exception("job failed")
    records = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [r["event"] for r in records] == ["task failed", "job failed"]
    for record in records:
        assert "exc_info" not in record  # never the tuple's repr
        assert record["exception"].startswith("Traceback (most recent call last):")
        assert record["exception"].endswith("ZeroDivisionError: division by zero")
