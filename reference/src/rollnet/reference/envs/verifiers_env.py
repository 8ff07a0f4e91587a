"""``verifiers``: an installed verifiers taskset (the Environments Hub's v1 interface) as an
environment.

The taskset's tasks become prompts: prompt id ``i`` is the ``i``-th task its ``load()`` yields
(verifiers' own ``TaskData.idx``), and the normalised configuration pins the whole list
(``tasks_digest``, over every task's key and prompt messages), so the id maps to the same task
key on every host or the configuration is refused. The worker samples a completion with its own
model; the task's ``@vf.reward`` functions score it, offline (no runtime, no tools, no judges),
on a trace holding the prompt messages and the completion as the assistant's one reply; the
reward is the trace's weighted sum.

The taskset is code anyone can publish, so it never runs in a node's own process: prompts are
listed by a sandboxed child (:mod:`rollnet.reference.envs.isolation`) and rewards computed in
the reward sandbox's isolated child (:attr:`runs_untrusted_code`). In those children (see
:func:`~rollnet.reference.envs.isolation.inside_sandbox`) this class runs the taskset itself.

The configuration names the distribution that provides the taskset, its exact version and a
digest of its installed files, and the verifiers version: a host with anything else refuses
the configuration (:class:`~rollnet.reference.envs.EnvironmentConfigError` naming the key)
instead of computing rewards that will not match. ``docs/environments.md`` describes the
keys, the prompt rules and what of verifiers is not supported.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import os
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from itertools import islice
from pathlib import Path
from typing import Any

import blake3

from rollnet.reference.envs.base import Environment, Problem, RewardBreakdown, _as_index
from rollnet.reference.envs.config import (
    MAX_SAFE_INTEGER,
    ConfigReader,
    EnvironmentConfigError,
    canonical_json,
)
from rollnet.reference.envs.isolation import (
    IsolationUnavailable,
    Limits,
    inside_sandbox,
    isolated_popen,
    python_paths,
)
from rollnet.sdk.domains import PACKAGE_DIGEST_DOMAIN, TASKS_DIGEST_DOMAIN

__all__ = [
    "LISTING_LIMITS",
    "TaskListing",
    "VerifiersEnvironment",
    "distribution_digest",
]


LISTING_LIMITS = Limits(memory_bytes=2 << 30, processes=256, cpu_s=300, file_bytes=1 << 20)
"""rlimits of the sandboxed child that loads a taskset and lists its tasks."""
_LISTING_WALL_S = 300.0
_LISTING_OUTPUT_BYTES = 256 << 20
_PROMPT_FORMATS = ("chat", "text")
# Files of an installed distribution that differ between two installs of the same wheel.
_INSTALL_SPECIFIC = ("INSTALLER", "REQUESTED", "RECORD", "direct_url.json")

_listings: dict[bytes, TaskListing] = {}
_listings_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class TaskListing:
    """What the sandboxed child reports: the normalised configuration and every task's key
    and prompt messages, in ``load()`` order."""

    config: dict[str, Any]
    keys: tuple[str, ...]
    messages: tuple[tuple[tuple[str, str], ...], ...]


class VerifiersEnvironment(Environment):
    """A verifiers taskset's tasks as prompts, its reward functions as the verifier.

    Configuration keys:

    * ``taskset`` — the taskset id, as ``vf-eval`` takes it (an installed package exporting a
      ``vf.Taskset`` subclass; ``owner/name@version`` Hub ids name the package ``name``);
    * ``package`` — the distribution that provides it (default: found from the id);
    * ``version``, ``package_digest`` — that distribution's version and the BLAKE3 of its
      installed files (:func:`distribution_digest`); normalised to what is installed, refused
      when they differ;
    * ``verifiers`` — the verifiers version, likewise;
    * ``taskset_config`` — the taskset's own configuration (its ``TasksetConfig`` fields
      besides ``id``); normalised to every field's value;
    * ``prompt_format`` — ``"chat"`` (the default: the prompt messages go through the model's
      chat template) or ``"text"`` (their contents joined by blank lines, fed as plain text);
    * ``max_tasks`` — use only the first this-many tasks (required for an infinite taskset);
    * ``tasks_digest`` — BLAKE3 over every task's key and prompt messages; normalised, refused
      when this host's taskset yields other tasks.
    """

    name = "verifiers"
    runs_untrusted_code = True

    def __init__(self, config: Mapping[str, Any]) -> None:
        if inside_sandbox():
            loaded = _LoadedTaskset(config)
            self._loaded: _LoadedTaskset | None = loaded
            self._listing = loaded.listing
        else:
            self._loaded = None
            self._listing = _listing_of(config)
        self.prompt_format = self._listing.config["prompt_format"]

    @classmethod
    def load_unsandboxed(cls, config: Mapping[str, Any]) -> VerifiersEnvironment:
        """Load the taskset in this process, where :meth:`reward` can then run its code:
        only for code you trust (benchmarks, writing a taskset)."""
        environment = cls.__new__(cls)
        loaded = _LoadedTaskset(config)
        environment._loaded = loaded
        environment._listing = loaded.listing
        environment.prompt_format = loaded.listing.config["prompt_format"]
        return environment

    @property
    def config(self) -> Mapping[str, Any]:
        """The normalised configuration (a copy)."""
        copied: dict[str, Any] = json.loads(json.dumps(self._listing.config))
        return copied

    @property
    def num_prompts(self) -> int:
        """The number of tasks."""
        return len(self._listing.keys)

    def task_key(self, prompt_id: int) -> str:
        """The verifiers task key (``Task.key``) of ``prompt_id``."""
        return self._listing.keys[prompt_id]

    def prompt(self, prompt_id: int) -> Problem:
        """The ``prompt_id``-th task's prompt; ``source_id`` is its task key."""
        prompt_id = _as_index("prompt id", prompt_id)
        if not 0 <= prompt_id < self.num_prompts:
            raise ValueError(
                f"environment {self.name!r}: prompt id {prompt_id} is outside "
                f"[0, {self.num_prompts - 1}]"
            )
        messages = self._listing.messages[prompt_id]
        return Problem(
            prompt_id=prompt_id,
            prompt="\n\n".join(content for _, content in messages),
            answer="",
            target_length=None,
            source_id=self._listing.keys[prompt_id],
            messages=messages if self.prompt_format == "chat" else None,
        )

    def reward(
        self, problem: Problem, completion_text: str, completion_token_count: int
    ) -> RewardBreakdown:
        """The task's rewards on the completion: ``total = task_reward`` = the trace's weighted
        sum (no length penalty). Only where the taskset is loaded (the reward sandbox's child,
        or :meth:`load_unsandboxed`)."""
        self.checked_count(problem, completion_token_count)
        if self._loaded is None:
            raise RuntimeError(
                "a verifiers taskset is untrusted code: its rewards are computed in the reward "
                "sandbox (RewardSandbox), not in this process"
            )
        total = self._loaded.score(problem.prompt_id, completion_text)
        return RewardBreakdown(task_reward=total, length_penalty=0.0, total=total)


