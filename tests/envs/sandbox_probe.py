"""A test environment whose verifier misbehaves on request, and its loader for the sandbox.

``RewardSandbox(loader="sandbox_probe:load")`` builds it in the child (this directory is on the
test run's import path, which the sandbox passes on). The completion text picks the behaviour:
``hang`` loops forever in Python, ``cpow`` computes for minutes inside one C call (``9 ** 9 ** 9``,
the GIL held throughout), ``raise`` raises, ``crash`` ends the process, ``pid`` answers with a
number drawn when the child started (which tells children apart: an isolated child's own process
id is the same in every sandbox) as the task reward, ``net`` 1.0 when it can open an internet
socket, ``orphan`` starts a process that outlives the call, ``others`` counts the processes it
can see besides itself and its sandbox's init, ``shout`` writes 1 MiB to standard error;
anything else scores 1.0 when it equals the answer.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
import time
from collections.abc import Mapping
from typing import Any

from rollnet.reference.envs import ConfigReader, Environment, Problem, Question, SeededEnvironment

_CHILD_TOKEN = float(secrets.randbelow(2**52))


class ProbeEnvironment(SeededEnvironment):
    name = "probe"

    def configure(self, reader: ConfigReader) -> None:
        self.variant = reader.integer("variant", 0, minimum=0, maximum=10)

    @property
    def num_prompts(self) -> int:
        return 100

    def make_question(self, prompt_id: int) -> Question:
        return Question(text=f"say {prompt_id}", answer=str(prompt_id), source_id=str(prompt_id))

    def task_reward(self, problem: Problem, completion_text: str) -> float:
        if completion_text == "hang":
            while True:
                pass
        if completion_text == "raise":
            raise ValueError("the verifier cannot read this")
        if completion_text == "crash":
            os._exit(3)
        if completion_text == "cpow":
            return float(pow(9, 9**9) % 2)
        if completion_text == "pid":
            return _CHILD_TOKEN
        if completion_text == "net":
            try:
                socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
            except OSError:
                return 0.0
            return 1.0
        if completion_text == "orphan":
            if os.fork() == 0:
                time.sleep(600)
                os._exit(0)
            return 1.0
        if completion_text == "others":
            alive = 0
            for entry in os.listdir("/proc"):
                if entry.isdigit() and int(entry) not in (1, os.getpid()):
                    try:
                        with open(f"/proc/{entry}/stat") as stat:
                            alive += stat.read().rsplit(")", 1)[1].split()[0] != "Z"
                    except OSError:
                        continue
            return float(alive)
        if completion_text == "shout":
            sys.stderr.write(("x" * 1023 + "\n") * 1024)
            sys.stderr.flush()
            return 1.0
        return 1.0 if completion_text == problem.answer else 0.0


def load(name: str, config: Mapping[str, Any]) -> Environment:
    """The child's loader. ``variant`` 7 builds a different environment than asked for."""
    environment = ProbeEnvironment(config)
    if environment.variant == 7:
        return ProbeEnvironment({**config, "variant": 8})
    return environment


def broken(name: str, config: Mapping[str, Any]) -> Environment:
    """A loader that cannot build anything."""
    raise OSError("the dataset is not on this host")
