"""Garbage configuration for the CLI (issue 25): the coordinator's and the trainer's TOML files
and the coordinator's ``ROLLNET_COORDINATOR_*`` variables, through the real entry point.

Hypothesis writes TOML documents with known and unknown keys holding values of every TOML type
(huge integers, NaN, infinities, NUL in strings, nested tables, arrays, dates), as well as text
that is not TOML at all and bytes that are not UTF-8. The property: exit code 2 with one line
naming what is wrong (no traceback, no "unexpected error"), or 0 when the configuration happens
to be valid (the coordinator's ``serve_forever`` is swapped for one that returns at once: this
test is about reading the configuration, not serving).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import tomli_w
from fuzz_testing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from rollnet.reference.cli import main
from rollnet.reference.coordinator import server
from rollnet.reference.coordinator.config import ENV_PREFIX, OPTIONS, CoordinatorConfig
from rollnet.reference.trainer.config import TrainerConfig
from rollnet.reference.trainer.loss import LossConfig

EXAMPLES = 10

_COORDINATOR_KEYS = sorted(
    {f.name for f in dataclasses.fields(CoordinatorConfig)} | {"pools", "unknown_key"}
)
_TRAINER_KEYS = sorted({f.name for f in dataclasses.fields(TrainerConfig)} | {"loss", "nope"})
_LOSS_KEYS = sorted({f.name for f in dataclasses.fields(LossConfig)} | {"kind"})

_SCALARS = st.one_of(
    st.integers(-(2**63), 2**64),
    st.sampled_from([0, -1, 2**63, 10**30]),
    st.floats(),
    st.booleans(),
    st.text(max_size=20),
    st.sampled_from(["", "\x00", "127.0.0.1:0", "1s", "-5", "nan", "9" * 5000, "é/../x"]),
    st.datetimes(timezones=st.none()),
    st.dates(),
    st.times(),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


def _documents(keys: list[str], nested: dict[str, list[str]]) -> st.SearchStrategy[bytes]:
    key = st.one_of(st.sampled_from(keys), st.text(max_size=10))
    tables = {
        name: st.dictionaries(st.sampled_from(inner), _VALUES, max_size=3)
        for name, inner in nested.items()
    }
    toml = st.dictionaries(key, _VALUES, max_size=4)
    if tables:
        toml = st.tuples(toml, st.fixed_dictionaries({}, optional=tables)).map(
            lambda t: {**t[0], **t[1]}
        )
    return st.one_of(
        toml.map(_dump),
        st.text(max_size=200).map(str.encode),
        st.binary(max_size=200),
        st.sampled_from(
            [
                b"\xff\xfe\x00k = 1",
                b"lease_duration = 1\n\x00",
                b"[pools]\nx = 1",
                b"[[pools]]\n",
                b"a = " + b"[" * 5000,
                b"seed = " + b"9" * 5000,
            ]
        ),
    )


def _dump(document: dict[str, Any]) -> bytes:
    try:
        return tomli_w.dumps(document).encode()
    except (TypeError, ValueError):  # what TOML cannot hold (a key no TOML writer quotes)
        return b"x = 1"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    try:
        code = main(argv)
    finally:
        logging.getLogger().handlers.clear()  # a command's configure_logging adds a handler
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line and not line.startswith("{")]
    assert "Traceback" not in err, err
    assert "unexpected error" not in err, err
    return code, "\n".join(lines)


async def _serve_nothing(config: CoordinatorConfig) -> None:
    assert isinstance(config, CoordinatorConfig)


@fuzz_settings(EXAMPLES)
@given(
    document=_documents(_COORDINATOR_KEYS, {"pools": ["", "open", "x"]}),
    environ=st.dictionaries(
        st.sampled_from([option.env for option in OPTIONS] + [ENV_PREFIX + "NOPE"]),
        st.one_of(
            st.text(max_size=20), st.sampled_from(["nan", "-1", "1e400", "0x10", "9" * 5000])
        ),
        max_size=2,
    ),
)
def test_coordinator_config_garbage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], document: bytes, environ: dict[str, str]
) -> None:
    config = tmp_path / "coordinator.toml"
    config.write_bytes(document)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    # os.environ refuses NUL; a shell cannot set one either.
    environ = {k: v for k, v in environ.items() if "\x00" not in v}
    argv = ["coordinator", "--data-dir", str(tmp_path / "data"), "--config", str(config)]
    with (
        mock.patch.dict(os.environ, {**clean, **environ}, clear=True),
        mock.patch.object(server, "serve_forever", _serve_nothing),
    ):
        code, line = _run(argv, capsys)
    assert code in (0, 2), (code, line)
    if code == 2:
        assert "\n" not in line, line
        assert line.startswith("rollnet coordinator: "), line


@fuzz_settings(EXAMPLES)
@given(document=_documents(_TRAINER_KEYS, {"loss": _LOSS_KEYS}))
def test_trainer_config_garbage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], document: bytes
) -> None:
    config = tmp_path / "trainer.toml"
    config.write_bytes(document)
    argv = [
        *["trainer", "--coordinator", "127.0.0.1:1", "--key", str(tmp_path / "trainer.key")],
        *["--model", str(tmp_path / "no-model"), "--data-dir", str(tmp_path / "data")],
        *["--config", str(config)],
    ]
    code, line = _run(argv, capsys)
    # A valid configuration stops at the missing --model: never does a trainer start here.
    assert code == 2, line
    assert "\n" not in line, line
    assert line.startswith("rollnet trainer: "), line


@pytest.mark.parametrize(
    ("document", "says"),
    [
        (b"\x80", "not UTF-8 text"),  # was: unexpected error UnicodeDecodeError
        (b"a = " + b"[" * 5000, "nested too deeply"),  # was: unexpected error RecursionError
        (b"seed = " + b"9" * 5000, "4300 digits"),  # was: unexpected error ValueError
    ],
)
@pytest.mark.parametrize("command", ["coordinator", "trainer"])
def test_config_files_found_by_fuzzing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, document: bytes, says: str
) -> None:
    config = tmp_path / "config.toml"
    config.write_bytes(document)
    argv = [command, "--data-dir", str(tmp_path / "data"), "--config", str(config)]
    if command == "trainer":
        argv += ["--coordinator", "127.0.0.1:1", "--key", str(tmp_path / "k"), "--model", "m"]
    code, line = _run(argv, capsys)
    assert code == 2, line
    assert f"{config}: " in line, line
    assert says in line, line
