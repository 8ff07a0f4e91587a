"""What survives a trainer restart, written so that a crash at any instant leaves a usable state.

Layout under the trainer's data directory::

    state.json                 the commit point: step, stream cursor, demand, last step's metrics
    master/step-<k>.pt         fp32 master weights and optimizer state after step k
    checkpoints/step-<k>/      the published checkpoint k (bf16, Hugging Face layout)
    metrics.jsonl              one line per step

A step is committed when ``state.json`` names it: the master file is written (and fsynced) first
under a temporary name, renamed, then ``state.json`` is replaced the same way. A crash before
the rename of ``state.json`` resumes at the previous step, whose files are still there (the
previous master file is removed only after the commit), and trains that step again from the same
stream cursor; the checkpoint of a committed step is (re)published on start if the coordinator
does not have it yet.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rollnet.reference.trainer.intake import IntakeState

__all__ = ["STATE_VERSION", "TrainerState", "atomic_write", "load_state", "master_path"]

STATE_VERSION = 1


@dataclass(slots=True)
class TrainerState:
    """The committed state."""

    step: int = 0
    intake: IntakeState = field(default_factory=IntakeState)
    last_metrics: dict[str, Any] | None = None
    """The committed step's metrics line (rewritten to metrics.jsonl if a crash lost it)."""

    def to_json(self) -> dict[str, Any]:
        """JSON data."""
        return {
            "version": STATE_VERSION,
            "step": self.step,
            "intake": self.intake.to_json(),
            "last_metrics": self.last_metrics,
        }


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old or the new file, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def master_path(data_dir: Path, step: int) -> Path:
    """Where the master weights and optimizer state after ``step`` live."""
    return data_dir / "master" / f"step-{step}.pt"


def load_state(data_dir: Path) -> TrainerState | None:
    """The committed state, or ``None`` for a fresh data directory."""
    path = data_dir / "state.json"
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"state version {data.get('version')!r}, expected {STATE_VERSION}")
        return TrainerState(
            step=int(data["step"]),
            intake=IntakeState.from_json(data["intake"]),
            last_metrics=data.get("last_metrics"),
        )
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a trainer state this version can resume: {error}") from None


def save_master(
    data_dir: Path, step: int, model_state: dict[str, Any], optimizer_state: dict[str, Any]
) -> Path:
    """Write the master weights and optimizer state of ``step`` (atomically)."""
    path = master_path(data_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(descriptor)
    try:
        torch.save({"step": step, "model": model_state, "optimizer": optimizer_state}, temporary)
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def load_master(data_dir: Path, step: int) -> dict[str, Any]:
    """Read what :func:`save_master` wrote (tensors only: no code is unpickled)."""
    path = master_path(data_dir, step)
    if not path.exists():
        raise ValueError(f"{path} is missing: the state names step {step} but its weights are gone")
    loaded: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    if loaded.get("step") != step:
        raise ValueError(f"{path} holds step {loaded.get('step')}, not {step}")
    return loaded


def commit(data_dir: Path, state: TrainerState) -> None:
    """Make ``state`` the one a restart resumes from, then drop older master files."""
    atomic_write(
        data_dir / "state.json", (json.dumps(state.to_json(), sort_keys=True) + "\n").encode()
    )
    for old in (data_dir / "master").glob("step-*.pt"):
        try:
            number = int(old.stem.removeprefix("step-"))
        except ValueError:
            continue
        if number < state.step:
            old.unlink(missing_ok=True)
