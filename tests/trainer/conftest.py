"""Fixtures for trainer tests: the tiny model, made once per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rollnet.reference.model.tiny import init_tiny_model

    return init_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)
