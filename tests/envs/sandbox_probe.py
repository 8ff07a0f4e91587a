"""A test environment whose verifier misbehaves on request, and its loader for the sandbox.

``RewardSandbox(loader="sandbox_probe:load")`` builds it in the child (this directory is on the
test run's import path, which the sandbox passes on). The completion text picks the behaviour:
``hang`` loops forever in Python, ``cpow`` computes for minutes inside one C call (``9 ** 9 ** 9``,
the GIL held throughout), ``raise`` raises, ``crash`` ends the process, ``pid`` answers with the
child's process id as the task reward; anything else scores 1.0 when it equals the answer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from rollnet.reference.envs import ConfigReader, Environment, Problem, Question, SeededEnvironment


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
            return float(os.getpid())
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
