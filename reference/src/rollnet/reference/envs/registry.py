"""Finding environments by name: the built-ins plus the ``rollnet.environments`` entry points.

A third-party distribution registers an environment by declaring, in its ``pyproject.toml``::

    [project.entry-points."rollnet.environments"]
    my_env = "my_package.my_module:MyEnvironment"

where the target is a callable taking the configuration mapping and returning an
:class:`~rollnet.reference.envs.base.Environment` whose ``name`` is ``my_env``. Environments are
only ever loaded from installed entry points, never from a dotted path found in a task: a task's
environment name must not be a way to import arbitrary code on a worker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

from rollnet.reference.envs.arithmetic import ArithmeticEnvironment
from rollnet.reference.envs.base import Environment
from rollnet.reference.envs.code import CodeEnvironment
from rollnet.reference.envs.math_jsonl import MathEnvironment
from rollnet.reference.envs.reverse import ReverseEnvironment
from rollnet.reference.envs.verifiers_env import VerifiersEnvironment

__all__ = [
    "ENTRY_POINT_GROUP",
    "EnvironmentFactory",
    "EnvironmentRegistryError",
    "UnknownEnvironmentError",
    "available_environments",
    "load_environment",
]

logger = logging.getLogger(__name__)

#: Entry-point group scanned for third-party environments.
ENTRY_POINT_GROUP = "rollnet.environments"

#: What an entry point must resolve to: configuration in, environment out (a class qualifies).
EnvironmentFactory = Callable[[Mapping[str, Any]], Environment]

_BUILTINS: dict[str, EnvironmentFactory] = {
    "arithmetic": ArithmeticEnvironment,
    "code": CodeEnvironment,
    "math": MathEnvironment,
    "reverse": ReverseEnvironment,
    "verifiers": VerifiersEnvironment,
}


class UnknownEnvironmentError(LookupError):
    """No environment is registered under the requested name."""

    def __init__(self, name: str, available: list[str]) -> None:
        self.name = name
        self.available = available
        listing = ", ".join(available) or "none"
        super().__init__(f"unknown environment {name!r} (available: {listing})")


class EnvironmentRegistryError(RuntimeError):
    """An environment is registered but cannot be loaded (ambiguous, broken or misbehaving)."""


def _target(factory: object) -> str:
    module = getattr(factory, "__module__", "?")
    qualname = getattr(factory, "__qualname__", repr(factory))
    return f"{module}:{qualname}"


def _plugin_entry_points() -> dict[str, list[metadata.EntryPoint]]:
    """Third-party entry points by name, skipping those that merely re-declare a built-in."""
    found: dict[str, list[metadata.EntryPoint]] = {}
    for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        builtin = _BUILTINS.get(entry_point.name)
        if builtin is not None:
            if entry_point.value != _target(builtin):
                # Built-ins win everywhere, so every host resolves the name the same way.
                logger.warning(
                    "environment_entry_point_shadowed environment=%s target=%s",
                    entry_point.name,
                    entry_point.value,
                )
            continue
        targets = found.setdefault(entry_point.name, [])
        if all(existing.value != entry_point.value for existing in targets):
            targets.append(entry_point)
    return found


def available_environments() -> dict[str, str]:
    """Every loadable name mapped to its ``module:attribute`` target, sorted by name."""
    names = {name: _target(factory) for name, factory in _BUILTINS.items()}
    for name, entry_points in _plugin_entry_points().items():
        names[name] = " | ".join(entry_point.value for entry_point in entry_points)
    return dict(sorted(names.items()))


def load_environment(name: str, config: Mapping[str, Any]) -> Environment:
    """Build environment ``name`` from ``config``.

    Raises:
        UnknownEnvironmentError: no built-in or entry point has this name (lists the available).
        EnvironmentConfigError: the configuration is invalid (names the key).
        EnvironmentRegistryError: the name is ambiguous, or the entry point is broken or returns
            something that is not an environment called ``name`` with a JSON configuration.
    """
    factory: EnvironmentFactory
    builtin = _BUILTINS.get(name)
    if builtin is not None:
        factory = builtin
    else:
        plugins = _plugin_entry_points()
        entry_points = plugins.get(name)
        if not entry_points:
            available = sorted({*_BUILTINS, *plugins})
            raise UnknownEnvironmentError(name, available)
        if len(entry_points) > 1:
            targets = ", ".join(entry_point.value for entry_point in entry_points)
            raise EnvironmentRegistryError(
                f"environment {name!r} is registered by several entry points: {targets}"
            )
        entry_point = entry_points[0]
        try:
            loaded = entry_point.load()
        except Exception as error:
            raise EnvironmentRegistryError(
                f"environment {name!r}: cannot load entry point {entry_point.value!r}: {error}"
            ) from error
        if not callable(loaded):
            raise EnvironmentRegistryError(
                f"environment {name!r}: entry point {entry_point.value!r} is not callable"
            )
        factory = loaded
    environment = factory(config)
    if not isinstance(environment, Environment):
        raise EnvironmentRegistryError(
            f"environment {name!r}: factory returned {type(environment).__name__}, "
            "not an Environment"
        )
    if environment.name != name:
        raise EnvironmentRegistryError(
            f"environment {name!r}: factory built an environment named {environment.name!r}"
        )
    try:
        environment.digest  # noqa: B018 -- proves the normalised config is canonical JSON
    except (TypeError, ValueError) as error:
        raise EnvironmentRegistryError(
            f"environment {name!r}: normalised config is not JSON data: {error}"
        ) from error
    return environment