def distribution_digest(distribution: metadata.Distribution, module: str | None = None) -> str:
    """BLAKE3 over the distribution's installed files (path and content, in path order),
    leaving out what differs between two installs of one wheel (``RECORD``, ``INSTALLER``,
    ``direct_url.json``, byte code, scripts outside the package directory). For an editable
    install, whose files stay in a source tree, ``module``'s directory is hashed as well."""
    hasher = blake3.blake3(PACKAGE_DIGEST_DOMAIN)
    entries: dict[str, Path] = {}
    for file in distribution.files or ():
        relative = file.as_posix()
        name = relative.rsplit("/", 1)[-1]
        if (
            relative.startswith("..")
            or "__pycache__/" in relative
            or relative.endswith((".pyc", ".pth"))
            or name.startswith("__editable__")
            or (".dist-info/" in relative and name in _INSTALL_SPECIFIC)
        ):
            continue
        entries[relative] = Path(str(file.locate()))
    if module is not None and _editable(distribution):
        spec = importlib.util.find_spec(module)
        locations = list(spec.submodule_search_locations or ()) if spec else []
        for location in locations:
            root = Path(location)
            for path in sorted(root.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    entries[f"{module}/{path.relative_to(root).as_posix()}"] = path
    for relative in sorted(entries):
        path = entries[relative]
        content = path.read_bytes() if path.is_file() else b""
        encoded = relative.encode()
        hasher.update(
            len(encoded).to_bytes(4, "little") + encoded + blake3.blake3(content).digest()
        )
    return hasher.hexdigest()


def _editable(distribution: metadata.Distribution) -> bool:
    text = distribution.read_text("direct_url.json")
    if not text:
        return False
    try:
        return bool(json.loads(text).get("dir_info", {}).get("editable"))
    except (ValueError, AttributeError):
        return False


# --- outside the sandbox: the listing, from a sandboxed child --------------------------------


def _listing_of(config: Mapping[str, Any]) -> TaskListing:
    """The listing for ``config``, from a sandboxed child (once per configuration and
    process: a coordinator normalises the same configuration for every demand)."""
    # The form of every key is checked here first: a malformed configuration costs no child.
    reader = ConfigReader("verifiers", config)
    _Keys.read(reader)
    reader.set_normalised("taskset_config", {})
    reader.finish()
    try:
        key = canonical_json(dict(config))
    except (TypeError, ValueError) as error:
        raise EnvironmentConfigError("verifiers", "<root>", str(error)) from None
    with _listings_lock:
        cached = _listings.get(key)
    if cached is not None:
        return cached
    listing = _list_in_sandbox(config)
    with _listings_lock:
        # The normalised configuration lists to itself: cache it under that too.
        _listings[key] = _listings[canonical_json(listing.config)] = listing
    return listing


def _list_in_sandbox(config: Mapping[str, Any]) -> TaskListing:
    command = [sys.executable, "-c", _LISTING_CHILD]
    path = {"ROLLNET_VERIFIERS_PATH": json.dumps(sys.path)}
    try:
        process = isolated_popen(
            command,
            LISTING_LIMITS,
            readable=python_paths(),
            env=path,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except IsolationUnavailable as error:
        raise EnvironmentConfigError(
            "verifiers", "taskset", f"a taskset is untrusted code and needs the sandbox: {error}"
        ) from None
    try:
        out, err = process.communicate(canonical_json(dict(config)), timeout=_LISTING_WALL_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise EnvironmentConfigError(
            "verifiers", "taskset", f"listing its tasks took over {_LISTING_WALL_S:g} s"
        ) from None
    if len(out) > _LISTING_OUTPUT_BYTES:
        raise EnvironmentConfigError("verifiers", "taskset", "its task listing is too large")
    try:
        reply = json.loads(out)
    except ValueError:
        detail = err.decode(errors="replace").strip()[-400:]
        raise EnvironmentConfigError(
            "verifiers",
            "taskset",
            f"the sandboxed loader failed (exit {process.returncode}): {detail}",
        ) from None
    if "error" in reply:
        raise EnvironmentConfigError("verifiers", reply["key"], reply["error"])
    return TaskListing(
        config=reply["config"],
        keys=tuple(reply["keys"]),
        messages=tuple(tuple((r, c) for r, c in task) for task in reply["messages"]),
    )


_LISTING_CHILD = (
    "import json, os, sys; "
    "sys.path[:] = json.loads(os.environ.pop('ROLLNET_VERIFIERS_PATH')); "
    "from rollnet.reference.envs.verifiers_env import _listing_main; _listing_main()"
)


def _listing_main() -> None:
    """The sandboxed child: configuration on stdin, ``{"config", "keys", "messages"}`` (or
    ``{"error", "key"}``) on stdout."""
    from rollnet.reference.envs.isolation import mark_inside_sandbox

    mark_inside_sandbox()
    config = json.loads(sys.stdin.buffer.read())
    # The taskset's own prints must not corrupt the reply.
    reply_fd = os.dup(1)
    os.dup2(2, 1)
    try:
        listing = _LoadedTaskset(config).listing
        reply: dict[str, Any] = {
            "config": listing.config,
            "keys": listing.keys,
            "messages": listing.messages,
        }
    except EnvironmentConfigError as error:
        reply = {"error": error.message, "key": error.key}
    data = json.dumps(reply).encode()
    while data:
        data = data[os.write(reply_fd, data) :]


# --- inside the sandbox: the taskset itself ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Keys:
    """The configuration's keys as given, checked for form (not yet against the host)."""

    taskset: str
    package: str | None
    version: str | None
    package_digest: str | None
    verifiers: str | None
    taskset_config: Mapping[str, Any]
    prompt_format: str
    max_tasks: int | None
    tasks_digest: str | None

    @classmethod
    def read(cls, reader: ConfigReader) -> _Keys:
        taskset = reader.string("taskset", "")
        if not taskset:
            reader.fail("taskset", "is required (the id of an installed verifiers taskset)")
        strings = {
            key: reader.optional_string(key)
            for key in ("package", "version", "package_digest", "verifiers")
        }
        taskset_config = reader.raw("taskset_config", {})
        if not isinstance(taskset_config, Mapping):
            reader.fail("taskset_config", f"expected an object, got {taskset_config!r}")
        prompt_format = reader.string("prompt_format", "chat")
        if prompt_format not in _PROMPT_FORMATS:
            reader.fail("prompt_format", f"expected 'chat' or 'text', got {prompt_format!r}")
        max_tasks = reader.optional_integer("max_tasks", minimum=1, maximum=MAX_SAFE_INTEGER)
        tasks_digest = reader.optional_string("tasks_digest")
        return cls(
            taskset,
            **strings,
            taskset_config=taskset_config,
            prompt_format=prompt_format,
            max_tasks=max_tasks,
            tasks_digest=tasks_digest,
        )


class _LoadedTaskset:
    """The taskset loaded in this process: its tasks, and their scoring."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        reader = ConfigReader("verifiers", config)
        given = _Keys.read(reader)
        taskset_id, package, version = given.taskset, given.package, given.version
        package_digest, verifiers_version = given.package_digest, given.verifiers
        max_tasks, expected_tasks = given.max_tasks, given.tasks_digest

        installed = _installed_version(reader, "verifiers", "verifiers", verifiers_version)
        reader.set_normalised("verifiers", installed)
        import verifiers.v1 as vf

        module = _module_name(taskset_id)
        distribution = _distribution(reader, module, package)
        reader.set_normalised("package", distribution.metadata["Name"])
        have = _installed_version(reader, "version", distribution.metadata["Name"], version)
        reader.set_normalised("version", have)
        digest = distribution_digest(distribution, module.split(".")[-1])
        if package_digest is not None and package_digest != digest:
            reader.fail(
                "package_digest",
                f"the installed files of {distribution.metadata['Name']} {have} hash to "
                f"{digest} here, not {package_digest}",
            )
        reader.set_normalised("package_digest", digest)

        taskset_config = _taskset_config(reader, vf, taskset_id, given.taskset_config)
        try:
            taskset = vf.load_taskset(taskset_config)
            infinite = not taskset.bounded
            if not infinite or max_tasks is not None:
                tasks = list(islice(iter(taskset), max_tasks))
        except Exception as error:  # the taskset's own code failed
            reader.fail("taskset", f"loading its tasks failed: {type(error).__name__}: {error}")
        if infinite and max_tasks is None:
            reader.fail("max_tasks", "the taskset is infinite: say how many tasks to use")
        if type(taskset).toolsets(taskset_config):
            reader.fail("taskset", "tool servers (multi-turn tool use) are not supported")
        if not tasks:
            reader.fail("taskset", "the taskset yields no tasks")
        keys: list[str] = []
        messages: list[tuple[tuple[str, str], ...]] = []
        for task in tasks:
            _check_task(reader, task)
            keys.append(str(task.key))
            messages.append(_prompt_messages(reader, task, vf))
        if len(set(keys)) != len(keys):
            reader.fail("taskset", "two tasks have the same key")
        tasks_digest = blake3.blake3(
            TASKS_DIGEST_DOMAIN
            + canonical_json([[k, m] for k, m in zip(keys, messages, strict=False)])
        ).hexdigest()
        if expected_tasks is not None and expected_tasks != tasks_digest:
            reader.fail(
                "tasks_digest",
                f"this host's taskset yields tasks hashing to {tasks_digest}, not {expected_tasks}",
            )
        reader.set_normalised("tasks_digest", tasks_digest)
        self.listing = TaskListing(reader.finish(), tuple(keys), tuple(messages))
        self._tasks = tasks
        self._vf = vf
        self._loop: asyncio.AbstractEventLoop | None = None

    def score(self, index: int, completion_text: str) -> float:
        """The trace's weighted reward for the completion of task ``index``."""
        vf = self._vf
        task = self._tasks[index]
        from verifiers.v1.state import state_cls

        nodes = []
        for position, (role, content) in enumerate(self.listing.messages[index]):
            message = {"system": vf.SystemMessage, "user": vf.UserMessage}.get(
                role, vf.AssistantMessage
            )(content=content)
            nodes.append(vf.MessageNode(parent=position - 1 if position else None, message=message))
        reply = vf.AssistantMessage(content=completion_text)
        nodes.append(vf.MessageNode(parent=len(nodes) - 1, message=reply, sampled=True))
        trace = vf.Trace(
            verifiers=vf.VersionInfo(version=self.listing.config["verifiers"]),
            task=vf.TraceTask(
                type=type(task).__name__, data=task.data, key=task.key, hash=task.hash
            ),
            state=state_cls(type(task))(),
            agent=vf.AgentInfo(config=vf.AgentConfig(), name="rollnet"),
            nodes=nodes,
        )
        trace.stop("completed")
        trace.ok = True
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(task.score(trace))
        if not trace.rewards or any(reward is None for reward in trace.rewards.values()):
            raise RuntimeError("the task's reward functions did not all score")
        total = float(trace.reward)
        if not math.isfinite(total):
            raise ValueError(f"the task's reward is not finite: {total!r}")
        return total


def _module_name(taskset_id: str) -> str:
    """The module verifiers imports for ``taskset_id`` (``verifiers.v1.utils.loaders``'s
    rule: a Hub id's ``owner/`` and ``@version`` dropped, dashes made underscores)."""
    name = taskset_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()
    builtin = f"verifiers.v1.tasksets.{name}"
    return builtin if importlib.util.find_spec(builtin) is not None else name


def _distribution(reader: ConfigReader, module: str, package: str | None) -> metadata.Distribution:
    top = module.split(".")[0]
    if package is None:
        owners = sorted(set(metadata.packages_distributions().get(top, ())))
        if len(owners) != 1:
            found = ", ".join(owners) or "none"
            reader.fail(
                "package",
                f"cannot tell which installed distribution provides module {top!r} "
                f"(found: {found}); name it",
            )
        package = owners[0]
    try:
        return metadata.distribution(package)
    except metadata.PackageNotFoundError:
        reader.fail("package", f"distribution {package!r} is not installed here")


def _installed_version(reader: ConfigReader, key: str, package: str, expected: str | None) -> str:
    try:
        have = metadata.version(package)
    except metadata.PackageNotFoundError:
        reader.fail(key, f"{package} is not installed here (pip install {package})")
    if expected is not None and expected != have:
        reader.fail(key, f"{package} {have} is installed here; the task needs {expected}")
    return have


def _taskset_config(reader: ConfigReader, vf: Any, taskset_id: str, raw: Any) -> Any:
    """The taskset's validated ``TasksetConfig``, refusing what would run code named by the
    configuration (plugged functions), reach the network (judges) or read files."""
    if "id" in raw:
        reader.fail("taskset_config", "give the taskset's id as 'taskset', not here")
    try:
        config_type = vf.taskset_config_type(taskset_id)
        taskset_config = config_type.model_validate({**raw, "id": taskset_id})
    except (ImportError, ValueError, TypeError, AttributeError) as error:
        reader.fail("taskset_config", f"{type(error).__name__}: {error}")
    if taskset_config.system_prompt is not None:
        reader.fail("taskset_config", "system_prompt (a file to read) is not supported")
    task_config = taskset_config.task
    if task_config.judges:
        reader.fail("taskset_config", "judges (model calls) are not supported")
    for kind in ("rewards", "metrics", "stops"):
        for name, plugged in getattr(task_config, kind).items():
            if plugged.fn:
                reader.fail(
                    "taskset_config",
                    f"task.{kind}.{name}.fn imports code named by the configuration; "
                    "only the taskset's own functions may score",
                )
    normalised = taskset_config.model_dump(mode="json", exclude={"id"})
    try:
        canonical_json(normalised)
    except (TypeError, ValueError) as error:
        reader.fail("taskset_config", f"not JSON data: {error}")
    reader.set_normalised("taskset_config", normalised)
    return taskset_config


def _check_task(reader: ConfigReader, task: Any) -> None:
    import inspect

    where = f"task {task.data.idx}"
    if task.NEEDS_CONTAINER:
        reader.fail("taskset", f"{where} needs a container runtime, which is not supported")
    if type(task).toolsets(task.config):
        reader.fail("taskset", f"{where} has tool servers (multi-turn tool use): not supported")
    rewards = task.hooks("reward")
    if not rewards:
        reader.fail("taskset", f"{where} has no reward function")
    for function in rewards:
        parameter = inspect.signature(function).parameters.get("runtime")
        if parameter is not None and parameter.default is inspect.Parameter.empty:
            reader.fail(
                "taskset",
                f"{where}: reward {function.__name__!r} needs a runtime (a sandbox the agent "
                "worked in), which single-turn scoring does not have",
            )


def _prompt_messages(reader: ConfigReader, task: Any, vf: Any) -> tuple[tuple[str, str], ...]:
    data = task.data
    where = f"task {data.idx}"
    messages: list[tuple[str, str]] = []
    if data.system_prompt:
        messages.append(("system", data.system_prompt))
    if data.prompt is None:
        reader.fail("taskset", f"{where} has no prompt (the user opens): not supported")
    if isinstance(data.prompt, str):
        messages.append(("user", data.prompt))
        return tuple(messages)
    for message in data.prompt:
        if isinstance(message, vf.ToolMessage) or getattr(message, "tool_calls", None):
            reader.fail("taskset", f"{where}: tool messages in the prompt are not supported")
        content = message.content
        if not isinstance(content, str | None) and any(
            not isinstance(part, vf.TextContentPart) for part in content
        ):
            reader.fail("taskset", f"{where}: only text prompts are supported (found an image)")
        messages.append((message.role, vf.content_text(content) if content else ""))
    return tuple(messages)
