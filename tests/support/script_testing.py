"""Loading a script or an example as a module, to test its functions (they are not packages)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

#: The repository's root.
ROOT = Path(__file__).resolve().parents[2]


def load_file(path: Path) -> ModuleType:
    """The module of ``path`` (named after the file), executed now and registered in
    ``sys.modules`` under that name (dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module
