"""Node identity: node id derivation and key files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import blake3
import pytest

from rollnet.sdk import Identity, KeyFileError, node_id_from_public_key


def test_node_id_is_domain_separated_blake3_prefix() -> None:
    identity = Identity.generate()
    expected = blake3.blake3(b"rollnet-node-id-v1" + identity.public_key).digest()[:16].hex()
    assert identity.node_id == expected == node_id_from_public_key(identity.public_key)
    assert len(identity.node_id) == 32
    with pytest.raises(ValueError, match="32 bytes"):
        node_id_from_public_key(b"short")


def test_key_file_round_trips_with_mode_0600(tmp_path: Path) -> None:
    identity = Identity.generate()
    path = tmp_path / "node.key"
    identity.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    loaded = Identity.load(path)
    assert loaded.public_key == identity.public_key
    assert loaded.sign(b"m") == identity.sign(b"m")
    assert [p.name for p in tmp_path.iterdir()] == ["node.key"]  # no temp file left behind


def test_save_refuses_to_overwrite_unless_asked(tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    first, second = Identity.generate(), Identity.generate()
    first.save(path)
    with pytest.raises(KeyFileError, match="already exists"):
        second.save(path)
    assert Identity.load(path).public_key == first.public_key
    second.save(path, overwrite=True)
    assert Identity.load(path).public_key == second.public_key


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_load_refuses_group_or_world_accessible_file(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "node.key"
    Identity.generate().save(path)
    os.chmod(path, mode)
    with pytest.raises(KeyFileError) as info:
        Identity.load(path)
    assert str(path) in str(info.value)
    assert f"chmod 600 {path}" in str(info.value)


def test_load_reports_missing_and_foreign_files(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="cannot open"):
        Identity.load(tmp_path / "absent.key")
    junk = tmp_path / "junk.key"
    junk.write_text("not a key")
    junk.chmod(0o600)
    with pytest.raises(KeyFileError, match="PKCS#8"):
        Identity.load(junk)


def test_seed_must_be_32_bytes() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        Identity.from_seed(b"\x00" * 31)
