"""``rollnet keys generate`` and ``rollnet keys show``, run in-process."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from rollnet.reference.cli import main
from rollnet.sdk import Identity
from rollnet.sdk.identity import b64url_encode


def test_generate_then_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "node.key"
    assert main(["keys", "generate", "--out", str(path)]) == 0
    generated = capsys.readouterr().out
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    identity = Identity.load(path)
    assert f"node_id: {identity.node_id}" in generated

    assert main(["keys", "show", str(path)]) == 0
    shown = capsys.readouterr().out
    assert f"node_id: {identity.node_id}" in shown
    assert f"public_key: {b64url_encode(identity.public_key)}" in shown
    assert "PRIVATE" not in shown
    assert "PRIVATE" not in generated


def test_generate_refuses_to_overwrite_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "node.key"
    assert main(["keys", "generate", "--out", str(path)]) == 0
    before = path.read_bytes()
    assert main(["keys", "generate", "--out", str(path)]) == 2  # an error: one line, exit 2
    assert "--force" in capsys.readouterr().err
    assert path.read_bytes() == before
    assert main(["keys", "generate", "--out", str(path), "--force"]) == 0
    assert path.read_bytes() != before


def test_show_refuses_a_world_readable_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "node.key"
    Identity.generate().save(path)
    path.chmod(0o644)
    assert main(["keys", "show", str(path)]) == 2
    assert f"chmod 600 {path}" in capsys.readouterr().err
