"""The import contracts in pyproject.toml (run as ``lint-imports`` by ``make lint`` and CI) see
only regular packages: a directory of modules without an ``__init__.py`` is a namespace package
that import-linter silently skips, so a forbidden import from or into it would pass. These tests
keep every such directory visible and show that the contracts do fail on a forbidden import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [ROOT / "sdk" / "src", ROOT / "ledger" / "src", ROOT / "reference" / "src"]
# Alembic loads these by file path; they are not imported as packages.
NOT_PACKAGES = {
    Path("rollnet/ledger/migrations"),
    Path("rollnet/ledger/migrations/versions"),
}
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def test_every_module_directory_is_a_regular_package() -> None:
    namespace = []
    for source in SOURCES:
        for module in source.glob("rollnet/*/**/*.py"):
            directory = module.parent.relative_to(source)
            if directory not in NOT_PACKAGES and not (module.parent / "__init__.py").exists():
                namespace.append(str(directory))
    hidden = sorted(set(namespace))
    assert not hidden, f"no __init__.py (invisible to the import contracts) in {hidden}"


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over the sources in ``tree`` (its packages shadow the installed ones)."""
    sources = [str(tree / part) for part in ("sdk/src", "ledger/src", "reference/src")]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sources)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=tree,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )


def test_contracts_hold_and_break_on_a_forbidden_import(tmp_path: Path) -> None:
    if not LINT_IMPORTS.exists():  # requirements/dev.txt has it, as it has pytest
        pytest.fail(f"{LINT_IMPORTS} is missing: 'make dev' installs import-linter")
    tree = tmp_path / "tree"
    for part in ("sdk/src", "ledger/src", "reference/src"):
        shutil.copytree(ROOT / part, tree / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    kept = lint_imports(tree)
    assert kept.returncode == 0, kept.stdout + kept.stderr

    # The SDK importing a coordinator module, and the ledger importing the reference package.
    errors = tree / "sdk/src/rollnet/sdk/errors.py"
    errors.write_text(errors.read_text() + "\nfrom rollnet.reference.coordinator import verdicts\n")
    nonces = tree / "ledger/src/rollnet/ledger/nonces.py"
    nonces.write_text(nonces.read_text() + "\nimport rollnet.reference\n")
    broken = lint_imports(tree)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "rollnet.sdk.errors -> rollnet.reference.coordinator.verdicts" in broken.stdout
    assert "rollnet.ledger.nonces -> rollnet.reference" in broken.stdout
    assert "Contracts: 1 kept, 2 broken." in broken.stdout
