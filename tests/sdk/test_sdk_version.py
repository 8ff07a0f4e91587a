"""The version numbers typed outside ``rollnet.sdk.version`` agree with it: the three packages'
versions are in its release series, and the changelog's latest release names them and a
protocol version no newer than the one nodes register with."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from rollnet.sdk.version import PROTOCOL_MAJOR, PROTOCOL_MINOR, RELEASE_SERIES, software_version

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sdk", "ledger", "reference")


def package_version(package: str) -> str:
    project = tomllib.loads((ROOT / package / "pyproject.toml").read_text())["project"]
    version: str = project["version"]
    return version


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_is_in_the_release_series(package: str) -> None:
    assert package_version(package).startswith(RELEASE_SERIES + ".")


def test_the_latest_release_in_the_changelog_is_the_packages_version() -> None:
    releases = re.findall(
        r"^## (\d+\.\d+\.\d+) — \S+ \(protocol (\d+)\.(\d+)\)$",
        (ROOT / "CHANGELOG.md").read_text(),
        flags=re.MULTILINE,
    )
    assert releases, "CHANGELOG.md names no release"
    version, major, minor = releases[0]
    assert {package_version(package) for package in PACKAGES} == {version}
    assert (int(major), int(minor)) <= (PROTOCOL_MAJOR, PROTOCOL_MINOR)


def test_software_versions_name_the_component_and_the_series() -> None:
    assert software_version("worker") == f"rollnet-worker/{RELEASE_SERIES}"
